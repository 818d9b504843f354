//! A watch-delaying proxy in front of the real kube-apiserver: the fault of
//! a watch cache that lags behind another's.
//!
//! A client keeps one watch per resource kind, and watches of different
//! kinds are not ordered with each other: an event of one kind can reach a
//! client before the event of another kind that happened earlier. On a
//! loopback API server that window is a few milliseconds and a race in it
//! shows once in a thousand CI runs; [`LagProxy`] widens it at will.
//!
//! It is a plain HTTP/1.1 server on `127.0.0.1` (a random port) that
//! forwards every request to the API server as one user (a client
//! certificate of [`ControlPlane::kubeconfig_for`], so RBAC and the audit
//! log see exactly that user), with a kubeconfig of its own
//! ([`LagProxy::kubeconfig`]: `http://127.0.0.1:PORT`, no credentials; kube
//! clients, ours and client-go, accept a plain `http://` server). Requests
//! pass at once and responses stream back as they come (nothing is
//! buffered whole: watches never end), but for the watches
//! (`?watch=true`, `?watch=1`, or the old `/watch/` path prefix) of the
//! resources set lagged with [`LagProxy::set_watch_lag`]: each of their
//! newline-delimited events is delivered at its arrival time plus the lag,
//! in order. The lag is read when each event arrives, so setting or
//! clearing it also acts on the watches already open.
//!
//! Not forwarded: protocol upgrades (`exec`, `attach`, `port-forward`).
//! The proxy stops when dropped.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use crate::{ControlPlane, Error};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Headers of one hop, never forwarded (RFC 9110 §7.6.1), and `Host`
/// (the upstream client sets its own).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// The lags and counters, by resource (plural name).
#[derive(Default)]
struct Lags {
    lag: Mutex<HashMap<String, Duration>>,
    held: Mutex<HashMap<String, u64>>,
    /// `"<verb> <resource>"` (the audit log's verbs) → what passed.
    traffic: Mutex<BTreeMap<String, Traffic>>,
}

/// The requests of one kind that passed the proxy, and the bytes of their
/// answers' bodies as the client received them (a watch's: every event
/// and bookmark so far).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub requests: u64,
    pub response_bytes: u64,
}

impl Lags {
    fn lag(&self, resource: &str) -> Duration {
        lock(&self.lag)
            .get(resource)
            .copied()
            .unwrap_or(Duration::ZERO)
    }

    fn count_held(&self, resource: &str) {
        *lock(&self.held).entry(resource.to_owned()).or_insert(0) += 1;
    }

    fn count_request(&self, kind: &str) {
        lock(&self.traffic)
            .entry(kind.to_owned())
            .or_default()
            .requests += 1;
    }

    fn count_bytes(&self, kind: &str, bytes: usize) {
        lock(&self.traffic)
            .entry(kind.to_owned())
            .or_default()
            .response_bytes += bytes as u64;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running proxy; stops when dropped.
pub struct LagProxy {
    port: u16,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    lags: Arc<Lags>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LagProxy {
    /// A proxy in front of `plane`'s API server that forwards as `user`
    /// (in `group` when given). Call from anywhere (it runs on a thread and
    /// runtime of its own); returns once it listens.
    pub fn start(plane: &ControlPlane, user: &str, group: Option<&str>) -> Result<LagProxy, Error> {
        let upstream = plane.kubeconfig_for(user, group)?;
        LagProxy::in_front_of(&upstream)
    }

    /// A proxy that forwards with the server and credentials of the
    /// kubeconfig `upstream`.
    pub fn in_front_of(upstream: &Path) -> Result<LagProxy, Error> {
        let dir = tempfile::Builder::new().prefix("lag-proxy-").tempdir()?;
        let lags = Arc::new(Lags::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<u16, Error>>();
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let upstream = upstream.to_owned();
        let thread_lags = lags.clone();
        let thread = std::thread::Builder::new()
            .name("lag-proxy".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let started = async {
                        let client = crate::client_from(&upstream).await?;
                        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
                        let port = listener.local_addr()?.port();
                        Ok::<_, Error>((client, listener, port))
                    }
                    .await;
                    let (client, listener, port) = match started {
                        Ok(started) => started,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(port));
                    tokio::select! {
                        _ = accept_loop(listener, client, thread_lags) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime ends every connection it serves.
            })?;
        let port = ready_rx.recv().map_err(|_| {
            Error::Client("the lag proxy's thread ended before it listened".into())
        })??;
        let kubeconfig = dir.path().join("lag-proxy.kubeconfig");
        write_plain_kubeconfig(&kubeconfig, &format!("http://127.0.0.1:{port}"))?;
        Ok(LagProxy {
            port,
            kubeconfig,
            _dir: dir,
            lags,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// A kubeconfig for `http://127.0.0.1:PORT`, without credentials: the
    /// proxy authenticates upstream.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// From now on every event of the watches of `resource` (plural name:
    /// `volumeattachments`, `persistentvolumes`, ...; any group, cluster
    /// scoped or in any namespace), open or to come, reaches the client
    /// `lag` after it reached the proxy.
    pub fn set_watch_lag(&self, resource: &str, lag: Duration) {
        lock(&self.lags.lag).insert(resource.to_owned(), lag);
    }

    /// Events of `resource` that arrive from now on pass at once (behind
    /// the ones still held, order is kept).
    pub fn clear_watch_lag(&self, resource: &str) {
        lock(&self.lags.lag).remove(resource);
    }

    /// How many watch events of `resource` the proxy delayed so far
    /// (bookmarks not counted): the evidence that the fault struck.
    pub fn held(&self, resource: &str) -> u64 {
        lock(&self.lags.held).get(resource).copied().unwrap_or(0)
    }

    /// What passed so far, by `"<verb> <resource>"` as the audit log names
    /// them (`"list volumeattachments"`, `"watch persistentvolumes"`, `"get
    /// persistentvolumes"`); requests outside the resource API under
    /// `"<verb> -"`. A body still streaming counts what passed.
    pub fn traffic(&self) -> BTreeMap<String, Traffic> {
        lock(&self.lags.traffic).clone()
    }
}

impl Drop for LagProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for LagProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagProxy")
            .field("url", &self.url())
            .field("lags", &*lock(&self.lags.lag))
            .field("held", &*lock(&self.lags.held))
            .finish()
    }
}

fn write_plain_kubeconfig(path: &Path, server: &str) -> Result<(), Error> {
    let text = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lag-proxy", "cluster": {"server": server}}],
        "users": [{"name": "lag-proxy", "user": {}}],
        "contexts": [{"name": "lag-proxy", "context": {"cluster": "lag-proxy", "user": "lag-proxy"}}],
        "current-context": "lag-proxy",
    });
    std::fs::write(
        path,
        serde_yaml_ng::to_string(&text).map_err(|e| Error::Client(e.to_string()))?,
    )?;
    Ok(())
}

async fn accept_loop(listener: tokio::net::TcpListener, client: kube::Client, lags: Arc<Lags>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let client = client.clone();
        let lags = lags.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                forward(client.clone(), lags.clone(), request)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The watch of a request: its resource (plural), when the request is a
/// watch (`watch=true`/`watch=1`, or a path under the old `/watch/`).
pub fn watched_resource(path: &str, query: Option<&str>) -> Option<String> {
    request_kind("GET", path, query)
        .filter(|(verb, _)| *verb == "watch")
        .map(|(_, resource)| resource)
}

/// A request's verb as the audit log names it (`get`, `list`, `watch`,
/// `create`, `update`, `patch`, `delete`, `deletecollection`) and its
/// resource (plural, with `/subresource`); `None` outside the resource
/// API (`/version`, `/apis/GROUP/VERSION`).
pub fn request_kind(
    method: &str,
    path: &str,
    query: Option<&str>,
) -> Option<(&'static str, String)> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut rest: &[&str] = match segments.first() {
        Some(&"api") if segments.len() >= 2 => &segments[2..],
        Some(&"apis") if segments.len() >= 3 => &segments[3..],
        _ => return None,
    };
    let mut watch = query.is_some_and(|q| {
        q.split('&').any(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            key == "watch" && matches!(value, "1" | "t" | "T" | "true" | "True" | "TRUE")
        })
    });
    if rest.first() == Some(&"watch") {
        watch = true;
        rest = &rest[1..];
    }
    // namespaces/NS/RESOURCE[/NAME[/SUB]]; not namespaces/NS/status.
    let (resource, name, sub) = match rest {
        ["namespaces", _, resource, tail @ ..] if !matches!(*resource, "status" | "finalize") => {
            (*resource, tail.first(), tail.get(1))
        }
        [resource, tail @ ..] => (*resource, tail.first(), tail.get(1)),
        [] => return None,
    };
    let verb = match (method, name.is_some()) {
        _ if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "other",
    };
    let resource = match sub {
        Some(sub) if !watch => format!("{resource}/{sub}"),
        _ => resource.to_owned(),
    };
    Some((verb, resource))
}

async fn forward(
    client: kube::Client,
    lags: Arc<Lags>,
    request: hyper::Request<Incoming>,
) -> Result<hyper::Response<ProxyBody>, std::convert::Infallible> {
    let (parts, body) = request.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_owned();
    let kind = request_kind(parts.method.as_str(), parts.uri.path(), parts.uri.query());
    let watched = kind
        .as_ref()
        .filter(|(verb, _)| *verb == "watch")
        .map(|(_, resource)| resource.clone());
    let counted = kind.map_or_else(
        || format!("{} -", parts.method.as_str().to_ascii_lowercase()),
        |(verb, resource)| format!("{verb} {resource}"),
    );
    lags.count_request(&counted);
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return Ok(bad_gateway(format!("reading the request body: {e}"))),
    };
    let mut upstream = http::Request::builder()
        .method(parts.method)
        .uri(path_and_query);
    for (name, value) in &parts.headers {
        let name_str = name.as_str();
        if HOP_BY_HOP.contains(&name_str) || name_str == "content-length" {
            continue;
        }
        // Events are split at newlines: no compressed watch bodies.
        if watched.is_some() && name_str == "accept-encoding" {
            continue;
        }
        upstream = upstream.header(name, value);
    }
    let upstream = match upstream.body(kube::client::Body::from(body)) {
        Ok(request) => request,
        Err(e) => return Ok(bad_gateway(format!("building the request: {e}"))),
    };
    let response = match client.send(upstream).await {
        Ok(response) => response,
        Err(e) => return Ok(bad_gateway(format!("the API server: {e}"))),
    };
    let (mut parts, body) = response.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    let body: ProxyBody = match watched {
        Some(resource) if parts.status.is_success() => {
            parts.headers.remove(http::header::CONTENT_LENGTH);
            lagged(body, resource, counted, lags)
        }
        _ => body
            .map_frame(move |frame| {
                if let Some(data) = frame.data_ref() {
                    lags.count_bytes(&counted, data.len());
                }
                frame
            })
            .map_err(|e| Box::new(e) as BoxError)
            .boxed_unsync(),
    };
    Ok(hyper::Response::from_parts(parts, body))
}

/// A piece of a watch body and when it is due.
type Piece = (Instant, Result<Bytes, BoxError>);

/// Schedules the pieces of one watch body.
struct Delayer {
    tx: tokio::sync::mpsc::UnboundedSender<Piece>,
    last_due: Instant,
    lags: Arc<Lags>,
    resource: String,
}

impl Delayer {
    /// Sends `piece` due at now plus the resource's lag, never before the
    /// piece before it; counts it held when delayed and `counted`. `false`:
    /// the client went away.
    fn send(&mut self, piece: Result<Bytes, BoxError>, counted: bool) -> bool {
        let lag = self.lags.lag(&self.resource);
        let due = (Instant::now() + lag).max(self.last_due);
        self.last_due = due;
        if !lag.is_zero() && counted {
            self.lags.count_held(&self.resource);
        }
        self.tx.send((due, piece)).is_ok()
    }
}

/// A watch body whose events (lines) are delivered at their arrival plus
/// the resource's lag of that moment, in order; their bytes are counted
/// under `counted` as they arrive.
fn lagged(
    mut body: kube::client::Body,
    resource: String,
    counted: String,
    lags: Arc<Lags>,
) -> ProxyBody {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Piece>();
    tokio::spawn(async move {
        let mut out = Delayer {
            tx,
            last_due: Instant::now(),
            lags: lags.clone(),
            resource,
        };
        let mut partial = BytesMut::new();
        loop {
            let frame = match body.frame().await {
                None => break,
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    out.send(Err(Box::new(e)), false);
                    return;
                }
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            lags.count_bytes(&counted, data.len());
            partial.extend_from_slice(&data);
            while let Some(end) = partial.iter().position(|&b| b == b'\n') {
                let event = partial.split_to(end + 1).freeze();
                let bookmark = event.starts_with(br#"{"type":"BOOKMARK""#);
                if !out.send(Ok(event), !bookmark) {
                    return; // the client went away
                }
            }
        }
        if !partial.is_empty() {
            out.send(Ok(partial.freeze()), true);
        }
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        let (due, piece) = rx.recv().await?;
        tokio::time::sleep_until(due).await;
        Some((piece.map(Frame::data), rx))
    });
    StreamBody::new(events.boxed()).boxed_unsync()
}

fn bad_gateway(message: String) -> hyper::Response<ProxyBody> {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": format!("lag proxy: {message}"),
        "reason": "ServiceUnavailable", "code": 502,
    });
    let mut response = hyper::Response::new(
        Full::new(Bytes::from(status.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = http::StatusCode::BAD_GATEWAY;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::{request_kind, watched_resource};

    #[test]
    fn names_a_request_as_the_audit_log_does() {
        let cases = [
            (
                "GET",
                "/api/v1/persistentvolumes/pv-1",
                None,
                Some(("get", "persistentvolumes")),
            ),
            (
                "GET",
                "/api/v1/persistentvolumes",
                Some("limit=500"),
                Some(("list", "persistentvolumes")),
            ),
            (
                "GET",
                "/api/v1/persistentvolumes",
                Some("watch=1"),
                Some(("watch", "persistentvolumes")),
            ),
            (
                "PATCH",
                "/api/v1/namespaces/ns/persistentvolumeclaims/c/status",
                None,
                Some(("patch", "persistentvolumeclaims/status")),
            ),
            (
                "POST",
                "/api/v1/namespaces/ns/events",
                None,
                Some(("create", "events")),
            ),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                None,
                Some(("update", "leases")),
            ),
            (
                "DELETE",
                "/api/v1/persistentvolumes/pv-1",
                None,
                Some(("delete", "persistentvolumes")),
            ),
            (
                "DELETE",
                "/api/v1/persistentvolumes",
                None,
                Some(("deletecollection", "persistentvolumes")),
            ),
            (
                "GET",
                "/api/v1/namespaces/ns",
                None,
                Some(("get", "namespaces")),
            ),
            ("GET", "/version", None, None),
        ];
        for (method, path, query, want) in cases {
            assert_eq!(
                request_kind(method, path, query)
                    .as_ref()
                    .map(|(verb, resource)| (*verb, resource.as_str())),
                want,
                "{method} {path}?{query:?}"
            );
        }
    }

    #[test]
    fn finds_the_resource_of_a_watch() {
        let cases = [
            (
                "/apis/storage.k8s.io/v1/volumeattachments",
                Some("watch=true&resourceVersion=5"),
                Some("volumeattachments"),
            ),
            (
                "/api/v1/persistentvolumes",
                Some("allowWatchBookmarks=true&watch=1"),
                Some("persistentvolumes"),
            ),
            (
                "/api/v1/namespaces/ns/persistentvolumeclaims",
                Some("watch=true"),
                Some("persistentvolumeclaims"),
            ),
            (
                "/apis/storage.k8s.io/v1/namespaces/ns/csistoragecapacities",
                Some("watch=true"),
                Some("csistoragecapacities"),
            ),
            ("/api/v1/watch/namespaces/ns/pods", None, Some("pods")),
            ("/api/v1/namespaces", Some("watch=true"), Some("namespaces")),
            (
                "/api/v1/namespaces/ns/status",
                Some("watch=true"),
                Some("namespaces"),
            ),
            ("/apis/storage.k8s.io/v1/volumeattachments", None, None),
            (
                "/apis/storage.k8s.io/v1/volumeattachments",
                Some("watch=false"),
                None,
            ),
            (
                "/api/v1/namespaces/ns/pods",
                Some("labelSelector=watch%3Dtrue"),
                None,
            ),
            ("/version", Some("watch=true"), None),
            ("/apis/storage.k8s.io/v1", Some("watch=true"), None),
        ];
        for (path, query, want) in cases {
            assert_eq!(
                watched_resource(path, query).as_deref(),
                want,
                "{path}?{query:?}"
            );
        }
    }
}
