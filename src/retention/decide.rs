//! The retention decisions (KEP-1847), as pure functions: objects in,
//! wanted owner references or a deletion out. No I/O here.
//!
//! They follow the controller-manager's StatefulSet controller
//! (`isClaimOwnerUpToDate` / `updateClaimOwnerRefForSetAndPod` in
//! `pkg/controller/statefulset/stateful_set_utils.go`) closely, in the same
//! order of checks, so that both can run on one cluster: whenever one of
//! them considers a claim up to date, so does the other, and neither ever
//! undoes the other's write.

use std::fmt;

use crate::projection::StatefulSet;
use crate::projection::StorageClass;
use crate::projection::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::wellknown as wk;

/// One field of `spec.persistentVolumeClaimRetentionPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Retain,
    Delete,
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Retention::Retain => wk::RETENTION_RETAIN,
            Retention::Delete => wk::RETENTION_DELETE,
        })
    }
}

/// A set's PVC retention policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub when_scaled: Retention,
    pub when_deleted: Retention,
}

impl Policy {
    pub const RETAIN: Policy = Policy {
        when_scaled: Retention::Retain,
        when_deleted: Retention::Retain,
    };

    /// The set's policy. Absent means Retain/Retain (the API server's
    /// default). A value the API does not define (it validates the enum, so
    /// only a newer server could send one) makes the whole policy
    /// Retain/Retain, as the controller-manager's `default:` case does: we
    /// must never delete on a policy we do not understand.
    pub fn of(set: &StatefulSet) -> Policy {
        let Some(policy) = set.spec.persistent_volume_claim_retention_policy.as_ref() else {
            return Policy::RETAIN;
        };
        let parse = |v: &Option<String>| match v.as_deref() {
            None | Some(wk::RETENTION_RETAIN) => Some(Retention::Retain),
            Some(wk::RETENTION_DELETE) => Some(Retention::Delete),
            Some(_) => None,
        };
        match (parse(&policy.when_scaled), parse(&policy.when_deleted)) {
            (Some(when_scaled), Some(when_deleted)) => Policy {
                when_scaled,
                when_deleted,
            },
            _ => Policy::RETAIN,
        }
    }

    fn retains_all(self) -> bool {
        self == Policy::RETAIN
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "whenScaled={}, whenDeleted={}",
            self.when_scaled, self.when_deleted
        )
    }
}

/// The ordinals a set wants pods for: `[start, start + replicas)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ordinals {
    pub start: i32,
    pub replicas: i32,
}

impl Ordinals {
    /// `spec.ordinals.start` (default 0) and `spec.replicas` (default 1, as
    /// the API server defaults it).
    pub fn of(set: &StatefulSet) -> Ordinals {
        Ordinals {
            start: set
                .spec
                .ordinals
                .as_ref()
                .and_then(|o| o.start)
                .unwrap_or(0),
            replicas: set.spec.replicas.unwrap_or(1),
        }
    }

    /// Whether `ordinal` is outside the range: its pod is (or was) scaled
    /// down. Computed in i64 so that no start/replicas pair overflows.
    pub fn condemned(self, ordinal: i32) -> bool {
        let (o, start, replicas) = (
            i64::from(ordinal),
            i64::from(self.start),
            i64::from(self.replicas),
        );
        !(o >= start && o < start + replicas)
    }
}

/// The pod `<set>-<ordinal>` a claim belongs to, as the caches see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState<'a> {
    /// No such pod.
    Missing,
    /// The pod exists and the set is its controller.
    OfSet { uid: &'a str },
    /// A pod of that name exists but the set does not control it (not
    /// adopted yet, or someone else's); nothing can be decided for it.
    NotOfSet,
}

impl<'a> PodState<'a> {
    /// Classifies `pod` for the set with uid `set_uid`.
    pub fn of(pod: Option<&'a Pod>, set_uid: &str) -> PodState<'a> {
        let Some(pod) = pod else {
            return PodState::Missing;
        };
        let controlled = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.controller == Some(true) && r.uid == set_uid);
        match pod.metadata.uid.as_deref() {
            Some(uid) if controlled => PodState::OfSet { uid },
            _ => PodState::NotOfSet,
        }
    }
}

/// Everything the decision for one claim depends on.
#[derive(Debug, Clone, Copy)]
pub struct ClaimFacts<'a> {
    pub set_name: &'a str,
    pub set_uid: &'a str,
    pub policy: Policy,
    /// The claim's ordinal is outside the set's range.
    pub condemned: bool,
    /// `<set>-<ordinal>`.
    pub pod_name: &'a str,
    pub pod: PodState<'a>,
    pub owner_references: &'a [OwnerReference],
    /// The claim has a deletion timestamp.
    pub claim_deleting: bool,
    /// The claim's labels match the set's selector, as every claim the
    /// controller-manager creates from a template does. A claim whose name
    /// only happens to fit (hazard 6 of docs/design.md: set `redis` with template
    /// `data-cache` and set `cache-redis` with template `data` both name
    /// `data-cache-redis-0`) is not this set's.
    pub labels_match: bool,
}

/// Why a claim is left as it is although it may not match the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveReason {
    /// Already being deleted: its owners no longer matter.
    ClaimDeleting,
    /// A reference to a StatefulSet of the set's name but another uid: the
    /// claim belongs to an earlier set of that name (whose dependents were
    /// orphaned, or are being collected). The controller-manager leaves it
    /// alone; so do we.
    StaleSetReference,
    /// Likewise for a pod of the same name and another uid.
    StalePodReference,
    /// The claim references its pod but the pod is gone: the garbage
    /// collector will act on it (delete it, or drop the reference); acting
    /// now would race with it.
    DanglingPodReference,
    /// A pod of that name exists but is not controlled by the set.
    PodNotOfSet,
    /// Its labels do not match the set's selector: its name fits the set
    /// by accident; it belongs to someone else.
    NotSelectedBySet,
}

impl fmt::Display for LeaveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeaveReason::ClaimDeleting => "the claim is being deleted",
            LeaveReason::StaleSetReference => {
                "it references a StatefulSet of the same name with another uid"
            }
            LeaveReason::StalePodReference => {
                "it references a pod of the same name with another uid"
            }
            LeaveReason::DanglingPodReference => {
                "it references its pod, which is gone; the garbage collector handles it"
            }
            LeaveReason::PodNotOfSet => "its pod is not controlled by the StatefulSet",
            LeaveReason::NotSelectedBySet => {
                "its labels do not match the StatefulSet's selector (the name fits by accident)"
            }
        })
    }
}

/// What to do with one claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Its owner references match the policy.
    UpToDate,
    /// Replace `metadata.ownerReferences` with this list.
    SetOwnerReferences(Vec<OwnerReference>),
    /// Condemned, whenScaled=Delete and the pod is gone without having owned
    /// the claim: delete it, after re-reading the set live (it may have been
    /// scaled up again since the cache saw it).
    DeleteClaim,
    /// Do not touch it.
    Leave(LeaveReason),
}

/// The controller reference the controller-manager writes
/// (`metav1.NewControllerRef`).
pub fn controller_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn names(r: &OwnerReference, api_version: &str, kind: &str, name: &str) -> bool {
    r.api_version == api_version && r.kind == kind && r.name == name
}

/// The decision for one claim. The checks run in the controller-manager's
/// order: stale references, then another controller, then the matrix.
pub fn decide(f: &ClaimFacts<'_>) -> Decision {
    if f.claim_deleting {
        return Decision::Leave(LeaveReason::ClaimDeleting);
    }
    if !f.labels_match {
        return Decision::Leave(LeaveReason::NotSelectedBySet);
    }
    let pod_uid = match f.pod {
        PodState::NotOfSet => return Decision::Leave(LeaveReason::PodNotOfSet),
        PodState::OfSet { uid } => Some(uid),
        PodState::Missing => None,
    };
    let refs = f.owner_references;
    for r in refs {
        if names(
            r,
            wk::STATEFULSET_API_VERSION,
            wk::STATEFULSET_KIND,
            f.set_name,
        ) && r.uid != f.set_uid
        {
            return Decision::Leave(LeaveReason::StaleSetReference);
        }
        if names(r, wk::POD_API_VERSION, wk::POD_KIND, f.pod_name) {
            match pod_uid {
                Some(uid) if uid != r.uid => {
                    return Decision::Leave(LeaveReason::StalePodReference);
                }
                Some(_) => {}
                None => return Decision::Leave(LeaveReason::DanglingPodReference),
            }
        }
    }
    // Our references are recognised by uid (uids are unique cluster-wide),
    // whatever their kind, controller or blockOwnerDeletion fields say.
    let is_set = |r: &OwnerReference| r.uid == f.set_uid;
    let is_pod = |r: &OwnerReference| pod_uid.is_some_and(|uid| r.uid == uid);
    let is_ours = |r: &OwnerReference| is_set(r) || is_pod(r);
    let others: Vec<OwnerReference> = refs.iter().filter(|r| !is_ours(r)).cloned().collect();

    // Another controller: drop our references, add none. Under Retain/Retain
    // the controller-manager does not look for one (there is nothing to add
    // anyway, and the matrix below removes ours all the same).
    let another_controller =
        !f.policy.retains_all() && others.iter().any(|r| r.controller == Some(true));
    if another_controller {
        return if others.len() == refs.len() {
            Decision::UpToDate
        } else {
            Decision::SetOwnerReferences(others)
        };
    }

    let scaled_delete = f.policy.when_scaled == Retention::Delete && f.condemned;
    if scaled_delete && pod_uid.is_none() {
        return Decision::DeleteClaim;
    }
    let want_pod = scaled_delete;
    let want_set = f.policy.when_deleted == Retention::Delete && !scaled_delete;

    // A reference of ours without `controller: true` is rewritten, as the
    // controller-manager does (its `hasNonControllerOwner`).
    let all_controllers = refs
        .iter()
        .filter(|r| is_ours(r))
        .all(|r| r.controller == Some(true));
    if all_controllers && refs.iter().any(is_set) == want_set && refs.iter().any(is_pod) == want_pod
    {
        return Decision::UpToDate;
    }
    // Others keep their place; ours are appended, as the controller-manager
    // appends them after scrubbing.
    let mut wanted = others;
    if want_set {
        wanted.push(controller_ref(
            wk::STATEFULSET_API_VERSION,
            wk::STATEFULSET_KIND,
            f.set_name,
            f.set_uid,
        ));
    }
    if let (true, Some(uid)) = (want_pod, pod_uid) {
        wanted.push(controller_ref(
            wk::POD_API_VERSION,
            wk::POD_KIND,
            f.pod_name,
            uid,
        ));
    }
    Decision::SetOwnerReferences(wanted)
}

/// The ordinal of `claim_name` if it is `<template>-<set>-<ordinal>` for one
/// of `templates`. The ordinal must be written as the controller-manager
/// writes it (`%d`: decimal, no sign, no leading zero), so `data-web-1x`,
/// `data-web-01` and `data-web-x-0` (set `web-x`) are not claims of `web`.
pub fn claim_ordinal<'t>(
    claim_name: &str,
    set_name: &str,
    templates: impl IntoIterator<Item = &'t str>,
) -> Option<i32> {
    templates.into_iter().find_map(|template| {
        let rest = claim_name
            .strip_prefix(template)?
            .strip_prefix('-')?
            .strip_prefix(set_name)?
            .strip_prefix('-')?;
        parse_ordinal(rest)
    })
}

fn parse_ordinal(text: &str) -> Option<i32> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if canonical { text.parse().ok() } else { None }
}

/// The pod name of an ordinal (`<set>-<ordinal>`).
pub fn pod_name(set_name: &str, ordinal: i32) -> String {
    format!("{set_name}-{ordinal}")
}

/// The StatefulSet a pod belongs to by name (`<set>-<ordinal>`), for
/// mapping pod events to sets.
pub fn pod_set_name(pod_name: &str) -> Option<&str> {
    let (set, ordinal) = pod_name.rsplit_once('-')?;
    parse_ordinal(ordinal).map(|_| set)
}

/// The StorageClass a claim (or claim template) asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassRequest<'a> {
    Named(&'a str),
    /// `storageClassName: ""`: no class, statically bound.
    NoClass,
    /// No class name: the default class (admission fills it in on create).
    Default,
}

impl<'a> ClassRequest<'a> {
    /// The beta annotation wins over `spec.storageClassName`, as in Kubernetes.
    pub fn of(claim: &'a PersistentVolumeClaim) -> ClassRequest<'a> {
        let name = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(wk::ANN_BETA_STORAGE_CLASS))
            .map(|class| class.as_str())
            .or_else(|| claim.spec.as_ref()?.storage_class_name.as_deref());
        match name {
            None => ClassRequest::Default,
            Some("") => ClassRequest::NoClass,
            Some(name) => ClassRequest::Named(name),
        }
    }
}

/// The default class as the DefaultStorageClass admission plugin picks it:
/// marked default (GA or beta annotation), newest creation time first, then
/// name.
pub fn default_class<'c>(
    classes: impl IntoIterator<Item = &'c StorageClass>,
) -> Option<&'c StorageClass> {
    classes
        .into_iter()
        .filter(|c| {
            let a = c.metadata.annotations.as_ref();
            [wk::ANN_DEFAULT_CLASS, wk::ANN_BETA_DEFAULT_CLASS]
                .iter()
                .any(|key| a.and_then(|a| a.get(*key)).map(String::as_str) == Some("true"))
        })
        .max_by(|a, b| {
            let key = |c: &'c StorageClass| {
                (
                    c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    c.metadata.name.clone(),
                )
            };
            key(a).cmp(&key(b))
        })
}

/// Whether a claim (or template) resolves to a class whose provisioner is
/// `driver` (or the in-tree plugin `driver` took over). A class that does not exist (yet) is not ours: we act only on
/// what we can attribute.
pub fn claim_is_for_driver(
    claim: &PersistentVolumeClaim,
    classes: &[&StorageClass],
    driver: &str,
) -> bool {
    let class = match ClassRequest::of(claim) {
        ClassRequest::NoClass => None,
        ClassRequest::Default => default_class(classes.iter().copied()),
        ClassRequest::Named(name) => classes
            .iter()
            .copied()
            .find(|c| c.metadata.name.as_deref() == Some(name)),
    };
    // CSI migration: the in-tree plugin our driver took over provisions
    // through us (EKS's `gp2`: `kubernetes.io/aws-ebs`).
    let migrated_from = crate::migration::InTreePlugin::from_csi_driver(driver)
        .map(crate::migration::InTreePlugin::in_tree_name);
    class.is_some_and(|c| c.provisioner == driver || Some(c.provisioner.as_str()) == migrated_from)
}

/// Why a whole set is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetSkip {
    /// Deleted with `propagationPolicy: Orphan`: its claims must survive it.
    OrphanDeletion,
    /// Being deleted otherwise (foreground): the garbage collector deletes
    /// what our references say; the controller-manager, too, stops
    /// managing a set once it has a deletion timestamp.
    Deleting,
    /// No claim template resolves to our driver.
    NoTemplateForDriver,
}

impl fmt::Display for SetSkip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SetSkip::OrphanDeletion => "it is being deleted with orphan propagation",
            SetSkip::Deleting => "it is being deleted",
            SetSkip::NoTemplateForDriver => "none of its claim templates is for this driver",
        })
    }
}

/// One claim of a set and what to do with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimPlan {
    pub claim: String,
    pub ordinal: i32,
    pub condemned: bool,
    pub decision: Decision,
}

/// The decisions for every claim of `set` among `claims` (the set's
/// namespace). `pod` looks a pod up by name in that namespace.
pub fn plan_set<'p>(
    set: &StatefulSet,
    claims: &[&PersistentVolumeClaim],
    pod: impl Fn(&str) -> Option<&'p Pod>,
    classes: &[&StorageClass],
    driver: &str,
) -> Result<Vec<ClaimPlan>, SetSkip> {
    if set.metadata.deletion_timestamp.is_some() {
        let orphan = set
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == wk::FINALIZER_ORPHAN);
        return Err(if orphan {
            SetSkip::OrphanDeletion
        } else {
            SetSkip::Deleting
        });
    }
    let templates: Vec<&PersistentVolumeClaim> = set
        .spec
        .volume_claim_templates
        .iter()
        .flatten()
        .filter(|t| claim_is_for_driver(t, classes, driver))
        .collect();
    if templates.is_empty() {
        return Err(SetSkip::NoTemplateForDriver);
    }
    let template_names: Vec<&str> = templates
        .iter()
        .filter_map(|t| t.metadata.name.as_deref())
        .collect();
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    let set_uid = set.metadata.uid.as_deref().unwrap_or_default();
    let policy = Policy::of(set);
    let ordinals = Ordinals::of(set);
    let mut plans = Vec::new();
    for claim in claims {
        let Some(name) = claim.metadata.name.as_deref() else {
            continue;
        };
        if claim.metadata.namespace.as_deref() != set.metadata.namespace.as_deref() {
            continue;
        }
        let Some(ordinal) = claim_ordinal(name, set_name, template_names.iter().copied()) else {
            continue;
        };
        // The template says which driver a claim should have; the claim
        // itself says which one it has (a pre-created claim may differ).
        if !claim_is_for_driver(claim, classes, driver) {
            continue;
        }
        let pod_name = pod_name(set_name, ordinal);
        let condemned = ordinals.condemned(ordinal);
        let facts = ClaimFacts {
            set_name,
            set_uid,
            policy,
            condemned,
            pod_name: &pod_name,
            pod: PodState::of(pod(&pod_name), set_uid),
            owner_references: claim
                .metadata
                .owner_references
                .as_deref()
                .unwrap_or_default(),
            claim_deleting: claim.metadata.deletion_timestamp.is_some(),
            labels_match: selector_matches(&set.spec.selector, claim.metadata.labels.as_ref()),
        };
        plans.push(ClaimPlan {
            claim: name.to_owned(),
            ordinal,
            condemned,
            decision: decide(&facts),
        });
    }
    plans.sort_by_key(|p| p.ordinal);
    Ok(plans)
}

/// Whether `labels` satisfy a label selector (matchLabels and every
/// matchExpressions requirement: In, NotIn, Exists, DoesNotExist). An
/// empty selector selects everything, as in Kubernetes; an unknown
/// operator selects nothing.
pub fn selector_matches(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: Option<&crate::projection::Map>,
) -> bool {
    let empty = crate::projection::Map::default();
    let labels = labels.unwrap_or(&empty);
    let simple = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k).is_some_and(|label| label == v));
    let expressions = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.iter().any(|w| v == w)),
            "NotIn" => value.is_none_or(|v| !values.iter().any(|w| v == w)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    simple && expressions
}

/// The JSON patch (RFC 6902) replacing a claim's owner references with
/// `wanted`, touching nothing else. Guarded so that concurrent writers (the
/// controller-manager, the garbage collector, users) are never clobbered:
/// `test` of the uid (a claim re-created under the same name is another
/// claim), then `test` of the current list as we read it, or of the
/// resourceVersion when there is no list to test. A failed test is HTTP 422:
/// re-read and decide again.
pub fn owner_references_patch(
    uid: &str,
    resource_version: &str,
    current: &[OwnerReference],
    wanted: &[OwnerReference],
) -> serde_json::Value {
    use serde_json::json;
    let guard = if current.is_empty() {
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    } else {
        json!({"op": "test", "path": "/metadata/ownerReferences", "value": current})
    };
    let change = if wanted.is_empty() {
        json!({"op": "remove", "path": "/metadata/ownerReferences"})
    } else {
        // `add` of an object member replaces it when present (RFC 6902 4.1).
        json!({"op": "add", "path": "/metadata/ownerReferences", "value": wanted})
    };
    json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        guard,
        change,
    ])
}
