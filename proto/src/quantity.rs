//! Kubernetes resource quantities as byte counts (`1Gi`, `100Mi`, `10G`,
//! `500000`, `1.5Ti`, `1e9`), shared by the hostpath driver and csi-sanity.

/// Why a quantity was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub struct QuantityError {
    /// The text as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: QuantityErrorKind,
}

/// The ways a quantity can be wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityErrorKind {
    #[error("empty")]
    Empty,
    #[error("negative")]
    Negative,
    #[error(
        "not a number with a Kubernetes suffix (Ki Mi Gi Ti Pi Ei, m k M G T P E, or an exponent e3)"
    )]
    Malformed,
    #[error("too large for 64-bit bytes")]
    TooLarge,
    #[error("not a whole number of bytes")]
    Fractional,
}

/// How a quantity that is not a whole number of bytes is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Round up to the next byte, as Kubernetes does for storage requests.
    Up,
    /// Reject it ([`QuantityErrorKind::Fractional`]).
    Exact,
}

/// Parses a Kubernetes quantity into bytes, rounding a fraction of a byte
/// up.
///
/// Accepted: an unsigned decimal number (optionally with a fraction and a
/// leading `+`), followed by nothing, a binary suffix (`Ki Mi Gi Ti Pi Ei`),
/// a decimal suffix (`m k M G T P E`) or a decimal exponent (`e3`, `E-2`).
/// Surrounding white space is ignored. Negative, empty, malformed and
/// overflowing inputs are errors.
pub fn parse_quantity(input: &str) -> Result<u64, QuantityError> {
    parse_quantity_with(input, Rounding::Up)
}

/// [`parse_quantity`] with the given treatment of fractional bytes.
pub fn parse_quantity_with(input: &str, rounding: Rounding) -> Result<u64, QuantityError> {
    let err = |reason: QuantityErrorKind| QuantityError {
        input: input.to_owned(),
        reason,
    };
    use QuantityErrorKind::*;
    let s = input.trim();
    if s.is_empty() {
        return Err(err(Empty));
    }
    let s = match s.as_bytes()[0] {
        b'-' => return Err(err(Negative)),
        b'+' => &s[1..],
        _ => s,
    };
    let number_len = s
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(err(Malformed));
    }
    // value = mantissa / 10^frac_digits * 2^bin_exp * 10^dec_exp
    let mantissa_digits = format!("{int_part}{frac_part}");
    let mantissa_digits = mantissa_digits.trim_start_matches('0');
    if mantissa_digits.len() > 30 {
        return Err(err(TooLarge));
    }
    let mantissa: u128 = if mantissa_digits.is_empty() {
        0
    } else {
        mantissa_digits.parse().map_err(|_| err(Malformed))?
    };
    let mut dec_exp: i64 = -i64::try_from(frac_part.len()).map_err(|_| err(TooLarge))?;
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
                return Err(err(Malformed));
            }
            let e: i64 = exp.parse().map_err(|_| err(TooLarge))?;
            if e.abs() > 40 {
                return Err(err(TooLarge));
            }
            dec_exp += e;
        }
        _ => return Err(err(Malformed)),
    }
    let mut value = mantissa
        .checked_mul(1u128 << bin_exp)
        .ok_or_else(|| err(TooLarge))?;
    if dec_exp >= 0 {
        let factor = u32::try_from(dec_exp)
            .ok()
            .and_then(|e| 10u128.checked_pow(e))
            .ok_or_else(|| err(TooLarge))?;
        value = value.checked_mul(factor).ok_or_else(|| err(TooLarge))?;
    } else {
        // At most 30 fraction digits plus 40 of exponent and 3 of `m`: the
        // divisor fits in a u128 only up to 10^38; beyond it the value is
        // below one byte.
        let divisor = u32::try_from(-dec_exp)
            .ok()
            .and_then(|e| 10u128.checked_pow(e));
        value = match (divisor, rounding) {
            (Some(d), Rounding::Exact) if value % d != 0 => return Err(err(Fractional)),
            (Some(d), _) => value / d + u128::from(value % d != 0),
            (None, _) if value == 0 => 0,
            (None, Rounding::Up) => 1,
            (None, Rounding::Exact) => return Err(err(Fractional)),
        };
    }
    u64::try_from(value).map_err(|_| err(TooLarge))
}

/// Formats bytes with the largest binary suffix that divides them exactly
/// (`10Mi`, `1536Ki`, `7`).
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
            ("1073741824", 1 << 30),
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
            ("500M", 500_000_000),
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
            ("1000m", 1),
            (" 42 ", 42),
            ("0007", 7),
            ("0.000", 0),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_quantity(input), Ok(want), "{input}");
            assert_eq!(
                parse_quantity_with(input, Rounding::Exact),
                Ok(want),
                "{input} is a whole number of bytes"
            );
        }
    }

    #[test]
    fn fractions_round_up_or_are_rejected() {
        for (input, up) in [
            ("15e-1", 2u64),
            ("1500m", 2),
            ("1m", 1),
            ("0.1", 1),
            ("1.0001Ki", 1025),
            ("1e-40", 1),
            (".000000000000000000000000000001e-40", 1),
        ] {
            assert_eq!(parse_quantity(input), Ok(up), "{input}");
            assert_eq!(
                parse_quantity_with(input, Rounding::Exact).map_err(|e| e.reason),
                Err(QuantityErrorKind::Fractional),
                "{input}"
            );
        }
    }

    #[test]
    fn invalid() {
        use QuantityErrorKind::*;
        for (input, kind) in [
            ("", Empty),
            (" ", Empty),
            ("-1", Negative),
            ("-1Gi", Negative),
            ("Gi", Malformed),
            ("1gi", Malformed),
            ("1K", Malformed),
            ("1GB", Malformed),
            ("10MB", Malformed),
            ("1 Gi", Malformed),
            ("1.2.3", Malformed),
            (".", Malformed),
            ("abc", Malformed),
            ("1e", Malformed),
            ("1e+", Malformed),
            ("1ex", Malformed),
            ("1Ki1", Malformed),
            ("1x", Malformed),
            ("0x10", Malformed),
            ("16Ei", TooLarge),
            ("18446744073709551616", TooLarge),
            ("1e41", TooLarge),
            ("99999999999999999999999999999999", TooLarge),
        ] {
            for rounding in [Rounding::Up, Rounding::Exact] {
                assert_eq!(
                    parse_quantity_with(input, rounding).map_err(|e| e.reason),
                    Err(kind),
                    "{input:?}"
                );
            }
        }
        let e = parse_quantity("1GB").expect_err("bad");
        assert_eq!(e.input, "1GB");
        assert!(
            e.to_string().starts_with("invalid quantity \"1GB\": "),
            "{e}"
        );
    }

    #[test]
    fn formats() {
        assert_eq!(format_quantity(0), "0");
        assert_eq!(format_quantity(1 << 30), "1Gi");
        assert_eq!(format_quantity(3 << 20), "3Mi");
        assert_eq!(format_quantity(10 << 20), "10Mi");
        assert_eq!(format_quantity(1536 << 10), "1536Ki");
        assert_eq!(format_quantity(1_000_000), "1000000");
        assert_eq!(format_quantity(1536), "1536");
        assert_eq!(format_quantity(2048), "2Ki");
        assert_eq!(format_quantity(7), "7");
        for n in [0, 1, 1023, 1 << 20, 3 << 40, u64::MAX] {
            assert_eq!(parse_quantity(&format_quantity(n)), Ok(n));
        }
    }
}
