//! Each projection against objects saved from a real kube-apiserver 1.36
//! (`tests/fixtures/real/`): decoded straight from the JSON it keeps what
//! its loops read (the loops' own tests are in `src/relevance_tests.rs` and
//! the decision files), drops what they do not, and equals the projection of
//! the full `k8s-openapi` object, so objects read live and cached agree.

use std::mem::size_of;

use k8s_openapi::api::apps::v1 as k8s_apps;
use k8s_openapi::api::batch::v1 as k8s_batch;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::api::storage::v1 as k8s_storage;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::*;

const PV: &str = include_str!("../../tests/fixtures/real/pv-ours.json");
const PV_OTHER: &str = include_str!("../../tests/fixtures/real/pv-other.json");
const PVC: &str = include_str!("../../tests/fixtures/real/pvc-ours.json");
const PVC_OTHER: &str = include_str!("../../tests/fixtures/real/pvc-other.json");
const POD: &str = include_str!("../../tests/fixtures/real/pod-with-claims.json");
const POD_WITHOUT_CLAIMS: &str = include_str!("../../tests/fixtures/real/pod-without-claims.json");
const JOB: &str = include_str!("../../tests/fixtures/real/job-annotated.json");
const STATEFUL_SET: &str = include_str!("../../tests/fixtures/real/statefulset.json");
const CLASS: &str = include_str!("../../tests/fixtures/real/storageclass-ours.json");
const NODE: &str = include_str!("../../tests/fixtures/real/node.json");
const CSI_NODE: &str = include_str!("../../tests/fixtures/real/csinode.json");
const ATTACHMENT: &str = include_str!("../../tests/fixtures/real/volumeattachment.json");
const ATTRIBUTES_CLASS: &str = include_str!("../../tests/fixtures/real/volumeattributesclass.json");
const CAPACITY: &str = include_str!("../../tests/fixtures/real/csistoragecapacity.json");

/// Decoded straight from the API's JSON, as the caches decode it.
fn decoded<P: DeserializeOwned>(json: &str) -> P {
    serde_json::from_str(json).expect("fixture decodes as its projection")
}

/// The same JSON decoded whole, then projected: must be equal.
fn agrees<P>(json: &str) -> P
where
    P: Projection + DeserializeOwned + PartialEq + std::fmt::Debug,
    P::Object: DeserializeOwned,
{
    let direct: P = decoded(json);
    let full: P::Object = serde_json::from_str(json).expect("fixture decodes whole");
    assert_eq!(direct, P::project(&full), "decoded and projected differ");
    direct
}

/// Metadata as every cache keeps it: identity, no managed fields, no
/// last-applied copy.
fn assert_trimmed_meta(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    assert!(meta.name.is_some() || meta.generate_name.is_some());
    assert!(meta.uid.is_some(), "uid kept");
    assert!(meta.resource_version.is_some(), "resourceVersion kept");
    assert!(meta.managed_fields.is_none(), "managedFields dropped");
    assert!(
        !meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(LAST_APPLIED)),
        "last-applied copy dropped"
    );
}

#[test]
fn fixtures_carry_what_the_projections_must_drop() {
    // Otherwise the tests below would prove nothing.
    for json in [
        PV,
        PVC,
        POD,
        JOB,
        STATEFUL_SET,
        CLASS,
        NODE,
        CSI_NODE,
        ATTACHMENT,
        ATTRIBUTES_CLASS,
        CAPACITY,
    ] {
        let value: serde_json::Value = serde_json::from_str(json).expect("json");
        assert!(
            value.pointer("/metadata/managedFields").is_some(),
            "{json:.80}"
        );
    }
}

#[test]
fn a_volume_keeps_what_deletion_the_finalizer_and_the_releaser_read() {
    let pv: PersistentVolume = agrees(PV);
    assert_trimmed_meta(&pv.metadata.to_object_meta());
    assert!(
        pv.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
    );
    assert!(pv.metadata.annotations.is_some());
    // The fixture's only label (`team`) is one no loop reads.
    assert_eq!(pv.metadata.labels, None);
    let spec = pv.spec.as_ref().expect("spec");
    let csi = spec.csi.as_ref().expect("csi");
    assert!(!csi.driver.is_empty() && !csi.volume_handle.is_empty());
    assert!(csi.volume_attributes.is_some());
    assert!(
        spec.claim_ref
            .as_ref()
            .and_then(|c| c.uid.as_ref())
            .is_some()
    );
    assert!(spec.persistent_volume_reclaim_policy.is_some());
    assert!(spec.storage_class_name.is_some());
    assert!(spec.capacity.is_some());
    assert!(spec.access_modes.is_some());
    assert!(spec.node_affinity.is_some());
    assert!(pv.status.as_ref().and_then(|s| s.phase.as_ref()).is_some());
    // Another driver's volume decodes too (the filter then drops it).
    let _: PersistentVolume = agrees(PV_OTHER);
}

#[test]
fn an_in_tree_volume_keeps_its_source_for_migration() {
    let json = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-ebs", "uid": "u", "resourceVersion": "1"},
        "spec": {"awsElasticBlockStore": {"volumeID": "aws://zone/vol-1", "fsType": "ext4"},
            "capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": "Delete"},
    })
    .to_string();
    let pv: PersistentVolume = agrees(&json);
    let spec = pv.spec.as_ref().expect("spec");
    assert_eq!(
        spec.aws_elastic_block_store
            .as_ref()
            .map(|s| s.volume_id.as_str()),
        Some("aws://zone/vol-1")
    );
    assert_eq!(
        crate::migration::InTreePlugin::of_in_tree_volume(&pv),
        Some(crate::migration::InTreePlugin::AwsEbs)
    );
    // And back to the full type for the translation.
    let full = pv.to_object();
    assert!(full.spec.and_then(|s| s.aws_elastic_block_store).is_some());
}

#[test]
fn a_claim_keeps_its_spec_and_phase() {
    let claim: PersistentVolumeClaim = agrees(PVC);
    assert_trimmed_meta(&claim.metadata.to_object_meta());
    let spec = claim.spec.as_ref().expect("spec");
    assert!(spec.storage_class_name.is_some());
    assert!(
        spec.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .is_some()
    );
    assert!(spec.access_modes.is_some());
    assert!(
        claim
            .status
            .as_ref()
            .and_then(|s| s.phase.as_ref())
            .is_some()
    );
    let _: PersistentVolumeClaim = agrees(PVC_OTHER);
}

#[test]
fn a_pod_keeps_the_claims_it_uses_its_node_and_phase() {
    let pod: Pod = agrees(POD);
    assert_trimmed_meta(&pod.metadata);
    let spec = pod.spec.as_ref().expect("spec");
    let volumes = spec.volumes.as_ref().expect("volumes");
    assert!(volumes.iter().any(|v| v.persistent_volume_claim.is_some()));
    assert!(pod.status.as_ref().and_then(|s| s.phase.as_ref()).is_some());
    let _: Pod = agrees(POD_WITHOUT_CLAIMS);
}

#[test]
fn a_pod_keeps_only_the_loops_annotations_and_every_volume_by_name() {
    let json = json!({
        "apiVersion": "v1", "kind": "Pod",
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
    })
    .to_string();
    let pod: Pod = agrees(&json);
    let meta = &pod.metadata;
    // No loop reads a pod's labels.
    assert_eq!(meta.labels, None);
    assert!(meta.owner_references.is_some());
    assert!(meta.deletion_timestamp.is_some());
    assert_eq!(meta.deletion_grace_period_seconds, Some(0));
    let annotations = meta.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.keys().collect::<Vec<_>>(),
        ["dynamic-pvc-provisioner.kubernetes.io/cache.enabled"]
    );
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some("n1"));
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
    assert!(volumes[2].persistent_volume_claim.is_none() && volumes[2].ephemeral.is_none());
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));
}

#[test]
fn a_job_keeps_its_annotations_for_the_loop_and_its_templates_volumes() {
    let job: Job = agrees(JOB);
    assert_trimmed_meta(&job.metadata);
    assert!(
        job.metadata
            .annotations
            .iter()
            .flatten()
            .all(|(k, _)| k.starts_with(POD_ANNOTATION_PREFIX))
    );
    assert!(job.metadata.annotations.is_some());
    let volumes = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.volumes.as_ref());
    assert!(volumes.is_some_and(|v| !v.is_empty()));
}

#[test]
fn a_stateful_set_keeps_claim_templates_and_policy_not_the_pod_template() {
    let set: StatefulSet = agrees(STATEFUL_SET);
    assert_trimmed_meta(&set.metadata);
    assert!(set.spec.replicas.is_some());
    assert!(set.spec.selector.match_labels.is_some());
    assert!(
        set.spec
            .volume_claim_templates
            .as_ref()
            .is_some_and(|t| !t.is_empty())
    );
    assert!(set.spec.persistent_volume_claim_retention_policy.is_some());
    let value: serde_json::Value = serde_json::from_str(STATEFUL_SET).expect("json");
    assert!(value.pointer("/spec/template/spec/containers").is_some());
    let full = set.to_object();
    assert!(full.spec.template.spec.is_none());
}

#[test]
fn a_class_keeps_every_field_but_metadata_noise() {
    let class: StorageClass = agrees(CLASS);
    assert_trimmed_meta(&class.metadata);
    let full: k8s_storage::StorageClass = serde_json::from_str(CLASS).expect("json");
    assert_eq!(class.provisioner, full.provisioner);
    assert_eq!(class.parameters, full.parameters);
    assert_eq!(class.reclaim_policy, full.reclaim_policy);
    assert_eq!(class.volume_binding_mode, full.volume_binding_mode);
    assert_eq!(class.to_object().parameters, full.parameters);
}

#[test]
fn a_node_keeps_its_labels_only() {
    let node: Node = agrees(NODE);
    assert_trimmed_meta(&node.metadata);
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("zone-1"),
        "topology comes from labels"
    );
    assert!(node.metadata.annotations.is_none());
    let value: serde_json::Value = serde_json::from_str(NODE).expect("json");
    assert!(
        value.pointer("/status/images").is_some(),
        "the fixture has a status"
    );
}

#[test]
fn a_csi_node_keeps_its_drivers() {
    let node: CSINode = agrees(CSI_NODE);
    assert_trimmed_meta(&node.metadata);
    let ours = node
        .spec
        .drivers
        .iter()
        .find(|d| d.name == "hostpath.csi.k8s.io")
        .expect("our driver");
    assert_eq!(ours.node_id, "node-a");
    assert!(ours.topology_keys.as_ref().is_some_and(|k| !k.is_empty()));
    assert!(ours.allocatable.is_some());
}

#[test]
fn a_volume_attachment_keeps_the_volume_and_node_only() {
    let attachment: VolumeAttachment = agrees(ATTACHMENT);
    assert_trimmed_meta(&attachment.metadata);
    assert_eq!(attachment.spec.node_name, "node-a");
    assert_eq!(
        attachment.spec.source.persistent_volume_name.as_deref(),
        Some("pvc-1111")
    );
}

#[test]
fn attributes_classes_and_capacities_keep_every_field_but_metadata_noise() {
    let class: VolumeAttributesClass = agrees(ATTRIBUTES_CLASS);
    assert_trimmed_meta(&class.metadata);
    assert_eq!(class.driver_name, "hostpath.csi.k8s.io");
    assert_eq!(class.parameters.as_ref().map(|p| p.len()), Some(2));
    let capacity: CSIStorageCapacity = agrees(CAPACITY);
    assert_trimmed_meta(&capacity.metadata);
    assert!(capacity.metadata.namespace.is_some());
    assert!(capacity.metadata.owner_references.is_some());
    assert_eq!(capacity.storage_class_name, "hostpath-fast");
    assert!(capacity.capacity.is_some() && capacity.maximum_volume_size.is_some());
    assert!(capacity.node_topology.is_some());
}

/// Inline sizes: what every cached object costs before its first string.
#[test]
fn projections_are_a_fraction_of_the_full_types() {
    // A claim's spec is read whole: only its status goes.
    assert!(size_of::<PersistentVolumeClaim>() < size_of::<k8s::PersistentVolumeClaim>());
    let pairs = [
        (
            "PersistentVolume",
            size_of::<PersistentVolume>(),
            size_of::<k8s::PersistentVolume>(),
        ),
        ("Pod", size_of::<Pod>(), size_of::<k8s::Pod>()),
        ("pod volume", size_of::<Volume>(), size_of::<k8s::Volume>()),
        ("Job", size_of::<Job>(), size_of::<k8s_batch::Job>()),
        (
            "StatefulSet",
            size_of::<StatefulSet>(),
            size_of::<k8s_apps::StatefulSet>(),
        ),
        (
            "VolumeAttachment",
            size_of::<VolumeAttachment>(),
            size_of::<k8s_storage::VolumeAttachment>(),
        ),
        ("Node", size_of::<Node>(), size_of::<k8s::Node>()),
    ];
    for (kind, projection, full) in pairs {
        assert!(
            projection * 2 <= full,
            "{kind}: projection {projection} bytes, full {full} bytes"
        );
    }
    assert!(size_of::<Volume>() <= 128, "{}", size_of::<Volume>());
}

#[test]
fn a_volume_keeps_only_the_labels_a_loop_reads() {
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pv", "labels": {
            "team": "a",
            crate::wellknown::LABEL_PV_RELEASER_MANAGED_BY: "releaser",
            crate::wellknown::LABEL_TOPOLOGY_ZONE: "z1",
            crate::wellknown::LABEL_TOPOLOGY_REGION: "r1",
            crate::wellknown::LABEL_FAILURE_DOMAIN_BETA_ZONE: "z1",
            crate::wellknown::LABEL_FAILURE_DOMAIN_BETA_REGION: "r1",
        }},
    }))
    .expect("decodes");
    let kept: Vec<&str> = pv
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        kept,
        [
            crate::wellknown::LABEL_FAILURE_DOMAIN_BETA_REGION,
            crate::wellknown::LABEL_FAILURE_DOMAIN_BETA_ZONE,
            crate::wellknown::LABEL_PV_RELEASER_MANAGED_BY,
            crate::wellknown::LABEL_TOPOLOGY_REGION,
            crate::wellknown::LABEL_TOPOLOGY_ZONE,
        ]
    );
    // The same from a full object read live.
    let full: k8s_openapi::api::core::v1::PersistentVolume =
        serde_json::from_value(serde_json::to_value(pv.to_object()).expect("json")).expect("full");
    assert_eq!(PersistentVolume::project(&full), pv);
}

#[test]
fn the_maps_of_volumes_and_claims_are_compact() {
    // What the caches pay per object beyond its strings (see
    // src/projection/map.rs): a BTreeMap's first entry allocates 544 bytes.
    let pv: PersistentVolume = agrees(PV);
    let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).expect("csi");
    assert!(
        csi.volume_attributes
            .as_ref()
            .is_some_and(|a| !a.is_empty())
    );
    assert!(size_of::<PersistentVolume>() <= 840);
    assert!(size_of::<PersistentVolumeClaim>() <= 480);
    assert!(
        size_of::<Meta>() < size_of::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>()
    );
}

#[test]
fn volumes_and_claims_share_their_repeated_strings() {
    // Two objects decoded apart hold one copy of each string they repeat
    // (src/projection/shared.rs); unique ones stay their own.
    let same = |a: &str, b: &str| std::ptr::eq(a.as_ptr(), b.as_ptr());
    let (first, second): (PersistentVolume, PersistentVolume) = (decoded(PV), decoded(PV));
    let (one, other) = (&first.metadata, &second.metadata);
    fn key(m: &Meta) -> &str {
        m.annotations
            .as_ref()
            .and_then(|a| a.keys().next())
            .expect("key")
    }
    assert!(same(key(one), key(other)), "annotation key");
    fn value(m: &Meta) -> &Shared {
        m.annotations
            .as_ref()
            .and_then(|a| a.values().next())
            .expect("value")
    }
    assert!(same(value(one), value(other)), "annotation value");
    assert!(same(
        &one.finalizers.as_ref().expect("finalizers")[0],
        &other.finalizers.as_ref().expect("finalizers")[0]
    ));
    let spec = |pv: &PersistentVolume| pv.spec.clone().expect("spec");
    let (a, b) = (spec(&first), spec(&second));
    let driver = |s: &PersistentVolumeSpec| s.csi.as_ref().expect("csi").driver.clone();
    assert!(same(&driver(&a), &driver(&b)), "driver");
    assert!(same(
        a.storage_class_name.as_deref().expect("class"),
        b.storage_class_name.as_deref().expect("class")
    ));
    assert!(!same(
        one.uid.as_deref().expect("uid"),
        other.uid.as_deref().expect("uid")
    ));

    let (claim, again): (PersistentVolumeClaim, PersistentVolumeClaim) =
        (decoded(PVC), decoded(PVC));
    let namespace = |c: &PersistentVolumeClaim| c.metadata.namespace.clone().expect("namespace");
    assert!(same(&namespace(&claim), &namespace(&again)));
    // The PV's driver and the claim's storage-provisioner annotation are the
    // same text, and the same copy.
    let provisioner = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("volume.kubernetes.io/storage-provisioner"))
        .expect("annotated");
    assert!(same(provisioner, &driver(&a)));
}

#[test]
fn a_wire_object_shows_generic_code_the_whole_metadata() {
    // Generic code over `kube::Resource` (the clone-source finalizer edit in
    // src/provisioner/claims.rs) reads finalizers through `meta()`: an
    // identity-only copy made it see none, so a removal did nothing and an
    // addition dropped the others.
    use kube::{Resource, ResourceExt};
    let mut wire: Wire<PersistentVolumeClaim> = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "7",
            "finalizers": ["kubernetes.io/pvc-protection", "example.com/other"],
            "labels": {"app": "a"}, "annotations": {"k": "v"}},
        "spec": {"storageClassName": "fast"},
    }))
    .expect("decodes");
    assert_eq!(
        wire.finalizers(),
        ["kubernetes.io/pvc-protection", "example.com/other"]
    );
    assert_eq!(wire.labels().get("app").map(String::as_str), Some("a"));
    assert_eq!(wire.annotations().get("k").map(String::as_str), Some("v"));
    assert_eq!(wire.resource_version().as_deref(), Some("7"));
    // A change through meta_mut is what is written.
    wire.meta_mut().finalizers = Some(vec!["kubernetes.io/pvc-protection".to_owned()]);
    let written = serde_json::to_value(&wire).expect("json");
    assert_eq!(
        written["metadata"]["finalizers"],
        json!(["kubernetes.io/pvc-protection"])
    );
    assert_eq!(written["spec"]["storageClassName"], "fast");
    let cached = PersistentVolumeClaim::from(wire);
    assert_eq!(cached.metadata.name.as_deref(), Some("c"));
}
