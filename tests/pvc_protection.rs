//! End-to-end: the PVC-protection loop (gate `PVCProtection`) of the real
//! binary and the hostpath driver, against
//! - the API test server, which (like a cluster without the
//!   controller-manager's pvc-protection controller) never adds or removes
//!   the finalizer itself;
//! - a real cluster whose controller-manager runs without `pvc-protection`
//!   (its admission plugin still adds the finalizer to every new claim; our
//!   loop is the only one to remove it);
//! - a real cluster where both run (coexistence: same verdicts, and neither
//!   undoes the other's writes, counted from the audit log).

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
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::without_controllers(&["pvc-protection"]),
    coexisting: ClusterConfig::standard();
    a_claim_in_use_stays_until_its_pod_is_deleted,
    unscheduled_pods_do_not_block_and_other_drivers_claims_are_untouched,
    a_shut_down_pod_frees_its_ephemeral_claim_but_not_its_named_one,
    gate_off_makes_no_claim_write_and_watches_no_pods,
);

const GATE_ON: &str = "--feature-gates=PVCProtection=true";

async fn a_claim_in_use_stays_until_its_pod_is_deleted(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[GATE_ON]).await;

    env.create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let pv_name = pv.metadata.name.clone().expect("pv name");
    wait_protected(&env, &env.ns, "data").await;

    create_pod(&env, &env.ns, "web", &["data"], true).await;
    env.delete_pvc(&env.ns, "data").await;

    let terminating = || async {
        env.pvc(&env.ns, "data").await.is_some_and(|pvc| {
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
    set_pod_phase(&env, &env.ns, "web", "Succeeded").await;
    assert_stays(
        "claim used by a Succeeded pod stays Terminating",
        Duration::from_secs(2),
        terminating,
    )
    .await;
    assert!(env.pv(&pv_name).await.is_some(), "PV kept while in use");
    assert_eq!(env.backend_volumes().len(), 1);

    delete_pod(&env, &env.ns, "web").await;
    env.wait_for(
        "claim, PV and backend volume gone",
        Duration::from_secs(30),
        || async {
            let claim_gone = env.pvc(&env.ns, "data").await.is_none();
            let pv_gone = env.pv(&pv_name).await.is_none();
            (claim_gone && pv_gone && env.backend_volumes().is_empty()).then_some(())
        },
    )
    .await;
    env.assert_consistent().await;
    if env.is_real() {
        // The audit-log counts the closing notes quote (`--nocapture`).
        let with = if env.runs_controller("pvc-protection") {
            "with the controller-manager's pvc-protection"
        } else {
            "alone"
        };
        println!("sidecar requests, {with}: {:?}", env.sidecar_requests());
    }
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

async fn unscheduled_pods_do_not_block_and_other_drivers_claims_are_untouched(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.create(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": env.class("foreign")},
        "provisioner": "other.csi.example.com",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }))
    .await;
    env.create_pvc(&env.ns, "theirs", "foreign", "5Mi", json!({}))
        .await;
    env.start_sidecar(&[GATE_ON]).await;

    env.create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "data").await;
    wait_protected(&env, &env.ns, "data").await;
    // A pod that was never scheduled cannot have mounted the volume.
    create_pod(&env, &env.ns, "pending", &["data", "theirs"], false).await;
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("claim gone", Duration::from_secs(20), || async {
        env.pvc(&env.ns, "data").await.is_none().then_some(())
    })
    .await;

    let theirs = env.pvc(&env.ns, "theirs").await.expect("foreign claim");
    if !env.is_real() {
        // (A real API server's admission plugin adds the finalizer to
        // every claim; what counts there is that we wrote nothing.)
        assert!(
            claim_finalizers(&theirs).is_empty(),
            "another driver's claim got {:?}",
            claim_finalizers(&theirs)
        );
    }
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
    // Needs the API test server: conflicts are injected.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "old", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "old").await;
    env.stop_sidecar();

    env.api().reset_counters();
    // Conflicts on both finalizer writes: each is retried with backoff.
    let ns = env.ns.clone();
    let claim_patches = || {
        RequestMatch::new(Verb::Patch, "persistentvolumeclaims")
            .namespace(&ns)
            .name("old")
    };
    env.api().fail_next(2, claim_patches(), 409);
    env.start_sidecar(&[GATE_ON]).await;
    wait_protected(&env, &env.ns, "old").await;
    env.api().fail_next(1, claim_patches(), 409);
    env.delete_pvc(&env.ns, "old").await;
    env.wait_for("claim gone", Duration::from_secs(20), || async {
        env.pvc(&env.ns, "old").await.is_none().then_some(())
    })
    .await;
    // The cache lists pods cluster-wide; the confirmation lists the claim's
    // namespace.
    let live_lists = env
        .api()
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::List && r.resource == "pods" && r.namespace == env.ns)
        .count();
    assert!(live_lists >= 1, "a live list confirmed the cache");
    let conflicts = env
        .api()
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

async fn gate_off_makes_no_claim_write_and_watches_no_pods(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    wait_watching(&env, "persistentvolumeclaims").await;

    env.create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "data").await;
    create_pod(&env, &env.ns, "web", &["data"], true).await;
    // Give a (wrongly) running loop time to act.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pvc = env.pvc(&env.ns, "data").await.expect("claim");
    if !env.is_real() {
        // (A real API server's admission plugin adds it to every claim.)
        assert!(
            claim_finalizers(&pvc).is_empty(),
            "{:?}",
            claim_finalizers(&pvc)
        );
    }
    delete_pod(&env, &env.ns, "web").await;
    env.delete_pvc(&env.ns, "data").await;
    if !env.is_real() || env.runs_controller("pvc-protection") {
        env.wait_for("PV and volume gone", Duration::from_secs(30), || async {
            (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
        })
        .await;
    }
    for verb in ["patch", "update"] {
        assert_eq!(
            env.sidecar_request_count(verb, "persistentvolumeclaims"),
            0,
            "{verb} of claims with the gate off: {:?}",
            env.sidecar_requests()
        );
    }
    assert_eq!(env.sidecar_request_count("list", "pods"), 0);
    assert_eq!(env.sidecar_request_count("watch", "pods"), 0);
    env.assert_nothing_forbidden();
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

async fn a_shut_down_pod_frees_its_ephemeral_claim_but_not_its_named_one(backend: Backend) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[GATE_ON]).await;

    // A scheduled pod with a generic ephemeral volume and a named claim,
    // held by a finalizer so that deleting it leaves it shut down
    // (deletion timestamp, grace period 0) rather than gone.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": &env.ns, "finalizers": ["example.com/hold"]},
        "spec": {
            "nodeName": env.node.as_str(),
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            "volumes": [
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": env.class("fast"),
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
    if !env.is_real() {
        // The claim the ephemeral-volume controller creates for it (the
        // real controller-manager does it itself).
        env.create_pvc(
            &env.ns,
            "web-scratch",
            "fast",
            "5Mi",
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web",
                "uid": pod_uid, "controller": true, "blockOwnerDeletion": true}]}}),
        )
        .await;
    }
    env.create_pvc(&env.ns, "shared", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "web-scratch").await;
    env.wait_bound(&env.ns, "shared").await;
    wait_protected(&env, &env.ns, "web-scratch").await;
    wait_protected(&env, &env.ns, "shared").await;

    env.delete_pvc(&env.ns, "web-scratch").await;
    env.delete_pvc(&env.ns, "shared").await;
    let terminating = |name: &'static str| {
        let env = &env;
        move || async move {
            env.pvc(&env.ns, name).await.is_some_and(|pvc| {
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

    pods.delete("web", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    env.wait_for(
        "ephemeral claim of the shut-down pod gone",
        Duration::from_secs(20),
        || async {
            env.pvc(&env.ns, "web-scratch")
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
            let claim_gone = env.pvc(&env.ns, "shared").await.is_none();
            (claim_gone && env.pvs().await.is_empty() && env.backend_volumes().is_empty())
                .then_some(())
        },
    )
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}
