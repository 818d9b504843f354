//! Registration with the kubelet's plugin registry, so that a `csi-hostpath`
//! running on a node is that node's CSI plugin without a
//! node-driver-registrar next to it.
//!
//! The kubelet watches its plugin registry directory
//! (`<kubelet root>/plugins_registry/`); for a new socket there it calls
//! `GetInfo` (plugin type `CSIPlugin`, the driver name, the CSI endpoint as
//! the kubelet sees it, the supported versions), registers the driver
//! (NodeGetInfo on the endpoint, the CSINode entry) and reports the outcome
//! with `NotifyRegistrationStatus`. Removing the socket deregisters the
//! driver. A refused registration ends the driver with an error (as
//! node-driver-registrar exits), so that the pod restarts and tries again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tonic::{Request, Response, Status};

/// The generated types and gRPC stubs of `proto/pluginregistration.proto`.
pub mod v1 {
    tonic::include_proto!("pluginregistration");
}

/// `PluginInfo.type` of a CSI driver (the kubelet's
/// `pluginregistration.CSIPlugin`).
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// The versions the kubelet's CSI plugin handler accepts: the CSI spec major
/// version 1.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// Where and how the driver registers (`--kubelet-registration-path`,
/// `--plugin-registration-path`, as node-driver-registrar names them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRegistration {
    /// The CSI socket's path as the kubelet dials it, on the host: the
    /// driver's `--endpoint` may be mounted elsewhere in its container.
    pub kubelet_registration_path: PathBuf,
    /// The kubelet's plugin registry directory as this process sees it.
    pub plugin_registration_path: PathBuf,
}

impl NodeRegistration {
    /// The registration socket of `driver_name`: `<dir>/<driver>-reg.sock`,
    /// the name node-driver-registrar gives it.
    pub fn socket(&self, driver_name: &str) -> PathBuf {
        self.plugin_registration_path
            .join(format!("{driver_name}-reg.sock"))
    }

    /// The answer to `GetInfo`.
    pub fn plugin_info(&self, driver_name: &str) -> v1::PluginInfo {
        v1::PluginInfo {
            r#type: CSI_PLUGIN_TYPE.to_owned(),
            name: driver_name.to_owned(),
            endpoint: self.kubelet_registration_path.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        }
    }
}

/// The `Registration` service. A refusal is kept in `refusal` (the first
/// one) and wakes `refused`, which the serving loop turns into its end.
pub(crate) struct RegistrationService {
    pub(crate) info: v1::PluginInfo,
    pub(crate) refusal: Arc<OnceLock<String>>,
    pub(crate) refused: Arc<tokio::sync::Notify>,
}

#[tonic::async_trait]
impl v1::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<v1::InfoRequest>,
    ) -> Result<Response<v1::PluginInfo>, Status> {
        tracing::info!(info = ?self.info, "the kubelet asks for the plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<v1::RegistrationStatus>,
    ) -> Result<Response<v1::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
        } else {
            tracing::error!(driver = %self.info.name, error = %status.error, "the kubelet refused the registration");
            let _ = self.refusal.set(status.error);
            self.refused.notify_one();
        }
        Ok(Response::new(v1::RegistrationStatusResponse {}))
    }
}

/// Removes the registration socket (the kubelet deregisters the driver when
/// it goes); a missing one is fine.
pub(crate) fn remove_socket(socket: &Path) {
    match std::fs::remove_file(socket) {
        Ok(()) => tracing::info!(socket = %socket.display(), "registration socket removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(socket = %socket.display(), error = %e, "cannot remove the registration socket")
        }
    }
}
