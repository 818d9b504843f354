//! The claim worker: reads one claim and what it depends on from the caches,
//! asks [`decide`](super::decide) and writes the result.

use std::sync::Arc;

use crate::projection::{PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use super::decide::{self, Confirmation, Verdict};
use super::{ClaimName, Protection};
use crate::provision::{add_finalizer_patch, claim_class_name, guard_uid, remove_finalizer_patch};
use crate::wellknown as wk;

/// Why a claim is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ProtectionError {
    #[error(transparent)]
    LiveList(#[from] super::live::LiveListError),
    #[error("{what}: the claim changed since it was read (conflict)")]
    Conflict { what: &'static str },
    #[error("{what}: {source}")]
    Api {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("internal: bad JSON patch for {what}: {source}")]
    BadPatch {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Processes one claim; schedules its own retries.
pub async fn process(ctx: &Arc<Protection>, key: &ClaimName) {
    match reconcile(ctx, key).await {
        Ok(()) => ctx.queue.forget(key),
        Err(e) => {
            let delay = ctx.queue.add_rate_limited(key.clone());
            tracing::warn!(claim = %key, error = %e, retry_in = ?delay, "PVC protection: retrying");
        }
    }
}

async fn reconcile(ctx: &Protection, key: &ClaimName) -> Result<(), ProtectionError> {
    let Some(claim) = ctx
        .caches
        .claims
        .store()
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
    else {
        tracing::debug!(claim = %key, "PVC protection: claim gone, nothing to do");
        return Ok(());
    };
    let class_name = claim_class_name(&claim);
    let class = (!class_name.is_empty())
        .then(|| ctx.caches.classes.store().get(&ObjectRef::new(&class_name)))
        .flatten();
    let volume = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref())
        .filter(|name| !name.is_empty())
        .and_then(|name| ctx.caches.volumes.store().get(&ObjectRef::new(name)));
    let ours =
        crate::provision::is_our_claim(&claim, class.as_deref(), volume.as_deref(), &ctx.config);
    let cached: Vec<Arc<Pod>> = if ours {
        let names = ctx
            .pods_by_claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pods_using(key);
        let pods = ctx.caches.pods.store();
        names
            .iter()
            .filter_map(|pod| pods.get(&ObjectRef::new(&pod.name).within(&pod.namespace)))
            .collect()
    } else {
        Vec::new()
    };
    let cached: Vec<&Pod> = cached.iter().map(AsRef::as_ref).collect();

    match decide::decide(&claim, ours, &cached) {
        Verdict::NotOurs => {
            tracing::debug!(claim = %key, "PVC protection: not a claim of this driver, ignored");
            Ok(())
        }
        Verdict::Malformed => {
            tracing::warn!(claim = %key, "PVC protection: claim without namespace, name or uid, ignored");
            Ok(())
        }
        Verdict::Protected => {
            tracing::debug!(claim = %key, "PVC protection: finalizer present");
            Ok(())
        }
        Verdict::Released => {
            tracing::debug!(claim = %key, "PVC protection: being deleted, finalizer already removed");
            Ok(())
        }
        Verdict::AddFinalizer => {
            tracing::info!(claim = %key, "PVC protection: adding finalizer {}", wk::FINALIZER_PVC_PROTECTION);
            apply(ctx, key, add_patch(&claim), "add finalizer").await
        }
        Verdict::InUse { pods } => {
            tracing::info!(claim = %key, ?pods, "PVC protection: being deleted but in use, keeping finalizer");
            Ok(())
        }
        Verdict::ConfirmUnused => {
            let live = ctx.live.list(&key.namespace).await?;
            let live: Vec<&Pod> = live.iter().collect();
            match decide::confirm_unused(&claim, &live) {
                Confirmation::InUse { pods } => {
                    // The cache lagged; the pods' events will queue the
                    // claim again when they change or go.
                    tracing::info!(claim = %key, ?pods, "PVC protection: cache said unused, live list says in use; keeping finalizer");
                    Ok(())
                }
                Confirmation::RemoveFinalizer => {
                    tracing::info!(claim = %key, "PVC protection: no pod uses the claim, removing finalizer {}", wk::FINALIZER_PVC_PROTECTION);
                    apply(ctx, key, removal_patch(&claim), "remove finalizer").await
                }
            }
        }
    }
}

/// The JSON patch adding the protection finalizer to the cached `claim`,
/// applying only to the claim of its uid ([`guard_uid`]).
fn add_patch(claim: &PersistentVolumeClaim) -> Option<serde_json::Value> {
    let patch = add_finalizer_patch(
        claim.metadata.finalizers.as_deref(),
        wk::FINALIZER_PVC_PROTECTION,
        claim
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default(),
    )?;
    Some(guard_uid(
        patch,
        claim.metadata.uid.as_deref().unwrap_or_default(),
    ))
}

/// The JSON patch removing the protection finalizer from the cached
/// `claim`. Besides the finalizer list it `test`s the claim's uid
/// ([`guard_uid`]): a claim deleted and re-created under the same name
/// since the cache read (whose list is often the same) keeps its
/// protection; the 422 retries from the newer cache.
fn removal_patch(claim: &PersistentVolumeClaim) -> Option<serde_json::Value> {
    let finalizers = claim.metadata.finalizers.as_deref().unwrap_or_default();
    let patch = remove_finalizer_patch(finalizers, wk::FINALIZER_PVC_PROTECTION)?;
    Some(guard_uid(
        patch,
        claim.metadata.uid.as_deref().unwrap_or_default(),
    ))
}

/// Applies a JSON patch built from the cached claim. Its `test` fails (422),
/// or the API reports a conflict (409), when the claim changed since: retry
/// with backoff from the newer cache. NotFound means the claim is gone:
/// nothing left to protect.
async fn apply(
    ctx: &Protection,
    key: &ClaimName,
    patch: Option<serde_json::Value>,
    what: &'static str,
) -> Result<(), ProtectionError> {
    let Some(patch) = patch else {
        return Ok(());
    };
    let patch: json_patch::Patch = serde_json::from_value(patch)
        .map_err(|source| ProtectionError::BadPatch { what, source })?;
    let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
        Api::namespaced(ctx.client.clone(), &key.namespace);
    match api
        .patch(
            &key.name,
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => {
            tracing::debug!(claim = %key, "PVC protection: {what}: done");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {
            tracing::debug!(claim = %key, "PVC protection: {what}: claim gone");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => {
            Err(ProtectionError::Conflict { what })
        }
        Err(source) => Err(ProtectionError::Api { what, source }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::provisioner::volumes::patch_applies;

    /// `ns/data` with uid `uid` and `finalizers`, as cached.
    fn claim(uid: &str, finalizers: &[&str]) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {
            "name": "data", "namespace": "ns", "uid": uid, "resourceVersion": "7",
            "finalizers": finalizers,
        }}))
        .expect("claim")
    }

    /// The live object the API server patches.
    fn live(uid: &str, finalizers: &[&str]) -> serde_json::Value {
        json!({"metadata": {"name": "data", "namespace": "ns", "uid": uid,
            "resourceVersion": "9", "finalizers": finalizers}})
    }

    fn parsed(patch: serde_json::Value) -> json_patch::Patch {
        serde_json::from_value(patch).expect("a JSON patch")
    }

    /// The claim was deleted and re-created under its name between the
    /// cache read and the patch: the same finalizer list, another uid. The
    /// removal must not apply to it (422), or the new claim loses its
    /// protection while a pod may use it.
    #[test]
    fn the_removal_applies_only_to_the_claim_it_was_decided_for() {
        let protected = [wk::FINALIZER_PVC_PROTECTION];
        let cached = claim("uid-1", &protected);
        let remove = parsed(removal_patch(&cached).expect("a removal"));
        assert!(patch_applies(&live("uid-1", &protected), &remove));
        assert!(
            !patch_applies(&live("uid-2", &protected), &remove),
            "a same-named claim with another uid keeps its finalizer"
        );
        let mut after = live("uid-1", &protected);
        json_patch::patch(&mut after, &remove).expect("applies");
        assert_eq!(after["metadata"]["finalizers"], json!([]));
        assert_eq!(
            removal_patch(&claim("uid-1", &[])),
            None,
            "nothing to remove"
        );
    }

    #[test]
    fn the_addition_applies_only_to_the_claim_it_was_decided_for() {
        for finalizers in [&[][..], &["other"][..]] {
            let add = parsed(add_patch(&claim("uid-1", finalizers)).expect("an addition"));
            let mut same = live("uid-1", finalizers);
            same["metadata"]["resourceVersion"] = json!("7");
            if finalizers.is_empty() {
                same["metadata"]
                    .as_object_mut()
                    .expect("meta")
                    .remove("finalizers");
            }
            assert!(patch_applies(&same, &add), "{finalizers:?}");
            let mut other = same.clone();
            other["metadata"]["uid"] = json!("uid-2");
            assert!(!patch_applies(&other, &add), "{finalizers:?}");
        }
        assert_eq!(
            add_patch(&claim("uid-1", &[wk::FINALIZER_PVC_PROTECTION])),
            None
        );
    }
}
