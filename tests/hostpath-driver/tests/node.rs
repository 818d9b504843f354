//! Node service over the socket. Publishing bind-mounts when the test
//! process may mount (root) and symlinks otherwise; both make the volume's
//! content visible at the target path, which is what is checked.

mod common;

use common::*;
use csi_hostpath::{TOPOLOGY_KEY, volume_path};
use csi_proto::v1::{
    self as csi, node_service_capability, volume_capability::access_mode::Mode, volume_usage,
};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use tonic::Code;

fn publish_req(
    id: &str,
    target: &std::path::Path,
    cap: csi::VolumeCapability,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn unpublish_req(id: &str, target: &std::path::Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: target.to_string_lossy().into_owned(),
    }
}

#[tokio::test]
async fn info_and_capabilities() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |c| c.node_id = "worker-7".to_owned()).await;
    let mut n = server.node();
    let info = n
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.node_id, "worker-7");
    assert_eq!(info.max_volumes_per_node, 0);
    assert_eq!(
        info.accessible_topology
            .expect("topology")
            .segments
            .get(TOPOLOGY_KEY),
        Some(&"worker-7".to_owned())
    );
    let caps = n
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect("caps")
        .into_inner()
        .capabilities;
    use node_service_capability::{Type, rpc::Type as R};
    let got: Vec<i32> = caps
        .iter()
        .filter_map(|c| c.r#type.as_ref().map(|Type::Rpc(r)| r.r#type))
        .collect();
    assert_eq!(
        got,
        [
            R::GetVolumeStats as i32,
            R::ExpandVolume as i32,
            R::SingleNodeMultiWriter as i32
        ]
    );
    assert_eq!(
        code(
            n.node_stage_volume(csi::NodeStageVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            n.node_unstage_volume(csi::NodeUnstageVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            n.node_expand_volume(csi::NodeExpandVolumeRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn publish_unpublish_mount_volume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let v = create(&mut c, create_req("v", 4 * MIB))
        .await
        .expect("create");
    let data = volume_path(&server.config.state_dir, &v.volume_id);
    std::fs::write(data.join("hello.txt"), b"hi").expect("write");
    let pods = dir.path().join("pods");
    std::fs::create_dir(&pods).expect("mkdir");
    let target = pods.join("mnt");

    n.node_publish_volume(publish_req(&v.volume_id, &target, rwo()))
        .await
        .expect("publish");
    assert_eq!(
        std::fs::read(target.join("hello.txt")).expect("visible"),
        b"hi"
    );
    // Writes through the target land in the volume.
    std::fs::write(target.join("from-pod.txt"), b"written").expect("write through");
    assert_eq!(
        std::fs::read(data.join("from-pod.txt")).expect("in volume"),
        b"written"
    );
    n.node_publish_volume(publish_req(&v.volume_id, &target, rwo()))
        .await
        .expect("publish is idempotent");

    let stats = n
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: v.volume_id.clone(),
            volume_path: target.to_string_lossy().into_owned(),
            ..Default::default()
        })
        .await
        .expect("stats")
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .expect("bytes usage");
    assert_eq!(bytes.total, 4 * MIB);
    assert_eq!(bytes.used, 2 + 7);
    assert_eq!(bytes.available, 4 * MIB - 9);

    n.node_unpublish_volume(unpublish_req(&v.volume_id, &target))
        .await
        .expect("unpublish");
    assert!(
        std::fs::symlink_metadata(&target).is_err(),
        "target removed"
    );
    assert!(data.join("hello.txt").exists(), "data kept");
    n.node_unpublish_volume(unpublish_req(&v.volume_id, &target))
        .await
        .expect("unpublish is idempotent");
    // Unknown volume with nothing at the target.
    assert_eq!(
        code(
            n.node_unpublish_volume(unpublish_req("nope", &target))
                .await
        ),
        Code::NotFound
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn publish_readonly_and_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let pods = dir.path().join("pods");
    std::fs::create_dir(&pods).expect("mkdir");

    let mut req = create_req("blk", 2 * MIB);
    req.volume_capabilities = vec![block_cap(Mode::SingleNodeWriter)];
    let blk = create(&mut c, req).await.expect("block");
    let dev = pods.join("dev");
    n.node_publish_volume(publish_req(
        &blk.volume_id,
        &dev,
        block_cap(Mode::SingleNodeWriter),
    ))
    .await
    .expect("publish block");
    let block_file = volume_path(&server.config.state_dir, &blk.volume_id).join("block");
    let meta = std::fs::metadata(&dev).expect("device");
    if meta.file_type().is_block_device() {
        // Published as the loop device of the volume's file (the process
        // may mount): 2 MiB, and what is written to it lands in the file.
        assert_eq!(block_device_size(meta.rdev()), 2 << 20);
        assert_eq!(loops_backed_by(&block_file).len(), 1);
        let mut device = std::fs::OpenOptions::new()
            .write(true)
            .open(&dev)
            .expect("open the device");
        device.write_all(b"written to the device").expect("write");
        device.sync_all().expect("fsync");
        drop(device);
        let mut head = [0u8; 21];
        std::fs::File::open(&block_file)
            .expect("open the file")
            .read_exact(&mut head)
            .expect("read");
        assert_eq!(&head, b"written to the device");
    } else {
        assert_eq!(meta.len(), 2 << 20);
    }
    n.node_unpublish_volume(unpublish_req(&blk.volume_id, &dev))
        .await
        .expect("unpublish block");
    assert!(std::fs::symlink_metadata(&dev).is_err());
    assert!(
        loops_backed_by(&block_file).is_empty(),
        "the loop device is detached"
    );
    // Access type must match the volume.
    assert_eq!(
        code(
            n.node_publish_volume(publish_req(&blk.volume_id, &dev, rwo()))
                .await
        ),
        Code::InvalidArgument
    );

    let v = create(&mut c, create_req("ro", MIB)).await.expect("create");
    let target = pods.join("ro");
    let mut ro = publish_req(&v.volume_id, &target, mount_cap(Mode::SingleNodeReaderOnly));
    ro.readonly = true;
    n.node_publish_volume(ro).await.expect("publish read-only");
    let writable = std::fs::write(target.join("x"), b"x").is_ok();
    let mounted = std::fs::symlink_metadata(&target)
        .map(|m| m.is_dir())
        .unwrap_or(false);
    if mounted {
        assert!(!writable, "a read-only bind mount refuses writes");
    }
    n.node_unpublish_volume(unpublish_req(&v.volume_id, &target))
        .await
        .expect("unpublish");
    assert!(std::fs::symlink_metadata(&target).is_err());
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn node_argument_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let v = create(&mut c, create_req("v", MIB)).await.expect("create");
    let target = dir.path().join("t");

    let mut r = publish_req(&v.volume_id, &target, rwo());
    r.volume_id.clear();
    assert_eq!(code(n.node_publish_volume(r).await), Code::InvalidArgument);
    let mut r = publish_req(&v.volume_id, &target, rwo());
    r.target_path.clear();
    assert_eq!(code(n.node_publish_volume(r).await), Code::InvalidArgument);
    let mut r = publish_req(&v.volume_id, &target, rwo());
    r.volume_capability = None;
    assert_eq!(code(n.node_publish_volume(r).await), Code::InvalidArgument);
    let r = publish_req(&v.volume_id, &target, mount_cap(Mode::MultiNodeMultiWriter));
    assert_eq!(code(n.node_publish_volume(r).await), Code::InvalidArgument);
    let r = publish_req("nope", &target, rwo());
    assert_eq!(code(n.node_publish_volume(r).await), Code::NotFound);
    assert!(!target.exists(), "failed publishes create nothing");

    assert_eq!(
        code(n.node_unpublish_volume(unpublish_req("", &target)).await),
        Code::InvalidArgument
    );
    let mut r = unpublish_req(&v.volume_id, &target);
    r.target_path.clear();
    assert_eq!(
        code(n.node_unpublish_volume(r).await),
        Code::InvalidArgument
    );

    let stats = |id: &str, path: &str| csi::NodeGetVolumeStatsRequest {
        volume_id: id.to_owned(),
        volume_path: path.to_owned(),
        ..Default::default()
    };
    let here = dir.path().to_string_lossy().into_owned();
    assert_eq!(
        code(n.node_get_volume_stats(stats("", &here)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(n.node_get_volume_stats(stats(&v.volume_id, "")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(n.node_get_volume_stats(stats("nope", &here)).await),
        Code::NotFound
    );
    assert_eq!(
        code(
            n.node_get_volume_stats(stats(&v.volume_id, "/no/such/path/anywhere"))
                .await
        ),
        Code::NotFound
    );
    server.stop().await.expect("clean stop");
}

fn stats_req(id: &str, path: &std::path::Path) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: id.to_owned(),
        volume_path: path.to_string_lossy().into_owned(),
        ..Default::default()
    }
}

/// The publications recorded for volume `id`.
fn recorded_targets(server: &Server, id: &str) -> Vec<String> {
    csi_hostpath::backend_volumes(&server.config.state_dir)
        .expect("records")
        .into_iter()
        .find(|v| v.id == id)
        .expect("volume record")
        .published
        .into_keys()
        .collect()
}

/// CSI spec, NodePublishVolume (with SINGLE_NODE_MULTI_WRITER advertised):
/// a second target path on the node is FAILED_PRECONDITION for
/// SINGLE_NODE_SINGLE_WRITER (and the other non-multi-writer single-node
/// modes), OK for SINGLE_NODE_MULTI_WRITER. The refused publish leaves
/// nothing behind at its target (upstream csi-sanity found a bind mount
/// left in its mount directory).
#[tokio::test]
async fn second_target_is_refused_unless_multi_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let pods = dir.path().join("pods");
    std::fs::create_dir(&pods).expect("mkdir");
    let (first, second) = (pods.join("first"), pods.join("second"));

    for mode in [
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
    ] {
        let mut req = create_req(&format!("v-{}", mode.as_str_name()), MIB);
        req.volume_capabilities = vec![mount_cap(mode)];
        let v = create(&mut c, req).await.expect("create");
        let mut publish = publish_req(&v.volume_id, &first, mount_cap(mode));
        publish.readonly = mode == Mode::SingleNodeReaderOnly;
        n.node_publish_volume(publish.clone())
            .await
            .expect("first publish");
        n.node_publish_volume(publish.clone())
            .await
            .expect("the same target again is idempotent");
        let mut elsewhere = publish.clone();
        elsewhere.target_path = second.to_string_lossy().into_owned();
        let err = n
            .node_publish_volume(elsewhere.clone())
            .await
            .expect_err("second target");
        assert_eq!(err.code(), Code::FailedPrecondition, "{mode:?}: {err:?}");
        assert!(
            err.message()
                .contains(&first.to_string_lossy().into_owned()),
            "the message names the other target: {}",
            err.message()
        );
        assert!(
            std::fs::symlink_metadata(&second).is_err(),
            "{mode:?}: nothing created at the refused target"
        );
        assert_eq!(
            mounts_under(&second),
            Vec::<String>::new(),
            "no mount at the refused target"
        );
        assert_eq!(
            recorded_targets(&server, &v.volume_id),
            [first.to_string_lossy().into_owned()]
        );
        // Once the first target is unpublished, the second one is free.
        n.node_unpublish_volume(unpublish_req(&v.volume_id, &first))
            .await
            .expect("unpublish first");
        n.node_publish_volume(elsewhere).await.expect("now free");
        n.node_unpublish_volume(unpublish_req(&v.volume_id, &second))
            .await
            .expect("unpublish second");
        assert!(recorded_targets(&server, &v.volume_id).is_empty());
        delete(&mut c, &v.volume_id).await.expect("delete");
    }

    // SINGLE_NODE_MULTI_WRITER: any number of targets.
    let mut req = create_req("multi", MIB);
    req.volume_capabilities = vec![mount_cap(Mode::SingleNodeMultiWriter)];
    let v = create(&mut c, req).await.expect("create");
    let multi = mount_cap(Mode::SingleNodeMultiWriter);
    n.node_publish_volume(publish_req(&v.volume_id, &first, multi.clone()))
        .await
        .expect("first");
    n.node_publish_volume(publish_req(&v.volume_id, &second, multi.clone()))
        .await
        .expect("second target with SINGLE_NODE_MULTI_WRITER");
    // ...but not a single-writer publication next to them.
    let third = pods.join("third");
    assert_eq!(
        code(
            n.node_publish_volume(publish_req(
                &v.volume_id,
                &third,
                mount_cap(Mode::SingleNodeSingleWriter)
            ))
            .await
        ),
        Code::FailedPrecondition
    );
    assert!(std::fs::symlink_metadata(&third).is_err());
    for target in [&first, &second] {
        n.node_unpublish_volume(unpublish_req(&v.volume_id, target))
            .await
            .expect("unpublish");
    }
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
    server.stop().await.expect("clean stop");
}

/// CSI spec, NodePublishVolume: the same target with other arguments
/// (access mode or readonly) is ALREADY_EXISTS, and the publication stays
/// as it was.
#[tokio::test]
async fn same_target_with_other_arguments_is_already_exists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let v = create(&mut c, create_req("v", MIB)).await.expect("create");
    let target = dir.path().join("target");
    let publish = publish_req(&v.volume_id, &target, rwo());
    n.node_publish_volume(publish.clone())
        .await
        .expect("publish");
    let mut readonly = publish.clone();
    readonly.readonly = true;
    assert_eq!(
        code(n.node_publish_volume(readonly).await),
        Code::AlreadyExists
    );
    let other_mode = publish_req(
        &v.volume_id,
        &target,
        mount_cap(Mode::SingleNodeMultiWriter),
    );
    assert_eq!(
        code(n.node_publish_volume(other_mode).await),
        Code::AlreadyExists
    );
    n.node_publish_volume(publish)
        .await
        .expect("the original arguments are still idempotent");
    // Another volume onto the same target is refused too.
    let w = create(&mut c, create_req("w", MIB)).await.expect("create");
    assert_eq!(
        code(
            n.node_publish_volume(publish_req(&w.volume_id, &target, rwo()))
                .await
        ),
        Code::AlreadyExists
    );
    // Unpublishing the other volume there leaves this volume's mount alone.
    n.node_unpublish_volume(unpublish_req(&w.volume_id, &target))
        .await
        .expect("not published there: OK");
    assert!(
        std::fs::symlink_metadata(&target).is_ok(),
        "the mount of v is untouched"
    );
    n.node_get_volume_stats(stats_req(&v.volume_id, &target))
        .await
        .expect("still published");
    n.node_unpublish_volume(unpublish_req(&v.volume_id, &target))
        .await
        .expect("unpublish");
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
    server.stop().await.expect("clean stop");
}

/// DeleteVolume of a published volume is FAILED_PRECONDITION ("Volume in
/// use"): deleting the data under a live mount would leave a mount of a
/// deleted directory behind.
#[tokio::test]
async fn delete_of_a_published_volume_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let v = create(&mut c, create_req("v", MIB)).await.expect("create");
    let target = dir.path().join("target");
    n.node_publish_volume(publish_req(&v.volume_id, &target, rwo()))
        .await
        .expect("publish");
    assert_eq!(
        code(delete(&mut c, &v.volume_id).await),
        Code::FailedPrecondition
    );
    assert!(volume_path(&server.config.state_dir, &v.volume_id).is_dir());
    n.node_unpublish_volume(unpublish_req(&v.volume_id, &target))
        .await
        .expect("unpublish");
    delete(&mut c, &v.volume_id)
        .await
        .expect("delete after unpublish");
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
    server.stop().await.expect("clean stop");
}

/// Publications are part of the volume record: a restarted driver still
/// refuses a second single-writer target, and a recorded target that no
/// longer shows the volume (removed behind the driver's back) is stale and
/// ignored.
#[tokio::test]
async fn publications_survive_a_restart_and_stale_ones_are_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let snsw = mount_cap(Mode::SingleNodeSingleWriter);
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut req = create_req("v", MIB);
    req.volume_capabilities = vec![snsw.clone()];
    let v = create(&mut server.controller(), req).await.expect("create");
    server
        .node()
        .node_publish_volume(publish_req(&v.volume_id, &first, snsw.clone()))
        .await
        .expect("publish");
    server.stop().await.expect("stop");

    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut n = server.node();
    assert_eq!(
        code(
            n.node_publish_volume(publish_req(&v.volume_id, &second, snsw.clone()))
                .await
        ),
        Code::FailedPrecondition
    );
    // Remove the publication behind the driver's back.
    let mounted = !std::fs::symlink_metadata(&first)
        .expect("target")
        .file_type()
        .is_symlink();
    if mounted {
        let status = std::process::Command::new("umount")
            .arg(&first)
            .status()
            .expect("umount");
        assert!(status.success());
        std::fs::remove_dir(&first).expect("rmdir");
    } else {
        std::fs::remove_file(&first).expect("unlink");
    }
    n.node_publish_volume(publish_req(&v.volume_id, &second, snsw.clone()))
        .await
        .expect("the stale publication does not block");
    assert_eq!(
        recorded_targets(&server, &v.volume_id),
        [second.to_string_lossy().into_owned()],
        "the stale entry was dropped"
    );
    n.node_unpublish_volume(unpublish_req(&v.volume_id, &second))
        .await
        .expect("unpublish");
    // Unpublishing the stale target is OK (nothing there).
    n.node_unpublish_volume(unpublish_req(&v.volume_id, &first))
        .await
        .expect("unpublish stale");
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
    server.stop().await.expect("clean stop");
}

/// A publish that fails after the target was created (a mount volume onto
/// an existing file) keeps nothing: no mount, no recorded publication.
#[tokio::test]
async fn failed_publish_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let v = create(&mut c, create_req("v", MIB)).await.expect("create");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("write");
    assert_eq!(
        code(
            n.node_publish_volume(publish_req(&v.volume_id, &file, rwo()))
                .await
        ),
        Code::FailedPrecondition
    );
    assert_eq!(std::fs::read(&file).expect("kept"), b"not a directory");
    assert!(recorded_targets(&server, &v.volume_id).is_empty());
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
    // The volume is not in use, so it can be deleted.
    delete(&mut c, &v.volume_id).await.expect("delete");
    server.stop().await.expect("clean stop");
}

/// NodeGetVolumeStats: NOT_FOUND when `volume_path` exists but is not
/// where the volume is published ("does not exist on the specified path").
#[tokio::test]
async fn stats_need_the_volume_at_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let v = create(&mut c, create_req("v", MIB)).await.expect("create");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    assert_eq!(
        code(
            n.node_get_volume_stats(stats_req(&v.volume_id, &elsewhere))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            n.node_get_volume_stats(stats_req(&v.volume_id, std::path::Path::new("/")))
                .await
        ),
        Code::NotFound
    );
    server.stop().await.expect("clean stop");
}

/// NodeExpandVolume (EXPAND_VOLUME node capability): argument checks one
/// at a time, NOT_FOUND for an unknown volume or one not published at
/// `volume_path`, OUT_OF_RANGE beyond what ControllerExpandVolume gave the
/// volume, and the capacity once published.
#[tokio::test]
async fn node_expand_volume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut n = server.node();
    let v = create(&mut c, create_req("v", 4 * MIB))
        .await
        .expect("create");
    let target = dir.path().join("target");
    let expand = |id: &str, path: &std::path::Path, required: i64| csi::NodeExpandVolumeRequest {
        volume_id: id.to_owned(),
        volume_path: path.to_string_lossy().into_owned(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capability: Some(rwo()),
        ..Default::default()
    };
    let mut r = expand(&v.volume_id, &target, 4 * MIB);
    r.volume_id.clear();
    assert_eq!(code(n.node_expand_volume(r).await), Code::InvalidArgument);
    let mut r = expand(&v.volume_id, &target, 4 * MIB);
    r.volume_path.clear();
    assert_eq!(code(n.node_expand_volume(r).await), Code::InvalidArgument);
    let mut r = expand(&v.volume_id, &target, 4 * MIB);
    r.volume_capability = Some(block_cap(Mode::SingleNodeWriter));
    assert_eq!(code(n.node_expand_volume(r).await), Code::InvalidArgument);
    assert_eq!(
        code(n.node_expand_volume(expand("nope", &target, 4 * MIB)).await),
        Code::NotFound
    );
    assert_eq!(
        code(
            n.node_expand_volume(expand(&v.volume_id, &target, 4 * MIB))
                .await
        ),
        Code::NotFound,
        "not published at the path"
    );

    n.node_publish_volume(publish_req(&v.volume_id, &target, rwo()))
        .await
        .expect("publish");
    let got = n
        .node_expand_volume(expand(&v.volume_id, &target, 4 * MIB))
        .await
        .expect("expand")
        .into_inner();
    assert_eq!(got.capacity_bytes, 4 * MIB);
    assert_eq!(
        code(
            n.node_expand_volume(expand(&v.volume_id, &target, 8 * MIB))
                .await
        ),
        Code::OutOfRange,
        "the controller has not grown it yet"
    );
    c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 8 * MIB,
            limit_bytes: 0,
        }),
        ..Default::default()
    })
    .await
    .expect("controller expand");
    let mut r = expand(&v.volume_id, &target, 8 * MIB);
    r.capacity_range = None;
    r.volume_capability = None;
    let got = n
        .node_expand_volume(r)
        .await
        .expect("expand without range or capability")
        .into_inner();
    assert_eq!(got.capacity_bytes, 8 * MIB);
    let mut r = expand(&v.volume_id, &target, 8 * MIB);
    r.capacity_range = Some(csi::CapacityRange {
        required_bytes: 0,
        limit_bytes: 6 * MIB,
    });
    assert_eq!(code(n.node_expand_volume(r).await), Code::OutOfRange);
    n.node_unpublish_volume(unpublish_req(&v.volume_id, &target))
        .await
        .expect("unpublish");
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
    server.stop().await.expect("clean stop");
}

/// The controller side and the node side of the driver as two servers
/// sharing the state directory `dir` (the Deployment's driver and the
/// DaemonSet's on one node), each on its own socket.
async fn sides_sharing(dir: &std::path::Path) -> (Server, Server) {
    let controller_side = Server::start_in(dir, |_| {}).await;
    let node_side = Server::start_in(dir, |c| {
        c.endpoint = dir.join("node.sock");
    })
    .await;
    (controller_side, node_side)
}

/// The controller and the node side as two processes sharing one state
/// directory (the Deployment's driver and the DaemonSet's on one node): the
/// node side publishes a volume the other created after it started.
#[tokio::test]
async fn a_node_side_sharing_the_state_directory_publishes_volumes_created_after_it_started() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let (controller_side, node_side) = sides_sharing(dir.path()).await;
    let v = create(&mut controller_side.controller(), create_req("shared", MIB))
        .await
        .expect("create on the controller side");
    let pods = dir.path().join("pods");
    std::fs::create_dir(&pods).expect("mkdir");
    let target = pods.join("t");
    let mut n = node_side.node();
    n.node_publish_volume(publish_req(&v.volume_id, &target, rwo()))
        .await
        .expect("published by the node side");
    std::fs::write(target.join("f"), b"through the node side").expect("write");
    assert_eq!(
        std::fs::read(volume_path(&controller_side.config.state_dir, &v.volume_id).join("f"))
            .expect("in the volume"),
        b"through the node side"
    );
    n.node_unpublish_volume(unpublish_req(&v.volume_id, &target))
        .await
        .expect("unpublish");
    assert!(std::fs::symlink_metadata(&target).is_err());
    node_side.stop().await.expect("clean stop");
    controller_side.stop().await.expect("clean stop");
}

/// The kubelet may unpublish a volume after its pod, claim and PV are gone
/// (seen on the real node: the pod object is deleted some 200 ms before
/// NodeUnpublishVolume), so the controller side can delete a volume the node
/// side (another process sharing the state directory) still has published.
/// The node side's late unpublish must not write the deleted record again
/// (it did: a backend volume without a PV), and a publish after the delete
/// finds no volume.
#[tokio::test]
async fn a_late_unpublish_on_the_node_side_does_not_bring_a_deleted_volume_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _unmounter = Unmounter::new(dir.path());
    let (controller_side, node_side) = sides_sharing(dir.path()).await;
    let mut c = controller_side.controller();
    let mut n = node_side.node();
    let pods = dir.path().join("pods");
    std::fs::create_dir(&pods).expect("mkdir");
    for (name, cap) in [
        ("late-fs", rwo()),
        ("late-block", block_cap(Mode::SingleNodeWriter)),
    ] {
        let v = create(&mut c, {
            let mut req = create_req(name, MIB);
            req.volume_capabilities = vec![cap.clone()];
            req
        })
        .await
        .expect("create on the controller side");
        let target = pods.join(name);
        n.node_publish_volume(publish_req(&v.volume_id, &target, cap.clone()))
            .await
            .expect("published by the node side");
        delete(&mut c, &v.volume_id)
            .await
            .expect("deleted by the controller side, which does not see the publication");
        n.node_unpublish_volume(unpublish_req(&v.volume_id, &target))
            .await
            .expect("the late unpublish");
        let left =
            csi_hostpath::backend_volumes(&controller_side.config.state_dir).expect("records");
        assert!(
            left.is_empty(),
            "{name}: the deleted record is not written again: {left:?}"
        );
        assert!(
            std::fs::symlink_metadata(&target).is_err(),
            "{name}: the target is gone"
        );
        assert_eq!(mounts_under(dir.path()), Vec::<String>::new(), "{name}");
        assert_eq!(
            loops_backed_under(dir.path()),
            Vec::<String>::new(),
            "{name}: no loop device left on the deleted file"
        );
        let status = n
            .node_publish_volume(publish_req(&v.volume_id, &target, cap))
            .await
            .expect_err("nothing to publish");
        assert_eq!(status.code(), Code::NotFound, "{name}: {status:?}");
        assert!(
            csi_hostpath::backend_volumes(&controller_side.config.state_dir)
                .expect("records")
                .is_empty(),
            "{name}: nor by a publish"
        );
    }
    node_side.stop().await.expect("clean stop");
    controller_side.stop().await.expect("clean stop");
}

/// The backing files under `dir` of attached loop devices (deleted ones
/// included: the kernel names them with a " (deleted)" suffix).
fn loops_backed_under(dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let dir = dir.canonicalize().expect("the test dir");
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .map(|f| f.trim_end().to_owned())
        .filter(|f| f.starts_with(&*dir.to_string_lossy()))
        .collect()
}
