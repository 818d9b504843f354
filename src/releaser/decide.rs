//! The PV-releaser decisions (from the seed project
//! kubernetes-dynamic-reclaimable-pvc-controllers). Plain objects in,
//! verdicts and patches out, no I/O.

use crate::projection::StorageClass;
use crate::projection::{PersistentVolume, PersistentVolumeClaim};
use serde_json::{Map, Value, json};

use crate::provision::{ProvisionerConfig, is_our_volume};
use crate::wellknown as wk;

/// What the releaser needs to know besides the objects.
#[derive(Debug, Clone)]
pub struct ReleaserConfig {
    /// `--controller-id`.
    pub controller_id: String,
    /// Not `--disable-automatic-association`.
    pub automatic_association: bool,
    /// Whose PVs are ours ([`is_our_volume`]; only the driver name matters).
    pub driver: ProvisionerConfig,
}

/// Why a PV is associated with our controller id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Association {
    /// The PV carries `reclaimable-pv-releaser.kubernetes.io/managed-by=<id>`.
    Label,
    /// Its StorageClass carries
    /// `reclaimable-pv-releaser.kubernetes.io/controller-id=<id>`.
    ClassAnnotation,
}

/// What to do with one PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not a PV of this driver: never touched.
    NotOurs,
    /// No name or resourceVersion: nothing can be written safely.
    Malformed,
    /// Being deleted: releasing it would only race the deletion.
    BeingDeleted,
    /// Labelled for another controller id: that controller's PV, whatever
    /// its class says (the label is the more specific statement).
    OtherController { id: String },
    /// Neither associated nor to be associated.
    NotAssociated,
    /// Automatic association: label it with our id.
    Associate,
    /// Associated, but not Released with a claimRef (yet).
    NotReleased { association: Association },
    /// Associated and Released, but its reclaim policy is Delete: the
    /// provisioner deletes it, and removing the claimRef would stop that.
    RefuseDeletePolicy,
    /// Remove the claimRef (and our label when present): it becomes
    /// Available with its data.
    Release {
        association: Association,
        remove_label: bool,
    },
}

/// Whether the PV is associated with `id` (a label wins over the class).
/// `None` also when the PV is labelled for another id.
pub fn association(
    pv: &PersistentVolume,
    class: Option<&StorageClass>,
    id: &str,
) -> Option<Association> {
    match pv_label(pv) {
        Some(label) if label == id => return Some(Association::Label),
        Some(_) => return None,
        None => {}
    }
    let class_name = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.storage_class_name.as_deref())
        .filter(|name| !name.is_empty())?;
    let class = class.filter(|class| class.metadata.name.as_deref() == Some(class_name))?;
    let annotated = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(wk::ANN_RELEASER_CONTROLLER_ID))
        .is_some_and(|value| value == id);
    annotated.then_some(Association::ClassAnnotation)
}

/// Decides for one PV. `class` is the PV's StorageClass and `claim` the PVC
/// its claimRef names (namespace and name), if they exist in the caches.
pub fn decide(
    pv: &PersistentVolume,
    class: Option<&StorageClass>,
    claim: Option<&PersistentVolumeClaim>,
    config: &ReleaserConfig,
) -> Verdict {
    if !is_our_volume(pv, &config.driver) {
        return Verdict::NotOurs;
    }
    let identified = [&pv.metadata.name, &pv.metadata.resource_version]
        .iter()
        .all(|field| field.as_deref().is_some_and(|v| !v.is_empty()));
    if !identified || config.controller_id.is_empty() {
        return Verdict::Malformed;
    }
    if pv.metadata.deletion_timestamp.is_some() {
        return Verdict::BeingDeleted;
    }
    if let Some(label) = pv_label(pv).filter(|label| *label != config.controller_id) {
        return Verdict::OtherController {
            id: label.to_owned(),
        };
    }
    let Some(association) = association(pv, class, &config.controller_id) else {
        let associate = config.automatic_association
            && claim.is_some_and(|claim| claim_is_managed(pv, claim, &config.controller_id));
        return if associate {
            Verdict::Associate
        } else {
            Verdict::NotAssociated
        };
    };
    let spec = pv.spec.as_ref();
    let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    if !released || spec.and_then(|s| s.claim_ref.as_ref()).is_none() {
        return Verdict::NotReleased { association };
    }
    if spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete") {
        return Verdict::RefuseDeletePolicy;
    }
    Verdict::Release {
        association,
        remove_label: pv_label(pv).is_some(),
    }
}

/// What a writing verdict rests on besides the PV itself, to be read live
/// right before the write. The PV is guarded by the resourceVersion the
/// patch carries; its class and claim come from other watches, which are not
/// ordered with the PV's: the class cache may still show an annotation an
/// admin removed a moment ago, the claim cache a label or a claim that is
/// gone. A release makes the PV's data claimable by anyone, so it is never
/// written on the word of another kind's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveRead<'a> {
    /// The PV's StorageClass by name: a release by class annotation.
    Class(&'a str),
    /// The claim the PV's claimRef names: the automatic association rests
    /// on its managed-by label.
    Claim { namespace: &'a str, name: &'a str },
}

/// The live read `verdict` needs before it is written ([`LiveRead`]);
/// `None` for verdicts that write nothing or rest on the PV alone (a
/// release by the PV's own label). A name missing where one is needed is
/// empty: the worker reads nothing then, and the verdict decided again
/// without the object does not write.
pub fn live_read<'a>(pv: &'a PersistentVolume, verdict: &Verdict) -> Option<LiveRead<'a>> {
    match verdict {
        Verdict::Release {
            association: Association::ClassAnnotation,
            ..
        } => Some(LiveRead::Class(
            pv.spec
                .as_ref()
                .and_then(|spec| spec.storage_class_name.as_deref())
                .unwrap_or_default(),
        )),
        Verdict::Associate => {
            let (namespace, name) = claim_ref_name(pv).unwrap_or_default();
            Some(LiveRead::Claim { namespace, name })
        }
        _ => None,
    }
}

/// Whether the verdict decided again from the live objects still writes
/// what the cached one would: only then is the write made. Anything else is
/// a cache that has not seen a change yet; the change's own watch event
/// queues the PV again.
pub fn confirmed(cached: &Verdict, live: &Verdict) -> bool {
    cached == live
}

/// Whether the last state of a departed claim, kept for the PV
/// (`Releaser::departed`, src/releaser/mod.rs), is still kept once the PV
/// got `verdict`. Only [`Verdict::Associate`] still needs it: until the
/// association's write lands (a conflict retries it, deciding again from
/// the same departed claim) the claim is the only reason the PV is ours to
/// release. Every other verdict drops it: the PV is associated by now (its
/// label or class says so, and the release needs no claim), or the departed
/// claim was not this PV's, or the PV is not ours to act on at all.
pub fn keep_departed(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Associate)
}

/// The claim to decide `pv` with: the cached claim its claimRef names, or
/// the remembered one that departed before the PV was associated. When the
/// claimRef has a uid, the one with that uid wins: a claim re-created under
/// the same name (by hand, or by the pod/Job provisioner) is another claim,
/// and deciding from it would drop the departed claim that is the only
/// reason the PV is ours to release.
pub fn claim_to_decide_with<'a>(
    pv: &PersistentVolume,
    cached: Option<&'a PersistentVolumeClaim>,
    departed: Option<&'a PersistentVolumeClaim>,
) -> Option<&'a PersistentVolumeClaim> {
    let uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
        .filter(|uid| !uid.is_empty());
    let has_uid =
        |claim: &&PersistentVolumeClaim| uid.is_some() && claim.metadata.uid.as_deref() == uid;
    cached
        .filter(has_uid)
        .or(departed.filter(has_uid))
        .or(cached)
        .or(departed)
}

/// Whether `claim` is the claim the PV's claimRef names (namespace, name,
/// and uid when the claimRef has one: a new claim of the same name is
/// another claim) and is labelled for our controller id.
fn claim_is_managed(pv: &PersistentVolume, claim: &PersistentVolumeClaim, id: &str) -> bool {
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    let names_it = claim_ref.namespace.is_some()
        && claim_ref.namespace.as_deref() == claim.metadata.namespace.as_deref()
        && claim_ref.name.is_some()
        && claim_ref.name == claim.metadata.name
        && claim_ref
            .uid
            .as_deref()
            .filter(|uid| !uid.is_empty())
            .is_none_or(|uid| claim.metadata.uid.as_deref() == Some(uid));
    names_it && is_managed_by(claim, id)
}

/// Whether `claim` is labelled
/// `dynamic-pvc-provisioner.kubernetes.io/managed-by=<id>`.
pub fn is_managed_by(claim: &PersistentVolumeClaim, id: &str) -> bool {
    claim
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(wk::LABEL_PVC_MANAGED_BY))
        .is_some_and(|value| value == id)
}

fn pv_label(pv: &PersistentVolume) -> Option<&str> {
    pv.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(wk::LABEL_PV_RELEASER_MANAGED_BY))
        .map(|label| label.as_str())
}

/// The merge patch adding our label, guarded by the resourceVersion the
/// verdict was made from (the API answers 409 if the PV changed since).
pub fn associate_patch(resource_version: &str, id: &str) -> Value {
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {wk::LABEL_PV_RELEASER_MANAGED_BY: id},
        }
    })
}

/// The merge patch releasing a PV: `spec.claimRef` removed (and our label,
/// when `remove_label`), guarded by the resourceVersion the verdict was made
/// from, so that a PV re-bound meanwhile is never released.
pub fn release_patch(resource_version: &str, remove_label: bool) -> Value {
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".to_owned(), json!(resource_version));
    if remove_label {
        metadata.insert(
            "labels".to_owned(),
            json!({wk::LABEL_PV_RELEASER_MANAGED_BY: null}),
        );
    }
    json!({"metadata": metadata, "spec": {"claimRef": null}})
}

/// The claim a PV's claimRef names, as (namespace, name).
pub fn claim_ref_name(pv: &PersistentVolume) -> Option<(&str, &str)> {
    let claim_ref = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some((
        claim_ref.namespace.as_deref().filter(|ns| !ns.is_empty())?,
        claim_ref.name.as_deref().filter(|name| !name.is_empty())?,
    ))
}

/// Message of the `Released` event. It names the claim's uid too: the
/// recorder suppresses a repeat of the last message, and a PV released from
/// a claim, bound again to a new claim of the same name and released again
/// is a new transition.
pub fn released_message(pv: &PersistentVolume, id: &str) -> String {
    let claim = claim_ref_name(pv)
        .map(|(ns, name)| format!("{ns}/{name}"))
        .unwrap_or_else(|| "(unnamed)".to_owned());
    let uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
        .filter(|uid| !uid.is_empty())
        .map(|uid| format!(" (uid {uid})"))
        .unwrap_or_default();
    format!(
        "Released by controller {id}: the reference to claim {claim}{uid} was removed; the volume is Available with its data"
    )
}

/// Message of the `ErrReleasePV` event for a PV with reclaim policy Delete.
pub const DELETE_POLICY_MESSAGE: &str = "Not released: the reclaim policy is Delete, so the provisioner deletes this volume; releasing it would stop that. Set the reclaim policy to Retain to have it released";

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
