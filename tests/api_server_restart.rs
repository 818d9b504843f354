//! End-to-end on a real control plane of its own (this file's only test
//! restarts kube-apiserver, which no other test may share): every watch of
//! the sidecar ends, and, as the new API server's watch cache starts at the
//! current revision, resuming from the old resourceVersion gets `410 Gone`
//! and a re-list. Claims created during and after that must be provisioned,
//! and claims deleted meanwhile must have their volumes deleted (hazard 1
//! of docs/design.md: handlers were told about listed objects before the store held
//! them; the claims created after the restart stayed Pending).

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e_real!(ClusterConfig::standard();
    claims_created_and_deleted_across_an_api_server_restart_are_all_handled,
);

async fn claims_created_and_deleted_across_an_api_server_restart_are_all_handled(backend: Backend) {
    let mut env = Env::new(backend).await;
    let plane = env.plane().expect("real cluster");
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    for i in 0..10 {
        env.create_pvc(&env.ns, &format!("before-{i}"), "fast", "1Mi", json!({}))
            .await;
    }
    for i in 0..10 {
        env.wait_bound(&env.ns, &format!("before-{i}")).await;
    }
    // Enough writes after the sidecar's last event that the new API
    // server's watch cache cannot serve a watch from it.
    plane.restart_apiserver().expect("restart kube-apiserver");
    let client = plane.admin_client().await.expect("client");
    env.client = client;
    for i in 0..10 {
        env.create_pvc(&env.ns, &format!("after-{i}"), "fast", "1Mi", json!({}))
            .await;
    }
    for i in 0..5 {
        env.delete_pvc(&env.ns, &format!("before-{i}")).await;
    }
    for i in 0..10 {
        env.wait_bound(&env.ns, &format!("after-{i}")).await;
    }
    env.wait_for(
        "the deleted claims' volumes deleted",
        Duration::from_secs(60),
        || async {
            (env.backend_volumes().len() == 15 && env.pvs().await.len() == 15).then_some(())
        },
    )
    .await;
    assert!(
        env.logs().contains("watch failed") || env.logs().contains("too old"),
        "the restart was seen by the sidecar's watches\n{}",
        env.logs()
    );
    env.assert_consistent().await;
}
