//! Snapshots on the real cluster: the six snapshot CRDs and one
//! `snapshot-controller` per control plane ([`controlplane::ControlPlane::start_snapshot_controller`]),
//! one upstream `csi-snapshotter` next to a test's driver
//! ([`Env::start_snapshotter`]), VolumeSnapshotClasses and VolumeSnapshots
//! of the test, and the upstream `hostpathplugin` as a second driver
//! ([`Hostpathplugin`]). The snapshot components run as cluster-admin users
//! of their own (`snapshot-controller`, `csi-snapshotter-<id>`): they are
//! not under test; the sidecar keeps the RBAC of `deploy/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use controlplane::GuardedChild;
use serde_json::{Value, json};

use super::{Env, current_test};

pub const SNAPSHOT_API: &str = "snapshot.storage.k8s.io/v1";
/// The provisioner's finalizer on a VolumeSnapshot while a claim is
/// restored from it.
pub const PROVISIONER_SOURCE_FINALIZER: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// snapshot-controller's finalizers on a live VolumeSnapshot.
pub const CONTROLLER_SOURCE_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
pub const CONTROLLER_BOUND_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";

/// What a ready VolumeSnapshot is bound to.
#[derive(Debug, Clone)]
pub struct ReadySnapshot {
    /// The VolumeSnapshotContent's name.
    pub content: String,
    /// The driver's snapshot id (`status.snapshotHandle` of the content).
    pub handle: String,
    /// `status.restoreSize` of the VolumeSnapshot.
    pub restore_size: String,
    pub uid: String,
}

impl Env {
    /// Real cluster: the snapshot CRDs and the plane's one
    /// snapshot-controller, set up by the first test that asks. `None`,
    /// after one `SKIPPED real-cluster test` line, when its binary or the
    /// CRD folder is missing and skipping is allowed; the test fails,
    /// naming it, when it is not.
    pub async fn start_snapshot_controller(&self) -> Option<()> {
        let plane = self
            .plane()
            .expect("snapshots are tested on the real cluster only");
        let test = current_test();
        let controller = plane.binaries().require("snapshot-controller", &test)?;
        let crds = plane.binaries().require_dir("crd", &test)?;
        tokio::task::spawn_blocking(move || plane.start_snapshot_controller(&controller, &crds))
            .await
            .expect("snapshot-controller start-up thread")
            .unwrap_or_else(|e| panic!("snapshot CRDs and snapshot-controller: {e}"));
        Some(())
    }

    /// [`Env::start_snapshot_controller`], then a `csi-snapshotter` next to
    /// this test's driver (start it after the driver is in its final form:
    /// the snapshotter exits when it loses the driver's socket). `None` as
    /// there when a binary is missing and skipping is allowed.
    pub async fn start_snapshotter(&mut self) -> Option<()> {
        self.start_snapshot_controller().await?;
        let plane = self.plane()?;
        let snapshotter = plane
            .binaries()
            .require("csi-snapshotter", &current_test())?;
        assert!(
            self.snapshotter.is_none(),
            "csi-snapshotter already running"
        );
        let log = self.dir.path().join("csi-snapshotter.log");
        let command = plane
            .csi_snapshotter_command(
                &snapshotter,
                &self.driver.endpoint,
                &format!("csi-snapshotter-{}", self.id),
            )
            .expect("csi-snapshotter kubeconfig");
        let child = GuardedChild::spawn("csi-snapshotter", command, &log).expect("spawn");
        self.snapshotter = Some((child, log));
        Some(())
    }

    /// The end of the csi-snapshotter's log and the snapshot-controller's
    /// lines about this test (empty before [`Env::start_snapshotter`]).
    pub fn snapshot_logs(&self) -> String {
        let Some((_, log)) = &self.snapshotter else {
            return String::new();
        };
        let mut out = String::from("--- csi-snapshotter (last 30 lines) ---\n");
        let text = std::fs::read_to_string(log).unwrap_or_default();
        out.push_str(&tail(&text, 30));
        if let Some(plane) = self.plane() {
            out.push_str("\n--- snapshot-controller (this test's lines, last 30) ---\n");
            let text =
                std::fs::read_to_string(plane.log_path("snapshot-controller")).unwrap_or_default();
            let mine: Vec<&str> = text.lines().filter(|l| l.contains(&self.id)).collect();
            out.push_str(&mine[mine.len().saturating_sub(30)..].join("\n"));
            out.push('\n');
        }
        out
    }

    /// Our driver's snapshots. A snapshot deleted between the directory
    /// listing and the read of its record makes one read fail: read again.
    pub fn backend_snapshots(&self) -> Vec<csi_hostpath::SnapshotRecord> {
        let mut last_error = None;
        for _ in 0..20 {
            match csi_hostpath::backend_snapshots(&self.driver.state_dir) {
                Ok(snapshots) => return snapshots,
                Err(e) => last_error = Some(e),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("cannot read the backend snapshots: {last_error:?}");
    }

    /// Whether the csi-snapshotter still runs.
    pub fn snapshotter_running(&mut self) -> bool {
        self.snapshotter
            .as_mut()
            .is_some_and(|(child, _)| child.is_running())
    }

    /// The cluster-scoped name of this test's VolumeSnapshotClass `short`.
    pub fn snapshot_class_name(&self, short: &str) -> String {
        format!("{short}-{}", self.id)
    }

    /// This test's VolumeSnapshotClass `short` of its driver, deletion
    /// policy Delete.
    pub async fn snapshot_class(&self, short: &str) {
        self.create(json!({
            "apiVersion": SNAPSHOT_API, "kind": "VolumeSnapshotClass",
            "metadata": {"name": self.snapshot_class_name(short)},
            "driver": self.driver_name, "deletionPolicy": "Delete",
        }))
        .await;
    }

    /// A VolumeSnapshot `name` of the claim `claim`, of class `class`
    /// (short name).
    pub async fn take_snapshot(&self, namespace: &str, name: &str, class: &str, claim: &str) {
        self.create(json!({
            "apiVersion": SNAPSHOT_API, "kind": "VolumeSnapshot",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"volumeSnapshotClassName": self.snapshot_class_name(class),
                     "source": {"persistentVolumeClaimName": claim}},
        }))
        .await;
    }

    pub async fn volume_snapshot(&self, namespace: &str, name: &str) -> Option<Value> {
        self.get(SNAPSHOT_API, "VolumeSnapshot", namespace, name)
            .await
    }

    pub async fn snapshot_content(&self, name: &str) -> Option<Value> {
        self.get(SNAPSHOT_API, "VolumeSnapshotContent", "", name)
            .await
    }

    /// The finalizers of a VolumeSnapshot; `None` when it is gone.
    pub async fn snapshot_finalizers(&self, namespace: &str, name: &str) -> Option<Vec<String>> {
        let snapshot = self.volume_snapshot(namespace, name).await?;
        Some(
            snapshot["metadata"]["finalizers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect(),
        )
    }

    /// Whether the VolumeSnapshot carries the provisioner's source
    /// protection ([`PROVISIONER_SOURCE_FINALIZER`]); `None` once it is
    /// gone.
    pub async fn source_protected(&self, namespace: &str, name: &str) -> Option<bool> {
        let finalizers = self.snapshot_finalizers(namespace, name).await?;
        Some(finalizers.iter().any(|f| f == PROVISIONER_SOURCE_FINALIZER))
    }

    /// Waits until the VolumeSnapshot carries the provisioner's source
    /// protection (`protected`) or exists without it.
    pub async fn wait_source_protected(
        &self,
        namespace: &str,
        name: &str,
        protected: bool,
        timeout: Duration,
    ) {
        let what = format!(
            "{namespace}/{name} {} the provisioner's finalizer",
            if protected { "with" } else { "without" }
        );
        self.wait_for(&what, timeout, || async {
            (self.source_protected(namespace, name).await? == protected).then_some(())
        })
        .await;
    }

    /// Waits until the VolumeSnapshot is ready to use; returns what it is
    /// bound to.
    pub async fn wait_snapshot_ready(&self, namespace: &str, name: &str) -> ReadySnapshot {
        self.wait_for(
            &format!("VolumeSnapshot {namespace}/{name} ready"),
            Duration::from_secs(60),
            || async {
                let snapshot = self.volume_snapshot(namespace, name).await?;
                let status = &snapshot["status"];
                if status["readyToUse"] != json!(true) {
                    return None;
                }
                let content = status["boundVolumeSnapshotContentName"]
                    .as_str()?
                    .to_owned();
                let handle = self.snapshot_content(&content).await?["status"]["snapshotHandle"]
                    .as_str()?
                    .to_owned();
                Some(ReadySnapshot {
                    content,
                    handle,
                    restore_size: status["restoreSize"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    uid: snapshot["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                })
            },
        )
        .await
    }

    /// The VolumeSnapshotContents of this test's driver.
    pub async fn snapshot_contents(&self) -> Vec<Value> {
        let probe = json!({"apiVersion": SNAPSHOT_API, "kind": "VolumeSnapshotContent",
            "metadata": {"name": ""}});
        let (api, _) = self.dynamic_api(&probe);
        api.list(&Default::default())
            .await
            .expect("list VolumeSnapshotContents")
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).expect("json"))
            .filter(|c| c["spec"]["driver"] == json!(self.driver_name))
            .collect()
    }

    /// The VolumeSnapshots of a namespace.
    pub async fn volume_snapshots(&self, namespace: &str) -> Vec<Value> {
        let probe = json!({"apiVersion": SNAPSHOT_API, "kind": "VolumeSnapshot",
            "metadata": {"name": "", "namespace": namespace}});
        let (api, _) = self.dynamic_api(&probe);
        api.list(&Default::default())
            .await
            .expect("list VolumeSnapshots")
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).expect("json"))
            .collect()
    }

    /// Replaces a VolumeSnapshot's finalizers (read-modify-write, guarded
    /// by its resourceVersion, retried on conflicts).
    pub async fn edit_snapshot_finalizers(
        &self,
        namespace: &str,
        name: &str,
        edit: impl Fn(&mut Vec<String>),
    ) {
        for _ in 0..20 {
            let mut snapshot = self
                .volume_snapshot(namespace, name)
                .await
                .unwrap_or_else(|| panic!("VolumeSnapshot {namespace}/{name}"));
            let mut finalizers: Vec<String> = snapshot["metadata"]["finalizers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect();
            edit(&mut finalizers);
            snapshot["metadata"]["finalizers"] = json!(finalizers);
            let (api, _) = self.dynamic_api(&snapshot);
            let object: kube::api::DynamicObject =
                serde_json::from_value(snapshot).expect("snapshot JSON");
            match api.replace(name, &Default::default(), &object).await {
                Ok(_) => return,
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => panic!("update VolumeSnapshot {namespace}/{name}: {e}"),
            }
        }
        panic!("VolumeSnapshot {namespace}/{name}: 20 conflicts in a row");
    }

    /// Real cluster: how many times the sidecar read the VolumeSnapshot
    /// `namespace/name` (GET, audit log) since the last
    /// [`Env::reset_counters`]: evidence that it retried a claim.
    pub fn sidecar_snapshot_reads(&self, namespace: &str, name: &str) -> usize {
        let Some(plane) = self.plane() else {
            return 0;
        };
        let user = self.sidecar_user();
        let mark = *self.audit_mark.lock().unwrap_or_else(|p| p.into_inner());
        let all = plane.audit();
        all[mark.min(all.len())..]
            .iter()
            .filter(|r| r.user.username == user && r.verb == "get")
            .filter(|r| {
                r.object_ref.as_ref().is_some_and(|o| {
                    o.resource == "volumesnapshots" && o.namespace == namespace && o.name == name
                })
            })
            .count()
    }

    /// Real cluster: the sidecar's writes (patch or update) of the
    /// VolumeSnapshot `namespace/name` since the last [`Env::reset_counters`].
    pub fn sidecar_snapshot_writes(&self, namespace: &str, name: &str) -> usize {
        let Some(plane) = self.plane() else {
            return 0;
        };
        let user = self.sidecar_user();
        let mark = *self.audit_mark.lock().unwrap_or_else(|p| p.into_inner());
        let all = plane.audit();
        all[mark.min(all.len())..]
            .iter()
            .filter(|r| r.user.username == user && matches!(r.verb.as_str(), "patch" | "update"))
            .filter(|r| r.code() < 300)
            .filter(|r| {
                r.object_ref.as_ref().is_some_and(|o| {
                    o.resource == "volumesnapshots" && o.namespace == namespace && o.name == name
                })
            })
            .count()
    }
}

/// The upstream Go `hostpathplugin` of `../shared/k8s` in place of the
/// test's `csi-hostpath`: same driver name, node and socket. It keeps its
/// volumes and snapshots in `<state_dir>/state.json` and a volume's data in
/// `<state_dir>/<volume id>` (a directory, or a file for block volumes).
pub struct Hostpathplugin {
    pub state_dir: PathBuf,
    pub log: PathBuf,
    _process: GuardedChild,
}

impl Hostpathplugin {
    /// Stops the test's driver and starts hostpathplugin on its socket.
    /// `None` off the real cluster, and, said once, without the binary
    /// where skipping is allowed (else the test fails).
    pub async fn start(env: &mut Env, extra: &[&str]) -> Option<Hostpathplugin> {
        let binary = env.upstream_binary("hostpathplugin")?;
        env.stop_driver().await;
        let socket = env.driver.endpoint.clone();
        let _ = std::fs::remove_file(&socket);
        let state_dir = env.dir.path().join("upstream-state");
        let log = env.dir.path().join("hostpathplugin.log");
        let mut command = Command::new(binary);
        command
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--nodeid={}", env.node))
            .arg(format!("--drivername={}", env.driver_name))
            .arg(format!("--statedir={}", state_dir.display()))
            .arg("--v=4")
            .args(extra);
        let process = GuardedChild::spawn("hostpathplugin", command, &log).expect("spawn");
        for _ in 0..100 {
            if socket.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            socket.exists(),
            "hostpathplugin did not listen on {}",
            socket.display()
        );
        Some(Hostpathplugin {
            state_dir,
            log,
            _process: process,
        })
    }

    /// `state.json` (read again when caught half-written).
    pub fn state(&self) -> Value {
        let path = self.state_dir.join("state.json");
        for _ in 0..50 {
            match std::fs::read(&path) {
                Ok(bytes) => {
                    if let Ok(state) = serde_json::from_slice::<Value>(&bytes) {
                        return state;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return json!({}),
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("cannot read {}", path.display());
    }

    /// The driver's volumes (`VolID`, `VolName`, `VolSize`, `VolPath`,
    /// `ParentSnapID`, ...).
    pub fn volumes(&self) -> Vec<Value> {
        self.state()["Volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The driver's snapshots (`Id`, `VolID`, `Path`, `SizeBytes`, ...).
    pub fn snapshots(&self) -> Vec<Value> {
        self.state()["Snapshots"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Where the data of volume `id` is.
    pub fn volume_path(&self, id: &str) -> PathBuf {
        self.state_dir.join(id)
    }

    pub fn logs(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 40)
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Writes `data` at the start of the file `path` without truncating it (a
/// block volume's backing file keeps its size).
pub fn write_at_start(path: &Path, data: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    file.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    file.sync_all().expect("sync");
}

/// The first `n` bytes of the file `path`.
pub fn read_start(path: &Path, n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buffer = vec![0; n];
    let mut file =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let read = file.read(&mut buffer).expect("read");
    buffer.truncate(read);
    buffer
}
