//! The PV worker: reads one PV, its class and its claim from the caches,
//! asks [`decide`](super::decide) and writes the result. A write that rests
//! on the class or the claim is decided again from a live read of that one
//! object first ([`decide::live_read`]): their watches are not ordered with
//! the PV's.

use std::sync::Arc;

use crate::projection::{PersistentVolume, PersistentVolumeClaim, StorageClass, Wire};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use super::Releaser;
use super::decide::{self, Verdict};
use crate::events::EventType;
use crate::wellknown as wk;

/// Why a PV is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{what}: the PV changed since it was read (conflict)")]
    Conflict { what: &'static str },
    #[error("{what}: {source}")]
    Api {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// Processes one PV name; schedules its own retries.
pub async fn process(ctx: &Arc<Releaser>, name: &str) {
    let key = name.to_owned();
    match reconcile(ctx, name).await {
        Ok(()) => ctx.queue.forget(&key),
        Err(e) => {
            let delay = ctx.queue.add_rate_limited(key);
            tracing::warn!(volume = %name, error = %e, retry_in = ?delay, "PV releaser: retrying");
        }
    }
}

async fn reconcile(ctx: &Releaser, name: &str) -> Result<(), ReleaseError> {
    let Some(pv) = ctx.caches.volumes.store().get(&ObjectRef::new(name)) else {
        tracing::debug!(volume = %name, "PV releaser: PV gone, nothing to do");
        return Ok(());
    };
    let class = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.storage_class_name.as_deref())
        .filter(|class| !class.is_empty())
        .and_then(|class| ctx.caches.classes.store().get(&ObjectRef::new(class)));
    let cached_claim = decide::claim_ref_name(&pv).and_then(|(namespace, claim)| {
        ctx.caches
            .claims
            .store()
            .get(&ObjectRef::new(claim).within(namespace))
    });
    // A managed claim deleted before this PV was associated (mod.rs).
    let departed = ctx
        .departed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(name)
        .cloned();
    let claim = decide::claim_to_decide_with(&pv, cached_claim.as_deref(), departed.as_deref());
    let resource_version = pv.metadata.resource_version.clone().unwrap_or_default();
    let id = ctx.config.controller_id.as_str();
    {
        let mut written_from = ctx.written_from.lock().unwrap_or_else(|p| p.into_inner());
        if written_from.get(name) == Some(&resource_version) {
            tracing::debug!(volume = %name, "PV releaser: the cache has not seen our last write yet");
            return Ok(());
        }
        written_from.remove(name);
    }

    let cached_verdict = decide::decide(&pv, class.as_deref(), claim, &ctx.config);
    let inputs = Inputs {
        class: class.as_deref(),
        claim,
        departed: departed.as_deref(),
    };
    let verdict = decide_live(ctx, &pv, &cached_verdict, inputs)
        .await?
        .unwrap_or_else(|| cached_verdict.clone());
    if departed.is_some() && !decide::keep_departed(&verdict) {
        ctx.departed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }
    if !decide::confirmed(&cached_verdict, &verdict) {
        tracing::info!(volume = %name, cached = ?cached_verdict, live = ?verdict, "PV releaser: the cache has not seen a change of the class or claim yet; not writing (its event queues the PV again)");
        return Ok(());
    }
    match verdict {
        Verdict::NotOurs => {
            tracing::debug!(volume = %name, "PV releaser: not a PV of this driver, ignored");
            Ok(())
        }
        Verdict::Malformed => {
            tracing::warn!(volume = %name, "PV releaser: PV without name or resourceVersion, ignored");
            Ok(())
        }
        Verdict::BeingDeleted => {
            tracing::debug!(volume = %name, "PV releaser: being deleted, left alone");
            Ok(())
        }
        Verdict::OtherController { id: other } => {
            tracing::debug!(volume = %name, controller_id = %other, "PV releaser: labelled for another controller, ignored");
            Ok(())
        }
        Verdict::NotAssociated => {
            tracing::debug!(volume = %name, "PV releaser: not associated with controller {id}");
            Ok(())
        }
        Verdict::NotReleased { association } => {
            tracing::debug!(volume = %name, ?association, "PV releaser: associated, not Released with a claim reference");
            Ok(())
        }
        Verdict::Associate => {
            tracing::info!(volume = %name, claim = ?decide::claim_ref_name(&pv), "PV releaser: claim is managed by controller {id}, labelling its PV");
            patch(
                ctx,
                name,
                decide::associate_patch(&resource_version, id),
                "associate",
            )
            .await
        }
        Verdict::RefuseDeletePolicy => {
            tracing::info!(volume = %name, "PV releaser: not releasing, reclaim policy is Delete (the provisioner deletes it)");
            ctx.recorder
                .record(
                    &*pv,
                    EventType::Warning,
                    wk::REASON_ERR_RELEASE_PV,
                    decide::DELETE_POLICY_MESSAGE,
                )
                .await;
            Ok(())
        }
        Verdict::Release {
            association,
            remove_label,
        } => {
            tracing::info!(volume = %name, claim = ?decide::claim_ref_name(&pv), ?association, "PV releaser: releasing (removing the claim reference)");
            let result = patch(
                ctx,
                name,
                decide::release_patch(&resource_version, remove_label),
                "release",
            )
            .await;
            match &result {
                Ok(()) => {
                    ctx.recorder
                        .record(
                            &*pv,
                            EventType::Normal,
                            wk::REASON_RELEASED,
                            &decide::released_message(&pv, id),
                        )
                        .await;
                }
                // A conflict is the cache lagging, not a failure to report.
                Err(ReleaseError::Conflict { .. }) => {}
                Err(e) => {
                    ctx.recorder
                        .record(
                            &*pv,
                            EventType::Warning,
                            wk::REASON_ERR_RELEASE_PV,
                            &format!("Failed to release: {e}"),
                        )
                        .await;
                }
            }
            result
        }
    }
}

/// What a PV was decided with, from the caches.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    class: Option<&'a StorageClass>,
    /// [`decide::claim_to_decide_with`] of the cached and the departed claim.
    claim: Option<&'a PersistentVolumeClaim>,
    departed: Option<&'a PersistentVolumeClaim>,
}

/// The verdict decided again with the live state of what `verdict` rests on
/// besides the PV ([`decide::live_read`]): one GET of the class, or of the
/// claim the claimRef names. `None` when the verdict needs no live read.
/// A claim that is gone (404) or replaced by another uid leaves the departed
/// claim's last state, as in the cached decision.
async fn decide_live(
    ctx: &Releaser,
    pv: &PersistentVolume,
    verdict: &Verdict,
    cached: Inputs<'_>,
) -> Result<Option<Verdict>, ReleaseError> {
    let Some(read) = decide::live_read(pv, verdict) else {
        return Ok(None);
    };
    let again = match read {
        decide::LiveRead::Class(class_name) => {
            let live = if class_name.is_empty() {
                None
            } else {
                Api::<StorageClass>::all(ctx.client.clone())
                    .get_opt(class_name)
                    .await
                    .map_err(|source| ReleaseError::Api {
                        what: "read the class",
                        source,
                    })?
            };
            decide::decide(pv, live.as_ref(), cached.claim, &ctx.config)
        }
        decide::LiveRead::Claim { namespace, name } => {
            let live: Option<PersistentVolumeClaim> = if namespace.is_empty() || name.is_empty() {
                None
            } else {
                Api::<Wire<PersistentVolumeClaim>>::namespaced(ctx.client.clone(), namespace)
                    .get_opt(name)
                    .await
                    .map_err(|source| ReleaseError::Api {
                        what: "read the claim",
                        source,
                    })?
                    .map(Into::into)
            };
            let claim = decide::claim_to_decide_with(pv, live.as_ref(), cached.departed);
            decide::decide(pv, cached.class, claim, &ctx.config)
        }
    };
    Ok(Some(again))
}

/// Applies a merge patch guarded by the resourceVersion the verdict was made
/// from. 409: the PV changed, retry from the newer cache; 404: gone, done.
async fn patch(
    ctx: &Releaser,
    name: &str,
    body: serde_json::Value,
    what: &'static str,
) -> Result<(), ReleaseError> {
    let api: Api<crate::projection::Wire<PersistentVolume>> = Api::all(ctx.client.clone());
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => {
            tracing::debug!(volume = %name, "PV releaser: {what}: done");
            if let Some(from) = body["metadata"]["resourceVersion"].as_str() {
                ctx.written_from
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.to_owned(), from.to_owned());
            }
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {
            tracing::debug!(volume = %name, "PV releaser: {what}: PV gone");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Err(ReleaseError::Conflict { what }),
        Err(source) => Err(ReleaseError::Api { what, source }),
    }
}
