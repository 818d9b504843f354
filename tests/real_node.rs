//! On a real node (issue 34): the images `deploy/images/build-oci.sh`
//! builds without Docker are imported into the node's containerd and run in
//! pods as the kubelet runs them: the entrypoint is the binary, its shared
//! libraries are in the image, and the image's user (65532) satisfies
//! `runAsNonRoot` without a `runAsUser` (the kubelet checks the image's
//! numeric user). The pods' logs are read through the kubelet, as `kubectl
//! logs` does (the API server's kubelet client certificate). `csi-hostpath`
//! registers with the kubelet's plugin registry by itself (its CSINode
//! entry appears, and goes when it stops).
//!
//! The node is `../shared/k8s/node` (see its README.md and
//! `tests/controlplane/src/node.rs`): without it (or without root) the test
//! prints a SKIPPED line; with `CI` set it fails instead. Only one node can
//! run on a host, so every real-node flow is a step of the one test below,
//! not a test of its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use controlplane::node::{NODE_NAME, Node, NodeFiles};
use controlplane::{Config, ControlPlane};
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::json;

mod support;

const TEST: &str = "real_node";
const WAIT: Duration = Duration::from_secs(180);

#[test]
fn real_node() {
    let Some(plane) = ControlPlane::shared(&Config::standard().with_scheduler(), TEST) else {
        return;
    };
    let Some(files) = NodeFiles::lookup(TEST) else {
        return;
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = target_dir();
    let started = Instant::now();

    let images = build_images(
        workspace,
        &target.join("real-node/oci"),
        &plane.binaries().path("csi-provisioner"),
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
    });
    node.stop();
    eprintln!("real node: done in {:?}", started.elapsed());
}

/// An image archive and what its binary prints for `--version`.
struct Image {
    archive: PathBuf,
    reference: String,
    version_line: String,
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
    let driver_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        driver_log.contains("registered with the kubelet"),
        "the kubelet reported the registration to the driver:\n{}",
        tail(&driver_log, 40)
    );
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
fn build_images(workspace: &Path, out: &Path, go_provisioner: &Path) -> Vec<Image> {
    let driver = support::driver_binary();
    let bin_dir = driver
        .parent()
        .expect("csi-hostpath is in target/<profile>");
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
        .status()
        .expect("run deploy/images/build-oci.sh");
    assert!(
        status.success(),
        "deploy/images/build-oci.sh failed: {status}"
    );
    let version = env!("CARGO_PKG_VERSION");
    let go_version = Command::new(go_provisioner)
        .arg("--version")
        .output()
        .expect("the Go csi-provisioner's version");
    let go_version = String::from_utf8_lossy(&go_version.stdout)
        .trim()
        .to_owned();
    let go_tag = go_version
        .split_whitespace()
        .nth(1)
        .expect("`csi-provisioner <version>`")
        .to_owned();
    vec![
        Image {
            archive: out.join("csi-provisioner.tar"),
            reference: format!("ghcr.io/csi-provisioner-rs/csi-provisioner:v{version}"),
            version_line: format!("csi-provisioner {version}"),
        },
        Image {
            archive: out.join("csi-hostpath.tar"),
            reference: format!("ghcr.io/csi-provisioner-rs/csi-hostpath:v{version}"),
            version_line: format!("csi-hostpath {version}"),
        },
        Image {
            archive: out.join("csi-provisioner-go.tar"),
            reference: format!("localhost/csi-provisioner-go:{go_tag}"),
            // The Go binary prints its argv[0]: the image's entrypoint.
            version_line: format!("/csi-provisioner {go_tag}"),
        },
    ]
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
