//! StatefulSet PVC retention (gate `StatefulSetAutoDeletePVC`, KEP-1847):
//! the controller-manager's owner references on the claims of
//! StatefulSets whose claim templates are for this driver, so that the
//! garbage collector deletes a claim with its set (whenDeleted=Delete) or
//! with its scaled-down pod (whenScaled=Delete).
//!
//! - [`decide`]: the pure decisions, per set and per claim
//!   ([`decide::plan_set`]): wanted owner references, a direct deletion, or
//!   leave it alone.
//! - this file: the I/O. One queue of StatefulSet keys, fed by StatefulSet,
//!   pod, claim and StorageClass events and a periodic resync. A worker
//!   plans a set from the shared caches and then, per claim, patches only
//!   `metadata.ownerReferences` (JSON patch guarded by `test`) or deletes a
//!   condemned claim whose pod is gone, after re-reading the set and the
//!   pod live.
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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::projection::StatefulSet;
use crate::projection::StorageClass;
use crate::projection::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};

use crate::caches::{Caches, Kind};
use crate::informer::Change;
use crate::queue::WorkQueue;
use crate::shared::{EmbeddedLoop, Shared};

use decide::{ClaimPlan, Decision, SetSkip};

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

/// What can go wrong while reconciling a set; each one retries the set with
/// backoff.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error("claim {claim}: owner references not updated: {source}")]
    Patch {
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("claim {claim}: changed since it was read; deciding again")]
    Stale { claim: String },
    #[error("claim {claim}: not deleted: {source}")]
    Delete {
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("StatefulSet {set}: cannot re-read it before deleting claim {claim}: {source}")]
    ReadSet {
        set: String,
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("pod {pod}: cannot re-read it before deleting claim {claim}: {source}")]
    ReadPod {
        pod: String,
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} {owner}: cannot confirm it live before claim {claim} references it: {source}")]
    ReadOwner {
        kind: String,
        owner: String,
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("claim {claim}: internal error building the patch: {source}")]
    BadPatch {
        claim: String,
        #[source]
        source: serde_json::Error,
    },
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

    /// Reconciles one set from the caches; retries it with backoff when a
    /// write failed.
    pub async fn process(&self, key: &SetKey) {
        match self.reconcile(key).await {
            Ok(()) => self.queue.forget(key),
            Err(errors) => {
                for e in &errors {
                    match e {
                        RetentionError::Stale { .. } => {
                            tracing::debug!(statefulset = %key, "{e}")
                        }
                        _ => tracing::warn!(statefulset = %key, "{e}"),
                    }
                }
                let delay = self.queue.add_rate_limited(key.clone());
                tracing::debug!(statefulset = %key, ?delay, "retrying");
            }
        }
    }

    async fn reconcile(&self, key: &SetKey) -> Result<(), Vec<RetentionError>> {
        let Some(set) = self
            .caches
            .stateful_sets
            .store()
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
        else {
            tracing::debug!(statefulset = %key, "StatefulSet gone; nothing to do");
            return Ok(());
        };
        let claims: Vec<Arc<PersistentVolumeClaim>> = self
            .caches
            .claims
            .store()
            .state()
            .into_iter()
            .filter(|c| c.metadata.namespace.as_deref() == Some(key.namespace.as_str()))
            .collect();
        let claim_refs: Vec<&PersistentVolumeClaim> = claims.iter().map(|c| &**c).collect();
        let classes: Vec<Arc<StorageClass>> = self.caches.classes.store().state();
        let class_refs: Vec<&StorageClass> = classes.iter().map(|c| &**c).collect();
        // The pods the set's claims belong to, by name.
        let pods = self.caches.pods.store();
        let members: HashMap<String, Arc<Pod>> = claim_refs
            .iter()
            .filter_map(|c| {
                let ordinal =
                    decide::claim_ordinal(&c.name_any(), &key.name, template_names(&set))?;
                let name = decide::pod_name(&key.name, ordinal);
                let pod = pods.get(&ObjectRef::new(&name).within(&key.namespace))?;
                Some((name, pod))
            })
            .collect();
        let lookup = |name: &str| members.get(name).map(|p| &**p);
        let plans = match decide::plan_set(
            &set,
            &claim_refs,
            lookup,
            &class_refs,
            &self.driver_name,
        ) {
            Ok(plans) => plans,
            Err(SetSkip::NoTemplateForDriver) => {
                tracing::debug!(statefulset = %key, "leaving the StatefulSet alone: {}", SetSkip::NoTemplateForDriver);
                return Ok(());
            }
            Err(skip) => {
                tracing::info!(statefulset = %key, "leaving the claims of the StatefulSet alone: {skip}");
                return Ok(());
            }
        };
        let policy = decide::Policy::of(&set);
        let mut errors = Vec::new();
        for plan in plans {
            let Some(claim) = claim_refs
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(plan.claim.as_str()))
            else {
                continue;
            };
            if let Err(e) = self.apply(key, &plan, claim, policy).await {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    async fn apply(
        &self,
        key: &SetKey,
        plan: &ClaimPlan,
        claim: &PersistentVolumeClaim,
        policy: decide::Policy,
    ) -> Result<(), RetentionError> {
        let name = format!("{}/{}", key.namespace, plan.claim);
        match &plan.decision {
            Decision::UpToDate => {
                tracing::debug!(claim = %name, statefulset = %key, %policy, condemned = plan.condemned, "owner references up to date");
                Ok(())
            }
            Decision::Leave(reason) => {
                tracing::debug!(claim = %name, statefulset = %key, "leaving the claim alone: {reason}");
                Ok(())
            }
            Decision::SetOwnerReferences(wanted) => {
                let current = claim
                    .metadata
                    .owner_references
                    .as_deref()
                    .unwrap_or_default();
                // Caches of different kinds are not ordered: the claim's
                // cache may already show the garbage collector stripping
                // the references of a set deleted with orphan propagation
                // while the set's cache still shows it alive. A reference
                // added now to a set about to vanish would make the
                // collector delete the claim. So every owner that a patch
                // adds is confirmed live first (writes are rare; reads are
                // cheap).
                if let Some(reason) = self.new_owner_not_live(&name, current, wanted).await? {
                    tracing::info!(claim = %name, statefulset = %key, "not adding owner references yet: {reason}");
                    return Ok(());
                }
                // A pod reference condemns the claim to go with its pod. The
                // cache may show the pod of a scale-up before the scale-up
                // itself: confirm with the live set that the ordinal is
                // still out of range (docs/design.md, hazard 6).
                let adds_pod = wanted
                    .iter()
                    .any(|w| w.kind == "Pod" && !current.iter().any(|c| c.uid == w.uid));
                if adds_pod && !self.live_set_condemns(key, plan, &name).await? {
                    tracing::info!(claim = %name, statefulset = %key, ordinal = plan.ordinal, "not making the pod own the claim: the live StatefulSet does not condemn its ordinal");
                    return Ok(());
                }
                tracing::info!(
                    claim = %name, statefulset = %key, %policy, condemned = plan.condemned,
                    from = %describe(current), to = %describe(wanted),
                    "updating the claim's owner references"
                );
                self.patch_owner_references(&name, claim, current, wanted)
                    .await
            }
            Decision::DeleteClaim => self.delete_condemned(key, plan, claim, &name).await,
        }
    }

    /// Whether the StatefulSet, read live, still puts `plan`'s ordinal out of
    /// range (a set that is gone condemns nothing).
    async fn live_set_condemns(
        &self,
        key: &SetKey,
        plan: &ClaimPlan,
        claim: &str,
    ) -> Result<bool, RetentionError> {
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), &key.namespace);
        match sets.get_opt(&key.name).await {
            Ok(Some(set)) => Ok(decide::Ordinals::of(&set).condemned(plan.ordinal)),
            Ok(None) => Ok(false),
            Err(source) => Err(RetentionError::ReadSet {
                set: key.to_string(),
                claim: claim.to_owned(),
                source,
            }),
        }
    }

    /// Why an owner reference that `wanted` adds must not be written now
    /// (its owner is gone, replaced, or being deleted, as read live), or
    /// `None` when every new owner is alive.
    async fn new_owner_not_live(
        &self,
        claim: &str,
        current: &[OwnerReference],
        wanted: &[OwnerReference],
    ) -> Result<Option<String>, RetentionError> {
        let namespace = claim.split('/').next().unwrap_or_default();
        for owner in wanted
            .iter()
            .filter(|w| !current.iter().any(|c| c.uid == w.uid))
        {
            let read = match owner.kind.as_str() {
                "StatefulSet" => Api::<StatefulSet>::namespaced(self.client.clone(), namespace)
                    .get_opt(&owner.name)
                    .await
                    .map(|o| o.map(|o| (o.metadata.uid, o.metadata.deletion_timestamp.is_some()))),
                "Pod" => Api::<Pod>::namespaced(self.client.clone(), namespace)
                    .get_opt(&owner.name)
                    .await
                    .map(|o| o.map(|o| (o.metadata.uid, o.metadata.deletion_timestamp.is_some()))),
                _ => continue,
            };
            let live = read.map_err(|source| RetentionError::ReadOwner {
                kind: owner.kind.clone(),
                owner: format!("{namespace}/{}", owner.name),
                claim: claim.to_owned(),
                source,
            })?;
            match live {
                None => return Ok(Some(format!("{} {} is gone", owner.kind, owner.name))),
                Some((uid, _)) if uid.as_deref() != Some(owner.uid.as_str()) => {
                    return Ok(Some(format!("{} {} was replaced", owner.kind, owner.name)));
                }
                Some((_, true)) => {
                    return Ok(Some(format!(
                        "{} {} is being deleted",
                        owner.kind, owner.name
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(None)
    }

    async fn patch_owner_references(
        &self,
        name: &str,
        claim: &PersistentVolumeClaim,
        current: &[OwnerReference],
        wanted: &[OwnerReference],
    ) -> Result<(), RetentionError> {
        let patch = decide::owner_references_patch(
            claim.metadata.uid.as_deref().unwrap_or_default(),
            claim
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or_default(),
            current,
            wanted,
        );
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(|source| RetentionError::BadPatch {
                claim: name.to_owned(),
                source,
            })?;
        let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
            Api::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
        match api
            .patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            // Gone: nothing left to own.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            // A guard failed: the claim changed since the cache saw it; its
            // update event queues the set again with the fresh state.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => {
                Err(RetentionError::Stale {
                    claim: name.to_owned(),
                })
            }
            Err(source) => Err(RetentionError::Patch {
                claim: name.to_owned(),
                source,
            }),
        }
    }

    /// Deletes a condemned claim whose pod is gone, when the live set still
    /// condemns it and the pod is gone live too: the caches may not have
    /// seen a scale-up (or its new pod) yet, and deleting a claim a pod is
    /// about to use would lose its data.
    async fn delete_condemned(
        &self,
        key: &SetKey,
        plan: &ClaimPlan,
        claim: &PersistentVolumeClaim,
        name: &str,
    ) -> Result<(), RetentionError> {
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), &key.namespace);
        let live = match sets.get_opt(&key.name).await {
            Ok(Some(set)) => set,
            Ok(None) => {
                tracing::info!(claim = %name, statefulset = %key, "not deleting the claim: its StatefulSet is gone");
                return Ok(());
            }
            Err(source) => {
                return Err(RetentionError::ReadSet {
                    set: key.to_string(),
                    claim: name.to_owned(),
                    source,
                });
            }
        };
        // And the pod live: a pod the cache has not seen yet must not lose
        // its claim.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let pod_name = decide::pod_name(&key.name, plan.ordinal);
        let pod = pods
            .get_opt(&pod_name)
            .await
            .map_err(|source| RetentionError::ReadPod {
                pod: format!("{}/{pod_name}", key.namespace),
                claim: name.to_owned(),
                source,
            })?;
        // Decide again on the live set and pod, with the same claim.
        let classes: Vec<Arc<StorageClass>> = self.caches.classes.store().state();
        let class_refs: Vec<&StorageClass> = classes.iter().map(|c| &**c).collect();
        let again = decide::plan_set(
            &live,
            &[claim],
            |_| pod.as_ref(),
            &class_refs,
            &self.driver_name,
        );
        let still = matches!(&again, Ok(plans) if plans.iter().any(|p| p.decision == Decision::DeleteClaim));
        if !still {
            tracing::info!(claim = %name, statefulset = %key, live = ?again.map(|p| p.into_iter().map(|p| p.decision).collect::<Vec<_>>()), "not deleting the claim: the live StatefulSet and pod no longer call for it");
            return Ok(());
        }
        tracing::info!(
            claim = %name, statefulset = %key, policy = %decide::Policy::of(&live),
            ordinal = plan.ordinal, replicas = ?decide::Ordinals::of(&live),
            "deleting the claim: its ordinal was scaled down, whenScaled=Delete, and its pod is gone"
        );
        let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
            Api::namespaced(self.client.clone(), &key.namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&claim.name_any(), &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(RetentionError::Stale {
                claim: name.to_owned(),
            }),
            Err(source) => Err(RetentionError::Delete {
                claim: name.to_owned(),
                source,
            }),
        }
    }
}

/// `Kind/name(uid)[controller]` list, for log lines.
fn describe(refs: &[OwnerReference]) -> String {
    let items: Vec<String> = refs
        .iter()
        .map(|r| {
            format!(
                "{}/{}({}){}",
                r.kind,
                r.name,
                r.uid,
                if r.controller == Some(true) {
                    "[controller]"
                } else {
                    ""
                }
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}
