//! Whether a claim is ours to provision now (upstream's `shouldProvision` of
//! the library plus the CSI provisioner's `ShouldProvision` / `checkNode`).

use crate::projection::PersistentVolumeClaim;
use crate::projection::StorageClass;

use super::config::ProvisionerConfig;
use crate::migration::InTreePlugin;
use crate::wellknown as wk;

/// What to do with a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProvisionDecision {
    /// Plan and provision a volume.
    Provision,
    /// Node deployment, Immediate class, no node selected yet: after a random
    /// delay, if no other instance took it and this node has capacity, set the
    /// selected-node annotation to this node (the update re-triggers us).
    /// With class allowedTopologies, first check that they admit this node.
    BecomeOwner,
    Skip(SkipReason),
}

/// Why a claim is not provisioned now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `spec.volumeName` is set: bound or being bound already.
    AlreadyBound { volume_name: String },
    /// The claim has a deletion timestamp.
    BeingDeleted,
    /// The storage-provisioner annotation names another provisioner (or none).
    NotOurProvisioner { annotated: Option<String> },
    /// CSI migration: the claim is annotated for the in-tree plugin our driver
    /// took over, but without `pv.kubernetes.io/migrated-to: <our driver>`,
    /// so the in-tree plugin (not migrated on this cluster) provisions it.
    InTreeNotMigrated { provisioner: String },
    /// The claim's class does not exist (yet): retry later.
    StorageClassNotFound { name: String },
    /// The class names another provisioner than the annotation does.
    ClassOfOtherProvisioner { provisioner: String },
    /// `WaitForFirstConsumer` class and the scheduler has not selected a node.
    WaitingForSelectedNode,
    /// Node deployment: the scheduler selected another node.
    SelectedOtherNode { node: String },
    /// Node deployment: no node selected and the claim cannot be taken
    /// (not an Immediate class, or `--node-deployment-immediate-binding=false`).
    NotForThisNode,
}

impl SkipReason {
    /// The claim should be retried with backoff rather than dropped until it
    /// changes (upstream returns an error for a missing class).
    pub fn retry_later(&self) -> bool {
        matches!(self, SkipReason::StorageClassNotFound { .. })
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::AlreadyBound { volume_name } => {
                write!(f, "claim already names volume {volume_name:?}")
            }
            SkipReason::BeingDeleted => write!(f, "claim is being deleted"),
            SkipReason::NotOurProvisioner {
                annotated: Some(name),
            } => {
                write!(f, "claim is annotated for provisioner {name:?}")
            }
            SkipReason::NotOurProvisioner { annotated: None } => {
                write!(f, "claim has no storage-provisioner annotation")
            }
            SkipReason::InTreeNotMigrated { provisioner } => write!(
                f,
                "claim is annotated for in-tree provisioner {provisioner:?} without {}: not migrated",
                wk::ANN_MIGRATED_TO
            ),
            SkipReason::StorageClassNotFound { name } => {
                write!(f, "storageClass {name:?} not found")
            }
            SkipReason::ClassOfOtherProvisioner { provisioner } => {
                write!(f, "storage class names provisioner {provisioner:?}")
            }
            SkipReason::WaitingForSelectedNode => {
                write!(f, "waiting for the scheduler to select a node")
            }
            SkipReason::SelectedOtherNode { node } => {
                write!(f, "claim is assigned to node {node:?}")
            }
            SkipReason::NotForThisNode => write!(f, "claim is not assigned to this node"),
        }
    }
}

/// The provisioner a claim is annotated for (GA annotation, else beta).
pub fn annotated_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    let annotations = claim.metadata.annotations.as_ref()?;
    annotations
        .get(wk::ANN_STORAGE_PROVISIONER)
        .or_else(|| annotations.get(wk::ANN_BETA_STORAGE_PROVISIONER))
        .map(|provisioner| provisioner.as_str())
}

/// The in-tree provisioner name our driver also answers for (CSI
/// migration), if the driver took over an in-tree plugin.
fn our_in_tree_name(config: &ProvisionerConfig) -> Option<&'static str> {
    InTreePlugin::from_csi_driver(&config.driver_name).map(InTreePlugin::in_tree_name)
}

/// Whether the claim's storage-provisioner annotation is for us: it names
/// our driver (a Kubernetes 1.36 controller-manager writes the CSI driver's
/// name on claims of migrated in-tree classes too), or, as older releases
/// wrote it, the in-tree plugin our driver took over together with
/// `pv.kubernetes.io/migrated-to: <our driver>`. The cheap filter a watch
/// handler can apply before queueing a claim.
pub fn is_annotated_for_us(claim: &PersistentVolumeClaim, config: &ProvisionerConfig) -> bool {
    annotation_verdict(claim, config).is_none()
}

/// `None` when the annotations are for us, else why not.
fn annotation_verdict(
    claim: &PersistentVolumeClaim,
    config: &ProvisionerConfig,
) -> Option<SkipReason> {
    let annotated = annotated_provisioner(claim);
    if annotated == Some(config.driver_name.as_str()) {
        return None;
    }
    match annotated {
        Some(name) if Some(name) == our_in_tree_name(config) => {
            let migrated_to = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(wk::ANN_MIGRATED_TO));
            (migrated_to.map(|to| to.as_str()) != Some(config.driver_name.as_str())).then(|| {
                SkipReason::InTreeNotMigrated {
                    provisioner: name.to_owned(),
                }
            })
        }
        _ => Some(SkipReason::NotOurProvisioner {
            annotated: annotated.map(str::to_owned),
        }),
    }
}

/// Decides whether `claim` (with its class, if it exists) is ours to provision.
/// A class naming the in-tree plugin our driver took over is ours too; the
/// plan translates it.
pub fn should_provision(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    config: &ProvisionerConfig,
) -> ProvisionDecision {
    use ProvisionDecision::Skip;

    if let Some(volume_name) = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_ref())
        .filter(|name| !name.is_empty())
    {
        return Skip(SkipReason::AlreadyBound {
            volume_name: volume_name.clone(),
        });
    }
    // Never start a volume for a claim that is going away: nothing would use it.
    if claim.metadata.deletion_timestamp.is_some() {
        return Skip(SkipReason::BeingDeleted);
    }
    if let Some(reason) = annotation_verdict(claim, config) {
        return Skip(reason);
    }
    let Some(class) = class else {
        return Skip(SkipReason::StorageClassNotFound {
            name: super::plan::claim_class_name(claim),
        });
    };
    if class.provisioner != config.driver_name
        && Some(class.provisioner.as_str()) != our_in_tree_name(config)
    {
        return Skip(SkipReason::ClassOfOtherProvisioner {
            provisioner: class.provisioner.clone(),
        });
    }
    // The scheduler's annotation only (not the alpha one), as upstream.
    let selected_node = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(wk::ANN_SELECTED_NODE))
        .filter(|node| !node.is_empty());
    let binding_mode = class.volume_binding_mode.as_deref();

    if let Some(node_deployment) = &config.node_deployment {
        match selected_node {
            Some(node) if *node == node_deployment.node_name => {}
            Some(node) => {
                return Skip(SkipReason::SelectedOtherNode {
                    node: node.to_string(),
                });
            }
            None if binding_mode == Some("Immediate") && node_deployment.immediate_binding => {
                return ProvisionDecision::BecomeOwner;
            }
            None => return Skip(SkipReason::NotForThisNode),
        }
    }
    if binding_mode == Some("WaitForFirstConsumer") && selected_node.is_none() {
        return Skip(SkipReason::WaitingForSelectedNode);
    }
    ProvisionDecision::Provision
}

#[cfg(test)]
#[path = "should_provision_tests.rs"]
mod tests;
