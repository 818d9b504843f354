//! Shared watch caches: one watch per resource type for the whole process,
//! feeding an in-memory store that every loop reads, and change handlers
//! through which loops enqueue work. No loop lists the API in a hot path.
//!
//! kube's reflector replaces the store after a re-list (for example after a
//! `410 Gone`) without saying which objects vanished meanwhile; a loop that
//! waits for a deletion would never hear of it. The informer compares the
//! keys before and after each re-list and reports the missing objects as
//! deleted.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

/// What happened to an object, as seen by a handler.
#[derive(Debug)]
pub enum Change<'a, K> {
    /// Created, updated, or listed (initial list, re-list, resync).
    Applied(&'a K),
    /// Deleted (or found missing after a re-list).
    Deleted(&'a K),
}

type Handler<K> = Arc<dyn Fn(Change<'_, K>) + Send + Sync>;

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

    /// Runs the watch until the stream ends (it does not, unless the task is
    /// dropped). Watch errors are logged and retried with backoff. `resync`
    /// re-announces every cached object periodically, for loops whose
    /// decisions depend on time or on objects of other types.
    pub async fn run(&self, api: Api<K>, config: watcher::Config, resync: Option<Duration>)
    where
        K: DeserializeOwned + std::fmt::Debug + Send + Sync,
    {
        let Some(mut writer) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            tracing::error!(kind = %K::kind(&()), "informer started twice; the second run does nothing");
            return;
        };
        let stream = watcher(api, config).default_backoff();
        futures_util::pin_mut!(stream);
        let mut before_relist: Option<HashMap<ObjectRef<K>, Arc<K>>> = None;
        let mut resync_timer = resync.map(|period| {
            let mut t = tokio::time::interval(period);
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
                // Periodic resync.
                None => {
                    for obj in self.store.state() {
                        self.dispatch(Change::Applied(&obj));
                    }
                    continue;
                }
                Some(None) => return,
                Some(Some(Err(e))) => {
                    tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed, retrying with backoff");
                    continue;
                }
                Some(Some(Ok(event))) => event,
            };
            if matches!(event, Event::Init) {
                before_relist = Some(
                    self.store
                        .state()
                        .into_iter()
                        .map(|o| (ObjectRef::from_obj(&*o), o))
                        .collect(),
                );
            }
            writer.apply_watcher_event(&event);
            match &event {
                Event::Apply(obj) | Event::InitApply(obj) => self.dispatch(Change::Applied(obj)),
                Event::Delete(obj) => self.dispatch(Change::Deleted(obj)),
                Event::Init => {}
                Event::InitDone => {
                    // Handlers have seen every listed object by now.
                    self.ready.send_replace(true);
                    if let Some(before) = before_relist.take() {
                        for (key, obj) in before {
                            if self.store.get(&key).is_none() {
                                self.dispatch(Change::Deleted(&obj));
                            }
                        }
                    }
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
}
