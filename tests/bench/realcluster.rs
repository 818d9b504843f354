//! Side-by-side benchmarks on a real control plane: this
//! sidecar and the upstream Go `csi-provisioner`, one after the other, on
//! the same kube-apiserver + etcd + kube-controller-manager, with our
//! `csi-hostpath` driver (in-process) and the upstream Go `hostpathplugin`
//! (a process). Prints one JSON object per (scenario, binary, driver) and
//! one `ratio` object per (scenario, driver).
//!
//! ```text
//! cargo bench --bench realcluster                      # every scenario
//! BENCH_SCENARIOS=backlog,delete cargo bench --bench realcluster
//! BENCH_SMOKE=1 cargo bench --bench realcluster        # tiny sizes, one driver per
//!                                   # scenario in turn (CI)
//! BENCH_SCENARIOS=choking BENCH_DRIVERS=csi-hostpath cargo bench --bench realcluster
//!                                   # 500 claims against a backend that refuses more than
//!                                   # 10 volume operations at once (our driver only)
//! BENCH_SCENARIOS=scale BENCH_DRIVERS=csi-hostpath cargo bench --bench realcluster
//!                                   # memory at 0, 10k, 50k objects (scale.rs)
//! BENCH_SCENARIOS=delete-attached BENCH_DELETE_ATTACHED=1000 cargo bench --bench realcluster
//!                                   # deletes next to as many attached volumes, with
//!                                   # the attachment watch quiet, then busy
//! BENCH_SCENARIOS=delete-at-scale BENCH_SCALE_VOLUMES=50000 BENCH_SCALE_DELETES=500 \
//!   cargo bench --bench realcluster
//!                                   # deletes among 50k volumes of another driver, half
//!                                   # attached: requests and bytes per delete (a proxy)
//! BENCH_SCENARIOS=orphan-audit BENCH_AUDIT_VOLUMES=50000 cargo bench --bench realcluster
//!                                   # one orphan audit among 50k volumes and PVs: time,
//!                                   # requests, bytes, memory (ours only; orphan_audit.rs)
//! BENCH_BINARIES=ours BENCH_RS_BIN=/tmp/before/csi-provisioner cargo bench --bench realcluster
//!                                   # another build of ours (before/after), alone
//! ```
//!
//! Needs the binaries of `../shared/k8s/install.sh target/k8s` (or
//! `K8S_BIN_DIR`); without them it says so and exits 0, unless `CI` is set
//! or `K8S_BIN_DIR` names a folder that lacks one: then it fails. Requests are counted
//! from the API server's audit log by user (each sidecar run has a user of
//! its own, with cluster-admin rights), CPU seconds and peak RSS from
//! `/proc`. Objects the scenarios need are created concurrently by the
//! harness, as another user, and never counted.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controlplane::{Binaries, Config, ControlPlane, GuardedChild, LagProxy};

mod orphan_audit;
mod scale;
use futures_util::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

const TOPOLOGY_KEY: &str = "topology.hostpath.csi/node";
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Binary {
    Ours,
    Upstream,
}

impl Binary {
    fn name(self) -> &'static str {
        match self {
            Binary::Ours => "ours",
            Binary::Upstream => "upstream",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DriverKind {
    /// Our `csi-hostpath`, served in-process.
    Ours,
    /// The upstream Go `hostpathplugin`, a process.
    Upstream,
}

impl DriverKind {
    fn name(self) -> &'static str {
        match self {
            DriverKind::Ours => "csi-hostpath",
            DriverKind::Upstream => "hostpathplugin",
        }
    }
}

fn env_usize(name: &str, default: usize, smoke: usize) -> usize {
    let fallback = if smoke_mode() { smoke } else { default };
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(fallback)
}

fn smoke_mode() -> bool {
    std::env::var("BENCH_SMOKE").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A pause that lets trailing work settle before or after a measurement:
/// `secs` in a real run, one second in the smoke run, which only checks
/// that the scenarios run (its numbers are not read).
fn settling(secs: u64) -> Duration {
    Duration::from_secs(if smoke_mode() { secs.min(1) } else { secs })
}

/// Clock ticks per second of `/proc/<pid>/stat` times.
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn mib(kib: Option<u64>) -> Value {
    kib.map_or(Value::Null, |k| {
        json!((k as f64 / 1024.0 * 10.0).round() / 10.0)
    })
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted.get(rank.min(sorted.len() - 1)).copied()
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Everything one run needs: a namespace, a driver name, a node, a class.
struct World {
    plane: Arc<ControlPlane>,
    admin: kube::Client,
    dir: tempfile::TempDir,
    tag: String,
    ns: String,
    driver: String,
    node: String,
    class: String,
    driver_kind: DriverKind,
    socket: PathBuf,
    state_dir: PathBuf,
    driver_stop: Option<tokio::sync::oneshot::Sender<()>>,
    driver_process: Option<GuardedChild>,
    /// The driver advertises PUBLISH_UNPUBLISH_VOLUME (set before
    /// `start_driver`): the sidecar then checks VolumeAttachments before
    /// each `DeleteVolume`.
    attach: bool,
    /// The sidecar talks to the API server through a proxy that counts
    /// the requests and the bytes of their answers (set before
    /// `start_sidecar`); the proxy, once started.
    proxied: bool,
    proxy: std::sync::OnceLock<LagProxy>,
}

impl World {
    async fn new(plane: &Arc<ControlPlane>, tag: &str, driver_kind: DriverKind) -> World {
        let admin = plane.admin_client().await.expect("admin client");
        let dir = tempfile::tempdir().expect("tempdir");
        let world = World {
            plane: Arc::clone(plane),
            admin,
            tag: tag.to_owned(),
            ns: format!("bench-{tag}"),
            driver: format!("{tag}.hostpath.csi.k8s.io"),
            node: format!("node-{tag}"),
            class: format!("fast-{tag}"),
            driver_kind,
            socket: dir.path().join("csi.sock"),
            state_dir: dir.path().join("state"),
            dir,
            driver_stop: None,
            driver_process: None,
            attach: false,
            proxied: false,
            proxy: std::sync::OnceLock::new(),
        };
        world
            .create(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": world.ns}}),
            )
            .await;
        world
            .create(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": world.node, "labels": {TOPOLOGY_KEY: world.node}}}))
            .await;
        world
            .create(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": world.node},
                "spec": {"drivers": [{"name": world.driver, "nodeID": world.node, "topologyKeys": [TOPOLOGY_KEY]}]}}))
            .await;
        world
            .create(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": world.class}, "provisioner": world.driver,
                "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}),
            )
            .await;
        world
    }

    async fn create(&self, object: Value) {
        if let Err(e) = self.try_create(object.clone()).await {
            panic!("create {}: {e}", object["metadata"]["name"]);
        }
    }

    async fn try_create(&self, object: Value) -> Result<(), kube::Error> {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(self.admin.clone(), ns, &resource),
            None => Api::all_with(self.admin.clone(), &resource),
        };
        let obj: DynamicObject = serde_json::from_value(object).expect("object");
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates many objects, 32 at a time.
    async fn create_many(&self, objects: Vec<Value>) {
        stream::iter(objects)
            .map(|o| async move {
                for attempt in 0..5 {
                    match self.try_create(o.clone()).await {
                        Ok(()) => return,
                        Err(e) if attempt < 4 => {
                            eprintln!("create failed ({e}); retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(e) => panic!("create: {e}"),
                    }
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
    }

    /// A claim as the controller-manager leaves it for the provisioner:
    /// with the storage-provisioner annotations already set. Left to the
    /// controller-manager, the annotations come at its client rate (20
    /// requests/s by default, shared with binding every earlier run's
    /// claims), and that, not the sidecar, would be measured.
    fn claim(&self, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": self.ns,
                         "annotations": {
                             "volume.kubernetes.io/storage-provisioner": self.driver,
                             "volume.beta.kubernetes.io/storage-provisioner": self.driver}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": self.class,
                     "resources": {"requests": {"storage": "1Mi"}}}})
    }

    /// Waits until the controller-manager has bound every claim of this
    /// world, so that its binding work does not run into the next run.
    async fn settle(&self) {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.admin.clone(), &self.ns);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(300) {
            let pending = match api.list(&Default::default()).await {
                Ok(list) => list
                    .items
                    .iter()
                    .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound"))
                    .count(),
                Err(_) => 1,
            };
            if pending == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("{}: claims still unbound after 300 s", self.ns);
    }

    fn start_driver(&mut self) {
        std::fs::create_dir_all(&self.state_dir).expect("state dir");
        match self.driver_kind {
            DriverKind::Ours => {
                let mut config = csi_hostpath::Config::for_tests(self.dir.path());
                config.driver_name = self.driver.clone();
                config.node_id = self.node.clone();
                config.endpoint = self.socket.clone();
                config.state_dir = self.state_dir.clone();
                config.controller_publish = self.attach;
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                self.driver_stop = Some(tx);
                tokio::spawn(async move {
                    let _ = csi_hostpath::serve(config, async {
                        let _ = rx.await;
                    })
                    .await;
                });
            }
            DriverKind::Upstream => {
                let bins = self.plane.binaries();
                let mut cmd = Command::new(bins.path("hostpathplugin"));
                cmd.arg(format!("-endpoint=unix://{}", self.socket.display()))
                    .arg(format!("-nodeid={}", self.node))
                    .arg(format!("-statedir={}", self.state_dir.display()))
                    .arg(format!("-drivername={}", self.driver))
                    .arg(format!("-enable-attach={}", self.attach))
                    .arg("-v=1");
                self.driver_process = Some(
                    GuardedChild::spawn("hostpathplugin", cmd, &self.dir.path().join("driver.log"))
                        .expect("hostpathplugin"),
                );
            }
        }
    }

    /// Backend volumes, as the driver keeps them.
    fn backend_volumes(&self) -> usize {
        match self.driver_kind {
            DriverKind::Ours => csi_hostpath::backend_volumes(&self.state_dir)
                .map(|v| v.len())
                .unwrap_or(0),
            DriverKind::Upstream => std::fs::read_to_string(self.state_dir.join("state.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["Volumes"].as_array().map(Vec::len))
                .unwrap_or(0),
        }
    }

    /// Starts a sidecar as its own user; returns the process and the user.
    async fn start_sidecar(&self, binary: Binary, extra: &[String]) -> (GuardedChild, String) {
        let user = format!("bench-{}-{}", binary.name(), self.tag);
        let mut kubeconfig = self
            .plane
            .kubeconfig_for(&user, Some("system:masters"))
            .expect("kubeconfig");
        if self.proxied {
            let proxy = LagProxy::in_front_of(&kubeconfig).expect("the counting proxy");
            kubeconfig = proxy.kubeconfig().to_owned();
            let _ = self.proxy.set(proxy);
        }
        let path = match binary {
            Binary::Ours => ours_binary(),
            Binary::Upstream => self.plane.binaries().path("csi-provisioner"),
        };
        let mut cmd = match profiled(binary, &self.tag) {
            Some(mut perf) => {
                perf.arg(path);
                perf
            }
            None => Command::new(path),
        };
        cmd.arg(format!("--csi-address={}", self.socket.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--timeout=30s")
            .arg("--v=2")
            .args(extra)
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .env("NAMESPACE", &self.ns);
        let log = self.dir.path().join(format!("{}.log", binary.name()));
        let child = GuardedChild::spawn(binary.name(), cmd, &log).expect("sidecar");
        (child, user)
    }
}

/// Our sidecar: this build's, or `BENCH_RS_BIN` (another build of it, such
/// as the one of an earlier commit, for a before/after comparison).
fn ours_binary() -> PathBuf {
    std::env::var_os("BENCH_RS_BIN")
        .filter(|p| !p.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_csi-provisioner")),
            PathBuf::from,
        )
}

/// `BENCH_PERF_DIR`: each run of either binary runs under `perf record`
/// (`<dir>/<binary>-<tag>-<n>.data`; read with `perf report -i FILE`), from its
/// first instruction, start-up included, to its exit (perf passes the stop
/// signal on). The results' CPU and memory figures are then perf's, and
/// the sampling slows the run: keep such runs out of the published tables.
fn profiled(binary: Binary, tag: &str) -> Option<Command> {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::var("BENCH_PERF_DIR").ok()?;
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut perf = Command::new("perf");
    perf.args([
        "record",
        "--quiet",
        "-F",
        "499",
        "--call-graph",
        "dwarf,16384",
        "-o",
    ])
    .arg(Path::new(&dir).join(format!("{}-{tag}-{run}.data", binary.name())))
    .arg("--");
    Some(perf)
}

/// `BENCH_LOG_DIR`: keeps each run's sidecar log there (profiling).
fn keep_log(world: &World, binary: Binary, scenario: &str, driver: DriverKind) {
    if let Ok(dir) = std::env::var("BENCH_LOG_DIR") {
        let to = Path::new(&dir).join(format!(
            "{scenario}-{}-{}.log",
            binary.name(),
            driver.name()
        ));
        if let Err(e) = std::fs::write(&to, world.sidecar_log(binary)) {
            eprintln!("BENCH_LOG_DIR: {}: {e}", to.display());
        }
    }
}

impl World {
    fn sidecar_log(&self, binary: Binary) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", binary.name())))
            .unwrap_or_default()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(tx) = self.driver_stop.take() {
            let _ = tx.send(());
        }
    }
}

/// First time each PV of `driver` was seen (by name of its claim), from a
/// watch of our own.
#[derive(Clone, Default)]
struct PvWatch {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    gone: Arc<Mutex<HashMap<String, Instant>>>,
    with_finalizer: Arc<Mutex<HashMap<String, Instant>>>,
}

impl PvWatch {
    fn start(client: kube::Client, driver: String) -> (PvWatch, tokio::task::JoinHandle<()>) {
        let watch = PvWatch::default();
        let w = watch.clone();
        let task = tokio::spawn(async move {
            let api: Api<PersistentVolume> = Api::all(client);
            let stream = watcher(api, watcher::Config::default());
            futures_util::pin_mut!(stream);
            while let Ok(Some(event)) = stream.try_next().await {
                let now = Instant::now();
                let (pv, deleted) = match event {
                    watcher::Event::Apply(pv) | watcher::Event::InitApply(pv) => (pv, false),
                    watcher::Event::Delete(pv) => (pv, true),
                    _ => continue,
                };
                let ours = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == driver);
                if !ours {
                    continue;
                }
                let key = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .and_then(|c| c.name.clone())
                    .unwrap_or_else(|| pv.metadata.name.clone().unwrap_or_default());
                if deleted {
                    w.gone
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(key)
                        .or_insert(now);
                } else {
                    w.seen
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(key.clone())
                        .or_insert(now);
                    if pv
                        .metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == FINALIZER)
                    {
                        w.with_finalizer
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry(key)
                            .or_insert(now);
                    }
                }
            }
        });
        (watch, task)
    }

    fn seen(&self) -> HashMap<String, Instant> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn gone_count(&self) -> usize {
        self.gone.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn finalized(&self) -> HashMap<String, Instant> {
        self.with_finalizer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Requests of `user` from the audit log: (reads, writes, by verb and resource).
fn requests(plane: &ControlPlane, user: &str) -> (usize, usize, BTreeMap<String, usize>) {
    let all = plane.audit();
    let mut by = controlplane::audit::count_by_verb_and_resource(&all, user);
    // The attachment check's catch-ups (src/provisioner/attached.rs) list
    // one item; told apart from the pages of a whole list.
    let catch_ups = all
        .iter()
        .filter(|r| {
            r.user.username == user
                && r.verb == "list"
                && r.object_ref
                    .as_ref()
                    .is_some_and(|o| o.resource == "volumeattachments")
        })
        .filter(|r| {
            r.request_uri
                .split(['?', '&'])
                .any(|pair| pair == "limit=1")
        })
        .count();
    if catch_ups > 0 {
        by.insert("list volumeattachments limit=1".to_owned(), catch_ups);
    }
    let mut reads = 0;
    let mut writes = 0;
    for r in all.iter().filter(|r| r.user.username == user) {
        if r.is_write() {
            writes += 1;
        } else if r.verb != "watch" {
            reads += 1;
        }
    }
    (reads, writes, by)
}

async fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("benchmark: timed out waiting for {what}");
    false
}

/// The common part of a provisioning result.
#[allow(clippy::too_many_arguments)]
fn report(
    scenario: &str,
    binary: Binary,
    driver: DriverKind,
    world: &World,
    user: &str,
    pid: u32,
    volumes: usize,
    seconds: f64,
    latencies_ms: &mut [f64],
    extra: Value,
) -> Value {
    latencies_ms.sort_by(|a, b| a.total_cmp(b));
    let (reads, writes, by) = requests(&world.plane, user);
    let per = |n: usize| {
        if volumes == 0 {
            Value::Null
        } else {
            json!(round(n as f64 / volumes as f64, 2))
        }
    };
    let mut out = json!({
        "scenario": scenario,
        "binary": binary.name(),
        "driver": driver.name(),
        "volumes": volumes,
        "seconds": round(seconds, 2),
        "vol_per_s": if seconds > 0.0 { json!(round(volumes as f64 / seconds, 1)) } else { Value::Null },
        "p50_ms": percentile(latencies_ms, 50.0).map(|x| round(x, 0)),
        "p99_ms": percentile(latencies_ms, 99.0).map(|x| round(x, 0)),
        "writes_per_volume": per(writes),
        "reads_per_volume": per(reads),
        "writes": writes,
        "reads": reads,
        "requests": by,
        "cpu_s": cpu_seconds(pid).map(|x| round(x, 2)),
        "peak_rss_mib": mib(status_kib(pid, "VmHWM:")),
    });
    if let (Some(o), Some(e)) = (out.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
    out
}

fn args(qps: &str, burst: &str) -> Vec<String> {
    vec![
        format!("--kube-api-qps={qps}"),
        format!("--kube-api-burst={burst}"),
        "--worker-threads=100".to_owned(),
    ]
}

/// N claims Pending before the sidecar starts; time to all PVs.
async fn backlog(
    plane: &Arc<ControlPlane>,
    scenario: &str,
    binary: Binary,
    driver: DriverKind,
    n: usize,
    sidecar_args: Vec<String>,
    faults: Option<csi_hostpath::faults::Faults>,
) -> Value {
    let tag = run_tag(format!(
        "{}{}{}",
        &scenario[..2],
        &binary.name()[..1],
        &driver.name()[..1]
    ));
    let mut world = World::new(plane, &tag, driver).await;
    // Only our in-process driver reads a faults file.
    if let Some(faults) = &faults {
        faults
            .write(&world.dir.path().join("faults.json"))
            .expect("faults file");
    }
    let refused_before = csi_hostpath::faults::busy_refusals();
    world.start_driver();
    let claims: Vec<Value> = (0..n).map(|i| world.claim(&format!("c{i}"))).collect();
    world.create_many(claims).await;
    let (pvs, watch_task) = PvWatch::start(world.admin.clone(), world.driver.clone());
    let started = Instant::now();
    let (mut sidecar, user) = world.start_sidecar(binary, &sidecar_args).await;
    let done = wait_until("all PVs", Duration::from_secs(600), || {
        pvs.seen().len() >= n
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let mut latencies: Vec<f64> = pvs
        .seen()
        .values()
        .map(|t| (t.duration_since(started)).as_secs_f64() * 1000.0)
        .collect();
    // Let trailing events be sent, so they are counted.
    tokio::time::sleep(settling(3)).await;
    let out = report(
        scenario,
        binary,
        driver,
        &world,
        &user,
        sidecar.id(),
        pvs.seen().len(),
        seconds,
        &mut latencies,
        json!({"claims": n, "completed": done,
               "refused_calls": csi_hostpath::faults::busy_refusals() - refused_before}),
    );
    sidecar.stop(Duration::from_secs(10));
    watch_task.abort();
    keep_log(&world, binary, scenario, driver);
    world.settle().await;
    if !done {
        eprintln!(
            "{}",
            world
                .sidecar_log(binary)
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    out
}

/// Claims created by 20 clients at a fixed rate while the sidecar runs.
async fn steady(
    plane: &Arc<ControlPlane>,
    binary: Binary,
    driver: DriverKind,
    rate: usize,
    seconds: usize,
) -> Value {
    let tag = run_tag(format!("st{}{}", &binary.name()[..1], &driver.name()[..1]));
    let mut world = World::new(plane, &tag, driver).await;
    world.start_driver();
    let (pvs, watch_task) = PvWatch::start(world.admin.clone(), world.driver.clone());
    let (mut sidecar, user) = world.start_sidecar(binary, &args("1000", "2000")).await;
    // Let the sidecar start before the clock does.
    tokio::time::sleep(settling(5)).await;
    let total = rate * seconds;
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let started = Instant::now();
    let clients = 20;
    let world_ref = &world;
    stream::iter(0..clients)
        .map(|c| {
            let created = Arc::clone(&created);
            async move {
                let interval = Duration::from_secs_f64(clients as f64 / rate as f64);
                let mut i = c;
                while i < total {
                    let due = started
                        + interval.mul_f64((i / clients) as f64)
                        + interval.mul_f64(c as f64 / clients as f64);
                    tokio::time::sleep_until(due.into()).await;
                    let name = format!("c{i}");
                    let at = Instant::now();
                    if world_ref.try_create(world_ref.claim(&name)).await.is_ok() {
                        created
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(name, at);
                    }
                    i += clients;
                }
            }
        })
        .buffer_unordered(clients)
        .collect::<Vec<_>>()
        .await;
    let done = wait_until("all PVs", Duration::from_secs(300), || {
        pvs.seen().len() >= total
    })
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let seen = pvs.seen();
    let created = created.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // Over every claim created: one without a PV counts at the deadline.
    let deadline = Instant::now();
    let mut latencies: Vec<f64> = created
        .iter()
        .map(|(name, at)| {
            seen.get(name)
                .copied()
                .unwrap_or(deadline)
                .duration_since(*at)
                .as_secs_f64()
                * 1000.0
        })
        .collect();
    tokio::time::sleep(settling(3)).await;
    let out = report(
        "steady",
        binary,
        driver,
        &world,
        &user,
        sidecar.id(),
        seen.len(),
        elapsed,
        &mut latencies,
        json!({"rate_per_s": rate, "clients": clients, "completed": done}),
    );
    sidecar.stop(Duration::from_secs(10));
    watch_task.abort();
    keep_log(&world, binary, "steady", driver);
    world.settle().await;
    out
}

/// N bound claims deleted at once; time until every PV and backend volume
/// is gone.
async fn delete(plane: &Arc<ControlPlane>, binary: Binary, driver: DriverKind, n: usize) -> Value {
    delete_run(plane, binary, driver, n, None).await
}

/// What `delete-attached` adds to `delete`: the driver attaches volumes
/// (PUBLISH_UNPUBLISH_VOLUME), so the sidecar checks VolumeAttachments
/// before each `DeleteVolume` (docs/design.md, "Reading current state",
/// row 1); other volumes of the driver, provisioned first and kept, are
/// attached, one VolumeAttachment each, so half of all volumes are attached
/// and the attachment collection is as large as the deletion. The claims
/// deleted are not attached.
#[derive(Clone, Copy, Debug)]
struct Attached {
    /// Volumes provisioned before the deletion and kept, each attached.
    volumes: usize,
    /// The harness patches one attachment every 100 ms during the
    /// deletion, so the attachment watch moves (`delete-attached-busy`).
    busy: bool,
    /// Among the volumes of another driver that [`background`] made, half
    /// attached (`delete-at-scale`): the sidecar goes through a counting
    /// proxy, so the bytes of the deletion's requests are measured too.
    at_scale: bool,
}

/// The label of the objects [`background`] makes; [`cleanup`] keeps them.
const BACKGROUND_LABEL: &str = "bench-background";

/// `volumes` PVs of another driver (Available, Retain, a class of their
/// own, so no claim of a run binds them), the first half each with a
/// VolumeAttachment: the cluster a `delete-at-scale` run deletes in. Made
/// once for all its runs, removed by [`remove_background`].
async fn background(plane: &Arc<ControlPlane>, driver: DriverKind, volumes: usize) {
    const DRIVER: &str = "background.bench.example.com";
    let started = Instant::now();
    let world = World::new(plane, "bg", driver).await;
    let labels = json!({BACKGROUND_LABEL: "true"});
    let pvs: Vec<Value> = (0..volumes)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("bg-{i}"), "labels": labels},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Retain",
                         "storageClassName": BACKGROUND_LABEL,
                         "csi": {"driver": DRIVER, "volumeHandle": format!("bg-{i}")}}})
        })
        .collect();
    world.create_many(pvs).await;
    let attachments: Vec<Value> = (0..volumes / 2)
        .map(|i| {
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": format!("bg-va-{i}"), "labels": labels},
                "spec": {"attacher": DRIVER, "nodeName": "node-background",
                         "source": {"persistentVolumeName": format!("bg-{i}")}}})
        })
        .collect();
    world.create_many(attachments).await;
    eprintln!(
        "benchmark: {volumes} background volumes, {} attached, made in {:.0} s",
        volumes / 2,
        started.elapsed().as_secs_f64()
    );
}

/// Removes what [`background`] made.
async fn remove_background(plane: &Arc<ControlPlane>) {
    let Ok(admin) = plane.admin_client().await else {
        return;
    };
    let labelled = kube::api::ListParams::default().labels(BACKGROUND_LABEL);
    let attachments: Api<DynamicObject> = Api::all_with(admin.clone(), &attachment_resource());
    let _ = attachments
        .delete_collection(&DeleteParams::default(), &labelled)
        .await;
    let pvs: Api<PersistentVolume> = Api::all(admin);
    let _ = pvs
        .delete_collection(&DeleteParams::default(), &labelled)
        .await;
}

/// The VolumeAttachment resource.
fn attachment_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "storage.k8s.io",
        "v1",
        "VolumeAttachment",
    ))
}

/// `delete`, and with `attached` `delete-attached(-busy)`.
async fn delete_run(
    plane: &Arc<ControlPlane>,
    binary: Binary,
    driver: DriverKind,
    n: usize,
    attached: Option<Attached>,
) -> Value {
    let (scenario, prefix) = match attached {
        None => ("delete", "de"),
        Some(a) if a.at_scale => ("delete-at-scale", "ds"),
        Some(a) if a.busy => ("delete-attached-busy", "db"),
        Some(_) => ("delete-attached", "da"),
    };
    let tag = run_tag(format!(
        "{prefix}{}{}",
        &binary.name()[..1],
        &driver.name()[..1]
    ));
    let kept = attached.map_or(0, |a| a.volumes);
    let mut world = World::new(plane, &tag, driver).await;
    world.attach = attached.is_some();
    world.proxied = attached.is_some_and(|a| a.at_scale);
    world.start_driver();
    let (pvs, watch_task) = PvWatch::start(world.admin.clone(), world.driver.clone());
    let (mut sidecar, user) = world.start_sidecar(binary, &args("1000", "2000")).await;
    // The kept claims are `k<i>`, the deleted ones `c<i>`.
    let claims: Vec<Value> = (0..kept)
        .map(|i| world.claim(&format!("k{i}")))
        .chain((0..n).map(|i| world.claim(&format!("c{i}"))))
        .collect();
    world.create_many(claims).await;
    let provisioned = wait_until("all PVs", Duration::from_secs(600), || {
        pvs.seen().len() >= n + kept
    })
    .await;
    // Bound by the controller-manager, then deleted.
    let api: Api<PersistentVolumeClaim> = Api::namespaced(world.admin.clone(), &world.ns);
    let mut bound = false;
    for _ in 0..600 {
        let list = api.list(&Default::default()).await.expect("list claims");
        if list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count()
            >= n + kept
        {
            bound = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // One VolumeAttachment per kept volume, to this world's node.
    let attachments: Api<DynamicObject> =
        Api::all_with(world.admin.clone(), &attachment_resource());
    let labelled = kube::api::ListParams::default().labels(&format!("bench={tag}"));
    if kept > 0 {
        let all: Api<PersistentVolume> = Api::all(world.admin.clone());
        let kept_pvs: Vec<String> = all
            .list(&Default::default())
            .await
            .expect("list PVs")
            .items
            .into_iter()
            .filter(|pv| {
                let spec = pv.spec.as_ref();
                spec.and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == world.driver)
                    && spec
                        .and_then(|s| s.claim_ref.as_ref())
                        .and_then(|c| c.name.as_deref())
                        .is_some_and(|c| c.starts_with('k'))
            })
            .filter_map(|pv| pv.metadata.name)
            .collect();
        let objects: Vec<Value> = kept_pvs
            .iter()
            .enumerate()
            .map(|(i, pv)| {
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                    "metadata": {"name": format!("{tag}-va-{i}"), "labels": {"bench": tag}},
                    "spec": {"attacher": world.driver, "nodeName": world.node,
                             "source": {"persistentVolumeName": pv}}})
            })
            .collect();
        world.create_many(objects).await;
    }
    // Let the provisioning's trailing events and journal writes settle (and
    // the attachments reach the sidecar's cache), so only the deletion is
    // counted.
    tokio::time::sleep(settling(3)).await;
    let attachments_before = if kept > 0 {
        attachments
            .list_metadata(&labelled)
            .await
            .map(|l| l.items.len())
            .unwrap_or(0)
    } else {
        0
    };
    // The busy variant: one attachment patched every 100 ms.
    let touches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let toucher = attached.filter(|a| a.busy && a.volumes > 0).map(|_| {
        let attachments = attachments.clone();
        let name = format!("{tag}-va-0");
        let touches = Arc::clone(&touches);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let i = touches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = attachments
                    .patch(
                        &name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(
                            json!({"metadata": {"annotations": {"bench/touch": i.to_string()}}}),
                        ),
                    )
                    .await;
            }
        })
    });
    let before = requests(&world.plane, &user);
    let traffic_before = world.proxy.get().map(LagProxy::traffic);
    let started = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let _ = api.delete(&format!("c{i}"), &DeleteParams::default()).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let world_ref = &world;
    let done = wait_until("every PV and volume gone", Duration::from_secs(600), || {
        pvs.gone_count() >= n && world_ref.backend_volumes() <= kept
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    // Trailing events of the deletion belong to it.
    tokio::time::sleep(settling(3)).await;
    if let Some(t) = toucher {
        t.abort();
    }
    let after = requests(&world.plane, &user);
    let traffic_during = world.proxy.get().map(|proxy| {
        let before = traffic_before.unwrap_or_default();
        proxy
            .traffic()
            .into_iter()
            .map(|(kind, t)| {
                let earlier = before.get(&kind).copied().unwrap_or_default();
                (
                    kind,
                    t.response_bytes.saturating_sub(earlier.response_bytes),
                )
            })
            .filter(|(_, bytes)| *bytes > 0)
            .collect::<BTreeMap<String, u64>>()
    });
    let during: BTreeMap<String, usize> = after
        .2
        .iter()
        .map(|(k, v)| (k.clone(), v - before.2.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let mut out = json!({
        "scenario": scenario,
        "requests": during,
        "binary": binary.name(),
        "driver": driver.name(),
        "volumes": n,
        "seconds": round(seconds, 2),
        "deleted": pvs.gone_count().min(n),
        "vol_per_s": round(pvs.gone_count().min(n) as f64 / seconds, 1),
        "writes_per_volume": round((after.1 - before.1) as f64 / n as f64, 2),
        "reads_per_volume": round((after.0 - before.0) as f64 / n as f64, 2),
        "cpu_s": cpu_seconds(sidecar.id()).map(|x| round(x, 2)),
        "peak_rss_mib": mib(status_kib(sidecar.id(), "VmHWM:")),
        "completed": provisioned && bound && done,
    });
    if binary == Binary::Ours
        && let Some(bin) = std::env::var_os("BENCH_RS_BIN").filter(|p| !p.is_empty())
    {
        out["ours_binary"] = json!(bin.to_string_lossy());
    }
    if attached.is_some() {
        let count = |key: &str| during.get(key).copied().unwrap_or(0);
        let attachments_after = attachments
            .list_metadata(&labelled)
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        out["attached_volumes"] = json!(kept);
        out["attachments"] = json!(attachments_before);
        out["attachments_at_end"] = json!(attachments_after);
        out["list_volumeattachments"] = json!(count("list volumeattachments"));
        out["list_volumeattachments_limit_1"] = json!(count("list volumeattachments limit=1"));
        out["watch_volumeattachments"] = json!(count("watch volumeattachments"));
        out["get_persistentvolumes"] = json!(count("get persistentvolumes"));
        out["touches"] = json!(touches.load(std::sync::atomic::Ordering::Relaxed));
        if let Some(bytes) = &traffic_during {
            // Watches bring what changed, whoever asked; the requests'
            // answers are what each delete asked for.
            let (watched, asked): (u64, u64) = bytes.iter().fold((0, 0), |(w, a), (kind, b)| {
                if kind.starts_with("watch ") {
                    (w + b, a)
                } else {
                    (w, a + b)
                }
            });
            out["response_bytes"] = json!(bytes);
            out["asked_bytes_per_volume"] = json!(round(asked as f64 / n as f64, 0));
            out["watch_bytes_per_volume"] = json!(round(watched as f64 / n as f64, 0));
        }
        // Someone else (the attach-detach controller) removing attachments
        // would make the check cheaper than it is: count it as failed.
        if attachments_after < attachments_before || attachments_before < kept {
            out["completed"] = json!(false);
        }
    }
    sidecar.stop(Duration::from_secs(10));
    watch_task.abort();
    keep_log(&world, binary, scenario, driver);
    if kept > 0 {
        let _ = attachments
            .delete_collection(&DeleteParams::default(), &labelled)
            .await;
    }
    out
}

/// Many objects of another driver exist; the sidecar idles.
async fn idle(
    plane: &Arc<ControlPlane>,
    binary: Binary,
    driver: DriverKind,
    objects: (usize, usize, usize),
    loops: bool,
) -> Value {
    let (n_pvs, n_claims, n_pods) = objects;
    let tag = run_tag(format!(
        "id{}{}{}",
        &binary.name()[..1],
        &driver.name()[..1],
        if loops { "l" } else { "" }
    ));
    let mut world = World::new(plane, &tag, driver).await;
    world.start_driver();
    let other = format!("other-{tag}");
    world
        .create(
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": other}, "provisioner": "other.example.com",
            "reclaimPolicy": "Retain", "volumeBindingMode": "Immediate"}),
        )
        .await;
    let mut setup = Vec::new();
    for i in 0..n_pvs {
        setup.push(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("{tag}-pv-{i}"), "labels": {"bench": tag},
                "annotations": {"pv.kubernetes.io/provisioned-by": "other.example.com"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": other,
                "csi": {"driver": "other.example.com", "volumeHandle": format!("h{i}"),
                        "volumeAttributes": {"a": "b", "pool": "default"}}}}));
    }
    for i in 0..n_claims {
        setup.push(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("o{i}"), "namespace": world.ns, "labels": {"app": "bench"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": other,
                     "resources": {"requests": {"storage": "1Gi"}}}}));
    }
    for i in 0..n_pods {
        setup.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": world.ns, "labels": {"app": "bench"}},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "env": [{"name": "A", "value": "some value"}, {"name": "B", "value": "another value"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("o{i}")}}]}}));
    }
    world
        .create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": world.ns}}))
        .await;
    world.create_many(setup).await;
    let mut extra = args("1000", "2000");
    if loops && binary == Binary::Ours {
        extra.push(
            "--feature-gates=PVCProtection=true,StatefulSetAutoDeletePVC=true,PVReleaser=true"
                .into(),
        );
        extra.push(format!("--controller-id=bench-{tag}"));
    }
    let (mut sidecar, user) = world.start_sidecar(binary, &extra).await;
    let pid = sidecar.id();
    tokio::time::sleep(settling(15)).await;
    let after_sync = status_kib(pid, "VmRSS:");
    let (_, writes_at_sync, _) = requests(&world.plane, &user);
    tokio::time::sleep(Duration::from_secs(if smoke_mode() { 5 } else { 60 })).await;
    let after_60 = status_kib(pid, "VmRSS:");
    let (reads, writes, by) = requests(&world.plane, &user);
    let out = json!({
        "scenario": if loops { "idle-all-loops" } else { "idle" },
        "binary": binary.name(),
        "driver": driver.name(),
        "objects": {"pvs": n_pvs, "claims": n_claims, "pods": n_pods},
        "gates": if loops && binary == Binary::Ours { "PVCProtection,StatefulSetAutoDeletePVC,PVReleaser" } else { "defaults" },
        "rss_after_sync_mib": mib(after_sync),
        "rss_after_60s_mib": mib(after_60),
        "peak_rss_mib": mib(status_kib(pid, "VmHWM:")),
        "cpu_s": cpu_seconds(pid).map(|x| round(x, 2)),
        "writes_while_idle": writes - writes_at_sync,
        "writes": writes,
        "reads": reads,
        "requests": by,
    });
    sidecar.stop(Duration::from_secs(10));
    // Free the API server for the next runs.
    let pvs: Api<PersistentVolume> = Api::all(world.admin.clone());
    let _ = pvs
        .delete_collection(
            &DeleteParams::default(),
            &kube::api::ListParams::default().labels(&format!("bench={tag}")),
        )
        .await;
    let _ = world
        .admin
        .request_text(
            http::Request::delete(format!("/api/v1/namespaces/{}", world.ns))
                .body(Vec::new())
                .expect("request"),
        )
        .await;
    // Wait until they are gone: the next run (the other binary's) must see
    // the same objects this one did, not 20,000 more.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(world.admin.clone());
    let labelled = kube::api::ListParams::default().labels(&format!("bench={tag}"));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        let pvs_left = pvs
            .list_metadata(&labelled)
            .await
            .map(|l| l.items.len())
            .unwrap_or(1);
        let ns_left = namespaces
            .get_opt(&world.ns)
            .await
            .map(|n| n.is_some())
            .unwrap_or(true);
        if pvs_left == 0 && !ns_left {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    out
}

/// Bound PVs of the driver without our finalizer; time until all carry it.
async fn adopt(plane: &Arc<ControlPlane>, binary: Binary, driver: DriverKind, n: usize) -> Value {
    let tag = run_tag(format!("ad{}{}", &binary.name()[..1], &driver.name()[..1]));
    let mut world = World::new(plane, &tag, driver).await;
    world.start_driver();
    // Pre-bound pairs: the controller-manager binds them.
    let mut setup = Vec::new();
    for i in 0..n {
        let pv = format!("{tag}-pv-{i}");
        setup.push(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("c{i}"), "namespace": world.ns},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": world.class,
                     "volumeName": pv, "resources": {"requests": {"storage": "1Mi"}}}}));
        setup.push(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv, "annotations": {"pv.kubernetes.io/provisioned-by": world.driver}},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"},
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": world.class,
                "claimRef": {"namespace": world.ns, "name": format!("c{i}")},
                "csi": {"driver": world.driver, "volumeHandle": format!("h{i}")}}}));
    }
    world.create_many(setup).await;
    let pv_api: Api<PersistentVolume> = Api::all(world.admin.clone());
    let mut all_bound = false;
    for _ in 0..900 {
        let list = pv_api.list(&Default::default()).await.expect("pvs");
        let bound = list
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("{tag}-pv-")))
            })
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound >= n {
            all_bound = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (pvs, watch_task) = PvWatch::start(world.admin.clone(), world.driver.clone());
    let started = Instant::now();
    let (mut sidecar, user) = world.start_sidecar(binary, &args("100000", "100000")).await;
    let done = wait_until("finalizer on every PV", Duration::from_secs(900), || {
        pvs.finalized().len() >= n
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let (reads, writes, _) = requests(&world.plane, &user);
    let out = json!({
        "scenario": "adopt",
        "binary": binary.name(),
        "driver": driver.name(),
        "pvs": n,
        "seconds": round(seconds, 2),
        "pvs_per_s": round(pvs.finalized().len() as f64 / seconds, 1),
        "writes": writes,
        "reads": reads,
        "cpu_s": cpu_seconds(sidecar.id()).map(|x| round(x, 2)),
        "peak_rss_mib": mib(status_kib(sidecar.id(), "VmHWM:")),
        "completed": all_bound && done,
    });
    sidecar.stop(Duration::from_secs(10));
    watch_task.abort();
    out
}

/// Process start to the first PV, with PVs of the driver cached.
async fn startup(plane: &Arc<ControlPlane>, binary: Binary, driver: DriverKind, n: usize) -> Value {
    let tag = run_tag(format!("su{}{}", &binary.name()[..1], &driver.name()[..1]));
    let mut world = World::new(plane, &tag, driver).await;
    world.start_driver();
    let mut setup = Vec::new();
    for i in 0..n {
        setup.push(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("{tag}-pv-{i}"), "annotations": {"pv.kubernetes.io/provisioned-by": world.driver}},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"},
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": format!("cached-{tag}"),
                "csi": {"driver": world.driver, "volumeHandle": format!("h{i}")}}}));
    }
    world.create_many(setup).await;
    // Another class keeps the binder from binding the claim to a cached PV.
    world.create(world.claim("first")).await;
    let (pvs, watch_task) = PvWatch::start(world.admin.clone(), world.driver.clone());
    // The watch's initial list includes the n existing PVs.
    wait_until("watch synced", Duration::from_secs(60), || {
        pvs.seen().len() >= n
    })
    .await;
    let started = Instant::now();
    let (mut sidecar, _) = world.start_sidecar(binary, &args("1000", "2000")).await;
    let done = wait_until("the first PV", Duration::from_secs(120), || {
        pvs.seen().contains_key("first")
    })
    .await;
    let seconds = pvs
        .seen()
        .get("first")
        .map(|t| t.duration_since(started).as_secs_f64());
    let out = json!({
        "scenario": "startup",
        "binary": binary.name(),
        "driver": driver.name(),
        "cached_pvs": n,
        "seconds_to_first_pv": seconds.map(|s| round(s, 3)),
        "completed": done,
    });
    sidecar.stop(Duration::from_secs(10));
    watch_task.abort();
    out
}

/// The number of the run under way, part of every name a run makes, so
/// that no run can find (and take for its own) an object of an earlier one.
static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn next_run() {
    RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

fn run_tag(base: String) -> String {
    format!("{base}{}", RUN.load(std::sync::atomic::Ordering::Relaxed))
}

/// Returns the cluster to its state before the run: every namespace, PV,
/// StorageClass, Node and CSINode a run made is deleted (finalizers of the
/// stopped sidecar taken off), then waits until they are gone and the
/// controller-manager has nothing left to do.
async fn cleanup(plane: &Arc<ControlPlane>) {
    let Ok(admin) = plane.admin_client().await else {
        eprintln!("cleanup: no admin client");
        return;
    };
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    // The background of `delete-at-scale` stays for all its runs.
    let not_background = kube::api::ListParams::default().labels(&format!("!{BACKGROUND_LABEL}"));
    let started = Instant::now();
    let mut pass = 0;
    loop {
        pass += 1;
        let bench_namespaces: Vec<String> = namespaces
            .list_metadata(&Default::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|n| n.metadata.name)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with("bench-"))
            .collect();
        let left_pvs: Vec<(String, bool)> = pvs
            .list_metadata(&not_background)
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|p| {
                        let finalized = p
                            .metadata
                            .finalizers
                            .as_ref()
                            .is_some_and(|f| !f.is_empty());
                        Some((p.metadata.name?, finalized))
                    })
                    .collect()
            })
            .unwrap_or_default();
        // The smoke run does not wait for the namespace controller: its
        // runs use namespaces of their own, and it measures nothing.
        let namespaces_done = bench_namespaces.is_empty() || (smoke_mode() && pass > 1);
        if namespaces_done && left_pvs.is_empty() {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            eprintln!(
                "cleanup: {} namespaces and {} PVs still there after 600 s",
                bench_namespaces.len(),
                left_pvs.len()
            );
            break;
        }
        if pass == 1 || pass % 20 == 0 {
            for ns in &bench_namespaces {
                let _ = namespaces.delete(ns, &DeleteParams::default()).await;
            }
            let _ = pvs
                .delete_collection(&DeleteParams::default(), &not_background)
                .await;
        }
        // The sidecar is stopped: nobody else removes its finalizer.
        stream::iter(left_pvs.into_iter().filter(|(_, f)| *f))
            .map(|(name, _)| {
                let pvs = pvs.clone();
                async move {
                    let _ = pvs
                        .patch(
                            &name,
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
                        )
                        .await;
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (group_version, kind) in [
        ("storage.k8s.io/v1", "StorageClass"),
        ("storage.k8s.io/v1", "CSINode"),
        ("v1", "Node"),
    ] {
        let (group, version) = group_version.split_once('/').unwrap_or(("", group_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
        let _ = api
            .delete_collection(&DeleteParams::default(), &Default::default())
            .await;
    }
    // Let the controller-manager finish reacting to the deletions.
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// Per binary, the median and range of the scenario's headline metric over
/// the rounds; a ratio of the medians only when every run of both binaries
/// completed.
fn summarize(scenario: &str, driver: DriverKind, rounds: &[Value]) -> Vec<Value> {
    let mut lines = Vec::new();
    let mut medians = HashMap::new();
    let mut all_completed = true;
    let mut metric_of = None;
    for binary in [Binary::Upstream, Binary::Ours] {
        let runs: Vec<&Value> = rounds
            .iter()
            .filter(|r| r["binary"] == binary.name())
            .collect();
        let completed = !runs.is_empty() && runs.iter().all(|r| r["completed"] != false);
        all_completed &= completed;
        let mut values = Vec::new();
        let mut higher_is_better = false;
        for r in &runs {
            if let Some((metric, value, higher)) = headline(r) {
                metric_of = Some(metric);
                higher_is_better = higher;
                values.push(value);
            }
        }
        let stats = scale::spread(&values);
        if let Some((median, _, _)) = stats {
            medians.insert(binary.name(), (median, higher_is_better));
        }
        lines.push(json!({
            "summary": scenario,
            "driver": driver.name(),
            "binary": binary.name(),
            "metric": metric_of,
            "runs": runs.len(),
            "completed": completed,
            "median": stats.map(|s| round(s.0, 3)),
            "min": stats.map(|s| round(s.1, 3)),
            "max": stats.map(|s| round(s.2, 3)),
        }));
    }
    if all_completed
        && let (Some((ours, higher)), Some((upstream, _)), Some(metric)) =
            (medians.get("ours"), medians.get("upstream"), metric_of)
        && *ours > 0.0
        && *upstream > 0.0
    {
        let better_by = if *higher {
            ours / upstream
        } else {
            upstream / ours
        };
        lines.push(
            json!({"ratio": scenario, "driver": driver.name(), "metric": metric,
            "ours": round(*ours, 3), "upstream": round(*upstream, 3),
            "ours_better_by": round(better_by, 2), "of": "medians"}),
        );
    }
    lines
}

/// A backend that takes at most `limit` volume operations at once, each
/// `CreateVolume` 50 ms, and refuses the rest with RESOURCE_EXHAUSTED (the
/// `choking` scenario; our driver only).
fn choking_backend(limit: usize) -> csi_hostpath::faults::Faults {
    csi_hostpath::faults::Faults {
        busy_above: Some(csi_hostpath::faults::BusyAbove {
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            code: None,
        }),
        ..csi_hostpath::faults::Faults::with_rules(vec![csi_hostpath::faults::Fault::delay(
            "CreateVolume",
            Duration::from_millis(50),
        )])
    }
}

fn headline(result: &Value) -> Option<(&'static str, f64, bool)> {
    // (metric, value, higher is better)
    let scenario = result["scenario"].as_str()?;
    match scenario {
        "backlog"
        | "throttled"
        | "choking"
        | "delete"
        | "delete-attached"
        | "delete-attached-busy"
        | "delete-at-scale" => Some(("vol_per_s", result["vol_per_s"].as_f64()?, true)),
        "steady" => Some(("p99_ms", result["p99_ms"].as_f64()?, false)),
        "idle" | "idle-all-loops" => Some((
            "rss_after_60s_mib",
            result["rss_after_60s_mib"].as_f64()?,
            false,
        )),
        "adopt" => Some(("pvs_per_s", result["pvs_per_s"].as_f64()?, true)),
        "startup" => Some((
            "seconds_to_first_pv",
            result["seconds_to_first_pv"].as_f64()?,
            false,
        )),
        _ => None,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // Skips (exit 0, one line) only where the real-cluster tests may skip:
    // under CI or with K8S_BIN_DIR set, a missing binary fails the run.
    let bins = match Binaries::lookup(&[
        "kube-controller-manager",
        "csi-provisioner",
        "hostpathplugin",
    ]) {
        Ok(bins) => bins,
        Err(e) => {
            println!("{}", json!({"skipped": e.to_string()}));
            return;
        }
    };
    // The controller-manager binds every run's claims; at its default 20
    // requests/s that binding would pace the runs rather than the sidecars.
    let plane = Arc::new(
        ControlPlane::start(bins, Config::standard().with_controller_manager_qps(1000))
            .expect("control plane"),
    );
    let wanted: Vec<String> = std::env::var("BENCH_SCENARIOS")
        .unwrap_or_else(|_| {
            let mut all = String::from(
                "backlog,steady,throttled,delete,delete-attached,delete-at-scale,idle,adopt,startup,scale",
            );
            // A real `choking` run takes the Go image more than ten minutes
            // at 500 claims (docs/benchmarks.md), so it is asked for by
            // name; the smoke run (CI) checks that it still runs. Last, so
            // that the drivers taken in turn give it ours (the test
            // driver's refusals) and leave the others' turns unchanged.
            if smoke_mode() {
                all.push_str(",choking");
            }
            // Ours and our driver whatever the turn: after the others, so
            // their turns stay as they were.
            all.push_str(",orphan-audit");
            all
        })
        .split(',')
        // `delete-attached` is measured with the attachment watch quiet and
        // busy: two scenarios.
        .flat_map(|s| match s.trim() {
            "delete-attached" => vec![
                "delete-attached".to_owned(),
                "delete-attached-busy".to_owned(),
            ],
            other => vec![other.to_owned()],
        })
        .collect();
    let drivers_named = std::env::var("BENCH_DRIVERS").ok();
    // The smoke run (CI) checks that every scenario still runs with both
    // binaries; it measures nothing. Each scenario runs with one driver,
    // the drivers taken in turn, so both drivers' paths still run and the
    // run takes half as long. `BENCH_DRIVERS` set runs every one named.
    let drivers_in_turn = smoke_mode() && drivers_named.is_none();
    let drivers: Vec<DriverKind> = drivers_named
        .unwrap_or_else(|| "hostpathplugin,csi-hostpath".into())
        .split(',')
        .filter_map(|d| match d.trim() {
            "hostpathplugin" => Some(DriverKind::Upstream),
            "csi-hostpath" => Some(DriverKind::Ours),
            _ => None,
        })
        .collect();
    let backlog_n = env_usize("BENCH_BACKLOG", 1000, 20);
    let throttled_n = env_usize("BENCH_THROTTLED", 100, 10);
    let choking_n = env_usize("BENCH_CHOKING", 500, 20);
    let choking_limit = env_usize("BENCH_CHOKING_LIMIT", 10, 10);
    let delete_n = env_usize("BENCH_DELETE", 1000, 20);
    let delete_attached_n = env_usize("BENCH_DELETE_ATTACHED", 1000, 10);
    let scale_volumes = env_usize("BENCH_SCALE_VOLUMES", 50_000, 100);
    let scale_deletes = env_usize("BENCH_SCALE_DELETES", 500, 10);
    let audit_volumes = env_usize("BENCH_AUDIT_VOLUMES", 50_000, 100);
    let audit_orphans = env_usize("BENCH_AUDIT_ORPHANS", 10, 3);
    // `BENCH_BINARIES=ours` (or `upstream`): one binary only, such as an
    // earlier build of ours named by `BENCH_RS_BIN`; no ratio then.
    let binaries: Vec<String> = std::env::var("BENCH_BINARIES")
        .unwrap_or_else(|_| "upstream,ours".into())
        .split(',')
        .map(|b| b.trim().to_owned())
        .collect();
    let idle_n = env_usize("BENCH_IDLE_OBJECTS", 10_000, 50);
    let idle_pods = env_usize("BENCH_IDLE_PODS", 2000, 20);
    let adopt_n = env_usize("BENCH_ADOPT", 10_000, 20);
    let startup_n = env_usize("BENCH_STARTUP_PVS", 1000, 20);
    let steady_rate = env_usize("BENCH_STEADY_RATE", 50, 5);
    let steady_s = env_usize("BENCH_STEADY_SECONDS", 20, 2);

    let runs = env_usize("BENCH_RUNS", 3, 1).max(1);
    let mut results: Vec<Value> = Vec::new();
    for (index, scenario) in wanted.iter().enumerate() {
        let drivers: &[DriverKind] = if drivers_in_turn && !drivers.is_empty() {
            let one = index % drivers.len();
            &drivers[one..=one]
        } else {
            &drivers
        };
        if scenario == "scale" {
            for driver in drivers {
                results.extend(scale::run(&plane, *driver).await);
                cleanup(&plane).await;
            }
            continue;
        }
        if scenario == "orphan-audit" {
            // Our binary and driver only: the Go image has no audit.
            if !binaries.iter().any(|b| b == "ours") {
                continue;
            }
            let background = orphan_audit::prepare(&plane, audit_volumes, audit_orphans).await;
            let mut rounds = Vec::new();
            for round in 0..runs {
                next_run();
                let mut result = orphan_audit::run(&plane, &background).await;
                cleanup(&plane).await;
                result["round"] = json!(round);
                println!("{result}");
                rounds.push(result);
            }
            let summary = orphan_audit::summarize(&rounds);
            println!("{summary}");
            results.push(summary);
            results.extend(rounds);
            remove_background(&plane).await;
            continue;
        }
        if scenario == "delete-at-scale"
            && let Some(driver) = drivers.first()
        {
            background(&plane, *driver, scale_volumes).await;
            cleanup(&plane).await;
        }
        for driver in drivers {
            let mut rounds: Vec<Value> = Vec::new();
            for round in 0..runs {
                for binary in scale::order(round) {
                    if !binaries.iter().any(|b| b == binary.name()) {
                        continue;
                    }
                    next_run();
                    let result = match scenario.as_str() {
                        "backlog" => {
                            backlog(
                                &plane,
                                "backlog",
                                binary,
                                *driver,
                                backlog_n,
                                args("1000", "2000"),
                                None,
                            )
                            .await
                        }
                        "throttled" => {
                            backlog(
                                &plane,
                                "throttled",
                                binary,
                                *driver,
                                throttled_n,
                                args("5", "10"),
                                None,
                            )
                            .await
                        }
                        "choking" => {
                            backlog(
                                &plane,
                                "choking",
                                binary,
                                *driver,
                                choking_n,
                                args("1000", "2000"),
                                Some(choking_backend(choking_limit)),
                            )
                            .await
                        }
                        "steady" => steady(&plane, binary, *driver, steady_rate, steady_s).await,
                        "delete" => delete(&plane, binary, *driver, delete_n).await,
                        "delete-attached" | "delete-attached-busy" => {
                            let attached = Attached {
                                volumes: delete_attached_n,
                                busy: scenario == "delete-attached-busy",
                                at_scale: false,
                            };
                            delete_run(&plane, binary, *driver, delete_attached_n, Some(attached))
                                .await
                        }
                        "delete-at-scale" => {
                            let attached = Attached {
                                volumes: 0,
                                busy: false,
                                at_scale: true,
                            };
                            delete_run(&plane, binary, *driver, scale_deletes, Some(attached)).await
                        }
                        "idle" => {
                            idle(&plane, binary, *driver, (idle_n, idle_n, idle_pods), false).await
                        }
                        "adopt" => adopt(&plane, binary, *driver, adopt_n).await,
                        "startup" => startup(&plane, binary, *driver, startup_n).await,
                        other => {
                            eprintln!("unknown scenario {other}");
                            continue;
                        }
                    };
                    // The next run starts from the same cluster: what this
                    // one made is gone and the controller-manager is idle.
                    cleanup(&plane).await;
                    let mut result = result;
                    result["round"] = json!(round);
                    println!("{result}");
                    rounds.push(result);
                }
            }
            if scenario == "idle" && !smoke_mode() {
                next_run();
                let result = idle(
                    &plane,
                    Binary::Ours,
                    *driver,
                    (idle_n, idle_n, idle_pods),
                    true,
                )
                .await;
                cleanup(&plane).await;
                println!("{result}");
                results.push(result);
            }
            for line in summarize(scenario, *driver, &rounds) {
                println!("{line}");
                results.push(line);
            }
            results.extend(rounds);
        }
        if scenario == "delete-at-scale" {
            remove_background(&plane).await;
        }
    }
    let _ = Path::new(".");
}
