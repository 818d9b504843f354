//! The pure decisions of the pod/Job PVC provisioner: which PVCs an
//! annotated pod or Job asks for, what is wrong with a request (each an
//! event reason of the seed project), and which managed PVCs have lost the
//! object that claimed them. Plain objects in, plans out.

use std::collections::BTreeMap;

use crate::projection::{PersistentVolumeClaim, Shared, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::wellknown::LABEL_PVC_MANAGED_BY;

/// Prefix of every annotation (and label) of this loop.
pub const PREFIX: &str = "dynamic-pvc-provisioner.kubernetes.io/";
/// Label: the name of the pod or Job that claimed the PVC.
pub const LABEL_CLAIMED_BY: &str = "dynamic-pvc-provisioner.kubernetes.io/claimed-by";
/// Label: `pod` or `job`, the kind of that object.
pub const LABEL_CLAIMED_BY_KIND: &str = "dynamic-pvc-provisioner.kubernetes.io/claimed-by-kind";
/// A `.pvc` annotation larger than this is refused (the API server allows
/// 256 KiB for all annotations of an object together).
pub const MAX_PVC_ANNOTATION_BYTES: usize = 256 * 1024;

/// Events on the pod or Job, as the seed project names them.
pub const REASON_PROVISIONED: &str = "PVCProvisioned";
pub const REASON_MISSING_PVC: &str = "ErrMissingPVC";
pub const REASON_INVALID_PVC: &str = "ErrInvalidPVC";
pub const REASON_MISSING_VOLUME: &str = "ErrMissingVolume";
pub const REASON_PROVISION_FAILED: &str = "ErrPVCProvisionFailed";

/// What claimed a PVC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerKind {
    Pod,
    Job,
}

impl OwnerKind {
    pub fn label(self) -> &'static str {
        match self {
            OwnerKind::Pod => "pod",
            OwnerKind::Job => "job",
        }
    }

    fn of_label(value: Option<&str>) -> Option<OwnerKind> {
        match value {
            // Claims labelled before the kind label existed are pods'.
            None | Some("pod") => Some(OwnerKind::Pod),
            Some("job") => Some(OwnerKind::Job),
            Some(_) => None,
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            OwnerKind::Pod => "v1",
            OwnerKind::Job => "batch/v1",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            OwnerKind::Pod => "Pod",
            OwnerKind::Job => "Job",
        }
    }
}

/// The object asking for PVCs, as the decision needs it: for a Job, its
/// own annotations and its pod template's volumes.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    pub kind: OwnerKind,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub annotations: Option<&'a BTreeMap<String, String>>,
    pub volumes: &'a [Volume],
}

/// What to do for one requested volume.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Create this PVC, then say `PVCProvisioned`.
    Create(Box<PersistentVolumeClaim>),
    /// The claim exists already: nothing to do.
    Exists { claim: String },
    /// A condition failed: a Warning event with this reason and message.
    Refuse {
        reason: &'static str,
        message: String,
    },
}

/// Whether an object carries any annotation of this loop (the cheap filter
/// before anything else is looked at).
pub fn is_annotated(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| a.keys().any(|k| k.starts_with(PREFIX)))
}

/// The volumes requested, `<volume>` → (`.enabled` value, `.pvc` value).
fn requests(
    annotations: &BTreeMap<String, String>,
) -> BTreeMap<&str, (Option<&str>, Option<&str>)> {
    let mut out: BTreeMap<&str, (Option<&str>, Option<&str>)> = BTreeMap::new();
    for (key, value) in annotations {
        let Some(rest) = key.strip_prefix(PREFIX) else {
            continue;
        };
        if let Some(volume) = rest.strip_suffix(".enabled") {
            out.entry(volume).or_default().0 = Some(value);
        } else if let Some(volume) = rest.strip_suffix(".pvc") {
            out.entry(volume).or_default().1 = Some(value);
        }
    }
    out
}

/// The steps for every volume the claimant asks for (`<v>.enabled` exactly
/// `"true"`; other values mean "not asked" unless they are not a boolean).
/// `exists(name)` tells whether a PVC of that name exists in the
/// claimant's namespace.
pub fn plan(
    claimant: &Claimant<'_>,
    controller_id: &str,
    exists: impl Fn(&str) -> bool,
) -> Vec<(String, Step)> {
    let Some(annotations) = claimant.annotations else {
        return Vec::new();
    };
    let mut steps = Vec::new();
    for (volume, (enabled, pvc)) in requests(annotations) {
        let step = match enabled {
            Some("true") => step_for(claimant, controller_id, volume, pvc, &exists),
            None | Some("false") => continue,
            Some(other) => Step::Refuse {
                reason: REASON_INVALID_PVC,
                message: format!(
                    "annotation {PREFIX}{volume}.enabled is {other:?}; it must be \"true\" (or \"false\")"
                ),
            },
        };
        steps.push((volume.to_owned(), step));
    }
    steps
}

fn step_for(
    claimant: &Claimant<'_>,
    controller_id: &str,
    volume: &str,
    pvc: Option<&str>,
    exists: &impl Fn(&str) -> bool,
) -> Step {
    let refuse = |reason, message: String| Step::Refuse { reason, message };
    let Some(pvc) = pvc else {
        return refuse(
            REASON_MISSING_PVC,
            format!(
                "volume {volume} is enabled but annotation {PREFIX}{volume}.pvc is missing; set it to the PersistentVolumeClaim to create (YAML or JSON)"
            ),
        );
    };
    let Some(claim_name) = claimant
        .volumes
        .iter()
        .find(|v| v.name == volume)
        .and_then(|v| v.persistent_volume_claim.as_ref())
        .map(|source| source.claim_name.clone())
    else {
        return refuse(
            REASON_MISSING_VOLUME,
            format!(
                "no volume {volume} with a persistentVolumeClaim in the {kind} spec; annotation {PREFIX}{volume}.enabled must name a volume of the {kind} whose source is persistentVolumeClaim (claimName: the PVC to create)",
                kind = claimant.kind.label()
            ),
        );
    };
    if pvc.len() > MAX_PVC_ANNOTATION_BYTES {
        return refuse(
            REASON_INVALID_PVC,
            format!(
                "annotation {PREFIX}{volume}.pvc is {} bytes; at most {MAX_PVC_ANNOTATION_BYTES}",
                pvc.len()
            ),
        );
    }
    let parsed: PersistentVolumeClaim = match parse_one_claim(pvc) {
        Ok(claim) => claim,
        Err(why) => {
            return refuse(
                REASON_INVALID_PVC,
                format!("annotation {PREFIX}{volume}.pvc is not one PersistentVolumeClaim: {why}"),
            );
        }
    };
    if let Some(namespace) = parsed.metadata.namespace.as_deref()
        && !namespace.is_empty()
        && namespace != claimant.namespace
    {
        return refuse(
            REASON_INVALID_PVC,
            format!(
                "annotation {PREFIX}{volume}.pvc names namespace {namespace}; the claim is made in the {}'s namespace {}",
                claimant.kind.label(),
                claimant.namespace
            ),
        );
    }
    if exists(&claim_name) {
        return Step::Exists { claim: claim_name };
    }
    Step::Create(Box::new(claim_for(
        claimant,
        controller_id,
        &claim_name,
        parsed,
    )))
}

/// YAML or JSON (JSON is YAML) of exactly one PersistentVolumeClaim.
fn parse_one_claim(text: &str) -> Result<PersistentVolumeClaim, String> {
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let kind = value.get("kind").and_then(serde_yaml_ng::Value::as_str);
    if !matches!(kind, None | Some("PersistentVolumeClaim")) {
        return Err(format!("kind is {:?}", kind.unwrap_or_default()));
    }
    if !value.is_mapping() {
        return Err("not an object".to_owned());
    }
    let claim: PersistentVolumeClaim =
        serde_yaml_ng::from_value(value).map_err(|e| e.to_string())?;
    if claim.spec.is_none() {
        return Err("it has no spec".to_owned());
    }
    Ok(claim)
}

/// The PVC to create: the annotation's, named after the pod volume's
/// `claimName`, in the claimant's namespace, labelled for the cleanup and
/// the releaser, owned by the claimant (the garbage collector removes it
/// with it).
fn claim_for(
    claimant: &Claimant<'_>,
    controller_id: &str,
    claim_name: &str,
    mut claim: PersistentVolumeClaim,
) -> PersistentVolumeClaim {
    let meta = &mut claim.metadata;
    meta.name = Some(claim_name.to_owned());
    meta.namespace = Some(claimant.namespace.into());
    meta.resource_version = None;
    meta.uid = None;
    meta.owner_references = Some(vec![OwnerReference {
        api_version: claimant.kind.api_version().to_owned(),
        kind: claimant.kind.kind().to_owned(),
        name: claimant.name.to_owned(),
        uid: claimant.uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let labels = meta.labels.get_or_insert_with(Default::default);
    labels.insert(LABEL_CLAIMED_BY.to_owned(), claimant.name.to_owned());
    labels.insert(
        LABEL_CLAIMED_BY_KIND.to_owned(),
        claimant.kind.label().to_owned(),
    );
    labels.insert(LABEL_PVC_MANAGED_BY.to_owned(), controller_id.to_owned());
    claim.status = None;
    claim
}

/// The object a managed PVC was claimed by, to look up live.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimedBy {
    pub kind: OwnerKind,
    pub namespace: String,
    pub name: String,
    /// The uid of the owner reference we wrote, when present: an object of
    /// the same name with another uid is a new one, and ours is gone.
    pub uid: Option<String>,
}

/// Who claimed `claim`, if it is managed by `controller_id` (never a PVC
/// without our managed-by label, whatever its other labels say).
pub fn claimed_by(claim: &PersistentVolumeClaim, controller_id: &str) -> Option<ClaimedBy> {
    let labels = claim.metadata.labels.as_ref()?;
    if labels.get(LABEL_PVC_MANAGED_BY).map(Shared::as_str) != Some(controller_id) {
        return None;
    }
    let name = labels.get(LABEL_CLAIMED_BY)?.to_string();
    let kind = OwnerKind::of_label(labels.get(LABEL_CLAIMED_BY_KIND).map(Shared::as_str))?;
    let uid = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.kind == kind.kind() && r.name == name)
        .map(|r| r.uid.clone());
    Some(ClaimedBy {
        kind,
        namespace: claim.metadata.namespace.as_ref()?.to_string(),
        name,
        uid,
    })
}

/// Whether the claimant is gone, from a live read: `live_uid` is the uid
/// of the object of that name now (`None`: not found).
pub fn claimant_gone(claimed_by: &ClaimedBy, live_uid: Option<&str>) -> bool {
    match (live_uid, claimed_by.uid.as_deref()) {
        (None, _) => true,
        (Some(live), Some(ours)) => live != ours,
        (Some(_), None) => false,
    }
}

/// A pod or Job as a live read sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveClaimant {
    pub uid: String,
    /// It has a deletion timestamp.
    pub deleting: bool,
}

/// Whether claims may be created for a claimant read from the cache with
/// `cached_uid`, after a live read found `live` (`None`: not found). The
/// pod cache lags: deleting a pod deletes its claims, and a claim's deletion
/// event re-queues the pod, which the cache may still hold; a claim created
/// from it would have a gone owner and keep the PV bound to a new uid. Only
/// the same object, not being deleted, gets claims.
pub fn claimant_current(cached_uid: &str, live: Option<&LiveClaimant>) -> bool {
    live.is_some_and(|live| !live.deleting && !cached_uid.is_empty() && live.uid == cached_uid)
}

/// What a failed PVC create means for the claimant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateFailure {
    /// 409: the PVC exists already (created by an earlier attempt whose
    /// answer was lost, or by anyone): nothing to say.
    AlreadyThere,
    /// Another 4xx but 429 (invalid spec, quota, RBAC): retrying will not
    /// help; an event says why, and the next resync looks again.
    Refused,
    /// No answer, 429 or 5xx: an event, and the claimant is retried with
    /// backoff.
    Retry,
}

/// Classifies a failed PVC create by its HTTP status (`None`: no answer).
pub fn create_failure(status: Option<u16>) -> CreateFailure {
    match status {
        Some(409) => CreateFailure::AlreadyThere,
        Some(code) if (400..500).contains(&code) && code != 429 => CreateFailure::Refused,
        _ => CreateFailure::Retry,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
