//! Object metadata as the caches keep it: what identifies an object and
//! what the loops read (labels, annotations, finalizers, owners, deletion),
//! never `managedFields` or kubectl's last-applied copy, which are often
//! half of an object. Skipped fields and annotations are never allocated:
//! the deserializer passes over them.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::{Map, Shared};
use crate::wellknown as wk;

/// Object metadata as the caches of volumes and claims keep it: the fields
/// of `ObjectMeta` that some loop reads, under the same names, with labels
/// and annotations as [`Map`]s. `ObjectMeta` itself is 360 bytes and
/// allocates a 544-byte node for the first entry of each of its maps; a
/// volume or claim has two of them, and a cluster tens of thousands of
/// volumes and claims.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta {
    pub name: Option<String>,
    pub namespace: Option<Shared>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub generation: Option<i64>,
    pub creation_timestamp: Option<Time>,
    pub deletion_timestamp: Option<Time>,
    pub deletion_grace_period_seconds: Option<i64>,
    pub labels: Option<Map>,
    pub annotations: Option<Map>,
    pub finalizers: Option<Vec<Shared>>,
    pub owner_references: Option<Vec<OwnerReference>>,
}

fn strings(shared: &[Shared]) -> Vec<String> {
    shared.iter().map(String::from).collect()
}

impl Meta {
    /// The same fields in an `ObjectMeta`.
    pub fn to_object_meta(&self) -> ObjectMeta {
        ObjectMeta {
            name: self.name.clone(),
            namespace: self.namespace.as_ref().map(String::from),
            uid: self.uid.clone(),
            resource_version: self.resource_version.clone(),
            generation: self.generation,
            creation_timestamp: self.creation_timestamp.clone(),
            deletion_timestamp: self.deletion_timestamp.clone(),
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            labels: self.labels.as_ref().map(Map::to_btree),
            annotations: self.annotations.as_ref().map(Map::to_btree),
            finalizers: self.finalizers.as_deref().map(strings),
            owner_references: self.owner_references.clone(),
            ..ObjectMeta::default()
        }
    }
}

impl Meta {
    /// The same fields in an `ObjectMeta`, moved (the decoder of the kinds
    /// that keep an `ObjectMeta` reads a `Meta` first).
    pub fn into_object_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace.map(String::from),
            uid: self.uid,
            resource_version: self.resource_version,
            generation: self.generation,
            creation_timestamp: self.creation_timestamp,
            deletion_timestamp: self.deletion_timestamp,
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            labels: self.labels.map(Map::into_strings),
            annotations: self.annotations.map(Map::into_strings),
            finalizers: self.finalizers.as_deref().map(strings),
            owner_references: self.owner_references,
            ..ObjectMeta::default()
        }
    }
}

impl From<ObjectMeta> for Meta {
    /// Keeps every field a `Meta` has (the filtering of labels and
    /// annotations is the projection's: [`project_with_labels`]).
    fn from(meta: ObjectMeta) -> Self {
        Meta {
            name: meta.name,
            namespace: meta.namespace.map(Shared::from),
            uid: meta.uid,
            resource_version: meta.resource_version,
            generation: meta.generation,
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
            deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
            labels: meta.labels.map(Map::from),
            annotations: meta.annotations.map(Map::from),
            finalizers: meta
                .finalizers
                .map(|all| all.into_iter().map(Shared::from).collect()),
            owner_references: meta.owner_references,
        }
    }
}

impl Serialize for Meta {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_object_meta().serialize(s)
    }
}

/// The annotation kubectl writes on `apply`: a copy of the whole object.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Annotations of pods and Jobs that a loop reads (the pod/Job PVC
/// provisioner's requests); every other annotation of those kinds is
/// skipped.
pub const POD_ANNOTATION_PREFIX: &str = "dynamic-pvc-provisioner.kubernetes.io/";

/// A string map (annotations, labels) read key by key; values of skipped
/// keys are not allocated.
struct Filtered(fn(&str) -> bool);

impl<'de> serde::de::DeserializeSeed<'de> for Filtered {
    type Value = Option<Map>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Filtered {
    type Value = Option<Map>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of strings")
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = Vec::new();
        // Keys are decoded as `Shared` directly: a `String` per key, only to
        // be interned or dropped, was an allocation per annotation on every
        // watch event. A skipped key leaves the set at the next release.
        while let Some(key) = map.next_key::<Shared>()? {
            if (self.0)(&key) {
                kept.push((key, map.next_value::<Shared>()?));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok((!kept.is_empty()).then(|| kept.into_iter().collect()))
    }
}

/// The metadata fields kept; every other field of the JSON is skipped.
/// Annotations and labels are filtered by key.
struct Fields {
    annotations: fn(&str) -> bool,
    labels: fn(&str) -> bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for Fields {
    type Value = Meta;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields {
    type Value = Meta;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("object metadata")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Meta::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut meta = Meta::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "name" => meta.name = map.next_value()?,
                "namespace" => meta.namespace = map.next_value()?,
                "uid" => meta.uid = map.next_value()?,
                "resourceVersion" => meta.resource_version = map.next_value()?,
                "generation" => meta.generation = map.next_value()?,
                "creationTimestamp" => {
                    meta.creation_timestamp = map.next_value::<Option<Time>>()?
                }
                "deletionTimestamp" => {
                    meta.deletion_timestamp = map.next_value::<Option<Time>>()?
                }
                "deletionGracePeriodSeconds" => {
                    meta.deletion_grace_period_seconds = map.next_value()?
                }
                "labels" => meta.labels = map.next_value_seed(Filtered(self.labels))?,
                "annotations" => {
                    meta.annotations = map.next_value_seed(Filtered(self.annotations))?
                }
                "finalizers" => meta.finalizers = map.next_value()?,
                "ownerReferences" => {
                    meta.owner_references = map.next_value::<Option<Vec<OwnerReference>>>()?
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(meta)
    }
}

fn decode<'de, D: Deserializer<'de>>(
    d: D,
    annotations: fn(&str) -> bool,
    labels: fn(&str) -> bool,
) -> Result<ObjectMeta, D::Error> {
    decode_meta(d, annotations, labels).map(Meta::into_object_meta)
}

fn decode_meta<'de, D: Deserializer<'de>>(
    d: D,
    annotations: fn(&str) -> bool,
    labels: fn(&str) -> bool,
) -> Result<Meta, D::Error> {
    serde::de::DeserializeSeed::deserialize(
        Fields {
            annotations,
            labels,
        },
        d,
    )
}

/// [`trimmed`], as a [`Meta`].
pub(super) fn trimmed_meta<'de, D: Deserializer<'de>>(d: D) -> Result<Meta, D::Error> {
    decode_meta(d, all_but_last_applied, all_labels)
}

/// Metadata of volumes as a [`Meta`]: every annotation but the
/// last-applied copy, and only the labels a loop reads
/// ([`volume_labels`]).
pub(super) fn of_volume<'de, D: Deserializer<'de>>(d: D) -> Result<Meta, D::Error> {
    decode_meta(d, all_but_last_applied, volume_labels)
}

/// Metadata of claims and classes: every label, every annotation but the
/// last-applied copy.
pub(super) fn trimmed<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    decode(d, all_but_last_applied, all_labels)
}

/// Metadata of pods and Jobs: only the pod/Job PVC provisioner's
/// annotations, no labels (no loop reads a pod's or a Job's labels; a pod
/// has a few, and a cached map costs a few hundred bytes).
pub(super) fn with_loop_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<ObjectMeta, D::Error> {
    decode(d, loop_annotations, no_labels)
}

/// Metadata of nodes: no annotations.
pub(super) fn without_annotations<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    decode(d, no_annotations, all_labels)
}

/// Projects metadata read live the way the caches would keep it.
pub(super) fn project(meta: &ObjectMeta, annotations: fn(&str) -> bool) -> ObjectMeta {
    project_with_labels(meta, annotations, all_labels)
}

/// [`project`] with labels filtered by key too.
pub(super) fn project_with_labels(
    meta: &ObjectMeta,
    annotations: fn(&str) -> bool,
    labels: fn(&str) -> bool,
) -> ObjectMeta {
    let filtered = |map: &Option<BTreeMap<String, String>>, keep: fn(&str) -> bool| {
        map.as_ref().and_then(|all| {
            let kept: BTreeMap<String, String> = all
                .iter()
                .filter(|(key, _)| keep(key))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (!kept.is_empty()).then_some(kept)
        })
    };
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp.clone(),
        deletion_timestamp: meta.deletion_timestamp.clone(),
        deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
        labels: filtered(&meta.labels, labels),
        annotations: filtered(&meta.annotations, annotations),
        finalizers: meta.finalizers.clone(),
        owner_references: meta.owner_references.clone(),
        ..ObjectMeta::default()
    }
}

/// Annotations of claims, volumes and classes: loops read many well-known
/// ones, and users' templates may read any.
pub(super) fn all_but_last_applied(key: &str) -> bool {
    key != LAST_APPLIED
}

/// Annotations of pods and Jobs: the pod/Job PVC provisioner's only.
pub(super) fn loop_annotations(key: &str) -> bool {
    key.starts_with(POD_ANNOTATION_PREFIX)
}

/// Annotations of nodes: none (topology is read from labels).
pub(super) fn no_annotations(_: &str) -> bool {
    false
}

fn all_labels(_: &str) -> bool {
    true
}

pub(super) fn no_labels(_: &str) -> bool {
    false
}

/// The labels of a volume that a loop reads: the PV releaser's own
/// (src/releaser/decide.rs), the zone and region of an in-tree volume
/// migrated to CSI (src/migration/topology.rs). A CSI
/// volume's topology is in its node affinity; its other labels (often a
/// few per volume, set by users or tools) are never read, and a cached
/// label map costs a few hundred bytes per volume.
pub(super) fn volume_labels(key: &str) -> bool {
    matches!(
        key,
        wk::LABEL_PV_RELEASER_MANAGED_BY
            | wk::LABEL_TOPOLOGY_ZONE
            | wk::LABEL_TOPOLOGY_REGION
            | wk::LABEL_FAILURE_DOMAIN_BETA_ZONE
            | wk::LABEL_FAILURE_DOMAIN_BETA_REGION
    )
}

/// Serializes metadata as the API does (for tests and debugging output).
pub(super) fn serialize<S: Serializer>(meta: &ObjectMeta, s: S) -> Result<S::Ok, S::Error> {
    meta.serialize(s)
}

/// A field that is either absent or `{}`-like in the API and of which only
/// its presence is read (a pod's generic ephemeral volume).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Present;

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Present)
    }
}

impl Serialize for Present {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_map(Some(0))
            .and_then(serde::ser::SerializeMap::end)
    }
}
