//! End-to-end: the PV-releaser loop (gate `PVReleaser`) of the real binary
//! against the API test server (with its controller-manager helpers: PVs
//! become Released when their claim goes, Available without a claimRef, and
//! a claim naming a free PV in `spec.volumeName` is bound to it) and the
//! hostpath driver.

#[path = "support/loops.rs"]
mod loops;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube_testserver::{RequestMatch, Verb};
use loops::{assert_stays, changes_to};
use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::standard();
    a_managed_claims_volume_is_released_and_claimable_again,
    class_annotation_associates_and_delete_policy_is_never_released,
    without_automatic_association_a_managed_claims_volume_is_kept,
    gate_off_releases_nothing,
    a_class_annotation_removed_but_not_yet_watched_releases_nothing,
    a_claim_label_removed_but_not_yet_watched_associates_nothing,
);

const ID: &str = "team-a";
const PV_LABEL: &str = "reclaimable-pv-releaser.kubernetes.io/managed-by";
const PVC_LABEL: &str = "dynamic-pvc-provisioner.kubernetes.io/managed-by";
const CLASS_ANNOTATION: &str = "reclaimable-pv-releaser.kubernetes.io/controller-id";

fn gate_on() -> Vec<String> {
    vec![
        "--feature-gates=PVReleaser=true".to_owned(),
        format!("--controller-id={ID}"),
        "--releaser-resync-period=500ms".to_owned(),
    ]
}

fn args(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

fn phase(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref()?.phase.as_deref()
}

fn label(pv: &PersistentVolume) -> Option<&str> {
    pv.metadata
        .labels
        .as_ref()?
        .get(PV_LABEL)
        .map(String::as_str)
}

fn has_claim_ref(pv: &PersistentVolume) -> bool {
    pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_some())
}

async fn annotated_class(env: &Env, short: &str, reclaim: &str) {
    env.storage_class_with(
        short,
        "Immediate",
        reclaim,
        json!({}),
        json!({"metadata": {"annotations": {CLASS_ANNOTATION: ID}}}),
    )
    .await;
}

/// The claim is gone and the PV binder marked its PV Released (at once on
/// the test server; a moment later on a real cluster).
async fn wait_released(env: &Env, name: &str) {
    env.wait_for(
        &format!("PV {name} Released"),
        Duration::from_secs(20),
        || async { (phase(&env.pv(name).await?) == Some("Released")).then_some(()) },
    )
    .await;
}

async fn wait_available(env: &Env, name: &str) -> PersistentVolume {
    env.wait_for(
        &format!("PV {name} Available"),
        Duration::from_secs(20),
        || async {
            let pv = env.pv(name).await?;
            (phase(&pv) == Some("Available") && !has_claim_ref(&pv)).then_some(pv)
        },
    )
    .await
}

/// Claim `data` of class `keep`, labelled for our id, bound: its PV and
/// the PV's name.
async fn managed_claim_bound(env: &Env) -> (PersistentVolume, String) {
    env.create_pvc(
        &env.ns,
        "data",
        "keep",
        "5Mi",
        json!({"metadata": {"labels": {PVC_LABEL: ID}}}),
    )
    .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let name = pv.metadata.name.clone().expect("pv name");
    (pv, name)
}

async fn a_managed_claims_volume_is_released_and_claimable_again(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("keep", "Immediate", "Retain", json!({}))
        .await;
    env.start_sidecar(&args(&gate_on())).await;

    let (_, name) = managed_claim_bound(&env).await;
    env.wait_for("PV labelled", Duration::from_secs(20), || async {
        let pv = env.pv(&name).await?;
        (label(&pv) == Some(ID)).then_some(())
    })
    .await;

    // On the test server the first release attempt fails: reported, retried.
    if !env.is_real() {
        env.api().fail_next(
            1,
            RequestMatch::new(Verb::Patch, "persistentvolumes").name(&name),
            500,
        );
    }
    env.delete_pvc(&env.ns, "data").await;
    let pv = wait_available(&env, &name).await;
    assert_eq!(label(&pv), None, "our label removed on release");
    assert_eq!(env.backend_volumes().len(), 1, "data untouched");
    env.wait_for("Released event", Duration::from_secs(10), || async {
        let events = env.pv_events(&name).await;
        let claim = format!("{}/data", env.ns);
        events
            .iter()
            .any(|(reason, message)| reason == "Released" && message.contains(&claim))
            .then_some(())
    })
    .await;
    if !env.is_real() {
        // Events are written in the background, several at a time: the
        // failure's may land after the success's.
        env.wait_for("ErrReleasePV event", Duration::from_secs(10), || async {
            env.pv_events(&name)
                .await
                .iter()
                .any(|(reason, message)| reason == "ErrReleasePV" && message.contains("release"))
                .then_some(())
        })
        .await;
    }

    // Claimable again: a claim naming the PV is bound to it.
    env.create_pvc(
        &env.ns,
        "again",
        "keep",
        "5Mi",
        json!({"spec": {"volumeName": name}}),
    )
    .await;
    let rebound = env.wait_bound(&env.ns, "again").await;
    assert_eq!(rebound.metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(env.backend_volumes().len(), 1, "no new volume");
    // Bound to a claim that is not managed: the PV is not associated again.
    assert_stays("not labelled again", Duration::from_secs(1), || async {
        env.pv(&name).await.is_some_and(|pv| label(&pv).is_none())
    })
    .await;
    env.assert_consistent().await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

/// A managed claim deleted before its PV was associated, and at once
/// re-created under its name (what the pod/Job provisioner did from a pod
/// cache that had not seen the pod's deletion): the new claim, another uid,
/// must not hide the departed one that the PV's claimRef names, or the PV
/// stays Released for ever. Test server only: the association is held off
/// by failing PV patches until the replacement is in the sidecar's cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_claim_does_not_hide_the_departed_one() {
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("keep", "Immediate", "Retain", json!({}))
        .await;
    let association = RequestMatch::new(Verb::Patch, "persistentvolumes").remote();
    env.api().fail_next(u32::MAX, association, 500);
    env.start_sidecar(&args(&gate_on())).await;

    let (pv, name) = managed_claim_bound(&env).await;
    env.delete_pvc(&env.ns, "data").await;
    wait_released(&env, &name).await;
    // The replacement names the PV, so that its event queues the PV at
    // once (the PV is Released, so the binder leaves them apart).
    env.create_pvc(
        &env.ns,
        "data",
        "",
        "5Mi",
        json!({
            "metadata": {"labels": {PVC_LABEL: ID}},
            "spec": {"storageClassName": env.class("none-such"), "volumeName": name},
        }),
    )
    .await;
    // Nothing can be written yet: the sidecar decides with the replacement
    // in its cache meanwhile.
    assert_stays("still Released", Duration::from_millis(1500), || async {
        env.pv(&name)
            .await
            .is_some_and(|pv| phase(&pv) == Some("Released") && has_claim_ref(&pv))
    })
    .await;
    env.api().clear_faults();
    // Released: the claimRef to the departed claim is gone (the binder may
    // then bind the replacement, which names the PV).
    let old_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.clone());
    env.wait_for(
        "the departed claim's reference removed",
        Duration::from_secs(30),
        || async {
            let pv = env.pv(&name).await?;
            let uid = pv
                .spec
                .as_ref()?
                .claim_ref
                .as_ref()
                .and_then(|r| r.uid.clone());
            (uid != old_uid).then_some(())
        },
    )
    .await;
    env.wait_for("Released event", Duration::from_secs(10), || async {
        let claim = format!("{}/data", env.ns);
        env.pv_events(&name)
            .await
            .iter()
            .any(|(reason, message)| reason == "Released" && message.contains(&claim))
            .then_some(())
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

async fn class_annotation_associates_and_delete_policy_is_never_released(backend: Backend) {
    let mut env = Env::new(backend).await;
    annotated_class(&env, "annotated-keep", "Retain").await;
    annotated_class(&env, "annotated-delete", "Delete").await;
    env.storage_class("plain-keep", "Immediate", "Retain", json!({}))
        .await;
    env.start_sidecar(&args(&gate_on())).await;

    env.create_pvc(&env.ns, "kept", "annotated-keep", "5Mi", json!({}))
        .await;
    env.create_pvc(&env.ns, "deleted", "annotated-delete", "5Mi", json!({}))
        .await;
    env.create_pvc(&env.ns, "plain", "plain-keep", "5Mi", json!({}))
        .await;
    let kept = env.wait_bound(&env.ns, "kept").await;
    let deleted = env.wait_bound(&env.ns, "deleted").await;
    let plain = env.wait_bound(&env.ns, "plain").await;
    let kept = kept.metadata.name.clone().expect("name");
    let deleted = deleted.metadata.name.clone().expect("name");
    let plain = plain.metadata.name.clone().expect("name");

    env.delete_pvc(&env.ns, "kept").await;
    env.delete_pvc(&env.ns, "deleted").await;
    env.delete_pvc(&env.ns, "plain").await;

    let pv = wait_available(&env, &kept).await;
    assert_eq!(label(&pv), None, "association by class needs no label");
    // Released with policy Delete: the provisioner deletes it; a release
    // would have made it Available and kept it.
    env.wait_for(
        "Delete-policy PV and volume gone",
        Duration::from_secs(30),
        || async {
            let gone = env.pv(&deleted).await.is_none();
            let volumes = env.backend_volumes();
            (gone && volumes.len() == 2).then_some(())
        },
    )
    .await;
    // Not associated: stays Released with its claimRef, through resyncs.
    assert_stays(
        "unassociated PV stays Released",
        Duration::from_secs(2),
        || async {
            env.pv(&plain)
                .await
                .is_some_and(|pv| phase(&pv) == Some("Released") && has_claim_ref(&pv))
        },
    )
    .await;
    assert_eq!(changes_to(&env, "persistentvolumes", &plain), 0);
    env.assert_consistent().await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

async fn without_automatic_association_a_managed_claims_volume_is_kept(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("keep", "Immediate", "Retain", json!({}))
        .await;
    let mut flags = gate_on();
    flags.push("--disable-automatic-association".to_owned());
    env.start_sidecar(&args(&flags)).await;

    let (_, name) = managed_claim_bound(&env).await;
    env.delete_pvc(&env.ns, "data").await;
    wait_released(&env, &name).await;
    assert_stays(
        "not associated, stays Released",
        Duration::from_secs(2),
        || async {
            env.pv(&name).await.is_some_and(|pv| {
                phase(&pv) == Some("Released") && has_claim_ref(&pv) && label(&pv).is_none()
            })
        },
    )
    .await;
    assert_eq!(changes_to(&env, "persistentvolumes", &name), 0);
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

async fn gate_off_releases_nothing(backend: Backend) {
    let mut env = Env::new(backend).await;
    annotated_class(&env, "annotated-keep", "Retain").await;
    // The controller id alone does not turn the loop on.
    env.start_sidecar(&[&format!("--controller-id={ID}")]).await;

    env.create_pvc(
        &env.ns,
        "data",
        "annotated-keep",
        "5Mi",
        json!({"metadata": {"labels": {PVC_LABEL: ID}}}),
    )
    .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let name = pv.metadata.name.clone().expect("pv name");
    env.delete_pvc(&env.ns, "data").await;
    wait_released(&env, &name).await;
    assert_stays(
        "gate off: stays Released, unlabelled",
        Duration::from_secs(2),
        || async {
            env.pv(&name).await.is_some_and(|pv| {
                phase(&pv) == Some("Released") && has_claim_ref(&pv) && label(&pv).is_none()
            })
        },
    )
    .await;
    assert_eq!(
        changes_to(&env, "persistentvolumes", &name),
        0,
        "no write to the PV's claimRef or labels"
    );
    assert!(
        env.pv_events(&name)
            .await
            .iter()
            .all(|(reason, _)| reason != "Released" && reason != "ErrReleasePV")
    );
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

/// How long the sidecar's watch of one kind is held back in the two tests
/// below: longer than each test's steps inside the window.
const WATCH_LAG: Duration = Duration::from_secs(10);

/// The log line of the worker declining a write that the live read of the
/// class or claim no longer supports (src/releaser/worker.rs).
const NOT_CONFIRMED: &str = "the cache has not seen a change of the class or claim yet";

/// A release by class annotation rests on the class cache, whose watch is
/// not ordered with the PV's. An admin removes the annotation and a claim
/// of the class is deleted at once; the PV's Released event reaches the
/// sidecar before the class's change (the class watch is held back): the
/// PV must keep its claimRef, not become Available with its data to any
/// claim. The release is decided again from a live read of the class.
async fn a_class_annotation_removed_but_not_yet_watched_releases_nothing(backend: Backend) {
    let mut env = Env::new(backend).await;
    annotated_class(&env, "annotated-keep", "Retain").await;
    // Real cluster: the sidecar's watches pass a lag proxy.
    env.through_lag_proxy();
    env.start_sidecar(&args(&gate_on())).await;
    env.create_pvc(&env.ns, "kept", "annotated-keep", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "kept").await;
    let name = pv.metadata.name.clone().expect("pv name");

    env.lag_watch("storageclasses", WATCH_LAG);
    let class_name = env.class("annotated-keep");
    let mut class = env
        .get("storage.k8s.io/v1", "StorageClass", "", &class_name)
        .await
        .expect("class");
    class["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations")
        .remove(CLASS_ANNOTATION);
    env.replace(class).await;
    env.delete_pvc(&env.ns, "kept").await;
    // Released by the binder; without the live read the sidecar removes
    // the claimRef at once (on the real cluster often before this sees the
    // Released phase).
    env.wait_for(
        &format!("PV {name} Released, or its claimRef removed"),
        Duration::from_secs(20),
        || async {
            let pv = env.pv(&name).await?;
            (phase(&pv) == Some("Released") || !has_claim_ref(&pv)).then_some(())
        },
    )
    .await;
    assert_stays(
        "Released with its claimRef while the class change is on its way",
        Duration::from_secs(3),
        || async {
            env.pv(&name)
                .await
                .is_some_and(|pv| phase(&pv) == Some("Released") && has_claim_ref(&pv))
        },
    )
    .await;
    assert!(
        env.watch_events_held("storageclasses") > 0,
        "the class watch was held back"
    );
    assert!(
        env.logs().contains(NOT_CONFIRMED),
        "the release was declined after the live read: {}",
        env.logs()
    );
    env.clear_watch_lag("storageclasses");
    // Once the class's event arrives: not associated, left alone through
    // resyncs.
    assert_stays(
        "still Released with its claimRef",
        Duration::from_secs(2),
        || async {
            env.pv(&name)
                .await
                .is_some_and(|pv| phase(&pv) == Some("Released") && has_claim_ref(&pv))
        },
    )
    .await;
    assert_eq!(changes_to(&env, "persistentvolumes", &name), 0);
    assert!(
        env.pv_events(&name)
            .await
            .iter()
            .all(|(reason, _)| reason != "Released")
    );
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

/// The automatic association rests on the claim cache (the claim's
/// managed-by label), whose watch is not ordered with the PV's. The label
/// is removed while the claim watch is held back, then a PV pre-bound to
/// the claim appears: the sidecar's cache still shows the label, but the
/// live claim does not, so the PV is not labelled (a label would release
/// it, with its data, once the claim goes), and stays Released with its
/// claimRef when the claim is deleted.
async fn a_claim_label_removed_but_not_yet_watched_associates_nothing(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.through_lag_proxy();
    env.start_sidecar(&args(&gate_on())).await;
    let name = format!("static-{}", env.id);
    // Pre-bound to a PV made below: nothing provisions it (no such class).
    env.create_pvc(
        &env.ns,
        "data",
        "",
        "5Mi",
        json!({
            "metadata": {"labels": {PVC_LABEL: ID}},
            "spec": {"storageClassName": env.class("none-such"), "volumeName": name},
        }),
    )
    .await;
    // The sidecar's claim cache takes the labelled claim (the watch is not
    // held yet).
    tokio::time::sleep(Duration::from_secs(1)).await;

    env.lag_watch("persistentvolumeclaims", WATCH_LAG);
    let mut claim = env
        .get("v1", "PersistentVolumeClaim", &env.ns, "data")
        .await
        .expect("claim");
    let uid = claim["metadata"]["uid"].as_str().expect("uid").to_owned();
    claim["metadata"]["labels"]
        .as_object_mut()
        .expect("labels")
        .remove(PVC_LABEL);
    env.replace(claim).await;
    env.create(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "5Mi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": env.class("none-such"),
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": env.ns, "name": "data", "uid": uid},
            "csi": {"driver": env.driver_name, "volumeHandle": name}},
    }))
    .await;
    env.wait_bound(&env.ns, "data").await;
    assert_stays(
        "not labelled while the label's removal is on its way",
        Duration::from_secs(3),
        || async { env.pv(&name).await.is_some_and(|pv| label(&pv).is_none()) },
    )
    .await;
    assert!(
        env.watch_events_held("persistentvolumeclaims") > 0,
        "the claim watch was held back"
    );
    assert!(
        env.logs().contains(NOT_CONFIRMED),
        "the association was declined after the live read: {}",
        env.logs()
    );
    env.delete_pvc(&env.ns, "data").await;
    wait_released(&env, &name).await;
    env.clear_watch_lag("persistentvolumeclaims");
    assert_stays(
        "not associated: stays Released with its claimRef",
        Duration::from_secs(2),
        || async {
            env.pv(&name).await.is_some_and(|pv| {
                phase(&pv) == Some("Released") && has_claim_ref(&pv) && label(&pv).is_none()
            })
        },
    )
    .await;
    assert_eq!(changes_to(&env, "persistentvolumes", &name), 0);
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
    env.delete("v1", "PersistentVolume", "", &name).await;
}
