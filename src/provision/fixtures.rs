//! Objects shared by the tests of this module.

use std::collections::BTreeMap;

use crate::projection::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeSpec, PersistentVolumeStatus,
    VolumeResourceRequirements,
};
use crate::projection::{ClaimReference, StorageClass};
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, TopologySelectorLabelRequirement, TopologySelectorTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::config::{DriverCapabilities, ProvisionerConfig};
use crate::wellknown as wk;

pub const DRIVER: &str = "hostpath.csi.k8s.io";
pub const CLAIM_UID: &str = "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d";
pub const VOLUME: &str = "pvc-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d";

/// The inputs of a plan of `claim` with `class` alone: no nodes, no data
/// source, no VolumeAttributesClass.
pub fn inputs<'a>(
    claim: &'a PersistentVolumeClaim,
    class: &'a StorageClass,
) -> super::ProvisionInputs<'a> {
    super::ProvisionInputs {
        claim,
        class,
        selected_node: None,
        selected_csi_node: None,
        nodes: &[],
        csi_nodes: &[],
        data_source: None,
        data_source_granted: false,
        volume_attributes_class: None,
        decided_volume_name: None,
    }
}

/// The plan of `claim` with `class` alone ([`inputs`]); panics when the
/// decision refuses it.
pub fn planned(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    config: &ProvisionerConfig,
) -> super::ProvisionPlan {
    super::plan_provision(&inputs(claim, class), config).expect("plan")
}

pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A term of a StorageClass's `allowedTopologies`: one `(key, values)`
/// requirement per entry.
pub fn topology_term(expressions: &[(&str, &[&str])]) -> TopologySelectorTerm {
    TopologySelectorTerm {
        match_label_expressions: Some(
            expressions
                .iter()
                .map(|(key, values)| TopologySelectorLabelRequirement {
                    key: (*key).to_owned(),
                    values: values.iter().map(|v| (*v).to_owned()).collect(),
                })
                .collect(),
        ),
    }
}

pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

pub fn config() -> ProvisionerConfig {
    ProvisionerConfig {
        provisioner_identity: "1700000000000-1234-hostpath.csi.k8s.io".to_owned(),
        capabilities: DriverCapabilities {
            clone_volume: true,
            create_delete_snapshot: true,
            modify_volume: true,
            single_node_multi_writer: false,
            publish_unpublish_volume: false,
        },
        ..ProvisionerConfig::with_defaults(DRIVER)
    }
}

/// `ns/data`, 1Gi ReadWriteOnce of class `fast`, annotated for our driver.
pub fn claim() -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some(CLAIM_UID.to_owned()),
            resource_version: Some("42".to_owned()),
            annotations: Some(map(&[(wk::ANN_STORAGE_PROVISIONER, DRIVER)])),
            ..ObjectMeta::default()
        }
        .into(),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(
                    BTreeMap::from([("storage".to_owned(), Quantity("1Gi".to_owned()))]).into(),
                ),
                limits: None,
            }),
            storage_class_name: Some("fast".into()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

pub fn claim_spec(claim: &mut PersistentVolumeClaim) -> &mut PersistentVolumeClaimSpec {
    claim.spec.get_or_insert_with(Default::default)
}

pub fn annotate(metadata: &mut impl Annotated, key: &str, value: &str) {
    metadata.annotate(key, value);
}

/// Metadata of either shape: `ObjectMeta` (API objects) or `Meta` (cached
/// volumes and claims).
pub trait Annotated {
    fn annotate(&mut self, key: &str, value: &str);
}

impl Annotated for ObjectMeta {
    fn annotate(&mut self, key: &str, value: &str) {
        self.annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
    }
}

impl Annotated for crate::projection::Meta {
    fn annotate(&mut self, key: &str, value: &str) {
        self.annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
    }
}

/// Class `fast` of our driver, Immediate binding, no parameters.
pub fn class() -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("fast".to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: DRIVER.to_owned(),
        volume_binding_mode: Some("Immediate".to_owned()),
        ..StorageClass::default()
    }
}

/// A Bound claim `ns/source` of 1Gi bound to PV `pv-source`.
pub fn source_claim() -> PersistentVolumeClaim {
    let mut source = claim();
    source.metadata.name = Some("source".to_owned());
    source.metadata.uid = Some("source-uid".to_owned());
    claim_spec(&mut source).volume_name = Some("pv-source".to_owned());
    source.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".into()),
    });
    source
}

/// The PV behind [`source_claim`]: ours, Bound, handle `source-handle`.
pub fn source_volume() -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv-source".to_owned()),
            ..ObjectMeta::default()
        }
        .into(),
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "source-handle".to_owned(),
                ..CSIPersistentVolumeSource::default()
            }),
            claim_ref: Some(ClaimReference {
                name: Some("source".to_owned()),
                namespace: Some("ns".into()),
                uid: Some("source-uid".to_owned()),
                ..ClaimReference::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        }),
    }
}

/// A provisioned PV of ours: Released, reclaim policy Delete, our finalizer.
pub fn released_volume() -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(VOLUME.to_owned()),
            annotations: Some(map(&[(wk::ANN_PROVISIONED_BY, DRIVER)])),
            finalizers: Some(vec![wk::FINALIZER_PV.to_owned()]),
            ..ObjectMeta::default()
        }
        .into(),
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "handle-1".to_owned(),
                ..CSIPersistentVolumeSource::default()
            }),
            claim_ref: Some(ClaimReference {
                name: Some("data".to_owned()),
                namespace: Some("ns".into()),
                uid: Some(CLAIM_UID.to_owned()),
                ..ClaimReference::default()
            }),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            storage_class_name: Some("fast".into()),
            ..PersistentVolumeSpec::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        }),
    }
}

// ---- CSI migration: the EBS driver serving EKS's in-tree `gp2` class --------

/// The CSI driver that took over `kubernetes.io/aws-ebs`.
pub const EBS_DRIVER: &str = "ebs.csi.aws.com";
/// The in-tree plugin it took over.
pub const AWS_EBS_PLUGIN: &str = "kubernetes.io/aws-ebs";

/// [`config`] for the EBS driver.
pub fn ebs_config() -> ProvisionerConfig {
    ProvisionerConfig {
        driver_name: EBS_DRIVER.to_owned(),
        provisioner_identity: "1700000000000-1234-ebs.csi.aws.com".to_owned(),
        ..config()
    }
}

/// EKS's default class, as it ships: in-tree provisioner, gp2, ext4
/// (Immediate binding here, so plans need no selected node).
pub fn gp2_class() -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("gp2".to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: AWS_EBS_PLUGIN.to_owned(),
        parameters: Some(map(&[("type", "gp2"), ("fsType", "ext4")])),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("Immediate".to_owned()),
        ..StorageClass::default()
    }
}

/// [`claim`] of class `gp2`, annotated as a Kubernetes 1.36 controller-manager
/// does for a migrated class: the CSI driver's name, no migrated-to.
pub fn gp2_claim() -> PersistentVolumeClaim {
    let mut claim = claim();
    claim.metadata.annotations = Some(
        map(&[
            (wk::ANN_STORAGE_PROVISIONER, EBS_DRIVER),
            (wk::ANN_BETA_STORAGE_PROVISIONER, EBS_DRIVER),
        ])
        .into(),
    );
    claim_spec(&mut claim).storage_class_name = Some("gp2".into());
    claim
}

/// A migrated PV of ours as saved: in-tree EBS source, provisioned-by the
/// in-tree plugin, migrated-to the driver; Released, reclaim policy Delete,
/// our finalizer.
pub fn migrated_volume() -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(VOLUME.to_owned()),
            annotations: Some(map(&[
                (wk::ANN_PROVISIONED_BY, AWS_EBS_PLUGIN),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
            ])),
            finalizers: Some(vec![wk::FINALIZER_PV.to_owned()]),
            ..ObjectMeta::default()
        }
        .into(),
        spec: Some(PersistentVolumeSpec {
            aws_elastic_block_store: Some(Box::new(AWSElasticBlockStoreVolumeSource {
                volume_id: "aws://us-east-1a/vol-0123".to_owned(),
                fs_type: Some("ext4".to_owned()),
                ..AWSElasticBlockStoreVolumeSource::default()
            })),
            claim_ref: Some(ClaimReference {
                name: Some("data".to_owned()),
                namespace: Some("ns".into()),
                uid: Some(CLAIM_UID.to_owned()),
                ..ClaimReference::default()
            }),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            storage_class_name: Some("gp2".into()),
            ..PersistentVolumeSpec::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        }),
    }
}
