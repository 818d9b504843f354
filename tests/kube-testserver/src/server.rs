//! [`TestServer`]: the shared state plus the in-process service and the
//! HTTP listener that both hand requests to [`crate::api::handle`].

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::{self, Outcome, ResponseBody};
use crate::error::{ApiError, Error};
use crate::faults::{Faults, RequestMatch};
use crate::meta;
use crate::observe::{Observations, Origin, RequestRecord, Verb};
use crate::ops::{DeleteOptions, DeleteOutcome};
use crate::resources::{Registry, ResourceInfo, builtin_resources};
use crate::store::State;

/// Shared state behind every handle.
pub struct Inner {
    pub(crate) state: Arc<Mutex<State>>,
    faults: Mutex<Faults>,
    observations: Mutex<Observations>,
    pub(crate) registry: Registry,
    /// How often a watch with bookmarks gets one ([`TestServer::set_bookmark_interval`]).
    pub(crate) bookmark_interval: Mutex<Duration>,
    server_address: Mutex<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock leaves consistent data here (every
    // mutation is completed under the lock before anything can panic in a
    // test); keep serving rather than cascading the panic.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Inner {
    pub(crate) fn lock_state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn lock_faults(&self) -> MutexGuard<'_, Faults> {
        lock(&self.faults)
    }

    pub(crate) fn observe(&self, r: RequestRecord) {
        lock(&self.observations).record(r);
    }

    pub(crate) fn receive(&self) -> u64 {
        lock(&self.observations).receive()
    }

    pub(crate) fn server_address(&self) -> String {
        lock(&self.server_address).clone()
    }

    pub(crate) fn set_server_address(&self, addr: &str) {
        *lock(&self.server_address) = addr.to_string();
    }
}

/// Options for a [`TestServer`].
#[derive(Debug, Clone)]
pub struct TestServerBuilder {
    history_limit: usize,
    bookmark_interval: Duration,
    gc: bool,
    controller_manager: bool,
    resources: Vec<ResourceInfo>,
}

impl Default for TestServerBuilder {
    fn default() -> Self {
        Self {
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(1),
            gc: true,
            controller_manager: false,
            resources: builtin_resources(),
        }
    }
}

impl TestServerBuilder {
    /// Number of watch events retained for resuming watches (default 10,000);
    /// older resourceVersions get 410 Gone.
    pub fn history_limit(mut self, n: usize) -> Self {
        self.history_limit = n;
        self
    }

    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK (default 1 s).
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }

    /// Garbage collector on (default) or off.
    pub fn gc(mut self, on: bool) -> Self {
        self.gc = on;
        self
    }

    /// Controller-manager helpers on or off (default off).
    pub fn controller_manager(mut self, on: bool) -> Self {
        self.controller_manager = on;
        self
    }

    /// Serves one more kind (or replaces a built-in with the same group/version/plural).
    pub fn resource(mut self, info: ResourceInfo) -> Self {
        self.resources.retain(|r| {
            !(r.group == info.group && r.version == info.version && r.plural == info.plural)
        });
        self.resources.push(info);
        self
    }

    /// Builds the server. Namespaces `default`, `kube-system`, `kube-public`
    /// and `kube-node-lease` exist from the start, as in a real cluster.
    pub fn build(self) -> TestServer {
        let registry = Registry::new(self.resources);
        let mut state = State::new(registry.clone(), self.history_limit);
        state.gc_enabled = self.gc;
        state.controller_enabled = self.controller_manager;
        if let Some(ns_res) = state.res_of("", "Namespace") {
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                // Fresh store: these names cannot exist yet.
                let _ = state.create(ns_res, "", obj);
            }
        }
        state.reconcile();
        TestServer {
            inner: Arc::new(Inner {
                state: Arc::new(Mutex::new(state)),
                faults: Mutex::new(Faults::default()),
                observations: Mutex::new(Observations::default()),
                registry,
                bookmark_interval: Mutex::new(self.bookmark_interval),
                server_address: Mutex::new("127.0.0.1:443".to_string()),
            }),
        }
    }
}

/// An in-memory Kubernetes API server. Cloning shares the same server.
#[derive(Clone)]
pub struct TestServer {
    inner: Arc<Inner>,
}

impl Default for TestServer {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestServer")
            .field("resource_version", &self.resource_version())
            .finish()
    }
}

/// Options for [`TestServer::serve_http_with`].
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Where to write the kubeconfig; default: a new temporary directory that
    /// is removed when the [`HttpServer`] is dropped.
    pub kubeconfig_path: Option<PathBuf>,
}

impl TestServer {
    /// A server with default options (GC on, controller-manager helpers off).
    pub fn new() -> Self {
        TestServerBuilder::default().build()
    }

    /// Options builder.
    pub fn builder() -> TestServerBuilder {
        TestServerBuilder::default()
    }

    /// The in-process `tower::Service`.
    pub fn service(&self) -> TestService {
        TestService {
            inner: self.inner.clone(),
            origin: Origin::InProcess,
        }
    }

    /// A `kube::Client` talking to the in-process service, default namespace
    /// `default`. Must be called inside a Tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// Serves over plain HTTP on 127.0.0.1 with a free port and writes a kubeconfig.
    pub async fn serve_http(&self) -> Result<HttpServer, Error> {
        self.serve_http_with(HttpOptions::default()).await
    }

    /// Serves over plain HTTP with options.
    pub async fn serve_http_with(&self, opts: HttpOptions) -> Result<HttpServer, Error> {
        crate::http::serve(self.inner.clone(), opts).await
    }

    // ----- switches -----

    /// Turns the garbage collector on or off. Turning it on processes every object.
    pub fn set_gc(&self, on: bool) {
        let mut st = self.inner.lock_state();
        st.gc_enabled = on;
        if on {
            st.mark_all_dirty();
        }
        st.reconcile();
    }

    /// Turns the controller-manager helpers on or off. Turning them on
    /// processes every object.
    pub fn set_controller_manager(&self, on: bool) {
        let mut st = self.inner.lock_state();
        st.controller_enabled = on;
        if on {
            st.mark_all_dirty();
        }
        st.reconcile();
    }

    // ----- faults -----

    /// The next `n` requests matching `m` fail with HTTP `code` and a `Status`
    /// body with the reason the real server uses for that code.
    pub fn fail_next(&self, n: u32, m: RequestMatch, code: u16) {
        self.inner.lock_faults().fail_next(n, m, code);
    }

    /// Every request matching `m` waits `delay` before it is handled (until
    /// [`TestServer::remove_latency`] or [`TestServer::clear_faults`]).
    pub fn add_latency(&self, m: RequestMatch, delay: Duration) {
        self.inner.lock_faults().add_latency(m, delay);
    }

    /// Removes one latency rule added by [`TestServer::add_latency`] with
    /// the same `m` (the latency ends; other rules stay). Returns how many
    /// requests it delayed (counted as each began: one still waiting
    /// counts), `None` if there was no such rule.
    pub fn remove_latency(&self, m: &RequestMatch) -> Option<u64> {
        self.inner.lock_faults().remove_latency(m)
    }

    /// Removes all failure and latency rules, ends a partition and every
    /// watch lag ([`TestServer::set_watch_lag`]).
    pub fn clear_faults(&self) {
        self.inner.lock_faults().clear();
        self.inner.lock_state().watch_lags.clear_all();
    }

    /// From now on, watches opened with `allowWatchBookmarks=true` get a
    /// BOOKMARK after `interval` without a message (kube-apiserver: about a
    /// minute; this server's default is 1 s, so that caches reach a
    /// revision quickly). Either way a watch also gets one two seconds
    /// before its timeout, as from kube-apiserver.
    pub fn set_bookmark_interval(&self, interval: Duration) {
        *lock(&self.inner.bookmark_interval) = interval;
    }

    /// Lags the watches of `resource` (plural, e.g. `"volumeattachments"`)
    /// by `lag`, for remote watchers only (HTTP clients: the processes
    /// under test; the in-process client's watches are not held), as
    /// the watches of different kinds on a real API server are not
    /// ordered with each other. Every message queued to such a watch
    /// while the lag is set (events, bookmarks, and the initial events of
    /// a watch started meanwhile) is sent at its queueing time plus `lag`,
    /// and never before an earlier message of the same watch; the watches
    /// of every other resource go on at once, and LIST and GET still
    /// answer the current state at once. A zero `lag` ends it. Setting it
    /// again changes the lag of the messages queued from then on.
    pub fn set_watch_lag(&self, resource: &str, lag: Duration) {
        self.inner.lock_state().watch_lags.set(resource, lag);
    }

    /// Ends the watch lag of `resource`. Messages already held keep their
    /// time; later ones are sent at once but wait behind them (the order
    /// of a watch is never changed).
    pub fn clear_watch_lag(&self, resource: &str) {
        self.inner.lock_state().watch_lags.clear(resource);
    }

    /// Watch events (ADDED, MODIFIED, DELETED, initial ones included; not
    /// bookmarks) of `resource` that a watch lag held for a remote watcher,
    /// since the server started or the last [`TestServer::reset_counters`]:
    /// whether a lag struck.
    pub fn watch_events_held(&self, resource: &str) -> u64 {
        self.inner.lock_state().watch_lags.held(resource)
    }

    /// From now on a list of `resource` (plural) with `resourceVersion=0`,
    /// which a real API server answers from its watch cache, answers with
    /// the objects and the revision of this instant, as a watch cache
    /// lagging behind etcd would, until [`TestServer::serve_current_lists`]
    /// (a later call takes a new picture). Consistent lists (no
    /// resourceVersion), streaming lists, gets and watches are not
    /// affected: a watch from the stale list's revision replays every
    /// change since (hold them with [`TestServer::set_watch_lag`] to keep
    /// the client behind).
    pub fn serve_stale_lists(&self, resource: &str) {
        let mut st = self.inner.lock_state();
        let Some(res) = (0..st.registry.all().len()).find(|&r| st.plural(r) == resource) else {
            panic!("serve_stale_lists: no resource {resource}");
        };
        let stale = crate::store::StaleList {
            rv: st.rv,
            objects: st.objects.get(res).cloned().unwrap_or_default(),
        };
        st.stale_lists.insert(res, stale);
    }

    /// Ends [`TestServer::serve_stale_lists`] of `resource`.
    pub fn serve_current_lists(&self, resource: &str) {
        let mut guard = self.inner.lock_state();
        let st = &mut *guard;
        let registry = &st.registry;
        st.stale_lists
            .retain(|&res, _| registry.get(res).is_none_or(|i| i.plural != resource));
    }

    /// Ends every open watch stream (clients see the stream end and re-watch).
    pub fn close_watches(&self) {
        self.inner.lock_state().close_watches();
    }

    /// Forgets the retained watch history: watches resuming from any earlier
    /// resourceVersion get 410 Gone, continue tokens expire.
    pub fn compact(&self) {
        self.inner.lock_state().compact();
    }

    /// Simulates a network partition: while on, every request is dropped
    /// without an answer (in-process: the service returns an error; HTTP: the
    /// connection is closed) and open watches are ended.
    pub fn set_partitioned(&self, on: bool) {
        self.inner.lock_faults().partitioned = on;
        if on {
            self.close_watches();
        }
    }

    // ----- observability -----

    /// Every request handled since the last [`TestServer::reset_counters`].
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.inner.observations).log.clone()
    }

    /// How many requests the server has received so far (answered or not):
    /// the requests received from now on have [`RequestRecord::received`]
    /// at or above it.
    pub fn requests_received(&self) -> u64 {
        lock(&self.inner.observations).received
    }

    /// Requests per (verb, resource) since the last reset. Subresources count
    /// as `"plural/subresource"`, non-resource requests as `(NonResource, "")`.
    pub fn counters(&self) -> BTreeMap<(Verb, String), u64> {
        lock(&self.inner.observations).counters.clone()
    }

    /// Requests with this verb on this resource since the last reset.
    pub fn request_count(&self, verb: Verb, resource: &str) -> u64 {
        lock(&self.inner.observations)
            .counters
            .get(&(verb, resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Writes (create, update, patch, delete, deletecollection) on any
    /// resource since the last reset.
    pub fn write_count(&self) -> u64 {
        lock(&self.inner.observations)
            .counters
            .iter()
            .filter(|((v, _), _)| v.is_write())
            .map(|(_, n)| n)
            .sum()
    }

    /// Clears the request log and counters (the counts of
    /// [`TestServer::watch_events_held`] too).
    pub fn reset_counters(&self) {
        lock(&self.inner.observations).reset();
        self.inner.lock_state().watch_lags.reset_counts();
    }

    // ----- direct access (no request log, no faults) -----

    /// Current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.lock_state().rv
    }

    fn resolve(&self, api_version: &str, kind: &str) -> Result<usize, ApiError> {
        self.inner
            .registry
            .by_kind(api_version, kind)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "no kind \"{kind}\" is registered for version \"{api_version}\""
                ))
            })
    }

    /// Creates an object given as JSON (its `apiVersion`/`kind` select the
    /// resource; namespaced objects without a namespace go to `default`).
    pub fn create_object(&self, obj: Value) -> Result<Value, ApiError> {
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let res = self.resolve(&av, &kind)?;
        let ns = match meta::namespace(&obj) {
            "" => "default".to_string(),
            ns => ns.to_string(),
        };
        let mut st = self.inner.lock_state();
        let out = st.create(res, &ns, obj)?;
        st.reconcile();
        Ok((*out).clone())
    }

    /// Replaces an object (PUT semantics, status ignored for kinds with a
    /// status subresource).
    pub fn update_object(&self, obj: Value) -> Result<Value, ApiError> {
        self.write_object(obj, false)
    }

    /// Replaces an object's status (PUT `/status` semantics).
    pub fn update_object_status(&self, obj: Value) -> Result<Value, ApiError> {
        self.write_object(obj, true)
    }

    fn write_object(&self, obj: Value, status_only: bool) -> Result<Value, ApiError> {
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let res = self.resolve(&av, &kind)?;
        let ns = meta::namespace(&obj).to_string();
        let name = meta::name(&obj).to_string();
        let mut st = self.inner.lock_state();
        let out = st.update(res, &ns, &name, obj, status_only)?;
        st.reconcile();
        Ok((*out).clone())
    }

    /// Reads an object.
    pub fn get_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let res = self.resolve(api_version, kind).ok()?;
        let st = self.inner.lock_state();
        st.get_one(res, namespace, name).ok().map(|o| (*o).clone())
    }

    /// Lists objects of a kind, in one namespace or all.
    pub fn list_objects(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Vec<Value> {
        let Ok(res) = self.resolve(api_version, kind) else {
            return Vec::new();
        };
        let st = self.inner.lock_state();
        st.iter_scope(res, namespace)
            .map(|o| (**o).clone())
            .collect()
    }

    /// Deletes an object (background propagation). Returns the object if it
    /// is still present (finalizers pending), `None` if it is gone.
    pub fn delete_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        let res = self.resolve(api_version, kind)?;
        let mut st = self.inner.lock_state();
        let out = st.delete(res, namespace, name, &DeleteOptions::default())?;
        st.reconcile();
        Ok(match out {
            DeleteOutcome::Pending(o) => Some((*o).clone()),
            DeleteOutcome::Deleted(_) => None,
        })
    }

    /// Typed [`TestServer::get_object`].
    pub fn get<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let v = self.get_object(&K::api_version(&()), &K::kind(&()), namespace, name)?;
        serde_json::from_value(v).ok()
    }

    /// Typed [`TestServer::list_objects`].
    pub fn list<K>(&self, namespace: Option<&str>) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        self.list_objects(&K::api_version(&()), &K::kind(&()), namespace)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// Typed [`TestServer::create_object`] (fills in `apiVersion`/`kind`).
    pub fn create<K>(&self, obj: &K) -> Result<K, ApiError>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let mut v = serde_json::to_value(obj).map_err(|e| ApiError::bad_request(e.to_string()))?;
        v["apiVersion"] = json!(K::api_version(&()));
        v["kind"] = json!(K::kind(&()));
        let out = self.create_object(v)?;
        serde_json::from_value(out).map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Creates the objects of a YAML (multi-document) or JSON text; `List`
    /// documents are expanded. Unlike a plain create, a `status` in the file is
    /// kept (written through the status subresource after the create).
    pub fn load_yaml(&self, text: &str) -> Result<Vec<Value>, Error> {
        let mut docs = Vec::new();
        for de in serde_yaml_ng::Deserializer::from_str(text) {
            let v = Value::deserialize(de).map_err(|e| Error::Parse {
                context: "YAML document".into(),
                message: e.to_string(),
            })?;
            if v.is_null() {
                continue;
            }
            match v.get("items").and_then(Value::as_array) {
                Some(items)
                    if v.get("kind")
                        .and_then(Value::as_str)
                        .is_some_and(|k| k.ends_with("List")) =>
                {
                    docs.extend(items.iter().cloned());
                }
                _ => docs.push(v),
            }
        }
        let mut out = Vec::new();
        for doc in docs {
            let status = doc.get("status").cloned();
            let mut created = self.create_object(doc)?;
            if let Some(s) = status
                && created.get("status") != Some(&s)
            {
                created["status"] = s;
                created = self.update_object_status(created)?;
            }
            out.push(created);
        }
        Ok(out)
    }

    /// [`TestServer::load_yaml`] on a file.
    pub fn load_file(&self, path: &Path) -> Result<Vec<Value>, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        self.load_yaml(&text)
    }
}

/// Error of the in-process service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The request was dropped by [`TestServer::set_partitioned`].
    #[error("connection dropped: kube-testserver is partitioned")]
    Partitioned,
    /// The request body could not be read.
    #[error("reading request body: {0}")]
    Body(String),
}

/// The in-process `tower::Service` (what [`TestServer::client`] wraps).
#[derive(Clone)]
pub struct TestService {
    inner: Arc<Inner>,
    origin: Origin,
}

impl<B> tower::Service<Request<B>> for TestService
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    type Response = Response<ResponseBody>;
    type Error = ServiceError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let origin = self.origin;
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body
                .collect()
                .await
                .map_err(|e| ServiceError::Body(e.to_string()))?
                .to_bytes();
            match api::handle(inner, origin, parts, bytes).await {
                Outcome::Respond(r) => Ok(r),
                Outcome::Drop => Err(ServiceError::Partitioned),
            }
        })
    }
}

/// A running HTTP listener. Dropping it stops serving (the [`TestServer`]
/// and its in-process clients keep working) and removes a temporary kubeconfig.
pub struct HttpServer {
    pub(crate) addr: SocketAddr,
    pub(crate) kubeconfig: PathBuf,
    pub(crate) owned_dir: Option<PathBuf>,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
}

impl HttpServer {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The generated kubeconfig (context `kube-testserver`, namespace `default`, a dummy token).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A `kube::Client` that talks HTTP to this listener.
    pub fn client(&self) -> Result<kube::Client, Error> {
        let url: http::Uri =
            self.url()
                .parse()
                .map_err(|e: http::uri::InvalidUri| Error::Parse {
                    context: "server URL".into(),
                    message: e.to_string(),
                })?;
        let config = kube::Config::new(url);
        kube::Client::try_from(config).map_err(|e| Error::Parse {
            context: "kube client config".into(),
            message: e.to_string(),
        })
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(dir) = &self.owned_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl TestService {
    /// The service behind the HTTP listener on `port`.
    pub(crate) fn for_listener(inner: Arc<Inner>, port: u16) -> Self {
        Self {
            inner,
            origin: Origin::Http(port),
        }
    }
}
