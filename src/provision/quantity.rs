//! Claim sizes as byte counts, the provisioning way.
//!
//! `k8s_openapi` keeps a `Quantity` as its string, so the capacity of a PVC
//! has to be parsed here; the grammar is apimachinery's, in
//! `proto/src/quantity.rs` (shared with the hostpath driver and csi-sanity).
//! What is provisioning's: sizes are `int64` like Go's `Quantity.Value()`,
//! rounded up to a whole byte so that `100m` asks for one byte rather than
//! zero, and written back the way Go's `BinarySI` quantities are.

use csi_proto::quantity::{QuantityError, Rounding, format_quantity, parse_quantity_i64};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Parses a quantity into whole bytes, rounding fractions up.
pub fn parse_bytes(text: &str) -> Result<i64, QuantityError> {
    parse_quantity_i64(text, Rounding::Up)
}

/// Parses a `Quantity` into whole bytes, rounding fractions up.
pub fn quantity_bytes(quantity: &Quantity) -> Result<i64, QuantityError> {
    parse_bytes(&quantity.0)
}

/// Formats a byte count the way Go's `resource.NewQuantity(bytes, BinarySI)`
/// serialises it: below 1024 plain, otherwise the largest exact binary suffix
/// (`2048` → `2Ki`, `1500` → `1500`, `-2048` → `-2Ki`).
pub fn bytes_to_quantity(bytes: i64) -> Quantity {
    let sign = if bytes < 0 { "-" } else { "" };
    Quantity(format!("{sign}{}", format_quantity(bytes.unsigned_abs())))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            (-5, "-5"),
            (-2048, "-2Ki"),
            (i64::MIN, "-8Ei"),
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
