//! End-to-end: the real binary against the API test server and the hostpath
//! driver. Every test ends with the backend and the API in agreement.

mod support;

use std::time::Duration;

use csi_hostpath::faults::Fault;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube_testserver::{RequestMatch, Verb};
use serde_json::json;
use support::{Backend, ClusterConfig, Env, FINALIZER, finalizers};

e2e!(ClusterConfig::standard();
    provisions_and_deletes_filesystem_and_block_volumes,
    retain_keeps_the_volume_and_the_pv,
    deleting_the_pv_before_the_claim_does_not_leak,
    existing_pvs_get_the_finalizer_and_a_rollback_removes_it,
    wait_for_first_consumer_waits_for_the_selected_node,
    wait_for_first_consumer_without_the_topology_gate_reads_the_node,
    claim_deleted_during_a_slow_create_leaves_nothing,
    sidecar_killed_during_create_and_claim_deleted_while_down_leaves_nothing,
    final_errors_are_reported_once_and_retried,
    infeasible_requests_wait_for_the_retry_interval_max_or_a_change,
    a_claim_made_before_its_class_is_provisioned_when_the_class_arrives,
    a_class_deleted_while_provisioning_is_in_flight_keeps_the_volume,
    a_node_the_caches_have_not_seen_yet_is_not_rescheduled,
    immediate_topology_per_key_set_offers_every_key_set,
);

async fn provisions_and_deletes_filesystem_and_block_volumes(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class(
        "fast",
        "Immediate",
        "Delete",
        json!({"csi.storage.k8s.io/fstype": "ext4"}),
    )
    .await;
    env.start_sidecar(&[]).await;

    env.create_pvc(&env.ns, "fs", "fast", "10Mi", json!({}))
        .await;
    env.create_pvc(
        &env.ns,
        "raw",
        "fast",
        "20Mi",
        json!({"spec": {"volumeMode": "Block"}}),
    )
    .await;
    let fs = env.wait_bound(&env.ns, "fs").await;
    let raw = env.wait_bound(&env.ns, "raw").await;

    let fs_spec = fs.spec.clone().expect("spec");
    let csi = fs_spec.csi.clone().expect("csi source");
    assert_eq!(csi.driver, env.driver_name.as_str());
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    assert_eq!(
        fs_spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(
        fs_spec.storage_class_name.as_deref(),
        Some(env.class("fast").as_str())
    );
    assert!(
        fs.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("pvc-"))
    );
    assert_eq!(
        fs.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
            .map(String::as_str),
        Some(env.driver_name.as_str())
    );
    assert!(
        finalizers(&fs).contains(&FINALIZER.to_owned()),
        "HonorPVReclaimPolicy finalizer"
    );
    assert_eq!(
        fs_spec
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.as_str()),
        Some("10Mi")
    );
    assert!(
        fs_spec.node_affinity.is_some(),
        "node affinity from accessible topology"
    );
    let raw_spec = raw.spec.clone().expect("spec");
    assert_eq!(raw_spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(
        raw_spec.csi.as_ref().and_then(|c| c.fs_type.clone()),
        None,
        "no fsType for block"
    );
    assert_eq!(env.backend_volumes().len(), 2);
    env.assert_consistent().await;

    // The success event is posted after the PV is saved, with what is left
    // of the API budget: poll for it. A volume made within
    // PROVISIONING_NOTE_DELAY gets only its outcome: the queued
    // `Provisioning` note was superseded (one write saved per volume).
    env.wait_event(&env.ns, "fs", "ProvisioningSucceeded").await;
    tokio::time::sleep(csi_provisioner::events::PROVISIONING_NOTE_DELAY).await;
    let reasons: Vec<String> = env
        .events(&env.ns, "fs")
        .await
        .into_iter()
        .map(|(r, _)| r)
        // (The controller-manager adds its own `ExternalProvisioning`.)
        .filter(|r| r.starts_with("Provisioning"))
        .collect();
    assert_eq!(reasons, ["ProvisioningSucceeded"], "{reasons:?}");

    env.delete_pvc(&env.ns, "fs").await;
    env.delete_pvc(&env.ns, "raw").await;
    env.wait_for("PVs and volumes gone", Duration::from_secs(30), || async {
        (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    // Our finalizer is removed once: no patch follows the one that
    // succeeded (the update events that arrive before the cache has seen
    // the removal once made a second, refused with 422). A patch refused
    // before it is a real race: the cache was stale (e.g. the pv-protection
    // controller had just removed its own finalizer).
    let log = env.sidecar_request_log();
    for pv in [&fs, &raw] {
        let name = pv.metadata.name.clone().expect("name");
        let patches: Vec<u16> = log
            .iter()
            .filter(|(verb, resource, n, _)| {
                verb == "patch" && resource == "persistentvolumes" && *n == name
            })
            .map(|(_, _, _, code)| *code)
            .collect();
        let succeeded = patches.iter().position(|code| *code < 300);
        assert_eq!(
            succeeded.map(|i| i + 1),
            Some(patches.len()),
            "patches of {name}, by status: {patches:?}"
        );
    }
    assert_eq!(
        env.stop_sidecar(),
        Some(0),
        "clean exit on SIGTERM\n{}",
        env.logs()
    );
}

async fn retain_keeps_the_volume_and_the_pv(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("keep", "Immediate", "Retain", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "data", "keep", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    assert!(
        !finalizers(&pv).contains(&FINALIZER.to_owned()),
        "no finalizer for Retain"
    );
    env.delete_pvc(&env.ns, "data").await;
    let name = pv.metadata.name.clone().expect("name");
    env.wait_for("PV released", Duration::from_secs(20), || async {
        let pv = env.pv(&name).await?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(env.pv(&name).await.is_some(), "Retain keeps the PV");
    assert_eq!(env.backend_volumes().len(), 1, "Retain keeps the volume");
    env.assert_consistent().await;
}

/// KEP-2644: deleting the bound PV first, then the claim, must still delete
/// the backend volume and end with both objects gone.
async fn deleting_the_pv_before_the_claim_does_not_leak(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "data", "fast").await;

    Api::<PersistentVolume>::all(env.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete pv");
    let terminating = env.pv(&name).await.expect("kept by the finalizer");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(
        env.backend_volumes().len(),
        1,
        "volume still there while bound"
    );

    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("PV and volume gone", Duration::from_secs(30), || async {
        (env.pv(&name).await.is_none() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    assert!(env.pvc(&env.ns, "data").await.is_none());
}

/// PVs that existed before the sidecar started get the finalizer; with the
/// gate off it is removed again (rollback).
async fn existing_pvs_get_the_finalizer_and_a_rollback_removes_it(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&["--feature-gates=HonorPVReclaimPolicy=false"])
        .await;
    let (pv, name) = env.provision(&env.ns, "old", "fast").await;
    assert!(
        !finalizers(&pv).contains(&FINALIZER.to_owned()),
        "gate off: no finalizer"
    );
    assert_eq!(env.stop_sidecar(), Some(0));

    env.start_sidecar(&[]).await;
    env.wait_for(
        "finalizer added to the existing PV",
        Duration::from_secs(20),
        || async {
            let pv = env.pv(&name).await?;
            finalizers(&pv)
                .contains(&FINALIZER.to_owned())
                .then_some(())
        },
    )
    .await;
    assert_eq!(env.stop_sidecar(), Some(0));

    env.start_sidecar(&["--feature-gates=HonorPVReclaimPolicy=false"])
        .await;
    env.wait_for(
        "finalizer removed on rollback",
        Duration::from_secs(20),
        || async {
            let pv = env.pv(&name).await?;
            (!finalizers(&pv).contains(&FINALIZER.to_owned())).then_some(())
        },
    )
    .await;
    env.assert_consistent().await;
}

/// A 422 on a finalizer patch whose tests hold on the live PV is the API
/// server refusing the result, not a stale cache: a warning event, and no
/// retry until the PV changes. (Before, every 422 was taken for staleness
/// and retried with backoff for ever, without a word.) Test server only:
/// the refusal is injected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_finalizer_patch_is_reported_and_not_retried_blindly() {
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&["--feature-gates=HonorPVReclaimPolicy=false"])
        .await;
    let (_, name) = env.provision(&env.ns, "old", "fast").await;
    assert_eq!(env.stop_sidecar(), Some(0));

    let refusal = RequestMatch::new(Verb::Patch, "persistentvolumes")
        .name(&name)
        .remote();
    env.api().fail_next(u32::MAX, refusal, 422);
    env.start_sidecar(&[]).await;
    env.wait_for(
        "FinalizerPatchRefused event",
        Duration::from_secs(20),
        || async {
            env.pv_events(&name)
                .await
                .iter()
                .any(|(reason, _)| reason == "FinalizerPatchRefused")
                .then_some(())
        },
    )
    .await;
    let patches = env.api().request_count(Verb::Patch, "persistentvolumes");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let retried = env.api().request_count(Verb::Patch, "persistentvolumes") - patches;
    assert!(
        retried <= 1,
        "{retried} more patches of an unchanged PV in 2 s: retried blindly"
    );
    // The PV changes (here: the refusal is lifted and the PV labelled): it
    // is tried again, and the finalizer lands.
    env.api().clear_faults();
    Api::<PersistentVolume>::all(env.client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("label the PV");
    env.wait_for("finalizer added", Duration::from_secs(20), || async {
        let pv = env.pv(&name).await?;
        finalizers(&pv)
            .contains(&FINALIZER.to_owned())
            .then_some(())
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

async fn wait_for_first_consumer_waits_for_the_selected_node(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "late", "late", "5Mi", json!({}))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        env.pvs().await.is_empty(),
        "nothing before the scheduler picks a node"
    );
    assert!(env.backend_volumes().is_empty());

    let api = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        env.client.clone(),
        &env.ns,
    );
    let patch = json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": env.node.as_str()}}});
    api.patch("late", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("select node");
    let pv = env.wait_bound(&env.ns, "late").await;
    let terms = pv
        .spec
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .expect("affinity")
        .node_selector_terms;
    let expr = &terms[0].match_expressions.as_ref().expect("expressions")[0];
    assert_eq!(expr.key, csi_hostpath::TOPOLOGY_KEY);
    assert_eq!(
        expr.values.as_deref(),
        Some(&[env.node.as_str().to_owned()][..])
    );
    env.assert_consistent().await;
}

/// With `Topology=false` no Node is watched, but the node the scheduler
/// selected must still be found (read live, as upstream's library does), or
/// a WaitForFirstConsumer claim was rescheduled for ever (found by
/// tests/parity.rs). A selected node that does not exist is rescheduled.
async fn wait_for_first_consumer_without_the_topology_gate_reads_the_node(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    env.start_sidecar(&["--feature-gates=Topology=false"]).await;
    let selected =
        |node: &str| json!({"metadata": {"annotations": {support::SELECTED_NODE: node}}});
    env.create_pvc(&env.ns, "late", "late", "5Mi", selected(&env.node))
        .await;
    env.create_pvc(&env.ns, "nowhere", "late", "5Mi", selected("no-such-node"))
        .await;
    let pv = env.wait_bound(&env.ns, "late").await;
    assert!(
        pv.spec.and_then(|s| s.node_affinity).is_none(),
        "no topology, no affinity"
    );
    env.wait_for(
        "the claim on a missing node rescheduled",
        Duration::from_secs(20),
        || async {
            let claim = env.pvc(&env.ns, "nowhere").await?;
            let annotations = claim.metadata.annotations.unwrap_or_default();
            (!annotations.contains_key(support::SELECTED_NODE)).then_some(())
        },
    )
    .await;
    let message = env
        .wait_event(&env.ns, "nowhere", "ProvisioningFailed")
        .await;
    assert!(message.contains("no-such-node"), "{message}");
    assert_eq!(env.backend_volumes().len(), 1);
    env.delete_pvc(&env.ns, "nowhere").await;
    env.assert_consistent().await;
}

/// The claim is deleted while a slow CreateVolume runs: the volume that
/// appears afterwards must be deleted. (A CreateVolume slower than
/// PROVISIONING_NOTE_DELAY shows the `Provisioning` note.)
async fn claim_deleted_during_a_slow_create_leaves_nothing(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![Fault::delay("CreateVolume", Duration::from_secs(4))]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "slow", "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "CreateVolume under way",
        Duration::from_secs(20),
        || async {
            env.events(&env.ns, "slow")
                .await
                .iter()
                .any(|(r, _)| r == "Provisioning")
                .then_some(())
        },
    )
    .await;
    env.delete_pvc(&env.ns, "slow").await;
    env.wait_for(
        "the late volume deleted",
        Duration::from_secs(30),
        || async {
            let created_then_deleted = env.backend_volumes().is_empty();
            created_then_deleted.then_some(())
        },
    )
    .await;
    // Give a wrongly saved PV time to show up, then check none did.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(env.backend_volumes().is_empty(), "{}", env.logs());
    assert!(env.pvs().await.is_empty());
    env.assert_consistent().await;
}

/// Creates claim `name` of class `fast` and kills the running sidecar
/// once `CreateVolume` made its volume, before the PV is saved (saving it
/// hangs until then); the faults are cleared after. Test server only.
async fn kill_between_create_volume_and_the_pv(env: &mut Env, name: &str) {
    env.api().add_latency(
        RequestMatch::new(Verb::Create, "persistentvolumes"),
        Duration::from_secs(60),
    );
    env.create_pvc(&env.ns, name, "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "backend volume created",
        Duration::from_secs(20),
        || async { (!env.backend_volumes().is_empty()).then_some(()) },
    )
    .await;
    env.kill_sidecar();
    env.api().clear_faults();
}

/// The sidecar is killed after CreateVolume returned but before the PV is
/// saved, and the claim is deleted while it is down (upstream #486 leaks
/// here): after the restart the volume is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_killed_before_saving_the_pv_and_claim_deleted_while_down_leaks_nothing() {
    // Needs the API test server: saving the PV is made to hang.
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    kill_between_create_volume_and_the_pv(&mut env, "doomed").await;
    env.delete_pvc(&env.ns, "doomed").await;
    assert!(env.pvs().await.is_empty(), "the PV was never saved");

    env.start_sidecar(&[]).await;
    env.wait_for(
        "the orphan deleted after restart",
        Duration::from_secs(30),
        || async { env.backend_volumes().is_empty().then_some(()) },
    )
    .await;
    assert!(env.pvs().await.is_empty());
    env.assert_consistent().await;
}

/// A fresh leader whose claim cache is behind: the sidecar is killed
/// after `CreateVolume` returned and before the PV is saved, and the
/// next one starts on an API server that cannot stream lists, so its
/// first list of claims comes from the API server's watch cache
/// (`resourceVersion=0`), which here still lacks the claim, and the watch
/// that would bring it lags. The journal's replay finds the claim missing
/// from the cache: it must read the claim live and provision it with the
/// volume already made, never delete that volume (docs/design.md,
/// "Reading current state", row 7). Test server only: a real API server
/// cannot be made to answer a stale list on demand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_leader_whose_claim_list_is_stale_keeps_the_volume_in_flight() {
    const LAG: Duration = Duration::from_secs(8);
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    // The watch cache's picture: before the claim exists.
    env.api().serve_stale_lists("persistentvolumeclaims");
    kill_between_create_volume_and_the_pv(&mut env, "data").await;
    let made = env.backend_volumes()[0].id.clone();
    assert!(env.pvs().await.is_empty(), "the PV was never saved");
    assert_eq!(env.journal().await.len(), 1, "the operation is journalled");

    // No streaming lists (the WatchList feature off): the claims' first
    // list is a `resourceVersion=0` list, answered from the stale picture.
    env.api().fail_next(
        1,
        RequestMatch::new(Verb::Watch, "persistentvolumeclaims"),
        422,
    );
    env.lag_watch("persistentvolumeclaims", LAG);
    env.start_sidecar(&[]).await;
    let started = std::time::Instant::now();
    let mut bound = None;
    while started.elapsed() < LAG + Duration::from_secs(20) {
        assert!(
            env.backend_volumes().iter().any(|v| v.id == made),
            "the volume of a claim that exists was deleted {:?} after the restart\n{}",
            started.elapsed(),
            env.logs()
        );
        if let Some(pv) = env.pvs().await.into_iter().next() {
            bound = Some(pv);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pv = bound.unwrap_or_else(|| panic!("no PV saved\n{}", env.logs()));
    assert!(
        env.api()
            .requests()
            .iter()
            .any(|r| r.verb == Verb::List && r.resource == "persistentvolumeclaims"),
        "the restarted sidecar listed the claims (no streaming list)"
    );
    assert!(
        env.logs()
            .contains("the claim of an operation in flight is not in the cache but exists"),
        "the replay met the claim missing from the cache\n{}",
        env.logs()
    );
    assert_eq!(
        pv.spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.as_str()),
        Some(made.as_str()),
        "the PV holds the volume made before the kill"
    );
    env.api().serve_current_lists("persistentvolumeclaims");
    env.clear_watch_lag("persistentvolumeclaims");
    env.wait_bound(&env.ns, "data").await;
    assert_eq!(env.backend_volumes().len(), 1);
    env.assert_consistent().await;
}

/// Killed while CreateVolume runs, claim deleted while down: the restarted
/// sidecar resumes the journalled operation and ends with nothing left,
/// whether or not the driver finished the volume.
async fn sidecar_killed_during_create_and_claim_deleted_while_down_leaves_nothing(
    backend: Backend,
) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![Fault::delay("CreateVolume", Duration::from_secs(4))]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "doomed", "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "CreateVolume under way",
        Duration::from_secs(20),
        || async {
            env.events(&env.ns, "doomed")
                .await
                .iter()
                .any(|(r, _)| r == "Provisioning")
                .then_some(())
        },
    )
    .await;
    env.kill_sidecar();
    env.delete_pvc(&env.ns, "doomed").await;
    env.clear_faults();
    let journal = env.journal().await;
    assert_eq!(
        journal.len(),
        1,
        "journal written before CreateVolume: {journal:?}"
    );

    env.start_sidecar(&[]).await;
    env.wait_for("journal emptied", Duration::from_secs(30), || async {
        env.journal().await.is_empty().then_some(())
    })
    .await;
    assert!(env.backend_volumes().is_empty(), "{}", env.logs());
    assert!(env.pvs().await.is_empty());
    env.assert_consistent().await;
}

/// A final error is reported once and retried; the claim is provisioned once
/// the driver recovers.
async fn final_errors_are_reported_once_and_retried(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![
        Fault::error("CreateVolume", tonic::Code::Internal).times(5),
    ]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "flaky", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "flaky").await;
    let failed: Vec<_> = env
        .events(&env.ns, "flaky")
        .await
        .into_iter()
        .filter(|(r, _)| r == "ProvisioningFailed")
        .collect();
    assert_eq!(
        failed.len(),
        1,
        "one event for five identical failures: {failed:?}"
    );
    // v6's wording: the driver's error alone, no StorageClass prefix.
    assert!(
        failed[0]
            .1
            .starts_with("rpc error: code = Internal desc = "),
        "{failed:?}"
    );
    env.assert_consistent().await;
}

/// Upstream 6.x's slow retry: a request the driver refused as infeasible
/// (`InvalidArgument`) is tried again only after `--retry-interval-max`,
/// unless the claim changes, which is tried at once.
async fn infeasible_requests_wait_for_the_retry_interval_max_or_a_change(backend: Backend) {
    const MAX: Duration = Duration::from_secs(4);
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![
        Fault::error("CreateVolume", tonic::Code::InvalidArgument)
            .with_message("size not supported")
            .times(2),
    ]);
    // The harness's 100ms backoff would retry ~10 times in the window
    // below; the later --retry-interval-max wins, as with Go flags.
    env.start_sidecar(&["--retry-interval-max=4s"]).await;
    env.create_pvc(&env.ns, "odd", "fast", "5Mi", json!({}))
        .await;
    let attempts = |env: &Env| env.logs().matches("calling CreateVolume").count();
    env.wait_for("the infeasible event", Duration::from_secs(10), || async {
        env.events(&env.ns, "odd")
            .await
            .into_iter()
            .find(|(reason, _)| reason == "ProvisioningFailed")
    })
    .await;
    let failed: Vec<_> = env
        .events(&env.ns, "odd")
        .await
        .into_iter()
        .filter(|(reason, _)| reason == "ProvisioningFailed")
        .collect();
    assert_eq!(
        failed[0].1,
        "Volume provisioning failed with infeasible error. Retries will be delayed. \
         rpc error: code = InvalidArgument desc = size not supported"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(attempts(&env), 1, "retried early:\n{}", env.logs());

    // A change of the claim is tried at once (and fails once more).
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(env.client.clone(), &env.ns);
    claims
        .patch(
            "odd",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"example.com/fixed": "yes"}}})),
        )
        .await
        .expect("annotate");
    env.wait_for(
        "a retry after the change",
        Duration::from_secs(2),
        || async { (attempts(&env) == 2).then_some(()) },
    )
    .await;
    let second = std::time::Instant::now();

    // The third attempt waits the full interval after the second, then
    // succeeds.
    env.wait_for(
        "a retry after the interval",
        Duration::from_secs(10),
        || async { (attempts(&env) == 3).then_some(()) },
    )
    .await;
    let waited = second.elapsed();
    assert!(
        waited >= MAX - Duration::from_millis(600),
        "retried after {waited:?}:\n{}",
        env.logs()
    );
    env.wait_bound(&env.ns, "odd").await;
    env.assert_consistent().await;
}

/// A claim created before its StorageClass waits for it, retried with
/// backoff; when the class arrives it is provisioned at once, not at its
/// next retry (a class handler queues the claims that name it).
async fn a_claim_made_before_its_class_is_provisioned_when_the_class_arrives(backend: Backend) {
    let mut env = Env::new(backend).await;
    // Slow retries, so that the next one is far off when the class comes.
    env.start_sidecar(&["--retry-interval-start=5s", "--retry-interval-max=60s"])
        .await;
    // Annotated for the driver, as the PV binder leaves a claim whose
    // class was deleted and is being re-created (a claim without the
    // annotation waits for the binder, not for us).
    env.create_pvc(
        &env.ns,
        "early",
        "late-class",
        "5Mi",
        json!({"metadata": {"annotations": {
            "volume.kubernetes.io/storage-provisioner": env.driver_name.as_str()}}}),
    )
    .await;
    // First attempt at once, the first retry after 5 s, the next 10 s
    // later: the class arrives between the two.
    tokio::time::sleep(Duration::from_secs(6)).await;
    env.storage_class("late-class", "Immediate", "Delete", json!({}))
        .await;
    let created = std::time::Instant::now();
    env.wait_for("provisioned", Duration::from_secs(5), || async {
        let pvc = env.pvc(&env.ns, "early").await?;
        pvc.spec?
            .volume_name
            .filter(|name| !name.is_empty())
            .map(|_| ())
    })
    .await;
    assert!(created.elapsed() < Duration::from_secs(5));
    env.delete_pvc(&env.ns, "early").await;
    env.wait_for("deleted", Duration::from_secs(30), || async {
        env.backend_volumes().is_empty().then_some(())
    })
    .await;
}

/// The claim's class is deleted while its `CreateVolume` is in flight (it
/// timed out: the driver may be making the volume). The claim still wants
/// its volume: upstream answers a missing class with an error and a retry,
/// and so do we; cleaning up, as for a claim that is no longer ours, would
/// delete the volume of a claim that still exists (docs/design.md,
/// "Reading current state", row 3). Once the class is back, the claim is
/// provisioned with that very volume.
async fn a_class_deleted_while_provisioning_is_in_flight_keeps_the_volume(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.run_driver_as_process().await;
    // The driver makes the volume and dies before it answers: the
    // operation stays in flight (Unavailable is not final).
    env.set_faults(vec![
        Fault::exit_after_backend_change("CreateVolume").times(1),
    ]);
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    env.wait_driver_exited().await;
    assert_eq!(env.backend_volumes().len(), 1, "the volume was made");
    // The class goes while the driver is down; it comes back up.
    env.delete("storage.k8s.io/v1", "StorageClass", "", &env.class("fast"))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.start_driver();
    let volume = env.backend_volumes()[0].id.clone();
    // Retries go on (the harness retries within a second): none may clean up.
    let quiet = std::time::Instant::now();
    while quiet.elapsed() < Duration::from_secs(6) {
        assert!(
            env.backend_volumes().iter().any(|v| v.id == volume),
            "({}) the volume of a claim that still exists was deleted {:?} after its class \
             went\n{}",
            env.backend_name(),
            quiet.elapsed(),
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    assert_eq!(
        pv.spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.as_str()),
        Some(volume.as_str()),
        "provisioned with the volume made while the class was gone"
    );
    assert_eq!(env.backend_volumes().len(), 1);
    let name = pv.metadata.name.clone().expect("PV name");
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("deleted", Duration::from_secs(30), || async {
        (env.pv(&name).await.is_none() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    env.assert_consistent().await;
}

/// The scheduler picks a node that joined a moment ago; the sidecar's Node
/// and CSINode watches have not brought it yet (their events lagged). The
/// claim must not be sent back to the scheduler (its selected-node
/// annotation removed) on the word of those caches: before a reschedule
/// the selected node is read live (docs/design.md, "Reading current
/// state", row 8).
async fn a_node_the_caches_have_not_seen_yet_is_not_rescheduled(backend: Backend) {
    const LAG: Duration = Duration::from_secs(6);
    let mut env = Env::new(backend).await;
    env.storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    env.through_lag_proxy();
    env.start_sidecar(&[]).await;
    // Its caches filled first (their lists come on the watches too).
    env.wait_for("the sidecar working", Duration::from_secs(30), || async {
        env.logs()
            .contains("provisioning loop running")
            .then_some(())
    })
    .await;
    env.lag_watch("nodes", LAG);
    env.lag_watch("csinodes", LAG);
    let node = format!("joined-{}", env.id);
    env.add_node(&node).await;
    env.create_pvc(
        &env.ns,
        "late",
        "late",
        "5Mi",
        json!({"metadata": {"annotations": {support::SELECTED_NODE: node.as_str()}}}),
    )
    .await;
    // Bound well before the lag ends: planned with the node read live.
    let started = std::time::Instant::now();
    env.wait_bound(&env.ns, "late").await;
    let claim = env.pvc(&env.ns, "late").await.expect("claim");
    assert_eq!(
        claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(support::SELECTED_NODE))
            .map(String::as_str),
        Some(node.as_str()),
        "({}) the claim was rescheduled\n{}",
        env.backend_name(),
        env.logs()
    );
    assert!(
        started.elapsed() < LAG,
        "({}) bound only after the caches caught up ({:?})\n{}",
        env.backend_name(),
        started.elapsed(),
        env.logs()
    );
    assert!(env.watch_events_held("nodes") + env.watch_events_held("csinodes") > 0);
    // (The test driver puts every volume on its own node, whatever the
    // request prefers: the PV's affinity says nothing here.)
    env.clear_watch_lag("nodes");
    env.clear_watch_lag("csinodes");
    env.delete_pvc(&env.ns, "late").await;
    env.delete("storage.k8s.io/v1", "CSINode", "", &node).await;
    env.delete("v1", "Node", "", &node).await;
}

/// `--immediate-topology-per-key-set` (beyond the Go image, upstream
/// #1582/#1589): nodes registered different key sets for the driver (this
/// test's node the driver's key K, a second node K and a region key R, a
/// third R only). Each Immediate claim is asked with the terms of every key
/// set, the same for every claim, where the Go image takes the keys of one
/// CSINode found first (K, {K, R} or R: never a mix), and its preferred
/// list is that requisite rotated by the claim's StatefulSet-aware hash.
/// The requests are held in flight (the driver unavailable) and read from
/// the journal, which freezes them.
async fn immediate_topology_per_key_set_offers_every_key_set(backend: Backend) {
    use std::collections::{BTreeMap, BTreeSet};
    let mut env = Env::new(backend).await;
    let k = env.driver.topology_key.clone();
    let region = format!("e2e.csi-provisioner-rs/region-{}", env.id);
    let zoned = format!("zoned-{}", env.id);
    let regional = format!("regional-{}", env.id);
    for (name, labels, keys) in [
        (
            &zoned,
            json!({k.as_str(): zoned.as_str(), region.as_str(): "r1"}),
            json!([k.as_str(), region.as_str()]),
        ),
        (
            &regional,
            json!({region.as_str(): "r2"}),
            json!([region.as_str()]),
        ),
    ] {
        env.create(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels}}))
            .await;
        env.create(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": name},
            "spec": {"drivers": [{"name": env.driver_name, "nodeID": name, "topologyKeys": keys}]}}))
            .await;
    }
    env.storage_class("spread", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![Fault::error("CreateVolume", tonic::Code::Unavailable)]);
    env.start_sidecar(&["--immediate-topology-per-key-set"])
        .await;
    let claims = ["data-web-0", "data-web-1", "data-web-2"];
    for claim in claims {
        env.create_pvc(&env.ns, claim, "spread", "5Mi", json!({}))
            .await;
    }
    let requests = env
        .wait_for(
            "three requests in flight",
            Duration::from_secs(30),
            || async {
                let entries = env.journal_entries().await;
                (entries.len() == 3).then_some(entries)
            },
        )
        .await;

    let segments = |t: &csi_proto::v1::Topology| -> BTreeMap<String, String> {
        t.segments.clone().into_iter().collect()
    };
    let term = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    // This test's terms (a real cluster's other nodes carry K too).
    let ours = |t: &BTreeMap<String, String>| {
        t.iter().all(|(key, value)| {
            *key == region || [env.node.as_str(), zoned.as_str()].contains(&value.as_str())
        })
    };
    let expected: BTreeSet<BTreeMap<String, String>> = [
        term(&[(&k, &env.node)]),
        term(&[(&k, &zoned)]),
        term(&[(&region, "r1")]),
        term(&[(&region, "r2")]),
        term(&[(&k, &zoned), (&region, "r1")]),
    ]
    .into_iter()
    .collect();
    let mut requisites = BTreeSet::new();
    for (entry, request) in requests.into_values() {
        let claim = entry.name.clone();
        let requirement = request
            .accessibility_requirements
            .as_ref()
            .unwrap_or_else(|| panic!("{claim}: no accessibility requirements"));
        let requisite: Vec<_> = requirement.requisite.iter().map(segments).collect();
        let own: BTreeSet<_> = requisite.iter().filter(|t| ours(t)).cloned().collect();
        assert_eq!(own, expected, "{claim}: every key set's terms");
        if !env.is_real() {
            assert_eq!(requisite.len(), expected.len(), "{claim}: {requisite:?}");
        }
        let (hash, index) = csi_provisioner::provision::pvc_name_hash_and_index(&claim);
        let shift = (hash.wrapping_add(index) % requisite.len() as u32) as usize;
        let rotated: Vec<_> = requisite[shift..]
            .iter()
            .chain(&requisite[..shift])
            .cloned()
            .collect();
        let preferred: Vec<_> = requirement.preferred.iter().map(segments).collect();
        assert_eq!(preferred, rotated, "{claim}: preferred");
        requisites.insert(requisite);
    }
    eprintln!(
        "({}) requisite with --immediate-topology-per-key-set: {:?}",
        env.backend_name(),
        requisites
    );
    if !env.is_real() {
        assert_eq!(requisites.len(), 1, "the same for every claim");
    }

    env.clear_faults();
    for claim in claims {
        env.wait_bound(&env.ns, claim).await;
    }
    env.assert_consistent().await;
    for claim in claims {
        env.delete_pvc(&env.ns, claim).await;
    }
    env.wait_for("PVs and volumes gone", Duration::from_secs(30), || async {
        (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    for name in [&zoned, &regional] {
        env.delete("storage.k8s.io/v1", "CSINode", "", name).await;
        env.delete("v1", "Node", "", name).await;
    }
}
