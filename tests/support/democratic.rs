//! democratic-csi (v1.9.4, Node.js, its `local-hostpath` driver), a
//! third-party CSI driver, deployed as its Helm chart deploys it: one
//! provisioner sidecar per node with the chart's flags ([`HELM_FLAGS`]), a
//! WaitForFirstConsumer class and a CSIDriver with `storageCapacity: true`.
//!
//! A test's "cluster" ([`Dcsi`]) on the shared real control plane: two Node
//! objects of its own (Ready, their Leases renewed as a kubelet would; no
//! kubelet), each with its own democratic-csi process (`CSI_NODE_ID` = the
//! node's name, its own socket and data folder) and its own sidecar
//! (`NODE_NAME`; `POD_NAME` a pod of a DaemonSet, the owner that
//! `--capacity-ownerref-level=1` asks for). The real kube-scheduler places
//! the pods. The driver is installed by
//! `../shared/drivers/democratic-csi/install.sh` into the folder
//! [`DCSI_DIR_VAR`] names (else `target/democratic-csi`).
//!
//! The driver keeps a volume as the folder `<data>/v/<volume id>` and a
//! snapshot as `<data>/s/<snapshot id>`, where the volume id is the
//! `CreateVolume` name: those folders are its whole state, so "nothing
//! leaked" is read there.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use controlplane::{BinEnv, GuardedChild, Verdict};
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use super::fake_nodes::{HOSTNAME, TEST_LABEL, capacity_bytes, heartbeat, tail};
use super::{Backend, Env, Launch, current_test};

/// Names the folder democratic-csi was installed into.
pub const DCSI_DIR_VAR: &str = "DCSI_DIR";
/// How to install it, from the repository's root.
pub const INSTALL_COMMAND: &str =
    "bash ../shared/drivers/democratic-csi/install.sh target/democratic-csi";
/// The driver's own topology key; its value is the node id.
pub const TOPOLOGY_KEY: &str = "org.democratic-csi.topology/node";
/// The sidecar flags of democratic-csi's Helm chart (node deployment).
pub const HELM_FLAGS: &[&str] = &[
    "--node-deployment=true",
    "--node-deployment-immediate-binding=false",
    "--feature-gates=Topology=true",
    "--strict-topology=true",
    "--enable-capacity=true",
    "--capacity-ownerref-level=1",
];
/// The WaitForFirstConsumer class of every test (short name).
pub const CLASS: &str = "dcsi";
/// Binding, provisioning and deletion on this cluster.
pub const WAIT: Duration = Duration::from_secs(60);

/// The democratic-csi install folder, checked: `None` after one `SKIPPED
/// real-cluster test` line when it is missing and skipping is allowed;
/// panics, naming it, when [`DCSI_DIR_VAR`] is set or skipping is not
/// allowed for the real-cluster binaries (`CI`, `K8S_BIN_DIR`).
pub fn install_dir(test: &str) -> Option<PathBuf> {
    let named = std::env::var_os(DCSI_DIR_VAR).filter(|v| !v.is_empty());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = match &named {
        Some(dir) => root.join(dir),
        None => root.join("target/democratic-csi"),
    };
    let verdict = match installed(&dir) {
        Ok(dir) => Verdict::Run(dir),
        Err(missing) => {
            let no_skip = match &named {
                Some(_) => Some(format!("{DCSI_DIR_VAR} is set")),
                None => BinEnv::from_process().no_skip_reason(),
            };
            match no_skip {
                None => Verdict::Skip(missing),
                Some(reason) => Verdict::Fail(format!(
                    "{missing}; {reason}, so a missing install fails the test instead of \
                     skipping it"
                )),
            }
        }
    };
    match verdict {
        Verdict::Run(dir) => Some(dir),
        Verdict::Skip(missing) => {
            // Past the harness's capture, as controlplane::skip does.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED real-cluster test {test}: {missing}; to run it, install democratic-csi \
                 with `{INSTALL_COMMAND}` and set {DCSI_DIR_VAR} to that folder"
            );
            None
        }
        Verdict::Fail(message) => panic!(
            "real-cluster test {test}: democratic-csi: {message}; install it with \
             `{INSTALL_COMMAND}` and set {DCSI_DIR_VAR}=\"$PWD/target/democratic-csi\""
        ),
    }
}

/// `dir` when install.sh completed there (its mark, the gRPC module, the
/// entry point), `node` runs and the driver's config template is there;
/// else what is missing.
fn installed(dir: &Path) -> Result<PathBuf, String> {
    if !config_template().is_file() {
        return Err(format!("no {}", config_template().display()));
    }
    for part in [
        ".installed",
        "node_modules/@grpc/grpc-js",
        "bin/democratic-csi",
    ] {
        if !dir.join(part).exists() {
            return Err(format!(
                "{} has no {part} (not installed there)",
                dir.display()
            ));
        }
    }
    match Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => Ok(dir.to_owned()),
        _ => Err("no `node` on PATH (install.sh installs nodejs)".to_owned()),
    }
}

/// The driver's config template, beside install.sh (start.sh uses it).
fn config_template() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/drivers/democratic-csi/config.yaml")
}

/// The config `start.sh` writes: the template with the local-hostpath
/// driver's folders set to `data`.
fn driver_config(data: &Path) -> String {
    let template = config_template();
    let text = std::fs::read_to_string(&template)
        .unwrap_or_else(|e| panic!("read {}: {e}", template.display()));
    text.replace("@DATA_DIR@", &data.display().to_string())
}

/// One node: its driver and its sidecar.
pub struct DcsiNode {
    pub name: String,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The driver's data folder (`v/`, `s/`).
    pub data: PathBuf,
    pub driver: Option<GuardedChild>,
    pub sidecar: Option<GuardedChild>,
    pub sidecar_runs: u32,
    /// The DaemonSet pod of this node (`POD_NAME`).
    pub pod: String,
}

impl DcsiNode {
    pub fn driver_log(&self) -> PathBuf {
        self.dir.join("driver.log")
    }

    pub fn sidecar_log(&self, run: u32) -> PathBuf {
        self.dir.join(format!("sidecar-{run}.log"))
    }

    /// The backend's volumes (folder names = volume ids), sorted.
    pub fn volumes(&self) -> Vec<String> {
        folders(&self.data.join("v"))
    }

    /// The backend's snapshots, sorted.
    pub fn snapshots(&self) -> Vec<String> {
        folders(&self.data.join("s"))
    }
}

fn folders(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A test's two nodes with democratic-csi and our sidecars (see the
/// module's documentation).
pub struct Dcsi {
    pub env: Env,
    install: PathBuf,
    kubeconfig: PathBuf,
    pub nodes: Vec<DcsiNode>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl Dcsi {
    /// Nodes a and b, their drivers and sidecars, the CSIDriver and the
    /// class; returns once both sidecars have published their capacity
    /// (so they run). `None` when democratic-csi is not installed and
    /// skipping is allowed (said once).
    pub async fn new(backend: Backend) -> Option<Dcsi> {
        let install = install_dir(&current_test())?;
        let mut env = Env::new(backend).await;
        // The harness's own node and in-process driver are not used.
        env.stop_driver().await;
        env.delete("storage.k8s.io/v1", "CSINode", "", &env.node.clone())
            .await;
        env.delete("v1", "Node", "", &env.node.clone()).await;
        env.driver_name = format!("{}.local-hostpath.democratic-csi.org", env.id);
        let kubeconfig = env.sidecar_kubeconfig(HELM_FLAGS).await;
        let mut nodes = Vec::new();
        for suffix in ["a", "b"] {
            let name = format!("n{}-{suffix}", env.id);
            let dir = env.dir.path().join(&name);
            std::fs::create_dir_all(&dir).expect("node dir");
            nodes.push(DcsiNode {
                socket: dir.join("csi.sock"),
                data: dir.join("data"),
                dir,
                name,
                driver: None,
                sidecar: None,
                sidecar_runs: 0,
                pod: String::new(),
            });
        }
        let mut c = Dcsi {
            env,
            install,
            kubeconfig,
            nodes,
            heartbeat: None,
        };
        for i in 0..c.nodes.len() {
            c.add_node(i).await;
            c.start_driver(i).await;
        }
        c.heartbeat = Some(tokio::spawn(heartbeat(
            c.env.client.clone(),
            c.node_names(),
        )));
        c.wait_nodes_untainted().await;
        c.env
            .create(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                "metadata": {"name": c.env.driver_name},
                "spec": {"attachRequired": false, "podInfoOnMount": true,
                    "storageCapacity": true, "volumeLifecycleModes": ["Persistent"]}}),
            )
            .await;
        c.env
            .storage_class(CLASS, "WaitForFirstConsumer", "Delete", json!({}))
            .await;
        c.daemon_set_pods().await;
        for i in 0..c.nodes.len() {
            c.start_sidecar(i);
        }
        for node in c.node_names() {
            c.wait_capacity(&node).await;
        }
        Some(c)
    }

    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    pub fn index(&self, node: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == node)
            .unwrap_or_else(|| panic!("no node {node}"))
    }

    /// Registers node `i` (Node, CSINode with the driver's topology key,
    /// node Lease: `fake_nodes::register`).
    async fn add_node(&self, i: usize) {
        super::fake_nodes::register(&self.env, &self.nodes[i].name, TOPOLOGY_KEY).await;
    }

    /// The TaintNodesByCondition admission gives a new Node the not-ready
    /// taint; the node lifecycle controller removes it once it sees Ready.
    async fn wait_nodes_untainted(&self) {
        let names = self.node_names();
        self.wait_for("the test's nodes without taints", WAIT, || async {
            for name in &names {
                let node = Api::<Node>::all(self.env.client.clone())
                    .get(name)
                    .await
                    .ok()?;
                if node.spec?.taints.is_some_and(|t| !t.is_empty()) {
                    return None;
                }
            }
            Some(())
        })
        .await;
    }

    /// A DaemonSet over the test's nodes, its pods given a scheduler that
    /// nobody runs (no kubelet would run them): the `POD_NAME` of each
    /// node's sidecar, whose owner (level 1) the capacity objects get, as
    /// in the chart, where the node sidecars run in a DaemonSet.
    async fn daemon_set_pods(&mut self) {
        let ds = "dcsi-node";
        self.env
            .create(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": ds, "namespace": self.env.ns},
            "spec": {
                "selector": {"matchLabels": {"app": ds}},
                "template": {"metadata": {"labels": {"app": ds}}, "spec": {
                    "nodeSelector": {TEST_LABEL: self.env.id},
                    "schedulerName": format!("nobody-{}", self.env.id),
                    "containers": [{"name": "csi-provisioner", "image": "csi-provisioner"}],
                }},
            }}))
            .await;
        let nodes = self.node_names();
        let by_node: BTreeMap<String, String> = self
            .wait_for("a DaemonSet pod per node", WAIT, || async {
                let pods = Api::<Pod>::namespaced(self.env.client.clone(), &self.env.ns)
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items;
                let by_node: BTreeMap<String, String> = pods
                    .into_iter()
                    .filter_map(|p| Some((daemon_pod_node(&p)?, p.metadata.name?)))
                    .collect();
                (by_node.keys().cloned().collect::<Vec<_>>() == nodes).then_some(by_node)
            })
            .await;
        for node in &mut self.nodes {
            node.pod = by_node[&node.name].clone();
        }
    }

    /// Starts node `i`'s democratic-csi as `start.sh` does (controller and
    /// node services in one process), but as a child of this test, so
    /// that it can be paused and never outlives the test.
    pub async fn start_driver(&mut self, i: usize) {
        let driver_name = self.env.driver_name.clone();
        let node = &mut self.nodes[i];
        std::fs::create_dir_all(&node.data).expect("data dir");
        let config = node.dir.join("driver.yaml");
        std::fs::write(&config, driver_config(&node.data)).expect("driver config");
        let _ = std::fs::remove_file(&node.socket);
        let mut command = Command::new("node");
        command
            .current_dir(&self.install)
            .arg("--expose-gc")
            .arg("bin/democratic-csi")
            .arg("--csi-version=1.9.0")
            .arg(format!("--csi-name={driver_name}"))
            .arg(format!("--driver-config-file={}", config.display()))
            .arg("--log-level=info")
            .arg(format!("--server-socket={}", node.socket.display()))
            .arg("--csi-mode=controller")
            .arg("--csi-mode=node")
            .env("CSI_NODE_ID", &node.name);
        node.driver = Some(
            GuardedChild::spawn("democratic-csi", command, &node.driver_log())
                .expect("spawn democratic-csi"),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while !node.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "democratic-csi of {} did not listen on {}:\n{}",
                node.name,
                node.socket.display(),
                std::fs::read_to_string(node.driver_log()).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts node `i`'s sidecar with the chart's flags (and the harness's:
    /// short retries, `--timeout`, `--v=4`).
    pub fn start_sidecar(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        assert!(node.sidecar.is_none(), "sidecar of {} running", node.name);
        node.sidecar_runs += 1;
        let launch = Launch::new(&node.socket, &self.kubeconfig, &self.env.ns)
            .args(HELM_FLAGS)
            .env("NODE_NAME", &node.name)
            .env("POD_NAME", &node.pod);
        node.sidecar = Some(launch.spawn("csi-provisioner", &node.sidecar_log(node.sidecar_runs)));
    }

    /// The log of node `i`'s last sidecar run.
    pub fn sidecar_log(&self, i: usize) -> String {
        let node = &self.nodes[i];
        std::fs::read_to_string(node.sidecar_log(node.sidecar_runs)).unwrap_or_default()
    }

    pub fn driver_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.nodes[i].driver_log()).unwrap_or_default()
    }

    /// Every sidecar and driver log (their last lines) and the
    /// scheduler's, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            for run in 1..=node.sidecar_runs {
                let text = std::fs::read_to_string(node.sidecar_log(run)).unwrap_or_default();
                out.push_str(&format!(
                    "--- sidecar of {} run {run} ---\n{}\n",
                    node.name,
                    tail(&text, 120)
                ));
            }
            out.push_str(&format!(
                "--- democratic-csi of {} ---\n{}\n",
                node.name,
                tail(&self.driver_log(i), 40)
            ));
        }
        if let Some(plane) = self.env.plane() {
            out.push_str("--- kube-scheduler (last 20 lines) ---\n");
            out.push_str(&plane.log_tail("kube-scheduler", 20));
        }
        out.push_str(&self.env.snapshot_logs());
        out
    }

    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let context = || format!("for {timeout:?}\n{}", self.logs());
        super::poll(what, timeout, Duration::from_millis(100), check, context).await
    }

    /// A claim of the test's class.
    pub async fn claim(&self, name: &str, size: &str, extra: serde_json::Value) {
        self.env
            .create_pvc(&self.env.ns, name, CLASS, size, extra)
            .await;
    }

    /// A pod using `claim`, pinned to `node` when given, else placed by
    /// the scheduler on one of the test's nodes.
    pub async fn pod(&self, name: &str, claim: &str, node: Option<&str>) {
        let selector = match node {
            Some(node) => json!({HOSTNAME: node}),
            None => json!({TEST_LABEL: self.env.id}),
        };
        self.env
            .create(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.env.ns},
            "spec": {
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
                "terminationGracePeriodSeconds": 0,
                "nodeSelector": selector,
            }}))
            .await;
    }

    pub async fn get_pod(&self, name: &str) -> Option<Pod> {
        Api::<Pod>::namespaced(self.env.client.clone(), &self.env.ns)
            .get_opt(name)
            .await
            .expect("get pod")
    }

    /// The node the scheduler bound the pod to.
    pub async fn wait_scheduled(&self, pod: &str) -> String {
        self.wait_for(&format!("pod {pod} bound to a node"), WAIT, || async {
            self.get_pod(pod).await?.spec?.node_name
        })
        .await
    }

    /// The claim and its PV, once bound ([`Env::wait_bound`]).
    pub async fn wait_bound(&self, claim: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        let pv = self.env.wait_bound(&self.env.ns, claim).await;
        let pvc = self.env.pvc(&self.env.ns, claim).await;
        (pvc.unwrap_or_else(|| panic!("claim {claim} exists")), pv)
    }

    /// The test driver's CSIStorageCapacity objects of the class, by the
    /// node of their segment.
    pub async fn capacities(&self) -> BTreeMap<String, CSIStorageCapacity> {
        let class = self.env.class(CLASS);
        Api::<CSIStorageCapacity>::namespaced(self.env.client.clone(), &self.env.ns)
            .list(&Default::default())
            .await
            .expect("list capacities")
            .items
            .into_iter()
            .filter(|o| o.storage_class_name == class)
            .filter_map(|o| {
                let node = o
                    .node_topology
                    .as_ref()?
                    .match_labels
                    .as_ref()?
                    .get(TOPOLOGY_KEY)?
                    .clone();
                Some((node, o))
            })
            .collect()
    }

    /// `node`'s published object once its capacity is above zero.
    pub async fn wait_capacity(&self, node: &str) -> CSIStorageCapacity {
        self.wait_for(&format!("capacity published for {node}"), WAIT, || async {
            let object = self.capacities().await.remove(node)?;
            (capacity_bytes(&object) > 0).then_some(object)
        })
        .await
    }

    /// Journal entries (claim uid → entry) of node `node`'s sidecar: its
    /// segments are `<driver>-<node>-provisioner-journal-<n>` (node
    /// deployment keeps one journal per node).
    pub async fn journal(
        &self,
        node: &str,
    ) -> BTreeMap<String, csi_provisioner::provisioner::journal::JournalEntry> {
        let prefix = csi_provisioner::provisioner::journal::journal_name(&format!(
            "{}-{node}",
            self.env.driver_name
        ));
        let data: BTreeMap<String, String> =
            Api::<ConfigMap>::namespaced(self.env.client.clone(), &self.env.ns)
                .list(&Default::default())
                .await
                .expect("list configmaps")
                .items
                .into_iter()
                .filter(|cm| {
                    cm.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .flat_map(|cm| cm.data.unwrap_or_default())
                .collect();
        let (entries, errors) = csi_provisioner::provisioner::journal::parse_entries(&data);
        assert!(errors.is_empty(), "journal of {node}: {errors:?}");
        entries
    }

    /// Deletes the pods and claims, then waits until nothing is left: no
    /// volume or snapshot folder on either backend, no journal entry, no PV
    /// of the test (so none with our finalizer, the only objects that get
    /// it) and no claim.
    pub async fn delete_and_assert_nothing_left(&self, pods: &[&str], claims: &[&str]) {
        let api = Api::<Pod>::namespaced(self.env.client.clone(), &self.env.ns);
        for pod in pods {
            match api.delete(pod, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => panic!("delete pod {pod}: {e}"),
            }
        }
        for claim in claims {
            self.env.delete_pvc(&self.env.ns, claim).await;
        }
        self.wait_nothing_left().await;
    }

    /// Waits until nothing of the test is left (see
    /// [`Dcsi::delete_and_assert_nothing_left`]).
    pub async fn wait_nothing_left(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = self.what_is_left().await;
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "left after {WAIT:?}: {left:#?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What is left of the test, named; empty when nothing is.
    pub async fn what_is_left(&self) -> Vec<String> {
        let mut left = Vec::new();
        for node in &self.nodes {
            for volume in node.volumes() {
                left.push(format!("volume folder {volume} on {}", node.name));
            }
            for snapshot in node.snapshots() {
                left.push(format!("snapshot folder {snapshot} on {}", node.name));
            }
            for (uid, entry) in self.journal(&node.name).await {
                left.push(format!(
                    "journal entry {uid} ({}/{}) of {}",
                    entry.namespace, entry.name, node.name
                ));
            }
        }
        // A PV of ours that is left names its finalizers (ours among them
        // when the sidecar never finished its deletion).
        for pv in self.env.pvs().await {
            left.push(format!(
                "PV {} with finalizers {:?}",
                pv.metadata.name.unwrap_or_default(),
                pv.metadata.finalizers.unwrap_or_default()
            ));
        }
        let claims =
            Api::<PersistentVolumeClaim>::namespaced(self.env.client.clone(), &self.env.ns)
                .list(&Default::default())
                .await
                .expect("list pvc")
                .items;
        for claim in claims {
            left.push(format!(
                "claim {} with finalizers {:?}",
                claim.metadata.name.unwrap_or_default(),
                claim.metadata.finalizers.unwrap_or_default()
            ));
        }
        left
    }

    /// SIGTERM to node `i`'s sidecar; ours exits 0.
    pub fn stop_sidecar(&mut self, i: usize) {
        let mut child = self.nodes[i].sidecar.take().expect("sidecar running");
        let status = child.stop(Duration::from_secs(20));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "sidecar of {} did not exit 0 on SIGTERM\n{}",
            self.nodes[i].name,
            self.logs()
        );
    }

    /// Stops every process and removes the test's cluster-scoped objects
    /// (nodes, CSINodes, node Leases, CSIDriver). `DCSI_LOGS` set: prints
    /// every log first.
    pub async fn finish(mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].sidecar.is_some() {
                self.stop_sidecar(i);
            }
        }
        if std::env::var_os("DCSI_LOGS").is_some() {
            eprintln!("=== logs of {} ===\n{}", current_test(), self.logs());
        }
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
        for node in &mut self.nodes {
            if let Some(mut driver) = node.driver.take() {
                driver.stop(Duration::from_secs(5));
            }
        }
        let env = &self.env;
        for name in self.node_names() {
            env.delete("coordination.k8s.io/v1", "Lease", "kube-node-lease", &name)
                .await;
            env.delete("storage.k8s.io/v1", "CSINode", "", &name).await;
            env.delete("v1", "Node", "", &name).await;
        }
        env.delete("storage.k8s.io/v1", "CSIDriver", "", &env.driver_name)
            .await;
    }
}

impl Drop for Dcsi {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
    }
}

/// The node a DaemonSet pod is for: its required node affinity on the
/// field `metadata.name`.
fn daemon_pod_node(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|f| f.key == "metadata.name")?
        .values
        .as_ref()?
        .first()
        .cloned()
}

/// The topology values of the PV's required node affinity for
/// [`TOPOLOGY_KEY`].
pub fn affinity_nodes(pv: &PersistentVolume) -> Vec<String> {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .filter(|e| e.key == TOPOLOGY_KEY)
                .flat_map(|e| e.values.iter().flatten().cloned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn volume_handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .unwrap_or_default()
}
