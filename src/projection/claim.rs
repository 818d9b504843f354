//! A PersistentVolumeClaim as the claim cache keeps it: identity, the whole
//! spec (every field of it is read by provisioning: class, size, modes,
//! selector, data sources, the bound volume) and the phase.

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use super::shared::{convert, convert_all};
use super::{Map, Meta, Projection, Shared, cached_as, meta};

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PersistentVolumeClaim {
    #[serde(default, deserialize_with = "meta::trimmed_meta")]
    pub metadata: Meta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PersistentVolumeClaimSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PersistentVolumeClaimStatus>,
}

/// The whole spec, with the resource maps as [`Map`]s and the rare
/// references (selector, data sources) boxed.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PersistentVolumeClaimSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_modes: Option<Vec<Shared>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_source: Option<Box<k8s::TypedLocalObjectReference>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_source_ref: Option<Box<k8s::TypedObjectReference>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<VolumeResourceRequirements>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<Box<LabelSelector>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_attributes_class_name: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<Shared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct VolumeResourceRequirements {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Map<Quantity>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<Map<Quantity>>,
}

impl PersistentVolumeClaimSpec {
    /// The full API type.
    pub fn to_object(&self) -> k8s::PersistentVolumeClaimSpec {
        k8s::PersistentVolumeClaimSpec {
            access_modes: convert_all(&self.access_modes),
            data_source: self.data_source.as_deref().cloned(),
            data_source_ref: self.data_source_ref.as_deref().cloned(),
            resources: self
                .resources
                .as_ref()
                .map(|r| k8s::VolumeResourceRequirements {
                    limits: r.limits.as_ref().map(Map::to_btree),
                    requests: r.requests.as_ref().map(Map::to_btree),
                }),
            selector: self.selector.as_deref().cloned(),
            storage_class_name: convert(&self.storage_class_name),
            volume_attributes_class_name: convert(&self.volume_attributes_class_name),
            volume_mode: convert(&self.volume_mode),
            volume_name: self.volume_name.clone(),
        }
    }

    /// What the cache keeps of a full spec.
    pub fn project(spec: &k8s::PersistentVolumeClaimSpec) -> Self {
        PersistentVolumeClaimSpec {
            access_modes: convert_all(&spec.access_modes),
            data_source: spec.data_source.clone().map(Box::new),
            data_source_ref: spec.data_source_ref.clone().map(Box::new),
            resources: spec.resources.as_ref().map(|r| VolumeResourceRequirements {
                limits: r.limits.as_ref().map(Map::from),
                requests: r.requests.as_ref().map(Map::from),
            }),
            selector: spec.selector.clone().map(Box::new),
            storage_class_name: convert(&spec.storage_class_name),
            volume_attributes_class_name: convert(&spec.volume_attributes_class_name),
            volume_mode: convert(&spec.volume_mode),
            volume_name: spec.volume_name.clone(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct PersistentVolumeClaimStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<Shared>,
}

cached_as!(PersistentVolumeClaim, k8s::PersistentVolumeClaim);

impl Projection for PersistentVolumeClaim {
    type Object = k8s::PersistentVolumeClaim;

    fn to_object(&self) -> k8s::PersistentVolumeClaim {
        k8s::PersistentVolumeClaim {
            metadata: self.metadata.to_object_meta(),
            spec: self.spec.as_ref().map(PersistentVolumeClaimSpec::to_object),
            status: self
                .status
                .as_ref()
                .map(|s| k8s::PersistentVolumeClaimStatus {
                    phase: convert(&s.phase),
                    ..k8s::PersistentVolumeClaimStatus::default()
                }),
        }
    }

    fn project(claim: &k8s::PersistentVolumeClaim) -> Self {
        PersistentVolumeClaim {
            metadata: meta::project(&claim.metadata, meta::all_but_last_applied).into(),
            spec: claim.spec.as_ref().map(PersistentVolumeClaimSpec::project),
            status: claim.status.as_ref().map(|s| PersistentVolumeClaimStatus {
                phase: convert(&s.phase),
            }),
        }
    }
}
