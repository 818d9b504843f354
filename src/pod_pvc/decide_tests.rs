use std::collections::BTreeMap;

use crate::projection::{PersistentVolumeClaim, Volume};
use k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::*;

const ID: &str = "ci";
const PVC_YAML: &str = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: ignored\n  labels:\n    team: build\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: cache\n  resources:\n    requests:\n      storage: 1Gi\n";
const PVC_JSON: &str = r#"{"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}"#;

fn claim_volume(name: &str, claim: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_owned(),
            read_only: None,
        }),
        ..Volume::default()
    }
}

/// A volume of another kind (emptyDir, configMap, ...): the pod
/// projection keeps only its name.
fn empty_dir(name: &str) -> Volume {
    serde_json::from_value(serde_json::json!({"name": name, "emptyDir": {}})).expect("volume")
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), (*v).to_owned()))
        .collect()
}

fn claimant<'a>(
    kind: OwnerKind,
    annotations: &'a BTreeMap<String, String>,
    volumes: &'a [Volume],
) -> Claimant<'a> {
    Claimant {
        kind,
        namespace: "builds",
        name: "agent-1",
        uid: "uid-1",
        annotations: Some(annotations),
        volumes,
    }
}

fn reason(step: &Step) -> &'static str {
    match step {
        Step::Create(_) => "create",
        Step::Exists { .. } => "exists",
        Step::Refuse { reason, .. } => reason,
    }
}

#[test]
fn every_condition_of_a_request() {
    let volumes = [claim_volume("cache", "cache-agent-1"), empty_dir("tmp")];
    let huge = format!("{PVC_JSON}{}", " ".repeat(300 * 1024));
    let list = "apiVersion: v1\nkind: List\nitems: []\n";
    let two_docs = format!("{PVC_YAML}---\n{PVC_YAML}");
    let other_namespace = r#"{"metadata": {"namespace": "prod"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}"#;
    let same_namespace = r#"{"metadata": {"namespace": "builds"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}"#;
    // (what, annotations, claim exists, expected step)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, bool, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            "YAML",
            vec![("cache.enabled", "true"), ("cache.pvc", PVC_YAML)],
            false,
            "create",
        ),
        (
            "JSON",
            vec![("cache.enabled", "true"), ("cache.pvc", PVC_JSON)],
            false,
            "create",
        ),
        (
            "claim exists",
            vec![("cache.enabled", "true"), ("cache.pvc", PVC_YAML)],
            true,
            "exists",
        ),
        (
            "enabled false: not asked",
            vec![("cache.enabled", "false"), ("cache.pvc", PVC_YAML)],
            false,
            "none",
        ),
        (
            "no enabled: not asked",
            vec![("cache.pvc", PVC_YAML)],
            false,
            "none",
        ),
        (
            "enabled not a boolean",
            vec![("cache.enabled", "yes"), ("cache.pvc", PVC_YAML)],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "enabled True",
            vec![("cache.enabled", "True"), ("cache.pvc", PVC_YAML)],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "no pvc annotation",
            vec![("cache.enabled", "true")],
            false,
            REASON_MISSING_PVC,
        ),
        (
            "garbage",
            vec![("cache.enabled", "true"), ("cache.pvc", "{{{")],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "a list, not one claim",
            vec![("cache.enabled", "true"), ("cache.pvc", list)],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "two documents",
            vec![("cache.enabled", "true"), ("cache.pvc", &two_docs)],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "a scalar",
            vec![("cache.enabled", "true"), ("cache.pvc", "42")],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "no spec",
            vec![
                ("cache.enabled", "true"),
                ("cache.pvc", "metadata: {name: x}"),
            ],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "another namespace",
            vec![("cache.enabled", "true"), ("cache.pvc", other_namespace)],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "its own namespace",
            vec![("cache.enabled", "true"), ("cache.pvc", same_namespace)],
            false,
            "create",
        ),
        (
            "300 KiB",
            vec![("cache.enabled", "true"), ("cache.pvc", &huge)],
            false,
            REASON_INVALID_PVC,
        ),
        (
            "volume is not a PVC",
            vec![("tmp.enabled", "true"), ("tmp.pvc", PVC_YAML)],
            false,
            REASON_MISSING_VOLUME,
        ),
        (
            "no such volume",
            vec![("data.enabled", "true"), ("data.pvc", PVC_YAML)],
            false,
            REASON_MISSING_VOLUME,
        ),
        (
            "old slash spelling is not ours",
            vec![("cache/enabled", "true"), ("cache/pvc", PVC_YAML)],
            false,
            "none",
        ),
    ];
    for (what, pairs, exists, want) in cases {
        let annotations = annotations(&pairs);
        let steps = plan(
            &claimant(OwnerKind::Pod, &annotations, &volumes),
            ID,
            |_| exists,
        );
        let got: Vec<&str> = steps.iter().map(|(_, s)| reason(s)).collect();
        let want: Vec<&str> = if want == "none" { vec![] } else { vec![want] };
        assert_eq!(got, want, "{what}: {steps:?}");
    }
}

#[test]
fn a_refusal_says_what_is_missing_and_what_would_be_right() {
    let volumes = [claim_volume("cache", "cache-agent-1"), empty_dir("tmp")];
    let message = |pairs: &[(&str, &str)]| {
        let annotations = annotations(pairs);
        let steps = plan(
            &claimant(OwnerKind::Pod, &annotations, &volumes),
            ID,
            |_| false,
        );
        match steps.as_slice() {
            [(_, Step::Refuse { message, .. })] => message.clone(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        message(&[("cache.enabled", "true")]),
        "volume cache is enabled but annotation dynamic-pvc-provisioner.kubernetes.io/cache.pvc \
         is missing; set it to the PersistentVolumeClaim to create (YAML or JSON)"
    );
    assert_eq!(
        message(&[("tmp.enabled", "true"), ("tmp.pvc", PVC_YAML)]),
        format!(
            "no volume tmp with a persistentVolumeClaim in the {pod} spec; annotation \
             dynamic-pvc-provisioner.kubernetes.io/tmp.enabled must name a volume of the {pod} \
             whose source is persistentVolumeClaim (claimName: the PVC to create)",
            pod = OwnerKind::Pod.label()
        )
    );
}

#[test]
fn the_created_claim_is_named_labelled_and_owned() {
    let volumes = [claim_volume("cache", "cache-agent-1")];
    let annotations = annotations(&[("cache.enabled", "true"), ("cache.pvc", PVC_YAML)]);
    for kind in [OwnerKind::Pod, OwnerKind::Job] {
        let steps = plan(&claimant(kind, &annotations, &volumes), ID, |_| false);
        let [(volume, Step::Create(claim))] = steps.as_slice() else {
            panic!("{steps:?}");
        };
        assert_eq!(volume, "cache");
        let meta = &claim.metadata;
        assert_eq!(
            meta.name.as_deref(),
            Some("cache-agent-1"),
            "the annotation's name ignored"
        );
        assert_eq!(meta.namespace.as_deref(), Some("builds"));
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(labels[LABEL_CLAIMED_BY], "agent-1");
        assert_eq!(labels[LABEL_CLAIMED_BY_KIND], kind.label());
        assert_eq!(labels[crate::wellknown::LABEL_PVC_MANAGED_BY], ID);
        assert_eq!(labels["team"], "build", "the annotation's own labels kept");
        let owner = &meta.owner_references.clone().unwrap_or_default()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            (
                if kind == OwnerKind::Pod { "Pod" } else { "Job" },
                "agent-1",
                "uid-1"
            )
        );
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
        assert_eq!(
            claim
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref()),
            Some("cache")
        );
        // What the cleanup reads back from it.
        assert_eq!(
            claimed_by(claim, ID),
            Some(ClaimedBy {
                kind,
                namespace: "builds".to_owned(),
                name: "agent-1".to_owned(),
                uid: Some("uid-1".to_owned()),
            })
        );
    }
}

#[test]
fn several_volumes_each_get_their_own_step() {
    let volumes = [claim_volume("a", "claim-a"), claim_volume("b", "claim-b")];
    let annotations = annotations(&[
        ("a.enabled", "true"),
        ("a.pvc", PVC_YAML),
        ("b.enabled", "true"),
    ]);
    let steps = plan(
        &claimant(OwnerKind::Pod, &annotations, &volumes),
        ID,
        |_| false,
    );
    let got: Vec<(&str, &str)> = steps.iter().map(|(v, s)| (v.as_str(), reason(s))).collect();
    assert_eq!(got, [("a", "create"), ("b", REASON_MISSING_PVC)]);
}

#[test]
fn only_our_annotations_count() {
    assert!(is_annotated(Some(&annotations(&[("x.enabled", "true")]))));
    let other: BTreeMap<String, String> = [("example.com/x".to_owned(), "y".to_owned())].into();
    assert!(!is_annotated(Some(&other)));
    assert!(!is_annotated(None));
}

fn managed(labels: &[(&str, &str)], owner_uid: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("cache-agent-1".to_owned()),
            namespace: Some("builds".to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            owner_references: owner_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Pod".to_owned(),
                    name: "agent-1".to_owned(),
                    uid: uid.to_owned(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..ObjectMeta::default()
        }
        .into(),
        ..PersistentVolumeClaim::default()
    }
}

#[test]
fn cleanup_touches_only_our_claims_and_checks_the_live_object() {
    let ours = [
        (crate::wellknown::LABEL_PVC_MANAGED_BY, ID),
        (LABEL_CLAIMED_BY, "agent-1"),
    ];
    let by = claimed_by(&managed(&ours, Some("uid-1")), ID).expect("ours");
    assert_eq!(by.kind, OwnerKind::Pod, "no kind label: a pod's");
    assert!(claimant_gone(&by, None), "not found");
    assert!(!claimant_gone(&by, Some("uid-1")), "still there");
    assert!(
        claimant_gone(&by, Some("uid-2")),
        "a new object of the same name"
    );
    let without_owner = claimed_by(&managed(&ours, None), ID).expect("ours");
    assert!(
        !claimant_gone(&without_owner, Some("any")),
        "no uid to compare: exists"
    );

    for (what, labels) in [
        ("no managed-by", vec![(LABEL_CLAIMED_BY, "agent-1")]),
        (
            "another controller's",
            vec![
                (crate::wellknown::LABEL_PVC_MANAGED_BY, "other"),
                (LABEL_CLAIMED_BY, "agent-1"),
            ],
        ),
        (
            "no claimed-by",
            vec![(crate::wellknown::LABEL_PVC_MANAGED_BY, ID)],
        ),
        (
            "unknown kind",
            vec![
                (crate::wellknown::LABEL_PVC_MANAGED_BY, ID),
                (LABEL_CLAIMED_BY, "agent-1"),
                (LABEL_CLAIMED_BY_KIND, "cronjob"),
            ],
        ),
    ] {
        assert_eq!(
            claimed_by(&managed(&labels, Some("uid-1")), ID),
            None,
            "{what}"
        );
    }
}

#[test]
fn a_failed_create_is_classified_by_its_status() {
    let cases = [
        (Some(409), CreateFailure::AlreadyThere),
        (Some(400), CreateFailure::Refused),
        (Some(403), CreateFailure::Refused),
        (Some(404), CreateFailure::Refused),
        (Some(422), CreateFailure::Refused),
        (Some(429), CreateFailure::Retry),
        (Some(500), CreateFailure::Retry),
        (Some(503), CreateFailure::Retry),
        (None, CreateFailure::Retry),
    ];
    for (status, want) in cases {
        assert_eq!(create_failure(status), want, "{status:?}");
    }
}

#[test]
fn claims_are_created_only_for_the_claimant_a_live_read_still_finds() {
    let live = |uid: &str, deleting: bool| LiveClaimant {
        uid: uid.to_owned(),
        deleting,
    };
    let cases: &[(&str, &str, Option<LiveClaimant>, bool)] = &[
        ("the same pod", "uid-1", Some(live("uid-1", false)), true),
        // The cache lags behind the deletion: no claim for a gone pod.
        ("deleted since the cache saw it", "uid-1", None, false),
        ("being deleted", "uid-1", Some(live("uid-1", true)), false),
        (
            "a new pod of the same name",
            "uid-1",
            Some(live("uid-2", false)),
            false,
        ),
        ("no uid cached", "", Some(live("", false)), false),
    ];
    for (what, cached, live, want) in cases {
        assert_eq!(claimant_current(cached, live.as_ref()), *want, "{what}");
    }
}
