//! End-to-end: the sidecar killed in the remaining windows between a
//! backend change and the API write that records it, and the reschedule of
//! a WaitForFirstConsumer claim on RESOURCE_EXHAUSTED.

mod support;

use std::time::Duration;

use csi_hostpath::faults::Fault;
use kube::api::{Api, DeleteParams};
use kube_testserver::{RequestMatch, Verb};
use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::standard();
    resource_exhausted_on_the_selected_node_reschedules,
    a_retry_sends_the_frozen_request,
);

async fn journal_entries(env: &Env) -> usize {
    env.journal().await.len()
}

/// Killed after the PV was saved but before its journal entry was pruned:
/// the restart prunes the entry and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_pv_is_saved_keeps_the_volume() {
    // Needs the API test server (fault injection or exact counters).
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    // The journal's first write (create) goes through; pruning (an update)
    // hangs, so the kill lands between the saved PV and the pruned entry.
    env.api().add_latency(
        RequestMatch::new(Verb::Update, "configmaps"),
        Duration::from_secs(60),
    );
    env.create_pvc(&env.ns, "kept", "fast", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "kept").await;
    assert_eq!(
        journal_entries(&env).await,
        1,
        "entry written, not yet pruned"
    );
    env.kill_sidecar();
    env.api().clear_faults();

    env.start_sidecar(&[]).await;
    env.wait_for("journal pruned", Duration::from_secs(20), || async {
        (journal_entries(&env).await == 0).then_some(())
    })
    .await;
    let name = pv.metadata.name.clone().expect("name");
    assert!(env.pv(&name).await.is_some(), "PV kept");
    assert_eq!(env.backend_volumes().len(), 1, "volume kept");
    env.assert_consistent().await;
}

/// Killed after DeleteVolume but before the PV object was deleted: the
/// restart repeats the (idempotent) DeleteVolume and finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_delete_volume_finishes_on_restart() {
    // Needs the API test server (fault injection or exact counters).
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "gone", "fast").await;
    env.api().add_latency(
        RequestMatch::new(Verb::Delete, "persistentvolumes"),
        Duration::from_secs(60),
    );
    env.delete_pvc(&env.ns, "gone").await;
    env.wait_for(
        "backend volume deleted",
        Duration::from_secs(20),
        || async { env.backend_volumes().is_empty().then_some(()) },
    )
    .await;
    env.kill_sidecar();
    env.api().clear_faults();
    assert!(env.pv(&name).await.is_some(), "the PV was not deleted yet");

    env.start_sidecar(&[]).await;
    env.wait_for(
        "PV deleted after restart",
        Duration::from_secs(20),
        || async { env.pv(&name).await.is_none().then_some(()) },
    )
    .await;
    env.assert_consistent().await;
}

/// RESOURCE_EXHAUSTED for a claim with a selected node: the annotation is
/// removed so the scheduler can pick another node (upstream behaviour).
async fn resource_exhausted_on_the_selected_node_reschedules(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    env.set_faults(vec![Fault::error(
        "CreateVolume",
        tonic::Code::ResourceExhausted,
    )]);
    env.start_sidecar(&[]).await;
    env.create_pvc(
        &env.ns,
        "late",
        "late",
        "5Mi",
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": env.node.as_str()}}}),
    )
    .await;
    env.wait_for("selected node removed", Duration::from_secs(20), || async {
        let pvc = env.pvc(&env.ns, "late").await?;
        let annotations = pvc.metadata.annotations.unwrap_or_default();
        (!annotations.contains_key("volume.kubernetes.io/selected-node")).then_some(())
    })
    .await;
    assert!(env.backend_volumes().is_empty());
    assert!(env.pvs().await.is_empty());
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        env.client.clone(),
        &env.ns,
    )
    .delete("late", &DeleteParams::default())
    .await
    .expect("delete");
}

/// Upstream #1235: once DeleteVolume succeeded, a retry of the PV (here:
/// deleting the PV object failed) and its update events must not call it
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_volume_is_not_repeated_for_the_following_updates() {
    // Needs the API test server: deleting the PV object is made to fail.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "once", "fast").await;
    env.api()
        .fail_next(2, RequestMatch::new(Verb::Delete, "persistentvolumes"), 500);
    env.delete_pvc(&env.ns, "once").await;
    env.wait_for(
        "backend volume deleted",
        Duration::from_secs(20),
        || async { env.backend_volumes().is_empty().then_some(()) },
    )
    .await;
    // Any further DeleteVolume now fails loudly.
    env.set_faults(vec![Fault::error("DeleteVolume", tonic::Code::Internal)]);
    // Update events on the PV while it is retried.
    for i in 0..3 {
        let patch = json!({"metadata": {"labels": {"touched": format!("{i}")}}});
        let _ = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(env.client.clone())
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.wait_for("PV deleted", Duration::from_secs(20), || async {
        env.pv(&name).await.is_none().then_some(())
    })
    .await;
    let failed = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client.clone(), &env.ns)
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("VolumeFailedDelete"))
        .count();
    assert_eq!(failed, 0, "DeleteVolume was called again\n{}", env.logs());
    env.clear_faults();
}

/// lib #152 / #1465: a retry sends the request of the first attempt, even
/// when the cluster's topology changed meanwhile. Here the only node is
/// relabelled while the first CreateVolume fails slowly; a recomputed
/// request would ask for the new label, which this driver cannot serve.
async fn a_retry_sends_the_frozen_request(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![
        Fault::error("CreateVolume", tonic::Code::Unavailable)
            .with_delay(Duration::from_millis(1500))
            .times(1),
    ]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "frozen", "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "first CreateVolume under way",
        Duration::from_secs(20),
        || async { env.logs().contains("calling CreateVolume").then_some(()) },
    )
    .await;
    let patch = json!({"metadata": {"labels": {csi_hostpath::TOPOLOGY_KEY: "elsewhere"}}});
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .patch(
            env.node.as_str(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("relabel node");
    let pv = env.wait_bound(&env.ns, "frozen").await;
    assert!(
        !env.logs().contains("ResourceExhausted"),
        "a retry asked for the new topology\n{}",
        env.logs()
    );
    let terms = pv
        .spec
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .expect("affinity")
        .node_selector_terms;
    let values = terms[0].match_expressions.as_ref().expect("expressions")[0]
        .values
        .clone()
        .unwrap_or_default();
    assert_eq!(values, vec![env.node.as_str().to_owned()]);
}
