//! The PV-releaser loop (gate `PVReleaser`, `--controller-id`),
//! from the seed project kubernetes-dynamic-reclaimable-pvc-controllers.
//!
//! A PV of this driver is *associated* with our controller id by the label
//! `reclaimable-pv-releaser.kubernetes.io/managed-by=<id>` or by its
//! StorageClass's annotation
//! `reclaimable-pv-releaser.kubernetes.io/controller-id=<id>`. Unless
//! `--disable-automatic-association`, a PV whose claimRef names an existing
//! claim labelled `dynamic-pvc-provisioner.kubernetes.io/managed-by=<id>`
//! gets the label. An associated PV that is Released with a claimRef gets
//! the claimRef (and our label) removed by a merge patch guarded by its
//! resourceVersion, so the PV controller makes it Available with its data;
//! events `Released` / `ErrReleasePV` on the PV. A PV with reclaim policy
//! Delete is never released: the provisioner is deleting it.
//!
//! Decisions are pure ([`decide`]); [`worker`] reads the caches and writes.
//! A release by class annotation, and an automatic association, rest on
//! another kind's cache (the class's, the claim's), whose watch is not
//! ordered with the PV's: before writing, the worker reads that one object
//! live and decides again, and writes only if the verdict holds (an
//! annotation removed a moment ago must not make a PV's data claimable).
//! A managed claim deleted before its PV was labelled (a pod that finished
//! at once; a slow or retried association) still counts: the last state of
//! such a claim is kept per PV ([`Releaser::departed`]) until the PV is
//! decided, so its PV is associated and released as if the claim had been
//! seen in time. Without it the PV stayed Released with its data, never
//! reused.
//!
//! Triggers: PV changes; claim changes (the PV the claim is bound to);
//! StorageClass changes (every PV of the class); and a resync every
//! `--releaser-resync-period` that queues every cached PV, so that a missed
//! event or a decision that depends on another object is caught up.

pub mod decide;
pub mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};

use crate::api_calls::{ApiCall, call};
use crate::caches::{Caches, Kind};
use crate::events::Recorder;
use crate::informer::Change;
use crate::provision::ProvisionerConfig;
use crate::queue::WorkQueue;
use crate::shared::{EmbeddedLoop, Shared};

pub use decide::{Association, ReleaserConfig, Verdict};

/// The API calls of this loop (see [`crate::api_calls`]): watches, and
/// merge patches of PV labels and claim references ([`worker`]); events on
/// PVs. Before a write that rests on a class or a claim, that one object is
/// read live (`get`, [`decide::live_read`]).
pub const API_CALLS: &[ApiCall] = &[
    call("", "persistentvolumes", &["list", "watch", "patch"]),
    call("", "persistentvolumeclaims", &["get", "list", "watch"]),
    call(
        "storage.k8s.io",
        "storageclasses",
        &["get", "list", "watch"],
    ),
    // The shared recorder (`src/events.rs`).
    call("", "events", &["create", "patch"]),
];

/// The releaser's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `--controller-id` (not empty: the command line refuses that).
    pub controller_id: String,
    /// `--disable-automatic-association`.
    pub disable_automatic_association: bool,
    /// `--releaser-resync-period`; zero disables the resync.
    pub resync_period: Duration,
}

/// The running loop.
pub struct Releaser {
    pub(crate) client: Client,
    pub(crate) config: ReleaserConfig,
    pub(crate) caches: Arc<Caches>,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) queue: WorkQueue<String>,
    resync_period: Duration,
    stopped: AtomicBool,
    workers: usize,
    /// PV name → the resourceVersion our last write to it was based on.
    /// While the cache still shows that version it has not seen the write
    /// yet, and deciding again would repeat it; the write's own watch event
    /// queues the PV again.
    pub(crate) written_from: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// PV name → the last state of its claim, labelled for our controller
    /// id, that was deleted while the PV was not yet associated. Taken by
    /// the PV's next decision; dropped when the PV goes, and by the resync
    /// for PVs no longer cached.
    pub(crate) departed: Arc<Departed>,
}

/// See [`Releaser::departed`].
pub(crate) type Departed = std::sync::Mutex<
    std::collections::HashMap<String, Arc<crate::projection::PersistentVolumeClaim>>,
>;

/// Registers the cache handlers and asks for PVs, claims and classes. Call
/// before the caches start; then [`Releaser::start`].
pub fn new(shared: &Shared, settings: Settings) -> Arc<Releaser> {
    let caches = Arc::clone(&shared.caches);
    caches.want(&[Kind::Volumes, Kind::Claims, Kind::Classes]);
    let queue: WorkQueue<String> = WorkQueue::new("pv-releaser", shared.backoff);
    let departed: Arc<Departed> = Arc::default();

    {
        let queue = queue.clone();
        let recorder = Arc::clone(&shared.recorder);
        let departed = Arc::clone(&departed);
        caches.volumes.on_change(move |change| match change {
            Change::Applied(pv) => queue.add(pv.name_any()),
            Change::Deleted(pv) => {
                queue.forget(&pv.name_any());
                departed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&pv.name_any());
                // The recorder remembers the last event per object; a PV
                // that is gone needs no memory.
                if let Some(uid) = pv.uid() {
                    recorder.forget(&uid);
                }
            }
        });
    }
    {
        // A claim labelled for us (or unlabelled) changes whether its PV is
        // to be associated.
        let queue = queue.clone();
        let departed = Arc::clone(&departed);
        let id = settings.controller_id.clone();
        caches.claims.on_change(move |change| {
            let (deleted, claim) = match change {
                Change::Applied(claim) => (false, claim),
                Change::Deleted(claim) => (true, claim),
            };
            if let Some(volume) = claim
                .spec
                .as_ref()
                .and_then(|spec| spec.volume_name.as_deref())
                .filter(|name| !name.is_empty())
            {
                if deleted && decide::is_managed_by(claim, &id) {
                    departed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(volume.to_owned(), Arc::new(claim.clone()));
                }
                queue.add(volume.to_owned());
            }
        });
    }
    {
        let queue = queue.clone();
        let volumes = caches.volumes.store();
        caches.classes.on_change(move |change| {
            let (Change::Applied(class) | Change::Deleted(class)) = change;
            let class_name = class.name_any();
            for pv in volumes.state() {
                if pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.as_deref())
                    == Some(class_name.as_str())
                {
                    queue.add(pv.name_any());
                }
            }
        });
    }

    Arc::new(Releaser {
        client: shared.client.clone(),
        config: ReleaserConfig {
            controller_id: settings.controller_id,
            automatic_association: !settings.disable_automatic_association,
            driver: ProvisionerConfig::with_defaults(shared.driver_name.clone()),
        },
        caches,
        recorder: Arc::clone(&shared.recorder),
        queue,
        resync_period: settings.resync_period,
        stopped: AtomicBool::new(false),
        workers: shared.workers.max(1),
        written_from: std::sync::Mutex::default(),
        departed,
    })
}

impl EmbeddedLoop for Releaser {
    /// Starts the workers (`--worker-threads`) and the resync once the
    /// caches are filled, so that no decision is made from a partial view.
    fn start(self: Arc<Self>) {
        let this = Arc::clone(&self);
        tokio::spawn(async move {
            this.caches.wait_until_ready().await;
            tracing::info!(
                controller_id = %this.config.controller_id,
                automatic_association = this.config.automatic_association,
                resync = ?this.resync_period,
                workers = this.workers,
                "PV releaser loop running"
            );
            let ctx = Arc::clone(&this);
            this.queue.run_workers(this.workers, move |name| {
                let ctx = Arc::clone(&ctx);
                async move { worker::process(&ctx, &name).await }
            });
            if !this.resync_period.is_zero() {
                let ctx = Arc::clone(&this);
                tokio::spawn(async move { ctx.resync().await });
            }
        });
    }

    /// Stops taking work; writes under way finish.
    fn shut_down(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.queue.shut_down();
    }
}

impl Releaser {
    /// Queues every cached PV each period until shut down.
    async fn resync(&self) {
        let mut timer = tokio::time::interval(self.resync_period);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; the initial list already queued all.
        timer.tick().await;
        loop {
            timer.tick().await;
            if self.stopped.load(Ordering::Relaxed) {
                return;
            }
            let volumes = self.caches.volumes.store().state();
            tracing::debug!(volumes = volumes.len(), "PV releaser: resync");
            {
                // A deleted claim's PV that never reached our cache (not
                // ours, or gone meanwhile) is not waited for.
                let store = self.caches.volumes.store();
                self.departed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|pv, _| store.get(&ObjectRef::new(pv)).is_some());
            }
            for pv in volumes {
                self.queue.add(pv.name_any());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::queue::Backoff;

    /// A releaser for controller id `team-a` on `server`, caches not
    /// started, resync every 100 ms.
    fn releaser_on(server: &kube_testserver::TestServer) -> (Shared, Arc<Releaser>) {
        let client = server.client();
        let shared = Shared {
            client: client.clone(),
            driver_name: "hostpath.csi.k8s.io".to_owned(),
            caches: Arc::new(Caches::new()),
            recorder: Arc::new(Recorder::new(client, "test")),
            backoff: Backoff {
                start: Duration::from_millis(10),
                max: Duration::from_millis(10),
            },
            workers: 1,
            volume_events: Default::default(),
        };
        let releaser = new(
            &shared,
            Settings {
                controller_id: "team-a".to_owned(),
                disable_automatic_association: false,
                resync_period: Duration::from_millis(100),
            },
        );
        (shared, releaser)
    }

    /// A pod that finishes at once: its managed claim is deleted before the
    /// releaser decided about the claim's PV. The PV is still associated
    /// and released, from the claim's last state.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_managed_claim_deleted_before_association_still_releases_its_pv() {
        let server = kube_testserver::TestServer::new();
        server
            .create_object(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "ns"}}))
            .expect("namespace");
        let claim = server
            .create_object(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "cache", "namespace": "ns",
                    "labels": {crate::wellknown::LABEL_PVC_MANAGED_BY: "team-a"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-a",
                    "resources": {"requests": {"storage": "1Mi"}}},
            }))
            .expect("claim");
        let uid = claim["metadata"]["uid"].as_str().expect("uid").to_owned();
        let mut pv = server
            .create_object(json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": "pv-a"},
                "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "claimRef": {"namespace": "ns", "name": "cache", "uid": uid},
                    "csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "h"}},
            }))
            .expect("pv");
        // As the PV controller leaves it once its claim is gone.
        pv["status"] = json!({"phase": "Released"});
        server.update_object_status(pv).expect("released");
        let (shared, releaser) = releaser_on(&server);
        shared.caches.start(&shared.client);
        shared.caches.wait_until_ready().await;
        server
            .delete_object("v1", "PersistentVolumeClaim", "ns", "cache")
            .expect("claim deleted");
        let claims = shared.caches.claims.store();
        tokio::time::timeout(Duration::from_secs(5), async {
            while !claims.state().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the cache saw the deletion");
        // Only now does the releaser decide.
        Arc::clone(&releaser).start();
        let released = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let pv = server.get_object("v1", "PersistentVolume", "", "pv-a");
                if pv
                    .as_ref()
                    .is_some_and(|pv| pv["spec"]["claimRef"].is_null())
                {
                    return pv;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("released although its claim was gone");
        let labels = released.map(|pv| pv["metadata"]["labels"].clone());
        assert!(
            labels.is_none_or(|l| l
                .get(crate::wellknown::LABEL_PV_RELEASER_MANAGED_BY)
                .is_none()),
            "our label is removed on release"
        );
        assert!(
            releaser
                .departed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty(),
            "the claim's last state is not kept after the decision"
        );
        releaser.shut_down();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn resync_queues_every_cached_pv_until_shut_down() {
        let server = kube_testserver::TestServer::new();
        for name in ["pv-a", "pv-b"] {
            server
                .create_object(json!({
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": name},
                    "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                             "csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": name}},
                }))
                .expect("pv");
        }
        let (shared, releaser) = releaser_on(&server);
        shared.caches.start(&shared.client);
        shared.caches.wait_until_ready().await;
        // Take the keys the initial list queued, as a worker would.
        let mut initial = Vec::new();
        while !releaser.queue.is_empty() {
            if let Some(key) = releaser.queue.get().await {
                releaser.queue.done(&key);
                initial.push(key);
            }
        }
        initial.sort();
        assert_eq!(initial, ["pv-a", "pv-b"]);

        let resync = {
            let releaser = Arc::clone(&releaser);
            tokio::spawn(async move { releaser.resync().await })
        };
        tokio::time::timeout(Duration::from_secs(5), async {
            while releaser.queue.len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("every PV queued again by the resync");
        releaser.shut_down();
        tokio::time::timeout(Duration::from_secs(5), resync)
            .await
            .expect("resync stops after shut-down")
            .expect("resync task");
    }
}
