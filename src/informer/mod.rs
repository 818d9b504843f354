//! Shared watch caches: one watch per resource type for the whole process,
//! feeding an in-memory store that every loop reads, and change handlers
//! through which loops enqueue work. No loop lists the API in a hot path.
//!
//! Handlers are told only about what the store holds. kube's reflector
//! keeps the objects of a (re-)list in a side buffer and swaps them into the
//! store only when the list is complete; a handler told about a listed
//! object earlier would look it up, not find it and take it for deleted
//! (a claim created during a re-list after `410 Gone` was never
//! provisioned). So list events are not dispatched one by one: when the
//! list is complete, every object in the new store is announced as applied
//! and every object that was in the old store but not in the new one as
//! deleted (the reflector itself says nothing about those).
//!
//! Objects arrive as projections ([`crate::projection`]): only the fields
//! some loop reads were ever decoded.
//! A periodic resync re-announces every cached object, so that a decision
//! that depends on time or on objects of other kinds is made again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store, store::Writer};
use kube::runtime::watcher::{self, Event, InitialListStrategy};
use serde::de::DeserializeOwned;

mod watch_cache;
use watch_cache::from_watch_cache;

/// What happened to an object, as seen by a handler.
#[derive(Debug)]
pub enum Change<'a, K> {
    /// Created, updated, or listed (initial list, re-list, resync).
    Applied(&'a K),
    /// Deleted (or found missing after a re-list).
    Deleted(&'a K),
}

type Handler<K> = Arc<dyn Fn(Change<'_, K>) + Send + Sync>;

/// Which objects a cache keeps ([`crate::relevance`]).
type Keep<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

/// Why a cache is not filled yet, for `/readyz` and the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// Listing (or not started).
    Listing,
    /// The last list or watch failed with this error (e.g. 403 Forbidden).
    Failing(String),
}

/// A shared cache of one resource type.
pub struct Informer<K>
where
    K: Lookup<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    writer: std::sync::Mutex<Option<Writer<K>>>,
    handlers: Arc<RwLock<Vec<Handler<K>>>>,
    /// `None`: every object is kept.
    keep: RwLock<Option<Keep<K>>>,
    /// Set once any informer sharing it found that the API server cannot
    /// serve streaming lists: those started after it list at once instead
    /// of asking again.
    streaming_refused: Arc<AtomicBool>,
    /// Set once the first list is in the store.
    ready: tokio::sync::watch::Sender<bool>,
    /// Until ready: why not yet.
    waiting: Mutex<Waiting>,
    /// The highest resourceVersion among the events this cache has applied
    /// (0: none yet); see [`Informer::wait_for_revision`].
    applied: tokio::sync::watch::Sender<u64>,
}

impl<K> Default for Informer<K>
where
    K: Lookup<DynamicType = ()> + Clone + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K> Informer<K>
where
    K: Lookup<DynamicType = ()> + Clone + 'static,
{
    pub fn new() -> Self {
        Self::sharing(Arc::default())
    }

    /// An informer that shares with others what it learns of the API
    /// server's list support.
    pub fn sharing(streaming_refused: Arc<AtomicBool>) -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: std::sync::Mutex::new(Some(writer)),
            handlers: Arc::default(),
            keep: RwLock::new(None),
            streaming_refused,
            ready: tokio::sync::watch::Sender::new(false),
            waiting: Mutex::new(Waiting::Listing),
            applied: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The cache. Reads never touch the API server.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Registers a handler, called for every change after the store was
    /// updated. Handlers must be quick (enqueue a key, nothing more).
    pub fn on_change(&self, handler: impl Fn(Change<'_, K>) + Send + Sync + 'static) {
        self.handlers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::new(handler));
    }

    /// Keeps only the objects for which `keep` holds; the others never
    /// reach the store or a handler, and a cached object for which it stops
    /// holding leaves the store as if deleted. Call before
    /// [`run`](Self::run).
    pub fn keep_only(&self, keep: impl Fn(&K) -> bool + Send + Sync + 'static) {
        *self.keep.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(keep));
    }

    fn keeps(&self, obj: &K) -> bool {
        self.keep
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|keep| keep(obj))
    }

    /// The event the store and the handlers see: `None` for an object that
    /// is not kept and not cached (nothing to do), a deletion for a cached
    /// object that is no longer kept.
    fn filter(&self, event: Event<K>) -> Option<Event<K>> {
        match event {
            Event::Apply(obj) if !self.keeps(&obj) => self
                .store
                .get(&ObjectRef::from_obj(&obj))
                .is_some()
                .then_some(Event::Delete(obj)),
            Event::InitApply(obj) if !self.keeps(&obj) => None,
            // Not cached and not kept: nobody was told of it.
            Event::Delete(obj)
                if self.store.get(&ObjectRef::from_obj(&obj)).is_none() && !self.keeps(&obj) =>
            {
                None
            }
            event => Some(event),
        }
    }

    fn dispatch(&self, change: Change<'_, K>) {
        let handlers = self
            .handlers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for handler in &handlers {
            match &change {
                Change::Applied(obj) => handler(Change::Applied(obj)),
                Change::Deleted(obj) => handler(Change::Deleted(obj)),
            }
        }
    }

    /// Waits until the initial list is in the store. Several loops may wait
    /// at once.
    pub async fn wait_until_ready(&self) {
        // Not kube's `Store::wait_until_ready`: it keeps a single waker, so
        // of several concurrent waiters (one per loop) only the last one
        // polled is woken and the others hang for ever. A watch channel
        // wakes every subscriber.
        let mut ready = self.ready.subscribe();
        // An error means the sender is gone, i.e. the informer itself:
        // nothing left to wait for.
        let _ = ready.wait_for(|is_ready| *is_ready).await;
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// The highest resourceVersion among the events this cache has applied
    /// (store updated, handlers called); 0 before the first list is in.
    ///
    /// The API server's resourceVersions are one counter for every kind
    /// (etcd's revision), and one watch delivers its kind's events in that
    /// order: so a cache that applied an event at revision `r` holds every
    /// change of its kind made before `r` (events of objects it does not
    /// keep count too: they were seen and dropped). Watches of different
    /// kinds are not ordered with each other: a decision triggered by an
    /// object at revision `r` that reads another kind's cache must first
    /// know that cache is at `r` ([`Self::wait_for_revision`]) or read live
    /// (docs/design.md, "Reading current state").
    pub fn applied_revision(&self) -> u64 {
        *self.applied.borrow()
    }

    /// The revision this cache has applied, as it moves (read it with
    /// `borrow`): for a reader that must know, when it starts, what the
    /// cache already holds.
    pub fn applied_revisions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Waits at most `bound` until this cache has applied an event at or
    /// past `revision`; whether it has. A kind with no change since
    /// `revision` never gets there (the API server sends bookmarks about
    /// once a minute): callers fall back to a live read after `bound`.
    pub async fn wait_for_revision(&self, revision: u64, bound: Duration) -> bool {
        let mut applied = self.applied.subscribe();
        tokio::time::timeout(bound, applied.wait_for(|at| *at >= revision))
            .await
            .is_ok_and(|seen| seen.is_ok())
    }

    /// Tests of the callers: as if an event at `revision` was applied.
    #[cfg(test)]
    pub(crate) fn set_applied_revision_for_tests(&self, revision: u64) {
        self.note_applied(Some(revision));
    }

    fn note_applied(&self, revision: Option<u64>) {
        if let Some(revision) = revision {
            self.applied.send_if_modified(|at| {
                let newer = revision > *at;
                if newer {
                    *at = revision;
                }
                newer
            });
        }
    }

    /// `None` once ready; else why not yet.
    pub fn waiting(&self) -> Option<Waiting> {
        (!self.is_ready()).then(|| {
            self.waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        })
    }

    /// Runs the watch until the stream ends (it does not, unless the task is
    /// dropped). Watch errors are logged (once per kind of error) and
    /// retried with backoff. `resync` re-announces every cached object
    /// periodically. Objects are read as `W` (what the API client decodes:
    /// the projection itself, or a [`crate::projection::Wire`] around it)
    /// and kept as `K`.
    pub async fn run<W>(&self, api: Api<W>, config: watcher::Config, resync: Option<Duration>)
    where
        W: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        K: From<W> + Send + Sync,
    {
        let Some(mut writer) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            tracing::error!(kind = %K::kind(&()), "informer started twice; the second run does nothing");
            return;
        };
        let open = |config: watcher::Config| {
            watcher(api.clone(), config)
                .default_backoff()
                .map(kept_as::<W, K>)
                .boxed()
        };
        let refused = || self.streaming_refused.load(Ordering::Relaxed);
        let mut streaming =
            config.initial_list_strategy == InitialListStrategy::StreamingList && !refused();
        let mut stream = if streaming {
            open(config.clone())
        } else {
            from_watch_cache(api.clone(), config.clone())
                .map(kept_as::<W, K>)
                .chain(open(paged(config.clone())))
                .boxed()
        };
        let mut before_list: Option<HashMap<ObjectRef<K>, Arc<K>>> = None;
        // The highest revision among the objects of a list under way: the
        // cache is at least there once the list is in the store.
        let mut listed_revision: Option<u64> = None;
        let mut last_error: Option<String> = None;
        let mut resync_timer = resync.map(|period| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        loop {
            let next = async {
                match resync_timer.as_mut() {
                    Some(timer) => tokio::select! {
                        ev = stream.next() => Some(ev),
                        _ = timer.tick() => None,
                    },
                    None => Some(stream.next().await),
                }
            };
            let event = match next.await {
                // Periodic resync (only of a filled cache: a list under way
                // announces everything when it completes anyway).
                None => {
                    if before_list.is_none() && self.is_ready() {
                        for obj in self.store.state() {
                            self.dispatch(Change::Applied(&obj));
                        }
                    }
                    continue;
                }
                Some(None) => return,
                Some(Some(Err(e))) => {
                    if streaming && refuses_streaming_lists(&e) {
                        if !self.streaming_refused.swap(true, Ordering::Relaxed) {
                            tracing::warn!(kind = %K::kind(&()), error = %e, "the API server cannot serve streaming lists (sendInitialEvents: Kubernetes 1.32+ with the WatchList feature, and etcd 3.4.31+ / 3.5.13+); every cache lists in pages instead");
                        }
                        streaming = false;
                        stream = if self.is_ready() {
                            open(paged(config.clone()))
                        } else {
                            from_watch_cache(api.clone(), config.clone())
                                .map(kept_as::<W, K>)
                                .chain(open(paged(config.clone())))
                                .boxed()
                        };
                        continue;
                    }
                    let text = e.to_string();
                    // Once per distinct error, not once per retry: a
                    // forbidden list is retried with backoff for ever.
                    if last_error.as_deref() != Some(text.as_str()) {
                        tracing::warn!(kind = %K::kind(&()), error = %text, "watch failed, retrying with backoff");
                        last_error = Some(text.clone());
                    } else {
                        tracing::debug!(kind = %K::kind(&()), error = %text, "watch failed again");
                    }
                    *self.waiting.lock().unwrap_or_else(|p| p.into_inner()) =
                        Waiting::Failing(text);
                    continue;
                }
                Some(Some(Ok(Revisioned { event, revision }))) => (event, revision),
            };
            let (event, revision) = event;
            if last_error.take().is_some() {
                tracing::info!(kind = %K::kind(&()), "watch working again");
            }
            let listed = matches!(event, Event::InitApply(_));
            if listed {
                listed_revision = listed_revision.max(revision);
            }
            let Some(event) = self.filter(event) else {
                // Seen and not kept: the cache is as current as if kept.
                if !listed {
                    self.note_applied(revision);
                }
                continue;
            };
            if matches!(event, Event::Init) {
                before_list = Some(
                    self.store
                        .state()
                        .into_iter()
                        .map(|o| (ObjectRef::from_obj(&*o), o))
                        .collect(),
                );
            }
            writer.apply_watcher_event(&event);
            match &event {
                Event::Apply(obj) => {
                    self.dispatch(Change::Applied(obj));
                    self.note_applied(revision);
                }
                Event::Delete(obj) => {
                    self.dispatch(Change::Deleted(obj));
                    self.note_applied(revision);
                }
                Event::Init => listed_revision = None,
                // Not in the store yet: announced with the whole list.
                Event::InitApply(_) => {}
                Event::InitDone => {
                    for obj in self.store.state() {
                        self.dispatch(Change::Applied(&obj));
                    }
                    if let Some(before) = before_list.take() {
                        for (key, obj) in before {
                            if self.store.get(&key).is_none() {
                                self.dispatch(Change::Deleted(&obj));
                            }
                        }
                    }
                    // Before readiness: a waiter woken by it reads the
                    // revision next (CI once saw it still 0 in between).
                    self.note_applied(listed_revision.take());
                    // Handlers have seen every listed object by now.
                    self.ready.send_replace(true);
                    // The list's buffers and the replaced store are free now.
                    crate::memory::release_free_memory();
                }
            }
        }
    }
}

/// An event as the cache keeps it, with the revision (resourceVersion) of
/// the object it carries, when it carries one with a numeric version.
struct Revisioned<K> {
    event: Event<K>,
    revision: Option<u64>,
}

/// An event of objects read as `W`, with the objects as the cache keeps
/// them and the object's revision (read from `W`: the projections a cache
/// keeps may leave the resourceVersion out of their store keys).
fn kept_as<W: Resource, K: From<W>>(
    event: Result<Event<W>, watcher::Error>,
) -> Result<Revisioned<K>, watcher::Error> {
    fn revision_of<W: Resource>(obj: &W) -> Option<u64> {
        obj.meta().resource_version.as_deref()?.parse().ok()
    }
    event.map(|event| {
        let revision = match &event {
            Event::Apply(obj) | Event::Delete(obj) | Event::InitApply(obj) => revision_of(obj),
            Event::Init | Event::InitDone => None,
        };
        let event = match event {
            Event::Apply(obj) => Event::Apply(obj.into()),
            Event::Delete(obj) => Event::Delete(obj.into()),
            Event::Init => Event::Init,
            Event::InitApply(obj) => Event::InitApply(obj.into()),
            Event::InitDone => Event::InitDone,
        };
        Revisioned { event, revision }
    })
}

/// Whether a watch error says the API server cannot serve streaming lists:
/// an API server with the WatchList feature off answers 422 Invalid naming
/// `sendInitialEvents` (an older one may answer 400), and one whose etcd
/// lacks progress notifications (etcd before 3.4.31 / 3.5.13) answers 500
/// "a watch stream was requested by the client but the required storage
/// feature RequestWatchProgress is disabled". Nothing else in a watch
/// request we make can be invalid.
pub fn refuses_streaming_lists(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.as_ref(),
        watcher::Error::WatchError(status) => status.as_ref(),
        _ => return false,
    };
    matches!(status.code, 400 | 422)
        || [
            "sendInitialEvents",
            "RequestWatchProgress",
            "watch stream was requested",
        ]
        .iter()
        .any(|needle| status.message.contains(needle))
}

/// The fallback for an API server without streaming lists: a list in pages
/// of 500, as client-go's reflector, so that no response holds the whole
/// cluster's objects at once.
fn paged(config: watcher::Config) -> watcher::Config {
    watcher::Config {
        initial_list_strategy: InitialListStrategy::ListWatch,
        page_size: Some(500),
        ..config
    }
}

fn watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures_util::Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, config)
}

#[cfg(test)]
mod tests {
    use crate::projection::PersistentVolume;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_concurrent_waiter_sees_readiness() {
        let server = kube_testserver::TestServer::new();
        let informer: Arc<Informer<PersistentVolume>> = Arc::new(Informer::new());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let informer = Arc::clone(&informer);
                tokio::spawn(async move { informer.wait_until_ready().await })
            })
            .collect();
        // Let every waiter register before the list arrives.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let runner = {
            let informer = Arc::clone(&informer);
            let api: Api<crate::projection::Wire<PersistentVolume>> = Api::all(server.client());
            tokio::spawn(async move { informer.run(api, watcher::Config::default(), None).await })
        };
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("waiter woken")
                .expect("waiter task");
        }
        runner.abort();
    }

    /// Hazard 1 (docs/design.md): after `410 Gone` the reflector re-lists into a side
    /// buffer; a handler told about a listed object before the store held
    /// it took it for deleted. Every handler call must agree with the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_relist_handlers_see_only_what_the_store_holds() {
        use std::sync::Mutex;
        let server = kube_testserver::TestServer::builder()
            .history_limit(5)
            .build();
        let pv = |name: &str| {
            serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                         "hostPath": {"path": "/tmp"}}})
        };
        for i in 0..3 {
            server.create_object(pv(&format!("old-{i}"))).expect("pv");
        }
        let informer: Arc<Informer<PersistentVolume>> = Arc::new(Informer::new());
        let disagreements: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        {
            let store = informer.store();
            let disagreements = Arc::clone(&disagreements);
            let seen = Arc::clone(&seen);
            informer.on_change(move |change| {
                let (obj, deleted) = match change {
                    Change::Applied(obj) => (obj, false),
                    Change::Deleted(obj) => (obj, true),
                };
                let name = obj.metadata.name.clone().unwrap_or_default();
                let in_store = store.get(&ObjectRef::from_obj(obj)).is_some();
                if in_store == deleted {
                    disagreements
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{name}: deleted={deleted} in_store={in_store}"));
                }
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{}{name}", if deleted { "-" } else { "+" }));
            });
        }
        let runner = {
            let informer = Arc::clone(&informer);
            let api: Api<crate::projection::Wire<PersistentVolume>> = Api::all(server.client());
            tokio::spawn(async move { informer.run(api, watcher::Config::default(), None).await })
        };
        tokio::time::timeout(Duration::from_secs(5), informer.wait_until_ready())
            .await
            .expect("ready");
        // Expire the watch: the next one from the old resourceVersion gets
        // 410 Gone and the reflector lists again. Meanwhile objects come
        // and go.
        server.compact();
        server.close_watches();
        for i in 0..3 {
            server.create_object(pv(&format!("new-{i}"))).expect("pv");
        }
        server
            .delete_object("v1", "PersistentVolume", "", "old-0")
            .expect("delete");
        let store = informer.store();
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let names: Vec<String> = store
                    .state()
                    .iter()
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                if names.len() == 5 && !names.contains(&"old-0".to_owned()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the store caught up");
        // Give the handlers of the last events time to run.
        tokio::time::sleep(Duration::from_millis(200)).await;
        runner.abort();
        let disagreements = disagreements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        assert!(disagreements.is_empty(), "{disagreements:?}");
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for name in ["+new-0", "+new-1", "+new-2", "-old-0"] {
            assert!(
                seen.contains(&name.to_owned()),
                "{name} not announced: {seen:?}"
            );
        }
    }

    /// Runs `informer` against `server` with the sidecar's list-watch
    /// configuration (streaming lists first).
    fn run_streaming(
        informer: &Arc<Informer<PersistentVolume>>,
        server: &kube_testserver::TestServer,
    ) -> tokio::task::JoinHandle<()> {
        let informer = Arc::clone(informer);
        let api: Api<crate::projection::Wire<PersistentVolume>> = Api::all(server.client());
        tokio::spawn(async move {
            informer
                .run(api, crate::caches::list_watch_config(), None)
                .await
        })
    }

    #[test]
    fn which_watch_errors_mean_no_streaming_lists() {
        let status = |code: u16, message: &str| {
            Box::new(kube::core::Status {
                code,
                message: message.to_owned(),
                ..kube::core::Status::default()
            })
        };
        let refused = [
            watcher::Error::WatchStartFailed(kube::Error::Api(status(
                422,
                "sendInitialEvents is forbidden",
            ))),
            watcher::Error::WatchStartFailed(kube::Error::Api(status(400, "bad request"))),
            watcher::Error::WatchError(status(
                500,
                "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled",
            )),
        ];
        for error in &refused {
            assert!(refuses_streaming_lists(error), "{error}");
        }
        let other = [
            watcher::Error::WatchStartFailed(kube::Error::Api(status(403, "forbidden"))),
            watcher::Error::WatchError(status(410, "too old resource version")),
            watcher::Error::WatchError(status(500, "etcdserver: request timed out")),
            watcher::Error::NoResourceVersion,
        ];
        for error in &other {
            assert!(!refuses_streaming_lists(error), "{error}");
        }
    }

    fn csi_pv(name: &str, driver: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                     "csi": {"driver": driver, "volumeHandle": name}}})
    }

    fn driver_of(pv: &PersistentVolume) -> &str {
        pv.spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map_or("", |c| c.driver.as_str())
    }

    /// Objects that are not kept never reach the store nor a handler; one
    /// that stops being kept leaves the store and is announced as deleted.
    /// The list is a streaming one: no LIST request at all.
    /// The applied revision: the list's newest object once the list is in,
    /// then every event's, kept or not; and a waiter for a revision is
    /// woken by it, or gives up after its bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_applied_revision_follows_every_event_seen() {
        let server = kube_testserver::TestServer::new();
        server.create_object(csi_pv("mine-0", "ours")).expect("pv");
        let informer: Arc<Informer<PersistentVolume>> = Arc::new(Informer::new());
        informer.keep_only(|pv| driver_of(pv) == "ours");
        assert_eq!(informer.applied_revision(), 0);
        let runner = run_streaming(&informer, &server);
        tokio::time::timeout(Duration::from_secs(5), informer.wait_until_ready())
            .await
            .expect("ready");
        let listed = server.resource_version();
        assert_eq!(informer.applied_revision(), listed);
        assert!(
            !informer
                .wait_for_revision(listed + 1, Duration::from_millis(50))
                .await,
            "nothing changed: the bound ends the wait"
        );
        // Not kept, yet seen: the cache is as current as if it kept it.
        server
            .create_object(csi_pv("theirs-0", "theirs"))
            .expect("pv");
        let theirs = server.resource_version();
        assert!(
            informer
                .wait_for_revision(theirs, Duration::from_secs(5))
                .await
        );
        server
            .delete_object("v1", "PersistentVolume", "", "mine-0")
            .expect("delete");
        let deleted = server.resource_version();
        assert!(
            informer
                .wait_for_revision(deleted, Duration::from_secs(5))
                .await
        );
        assert!(
            informer.store().get(&ObjectRef::new("mine-0")).is_none(),
            "the store had applied the deletion when its revision was announced"
        );
        runner.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn objects_not_kept_never_reach_the_store_or_a_handler() {
        use std::sync::Mutex;
        let server = kube_testserver::TestServer::new();
        server.create_object(csi_pv("mine-0", "ours")).expect("pv");
        server
            .create_object(csi_pv("theirs-0", "theirs"))
            .expect("pv");
        let informer: Arc<Informer<PersistentVolume>> = Arc::new(Informer::new());
        informer.keep_only(|pv| driver_of(pv) == "ours");
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        {
            let seen = Arc::clone(&seen);
            informer.on_change(move |change| {
                let (sign, pv) = match change {
                    Change::Applied(pv) => ("+", pv),
                    Change::Deleted(pv) => ("-", pv),
                };
                seen.lock().unwrap_or_else(|p| p.into_inner()).push(format!(
                    "{sign}{}",
                    pv.metadata.name.clone().unwrap_or_default()
                ));
            });
        }
        let runner = run_streaming(&informer, &server);
        tokio::time::timeout(Duration::from_secs(5), informer.wait_until_ready())
            .await
            .expect("ready");
        server.create_object(csi_pv("mine-1", "ours")).expect("pv");
        server
            .create_object(csi_pv("theirs-1", "theirs"))
            .expect("pv");
        // mine-0 is handed over to another driver (an edit no real PV gets,
        // but the shape of "no longer relevant").
        server
            .delete_object("v1", "PersistentVolume", "", "mine-0")
            .expect("delete");
        server
            .create_object(csi_pv("mine-0", "theirs"))
            .expect("pv");
        server
            .delete_object("v1", "PersistentVolume", "", "theirs-0")
            .expect("delete");
        let store = informer.store();
        tokio::time::timeout(Duration::from_secs(5), async {
            while store.state().len() != 1 || store.get(&ObjectRef::new("mine-1")).is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the store holds mine-1 only");
        tokio::time::sleep(Duration::from_millis(200)).await;
        runner.abort();
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(seen, ["+mine-0", "+mine-1", "-mine-0"], "{seen:?}");
        let lists = server
            .requests()
            .iter()
            .filter(|r| r.verb == kube_testserver::Verb::List && r.resource == "persistentvolumes")
            .count();
        assert_eq!(lists, 0, "the initial list is a streaming watch");
    }

    /// An API server that refuses `sendInitialEvents` (422, the WatchList
    /// feature off) gets a paged list instead, once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_without_streaming_lists_is_listed_instead() {
        let server = kube_testserver::TestServer::new();
        server.create_object(csi_pv("mine-0", "ours")).expect("pv");
        server.fail_next(
            1,
            kube_testserver::RequestMatch::new(kube_testserver::Verb::Watch, "persistentvolumes"),
            422,
        );
        let informer: Arc<Informer<PersistentVolume>> = Arc::new(Informer::new());
        let runner = run_streaming(&informer, &server);
        tokio::time::timeout(Duration::from_secs(10), informer.wait_until_ready())
            .await
            .expect("ready after falling back to a list");
        runner.abort();
        assert!(informer.store().get(&ObjectRef::new("mine-0")).is_some());
        let verbs: Vec<(kube_testserver::Verb, u16)> = server
            .requests()
            .iter()
            .filter(|r| r.resource == "persistentvolumes")
            .map(|r| (r.verb, r.status))
            .collect();
        use kube_testserver::Verb::{List, Watch};
        assert_eq!(
            verbs.get(..2),
            Some(&[(Watch, 422), (List, 200)][..]),
            "a streaming list refused, then a list: {verbs:?}"
        );
        assert_eq!(verbs.iter().filter(|(v, _)| *v == List).count(), 1);
    }

    /// Without streaming lists the first list comes from the watch cache
    /// and is watched from its resourceVersion; a watch that can no longer
    /// resume (410 Gone after a compaction) hands over to kube's watcher,
    /// which lists again (consistent) and announces what went meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_start_up_list_is_watched_then_handed_over_on_gone() {
        let server = kube_testserver::TestServer::new();
        server.create_object(csi_pv("mine-0", "ours")).expect("pv");
        server.create_object(csi_pv("mine-1", "ours")).expect("pv");
        server.fail_next(
            1,
            kube_testserver::RequestMatch::new(kube_testserver::Verb::Watch, "persistentvolumes"),
            422,
        );
        let informer: Arc<Informer<PersistentVolume>> = Arc::new(Informer::new());
        let deleted = Arc::new(Mutex::new(Vec::<String>::new()));
        {
            let deleted = Arc::clone(&deleted);
            informer.on_change(move |change| {
                if let Change::Deleted(pv) = change {
                    deleted
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(pv.name_any());
                }
            });
        }
        let runner = run_streaming(&informer, &server);
        tokio::time::timeout(Duration::from_secs(10), informer.wait_until_ready())
            .await
            .expect("ready");
        let store = informer.store();
        let wait_for = |what: &'static str, check: Box<dyn Fn() -> bool + Send>| async move {
            tokio::time::timeout(Duration::from_secs(10), async {
                while !check() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{what}"));
        };
        // Watched from the list's resourceVersion.
        server.create_object(csi_pv("mine-2", "ours")).expect("pv");
        let s = store.clone();
        wait_for(
            "a PV created after the list is seen",
            Box::new(move || s.get(&ObjectRef::new("mine-2")).is_some()),
        )
        .await;
        // The watch breaks and cannot resume (410 Gone): a deletion
        // meanwhile is only learnt from a new list.
        server.fail_next(
            1,
            kube_testserver::RequestMatch::new(kube_testserver::Verb::Watch, "persistentvolumes"),
            410,
        );
        server.close_watches();
        server
            .delete_object("v1", "PersistentVolume", "", "mine-0")
            .expect("deleted");
        let s = store.clone();
        wait_for(
            "the new list dropped the deleted PV",
            Box::new(move || s.get(&ObjectRef::new("mine-0")).is_none()),
        )
        .await;
        runner.abort();
        assert!(
            deleted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&"mine-0".to_owned()),
            "handlers were told"
        );
        assert!(store.get(&ObjectRef::new("mine-1")).is_some());
        assert!(store.get(&ObjectRef::new("mine-2")).is_some());
        let lists = server
            .requests()
            .iter()
            .filter(|r| r.resource == "persistentvolumes" && r.verb == kube_testserver::Verb::List)
            .count();
        assert!(lists >= 2, "listed again after the watch was gone: {lists}");
    }
}
