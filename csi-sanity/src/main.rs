//! `csi-sanity`: runs the conformance checks against a CSI driver socket.

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("csi-sanity: cannot start the async runtime: {e}");
            std::process::exit(csi_sanity::cli::EXIT_USAGE);
        }
    };
    let code = runtime.block_on(async {
        let mut out = std::io::stdout();
        let mut err = std::io::stderr();
        // Ctrl-C stops the run after cleaning up what the suite created.
        let interrupt = async {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        csi_sanity::cli::run_cli_until(std::env::args(), &mut out, &mut err, interrupt).await
    });
    std::process::exit(code);
}
