//! Benchmarks of the real `csi-provisioner` binary against the in-memory API
//! test server and the hostpath driver (docs/design.md, "How it is tested").
//! Prints numbers; asserts
//! only that the runs completed.
//!
//! `cargo bench --bench provisioning` (sizes: BENCH_CLAIMS, default 300;
//! BENCH_EXISTING, default 10000).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_testserver::{TestServer, Verb};
use serde_json::json;

const DRIVER: &str = csi_hostpath::DEFAULT_DRIVER_NAME;
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cluster(api: &TestServer) {
    api.create_object(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "labels": {csi_hostpath::TOPOLOGY_KEY: "node-1"}}}))
        .expect("node");
    api.create_object(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "node-1"},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": "node-1", "topologyKeys": [csi_hostpath::TOPOLOGY_KEY]}]}}))
        .expect("csinode");
    api.create_object(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast"}, "provisioner": DRIVER, "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate"}),
    )
    .expect("class");
}

fn sidecar(socket: &Path, kubeconfig: &Path, log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .arg(format!("--csi-address={}", socket.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--worker-threads=100")
        .arg("--retry-interval-start=100ms")
        // Client-side limits would measure the limiter, not the sidecar.
        .arg("--kube-api-qps=100000")
        .arg("--kube-api-burst=100000")
        .env_remove("KUBECONFIG")
        .env("NAMESPACE", "default")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).expect("log")))
        .spawn()
        .expect("spawn csi-provisioner")
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

async fn wait_until(
    what: &str,
    timeout: Duration,
    log: &Path,
    mut done: impl FnMut() -> bool,
) -> Duration {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > timeout {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            panic!(
                "timed out: {what}\nlast sidecar log lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// Provisioning throughput and API requests per provisioned volume.
async fn throughput(claims: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = TestServer::builder().controller_manager(true).build();
    let http = api.serve_http().await.expect("http");
    cluster(&api);
    let mut driver = csi_hostpath::Config::for_tests(dir.path());
    driver.node_id = "node-1".to_owned();
    let (stop_driver, rx) = tokio::sync::oneshot::channel::<()>();
    let serve = tokio::spawn(csi_hostpath::serve(driver.clone(), async {
        let _ = rx.await;
    }));
    let log = dir.path().join("throughput.log");
    let child = sidecar(&driver.endpoint, http.kubeconfig_path(), &log);
    // Wait until the sidecar has listed claims and volumes (a watch is
    // logged only when it ends, a list when it is answered).
    wait_until("sidecar started", Duration::from_secs(60), &log, || {
        api.request_count(Verb::List, "persistentvolumeclaims") > 0
            && api.request_count(Verb::List, "persistentvolumes") > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.reset_counters();

    eprintln!("bench: sidecar up, creating {claims} claims");
    let started = Instant::now();
    for i in 0..claims {
        api.create_object(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("claim-{i}"), "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                     "resources": {"requests": {"storage": "1Mi"}}}}))
            .expect("claim");
    }
    wait_until("all claims bound", Duration::from_secs(120), &log, || {
        api.list_objects("v1", "PersistentVolume", None).len() == claims
    })
    .await;
    let elapsed = started.elapsed();
    // Let trailing writes (journal pruning, events) land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counters: BTreeMap<(Verb, String), u64> = api.counters();
    stop(child);
    let _ = stop_driver.send(());
    let _ = serve.await;

    println!(
        "provisioning throughput: {claims} claims in {:.2} s = {:.1} claims/s (worker-threads 100)",
        elapsed.as_secs_f64(),
        claims as f64 / elapsed.as_secs_f64()
    );
    let per_volume = |n: u64| n as f64 / claims as f64;
    let mut writes = 0;
    let mut total = 0;
    println!(
        "API requests per provisioned volume (sidecar only, watches counted once per stream):"
    );
    for ((verb, resource), n) in &counters {
        if matches!(verb, Verb::NonResource) {
            continue;
        }
        total += n;
        if matches!(
            verb,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete
        ) {
            writes += n;
        }
        println!(
            "  {:<7} {:<28} {:>8} ({:.3}/volume)",
            format!("{verb:?}"),
            resource,
            n,
            per_volume(*n)
        );
    }
    println!(
        "  total {total} ({:.2}/volume), writes {writes} ({:.2}/volume)",
        per_volume(total),
        per_volume(writes)
    );
}

/// Start-up over a cluster full of old PVs: time until every one carries
/// the finalizer, and resident memory with everything cached.
async fn existing_volumes(count: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = TestServer::builder().build();
    let http = api.serve_http().await.expect("http");
    cluster(&api);
    for i in 0..count {
        let name = format!("pvc-old-{i}");
        api.create_object(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("old-{i}"), "namespace": "default",
                         "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "volumeName": name,
                     "resources": {"requests": {"storage": "1Mi"}}}}))
            .expect("claim");
        let pv = api
            .create_object(json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER}},
                "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"},
                         "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
                         "claimRef": {"namespace": "default", "name": format!("old-{i}")},
                         "csi": {"driver": DRIVER, "volumeHandle": format!("vol-{i}")}}}))
            .expect("pv");
        let mut pv = pv;
        pv["status"] = json!({"phase": "Bound"});
        api.update_object_status(pv).expect("bound");
    }
    let mut driver = csi_hostpath::Config::for_tests(dir.path());
    driver.node_id = "node-1".to_owned();
    let (stop_driver, rx) = tokio::sync::oneshot::channel::<()>();
    let serve = tokio::spawn(csi_hostpath::serve(driver.clone(), async {
        let _ = rx.await;
    }));
    api.reset_counters();
    let started = Instant::now();
    let log = dir.path().join("existing.log");
    let child = sidecar(&driver.endpoint, http.kubeconfig_path(), &log);
    let pid = child.id();
    wait_until(
        "finalizer on every existing PV",
        Duration::from_secs(1200),
        &log,
        || {
            api.list_objects("v1", "PersistentVolume", None)
                .iter()
                .all(|pv| {
                    pv["metadata"]["finalizers"]
                        .as_array()
                        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
                })
        },
    )
    .await;
    let elapsed = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_kib(pid);
    let patches = api.request_count(Verb::Patch, "persistentvolumes");
    stop(child);
    let _ = stop_driver.send(());
    let _ = serve.await;
    println!(
        "finalizer on {count} existing PVs: {:.2} s from process start ({:.0} PVs/s), {patches} PV patches",
        elapsed.as_secs_f64(),
        count as f64 / elapsed.as_secs_f64()
    );
    match rss {
        Some(kib) => println!(
            "resident memory with {count} PVs and {count} PVCs cached: {:.1} MiB",
            kib as f64 / 1024.0
        ),
        None => println!("resident memory: /proc not readable"),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is ignored.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        throughput(env_usize("BENCH_CLAIMS", 300)).await;
        existing_volumes(env_usize("BENCH_EXISTING", 10_000)).await;
    });
}
