//! `kube-testserver`: serves the in-memory Kubernetes API over HTTP until
//! SIGTERM or SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Parser};
use kube_testserver::{HttpOptions, TestServer};

/// In-memory Kubernetes API server for tests.
#[derive(Debug, Parser)]
#[command(name = "kube-testserver", version)]
struct Args {
    /// Port on 127.0.0.1 (0 picks a free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write the kubeconfig (default: a temporary directory).
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Turn on the controller-manager helpers (PVC binding, Released PVs,
    /// storage-provisioner annotation).
    #[arg(long)]
    controller_manager: bool,
    /// Garbage collector on or off.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    gc: bool,
    /// YAML or JSON file of objects to create at start (repeatable).
    #[arg(long)]
    load: Vec<PathBuf>,
}

async fn run(args: Args) -> Result<(), kube_testserver::Error> {
    let server = TestServer::builder()
        .gc(args.gc)
        .controller_manager(args.controller_manager)
        .build();
    for file in &args.load {
        let objs = server.load_file(file)?;
        eprintln!("loaded {} objects from {}", objs.len(), file.display());
    }
    let http = server
        .serve_http_with(HttpOptions {
            port: args.port,
            kubeconfig_path: args.kubeconfig_out.clone(),
        })
        .await?;
    println!("listening on {}", http.url());
    println!("kubeconfig {}", http.kubeconfig_path().display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| kube_testserver::Error::Io {
            context: "installing the SIGTERM handler".into(),
            source: e,
        })?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(http);
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kube-testserver: {e}");
            ExitCode::FAILURE
        }
    }
}
