//! The PVC-protection decisions, as the controller-manager's pvc-protection
//! controller makes them (`pkg/controller/volume/pvcprotection`), restricted
//! to this driver's claims. Plain objects in, verdicts out, no I/O.

use crate::projection::{PersistentVolumeClaim, Pod};

use super::ClaimName;
use crate::wellknown as wk;

/// What to do with one claim, judged from the watch caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not a claim of this driver: never touched.
    NotOurs,
    /// The claim lacks a namespace, name or uid: nothing can be written
    /// safely (the API never serves such objects; a broken cache entry).
    Malformed,
    /// Alive and without the finalizer: add it.
    AddFinalizer,
    /// Alive with the finalizer: nothing to do.
    Protected,
    /// Being deleted without our finalizer: someone else removed it already.
    Released,
    /// Being deleted, finalizer present, and these pods (names) use it.
    InUse { pods: Vec<String> },
    /// Being deleted, finalizer present, and no cached pod uses it: confirm
    /// with a live list of the namespace's pods, then [`confirm_unused`].
    ConfirmUnused,
}

/// The verdict after the live list of the claim's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// No pod uses the claim: remove the finalizer.
    RemoveFinalizer,
    /// The cache lagged: these pods (names) use it, keep the finalizer.
    InUse { pods: Vec<String> },
}

/// Decides from cached state. `ours` is
/// [`is_our_claim`](crate::provision::is_our_claim); `pods` are the
/// cached pods (any namespace: those of other namespaces never count).
pub fn decide(claim: &PersistentVolumeClaim, ours: bool, pods: &[&Pod]) -> Verdict {
    if !ours {
        return Verdict::NotOurs;
    }
    let meta = &claim.metadata;
    let identified = [
        meta.namespace.as_deref(),
        meta.name.as_deref(),
        meta.uid.as_deref(),
    ]
    .iter()
    .all(|field| field.is_some_and(|v| !v.is_empty()));
    if !identified {
        return Verdict::Malformed;
    }
    let has_finalizer = meta
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == wk::FINALIZER_PVC_PROTECTION);
    match (meta.deletion_timestamp.is_some(), has_finalizer) {
        // A claim being deleted can get no new finalizer (the API refuses
        // it), and it must not: deletion was asked for.
        (true, false) => Verdict::Released,
        (false, true) => Verdict::Protected,
        (false, false) => Verdict::AddFinalizer,
        (true, true) => {
            let users = pods_using(claim, pods);
            if users.is_empty() {
                Verdict::ConfirmUnused
            } else {
                Verdict::InUse { pods: users }
            }
        }
    }
}

/// Judges a claim being deleted against a live list of its namespace's pods.
pub fn confirm_unused(claim: &PersistentVolumeClaim, live_pods: &[&Pod]) -> Confirmation {
    let users = pods_using(claim, live_pods);
    if users.is_empty() {
        Confirmation::RemoveFinalizer
    } else {
        Confirmation::InUse { pods: users }
    }
}

/// Names of the pods that use the claim, sorted.
pub fn pods_using(claim: &PersistentVolumeClaim, pods: &[&Pod]) -> Vec<String> {
    let mut names: Vec<String> = pods
        .iter()
        .filter(|pod| pod_uses_claim(pod, claim))
        .filter_map(|pod| pod.metadata.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The controller-manager's `podUsesPVC`: only a scheduled pod can use a
/// claim (the scheduler and the kubelet refuse to start a pod whose claim is
/// being deleted); it uses it through a `persistentVolumeClaim` volume naming
/// it, or through a generic ephemeral volume that generated it, unless the
/// pod is shut down. The pod's phase does not matter: a Succeeded or Failed
/// pod that is still scheduled may still have the volume mounted.
pub fn pod_uses_claim(pod: &Pod, claim: &PersistentVolumeClaim) -> bool {
    let (Some(claim_ns), Some(claim_name)) = (
        claim.metadata.namespace.as_deref(),
        claim.metadata.name.as_deref(),
    ) else {
        return false;
    };
    if pod.metadata.namespace.as_deref() != Some(claim_ns) {
        return false;
    }
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    if spec.node_name.as_deref().is_none_or(str::is_empty) {
        return false;
    }
    let shut_down = pod_is_shut_down(pod);
    spec.volumes.iter().flatten().any(|volume| {
        let by_name = volume
            .persistent_volume_claim
            .as_ref()
            .is_some_and(|source| source.claim_name == claim_name);
        let by_ephemeral = !shut_down
            && volume.ephemeral.is_some()
            && ephemeral_claim_name(pod, &volume.name).as_deref() == Some(claim_name)
            && is_controlled_by(claim, pod);
        by_name || by_ephemeral
    })
}

/// The claims a pod references (in its namespace): every
/// `persistentVolumeClaim` volume and every generic ephemeral volume's
/// generated claim. The triggers enqueue these on pod changes.
pub fn referenced_claims(pod: &Pod) -> Vec<ClaimName> {
    let Some(namespace) = pod.metadata.namespace.as_deref() else {
        return Vec::new();
    };
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|volume| {
            if let Some(source) = &volume.persistent_volume_claim {
                Some(source.claim_name.clone())
            } else if volume.ephemeral.is_some() {
                ephemeral_claim_name(pod, &volume.name)
            } else {
                None
            }
        })
        .filter(|name| !name.is_empty())
        .map(|name| ClaimName::new(namespace, name))
        .collect()
}

/// `ephemeral.VolumeClaimName`: `<pod>-<volume>`.
fn ephemeral_claim_name(pod: &Pod, volume: &str) -> Option<String> {
    let pod_name = pod.metadata.name.as_deref().filter(|n| !n.is_empty())?;
    Some(format!("{pod_name}-{volume}"))
}

/// `metav1.IsControlledBy(claim, pod)`: the claim's controller reference
/// carries the pod's uid (a claim of the same name left over from an older
/// pod with that name is not this pod's).
fn is_controlled_by(claim: &PersistentVolumeClaim, pod: &Pod) -> bool {
    let Some(pod_uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
        return false;
    };
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.uid == pod_uid)
}

/// `podIsShutDown`: a deletion timestamp with grace period 0 means the
/// kubelet is done with the pod (or it was force-deleted). Counting such a
/// pod as unused breaks the cycle of a pod finalizer waiting for its
/// ephemeral claim to go.
pub fn pod_is_shut_down(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod.metadata.deletion_grace_period_seconds == Some(0)
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
