//! The one way the tests start a provisioner sidecar process: this build's
//! or the upstream Go image, next to the in-process driver of [`Env`] or a
//! driver of their own, one replica or several.
//!
//! A [`Launch`] is the command line: the binary, the driver's socket, the
//! kubeconfig, the namespace (`NAMESPACE`), the harness's flags
//! ([`HARNESS_FLAGS`]) and the test's own. The environment is the test
//! process's without what would change the run (`KUBECONFIG`, `RUST_LOG`,
//! `POD_NAME`), plus what the test names. [`Launch::spawn`] runs it under a
//! [`GuardedChild`] (killed with the test process) with stdout and stderr
//! in one log file; [`Launch::start`] also keeps the log's path, as a
//! [`Sidecar`].
//!
//! [`Env`]: super::Env

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use controlplane::GuardedChild;

/// The flags every test's sidecar runs with: quick retries, a CSI timeout
/// a test can wait out, and logs detailed enough for a failure message. A
/// test's own flag of the same name takes the place of one of these.
pub const HARNESS_FLAGS: &[&str] = &[
    "--retry-interval-start=100ms",
    "--retry-interval-max=1s",
    "--timeout=5s",
    "--v=4",
];

/// Environment variables the sidecar reads that a test sets only on
/// purpose ([`Launch::env`]), never by inheriting them.
const CLEARED_ENV: &[&str] = &["KUBECONFIG", "RUST_LOG", "POD_NAME"];

/// The binary under test: this build's, or the one named by
/// `CSI_PROVISIONER_BIN` (to show that a test fails on an older build).
pub fn sidecar_binary() -> PathBuf {
    std::env::var_os("CSI_PROVISIONER_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_csi-provisioner")))
}

/// A sidecar's command line (see the module's documentation).
#[derive(Clone, Debug)]
pub struct Launch {
    binary: PathBuf,
    socket: PathBuf,
    kubeconfig: PathBuf,
    namespace: String,
    flags: Vec<String>,
    env: Vec<(String, String)>,
}

impl Launch {
    /// [`sidecar_binary`] against the driver at `socket`, with
    /// `kubeconfig`, its objects (journal, Lease, capacity) in `namespace`.
    pub fn new(socket: &Path, kubeconfig: &Path, namespace: &str) -> Launch {
        Launch {
            binary: sidecar_binary(),
            socket: socket.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
            namespace: namespace.to_owned(),
            flags: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Runs `binary` instead (e.g. the upstream Go image).
    pub fn binary(mut self, binary: &Path) -> Launch {
        self.binary = binary.to_owned();
        self
    }

    /// Adds flags after the ones given so far.
    pub fn args<S: AsRef<str>>(mut self, flags: impl IntoIterator<Item = S>) -> Launch {
        self.flags
            .extend(flags.into_iter().map(|f| f.as_ref().to_owned()));
        self
    }

    /// Sets an environment variable (`NODE_NAME`, `POD_NAME`, ...).
    pub fn env(mut self, key: &str, value: &str) -> Launch {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The command, not started (to run it to its end, or to change it).
    pub fn command(&self) -> Command {
        let name = |flag: &str| flag.split_once('=').map_or(flag, |(n, _)| n).to_owned();
        let own: Vec<String> = self.flags.iter().map(|f| name(f)).collect();
        let mut command = Command::new(&self.binary);
        command
            .arg(format!("--csi-address={}", self.socket.display()))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(HARNESS_FLAGS.iter().filter(|f| !own.contains(&name(f))))
            .args(&self.flags);
        for key in CLEARED_ENV {
            command.env_remove(key);
        }
        command
            .env("NAMESPACE", &self.namespace)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Starts it as `name` (in messages), its output appended to `log`.
    pub fn spawn(&self, name: &str, log: &Path) -> GuardedChild {
        GuardedChild::spawn(name, self.command(), log)
            .unwrap_or_else(|e| panic!("spawn {name} ({}): {e}", self.binary.display()))
    }

    /// As [`Launch::spawn`], keeping the log's path with the process.
    pub fn start(&self, name: &str, log: &Path) -> Sidecar {
        Sidecar {
            name: name.to_owned(),
            child: Some(self.spawn(name, log)),
            log: log.to_owned(),
        }
    }
}

/// A sidecar process of a test's own (beside [`Env`]'s, or several
/// replicas), killed when dropped.
///
/// [`Env`]: super::Env
pub struct Sidecar {
    pub name: String,
    child: Option<GuardedChild>,
    log: PathBuf,
}

impl Sidecar {
    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its log under a header with its name, for failure messages.
    pub fn dump(&self) -> String {
        format!("--- {} ---\n{}", self.name, self.log())
    }

    /// Whether one log line contains every needle.
    pub fn logged(&self, needles: &[&str]) -> bool {
        self.log()
            .lines()
            .any(|line| needles.iter().all(|n| line.contains(n)))
    }

    /// Sends `signal` (a `kill` name: `STOP`, `CONT`, `TERM`) to the
    /// process, if it still runs.
    pub fn signal(&self, signal: &str) {
        if let Some(child) = self.child.as_ref() {
            let sent = std::process::Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status();
            assert!(
                sent.is_ok_and(|s| s.success()),
                "kill -{signal} {}",
                self.name
            );
        }
    }

    /// SIGKILL: no chance to clean up, as in a node crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// The exit code once the process ended, waiting at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let status = self.child.as_mut()?.wait_timeout(timeout)?;
        self.child = None;
        Some(status.code().unwrap_or(-1))
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.kill();
    }
}
