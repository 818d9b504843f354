//! Ways to leak a volume, lose data or get stuck, each reproduced by a
//! test named after the case; the case numbers are those of the numbered
//! hazards of docs/design.md. Cases 1, 4, 5 and 13 are (also) in
//! `tests/api_server_restart.rs`, `src/informer/mod.rs`, the journal's unit
//! tests and `src/projection/` / `src/protection/index.rs`. Set
//! `CSI_PROVISIONER_BIN` to run these against another build of the sidecar
//! (a build from before the fixes fails them).

mod support;

use std::time::Duration;

use csi_hostpath::faults::Fault;
use kube_testserver::{RequestMatch, Verb};
use serde_json::json;
use support::{Backend, ClusterConfig, Env, http_get};

e2e!(ClusterConfig::standard();
    a_deleted_secret_does_not_block_the_deletion_of_a_volume,
    remembered_objects_fall_back_when_their_objects_go,
    a_cleanup_asks_again_after_final_errors,
    a_final_answer_that_holds_ends_a_cleanup,
    a_claim_deleted_before_its_first_create_volume_creates_nothing,
    a_sigterm_right_after_a_pv_is_saved_leaves_no_journal_entry,
);

/// Case 2: the PV create committed but its answer was lost, and the next
/// attempts fail: the volume must not be deleted while its PV exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pv_save_never_deletes_a_volume_whose_pv_may_exist() {
    // Needs the API test server: PV creates are made to fail.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    // Every PV create of the sidecar fails for a while ...
    env.api().fail_next(
        12,
        RequestMatch::new(Verb::Create, "persistentvolumes"),
        500,
    );
    let port = support::free_port();
    env.start_sidecar(&[&format!("--http-endpoint=127.0.0.1:{port}")])
        .await;
    let claim = env
        .create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    let uid = claim.metadata.uid.clone().expect("uid");
    let volume = env
        .wait_for(
            "backend volume created",
            Duration::from_secs(20),
            || async { env.backend_volumes().into_iter().next() },
        )
        .await;
    // ... but the first one had committed: the PV is there (written through
    // the server's direct access, which faults do not touch).
    let claim_ref = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": env.ns, "name": "data", "uid": uid});
    env.api()
        .create_object(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("pvc-{uid}"),
                "annotations": {"pv.kubernetes.io/provisioned-by": env.driver_name},
                "finalizers": [support::FINALIZER]},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "5Mi"},
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": env.class("fast"),
                "claimRef": claim_ref,
                "csi": {"driver": env.driver_name, "volumeHandle": volume.id}}}))
        .expect("the PV as the lost create left it");
    // Long enough for every failing attempt of the first pass and more.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        env.backend_volumes().iter().any(|v| v.id == volume.id),
        "the volume of an existing PV was deleted\n{}",
        env.logs()
    );
    env.wait_bound(&env.ns, "data").await;
    env.assert_consistent().await;
    // The retried saves were the work of the Go image's `unsavedpvs` queue:
    // added at the first failure, retried, waited for and worked on, and
    // empty once saved.
    let (_, metrics) = support::http_get(port, "/metrics").await;
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
    };
    let unsaved = |family: &str| value(&format!("{family}{{name=\"unsavedpvs\"}}"));
    assert!(unsaved("workqueue_adds_total") >= 2.0, "{metrics}");
    assert!(unsaved("workqueue_retries_total") >= 1.0, "{metrics}");
    assert!(
        unsaved("workqueue_queue_duration_seconds_count") >= 1.0,
        "{metrics}"
    );
    assert!(
        unsaved("workqueue_queue_duration_seconds_sum") > 0.0,
        "{metrics}"
    );
    assert!(
        unsaved("workqueue_work_duration_seconds_count") >= 1.0,
        "{metrics}"
    );
    assert_eq!(unsaved("workqueue_depth"), 0.0, "{metrics}");
    assert_eq!(
        unsaved("workqueue_unfinished_work_seconds"),
        0.0,
        "{metrics}"
    );
}

/// Case 3: the deletion secret is gone (its namespace was deleted with the
/// claim): delete without credentials, as upstream, instead of keeping the
/// PV and the volume for ever.
async fn a_deleted_secret_does_not_block_the_deletion_of_a_volume(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds", "namespace": env.ns}, "stringData": {"password": "x"}}))
        .await;
    env.storage_class(
        "secret",
        "Immediate",
        "Delete",
        json!({"csi.storage.k8s.io/provisioner-secret-name": "creds",
               "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}"}),
    )
    .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "data", "secret").await;
    env.delete("v1", "Secret", &env.ns, "creds").await;
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("PV and volume gone", Duration::from_secs(30), || async {
        (env.pv(&name).await.is_none() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    env.assert_consistent().await;
}

/// Case 7: removing the selected-node annotation after RESOURCE_EXHAUSTED
/// fails once: it is retried, not forgotten (the claim would stay Pending
/// on a node that cannot hold it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reschedule_is_retried() {
    // Needs the API test server: the claim patch is made to fail.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    env.set_faults(vec![Fault::error(
        "CreateVolume",
        tonic::Code::ResourceExhausted,
    )]);
    let ns = env.ns.clone();
    env.api().fail_next(
        2,
        RequestMatch::new(Verb::Patch, "persistentvolumeclaims")
            .namespace(&ns)
            .name("late"),
        500,
    );
    env.start_sidecar(&[]).await;
    env.create_pvc(
        &env.ns,
        "late",
        "late",
        "5Mi",
        json!({"metadata": {"annotations": {support::SELECTED_NODE: env.node.as_str()}}}),
    )
    .await;
    env.wait_for("selected node removed", Duration::from_secs(30), || async {
        let pvc = env.pvc(&env.ns, "late").await?;
        let annotations = pvc.metadata.annotations.unwrap_or_default();
        (!annotations.contains_key(support::SELECTED_NODE)).then_some(())
    })
    .await;
    assert!(env.backend_volumes().is_empty());
}

/// Case 9: the clone source's finalizer could not be added (conflicts
/// each time): the clone must wait, not go on from an unprotected source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_on_the_source_finalizer_keep_the_clone_waiting() {
    // Needs the API test server: conflicts are injected.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    env.provision(&env.ns, "source", "fast").await;
    let ns = env.ns.clone();
    let source_patches = || {
        RequestMatch::new(Verb::Patch, "persistentvolumeclaims")
            .namespace(&ns)
            .name("source")
    };
    // More conflicts than one pass tries.
    env.api().fail_next(8, source_patches(), 409);
    env.api().reset_counters();
    env.create_pvc(
        &env.ns,
        "copy",
        "fast",
        "5Mi",
        json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "source"}}}),
    )
    .await;
    env.wait_bound(&env.ns, "copy").await;
    // The finalizer was added (a successful patch of the source) before the
    // clone's PV was created.
    let log = env.api().requests();
    let protected_at = log
        .iter()
        .position(|r| r.verb == Verb::Patch && r.name == "source" && r.status == 200);
    let cloned_at = log
        .iter()
        .position(|r| r.verb == Verb::Create && r.resource == "persistentvolumes");
    assert!(
        matches!((protected_at, cloned_at), (Some(p), Some(c)) if p < c),
        "the clone was made from an unprotected source: {log:?}\n{}",
        env.logs()
    );
    env.assert_consistent().await;
}

/// Case 10: a crash in the lazy-removal window leaves the entry of a claim
/// whose PV was saved; the claim and its Retain PV are deleted while the
/// sidecar is down. Resuming the entry must not delete the retained volume
/// (it records it in a PV again, as for any volume whose PV was never saved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_entry_never_deletes_a_retained_volume() {
    // Needs the API test server: journal writes are made to hang.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("keep", "Immediate", "Retain", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    // The journal's removal of the entry (after the PV is saved) hangs.
    let (pv, name) = env.provision(&env.ns, "data", "keep").await;
    for verb in [Verb::Update, Verb::Delete] {
        env.api().add_latency(
            RequestMatch::new(verb, "configmaps"),
            Duration::from_secs(120),
        );
    }
    assert_eq!(env.journal().await.len(), 1, "the entry is still there");
    env.kill_sidecar();
    env.api().clear_faults();
    // Meanwhile: the claim goes; the admin deletes the Released PV (Retain:
    // the volume stays on the backend, as the user asked).
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("PV released", Duration::from_secs(10), || async {
        let pv = env.pv(&name).await?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
    env.delete("v1", "PersistentVolume", "", &name).await;
    let handle = pv
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .expect("handle");
    env.start_sidecar(&[]).await;
    env.wait_for("the entry resumed", Duration::from_secs(20), || async {
        env.journal().await.is_empty().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        env.backend_volumes().iter().any(|v| v.id == handle),
        "the retained volume was deleted by a replay\n{}",
        env.logs()
    );
    // Nor left without a record: a Released PV holds it again (the replay
    // cannot tell this case from a volume that never got its PV).
    let recorded = env.pv(&name).await.expect("a PV records the kept volume");
    assert_eq!(
        recorded.spec.and_then(|s| s.csi).map(|c| c.volume_handle),
        Some(handle)
    );
    env.assert_consistent().await;
}

/// Case 14 again, past the grace: a worker still saving its PV when the
/// shutdown grace (`--timeout` + 2 s) ends saves it during the journal's
/// last flush, and forgets its entry too late for that flush (chaos seed 21
/// of tests/chaos.rs). The flush is written again once such workers are
/// done, within the flush's own bound (3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pv_saved_after_the_shutdown_grace_leaves_no_journal_entry() {
    // Needs the API test server: the PV's create is made slow.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&["--timeout=1s"]).await;
    // The grace is 3 s: the PV is saved a second after it, while the
    // journal's last flush may still take 3 s.
    env.api().add_latency(
        RequestMatch::new(Verb::Create, "persistentvolumes").remote(),
        Duration::from_secs(4),
    );
    let claim = env
        .create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    let uid = claim.metadata.uid.clone().expect("uid");
    env.wait_for("the volume made", Duration::from_secs(30), || async {
        env.backend_volumes()
            .iter()
            .any(|v| v.name == format!("pvc-{uid}"))
            .then_some(())
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
    let logs = env.logs();
    assert!(
        logs.contains("operations still running at shutdown"),
        "the PV was saved within the grace: the case is not met\n{logs}"
    );
    assert!(
        env.pv(&format!("pvc-{uid}")).await.is_some(),
        "the PV was not saved before the exit\n{logs}"
    );
    let journal = env.journal().await;
    assert!(
        !journal.contains_key(&uid),
        "the entry of a claim whose PV is saved outlived the sidecar: {journal:?}\n{logs}"
    );
    env.api().clear_faults();
    env.start_sidecar(&[]).await;
    env.wait_bound(&env.ns, "data").await;
    env.assert_consistent().await;
}

/// Case 11: the JSON patch that removes our finalizer applies only to the
/// PV it was made for: a PV re-created under the same name fails its test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_finalizer_is_never_removed_from_a_pv_that_replaced_ours() {
    let env = Env::new(Backend::TestServer).await;
    let pv = |uid_note: &str| {
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pvc-same", "finalizers": [support::FINALIZER],
                "labels": {"generation": uid_note}},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"},
                "persistentVolumeReclaimPolicy": "Delete",
                "csi": {"driver": env.driver_name, "volumeHandle": "h"}}})
    };
    let first = env.api().create_object(pv("first")).expect("pv");
    let first_uid = first["metadata"]["uid"].as_str().expect("uid").to_owned();
    // Ours goes; another takes the name.
    let mut gone = env
        .api()
        .get_object("v1", "PersistentVolume", "", "pvc-same")
        .expect("pv");
    gone["metadata"]["finalizers"] = json!([]);
    env.api().update_object(gone).expect("release");
    env.api()
        .delete_object("v1", "PersistentVolume", "", "pvc-same")
        .expect("delete");
    env.api().create_object(pv("second")).expect("new pv");
    // The patch our deletion path sends for the first PV.
    let patch = csi_provisioner::provisioner::volumes::finalizer_removal_patch(
        &[support::FINALIZER.into()],
        &first_uid,
    )
    .expect("a patch");
    let api: kube::Api<k8s_openapi::api::core::v1::PersistentVolume> =
        kube::Api::all(env.client.clone());
    let patch: json_patch::Patch = serde_json::from_value(patch).expect("patch");
    let refused = api
        .patch(
            "pvc-same",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::<()>::Json(patch),
        )
        .await;
    assert!(refused.is_err(), "the new PV's finalizer was removed");
    let second = env.pv("pvc-same").await.expect("second pv");
    assert_eq!(support::finalizers(&second), [support::FINALIZER]);
}

/// Case 12: what the sidecar remembers per object falls back to zero once
/// the objects are gone (measured through its own gauges).
async fn remembered_objects_fall_back_when_their_objects_go(backend: Backend) {
    const CLAIMS: usize = 40;
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let port = support::free_port();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    env.start_sidecar(&[&http]).await;
    for i in 0..CLAIMS {
        env.create_pvc(&env.ns, &format!("c{i}"), "fast", "1Mi", json!({}))
            .await;
    }
    for i in 0..CLAIMS {
        env.wait_bound(&env.ns, &format!("c{i}")).await;
    }
    for i in 0..CLAIMS {
        env.delete_pvc(&env.ns, &format!("c{i}")).await;
    }
    env.wait_for(
        "every PV and volume gone",
        Duration::from_secs(60),
        || async { (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(()) },
    )
    .await;
    let gauge = |body: &str, what: &str| -> Option<i64> {
        body.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "csi_provisioner_remembered_objects{{what=\"{what}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    env.wait_for(
        "remembered objects back to zero",
        Duration::from_secs(20),
        || async {
            let (_, body) = http_get(port, "/metrics").await;
            let values: Vec<Option<i64>> = ["event_filter", "deleted_volumes", "in_flight"]
                .iter()
                .map(|w| gauge(&body, w))
                .collect();
            eprintln!("remembered: {values:?}");
            values.iter().all(|v| *v == Some(0)).then_some(())
        },
    )
    .await;
}

/// Case 4: a journal entry larger than a journal segment may hold is
/// refused alone, with an event on its claim; the claims recorded with it
/// are not held back. (Requests are deflated first, so the topology of
/// thousands of nodes fits; here 1 MB of incompressible class parameter,
/// which only the test server accepts: a real one limits parameters to
/// 256 KiB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_journal_entry_is_refused_alone() {
    let mut env = Env::new(Backend::TestServer).await;
    let noise: String = (0..40_000)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();
    env.storage_class("huge", "Immediate", "Delete", json!({"blob": noise}))
        .await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "big", "huge", "1Mi", json!({}))
        .await;
    for i in 0..5 {
        env.create_pvc(&env.ns, &format!("small-{i}"), "fast", "1Mi", json!({}))
            .await;
    }
    for i in 0..5 {
        env.wait_bound(&env.ns, &format!("small-{i}")).await;
    }
    let message = env.wait_event(&env.ns, "big", "ProvisioningFailed").await;
    assert!(
        message.contains("write-ahead journal") && message.contains("bytes"),
        "{message}"
    );
    assert!(
        env.backend_volumes().len() == 5,
        "no CreateVolume for the claim that could not be journalled"
    );
    env.assert_consistent().await;
}

/// Chaos seeds 686 and 828: the claim is deleted after the driver created
/// its volume but before the answer came back. The cleanup repeats the
/// CreateVolume to learn the volume's id; a final error on a repeat (a
/// driver's bad moment) must not be taken at once for "no volume", or the
/// volume leaks for ever.
async fn a_cleanup_asks_again_after_final_errors(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.run_driver_as_process().await;
    // The driver makes the volume and dies before it answers.
    env.set_faults(vec![
        Fault::exit_after_backend_change("CreateVolume").times(1),
    ]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    env.wait_driver_exited().await;
    assert_eq!(env.backend_volumes().len(), 1, "the volume was made");
    // The claim goes while the driver is down ...
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("claim gone", Duration::from_secs(30), || async {
        env.pvc(&env.ns, "data").await.is_none().then_some(())
    })
    .await;
    // ... and the restarted driver answers the first repeats with errors
    // that are final, one of each kind.
    env.set_faults(
        [
            tonic::Code::Internal,
            tonic::Code::NotFound,
            tonic::Code::AlreadyExists,
            tonic::Code::InvalidArgument,
        ]
        .into_iter()
        .map(|code| Fault::error("CreateVolume", code).times(1))
        .collect(),
    );
    env.start_driver();
    env.wait_for("the volume deleted", Duration::from_secs(60), || async {
        env.backend_volumes().is_empty().then_some(())
    })
    .await;
    env.wait_for("the entry finished", Duration::from_secs(20), || async {
        env.journal().await.is_empty().then_some(())
    })
    .await;
    assert!(
        env.logs()
            .contains("asking again before taking it for no volume"),
        "{}",
        env.logs()
    );
    env.assert_consistent().await;
}

/// The other side: a driver that holds to a final error for the repeated
/// CreateVolume (it never made the volume) ends the cleanup; the entry does
/// not stay in the journal for ever.
async fn a_final_answer_that_holds_ends_a_cleanup(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    // Not final: the operation stays in flight (and in the journal).
    env.set_faults(vec![Fault::error(
        "CreateVolume",
        tonic::Code::DeadlineExceeded,
    )]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    // The entry is journaled before the first call: wait for that call's
    // answer too, or the final fault below would answer it while the claim
    // still exists (a plain provisioning failure, no cleanup).
    env.wait_for(
        "the entry journaled and its call answered",
        Duration::from_secs(20),
        || async {
            (env.journal().await.len() == 1 && env.logs().contains("code = DeadlineExceeded"))
                .then_some(())
        },
    )
    .await;
    env.set_faults(vec![Fault::error(
        "CreateVolume",
        tonic::Code::InvalidArgument,
    )]);
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("the entry finished", Duration::from_secs(60), || async {
        env.journal().await.is_empty().then_some(())
    })
    .await;
    let logs = env.logs();
    assert!(
        logs.contains("no volume to clean up")
            && logs.contains(&format!(
                "answers={}",
                csi_provisioner::provision::CLEANUP_FINAL_ANSWERS
            )),
        "{logs}"
    );
    assert!(env.backend_volumes().is_empty());
    env.clear_faults();
    env.assert_consistent().await;
}

/// Chaos seed 141 (real cluster): kube-apiserver restarting while the
/// sidecar starts made the journal's first read fail, and the process
/// exited. The read is asked again until it answers; provisioning then
/// starts as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_journal_at_start_is_read_again() {
    // Needs the API test server: the journal's list is made to fail.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let ns = env.ns.clone();
    env.api().fail_next(
        3,
        RequestMatch::new(Verb::List, "configmaps").namespace(&ns),
        500,
    );
    env.start_sidecar(&[]).await;
    env.provision(&env.ns, "data", "fast").await;
    let running = env.sidecar.as_mut().is_some_and(|child| child.is_running());
    assert!(running, "{}", env.logs());
    let retries = env
        .logs()
        .matches("cannot read the write-ahead journal; provisioning waits for it")
        .count();
    assert_eq!(retries, 3, "{}", env.logs());
}

/// Found side by side with the Go image (tests/parity.rs): the operation is
/// journalled before the provisioner secret is read, so a claim whose
/// secret is missing was in flight without any CreateVolume sent, and its
/// deletion made the cleanup create a volume (to learn its id) and delete
/// it again; with a driver that needs the secret, the cleanup failed for
/// 15 s instead. Nothing was sent: nothing to clean up.
async fn a_claim_deleted_before_its_first_create_volume_creates_nothing(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class(
        "nosecret",
        "Immediate",
        "Delete",
        json!({"csi.storage.k8s.io/provisioner-secret-name": "missing",
               "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}"}),
    )
    .await;
    // A rule that only counts: each CreateVolume takes one firing.
    const FIRINGS: u32 = 1000;
    env.set_faults(vec![
        Fault::delay("CreateVolume", Duration::from_millis(1)).times(FIRINGS),
    ]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "data", "nosecret", "5Mi", json!({}))
        .await;
    let message = env.wait_event(&env.ns, "data", "ProvisioningFailed").await;
    assert!(
        message.contains("secrets \"missing\" not found"),
        "{message}"
    );
    assert_eq!(env.journal().await.len(), 1, "the operation is journalled");
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("the entry finished", Duration::from_secs(20), || async {
        env.journal().await.is_empty().then_some(())
    })
    .await;
    let left = csi_hostpath::faults::Faults::load(&env.driver.faults_file).expect("faults");
    assert_eq!(
        left.rules.first().and_then(|r| r.count),
        Some(FIRINGS),
        "CreateVolume was called\n{}",
        env.logs()
    );
    assert!(
        env.logs()
            .contains("no CreateVolume was sent for the claim; nothing to clean up"),
        "{}",
        env.logs()
    );
    env.clear_faults();
    env.assert_consistent().await;
}

/// Case 14: a SIGTERM about 1.5 s after a claim was provisioned left its
/// journal entry in the ConfigMap: the entry's removal (its PV saved) waited
/// for the journal's lazy flush (2 s), and the process exited first. Every
/// later start replayed it and, the claim deleted by then, repeated
/// `CreateVolume` to learn the volume's id: on a driver whose volume was
/// already deleted with its PV, a new volume only to delete it again.
/// Graceful shutdown writes the removals it owes before it exits.
async fn a_sigterm_right_after_a_pv_is_saved_leaves_no_journal_entry(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let claim = env
        .create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    let uid = claim.metadata.uid.clone().expect("uid");
    // The PV is saved: the entry is done, its removal queued.
    env.wait_for("PV saved", Duration::from_secs(30), || async {
        env.pv(&format!("pvc-{uid}")).await
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
    let journal = env.journal().await;
    assert!(
        !journal.contains_key(&uid),
        "the entry of a claim whose PV is saved outlived the sidecar: {journal:?}\n{}",
        env.logs()
    );
    // The next start has nothing to replay.
    env.start_sidecar(&[]).await;
    env.wait_bound(&env.ns, "data").await;
    assert!(
        !env.logs()
            .contains("resuming provisioning recorded in the journal"),
        "{}",
        env.logs()
    );
    env.assert_consistent().await;
}
