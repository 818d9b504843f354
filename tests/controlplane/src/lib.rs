//! A real Kubernetes control plane on loopback, envtest-style: etcd,
//! kube-apiserver (RBAC and the audit log on), and optionally
//! kube-controller-manager and kube-scheduler, started from a folder of
//! upstream binaries named by [`BIN_DIR_VAR`] (or the ecosystem's
//! `KUBEBUILDER_ASSETS`).
//!
//! Tests share one control plane per test binary and configuration
//! ([`ControlPlane::shared`]) and isolate themselves by namespace and driver
//! name. Every process is stopped when the test process ends, even when it
//! panics or is killed ([`process`]). Without the binaries,
//! [`ControlPlane::shared`] prints one line saying what is skipped and which
//! variable enables it, and returns `None`.
//!
//! Binaries: `../shared/k8s/install.sh target/k8s` unpacks them here; anyone
//! else can point the variable at a folder holding `kube-apiserver` and
//! `kube-controller-manager` (and `kube-scheduler` for tests that schedule
//! pods) of Kubernetes 1.34 or later, e.g. from
//! `setup-envtest use -p path` plus a controller-manager from the release
//! tarball, and an `etcd` there or on `PATH`.

pub mod audit;
mod pki;
pub mod process;

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use process::GuardedChild;

/// The variable naming the folder of binaries.
pub const BIN_DIR_VAR: &str = "K8S_BIN_DIR";
/// Accepted too: what envtest's `setup-envtest` prints.
pub const ENVTEST_VAR: &str = "KUBEBUILDER_ASSETS";

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

/// Where the binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub dir: PathBuf,
    pub etcd: PathBuf,
}

impl Binaries {
    /// From [`BIN_DIR_VAR`] or [`ENVTEST_VAR`], else the workspace's
    /// `target/k8s` where `install.sh` puts them; `etcd` from that folder or
    /// `PATH`. Needs at least `kube-apiserver`.
    pub fn from_env() -> Result<Binaries, Error> {
        let default_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/k8s");
        let dir = std::env::var_os(BIN_DIR_VAR)
            .filter(|v| !v.is_empty())
            .or_else(|| std::env::var_os(ENVTEST_VAR).filter(|v| !v.is_empty()))
            .map(PathBuf::from)
            .or_else(|| default_dir.join("kube-apiserver").is_file().then_some(default_dir))
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "neither {BIN_DIR_VAR} nor {ENVTEST_VAR} is set and target/k8s has no kube-apiserver"
                ))
            })?;
        let dir = dir
            .canonicalize()
            .map_err(|e| Error::Unavailable(format!("{BIN_DIR_VAR}={}: {e}", dir.display())))?;
        if !dir.join("kube-apiserver").is_file() {
            return Err(Error::Unavailable(format!(
                "{} has no kube-apiserver",
                dir.display()
            )));
        }
        let etcd = if dir.join("etcd").is_file() {
            dir.join("etcd")
        } else {
            find_on_path("etcd").ok_or_else(|| {
                Error::Unavailable(format!(
                    "no etcd in {} nor on PATH (Debian: apt-get install etcd-server)",
                    dir.display()
                ))
            })?
        };
        Ok(Binaries { dir, etcd })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.path(name).is_file()
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
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
    /// `--kube-api-qps` of kube-controller-manager; `None`: its default
    /// (20), which paces binding and the storage-provisioner annotation.
    pub controller_manager_qps: Option<u32>,
}

impl Config {
    /// API server and controller-manager with its default controllers.
    pub fn standard() -> Config {
        Config {
            controllers: Some("*".to_owned()),
            scheduler: false,
            apiserver_feature_gates: None,
            controller_manager_qps: None,
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
            controller_manager_qps: None,
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

    fn needs(&self) -> Vec<&'static str> {
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

fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[derive(Default)]
struct Processes {
    etcd: Option<GuardedChild>,
    apiserver: Option<GuardedChild>,
    controller_manager: Option<GuardedChild>,
    scheduler: Option<GuardedChild>,
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
    audit_log: PathBuf,
    processes: Mutex<Processes>,
}

impl ControlPlane {
    /// The control plane of this test process for `config`, started on first
    /// use. `None` (after printing why, past the test harness's output
    /// capture) when the binaries are not there; panics when they are but
    /// the control plane cannot start, so a broken setup fails the test.
    pub fn shared(config: &Config, test: &str) -> Option<&'static ControlPlane> {
        static PLANES: OnceLock<Mutex<HashMap<Config, Result<&'static ControlPlane, String>>>> =
            OnceLock::new();
        let bins = match Binaries::from_env() {
            Ok(bins) => bins,
            Err(e) => {
                skip(test, &e.to_string());
                return None;
            }
        };
        if let Some(missing) = config.needs().into_iter().find(|b| !bins.has(b)) {
            skip(test, &format!("{} has no {missing}", bins.dir.display()));
            return None;
        }
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
            processes: Mutex::default(),
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
pub fn skip(test: &str, why: &str) {
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
        serde_yaml::to_string(&text).map_err(|e| Error::Client(e.to_string()))?,
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
