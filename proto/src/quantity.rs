//! Kubernetes resource quantities as byte counts (`1Gi`, `100Mi`, `10G`,
//! `500000`, `1.5Ti`, `1e9`, `100m`): the one parser of the workspace, used
//! by the provisioner (claim sizes, restore sizes, capacities, flag values),
//! the hostpath driver and csi-sanity.
//!
//! The grammar is apimachinery's `resource.ParseQuantity`:
//! `[+|-]<number><suffix>`, where the number is `<digits>`, `<digits>.`,
//! `.<digits>` or `<digits>.<digits>` and the suffix is empty, binary
//! (`Ki Mi Gi Ti Pi Ei`), decimal (`n u m k M G T P E`) or a decimal exponent
//! (`e<int64>` / `E<int64>`: an exponent Go's `strconv.ParseInt(…, 10, 64)`
//! reads). White space is not part of it (the API server rejects `" 1Gi"`);
//! a command line that wants to forgive it trims before calling.
//!
//! The value is computed exactly from the decimal digits, whatever their
//! number and the exponent, so precision never turns into a wrong answer:
//! a result beyond the integer type is [`QuantityErrorKind::TooLarge`], a
//! fraction of a byte is rounded up (as Go's `Quantity.Value()` does, so
//! `100m` asks for one byte rather than zero) or rejected. Where
//! apimachinery itself is looser than its grammar (it reads `-`, `+` and `.`
//! as zero, and truncates an exponent to 32 bits, so `1e4294967296` is one
//! byte) this parser keeps to the grammar and the true value.

/// Why a quantity was rejected. The text is the provisioner's
/// `ProvisioningFailed` event wording (`quantity "9Ei" does not fit into 63
/// bits of bytes`), which `tests/bad_inputs.rs` checks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quantity {input:?} {reason}")]
pub struct QuantityError {
    /// The text as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: QuantityErrorKind,
}

/// The ways a quantity can be wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityErrorKind {
    #[error("is empty")]
    Empty,
    /// No digit before the suffix (`Gi`, `.`, `-`, ` 1`).
    #[error("has no number")]
    NoNumber,
    /// What follows the number is not a suffix (`1GB`, `1K`, `1Gi `).
    #[error("has an unknown suffix {0:?}")]
    UnknownSuffix(String),
    #[error("is negative")]
    Negative,
    /// More bytes than the result type holds: 64 bits for
    /// [`parse_quantity_with`], 63 for [`parse_quantity_i64`].
    #[error("does not fit into {bits} bits of bytes")]
    TooLarge { bits: u32 },
    /// Only with [`Rounding::Exact`].
    #[error("is not a whole number of bytes")]
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

/// The binary suffixes with their powers of two, smallest first.
const BINARY_SUFFIXES: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

/// The decimal suffixes with their powers of ten.
const DECIMAL_SUFFIXES: [(&str, i64); 10] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

/// Parses a Kubernetes quantity into bytes, rounding a fraction of a byte
/// up.
pub fn parse_quantity(input: &str) -> Result<u64, QuantityError> {
    parse_quantity_with(input, Rounding::Up)
}

/// [`parse_quantity`] with the given treatment of fractional bytes.
pub fn parse_quantity_with(input: &str, rounding: Rounding) -> Result<u64, QuantityError> {
    parse(input, rounding).map_err(|reason| QuantityError {
        input: input.to_owned(),
        reason,
    })
}

/// [`parse_quantity_with`] into the signed 64 bits that Kubernetes'
/// `Quantity.Value()` and CSI's byte counts (`capacity_bytes`,
/// `required_bytes`) hold.
pub fn parse_quantity_i64(input: &str, rounding: Rounding) -> Result<i64, QuantityError> {
    const TOO_LARGE_SIGNED: QuantityErrorKind = QuantityErrorKind::TooLarge { bits: 63 };
    parse(input, rounding)
        .and_then(|bytes| i64::try_from(bytes).map_err(|_| TOO_LARGE_SIGNED))
        .map_err(|reason| QuantityError {
            input: input.to_owned(),
            reason: match reason {
                QuantityErrorKind::TooLarge { .. } => TOO_LARGE_SIGNED,
                other => other,
            },
        })
}

/// Beyond `u64`.
const TOO_LARGE: QuantityErrorKind = QuantityErrorKind::TooLarge { bits: 64 };

fn parse(input: &str, rounding: Rounding) -> Result<u64, QuantityErrorKind> {
    use QuantityErrorKind::*;
    let (negative, unsigned) = match input.as_bytes().first() {
        None => return Err(Empty),
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        Some(_) => (false, input),
    };
    let (whole, rest) = unsigned.split_at(digit_count(unsigned));
    let (fraction, suffix) = match rest.strip_prefix('.') {
        Some(after_point) => after_point.split_at(digit_count(after_point)),
        None => ("", rest),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(NoNumber);
    }
    let (suffix_exponent, binary_exponent) =
        suffix_scale(suffix).ok_or_else(|| UnknownSuffix(suffix.to_owned()))?;

    // The value is `digits × 10^exponent × 2^binary_exponent`.
    let digits: Vec<u8> = whole
        .bytes()
        .chain(fraction.bytes())
        .skip_while(|b| *b == b'0')
        .map(|b| b - b'0')
        .collect();
    if digits.is_empty() {
        // Kubernetes reads `-0` as zero too.
        return Ok(0);
    }
    if negative {
        return Err(Negative);
    }
    let exponent = suffix_exponent.saturating_sub(length(fraction.as_bytes()));
    // Bounds first, so that a huge exponent costs nothing: `2^binary_exponent`
    // is below 10^19, so at least 21 integer digits of `digits × 10^exponent`
    // (10^20 and more) overflow 64 bits, and at most -19 (below 10^-19) stay
    // below one byte.
    let integer_digits = length(&digits).saturating_add(exponent);
    if integer_digits > 20 {
        return Err(TOO_LARGE);
    }
    if integer_digits < -18 {
        return round_up_fraction(0, rounding);
    }
    let digits = times_power_of_two(digits, binary_exponent);
    // Where the decimal point falls in `digits`: before it the integer part
    // (followed by zeros when the point lies beyond the last digit), after it
    // the fraction: -18..=39 by the bounds above, 2^60 having 19 digits.
    let point = length(&digits).saturating_add(exponent);
    let split = usize::try_from(point).unwrap_or(0).min(digits.len());
    let (integer, fraction) = digits.split_at(split);
    let zeros = u32::try_from(point.saturating_sub(length(&digits))).unwrap_or(0);
    let value = integer
        .iter()
        .try_fold(0u64, |value, digit| {
            value.checked_mul(10)?.checked_add(u64::from(*digit))
        })
        .and_then(|value| value.checked_mul(10u64.checked_pow(zeros)?))
        .ok_or(TOO_LARGE)?;
    if fraction.iter().all(|digit| *digit == 0) {
        Ok(value)
    } else {
        round_up_fraction(value, rounding)
    }
}

/// `value` plus a positive fraction of a byte.
fn round_up_fraction(value: u64, rounding: Rounding) -> Result<u64, QuantityErrorKind> {
    match rounding {
        Rounding::Up => value.checked_add(1).ok_or(TOO_LARGE),
        Rounding::Exact => Err(QuantityErrorKind::Fractional),
    }
}

fn digit_count(s: &str) -> usize {
    s.bytes().take_while(u8::is_ascii_digit).count()
}

fn length(bytes: &[u8]) -> i64 {
    i64::try_from(bytes.len()).unwrap_or(i64::MAX)
}

/// The power of ten and the power of two a suffix multiplies by; `None` for
/// an unknown suffix.
fn suffix_scale(suffix: &str) -> Option<(i64, u32)> {
    if let Some((_, power)) = DECIMAL_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Some((*power, 0));
    }
    if let Some((_, power)) = BINARY_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Some((0, *power));
    }
    // `E` alone is exa (found above); with digits it is an exponent.
    let exponent = suffix.strip_prefix(['e', 'E'])?;
    exponent.parse::<i64>().ok().map(|power| (power, 0))
}

/// Decimal digits (most significant first) times `2^power` (at most 2^60).
fn times_power_of_two(mut digits: Vec<u8>, power: u32) -> Vec<u8> {
    if power == 0 {
        return digits;
    }
    let factor = 1u128 << power;
    let mut carry = 0u128;
    for digit in digits.iter_mut().rev() {
        let product = u128::from(*digit) * factor + carry;
        *digit = (product % 10) as u8;
        carry = product / 10;
    }
    let mut high = Vec::new();
    while carry > 0 {
        high.push((carry % 10) as u8);
        carry /= 10;
    }
    high.reverse();
    high.extend(digits);
    high
}

/// Formats bytes with the largest binary suffix that divides them exactly
/// (`10Mi`, `1536Ki`, `7`), as Go's `resource.NewQuantity(bytes, BinarySI)`
/// serialises them: below 1024 plain.
pub fn format_quantity(bytes: u64) -> String {
    for (suffix, shift) in BINARY_SUFFIXES.iter().rev() {
        if bytes != 0 && bytes.trailing_zeros() >= *shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use QuantityErrorKind::*;

    /// Asserts `input` parses to `want` rounded up, and to the same exactly
    /// when `whole` (a whole number of bytes, or an error either way),
    /// otherwise to `Fractional`; and into `i64` as into `u64` but beyond 63
    /// bits.
    fn check(input: &str, want: Result<u64, QuantityErrorKind>, whole: bool) {
        let reason = |e: QuantityError| {
            assert_eq!(e.input, input);
            e.reason
        };
        assert_eq!(parse_quantity(input).map_err(reason), want, "{input:?}");
        let want_exact = if whole { want.clone() } else { Err(Fractional) };
        assert_eq!(
            parse_quantity_with(input, Rounding::Exact).map_err(reason),
            want_exact,
            "{input:?} exactly"
        );
        let want_signed = match want {
            Ok(bytes) => i64::try_from(bytes).map_err(|_| TooLarge { bits: 63 }),
            Err(TooLarge { .. }) => Err(TooLarge { bits: 63 }),
            Err(other) => Err(other),
        };
        assert_eq!(
            parse_quantity_i64(input, Rounding::Up).map_err(reason),
            want_signed,
            "{input:?} into i64"
        );
    }

    #[test]
    fn valid() {
        for (input, want) in [
            ("0", 0u64),
            ("1", 1),
            ("1000", 1000),
            ("500000", 500_000),
            ("1073741824", 1 << 30),
            ("+7", 7),
            ("1Ki", 1024),
            ("1Mi", 1 << 20),
            ("100Mi", 100 << 20),
            ("1Gi", 1 << 30),
            ("10Gi", 10 << 30),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("2Pi", 2 << 50),
            ("1Ei", 1 << 60),
            ("7Ei", 7 << 60),
            ("8Ei", 8 << 60),
            ("10G", 10_000_000_000),
            ("1k", 1000),
            ("1M", 1_000_000),
            ("3M", 3_000_000),
            ("500M", 500_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1.5Gi", 1_610_612_736),
            ("0.5Ki", 512),
            (".5Ki", 512),
            ("2.Ki", 2048),
            ("1.", 1),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1e+3", 1000),
            ("1e19", 10_000_000_000_000_000_000),
            ("1000m", 1),
            ("0m", 0),
            ("0007", 7),
            ("0.000", 0),
            ("-0", 0),
            ("0e1000", 0),
            ("9223372036854775807", i64::MAX.unsigned_abs()),
            ("9223372036854775808", 1 << 63),
            ("18446744073709551615", u64::MAX),
        ] {
            check(input, Ok(want), true);
        }
    }

    #[test]
    fn fractions_round_up_or_are_rejected() {
        for (input, up) in [
            ("15e-1", 2u64),
            ("12e-1", 2),
            ("1e-3", 1),
            ("100m", 1),
            ("1001m", 2),
            ("1500m", 2),
            ("1m", 1),
            ("5n", 1),
            ("5u", 1),
            ("0.1", 1),
            ("1.0001", 2),
            ("1.0001Ki", 1025),
            ("1e-40", 1),
            ("1e-1000", 1),
            (".000000000000000000000000000001e-40", 1),
        ] {
            check(input, Ok(up), false);
        }
    }

    #[test]
    fn invalid() {
        for (input, kind) in [
            ("", Empty),
            ("-1", Negative),
            ("-1Gi", Negative),
            ("Gi", NoNumber),
            (".", NoNumber),
            ("-", NoNumber),
            ("+", NoNumber),
            ("--1", NoNumber),
            ("abc", NoNumber),
            ("1gi", UnknownSuffix("gi".into())),
            ("1K", UnknownSuffix("K".into())),
            ("1GB", UnknownSuffix("GB".into())),
            ("10MB", UnknownSuffix("MB".into())),
            ("1 Gi", UnknownSuffix(" Gi".into())),
            ("1Gi ", UnknownSuffix("Gi ".into())),
            ("1.2.3", UnknownSuffix(".3".into())),
            ("1e", UnknownSuffix("e".into())),
            ("1e+", UnknownSuffix("e+".into())),
            ("1e3.5", UnknownSuffix("e3.5".into())),
            ("1ex", UnknownSuffix("ex".into())),
            ("1Ki1", UnknownSuffix("Ki1".into())),
            ("1x", UnknownSuffix("x".into())),
            ("0x10", UnknownSuffix("x10".into())),
            ("16Ei", TooLarge { bits: 64 }),
            ("18446744073709551616", TooLarge { bits: 64 }),
            ("1e41", TooLarge { bits: 64 }),
            ("1e1000", TooLarge { bits: 64 }),
            ("99999999999999999999999999999999", TooLarge { bits: 64 }),
            (
                "999999999999999999999999999999999999999999",
                TooLarge { bits: 64 },
            ),
        ] {
            check(input, Err(kind), true);
        }
        let e = parse_quantity("1GB").expect_err("bad");
        assert_eq!(e.input, "1GB");
        assert_eq!(
            e.to_string(),
            "quantity \"1GB\" has an unknown suffix \"GB\""
        );
    }

    /// The grammar's edges: the `n` and `u` suffixes, int64 exponents, no
    /// white space, signs, and fractions of a byte at any precision.
    #[test]
    fn merged_grammar_edges() {
        let cases: &[(&str, Result<u64, QuantityErrorKind>, bool)] = &[
            // `n` and `u` are decimal suffixes too.
            ("1000000000n", Ok(1), true),
            ("1500000000n", Ok(2), false),
            ("3000000u", Ok(3), true),
            // Exponents are int64 (`strconv.ParseInt(…, 10, 64)`); within
            // that range any size is computed (no 32-bit truncation), beyond
            // it the suffix is bad.
            ("1e20", Err(TooLarge { bits: 64 }), true),
            ("1e4294967296", Err(TooLarge { bits: 64 }), true),
            ("1e9223372036854775807", Err(TooLarge { bits: 64 }), true),
            ("0e9223372036854775807", Ok(0), true),
            ("1e-41", Ok(1), false),
            ("1e-4294967296", Ok(1), false),
            ("1e-9223372036854775808", Ok(1), false),
            ("0.1e-9223372036854775808", Ok(1), false),
            (
                "1e9223372036854775808",
                Err(UnknownSuffix("e9223372036854775808".into())),
                true,
            ),
            (
                "1e-9223372036854775809",
                Err(UnknownSuffix("e-9223372036854775809".into())),
                true,
            ),
            ("1ee3", Err(UnknownSuffix("ee3".into())), true),
            ("1E", Ok(1_000_000_000_000_000_000), true),
            // No white space anywhere.
            (" ", Err(NoNumber), true),
            (" 42 ", Err(NoNumber), true),
            ("\t1Gi", Err(NoNumber), true),
            ("1\n", Err(UnknownSuffix("\n".into())), true),
            // A sign, then a number; zero has no sign; a bad suffix is
            // reported before the sign.
            ("-0.0Gi", Ok(0), true),
            ("+0", Ok(0), true),
            ("-1m", Err(Negative), true),
            ("-1x", Err(UnknownSuffix("x".into())), true),
            ("+-1", Err(NoNumber), true),
            // Fractional bytes, exactly whatever the precision.
            ("0.5", Ok(1), false),
            ("1.5", Ok(2), false),
            ("0.1Ki", Ok(103), false),
            ("0.0009765625Ki", Ok(1), true),
            ("1.G", Ok(1_000_000_000), true),
            ("1.0000000000000000000000000000000000000001", Ok(2), false),
            (
                "1.000000000000000000000000000000000000000000000Gi",
                Ok(1 << 30),
                true,
            ),
            (
                "100000000000000000000000000000000000000000e-40",
                Ok(10),
                true,
            ),
            (
                "12345678901234567890123456789012345678901234567890e-40",
                Ok(1_234_567_891),
                false,
            ),
            (
                "0.12345678901234567890123Ei",
                Ok(142_335_986_942_043_634),
                false,
            ),
            ("1.5Ei", Ok(1_729_382_256_910_270_464), true),
            (
                "0.000000000000000000000000000000000000000000001Ei",
                Ok(1),
                false,
            ),
            ("18446744073709551614.5", Ok(u64::MAX), false),
            ("18446744073709551615.5", Err(TooLarge { bits: 64 }), false),
        ];
        for (input, want, whole) in cases {
            check(input, want.clone(), *whole);
        }
    }

    /// The event texts `tests/bad_inputs.rs` expects, also when the value
    /// is beyond 64 bits.
    #[test]
    fn signed_results_say_63_bits() {
        for (input, text) in [
            ("9Ei", "does not fit into 63 bits of bytes"),
            ("16Ei", "does not fit into 63 bits of bytes"),
            ("12 parsecs", "has an unknown suffix \" parsecs\""),
        ] {
            assert_eq!(
                parse_quantity_i64(input, Rounding::Up)
                    .expect_err("invalid")
                    .to_string(),
                format!("quantity {input:?} {text}")
            );
        }
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
