//! StatefulSet PVC retention (gate `StatefulSetAutoDeletePVC`, KEP-1847):
//! the controller-manager's owner references on the claims of
//! StatefulSets whose claim templates are for this driver, so that the
//! garbage collector deletes a claim with its set (whenDeleted=Delete) or
//! with its scaled-down pod (whenScaled=Delete).
//!
//! - [`decide`]: the pure decisions, per set and per claim
//!   ([`decide::plan_set`]): wanted owner references, a direct deletion, or
//!   leave it alone.
//! - this file: the wiring. One queue of StatefulSet keys, fed by
//!   StatefulSet, pod, claim and StorageClass events and a periodic resync.
//! - [`worker`]: the I/O. A worker plans a set from the shared caches and
//!   then, per claim, patches only `metadata.ownerReferences` (JSON patch
//!   guarded by `test`) or deletes a condemned claim whose pod is gone,
//!   after re-reading the set and the pod live.
//!
//! Life cycle, as every loop: [`new`] (before the caches start) registers
//! the handlers and asks for StatefulSets, Pods, Claims and Classes;
//! [`EmbeddedLoop::start`](crate::shared::EmbeddedLoop::start) (once the
//! caches are filled) starts the workers and the resync
//! ([`Settings::resync`]); `shut_down` stops them.
//! [`Context::process`] reconciles one set, for tests that drive it.
//!
//! Not done here, on purpose: no Events (owner-reference changes are
//! routine bookkeeping; the log has a line per decision naming the claim),
//! and
//! nothing for sets being deleted (the garbage collector acts on the
//! references already written, or orphans the claims).
//!
//! Writes are idempotent and guarded, so running next to the
//! controller-manager's own implementation cannot flip-flop: both write the
//! same references, and each considers the other's result up to date.

pub mod decide;
#[cfg(test)]
mod decide_tests;
pub mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::projection::StatefulSet;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};

use crate::api_calls::{ApiCall, WATCH, call};
use crate::caches::{Caches, Kind};
use crate::informer::Change;
use crate::queue::WorkQueue;
use crate::shared::{EmbeddedLoop, Shared};

pub use worker::RetentionError;

/// The API calls of this loop (see [`crate::api_calls`]).
pub const API_CALLS: &[ApiCall] = &[
    // Watched; `get` re-reads a set live before deleting a condemned claim
    // or adding a reference to it.
    call("apps", "statefulsets", WATCH),
    // Watched; `get` re-reads a pod live likewise.
    call("", "pods", WATCH),
    // Owner references are patched; condemned claims whose pod is gone are
    // deleted.
    call(
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "patch", "delete"],
    ),
    call("storage.k8s.io", "storageclasses", WATCH),
];

/// Settings of the loop.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Every set is reconciled at least this often, whatever events said,
    /// so that a missed event (or a change the caches cannot attribute to a
    /// set) is repaired.
    pub resync: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            resync: Duration::from_secs(60),
        }
    }
}

/// A StatefulSet, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for SetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The loop.
pub struct Context {
    client: Client,
    driver_name: String,
    caches: Arc<Caches>,
    queue: WorkQueue<SetKey>,
    workers: usize,
    resync: Duration,
    stopped: AtomicBool,
}

fn key_of(set: &StatefulSet) -> Option<SetKey> {
    Some(SetKey {
        namespace: set.namespace()?,
        name: set.metadata.name.clone()?,
    })
}

fn template_names(set: &StatefulSet) -> impl Iterator<Item = &str> {
    set.spec
        .volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|t| t.metadata.name.as_deref())
}

/// Registers the loop's cache handlers and asks for the kinds it reads.
/// Call before the caches start; then
/// [`EmbeddedLoop::start`](crate::shared::EmbeddedLoop::start).
pub fn new(shared: &Shared, config: Settings) -> Arc<Context> {
    let caches = Arc::clone(&shared.caches);
    caches.want(&[Kind::StatefulSets, Kind::Pods, Kind::Claims, Kind::Classes]);
    let queue: WorkQueue<SetKey> = WorkQueue::new("statefulset-retention", shared.backoff);

    {
        let queue = queue.clone();
        caches.stateful_sets.on_change(move |change| {
            let (Change::Applied(set) | Change::Deleted(set)) = change;
            if let Some(key) = key_of(set) {
                queue.add(key);
            }
        });
    }
    {
        // A pod's set: its controller reference, else its name (a pod not
        // adopted yet). Only sets we know are queued.
        let queue = queue.clone();
        let sets = caches.stateful_sets.store();
        caches.pods.on_change(move |change| {
            let (Change::Applied(pod) | Change::Deleted(pod)) = change;
            let Some(namespace) = pod.namespace() else {
                return;
            };
            let by_owner = pod
                .owner_references()
                .iter()
                .find(|r| {
                    r.controller == Some(true) && r.kind == crate::wellknown::STATEFULSET_KIND
                })
                .map(|r| r.name.clone());
            let name =
                by_owner.or_else(|| decide::pod_set_name(&pod.name_any()).map(str::to_owned));
            if let Some(name) = name
                && sets
                    .get(&ObjectRef::new(&name).within(&namespace))
                    .is_some()
            {
                queue.add(SetKey { namespace, name });
            }
        });
    }
    {
        // A claim's sets: every set of its namespace whose name pattern it
        // matches (several sets can match one name; each decides alone).
        let queue = queue.clone();
        let sets = caches.stateful_sets.store();
        caches.claims.on_change(move |change| {
            let (Change::Applied(claim) | Change::Deleted(claim)) = change;
            let Some(namespace) = claim.namespace() else {
                return;
            };
            let claim_name = claim.name_any();
            for set in sets.state() {
                if set.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && let Some(set_name) = set.metadata.name.as_deref()
                    && decide::claim_ordinal(&claim_name, set_name, template_names(&set)).is_some()
                    && let Some(key) = key_of(&set)
                {
                    queue.add(key);
                }
            }
        });
    }
    {
        // A class appearing or changing can make a set's templates ours.
        let queue = queue.clone();
        let sets = caches.stateful_sets.store();
        caches.classes.on_change(move |_| {
            for set in sets.state() {
                if let Some(key) = key_of(&set) {
                    queue.add(key);
                }
            }
        });
    }

    Arc::new(Context {
        client: shared.client.clone(),
        driver_name: shared.driver_name.clone(),
        caches,
        queue,
        workers: shared.workers.max(1),
        resync: config.resync,
        stopped: AtomicBool::new(false),
    })
}

impl EmbeddedLoop for Context {
    /// Starts the workers and the resync. Call once the caches are filled
    /// ([`Caches::wait_until_ready`]): deciding from a half-filled pod
    /// cache would take a living pod for a gone one.
    ///
    /// It does not wait for the caches itself on purpose: kube-runtime's
    /// `Store::wait_until_ready` keeps a single waker, so a second task
    /// waiting on the same store at the same time as start-up can starve
    /// one of them forever.
    fn start(self: Arc<Self>) {
        tracing::info!(workers = self.workers, resync = ?self.resync, "StatefulSet PVC retention loop running");
        let ctx = Arc::clone(&self);
        self.queue.run_workers(self.workers, move |key| {
            let ctx = Arc::clone(&ctx);
            async move { ctx.process(&key).await }
        });
        let ctx = Arc::clone(&self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(ctx.resync);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if ctx.stopped.load(Ordering::Relaxed) {
                    return;
                }
                ctx.enqueue_all();
            }
        });
    }

    /// Stops taking work; a set being reconciled finishes.
    fn shut_down(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.queue.shut_down();
    }
}

impl Context {
    fn enqueue_all(&self) {
        for set in self.caches.stateful_sets.store().state() {
            if let Some(key) = key_of(&set) {
                self.queue.add(key);
            }
        }
    }
}
