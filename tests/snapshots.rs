//! Restoring claims from VolumeSnapshots on a real cluster (issue 23):
//! the six snapshot CRDs, the upstream `snapshot-controller` (one per
//! control plane) and an upstream `csi-snapshotter` next to each test's
//! driver take the snapshots; the sidecar, bound to the RBAC of `deploy/`,
//! restores them. Against our `csi-hostpath` and, where the case needs no
//! fault injection, the upstream `hostpathplugin`.
//!
//! Every case ends with [`clean_up`]: claims and VolumeSnapshots deleted,
//! then nothing may be left (no claim, PV, VolumeSnapshot or
//! VolumeSnapshotContent stuck with a finalizer, no backend volume or
//! snapshot), and the sidecar must not have been refused a request.
//!
//! The API server runs with its `CrossNamespaceVolumeDataSource` gate (it
//! drops `dataSourceRef.namespace` otherwise); nothing else here depends on
//! it, so every case shares that one control plane.

mod support;

#[path = "snapshots/orphan_audit.rs"]
mod orphan_audit;
use orphan_audit::{
    orphaned_volumes_are_reported_and_handed_over, volumes_of_other_prefixes_are_left_out,
};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use csi_hostpath::ContentSource;
use csi_hostpath::faults::Fault;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use serde_json::{Value, json};
use support::snapshots::{
    CONTROLLER_BOUND_FINALIZER, Hostpathplugin, PROVISIONER_SOURCE_FINALIZER, read_start,
    write_at_start,
};
use support::{Backend, ClusterConfig, Env};

e2e_real!(ClusterConfig::standard().with_apiserver_feature_gates("CrossNamespaceVolumeDataSource=true");
    ready_snapshots_are_restored,
    ready_snapshots_are_restored_by_hostpathplugin,
    a_claim_waits_for_its_snapshot,
    a_claim_waits_for_its_snapshot_with_hostpathplugin,
    a_snapshot_deleted_before_the_restore_is_refused,
    a_snapshot_deleted_before_the_restore_is_refused_with_hostpathplugin,
    a_snapshot_deleted_during_the_restore_leaks_nothing,
    a_snapshot_of_another_namespace_needs_a_reference_grant,
    orphaned_source_finalizers_are_swept,
    the_sweep_keeps_the_finalizer_of_another_provisioners_restore,
    orphaned_volumes_are_reported_and_handed_over,
    volumes_of_other_prefixes_are_left_out,
);

const MI: u64 = 1 << 20;
const GATE: &str = "--feature-gates=CrossNamespaceVolumeDataSource=true";
/// The log line of the sweep (src/snapshot_sweep) for each finalizer it
/// removes.
const SWEPT: &str = "removed an orphaned source-protection finalizer";

/// Declares the two runs of a case `async fn case(backend, upstream)`:
/// against our `csi-hostpath` and against the upstream `hostpathplugin`.
macro_rules! with_each_driver {
    ($case:ident: $ours:ident, $upstream:ident) => {
        async fn $ours(backend: Backend) {
            $case(backend, false).await;
        }

        async fn $upstream(backend: Backend) {
            $case(backend, true).await;
        }
    };
}

/// The driver a case runs against.
enum Driver {
    /// This repository's `csi-hostpath`, in-process (fault injection).
    Ours,
    /// The upstream Go `hostpathplugin`.
    Upstream(Hostpathplugin),
}

impl Driver {
    fn name(&self) -> &'static str {
        match self {
            Driver::Ours => "csi-hostpath",
            Driver::Upstream(_) => "hostpathplugin",
        }
    }

    /// The backend's volume ids. Two volumes of one CSI name (a claim
    /// provisioned twice) fail the test: counted by id, they would pass for
    /// the volumes of two claims.
    fn volume_ids(&self, env: &Env) -> Vec<String> {
        let volumes: Vec<(String, String)> = match self {
            Driver::Ours => env
                .backend_volumes()
                .into_iter()
                .map(|v| (v.id, v.name))
                .collect(),
            Driver::Upstream(plugin) => plugin
                .volumes()
                .iter()
                .map(|v| {
                    let field = |key: &str| v[key].as_str().unwrap_or_default().to_owned();
                    (field("VolID"), field("VolName"))
                })
                .collect(),
        };
        let mut names: Vec<&str> = volumes.iter().map(|(_, name)| name.as_str()).collect();
        names.sort_unstable();
        assert!(
            names.windows(2).all(|pair| pair[0] != pair[1]),
            "{}: two backend volumes of one name: {}",
            self.name(),
            self.describe(env)
        );
        volumes.into_iter().map(|(id, _)| id).collect()
    }

    /// The backend's snapshot ids.
    fn snapshot_ids(&self, env: &Env) -> Vec<String> {
        match self {
            Driver::Ours => env.backend_snapshots().into_iter().map(|s| s.id).collect(),
            Driver::Upstream(plugin) => plugin
                .snapshots()
                .iter()
                .filter_map(|s| s["Id"].as_str().map(str::to_owned))
                .collect(),
        }
    }

    /// Checks that the backend made `volume` from the snapshot `snapshot`
    /// where it records that: our driver keeps the content source of each
    /// volume; hostpathplugin (v1.18) leaves `ParentSnapID` empty on a
    /// restore, so there the restored data ([`restored_data`]) is the
    /// evidence.
    fn assert_restored_from(&self, env: &Env, volume: &str, snapshot: &str) {
        match self {
            Driver::Ours => {
                let source = env
                    .backend_volumes()
                    .into_iter()
                    .find(|v| v.id == volume)
                    .and_then(|v| v.content_source);
                assert_eq!(
                    source,
                    Some(ContentSource::Snapshot {
                        id: snapshot.to_owned()
                    }),
                    "volume {volume} is made from snapshot {snapshot}; backend: {}",
                    self.describe(env)
                );
            }
            Driver::Upstream(plugin) => {
                let record = plugin
                    .volumes()
                    .into_iter()
                    .find(|v| v["VolID"] == json!(volume))
                    .unwrap_or_else(|| panic!("no volume {volume}: {}", self.describe(env)));
                let parent = record["ParentSnapID"].as_str().unwrap_or_default();
                assert!(
                    parent.is_empty() || parent == snapshot,
                    "volume {volume} is made from snapshot {snapshot}: {record:#}"
                );
            }
        }
    }

    /// The backend's size of a volume.
    fn capacity(&self, env: &Env, volume: &str) -> Option<u64> {
        match self {
            Driver::Ours => env
                .backend_volumes()
                .into_iter()
                .find(|v| v.id == volume)
                .map(|v| v.capacity_bytes),
            Driver::Upstream(plugin) => plugin
                .volumes()
                .into_iter()
                .find(|v| v["VolID"] == json!(volume))?["VolSize"]
                .as_u64(),
        }
    }

    /// Where a test writes into a filesystem volume (a file in it) or a
    /// block volume (its backing file).
    fn data_file(&self, env: &Env, volume: &str, block: bool) -> PathBuf {
        match self {
            Driver::Ours => {
                let dir = csi_hostpath::volume_path(&env.driver.state_dir, volume);
                dir.join(if block { "block" } else { "data.txt" })
            }
            Driver::Upstream(plugin) => {
                let path = plugin.volume_path(volume);
                if block { path } else { path.join("data.txt") }
            }
        }
    }

    /// The backend's records, for failure messages.
    fn describe(&self, env: &Env) -> String {
        match self {
            Driver::Ours => format!("{:#?}", env.backend_volumes()),
            Driver::Upstream(plugin) => format!("{:#}", plugin.state()),
        }
    }

    fn logs(&self) -> String {
        match self {
            Driver::Ours => String::new(),
            Driver::Upstream(plugin) => {
                format!("--- hostpathplugin (last 40 lines) ---\n{}", plugin.logs())
            }
        }
    }
}

/// The sweep (`--snapshot-orphan-sweep-interval`) looks at every
/// VolumeSnapshot of the cluster and frees those that no pending claim *of
/// its cache* restores from; that cache holds only its own driver's claims,
/// so a sidecar sweeping every second strips the finalizers of the other
/// tests' restores (what
/// [`the_sweep_keeps_the_finalizer_of_another_provisioners_restore`]
/// shows). Cases with a short sweep therefore run alone: they take this
/// lock for writing, every other case for reading.
static SWEEPING: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A case's turn on the shared cluster, held until the case ends (bind it
/// before its `Env`, so that the sidecar is gone before the turn ends).
enum Turn {
    Shared(#[allow(dead_code)] tokio::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] tokio::sync::RwLockWriteGuard<'static, ()>),
}

async fn turn(sweeps: bool) -> Turn {
    if sweeps {
        Turn::Alone(SWEEPING.write().await)
    } else {
        Turn::Shared(SWEEPING.read().await)
    }
}

/// [`set_up`] with our driver, a csi-snapshotter and the sidecar's orphan
/// sweep every `interval` (so the case runs alone).
async fn set_up_sweeping(backend: Backend, interval: &str) -> Option<(Turn, Env, Driver)> {
    let sweep = format!("--snapshot-orphan-sweep-interval={interval}");
    set_up(backend, false, true, &[&sweep]).await
}

/// A test's cluster objects and processes: its driver (ours, or
/// hostpathplugin in its place), the snapshot components (the csi-snapshotter
/// only with `snapshotter`), StorageClass `fast` (Immediate, Delete) and
/// VolumeSnapshotClass `snap`, and the sidecar with `flags`. `None` when a
/// binary is missing and skipping is allowed. With a sweep interval in
/// `flags`, the case runs alone ([`turn`]).
async fn set_up(
    backend: Backend,
    upstream: bool,
    snapshotter: bool,
    flags: &[&str],
) -> Option<(Turn, Env, Driver)> {
    let turn = turn(
        flags
            .iter()
            .any(|f| f.starts_with("--snapshot-orphan-sweep-interval=")),
    )
    .await;
    let mut env = Env::new(backend).await;
    let driver = if upstream {
        Driver::Upstream(Hostpathplugin::start(&mut env, &[]).await?)
    } else {
        Driver::Ours
    };
    if snapshotter {
        env.start_snapshotter().await?;
    } else {
        env.start_snapshot_controller().await?;
    }
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.snapshot_class("snap").await;
    env.start_sidecar(flags).await;
    Some((turn, env, driver))
}

fn handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("csi handle")
}

fn capacity(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default()
}

fn phase(claim: &PersistentVolumeClaim) -> String {
    claim
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// A 5Mi claim `name` (Block or Filesystem), bound, with `data` written
/// into it; returns its volume id.
async fn source(
    env: &Env,
    driver: &Driver,
    ns: &str,
    name: &str,
    block: bool,
    data: &str,
) -> String {
    let extra = if block {
        json!({"spec": {"volumeMode": "Block"}})
    } else {
        json!({})
    };
    env.create_pvc(ns, name, "fast", "5Mi", extra).await;
    let id = handle(&env.wait_bound(ns, name).await);
    let file = driver.data_file(env, &id, block);
    if block {
        write_at_start(&file, data.as_bytes());
    } else {
        std::fs::write(&file, data).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
    }
    id
}

/// The `dataSource` of a claim restored from the VolumeSnapshot `snapshot`.
fn from_snapshot(snapshot: &str, block: bool) -> Value {
    let mut extra = json!({"spec": {"dataSource": {
        "apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snapshot}}});
    if block {
        extra["spec"]["volumeMode"] = json!("Block");
    }
    extra
}

/// What a restored volume holds: the bytes written into its source.
fn restored_data(env: &Env, driver: &Driver, volume: &str, block: bool, len: usize) -> Vec<u8> {
    let file = driver.data_file(env, volume, block);
    if block {
        read_start(&file, len)
    } else {
        std::fs::read(&file).unwrap_or_else(|e| {
            panic!(
                "{}: restored data {}: {e}\n{}",
                driver.name(),
                file.display(),
                driver.logs()
            )
        })
    }
}

/// The upstream message of a claim whose snapshot does not exist.
fn not_found(snapshot: &str) -> String {
    format!(
        "error getting handle for DataSource Type VolumeSnapshot by Name {snapshot}: error getting snapshot {snapshot} from api server: volumesnapshots.snapshot.storage.k8s.io \"{snapshot}\" not found"
    )
}

/// Waits for a `ProvisioningFailed` event on the claim whose message
/// satisfies `matches`; returns it.
async fn wait_failure(
    env: &Env,
    ns: &str,
    claim: &str,
    what: &str,
    matches: impl Fn(&str) -> bool,
) -> String {
    env.wait_for(
        &format!("ProvisioningFailed on {ns}/{claim}: {what}"),
        Duration::from_secs(30),
        || async {
            env.events(ns, claim)
                .await
                .into_iter()
                .find(|(reason, message)| reason == "ProvisioningFailed" && matches(message))
                .map(|(_, message)| message)
        },
    )
    .await
}

/// Waits until the sidecar has read the VolumeSnapshot `ns/name` `n`
/// more times (it retries the claim), so that what is asserted after
/// held over several attempts.
async fn wait_retries(env: &Env, ns: &str, name: &str, n: usize) {
    let before = env.sidecar_snapshot_reads(ns, name);
    env.wait_for(
        &format!("{n} more reads of VolumeSnapshot {ns}/{name} by the sidecar"),
        Duration::from_secs(30),
        || async { (env.sidecar_snapshot_reads(ns, name) >= before + n).then_some(()) },
    )
    .await;
}

/// Waits until a VolumeSnapshot, its content and the backend snapshot are
/// gone.
async fn wait_snapshot_gone(
    env: &Env,
    driver: &Driver,
    ns: &str,
    name: &str,
    content: &str,
    id: &str,
) {
    env.wait_for(
        &format!("VolumeSnapshot {ns}/{name}, its content {content} and snapshot {id} gone"),
        Duration::from_secs(60),
        || async {
            (env.volume_snapshot(ns, name).await.is_none()
                && env.snapshot_content(content).await.is_none()
                && !driver.snapshot_ids(env).contains(&id.to_owned()))
            .then_some(())
        },
    )
    .await;
}

/// Deletes every claim and VolumeSnapshot of `namespaces`, then waits
/// until nothing is left of them: no claim, no PV of the test, no
/// VolumeSnapshot, no VolumeSnapshotContent of the driver, no backend
/// volume or snapshot. Fails naming what is stuck (with its finalizers),
/// and when the sidecar was refused a request.
async fn clean_up(env: &Env, driver: &Driver, namespaces: &[&str]) {
    for ns in namespaces {
        let claims = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), ns)
            .list(&Default::default())
            .await
            .expect("list claims");
        for claim in claims.items {
            env.delete_pvc(ns, claim.metadata.name.as_deref().unwrap_or_default())
                .await;
        }
        for snapshot in env.volume_snapshots(ns).await {
            let name = snapshot["metadata"]["name"].as_str().unwrap_or_default();
            env.delete(support::snapshots::SNAPSHOT_API, "VolumeSnapshot", ns, name)
                .await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut left = Vec::new();
        for ns in namespaces {
            let claims = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), ns)
                .list(&Default::default())
                .await
                .expect("list claims");
            for claim in claims.items {
                left.push(format!(
                    "claim {ns}/{} finalizers {:?}",
                    claim.metadata.name.unwrap_or_default(),
                    claim.metadata.finalizers.unwrap_or_default()
                ));
            }
            for snapshot in env.volume_snapshots(ns).await {
                left.push(format!(
                    "VolumeSnapshot {ns}/{} finalizers {}",
                    snapshot["metadata"]["name"], snapshot["metadata"]["finalizers"]
                ));
            }
        }
        for pv in env.pvs().await {
            left.push(format!(
                "PV {} finalizers {:?}",
                pv.metadata.name.unwrap_or_default(),
                pv.metadata.finalizers.unwrap_or_default()
            ));
        }
        for content in env.snapshot_contents().await {
            left.push(format!(
                "VolumeSnapshotContent {} finalizers {}",
                content["metadata"]["name"], content["metadata"]["finalizers"]
            ));
        }
        for id in driver.volume_ids(env) {
            left.push(format!("backend volume {id}"));
        }
        for id in driver.snapshot_ids(env) {
            left.push(format!("backend snapshot {id}"));
        }
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: left 90 s after the clean-up:\n{}\n{}{}",
            driver.name(),
            left.join("\n"),
            env.logs(),
            driver.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    env.assert_nothing_forbidden();
}

with_each_driver!(restore_ready_snapshots:
    ready_snapshots_are_restored,
    ready_snapshots_are_restored_by_hostpathplugin
);

/// Case 1 and 4: filesystem and block snapshots, ready, are restored at
/// their size and larger, with their data; the provisioner's
/// source-protection finalizer is on each snapshot during its restores and
/// gone after.
async fn restore_ready_snapshots(backend: Backend, upstream: bool) {
    let Some((_turn, env, driver)) = set_up(backend, upstream, true, &[]).await else {
        return;
    };
    let ns = env.ns.clone();
    let fs_data = format!("filesystem data of {}", env.id);
    let block_data = format!("block data of {}", env.id);
    source(&env, &driver, &ns, "fs-src", false, &fs_data).await;
    source(&env, &driver, &ns, "block-src", true, &block_data).await;
    env.take_snapshot(&ns, "fs-snap", "snap", "fs-src").await;
    env.take_snapshot(&ns, "block-snap", "snap", "block-src")
        .await;
    let fs_snap = env.wait_snapshot_ready(&ns, "fs-snap").await;
    let block_snap = env.wait_snapshot_ready(&ns, "block-snap").await;
    for snap in [&fs_snap, &block_snap] {
        assert!(
            ["5Mi", "5242880"].contains(&snap.restore_size.as_str()),
            "restoreSize {}",
            snap.restore_size
        );
    }
    assert_eq!(driver.snapshot_ids(&env).len(), 2, "two backend snapshots");

    env.reset_counters();
    for (name, snapshot, size, block) in [
        ("fs-restore", "fs-snap", "5Mi", false),
        ("block-restore", "block-snap", "5Mi", true),
        ("big-restore", "fs-snap", "12Mi", false),
    ] {
        env.create_pvc(&ns, name, "fast", size, from_snapshot(snapshot, block))
            .await;
    }
    for (name, snap, size, block, data) in [
        ("fs-restore", &fs_snap, "5Mi", false, &fs_data),
        ("block-restore", &block_snap, "5Mi", true, &block_data),
        ("big-restore", &fs_snap, "12Mi", false, &fs_data),
    ] {
        let pv = env.wait_bound(&ns, name).await;
        let id = handle(&pv);
        assert_eq!(capacity(&pv), size, "{name}: PV capacity");
        let mode = pv.spec.as_ref().and_then(|s| s.volume_mode.clone());
        assert_eq!(
            mode.as_deref(),
            Some(if block { "Block" } else { "Filesystem" }),
            "{name}: volume mode"
        );
        driver.assert_restored_from(&env, &id, &snap.handle);
        let bytes: u64 = size.trim_end_matches("Mi").parse::<u64>().expect("size") * MI;
        assert_eq!(
            driver.capacity(&env, &id),
            Some(bytes),
            "{name}: backend size"
        );
        assert_eq!(
            restored_data(&env, &driver, &id, block, data.len()),
            data.as_bytes(),
            "{name}: the snapshot's data"
        );
        let message = env.wait_event(&ns, name, "ProvisioningSucceeded").await;
        assert!(
            message.contains("Successfully provisioned volume"),
            "{message}"
        );
    }
    assert_eq!(driver.volume_ids(&env).len(), 5, "2 sources + 3 restores");

    // Case 4: the provisioner's finalizer was put on each snapshot (and
    // taken off: at least two writes each) and is gone now; the
    // snapshot-controller's own stay.
    for snapshot in ["fs-snap", "block-snap"] {
        env.wait_source_protected(&ns, snapshot, false, Duration::from_secs(30))
            .await;
        // The audit log is written as requests complete: wait for it.
        env.wait_for(
            &format!(
                "{snapshot}: two writes of the sidecar (finalizer added, removed) in the audit log"
            ),
            Duration::from_secs(10),
            || async { (env.sidecar_snapshot_writes(&ns, snapshot) >= 2).then_some(()) },
        )
        .await;
        let finalizers = env
            .snapshot_finalizers(&ns, snapshot)
            .await
            .expect("snapshot");
        assert!(
            finalizers.iter().any(|f| f == CONTROLLER_BOUND_FINALIZER),
            "{snapshot}: {finalizers:?}"
        );
    }
    clean_up(&env, &driver, &[&ns]).await;
}

with_each_driver!(claim_waits_for_its_snapshot:
    a_claim_waits_for_its_snapshot,
    a_claim_waits_for_its_snapshot_with_hostpathplugin
);

/// Case 2: a claim created before its VolumeSnapshot exists, then before
/// it is ready (no csi-snapshotter yet), waits with the reason in its
/// events and binds once the snapshot is ready.
async fn claim_waits_for_its_snapshot(backend: Backend, upstream: bool) {
    let Some((_turn, mut env, driver)) = set_up(backend, upstream, false, &[]).await else {
        return;
    };
    let ns = env.ns.clone();
    let data = format!("waited for by {}", env.id);
    source(&env, &driver, &ns, "src", false, &data).await;

    env.reset_counters();
    env.create_pvc(&ns, "early", "fast", "5Mi", from_snapshot("later", false))
        .await;
    wait_failure(&env, &ns, "early", "snapshot not found", |m| {
        m == not_found("later")
    })
    .await;
    wait_retries(&env, &ns, "later", 3).await;
    assert_eq!(driver.volume_ids(&env).len(), 1, "nothing restored yet");

    // The snapshot exists, bound to its content, but without a
    // csi-snapshotter nobody takes it: not ready.
    env.take_snapshot(&ns, "later", "snap", "src").await;
    let message = wait_failure(&env, &ns, "early", "snapshot not ready", |m| {
        m.contains("error getting handle for DataSource Type VolumeSnapshot by Name later: ")
            && (m.ends_with("snapshot later is not Ready")
                || m.ends_with("snapshot later not bound"))
    })
    .await;
    wait_retries(&env, &ns, "later", 3).await;
    let claim = env.pvc(&ns, "early").await.expect("claim");
    assert_eq!(phase(&claim), "Pending", "waits: {message}");
    assert_eq!(driver.volume_ids(&env).len(), 1, "nothing restored yet");
    assert_ne!(
        env.source_protected(&ns, "later").await,
        Some(true),
        "no restore started, so no protection"
    );

    env.start_snapshotter().await.expect("csi-snapshotter");
    let snap = env.wait_snapshot_ready(&ns, "later").await;
    let pv = env.wait_bound(&ns, "early").await;
    let id = handle(&pv);
    driver.assert_restored_from(&env, &id, &snap.handle);
    assert_eq!(
        restored_data(&env, &driver, &id, false, data.len()),
        data.as_bytes()
    );
    env.wait_event(&ns, "early", "ProvisioningSucceeded").await;
    clean_up(&env, &driver, &[&ns]).await;
}

with_each_driver!(snapshot_deleted_before_the_restore:
    a_snapshot_deleted_before_the_restore_is_refused,
    a_snapshot_deleted_before_the_restore_is_refused_with_hostpathplugin
);

/// Case 3, before: a snapshot deleted (gone, or still Terminating behind
/// another finalizer) before the claim is created is refused with a clear
/// event, over several attempts, and no volume is made.
async fn snapshot_deleted_before_the_restore(backend: Backend, upstream: bool) {
    let Some((_turn, env, driver)) = set_up(backend, upstream, true, &[]).await else {
        return;
    };
    let ns = env.ns.clone();
    source(&env, &driver, &ns, "src", false, "gone before").await;

    // Gone altogether.
    env.take_snapshot(&ns, "gone", "snap", "src").await;
    let gone = env.wait_snapshot_ready(&ns, "gone").await;
    env.delete(
        support::snapshots::SNAPSHOT_API,
        "VolumeSnapshot",
        &ns,
        "gone",
    )
    .await;
    wait_snapshot_gone(&env, &driver, &ns, "gone", &gone.content, &gone.handle).await;
    env.reset_counters();
    env.create_pvc(
        &ns,
        "from-gone",
        "fast",
        "5Mi",
        from_snapshot("gone", false),
    )
    .await;
    wait_failure(&env, &ns, "from-gone", "snapshot not found", |m| {
        m == not_found("gone")
    })
    .await;
    wait_retries(&env, &ns, "gone", 3).await;
    assert_eq!(
        driver.volume_ids(&env).len(),
        1,
        "no volume for a missing snapshot"
    );

    // Terminating: deleted, held by someone else's finalizer; its content
    // is gone already.
    env.take_snapshot(&ns, "held", "snap", "src").await;
    let held = env.wait_snapshot_ready(&ns, "held").await;
    env.edit_snapshot_finalizers(&ns, "held", |f| f.push("example.com/hold".into()))
        .await;
    env.delete(
        support::snapshots::SNAPSHOT_API,
        "VolumeSnapshot",
        &ns,
        "held",
    )
    .await;
    env.wait_for(
        "held: Terminating, content and backend snapshot gone",
        Duration::from_secs(60),
        || async {
            let finalizers = env.snapshot_finalizers(&ns, "held").await?;
            (finalizers == ["example.com/hold"]
                && env.snapshot_content(&held.content).await.is_none()
                && !driver.snapshot_ids(&env).contains(&held.handle))
            .then_some(())
        },
    )
    .await;
    env.create_pvc(
        &ns,
        "from-held",
        "fast",
        "5Mi",
        from_snapshot("held", false),
    )
    .await;
    let message = wait_failure(&env, &ns, "from-held", "snapshot being deleted", |m| {
        m.starts_with("error getting handle for DataSource Type VolumeSnapshot by Name held: ")
    })
    .await;
    assert_eq!(
        message,
        "error getting handle for DataSource Type VolumeSnapshot by Name held: snapshot held is being deleted"
    );
    wait_retries(&env, &ns, "held", 3).await;
    assert_eq!(
        driver.volume_ids(&env).len(),
        1,
        "no volume for a snapshot being deleted"
    );
    assert_eq!(
        env.snapshot_finalizers(&ns, "held").await,
        Some(vec!["example.com/hold".to_owned()]),
        "no protection added to a snapshot being deleted"
    );
    for claim in ["from-gone", "from-held"] {
        assert_eq!(phase(&env.pvc(&ns, claim).await.expect("claim")), "Pending");
    }
    env.edit_snapshot_finalizers(&ns, "held", |f| f.retain(|f| f != "example.com/hold"))
        .await;
    clean_up(&env, &driver, &[&ns]).await;
}

/// Case 3, during: a snapshot deleted while its restore runs (a slow
/// CreateVolume, the provisioner's finalizer on) is still restored, then
/// goes; a restore whose claim is deleted as well leaves no volume and no
/// finalizer behind.
async fn a_snapshot_deleted_during_the_restore_leaks_nothing(backend: Backend) {
    let Some((_turn, env, driver)) = set_up_sweeping(backend, "2s").await else {
        return;
    };
    let ns = env.ns.clone();
    let data = format!("deleted during {}", env.id);
    source(&env, &driver, &ns, "src", false, &data).await;
    env.take_snapshot(&ns, "snap", "snap", "src").await;
    let snap = env.wait_snapshot_ready(&ns, "snap").await;

    // The restore goes on after the deletion.
    env.set_faults(vec![Fault::delay("CreateVolume", Duration::from_secs(4))]);
    env.create_pvc(&ns, "during", "fast", "5Mi", from_snapshot("snap", false))
        .await;
    // The restore started.
    env.wait_source_protected(&ns, "snap", true, Duration::from_secs(20))
        .await;
    env.delete(
        support::snapshots::SNAPSHOT_API,
        "VolumeSnapshot",
        &ns,
        "snap",
    )
    .await;
    let snapshot = env.volume_snapshot(&ns, "snap").await.expect("Terminating");
    assert!(
        snapshot["metadata"]["deletionTimestamp"].is_string(),
        "{snapshot}"
    );
    let pv = env.wait_bound(&ns, "during").await;
    let id = handle(&pv);
    driver.assert_restored_from(&env, &id, &snap.handle);
    assert_eq!(
        restored_data(&env, &driver, &id, false, data.len()),
        data.as_bytes()
    );
    env.wait_event(&ns, "during", "ProvisioningSucceeded").await;
    wait_snapshot_gone(&env, &driver, &ns, "snap", &snap.content, &snap.handle).await;
    assert_eq!(driver.volume_ids(&env).len(), 2, "source and restore");

    // The claim is deleted while CreateVolume runs: the volume it makes
    // is deleted, the operation closed, the snapshot freed.
    restore_abandoned(&env, &driver, "abandoned", "snap2", false).await;
    // The claim and the snapshot are both deleted while CreateVolume runs:
    // whichever comes first (the driver finds its snapshot gone, or the
    // volume is made and deleted), nothing is left.
    restore_abandoned(&env, &driver, "abandoned-too", "snap3", true).await;
    env.clear_faults();
    clean_up(&env, &driver, &[&ns]).await;
}

/// A restore of claim `claim` from a new snapshot `snapshot` (CreateVolume
/// slowed down by the caller's fault) whose claim is deleted once the
/// provisioner's finalizer shows the restore started; with
/// `delete_snapshot`, the snapshot is deleted too. Then the sidecar must
/// close the operation (its journal entry) without a backend volume left,
/// and the snapshot must lose the provisioner's finalizer (removed by the
/// sweep, as upstream, or by the claim's clean-up).
async fn restore_abandoned(
    env: &Env,
    driver: &Driver,
    claim: &str,
    snapshot: &str,
    delete_snapshot: bool,
) {
    let ns = env.ns.clone();
    let volumes_before = driver.volume_ids(env).len();
    env.take_snapshot(&ns, snapshot, "snap", "src").await;
    let snap = env.wait_snapshot_ready(&ns, snapshot).await;
    let created = env
        .create_pvc(&ns, claim, "fast", "5Mi", from_snapshot(snapshot, false))
        .await;
    let uid = created.metadata.uid.clone().expect("uid");
    env.wait_for(
        &format!("the restore of {claim} started"),
        Duration::from_secs(20),
        || async {
            let started = env.source_protected(&ns, snapshot).await?;
            (started && env.journal().await.contains_key(&uid)).then_some(())
        },
    )
    .await;
    if delete_snapshot {
        env.delete(
            support::snapshots::SNAPSHOT_API,
            "VolumeSnapshot",
            &ns,
            snapshot,
        )
        .await;
    }
    env.delete_pvc(&ns, claim).await;
    // What the case is about: the deletions came while the restore was
    // still running. The operation is open until its PV is saved (then its
    // journal entry goes): with the entry still there and no PV yet after
    // both deletions, both came before the restore could finish. (Should a
    // slow machine let CreateVolume's delay run out first, this fails
    // rather than test something else.)
    let volume = format!("pvc-{uid}");
    assert!(
        env.journal().await.contains_key(&uid) && env.pv(&volume).await.is_none(),
        "{claim}: the restore finished before its claim{} was deleted\n{}",
        if delete_snapshot { " and snapshot" } else { "" },
        env.logs()
    );
    env.wait_for(
        &format!("claim {claim} gone"),
        Duration::from_secs(30),
        || async { env.pvc(&ns, claim).await.is_none().then_some(()) },
    )
    .await;
    env.wait_for(
        &format!("the operation of {claim} closed"),
        Duration::from_secs(40),
        || async { (!env.journal().await.contains_key(&uid)).then_some(()) },
    )
    .await;
    let made_and_deleted = env
        .logs()
        .lines()
        .any(|l| l.contains("calling DeleteVolume") && l.contains(&volume));
    assert_eq!(
        driver.volume_ids(env).len(),
        volumes_before,
        "{claim}: no volume left of the abandoned restore: {}",
        driver.describe(env)
    );
    if delete_snapshot {
        wait_snapshot_gone(env, driver, &ns, snapshot, &snap.content, &snap.handle).await;
    } else {
        assert!(
            made_and_deleted,
            "{claim}: the restored volume was made, then deleted\n{}",
            env.logs()
        );
        env.wait_source_protected(&ns, snapshot, false, Duration::from_secs(20))
            .await;
    }
    let swept = env
        .logs()
        .lines()
        .any(|l| l.contains(SWEPT) && l.contains(&format!("{ns}/{snapshot}")));
    eprintln!(
        "{claim}: volume made and deleted: {made_and_deleted}; {snapshot} freed by the sweep: {swept}"
    );
}

/// Case 5: a claim restores a VolumeSnapshot of another namespace
/// (`dataSourceRef.namespace`) only once a ReferenceGrant there allows it;
/// refused before with upstream's message, and no volume is made.
async fn a_snapshot_of_another_namespace_needs_a_reference_grant(backend: Backend) {
    let _turn = turn(false).await;
    let mut env = Env::new(backend).await;
    env.install_reference_grant_crd().await;
    if env.start_snapshotter().await.is_none() {
        return;
    }
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    env.snapshot_class("snap").await;
    env.start_sidecar(&[GATE]).await;
    let driver = Driver::Ours;
    let ns = env.ns.clone();
    let source_ns = format!("src-{}", env.id);
    env.create_namespace(&source_ns).await;
    let data = format!("from {source_ns}");
    source(&env, &driver, &source_ns, "src", false, &data).await;
    env.take_snapshot(&source_ns, "shared", "snap", "src").await;
    let snap = env.wait_snapshot_ready(&source_ns, "shared").await;

    env.reset_counters();
    env.create_pvc(
        &ns,
        "copy",
        "fast",
        "5Mi",
        json!({"spec": {"dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io",
            "kind": "VolumeSnapshot", "name": "shared", "namespace": source_ns}}}),
    )
    .await;
    let claim = env.pvc(&ns, "copy").await.expect("claim");
    assert_eq!(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.data_source_ref.as_ref())
            .and_then(|r| r.namespace.clone()),
        Some(source_ns.clone()),
        "the API server kept dataSourceRef.namespace (its gate is on)"
    );
    let expected = format!(
        "accessing {source_ns}/shared of VolumeSnapshot dataSource from {ns}/copy isn't allowed"
    );
    wait_failure(&env, &ns, "copy", "not granted", |m| m.contains(&expected)).await;
    // A grant for claims of another namespace changes nothing.
    env.create(json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "others", "namespace": source_ns},
        "spec": {
            "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": "someone-else"}],
            "to": [{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}],
        },
    }))
    .await;
    wait_retries(&env, &source_ns, "shared", 3).await;
    assert_eq!(driver.volume_ids(&env).len(), 1, "refused: only the source");
    assert_eq!(
        phase(&env.pvc(&ns, "copy").await.expect("claim")),
        "Pending"
    );
    assert_eq!(
        env.source_protected(&source_ns, "shared").await,
        Some(false),
        "a refused restore does not protect the snapshot"
    );

    env.create(json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "allow-copy", "namespace": source_ns},
        "spec": {
            "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": ns}],
            "to": [{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "shared"}],
        },
    }))
    .await;
    let pv = env.wait_bound(&ns, "copy").await;
    let id = handle(&pv);
    driver.assert_restored_from(&env, &id, &snap.handle);
    assert_eq!(
        restored_data(&env, &driver, &id, false, data.len()),
        data.as_bytes()
    );
    env.wait_source_protected(&source_ns, "shared", false, Duration::from_secs(30))
        .await;
    env.wait_for(
        "the other namespace's snapshot protected meanwhile (two writes in the audit log)",
        Duration::from_secs(10),
        || async { (env.sidecar_snapshot_writes(&source_ns, "shared") >= 2).then_some(()) },
    )
    .await;
    clean_up(&env, &driver, &[&ns, &source_ns]).await;
}

/// Case 6: the sweep (`--snapshot-orphan-sweep-interval`) on real
/// VolumeSnapshots: the provisioner's finalizer left on a snapshot whose
/// restore is gone (a crash: put there by hand) is removed; one a pending
/// claim of ours still restores from is kept until that claim goes; a
/// Terminating snapshot freed by the sweep is then deleted with its content.
async fn orphaned_source_finalizers_are_swept(backend: Backend) {
    let Some((_turn, env, driver)) = set_up_sweeping(backend, "1s").await else {
        return;
    };
    let ns = env.ns.clone();
    source(&env, &driver, &ns, "src", false, "swept").await;
    for name in ["needed", "left", "terminating"] {
        env.take_snapshot(&ns, name, "snap", "src").await;
    }
    let mut ready = Vec::new();
    for name in ["needed", "left", "terminating"] {
        ready.push(env.wait_snapshot_ready(&ns, name).await);
    }
    // "needed": a claim of ours restores from it, and stays Pending (it
    // asks for less than the snapshot's restore size).
    env.create_pvc(&ns, "small", "fast", "1Mi", from_snapshot("needed", false))
        .await;
    wait_failure(&env, &ns, "small", "restore size", |m| {
        m.contains("is less than the size 5242880 for the source snapshot needed")
    })
    .await;
    // Finalizers as a crashed provisioner leaves them, "needed"'s first:
    // a sweep that frees "left" has seen "needed" with its finalizer.
    for name in ["needed", "terminating", "left"] {
        env.edit_snapshot_finalizers(&ns, name, |f| f.push(PROVISIONER_SOURCE_FINALIZER.into()))
            .await;
    }
    env.delete(
        support::snapshots::SNAPSHOT_API,
        "VolumeSnapshot",
        &ns,
        "terminating",
    )
    .await;
    // Swept.
    env.wait_source_protected(&ns, "left", false, Duration::from_secs(20))
        .await;
    let swept = env.logs();
    assert!(
        swept.contains(SWEPT) && swept.contains(&format!("{ns}/left")),
        "the sweep removed it\n{swept}"
    );
    // Terminating and unused: freed, then deleted with its content and
    // backend snapshot by the snapshot components.
    wait_snapshot_gone(
        &env,
        &driver,
        &ns,
        "terminating",
        &ready[2].content,
        &ready[2].handle,
    )
    .await;
    assert_eq!(
        env.source_protected(&ns, "needed").await,
        Some(true),
        "kept while a pending claim restores from it\n{}",
        env.logs()
    );
    env.delete_pvc(&ns, "small").await;
    // Freed once its claim is gone.
    env.wait_source_protected(&ns, "needed", false, Duration::from_secs(20))
        .await;
    assert_eq!(driver.volume_ids(&env).len(), 1, "no volume was made");
    clean_up(&env, &driver, &[&ns]).await;
}

/// Case 6, beside another provisioner: a pending claim of another driver's
/// class restoring from a snapshot keeps that provisioner's protection on
/// it, as upstream's sweep (which counts every pending claim) does. Our
/// sweep must not free a finalizer another provisioner's restore needs.
/// (Fails with the sidecar of this writing: its sweep knows only the claims
/// its cache keeps, those of its own driver, and frees the snapshot.)
async fn the_sweep_keeps_the_finalizer_of_another_provisioners_restore(backend: Backend) {
    let Some((_turn, env, driver)) = set_up_sweeping(backend, "1s").await else {
        return;
    };
    let ns = env.ns.clone();
    source(&env, &driver, &ns, "src", false, "theirs").await;
    env.storage_class_with(
        "other",
        "Immediate",
        "Delete",
        json!({}),
        json!({"provisioner": format!("other-{}.example.com", env.id)}),
    )
    .await;
    for name in ["theirs", "left"] {
        env.take_snapshot(&ns, name, "snap", "src").await;
        env.wait_snapshot_ready(&ns, name).await;
    }
    // Another provisioner (not running here) restores from "theirs": its
    // finalizer is on, its claim Pending.
    env.create_pvc(
        &ns,
        "their-restore",
        "other",
        "5Mi",
        from_snapshot("theirs", false),
    )
    .await;
    for name in ["theirs", "left"] {
        env.edit_snapshot_finalizers(&ns, name, |f| f.push(PROVISIONER_SOURCE_FINALIZER.into()))
            .await;
    }
    // Swept.
    env.wait_source_protected(&ns, "left", false, Duration::from_secs(20))
        .await;
    // "theirs" must stay protected, not only at the sweep that freed
    // "left": checked all along two more whole sweeps (each sweep logs one
    // line as it looks at the snapshots; the third line from here is
    // written once the second sweep from here is done).
    let sweeps_then = sweeps(&env);
    env.wait_for("two more sweeps", Duration::from_secs(30), || async {
        assert_eq!(
            env.source_protected(&ns, "theirs").await,
            Some(true),
            "our sweep removed the finalizer of another provisioner's pending restore\n{}",
            env.logs()
        );
        (sweeps(&env) >= sweeps_then + 3).then_some(())
    })
    .await;
    assert_eq!(
        env.source_protected(&ns, "theirs").await,
        Some(true),
        "our sweep removed the finalizer of another provisioner's pending restore\n{}",
        env.logs()
    );
    clean_up(&env, &driver, &[&ns]).await;
}

/// How many sweeps the sidecar has started: each logs one line as it looks
/// at the snapshots (src/snapshot_sweep).
fn sweeps(env: &Env) -> usize {
    env.logs()
        .lines()
        .filter(|l| l.contains("sweeping snapshot source-protection finalizers"))
        .count()
}
