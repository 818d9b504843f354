//! Nodes a real-cluster test plays itself (no kubelet): what a kubelet
//! and the node-driver-registrar write for a node, and the kubelet's
//! heartbeat, so that the real kube-scheduler places pods on them. Shared
//! by `tests/real_scheduling.rs` and `tests/democratic_csi.rs`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::Env;

/// The well-known label a kubelet puts on its Node.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// A label of the test's nodes (value: the test's id), so that its pods
/// go to its own nodes only.
pub const TEST_LABEL: &str = "e2e.csi-provisioner-rs/test";

/// Registers node `name` as a kubelet does (labels, Ready, allocatable
/// pods), its CSINode as the node-driver-registrar writes it from the
/// driver's `NodeGetInfo` (node id = node name, one `topology_key`), and
/// its Lease in `kube-node-lease` (renewed by [`heartbeat`]).
pub async fn register(env: &Env, name: &str, topology_key: &str) {
    env.create(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            topology_key: name, HOSTNAME: name, TEST_LABEL: env.id}}}))
        .await;
    let now = serde_json::to_value(Time(Timestamp::now())).expect("time");
    let resources = json!({"cpu": "8", "memory": "32Gi", "pods": "110"});
    Api::<Node>::all(env.client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": resources, "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "played by the test", "lastHeartbeatTime": now,
                    "lastTransitionTime": now}],
            }})),
        )
        .await
        .expect("node status");
    env.create(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": name},
        "spec": {"drivers": [{"name": env.driver_name, "nodeID": name,
            "topologyKeys": [topology_key]}]}}))
        .await;
    let renew = serde_json::to_value(MicroTime(Timestamp::now())).expect("time");
    env.create(
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": renew}}),
    )
    .await;
}

/// What a kubelet does to stay Ready: renew its node Lease (every 3 s
/// here; the node lifecycle controller's grace period is 50 s).
pub async fn heartbeat(client: kube::Client, nodes: Vec<String>) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client, "kube-node-lease");
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let renew = serde_json::to_value(MicroTime(Timestamp::now())).expect("time");
        for node in &nodes {
            let _ = leases
                .patch(
                    node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"renewTime": renew}})),
                )
                .await;
        }
    }
}

/// The node the scheduler selected for a WaitForFirstConsumer claim.
pub fn selected_node(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get(super::SELECTED_NODE)
        .cloned()
}

/// A quantity in bytes; -1 when unreadable.
pub fn quantity_bytes(q: &str) -> i64 {
    csi_provisioner::provision::quantity::parse_bytes(q).unwrap_or(-1)
}

/// A CSIStorageCapacity's capacity in bytes; -1 when absent or unreadable.
pub fn capacity_bytes(o: &CSIStorageCapacity) -> i64 {
    o.capacity.as_ref().map_or(-1, |q| quantity_bytes(&q.0))
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
