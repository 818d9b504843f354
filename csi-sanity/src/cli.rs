//! Command line: this suite's flags plus the upstream csi-sanity spellings
//! (`--csi.endpoint`, `-csi.endpoint`, `--ginkgo.focus`, ...).

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser, ValueEnum};

use crate::config::{self, AccessType, Config, Secrets};
use crate::quantity::{parse_duration, parse_size};

/// Exit code for bad flags or an unreachable driver.
pub const EXIT_USAGE: i32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AccessTypeArg {
    Mount,
    Block,
}

/// CSI conformance checks against a running driver.
#[derive(Debug, Parser)]
#[command(
    name = "csi-sanity",
    version,
    about = "Checks a CSI driver against the MUST rules of the CSI specification",
    after_help = "Upstream csi-sanity spellings (--csi.endpoint, -csi.endpoint, --ginkgo.focus, ...) are accepted as aliases.\n\
                  Exit codes: 0 all checks passed or were skipped, 1 a check failed, 2 bad flags or the driver is unreachable."
)]
struct Args {
    /// Node (and identity) endpoint: /path, unix:/path or unix:///path.
    #[arg(
        long = "csi-address",
        visible_alias = "csi.endpoint",
        value_name = "SOCKET"
    )]
    csi_address: Option<String>,

    /// Controller endpoint when it differs from --csi-address.
    #[arg(
        long = "controller-address",
        visible_alias = "csi.controllerendpoint",
        value_name = "SOCKET"
    )]
    controller_address: Option<String>,

    /// Size of the test volumes: bytes (10485760) or a quantity (10Mi, 1Gi).
    #[arg(
        long = "test-volume-size",
        visible_alias = "csi.testvolumesize",
        value_name = "SIZE",
        value_parser = size_arg,
        default_value = "10Mi"
    )]
    test_volume_size: i64,

    /// Size to expand test volumes to (default: twice --test-volume-size).
    #[arg(
        long = "test-volume-expand-size",
        visible_alias = "csi.testvolumeexpandsize",
        value_name = "SIZE",
        value_parser = size_arg
    )]
    test_volume_expand_size: Option<i64>,

    /// YAML map of parameters passed to CreateVolume.
    #[arg(
        long = "test-volume-parameters",
        visible_alias = "csi.testvolumeparameters",
        value_name = "YAML_FILE"
    )]
    test_volume_parameters: Option<PathBuf>,

    /// YAML map of parameters passed to CreateSnapshot.
    #[arg(
        long = "test-snapshot-parameters",
        visible_alias = "csi.testsnapshotparameters",
        value_name = "YAML_FILE"
    )]
    test_snapshot_parameters: Option<PathBuf>,

    /// Access type of the test volumes.
    #[arg(
        long = "test-volume-access-type",
        visible_alias = "csi.testvolumeaccesstype",
        value_enum,
        default_value = "mount"
    )]
    test_volume_access_type: AccessTypeArg,

    /// YAML file of secrets in the upstream format (CreateVolumeSecret: {...}, ...).
    #[arg(
        long = "secrets",
        visible_alias = "csi.secrets",
        value_name = "YAML_FILE"
    )]
    secrets: Option<PathBuf>,

    /// Only run checks whose names match this regex (repeatable: any match).
    #[arg(long = "focus", visible_alias = "ginkgo.focus", value_name = "REGEX")]
    focus: Vec<String>,

    /// Skip checks whose names match this regex (repeatable: any match).
    #[arg(long = "skip", visible_alias = "ginkgo.skip", value_name = "REGEX")]
    skip: Vec<String>,

    /// Write a JUnit XML report to this file.
    #[arg(
        long = "junit",
        visible_aliases = ["csi.junitfile", "ginkgo.junit-report"],
        value_name = "FILE"
    )]
    junit: Option<PathBuf>,

    /// Parent directory for NodePublishVolume target paths (default: a new temporary directory).
    #[arg(long = "mount-dir", visible_alias = "csi.mountdir", value_name = "DIR")]
    mount_dir: Option<PathBuf>,

    /// Parent directory for NodeStageVolume staging paths (default: a new temporary directory).
    #[arg(
        long = "staging-dir",
        visible_alias = "csi.stagingdir",
        value_name = "DIR"
    )]
    staging_dir: Option<PathBuf>,

    /// Time one check may take: seconds or 30s, 2m, 1h.
    #[arg(long = "check-timeout", value_name = "DURATION", value_parser = duration_arg, default_value = "120s")]
    check_timeout: Duration,

    /// How long to keep trying to connect to the driver's socket.
    #[arg(long = "connect-timeout", value_name = "DURATION", value_parser = duration_arg, default_value = "10s")]
    connect_timeout: Duration,

    /// Print the names of the checks that would run, then exit.
    #[arg(long = "list", visible_alias = "ginkgo.dry-run")]
    list: bool,

    /// Accepted for compatibility with upstream scripts; no effect.
    #[arg(
        long = "ginkgo.v",
        aliases = ["ginkgo.vv", "ginkgo.no-color", "ginkgo.noColor", "ginkgo.succinct", "ginkgo.progress", "ginkgo.trace"],
        hide = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    ignored: Vec<String>,
}

fn size_arg(s: &str) -> Result<i64, String> {
    let v = parse_size(s).map_err(|e| e.to_string())?;
    if v <= 0 {
        return Err("the size must be positive".into());
    }
    Ok(v)
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// Rewrites Go-style single-dash long flags (`-csi.endpoint=x`,
/// `-ginkgo.focus x`) into `--` form, leaving everything else alone.
pub fn normalize_args<I, S>(args: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let cmd = Args::command();
    let mut longs: Vec<String> = Vec::new();
    for a in cmd.get_arguments() {
        if let Some(l) = a.get_long() {
            longs.push(l.to_owned());
        }
        if let Some(aliases) = a.get_all_aliases() {
            longs.extend(aliases.into_iter().map(str::to_owned));
        }
    }
    longs.extend(["help".to_owned(), "version".to_owned()]);
    let mut out = Vec::new();
    let mut after_double_dash = false;
    for (i, arg) in args.into_iter().map(Into::into).enumerate() {
        if i == 0 || after_double_dash {
            out.push(arg);
            continue;
        }
        if arg == "--" {
            after_double_dash = true;
            out.push(arg);
            continue;
        }
        if let Some(rest) = arg.strip_prefix('-')
            && !rest.starts_with('-')
            && longs
                .iter()
                .any(|l| l == rest.split('=').next().unwrap_or(rest))
        {
            out.push(format!("-{arg}"));
            continue;
        }
        out.push(arg);
    }
    out
}

fn combine(patterns: &[String], flag: &str) -> Result<Option<regex::Regex>, String> {
    if patterns.is_empty() {
        return Ok(None);
    }
    for p in patterns {
        regex::Regex::new(p).map_err(|e| format!("--{flag} {p:?}: {e}"))?;
    }
    let joined = patterns
        .iter()
        .map(|p| format!("(?:{p})"))
        .collect::<Vec<_>>()
        .join("|");
    regex::Regex::new(&joined)
        .map(Some)
        .map_err(|e| format!("--{flag}: {e}"))
}

fn address(flag: &str, value: &str) -> Result<PathBuf, String> {
    csi_proto::transport::parse_unix_address(value).map_err(|e| format!("--{flag}: {e}"))
}

/// Builds the run configuration; errors are usage errors.
fn build_config(args: &Args, err: &mut dyn Write) -> Result<Config, String> {
    let Some(endpoint) = &args.csi_address else {
        return Err("--csi-address (or --csi.endpoint) is required".into());
    };
    let mut config = Config::new(address("csi-address", endpoint)?);
    config.controller_endpoint = args
        .controller_address
        .as_deref()
        .map(|a| address("controller-address", a))
        .transpose()?;
    config.test_volume_size = args.test_volume_size;
    config.test_volume_expand_size = args.test_volume_expand_size;
    if let Some(p) = &args.test_volume_parameters {
        config.test_volume_parameters = config::load_parameters(p).map_err(|e| e.to_string())?;
    }
    if let Some(p) = &args.test_snapshot_parameters {
        config.test_snapshot_parameters = config::load_parameters(p).map_err(|e| e.to_string())?;
    }
    config.access_type = match args.test_volume_access_type {
        AccessTypeArg::Mount => AccessType::Mount,
        AccessTypeArg::Block => AccessType::Block,
    };
    if let Some(p) = &args.secrets {
        let secrets = Secrets::load(p).map_err(|e| e.to_string())?;
        for key in secrets.unknown.keys() {
            let _ = writeln!(
                err,
                "warning: {}: {key} is not a secret this suite uses; ignored",
                p.display()
            );
        }
        config.secrets = secrets;
    }
    config.focus = combine(&args.focus, "focus")?;
    config.skip = combine(&args.skip, "skip")?;
    config.junit = args.junit.clone();
    config.mount_dir = args.mount_dir.clone();
    config.staging_dir = args.staging_dir.clone();
    config.check_timeout = args.check_timeout;
    config.connect_timeout = args.connect_timeout;
    if let Some(expand) = config.test_volume_expand_size
        && expand <= config.test_volume_size
    {
        return Err(format!(
            "--test-volume-expand-size ({expand}) must be larger than --test-volume-size ({})",
            config.test_volume_size
        ));
    }
    Ok(config)
}

/// Runs the command line `args` (program name first); returns the exit code.
pub async fn run_cli<I, S>(
    args: I,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> i32
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    run_cli_until(args, out, err, std::future::pending::<()>()).await
}

/// [`run_cli`] that stops early (cleaning up) when `interrupt` completes.
pub async fn run_cli_until<I, S>(
    args: I,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    interrupt: impl Future<Output = ()> + Send,
) -> i32
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let args = match Args::try_parse_from(normalize_args(args)) {
        Ok(a) => a,
        Err(e) => {
            let code = e.exit_code();
            let text = e.render().to_string();
            if e.use_stderr() {
                let _ = write!(err, "{text}");
            } else {
                let _ = write!(out, "{text}");
            }
            return code;
        }
    };
    if args.list {
        let focus = combine(&args.focus, "focus");
        let skip = combine(&args.skip, "skip");
        let (focus, skip) = match (focus, skip) {
            (Ok(f), Ok(s)) => (f, s),
            (Err(e), _) | (_, Err(e)) => {
                let _ = writeln!(err, "csi-sanity: {e}");
                return EXIT_USAGE;
            }
        };
        let mut selector = Config::new("/unused");
        selector.focus = focus;
        selector.skip = skip;
        for name in crate::checks::names() {
            let listed = if name == crate::runner::CLEANUP_CHECK {
                // The cleanup check ignores --focus, as in a real run.
                !selector.skip.as_ref().is_some_and(|s| s.is_match(name))
            } else {
                selector.selects(name)
            };
            if listed {
                let _ = writeln!(out, "{name}");
            }
        }
        return 0;
    }
    let config = match build_config(&args, err) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(err, "csi-sanity: {e}");
            return EXIT_USAGE;
        }
    };
    let junit = config.junit.clone();
    let report = match crate::runner::run_until(config, out, interrupt).await {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "csi-sanity: {e}");
            return EXIT_USAGE;
        }
    };
    if let Some(path) = junit
        && let Err(e) = std::fs::write(&path, report.junit_xml("CSI Driver Test Suite"))
    {
        let _ = writeln!(err, "csi-sanity: cannot write {}: {e}", path.display());
        return EXIT_USAGE;
    }
    report.exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_flags_are_rewritten() {
        let got = normalize_args([
            "csi-sanity",
            "-csi.endpoint=/tmp/a.sock",
            "-ginkgo.focus",
            "Controller",
            "-csi.testvolumesize",
            "1073741824",
            "--skip",
            "-x",
            "-ginkgo.v",
        ]);
        assert_eq!(
            got,
            [
                "csi-sanity",
                "--csi.endpoint=/tmp/a.sock",
                "--ginkgo.focus",
                "Controller",
                "--csi.testvolumesize",
                "1073741824",
                "--skip",
                "-x",
                "--ginkgo.v",
            ]
        );
    }

    fn parse(args: &[&str]) -> Result<Config, String> {
        let args = Args::try_parse_from(normalize_args(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        build_config(&args, &mut Vec::new())
    }

    #[test]
    fn upstream_and_own_spellings_agree() {
        let ours = parse(&[
            "csi-sanity",
            "--csi-address",
            "unix:///tmp/csi.sock",
            "--controller-address",
            "/tmp/ctrl.sock",
            "--test-volume-size",
            "1Gi",
            "--focus",
            "Node",
            "--skip",
            "Stats",
        ])
        .expect("ours");
        let upstream = parse(&[
            "csi-sanity",
            "-csi.endpoint=unix:/tmp/csi.sock",
            "--csi.controllerendpoint",
            "/tmp/ctrl.sock",
            "-csi.testvolumesize",
            "1073741824",
            "--ginkgo.focus=Node",
            "-ginkgo.skip",
            "Stats",
            "-ginkgo.v",
            "--ginkgo.no-color=true",
        ])
        .expect("upstream");
        assert_eq!(ours.endpoint, PathBuf::from("/tmp/csi.sock"));
        assert_eq!(ours.endpoint, upstream.endpoint);
        assert_eq!(ours.controller_endpoint, upstream.controller_endpoint);
        assert_eq!(ours.test_volume_size, 1 << 30);
        assert_eq!(ours.test_volume_size, upstream.test_volume_size);
        assert!(upstream.selects("Node Service NodeGetInfo x"));
        assert!(!upstream.selects("Node Service NodeGetVolumeStats x"));
        assert!(!upstream.selects("Identity Service Probe x"));
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        assert!(parse(&["csi-sanity"]).is_err());
        assert!(parse(&["csi-sanity", "--csi-address", "tcp://1.2.3.4:5"]).is_err());
        assert!(parse(&["csi-sanity", "--csi-address", "relative.sock"]).is_err());
        assert!(
            parse(&[
                "csi-sanity",
                "--csi-address",
                "/x",
                "--test-volume-size",
                "10MB"
            ])
            .is_err()
        );
        assert!(parse(&["csi-sanity", "--csi-address", "/x", "--focus", "("]).is_err());
        assert!(
            parse(&[
                "csi-sanity",
                "--csi-address",
                "/x",
                "--secrets",
                "/nonexistent.yaml"
            ])
            .is_err()
        );
        assert!(parse(&["csi-sanity", "--csi-address", "/x", "--bogus"]).is_err());
        assert!(
            parse(&[
                "csi-sanity",
                "--csi-address",
                "/x",
                "--test-volume-size",
                "10Mi",
                "--test-volume-expand-size",
                "5Mi"
            ])
            .is_err()
        );
    }
}
