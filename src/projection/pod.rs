//! Pods and Jobs as their caches keep them: which claims a pod (or a Job's
//! pod template) uses, where it runs, its phase, and the pod/Job PVC
//! provisioner's annotations. A pod volume is its name and whether it is a
//! claim or a generic ephemeral volume (whose claim is `<pod>-<volume>`);
//! the `k8s-openapi` pod volume is over 2,000 bytes inline, this one 56.

use k8s_openapi::api::batch::v1 as k8s_batch;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{Projection, meta, resource_of};

pub use super::meta::Present as EphemeralVolumeSource;

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct Pod {
    #[serde(
        default,
        deserialize_with = "meta::with_loop_annotations",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Volume {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<k8s::PersistentVolumeClaimVolumeSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<EphemeralVolumeSource>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct PodStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct Job {
    #[serde(
        default,
        deserialize_with = "meta::with_loop_annotations",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<JobSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct JobSpec {
    pub template: JobTemplate,
}

/// A Job's pod template: only its spec's volumes are read.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct JobTemplate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
}

resource_of!(Pod, k8s::Pod);
resource_of!(Job, k8s_batch::Job);

fn project_spec(spec: &k8s::PodSpec) -> PodSpec {
    PodSpec {
        node_name: spec.node_name.clone(),
        volumes: spec.volumes.as_ref().map(|volumes| {
            volumes
                .iter()
                .map(|v| Volume {
                    name: v.name.clone(),
                    persistent_volume_claim: v.persistent_volume_claim.clone(),
                    ephemeral: v.ephemeral.as_ref().map(|_| EphemeralVolumeSource),
                })
                .collect()
        }),
    }
}

fn spec_object(spec: &PodSpec) -> k8s::PodSpec {
    k8s::PodSpec {
        node_name: spec.node_name.clone(),
        volumes: spec.volumes.as_ref().map(|volumes| {
            volumes
                .iter()
                .map(|v| k8s::Volume {
                    name: v.name.clone(),
                    persistent_volume_claim: v.persistent_volume_claim.clone(),
                    ephemeral: v
                        .ephemeral
                        .as_ref()
                        .map(|_| k8s::EphemeralVolumeSource::default()),
                    ..k8s::Volume::default()
                })
                .collect()
        }),
        ..k8s::PodSpec::default()
    }
}

impl Projection for Pod {
    type Object = k8s::Pod;

    fn to_object(&self) -> k8s::Pod {
        k8s::Pod {
            metadata: self.metadata.clone(),
            spec: self.spec.as_ref().map(spec_object),
            status: self.status.as_ref().map(|s| k8s::PodStatus {
                phase: s.phase.clone(),
                ..k8s::PodStatus::default()
            }),
        }
    }

    fn project(pod: &k8s::Pod) -> Self {
        Pod {
            metadata: meta::project_with_labels(
                &pod.metadata,
                meta::loop_annotations,
                meta::no_labels,
            ),
            spec: pod.spec.as_ref().map(project_spec),
            status: pod.status.as_ref().map(|s| PodStatus {
                phase: s.phase.clone(),
            }),
        }
    }
}

impl Projection for Job {
    type Object = k8s_batch::Job;

    fn to_object(&self) -> k8s_batch::Job {
        k8s_batch::Job {
            metadata: self.metadata.clone(),
            spec: self.spec.as_ref().map(|s| k8s_batch::JobSpec {
                template: k8s::PodTemplateSpec {
                    metadata: None,
                    spec: s.template.spec.as_ref().map(spec_object),
                },
                ..k8s_batch::JobSpec::default()
            }),
            status: None,
        }
    }

    fn project(job: &k8s_batch::Job) -> Self {
        Job {
            metadata: meta::project_with_labels(
                &job.metadata,
                meta::loop_annotations,
                meta::no_labels,
            ),
            spec: job.spec.as_ref().map(|s| JobSpec {
                template: JobTemplate {
                    spec: s.template.spec.as_ref().map(project_spec),
                },
            }),
        }
    }
}
