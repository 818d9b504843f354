//! Go `time.ParseDuration` syntax, so durations on our command line read as
//! they do for the upstream sidecar: `15s`, `1m30s`, `1.5h`, `300ms`, `0`.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?}: empty")]
    Empty(String),
    #[error("invalid duration {0:?}: negative durations are not allowed here")]
    Negative(String),
    #[error(
        "invalid duration {0:?}: expected a number followed by a unit (ns, us, ms, s, m, h), e.g. 1m30s"
    )]
    Syntax(String),
    #[error("invalid duration {0:?}: missing unit in {1:?} (use ns, us, ms, s, m or h)")]
    MissingUnit(String, String),
    #[error("invalid duration {0:?}: unknown unit {1:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit(String, String),
    #[error("invalid duration {0:?}: out of range")]
    Overflow(String),
}

/// Parses a Go duration string. Like Go, a bare `0` needs no unit and several
/// `<number><unit>` terms add up; unlike Go, a negative value is an error,
/// because no flag of ours has a meaning for it.
pub fn parse_go_duration(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty(input.to_owned()));
    }
    let s = match s.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') && !rest.is_empty() => {
            return Ok(Duration::ZERO);
        }
        Some(_) => return Err(DurationError::Negative(input.to_owned())),
        None => s.strip_prefix('+').unwrap_or(s),
    };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total_nanos: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_len];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(DurationError::Syntax(input.to_owned()));
        }
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit_nanos: u128 = match unit {
            "" => {
                return Err(DurationError::MissingUnit(
                    input.to_owned(),
                    number.to_owned(),
                ));
            }
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            other => {
                return Err(DurationError::UnknownUnit(
                    input.to_owned(),
                    other.to_owned(),
                ));
            }
        };
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let overflow = || DurationError::Overflow(input.to_owned());
        let int_value: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| overflow())?
        };
        let mut nanos = int_value.checked_mul(unit_nanos).ok_or_else(overflow)?;
        // Fractions are exact to the nanosecond; extra digits are dropped as
        // Go does.
        let mut scale = unit_nanos;
        for digit in frac_part.chars().take(30) {
            scale /= 10;
            if scale == 0 {
                break;
            }
            let d = u128::from(digit.to_digit(10).ok_or_else(overflow)?);
            nanos += d * scale;
        }
        total_nanos = total_nanos.checked_add(nanos).ok_or_else(overflow)?;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000)
        .map_err(|_| DurationError::Overflow(input.to_owned()))?;
    // Less than 1e9, fits.
    let sub = (total_nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

/// Formats a duration the way Go prints it (`1m30s`, `10s`, `500ms`), for help
/// texts and log lines.
pub fn format_go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    let nanos = d.as_nanos();
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let total_secs = d.as_secs();
    let h = total_secs / 3600;
    let m = (total_secs % 3600) / 60;
    let s_nanos = nanos - u128::from(h * 3600 + m * 60) * 1_000_000_000;
    let secs = trim_fraction(s_nanos, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}

fn trim_fraction(value: u128, unit: u128) -> String {
    let int = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return int.to_string();
    }
    let width = unit.to_string().len() - 1;
    let digits = format!("{frac:0width$}");
    format!("{int}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn parses_go_syntax() {
        for (input, want) in [
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("15s", ms(15_000)),
            ("+5s", ms(5_000)),
            ("1m30s", ms(90_000)),
            ("1.5h", ms(5_400_000)),
            ("2h45m", ms(9_900_000)),
            ("300ms", ms(300)),
            (".5s", ms(500)),
            ("1.s", ms(1_000)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("1h1m1s1ms1us1ns", Duration::new(3661, 1_001_001)),
            ("1.0000000001s", ms(1_000)),
            (" 5m ", ms(300_000)),
        ] {
            assert_eq!(parse_go_duration(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(
            parse_go_duration(""),
            Err(DurationError::Empty(_))
        ));
        assert!(matches!(
            parse_go_duration("  "),
            Err(DurationError::Empty(_))
        ));
        assert!(matches!(
            parse_go_duration("-5s"),
            Err(DurationError::Negative(_))
        ));
        assert!(matches!(
            parse_go_duration("10"),
            Err(DurationError::MissingUnit(..))
        ));
        assert!(matches!(
            parse_go_duration("1m30"),
            Err(DurationError::MissingUnit(..))
        ));
        assert!(matches!(
            parse_go_duration("5d"),
            Err(DurationError::UnknownUnit(..))
        ));
        assert!(matches!(
            parse_go_duration("5 s"),
            Err(DurationError::UnknownUnit(..))
        ));
        assert!(matches!(
            parse_go_duration("s"),
            Err(DurationError::Syntax(_))
        ));
        assert!(matches!(
            parse_go_duration("1..5s"),
            Err(DurationError::Syntax(_))
        ));
        assert!(matches!(
            parse_go_duration(".s"),
            Err(DurationError::Syntax(_))
        ));
        assert!(matches!(
            parse_go_duration("99999999999999999999999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn formats_like_go() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (ms(10_000), "10s"),
            (ms(90_000), "1m30s"),
            (ms(300_000), "5m0s"),
            (ms(3_600_000), "1h0m0s"),
            (ms(1_500), "1.5s"),
            (ms(250), "250ms"),
            (Duration::from_micros(3), "3µs"),
            (Duration::from_nanos(12), "12ns"),
        ] {
            assert_eq!(format_go_duration(d), want);
            assert_eq!(parse_go_duration(want), Ok(d), "round trip {want}");
        }
    }
}
