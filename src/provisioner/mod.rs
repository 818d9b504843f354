//! The provisioning loop: the I/O around the decisions of [`crate::provision`].
//!
//! Read it from here: the wiring is [`new`] (registers the cache handlers
//! that feed the queues; no API call, so it may run before the leader
//! election is won) and [`Context::run`] (loads the [`journal`], resumes
//! what a previous run left on the backend, starts the workers); the
//! [`Context`] is what every worker shares. Each step asks
//! [`crate::provision`] what to do and carries the answer out here: cache
//! reads, API writes, CSI calls, events.
//!
//! Two queues, each with `--worker-threads` workers:
//! - **claims** ([`claims`]): a PVC that is ours → plan → journal →
//!   `CreateVolume` → PV. Operations whose `CreateVolume` may still be running
//!   on the backend (non-final errors) stay *in flight* per claim uid, with
//!   their frozen request, until the volume is saved as a PV or known to be
//!   gone — even if the claim is deleted meanwhile, and across restarts
//!   through the [`journal`].
//! - **volumes** ([`volumes`]): a PV that is ours → keep our finalizer in
//!   line with HonorPVReclaimPolicy → when Released with policy Delete,
//!   `DeleteVolume`, then delete the PV and drop the finalizer.
//!
//! A third queue, **unsavedpvs**, has no workers of its own: it measures
//! the claim workers' retries of saving a PV whose volume exists, as the
//! Go image's queue of that name ([`operations::SaveAttempt`]).
//!
//! With `--node-deployment` ([`owner`]), Immediate claims that no node has
//! taken yet are first taken by this node (selected-node annotation, after
//! a jittered delay); topology comes from the driver's `NodeGetInfo`
//! instead of the Node and CSINode objects, which are not watched.
//!
//! A plan's inputs are gathered in one place ([`inputs`]); the operations
//! in flight and the journal behind them have one owner ([`operations`]).
//!
//! Claims whose `CreateVolume` was refused as infeasible wait for
//! `--retry-interval-max` or a change ([`infeasible`]).
//!
//! The service-level figures per StorageClass (claims and volumes waiting,
//! driver calls by class) are [`slo`]'s.
//!
//! Everything is read from the shared watch caches ([`Caches`]); the API is
//! only written to, except for Secrets and snapshot objects, which are read
//! when a claim needs them.

mod attached;
pub mod claims;
pub mod infeasible;
mod inputs;
pub mod journal;
pub mod operations;
mod owner;
pub mod slo;
pub mod volumes;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::projection::PersistentVolumeClaim;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use crate::api_calls::{ApiCall, WATCH, call, in_own_namespace};
use crate::caches::{Caches, Kind};
use crate::csi::Driver;
use crate::events::Recorder;
use crate::informer::Change;
use crate::provision::node_deployment::{LocalTopology, journal_owner};
use crate::provision::{
    ProvisionerConfig, SecretRef, is_annotated_for_us, is_our_volume, volume_on_this_node,
};
use crate::queue::{Backoff, WorkQueue};
use crate::shared::Shared;

use infeasible::InfeasibleClaims;
use journal::{JournalInbox, JournalStore};
use operations::Operations;

/// The API calls of this loop (checked by `tests/deploy.rs` against the
/// RBAC rules and by the real-cluster tests against the audit log; see
/// [`crate::api_calls`]).
pub const API_CALLS: &[ApiCall] = &[
    call(
        "",
        "persistentvolumes",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    // Watched; patched to drop the selected-node annotation (reschedule),
    // for the clone-source finalizer, and (--node-deployment) to set the
    // selected-node annotation to this node, guarded by resourceVersion
    // (upstream uses update; a guarded patch needs no extra verb).
    call(
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "patch"],
    ),
    call("storage.k8s.io", "storageclasses", WATCH),
    // Not watched with --node-deployment (the driver's NodeGetInfo instead).
    call("", "nodes", WATCH),
    call("storage.k8s.io", "csinodes", WATCH),
    call("storage.k8s.io", "volumeattributesclasses", WATCH),
    call("storage.k8s.io", "volumeattachments", WATCH),
    call("", "secrets", &["get"]),
    // The shared recorder (`src/events.rs`).
    call("", "events", &["create", "patch"]),
    // The source-protection finalizer of a restore.
    call(
        "snapshot.storage.k8s.io",
        "volumesnapshots",
        &["get", "patch"],
    ),
    call(
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents",
        &["get"],
    ),
    // The write-ahead journal ([`journal`]), in the sidecar's namespace.
    in_own_namespace("", "configmaps", &["list", "create", "update", "delete"]),
];

/// Cross-namespace data sources (gate `CrossNamespaceVolumeDataSource`):
/// ReferenceGrants watched in every namespace, for this loop's decisions.
pub const CROSS_NAMESPACE_API_CALLS: &[ApiCall] =
    &[call("gateway.networking.k8s.io", "referencegrants", WATCH)];

/// `--extra-create-metadata-namespace-labels` / `-annotations` (beyond the
/// Go image, docs/operations.md, opt-ins): the claim's namespace, read live once per
/// provisioning for its labels and annotations.
pub const NAMESPACE_METADATA_API_CALLS: &[ApiCall] = &[call("", "namespaces", &["get"])];

/// A claim, identified by name and uid: a new claim with the same name is
/// different work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ClaimKey {
    pub fn of(claim: &PersistentVolumeClaim) -> Option<ClaimKey> {
        Some(ClaimKey {
            namespace: claim.namespace()?,
            name: claim.name_any(),
            uid: claim.uid()?,
        })
    }
}

impl std::fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a worker tells its queue about the key it processed.
pub(super) enum Next {
    Done,
    Retry,
    /// Retry after exactly this delay, outside the backoff (infeasible).
    RetryAfter(Duration),
}

/// What is done of a PV whose backend volume is deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeletedVolume {
    /// Our finalizer was removed (the update events that come before the
    /// cache sees it would otherwise repeat the removal, answered 422).
    pub finalizer_removed: bool,
}

/// PV uid → the resourceVersion a finalizer change (HonorPVReclaimPolicy's
/// add, or removal for a Retain PV or with the gate off) was patched from.
/// Until the cache moves past that version, the same change is not sent
/// again: it was, and its update event queues the PV. Entries go when the
/// cache moves on and when the PV goes, so it stays as small as the number
/// of writes the cache has not seen yet.
#[derive(Debug, Default)]
pub struct FinalizerWrites(Mutex<HashMap<String, String>>);

impl FinalizerWrites {
    /// Whether a finalizer change was written from `resource_version` of
    /// the PV `uid` (an entry for an older version is dropped).
    pub fn written(&self, uid: &str, resource_version: &str) -> bool {
        let mut writes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match writes.get(uid) {
            Some(from) if from == resource_version => true,
            Some(_) => {
                writes.remove(uid);
                crate::metrics::set_remembered("finalizer_writes", writes.len());
                false
            }
            None => false,
        }
    }

    /// Records a change written from `resource_version`.
    pub fn wrote(&self, uid: &str, resource_version: &str) {
        let mut writes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        writes.insert(uid.to_owned(), resource_version.to_owned());
        crate::metrics::set_remembered("finalizer_writes", writes.len());
    }

    /// The PV is gone.
    pub fn forget(&self, uid: &str) {
        let mut writes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if writes.remove(uid).is_some() {
            crate::metrics::set_remembered("finalizer_writes", writes.len());
        }
    }
}

/// How long a PV saved by this process is taken as saved without the
/// cache showing it: far longer than any watch lag, short enough that a
/// PV whose events were all missed (created and deleted between two
/// lists) is not remembered for ever.
const SAVED_VOLUME_MEMORY: Duration = Duration::from_secs(600);

/// PVs this process saved that the PV cache has not shown yet, by name →
/// the claim uid each records. A pass of the claim that runs before the PV
/// watch delivers the PV (the claim's own events, the queue's re-add of a
/// key changed while it was processed) would otherwise find no PV and start
/// the operation again: a second journal entry, `CreateVolume` and PV
/// create for a volume already saved (tests/cancellation.rs, "then
/// continued", failed so). The Go image's check reads its informer only and
/// repeats the call in that window.
#[derive(Debug, Default)]
pub struct SavedVolumes(Mutex<HashMap<String, (String, tokio::time::Instant)>>);

impl SavedVolumes {
    /// The PV `name` recording claim `uid` was saved now.
    pub fn saved(&self, name: &str, uid: &str) {
        let now = tokio::time::Instant::now();
        let mut saved = self.0.lock().unwrap_or_else(|p| p.into_inner());
        saved.retain(|_, (_, at)| now.duration_since(*at) < SAVED_VOLUME_MEMORY);
        saved.insert(name.to_owned(), (uid.to_owned(), now));
        crate::metrics::set_remembered("saved_volumes", saved.len());
    }

    /// Whether this process saved the PV `name` for claim `uid` and the
    /// cache may not show it yet.
    pub fn records(&self, name: &str, uid: &str) -> bool {
        let saved = self.0.lock().unwrap_or_else(|p| p.into_inner());
        saved
            .get(name)
            .is_some_and(|(claim, at)| claim == uid && at.elapsed() < SAVED_VOLUME_MEMORY)
    }

    /// The PV this process saved for claim `uid` that the cache may not
    /// show yet, whatever its name.
    pub fn saved_for(&self, uid: &str) -> Option<String> {
        let saved = self.0.lock().unwrap_or_else(|p| p.into_inner());
        saved
            .iter()
            .find(|(_, (claim, at))| claim == uid && at.elapsed() < SAVED_VOLUME_MEMORY)
            .map(|(name, _)| name.clone())
    }

    /// The cache has seen the PV `name` (or its deletion): it answers from
    /// now on.
    pub fn seen(&self, name: &str) {
        let mut saved = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if saved.remove(name).is_some() {
            crate::metrics::set_remembered("saved_volumes", saved.len());
        }
    }
}

/// Everything a worker needs.
pub struct Context {
    pub client: Client,
    pub driver: Driver,
    pub config: ProvisionerConfig,
    pub caches: Arc<Caches>,
    pub recorder: Arc<Recorder>,
    /// The operations in flight and their journal.
    pub operations: Operations,
    pub claims: WorkQueue<ClaimKey>,
    pub volumes: WorkQueue<String>,
    /// PV uids whose backend volume is known deleted, so the update events
    /// that follow do not call `DeleteVolume` again (upstream #1235), nor
    /// send the finalizer removal again from a cache that has not seen it.
    pub deleted_volumes: Arc<Mutex<HashMap<String, DeletedVolume>>>,
    /// Finalizer changes the cache has not seen yet.
    pub finalizer_writes: Arc<FinalizerWrites>,
    /// PVs saved here that the cache has not shown yet.
    pub saved_volumes: Arc<SavedVolumes>,
    /// Told of each volume provisioned or deleted (capacity refresh).
    pub volume_events: Arc<crate::shared::VolumeEvents>,
    /// Node deployment: this node's Node and CSINode, planned with instead
    /// of the cluster's.
    pub local_topology: Option<Arc<LocalTopology>>,
    /// Claims held back after an infeasible `CreateVolume` (upstream's
    /// slow retry).
    pub infeasible: InfeasibleClaims,
    /// The attachment check before `DeleteVolume`, for drivers that
    /// attach volumes.
    attachments: Option<attached::Attachments>,
    /// Node deployment: claim uid → attempts to take it so far (the
    /// exponent of the wait before the next one).
    owner_attempts: Mutex<HashMap<String, u32>>,
    workers: usize,
    /// The journal store, loaded and started by [`Context::run`]: only
    /// then (after winning the leader election) is its content final, as a
    /// previous leader may have written to it until it stopped.
    unstarted_journal: Mutex<Option<(JournalStore, JournalInbox)>>,
    /// Set by [`Context::shut_down`]: workers take no new key.
    stopping: AtomicBool,
    worker_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// A worker task being waited for by [`Context::drained`], put back
/// for the next wait if this one is dropped first.
struct Unfinished<'a> {
    tasks: &'a Mutex<Vec<tokio::task::JoinHandle<()>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            self.tasks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(task);
        }
    }
}

impl Context {
    /// Counts an attempt to take claim `uid`; returns how many came before.
    pub fn next_owner_attempt(&self, uid: &str) -> u32 {
        let mut attempts = self
            .owner_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let count = attempts.entry(uid.to_owned()).or_insert(0);
        let before = *count;
        *count = count.saturating_add(1);
        before
    }

    /// Resets the attempts to take claim `uid` (taken, taken by another
    /// node, or gone).
    pub fn forget_owner_attempts(&self, uid: &str) {
        self.owner_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Reads a Secret's data as strings (CSI secrets are string maps).
    pub async fn secret_data(
        &self,
        secret: &SecretRef,
    ) -> Result<HashMap<String, String>, kube::Error> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &secret.namespace);
        let found = api.get(&secret.name).await?;
        let mut data: HashMap<String, String> = found
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect();
        for (k, v) in found.string_data.unwrap_or_default() {
            data.insert(k, v);
        }
        Ok(data)
    }
}

impl crate::snapshot_sweep::RestoresInFlight for Context {
    fn snapshot_ids(&self) -> std::collections::BTreeSet<String> {
        self.operations.snapshot_sources()
    }

    fn source_finalizers(&self) -> &tokio::sync::Mutex<()> {
        self.operations.source_finalizers()
    }
}

/// Whether `claim` names the class `class_name` and has no volume yet: a
/// claim the class's arrival may let go on.
pub fn waits_for_class(claim: &PersistentVolumeClaim, class_name: &str) -> bool {
    crate::provision::claim_class_name(claim) == class_name
        && claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty)
}

/// Prepares provisioning: registers the cache handlers. Makes no API call,
/// so it may run before the leader election is won. Call [`Context::run`]
/// once the caches are filled and this process leads.
pub async fn new(
    shared: &Shared,
    driver: Driver,
    config: ProvisionerConfig,
    journal_namespace: &str,
) -> Result<Arc<Context>, journal::JournalError> {
    let caches = Arc::clone(&shared.caches);
    let mut kinds = vec![Kind::Claims, Kind::Volumes, Kind::Classes];
    // Only drivers that attach volumes have VolumeAttachments to wait for
    // (upstream watches them only then too).
    if config.capabilities.publish_unpublish_volume {
        kinds.push(Kind::Attachments);
    }
    // In node mode the topology is this node's own (upstream does not
    // watch Nodes there either: they generate much traffic).
    let local_topology = config
        .node_deployment
        .as_ref()
        .map(|node| Arc::new(LocalTopology::new(&config.driver_name, node)));
    if config.topology_enabled && local_topology.is_none() {
        kinds.extend([Kind::Nodes, Kind::CsiNodes]);
    }
    if config.volume_attributes_class_enabled && config.volume_attributes_classes_watched {
        kinds.push(Kind::AttributesClasses);
    }
    if config.cross_namespace_data_source && config.reference_grants_readable {
        kinds.push(Kind::ReferenceGrants);
    }
    caches.want(&kinds);
    let claims = WorkQueue::new("claims", shared.backoff);
    let volumes = WorkQueue::new("volumes", shared.backoff);

    // A claim that arrived before its StorageClass waits for it
    // (`SkipReason::StorageClassNotFound`, retried with backoff): provision
    // it when the class arrives rather than at its next retry, which may
    // be minutes away after a few.
    {
        let queue = claims.clone();
        let claims_store = caches.claims.store();
        let filter_config = config.clone();
        caches.classes.on_change(move |change| {
            let Change::Applied(class) = change else {
                return;
            };
            let Some(class_name) = class.metadata.name.as_deref() else {
                return;
            };
            for claim in claims_store.state() {
                if waits_for_class(&claim, class_name)
                    && is_annotated_for_us(&claim, &filter_config)
                    && let Some(key) = ClaimKey::of(&claim)
                {
                    queue.add(key);
                }
            }
        });
    }

    // A ReferenceGrant created or changed may allow a claim that was
    // refused: retry the waiting claims whose source lives in the grant's
    // namespace now rather than after their backoff.
    if config.cross_namespace_data_source && config.reference_grants_readable {
        let queue = claims.clone();
        let claims_store = caches.claims.store();
        caches.reference_grants.on_change(move |change| {
            let grant = match change {
                Change::Applied(grant) | Change::Deleted(grant) => grant,
            };
            let Some(namespace) = grant.metadata.namespace.as_deref() else {
                return;
            };
            for claim in claims_store.state() {
                let waiting = claim
                    .spec
                    .as_ref()
                    .is_some_and(|s| s.volume_name.as_deref().unwrap_or_default().is_empty());
                let refers_here = claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.data_source_ref.as_ref())
                    .and_then(|r| r.namespace.as_deref())
                    == Some(namespace);
                if waiting
                    && refers_here
                    && let Some(key) = ClaimKey::of(&claim)
                {
                    queue.add(key);
                }
            }
        });
    }

    let store = JournalStore::new(
        shared.client.clone(),
        journal_namespace,
        &journal_owner(&config.driver_name, config.node_deployment.as_ref()),
    )
    .with_backlog({
        let queue = claims.clone();
        let workers = shared.workers;
        std::sync::Arc::new(move || journal::backlog_of(queue.len(), queue.in_flight(), workers))
    });
    let (journal, inbox) = journal::channel();

    {
        let queue = claims.clone();
        let filter_config = config.clone();
        let claims_store = caches.claims.store();
        caches.claims.on_change(move |change| {
            let claim = match change {
                Change::Applied(claim) => {
                    // Cheap filter: only claims annotated for us (or for
                    // an in-tree plugin that migrates to us), or being
                    // finished after deletion, which the Deleted arm covers.
                    if !is_annotated_for_us(claim, &filter_config) {
                        return;
                    }
                    claim
                }
                Change::Deleted(claim) => claim,
            };
            if let Some(key) = ClaimKey::of(claim) {
                queue.add(key);
            }
            // A clone that is bound or gone may free its source of the
            // cloning-protection finalizer: look at the source again.
            if let Some(source) = claims::clone_source_name(claim)
                && let Some(namespace) = claim.namespace()
                && let Some(source) = claims_store.get(&ObjectRef::new(&source).within(&namespace))
                && let Some(key) = ClaimKey::of(&source)
            {
                queue.add(key);
            }
        });
    }
    // PV uids whose backend volume is known deleted; a PV that is gone is
    // forgotten here and in the event filter, so neither grows with the
    // number of PVs ever deleted (docs/design.md, hazard 12).
    let deleted_volumes: Arc<Mutex<HashMap<String, DeletedVolume>>> = Arc::default();
    let finalizer_writes: Arc<FinalizerWrites> = Arc::default();
    let saved_volumes: Arc<SavedVolumes> = Arc::default();
    {
        let finalizer_writes = Arc::clone(&finalizer_writes);
        let saved_volumes = Arc::clone(&saved_volumes);
        let queue = volumes.clone();
        let config = config.clone();
        let deleted_volumes = Arc::clone(&deleted_volumes);
        let recorder = Arc::clone(&shared.recorder);
        caches.volumes.on_change(move |change| match change {
            Change::Applied(pv) => {
                saved_volumes.seen(&pv.name_any());
                // Node mode: other nodes' PVs are theirs to manage (their
                // finalizer and deletion), so N nodes do not race on each.
                if is_our_volume(pv, &config) && volume_on_this_node(pv, &config) {
                    queue.add(pv.name_any());
                }
            }
            Change::Deleted(pv) => {
                saved_volumes.seen(&pv.name_any());
                queue.forget(&pv.name_any());
                if let Some(uid) = pv.uid() {
                    let mut deleted = deleted_volumes.lock().unwrap_or_else(|p| p.into_inner());
                    deleted.remove(&uid);
                    crate::metrics::set_remembered("deleted_volumes", deleted.len());
                    finalizer_writes.forget(&uid);
                    recorder.forget(&uid);
                }
            }
        });
    }

    let attachments = config.capabilities.publish_unpublish_volume.then(|| {
        attached::Attachments::new(
            &caches.attachments,
            shared.client.clone(),
            &config.driver_name,
        )
    });

    let ctx = Arc::new(Context {
        attachments,
        recorder: Arc::clone(&shared.recorder),
        client: shared.client.clone(),
        driver,
        config,
        caches,
        operations: Operations::new(journal),
        claims: claims.clone(),
        volumes: volumes.clone(),
        deleted_volumes,
        finalizer_writes,
        saved_volumes,
        volume_events: Arc::clone(&shared.volume_events),
        local_topology,
        infeasible: InfeasibleClaims::new(shared.backoff.max),
        owner_attempts: Mutex::default(),
        workers: shared.workers.max(1),
        unstarted_journal: Mutex::new(Some((store, inbox))),
        stopping: AtomicBool::new(false),
        worker_tasks: Mutex::default(),
    });
    Ok(ctx)
}

/// Reads the journal, asking again while the API server cannot answer:
/// an API server restarting while the sidecar starts (chaos seed 141 on the
/// real cluster) would otherwise end the process and leave provisioning to
/// the kubelet's restart back-off. RBAC's refusal is final (the caller runs
/// without the journal), as is a shutdown or a lost lease (the caller's
/// `select!`).
async fn load_journal(
    store: &mut JournalStore,
) -> Result<std::collections::BTreeMap<String, journal::JournalEntry>, journal::JournalError> {
    const BACKOFF: Backoff = Backoff {
        start: Duration::from_millis(500),
        max: Duration::from_secs(30),
    };
    let mut failures = 0;
    loop {
        match store.load().await {
            Err(e) if !e.is_forbidden() => {
                let delay = BACKOFF.delay(failures);
                failures += 1;
                tracing::warn!(
                    journal = %format!("{}/{}", store.namespace(), store.name()),
                    error = %e,
                    ?delay,
                    "cannot read the write-ahead journal; provisioning waits for it"
                );
                tokio::time::sleep(delay).await;
            }
            loaded => return loaded,
        }
    }
}

impl Context {
    /// Loads the journal, resumes every operation a previous run (or a
    /// previous leader) may have left on the backend, and starts the
    /// workers (`--worker-threads` per queue). Call once.
    pub async fn run(self: &Arc<Self>) -> Result<(), journal::JournalError> {
        if self.resume().await? {
            self.start_workers();
        }
        Ok(())
    }

    /// What [`run`](Self::run) does before it starts the workers: loads the
    /// journal, starts its writer and queues every operation it holds.
    /// `false` when that was done already. For a caller that runs the
    /// workers' steps itself ([`claims::process`], [`volumes::process`]):
    /// the cancellation harness, `tests/cancellation.rs`.
    pub async fn resume(self: &Arc<Self>) -> Result<bool, journal::JournalError> {
        let Some((mut store, inbox)) = self
            .unstarted_journal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Ok(false);
        };
        let recovered = match load_journal(&mut store).await {
            Ok(recovered) => {
                crate::metrics::set_capability("journal", true);
                store.start_with(inbox);
                recovered
            }
            Err(e) if e.is_forbidden() => {
                crate::metrics::set_capability("journal", false);
                tracing::warn!(
                    journal = %format!("{}/{}", store.namespace(), store.name()),
                    error = %e,
                    "running WITHOUT the write-ahead journal: RBAC does not allow list, create, update and delete of configmaps in this namespace (the upstream sidecar's stock rules do not). \
                     Provisioning and deletion work as with the upstream sidecar, but a claim deleted while its CreateVolume is in flight across a restart of this sidecar can leak its volume (upstream issue #486). \
                     Grant the configmaps rule of deploy/kubernetes/base/rbac.yaml to turn the journal on"
                );
                JournalStore::start_disabled(inbox);
                std::collections::BTreeMap::new()
            }
            Err(e) => return Err(e),
        };
        for claim in self.operations.resume(recovered) {
            self.claims.add(claim);
        }
        // Only now, leading with the journal loaded, is what waits known.
        slo::report_backlogs(self);
        Ok(true)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Starts the workers (part of [`run`](Self::run); call once, after
    /// [`resume`](Self::resume)). Unlike the embedded loops', they stop at
    /// the first key they take after [`shut_down`](Self::shut_down) rather
    /// than drain the queue: what is left is in the API server and the
    /// journal.
    pub fn start_workers(self: &Arc<Self>) {
        let stopped = {
            let ctx = Arc::clone(self);
            move || ctx.stopping()
        };
        let ctx = Arc::clone(self);
        let mut tasks = self
            .claims
            .run_workers_until(self.workers, stopped.clone(), move |key| {
                let ctx = Arc::clone(&ctx);
                async move { claims::process(&ctx, &key).await }
            });
        let ctx = Arc::clone(self);
        tasks.extend(
            self.volumes
                .run_workers_until(self.workers, stopped, move |name| {
                    let ctx = Arc::clone(&ctx);
                    async move { volumes::process(&ctx, &name).await }
                }),
        );
        self.worker_tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(tasks);
    }

    /// Stops taking work: queued keys are left (their state is in the API
    /// and the journal, so the next run or leader picks them up);
    /// operations under way finish.
    pub fn shut_down(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.claims.shut_down();
        self.volumes.shut_down();
    }

    /// Completes when every worker has finished its current key (after
    /// [`shut_down`](Self::shut_down)). Cancel-safe: dropped before that
    /// (the shutdown grace is over), the workers still running are waited
    /// for again by the next call, as the journal's last flush does
    /// (src/startup.rs).
    pub async fn drained(&self) {
        loop {
            let next = self
                .worker_tasks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop();
            let Some(task) = next else {
                return;
            };
            let mut waiting = Unfinished {
                tasks: &self.worker_tasks,
                task: Some(task),
            };
            if let Some(task) = waiting.task.as_mut() {
                let _ = task.await;
            }
            waiting.task = None;
        }
    }

    /// Writes the journal's removals still waiting for their lazy write
    /// (see [`journal::Journal::flush`]); for a graceful shutdown, after
    /// [`drained`](Self::drained). Without it an entry whose PV was saved
    /// in the last seconds stays in the journal and every later start
    /// replays it (docs/design.md, hazard 14).
    ///
    /// Operations whose PV is saved but that no worker finished (resumed
    /// from the journal, or queued when the workers stopped taking keys)
    /// are forgotten first.
    pub async fn flush_journal(&self) -> Result<(), journal::JournalError> {
        self.prune_saved();
        self.operations.flush().await
    }

    /// Forgets every operation in flight whose PV (as the cache has it)
    /// records its claim: the PV owns the volume, the journal entry is
    /// done.
    fn prune_saved(&self) {
        let volumes = self.caches.volumes.store();
        for (uid, name) in self.operations.volume_names() {
            if volumes
                .get(&ObjectRef::new(&name))
                .is_some_and(|pv| claims::claim_uid_of(&pv) == Some(uid.as_str()))
            {
                tracing::debug!(claim_uid = %uid, volume = %name, "operation done: its PV is saved");
                self.operations.finish(&uid);
            }
        }
    }
}

#[cfg(test)]
mod saved_volumes_tests {
    use super::{SAVED_VOLUME_MEMORY, SavedVolumes};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_saved_pv_counts_until_the_cache_shows_it_or_its_memory_ends() {
        let saved = SavedVolumes::default();
        assert!(!saved.records("pvc-1", "u1"), "nothing saved yet");
        saved.saved("pvc-1", "u1");
        assert!(saved.records("pvc-1", "u1"));
        assert_eq!(saved.saved_for("u1").as_deref(), Some("pvc-1"));
        assert!(!saved.records("pvc-1", "u2"), "another claim of the name");
        assert!(!saved.records("pvc-2", "u1"), "another name");
        assert_eq!(saved.saved_for("u2"), None);
        saved.seen("pvc-1");
        assert!(!saved.records("pvc-1", "u1"), "the cache answers now");
        assert_eq!(saved.saved_for("u1"), None);

        saved.saved("pvc-3", "u3");
        tokio::time::advance(SAVED_VOLUME_MEMORY - Duration::from_secs(1)).await;
        assert!(saved.records("pvc-3", "u3"), "still within its memory");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!saved.records("pvc-3", "u3"), "a lag that long is no lag");
        assert_eq!(saved.saved_for("u3"), None);
        saved.saved("pvc-4", "u4");
        assert_eq!(
            saved.0.lock().map(|m| m.len()).unwrap_or_default(),
            1,
            "an entry past its memory goes with the next save"
        );
    }
}

#[cfg(test)]
mod finalizer_writes_tests {
    use super::FinalizerWrites;

    #[test]
    fn a_change_is_not_sent_twice_from_the_same_state() {
        let writes = FinalizerWrites::default();
        assert!(!writes.written("u1", "7"), "nothing written yet");
        writes.wrote("u1", "7");
        assert!(writes.written("u1", "7"), "the cache still shows version 7");
        assert!(!writes.written("u2", "7"), "another PV");
        assert!(!writes.written("u1", "8"), "the cache moved on");
        assert!(
            !writes.written("u1", "7"),
            "the entry went when it moved on"
        );
        writes.wrote("u1", "9");
        writes.forget("u1");
        assert!(!writes.written("u1", "9"), "the PV went");
    }
}

#[cfg(test)]
mod waiting_claims_tests {
    use super::claims::is_pending_clone_of;
    use super::waits_for_class;
    use crate::provision::fixtures::claim;

    fn with(spec: serde_json::Value) -> crate::projection::PersistentVolumeClaim {
        let mut claim = claim();
        claim.spec = Some(serde_json::from_value(spec).expect("spec"));
        claim
    }

    #[test]
    fn a_class_arriving_wakes_the_claims_that_wait_for_it() {
        let waiting = with(serde_json::json!({"storageClassName": "fast"}));
        assert!(waits_for_class(&waiting, "fast"));
        assert!(!waits_for_class(&waiting, "slow"), "another class");
        let bound = with(serde_json::json!({"storageClassName": "fast", "volumeName": "pv-1"}));
        assert!(!waits_for_class(&bound, "fast"), "already has its volume");
    }

    #[test]
    fn a_pending_clone_is_one_of_this_source_not_yet_bound_nor_deleted() {
        let clone = with(
            serde_json::json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}),
        );
        assert!(is_pending_clone_of(&clone, "ns", "src"));
        assert!(
            !is_pending_clone_of(&clone, "other-ns", "src"),
            "same name elsewhere"
        );
        assert!(
            !is_pending_clone_of(&clone, "ns", "another"),
            "another source"
        );
        let bound = with(serde_json::json!({
            "dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}, "volumeName": "pv"}));
        assert!(!is_pending_clone_of(&bound, "ns", "src"), "provisioned");
        let mut deleted = clone.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!is_pending_clone_of(&deleted, "ns", "src"), "being deleted");
        let by_ref = with(serde_json::json!({
            "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "src"}}));
        assert!(is_pending_clone_of(&by_ref, "ns", "src"));
        let snapshot = with(serde_json::json!({
            "dataSource": {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "src"}}));
        assert!(
            !is_pending_clone_of(&snapshot, "ns", "src"),
            "a restore is no clone"
        );
    }
}
