//! End-to-end: `--node-deployment`. Two nodes, each with its own hostpath
//! driver (own socket and state directory, node id = node name, topology
//! on) and its own sidecar process (`NODE_NAME`), against one API server
//! holding both Nodes and CSINodes: the API test server, or the real
//! control plane (its PV binder, protection controllers and garbage
//! collector; no scheduler: a test selects a WaitForFirstConsumer claim's
//! node itself, by the annotation the scheduler would write).
//!
//! The nodes, the driver name, the namespace and the classes are the
//! test's own ([`Env`]: named after its id), so the tests sharing a real
//! cluster never see each other's objects; on the real cluster the
//! sidecars run as a user bound to exactly `deploy/`'s RBAC rules.
//!
//! tests/real_scheduling.rs has what needs the real kube-scheduler (pods
//! placed by the capacity the node sidecars publish, a stopped node's
//! claims waiting for it) and Immediate claims raced by several node
//! sidecars on the real cluster; the two race scenarios here run on the
//! test server only, and so does the check of `NODE_NAME`, which never
//! reaches an API server (see each).

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use controlplane::GuardedChild;
use csi_hostpath::faults::{self, Fault, Faults};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use serde_json::{Value, json};
use support::{Backend, ClusterConfig, Env, Launch, SELECTED_NODE};

e2e!(ClusterConfig::standard();
    wait_for_first_consumer_claims_go_to_the_selected_node_only,
    allowed_topologies_and_capacity_decide_which_node_takes_a_claim,
    without_immediate_binding_node_sidecars_leave_immediate_claims_alone,
    each_node_publishes_its_own_capacity_and_refreshes_it_after_provisioning,
);

/// The suffixes of the two nodes' names (see [`Cluster::name`]).
const NODES: [&str; 2] = ["a", "b"];

/// How long a claim may take to be bound or deleted, a capacity to be
/// published (the real controller-manager paces its writes).
const WAIT: Duration = Duration::from_secs(60);

struct NodeSide {
    /// The Node's name ([`Cluster::name`]).
    name: String,
    /// Killed when dropped.
    sidecar: Option<GuardedChild>,
    /// Told to stop when dropped.
    _served: csi_hostpath::InProcess,
    driver: csi_hostpath::Config,
    log: PathBuf,
}

struct Cluster {
    /// First: the sidecars and drivers go before the API server, their
    /// directory and the end-of-test checks of [`Env`]'s drop.
    nodes: Vec<NodeSide>,
    /// The API server, the test's namespace (claims, journals, capacity
    /// objects), driver name and classes; its own node and driver are
    /// replaced by the two of [`NODES`].
    env: Env,
}

impl Cluster {
    /// API server, both Nodes/CSINodes and both drivers; no sidecar yet.
    /// `capacity` limits a node's driver: (node suffix, kind, bytes).
    async fn new(backend: Backend, capacity: &[(&str, &str, u64)]) -> Cluster {
        let mut env = Env::new(backend).await;
        // The harness's own node and in-process driver are not part of
        // this cluster: its nodes are made below.
        env.stop_driver().await;
        let own = env.node.clone();
        env.delete("storage.k8s.io/v1", "CSINode", "", &own).await;
        env.delete("v1", "Node", "", &own).await;
        let mut nodes = Vec::new();
        for suffix in NODES {
            let name = format!("{own}-{suffix}");
            // A Node labelled with its topology segment, and its CSINode
            // naming the test's driver.
            env.add_node(&name).await;
            let node_dir = env.dir.path().join(&name);
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let mut driver = csi_hostpath::Config::for_tests(&node_dir);
            driver.driver_name = env.driver_name.clone();
            driver.node_id = name.clone();
            driver.capacity = capacity
                .iter()
                .filter(|(node, _, _)| *node == suffix)
                .map(|(_, kind, bytes)| ((*kind).to_owned(), *bytes))
                .collect::<BTreeMap<_, _>>();
            nodes.push(NodeSide {
                sidecar: None,
                _served: csi_hostpath::InProcess::spawn(driver.clone()),
                driver,
                log: node_dir.join("sidecar.log"),
                name,
            });
        }
        Cluster { nodes, env }
    }

    /// The name of node `suffix` (`a`, `b`): the test's node name with the
    /// suffix, unique on a shared real cluster.
    fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.env.node)
    }

    /// A node's sidecar in node deployment, in the test's namespace.
    fn launch(&self, node: &NodeSide, kubeconfig: &Path) -> Launch {
        Launch::new(&node.driver.endpoint, kubeconfig, &self.env.ns).args(["--node-deployment"])
    }

    /// One sidecar per node, in node mode with short delays, plus `extra`.
    async fn start_sidecars(&mut self, extra: &[&str]) {
        self.start_sidecars_with_delays("100ms", "500ms", extra)
            .await;
    }

    /// On the real cluster the sidecars run as the harness's sidecar user,
    /// bound to `deploy/`'s rules for `extra` (the capacity rules with
    /// `--enable-capacity`).
    async fn start_sidecars_with_delays(&mut self, base: &str, max: &str, extra: &[&str]) {
        let kubeconfig = self.env.sidecar_kubeconfig(extra).await;
        for i in 0..self.nodes.len() {
            let node = &self.nodes[i];
            let child = self
                .launch(node, &kubeconfig)
                .args([
                    format!("--node-deployment-base-delay={base}"),
                    format!("--node-deployment-max-delay={max}"),
                ])
                .args(extra)
                .env("NODE_NAME", &node.name)
                .spawn("csi-provisioner", &node.log);
            self.nodes[i].sidecar = Some(child);
        }
    }

    fn node(&self, name: &str) -> &NodeSide {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Each node's sidecar log, and on the real cluster the end of the
    /// controller-manager's.
    fn logs(&self) -> String {
        let mut out: String = self
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "--- sidecar of {} ---\n{}",
                    n.name,
                    std::fs::read_to_string(&n.log).unwrap_or_default()
                )
            })
            .collect();
        out.push_str(&self.env.logs());
        out
    }

    /// Names (CreateVolume names = PV names) of the volumes on a node's
    /// backend, sorted. The backend keeps one record per volume id; two of
    /// one name (a claim provisioned twice) fail the test.
    fn backend(&self, node: &str) -> Vec<String> {
        let state_dir = &self.node(node).driver.state_dir;
        // A volume deleted between the directory listing and the read of
        // its record makes one read fail: read again.
        let mut read = csi_hostpath::backend_volumes(state_dir);
        for _ in 0..20 {
            if read.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            read = csi_hostpath::backend_volumes(state_dir);
        }
        let mut names: Vec<String> = read
            .unwrap_or_else(|e| panic!("backend volumes of {node}: {e}"))
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
    /// operations open and call again. (The drivers' faults files: the
    /// same on both backends.)
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

    /// The names of the journal segments (ConfigMaps) in the test's
    /// namespace.
    async fn journal_segments(&self) -> Vec<String> {
        Api::<ConfigMap>::namespaced(self.env.client.clone(), &self.env.ns)
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
    /// `claim="<namespace>/<claim>"`.
    fn logged_about(&self, node: &str, claim: &str, message: &str) -> bool {
        let field = support::log_field("claim", &format!("{}/{claim}", self.env.ns));
        std::fs::read_to_string(&self.node(node).log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains(message) && l.split_whitespace().any(|w| w == field))
    }

    /// The test's StorageClass `short` ([`Env::class`]) of its driver,
    /// reclaim policy Delete, with `extra` merged in (allowedTopologies).
    async fn storage_class(&self, short: &str, binding: &str, params: Value, extra: Value) {
        self.env
            .storage_class_with(short, binding, "Delete", params, extra)
            .await;
    }

    /// A claim of the test's class `class` (short name) in its namespace.
    async fn create_pvc(&self, name: &str, class: &str, size: &str, annotations: Value) {
        self.env
            .create_pvc(
                &self.env.ns,
                name,
                class,
                size,
                json!({"metadata": {"annotations": annotations}}),
            )
            .await;
    }

    async fn pvc(&self, name: &str) -> Option<PersistentVolumeClaim> {
        self.env.pvc(&self.env.ns, name).await
    }

    /// The PVs of this test (of its driver, or bound to its claims): on the
    /// real cluster the other tests' PVs are there too.
    async fn pvs(&self) -> Vec<PersistentVolume> {
        self.env.pvs().await
    }

    async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let context = || format!("({})\n{}", self.env.backend_name(), self.logs());
        support::poll(what, timeout, Duration::from_millis(50), check, context).await
    }

    /// The claim, once bound to its PV.
    async fn wait_bound(&self, name: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        self.wait_for(&format!("claim {name} bound"), WAIT, || async {
            let pvc = self.pvc(name).await?;
            let volume = pvc.spec.as_ref()?.volume_name.clone()?;
            if pvc.status.as_ref()?.phase.as_deref() != Some("Bound") {
                return None;
            }
            let pv = self.env.pv(&volume).await?;
            Some((pvc, pv))
        })
        .await
    }

    async fn delete_pvc(&self, name: &str) {
        self.env.delete_pvc(&self.env.ns, name).await;
    }

    async fn wait_all_deleted(&self) {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        self.wait_for("every PV and backend volume deleted", WAIT, || async {
            (self.pvs().await.is_empty() && names.iter().all(|n| self.backend(n).is_empty()))
                .then_some(())
        })
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

async fn wait_for_first_consumer_claims_go_to_the_selected_node_only(backend: Backend) {
    let mut cluster = Cluster::new(backend, &[]).await;
    let (a, b) = (cluster.name("a"), cluster.name("b"));
    cluster
        .storage_class("local", "WaitForFirstConsumer", json!({}), json!({}))
        .await;
    cluster.start_sidecars(&[]).await;
    // The operations are held open until the journals are looked at.
    cluster.hold_create_volume();

    // As the scheduler would: b selected (the controller-manager, or the
    // test server's helper, then adds the storage-provisioner annotation).
    cluster
        .create_pvc("on-b", "local", "10Mi", json!({SELECTED_NODE: b}))
        .await;
    cluster
        .create_pvc("on-a", "local", "10Mi", json!({SELECTED_NODE: a}))
        .await;
    // One write-ahead journal per node: a restarted node resumes only its
    // own operations, on its own driver. Looked at while each node's
    // operation is open, so each node's journal has a segment then (once
    // their operations are done segments are deleted, and a look at that
    // time could find none and check nothing).
    let driver = cluster.env.driver_name.clone();
    let bases = [&a, &b].map(|node| format!("{driver}-{node}-provisioner-journal"));
    let journals = cluster
        .wait_for("a journal segment of each node", WAIT, || async {
            let segments = cluster.journal_segments().await;
            bases
                .iter()
                .all(|base| {
                    segments
                        .iter()
                        .any(|name| name.starts_with(&format!("{base}-")))
                })
                .then_some(segments)
        })
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
    assert_eq!(cluster.backend(&b), vec![pv_name(&pv_b)]);
    assert_eq!(cluster.backend(&a), vec![pv_name(&pv_a)]);
    assert_eq!(affinity_nodes(&pv_b), vec![b.clone()]);
    assert_eq!(affinity_nodes(&pv_a), vec![a.clone()]);
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
    assert!(
        identity(&pv_b).ends_with(&format!("-{b}")),
        "{}",
        identity(&pv_b)
    );
    assert!(
        identity(&pv_a).ends_with(&format!("-{a}")),
        "{}",
        identity(&pv_a)
    );
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
        .wait_for("b's volume deleted", WAIT, || async {
            cluster.backend(&b).is_empty().then_some(())
        })
        .await;
    assert_eq!(
        cluster.backend(&a),
        vec![pv_name(&pv_a)],
        "a's volume must stay"
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

/// Test server only: on the real cluster, Immediate claims taken by racing
/// node sidecars (one owner, one volume on its backend, everything deleted
/// by its owner) are real_scheduling.rs's
/// `immediate_claims_get_one_owner_and_one_volume_*`, which also counts
/// the owners' claim writes in the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_claims_are_provisioned_once_by_the_node_that_takes_them() {
    let mut cluster = Cluster::new(Backend::TestServer, &[]).await;
    let nodes = NODES.map(|suffix| cluster.name(suffix));
    cluster
        .storage_class("shared", "Immediate", json!({}), json!({}))
        .await;
    cluster.start_sidecars(&[]).await;

    let names = ["imm-0", "imm-1", "imm-2", "imm-3"];
    for name in names {
        cluster.create_pvc(name, "shared", "5Mi", json!({})).await;
    }
    let mut expected: BTreeMap<String, Vec<String>> =
        nodes.iter().map(|n| (n.clone(), vec![])).collect();
    for name in names {
        let (pvc, pv) = cluster.wait_bound(name).await;
        let winner = selected_node(&pvc)
            .unwrap_or_else(|| panic!("{name}: no selected node\n{}", cluster.logs()));
        assert!(nodes.contains(&winner), "{name}: {winner}");
        assert_eq!(affinity_nodes(&pv), vec![winner.clone()], "{name}");
        expected
            .get_mut(&winner)
            .expect("known node")
            .push(pv_name(&pv));
    }
    // Exactly one volume per claim, on the winner's backend only.
    for (node, mut volumes) in expected.clone() {
        volumes.sort();
        assert_eq!(cluster.backend(&node), volumes, "backend of {node}");
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
///
/// Test server only: the same race on the real cluster (three nodes,
/// delays of 5 to 50 ms, our sidecar with either driver and the Go image)
/// is real_scheduling.rs's
/// `immediate_claims_get_one_owner_and_one_volume_*`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_nodes_still_provision_each_claim_once() {
    let mut cluster = Cluster::new(Backend::TestServer, &[]).await;
    let nodes = NODES.map(|suffix| cluster.name(suffix));
    cluster
        .storage_class("shared", "Immediate", json!({}), json!({}))
        .await;
    cluster.start_sidecars_with_delays("1ms", "4ms", &[]).await;
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
        .wait_for("each node done with every claim", WAIT, || async {
            nodes
                .iter()
                .all(|node| {
                    names
                        .iter()
                        .all(|name| cluster.logged_about(node, name, "claim already names volume"))
                })
                .then_some(())
        })
        .await;
    for node in &nodes {
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

async fn allowed_topologies_and_capacity_decide_which_node_takes_a_claim(backend: Backend) {
    // Of kind "fast", a has 1 MiB, b 1 GiB; both have room elsewhere
    // ("slow").
    let mut cluster = Cluster::new(
        backend,
        &[
            ("a", "fast", 1 << 20),
            ("a", "slow", 1 << 30),
            ("b", "fast", 1 << 30),
            ("b", "slow", 1 << 30),
        ],
    )
    .await;
    let (a, b) = (cluster.name("a"), cluster.name("b"));
    cluster
        .storage_class(
            "only-a",
            "Immediate",
            json!({}),
            json!({"allowedTopologies": [{"matchLabelExpressions": [
                {"key": csi_hostpath::TOPOLOGY_KEY, "values": [a]}]}]}),
        )
        .await;
    cluster
        .storage_class("fast", "Immediate", json!({"kind": "fast"}), json!({}))
        .await;
    cluster.start_sidecars(&[]).await;

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
        assert_eq!(selected_node(&pvc), Some(a.clone()), "only-a-{i}");
        // a cannot hold 10 MiB: only b tries.
        let (pvc, _) = cluster.wait_bound(&format!("big-{i}")).await;
        assert_eq!(selected_node(&pvc), Some(b.clone()), "big-{i}");
    }
    assert_eq!(cluster.backend(&a).len(), 3);
    assert_eq!(cluster.backend(&b).len(), 3);
    // Decided before trying, not by losing races: b never schedules an
    // attempt at a claim its class does not admit there. (Whether it logs
    // the refusal depends on whether a took the claim first.)
    let log = std::fs::read_to_string(&cluster.node(&b).log).unwrap_or_default();
    assert!(
        !log.lines()
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

async fn without_immediate_binding_node_sidecars_leave_immediate_claims_alone(backend: Backend) {
    let mut cluster = Cluster::new(backend, &[]).await;
    let (a, b) = (cluster.name("a"), cluster.name("b"));
    cluster
        .storage_class("shared", "Immediate", json!({}), json!({}))
        .await;
    cluster
        .storage_class("local", "WaitForFirstConsumer", json!({}), json!({}))
        .await;
    cluster
        .start_sidecars(&["--node-deployment-immediate-binding=false"])
        .await;

    cluster
        .create_pvc("immediate", "shared", "5Mi", json!({}))
        .await;
    // The sidecars work: a scheduled claim is provisioned...
    cluster
        .create_pvc("scheduled", "local", "5Mi", json!({SELECTED_NODE: a}))
        .await;
    let (_, pv) = cluster.wait_bound("scheduled").await;
    assert_eq!(cluster.backend(&a), vec![pv_name(&pv)]);
    // ...while the Immediate claim is never taken: each node's sidecar has
    // looked at it and decided it is not for this node (a decision that
    // queues nothing: the claim is not looked at again until it changes),
    // without scheduling an attempt to take it (logged before its delay);
    // and nobody selected a node or created a volume.
    cluster
        .wait_for(
            "each node leaving the Immediate claim alone",
            WAIT,
            || async {
                [&a, &b]
                    .iter()
                    .all(|node| cluster.logged_about(node, "immediate", "not provisioning"))
                    .then_some(())
            },
        )
        .await;
    for node in [&a, &b] {
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
    assert_eq!(cluster.backend(&b), Vec::<String>::new());
    assert_eq!(cluster.pvs().await.len(), 1);

    cluster.delete_pvc("scheduled").await;
    cluster.delete_pvc("immediate").await;
    cluster.wait_all_deleted().await;
}

/// Test server only: `NODE_NAME` is checked before anything else, the
/// kubeconfig included (src/startup.rs), so the API server plays no part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_deployment_needs_node_name() {
    let cluster = Cluster::new(Backend::TestServer, &[]).await;
    let kubeconfig = cluster.env.sidecar_kubeconfig(&[]).await;
    let node = cluster.node(&cluster.name("a"));
    let output = cluster
        .launch(node, &kubeconfig)
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
async fn each_node_publishes_its_own_capacity_and_refreshes_it_after_provisioning(
    backend: Backend,
) {
    use k8s_openapi::api::storage::v1::CSIStorageCapacity;
    let mut cluster = Cluster::new(
        backend,
        &[("a", "fast", 100 << 20), ("b", "fast", 200 << 20)],
    )
    .await;
    let (a, b) = (cluster.name("a"), cluster.name("b"));
    cluster
        .storage_class(
            "local",
            "WaitForFirstConsumer",
            json!({"kind": "fast"}),
            json!({}),
        )
        .await;
    // A poll interval far beyond the test: only the refresh after a
    // provision or delete can change a published value.
    cluster
        .start_sidecars(&[
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            "--capacity-poll-interval=1h",
        ])
        .await;
    let objects = || async {
        Api::<CSIStorageCapacity>::namespaced(cluster.env.client.clone(), &cluster.env.ns)
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
    let expect = |on_a: &str, on_b: &str| {
        vec![
            (
                format!("external-provisioner-{a}"),
                a.clone(),
                on_a.to_owned(),
            ),
            (
                format!("external-provisioner-{b}"),
                b.clone(),
                on_b.to_owned(),
            ),
        ]
    };
    cluster
        .wait_for("one object per node, labelled for it", WAIT, || async {
            (published(objects().await) == expect("100Mi", "200Mi")).then_some(())
        })
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
        .create_pvc("on-a", "local", "10Mi", json!({SELECTED_NODE: a}))
        .await;
    cluster
        .create_pvc("on-b", "local", "10Mi", json!({SELECTED_NODE: b}))
        .await;
    cluster.wait_bound("on-a").await;
    cluster.wait_bound("on-b").await;
    cluster
        .wait_for(
            "each node's capacity refreshed after provisioning",
            WAIT,
            || async { (published(objects().await) == expect("90Mi", "190Mi")).then_some(()) },
        )
        .await;
    cluster.delete_pvc("on-a").await;
    cluster.delete_pvc("on-b").await;
    cluster.wait_all_deleted().await;
    cluster
        .wait_for(
            "each node's capacity refreshed after deletion",
            WAIT,
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
