//! A test-only driver that delegates to the hostpath driver but breaks one
//! rule of the CSI spec, served on its own socket.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use csi::controller_server::{Controller, ControllerServer};
use csi::controller_service_capability::rpc::Type as Rpc;
use csi::identity_server::{Identity, IdentityServer};
use csi::node_server::{Node, NodeServer};
use csi::volume_capability::access_mode::Mode;
use csi_hostpath::Driver;
use csi_proto::v1 as csi;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::{Code, Request, Response, Status};

/// The rule the wrapper breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// Repeating CreateVolume with the same name makes a new volume.
    NonIdempotentCreate,
    /// CreateVolume without a name succeeds.
    AcceptsMissingName,
    /// DeleteVolume of an unknown id answers NOT_FOUND instead of OK.
    DeleteUnknownNotFound,
    /// ListVolumes returns everything whatever max_entries says.
    ListIgnoresMaxEntries,
    /// ListVolumes treats an invalid starting_token as the start.
    BadTokenNotAborted,
    /// GetPluginInfo returns an empty name.
    EmptyPluginName,
    /// CreateVolume reports one byte less than required.
    CapacityBelowRequired,
    /// CreateVolume does not report the content source it used.
    ContentSourceDropped,
    /// Not a bug: CreateVolume demands the secret `user: admin`, to check
    /// that the suite passes `--secrets`.
    RequiresCreateSecret,
    /// Not a bug: adds the PUBLISH_UNPUBLISH_VOLUME controller and
    /// STAGE_UNSTAGE_VOLUME node capabilities (attachments and stagings
    /// are tracked in memory), so the checks hostpath skips run too.
    Attach,
    /// [`Bug::Attach`], but NodeStageVolume accepts a missing volume id.
    AttachStageAcceptsMissingId,
    /// [`Bug::Attach`], but a repeated ControllerPublishVolume fails with
    /// ALREADY_EXISTS instead of being idempotent.
    AttachPublishNotIdempotent,
    /// Not a bug: [`Bug::Attach`], checking state before arguments. Every
    /// call naming a volume answers NOT_FOUND for an unknown one (and
    /// ControllerPublishVolume for an unknown node), NodeStageVolume
    /// FAILED_PRECONDITION for a volume not ControllerPublished to this
    /// node and NodePublishVolume for one not staged at its
    /// staging_target_path, before any other argument is looked at. The
    /// spec does not order a plugin's checks, so a check that breaks two
    /// rules at once (an unknown volume and a missing path) fails here.
    AttachStateFirst,
    /// NodePublishVolume treats SINGLE_NODE_SINGLE_WRITER as
    /// SINGLE_NODE_MULTI_WRITER, so the volume can be published at a
    /// second target path.
    SingleWriterNotEnforced,
}

impl Bug {
    fn attaches(self) -> bool {
        matches!(
            self,
            Bug::Attach
                | Bug::AttachStageAcceptsMissingId
                | Bug::AttachPublishNotIdempotent
                | Bug::AttachStateFirst
        )
    }

    fn state_first(self) -> bool {
        self == Bug::AttachStateFirst
    }
}

#[derive(Clone)]
pub struct Broken {
    inner: Driver,
    bug: Bug,
    names: Arc<Mutex<HashSet<String>>>,
    counter: Arc<AtomicU64>,
    /// (volume id, node id) pairs published by ControllerPublishVolume.
    attached: Arc<Mutex<HashSet<(String, String)>>>,
    /// (volume id, staging path) pairs staged by NodeStageVolume.
    staged: Arc<Mutex<HashSet<(String, String)>>>,
}

impl Broken {
    pub fn new(inner: Driver, bug: Bug) -> Broken {
        Broken {
            inner,
            bug,
            names: Arc::default(),
            counter: Arc::default(),
            attached: Arc::default(),
            staged: Arc::default(),
        }
    }

    /// NOT_FOUND unless the inner driver knows the volume.
    async fn volume_exists(&self, volume_id: &str) -> Result<(), Status> {
        let req = csi::ControllerGetVolumeRequest {
            volume_id: volume_id.to_owned(),
        };
        Controller::controller_get_volume(&self.inner, Request::new(req))
            .await
            .map(drop)
    }

    /// With [`Bug::AttachStateFirst`]: NOT_FOUND for a named volume the
    /// inner driver does not know, before anything else is checked.
    async fn state_first_volume(&self, volume_id: &str) -> Result<(), Status> {
        if self.bug.state_first() && !volume_id.is_empty() {
            self.volume_exists(volume_id).await?;
        }
        Ok(())
    }

    fn next(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }
}

/// Serves `broken` (Identity, Controller) and its inner driver's Node
/// service on `socket` until the returned sender is used or dropped.
pub fn serve(
    broken: Broken,
    socket: &Path,
) -> (oneshot::Sender<()>, JoinHandle<Result<(), String>>) {
    let (tx, rx) = oneshot::channel::<()>();
    let incoming = csi_proto::transport::bind_unix(socket).expect("bind wrapper socket");
    let node = NodeServer::new(broken.clone());
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(broken.clone()))
            .add_service(ControllerServer::new(broken))
            .add_service(node)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await
            .map_err(|e| e.to_string())
    });
    (tx, task)
}

type R<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Identity for Broken {
    async fn get_plugin_info(
        &self,
        req: Request<csi::GetPluginInfoRequest>,
    ) -> R<csi::GetPluginInfoResponse> {
        let mut resp = Identity::get_plugin_info(&self.inner, req).await?;
        if self.bug == Bug::EmptyPluginName {
            resp.get_mut().name.clear();
        }
        Ok(resp)
    }

    async fn get_plugin_capabilities(
        &self,
        req: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> R<csi::GetPluginCapabilitiesResponse> {
        Identity::get_plugin_capabilities(&self.inner, req).await
    }

    async fn probe(&self, req: Request<csi::ProbeRequest>) -> R<csi::ProbeResponse> {
        Identity::probe(&self.inner, req).await
    }
}

#[tonic::async_trait]
impl Controller for Broken {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> R<csi::CreateVolumeResponse> {
        let mut req = req.into_inner();
        let required = req.capacity_range.as_ref().map_or(0, |r| r.required_bytes);
        match self.bug {
            Bug::AcceptsMissingName if req.name.is_empty() => {
                req.name = format!("generated-{}", self.next());
            }
            Bug::NonIdempotentCreate => {
                let fresh = self
                    .names
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(req.name.clone());
                if !fresh {
                    req.name = format!("{}-again-{}", req.name, self.next());
                }
            }
            Bug::RequiresCreateSecret
                if req.secrets.get("user").map(String::as_str) != Some("admin") =>
            {
                return Err(Status::unauthenticated(
                    "CreateVolumeSecret user=admin required",
                ));
            }
            _ => {}
        }
        let mut resp = Controller::create_volume(&self.inner, Request::new(req)).await?;
        if let Some(v) = resp.get_mut().volume.as_mut() {
            match self.bug {
                Bug::CapacityBelowRequired if required > 0 => v.capacity_bytes = required - 1,
                Bug::ContentSourceDropped => v.content_source = None,
                _ => {}
            }
        }
        Ok(resp)
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> R<csi::DeleteVolumeResponse> {
        if self.bug == Bug::DeleteUnknownNotFound && !req.get_ref().volume_id.is_empty() {
            let probe = csi::ControllerGetVolumeRequest {
                volume_id: req.get_ref().volume_id.clone(),
            };
            if let Err(s) =
                Controller::controller_get_volume(&self.inner, Request::new(probe)).await
                && s.code() == Code::NotFound
            {
                return Err(Status::not_found("no such volume"));
            }
        }
        Controller::delete_volume(&self.inner, req).await
    }

    async fn controller_publish_volume(
        &self,
        req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> R<csi::ControllerPublishVolumeResponse> {
        if !self.bug.attaches() {
            return Controller::controller_publish_volume(&self.inner, req).await;
        }
        let req = req.into_inner();
        self.state_first_volume(&req.volume_id).await?;
        if self.bug.state_first()
            && !req.node_id.is_empty()
            && req.node_id != self.inner.config().node_id
        {
            return Err(Status::not_found(format!(
                "node {:?} does not exist",
                req.node_id
            )));
        }
        if req.volume_id.is_empty() || req.node_id.is_empty() || req.volume_capability.is_none() {
            return Err(Status::invalid_argument(
                "volume id, node id and capability are required",
            ));
        }
        self.volume_exists(&req.volume_id).await?;
        if req.node_id != self.inner.config().node_id {
            return Err(Status::not_found(format!(
                "node {:?} does not exist",
                req.node_id
            )));
        }
        let fresh = self
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((req.volume_id, req.node_id));
        if !fresh && self.bug == Bug::AttachPublishNotIdempotent {
            return Err(Status::already_exists("already published"));
        }
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context: [("attached".to_owned(), "true".to_owned())].into(),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> R<csi::ControllerUnpublishVolumeResponse> {
        if !self.bug.attaches() {
            return Controller::controller_unpublish_volume(&self.inner, req).await;
        }
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume id is required"));
        }
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(v, n)| {
                !(v == &req.volume_id && (req.node_id.is_empty() || n == &req.node_id))
            });
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> R<csi::ValidateVolumeCapabilitiesResponse> {
        self.state_first_volume(&req.get_ref().volume_id).await?;
        Controller::validate_volume_capabilities(&self.inner, req).await
    }

    async fn list_volumes(
        &self,
        req: Request<csi::ListVolumesRequest>,
    ) -> R<csi::ListVolumesResponse> {
        let mut req = req.into_inner();
        match self.bug {
            Bug::ListIgnoresMaxEntries => req.max_entries = 0,
            Bug::BadTokenNotAborted => {
                let result = Controller::list_volumes(&self.inner, Request::new(req.clone())).await;
                return match result {
                    Err(s) if s.code() == Code::Aborted => {
                        req.starting_token.clear();
                        Controller::list_volumes(&self.inner, Request::new(req)).await
                    }
                    other => other,
                };
            }
            _ => {}
        }
        Controller::list_volumes(&self.inner, Request::new(req)).await
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> R<csi::GetCapacityResponse> {
        Controller::get_capacity(&self.inner, req).await
    }

    async fn controller_get_capabilities(
        &self,
        req: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> R<csi::ControllerGetCapabilitiesResponse> {
        let mut resp = Controller::controller_get_capabilities(&self.inner, req).await?;
        if self.bug.attaches() {
            resp.get_mut()
                .capabilities
                .push(csi::ControllerServiceCapability {
                    r#type: Some(csi::controller_service_capability::Type::Rpc(
                        csi::controller_service_capability::Rpc {
                            r#type: Rpc::PublishUnpublishVolume as i32,
                        },
                    )),
                });
        }
        Ok(resp)
    }

    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> R<csi::CreateSnapshotResponse> {
        self.state_first_volume(&req.get_ref().source_volume_id)
            .await?;
        Controller::create_snapshot(&self.inner, req).await
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> R<csi::DeleteSnapshotResponse> {
        Controller::delete_snapshot(&self.inner, req).await
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> R<csi::ListSnapshotsResponse> {
        Controller::list_snapshots(&self.inner, req).await
    }

    async fn get_snapshot(
        &self,
        req: Request<csi::GetSnapshotRequest>,
    ) -> R<csi::GetSnapshotResponse> {
        Controller::get_snapshot(&self.inner, req).await
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> R<csi::ControllerExpandVolumeResponse> {
        self.state_first_volume(&req.get_ref().volume_id).await?;
        Controller::controller_expand_volume(&self.inner, req).await
    }

    async fn controller_get_volume(
        &self,
        req: Request<csi::ControllerGetVolumeRequest>,
    ) -> R<csi::ControllerGetVolumeResponse> {
        Controller::controller_get_volume(&self.inner, req).await
    }

    async fn controller_modify_volume(
        &self,
        req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> R<csi::ControllerModifyVolumeResponse> {
        Controller::controller_modify_volume(&self.inner, req).await
    }
}

#[tonic::async_trait]
impl Node for Broken {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> R<csi::NodeStageVolumeResponse> {
        if !self.bug.attaches() {
            return Node::node_stage_volume(&self.inner, req).await;
        }
        let req = req.into_inner();
        self.state_first_volume(&req.volume_id).await?;
        if self.bug.state_first() && !req.volume_id.is_empty() {
            let attached = self
                .attached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&(req.volume_id.clone(), self.inner.config().node_id.clone()));
            if !attached {
                return Err(Status::failed_precondition(
                    "the volume is not ControllerPublished to this node",
                ));
            }
        }
        let missing_id = req.volume_id.is_empty() && self.bug != Bug::AttachStageAcceptsMissingId;
        if missing_id || req.staging_target_path.is_empty() || req.volume_capability.is_none() {
            return Err(Status::invalid_argument(
                "volume id, staging target path and capability are required",
            ));
        }
        if !req.volume_id.is_empty() {
            self.volume_exists(&req.volume_id).await?;
        }
        self.staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((req.volume_id, req.staging_target_path));
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> R<csi::NodeUnstageVolumeResponse> {
        if !self.bug.attaches() {
            return Node::node_unstage_volume(&self.inner, req).await;
        }
        let req = req.into_inner();
        self.state_first_volume(&req.volume_id).await?;
        if req.volume_id.is_empty() || req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument(
                "volume id and staging target path are required",
            ));
        }
        self.staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(req.volume_id, req.staging_target_path));
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> R<csi::NodePublishVolumeResponse> {
        self.state_first_volume(&req.get_ref().volume_id).await?;
        let mut req = req;
        if self.bug == Bug::SingleWriterNotEnforced
            && let Some(mode) = req
                .get_mut()
                .volume_capability
                .as_mut()
                .and_then(|c| c.access_mode.as_mut())
            && mode.mode == Mode::SingleNodeSingleWriter as i32
        {
            mode.mode = Mode::SingleNodeMultiWriter as i32;
        }
        if self.bug.attaches() && !req.get_ref().volume_id.is_empty() {
            let r = req.get_ref();
            let staged = self
                .staged
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&(r.volume_id.clone(), r.staging_target_path.clone()));
            let arguments_given = !r.target_path.is_empty() && r.volume_capability.is_some();
            if !staged && (arguments_given || self.bug.state_first()) {
                return Err(Status::failed_precondition("the volume is not staged"));
            }
        }
        Node::node_publish_volume(&self.inner, req).await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> R<csi::NodeUnpublishVolumeResponse> {
        self.state_first_volume(&req.get_ref().volume_id).await?;
        Node::node_unpublish_volume(&self.inner, req).await
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> R<csi::NodeGetVolumeStatsResponse> {
        self.state_first_volume(&req.get_ref().volume_id).await?;
        Node::node_get_volume_stats(&self.inner, req).await
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> R<csi::NodeExpandVolumeResponse> {
        self.state_first_volume(&req.get_ref().volume_id).await?;
        Node::node_expand_volume(&self.inner, req).await
    }

    async fn node_get_capabilities(
        &self,
        req: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> R<csi::NodeGetCapabilitiesResponse> {
        let mut resp = Node::node_get_capabilities(&self.inner, req).await?;
        if self.bug.attaches() {
            resp.get_mut()
                .capabilities
                .push(csi::NodeServiceCapability {
                    r#type: Some(csi::node_service_capability::Type::Rpc(
                        csi::node_service_capability::Rpc {
                            r#type: csi::node_service_capability::rpc::Type::StageUnstageVolume
                                as i32,
                        },
                    )),
                });
        }
        Ok(resp)
    }

    async fn node_get_info(
        &self,
        req: Request<csi::NodeGetInfoRequest>,
    ) -> R<csi::NodeGetInfoResponse> {
        Node::node_get_info(&self.inner, req).await
    }
}
