//! A PersistentVolumeClaim as the claim cache keeps it: identity, the whole
//! spec (every field of it is read by provisioning: class, size, modes,
//! selector, data sources, the bound volume) and the phase.

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{Projection, meta, resource_of};

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PersistentVolumeClaim {
    #[serde(
        default,
        deserialize_with = "meta::trimmed",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<k8s::PersistentVolumeClaimSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PersistentVolumeClaimStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct PersistentVolumeClaimStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

resource_of!(PersistentVolumeClaim, k8s::PersistentVolumeClaim);

impl Projection for PersistentVolumeClaim {
    type Object = k8s::PersistentVolumeClaim;

    fn to_object(&self) -> k8s::PersistentVolumeClaim {
        k8s::PersistentVolumeClaim {
            metadata: self.metadata.clone(),
            spec: self.spec.clone(),
            status: self
                .status
                .as_ref()
                .map(|s| k8s::PersistentVolumeClaimStatus {
                    phase: s.phase.clone(),
                    ..k8s::PersistentVolumeClaimStatus::default()
                }),
        }
    }

    fn project(claim: &k8s::PersistentVolumeClaim) -> Self {
        PersistentVolumeClaim {
            metadata: meta::project(&claim.metadata, meta::all_but_last_applied),
            spec: claim.spec.clone(),
            status: claim.status.as_ref().map(|s| PersistentVolumeClaimStatus {
                phase: s.phase.clone(),
            }),
        }
    }
}
