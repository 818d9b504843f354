//! The orphan audit (`--orphan-audit-interval`, src/orphan_audit) on the
//! real cluster with the upstream `hostpathplugin`, which lists its volumes
//! (`LIST_VOLUMES`): a volume made on the driver behind the sidecar's back
//! is reported (gauges, a log line, the ConfigMap report); claims
//! provisioned while the audit runs every 2 seconds are not; the hand-over
//! docs/operations.md documents ("Orphan audit": a PV naming the volume,
//! bound to a claim that does not exist, reclaim policy Delete) deletes the
//! backend volume, which then leaves the report; a volume a PV with
//! reclaim policy Retain names leaves the report and stays, until that
//! PV's policy is set to Delete.
//!
//! With our driver, which keeps a volume's parameters as its context (so
//! `--extra-create-metadata` puts the PV name there): a volume whose
//! context names a PV of another `--volume-name-prefix` is left out and
//! counted (`madeByOtherPrefixes`), one that names a PV of ours or none is
//! reported, and a claim's own volume never is.
//!
//! A module of the `snapshots` binary, which already runs
//! `hostpathplugin` (CI's time: no binary of its own). It needs no
//! snapshot component, and takes no [`super::turn`]: its driver and its
//! volumes are its own.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use csi_proto::v1::controller_client::ControllerClient;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::{Value, json};

use crate::support::snapshots::Hostpathplugin;
use crate::support::{self, Backend, Env};

const MI: i64 = 1 << 20;
/// The log line of each orphan (src/orphan_audit/worker.rs).
const ORPHAN_LINE: &str = "orphaned volume:";

/// The report ConfigMap's `summary` (YAML) and `orphans` (one JSON object a
/// line), once it exists.
struct Report {
    summary: BTreeMap<String, String>,
    orphans: Vec<Value>,
    raw: BTreeMap<String, String>,
}

impl Report {
    fn ids(&self) -> BTreeSet<String> {
        self.orphans
            .iter()
            .filter_map(|o| o["volumeId"].as_str().map(str::to_owned))
            .collect()
    }

    fn count(&self) -> Option<usize> {
        self.summary.get("orphans")?.parse().ok()
    }
}

async fn report(env: &Env, name: &str) -> Option<Report> {
    let cm = Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns)
        .get_opt(name)
        .await
        .expect("get the report")?;
    let raw = cm.data.unwrap_or_default();
    let summary: Value = serde_yaml_ng::from_str(raw.get("summary")?).expect("summary is YAML");
    let summary = summary
        .as_object()?
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            )
        })
        .collect();
    let orphans = raw
        .get("orphans")
        .map(String::as_str)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    Some(Report {
        summary,
        orphans,
        raw,
    })
}

/// Waits for a report that passes `check`.
async fn wait_report(env: &Env, name: &str, what: &str, check: impl Fn(&Report) -> bool) -> Report {
    let what = format!("a report {what}");
    env.wait_for(&what, Duration::from_secs(30), || async {
        report(env, name).await.filter(|r| check(r))
    })
    .await
}

/// Waits until the gauges show `count` orphans of `bytes`.
async fn wait_gauges(env: &Env, port: u16, count: u32, bytes: i64) {
    let what = format!("the gauges at {count} orphans, {bytes} bytes");
    env.wait_for(&what, Duration::from_secs(10), || async {
        let shown = (
            gauge(port, "csi_provisioner_orphaned_volumes").await?,
            gauge(port, "csi_provisioner_orphaned_volume_bytes").await?,
        );
        (shown == (f64::from(count), bytes as f64)).then_some(())
    })
    .await;
}

/// Waits until the backend volume `volume` and the PV `pv` are gone.
async fn wait_deleted(env: &Env, plugin: &Hostpathplugin, volume: &str, pv: &str) {
    let what = format!("volume {volume} deleted on the backend, and PV {pv} gone");
    env.wait_for(&what, Duration::from_secs(60), || async {
        let gone = !backend_ids(plugin).contains(volume) && env.pv(pv).await.is_none();
        gone.then_some(())
    })
    .await;
}

/// The value of the unlabelled gauge `name` in `/metrics`, when present.
async fn gauge(port: u16, name: &str) -> Option<f64> {
    let (status, body) = support::http_get(port, "/metrics").await;
    if status != 200 {
        return None;
    }
    body.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix("{}").unwrap_or(rest).strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// A volume made on the driver directly, as a crashed provisioner or a
/// human leaves one: no journal entry, no PV.
async fn create_behind_the_sidecars_back(env: &Env, name: &str, bytes: i64) -> String {
    create_with_parameters(env, name, bytes, BTreeMap::new()).await
}

/// [`create_behind_the_sidecars_back`] with the parameters `parameters`
/// (our driver keeps them as the volume's context).
async fn create_with_parameters(
    env: &Env,
    name: &str,
    bytes: i64,
    parameters: BTreeMap<String, String>,
) -> String {
    let channel = csi_proto::transport::connect_unix(&env.driver.endpoint)
        .await
        .expect("connect to the driver");
    let request = csi_proto::v1::CreateVolumeRequest {
        parameters: parameters.into_iter().collect(),
        ..support::csi_requests::mount_volume(name, bytes)
    };
    ControllerClient::new(channel)
        .create_volume(request)
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume")
        .volume_id
}

/// The PV docs/operations.md ("Orphan audit") has a user apply to hand a
/// reported volume over: it names the volume, is bound to a claim that does
/// not exist (so the PV controller releases it) and carries the
/// provisioned-by annotation of the driver (so the sidecar deletes it).
fn handed_over(env: &Env, pv: &str, handle: &str, policy: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv,
                     "annotations": {"pv.kubernetes.io/provisioned-by": &env.driver_name}},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": policy,
            "csi": {"driver": &env.driver_name, "volumeHandle": handle},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "namespace": &env.ns, "name": format!("handed-over-{pv}"),
                         "uid": "00000000-0000-0000-0000-000000000000"},
        },
    })
}

fn backend_ids(plugin: &Hostpathplugin) -> BTreeSet<String> {
    plugin
        .volumes()
        .iter()
        .filter_map(|v| v["VolID"].as_str().map(str::to_owned))
        .collect()
}

pub async fn orphaned_volumes_are_reported_and_handed_over(backend: Backend) {
    let mut env = Env::new(backend).await;
    let Some(plugin) = Hostpathplugin::start(&mut env, &[]).await else {
        return;
    };
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let port = support::free_port();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    env.start_sidecar(&["--orphan-audit-interval=2s", &http])
        .await;
    let ns = env.ns.clone();
    let name = csi_provisioner::orphan_audit::decide::report_name(&env.driver_name, None);

    // Claims provisioned normally, in a burst while the audit runs every
    // 2 s: one may be listed before its PV is saved (a suspect once), none
    // is ever reported.
    let claims = ["a", "b", "c", "d"];
    for claim in claims {
        env.create_pvc(&ns, claim, "fast", "2Mi", json!({})).await;
    }
    let mut provisioned = BTreeSet::new();
    for claim in claims {
        let pv = env.wait_bound(&ns, claim).await;
        provisioned.insert(
            pv.spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle)
                .expect("a CSI handle"),
        );
    }

    // Behind the sidecar's back: two volumes, as a crashed provisioner or
    // a human leaves them (no journal entry, no PV).
    let deleted = create_behind_the_sidecars_back(&env, &format!("gone-{}", env.id), 3 * MI).await;
    let kept = create_behind_the_sidecars_back(&env, &format!("kept-{}", env.id), 4 * MI).await;
    let both = BTreeSet::from([deleted.clone(), kept.clone()]);
    let reported = wait_report(&env, &name, "with both volumes", |r| {
        both.is_subset(&r.ids())
    })
    .await;
    assert_eq!(
        reported.ids(),
        both,
        "only those: no claim's\n{:#?}",
        reported.raw
    );
    assert_eq!(reported.count(), Some(2), "{:#?}", reported.raw);
    assert_eq!(
        reported.summary.get("orphanBytes").map(String::as_str),
        Some("7340032"),
        "{:#?}",
        reported.raw
    );
    eprintln!(
        "an orphan audit report ({ns}/{name}):\n{}",
        serde_yaml_ng::to_string(&reported.raw).unwrap_or_default()
    );
    wait_gauges(&env, port, 2, 7 * MI).await;
    let logs = env.logs();
    for id in &both {
        let line = logs
            .lines()
            .find(|l| l.contains(ORPHAN_LINE) && l.contains(id.as_str()));
        let line = line.unwrap_or_else(|| panic!("a log line names the orphan {id}\n{logs}"));
        eprintln!("its log line: {line}");
    }

    // The hand-over, as docs/operations.md documents it, for one; a PV
    // that keeps the other (Retain): a volume a PV names leaves the report.
    let deleted_pv = format!("orphan-{}", env.id);
    let kept_pv = format!("kept-{}", env.id);
    env.create(handed_over(&env, &deleted_pv, &deleted, "Delete"))
        .await;
    env.create(handed_over(&env, &kept_pv, &kept, "Retain"))
        .await;
    wait_deleted(&env, &plugin, &deleted, &deleted_pv).await;
    let after = wait_report(&env, &name, "without either", |r| r.count() == Some(0)).await;
    assert!(after.orphans.is_empty(), "{:#?}", after.raw);
    assert!(
        backend_ids(&plugin).contains(&kept),
        "the volume a Retain PV names is kept"
    );
    wait_gauges(&env, port, 0, 0).await;
    // Decided later: its PV's reclaim policy set to Delete hands it over.
    let mut pv = env
        .get("v1", "PersistentVolume", "", &kept_pv)
        .await
        .expect("the kept PV");
    pv["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    env.replace(pv).await;
    wait_deleted(&env, &plugin, &kept, &kept_pv).await;

    // No claim's volume was ever reported, in any audit.
    let logs = env.logs();
    for handle in &provisioned {
        assert!(
            !logs
                .lines()
                .any(|l| l.contains(ORPHAN_LINE) && l.contains(handle.as_str())),
            "the volume {handle} of a claim was reported\n{logs}"
        );
    }

    // The claims' volumes go as usual; nothing is left on the backend.
    for claim in claims {
        env.delete_pvc(&ns, claim).await;
    }
    env.wait_for(
        "every backend volume deleted",
        Duration::from_secs(60),
        || async { backend_ids(&plugin).is_empty().then_some(()) },
    )
    .await;
}

pub async fn volumes_of_other_prefixes_are_left_out(backend: Backend) {
    const PV_NAME: &str = "csi.storage.k8s.io/pv/name";
    let mut env = Env::new(backend).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let port = support::free_port();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    env.start_sidecar(&[
        "--orphan-audit-interval=2s",
        "--extra-create-metadata",
        &http,
    ])
    .await;
    let ns = env.ns.clone();
    let name = csi_provisioner::orphan_audit::decide::report_name(&env.driver_name, None);
    env.create_pvc(&ns, "a", "fast", "2Mi", json!({})).await;
    let claims_volume = env
        .wait_bound(&ns, "a")
        .await
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .expect("a CSI handle");

    let named = |pv: &str| BTreeMap::from([(PV_NAME.to_owned(), pv.to_owned())]);
    let other = create_with_parameters(
        &env,
        &format!("other-{}", env.id),
        MI,
        named("other-0a1b2c3d-0000-4000-8000-000000000001"),
    )
    .await;
    let ours = create_with_parameters(
        &env,
        &format!("ours-{}", env.id),
        2 * MI,
        named("pvc-0a1b2c3d-0000-4000-8000-000000000002"),
    )
    .await;
    let unnamed =
        create_behind_the_sidecars_back(&env, &format!("unnamed-{}", env.id), 3 * MI).await;
    let expected = BTreeSet::from([ours.clone(), unnamed.clone()]);
    let reported = wait_report(&env, &name, "with ours and the unnamed one", |r| {
        expected.is_subset(&r.ids())
    })
    .await;
    assert_eq!(
        reported.ids(),
        expected,
        "not the other prefix's, nor the claim's {claims_volume}\n{:#?}",
        reported.raw
    );
    assert_eq!(
        reported
            .summary
            .get("madeByOtherPrefixes")
            .map(String::as_str),
        Some("1"),
        "{:#?}",
        reported.raw
    );
    assert_eq!(
        reported.summary.get("volumeNamePrefix").map(String::as_str),
        Some("pvc"),
        "{:#?}",
        reported.raw
    );
    let logs = env.logs();
    assert!(
        !logs
            .lines()
            .any(|l| l.contains(ORPHAN_LINE) && l.contains(other.as_str())),
        "the other prefix's volume {other} was reported\n{logs}"
    );

    // Nothing left: the three on the driver directly, the claim's by its
    // deletion.
    let channel = csi_proto::transport::connect_unix(&env.driver.endpoint)
        .await
        .expect("connect to the driver");
    for id in [&other, &ours, &unnamed] {
        ControllerClient::new(channel.clone())
            .delete_volume(csi_proto::v1::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect("DeleteVolume");
    }
    env.delete_pvc(&ns, "a").await;
    let state = support::state_dir(&env).to_owned();
    env.wait_for(
        "every backend volume deleted",
        Duration::from_secs(60),
        || async {
            csi_hostpath::backend_volumes(&state)
                .ok()
                .filter(Vec::is_empty)
                .map(|_| ())
        },
    )
    .await;
}
