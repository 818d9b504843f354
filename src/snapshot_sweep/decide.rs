//! The sweep's decisions: which VolumeSnapshots a pending claim still
//! restores from, and which carry our source-protection finalizer without
//! any such claim.

use std::collections::BTreeSet;

use crate::projection::PersistentVolumeClaim;

use crate::api::snapshot::VolumeSnapshot;
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
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(name: &str, phase: Option<&str>, spec: serde_json::Value) -> PersistentVolumeClaim {
        let mut value = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": spec});
        if let Some(phase) = phase {
            value["status"] = json!({"phase": phase});
        }
        serde_json::from_value(value).expect("claim")
    }

    fn snap(name: &str, finalizers: &[&str]) -> VolumeSnapshot {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "ns", "finalizers": finalizers}}),
        )
        .expect("snapshot")
    }

    #[test]
    fn which_claims_keep_a_snapshot_protected() {
        let from = |name: &str| json!({"dataSource": {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": name}});
        let claims = [
            claim("a", Some("Pending"), from("s1")),
            claim("b", None, from("s2")),
            claim("c", Some("Bound"), from("s3")),
            claim("d", Some("Lost"), from("s4")),
            claim(
                "e",
                Some("Pending"),
                json!({"dataSourceRef": {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "s5", "namespace": "other"}}),
            ),
            claim(
                "f",
                Some("Pending"),
                json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "s6"}}),
            ),
            claim(
                "g",
                Some("Pending"),
                json!({"dataSource": {"kind": "VolumeSnapshot", "apiGroup": "example.com", "name": "s7"}}),
            ),
            claim(
                "h",
                Some("Pending"),
                json!({"dataSource": {"kind": "VolumeSnapshot", "name": "s8"}}),
            ),
        ];
        let pending = pending_snapshots(claims.iter());
        assert_eq!(
            pending.iter().map(String::as_str).collect::<Vec<_>>(),
            ["ns/s1", "ns/s2", "ns/s8", "other/s5"]
        );
        assert!(is_orphaned(
            &snap("s3", &[wk::FINALIZER_SNAPSHOT_SOURCE]),
            &pending
        ));
        assert!(!is_orphaned(
            &snap("s1", &[wk::FINALIZER_SNAPSHOT_SOURCE]),
            &pending
        ));
        assert!(!is_orphaned(
            &snap("s3", &["someone.else/finalizer"]),
            &pending
        ));
        assert!(!is_orphaned(&snap("s3", &[]), &pending));
    }
}
