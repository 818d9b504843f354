//! End-to-end: the PVC-protection loop (gate `PVCProtection`) of the real
//! binary against the API test server (which, like a cluster without the
//! controller-manager's pvc-protection controller, never adds the finalizer
//! itself) and the hostpath driver.

#[path = "support/loops.rs"]
mod loops;
mod support;

use std::time::Duration;

use kube_testserver::Verb;
use loops::{
    PVC_PROTECTION, assert_stays, claim_finalizers, create_pod, delete_pod, set_pod_phase,
    wait_protected, wait_watching,
};
use serde_json::json;
use support::Env;

const GATE_ON: &str = "--feature-gates=PVCProtection=true";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_use_stays_until_its_pod_is_deleted() {
    let mut env = Env::new().await;
    env.storage_class("fast", "Immediate", "Delete", json!({}));
    env.start_sidecar(&[GATE_ON]);

    env.create_pvc("default", "data", "fast", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound("default", "data").await;
    let pv_name = pv.metadata.name.clone().expect("pv name");
    wait_protected(&env, "default", "data").await;

    create_pod(&env, "default", "web", &["data"], true).await;
    env.delete_pvc("default", "data").await;

    let terminating = || async {
        env.pvc("default", "data").await.is_some_and(|pvc| {
            pvc.metadata.deletion_timestamp.is_some()
                && claim_finalizers(&pvc).contains(&PVC_PROTECTION.to_owned())
        })
    };
    assert_stays(
        "claim used by a running pod stays Terminating",
        Duration::from_secs(2),
        terminating,
    )
    .await;

    // A terminated pod that is still scheduled may still have the volume
    // mounted: the claim waits for the pod object to go.
    set_pod_phase(&env, "default", "web", "Succeeded");
    assert_stays(
        "claim used by a Succeeded pod stays Terminating",
        Duration::from_secs(2),
        terminating,
    )
    .await;
    assert!(env.pv(&pv_name).await.is_some(), "PV kept while in use");
    assert_eq!(env.backend_volumes().len(), 1);

    delete_pod(&env, "default", "web").await;
    env.wait_for(
        "claim, PV and backend volume gone",
        Duration::from_secs(30),
        || async {
            let claim_gone = env.pvc("default", "data").await.is_none();
            let pv_gone = env.pv(&pv_name).await.is_none();
            (claim_gone && pv_gone && env.backend_volumes().is_empty()).then_some(())
        },
    )
    .await;
    env.assert_consistent().await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unscheduled_pods_do_not_block_and_other_drivers_claims_are_untouched() {
    let mut env = Env::new().await;
    env.storage_class("fast", "Immediate", "Delete", json!({}));
    env.api
        .create_object(json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "foreign"},
            "provisioner": "other.csi.example.com",
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }))
        .expect("foreign class");
    env.create_pvc("default", "theirs", "foreign", "5Mi", json!({}))
        .await;
    env.start_sidecar(&[GATE_ON]);

    env.create_pvc("default", "data", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound("default", "data").await;
    wait_protected(&env, "default", "data").await;
    // A pod that was never scheduled cannot have mounted the volume.
    create_pod(&env, "default", "pending", &["data", "theirs"], false).await;
    env.delete_pvc("default", "data").await;
    env.wait_for("claim gone", Duration::from_secs(20), || async {
        env.pvc("default", "data").await.is_none().then_some(())
    })
    .await;

    let theirs = env.pvc("default", "theirs").await.expect("foreign claim");
    assert!(
        claim_finalizers(&theirs).is_empty(),
        "another driver's claim got {:?}",
        claim_finalizers(&theirs)
    );
    assert_eq!(
        loops::changes_to(&env, "persistentvolumeclaims", "theirs"),
        0,
        "no write to another driver's claim"
    );
    env.wait_for("PV and volume gone", Duration::from_secs(30), || async {
        (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_existed_before_the_start_are_protected_and_a_live_list_confirms() {
    let mut env = Env::new().await;
    env.storage_class("fast", "Immediate", "Delete", json!({}));
    env.start_sidecar(&[]);
    env.create_pvc("default", "old", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound("default", "old").await;
    env.stop_sidecar();

    env.api.reset_counters();
    env.start_sidecar(&[GATE_ON]);
    wait_protected(&env, "default", "old").await;
    env.delete_pvc("default", "old").await;
    env.wait_for("claim gone", Duration::from_secs(20), || async {
        env.pvc("default", "old").await.is_none().then_some(())
    })
    .await;
    // The cache lists pods cluster-wide; the confirmation lists the claim's
    // namespace.
    let live_lists = env
        .api
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::List && r.resource == "pods" && r.namespace == "default")
        .count();
    assert_eq!(live_lists, 1, "one live list confirmed the cache");
    env.wait_for("PV and volume gone", Duration::from_secs(30), || async {
        (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_off_makes_no_claim_write_and_watches_no_pods() {
    let mut env = Env::new().await;
    env.storage_class("fast", "Immediate", "Delete", json!({}));
    env.start_sidecar(&[]);
    wait_watching(&env, "persistentvolumeclaims").await;

    env.create_pvc("default", "data", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound("default", "data").await;
    create_pod(&env, "default", "web", &["data"], true).await;
    // Give a (wrongly) running loop time to act.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pvc = env.pvc("default", "data").await.expect("claim");
    assert!(
        claim_finalizers(&pvc).is_empty(),
        "{:?}",
        claim_finalizers(&pvc)
    );

    env.delete_pvc("default", "data").await;
    assert!(
        env.pvc("default", "data").await.is_none(),
        "without the finalizer the claim goes at once"
    );
    env.wait_for("PV and volume gone", Duration::from_secs(30), || async {
        (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        env.api.request_count(Verb::Patch, "persistentvolumeclaims"),
        0
    );
    assert_eq!(
        env.api
            .request_count(Verb::Update, "persistentvolumeclaims"),
        0
    );
    assert_eq!(env.api.request_count(Verb::List, "pods"), 0);
    assert_eq!(env.api.request_count(Verb::Watch, "pods"), 0);
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}
