//! Kubernetes resource quantities as byte counts.
//!
//! `k8s_openapi` keeps a `Quantity` as its string, so the capacity of a PVC has
//! to be parsed here. The grammar is apimachinery's
//! (`<sign><digits>[.<digits>]<suffix>` with binary `Ki..Ei`, decimal
//! `n u m "" k M G T P E` and exponent `e<int>` / `E<int>` suffixes), and the
//! result is rounded up to a whole byte like Go's `Quantity.Value()`, so that
//! `100m` asks for one byte rather than zero.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity string that is not a valid non-negative byte count.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantity {0:?} is empty")]
    Empty(String),
    #[error("quantity {0:?} has no number")]
    NoNumber(String),
    #[error("quantity {0:?} has an unknown suffix {1:?}")]
    UnknownSuffix(String, String),
    #[error("quantity {0:?} is negative")]
    Negative(String),
    #[error("quantity {0:?} does not fit into 63 bits of bytes")]
    TooLarge(String),
}

/// Parses a quantity into whole bytes, rounding fractions up.
pub fn parse_bytes(text: &str) -> Result<i64, QuantityError> {
    let fail_unknown =
        |suffix: &str| QuantityError::UnknownSuffix(text.to_owned(), suffix.to_owned());
    if text.is_empty() {
        return Err(QuantityError::Empty(text.to_owned()));
    }
    let (negative, unsigned) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let whole_len = unsigned.bytes().take_while(u8::is_ascii_digit).count();
    let (whole, rest) = unsigned.split_at(whole_len);
    let (fraction, suffix) = match rest.strip_prefix('.') {
        Some(after_point) => {
            let fraction_len = after_point.bytes().take_while(u8::is_ascii_digit).count();
            after_point.split_at(fraction_len)
        }
        None => ("", rest),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(QuantityError::NoNumber(text.to_owned()));
    }

    let (decimal_exponent, binary_exponent) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ if suffix.len() > 1 && (suffix.starts_with('e') || suffix.starts_with('E')) => {
            let exponent = &suffix[1..];
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(fail_unknown(suffix));
            }
            // Anything beyond a few hundred is either zero-ish or overflows; the
            // clamp keeps the arithmetic below in range without changing results.
            let value: i64 = exponent.parse().unwrap_or(if exponent.starts_with('-') {
                i64::MIN
            } else {
                i64::MAX
            });
            (value.clamp(-1000, 1000), 0)
        }
        _ => return Err(fail_unknown(suffix)),
    };

    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let too_large = || QuantityError::TooLarge(text.to_owned());
    if digits.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(QuantityError::Negative(text.to_owned()));
    }
    let mantissa: u128 = digits.parse().map_err(|_| too_large())?;
    let fraction_len = i64::try_from(fraction.len()).map_err(|_| too_large())?;
    let exponent = decimal_exponent - fraction_len;
    let scaled = mantissa
        .checked_mul(1u128 << binary_exponent)
        .ok_or_else(too_large)?;
    let bytes = if exponent >= 0 {
        let factor = 10u128
            .checked_pow(u32::try_from(exponent).map_err(|_| too_large())?)
            .ok_or_else(too_large)?;
        scaled.checked_mul(factor).ok_or_else(too_large)?
    } else {
        match 10u128.checked_pow(u32::try_from(-exponent).map_err(|_| too_large())?) {
            Some(divisor) => scaled.div_ceil(divisor),
            // The divisor exceeds any mantissa: a positive amount below one byte.
            None => 1,
        }
    };
    i64::try_from(bytes).map_err(|_| too_large())
}

/// Parses a `Quantity` into whole bytes, rounding fractions up.
pub fn quantity_bytes(quantity: &Quantity) -> Result<i64, QuantityError> {
    parse_bytes(&quantity.0)
}

/// Formats a byte count the way Go's `resource.NewQuantity(bytes, BinarySI)`
/// serialises it: below 1024 plain, otherwise the largest exact binary suffix
/// (`2048` → `2Ki`, `1500` → `1500`).
pub fn bytes_to_quantity(bytes: i64) -> Quantity {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes.unsigned_abs() < 1024 {
        return Quantity(bytes.to_string());
    }
    let mut value = bytes;
    let mut exponent = 0;
    while exponent < SUFFIXES.len() - 1 && value % 1024 == 0 {
        value /= 1024;
        exponent += 1;
    }
    Quantity(format!("{value}{}", SUFFIXES[exponent]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_suffix_family() {
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("1", 1),
            ("+7", 7),
            ("1000", 1000),
            ("1k", 1000),
            ("1M", 1_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1Ki", 1024),
            ("1Mi", 1 << 20),
            ("1Gi", 1 << 30),
            ("10Gi", 10 << 30),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("1Ei", 1 << 60),
            ("1.5Gi", 3 << 29),
            ("0.5Ki", 512),
            (".5Ki", 512),
            ("2.Ki", 2048),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1e+3", 1000),
            ("12e-1", 2),
            ("1e-3", 1),
            ("100m", 1),
            ("1000m", 1),
            ("1001m", 2),
            ("1500m", 2),
            ("5n", 1),
            ("5u", 1),
            ("0.1", 1),
            ("1.0001", 2),
            ("0m", 0),
            ("0.000", 0),
            ("-0", 0),
            ("1e-1000", 1),
            ("0e1000", 0),
            ("9223372036854775807", i64::MAX),
            ("7Ei", 7 << 60),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_bytes(text), Ok(*expected), "{text}");
        }
    }

    #[test]
    fn rejects_garbage() {
        let cases: &[(&str, QuantityError)] = &[
            ("", QuantityError::Empty("".into())),
            ("Gi", QuantityError::NoNumber("Gi".into())),
            (".", QuantityError::NoNumber(".".into())),
            ("-", QuantityError::NoNumber("-".into())),
            ("+", QuantityError::NoNumber("+".into())),
            ("1K", QuantityError::UnknownSuffix("1K".into(), "K".into())),
            (
                "1gi",
                QuantityError::UnknownSuffix("1gi".into(), "gi".into()),
            ),
            (
                "1 Gi",
                QuantityError::UnknownSuffix("1 Gi".into(), " Gi".into()),
            ),
            (
                "1Gi ",
                QuantityError::UnknownSuffix("1Gi ".into(), "Gi ".into()),
            ),
            ("1e", QuantityError::UnknownSuffix("1e".into(), "e".into())),
            (
                "1e+",
                QuantityError::UnknownSuffix("1e+".into(), "e+".into()),
            ),
            (
                "1e3.5",
                QuantityError::UnknownSuffix("1e3.5".into(), "e3.5".into()),
            ),
            (
                "1.2.3",
                QuantityError::UnknownSuffix("1.2.3".into(), ".3".into()),
            ),
            ("--1", QuantityError::NoNumber("--1".into())),
            ("abc", QuantityError::NoNumber("abc".into())),
            ("-1", QuantityError::Negative("-1".into())),
            ("-1Gi", QuantityError::Negative("-1Gi".into())),
            (
                "9223372036854775808",
                QuantityError::TooLarge("9223372036854775808".into()),
            ),
            ("8Ei", QuantityError::TooLarge("8Ei".into())),
            ("1e19", QuantityError::TooLarge("1e19".into())),
            ("1e1000", QuantityError::TooLarge("1e1000".into())),
            (
                "999999999999999999999999999999999999999999",
                QuantityError::TooLarge("999999999999999999999999999999999999999999".into()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_bytes(text).as_ref(), Err(expected), "{text}");
        }
    }

    #[test]
    fn formats_like_go_binary_si() {
        let cases: &[(i64, &str)] = &[
            (0, "0"),
            (1, "1"),
            (1023, "1023"),
            (1024, "1Ki"),
            (1500, "1500"),
            (1536, "1536"),
            (2048, "2Ki"),
            (1 << 20, "1Mi"),
            (1 << 30, "1Gi"),
            (5 << 30, "5Gi"),
            ((1 << 30) + 1024, "1048577Ki"),
            (1 << 60, "1Ei"),
            (1 << 62, "4Ei"),
            (1_000_000_000, "1000000000"),
        ];
        for (bytes, expected) in cases {
            assert_eq!(bytes_to_quantity(*bytes).0, *expected, "{bytes}");
        }
    }

    #[test]
    fn formatting_round_trips() {
        for bytes in [
            0,
            1,
            1023,
            1024,
            1500,
            1 << 20,
            3 << 29,
            12345 << 10,
            i64::MAX,
        ] {
            assert_eq!(parse_bytes(&bytes_to_quantity(bytes).0), Ok(bytes));
        }
    }
}
