//! Shared test harness: the hostpath driver served in-process, and helpers
//! to run the suite against it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Capacity pool the tests create volumes in (`kind: fast`).
pub const KIND: &str = "fast";

pub mod broken;

/// The hostpath driver serving on `<dir>/csi.sock`, directly or behind a
/// [`broken::Broken`] wrapper.
pub struct Hostpath {
    /// First, so that it is told to stop before its directory goes.
    served: Served,
    pub dir: tempfile::TempDir,
    pub config: csi_hostpath::Config,
}

/// What serves the socket.
enum Served {
    Driver(csi_hostpath::InProcess),
    /// Stops when `stop` is used or dropped.
    Broken {
        stop: oneshot::Sender<()>,
        task: JoinHandle<Result<(), String>>,
    },
}

impl Hostpath {
    fn test_config(dir: &Path) -> csi_hostpath::Config {
        let mut config = csi_hostpath::Config::for_tests(dir);
        config.capacity.insert(KIND.to_owned(), 100 << 30);
        config
    }

    /// The plain hostpath driver.
    pub async fn start() -> Hostpath {
        Self::start_with(|_| {}).await
    }

    /// The hostpath driver with its configuration adjusted by `adjust`.
    pub async fn start_with(adjust: impl FnOnce(&mut csi_hostpath::Config)) -> Hostpath {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Self::test_config(dir.path());
        adjust(&mut config);
        let served = Served::Driver(csi_hostpath::InProcess::spawn(config.clone()));
        Hostpath {
            served,
            dir,
            config,
        }
    }

    /// The hostpath driver behind a wrapper that breaks one rule.
    pub async fn start_broken(bug: broken::Bug) -> Hostpath {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Self::test_config(dir.path());
        let driver = csi_hostpath::Driver::new(config.clone()).expect("driver");
        let (stop, task) = broken::serve(broken::Broken::new(driver, bug), &config.endpoint);
        Hostpath {
            served: Served::Broken { stop, task },
            dir,
            config,
        }
    }

    pub fn socket(&self) -> &Path {
        &self.config.endpoint
    }

    pub fn state_dir(&self) -> &Path {
        &self.config.state_dir
    }

    pub fn faults_file(&self) -> &Path {
        &self.config.faults_file
    }

    /// Volume and snapshot ids the backend holds.
    pub fn backend(&self) -> (Vec<String>, Vec<String>) {
        let volumes = csi_hostpath::backend_volumes(self.state_dir())
            .expect("backend volumes")
            .into_iter()
            .map(|v| v.id)
            .collect();
        let snapshots = csi_hostpath::backend_snapshots(self.state_dir())
            .expect("backend snapshots")
            .into_iter()
            .map(|s| s.id)
            .collect();
        (volumes, snapshots)
    }

    /// A suite configuration for a driver at `socket`, with the test
    /// volume size, parameters and directories the tests use.
    pub fn sanity_config_for(&self, socket: &Path) -> csi_sanity::Config {
        let mut c = csi_sanity::Config::new(socket);
        c.test_volume_size = 10 << 20;
        c.test_volume_parameters.insert("kind".into(), KIND.into());
        c.mount_dir = Some(self.dir.path().join("mnt"));
        c.staging_dir = Some(self.dir.path().join("staging"));
        c.check_timeout = Duration::from_secs(60);
        c.connect_timeout = Duration::from_secs(10);
        c
    }

    pub fn sanity_config(&self) -> csi_sanity::Config {
        self.sanity_config_for(self.socket())
    }

    /// Writes a parameters file and returns CLI flags for this driver.
    pub fn cli_args(&self, socket: &Path) -> Vec<String> {
        let params = self.dir.path().join("params.yaml");
        std::fs::write(&params, format!("kind: {KIND}\n")).expect("write params");
        vec![
            "csi-sanity".into(),
            "--csi-address".into(),
            format!("unix://{}", socket.display()),
            "--test-volume-size".into(),
            "10Mi".into(),
            "--test-volume-parameters".into(),
            params.display().to_string(),
            "--mount-dir".into(),
            self.dir.path().join("mnt").display().to_string(),
            "--staging-dir".into(),
            self.dir.path().join("staging").display().to_string(),
        ]
    }

    pub async fn stop(self) {
        match self.served {
            Served::Driver(driver) => driver.stop().await.expect("driver served"),
            Served::Broken { stop, task } => {
                let _ = stop.send(());
                tokio::time::timeout(Duration::from_secs(10), task)
                    .await
                    .expect("driver stops")
                    .expect("driver task")
                    .expect("driver served");
            }
        }
    }
}

/// Parsed output of one run: check name -> (status word, reason).
#[derive(Debug)]
pub struct Output {
    pub text: String,
    pub checks: BTreeMap<String, (String, String)>,
    pub summary: String,
}

impl Output {
    pub fn parse(text: String, names: &[&str]) -> Output {
        let mut checks = BTreeMap::new();
        let mut summary = String::new();
        for line in text.lines() {
            let Some((word, rest)) = line.split_once(' ') else {
                continue;
            };
            if !matches!(word, "PASS" | "FAIL" | "SKIP") {
                if line.ends_with(" skipped") {
                    summary = line.to_owned();
                }
                continue;
            }
            // Names never contain ": ", so the first one ends the name.
            let (name, reason) = match rest.split_once(": ") {
                Some((n, r)) => (n.to_owned(), r.to_owned()),
                None => (rest.to_owned(), String::new()),
            };
            assert!(
                names.contains(&name.as_str()),
                "unknown check in output: {line}"
            );
            checks.insert(name, (word.to_owned(), reason));
        }
        Output {
            text,
            checks,
            summary,
        }
    }

    pub fn status(&self, name: &str) -> &str {
        self.checks
            .get(name)
            .map(|(s, _)| s.as_str())
            .unwrap_or_else(|| panic!("check {name:?} not in output:\n{}", self.text))
    }

    pub fn reason(&self, name: &str) -> &str {
        self.checks
            .get(name)
            .map(|(_, r)| r.as_str())
            .unwrap_or_else(|| panic!("check {name:?} not in output:\n{}", self.text))
    }

    pub fn failed(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|(_, (s, _))| s == "FAIL")
            .map(|(n, _)| n.as_str())
            .collect()
    }
}

/// Runs the CLI in-process; returns the exit code and parsed stdout.
pub async fn run_cli(args: Vec<String>) -> (i32, Output, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = csi_sanity::cli::run_cli(args, &mut out, &mut err).await;
    let text = String::from_utf8(out).expect("utf-8 output");
    let err = String::from_utf8(err).expect("utf-8 errors");
    println!("{text}");
    eprintln!("{err}");
    let names = csi_sanity::checks::names();
    (code, Output::parse(text, &names), err)
}

/// Mount points at or below `dir` (a run must leave none behind).
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|mp| mp.replace("\\040", " "))
        .filter(|mp| Path::new(mp).starts_with(&dir))
        .collect()
}
