//! Start-up: reach the driver, learn what it is, refuse one that cannot
//! provision, and run until SIGTERM/SIGINT.

use std::future::Future;

use crate::cli::Options;
use crate::csi::connection::{ConnectError, connect_and_probe};
use crate::csi::{Driver, StartupError};

/// Why the process stops with a non-zero exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Startup(#[from] StartupError),
}

/// How the run ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// A termination signal arrived.
    Signal,
}

/// Connects to the driver and checks it can provision. Stops early, without
/// an error, when `shutdown` completes first (a pod deleted while its driver
/// never came up must still terminate promptly).
pub async fn connect_driver(
    options: &Options,
    shutdown: impl Future<Output = ()>,
) -> Result<Option<Driver>, RunError> {
    let socket = options.csi_socket();
    tracing::info!(address = %socket.display(), timeout = %crate::duration::format_go_duration(options.timeout), "connecting to the CSI driver");
    let connect = async {
        let channel = connect_and_probe(&socket, options.timeout).await?;
        let driver = Driver::discover(channel, options.timeout).await?;
        Ok::<_, RunError>(driver)
    };
    let driver = tokio::select! {
        driver = connect => driver?,
        () = shutdown => return Ok(None),
    };
    let info = driver.info();
    tracing::info!(
        driver = %info.name,
        version = %info.vendor_version,
        controller_service = info.plugin.controller_service,
        topology = info.plugin.volume_accessibility_constraints,
        controller_capabilities = ?info.controller.names(),
        "detected CSI driver {}",
        info.name
    );
    info.require_provisioning()?;
    Ok(Some(driver))
}

/// The whole run: start-up, then serve until `shutdown`.
pub async fn run(
    options: Options,
    shutdown: impl Future<Output = ()> + Clone,
) -> Result<Stopped, RunError> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        feature_gates = %options.gates().summary(),
        "csi-provisioner starting"
    );
    for flag in options.set_but_not_implemented() {
        tracing::warn!(flag = %format!("--{flag}"), "flag accepted but not supported yet by this version; it has no effect");
    }
    let Some(driver) = connect_driver(&options, shutdown.clone()).await? else {
        tracing::info!("termination signal received before the driver was ready, exiting");
        return Ok(Stopped::Signal);
    };
    tracing::info!(
        driver = %driver.name(),
        "driver can provision; the provisioning controller is not part of this build yet, waiting for a termination signal"
    );
    shutdown.await;
    tracing::info!("termination signal received, exiting");
    Ok(Stopped::Signal)
}

/// Completes on SIGTERM or SIGINT.
pub async fn termination_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot install signal handlers; only Ctrl-C will stop the process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
