//! The suite must catch broken drivers: wrappers that break one spec rule
//! each, and the hostpath driver's fault injection.

mod common;

use std::time::Duration;

use common::broken::Bug;
use common::{Hostpath, Output, run_cli};
use csi_hostpath::faults::{Fault, Faults};
use csi_sanity::checks::{controller as c, identity as id, node as n};
use tonic::Code;

/// Checks that the summary line agrees with the per-check lines and the
/// exit code.
fn assert_consistent(code: i32, out: &Output) {
    let count = |w: &str| out.checks.values().filter(|(s, _)| s == w).count();
    assert_eq!(
        out.summary,
        format!(
            "{} passed, {} failed, {} skipped",
            count("PASS"),
            count("FAIL"),
            count("SKIP")
        ),
        "{}",
        out.text
    );
    assert_eq!(code, if count("FAIL") > 0 { 1 } else { 0 }, "{}", out.text);
    assert_eq!(
        out.text.lines().last(),
        Some(out.summary.as_str()),
        "the summary must be the last line"
    );
}

/// Runs the whole suite against the hostpath driver behind `bug` and checks
/// that exactly `expected` fail, and that nothing is left in the backend.
async fn detects(bug: Bug, expected: &[&str]) {
    let driver = Hostpath::start_broken(bug).await;
    let args = driver.cli_args(driver.socket());
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(code, 1, "{bug:?} must make the run fail");
    let mut want: Vec<&str> = expected.to_vec();
    want.sort_unstable();
    assert_eq!(
        out.failed(),
        want,
        "{bug:?}: unexpected set of failed checks"
    );
    let (volumes, snapshots) = driver.backend();
    assert_eq!(
        common::mounts_under(driver.dir.path()),
        Vec::<String>::new(),
        "{bug:?}: mounts left behind"
    );
    assert!(
        volumes.is_empty(),
        "{bug:?}: volumes left behind: {volumes:?}"
    );
    assert!(
        snapshots.is_empty(),
        "{bug:?}: snapshots left: {snapshots:?}"
    );
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_non_idempotent_create() {
    detects(
        Bug::NonIdempotentCreate,
        &[c::CREATE_IDEMPOTENT, c::CREATE_CONFLICT],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_create_without_name_accepted() {
    detects(Bug::AcceptsMissingName, &[c::CREATE_NO_NAME]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_delete_of_unknown_volume_not_ok() {
    detects(
        Bug::DeleteUnknownNotFound,
        &[c::DELETE_UNKNOWN, c::DELETE_TWICE],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_list_ignoring_max_entries() {
    detects(Bug::ListIgnoresMaxEntries, &[c::LIST_PAGES]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_invalid_token_not_aborted() {
    detects(Bug::BadTokenNotAborted, &[c::LIST_BAD_TOKEN]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_empty_plugin_name() {
    detects(Bug::EmptyPluginName, &[id::INFO, id::INFO_NAME]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_capacity_below_required() {
    detects(
        Bug::CapacityBelowRequired,
        &[
            c::CREATE_WITH_CAPACITY,
            c::CREATE_IDEMPOTENT,
            c::CREATE_RANGE,
            c::GET_VOLUME,
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_content_source_not_returned() {
    detects(
        Bug::ContentSourceDropped,
        &[c::CREATE_FROM_SNAPSHOT, c::CREATE_FROM_VOLUME],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_file_reaches_the_driver() {
    let driver = Hostpath::start_broken(Bug::RequiresCreateSecret).await;
    let focus = vec!["--focus".to_owned(), "CreateVolume".to_owned()];
    // Without secrets every creating check fails with UNAUTHENTICATED.
    let mut args = driver.cli_args(driver.socket());
    args.extend(focus.clone());
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(out.status(c::CREATE_NO_CAPACITY), "FAIL");
    assert!(
        out.reason(c::CREATE_NO_CAPACITY)
            .contains("UNAUTHENTICATED")
    );
    // With the upstream-format secrets file they pass.
    let secrets = driver.dir.path().join("secrets.yaml");
    std::fs::write(
        &secrets,
        "CreateVolumeSecret:\n  user: admin\nDeleteVolumeSecret:\n  user: admin\n",
    )
    .expect("write secrets");
    let mut args = driver.cli_args(driver.socket());
    args.extend(focus);
    args.extend(["--csi.secrets".to_owned(), secrets.display().to_string()]);
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(code, 0, "{}", out.text);
    assert_eq!(out.status(c::CREATE_NO_CAPACITY), "PASS");
    driver.stop().await;
}

fn write_faults(driver: &Hostpath, faults: Faults) {
    faults.write(driver.faults_file()).expect("write faults");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_create_volume_internal_fails_the_happy_paths() {
    let driver = Hostpath::start().await;
    write_faults(
        &driver,
        Faults::with_rules(vec![Fault::error("CreateVolume", Code::Internal)]),
    );
    let (code, out, _) = run_cli(driver.cli_args(driver.socket())).await;
    assert_consistent(code, &out);
    assert_eq!(code, 1);
    for check in [
        c::CREATE_NO_CAPACITY,
        c::CREATE_WITH_CAPACITY,
        c::CREATE_IDEMPOTENT,
        c::CREATE_RANGE,
        c::DELETE_PLAIN,
        c::LIST_PRESENCE,
        c::EXPAND_WORKS,
        n::WORKS,
    ] {
        assert_eq!(out.status(check), "FAIL", "{check}");
        assert!(
            out.reason(check).contains("INTERNAL"),
            "{check}: {}",
            out.reason(check)
        );
    }
    // Checks that create nothing are unaffected: one failure does not stop
    // the run or spill into other checks.
    for check in [
        id::PROBE,
        id::INFO,
        c::DELETE_UNKNOWN,
        c::LIST_BAD_TOKEN,
        n::INFO,
    ] {
        assert_eq!(out.status(check), "PASS", "{check}");
    }
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

/// A driver that answers capacity 0 (size unknown, as democratic-csi and
/// NFS drivers do) cannot tell a request for another size from a repeat:
/// the conflict check is skipped, as upstream csi-sanity skips it, and the
/// checks that accept 0 still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_capacity_skips_the_conflict_check() {
    let driver = Hostpath::start().await;
    write_faults(
        &driver,
        Faults::with_rules(vec![Fault::reply(
            "CreateVolume",
            csi_hostpath::faults::Reply {
                capacity_bytes: Some(0),
                ..Default::default()
            },
        )]),
    );
    let focus = ["--focus".to_owned(), "CreateVolume".to_owned()];
    let args = [driver.cli_args(driver.socket()), focus.to_vec()].concat();
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(out.status(c::CREATE_CONFLICT), "SKIP", "{}", out.text);
    assert!(
        out.reason(c::CREATE_CONFLICT)
            .contains("capacity of the volume is unknown"),
        "{}",
        out.reason(c::CREATE_CONFLICT)
    );
    for check in [c::CREATE_WITH_CAPACITY, c::CREATE_IDEMPOTENT] {
        assert_eq!(out.status(check), "PASS", "{check}: {}", out.text);
    }
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_probe_errors_and_not_ready() {
    let driver = Hostpath::start().await;
    let focus = ["--focus".to_owned(), "Identity".to_owned()];
    write_faults(
        &driver,
        Faults::with_rules(vec![Fault::error("Probe", Code::Unavailable)]),
    );
    let mut args = driver.cli_args(driver.socket());
    args.extend(focus.clone());
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(out.status(id::PROBE), "FAIL");
    assert!(out.reason(id::PROBE).contains("UNAVAILABLE"));
    assert_eq!(out.status(id::INFO), "PASS");
    assert!(
        out.summary.starts_with("3 passed, 1 failed"),
        "{}",
        out.summary
    );

    write_faults(
        &driver,
        Faults {
            probe_ready: false,
            ..Faults::default()
        },
    );
    let mut args = driver.cli_args(driver.socket());
    args.extend(focus);
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(code, 1);
    assert_eq!(out.status(id::PROBE), "FAIL");
    assert!(out.reason(id::PROBE).contains("ready=false"));
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_check_still_cleans_up_after_transient_delete_error() {
    let driver = Hostpath::start().await;
    write_faults(
        &driver,
        Faults::with_rules(vec![Fault::error("DeleteVolume", Code::Internal).times(1)]),
    );
    let mut args = driver.cli_args(driver.socket());
    args.extend(["--focus".to_owned(), regex::escape(c::DELETE_PLAIN)]);
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(out.status(c::DELETE_PLAIN), "FAIL");
    assert!(
        out.reason(c::DELETE_PLAIN)
            .contains("DeleteVolume failed: INTERNAL")
    );
    // The cleanup after the check deleted the volume.
    assert_eq!(out.status(csi_sanity::CLEANUP_CHECK), "PASS");
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_volume_is_reported() {
    let driver = Hostpath::start().await;
    write_faults(
        &driver,
        Faults::with_rules(vec![Fault::error("DeleteVolume", Code::Internal)]),
    );
    let mut args = driver.cli_args(driver.socket());
    args.extend(["--focus".to_owned(), regex::escape(c::CREATE_NO_CAPACITY)]);
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(code, 1);
    assert_eq!(out.status(c::CREATE_NO_CAPACITY), "FAIL");
    assert!(
        out.reason(c::CREATE_NO_CAPACITY)
            .starts_with("cleanup failed")
    );
    assert_eq!(out.status(csi_sanity::CLEANUP_CHECK), "FAIL");
    let (volumes, _) = driver.backend();
    assert_eq!(volumes.len(), 1);
    assert!(
        out.reason(csi_sanity::CLEANUP_CHECK).contains(&volumes[0]),
        "the leaked volume is named: {}",
        out.reason(csi_sanity::CLEANUP_CHECK)
    );
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_call_fails_only_its_check() {
    let driver = Hostpath::start().await;
    write_faults(
        &driver,
        Faults::with_rules(vec![Fault::delay("ListVolumes", Duration::from_secs(4))]),
    );
    let mut args = driver.cli_args(driver.socket());
    args.extend([
        "--focus".to_owned(),
        "ListVolumes|GetCapacity".to_owned(),
        "--check-timeout".to_owned(),
        "1s".to_owned(),
    ]);
    let (code, out, _) = run_cli(args).await;
    assert_consistent(code, &out);
    assert_eq!(out.status(c::LIST_PLAIN), "FAIL");
    assert!(out.reason(c::LIST_PLAIN).contains("timed out"));
    assert_eq!(out.status(c::LIST_PRESENCE), "FAIL");
    assert_eq!(out.status(c::CAPACITY_PLAIN), "PASS");
    // The volume the aborted check had created was deleted all the same.
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_stops_the_run_and_cleans_up() {
    let driver = Hostpath::start().await;
    let mut config = driver.sanity_config();
    // The presence check creates a volume, then its ListVolumes hangs.
    config.focus = regex::Regex::new("ListVolumes (check the presence|should fail when)").ok();
    config.check_timeout = Duration::from_secs(2);
    write_faults(
        &driver,
        Faults::with_rules(vec![Fault::delay("ListVolumes", Duration::from_secs(30))]),
    );
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    let report = csi_sanity::run_until(config, &mut out, async {
        tokio::time::sleep(Duration::from_millis(500)).await;
    })
    .await;
    let text = String::from_utf8(out).expect("utf-8");
    println!("{text}");
    let report = report.expect("runs");
    assert!(started.elapsed() < Duration::from_secs(20), "{text}");
    // ListVolumes (invalid token) runs first and hangs past the interrupt.
    let interrupted = report.get(c::LIST_BAD_TOKEN).expect("reported");
    assert_eq!(
        interrupted.outcome,
        csi_sanity::Outcome::Fail("interrupted".into()),
        "{text}"
    );
    // No check after the interrupted one ran.
    assert!(report.get(c::LIST_PRESENCE).is_none(), "{text}");
    assert!(text.ends_with(&format!("{}\n", report.summary_line())));
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

/// The checks hostpath skips (controller publish, node stage), run against
/// a wrapper that offers them: all pass when the wrapper is correct...
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_stage_checks_pass_on_a_correct_driver() {
    let driver = Hostpath::start_broken(Bug::Attach).await;
    let (code, out, _) = run_cli(driver.cli_args(driver.socket())).await;
    assert_consistent(code, &out);
    assert_eq!(code, 0, "{}", out.text);
    for check in [
        c::PUBLISH_NO_ID,
        c::PUBLISH_NO_NODE,
        c::PUBLISH_NO_CAP,
        c::PUBLISH_MISSING_VOLUME,
        c::PUBLISH_MISSING_NODE,
        c::UNPUBLISH_NO_ID,
        c::LIFECYCLE,
        n::STAGE_NO_ID,
        n::STAGE_NO_PATH,
        n::STAGE_NO_CAP,
        n::UNSTAGE_NO_ID,
        n::UNSTAGE_NO_PATH,
        n::WORKS,
        n::IDEMPOTENT,
        n::STATS_WORKS,
    ] {
        assert_eq!(out.status(check), "PASS", "{check}");
    }
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

/// The rule upstream csi-sanity found broken in the hostpath driver: the
/// second publication is reported, and the suite's cleanup unpublishes it
/// (no volume and no mount left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_single_writer_published_twice() {
    detects(
        Bug::SingleWriterNotEnforced,
        &[n::PUBLISH_SINGLE_WRITER_ELSEWHERE],
    )
    .await;
}

/// A driver that looks at state before arguments (NOT_FOUND for an unknown
/// volume or node, FAILED_PRECONDITION for a volume not ControllerPublished
/// or not staged, whatever else is wrong) is as right as one that checks
/// arguments first: every negative check must break exactly one rule, so
/// every check passes here too. (A check that sent an unknown volume id
/// and no volume path to NodeExpandVolume, expecting INVALID_ARGUMENT,
/// failed against the upstream hostpath driver, which answers NOT_FOUND.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_passes_on_a_driver_that_checks_state_first() {
    let driver = Hostpath::start_broken(Bug::AttachStateFirst).await;
    let (code, out, _) = run_cli(driver.cli_args(driver.socket())).await;
    assert_consistent(code, &out);
    assert_eq!(out.failed(), Vec::<&str>::new(), "{}", out.text);
    assert_eq!(code, 0, "{}", out.text);
    for check in [
        c::PUBLISH_NO_ID,
        c::PUBLISH_NO_NODE,
        c::PUBLISH_NO_CAP,
        n::PUBLISH_NO_ID,
        n::PUBLISH_NO_TARGET,
        n::PUBLISH_NO_CAP,
        n::UNPUBLISH_NO_TARGET,
        n::STAGE_NO_PATH,
        n::STAGE_NO_CAP,
        n::UNSTAGE_NO_PATH,
        n::STATS_NO_PATH,
        n::EXPAND_NO_PATH,
        n::EXPAND_MISSING,
        n::EXPAND_WORKS,
    ] {
        assert_eq!(out.status(check), "PASS", "{check}");
    }
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

/// ...and the specific checks fail when it breaks a rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_stage_without_volume_id_accepted() {
    detects(Bug::AttachStageAcceptsMissingId, &[n::STAGE_NO_ID]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_non_idempotent_controller_publish() {
    detects(
        Bug::AttachPublishNotIdempotent,
        &[c::LIFECYCLE, n::IDEMPOTENT],
    )
    .await;
}
