//! End-to-end: the sidecar killed in the remaining windows between a
//! backend change and the API write that records it, the reschedule of a
//! WaitForFirstConsumer claim on RESOURCE_EXHAUSTED, and the driver habits
//! of docs/driver-habits.md that had no test (refused deletes, non-final
//! answers for a claim deleted meanwhile, ids and contexts at the spec's
//! size limits, a repeated `CreateVolume` answered with another size or
//! with ALREADY_EXISTS while the first call still works, a start-up Probe
//! slower than `--timeout`, an error message that is not UTF-8).

mod support;

use std::time::Duration;

use csi_hostpath::faults::{Fault, Faults, Reply};
use kube::api::{Api, DeleteParams};
use kube_testserver::{RequestMatch, Verb};
use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::standard();
    resource_exhausted_on_the_selected_node_reschedules,
    a_retry_sends_the_frozen_request,
);

async fn journal_entries(env: &Env) -> usize {
    env.journal().await.len()
}

/// Killed after the PV was saved but before its journal entry was pruned:
/// the restart prunes the entry and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_pv_is_saved_keeps_the_volume() {
    // Needs the API test server (fault injection or exact counters).
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    // The journal's first write (create) goes through; pruning (an update)
    // hangs, so the kill lands between the saved PV and the pruned entry.
    env.api().add_latency(
        RequestMatch::new(Verb::Update, "configmaps"),
        Duration::from_secs(60),
    );
    env.create_pvc(&env.ns, "kept", "fast", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "kept").await;
    assert_eq!(
        journal_entries(&env).await,
        1,
        "entry written, not yet pruned"
    );
    env.kill_sidecar();
    env.api().clear_faults();

    env.start_sidecar(&[]).await;
    env.wait_for("journal pruned", Duration::from_secs(20), || async {
        (journal_entries(&env).await == 0).then_some(())
    })
    .await;
    let name = pv.metadata.name.clone().expect("name");
    assert!(env.pv(&name).await.is_some(), "PV kept");
    assert_eq!(env.backend_volumes().len(), 1, "volume kept");
    env.assert_consistent().await;
}

/// Killed after DeleteVolume but before the PV object was deleted: the
/// restart repeats the (idempotent) DeleteVolume and finishes.
/// The count of `CreateVolume` calls in the sidecar's metrics.
fn create_volume_calls(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count{"))
        .filter(|l| l.contains("method_name=\"/csi.v1.Controller/CreateVolume\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A pass of the claim after its PV is saved and before the PV watch shows
/// the PV (here the claim's own event; in tests/cancellation.rs, "then
/// continued", the queue's re-add) finds the PV saved: no second journal
/// entry, `CreateVolume` or PV create. The binder is off, so the claim
/// stays unbound and only the PV tells the pass it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_before_the_pv_watch_shows_the_saved_pv_does_not_provision_again() {
    const LAG: Duration = Duration::from_secs(3);
    let mut env = Env::new(Backend::TestServer).await;
    env.api().set_controller_manager(false);
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.lag_watch("persistentvolumes", LAG);
    let port = support::free_port();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    env.start_sidecar(&[http.as_str()]).await;
    // What the PV controller (off) would annotate.
    env.create_pvc(
        &env.ns,
        "data",
        "fast",
        "5Mi",
        json!({"metadata": {"annotations": {
            "volume.kubernetes.io/storage-provisioner": env.driver_name,
            "volume.beta.kubernetes.io/storage-provisioner": env.driver_name,
        }}}),
    )
    .await;
    env.wait_for("the PV saved", Duration::from_secs(20), || async {
        env.pvs().await.into_iter().next()
    })
    .await;
    // Within the lag: the claim's event queues it again.
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(env.client.clone(), &env.ns);
    claims
        .patch(
            "data",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("claim labelled");
    tokio::time::sleep(LAG + Duration::from_secs(1)).await;
    assert!(
        env.api().watch_events_held("persistentvolumes") > 0,
        "the PV watch lagged"
    );
    let (_, metrics) = support::http_get(port, "/metrics").await;
    assert_eq!(
        create_volume_calls(&metrics),
        1,
        "CreateVolume called again for a saved PV\n{}",
        env.logs()
    );
    assert_eq!(
        env.api().request_count(Verb::Create, "persistentvolumes"),
        1,
        "the PV was created again"
    );
    env.clear_watch_lag("persistentvolumes");
    env.api().set_controller_manager(true);
    env.wait_bound(&env.ns, "data").await;
    assert_eq!(env.backend_volumes().len(), 1);
    env.assert_consistent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_delete_volume_finishes_on_restart() {
    // Needs the API test server (fault injection or exact counters).
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "gone", "fast").await;
    env.api().add_latency(
        RequestMatch::new(Verb::Delete, "persistentvolumes"),
        Duration::from_secs(60),
    );
    env.delete_pvc(&env.ns, "gone").await;
    env.wait_for(
        "backend volume deleted",
        Duration::from_secs(20),
        || async { env.backend_volumes().is_empty().then_some(()) },
    )
    .await;
    env.kill_sidecar();
    env.api().clear_faults();
    assert!(env.pv(&name).await.is_some(), "the PV was not deleted yet");

    env.start_sidecar(&[]).await;
    env.wait_for(
        "PV deleted after restart",
        Duration::from_secs(20),
        || async { env.pv(&name).await.is_none().then_some(()) },
    )
    .await;
    env.assert_consistent().await;
}

/// RESOURCE_EXHAUSTED for a claim with a selected node: the annotation is
/// removed so the scheduler can pick another node (upstream behaviour).
async fn resource_exhausted_on_the_selected_node_reschedules(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    env.set_faults(vec![Fault::error(
        "CreateVolume",
        tonic::Code::ResourceExhausted,
    )]);
    env.start_sidecar(&[]).await;
    env.create_pvc(
        &env.ns,
        "late",
        "late",
        "5Mi",
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": env.node.as_str()}}}),
    )
    .await;
    env.wait_for("selected node removed", Duration::from_secs(20), || async {
        let pvc = env.pvc(&env.ns, "late").await?;
        let annotations = pvc.metadata.annotations.unwrap_or_default();
        (!annotations.contains_key("volume.kubernetes.io/selected-node")).then_some(())
    })
    .await;
    assert!(env.backend_volumes().is_empty());
    assert!(env.pvs().await.is_empty());
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        env.client.clone(),
        &env.ns,
    )
    .delete("late", &DeleteParams::default())
    .await
    .expect("delete");
}

/// Upstream #1235: once DeleteVolume succeeded, a retry of the PV (here:
/// deleting the PV object failed) and its update events must not call it
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_volume_is_not_repeated_for_the_following_updates() {
    // Needs the API test server: deleting the PV object is made to fail.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "once", "fast").await;
    env.api()
        .fail_next(2, RequestMatch::new(Verb::Delete, "persistentvolumes"), 500);
    env.delete_pvc(&env.ns, "once").await;
    env.wait_for(
        "backend volume deleted",
        Duration::from_secs(20),
        || async { env.backend_volumes().is_empty().then_some(()) },
    )
    .await;
    // Any further DeleteVolume now fails loudly.
    env.set_faults(vec![Fault::error("DeleteVolume", tonic::Code::Internal)]);
    // Update events on the PV while it is retried.
    for i in 0..3 {
        let patch = json!({"metadata": {"labels": {"touched": format!("{i}")}}});
        let _ = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(env.client.clone())
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.wait_for("PV deleted", Duration::from_secs(20), || async {
        env.pv(&name).await.is_none().then_some(())
    })
    .await;
    let failed = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client.clone(), &env.ns)
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("VolumeFailedDelete"))
        .count();
    assert_eq!(failed, 0, "DeleteVolume was called again\n{}", env.logs());
    env.clear_faults();
}

/// lib #152 / #1465: a retry sends the request of the first attempt, even
/// when the cluster's topology changed meanwhile. Here the only node is
/// relabelled while the first CreateVolume fails slowly; a recomputed
/// request would ask for the new label, which this driver cannot serve.
async fn a_retry_sends_the_frozen_request(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![
        Fault::error("CreateVolume", tonic::Code::Unavailable)
            .with_delay(Duration::from_millis(1500))
            .times(1),
    ]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "frozen", "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "first CreateVolume under way",
        Duration::from_secs(20),
        || async { env.logs().contains("calling CreateVolume").then_some(()) },
    )
    .await;
    let patch = json!({"metadata": {"labels": {csi_hostpath::TOPOLOGY_KEY: "elsewhere"}}});
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .patch(
            env.node.as_str(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("relabel node");
    let pv = env.wait_bound(&env.ns, "frozen").await;
    assert!(
        !env.logs().contains("ResourceExhausted"),
        "a retry asked for the new topology\n{}",
        env.logs()
    );
    let terms = pv
        .spec
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .expect("affinity")
        .node_selector_terms;
    let values = terms[0].match_expressions.as_ref().expect("expressions")[0]
        .values
        .clone()
        .unwrap_or_default();
    assert_eq!(values, vec![env.node.as_str().to_owned()]);
}

// Driver habits of docs/driver-habits.md that had no deterministic test:
// the driver's answer is injected, the sidecar's handling is observed.

/// A `DeleteVolume` the driver refuses with `code` (`FAILED_PRECONDITION`
/// "volume has snapshots", row 8; `NOT_FOUND` from a backend that is only
/// eventually consistent, row 9) is a failed delete: a Warning
/// `VolumeFailedDelete` with the driver's text on the PV, the PV and the
/// volume kept, and asked again until the driver agrees.
async fn a_refused_delete_is_retried_until_the_driver_agrees(code: tonic::Code, message: &str) {
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "refused", "fast").await;
    env.set_faults(vec![
        Fault::error("DeleteVolume", code)
            .with_message(message)
            .times(2),
    ]);
    env.delete_pvc(&env.ns, "refused").await;
    env.wait_for("refusal reported", Duration::from_secs(20), || async {
        env.pv_events(&name)
            .await
            .iter()
            .any(|(reason, m)| reason == "VolumeFailedDelete" && m.contains(message))
            .then_some(())
    })
    .await;
    assert!(
        env.pv(&name).await.is_some(),
        "the PV is kept while the driver refuses\n{}",
        env.logs()
    );
    env.wait_for(
        "volume and PV deleted once the driver agrees",
        Duration::from_secs(30),
        || async {
            (env.backend_volumes().is_empty() && env.pv(&name).await.is_none()).then_some(())
        },
    )
    .await;
    let asked = env.logs().matches("calling DeleteVolume").count();
    assert!(
        asked >= 3,
        "two refusals and the accepted call, asked {asked} times\n{}",
        env.logs()
    );
    env.assert_consistent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_refused_with_failed_precondition_is_retried() {
    a_refused_delete_is_retried_until_the_driver_agrees(
        tonic::Code::FailedPrecondition,
        "volume has snapshots",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_answered_not_found_is_retried() {
    a_refused_delete_is_retried_until_the_driver_agrees(
        tonic::Code::NotFound,
        "volume not found in the backend's database",
    )
    .await;
}

/// A `CreateVolume` answered as `answer` says, with a non-final code
/// (`ABORTED` "operation pending", row 4; `RESOURCE_EXHAUSTED` without a
/// node to reschedule from, row 6; a message that cannot be read, row 13),
/// keeps the request in flight; the claim deleted meanwhile has its request
/// asked again once the driver answers, and the volume that answer made
/// deleted: nothing leaked, the journal empty. Returns the test's `Env`.
async fn a_claim_deleted_while_the_driver_answers_non_final_leaves_nothing(answer: Fault) -> Env {
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![answer]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "pending", "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "CreateVolume answered twice",
        Duration::from_secs(30),
        || async { (env.logs().matches("calling CreateVolume").count() >= 2).then_some(()) },
    )
    .await;
    assert_eq!(
        journal_entries(&env).await,
        1,
        "the request is kept in flight\n{}",
        env.logs()
    );
    env.delete_pvc(&env.ns, "pending").await;
    env.wait_for("claim gone", Duration::from_secs(20), || async {
        env.pvc(&env.ns, "pending").await.is_none().then_some(())
    })
    .await;
    // The driver answers again only once the cleanup of the deleted claim
    // has been answered as `answer` says too. Cleared earlier, a call the claim's
    // own retry sent before the deletion could be answered OK and take the
    // PV's path (saved, then deleted by its reclaim policy) instead of the
    // cleanup's: seen under load, with the log line below missing.
    env.wait_for(
        "the deleted claim's cleanup asked the driver",
        Duration::from_secs(30),
        || async {
            env.logs()
                .contains("cleanup CreateVolume failed")
                .then_some(())
        },
    )
    .await;
    env.clear_faults();
    env.wait_for(
        "the volume made by the answer deleted",
        Duration::from_secs(60),
        || async {
            let deleted = env
                .logs()
                .contains("deleted the volume of a claim deleted during provisioning");
            (deleted && env.backend_volumes().is_empty() && journal_entries(&env).await == 0)
                .then_some(())
        },
    )
    .await;
    assert!(env.pvs().await.is_empty(), "no PV for a deleted claim");
    env.assert_consistent().await;
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_while_the_driver_answers_aborted_leaves_nothing() {
    a_claim_deleted_while_the_driver_answers_non_final_leaves_nothing(Fault::error(
        "CreateVolume",
        tonic::Code::Aborted,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_while_the_driver_answers_resource_exhausted_leaves_nothing() {
    a_claim_deleted_while_the_driver_answers_non_final_leaves_nothing(Fault::error(
        "CreateVolume",
        tonic::Code::ResourceExhausted,
    ))
    .await;
}

/// Row 13: an error whose message is not UTF-8 on the wire (the test
/// driver's `wire_message`: `%E9` is Latin-1 "é"). tonic cannot read it and
/// reports `Unknown`; ours takes it as `Unavailable` (src/csi/mod.rs,
/// `local_failure_as_unavailable`), so even the driver's `INTERNAL`, final
/// when readable, keeps the request in flight: the claim deleted meanwhile
/// has its request asked again once the driver answers readably, and the
/// volume that answer made is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_while_the_driver_answers_an_unreadable_message_leaves_nothing() {
    let env = a_claim_deleted_while_the_driver_answers_non_final_leaves_nothing(
        Fault::error("CreateVolume", tonic::Code::Internal)
            .with_wire_message("erreur de cr%E9ation"),
    )
    .await;
    let unreadable = env.logs().lines().any(|l| {
        l.contains("CreateVolume failed")
            && l.contains("code = Unavailable")
            && l.contains("Error deserializing status message header")
            && l.contains("outcome=\"InBackground\"")
    });
    assert!(
        unreadable,
        "the unreadable answer kept the request in flight\n{}",
        env.logs()
    );
}

/// Row 14: a volume context near the spec's 4 KiB limit for a
/// `map<string,string>` is recorded on the PV whole, and the volume is
/// deleted by its handle as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_context_near_the_spec_limit_is_kept_whole() {
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![Fault::reply(
        "CreateVolume",
        csi_hostpath::faults::Reply {
            padding_bytes: 4000,
            ..Default::default()
        },
    )]);
    env.start_sidecar(&[]).await;
    let (pv, name) = env.provision(&env.ns, "wide", "fast").await;
    let attributes = pv
        .spec
        .and_then(|s| s.csi)
        .and_then(|c| c.volume_attributes)
        .unwrap_or_default();
    let bytes: usize = attributes.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(
        bytes >= 4000,
        "the context reached the PV whole: {bytes} bytes in {:?}",
        attributes.keys().collect::<Vec<_>>()
    );
    env.clear_faults();
    env.delete_pvc(&env.ns, "wide").await;
    env.wait_for("volume and PV deleted", Duration::from_secs(30), || async {
        (env.backend_volumes().is_empty() && env.pv(&name).await.is_none()).then_some(())
    })
    .await;
    env.assert_consistent().await;
}

/// Row 14: a volume id twice the 128 bytes the spec asks plugins to stay
/// within is recorded on the PV whole and handed back whole to
/// `DeleteVolume` (the driver finds its volume by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_id_over_the_spec_limit_is_kept_whole() {
    let mut env = Env::new_with_driver(Backend::TestServer, |c| {
        c.volume_id_format = csi_hostpath::ids::VolumeIdFormat::Long;
    })
    .await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (pv, name) = env.provision(&env.ns, "long", "fast").await;
    let handle = pv
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .unwrap_or_default();
    assert_eq!(
        handle.len(),
        csi_hostpath::ids::LONG_ID_BYTES,
        "the handle is the driver's id whole: {handle}"
    );
    assert_eq!(env.backend_volumes().len(), 1);
    env.delete_pvc(&env.ns, "long").await;
    env.wait_for("volume and PV deleted", Duration::from_secs(30), || async {
        (env.backend_volumes().is_empty() && env.pv(&name).await.is_none()).then_some(())
    })
    .await;
    env.assert_nothing_refused();
}

/// Provisions `claims` claims at once against a driver that takes at most
/// three volume operations at once and refuses the rest with
/// RESOURCE_EXHAUSTED; returns how many calls it refused and the lowest
/// concurrency limit the sidecar reported meanwhile (`None` without the
/// metric).
async fn provision_against_a_choking_backend(
    claims: usize,
    flags: &[&str],
) -> (usize, Option<u64>) {
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults_file(csi_hostpath::faults::Faults {
        busy_above: Some(csi_hostpath::faults::BusyAbove {
            limit: 3,
            code: None,
        }),
        ..csi_hostpath::faults::Faults::with_rules(vec![Fault::delay(
            "CreateVolume",
            Duration::from_millis(200),
        )])
    });
    let port = support::free_port();
    let endpoint = format!("--http-endpoint=127.0.0.1:{port}");
    let mut args = vec![endpoint.as_str()];
    args.extend_from_slice(flags);
    env.start_sidecar(&args).await;
    for i in 0..claims {
        env.create_pvc(&env.ns, &format!("c{i}"), "fast", "5Mi", json!({}))
            .await;
    }
    let lowest: std::sync::Mutex<Option<u64>> = std::sync::Mutex::new(None);
    env.wait_for("every claim bound", Duration::from_secs(120), || async {
        let (_, metrics) = support::http_get(port, "/metrics").await;
        if let Some(limit) = metrics
            .lines()
            .find_map(|l| l.strip_prefix("csi_provisioner_driver_concurrency_limit "))
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            let mut lowest = lowest.lock().expect("lock");
            *lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
        }
        let mut bound = 0;
        for i in 0..claims {
            let phase = env
                .pvc(&env.ns, &format!("c{i}"))
                .await
                .and_then(|c| c.status?.phase);
            bound += usize::from(phase.as_deref() == Some("Bound"));
        }
        (bound == claims).then_some(())
    })
    .await;
    let refused = env.logs().matches("backend busy").count();
    env.assert_consistent().await;
    let lowest = *lowest.lock().expect("lock");
    (refused, lowest)
}

/// Issue 43 part 4, beyond the Go image: a driver that answers
/// RESOURCE_EXHAUSTED when its backend is full gets fewer calls at once
/// (the limit halves, `csi_provisioner_driver_concurrency_limit`), so it is
/// asked in vain far less often than with the limit off, where every retry
/// of every claim reaches it, as with the Go image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_choking_backend_gets_fewer_calls_at_once() {
    let (adaptive, lowest) = provision_against_a_choking_backend(40, &[]).await;
    let (fixed, none) =
        provision_against_a_choking_backend(40, &["--adaptive-concurrency=false"]).await;
    let lowest = lowest.expect("the limit is exported");
    eprintln!(
        "refused calls: {adaptive} with the adaptive limit (lowest {lowest}), {fixed} without"
    );
    assert!(
        lowest <= 6,
        "the limit came down near the driver's 3 (lowest seen {lowest})"
    );
    assert_eq!(none, None, "no limit when it is off");
    assert!(
        adaptive * 2 <= fixed,
        "refused calls: {adaptive} with the adaptive limit, {fixed} without"
    );
}

/// Row 2 (dell/csm#1899: 1.5 GB on the first call, 3 GB on a repeat): the
/// first `CreateVolume` outlives `--timeout` while the backend makes the
/// volume (the test driver's `work_ms`), its answer is lost; the repeat
/// answers twice the size the first would have. The PV records the answer
/// it was built from, the repeat's, as Go's `Provision` does; one volume,
/// and deleting the claim deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_answered_with_another_size_is_recorded_as_answered() {
    const REQUEST: u64 = 5 << 20;
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![
        Fault::work("CreateVolume", Duration::from_secs(3)).times(1),
        Fault::reply(
            "CreateVolume",
            Reply {
                capacity_bytes: Some(2 * REQUEST as i64),
                ..Default::default()
            },
        ),
    ]);
    env.start_sidecar(&["--timeout=2s"]).await;
    let (pv, name) = env.provision(&env.ns, "resized", "fast").await;
    assert!(
        env.logs().contains("no answer within --timeout (2s)"),
        "the first answer was lost to the timeout\n{}",
        env.logs()
    );
    let volumes = env.backend_volumes();
    assert_eq!(volumes.len(), 1, "one volume for both calls");
    assert_eq!(
        volumes[0].capacity_bytes, REQUEST,
        "the backend made the size asked, which the lost first answer carried"
    );
    let recorded = pv
        .spec
        .and_then(|s| s.capacity)
        .and_then(|c| c.get("storage").cloned())
        .expect("PV capacity");
    assert_eq!(
        csi_proto::quantity::parse_quantity(&recorded.0).ok(),
        Some(2 * REQUEST),
        "the PV records the repeat's answer: {recorded:?}"
    );
    env.assert_consistent().await;
    env.delete_pvc(&env.ns, "resized").await;
    env.wait_for("volume and PV deleted", Duration::from_secs(20), || async {
        (env.backend_volumes().is_empty() && env.pv(&name).await.is_none()).then_some(())
    })
    .await;
    env.assert_consistent().await;
}

/// Row 5 (synology-csi#12): the first `CreateVolume` outlives `--timeout`
/// while the backend works on it (`work_ms`), and a repeat meanwhile is
/// answered ALREADY_EXISTS (the test driver's `name_busy`: only while the
/// first call holds the name). Returns once ALREADY_EXISTS was answered.
async fn already_exists_while_the_first_call_works(claim: &str) -> Env {
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults_file(Faults {
        name_busy: Some("ALREADY_EXISTS".to_owned()),
        ..Faults::with_rules(vec![
            Fault::work("CreateVolume", Duration::from_secs(5)).times(1),
        ])
    });
    env.start_sidecar(&["--timeout=2s"]).await;
    env.create_pvc(&env.ns, claim, "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "ALREADY_EXISTS answered to a repeat",
        Duration::from_secs(20),
        || async {
            env.events(&env.ns, claim)
                .await
                .iter()
                .any(|(reason, m)| reason == "ProvisioningFailed" && m.contains("AlreadyExists"))
                .then_some(())
        },
    )
    .await;
    assert!(
        env.backend_volumes().is_empty(),
        "the first call still works\n{}",
        env.logs()
    );
    // The first call may still make the volume: ours keeps the request in
    // flight (src/provision/outcome.rs, `classify_create_volume_error`),
    // where the Go image's `checkError` takes ALREADY_EXISTS as final.
    let kept = env.logs().lines().any(|l| {
        l.contains("CreateVolume failed")
            && l.contains("code = AlreadyExists")
            && l.contains("outcome=\"InBackground\"")
    });
    assert!(
        kept,
        "ALREADY_EXISTS kept the operation in flight\n{}",
        env.logs()
    );
    env
}

/// Row 5: the operation kept in flight after ALREADY_EXISTS, the retry
/// sends the same request again; once the first call's work is done, the
/// driver answers it with the volume that call made, and the claim is
/// bound to that one volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn already_exists_while_the_first_call_works_then_binds_the_one_volume() {
    let env = already_exists_while_the_first_call_works("busy").await;
    let pv = env.wait_bound(&env.ns, "busy").await;
    let volumes = env.backend_volumes();
    assert_eq!(volumes.len(), 1, "one volume for every call");
    let handle = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle);
    assert_eq!(handle.as_deref(), Some(volumes[0].id.as_str()));
    env.wait_for("journal pruned", Duration::from_secs(20), || async {
        (journal_entries(&env).await == 0).then_some(())
    })
    .await;
    env.assert_consistent().await;
}

/// Row 5: the claim deleted after ALREADY_EXISTS, while the first call
/// still works. The volume that call makes once the claim is gone is
/// deleted: the request stayed in flight and journalled, and the cleanup
/// repeats it until the driver answers with the volume. It leaked while
/// ALREADY_EXISTS ended the operation, as the Go image's `checkError` does
/// (docs/driver-habits.md, gap 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn already_exists_while_the_first_call_works_and_the_claim_deleted_leaves_nothing() {
    let env = already_exists_while_the_first_call_works("gone").await;
    env.delete_pvc(&env.ns, "gone").await;
    env.wait_for("claim gone", Duration::from_secs(20), || async {
        env.pvc(&env.ns, "gone").await.is_none().then_some(())
    })
    .await;
    env.wait_for(
        "the first call's volume made",
        Duration::from_secs(20),
        || async { (!env.backend_volumes().is_empty()).then_some(()) },
    )
    .await;
    env.wait_for(
        "the first call's volume deleted",
        Duration::from_secs(20),
        || async {
            (env.backend_volumes().is_empty() && journal_entries(&env).await == 0).then_some(())
        },
    )
    .await;
    assert!(env.pvs().await.is_empty(), "no PV for a deleted claim");
    env.assert_consistent().await;
}

/// Row 11: a `Probe` slower than `--timeout` at start. Its
/// `DeadlineExceeded` is waited out (src/csi/connection.rs,
/// `probe_error_is_transient`), as csi-lib-utils' `ProbeForever` does, and
/// the sidecar provisions once the Probe answers in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_slower_than_the_timeout_at_start_is_waited_out() {
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![
        Fault::delay("Probe", Duration::from_millis(2500)).times(2),
    ]);
    env.start_sidecar(&["--timeout=1s"]).await;
    env.create_pvc(&env.ns, "probed", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "probed").await;
    let log = env.logs();
    let waited = log.lines().position(|l| {
        l.contains("CSI driver is not ready yet")
            && l.contains("code = DeadlineExceeded")
            && l.contains("no answer within --timeout (1s)")
    });
    let ready = log.lines().position(|l| l.contains("CSI driver is ready"));
    assert!(
        matches!((waited, ready), (Some(w), Some(r)) if w < r),
        "waited for the slow Probe, then ready\n{log}"
    );
    let left = Faults::load(&env.driver.faults_file).expect("faults file");
    assert_eq!(left.rules[0].count, Some(0), "both slow Probes were asked");
    env.assert_consistent().await;
}
