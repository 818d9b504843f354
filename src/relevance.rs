//! Which objects the watch caches keep at all.
//!
//! Every loop of this sidecar acts only on objects of its own driver, yet a
//! watch sees the whole cluster: on a cluster with 50,000 volumes of other
//! drivers, keeping them would make the sidecar's memory grow with volumes
//! it never touches (the upstream sidecar's does: its users size its limit
//! by cluster). So each cache keeps only what some loop can act on, and
//! drops the rest as it arrives, before the store and before any handler.
//!
//! The rule for every kind is the same: drop an object only on evidence
//! that no loop needs it; when in doubt, keep it. Plain objects in, a yes or
//! no out; [`crate::caches`] applies it on the watch stream.
//!
//! - **PersistentVolumes**: only ours ([`is_our_volume`]: our CSI driver,
//!   our provisioned-by annotation, or an in-tree volume migrated to us).
//!   That is all any loop reads: deletion, the finalizer, protection (a
//!   claim is ours by its volume only if the volume is ours), the releaser
//!   (it touches only our volumes).
//! - **PersistentVolumeClaims**: dropped only when they are another
//!   provisioner's: annotated by the controller-manager for another
//!   provisioner, or of a StorageClass we know that names another
//!   provisioner, and not bound to one of our volumes. Claims without a
//!   class or of a class not seen yet are kept (a static claim may be bound
//!   to one of our volumes later), and so are the claims that the releaser
//!   and the pod/Job PVC provisioner label as theirs.
//! - **Pods**: only those that reference a claim (a `persistentVolumeClaim`
//!   or generic ephemeral volume) or carry the pod/Job PVC provisioner's
//!   annotations. Protection and retention read pods only through the claims
//!   they use.
//! - **Jobs**: only those with the pod/Job PVC provisioner's annotations.
//!
//! A kept object that stops being relevant (e.g. a claim just annotated for
//! another provisioner) leaves the cache and is announced as deleted, as if
//! it had been deleted: handlers already treat a missing object as nothing to
//! do. One window stays: a claim of another driver's class, statically bound
//! to one of our volumes, seen before that volume reached our cache, is
//! dropped until its next change (the binder's own update of the claim is
//! one, and so is its deletion, which is all protection acts on). The class
//! cache is filled before the claims are listed ([`crate::caches`]); the
//! volume cache is filled at the same time as the claim cache.

use crate::projection::Job;
use crate::projection::StorageClass;
use crate::projection::{PersistentVolume, PersistentVolumeClaim, Pod, PodSpec};

use crate::migration::InTreePlugin;
use crate::projection::POD_ANNOTATION_PREFIX;
use crate::provision::is_our_claim;
use crate::provision::{ProvisionerConfig, annotated_provisioner, claim_class_name, is_our_volume};
use crate::wellknown as wk;

/// Whether the attachment cache keeps `attachment`: only this driver's
/// (the attacher of a CSI volume is its driver's name); the others can
/// never hold a volume of ours.
pub fn keep_attachment(attachment: &crate::projection::VolumeAttachment, driver: &str) -> bool {
    attachment.spec.attacher == driver
}

/// Whether the volume cache keeps `pv`.
pub fn keep_volume(pv: &PersistentVolume, config: &ProvisionerConfig) -> bool {
    is_our_volume(pv, config)
}

/// Whether the claim cache keeps `claim`. `class` is the StorageClass the
/// claim names, `volume` the PV it is bound to, as the caches have them
/// (`None`: not cached, which for a volume means not ours).
pub fn keep_claim(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    volume: Option<&PersistentVolume>,
    config: &ProvisionerConfig,
) -> bool {
    if is_our_claim(claim, class, volume, config) {
        return true;
    }
    // The releaser's and the pod/Job PVC provisioner's claims, whatever
    // their class: those loops find them by this label.
    let labelled = claim
        .metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(wk::LABEL_PVC_MANAGED_BY));
    if labelled {
        return true;
    }
    // Annotated for the in-tree plugin our driver took over, but not (yet)
    // marked as migrated to us: it may be, with its next change.
    let our_in_tree_name =
        InTreePlugin::from_csi_driver(&config.driver_name).map(InTreePlugin::in_tree_name);
    let annotated = annotated_provisioner(claim);
    if annotated.is_some() && annotated == our_in_tree_name {
        return true;
    }
    // Evidence that it is another provisioner's. `is_our_claim` said no, so
    // an annotation or a known class here names someone else.
    let annotated_for_another = annotated.is_some_and(|name| !name.is_empty());
    let class_name = claim_class_name(claim);
    let class_of_another = !class_name.is_empty()
        && class.is_some_and(|class| class.metadata.name.as_deref() == Some(class_name.as_str()));
    !(annotated_for_another || class_of_another)
}

/// Whether the pod cache keeps `pod` (already trimmed: its annotations are
/// only the loops' own).
pub fn keep_pod(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(references_a_claim) || has_loop_annotations(&pod.metadata)
}

/// Whether the Job cache keeps `job`.
pub fn keep_job(job: &Job) -> bool {
    has_loop_annotations(&job.metadata)
}

fn references_a_claim(spec: &PodSpec) -> bool {
    spec.volumes
        .iter()
        .flatten()
        .any(|volume| volume.persistent_volume_claim.is_some() || volume.ephemeral.is_some())
}

fn has_loop_annotations(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.annotations
        .iter()
        .flatten()
        .any(|(key, _)| key.starts_with(POD_ANNOTATION_PREFIX))
}

#[cfg(test)]
#[path = "relevance_tests.rs"]
mod tests;
