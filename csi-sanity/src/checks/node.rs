//! Node service: capabilities, NodeGetInfo, argument checks of the
//! stage/publish calls and a stage/publish/unpublish/unstage round trip.

use std::path::Path;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi::node_service_capability::rpc::Type as NodeRpc;
use csi::plugin_capability::service::Type as PluginService;
use csi_proto::v1 as csi;
use tonic::Code;

use super::util::{
    Must, bytes, controller_has, ensure, expect_code, fail, is_mount_permission_problem, node_has,
    plugin_has, status_text,
};
use crate::runner::{Check, CheckOutcome, Resource, T, Verdict};

pub const CAPS: &str = "Node Service NodeGetCapabilities should return appropriate capabilities";
pub const INFO: &str = "Node Service NodeGetInfo should return appropriate values";
pub const PUBLISH_NO_ID: &str =
    "Node Service NodePublishVolume should fail when no volume id is provided";
pub const PUBLISH_NO_TARGET: &str =
    "Node Service NodePublishVolume should fail when no target path is provided";
pub const PUBLISH_NO_CAP: &str =
    "Node Service NodePublishVolume should fail when no volume capability is provided";
pub const PUBLISH_SINGLE_WRITER_ELSEWHERE: &str = "Node Service NodePublishVolume with single node multi writer capability should fail when volume with single node single writer access mode is already mounted at a different target path";
pub const UNPUBLISH_NO_ID: &str =
    "Node Service NodeUnpublishVolume should fail when no volume id is provided";
pub const UNPUBLISH_NO_TARGET: &str =
    "Node Service NodeUnpublishVolume should fail when no target path is provided";
pub const STAGE_NO_ID: &str =
    "Node Service NodeStageVolume should fail when no volume id is provided";
pub const STAGE_NO_PATH: &str =
    "Node Service NodeStageVolume should fail when no staging target path is provided";
pub const STAGE_NO_CAP: &str =
    "Node Service NodeStageVolume should fail when no volume capability is provided";
pub const UNSTAGE_NO_ID: &str =
    "Node Service NodeUnstageVolume should fail when no volume id is provided";
pub const UNSTAGE_NO_PATH: &str =
    "Node Service NodeUnstageVolume should fail when no staging target path is provided";
pub const STATS_NO_ID: &str =
    "Node Service NodeGetVolumeStats should fail when no volume id is provided";
pub const STATS_NO_PATH: &str =
    "Node Service NodeGetVolumeStats should fail when no volume path is provided";
pub const STATS_MISSING: &str =
    "Node Service NodeGetVolumeStats should fail when volume is not found";
pub const STATS_WORKS: &str =
    "Node Service NodeGetVolumeStats should return usage of a published volume";
pub const EXPAND_NO_ID: &str =
    "Node Service NodeExpandVolume should fail when no volume id is provided";
pub const EXPAND_NO_PATH: &str =
    "Node Service NodeExpandVolume should fail when no volume path is provided";
pub const EXPAND_MISSING: &str =
    "Node Service NodeExpandVolume should fail when volume is not found";
pub const EXPAND_WORKS: &str =
    "Node Service NodeExpandVolume should work if node-expand is called after node-publish";
pub const WORKS: &str = "Node Service should work";
pub const IDEMPOTENT: &str = "Node Service should be idempotent";

pub fn checks() -> Vec<Check> {
    vec![
        check!(CAPS, capabilities),
        check!(INFO, info),
        check!(PUBLISH_NO_ID, publish_no_id),
        check!(PUBLISH_NO_TARGET, publish_no_target),
        check!(PUBLISH_NO_CAP, publish_no_cap),
        check!(
            PUBLISH_SINGLE_WRITER_ELSEWHERE,
            publish_single_writer_elsewhere
        ),
        check!(UNPUBLISH_NO_ID, unpublish_no_id),
        check!(UNPUBLISH_NO_TARGET, unpublish_no_target),
        check!(STAGE_NO_ID, stage_no_id),
        check!(STAGE_NO_PATH, stage_no_path),
        check!(STAGE_NO_CAP, stage_no_cap),
        check!(UNSTAGE_NO_ID, unstage_no_id),
        check!(UNSTAGE_NO_PATH, unstage_no_path),
        check!(STATS_NO_ID, stats_no_id),
        check!(STATS_NO_PATH, stats_no_path),
        check!(STATS_MISSING, stats_missing),
        check!(STATS_WORKS, stats_works),
        check!(EXPAND_NO_ID, expand_no_id),
        check!(EXPAND_NO_PATH, expand_no_path),
        check!(EXPAND_MISSING, expand_missing),
        check!(EXPAND_WORKS, expand_works),
        check!(WORKS, works),
        check!(IDEMPOTENT, idempotent),
    ]
}

fn missing_volume_id(t: &T) -> String {
    format!("sanity-{}-nonexistent-volume", t.run_id())
}

fn path_text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

async fn capabilities(t: T) -> CheckOutcome {
    let resp = t
        .node()
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .must("NodeGetCapabilities")?;
    for (i, cap) in resp.capabilities.iter().enumerate() {
        let Some(csi::node_service_capability::Type::Rpc(rpc)) = &cap.r#type else {
            fail!("capability {i} has no rpc type");
        };
        match NodeRpc::try_from(rpc.r#type) {
            Ok(NodeRpc::Unknown) => fail!("capability {i} is UNKNOWN"),
            Ok(_) => {}
            Err(_) => fail!("capability {i} has unknown type {}", rpc.r#type),
        }
    }
    Ok(())
}

async fn info(t: T) -> CheckOutcome {
    let resp = t
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .must("NodeGetInfo")?;
    ensure!(
        !resp.node_id.is_empty(),
        "NodeGetInfo returned an empty node_id"
    );
    ensure!(
        resp.node_id.len() <= 256,
        "NodeGetInfo returned a node_id of {} bytes, more than 256",
        resp.node_id.len()
    );
    ensure!(
        resp.max_volumes_per_node >= 0,
        "NodeGetInfo returned negative max_volumes_per_node {}",
        resp.max_volumes_per_node
    );
    if resp.accessible_topology.is_some() {
        ensure!(
            plugin_has(&t.cx, PluginService::VolumeAccessibilityConstraints),
            "NodeGetInfo returned accessible_topology although the driver does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS"
        );
    }
    Ok(())
}

fn publish_request(t: &T, volume_id: &str, target: &str) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.to_owned(),
        volume_capability: Some(t.capability()),
        secrets: t.config().secrets.node_publish_volume_secret.clone(),
        ..Default::default()
    }
}

fn stage_request(t: &T, volume_id: &str, staging: &str) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: staging.to_owned(),
        volume_capability: Some(t.capability()),
        secrets: t.config().secrets.node_stage_volume_secret.clone(),
        ..Default::default()
    }
}

/// A target path that does not exist yet, in a fresh parent directory.
fn target_path(t: &T) -> Result<String, Verdict> {
    let parent = t.fresh_dir(&t.cx.mount_dir, "target")?;
    Ok(path_text(&parent.join("target")))
}

/// A volume made ready for node calls: created with this node's topology,
/// ControllerPublished to this node when the driver has
/// PUBLISH_UNPUBLISH_VOLUME, and NodeStaged when asked and the driver has
/// STAGE_UNSTAGE_VOLUME, each call made `times` times.
///
/// The negative checks start from such a volume and break exactly one rule
/// of an otherwise valid request. With an unknown volume, a volume not
/// ControllerPublished, or not staged, a driver may rightly answer
/// NOT_FOUND or FAILED_PRECONDITION first: the spec does not order the
/// checks a plugin makes.
struct Prepared {
    volume: csi::Volume,
    capability: csi::VolumeCapability,
    node_id: String,
    controller_published: bool,
    publish_context: std::collections::HashMap<String, String>,
    staging: Option<String>,
}

impl Prepared {
    /// A NodeStageVolume request that breaks no rule.
    fn stage_request(&self, t: &T, staging: &str) -> csi::NodeStageVolumeRequest {
        let mut req = stage_request(t, &self.volume.volume_id, staging);
        req.volume_capability = Some(self.capability.clone());
        req.publish_context = self.publish_context.clone();
        req.volume_context = self.volume.volume_context.clone();
        req
    }

    /// A NodePublishVolume request onto `target` that breaks no rule.
    fn publish_request(&self, t: &T, target: &str) -> csi::NodePublishVolumeRequest {
        let mut req = publish_request(t, &self.volume.volume_id, target);
        req.volume_capability = Some(self.capability.clone());
        req.publish_context = self.publish_context.clone();
        req.volume_context = self.volume.volume_context.clone();
        req.staging_target_path = self.staging.clone().unwrap_or_default();
        req
    }
}

async fn prepare(t: &T, times: usize, stage: bool) -> Result<Prepared, Verdict> {
    prepare_with(t, times, stage, t.capability()).await
}

/// [`prepare`] with another volume capability than the test one.
async fn prepare_with(
    t: &T,
    times: usize,
    stage: bool,
    capability: csi::VolumeCapability,
) -> Result<Prepared, Verdict> {
    if !controller_has(&t.cx, Rpc::CreateDeleteVolume) {
        return Err(Verdict::Skip(
            "the check needs a volume and the driver does not advertise CREATE_DELETE_VOLUME"
                .into(),
        ));
    }
    let node_id = t.node_id()?;
    let mut req = t.volume_request_on_node(&t.unique_name("node"));
    req.volume_capabilities = vec![capability.clone()];
    let volume = t.create_volume(req).await?;
    let mut publish_context = Default::default();
    let controller_published = controller_has(&t.cx, Rpc::PublishUnpublishVolume);
    if controller_published {
        for _ in 0..times {
            let resp = t
                .ctrl()
                .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                    volume_id: volume.volume_id.clone(),
                    node_id: node_id.clone(),
                    volume_capability: Some(capability.clone()),
                    readonly: false,
                    secrets: t.config().secrets.controller_publish_volume_secret.clone(),
                    volume_context: volume.volume_context.clone(),
                })
                .await
                .must("ControllerPublishVolume")?;
            t.register(Resource::ControllerPublish {
                volume_id: volume.volume_id.clone(),
                node_id: node_id.clone(),
            });
            publish_context = resp.publish_context;
        }
    }
    let mut prepared = Prepared {
        volume,
        capability,
        node_id,
        controller_published,
        publish_context,
        staging: None,
    };
    if stage && node_has(&t.cx, NodeRpc::StageUnstageVolume) {
        let dir = path_text(&t.fresh_dir(&t.cx.staging_dir, "staging")?);
        for _ in 0..times {
            t.node()
                .node_stage_volume(prepared.stage_request(t, &dir))
                .await
                .map_err(|s| mount_verdict("NodeStageVolume", &s))?;
            t.register(Resource::NodeStage {
                volume_id: prepared.volume.volume_id.clone(),
                staging_path: dir.clone(),
            });
        }
        prepared.staging = Some(dir);
    }
    Ok(prepared)
}

async fn publish_no_id(t: T) -> CheckOutcome {
    let target = target_path(&t)?;
    // A driver with STAGE_UNSTAGE_VOLUME needs a staged volume's
    // staging_target_path, which needs a volume; without staging, the
    // request needs nothing else.
    let mut req = if node_has(&t.cx, NodeRpc::StageUnstageVolume) {
        prepare(&t, 1, true).await?.publish_request(&t, &target)
    } else {
        publish_request(&t, "", &target)
    };
    req.volume_id.clear();
    let res = t.node().node_publish_volume(req).await;
    expect_code(
        res,
        "NodePublishVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn publish_no_target(t: T) -> CheckOutcome {
    let p = prepare(&t, 1, true).await?;
    let res = t
        .node()
        .node_publish_volume(p.publish_request(&t, ""))
        .await;
    expect_code(
        res,
        "NodePublishVolume without a target path",
        Code::InvalidArgument,
    )
}

async fn publish_no_cap(t: T) -> CheckOutcome {
    let p = prepare(&t, 1, true).await?;
    let mut req = p.publish_request(&t, &target_path(&t)?);
    req.volume_capability = None;
    let res = t.node().node_publish_volume(req).await;
    expect_code(
        res,
        "NodePublishVolume without a volume capability",
        Code::InvalidArgument,
    )
}

/// CSI spec, NodePublishVolume, with SINGLE_NODE_MULTI_WRITER advertised:
/// a SINGLE_NODE_SINGLE_WRITER volume published at one target, published
/// at another target on the same node, gives FAILED_PRECONDITION.
async fn publish_single_writer_elsewhere(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::SingleNodeMultiWriter)?;
    let cap = t.capability_with(csi::volume_capability::access_mode::Mode::SingleNodeSingleWriter);
    let p = prepare_with(&t, 1, true, cap).await?;
    let first = target_path(&t)?;
    t.node()
        .node_publish_volume(p.publish_request(&t, &first))
        .await
        .map_err(|s| mount_verdict("NodePublishVolume", &s))?;
    t.register(Resource::NodePublish {
        volume_id: p.volume.volume_id.clone(),
        target_path: first,
    });
    let second = target_path(&t)?;
    let res = t
        .node()
        .node_publish_volume(p.publish_request(&t, &second))
        .await;
    if res.is_ok() {
        t.register(Resource::NodePublish {
            volume_id: p.volume.volume_id.clone(),
            target_path: second,
        });
    }
    expect_code(
        res,
        "NodePublishVolume of a SINGLE_NODE_SINGLE_WRITER volume at a second target path",
        Code::FailedPrecondition,
    )
}

async fn unpublish_no_id(t: T) -> CheckOutcome {
    let target = target_path(&t)?;
    let res = t
        .node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: String::new(),
            target_path: target,
        })
        .await;
    expect_code(
        res,
        "NodeUnpublishVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn unpublish_no_target(t: T) -> CheckOutcome {
    // An existing volume: for an unknown one NOT_FOUND is as right.
    let p = prepare(&t, 1, false).await?;
    let res = t
        .node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: p.volume.volume_id.clone(),
            target_path: String::new(),
        })
        .await;
    expect_code(
        res,
        "NodeUnpublishVolume without a target path",
        Code::InvalidArgument,
    )
}

async fn stage_no_id(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::StageUnstageVolume)?;
    let staging = t.fresh_dir(&t.cx.staging_dir, "staging")?;
    let res = t
        .node()
        .node_stage_volume(stage_request(&t, "", &path_text(&staging)))
        .await;
    expect_code(
        res,
        "NodeStageVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn stage_no_path(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::StageUnstageVolume)?;
    let p = prepare(&t, 1, false).await?;
    let res = t.node().node_stage_volume(p.stage_request(&t, "")).await;
    expect_code(
        res,
        "NodeStageVolume without a staging target path",
        Code::InvalidArgument,
    )
}

async fn stage_no_cap(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::StageUnstageVolume)?;
    let p = prepare(&t, 1, false).await?;
    let staging = t.fresh_dir(&t.cx.staging_dir, "staging")?;
    let mut req = p.stage_request(&t, &path_text(&staging));
    req.volume_capability = None;
    let res = t.node().node_stage_volume(req).await;
    expect_code(
        res,
        "NodeStageVolume without a volume capability",
        Code::InvalidArgument,
    )
}

async fn unstage_no_id(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::StageUnstageVolume)?;
    let staging = t.fresh_dir(&t.cx.staging_dir, "staging")?;
    let res = t
        .node()
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: String::new(),
            staging_target_path: path_text(&staging),
        })
        .await;
    expect_code(
        res,
        "NodeUnstageVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn unstage_no_path(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::StageUnstageVolume)?;
    // An existing volume: for an unknown one NOT_FOUND is as right.
    let p = prepare(&t, 1, false).await?;
    let res = t
        .node()
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: p.volume.volume_id.clone(),
            staging_target_path: String::new(),
        })
        .await;
    expect_code(
        res,
        "NodeUnstageVolume without a staging target path",
        Code::InvalidArgument,
    )
}

async fn stats_no_id(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::GetVolumeStats)?;
    let dir = t.fresh_dir(&t.cx.mount_dir, "stats")?;
    let res = t
        .node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: String::new(),
            volume_path: path_text(&dir),
            staging_target_path: String::new(),
        })
        .await;
    expect_code(
        res,
        "NodeGetVolumeStats without a volume id",
        Code::InvalidArgument,
    )
}

async fn stats_no_path(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::GetVolumeStats)?;
    // A published volume: for an unknown or unpublished one NOT_FOUND is as
    // right.
    let p = publish(&t, 1).await?;
    let res = t
        .node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: p.volume_id.clone(),
            volume_path: String::new(),
            staging_target_path: p.staging.clone().unwrap_or_default(),
        })
        .await;
    expect_code(
        res,
        "NodeGetVolumeStats without a volume path",
        Code::InvalidArgument,
    )
}

async fn stats_missing(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::GetVolumeStats)?;
    let dir = t.fresh_dir(&t.cx.mount_dir, "stats")?;
    let res = t
        .node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: missing_volume_id(&t),
            volume_path: path_text(&dir),
            staging_target_path: String::new(),
        })
        .await;
    expect_code(
        res,
        "NodeGetVolumeStats of a nonexistent volume",
        Code::NotFound,
    )
}

fn expand_request(t: &T, volume_id: &str, path: &str) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: volume_id.to_owned(),
        volume_path: path.to_owned(),
        volume_capability: Some(t.capability()),
        ..Default::default()
    }
}

async fn expand_no_id(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::ExpandVolume)?;
    let dir = t.fresh_dir(&t.cx.mount_dir, "expand")?;
    let res = t
        .node()
        .node_expand_volume(expand_request(&t, "", &path_text(&dir)))
        .await;
    expect_code(
        res,
        "NodeExpandVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn expand_no_path(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::ExpandVolume)?;
    // A published volume (NodeExpandVolume comes after NodePublishVolume
    // or NodeStageVolume): for an unknown one NOT_FOUND is as right. No
    // capacity range (it is optional): a size the controller has not
    // expanded the volume to would be a second fault.
    let p = publish(&t, 1).await?;
    let mut req = expand_request(&t, &p.volume_id, "");
    req.staging_target_path = p.staging.clone().unwrap_or_default();
    let res = t.node().node_expand_volume(req).await;
    expect_code(
        res,
        "NodeExpandVolume without a volume path",
        Code::InvalidArgument,
    )
}

async fn expand_missing(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::ExpandVolume)?;
    let dir = t.fresh_dir(&t.cx.mount_dir, "expand")?;
    let res = t
        .node()
        .node_expand_volume(expand_request(&t, &missing_volume_id(&t), &path_text(&dir)))
        .await;
    expect_code(
        res,
        "NodeExpandVolume of a nonexistent volume",
        Code::NotFound,
    )
}

async fn expand_works(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::ExpandVolume)?;
    let p = publish(&t, 1).await?;
    let mut size = p.capacity_bytes;
    if controller_has(&t.cx, Rpc::ExpandVolume) {
        let target = t.config().expand_size();
        let resp = t
            .ctrl()
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: p.volume_id.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: target,
                    limit_bytes: 0,
                }),
                secrets: t.config().secrets.controller_expand_volume_secret.clone(),
                volume_capability: Some(t.capability()),
            })
            .await
            .must("ControllerExpandVolume")?;
        size = resp.capacity_bytes.max(target);
    }
    let mut req = expand_request(&t, &p.volume_id, &p.target);
    req.staging_target_path = p.staging.clone().unwrap_or_default();
    if size > 0 {
        req.capacity_range = Some(csi::CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        });
    }
    let resp = t
        .node()
        .node_expand_volume(req)
        .await
        .must("NodeExpandVolume")?;
    ensure!(
        resp.capacity_bytes == 0 || resp.capacity_bytes >= size,
        "NodeExpandVolume returned capacity {}, less than the requested {}",
        bytes(resp.capacity_bytes),
        bytes(size)
    );
    unpublish(&t, p, 1).await
}

/// A volume made available on this node by [`publish`].
struct Published {
    volume_id: String,
    capacity_bytes: i64,
    node_id: String,
    controller_published: bool,
    staging: Option<String>,
    target: String,
}

/// A failed stage or publish: a mount this environment may not do is a
/// skip, anything else a failure.
fn mount_verdict(rpc: &str, status: &tonic::Status) -> Verdict {
    if is_mount_permission_problem(status) {
        Verdict::Skip(format!(
            "{rpc} could not mount here (no privilege to mount in this environment?): {}",
            status_text(status)
        ))
    } else {
        Verdict::Fail(format!("{rpc} failed: {}", status_text(status)))
    }
}

/// Creates a volume and takes it through ControllerPublish (if supported),
/// NodeStage (if supported) and NodePublish, each `times` times (more than
/// once checks idempotency), checking the target path appears.
async fn publish(t: &T, times: usize) -> Result<Published, Verdict> {
    let p = prepare(t, times, true).await?;
    let target = target_path(t)?;
    for _ in 0..times {
        t.node()
            .node_publish_volume(p.publish_request(t, &target))
            .await
            .map_err(|s| mount_verdict("NodePublishVolume", &s))?;
        t.register(Resource::NodePublish {
            volume_id: p.volume.volume_id.clone(),
            target_path: target.clone(),
        });
    }
    ensure!(
        Path::new(&target).symlink_metadata().is_ok(),
        "NodePublishVolume succeeded but target path {target} does not exist (creating it is the SP's job)"
    );
    Ok(Published {
        volume_id: p.volume.volume_id,
        capacity_bytes: p.volume.capacity_bytes,
        node_id: p.node_id,
        controller_published: p.controller_published,
        staging: p.staging,
        target,
    })
}

/// Reverses [`publish`], each call `times` times, and deletes the volume;
/// checks the target path is removed.
async fn unpublish(t: &T, p: Published, times: usize) -> CheckOutcome {
    for i in 0..times {
        t.node()
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: p.volume_id.clone(),
                target_path: p.target.clone(),
            })
            .await
            .must(if i == 0 {
                "NodeUnpublishVolume"
            } else {
                "repeated NodeUnpublishVolume"
            })?;
        t.forget(&Resource::NodePublish {
            volume_id: p.volume_id.clone(),
            target_path: p.target.clone(),
        });
        ensure!(
            Path::new(&p.target).symlink_metadata().is_err(),
            "target path {} still exists after NodeUnpublishVolume (the SP must delete what it created)",
            p.target
        );
    }
    if let Some(staging) = &p.staging {
        for i in 0..times {
            t.node()
                .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                    volume_id: p.volume_id.clone(),
                    staging_target_path: staging.clone(),
                })
                .await
                .must(if i == 0 {
                    "NodeUnstageVolume"
                } else {
                    "repeated NodeUnstageVolume"
                })?;
            t.forget(&Resource::NodeStage {
                volume_id: p.volume_id.clone(),
                staging_path: staging.clone(),
            });
        }
    }
    if p.controller_published {
        for i in 0..times {
            t.ctrl()
                .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                    volume_id: p.volume_id.clone(),
                    node_id: p.node_id.clone(),
                    secrets: t
                        .config()
                        .secrets
                        .controller_unpublish_volume_secret
                        .clone(),
                })
                .await
                .must(if i == 0 {
                    "ControllerUnpublishVolume"
                } else {
                    "repeated ControllerUnpublishVolume"
                })?;
            t.forget(&Resource::ControllerPublish {
                volume_id: p.volume_id.clone(),
                node_id: p.node_id.clone(),
            });
        }
    }
    t.delete_volume(&p.volume_id).await
}

async fn works(t: T) -> CheckOutcome {
    let p = publish(&t, 1).await?;
    unpublish(&t, p, 1).await
}

async fn idempotent(t: T) -> CheckOutcome {
    let p = publish(&t, 2).await?;
    unpublish(&t, p, 2).await
}

async fn stats_works(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::GetVolumeStats)?;
    let p = publish(&t, 1).await?;
    let resp = t
        .node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: p.volume_id.clone(),
            volume_path: p.target.clone(),
            staging_target_path: p.staging.clone().unwrap_or_default(),
        })
        .await
        .must("NodeGetVolumeStats")?;
    for (i, usage) in resp.usage.iter().enumerate() {
        match csi::volume_usage::Unit::try_from(usage.unit) {
            Ok(csi::volume_usage::Unit::Unknown) | Err(_) => {
                fail!(
                    "usage entry {i} has unit {} (not BYTES or INODES)",
                    usage.unit
                )
            }
            Ok(_) => {}
        }
        ensure!(
            usage.available >= 0 && usage.total >= 0 && usage.used >= 0,
            "usage entry {i} has a negative value: {usage:?}"
        );
    }
    unpublish(&t, p, 1).await
}
