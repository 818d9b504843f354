//! The Controller service.

use std::collections::BTreeMap;
use std::ops::Bound;

use csi_proto::v1::{
    self as csi, CapacityRange, Topology, VolumeCapability, VolumeContentSource,
    controller_server::Controller, controller_service_capability, volume_capability,
    volume_capability::access_mode::Mode, volume_content_source,
};
use tonic::{Request, Response, Status};

use crate::locks::{snapshot_key, volume_key};
use crate::state::{Driver, blocking};
use crate::store::{
    self, AccessMode, AccessType, BLOCK_FILE, ContentSource, SnapshotRecord, Timestamp,
    VolumeRecord,
};
use crate::{DEFAULT_VOLUME_SIZE, KIND_PARAMETER, fsops};

/// Checks one capability: it must have an access type and a known access
/// mode. Returns them (the mode may still be unsupported).
pub(crate) fn parse_capability(cap: &VolumeCapability) -> Result<(AccessType, Mode), Status> {
    let access_type = match &cap.access_type {
        Some(volume_capability::AccessType::Block(_)) => AccessType::Block,
        Some(volume_capability::AccessType::Mount(_)) => AccessType::Mount,
        None => {
            return Err(Status::invalid_argument(
                "volume capability has neither block nor mount access type",
            ));
        }
    };
    let mode = cap
        .access_mode
        .as_ref()
        .and_then(|m| Mode::try_from(m.mode).ok())
        .filter(|m| *m != Mode::Unknown)
        .ok_or_else(|| Status::invalid_argument("volume capability has no valid access mode"))?;
    Ok((access_type, mode))
}

/// This is a single-node driver: the single-node modes, `None` for the
/// others.
pub(crate) fn single_node_mode(mode: Mode) -> Option<AccessMode> {
    match mode {
        Mode::SingleNodeWriter => Some(AccessMode::SingleNodeWriter),
        Mode::SingleNodeReaderOnly => Some(AccessMode::SingleNodeReaderOnly),
        Mode::SingleNodeSingleWriter => Some(AccessMode::SingleNodeSingleWriter),
        Mode::SingleNodeMultiWriter => Some(AccessMode::SingleNodeMultiWriter),
        _ => None,
    }
}

/// Whether this single-node driver offers `mode`.
pub(crate) fn mode_supported(mode: Mode) -> bool {
    single_node_mode(mode).is_some()
}

/// The access type of a CreateVolume request: every capability well formed
/// and supported, all of one access type.
fn requested_access_type(caps: &[VolumeCapability]) -> Result<AccessType, Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is empty"));
    }
    let mut access_type = None;
    for cap in caps {
        let (t, mode) = parse_capability(cap)?;
        if !mode_supported(mode) {
            return Err(Status::invalid_argument(format!(
                "access mode {} is not supported by this single-node driver",
                mode.as_str_name()
            )));
        }
        match access_type {
            None => access_type = Some(t),
            Some(prev) if prev != t => {
                return Err(Status::invalid_argument(
                    "volume capabilities ask for both block and mount access",
                ));
            }
            Some(_) => {}
        }
    }
    access_type.ok_or_else(|| Status::invalid_argument("volume_capabilities is empty"))
}

/// (required, limit) in bytes; negative values are invalid, a limit below
/// the required bytes is out of range.
pub(crate) fn range_bounds(range: Option<&CapacityRange>) -> Result<(u64, u64), Status> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    let required = u64::try_from(required)
        .map_err(|_| Status::invalid_argument("capacity_range.required_bytes is negative"))?;
    let limit = u64::try_from(limit)
        .map_err(|_| Status::invalid_argument("capacity_range.limit_bytes is negative"))?;
    if limit > 0 && limit < required {
        return Err(Status::out_of_range(format!(
            "capacity_range.limit_bytes {limit} is below required_bytes {required}"
        )));
    }
    Ok((required, limit))
}

/// The size of a new volume for `range`.
fn requested_size(range: Option<&CapacityRange>, max: u64) -> Result<u64, Status> {
    let (required, limit) = range_bounds(range)?;
    let size = if required == 0 {
        let default = DEFAULT_VOLUME_SIZE.min(max);
        if limit > 0 {
            default.min(limit)
        } else {
            default
        }
    } else {
        required
    };
    if size > max {
        return Err(Status::out_of_range(format!(
            "requested {size} bytes exceed the maximum volume size {max}"
        )));
    }
    Ok(size)
}

/// Whether an existing volume of `capacity` bytes satisfies `range`.
fn satisfies(range: Option<&CapacityRange>, capacity: u64) -> bool {
    match range_bounds(range) {
        Ok((required, limit)) => capacity >= required && (limit == 0 || capacity <= limit),
        Err(_) => false,
    }
}

fn parse_content_source(
    source: Option<&VolumeContentSource>,
) -> Result<Option<ContentSource>, Status> {
    let Some(source) = source else {
        return Ok(None);
    };
    match &source.r#type {
        Some(volume_content_source::Type::Snapshot(s)) if !s.snapshot_id.is_empty() => {
            Ok(Some(ContentSource::Snapshot {
                id: s.snapshot_id.clone(),
            }))
        }
        Some(volume_content_source::Type::Volume(v)) if !v.volume_id.is_empty() => {
            Ok(Some(ContentSource::Volume {
                id: v.volume_id.clone(),
            }))
        }
        Some(volume_content_source::Type::Snapshot(_)) => Err(Status::invalid_argument(
            "volume_content_source.snapshot.snapshot_id is empty",
        )),
        Some(volume_content_source::Type::Volume(_)) => Err(Status::invalid_argument(
            "volume_content_source.volume.volume_id is empty",
        )),
        None => Err(Status::invalid_argument(
            "volume_content_source has neither snapshot nor volume",
        )),
    }
}

fn content_source_proto(source: &ContentSource) -> VolumeContentSource {
    VolumeContentSource {
        r#type: Some(match source {
            ContentSource::Snapshot { id } => {
                volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
                    snapshot_id: id.clone(),
                })
            }
            ContentSource::Volume { id } => {
                volume_content_source::Type::Volume(volume_content_source::VolumeSource {
                    volume_id: id.clone(),
                })
            }
        }),
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn volume_proto(record: &VolumeRecord) -> csi::Volume {
    csi::Volume {
        capacity_bytes: to_i64(record.capacity_bytes),
        volume_id: record.id.clone(),
        volume_context: record
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        content_source: record.content_source.as_ref().map(content_source_proto),
        accessible_topology: record
            .accessible_topology
            .iter()
            .map(|segments| Topology {
                segments: segments
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .collect(),
    }
}

fn snapshot_proto(record: &SnapshotRecord) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: to_i64(record.size_bytes),
        snapshot_id: record.id.clone(),
        source_volume_id: record.source_volume_id.clone(),
        creation_time: Some(record.creation_time.to_proto()),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

/// Pagination tokens are the last id of the previous page (ids are UUIDs).
fn parse_token(token: &str) -> Result<Option<String>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    uuid::Uuid::parse_str(token)
        .map(|_| Some(token.to_owned()))
        .map_err(|_| Status::aborted(format!("invalid starting_token {token:?}")))
}

fn parse_max_entries(max_entries: i32) -> Result<usize, Status> {
    usize::try_from(max_entries)
        .map_err(|_| Status::invalid_argument("max_entries is negative"))
        .map(|n| if n == 0 { usize::MAX } else { n })
}

/// One page of `items` (sorted by id) after `token`, and the next token.
fn paginate<'a, T: 'a>(
    items: impl Iterator<Item = (&'a String, &'a T)>,
    max: usize,
) -> (Vec<&'a T>, String) {
    let mut page = Vec::new();
    let mut last_id = String::new();
    let mut more = false;
    for (id, item) in items {
        if page.len() == max {
            more = true;
            break;
        }
        last_id.clone_from(id);
        page.push(item);
    }
    (page, if more { last_id } else { String::new() })
}

fn after(token: Option<&str>) -> (Bound<&str>, Bound<&str>) {
    match token {
        Some(t) => (Bound::Excluded(t), Bound::Unbounded),
        None => (Bound::Unbounded, Bound::Unbounded),
    }
}

/// Gives back reserved capacity when dropped.
struct Reservation<'a> {
    driver: &'a Driver,
    kind: String,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut state = self.driver.state();
        if let Some(reserved) = state.reserved.get_mut(&self.kind) {
            *reserved = reserved.saturating_sub(self.bytes);
            if *reserved == 0 {
                state.reserved.remove(&self.kind);
            }
        }
    }
}

impl Driver {
    fn node_topology(&self) -> BTreeMap<String, String> {
        let config = &self.inner.config;
        BTreeMap::from([(config.topology_key.clone(), config.node_id.clone())])
    }

    pub(crate) fn topology_matches(&self, topology: &Topology) -> bool {
        let config = &self.inner.config;
        topology.segments.get(&config.topology_key) == Some(&config.node_id)
    }

    /// Reserves `bytes` in the pool for a request with kind `wanted` (empty:
    /// the first kind with room). Unlimited capacity reserves nothing.
    fn reserve(&self, wanted: &str, bytes: u64) -> Result<Reservation<'_>, Status> {
        let capacity = &self.inner.config.capacity;
        if capacity.is_empty() {
            return Ok(Reservation {
                driver: self,
                kind: wanted.to_owned(),
                bytes: 0,
            });
        }
        let mut state = self.state();
        let kind = if wanted.is_empty() {
            capacity
                .iter()
                .find(|(kind, total)| state.free(kind, **total) >= bytes)
                .map(|(kind, _)| kind.clone())
                .ok_or_else(|| {
                    Status::resource_exhausted(format!("no kind has {bytes} bytes free"))
                })?
        } else {
            let total = capacity
                .get(wanted)
                .copied()
                .ok_or_else(|| Status::invalid_argument(format!("unknown kind {wanted:?}")))?;
            let free = state.free(wanted, total);
            if free < bytes {
                return Err(Status::resource_exhausted(format!(
                    "kind {wanted:?} has {free} bytes free, {bytes} requested"
                )));
            }
            wanted.to_owned()
        };
        *state.reserved.entry(kind.clone()).or_default() += bytes;
        Ok(Reservation {
            driver: self,
            kind,
            bytes,
        })
    }

    async fn create_volume_impl(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, Status> {
        let config = &self.inner.config;
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is empty"));
        }
        let access_type = requested_access_type(&req.volume_capabilities)?;
        let range = req.capacity_range.as_ref();
        let size = requested_size(range, config.max_volume_size)?;
        let source = parse_content_source(req.volume_content_source.as_ref())?;
        if !req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument(
                "mutable_parameters are not supported (MODIFY_VOLUME is not offered)",
            ));
        }
        let wanted_kind = req
            .parameters
            .get(KIND_PARAMETER)
            .cloned()
            .unwrap_or_default();
        if !config.capacity.is_empty()
            && !wanted_kind.is_empty()
            && !config.capacity.contains_key(&wanted_kind)
        {
            return Err(Status::invalid_argument(format!(
                "unknown kind {wanted_kind:?}; known: {:?}",
                config.capacity.keys().collect::<Vec<_>>()
            )));
        }
        if config.enable_topology
            && let Some(reqs) = &req.accessibility_requirements
            && !reqs.requisite.is_empty()
            && !reqs.requisite.iter().any(|t| self.topology_matches(t))
        {
            return Err(Status::resource_exhausted(format!(
                "no requisite topology is accessible from node {:?}",
                config.node_id
            )));
        }

        // Lock the volume name and the content source (so it cannot be
        // deleted while it is copied), in one sorted acquisition.
        let source_key = |state: &crate::state::State| match &source {
            Some(ContentSource::Snapshot { id }) => {
                state.snapshots.get(id).map(|s| snapshot_key(&s.name))
            }
            Some(ContentSource::Volume { id }) => {
                state.volumes.get(id).map(|v| volume_key(&v.name))
            }
            None => None,
        };
        let locked_source = source_key(&self.state());
        let mut keys = vec![volume_key(&req.name)];
        keys.extend(locked_source.clone());
        let _guards = match self.inner.faults.name_busy()? {
            None => self.inner.locks.lock(keys).await,
            Some(code) => self.inner.locks.try_lock(keys).ok_or_else(|| {
                tracing::info!(name = %req.name, ?code, "fault injected: the name is busy");
                Status::new(
                    code,
                    format!("volume {:?} already exists: it is being created", req.name),
                )
            })?,
        };
        crate::faults::slow_work("CreateVolume", &req.name).await;

        let (source_dir, source_size, source_type) = {
            let state = self.state();
            if let Some(existing) = state.volume_by_name(&req.name) {
                let incompatible = |what: String| {
                    Err(Status::already_exists(format!(
                        "volume {:?} exists ({}) with {what}",
                        req.name, existing.id
                    )))
                };
                if !satisfies(range, existing.capacity_bytes) {
                    return incompatible(format!(
                        "capacity {} outside the requested range",
                        existing.capacity_bytes
                    ));
                }
                if existing.access_type != access_type {
                    return incompatible(format!("access type {}", existing.access_type.as_str()));
                }
                if existing.content_source != source {
                    return incompatible(format!(
                        "another content source ({:?})",
                        existing.content_source
                    ));
                }
                if !wanted_kind.is_empty() && existing.kind != wanted_kind {
                    return incompatible(format!("kind {:?}", existing.kind));
                }
                return Ok(csi::CreateVolumeResponse {
                    volume: Some(volume_proto(existing)),
                });
            }
            if source_key(&state) != locked_source {
                return Err(Status::aborted(
                    "the content source changed while locking; retry",
                ));
            }
            match &source {
                None => (None, 0, access_type),
                Some(ContentSource::Snapshot { id }) => {
                    let snap = state.snapshots.get(id).ok_or_else(|| {
                        Status::not_found(format!("source snapshot {id:?} does not exist"))
                    })?;
                    (
                        Some(store::snapshot_path(&config.state_dir, id)),
                        snap.size_bytes,
                        snap.access_type,
                    )
                }
                Some(ContentSource::Volume { id }) => {
                    let vol = state.volumes.get(id).ok_or_else(|| {
                        Status::not_found(format!("source volume {id:?} does not exist"))
                    })?;
                    (
                        Some(store::volume_path(&config.state_dir, id)),
                        vol.capacity_bytes,
                        vol.access_type,
                    )
                }
            }
        };
        if size < source_size {
            return Err(Status::out_of_range(format!(
                "requested {size} bytes are less than the content source's {source_size}"
            )));
        }
        if source_type != access_type {
            return Err(Status::invalid_argument(format!(
                "content source is a {} volume, a {} volume was requested",
                source_type.as_str(),
                access_type.as_str()
            )));
        }

        let reservation = self.reserve(&wanted_kind, size)?;
        let record = VolumeRecord {
            name: req.name.clone(),
            id: uuid::Uuid::new_v4().to_string(),
            capacity_bytes: size,
            limit_bytes: range_bounds(range)?.1,
            parameters: req.parameters.clone().into_iter().collect(),
            access_type,
            content_source: source,
            accessible_topology: if config.enable_topology {
                vec![self.node_topology()]
            } else {
                Vec::new()
            },
            kind: reservation.kind.clone(),
            creation_time: Timestamp::now(),
            published: BTreeMap::new(),
        };
        let data_dir = store::volume_path(&config.state_dir, &record.id);
        let record_path = store::record_path(&self.inner.volumes_dir, &record.id);
        let to_write = record.clone();
        blocking(move || {
            let result = (|| {
                fsops::create_data_dir(&data_dir)?;
                if let Some(src) = &source_dir {
                    fsops::copy_tree(src, &data_dir)?;
                }
                if to_write.access_type == AccessType::Block {
                    fsops::set_file_len(&data_dir.join(BLOCK_FILE), to_write.capacity_bytes)?;
                }
                // Commit point: the volume exists once its record does.
                store::write_json_atomic(&record_path, &to_write)
            })();
            if result.is_err() {
                let _ = store::remove_file_if_exists(&record_path);
                let _ = store::remove_tree_if_exists(&data_dir);
            }
            result
        })
        .await?;
        tracing::info!(name = %record.name, id = %record.id, bytes = size, kind = %record.kind, "volume created");
        let response = csi::CreateVolumeResponse {
            volume: Some(volume_proto(&record)),
        };
        self.state().insert_volume(record);
        drop(reservation);
        Ok(response)
    }

    async fn delete_volume_impl(
        &self,
        req: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        let Some(name) = self
            .state()
            .volumes
            .get(&req.volume_id)
            .map(|v| v.name.clone())
        else {
            return Ok(csi::DeleteVolumeResponse {});
        };
        let _guard = self.inner.locks.lock(vec![volume_key(&name)]).await;
        let Some(record) = self.state().volumes.get(&req.volume_id).cloned() else {
            return Ok(csi::DeleteVolumeResponse {});
        };
        // Deleting the data under a live publication would leave a mount of
        // a deleted directory behind: "Volume in use" (FAILED_PRECONDITION).
        if !record.published.is_empty() {
            let source = self.volume_source(&record.id, record.access_type);
            let published = record.published.clone();
            let live =
                blocking(move || Ok(crate::node::live_publications(&source, &published))).await?;
            if let Some(target) = live.keys().next() {
                return Err(Status::failed_precondition(format!(
                    "volume {:?} is still published at {target}; NodeUnpublishVolume it first",
                    req.volume_id
                )));
            }
        }
        let record_path = store::record_path(&self.inner.volumes_dir, &req.volume_id);
        // Commit point: removing the record deletes the volume; a data
        // directory left by a crash after it is removed at the next start.
        // Under the records lock: the node side (another process sharing
        // the state directory) rewrites a record only while it exists.
        let volumes_dir = self.inner.volumes_dir.clone();
        blocking(move || {
            store::with_records_lock(&volumes_dir, || store::remove_file_if_exists(&record_path))
        })
        .await?;
        self.state().remove_volume(&req.volume_id);
        let data_dir = store::volume_path(&self.inner.config.state_dir, &req.volume_id);
        if let Err(status) = blocking(move || store::remove_tree_if_exists(&data_dir)).await {
            tracing::warn!(id = %req.volume_id, error = %status.message(), "volume data left behind; removed at the next start");
        }
        tracing::info!(name = %name, id = %req.volume_id, "volume deleted");
        Ok(csi::DeleteVolumeResponse {})
    }

    fn validate_capabilities_impl(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is empty"));
        }
        let parsed = req
            .volume_capabilities
            .iter()
            .map(parse_capability)
            .collect::<Result<Vec<_>, _>>()?;
        let access_type = self
            .state()
            .volumes
            .get(&req.volume_id)
            .map(|v| v.access_type)
            .ok_or_else(|| {
                Status::not_found(format!("volume {:?} does not exist", req.volume_id))
            })?;
        let mut problems = Vec::new();
        for (t, mode) in parsed {
            if t != access_type {
                problems.push(format!(
                    "access type {} does not match the volume's {}",
                    t.as_str(),
                    access_type.as_str()
                ));
            }
            if !mode_supported(mode) {
                problems.push(format!(
                    "access mode {} is not supported",
                    mode.as_str_name()
                ));
            }
        }
        if !problems.is_empty() {
            return Ok(csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: problems.join("; "),
            });
        }
        Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        })
    }

    fn list_volumes_impl(
        &self,
        req: csi::ListVolumesRequest,
    ) -> Result<csi::ListVolumesResponse, Status> {
        let max = parse_max_entries(req.max_entries)?;
        let token = parse_token(&req.starting_token)?;
        let state = self.state();
        let (page, next_token) =
            paginate(state.volumes.range::<str, _>(after(token.as_deref())), max);
        Ok(csi::ListVolumesResponse {
            entries: page
                .into_iter()
                .map(|v| csi::list_volumes_response::Entry {
                    volume: Some(volume_proto(v)),
                    status: None,
                })
                .collect(),
            next_token,
        })
    }

    fn get_capacity_impl(
        &self,
        req: csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse, Status> {
        let config = &self.inner.config;
        let none = csi::GetCapacityResponse {
            available_capacity: 0,
            maximum_volume_size: Some(0),
            minimum_volume_size: None,
        };
        let mut supported = true;
        for cap in &req.volume_capabilities {
            let (_, mode) = parse_capability(cap)?;
            supported &= mode_supported(mode);
        }
        if !supported {
            return Ok(none);
        }
        if config.enable_topology
            && let Some(topology) = &req.accessible_topology
            && !self.topology_matches(topology)
        {
            return Ok(none);
        }
        let max = config.max_volume_size;
        if config.capacity.is_empty() {
            return Ok(csi::GetCapacityResponse {
                available_capacity: to_i64(max),
                maximum_volume_size: Some(to_i64(max)),
                minimum_volume_size: None,
            });
        }
        let state = self.state();
        let (available, largest) = match req.parameters.get(KIND_PARAMETER) {
            Some(kind) if !kind.is_empty() => match config.capacity.get(kind) {
                Some(total) => {
                    let free = state.free(kind, *total);
                    (free, free)
                }
                None => (0, 0),
            },
            _ => config
                .capacity
                .iter()
                .map(|(kind, total)| state.free(kind, *total))
                .fold((0u64, 0u64), |(sum, big), free| {
                    (sum.saturating_add(free), big.max(free))
                }),
        };
        Ok(csi::GetCapacityResponse {
            available_capacity: to_i64(available),
            maximum_volume_size: Some(to_i64(largest.min(max))),
            minimum_volume_size: None,
        })
    }

    async fn create_snapshot_impl(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<csi::CreateSnapshotResponse, Status> {
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is empty"));
        }
        if req.source_volume_id.is_empty() {
            return Err(Status::invalid_argument("source_volume_id is empty"));
        }
        let _snapshot_guard = self.inner.locks.lock(vec![snapshot_key(&req.name)]).await;
        if let Some(existing) = self.state().snapshot_by_name(&req.name) {
            if existing.source_volume_id != req.source_volume_id {
                return Err(Status::already_exists(format!(
                    "snapshot {:?} exists ({}) of another volume {:?}",
                    req.name, existing.id, existing.source_volume_id
                )));
            }
            return Ok(csi::CreateSnapshotResponse {
                snapshot: Some(snapshot_proto(existing)),
            });
        }
        let not_found = || {
            Status::not_found(format!(
                "source volume {:?} does not exist",
                req.source_volume_id
            ))
        };
        let source_name = self
            .state()
            .volumes
            .get(&req.source_volume_id)
            .map(|v| v.name.clone())
            .ok_or_else(not_found)?;
        // `v:` keys sort after `s:` keys: lock order is kept.
        let _volume_guard = self.inner.locks.lock(vec![volume_key(&source_name)]).await;
        let source = self
            .state()
            .volumes
            .get(&req.source_volume_id)
            .cloned()
            .ok_or_else(not_found)?;
        let record = SnapshotRecord {
            name: req.name.clone(),
            id: uuid::Uuid::new_v4().to_string(),
            source_volume_id: source.id.clone(),
            size_bytes: source.capacity_bytes,
            access_type: source.access_type,
            parameters: req.parameters.clone().into_iter().collect(),
            creation_time: Timestamp::now(),
        };
        let state_dir = &self.inner.config.state_dir;
        let data_dir = store::snapshot_path(state_dir, &record.id);
        let source_dir = store::volume_path(state_dir, &source.id);
        let record_path = store::record_path(&self.inner.snapshots_dir, &record.id);
        let to_write = record.clone();
        blocking(move || {
            let result = (|| {
                fsops::create_data_dir(&data_dir)?;
                fsops::copy_tree(&source_dir, &data_dir)?;
                store::write_json_atomic(&record_path, &to_write)
            })();
            if result.is_err() {
                let _ = store::remove_file_if_exists(&record_path);
                let _ = store::remove_tree_if_exists(&data_dir);
            }
            result
        })
        .await?;
        tracing::info!(name = %record.name, id = %record.id, source = %record.source_volume_id, "snapshot created");
        let response = csi::CreateSnapshotResponse {
            snapshot: Some(snapshot_proto(&record)),
        };
        self.state().insert_snapshot(record);
        Ok(response)
    }

    async fn delete_snapshot_impl(
        &self,
        req: csi::DeleteSnapshotRequest,
    ) -> Result<csi::DeleteSnapshotResponse, Status> {
        if req.snapshot_id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is empty"));
        }
        let Some(name) = self
            .state()
            .snapshots
            .get(&req.snapshot_id)
            .map(|s| s.name.clone())
        else {
            return Ok(csi::DeleteSnapshotResponse {});
        };
        let _guard = self.inner.locks.lock(vec![snapshot_key(&name)]).await;
        if !self.state().snapshots.contains_key(&req.snapshot_id) {
            return Ok(csi::DeleteSnapshotResponse {});
        }
        let record_path = store::record_path(&self.inner.snapshots_dir, &req.snapshot_id);
        blocking(move || store::remove_file_if_exists(&record_path)).await?;
        self.state().remove_snapshot(&req.snapshot_id);
        let data_dir = store::snapshot_path(&self.inner.config.state_dir, &req.snapshot_id);
        if let Err(status) = blocking(move || store::remove_tree_if_exists(&data_dir)).await {
            tracing::warn!(id = %req.snapshot_id, error = %status.message(), "snapshot data left behind; removed at the next start");
        }
        tracing::info!(name = %name, id = %req.snapshot_id, "snapshot deleted");
        Ok(csi::DeleteSnapshotResponse {})
    }

    fn list_snapshots_impl(
        &self,
        req: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, Status> {
        let max = parse_max_entries(req.max_entries)?;
        let token = parse_token(&req.starting_token)?;
        let state = self.state();
        let matching = state
            .snapshots
            .range::<str, _>(after(token.as_deref()))
            .filter(|(id, s)| {
                (req.snapshot_id.is_empty() || **id == req.snapshot_id)
                    && (req.source_volume_id.is_empty()
                        || s.source_volume_id == req.source_volume_id)
            });
        let (page, next_token) = paginate(matching, max);
        Ok(csi::ListSnapshotsResponse {
            entries: page
                .into_iter()
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(snapshot_proto(s)),
                })
                .collect(),
            next_token,
        })
    }

    fn get_snapshot_impl(
        &self,
        req: csi::GetSnapshotRequest,
    ) -> Result<csi::GetSnapshotResponse, Status> {
        if req.snapshot_id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is empty"));
        }
        let state = self.state();
        let snapshot = state.snapshots.get(&req.snapshot_id).ok_or_else(|| {
            Status::not_found(format!("snapshot {:?} does not exist", req.snapshot_id))
        })?;
        Ok(csi::GetSnapshotResponse {
            snapshot: Some(snapshot_proto(snapshot)),
        })
    }

    async fn expand_volume_impl(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        let config = &self.inner.config;
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        let Some(range) = req.capacity_range.as_ref() else {
            return Err(Status::invalid_argument("capacity_range is missing"));
        };
        let wanted_type = match &req.volume_capability {
            Some(cap) => Some(parse_capability(cap)?.0),
            None => None,
        };
        let (required, _limit) = range_bounds(Some(range))?;
        if required > config.max_volume_size {
            return Err(Status::out_of_range(format!(
                "requested {required} bytes exceed the maximum volume size {}",
                config.max_volume_size
            )));
        }
        let not_found = || Status::not_found(format!("volume {:?} does not exist", req.volume_id));
        let name = self
            .state()
            .volumes
            .get(&req.volume_id)
            .map(|v| v.name.clone())
            .ok_or_else(not_found)?;
        let _guard = self.inner.locks.lock(vec![volume_key(&name)]).await;
        let current = self
            .state()
            .volumes
            .get(&req.volume_id)
            .cloned()
            .ok_or_else(not_found)?;
        if let Some(t) = wanted_type
            && t != current.access_type
        {
            return Err(Status::invalid_argument(format!(
                "volume is a {} volume, the capability says {}",
                current.access_type.as_str(),
                t.as_str()
            )));
        }
        if required <= current.capacity_bytes {
            return Ok(csi::ControllerExpandVolumeResponse {
                capacity_bytes: to_i64(current.capacity_bytes),
                node_expansion_required: false,
            });
        }
        let growth = required - current.capacity_bytes;
        let _reservation = if config.capacity.contains_key(&current.kind) {
            Some(self.reserve(&current.kind, growth)?)
        } else {
            None
        };
        let mut updated = current.clone();
        updated.capacity_bytes = required;
        let data_dir = store::volume_path(&config.state_dir, &updated.id);
        let record_path = store::record_path(&self.inner.volumes_dir, &updated.id);
        let to_write = updated.clone();
        blocking(move || {
            if to_write.access_type == AccessType::Block {
                fsops::set_file_len(&data_dir.join(BLOCK_FILE), to_write.capacity_bytes)?;
            }
            store::write_json_atomic(&record_path, &to_write)
        })
        .await?;
        tracing::info!(id = %updated.id, from = current.capacity_bytes, to = required, "volume expanded");
        self.state().insert_volume(updated);
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: to_i64(required),
            node_expansion_required: false,
        })
    }

    fn get_volume_impl(
        &self,
        req: csi::ControllerGetVolumeRequest,
    ) -> Result<csi::ControllerGetVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        let state = self.state();
        let volume = state.volumes.get(&req.volume_id).ok_or_else(|| {
            Status::not_found(format!("volume {:?} does not exist", req.volume_id))
        })?;
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(volume_proto(volume)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: None,
            }),
        })
    }
}

fn controller_capabilities(controller_publish: bool) -> Vec<csi::ControllerServiceCapability> {
    use controller_service_capability::rpc::Type;
    let publish = controller_publish.then_some(Type::PublishUnpublishVolume);
    [
        Type::CreateDeleteVolume,
        Type::CreateDeleteSnapshot,
        Type::ListSnapshots,
        Type::CloneVolume,
        Type::ExpandVolume,
        Type::ListVolumes,
        Type::GetCapacity,
        Type::GetVolume,
        Type::GetSnapshot,
        Type::SingleNodeMultiWriter,
    ]
    .into_iter()
    .chain(publish)
    .map(|t| csi::ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc { r#type: t as i32 },
        )),
    })
    .collect()
}

fn unimplemented(method: &str) -> Status {
    Status::unimplemented(format!("{method} is not supported by this driver"))
}

fn target(id: &str) -> Option<&str> {
    Some(id)
}

#[tonic::async_trait]
impl Controller for Driver {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let req = self.incoming(request);
        let name = req.name.clone();
        self.call(
            "CreateVolume",
            target(&name),
            self.to_completion(|d| async move { d.create_volume_impl(req).await }),
        )
        .await
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call(
            "DeleteVolume",
            target(&id),
            self.to_completion(|d| async move { d.delete_volume_impl(req).await }),
        )
        .await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call("ControllerPublishVolume", target(&id), async {
            if !self.inner.config.controller_publish {
                return Err(unimplemented("ControllerPublishVolume"));
            }
            if req.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is empty"));
            }
            if req.node_id.is_empty() {
                return Err(Status::invalid_argument("node_id is empty"));
            }
            let Some(capability) = req.volume_capability.as_ref() else {
                return Err(Status::invalid_argument("volume_capability is missing"));
            };
            parse_capability(capability)?;
            let mut state = self.state();
            if !state.volumes.contains_key(&req.volume_id) {
                return Err(Status::not_found(format!(
                    "volume {} not found",
                    req.volume_id
                )));
            }
            if req.node_id != self.inner.config.node_id {
                return Err(Status::not_found(format!("node {} not found", req.node_id)));
            }
            let nodes = state
                .controller_published
                .entry(req.volume_id.clone())
                .or_default();
            match nodes.get(&req.node_id) {
                Some(readonly) if *readonly != req.readonly => {
                    return Err(Status::already_exists(format!(
                        "volume {} is published to node {} with readonly={readonly}",
                        req.volume_id, req.node_id
                    )));
                }
                _ => {
                    nodes.insert(req.node_id.clone(), req.readonly);
                }
            }
            Ok(csi::ControllerPublishVolumeResponse {
                publish_context: Default::default(),
            })
        })
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call("ControllerUnpublishVolume", target(&id), async {
            if !self.inner.config.controller_publish {
                return Err(unimplemented("ControllerUnpublishVolume"));
            }
            if req.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is empty"));
            }
            // An unknown volume or node is already unpublished: OK.
            let mut state = self.state();
            if let Some(nodes) = state.controller_published.get_mut(&req.volume_id) {
                if req.node_id.is_empty() {
                    nodes.clear();
                } else {
                    nodes.remove(&req.node_id);
                }
                if nodes.is_empty() {
                    state.controller_published.remove(&req.volume_id);
                }
            }
            Ok(csi::ControllerUnpublishVolumeResponse {})
        })
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call("ValidateVolumeCapabilities", target(&id), async {
            self.validate_capabilities_impl(req)
        })
        .await
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let req = self.incoming(request);
        self.call("ListVolumes", None, async { self.list_volumes_impl(req) })
            .await
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let req = self.incoming(request);
        self.call("GetCapacity", None, async { self.get_capacity_impl(req) })
            .await
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        self.call("ControllerGetCapabilities", None, async {
            Ok(csi::ControllerGetCapabilitiesResponse {
                capabilities: controller_capabilities(self.inner.config.controller_publish),
            })
        })
        .await
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let req = self.incoming(request);
        let name = req.name.clone();
        self.call(
            "CreateSnapshot",
            target(&name),
            self.to_completion(|d| async move { d.create_snapshot_impl(req).await }),
        )
        .await
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let req = self.incoming(request);
        let id = req.snapshot_id.clone();
        self.call(
            "DeleteSnapshot",
            target(&id),
            self.to_completion(|d| async move { d.delete_snapshot_impl(req).await }),
        )
        .await
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let req = self.incoming(request);
        self.call("ListSnapshots", None, async {
            self.list_snapshots_impl(req)
        })
        .await
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        let req = self.incoming(request);
        let id = req.snapshot_id.clone();
        self.call("GetSnapshot", target(&id), async {
            self.get_snapshot_impl(req)
        })
        .await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call(
            "ControllerExpandVolume",
            target(&id),
            self.to_completion(|d| async move { d.expand_volume_impl(req).await }),
        )
        .await
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        let req = self.incoming(request);
        let id = req.volume_id.clone();
        self.call("ControllerGetVolume", target(&id), async {
            self.get_volume_impl(req)
        })
        .await
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let id = self.incoming(request).volume_id;
        self.call("ControllerModifyVolume", target(&id), async {
            Err(unimplemented("ControllerModifyVolume"))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn res<T>(r: Result<T, Status>) -> Result<T, Code> {
        r.map_err(|s| s.code())
    }

    fn range(required: i64, limit: i64) -> CapacityRange {
        CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }
    }

    #[test]
    fn sizes() {
        let max = 1 << 40;
        assert_eq!(res(requested_size(None, max)), Ok(DEFAULT_VOLUME_SIZE));
        assert_eq!(
            res(requested_size(Some(&range(0, 0)), max)),
            Ok(DEFAULT_VOLUME_SIZE)
        );
        assert_eq!(res(requested_size(Some(&range(0, 1000)), max)), Ok(1000));
        assert_eq!(res(requested_size(Some(&range(10, 0)), max)), Ok(10));
        assert_eq!(res(requested_size(Some(&range(10, 10)), max)), Ok(10));
        assert_eq!(res(requested_size(None, 4096)), Ok(4096));
        assert_eq!(
            res(requested_size(Some(&range(10, 5)), max)),
            Err(Code::OutOfRange)
        );
        assert_eq!(
            res(requested_size(Some(&range(max as i64 + 1, 0)), max)),
            Err(Code::OutOfRange)
        );
        assert_eq!(
            res(requested_size(Some(&range(-1, 0)), max)),
            Err(Code::InvalidArgument)
        );
        assert_eq!(
            res(requested_size(Some(&range(0, -1)), max)),
            Err(Code::InvalidArgument)
        );
        assert!(satisfies(Some(&range(10, 20)), 15));
        assert!(satisfies(None, 15));
        assert!(!satisfies(Some(&range(16, 0)), 15));
        assert!(!satisfies(Some(&range(0, 14)), 15));
    }

    #[test]
    fn tokens_and_pages() {
        assert_eq!(res(parse_token("")), Ok(None));
        let id = uuid::Uuid::new_v4().to_string();
        assert_eq!(res(parse_token(&id)), Ok(Some(id.clone())));
        assert_eq!(res(parse_token("garbage")), Err(Code::Aborted));
        assert_eq!(res(parse_max_entries(0)), Ok(usize::MAX));
        assert_eq!(res(parse_max_entries(3)), Ok(3));
        assert_eq!(res(parse_max_entries(-1)), Err(Code::InvalidArgument));
        let items: BTreeMap<String, u32> = (0..5).map(|i| (format!("id{i}"), i)).collect();
        let (page, next) = paginate(items.iter(), 2);
        assert_eq!(page, [&0, &1]);
        assert_eq!(next, "id1");
        let (page, next) = paginate(items.range::<str, _>(after(Some("id3"))), 2);
        assert_eq!(page, [&4]);
        assert_eq!(next, "");
        let (page, next) = paginate(items.iter(), 5);
        assert_eq!(page.len(), 5);
        assert_eq!(next, "");
    }

    #[test]
    fn capabilities_are_checked() {
        use volume_capability::{AccessMode, AccessType as T, BlockVolume, MountVolume};
        let cap = |t: Option<T>, mode: Mode| VolumeCapability {
            access_type: t,
            access_mode: Some(AccessMode { mode: mode as i32 }),
        };
        let mount = || Some(T::Mount(MountVolume::default()));
        let block = || Some(T::Block(BlockVolume {}));
        assert_eq!(
            res(requested_access_type(&[cap(
                mount(),
                Mode::SingleNodeWriter
            )])),
            Ok(AccessType::Mount)
        );
        assert_eq!(
            res(requested_access_type(&[cap(
                block(),
                Mode::SingleNodeMultiWriter
            )])),
            Ok(AccessType::Block)
        );
        let invalid = Err(Code::InvalidArgument);
        assert_eq!(res(requested_access_type(&[])), invalid);
        assert_eq!(
            res(requested_access_type(&[cap(None, Mode::SingleNodeWriter)])),
            invalid
        );
        assert_eq!(
            res(requested_access_type(&[cap(mount(), Mode::Unknown)])),
            invalid
        );
        assert_eq!(
            res(requested_access_type(&[cap(
                mount(),
                Mode::MultiNodeMultiWriter
            )])),
            invalid
        );
        assert_eq!(
            res(requested_access_type(&[
                cap(mount(), Mode::SingleNodeWriter),
                cap(block(), Mode::SingleNodeWriter)
            ])),
            invalid
        );
        let no_mode = VolumeCapability {
            access_type: mount(),
            access_mode: None,
        };
        assert_eq!(res(requested_access_type(&[no_mode])), invalid);
        let bad_mode = VolumeCapability {
            access_type: mount(),
            access_mode: Some(AccessMode { mode: 99 }),
        };
        assert_eq!(res(requested_access_type(&[bad_mode])), invalid);
    }
}
