//! Kubernetes resource quantities as byte counts (`1Gi`, `100Mi`, `10G`,
//! `500000`, `1.5Ti`, `1e9`).

use crate::Error;

/// Parses a Kubernetes quantity into bytes.
///
/// Accepted: an unsigned decimal number (optionally with a fraction and a
/// leading `+`), followed by nothing, a binary suffix (`Ki Mi Gi Ti Pi Ei`),
/// a decimal suffix (`m k M G T P E`) or a decimal exponent (`e3`, `E-2`).
/// Fractional results are rounded up to the next byte, as Kubernetes does
/// for storage quantities. Negative, empty, malformed and overflowing
/// inputs are errors.
pub fn parse_quantity(input: &str) -> Result<u64, Error> {
    let err = |reason: &str| Error::Quantity {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let s = match s.as_bytes()[0] {
        b'-' => return Err(err("negative")),
        b'+' => &s[1..],
        _ => s,
    };
    let number_len = s
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("no digits"));
    }
    if frac_part.contains('.') {
        return Err(err("more than one decimal point"));
    }
    // value = mantissa / 10^frac_digits * 2^bin_exp * 10^dec_exp
    let mantissa_digits = format!("{int_part}{frac_part}");
    let mantissa_digits = mantissa_digits.trim_start_matches('0');
    if mantissa_digits.len() > 30 {
        return Err(err("too many digits"));
    }
    let mantissa: u128 = if mantissa_digits.is_empty() {
        0
    } else {
        mantissa_digits.parse().map_err(|_| err("invalid number"))?
    };
    let mut dec_exp: i64 = -i64::try_from(frac_part.len()).map_err(|_| err("too many digits"))?;
    let mut bin_exp: u32 = 0;
    match suffix {
        "" => {}
        "Ki" => bin_exp = 10,
        "Mi" => bin_exp = 20,
        "Gi" => bin_exp = 30,
        "Ti" => bin_exp = 40,
        "Pi" => bin_exp = 50,
        "Ei" => bin_exp = 60,
        "m" => dec_exp -= 3,
        "k" => dec_exp += 3,
        "M" => dec_exp += 6,
        "G" => dec_exp += 9,
        "T" => dec_exp += 12,
        "P" => dec_exp += 15,
        "E" => dec_exp += 18,
        other if other.len() > 1 && (other.starts_with('e') || other.starts_with('E')) => {
            let exp = &other[1..];
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err("invalid suffix"));
            }
            let e: i64 = exp.parse().map_err(|_| err("exponent out of range"))?;
            if e.abs() > 40 {
                return Err(err("exponent out of range"));
            }
            dec_exp += e;
        }
        _ => return Err(err("invalid suffix")),
    }
    let too_large = || err("too large for 64-bit bytes");
    let mut value = mantissa
        .checked_mul(1u128 << bin_exp)
        .ok_or_else(too_large)?;
    if dec_exp >= 0 {
        let factor = 10u128
            .checked_pow(u32::try_from(dec_exp).map_err(|_| too_large())?)
            .ok_or_else(too_large)?;
        value = value.checked_mul(factor).ok_or_else(too_large)?;
    } else {
        let divisor = 10u128
            .checked_pow(u32::try_from(-dec_exp).map_err(|_| err("too many digits"))?)
            .ok_or_else(|| err("too many digits"))?;
        value = value.div_ceil(divisor);
    }
    u64::try_from(value).map_err(|_| too_large())
}

/// Formats bytes with the largest binary suffix that divides them exactly.
pub fn format_quantity(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in SUFFIXES {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid() {
        for (input, want) in [
            ("0", 0u64),
            ("500000", 500_000),
            ("+7", 7),
            ("1Ki", 1024),
            ("100Mi", 100 << 20),
            ("1Gi", 1 << 30),
            ("1Ti", 1 << 40),
            ("2Pi", 2 << 50),
            ("1Ei", 1 << 60),
            ("10G", 10_000_000_000),
            ("1k", 1000),
            ("3M", 3_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1.5Gi", 1_610_612_736),
            ("0.5Ki", 512),
            (".5Ki", 512),
            ("1.", 1),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1e+3", 1000),
            ("15e-1", 2),
            ("1500m", 2),
            ("1000m", 1),
            ("1m", 1),
            (" 42 ", 42),
            ("0007", 7),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_quantity(input).expect(input), want, "{input}");
        }
    }

    #[test]
    fn invalid() {
        for input in [
            "",
            " ",
            "-1",
            "-1Gi",
            "Gi",
            "1gi",
            "1GB",
            "1 Gi",
            "1.2.3",
            ".",
            "abc",
            "1e",
            "1e+",
            "1ex",
            "1Ki1",
            "16Ei",
            "18446744073709551616",
            "1e41",
            "99999999999999999999999999999999",
            "1x",
            "0x10",
        ] {
            assert!(
                matches!(parse_quantity(input), Err(Error::Quantity { .. })),
                "{input:?} should be rejected: {:?}",
                parse_quantity(input)
            );
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_quantity(0), "0");
        assert_eq!(format_quantity(1 << 30), "1Gi");
        assert_eq!(format_quantity(3 << 20), "3Mi");
        assert_eq!(format_quantity(1_000_000), "1000000");
        assert_eq!(format_quantity(1536), "1536");
        assert_eq!(format_quantity(2048), "2Ki");
    }
}
