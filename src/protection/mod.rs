//! The PVC-protection loop (gate `PVCProtection`): the
//! controller-manager's pvc-protection controller, for this driver's claims.
//!
//! - A claim of ours that is alive and lacks `kubernetes.io/pvc-protection`
//!   gets it.
//! - A claim of ours being deleted loses it once no pod uses it. "Uses" is
//!   [`decide::pod_uses_claim`]: scheduled pods only, any phase, generic
//!   ephemeral volumes through their owner reference.
//! - The watch caches decide; when they say "unused", a live list of the
//!   namespace's pods ([`live`], one list per namespace per batch of
//!   askers) confirms, because a pod created just before the deletion may
//!   not be in the cache yet.
//!
//! Decisions are pure ([`decide`]); [`worker`] reads the caches, writes JSON
//! patches that `test` the finalizer list they change (a stale cache cannot
//! clobber a newer list) and requeues with backoff on conflicts. The
//! controller-manager may run the same logic on the same claims: the
//! finalizer is the same string, adding is idempotent and removing happens
//! only when both agree nobody uses the claim, so neither undoes the other.
//!
//! Triggers: claim add/update; pod add/update/delete (every claim the pod
//! references now or referenced before, so a pod replaced by another of the
//! same name during a re-list still frees its old claims); PV and
//! StorageClass changes (they can make a claim ours).

pub mod decide;
pub mod index;
pub mod live;
pub mod worker;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::projection::PersistentVolumeClaim;
use kube::{Client, ResourceExt};

use crate::api_calls::{ApiCall, LIST_WATCH, call};
use crate::caches::{Caches, Kind};
use crate::informer::Change;
use crate::provision::{ProvisionerConfig, claim_class_name};
use crate::queue::WorkQueue;
use crate::shared::{EmbeddedLoop, Shared};

pub use decide::{Confirmation, Verdict};

/// The API calls of this loop (see [`crate::api_calls`]): watches (the
/// shared caches only list and watch), live lists of a namespace's pods
/// ([`live`]), and JSON patches of claim finalizers ([`worker`]).
pub const API_CALLS: &[ApiCall] = &[
    call("", "persistentvolumeclaims", &["list", "watch", "patch"]),
    call("", "pods", LIST_WATCH),
    call("", "persistentvolumes", LIST_WATCH),
    call("storage.k8s.io", "storageclasses", LIST_WATCH),
];

/// How long askers gather before a namespace's pods are listed live.
const LIVE_LIST_WINDOW: Duration = Duration::from_millis(20);

/// A claim by namespace and name (pods reference claims by name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimName {
    pub namespace: String,
    pub name: String,
}

impl ClaimName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn of(claim: &PersistentVolumeClaim) -> Option<Self> {
        Some(Self::new(claim.namespace()?, claim.metadata.name.clone()?))
    }
}

impl std::fmt::Display for ClaimName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The running loop.
pub struct Protection {
    pub(crate) client: Client,
    /// Only `driver_name` matters here; the struct is what
    /// [`crate::provision::is_our_volume`] takes, so that "our PV" means the
    /// same in every loop.
    pub(crate) config: ProvisionerConfig,
    pub(crate) caches: Arc<Caches>,
    pub(crate) queue: WorkQueue<ClaimName>,
    pub(crate) live: live::LivePods,
    /// Which cached pods reference which claim.
    pub(crate) pods_by_claim: Arc<Mutex<index::PodsByClaim>>,
    workers: usize,
}

/// Registers the cache handlers and asks for claims, pods, PVs and classes.
/// Call before the caches start; then [`Protection::start`].
pub fn new(shared: &Shared) -> Arc<Protection> {
    let caches = Arc::clone(&shared.caches);
    caches.want(&[Kind::Claims, Kind::Pods, Kind::Volumes, Kind::Classes]);
    let queue: WorkQueue<ClaimName> = WorkQueue::new("pvc-protection", shared.backoff);

    {
        let queue = queue.clone();
        caches.claims.on_change(move |change| match change {
            Change::Applied(claim) => {
                if let Some(key) = ClaimName::of(claim) {
                    queue.add(key);
                }
            }
            Change::Deleted(claim) => {
                if let Some(key) = ClaimName::of(claim) {
                    queue.forget(&key);
                }
            }
        });
    }
    let pods_by_claim: Arc<Mutex<index::PodsByClaim>> = Arc::default();
    {
        // Claims a pod references now and referenced when last seen: a
        // pod's new version (or a new pod of the same name seen only after
        // a re-list) may not reference them any more, and they may be
        // waiting for it to go.
        let queue = queue.clone();
        let pods_by_claim = Arc::clone(&pods_by_claim);
        caches.pods.on_change(move |change| {
            let (pod, now) = match change {
                Change::Applied(pod) => (pod, decide::referenced_claims(pod)),
                Change::Deleted(pod) => (pod, Vec::new()),
            };
            let key = ClaimName::new(pod.namespace().unwrap_or_default(), pod.name_any());
            let touched = pods_by_claim
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .set(key, now);
            for claim in touched {
                queue.add(claim);
            }
        });
    }
    {
        let queue = queue.clone();
        caches.volumes.on_change(move |change| {
            if let Change::Applied(pv) = change
                && let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
                && let (Some(namespace), Some(name)) = (&claim_ref.namespace, &claim_ref.name)
            {
                queue.add(ClaimName::new(namespace, name));
            }
        });
    }
    {
        let queue = queue.clone();
        let claims = caches.claims.store();
        caches.classes.on_change(move |change| {
            if let Change::Applied(class) = change {
                let class_name = class.name_any();
                for claim in claims.state() {
                    if claim_class_name(&claim) == class_name
                        && let Some(key) = ClaimName::of(&claim)
                    {
                        queue.add(key);
                    }
                }
            }
        });
    }

    Arc::new(Protection {
        client: shared.client.clone(),
        config: ProvisionerConfig::with_defaults(shared.driver_name.clone()),
        live: live::LivePods::new(shared.client.clone(), LIVE_LIST_WINDOW),
        pods_by_claim,
        caches,
        queue,
        workers: shared.workers.max(1),
    })
}

impl EmbeddedLoop for Protection {
    /// Starts the workers (`--worker-threads`) once the caches are filled,
    /// so that no decision is made from a partial view.
    fn start(self: Arc<Self>) {
        let this = Arc::clone(&self);
        tokio::spawn(async move {
            this.caches.wait_until_ready().await;
            tracing::info!(workers = this.workers, "PVC protection loop running");
            let ctx = Arc::clone(&this);
            this.queue.run_workers(this.workers, move |key| {
                let ctx = Arc::clone(&ctx);
                async move { worker::process(&ctx, &key).await }
            });
        });
    }

    /// Stops taking work; writes under way finish.
    fn shut_down(&self) {
        self.queue.shut_down();
    }
}
