//! `csi-hostpath`: the hostpath CSI driver as a process. SIGTERM or SIGINT
//! stops it cleanly (socket removed, exit 0).

use clap::Parser;
use csi_hostpath::cli::{Cli, normalize_args};
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse_from(normalize_args(std::env::args())) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if cli.version {
        println!("csi-hostpath {}", env!("CARGO_PKG_VERSION"));
        return std::process::ExitCode::SUCCESS;
    }
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(cli.log_filter()));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let config = match cli.into_config() {
        Ok(config) => config,
        Err(e) => {
            tracing::error!(error = %e, "invalid configuration");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = shutdown_signal()?;
        csi_hostpath::serve(config, shutdown).await
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "driver failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Completes on the first SIGTERM or SIGINT.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, csi_hostpath::Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| csi_hostpath::Error::Io {
        context: "installing the SIGTERM handler".to_owned(),
        source: e,
    })?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| csi_hostpath::Error::Io {
        context: "installing the SIGINT handler".to_owned(),
        source: e,
    })?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}
