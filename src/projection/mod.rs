//! What the watch caches hold: per kind, a small type with only the fields
//! some loop reads, deserialized straight from the API server's JSON.
//!
//! A cache holds every relevant object of its kind, so every byte of the
//! element type is multiplied by the cluster's size. The `k8s-openapi` types
//! are built to hold any object whole: a `PersistentVolume` is 3,472 bytes
//! before its first string (thirty volume sources, each inline), a pod
//! volume over 2,000. A projection keeps the field names and nesting of the
//! API (so reading code looks the same) but only the fields read, with rare
//! large ones boxed; everything else in the JSON is skipped by the
//! deserializer and never allocated (`managedFields`, the last-applied copy,
//! a pod's containers, a node's status).
//!
//! Reading code that needs the `k8s-openapi` type (a decision shared with
//! live objects, a migration translation) converts one object at a time
//! with [`Projection::to_object`]; no cache is ever converted whole.
//! Each projection has a test that an object saved from a real API server
//! projects to what its loops read (`tests` below, fixtures in
//! `tests/fixtures/real/`).
//!
//! Consequence (as before, with trimmed objects): a cached object is never
//! written back whole; writes are patches or go through a fresh GET.

mod claim;
mod map;
mod meta;
mod pod;
mod small;
mod volume;

pub use claim::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    VolumeResourceRequirements,
};
pub use map::Map;
pub use meta::{LAST_APPLIED, POD_ANNOTATION_PREFIX};
pub use pod::{EphemeralVolumeSource, Job, JobSpec, JobTemplate, Pod, PodSpec, PodStatus, Volume};
pub use small::{
    CSINode, CSIStorageCapacity, Node, StatefulSet, StatefulSetSpec, StorageClass,
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttributesClass,
};
pub use volume::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, PersistentVolumeStatus,
};

/// A cached projection of a `k8s-openapi` type.
pub trait Projection: Sized {
    /// The full API type.
    type Object;

    /// The full object with the projected fields set, the rest default.
    fn to_object(&self) -> Self::Object;

    /// What the cache would keep of `object` (for objects read live, and
    /// tests).
    fn project(object: &Self::Object) -> Self;
}

/// Implements `kube::Resource` for a projection, with the kind, group,
/// version and plural of the full type it projects.
macro_rules! resource_of {
    ($projection:ty, $object:ty) => {
        impl kube::Resource for $projection {
            type DynamicType = ();
            type Scope = <$object as k8s_openapi::Resource>::Scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(<$object as k8s_openapi::Resource>::KIND)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(<$object as k8s_openapi::Resource>::GROUP)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(<$object as k8s_openapi::Resource>::VERSION)
            }
            fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(<$object as k8s_openapi::Resource>::API_VERSION)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(<$object as k8s_openapi::Resource>::URL_PATH_SEGMENT)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use resource_of;

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
