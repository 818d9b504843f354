//! Kubernetes resource quantities as byte counts (`1Gi`, `100Mi`, `10G`,
//! `500000`, `1.5Ti`, `1e9`): [`csi_proto::quantity`], with this crate's
//! error type.

use crate::Error;

pub use csi_proto::quantity::format_quantity;

/// Parses a Kubernetes quantity into bytes; a fraction of a byte is rounded
/// up, as Kubernetes does for storage quantities (see
/// [`csi_proto::quantity::parse_quantity`]).
pub fn parse_quantity(input: &str) -> Result<u64, Error> {
    Ok(csi_proto::quantity::parse_quantity(input)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::quantity::QuantityErrorKind;

    #[test]
    fn parses_rounds_up_and_reports_errors() {
        assert_eq!(parse_quantity("1.5Gi").expect("valid"), 1_610_612_736);
        assert_eq!(parse_quantity("1500m").expect("rounded up"), 2);
        match parse_quantity("1GB") {
            Err(Error::Quantity(e)) => {
                assert_eq!(e.input, "1GB");
                assert_eq!(e.reason, QuantityErrorKind::UnknownSuffix("GB".into()));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(format_quantity(2048), "2Ki");
    }
}
