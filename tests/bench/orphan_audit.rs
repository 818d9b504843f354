//! The `orphan-audit` scenario: what one orphan audit costs at the
//! cluster's size (docs/operations.md, "Orphan audit"). Ours only: the Go
//! image has no audit, so there is nothing to compare it with; the numbers
//! are the cost an operator pays for `--orphan-audit-interval`.
//!
//! Made once for the scenario and kept by every run: the driver's state
//! directory with `BENCH_AUDIT_VOLUMES` volumes (default 50,000; the
//! records `CreateVolume` writes, written straight to disk), and one PV for
//! each of them but the last `BENCH_AUDIT_ORPHANS` (default 10), Available
//! and `Retain`, of a class no claim names. Each run starts our driver on
//! that directory (in process) and the sidecar behind the counting proxy
//! with `--orphan-audit-interval=BENCH_AUDIT_INTERVAL_SECONDS` (default
//! 60 s; an audit runs one interval after the start and every interval
//! after), and waits for the second audit, the first that reports (a
//! volume must be found without a PV twice). Per run it prints the first
//! and second audit's time (their log lines' `took`), and for the second
//! audit alone: the `ListVolumes` calls (`csi_sidecar_operations_seconds`
//! of `/metrics`), the live PV list's requests and answer bytes (the
//! proxy's `list persistentvolumes`; the PV watch's own list came before
//! the first audit), every other request in that window, the CPU seconds,
//! the RSS before it and the highest RSS sampled every 100 ms until its
//! end. The orphans reported must be the volumes without a PV.

use super::*;

/// The driver every run's PVs and volumes are of (the PVs outlive runs).
const AUDIT_DRIVER: &str = "audit.bench.example.com";

/// The volumes and PVs every run audits.
pub(super) struct Background {
    /// Holds the driver's state directory, `state/` inside it.
    dir: tempfile::TempDir,
    pub(super) volumes: usize,
    pub(super) orphans: usize,
}

impl Background {
    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

/// The id of volume `i`: a bare UUID, as the upstream hostpath driver's
/// (no name in it, so the audit's prefix filter keeps every volume).
fn volume_id(i: usize) -> String {
    format!("0a0d17a0-0000-4000-8000-{i:012}")
}

/// Writes the volumes and creates the PVs, all but the last `orphans`
/// volumes named by one.
pub(super) async fn prepare(
    plane: &Arc<ControlPlane>,
    volumes: usize,
    orphans: usize,
) -> Background {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let background = Background {
        dir,
        volumes,
        orphans: orphans.min(volumes),
    };
    let state = background.state_dir();
    let records = state.join("volumes");
    std::fs::create_dir_all(&records).expect("volumes dir");
    for i in 0..volumes {
        let id = volume_id(i);
        let record = csi_hostpath::VolumeRecord {
            name: format!("pvc-{id}"),
            id: id.clone(),
            capacity_bytes: 1 << 20,
            limit_bytes: 0,
            parameters: BTreeMap::new(),
            access_type: csi_hostpath::AccessType::Mount,
            content_source: None,
            accessible_topology: Vec::new(),
            kind: String::new(),
            creation_time: csi_hostpath::Timestamp::now(),
            published: BTreeMap::new(),
        };
        std::fs::create_dir_all(csi_hostpath::volume_path(&state, &id)).expect("volume dir");
        std::fs::write(
            records.join(format!("{id}.json")),
            serde_json::to_vec(&record).expect("record"),
        )
        .expect("volume record");
    }
    let world = World::new(plane, "ab", DriverKind::Ours).await;
    let labels = json!({BACKGROUND_LABEL: "true"});
    let pvs: Vec<Value> = (0..volumes - background.orphans)
        .map(|i| {
            // As a provisioned PV looks (its size is the list's bytes),
            // but Available: no claim, so nothing binds or releases it.
            json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("pvc-{}", volume_id(i)), "labels": labels,
                             "annotations": {"pv.kubernetes.io/provisioned-by": AUDIT_DRIVER}},
                "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Retain",
                         "storageClassName": BACKGROUND_LABEL,
                         "volumeMode": "Filesystem",
                         "csi": {"driver": AUDIT_DRIVER, "volumeHandle": volume_id(i), "fsType": "ext4",
                                 "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity":
                                                      format!("1764400000000-{i}-{AUDIT_DRIVER}")}},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": TOPOLOGY_KEY, "operator": "In", "values": [format!("node-{}", i % 100)]}]}]}}}})
        })
        .collect();
    world.create_many(pvs).await;
    eprintln!(
        "benchmark: {volumes} volumes for the orphan audit, {} with a PV, made in {:.0} s",
        volumes - background.orphans,
        started.elapsed().as_secs_f64()
    );
    background
}

/// One run: the sidecar's first two audits.
pub(super) async fn run(plane: &Arc<ControlPlane>, background: &Background) -> Value {
    let interval = env_usize("BENCH_AUDIT_INTERVAL_SECONDS", 60, 3) as u64;
    let tag = run_tag("oa".to_owned());
    let mut world = World::new(plane, &tag, DriverKind::Ours).await;
    world.driver = AUDIT_DRIVER.to_owned();
    world.state_dir = background.state_dir();
    world.proxied = true;
    world.start_driver();
    let port = controlplane::free_port().expect("free port");
    let extra = vec![
        format!("--orphan-audit-interval={interval}s"),
        format!("--http-endpoint=127.0.0.1:{port}"),
    ];
    let (sidecar, _user) = world.start_sidecar(Binary::Ours, &extra).await;
    let pid = sidecar.id();
    let timeout = Duration::from_secs(2 * interval + 600);
    let first = wait_for_line(&world, "orphan audit: first audit", timeout).await;
    let proxy = world.proxy.get().expect("the counting proxy");
    let traffic_before = proxy.traffic();
    let calls_before = list_volumes_calls(port).await;
    let cpu_before = cpu_seconds(pid);
    let rss_before = status_kib(pid, "VmRSS:");
    // The highest RSS until the second audit's line.
    let mut rss_peak = rss_before.unwrap_or(0);
    let deadline = Instant::now() + timeout;
    let mut second = None;
    while Instant::now() < deadline {
        rss_peak = rss_peak.max(status_kib(pid, "VmRSS:").unwrap_or(0));
        second = audit_line(&world.sidecar_log(Binary::Ours), "orphan audit done");
        if second.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let traffic_after = proxy.traffic();
    let calls_after = list_volumes_calls(port).await;
    let cpu_after = cpu_seconds(pid);
    keep_log(&world, Binary::Ours, "orphan-audit", DriverKind::Ours);
    let reported = second.as_deref().and_then(|l| field(l, "orphans"));
    let completed =
        first.is_some() && reported.as_deref() == Some(background.orphans.to_string().as_str());
    if !completed {
        eprintln!(
            "benchmark: orphan audit: expected {} orphans; the sidecar's last lines:\n{}",
            background.orphans,
            last_lines(&world.sidecar_log(Binary::Ours), 30)
        );
    }
    let pv_list = delta(&traffic_before, &traffic_after, |k| {
        k == "list persistentvolumes"
    });
    let other = delta(&traffic_before, &traffic_after, |k| {
        k != "list persistentvolumes"
    });
    drop(sidecar);
    json!({
        "scenario": "orphan-audit",
        "binary": Binary::Ours.name(),
        "driver": DriverKind::Ours.name(),
        "completed": completed,
        "volumes": background.volumes,
        "pvs": background.volumes - background.orphans,
        "orphans_reported": reported.and_then(|r| r.parse::<u64>().ok()),
        "interval_s": interval,
        "first_audit_s": first.as_deref().and_then(took_seconds).map(|s| round(s, 2)),
        "audit_s": second.as_deref().and_then(took_seconds).map(|s| round(s, 2)),
        "list_volumes_calls": match (calls_before, calls_after) {
            (Some(b), Some(a)) => json!(a - b),
            _ => Value::Null,
        },
        "pv_list_requests": pv_list.requests,
        "pv_list_mib": round(pv_list.response_bytes as f64 / (1024.0 * 1024.0), 1),
        "other_requests": other.requests,
        "other_kib": round(other.response_bytes as f64 / 1024.0, 1),
        "audit_cpu_s": match (cpu_before, cpu_after) {
            (Some(b), Some(a)) => json!(round(a - b, 2)),
            _ => Value::Null,
        },
        "rss_before_mib": mib(rss_before),
        "rss_peak_mib": mib(Some(rss_peak)),
    })
}

/// Median and range of each measured figure over the rounds.
pub(super) fn summarize(rounds: &[Value]) -> Value {
    let mut out = json!({
        "summary": "orphan-audit",
        "driver": DriverKind::Ours.name(),
        "binary": Binary::Ours.name(),
        "runs": rounds.len(),
        "completed": !rounds.is_empty() && rounds.iter().all(|r| r["completed"] == true),
    });
    for figure in [
        "first_audit_s",
        "audit_s",
        "list_volumes_calls",
        "pv_list_requests",
        "pv_list_mib",
        "other_requests",
        "audit_cpu_s",
        "rss_before_mib",
        "rss_peak_mib",
    ] {
        let values: Vec<f64> = rounds.iter().filter_map(|r| r[figure].as_f64()).collect();
        if let Some((median, min, max)) = scale::spread(&values) {
            out[figure] =
                json!({"median": round(median, 2), "min": round(min, 2), "max": round(max, 2)});
        }
    }
    out
}

/// The summed traffic of the request kinds `pick` takes, from `before`
/// to `after`.
fn delta(
    before: &BTreeMap<String, controlplane::lag_proxy::Traffic>,
    after: &BTreeMap<String, controlplane::lag_proxy::Traffic>,
    pick: impl Fn(&str) -> bool,
) -> controlplane::lag_proxy::Traffic {
    let mut sum = controlplane::lag_proxy::Traffic::default();
    for (kind, now) in after.iter().filter(|(k, _)| pick(k)) {
        let then = before.get(kind).copied().unwrap_or_default();
        sum.requests += now.requests - then.requests;
        sum.response_bytes += now.response_bytes - then.response_bytes;
    }
    sum
}

/// The first line of the sidecar's log holding `what`, once it is there.
async fn wait_for_line(world: &World, what: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(line) = audit_line(&world.sidecar_log(Binary::Ours), what) {
            return Some(line);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("benchmark: orphan audit: no {what:?} line within {timeout:?}");
    None
}

fn audit_line(log: &str, what: &str) -> Option<String> {
    log.lines().find(|l| l.contains(what)).map(str::to_owned)
}

fn last_lines(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The value of `key=` in a klog text line (quoted or not).
fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[start..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next()?,
        None => rest.split(' ').next()?,
    };
    Some(value.to_owned())
}

/// The `took` of an audit's line, in seconds.
fn took_seconds(line: &str) -> Option<f64> {
    go_duration_seconds(&field(line, "took")?)
}

/// A Go duration (`1m2.5s`, `850ms`, `12.3s`) in seconds.
fn go_duration_seconds(text: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// How many `ListVolumes` calls the sidecar has made, from its metrics.
async fn list_volumes_calls(port: u16) -> Option<u64> {
    let text = get(port, "/metrics").await?;
    let count = text
        .lines()
        .filter(|l| {
            l.starts_with("csi_sidecar_operations_seconds_count")
                && l.contains("/csi.v1.Controller/ListVolumes")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    Some(count as u64)
}

/// A plain GET as HTTP/1.0, so the answer comes whole rather than in
/// chunks; the body, on 200.
async fn get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    stream.read_to_string(&mut out).await.ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.")
        .then_some(())
        .filter(|()| head.split(' ').nth(1) == Some("200"))?;
    Some(body.to_owned())
}
