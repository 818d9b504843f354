//! The command line: the upstream csi-provisioner's flags with the same names,
//! types and defaults (`reference/upstream-flags.md`), Go-style durations and
//! booleans, and the Kubernetes `--feature-gates` syntax.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

use crate::duration::parse_go_duration;
use crate::features::{Feature, FeatureGateError, FeatureGates, parse_go_bool};

const ABOUT: &str = "Kubernetes CSI external-provisioner sidecar: provisions and deletes \
PersistentVolumes for PersistentVolumeClaims by calling CreateVolume and DeleteVolume on the \
CSI driver next to it. A drop-in replacement for kubernetes-csi/external-provisioner.";

fn go_bool(value: &str) -> Result<bool, String> {
    parse_go_bool(value).ok_or_else(|| {
        format!("strconv.ParseBool: parsing {value:?}: invalid syntax (use true or false)")
    })
}

fn go_duration(value: &str) -> Result<Duration, String> {
    parse_go_duration(value).map_err(|e| e.to_string())
}

fn feature_gates(value: &str) -> Result<String, String> {
    // Validated here so a bad gate is a flag error naming the gate; applied in
    // order (values merge) after parsing.
    FeatureGates::default()
        .apply(value)
        .map(|()| value.to_owned())
        .map_err(|e: FeatureGateError| e.to_string())
}

fn label_list(value: &str) -> Result<Vec<(String, String)>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once(':')
                .ok_or_else(|| format!("{pair:?} is not in the form key:value"))?;
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() {
                return Err(format!("{pair:?} has an empty key"));
            }
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Parsed and validated command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "csi-provisioner",
    about = ABOUT,
    disable_version_flag = true,
    term_width = 100,
    after_help = "Durations use Go syntax (15s, 1m30s, 1h). Booleans: --flag, --flag=true, --flag=false. \
Single-dash spellings (-csi-address=...) are accepted like Go flags."
)]
pub struct Options {
    /// The gRPC endpoint for the target CSI volume driver (a unix socket: /path, unix:/path or unix:///path).
    #[arg(long, default_value = "/run/csi/socket", value_name = "PATH")]
    pub csi_address: String,

    /// Absolute path to the kubeconfig file. Required only when running out of cluster. A set KUBECONFIG environment variable takes precedence, as upstream.
    #[arg(long, default_value = "", value_name = "PATH")]
    pub kubeconfig: String,

    /// Address of the Kubernetes API server (overrides any value in the kubeconfig). Only required when out of cluster.
    #[arg(long, default_value = "", value_name = "URL")]
    pub master: String,

    /// Show version and exit.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub version: bool,

    /// Timeout for waiting for each CSI call (creation, deletion, capacity).
    #[arg(long, default_value = "10s", value_parser = go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// Initial retry interval of a failed provisioning or deletion. It doubles with each failure, up to --retry-interval-max.
    #[arg(long, default_value = "1s", value_parser = go_duration, value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Maximum retry interval of a failed provisioning or deletion.
    #[arg(long, default_value = "5m", value_parser = go_duration, value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// Number of provisioner worker threads, in other words the number of simultaneous CSI calls.
    #[arg(long, default_value_t = 100, value_name = "UINT")]
    pub worker_threads: u32,

    /// QPS to use while communicating with the Kubernetes API server.
    #[arg(long, default_value_t = 5.0, value_name = "FLOAT")]
    pub kube_api_qps: f32,

    /// Burst to use while communicating with the Kubernetes API server.
    #[arg(long, default_value_t = 10, value_name = "INT")]
    pub kube_api_burst: i32,

    /// Prefix to apply to the name of a created volume.
    #[arg(long, default_value = "pvc", value_name = "STRING")]
    pub volume_name_prefix: String,

    /// Truncates the generated uuid of a created volume to this length. -1 means no truncation.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_name = "INT")]
    pub volume_name_uuid_length: i32,

    /// The default filesystem type of the volume to provision when fstype is unspecified in the StorageClass. If empty, no fsType is passed to the driver.
    #[arg(long, default_value = "", value_name = "STRING")]
    pub default_fstype: String,

    /// If set, add PV/PVC metadata (csi.storage.k8s.io/pvc/name, pvc/namespace, pv/name) to the parameters of CreateVolume.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub extra_create_metadata: bool,

    /// Late binding: pass only the selected node's topology to CreateVolume, in requisite and preferred.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub strict_topology: bool,

    /// Immediate binding: pass the aggregated cluster topologies as requisite and preferred (true) or no topology at all (false).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, value_name = "BOOL")]
    pub immediate_topology: bool,

    /// A set of key=value pairs that describe feature gates for alpha/experimental features. Options are: HonorPVReclaimPolicy=true|false (default true), PVCProtection=true|false (ALPHA, default false), StatefulSetAutoDeletePVC=true|false (ALPHA, default false), PVReleaser=true|false (ALPHA, default false; needs --controller-id), Topology=true|false (default true), VolumeAttributesClass=true|false (default true), CrossNamespaceVolumeDataSource=true|false (ALPHA, default false), ReleaseLeaderElectionOnExit=true|false (ALPHA, default false), AllAlpha=true|false, AllBeta=true|false.
    #[arg(long, value_parser = feature_gates, value_name = "NAME=BOOL,...")]
    pub feature_gates: Vec<String>,

    /// Enables leader election. Only one replica is then active at a time, elected through a coordination.k8s.io Lease.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub leader_election: bool,

    /// Namespace where the leader election Lease is created. Defaults to the pod namespace if not set.
    #[arg(long, default_value = "", value_name = "NAMESPACE")]
    pub leader_election_namespace: String,

    /// Duration that non-leader candidates will wait to force acquire leadership.
    #[arg(long, default_value = "15s", value_parser = go_duration, value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,

    /// Duration that the acting leader will retry refreshing leadership before giving up.
    #[arg(long, default_value = "10s", value_parser = go_duration, value_name = "DURATION")]
    pub leader_election_renew_deadline: Duration,

    /// Duration the leader election clients should wait between tries of actions.
    #[arg(long, default_value = "5s", value_parser = go_duration, value_name = "DURATION")]
    pub leader_election_retry_period: Duration,

    /// List of labels to add to the leader election Lease, in the form key:value,key:value.
    #[arg(long, value_parser = label_list, value_name = "KEY:VALUE,...")]
    pub leader_election_labels: Vec<Vec<(String, String)>>,

    /// The TCP network address where the HTTP server for diagnostics, including metrics and the leader election health check, listens (example: `:8080`). Disabled when empty. Exclusive with --metrics-address.
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub http_endpoint: String,

    /// (deprecated) The TCP network address where the Prometheus metrics endpoint listens (example: `:8080`). Disabled when empty. Exclusive with --http-endpoint.
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub metrics_address: String,

    /// The HTTP path where Prometheus metrics are exposed.
    #[arg(long, default_value = "/metrics", value_name = "PATH")]
    pub metrics_path: String,

    /// Enable pprof profiling on the TCP network address given by --http-endpoint.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub enable_pprof: bool,

    /// Enables producing CSIStorageCapacity objects with capacity information from the driver's GetCapacity call.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub enable_capacity: bool,

    /// The controller of CSIStorageCapacity objects: 0 the pod (POD_NAME/NAMESPACE env), 1 its StatefulSet or DaemonSet, 2 the Deployment, -1 no owner.
    #[arg(
        long,
        default_value_t = 1,
        allow_negative_numbers = true,
        value_name = "INT"
    )]
    pub capacity_ownerref_level: i32,

    /// Number of simultaneously running threads handling CSIStorageCapacity objects.
    #[arg(long, default_value_t = 1, value_name = "UINT")]
    pub capacity_threads: u32,

    /// How long the provisioner waits before polling for storage capacity again.
    #[arg(long, default_value = "1m", value_parser = go_duration, value_name = "DURATION")]
    pub capacity_poll_interval: Duration,

    /// Enables producing capacity information for storage classes with immediate binding. Not needed for the Kubernetes scheduler, maybe useful for other consumers or for debugging.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub capacity_for_immediate_binding: bool,

    /// QPS to use for storage capacity updates while communicating with the Kubernetes API server.
    #[arg(long, default_value_t = 1.0, value_name = "FLOAT")]
    pub kube_api_capacity_qps: f32,

    /// Burst to use for storage capacity updates while communicating with the Kubernetes API server.
    #[arg(long, default_value_t = 5, value_name = "INT")]
    pub kube_api_capacity_burst: i32,

    /// Enables deploying the sidecar controller together with a CSI driver on nodes to manage node-local volumes (NODE_NAME env names the node).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub node_deployment: bool,

    /// Determines whether immediate binding is supported when deployed on each node.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, value_name = "BOOL")]
    pub node_deployment_immediate_binding: bool,

    /// Determines how long the external-provisioner sleeps initially before trying to own a PVC with immediate binding.
    #[arg(long, default_value = "20s", value_parser = go_duration, value_name = "DURATION")]
    pub node_deployment_base_delay: Duration,

    /// Determines how long the external-provisioner sleeps at most before trying to own a PVC with immediate binding.
    #[arg(long, default_value = "60s", value_parser = go_duration, value_name = "DURATION")]
    pub node_deployment_max_delay: Duration,

    /// Enables the readOnly field of PV CSI sources when the PVC access mode is ReadOnlyMany only.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub controller_publish_readonly: bool,

    /// Prevents an unauthorised user from changing the volume mode when restoring a VolumeSnapshot, unless the VolumeSnapshotContent allows it.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, value_name = "BOOL")]
    pub prevent_volume_mode_conversion: bool,

    /// Number of simultaneously running threads handling the cloning-protection finalizer of clone sources.
    #[arg(long, default_value_t = 1, value_name = "UINT")]
    pub cloning_protection_threads: u32,

    /// How often to sweep for VolumeSnapshots stuck with the volumesnapshot-as-source-protection finalizer. 0 disables the sweep.
    #[arg(long, default_value = "5m", value_parser = go_duration, value_name = "DURATION")]
    pub snapshot_orphan_sweep_interval: Duration,

    /// Go runtime tuning of the upstream sidecar (GOMAXPROCS from the CPU quota). Accepted for compatibility; the Rust runtime sizes its worker threads from the CPUs available.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub automaxprocs: bool,

    /// PV releaser: the controller id whose PVs this sidecar releases (needed with --feature-gates=PVReleaser=true).
    #[arg(long, default_value = "", value_name = "ID")]
    pub controller_id: String,

    /// PV releaser: do not label PVs of PVCs labelled dynamic-pvc-provisioner.kubernetes.io/managed-by=<controller id>.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub disable_automatic_association: bool,

    /// PV releaser: how often every PV is re-examined, besides watch events.
    #[arg(long, default_value = "1m", value_parser = go_duration, value_name = "DURATION")]
    pub releaser_resync_period: Duration,

    /// Log verbosity, as klog's -v: 0-1 info, 2-4 debug, 5 and above trace. RUST_LOG, when set, takes precedence.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: u8,

    #[arg(skip)]
    gates: FeatureGates,

    #[arg(skip)]
    explicitly_set: Vec<String>,
}

/// Why the command line was refused. Exit code 2, as Go's flag package.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Help, or a clap parse error (already formatted by clap).
    #[error("{0}")]
    Clap(#[from] clap::Error),
    #[error("invalid argument {value:?} for \"--{flag}\" flag: {reason}")]
    Invalid {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("{0}")]
    Conflict(String),
}

/// Flags that are parsed and validated but whose behaviour has not been
/// built yet. Each one that is set on the command line is reported once at
/// start-up, so nobody believes a setting took effect when it did not.
pub const NOT_YET_IMPLEMENTED: &[&str] = &[
    "cloning-protection-threads",
    "snapshot-orphan-sweep-interval",
];

impl Options {
    /// Parses `args` (including the program name) like the Go sidecar would.
    pub fn parse_from_args<I, T>(args: I) -> Result<Options, CliError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let args = normalize_go_flags(args);
        let matches = Options::command().try_get_matches_from(args)?;
        let mut options = Options::from_arg_matches(&matches)?;
        options.explicitly_set = Options::command()
            .get_arguments()
            .filter(|a| matches.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine))
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        for spec in &options.feature_gates {
            options.gates.apply(spec).map_err(|e| CliError::Invalid {
                flag: "feature-gates",
                value: spec.clone(),
                reason: e.to_string(),
            })?;
        }
        options.validate()?;
        Ok(options)
    }

    fn validate(&self) -> Result<(), CliError> {
        if !self.http_endpoint.is_empty() && !self.metrics_address.is_empty() {
            return Err(CliError::Conflict(
                "only one of `--metrics-address` and `--http-endpoint` can be set".into(),
            ));
        }
        // client-go refuses a positive QPS without a burst ("burst is
        // required to be greater than 0 when RateLimiter is not set and QPS
        // is set to greater than 0").
        for (qps_flag, qps, burst_flag, burst) in [
            (
                "kube-api-qps",
                self.kube_api_qps,
                "kube-api-burst",
                self.kube_api_burst,
            ),
            (
                "kube-api-capacity-qps",
                self.kube_api_capacity_qps,
                "kube-api-capacity-burst",
                self.kube_api_capacity_burst,
            ),
        ] {
            if qps > 0.0 && burst <= 0 {
                return Err(CliError::Conflict(format!(
                    "--{burst_flag} ({burst}) must be greater than 0 when --{qps_flag} ({qps}) is greater than 0"
                )));
            }
        }
        if self.enable_pprof {
            return Err(CliError::Invalid {
                flag: "enable-pprof",
                value: "true".into(),
                reason: "Go's pprof profiler does not exist in this Rust build; remove the flag \
(profile the process from outside instead, e.g. with perf)"
                    .into(),
            });
        }
        if self.volume_name_uuid_length < -1 {
            return Err(CliError::Invalid {
                flag: "volume-name-uuid-length",
                value: self.volume_name_uuid_length.to_string(),
                reason: "must be -1 (no truncation) or a length".into(),
            });
        }
        if self.volume_name_prefix.is_empty() {
            return Err(CliError::Invalid {
                flag: "volume-name-prefix",
                value: String::new(),
                reason: "must not be empty".into(),
            });
        }
        if self.worker_threads == 0 {
            return Err(CliError::Invalid {
                flag: "worker-threads",
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        if self.retry_interval_start > self.retry_interval_max {
            return Err(CliError::Conflict(format!(
                "--retry-interval-start ({}) must not exceed --retry-interval-max ({})",
                crate::duration::format_go_duration(self.retry_interval_start),
                crate::duration::format_go_duration(self.retry_interval_max)
            )));
        }
        if self.capacity_threads == 0 {
            return Err(CliError::Invalid {
                flag: "capacity-threads",
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        if self.capacity_poll_interval.is_zero() {
            return Err(CliError::Invalid {
                flag: "capacity-poll-interval",
                value: "0s".into(),
                reason: "must be greater than zero".into(),
            });
        }
        if self.capacity_ownerref_level < -1 {
            return Err(CliError::Invalid {
                flag: "capacity-ownerref-level",
                value: self.capacity_ownerref_level.to_string(),
                reason: "must be -1 (no owner) or a level >= 0".into(),
            });
        }
        if self.timeout.is_zero() {
            return Err(CliError::Invalid {
                flag: "timeout",
                value: "0s".into(),
                reason: "must be greater than zero".into(),
            });
        }
        if self.gates.enabled(Feature::PVReleaser) && self.controller_id.is_empty() {
            return Err(CliError::Conflict(
                "--feature-gates=PVReleaser=true needs --controller-id".into(),
            ));
        }
        if self.leader_election
            && self.leader_election_renew_deadline >= self.leader_election_lease_duration
        {
            return Err(CliError::Conflict(
                "--leader-election-renew-deadline must be shorter than --leader-election-lease-duration".into(),
            ));
        }
        // client-go refuses the same: a renew deadline within one jittered
        // retry period leaves no second renewal attempt.
        if self.leader_election
            && self.leader_election_renew_deadline <= self.leader_election_retry_period.mul_f64(1.2)
        {
            return Err(CliError::Conflict(
                "--leader-election-renew-deadline must be longer than 1.2 × --leader-election-retry-period".into(),
            ));
        }
        csi_proto::transport::parse_unix_address(&self.csi_address).map_err(|e| {
            CliError::Invalid {
                flag: "csi-address",
                value: self.csi_address.clone(),
                reason: e.to_string(),
            }
        })?;
        Ok(())
    }

    /// The client-side rate limits (validated: a positive rate has a
    /// positive burst).
    pub fn rate_limits(&self) -> crate::ratelimit::Limits {
        crate::ratelimit::Limits {
            qps: self.kube_api_qps,
            burst: u32::try_from(self.kube_api_burst).unwrap_or(0),
            capacity_qps: self.kube_api_capacity_qps,
            capacity_burst: u32::try_from(self.kube_api_capacity_burst).unwrap_or(0),
        }
    }

    pub fn gates(&self) -> &FeatureGates {
        &self.gates
    }

    /// Long names of the flags given on the command line.
    pub fn explicitly_set(&self) -> &[String] {
        &self.explicitly_set
    }

    /// Flags set on the command line whose behaviour is not built yet.
    pub fn set_but_not_implemented(&self) -> Vec<&str> {
        NOT_YET_IMPLEMENTED
            .iter()
            .copied()
            .filter(|f| self.explicitly_set.iter().any(|s| s == f))
            .collect()
    }

    /// The socket path of `--csi-address` (validated at parse time).
    pub fn csi_socket(&self) -> PathBuf {
        csi_proto::transport::parse_unix_address(&self.csi_address)
            .unwrap_or_else(|_| PathBuf::from(&self.csi_address))
    }

    /// The tracing filter directives for `-v`: our own logs follow the
    /// level, libraries (HTTP, gRPC) stay at info until the highest levels,
    /// as klog's verbosity only affects the sidecar's own messages.
    pub fn log_filter(&self) -> String {
        match self.verbosity {
            0..=1 => "info".to_owned(),
            2..=4 => "info,csi_provisioner=debug".to_owned(),
            5..=7 => "info,csi_provisioner=trace".to_owned(),
            _ => "debug,csi_provisioner=trace".to_owned(),
        }
    }

    /// The level of our own logs for `-v`.
    pub fn log_level(&self) -> tracing::Level {
        match self.verbosity {
            0..=1 => tracing::Level::INFO,
            2..=4 => tracing::Level::DEBUG,
            _ => tracing::Level::TRACE,
        }
    }
}

/// Go's flag package accepts `-name=value` as well as `--name=value`; clap
/// reads a single dash as a cluster of short flags. Rewrite single-dash long
/// names (more than one character before any `=`) to double-dash. `-v=5` and
/// `-v 5` stay as they are: `v` is our one short flag.
fn normalize_go_flags(args: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    let mut only_values = false;
    for (i, arg) in args.into_iter().enumerate() {
        if i == 0 || only_values {
            out.push(arg);
            continue;
        }
        let rewritten = arg.to_str().and_then(|s| {
            if s == "--" {
                return None;
            }
            let rest = s.strip_prefix('-')?;
            if rest.starts_with('-') {
                return None;
            }
            let name = rest.split('=').next().unwrap_or(rest);
            (name.len() > 1 && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic()))
                .then(|| OsString::from(format!("-{s}")))
        });
        if arg.to_str() == Some("--") {
            only_values = true;
        }
        out.push(rewritten.unwrap_or(arg));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, CliError> {
        Options::parse_from_args(std::iter::once("csi-provisioner").chain(args.iter().copied()))
    }

    fn ok(args: &[&str]) -> Options {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn defaults_match_upstream() {
        let o = ok(&[]);
        assert_eq!(o.csi_address, "/run/csi/socket");
        assert_eq!(o.kubeconfig, "");
        assert_eq!(o.master, "");
        assert!(!o.version);
        assert_eq!(o.timeout, secs(10));
        assert_eq!(o.retry_interval_start, secs(1));
        assert_eq!(o.retry_interval_max, secs(300));
        assert_eq!(o.worker_threads, 100);
        assert_eq!(o.kube_api_qps, 5.0);
        assert_eq!(o.kube_api_burst, 10);
        assert_eq!(o.volume_name_prefix, "pvc");
        assert_eq!(o.volume_name_uuid_length, -1);
        assert_eq!(o.default_fstype, "");
        assert!(!o.extra_create_metadata);
        assert!(!o.strict_topology);
        assert!(o.immediate_topology);
        assert!(!o.leader_election);
        assert_eq!(o.leader_election_namespace, "");
        assert_eq!(o.leader_election_lease_duration, secs(15));
        assert_eq!(o.leader_election_renew_deadline, secs(10));
        assert_eq!(o.leader_election_retry_period, secs(5));
        assert!(o.leader_election_labels.is_empty());
        assert_eq!(o.http_endpoint, "");
        assert_eq!(o.metrics_address, "");
        assert_eq!(o.metrics_path, "/metrics");
        assert!(!o.enable_pprof);
        assert!(!o.enable_capacity);
        assert_eq!(o.capacity_ownerref_level, 1);
        assert_eq!(o.capacity_threads, 1);
        assert_eq!(o.capacity_poll_interval, secs(60));
        assert!(!o.capacity_for_immediate_binding);
        assert_eq!(o.kube_api_capacity_qps, 1.0);
        assert_eq!(o.kube_api_capacity_burst, 5);
        assert!(!o.node_deployment);
        assert!(o.node_deployment_immediate_binding);
        assert_eq!(o.node_deployment_base_delay, secs(20));
        assert_eq!(o.node_deployment_max_delay, secs(60));
        assert!(!o.controller_publish_readonly);
        assert!(o.prevent_volume_mode_conversion);
        assert_eq!(o.cloning_protection_threads, 1);
        assert_eq!(o.snapshot_orphan_sweep_interval, secs(300));
        assert!(!o.automaxprocs);
        assert_eq!(o.verbosity, 0);
        assert_eq!(o.gates(), &FeatureGates::default());
        assert!(o.explicitly_set().is_empty());
    }

    #[test]
    fn every_upstream_flag_is_accepted() {
        let o = ok(&[
            "--csi-address=unix:///csi/csi.sock",
            "--kubeconfig=/k",
            "--master=http://127.0.0.1:1",
            "--timeout=1m30s",
            "--retry-interval-start=2s",
            "--retry-interval-max=10m",
            "--worker-threads=4",
            "--kube-api-qps=50.5",
            "--kube-api-burst=100",
            "--volume-name-prefix=vol",
            "--volume-name-uuid-length=16",
            "--default-fstype=ext4",
            "--extra-create-metadata",
            "--strict-topology=true",
            "--immediate-topology=false",
            "--feature-gates=PVCProtection=true",
            "--leader-election",
            "--leader-election-namespace=kube-system",
            "--leader-election-lease-duration=30s",
            "--leader-election-renew-deadline=20s",
            "--leader-election-retry-period=3s",
            "--leader-election-labels=a:b,c:d",
            "--http-endpoint=:8080",
            "--metrics-path=/m",
            "--enable-pprof=false",
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            "--capacity-threads=2",
            "--capacity-poll-interval=30s",
            "--capacity-for-immediate-binding",
            "--kube-api-capacity-qps=2",
            "--kube-api-capacity-burst=3",
            "--node-deployment",
            "--node-deployment-immediate-binding=false",
            "--node-deployment-base-delay=1s",
            "--node-deployment-max-delay=2s",
            "--controller-publish-readonly",
            "--prevent-volume-mode-conversion=false",
            "--cloning-protection-threads=3",
            "--snapshot-orphan-sweep-interval=0",
            "--automaxprocs",
            "--v=5",
        ]);
        assert_eq!(o.csi_socket(), PathBuf::from("/csi/csi.sock"));
        assert_eq!(o.timeout, secs(90));
        assert_eq!(o.volume_name_uuid_length, 16);
        assert!(o.extra_create_metadata && o.strict_topology && !o.immediate_topology);
        assert!(o.gates().enabled(Feature::PVCProtection));
        assert_eq!(
            o.leader_election_labels,
            vec![vec![
                ("a".to_owned(), "b".to_owned()),
                ("c".to_owned(), "d".to_owned())
            ]]
        );
        assert_eq!(o.capacity_ownerref_level, -1);
        assert_eq!(o.snapshot_orphan_sweep_interval, Duration::ZERO);
        assert_eq!(o.log_level(), tracing::Level::TRACE);
        assert!(
            o.set_but_not_implemented()
                .contains(&"cloning-protection-threads")
        );
        assert!(!o.set_but_not_implemented().contains(&"enable-capacity"));
        assert!(!o.set_but_not_implemented().contains(&"kube-api-qps"));
        assert!(!o.set_but_not_implemented().contains(&"node-deployment"));
        assert!(
            !o.set_but_not_implemented()
                .contains(&"node-deployment-max-delay")
        );
        assert!(!o.set_but_not_implemented().contains(&"worker-threads"));
        assert!(!o.set_but_not_implemented().contains(&"timeout"));
    }

    #[test]
    fn go_spellings_are_accepted() {
        let o = ok(&["-csi-address", "/x.sock", "-leader-election=true", "-v=4"]);
        assert_eq!(o.csi_address, "/x.sock");
        assert!(o.leader_election);
        assert_eq!(o.log_level(), tracing::Level::DEBUG);
        let o = ok(&["-v", "2", "--timeout", "5s", "--extra-create-metadata=1"]);
        assert_eq!(o.verbosity, 2);
        assert_eq!(o.timeout, secs(5));
        assert!(o.extra_create_metadata);
        let o = ok(&["--version"]);
        assert!(o.version);
        assert!(!ok(&["--version=false"]).version);
        // Several --feature-gates merge.
        let o = ok(&[
            "--feature-gates=PVCProtection=true",
            "--feature-gates=HonorPVReclaimPolicy=false",
        ]);
        assert!(o.gates().enabled(Feature::PVCProtection));
        assert!(!o.gates().enabled(Feature::HonorPVReclaimPolicy));
    }

    #[test]
    fn bad_input_is_refused_with_the_flag_named() {
        for (args, needle) in [
            (&["--feature-gates=Bogus=true"][..], "Bogus"),
            (
                &["--feature-gates=PVCProtection=maybe"][..],
                "PVCProtection",
            ),
            (&["--timeout=10"][..], "missing unit"),
            (&["--timeout=ten"][..], "--timeout"),
            (&["--timeout=0s"][..], "timeout"),
            (&["--retry-interval-start=10m"][..], "retry-interval-start"),
            (&["--worker-threads=-1"][..], "worker-threads"),
            (&["--worker-threads=0"][..], "worker-threads"),
            (&["--kube-api-qps=fast"][..], "kube-api-qps"),
            (&["--leader-election=yes"][..], "leader-election"),
            (&["--leader-election-labels=nocolon"][..], "key:value"),
            (
                &["--http-endpoint=:1", "--metrics-address=:2"][..],
                "metrics-address",
            ),
            (
                &["--volume-name-uuid-length=-2"][..],
                "volume-name-uuid-length",
            ),
            (&["--volume-name-prefix="][..], "volume-name-prefix"),
            (&["--csi-address=tcp://1.2.3.4:5"][..], "csi-address"),
            (&["--feature-gates=PVReleaser=true"][..], "controller-id"),
            (
                &["--leader-election", "--leader-election-renew-deadline=20s"][..],
                "renew-deadline",
            ),
            (&["--no-such-flag"][..], "no-such-flag"),
            (&["--kube-api-burst=0"][..], "--kube-api-burst"),
            (&["--enable-pprof"][..], "pprof"),
            (
                &[
                    "--leader-election",
                    "--leader-election-renew-deadline=6s",
                    "--leader-election-retry-period=5s",
                ][..],
                "retry-period",
            ),
            (
                &["--kube-api-capacity-burst=-1"][..],
                "--kube-api-capacity-burst",
            ),
        ] {
            let err = match parse(args) {
                Ok(_) => panic!("{args:?} was accepted"),
                Err(e) => e,
            };
            let text = match &err {
                CliError::Clap(e) => e.render().to_string(),
                other => other.to_string(),
            };
            assert!(text.contains(needle), "{args:?}: {text}");
            if let CliError::Clap(e) = &err {
                assert_eq!(e.exit_code(), 2, "{args:?}");
            }
        }
        // No rate (qps 0 or negative) needs no burst.
        let o = ok(&["--kube-api-qps=-1", "--kube-api-burst=0"]);
        assert_eq!(o.rate_limits().burst, 0);
        assert!(
            ok(&["--feature-gates=PVReleaser=true", "--controller-id=x"])
                .gates()
                .enabled(Feature::PVReleaser)
        );
    }

    #[test]
    fn help_lists_every_upstream_flag() {
        let help = Options::command().render_long_help().to_string();
        for flag in [
            "csi-address",
            "kubeconfig",
            "master",
            "version",
            "timeout",
            "retry-interval-start",
            "retry-interval-max",
            "worker-threads",
            "kube-api-qps",
            "kube-api-burst",
            "volume-name-prefix",
            "volume-name-uuid-length",
            "default-fstype",
            "extra-create-metadata",
            "strict-topology",
            "immediate-topology",
            "feature-gates",
            "leader-election",
            "leader-election-namespace",
            "leader-election-lease-duration",
            "leader-election-renew-deadline",
            "leader-election-retry-period",
            "leader-election-labels",
            "http-endpoint",
            "metrics-address",
            "metrics-path",
            "enable-pprof",
            "enable-capacity",
            "capacity-ownerref-level",
            "capacity-threads",
            "capacity-poll-interval",
            "capacity-for-immediate-binding",
            "kube-api-capacity-qps",
            "kube-api-capacity-burst",
            "node-deployment",
            "node-deployment-immediate-binding",
            "node-deployment-base-delay",
            "node-deployment-max-delay",
            "controller-publish-readonly",
            "prevent-volume-mode-conversion",
            "cloning-protection-threads",
            "snapshot-orphan-sweep-interval",
            "automaxprocs",
        ] {
            assert!(
                help.contains(&format!("--{flag}")),
                "--{flag} missing from --help"
            );
        }
        assert!(help.contains("-v, --v"));
    }

    #[test]
    fn not_yet_implemented_names_real_flags() {
        let cmd = Options::command();
        for name in NOT_YET_IMPLEMENTED {
            assert!(
                cmd.get_arguments().any(|a| a.get_long() == Some(name)),
                "{name} is not a flag"
            );
        }
    }
}
