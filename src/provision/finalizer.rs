//! The PV deletion-protection finalizer (HonorPVReclaimPolicy, KEP-2644) and
//! JSON patches that change finalizer lists safely from fresh state.

use crate::projection::PersistentVolume;
use serde::Serialize;
use serde_json::{Value, json};

use super::config::ProvisionerConfig;
use super::delete::{has_finalizer, is_our_volume};
use crate::wellknown as wk;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalizerChange {
    Add,
    Remove,
}

/// The change the PV loop makes to our finalizer on a PV (docs/design.md,
/// "Finalizers"):
/// - gate on: add to our Bound PVs with reclaim policy Delete and no deletion
///   timestamp (this covers PVs from before the sidecar ran and bound static
///   CSI PVs);
/// - remove when the reclaim policy is Retain or Recycle (the volume outlives
///   the PV, nothing for us to do at deletion);
/// - gate off: remove from every PV of ours, so a rollback leaves none stuck.
///
/// The removal after a successful `DeleteVolume` is the deletion flow's job.
/// Other drivers' PVs are never touched.
pub fn pv_finalizer_change(
    pv: &PersistentVolume,
    config: &ProvisionerConfig,
) -> Option<FinalizerChange> {
    if !is_our_volume(pv, config) {
        return None;
    }
    let present = has_finalizer(pv, wk::FINALIZER_PV);
    let policy = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.persistent_volume_reclaim_policy.as_deref());
    let keeps_volume = matches!(policy, Some("Retain" | "Recycle"));
    if !config.honor_pv_reclaim_policy || keeps_volume {
        return present.then_some(FinalizerChange::Remove);
    }
    let bound = pv
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        == Some("Bound");
    let add =
        !present && policy == Some("Delete") && pv.metadata.deletion_timestamp.is_none() && bound;
    add.then_some(FinalizerChange::Add)
}

/// A JSON patch (RFC 6902, as a JSON value for `kube::api::Patch::Json`)
/// removing `finalizer` from an object whose current list is `current`; `None`
/// when it is not there. The leading `test` of the whole list makes the API
/// server refuse the patch if the list changed since it was read, so a stale
/// cache can never remove someone else's finalizer or the wrong index: on
/// conflict (HTTP 422), re-read and try again.
pub fn remove_finalizer_patch<S: AsRef<str> + Serialize>(
    current: &[S],
    finalizer: &str,
) -> Option<Value> {
    let indices: Vec<usize> = current
        .iter()
        .enumerate()
        .filter(|(_, present)| present.as_ref() == finalizer)
        .map(|(index, _)| index)
        .collect();
    if indices.is_empty() {
        return None;
    }
    let mut operations =
        vec![json!({"op": "test", "path": "/metadata/finalizers", "value": current})];
    // From the back, so earlier removals do not shift later indices.
    operations.extend(
        indices
            .iter()
            .rev()
            .map(|index| json!({"op": "remove", "path": format!("/metadata/finalizers/{index}")})),
    );
    Some(Value::Array(operations))
}

/// Makes a JSON patch apply only to the object with `uid`: its first
/// operation `test`s `/metadata/uid`, so an object deleted and re-created
/// under the same name between the cache read and the patch fails it (422)
/// and keeps its finalizers. The finalizer list's own `test` cannot tell
/// the two apart: a new object often has the same list.
pub fn guard_uid(patch: Value, uid: &str) -> Value {
    let mut operations = vec![json!({"op": "test", "path": "/metadata/uid", "value": uid})];
    match patch {
        Value::Array(rest) => operations.extend(rest),
        other => operations.push(other),
    }
    Value::Array(operations)
}

/// A JSON patch adding `finalizer`; `None` when it is present. An existing
/// list is tested and appended to; a missing list can only be guarded by the
/// object's `resource_version`, which is tested before the list is created.
pub fn add_finalizer_patch<S: AsRef<str> + Serialize>(
    current: Option<&[S]>,
    finalizer: &str,
    resource_version: &str,
) -> Option<Value> {
    match current {
        Some(list) if list.iter().any(|present| present.as_ref() == finalizer) => None,
        Some(list) if !list.is_empty() => Some(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": list},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])),
        _ => Some(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])),
    }
}

#[cfg(test)]
#[path = "finalizer_tests.rs"]
mod tests;
