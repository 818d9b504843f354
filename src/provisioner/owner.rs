//! Node deployment: taking an Immediate claim for this node (upstream's
//! `checkNode` / `becomeOwner`). Every node's sidecar sees the claim; each
//! waits a jittered, per-claim exponentially growing delay, watching the
//! cache so it stops as soon as another node took the claim; then, if the
//! class's allowedTopologies admit this node and the driver does not say
//! it lacks the capacity, it sets the selected-node annotation to its node
//! with a patch guarded by the claim's resourceVersion. The first writer
//! wins; the others get a conflict, look again after a longer delay and
//! find the claim taken. The annotation update brings the claim back to
//! every sidecar's queue, and the owner provisions it like a
//! WaitForFirstConsumer claim scheduled to its node.
//!
//! The worker blocks while waiting, as upstream's: the claim is not
//! processed twice meanwhile, and a shutdown ends the wait.

use std::sync::Arc;
use std::time::Duration;

use crate::projection::PersistentVolumeClaim;
use crate::projection::StorageClass;
use csi_proto::v1::GetCapacityRequest;
use csi_proto::v1::controller_service_capability::rpc::Type as ControllerCap;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::{ClaimKey, Context, Next, inputs};
use crate::duration::format_go_duration;
use crate::provision::node_deployment::{
    ClaimPoll, LocalTopology, TakeFailure, allowed_topologies_admit, become_owner_patch,
    claim_owned_by, has_capacity, owner_delay, owner_poll_interval, poll_claim, take_failure,
};
use crate::provision::{NodeDeployment, ProvisionDecision, should_provision};

/// Tries to take the claim of `key` for this node. Returns `Done` when the claim is
/// taken (by us or another node), gone, or not for this node; `Retry` when
/// this node should look again later (no capacity now, API errors).
pub(super) async fn become_owner(ctx: &Arc<Context>, key: &ClaimKey, class: &StorageClass) -> Next {
    let (Some(node), Some(local)) = (
        ctx.config.node_deployment.as_ref(),
        ctx.local_topology.as_deref(),
    ) else {
        tracing::error!(claim = %key, "asked to take a claim without --node-deployment");
        return Next::Done;
    };
    if let Err(reason) = allowed_topologies_admit(class, &key.name, local, &ctx.config) {
        tracing::info!(claim = %key, node = %node.node_name, %reason, "not taking the claim: the storage class's allowedTopologies do not admit this node");
        ctx.forget_owner_attempts(&key.uid);
        return Next::Done;
    }
    loop {
        let attempt = ctx.next_owner_attempt(&key.uid);
        let delay = owner_delay(node.base_delay, node.max_delay, attempt, jitter());
        tracing::info!(claim = %key, node = %node.node_name, attempt, delay = %format_go_duration(delay), "will try to become the owner of the claim");
        let current = match wait(ctx, key, node, delay).await {
            Waited::Ready(current) => current,
            Waited::Stop => return Next::Done,
        };
        // The claim may have changed while we waited (bound, deleted,
        // annotation for another provisioner): take it only if it is still
        // to be taken.
        let decision = should_provision(&current, Some(class), &ctx.config);
        if decision != ProvisionDecision::BecomeOwner {
            tracing::info!(claim = %key, ?decision, "not taking the claim: it changed while waiting");
            ctx.forget_owner_attempts(&key.uid);
            return Next::Done;
        }
        match capacity(ctx, &current, class, local).await {
            Capacity::Lacking => {
                tracing::info!(claim = %key, node = %node.node_name, "not taking the claim: not enough capacity on this node now; will look again later");
                return Next::Retry;
            }
            Capacity::Enough => {}
            Capacity::Unknown(reason) => {
                tracing::debug!(claim = %key, %reason, "taking the claim without a capacity check");
            }
        }
        let Some(resource_version) = current.metadata.resource_version.as_deref() else {
            tracing::warn!(claim = %key, "claim without resourceVersion in the cache; cannot take it safely");
            return Next::Retry;
        };
        let patch = become_owner_patch(&node.node_name, resource_version, &key.uid);
        let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
            Api::namespaced(ctx.client.clone(), &key.namespace);
        match crate::writes::merge_patch(&api, &key.name, &patch).await {
            Ok(_) => {
                ctx.forget_owner_attempts(&key.uid);
                tracing::info!(claim = %key, node = %node.node_name, "became the owner of the claim: selected-node set to this node");
                // The update comes back through the watch and the claim is
                // provisioned then, as one scheduled to this node.
                return Next::Done;
            }
            Err(e) => {
                let code = match &e {
                    kube::Error::Api(status) => Some(status.code),
                    _ => None,
                };
                match take_failure(code) {
                    TakeFailure::Conflict => {
                        // The next attempt waits longer and most likely
                        // sees the new owner.
                        tracing::info!(claim = %key, node = %node.node_name, "conflict while taking the claim; will look again");
                    }
                    TakeFailure::Gone => {
                        tracing::info!(claim = %key, error = %e, "not taking the claim: it is gone or was replaced");
                        ctx.forget_owner_attempts(&key.uid);
                        return Next::Done;
                    }
                    TakeFailure::Other => {
                        tracing::warn!(claim = %key, node = %node.node_name, error = %e, "selecting this node for the claim failed; will retry");
                        return Next::Retry;
                    }
                }
            }
        }
    }
}

enum Waited {
    /// The delay is over and the claim is still nobody's: here it is.
    Ready(Arc<PersistentVolumeClaim>),
    /// No need to try (taken, gone, shutting down).
    Stop,
}

/// Waits `delay`, looking at the cached claim every poll interval so the
/// wait ends early when another node takes it.
async fn wait(ctx: &Context, key: &ClaimKey, node: &NodeDeployment, delay: Duration) -> Waited {
    let deadline = tokio::time::Instant::now() + delay;
    let poll = owner_poll_interval(node.base_delay);
    loop {
        if ctx.stopping() {
            return Waited::Stop;
        }
        let current = ctx
            .caches
            .claims
            .store()
            .get(&ObjectRef::new(&key.name).within(&key.namespace));
        match poll_claim(current.as_deref(), &key.uid, &node.node_name) {
            ClaimPoll::Unowned => {}
            ClaimPoll::OwnedBy(owner) => {
                tracing::info!(claim = %key, %owner, "another node became the owner of the claim");
                ctx.forget_owner_attempts(&key.uid);
                return Waited::Stop;
            }
            ClaimPoll::Ours => {
                tracing::debug!(claim = %key, "the claim already names this node");
                ctx.forget_owner_attempts(&key.uid);
                return Waited::Stop;
            }
            ClaimPoll::Gone | ClaimPoll::Replaced => {
                tracing::info!(claim = %key, "claim gone while waiting to become its owner");
                ctx.forget_owner_attempts(&key.uid);
                return Waited::Stop;
            }
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return match current {
                Some(current) => Waited::Ready(current),
                None => Waited::Stop,
            };
        }
        tokio::time::sleep(poll.min(deadline - now)).await;
    }
}

enum Capacity {
    Enough,
    Lacking,
    /// Not checked or the check failed: try anyway (upstream: "proceeding
    /// with becoming owner although the capacity check failed"), so a
    /// real problem surfaces as a provisioning event instead of silence.
    Unknown(String),
}

/// Asks the driver whether this node has room for the volume provisioning
/// would create (the same request, planned with this node selected).
async fn capacity(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    local: &LocalTopology,
) -> Capacity {
    if !ctx.driver.info().controller.has(ControllerCap::GetCapacity) {
        return Capacity::Unknown("the driver does not offer GetCapacity".to_owned());
    }
    let owned = claim_owned_by(claim, local.name());
    // Only the request's size, topology and parameters are read: the name
    // an operation in flight may have decided does not matter here.
    let plan = match inputs::plan(ctx, &owned, class, None).await {
        Ok(plan) => plan,
        Err(e) => return Capacity::Unknown(e.to_string()),
    };
    let required = plan
        .request
        .capacity_range
        .as_ref()
        .map_or(0, |range| range.required_bytes);
    if has_capacity(required, &[]) {
        return Capacity::Enough;
    }
    // One answer per requisite topology (normally exactly this node's);
    // none without topology.
    let topologies: Vec<_> = match &plan.request.accessibility_requirements {
        Some(requirement) if !requirement.requisite.is_empty() => {
            requirement.requisite.iter().cloned().map(Some).collect()
        }
        _ => vec![None],
    };
    let mut available = Vec::with_capacity(topologies.len());
    for accessible_topology in topologies {
        let request = GetCapacityRequest {
            volume_capabilities: plan.request.volume_capabilities.clone(),
            parameters: plan.request.parameters.clone(),
            accessible_topology,
        };
        match ctx.driver.get_capacity(request).await {
            Ok(answer) => available.push(answer.available_capacity),
            Err(e) => return Capacity::Unknown(format!("GetCapacity: {e}")),
        }
    }
    if has_capacity(required, &available) {
        Capacity::Enough
    } else {
        Capacity::Lacking
    }
}

/// A random number in `[0, 1)` for the delay's jitter: the lowest 53 bits
/// of a v4 UUID, all random (its fixed version and variant bits are higher
/// up), from the OS generator.
fn jitter() -> f64 {
    const BITS: u32 = 53;
    let random = uuid::Uuid::new_v4().as_u128() & ((1u128 << BITS) - 1);
    random as f64 / (1u64 << BITS) as f64
}

#[cfg(test)]
mod tests {
    use super::jitter;

    #[test]
    fn jitter_spreads_over_the_unit_interval() {
        let samples: Vec<f64> = (0..2000).map(|_| jitter()).collect();
        assert!(samples.iter().all(|j| (0.0..1.0).contains(j)));
        // A fixed bit (e.g. the UUID's variant) would pin these to a band.
        assert!(samples.iter().any(|j| *j < 0.1), "no small values");
        assert!(samples.iter().any(|j| *j > 0.9), "no large values");
        assert!(
            samples.iter().any(|j| (0.4..0.6).contains(j)),
            "no middle values"
        );
    }
}
