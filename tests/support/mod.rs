//! End-to-end harness: the real `csi-provisioner` binary as a child process,
//! the Kubernetes API test server over HTTP (controller-manager helpers and
//! garbage collector on), and the hostpath CSI driver in-process.

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_hostpath::faults::{self, Fault, Faults};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use kube_testserver::{HttpServer, TestServer};
use serde_json::json;
use tokio::sync::oneshot;

pub const DRIVER: &str = csi_hostpath::DEFAULT_DRIVER_NAME;
pub const NODE: &str = "test-node";

pub struct Env {
    pub dir: tempfile::TempDir,
    pub api: TestServer,
    pub http: HttpServer,
    pub client: kube::Client,
    pub driver: csi_hostpath::Config,
    driver_stop: Option<oneshot::Sender<()>>,
    driver_task: Option<tokio::task::JoinHandle<()>>,
    pub sidecar: Option<Child>,
    sidecar_runs: u32,
}

impl Env {
    /// API server and driver up; no sidecar yet.
    pub async fn new() -> Env {
        Env::new_with_driver(|_| {}).await
    }

    /// As [`Env::new`], with the driver's configuration adjusted first
    /// (capacity per kind, topology off, ...).
    pub async fn new_with_driver(configure: impl FnOnce(&mut csi_hostpath::Config)) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let api = TestServer::builder()
            .controller_manager(true)
            .gc(true)
            .build();
        let http = api.serve_http().await.expect("http");
        let client = api.client();
        let mut driver = csi_hostpath::Config::for_tests(dir.path());
        driver.node_id = NODE.to_owned();
        configure(&mut driver);
        let mut env = Env {
            dir,
            api,
            http,
            client,
            driver,
            driver_stop: None,
            driver_task: None,
            sidecar: None,
            sidecar_runs: 0,
        };
        env.create_namespace("default");
        env.add_node(NODE);
        env.start_driver();
        env
    }

    pub fn create_namespace(&self, name: &str) {
        let _ = self.api.create_object(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        );
    }

    /// A Node with the driver's topology label and its CSINode, as the
    /// kubelet and the node-driver-registrar would create them.
    pub fn add_node(&self, name: &str) {
        self.api
            .create_object(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {csi_hostpath::TOPOLOGY_KEY: name}}}))
            .expect("node");
        self.api
            .create_object(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": name},
                "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "topologyKeys": [csi_hostpath::TOPOLOGY_KEY]}]}}))
            .expect("csinode");
    }

    pub fn start_driver(&mut self) {
        let (tx, rx) = oneshot::channel::<()>();
        let config = self.driver.clone();
        self.driver_stop = Some(tx);
        self.driver_task = Some(tokio::spawn(async move {
            if let Err(e) = csi_hostpath::serve(config, async {
                let _ = rx.await;
            })
            .await
            {
                eprintln!("hostpath driver stopped: {e}");
            }
        }));
    }

    pub async fn stop_driver(&mut self) {
        if let Some(tx) = self.driver_stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.driver_task.take() {
            let _ = task.await;
        }
    }

    pub fn log_path(&self, run: u32) -> PathBuf {
        self.dir.path().join(format!("sidecar-{run}.log"))
    }

    /// Starts the sidecar with our standard flags plus `extra`.
    pub fn start_sidecar(&mut self, extra: &[&str]) {
        self.start_sidecar_with_env(extra, &[]);
    }

    /// As [`Env::start_sidecar`], with extra environment variables (e.g.
    /// `POD_NAME`).
    pub fn start_sidecar_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) {
        assert!(self.sidecar.is_none(), "sidecar already running");
        self.sidecar_runs += 1;
        let log = std::fs::File::create(self.log_path(self.sidecar_runs)).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
            .arg(format!("--csi-address={}", self.driver.endpoint.display()))
            .arg(format!(
                "--kubeconfig={}",
                self.http.kubeconfig_path().display()
            ))
            .arg("--retry-interval-start=100ms")
            .arg("--retry-interval-max=1s")
            .arg("--timeout=5s")
            .arg("--v=4")
            .args(extra)
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .env("NAMESPACE", "default")
            .env_remove("POD_NAME")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn csi-provisioner");
        self.sidecar = Some(child);
    }

    /// SIGKILL: no chance to clean up, as in a node crash.
    pub fn kill_sidecar(&mut self) {
        if let Some(mut child) = self.sidecar.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop_sidecar(&mut self) -> Option<i32> {
        let mut child = self.sidecar.take()?;
        let pid = nix_pid(&child);
        // SAFETY-free: plain kill(2) through the `kill` command keeps the
        // harness free of unsafe code.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "sidecar did not stop on SIGTERM within 20s\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// All sidecar logs so far, for failure messages.
    pub fn logs(&self) -> String {
        (1..=self.sidecar_runs)
            .map(|run| {
                let text = std::fs::read_to_string(self.log_path(run)).unwrap_or_default();
                format!("--- sidecar run {run} ---\n{text}")
            })
            .collect()
    }

    pub fn set_faults(&self, rules: Vec<Fault>) {
        Faults::with_rules(rules)
            .write(&self.driver.faults_file)
            .expect("faults file");
    }

    pub fn clear_faults(&self) {
        faults::clear(&self.driver.faults_file).expect("clear faults");
    }

    /// The driver's volumes. A volume deleted between the directory listing
    /// and the read of its record makes one read fail: read again.
    pub fn backend_volumes(&self) -> Vec<csi_hostpath::VolumeRecord> {
        let mut last_error = None;
        for _ in 0..20 {
            match csi_hostpath::backend_volumes(&self.driver.state_dir) {
                Ok(volumes) => return volumes,
                Err(e) => last_error = Some(e),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("cannot read the backend volumes: {last_error:?}");
    }

    pub fn storage_class(
        &self,
        name: &str,
        binding: &str,
        reclaim: &str,
        params: serde_json::Value,
    ) {
        self.api
            .create_object(json!({
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": name},
                "provisioner": DRIVER,
                "reclaimPolicy": reclaim,
                "volumeBindingMode": binding,
                "parameters": params,
            }))
            .expect("storage class");
    }

    pub async fn create_pvc(
        &self,
        namespace: &str,
        name: &str,
        class: &str,
        size: &str,
        extra: serde_json::Value,
    ) -> PersistentVolumeClaim {
        let mut pvc = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "resources": {"requests": {"storage": size}},
            },
        });
        merge(&mut pvc, extra);
        let pvc: PersistentVolumeClaim = serde_json::from_value(pvc).expect("pvc json");
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &pvc)
            .await
            .expect("create pvc")
    }

    pub async fn delete_pvc(&self, namespace: &str, name: &str) {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete pvc");
    }

    pub async fn pvc(&self, namespace: &str, name: &str) -> Option<PersistentVolumeClaim> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .expect("get pvc")
    }

    pub async fn pv(&self, name: &str) -> Option<PersistentVolume> {
        Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(name)
            .await
            .expect("get pv")
    }

    pub async fn pvs(&self) -> Vec<PersistentVolume> {
        Api::<PersistentVolume>::all(self.client.clone())
            .list(&Default::default())
            .await
            .expect("list pv")
            .items
    }

    /// (reason, message) of the events about the object `name` in
    /// `namespace` (`default` for cluster-scoped objects).
    pub async fn events(&self, namespace: &str, name: &str) -> Vec<(String, String)> {
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(self.client.clone(), namespace)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Creates a 5Mi claim of `class` and waits until it is bound; returns
    /// the PV and its name.
    pub async fn provision(
        &self,
        namespace: &str,
        claim: &str,
        class: &str,
    ) -> (PersistentVolume, String) {
        self.create_pvc(namespace, claim, class, "5Mi", json!({}))
            .await;
        let pv = self.wait_bound(namespace, claim).await;
        let name = pv.metadata.name.clone().expect("PV name");
        (pv, name)
    }

    /// The PV bound to a claim, once the sidecar created it and the
    /// controller-manager helper bound them.
    pub async fn wait_bound(&self, namespace: &str, name: &str) -> PersistentVolume {
        let what = format!("claim {namespace}/{name} bound");
        self.wait_for(&what, Duration::from_secs(30), || async {
            let pvc = self.pvc(namespace, name).await?;
            let volume = pvc.spec.as_ref()?.volume_name.clone()?;
            let phase = pvc.status.as_ref()?.phase.clone()?;
            if phase != "Bound" {
                return None;
            }
            self.pv(&volume).await
        })
        .await
    }

    /// Polls `check` until it returns `Some`, failing with the sidecar logs
    /// after `timeout`.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every backend volume is recorded in a PV of ours and every PV of ours
    /// has its backend volume (no leak, no orphan).
    pub async fn assert_consistent(&self) {
        let pvs = self.pvs().await;
        let handles: Vec<String> = pvs
            .iter()
            .filter_map(|pv| pv.spec.as_ref()?.csi.as_ref())
            .filter(|csi| csi.driver == DRIVER)
            .map(|csi| csi.volume_handle.clone())
            .collect();
        let backend: Vec<String> = self.backend_volumes().into_iter().map(|v| v.id).collect();
        for id in &backend {
            assert!(
                handles.contains(id),
                "backend volume {id} has no PV (leak)\nPVs: {handles:?}\n{}",
                self.logs()
            );
        }
        for handle in &handles {
            assert!(
                backend.contains(handle),
                "PV with handle {handle} has no backend volume (orphan)\n{}",
                self.logs()
            );
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.kill_sidecar();
        if let Some(tx) = self.driver_stop.take() {
            let _ = tx.send(());
        }
    }
}

fn nix_pid(child: &Child) -> u32 {
    child.id()
}

/// JSON merge of `extra` into `base` (objects merged, the rest replaced).
pub fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => {
            if !e.is_null() {
                *b = e;
            }
        }
    }
}

pub fn finalizers(pv: &PersistentVolume) -> Vec<String> {
    pv.metadata.finalizers.clone().unwrap_or_default()
}

pub fn state_dir(env: &Env) -> &Path {
    &env.driver.state_dir
}
