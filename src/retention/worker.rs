//! The set worker: plans one StatefulSet from the caches with
//! [`decide`](super::decide), then writes each claim's owner references or
//! deletes a condemned claim, after the live reads that guard each write.

use std::collections::HashMap;
use std::sync::Arc;

use crate::projection::StatefulSet;
use crate::projection::StorageClass;
use crate::projection::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;

use super::decide::{self, ClaimPlan, Decision, SetSkip};
use super::{Context, SetKey, template_names};

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

impl Context {
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
