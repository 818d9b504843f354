//! The Identity service.

use csi_proto::v1::{self as csi, identity_server::Identity, plugin_capability};
use tonic::{Request, Response, Status};

use crate::state::Driver;

fn plugin_capabilities(topology: bool) -> Vec<csi::PluginCapability> {
    use plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
    let mut services = vec![service::Type::ControllerService];
    if topology {
        services.push(service::Type::VolumeAccessibilityConstraints);
    }
    let mut caps: Vec<csi::PluginCapability> = services
        .into_iter()
        .map(|t| csi::PluginCapability {
            r#type: Some(Type::Service(Service { r#type: t as i32 })),
        })
        .collect();
    caps.push(csi::PluginCapability {
        r#type: Some(Type::VolumeExpansion(VolumeExpansion {
            r#type: volume_expansion::Type::Online as i32,
        })),
    });
    caps
}

#[tonic::async_trait]
impl Identity for Driver {
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        self.call("GetPluginInfo", None, async {
            Ok(csi::GetPluginInfoResponse {
                name: self.inner.config.driver_name.clone(),
                vendor_version: self.inner.config.vendor_version.clone(),
                manifest: Default::default(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        self.call("GetPluginCapabilities", None, async {
            Ok(csi::GetPluginCapabilitiesResponse {
                capabilities: plugin_capabilities(self.inner.config.enable_topology),
            })
        })
        .await
    }

    async fn probe(
        &self,
        _request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        self.call("Probe", None, async {
            let ready = self.inner.faults.probe_ready()?;
            Ok(csi::ProbeResponse { ready: Some(ready) })
        })
        .await
    }
}
