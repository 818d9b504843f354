use std::process::ExitCode;

use csi_provisioner::cli::{CliError, Options};
use csi_provisioner::startup;
use futures_util::FutureExt;

fn main() -> ExitCode {
    let options = match Options::parse_from_args(std::env::args_os()) {
        Ok(options) => options,
        // Help and --help exit 0, parse errors 2, as clap prints them.
        Err(CliError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("csi-provisioner: {e}");
            return ExitCode::from(2);
        }
    };
    if options.version {
        let argv0 = std::env::args_os().next().unwrap_or_default();
        println!(
            "{}",
            csi_provisioner::cli::version_line(
                &argv0.to_string_lossy(),
                csi_provisioner::cli::VERSION
            )
        );
        return ExitCode::SUCCESS;
    }
    csi_provisioner::logging::init(&options.log_settings());

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("csi-provisioner: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Before anything else: a SIGTERM from here on is a clean shutdown.
    let shutdown = {
        let _context = runtime.enter();
        startup::termination_signal().shared()
    };
    let result = runtime.block_on(startup::run(options, shutdown));
    // Tasks still running (watches, a worker past the grace period) are
    // abandoned; their state is in the API server and the journal.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
