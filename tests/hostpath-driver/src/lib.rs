//! Hostpath CSI driver: the Identity, Controller and Node services of the
//! CSI spec (v1.12) backed by a plain state directory, with capacity per
//! "kind", topology, snapshots, clones, expansion and file-driven fault
//! injection.
//!
//! It is the target of the CSI sanity suite and of the end-to-end tests of
//! the sidecar, served in-process ([`InProcess`]) or run standalone
//! (`csi-hostpath`, see [`cli`]). A volume is a directory `<state_dir>/volumes/<id>/` plus a JSON
//! record `<state_dir>/volumes/<id>.json` (see [`VolumeRecord`]); snapshots
//! live likewise under `<state_dir>/snapshots/`. Records are written
//! atomically (temporary file + rename), so the state survives a restart or
//! a crash of the driver at any point.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};

pub mod authority;
pub mod cli;
mod controller;
pub mod faults;
mod fsops;
mod identity;
pub mod ids;
mod in_process;
mod locks;
mod node;
pub mod quantity;
pub mod registration;
pub use ids::VolumeIdFormat;
pub use registration::NodeRegistration;
mod state;
mod store;

pub use in_process::InProcess;
pub use state::{Driver, SHUTDOWN_GRACE};
pub use store::{
    AccessMode, AccessType, ContentSource, Publication, SnapshotRecord, Timestamp, VolumeRecord,
    backend_snapshots, backend_volumes, snapshot_path, volume_path,
};

/// Default topology segment key reported for this node (when topology is
/// enabled); `--topology-key` / [`Config::topology_key`] changes it.
pub const TOPOLOGY_KEY: &str = "topology.hostpath.csi/node";

/// Default CSI driver name, as the upstream Go hostpath driver.
pub const DEFAULT_DRIVER_NAME: &str = "hostpath.csi.k8s.io";

/// Size given to a volume whose request has no required bytes (1 GiB,
/// reduced to the limit or the maximum volume size when those are smaller).
pub const DEFAULT_VOLUME_SIZE: u64 = 1 << 30;

/// Default `--max-volume-size` (1 TiB).
pub const DEFAULT_MAX_VOLUME_SIZE: u64 = 1 << 40;

/// StorageClass parameter that selects the capacity pool of a volume.
pub const KIND_PARAMETER: &str = "kind";

/// Everything the driver needs to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Path of the unix socket to serve on.
    pub endpoint: PathBuf,
    /// CSI driver name (`GetPluginInfo`).
    pub driver_name: String,
    /// Node id (`NodeGetInfo`, topology segment value).
    pub node_id: String,
    /// Directory holding volumes and snapshots.
    pub state_dir: PathBuf,
    /// Capacity per kind in bytes; empty means unlimited.
    pub capacity: BTreeMap<String, u64>,
    /// Largest volume the driver creates or expands to, in bytes.
    pub max_volume_size: u64,
    /// Report and honour topology (`topology_key` = node id).
    pub enable_topology: bool,
    /// Topology segment key whose value is the node id, e.g.
    /// `topology.ebs.csi.aws.com/zone` to stand in for another driver
    /// (default [`TOPOLOGY_KEY`]); a Kubernetes label key.
    pub topology_key: String,
    /// Fault injection file (see [`faults`]); an empty path disables it.
    pub faults_file: PathBuf,
    /// `vendor_version` reported by `GetPluginInfo`.
    pub vendor_version: String,
    /// Advertise `PUBLISH_UNPUBLISH_VOLUME` and answer ControllerPublish /
    /// ControllerUnpublish (bookkeeping only: a volume is "attached" to
    /// this driver's node). Off by default: a provisioner next to a driver
    /// that attaches volumes waits for VolumeAttachments to go.
    pub controller_publish: bool,
    /// How volume ids look on the wire (records keep the plain id).
    pub volume_id_format: ids::VolumeIdFormat,
    /// Register with the kubelet's plugin registry (see [`registration`]);
    /// `None`: the driver only serves its CSI socket.
    pub registration: Option<NodeRegistration>,
}

impl Config {
    /// A configuration for tests: socket `dir/csi.sock`, state
    /// `dir/state`, faults file `dir/faults.json`, node id `test-node`,
    /// driver name [`DEFAULT_DRIVER_NAME`], unlimited capacity, maximum
    /// volume size 1 TiB, topology on with [`TOPOLOGY_KEY`].
    pub fn for_tests(dir: &Path) -> Config {
        Config {
            endpoint: dir.join("csi.sock"),
            driver_name: DEFAULT_DRIVER_NAME.to_owned(),
            node_id: "test-node".to_owned(),
            state_dir: dir.join("state"),
            capacity: BTreeMap::new(),
            max_volume_size: DEFAULT_MAX_VOLUME_SIZE,
            enable_topology: true,
            topology_key: TOPOLOGY_KEY.to_owned(),
            faults_file: dir.join("faults.json"),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            controller_publish: false,
            volume_id_format: ids::VolumeIdFormat::Plain,
            registration: None,
        }
    }
}

/// Errors of the driver outside of RPC handling (start-up, configuration,
/// state directory, faults file, quantities).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("record {path}: {source}")]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid endpoint: {0}")]
    Endpoint(#[from] csi_proto::transport::AddressError),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Quantity(#[from] csi_proto::quantity::QuantityError),
    #[error("faults file {path}: {reason}")]
    Faults { path: PathBuf, reason: String },
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("the kubelet refused the registration: {0}")]
    RegistrationRefused(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Binds `config.endpoint` and serves the Identity, Controller and Node
/// services until `shutdown` completes; the socket file is removed on
/// return. Loads existing state from `config.state_dir` first.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let endpoint = config.endpoint.clone();
    let driver = Driver::new(config)?;
    driver.serve_on(&endpoint, shutdown).await
}
