//! CSI migration: provisioning and deleting the volumes of in-tree
//! StorageClasses with the CSI driver that replaced the in-tree plugin.
//!
//! Kubernetes removed its cloud volume plugins; a StorageClass that still
//! says `provisioner: kubernetes.io/aws-ebs` (EKS's default `gp2`) is served
//! by the external-provisioner of `ebs.csi.aws.com`, which translates the
//! class to CSI, calls `CreateVolume`, and writes the PV back in its in-tree
//! form so that everything reading in-tree PVs keeps working (and a rollback
//! stays possible). Deleting such a PV translates it to CSI to learn the
//! volume handle. The rules are those of k8s.io/csi-translation-lib v0.36,
//! which the Go sidecar v6.3 vendors; this module is a rewrite of them as
//! pure functions over the Kubernetes objects, with typed errors instead of
//! strings and no panics on malformed handles.
//!
//! # The plugins
//!
//! | in-tree plugin | CSI driver | driver's zone key |
//! |---|---|---|
//! | `kubernetes.io/aws-ebs` | `ebs.csi.aws.com` | `topology.ebs.csi.aws.com/zone` |
//! | `kubernetes.io/gce-pd` | `pd.csi.storage.gke.io` | `topology.gke.io/zone` |
//! | `kubernetes.io/azure-disk` | `disk.csi.azure.com` | `topology.disk.csi.azure.com/zone` |
//! | `kubernetes.io/azure-file` | `file.csi.azure.com` | – |
//! | `kubernetes.io/cinder` | `cinder.csi.openstack.org` | `topology.cinder.csi.openstack.org/zone` |
//! | `kubernetes.io/vsphere-volume` | `csi.vsphere.vmware.com` | `topology.csi.vmware.com/zone` (and `/region`) |
//! | `kubernetes.io/portworx-volume` | `pxd.portworx.com` | – |
//!
//! A sidecar whose driver is in the right column also answers for the name
//! in the left one ([`InTreePlugin::from_csi_driver`]).
//!
//! # The three translations
//!
//! - [`translate_storage_class_to_csi`]: parameters renamed or moved
//!   (`fsType` → `csi.storage.k8s.io/fstype`, `zone`/`zones` → allowedTopologies
//!   with the driver's key, vSphere's `-migrationparam` names, Portworx's auth
//!   Secret → the six `csi.storage.k8s.io/*-secret-*` templates); zone keys in
//!   allowedTopologies renamed to the driver's key ([`translate_allowed_topologies`]);
//!   other parameters kept (vSphere drops them, as upstream).
//! - [`translate_csi_pv_to_in_tree`]: the PV built from the `CreateVolume`
//!   answer, rewritten with the in-tree source (`awsElasticBlockStore.volumeID`
//!   = the CSI volume id, `gcePersistentDisk.pdName` = the last segment of
//!   the handle, `azureDisk.diskURI` = the handle, …), the driver's zone key
//!   in the node affinity replaced by the Kubernetes zone label, a region
//!   term derived from the zones (AWS, GCE) and the zone/region PV labels.
//!   A node selector term without a zone to derive the region from — a
//!   topology key the translation does not know — fails with
//!   "failed to translate topology", as upstream.
//! - [`translate_in_tree_pv_to_csi`]: the reverse, for deletion (and any
//!   other reader of in-tree PVs): the volume handle from the in-tree source
//!   (`aws://<zone>/<vol-id>` → `<vol-id>`, GCE's zone labels →
//!   `projects/UNSPECIFIED/zones/<zone>/disks/<pd>`, …) and the Kubernetes
//!   zone keys in the node affinity replaced by the driver's, and (GCE) the
//!   access modes the in-tree plugin really honoured (`ReadWriteMany` →
//!   `ReadWriteOnce`).
//!
//! # Who calls this
//!
//! [`crate::provision`]'s pure decisions: `should_provision` accepts claims
//! annotated for our driver whose class names our in-tree plugin, and the old
//! form (the in-tree name plus `pv.kubernetes.io/migrated-to: <our driver>`);
//! `plan_provision` plans from the translated class and marks the plan
//! migrated; `build_pv` writes the in-tree form with `provisioned-by: <in-tree
//! name>` and `migrated-to: <our driver>`; `is_our_volume` and `plan_delete`
//! recognise migrated PVs and translate them for `DeleteVolume`.
//!
//! # Rules left out, and why
//!
//! - Inline volumes (`TranslateInTreeInlineVolumeToCSI`) and
//!   `RepairVolumeHandle`: only the kubelet and the external-attacher use
//!   them; a provisioner never sees a pod's inline volume.
//! - Stricter than upstream, on purpose (a clear error now instead of a
//!   driver error or a PV the API server refuses later): a GCE handle must be
//!   exactly `projects/<p>/{zones|regions}/<z>/disks/<name>` (upstream only
//!   counts the segments); an `aws://` volume id may not carry `?`, `#` or
//!   `%` (upstream parses it as a URL); an empty volume id is refused for
//!   every plugin; a vSphere volume whose context lacks
//!   `initialvolumefilepath` is refused (upstream writes an empty
//!   `volumePath`, which PV validation rejects); `zone` together with `zones`
//!   is refused (upstream keeps whichever Go's map order yields last), and a
//!   `zone`/`zones` parameter naming no zone is refused (upstream asks the
//!   driver for the zone ""). Zone lists are trimmed of spaces, as the
//!   in-tree plugins did (upstream passes `" b"` on).
//! - Azure resource ids are matched without regard to ASCII case
//!   (`resourcegroups`), as Azure treats them; upstream's regular expression
//!   is case-sensitive.
//! - Portworx: `readOnly` is carried over in the in-tree → CSI direction too
//!   (upstream drops it there but not in the other direction, so its round
//!   trip loses it).
//! - The translated class names the CSI driver as its provisioner for every
//!   plugin (upstream does so for Portworx only). The plan's data-source
//!   checks compare a snapshot's or clone source's driver with the class's
//!   provisioner, so restoring a snapshot of our driver into a migrated
//!   class works here, where upstream refuses it as "a different driver".
//!   (Cloning from a migrated PV still fails, as upstream: the source PV has
//!   no CSI source.)

mod handles;
mod storage_class;
mod topology;
mod volume;

pub use handles::RegionError;
pub use storage_class::translate_storage_class_to_csi;
pub use topology::{TopologyTranslationError, translate_allowed_topologies};
pub use volume::{translate_csi_pv_to_in_tree, translate_in_tree_pv_to_csi};

/// An in-tree volume plugin whose volumes a CSI driver took over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InTreePlugin {
    AwsEbs,
    GcePd,
    AzureDisk,
    AzureFile,
    Cinder,
    VsphereVolume,
    Portworx,
}

/// The plugin table: (plugin, in-tree provisioner name, CSI driver name,
/// the CSI driver's zone topology key).
const PLUGINS: [(InTreePlugin, &str, &str, Option<&str>); 7] = [
    (
        InTreePlugin::AwsEbs,
        "kubernetes.io/aws-ebs",
        "ebs.csi.aws.com",
        Some("topology.ebs.csi.aws.com/zone"),
    ),
    (
        InTreePlugin::GcePd,
        "kubernetes.io/gce-pd",
        "pd.csi.storage.gke.io",
        Some("topology.gke.io/zone"),
    ),
    (
        InTreePlugin::AzureDisk,
        "kubernetes.io/azure-disk",
        "disk.csi.azure.com",
        Some("topology.disk.csi.azure.com/zone"),
    ),
    (
        InTreePlugin::AzureFile,
        "kubernetes.io/azure-file",
        "file.csi.azure.com",
        None,
    ),
    (
        InTreePlugin::Cinder,
        "kubernetes.io/cinder",
        "cinder.csi.openstack.org",
        Some("topology.cinder.csi.openstack.org/zone"),
    ),
    (
        InTreePlugin::VsphereVolume,
        "kubernetes.io/vsphere-volume",
        "csi.vsphere.vmware.com",
        Some("topology.csi.vmware.com/zone"),
    ),
    (
        InTreePlugin::Portworx,
        "kubernetes.io/portworx-volume",
        "pxd.portworx.com",
        None,
    ),
];

/// vSphere's CSI driver also has a region key, translated with the zone key.
pub const VSPHERE_REGION_TOPOLOGY_KEY: &str = "topology.csi.vmware.com/region";

impl InTreePlugin {
    /// Every plugin, in table order.
    pub const ALL: [InTreePlugin; 7] = [
        InTreePlugin::AwsEbs,
        InTreePlugin::GcePd,
        InTreePlugin::AzureDisk,
        InTreePlugin::AzureFile,
        InTreePlugin::Cinder,
        InTreePlugin::VsphereVolume,
        InTreePlugin::Portworx,
    ];

    fn row(
        self,
    ) -> (
        InTreePlugin,
        &'static str,
        &'static str,
        Option<&'static str>,
    ) {
        // The table lists every variant once (a test checks it), so the
        // fallback is never taken; it avoids a panic path all the same.
        PLUGINS
            .iter()
            .copied()
            .find(|row| row.0 == self)
            .unwrap_or((self, "", "", None))
    }

    /// The in-tree provisioner name, as StorageClasses and PV annotations spell it.
    pub fn in_tree_name(self) -> &'static str {
        self.row().1
    }

    /// The CSI driver that took over the plugin's volumes.
    pub fn csi_driver(self) -> &'static str {
        self.row().2
    }

    /// The CSI driver's zone topology key; `None` for plugins whose
    /// translation leaves topology alone (Azure File, Portworx).
    pub fn topology_key(self) -> Option<&'static str> {
        self.row().3
    }

    /// The plugin with this in-tree provisioner name.
    pub fn from_in_tree_name(name: &str) -> Option<Self> {
        PLUGINS.iter().find(|row| row.1 == name).map(|row| row.0)
    }

    /// The plugin whose volumes the CSI driver `driver` took over: the in-tree
    /// plugin a sidecar of that driver also answers for (upstream's
    /// `supportsMigrationFromInTreePluginName`).
    pub fn from_csi_driver(driver: &str) -> Option<Self> {
        PLUGINS.iter().find(|row| row.2 == driver).map(|row| row.0)
    }

    /// The plugin of the PV's in-tree source, if it has one this module can
    /// translate (upstream's `IsPVMigratable`).
    pub fn of_in_tree_volume(pv: &crate::projection::PersistentVolume) -> Option<Self> {
        let spec = pv.spec.as_ref()?;
        [
            (spec.aws_elastic_block_store.is_some(), InTreePlugin::AwsEbs),
            (spec.gce_persistent_disk.is_some(), InTreePlugin::GcePd),
            (spec.azure_disk.is_some(), InTreePlugin::AzureDisk),
            (spec.azure_file.is_some(), InTreePlugin::AzureFile),
            (spec.cinder.is_some(), InTreePlugin::Cinder),
            (spec.vsphere_volume.is_some(), InTreePlugin::VsphereVolume),
            (spec.portworx_volume.is_some(), InTreePlugin::Portworx),
        ]
        .into_iter()
        .find(|(present, _)| *present)
        .map(|(_, plugin)| plugin)
    }
}

impl std::fmt::Display for InTreePlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.in_tree_name())
    }
}

/// Why a class or PV cannot be translated. The texts keep upstream's wording
/// where users may search for it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MigrationError {
    #[error("cannot simultaneously set allowed topologies and zone/zones parameters")]
    ZoneParametersWithAllowedTopologies,
    #[error("cannot simultaneously set the zone and zones parameters")]
    ZoneAndZonesParameters,
    #[error("parameter {key:?} names no zone")]
    EmptyZoneParameter { key: String },
    #[error("CSI persistent volume was nil")]
    NotCsi,
    #[error("could not find in-tree plugin translation logic for {0}")]
    NotAMigratedDriver(String),
    #[error("could not find in-tree plugin translation logic for persistent volume {0:?}")]
    NoMigratableSource(String),
    #[error("{plugin} volume has an empty volume id")]
    EmptyVolumeId { plugin: InTreePlugin },
    #[error("failed to translate Kubernetes ID to EBS Volume ID: {id:?} {reason}")]
    InvalidEbsVolumeId { id: String, reason: &'static str },
    #[error(
        "invalid GCE PD volume handle {handle:?}: expected projects/<project>/zones/<zone>/disks/<name> or projects/<project>/regions/<region>/disks/<name>"
    )]
    InvalidGcePdHandle { handle: String },
    #[error(
        "could not get disk name from {uri:?}: expected .../subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Compute/disks/<name> or http(s)://.../vhds/<name>"
    )]
    InvalidAzureDiskUri { uri: String },
    #[error("kind({0}) is not supported in csi migration")]
    UnsupportedAzureDiskKind(String),
    #[error("error parsing volume id: {handle:?}, should at least contain two #")]
    InvalidAzureFileHandle { handle: String },
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileSecretNamespaceMissing,
    #[error("failed to convert partition {value:?} to integer")]
    InvalidPartition { value: String },
    #[error(
        "vSphere volume context has no initialvolumefilepath: cannot write the in-tree volumePath"
    )]
    MissingVsphereVolumePath,
    #[error("failed to get region from zones: {0}")]
    Region(RegionError),
    /// The wording of upstream's failure users search for.
    #[error("failed to translate topology: {0}")]
    Topology(#[from] TopologyTranslationError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_plugin_once_both_ways() {
        let expected = [
            (
                InTreePlugin::AwsEbs,
                "kubernetes.io/aws-ebs",
                "ebs.csi.aws.com",
            ),
            (
                InTreePlugin::GcePd,
                "kubernetes.io/gce-pd",
                "pd.csi.storage.gke.io",
            ),
            (
                InTreePlugin::AzureDisk,
                "kubernetes.io/azure-disk",
                "disk.csi.azure.com",
            ),
            (
                InTreePlugin::AzureFile,
                "kubernetes.io/azure-file",
                "file.csi.azure.com",
            ),
            (
                InTreePlugin::Cinder,
                "kubernetes.io/cinder",
                "cinder.csi.openstack.org",
            ),
            (
                InTreePlugin::VsphereVolume,
                "kubernetes.io/vsphere-volume",
                "csi.vsphere.vmware.com",
            ),
            (
                InTreePlugin::Portworx,
                "kubernetes.io/portworx-volume",
                "pxd.portworx.com",
            ),
        ];
        assert_eq!(InTreePlugin::ALL.len(), expected.len());
        for (plugin, in_tree, driver) in expected {
            assert_eq!(plugin.in_tree_name(), in_tree);
            assert_eq!(plugin.csi_driver(), driver);
            assert_eq!(plugin.to_string(), in_tree);
            assert_eq!(InTreePlugin::from_in_tree_name(in_tree), Some(plugin));
            assert_eq!(InTreePlugin::from_csi_driver(driver), Some(plugin));
            // A CSI driver name is not an in-tree name, and vice versa.
            assert_eq!(InTreePlugin::from_in_tree_name(driver), None);
            assert_eq!(InTreePlugin::from_csi_driver(in_tree), None);
        }
        for plugin in InTreePlugin::ALL {
            assert_eq!(
                PLUGINS.iter().filter(|row| row.0 == plugin).count(),
                1,
                "{plugin:?}"
            );
        }
        assert_eq!(InTreePlugin::from_csi_driver("hostpath.csi.k8s.io"), None);
        assert_eq!(InTreePlugin::from_in_tree_name("kubernetes.io/rbd"), None);
    }

    #[test]
    fn topology_keys() {
        let keys: Vec<_> = InTreePlugin::ALL
            .iter()
            .map(|plugin| plugin.topology_key())
            .collect();
        assert_eq!(
            keys,
            vec![
                Some("topology.ebs.csi.aws.com/zone"),
                Some("topology.gke.io/zone"),
                Some("topology.disk.csi.azure.com/zone"),
                None,
                Some("topology.cinder.csi.openstack.org/zone"),
                Some("topology.csi.vmware.com/zone"),
                None,
            ]
        );
    }
}
