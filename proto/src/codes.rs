//! gRPC status code names as csi.proto and the CSI spec write them
//! (`INVALID_ARGUMENT`), shared by the hostpath driver and csi-sanity.

use tonic::Code;

/// The canonical name of a code, e.g. `UNAVAILABLE`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Parses a code name in any case, with or without underscores
/// (`UNAVAILABLE`, `Unavailable`, `resource_exhausted`, Go's `Canceled`), or
/// its number (`14`).
pub fn parse_code(input: &str) -> Result<Code, String> {
    let trimmed = input.trim();
    if let Ok(n) = trimmed.parse::<i32>() {
        return if (0..=16).contains(&n) {
            Ok(Code::from_i32(n))
        } else {
            Err(format!("unknown gRPC code {input:?}"))
        };
    }
    let wanted: String = trimmed
        .chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_uppercase)
        .collect();
    // "CANCELED" is the Go spelling.
    let wanted = if wanted == "CANCELED" {
        "CANCELLED".to_owned()
    } else {
        wanted
    };
    (0..=16)
        .map(Code::from_i32)
        .find(|c| code_name(*c).replace('_', "") == wanted)
        .ok_or_else(|| format!("unknown gRPC code {input:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_spellings() {
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(Code::Cancelled), "CANCELLED");
        for (input, want) in [
            ("UNAVAILABLE", Code::Unavailable),
            ("Unavailable", Code::Unavailable),
            ("unavailable", Code::Unavailable),
            ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
            ("DeadlineExceeded", Code::DeadlineExceeded),
            ("resource_exhausted", Code::ResourceExhausted),
            ("Canceled", Code::Cancelled),
            ("14", Code::Unavailable),
            ("0", Code::Ok),
        ] {
            assert_eq!(parse_code(input), Ok(want), "{input}");
        }
        for input in ["", "17", "-1", "NOPE", "UNAVAILABLEX"] {
            assert!(parse_code(input).is_err(), "{input}");
        }
        let mut names = std::collections::HashSet::new();
        for n in 0..=16 {
            let code = Code::from_i32(n);
            assert!(names.insert(code_name(code)), "{code:?} named twice");
            assert_eq!(parse_code(code_name(code)), Ok(code));
            assert_eq!(parse_code(&n.to_string()), Ok(code));
        }
    }
}
