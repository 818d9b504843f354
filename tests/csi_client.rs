//! The CSI client (`src/csi`) against the hostpath driver: connection
//! waiting, readiness, deadlines, error classes and start-up refusals.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "support/csi_requests.rs"]
mod csi_requests;

use csi_hostpath::faults::{self, Fault, Faults};
use csi_proto::v1::identity_server::{Identity, IdentityServer};
use csi_proto::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse,
};
use csi_provisioner::csi::connection::connect_and_probe;
use csi_provisioner::csi::{Driver, ErrorClass, StartupError};
use tokio::sync::oneshot;
use tonic::{Code, Request, Response, Status};

struct RunningDriver {
    /// First: the driver is told to stop before its directory goes.
    _served: csi_hostpath::InProcess,
    config: csi_hostpath::Config,
    _dir: tempfile::TempDir,
}

impl RunningDriver {
    fn start(mutate: impl FnOnce(&mut csi_hostpath::Config)) -> RunningDriver {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = csi_hostpath::Config::for_tests(dir.path());
        mutate(&mut config);
        RunningDriver {
            _served: csi_hostpath::InProcess::spawn(config.clone()),
            config,
            _dir: dir,
        }
    }

    fn faults(&self, faults: Faults) {
        faults.write(&self.config.faults_file).expect("faults");
    }

    async fn driver(&self, timeout: Duration) -> Driver {
        let channel = connect_and_probe(&self.config.endpoint, timeout)
            .await
            .expect("connect");
        Driver::discover(channel, timeout).await.expect("discover")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_a_socket_that_appears_late() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = csi_hostpath::Config::for_tests(dir.path());
    let socket = config.endpoint.clone();
    let started = Instant::now();
    let connecting =
        tokio::spawn(async move { connect_and_probe(&socket, Duration::from_secs(2)).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!connecting.is_finished(), "nothing listens yet");
    let _served = csi_hostpath::InProcess::spawn(config);
    let channel = tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .expect("connected in time")
        .expect("join")
        .expect("connect");
    assert!(started.elapsed() >= Duration::from_millis(700));
    let driver = Driver::discover(channel, Duration::from_secs(2))
        .await
        .expect("discover");
    assert_eq!(driver.name(), csi_hostpath::DEFAULT_DRIVER_NAME);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_while_probe_says_not_ready() {
    let driver = RunningDriver::start(|_| {});
    driver.faults(Faults {
        probe_ready: false,
        ..Faults::default()
    });
    let socket = driver.config.endpoint.clone();
    let connecting =
        tokio::spawn(async move { connect_and_probe(&socket, Duration::from_secs(2)).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!connecting.is_finished(), "ready=false keeps us waiting");
    faults::clear(&driver.config.faults_file).expect("clear");
    tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .expect("ready in time")
        .expect("join")
        .expect("connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_error_that_waiting_cannot_fix_is_reported() {
    let driver = RunningDriver::start(|_| {});
    driver.faults(Faults::with_rules(vec![Fault::error(
        "Probe",
        Code::FailedPrecondition,
    )]));
    let err = connect_and_probe(&driver.config.endpoint, Duration::from_secs(2))
        .await
        .expect_err("probe error");
    assert!(err.to_string().contains("FailedPrecondition"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_name_version_and_capabilities() {
    let running = RunningDriver::start(|_| {});
    let driver = running.driver(Duration::from_secs(2)).await;
    let info = driver.info();
    assert_eq!(info.name, csi_hostpath::DEFAULT_DRIVER_NAME);
    assert!(!info.vendor_version.is_empty());
    assert!(info.plugin.controller_service);
    assert!(info.plugin.volume_accessibility_constraints);
    assert!(
        info.controller
            .names()
            .contains(&"CREATE_DELETE_VOLUME".to_owned())
    );
    info.require_provisioning().expect("can provision");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_is_idempotent_and_conflicts_are_final() {
    let running = RunningDriver::start(|_| {});
    let driver = running.driver(Duration::from_secs(2)).await;
    let first = driver
        .create_volume(csi_requests::mount_volume("pvc-a", 1 << 20), false)
        .await
        .expect("create");
    let again = driver
        .create_volume(csi_requests::mount_volume("pvc-a", 1 << 20), false)
        .await
        .expect("repeat");
    let (first, again) = (first.volume.expect("volume"), again.volume.expect("volume"));
    assert_eq!(first.volume_id, again.volume_id, "same name, same volume");
    let conflict = driver
        .create_volume(csi_requests::mount_volume("pvc-a", 1 << 30), false)
        .await
        .expect_err("incompatible size");
    assert_eq!(conflict.code(), Code::AlreadyExists);
    assert_eq!(conflict.class(), ErrorClass::Final);
    driver
        .delete_volume(&first.volume_id, HashMap::new(), false)
        .await
        .expect("delete");
    driver
        .delete_volume(&first.volume_id, HashMap::new(), false)
        .await
        .expect("deleting again is fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_exhausted_is_non_final() {
    let running = RunningDriver::start(|c| {
        c.capacity.insert("fast".to_owned(), 2 << 20);
    });
    let driver = running.driver(Duration::from_secs(2)).await;
    driver
        .create_volume(csi_requests::mount_volume("pvc-a", 2 << 20), false)
        .await
        .expect("fits");
    let full = driver
        .create_volume(csi_requests::mount_volume("pvc-b", 1 << 20), false)
        .await
        .expect_err("full");
    assert_eq!(full.code(), Code::ResourceExhausted);
    assert_eq!(full.class(), ErrorClass::NonFinal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_deadline_fires_and_is_non_final() {
    let running = RunningDriver::start(|_| {});
    let driver = running.driver(Duration::from_millis(300)).await;
    running.faults(Faults::with_rules(vec![Fault::delay(
        "CreateVolume",
        Duration::from_secs(3),
    )]));
    let started = Instant::now();
    let err = driver
        .create_volume(csi_requests::mount_volume("pvc-slow", 1 << 20), false)
        .await
        .expect_err("deadline");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the deadline cut the wait"
    );
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(!err.is_final());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_errors_keep_their_code_and_class() {
    let running = RunningDriver::start(|_| {});
    let driver = running.driver(Duration::from_secs(2)).await;
    for (code, class) in [
        (Code::Unavailable, ErrorClass::NonFinal),
        (Code::Aborted, ErrorClass::NonFinal),
        (Code::Internal, ErrorClass::Final),
        (Code::InvalidArgument, ErrorClass::Final),
    ] {
        running.faults(Faults::with_rules(vec![
            Fault::error("CreateVolume", code).times(1),
        ]));
        let err = driver
            .create_volume(csi_requests::mount_volume("pvc-x", 1 << 20), false)
            .await
            .expect_err("injected");
        assert_eq!((err.code(), err.class()), (code, class));
    }
}

/// An Identity service that is not a controller: what a node-only driver
/// looks like to the sidecar.
struct NodeOnlyDriver {
    name: String,
}

#[tonic::async_trait]
impl Identity for NodeOnlyDriver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "1.0".into(),
            manifest: HashMap::new(),
        }))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

fn serve_identity(socket: &std::path::Path, name: &str) -> oneshot::Sender<()> {
    let incoming = csi_proto::transport::bind_unix(socket).expect("bind");
    let (tx, rx) = oneshot::channel::<()>();
    let service = IdentityServer::new(NodeOnlyDriver {
        name: name.to_owned(),
    });
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await;
    });
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_that_cannot_provision_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("node-only.sock");
    let _stop = serve_identity(&socket, "node.only.example.com");
    let channel = connect_and_probe(&socket, Duration::from_secs(2))
        .await
        .expect("connect");
    let driver = Driver::discover(channel, Duration::from_secs(2))
        .await
        .expect("discover");
    let err = driver.info().require_provisioning().expect_err("refused");
    assert!(matches!(err, StartupError::MissingCapability(_)));
    assert!(err.to_string().contains("CONTROLLER_SERVICE"), "{err}");

    // The binary exits non-zero and names the capability. (As upstream, it
    // builds its API client first; nothing is sent before the check.)
    let output = run_to_its_end(&socket, dir.path(), &[]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("CONTROLLER_SERVICE"), "{stderr}");
    // And what would be right.
    assert!(
        stderr
            .contains("point --csi-address at the controller plugin's socket, not a node plugin's"),
        "{stderr}"
    );
}

/// A start-up call that fails stops the binary with exit 1 and says what it
/// was asking, in the Go image's words ("Error getting CSI driver name" for
/// `GetPluginInfo`, "… capabilities" for the two capability calls); no
/// retry, as the Go image (the kubelet restarts the container). The chaos
/// harness accepts exactly these exits when it faulted that call
/// (`tests/chaos.rs`, `startup_failure`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_up_call_exits_1_naming_what_it_asked() {
    let cases = [
        (
            "Probe",
            "CSI driver probe failed: Probe: rpc error: code = Internal",
        ),
        (
            "GetPluginInfo",
            "error getting CSI driver name: GetPluginInfo: rpc error: code = Internal",
        ),
        (
            "GetPluginCapabilities",
            "error getting CSI driver capabilities: GetPluginCapabilities: rpc error: code = Internal",
        ),
        (
            "ControllerGetCapabilities",
            "error getting CSI driver capabilities: ControllerGetCapabilities: rpc error: code = Internal",
        ),
    ];
    for (method, want) in cases {
        let driver = RunningDriver::start(|_| {});
        driver.faults(Faults::with_rules(vec![
            Fault::error(method, Code::Internal).with_message("refused for the test"),
        ]));
        let dir = tempfile::tempdir().expect("tempdir");
        let output = run_to_its_end(&driver.config.endpoint, dir.path(), &["--timeout=2s"]).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{method}: {stderr}");
        assert!(
            stderr.contains(want) && stderr.contains("refused for the test"),
            "{method}: want {want:?} in\n{stderr}"
        );
        // What would be right: the driver's log says why it refused.
        assert!(
            stderr.contains(
                "read the driver container's log (this container exits and is restarted)"
            ),
            "{method}: {stderr}"
        );
        if method == "Probe" {
            assert!(
                stderr.contains(&format!(
                    "the driver at {} (--csi-address) answered with a code that waiting does not fix",
                    driver.config.endpoint.display()
                )),
                "{stderr}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_driver_names_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("bad-name.sock");
    let _stop = serve_identity(&socket, "Not_A/Valid name");
    let channel = connect_and_probe(&socket, Duration::from_secs(2))
        .await
        .expect("connect");
    let err = Driver::discover(channel, Duration::from_secs(2))
        .await
        .expect_err("invalid");
    assert!(err.to_string().contains("is invalid"), "{err}");
    assert!(
        err.to_string().contains(
            "a driver name has at most 63 characters, alphanumerics, '-' and '.', starting and ending with an alphanumeric"
        ),
        "{err}"
    );
}

#[test]
fn bad_flags_exit_2_naming_the_problem() {
    for (args, needle) in [
        (&["--feature-gates=Bogus=true"][..], "Bogus"),
        (&["--timeout=soon"][..], "timeout"),
        (&["--csi-address=tcp://10.0.0.1:1"][..], "csi-address"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
            .args(args)
            .output()
            .expect("run");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// `<argv[0]> <version>` and nothing else, the version one word: a `git
/// describe` (`v6.3.0-56-g0688604fa`, `5830c16-dirty`) or a plain version.
fn version_line_shape(output: &str, argv0: &str) -> Result<(), String> {
    let line = output
        .strip_suffix('\n')
        .filter(|l| !l.contains('\n'))
        .ok_or_else(|| format!("not one line: {output:?}"))?;
    let version = line
        .strip_prefix(argv0)
        .and_then(|rest| rest.strip_prefix(' '))
        .ok_or_else(|| format!("not `{argv0} <version>`: {line:?}"))?;
    let version = version.strip_suffix("-dirty").unwrap_or(version);
    let hash = |h: &str| h.len() >= 7 && h.chars().all(|c| c.is_ascii_hexdigit());
    let release = |v: &str| {
        let v = v.strip_prefix('v').unwrap_or(v);
        let parts: Vec<&str> = v.split('.').collect();
        parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
    };
    let described = match version.rsplitn(3, '-').collect::<Vec<_>>()[..] {
        [commit, ahead, tag] => {
            commit.strip_prefix('g').is_some_and(hash)
                && ahead.parse::<u32>().is_ok()
                && release(tag)
        }
        _ => false,
    };
    if described || hash(version) || release(version) {
        Ok(())
    } else {
        Err(format!("{version:?} is not a git describe nor a version"))
    }
}

#[test]
fn version_prints_argv0_first_then_the_version_and_the_commit() {
    // The shape itself, on the Go image's output and others.
    for (output, argv0, ok) in [
        (
            "target/k8s/csi-provisioner v6.3.0-56-g0688604fa\n",
            "target/k8s/csi-provisioner",
            true,
        ),
        ("/csi-provisioner v6.3.0\n", "/csi-provisioner", true),
        ("csi-provisioner 5830c16-dirty\n", "csi-provisioner", true),
        ("csi-provisioner 0.1.0\n", "csi-provisioner", true),
        (
            "csi-provisioner v6.3.0-56-g0688604fa-dirty\n",
            "csi-provisioner",
            true,
        ),
        ("csi-provisioner 0.1.0", "csi-provisioner", false),
        ("csi-provisioner 0.1.0\nmore\n", "csi-provisioner", false),
        ("other 0.1.0\n", "csi-provisioner", false),
        ("csi-provisioner  0.1.0\n", "csi-provisioner", false),
        ("csi-provisioner version 0.1.0\n", "csi-provisioner", false),
        ("csi-provisioner main\n", "csi-provisioner", false),
    ] {
        assert_eq!(version_line_shape(output, argv0).is_ok(), ok, "{output:?}");
    }
    let ours = env!("CARGO_BIN_EXE_csi-provisioner");
    let version = Command::new(ours).arg("--version").output().expect("run");
    assert!(version.status.success());
    let stdout = String::from_utf8_lossy(&version.stdout);
    // Ours: the crate version, then the commit it was built from.
    let crate_version = concat!("v", env!("CARGO_PKG_VERSION"));
    let line = stdout
        .strip_suffix('\n')
        .filter(|l| !l.contains('\n'))
        .unwrap_or_else(|| panic!("ours: not one line: {stdout:?}"));
    let after = line
        .strip_prefix(ours)
        .and_then(|rest| rest.strip_prefix(' '))
        .unwrap_or_else(|| panic!("ours: not `{ours} <version>`: {line:?}"));
    let commit = after
        .strip_prefix(crate_version)
        .and_then(|rest| rest.strip_prefix(" (git "))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("ours: not `{crate_version} (git <commit>)`: {after:?}"));
    version_line_shape(&format!("{ours} {commit}\n"), ours)
        .unwrap_or_else(|e| panic!("ours, its commit: {e}"));
    // The Go image's, where the upstream binaries are.
    if let Some(dir) = std::env::var_os("K8S_BIN_DIR").filter(|d| !d.is_empty()) {
        let go = std::path::Path::new(&dir).join("csi-provisioner");
        let out = Command::new(&go)
            .arg("--version")
            .output()
            .expect("run the Go image");
        let go_stdout = String::from_utf8_lossy(&out.stdout);
        version_line_shape(&go_stdout, &go.to_string_lossy())
            .unwrap_or_else(|e| panic!("the Go image: {e}"));
    }
}

#[test]
fn sigterm_while_waiting_for_the_driver_exits_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .arg(format!(
            "--csi-address={}",
            dir.path().join("none.sock").display()
        ))
        .arg(format!(
            "--kubeconfig={}",
            unreachable_kubeconfig(dir.path()).display()
        ))
        .env_remove("KUBECONFIG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // SIGTERM once it says it waits (not after a fixed pause: on a loaded
    // machine its start-up took longer than the 800 ms this test slept,
    // and the signal came before the line).
    let stderr_pipe = child.stderr.take().expect("stderr piped");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr_pipe).lines() {
            let Ok(line) = line else { break };
            let _ = lines_tx.send(line);
        }
    });
    let mut stderr = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stderr.contains("socket does not exist yet") {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) => {
                stderr.push_str(&line);
                stderr.push('\n');
            }
            Err(e) => panic!("no 'socket does not exist yet' line ({e})\n{stderr}"),
        }
    }
    assert!(child.try_wait().expect("poll").is_none(), "still waiting");
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    let status = child.wait().expect("wait");
    reader.join().expect("the stderr reader");
    stderr.extend(lines_rx.try_iter().map(|l| l + "\n"));
    assert_eq!(status.code(), Some(0), "{stderr}");
    // What is wrong, the flag and the path, and what would be right.
    let told = format!(
        "still connecting to the CSI driver: socket does not exist yet at {} (--csi-address); the driver container must create it",
        dir.path().join("none.sock").display()
    );
    assert!(stderr.contains(&told), "want {told:?} in\n{stderr}");
}

/// Runs the binary against the driver at `socket` (its API server
/// unreachable, see [`unreachable_kubeconfig`], written into `dir`) with
/// `extra` flags until it exits by itself.
async fn run_to_its_end(
    socket: &std::path::Path,
    dir: &std::path::Path,
    extra: &[&str],
) -> std::process::Output {
    let kubeconfig = unreachable_kubeconfig(dir);
    let mut command = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"));
    command
        .arg(format!("--csi-address={}", socket.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(extra)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG");
    tokio::task::spawn_blocking(move || command.output().expect("run"))
        .await
        .expect("join")
}

/// A kubeconfig naming a server nobody listens on: enough to build the
/// client, which the sidecar does before it looks for the driver.
fn unreachable_kubeconfig(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        kube_testserver::kubeconfig_yaml("http://127.0.0.1:9"),
    )
    .expect("kubeconfig");
    path
}
