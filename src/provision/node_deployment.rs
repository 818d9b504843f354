//! Node deployment (`--node-deployment`): one sidecar per node next to a
//! node-local driver. The decisions of upstream's `checkNode` and
//! `becomeOwner` (pkg/controller/controller.go), without I/O:
//!
//! - [`node_deployment`]: the settings from `NODE_NAME`, the flags and the
//!   driver's `NodeGetInfo`; `NODE_NAME` is required.
//! - [`LocalTopology`]: the Node and CSINode this instance plans with.
//!   Upstream does not watch Nodes and CSINodes in node mode; it feeds the
//!   topology code one static Node (labels = the accessible topology) and
//!   one CSINode (this driver with the node id and the topology keys).
//! - [`owner_delay`]: how long to wait before trying to take an Immediate
//!   claim: client-go's per-item exponential backoff (base · 2^attempt,
//!   capped at the maximum) minus a random jitter of up to the base delay,
//!   as upstream's `rateLimiterWithJitter`.
//! - [`allowed_topologies_admit`]: a class with allowedTopologies must
//!   admit this node, else the node does not try.
//! - [`poll_claim`]: while waiting, stop as soon as another node owns the
//!   claim or the claim is gone.
//! - [`has_capacity`]: a node that knows it lacks capacity does not try.
//! - [`become_owner_patch`]: the selected-node annotation set to this node,
//!   guarded by the claim's resourceVersion and uid: the first writer wins,
//!   the others get a conflict.

use std::time::Duration;

use crate::projection::Node;
use crate::projection::PersistentVolumeClaim;
use crate::projection::{CSINode, StorageClass};
use csi_proto::v1::NodeGetInfoResponse;
use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::config::{NodeDeployment, ProvisionerConfig};
use super::topology::{
    SelectedNodeTopology, TopologyError, TopologyInputs, accessibility_requirements,
};
use crate::wellknown as wk;

/// Why node deployment cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeDeploymentError {
    #[error(
        "the NODE_NAME environment variable must be set when using --node-deployment; set it from the downward API (env NODE_NAME with valueFrom.fieldRef.fieldPath: spec.nodeName)"
    )]
    MissingNodeName,
}

/// The flags of node deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeDeploymentFlags {
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay`.
    pub base_delay: Duration,
    /// `--node-deployment-max-delay`.
    pub max_delay: Duration,
}

/// Checks `NODE_NAME` (the value of the environment variable, if set).
/// Called before the driver is contacted, as upstream checks it at start.
pub fn node_name(env_value: Option<&str>) -> Result<String, NodeDeploymentError> {
    match env_value.map(str::trim) {
        Some(name) if !name.is_empty() => Ok(name.to_owned()),
        _ => Err(NodeDeploymentError::MissingNodeName),
    }
}

/// The node deployment settings from the node name, the flags and the
/// driver's `NodeGetInfo` answer.
pub fn node_deployment(
    node_name: &str,
    flags: NodeDeploymentFlags,
    info: &NodeGetInfoResponse,
) -> NodeDeployment {
    let accessible_topology = info
        .accessible_topology
        .as_ref()
        .map(|topology| topology.segments.clone().into_iter().collect());
    NodeDeployment {
        node_name: node_name.to_owned(),
        node_id: info.node_id.clone(),
        immediate_binding: flags.immediate_binding,
        base_delay: flags.base_delay,
        max_delay: flags.max_delay,
        accessible_topology,
    }
}

/// Upstream appends the node name to the provisioner identity in node mode,
/// so the PVs of different nodes carry different identities.
pub fn node_identity(identity: &str, node: Option<&NodeDeployment>) -> String {
    match node {
        Some(node) => format!("{identity}-{}", node.node_name),
        None => identity.to_owned(),
    }
}

/// The static Node and CSINode of this instance's node.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalTopology {
    pub node: Node,
    pub csi_node: CSINode,
}

impl LocalTopology {
    /// Upstream's fake objects: the Node labelled with the accessible
    /// topology, the CSINode with this driver, its node id and the topology
    /// keys (none when the driver reported no topology).
    pub fn new(driver_name: &str, node: &NodeDeployment) -> Self {
        let segments = node.accessible_topology.clone().unwrap_or_default();
        let keys: Vec<String> = segments.keys().cloned().collect();
        LocalTopology {
            node: Node {
                metadata: ObjectMeta {
                    name: Some(node.node_name.clone()),
                    labels: (!segments.is_empty()).then_some(segments),
                    ..ObjectMeta::default()
                },
            },
            csi_node: CSINode {
                metadata: ObjectMeta {
                    name: Some(node.node_name.clone()),
                    ..ObjectMeta::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![CSINodeDriver {
                        name: driver_name.to_owned(),
                        node_id: node.node_id.clone(),
                        topology_keys: (!keys.is_empty()).then_some(keys),
                        allocatable: None,
                    }],
                },
            },
        }
    }

    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The wait before attempt number `attempt` (0 for the first) to take a
/// claim: `min(base · 2^attempt, max)` minus `jitter · base`, never below
/// zero. `jitter` is a random number in `[0, 1)`; values outside are
/// clamped. The first attempt thus waits up to `base`, later ones longer,
/// so that after a conflict the others see the winner before trying again.
pub fn owner_delay(base: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
    let backoff = base.saturating_mul(factor).min(max);
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // `jitter · base` never exceeds `base`; a float rounding past the
    // largest Duration falls back to `base` instead of panicking.
    let jitter = Duration::try_from_secs_f64(base.as_secs_f64() * jitter).unwrap_or(base);
    backoff.saturating_sub(jitter)
}

/// How often the claim is looked at while waiting: upstream's
/// `max(base / 100, 10ms)`.
pub fn owner_poll_interval(base: Duration) -> Duration {
    (base / 100).max(Duration::from_millis(10))
}

/// A class with allowedTopologies must admit this node (upstream computes
/// the accessibility requirements with this node selected; an error means
/// "not compatible"). Without allowedTopologies, or with topology off,
/// every node is admitted.
pub fn allowed_topologies_admit(
    class: &StorageClass,
    claim_name: &str,
    local: &LocalTopology,
    config: &ProvisionerConfig,
) -> Result<(), TopologyError> {
    let allowed = class.allowed_topologies.as_deref().unwrap_or(&[]);
    if allowed.is_empty() || !config.topology_enabled {
        return Ok(());
    }
    let nodes = [&local.node];
    let csi_nodes = [&local.csi_node];
    accessibility_requirements(&TopologyInputs {
        driver_name: &config.driver_name,
        pvc_name: claim_name,
        allowed_topologies: allowed,
        selected_node: Some(SelectedNodeTopology {
            name: local.name(),
            node: Some(&local.node),
            csi_node: Some(&local.csi_node),
        }),
        nodes: &nodes,
        csi_nodes: &csi_nodes,
        strict_topology: config.strict_topology,
        immediate_topology: config.immediate_topology,
        immediate_per_key_set: config.immediate_topology_per_key_set,
    })
    .map(|_| ())
}

/// What the cache says about a claim this node is waiting to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimPoll {
    /// Still nobody's: keep waiting (or try, once the delay is over).
    Unowned,
    /// The claim is gone.
    Gone,
    /// A new claim of the same name (another uid).
    Replaced,
    /// Another node took it.
    OwnedBy(String),
    /// The annotation already names this node.
    Ours,
}

/// Looks at the current claim (from the cache) while waiting.
pub fn poll_claim(current: Option<&PersistentVolumeClaim>, uid: &str, node: &str) -> ClaimPoll {
    let Some(current) = current else {
        return ClaimPoll::Gone;
    };
    if current.metadata.uid.as_deref() != Some(uid) {
        return ClaimPoll::Replaced;
    }
    match current
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(wk::ANN_SELECTED_NODE))
        .filter(|selected| !selected.is_empty())
    {
        None => ClaimPoll::Unowned,
        Some(selected) if selected == node => ClaimPoll::Ours,
        Some(selected) => ClaimPoll::OwnedBy(selected.to_string()),
    }
}

/// The claim as it will look once this node owns it (for planning the
/// capacity check with exactly the request provisioning would send).
pub fn claim_owned_by(claim: &PersistentVolumeClaim, node: &str) -> PersistentVolumeClaim {
    let mut owned = claim.clone();
    owned
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(wk::ANN_SELECTED_NODE, node);
    owned
}

/// Whether this node has room for `required_bytes`, given the
/// `available_capacity` of each `GetCapacity` answer (one per requisite
/// topology; any one suffices). Nothing required means nothing to check;
/// no answer at all means no room.
pub fn has_capacity(required_bytes: i64, available: &[i64]) -> bool {
    required_bytes <= 0 || available.iter().any(|free| required_bytes <= *free)
}

/// The merge patch that takes a claim: the selected-node annotation set to
/// `node`, with the claim's resourceVersion and uid as preconditions (the
/// API server refuses it with 409 Conflict when the claim changed since it
/// was read, so of several nodes only the first succeeds).
pub fn become_owner_patch(node: &str, resource_version: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": resource_version,
            "uid": uid,
            "annotations": { wk::ANN_SELECTED_NODE: node },
        }
    })
}

/// What a failed [`become_owner_patch`] means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeFailure {
    /// 409: another node was faster or the claim changed since it was
    /// read. Look again after a longer delay.
    Conflict,
    /// 404 (deleted) or 422 (uid precondition: replaced by a new claim of
    /// the same name). Nothing to take.
    Gone,
    /// Anything else (API server unreachable, throttled, forbidden): retry
    /// the claim with backoff.
    Other,
}

/// Classifies the failure of the patch by its HTTP status code (`None`
/// when the request did not get an API answer).
pub fn take_failure(status_code: Option<u16>) -> TakeFailure {
    match status_code {
        Some(409) => TakeFailure::Conflict,
        Some(404 | 422) => TakeFailure::Gone,
        _ => TakeFailure::Other,
    }
}

/// The journal ConfigMap's driver component: per node in node mode, so one
/// node never resumes another node's operations on its own driver.
pub fn journal_owner(driver_name: &str, node: Option<&NodeDeployment>) -> String {
    match node {
        Some(node) => format!("{driver_name}-{}", node.node_name),
        None => driver_name.to_owned(),
    }
}

#[cfg(test)]
#[path = "node_deployment_tests.rs"]
mod tests;
