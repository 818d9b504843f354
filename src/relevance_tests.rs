use crate::projection::Job;
use crate::projection::Shared;
use crate::projection::StorageClass;
use crate::projection::{PersistentVolume, PersistentVolumeClaim, Pod};
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
    claim_spec(&mut claim).storage_class_name = class_name.map(Shared::from);
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
        csi.driver = OTHER.into();
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
    claim_spec(&mut claim).storage_class_name = Some("other".into());
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
    labelled.metadata.labels = Some(fixtures::map(&[(wk::LABEL_PVC_MANAGED_BY, "id")]).into());
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

/// Objects as a real kube-apiserver 1.36 serves them (managed fields,
/// defaults, status), saved by hand from a control plane of
/// `tests/controlplane`: a bound PV and claim of our driver, a statically
/// bound pair of another driver, pods with and without claims, a Job, a
/// StatefulSet and both classes.
mod real_objects {
    use crate::projection::Job;
    use crate::projection::StatefulSet;
    use serde::de::DeserializeOwned;

    use super::*;
    /// A fixture as the cache receives it: decoded as its projection.
    fn cached<K: DeserializeOwned>(json: &str) -> K {
        serde_json::from_str(json).expect("fixture")
    }

    const PV_OURS: &str = include_str!("../tests/fixtures/real/pv-ours.json");
    const PV_OTHER: &str = include_str!("../tests/fixtures/real/pv-other.json");
    const PVC_OURS: &str = include_str!("../tests/fixtures/real/pvc-ours.json");
    const PVC_OTHER: &str = include_str!("../tests/fixtures/real/pvc-other.json");
    const POD_WITH_CLAIMS: &str = include_str!("../tests/fixtures/real/pod-with-claims.json");
    const POD_WITHOUT_CLAIMS: &str = include_str!("../tests/fixtures/real/pod-without-claims.json");
    const JOB: &str = include_str!("../tests/fixtures/real/job-annotated.json");
    const STATEFUL_SET: &str = include_str!("../tests/fixtures/real/statefulset.json");
    const CLASS_OURS: &str = include_str!("../tests/fixtures/real/storageclass-ours.json");
    const CLASS_OTHER: &str = include_str!("../tests/fixtures/real/storageclass-other.json");

    #[test]
    fn our_volume_is_kept_with_what_deletion_and_the_finalizer_read() {
        let pv: PersistentVolume = cached(PV_OURS);
        assert!(keep_volume(&pv, &config()));
        assert!(pv.metadata.resource_version.is_some() && pv.metadata.uid.is_some());
        // Ours and the API server's own pv-protection.
        assert!(
            pv.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == wk::FINALIZER_PV)
        );
        let spec = pv.spec.as_ref().expect("spec");
        let csi = spec.csi.as_ref().expect("csi source");
        assert_eq!(
            (csi.driver.as_str(), csi.volume_handle.as_str()),
            (DRIVER, "vol-1")
        );
        assert!(csi.volume_attributes.is_some());
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        let claim_ref = spec.claim_ref.as_ref().expect("claimRef");
        assert!(claim_ref.uid.is_some(), "the binder's claim uid is kept");
        assert!(spec.node_affinity.is_some());
        assert_eq!(
            pv.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Bound")
        );
    }

    #[test]
    fn another_drivers_volume_is_dropped() {
        let pv: PersistentVolume = cached(PV_OTHER);
        assert!(!keep_volume(&pv, &config()));
    }

    #[test]
    fn our_claim_is_kept_with_what_provisioning_and_protection_read() {
        let claim: PersistentVolumeClaim = cached(PVC_OURS);
        let class: StorageClass = cached(CLASS_OURS);
        let pv: PersistentVolume = cached(PV_OURS);
        assert!(keep_claim(&claim, Some(&class), Some(&pv), &config()));
        assert!(
            keep_claim(&claim, None, None, &config()),
            "annotated for us"
        );
        assert_eq!(
            annotated_provisioner(&claim),
            Some(DRIVER),
            "the controller-manager's annotation is kept"
        );
        let spec = claim.spec.as_ref().expect("spec");
        assert_eq!(spec.volume_name.as_deref(), Some("pvc-ours"));
        assert!(
            spec.resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .is_some()
        );
        assert!(claim.metadata.uid.is_some() && claim.metadata.labels.is_some());
        assert!(
            class.metadata.annotations.is_none(),
            "the class's last-applied copy is dropped"
        );
    }

    #[test]
    fn another_drivers_statically_bound_claim_is_dropped_by_its_class() {
        let claim: PersistentVolumeClaim = cached(PVC_OTHER);
        let class: StorageClass = cached(CLASS_OTHER);
        assert!(
            annotated_provisioner(&claim).is_none(),
            "bound statically: the controller-manager never annotated it"
        );
        assert!(!keep_claim(&claim, Some(&class), None, &config()));
        assert!(
            keep_claim(&claim, None, None, &config()),
            "kept while its class is unknown"
        );
    }

    #[test]
    fn pods_and_jobs_keep_what_the_loops_read() {
        let pod: Pod = cached(POD_WITH_CLAIMS);
        assert!(keep_pod(&pod));
        let spec = pod.spec.as_ref().expect("spec");
        let volumes: Vec<(&str, bool, bool)> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| {
                (
                    v.name.as_str(),
                    v.persistent_volume_claim.is_some(),
                    v.ephemeral.is_some(),
                )
            })
            .collect();
        // The API server adds the service account's projected volume: kept
        // by name only, like the config map.
        assert_eq!(
            volumes[..3],
            [
                ("data", true, false),
                ("scratch", false, true),
                ("cfg", false, false)
            ]
        );
        assert!(volumes[3..].iter().all(|(name, claim, ephemeral)| {
            name.starts_with("kube-api-access") && !claim && !ephemeral
        }));
        assert!(
            pod.metadata.annotations.is_none(),
            "only the loops' annotations"
        );
        assert!(
            pod.status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some()
        );
        assert!(!keep_pod(&cached::<Pod>(POD_WITHOUT_CLAIMS)));
        let job: Job = cached(JOB);
        assert!(keep_job(&job));
        assert_eq!(
            job.metadata
                .annotations
                .as_ref()
                .map(|a| a.keys().cloned().collect::<Vec<_>>()),
            Some(vec![
                "dynamic-pvc-provisioner.kubernetes.io/cache.enabled".to_owned()
            ])
        );
    }

    #[test]
    fn a_stateful_set_keeps_its_claim_templates_and_policy() {
        let set: StatefulSet = cached(STATEFUL_SET);
        assert_eq!(set.spec.replicas, Some(2));
        assert_eq!(
            set.spec.volume_claim_templates.as_ref().map(Vec::len),
            Some(1)
        );
        assert!(set.spec.persistent_volume_claim_retention_policy.is_some());
        assert!(set.metadata.uid.is_some());
    }
}
