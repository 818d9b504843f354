//! What the watch caches keep of each object: only what some loop reads.
//!
//! A cache holds every object of its kind in the cluster, so every byte
//! kept is multiplied by the cluster's size. `managedFields` and
//! `kubectl.kubernetes.io/last-applied-configuration` often are half of an
//! object and no loop reads them; a Pod's containers, a Node's status
//! (images, conditions) and a StatefulSet's pod template are most of the
//! rest. Trimming happens on the watch stream, before the object reaches
//! the store or any handler, so no code can read what is not kept.
//!
//! Consequence: a cached object must never be written back whole (update
//! or replace) — it would drop what was trimmed. Writes are patches, or
//! go through a fresh GET.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    EphemeralVolumeSource, Node, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec, PodStatus,
    Volume,
};
use k8s_openapi::api::storage::v1::{
    CSINode, CSIStorageCapacity, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The annotation kubectl writes on `apply`: a copy of the whole object.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Annotations of pods and Jobs that a loop reads (the pod/Job PVC
/// provisioner's requests); every other annotation of those kinds is
/// dropped.
pub const POD_ANNOTATION_PREFIX: &str = "dynamic-pvc-provisioner.kubernetes.io/";

/// Drops from an object what no loop reads.
pub trait Trim {
    fn trim(&mut self);
}

/// Every kind: no managed fields, no last-applied copy.
fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Pods and Jobs: only the annotations a loop reads.
fn keep_loop_annotations(meta: &mut ObjectMeta) {
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k.starts_with(POD_ANNOTATION_PREFIX));
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// A pod volume reduced to what tells which claim it uses: its name, a
/// `persistentVolumeClaim` source, or the fact that it is a generic
/// ephemeral volume (whose claim is `<pod>-<volume>`).
fn trim_volume(volume: Volume) -> Volume {
    Volume {
        name: volume.name,
        persistent_volume_claim: volume.persistent_volume_claim,
        ephemeral: volume.ephemeral.map(|_| EphemeralVolumeSource::default()),
        ..Volume::default()
    }
}

fn trim_pod_spec(spec: PodSpec) -> PodSpec {
    PodSpec {
        node_name: spec.node_name,
        volumes: spec
            .volumes
            .map(|volumes| volumes.into_iter().map(trim_volume).collect()),
        ..PodSpec::default()
    }
}

impl Trim for Pod {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
        keep_loop_annotations(&mut self.metadata);
        self.spec = self.spec.take().map(trim_pod_spec);
        self.status = self.status.take().map(|s| PodStatus {
            phase: s.phase,
            ..PodStatus::default()
        });
    }
}

impl Trim for Job {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
        keep_loop_annotations(&mut self.metadata);
        if let Some(spec) = self.spec.as_mut() {
            spec.template.spec = spec.template.spec.take().map(trim_pod_spec);
            spec.template.metadata = None;
        }
        self.status = None;
    }
}

impl Trim for Node {
    /// Topology is read from the labels; nothing reads a node's spec or
    /// its status (images, conditions: the bulk of a node).
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
        self.metadata.annotations = None;
        self.spec = None;
        self.status = None;
    }
}

impl Trim for StatefulSet {
    /// Retention reads replicas, ordinals, the claim templates and the
    /// policy, never the pod template.
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
        self.spec.template = Default::default();
        self.status = None;
    }
}

macro_rules! trim_metadata_only {
    ($($kind:ty),+ $(,)?) => {
        $(
            impl Trim for $kind {
                fn trim(&mut self) {
                    trim_meta(&mut self.metadata);
                }
            }
        )+
    };
}

trim_metadata_only!(
    PersistentVolume,
    PersistentVolumeClaim,
    StorageClass,
    CSINode,
    VolumeAttachment,
    VolumeAttributesClass,
    CSIStorageCapacity,
    crate::api::reference_grant::ReferenceGrant,
);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {
                    LAST_APPLIED: "{\"a\": 1}",
                    "dynamic-pvc-provisioner.kubernetes.io/cache.enabled": "true",
                    "prometheus.io/scrape": "true",
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s1"}],
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "deletionGracePeriodSeconds": 0,
            },
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "app", "image": "busybox", "env": [{"name": "A", "value": "b"}]}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
                    {"name": "config", "configMap": {"name": "cfg"}},
                ],
            },
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("pod")
    }

    #[test]
    fn a_pod_keeps_what_protection_retention_and_the_pvc_provisioner_read() {
        let mut trimmed = pod();
        trimmed.trim();
        let meta = &trimmed.metadata;
        assert_eq!(meta.name.as_deref(), Some("web"));
        assert_eq!(meta.uid.as_deref(), Some("u1"));
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        assert!(meta.labels.is_some());
        assert!(meta.owner_references.is_some());
        assert!(meta.deletion_timestamp.is_some());
        assert_eq!(meta.deletion_grace_period_seconds, Some(0));
        assert!(meta.managed_fields.is_none());
        let annotations = meta.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["dynamic-pvc-provisioner.kubernetes.io/cache.enabled"]
        );
        let spec = trimmed.spec.expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert!(spec.containers.is_empty());
        let volumes = spec.volumes.expect("volumes");
        assert_eq!(volumes.len(), 3, "every volume keeps its name");
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str()),
            Some("data-web-0")
        );
        assert!(volumes[1].ephemeral.is_some(), "still an ephemeral volume");
        assert!(volumes[2].config_map.is_none());
        let status = trimmed.status.expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert!(status.conditions.is_none());
        assert!(status.pod_ip.is_none());
    }

    #[test]
    fn a_trimmed_pod_is_much_smaller() {
        // A typical pod: a few containers with environment, probes, mounts.
        let mut full = pod();
        let container: k8s_openapi::api::core::v1::Container = serde_json::from_value(json!({
            "name": "app", "image": "registry.example.com/team/app:1.2.3",
            "env": (0..20).map(|i| json!({"name": format!("VAR_{i}"), "value": "some value"})).collect::<Vec<_>>(),
            "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "config", "mountPath": "/etc/app"}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
        }))
        .expect("container");
        if let Some(spec) = full.spec.as_mut() {
            spec.containers = vec![container; 3];
        }
        let mut trimmed = full.clone();
        trimmed.trim();
        let size = |p: &Pod| serde_json::to_vec(p).map(|v| v.len()).unwrap_or(0);
        assert!(
            size(&trimmed) * 2 < size(&full),
            "{} vs {}",
            size(&trimmed),
            size(&full)
        );
    }

    #[test]
    fn claims_and_volumes_keep_every_annotation_but_the_last_applied_copy() {
        let mut claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns",
                "annotations": {LAST_APPLIED: "{}", "volume.kubernetes.io/selected-node": "n1"},
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"storageClassName": "fast"},
        }))
        .expect("claim");
        claim.trim();
        let annotations = claim.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["volume.kubernetes.io/selected-node"]
        );
        assert!(claim.metadata.managed_fields.is_none());
        assert_eq!(
            claim.spec.and_then(|s| s.storage_class_name).as_deref(),
            Some("fast")
        );
    }

    #[test]
    fn nodes_keep_their_labels_only() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"images": [{"names": ["busybox"], "sizeBytes": 1}]},
        }))
        .expect("node");
        node.trim();
        assert!(node.metadata.labels.is_some());
        assert!(node.metadata.annotations.is_none());
        assert!(node.spec.is_none());
        assert!(node.status.is_none());
    }

    #[test]
    fn stateful_sets_keep_claim_templates_and_policy_not_the_pod_template() {
        let mut set: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {
                "replicas": 2, "serviceName": "web",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "busybox"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}}],
                "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"},
            },
        }))
        .expect("set");
        set.trim();
        let spec = set.spec;
        assert_eq!(spec.replicas, Some(2));
        assert!(spec.selector.match_labels.is_some());
        assert_eq!(spec.volume_claim_templates.map(|t| t.len()), Some(1));
        assert!(spec.persistent_volume_claim_retention_policy.is_some());
        assert!(spec.template.spec.is_none());
    }
}
