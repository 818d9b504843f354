//! A PersistentVolume as the volume cache keeps it: identity, the claim it
//! is bound to, its CSI source (or the in-tree source of a migrated volume,
//! boxed: rare), class, capacity, modes, topology, reclaim policy, phase.

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use super::shared::{convert, convert_all};
use super::{Map, Meta, Projection, Shared, cached_as, meta};

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PersistentVolume {
    #[serde(default, deserialize_with = "meta::of_volume")]
    pub metadata: Meta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PersistentVolumeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PersistentVolumeStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PersistentVolumeSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_modes: Option<Vec<Shared>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Map<Quantity>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_ref: Option<ClaimReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub csi: Option<CSIPersistentVolumeSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mount_options: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<k8s::VolumeNodeAffinity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_reclaim_policy: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_attributes_class_name: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<Shared>,
    // The in-tree sources whose volumes CSI migration hands to a CSI
    // driver (src/migration/volume.rs); any other source makes a volume
    // not ours, so it is never cached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aws_elastic_block_store: Option<Box<k8s::AWSElasticBlockStoreVolumeSource>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub azure_disk: Option<Box<k8s::AzureDiskVolumeSource>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub azure_file: Option<Box<k8s::AzureFilePersistentVolumeSource>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cinder: Option<Box<k8s::CinderPersistentVolumeSource>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gce_persistent_disk: Option<Box<k8s::GCEPersistentDiskVolumeSource>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub portworx_volume: Option<Box<k8s::PortworxVolumeSource>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vsphere_volume: Option<Box<k8s::VsphereVirtualDiskVolumeSource>>,
}

/// A volume's CSI source: the secret references (rarely set, five of
/// them) boxed, the attributes a [`Map`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CSIPersistentVolumeSource {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_expand_secret_ref: Option<Box<k8s::SecretReference>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_publish_secret_ref: Option<Box<k8s::SecretReference>>,
    pub driver: Shared,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_expand_secret_ref: Option<Box<k8s::SecretReference>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_publish_secret_ref: Option<Box<k8s::SecretReference>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_stage_secret_ref: Option<Box<k8s::SecretReference>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_attributes: Option<Map>,
    pub volume_handle: String,
}

impl CSIPersistentVolumeSource {
    fn to_object(&self) -> k8s::CSIPersistentVolumeSource {
        k8s::CSIPersistentVolumeSource {
            controller_expand_secret_ref: self.controller_expand_secret_ref.as_deref().cloned(),
            controller_publish_secret_ref: self.controller_publish_secret_ref.as_deref().cloned(),
            driver: self.driver.to_string(),
            fs_type: convert(&self.fs_type),
            node_expand_secret_ref: self.node_expand_secret_ref.as_deref().cloned(),
            node_publish_secret_ref: self.node_publish_secret_ref.as_deref().cloned(),
            node_stage_secret_ref: self.node_stage_secret_ref.as_deref().cloned(),
            read_only: self.read_only,
            volume_attributes: self.volume_attributes.as_ref().map(Map::to_btree),
            volume_handle: self.volume_handle.clone(),
        }
    }

    fn project(csi: &k8s::CSIPersistentVolumeSource) -> Self {
        CSIPersistentVolumeSource {
            controller_expand_secret_ref: boxed(&csi.controller_expand_secret_ref),
            controller_publish_secret_ref: boxed(&csi.controller_publish_secret_ref),
            driver: Shared::from(&csi.driver),
            fs_type: convert(&csi.fs_type),
            node_expand_secret_ref: boxed(&csi.node_expand_secret_ref),
            node_publish_secret_ref: boxed(&csi.node_publish_secret_ref),
            node_stage_secret_ref: boxed(&csi.node_stage_secret_ref),
            read_only: csi.read_only,
            volume_attributes: csi.volume_attributes.as_ref().map(Map::from),
            volume_handle: csi.volume_handle.clone(),
        }
    }
}

/// The claim a volume is bound to, as the loops read it: which claim (the
/// uid tells a re-created claim of the same name apart). Its
/// resourceVersion and fieldPath are read by no loop and not kept.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClaimReference {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl ClaimReference {
    fn to_object(&self) -> k8s::ObjectReference {
        k8s::ObjectReference {
            api_version: convert(&self.api_version),
            kind: convert(&self.kind),
            name: self.name.clone(),
            namespace: convert(&self.namespace),
            uid: self.uid.clone(),
            ..k8s::ObjectReference::default()
        }
    }

    fn project(reference: &k8s::ObjectReference) -> Self {
        ClaimReference {
            api_version: convert(&reference.api_version),
            kind: convert(&reference.kind),
            name: reference.name.clone(),
            namespace: convert(&reference.namespace),
            uid: reference.uid.clone(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct PersistentVolumeStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<Shared>,
    /// When the phase last changed (Kubernetes 1.29 and later): for a
    /// Released PV, when it was released, the start of
    /// `csi_provisioner_volume_deletion_seconds`.
    #[serde(
        rename = "lastPhaseTransitionTime",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_phase_transition_time: Option<Time>,
}

cached_as!(PersistentVolume, k8s::PersistentVolume);

/// The spec's fields copied from `$spec` into `$target`: as they are, and
/// the in-tree sources through `$source` (boxed in the projection).
macro_rules! spec_fields {
    ($spec:expr, $source:ident, $capacity:expr, $csi:expr, $claim_ref:expr, $target:path $(, $rest:expr)?) => {{
        $target {
            access_modes: convert_all(&$spec.access_modes),
            capacity: $spec.capacity.as_ref().map($capacity),
            claim_ref: $spec.claim_ref.as_ref().map($claim_ref),
            csi: $spec.csi.as_ref().map($csi),
            mount_options: $spec.mount_options.clone(),
            node_affinity: $spec.node_affinity.clone(),
            persistent_volume_reclaim_policy: convert(&$spec.persistent_volume_reclaim_policy),
            storage_class_name: convert(&$spec.storage_class_name),
            volume_attributes_class_name: convert(&$spec.volume_attributes_class_name),
            volume_mode: convert(&$spec.volume_mode),
            aws_elastic_block_store: $source(&$spec.aws_elastic_block_store),
            azure_disk: $source(&$spec.azure_disk),
            azure_file: $source(&$spec.azure_file),
            cinder: $source(&$spec.cinder),
            gce_persistent_disk: $source(&$spec.gce_persistent_disk),
            portworx_volume: $source(&$spec.portworx_volume),
            vsphere_volume: $source(&$spec.vsphere_volume),
            $(..$rest)?
        }
    }};
}

fn unbox<T: Clone>(value: &Option<Box<T>>) -> Option<T> {
    value.as_deref().cloned()
}

fn boxed<T: Clone>(value: &Option<T>) -> Option<Box<T>> {
    value.clone().map(Box::new)
}

impl Projection for PersistentVolume {
    type Object = k8s::PersistentVolume;

    fn to_object(&self) -> k8s::PersistentVolume {
        k8s::PersistentVolume {
            metadata: self.metadata.to_object_meta(),
            spec: self.spec.as_ref().map(|s| {
                spec_fields!(
                    s,
                    unbox,
                    Map::to_btree,
                    CSIPersistentVolumeSource::to_object,
                    ClaimReference::to_object,
                    k8s::PersistentVolumeSpec,
                    k8s::PersistentVolumeSpec::default()
                )
            }),
            status: self.status.as_ref().map(|s| k8s::PersistentVolumeStatus {
                phase: convert(&s.phase),
                last_phase_transition_time: s.last_phase_transition_time.clone(),
                ..k8s::PersistentVolumeStatus::default()
            }),
        }
    }

    fn project(pv: &k8s::PersistentVolume) -> Self {
        PersistentVolume {
            metadata: meta::project_with_labels(
                &pv.metadata,
                meta::all_but_last_applied,
                meta::volume_labels,
            )
            .into(),
            spec: pv.spec.as_ref().map(|s| {
                spec_fields!(
                    s,
                    boxed,
                    Map::from,
                    CSIPersistentVolumeSource::project,
                    ClaimReference::project,
                    PersistentVolumeSpec
                )
            }),
            status: pv.status.as_ref().map(|s| PersistentVolumeStatus {
                phase: convert(&s.phase),
                last_phase_transition_time: s.last_phase_transition_time.clone(),
            }),
        }
    }
}
