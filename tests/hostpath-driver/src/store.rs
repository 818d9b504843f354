//! On-disk records. Layout under the state directory:
//!
//! ```text
//! volumes/<id>/        the volume's data (block volumes: one sparse file `block`)
//! volumes/<id>.json    its VolumeRecord; the volume exists iff this file exists
//! snapshots/<id>/      a copy of the source volume's directory
//! snapshots/<id>.json  its SnapshotRecord
//! ```
//!
//! A record is the commit point: it is written (temporary file + rename)
//! only after the data directory is complete, and removed before the data
//! directory is. Data directories without a record are leftovers of a crash
//! and are removed when the driver starts.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

pub(crate) const VOLUMES_DIR: &str = "volumes";
pub(crate) const SNAPSHOTS_DIR: &str = "snapshots";
/// Name of the data file of a block volume inside its directory.
pub(crate) const BLOCK_FILE: &str = "block";
const RECORD_EXT: &str = "json";
const TEMP_PREFIX: &str = ".tmp";

/// Block or mount volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessType {
    Block,
    Mount,
}

impl AccessType {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessType::Block => "block",
            AccessType::Mount => "mount",
        }
    }
}

/// The access mode of one publication (the single-node modes this driver
/// offers), spelled as in csi.proto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

impl AccessMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::SingleNodeWriter => "SINGLE_NODE_WRITER",
            AccessMode::SingleNodeReaderOnly => "SINGLE_NODE_READER_ONLY",
            AccessMode::SingleNodeSingleWriter => "SINGLE_NODE_SINGLE_WRITER",
            AccessMode::SingleNodeMultiWriter => "SINGLE_NODE_MULTI_WRITER",
        }
    }
}

/// One NodePublishVolume of a volume that succeeded and was not undone:
/// the arguments the idempotency and single-writer rules compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub access_mode: AccessMode,
    pub readonly: bool,
}

/// Where a volume's initial content came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ContentSource {
    Snapshot { id: String },
    Volume { id: String },
}

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: i32,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
        }
    }

    pub fn to_proto(self) -> prost_types::Timestamp {
        prost_types::Timestamp {
            seconds: self.seconds,
            nanos: self.nanos,
        }
    }
}

/// The record of one volume (`volumes/<id>.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The CSI name of the volume (CreateVolumeRequest.name).
    pub name: String,
    /// The volume id handed to the CO.
    pub id: String,
    pub capacity_bytes: u64,
    /// The `capacity_range.limit_bytes` the volume was asked with (0: no
    /// limit): kept so that a test can compare what two sidecars asked for
    /// (the Go image never sends one).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub limit_bytes: u64,
    /// The CreateVolume parameters.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    pub access_type: AccessType,
    #[serde(default)]
    pub content_source: Option<ContentSource>,
    /// Segments of each accessible topology (empty when topology is off).
    #[serde(default)]
    pub accessible_topology: Vec<BTreeMap<String, String>>,
    /// The capacity pool; empty when capacity is unlimited and no kind was asked for.
    #[serde(default)]
    pub kind: String,
    pub creation_time: Timestamp,
    /// Target paths the volume is published at (NodePublishVolume), with
    /// the arguments of each publication. Written before the mount, so an
    /// entry whose target does not show the volume (a crash in between, or
    /// a target removed behind the driver's back) is stale and ignored.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub published: BTreeMap<String, Publication>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// The record of one snapshot (`snapshots/<id>.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub name: String,
    pub id: String,
    pub source_volume_id: String,
    /// The source volume's capacity when the snapshot was taken.
    pub size_bytes: u64,
    /// Access type of the source volume; a restore must use the same.
    pub access_type: AccessType,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    pub creation_time: Timestamp,
}

/// Data directory of volume `volume_id` under `state_dir`.
pub fn volume_path(state_dir: &Path, volume_id: &str) -> PathBuf {
    state_dir.join(VOLUMES_DIR).join(volume_id)
}

/// Data directory of snapshot `snapshot_id` under `state_dir`.
pub fn snapshot_path(state_dir: &Path, snapshot_id: &str) -> PathBuf {
    state_dir.join(SNAPSHOTS_DIR).join(snapshot_id)
}

pub(crate) fn record_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.{RECORD_EXT}"))
}

/// Reads the record of volume `id` in `volumes_dir`; `None` when there is
/// none.
pub(crate) fn read_volume_record(
    volumes_dir: &Path,
    id: &str,
) -> Result<Option<VolumeRecord>, Error> {
    let path = record_path(volumes_dir, id);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    let record: VolumeRecord = serde_json::from_slice(&bytes).map_err(|source| Error::Record {
        path: path.clone(),
        source,
    })?;
    if record.id != id {
        return Err(Error::Config(format!(
            "record {} holds id {:?}, not its file name",
            path.display(),
            record.id
        )));
    }
    Ok(Some(record))
}

/// Reads every volume record under `state_dir`, sorted by id. A missing
/// state directory has no volumes.
pub fn backend_volumes(state_dir: &Path) -> Result<Vec<VolumeRecord>, Error> {
    read_records(&state_dir.join(VOLUMES_DIR))
}

/// Reads every snapshot record under `state_dir`, sorted by id.
pub fn backend_snapshots(state_dir: &Path) -> Result<Vec<SnapshotRecord>, Error> {
    read_records(&state_dir.join(SNAPSHOTS_DIR))
}

trait HasId {
    fn id(&self) -> &str;
}
impl HasId for VolumeRecord {
    fn id(&self) -> &str {
        &self.id
    }
}
impl HasId for SnapshotRecord {
    fn id(&self) -> &str {
        &self.id
    }
}

fn read_records<T: serde::de::DeserializeOwned + HasId>(dir: &Path) -> Result<Vec<T>, Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", dir.display()), e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        let path = entry.path();
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if file_name.starts_with(TEMP_PREFIX) {
            continue;
        }
        let Some(stem) = file_name.strip_suffix(".json") else {
            continue;
        };
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let record: T = serde_json::from_slice(&bytes).map_err(|source| Error::Record {
            path: path.clone(),
            source,
        })?;
        if record.id() != stem {
            return Err(Error::Config(format!(
                "record {} holds id {:?}, not its file name",
                path.display(),
                record.id()
            )));
        }
        out.push(record);
    }
    out.sort_by(|a, b| a.id().cmp(b.id()));
    Ok(out)
}

/// Writes `value` as JSON to `path` atomically: a temporary file in the same
/// directory, renamed over `path`. Readers see the old or the new content,
/// never a partial one, also after a crash of this process.
pub(crate) fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), Error> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::Config(format!("{} has no parent directory", path.display())))?;
    let bytes = serde_json::to_vec_pretty(value).map_err(|source| Error::Record {
        path: path.to_path_buf(),
        source,
    })?;
    let mut tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempfile_in(dir)
        .map_err(|e| Error::io(format!("creating a temporary file in {}", dir.display()), e))?;
    tmp.write_all(&bytes)
        .and_then(|()| tmp.write_all(b"\n"))
        .map_err(|e| Error::io(format!("writing {}", tmp.path().display()), e))?;
    tmp.persist(path)
        .map_err(|e| Error::io(format!("renaming onto {}", path.display()), e.error))?;
    Ok(())
}

/// The lock file of a records folder (see [`with_records_lock`]); neither a
/// record (`*.json`) nor a leftover for [`clean_dir`].
const RECORDS_LOCK: &str = ".records.lock";

/// Runs `f` holding the exclusive lock of the records in `dir` (an advisory
/// lock on `<dir>/.records.lock`, which works across processes and
/// containers sharing the folder). On a node the controller side and the
/// node side are two processes sharing the state directory: the controller
/// side deletes a record under this lock, and the node side rewrites one
/// (a publication added or removed) under it only when the record is still
/// there, so that a late NodeUnpublishVolume never brings back a volume
/// that DeleteVolume removed.
pub(crate) fn with_records_lock<T>(
    dir: &Path,
    f: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    let path = dir.join(RECORDS_LOCK);
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    file.lock()
        .map_err(|e| Error::io(format!("locking {}", path.display()), e))?;
    // Unlocked when `file` is dropped, after `f`.
    f()
}

/// Rewrites the record of `record.id` under [`with_records_lock`] when it
/// still exists; returns whether it did.
pub(crate) fn rewrite_existing_volume_record(
    volumes_dir: &Path,
    record: &VolumeRecord,
) -> Result<bool, Error> {
    with_records_lock(volumes_dir, || {
        let path = record_path(volumes_dir, &record.id);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => write_json_atomic(&path, record).map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(format!("inspecting {}", path.display()), e)),
        }
    })
}

/// Removes `path` if it exists.
pub(crate) fn remove_file_if_exists(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
    }
}

/// Removes the directory tree `path` if it exists (symlinks inside are
/// removed, not followed).
pub(crate) fn remove_tree_if_exists(path: &Path) -> Result<(), Error> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
    }
}

/// Prepares `dir` (the `volumes` or `snapshots` folder): creates it, removes
/// temporary files and data directories that have no record (leftovers of a
/// crash between creating the data and committing the record, or between
/// removing the record and removing the data), and recreates a missing data
/// directory for a record (logged: its data is gone). Returns the names of
/// removed leftovers.
pub(crate) fn clean_dir(dir: &Path, ids: &[&str]) -> Result<Vec<String>, Error> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let mut removed = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let file_type = entry
            .file_type()
            .map_err(|e| Error::io(format!("inspecting {}", path.display()), e))?;
        let leftover = if name.starts_with(TEMP_PREFIX) {
            true
        } else if file_type.is_dir() {
            !ids.contains(&name.as_str())
        } else {
            false
        };
        if leftover {
            if file_type.is_dir() {
                remove_tree_if_exists(&path)?;
            } else {
                remove_file_if_exists(&path)?;
            }
            removed.push(name);
        }
    }
    for id in ids {
        let data = dir.join(id);
        if !data.is_dir() {
            tracing::warn!(path = %data.display(), "data directory of a record is missing; recreating it empty");
            crate::fsops::create_data_dir(&data)?;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> VolumeRecord {
        VolumeRecord {
            name: format!("name-{id}"),
            id: id.to_owned(),
            capacity_bytes: 1024,
            limit_bytes: 2048,
            parameters: BTreeMap::from([("kind".to_owned(), "fast".to_owned())]),
            access_type: AccessType::Mount,
            content_source: Some(ContentSource::Snapshot {
                id: "snap".to_owned(),
            }),
            accessible_topology: vec![BTreeMap::from([(
                crate::TOPOLOGY_KEY.to_owned(),
                "n1".to_owned(),
            )])],
            kind: "fast".to_owned(),
            creation_time: Timestamp {
                seconds: 5,
                nanos: 6,
            },
            published: BTreeMap::from([(
                "/pods/a/mount".to_owned(),
                Publication {
                    access_mode: AccessMode::SingleNodeSingleWriter,
                    readonly: false,
                },
            )]),
        }
    }

    #[test]
    fn records_round_trip_sorted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vols = dir.path().join(VOLUMES_DIR);
        std::fs::create_dir_all(&vols).expect("mkdir");
        for id in ["b", "a", "c"] {
            write_json_atomic(&record_path(&vols, id), &record(id)).expect("write");
        }
        let got = backend_volumes(dir.path()).expect("read");
        let ids: Vec<_> = got.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(got[0], record("a"));
        assert!(backend_snapshots(dir.path()).expect("none").is_empty());
    }

    #[test]
    fn publications_are_optional_in_a_record() {
        let mut unpublished = record("a");
        unpublished.published.clear();
        let json = serde_json::to_value(&unpublished).expect("json");
        assert!(json.get("published").is_none(), "{json}");
        // Records written before publications were kept still load.
        let back: VolumeRecord = serde_json::from_value(json).expect("load");
        assert_eq!(back, unpublished);
        let json = serde_json::to_value(record("b")).expect("json");
        assert_eq!(
            json["published"]["/pods/a/mount"],
            serde_json::json!({"access_mode": "SINGLE_NODE_SINGLE_WRITER", "readonly": false})
        );
    }

    #[test]
    fn corrupt_or_misnamed_record_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vols = dir.path().join(VOLUMES_DIR);
        std::fs::create_dir_all(&vols).expect("mkdir");
        std::fs::write(record_path(&vols, "x"), b"{not json").expect("write");
        assert!(matches!(
            backend_volumes(dir.path()),
            Err(Error::Record { .. })
        ));
        std::fs::remove_file(record_path(&vols, "x")).expect("rm");
        write_json_atomic(&record_path(&vols, "y"), &record("z")).expect("write");
        assert!(matches!(backend_volumes(dir.path()), Err(Error::Config(_))));
    }

    #[test]
    fn clean_dir_removes_leftovers_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vols = dir.path().join(VOLUMES_DIR);
        std::fs::create_dir_all(vols.join("kept")).expect("mkdir");
        std::fs::write(vols.join("kept").join("f"), b"data").expect("write");
        std::fs::create_dir_all(vols.join("orphan")).expect("mkdir");
        std::fs::write(vols.join(".tmpabc"), b"partial").expect("write");
        std::fs::write(record_path(&vols, "kept"), b"{}").expect("write");
        let mut removed = clean_dir(&vols, &["kept", "lost"]).expect("clean");
        removed.sort();
        assert_eq!(removed, [".tmpabc", "orphan"]);
        assert!(vols.join("kept").join("f").exists());
        assert!(vols.join("lost").is_dir());
        assert!(record_path(&vols, "kept").exists());
    }
}
