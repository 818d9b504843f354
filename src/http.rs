//! The diagnostics endpoint (`--http-endpoint`, or the deprecated
//! `--metrics-address` for metrics only): Prometheus metrics at
//! `--metrics-path`, `/healthz/leader-election` (as csi-lib-utils), and
//! `/healthz` / `/readyz`, which pass when the driver answers `Probe`
//! (`/readyz` also only once the watch caches are filled), and with
//! `--enable-pprof` Go's CPU and heap profiles under `/debug/pprof/`
//! (`src/pprof.rs`).
//!
//! Plain hyper rather than axum: a few fixed routes need no router, and
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
    /// `--enable-pprof`: CPU and heap profiles under `/debug/pprof/`
    /// (`src/pprof.rs`); 404 there without it.
    pub pprof: bool,
}

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
        let mut response = text(StatusCode::OK, crate::metrics::scrape(exposition));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(exposition.content_type()),
        );
        return response;
    }
    if routes.pprof && (path == "/debug/pprof" || path.starts_with("/debug/pprof/")) {
        let reply = crate::pprof::serve(path, req.uri().query()).await;
        let mut response = Response::new(Full::new(reply.body));
        *response.status_mut() = reply.status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(reply.content_type),
        );
        if let Some(disposition) = reply.attachment {
            headers.insert(
                http::header::CONTENT_DISPOSITION,
                http::HeaderValue::from_static(disposition),
            );
        }
        return response;
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
        let (status, body) = get(addr, "/debug/pprof/").await;
        assert_eq!(status, 200);
        assert!(body.contains("href='profile'"), "{body}");
        let (status, body) = get(addr, "/debug/pprof/profile?seconds=soon").await;
        assert_eq!(status, 400);
        assert!(body.contains("invalid seconds \"soon\""), "{body}");
        assert_eq!(get(addr, "/debug/pprof/goroutine").await.0, 404);

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

    /// The status, the headers (lower-cased) and the body of a GET.
    async fn get_bytes(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .expect("write");
        let mut out = Vec::new();
        stream.read_to_end(&mut out).await.expect("read");
        let end = out
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("end of headers");
        let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, head, out[end + 4..].to_vec())
    }

    /// A profile as served: gzip-compressed profile.proto.
    fn decode_profile(body: &[u8]) -> ::pprof::protos::Profile {
        use ::pprof::protos::Message as _;
        use std::io::Read as _;
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut raw)
            .expect("gzip");
        ::pprof::protos::Profile::decode(raw.as_slice()).expect("profile.proto")
    }

    fn sample_types(profile: &::pprof::protos::Profile) -> Vec<(String, String)> {
        let name = |i: i64| {
            usize::try_from(i)
                .ok()
                .and_then(|i| profile.string_table.get(i))
                .cloned()
                .unwrap_or_default()
        };
        profile
            .sample_type
            .iter()
            .map(|t| (name(t.ty), name(t.unit)))
            .collect()
    }

    /// `go` from `GO_BIN` or the PATH, if any.
    fn go_binary() -> Option<std::path::PathBuf> {
        let go = std::env::var_os("GO_BIN").unwrap_or_else(|| "go".into());
        let works = std::process::Command::new(&go)
            .arg("version")
            .output()
            .is_ok_and(|out| out.status.success());
        works.then(|| go.into())
    }

    /// With `--enable-pprof` the CPU and heap profiles are what
    /// `go tool pprof` reads: gzip-compressed profile.proto with Go's
    /// sample types, samples in them; a second CPU profile while one runs is
    /// refused as Go refuses it. When `go` is at hand (PATH or `GO_BIN`),
    /// `go tool pprof -raw` must read both too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pprof_serves_profiles_go_reads() {
        crate::pprof::start_heap_sampling().expect("jemalloc heap profiling");
        // Live while the heap profile is taken: each block is twice the
        // mean sampling interval, so most are sampled.
        let held: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; 1 << 20]).collect();
        let probe: ProbeFn = Arc::new(|| Box::pin(async { Ok(()) }));
        let addr = serve(
            "--http-endpoint",
            "127.0.0.1:0",
            Routes {
                metrics_path: "/metrics".into(),
                health: Some((Health::disabled(), probe)),
                ready: None,
                pprof: true,
            },
        )
        .await
        .expect("serve");

        let cpu = tokio::spawn(get_bytes(addr, "/debug/pprof/profile?seconds=3"));
        // Asked again once the first runs (for 3 s from then).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !crate::pprof::cpu_profile_running() {
            assert!(
                std::time::Instant::now() < deadline,
                "the first CPU profile never started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (status, _, body) = get_bytes(addr, "/debug/pprof/profile?seconds=1").await;
        assert_eq!(status, 500, "{}", String::from_utf8_lossy(&body));
        assert!(
            String::from_utf8_lossy(&body).contains("cpu profiling already in use"),
            "{}",
            String::from_utf8_lossy(&body)
        );
        // Something to sample.
        tokio::task::spawn_blocking(|| {
            let start = std::time::Instant::now();
            let mut x = 0u64;
            while start.elapsed() < Duration::from_millis(700) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        })
        .await
        .expect("busy loop");
        let (status, head, cpu_body) = cpu.await.expect("cpu request");
        assert_eq!(status, 200, "{head}");
        assert!(
            head.contains("content-type: application/octet-stream"),
            "{head}"
        );
        let profile = decode_profile(&cpu_body);
        assert_eq!(
            sample_types(&profile),
            [
                ("samples".into(), "count".into()),
                ("cpu".into(), "nanoseconds".into())
            ]
        );
        assert!(!profile.sample.is_empty(), "no CPU samples");
        assert!(!profile.function.is_empty(), "not symbolized");
        assert_eq!(profile.period, 10_000_000, "100 Hz, as Go");

        let (status, head, heap_body) = get_bytes(addr, "/debug/pprof/heap").await;
        assert_eq!(
            status,
            200,
            "{head}: {}",
            String::from_utf8_lossy(&heap_body)
        );
        let profile = decode_profile(&heap_body);
        assert_eq!(
            sample_types(&profile),
            [("inuse_space".into(), "bytes".into())]
        );
        assert!(!profile.location.is_empty(), "no locations");
        assert!(!profile.function.is_empty(), "not symbolized");
        let in_use: i64 = profile.sample.iter().filter_map(|s| s.value.first()).sum();
        assert!(
            in_use >= 16 << 20,
            "32 MiB held, {in_use} bytes in the profile"
        );
        std::hint::black_box(&held);

        let Some(go) = go_binary() else {
            eprintln!("skipped: no `go` on PATH or in GO_BIN, `go tool pprof` not tried");
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, body) in [("cpu.pb.gz", &cpu_body), ("heap.pb.gz", &heap_body)] {
            let file = dir.path().join(name);
            std::fs::write(&file, body).expect("write profile");
            let out = std::process::Command::new(&go)
                .args(["tool", "pprof", "-raw"])
                .arg(&file)
                .output()
                .expect("go tool pprof");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("Samples:"),
                "go tool pprof -raw {name}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
