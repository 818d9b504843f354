//! End-to-end: the PVC-protection loop (gate `PVCProtection`) of the real
//! binary against the API test server (which, like a cluster without the
//! controller-manager's pvc-protection controller, never adds the finalizer
//! itself) and the hostpath driver.

#[path = "support/loops.rs"]
mod loops;
mod support;

use std::time::Duration;

use kube_testserver::{RequestMatch, Verb};
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
async fn claims_that_existed_before_the_start_are_protected_through_conflicts_and_a_live_list_confirms()
 {
    let mut env = Env::new().await;
    env.storage_class("fast", "Immediate", "Delete", json!({}));
    env.start_sidecar(&[]);
    env.create_pvc("default", "old", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound("default", "old").await;
    env.stop_sidecar();

    env.api.reset_counters();
    // Conflicts on both finalizer writes: each is retried with backoff.
    let claim_patches = || {
        RequestMatch::new(Verb::Patch, "persistentvolumeclaims")
            .namespace("default")
            .name("old")
    };
    env.api.fail_next(2, claim_patches(), 409);
    env.start_sidecar(&[GATE_ON]);
    wait_protected(&env, "default", "old").await;
    env.api.fail_next(1, claim_patches(), 409);
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
    assert!(live_lists >= 1, "a live list confirmed the cache");
    let conflicts = env
        .api
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Patch && r.name == "old" && r.status == 409)
        .count();
    assert_eq!(conflicts, 3, "every injected conflict was met and retried");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_pod_frees_its_ephemeral_claim_but_not_its_named_one() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

    let mut env = Env::new().await;
    env.storage_class("fast", "Immediate", "Delete", json!({}));
    env.start_sidecar(&[GATE_ON]);

    // A scheduled pod with a generic ephemeral volume and a named claim,
    // held by a finalizer so that deleting it leaves it shut down
    // (deletion timestamp, grace period 0) rather than gone.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "finalizers": ["example.com/hold"]},
        "spec": {
            "nodeName": support::NODE,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            "volumes": [
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                    "resources": {"requests": {"storage": "5Mi"}}}}}},
                {"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}},
            ],
        },
    }))
    .expect("pod json");
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let pod_uid = pod.metadata.uid.clone().expect("pod uid");
    // The claim the ephemeral-volume controller would create for it.
    env.create_pvc(
        "default",
        "web-scratch",
        "fast",
        "5Mi",
        json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web",
            "uid": pod_uid, "controller": true, "blockOwnerDeletion": true}]}}),
    )
    .await;
    env.create_pvc("default", "shared", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound("default", "web-scratch").await;
    env.wait_bound("default", "shared").await;
    wait_protected(&env, "default", "web-scratch").await;
    wait_protected(&env, "default", "shared").await;

    env.delete_pvc("default", "web-scratch").await;
    env.delete_pvc("default", "shared").await;
    let terminating = |name: &'static str| {
        let env = &env;
        move || async move {
            env.pvc("default", name).await.is_some_and(|pvc| {
                pvc.metadata.deletion_timestamp.is_some()
                    && claim_finalizers(&pvc).contains(&PVC_PROTECTION.to_owned())
            })
        }
    };
    assert_stays(
        "ephemeral claim of a running pod stays",
        Duration::from_secs(1),
        terminating("web-scratch"),
    )
    .await;
    assert!(terminating("shared")().await, "named claim stays");

    pods.delete("web", &DeleteParams::default())
        .await
        .expect("delete pod");
    env.wait_for(
        "ephemeral claim of the shut-down pod gone",
        Duration::from_secs(20),
        || async {
            env.pvc("default", "web-scratch")
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(
        pods.get_opt("web").await.expect("get pod").is_some(),
        "the pod is still there (shut down, held by its finalizer)"
    );
    assert_stays(
        "named claim of a shut-down pod stays until the pod is gone",
        Duration::from_secs(1),
        terminating("shared"),
    )
    .await;

    pods.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release pod");
    env.wait_for(
        "named claim, PVs and volumes gone",
        Duration::from_secs(30),
        || async {
            let claim_gone = env.pvc("default", "shared").await.is_none();
            (claim_gone && env.pvs().await.is_empty() && env.backend_volumes().is_empty())
                .then_some(())
        },
    )
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}
