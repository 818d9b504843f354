//! Fault injection: error counts, targets, delays, probe readiness, a bad
//! faults file, exit_after_backend_change with the real binary, backend
//! work that outlives its caller, a busy name, and a status message that is
//! not UTF-8 on the wire.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use csi_hostpath::backend_volumes;
use csi_hostpath::faults::{EXIT_CODE, Fault, Faults};
use csi_proto::v1 as csi;
use tonic::Code;

#[tokio::test]
async fn error_rules_fire_count_times_then_calls_succeed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let faults_file = server.config.faults_file.clone();
    Faults::with_rules(vec![
        Fault::error("CreateVolume", Code::Unavailable)
            .times(2)
            .with_message("backend busy"),
    ])
    .write(&faults_file)
    .expect("write faults");
    let mut c = server.controller();
    for _ in 0..2 {
        let err = create(&mut c, create_req("v", MIB))
            .await
            .expect_err("injected");
        assert_eq!(err.code(), Code::Unavailable);
        assert_eq!(err.message(), "backend busy");
    }
    assert!(
        backend_volumes(&server.config.state_dir)
            .expect("records")
            .is_empty(),
        "an injected error touches nothing"
    );
    let v = create(&mut c, create_req("v", MIB))
        .await
        .expect("third call succeeds");
    assert_eq!(
        Faults::load(&faults_file).expect("load").rules[0].count,
        Some(0),
        "the count is consumed in the file"
    );
    create(&mut c, create_req("v", MIB))
        .await
        .expect("and keeps succeeding");

    // Targeted rule: only the named volume's deletion fails.
    let w = create(&mut c, create_req("w", MIB)).await.expect("w");
    Faults::with_rules(vec![
        Fault::error("DeleteVolume", Code::Internal).on(&v.volume_id),
    ])
    .write(&faults_file)
    .expect("write faults");
    assert_eq!(code(delete(&mut c, &v.volume_id).await), Code::Internal);
    assert_eq!(code(delete(&mut c, &v.volume_id).await), Code::Internal);
    delete(&mut c, &w.volume_id).await.expect("other volume");
    // Wildcard method.
    Faults::with_rules(vec![Fault::error("*", Code::DeadlineExceeded).times(1)])
        .write(&faults_file)
        .expect("write faults");
    assert_eq!(
        code(c.list_volumes(csi::ListVolumesRequest::default()).await),
        Code::DeadlineExceeded
    );
    csi_hostpath::faults::clear(&faults_file).expect("clear");
    delete(&mut c, &v.volume_id).await.expect("no faults left");
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn delay_rules_delay_only_their_method() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    Faults::with_rules(vec![
        Fault::delay("CreateVolume", Duration::from_millis(400)).times(1),
    ])
    .write(&server.config.faults_file)
    .expect("write faults");
    let mut c = server.controller();
    let start = Instant::now();
    c.list_volumes(csi::ListVolumesRequest::default())
        .await
        .expect("list");
    assert!(start.elapsed() < Duration::from_millis(400));
    let start = Instant::now();
    create(&mut c, create_req("slow", MIB))
        .await
        .expect("delayed, then done");
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    let start = Instant::now();
    create(&mut c, create_req("fast", MIB))
        .await
        .expect("count spent");
    assert!(start.elapsed() < Duration::from_millis(400));
    // Delay plus error.
    Faults::with_rules(vec![
        Fault::error("DeleteVolume", Code::Aborted).with_delay(Duration::from_millis(200)),
    ])
    .write(&server.config.faults_file)
    .expect("write faults");
    let start = Instant::now();
    assert_eq!(code(delete(&mut c, "x").await), Code::Aborted);
    assert!(start.elapsed() >= Duration::from_millis(200));
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn probe_not_ready_and_bad_faults_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut id = server.identity();
    let ready = |r: Result<tonic::Response<csi::ProbeResponse>, tonic::Status>| {
        r.expect("probe").into_inner().ready
    };
    assert_eq!(ready(id.probe(csi::ProbeRequest {}).await), Some(true));
    Faults {
        probe_ready: false,
        ..Faults::default()
    }
    .write(&server.config.faults_file)
    .expect("write faults");
    assert_eq!(ready(id.probe(csi::ProbeRequest {}).await), Some(false));
    Faults::with_rules(vec![Fault::error("Probe", Code::Unavailable).times(1)])
        .write(&server.config.faults_file)
        .expect("write faults");
    assert_eq!(
        code(id.probe(csi::ProbeRequest {}).await),
        Code::Unavailable
    );
    assert_eq!(ready(id.probe(csi::ProbeRequest {}).await), Some(true));

    std::fs::write(
        &server.config.faults_file,
        br#"{"rules":[{"method":"Nope"}]}"#,
    )
    .expect("write");
    let err = id.probe(csi::ProbeRequest {}).await.expect_err("bad file");
    assert_eq!(err.code(), Code::Internal);
    assert!(err.message().contains("Nope"), "{}", err.message());
    csi_hostpath::faults::clear(&server.config.faults_file).expect("clear");
    assert_eq!(ready(id.probe(csi::ProbeRequest {}).await), Some(true));
    server.stop().await.expect("clean stop");
}

/// `work_ms`: the caller gives up (its deadline) during the work, the
/// volume is created all the same; with `name_busy`, a repeat meanwhile is
/// answered at once with its code, and a repeat after the work gets the
/// volume the first call made.
#[tokio::test]
async fn slow_work_outlives_its_caller_and_a_busy_name_is_refused() {
    const WORK: Duration = Duration::from_millis(1500);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    Faults {
        name_busy: Some("ALREADY_EXISTS".to_owned()),
        ..Faults::with_rules(vec![Fault::work("CreateVolume", WORK).times(1)])
    }
    .write(&server.config.faults_file)
    .expect("write faults");
    let mut c = server.controller();
    let started = Instant::now();
    let mut first = tonic::Request::new(create_req("slow", MIB));
    first.set_timeout(Duration::from_millis(300));
    let err = c
        .create_volume(first)
        .await
        .expect_err("the caller gives up");
    assert!(
        matches!(err.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{err:?}"
    );
    assert!(
        started.elapsed() < WORK,
        "the caller did not wait for the work"
    );
    let records = || backend_volumes(&server.config.state_dir).expect("records");
    assert!(records().is_empty(), "the work is still running");
    let busy = create(&mut c, create_req("slow", MIB))
        .await
        .expect_err("the name is busy");
    assert_eq!(busy.code(), Code::AlreadyExists);
    assert!(
        busy.message().contains("being created"),
        "{}",
        busy.message()
    );
    create(&mut c, create_req("other", MIB))
        .await
        .expect("another name is not busy");
    while !records().iter().any(|r| r.name == "slow") {
        assert!(
            started.elapsed() < WORK + Duration::from_secs(5),
            "the work did not create the volume"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started.elapsed() >= WORK);
    let made = records()
        .into_iter()
        .find(|r| r.name == "slow")
        .expect("the volume of the first call");
    let again = create(&mut c, create_req("slow", MIB))
        .await
        .expect("the repeat after the work");
    assert_eq!(again.volume_id, made.id, "the volume the first call made");
    server.stop().await.expect("clean stop");
}

/// `wire_message`: the bytes reach the client as written; tonic's client
/// cannot decode `%E9` (Latin-1 "é", not UTF-8) and, as the sidecar sees
/// it, reports `Unknown` "Error deserializing status message header". The
/// carrier metadata does not reach the client.
#[tokio::test]
async fn a_wire_message_that_is_not_utf8_reaches_the_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    Faults::with_rules(vec![
        Fault::error("CreateVolume", Code::Unavailable)
            .with_wire_message("caf%E9 indisponible")
            .times(1),
        Fault::error("CreateVolume", Code::Unavailable)
            .with_wire_message("caf%C3%A9 indisponible")
            .times(1),
    ])
    .write(&server.config.faults_file)
    .expect("write faults");
    let mut c = server.controller();
    let err = create(&mut c, create_req("v", MIB))
        .await
        .expect_err("injected");
    assert_eq!(err.code(), Code::Unknown, "{err:?}");
    assert!(
        err.message()
            .starts_with("Error deserializing status message header"),
        "{}",
        err.message()
    );
    assert!(err.metadata().get("x-hostpath-wire-message").is_none());
    // The same path with valid UTF-8: the driver's code and text arrive.
    let err = create(&mut c, create_req("v", MIB))
        .await
        .expect_err("injected");
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(err.message(), "café indisponible");
    create(&mut c, create_req("v", MIB))
        .await
        .expect("rules spent");
    server.stop().await.expect("clean stop");
}

fn spawn_driver(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_csi-hostpath"))
        .arg(format!(
            "--endpoint=unix://{}",
            dir.join("csi.sock").display()
        ))
        .arg(format!("--statedir={}", dir.join("state").display()))
        .arg(format!(
            "--faults-file={}",
            dir.join("faults.json").display()
        ))
        .arg("--nodeid=proc-node")
        .arg("--v=5")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn csi-hostpath")
}

/// Waits for the child without blocking the runtime (client connections
/// must keep being served to notice the server going away).
async fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("csi-hostpath did not exit within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn exit_after_backend_change_leaves_the_volume_and_exits_75() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("csi.sock");
    let state = dir.path().join("state");
    Faults::with_rules(vec![
        Fault::exit_after_backend_change("CreateVolume")
            .on("pvc-crash")
            .times(1),
    ])
    .write(&dir.path().join("faults.json"))
    .expect("write faults");

    let mut child = spawn_driver(dir.path());
    let channel = connect(&socket).await;
    let mut c = csi::controller_client::ControllerClient::new(channel);
    // Another name is not targeted.
    create(&mut c, create_req("pvc-other", MIB))
        .await
        .expect("untargeted");
    // An invalid call does not exit and does not consume the rule.
    assert_eq!(
        code(create(&mut c, create_req("pvc-crash", -1)).await),
        Code::InvalidArgument
    );
    let err = create(&mut c, create_req("pvc-crash", MIB))
        .await
        .expect_err("no reply: the driver exits");
    assert_ne!(err.code(), Code::Ok);
    let status = wait_exit(&mut child, Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(EXIT_CODE));
    let records = backend_volumes(&state).expect("records");
    let crashed = records
        .iter()
        .find(|r| r.name == "pvc-crash")
        .expect("the backend change happened before the exit");
    assert_eq!(records.len(), 2);
    assert_eq!(
        Faults::load(&dir.path().join("faults.json"))
            .expect("load")
            .rules[0]
            .count,
        Some(0),
        "the exit consumed the rule"
    );

    // Restarted, the driver answers the retry with the same volume and keeps running.
    let mut child = spawn_driver(dir.path());
    let channel = connect(&socket).await;
    let mut c = csi::controller_client::ControllerClient::new(channel);
    let v = create(&mut c, create_req("pvc-crash", MIB))
        .await
        .expect("retry");
    assert_eq!(v.volume_id, crashed.id);
    assert_eq!(child.try_wait().expect("try_wait"), None, "still running");

    // SIGTERM: clean shutdown, socket removed, exit 0 — also while a
    // client keeps its connection open (bounded by the grace period).
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_exit(
        &mut child,
        csi_hostpath::SHUTDOWN_GRACE + Duration::from_secs(10),
    )
    .await;
    assert_eq!(status.code(), Some(0));
    assert!(!socket.exists(), "socket removed on SIGTERM");
    drop(c);
}

#[test]
fn binary_version_and_bad_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-hostpath"))
        .arg("--version")
        .output()
        .expect("run");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("csi-hostpath {}", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(env!("CARGO_BIN_EXE_csi-hostpath"))
        .arg("--capacity=nokind")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let out = Command::new(env!("CARGO_BIN_EXE_csi-hostpath"))
        .args(["--endpoint=tcp://127.0.0.1:9", "--nodeid=n"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}
