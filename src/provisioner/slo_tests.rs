use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::*;
use crate::provision::fixtures::{self, annotate, claim, claim_spec, config, released_volume};
use crate::wellknown as wk;

fn at(seconds: i64) -> Time {
    Time(Timestamp::UNIX_EPOCH + SignedDuration::from_secs(seconds))
}

fn now(seconds: i64) -> Timestamp {
    at(seconds).0
}

/// `metadata` with `key: value` as its only annotation.
fn only_annotation(metadata: &mut crate::projection::Meta, key: &str, value: &str) {
    metadata.annotations = None;
    annotate(metadata, key, value);
}

#[test]
fn a_claim_waits_while_it_is_ours_unbound_and_not_deleted() {
    let config = config();
    assert!(claim_waits(&claim(), &config), "the fixture: ours, unbound");

    let mut bound = claim();
    claim_spec(&mut bound).volume_name = Some("pv-1".to_owned());
    assert!(!claim_waits(&bound, &config), "has its volume");

    let mut empty_name = claim();
    claim_spec(&mut empty_name).volume_name = Some(String::new());
    assert!(
        claim_waits(&empty_name, &config),
        "an empty volumeName is none"
    );

    let mut deleted = claim();
    deleted.metadata.deletion_timestamp = Some(at(5));
    assert!(!claim_waits(&deleted, &config), "being deleted");

    let mut other = claim();
    only_annotation(
        &mut other.metadata,
        wk::ANN_STORAGE_PROVISIONER,
        "other.csi.example.com",
    );
    assert!(!claim_waits(&other, &config), "another provisioner's");

    let mut unannotated = claim();
    unannotated.metadata.annotations = None;
    assert!(
        !claim_waits(&unannotated, &config),
        "not annotated yet (a WaitForFirstConsumer claim whose pod waits)"
    );

    let mut beta = claim();
    only_annotation(
        &mut beta.metadata,
        wk::ANN_BETA_STORAGE_PROVISIONER,
        fixtures::DRIVER,
    );
    assert!(claim_waits(&beta, &config), "the beta annotation");

    let mut no_spec = claim();
    no_spec.spec = None;
    assert!(claim_waits(&no_spec, &config), "no spec: no volume either");
}

#[test]
fn a_volume_waits_while_its_deletion_is_due_and_not_done() {
    let config = config();
    let pv = released_volume();
    assert!(
        volume_waits(&pv, &config, false),
        "the fixture: Released, Delete"
    );
    assert!(
        !volume_waits(&pv, &config, true),
        "its volume is deleted already"
    );

    let mut bound = released_volume();
    if let Some(status) = bound.status.as_mut() {
        status.phase = Some("Bound".into());
    }
    assert!(!volume_waits(&bound, &config, false), "bound");

    let mut retained = released_volume();
    if let Some(spec) = retained.spec.as_mut() {
        spec.persistent_volume_reclaim_policy = Some("Retain".into());
    }
    assert!(!volume_waits(&retained, &config, false), "Retain");

    let mut other = released_volume();
    only_annotation(
        &mut other.metadata,
        wk::ANN_PROVISIONED_BY,
        "other.csi.example.com",
    );
    assert!(!volume_waits(&other, &config, false), "another driver's");

    let mut no_status = released_volume();
    no_status.status = None;
    assert!(!volume_waits(&no_status, &config, false), "no phase");
}

#[test]
fn a_volume_is_released_at_its_last_phase_transition_while_released() {
    let mut pv = released_volume();
    assert_eq!(released_at(&pv), None, "no lastPhaseTransitionTime");
    if let Some(status) = pv.status.as_mut() {
        status.last_phase_transition_time = Some(at(100));
    }
    assert_eq!(released_at(&pv), Some(&at(100)));
    // Deleted while bound: the clock starts at the release, not at the
    // deletion timestamp.
    pv.metadata.deletion_timestamp = Some(at(40));
    assert_eq!(released_at(&pv), Some(&at(100)));
    for phase in ["Bound", "Available", "Failed", "Pending"] {
        if let Some(status) = pv.status.as_mut() {
            status.phase = Some(phase.into());
        }
        assert_eq!(released_at(&pv), None, "{phase}");
    }
    pv.status = None;
    assert_eq!(released_at(&pv), None, "no status");
}

#[test]
fn lastphasetransitiontime_is_read_from_the_api_and_kept_in_the_cache() {
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pv"},
        "status": {"phase": "Released", "lastPhaseTransitionTime": "2026-11-26T00:59:21Z"},
    }))
    .expect("decodes");
    let expected: Timestamp = "2026-11-26T00:59:21Z".parse().expect("a timestamp");
    assert_eq!(released_at(&pv).map(|t| t.0), Some(expected));
    let full = crate::projection::Projection::to_object(&pv);
    let projected = <PersistentVolume as crate::projection::Projection>::project(&full);
    assert_eq!(released_at(&projected).map(|t| t.0), Some(expected));
}

#[test]
fn ages_count_from_since_to_now_and_never_below_zero() {
    assert_eq!(age(None, now(10)), None);
    assert_eq!(age(Some(&at(4)), now(10)), Some(Duration::from_secs(6)));
    assert_eq!(age(Some(&at(10)), now(10)), Some(Duration::ZERO));
    assert_eq!(
        age(Some(&at(12)), now(10)),
        Some(Duration::ZERO),
        "the API server's clock ahead of ours"
    );
    let fraction = Time(Timestamp::UNIX_EPOCH + SignedDuration::from_millis(1500));
    assert_eq!(
        age(Some(&fraction), now(3)),
        Some(Duration::from_millis(1500))
    );
}

#[test]
fn backlogs_are_counted_per_class_with_the_oldest_age() {
    let secs = |s: u64| Some(Duration::from_secs(s));
    assert!(
        by_class([], []).is_empty(),
        "nothing known, nothing reported"
    );

    let quiet = by_class(["fast", "slow"], []);
    assert_eq!(quiet.len(), 2);
    assert!(
        quiet.values().all(|b| *b == Backlog::default()),
        "our classes are reported at 0: {quiet:?}"
    );

    let backlogs = by_class(
        ["fast", "slow", "idle"],
        [
            ("fast".to_owned(), secs(30)),
            ("fast".to_owned(), secs(300)),
            ("fast".to_owned(), secs(3)),
            ("slow".to_owned(), None),
            ("slow".to_owned(), secs(7)),
            // A claim of a class that is not (or no longer) in the cache.
            ("gone".to_owned(), secs(60)),
            // No class at all.
            (String::new(), None),
        ],
    );
    let get = |class: &str| backlogs.get(class).copied();
    let backlog = |count, oldest_seconds| {
        Some(Backlog {
            count,
            oldest_seconds,
        })
    };
    assert_eq!(get("fast"), backlog(3, 300.0));
    assert_eq!(
        get("slow"),
        backlog(2, 7.0),
        "an unknown age does not count"
    );
    assert_eq!(get("idle"), backlog(0, 0.0));
    assert_eq!(get("gone"), backlog(1, 60.0));
    assert_eq!(get(""), backlog(1, 0.0), "only unknown ages: 0");
    assert_eq!(backlogs.len(), 5);

    // Duplicated class names are one class.
    let twice = by_class(["fast", "fast"], [("fast".to_owned(), secs(1))]);
    assert_eq!(twice.len(), 1);
    assert_eq!(twice.get("fast").map(|b| b.count), Some(1));
}

#[tokio::test]
async fn a_driver_call_is_timed_by_class_method_and_code() {
    let ok: Result<u8, CsiError> =
        timed_driver_call("unit-slo", "CreateVolume", async { Ok(1) }).await;
    assert_eq!(ok.ok(), Some(1));
    let failed: Result<u8, CsiError> = timed_driver_call("unit-slo", "DeleteVolume", async {
        Err(CsiError::new(
            "DeleteVolume",
            tonic::Status::new(tonic::Code::ResourceExhausted, "full"),
        ))
    })
    .await;
    assert!(failed.is_err(), "the error is passed on");
    let text = crate::metrics::encode_as(crate::metrics::Exposition::Prometheus);
    for series in [
        r#"csi_provisioner_driver_call_seconds_count{storage_class="unit-slo",method="CreateVolume",grpc_status_code="OK"} 1"#,
        r#"csi_provisioner_driver_call_seconds_count{storage_class="unit-slo",method="DeleteVolume",grpc_status_code="ResourceExhausted"} 1"#,
    ] {
        assert!(text.contains(series), "missing {series}\n{text}");
    }
}
