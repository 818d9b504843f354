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
//! Objects are trimmed ([`crate::trim`]) on the stream, before the store.
//! A periodic resync re-announces every cached object, so that a decision
//! that depends on time or on objects of other kinds is made again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use crate::trim::Trim;

/// What happened to an object, as seen by a handler.
#[derive(Debug)]
pub enum Change<'a, K> {
    /// Created, updated, or listed (initial list, re-list, resync).
    Applied(&'a K),
    /// Deleted (or found missing after a re-list).
    Deleted(&'a K),
}

type Handler<K> = Arc<dyn Fn(Change<'_, K>) + Send + Sync>;

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
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    writer: std::sync::Mutex<Option<Writer<K>>>,
    handlers: Arc<RwLock<Vec<Handler<K>>>>,
    /// Set once the first list is in the store.
    ready: tokio::sync::watch::Sender<bool>,
    /// Until ready: why not yet.
    waiting: Mutex<Waiting>,
}

impl<K> Default for Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub fn new() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: std::sync::Mutex::new(Some(writer)),
            handlers: Arc::default(),
            ready: tokio::sync::watch::Sender::new(false),
            waiting: Mutex::new(Waiting::Listing),
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
    /// periodically.
    pub async fn run(&self, api: Api<K>, config: watcher::Config, resync: Option<Duration>)
    where
        K: Trim + DeserializeOwned + std::fmt::Debug + Send + Sync,
    {
        let Some(mut writer) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            tracing::error!(kind = %K::kind(&()), "informer started twice; the second run does nothing");
            return;
        };
        let stream = watcher(api, config)
            .modify(|obj: &mut K| obj.trim())
            .default_backoff();
        futures_util::pin_mut!(stream);
        let mut before_list: Option<HashMap<ObjectRef<K>, Arc<K>>> = None;
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
                Some(Some(Ok(event))) => event,
            };
            if last_error.take().is_some() {
                tracing::info!(kind = %K::kind(&()), "watch working again");
            }
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
                Event::Apply(obj) => self.dispatch(Change::Applied(obj)),
                Event::Delete(obj) => self.dispatch(Change::Deleted(obj)),
                // Not in the store yet: announced with the whole list.
                Event::Init | Event::InitApply(_) => {}
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
                    // Handlers have seen every listed object by now.
                    self.ready.send_replace(true);
                    // The list's buffers and the replaced store are free now.
                    crate::memory::release_free_memory();
                }
            }
        }
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
    use k8s_openapi::api::core::v1::PersistentVolume;

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
            let api: Api<PersistentVolume> = Api::all(server.client());
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

    /// Issue 11 case 1: after `410 Gone` the reflector re-lists into a side
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
            let api: Api<PersistentVolume> = Api::all(server.client());
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
}
