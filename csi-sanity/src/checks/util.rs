//! Helpers shared by the checks: status handling, capability gating and the
//! create/delete calls that register what they make for cleanup.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use csi::controller_service_capability::rpc::Type as Rpc;
use csi::node_service_capability::rpc::Type as NodeRpc;
use csi::plugin_capability::service::Type as PluginService;
use csi_proto::v1 as csi;
use tonic::{Code, Response, Status};

use crate::runner::{CheckOutcome, Ctx, Resource, T, Verdict};

/// Fails the check with a formatted message.
macro_rules! fail {
    ($($arg:tt)+) => {
        return Err($crate::runner::Verdict::Fail(format!($($arg)+)))
    };
}
pub(crate) use fail;

/// Fails the check with a formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err($crate::runner::Verdict::Fail(format!($($arg)+)));
        }
    };
}
pub(crate) use ensure;

/// The gRPC code name as written in the CSI spec (`INVALID_ARGUMENT`).
pub use csi_proto::codes::code_name;

/// `CODE: message` for a status.
pub fn status_text(status: &Status) -> String {
    if status.message().is_empty() {
        code_name(status.code()).to_owned()
    } else {
        format!("{}: {}", code_name(status.code()), status.message())
    }
}

/// Turns an RPC result into its message or a failed check.
pub trait Must<R> {
    fn must(self, rpc: &str) -> Result<R, Verdict>;
}

impl<R> Must<R> for Result<Response<R>, Status> {
    fn must(self, rpc: &str) -> Result<R, Verdict> {
        self.map(Response::into_inner)
            .map_err(|s| Verdict::Fail(format!("{rpc} failed: {}", status_text(&s))))
    }
}

/// Passes when the call failed with `want`, fails otherwise.
pub fn expect_code<R>(result: Result<Response<R>, Status>, rpc: &str, want: Code) -> CheckOutcome {
    match result {
        Ok(_) => fail!("{rpc} returned OK, the spec requires {}", code_name(want)),
        Err(s) if s.code() == want => Ok(()),
        Err(s) => fail!(
            "{rpc} returned {}, the spec requires {}",
            status_text(&s),
            code_name(want)
        ),
    }
}

pub fn has_plugin_service(caps: &[csi::PluginCapability], want: PluginService) -> bool {
    caps.iter().any(|c| match &c.r#type {
        Some(csi::plugin_capability::Type::Service(s)) => s.r#type == want as i32,
        _ => false,
    })
}

fn has_controller_rpc(caps: &[csi::ControllerServiceCapability], want: Rpc) -> bool {
    caps.iter().any(|c| match &c.r#type {
        Some(csi::controller_service_capability::Type::Rpc(r)) => r.r#type == want as i32,
        None => false,
    })
}

fn has_node_rpc(caps: &[csi::NodeServiceCapability], want: NodeRpc) -> bool {
    caps.iter().any(|c| match &c.r#type {
        Some(csi::node_service_capability::Type::Rpc(r)) => r.r#type == want as i32,
        None => false,
    })
}

/// Whether the driver advertised the controller capability (false when
/// discovery failed).
pub fn controller_has(cx: &Ctx, want: Rpc) -> bool {
    let d = &cx.discovery;
    matches!(&d.plugin_caps, Ok(p) if has_plugin_service(p, PluginService::ControllerService))
        && matches!(&d.controller_caps, Ok(c) if has_controller_rpc(c, want))
}

/// Whether the driver advertised the node capability.
pub fn node_has(cx: &Ctx, want: NodeRpc) -> bool {
    matches!(&cx.discovery.node_caps, Ok(c) if has_node_rpc(c, want))
}

/// Whether the driver advertised the plugin service capability.
pub fn plugin_has(cx: &Ctx, want: PluginService) -> bool {
    matches!(&cx.discovery.plugin_caps, Ok(c) if has_plugin_service(c, want))
}

/// Sleep between polls of a snapshot that is not ready yet.
const READY_POLL: Duration = Duration::from_millis(500);

/// Upper bound on pages walked by a list, against drivers whose tokens
/// never end.
const MAX_PAGES: usize = 10_000;

impl T {
    /// Skips unless the plugin advertises CONTROLLER_SERVICE.
    pub fn require_controller(&self) -> CheckOutcome {
        match &self.cx.discovery.plugin_caps {
            Err(e) => fail!("cannot tell whether the controller service applies: {e}"),
            Ok(c) if has_plugin_service(c, PluginService::ControllerService) => Ok(()),
            Ok(_) => Err(Verdict::Skip(
                "driver does not advertise the CONTROLLER_SERVICE plugin capability".into(),
            )),
        }
    }

    /// Skips unless the controller advertises `want`.
    pub fn require_controller_cap(&self, want: Rpc) -> CheckOutcome {
        self.require_controller()?;
        match &self.cx.discovery.controller_caps {
            Err(e) => fail!("{e}"),
            Ok(c) if has_controller_rpc(c, want) => Ok(()),
            Ok(_) => Err(Verdict::Skip(format!(
                "driver does not advertise the {} controller capability",
                want.as_str_name()
            ))),
        }
    }

    /// Skips unless the node service advertises `want`.
    pub fn require_node_cap(&self, want: NodeRpc) -> CheckOutcome {
        match &self.cx.discovery.node_caps {
            Err(e) => fail!("{e}"),
            Ok(c) if has_node_rpc(c, want) => Ok(()),
            Ok(_) => Err(Verdict::Skip(format!(
                "driver does not advertise the {} node capability",
                want.as_str_name()
            ))),
        }
    }

    /// The node id from NodeGetInfo (fails when that call failed).
    pub fn node_id(&self) -> Result<String, Verdict> {
        match &self.cx.discovery.node_info {
            Ok(info) if !info.node_id.is_empty() => Ok(info.node_id.clone()),
            Ok(_) => fail!("NodeGetInfo returned an empty node_id"),
            Err(e) => fail!("{e}"),
        }
    }

    /// The test volume capability with the given access mode.
    pub fn capability_with(
        &self,
        mode: csi::volume_capability::access_mode::Mode,
    ) -> csi::VolumeCapability {
        use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
        let access_type = match self.config().access_type {
            crate::config::AccessType::Mount => AccessType::Mount(MountVolume::default()),
            crate::config::AccessType::Block => AccessType::Block(BlockVolume {}),
        };
        csi::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    /// SINGLE_NODE_WRITER with the configured access type.
    pub fn capability(&self) -> csi::VolumeCapability {
        self.capability_with(csi::volume_capability::access_mode::Mode::SingleNodeWriter)
    }

    /// A CreateVolume request for `name` with the test size, parameters and
    /// secrets.
    pub fn volume_request(&self, name: &str) -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: name.to_owned(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: self.config().test_volume_size,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![self.capability()],
            parameters: self.config().test_volume_parameters.clone(),
            secrets: self.config().secrets.create_volume_secret.clone(),
            ..Default::default()
        }
    }

    /// [`T::volume_request`] that also asks for the node's topology (from
    /// NodeGetInfo) as requisite and preferred when the driver advertises
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS, so the volume can be used on this
    /// node.
    pub fn volume_request_on_node(&self, name: &str) -> csi::CreateVolumeRequest {
        let mut req = self.volume_request(name);
        if plugin_has(&self.cx, PluginService::VolumeAccessibilityConstraints)
            && let Some(topo) = self
                .cx
                .discovery
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
        req
    }

    /// Calls CreateVolume, registers the volume for cleanup and checks the
    /// response carries a volume with an id.
    pub async fn create_volume(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::Volume, Verdict> {
        let resp = self.ctrl().create_volume(req).await.must("CreateVolume")?;
        let Some(volume) = resp.volume else {
            fail!("CreateVolume returned no volume");
        };
        ensure!(
            !volume.volume_id.is_empty(),
            "CreateVolume returned an empty volume_id"
        );
        self.register(Resource::Volume(volume.volume_id.clone()));
        Ok(volume)
    }

    /// Creates a volume of the test size with a unique name.
    pub async fn new_volume(&self, purpose: &str) -> Result<csi::Volume, Verdict> {
        let name = self.unique_name(purpose);
        self.create_volume(self.volume_request(&name)).await
    }

    /// Calls DeleteVolume and forgets the volume.
    pub async fn delete_volume(&self, id: &str) -> CheckOutcome {
        self.ctrl()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.to_owned(),
                secrets: self.config().secrets.delete_volume_secret.clone(),
            })
            .await
            .must("DeleteVolume")?;
        self.forget(&Resource::Volume(id.to_owned()));
        Ok(())
    }

    /// A CreateSnapshot request with the test parameters and secrets.
    pub fn snapshot_request(&self, name: &str, source: &str) -> csi::CreateSnapshotRequest {
        csi::CreateSnapshotRequest {
            name: name.to_owned(),
            source_volume_id: source.to_owned(),
            secrets: self.config().secrets.create_snapshot_secret.clone(),
            parameters: self.config().test_snapshot_parameters.clone(),
        }
    }

    /// Calls CreateSnapshot once, registers the snapshot and checks the
    /// fields the spec requires.
    pub async fn create_snapshot(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<csi::Snapshot, Verdict> {
        let source = req.source_volume_id.clone();
        let resp = self
            .ctrl()
            .create_snapshot(req)
            .await
            .must("CreateSnapshot")?;
        let Some(snap) = resp.snapshot else {
            fail!("CreateSnapshot returned no snapshot");
        };
        ensure!(
            !snap.snapshot_id.is_empty(),
            "CreateSnapshot returned an empty snapshot_id"
        );
        self.register(Resource::Snapshot(snap.snapshot_id.clone()));
        ensure!(
            snap.source_volume_id == source,
            "CreateSnapshot returned source_volume_id {:?}, requested {source:?}",
            snap.source_volume_id
        );
        ensure!(
            snap.creation_time.is_some(),
            "CreateSnapshot returned no creation_time"
        );
        ensure!(
            snap.size_bytes >= 0,
            "CreateSnapshot returned size_bytes {}",
            snap.size_bytes
        );
        Ok(snap)
    }

    /// Creates a snapshot and repeats the (idempotent) call until it is
    /// ready to use, within the check timeout.
    pub async fn ready_snapshot(&self, name: &str, source: &str) -> Result<csi::Snapshot, Verdict> {
        let started = Instant::now();
        loop {
            let snap = self
                .create_snapshot(self.snapshot_request(name, source))
                .await?;
            if snap.ready_to_use {
                return Ok(snap);
            }
            ensure!(
                started.elapsed() < self.config().check_timeout,
                "snapshot {:?} did not become ready_to_use",
                snap.snapshot_id
            );
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Creates a volume and a ready snapshot of it.
    pub async fn new_snapshot(
        &self,
        purpose: &str,
    ) -> Result<(csi::Volume, csi::Snapshot), Verdict> {
        let vol = self.new_volume(&format!("{purpose}-src")).await?;
        let name = self.unique_name(purpose);
        let snap = self.ready_snapshot(&name, &vol.volume_id).await?;
        Ok((vol, snap))
    }

    /// Calls DeleteSnapshot and forgets the snapshot.
    pub async fn delete_snapshot(&self, id: &str) -> CheckOutcome {
        self.ctrl()
            .delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: id.to_owned(),
                secrets: self.config().secrets.delete_snapshot_secret.clone(),
            })
            .await
            .must("DeleteSnapshot")?;
        self.forget(&Resource::Snapshot(id.to_owned()));
        Ok(())
    }
}

/// Walks every ListVolumes page (with `max_entries` per page, 0 for the
/// driver's choice) and returns the volume ids in order. Fails on a page
/// larger than `max_entries`, an entry without a volume id, or a token
/// that repeats.
pub async fn list_all_volumes(t: &T, max_entries: i32) -> Result<Vec<String>, Verdict> {
    let mut ids = Vec::new();
    let mut token = String::new();
    let mut seen_tokens = HashSet::new();
    for page in 0..MAX_PAGES {
        let resp = t
            .ctrl()
            .list_volumes(csi::ListVolumesRequest {
                max_entries,
                starting_token: token.clone(),
            })
            .await
            .must("ListVolumes")?;
        let limit = usize::try_from(max_entries).unwrap_or(0);
        ensure!(
            limit == 0 || resp.entries.len() <= limit,
            "ListVolumes page {page} returned {} entries with max_entries {max_entries}",
            resp.entries.len()
        );
        for entry in &resp.entries {
            let Some(v) = &entry.volume else {
                fail!("ListVolumes page {page} has an entry without a volume");
            };
            ensure!(
                !v.volume_id.is_empty(),
                "ListVolumes page {page} has a volume with an empty volume_id"
            );
            ids.push(v.volume_id.clone());
        }
        if resp.next_token.is_empty() {
            return Ok(ids);
        }
        ensure!(
            seen_tokens.insert(resp.next_token.clone()),
            "ListVolumes returned next_token {:?} twice: the listing never ends",
            resp.next_token
        );
        token = resp.next_token;
    }
    fail!("ListVolumes still returned a next_token after {MAX_PAGES} pages")
}

/// Walks every ListSnapshots page of `base` (its max_entries per page) and
/// returns the snapshots.
pub async fn list_all_snapshots(
    t: &T,
    base: csi::ListSnapshotsRequest,
) -> Result<Vec<csi::Snapshot>, Verdict> {
    let mut snaps = Vec::new();
    let mut token = base.starting_token.clone();
    let mut seen_tokens = HashSet::new();
    for page in 0..MAX_PAGES {
        let mut req = base.clone();
        req.starting_token = token.clone();
        if req.secrets.is_empty() {
            req.secrets = t.config().secrets.list_snapshots_secret.clone();
        }
        let resp = t.ctrl().list_snapshots(req).await.must("ListSnapshots")?;
        let limit = usize::try_from(base.max_entries).unwrap_or(0);
        ensure!(
            limit == 0 || resp.entries.len() <= limit,
            "ListSnapshots page {page} returned {} entries with max_entries {}",
            resp.entries.len(),
            base.max_entries
        );
        for entry in resp.entries {
            let Some(s) = entry.snapshot else {
                fail!("ListSnapshots page {page} has an entry without a snapshot");
            };
            ensure!(
                !s.snapshot_id.is_empty(),
                "ListSnapshots page {page} has a snapshot with an empty snapshot_id"
            );
            snaps.push(s);
        }
        if resp.next_token.is_empty() {
            return Ok(snaps);
        }
        ensure!(
            seen_tokens.insert(resp.next_token.clone()),
            "ListSnapshots returned next_token {:?} twice: the listing never ends",
            resp.next_token
        );
        token = resp.next_token;
    }
    fail!("ListSnapshots still returned a next_token after {MAX_PAGES} pages")
}

/// Whether a failed NodeStage/NodePublish is this environment lacking the
/// privilege to mount, rather than a driver bug.
pub fn is_mount_permission_problem(status: &Status) -> bool {
    if status.code() == Code::PermissionDenied {
        return true;
    }
    let m = status.message().to_ascii_lowercase();
    matches!(
        status.code(),
        Code::Internal | Code::Unknown | Code::FailedPrecondition | Code::Unavailable
    ) && (m.contains("permission denied")
        || m.contains("operation not permitted")
        || m.contains("eperm")
        || m.contains("must be superuser")
        || m.contains("only root can"))
}

/// A capacity in bytes for messages (`10485760 (10Mi)`).
pub fn bytes(n: i64) -> String {
    let pretty = crate::quantity::format_size(n);
    if pretty == n.to_string() {
        pretty
    } else {
        format!("{n} ({pretty})")
    }
}
