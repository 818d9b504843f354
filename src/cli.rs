//! The command line: the upstream csi-provisioner's flags with the same names,
//! types and defaults (upstream's `--help` is kept in
//! `tests/fixtures/upstream-v6.3-help.txt` and checked), Go-style durations and
//! booleans, and the Kubernetes `--feature-gates` syntax.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

use crate::duration::parse_go_duration;
use crate::features::{Feature, FeatureGateError, FeatureGates, parse_go_bool};
use crate::logging::{LogFormat, LogSettings, VModule, parse_log_format, parse_vmodule};

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

/// component-base's buffer sizes: a quantity of bytes (`512`, `1K`,
/// `2Ki`, `3M`, `5Mi`). Upstream's help writes `1K` for 1000, which
/// apimachinery spells `1k`: both are accepted.
fn byte_quantity(value: &str) -> Result<u64, String> {
    let normalized = match value.strip_suffix('K') {
        Some(number) => format!("{number}k"),
        None => value.to_owned(),
    };
    crate::provision::quantity::parse_bytes(&normalized)
        .map(|bytes| u64::try_from(bytes).unwrap_or(0))
        .map_err(|e| e.to_string())
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

/// The version `--version` prints and the start-up log names: the crate
/// version and the build's commit, `v0.1.0 (git 3dd1527)`, or the crate
/// version alone where the commit is not known (`build.rs`).
pub const VERSION: &str = match option_env!("CSI_PROVISIONER_BUILD_VERSION") {
    Some(version) => version,
    None => concat!("v", env!("CARGO_PKG_VERSION")),
};

/// What `--version` prints, as the Go image (`fmt.Println(os.Args[0],
/// version)`): the name the process was started by, then the version
/// (the Go image's is its `git describe`, ours the crate version and the
/// commit).
pub fn version_line(argv0: &str, version: &str) -> String {
    format!("{argv0} {version}")
}

/// Parsed and validated command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "csi-provisioner",
    about = ABOUT,
    disable_version_flag = true,
    // Go's flag package takes the last of a repeated flag (a kustomize
    // patch that appends an argument relies on it); list flags still add up.
    args_override_self = true,
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

    /// Beyond the Go image: lower the number of CreateVolume and DeleteVolume calls in flight when the driver answers RESOURCE_EXHAUSTED or ABORTED (halved), and raise it again as calls succeed, up to twice --worker-threads (what the claim and volume workers could send). A healthy driver is called as the Go image calls it. The limit is the metric csi_provisioner_driver_concurrency_limit.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, value_name = "BOOL")]
    pub adaptive_concurrency: bool,

    /// If set, add PV/PVC metadata (csi.storage.k8s.io/pvc/name, pvc/namespace, pv/name) to the parameters of CreateVolume.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub extra_create_metadata: bool,

    /// Late binding: pass only the selected node's topology to CreateVolume, in requisite and preferred.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub strict_topology: bool,

    /// Immediate binding: pass the aggregated cluster topologies as requisite and preferred (true) or no topology at all (false).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, value_name = "BOOL")]
    pub immediate_topology: bool,

    /// Beyond the Go image (docs/operations.md, opt-ins): label keys of the claim's namespace whose values are added to the parameters of CreateVolume as csi.storage.k8s.io/namespace/labels/<key> (keys the namespace lacks are left out). The namespace is read live, once per provisioning; needs get on namespaces. Independent of --extra-create-metadata. Comma-separated, repeatable.
    #[arg(long, value_delimiter = ',', value_name = "KEY,...")]
    pub extra_create_metadata_namespace_labels: Vec<String>,

    /// Beyond the Go image (docs/operations.md, opt-ins): as --extra-create-metadata-namespace-labels, for annotation keys, under csi.storage.k8s.io/namespace/annotations/<key>.
    #[arg(long, value_delimiter = ',', value_name = "KEY,...")]
    pub extra_create_metadata_namespace_annotations: Vec<String>,

    /// Beyond the Go image (docs/operations.md, opt-ins): immediate binding aggregates the topology of every key set the nodes registered for the driver (the union), the same for every claim, instead of the keys of one CSINode picked in no particular order.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub immediate_topology_per_key_set: bool,

    /// A set of key=value pairs that describe feature gates for alpha/experimental features. Options are: HonorPVReclaimPolicy=true|false (default true), PVCProtection=true|false (ALPHA, default false), StatefulSetAutoDeletePVC=true|false (ALPHA, default false), PVReleaser=true|false (ALPHA, default false; needs --controller-id), Topology=true|false (default true), VolumeAttributesClass=true|false (default true), CrossNamespaceVolumeDataSource=true|false (ALPHA, default false), ReleaseLeaderElectionOnExit=true|false (ALPHA, default false), PodPVCProvisioner=true|false (ALPHA, default false; needs --controller-id), ClaimMetadataPropagation=true|false (ALPHA, default false), AllAlpha=true|false, AllBeta=true|false.
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

    /// Enable pprof profiling on the TCP network address specified by --http-endpoint. The HTTP path is /debug/pprof/: profile (CPU, ?seconds=N, default 30) and heap (sampled in-use memory), in pprof's format for `go tool pprof`.
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

    /// Beyond the Go image (docs/operations.md, "Orphan audit"): how often the leader audits the driver's volumes (ListVolumes) for ones no PersistentVolume names, and reports them (metric, log, ConfigMap <lease name>-orphan-audit); never deletes. Drivers without LIST_VOLUMES are not audited. 0 turns the audit off.
    #[arg(long, default_value = "6h", value_parser = go_duration, value_name = "DURATION")]
    pub orphan_audit_interval: Duration,

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

    /// Pod/Job PVC provisioner: how often every managed PVC is checked (live) for a pod or Job that is gone, and every annotated pod and Job re-examined; 0 turns the resync off.
    #[arg(long, default_value = "1m", value_parser = go_duration, value_name = "DURATION")]
    pub pvc_provisioner_resync_period: Duration,

    /// Log verbosity, as klog's -v: 0-1 info, 2-4 debug, 5 and above trace. RUST_LOG, when set, takes precedence.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: u8,

    /// Comma-separated list of pattern=N settings for file-filtered logging: the source files whose name (without .rs) matches the pattern (* and ? as wildcards; a pattern with / matches the path) log at verbosity N.
    #[arg(long, default_value = "", value_parser = parse_vmodule, value_name = "PATTERN=N,...", hide_default_value = true)]
    pub vmodule: VModule,

    /// Sets the log format. Permitted formats: "json" (one JSON object per line with klog's keys), "text" (klog's text format). Beyond the Go image: "human" (for reading at a terminal, in color there).
    #[arg(long, default_value = "text", value_parser = parse_log_format, value_name = "FORMAT")]
    pub logging_format: LogFormat,

    /// Maximum time between log flushes. Accepted for compatibility: logs are written unbuffered, so there is nothing to flush.
    #[arg(long, default_value = "5s", value_parser = go_duration, value_name = "DURATION")]
    pub log_flush_frequency: Duration,

    /// In text format (and human), write error messages to stderr and info messages to stdout. The default is to write a single stream to stderr.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub log_text_split_stream: bool,

    /// In JSON format, write error messages to stderr and info messages to stdout. The default is to write a single stream to stderr.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, value_name = "BOOL")]
    pub log_json_split_stream: bool,

    /// In text format with split output streams, how many bytes of info messages may be buffered. Accepted for compatibility; lines are written unbuffered.
    #[arg(long, default_value = "0", value_parser = byte_quantity, value_name = "QUANTITY")]
    pub log_text_info_buffer_size: u64,

    /// In JSON format with split output streams, how many bytes of info messages may be buffered. Accepted for compatibility; lines are written unbuffered.
    #[arg(long, default_value = "0", value_parser = byte_quantity, value_name = "QUANTITY")]
    pub log_json_info_buffer_size: u64,

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

/// Upstream flags that are accepted but have nothing to act on in this
/// build, with the reason named at start-up when one is set.
pub const WITHOUT_EFFECT: &[(&str, &str)] = &[
    (
        "automaxprocs",
        "Go runtime tuning; the Rust runtime sizes its worker threads from the CPUs available",
    ),
    (
        "log-flush-frequency",
        "logs are written unbuffered, line by line",
    ),
    (
        "log-text-info-buffer-size",
        "logs are written unbuffered, line by line",
    ),
    (
        "log-json-info-buffer-size",
        "logs are written unbuffered, line by line",
    ),
    (
        "cloning-protection-threads",
        "the cloning-protection finalizer of a clone source is added and removed by the claim workers (--worker-threads) as part of each clone, not by a separate controller",
    ),
];

/// Flags that are parsed and validated but whose behaviour has not been
/// built yet. Each one that is set on the command line is reported once at
/// start-up, so nobody believes a setting took effect when it did not.
pub const NOT_YET_IMPLEMENTED: &[&str] = &[];

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
                "--feature-gates=PVReleaser=true needs --controller-id (the controller id whose PVs it releases)".into(),
            ));
        }
        if self.gates.enabled(Feature::PodPVCProvisioner) && self.controller_id.is_empty() {
            return Err(CliError::Conflict(
                "--feature-gates=PodPVCProvisioner=true needs --controller-id (the managed-by label of the PVCs it creates)".into(),
            ));
        }
        if self.leader_election
            && self.leader_election_renew_deadline >= self.leader_election_lease_duration
        {
            return Err(CliError::Conflict(format!(
                "--leader-election-renew-deadline ({}) must be shorter than --leader-election-lease-duration ({})",
                crate::duration::format_go_duration(self.leader_election_renew_deadline),
                crate::duration::format_go_duration(self.leader_election_lease_duration)
            )));
        }
        // client-go refuses the same: a renew deadline within one jittered
        // retry period leaves no second renewal attempt.
        if self.leader_election
            && self.leader_election_renew_deadline <= self.leader_election_retry_period.mul_f64(1.2)
        {
            return Err(CliError::Conflict(format!(
                "--leader-election-renew-deadline ({}) must be longer than 1.2 × --leader-election-retry-period ({})",
                crate::duration::format_go_duration(self.leader_election_renew_deadline),
                crate::duration::format_go_duration(self.leader_election_retry_period)
            )));
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

    /// Flags set on the command line that have no effect in this build,
    /// with the reason (named once at start-up). A split-stream or vmodule
    /// flag of the other log format counts too.
    pub fn set_without_effect(&self) -> Vec<(&'static str, &'static str)> {
        let set = |flag: &str| self.explicitly_set.iter().any(|s| s == flag);
        let mut out: Vec<(&'static str, &'static str)> = WITHOUT_EFFECT
            .iter()
            .copied()
            .filter(|(flag, _)| set(flag))
            .collect();
        match self.logging_format {
            LogFormat::Text | LogFormat::Human if set("log-json-split-stream") => {
                out.push((
                    "log-json-split-stream",
                    "it applies to --logging-format=json only",
                ));
            }
            LogFormat::Json if set("log-text-split-stream") => {
                out.push((
                    "log-text-split-stream",
                    "it applies to --logging-format=text and human only",
                ));
            }
            _ => {}
        }
        out
    }

    /// What the logging flags ask for.
    pub fn log_settings(&self) -> LogSettings {
        LogSettings {
            format: self.logging_format,
            verbosity: self.verbosity,
            vmodule: self.vmodule.clone(),
            split_stream: match self.logging_format {
                LogFormat::Text | LogFormat::Human => self.log_text_split_stream,
                LogFormat::Json => self.log_json_split_stream,
            },
        }
    }

    /// The socket path of `--csi-address` (validated at parse time).
    pub fn csi_socket(&self) -> PathBuf {
        csi_proto::transport::parse_unix_address(&self.csi_address)
            .unwrap_or_else(|_| PathBuf::from(&self.csi_address))
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
        assert!(o.set_but_not_implemented().is_empty());
        assert!(
            o.set_without_effect()
                .iter()
                .any(|(flag, _)| *flag == "cloning-protection-threads")
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
        assert_eq!(
            version_line("target/k8s/csi-provisioner", "v6.3.0-56-g0688604fa"),
            "target/k8s/csi-provisioner v6.3.0-56-g0688604fa"
        );
        assert_eq!(
            version_line("/csi-provisioner", "5830c16"),
            "/csi-provisioner 5830c16"
        );
        assert_eq!(
            version_line("target/debug/csi-provisioner", "v0.1.0 (git b10cdfb)"),
            "target/debug/csi-provisioner v0.1.0 (git b10cdfb)"
        );
        // The crate version, then the commit when the build knew it.
        let crate_version = concat!("v", env!("CARGO_PKG_VERSION"));
        let commit = VERSION
            .strip_prefix(crate_version)
            .unwrap_or_else(|| panic!("{VERSION:?} starts with {crate_version}"));
        if !commit.is_empty() {
            let commit = commit
                .strip_prefix(" (git ")
                .and_then(|c| c.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{VERSION:?}: ` (git <commit>)` after the version"));
            let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
            assert!(
                hash.len() >= 7 && hash.chars().all(|c| c.is_ascii_hexdigit()),
                "{VERSION:?}"
            );
        }
        assert!(!ok(&["--version=false"]).version);
        // A repeated flag: the last one wins, as in Go.
        let o = ok(&[
            "--timeout=1s",
            "--timeout=2s",
            "--leader-election",
            "--leader-election=false",
        ]);
        assert_eq!(o.timeout, secs(2));
        assert!(!o.leader_election);
        let o = ok(&[
            "--leader-election-labels=a:b",
            "--leader-election-labels=c:d",
        ]);
        assert_eq!(o.leader_election_labels.len(), 2, "list flags add up");
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
            (
                &["--feature-gates=PVReleaser=true"][..],
                "needs --controller-id (the controller id whose PVs it releases)",
            ),
            (
                &["--feature-gates=PodPVCProvisioner=true"][..],
                "controller-id",
            ),
            (
                &["--leader-election", "--leader-election-renew-deadline=20s"][..],
                "--leader-election-renew-deadline (20s) must be shorter than --leader-election-lease-duration (15s)",
            ),
            (&["--no-such-flag"][..], "no-such-flag"),
            (&["--kube-api-burst=0"][..], "--kube-api-burst"),
            (&["--logging-format=xml"][..], "Unsupported log format"),
            (&["--vmodule=claims"][..], "filename=N"),
            (&["--log-flush-frequency=5"][..], "missing unit"),
            (
                &["--log-json-info-buffer-size=lots"][..],
                "log-json-info-buffer-size",
            ),
            (
                &[
                    "--leader-election",
                    "--leader-election-renew-deadline=6s",
                    "--leader-election-retry-period=5s",
                ][..],
                "--leader-election-renew-deadline (6s) must be longer than 1.2 × --leader-election-retry-period (5s)",
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

    /// The upstream binary's `--help` (v6.3), verbatim.
    const UPSTREAM_HELP: &str = include_str!("../tests/fixtures/upstream-v6.3-help.txt");

    /// (name, pflag type) of every flag in the upstream help.
    fn upstream_flags() -> Vec<(String, String)> {
        UPSTREAM_HELP
            .lines()
            .filter_map(|line| {
                let line = line.trim_start();
                let line = line.strip_prefix("-v, ").unwrap_or(line);
                let rest = line.strip_prefix("--")?;
                // pflag pads name and type to the usage column with at
                // least three spaces.
                let head = rest.split("   ").next().unwrap_or(rest);
                let mut words = head.split_whitespace();
                let name = words.next()?.to_owned();
                let kind = words.next().unwrap_or("bool").to_owned();
                Some((name, kind))
            })
            .collect()
    }

    /// A typical value for an upstream flag, from its pflag type (pflag
    /// shows a backquoted word of the usage instead of the type, hence the
    /// names of the odd ones).
    fn typical_value(name: &str, kind: &str) -> Vec<String> {
        let by_name = match name {
            "csi-address" => Some("unix:///csi/csi.sock"),
            "http-endpoint" | "metrics-address" => Some(":8080"),
            "metrics-path" => Some("/metrics"),
            "enable-pprof" => Some("true"),
            "logging-format" => Some("json"),
            "master" => Some("https://127.0.0.1:6443"),
            "leader-election-namespace" => Some("kube-system"),
            "default-fstype" => Some("ext4"),
            "volume-name-prefix" => Some("vol"),
            "kubeconfig" => Some("/etc/kubernetes/kubeconfig"),
            "feature-gates" => Some("Topology=true"),
            // Consistent among themselves, as client-go requires.
            "leader-election-lease-duration" => Some("30s"),
            "leader-election-renew-deadline" => Some("20s"),
            "leader-election-retry-period" => Some("4s"),
            _ => None,
        };
        if let Some(value) = by_name {
            return vec![format!("--{name}={value}")];
        }
        let value = match kind {
            "bool" => return vec![format!("--{name}"), format!("--{name}=false")],
            "boolFunc[=true]" => return vec![format!("--{name}"), format!("--{name}=true")],
            "duration" => "30s",
            "int" | "uint" | "Level" => "3",
            "float" | "float32" => "2.5",
            "quantity" => "2Ki",
            "pattern=N,..." => "claims=5,leader*=2",
            "stringMap" => "team:storage,tier:gold",
            other => panic!("--{name}: no typical value for pflag type {other:?}"),
        };
        vec![format!("--{name}={value}")]
    }

    /// The opt-ins of upstream requests (docs/operations.md): off by
    /// default; lists comma-separated and repeatable, as pflag's StringSlice.
    #[test]
    fn upstream_request_opt_ins() {
        let o = ok(&[]);
        assert!(o.extra_create_metadata_namespace_labels.is_empty());
        assert!(o.extra_create_metadata_namespace_annotations.is_empty());
        assert!(!o.immediate_topology_per_key_set);
        let o = ok(&[
            "--extra-create-metadata-namespace-labels=a,example.com/b",
            "--extra-create-metadata-namespace-labels=c",
            "-extra-create-metadata-namespace-annotations=d",
            "--immediate-topology-per-key-set",
        ]);
        assert_eq!(
            o.extra_create_metadata_namespace_labels,
            ["a", "example.com/b", "c"]
        );
        assert_eq!(o.extra_create_metadata_namespace_annotations, ["d"]);
        assert!(o.immediate_topology_per_key_set);
        assert!(!ok(&["--immediate-topology-per-key-set=false"]).immediate_topology_per_key_set);
    }

    #[test]
    fn every_flag_of_the_upstream_binary_is_accepted() {
        let flags = upstream_flags();
        assert_eq!(flags.len(), 51, "fixture parsed to {flags:?}");
        for (name, kind) in &flags {
            for arg in typical_value(name, kind) {
                // As given, and in Go's single-dash spelling.
                let single_dash = arg[1..].to_owned();
                for spelling in [arg.as_str(), single_dash.as_str()] {
                    let options = parse(&[spelling])
                        .unwrap_or_else(|e| panic!("upstream flag refused: {spelling}: {e}"));
                    assert!(
                        options.explicitly_set().iter().any(|s| s == name),
                        "{spelling} not recorded as set"
                    );
                }
            }
        }
        // All at once, as a real Deployment would (minus the exclusive
        // pair and the gate that needs another flag).
        let all: Vec<String> = flags
            .iter()
            .filter(|(name, _)| name != "metrics-address")
            .flat_map(|(name, kind)| typical_value(name, kind).into_iter().take(1))
            .collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let options = ok(&all);
        assert_eq!(options.logging_format, LogFormat::Json);
        assert!(options.enable_pprof);
        assert_eq!(options.log_json_info_buffer_size, 2048);
        assert_eq!(options.log_flush_frequency, secs(30));
        assert_eq!(
            options.vmodule.level_for("src/provisioner/claims.rs"),
            Some(5)
        );
        let without_effect: Vec<&str> = options
            .set_without_effect()
            .iter()
            .map(|(f, _)| *f)
            .collect();
        for flag in [
            "automaxprocs",
            "log-flush-frequency",
            "log-text-info-buffer-size",
            "log-json-info-buffer-size",
            "log-text-split-stream",
        ] {
            assert!(
                without_effect.contains(&flag),
                "{flag} not named: {without_effect:?}"
            );
        }
        assert!(!without_effect.contains(&"log-json-split-stream"));
        // It serves profiles (src/pprof.rs).
        assert!(!without_effect.contains(&"enable-pprof"));
    }

    #[test]
    fn every_feature_gate_of_the_upstream_binary_is_accepted() {
        let gates: Vec<&str> = UPSTREAM_HELP
            .lines()
            .filter_map(|l| l.trim().split_once("=true|false"))
            .map(|(name, _)| name.rsplit(' ').next().unwrap_or(name))
            .collect();
        assert!(gates.len() >= 30, "{gates:?}");
        for gate in gates {
            for value in ["true", "false"] {
                let arg = format!("--feature-gates={gate}={value}");
                parse(&[&arg]).unwrap_or_else(|e| panic!("{arg}: {e}"));
            }
        }
        let o = ok(&["--feature-gates=WatchList=false,ReleaseLeaderElectionOnExit=true"]);
        assert!(o.gates().enabled(Feature::ReleaseLeaderElectionOnExit));
        assert_eq!(
            o.gates().ignored().collect::<Vec<_>>(),
            vec![("WatchList", false)]
        );
    }

    #[test]
    fn help_lists_every_upstream_flag() {
        let help = Options::command().render_long_help().to_string();
        for (flag, _) in upstream_flags() {
            if flag == "v" {
                assert!(help.contains("-v, --v"));
                continue;
            }
            assert!(
                help.contains(&format!("--{flag}")),
                "--{flag} missing from --help"
            );
        }
    }

    #[test]
    fn logging_flags() {
        let o = ok(&[]);
        assert_eq!(o.logging_format, LogFormat::Text);
        assert_eq!(o.log_flush_frequency, secs(5));
        assert!(o.vmodule.is_empty());
        assert!(!o.log_settings().split_stream);
        assert!(o.set_without_effect().is_empty());
        let o = ok(&[
            "--logging-format=json",
            "--log-json-split-stream",
            "-v=4",
            "--vmodule=claims=6",
        ]);
        let settings = o.log_settings();
        assert_eq!(settings.format, LogFormat::Json);
        assert!(settings.split_stream);
        assert_eq!(settings.verbosity, 4);
        assert_eq!(settings.vmodule.level_for("src/x/claims.rs"), Some(6));
        // The text split flag does not split JSON logs.
        assert!(
            !ok(&["--logging-format=json", "--log-text-split-stream"])
                .log_settings()
                .split_stream
        );
        assert!(
            ok(&["--log-text-split-stream=true"])
                .log_settings()
                .split_stream
        );
        // The human format is a text format: the text flag splits it.
        let human = ok(&["--logging-format=human", "--log-text-split-stream"]);
        assert_eq!(human.log_settings().format, LogFormat::Human);
        assert!(human.log_settings().split_stream);
        assert!(human.set_without_effect().is_empty());
        assert_eq!(
            ok(&["--logging-format=human", "--log-json-split-stream"]).set_without_effect(),
            vec![(
                "log-json-split-stream",
                "it applies to --logging-format=json only"
            )]
        );
        assert!(parse(&["--logging-format=klog"]).is_err());
        for (value, bytes) in [
            ("0", 0),
            ("512", 512),
            ("1K", 1000),
            ("1k", 1000),
            ("2Ki", 2048),
            ("5Mi", 5 << 20),
        ] {
            assert_eq!(
                ok(&[&format!("--log-text-info-buffer-size={value}")]).log_text_info_buffer_size,
                bytes,
                "{value}"
            );
        }
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
