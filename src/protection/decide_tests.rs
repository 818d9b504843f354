use crate::projection::Shared;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource;

use crate::projection::{
    CSIPersistentVolumeSource, EphemeralVolumeSource, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, PodSpec, PodStatus, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

use super::*;
use crate::projection::Meta;
// Which claims are ours is decided in crate::provision; its cases stay here
// with the fixtures they share with the protection verdicts.
use crate::projection::{PersistentVolume, StorageClass};
use crate::provision::{ProvisionerConfig, is_our_claim};

const DRIVER: &str = "hostpath.csi.k8s.io";
const POD_UID: &str = "pod-uid-1";

fn config() -> ProvisionerConfig {
    ProvisionerConfig::with_defaults(DRIVER)
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

fn claim(name: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        }
        .into(),
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some("fast".into()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

fn with_finalizer(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
    claim.metadata.finalizers = Some(vec![wk::FINALIZER_PVC_PROTECTION.into()]);
    claim
}

fn deleting(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
    claim.metadata.deletion_timestamp = Some(now());
    claim
}

fn owned_by_pod(
    mut claim: PersistentVolumeClaim,
    uid: &str,
    controller: Option<bool>,
) -> PersistentVolumeClaim {
    claim.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: "web".to_owned(),
        uid: uid.to_owned(),
        controller,
        block_owner_deletion: Some(true),
    }]);
    claim
}

fn class(name: &str, provisioner: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: provisioner.to_owned(),
        ..StorageClass::default()
    }
}

fn csi_volume(name: &str, driver: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        }
        .into(),
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: "h".to_owned(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

fn claim_volume(volume: &str, claim: &str) -> Volume {
    Volume {
        name: volume.to_owned(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_owned(),
            read_only: None,
        }),
        ..Volume::default()
    }
}

fn ephemeral_volume(volume: &str) -> Volume {
    Volume {
        name: volume.to_owned(),
        ephemeral: Some(EphemeralVolumeSource),
        ..Volume::default()
    }
}

/// As the pod cache holds a hostPath volume: its name only.
fn host_path_volume(volume: &str) -> Volume {
    serde_json::from_value(serde_json::json!({"name": volume, "hostPath": {"path": "/tmp"}}))
        .expect("volume")
}

/// Pod `web` in `ns`, scheduled on `node-1`, Running.
fn pod(volumes: Vec<Volume>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some(POD_UID.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-1".to_owned()),
            volumes: Some(volumes),
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
        }),
    }
}

fn in_phase(mut pod: Pod, phase: &str) -> Pod {
    pod.status = Some(PodStatus {
        phase: Some(phase.to_owned()),
    });
    pod
}

fn unscheduled(mut pod: Pod, node: Option<&str>) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = node.map(str::to_owned);
    }
    pod
}

fn pod_deleting(mut pod: Pod, grace: Option<i64>) -> Pod {
    pod.metadata.deletion_timestamp = Some(now());
    pod.metadata.deletion_grace_period_seconds = grace;
    pod
}

/// (what, claim, its class, its PV, ours?)
type OwnershipCase = (
    &'static str,
    PersistentVolumeClaim,
    Option<StorageClass>,
    Option<PersistentVolume>,
    bool,
);

#[test]
fn ownership() {
    let cfg = config();
    let ours = class("fast", DRIVER);
    let theirs = class("fast", "other.csi.example.com");
    let bound = {
        let mut c = claim("data");
        if let Some(spec) = c.spec.as_mut() {
            spec.volume_name = Some("pv-1".to_owned());
            spec.storage_class_name = Some("gone".into());
        }
        c
    };
    let beta_class = {
        let mut c = claim("data");
        c.metadata.annotations = Some(
            BTreeMap::from([(wk::ANN_BETA_STORAGE_CLASS.to_owned(), "fast".to_owned())]).into(),
        );
        if let Some(spec) = c.spec.as_mut() {
            spec.storage_class_name = None;
        }
        c
    };
    let no_class = {
        let mut c = claim("data");
        if let Some(spec) = c.spec.as_mut() {
            spec.storage_class_name = Some(Shared::default());
        }
        c
    };
    let no_spec = PersistentVolumeClaim {
        spec: None,
        ..claim("data")
    };
    let mut provisioned_by_other = csi_volume("pv-1", DRIVER);
    provisioned_by_other.metadata.annotations = Some(
        BTreeMap::from([(
            wk::ANN_PROVISIONED_BY.to_owned(),
            "other.csi.example.com".to_owned(),
        )])
        .into(),
    );
    let not_csi = PersistentVolume {
        spec: Some(PersistentVolumeSpec::default()),
        ..csi_volume("pv-1", DRIVER)
    };
    let annotated = |provisioner: &str, beta: bool| {
        let mut c = claim("data");
        let key = if beta {
            wk::ANN_BETA_STORAGE_PROVISIONER
        } else {
            wk::ANN_STORAGE_PROVISIONER
        };
        c.metadata.annotations =
            Some(BTreeMap::from([(key.to_owned(), provisioner.to_owned())]).into());
        c
    };
    let cases: Vec<OwnershipCase> = vec![
        (
            "annotated for us, class gone",
            annotated(DRIVER, false),
            None,
            None,
            true,
        ),
        (
            "beta-annotated for us, class gone",
            annotated(DRIVER, true),
            None,
            None,
            true,
        ),
        (
            "annotated for another driver, class gone",
            annotated("other.csi.example.com", false),
            None,
            None,
            false,
        ),
        (
            "annotated for another driver, our class",
            annotated("other.csi.example.com", false),
            Some(ours.clone()),
            None,
            true,
        ),
        (
            "class names our driver",
            claim("data"),
            Some(ours.clone()),
            None,
            true,
        ),
        (
            "class names another driver",
            claim("data"),
            Some(theirs.clone()),
            None,
            false,
        ),
        ("class missing, unbound", claim("data"), None, None, false),
        (
            "class object of another name",
            claim("data"),
            Some(class("slow", DRIVER)),
            None,
            false,
        ),
        (
            "beta class annotation",
            beta_class,
            Some(ours.clone()),
            None,
            true,
        ),
        (
            "empty class name",
            no_class,
            Some(class("", DRIVER)),
            None,
            false,
        ),
        ("no spec", no_spec, Some(ours.clone()), None, false),
        (
            "bound to our CSI PV, class gone",
            bound.clone(),
            None,
            Some(csi_volume("pv-1", DRIVER)),
            true,
        ),
        (
            "bound to another driver's PV",
            bound.clone(),
            None,
            Some(csi_volume("pv-1", "other.csi.example.com")),
            false,
        ),
        (
            "bound to a PV provisioned by another",
            bound.clone(),
            None,
            Some(provisioned_by_other),
            false,
        ),
        (
            "bound to a non-CSI PV",
            bound.clone(),
            None,
            Some(not_csi),
            false,
        ),
        (
            "PV object of another name",
            bound.clone(),
            None,
            Some(csi_volume("pv-2", DRIVER)),
            false,
        ),
        ("bound, PV not in cache", bound, None, None, false),
        (
            "PV given but claim unbound",
            claim("data"),
            None,
            Some(csi_volume("pv-1", DRIVER)),
            false,
        ),
        (
            "other class, our PV",
            {
                let mut c = claim("data");
                if let Some(spec) = c.spec.as_mut() {
                    spec.volume_name = Some("pv-1".to_owned());
                }
                c
            },
            Some(theirs),
            Some(csi_volume("pv-1", DRIVER)),
            true,
        ),
    ];
    for (what, claim, class, volume, want) in cases {
        assert_eq!(
            is_our_claim(&claim, class.as_ref(), volume.as_ref(), &cfg),
            want,
            "{what}"
        );
    }
}

#[test]
fn finalizer_verdicts() {
    let user = pod(vec![claim_volume("data", "data")]);
    let other = pod(vec![claim_volume("data", "other")]);
    let cases: Vec<(&str, PersistentVolumeClaim, bool, Vec<&Pod>, Verdict)> = vec![
        ("not ours", claim("data"), false, vec![], Verdict::NotOurs),
        (
            "not ours, deleting",
            deleting(with_finalizer(claim("data"))),
            false,
            vec![],
            Verdict::NotOurs,
        ),
        (
            "new claim",
            claim("data"),
            true,
            vec![],
            Verdict::AddFinalizer,
        ),
        (
            "new claim in use",
            claim("data"),
            true,
            vec![&user],
            Verdict::AddFinalizer,
        ),
        (
            "protected",
            with_finalizer(claim("data")),
            true,
            vec![&user],
            Verdict::Protected,
        ),
        (
            "deleting, finalizer gone",
            deleting(claim("data")),
            true,
            vec![&user],
            Verdict::Released,
        ),
        (
            "deleting, in use",
            deleting(with_finalizer(claim("data"))),
            true,
            vec![&user, &other],
            Verdict::InUse {
                pods: vec!["web".to_owned()],
            },
        ),
        (
            "deleting, unused",
            deleting(with_finalizer(claim("data"))),
            true,
            vec![&other],
            Verdict::ConfirmUnused,
        ),
        (
            "deleting, no pods",
            deleting(with_finalizer(claim("data"))),
            true,
            vec![],
            Verdict::ConfirmUnused,
        ),
        (
            "other finalizers kept in mind",
            {
                let mut c = deleting(with_finalizer(claim("data")));
                c.metadata.finalizers =
                    Some(vec!["x/y".into(), wk::FINALIZER_PVC_PROTECTION.into()]);
                c
            },
            true,
            vec![],
            Verdict::ConfirmUnused,
        ),
        (
            "only other finalizers",
            {
                let mut c = claim("data");
                c.metadata.finalizers = Some(vec!["x/y".into()]);
                c
            },
            true,
            vec![],
            Verdict::AddFinalizer,
        ),
        (
            "no namespace",
            PersistentVolumeClaim {
                metadata: Meta {
                    namespace: None,
                    ..claim("data").metadata
                },
                ..claim("data")
            },
            true,
            vec![],
            Verdict::Malformed,
        ),
        (
            "empty namespace",
            PersistentVolumeClaim {
                metadata: Meta {
                    namespace: Some("".into()),
                    ..claim("data").metadata
                },
                ..claim("data")
            },
            true,
            vec![],
            Verdict::Malformed,
        ),
        (
            "no name",
            PersistentVolumeClaim {
                metadata: Meta {
                    name: None,
                    ..claim("data").metadata
                },
                ..claim("data")
            },
            true,
            vec![],
            Verdict::Malformed,
        ),
        (
            "no uid",
            PersistentVolumeClaim {
                metadata: Meta {
                    uid: None,
                    ..claim("data").metadata
                },
                ..claim("data")
            },
            true,
            vec![],
            Verdict::Malformed,
        ),
    ];
    for (what, claim, ours, pods, want) in cases {
        assert_eq!(decide(&claim, ours, &pods), want, "{what}");
    }
}

#[test]
fn which_pods_use_a_claim() {
    let data = claim("data");
    let generated = owned_by_pod(claim("web-scratch"), POD_UID, Some(true));
    let mut other_ns = pod(vec![claim_volume("data", "data")]);
    other_ns.metadata.namespace = Some("elsewhere".to_owned());
    let mut no_ns = pod(vec![claim_volume("data", "data")]);
    no_ns.metadata.namespace = None;
    let mut nameless = pod(vec![ephemeral_volume("scratch")]);
    nameless.metadata.name = None;
    let mut uidless = pod(vec![ephemeral_volume("scratch")]);
    uidless.metadata.uid = None;
    let no_spec = Pod {
        spec: None,
        ..pod(vec![])
    };
    let no_volumes = Pod {
        spec: Some(PodSpec {
            node_name: Some("node-1".to_owned()),
            volumes: None,
        }),
        ..pod(vec![])
    };
    let named = || pod(vec![host_path_volume("tmp"), claim_volume("v", "data")]);
    let ephemeral = || pod(vec![ephemeral_volume("scratch")]);
    let mut cases: Vec<(String, Pod, PersistentVolumeClaim, bool)> = vec![
        ("named claim".into(), named(), data.clone(), true),
        (
            "another claim".into(),
            pod(vec![claim_volume("v", "other")]),
            data.clone(),
            false,
        ),
        (
            "no claim volumes".into(),
            pod(vec![host_path_volume("tmp")]),
            data.clone(),
            false,
        ),
        (
            "unscheduled".into(),
            unscheduled(named(), None),
            data.clone(),
            false,
        ),
        (
            "empty node name".into(),
            unscheduled(named(), Some("")),
            data.clone(),
            false,
        ),
        ("other namespace".into(), other_ns, data.clone(), false),
        ("pod without namespace".into(), no_ns, data.clone(), false),
        ("pod without spec".into(), no_spec, data.clone(), false),
        (
            "pod without volumes".into(),
            no_volumes,
            data.clone(),
            false,
        ),
        (
            "named claim, pod deleting with grace".into(),
            pod_deleting(named(), Some(30)),
            data.clone(),
            true,
        ),
        // The shut-down exception is for ephemeral volumes only, as upstream.
        (
            "named claim, pod shut down".into(),
            pod_deleting(named(), Some(0)),
            data.clone(),
            true,
        ),
        (
            "ephemeral, owned".into(),
            ephemeral(),
            generated.clone(),
            true,
        ),
        (
            "ephemeral, unscheduled".into(),
            unscheduled(ephemeral(), None),
            generated.clone(),
            false,
        ),
        (
            "ephemeral, deleting with grace".into(),
            pod_deleting(ephemeral(), Some(30)),
            generated.clone(),
            true,
        ),
        (
            "ephemeral, deleting without grace period".into(),
            pod_deleting(ephemeral(), None),
            generated.clone(),
            true,
        ),
        (
            "ephemeral, shut down".into(),
            pod_deleting(ephemeral(), Some(0)),
            generated.clone(),
            false,
        ),
        (
            "ephemeral, claim of another pod uid".into(),
            ephemeral(),
            owned_by_pod(claim("web-scratch"), "old-uid", Some(true)),
            false,
        ),
        (
            "ephemeral, owner not controller".into(),
            ephemeral(),
            owned_by_pod(claim("web-scratch"), POD_UID, Some(false)),
            false,
        ),
        (
            "ephemeral, controller unset".into(),
            ephemeral(),
            owned_by_pod(claim("web-scratch"), POD_UID, None),
            false,
        ),
        (
            "ephemeral, claim without owner".into(),
            ephemeral(),
            claim("web-scratch"),
            false,
        ),
        (
            "ephemeral, other volume name".into(),
            pod(vec![ephemeral_volume("cache")]),
            generated.clone(),
            false,
        ),
        (
            "ephemeral, pod without name".into(),
            nameless,
            generated.clone(),
            false,
        ),
        (
            "ephemeral, pod without uid".into(),
            uidless,
            generated.clone(),
            false,
        ),
        (
            "claim without namespace".into(),
            named(),
            PersistentVolumeClaim {
                metadata: Meta {
                    namespace: None,
                    ..data.metadata.clone()
                },
                ..data.clone()
            },
            false,
        ),
        (
            "claim without name".into(),
            named(),
            PersistentVolumeClaim {
                metadata: Meta {
                    name: None,
                    ..data.metadata.clone()
                },
                ..data.clone()
            },
            false,
        ),
    ];
    // Every phase: a scheduled pod counts until it is deleted (as the
    // controller-manager: the volume may still be mounted).
    for phase in ["Pending", "Running", "Succeeded", "Failed", "Unknown", ""] {
        cases.push((
            format!("named claim, phase {phase:?}"),
            in_phase(named(), phase),
            data.clone(),
            true,
        ));
        cases.push((
            format!("ephemeral, phase {phase:?}"),
            in_phase(ephemeral(), phase),
            generated.clone(),
            true,
        ));
        cases.push((
            format!("unscheduled, phase {phase:?}"),
            unscheduled(in_phase(named(), phase), None),
            data.clone(),
            false,
        ));
    }
    let mut no_status = named();
    no_status.status = None;
    cases.push(("no status".into(), no_status, data.clone(), true));
    for (what, pod, claim, want) in cases {
        assert_eq!(pod_uses_claim(&pod, &claim), want, "{what}");
    }
}

#[test]
fn live_confirmation() {
    let c = deleting(with_finalizer(claim("data")));
    let user = pod(vec![claim_volume("v", "data")]);
    let mut second = pod(vec![claim_volume("v", "data")]);
    second.metadata.name = Some("api".to_owned());
    let done = in_phase(user.clone(), "Succeeded");
    let pending = unscheduled(pod(vec![claim_volume("v", "data")]), None);
    assert_eq!(confirm_unused(&c, &[]), Confirmation::RemoveFinalizer);
    assert_eq!(
        confirm_unused(&c, &[&pending]),
        Confirmation::RemoveFinalizer
    );
    assert_eq!(
        confirm_unused(&c, &[&user, &second, &user]),
        Confirmation::InUse {
            pods: vec!["api".to_owned(), "web".to_owned()]
        },
        "sorted, deduplicated"
    );
    assert_eq!(
        confirm_unused(&c, &[&done]),
        Confirmation::InUse {
            pods: vec!["web".to_owned()]
        },
        "terminated but not deleted"
    );
}

#[test]
fn claims_a_pod_references() {
    let p = pod(vec![
        claim_volume("a", "data"),
        host_path_volume("tmp"),
        ephemeral_volume("scratch"),
        claim_volume("empty", ""),
    ]);
    assert_eq!(
        referenced_claims(&p),
        vec![
            ClaimName::new("ns", "data"),
            ClaimName::new("ns", "web-scratch")
        ]
    );
    let mut no_ns = p.clone();
    no_ns.metadata.namespace = None;
    assert!(referenced_claims(&no_ns).is_empty());
    let mut nameless = pod(vec![ephemeral_volume("scratch")]);
    nameless.metadata.name = None;
    assert!(referenced_claims(&nameless).is_empty());
    assert!(referenced_claims(&Pod { spec: None, ..p }).is_empty());
    // Unscheduled pods are referenced too: their deletion cannot unblock a
    // claim, but their scheduling can block it, and the worker decides.
    assert_eq!(
        referenced_claims(&unscheduled(pod(vec![claim_volume("a", "data")]), None)).len(),
        1
    );
}

#[test]
fn shut_down_pods() {
    let p = pod(vec![]);
    assert!(!pod_is_shut_down(&p));
    assert!(!pod_is_shut_down(&pod_deleting(p.clone(), Some(30))));
    assert!(!pod_is_shut_down(&pod_deleting(p.clone(), None)));
    assert!(pod_is_shut_down(&pod_deleting(p.clone(), Some(0))));
    let mut grace_only = p;
    grace_only.metadata.deletion_grace_period_seconds = Some(0);
    assert!(!pod_is_shut_down(&grace_only), "no deletion timestamp");
}

/// CSI migration: the EBS driver's sidecar protects claims of the in-tree
/// `kubernetes.io/aws-ebs` classes it provisions, whichever annotation form
/// the controller-manager wrote, and claims bound to its in-tree PVs.
#[test]
fn ownership_under_csi_migration() {
    use crate::provision::fixtures::{
        AWS_EBS_PLUGIN, EBS_DRIVER, ebs_config, gp2_class, migrated_volume,
    };
    let ebs = ebs_config();
    let annotated = |pairs: &[(&str, &str)]| {
        let mut c = claim("data");
        if let Some(spec) = c.spec.as_mut() {
            spec.storage_class_name = Some("gone".into());
        }
        c.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        c
    };
    let of_gp2 = || {
        let mut c = claim("data");
        if let Some(spec) = c.spec.as_mut() {
            spec.storage_class_name = Some("gp2".into());
        }
        c
    };
    let bound_in_tree = || {
        let mut c = annotated(&[]);
        if let Some(spec) = c.spec.as_mut() {
            spec.volume_name = Some(crate::provision::fixtures::VOLUME.to_owned());
        }
        c
    };
    let mut other_plugin = migrated_volume();
    if let Some(spec) = other_plugin.spec.as_mut() {
        spec.aws_elastic_block_store = None;
        spec.gce_persistent_disk = Some(Box::new(
            k8s_openapi::api::core::v1::GCEPersistentDiskVolumeSource {
                pd_name: "disk".to_owned(),
                ..Default::default()
            },
        ));
    }
    let cases: Vec<OwnershipCase> = vec![
        (
            "class of the in-tree plugin we took over",
            of_gp2(),
            Some(gp2_class()),
            None,
            true,
        ),
        (
            "annotated with our CSI name (1.36 controller-manager)",
            annotated(&[(wk::ANN_STORAGE_PROVISIONER, EBS_DRIVER)]),
            None,
            None,
            true,
        ),
        (
            "annotated with the in-tree name and migrated-to us (older releases)",
            annotated(&[
                (wk::ANN_STORAGE_PROVISIONER, AWS_EBS_PLUGIN),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
            ]),
            None,
            None,
            true,
        ),
        (
            "annotated with the in-tree name, not migrated",
            annotated(&[(wk::ANN_STORAGE_PROVISIONER, AWS_EBS_PLUGIN)]),
            None,
            None,
            false,
        ),
        (
            "bound to our in-tree PV",
            bound_in_tree(),
            None,
            Some(migrated_volume()),
            true,
        ),
        (
            "bound to an in-tree PV of another plugin",
            bound_in_tree(),
            None,
            Some(other_plugin),
            false,
        ),
    ];
    for (what, claim, class, volume, want) in cases {
        assert_eq!(
            is_our_claim(&claim, class.as_ref(), volume.as_ref(), &ebs),
            want,
            "{what}"
        );
    }
    // The hostpath driver took over no plugin: a gp2 claim is not its own.
    assert!(!is_our_claim(
        &of_gp2(),
        Some(&gp2_class()),
        None,
        &config()
    ));
}
