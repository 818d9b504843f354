//! Minimal `snapshot.storage.k8s.io/v1` types: the fields restoring a volume
//! from a VolumeSnapshot reads, with `kube::Resource` implemented by hand so
//! that `kube::Api<VolumeSnapshot>` works without a CRD code generator.
//! Unknown fields are ignored when reading; `types` keeps apiVersion/kind so
//! that objects written back carry them.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::TypeMeta;
use serde::{Deserialize, Serialize};

use crate::wellknown::SNAPSHOT_API_GROUP;

const SNAPSHOT_VERSION: &str = "v1";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshot {
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub types: Option<TypeMeta>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    #[serde(default)]
    pub source: VolumeSnapshotSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Minimum size of a volume restored from the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContent {
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub types: Option<TypeMeta>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotContentStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    #[serde(default)]
    pub volume_snapshot_ref: ObjectReference,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub deletion_policy: String,
    #[serde(default)]
    pub source: VolumeSnapshotContentSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// `Filesystem` or `Block`; absent on contents created before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Bytes (an integer here, unlike the VolumeSnapshot's Quantity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
}

impl VolumeSnapshot {
    /// An object carrying apiVersion and kind, ready to be sent.
    pub fn new(metadata: ObjectMeta, spec: VolumeSnapshotSpec) -> Self {
        VolumeSnapshot {
            types: Some(type_meta::<Self>()),
            metadata,
            spec,
            status: None,
        }
    }
}

impl VolumeSnapshotContent {
    /// An object carrying apiVersion and kind, ready to be sent.
    pub fn new(metadata: ObjectMeta, spec: VolumeSnapshotContentSpec) -> Self {
        VolumeSnapshotContent {
            types: Some(type_meta::<Self>()),
            metadata,
            spec,
            status: None,
        }
    }
}

fn type_meta<K: kube::Resource<DynamicType = ()>>() -> TypeMeta {
    TypeMeta {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
    }
}

impl kube::Resource for VolumeSnapshot {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("VolumeSnapshot")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(SNAPSHOT_API_GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(SNAPSHOT_VERSION)
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("volumesnapshots")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl kube::Resource for VolumeSnapshotContent {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("VolumeSnapshotContent")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(SNAPSHOT_API_GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(SNAPSHOT_VERSION)
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("volumesnapshotcontents")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn urls_and_type_meta() {
        assert_eq!(
            VolumeSnapshot::url_path(&(), Some("ns")),
            "/apis/snapshot.storage.k8s.io/v1/namespaces/ns/volumesnapshots"
        );
        assert_eq!(
            VolumeSnapshotContent::url_path(&(), None),
            "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents"
        );
        let content =
            VolumeSnapshotContent::new(ObjectMeta::default(), VolumeSnapshotContentSpec::default());
        let json = serde_json::to_value(&content).expect("serialize");
        assert_eq!(json["apiVersion"], "snapshot.storage.k8s.io/v1");
        assert_eq!(json["kind"], "VolumeSnapshotContent");
    }

    #[test]
    fn reads_what_the_snapshot_controller_writes() {
        let snapshot: VolumeSnapshot = serde_json::from_value(serde_json::json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": "snap", "namespace": "ns", "uid": "u1"},
            "spec": {"source": {"persistentVolumeClaimName": "data"}, "volumeSnapshotClassName": "c"},
            "status": {
                "boundVolumeSnapshotContentName": "content",
                "readyToUse": true,
                "restoreSize": "1Gi",
                "creationTime": "2024-01-01T00:00:00Z",
                "unknownField": 1
            }
        }))
        .expect("deserialize");
        let status = snapshot.status.expect("status");
        assert_eq!(
            status.bound_volume_snapshot_content_name.as_deref(),
            Some("content")
        );
        assert_eq!(status.ready_to_use, Some(true));
        assert_eq!(status.restore_size, Some(Quantity("1Gi".into())));
        assert_eq!(
            snapshot.types.map(|t| t.kind).as_deref(),
            Some("VolumeSnapshot")
        );

        let content: VolumeSnapshotContent = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "content", "annotations": {"a": "b"}},
            "spec": {
                "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "u1"},
                "driver": "d",
                "deletionPolicy": "Delete",
                "source": {"volumeHandle": "vol"},
                "sourceVolumeMode": "Block"
            },
            "status": {"snapshotHandle": "h", "restoreSize": 1073741824, "readyToUse": true}
        }))
        .expect("deserialize");
        assert_eq!(content.spec.source_volume_mode.as_deref(), Some("Block"));
        assert_eq!(
            content.status.and_then(|s| s.snapshot_handle).as_deref(),
            Some("h")
        );
        assert_eq!(
            content
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("a"))
                .map(String::as_str),
            Some("b")
        );
        assert!(content.types.is_none());
    }
}
