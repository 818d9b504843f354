//! Command line of `csi-hostpath`, compatible with the main flags of the
//! upstream Go hostpath driver (including Go's single-dash spelling
//! `-endpoint=...` and boolean values `--enable-topology=false`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{ArgAction, Parser};

use crate::ids::VolumeIdFormat;
use crate::quantity::parse_quantity;
use crate::{Config, DEFAULT_DRIVER_NAME, Error, TOPOLOGY_KEY};

/// Hostpath CSI driver: volumes are directories under --statedir.
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(name = "csi-hostpath", disable_version_flag = true)]
pub struct Cli {
    /// CSI endpoint: unix:///path, unix:/path or /path.
    #[arg(long, value_name = "ADDRESS", default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,

    /// Name of the driver (GetPluginInfo).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_DRIVER_NAME)]
    pub drivername: String,

    /// Node id (default: the host name).
    #[arg(long, value_name = "ID")]
    pub nodeid: Option<String>,

    /// Directory for volumes, snapshots and their records.
    #[arg(long, value_name = "DIR", default_value = "/csi-data-dir")]
    pub statedir: PathBuf,

    /// Capacity of a kind (StorageClass parameter `kind`), repeatable, e.g.
    /// `--capacity slow=10Gi --capacity fast=100Gi`. None: unlimited.
    #[arg(long, value_name = "KIND=QUANTITY", value_parser = parse_capacity_entry)]
    pub capacity: Vec<(String, u64)>,

    /// Largest volume the driver creates (Kubernetes quantity).
    #[arg(long, value_name = "QUANTITY", default_value = "1Ti", value_parser = parse_quantity_arg)]
    pub max_volume_size: u64,

    /// Report and enforce topology (`--enable-topology=false` to turn off).
    #[arg(
        long,
        value_name = "BOOL",
        default_value = "true",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = parse_go_bool
    )]
    pub enable_topology: bool,

    /// Topology segment key whose value is the node id (a Kubernetes label
    /// key, e.g. topology.ebs.csi.aws.com/zone).
    #[arg(long, value_name = "KEY", default_value = TOPOLOGY_KEY)]
    pub topology_key: String,

    /// Volume ids on the wire: `plain` (the driver's own), or `gce-pd`
    /// (`projects/csi-hostpath/zones/<nodeid>/disks/<id>`, any project and
    /// zone or region accepted back) to stand in for the GCE PD driver,
    /// whose CSI migration translation reads the disk name from the handle.
    #[arg(long, value_name = "FORMAT", default_value = "plain", value_parser = VolumeIdFormat::parse)]
    pub volume_id_format: VolumeIdFormat,

    /// Advertise PUBLISH_UNPUBLISH_VOLUME and answer ControllerPublish /
    /// ControllerUnpublish (bookkeeping only).
    #[arg(
        long,
        value_name = "BOOL",
        default_value = "false",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = parse_go_bool
    )]
    pub enable_controller_publish: bool,

    /// The CSI socket's path on the host, as the kubelet dials it (e.g.
    /// /var/lib/kubelet/plugins/hostpath.csi.k8s.io/csi.sock). Set: the
    /// driver registers itself with the kubelet's plugin registry, as
    /// node-driver-registrar does with the same flag.
    #[arg(long, value_name = "PATH")]
    pub kubelet_registration_path: Option<PathBuf>,

    /// The kubelet's plugin registry directory as mounted in this process
    /// (<kubelet root>/plugins_registry on the host); the registration
    /// socket is <dir>/<drivername>-reg.sock. Used with
    /// --kubelet-registration-path.
    #[arg(long, value_name = "DIR", default_value = "/registration")]
    pub plugin_registration_path: PathBuf,

    /// Fault injection file (JSON, re-read at every call); unset: none.
    #[arg(long, value_name = "PATH")]
    pub faults_file: Option<PathBuf>,

    /// Log verbosity as klog's -v: 0-2 info, 3-4 debug, 5+ trace
    /// (RUST_LOG, when set, wins).
    #[arg(long = "v", short = 'v', value_name = "LEVEL", default_value_t = 0)]
    pub v: u8,

    /// Print the version and exit.
    #[arg(
        long,
        value_name = "BOOL",
        default_value = "false",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = parse_go_bool
    )]
    pub version: bool,
}

/// Long flags known to the parser, for the Go single-dash spelling.
const LONG_FLAGS: &[&str] = &[
    "endpoint",
    "drivername",
    "nodeid",
    "statedir",
    "capacity",
    "max-volume-size",
    "enable-topology",
    "topology-key",
    "volume-id-format",
    "faults-file",
    "kubelet-registration-path",
    "plugin-registration-path",
    "version",
    "help",
];

/// Rewrites Go-style `-flag[=value]` for our long flags into `--flag[=value]`
/// (Go's flag package accepts one or two dashes). Stops at `--`.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut passthrough = false;
    for arg in args {
        if passthrough || arg == "--" {
            passthrough = true;
            out.push(arg);
            continue;
        }
        if let Some(rest) = arg.strip_prefix('-')
            && !rest.starts_with('-')
            && LONG_FLAGS.contains(&rest.split_once('=').map_or(rest, |(n, _)| n))
        {
            out.push(format!("-{arg}"));
            continue;
        }
        out.push(arg);
    }
    out
}

/// Go's `strconv.ParseBool` spellings.
pub fn parse_go_bool(input: &str) -> Result<bool, String> {
    match input {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(format!("invalid boolean {other:?}")),
    }
}

fn parse_quantity_arg(input: &str) -> Result<u64, String> {
    parse_quantity(input).map_err(|e| e.to_string())
}

/// `kind=quantity`.
pub fn parse_capacity_entry(input: &str) -> Result<(String, u64), String> {
    let (kind, quantity) = input
        .split_once('=')
        .ok_or_else(|| format!("{input:?} is not <kind>=<quantity>"))?;
    let kind = kind.trim();
    if kind.is_empty() {
        return Err(format!("{input:?} has an empty kind"));
    }
    let bytes = parse_quantity(quantity).map_err(|e| e.to_string())?;
    Ok((kind.to_owned(), bytes))
}

/// The host name (`gethostname(2)`).
pub fn hostname() -> Result<String, Error> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(Error::io("gethostname", std::io::Error::last_os_error()));
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    if name.is_empty() {
        return Err(Error::Config(
            "the host name is empty; pass --nodeid".to_owned(),
        ));
    }
    Ok(name)
}

impl Config {
    /// The command-line flags that configure a `csi-hostpath` process as
    /// this configuration (every field but `vendor_version`, which is the
    /// binary's own), for harnesses that run the driver as a process: its
    /// `exit_after_backend_change` faults end the process.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--endpoint=unix://{}", self.endpoint.display()),
            format!("--drivername={}", self.driver_name),
            format!("--nodeid={}", self.node_id),
            format!("--statedir={}", self.state_dir.display()),
            format!("--max-volume-size={}", self.max_volume_size),
            format!("--enable-topology={}", self.enable_topology),
            format!("--topology-key={}", self.topology_key),
            format!("--volume-id-format={}", self.volume_id_format.as_str()),
            format!("--enable-controller-publish={}", self.controller_publish),
        ];
        args.extend(
            self.capacity
                .iter()
                .map(|(kind, bytes)| format!("--capacity={kind}={bytes}")),
        );
        if !self.faults_file.as_os_str().is_empty() {
            args.push(format!("--faults-file={}", self.faults_file.display()));
        }
        if let Some(registration) = &self.registration {
            args.push(format!(
                "--kubelet-registration-path={}",
                registration.kubelet_registration_path.display()
            ));
            args.push(format!(
                "--plugin-registration-path={}",
                registration.plugin_registration_path.display()
            ));
        }
        args
    }
}

impl Cli {
    /// The driver configuration these flags describe.
    pub fn into_config(self) -> Result<Config, Error> {
        let endpoint = csi_proto::transport::parse_unix_address(&self.endpoint)?;
        let node_id = match self.nodeid {
            Some(id) if !id.is_empty() => id,
            Some(_) => return Err(Error::Config("--nodeid is empty".to_owned())),
            None => hostname()?,
        };
        let mut capacity = BTreeMap::new();
        for (kind, bytes) in self.capacity {
            if capacity.insert(kind.clone(), bytes).is_some() {
                return Err(Error::Config(format!(
                    "--capacity names kind {kind:?} twice"
                )));
            }
        }
        crate::state::check_label_key(&self.topology_key)
            .map_err(|e| Error::Config(format!("--topology-key {:?}: {e}", self.topology_key)))?;
        let registration = match self.kubelet_registration_path {
            Some(path) if !path.is_absolute() => {
                return Err(Error::Config(format!(
                    "--kubelet-registration-path {} is not absolute",
                    path.display()
                )));
            }
            Some(kubelet_registration_path) => Some(crate::NodeRegistration {
                kubelet_registration_path,
                plugin_registration_path: self.plugin_registration_path,
            }),
            None => None,
        };
        Ok(Config {
            endpoint,
            driver_name: self.drivername,
            node_id,
            state_dir: self.statedir,
            capacity,
            max_volume_size: self.max_volume_size,
            enable_topology: self.enable_topology,
            topology_key: self.topology_key,
            faults_file: self.faults_file.unwrap_or_default(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            controller_publish: self.enable_controller_publish,
            volume_id_format: self.volume_id_format,
            registration,
        })
    }

    /// The `tracing` filter for `--v`.
    pub fn log_filter(&self) -> &'static str {
        // The HTTP/2 and gRPC transport crates stay at info: at trace they
        // write dozens of lines per call, and a test that shows the log's
        // tail (the real-node test's registration check) showed only them.
        match self.v {
            0..=2 => "info",
            3..=4 => "debug,h2=info,hyper=info,hyper_util=info,tower=info",
            _ => "trace,h2=info,hyper=info,hyper_util=info,tower=info",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_args_describes_the_same_configuration() {
        let mut config = Config::for_tests(std::path::Path::new("/tmp/x"));
        let round_trip = |config: &Config| {
            let argv = std::iter::once("csi-hostpath".to_owned()).chain(config.to_args());
            Cli::try_parse_from(normalize_args(argv))
                .expect("parses")
                .into_config()
                .expect("valid")
        };
        assert_eq!(round_trip(&config), config);
        config.capacity.insert("fast".to_owned(), 1 << 30);
        config.capacity.insert("slow".to_owned(), 5);
        config.enable_topology = false;
        config.controller_publish = true;
        config.topology_key = "topology.ebs.csi.aws.com/zone".to_owned();
        config.volume_id_format = crate::ids::VolumeIdFormat::GcePd;
        config.faults_file = PathBuf::new();
        config.max_volume_size = 12345;
        assert_eq!(round_trip(&config), config);
        config.registration = Some(crate::NodeRegistration {
            kubelet_registration_path: PathBuf::from("/var/lib/kubelet/plugins/d/csi.sock"),
            plugin_registration_path: PathBuf::from("/registration"),
        });
        assert_eq!(round_trip(&config), config);
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let argv =
            std::iter::once("csi-hostpath".to_owned()).chain(args.iter().map(|s| (*s).to_owned()));
        Cli::try_parse_from(normalize_args(argv))
    }

    #[test]
    fn defaults() {
        let cli = parse(&[]).expect("parse");
        assert_eq!(cli.endpoint, "unix:///csi/csi.sock");
        assert_eq!(cli.drivername, "hostpath.csi.k8s.io");
        assert_eq!(cli.nodeid, None);
        assert_eq!(cli.statedir, PathBuf::from("/csi-data-dir"));
        assert!(cli.capacity.is_empty());
        assert_eq!(cli.max_volume_size, 1 << 40);
        assert!(cli.enable_topology);
        assert_eq!(cli.topology_key, "topology.hostpath.csi/node");
        assert_eq!(cli.faults_file, None);
        assert_eq!(cli.v, 0);
        assert!(!cli.version);
        assert_eq!(cli.kubelet_registration_path, None);
        assert_eq!(cli.plugin_registration_path, PathBuf::from("/registration"));
        let config = parse(&["--nodeid", "n"])
            .expect("parse")
            .into_config()
            .expect("config");
        assert_eq!(config.endpoint, PathBuf::from("/csi/csi.sock"));
        assert_eq!(config.node_id, "n");
        assert!(config.faults_file.as_os_str().is_empty());
        assert_eq!(config.vendor_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(config.registration, None, "no registration unless asked");
        let config = parse(&[]).expect("parse").into_config().expect("config");
        assert_eq!(config.node_id, hostname().expect("hostname"));
    }

    #[test]
    fn all_flags_both_spellings() {
        for args in [
            vec![
                "--endpoint=unix:///tmp/x.sock",
                "--drivername=my.driver",
                "--nodeid=node-1",
                "--statedir=/var/hp",
                "--capacity=slow=10Gi",
                "--capacity",
                "fast=100Mi",
                "--max-volume-size=2Gi",
                "--enable-topology=false",
                "--topology-key=topology.ebs.csi.aws.com/zone",
                "--faults-file=/tmp/f.json",
                "--volume-id-format=gce-pd",
                "--v=5",
            ],
            vec![
                "-endpoint",
                "unix:///tmp/x.sock",
                "-drivername=my.driver",
                "-nodeid=node-1",
                "-statedir",
                "/var/hp",
                "-capacity=slow=10Gi",
                "-capacity=fast=100Mi",
                "-max-volume-size=2Gi",
                "-enable-topology=0",
                "-topology-key",
                "topology.ebs.csi.aws.com/zone",
                "-faults-file=/tmp/f.json",
                "-volume-id-format",
                "gce-pd",
                "-v=5",
            ],
        ] {
            let cli = parse(&args).expect("parse");
            assert!(cli.log_filter().starts_with("trace,"));
            let config = cli.into_config().expect("config");
            assert_eq!(config.endpoint, PathBuf::from("/tmp/x.sock"));
            assert_eq!(config.driver_name, "my.driver");
            assert_eq!(config.node_id, "node-1");
            assert_eq!(config.state_dir, PathBuf::from("/var/hp"));
            assert_eq!(
                config.capacity,
                BTreeMap::from([
                    ("slow".to_owned(), 10 << 30),
                    ("fast".to_owned(), 100 << 20)
                ])
            );
            assert_eq!(config.max_volume_size, 2 << 30);
            assert!(!config.enable_topology);
            assert_eq!(config.topology_key, "topology.ebs.csi.aws.com/zone");
            assert_eq!(config.faults_file, PathBuf::from("/tmp/f.json"));
            assert_eq!(config.volume_id_format, crate::ids::VolumeIdFormat::GcePd);
        }
    }

    #[test]
    fn booleans_and_plain_endpoint() {
        assert!(
            parse(&["--enable-topology"])
                .expect("parse")
                .enable_topology
        );
        assert!(
            parse(&["--enable-topology=true"])
                .expect("parse")
                .enable_topology
        );
        assert!(
            parse(&["--enable-topology=T"])
                .expect("parse")
                .enable_topology
        );
        assert!(
            !parse(&["--enable-topology=False"])
                .expect("parse")
                .enable_topology
        );
        assert!(parse(&["--version"]).expect("parse").version);
        assert!(parse(&["-version"]).expect("parse").version);
        assert!(
            parse(&["-v", "3"])
                .expect("parse")
                .log_filter()
                .starts_with("debug,")
        );
        let config = parse(&["--endpoint", "/run/csi.sock", "--nodeid", "n"])
            .expect("parse")
            .into_config()
            .expect("config");
        assert_eq!(config.endpoint, PathBuf::from("/run/csi.sock"));
    }

    #[test]
    fn bad_flags() {
        for args in [
            &["--enable-topology=maybe"][..],
            &["--capacity=10Gi"],
            &["--capacity==10Gi"],
            &["--capacity=slow=lots"],
            &["--capacity=slow=-1Gi"],
            &["--max-volume-size=1GB"],
            &["--max-volume-size="],
            &["--volume-id-format=gce"],
            &["--v=loud"],
            &["--no-such-flag"],
            &["-no-such-flag"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
        for args in [
            &["--endpoint=tcp://127.0.0.1:1", "--nodeid=n"][..],
            &["--endpoint=relative.sock", "--nodeid=n"],
            &["--nodeid="],
            &["--nodeid=n", "--capacity=a=1Gi", "--capacity=a=2Gi"],
            &["--nodeid=n", "--topology-key="],
            &["--nodeid=n", "--topology-key=a/b/c"],
            &["--nodeid=n", "--topology-key=zone with spaces"],
            &["--nodeid=n", "--topology-key=Upper.Case/zone"],
            &["--nodeid=n", "--topology-key=example.com/"],
            &["--nodeid=n", "--kubelet-registration-path=csi.sock"],
        ] {
            let cli = parse(args).expect("parses");
            assert!(cli.into_config().is_err(), "{args:?} should be rejected");
        }
    }

    #[test]
    fn normalize_keeps_other_args() {
        let args: Vec<String> = [
            "x",
            "-endpoint=/a",
            "--nodeid",
            "-n",
            "-unknown",
            "--",
            "-statedir",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(
            normalize_args(args),
            [
                "x",
                "--endpoint=/a",
                "--nodeid",
                "-n",
                "-unknown",
                "--",
                "-statedir"
            ]
        );
    }
}
