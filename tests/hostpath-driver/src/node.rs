//! The Node service (publish/unpublish by bind mount, stats, info).
//!
//! `NodePublishVolume` bind-mounts the volume directory onto `target_path`;
//! a block volume is published as a block device: the loop device attached
//! to the volume's `block` file, bind-mounted onto `target_path` (the
//! kubelet and the container runtime want a device node there). When the
//! process may not mount or attach a loop device (`EPERM`/`EACCES`, e.g. an
//! unprivileged container or test run), it falls back to making
//! `target_path` a symlink to the directory or the `block` file; a read-only
//! publish is then not enforced.
//!
//! The node side reads the record of a volume it does not know from the
//! state directory: the controller and the node side may be two processes
//! sharing one state directory (see docs/design.md, "The node plugin").

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use csi_proto::v1::{self as csi, node_server::Node, node_service_capability, volume_usage};
use tonic::{Request, Response, Status};

use crate::controller::{parse_capability, range_bounds, single_node_mode};
use crate::fsops;
use crate::locks::volume_key;
use crate::state::{Driver, blocking};
use crate::store::{self, AccessMode, AccessType, BLOCK_FILE, Publication, VolumeRecord};

fn internal(what: &str, path: &Path, e: std::io::Error) -> Status {
    Status::internal(format!("{what} {}: {e}", path.display()))
}

async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(format!("node task failed: {e}")))?
}

/// Whether `path` shows `source`: a symlink to it, a bind mount of it (the
/// same device and inode), or a loop device backed by it. A missing path,
/// or one below a file, shows nothing.
pub(crate) fn shows(source: &Path, path: &Path) -> std::io::Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    if meta.file_type().is_symlink() {
        return Ok(std::fs::read_link(path)? == source);
    }
    if meta.file_type().is_block_device() {
        return match fsops::loop_backing_file(meta.rdev())? {
            Some(backing) => Ok(source.canonicalize()? == backing),
            None => Ok(false),
        };
    }
    let src = std::fs::metadata(source)?;
    Ok(meta.dev() == src.dev() && meta.ino() == src.ino())
}

/// The recorded publications of a volume whose target still shows
/// `source` (an error counts as showing it: when in doubt, the volume is
/// in use). The others are stale: the driver stopped between recording a
/// publication and mounting, or the target was removed behind its back.
pub(crate) fn live_publications(
    source: &Path,
    published: &BTreeMap<String, Publication>,
) -> BTreeMap<String, Publication> {
    published
        .iter()
        .filter(|(target, _)| shows(source, Path::new(target)).unwrap_or(true))
        .map(|(target, p)| (target.clone(), *p))
        .collect()
}

/// Makes `source` visible at `target`, which does not show it yet. On
/// failure nothing is left behind: no mount, and no target when this call
/// created it.
fn publish(
    source: &Path,
    target: &Path,
    access_type: AccessType,
    readonly: bool,
) -> Result<(), Status> {
    let created = match std::fs::symlink_metadata(target) {
        Ok(meta) if meta.file_type().is_symlink() => {
            let link =
                std::fs::read_link(target).map_err(|e| internal("reading link", target, e))?;
            return if link == source {
                Ok(())
            } else {
                Err(Status::already_exists(format!(
                    "{} links to {}, not to this volume",
                    target.display(),
                    link.display()
                )))
            };
        }
        Ok(meta) => {
            let src = std::fs::metadata(source).map_err(|e| internal("inspecting", source, e))?;
            if meta.dev() == src.dev() && meta.ino() == src.ino() {
                return Ok(());
            }
            if fsops::is_mount_point(target).map_err(|e| internal("inspecting", target, e))? {
                return Err(Status::already_exists(format!(
                    "{} is already a mount of something else",
                    target.display()
                )));
            }
            let wants_dir = access_type == AccessType::Mount;
            if meta.is_dir() != wants_dir {
                return Err(Status::failed_precondition(format!(
                    "{} exists and is not a {}",
                    target.display(),
                    if wants_dir { "directory" } else { "file" }
                )));
            }
            false
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match access_type {
                AccessType::Mount => {
                    std::fs::create_dir_all(target).map_err(|e| internal("creating", target, e))?
                }
                AccessType::Block => {
                    if let Some(parent) = target.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| internal("creating", parent, e))?;
                    }
                    std::fs::File::create(target).map_err(|e| internal("creating", target, e))?;
                }
            }
            true
        }
        Err(e) => return Err(internal("inspecting", target, e)),
    };
    let remove_target = || match access_type {
        AccessType::Mount => std::fs::remove_dir(target),
        AccessType::Block => std::fs::remove_file(target),
    };
    match fsops::bind_mount(source, target, readonly) {
        Ok(()) => {
            tracing::info!(source = %source.display(), target = %target.display(), readonly, "bind-mounted");
            Ok(())
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
            // No privilege to mount: publish as a symlink instead.
            if !created {
                remove_target().map_err(|e| internal("replacing", target, e))?;
            } else {
                remove_target().map_err(|e| internal("removing", target, e))?;
            }
            std::os::unix::fs::symlink(source, target)
                .map_err(|e| internal("linking", target, e))?;
            tracing::info!(source = %source.display(), target = %target.display(), readonly, error = %e, "cannot mount; published as a symlink");
            Ok(())
        }
        Err(e) => {
            if created {
                let _ = remove_target();
            }
            Err(internal("bind-mounting onto", target, e))
        }
    }
}

/// What a block volume's `block` file is published as: its loop device;
/// without the privilege to attach one, the file itself (published as a
/// link, like every publication of a process that may not mount).
fn block_device(file: &Path) -> Result<PathBuf, Status> {
    match fsops::attach_loop(file) {
        Ok(device) => Ok(device),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
            tracing::debug!(file = %file.display(), error = %e, "no loop device: publishing the file");
            Ok(file.to_path_buf())
        }
        Err(e) => Err(internal("attaching a loop device to", file, e)),
    }
}

/// Detaches the loop device of a block volume's `block` file once no
/// publication shows it any more.
fn release_block_device(file: &Path, live: &BTreeMap<String, Publication>) -> Result<(), Status> {
    if !live.is_empty() {
        return Ok(());
    }
    fsops::detach_loop(file).map_err(|e| internal("detaching the loop device of", file, e))
}

/// Undoes the publication at `target` of a volume whose record and data
/// the controller side (another process sharing the state directory)
/// deleted meanwhile: the kubelet may unpublish after the pod, claim and PV
/// are gone. Its source is gone, so what `target` shows cannot be compared
/// with it: the target is unmounted and removed as an unknown volume's,
/// and the loop device a block volume's target showed is detached (its
/// backing file, deleted, no longer names it).
fn unpublish_deleted(target: &Path) -> Result<(), Status> {
    let device = std::fs::metadata(target)
        .ok()
        .filter(|meta| meta.file_type().is_block_device())
        .map(|meta| meta.rdev());
    unpublish(target, None)?;
    if let Some(rdev) = device {
        fsops::detach_loop_device(rdev)
            .map_err(|e| internal("detaching the loop device of", target, e))?;
    }
    Ok(())
}

/// Undoes [`publish`]: unmounts (or unlinks) and removes `target`. With
/// `source` (the volume is known), a mount or link at `target` that is not
/// this volume is left alone. Returns whether anything was removed.
fn unpublish(target: &Path, source: Option<&Path>) -> Result<bool, Status> {
    let meta = match std::fs::symlink_metadata(target) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(internal("inspecting", target, e)),
    };
    let foreign = |what: &str| {
        tracing::info!(target = %target.display(), "{what} is not this volume; left alone");
        Ok(false)
    };
    if meta.file_type().is_symlink() {
        if let Some(source) = source {
            let link =
                std::fs::read_link(target).map_err(|e| internal("reading link", target, e))?;
            if link != source {
                return foreign("the link");
            }
        }
        std::fs::remove_file(target).map_err(|e| internal("removing", target, e))?;
        return Ok(true);
    }
    if fsops::is_mount_point(target).map_err(|e| internal("inspecting", target, e))? {
        if let Some(source) = source
            && !shows(source, target).map_err(|e| internal("inspecting", target, e))?
        {
            return foreign("the mount");
        }
        // Unmount every mount stacked on the target (normally one).
        for _ in 0..16 {
            if !fsops::is_mount_point(target).map_err(|e| internal("inspecting", target, e))? {
                break;
            }
            fsops::unmount(target).map_err(|e| internal("unmounting", target, e))?;
        }
    }
    if meta.is_dir() {
        std::fs::remove_dir(target).map_err(|e| internal("removing", target, e))?;
    } else {
        std::fs::remove_file(target).map_err(|e| internal("removing", target, e))?;
    }
    tracing::info!(target = %target.display(), "unpublished");
    Ok(true)
}

impl Driver {
    pub(crate) fn volume_source(&self, id: &str, access_type: AccessType) -> PathBuf {
        let dir = store::volume_path(&self.inner.config.state_dir, id);
        match access_type {
            AccessType::Mount => dir,
            AccessType::Block => dir.join(BLOCK_FILE),
        }
    }

    /// Reads the record of volume `id` into the index when the index does
    /// not have it (it may have been created by another process sharing the
    /// state directory since this one started).
    async fn load_unknown_volume(&self, id: &str) -> Result<(), Status> {
        if self.state().volumes.contains_key(id) {
            return Ok(());
        }
        let volumes_dir = self.inner.volumes_dir.clone();
        let owned_id = id.to_owned();
        if let Some(record) =
            blocking(move || store::read_volume_record(&volumes_dir, &owned_id)).await?
        {
            let mut state = self.state();
            if !state.volumes.contains_key(id) {
                tracing::info!(id, "volume record loaded from the state directory");
                state.insert_volume(record);
            }
        }
        Ok(())
    }

    /// Writes `record` (under its volume lock) and updates the index,
    /// unless the volume was deleted meanwhile by the controller side
    /// (another process sharing the state directory: the kubelet may
    /// unpublish a volume after its pod, claim and PV are gone); then the
    /// record stays deleted, leaves the index, and the answer is `false`.
    async fn save_volume(&self, record: VolumeRecord) -> Result<bool, Status> {
        let volumes_dir = self.inner.volumes_dir.clone();
        let to_write = record.clone();
        let written =
            blocking(move || store::rewrite_existing_volume_record(&volumes_dir, &to_write))
                .await?;
        if written {
            self.state().insert_volume(record);
        } else {
            tracing::info!(id = %record.id, "volume deleted meanwhile; its record is not written again");
            self.state().remove_volume(&record.id);
        }
        Ok(written)
    }

    async fn publish_impl(
        &self,
        req: csi::NodePublishVolumeRequest,
    ) -> Result<csi::NodePublishVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is empty"));
        }
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is missing"))?;
        let (access_type, mode) = parse_capability(cap)?;
        let access_mode = single_node_mode(mode).ok_or_else(|| {
            Status::invalid_argument(format!(
                "access mode {} is not supported",
                mode.as_str_name()
            ))
        })?;
        self.load_unknown_volume(&req.volume_id).await?;
        let not_found = || Status::not_found(format!("volume {:?} does not exist", req.volume_id));
        let name = self
            .state()
            .volumes
            .get(&req.volume_id)
            .map(|v| v.name.clone())
            .ok_or_else(not_found)?;
        let _guard = self.inner.locks.lock(vec![volume_key(&name)]).await;
        let mut record = self
            .state()
            .volumes
            .get(&req.volume_id)
            .cloned()
            .ok_or_else(not_found)?;
        if record.access_type != access_type {
            return Err(Status::invalid_argument(format!(
                "volume is a {} volume, the capability says {}",
                record.access_type.as_str(),
                access_type.as_str()
            )));
        }
        let wanted = Publication {
            access_mode,
            readonly: req.readonly,
        };
        let source = self.volume_source(&req.volume_id, access_type);
        let target = PathBuf::from(&req.target_path);
        let (here, live) = {
            let (source, target, published) =
                (source.clone(), target.clone(), record.published.clone());
            run_blocking(move || {
                let here =
                    shows(&source, &target).map_err(|e| internal("inspecting", &target, e))?;
                Ok((here, live_publications(&source, &published)))
            })
            .await?
        };
        if here {
            // Published here already: the same arguments are idempotent,
            // other ones are ALREADY_EXISTS (CSI spec, NodePublishVolume,
            // "T1=T2, P1!=P2").
            match record.published.get(&req.target_path) {
                Some(p) if *p == wanted => {}
                Some(p) => {
                    return Err(Status::already_exists(format!(
                        "volume {:?} is published at {} with access mode {} and readonly={}, not {} and readonly={}",
                        req.volume_id,
                        req.target_path,
                        p.access_mode.as_str(),
                        p.readonly,
                        wanted.access_mode.as_str(),
                        wanted.readonly
                    )));
                }
                None => {
                    // Mounted by a driver that stopped before recording it.
                    record.published.insert(req.target_path.clone(), wanted);
                    self.save_volume(record).await?;
                }
            }
            return Ok(csi::NodePublishVolumeResponse {});
        }
        // A second target on this node is only for SINGLE_NODE_MULTI_WRITER
        // (CSI spec, NodePublishVolume, "T1!=T2": FAILED_PRECONDITION for
        // the other single-node modes).
        if let Some((other, p)) = live.iter().find(|(other, p)| {
            *other != &req.target_path
                && (wanted.access_mode != AccessMode::SingleNodeMultiWriter
                    || p.access_mode != AccessMode::SingleNodeMultiWriter)
        }) {
            return Err(Status::failed_precondition(format!(
                "volume {:?} is already published at {other} with access mode {}; with {} it cannot also be published at {}",
                req.volume_id,
                p.access_mode.as_str(),
                wanted.access_mode.as_str(),
                req.target_path
            )));
        }
        // Record the publication before mounting (and drop stale entries),
        // so that a crash in between cannot hide a mount from the checks
        // above; a recorded target that does not show the volume is ignored.
        record.published = live.clone();
        record.published.insert(req.target_path.clone(), wanted);
        if !self.save_volume(record.clone()).await? {
            return Err(Status::not_found(format!(
                "volume {:?} does not exist",
                req.volume_id
            )));
        }
        let readonly = req.readonly;
        let result = {
            let (source, target) = (source.clone(), target.clone());
            run_blocking(move || {
                let shown = match access_type {
                    AccessType::Mount => source.clone(),
                    AccessType::Block => block_device(&source)?,
                };
                let published = publish(&shown, &target, access_type, readonly);
                if published.is_err() && access_type == AccessType::Block {
                    release_block_device(&source, &live)?;
                }
                published
            })
            .await
        };
        if let Err(status) = result {
            record.published.remove(&req.target_path);
            if let Err(e) = self.save_volume(record).await {
                tracing::warn!(id = %req.volume_id, target = %req.target_path, error = %e.message(), "cannot forget a failed publication; it is ignored as stale");
            }
            return Err(status);
        }
        Ok(csi::NodePublishVolumeResponse {})
    }

    async fn unpublish_impl(
        &self,
        req: csi::NodeUnpublishVolumeRequest,
    ) -> Result<csi::NodeUnpublishVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is empty"));
        }
        self.load_unknown_volume(&req.volume_id).await?;
        let name = self
            .state()
            .volumes
            .get(&req.volume_id)
            .map(|v| v.name.clone());
        let _guard = match &name {
            Some(name) => Some(self.inner.locks.lock(vec![volume_key(name)]).await),
            None => None,
        };
        let record = self.state().volumes.get(&req.volume_id).cloned();
        let target = PathBuf::from(&req.target_path);
        if let Some(known) = &record {
            let record_path = store::record_path(&self.inner.volumes_dir, &known.id);
            let deleted = blocking(move || match std::fs::symlink_metadata(&record_path) {
                Ok(_) => Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
                Err(e) => Err(crate::Error::io(
                    format!("inspecting {}", record_path.display()),
                    e,
                )),
            })
            .await?;
            if deleted {
                tracing::info!(id = %known.id, target = %req.target_path, "unpublishing a volume the controller side deleted meanwhile");
                self.state().remove_volume(&known.id);
                run_blocking(move || unpublish_deleted(&target)).await?;
                return Ok(csi::NodeUnpublishVolumeResponse {});
            }
        }
        let source = record
            .as_ref()
            .map(|r| self.volume_source(&r.id, r.access_type));
        let removed = run_blocking(move || unpublish(&target, source.as_deref())).await?;
        let Some(mut record) = record else {
            if removed {
                return Ok(csi::NodeUnpublishVolumeResponse {});
            }
            return Err(Status::not_found(format!(
                "volume {:?} does not exist",
                req.volume_id
            )));
        };
        let forgotten = record.published.remove(&req.target_path).is_some();
        if record.access_type == AccessType::Block {
            let source = self.volume_source(&record.id, record.access_type);
            let published = record.published.clone();
            run_blocking(move || {
                release_block_device(&source, &live_publications(&source, &published))
            })
            .await?;
        }
        if forgotten {
            self.save_volume(record).await?;
        }
        Ok(csi::NodeUnpublishVolumeResponse {})
    }

    /// Node side of an expansion. The data is a directory or a sparse file
    /// that ControllerExpandVolume already grew, so there is nothing to
    /// resize here: the call checks that the volume is published at
    /// `volume_path` and that its capacity satisfies the range.
    async fn expand_impl(
        &self,
        req: csi::NodeExpandVolumeRequest,
    ) -> Result<csi::NodeExpandVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        if req.volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is empty"));
        }
        let wanted_type = match &req.volume_capability {
            Some(cap) => Some(parse_capability(cap)?.0),
            None => None,
        };
        let (required, limit) = range_bounds(req.capacity_range.as_ref())?;
        self.load_unknown_volume(&req.volume_id).await?;
        let not_found = || Status::not_found(format!("volume {:?} does not exist", req.volume_id));
        let name = self
            .state()
            .volumes
            .get(&req.volume_id)
            .map(|v| v.name.clone())
            .ok_or_else(not_found)?;
        let _guard = self.inner.locks.lock(vec![volume_key(&name)]).await;
        let record = self
            .state()
            .volumes
            .get(&req.volume_id)
            .cloned()
            .ok_or_else(not_found)?;
        if let Some(t) = wanted_type
            && t != record.access_type
        {
            return Err(Status::invalid_argument(format!(
                "volume is a {} volume, the capability says {}",
                record.access_type.as_str(),
                t.as_str()
            )));
        }
        let source = self.volume_source(&record.id, record.access_type);
        let volume_path = PathBuf::from(&req.volume_path);
        let published = run_blocking(move || {
            shows(&source, &volume_path).map_err(|e| internal("inspecting", &volume_path, e))
        })
        .await?;
        if !published {
            return Err(Status::not_found(format!(
                "volume {:?} is not published at {}",
                req.volume_id, req.volume_path
            )));
        }
        if required > record.capacity_bytes {
            return Err(Status::out_of_range(format!(
                "volume {:?} has {} bytes; ControllerExpandVolume must grow it to {required} first",
                req.volume_id, record.capacity_bytes
            )));
        }
        if limit > 0 && record.capacity_bytes > limit {
            return Err(Status::out_of_range(format!(
                "volume {:?} has {} bytes, more than limit_bytes {limit}",
                req.volume_id, record.capacity_bytes
            )));
        }
        Ok(csi::NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(record.capacity_bytes).unwrap_or(i64::MAX),
        })
    }

    async fn volume_stats_impl(
        &self,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        if req.volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is empty"));
        }
        self.load_unknown_volume(&req.volume_id).await?;
        let record = self
            .state()
            .volumes
            .get(&req.volume_id)
            .cloned()
            .ok_or_else(|| {
                Status::not_found(format!("volume {:?} does not exist", req.volume_id))
            })?;
        let volume_path = PathBuf::from(&req.volume_path);
        let data_dir = store::volume_path(&self.inner.config.state_dir, &record.id);
        let source = self.volume_source(&record.id, record.access_type);
        let total = i64::try_from(record.capacity_bytes).unwrap_or(i64::MAX);
        let usage = run_blocking(move || {
            if !shows(&source, &volume_path).map_err(|e| internal("inspecting", &volume_path, e))? {
                return Err(Status::not_found(format!(
                    "volume {:?} is not published at {}",
                    record.id,
                    volume_path.display()
                )));
            }
            Ok(match record.access_type {
                AccessType::Block => vec![csi::VolumeUsage {
                    available: 0,
                    total,
                    used: 0,
                    unit: volume_usage::Unit::Bytes as i32,
                }],
                AccessType::Mount => {
                    let (bytes, inodes) = fsops::tree_usage(&data_dir)
                        .map_err(|e| internal("measuring", &data_dir, e))?;
                    let used = i64::try_from(bytes).unwrap_or(i64::MAX);
                    vec![
                        csi::VolumeUsage {
                            available: total.saturating_sub(used).max(0),
                            total,
                            used,
                            unit: volume_usage::Unit::Bytes as i32,
                        },
                        csi::VolumeUsage {
                            available: 0,
                            total: 0,
                            used: i64::try_from(inodes).unwrap_or(i64::MAX),
                            unit: volume_usage::Unit::Inodes as i32,
                        },
                    ]
                }
            })
        })
        .await?;
        Ok(csi::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        })
    }
}

fn node_capabilities() -> Vec<csi::NodeServiceCapability> {
    use node_service_capability::rpc::Type;
    [
        Type::GetVolumeStats,
        Type::ExpandVolume,
        Type::SingleNodeMultiWriter,
    ]
    .into_iter()
    .map(|t| csi::NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    })
    .collect()
}

fn unimplemented(method: &str) -> Status {
    Status::unimplemented(format!("{method} is not supported by this driver"))
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let id = self.incoming(request).volume_id;
        self.call("NodeStageVolume", Some(&id), async {
            Err(unimplemented("NodeStageVolume"))
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let id = self.incoming(request).volume_id;
        self.call("NodeUnstageVolume", Some(&id), async {
            Err(unimplemented("NodeUnstageVolume"))
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call(
            "NodePublishVolume",
            Some(&id),
            self.to_completion(|d| async move { d.publish_impl(req).await }),
        )
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call(
            "NodeUnpublishVolume",
            Some(&id),
            self.to_completion(|d| async move { d.unpublish_impl(req).await }),
        )
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call("NodeGetVolumeStats", Some(&id), self.volume_stats_impl(req))
            .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call(
            "NodeExpandVolume",
            Some(&id),
            self.to_completion(|d| async move { d.expand_impl(req).await }),
        )
        .await
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        self.call("NodeGetCapabilities", None, async {
            Ok(csi::NodeGetCapabilitiesResponse {
                capabilities: node_capabilities(),
            })
        })
        .await
    }

    async fn node_get_info(
        &self,
        _request: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let config = &self.inner.config;
        self.call("NodeGetInfo", None, async {
            Ok(csi::NodeGetInfoResponse {
                node_id: config.node_id.clone(),
                max_volumes_per_node: 0,
                accessible_topology: config.enable_topology.then(|| csi::Topology {
                    segments: [(config.topology_key.clone(), config.node_id.clone())]
                        .into_iter()
                        .collect(),
                }),
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drops CAP_SYS_ADMIN from the effective set of the calling thread only
    /// (capabilities are per thread in Linux; the raw syscall does not
    /// propagate to other threads), so that mount(2) fails with EPERM.
    fn drop_sys_admin_in_this_thread() {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
        const CAP_SYS_ADMIN: u32 = 21;
        let mut header = Header {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: header and two data structs as capget(2) expects for version 3.
        let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
        assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
        data[0].effective &= !(1 << CAP_SYS_ADMIN);
        // SAFETY: as above; only lowers the effective set of this thread.
        let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
        assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
    }

    #[test]
    fn without_mount_privilege_publish_falls_back_to_a_symlink() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("volume");
        std::fs::create_dir(&source).expect("mkdir");
        std::fs::write(source.join("f"), b"data").expect("write");
        let target = dir.path().join("pods").join("target");
        std::fs::create_dir(dir.path().join("pods")).expect("mkdir");
        let (s, t) = (source.clone(), target.clone());
        std::thread::spawn(move || {
            drop_sys_admin_in_this_thread();
            publish(&s, &t, AccessType::Mount, false).expect("publish");
            // Idempotent.
            publish(&s, &t, AccessType::Mount, false).expect("publish again");
        })
        .join()
        .expect("thread");
        let meta = std::fs::symlink_metadata(&target).expect("target");
        assert!(meta.file_type().is_symlink());
        assert_eq!(
            std::fs::read(target.join("f")).expect("read through"),
            b"data"
        );
        // A link to something else is not ours.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).expect("mkdir");
        let err = publish(&other, &target, AccessType::Mount, false).expect_err("taken");
        assert_eq!(err.code(), tonic::Code::AlreadyExists);
        // A link to another source is not this volume's: left alone.
        assert!(!unpublish(&target, Some(&other)).expect("foreign link"));
        assert!(std::fs::symlink_metadata(&target).is_ok());
        assert!(unpublish(&target, Some(&source)).expect("unpublish"));
        assert!(!unpublish(&target, Some(&source)).expect("unpublish again"));
        assert!(std::fs::symlink_metadata(&target).is_err());
        assert!(source.join("f").exists(), "unpublish keeps the volume data");
    }

    #[test]
    fn publish_rejects_a_target_of_the_wrong_type() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("volume");
        std::fs::create_dir(&source).expect("mkdir");
        let target = dir.path().join("file");
        std::fs::write(&target, b"").expect("write");
        let err = publish(&source, &target, AccessType::Mount, false).expect_err("not a dir");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(target.is_file(), "left alone");
    }
}
