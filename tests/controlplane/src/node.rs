//! A real node joined to a [`ControlPlane`]: containerd, runc and a kubelet
//! from the node folder of the shared toolbox (`../shared/k8s/node`, see
//! its README.md), so that pods run, volumes are mounted by the kubelet and
//! CSI node plugins register through its plugin registry.
//!
//! The folder's `install-node.sh DEST` unpacks the binaries and images,
//! `start-node.sh` starts containerd and the kubelet with a state folder of
//! this test's (kubelet root `<state>/kubelet`), `stop-node.sh` stops them,
//! every container and the shims. A watchdog (as for every child process,
//! see [`crate::process`]) runs `stop-node.sh` when this process ends
//! however it ends, or when the [`Node`] is dropped, so a failed test never
//! leaves a kubelet behind.
//!
//! Only one node can run on a host (fixed interface, ports and containerd
//! socket): [`Node::start`] holds an exclusive lock on
//! [`HOST_LOCK`] while the node runs, so a second test process waits.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::{BIN_DIR_VAR, BinEnv, ControlPlane, Error, Verdict, verdict};

/// Names the node folder (default: `../shared/k8s/node` beside the
/// workspace).
pub const NODE_FILES_VAR: &str = "K8S_NODE_DIR";

/// The node's name (start-node.sh's default).
pub const NODE_NAME: &str = "labnode1";

/// The node's InternalIP (start-node.sh's default).
pub const NODE_IP: &str = "10.254.254.1";

/// Held while a node runs on this host.
pub const HOST_LOCK: &str = "/tmp/csi-provisioner-rs-real-node.lock";

const SCRIPTS: [&str; 3] = ["install-node.sh", "start-node.sh", "stop-node.sh"];

/// The node folder: the scripts (and the packed binaries and images
/// install-node.sh unpacks).
#[derive(Debug, Clone)]
pub struct NodeFiles {
    pub dir: PathBuf,
}

impl NodeFiles {
    /// The node folder per [`NODE_FILES_VAR`] (else `../shared/k8s/node`
    /// beside the workspace), and root, which the node needs. The skip or
    /// fail decision is [`verdict`]'s: a user without the folder sees a
    /// skip, CI ([`crate::CI_VAR`]) a failure. Naming the folder
    /// ([`NODE_FILES_VAR`]) also forbids skipping.
    pub fn lookup_verdict() -> Verdict<NodeFiles> {
        let named = std::env::var_os(NODE_FILES_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let mut env = BinEnv::from_process();
        if let Some(dir) = &named {
            // A named folder forbids skipping as a named binaries folder does.
            env.bin_dir = Some(dir.clone());
        }
        let dir = named.clone().unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/k8s/node")
        });
        let found = NodeFiles::check(&dir);
        verdict(&env, found)
    }

    fn check(dir: &Path) -> Result<NodeFiles, String> {
        let missing: Vec<&str> = SCRIPTS
            .iter()
            .copied()
            .filter(|s| !dir.join(s).is_file())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the node folder {} has no {} (set {NODE_FILES_VAR} to the folder of \
                 install-node.sh, start-node.sh and stop-node.sh)",
                dir.display(),
                missing.join(", ")
            ));
        }
        if !running_as_root() {
            return Err(
                "a real node needs root (mounts, network interfaces, containerd)".to_owned(),
            );
        }
        let dir = dir
            .canonicalize()
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(NodeFiles { dir })
    }

    /// [`lookup_verdict`](Self::lookup_verdict): `None` after one
    /// `SKIPPED` line when skipping is allowed, a panic naming what is
    /// missing when it is not.
    pub fn lookup(test: &str) -> Option<NodeFiles> {
        match NodeFiles::lookup_verdict() {
            Verdict::Run(files) => Some(files),
            Verdict::Skip(why) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED real-node test {test}: {why}; to run it, as root, put the node folder at \
                     ../shared/k8s/node or set {NODE_FILES_VAR} (and {BIN_DIR_VAR} for the control plane)"
                );
                None
            }
            Verdict::Fail(message) => panic!("real-node test {test} cannot run: {message}"),
        }
    }
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// A running node.
pub struct Node {
    install: PathBuf,
    state: PathBuf,
    state_guard: Option<tempfile::TempDir>,
    /// Runs stop-node.sh when its pipe closes (drop, or this process's end).
    watchdog: Option<(Child, ChildStdin)>,
    _host_lock: std::fs::File,
}

impl Node {
    /// Unpacks the node into `install_dir` (install-node.sh, idempotent),
    /// starts it against `plane` with a fresh state folder and returns once
    /// both daemons run (the Node object turns Ready a few seconds later:
    /// the caller waits for it with its own client).
    pub fn start(
        plane: &ControlPlane,
        files: &NodeFiles,
        install_dir: &Path,
    ) -> Result<Node, Error> {
        let host_lock = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(HOST_LOCK)?;
        host_lock.lock()?;
        run_script(
            Command::new(files.dir.join("install-node.sh")).arg(install_dir),
            "install-node.sh",
        )?;
        let install = install_dir.canonicalize()?;
        let state_guard = tempfile::Builder::new().prefix("real-node-").tempdir()?;
        let state = state_guard.path().to_owned();
        let env = [
            ("NODE_BIN", install.join("bin")),
            ("IMAGES", install.join("images")),
            ("NODE_DIR", state.clone()),
            // The stand-ins the upstream e2e suite needs under its own
            // names (the node folder's README.md, section "e2e.test"):
            // busybox 1.35 for the suite's busybox and for the nginx image
            // whose shell the "exec of files on the volume" spec uses.
            (
                "EXTRA_TAGS",
                PathBuf::from(
                    "docker.io/library/busybox:1.35.0=registry.k8s.io/e2e-test-images/busybox:1.37.0-1 \
                     docker.io/library/busybox:1.35.0=registry.k8s.io/e2e-test-images/nginx:1.15-4",
                ),
            ),
        ];
        // Armed before the start: a start that fails half-way is stopped too.
        let mut watchdog = Command::new("sh");
        watchdog
            .arg("-c")
            // stop-node.sh leaves containerd's sandbox mounts (its /dev/shm
            // per pod) below the state folder: unmounted here, then the
            // folder goes (when nothing is mounted there any more).
            .arg(
                "read _; \"$0\" >>\"$NODE_DIR/logs/stop-node.log\" 2>&1; \
                 findmnt -rn -o TARGET | grep \"^$NODE_DIR/\" | sort -r | \
                 while read -r m; do umount -l \"$m\"; done; \
                 findmnt -rn -o TARGET | grep -q \"^$NODE_DIR/\" || rm -rf \"$NODE_DIR\"",
            )
            .arg(files.dir.join("stop-node.sh"))
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut watchdog = watchdog.spawn()?;
        let pipe = watchdog
            .stdin
            .take()
            .ok_or_else(|| Error::Unavailable("node watchdog without stdin".to_owned()))?;
        let node = Node {
            install,
            state,
            state_guard: Some(state_guard),
            watchdog: Some((watchdog, pipe)),
            _host_lock: host_lock,
        };
        std::fs::create_dir_all(node.state.join("logs"))?;
        let mut start = Command::new(files.dir.join("start-node.sh"));
        start
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .env("CP_SERVER", &plane.server)
            .env("CP_CA_CRT", plane.ca_cert())
            .env("CP_CA_KEY", plane.ca_key())
            .env("RUNC", node.install.join("bin/runc"));
        run_script(&mut start, "start-node.sh")?;
        Ok(node)
    }

    /// The kubelet's `--root-dir`.
    pub fn kubelet_root(&self) -> PathBuf {
        self.state.join("kubelet")
    }

    /// A binary the node folder installed (`e2e.test`, `ctr`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.install.join("bin").join(name)
    }

    /// The node's state folder (containerd, kubelet, logs).
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The last `lines` lines of `kubelet` or `containerd`'s log.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.state.join("logs").join(format!("{component}.log")))
                .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Imports an OCI image archive into the node's containerd (namespace
    /// `k8s.io`, the kubelet's).
    pub fn import_image(&self, archive: &Path) -> Result<(), Error> {
        run_script(
            Command::new(self.install.join("bin/ctr"))
                .args([
                    "-a",
                    "/run/containerd/containerd.sock",
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                ])
                .args(["--platform", "linux/amd64"])
                .arg(archive),
            "ctr images import",
        )
    }

    /// Stops the node (stop-node.sh) and waits for it; the state folder is
    /// removed unless something is still mounted below it.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Some((mut watchdog, pipe)) = self.watchdog.take() {
            drop(pipe);
            let _ = watchdog.wait();
        }
        // The watchdog removed the folder unless something stayed mounted
        // below it; then it stays (TempDir would descend into the mounts).
        if let Some(guard) = self.state_guard.take() {
            let mounted = mounts_below(&self.state);
            if !mounted.is_empty() {
                let kept = guard.keep();
                let _ = writeln!(
                    std::io::stderr(),
                    "real node: {} kept, still mounted below it: {mounted:?}",
                    kept.display()
                );
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The mount points below `dir` (per `/proc/self/mountinfo`).
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|mount| mount.starts_with(dir))
        .collect()
}

/// Runs a node script to its end; its output goes to the error.
fn run_script(command: &mut Command, what: &str) -> Result<(), Error> {
    let out = command.stdin(Stdio::null()).output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Unavailable(format!(
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}
