//! The `Driver` facade: what the sidecar learned about the driver at start-up
//! and the controller calls it makes, each with the `--timeout` deadline and
//! a typed, classified error.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::controller_service_capability::rpc::Type as ControllerCap;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::plugin_capability::service::Type as ServiceCap;
use csi_proto::v1::plugin_capability::volume_expansion::Type as ExpansionCap;
use csi_proto::v1::{
    ControllerGetCapabilitiesRequest, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteVolumeRequest,
    GetCapacityRequest, GetCapacityResponse, GetPluginCapabilitiesRequest, GetPluginInfoRequest,
    ListVolumesRequest, ListVolumesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    controller_service_capability, plugin_capability,
};
use tonic::transport::Channel;

use super::adaptive::{CallOutcome, ConcurrencyLimit};
use super::error::CsiError;
use super::{request, with_deadline, with_deadline_migrated};

/// Why the sidecar cannot run against this driver.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// `GetPluginInfo` failed. Worded as the Go image's fatal start-up
    /// error, so that a search for it finds this one too.
    #[error(
        "error getting CSI driver name: {0}; the driver must answer GetPluginInfo for the sidecar to start: read the driver container's log (this container exits and is restarted)"
    )]
    Name(#[source] CsiError),
    /// `GetPluginCapabilities` or `ControllerGetCapabilities` failed (the
    /// Go image's other fatal start-up error): not the name, which was
    /// learned by then.
    #[error(
        "error getting CSI driver capabilities: {0}; the driver must answer it for the sidecar to start: read the driver container's log (this container exits and is restarted)"
    )]
    Capabilities(#[source] CsiError),
    #[error(
        "CSI driver returned an empty name in GetPluginInfo; it must return its name (the provisioner of its StorageClasses, e.g. hostpath.csi.k8s.io): check the name the driver is configured with"
    )]
    EmptyName,
    #[error(
        "CSI driver name {name:?} is invalid: {reason}; a driver name has at most 63 characters, alphanumerics, '-' and '.', starting and ending with an alphanumeric (e.g. hostpath.csi.k8s.io): check the name the driver is configured with"
    )]
    InvalidName { name: String, reason: &'static str },
    #[error(
        "CSI driver does not support dynamic provisioning: {0}; the sidecar needs a controller plugin (CONTROLLER_SERVICE with CREATE_DELETE_VOLUME): point --csi-address at the controller plugin's socket, not a node plugin's"
    )]
    MissingCapability(&'static str),
}

/// Plugin-level capabilities from `GetPluginCapabilities`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginCapabilities {
    pub controller_service: bool,
    pub volume_accessibility_constraints: bool,
    pub group_controller_service: bool,
    pub snapshot_metadata_service: bool,
    pub online_expansion: bool,
    pub offline_expansion: bool,
}

/// Controller RPC capabilities from `ControllerGetCapabilities`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerCapabilities(BTreeSet<i32>);

impl ControllerCapabilities {
    pub fn from_types(types: impl IntoIterator<Item = ControllerCap>) -> Self {
        Self(types.into_iter().map(|t| t as i32).collect())
    }

    pub fn has(&self, cap: ControllerCap) -> bool {
        self.0.contains(&(cap as i32))
    }

    /// Names as in the CSI spec, for logs; unknown values by number.
    pub fn names(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|v| match ControllerCap::try_from(*v) {
                Ok(t) => t.as_str_name().to_owned(),
                Err(_) => format!("UNKNOWN({v})"),
            })
            .collect()
    }
}

/// Everything discovered about the driver at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    pub name: String,
    pub vendor_version: String,
    pub manifest: BTreeMap<String, String>,
    pub plugin: PluginCapabilities,
    pub controller: ControllerCapabilities,
}

impl fmt::Display for DriverInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.vendor_version)
    }
}

impl DriverInfo {
    /// The sidecar provisions only through the controller service's
    /// CreateVolume/DeleteVolume: refuse a driver without them.
    pub fn require_provisioning(&self) -> Result<(), StartupError> {
        if !self.plugin.controller_service {
            return Err(StartupError::MissingCapability(
                "plugin CONTROLLER_SERVICE capability is not reported",
            ));
        }
        if !self.controller.has(ControllerCap::CreateDeleteVolume) {
            return Err(StartupError::MissingCapability(
                "controller CREATE_DELETE_VOLUME capability is not reported",
            ));
        }
        Ok(())
    }
}

/// Checks a driver name against the CSI spec: at most 63 characters, domain
/// name notation, beginning and ending with an alphanumeric character, with
/// dashes, dots and alphanumerics between. The name becomes the provisioner
/// name in annotations and labels, so a bad one must stop us early.
pub fn validate_driver_name(name: &str) -> Result<(), StartupError> {
    let invalid = |reason| StartupError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(StartupError::EmptyName);
    }
    if name.len() > 63 {
        return Err(invalid("longer than 63 characters"));
    }
    let bytes = name.as_bytes();
    if !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return Err(invalid("must begin and end with an alphanumeric character"));
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.')
    {
        return Err(invalid(
            "only alphanumerics, '-' and '.' are allowed (domain name notation)",
        ));
    }
    Ok(())
}

/// A connected, discovered CSI driver.
#[derive(Debug, Clone)]
pub struct Driver {
    identity: IdentityClient<Channel>,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    timeout: Duration,
    info: DriverInfo,
    /// The adaptive limit of `CreateVolume` and `DeleteVolume` calls in
    /// flight (`--adaptive-concurrency`); `None` when off.
    volume_calls: Option<Arc<ConcurrencyLimit>>,
}

impl Driver {
    /// Asks the driver who it is and what it can do (`GetPluginInfo`,
    /// `GetPluginCapabilities`, `ControllerGetCapabilities`).
    pub async fn discover(channel: Channel, timeout: Duration) -> Result<Driver, StartupError> {
        let mut identity = IdentityClient::new(channel.clone());
        let mut controller = ControllerClient::new(channel.clone());
        let node = NodeClient::new(channel);

        let plugin_info = with_deadline(
            "GetPluginInfo",
            timeout,
            identity.get_plugin_info(request(GetPluginInfoRequest {}, timeout)),
        )
        .await
        .map_err(StartupError::Name)?;
        validate_driver_name(&plugin_info.name)?;
        // The calls below count under the driver's name, as the Go sidecar's
        // (which names its metrics right after GetPluginInfo).
        crate::metrics::set_driver_name(&plugin_info.name);

        let caps = with_deadline(
            "GetPluginCapabilities",
            timeout,
            identity.get_plugin_capabilities(request(GetPluginCapabilitiesRequest {}, timeout)),
        )
        .await
        .map_err(StartupError::Capabilities)?;
        let mut plugin = PluginCapabilities::default();
        for cap in caps.capabilities {
            match cap.r#type {
                Some(plugin_capability::Type::Service(s)) => match ServiceCap::try_from(s.r#type) {
                    Ok(ServiceCap::ControllerService) => plugin.controller_service = true,
                    Ok(ServiceCap::VolumeAccessibilityConstraints) => {
                        plugin.volume_accessibility_constraints = true;
                    }
                    Ok(ServiceCap::GroupControllerService) => {
                        plugin.group_controller_service = true;
                    }
                    Ok(ServiceCap::SnapshotMetadataService) => {
                        plugin.snapshot_metadata_service = true;
                    }
                    Ok(ServiceCap::Unknown) | Err(_) => {}
                },
                Some(plugin_capability::Type::VolumeExpansion(e)) => {
                    match ExpansionCap::try_from(e.r#type) {
                        Ok(ExpansionCap::Online) => plugin.online_expansion = true,
                        Ok(ExpansionCap::Offline) => plugin.offline_expansion = true,
                        Ok(ExpansionCap::Unknown) | Err(_) => {}
                    }
                }
                None => {}
            }
        }

        // Only a driver with a controller service answers this.
        let mut controller_caps = ControllerCapabilities::default();
        if plugin.controller_service {
            let answer = with_deadline(
                "ControllerGetCapabilities",
                timeout,
                controller.controller_get_capabilities(request(
                    ControllerGetCapabilitiesRequest {},
                    timeout,
                )),
            )
            .await
            .map_err(StartupError::Capabilities)?;
            for cap in answer.capabilities {
                if let Some(controller_service_capability::Type::Rpc(rpc)) = cap.r#type {
                    controller_caps.0.insert(rpc.r#type);
                }
            }
        }

        Ok(Driver {
            identity,
            controller,
            node,
            timeout,
            volume_calls: None,
            info: DriverInfo {
                name: plugin_info.name,
                vendor_version: plugin_info.vendor_version,
                manifest: plugin_info.manifest.into_iter().collect(),
                plugin,
                controller: controller_caps,
            },
        })
    }

    pub fn info(&self) -> &DriverInfo {
        &self.info
    }

    /// Limits the `CreateVolume` and `DeleteVolume` calls in flight with
    /// `limit` (`src/csi/adaptive.rs`), shared by every clone of this driver.
    pub fn with_adaptive_concurrency(mut self, limit: Arc<ConcurrencyLimit>) -> Driver {
        self.volume_calls = Some(limit);
        self
    }

    /// Runs a volume call under the adaptive limit, if any: waits for a
    /// slot, then tells the limit how the call ended.
    async fn limited<T>(
        &self,
        call: impl Future<Output = Result<T, CsiError>>,
    ) -> Result<T, CsiError> {
        let Some(limit) = &self.volume_calls else {
            return call.await;
        };
        let permit = limit.acquire().await;
        let result = call.await;
        permit.finish(CallOutcome::of(&result));
        result
    }

    pub fn name(&self) -> &str {
        &self.info.name
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Starts [`connection::watch_reachability`](super::connection::watch_reachability)
    /// on this driver's connection.
    pub fn watch_reachability(&self) {
        crate::metrics::set_driver_reachable(true);
        super::connection::watch_reachability(self.identity.clone(), self.timeout);
    }

    /// Whether the driver is ready now (`Probe` with `timeout`), for the
    /// health endpoint.
    pub async fn probe(&self, timeout: Duration) -> Result<bool, CsiError> {
        let mut client = self.identity.clone();
        super::connection::probe_once(&mut client, timeout).await
    }

    /// `NodeGetInfo`: this node's id and accessible topology, for
    /// `--node-deployment` (the driver runs on the same node).
    pub async fn node_info(&self) -> Result<NodeGetInfoResponse, CsiError> {
        let mut client = self.node.clone();
        with_deadline(
            "NodeGetInfo",
            self.timeout,
            client.node_get_info(request(NodeGetInfoRequest {}, self.timeout)),
        )
        .await
    }

    /// `migrated`: the volume is an in-tree one served through CSI
    /// migration (only the metric label differs).
    pub async fn create_volume(
        &self,
        message: CreateVolumeRequest,
        migrated: bool,
    ) -> Result<CreateVolumeResponse, CsiError> {
        let mut client = self.controller.clone();
        // The deadline starts once the call has its slot: a wait for the
        // adaptive limit is not the driver's time.
        self.limited(async {
            with_deadline_migrated(
                "CreateVolume",
                self.timeout,
                migrated,
                client.create_volume(request(message, self.timeout)),
            )
            .await
        })
        .await
    }

    /// Deletes a volume. The CSI spec makes an unknown id `OK`. `NOT_FOUND`
    /// is an error, retried, as upstream does: a backend that is only
    /// eventually consistent may not list a volume it has just created, and
    /// taking its word would drop the PV and leak the volume (found by the
    /// chaos harness, `tests/chaos.rs`).
    pub async fn delete_volume(
        &self,
        volume_id: &str,
        secrets: HashMap<String, String>,
        migrated: bool,
    ) -> Result<(), CsiError> {
        let mut client = self.controller.clone();
        let message = DeleteVolumeRequest {
            volume_id: volume_id.to_owned(),
            secrets,
        };
        self.limited(async {
            with_deadline_migrated(
                "DeleteVolume",
                self.timeout,
                migrated,
                client.delete_volume(request(message, self.timeout)),
            )
            .await
        })
        .await
        .map(|_| ())
    }

    pub async fn get_capacity(
        &self,
        message: GetCapacityRequest,
    ) -> Result<GetCapacityResponse, CsiError> {
        let mut client = self.controller.clone();
        with_deadline(
            "GetCapacity",
            self.timeout,
            client.get_capacity(request(message, self.timeout)),
        )
        .await
    }

    pub async fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: String,
    ) -> Result<ListVolumesResponse, CsiError> {
        let mut client = self.controller.clone();
        let message = ListVolumesRequest {
            max_entries,
            starting_token,
        };
        with_deadline(
            "ListVolumes",
            self.timeout,
            client.list_volumes(request(message, self.timeout)),
        )
        .await
    }

    pub async fn create_snapshot(
        &self,
        message: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, CsiError> {
        let mut client = self.controller.clone();
        with_deadline(
            "CreateSnapshot",
            self.timeout,
            client.create_snapshot(request(message, self.timeout)),
        )
        .await
    }

    pub async fn delete_snapshot(
        &self,
        snapshot_id: &str,
        secrets: HashMap<String, String>,
    ) -> Result<(), CsiError> {
        let mut client = self.controller.clone();
        let message = DeleteSnapshotRequest {
            snapshot_id: snapshot_id.to_owned(),
            secrets,
        };
        with_deadline(
            "DeleteSnapshot",
            self.timeout,
            client.delete_snapshot(request(message, self.timeout)),
        )
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names() {
        for good in [
            "hostpath.csi.k8s.io",
            "a",
            "ebs.csi.aws.com",
            "x-1.y2",
            &"a".repeat(63),
        ] {
            assert!(validate_driver_name(good).is_ok(), "{good}");
        }
        assert!(matches!(
            validate_driver_name(""),
            Err(StartupError::EmptyName)
        ));
        for bad in [
            "-leading",
            "trailing.",
            "under_score",
            "has space",
            "slash/name",
            "ünïcode",
            &"a".repeat(64),
        ] {
            let err = validate_driver_name(bad).expect_err(bad);
            assert!(err.to_string().contains("is invalid"), "{bad}: {err}");
        }
    }

    fn info(controller_service: bool, caps: &[ControllerCap]) -> DriverInfo {
        DriverInfo {
            name: "d".into(),
            vendor_version: "1".into(),
            manifest: BTreeMap::new(),
            plugin: PluginCapabilities {
                controller_service,
                ..PluginCapabilities::default()
            },
            controller: ControllerCapabilities::from_types(caps.iter().copied()),
        }
    }

    #[test]
    fn provisioning_needs_both_capabilities() {
        let e = info(false, &[ControllerCap::CreateDeleteVolume])
            .require_provisioning()
            .expect_err("no controller service");
        assert!(e.to_string().contains("CONTROLLER_SERVICE"), "{e}");
        let e = info(true, &[ControllerCap::ListVolumes])
            .require_provisioning()
            .expect_err("no create/delete");
        assert!(e.to_string().contains("CREATE_DELETE_VOLUME"), "{e}");
        info(true, &[ControllerCap::CreateDeleteVolume])
            .require_provisioning()
            .expect("ok");
    }

    #[test]
    fn capability_names_for_logs() {
        let caps = ControllerCapabilities::from_types([
            ControllerCap::GetCapacity,
            ControllerCap::CreateDeleteVolume,
        ]);
        assert_eq!(caps.names(), vec!["CREATE_DELETE_VOLUME", "GET_CAPACITY"]);
        assert!(caps.has(ControllerCap::GetCapacity));
        assert!(!caps.has(ControllerCap::CloneVolume));
    }
}
