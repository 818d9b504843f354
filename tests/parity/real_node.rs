//! On a real node (issue 34), as users run the sidecar: the images
//! `deploy/images/build-oci.sh` builds without Docker are imported into the
//! node's containerd and run in pods as the kubelet runs them (the
//! entrypoint is the binary, its shared libraries are in the image, and the
//! image's user, 65532, satisfies `runAsNonRoot` without a `runAsUser`);
//! `csi-hostpath` registers with the kubelet's plugin registry by itself
//! (its CSINode entry appears, and goes when it stops); `deploy/` is applied
//! with `kubectl apply -k` through an overlay for this test bed (with the
//! node plugin, and the upstream csi-snapshotter of
//! `deploy/kubernetes/snapshotter`, the snapshot CRDs and snapshot-controller
//! running beside the control plane as a cluster's own), and the
//! sidecar in its pod provisions a filesystem, a block and a
//! WaitForFirstConsumer claim that the kubelet mounts through the
//! DaemonSet's node plugin: a pod writes, a second pod reads what the first
//! wrote, and deleting the claims leaves no backend volume; the sidecar's
//! health checks and metrics answer as an operator reads them; a burst of
//! claims outlives the deletion of the sidecar's pod (one backend volume
//! per claim); two replicas of ours hand the Lease over on `kubectl
//! rollout restart` during a burst, provisioning no claim twice; the
//! upstream storage e2e specs pinned in `tests/e2e/pinned.txt` pass with
//! ours (`tests/e2e/mod.rs`; `REAL_NODE_E2E=full` runs the whole selection
//! with both images instead of these flows). The same
//! flows, but the two replicas, then run with the Go sidecar's image in the
//! same Deployment, as the baseline. The pods' logs are read through the
//! kubelet, as `kubectl logs` does (the API server's kubelet client
//! certificate).
//!
//! It is a module of the `parity` test binary (`cargo test --test parity
//! real_node`), not a binary of its own: its one long test then runs beside
//! the side-by-side tests on the binary's other test thread, instead of
//! alone after them (CI's time).
//!
//! The node is `../shared/k8s/node` (see its README.md and
//! `tests/controlplane/src/node.rs`): without it (or without root, or
//! `kubectl`) the test prints a SKIPPED line; with `CI` set it fails
//! instead. Only one node can run on a host, so every real-node flow is a
//! step of the one test below, not a test of its own, sharing one node and
//! one control plane.
//!
//! The overlay ([`write_overlays`]) changes only what this test bed needs
//! (deploy/README.md lists each change, and why a user would not make it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use controlplane::node::{NODE_NAME, Node, NodeFiles};
use controlplane::{Config, ControlPlane};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Node as NodeObject, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::json;

#[path = "../e2e/mod.rs"]
mod e2e;
use crate::support;

const TEST: &str = "real_node";
const WAIT: Duration = Duration::from_secs(180);
/// The driver of `deploy/`.
const DRIVER: &str = "hostpath.csi.k8s.io";
const DEPLOY_NAMESPACE: &str = "csi-provisioner";
const CONTROLLER: &str = "csi-hostpath-controller";
const BUSYBOX: &str = "docker.io/library/busybox:1.35.0";

#[test]
fn real_node() {
    let Some(plane) = ControlPlane::shared(&Config::standard().with_scheduler(), TEST) else {
        return;
    };
    let Some(files) = NodeFiles::lookup(TEST) else {
        return;
    };
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        controlplane::skip(
            TEST,
            "no kubectl on PATH (`kubectl apply -k` applies deploy/)",
        );
        return;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = target_dir();
    let bed = target.join("real-node");
    let started = Instant::now();

    // deploy/kubernetes/snapshotter: the upstream csi-snapshotter in the
    // controller pod; the snapshot CRDs and snapshot-controller are the
    // cluster's (a host process here, as kube-controller-manager is).
    let (Some(snapshotter), Some(snapshot_controller), Some(crds)) = (
        plane.binaries().require("csi-snapshotter", TEST),
        plane.binaries().require("snapshot-controller", TEST),
        plane.binaries().require_dir("crd", TEST),
    ) else {
        return;
    };
    let images = build_images(
        workspace,
        &bed.join("oci"),
        &plane.binaries().path("csi-provisioner"),
        &snapshotter,
    );
    eprintln!("real node: images built in {:?}", started.elapsed());

    let node = Node::start(plane, &files, &target.join("k8s-node")).expect("the node starts");
    for image in &images {
        node.import_image(&image.archive).expect("image imported");
    }
    eprintln!(
        "real node: node started, images imported at {:?}",
        started.elapsed()
    );
    plane
        .start_snapshot_controller(&snapshot_controller, &crds)
        .expect("the snapshot CRDs and snapshot-controller");
    let http_port = controlplane::free_port().expect("a free port");
    let overlays = write_overlays(
        &bed, workspace, plane, &node, http_port, &images[2], &images[3],
    );

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = plane.admin_client().await.expect("admin client");
        wait_node_ready(&client, &node).await;
        eprintln!("real node: Ready at {:?}", started.elapsed());
        let flow = Instant::now();
        images_run_as_their_non_root_user(&client, &node, &images).await;
        eprintln!("real node: images ran in {:?}", flow.elapsed());
        let flow = Instant::now();
        the_kubelet_registers_the_driver(&client, &node).await;
        eprintln!(
            "real node: the kubelet registered csi-hostpath in {:?}",
            flow.elapsed()
        );
        for (overlay, sidecar) in [(&overlays.rust, &images[0]), (&overlays.go, &images[2])] {
            let flow = Instant::now();
            kubectl(plane, &["apply", "-k", &overlay.display().to_string()]);
            wait_deploy_running(&client, &node, &sidecar.reference, 1, &[]).await;
            eprintln!(
                "real node: deploy/ running with {} in {:?}",
                sidecar.reference,
                flow.elapsed()
            );
            if let Some(which) = e2e::full() {
                if !which.includes(sidecar.flow) {
                    continue;
                }
                // The whole upstream selection and its snapshot specs (or
                // those alone), the only flow of this mode.
                for &(what, focus, skip) in &which.runs {
                    let outcome = e2e::run(
                        plane,
                        &node,
                        workspace,
                        &bed.join(format!("e2e-full{what}-{}", sidecar.flow)),
                        focus,
                        skip,
                    );
                    eprintln!(
                        "real node: upstream storage e2e{what} with {}: {}",
                        sidecar.reference,
                        outcome.summary()
                    );
                    for (name, message) in &outcome.failed {
                        eprintln!("  FAILED {name}\n    {}", tail(message, 3));
                    }
                }
                continue;
            }
            let flow = Instant::now();
            claims_outlive_their_pods(&client, &node, sidecar).await;
            eprintln!(
                "real node: claims with {} in {:?}",
                sidecar.reference,
                flow.elapsed()
            );
            the_operator_view(http_port, sidecar).await;
            let flow = Instant::now();
            a_burst_outlives_the_sidecars_pod(&client, &node, sidecar).await;
            eprintln!(
                "real node: burst with {}'s pod deleted in {:?}",
                sidecar.reference,
                flow.elapsed()
            );
            if sidecar.flow == "rs" {
                // Ours only: the Go image's leader-election identity is the
                // hostname, the same for both replicas on the host network
                // (deploy/README.md), so both would lead.
                let flow = Instant::now();
                kubectl(
                    plane,
                    &["apply", "-k", &overlays.replicas.display().to_string()],
                );
                wait_deploy_running(&client, &node, &sidecar.reference, 2, &[]).await;
                two_replicas_hand_over_on_rollout_restart(&client, &node, plane, sidecar).await;
                eprintln!(
                    "real node: two replicas, rollout restart in {:?}",
                    flow.elapsed()
                );
                let flow = Instant::now();
                kubectl(plane, &["apply", "-k", &overlay.display().to_string()]);
                wait_deploy_running(&client, &node, &sidecar.reference, 1, &[]).await;
                the_pinned_upstream_specs_pass(plane, &node, workspace, &bed);
                eprintln!(
                    "real node: pinned upstream storage e2e specs in {:?}",
                    flow.elapsed()
                );
            }
        }
    });
    node.stop();
    eprintln!("real node: done in {:?}", started.elapsed());
}

/// The specs of `tests/e2e/pinned.txt` (they pass with the Go sidecar's
/// image, see deploy/README.md) pass with ours: each one ran and passed.
fn the_pinned_upstream_specs_pass(plane: &ControlPlane, node: &Node, workspace: &Path, bed: &Path) {
    let pinned = e2e::pinned(workspace);
    if pinned.is_empty() {
        // An empty focus would run the whole selection.
        eprintln!("real node: tests/e2e/pinned.txt pins no upstream e2e spec");
        return;
    }
    let outcome = e2e::run(
        plane,
        node,
        workspace,
        &bed.join("e2e-pinned"),
        &e2e::focus_of(&pinned),
        e2e::PINNED_SKIP,
    );
    eprintln!(
        "real node: pinned upstream storage e2e: {}",
        outcome.summary()
    );
    let not_passed: Vec<&String> = pinned
        .iter()
        .filter(|name| !outcome.passed.contains(name))
        .collect();
    assert!(
        not_passed.is_empty(),
        "pinned upstream e2e specs that did not pass: {not_passed:#?}\nfailures: {:#?}",
        outcome.failed
    );
}

/// The claims of one sidecar image (`sidecar`), provisioned by it in the
/// Deployment's pod: a filesystem and a block claim (Immediate) each written
/// by a pod, which is deleted, then read by a second pod; a
/// WaitForFirstConsumer claim provisioned once its pod is scheduled, on the
/// node the pod runs on. Deleting the claims deletes their PVs and the
/// driver's backend volumes.
async fn claims_outlive_their_pods(client: &kube::Client, node: &Node, sidecar: &Image) {
    let ns = format!("real-node-{}", sidecar.flow);
    let ns = ns.as_str();
    create_namespace(client, ns).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let fs = format!("{}-fs", sidecar.flow);
    let block = format!("{}-block", sidecar.flow);
    let wffc = format!("{}-wffc", sidecar.flow);
    for (name, class, mode) in [
        (&fs, "csi-hostpath-immediate", "Filesystem"),
        (&block, "csi-hostpath-immediate", "Block"),
        (&wffc, "csi-hostpath-wffc", "Filesystem"),
    ] {
        create_claim(&claims, name, class, mode).await;
    }
    let (fs_pv, block_pv) = tokio::join!(wait_bound(&claims, &fs), wait_bound(&claims, &block));

    let fs_text = format!("written by the first pod of {}", sidecar.flow);
    let block_text = format!("bytes of the first pod of {}", sidecar.flow);
    let (_, _, _) = tokio::join!(
        run_pod(
            client,
            node,
            ns,
            volume_pod(
                "fs-writer",
                &fs,
                false,
                &format!("echo '{fs_text}' > /data/file && sync")
            ),
        ),
        run_pod(
            client,
            node,
            ns,
            volume_pod(
                "block-writer",
                &block,
                true,
                &format!("printf '{block_text}' > /dev/data && sync"),
            ),
        ),
        // WaitForFirstConsumer: the scheduler picks the node, the sidecar
        // provisions for it, the kubelet mounts.
        run_pod(
            client,
            node,
            ns,
            volume_pod(
                "wffc",
                &wffc,
                false,
                "echo ok > /data/file && cat /data/file"
            ),
        ),
    );
    let wffc_pv = wait_bound(&claims, &wffc).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let ran_on = pods
        .get("wffc")
        .await
        .expect("the wffc pod")
        .spec
        .and_then(|s| s.node_name);
    assert_eq!(ran_on.as_deref(), Some(NODE_NAME));
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let affinity = pvs
        .get(&wffc_pv)
        .await
        .expect("the wffc PV")
        .spec
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    assert!(
        affinity.iter().any(|t| t
            .match_expressions
            .iter()
            .flatten()
            .any(|e| e.key == csi_hostpath::TOPOLOGY_KEY
                && e.values.iter().flatten().any(|v| v == NODE_NAME))),
        "the WaitForFirstConsumer volume was provisioned for the pod's node: {affinity:?}"
    );

    tokio::join!(
        delete_pod(client, ns, "fs-writer"),
        delete_pod(client, ns, "block-writer"),
        delete_pod(client, ns, "wffc"),
    );
    let (fs_read, block_read) = tokio::join!(
        run_pod(
            client,
            node,
            ns,
            volume_pod("fs-reader", &fs, false, "cat /data/file")
        ),
        run_pod(
            client,
            node,
            ns,
            volume_pod(
                "block-reader",
                &block,
                true,
                &format!("head -c {} /dev/data", block_text.len()),
            ),
        ),
    );
    assert_eq!(
        fs_read.trim(),
        fs_text,
        "the second pod reads the first pod's file"
    );
    assert_eq!(
        block_read, block_text,
        "the second pod reads the first pod's bytes"
    );
    tokio::join!(
        delete_pod(client, ns, "fs-reader"),
        delete_pod(client, ns, "block-reader"),
    );

    let pv_names = [fs_pv, block_pv, wffc_pv];
    for pv in &pv_names {
        let provisioner = pvs
            .get(pv)
            .await
            .expect("the PV")
            .metadata
            .annotations
            .and_then(|a| a.get("pv.kubernetes.io/provisioned-by").cloned());
        assert_eq!(provisioner.as_deref(), Some(DRIVER), "{pv}");
    }
    let log = sidecar_log(client).await;
    for claim in [&fs, &block, &wffc] {
        assert!(
            log.contains(claim.as_str()),
            "the sidecar in its pod ({}) provisioned {claim}; its log:\n{}",
            sidecar.reference,
            tail(&log, 40)
        );
    }

    let left = delete_claims(client, node, &claims, &[&fs, &block, &wffc], &pv_names).await;
    let driver_logs = container_logs(client, "hostpath").await;
    assert!(
        left.is_empty(),
        "no backend volume left: {left:?}\n{driver_logs}"
    );
    // How often the kubelet unpublished after the volume was deleted (the
    // node plugin's path for it, see docs/design.md), counted in the node
    // plugin's log since it started: for the record.
    eprintln!(
        "real node: {} unpublish(es) of an already deleted volume so far, after the flow of {}",
        driver_logs
            .matches("unpublishing a volume the controller side deleted meanwhile")
            .count(),
        sidecar.reference
    );
}

/// Claims made in a burst while the sidecar's pod is deleted (as `kubectl
/// delete pod` does, with its grace period): the Deployment's new pod
/// finishes the work. Every claim ends Bound with exactly one backend
/// volume (none provisioned twice, none lost), and deleting the claims
/// leaves nothing behind.
async fn a_burst_outlives_the_sidecars_pod(client: &kube::Client, node: &Node, sidecar: &Image) {
    const BURST: usize = 8;
    let ns = format!("real-node-burst-{}", sidecar.flow);
    let ns = ns.as_str();
    create_namespace(client, ns).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = (0..BURST).map(|i| format!("burst-{i}")).collect();
    for name in &names {
        create_claim(&claims, name, "csi-hostpath-immediate", "Filesystem").await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), DEPLOY_NAMESPACE);
    let controller = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={CONTROLLER}")))
        .await
        .expect("the controller pods");
    let bound_before = claims
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .count()
        })
        .unwrap_or_default();
    eprintln!(
        "real node: {bound_before} of {BURST} claims bound when {}'s pod is deleted",
        sidecar.reference
    );
    for pod in controller.items {
        let name = pod.metadata.name.unwrap_or_default();
        pods.delete(&name, &DeleteParams::default())
            .await
            .expect("delete the sidecar's pod");
    }
    let mut pv_names = Vec::new();
    for name in &names {
        pv_names.push(wait_bound(&claims, name).await);
    }
    wait_deploy_running(client, node, &sidecar.reference, 1, &[]).await;
    assert_one_backend_volume_per_pv(node, &pv_names, &sidecar.reference);
    let left = delete_claims(client, node, &claims, &names, &pv_names).await;
    assert!(left.is_empty(), "no backend volume left: {left:?}");
}

/// Two replicas of the sidecar, one leading; `kubectl rollout restart`
/// replaces both (the strategy is Recreate, see deploy/README.md) while a
/// burst of claims is being provisioned. The Lease passes to a new
/// replica (another holder identity), every claim ends Bound with exactly
/// one backend volume (none provisioned twice), and deleting the claims
/// leaves nothing behind.
async fn two_replicas_hand_over_on_rollout_restart(
    client: &kube::Client,
    node: &Node,
    plane: &ControlPlane,
    sidecar: &Image,
) {
    use k8s_openapi::api::coordination::v1::Lease;
    const BURST: usize = 8;
    let leases: Api<Lease> = Api::namespaced(client.clone(), DEPLOY_NAMESPACE);
    let holder = || async {
        leases
            .get_opt("hostpath-csi-k8s-io")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    let before = wait_for(WAIT, "a replica to hold the Lease", holder).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), DEPLOY_NAMESPACE);
    let old: Vec<String> = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={CONTROLLER}")))
        .await
        .expect("the controller pods")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let ns = "real-node-replicas";
    create_namespace(client, ns).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = (0..BURST).map(|i| format!("restart-{i}")).collect();
    for name in &names {
        create_claim(&claims, name, "csi-hostpath-immediate", "Filesystem").await;
    }
    kubectl(
        plane,
        &[
            "rollout",
            "restart",
            &format!("deployment/{CONTROLLER}"),
            "-n",
            DEPLOY_NAMESPACE,
        ],
    );
    let mut pv_names = Vec::new();
    for name in &names {
        pv_names.push(wait_bound(&claims, name).await);
    }
    wait_deploy_running(client, node, &sidecar.reference, 2, &old).await;
    let after = wait_for(WAIT, "a new replica to hold the Lease", || async {
        holder().await.filter(|h| *h != before)
    })
    .await;
    eprintln!("real node: the Lease went from {before} to {after}");
    assert_one_backend_volume_per_pv(node, &pv_names, "two replicas");
    let left = delete_claims(client, node, &claims, &names, &pv_names).await;
    assert!(left.is_empty(), "no backend volume left: {left:?}");
}

/// The driver's backend volumes are exactly the PVs `pv_names` (a volume
/// is named as its PV): none provisioned twice, none lost.
fn assert_one_backend_volume_per_pv(node: &Node, pv_names: &[String], what: &str) {
    let records = csi_hostpath::backend_volumes(&node.state_dir().join("csi-hostpath-data"))
        .expect("the driver's records");
    let mut backend: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
    backend.sort_unstable();
    let mut bound: Vec<&str> = pv_names.iter().map(String::as_str).collect();
    bound.sort_unstable();
    assert_eq!(
        backend, bound,
        "one backend volume per claim, named as its PV ({what})"
    );
}

/// Creates claim `name` of `class` and volume `mode` (16 MiB, RWO).
async fn create_claim(claims: &Api<PersistentVolumeClaim>, name: &str, class: &str, mode: &str) {
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "volumeMode": mode,
                    "resources": {"requests": {"storage": "16Mi"}},
                },
            }))
            .expect("claim"),
        )
        .await
        .expect("create the claim");
}

/// Deletes the claims `names`, waits until their PVs `pv_names` are gone
/// (deleted by the sidecar after DeleteVolume) and returns the driver's
/// backend volumes left.
async fn delete_claims(
    client: &kube::Client,
    node: &Node,
    claims: &Api<PersistentVolumeClaim>,
    names: &[impl AsRef<str>],
    pv_names: &[String],
) -> Vec<csi_hostpath::VolumeRecord> {
    for name in names {
        claims
            .delete(name.as_ref(), &DeleteParams::default())
            .await
            .expect("delete the claim");
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for pv in pv_names {
        wait_for(WAIT, "the PV to be deleted", || async {
            pvs.get_opt(pv).await.ok()?.is_none().then_some(())
        })
        .await;
    }
    csi_hostpath::backend_volumes(&node.state_dir().join("csi-hostpath-data"))
        .expect("the driver's records")
}

/// What an operator reads from the sidecar in its pod, after the claims
/// of [`claims_outlive_their_pods`] (its log, read through the kubelet,
/// was checked there): the leader-election health check, and in
/// `/metrics` the CreateVolume and DeleteVolume calls of those claims
/// (three each, counted by the pod that made them). Ours also answers
/// `/healthz` and `/readyz`, which the Go image does not serve. The pod is
/// on the host network, so its `--http-endpoint` is the host's.
async fn the_operator_view(http_port: u16, sidecar: &Image) {
    let image = &sidecar.reference;
    let mut paths = vec!["/healthz/leader-election"];
    if sidecar.flow == "rs" {
        paths.extend(["/healthz", "/readyz"]);
    }
    for path in paths {
        let (status, body) = support::http_get(http_port, path).await;
        assert_eq!(status, 200, "{image}: GET {path}: {body}");
    }
    let (status, metrics) = support::http_get(http_port, "/metrics").await;
    assert_eq!(status, 200, "{image}: GET /metrics");
    for method in ["CreateVolume", "DeleteVolume"] {
        let calls: f64 = metrics
            .lines()
            .filter(|l| {
                l.starts_with("csi_sidecar_operations_seconds_count{")
                    && l.contains(&format!("driver_name=\"{DRIVER}\""))
                    && l.contains("grpc_status_code=\"OK\"")
                    && l.contains(&format!("method_name=\"/csi.v1.Controller/{method}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(
            calls >= 3.0,
            "{image}: /metrics counts {calls} successful {method} calls, not 3:\n{}",
            metrics
                .lines()
                .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

async fn wait_bound(claims: &Api<PersistentVolumeClaim>, name: &str) -> String {
    wait_for(WAIT, &format!("claim {name} to be bound"), || async {
        let claim = claims.get(name).await.ok()?;
        let bound = claim.status.as_ref()?.phase.as_deref() == Some("Bound");
        bound.then(|| claim.spec?.volume_name).flatten()
    })
    .await
}

/// A busybox pod running `script` with `claim` at /data (a filesystem
/// claim) or as the device /dev/data (`block`).
fn volume_pod(name: &str, claim: &str, block: bool, script: &str) -> serde_json::Value {
    let mut container = json!({
        "name": "busybox",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    });
    if block {
        container["volumeDevices"] = json!([{"name": "data", "devicePath": "/dev/data"}]);
    } else {
        container["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    })
}

/// The csi-provisioner container's log in the controller pod(s).
async fn sidecar_log(client: &kube::Client) -> String {
    container_logs(client, "csi-provisioner").await
}

/// The logs of the containers named `container` in the pods of deploy/
/// (the controller's, and for `hostpath` the node plugin's), each headed by
/// its pod's name.
async fn container_logs(client: &kube::Client, container: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), DEPLOY_NAMESPACE);
    let list = pods
        .list(&ListParams::default())
        .await
        .expect("the pods of deploy/");
    let mut out = String::new();
    for pod in list.items {
        let name = pod.metadata.name.unwrap_or_default();
        let params = LogParams {
            container: Some(container.to_owned()),
            ..LogParams::default()
        };
        if let Ok(log) = pods.logs(&name, &params).await {
            out.push_str(&format!("--- {name}/{container}\n{log}"));
        }
    }
    out
}

/// `replicas` controller pods, running `sidecar` and ready (a rollout done:
/// no other pod left, none of `gone` among them), the node DaemonSet's pod
/// ready and the driver on the node's CSINode (registered by the node
/// plugin itself).
async fn wait_deploy_running(
    client: &kube::Client,
    node: &Node,
    sidecar: &str,
    replicas: usize,
    gone: &[String],
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), DEPLOY_NAMESPACE);
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), DEPLOY_NAMESPACE);
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let deadline = Instant::now() + WAIT;
    loop {
        let controller = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={CONTROLLER}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let controller_ready = controller.len() == replicas
            && controller.iter().all(|p| {
                let old = p.metadata.name.as_ref().is_some_and(|n| gone.contains(n));
                let runs_sidecar = p.spec.as_ref().is_some_and(|s| {
                    s.containers
                        .iter()
                        .any(|c| c.name == "csi-provisioner" && c.image.as_deref() == Some(sidecar))
                });
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                runs_sidecar && ready && !old && p.metadata.deletion_timestamp.is_none()
            });
        let daemonset_ready = daemonsets
            .get_opt("csi-hostpath-node")
            .await
            .ok()
            .flatten()
            .and_then(|d| d.status)
            .is_some_and(|s| s.number_ready >= 1);
        let registered = csinodes
            .get_opt(NODE_NAME)
            .await
            .ok()
            .flatten()
            .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == DRIVER));
        if controller_ready && daemonset_ready && registered {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "deploy/ not running within {WAIT:?} ({replicas} ready controller pod(s) with {sidecar}: \
             {controller_ready}, DaemonSet ready: {daemonset_ready}, driver on the CSINode: \
             {registered})\nevents: {}\nkubelet:\n{}",
            events(client, DEPLOY_NAMESPACE).await,
            node.log_tail("kubelet", 60)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The overlays of this test bed: `rust` applies deploy/ with the
/// node-plugin component and this host's changes; `go` is `rust` with the
/// Go sidecar's image and the two changes that image needs.
struct Overlays {
    rust: PathBuf,
    go: PathBuf,
    /// `rust` with two replicas and no HTTP endpoint (on the host network
    /// the two would want the same port).
    replicas: PathBuf,
}

fn write_overlays(
    bed: &Path,
    workspace: &Path,
    plane: &ControlPlane,
    node: &Node,
    http_port: u16,
    go_image: &Image,
    snapshotter: &Image,
) -> Overlays {
    let rust = bed.join("overlay");
    let go = bed.join("overlay-go");
    std::fs::create_dir_all(&rust).expect("overlay folder");
    std::fs::create_dir_all(&go).expect("overlay folder");
    let deploy = support::render::relative(&rust, &workspace.join("deploy/kubernetes"));
    let root = node.kubelet_root();
    let root = root.display();
    let data = node.state_dir().join("csi-hostpath-data");
    let data = data.display();
    let api_port = plane
        .server
        .rsplit(':')
        .next()
        .expect("the API server URL has a port");
    let (snapshotter_name, snapshotter_tag) = snapshotter
        .reference
        .rsplit_once(':')
        .expect("the csi-snapshotter image has a tag");
    let text = format!(
        r#"# Written by tests/parity/real_node.rs: deploy/ on this host's real node
# (deploy/README.md lists these changes and why).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {deploy}
components:
  - {deploy}/node-plugin
  - {deploy}/snapshotter
images:
  - name: registry.k8s.io/sig-storage/csi-snapshotter
    newName: {snapshotter_name}
    newTag: {snapshotter_tag}
patches:
  - target:
      kind: Deployment
      name: {CONTROLLER}
    patch: |-
      - op: add
        path: /spec/template/spec/hostNetwork
        value: true
      - op: add
        path: /spec/strategy
        value: {{type: Recreate}}
      - op: test
        path: /spec/template/spec/containers/0/name
        value: csi-provisioner
      - op: replace
        path: /spec/template/spec/containers/0/imagePullPolicy
        value: Never
      - op: replace
        path: /spec/template/spec/containers/1/imagePullPolicy
        value: Never
      - op: test
        path: /spec/template/spec/containers/2/name
        value: csi-snapshotter
      - op: replace
        path: /spec/template/spec/containers/2/imagePullPolicy
        value: Never
      - op: add
        path: /spec/template/spec/containers/2/env
        value:
          - {{name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}}
          - {{name: KUBERNETES_SERVICE_PORT, value: "{api_port}"}}
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {{name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}}
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {{name: KUBERNETES_SERVICE_PORT, value: "{api_port}"}}
      - op: test
        path: /spec/template/spec/containers/0/args/2
        value: --http-endpoint=:8080
      - op: replace
        path: /spec/template/spec/containers/0/args/2
        value: --http-endpoint=:{http_port}
      - op: replace
        path: /spec/template/spec/containers/0/ports/0/containerPort
        value: {http_port}
      - op: test
        path: /spec/template/spec/volumes/1/name
        value: csi-data-dir
      - op: replace
        path: /spec/template/spec/volumes/1/hostPath/path
        value: {data}
  - target:
      kind: DaemonSet
      name: csi-hostpath-node
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/imagePullPolicy
        value: Never
      - op: test
        path: /spec/template/spec/containers/0/args/3
        value: --kubelet-registration-path=/var/lib/kubelet/plugins/{DRIVER}/csi.sock
      - op: replace
        path: /spec/template/spec/containers/0/args/3
        value: --kubelet-registration-path={root}/plugins/{DRIVER}/csi.sock
      - op: test
        path: /spec/template/spec/containers/0/volumeMounts/2/mountPath
        value: /var/lib/kubelet/pods
      - op: replace
        path: /spec/template/spec/containers/0/volumeMounts/2/mountPath
        value: {root}/pods
      - op: test
        path: /spec/template/spec/containers/0/volumeMounts/3/mountPath
        value: /var/lib/kubelet/plugins
      - op: replace
        path: /spec/template/spec/containers/0/volumeMounts/3/mountPath
        value: {root}/plugins
      - op: replace
        path: /spec/template/spec/volumes/0/hostPath/path
        value: {root}/plugins/{DRIVER}
      - op: replace
        path: /spec/template/spec/volumes/1/hostPath/path
        value: {root}/plugins_registry
      - op: replace
        path: /spec/template/spec/volumes/2/hostPath/path
        value: {root}/pods
      - op: replace
        path: /spec/template/spec/volumes/3/hostPath/path
        value: {root}/plugins
      - op: test
        path: /spec/template/spec/volumes/4/name
        value: csi-data-dir
      - op: replace
        path: /spec/template/spec/volumes/4/hostPath/path
        value: {data}
"#,
        deploy = deploy.display(),
    );
    std::fs::write(rust.join("kustomization.yaml"), text).expect("write the overlay");
    let (go_name, go_tag) = go_image
        .reference
        .rsplit_once(':')
        .expect("the Go image has a tag");
    let text = format!(
        r#"# Written by tests/parity/real_node.rs: ../overlay with the Go sidecar's image
# (the baseline). The Go image has no --controller-id (the base passes it for
# the PVReleaser and PodPVCProvisioner gates of ours), serves no /readyz and
# updates claims where ours patches them.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../overlay
images:
  - name: ghcr.io/csi-provisioner-rs/csi-provisioner
    newName: {go_name}
    newTag: {go_tag}
patches:
  - target:
      kind: Deployment
      name: {CONTROLLER}
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/args/4
        value: --controller-id=$(CONTROLLER_ID)
      - op: remove
        path: /spec/template/spec/containers/0/args/4
      - op: replace
        path: /spec/template/spec/containers/0/readinessProbe/httpGet/path
        value: /healthz/leader-election
  # The Go image puts the clone-protection finalizer on a clone's source
  # claim with an update (ours patches): without this verb its clones stay
  # Pending (the upstream e2e suite's "pvc data source" specs, tests/e2e).
  - target:
      kind: ClusterRole
      name: csi-provisioner-runner
    patch: |-
      - op: test
        path: /rules/1/resources/0
        value: persistentvolumeclaims
      - op: add
        path: /rules/1/verbs/-
        value: update
"#
    );
    std::fs::write(go.join("kustomization.yaml"), text).expect("write the Go overlay");
    let replicas = bed.join("overlay-replicas");
    std::fs::create_dir_all(&replicas).expect("overlay folder");
    let text = format!(
        r#"# Written by tests/parity/real_node.rs: ../overlay with two replicas of the
# controller. On the host network both would bind --http-endpoint's port, so
# neither has the endpoint, nor the ports and probes that use it; and both
# csi-snapshotters would have the hostname as their leader-election
# identity, so both would lead: the flow takes no snapshot, and they go.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../overlay
patches:
  - target:
      kind: Deployment
      name: {CONTROLLER}
    patch: |-
      - op: replace
        path: /spec/replicas
        value: 2
      - op: test
        path: /spec/template/spec/containers/0/args/2
        value: --http-endpoint=:{http_port}
      - op: remove
        path: /spec/template/spec/containers/0/args/2
      - op: remove
        path: /spec/template/spec/containers/0/ports
      - op: remove
        path: /spec/template/spec/containers/0/livenessProbe
      - op: remove
        path: /spec/template/spec/containers/0/readinessProbe
      - op: test
        path: /spec/template/spec/containers/2/name
        value: csi-snapshotter
      - op: remove
        path: /spec/template/spec/containers/2
"#
    );
    std::fs::write(replicas.join("kustomization.yaml"), text).expect("write the replicas overlay");
    Overlays { rust, go, replicas }
}

fn kubectl(plane: &ControlPlane, args: &[&str]) {
    let out = Command::new("kubectl")
        .arg(format!(
            "--kubeconfig={}",
            plane.admin_kubeconfig().display()
        ))
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An image archive and what its binary prints for `--version`.
struct Image {
    archive: PathBuf,
    reference: String,
    version_line: String,
    /// Names the objects of the flow that runs this image as the sidecar.
    flow: &'static str,
}

/// Each image runs `--version` in a pod that asks for `runAsNonRoot` and
/// names no user: the kubelet starts it only when the image's user is a
/// non-root uid, and the binary runs only when the image has its loader and
/// libraries.
async fn images_run_as_their_non_root_user(client: &kube::Client, node: &Node, images: &[Image]) {
    let ns = "real-node-images";
    create_namespace(client, ns).await;
    for (i, image) in images.iter().enumerate() {
        let name = format!("version-{i}");
        let log = run_pod(
            client,
            node,
            ns,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": true},
                    "containers": [{
                        "name": "image",
                        "image": image.reference,
                        "imagePullPolicy": "Never",
                        "args": ["--version"],
                    }],
                },
            }),
        )
        .await;
        assert_eq!(
            log.trim(),
            image.version_line,
            "{}: `--version` in its pod",
            image.reference
        );
        delete_pod(client, ns, &name).await;
    }
}

/// `csi-hostpath` as a host process registers with the kubelet's plugin
/// registry by itself: the kubelet's plugin watcher dials its registration
/// socket (naming the socket's escaped path as `:authority`, which the
/// driver's src/authority.rs rewrites), calls `GetInfo`, registers the
/// driver (its `NodeGetInfo`, the CSINode entry) and reports success. When
/// the driver stops, its registration socket goes and the kubelet drops the
/// driver from the CSINode.
async fn the_kubelet_registers_the_driver(client: &kube::Client, node: &Node) {
    use k8s_openapi::api::storage::v1::CSINode;
    const DRIVER: &str = "registration.hostpath.csi.k8s.io";
    let root = node.kubelet_root();
    let endpoint = root.join(format!("plugins/{DRIVER}/csi.sock"));
    let state = tempfile::tempdir().expect("state dir");
    let log = node.state_dir().join("logs/csi-hostpath-registration.log");
    let mut command = Command::new(support::driver_binary());
    command
        .arg(format!("--endpoint=unix://{}", endpoint.display()))
        .arg(format!("--drivername={DRIVER}"))
        .arg(format!("--nodeid={NODE_NAME}"))
        .arg(format!("--statedir={}", state.path().display()))
        .arg(format!(
            "--kubelet-registration-path={}",
            endpoint.display()
        ))
        .arg(format!(
            "--plugin-registration-path={}",
            root.join("plugins_registry").display()
        ))
        .arg("--v=5");
    let mut driver = controlplane::GuardedChild::spawn("csi-hostpath", command, &log)
        .expect("start csi-hostpath");
    let nodes: Api<CSINode> = Api::all(client.clone());
    let lists_driver = |csinode: Option<CSINode>| {
        csinode
            .and_then(|n| n.spec.drivers.into_iter().find(|d| d.name == DRIVER))
            .map(|d| d.node_id)
    };
    let registered = Instant::now() + Duration::from_secs(60);
    let node_id = loop {
        if let Some(id) = lists_driver(nodes.get_opt(NODE_NAME).await.ok().flatten()) {
            break id;
        }
        assert!(
            Instant::now() < registered && driver.is_running(),
            "the kubelet did not register {DRIVER} within 60 s\ndriver:\n{}\nkubelet:\n{}",
            tail(&std::fs::read_to_string(&log).unwrap_or_default(), 40),
            node.log_tail("kubelet", 40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(node_id, NODE_NAME, "the CSINode entry has NodeGetInfo's id");
    // The kubelet writes the CSINode entry inside its CSI plugin handler's
    // RegisterPlugin and calls NotifyRegistrationStatus only after it
    // returns (its plugin manager's operation generator), so the driver may
    // hear of the registration a moment after the CSINode shows it (CI saw
    // the log read between the two).
    let notified = Instant::now() + Duration::from_secs(30);
    loop {
        let driver_log = std::fs::read_to_string(&log).unwrap_or_default();
        if driver_log.contains("registered with the kubelet") {
            break;
        }
        assert!(
            Instant::now() < notified && driver.is_running(),
            "the kubelet reported the registration to the driver within 30 s of the CSINode entry:\n{}",
            tail(&driver_log, 40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kubelet_log =
        std::fs::read_to_string(node.state_dir().join("logs/kubelet.log")).unwrap_or_default();
    let errors: Vec<&str> = kubelet_log
        .lines()
        .filter(|l| l.contains(DRIVER) && (l.starts_with('E') || l.contains("failed")))
        .collect();
    assert!(
        errors.is_empty(),
        "kubelet errors about {DRIVER}: {errors:#?}"
    );

    let status = driver.stop(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "csi-hostpath stops cleanly on SIGTERM: {status:?}"
    );
    wait_for(WAIT, "the kubelet to deregister the driver", || async {
        let csinode = nodes.get_opt(NODE_NAME).await.ok()?;
        lists_driver(csinode).is_none().then_some(())
    })
    .await;
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `pod` to completion; returns its log (read through the kubelet).
async fn run_pod(client: &kube::Client, node: &Node, ns: &str, pod: serde_json::Value) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let name = pod["metadata"]["name"]
        .as_str()
        .expect("the pod has a name")
        .to_owned();
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).expect("pod"),
    )
    .await
    .expect("create the pod");
    let deadline = Instant::now() + WAIT;
    loop {
        let pod = pods.get(&name).await.expect("the pod");
        match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => break,
            Some("Failed") => panic!(
                "pod {ns}/{name} failed: {:?}\nlog: {}",
                pod.status,
                pods.logs(&name, &LogParams::default())
                    .await
                    .unwrap_or_default()
            ),
            _ if Instant::now() > deadline => panic!(
                "pod {ns}/{name} did not finish within {WAIT:?}: {:?}\nevents: {}\nkubelet:\n{}",
                pod.status,
                events(client, ns).await,
                node.log_tail("kubelet", 40)
            ),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    pods.logs(&name, &LogParams::default())
        .await
        .expect("the pod's log through the kubelet")
}

async fn delete_pod(client: &kube::Client, ns: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("delete the pod");
    wait_for(
        WAIT,
        "the pod to be gone (its volume unmounted)",
        || async { pods.get_opt(name).await.ok()?.is_none().then_some(()) },
    )
    .await;
}

async fn create_namespace(client: &kube::Client, ns: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .expect("namespace"),
        )
        .await
        .expect("create the namespace");
    // Pods need the namespace's default ServiceAccount (the
    // controller-manager makes it).
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), ns);
    wait_for(WAIT, "the default ServiceAccount", || async {
        accounts.get_opt("default").await.ok()?.map(|_| ())
    })
    .await;
}

async fn events(client: &kube::Client, ns: &str) -> String {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    match events.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .map(|e| {
                format!(
                    "{}/{}: {} {}",
                    e.involved_object.kind.as_deref().unwrap_or(""),
                    e.involved_object.name.as_deref().unwrap_or(""),
                    e.reason.as_deref().unwrap_or(""),
                    e.message.as_deref().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(events: {e})"),
    }
}

async fn wait_node_ready(client: &kube::Client, node: &Node) {
    let nodes: Api<NodeObject> = Api::all(client.clone());
    let deadline = Instant::now() + WAIT;
    loop {
        let ready = nodes
            .get_opt(NODE_NAME)
            .await
            .ok()
            .flatten()
            .is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {NODE_NAME} not Ready within {WAIT:?}; kubelet:\n{}",
            node.log_tail("kubelet", 40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "waited {timeout:?} for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `deploy/images/build-oci.sh` into `out`, from the binaries this test
/// was built with (the release build would add minutes to CI for nothing a
/// pod can tell), with the Go sidecar's image beside ours.
fn build_images(
    workspace: &Path,
    out: &Path,
    go_provisioner: &Path,
    go_snapshotter: &Path,
) -> Vec<Image> {
    let driver = support::driver_binary();
    let bin_dir = driver
        .parent()
        .expect("csi-hostpath is in target/<profile>");
    // `cargo test --test parity real_node` builds this package's binaries, not
    // csi-hostpath's (another package): without this build a csi-hostpath
    // left from an older source goes into the image (it did, once, here).
    // A no-op when it is current, e.g. under `cargo test --workspace`.
    support::build_driver(bin_dir);
    assert_eq!(
        Some(bin_dir),
        Path::new(env!("CARGO_BIN_EXE_csi-provisioner")).parent(),
        "csi-provisioner and csi-hostpath of the same profile"
    );
    let status = Command::new(workspace.join("deploy/images/build-oci.sh"))
        .arg("--out")
        .arg(out)
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--go-provisioner")
        .arg(go_provisioner)
        .arg("--go-snapshotter")
        .arg(go_snapshotter)
        .status()
        .expect("run deploy/images/build-oci.sh");
    assert!(
        status.success(),
        "deploy/images/build-oci.sh failed: {status}"
    );
    let version = env!("CARGO_PKG_VERSION");
    // Ours prints its build's version (build.rs), which is not the tag.
    let ours = printed_version(&bin_dir.join("csi-provisioner"));
    let go_tag = printed_version(go_provisioner);
    let snapshotter_tag = printed_version(go_snapshotter);
    vec![
        Image {
            archive: out.join("csi-provisioner.tar"),
            reference: format!("ghcr.io/csi-provisioner-rs/csi-provisioner:v{version}"),
            // As the Go image, its argv[0]: the image's entrypoint.
            version_line: format!("/csi-provisioner {ours}"),
            flow: "rs",
        },
        Image {
            archive: out.join("csi-hostpath.tar"),
            reference: format!("ghcr.io/csi-provisioner-rs/csi-hostpath:v{version}"),
            version_line: format!("csi-hostpath {version}"),
            flow: "driver",
        },
        Image {
            archive: out.join("csi-provisioner-go.tar"),
            reference: format!("localhost/csi-provisioner-go:{go_tag}"),
            // The Go binary prints its argv[0]: the image's entrypoint.
            version_line: format!("/csi-provisioner {go_tag}"),
            flow: "go",
        },
        Image {
            archive: out.join("csi-snapshotter.tar"),
            reference: format!("localhost/csi-snapshotter:{snapshotter_tag}"),
            version_line: format!("/csi-snapshotter {snapshotter_tag}"),
            flow: "snapshotter",
        },
    ]
}

/// The version a sidecar binary prints (`<argv[0]> <version>`), which
/// `build-oci.sh` tags a Go image with: all after argv[0] (ours is
/// `v0.1.0 (git 3dd1527)`, the Go image's one word).
fn printed_version(binary: &Path) -> String {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{} --version: {e}", binary.display()));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("{} --version: no `<name> <version>`", binary.display()))
        .1
        .to_owned()
}

/// The target folder this test binary was built in
/// (`<target>/debug/deps/real_node-*`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("the test binary is in <target>/<profile>/deps")
        .to_path_buf()
}
