//! Talking to the CSI driver over its unix socket.
//!
//! - [`connection`]: wait for the socket and for `Probe` to say ready.
//! - [`driver`]: the [`Driver`] facade — what the driver is and can do, and
//!   the controller calls with the `--timeout` deadline.
//! - [`error`]: [`CsiError`] and its final / non-final class (docs/design.md,
//!   "Errors: final, non-final, retries").

pub mod adaptive;
pub mod connection;
pub mod driver;
pub mod error;

use std::future::Future;
use std::time::Duration;

pub use driver::{Driver, DriverInfo, StartupError};
pub use error::{CsiError, ErrorClass, grpc_error_text};

/// Wraps a message in a request that tells the driver our deadline
/// (`grpc-timeout` header), so it can stop working when we stop waiting.
pub(crate) fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// Runs one gRPC call with a deadline, enforced here as well as announced in
/// the request, so a driver that ignores it cannot stall a worker, and
/// records it in `csi_sidecar_operations_seconds`.
pub(crate) async fn with_deadline<T, F>(
    method: &'static str,
    timeout: Duration,
    call: F,
) -> Result<T, CsiError>
where
    F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    with_deadline_migrated(method, timeout, false, call).await
}

/// As [`with_deadline`], for a call that serves (`migrated`) or not an
/// in-tree volume migrated to CSI: upstream's `migrated` metric label.
/// A call that broke on our side of the wire (the driver's connection
/// closed mid-call, a refused connect) comes back from tonic as `Unknown`
/// with the local error as its source; grpc-go, and so upstream, reports
/// it as `Unavailable`. The difference matters: `Unknown` is final (the
/// driver surely did nothing), `Unavailable` is not, and a driver that
/// died after creating a volume but before answering must leave the
/// operation in flight, or its volume leaks (found by the chaos harness).
/// A status the driver sent has no source.
///
/// Two more statuses are tonic's own, made from an answer the driver did
/// send, with a code that would make the failure final although the volume
/// may exist (docs/driver-habits.md, gaps 1 and 2):
/// - an answer above the decoding limit comes back as `OutOfRange`
///   ("decoded message length too large"); grpc-go, and so upstream, says
///   `ResourceExhausted` for it, which is not final: the driver answered,
///   so it may have created the volume;
/// - an error whose message is not UTF-8 comes back as `Unknown`
///   ("Error deserializing status message header") and the driver's code is
///   lost; it becomes `Unavailable`, the side that keeps the request (and
///   so the volume) in hand until the driver answers readably.
fn local_failure_as_unavailable(status: tonic::Status) -> tonic::Status {
    const TOO_LARGE: &str = "Error, decoded message length too large";
    const UNREADABLE: &str = "Error deserializing status message header";
    match status.code() {
        tonic::Code::Unknown if is_local_failure(&status) => {
            tonic::Status::unavailable(status.message().to_owned())
        }
        tonic::Code::OutOfRange if status.message().starts_with(TOO_LARGE) => {
            tonic::Status::resource_exhausted(status.message().to_owned())
        }
        tonic::Code::Unknown if status.message().starts_with(UNREADABLE) => {
            tonic::Status::unavailable(format!(
                "the driver's error could not be read, its code is lost: {}",
                status.message()
            ))
        }
        _ => status,
    }
}

/// Whether a status was made on our side of the connection (refused,
/// broken: it carries the local error as its source) rather than sent by
/// the driver.
pub(crate) fn is_local_failure(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

pub(crate) async fn with_deadline_migrated<T, F>(
    method: &'static str,
    timeout: Duration,
    migrated: bool,
    call: F,
) -> Result<T, CsiError>
where
    F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let started = std::time::Instant::now();
    let result = match tokio::time::timeout(timeout, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        // A tonic server enforces the `grpc-timeout` we sent by answering
        // `Cancelled`; once our deadline has passed, that is our deadline.
        Ok(Err(status))
            if status.code() == tonic::Code::Cancelled && started.elapsed() >= timeout =>
        {
            Err(CsiError::deadline(method, timeout))
        }
        Ok(Err(status)) => {
            if is_local_failure(&status) {
                crate::metrics::set_driver_reachable(false);
            }
            Err(CsiError::new(method, local_failure_as_unavailable(status)))
        }
        Err(_) => Err(CsiError::deadline(method, timeout)),
    };
    if result.is_ok() {
        crate::metrics::set_driver_reachable(true);
    }
    // Every CSI call passes here: the one place to time them.
    let code = match &result {
        Ok(_) => tonic::Code::Ok,
        Err(e) => e.code(),
    };
    crate::metrics::observe_csi_call_migrated(method, code, started.elapsed(), migrated);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_broken_on_our_side_is_unavailable_not_final() {
        let broken = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "connection closed",
        )));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        let mapped = local_failure_as_unavailable(broken);
        assert_eq!(mapped.code(), tonic::Code::Unavailable);
        // What the driver answers is kept as it is, Unknown included.
        for code in [
            tonic::Code::Unknown,
            tonic::Code::Internal,
            tonic::Code::NotFound,
            tonic::Code::OutOfRange,
        ] {
            let sent = tonic::Status::new(code, "driver says no");
            assert_eq!(local_failure_as_unavailable(sent).code(), code);
        }
    }

    #[test]
    fn tonics_own_statuses_about_an_answer_keep_the_operation_in_flight() {
        use crate::csi::error::{ErrorClass, classify};
        // The texts of tonic's codec (decode.rs) and status header parser.
        let too_large = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 5242912 bytes, the limit is: 4194304 bytes",
        );
        let mapped = local_failure_as_unavailable(too_large);
        assert_eq!(mapped.code(), tonic::Code::ResourceExhausted);
        assert!(mapped.message().contains("found 5242912 bytes"));
        assert_eq!(classify(mapped.code()), ErrorClass::NonFinal);

        let unreadable = tonic::Status::unknown(
            "Error deserializing status message header: invalid utf-8 sequence of 1 bytes from index 3",
        );
        let mapped = local_failure_as_unavailable(unreadable);
        assert_eq!(mapped.code(), tonic::Code::Unavailable);
        assert!(mapped.message().contains("its code is lost"));
        assert_eq!(classify(mapped.code()), ErrorClass::NonFinal);
    }

    #[tokio::test]
    async fn the_broken_call_is_retried_as_in_flight() {
        let call = async {
            Err::<tonic::Response<()>, _>(tonic::Status::from_error(Box::new(
                std::io::Error::other("transport error"),
            )))
        };
        let error = with_deadline_migrated("CreateVolume", Duration::from_secs(1), false, call)
            .await
            .expect_err("fails");
        assert_eq!(error.code(), tonic::Code::Unavailable);
    }
}
