//! The `scale` scenario: what each sidecar costs per object of the cluster
//! that it does not manage. Operators size the sidecar's memory limit by the
//! number of volumes in the cluster, so this is the number that matters.
//!
//! One namespace holds N PersistentVolumes and N claims of another driver
//! (plus pods that mount those claims), for each N in `BENCH_SCALE_SIZES`
//! (default 0, 10,000 and 50,000). The objects are created once, growing
//! from one size to the next, and shared by both binaries. The
//! controller-manager is stopped for the whole scenario, so nothing binds
//! them or writes events about them: the API server is idle except for the
//! sidecar under test. At each size, `BENCH_RUNS` rounds (default 3) run
//! each binary once, the order alternating between rounds:
//!
//! - `scale`: start, provision one claim of our driver (time from the
//!   process start to its PV: start-up with everything cached), then idle;
//!   RSS after `BENCH_SCALE_IDLE_SECONDS` (default 60) and the peak.
//! - `scale-relist` (largest size only): once synced, the API server is
//!   restarted after an etcd compaction, so every watch re-lists; the
//!   highest RSS sampled (every 100 ms) over the next 60 s, against the RSS
//!   before.
//!
//! With `BENCH_SCALE_OWNER=ours` the N PVs and claims are instead the
//! sidecar's own, as on a cluster where it has run for a while: PVs of our
//! driver, provisioned by it, with its finalizer and a Delete policy, each
//! pre-bound to a claim of our class (and pods, when a loop watches them).
//! Nothing is left for either sidecar to do with them, but both must cache
//! them all: the memory an operator sizes for on a one-driver cluster.
//! Every line carries `"owner"`.
//!
//! The summary lines give, per size and binary, the median and min–max over
//! the rounds, the bytes per cached PV + claim pair (the slope of the median
//! RSS from the smallest to the largest size), and ratio lines.

use super::*;

const OTHER_DRIVER: &str = "other.example.com";
/// Created concurrently per request batch.
const BATCH: usize = 2000;

fn sizes() -> Vec<usize> {
    let default = if smoke_mode() {
        "0,200"
    } else {
        "0,10000,50000"
    };
    let sizes: Vec<usize> = std::env::var("BENCH_SCALE_SIZES")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let mut sizes = if sizes.is_empty() { vec![0] } else { sizes };
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Rounds per size; each round runs both binaries.
fn rounds() -> usize {
    env_usize("BENCH_RUNS", 3, 1).max(1)
}

/// The binaries of round `round`, the Go image first in even rounds.
pub fn order(round: usize) -> [Binary; 2] {
    if round.is_multiple_of(2) {
        [Binary::Upstream, Binary::Ours]
    } else {
        [Binary::Ours, Binary::Upstream]
    }
}

/// Median and range of `values` (sorted copy); `None` when empty.
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(|a, b| a.total_cmp(b));
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    Some((median, sorted[0], sorted[n - 1]))
}

fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

struct Scale {
    world: World,
    other_class: String,
    /// PVs and claims created so far (same count), of another driver or,
    /// with `ours`, of ours.
    created: usize,
    ours: bool,
    pods_created: usize,
    claim_serial: usize,
}

impl Scale {
    async fn grow_to(&mut self, size: usize, pods: usize) {
        let started = Instant::now();
        let from = self.created;
        let ns = self.world.ns.clone();
        let mut i = from;
        while i < size {
            let end = (i + BATCH).min(size);
            let mut batch = Vec::with_capacity(2 * (end - i));
            for j in i..end {
                if self.ours {
                    batch.extend(self.own_pair(j));
                    continue;
                }
                batch.push(json!({"apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": format!("scale-pv-{j}"), "labels": {"bench": "scale"},
                        "annotations": {"pv.kubernetes.io/provisioned-by": OTHER_DRIVER}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": self.other_class,
                        "csi": {"driver": OTHER_DRIVER, "volumeHandle": format!("vol-{j}"),
                                "volumeAttributes": {"pool": "default", "tier": "standard"}}}}));
                batch.push(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": format!("o{j}"), "namespace": ns, "labels": {"app": "bench"}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": self.other_class,
                             "resources": {"requests": {"storage": "1Gi"}}}}));
            }
            self.world.create_many(batch).await;
            i = end;
        }
        self.created = self.created.max(size);
        let pods = pods.min(self.created);
        let mut batch = Vec::new();
        for j in self.pods_created..pods {
            batch.push(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p{j}"), "namespace": ns, "labels": {"app": "bench"}},
                "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "env": [{"name": "A", "value": "some value"}, {"name": "B", "value": "another value"}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("o{j}")}}]}}));
        }
        self.world.create_many(batch).await;
        self.pods_created = self.pods_created.max(pods);
        eprintln!(
            "scale: {} PVs + claims, {} pods ({} s to grow from {from})",
            self.created,
            self.pods_created,
            started.elapsed().as_secs()
        );
    }

    /// PV `scale-pv-<j>` of our driver, as it stays after we provisioned it
    /// and the binder bound it, and its claim `o<j>`.
    fn own_pair(&self, j: usize) -> [Value; 2] {
        let (ns, driver, class) = (&self.world.ns, &self.world.driver, &self.world.class);
        [
            json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("scale-pv-{j}"), "labels": {"bench": "scale"},
                    "annotations": {"pv.kubernetes.io/provisioned-by": driver,
                        "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                        "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""},
                    "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"]},
                "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": class,
                    "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                        "namespace": ns, "name": format!("o{j}")},
                    "csi": {"driver": driver, "volumeHandle": format!("vol-{j}"), "fsType": "ext4",
                        "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "1764100000000-9999-hostpath.csi.k8s.io",
                            "kind": "file"}}}}),
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("o{j}"), "namespace": ns, "labels": {"app": "bench"},
                    "annotations": {"pv.kubernetes.io/bind-completed": "yes",
                        "pv.kubernetes.io/bound-by-controller": "yes",
                        "volume.kubernetes.io/storage-provisioner": driver,
                        "volume.beta.kubernetes.io/storage-provisioner": driver}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                    "volumeName": format!("scale-pv-{j}"),
                    "resources": {"requests": {"storage": "1Gi"}}}}),
        ]
    }

    /// A claim of our driver, annotated as the (stopped) controller-manager
    /// would; returns the name of the PV the sidecar will create for it.
    async fn claim_of_ours(&mut self) -> (String, String) {
        self.claim_serial += 1;
        let name = format!("first-{}", self.claim_serial);
        self.world.create(self.world.claim(&name)).await;
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.world.admin.clone(), &self.world.ns);
        let uid = api
            .get(&name)
            .await
            .ok()
            .and_then(|c| c.metadata.uid)
            .unwrap_or_default();
        (name, format!("pvc-{uid}"))
    }

    /// Deletes the claim and its PV (the sidecar is stopped: the PV's
    /// finalizer is taken off by hand).
    async fn forget(&self, claim: &str, pv: &str) {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.world.admin.clone(), &self.world.ns);
        let _ = claims.delete(claim, &DeleteParams::default()).await;
        let pvs: Api<PersistentVolume> = Api::all(self.world.admin.clone());
        let _ = pvs
            .patch(
                pv,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let _ = pvs.delete(pv, &DeleteParams::default()).await;
    }

    async fn pv_exists(&self, pv: &str) -> bool {
        let pvs: Api<PersistentVolume> = Api::all(self.world.admin.clone());
        matches!(pvs.get_opt(pv).await, Ok(Some(_)))
    }

    /// Starts `binary`, waits for its first PV, idles; one result.
    async fn idle_run(&mut self, binary: Binary, size: usize, round: usize) -> Value {
        let (claim, pv) = self.claim_of_ours().await;
        let started = Instant::now();
        let (mut sidecar, _) = self
            .world
            .start_sidecar(binary, &args("1000", "2000"))
            .await;
        let pid = sidecar.id();
        let mut first_pv = None;
        while started.elapsed() < Duration::from_secs(300) {
            if self.pv_exists(&pv).await {
                first_pv = Some(started.elapsed().as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let idle = env_usize("BENCH_SCALE_IDLE_SECONDS", 60, 5) as u64;
        tokio::time::sleep(Duration::from_secs(idle)).await;
        let rss = rss_kib(pid);
        let out = json!({
            "scenario": "scale",
            "binary": binary.name(),
            "driver": self.world.driver_kind.name(),
            "size": size,
            "round": round,
            "objects": {"pvs": size, "claims": size, "pods": if size == 0 { 0 } else { self.pods_created }},
            "seconds_to_first_pv": first_pv.map(|s| super::round(s, 3)),
            "rss_after_idle_mib": mib(rss),
            "idle_seconds": idle,
            "peak_rss_mib": mib(status_kib(pid, "VmHWM:")),
            "cpu_s": cpu_seconds(pid).map(|x| super::round(x, 2)),
            "completed": first_pv.is_some() && rss.is_some(),
        });
        keep_log(
            &self.world,
            binary,
            &format!("scale-{size}-{round}"),
            self.world.driver_kind,
        );
        sidecar.stop(Duration::from_secs(10));
        self.forget(&claim, &pv).await;
        out
    }

    /// Starts `binary`, waits until it is synced, restarts the API server
    /// (after compacting etcd, so that every watch must re-list), samples
    /// RSS for 60 s.
    async fn relist_run(&mut self, binary: Binary, size: usize, round: usize) -> Value {
        let (claim, pv) = self.claim_of_ours().await;
        let started = Instant::now();
        let (mut sidecar, user) = self
            .world
            .start_sidecar(binary, &args("1000", "2000"))
            .await;
        let pid = sidecar.id();
        let mut synced = false;
        while started.elapsed() < Duration::from_secs(300) {
            if self.pv_exists(&pv).await {
                synced = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let settle = env_usize("BENCH_SCALE_SETTLE_SECONDS", 20, 3) as u64;
        tokio::time::sleep(Duration::from_secs(settle)).await;
        let before = rss_kib(pid);
        let plane = Arc::clone(&self.world.plane);
        let restart_at = audit_now();
        let restarted = tokio::task::spawn_blocking(move || {
            plane.compact_etcd().map_err(|e| e.to_string())?;
            plane.restart_apiserver().map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        if let Err(e) = &restarted {
            eprintln!("scale-relist: API server restart failed: {e}");
        }
        let window = env_usize("BENCH_SCALE_RELIST_SECONDS", 60, 10) as u64;
        let sampling = Instant::now();
        let mut peak = before.unwrap_or(0);
        while sampling.elapsed() < Duration::from_secs(window) {
            if let Some(rss) = rss_kib(pid) {
                peak = peak.max(rss);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let after = rss_kib(pid);
        // The re-lists this sidecar made after the restart: a LIST (the Go
        // image) or a watch asking for the initial events (ours).
        let audit = self.world.plane.audit();
        let relists: usize = audit
            .iter()
            .filter(|r| {
                r.user.username == user
                    && r.request_received_timestamp.as_str() >= restart_at.as_str()
                    && r.object_ref
                        .as_ref()
                        .is_some_and(|o| o.resource == "persistentvolumes")
                    && (r.verb == "list" || r.request_uri.contains("sendInitialEvents=true"))
            })
            .count();
        let out = json!({
            "scenario": "scale-relist",
            "binary": binary.name(),
            "driver": self.world.driver_kind.name(),
            "size": size,
            "round": round,
            "rss_before_mib": mib(before),
            "relist_peak_rss_mib": mib(Some(peak)),
            "rss_after_mib": mib(after),
            "pv_relists_seen": relists,
            "completed": synced && restarted.is_ok() && before.is_some() && relists > 0,
        });
        keep_log(
            &self.world,
            binary,
            &format!("scale-relist-{round}"),
            self.world.driver_kind,
        );
        sidecar.stop(Duration::from_secs(10));
        self.forget(&claim, &pv).await;
        out
    }
}

/// The time now as the audit log writes it (RFC 3339, UTC, microseconds),
/// so that timestamps compare as strings.
fn audit_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string()
}

/// Median, min and max of `field` over the completed results of `binary`.
fn stat(
    results: &[Value],
    scenario: &str,
    size: usize,
    binary: Binary,
    field: &str,
) -> Option<(f64, f64, f64)> {
    let values: Vec<f64> = results
        .iter()
        .filter(|r| {
            r["scenario"] == scenario
                && r["size"] == size
                && r["binary"] == binary.name()
                && r["completed"] == true
        })
        .filter_map(|r| r[field].as_f64())
        .collect();
    spread(&values)
}

fn stat_json(s: Option<(f64, f64, f64)>) -> Value {
    match s {
        Some((median, min, max)) => {
            json!({"median": round(median, 3), "min": round(min, 3), "max": round(max, 3)})
        }
        None => Value::Null,
    }
}

/// Runs the scenario for one driver; prints and returns every line.
pub async fn run(plane: &Arc<ControlPlane>, driver: DriverKind) -> Vec<Value> {
    let tag = format!("sc{}", &driver.name()[..1]);
    let mut world = World::new(plane, &tag, driver).await;
    world.start_driver();
    let other_class = format!("other-{tag}");
    world
        .create(
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": other_class}, "provisioner": OTHER_DRIVER,
            "reclaimPolicy": "Retain", "volumeBindingMode": "WaitForFirstConsumer"}),
        )
        .await;
    world
        .create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": world.ns}}))
        .await;
    // Nothing binds, annotates or writes events about the objects while
    // the sidecars are measured.
    plane.stop_controller_manager();
    let ours = std::env::var("BENCH_SCALE_OWNER").is_ok_and(|v| v == "ours");
    let owner = if ours { "ours" } else { "other" };
    let mut scale = Scale {
        world,
        other_class,
        ours,
        created: 0,
        pods_created: 0,
        claim_serial: 0,
    };
    let pods = env_usize("BENCH_SCALE_PODS", 5000, 20);
    let sizes = sizes();
    let mut lines = Vec::new();
    let emit = |mut line: Value, lines: &mut Vec<Value>| {
        if let Some(fields) = line.as_object_mut() {
            fields.insert("owner".to_owned(), json!(owner));
        }
        println!("{line}");
        lines.push(line);
    };
    for &size in &sizes {
        scale.grow_to(size, if size == 0 { 0 } else { pods }).await;
        for round in 0..rounds() {
            for binary in order(round) {
                let line = scale.idle_run(binary, size, round).await;
                emit(line, &mut lines);
            }
        }
    }
    let largest = sizes.last().copied().unwrap_or(0);
    for round in 0..rounds() {
        for binary in order(round) {
            let line = scale.relist_run(binary, largest, round).await;
            emit(line, &mut lines);
        }
    }
    if let Err(e) = plane.start_controller_manager() {
        eprintln!("scale: the controller-manager did not come back: {e}");
    }

    // Summaries: per size and binary, then the slope and the ratios.
    let driver_name = driver.name();
    for &size in &sizes {
        for binary in [Binary::Upstream, Binary::Ours] {
            let line = json!({
                "summary": "scale",
                "driver": driver_name,
                "binary": binary.name(),
                "size": size,
                "rss_after_idle_mib": stat_json(stat(&lines, "scale", size, binary, "rss_after_idle_mib")),
                "peak_rss_mib": stat_json(stat(&lines, "scale", size, binary, "peak_rss_mib")),
                "seconds_to_first_pv": stat_json(stat(&lines, "scale", size, binary, "seconds_to_first_pv")),
            });
            emit(line, &mut lines);
        }
    }
    for binary in [Binary::Upstream, Binary::Ours] {
        let line = json!({
            "summary": "scale-relist",
            "driver": driver_name,
            "binary": binary.name(),
            "size": largest,
            "rss_before_mib": stat_json(stat(&lines, "scale-relist", largest, binary, "rss_before_mib")),
            "relist_peak_rss_mib": stat_json(stat(&lines, "scale-relist", largest, binary, "relist_peak_rss_mib")),
        });
        emit(line, &mut lines);
    }
    let measured = lines.clone();
    let median = |scenario: &str, size: usize, binary: Binary, field: &str| {
        stat(&measured, scenario, size, binary, field).map(|(m, _, _)| m)
    };
    let smallest = sizes.first().copied().unwrap_or(0);
    // Bytes per cached PV + claim pair: the slope of the median RSS.
    let slope = |binary: Binary| {
        let low = median("scale", smallest, binary, "rss_after_idle_mib")?;
        let high = median("scale", largest, binary, "rss_after_idle_mib")?;
        (largest > smallest).then(|| (high - low) * 1024.0 * 1024.0 / (largest - smallest) as f64)
    };
    let mut ratios = vec![];
    for &size in &sizes {
        ratios.push((
            format!("rss_after_idle_mib@{size}"),
            median("scale", size, Binary::Ours, "rss_after_idle_mib"),
            median("scale", size, Binary::Upstream, "rss_after_idle_mib"),
        ));
    }
    ratios.push((
        format!("bytes_per_pv_claim_pair@{smallest}..{largest}"),
        slope(Binary::Ours),
        slope(Binary::Upstream),
    ));
    ratios.push((
        format!("seconds_to_first_pv@{largest}"),
        median("scale", largest, Binary::Ours, "seconds_to_first_pv"),
        median("scale", largest, Binary::Upstream, "seconds_to_first_pv"),
    ));
    for (metric, ours, upstream) in ratios {
        match (ours, upstream) {
            // Every metric here is better lower; a ratio of two positive
            // medians only (a slope lost in the noise of small sizes is
            // printed as a note).
            (Some(ours), Some(upstream)) if ours > 0.0 && upstream > 0.0 => {
                let line = json!({"ratio": "scale", "driver": driver_name, "metric": metric,
                    "ours": round(ours, 2), "upstream": round(upstream, 2),
                    "ours_over_upstream": round(ours / upstream, 3),
                    "ours_better_by": round(upstream / ours, 2), "of": "medians"});
                emit(line, &mut lines);
            }
            (ours, upstream) => {
                let line = json!({"note": "scale", "driver": driver_name, "metric": metric,
                    "ours": ours.map(|v| round(v, 2)), "upstream": upstream.map(|v| round(v, 2)),
                    "why": "no ratio: a median is missing or not positive"});
                emit(line, &mut lines);
            }
        }
    }
    if let (Some(ours), Some(upstream)) = (
        median("scale-relist", largest, Binary::Ours, "relist_peak_rss_mib"),
        median(
            "scale-relist",
            largest,
            Binary::Upstream,
            "relist_peak_rss_mib",
        ),
    ) {
        let line = json!({"ratio": "scale-relist", "driver": driver_name,
            "metric": format!("relist_peak_rss_mib@{largest}"),
            "ours": round(ours, 2), "upstream": round(upstream, 2),
            "ours_over_upstream": round(ours / upstream, 3),
            "ours_better_by": round(upstream / ours, 2), "of": "medians"});
        emit(line, &mut lines);
    }
    lines
}
