//! A real Kubernetes control plane on loopback, envtest-style: etcd,
//! kube-apiserver (RBAC and the audit log on), and optionally
//! kube-controller-manager and kube-scheduler, started from a folder of
//! upstream binaries named by [`BIN_DIR_VAR`] (or the ecosystem's
//! `KUBEBUILDER_ASSETS`).
//!
//! Tests share one control plane per test binary and configuration
//! ([`ControlPlane::shared`]) and isolate themselves by namespace and driver
//! name. Every process is stopped when the test process ends, even when it
//! panics or is killed ([`process`]).
//!
//! A missing binary skips or fails, decided once ([`BinEnv::no_skip_reason`],
//! [`verdict`]): with `CI` set to `true` (or `1`), or with [`BIN_DIR_VAR`] or
//! [`ENVTEST_VAR`] set, it fails the test with a message naming what is
//! missing; otherwise (a newcomer without the binaries)
//! [`ControlPlane::shared`] prints one `SKIPPED real-cluster test …` line
//! saying what is missing and which variable enables it, and returns `None`.
//!
//! Binaries: `../shared/k8s/install.sh target/k8s` unpacks them here; anyone
//! else can point the variable at a folder holding `kube-apiserver` and
//! `kube-controller-manager` (and `kube-scheduler` for tests that schedule
//! pods) of Kubernetes 1.34 or later, e.g. from
//! `setup-envtest use -p path` plus a controller-manager from the release
//! tarball, and an `etcd` there or on `PATH`.

pub mod audit;
pub mod lag_proxy;
pub mod node;
mod pki;
pub mod process;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use lag_proxy::LagProxy;
pub use process::GuardedChild;

/// The variable naming the folder of binaries.
pub const BIN_DIR_VAR: &str = "K8S_BIN_DIR";
/// Accepted too: what envtest's `setup-envtest` prints.
pub const ENVTEST_VAR: &str = "KUBEBUILDER_ASSETS";
/// Set to `true` (or `1`) by CI systems: then nothing may skip.
pub const CI_VAR: &str = "CI";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Unavailable(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("certificates: {0}")]
    Pki(String),
    #[error("{component} did not become ready within {seconds}s; last log lines:\n{log}")]
    NotReady {
        component: &'static str,
        seconds: u64,
        log: String,
    },
    #[error("kube client: {0}")]
    Client(String),
}

/// The environment that says where the binaries are and whether a missing
/// one may skip a test: the values of [`CI_VAR`], [`BIN_DIR_VAR`],
/// [`ENVTEST_VAR`] and `PATH` (for `etcd`). Empty values count as unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BinEnv {
    pub ci: Option<String>,
    pub bin_dir: Option<PathBuf>,
    pub envtest: Option<PathBuf>,
    pub path: Option<OsString>,
}

impl BinEnv {
    /// This process's environment.
    pub fn from_process() -> BinEnv {
        BinEnv {
            ci: std::env::var(CI_VAR).ok(),
            bin_dir: std::env::var_os(BIN_DIR_VAR).map(PathBuf::from),
            envtest: std::env::var_os(ENVTEST_VAR).map(PathBuf::from),
            path: std::env::var_os("PATH"),
        }
    }

    fn bin_dir(&self) -> Option<&Path> {
        self.bin_dir
            .as_deref()
            .filter(|d| !d.as_os_str().is_empty())
    }

    fn envtest(&self) -> Option<&Path> {
        self.envtest
            .as_deref()
            .filter(|d| !d.as_os_str().is_empty())
    }

    /// Why a missing binary must fail the test rather than skip it: `CI` is
    /// `true` or `1`, or a folder of binaries was named ([`BIN_DIR_VAR`],
    /// [`ENVTEST_VAR`]). `None`: skipping is allowed (no CI and no folder
    /// named, a newcomer without `../shared/k8s`).
    pub fn no_skip_reason(&self) -> Option<String> {
        if let Some(ci) = &self.ci
            && matches!(ci.trim().to_ascii_lowercase().as_str(), "true" | "1")
        {
            return Some(format!("{CI_VAR}={ci}"));
        }
        if let Some(dir) = self.bin_dir() {
            return Some(format!("{BIN_DIR_VAR}={} is set", dir.display()));
        }
        if let Some(dir) = self.envtest() {
            return Some(format!("{ENVTEST_VAR}={} is set", dir.display()));
        }
        None
    }

    pub fn skips_allowed(&self) -> bool {
        self.no_skip_reason().is_none()
    }
}

/// Whether a missing binary may skip a test in this process (see
/// [`BinEnv::no_skip_reason`]).
pub fn skips_allowed() -> bool {
    BinEnv::from_process().skips_allowed()
}

/// What a test does about its binaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<T> {
    /// Everything is there.
    Run(T),
    /// Something is missing (said here) and skipping is allowed.
    Skip(String),
    /// Something is missing and skipping is not allowed: the whole message.
    Fail(String),
}

/// The one decision between running, skipping and failing: `found` is what
/// a lookup found, or what it found missing.
pub fn verdict<T>(env: &BinEnv, found: Result<T, String>) -> Verdict<T> {
    match found {
        Ok(found) => Verdict::Run(found),
        Err(missing) => match env.no_skip_reason() {
            None => Verdict::Skip(missing),
            Some(reason) => Verdict::Fail(format!(
                "{missing}; {reason}, so a missing binary fails the test instead of skipping it \
                 (unpack the binaries with `../shared/k8s/install.sh target/k8s`, or point \
                 {BIN_DIR_VAR} at a folder that has them)"
            )),
        },
    }
}

/// The variable naming a folder with an etcd 3.5 (`etcd` in it), for the
/// tests that need etcd's progress requests (3.5.13 and later; the etcd of
/// `../shared/k8s/install.sh` is Debian bookworm's 3.4.23, which has none).
/// Default: the workspace's `target/etcd-3.5`, where
/// `tests/controlplane/install-etcd-3.5.sh target/etcd-3.5` puts Debian
/// trixie's.
pub const ETCD35_DIR_VAR: &str = "ETCD35_DIR";

/// The etcd 3.5 binary for `test` ([`ETCD35_DIR_VAR`]): `None` after one
/// `SKIPPED real-cluster test` line when it is missing and skipping is
/// allowed; panics naming it when skipping is not allowed (CI).
pub fn etcd35(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(ETCD35_DIR_VAR)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/etcd-3.5"));
    let path = dir.join("etcd");
    let found = match RealFiles.file(&path) {
        FileState::Executable => Ok(path),
        FileState::NotExecutable => Err(format!("{} is not executable", path.display())),
        FileState::Absent => Err(format!(
            "{} has no etcd 3.5 (`bash tests/controlplane/install-etcd-3.5.sh target/etcd-3.5` \
             installs it, or point {ETCD35_DIR_VAR} at a folder with one)",
            dir.display()
        )),
    };
    run_or_skip(found, test)
}

/// What `test` does about what a lookup `found`: the thing, or `None`
/// after one `SKIPPED real-cluster test` line when skipping is allowed;
/// panics naming what is missing when it is not ([`verdict`]).
pub fn run_or_skip<T>(found: Result<T, String>, test: &str) -> Option<T> {
    match verdict(&BinEnv::from_process(), found) {
        Verdict::Run(found) => Some(found),
        Verdict::Skip(missing) => {
            skip(test, &missing);
            None
        }
        Verdict::Fail(message) => panic!("real-cluster test {test}: {message}"),
    }
}

/// Where the binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub dir: PathBuf,
    pub etcd: PathBuf,
}

impl Binaries {
    /// The binaries per `env`: the folder of [`BIN_DIR_VAR`], else of
    /// [`ENVTEST_VAR`], else `default_dir` (the workspace's `target/k8s`,
    /// where `install.sh` puts them); `kube-apiserver` and every name of
    /// `needs` in it, `etcd` in it or on `PATH`. `Err` names everything
    /// missing. Pure: `files` answers for the file system.
    pub fn locate(
        env: &BinEnv,
        default_dir: &Path,
        needs: &[&str],
        files: &dyn Files,
    ) -> Result<Binaries, String> {
        let (dir, named) = match (env.bin_dir(), env.envtest()) {
            (Some(dir), _) => (dir, format!("{BIN_DIR_VAR}={}", dir.display())),
            (None, Some(dir)) => (dir, format!("{ENVTEST_VAR}={}", dir.display())),
            (None, None) => (
                default_dir,
                format!(
                    "{} (neither {BIN_DIR_VAR} nor {ENVTEST_VAR} is set)",
                    default_dir.display()
                ),
            ),
        };
        if !files.is_dir(dir) {
            return Err(format!("{named}: no such folder"));
        }
        let mut absent: Vec<&str> = Vec::new();
        let mut not_executable: Vec<&str> = Vec::new();
        for name in std::iter::once("kube-apiserver").chain(needs.iter().copied()) {
            if absent.contains(&name) || not_executable.contains(&name) {
                continue;
            }
            match files.file(&dir.join(name)) {
                FileState::Executable => {}
                FileState::NotExecutable => not_executable.push(name),
                FileState::Absent => absent.push(name),
            }
        }
        let etcd = Some(dir.join("etcd"))
            .filter(|p| files.file(p) == FileState::Executable)
            .or_else(|| {
                std::env::split_paths(env.path.as_deref()?)
                    .map(|d| d.join("etcd"))
                    .find(|p| files.file(p) == FileState::Executable)
            });
        let mut problems = Vec::new();
        if !absent.is_empty() {
            problems.push(format!("{named} has no {}", absent.join(", ")));
        }
        if !not_executable.is_empty() {
            problems.push(format!(
                "{} in {} {} not executable",
                not_executable.join(", "),
                dir.display(),
                if not_executable.len() == 1 {
                    "is"
                } else {
                    "are"
                },
            ));
        }
        if etcd.is_none() {
            problems.push(format!(
                "no etcd in {} nor on PATH (Debian: apt-get install etcd-server)",
                dir.display()
            ));
        }
        match etcd {
            Some(etcd) if problems.is_empty() => Ok(Binaries {
                dir: dir.to_owned(),
                etcd,
            }),
            _ => Err(problems.join("; ")),
        }
    }

    /// [`locate`](Self::locate) in this process's environment and file
    /// system, with [`verdict`] applied.
    pub fn lookup_verdict(needs: &[&str]) -> Verdict<Binaries> {
        let env = BinEnv::from_process();
        let default_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/k8s");
        let default_dir = default_dir.canonicalize().unwrap_or(default_dir);
        match verdict(
            &env,
            Binaries::locate(&env, &default_dir, needs, &RealFiles),
        ) {
            Verdict::Run(mut bins) => {
                bins.dir = bins.dir.canonicalize().unwrap_or(bins.dir);
                Verdict::Run(bins)
            }
            other => other,
        }
    }

    /// [`lookup_verdict`](Self::lookup_verdict) as a `Result`: `Err` only
    /// when skipping is allowed; panics, naming what is missing, when it is
    /// not.
    pub fn lookup(needs: &[&str]) -> Result<Binaries, Error> {
        match Binaries::lookup_verdict(needs) {
            Verdict::Run(bins) => Ok(bins),
            Verdict::Skip(missing) => Err(Error::Unavailable(missing)),
            Verdict::Fail(message) => panic!("real-cluster binaries: {message}"),
        }
    }

    /// [`lookup`](Self::lookup) of `kube-apiserver` and `etcd`: `Err` only
    /// when skipping is allowed, else panics naming what is missing.
    pub fn from_env() -> Result<Binaries, Error> {
        Binaries::lookup(&[])
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn has(&self, name: &str) -> bool {
        RealFiles.file(&self.path(name)) == FileState::Executable
    }

    /// The binary `name` that `test` needs beyond its [`Config`] (the
    /// upstream `csi-provisioner`, `hostpathplugin`): `None` after one
    /// `SKIPPED real-cluster test` line when it is missing and skipping is
    /// allowed; panics naming it when skipping is not allowed.
    pub fn require(&self, name: &str, test: &str) -> Option<PathBuf> {
        let path = self.path(name);
        let found = match RealFiles.file(&path) {
            FileState::Executable => Ok(path),
            FileState::NotExecutable => Err(format!("{} is not executable", path.display())),
            FileState::Absent => Err(format!("{} has no {name}", self.dir.display())),
        };
        run_or_skip(found, test)
    }

    /// The folder `name` of the binaries' folder that `test` needs (the
    /// snapshot CRDs of `install.sh`, `crd`), with the same skip-or-fail
    /// decision as [`require`](Self::require).
    pub fn require_dir(&self, name: &str, test: &str) -> Option<PathBuf> {
        let path = self.path(name);
        let found = if path.is_dir() {
            Ok(path)
        } else {
            Err(format!("{} has no folder {name}", self.dir.display()))
        };
        run_or_skip(found, test)
    }
}

/// What [`Binaries::locate`] knows of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileState {
    Absent,
    NotExecutable,
    Executable,
}

/// The file system as [`Binaries::locate`] sees it.
pub trait Files {
    fn is_dir(&self, path: &Path) -> bool;
    fn file(&self, path: &Path) -> FileState;
}

/// This machine's file system (following symbolic links).
pub struct RealFiles;

impl Files for RealFiles {
    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn file(&self, path: &Path) -> FileState {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => FileState::Executable,
            Ok(m) if m.is_file() => FileState::NotExecutable,
            _ => FileState::Absent,
        }
    }
}

/// Which components run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config {
    /// `--controllers` of kube-controller-manager (`*` for the defaults,
    /// `*,-pvc-protection` to turn one off); `None`: no controller-manager.
    pub controllers: Option<String>,
    pub scheduler: bool,
    /// `--feature-gates` of kube-apiserver (e.g. an alpha API field).
    pub apiserver_feature_gates: Option<String>,
    /// `--runtime-config` of kube-apiserver (e.g. an API it serves by
    /// default turned off, as on an older cluster).
    pub apiserver_runtime_config: Option<String>,
    /// `--kube-api-qps` of kube-controller-manager; `None`: its default
    /// (20), which paces binding and the storage-provisioner annotation.
    pub controller_manager_qps: Option<u32>,
    /// An etcd binary of its own instead of the folder's or `PATH`'s (e.g.
    /// etcd 3.5, whose progress requests kube-apiserver uses to bring its
    /// watch cache up to date for a consistent read; see [`ETCD35_DIR_VAR`]).
    pub etcd: Option<PathBuf>,
}

impl Config {
    /// API server and controller-manager with its default controllers.
    pub fn standard() -> Config {
        Config {
            controllers: Some("*".to_owned()),
            scheduler: false,
            apiserver_feature_gates: None,
            apiserver_runtime_config: None,
            controller_manager_qps: None,
            etcd: None,
        }
    }

    /// The controller-manager without `off` (e.g. `pvc-protection`).
    pub fn without_controllers(off: &[&str]) -> Config {
        let mut list = String::from("*");
        for c in off {
            list.push_str(",-");
            list.push_str(c);
        }
        Config {
            controllers: Some(list),
            scheduler: false,
            apiserver_feature_gates: None,
            apiserver_runtime_config: None,
            controller_manager_qps: None,
            etcd: None,
        }
    }

    pub fn with_scheduler(mut self) -> Config {
        self.scheduler = true;
        self
    }

    /// kube-controller-manager with `--kube-api-qps=<qps>` (burst twice
    /// that): for benchmarks of what the controller-manager waits on.
    pub fn with_controller_manager_qps(mut self, qps: u32) -> Config {
        self.controller_manager_qps = Some(qps);
        self
    }

    /// kube-apiserver with `--feature-gates=<gates>`.
    pub fn with_apiserver_feature_gates(mut self, gates: &str) -> Config {
        self.apiserver_feature_gates = Some(gates.to_owned());
        self
    }

    /// etcd from `binary` (see [`Config::etcd`]).
    pub fn with_etcd(mut self, binary: &Path) -> Config {
        self.etcd = Some(binary.to_owned());
        self
    }

    /// kube-apiserver with `--runtime-config=<config>`.
    pub fn with_apiserver_runtime_config(mut self, config: &str) -> Config {
        self.apiserver_runtime_config = Some(config.to_owned());
        self
    }

    /// The binaries of the folder this configuration starts.
    pub fn needs(&self) -> Vec<&'static str> {
        let mut names = vec!["kube-apiserver"];
        if self.controllers.is_some() {
            names.push("kube-controller-manager");
        }
        if self.scheduler {
            names.push("kube-scheduler");
        }
        names
    }
}

#[derive(Debug, Clone, Copy)]
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

/// A loopback port nothing listens on now, for a process started later to
/// bind. Taken below the kernel's ephemeral range (32768 and up by
/// default): a port the kernel hands out (to any outgoing connection, or a
/// listener on port 0) could otherwise take it between this check and the
/// bind, as a chaos seed once saw (its sidecar's `--http-endpoint` taken
/// under load). Ports go round a window starting at a place of this
/// process's own, so test binaries running at once rarely meet, and never
/// repeat within a process until the window is used up.
pub fn free_port() -> Result<u16, Error> {
    let base = PORT_WINDOW.start + (std::process::id() % 97) as u16 * 64;
    let span = PORT_WINDOW.end - PORT_WINDOW.start;
    for _ in 0..span {
        let step = NEXT_PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = PORT_WINDOW.start + (base - PORT_WINDOW.start + (step % span)) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    // Every port of the window in use: the kernel's choice, as before.
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Where [`free_port`] picks: below the ephemeral range, above the
/// well-known ports of a node (the kubelet's 10250, 20248 and 20250).
const PORT_WINDOW: std::ops::Range<u16> = 21_000..32_000;

static NEXT_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

#[derive(Default)]
struct Processes {
    etcd: Option<GuardedChild>,
    apiserver: Option<GuardedChild>,
    controller_manager: Option<GuardedChild>,
    scheduler: Option<GuardedChild>,
    snapshot_controller: Option<GuardedChild>,
}

/// A running control plane.
pub struct ControlPlane {
    dir: PathBuf,
    _dir_guard: Option<tempfile::TempDir>,
    _dir_watchdog: (std::process::Child, std::process::ChildStdin),
    bins: Binaries,
    config: Config,
    ports: Ports,
    pki: pki::Pki,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    admin_kubeconfig: PathBuf,
    /// The API server's client certificate towards kubelets (`kubectl
    /// logs/exec`, in `system:masters`).
    kubelet_client: pki::ClientCert,
    audit_log: PathBuf,
    processes: Mutex<Processes>,
    /// The outcome of [`ControlPlane::start_snapshot_controller`], once
    /// tried: the snapshot CRDs and controller are set up once per plane.
    snapshots: Mutex<Option<Result<(), String>>>,
}

impl ControlPlane {
    /// The control plane of this test process for `config`, started on first
    /// use. `None` (after printing why, past the test harness's output
    /// capture) when a binary `config` needs is not there and skipping is
    /// allowed ([`BinEnv::no_skip_reason`]); panics naming what is missing
    /// when skipping is not allowed, and when the binaries are there but the
    /// control plane cannot start, so a broken setup fails the test.
    pub fn shared(config: &Config, test: &str) -> Option<&'static ControlPlane> {
        static PLANES: OnceLock<Mutex<HashMap<Config, Result<&'static ControlPlane, String>>>> =
            OnceLock::new();
        let bins = match Binaries::lookup_verdict(&config.needs()) {
            Verdict::Run(mut bins) => {
                if let Some(etcd) = &config.etcd {
                    bins.etcd = etcd.clone();
                }
                bins
            }
            Verdict::Skip(missing) => {
                skip(test, &missing);
                return None;
            }
            Verdict::Fail(message) => panic!("real-cluster test {test} cannot run: {message}"),
        };
        let mut planes = PLANES
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entry = planes.entry(config.clone()).or_insert_with(|| {
            ControlPlane::start(bins, config.clone())
                .map(|plane| &*Box::leak(Box::new(plane)))
                .map_err(|e| e.to_string())
        });
        match entry {
            Ok(plane) => Some(*plane),
            Err(e) => panic!("the real control plane did not start: {e}"),
        }
    }

    /// Starts a control plane of its own (benchmarks; tests use
    /// [`shared`](Self::shared)). Blocks until every component is ready.
    pub fn start(bins: Binaries, config: Config) -> Result<ControlPlane, Error> {
        // etcd fsyncs on every write: on tmpfs that costs nothing.
        let shm = Path::new("/dev/shm");
        let guard = if shm.is_dir() {
            tempfile::Builder::new()
                .prefix("controlplane-")
                .tempdir_in(shm)?
        } else {
            tempfile::Builder::new().prefix("controlplane-").tempdir()?
        };
        let dir = guard.path().to_owned();
        let dir_watchdog = process::remove_on_exit(&dir)?;
        let pki = pki::Pki::create(&dir.join("pki"))?;
        let ports = Ports {
            etcd_client: free_port()?,
            etcd_peer: free_port()?,
            apiserver: free_port()?,
            controller_manager: free_port()?,
            scheduler: free_port()?,
        };
        let server = format!("https://127.0.0.1:{}", ports.apiserver);
        let admin = pki.client("controlplane-admin", Some("system:masters"))?;
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(&admin_kubeconfig, &server, &pki.ca_cert, &admin)?;
        let kubelet_client = pki.client("kube-apiserver-kubelet-client", Some("system:masters"))?;
        std::fs::write(dir.join("audit-policy.yaml"), audit::POLICY)?;
        let plane = ControlPlane {
            audit_log: dir.join("audit.log"),
            dir,
            _dir_guard: Some(guard),
            _dir_watchdog: dir_watchdog,
            bins,
            config,
            ports,
            pki,
            server,
            admin_kubeconfig,
            kubelet_client,
            processes: Mutex::default(),
            snapshots: Mutex::new(None),
        };
        plane.start_etcd()?;
        plane.start_apiserver()?;
        if plane.config.controllers.is_some() {
            plane.start_controller_manager()?;
        }
        if plane.config.scheduler {
            plane.start_scheduler()?;
        }
        Ok(plane)
    }

    fn processes(&self) -> std::sync::MutexGuard<'_, Processes> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn binaries(&self) -> &Binaries {
        &self.bins
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.log"))
    }

    /// The last `lines` lines of a component's log (`etcd`,
    /// `kube-apiserver`, `kube-controller-manager`, `kube-scheduler`).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(component)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    pub fn ca_cert(&self) -> &Path {
        &self.pki.ca_cert
    }

    /// The CA's private key: a node signs its kubelet's client certificate
    /// with it (see [`node`]).
    pub fn ca_key(&self) -> &Path {
        &self.pki.ca_key_file
    }

    pub fn audit_log(&self) -> &Path {
        &self.audit_log
    }

    /// Every finished request so far.
    pub fn audit(&self) -> Vec<audit::Request> {
        audit::read(&self.audit_log)
    }

    /// A kubeconfig for `user` (client certificate; in `group` when given),
    /// for RBAC tests and for telling apart the requests of several
    /// processes in the audit log.
    pub fn kubeconfig_for(&self, user: &str, group: Option<&str>) -> Result<PathBuf, Error> {
        let cert = self.pki.client(user, group)?;
        let path = self.dir.join(format!("{}.kubeconfig", pki::sanitize(user)));
        write_kubeconfig(&path, &self.server, &self.pki.ca_cert, &cert)?;
        Ok(path)
    }

    /// An admin client. Call from within a tokio runtime.
    pub async fn admin_client(&self) -> Result<kube::Client, Error> {
        client_from(&self.admin_kubeconfig).await
    }

    fn start_etcd(&self) -> Result<(), Error> {
        let p = self.ports;
        let mut cmd = Command::new(&self.bins.etcd);
        cmd.arg(format!("--data-dir={}", self.dir.join("etcd").display()))
            .arg(format!(
                "--listen-client-urls=http://127.0.0.1:{}",
                p.etcd_client
            ))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{}",
                p.etcd_client
            ))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{}",
                p.etcd_peer
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                p.etcd_peer
            ))
            .arg(format!(
                "--initial-cluster=default=http://127.0.0.1:{}",
                p.etcd_peer
            ))
            .arg("--log-level=warn");
        let child = GuardedChild::spawn("etcd", cmd, &self.log_path("etcd"))?;
        self.processes().etcd = Some(child);
        wait_port("etcd", p.etcd_client, Duration::from_secs(30), || {
            self.log_tail("etcd", 20)
        })
    }

    /// Starts kube-apiserver and waits for `/readyz`.
    pub fn start_apiserver(&self) -> Result<(), Error> {
        let p = self.ports;
        let pki = &self.pki;
        let mut cmd = Command::new(self.bins.path("kube-apiserver"));
        cmd.arg(format!("--etcd-servers=http://127.0.0.1:{}", p.etcd_client))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={}", p.apiserver))
            .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.serving_key.display()
            ))
            .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
            .arg(format!(
                "--service-account-key-file={}",
                pki.service_account_public_key.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.service_account_key.display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--authorization-mode=Node,RBAC")
            // A real node (see `node`): `kubectl logs/exec` go through the
            // kubelet, which knows this client, at the node's InternalIP
            // (its name does not resolve here).
            .arg(format!(
                "--kubelet-client-certificate={}",
                self.kubelet_client.cert.display()
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                self.kubelet_client.key.display()
            ))
            .arg("--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP")
            // A CSI node plugin's pod is privileged (it mounts).
            .arg("--allow-privileged=true")
            .arg("--enable-priority-and-fairness=false")
            .arg(format!(
                "--audit-policy-file={}",
                self.dir.join("audit-policy.yaml").display()
            ))
            .arg(format!("--audit-log-path={}", self.audit_log.display()))
            .arg("--audit-log-maxsize=0");
        if let Some(gates) = &self.config.apiserver_feature_gates {
            cmd.arg(format!("--feature-gates={gates}"));
        }
        if let Some(config) = &self.config.apiserver_runtime_config {
            cmd.arg(format!("--runtime-config={config}"));
        }
        let child = GuardedChild::spawn("kube-apiserver", cmd, &self.log_path("kube-apiserver"))?;
        self.processes().apiserver = Some(child);
        self.wait_ready(Duration::from_secs(60))
    }

    /// SIGKILLs kube-apiserver (etcd keeps the data): clients see their
    /// connections reset and, once it is back, `410 Gone` for watches from
    /// before.
    pub fn kill_apiserver(&self) {
        if let Some(mut child) = self.processes().apiserver.take() {
            child.kill();
        }
    }

    /// Kills and restarts kube-apiserver; returns once it is ready again.
    pub fn restart_apiserver(&self) -> Result<(), Error> {
        self.kill_apiserver();
        self.start_apiserver()
    }

    /// SIGKILLs etcd, waits `down`, and starts it again on the same data
    /// directory (a crash and a restart of the database: kube-apiserver
    /// keeps running, answering errors meanwhile, and its watches on etcd
    /// resume from their revisions); returns once kube-apiserver is ready
    /// again.
    pub fn kill_and_restart_etcd(&self, down: Duration) -> Result<(), Error> {
        if let Some(mut child) = self.processes().etcd.take() {
            child.kill();
        }
        std::thread::sleep(down);
        self.start_etcd()?;
        self.wait_ready(Duration::from_secs(60))
    }

    /// Compacts etcd's history up to its current revision (etcd's v3 JSON
    /// gateway, no etcdctl needed) and returns that revision: every read or
    /// watch from an older revision is gone from etcd. With a restart of
    /// kube-apiserver after it, every client's re-watch gets `410 Gone`.
    pub fn compact_etcd(&self) -> Result<i64, Error> {
        let port = self.ports.etcd_client;
        // The key "/" (base64): any key gives the header's revision.
        let range = etcd_post(port, "/v3/kv/range", r#"{"key":"Lw==","limit":1}"#)?;
        let revision = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
            .or_else(|| range["header"]["revision"].as_i64())
            .ok_or_else(|| {
                Error::Unavailable(format!("etcd range answer without a revision: {range}"))
            })?;
        let body =
            serde_json::json!({"revision": revision.to_string(), "physical": true}).to_string();
        etcd_post(port, "/v3/kv/compaction", &body)?;
        Ok(revision)
    }

    /// Starts kube-controller-manager with the configured controllers.
    pub fn start_controller_manager(&self) -> Result<(), Error> {
        let controllers = self
            .config
            .controllers
            .clone()
            .unwrap_or_else(|| "*".into());
        // Its own user and one service account per controller, as kubeadm
        // runs it: the audit log then tells each controller's writes apart
        // (`system:serviceaccount:kube-system:pvc-protection-controller`).
        let kubeconfig = self.kubeconfig_for("system:kube-controller-manager", None)?;
        let pki = &self.pki;
        let mut cmd = Command::new(self.bins.path("kube-controller-manager"));
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--controllers={controllers}"))
            .args(self.config.controller_manager_qps.iter().flat_map(|qps| {
                [
                    format!("--kube-api-qps={qps}"),
                    format!("--kube-api-burst={}", qps * 2),
                ]
            }))
            .arg("--leader-elect=false")
            .arg(format!(
                "--service-account-private-key-file={}",
                pki.service_account_key.display()
            ))
            .arg(format!("--root-ca-file={}", pki.ca_cert.display()))
            .arg(format!(
                "--cluster-signing-cert-file={}",
                pki.ca_cert.display()
            ))
            .arg(format!(
                "--cluster-signing-key-file={}",
                pki.ca_key_file.display()
            ))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.ports.controller_manager))
            .arg("--use-service-account-credentials=true");
        let child = GuardedChild::spawn(
            "kube-controller-manager",
            cmd,
            &self.log_path("kube-controller-manager"),
        )?;
        self.processes().controller_manager = Some(child);
        wait_port(
            "kube-controller-manager",
            self.ports.controller_manager,
            Duration::from_secs(60),
            || self.log_tail("kube-controller-manager", 20),
        )
    }

    /// Starts kube-controller-manager again when it has exited (it exits
    /// when it loses its API server while starting or when it cannot renew
    /// its lease), as the kubelet restarts a static pod; true when it did.
    pub fn revive_controller_manager(&self) -> Result<bool, Error> {
        let exited = {
            let mut processes = self.processes();
            let exited = processes
                .controller_manager
                .as_mut()
                .is_some_and(|child| !child.is_running());
            if exited {
                processes.controller_manager = None;
            }
            exited
        };
        if exited {
            self.start_controller_manager()?;
        }
        Ok(exited)
    }

    pub fn stop_controller_manager(&self) {
        if let Some(mut child) = self.processes().controller_manager.take() {
            child.stop(Duration::from_secs(5));
        }
    }

    pub fn start_scheduler(&self) -> Result<(), Error> {
        let kubeconfig = self.kubeconfig_for("system:kube-scheduler", None)?;
        let mut cmd = Command::new(self.bins.path("kube-scheduler"));
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.ports.scheduler));
        let child = GuardedChild::spawn("kube-scheduler", cmd, &self.log_path("kube-scheduler"))?;
        self.processes().scheduler = Some(child);
        wait_port(
            "kube-scheduler",
            self.ports.scheduler,
            Duration::from_secs(60),
            || self.log_tail("kube-scheduler", 20),
        )
    }

    /// The snapshot machinery of a cluster, set up once per control plane
    /// (later calls return the first outcome at once): the CustomResourceDefinitions
    /// of every `*.yaml` in `crd_dir` (the six snapshot CRDs of
    /// `install.sh`), applied server-side and waited for until Established,
    /// then one `snapshot-controller` (the binary `controller`) as the
    /// cluster-admin user `snapshot-controller`, with short retries so a
    /// snapshot whose deletion waits for a restore is looked at again
    /// within seconds. Its log is [`log_path`](Self::log_path)`("snapshot-controller")`.
    /// Each driver still needs its `csi-snapshotter` (see
    /// [`csi_snapshotter_command`](Self::csi_snapshotter_command)).
    pub fn start_snapshot_controller(
        &self,
        controller: &Path,
        crd_dir: &Path,
    ) -> Result<(), Error> {
        let mut done = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(outcome) = &*done {
            return outcome.clone().map_err(Error::Unavailable);
        }
        let outcome = self
            .install_crds(crd_dir)
            .and_then(|()| self.spawn_snapshot_controller(controller));
        *done = Some(outcome.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        outcome
    }

    /// Whether [`start_snapshot_controller`](Self::start_snapshot_controller)
    /// succeeded and the controller still runs.
    pub fn snapshot_controller_running(&self) -> bool {
        self.processes()
            .snapshot_controller
            .as_mut()
            .is_some_and(GuardedChild::is_running)
    }

    /// Creates (or server-side applies over) every CustomResourceDefinition
    /// in the `*.yaml` files of `dir` and waits until each is Established.
    pub fn install_crds(&self, dir: &Path) -> Result<(), Error> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use serde::Deserialize as _;
        let mut crds: Vec<CustomResourceDefinition> = Vec::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        for file in &files {
            let text = std::fs::read_to_string(file)?;
            for document in serde_yaml_ng::Deserializer::from_str(&text) {
                let value = serde_yaml_ng::Value::deserialize(document)
                    .map_err(|e| Error::Client(format!("{}: {e}", file.display())))?;
                if value.is_null() {
                    continue;
                }
                let crd: CustomResourceDefinition = serde_yaml_ng::from_value(value)
                    .map_err(|e| Error::Client(format!("{}: {e}", file.display())))?;
                crds.push(crd);
            }
        }
        if crds.is_empty() {
            return Err(Error::Unavailable(format!(
                "no CustomResourceDefinition in {}",
                dir.display()
            )));
        }
        let kubeconfig = self.admin_kubeconfig.clone();
        run_blocking(async move {
            use kube::api::{Api, Patch, PatchParams};
            let client = client_from(&kubeconfig).await?;
            let api: Api<CustomResourceDefinition> = Api::all(client);
            let params = PatchParams::apply("controlplane").force();
            let mut names = Vec::new();
            for mut crd in crds {
                let name = crd.metadata.name.clone().unwrap_or_default();
                crd.metadata.managed_fields = None;
                crd.metadata.resource_version = None;
                crd.status = None;
                let mut body =
                    serde_json::to_value(&crd).map_err(|e| Error::Client(e.to_string()))?;
                body["apiVersion"] = "apiextensions.k8s.io/v1".into();
                body["kind"] = "CustomResourceDefinition".into();
                api.patch(&name, &params, &Patch::Apply(body))
                    .await
                    .map_err(|e| Error::Client(format!("apply CRD {name}: {e}")))?;
                names.push(name);
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            for name in names {
                loop {
                    let established = api
                        .get_opt(&name)
                        .await
                        .map_err(|e| Error::Client(e.to_string()))?
                        .and_then(|c| c.status?.conditions)
                        .is_some_and(|conditions| {
                            conditions
                                .iter()
                                .any(|c| c.type_ == "Established" && c.status == "True")
                        });
                    if established {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(Error::Unavailable(format!(
                            "CRD {name} not Established within 60s"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Ok(())
        })
    }

    fn spawn_snapshot_controller(&self, controller: &Path) -> Result<(), Error> {
        let kubeconfig = self.kubeconfig_for("snapshot-controller", Some("system:masters"))?;
        let mut cmd = Command::new(controller);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--leader-election=false")
            .arg("--kube-api-qps=50")
            .arg("--kube-api-burst=100")
            .arg("--retry-interval-start=200ms")
            .arg("--retry-interval-max=2s")
            .arg("--v=4");
        let log = self.log_path("snapshot-controller");
        let mut child = GuardedChild::spawn("snapshot-controller", cmd, &log)?;
        // It checks the CRDs and fills its informers within about a second;
        // an early exit (CRDs missing, kubeconfig refused) is a failure.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait() {
                return Err(Error::NotReady {
                    component: "snapshot-controller",
                    seconds: 5,
                    log: format!(
                        "exited with {status}: {}",
                        self.log_tail("snapshot-controller", 30)
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.processes().snapshot_controller = Some(child);
        Ok(())
    }

    /// The command line of a `csi-snapshotter` (the binary `snapshotter`)
    /// for the driver at `csi_address`, as the cluster-admin user `user`:
    /// short retries and timeouts as the tests' sidecars have. The caller
    /// runs it (e.g. as a [`GuardedChild`]) next to its driver.
    pub fn csi_snapshotter_command(
        &self,
        snapshotter: &Path,
        csi_address: &Path,
        user: &str,
    ) -> Result<Command, Error> {
        let kubeconfig = self.kubeconfig_for(user, Some("system:masters"))?;
        let mut cmd = Command::new(snapshotter);
        cmd.arg(format!("--csi-address={}", csi_address.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--leader-election=false")
            .arg("--kube-api-qps=50")
            .arg("--kube-api-burst=100")
            .arg("--retry-interval-start=200ms")
            .arg("--retry-interval-max=2s")
            .arg("--timeout=30s")
            .arg("--v=4")
            .env_remove("KUBECONFIG");
        Ok(cmd)
    }

    /// Polls `/readyz` until it answers ok.
    fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let kubeconfig = self.admin_kubeconfig.clone();
        let deadline = Instant::now() + timeout;
        let ready = run_blocking(async move {
            let client = loop {
                match client_from(&kubeconfig).await {
                    Ok(c) => break c,
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(e) => return Err(e),
                }
            };
            loop {
                let req = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| Error::Client(e.to_string()))?;
                if let Ok(text) = client.request_text(req).await
                    && text.trim() == "ok"
                {
                    return Ok(true);
                }
                if Instant::now() > deadline {
                    return Ok(false);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })?;
        if ready {
            Ok(())
        } else {
            Err(Error::NotReady {
                component: "kube-apiserver",
                seconds: timeout.as_secs(),
                log: self.log_tail("kube-apiserver", 30),
            })
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let mut procs = self.processes();
        for child in [
            procs.snapshot_controller.take(),
            procs.scheduler.take(),
            procs.controller_manager.take(),
            procs.apiserver.take(),
            procs.etcd.take(),
        ]
        .into_iter()
        .flatten()
        {
            let mut child = child;
            child.stop(Duration::from_secs(5));
        }
    }
}

/// Prints past the test harness's capture (it captures `print!`, not
/// writes to the stderr handle), so a skip is never silent.
/// Panics instead (naming `why`) when skipping is not allowed
/// ([`BinEnv::no_skip_reason`]).
pub fn skip(test: &str, why: &str) {
    if let Verdict::Fail(message) = verdict::<()>(&BinEnv::from_process(), Err(why.to_owned())) {
        panic!("real-cluster test {test} cannot run: {message}");
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED real-cluster test {test}: {why}; to run it, unpack the binaries with `../shared/k8s/install.sh target/k8s` or set {BIN_DIR_VAR} (or {ENVTEST_VAR}) to a folder with kube-apiserver and kube-controller-manager"
    );
}

/// A client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> Result<kube::Client, Error> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Client(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    cert: &pki::ClientCert,
) -> Result<(), Error> {
    let text = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "controlplane", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "user", "user": {"client-certificate": cert.cert, "client-key": cert.key}}],
        "contexts": [{"name": "controlplane", "context": {"cluster": "controlplane", "user": "user"}}],
        "current-context": "controlplane",
    });
    std::fs::write(
        path,
        serde_yaml_ng::to_string(&text).map_err(|e| Error::Client(e.to_string()))?,
    )?;
    Ok(())
}

fn wait_port(
    component: &'static str,
    port: u16,
    timeout: Duration,
    log: impl Fn() -> String,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(Error::NotReady {
        component,
        seconds: timeout.as_secs(),
        log: log(),
    })
}

/// Runs a future on a runtime of its own in a thread of its own: callers
/// may be inside a (test's) runtime, where `block_on` is not allowed.
pub fn run_blocking<T: Send + 'static>(
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for the control plane");
        runtime.block_on(future)
    })
    .join()
    .expect("control plane helper thread panicked")
}

/// One POST to etcd's JSON gateway on loopback (HTTP/1.0: the answer ends
/// with the connection).
fn etcd_post(port: u16, path: &str, body: &str) -> Result<serde_json::Value, Error> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, json) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::Unavailable(format!("etcd {path}: no HTTP answer: {answer:?}")))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(Error::Unavailable(format!("etcd {path}: {head} {json}")));
    }
    serde_json::from_str(json).map_err(|e| Error::Unavailable(format!("etcd {path}: {e}: {json}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports come from below the ephemeral range, bindable, and not twice
    /// in a row (the window goes round).
    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_do_not_repeat() {
        let first = free_port().expect("a port");
        let second = free_port().expect("a port");
        assert!(PORT_WINDOW.contains(&first), "{first}");
        assert!(PORT_WINDOW.contains(&second), "{second}");
        assert_ne!(first, second);
        TcpListener::bind(("127.0.0.1", second)).expect("free to bind");
    }

    /// A file system of `dirs` and `files` (name, executable).
    struct Fake {
        dirs: Vec<&'static str>,
        files: Vec<(&'static str, bool)>,
    }

    impl Files for Fake {
        fn is_dir(&self, path: &Path) -> bool {
            self.dirs.iter().any(|d| Path::new(d) == path)
        }

        fn file(&self, path: &Path) -> FileState {
            match self.files.iter().find(|(f, _)| Path::new(f) == path) {
                Some((_, true)) => FileState::Executable,
                Some((_, false)) => FileState::NotExecutable,
                None => FileState::Absent,
            }
        }
    }

    const DEFAULT: &str = "/repo/target/k8s";

    fn env(ci: Option<&str>, bin_dir: Option<&str>, envtest: Option<&str>) -> BinEnv {
        BinEnv {
            ci: ci.map(str::to_owned),
            bin_dir: bin_dir.map(PathBuf::from),
            envtest: envtest.map(PathBuf::from),
            path: Some(OsString::from("/usr/local/bin:/usr/bin")),
        }
    }

    /// `install.sh`'s folder, complete, and etcd on `PATH`.
    fn installed(dir: &'static str) -> Fake {
        let files = [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "csi-provisioner",
            "hostpathplugin",
        ]
        .iter()
        .map(|name| (&*format!("{dir}/{name}").leak(), true))
        .chain([("/usr/bin/etcd", true)])
        .collect();
        Fake {
            dirs: vec![dir],
            files,
        }
    }

    fn nothing() -> Fake {
        Fake {
            dirs: vec![],
            files: vec![("/usr/bin/etcd", true)],
        }
    }

    fn decide(env: &BinEnv, files: &Fake, config: &Config) -> Verdict<PathBuf> {
        let found = Binaries::locate(env, Path::new(DEFAULT), &config.needs(), files);
        verdict(env, found.map(|b| b.dir))
    }

    fn fail_text(v: Verdict<PathBuf>) -> String {
        match v {
            Verdict::Fail(text) => text,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn skipping_is_allowed_only_without_ci_and_without_a_named_folder() {
        for ci in [None, Some(""), Some("false"), Some("0"), Some("no")] {
            assert_eq!(env(ci, None, None).no_skip_reason(), None, "CI={ci:?}");
            assert_eq!(env(ci, Some(""), Some("")).no_skip_reason(), None);
        }
        for ci in ["true", "TRUE", "True", "1", " true "] {
            let reason = env(Some(ci), None, None).no_skip_reason();
            assert_eq!(reason, Some(format!("CI={ci}")));
        }
        assert_eq!(
            env(None, Some("/k8s"), None).no_skip_reason(),
            Some("K8S_BIN_DIR=/k8s is set".into())
        );
        assert_eq!(
            env(None, None, Some("/envtest")).no_skip_reason(),
            Some("KUBEBUILDER_ASSETS=/envtest is set".into())
        );
        assert!(
            env(Some("false"), Some("/k8s"), None)
                .no_skip_reason()
                .is_some()
        );
    }

    #[test]
    fn a_newcomer_without_binaries_skips_and_is_told_what_is_missing() {
        let v = decide(&env(None, None, None), &nothing(), &Config::standard());
        assert_eq!(
            v,
            Verdict::Skip(format!(
                "{DEFAULT} (neither K8S_BIN_DIR nor KUBEBUILDER_ASSETS is set): no such folder"
            ))
        );
        // A partial default folder: both missing binaries named.
        let files = Fake {
            dirs: vec![DEFAULT],
            files: vec![("/repo/target/k8s/kube-apiserver", true)],
        };
        let config = Config::standard().with_scheduler();
        assert_eq!(
            decide(&env(Some("false"), None, None), &files, &config),
            Verdict::Skip(format!(
                "{DEFAULT} (neither K8S_BIN_DIR nor KUBEBUILDER_ASSETS is set) has no \
                 kube-controller-manager, kube-scheduler; no etcd in {DEFAULT} nor on PATH \
                 (Debian: apt-get install etcd-server)"
            ))
        );
    }

    #[test]
    fn everything_there_runs_in_every_environment() {
        let config = Config::standard().with_scheduler();
        for e in [
            env(None, None, None),
            env(Some("true"), None, None),
            env(Some("1"), Some(DEFAULT), None),
        ] {
            assert_eq!(
                decide(&e, &installed(DEFAULT), &config),
                Verdict::Run(PathBuf::from(DEFAULT))
            );
        }
        // K8S_BIN_DIR before KUBEBUILDER_ASSETS, both before the default.
        let e = env(Some("true"), Some("/k8s"), Some("/envtest"));
        assert_eq!(
            decide(&e, &installed("/k8s"), &config),
            Verdict::Run(PathBuf::from("/k8s"))
        );
        let e = env(None, None, Some("/envtest"));
        assert_eq!(
            decide(&e, &installed("/envtest"), &config),
            Verdict::Run(PathBuf::from("/envtest"))
        );
        // etcd in the folder is taken before PATH's.
        let mut files = installed("/k8s");
        files.files.push(("/k8s/etcd", true));
        let found = Binaries::locate(
            &env(None, Some("/k8s"), None),
            Path::new(DEFAULT),
            &[],
            &files,
        );
        assert_eq!(found.expect("found").etcd, PathBuf::from("/k8s/etcd"));
    }

    #[test]
    fn ci_fails_instead_of_skipping_and_names_what_is_missing() {
        let text = fail_text(decide(
            &env(Some("true"), None, None),
            &nothing(),
            &Config::standard(),
        ));
        assert!(
            text.starts_with(&format!(
                "{DEFAULT} (neither K8S_BIN_DIR nor KUBEBUILDER_ASSETS is set): no such folder; \
                 CI=true, so a missing binary fails the test instead of skipping it"
            )),
            "{text}"
        );
        // A folder named but absent: fails even without CI.
        let text = fail_text(decide(
            &env(None, Some("/nonexistent"), None),
            &nothing(),
            &Config::standard(),
        ));
        assert!(
            text.starts_with(
                "K8S_BIN_DIR=/nonexistent: no such folder; K8S_BIN_DIR=/nonexistent is set, so"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_named_folder_without_what_a_config_needs_fails() {
        // envtest's folder: an API server and etcd, no controller-manager.
        let envtest = Fake {
            dirs: vec!["/envtest"],
            files: vec![("/envtest/kube-apiserver", true), ("/envtest/etcd", true)],
        };
        let e = env(None, None, Some("/envtest"));
        assert_eq!(
            decide(
                &e,
                &envtest,
                &Config {
                    controllers: None,
                    ..Config::standard()
                }
            ),
            Verdict::Run(PathBuf::from("/envtest"))
        );
        let text = fail_text(decide(&e, &envtest, &Config::standard().with_scheduler()));
        assert!(
            text.starts_with(
                "KUBEBUILDER_ASSETS=/envtest has no kube-controller-manager, kube-scheduler; \
                 KUBEBUILDER_ASSETS=/envtest is set, so"
            ),
            "{text}"
        );
        // No etcd anywhere.
        let mut files = installed("/k8s");
        files.files.retain(|(f, _)| !f.ends_with("/etcd"));
        let text = fail_text(decide(
            &env(Some("1"), Some("/k8s"), None),
            &files,
            &Config::standard(),
        ));
        assert!(
            text.starts_with(
                "no etcd in /k8s nor on PATH (Debian: apt-get install etcd-server); CI=1, so"
            ),
            "{text}"
        );
        // A binary there but not executable is broken, and said so.
        let mut files = installed("/k8s");
        files.files[1].1 = false;
        let text = fail_text(decide(
            &env(None, Some("/k8s"), None),
            &files,
            &Config::standard(),
        ));
        assert!(
            text.starts_with(
                "kube-controller-manager in /k8s is not executable; K8S_BIN_DIR=/k8s is set"
            ),
            "{text}"
        );
    }

    #[test]
    fn what_each_configuration_needs() {
        assert_eq!(
            Config::standard().needs(),
            ["kube-apiserver", "kube-controller-manager"]
        );
        assert_eq!(
            Config::without_controllers(&["statefulset"])
                .with_scheduler()
                .needs(),
            [
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler"
            ]
        );
        let no_cm = Config {
            controllers: None,
            ..Config::standard()
        };
        assert_eq!(no_cm.needs(), ["kube-apiserver"]);
    }

    #[test]
    #[should_panic(expected = "cannot run: left out")]
    fn skip_itself_refuses_when_skipping_is_not_allowed() {
        // The variables of this process decide; set one that forbids skips.
        // SAFETY: this crate's unit tests read no other variable of this kind
        // concurrently except through the same rule, which this only tightens.
        unsafe { std::env::set_var(CI_VAR, "true") };
        skip("skip_itself", "left out");
    }
}
