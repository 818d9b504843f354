//! CSI call failures and whether they are *final*.
//!
//! A final error means the driver has given up on the request: nothing is
//! happening on the backend and the caller may stop. A non-final error means
//! the operation may still be running (or may run when retried with the same
//! arguments), so the caller must keep retrying the same request before it
//! may forget it — otherwise a volume created after the timeout would leak.

use std::time::Duration;

use csi_proto::codes::go_code_name;
use tonic::Code;

/// Final or non-final, as the upstream sidecar's `isFinalError` decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    Final,
    NonFinal,
}

/// Classifies a gRPC code. `ResourceExhausted` is non-final here; the
/// provisioning logic may turn it into a reschedule when topology allows.
pub fn classify(code: Code) -> ErrorClass {
    match code {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Unavailable
        | Code::ResourceExhausted
        | Code::Aborted => ErrorClass::NonFinal,
        // `Ok` never reaches here as an error; treat it as final for totality.
        _ => ErrorClass::Final,
    }
}

/// A gRPC failure as Go's status error prints it (`rpc error: code =
/// InvalidArgument desc = …`, with grpc-go's code names, not tonic's
/// `Cancelled`/`Ok`): what users of the Go sidecar see, and search for, in
/// its events and logs.
pub fn grpc_error_text(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        go_code_name(status.code()),
        status.message()
    )
}

/// A failed CSI call: the method, and the status the driver (or the
/// transport, or our deadline) produced. It prints as the Go sidecar's log
/// lines and start-up errors do, behind the method.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{method}: {}", grpc_error_text(status))]
pub struct CsiError {
    pub method: &'static str,
    pub status: tonic::Status,
}

impl CsiError {
    pub fn new(method: &'static str, status: tonic::Status) -> Self {
        Self { method, status }
    }

    /// Our own deadline fired before the driver answered.
    pub fn deadline(method: &'static str, timeout: Duration) -> Self {
        Self::new(
            method,
            tonic::Status::deadline_exceeded(format!(
                "no answer within --timeout ({})",
                crate::duration::format_go_duration(timeout)
            )),
        )
    }

    pub fn code(&self) -> Code {
        self.status.code()
    }

    pub fn class(&self) -> ErrorClass {
        classify(self.code())
    }

    pub fn is_final(&self) -> bool {
        self.class() == ErrorClass::Final
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_the_upstream_class() {
        let non_final = [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::Aborted,
        ];
        let final_codes = [
            Code::Ok,
            Code::Unknown,
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::FailedPrecondition,
            Code::OutOfRange,
            Code::Unimplemented,
            Code::Internal,
            Code::DataLoss,
            Code::Unauthenticated,
        ];
        assert_eq!(
            non_final.len() + final_codes.len(),
            17,
            "all gRPC codes covered"
        );
        for code in non_final {
            assert_eq!(classify(code), ErrorClass::NonFinal, "{code:?}");
        }
        for code in final_codes {
            assert_eq!(classify(code), ErrorClass::Final, "{code:?}");
        }
    }

    #[test]
    fn our_deadline_is_non_final_and_says_why() {
        let e = CsiError::deadline("CreateVolume", Duration::from_secs(10));
        assert!(!e.is_final());
        assert_eq!(e.code(), Code::DeadlineExceeded);
        let text = e.to_string();
        assert!(
            text.contains("CreateVolume") && text.contains("10s"),
            "{text}"
        );
    }

    #[test]
    fn go_status_text() {
        let status = tonic::Status::new(Code::ResourceExhausted, "Not enough disk space");
        assert_eq!(
            grpc_error_text(&status),
            "rpc error: code = ResourceExhausted desc = Not enough disk space"
        );
        let cancelled = CsiError::new("Probe", tonic::Status::cancelled("gone"));
        assert_eq!(
            cancelled.to_string(),
            "Probe: rpc error: code = Canceled desc = gone"
        );
    }
}
