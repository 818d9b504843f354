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

/// A restore replayed from the journal is no pending claim, but its
/// `CreateVolume` reads the snapshot: the handle of the snapshot's content
/// tells whether it is one an operation in flight restores from.
#[test]
fn an_operation_in_flight_keeps_its_snapshot_protected() {
    let content = |status: Option<&str>, spec: Option<&str>| {
        serde_json::from_value::<VolumeSnapshotContent>(json!({
            "metadata": {"name": "c"},
            "spec": {"driver": "d", "deletionPolicy": "Delete",
                     "source": spec.map_or(json!({"volumeHandle": "v"}), |h| json!({"snapshotHandle": h}))},
            "status": status.map(|h| json!({"snapshotHandle": h})),
        }))
        .expect("content")
    };
    let in_flight: BTreeSet<String> = ["snap-1".to_owned()].into();
    assert!(restored_by(
        Some(&content(Some("snap-1"), None)),
        &in_flight
    ));
    assert!(
        restored_by(Some(&content(None, Some("snap-1"))), &in_flight),
        "pre-provisioned"
    );
    assert!(!restored_by(
        Some(&content(Some("snap-2"), None)),
        &in_flight
    ));
    assert!(!restored_by(Some(&content(None, None)), &in_flight));
    assert!(!restored_by(None, &in_flight), "no content, no restore");
    assert!(!restored_by(
        Some(&content(Some("snap-1"), None)),
        &BTreeSet::new()
    ));
}
