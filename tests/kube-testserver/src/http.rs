//! Plain-HTTP listener on 127.0.0.1 and the generated kubeconfig.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::error::Error;
use crate::server::{HttpOptions, HttpServer, Inner, TestService};

/// The kubeconfig text for a server URL.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-testserver
  cluster:
    server: {url}
contexts:
- name: kube-testserver
  context:
    cluster: kube-testserver
    user: kube-testserver
    namespace: default
current-context: kube-testserver
users:
- name: kube-testserver
  user:
    token: kube-testserver-token
preferences: {{}}
"
    )
}

fn write_kubeconfig(path: &Path, url: &str) -> Result<(), Error> {
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    std::fs::write(path, kubeconfig_yaml(url))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn temp_dir_for(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!(
        "kube-testserver-{}-{}-{}",
        std::process::id(),
        port,
        uuid::Uuid::new_v4().simple()
    ))
}

pub(crate) async fn serve(inner: Arc<Inner>, opts: HttpOptions) -> Result<HttpServer, Error> {
    let listener = TcpListener::bind(("127.0.0.1", opts.port))
        .await
        .map_err(|e| Error::io(format!("binding 127.0.0.1:{}", opts.port), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the bound address", e))?;
    inner.set_server_address(&addr.to_string());
    let url = format!("http://{addr}");
    let (kubeconfig, owned_dir) = match opts.kubeconfig_path {
        Some(p) => (p, None),
        None => {
            let dir = temp_dir_for(addr.port());
            (dir.join("kubeconfig"), Some(dir))
        }
    };
    write_kubeconfig(&kubeconfig, &url)?;
    let (shutdown, rx) = tokio::sync::watch::channel(false);
    let service = TestService::for_listener(inner, addr.port());
    tokio::spawn(accept_loop(listener, service, rx));
    Ok(HttpServer {
        addr,
        kubeconfig,
        owned_dir,
        shutdown,
    })
}

async fn accept_loop(
    listener: TcpListener,
    service: TestService,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let svc = service.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let hyper_svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let mut svc = svc.clone();
                async move { tower::Service::call(&mut svc, req).await }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), hyper_svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.changed() => {}
            }
        });
    }
}
