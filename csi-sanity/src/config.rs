//! What the suite runs against and with which inputs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default size of the volumes the suite creates.
pub const DEFAULT_TEST_VOLUME_SIZE: i64 = 10 << 20;

/// Default time one check may take before it is failed and aborted.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// Default time to wait for the driver's socket to accept a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Access type of the volume capability the suite requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessType {
    #[default]
    Mount,
    Block,
}

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Socket of the node (and identity) service; also the controller's
    /// unless `controller_endpoint` is set.
    pub endpoint: PathBuf,
    /// Socket of the controller service when it differs from `endpoint`.
    pub controller_endpoint: Option<PathBuf>,
    /// Bytes requested for test volumes.
    pub test_volume_size: i64,
    /// Bytes asked for when expanding; `None` means twice the volume size.
    pub test_volume_expand_size: Option<i64>,
    pub test_volume_parameters: HashMap<String, String>,
    pub test_snapshot_parameters: HashMap<String, String>,
    pub access_type: AccessType,
    pub secrets: Secrets,
    /// Only checks whose names match run.
    pub focus: Option<regex::Regex>,
    /// Checks whose names match are skipped.
    pub skip: Option<regex::Regex>,
    /// Where to write a JUnit XML report.
    pub junit: Option<PathBuf>,
    /// Parent directory of the target paths for NodePublishVolume; a fresh
    /// temporary directory when `None`.
    pub mount_dir: Option<PathBuf>,
    /// Parent directory of the staging paths for NodeStageVolume; a fresh
    /// temporary directory when `None`.
    pub staging_dir: Option<PathBuf>,
    pub check_timeout: Duration,
    pub connect_timeout: Duration,
}

impl Config {
    /// A configuration with defaults for everything but the socket.
    pub fn new(endpoint: impl Into<PathBuf>) -> Self {
        Self {
            endpoint: endpoint.into(),
            controller_endpoint: None,
            test_volume_size: DEFAULT_TEST_VOLUME_SIZE,
            test_volume_expand_size: None,
            test_volume_parameters: HashMap::new(),
            test_snapshot_parameters: HashMap::new(),
            access_type: AccessType::Mount,
            secrets: Secrets::default(),
            focus: None,
            skip: None,
            junit: None,
            mount_dir: None,
            staging_dir: None,
            check_timeout: DEFAULT_CHECK_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Whether a check of this name is selected by `focus` and `skip`.
    pub fn selects(&self, name: &str) -> bool {
        self.focus.as_ref().is_none_or(|f| f.is_match(name))
            && !self.skip.as_ref().is_some_and(|s| s.is_match(name))
    }

    /// The size used for expansion checks.
    pub fn expand_size(&self) -> i64 {
        self.test_volume_expand_size
            .unwrap_or_else(|| self.test_volume_size.saturating_mul(2))
    }
}

/// Secrets passed with each request, in the shape of the upstream tool's
/// `--csi.secrets` YAML file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct Secrets {
    #[serde(default)]
    pub create_volume_secret: HashMap<String, String>,
    #[serde(default)]
    pub delete_volume_secret: HashMap<String, String>,
    #[serde(default)]
    pub controller_publish_volume_secret: HashMap<String, String>,
    #[serde(default)]
    pub controller_unpublish_volume_secret: HashMap<String, String>,
    #[serde(default)]
    pub controller_validate_volume_capabilities_secret: HashMap<String, String>,
    #[serde(default)]
    pub node_stage_volume_secret: HashMap<String, String>,
    #[serde(default)]
    pub node_publish_volume_secret: HashMap<String, String>,
    #[serde(default)]
    pub create_snapshot_secret: HashMap<String, String>,
    #[serde(default)]
    pub delete_snapshot_secret: HashMap<String, String>,
    #[serde(default)]
    pub controller_expand_volume_secret: HashMap<String, String>,
    #[serde(default)]
    pub list_snapshots_secret: HashMap<String, String>,
    /// Keys this suite does not use (reported as a warning, not an error,
    /// so files written for newer upstream versions still load).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_yaml_ng::Value>,
}

/// A YAML input file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid YAML of the expected shape: {source}")]
    Parse {
        path: PathBuf,
        source: serde_yaml_ng::Error,
    },
}

impl Secrets {
    /// Parses the upstream secrets file format.
    pub fn from_yaml(text: &str) -> Result<Self, serde_yaml_ng::Error> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let secrets: Self = serde_yaml_ng::from_str(text)?;
        Ok(secrets)
    }

    pub fn load(path: &Path) -> Result<Self, FileError> {
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text).map_err(|source| FileError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

/// Loads a YAML map of string to string (volume or snapshot parameters).
pub fn load_parameters(path: &Path) -> Result<HashMap<String, String>, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_owned(),
        source,
    })?;
    if text.trim().is_empty() {
        return Ok(HashMap::new());
    }
    serde_yaml_ng::from_str(&text).map_err(|source| FileError::Parse {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_upstream_shape() {
        let yaml = "CreateVolumeSecret:\n  user: admin\n  password: \"123\"\n\
                    DeleteVolumeSecret:\n  user: admin\n\
                    ListSnapshotsSecret: {}\n\
                    NodeExpandVolumeSecret:\n  a: b\n";
        let s = Secrets::from_yaml(yaml).expect("parse");
        assert_eq!(
            s.create_volume_secret.get("user").map(String::as_str),
            Some("admin")
        );
        assert_eq!(
            s.create_volume_secret.get("password").map(String::as_str),
            Some("123")
        );
        assert_eq!(s.delete_volume_secret.len(), 1);
        assert!(s.node_publish_volume_secret.is_empty());
        assert_eq!(
            s.unknown.keys().collect::<Vec<_>>(),
            ["NodeExpandVolumeSecret"]
        );
        assert_eq!(
            Secrets::from_yaml("  \n").expect("empty"),
            Secrets::default()
        );
        // Unquoted scalars are strings too, as in Kubernetes Secret data.
        let s = Secrets::from_yaml("NodePublishVolumeSecret:\n  port: 3260\n  tls: true\n")
            .expect("scalars");
        assert_eq!(
            s.node_publish_volume_secret.get("port").map(String::as_str),
            Some("3260")
        );
        assert_eq!(
            s.node_publish_volume_secret.get("tls").map(String::as_str),
            Some("true")
        );
        assert!(Secrets::from_yaml("CreateVolumeSecret: [1, 2]").is_err());
    }

    #[test]
    fn selection() {
        let mut c = Config::new("/tmp/x.sock");
        assert!(c.selects("Identity Service Probe"));
        c.focus = regex::Regex::new("Controller").ok();
        c.skip = regex::Regex::new("ListVolumes").ok();
        assert!(!c.selects("Identity Service Probe"));
        assert!(c.selects("Controller Service CreateVolume x"));
        assert!(!c.selects("Controller Service ListVolumes x"));
        assert_eq!(c.expand_size(), 2 * DEFAULT_TEST_VOLUME_SIZE);
    }
}
