//! End-to-end on a real control plane with the real kube-scheduler (issue 23
//! parts 2 and 3): storage capacity that steers the scheduler, and node
//! deployment (`--node-deployment`, one sidecar and one driver per node).
//!
//! Each test builds its own small "cluster" on the shared control plane: two
//! or three Node objects of its own (Ready, allocatable pods, kept alive by a
//! node Lease heartbeat as a kubelet would, since the node lifecycle
//! controller would otherwise mark them unreachable and taint them), a
//! CSINode per node naming the test's driver with the hostpath topology key,
//! one driver process per node (our `csi-hostpath`, or the upstream
//! `hostpathplugin`, each with its own socket, state directory, node id =
//! node name and capacity), and one sidecar per node with `NODE_NAME`. Names
//! carry the test's id (namespace, driver, nodes, classes), so tests sharing
//! the cluster never see each other's objects; every pod is held to the
//! test's nodes by a node selector (the test's label, or one node's
//! hostname).
//!
//! Both drivers support everything used here: `GetCapacity` per `kind`
//! parameter (`--capacity=<kind>=<quantity>`), topology with the key
//! `topology.hostpath.csi/node` reported by `NodeGetInfo`. Capacity is
//! published per node in node deployment only: each sidecar asks its own
//! driver for its own segment, so neither driver has to know the others'
//! storage.
//!
//! `--capacity-ownerref-level`, per upstream's flag text: -1 no owner, 0 the
//! pod `POD_NAME` itself, 1 the pod's controller (ReplicaSet, StatefulSet or
//! DaemonSet), 2 the controller's controller (the Deployment above a
//! ReplicaSet). The owners are made by the real controllers: a DaemonSet
//! over the test's nodes and a Deployment (its ReplicaSet and pod), their
//! pods given a scheduler name nobody serves so they stay unscheduled (no
//! kubelet would run them anyway).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use controlplane::GuardedChild;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use support::fake_nodes::{
    self, HOSTNAME, TEST_LABEL, capacity_bytes, heartbeat, quantity_bytes, selected_node, tail,
};
use support::{Backend, ClusterConfig, Env, Launch};

const MI: i64 = 1 << 20;
const TOPOLOGY_KEY: &str = csi_hostpath::TOPOLOGY_KEY;
const IDENTITY_ATTRIBUTE: &str = "storage.kubernetes.io/csiProvisionerIdentity";
/// How long a claim that must not be provisioned is watched.
const HOLD: Duration = Duration::from_secs(6);

e2e_real!(ClusterConfig::standard().with_scheduler();
    capacity_steers_the_scheduler_csi_hostpath,
    capacity_steers_the_scheduler_hostpathplugin,
    capacity_steers_the_scheduler_go_image_hostpathplugin,
    capacity_owner_follows_the_level_as_the_go_image,
    node_sidecars_provision_only_their_nodes_claims_csi_hostpath,
    node_sidecars_provision_only_their_nodes_claims_hostpathplugin,
    node_sidecars_provision_only_their_nodes_claims_go_image_hostpathplugin,
    immediate_claims_get_one_owner_and_one_volume_csi_hostpath,
    immediate_claims_get_one_owner_and_one_volume_hostpathplugin,
    immediate_claims_get_one_owner_and_one_volume_go_image_hostpathplugin,
);

/// Declares the three runs of a scenario `async fn scenario(backend,
/// driver, sidecar)`: ours with our `csi-hostpath`, ours with the upstream
/// `hostpathplugin`, and the upstream Go image with `hostpathplugin` (the
/// reference behaviour).
macro_rules! each_driver_and_image {
    ($scenario:ident: $ours:ident, $ours_upstream_driver:ident, $go_image:ident) => {
        async fn $ours(backend: Backend) {
            $scenario(backend, DriverKind::CsiHostpath, SidecarKind::Ours).await;
        }

        async fn $ours_upstream_driver(backend: Backend) {
            $scenario(backend, DriverKind::Hostpathplugin, SidecarKind::Ours).await;
        }

        async fn $go_image(backend: Backend) {
            $scenario(backend, DriverKind::Hostpathplugin, SidecarKind::Go).await;
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DriverKind {
    /// This repository's `csi-hostpath`, as a process.
    CsiHostpath,
    /// The upstream Go `hostpathplugin`.
    Hostpathplugin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SidecarKind {
    Ours,
    /// The upstream Go `csi-provisioner`, bound to its stock RBAC rules
    /// (plus `get` on DaemonSets and Deployments for the owner levels).
    Go,
}

impl SidecarKind {
    fn name(self) -> &'static str {
        match self {
            SidecarKind::Ours => "ours",
            SidecarKind::Go => "Go image",
        }
    }
}

/// One node of a test: its driver process and its sidecar process.
struct NodeSide {
    name: String,
    dir: PathBuf,
    socket: PathBuf,
    state_dir: PathBuf,
    /// `--capacity=fast=<bytes>` of its driver, if any.
    capacity: Option<i64>,
    driver: Option<GuardedChild>,
    sidecar: Option<GuardedChild>,
    sidecar_runs: u32,
}

impl NodeSide {
    fn sidecar_log(&self, run: u32) -> PathBuf {
        self.dir.join(format!("sidecar-{run}.log"))
    }
}

/// What a test's cluster is made of.
struct Setup {
    driver: DriverKind,
    sidecar: SidecarKind,
    /// Suffixes of the node names and the capacity of kind `fast` of each
    /// node's driver (`None`: unlimited).
    nodes: Vec<(&'static str, Option<i64>)>,
    /// The sidecars publish capacity (their RBAC gets the capacity rules).
    capacity: bool,
    /// `--node-deployment-base-delay` and `--node-deployment-max-delay`.
    delays: (&'static str, &'static str),
}

impl Setup {
    /// `nodes` with delays of 100ms to 1s, without capacity tracking.
    fn new(
        driver: DriverKind,
        sidecar: SidecarKind,
        nodes: Vec<(&'static str, Option<i64>)>,
    ) -> Setup {
        Setup {
            driver,
            sidecar,
            nodes,
            capacity: false,
            delays: ("100ms", "1s"),
        }
    }
}

struct Cluster {
    env: Env,
    driver: DriverKind,
    sidecar_kind: SidecarKind,
    driver_bin: PathBuf,
    sidecar_bin: PathBuf,
    kubeconfig: PathBuf,
    /// The user the sidecars run as (audit log).
    user: String,
    delays: (&'static str, &'static str),
    nodes: Vec<NodeSide>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    /// The nodes, their drivers, the CSIDriver (with `storageCapacity`
    /// when the setup tracks capacity) and the sidecars' RBAC; no sidecar
    /// yet. `None` when an upstream binary the setup needs is missing and
    /// skipping is allowed (said once).
    async fn new(backend: Backend, setup: Setup) -> Option<Cluster> {
        let mut env = Env::new(backend).await;
        // The harness's own node and in-process driver are not part of
        // this cluster: the test's nodes are made below.
        env.stop_driver().await;
        env.delete("storage.k8s.io/v1", "CSINode", "", &env.node.clone())
            .await;
        env.delete("v1", "Node", "", &env.node.clone()).await;
        let driver_bin = match setup.driver {
            DriverKind::CsiHostpath => support::driver_binary(),
            DriverKind::Hostpathplugin => env.upstream_binary("hostpathplugin")?,
        };
        let (sidecar_bin, kubeconfig, user) = match setup.sidecar {
            SidecarKind::Ours => {
                let args: &[&str] = if setup.capacity {
                    &["--enable-capacity"]
                } else {
                    &[]
                };
                let kubeconfig = env.sidecar_kubeconfig(args).await;
                (
                    support::sidecar::sidecar_binary(),
                    kubeconfig,
                    env.sidecar_user(),
                )
            }
            SidecarKind::Go => go_image(&env).await?,
        };
        let mut nodes = Vec::new();
        for (suffix, capacity) in &setup.nodes {
            let name = format!("n{}-{suffix}", env.id);
            let dir = env.dir.path().join(&name);
            std::fs::create_dir_all(&dir).expect("node dir");
            nodes.push(NodeSide {
                socket: dir.join("csi.sock"),
                state_dir: dir.join("state"),
                dir,
                name,
                capacity: *capacity,
                driver: None,
                sidecar: None,
                sidecar_runs: 0,
            });
        }
        let mut cluster = Cluster {
            env,
            driver: setup.driver,
            sidecar_kind: setup.sidecar,
            driver_bin,
            sidecar_bin,
            kubeconfig,
            user,
            delays: setup.delays,
            nodes,
            heartbeat: None,
        };
        for i in 0..cluster.nodes.len() {
            cluster.add_node(i).await;
            cluster.start_driver(i).await;
        }
        let names = cluster.node_names();
        cluster.heartbeat = Some(tokio::spawn(heartbeat(
            cluster.env.client.clone(),
            names.clone(),
        )));
        // The TaintNodesByCondition admission gives a new Node the
        // not-ready taint; the node lifecycle controller removes it once it
        // sees the Ready condition.
        cluster
            .wait_for(
                "the test's nodes Ready without taints",
                Duration::from_secs(90),
                || async {
                    for name in &names {
                        let node = Api::<Node>::all(cluster.env.client.clone())
                            .get(name)
                            .await
                            .ok()?;
                        let tainted = node
                            .spec
                            .and_then(|s| s.taints)
                            .is_some_and(|t| !t.is_empty());
                        if tainted {
                            return None;
                        }
                    }
                    Some(())
                },
            )
            .await;
        cluster.csi_driver(setup.capacity).await;
        Some(cluster)
    }

    fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    fn node(&self, suffix: &str) -> String {
        format!("n{}-{suffix}", self.env.id)
    }

    fn index(&self, node: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == node)
            .unwrap_or_else(|| panic!("no node {node}"))
    }

    /// Registers node `i` (Node, CSINode, node Lease:
    /// `fake_nodes::register`).
    async fn add_node(&self, i: usize) {
        fake_nodes::register(&self.env, &self.nodes[i].name, TOPOLOGY_KEY).await;
    }

    async fn start_driver(&mut self, i: usize) {
        let driver_name = self.env.driver_name.clone();
        let node = &mut self.nodes[i];
        let _ = std::fs::remove_file(&node.socket);
        let mut command = Command::new(&self.driver_bin);
        match self.driver {
            DriverKind::CsiHostpath => {
                let mut config = csi_hostpath::Config::for_tests(&node.dir);
                config.driver_name = driver_name;
                config.node_id = node.name.clone();
                config.endpoint = node.socket.clone();
                config.state_dir = node.state_dir.clone();
                if let Some(bytes) = node.capacity {
                    config.capacity =
                        BTreeMap::from([("fast".to_owned(), u64::try_from(bytes).expect("bytes"))]);
                }
                command.args(config.to_args()).arg("--v=4");
            }
            DriverKind::Hostpathplugin => {
                std::fs::create_dir_all(&node.state_dir).expect("state dir");
                command
                    .arg(format!("--endpoint=unix://{}", node.socket.display()))
                    .arg(format!("--nodeid={}", node.name))
                    .arg(format!("--drivername={driver_name}"))
                    .arg(format!("--statedir={}", node.state_dir.display()))
                    .arg("--v=4");
                if let Some(bytes) = node.capacity {
                    command.arg(format!("--capacity=fast={bytes}"));
                }
            }
        }
        let name = match self.driver {
            DriverKind::CsiHostpath => "csi-hostpath",
            DriverKind::Hostpathplugin => "hostpathplugin",
        };
        node.driver = Some(
            GuardedChild::spawn(name, command, &node.dir.join("driver.log"))
                .unwrap_or_else(|e| panic!("spawn {name}: {e}")),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !node.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "{name} of {} did not listen on {}: {}",
                node.name,
                node.socket.display(),
                std::fs::read_to_string(node.dir.join("driver.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts node `i`'s sidecar in node deployment with `extra` flags and
    /// `POD_NAME` = `pod` when given.
    fn start_sidecar(&mut self, i: usize, extra: &[&str], pod: Option<&str>) {
        let node = &mut self.nodes[i];
        assert!(node.sidecar.is_none(), "sidecar of {} running", node.name);
        node.sidecar_runs += 1;
        let mut launch = Launch::new(&node.socket, &self.kubeconfig, &self.env.ns)
            .binary(&self.sidecar_bin)
            .args([
                "--node-deployment".to_owned(),
                format!("--node-deployment-base-delay={}", self.delays.0),
                format!("--node-deployment-max-delay={}", self.delays.1),
                "--timeout=10s".to_owned(),
            ])
            .args(extra)
            .env("NODE_NAME", &node.name);
        if let Some(pod) = pod {
            launch = launch.env("POD_NAME", pod);
        }
        let log = node.sidecar_log(node.sidecar_runs);
        node.sidecar = Some(launch.spawn("csi-provisioner", &log));
    }

    fn start_sidecars(&mut self, extra: &[&str]) {
        for i in 0..self.nodes.len() {
            self.start_sidecar(i, extra, None);
        }
    }

    /// SIGTERM; ours must exit 0 within 20 s (the Go image ends by the
    /// signal).
    fn stop_sidecar(&mut self, i: usize) {
        let mut child = self.nodes[i].sidecar.take().expect("sidecar running");
        let status = child.stop(Duration::from_secs(20));
        if self.sidecar_kind == SidecarKind::Go {
            return;
        }
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "sidecar of {} did not exit 0 on SIGTERM\n{}",
            self.nodes[i].name,
            self.logs()
        );
    }

    fn stop_sidecars(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].sidecar.is_some() {
                self.stop_sidecar(i);
            }
        }
    }

    /// Every sidecar log (the last 150 lines of each run), the drivers'
    /// and the scheduler's last lines.
    fn logs(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            for run in 1..=node.sidecar_runs {
                let text = std::fs::read_to_string(node.sidecar_log(run)).unwrap_or_default();
                out.push_str(&format!(
                    "--- sidecar ({}) of {} run {run} ---\n{}\n",
                    self.sidecar_kind.name(),
                    node.name,
                    tail(&text, 150)
                ));
            }
            let text = std::fs::read_to_string(node.dir.join("driver.log")).unwrap_or_default();
            out.push_str(&format!(
                "--- driver of {} ---\n{}\n",
                node.name,
                tail(&text, 30)
            ));
        }
        if let Some(plane) = self.env.plane() {
            out.push_str("--- kube-scheduler (last 30 lines) ---\n");
            out.push_str(&plane.log_tail("kube-scheduler", 30));
            out.push_str("\n--- kube-controller-manager (last 30 lines) ---\n");
            out.push_str(&plane.log_tail("kube-controller-manager", 30));
        }
        out
    }

    async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let context = || {
            format!(
                "for {timeout:?} (sidecar: {}, driver: {:?})\n{}",
                self.sidecar_kind.name(),
                self.driver,
                self.logs()
            )
        };
        support::poll(what, timeout, Duration::from_millis(100), check, context).await
    }

    /// Fails as soon as `check` returns `Some(reason)` within `window`: a
    /// condition that must hold for a while (a claim that must stay
    /// Pending).
    async fn hold<F, Fut>(&self, what: &str, window: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<String>>,
    {
        let deadline = Instant::now() + window;
        while Instant::now() < deadline {
            if let Some(broken) = check().await {
                panic!(
                    "{what} did not hold: {broken} (sidecar: {}, driver: {:?})\n{}",
                    self.sidecar_kind.name(),
                    self.driver,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The names (CreateVolume names, i.e. PV names) of the volumes on node
    /// `node`'s backend, sorted.
    async fn backend(&self, node: &str) -> Vec<String> {
        let side = &self.nodes[self.index(node)];
        for _ in 0..50 {
            let read = match self.driver {
                DriverKind::CsiHostpath => csi_hostpath::backend_volumes(&side.state_dir)
                    .map(|v| v.into_iter().map(|r| r.name).collect::<Vec<_>>())
                    .map_err(|e| e.to_string()),
                // {"Volumes": [{"VolName": ...}, ...], "Snapshots": [...]};
                // no file before the first volume.
                DriverKind::Hostpathplugin => {
                    match std::fs::read(side.state_dir.join("state.json")) {
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                        Err(e) => Err(e.to_string()),
                        Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
                            .map_err(|e| e.to_string())
                            .map(|state| {
                                state["Volumes"]
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                    .filter_map(|v| v["VolName"].as_str().map(str::to_owned))
                                    .collect()
                            }),
                    }
                }
            };
            if let Ok(mut names) = read {
                names.sort();
                return names;
            }
            // A state file being rewritten: read again.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("cannot read the backend of {node}");
    }

    /// Node → its backend's volume names, for every node.
    async fn backends(&self) -> BTreeMap<String, Vec<String>> {
        let mut all = BTreeMap::new();
        for name in self.node_names() {
            let volumes = self.backend(&name).await;
            all.insert(name, volumes);
        }
        all
    }

    /// The test's CSIDriver, with `storageCapacity` when the sidecars
    /// publish capacity.
    async fn csi_driver(&self, storage_capacity: bool) {
        self.env
            .create(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                "metadata": {"name": self.env.driver_name},
                "spec": {"attachRequired": false, "podInfoOnMount": false,
                    "storageCapacity": storage_capacity,
                    "volumeLifecycleModes": ["Persistent"]}}),
            )
            .await;
    }

    /// A pod using claim `claim`, pinned to `node` when given (by its
    /// hostname label), else placed by the scheduler.
    async fn pod(&self, name: &str, claim: &str, node: Option<&str>) {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": self.env.ns},
        "spec": {
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            "terminationGracePeriodSeconds": 0,
        }});
        match node {
            Some(node) => pod["spec"]["nodeSelector"] = json!({HOSTNAME: node}),
            // Only the test's nodes, whatever other tests' nodes offer.
            None => pod["spec"]["nodeSelector"] = json!({TEST_LABEL: self.env.id}),
        }
        self.env.create(pod).await;
    }

    async fn get_pod(&self, name: &str) -> Option<Pod> {
        Api::<Pod>::namespaced(self.env.client.clone(), &self.env.ns)
            .get_opt(name)
            .await
            .expect("get pod")
    }

    async fn claim(&self, name: &str) -> PersistentVolumeClaim {
        self.env
            .pvc(&self.env.ns, name)
            .await
            .unwrap_or_else(|| panic!("claim {name} exists"))
    }

    /// The node the pod was bound to, once the scheduler bound it.
    async fn wait_scheduled(&self, pod: &str) -> String {
        self.wait_for(
            &format!("pod {pod} bound to a node"),
            Duration::from_secs(90),
            || async { self.get_pod(pod).await?.spec?.node_name },
        )
        .await
    }

    /// The claim and its PV, once bound.
    async fn wait_bound(&self, claim: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        self.wait_for(
            &format!("claim {claim} bound"),
            Duration::from_secs(90),
            || async {
                let pvc = self.env.pvc(&self.env.ns, claim).await?;
                let volume = pvc.spec.as_ref()?.volume_name.clone()?;
                if pvc.status.as_ref()?.phase.as_deref() != Some("Bound") {
                    return None;
                }
                let pv = self.env.pv(&volume).await?;
                Some((pvc, pv))
            },
        )
        .await
    }

    /// The PVs of the test's driver.
    async fn pvs(&self) -> Vec<PersistentVolume> {
        Api::<PersistentVolume>::all(self.env.client.clone())
            .list(&Default::default())
            .await
            .expect("list pv")
            .items
            .into_iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == self.env.driver_name)
            })
            .collect()
    }

    /// Deletes the pods and claims and waits until every PV of the driver
    /// and every backend volume is gone.
    async fn delete_and_wait_clean(&self, pods: &[&str], claims: &[&str]) {
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
        self.wait_for(
            "every PV and backend volume deleted",
            Duration::from_secs(90),
            || async {
                let pvs = self.pvs().await;
                let backends = self.backends().await;
                (pvs.is_empty() && backends.values().all(Vec::is_empty)).then_some(())
            },
        )
        .await;
    }

    /// The test driver's CSIStorageCapacity objects of class `class` (short
    /// name) by the node of their segment.
    async fn capacities(&self, class: &str) -> BTreeMap<String, CSIStorageCapacity> {
        let class = self.env.class(class);
        Api::<CSIStorageCapacity>::namespaced(self.env.client.clone(), &self.env.ns)
            .list(&Default::default())
            .await
            .expect("list capacities")
            .items
            .into_iter()
            .filter(|o| {
                o.storage_class_name == class
                    && label(&o.metadata.labels, "csi.storage.k8s.io/drivername")
                        == self.env.driver_name
            })
            .map(|o| (segment_node(&o), o))
            .collect()
    }

    /// Waits until the published capacity per node is `want` (bytes).
    async fn wait_capacity(
        &self,
        class: &str,
        want: &BTreeMap<String, i64>,
    ) -> BTreeMap<String, CSIStorageCapacity> {
        self.wait_for(
            &format!("published capacity {want:?} of class {class}"),
            Duration::from_secs(60),
            || async {
                let found = self.capacities(class).await;
                let values: BTreeMap<String, i64> = found
                    .iter()
                    .map(|(node, o)| (node.clone(), capacity_bytes(o)))
                    .collect();
                (values == *want).then_some(found)
            },
        )
        .await
    }

    /// The pods the DaemonSet `name` made, by node (its controller puts the
    /// node in the pod's required node affinity).
    async fn daemon_set(&self, name: &str) -> (String, BTreeMap<String, String>) {
        let created = self
            .env
            .create(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": self.env.ns},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": {
                    "nodeSelector": {TEST_LABEL: self.env.id},
                    "schedulerName": format!("nobody-{}", self.env.id),
                    "containers": [{"name": "csi-provisioner", "image": "csi-provisioner"}],
                }},
            }}))
            .await;
        let uid = created["metadata"]["uid"].as_str().expect("uid").to_owned();
        let nodes = self.node_names();
        let pods = self
            .wait_for(
                &format!("a pod of DaemonSet {name} per node"),
                Duration::from_secs(60),
                || async {
                    let pods = Api::<Pod>::namespaced(self.env.client.clone(), &self.env.ns)
                        .list(&Default::default())
                        .await
                        .ok()?
                        .items;
                    let mut by_node = BTreeMap::new();
                    for pod in pods {
                        if !owned_by(&pod.metadata, &uid) {
                            continue;
                        }
                        if let Some(node) = daemon_pod_node(&pod) {
                            by_node.insert(node, pod.metadata.name.clone()?);
                        }
                    }
                    (by_node.keys().cloned().collect::<Vec<_>>() == nodes).then_some(by_node)
                },
            )
            .await;
        (uid, pods)
    }

    /// A Deployment of one replica; its ReplicaSet's uid and its pod's name.
    async fn deployment(&self, name: &str) -> (String, String, String, String) {
        let created = self
            .env
            .create(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": self.env.ns},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": {
                    "schedulerName": format!("nobody-{}", self.env.id),
                    "containers": [{"name": "csi-provisioner", "image": "csi-provisioner"}],
                }},
            }}))
            .await;
        let uid = created["metadata"]["uid"].as_str().expect("uid").to_owned();
        self.wait_for(
            &format!("the pod of Deployment {name}"),
            Duration::from_secs(60),
            || async {
                let sets = Api::<ReplicaSet>::namespaced(self.env.client.clone(), &self.env.ns)
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items;
                let set = sets.into_iter().find(|s| owned_by(&s.metadata, &uid))?;
                let set_uid = set.metadata.uid.clone()?;
                let set_name = set.metadata.name.clone()?;
                let pods = Api::<Pod>::namespaced(self.env.client.clone(), &self.env.ns)
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items;
                let pod = pods.into_iter().find(|p| owned_by(&p.metadata, &set_uid))?;
                Some((uid.clone(), set_name, set_uid, pod.metadata.name?))
            },
        )
        .await
    }

    /// Removes the test's cluster-scoped objects (nodes, CSINodes, node
    /// Leases, CSIDriver) after stopping every process (and prints every
    /// log first when `REAL_SCHEDULING_LOGS` is set).
    async fn finish(mut self) {
        self.stop_sidecars();
        if std::env::var_os("REAL_SCHEDULING_LOGS").is_some() {
            eprintln!(
                "=== logs of {} ===\n{}",
                support::current_test(),
                self.logs()
            );
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

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
    }
}

/// The upstream Go `csi-provisioner` (binary, kubeconfig, user), its user
/// bound to the stock RBAC rules plus `get` on DaemonSets and Deployments;
/// `None` when the binary is missing and skipping is allowed (said once).
async fn go_image(env: &Env) -> Option<(PathBuf, PathBuf, String)> {
    let bin = env.upstream_binary("csi-provisioner")?;
    let user = format!("go-{}", env.id);
    let (cluster_rules, mut namespace_rules) = support::upstream_stock_rules();
    // The stock Role reads pods and ReplicaSets for the owner chain; a
    // DaemonSet or Deployment owner needs these too.
    if let Some(rules) = namespace_rules.as_array_mut() {
        rules.push(json!({"apiGroups": ["apps"],
            "resources": ["daemonsets", "deployments"], "verbs": ["get"]}));
    }
    env.grant_rules(&user, cluster_rules, namespace_rules).await;
    let plane = env.plane().expect("real cluster");
    let kubeconfig = plane.kubeconfig_for(&user, None).expect("kubeconfig");
    Some((bin, kubeconfig, user))
}

fn label(labels: &Option<BTreeMap<String, String>>, key: &str) -> String {
    labels
        .as_ref()
        .and_then(|l| l.get(key).cloned())
        .unwrap_or_default()
}

fn segment_node(o: &CSIStorageCapacity) -> String {
    o.node_topology
        .as_ref()
        .and_then(|t| t.match_labels.as_ref())
        .and_then(|l| l.get(TOPOLOGY_KEY).cloned())
        .unwrap_or_default()
}

fn pv_name(pv: &PersistentVolume) -> String {
    pv.metadata.name.clone().unwrap_or_default()
}

/// The topology values of the PV's required node affinity.
fn affinity_nodes(pv: &PersistentVolume) -> Vec<String> {
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

fn identity(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .and_then(|c| c.volume_attributes.as_ref())
        .and_then(|a| a.get(IDENTITY_ATTRIBUTE))
        .cloned()
        .unwrap_or_default()
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

/// Whether `uid` is among the object's owners.
fn owned_by(metadata: &ObjectMeta, uid: &str) -> bool {
    metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid)
}

fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

// ---------------------------------------------------------------------------
// Part 2: capacity with the real kube-scheduler.
// ---------------------------------------------------------------------------

/// No ProvisioningFailed on the claim: the scheduler chose a node with room
/// at once (a node without room makes the driver refuse, the sidecar report
/// it and the scheduler try again elsewhere).
async fn assert_placed_at_the_first_try(c: &Cluster, claim: &str) {
    let failures: Vec<(String, String)> = c
        .env
        .events(&c.env.ns, claim)
        .await
        .into_iter()
        .filter(|(reason, _)| reason == "ProvisioningFailed")
        .collect();
    assert!(
        failures.is_empty(),
        "{claim} was placed on a node without room first: {failures:?}\n{}",
        c.logs()
    );
}

each_driver_and_image!(capacity_steers_the_scheduler:
    capacity_steers_the_scheduler_csi_hostpath,
    capacity_steers_the_scheduler_hostpathplugin,
    capacity_steers_the_scheduler_go_image_hostpathplugin
);

/// Two nodes, 256Mi and 512Mi of kind `fast`; a CSIDriver with
/// `storageCapacity: true`; one sidecar per node publishing its own
/// segment, owned (level 1) by the DaemonSet its pod belongs to.
///
/// - A pod with a 300Mi claim fits only on b: the scheduler selects b, b's
///   sidecar provisions there (PV affinity b, volume on b's backend only),
///   b's published capacity shrinks to 212Mi (the poll interval is an hour:
///   the refresh after provisioning does it).
/// - A pod with a 230Mi claim now fits only on a (it would have fitted on
///   b before): placed on a at the first try (no failed provisioning).
/// - A pod with a 400Mi claim fits nowhere: FailedScheduling for lack of
///   storage, no node selected, nothing provisioned.
/// - Deleting everything gives the capacity back; deleting the DaemonSet
///   makes the garbage collector delete the objects it owns.
async fn capacity_steers_the_scheduler(backend: Backend, driver: DriverKind, sidecar: SidecarKind) {
    let nodes = vec![("a", Some(256 * MI)), ("b", Some(512 * MI))];
    let setup = Setup {
        capacity: true,
        ..Setup::new(driver, sidecar, nodes)
    };
    let Some(mut c) = Cluster::new(backend, setup).await else {
        return;
    };
    let (a, b) = (c.node("a"), c.node("b"));
    c.env
        .storage_class(
            "local",
            "WaitForFirstConsumer",
            "Delete",
            json!({"kind": "fast"}),
        )
        .await;
    let (ds_uid, ds_pods) = c.daemon_set("csi-node").await;
    let ns = c.env.ns.clone();
    for i in 0..c.nodes.len() {
        let pod = ds_pods[&c.nodes[i].name].clone();
        c.start_sidecar(
            i,
            &[
                "--enable-capacity",
                "--capacity-ownerref-level=1",
                "--capacity-poll-interval=1h",
            ],
            Some(&pod),
        );
    }

    let published = c
        .wait_capacity(
            "local",
            &BTreeMap::from([(a.clone(), 256 * MI), (b.clone(), 512 * MI)]),
        )
        .await;
    for (node, o) in &published {
        assert_eq!(
            o.metadata.owner_references.clone().unwrap_or_default(),
            vec![owner("apps/v1", "DaemonSet", "csi-node", &ds_uid)],
            "owner of {node}'s object (level 1: the DaemonSet)"
        );
        assert_eq!(
            label(&o.metadata.labels, "csi.storage.k8s.io/managed-by"),
            format!("external-provisioner-{node}"),
            "each node manages its own objects"
        );
        assert_eq!(
            o.maximum_volume_size.as_ref().map(|q| quantity_bytes(&q.0)),
            Some(capacity_bytes(o)),
            "{node}: maximum volume size"
        );
    }

    // 300Mi: only b has room.
    c.env
        .create_pvc(&ns, "big", "local", "300Mi", json!({}))
        .await;
    c.pod("app-big", "big", None).await;
    let (pvc, pv) = c.wait_bound("big").await;
    assert_eq!(selected_node(&pvc).as_deref(), Some(b.as_str()), "big");
    assert_eq!(affinity_nodes(&pv), vec![b.clone()], "PV of big");
    assert!(
        identity(&pv).ends_with(&format!("-{b}")),
        "{}",
        identity(&pv)
    );
    assert_eq!(c.wait_scheduled("app-big").await, b);
    assert_placed_at_the_first_try(&c, "big").await;
    let big = pv_name(&pv);
    assert_eq!(
        c.backends().await,
        BTreeMap::from([(a.clone(), vec![]), (b.clone(), vec![big.clone()])])
    );
    c.wait_capacity(
        "local",
        &BTreeMap::from([(a.clone(), 256 * MI), (b.clone(), 212 * MI)]),
    )
    .await;

    // 230Mi: b had room before the first volume, now only a has.
    c.env
        .create_pvc(&ns, "medium", "local", "230Mi", json!({}))
        .await;
    c.pod("app-medium", "medium", None).await;
    let (pvc, pv) = c.wait_bound("medium").await;
    assert_eq!(selected_node(&pvc).as_deref(), Some(a.as_str()), "medium");
    assert_eq!(affinity_nodes(&pv), vec![a.clone()], "PV of medium");
    assert_eq!(c.wait_scheduled("app-medium").await, a);
    assert_placed_at_the_first_try(&c, "medium").await;
    let medium = pv_name(&pv);
    assert_eq!(
        c.backends().await,
        BTreeMap::from([(a.clone(), vec![medium]), (b.clone(), vec![big])])
    );
    c.wait_capacity(
        "local",
        &BTreeMap::from([(a.clone(), 26 * MI), (b.clone(), 212 * MI)]),
    )
    .await;

    // 400Mi: nowhere.
    c.env
        .create_pvc(&ns, "huge", "local", "400Mi", json!({}))
        .await;
    c.pod("app-huge", "huge", None).await;
    let message = c
        .wait_for(
            "FailedScheduling of app-huge",
            Duration::from_secs(60),
            || async {
                c.env
                    .events(&ns, "app-huge")
                    .await
                    .into_iter()
                    .find(|(reason, _)| reason == "FailedScheduling")
                    .map(|(_, message)| message)
            },
        )
        .await;
    assert!(
        message.contains("did not have enough free storage"),
        "FailedScheduling names the lack of storage: {message}"
    );
    c.hold(
        "app-huge unscheduled, huge without a node",
        Duration::from_secs(2),
        || async {
            let pvc = c.claim("huge").await;
            let pod = c.get_pod("app-huge").await?;
            let node = pod.spec.and_then(|s| s.node_name);
            (selected_node(&pvc).is_some() || node.is_some())
                .then(|| format!("selected {:?}, pod on {node:?}", selected_node(&pvc)))
        },
    )
    .await;
    assert_eq!(c.pvs().await.len(), 2);

    c.delete_and_wait_clean(
        &["app-big", "app-medium", "app-huge"],
        &["big", "medium", "huge"],
    )
    .await;
    c.wait_capacity(
        "local",
        &BTreeMap::from([(a.clone(), 256 * MI), (b.clone(), 512 * MI)]),
    )
    .await;
    if sidecar == SidecarKind::Ours {
        c.env.assert_nothing_forbidden();
    }

    // The owner goes (after its pods' sidecars): so do its objects.
    c.stop_sidecars();
    let propagation = DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(c.env.client.clone(), &ns)
        .delete("csi-node", &propagation)
        .await
        .expect("delete DaemonSet");
    c.wait_for(
        "the garbage collector deleting the DaemonSet's capacity objects",
        Duration::from_secs(60),
        || async { c.capacities("local").await.is_empty().then_some(()) },
    )
    .await;
    c.finish().await;
}

/// `--capacity-ownerref-level` per level, ours and the Go image on the
/// same node, driver (`csi-hostpath`; the owner does not depend on the
/// driver) and pods: the owner reference each writes must be the expected
/// one and the same for both; where the chain ends too early both refuse
/// to start and publish nothing.
async fn capacity_owner_follows_the_level_as_the_go_image(backend: Backend) {
    let nodes = vec![("a", Some(256 * MI))];
    let setup = Setup {
        capacity: true,
        ..Setup::new(DriverKind::CsiHostpath, SidecarKind::Ours, nodes)
    };
    let Some(mut c) = Cluster::new(backend, setup).await else {
        return;
    };
    let a = c.node("a");
    c.env
        .storage_class(
            "local",
            "WaitForFirstConsumer",
            "Delete",
            json!({"kind": "fast"}),
        )
        .await;
    let (ds_uid, ds_pods) = c.daemon_set("csi-node").await;
    let ds_pod = ds_pods[&a].clone();
    let (dep_uid, rs_name, rs_uid, dep_pod) = c.deployment("csi-controller").await;
    let ds_pod_uid = c
        .get_pod(&ds_pod)
        .await
        .and_then(|p| p.metadata.uid)
        .expect("pod uid");

    // The Go image, when it is there.
    let go = go_image(&c.env)
        .await
        .map(|(bin, kubeconfig, _)| (bin, kubeconfig));
    let ours = (c.sidecar_bin.clone(), c.kubeconfig.clone());

    // (level, POD_NAME, the expected owner; None: the sidecar refuses)
    let cases: Vec<(i32, &str, Option<Option<OwnerReference>>)> = vec![
        (-1, ds_pod.as_str(), Some(None)),
        (
            0,
            ds_pod.as_str(),
            Some(Some(owner("v1", "Pod", &ds_pod, &ds_pod_uid))),
        ),
        (
            1,
            ds_pod.as_str(),
            Some(Some(owner("apps/v1", "DaemonSet", "csi-node", &ds_uid))),
        ),
        (
            1,
            dep_pod.as_str(),
            Some(Some(owner("apps/v1", "ReplicaSet", &rs_name, &rs_uid))),
        ),
        (
            2,
            dep_pod.as_str(),
            Some(Some(owner(
                "apps/v1",
                "Deployment",
                "csi-controller",
                &dep_uid,
            ))),
        ),
        // A DaemonSet has no controller: nothing at level 2.
        (2, ds_pod.as_str(), None),
    ];
    let mut report = Vec::new();
    for (level, pod, expected) in cases {
        let mut seen: Vec<(SidecarKind, Option<Vec<OwnerReference>>)> = Vec::new();
        let binaries = [
            (SidecarKind::Ours, Some(ours.clone())),
            (SidecarKind::Go, go.clone()),
        ];
        for (kind, binary) in binaries {
            let Some((bin, kubeconfig)) = binary else {
                continue;
            };
            c.sidecar_bin = bin;
            c.kubeconfig = kubeconfig;
            c.sidecar_kind = kind;
            // Each case starts without objects (an object of another owner
            // would be adopted, which is not what is compared here). Deleted
            // again on each look: on a loaded machine a delete request can
            // fail, and nothing runs that would re-create them.
            c.wait_for("no capacity object", Duration::from_secs(30), || async {
                let left = c.capacities("local").await;
                for o in left.values() {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    c.env
                        .delete("storage.k8s.io/v1", "CSIStorageCapacity", &c.env.ns, &name)
                        .await;
                }
                left.is_empty().then_some(())
            })
            .await;
            let level_flag = format!("--capacity-ownerref-level={level}");
            c.start_sidecar(
                0,
                &[
                    "--enable-capacity",
                    &level_flag,
                    "--capacity-poll-interval=1h",
                ],
                Some(pod),
            );
            match &expected {
                Some(want) => {
                    let found = c
                        .wait_for(
                            &format!(
                                "the capacity object at level {level} from {pod} ({})",
                                kind.name()
                            ),
                            Duration::from_secs(60),
                            || async { c.capacities("local").await.remove(&a) },
                        )
                        .await;
                    let owners = found.metadata.owner_references.clone();
                    assert_eq!(
                        owners.clone().unwrap_or_default(),
                        want.iter().cloned().collect::<Vec<_>>(),
                        "level {level} from {pod} ({})\n{}",
                        kind.name(),
                        c.logs()
                    );
                    report.push(format!("level {level} {pod} {}: {owners:?}", kind.name()));
                    seen.push((kind, owners));
                    c.stop_sidecar(0);
                }
                None => {
                    let mut child = c.nodes[0].sidecar.take().expect("sidecar");
                    let status = c
                        .wait_for(
                            &format!("the sidecar ({}) to refuse level {level}", kind.name()),
                            Duration::from_secs(60),
                            || {
                                let exited = child.try_wait();
                                async move { exited }
                            },
                        )
                        .await;
                    assert!(
                        !status.success(),
                        "level {level} from {pod} ({}): {status}",
                        kind.name()
                    );
                    assert!(
                        c.capacities("local").await.is_empty(),
                        "nothing published when the owner cannot be found ({})",
                        kind.name()
                    );
                    let log =
                        std::fs::read_to_string(c.nodes[0].sidecar_log(c.nodes[0].sidecar_runs))
                            .unwrap_or_default();
                    let why = log
                        .lines()
                        .rev()
                        .find(|l| l.to_ascii_lowercase().contains("owner"))
                        .unwrap_or_default();
                    report.push(format!(
                        "level {level} {pod} {}: exited {status}: {why}",
                        kind.name()
                    ));
                    if kind == SidecarKind::Ours {
                        assert!(
                            log.contains("has no controlling owner"),
                            "ours says why\n{log}"
                        );
                    }
                }
            }
        }
        if let [(_, ours), (_, go)] = seen.as_slice() {
            assert_eq!(ours, go, "level {level} from {pod}: ours vs the Go image");
        }
    }
    eprintln!("owner references per level:\n{}", report.join("\n"));
    c.finish().await;
}

// ---------------------------------------------------------------------------
// Part 3: node deployment on the real cluster.
// ---------------------------------------------------------------------------

each_driver_and_image!(node_sidecars_provision_only_their_nodes_claims:
    node_sidecars_provision_only_their_nodes_claims_csi_hostpath,
    node_sidecars_provision_only_their_nodes_claims_hostpathplugin,
    node_sidecars_provision_only_their_nodes_claims_go_image_hostpathplugin
);

/// Two nodes, a sidecar and a driver each, no capacity tracking.
///
/// - A pod pinned to each node: the scheduler selects that node for its
///   WaitForFirstConsumer claim and only that node's sidecar provisions it
///   (volume on that backend only, PV affinity and provisioner identity of
///   that node).
/// - a's sidecar stopped: a new claim for a stays Pending (selected, no
///   PV, nothing on a's backend) while b goes on (its claim, and Immediate
///   claims, which b alone takes now).
/// - a's sidecar started again: a's claim is provisioned on a and its pod
///   bound there.
async fn node_sidecars_provision_only_their_nodes_claims(
    backend: Backend,
    driver: DriverKind,
    sidecar: SidecarKind,
) {
    let setup = Setup::new(driver, sidecar, vec![("a", None), ("b", None)]);
    let Some(mut c) = Cluster::new(backend, setup).await else {
        return;
    };
    let (a, b) = (c.node("a"), c.node("b"));
    let ns = c.env.ns.clone();
    c.env
        .storage_class("local", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    c.env
        .storage_class("shared", "Immediate", "Delete", json!({}))
        .await;
    c.start_sidecars(&[]);

    for node in [&a, &b] {
        let claim = format!("first-{}", &node[node.len() - 1..]);
        c.env
            .create_pvc(&ns, &claim, "local", "5Mi", json!({}))
            .await;
        c.pod(&format!("app-{claim}"), &claim, Some(node)).await;
    }
    let mut on: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in [&a, &b] {
        let claim = format!("first-{}", &node[node.len() - 1..]);
        let (pvc, pv) = c.wait_bound(&claim).await;
        assert_eq!(
            selected_node(&pvc).as_deref(),
            Some(node.as_str()),
            "{claim}"
        );
        assert_eq!(affinity_nodes(&pv), vec![node.clone()], "PV of {claim}");
        assert!(
            identity(&pv).ends_with(&format!("-{node}")),
            "{claim}: identity {} names its node",
            identity(&pv)
        );
        assert_eq!(c.wait_scheduled(&format!("app-{claim}")).await, *node);
        on.entry(node.clone()).or_default().push(pv_name(&pv));
    }
    assert_eq!(c.backends().await, on, "each volume on its node only");

    // a's sidecar goes away.
    c.stop_sidecar(0);
    c.env
        .create_pvc(&ns, "later-a", "local", "5Mi", json!({}))
        .await;
    c.pod("app-later-a", "later-a", Some(&a)).await;
    c.env
        .create_pvc(&ns, "later-b", "local", "5Mi", json!({}))
        .await;
    c.pod("app-later-b", "later-b", Some(&b)).await;
    let immediate = ["imm-0", "imm-1", "imm-2"];
    for claim in immediate {
        c.env
            .create_pvc(&ns, claim, "shared", "5Mi", json!({}))
            .await;
    }
    let (_, pv) = c.wait_bound("later-b").await;
    assert_eq!(affinity_nodes(&pv), vec![b.clone()]);
    on.entry(b.clone()).or_default().push(pv_name(&pv));
    for claim in immediate {
        let (pvc, pv) = c.wait_bound(claim).await;
        assert_eq!(
            selected_node(&pvc).as_deref(),
            Some(b.as_str()),
            "{claim}: only b runs"
        );
        assert_eq!(affinity_nodes(&pv), vec![b.clone()], "PV of {claim}");
        on.entry(b.clone()).or_default().push(pv_name(&pv));
    }
    assert_eq!(c.wait_scheduled("app-later-b").await, b);
    c.wait_for(
        "the scheduler selecting a for later-a",
        Duration::from_secs(60),
        || async {
            (selected_node(&c.claim("later-a").await).as_deref() == Some(a.as_str())).then_some(())
        },
    )
    .await;
    for volumes in on.values_mut() {
        volumes.sort();
    }
    c.hold(
        "later-a Pending while a's sidecar is stopped",
        HOLD,
        || async {
            let pvc = c.claim("later-a").await;
            let phase = pvc.status.as_ref().and_then(|s| s.phase.clone());
            let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
            if phase.as_deref() != Some("Pending") || volume.is_some() {
                return Some(format!("phase {phase:?}, volume {volume:?}"));
            }
            let backends = c.backends().await;
            (backends != on).then(|| format!("backends {backends:?}, expected {on:?}"))
        },
    )
    .await;
    assert_eq!(
        c.get_pod("app-later-a")
            .await
            .and_then(|p| p.spec?.node_name),
        None,
        "app-later-a waits for its volume"
    );

    // a is back: its claim is provisioned there.
    c.start_sidecar(0, &[], None);
    let (pvc, pv) = c.wait_bound("later-a").await;
    assert_eq!(selected_node(&pvc).as_deref(), Some(a.as_str()));
    assert_eq!(affinity_nodes(&pv), vec![a.clone()], "PV of later-a");
    assert_eq!(c.wait_scheduled("app-later-a").await, a);
    on.entry(a.clone()).or_default().push(pv_name(&pv));
    for volumes in on.values_mut() {
        volumes.sort();
    }
    assert_eq!(c.backends().await, on);

    let mut claims = vec!["first-a", "first-b", "later-a", "later-b"];
    claims.extend(immediate);
    c.delete_and_wait_clean(
        &["app-first-a", "app-first-b", "app-later-a", "app-later-b"],
        &claims,
    )
    .await;
    if sidecar == SidecarKind::Ours {
        c.env.assert_nothing_forbidden();
    }
    c.finish().await;
}

each_driver_and_image!(immediate_claims_get_one_owner_and_one_volume:
    immediate_claims_get_one_owner_and_one_volume_csi_hostpath,
    immediate_claims_get_one_owner_and_one_volume_hostpathplugin,
    immediate_claims_get_one_owner_and_one_volume_go_image_hostpathplugin
);

/// Three nodes racing for Immediate claims (delays of a few milliseconds,
/// so they try at nearly the same time): each claim gets one owner (the
/// selected-node annotation written once, by one sidecar; the others'
/// attempts end in conflicts), and exactly one volume, on the owner's
/// backend, across all three drivers; nothing is left after deletion.
async fn immediate_claims_get_one_owner_and_one_volume(
    backend: Backend,
    driver: DriverKind,
    sidecar: SidecarKind,
) {
    let nodes = vec![("a", None), ("b", None), ("c", None)];
    let setup = Setup {
        delays: ("5ms", "50ms"),
        ..Setup::new(driver, sidecar, nodes)
    };
    let Some(mut c) = Cluster::new(backend, setup).await else {
        return;
    };
    let ns = c.env.ns.clone();
    let nodes: BTreeSet<String> = c.node_names().into_iter().collect();
    c.env
        .storage_class("shared", "Immediate", "Delete", json!({}))
        .await;
    c.start_sidecars(&[]);
    let claims: Vec<String> = (0..9).map(|i| format!("race-{i}")).collect();
    for claim in &claims {
        c.env
            .create_pvc(&ns, claim, "shared", "5Mi", json!({}))
            .await;
    }
    let mut expected: BTreeMap<String, Vec<String>> =
        nodes.iter().map(|n| (n.clone(), Vec::new())).collect();
    let mut pvs = BTreeSet::new();
    for claim in &claims {
        let (pvc, pv) = c.wait_bound(claim).await;
        let owner = selected_node(&pvc)
            .unwrap_or_else(|| panic!("{claim}: bound without a selected node\n{}", c.logs()));
        assert!(nodes.contains(&owner), "{claim}: owner {owner}");
        assert_eq!(affinity_nodes(&pv), vec![owner.clone()], "PV of {claim}");
        assert!(
            identity(&pv).ends_with(&format!("-{owner}")),
            "{claim}: PV made by {} but owned by {owner}",
            identity(&pv)
        );
        expected
            .get_mut(&owner)
            .expect("known node")
            .push(pv_name(&pv));
        pvs.insert(pv_name(&pv));
    }
    for volumes in expected.values_mut() {
        volumes.sort();
    }
    assert_eq!(pvs.len(), claims.len(), "one PV per claim");
    // A loser acting late would add a volume somewhere: watch a while.
    c.hold(
        "exactly one volume per claim, on its owner's backend",
        HOLD,
        || async {
            let backends = c.backends().await;
            (backends != expected).then(|| format!("backends {backends:?}, expected {expected:?}"))
        },
    )
    .await;
    assert_eq!(c.pvs().await.len(), claims.len());

    // One owner each: exactly one successful write of each claim by the
    // sidecars (the annotation); every other attempt was refused.
    let plane = c.env.plane().expect("real cluster");
    let mut writes: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for r in plane.audit() {
        let Some(object) = &r.object_ref else {
            continue;
        };
        if r.user.username == c.user
            && object.resource == "persistentvolumeclaims"
            && object.subresource.is_empty()
            && object.namespace == ns
            && (r.verb == "update" || r.verb == "patch")
            && r.stage == "ResponseComplete"
        {
            writes
                .entry(object.name.clone())
                .or_default()
                .push(r.code());
        }
    }
    for claim in &claims {
        let codes = writes.get(claim).cloned().unwrap_or_default();
        let successes = codes.iter().filter(|code| **code < 300).count();
        assert_eq!(
            successes,
            1,
            "{claim}: claim writes by the sidecars (HTTP codes) {codes:?}\n{}",
            c.logs()
        );
    }
    eprintln!("claim writes by the sidecars (HTTP codes): {writes:?}");

    let claim_names: Vec<&str> = claims.iter().map(String::as_str).collect();
    c.delete_and_wait_clean(&[], &claim_names).await;
    if sidecar == SidecarKind::Ours {
        c.env.assert_nothing_forbidden();
    }
    c.finish().await;
}
