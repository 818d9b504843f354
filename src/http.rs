//! The diagnostics endpoint (`--http-endpoint`, or the deprecated
//! `--metrics-address` for metrics only): Prometheus metrics at
//! `--metrics-path`, `/healthz/leader-election` (as csi-lib-utils), and
//! `/healthz` / `/readyz`, which pass when the driver answers `Probe`
//! (`/readyz` also only once the watch caches are filled).
//!
//! Plain hyper rather than axum: four fixed routes need no router, and
//! hyper's server is already compiled for the test server.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::leader::Health;

/// How long `/healthz` waits for the driver's `Probe`: a kubelet probe
/// usually gives up after one second.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("invalid address {address:?} for {flag}: {reason}")]
    Address {
        flag: &'static str,
        address: String,
        reason: String,
    },
    #[error("cannot listen on {address} ({flag}): {source}")]
    Bind {
        flag: &'static str,
        address: String,
        source: std::io::Error,
    },
}

/// Asks the driver whether it is ready.
pub type ProbeFn =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Says what the process still waits for before it can work (`Ok` when
/// nothing): `/readyz` fails while it does.
pub type ReadyFn = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What the endpoint serves.
#[derive(Clone)]
pub struct Routes {
    pub metrics_path: String,
    /// `None` for `--metrics-address`: metrics only, as upstream.
    pub health: Option<(Health, ProbeFn)>,
    /// `/readyz` also requires this (the watch caches filled); `/healthz`
    /// does not, so a pod that cannot list (RBAC) is reported not ready
    /// instead of being restarted in a loop.
    pub ready: Option<ReadyFn>,
    /// `--enable-pprof`: `/debug/pprof/` explains that there is no Go
    /// profiler instead of a bare 404, so whoever follows a Go runbook
    /// learns what to do instead.
    pub pprof: bool,
}

/// What `/debug/pprof/…` answers with `--enable-pprof`.
pub const PPROF_NOTE: &str = "pprof is not available: this csi-provisioner is a Rust build and \
has no Go runtime to profile. Profile the process from outside instead (for example \
`perf record -g -p <pid>` on the node, or `perf top`), and see /metrics for process_* \
figures (CPU, memory, file descriptors).\n";

/// A Go listen address: `:8080` means every interface.
pub fn listen_address(address: &str) -> String {
    if address.starts_with(':') {
        format!("0.0.0.0{address}")
    } else {
        address.to_owned()
    }
}

/// Binds the listener (so a taken port is a start-up error) and serves in
/// the background until the process ends.
pub async fn serve(
    flag: &'static str,
    address: &str,
    routes: Routes,
) -> Result<SocketAddr, HttpError> {
    if !routes.metrics_path.starts_with('/') {
        return Err(HttpError::Address {
            flag: "--metrics-path",
            address: routes.metrics_path.clone(),
            reason: "must start with /".into(),
        });
    }
    let listener = TcpListener::bind(listen_address(address))
        .await
        .map_err(|source| HttpError::Bind {
            flag,
            address: address.to_owned(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| HttpError::Bind {
        flag,
        address: address.to_owned(),
        source,
    })?;
    tracing::info!(address = %local, metrics_path = %routes.metrics_path, "serving metrics and health checks");
    let routes = Arc::new(routes);
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let routes = Arc::clone(&routes);
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let routes = Arc::clone(&routes);
                    async move { Ok::<_, Infallible>(handle(&routes, req).await) }
                });
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
            });
        }
    });
    Ok(local)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn handle(routes: &Routes, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        );
    }
    let path = req.uri().path();
    if path == routes.metrics_path {
        // Prometheus' text format unless OpenMetrics is asked for, as
        // upstream's client_golang handler.
        let exposition = crate::metrics::negotiate(
            req.headers()
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok()),
        );
        let mut response = text(StatusCode::OK, crate::metrics::encode_as(exposition));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(exposition.content_type()),
        );
        return response;
    }
    if routes.pprof && (path == "/debug/pprof" || path.starts_with("/debug/pprof/")) {
        return text(StatusCode::NOT_IMPLEMENTED, PPROF_NOTE.to_owned());
    }
    let Some((health, probe)) = &routes.health else {
        return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
    };
    match path {
        "/healthz/leader-election" => match health.check() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        },
        "/readyz" if let Some(Err(waiting)) = routes.ready.as_ref().map(|ready| ready()) => {
            text(StatusCode::INTERNAL_SERVER_ERROR, format!("{waiting}\n"))
        }
        "/healthz" | "/readyz" => match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
            Ok(Ok(())) => text(StatusCode::OK, "ok\n".into()),
            Ok(Err(e)) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("CSI driver not ready: {e}\n"),
            ),
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("CSI driver did not answer Probe within {PROBE_TIMEOUT:?}\n"),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_addresses() {
        assert_eq!(listen_address(":8080"), "0.0.0.0:8080");
        assert_eq!(listen_address("127.0.0.1:9"), "127.0.0.1:9");
        assert_eq!(listen_address("[::1]:9"), "[::1]:9");
    }

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        get_with(addr, path, "").await
    }

    async fn get_with(addr: SocketAddr, path: &str, headers: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .expect("write");
        let mut out = String::new();
        stream.read_to_string(&mut out).await.expect("read");
        let status = out
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, out)
    }

    #[tokio::test]
    async fn routes_answer() {
        let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let caches_ready: ReadyFn = {
            let synced = Arc::clone(&synced);
            Arc::new(move || {
                if synced.load(std::sync::atomic::Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("waiting for the watch cache of persistentvolumeclaims: forbidden".into())
                }
            })
        };
        let ready = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let probe: ProbeFn = {
            let ready = Arc::clone(&ready);
            Arc::new(move || {
                let ok = ready.load(std::sync::atomic::Ordering::SeqCst);
                Box::pin(async move { if ok { Ok(()) } else { Err("not ready".into()) } })
            })
        };
        let addr = serve(
            "--http-endpoint",
            "127.0.0.1:0",
            Routes {
                metrics_path: "/m".into(),
                health: Some((Health::disabled(), probe)),
                ready: Some(caches_ready),
                pprof: true,
            },
        )
        .await
        .expect("serve");
        crate::metrics::set_queue_depth("http-test", 1);
        let (status, body) = get(addr, "/m").await;
        assert_eq!(status, 200);
        assert!(
            body.contains("workqueue_depth{name=\"http-test\"} 1"),
            "{body}"
        );
        assert!(
            body.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{body}"
        );
        assert!(!body.contains("# EOF"), "{body}");
        let (_, body) = get_with(
            addr,
            "/m",
            "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
        )
        .await;
        assert!(
            body.to_ascii_lowercase()
                .contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{body}"
        );
        assert!(body.contains("# EOF"), "{body}");
        assert_eq!(get(addr, "/healthz/leader-election").await.0, 200);
        assert_eq!(get(addr, "/healthz").await.0, 200);
        // Not ready while a cache waits (liveness is not affected).
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 500);
        assert!(body.contains("persistentvolumeclaims: forbidden"), "{body}");
        synced.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        ready.store(false, std::sync::atomic::Ordering::SeqCst);
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 500);
        assert!(body.contains("not ready"), "{body}");
        assert_eq!(get(addr, "/metrics").await.0, 404);
        let (status, body) = get(addr, "/debug/pprof/profile?seconds=30").await;
        assert_eq!(status, 501);
        assert!(body.contains("no Go runtime"), "{body}");

        // Metrics only (--metrics-address): no health routes.
        let addr = serve(
            "--metrics-address",
            "127.0.0.1:0",
            Routes {
                metrics_path: "/metrics".into(),
                health: None,
                ready: None,
                pprof: false,
            },
        )
        .await
        .expect("serve");
        assert_eq!(get(addr, "/metrics").await.0, 200);
        assert_eq!(get(addr, "/healthz").await.0, 404);
        assert_eq!(get(addr, "/debug/pprof/").await.0, 404);
        let taken = serve(
            "--http-endpoint",
            &addr.to_string(),
            Routes {
                metrics_path: "/metrics".into(),
                health: None,
                ready: None,
                pprof: false,
            },
        )
        .await
        .expect_err("port taken");
        assert!(taken.to_string().contains("--http-endpoint"), "{taken}");
    }
}
