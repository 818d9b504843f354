//! End-to-end: the pod/Job-annotation PVC provisioner (gate
//! `PodPVCProvisioner`) with its companion, the PV releaser (`PVReleaser`,
//! same `--controller-id`): a CI agent's pod asks for a build-cache PVC by
//! annotation, gets it provisioned, and when the pod is gone the PVC goes,
//! the PV is released and the next agent's PVC binds to it and finds the
//! data. On the real cluster the garbage collector and the PV binder are the
//! controller-manager's; the test server's binder binds only a claim that
//! names its PV, so there the second claim names it.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::standard();
    a_pods_build_cache_is_provisioned_released_and_reused,
    a_jobs_pods_share_one_claim_that_goes_with_the_job,
    an_invalid_request_is_an_event_and_creates_nothing,
);

const ID: &str = "ci";
const PREFIX: &str = "dynamic-pvc-provisioner.kubernetes.io/";

fn gates() -> Vec<String> {
    vec![
        "--feature-gates=PodPVCProvisioner=true,PVReleaser=true".to_owned(),
        format!("--controller-id={ID}"),
        "--releaser-resync-period=500ms".to_owned(),
        "--pvc-provisioner-resync-period=1s".to_owned(),
    ]
}

fn args(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

/// The annotations asking for a PVC for volume `cache`.
fn cache_request(env: &Env, volume_name: Option<&str>) -> serde_json::Value {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": env.class("cache"),
        "resources": {"requests": {"storage": "5Mi"}},
    });
    if let Some(pv) = volume_name {
        spec["volumeName"] = json!(pv);
    }
    let pvc = serde_yaml_ng::to_string(&json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ignored"},
        "spec": spec,
    }))
    .expect("yaml");
    json!({
        format!("{PREFIX}cache.enabled"): "true",
        format!("{PREFIX}cache.pvc"): pvc,
    })
}

fn pod_spec(claim: &str) -> serde_json::Value {
    json!({
        "restartPolicy": "Never",
        "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
        "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": claim}}],
    })
}

async fn create_agent(env: &Env, name: &str, claim: &str, annotations: serde_json::Value) {
    env.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": env.ns, "annotations": annotations},
        "spec": pod_spec(claim),
    }))
    .await;
}

fn claims(env: &Env) -> Api<PersistentVolumeClaim> {
    Api::namespaced(env.client.clone(), &env.ns)
}

async fn wait_claim(env: &Env, name: &str) -> PersistentVolumeClaim {
    env.wait_for(
        &format!("claim {name} created"),
        Duration::from_secs(20),
        || async { env.pvc(&env.ns, name).await },
    )
    .await
}

async fn wait_claim_gone(env: &Env, name: &str) {
    env.wait_for(
        &format!("claim {name} gone"),
        Duration::from_secs(30),
        || async { env.pvc(&env.ns, name).await.is_none().then_some(()) },
    )
    .await;
}

fn label<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .labels
        .as_ref()?
        .get(&format!("{PREFIX}{key}"))
        .map(String::as_str)
}

async fn a_pods_build_cache_is_provisioned_released_and_reused(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("cache", "Immediate", "Retain", json!({}))
        .await;
    env.start_sidecar(&args(&gates())).await;

    create_agent(&env, "agent-1", "cache-agent-1", cache_request(&env, None)).await;
    let claim = wait_claim(&env, "cache-agent-1").await;
    assert_eq!(label(&claim, "claimed-by"), Some("agent-1"));
    assert_eq!(label(&claim, "claimed-by-kind"), Some("pod"));
    assert_eq!(label(&claim, "managed-by"), Some(ID));
    let owner = &claim.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Pod", "agent-1")
    );
    let pv = env.wait_bound(&env.ns, "cache-agent-1").await;
    let pv_name = pv.metadata.name.clone().expect("pv name");
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("csi handle");
    let message = env.wait_event(&env.ns, "agent-1", "PVCProvisioned").await;
    assert!(message.contains("cache-agent-1"), "{message}");
    std::fs::write(
        csi_hostpath::volume_path(&env.driver.state_dir, &handle).join("ccache.bin"),
        "warm",
    )
    .expect("write into the build cache");

    // The agent finishes: its PVC goes with it, the releaser frees the PV.
    env.delete("v1", "Pod", &env.ns, "agent-1").await;
    wait_claim_gone(&env, "cache-agent-1").await;
    env.wait_for("PV Available again", Duration::from_secs(30), || async {
        let pv = env.pv(&pv_name).await?;
        let available = pv.status.as_ref()?.phase.as_deref() == Some("Available");
        let free = pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_none());
        (available && free).then_some(())
    })
    .await;

    // The next agent's cache binds to the same PV and finds the data.
    let names_pv = (!env.is_real()).then_some(pv_name.as_str());
    create_agent(
        &env,
        "agent-2",
        "cache-agent-2",
        cache_request(&env, names_pv),
    )
    .await;
    let rebound = env.wait_bound(&env.ns, "cache-agent-2").await;
    assert_eq!(rebound.metadata.name.as_deref(), Some(pv_name.as_str()));
    assert_eq!(env.backend_volumes().len(), 1, "no second volume");
    let data = std::fs::read_to_string(
        csi_hostpath::volume_path(&env.driver.state_dir, &handle).join("ccache.bin"),
    )
    .expect("the cache survived");
    assert_eq!(data, "warm");
    env.assert_nothing_forbidden();
}

async fn a_jobs_pods_share_one_claim_that_goes_with_the_job(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("cache", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&args(&gates())).await;
    env.create(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "build", "namespace": env.ns,
                     "annotations": cache_request(&env, None)},
        "spec": {"completions": 2, "parallelism": 1, "backoffLimit": 0,
                 "template": {"spec": pod_spec("cache-build")}},
    }))
    .await;
    let claim = wait_claim(&env, "cache-build").await;
    assert_eq!(label(&claim, "claimed-by"), Some("build"));
    assert_eq!(label(&claim, "claimed-by-kind"), Some("job"));
    let owner = &claim.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Job", "build"));
    env.wait_bound(&env.ns, "cache-build").await;
    env.wait_event(&env.ns, "build", "PVCProvisioned").await;
    // Every pod of the Job (the real job controller creates them) names
    // the same claim; only one PVC and one volume exist.
    let all: Vec<String> = claims(&env)
        .list(&Default::default())
        .await
        .expect("claims")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(all, ["cache-build"]);
    assert_eq!(env.backend_volumes().len(), 1);

    kube::Api::<k8s_openapi::api::batch::v1::Job>::namespaced(env.client.clone(), &env.ns)
        .delete(
            "build",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            },
        )
        .await
        .expect("delete job");
    wait_claim_gone(&env, "cache-build").await;
    env.wait_for(
        "volume deleted with the claim",
        Duration::from_secs(30),
        || async { env.backend_volumes().is_empty().then_some(()) },
    )
    .await;
    env.assert_nothing_forbidden();
}

async fn an_invalid_request_is_an_event_and_creates_nothing(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("cache", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&args(&gates())).await;
    create_agent(
        &env,
        "broken",
        "cache-broken",
        json!({format!("{PREFIX}cache.enabled"): "true", format!("{PREFIX}cache.pvc"): "{{{"}),
    )
    .await;
    let message = env.wait_event(&env.ns, "broken", "ErrInvalidPVC").await;
    assert!(
        message.contains("not one PersistentVolumeClaim"),
        "{message}"
    );
    create_agent(
        &env,
        "no-volume",
        "cache-no-volume",
        json!({format!("{PREFIX}data.enabled"): "true", format!("{PREFIX}data.pvc"): "{\"spec\": {}}"}),
    )
    .await;
    env.wait_event(&env.ns, "no-volume", "ErrMissingVolume")
        .await;
    // A claim that someone else made is left alone, even when its
    // claimant's pod is deleted.
    let foreign: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "foreign", "namespace": env.ns,
                     "labels": {format!("{PREFIX}claimed-by"): "broken"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": env.class("cache"),
                 "resources": {"requests": {"storage": "5Mi"}}},
    }))
    .expect("claim");
    claims(&env)
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create");
    env.delete("v1", "Pod", &env.ns, "broken").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        env.pvc(&env.ns, "foreign").await.is_some(),
        "a claim without our managed-by label is never deleted"
    );
    for name in ["cache-broken", "cache-no-volume"] {
        assert!(env.pvc(&env.ns, name).await.is_none(), "{name} created");
    }
    env.assert_nothing_forbidden();
}

/// Without a garbage collector (or one that lags), the loop's own cleanup
/// deletes the PVC of a pod that is gone, after a live check. Test server
/// only: the real controller-manager's collector cannot be paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_garbage_collector_the_cleanup_deletes_the_claim() {
    let mut env = Env::new(Backend::TestServer).await;
    env.api().set_gc(false);
    env.storage_class("cache", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&args(&gates())).await;
    create_agent(&env, "agent-1", "cache-agent-1", cache_request(&env, None)).await;
    env.wait_bound(&env.ns, "cache-agent-1").await;
    env.delete("v1", "Pod", &env.ns, "agent-1").await;
    wait_claim_gone(&env, "cache-agent-1").await;
    env.wait_for(
        "volume deleted with the claim",
        Duration::from_secs(30),
        || async { env.backend_volumes().is_empty().then_some(()) },
    )
    .await;
    assert!(
        env.logs().contains("deleted the PVC of a pod that is gone"),
        "{}",
        env.logs()
    );
}
