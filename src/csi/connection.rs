//! Reaching the driver: wait for its socket, then for `Probe` to say ready.
//!
//! The sidecar usually starts before the driver in the same pod, so a
//! missing socket or a refused connection is a wait state, not an error. We
//! log what we wait for about every ten seconds so a stuck pod explains
//! itself, and give up only on answers that waiting cannot fix.

use std::path::Path;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use csi_proto::v1::ProbeRequest;
use csi_proto::v1::identity_client::IdentityClient;
use tonic::transport::Channel;

use super::error::CsiError;

/// How often a still-waiting connection says so.
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `Probe` failed with a code that waiting will not fix.
    #[error(
        "CSI driver probe failed: {source}; the driver at {address} (--csi-address) answered with a code that waiting does not fix: read the driver container's log (this container exits and is restarted)"
    )]
    Probe { address: String, source: CsiError },
}

/// What the connection is waiting for, for the periodic log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    Socket(String),
    Ready(String),
}

/// Connects to the driver at `socket` and waits until `Probe` reports ready.
/// Each `Probe` has `timeout` as deadline. Returns a channel that re-dials by
/// itself if the driver restarts later.
pub async fn connect_and_probe(socket: &Path, timeout: Duration) -> Result<Channel, ConnectError> {
    let channel = wait_for_socket(socket).await;
    wait_for_ready(socket, channel, timeout).await
}

fn retry_delays() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
        .build()
}

fn log_waiting(socket: &Path, what: &Waiting, since: Instant) {
    let waited =
        crate::duration::format_go_duration(Duration::from_secs(since.elapsed().as_secs()));
    match what {
        Waiting::Socket(reason) => tracing::warn!(
            address = %socket.display(),
            %waited,
            "{}",
            socket_waiting_message(socket, reason)
        ),
        Waiting::Ready(reason) => tracing::warn!(
            address = %socket.display(),
            %waited,
            "CSI driver is not ready yet: {reason}"
        ),
    }
}

async fn wait_for_socket(socket: &Path) -> Channel {
    let started = Instant::now();
    let mut last_log: Option<Instant> = None;
    let mut delays = retry_delays();
    loop {
        match csi_proto::transport::connect_unix(socket).await {
            Ok(channel) => {
                tracing::info!(address = %socket.display(), "connected to the CSI driver socket");
                return channel;
            }
            Err(e) => {
                let reason = socket_problem(socket, &e);
                if last_log.is_none_or(|t| t.elapsed() >= WAIT_LOG_INTERVAL) {
                    log_waiting(socket, &Waiting::Socket(reason), started);
                    last_log = Some(Instant::now());
                }
            }
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(2));
        tokio::time::sleep(delay).await;
    }
}

/// What the periodic line says while the socket cannot be reached: the
/// flag and the path, what is wrong, and what would be right.
pub fn socket_waiting_message(socket: &Path, reason: &str) -> String {
    let path = socket.display();
    let right = if reason == SOCKET_MISSING {
        "the driver container must create it: mount one volume (e.g. an emptyDir) \
         at the socket's directory in both containers and point the driver's \
         endpoint at the same file"
    } else if reason.contains("ermission denied") {
        "this container's user must be allowed to connect to it (runAsUser/fsGroup \
         of the pod, or the mode the driver gives the socket)"
    } else {
        "the driver must be listening on it: check the driver container is running \
         and its logs"
    };
    format!("still connecting to the CSI driver: {reason} at {path} (--csi-address); {right}")
}

/// The reason given while the socket file is not there.
const SOCKET_MISSING: &str = "socket does not exist yet";

fn socket_problem(socket: &Path, err: &tonic::transport::Error) -> String {
    if !socket.exists() {
        return SOCKET_MISSING.to_owned();
    }
    let mut source: Option<&dyn std::error::Error> = Some(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.to_string();
        }
        source = e.source();
    }
    err.to_string()
}

async fn wait_for_ready(
    socket: &Path,
    channel: Channel,
    timeout: Duration,
) -> Result<Channel, ConnectError> {
    let started = Instant::now();
    let mut last_log: Option<Instant> = None;
    let mut delays = retry_delays();
    let mut client = IdentityClient::new(channel.clone());
    loop {
        let waiting = match probe_once(&mut client, timeout).await {
            Ok(true) => {
                tracing::info!(address = %socket.display(), "CSI driver is ready");
                return Ok(channel);
            }
            Ok(false) => Waiting::Ready("Probe answered ready=false".to_owned()),
            Err(e) if probe_error_is_transient(&e) => Waiting::Ready(e.to_string()),
            Err(e) => {
                return Err(ConnectError::Probe {
                    address: socket.display().to_string(),
                    source: e,
                });
            }
        };
        if last_log.is_none_or(|t| t.elapsed() >= WAIT_LOG_INTERVAL) {
            log_waiting(socket, &waiting, started);
            last_log = Some(Instant::now());
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(2));
        tokio::time::sleep(delay).await;
    }
}

/// Codes that mean "not yet": the driver is starting, restarting, or slow.
/// Anything else (e.g. `Unimplemented`, `Internal`) is the driver's final
/// word, and the upstream sidecar exits on it too.
pub fn probe_error_is_transient(err: &CsiError) -> bool {
    matches!(
        err.code(),
        tonic::Code::DeadlineExceeded | tonic::Code::Unavailable | tonic::Code::Cancelled
    )
}

/// How often [`watch_reachability`] asks.
pub const REACHABILITY_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps `csi_provisioner_driver_reachable` true to the driver while no
/// other call would tell: a `Probe` every [`REACHABILITY_INTERVAL`], not
/// counted in `csi_sidecar_operations_seconds` (the Go image has no such
/// probe). Runs until the process ends.
pub fn watch_reachability(mut client: IdentityClient<Channel>, timeout: Duration) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(REACHABILITY_INTERVAL).await;
            let answered = tokio::time::timeout(
                timeout,
                client.probe(super::request(ProbeRequest {}, timeout)),
            )
            .await;
            match answered {
                Ok(Ok(_)) => crate::metrics::set_driver_reachable(true),
                Ok(Err(status)) => {
                    crate::metrics::set_driver_reachable(!super::is_local_failure(&status))
                }
                // Slow is not gone.
                Err(_) => {}
            }
        }
    });
}

/// One `Probe`. A response without `ready` means ready (CSI spec: the field
/// is optional and its absence means the plugin is ready).
pub async fn probe_once(
    client: &mut IdentityClient<Channel>,
    timeout: Duration,
) -> Result<bool, CsiError> {
    let answer = super::with_deadline(
        "Probe",
        timeout,
        client.probe(super::request(ProbeRequest {}, timeout)),
    )
    .await?;
    Ok(answer.ready.unwrap_or(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_wait_names_the_flag_the_path_and_what_is_right() {
        let socket = Path::new("/csi/csi.sock");
        assert_eq!(
            socket_waiting_message(socket, SOCKET_MISSING),
            "still connecting to the CSI driver: socket does not exist yet at /csi/csi.sock \
             (--csi-address); the driver container must create it: mount one volume (e.g. an \
             emptyDir) at the socket's directory in both containers and point the driver's \
             endpoint at the same file"
        );
        let refused = socket_waiting_message(socket, "Connection refused (os error 111)");
        assert!(
            refused.starts_with(
                "still connecting to the CSI driver: Connection refused (os error 111) at /csi/csi.sock (--csi-address); "
            ),
            "{refused}"
        );
        assert!(refused.ends_with(
            "the driver must be listening on it: check the driver container is running and its logs"
        ));
        assert!(
            socket_waiting_message(socket, "Permission denied (os error 13)")
                .contains("this container's user must be allowed to connect to it")
        );
    }
}
