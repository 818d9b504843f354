use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::json;

use super::*;
use crate::provision::fixtures::{
    self, DRIVER, claim, claim_spec, class, config, ebs_config, gp2_class, migrated_volume,
    source_claim, source_volume,
};

const OTHER: &str = "other.example.com";

fn other_class() -> StorageClass {
    let mut class = class();
    class.metadata.name = Some("other".to_owned());
    class.provisioner = OTHER.to_owned();
    class
}

/// A claim of class `name` with no storage-provisioner annotation (the
/// controller-manager has not looked at it yet, or bound it statically).
fn unannotated(class_name: Option<&str>) -> PersistentVolumeClaim {
    let mut claim = claim();
    claim.metadata.annotations = None;
    claim_spec(&mut claim).storage_class_name = class_name.map(str::to_owned);
    claim
}

fn annotated_for(provisioner: &str, class_name: &str) -> PersistentVolumeClaim {
    let mut claim = unannotated(Some(class_name));
    fixtures::annotate(
        &mut claim.metadata,
        wk::ANN_STORAGE_PROVISIONER,
        provisioner,
    );
    claim
}

fn other_volume() -> PersistentVolume {
    let mut pv = source_volume();
    if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.driver = OTHER.to_owned();
    }
    pv
}

#[test]
fn volumes_are_kept_only_when_ours() {
    let config = config();
    assert!(keep_volume(&source_volume(), &config), "our CSI driver");
    assert!(!keep_volume(&other_volume(), &config), "another CSI driver");
    let mut provisioned_by_us = other_volume();
    fixtures::annotate(
        &mut provisioned_by_us.metadata,
        wk::ANN_PROVISIONED_BY,
        DRIVER,
    );
    if let Some(spec) = provisioned_by_us.spec.as_mut() {
        spec.csi = None;
    }
    assert!(
        keep_volume(&provisioned_by_us, &config),
        "our provisioned-by annotation, no CSI source"
    );
    let mut provisioned_by_other = source_volume();
    fixtures::annotate(
        &mut provisioned_by_other.metadata,
        wk::ANN_PROVISIONED_BY,
        OTHER,
    );
    assert!(
        !keep_volume(&provisioned_by_other, &config),
        "provisioned by another driver, whatever its CSI source says"
    );
    // CSI migration: an in-tree EBS volume is ours only for the EBS driver.
    assert!(keep_volume(&migrated_volume(), &ebs_config()));
    assert!(!keep_volume(&migrated_volume(), &config));
}

#[test]
fn claims_of_another_provisioner_are_dropped() {
    let config = config();
    let other = other_class();
    assert!(!keep_claim(
        &annotated_for(OTHER, "other"),
        Some(&other),
        None,
        &config
    ));
    assert!(
        !keep_claim(&annotated_for(OTHER, "other"), None, None, &config),
        "the annotation alone is evidence: the controller-manager copied it from the class"
    );
    assert!(
        !keep_claim(&unannotated(Some("other")), Some(&other), None, &config),
        "a known class of another provisioner (e.g. bound statically, never annotated)"
    );
    let mut bound_elsewhere = unannotated(Some("other"));
    claim_spec(&mut bound_elsewhere).volume_name = Some("pv-other".to_owned());
    assert!(!keep_claim(&bound_elsewhere, Some(&other), None, &config));
}

#[test]
fn claims_that_may_be_ours_are_kept() {
    let config = config();
    assert!(
        keep_claim(&claim(), Some(&class()), None, &config),
        "annotated for us"
    );
    assert!(
        keep_claim(&claim(), None, None, &config),
        "annotated for us, class unknown"
    );
    assert!(
        keep_claim(&unannotated(Some("fast")), Some(&class()), None, &config),
        "our class, not annotated yet"
    );
    assert!(
        keep_claim(&unannotated(Some("fast")), None, None, &config),
        "a class not seen yet"
    );
    assert!(
        keep_claim(&unannotated(Some("")), None, None, &config),
        "no class: may be bound statically to one of our volumes"
    );
    assert!(
        keep_claim(&unannotated(None), None, None, &config),
        "no class named: the default class may be ours"
    );
    let mut mismatched = other_class();
    mismatched.metadata.name = Some("not-the-claims".to_owned());
    assert!(
        keep_claim(&unannotated(Some("fast")), Some(&mismatched), None, &config),
        "a class that is not the claim's is no evidence"
    );
}

#[test]
fn a_claim_bound_to_our_volume_is_kept_whatever_its_class() {
    let config = config();
    let mut claim = source_claim();
    claim.metadata.annotations = None;
    claim_spec(&mut claim).storage_class_name = Some("other".to_owned());
    assert!(keep_claim(
        &claim,
        Some(&other_class()),
        Some(&source_volume()),
        &config
    ));
    assert!(
        !keep_claim(&claim, Some(&other_class()), None, &config),
        "its volume not cached: another driver's"
    );
}

#[test]
fn claims_labelled_by_the_releaser_or_the_pvc_provisioner_are_kept() {
    let config = config();
    let mut labelled = annotated_for(OTHER, "other");
    labelled.metadata.labels = Some(fixtures::map(&[(wk::LABEL_PVC_MANAGED_BY, "id")]));
    assert!(keep_claim(&labelled, Some(&other_class()), None, &config));
}

#[test]
fn migration_claims_of_the_plugin_our_driver_took_over_are_kept() {
    let config = ebs_config();
    let in_tree = annotated_for("kubernetes.io/aws-ebs", "gp2");
    assert!(
        keep_claim(&in_tree, None, None, &config),
        "not marked migrated yet: it may be with its next change"
    );
    assert!(
        keep_claim(&unannotated(Some("gp2")), Some(&gp2_class()), None, &config),
        "a class of the in-tree plugin we took over"
    );
    assert!(
        !keep_claim(&in_tree, None, None, &fixtures::config()),
        "another driver does not answer for aws-ebs"
    );
}

fn pod(spec: serde_json::Value, annotations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": spec,
    }))
    .expect("pod")
}

#[test]
fn pods_are_kept_when_they_use_a_claim_or_ask_for_one() {
    let containers = json!([{"name": "c", "image": "i"}]);
    let with = |volumes: serde_json::Value| json!({"containers": containers, "volumes": volumes});
    assert!(keep_pod(&pod(
        with(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}])),
        json!({})
    )));
    assert!(keep_pod(&pod(
        with(json!([{"name": "d", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}])),
        json!({})
    )));
    assert!(!keep_pod(&pod(with(json!([])), json!({}))));
    assert!(!keep_pod(&pod(
        with(json!([{"name": "c", "configMap": {"name": "cfg"}}])),
        json!({"prometheus.io/scrape": "true"})
    )));
    assert!(!keep_pod(&pod(
        json!({"containers": containers}),
        json!({})
    )));
    assert!(keep_pod(&pod(
        with(json!([])),
        json!({"dynamic-pvc-provisioner.kubernetes.io/cache.enabled": "true"})
    )));
}

#[test]
fn jobs_are_kept_only_when_they_ask_for_a_claim() {
    let job = |annotations: serde_json::Value| -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": "j", "namespace": "ns", "annotations": annotations},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
        }))
        .expect("job")
    };
    assert!(keep_job(&job(
        json!({"dynamic-pvc-provisioner.kubernetes.io/scratch.enabled": "true"})
    )));
    assert!(!keep_job(&job(json!({"team": "a"}))));
}
