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
/// the request, so a driver that ignores it cannot stall a worker.
pub(crate) async fn with_deadline<T, F>(
    method: &'static str,
    timeout: Duration,
    call: F,
) -> Result<T, CsiError>
where
    F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(CsiError::new(method, status)),
        Err(_) => Err(CsiError::deadline(method, timeout)),
    }
}
