//! The provisioner's configuration: flags, gates and driver capabilities that
//! every decision in this module reads. The lead's startup code fills it once.

use std::collections::BTreeMap;
use std::time::Duration;

/// Capabilities the driver reported at startup that change what we send it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverCapabilities {
    /// Controller `CLONE_VOLUME`: PVC data sources are allowed.
    pub clone_volume: bool,
    /// Controller `CREATE_DELETE_SNAPSHOT`: VolumeSnapshot data sources are allowed.
    pub create_delete_snapshot: bool,
    /// Controller `MODIFY_VOLUME`: PVCs with a VolumeAttributesClass are allowed.
    pub modify_volume: bool,
    /// Controller `SINGLE_NODE_MULTI_WRITER`: ReadWriteOnce / ReadWriteOncePod map
    /// to the finer single-node modes instead of `SINGLE_NODE_WRITER`.
    pub single_node_multi_writer: bool,
    /// Controller `PUBLISH_UNPUBLISH_VOLUME`: volumes are attached through
    /// VolumeAttachments, so a volume still attached is not deleted (as
    /// upstream, which watches VolumeAttachments only then).
    pub publish_unpublish_volume: bool,
}

/// `--node-deployment`: one provisioner per node for node-local volumes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDeployment {
    /// This provisioner's node (`NODE_NAME`).
    pub node_name: String,
    /// The driver's node id from `NodeGetInfo`.
    pub node_id: String,
    /// `--node-deployment-immediate-binding`: also try to take Immediate PVCs.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay`: the first wait before taking an
    /// Immediate PVC.
    pub base_delay: Duration,
    /// `--node-deployment-max-delay`: the longest such wait.
    pub max_delay: Duration,
    /// Accessible topology from `NodeGetInfo`; decides which PVs this instance
    /// may delete. `None` means the driver reported none (all PVs accessible).
    pub accessible_topology: Option<BTreeMap<String, String>>,
}

/// Everything the pure provisioning and deletion decisions depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvisionerConfig {
    /// Driver name from `GetPluginInfo`; the provisioner name on PVCs and PVs.
    pub driver_name: String,
    /// Value of the `storage.kubernetes.io/csiProvisionerIdentity` volume
    /// attribute; upstream uses `<start millis>-<random 0..9999>-<driver>`.
    pub provisioner_identity: String,
    /// `--volume-name-prefix`.
    pub volume_name_prefix: String,
    /// `--volume-name-uuid-length`; `None` for the flag's `-1` (no truncation).
    pub volume_name_uuid_length: Option<usize>,
    /// `--default-fstype`; empty when unset.
    pub default_fstype: String,
    /// `--extra-create-metadata`.
    pub extra_create_metadata: bool,
    /// `--strict-topology`.
    pub strict_topology: bool,
    /// `--immediate-topology`.
    pub immediate_topology: bool,
    /// `--immediate-topology-per-key-set` (beyond the Go image,
    /// docs/operations.md, opt-ins): immediate binding aggregates every registered key set.
    pub immediate_topology_per_key_set: bool,
    /// `--extra-create-metadata-namespace-labels` and `-annotations`
    /// (beyond the Go image, docs/operations.md, opt-ins): the claim's namespace's
    /// keys sent as CreateVolume parameters ([`super::namespace_metadata`]).
    pub namespace_metadata: super::namespace_metadata::NamespaceMetadataKeys,
    /// Driver advertises `VOLUME_ACCESSIBILITY_CONSTRAINTS` and the `Topology` gate is on.
    pub topology_enabled: bool,
    /// `--controller-publish-readonly`.
    pub controller_publish_readonly: bool,
    /// `--prevent-volume-mode-conversion`.
    pub prevent_volume_mode_conversion: bool,
    /// `HonorPVReclaimPolicy` gate.
    pub honor_pv_reclaim_policy: bool,
    /// `VolumeAttributesClass` gate.
    pub volume_attributes_class_enabled: bool,
    /// VolumeAttributesClasses are watched (with the gate on). Not when the
    /// gate was set on the command line on an API server that does not
    /// serve or let us read them (probed at start): a claim's class is
    /// then read from the API server at each attempt, as the Go image
    /// always does, so that only claims naming one fail, with the API
    /// server's answer, and nothing waits for a cache that cannot fill.
    pub volume_attributes_classes_watched: bool,
    /// `CrossNamespaceVolumeDataSource` gate.
    pub cross_namespace_data_source: bool,
    /// `ClaimMetadataPropagation` gate: classes may template parameters
    /// and copy claim labels and annotations onto PVs
    /// ([`super::claim_metadata`]).
    pub claim_metadata_propagation: bool,
    /// ReferenceGrants are served and readable (probed at start with the
    /// gate on); without, every cross-namespace source is refused as not
    /// granted, and nothing waits for a cache that cannot fill.
    pub reference_grants_readable: bool,
    /// `--node-deployment`.
    pub node_deployment: Option<NodeDeployment>,
    pub capabilities: DriverCapabilities,
}

/// Upstream's provisioner identity, `<start unix millis>-<random 0..9999>-<driver>`,
/// recorded on every PV it creates (volume attribute
/// `storage.kubernetes.io/csiProvisionerIdentity`).
pub fn provisioner_identity(
    start_unix_millis: i64,
    random_below_10000: u32,
    driver_name: &str,
) -> String {
    format!(
        "{start_unix_millis}-{}-{driver_name}",
        random_below_10000 % 10_000
    )
}

impl ProvisionerConfig {
    /// The configuration with upstream's flag and gate defaults for `driver_name`.
    pub fn with_defaults(driver_name: impl Into<String>) -> Self {
        let driver_name = driver_name.into();
        ProvisionerConfig {
            provisioner_identity: driver_name.clone(),
            driver_name,
            volume_name_prefix: "pvc".to_owned(),
            volume_name_uuid_length: None,
            default_fstype: String::new(),
            extra_create_metadata: false,
            strict_topology: false,
            immediate_topology: true,
            immediate_topology_per_key_set: false,
            namespace_metadata: Default::default(),
            topology_enabled: false,
            controller_publish_readonly: false,
            prevent_volume_mode_conversion: true,
            honor_pv_reclaim_policy: true,
            volume_attributes_class_enabled: true,
            volume_attributes_classes_watched: true,
            cross_namespace_data_source: false,
            claim_metadata_propagation: false,
            reference_grants_readable: false,
            node_deployment: None,
            capabilities: DriverCapabilities::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_upstream_flags() {
        let config = ProvisionerConfig::with_defaults("d");
        assert_eq!(config.volume_name_prefix, "pvc");
        assert_eq!(config.volume_name_uuid_length, None);
        assert!(config.immediate_topology && config.prevent_volume_mode_conversion);
        assert!(config.honor_pv_reclaim_policy && config.volume_attributes_class_enabled);
        assert!(
            !config.strict_topology
                && !config.extra_create_metadata
                && !config.cross_namespace_data_source
                && !config.claim_metadata_propagation
        );
        assert_eq!(config.node_deployment, None);
    }

    #[test]
    fn identity_format() {
        assert_eq!(
            provisioner_identity(1_700_000_000_000, 42, "d.csi"),
            "1700000000000-42-d.csi"
        );
        assert_eq!(provisioner_identity(1, 12_345, "d"), "1-2345-d");
    }
}
