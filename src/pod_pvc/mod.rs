//! The pod/Job-annotation PVC provisioner (gate `PodPVCProvisioner`,
//! `--controller-id`), the PV releaser's companion from the seed project
//! kubernetes-dynamic-reclaimable-pvc-controllers ("whenever it says Pod it
//! means it can also be a Job").
//!
//! A pod asks for a PVC for its volume `<v>` with the annotations
//! `dynamic-pvc-provisioner.kubernetes.io/<v>.enabled: "true"` and
//! `dynamic-pvc-provisioner.kubernetes.io/<v>.pvc: <one PVC, YAML or JSON>`;
//! a Job with the same annotations on itself gets them from its pod
//! template's volumes, shared by all its pods. The PVC is created under the
//! volume's `claimName`, labelled `claimed-by` (+ `claimed-by-kind`) and
//! `managed-by=<controller id>` (which the releaser reads), and owned by the
//! pod or Job, so the garbage collector removes it with its owner. Events
//! on the pod or Job: `PVCProvisioned`, `ErrMissingPVC`, `ErrInvalidPVC`,
//! `ErrMissingVolume`, `ErrPVCProvisionFailed`.
//!
//! Cleanup, for clusters whose garbage collector lags or is off: when a pod
//! or Job goes, and every `--pvc-provisioner-resync-period`, each PVC
//! managed by our id whose claimant is gone — checked with a live GET, never
//! from the cache alone — is deleted (guarded by its uid). A PVC without our
//! managed-by label is never touched.
//!
//! The PVCs are created with the sidecar's RBAC, not the pod author's:
//! anyone who may create pods may have PVCs made of any class.
//!
//! Decisions are pure ([`decide`]); this file is the wiring (cache
//! handlers, queue, resync); [`worker`] reads the caches (pods and Jobs are
//! cached trimmed: metadata with our annotations, volumes) and writes.

pub mod decide;
pub mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::projection::PersistentVolumeClaim;
use kube::{Client, ResourceExt};

use crate::api_calls::{ApiCall, WATCH, call};
use crate::caches::{Caches, Kind};
use crate::events::Recorder;
use crate::informer::Change;
use crate::queue::WorkQueue;
use crate::shared::{EmbeddedLoop, Shared};
use decide::OwnerKind;

/// The API calls of this loop (see [`crate::api_calls`]): pods and Jobs
/// watched (and read live before a cleanup), PVCs created and deleted,
/// events on pods and Jobs.
pub const API_CALLS: &[ApiCall] = &[
    call("", "pods", WATCH),
    call("batch", "jobs", WATCH),
    call(
        "",
        "persistentvolumeclaims",
        &["list", "watch", "create", "delete"],
    ),
    // The shared recorder (`src/events.rs`).
    call("", "events", &["create", "patch"]),
];

/// The loop's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `--controller-id` (not empty: the command line refuses that).
    pub controller_id: String,
    /// `--pvc-provisioner-resync-period`; zero disables the resync.
    pub resync_period: Duration,
}

/// A unit of work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// A pod or Job that may ask for PVCs.
    Claimant(OwnerKind, String, String),
    /// A managed PVC whose claimant may be gone.
    Claim(String, String),
}

/// The running loop.
pub struct PodPvcProvisioner {
    client: Client,
    caches: Arc<Caches>,
    recorder: Arc<Recorder>,
    controller_id: String,
    resync_period: Duration,
    queue: WorkQueue<Key>,
    stopped: AtomicBool,
    workers: usize,
}

/// Registers the cache handlers and asks for pods, Jobs and claims. Call
/// before the caches start; then [`PodPvcProvisioner::start`].
pub fn new(shared: &Shared, settings: Settings) -> Arc<PodPvcProvisioner> {
    let caches = Arc::clone(&shared.caches);
    caches.want(&[Kind::Pods, Kind::Jobs, Kind::Claims]);
    let queue: WorkQueue<Key> = WorkQueue::new("pod-pvc-provisioner", shared.backoff);
    let id = settings.controller_id.clone();
    {
        let queue = queue.clone();
        let claims = caches.claims.store();
        let id = id.clone();
        caches.pods.on_change(move |change| {
            on_claimant(&queue, &claims, &id, OwnerKind::Pod, change_parts(change));
        });
    }
    {
        let queue = queue.clone();
        let claims = caches.claims.store();
        let id = id.clone();
        caches.jobs.on_change(move |change| {
            on_claimant(&queue, &claims, &id, OwnerKind::Job, change_parts(change));
        });
    }
    {
        // A managed claim deleted by hand (or whose claimant asks again)
        // lets the claimant be looked at again.
        let queue = queue.clone();
        caches.claims.on_change(move |change| {
            let (Change::Applied(claim) | Change::Deleted(claim)) = change;
            if let Some(by) = decide::claimed_by(claim, &id) {
                queue.add(Key::Claimant(by.kind, by.namespace, by.name));
            }
        });
    }
    Arc::new(PodPvcProvisioner {
        client: shared.client.clone(),
        caches,
        recorder: Arc::clone(&shared.recorder),
        controller_id: settings.controller_id,
        resync_period: settings.resync_period,
        queue,
        stopped: AtomicBool::new(false),
        workers: shared.workers.max(1),
    })
}

/// (deleted?, namespace, name, annotated?) of a pod or Job change.
fn change_parts<K: kube::Resource>(change: Change<'_, K>) -> (bool, String, String, bool) {
    let (deleted, obj) = match change {
        Change::Applied(obj) => (false, obj),
        Change::Deleted(obj) => (true, obj),
    };
    let meta = obj.meta();
    (
        deleted,
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
        decide::is_annotated(meta.annotations.as_ref()),
    )
}

fn on_claimant(
    queue: &WorkQueue<Key>,
    claims: &kube::runtime::reflector::Store<PersistentVolumeClaim>,
    id: &str,
    kind: OwnerKind,
    (deleted, namespace, name, annotated): (bool, String, String, bool),
) {
    if !deleted {
        if annotated {
            queue.add(Key::Claimant(kind, namespace, name));
        }
        return;
    }
    // Gone: its claims, if any, are checked (live) for deletion.
    for claim in claims.state() {
        if let Some(by) = decide::claimed_by(&claim, id)
            && by.kind == kind
            && by.namespace == namespace
            && by.name == name
        {
            queue.add(Key::Claim(namespace.clone(), claim.name_any()));
        }
    }
}

impl EmbeddedLoop for PodPvcProvisioner {
    /// Starts the workers and the resync once the caches are filled.
    fn start(self: Arc<Self>) {
        let this = Arc::clone(&self);
        tokio::spawn(async move {
            this.caches.wait_until_ready().await;
            tracing::info!(
                controller_id = %this.controller_id,
                resync = ?this.resync_period,
                workers = this.workers,
                "pod/Job PVC provisioner running"
            );
            let ctx = Arc::clone(&this);
            this.queue.run_workers(this.workers, move |key| {
                let ctx = Arc::clone(&ctx);
                async move { ctx.process(&key).await }
            });
            if !this.resync_period.is_zero() {
                this.resync().await;
            }
        });
    }

    /// Stops taking work; writes under way finish.
    fn shut_down(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.queue.shut_down();
    }
}

impl PodPvcProvisioner {
    /// Every period: every managed claim (its claimant may be gone without
    /// an event we saw) and every annotated pod and Job.
    async fn resync(&self) {
        let mut timer = tokio::time::interval(self.resync_period);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            timer.tick().await;
            if self.stopped.load(Ordering::Relaxed) {
                return;
            }
            for claim in self.caches.claims.store().state() {
                if let Some(by) = decide::claimed_by(&claim, &self.controller_id) {
                    self.queue.add(Key::Claim(by.namespace, claim.name_any()));
                }
            }
            for pod in self.caches.pods.store().state() {
                if decide::is_annotated(pod.metadata.annotations.as_ref()) {
                    self.queue.add(Key::Claimant(
                        OwnerKind::Pod,
                        pod.namespace().unwrap_or_default(),
                        pod.name_any(),
                    ));
                }
            }
            for job in self.caches.jobs.store().state() {
                if decide::is_annotated(job.metadata.annotations.as_ref()) {
                    self.queue.add(Key::Claimant(
                        OwnerKind::Job,
                        job.namespace().unwrap_or_default(),
                        job.name_any(),
                    ));
                }
            }
        }
    }
}
