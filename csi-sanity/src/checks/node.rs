//! Node service: capabilities, NodeGetInfo, argument checks of the
//! stage/publish calls and a stage/publish/unpublish/unstage round trip.

use std::path::Path;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi::node_service_capability::rpc::Type as NodeRpc;
use csi::plugin_capability::service::Type as PluginService;
use csi_proto::v1 as csi;
use tonic::Code;

use super::util::{
    Must, controller_has, ensure, expect_code, fail, is_mount_permission_problem, node_has,
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
pub const WORKS: &str = "Node Service should work";
pub const IDEMPOTENT: &str = "Node Service should be idempotent";

pub fn checks() -> Vec<Check> {
    vec![
        check!(CAPS, capabilities),
        check!(INFO, info),
        check!(PUBLISH_NO_ID, publish_no_id),
        check!(PUBLISH_NO_TARGET, publish_no_target),
        check!(PUBLISH_NO_CAP, publish_no_cap),
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

async fn publish_no_id(t: T) -> CheckOutcome {
    let target = target_path(&t)?;
    let res = t
        .node()
        .node_publish_volume(publish_request(&t, "", &target))
        .await;
    expect_code(
        res,
        "NodePublishVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn publish_no_target(t: T) -> CheckOutcome {
    let res = t
        .node()
        .node_publish_volume(publish_request(&t, &missing_volume_id(&t), ""))
        .await;
    expect_code(
        res,
        "NodePublishVolume without a target path",
        Code::InvalidArgument,
    )
}

async fn publish_no_cap(t: T) -> CheckOutcome {
    let target = target_path(&t)?;
    let mut req = publish_request(&t, &missing_volume_id(&t), &target);
    req.volume_capability = None;
    let res = t.node().node_publish_volume(req).await;
    expect_code(
        res,
        "NodePublishVolume without a volume capability",
        Code::InvalidArgument,
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
    let res = t
        .node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: missing_volume_id(&t),
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
    let res = t
        .node()
        .node_stage_volume(stage_request(&t, &missing_volume_id(&t), ""))
        .await;
    expect_code(
        res,
        "NodeStageVolume without a staging target path",
        Code::InvalidArgument,
    )
}

async fn stage_no_cap(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::StageUnstageVolume)?;
    let staging = t.fresh_dir(&t.cx.staging_dir, "staging")?;
    let mut req = stage_request(&t, &missing_volume_id(&t), &path_text(&staging));
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
    let res = t
        .node()
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: missing_volume_id(&t),
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
    let res = t
        .node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: missing_volume_id(&t),
            volume_path: String::new(),
            staging_target_path: String::new(),
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

async fn expand_no_id(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::ExpandVolume)?;
    let dir = t.fresh_dir(&t.cx.mount_dir, "expand")?;
    let res = t
        .node()
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: String::new(),
            volume_path: path_text(&dir),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: t.config().expand_size(),
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await;
    expect_code(
        res,
        "NodeExpandVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn expand_no_path(t: T) -> CheckOutcome {
    t.require_node_cap(NodeRpc::ExpandVolume)?;
    let res = t
        .node()
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: missing_volume_id(&t),
            volume_path: String::new(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: t.config().expand_size(),
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await;
    expect_code(
        res,
        "NodeExpandVolume without a volume path",
        Code::InvalidArgument,
    )
}

/// A volume made available on this node by [`publish`].
struct Published {
    volume_id: String,
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
    if !controller_has(&t.cx, Rpc::CreateDeleteVolume) {
        return Err(Verdict::Skip(
            "the round trip needs a volume and the driver does not advertise CREATE_DELETE_VOLUME"
                .into(),
        ));
    }
    let node_id = t.node_id()?;
    let mut req = t.volume_request(&t.unique_name("node"));
    if plugin_has(&t.cx, PluginService::VolumeAccessibilityConstraints)
        && let Some(topo) =
            t.cx.discovery
                .node_info
                .as_ref()
                .ok()
                .and_then(|i| i.accessible_topology.clone())
    {
        req.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![topo.clone()],
            preferred: vec![topo],
        });
    }
    let vol = t.create_volume(req).await?;
    let mut publish_context = Default::default();
    let controller_published = controller_has(&t.cx, Rpc::PublishUnpublishVolume);
    if controller_published {
        for _ in 0..times {
            let resp = t
                .ctrl()
                .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                    volume_id: vol.volume_id.clone(),
                    node_id: node_id.clone(),
                    volume_capability: Some(t.capability()),
                    readonly: false,
                    secrets: t.config().secrets.controller_publish_volume_secret.clone(),
                    volume_context: vol.volume_context.clone(),
                })
                .await
                .must("ControllerPublishVolume")?;
            t.register(Resource::ControllerPublish {
                volume_id: vol.volume_id.clone(),
                node_id: node_id.clone(),
            });
            publish_context = resp.publish_context;
        }
    }
    let mut staging = None;
    if node_has(&t.cx, NodeRpc::StageUnstageVolume) {
        let dir = path_text(&t.fresh_dir(&t.cx.staging_dir, "staging")?);
        for _ in 0..times {
            let mut req = stage_request(t, &vol.volume_id, &dir);
            req.publish_context = publish_context.clone();
            req.volume_context = vol.volume_context.clone();
            t.node()
                .node_stage_volume(req)
                .await
                .map_err(|s| mount_verdict("NodeStageVolume", &s))?;
            t.register(Resource::NodeStage {
                volume_id: vol.volume_id.clone(),
                staging_path: dir.clone(),
            });
        }
        staging = Some(dir);
    }
    let target = target_path(t)?;
    for _ in 0..times {
        let mut req = publish_request(t, &vol.volume_id, &target);
        req.publish_context = publish_context.clone();
        req.volume_context = vol.volume_context.clone();
        req.staging_target_path = staging.clone().unwrap_or_default();
        t.node()
            .node_publish_volume(req)
            .await
            .map_err(|s| mount_verdict("NodePublishVolume", &s))?;
        t.register(Resource::NodePublish {
            volume_id: vol.volume_id.clone(),
            target_path: target.clone(),
        });
    }
    ensure!(
        Path::new(&target).symlink_metadata().is_ok(),
        "NodePublishVolume succeeded but target path {target} does not exist (creating it is the SP's job)"
    );
    Ok(Published {
        volume_id: vol.volume_id,
        node_id,
        controller_published,
        staging,
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
