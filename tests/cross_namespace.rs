//! Cross-namespace data sources (gate `CrossNamespaceVolumeDataSource`): a
//! claim clones a PVC of another namespace only once a ReferenceGrant there
//! allows it; refused before with upstream's message. On the real cluster
//! the API server runs with its own `CrossNamespaceVolumeDataSource` gate
//! (it drops `dataSourceRef.namespace` otherwise) and the Gateway API's
//! ReferenceGrant CRD is installed by the test.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::standard().with_apiserver_feature_gates("CrossNamespaceVolumeDataSource=true");
    a_clone_from_another_namespace_waits_for_a_reference_grant,
    a_revoked_reference_grant_allows_nothing,
);

fn handle(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("csi handle")
}

const GATE: &str = "--feature-gates=CrossNamespaceVolumeDataSource=true";

async fn a_clone_from_another_namespace_waits_for_a_reference_grant(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.install_reference_grant_crd().await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let source_ns = format!("src-{}", env.id);
    env.create_namespace(&source_ns).await;
    env.start_sidecar(&[GATE]).await;

    env.create_pvc(&source_ns, "source", "fast", "5Mi", json!({}))
        .await;
    let source = env.wait_bound(&source_ns, "source").await;
    let source_handle = handle(&source);
    std::fs::write(
        csi_hostpath::volume_path(&env.driver.state_dir, &source_handle).join("data.txt"),
        "from another namespace",
    )
    .expect("write into the source volume");

    env.create_pvc(
        &env.ns,
        "copy",
        "fast",
        "5Mi",
        json!({"spec": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "source", "namespace": source_ns}}}),
    )
    .await;
    let claim = env.pvc(&env.ns, "copy").await.expect("claim");
    assert_eq!(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.data_source_ref.as_ref())
            .and_then(|r| r.namespace.clone()),
        Some(source_ns.clone()),
        "the API server kept dataSourceRef.namespace (its gate is on)"
    );
    // No grant: refused with upstream's message, no volume.
    let message = env.wait_event(&env.ns, "copy", "ProvisioningFailed").await;
    assert!(
        message.contains(&format!(
            "accessing {source_ns}/source of PersistentVolumeClaim dataSource from {}/copy isn't allowed",
            env.ns
        )),
        "{message}"
    );
    assert_eq!(env.backend_volumes().len(), 1, "only the source exists");

    // A grant for another namespace's claims changes nothing ...
    env.create(json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "others", "namespace": source_ns},
        "spec": {
            "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": "someone-else"}],
            "to": [{"group": "", "kind": "PersistentVolumeClaim"}],
        },
    }))
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.backend_volumes().len(), 1, "still refused");
    // ... one for this namespace's claims lets the clone proceed, without
    // waiting out the claim's backoff.
    env.create(json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "allow-copy", "namespace": source_ns},
        "spec": {
            "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": env.ns}],
            "to": [{"group": "", "kind": "PersistentVolumeClaim", "name": "source"}],
        },
    }))
    .await;
    let copy = env.wait_bound(&env.ns, "copy").await;
    let copy_handle = handle(&copy);
    let copied = std::fs::read_to_string(
        csi_hostpath::volume_path(&env.driver.state_dir, &copy_handle).join("data.txt"),
    )
    .expect("data copied");
    assert_eq!(copied, "from another namespace");
    env.assert_consistent().await;
}

/// A ReferenceGrant revoked a moment ago allows nothing, even while the
/// sidecar's ReferenceGrant watch has not brought it the deletion (its
/// events lagged): copying data across namespaces rests on the grants as
/// the API server has them (docs/design.md, "Reading current state").
async fn a_revoked_reference_grant_allows_nothing(backend: Backend) {
    const LAG: Duration = Duration::from_secs(4);
    const WATCHED: &str = "referencegrants";
    let mut env = Env::new(backend).await;
    env.install_reference_grant_crd().await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let source_ns = format!("src-{}", env.id);
    env.create_namespace(&source_ns).await;
    env.through_lag_proxy();
    env.start_sidecar(&[GATE]).await;
    env.create_pvc(&source_ns, "source", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&source_ns, "source").await;
    env.create(json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "allow-copy", "namespace": source_ns},
        "spec": {
            "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": env.ns}],
            "to": [{"group": "", "kind": "PersistentVolumeClaim", "name": "source"}],
        },
    }))
    .await;
    // The grant reaches the sidecar's cache before its watch lags.
    tokio::time::sleep(Duration::from_secs(1)).await;

    env.lag_watch(WATCHED, LAG);
    env.delete(
        "gateway.networking.k8s.io/v1beta1",
        "ReferenceGrant",
        &source_ns,
        "allow-copy",
    )
    .await;
    env.create_pvc(
        &env.ns,
        "copy",
        "fast",
        "5Mi",
        json!({"spec": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "source", "namespace": source_ns}}}),
    )
    .await;
    let message = env.wait_event(&env.ns, "copy", "ProvisioningFailed").await;
    assert!(message.contains("isn't allowed"), "{message}");
    let started = std::time::Instant::now();
    while started.elapsed() < LAG {
        assert_eq!(
            env.backend_volumes().len(),
            1,
            "({}) the clone was made {:?} after its grant was revoked (the grants' watch lagged \
             {LAG:?}, {} event(s) held)\n{}",
            env.backend_name(),
            started.elapsed(),
            env.watch_events_held(WATCHED),
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        env.watch_events_held(WATCHED) > 0,
        "({}) the lag never held a ReferenceGrant event: the fault did not strike",
        env.backend_name()
    );
    env.clear_watch_lag(WATCHED);
    env.delete_pvc(&env.ns, "copy").await;
    env.assert_consistent().await;
}
