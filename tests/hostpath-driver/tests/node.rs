//! Node service over the socket. Publishing bind-mounts when the test
//! process may mount (root) and symlinks otherwise; both make the volume's
//! content visible at the target path, which is what is checked.

mod common;

use common::*;
use csi_hostpath::{TOPOLOGY_KEY, volume_path};
use csi_proto::v1::{
    self as csi, node_service_capability, volume_capability::access_mode::Mode, volume_usage,
};
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
        [R::GetVolumeStats as i32, R::SingleNodeMultiWriter as i32]
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
        Code::Unimplemented
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn publish_unpublish_mount_volume() {
    let dir = tempfile::tempdir().expect("tempdir");
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
    assert_eq!(std::fs::metadata(&dev).expect("device file").len(), 2 << 20);
    n.node_unpublish_volume(unpublish_req(&blk.volume_id, &dev))
        .await
        .expect("unpublish block");
    assert!(std::fs::symlink_metadata(&dev).is_err());
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
