//! The suite against the real hostpath driver: every check passes or is
//! skipped with a reason, and nothing is left in the backend.

mod common;

use common::Hostpath;
use csi_sanity::Outcome;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_passes_every_applicable_check() {
    let driver = Hostpath::start().await;
    let mut out = Vec::new();
    let report = csi_sanity::run(driver.sanity_config(), &mut out)
        .await
        .expect("suite runs");
    let text = String::from_utf8(out).expect("utf-8");
    println!("{text}");
    assert_eq!(report.failed(), 0, "failures:\n{text}");
    for r in &report.results {
        if let Outcome::Skip(reason) = &r.outcome {
            assert!(!reason.is_empty(), "{} skipped without a reason", r.name);
        }
    }
    assert_eq!(
        text.lines().last(),
        Some(report.summary_line().as_str()),
        "the summary is the last line"
    );
    assert_eq!(report.results.len(), csi_sanity::checks::names().len());
    let (volumes, snapshots) = driver.backend();
    assert!(volumes.is_empty(), "volumes left behind: {volumes:?}");
    assert!(snapshots.is_empty(), "snapshots left behind: {snapshots:?}");
    driver.stop().await;
}

/// The checks hostpath cannot run, each with the capability it lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_skips_only_what_it_does_not_advertise() {
    use csi_sanity::checks::{controller as c, node as n};
    let driver = Hostpath::start().await;
    let report = csi_sanity::run(driver.sanity_config(), &mut std::io::sink())
        .await
        .expect("suite runs");
    let skipped: Vec<(&str, &str)> = report
        .results
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Skip(reason) => Some((r.name.as_str(), reason.as_str())),
            _ => None,
        })
        .collect();
    let lacking = |name: &str| -> &'static str {
        match name {
            c::CREATE_NO_TOPOLOGY => "advertises the VOLUME_ACCESSIBILITY_CONSTRAINTS",
            c::PUBLISH_NO_ID
            | c::PUBLISH_NO_NODE
            | c::PUBLISH_NO_CAP
            | c::PUBLISH_MISSING_VOLUME
            | c::PUBLISH_MISSING_NODE
            | c::UNPUBLISH_NO_ID
            | c::LIFECYCLE => "PUBLISH_UNPUBLISH_VOLUME controller capability",
            n::STAGE_NO_ID
            | n::STAGE_NO_PATH
            | n::STAGE_NO_CAP
            | n::UNSTAGE_NO_ID
            | n::UNSTAGE_NO_PATH => "STAGE_UNSTAGE_VOLUME node capability",
            other => panic!("unexpected skip of {other}"),
        }
    };
    for (name, reason) in &skipped {
        assert!(reason.contains(lacking(name)), "{name}: {reason}");
    }
    assert_eq!(skipped.len(), 13, "{skipped:#?}");
    assert_eq!(report.passed(), csi_sanity::checks::names().len() - 13);
    driver.stop().await;
}

/// Without topology the converse rule is checked instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_without_topology() {
    use csi_sanity::checks::controller as c;
    let driver = Hostpath::start_with(|config| config.enable_topology = false).await;
    let mut out = Vec::new();
    let report = csi_sanity::run(driver.sanity_config(), &mut out)
        .await
        .expect("suite runs");
    let text = String::from_utf8(out).expect("utf-8");
    assert_eq!(report.failed(), 0, "{text}");
    let status = |name: &str| report.get(name).map(|r| r.outcome.clone());
    assert_eq!(status(c::CREATE_NO_TOPOLOGY), Some(Outcome::Pass), "{text}");
    assert!(
        matches!(status(c::CREATE_TOPOLOGY), Some(Outcome::Skip(_))),
        "{text}"
    );
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}

/// Block volumes: the node round trip publishes a file instead of a
/// directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_block_access_type() {
    use csi_sanity::checks::node as n;
    let driver = Hostpath::start().await;
    let mut config = driver.sanity_config();
    config.access_type = csi_sanity::AccessType::Block;
    let mut out = Vec::new();
    let report = csi_sanity::run(config, &mut out).await.expect("suite runs");
    let text = String::from_utf8(out).expect("utf-8");
    assert_eq!(report.failed(), 0, "{text}");
    assert_eq!(
        report.get(n::WORKS).map(|r| r.outcome.clone()),
        Some(Outcome::Pass)
    );
    assert_eq!(driver.backend(), (vec![], vec![]));
    driver.stop().await;
}
