//! The projections of the kinds whose count follows nodes, classes or
//! workloads rather than volumes (except VolumeAttachments, one per attached
//! volume): classes and VolumeAttributesClasses whole but for metadata,
//! nodes by their labels, CSINodes by their drivers, VolumeAttachments by
//! the volume and node they join, StatefulSets without their pod template,
//! CSIStorageCapacity objects whole.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1 as k8s_apps;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::api::storage::v1 as k8s_storage;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use super::{Projection, meta, resource_of};

/// A projection that keeps every field of the full type but metadata noise
/// (managed fields, the last-applied copy): the fields are copied both ways.
macro_rules! all_but_metadata {
    ($projection:ident, $object:path, [$($field:ident),+ $(,)?]) => {
        impl Projection for $projection {
            type Object = $object;

            fn to_object(&self) -> $object {
                $object {
                    metadata: self.metadata.clone(),
                    $($field: self.$field.clone()),+
                }
            }

            fn project(object: &$object) -> Self {
                $projection {
                    metadata: meta::project(&object.metadata, meta::all_but_last_applied),
                    $($field: object.$field.clone()),+
                }
            }
        }
    };
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageClass {
    #[serde(
        default,
        deserialize_with = "meta::trimmed",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub provisioner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_options: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_volume_expansion: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_binding_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_topologies: Option<Vec<k8s::TopologySelectorTerm>>,
}

resource_of!(StorageClass, k8s_storage::StorageClass);
all_but_metadata!(
    StorageClass,
    k8s_storage::StorageClass,
    [
        provisioner,
        parameters,
        reclaim_policy,
        mount_options,
        allow_volume_expansion,
        volume_binding_mode,
        allowed_topologies
    ]
);

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAttributesClass {
    #[serde(
        default,
        deserialize_with = "meta::trimmed",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub driver_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

resource_of!(VolumeAttributesClass, k8s_storage::VolumeAttributesClass);
all_but_metadata!(
    VolumeAttributesClass,
    k8s_storage::VolumeAttributesClass,
    [driver_name, parameters]
);

/// A node: its labels are its topology; nothing reads its spec or status
/// (images and conditions: the bulk of a node).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct Node {
    #[serde(
        default,
        deserialize_with = "meta::without_annotations",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
}

resource_of!(Node, k8s::Node);

impl Projection for Node {
    type Object = k8s::Node;

    fn to_object(&self) -> k8s::Node {
        k8s::Node {
            metadata: self.metadata.clone(),
            ..k8s::Node::default()
        }
    }

    fn project(node: &k8s::Node) -> Self {
        Node {
            metadata: meta::project(&node.metadata, meta::no_annotations),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct CSINode {
    #[serde(
        default,
        deserialize_with = "meta::trimmed",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: k8s_storage::CSINodeSpec,
}

resource_of!(CSINode, k8s_storage::CSINode);

impl Projection for CSINode {
    type Object = k8s_storage::CSINode;

    fn to_object(&self) -> k8s_storage::CSINode {
        k8s_storage::CSINode {
            metadata: self.metadata.clone(),
            spec: self.spec.clone(),
            status: None,
        }
    }

    fn project(node: &k8s_storage::CSINode) -> Self {
        CSINode {
            metadata: meta::project(&node.metadata, meta::all_but_last_applied),
            spec: node.spec.clone(),
        }
    }
}

/// A VolumeAttachment: which PV it attaches to which node. Its inline
/// volume spec (a whole PersistentVolumeSpec, for migrated inline volumes,
/// which this sidecar never deletes) and status are skipped.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct VolumeAttachment {
    #[serde(
        default,
        deserialize_with = "meta::trimmed",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeAttachmentSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeAttachmentSpec {
    pub attacher: String,
    pub node_name: String,
    pub source: VolumeAttachmentSource,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeAttachmentSource {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_name: Option<String>,
}

resource_of!(VolumeAttachment, k8s_storage::VolumeAttachment);

impl Projection for VolumeAttachment {
    type Object = k8s_storage::VolumeAttachment;

    fn to_object(&self) -> k8s_storage::VolumeAttachment {
        k8s_storage::VolumeAttachment {
            metadata: self.metadata.clone(),
            spec: k8s_storage::VolumeAttachmentSpec {
                attacher: self.spec.attacher.clone(),
                node_name: self.spec.node_name.clone(),
                source: k8s_storage::VolumeAttachmentSource {
                    persistent_volume_name: self.spec.source.persistent_volume_name.clone(),
                    ..k8s_storage::VolumeAttachmentSource::default()
                },
            },
            status: None,
        }
    }

    fn project(attachment: &k8s_storage::VolumeAttachment) -> Self {
        VolumeAttachment {
            metadata: meta::project(&attachment.metadata, meta::all_but_last_applied),
            spec: VolumeAttachmentSpec {
                attacher: attachment.spec.attacher.clone(),
                node_name: attachment.spec.node_name.clone(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: attachment.spec.source.persistent_volume_name.clone(),
                },
            },
        }
    }
}

/// A StatefulSet: replicas, ordinals, selector, claim templates and the
/// retention policy; never the pod template or status.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct StatefulSet {
    #[serde(
        default,
        deserialize_with = "meta::trimmed",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: StatefulSetSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StatefulSetSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordinals: Option<k8s_apps::StatefulSetOrdinals>,
    pub selector: LabelSelector,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates: Option<Vec<super::PersistentVolumeClaim>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_retention_policy:
        Option<k8s_apps::StatefulSetPersistentVolumeClaimRetentionPolicy>,
}

resource_of!(StatefulSet, k8s_apps::StatefulSet);

impl Projection for StatefulSet {
    type Object = k8s_apps::StatefulSet;

    fn to_object(&self) -> k8s_apps::StatefulSet {
        k8s_apps::StatefulSet {
            metadata: self.metadata.clone(),
            spec: k8s_apps::StatefulSetSpec {
                replicas: self.spec.replicas,
                ordinals: self.spec.ordinals.clone(),
                selector: self.spec.selector.clone(),
                volume_claim_templates: self
                    .spec
                    .volume_claim_templates
                    .as_ref()
                    .map(|templates| templates.iter().map(Projection::to_object).collect()),
                persistent_volume_claim_retention_policy: self
                    .spec
                    .persistent_volume_claim_retention_policy
                    .clone(),
                ..k8s_apps::StatefulSetSpec::default()
            },
            status: None,
        }
    }

    fn project(set: &k8s_apps::StatefulSet) -> Self {
        let spec = set.spec.clone();
        StatefulSet {
            metadata: meta::project(&set.metadata, meta::all_but_last_applied),
            spec: StatefulSetSpec {
                replicas: spec.replicas,
                ordinals: spec.ordinals,
                selector: spec.selector,
                volume_claim_templates: spec
                    .volume_claim_templates
                    .as_ref()
                    .map(|templates| templates.iter().map(Projection::project).collect()),
                persistent_volume_claim_retention_policy: spec
                    .persistent_volume_claim_retention_policy,
            },
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CSIStorageCapacity {
    #[serde(
        default,
        deserialize_with = "meta::trimmed",
        serialize_with = "meta::serialize"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub storage_class_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_topology: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_volume_size: Option<Quantity>,
}

resource_of!(CSIStorageCapacity, k8s_storage::CSIStorageCapacity);
all_but_metadata!(
    CSIStorageCapacity,
    k8s_storage::CSIStorageCapacity,
    [
        storage_class_name,
        node_topology,
        capacity,
        maximum_volume_size
    ]
);
