//! End-to-end tests of operating the sidecar: leader election with two
//! processes, a killed and a partitioned leader, metrics and health checks
//! over HTTP, graceful shutdown, and the client-side rate limit — the real
//! binary against the hostpath driver and each API server backend.

mod support;

#[path = "operation/monitoring.rs"]
mod monitoring;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use csi_hostpath::faults::Fault;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube_testserver::{RequestMatch, Verb};
use serde_json::json;
use support::sidecar::Sidecar;
use support::{Backend, ClusterConfig, Env, free_port, http_get};

e2e!(ClusterConfig::standard();
    only_the_leader_provisions_and_a_killed_leader_is_replaced,
    metrics_and_health_checks_over_http,
    sigterm_finishes_the_call_in_flight_releases_the_lease_and_exits_zero,
    without_the_release_gate_the_lease_is_kept_until_it_expires,
    client_side_rate_limit_bounds_the_request_rate,
    a_follower_writes_nothing_and_takes_a_released_lease_at_once,
    a_driver_gone_longer_than_the_timeout_is_dialled_again,
);

/// Short timings so a failover takes seconds: lease 2s, renew deadline 1s,
/// retry period 500ms.
const ELECTION: &[&str] = &[
    "--leader-election",
    "--leader-election-lease-duration=2s",
    "--leader-election-renew-deadline=1s",
    "--leader-election-retry-period=500ms",
];
const LEASE_DURATION: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(500);

const BECAME_LEADER: &str = "became leader";
const WAITING: &str = "waiting to acquire the leader lease";
const CALLING_CREATE: &str = "calling CreateVolume";

/// A sidecar process of our own, beside (or instead of) the harness's one,
/// with the harness's flags; its log `<name>.log`.
fn start(env: &Env, name: &str, kubeconfig: &Path, extra: &[&str]) -> Sidecar {
    let log = env.dir.path().join(format!("{name}.log"));
    env.launch(kubeconfig).args(extra).start(name, &log)
}

async fn wait_log(sidecars: &[&Sidecar], who: &Sidecar, needles: &[&str], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !who.logged(needles) {
        if Instant::now() > deadline {
            let logs: Vec<String> = sidecars.iter().map(|s| s.dump()).collect();
            panic!("{} never logged {needles:?}\n{}", who.name, logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn lease(env: &Env) -> Option<Lease> {
    Api::<Lease>::namespaced(env.client.clone(), &env.ns)
        .get_opt(&csi_provisioner::leader::lease_name(&env.driver_name))
        .await
        .expect("get lease")
}

async fn only_the_leader_provisions_and_a_killed_leader_is_replaced(backend: Backend) {
    let env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let kubeconfig = env.sidecar_kubeconfig(ELECTION).await;
    let mut a = start(&env, "a", &kubeconfig, ELECTION);
    wait_log(&[&a], &a, &[BECAME_LEADER], Duration::from_secs(20)).await;
    let b = start(&env, "b", &kubeconfig, ELECTION);
    wait_log(&[&a, &b], &b, &[WAITING], Duration::from_secs(20)).await;
    let holder = lease(&env)
        .await
        .and_then(|l| l.spec?.holder_identity)
        .expect("lease holder");
    assert!(!holder.is_empty());

    for name in ["one", "two", "three"] {
        env.create_pvc(&env.ns, name, "fast", "5Mi", json!({}))
            .await;
    }
    for name in ["one", "two", "three"] {
        env.wait_bound(&env.ns, name).await;
    }
    assert!(a.logged(&[CALLING_CREATE]), "{}", a.dump());
    assert!(
        !b.logged(&[CALLING_CREATE]),
        "the follower called the driver\n{}",
        b.dump()
    );

    // Kill the leader while its CreateVolume is under way (the journal entry
    // is written): the new leader must finish it without a second volume.
    env.set_faults(vec![Fault::delay("CreateVolume", Duration::from_secs(2))]);
    let pending = format!("{}/pending", env.ns);
    env.create_pvc(&env.ns, "pending", "fast", "5Mi", json!({}))
        .await;
    wait_log(
        &[&a, &b],
        &a,
        &[CALLING_CREATE, &pending],
        Duration::from_secs(20),
    )
    .await;
    let killed = Instant::now();
    a.kill();
    env.clear_faults();
    wait_log(&[&a, &b], &b, &[BECAME_LEADER], Duration::from_secs(20)).await;
    let failover = killed.elapsed();
    env.wait_bound(&env.ns, "pending").await;
    let finished = killed.elapsed();
    println!(
        "failover: new leader after {failover:?} (lease 2s, renew deadline 1s, retry 500ms); \
         pending claim bound {finished:?} after the kill"
    );
    // The follower first sees the last renewal up to one jittered retry
    // period (≤ 500ms × 2.2 = 1.1s) after it was written, waits a full lease
    // duration from then, and takes over at its next jittered poll: at most
    // lease + 2 × 1.1s after the last renewal, which is no later than the
    // kill. It cannot be earlier than lease − one retry period.
    assert!(
        failover >= LEASE_DURATION - RETRY_PERIOD.mul_f64(2.2),
        "took over too early: {failover:?}"
    );
    assert!(
        failover <= LEASE_DURATION + RETRY_PERIOD.mul_f64(4.4) + Duration::from_secs(1),
        "failover too slow: {failover:?}\n{}",
        b.dump()
    );
    assert!(
        b.logged(&["resuming provisioning recorded in the journal", &pending]),
        "the new leader did not pick up the old leader's journal\n{}",
        b.dump()
    );
    assert_eq!(env.backend_volumes().len(), 4, "one volume per claim");
    assert_eq!(env.pvs().await.len(), 4);
    env.assert_consistent().await;
    let new_holder = lease(&env)
        .await
        .and_then(|l| l.spec?.holder_identity)
        .expect("lease holder");
    assert_ne!(new_holder, holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_itself_and_the_other_takes_over() {
    // Needs the API test server (fault injection or exact counters).
    let env = Env::new(Backend::TestServer).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    // The leader talks to the API server through a listener of its own,
    // so dropping that listener partitions only the leader.
    let leader_listener = env.api().serve_http().await.expect("second listener");
    let mut a = start(&env, "a", leader_listener.kubeconfig_path(), ELECTION);
    wait_log(&[&a], &a, &[BECAME_LEADER], Duration::from_secs(20)).await;
    let b = start(&env, "b", &env.admin_kubeconfig(), ELECTION);
    wait_log(&[&a, &b], &b, &[WAITING], Duration::from_secs(20)).await;

    let cut = Instant::now();
    drop(leader_listener);
    let code = a.wait_exit(Duration::from_secs(10));
    let stopped = cut.elapsed();
    println!(
        "partitioned leader exited with {code:?} {stopped:?} after the cut (renew deadline 1s)"
    );
    assert!(
        matches!(code, Some(c) if c != 0),
        "partitioned leader must exit non-zero, got {code:?}\n{}",
        a.dump()
    );
    assert!(
        a.logged(&["failed to renew the leader lease within the renew deadline"]),
        "{}",
        a.dump()
    );
    // It stops within the renew deadline after its last renewal (at most a
    // retry period before the cut), plus the exit.
    assert!(stopped <= Duration::from_secs(3), "{stopped:?}");
    wait_log(&[&a, &b], &b, &[BECAME_LEADER], Duration::from_secs(20)).await;
    env.create_pvc(&env.ns, "after", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "after").await;
    env.assert_consistent().await;
}

/// A lease lost while the caches are still filling ends the process, as a
/// lease lost later does. Here the PV cache cannot fill (every list and
/// watch of PVs fails) when the sidecar wins the Lease, then its renewals
/// fail: once lost, the fence lets no byte out, so the caches could never
/// get ready, and a process waiting for them would hang for ever, neither
/// leader nor candidate (chaos seed 63423: no replica took over from a
/// frozen leader while the other one hung so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_before_the_caches_are_ready_ends_the_process() {
    // Needs the API test server (fault injection).
    let env = Env::new(Backend::TestServer).await;
    for verb in [Verb::List, Verb::Watch] {
        env.api().fail_next(
            100_000,
            RequestMatch::new(verb, "persistentvolumes").remote(),
            500,
        );
    }
    let mut a = start(&env, "a", &env.admin_kubeconfig(), ELECTION);
    wait_log(&[&a], &a, &[BECAME_LEADER], Duration::from_secs(20)).await;
    assert!(
        !a.logged(&["provisioning loop running"]),
        "the caches got ready: the test did not test the start-up\n{}",
        a.dump()
    );
    let cut = Instant::now();
    for verb in [Verb::Get, Verb::Update] {
        env.api()
            .fail_next(100_000, RequestMatch::new(verb, "leases").remote(), 500);
    }
    let code = a.wait_exit(Duration::from_secs(10));
    assert!(
        matches!(code, Some(c) if c != 0),
        "a sidecar that lost its lease during start-up must exit non-zero, got {code:?} \
         {:?} after its renewals began to fail\n{}",
        cut.elapsed(),
        a.dump()
    );
    assert!(
        a.logged(&["failed to renew the leader lease within the renew deadline"]),
        "{}",
        a.dump()
    );
}

async fn metrics_and_health_checks_over_http(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let port = free_port();
    let endpoint = format!("--http-endpoint=127.0.0.1:{port}");
    let mut flags = vec![endpoint.as_str()];
    flags.extend_from_slice(ELECTION);
    env.set_faults(vec![
        Fault::error("CreateVolume", tonic::Code::Internal).times(1),
    ]);
    env.start_sidecar(&flags).await;
    env.create_pvc(&env.ns, "m1", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "m1").await;
    env.create_pvc(&env.ns, "m2", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "m2").await;
    env.delete_pvc(&env.ns, "m1").await;
    env.wait_for("m1's volume deleted", Duration::from_secs(20), || async {
        (env.backend_volumes().len() == 1).then_some(())
    })
    .await;

    let class = env.class("fast");
    let csi = |method: &str, code: &str| {
        format!(
            "csi_sidecar_operations_seconds_count{{driver_name=\"{}\",grpc_status_code=\"{code}\",method_name=\"{method}\"}}",
            env.driver_name
        )
    };
    let expected = [
        format!("{} 2", csi("/csi.v1.Controller/CreateVolume", "OK")),
        format!("{} 1", csi("/csi.v1.Controller/CreateVolume", "Internal")),
        format!("{} 1", csi("/csi.v1.Controller/DeleteVolume", "OK")),
        // Calls before GetPluginInfo answered carry csi-lib-utils'
        // placeholder name, as upstream.
        "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/GetPluginInfo\"} 1".to_owned(),
        "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/Probe\"}".to_owned(),
        format!("controller_persistentvolumeclaim_provision_total{{class=\"{class}\",source=\"\"}} 2"),
        format!("controller_persistentvolumeclaim_provision_failed_total{{class=\"{class}\",source=\"\"}} 1"),
        format!("controller_persistentvolumeclaim_provision_duration_seconds_count{{class=\"{class}\",source=\"\"}} 2"),
        format!("controller_persistentvolume_delete_total{{class=\"{class}\"}} 1"),
        format!("controller_persistentvolume_delete_duration_seconds_count{{class=\"{class}\"}} 1"),
        "workqueue_depth{name=\"claims\"} 0".to_owned(),
        "workqueue_retries_total{name=\"claims\"}".to_owned(),
        "workqueue_adds_total{name=\"volumes\"}".to_owned(),
        "workqueue_queue_duration_seconds_count{name=\"claims\"}".to_owned(),
        "workqueue_work_duration_seconds_bucket{name=\"claims\",le=\"9.999999999999999e-06\"}"
            .to_owned(),
        "workqueue_unfinished_work_seconds{name=\"volumes\"}".to_owned(),
        "workqueue_longest_running_processor_seconds{name=\"claims\"}".to_owned(),
        // This replica leads; upstream's label is csi-lib-utils' empty
        // election name.
        "leader_election_master_status{name=\"\"} 1".to_owned(),
        "process_resident_memory_bytes ".to_owned(),
        "process_start_time_seconds ".to_owned(),
        // The service-level extras: each claim observed once, when its PV
        // was saved (m1's failed attempt is no second observation).
        format!("csi_provisioner_claim_provisioning_seconds_count{{storage_class=\"{class}\"}} 2"),
        format!("csi_provisioner_driver_call_seconds_count{{storage_class=\"{class}\",method=\"CreateVolume\",grpc_status_code=\"OK\"}} 2"),
        format!("csi_provisioner_driver_call_seconds_count{{storage_class=\"{class}\",method=\"CreateVolume\",grpc_status_code=\"Internal\"}} 1"),
        format!("csi_provisioner_driver_call_seconds_count{{storage_class=\"{class}\",method=\"DeleteVolume\",grpc_status_code=\"OK\"}} 1"),
        // Nothing waits any more; the leader reports the class at 0.
        format!("csi_provisioner_claims_pending{{storage_class=\"{class}\"}} 0"),
        format!("csi_provisioner_volumes_pending_deletion{{storage_class=\"{class}\"}} 0"),
        "\ncsi_provisioner_journal_entries 0\n".to_owned(),
    ];
    // The release time (status.lastPhaseTransitionTime) is the real API
    // server's; the test server does not set it, and no start time means
    // no observation.
    let deletion_observed =
        format!("csi_provisioner_volume_deletion_seconds_count{{storage_class=\"{class}\"}} 1");
    let expected: Vec<String> = expected
        .into_iter()
        .chain(env.is_real().then_some(deletion_observed))
        .collect();
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http_get(port, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        if expected.iter().all(|e| body.contains(e.as_str())) {
            break;
        }
        last = body;
        if Instant::now() > deadline {
            let missing: Vec<&String> = expected
                .iter()
                .filter(|e| !last.contains(e.as_str()))
                .collect();
            panic!("metrics missing {missing:?}\n{last}\n{}", env.logs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last.is_empty() || last.contains("# TYPE"));
    // Every metric deploy/monitoring/ queries is one of this scrape's.
    let (status, scrape) = http_get(port, "/metrics").await;
    assert_eq!(status, 200, "{scrape}");
    // The test server sets no status.lastPhaseTransitionTime, so no
    // deletion is timed there; the real-cluster run checks that family.
    let unobservable: &[&str] = if env.is_real() {
        &[]
    } else {
        &["csi_provisioner_volume_deletion_seconds"]
    };
    monitoring::assert_monitoring_matches(&scrape, unobservable);

    let (status, body) = http_get(port, "/healthz/leader-election").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(http_get(port, "/healthz").await.0, 200);
    assert_eq!(http_get(port, "/readyz").await.0, 200);
    assert_eq!(http_get(port, "/nothing-here").await.0, 404);

    // A driver that stops answering makes /healthz fail (not the lease
    // check: the lease is still renewed).
    env.stop_driver().await;
    let (status, body) = http_get(port, "/healthz").await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("CSI driver"), "{body}");
    assert_eq!(http_get(port, "/healthz/leader-election").await.0, 200);

    // A claim the stopped driver cannot provision waits, journalled: the
    // leader's backlog gauges count it.
    env.create_pvc(&env.ns, "m3", "fast", "5Mi", json!({}))
        .await;
    let waiting = [
        format!("csi_provisioner_claims_pending{{storage_class=\"{class}\"}} 1\n"),
        "\ncsi_provisioner_journal_entries 1\n".to_owned(),
    ];
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !waiting.iter().all(|w| last.contains(w.as_str())) {
        assert!(
            Instant::now() < deadline,
            "m3 never counted as waiting: {waiting:?}\n{last}\n{}",
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = http_get(port, "/metrics").await.1;
    }
}

/// The Go image exits when its driver's connection is lost (the container
/// restarts); ours re-dials (docs/design.md, "Deliberate differences"). While
/// the driver is gone, /readyz fails and `csi_provisioner_driver_reachable`
/// is 0; when it is back, the same process provisions what came meanwhile.
async fn a_driver_gone_longer_than_the_timeout_is_dialled_again(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let port = free_port();
    let endpoint = format!("--http-endpoint=127.0.0.1:{port}");
    env.start_sidecar(&[endpoint.as_str(), "--timeout=1s"])
        .await;
    env.create_pvc(&env.ns, "before", "fast", "5Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "before").await;
    let reachable = |metrics: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with("csi_provisioner_driver_reachable "))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    let (_, metrics) = http_get(port, "/metrics").await;
    assert_eq!(reachable(&metrics).as_deref(), Some("1"), "{metrics}");

    env.stop_driver().await;
    let gone = Instant::now();
    env.create_pvc(&env.ns, "during", "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "the driver unreachable in /readyz and the metric",
        Duration::from_secs(30),
        || async {
            let (ready, _) = http_get(port, "/readyz").await;
            let (_, metrics) = http_get(port, "/metrics").await;
            (ready != 200 && reachable(&metrics).as_deref() == Some("0")).then_some(())
        },
    )
    .await;
    // Gone for several times --timeout, with calls failing meanwhile.
    env.wait_for(
        "the driver gone for 3 s (--timeout is 1 s)",
        Duration::from_secs(10),
        || async { (gone.elapsed() >= Duration::from_secs(3)).then_some(()) },
    )
    .await;
    assert!(
        env.backend_volumes().len() == 1,
        "nothing provisioned without a driver"
    );

    env.start_driver();
    env.wait_bound(&env.ns, "during").await;
    env.wait_for(
        "the driver reachable again",
        Duration::from_secs(30),
        || async {
            let (ready, _) = http_get(port, "/readyz").await;
            let (_, metrics) = http_get(port, "/metrics").await;
            (ready == 200 && reachable(&metrics).as_deref() == Some("1")).then_some(())
        },
    )
    .await;
    env.assert_consistent().await;
    // The same process all along: it ends on SIGTERM, with 0.
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

async fn sigterm_finishes_the_call_in_flight_releases_the_lease_and_exits_zero(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.set_faults(vec![Fault::delay(
        "CreateVolume",
        Duration::from_millis(1500),
    )]);
    // Upstream's timings, not `ELECTION`'s: nothing here waits for a
    // failover, and a renewal missed within `ELECTION`'s one-second
    // deadline (CI saw it once, with test binaries compiling on both
    // cores) loses the Lease and ends the process with 1 before the
    // SIGTERM this test is about.
    let flags = [
        "--leader-election",
        "--leader-election-lease-duration=15s",
        "--leader-election-renew-deadline=10s",
        "--leader-election-retry-period=2s",
        "--feature-gates=ReleaseLeaderElectionOnExit=true",
    ];
    env.start_sidecar(&flags).await;
    env.wait_for("leadership", Duration::from_secs(20), || async {
        env.logs().contains(BECAME_LEADER).then_some(())
    })
    .await;
    env.create_pvc(&env.ns, "slow", "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "CreateVolume under way",
        Duration::from_secs(20),
        || async { env.logs().contains(CALLING_CREATE).then_some(()) },
    )
    .await;
    let asked = Instant::now();
    let code = env.stop_sidecar();
    println!(
        "SIGTERM with a CreateVolume in flight: exited {code:?} after {:?}",
        asked.elapsed()
    );
    assert_eq!(code, Some(0), "{}", env.logs());
    // The call in flight was finished and recorded, not abandoned.
    let pvs = env.pvs().await;
    assert_eq!(pvs.len(), 1, "{}", env.logs());
    env.assert_consistent().await;
    let spec = lease(&env).await.and_then(|l| l.spec).expect("lease");
    assert_eq!(spec.holder_identity.as_deref(), Some(""), "released");
    assert_eq!(spec.lease_duration_seconds, Some(1));
}

async fn without_the_release_gate_the_lease_is_kept_until_it_expires(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.start_sidecar(ELECTION).await;
    env.wait_for("leadership", Duration::from_secs(20), || async {
        env.logs().contains(BECAME_LEADER).then_some(())
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
    let spec = lease(&env).await.and_then(|l| l.spec).expect("lease");
    assert!(
        spec.holder_identity.is_some_and(|h| !h.is_empty()),
        "not released without the gate"
    );
}

/// Flags of the Go image that have nothing to act on here do not stop the
/// pod: they are named once at start (`--enable-pprof` is accepted too, and
/// not named: it acts), and the JSON log format is one
/// object per line with klog's keys. (A kubeconfig that does not exist
/// ends the run right after the flag report, before any driver is needed.)
#[test]
fn upstream_only_flags_start_and_are_named_once_in_json_logs() {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .args([
            "--enable-pprof",
            "--automaxprocs",
            "--log-flush-frequency=10s",
            "--logging-format=json",
            "--vmodule=claims=4",
            "--feature-gates=WatchList=false",
            "--kubeconfig=/does/not/exist",
            "--csi-address=/does/not/exist.sock",
        ])
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    for line in &lines {
        assert!(line["ts"].is_f64(), "{line}");
        assert!(line["msg"].is_string(), "{line}");
        assert!(line["caller"].is_string(), "{line}");
    }
    for flag in ["--automaxprocs", "--log-flush-frequency"] {
        let named: Vec<_> = lines.iter().filter(|l| l["flag"] == flag).collect();
        assert_eq!(
            named.len(),
            1,
            "{flag} named {} times:\n{stderr}",
            named.len()
        );
        assert_eq!(named[0]["v"], 0);
    }
    // Accepted, and not named: it serves profiles (src/pprof.rs).
    assert!(
        !lines.iter().any(|l| l["flag"] == "--enable-pprof"),
        "{stderr}"
    );
    assert!(
        lines.iter().any(|l| l["gate"] == "WatchList=false"),
        "{stderr}"
    );
    let last = lines.last().expect("a line");
    assert!(
        last.get("v").is_none(),
        "the fatal error is an error: {last}"
    );
    assert!(
        last["msg"]
            .as_str()
            .is_some_and(|m| m.contains("/does/not/exist")),
        "{last}"
    );
}

/// A kubeconfig whose client certificate is X.509 v1 (which rustls cannot
/// use) stops the sidecar at start with what is wrong and how to re-issue
/// it, before it waits for any driver.
#[test]
fn an_x509_v1_client_certificate_is_refused_at_start_with_the_fix() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let fixture = |name: &str| {
        std::fs::read_to_string(format!(
            "{}/tests/fixtures/tls/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .expect("fixture")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: {}\n\
contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n\
users:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&fixture("ca.crt")),
            b64(&fixture("client-v1.crt")),
            b64(&fixture("client.key"))
        ),
    )
    .expect("write kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--csi-address=/does/not/exist.sock")
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for needle in [
        "X.509 version 1",
        "openssl x509 -req",
        "-extfile client-ext.cnf",
    ] {
        assert!(stderr.contains(needle), "{needle} missing:\n{stderr}");
    }
    assert!(!stderr.contains("UnsupportedCertVersion"), "{stderr}");
}

/// N requests at qps Q with burst B take at least (N − B)/Q: measured on
/// the real binary, counting every non-watch request of the sidecar that the
/// API server saw.
async fn client_side_rate_limit_bounds_the_request_rate(backend: Backend) {
    const QPS: f64 = 20.0;
    const BURST: usize = 5;
    const CLAIMS: usize = 16;
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    for i in 0..CLAIMS {
        env.create_pvc(&env.ns, &format!("r{i}"), "fast", "5Mi", json!({}))
            .await;
    }
    env.reset_counters();
    let started = Instant::now();
    env.start_sidecar(&["--kube-api-qps=20", "--kube-api-burst=5"])
        .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), &env.ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let bound = claims
            .list(&Default::default())
            .await
            .expect("list claims")
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound == CLAIMS {
            break;
        }
        assert!(Instant::now() < deadline, "not all bound\n{}", env.logs());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    let requests = env.sidecar_requests();
    let non_watch: usize = requests
        .iter()
        .filter(|(k, _)| !k.starts_with("watch "))
        .map(|(_, n)| n)
        .sum();
    let writes = env.sidecar_writes();
    let bound = Duration::from_secs_f64(non_watch.saturating_sub(BURST) as f64 / QPS);
    println!(
        "rate limit qps={QPS} burst={BURST} ({}): {non_watch} non-watch requests ({writes} writes) for {CLAIMS} claims \
         in {took:?}; lower bound (N - B)/Q = {bound:?}; {:.1} requests/s",
        env.backend_name(),
        non_watch as f64 / took.as_secs_f64()
    );
    assert!(
        non_watch > BURST * 3,
        "too few requests to measure: {requests:?}"
    );
    assert!(
        took >= bound,
        "{non_watch} requests in {took:?} < {bound:?}"
    );
    env.assert_consistent().await;
}

/// A follower writes nothing at all — counted by the API server — and a
/// lease released by its holder (a Go replica, here played by the test) is
/// taken at once, without waiting for it to expire.
async fn a_follower_writes_nothing_and_takes_a_released_lease_at_once(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let name = csi_provisioner::leader::lease_name(&env.driver_name);
    // Held by another replica for an hour: the follower would wait that long.
    let now = "2026-01-01T00:00:00.000000Z";
    env.create(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": env.ns},
        "spec": {"holderIdentity": "go-replica_1", "leaseDurationSeconds": 3600,
                 "acquireTime": now, "renewTime": now, "leaseTransitions": 4},
    }))
    .await;
    env.reset_counters();
    env.start_sidecar(ELECTION).await;
    env.wait_for("the follower waiting", Duration::from_secs(20), || async {
        env.logs().contains(WAITING).then_some(())
    })
    .await;
    env.create_pvc(&env.ns, "queued", "fast", "5Mi", json!({}))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reads = env.sidecar_request_count("get", "leases");
    assert!(reads >= 2, "the follower polls the lease: {reads}");
    assert_eq!(
        env.sidecar_writes(),
        0,
        "a follower made writes: {:?}\n{}",
        env.sidecar_requests(),
        env.logs()
    );
    assert!(env.backend_volumes().is_empty());
    assert!(!env.logs().contains(CALLING_CREATE));

    // The Go replica releases the lease as client-go does.
    let mut lease = env
        .get("coordination.k8s.io/v1", "Lease", &env.ns, &name)
        .await
        .expect("lease");
    lease["spec"]["holderIdentity"] = json!("");
    lease["spec"]["leaseDurationSeconds"] = json!(1);
    let released = Instant::now();
    env.replace(lease).await;
    env.wait_for("leadership", Duration::from_secs(10), || async {
        env.logs().contains(BECAME_LEADER).then_some(())
    })
    .await;
    let took = released.elapsed();
    println!("released lease taken over after {took:?}");
    assert!(
        took <= RETRY_PERIOD.mul_f64(2.2) + Duration::from_millis(500),
        "{took:?}"
    );
    env.wait_bound(&env.ns, "queued").await;
    let spec = lease_spec(&env).await;
    assert_eq!(spec.lease_transitions, Some(5));
    assert_eq!(spec.lease_duration_seconds, Some(2));
    env.assert_consistent().await;
    assert_eq!(env.stop_sidecar(), Some(0));
}

async fn lease_spec(env: &Env) -> k8s_openapi::api::coordination::v1::LeaseSpec {
    lease(env).await.and_then(|l| l.spec).expect("lease spec")
}
