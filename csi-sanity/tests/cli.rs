//! The `csi-sanity` binary: upstream flag spellings, exit codes, output
//! format and the JUnit report.

mod common;

use std::process::Stdio;

use common::{Hostpath, Output};

const BIN: &str = env!("CARGO_BIN_EXE_csi-sanity");

async fn run_bin(args: &[String]) -> (i32, String, String) {
    let output = tokio::process::Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run csi-sanity");
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let stderr = String::from_utf8(output.stderr).expect("utf-8");
    println!("{stdout}");
    eprintln!("{stderr}");
    (output.status.code().unwrap_or(-1), stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_flags_full_run_with_junit() {
    let driver = Hostpath::start().await;
    let params = driver.dir.path().join("params.yaml");
    std::fs::write(&params, "kind: fast\n").expect("params");
    let junit = driver.dir.path().join("report.xml");
    // Spelled as existing CI scripts call the Go tool.
    let args: Vec<String> = vec![
        format!("-csi.endpoint=unix://{}", driver.socket().display()),
        "-csi.testvolumesize".into(),
        "10485760".into(),
        "--csi.testvolumeparameters".into(),
        params.display().to_string(),
        "--csi.junitfile".into(),
        junit.display().to_string(),
        "-csi.mountdir".into(),
        driver.dir.path().join("mnt").display().to_string(),
        "-ginkgo.v".into(),
    ];
    let (code, stdout, _) = run_bin(&args).await;
    assert_eq!(code, 0, "{stdout}");
    let out = Output::parse(stdout.clone(), &csi_sanity::checks::names());
    assert_eq!(out.checks.len(), csi_sanity::checks::names().len());
    assert!(out.failed().is_empty());
    let passed = out.checks.values().filter(|(s, _)| s == "PASS").count();
    let skipped = out.checks.values().filter(|(s, _)| s == "SKIP").count();
    assert_eq!(
        stdout.lines().last(),
        Some(format!("{passed} passed, 0 failed, {skipped} skipped").as_str())
    );
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert!(xml.starts_with("<?xml"));
    assert!(xml.contains(&format!(
        "tests=\"{}\" failures=\"0\" skipped=\"{skipped}\"",
        passed + skipped
    )));
    assert_eq!(xml.matches("<testcase ").count(), passed + skipped);
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn focus_and_skip_select_checks() {
    let driver = Hostpath::start().await;
    let mut args = driver.cli_args(driver.socket());
    args.remove(0);
    args.extend([
        "--ginkgo.focus".into(),
        "CreateVolume".into(),
        "--ginkgo.skip".into(),
        "source snapshot|source volume".into(),
    ]);
    let (code, stdout, _) = run_bin(&args).await;
    assert_eq!(code, 0, "{stdout}");
    let out = Output::parse(stdout, &csi_sanity::checks::names());
    use csi_sanity::checks::controller as c;
    assert_eq!(out.status(c::CREATE_NO_NAME), "PASS");
    assert_eq!(out.status(c::CREATE_FROM_SNAPSHOT), "SKIP");
    assert_eq!(
        out.reason(c::CREATE_FROM_SNAPSHOT),
        "not selected by --focus/--skip"
    );
    assert_eq!(out.status(c::CREATE_FROM_VOLUME), "SKIP");
    assert_eq!(out.status(c::DELETE_PLAIN), "SKIP");
    assert_eq!(out.status(csi_sanity::checks::identity::PROBE), "SKIP");
    // The cleanup check ignores --focus.
    assert_eq!(out.status(csi_sanity::CLEANUP_CHECK), "PASS");
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_driver_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("nothing.sock");
    let (code, stdout, stderr) = run_bin(&[
        "--csi-address".into(),
        socket.display().to_string(),
        "--connect-timeout".into(),
        "300ms".into(),
    ])
    .await;
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot connect"), "{stderr}");
    assert!(
        !stdout.contains("passed"),
        "no summary without a run: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_exit_2() {
    for args in [
        vec![],
        vec!["--bogus".to_owned()],
        vec!["--csi-address".into(), "tcp://127.0.0.1:1".into()],
        vec![
            "--csi-address".into(),
            "/x.sock".into(),
            "--test-volume-size".into(),
            "ten".into(),
        ],
        vec![
            "--csi-address".into(),
            "/x.sock".into(),
            "--focus".into(),
            "(".into(),
        ],
        vec![
            "--csi-address".into(),
            "/x.sock".into(),
            "--secrets".into(),
            "/nonexistent".into(),
        ],
    ] {
        let (code, _, stderr) = run_bin(&args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(!stderr.is_empty(), "{args:?} explains the error");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_prints_selected_names() {
    let (code, stdout, _) = run_bin(&["--list".into(), "--focus".into(), "^Identity".into()]).await;
    assert_eq!(code, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(
        lines[..4]
            .iter()
            .all(|l| l.starts_with("Identity Service "))
    );
    assert_eq!(lines[4], csi_sanity::CLEANUP_CHECK);
    let (code, stdout, _) = run_bin(&["--ginkgo.dry-run".into()]).await;
    assert_eq!(code, 0);
    assert_eq!(stdout.lines().count(), csi_sanity::checks::names().len());
}
