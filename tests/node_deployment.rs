//! End-to-end: `--node-deployment`. Two nodes, each with its own hostpath
//! driver (own socket and state directory, node id = node name, topology
//! on) and its own sidecar process (`NODE_NAME`), against one API test
//! server holding both Nodes and CSINodes.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use controlplane::GuardedChild;
use csi_hostpath::faults::{self, Fault, Faults};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use kube_testserver::{HttpServer, TestServer};
use serde_json::json;
use support::{Launch, SELECTED_NODE};

const DRIVER: &str = csi_hostpath::DEFAULT_DRIVER_NAME;
const NODES: [&str; 2] = ["node-a", "node-b"];

struct NodeSide {
    name: &'static str,
    /// Killed when dropped.
    sidecar: Option<GuardedChild>,
    /// Told to stop when dropped.
    _served: csi_hostpath::InProcess,
    driver: csi_hostpath::Config,
    log: PathBuf,
}

impl NodeSide {
    /// Its sidecar in node deployment, in `default`.
    fn launch(&self, kubeconfig: &Path) -> Launch {
        Launch::new(&self.driver.endpoint, kubeconfig, "default").args(["--node-deployment"])
    }
}

struct Cluster {
    /// First: the sidecars and drivers go before the API server and
    /// their directory.
    nodes: Vec<NodeSide>,
    /// Holds the drivers' sockets and state directories and the logs.
    _dir: tempfile::TempDir,
    api: TestServer,
    http: HttpServer,
    client: kube::Client,
}

impl Cluster {
    /// API server, both Nodes/CSINodes and both drivers; no sidecar yet.
    /// `capacity` limits a node's driver: (node, kind, bytes).
    async fn new(capacity: &[(&str, &str, u64)]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let api = TestServer::builder()
            .controller_manager(true)
            .gc(true)
            .build();
        let http = api.serve_http().await.expect("http");
        let client = api.client();
        let mut nodes = Vec::new();
        for name in NODES {
            api.create_object(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {csi_hostpath::TOPOLOGY_KEY: name}}}))
                .expect("node");
            api.create_object(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": name},
                "spec": {"drivers": [{"name": DRIVER, "nodeID": name,
                    "topologyKeys": [csi_hostpath::TOPOLOGY_KEY]}]}}))
                .expect("csinode");
            let node_dir = dir.path().join(name);
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let mut driver = csi_hostpath::Config::for_tests(&node_dir);
            driver.node_id = name.to_owned();
            driver.capacity = capacity
                .iter()
                .filter(|(node, _, _)| *node == name)
                .map(|(_, kind, bytes)| ((*kind).to_owned(), *bytes))
                .collect::<BTreeMap<_, _>>();
            nodes.push(NodeSide {
                name,
                sidecar: None,
                _served: csi_hostpath::InProcess::spawn(driver.clone()),
                driver,
                log: node_dir.join("sidecar.log"),
            });
        }
        Cluster {
            _dir: dir,
            api,
            http,
            client,
            nodes,
        }
    }

    /// One sidecar per node, in node mode with short delays, plus `extra`.
    fn start_sidecars(&mut self, extra: &[&str]) {
        self.start_sidecars_with_delays("100ms", "500ms", extra);
    }

    fn start_sidecars_with_delays(&mut self, base: &str, max: &str, extra: &[&str]) {
        let kubeconfig = self.http.kubeconfig_path().to_owned();
        for node in &mut self.nodes {
            let child = node
                .launch(&kubeconfig)
                .args([
                    format!("--node-deployment-base-delay={base}"),
                    format!("--node-deployment-max-delay={max}"),
                ])
                .args(extra)
                .env("NODE_NAME", node.name)
                .spawn("csi-provisioner", &node.log);
            node.sidecar = Some(child);
        }
    }

    fn node(&self, name: &str) -> &NodeSide {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .expect("known node")
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "--- sidecar of {} ---\n{}",
                    n.name,
                    std::fs::read_to_string(&n.log).unwrap_or_default()
                )
            })
            .collect()
    }

    /// Names (CreateVolume names = PV names) of the volumes on a node's
    /// backend, sorted. The backend keeps one record per volume id; two of
    /// one name (a claim provisioned twice) fail the test.
    fn backend(&self, node: &str) -> Vec<String> {
        let mut names: Vec<String> =
            csi_hostpath::backend_volumes(&self.node(node).driver.state_dir)
                .expect("backend volumes")
                .into_iter()
                .map(|v| v.name)
                .collect();
        names.sort();
        assert!(
            names.windows(2).all(|pair| pair[0] != pair[1]),
            "two volumes of one name on {node}'s backend: {names:?}\n{}",
            self.logs()
        );
        names
    }

    /// Holds every `CreateVolume` on every node's driver until
    /// [`Cluster::release_create_volume`]: each attempt is answered
    /// `UNAVAILABLE` ("may still be in progress"), so the sidecars keep the
    /// operations open and call again.
    fn hold_create_volume(&self) {
        for node in &self.nodes {
            Faults::with_rules(vec![
                Fault::error("CreateVolume", tonic::Code::Unavailable)
                    .with_delay(Duration::from_millis(100))
                    .with_message("held by the test"),
            ])
            .write(&node.driver.faults_file)
            .expect("faults file");
        }
    }

    fn release_create_volume(&self) {
        for node in &self.nodes {
            faults::clear(&node.driver.faults_file).expect("clear faults");
        }
    }

    /// The names of the journal segments (ConfigMaps) in `default`.
    async fn journal_segments(&self) -> Vec<String> {
        Api::<ConfigMap>::namespaced(self.client.clone(), "default")
            .list(&Default::default())
            .await
            .expect("config maps")
            .items
            .into_iter()
            .filter_map(|cm| cm.metadata.name)
            .filter(|name| name.contains("provisioner-journal"))
            .collect()
    }

    /// Whether `node`'s sidecar logged a line with `message` and the field
    /// `claim=default/<claim>`.
    fn logged_about(&self, node: &str, claim: &str, message: &str) -> bool {
        let field = format!("claim=default/{claim}");
        std::fs::read_to_string(&self.node(node).log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains(message) && l.split_whitespace().any(|w| w == field))
    }

    fn storage_class(&self, name: &str, binding: &str, extra: serde_json::Value) {
        let mut class = json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": DRIVER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": binding,
        });
        if let (Some(class), serde_json::Value::Object(extra)) = (class.as_object_mut(), extra) {
            class.extend(extra);
        }
        self.api.create_object(class).expect("storage class");
    }

    async fn create_pvc(
        &self,
        name: &str,
        class: &str,
        size: &str,
        annotations: serde_json::Value,
    ) {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "resources": {"requests": {"storage": size}},
            },
        }))
        .expect("pvc json");
        self.claims()
            .create(&PostParams::default(), &pvc)
            .await
            .expect("create pvc");
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn pvc(&self, name: &str) -> Option<PersistentVolumeClaim> {
        self.claims().get_opt(name).await.expect("get pvc")
    }

    async fn pvs(&self) -> Vec<PersistentVolume> {
        Api::<PersistentVolume>::all(self.client.clone())
            .list(&Default::default())
            .await
            .expect("list pv")
            .items
    }

    async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let context = || format!("\n{}", self.logs());
        support::poll(what, timeout, Duration::from_millis(50), check, context).await
    }

    /// The claim, once bound to its PV.
    async fn wait_bound(&self, name: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        self.wait_for(
            &format!("claim {name} bound"),
            Duration::from_secs(30),
            || async {
                let pvc = self.pvc(name).await?;
                let volume = pvc.spec.as_ref()?.volume_name.clone()?;
                if pvc.status.as_ref()?.phase.as_deref() != Some("Bound") {
                    return None;
                }
                let pv = Api::<PersistentVolume>::all(self.client.clone())
                    .get_opt(&volume)
                    .await
                    .expect("get pv")?;
                Some((pvc, pv))
            },
        )
        .await
    }

    async fn delete_pvc(&self, name: &str) {
        self.claims()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete pvc");
    }

    async fn wait_all_deleted(&self) {
        self.wait_for(
            "every PV and backend volume deleted",
            Duration::from_secs(30),
            || async {
                (self.pvs().await.is_empty() && NODES.iter().all(|n| self.backend(n).is_empty()))
                    .then_some(())
            },
        )
        .await;
    }
}

fn selected_node(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get(SELECTED_NODE)
        .cloned()
}

/// The node values of the PV's required node affinity.
fn affinity_nodes(pv: &PersistentVolume) -> Vec<String> {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .filter(|e| e.key == csi_hostpath::TOPOLOGY_KEY)
                .flat_map(|e| e.values.iter().flatten().cloned())
                .collect()
        })
        .unwrap_or_default()
}

fn pv_name(pv: &PersistentVolume) -> String {
    pv.metadata.name.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_claims_go_to_the_selected_node_only() {
    let mut cluster = Cluster::new(&[]).await;
    cluster.storage_class("local", "WaitForFirstConsumer", json!({}));
    cluster.start_sidecars(&[]);
    // The operations are held open until the journals are looked at.
    cluster.hold_create_volume();

    // As the scheduler would: node-b selected (the controller-manager
    // helper then adds the storage-provisioner annotation).
    cluster
        .create_pvc("on-b", "local", "10Mi", json!({SELECTED_NODE: "node-b"}))
        .await;
    cluster
        .create_pvc("on-a", "local", "10Mi", json!({SELECTED_NODE: "node-a"}))
        .await;
    // One write-ahead journal per node: a restarted node resumes only its
    // own operations, on its own driver. Looked at while each node's
    // operation is open, so each node's journal has a segment then (once
    // their operations are done segments are deleted, and a look at that
    // time could find none and check nothing).
    let bases = NODES.map(|node| format!("{DRIVER}-{node}-provisioner-journal"));
    let journals = cluster
        .wait_for(
            "a journal segment of each node",
            Duration::from_secs(30),
            || async {
                let segments = cluster.journal_segments().await;
                bases
                    .iter()
                    .all(|base| {
                        segments
                            .iter()
                            .any(|name| name.starts_with(&format!("{base}-")))
                    })
                    .then_some(segments)
            },
        )
        .await;
    assert!(!journals.is_empty(), "no journal segment");
    for name in &journals {
        assert!(
            bases
                .iter()
                .any(|base| name.starts_with(&format!("{base}-"))),
            "{name} is not a segment of a per-node journal ({bases:?})"
        );
    }
    cluster.release_create_volume();
    let (_, pv_b) = cluster.wait_bound("on-b").await;
    let (_, pv_a) = cluster.wait_bound("on-a").await;
    assert_eq!(cluster.backend("node-b"), vec![pv_name(&pv_b)]);
    assert_eq!(cluster.backend("node-a"), vec![pv_name(&pv_a)]);
    assert_eq!(affinity_nodes(&pv_b), vec!["node-b".to_owned()]);
    assert_eq!(affinity_nodes(&pv_a), vec!["node-a".to_owned()]);
    // Each PV carries its node's provisioner identity.
    let identity = |pv: &PersistentVolume| {
        pv.spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .and_then(|c| c.volume_attributes.as_ref())
            .and_then(|a| a.get("storage.kubernetes.io/csiProvisionerIdentity"))
            .cloned()
            .unwrap_or_default()
    };
    assert!(identity(&pv_b).ends_with("-node-b"), "{}", identity(&pv_b));
    assert!(identity(&pv_a).ends_with("-node-a"), "{}", identity(&pv_a));
    // Still no segment but the nodes' own (some may be gone by now).
    for name in cluster.journal_segments().await {
        assert!(
            bases
                .iter()
                .any(|base| name.starts_with(&format!("{base}-"))),
            "{name} is not a segment of a per-node journal ({bases:?})"
        );
    }

    // A claim without a selected node waits for the scheduler, on every node.
    cluster
        .create_pvc("unscheduled", "local", "10Mi", json!({}))
        .await;

    // Deletion: each node deletes its own volume.
    cluster.delete_pvc("on-b").await;
    cluster
        .wait_for(
            "node-b's volume deleted",
            Duration::from_secs(30),
            || async { cluster.backend("node-b").is_empty().then_some(()) },
        )
        .await;
    assert_eq!(
        cluster.backend("node-a"),
        vec![pv_name(&pv_a)],
        "node-a's volume must stay"
    );
    cluster.delete_pvc("on-a").await;
    cluster.wait_all_deleted().await;
    let unscheduled = cluster.pvc("unscheduled").await.expect("claim");
    assert_eq!(selected_node(&unscheduled), None);
    assert!(
        unscheduled
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_claims_are_provisioned_once_by_the_node_that_takes_them() {
    let mut cluster = Cluster::new(&[]).await;
    cluster.storage_class("shared", "Immediate", json!({}));
    cluster.start_sidecars(&[]);

    let names = ["imm-0", "imm-1", "imm-2", "imm-3"];
    for name in names {
        cluster.create_pvc(name, "shared", "5Mi", json!({})).await;
    }
    let mut expected: BTreeMap<&str, Vec<String>> = NODES.iter().map(|n| (*n, vec![])).collect();
    for name in names {
        let (pvc, pv) = cluster.wait_bound(name).await;
        let winner = selected_node(&pvc)
            .unwrap_or_else(|| panic!("{name}: no selected node\n{}", cluster.logs()));
        assert!(NODES.contains(&winner.as_str()), "{name}: {winner}");
        assert_eq!(affinity_nodes(&pv), vec![winner.clone()], "{name}");
        expected
            .get_mut(winner.as_str())
            .expect("known node")
            .push(pv_name(&pv));
    }
    // Exactly one volume per claim, on the winner's backend only.
    for (node, mut volumes) in expected.clone() {
        volumes.sort();
        assert_eq!(cluster.backend(node), volumes, "backend of {node}");
    }
    assert_eq!(cluster.pvs().await.len(), names.len());

    // Each node deletes the volumes it made.
    for name in names {
        cluster.delete_pvc(name).await;
    }
    cluster.wait_all_deleted().await;
    let logs = cluster.logs();
    assert!(
        logs.contains("became the owner of the claim"),
        "the winner logs it\n{logs}"
    );
}

/// Delays of a few milliseconds make both nodes try at nearly the same
/// time: conflicts decide, and still every claim gets exactly one volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_nodes_still_provision_each_claim_once() {
    let mut cluster = Cluster::new(&[]).await;
    cluster.storage_class("shared", "Immediate", json!({}));
    cluster.start_sidecars_with_delays("1ms", "4ms", &[]);
    let names: Vec<String> = (0..10).map(|i| format!("race-{i}")).collect();
    for name in &names {
        cluster.create_pvc(name, "shared", "1Mi", json!({})).await;
    }
    let mut volumes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in &names {
        let (pvc, pv) = cluster.wait_bound(name).await;
        let winner = selected_node(&pvc).unwrap_or_default();
        assert_eq!(affinity_nodes(&pv), vec![winner.clone()], "{name}");
        volumes.entry(winner).or_default().push(pv_name(&pv));
    }
    // A loser acting late (a volume of a claim it lost) would show on its
    // backend; compared once each node's sidecar has seen every claim bound
    // (it logs, at each claim's last pass, that the claim names its volume
    // already): the loser is then done with the claim.
    cluster
        .wait_for(
            "each node done with every claim",
            Duration::from_secs(30),
            || async {
                NODES
                    .iter()
                    .all(|node| {
                        names.iter().all(|name| {
                            cluster.logged_about(node, name, "claim already names volume")
                        })
                    })
                    .then_some(())
            },
        )
        .await;
    for node in NODES {
        let mut expected = volumes.get(node).cloned().unwrap_or_default();
        expected.sort();
        assert_eq!(
            cluster.backend(node),
            expected,
            "backend of {node}\n{}",
            cluster.logs()
        );
    }
    assert_eq!(cluster.pvs().await.len(), names.len());
    for name in &names {
        cluster.delete_pvc(name).await;
    }
    cluster.wait_all_deleted().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_topologies_and_capacity_decide_which_node_takes_a_claim() {
    // Of kind "fast", node-a has 1 MiB, node-b 1 GiB; both have room
    // elsewhere ("slow").
    let mut cluster = Cluster::new(&[
        ("node-a", "fast", 1 << 20),
        ("node-a", "slow", 1 << 30),
        ("node-b", "fast", 1 << 30),
        ("node-b", "slow", 1 << 30),
    ])
    .await;
    cluster.storage_class(
        "only-a",
        "Immediate",
        json!({"allowedTopologies": [{"matchLabelExpressions": [
            {"key": csi_hostpath::TOPOLOGY_KEY, "values": ["node-a"]}]}]}),
    );
    cluster.storage_class("fast", "Immediate", json!({"parameters": {"kind": "fast"}}));
    cluster.start_sidecars(&[]);

    for i in 0..3 {
        cluster
            .create_pvc(&format!("only-a-{i}"), "only-a", "5Mi", json!({}))
            .await;
        cluster
            .create_pvc(&format!("big-{i}"), "fast", "10Mi", json!({}))
            .await;
    }
    for i in 0..3 {
        let (pvc, _) = cluster.wait_bound(&format!("only-a-{i}")).await;
        assert_eq!(selected_node(&pvc).as_deref(), Some("node-a"), "only-a-{i}");
        // node-a cannot hold 10 MiB: only node-b tries.
        let (pvc, _) = cluster.wait_bound(&format!("big-{i}")).await;
        assert_eq!(selected_node(&pvc).as_deref(), Some("node-b"), "big-{i}");
    }
    assert_eq!(cluster.backend("node-a").len(), 3);
    assert_eq!(cluster.backend("node-b").len(), 3);
    // Decided before trying, not by losing races: node-b never schedules an
    // attempt at a claim its class does not admit there. (Whether it logs
    // the refusal depends on whether node-a took the claim first.)
    let log = |node: &str| std::fs::read_to_string(&cluster.node(node).log).unwrap_or_default();
    assert!(
        !log("node-b")
            .lines()
            .any(|l| l.contains("will try to become the owner") && l.contains("/only-a-")),
        "{}",
        cluster.logs()
    );
    for i in 0..3 {
        cluster.delete_pvc(&format!("only-a-{i}")).await;
        cluster.delete_pvc(&format!("big-{i}")).await;
    }
    cluster.wait_all_deleted().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_immediate_binding_node_sidecars_leave_immediate_claims_alone() {
    let mut cluster = Cluster::new(&[]).await;
    cluster.storage_class("shared", "Immediate", json!({}));
    cluster.storage_class("local", "WaitForFirstConsumer", json!({}));
    cluster.start_sidecars(&["--node-deployment-immediate-binding=false"]);

    cluster
        .create_pvc("immediate", "shared", "5Mi", json!({}))
        .await;
    // The sidecars work: a scheduled claim is provisioned...
    cluster
        .create_pvc(
            "scheduled",
            "local",
            "5Mi",
            json!({SELECTED_NODE: "node-a"}),
        )
        .await;
    let (_, pv) = cluster.wait_bound("scheduled").await;
    assert_eq!(cluster.backend("node-a"), vec![pv_name(&pv)]);
    // ...while the Immediate claim is never taken: each node's sidecar has
    // looked at it and decided it is not for this node (a decision that
    // queues nothing: the claim is not looked at again until it changes),
    // without scheduling an attempt to take it (logged before its delay);
    // and nobody selected a node or created a volume.
    cluster
        .wait_for(
            "each node leaving the Immediate claim alone",
            Duration::from_secs(30),
            || async {
                NODES
                    .iter()
                    .all(|node| cluster.logged_about(node, "immediate", "not provisioning"))
                    .then_some(())
            },
        )
        .await;
    for node in NODES {
        assert!(
            !cluster.logged_about(node, "immediate", "will try to become the owner"),
            "{node} tried to take the Immediate claim\n{}",
            cluster.logs()
        );
    }
    let immediate = cluster.pvc("immediate").await.expect("claim");
    assert_eq!(selected_node(&immediate), None, "{}", cluster.logs());
    assert!(
        immediate
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .is_none()
    );
    assert_eq!(cluster.backend("node-b"), Vec::<String>::new());
    assert_eq!(cluster.pvs().await.len(), 1);

    cluster.delete_pvc("scheduled").await;
    cluster.delete_pvc("immediate").await;
    cluster.wait_all_deleted().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_deployment_needs_node_name() {
    let cluster = Cluster::new(&[]).await;
    let node = cluster.node("node-a");
    let output = node
        .launch(cluster.http.kubeconfig_path())
        .command()
        .env_remove("NODE_NAME")
        .stdin(Stdio::null())
        .output()
        .expect("run csi-provisioner");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("NODE_NAME") && stderr.contains("--node-deployment"),
        "{stderr}"
    );
}

/// `--node-deployment --enable-capacity`: each node's sidecar publishes its
/// own segment only, labelled `external-provisioner-<node>` as upstream, so
/// the two never delete or rewrite each other's objects; a volume
/// provisioned (or deleted) refreshes its node's capacity at once, not at
/// the next poll (upstream's provision wrapper).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_publishes_its_own_capacity_and_refreshes_it_after_provisioning() {
    use k8s_openapi::api::storage::v1::CSIStorageCapacity;
    let mut cluster =
        Cluster::new(&[("node-a", "fast", 100 << 20), ("node-b", "fast", 200 << 20)]).await;
    cluster.storage_class(
        "local",
        "WaitForFirstConsumer",
        json!({"parameters": {"kind": "fast"}}),
    );
    // A poll interval far beyond the test: only the refresh after a
    // provision or delete can change a published value.
    cluster.start_sidecars(&[
        "--enable-capacity",
        "--capacity-ownerref-level=-1",
        "--capacity-poll-interval=1h",
    ]);
    let objects = || async {
        Api::<CSIStorageCapacity>::namespaced(cluster.client.clone(), "default")
            .list(&Default::default())
            .await
            .expect("list capacities")
            .items
    };
    // (managed-by, node of the segment, capacity)
    let published = |items: Vec<CSIStorageCapacity>| -> Vec<(String, String, String)> {
        let mut out: Vec<(String, String, String)> = items
            .into_iter()
            .map(|o| {
                let label = |k: &str| {
                    o.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(k).cloned())
                        .unwrap_or_default()
                };
                let node = o
                    .node_topology
                    .as_ref()
                    .and_then(|t| t.match_labels.as_ref())
                    .and_then(|l| l.get(csi_hostpath::TOPOLOGY_KEY).cloned())
                    .unwrap_or_default();
                (
                    label("csi.storage.k8s.io/managed-by"),
                    node,
                    o.capacity.map(|q| q.0).unwrap_or_default(),
                )
            })
            .collect();
        out.sort();
        out
    };
    let expect = |a: &str, b: &str| {
        vec![
            (
                "external-provisioner-node-a".to_owned(),
                "node-a".to_owned(),
                a.to_owned(),
            ),
            (
                "external-provisioner-node-b".to_owned(),
                "node-b".to_owned(),
                b.to_owned(),
            ),
        ]
    };
    cluster
        .wait_for(
            "one object per node, labelled for it",
            Duration::from_secs(20),
            || async { (published(objects().await) == expect("100Mi", "200Mi")).then_some(()) },
        )
        .await;
    // Neither sidecar takes the other's object for stale: the objects'
    // names, compared below once each sidecar has rewritten its own object
    // twice since both existed (a change of its own objects makes a sidecar
    // sweep them, in its one capacity worker's queue, before the next
    // refresh: so each has swept at least once, with both objects there,
    // by the last refresh).
    let names = || async {
        let mut names: Vec<Option<String>> = objects()
            .await
            .into_iter()
            .map(|o| o.metadata.name)
            .collect();
        names.sort();
        names
    };
    let first = names().await;

    cluster
        .create_pvc("on-a", "local", "10Mi", json!({SELECTED_NODE: "node-a"}))
        .await;
    cluster
        .create_pvc("on-b", "local", "10Mi", json!({SELECTED_NODE: "node-b"}))
        .await;
    cluster.wait_bound("on-a").await;
    cluster.wait_bound("on-b").await;
    cluster
        .wait_for(
            "each node's capacity refreshed after provisioning",
            Duration::from_secs(10),
            || async { (published(objects().await) == expect("90Mi", "190Mi")).then_some(()) },
        )
        .await;
    cluster.delete_pvc("on-a").await;
    cluster.delete_pvc("on-b").await;
    cluster.wait_all_deleted().await;
    cluster
        .wait_for(
            "each node's capacity refreshed after deletion",
            Duration::from_secs(10),
            || async { (published(objects().await) == expect("100Mi", "200Mi")).then_some(()) },
        )
        .await;
    assert_eq!(
        names().await,
        first,
        "objects replaced, not updated\n{}",
        cluster.logs()
    );
}
