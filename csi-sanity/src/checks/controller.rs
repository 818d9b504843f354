//! Controller service: capabilities, CreateVolume, DeleteVolume,
//! ValidateVolumeCapabilities, ListVolumes, GetCapacity,
//! ControllerGetVolume, ControllerPublish/Unpublish and ControllerExpandVolume.

use std::collections::HashSet;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi::plugin_capability::service::Type as PluginService;
use csi::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use csi_proto::v1 as csi;
use tonic::Code;

use super::util::{Must, bytes, ensure, expect_code, fail, list_all_volumes, plugin_has};
use crate::runner::{Check, CheckOutcome, Resource, T, Verdict};

pub const CAPS: &str =
    "Controller Service ControllerGetCapabilities should return appropriate capabilities";
pub const CAPACITY_PLAIN: &str =
    "Controller Service GetCapacity should return capacity (no optional values added)";
pub const CAPACITY_WITH_CAPS: &str = "Controller Service GetCapacity should return capacity for the test volume capability and parameters";
pub const LIST_PLAIN: &str =
    "Controller Service ListVolumes should return appropriate values (no optional values added)";
pub const LIST_BAD_TOKEN: &str =
    "Controller Service ListVolumes should fail when an invalid starting_token is passed";
pub const LIST_PRESENCE: &str = "Controller Service ListVolumes check the presence of new volumes and absence of deleted ones in the volume list";
pub const LIST_PAGES: &str = "Controller Service ListVolumes should return next token when a limited number of entries are requested";
pub const CREATE_NO_NAME: &str =
    "Controller Service CreateVolume should fail when no name is provided";
pub const CREATE_NO_CAPS: &str =
    "Controller Service CreateVolume should fail when no volume capabilities are provided";
pub const CREATE_NO_CAPACITY: &str =
    "Controller Service CreateVolume should return appropriate values SingleNodeWriter NoCapacity";
pub const CREATE_WITH_CAPACITY: &str = "Controller Service CreateVolume should return appropriate values SingleNodeWriter WithCapacity";
pub const CREATE_IDEMPOTENT: &str = "Controller Service CreateVolume should not fail when requesting to create a volume with already existing name and same capacity";
pub const CREATE_CONFLICT: &str = "Controller Service CreateVolume should fail when requesting to create a volume with already existing name and different capacity";
pub const CREATE_RANGE: &str =
    "Controller Service CreateVolume should return a capacity within the requested capacity range";
pub const CREATE_MAX_NAME: &str =
    "Controller Service CreateVolume should not fail when creating volume with maximum-length name";
pub const CREATE_PARAMETERS: &str =
    "Controller Service CreateVolume should create a volume with the test volume parameters";
pub const CREATE_FROM_SNAPSHOT: &str =
    "Controller Service CreateVolume should create volume from an existing source snapshot";
pub const CREATE_SNAPSHOT_MISSING: &str =
    "Controller Service CreateVolume should fail when the volume source snapshot is not found";
pub const CREATE_FROM_VOLUME: &str =
    "Controller Service CreateVolume should create volume from an existing source volume";
pub const CREATE_VOLUME_MISSING: &str =
    "Controller Service CreateVolume should fail when the volume source volume is not found";
pub const CREATE_TOPOLOGY: &str = "Controller Service CreateVolume should return accessible topology when the driver advertises VOLUME_ACCESSIBILITY_CONSTRAINTS";
pub const CREATE_NO_TOPOLOGY: &str = "Controller Service CreateVolume should not return accessible topology when the driver does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS";
pub const DELETE_NO_ID: &str =
    "Controller Service DeleteVolume should fail when no volume id is provided";
pub const DELETE_UNKNOWN: &str =
    "Controller Service DeleteVolume should succeed when an invalid volume id is used";
pub const DELETE_PLAIN: &str =
    "Controller Service DeleteVolume should return appropriate values (no optional values added)";
pub const DELETE_TWICE: &str =
    "Controller Service DeleteVolume should succeed when the same volume is deleted twice";
pub const VALIDATE_NO_ID: &str =
    "Controller Service ValidateVolumeCapabilities should fail when no volume id is provided";
pub const VALIDATE_NO_CAPS: &str = "Controller Service ValidateVolumeCapabilities should fail when no volume capabilities are provided";
pub const VALIDATE_PLAIN: &str = "Controller Service ValidateVolumeCapabilities should return appropriate values (no optional values added)";
pub const VALIDATE_MISSING: &str = "Controller Service ValidateVolumeCapabilities should fail when the requested volume does not exist";
pub const GET_VOLUME: &str =
    "Controller Service ControllerGetVolume should return appropriate values for a created volume";
pub const GET_VOLUME_MISSING: &str =
    "Controller Service ControllerGetVolume should fail when the volume does not exist";
pub const GET_VOLUME_NO_ID: &str =
    "Controller Service ControllerGetVolume should fail when no volume id is provided";
pub const PUBLISH_NO_ID: &str =
    "Controller Service ControllerPublishVolume should fail when no volume id is provided";
pub const PUBLISH_NO_NODE: &str =
    "Controller Service ControllerPublishVolume should fail when no node id is provided";
pub const PUBLISH_NO_CAP: &str =
    "Controller Service ControllerPublishVolume should fail when no volume capability is provided";
pub const PUBLISH_MISSING_VOLUME: &str =
    "Controller Service ControllerPublishVolume should fail when the volume does not exist";
pub const PUBLISH_MISSING_NODE: &str =
    "Controller Service ControllerPublishVolume should fail when the node does not exist";
pub const UNPUBLISH_NO_ID: &str =
    "Controller Service ControllerUnpublishVolume should fail when no volume id is provided";
pub const LIFECYCLE: &str = "Controller Service volume lifecycle should work";
pub const EXPAND_NO_ID: &str =
    "ExpandVolume [Controller Server] should fail if no volume id is given";
pub const EXPAND_NO_RANGE: &str =
    "ExpandVolume [Controller Server] should fail if no capacity range is given";
pub const EXPAND_MISSING: &str =
    "ExpandVolume [Controller Server] should fail when the volume does not exist";
pub const EXPAND_WORKS: &str = "ExpandVolume [Controller Server] should work";

pub fn checks() -> Vec<Check> {
    vec![
        check!(CAPS, capabilities),
        check!(CAPACITY_PLAIN, capacity_plain),
        check!(CAPACITY_WITH_CAPS, capacity_with_caps),
        check!(LIST_PLAIN, list_plain),
        check!(LIST_BAD_TOKEN, list_bad_token),
        check!(LIST_PRESENCE, list_presence),
        check!(LIST_PAGES, list_pages),
        check!(CREATE_NO_NAME, create_no_name),
        check!(CREATE_NO_CAPS, create_no_caps),
        check!(CREATE_NO_CAPACITY, create_no_capacity),
        check!(CREATE_WITH_CAPACITY, create_with_capacity),
        check!(CREATE_IDEMPOTENT, create_idempotent),
        check!(CREATE_CONFLICT, create_conflict),
        check!(CREATE_RANGE, create_range),
        check!(CREATE_MAX_NAME, create_max_name),
        check!(CREATE_PARAMETERS, create_parameters),
        check!(CREATE_FROM_SNAPSHOT, create_from_snapshot),
        check!(CREATE_SNAPSHOT_MISSING, create_snapshot_missing),
        check!(CREATE_FROM_VOLUME, create_from_volume),
        check!(CREATE_VOLUME_MISSING, create_volume_missing),
        check!(CREATE_TOPOLOGY, create_topology),
        check!(CREATE_NO_TOPOLOGY, create_no_topology),
        check!(DELETE_NO_ID, delete_no_id),
        check!(DELETE_UNKNOWN, delete_unknown),
        check!(DELETE_PLAIN, delete_plain),
        check!(DELETE_TWICE, delete_twice),
        check!(VALIDATE_NO_ID, validate_no_id),
        check!(VALIDATE_NO_CAPS, validate_no_caps),
        check!(VALIDATE_PLAIN, validate_plain),
        check!(VALIDATE_MISSING, validate_missing),
        check!(GET_VOLUME, get_volume),
        check!(GET_VOLUME_MISSING, get_volume_missing),
        check!(GET_VOLUME_NO_ID, get_volume_no_id),
        check!(PUBLISH_NO_ID, publish_no_id),
        check!(PUBLISH_NO_NODE, publish_no_node),
        check!(PUBLISH_NO_CAP, publish_no_cap),
        check!(PUBLISH_MISSING_VOLUME, publish_missing_volume),
        check!(PUBLISH_MISSING_NODE, publish_missing_node),
        check!(UNPUBLISH_NO_ID, unpublish_no_id),
        check!(LIFECYCLE, lifecycle),
        check!(EXPAND_NO_ID, expand_no_id),
        check!(EXPAND_NO_RANGE, expand_no_range),
        check!(EXPAND_MISSING, expand_missing),
        check!(EXPAND_WORKS, expand_works),
    ]
}

/// Registers a volume a negative test created by mistake, so it is
/// cleaned up.
fn register_created(
    t: &T,
    res: &Result<tonic::Response<csi::CreateVolumeResponse>, tonic::Status>,
) {
    if let Ok(resp) = res
        && let Some(v) = &resp.get_ref().volume
        && !v.volume_id.is_empty()
    {
        t.register(Resource::Volume(v.volume_id.clone()));
    }
}

/// An id no driver has handed out in this run.
fn missing_volume_id(t: &T) -> String {
    format!("sanity-{}-nonexistent-volume", t.run_id())
}

fn missing_node_id(t: &T) -> String {
    format!("sanity-{}-nonexistent-node", t.run_id())
}

async fn capabilities(t: T) -> CheckOutcome {
    t.require_controller()?;
    let resp = t
        .ctrl()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .must("ControllerGetCapabilities")?;
    for (i, cap) in resp.capabilities.iter().enumerate() {
        let Some(csi::controller_service_capability::Type::Rpc(rpc)) = &cap.r#type else {
            fail!("capability {i} has no rpc type");
        };
        match Rpc::try_from(rpc.r#type) {
            Ok(Rpc::Unknown) => fail!("capability {i} is UNKNOWN"),
            Ok(_) => {}
            Err(_) => fail!("capability {i} has unknown type {}", rpc.r#type),
        }
    }
    Ok(())
}

fn check_capacity(resp: &csi::GetCapacityResponse) -> CheckOutcome {
    ensure!(
        resp.available_capacity >= 0,
        "GetCapacity returned negative available_capacity {}",
        resp.available_capacity
    );
    if let Some(max) = &resp.maximum_volume_size {
        ensure!(
            *max >= 0,
            "GetCapacity returned negative maximum_volume_size {}",
            *max
        );
    }
    if let Some(min) = &resp.minimum_volume_size {
        ensure!(
            *min >= 0,
            "GetCapacity returned negative minimum_volume_size {}",
            *min
        );
        if let Some(max) = &resp.maximum_volume_size {
            ensure!(
                *min <= *max,
                "GetCapacity minimum_volume_size {} exceeds maximum_volume_size {}",
                *min,
                *max
            );
        }
    }
    Ok(())
}

async fn capacity_plain(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::GetCapacity)?;
    let resp = t
        .ctrl()
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .must("GetCapacity")?;
    check_capacity(&resp)
}

async fn capacity_with_caps(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::GetCapacity)?;
    let topology =
        t.cx.discovery
            .node_info
            .as_ref()
            .ok()
            .and_then(|i| i.accessible_topology.clone())
            .filter(|_| plugin_has(&t.cx, PluginService::VolumeAccessibilityConstraints));
    let resp = t
        .ctrl()
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![t.capability()],
            parameters: t.config().test_volume_parameters.clone(),
            accessible_topology: topology,
        })
        .await
        .must("GetCapacity")?;
    check_capacity(&resp)
}

async fn list_plain(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ListVolumes)?;
    let ids = list_all_volumes(&t, 0).await?;
    let mut seen = HashSet::new();
    for id in &ids {
        ensure!(
            seen.insert(id),
            "ListVolumes returned volume {id:?} more than once"
        );
    }
    Ok(())
}

async fn list_bad_token(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ListVolumes)?;
    let res = t
        .ctrl()
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 0,
            starting_token: "invalid-token".into(),
        })
        .await;
    expect_code(
        res,
        "ListVolumes with starting_token \"invalid-token\"",
        Code::Aborted,
    )
}

async fn list_presence(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ListVolumes)?;
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let vol = t.new_volume("list").await?;
    let ids = list_all_volumes(&t, 0).await?;
    ensure!(
        ids.contains(&vol.volume_id),
        "new volume {:?} is missing from ListVolumes",
        vol.volume_id
    );
    t.delete_volume(&vol.volume_id).await?;
    let ids = list_all_volumes(&t, 0).await?;
    ensure!(
        !ids.contains(&vol.volume_id),
        "deleted volume {:?} is still listed by ListVolumes",
        vol.volume_id
    );
    Ok(())
}

async fn list_pages(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ListVolumes)?;
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    const MAX_ENTRIES: i32 = 2;
    let mut ours = Vec::new();
    for _ in 0..3 {
        ours.push(t.new_volume("page").await?.volume_id);
    }
    let resp = t
        .ctrl()
        .list_volumes(csi::ListVolumesRequest {
            max_entries: MAX_ENTRIES,
            starting_token: String::new(),
        })
        .await
        .must("ListVolumes")?;
    ensure!(
        resp.entries.len() <= MAX_ENTRIES as usize,
        "ListVolumes returned {} entries with max_entries {MAX_ENTRIES}",
        resp.entries.len()
    );
    ensure!(
        !resp.next_token.is_empty(),
        "ListVolumes with max_entries {MAX_ENTRIES} returned no next_token although at least 3 volumes exist"
    );
    let paged = list_all_volumes(&t, MAX_ENTRIES).await?;
    let mut seen = HashSet::new();
    for id in &paged {
        ensure!(
            seen.insert(id.clone()),
            "volume {id:?} appeared on more than one page"
        );
    }
    for id in &ours {
        ensure!(
            seen.contains(id),
            "volume {id:?} was not on any page of ListVolumes with max_entries {MAX_ENTRIES}"
        );
    }
    let all: HashSet<String> = list_all_volumes(&t, 0).await?.into_iter().collect();
    ensure!(
        all == seen,
        "walking the pages found {} volumes, an unpaged listing {}",
        seen.len(),
        all.len()
    );
    Ok(())
}

async fn create_no_name(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let mut req = t.volume_request("");
    req.name.clear();
    let res = t.ctrl().create_volume(req).await;
    register_created(&t, &res);
    expect_code(res, "CreateVolume without a name", Code::InvalidArgument)
}

async fn create_no_caps(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let mut req = t.volume_request(&t.unique_name("nocaps"));
    req.volume_capabilities.clear();
    let res = t.ctrl().create_volume(req).await;
    register_created(&t, &res);
    expect_code(
        res,
        "CreateVolume without volume capabilities",
        Code::InvalidArgument,
    )
}

async fn create_no_capacity(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let mut req = t.volume_request(&t.unique_name("nocapacity"));
    req.capacity_range = None;
    let vol = t.create_volume(req).await?;
    ensure!(
        vol.capacity_bytes >= 0,
        "CreateVolume returned negative capacity_bytes {}",
        vol.capacity_bytes
    );
    Ok(())
}

async fn create_with_capacity(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let size = t.config().test_volume_size;
    let req = t.volume_request(&t.unique_name("capacity"));
    let res = t.ctrl().create_volume(req.clone()).await;
    if let Err(s) = &res
        && matches!(s.code(), Code::OutOfRange | Code::Unimplemented)
    {
        return Err(Verdict::Skip(format!(
            "driver does not support required_bytes {}: {}",
            bytes(size),
            super::util::status_text(s)
        )));
    }
    let resp = res.must("CreateVolume")?;
    let Some(vol) = resp.volume else {
        fail!("CreateVolume returned no volume");
    };
    t.register(Resource::Volume(vol.volume_id.clone()));
    ensure!(
        !vol.volume_id.is_empty(),
        "CreateVolume returned an empty volume_id"
    );
    ensure!(
        vol.capacity_bytes == 0 || vol.capacity_bytes >= size,
        "CreateVolume returned capacity_bytes {}, less than required_bytes {}",
        bytes(vol.capacity_bytes),
        bytes(size)
    );
    Ok(())
}

async fn create_idempotent(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let size = t.config().test_volume_size;
    let req = t.volume_request(&t.unique_name("twice"));
    let first = t.create_volume(req.clone()).await?;
    let second = t.create_volume(req).await?;
    ensure!(
        first.volume_id == second.volume_id,
        "repeating CreateVolume with the same name and arguments returned a different volume: {:?} then {:?}",
        first.volume_id,
        second.volume_id
    );
    ensure!(
        first.capacity_bytes == second.capacity_bytes,
        "repeating CreateVolume returned capacity {} then {}",
        bytes(first.capacity_bytes),
        bytes(second.capacity_bytes)
    );
    ensure!(
        second.capacity_bytes == 0 || second.capacity_bytes >= size,
        "repeated CreateVolume returned capacity {} below required_bytes {}",
        bytes(second.capacity_bytes),
        bytes(size)
    );
    Ok(())
}

async fn create_conflict(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let size = t.config().test_volume_size;
    let mut req = t.volume_request(&t.unique_name("conflict"));
    req.capacity_range = Some(csi::CapacityRange {
        required_bytes: size,
        limit_bytes: size,
    });
    let first = t.create_volume(req.clone()).await?;
    // A capacity of 0 means "unknown" (csi.proto, `Volume.capacity_bytes`):
    // a driver that cannot tell a volume's size cannot tell a request for
    // another size from a repeat either. Upstream csi-sanity skips for the
    // same reason, in the same words.
    if first.capacity_bytes == 0 {
        return Err(Verdict::Skip(
            "capacity of the volume is unknown: CreateVolume answered capacity_bytes 0".to_owned(),
        ));
    }
    let bigger = size.saturating_mul(2);
    req.capacity_range = Some(csi::CapacityRange {
        required_bytes: bigger,
        limit_bytes: bigger,
    });
    let res = t.ctrl().create_volume(req).await;
    register_created(&t, &res);
    expect_code(
        res,
        "CreateVolume with an existing name and an incompatible capacity",
        Code::AlreadyExists,
    )
}

async fn create_range(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let required = t.config().test_volume_size;
    let limit = required.saturating_mul(2);
    let mut req = t.volume_request(&t.unique_name("range"));
    req.capacity_range = Some(csi::CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    });
    let res = t.ctrl().create_volume(req).await;
    register_created(&t, &res);
    if let Err(s) = &res
        && s.code() == Code::OutOfRange
    {
        return Err(Verdict::Skip(format!(
            "driver cannot provision within [{}, {}]: {}",
            bytes(required),
            bytes(limit),
            super::util::status_text(s)
        )));
    }
    let Some(vol) = res.must("CreateVolume")?.volume else {
        fail!("CreateVolume returned no volume");
    };
    // 0 means "unknown" in the spec; any known capacity must be in range.
    ensure!(
        vol.capacity_bytes == 0 || (required..=limit).contains(&vol.capacity_bytes),
        "CreateVolume returned capacity {} outside the requested range [{}, {}]",
        bytes(vol.capacity_bytes),
        bytes(required),
        bytes(limit)
    );
    Ok(())
}

async fn create_max_name(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let mut name = t.unique_name("maxlen");
    name.push('-');
    while name.len() < 128 {
        name.push('x');
    }
    let vol = t.create_volume(t.volume_request(&name)).await?;
    ensure!(
        vol.capacity_bytes >= 0,
        "CreateVolume returned negative capacity_bytes {}",
        vol.capacity_bytes
    );
    Ok(())
}

async fn create_parameters(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    if t.config().test_volume_parameters.is_empty() {
        return Err(Verdict::Skip(
            "no test volume parameters given (--test-volume-parameters)".into(),
        ));
    }
    let vol = t.new_volume("params").await?;
    let resp = t
        .ctrl()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: vol.volume_id.clone(),
            volume_context: vol.volume_context.clone(),
            volume_capabilities: vec![t.capability()],
            parameters: t.config().test_volume_parameters.clone(),
            secrets: t
                .config()
                .secrets
                .controller_validate_volume_capabilities_secret
                .clone(),
            ..Default::default()
        })
        .await
        .must("ValidateVolumeCapabilities")?;
    ensure!(
        resp.confirmed.is_some(),
        "ValidateVolumeCapabilities did not confirm the volume created with the test parameters: {:?}",
        resp.message
    );
    Ok(())
}

fn source_text(source: &Option<csi::VolumeContentSource>) -> String {
    match source.as_ref().and_then(|s| s.r#type.as_ref()) {
        None => "no content_source".into(),
        Some(Source::Snapshot(s)) => format!("snapshot {:?}", s.snapshot_id),
        Some(Source::Volume(v)) => format!("volume {:?}", v.volume_id),
    }
}

async fn create_from_snapshot(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    t.require_controller_cap(Rpc::CreateDeleteSnapshot)?;
    let (_, snap) = t.new_snapshot("restore").await?;
    let mut req = t.volume_request(&t.unique_name("from-snap"));
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(Source::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        })),
    });
    let vol = t.create_volume(req).await?;
    match vol.content_source.as_ref().and_then(|s| s.r#type.as_ref()) {
        Some(Source::Snapshot(s)) if s.snapshot_id == snap.snapshot_id => Ok(()),
        _ => fail!(
            "volume created from snapshot {:?} reports {}; the SP must return the content source it used",
            snap.snapshot_id,
            source_text(&vol.content_source)
        ),
    }
}

async fn create_snapshot_missing(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    t.require_controller_cap(Rpc::CreateDeleteSnapshot)?;
    let mut req = t.volume_request(&t.unique_name("from-missing-snap"));
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(Source::Snapshot(SnapshotSource {
            snapshot_id: format!("sanity-{}-nonexistent-snapshot", t.run_id()),
        })),
    });
    let res = t.ctrl().create_volume(req).await;
    register_created(&t, &res);
    expect_code(
        res,
        "CreateVolume from a nonexistent snapshot",
        Code::NotFound,
    )
}

async fn create_from_volume(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    t.require_controller_cap(Rpc::CloneVolume)?;
    let source = t.new_volume("clone-src").await?;
    let mut req = t.volume_request(&t.unique_name("clone"));
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(Source::Volume(VolumeSource {
            volume_id: source.volume_id.clone(),
        })),
    });
    let vol = t.create_volume(req).await?;
    ensure!(
        vol.volume_id != source.volume_id,
        "the clone has the same volume_id as its source ({:?})",
        vol.volume_id
    );
    match vol.content_source.as_ref().and_then(|s| s.r#type.as_ref()) {
        Some(Source::Volume(v)) if v.volume_id == source.volume_id => Ok(()),
        _ => fail!(
            "volume cloned from {:?} reports {}; the SP must return the content source it used",
            source.volume_id,
            source_text(&vol.content_source)
        ),
    }
}

async fn create_volume_missing(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    t.require_controller_cap(Rpc::CloneVolume)?;
    let mut req = t.volume_request(&t.unique_name("clone-missing"));
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(Source::Volume(VolumeSource {
            volume_id: missing_volume_id(&t),
        })),
    });
    let res = t.ctrl().create_volume(req).await;
    register_created(&t, &res);
    expect_code(
        res,
        "CreateVolume from a nonexistent source volume",
        Code::NotFound,
    )
}

/// Whether two topologies agree on every segment key they share.
fn consistent(a: &csi::Topology, b: &csi::Topology) -> bool {
    a.segments
        .iter()
        .all(|(k, v)| b.segments.get(k).is_none_or(|w| w == v))
}

async fn create_topology(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    if !plugin_has(&t.cx, PluginService::VolumeAccessibilityConstraints) {
        return Err(Verdict::Skip(
            "driver does not advertise the VOLUME_ACCESSIBILITY_CONSTRAINTS plugin capability"
                .into(),
        ));
    }
    let node_topology =
        t.cx.discovery
            .node_info
            .as_ref()
            .ok()
            .and_then(|i| i.accessible_topology.clone())
            .filter(|topo| !topo.segments.is_empty());
    let mut req = t.volume_request(&t.unique_name("topology"));
    if let Some(topo) = &node_topology {
        req.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![topo.clone()],
            preferred: vec![topo.clone()],
        });
    }
    let vol = t.create_volume(req).await?;
    ensure!(
        !vol.accessible_topology.is_empty(),
        "the driver advertises VOLUME_ACCESSIBILITY_CONSTRAINTS but CreateVolume returned no accessible_topology"
    );
    if let Some(topo) = &node_topology {
        ensure!(
            vol.accessible_topology.iter().any(|v| consistent(v, topo)),
            "the volume must be accessible from the requisite topology {:?}, CreateVolume returned {:?}",
            topo.segments,
            vol.accessible_topology
                .iter()
                .map(|t| &t.segments)
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}

async fn create_no_topology(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    if plugin_has(&t.cx, PluginService::VolumeAccessibilityConstraints) {
        return Err(Verdict::Skip(
            "driver advertises the VOLUME_ACCESSIBILITY_CONSTRAINTS plugin capability".into(),
        ));
    }
    let vol = t.new_volume("no-topology").await?;
    ensure!(
        vol.accessible_topology.is_empty(),
        "CreateVolume returned accessible_topology although the driver does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS"
    );
    Ok(())
}

async fn delete_no_id(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let res = t
        .ctrl()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: String::new(),
            secrets: t.config().secrets.delete_volume_secret.clone(),
        })
        .await;
    expect_code(
        res,
        "DeleteVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn delete_unknown(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let id = missing_volume_id(&t);
    t.ctrl()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: t.config().secrets.delete_volume_secret.clone(),
        })
        .await
        .map_err(|s| {
            Verdict::Fail(format!(
                "DeleteVolume of unknown volume {id:?} returned {}, the spec requires OK",
                super::util::status_text(&s)
            ))
        })?;
    Ok(())
}

async fn delete_plain(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let vol = t.new_volume("delete").await?;
    t.delete_volume(&vol.volume_id).await
}

async fn delete_twice(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let vol = t.new_volume("delete-twice").await?;
    t.delete_volume(&vol.volume_id).await?;
    t.ctrl()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: t.config().secrets.delete_volume_secret.clone(),
        })
        .await
        .map_err(|s| {
            Verdict::Fail(format!(
                "second DeleteVolume of {:?} returned {}, the spec requires OK",
                vol.volume_id,
                super::util::status_text(&s)
            ))
        })?;
    Ok(())
}

fn validate_request(t: &T, volume_id: &str) -> csi::ValidateVolumeCapabilitiesRequest {
    csi::ValidateVolumeCapabilitiesRequest {
        volume_id: volume_id.to_owned(),
        volume_capabilities: vec![t.capability()],
        secrets: t
            .config()
            .secrets
            .controller_validate_volume_capabilities_secret
            .clone(),
        ..Default::default()
    }
}

async fn validate_no_id(t: T) -> CheckOutcome {
    t.require_controller()?;
    let res = t
        .ctrl()
        .validate_volume_capabilities(validate_request(&t, ""))
        .await;
    expect_code(
        res,
        "ValidateVolumeCapabilities without a volume id",
        Code::InvalidArgument,
    )
}

async fn validate_no_caps(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let vol = t.new_volume("validate-nocaps").await?;
    let mut req = validate_request(&t, &vol.volume_id);
    req.volume_capabilities.clear();
    let res = t.ctrl().validate_volume_capabilities(req).await;
    expect_code(
        res,
        "ValidateVolumeCapabilities without volume capabilities",
        Code::InvalidArgument,
    )
}

async fn validate_plain(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let vol = t.new_volume("validate").await?;
    let mut req = validate_request(&t, &vol.volume_id);
    req.volume_context = vol.volume_context.clone();
    req.parameters = t.config().test_volume_parameters.clone();
    let resp = t
        .ctrl()
        .validate_volume_capabilities(req)
        .await
        .must("ValidateVolumeCapabilities")?;
    let Some(confirmed) = resp.confirmed else {
        fail!(
            "ValidateVolumeCapabilities did not confirm the capability the volume was created with (message {:?})",
            resp.message
        );
    };
    ensure!(
        !confirmed.volume_capabilities.is_empty(),
        "ValidateVolumeCapabilities confirmed no volume capabilities"
    );
    Ok(())
}

async fn validate_missing(t: T) -> CheckOutcome {
    t.require_controller()?;
    let res = t
        .ctrl()
        .validate_volume_capabilities(validate_request(&t, &missing_volume_id(&t)))
        .await;
    expect_code(
        res,
        "ValidateVolumeCapabilities of a nonexistent volume",
        Code::NotFound,
    )
}

async fn get_volume(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::GetVolume)?;
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let vol = t.new_volume("get").await?;
    let resp = t
        .ctrl()
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: vol.volume_id.clone(),
        })
        .await
        .must("ControllerGetVolume")?;
    let Some(got) = resp.volume else {
        fail!("ControllerGetVolume returned no volume");
    };
    ensure!(
        got.volume_id == vol.volume_id,
        "ControllerGetVolume returned volume {:?}, asked for {:?}",
        got.volume_id,
        vol.volume_id
    );
    ensure!(
        got.capacity_bytes == vol.capacity_bytes || got.capacity_bytes == 0,
        "ControllerGetVolume reports capacity {}, CreateVolume reported {}",
        bytes(got.capacity_bytes),
        bytes(vol.capacity_bytes)
    );
    ensure!(
        resp.status.is_some(),
        "ControllerGetVolume returned no status (the field is REQUIRED)"
    );
    Ok(())
}

async fn get_volume_missing(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::GetVolume)?;
    let res = t
        .ctrl()
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: missing_volume_id(&t),
        })
        .await;
    expect_code(
        res,
        "ControllerGetVolume of a nonexistent volume",
        Code::NotFound,
    )
}

async fn get_volume_no_id(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::GetVolume)?;
    let res = t
        .ctrl()
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: String::new(),
        })
        .await;
    expect_code(
        res,
        "ControllerGetVolume without a volume id",
        Code::InvalidArgument,
    )
}

fn publish_request(t: &T, volume_id: &str, node_id: &str) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        node_id: node_id.to_owned(),
        volume_capability: Some(t.capability()),
        readonly: false,
        secrets: t.config().secrets.controller_publish_volume_secret.clone(),
        volume_context: Default::default(),
    }
}

// Each negative check below breaks one rule of an otherwise valid request:
// an existing volume (created for this node) and this node's id, because
// for an unknown volume or node NOT_FOUND is as right an answer as
// INVALID_ARGUMENT (the spec does not order a plugin's checks).

async fn publish_no_id(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::PublishUnpublishVolume)?;
    let node_id = t.node_id()?;
    let res = t
        .ctrl()
        .controller_publish_volume(publish_request(&t, "", &node_id))
        .await;
    expect_code(
        res,
        "ControllerPublishVolume without a volume id",
        Code::InvalidArgument,
    )
}

/// A volume this node can use, for the ControllerPublishVolume checks.
async fn volume_for_node(t: &T, purpose: &str) -> Result<csi::Volume, Verdict> {
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    t.create_volume(t.volume_request_on_node(&t.unique_name(purpose)))
        .await
}

async fn publish_no_node(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::PublishUnpublishVolume)?;
    let vol = volume_for_node(&t, "publish-nonode").await?;
    let mut req = publish_request(&t, &vol.volume_id, "");
    req.volume_context = vol.volume_context.clone();
    let res = t.ctrl().controller_publish_volume(req).await;
    expect_code(
        res,
        "ControllerPublishVolume without a node id",
        Code::InvalidArgument,
    )
}

async fn publish_no_cap(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::PublishUnpublishVolume)?;
    let node_id = t.node_id()?;
    let vol = volume_for_node(&t, "publish-nocap").await?;
    let mut req = publish_request(&t, &vol.volume_id, &node_id);
    req.volume_context = vol.volume_context.clone();
    req.volume_capability = None;
    let res = t.ctrl().controller_publish_volume(req).await;
    if res.is_ok() {
        t.register(Resource::ControllerPublish {
            volume_id: vol.volume_id.clone(),
            node_id,
        });
    }
    expect_code(
        res,
        "ControllerPublishVolume without a volume capability",
        Code::InvalidArgument,
    )
}

async fn publish_missing_volume(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::PublishUnpublishVolume)?;
    let node_id = t.node_id()?;
    let res = t
        .ctrl()
        .controller_publish_volume(publish_request(&t, &missing_volume_id(&t), &node_id))
        .await;
    expect_code(
        res,
        "ControllerPublishVolume of a nonexistent volume",
        Code::NotFound,
    )
}

async fn publish_missing_node(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::PublishUnpublishVolume)?;
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let vol = t.new_volume("publish-wrong-node").await?;
    let node_id = missing_node_id(&t);
    let res = t
        .ctrl()
        .controller_publish_volume(publish_request(&t, &vol.volume_id, &node_id))
        .await;
    if res.is_ok() {
        t.register(Resource::ControllerPublish {
            volume_id: vol.volume_id.clone(),
            node_id,
        });
    }
    expect_code(
        res,
        "ControllerPublishVolume to a nonexistent node",
        Code::NotFound,
    )
}

async fn unpublish_no_id(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::PublishUnpublishVolume)?;
    let res = t
        .ctrl()
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: String::new(),
            node_id: String::new(),
            secrets: t
                .config()
                .secrets
                .controller_unpublish_volume_secret
                .clone(),
        })
        .await;
    expect_code(
        res,
        "ControllerUnpublishVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn lifecycle(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::PublishUnpublishVolume)?;
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let node_id = t.node_id()?;
    let vol = t.new_volume("publish").await?;
    let mut req = publish_request(&t, &vol.volume_id, &node_id);
    req.volume_context = vol.volume_context.clone();
    let first = t
        .ctrl()
        .controller_publish_volume(req.clone())
        .await
        .must("ControllerPublishVolume")?;
    let resource = Resource::ControllerPublish {
        volume_id: vol.volume_id.clone(),
        node_id: node_id.clone(),
    };
    t.register(resource.clone());
    let second = t
        .ctrl()
        .controller_publish_volume(req)
        .await
        .must("repeated ControllerPublishVolume")?;
    ensure!(
        first.publish_context == second.publish_context,
        "repeated ControllerPublishVolume returned a different publish_context"
    );
    let unpublish = csi::ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id,
        secrets: t
            .config()
            .secrets
            .controller_unpublish_volume_secret
            .clone(),
    };
    t.ctrl()
        .controller_unpublish_volume(unpublish.clone())
        .await
        .must("ControllerUnpublishVolume")?;
    t.forget(&resource);
    t.ctrl()
        .controller_unpublish_volume(unpublish)
        .await
        .must("repeated ControllerUnpublishVolume")?;
    t.delete_volume(&vol.volume_id).await
}

fn expand_request(t: &T, volume_id: &str, required: i64) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: volume_id.to_owned(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        secrets: t.config().secrets.controller_expand_volume_secret.clone(),
        volume_capability: Some(t.capability()),
    }
}

async fn expand_no_id(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ExpandVolume)?;
    let res = t
        .ctrl()
        .controller_expand_volume(expand_request(&t, "", t.config().expand_size()))
        .await;
    expect_code(
        res,
        "ControllerExpandVolume without a volume id",
        Code::InvalidArgument,
    )
}

async fn expand_no_range(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ExpandVolume)?;
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let vol = t.new_volume("expand-norange").await?;
    let mut req = expand_request(&t, &vol.volume_id, 0);
    req.capacity_range = None;
    let res = t.ctrl().controller_expand_volume(req).await;
    expect_code(
        res,
        "ControllerExpandVolume without a capacity range",
        Code::InvalidArgument,
    )
}

async fn expand_missing(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ExpandVolume)?;
    let res = t
        .ctrl()
        .controller_expand_volume(expand_request(
            &t,
            &missing_volume_id(&t),
            t.config().expand_size(),
        ))
        .await;
    expect_code(
        res,
        "ControllerExpandVolume of a nonexistent volume",
        Code::NotFound,
    )
}

async fn expand_works(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ExpandVolume)?;
    t.require_controller_cap(Rpc::CreateDeleteVolume)?;
    let target = t.config().expand_size();
    let vol = t.new_volume("expand").await?;
    ensure!(
        vol.capacity_bytes < target,
        "the new volume already has {} (expansion target {}); use a larger --test-volume-expand-size",
        bytes(vol.capacity_bytes),
        bytes(target)
    );
    let resp = t
        .ctrl()
        .controller_expand_volume(expand_request(&t, &vol.volume_id, target))
        .await
        .must("ControllerExpandVolume")?;
    ensure!(
        resp.capacity_bytes >= target,
        "ControllerExpandVolume returned capacity {}, less than the requested {}",
        bytes(resp.capacity_bytes),
        bytes(target)
    );
    Ok(())
}
