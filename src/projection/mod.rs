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
//! Volumes and claims, the kinds that grow with the cluster, are held
//! tighter (a heap profile of 10,000 of our own pairs found their
//! `BTreeMap` nodes and `ObjectMeta`s the largest costs): their metadata is a
//! [`Meta`], every string map a [`Map`] of exactly its entries, and the
//! strings that repeat across objects (annotation keys, finalizers, class,
//! driver, namespace, modes) one [`Shared`] copy each. They are
//! read from the API as a [`Wire`] (the projection plus its metadata as
//! the `ObjectMeta` that kube and generic code read), and events name them
//! through `events::Involved`.
//!
//! Consequence (as before, with trimmed objects): a cached object is never
//! written back whole; writes are patches or go through a fresh GET.

mod claim;
mod map;
mod meta;
mod pod;
mod shared;
mod small;
mod volume;

pub use claim::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    VolumeResourceRequirements,
};
pub use map::Map;
pub use meta::{LAST_APPLIED, Meta, POD_ANNOTATION_PREFIX};
pub use pod::{EphemeralVolumeSource, Job, JobSpec, JobTemplate, Pod, PodSpec, PodStatus, Volume};
pub use shared::{Shared, forget_unused as forget_unused_strings};
pub use small::{
    CSINode, CSIStorageCapacity, Node, StatefulSet, StatefulSetSpec, StorageClass,
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttributesClass,
};
pub use volume::{
    CSIPersistentVolumeSource, ClaimReference, PersistentVolume, PersistentVolumeSpec,
    PersistentVolumeStatus,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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

/// The type functions of `kube::Resource` and of the store's `Lookup`
/// (kind, group, version, apiVersion, plural), from the full API type.
macro_rules! type_info {
    ($object:ty) => {
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
    };
}
pub(crate) use type_info;

/// Implements `kube::Resource` for a projection, with the kind, group,
/// version and plural of the full type it projects.
macro_rules! resource_of {
    ($projection:ty, $object:ty) => {
        impl kube::Resource for $projection {
            type DynamicType = ();
            type Scope = <$object as k8s_openapi::Resource>::Scope;

            $crate::projection::type_info!($object);
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

/// A projection whose metadata is a [`Meta`] (volumes and claims, the
/// kinds that scale with the cluster): kept in the caches as it is, read
/// from the API as a [`Wire`].
pub trait Cached: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The full API type: kind, group, version, plural and scope.
    type Object: k8s_openapi::Resource;

    fn cached_meta(&self) -> &Meta;
}

/// A [`Cached`] projection as the API client reads it. `kube::Api`, its
/// watcher and generic code over `kube::Resource` (a finalizer edit, a
/// patch) read and change the object's `ObjectMeta`, so a `Wire` carries
/// the projection's whole [`Meta`] as one, and serializes the projection
/// with that metadata. The copy lives only until the object reaches a
/// cache (`From<Wire<S>>` hands out the projection alone).
#[derive(Clone, Debug)]
pub struct Wire<S> {
    metadata: ObjectMeta,
    pub object: S,
}

impl<S: Cached> Wire<S> {
    fn new(object: S) -> Self {
        Wire {
            metadata: object.cached_meta().to_object_meta(),
            object,
        }
    }
}

impl<'de, S: Cached + serde::Deserialize<'de>> serde::Deserialize<'de> for Wire<S> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        S::deserialize(d).map(Wire::new)
    }
}

impl<S: serde::Serialize> serde::Serialize for Wire<S> {
    fn serialize<Ser: serde::Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
        use serde::ser::Error as _;
        let mut value = serde_json::to_value(&self.object).map_err(Ser::Error::custom)?;
        if let Some(fields) = value.as_object_mut() {
            fields.insert(
                "metadata".to_owned(),
                serde_json::to_value(&self.metadata).map_err(Ser::Error::custom)?,
            );
        }
        value.serialize(s)
    }
}

impl<S: Cached> kube::Resource for Wire<S> {
    type DynamicType = ();
    type Scope = <S::Object as k8s_openapi::Resource>::Scope;

    type_info!(S::Object);
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Implements [`Cached`] and the store's `Lookup` for a projection with a
/// [`Meta`], and the `kube::ResourceExt` methods that reading code calls
/// (as inherent methods of the same names).
macro_rules! cached_as {
    ($projection:ty, $object:ty) => {
        impl $crate::projection::Cached for $projection {
            type Object = $object;

            fn cached_meta(&self) -> &$crate::projection::Meta {
                &self.metadata
            }
        }

        impl From<$crate::projection::Wire<$projection>> for $projection {
            fn from(wire: $crate::projection::Wire<$projection>) -> Self {
                wire.object
            }
        }

        impl kube::runtime::reflector::Lookup for $projection {
            type DynamicType = ();

            $crate::projection::type_info!($object);
            fn name(&self) -> Option<std::borrow::Cow<'_, str>> {
                self.metadata
                    .name
                    .as_deref()
                    .map(std::borrow::Cow::Borrowed)
            }
            fn namespace(&self) -> Option<std::borrow::Cow<'_, str>> {
                self.metadata
                    .namespace
                    .as_deref()
                    .map(std::borrow::Cow::Borrowed)
            }
            // Neither is part of a store key's identity (kind, namespace
            // and name); left out, the key of each cached object holds two
            // strings fewer.
            fn resource_version(&self) -> Option<std::borrow::Cow<'_, str>> {
                None
            }
            fn uid(&self) -> Option<std::borrow::Cow<'_, str>> {
                None
            }
        }

        impl $projection {
            /// As `kube::ResourceExt::name_any`.
            pub fn name_any(&self) -> String {
                self.metadata.name.clone().unwrap_or_default()
            }
            /// As `kube::ResourceExt::namespace`.
            pub fn namespace(&self) -> Option<String> {
                self.metadata.namespace.as_ref().map(String::from)
            }
            /// As `kube::ResourceExt::uid`.
            pub fn uid(&self) -> Option<String> {
                self.metadata.uid.clone()
            }
            /// As `kube::ResourceExt::resource_version`.
            pub fn resource_version(&self) -> Option<String> {
                self.metadata.resource_version.clone()
            }
            /// As `kube::ResourceExt::finalizers`.
            pub fn finalizers(&self) -> &[$crate::projection::Shared] {
                self.metadata.finalizers.as_deref().unwrap_or_default()
            }
        }
    };
}
pub(crate) use cached_as;

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
