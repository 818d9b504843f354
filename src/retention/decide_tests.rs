//! Tables for [`super::decide`]. The wanted references of the matrix are
//! written out per row here, not computed, so a mistake in the decision
//! cannot hide behind the same mistake in the test.

use crate::projection::PersistentVolumeClaimSpec;
use crate::projection::Shared;
use crate::projection::StorageClass;
use crate::projection::{PersistentVolumeClaim, Pod};
use crate::projection::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::apps::v1::{
    StatefulSetOrdinals, StatefulSetPersistentVolumeClaimRetentionPolicy,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

use super::decide::*;

const SET: &str = "web";
const SET_UID: &str = "set-uid";
const POD_UID: &str = "pod-uid";
const DRIVER: &str = "hostpath.csi.k8s.io";

use Retention::{Delete as D, Retain as R};

fn policy(when_scaled: Retention, when_deleted: Retention) -> Policy {
    Policy {
        when_scaled,
        when_deleted,
    }
}

fn set_ref() -> OwnerReference {
    controller_ref("apps/v1", "StatefulSet", SET, SET_UID)
}

fn pod_ref() -> OwnerReference {
    controller_ref("v1", "Pod", "web-1", POD_UID)
}

fn non_controller(mut r: OwnerReference) -> OwnerReference {
    r.controller = None;
    r
}

fn user_ref() -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "keep-me".into(),
        uid: "user-uid".into(),
        controller: None,
        block_owner_deletion: None,
    }
}

fn other_controller() -> OwnerReference {
    controller_ref("example.com/v1", "Database", "db", "db-uid")
}

fn facts<'a>(
    policy: Policy,
    condemned: bool,
    pod: PodState<'a>,
    refs: &'a [OwnerReference],
) -> ClaimFacts<'a> {
    ClaimFacts {
        set_name: SET,
        set_uid: SET_UID,
        policy,
        condemned,
        pod_name: "web-1",
        pod,
        owner_references: refs,
        claim_deleting: false,
        labels_match: true,
    }
}

const POD: PodState<'static> = PodState::OfSet { uid: POD_UID };

/// (whenScaled, whenDeleted, condemned, wanted set ref, wanted pod ref),
/// with the pod present, as the controller-manager wants them.
const MATRIX: &[(Retention, Retention, bool, bool, bool)] = &[
    (R, R, false, false, false),
    (R, R, true, false, false),
    (R, D, false, true, false),
    (R, D, true, true, false),
    (D, R, false, false, false),
    (D, R, true, false, true),
    (D, D, false, true, false),
    (D, D, true, false, true),
];

fn wanted_refs(want_set: bool, want_pod: bool) -> Vec<OwnerReference> {
    let mut refs = Vec::new();
    if want_set {
        refs.push(set_ref());
    }
    if want_pod {
        refs.push(pod_ref());
    }
    refs
}

/// Every starting combination of our two references (as controllers).
fn starting_points() -> Vec<Vec<OwnerReference>> {
    vec![
        vec![],
        vec![set_ref()],
        vec![pod_ref()],
        vec![set_ref(), pod_ref()],
    ]
}

#[test]
fn the_matrix_from_every_starting_point() {
    for &(scaled, deleted, condemned, want_set, want_pod) in MATRIX {
        let wanted = wanted_refs(want_set, want_pod);
        for start in starting_points() {
            let p = policy(scaled, deleted);
            let got = decide(&facts(p, condemned, POD, &start));
            let case = format!("{p}, condemned={condemned}, start={start:?}");
            if start == wanted {
                assert_eq!(got, Decision::UpToDate, "{case}");
            } else {
                assert_eq!(got, Decision::SetOwnerReferences(wanted.clone()), "{case}");
            }
        }
    }
}

#[test]
fn applying_a_decision_converges_in_one_write() {
    for &(scaled, deleted, condemned, _, _) in MATRIX {
        for start in starting_points() {
            for extra in [vec![], vec![user_ref()]] {
                let mut refs: Vec<OwnerReference> =
                    extra.iter().cloned().chain(start.clone()).collect();
                let p = policy(scaled, deleted);
                if let Decision::SetOwnerReferences(new) = decide(&facts(p, condemned, POD, &refs))
                {
                    refs = new;
                }
                assert_eq!(
                    decide(&facts(p, condemned, POD, &refs)),
                    Decision::UpToDate,
                    "{p}, condemned={condemned}, start={start:?}, extra={extra:?}"
                );
            }
        }
    }
}

#[test]
fn policy_transitions_in_both_fields_rewrite_existing_claims() {
    // Start from what the old policy wanted; the new policy's wanted list
    // is the result, for every pair of policies (Retain<->Delete in either
    // field, and both at once).
    for &(s0, d0, condemned, set0, pod0) in MATRIX {
        for &(s1, d1, c1, set1, pod1) in MATRIX {
            if c1 != condemned {
                continue;
            }
            let start = wanted_refs(set0, pod0);
            let want = wanted_refs(set1, pod1);
            let got = decide(&facts(policy(s1, d1), condemned, POD, &start));
            let case = format!(
                "{} -> {}, condemned={condemned}",
                policy(s0, d0),
                policy(s1, d1)
            );
            if start == want {
                assert_eq!(got, Decision::UpToDate, "{case}");
            } else {
                assert_eq!(got, Decision::SetOwnerReferences(want), "{case}");
            }
        }
    }
}

#[test]
fn condemned_claim_without_its_pod() {
    // (policy, owner refs, expected)
    let cases: Vec<(Policy, Vec<OwnerReference>, Decision)> = vec![
        (policy(D, R), vec![], Decision::DeleteClaim),
        (policy(D, D), vec![set_ref()], Decision::DeleteClaim),
        (policy(D, D), vec![user_ref()], Decision::DeleteClaim),
        // whenScaled=Retain never deletes.
        (policy(R, R), vec![], Decision::UpToDate),
        (
            policy(R, D),
            vec![],
            Decision::SetOwnerReferences(vec![set_ref()]),
        ),
        (policy(R, D), vec![set_ref()], Decision::UpToDate),
        // Its pod reference dangles: the garbage collector's turn.
        (
            policy(D, R),
            vec![pod_ref()],
            Decision::Leave(LeaveReason::DanglingPodReference),
        ),
        // Another controller: never delete someone else's claim.
        (policy(D, R), vec![other_controller()], Decision::UpToDate),
        (
            policy(D, D),
            vec![other_controller(), set_ref()],
            Decision::SetOwnerReferences(vec![other_controller()]),
        ),
    ];
    for (p, refs, want) in cases {
        assert_eq!(
            decide(&facts(p, true, PodState::Missing, &refs)),
            want,
            "{p}, refs={refs:?}"
        );
    }
}

#[test]
fn claim_in_range_without_its_pod_is_never_deleted() {
    // A pod deleted by hand (not a scale-down) leaves its claim alone.
    for &(scaled, deleted, condemned, want_set, _) in MATRIX {
        if condemned {
            continue;
        }
        let start = wanted_refs(want_set, false);
        assert_eq!(
            decide(&facts(
                policy(scaled, deleted),
                false,
                PodState::Missing,
                &start
            )),
            Decision::UpToDate,
            "{}",
            policy(scaled, deleted)
        );
    }
}

#[test]
fn user_references_are_kept_in_place() {
    let refs = vec![user_ref(), pod_ref()];
    assert_eq!(
        decide(&facts(policy(D, D), false, POD, &refs)),
        Decision::SetOwnerReferences(vec![user_ref(), set_ref()])
    );
    let refs = vec![user_ref(), set_ref()];
    assert_eq!(
        decide(&facts(policy(R, R), false, POD, &refs)),
        Decision::SetOwnerReferences(vec![user_ref()])
    );
    // A user's reference is never ours to remove, even under Retain/Retain.
    let refs = vec![user_ref()];
    assert_eq!(
        decide(&facts(policy(R, R), true, POD, &refs)),
        Decision::UpToDate
    );
}

#[test]
fn references_without_controller_true_are_rewritten() {
    let cases = [
        (
            policy(R, D),
            false,
            vec![non_controller(set_ref())],
            vec![set_ref()],
        ),
        (
            policy(D, R),
            true,
            vec![non_controller(pod_ref())],
            vec![pod_ref()],
        ),
        (
            policy(D, D),
            false,
            vec![user_ref(), non_controller(set_ref())],
            vec![user_ref(), set_ref()],
        ),
        // controller: false counts as "without".
        (
            policy(R, D),
            false,
            vec![OwnerReference {
                controller: Some(false),
                ..set_ref()
            }],
            vec![set_ref()],
        ),
        // Under Retain/Retain it is simply removed.
        (policy(R, R), false, vec![non_controller(set_ref())], vec![]),
    ];
    for (p, condemned, start, want) in cases {
        assert_eq!(
            decide(&facts(p, condemned, POD, &start)),
            Decision::SetOwnerReferences(want),
            "{p}, {start:?}"
        );
    }
    // blockOwnerDeletion is not checked, as by the controller-manager: a
    // controller reference without it is up to date (no write war).
    let start = vec![OwnerReference {
        block_owner_deletion: None,
        ..set_ref()
    }];
    assert_eq!(
        decide(&facts(policy(R, D), false, POD, &start)),
        Decision::UpToDate
    );
}

#[test]
fn stale_references_leave_the_claim_alone() {
    let stale_set = OwnerReference {
        uid: "old-set".into(),
        ..set_ref()
    };
    let stale_pod = OwnerReference {
        uid: "old-pod".into(),
        ..pod_ref()
    };
    for p in [policy(R, R), policy(R, D), policy(D, R), policy(D, D)] {
        for condemned in [false, true] {
            for pod in [POD, PodState::Missing] {
                let refs = vec![stale_set.clone()];
                assert_eq!(
                    decide(&facts(p, condemned, pod, &refs)),
                    Decision::Leave(LeaveReason::StaleSetReference),
                    "{p}"
                );
                let refs = vec![set_ref(), stale_set.clone()];
                assert_eq!(
                    decide(&facts(p, condemned, pod, &refs)),
                    Decision::Leave(LeaveReason::StaleSetReference),
                    "{p}: any stale reference counts"
                );
            }
            let refs = vec![stale_pod.clone()];
            assert_eq!(
                decide(&facts(p, condemned, POD, &refs)),
                Decision::Leave(LeaveReason::StalePodReference),
                "{p}"
            );
        }
    }
    // Same name but another kind or group is not a reference to the set.
    let lookalike = OwnerReference {
        api_version: "example.com/v1".into(),
        uid: "x".into(),
        controller: None,
        ..set_ref()
    };
    let refs = vec![lookalike.clone()];
    assert_eq!(
        decide(&facts(policy(R, D), false, POD, &refs)),
        Decision::SetOwnerReferences(vec![lookalike, set_ref()])
    );
}

#[test]
fn another_controller_keeps_the_claim() {
    let cases = [
        // Nothing of ours: up to date, nothing added.
        (
            policy(R, D),
            false,
            vec![other_controller()],
            Decision::UpToDate,
        ),
        (
            policy(D, D),
            true,
            vec![other_controller()],
            Decision::UpToDate,
        ),
        // Ours are removed, theirs and the user's kept.
        (
            policy(R, D),
            false,
            vec![set_ref(), other_controller(), user_ref()],
            Decision::SetOwnerReferences(vec![other_controller(), user_ref()]),
        ),
        (
            policy(D, R),
            true,
            vec![pod_ref(), other_controller()],
            Decision::SetOwnerReferences(vec![other_controller()]),
        ),
        // Retain/Retain: ours go as always, theirs stay.
        (
            policy(R, R),
            false,
            vec![other_controller(), set_ref()],
            Decision::SetOwnerReferences(vec![other_controller()]),
        ),
        (
            policy(R, R),
            false,
            vec![other_controller()],
            Decision::UpToDate,
        ),
        // A non-controller reference of someone else is not a controller.
        (
            policy(R, D),
            false,
            vec![non_controller(other_controller())],
            Decision::SetOwnerReferences(vec![non_controller(other_controller()), set_ref()]),
        ),
    ];
    for (p, condemned, start, want) in cases {
        assert_eq!(
            decide(&facts(p, condemned, POD, &start)),
            want,
            "{p}, {start:?}"
        );
    }
}

#[test]
fn claims_being_deleted_and_pods_of_others_are_left_alone() {
    let refs = vec![];
    let mut f = facts(policy(D, D), true, PodState::Missing, &refs);
    f.claim_deleting = true;
    assert_eq!(decide(&f), Decision::Leave(LeaveReason::ClaimDeleting));
    assert_eq!(
        decide(&facts(policy(D, D), true, PodState::NotOfSet, &refs)),
        Decision::Leave(LeaveReason::PodNotOfSet)
    );
}

// ---- ordinals ---------------------------------------------------------------------

fn stateful_set(replicas: Option<i32>, start: Option<i32>) -> StatefulSet {
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(SET.into()),
            namespace: Some("ns".into()),
            uid: Some(SET_UID.into()),
            ..Default::default()
        },
        spec: StatefulSetSpec {
            replicas,
            ordinals: start.map(|s| StatefulSetOrdinals { start: Some(s) }),
            ..Default::default()
        },
    }
}

#[test]
fn ordinal_ranges() {
    // (replicas, start, ordinal, condemned)
    let cases = [
        (None, None, 0, false),
        (None, None, 1, true),
        (Some(0), None, 0, true),
        (Some(1), None, 0, false),
        (Some(1), None, 1, true),
        (Some(3), None, 2, false),
        (Some(3), None, 3, true),
        (Some(3), None, 10, true),
        (Some(2), Some(5), 4, true),
        (Some(2), Some(5), 5, false),
        (Some(2), Some(5), 6, false),
        (Some(2), Some(5), 7, true),
        (Some(0), Some(5), 5, true),
        (Some(2), Some(5), 0, true),
        (Some(i32::MAX), Some(i32::MAX), i32::MAX, false),
    ];
    for (replicas, start, ordinal, condemned) in cases {
        let o = Ordinals::of(&stateful_set(replicas, start));
        assert_eq!(
            o.condemned(ordinal),
            condemned,
            "replicas={replicas:?} start={start:?} ordinal={ordinal}"
        );
    }
    // `ordinals: {}` means start 0.
    let mut set = stateful_set(Some(1), None);
    set.spec.ordinals = Some(StatefulSetOrdinals { start: None });
    assert_eq!(
        Ordinals::of(&set),
        Ordinals {
            start: 0,
            replicas: 1
        }
    );
    let bare = StatefulSet::default();
    assert_eq!(
        Ordinals::of(&bare),
        Ordinals {
            start: 0,
            replicas: 1
        }
    );
}

#[test]
fn policies_parse_like_the_controller_manager() {
    let with = |scaled: Option<&str>, deleted: Option<&str>| {
        let mut set = stateful_set(Some(1), None);
        set.spec.persistent_volume_claim_retention_policy =
            Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_scaled: scaled.map(str::to_owned),
                when_deleted: deleted.map(str::to_owned),
            });
        Policy::of(&set)
    };
    assert_eq!(Policy::of(&stateful_set(None, None)), Policy::RETAIN);
    assert_eq!(with(Some("Delete"), Some("Retain")), policy(D, R));
    assert_eq!(with(Some("Retain"), Some("Delete")), policy(R, D));
    assert_eq!(with(Some("Delete"), Some("Delete")), policy(D, D));
    assert_eq!(with(None, Some("Delete")), policy(R, D));
    // Unknown spelling anywhere: everything retained, nothing deleted.
    assert_eq!(with(Some("Delete"), Some("delete")), Policy::RETAIN);
    assert_eq!(with(Some("Bogus"), Some("Delete")), Policy::RETAIN);
    assert_eq!(
        policy(D, R).to_string(),
        "whenScaled=Delete, whenDeleted=Retain"
    );
}

// ---- names ---------------------------------------------------------------------------

#[test]
fn claim_names_that_merely_look_similar() {
    // (claim, set, templates, ordinal)
    let cases: &[(&str, &str, &[&str], Option<i32>)] = &[
        ("data-web-0", "web", &["data"], Some(0)),
        ("data-web-12", "web", &["data"], Some(12)),
        ("data-web-1x", "web", &["data"], None),
        ("data-web-x-0", "web", &["data"], None),
        ("data-web-x-0", "web-x", &["data"], Some(0)),
        ("data-web-01", "web", &["data"], None),
        ("data-web--1", "web", &["data"], None),
        ("data-web-+1", "web", &["data"], None),
        ("data-web-", "web", &["data"], None),
        ("data-web", "web", &["data"], None),
        ("data-web-2147483648", "web", &["data"], None),
        ("data-web-2147483647", "web", &["data"], Some(i32::MAX)),
        ("datax-web-0", "web", &["data"], None),
        ("logs-web-3", "web", &["data", "logs"], Some(3)),
        ("logs-web-3", "web", &["data"], None),
        ("data-web-web-0", "web", &["data", "data-web"], Some(0)),
        // The name alone is ambiguous: set `x` with template `data-web`
        // makes the same name as set `web-x` with template `data`; each
        // set decides alone and owner references by uid sort it out.
        ("data-web-x-0", "x", &["data-web"], Some(0)),
        ("web-0", "web", &["data"], None),
    ];
    for &(claim, set, templates, want) in cases {
        assert_eq!(
            claim_ordinal(claim, set, templates.iter().copied()),
            want,
            "{claim} of set {set} with {templates:?}"
        );
    }
}

#[test]
fn pod_names_map_to_their_set() {
    assert_eq!(pod_set_name("web-0"), Some("web"));
    assert_eq!(pod_set_name("web-x-10"), Some("web-x"));
    assert_eq!(pod_set_name("web-1x"), None);
    assert_eq!(pod_set_name("web-01"), None);
    assert_eq!(pod_set_name("web"), None);
    assert_eq!(pod_name("web", 3), "web-3");
}

// ---- drivers and classes -----------------------------------------------------------------

fn class(name: &str, provisioner: &str, default: Option<(&str, i64)>) -> StorageClass {
    let mut c = StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        ..Default::default()
    };
    if let Some((annotation, created)) = default {
        c.metadata.annotations = Some([(annotation.to_owned(), "true".to_owned())].into());
        c.metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(created).expect("timestamp")));
    }
    c
}

fn claim_with_class(name: &str, class: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
        .into(),
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: class.map(Shared::from),
            ..Default::default()
        }),
        status: None,
    }
}

#[test]
fn claims_resolve_to_their_driver() {
    let ours = class("fast", DRIVER, None);
    let theirs = class("other", "other.csi.example.com", None);
    let ours_default = class(
        "std",
        DRIVER,
        Some(("storageclass.kubernetes.io/is-default-class", 100)),
    );
    let theirs_newer_default = class(
        "gp",
        "other.csi.example.com",
        Some(("storageclass.beta.kubernetes.io/is-default-class", 200)),
    );
    let no_default = [&ours, &theirs];
    let our_default = [&ours, &theirs, &ours_default];
    let their_default = [&ours, &theirs, &ours_default, &theirs_newer_default];
    let mut beta = claim_with_class("a", Some("other"));
    beta.metadata.annotations = Some(
        [(
            "volume.beta.kubernetes.io/storage-class".to_owned(),
            "fast".to_owned(),
        )]
        .into(),
    );
    // (claim, classes, ours)
    let cases: Vec<(PersistentVolumeClaim, &[&StorageClass], bool)> = vec![
        (claim_with_class("a", Some("fast")), &no_default, true),
        (claim_with_class("a", Some("other")), &no_default, false),
        (claim_with_class("a", Some("missing")), &no_default, false),
        (claim_with_class("a", Some("")), &our_default, false),
        (claim_with_class("a", None), &no_default, false),
        (claim_with_class("a", None), &our_default, true),
        (claim_with_class("a", None), &their_default, false),
        (beta, &no_default, true),
    ];
    for (claim, classes, want) in cases {
        assert_eq!(
            claim_is_for_driver(&claim, classes, DRIVER),
            want,
            "{:?} {:?}",
            claim.metadata.annotations,
            claim.spec.as_ref().map(|s| &s.storage_class_name)
        );
    }
    assert_eq!(
        default_class(their_default.iter().copied()).and_then(|c| c.metadata.name.as_deref()),
        Some("gp"),
        "newest default wins"
    );
}

/// CSI migration: the EBS driver's sidecar owns claims of EKS's in-tree
/// `gp2` class; the hostpath driver's does not.
#[test]
fn claims_of_a_migrated_in_tree_class_resolve_to_its_csi_driver() {
    let gp2 = class("gp2", "kubernetes.io/aws-ebs", None);
    let pd = class("standard", "kubernetes.io/gce-pd", None);
    let classes = [&gp2, &pd];
    let of_gp2 = claim_with_class("a", Some("gp2"));
    let of_pd = claim_with_class("a", Some("standard"));
    assert!(claim_is_for_driver(&of_gp2, &classes, "ebs.csi.aws.com"));
    assert!(!claim_is_for_driver(&of_pd, &classes, "ebs.csi.aws.com"));
    assert!(claim_is_for_driver(
        &of_pd,
        &classes,
        "pd.csi.storage.gke.io"
    ));
    assert!(!claim_is_for_driver(&of_gp2, &classes, DRIVER));
}

// ---- whole sets -------------------------------------------------------------------------------

fn full_set(
    policy_spec: (&str, &str),
    replicas: i32,
    templates: &[(&str, Option<&str>)],
) -> StatefulSet {
    let mut set = stateful_set(Some(replicas), None);
    set.spec.persistent_volume_claim_retention_policy =
        Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
            when_scaled: Some(policy_spec.0.into()),
            when_deleted: Some(policy_spec.1.into()),
        });
    set.spec.volume_claim_templates = Some(
        templates
            .iter()
            .map(|(name, class)| claim_with_class(name, *class))
            .collect(),
    );
    set
}

fn pod_of(name: &str, uid: &str, controller_uid: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            owner_references: controller_uid
                .map(|u| vec![controller_ref("apps/v1", "StatefulSet", SET, u)]),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn pods_count_only_when_the_set_controls_them() {
    let ours = pod_of("web-0", "p0", Some(SET_UID));
    let adopted_by_other = pod_of("web-0", "p0", Some("other-set"));
    let orphan = pod_of("web-0", "p0", None);
    let mut non_controller = pod_of("web-0", "p0", Some(SET_UID));
    if let Some(r) = non_controller.metadata.owner_references.as_mut() {
        r[0].controller = None;
    }
    assert_eq!(PodState::of(None, SET_UID), PodState::Missing);
    assert_eq!(
        PodState::of(Some(&ours), SET_UID),
        PodState::OfSet { uid: "p0" }
    );
    assert_eq!(
        PodState::of(Some(&adopted_by_other), SET_UID),
        PodState::NotOfSet
    );
    assert_eq!(PodState::of(Some(&orphan), SET_UID), PodState::NotOfSet);
    assert_eq!(
        PodState::of(Some(&non_controller), SET_UID),
        PodState::NotOfSet
    );
}

#[test]
fn plan_a_set() {
    let fast = class("fast", DRIVER, None);
    let other = class("other", "other.csi.example.com", None);
    let classes = [&fast, &other];
    // Two templates, one of another driver; scaled from 3 to 1.
    let set = full_set(
        ("Delete", "Delete"),
        1,
        &[("data", Some("fast")), ("logs", Some("other"))],
    );
    let claims = [
        claim_with_class("data-web-0", Some("fast")),
        claim_with_class("data-web-1", Some("fast")),
        claim_with_class("data-web-2", Some("fast")),
        claim_with_class("logs-web-1", Some("other")),
        // Same name pattern, but its class is another driver's.
        claim_with_class("data-web-3", Some("other")),
        // Look-alikes.
        claim_with_class("data-web-1x", Some("fast")),
        claim_with_class("data-web-x-0", Some("fast")),
        claim_with_class("unrelated", Some("fast")),
    ];
    let mut elsewhere = claim_with_class("data-web-4", Some("fast"));
    elsewhere.metadata.namespace = Some("other-ns".into());
    let pods = [
        pod_of("web-0", "p0", Some(SET_UID)),
        pod_of("web-1", "p1", Some(SET_UID)),
    ];
    let mut refs: Vec<&PersistentVolumeClaim> = claims.iter().collect();
    refs.push(&elsewhere);
    let plans = plan_set(
        &set,
        &refs,
        |name| {
            pods.iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
        },
        &classes,
        DRIVER,
    )
    .expect("planned");
    let summary: Vec<(&str, bool, Decision)> = plans
        .iter()
        .map(|p| (p.claim.as_str(), p.condemned, p.decision.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "data-web-0",
                false,
                Decision::SetOwnerReferences(vec![set_ref()])
            ),
            (
                "data-web-1",
                true,
                Decision::SetOwnerReferences(vec![controller_ref("v1", "Pod", "web-1", "p1")])
            ),
            ("data-web-2", true, Decision::DeleteClaim),
        ]
    );
}

#[test]
fn sets_left_alone() {
    let fast = class("fast", DRIVER, None);
    let other = class("other", "other.csi.example.com", None);
    let classes = [&fast, &other];
    let no_pods = |_: &str| -> Option<&Pod> { None };

    let mut orphaning = full_set(("Delete", "Delete"), 1, &[("data", Some("fast"))]);
    orphaning.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    orphaning.metadata.finalizers = Some(vec!["orphan".into()]);
    let mut foreground = orphaning.clone();
    foreground.metadata.finalizers = Some(vec!["foregroundDeletion".into()]);
    let theirs = full_set(("Delete", "Delete"), 1, &[("data", Some("other"))]);
    let no_templates = full_set(("Delete", "Delete"), 1, &[]);

    let claim = claim_with_class("data-web-5", Some("fast"));
    let claims = [&claim];
    for (set, want) in [
        (&orphaning, SetSkip::OrphanDeletion),
        (&foreground, SetSkip::Deleting),
        (&theirs, SetSkip::NoTemplateForDriver),
        (&no_templates, SetSkip::NoTemplateForDriver),
    ] {
        assert_eq!(plan_set(set, &claims, no_pods, &classes, DRIVER), Err(want));
    }
    // Retain/Retain with a plain claim: nothing to do.
    let retain = full_set(("Retain", "Retain"), 1, &[("data", Some("fast"))]);
    let plans = plan_set(&retain, &claims, no_pods, &classes, DRIVER).expect("planned");
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].decision, Decision::UpToDate);
}

#[test]
fn patches_touch_only_owner_references_and_are_guarded() {
    use serde_json::json;
    let add = owner_references_patch("u", "7", &[], &[set_ref()]);
    assert_eq!(
        add,
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "u"},
            {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
            {"op": "add", "path": "/metadata/ownerReferences", "value": [{
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "set-uid",
                "controller": true, "blockOwnerDeletion": true,
            }]},
        ])
    );
    let remove = owner_references_patch("u", "7", &[user_ref(), set_ref()], &[]);
    assert_eq!(
        remove,
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "u"},
            {"op": "test", "path": "/metadata/ownerReferences",
             "value": serde_json::to_value(vec![user_ref(), set_ref()]).expect("json")},
            {"op": "remove", "path": "/metadata/ownerReferences"},
        ])
    );
    // Applied to a claim: only the owner references change.
    let mut claim =
        serde_json::to_value(claim_with_class("data-web-0", Some("fast"))).expect("json");
    claim["metadata"]["resourceVersion"] = json!("7");
    claim["metadata"]["uid"] = json!("u");
    let before = claim.clone();
    let patch: json_patch::Patch = serde_json::from_value(add).expect("patch");
    json_patch::patch(&mut claim, &patch).expect("applies");
    claim["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("ownerReferences");
    assert_eq!(claim, before);
    // A stale read fails the test instead of overwriting.
    let mut newer = before.clone();
    newer["metadata"]["resourceVersion"] = json!("8");
    let patch: json_patch::Patch =
        serde_json::from_value(owner_references_patch("u", "7", &[], &[set_ref()])).expect("patch");
    assert!(json_patch::patch(&mut newer, &patch).is_err());
}

#[test]
fn label_selectors_match_as_in_kubernetes() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    let labels: crate::projection::Map = [
        ("app".to_owned(), "web".to_owned()),
        ("tier".to_owned(), "db".to_owned()),
    ]
    .into();
    let req = |key: &str, op: &str, values: &[&str]| LabelSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
    };
    let selector =
        |match_labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>| LabelSelector {
            match_labels: Some(
                match_labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            match_expressions: Some(exprs),
        };
    let cases = [
        (LabelSelector::default(), true),
        (selector(&[("app", "web")], vec![]), true),
        (selector(&[("app", "db")], vec![]), false),
        (selector(&[("missing", "x")], vec![]), false),
        (
            selector(&[], vec![req("tier", "In", &["db", "cache"])]),
            true,
        ),
        (selector(&[], vec![req("tier", "In", &["cache"])]), false),
        (selector(&[], vec![req("tier", "NotIn", &["cache"])]), true),
        (selector(&[], vec![req("tier", "NotIn", &["db"])]), false),
        (selector(&[], vec![req("gone", "NotIn", &["x"])]), true),
        (selector(&[], vec![req("app", "Exists", &[])]), true),
        (selector(&[], vec![req("gone", "Exists", &[])]), false),
        (selector(&[], vec![req("gone", "DoesNotExist", &[])]), true),
        (selector(&[], vec![req("app", "DoesNotExist", &[])]), false),
        (selector(&[], vec![req("app", "Bogus", &["web"])]), false),
        (
            selector(&[("app", "web")], vec![req("tier", "In", &["cache"])]),
            false,
        ),
    ];
    for (selector, want) in cases {
        assert_eq!(
            selector_matches(&selector, Some(&labels)),
            want,
            "{selector:?}"
        );
    }
    assert!(!selector_matches(
        &selector(&[("app", "web")], vec![]),
        None
    ));
}

/// Hazard 6 (docs/design.md): set `redis` (template `data-cache`, whenScaled=Delete,
/// scaled to 0) and set `cache-redis` (template `data`) both name a claim
/// `data-cache-redis-0`; it carries `cache-redis`'s labels. `redis` must
/// leave it alone, neither delete it nor give it an owner.
#[test]
fn a_claim_whose_name_only_fits_is_not_the_sets() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let fast = class("fast", DRIVER, None);
    let classes = [&fast];
    let mut redis = full_set(("Delete", "Retain"), 0, &[("data-cache", Some("fast"))]);
    redis.metadata.name = Some("redis".into());
    redis.spec.selector = LabelSelector {
        match_labels: Some([("app".to_owned(), "redis".to_owned())].into()),
        match_expressions: None,
    };
    let mut theirs = claim_with_class("data-cache-redis-0", Some("fast"));
    theirs.metadata.labels = Some([("app".to_owned(), "cache-redis".to_owned())].into());
    let mut ours = claim_with_class("data-cache-redis-1", Some("fast"));
    ours.metadata.labels = Some([("app".to_owned(), "redis".to_owned())].into());
    let plans = plan_set(&redis, &[&theirs, &ours], |_| None, &classes, DRIVER).expect("planned");
    let decisions: Vec<(&str, &Decision)> = plans
        .iter()
        .map(|p| (p.claim.as_str(), &p.decision))
        .collect();
    assert_eq!(
        decisions,
        [
            (
                "data-cache-redis-0",
                &Decision::Leave(LeaveReason::NotSelectedBySet)
            ),
            ("data-cache-redis-1", &Decision::DeleteClaim),
        ]
    );
}
