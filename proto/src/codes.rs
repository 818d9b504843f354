//! gRPC status code names, in both spellings: csi.proto's and the CSI
//! spec's (`INVALID_ARGUMENT`, `CANCELLED`), which csi-sanity prints and the
//! hostpath driver's fault files use, and grpc-go's `codes.Code.String()`
//! (`InvalidArgument`, `Canceled`), which the Go sidecar writes in
//! `rpc error: code = … desc = …` texts and in its `grpc_status_code` metric
//! label.

use tonic::Code;

/// Every code with its csi.proto name and its grpc-go name, in numeric
/// order (checked at compile time), so a code's number is its index.
pub const CODES: [(Code, &str, &str); 17] = [
    (Code::Ok, "OK", "OK"),
    (Code::Cancelled, "CANCELLED", "Canceled"),
    (Code::Unknown, "UNKNOWN", "Unknown"),
    (Code::InvalidArgument, "INVALID_ARGUMENT", "InvalidArgument"),
    (
        Code::DeadlineExceeded,
        "DEADLINE_EXCEEDED",
        "DeadlineExceeded",
    ),
    (Code::NotFound, "NOT_FOUND", "NotFound"),
    (Code::AlreadyExists, "ALREADY_EXISTS", "AlreadyExists"),
    (
        Code::PermissionDenied,
        "PERMISSION_DENIED",
        "PermissionDenied",
    ),
    (
        Code::ResourceExhausted,
        "RESOURCE_EXHAUSTED",
        "ResourceExhausted",
    ),
    (
        Code::FailedPrecondition,
        "FAILED_PRECONDITION",
        "FailedPrecondition",
    ),
    (Code::Aborted, "ABORTED", "Aborted"),
    (Code::OutOfRange, "OUT_OF_RANGE", "OutOfRange"),
    (Code::Unimplemented, "UNIMPLEMENTED", "Unimplemented"),
    (Code::Internal, "INTERNAL", "Internal"),
    (Code::Unavailable, "UNAVAILABLE", "Unavailable"),
    (Code::DataLoss, "DATA_LOSS", "DataLoss"),
    (Code::Unauthenticated, "UNAUTHENTICATED", "Unauthenticated"),
];

// The lookups below index CODES by a code's number.
const _: () = {
    let mut i = 0;
    while i < CODES.len() {
        assert!(CODES[i].0 as usize == i, "CODES is not in numeric order");
        i += 1;
    }
};

fn names(code: Code) -> &'static (Code, &'static str, &'static str) {
    &CODES[code as usize]
}

/// The csi.proto name of a code, e.g. `UNAVAILABLE`, `CANCELLED`.
pub fn code_name(code: Code) -> &'static str {
    names(code).1
}

/// grpc-go's name of a code, e.g. `Unavailable`, `Canceled`: what the Go
/// sidecar's events, logs and metric labels show.
pub fn go_code_name(code: Code) -> &'static str {
    names(code).2
}

/// Parses a code name in either spelling, in any case, with or without
/// underscores (`UNAVAILABLE`, `Unavailable`, `resource_exhausted`,
/// `CANCELLED`, Go's `Canceled`), or its number (`14`).
pub fn parse_code(input: &str) -> Result<Code, String> {
    let trimmed = input.trim();
    if let Ok(n) = trimmed.parse::<i32>() {
        return if (0..=16).contains(&n) {
            Ok(Code::from_i32(n))
        } else {
            Err(format!("unknown gRPC code {input:?}"))
        };
    }
    let normal = |name: &str| -> String {
        name.chars()
            .filter(|c| *c != '_')
            .flat_map(char::to_uppercase)
            .collect()
    };
    let wanted = normal(trimmed);
    CODES
        .iter()
        .find(|(_, proto, go)| normal(proto) == wanted || normal(go) == wanted)
        .map(|(code, _, _)| *code)
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
            ("CANCELLED", Code::Cancelled),
            ("cancelled", Code::Cancelled),
            (" OK ", Code::Ok),
            ("14", Code::Unavailable),
            ("0", Code::Ok),
        ] {
            assert_eq!(parse_code(input), Ok(want), "{input}");
        }
        for input in ["", "17", "-1", "NOPE", "UNAVAILABLEX", "CANCELED_X"] {
            assert!(parse_code(input).is_err(), "{input}");
        }
        let mut names = std::collections::HashSet::new();
        for n in 0..=16 {
            let code = Code::from_i32(n);
            assert!(names.insert(code_name(code)), "{code:?} named twice");
            assert_eq!(parse_code(code_name(code)), Ok(code));
            assert_eq!(parse_code(go_code_name(code)), Ok(code));
            assert_eq!(parse_code(&n.to_string()), Ok(code));
        }
    }

    #[test]
    fn code_names_are_grpc_go_spellings() {
        assert_eq!(go_code_name(Code::Ok), "OK");
        assert_eq!(go_code_name(Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(Code::DeadlineExceeded), "DeadlineExceeded");
        assert_eq!(go_code_name(Code::Unavailable), "Unavailable");
        // Every code maps to a distinct name.
        let names: std::collections::BTreeSet<&str> =
            (0..17).map(|i| go_code_name(Code::from_i32(i))).collect();
        assert_eq!(names.len(), 17);
    }

    /// grpc-go's names are tonic's variant names but for `Ok` and
    /// `Cancelled`, so `{code:?}` would misspell exactly those two.
    #[test]
    fn go_names_differ_from_debug_only_for_ok_and_cancelled() {
        for (code, _, go) in CODES {
            let debug = format!("{code:?}");
            if matches!(code, Code::Ok | Code::Cancelled) {
                assert_ne!(debug, go);
            } else {
                assert_eq!(debug, go);
            }
        }
    }
}
