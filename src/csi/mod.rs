//! Talking to the CSI driver over its unix socket.
//!
//! - [`connection`]: wait for the socket and for `Probe` to say ready.
//! - [`driver`]: the [`Driver`] facade — what the driver is and can do, and
//!   the controller calls with the `--timeout` deadline.
//! - [`error`]: [`CsiError`] and its final / non-final class (DESIGN §3).

pub mod connection;
pub mod driver;
pub mod error;

use std::future::Future;
use std::time::Duration;

pub use driver::{Driver, DriverInfo, StartupError};
pub use error::{CsiError, ErrorClass};

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
        Ok(Err(status)) => Err(CsiError::new(method, status)),
        Err(_) => Err(CsiError::deadline(method, timeout)),
    };
    // Every CSI call passes here: the one place to time them.
    let code = match &result {
        Ok(_) => tonic::Code::Ok,
        Err(e) => e.code(),
    };
    crate::metrics::observe_csi_call_migrated(method, code, started.elapsed(), migrated);
    result
}
