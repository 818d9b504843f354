//! Parsing of sizes (`10Mi`, `1G`, `1073741824`) and durations (`30s`,
//! `2m`, `90`).

use std::time::Duration;

/// A size or duration that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty value")]
    Empty,
    #[error("{0:?} is not a size: use plain bytes (1073741824) or a quantity (10Mi, 1Gi, 500M)")]
    BadSize(String),
    #[error("{0:?} is too large")]
    Overflow(String),
    #[error("{0:?} is not a duration: use seconds (90) or a number with s, m or h (30s, 2m)")]
    BadDuration(String),
}

/// Parses a byte count: a plain non-negative integer (the upstream tool's
/// `--csi.testvolumesize` takes bytes) or a Kubernetes quantity
/// ([`csi_proto::quantity`]: `10Mi`, `1Gi`, `500M`, `1e9`). A fraction is
/// accepted when the result is a whole number of bytes (`1.5Gi`). Surrounding
/// white space is forgiven here, as in [`parse_duration`] (Kubernetes'
/// grammar has none).
pub fn parse_size(input: &str) -> Result<i64, QuantityError> {
    use csi_proto::quantity::{QuantityErrorKind as Kind, Rounding, parse_quantity_i64};
    parse_quantity_i64(input.trim(), Rounding::Exact).map_err(|e| match e.reason {
        Kind::Empty => QuantityError::Empty,
        Kind::TooLarge { .. } => QuantityError::Overflow(input.to_owned()),
        Kind::Fractional => {
            QuantityError::BadSize(format!("{input} (not a whole number of bytes)"))
        }
        Kind::Negative | Kind::NoNumber | Kind::UnknownSuffix(_) => {
            QuantityError::BadSize(input.to_owned())
        }
    })
}

/// Parses a duration: plain seconds (`90`) or a number followed by `ms`, `s`,
/// `m` or `h` (`500ms`, `30s`, `2m`, `1h`).
pub fn parse_duration(input: &str) -> Result<Duration, QuantityError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let bad = || QuantityError::BadDuration(input.to_owned());
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let ms_per_unit: u64 = match unit {
        "" | "s" => 1_000,
        "ms" => 1,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .ok_or_else(|| QuantityError::Overflow(input.to_owned()))?;
    Ok(Duration::from_millis(ms))
}

/// Formats a byte count the way a person writes it (`10Mi`, `1536Ki`, `7`).
pub fn format_size(bytes: i64) -> String {
    match u64::try_from(bytes) {
        Ok(n) => csi_proto::quantity::format_quantity(n),
        Err(_) => bytes.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10Mi"), Ok(10 << 20));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size(" 1Gi "), Ok(1 << 30));
        assert_eq!(parse_size("500M"), Ok(500_000_000));
        assert_eq!(parse_size("2k"), Ok(2_000));
        assert_eq!(parse_size("1e9"), Ok(1_000_000_000));
        assert!(matches!(parse_size("2K"), Err(QuantityError::BadSize(_))));
        assert!(matches!(parse_size("9Ei"), Err(QuantityError::Overflow(_))));
        assert_eq!(parse_size("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(matches!(parse_size("10MB"), Err(QuantityError::BadSize(_))));
        assert!(matches!(parse_size("-1"), Err(QuantityError::BadSize(_))));
        assert!(matches!(parse_size("Mi"), Err(QuantityError::BadSize(_))));
        assert!(matches!(
            parse_size("1.2.3"),
            Err(QuantityError::BadSize(_))
        ));
        assert!(matches!(parse_size("0.1"), Err(QuantityError::BadSize(_))));
        assert!(matches!(
            parse_size("16Ei"),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            parse_size("99999999999999999999999999999999999999999"),
            Err(QuantityError::Overflow(_))
        ));
        assert_eq!(parse_size(""), Err(QuantityError::Empty));
        assert_eq!(parse_size("  "), Err(QuantityError::Empty));
        assert_eq!(parse_size("\t5Mi\n"), Ok(5 << 20));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("1d").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(10 << 20), "10Mi");
        assert_eq!(format_size(1536 << 10), "1536Ki");
        assert_eq!(format_size(7), "7");
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(-3), "-3");
    }
}
