//! The sweep's decisions: which VolumeSnapshots a pending claim still
//! restores from, and which carry our source-protection finalizer without
//! any such claim.

use std::collections::BTreeSet;

use crate::projection::PersistentVolumeClaim;

use crate::api::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use crate::wellknown as wk;

/// `namespace/name` of the snapshot a claim restores from, when it does.
pub fn snapshot_source(claim: &PersistentVolumeClaim) -> Option<String> {
    let namespace = claim.metadata.namespace.as_deref()?;
    let spec = claim.spec.as_ref()?;
    let is_snapshot = |kind: &str, group: Option<&String>| {
        kind == wk::SNAPSHOT_KIND
            && group.is_none_or(|g| g.is_empty() || g == wk::SNAPSHOT_API_GROUP)
    };
    if let Some(source) = &spec.data_source_ref
        && is_snapshot(&source.kind, source.api_group.as_ref())
    {
        let ns = source
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(namespace);
        return Some(format!("{ns}/{}", source.name));
    }
    let source = spec.data_source.as_ref()?;
    is_snapshot(&source.kind, source.api_group.as_ref())
        .then(|| format!("{namespace}/{}", source.name))
}

/// Snapshots some claim still waits to be restored from: claims whose
/// phase is Pending (or not set yet), as upstream's sweep counts them.
pub fn pending_snapshots<'a>(
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> BTreeSet<String> {
    claims
        .into_iter()
        .filter(|claim| {
            claim
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_none_or(|phase| phase.is_empty() || phase == "Pending")
        })
        .filter_map(snapshot_source)
        .collect()
}

/// Whether an operation in flight, restoring from one of the backend
/// snapshots `in_flight`, reads the snapshot of `content` (its handle:
/// the status's, or the spec's for a pre-provisioned content). A missing
/// content restores nothing.
pub fn restored_by(content: Option<&VolumeSnapshotContent>, in_flight: &BTreeSet<String>) -> bool {
    let Some(content) = content else {
        return false;
    };
    [
        content
            .status
            .as_ref()
            .and_then(|s| s.snapshot_handle.as_deref()),
        content.spec.source.snapshot_handle.as_deref(),
    ]
    .into_iter()
    .flatten()
    .any(|handle| in_flight.contains(handle))
}

/// Whether `snapshot` carries our finalizer that no pending claim needs.
pub fn is_orphaned(snapshot: &VolumeSnapshot, pending: &BTreeSet<String>) -> bool {
    let ours = snapshot
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == wk::FINALIZER_SNAPSHOT_SOURCE);
    let key = format!(
        "{}/{}",
        snapshot.metadata.namespace.as_deref().unwrap_or_default(),
        snapshot.metadata.name.as_deref().unwrap_or_default()
    );
    ours && !pending.contains(&key)
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
