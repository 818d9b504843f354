use crate::projection::{ClaimReference, Shared};
use std::collections::BTreeMap;

use crate::projection::{CSIPersistentVolumeSource, PersistentVolumeSpec, PersistentVolumeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;
use crate::projection::Meta;

const DRIVER: &str = "hostpath.csi.k8s.io";
const ID: &str = "team-a";

fn config(automatic: bool) -> ReleaserConfig {
    ReleaserConfig {
        controller_id: ID.to_owned(),
        automatic_association: automatic,
        driver: ProvisionerConfig::with_defaults(DRIVER),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

/// A Released, Retain PV of our driver, class `keep`, claimRef `ns/data`
/// (uid `claim-uid`), without labels.
fn pv() -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv-1".to_owned()),
            resource_version: Some("7".to_owned()),
            annotations: labels(&[(wk::ANN_PROVISIONED_BY, DRIVER)]),
            ..ObjectMeta::default()
        }
        .into(),
        spec: Some(PersistentVolumeSpec {
            storage_class_name: Some("keep".into()),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            claim_ref: Some(ClaimReference {
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some("ns".into()),
                name: Some("data".to_owned()),
                uid: Some("claim-uid".to_owned()),
                ..ClaimReference::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "h".to_owned(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        }),
    }
}

fn labelled(mut pv: PersistentVolume, id: &str) -> PersistentVolume {
    pv.metadata.labels = labels(&[(wk::LABEL_PV_RELEASER_MANAGED_BY, id)]).map(Into::into);
    pv
}

fn in_phase(mut pv: PersistentVolume, phase: Option<&str>) -> PersistentVolume {
    pv.status = phase.map(|p| PersistentVolumeStatus {
        phase: Some(p.into()),
        ..Default::default()
    });
    pv
}

fn with_policy(mut pv: PersistentVolume, policy: Option<&str>) -> PersistentVolume {
    if let Some(spec) = pv.spec.as_mut() {
        spec.persistent_volume_reclaim_policy = policy.map(Shared::from);
    }
    pv
}

fn without_claim_ref(mut pv: PersistentVolume) -> PersistentVolume {
    if let Some(spec) = pv.spec.as_mut() {
        spec.claim_ref = None;
    }
    pv
}

fn class(name: &str, annotation: Option<&str>) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations: annotation.and_then(|id| labels(&[(wk::ANN_RELEASER_CONTROLLER_ID, id)])),
            ..ObjectMeta::default()
        },
        provisioner: DRIVER.to_owned(),
        ..StorageClass::default()
    }
}

/// `ns/data` (uid `claim-uid`), labelled for `id` when given.
fn claim(id: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some("claim-uid".to_owned()),
            labels: id.and_then(|id| labels(&[(wk::LABEL_PVC_MANAGED_BY, id)])),
            ..ObjectMeta::default()
        }
        .into(),
        ..PersistentVolumeClaim::default()
    }
}

fn other_driver(mut pv: PersistentVolume) -> PersistentVolume {
    pv.metadata.annotations =
        labels(&[(wk::ANN_PROVISIONED_BY, "other.csi.example.com")]).map(Into::into);
    if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.driver = "other.csi.example.com".into();
    }
    pv
}

/// (what, pv, class, claim, automatic association, verdict)
type Case = (
    &'static str,
    PersistentVolume,
    Option<StorageClass>,
    Option<PersistentVolumeClaim>,
    bool,
    Verdict,
);

#[test]
fn verdicts() {
    use Association::{ClassAnnotation, Label};
    let annotated = Some(class("keep", Some(ID)));
    let bound = in_phase(pv(), Some("Bound"));
    let release = |association, remove_label| Verdict::Release {
        association,
        remove_label,
    };
    let cases: Vec<Case> = vec![
        // Association by label.
        (
            "labelled, Released",
            labelled(pv(), ID),
            None,
            None,
            true,
            release(Label, true),
        ),
        (
            "labelled, Released, no automatic association",
            labelled(pv(), ID),
            None,
            None,
            false,
            release(Label, true),
        ),
        (
            "labelled and annotated class",
            labelled(pv(), ID),
            annotated.clone(),
            None,
            true,
            release(Label, true),
        ),
        (
            "labelled, Bound",
            labelled(bound.clone(), ID),
            None,
            None,
            true,
            Verdict::NotReleased { association: Label },
        ),
        (
            "labelled, Available",
            labelled(in_phase(pv(), Some("Available")), ID),
            None,
            None,
            true,
            Verdict::NotReleased { association: Label },
        ),
        (
            "labelled, Pending",
            labelled(in_phase(pv(), Some("Pending")), ID),
            None,
            None,
            true,
            Verdict::NotReleased { association: Label },
        ),
        (
            "labelled, Failed",
            labelled(in_phase(pv(), Some("Failed")), ID),
            None,
            None,
            true,
            Verdict::NotReleased { association: Label },
        ),
        (
            "labelled, no status",
            labelled(in_phase(pv(), None), ID),
            None,
            None,
            true,
            Verdict::NotReleased { association: Label },
        ),
        (
            "labelled, Released without claimRef",
            labelled(without_claim_ref(pv()), ID),
            None,
            None,
            true,
            Verdict::NotReleased { association: Label },
        ),
        (
            "labelled for another id",
            labelled(pv(), "team-b"),
            annotated.clone(),
            Some(claim(Some(ID))),
            true,
            Verdict::OtherController {
                id: "team-b".to_owned(),
            },
        ),
        (
            "labelled with an empty id",
            labelled(pv(), ""),
            annotated.clone(),
            None,
            true,
            Verdict::OtherController { id: String::new() },
        ),
        // Association by class annotation.
        (
            "annotated class, Released",
            pv(),
            annotated.clone(),
            None,
            true,
            release(ClassAnnotation, false),
        ),
        (
            "annotated class, automatic association off",
            pv(),
            annotated.clone(),
            None,
            false,
            release(ClassAnnotation, false),
        ),
        (
            "annotated class, Bound",
            bound.clone(),
            annotated.clone(),
            None,
            true,
            Verdict::NotReleased {
                association: ClassAnnotation,
            },
        ),
        (
            "class annotated for another id",
            pv(),
            Some(class("keep", Some("team-b"))),
            None,
            true,
            Verdict::NotAssociated,
        ),
        (
            "class without annotation",
            pv(),
            Some(class("keep", None)),
            None,
            true,
            Verdict::NotAssociated,
        ),
        (
            "class object of another name",
            pv(),
            Some(class("other", Some(ID))),
            None,
            true,
            Verdict::NotAssociated,
        ),
        (
            "PV without class",
            {
                let mut p = pv();
                if let Some(spec) = p.spec.as_mut() {
                    spec.storage_class_name = None;
                }
                p
            },
            annotated.clone(),
            None,
            true,
            Verdict::NotAssociated,
        ),
        (
            "PV with empty class",
            {
                let mut p = pv();
                if let Some(spec) = p.spec.as_mut() {
                    spec.storage_class_name = Some(Shared::default());
                }
                p
            },
            Some(class("", Some(ID))),
            None,
            true,
            Verdict::NotAssociated,
        ),
        (
            "class missing from the cache",
            pv(),
            None,
            None,
            true,
            Verdict::NotAssociated,
        ),
        // Reclaim policy.
        (
            "Delete policy, labelled",
            labelled(with_policy(pv(), Some("Delete")), ID),
            None,
            None,
            true,
            Verdict::RefuseDeletePolicy,
        ),
        (
            "Delete policy, annotated class",
            with_policy(pv(), Some("Delete")),
            annotated.clone(),
            None,
            true,
            Verdict::RefuseDeletePolicy,
        ),
        (
            "Delete policy, Bound",
            labelled(with_policy(bound.clone(), Some("Delete")), ID),
            None,
            None,
            true,
            Verdict::NotReleased { association: Label },
        ),
        (
            "Recycle policy",
            labelled(with_policy(pv(), Some("Recycle")), ID),
            None,
            None,
            true,
            release(Label, true),
        ),
        (
            "no policy",
            labelled(with_policy(pv(), None), ID),
            None,
            None,
            true,
            release(Label, true),
        ),
        // Automatic association.
        (
            "managed claim, bound",
            bound.clone(),
            None,
            Some(claim(Some(ID))),
            true,
            Verdict::Associate,
        ),
        (
            "managed claim, automatic association off",
            bound.clone(),
            None,
            Some(claim(Some(ID))),
            false,
            Verdict::NotAssociated,
        ),
        (
            "claim managed by another id",
            bound.clone(),
            None,
            Some(claim(Some("team-b"))),
            true,
            Verdict::NotAssociated,
        ),
        (
            "claim without label",
            bound.clone(),
            None,
            Some(claim(None)),
            true,
            Verdict::NotAssociated,
        ),
        (
            "no claim",
            bound.clone(),
            None,
            None,
            true,
            Verdict::NotAssociated,
        ),
        (
            "claim of another uid",
            bound.clone(),
            None,
            Some(PersistentVolumeClaim {
                metadata: Meta {
                    uid: Some("new-uid".to_owned()),
                    ..claim(Some(ID)).metadata
                },
                ..claim(Some(ID))
            }),
            true,
            Verdict::NotAssociated,
        ),
        (
            "claim of another name",
            bound.clone(),
            None,
            Some(PersistentVolumeClaim {
                metadata: Meta {
                    name: Some("other".to_owned()),
                    ..claim(Some(ID)).metadata
                },
                ..claim(Some(ID))
            }),
            true,
            Verdict::NotAssociated,
        ),
        (
            "claim in another namespace",
            bound.clone(),
            None,
            Some(PersistentVolumeClaim {
                metadata: Meta {
                    namespace: Some("elsewhere".into()),
                    ..claim(Some(ID)).metadata
                },
                ..claim(Some(ID))
            }),
            true,
            Verdict::NotAssociated,
        ),
        (
            "claimRef without uid",
            {
                let mut p = bound.clone();
                if let Some(r) = p.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
                    r.uid = None;
                }
                p
            },
            None,
            Some(claim(Some(ID))),
            true,
            Verdict::Associate,
        ),
        (
            "claimRef without name",
            {
                let mut p = bound.clone();
                if let Some(r) = p.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
                    r.name = None;
                }
                p
            },
            None,
            Some(claim(Some(ID))),
            true,
            Verdict::NotAssociated,
        ),
        (
            "no claimRef",
            without_claim_ref(bound.clone()),
            None,
            Some(claim(Some(ID))),
            true,
            Verdict::NotAssociated,
        ),
        (
            "already labelled: no second association",
            labelled(bound.clone(), ID),
            None,
            Some(claim(Some(ID))),
            true,
            Verdict::NotReleased { association: Label },
        ),
        // Other drivers and bad input.
        (
            "other driver, labelled",
            other_driver(labelled(pv(), ID)),
            annotated.clone(),
            Some(claim(Some(ID))),
            true,
            Verdict::NotOurs,
        ),
        (
            "other driver, managed claim",
            other_driver(bound.clone()),
            None,
            Some(claim(Some(ID))),
            true,
            Verdict::NotOurs,
        ),
        (
            "no name",
            PersistentVolume {
                metadata: Meta {
                    name: None,
                    ..labelled(pv(), ID).metadata
                },
                ..labelled(pv(), ID)
            },
            None,
            None,
            true,
            Verdict::Malformed,
        ),
        (
            "no resourceVersion",
            PersistentVolume {
                metadata: Meta {
                    resource_version: None,
                    ..labelled(pv(), ID).metadata
                },
                ..labelled(pv(), ID)
            },
            None,
            None,
            true,
            Verdict::Malformed,
        ),
        (
            "being deleted",
            PersistentVolume {
                metadata: Meta {
                    deletion_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                    ..labelled(pv(), ID).metadata
                },
                ..labelled(pv(), ID)
            },
            None,
            None,
            true,
            Verdict::BeingDeleted,
        ),
    ];
    for (what, pv, class, claim, automatic, want) in cases {
        assert_eq!(
            decide(&pv, class.as_ref(), claim.as_ref(), &config(automatic)),
            want,
            "{what}"
        );
    }
    // Without a controller id nothing is associated (the command line
    // refuses it; the decision does not rely on that).
    let mut no_id = config(true);
    no_id.controller_id = String::new();
    assert_eq!(
        decide(&labelled(pv(), ""), None, None, &no_id),
        Verdict::Malformed
    );
}

#[test]
fn patches() {
    assert_eq!(
        release_patch("7", true),
        json!({
            "metadata": {"resourceVersion": "7", "labels": {wk::LABEL_PV_RELEASER_MANAGED_BY: null}},
            "spec": {"claimRef": null},
        })
    );
    assert_eq!(
        release_patch("7", false),
        json!({"metadata": {"resourceVersion": "7"}, "spec": {"claimRef": null}})
    );
    assert_eq!(
        associate_patch("9", ID),
        json!({"metadata": {"resourceVersion": "9", "labels": {wk::LABEL_PV_RELEASER_MANAGED_BY: ID}}})
    );
}

#[test]
fn messages_and_claim_refs() {
    assert_eq!(claim_ref_name(&pv()), Some(("ns", "data")));
    assert_eq!(claim_ref_name(&without_claim_ref(pv())), None);
    let mut empty = pv();
    if let Some(r) = empty.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        r.namespace = Some(Shared::default());
    }
    assert_eq!(claim_ref_name(&empty), None);
    assert!(released_message(&pv(), ID).contains("claim ns/data (uid claim-uid)"));
    let mut new_claim = pv();
    if let Some(r) = new_claim.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        r.uid = Some("other-uid".to_owned());
    }
    assert_ne!(
        released_message(&pv(), ID),
        released_message(&new_claim, ID),
        "a new claim of the same name is a new transition"
    );
    let mut no_uid = pv();
    if let Some(r) = no_uid.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        r.uid = None;
    }
    assert!(!released_message(&no_uid, ID).contains("uid"));
    assert!(released_message(&pv(), ID).contains("controller team-a"));
    assert!(released_message(&without_claim_ref(pv()), ID).contains("(unnamed)"));
    assert!(DELETE_POLICY_MESSAGE.contains("reclaim policy is Delete"));
}

#[test]
fn a_departed_claim_is_kept_only_while_the_pv_is_to_be_associated() {
    let association = Association::Label;
    let cases: &[(Verdict, bool)] = &[
        (Verdict::Associate, true),
        (Verdict::NotOurs, false),
        (Verdict::Malformed, false),
        (Verdict::BeingDeleted, false),
        (
            Verdict::OtherController {
                id: "team-b".to_owned(),
            },
            false,
        ),
        (Verdict::NotAssociated, false),
        (Verdict::NotReleased { association }, false),
        (Verdict::RefuseDeletePolicy, false),
        (
            Verdict::Release {
                association,
                remove_label: true,
            },
            false,
        ),
    ];
    for (verdict, keep) in cases {
        assert_eq!(keep_departed(verdict), *keep, "{verdict:?}");
    }
}

/// The departed claim through the decisions the worker makes from it: kept
/// for the association, dropped once the PV carries our label (the release
/// needs no claim) or when it was another claim of the same name.
#[test]
fn a_departed_claim_through_association_and_release() {
    let mut replaced = claim(Some(ID));
    replaced.metadata.uid = Some("another-uid".to_owned());
    let cases: &[(&str, PersistentVolume, PersistentVolumeClaim, bool)] = &[
        ("not associated yet", pv(), claim(Some(ID)), true),
        (
            "labelled by the association",
            labelled(pv(), ID),
            claim(Some(ID)),
            false,
        ),
        ("another claim of the same name", pv(), replaced, false),
        (
            "a claim not managed by us",
            pv(),
            claim(Some("team-b")),
            false,
        ),
    ];
    for (what, pv, departed, keep) in cases {
        let verdict = decide(pv, None, Some(departed), &config(true));
        assert_eq!(keep_departed(&verdict), *keep, "{what}: {verdict:?}");
    }
}

/// `claim` re-created under the same name: another uid.
fn recreated(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
    claim.metadata.uid = Some("new-uid".to_owned());
    claim
}

#[test]
fn the_claim_the_claim_ref_names_by_uid_is_decided_with() {
    let departed = claim(Some(ID));
    let replacement = recreated(claim(Some(ID)));
    let mut no_uid = pv();
    if let Some(r) = no_uid.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        r.uid = None;
    }
    let uid = |c: Option<&PersistentVolumeClaim>| c.and_then(|c| c.metadata.uid.clone());
    type Case<'a> = (
        &'a str,
        &'a PersistentVolume,
        Option<&'a PersistentVolumeClaim>,
        Option<&'a PersistentVolumeClaim>,
        Option<&'a str>,
    );
    let cases: &[Case] = &[
        // The pod/Job provisioner re-created the claim from a lagging pod
        // cache: the departed claim is still the PV's.
        (
            "a replacement does not hide the departed claim",
            &pv(),
            Some(&replacement),
            Some(&departed),
            Some("claim-uid"),
        ),
        (
            "the cached claim with the uid",
            &pv(),
            Some(&departed),
            None,
            Some("claim-uid"),
        ),
        (
            "only the departed claim",
            &pv(),
            None,
            Some(&departed),
            Some("claim-uid"),
        ),
        (
            "only a replacement: decided with it (and not associated)",
            &pv(),
            Some(&replacement),
            None,
            Some("new-uid"),
        ),
        (
            "neither has the uid: the cached one",
            &pv(),
            Some(&replacement),
            Some(&recreated(claim(None))),
            Some("new-uid"),
        ),
        (
            "no uid in the claimRef: the cached one",
            &no_uid,
            Some(&replacement),
            Some(&departed),
            Some("new-uid"),
        ),
        ("no claim", &pv(), None, None, None),
    ];
    for (what, pv, cached, departed, want) in cases {
        let got = claim_to_decide_with(pv, *cached, *departed);
        assert_eq!(uid(got).as_deref(), *want, "{what}");
    }
    // The verdict the worker reaches for the race's PV: associate (and keep
    // the departed claim until the label lands), not "not associated".
    let chosen = claim_to_decide_with(&pv(), Some(&replacement), Some(&departed));
    let verdict = decide(&pv(), None, chosen, &config(true));
    assert_eq!(verdict, Verdict::Associate);
    assert!(keep_departed(&verdict));
}

/// A write that rests on another kind's cache names the one object to read
/// live; the others (no write, or the PV's own label) need nothing.
#[test]
fn the_live_read_a_verdict_rests_on() {
    use Association::{ClassAnnotation, Label};
    let cases: &[(&str, Verdict, Option<LiveRead>)] = &[
        (
            "release by class annotation: the class",
            Verdict::Release {
                association: ClassAnnotation,
                remove_label: false,
            },
            Some(LiveRead::Class("keep")),
        ),
        (
            "association: the claim the claimRef names",
            Verdict::Associate,
            Some(LiveRead::Claim {
                namespace: "ns",
                name: "data",
            }),
        ),
        (
            "release by the PV's own label: the PV alone",
            Verdict::Release {
                association: Label,
                remove_label: true,
            },
            None,
        ),
        ("nothing written", Verdict::NotAssociated, None),
        ("nothing written", Verdict::RefuseDeletePolicy, None),
        (
            "nothing written",
            Verdict::NotReleased {
                association: ClassAnnotation,
            },
            None,
        ),
    ];
    let pv = pv();
    for (what, verdict, want) in cases {
        assert_eq!(live_read(&pv, verdict), *want, "{what}");
    }
    // Names missing: empty, so nothing is read and nothing confirmed.
    let mut bare = without_claim_ref(pv.clone());
    if let Some(spec) = bare.spec.as_mut() {
        spec.storage_class_name = None;
    }
    assert_eq!(
        live_read(
            &bare,
            &Verdict::Release {
                association: ClassAnnotation,
                remove_label: false
            }
        ),
        Some(LiveRead::Class(""))
    );
    assert_eq!(
        live_read(&bare, &Verdict::Associate),
        Some(LiveRead::Claim {
            namespace: "",
            name: ""
        })
    );
}

/// The worker's two confirmations, decided again from what the live read
/// returns: only an unchanged verdict is written.
#[test]
fn a_verdict_from_a_lagging_cache_is_not_confirmed_by_the_live_objects() {
    let release = Verdict::Release {
        association: Association::ClassAnnotation,
        remove_label: false,
    };
    let cached = decide(&pv(), Some(&class("keep", Some(ID))), None, &config(true));
    assert_eq!(cached, release);
    let live_cases: &[(&str, Option<StorageClass>, bool)] = &[
        (
            "annotation still there",
            Some(class("keep", Some(ID))),
            true,
        ),
        ("annotation removed", Some(class("keep", None)), false),
        (
            "annotated for another id",
            Some(class("keep", Some("team-b"))),
            false,
        ),
        ("class deleted (404)", None, false),
    ];
    for (what, live, write) in live_cases {
        let again = decide(&pv(), live.as_ref(), None, &config(true));
        assert_eq!(confirmed(&cached, &again), *write, "{what}: {again:?}");
    }
    // The annotation removed, but the claim (departed, or cached) is
    // managed: the live verdict is an association, not the release the
    // cache asked for; nothing is written now (the class's event queues
    // the PV, and the association is confirmed from the claim then).
    let again = decide(
        &pv(),
        Some(&class("keep", None)),
        Some(&claim(Some(ID))),
        &config(true),
    );
    assert_eq!(again, Verdict::Associate);
    assert!(!confirmed(&cached, &again));
    assert!(keep_departed(&again), "the departed claim is kept for it");

    let cached = decide(&pv(), None, Some(&claim(Some(ID))), &config(true));
    assert_eq!(cached, Verdict::Associate);
    let departed = claim(Some(ID));
    let live_claims: &[(
        &str,
        Option<PersistentVolumeClaim>,
        Option<&PersistentVolumeClaim>,
        bool,
    )] = &[
        ("label still there", Some(claim(Some(ID))), None, true),
        ("label removed", Some(claim(None)), None, false),
        (
            "relabelled for another id",
            Some(claim(Some("team-b"))),
            None,
            false,
        ),
        ("deleted, deletion not seen yet", None, None, false),
        (
            "re-created under its name, no departed state",
            Some(recreated(claim(Some(ID)))),
            None,
            false,
        ),
        (
            "deleted, its last state departed",
            None,
            Some(&departed),
            true,
        ),
        (
            "re-created, the departed state is the claimRef's",
            Some(recreated(claim(Some(ID)))),
            Some(&departed),
            true,
        ),
    ];
    for (what, live, departed, write) in live_claims {
        let chosen = claim_to_decide_with(&pv(), live.as_ref(), *departed);
        let again = decide(&pv(), None, chosen, &config(true));
        assert_eq!(confirmed(&cached, &again), *write, "{what}: {again:?}");
    }
}
