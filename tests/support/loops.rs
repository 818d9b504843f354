//! Helpers for the end-to-end tests of the embedded loops (PVC protection,
//! PV releaser). Included with `#[path = "support/loops.rs"] mod loops;`
//! next to `mod support;`.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::support::Env;

pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

/// A pod using `claims` through `persistentVolumeClaim` volumes; scheduled
/// on the test node when `scheduled`.
pub async fn create_pod(
    env: &Env,
    namespace: &str,
    name: &str,
    claims: &[&str],
    scheduled: bool,
) -> Pod {
    let volumes: Vec<serde_json::Value> = claims
        .iter()
        .map(|c| json!({"name": format!("v-{c}"), "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    let mut spec = json!({
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        "volumes": volumes,
    });
    if scheduled {
        spec["nodeName"] = json!(env.node);
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }))
    .expect("pod json");
    Api::<Pod>::namespaced(env.client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod")
}

/// Sets a pod's `status.phase` as the kubelet would.
pub async fn set_pod_phase(env: &Env, namespace: &str, name: &str, phase: &str) {
    let mut pod = env
        .get("v1", "Pod", namespace, name)
        .await
        .expect("pod exists");
    pod["status"] = json!({"phase": phase});
    env.replace_status(pod).await;
}

/// Deletes a pod at once (grace period 0): without a kubelet a graceful
/// deletion of a scheduled pod never completes on a real cluster.
pub async fn delete_pod(env: &Env, namespace: &str, name: &str) {
    Api::<Pod>::namespaced(env.client.clone(), namespace)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
}

pub fn claim_finalizers(pvc: &PersistentVolumeClaim) -> Vec<String> {
    pvc.metadata.finalizers.clone().unwrap_or_default()
}

/// Waits until the claim carries the PVC-protection finalizer.
pub async fn wait_protected(env: &Env, namespace: &str, name: &str) -> PersistentVolumeClaim {
    env.wait_for(
        &format!("{namespace}/{name} protected"),
        Duration::from_secs(20),
        || async {
            let pvc = env.pvc(namespace, name).await?;
            claim_finalizers(&pvc)
                .iter()
                .any(|f| f == PVC_PROTECTION)
                .then_some(pvc)
        },
    )
    .await
}

/// Asserts for `duration` that `check` stays true (polling).
pub async fn assert_stays<F, Fut>(what: &str, duration: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        assert!(check().await, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the sidecar has listed and is watching `resource`, i.e. its
/// caches for that kind are running.
pub async fn wait_watching(env: &Env, resource: &str) {
    env.wait_for(
        &format!("sidecar watching {resource}"),
        Duration::from_secs(20),
        || async { (env.sidecar_request_count("watch", resource) > 0).then_some(()) },
    )
    .await;
}

/// Patches and updates of one object (main resource and subresources). The
/// tests never patch or update the objects they count, so these are the
/// sidecar's.
pub fn changes_to(env: &Env, resource: &str, name: &str) -> usize {
    env.sidecar_request_log()
        .into_iter()
        .filter(|(verb, res, obj, _)| {
            (verb == "patch" || verb == "update")
                && res.split('/').next() == Some(resource)
                && obj == name
        })
        .count()
}
