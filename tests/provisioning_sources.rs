//! End-to-end: data sources (clone, snapshot restore), a driver that is down
//! at start, a volume still attached at deletion (also while its attachment
//! is still on its way to the sidecar's cache), and a PV name taken by
//! another claim (upstream #1469).

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use csi_hostpath::ContentSource;
use csi_proto::v1::CreateSnapshotRequest;
use csi_proto::v1::controller_client::ControllerClient;
use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::standard();
    a_clone_copies_its_source_and_protects_it_meanwhile,
    a_driver_down_at_start_is_waited_for,
    a_volume_still_attached_waits_for_the_detach,
    an_attachment_still_in_flight_to_the_cache_holds_the_delete,
    a_reclaim_policy_changed_after_the_release_is_honoured,
    without_attach_support_volume_attachments_are_ignored,
    a_pv_name_taken_by_another_claim_does_not_leak_the_new_volume,
);

const CLONE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";

fn handle(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("csi handle")
}

/// Waits for the one `VolumeFailedDelete` warning of a PV still attached
/// to the env's node (upstream #1574's wording).
async fn detach_wait_reported(env: &Env, pv: &str, timeout: Duration) {
    let expected = format!(
        "persistentvolume {pv} is still attached to node {}",
        env.node
    );
    env.wait_for("detach wait reported", timeout, || async {
        env.pv_events(pv)
            .await
            .iter()
            .any(|(reason, m)| reason == "VolumeFailedDelete" && *m == expected)
            .then_some(())
    })
    .await;
}

/// Deletes the VolumeAttachment `attachment` and waits until the PV `pv`
/// and every backend volume are gone.
async fn detach_and_wait_for_the_deletion(env: &Env, attachment: &str, pv: &str) {
    env.delete("storage.k8s.io/v1", "VolumeAttachment", "", attachment)
        .await;
    env.wait_for(
        "deleted after the detach",
        Duration::from_secs(30),
        || async { (env.pv(pv).await.is_none() && env.backend_volumes().is_empty()).then_some(()) },
    )
    .await;
}

async fn a_clone_copies_its_source_and_protects_it_meanwhile(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "source", "fast", "5Mi", json!({}))
        .await;
    let source = env.wait_bound(&env.ns, "source").await;
    let source_handle = handle(&source);
    std::fs::write(
        csi_hostpath::volume_path(&env.driver.state_dir, &source_handle).join("data.txt"),
        "hello",
    )
    .expect("write into the source volume");

    // A slow CreateVolume leaves time to see the source protected.
    env.set_faults(vec![csi_hostpath::faults::Fault::delay(
        "CreateVolume",
        Duration::from_secs(1),
    )]);
    env.create_pvc(
        &env.ns,
        "copy",
        "fast",
        "5Mi",
        json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "source"}}}),
    )
    .await;
    env.wait_for(
        "clone source protected",
        Duration::from_secs(20),
        || async {
            let pvc = env.pvc(&env.ns, "source").await?;
            pvc.metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f == CLONE_FINALIZER)
                .then_some(())
        },
    )
    .await;
    let copy = env.wait_bound(&env.ns, "copy").await;
    env.clear_faults();
    let copy_handle = handle(&copy);
    let record = env
        .backend_volumes()
        .into_iter()
        .find(|v| v.id == copy_handle)
        .expect("clone on the backend");
    assert_eq!(
        record.content_source,
        Some(ContentSource::Volume { id: source_handle })
    );
    let copied = std::fs::read_to_string(
        csi_hostpath::volume_path(&env.driver.state_dir, &copy_handle).join("data.txt"),
    )
    .expect("data copied");
    assert_eq!(copied, "hello");
    env.wait_for(
        "source protection removed",
        Duration::from_secs(20),
        || async {
            let pvc = env.pvc(&env.ns, "source").await?;
            (!pvc
                .metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f == CLONE_FINALIZER))
            .then_some(())
        },
    )
    .await;
    env.assert_consistent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_restored_through_its_bound_content() {
    // Needs the API test server (fault injection or exact counters).
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "source", "fast", "5Mi", json!({}))
        .await;
    let source = env.wait_bound(&env.ns, "source").await;

    // The snapshot controller's part: a CSI snapshot, its content and the
    // VolumeSnapshot bound to it.
    let channel = csi_proto::transport::connect_unix(&env.driver.endpoint)
        .await
        .expect("connect");
    let snapshot = ControllerClient::new(channel)
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: handle(&source),
            name: "snap-1".into(),
            secrets: HashMap::new(),
            parameters: HashMap::new(),
        })
        .await
        .expect("snapshot")
        .into_inner()
        .snapshot
        .expect("snapshot");
    let mut vs = env
        .api()
        .create_object(
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": "snap", "namespace": &env.ns},
            "spec": {"source": {"persistentVolumeClaimName": "source"}}}),
        )
        .expect("snapshot object");
    let vs_uid = vs["metadata"]["uid"].as_str().expect("uid").to_owned();
    let mut content = env
        .api()
        .create_object(
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": "content-1"},
            "spec": {"driver": env.driver_name.as_str(), "deletionPolicy": "Delete",
                     "source": {"snapshotHandle": snapshot.snapshot_id},
                     "volumeSnapshotRef": {"namespace": &env.ns, "name": "snap", "uid": vs_uid}}}),
        )
        .expect("content");
    content["status"] = json!({"snapshotHandle": snapshot.snapshot_id, "readyToUse": true,
        "restoreSize": snapshot.size_bytes});
    env.api()
        .update_object_status(content)
        .expect("content status");
    vs["status"] = json!({"boundVolumeSnapshotContentName": "content-1", "readyToUse": true,
        "restoreSize": "5Mi"});
    env.api().update_object_status(vs).expect("snapshot status");

    env.create_pvc(
        &env.ns,
        "restored",
        "fast",
        "5Mi",
        json!({"spec": {"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}}}),
    )
    .await;
    let restored = env.wait_bound(&env.ns, "restored").await;
    let record = env
        .backend_volumes()
        .into_iter()
        .find(|v| v.id == handle(&restored))
        .expect("restored volume");
    assert_eq!(
        record.content_source,
        Some(ContentSource::Snapshot {
            id: snapshot.snapshot_id
        })
    );
    env.assert_consistent().await;
}

async fn a_driver_down_at_start_is_waited_for(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.stop_driver().await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "early", "fast", "5Mi", json!({}))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(env.pvs().await.is_empty(), "nothing without a driver");
    assert!(
        env.sidecar.as_mut().expect("sidecar").is_running(),
        "the sidecar waits instead of exiting\n{}",
        env.logs()
    );
    env.start_driver();
    env.wait_bound(&env.ns, "early").await;
    assert!(
        env.logs().contains("socket does not exist yet"),
        "{}",
        env.logs()
    );
    env.assert_consistent().await;
}

/// Upstream #1574: with a driver that attaches volumes
/// (PUBLISH_UNPUBLISH_VOLUME), a Released volume still attached to a node is
/// not deleted: a Warning `VolumeFailedDelete` with upstream's wording, once
/// for the whole wait (not once per retry), and deleted once detached.
async fn a_volume_still_attached_waits_for_the_detach(backend: Backend) {
    let mut env = Env::new_with_driver(backend, |c| c.controller_publish = true).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "data", "fast").await;
    env.create(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": format!("attachment-{}", env.id)},
        "spec": {"attacher": env.driver_name.as_str(), "nodeName": env.node.as_str(),
                 "source": {"persistentVolumeName": name}}}),
    )
    .await;
    env.delete_pvc(&env.ns, "data").await;
    detach_wait_reported(&env, &name, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.backend_volumes().len(), 1, "not deleted while attached");
    let waits = env
        .pv_events(&name)
        .await
        .into_iter()
        .filter(|(_, m)| m.contains("still attached"))
        .count();
    assert_eq!(waits, 1, "one event for the whole wait, not one per retry");

    detach_and_wait_for_the_deletion(&env, &format!("attachment-{}", env.id), &name).await;
}

/// Deletes a claim beside an attachment created first, so its check
/// needs a live read: the first one lists and learns, with a catch-up
/// beside it, whether this server gets there; waits for that to end (the
/// later checks catch up where it did: the lagged delete of
/// [`an_attachment_still_in_flight_to_the_cache_holds_the_delete`] on the
/// test server and on etcd 3.5).
async fn learn_whether_catch_ups_reach(env: &Env) {
    let (warm_pv, warm) = env.provision(&env.ns, "warm-up", "fast").await;
    let warm_volume = handle(&warm_pv);
    let attachment = format!("warm-up-{}", env.id);
    env.create(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": attachment},
        "spec": {"attacher": env.driver_name.as_str(), "nodeName": env.node.as_str(),
                 "source": {"persistentVolumeName": "some-other-pv"}}}),
    )
    .await;
    env.delete_pvc(&env.ns, "warm-up").await;
    env.wait_for(
        "the warm-up volume deleted",
        Duration::from_secs(30),
        || async {
            (env.pv(&warm).await.is_none()
                && !env.backend_volumes().iter().any(|v| v.id == warm_volume))
            .then_some(())
        },
    )
    .await;
    env.wait_for(
        "the catch-up beside the first check to end",
        Duration::from_secs(10),
        || async {
            let logs = env.logs();
            (logs.contains(CATCH_UPS_REACH) || logs.contains(CATCH_UPS_SHORT)).then_some(())
        },
    )
    .await;
    env.delete("storage.k8s.io/v1", "VolumeAttachment", "", &attachment)
        .await;
}

/// The sidecar's lines when a catch-up reached its target, and when one
/// ended short.
const CATCH_UPS_REACH: &str = "reached its current revision: checking attachments with catch-ups";
const CATCH_UPS_SHORT: &str = "did not reach its current revision";

/// The attachment check at no list's cost (row 1 of "Reading current
/// state", docs/design.md): nothing attaches or detaches while the claims
/// are deleted, so the attachment watch is quiet and its cache never
/// reaches the PVs' revisions. The first check lists, and a catch-up (a
/// consistent `LIST ?limit=1` and a short watch from the cache's revision,
/// ended by a bookmark at or past it) beside it learns that this server
/// gets there; from then on the check catches up instead of listing every
/// VolumeAttachment, and still finds the attachment. On the real cluster
/// this needs etcd 3.5 (progress requests): on the 3.4 of `../shared/k8s`
/// the catch-up ends short and the check lists, which the other tests
/// here cover.
async fn a_quiet_attachment_watch_is_caught_up_without_a_list(backend: Backend) {
    let mut env = Env::new_with_driver(backend, |c| c.controller_publish = true).await;
    if env.plane().is_none() {
        // Bookmarks about once a minute, as from kube-apiserver (this
        // server's default, 1 s, would bring the cache to the PVs'
        // revisions within the check's wait now and then).
        env.api().set_bookmark_interval(Duration::from_secs(60));
    }
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let port = support::free_port();
    env.start_sidecar(&[&format!("--http-endpoint=127.0.0.1:{port}")])
        .await;
    let (_, attached) = env.provision(&env.ns, "attached", "fast").await;
    let live_reads = || async {
        let (_, metrics) = support::http_get(port, "/metrics").await;
        let count = |what: &str| -> u64 {
            let series = format!("csi_provisioner_live_reads_total{{what=\"{what}\"}} ");
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&series))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (
            count("catch up volumeattachments"),
            count("list volumeattachments"),
        )
    };

    // The first check: a list, and a catch-up beside it that learns.
    learn_whether_catch_ups_reach(&env).await;
    assert!(
        env.logs().contains(CATCH_UPS_REACH),
        "({}) the catch-up beside the first check did not reach its target\n{}",
        env.backend_name(),
        env.logs()
    );
    let (catch_ups, lists) = live_reads().await;
    assert!(
        lists >= 1,
        "({}) the first check did not list: it did not need a live read, so this \
         test did not test the catch-up\n{}",
        env.backend_name(),
        env.logs()
    );

    // The next check catches up, and lists nothing.
    let attachment = format!("attachment-{}", env.id);
    env.create(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": attachment},
        "spec": {"attacher": env.driver_name.as_str(), "nodeName": env.node.as_str(),
                 "source": {"persistentVolumeName": attached}}}),
    )
    .await;
    env.delete_pvc(&env.ns, "attached").await;
    detach_wait_reported(&env, &attached, Duration::from_secs(30)).await;
    assert!(
        env.pv(&attached).await.is_some(),
        "not deleted while attached"
    );
    let (catch_ups_after, lists_after) = live_reads().await;
    assert!(
        catch_ups_after > catch_ups,
        "({}) the check never caught up: the cache reached the PV's revision, so this \
         test did not test the catch-up\n{}",
        env.backend_name(),
        env.logs()
    );
    assert_eq!(
        lists_after,
        lists,
        "({}) a catch-up ended short and the check listed every VolumeAttachment\n{}",
        env.backend_name(),
        env.logs()
    );

    detach_and_wait_for_the_deletion(&env, &attachment, &attached).await;
}

mod a_quiet_attachment_watch_is_caught_up_without_a_list {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn test_server() {
        super::a_quiet_attachment_watch_is_caught_up_without_a_list(Backend::TestServer).await
    }
}

/// The attachment check's catch-up on the real API server: a control plane
/// of its own on etcd 3.5 (progress requests), shared by these tests.
mod etcd_3_5 {
    use super::*;

    fn backend(test: &str) -> Option<Backend> {
        let etcd = controlplane::etcd35(test)?;
        Backend::real(&ClusterConfig::standard().with_etcd(&etcd), test)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quiet_attachment_watch_is_caught_up_without_a_list() {
        if let Some(backend) = backend(concat!(
            module_path!(),
            "::a_quiet_attachment_watch_is_caught_up_without_a_list"
        )) {
            super::a_quiet_attachment_watch_is_caught_up_without_a_list(backend).await
        }
    }

    /// The lag proxy holds the catch-up's watch as it holds the cache's:
    /// the catch-up ends at a bookmark only behind every held event.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_attachment_still_in_flight_to_the_cache_holds_the_delete() {
        if let Some(backend) = backend(concat!(
            module_path!(),
            "::an_attachment_still_in_flight_to_the_cache_holds_the_delete"
        )) {
            super::an_attachment_still_in_flight_to_the_cache_holds_the_delete(backend).await
        }
    }
}

/// The sidecar's watches of different kinds are not ordered with each
/// other: a VolumeAttachment created just before its claim is deleted can
/// reach the sidecar's cache after the release of the PV (CI once saw
/// DeleteVolume of an attached volume that way). Here the VolumeAttachment
/// watch lags 3 s (the test server holds its events; on the real cluster a
/// proxy in front of the API server does): the volume must still wait for
/// the detach, for longer than the lag, with the same event as when the
/// cache already knew the attachment.
async fn an_attachment_still_in_flight_to_the_cache_holds_the_delete(backend: Backend) {
    const LAG: Duration = Duration::from_secs(3);
    const WATCHED: &str = "volumeattachments";
    let mut env = Env::new_with_driver(backend, |c| c.controller_publish = true).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    if env.plane().is_none() {
        // Bookmarks about once a minute, as from kube-apiserver, so the
        // warm-up below needs a live read.
        env.api().set_bookmark_interval(Duration::from_secs(60));
    }
    // The real cluster's sidecar talks through the lag proxy from the start.
    env.through_lag_proxy();
    env.start_sidecar(&[]).await;
    let (pv, name) = env.provision(&env.ns, "data", "fast").await;
    let volume = handle(&pv);
    learn_whether_catch_ups_reach(&env).await;

    env.lag_watch(WATCHED, LAG);
    let attachment = format!("attachment-{}", env.id);
    env.create(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": attachment},
        "spec": {"attacher": env.driver_name.as_str(), "nodeName": env.node.as_str(),
                 "source": {"persistentVolumeName": name}}}),
    )
    .await;
    env.delete_pvc(&env.ns, "data").await;
    let deleted_claim = Instant::now();

    // Longer than the lag: the volume and its PV stay while attached.
    let window = LAG + Duration::from_secs(2);
    while deleted_claim.elapsed() < window {
        let on_backend = env.backend_volumes().iter().any(|v| v.id == volume);
        let pv_there = env.pv(&name).await.is_some();
        if !on_backend || !pv_there {
            panic!(
                "({}) {} {:?} after the claim's deletion, while its VolumeAttachment {attachment} \
                 existed (created before the claim was deleted; its watch lagged {LAG:?}, \
                 {} event(s) held so far): backend volume {volume} {}, PV {name} {}\n\
                 PV events: {:?}\n{}",
                env.backend_name(),
                if on_backend {
                    "PV deleted"
                } else {
                    "volume deleted"
                },
                deleted_claim.elapsed(),
                env.watch_events_held(WATCHED),
                if on_backend { "still there" } else { "DELETED" },
                if pv_there { "still there" } else { "DELETED" },
                env.pv_events(&name).await,
                env.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        env.watch_events_held(WATCHED) > 0,
        "({}) the lag never held a VolumeAttachment event: the fault did not strike\n{}",
        env.backend_name(),
        env.logs()
    );
    detach_wait_reported(&env, &name, Duration::from_secs(20)).await;
    assert!(
        env.backend_volumes().iter().any(|v| v.id == volume),
        "not deleted while attached"
    );

    // Detached (its DELETED event lagged too): now the volume goes.
    detach_and_wait_for_the_deletion(&env, &attachment, &name).await;
}

/// An administrator who turns a Released PV's policy from Delete to Retain
/// a moment after the release keeps the data, even when the sidecar's PV
/// watch brings it the release before the change (its events lagged): the
/// decision to delete is made on the PV as the API server has it, not on
/// the cache's older copy (docs/design.md, "Reading current state").
async fn a_reclaim_policy_changed_after_the_release_is_honoured(backend: Backend) {
    const LAG: Duration = Duration::from_secs(3);
    const WATCHED: &str = "persistentvolumes";
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.through_lag_proxy();
    env.start_sidecar(&[]).await;
    let (pv, name) = env.provision(&env.ns, "data", "fast").await;
    let volume = handle(&pv);

    env.lag_watch(WATCHED, LAG);
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("PV released", Duration::from_secs(20), || async {
        let pv = env.pv(&name).await?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
    // Well inside the lag: the sidecar sees the release first, with the
    // change a second behind it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(env.client.clone())
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
        )
        .await
        .expect("the administrator's change");
    let changed = Instant::now();
    while changed.elapsed() < LAG + Duration::from_secs(2) {
        assert!(
            env.backend_volumes().iter().any(|v| v.id == volume),
            "({}) volume {volume} deleted although its PV {name} was set to Retain {:?} before (the PV watch lagged {LAG:?}, {} event(s) held)\n{}",
            env.backend_name(),
            changed.elapsed(),
            env.watch_events_held(WATCHED),
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        env.watch_events_held(WATCHED) > 0,
        "({}) the lag never held a PV event: the fault did not strike",
        env.backend_name()
    );
    env.clear_watch_lag(WATCHED);
    let kept = env.pv(&name).await.expect("Retain keeps the PV");
    assert_eq!(
        kept.spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref()),
        Some("Retain")
    );
    // A Retain PV loses our finalizer (nothing left for us to do), so the
    // administrator can delete it; the volume stays on the backend.
    env.wait_for("finalizer removed", Duration::from_secs(20), || async {
        let pv = env.pv(&name).await?;
        (!pv.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == "external-provisioner.volume.kubernetes.io/finalizer"))
        .then_some(())
    })
    .await;
    env.delete("v1", "PersistentVolume", "", &name).await;
    assert!(env.backend_volumes().iter().any(|v| v.id == volume));
}

/// A driver that does not attach volumes has no VolumeAttachments to wait
/// for (upstream does not even watch them then): a stray one is ignored.
async fn without_attach_support_volume_attachments_are_ignored(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.start_sidecar(&[]).await;
    let (_, name) = env.provision(&env.ns, "data", "fast").await;
    env.create(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": format!("attachment-{}", env.id)},
        "spec": {"attacher": env.driver_name.as_str(), "nodeName": env.node.as_str(),
                 "source": {"persistentVolumeName": name}}}),
    )
    .await;
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("deleted", Duration::from_secs(30), || async {
        (env.pv(&name).await.is_none() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    assert_eq!(env.sidecar_request_count("watch", "volumeattachments"), 0);
    env.delete(
        "storage.k8s.io/v1",
        "VolumeAttachment",
        "",
        &format!("attachment-{}", env.id),
    )
    .await;
}

/// Upstream #1469: a PV with our volume's name that records another claim
/// is not taken as success; the new backend volume is deleted, not leaked.
async fn a_pv_name_taken_by_another_claim_does_not_leak_the_new_volume(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![csi_hostpath::faults::Fault::delay(
        "CreateVolume",
        Duration::from_secs(1),
    )]);
    env.start_sidecar(&[]).await;
    let pvc = env
        .create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    let uid = pvc.metadata.uid.clone().expect("uid");
    // While CreateVolume runs, someone else's PV takes the name.
    env.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": format!("pvc-{uid}")},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"},
                 "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": "other", "name": "other", "uid": "not-this-claim"},
                 "csi": {"driver": "other.example.com", "volumeHandle": "foreign"}}}))
        .await;
    env.wait_for("the orphan deleted", Duration::from_secs(20), || async {
        let events = env.events(&env.ns, "data").await;
        (events.iter().any(|(r, _)| r == "ProvisioningFailed") && env.backend_volumes().is_empty())
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        env.backend_volumes().is_empty(),
        "no volume leaked while the name is taken\n{}",
        env.logs()
    );
    let foreign = env
        .pv(&format!("pvc-{uid}"))
        .await
        .expect("foreign PV kept");
    assert_eq!(handle(&foreign), "foreign", "the other PV is left alone");
}

/// The snapshot sweep: a snapshot-source finalizer left behind (a crash, a
/// claim deleted mid-restore) is removed by the sweep once no pending claim
/// restores from the snapshot; one still needed is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_snapshot_finalizers_are_swept() {
    // The test server serves VolumeSnapshots (a real cluster needs the CRDs).
    let mut env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    const FINALIZER: &str = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
    for name in ["orphan", "needed"] {
        env.api()
            .create_object(json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": name, "namespace": env.ns, "finalizers": [FINALIZER, "example.com/keep"]},
                "spec": {"source": {"volumeSnapshotContentName": "c"}}}))
            .expect("snapshot");
    }
    // A claim still waiting to be restored from "needed" (not ready, so it
    // stays Pending).
    env.create_pvc(
        &env.ns,
        "restore",
        "fast",
        "5Mi",
        json!({"spec": {"dataSource": {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "needed"}}}),
    )
    .await;
    env.start_sidecar(&["--snapshot-orphan-sweep-interval=1s"])
        .await;
    let finalizers = |name: &'static str| {
        let env = &env;
        async move {
            env.api()
                .get_object(
                    "snapshot.storage.k8s.io/v1",
                    "VolumeSnapshot",
                    &env.ns,
                    name,
                )
                .map(|s| s["metadata"]["finalizers"].clone())
        }
    };
    env.wait_for("the orphan swept", Duration::from_secs(20), || async {
        (finalizers("orphan").await? == json!(["example.com/keep"])).then_some(())
    })
    .await;
    assert_eq!(
        finalizers("needed").await,
        Some(json!([FINALIZER, "example.com/keep"])),
        "kept while a pending claim restores from it"
    );
    // The claim goes: the next sweep frees its snapshot too.
    env.delete_pvc(&env.ns, "restore").await;
    env.wait_for(
        "freed once the claim is gone",
        Duration::from_secs(20),
        || async { (finalizers("needed").await? == json!(["example.com/keep"])).then_some(()) },
    )
    .await;
}
