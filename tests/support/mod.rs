//! End-to-end harness: the real `csi-provisioner` binary as a child process
//! and the hostpath CSI driver in-process, against one of two API servers:
//!
//! - [`Backend::TestServer`]: our in-memory API test server over HTTP, one per
//!   test, with its controller-manager helpers and garbage collector on; the
//!   only backend for injected API faults and exact request counts.
//! - [`Backend::Real`]: a real kube-apiserver + etcd + kube-controller-manager
//!   (crate `controlplane`), shared by the tests of a test binary. The
//!   sidecar runs as a user bound to exactly the RBAC rules of `deploy/` for
//!   the gates it runs with, and the real PV binder, garbage collector and
//!   protection controllers do their parts.
//!
//! At the end of every real-cluster test (when its [`Env`] is dropped, so
//! every [`e2e!`] and [`e2e_real!`] scenario gets it), the API server's audit
//! log is read for the requests of our sidecar's users it refused: a `403`,
//! or a `400` or `422` of a write, fails the test with the request; a test
//! that provokes one on purpose says so with [`Env::expect_refusals`]. Every
//! request of those users must also be one that some loop declares in its
//! `API_CALLS` (`api_calls` in src/startup.rs gathers them): an undeclared
//! (verb, resource) fails the test by name
//! ([`Env::assert_every_request_declared`]), with no opt-out, so the
//! declarations the RBAC tests read stay complete.
//!
//! Every test gets its own namespace, CSI driver name, node and StorageClass
//! names (see [`Env::class`]), so tests sharing a real cluster cannot see
//! each other's objects; the same names are used on both backends.
//! [`e2e!`] declares a scenario once and runs it on each backend.
//!
//! Watch lag, on both backends ([`Env::lag_watch`]): the events of the
//! sidecar's watches of one resource reach it late, as when its watches of
//! different kinds drift apart. The test server holds them itself
//! (`TestServer::set_watch_lag`); on the real cluster the sidecar talks to
//! the API server through a [`controlplane::LagProxy`] (as the same user,
//! so RBAC and the audit-log checks are unchanged), set up by
//! [`Env::lag_watch`] or [`Env::through_lag_proxy`] before the sidecar
//! starts; the sidecars of other tests talk to the API server directly.

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use controlplane::{ControlPlane, GuardedChild, LagProxy};
use csi_hostpath::faults::{self, Fault, Faults};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube_testserver::{HttpServer, TestServer};
use serde_json::{Value, json};

#[path = "../deploy/render.rs"]
#[allow(dead_code)]
pub mod render;

pub use controlplane::Config as ClusterConfig;

#[allow(dead_code)]
pub mod csi_requests;
pub mod democratic;
pub mod fake_nodes;
pub mod sidecar;
pub mod snapshots;

pub use sidecar::Launch;

/// The annotation of a pod's selected node on its WaitForFirstConsumer claim.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// Which API server a test runs against.
#[derive(Clone, Copy)]
pub enum Backend {
    TestServer,
    Real(&'static ControlPlane),
}

impl Backend {
    /// The real control plane of this test binary for `config`, or `None`
    /// (after one `SKIPPED real-cluster test` line saying what is missing)
    /// when the binaries are not available and skipping is allowed; with
    /// `CI=true`, `K8S_BIN_DIR` or `KUBEBUILDER_ASSETS` set, a missing binary
    /// fails the test instead, naming it ([`controlplane::BinEnv`]).
    pub fn real(config: &ClusterConfig, test: &str) -> Option<Backend> {
        ControlPlane::shared(config, test).map(Backend::Real)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::TestServer => "test server",
            Backend::Real(_) => "real cluster",
        }
    }
}

/// Declares scenarios `async fn name(backend: Backend)` once and generates,
/// per scenario, a module with one test per backend: `name::test_server` and
/// `name::real_cluster` (on a control plane of `config`). With
/// `coexisting: other`, also `name::real_cluster_coexisting` on a control
/// plane of `other` (the embedded loops' tests: the controller-manager's own
/// controller off in `config`, on in `other`).
#[macro_export]
macro_rules! e2e {
    ($config:expr, coexisting: $coexisting:expr; $($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn test_server() {
                    super::$name($crate::support::Backend::TestServer).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn real_cluster() {
                    let test = concat!(module_path!(), "::real_cluster");
                    if let Some(backend) = $crate::support::Backend::real(&$config, test) {
                        super::$name(backend).await
                    }
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn real_cluster_coexisting() {
                    let test = concat!(module_path!(), "::real_cluster_coexisting");
                    if let Some(backend) = $crate::support::Backend::real(&$coexisting, test) {
                        super::$name(backend).await
                    }
                }
            }
        )+
    };
    ($config:expr; $($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn test_server() {
                    super::$name($crate::support::Backend::TestServer).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn real_cluster() {
                    let test = concat!(module_path!(), "::real_cluster");
                    if let Some(backend) = $crate::support::Backend::real(&$config, test) {
                        super::$name(backend).await
                    }
                }
            }
        )+
    };
}

/// As [`e2e!`], only on the real control plane (the test server lacks what
/// the scenario needs, e.g. a controller the test server does not emulate).
#[macro_export]
macro_rules! e2e_real {
    ($config:expr; $($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn real_cluster() {
                    let test = concat!(module_path!(), "::real_cluster");
                    if let Some(backend) = $crate::support::Backend::real(&$config, test) {
                        super::$name(backend).await
                    }
                }
            }
        )+
    };
}

/// A request of our sidecar that the API server refused (audit log).
#[derive(Debug, Clone)]
pub struct Refused {
    pub user: String,
    pub verb: String,
    /// `persistentvolumeclaims`, `persistentvolumeclaims/status`, ...
    pub resource: String,
    pub namespace: String,
    /// Empty for a list or watch.
    pub name: String,
    pub code: u16,
    pub request_uri: String,
    pub at: String,
    /// The API server's answer.
    pub message: String,
}

impl Refused {
    fn from_audit(r: &controlplane::audit::Request) -> Refused {
        Refused {
            user: r.user.username.clone(),
            verb: r.verb.clone(),
            resource: r.resource(),
            namespace: r.namespace().to_owned(),
            name: r
                .object_ref
                .as_ref()
                .map(|o| o.name.clone())
                .unwrap_or_default(),
            code: r.code(),
            request_uri: r.request_uri.clone(),
            at: r.stage_timestamp.clone(),
            message: r.message().to_owned(),
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = if self.name.is_empty() {
            "*"
        } else {
            &self.name
        };
        let object = if self.namespace.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.namespace)
        };
        write!(
            f,
            "{} {} {object} -> {} {:?} (user {}, {} at {})",
            self.verb, self.resource, self.code, self.message, self.user, self.request_uri, self.at
        )
    }
}

/// Whether a refused write is a patch that did not apply to the object as
/// it is now: a JSON patch whose `test` operation (or whose path) failed
/// because the sidecar built it from a stale copy. That is the sidecar's
/// optimistic-concurrency guard (the JSON-patch form of a 409 Conflict,
/// e.g. the finalizer removal guarded by the PV's uid and the finalizer's
/// index), not a refusal: the API server answers it with `422 Invalid` and
/// no details at all (`NewGenericServerResponse`), where a write it finds
/// invalid is answered `422 Invalid` naming the object and the fields
/// (`details.kind`, `name`, `causes`), which does count.
fn is_stale_patch(r: &controlplane::audit::Request) -> bool {
    r.verb == "patch"
        && r.code() == 422
        && r.response_status.as_ref().is_some_and(|s| {
            s.reason == "Invalid"
                && s.details
                    .as_ref()
                    .is_none_or(|d| d.as_object().is_none_or(|o| o.is_empty()))
        })
}

/// A request of our sidecar that no loop declares
/// (`csi_provisioner::startup::declaring_api_call`), as `(verb, resource)`
/// with the group before a non-core resource (`(get, apps/statefulsets)`),
/// or the URL of a request for no resource.
///
/// The audit record's verb is the RBAC verb the API server's authorizer
/// checked, already mapped from the HTTP request (GET of one object: get; of
/// a collection: list; with `watch=true`: watch; POST: create; PUT: update;
/// PATCH: patch; DELETE: delete): the same words the declarations use.
fn undeclared(r: &controlplane::audit::Request) -> Option<String> {
    let Some(object) = &r.object_ref else {
        return Some(format!("({}, non-resource URL {})", r.verb, r.request_uri));
    };
    let resource = r.resource();
    if !csi_provisioner::startup::declaring_api_call(&r.verb, &object.api_group, &resource)
        .is_empty()
    {
        return None;
    }
    let named = if object.api_group.is_empty() {
        resource
    } else {
        format!("{}/{resource}", object.api_group)
    };
    Some(format!("({}, {named})", r.verb))
}

/// A refusal a test provokes on purpose ([`Env::expect_refusals`]).
#[derive(Debug, Clone)]
struct ExpectedRefusal {
    why: &'static str,
    /// `"*"`: any verb.
    verb: &'static str,
    resource: &'static str,
    code: u16,
}

impl ExpectedRefusal {
    fn matches(&self, refused: &Refused) -> bool {
        (self.verb == "*" || self.verb == refused.verb)
            && self.resource == refused.resource
            && self.code == refused.code
    }
}

enum Server {
    Test { api: TestServer, http: HttpServer },
    Real(&'static ControlPlane),
}

pub struct Env {
    pub dir: tempfile::TempDir,
    server: Server,
    /// An admin client (cluster-admin on the real cluster).
    pub client: kube::Client,
    /// Short, unique per test: the suffix of every name below.
    pub id: String,
    /// The test's namespace: its claims, and the sidecar's `NAMESPACE`
    /// (journal, Lease, capacity objects).
    pub ns: String,
    /// The CSI driver name of this test (the provisioner of its classes).
    pub driver_name: String,
    /// The node of this test (Node, CSINode, topology segment).
    pub node: String,
    pub driver: csi_hostpath::Config,
    /// The driver in-process (unless [`Env::run_driver_as_process`]).
    driver_in_process: Option<csi_hostpath::InProcess>,
    /// The driver as a `csi-hostpath` process ([`Env::run_driver_as_process`]).
    driver_process: Option<GuardedChild>,
    driver_runs: u32,
    driver_as_process: bool,
    pub sidecar: Option<GuardedChild>,
    sidecar_runs: u32,
    /// Real cluster: the number of audit records before the last
    /// [`Env::reset_counters`].
    audit_mark: Mutex<usize>,
    /// Real cluster: the users our sidecar ran as (see
    /// [`Env::check_refusals_of`]), whose refused requests fail the test.
    our_users: Mutex<std::collections::BTreeSet<String>>,
    /// Refusals this test provokes on purpose ([`Env::expect_refusals`]).
    expected_refusals: Mutex<Vec<ExpectedRefusal>>,
    /// Real cluster: plays the kubelet's part in pod deletion.
    kubelet: Option<tokio::task::JoinHandle<()>>,
    /// Real cluster: the `csi-snapshotter` next to this test's driver and
    /// its log ([`Env::start_snapshotter`]).
    snapshotter: Option<(GuardedChild, PathBuf)>,
    /// Real cluster: the proxy the sidecar talks to the API server through
    /// ([`Env::through_lag_proxy`]), once set up.
    lag_proxy: std::sync::OnceLock<LagProxy>,
}

/// The name of the running test (the test harness names each test's
/// thread after it; a scenario runs on that thread until its first spawn).
pub fn current_test() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => "(this test)".to_owned(),
    }
}

/// Six random hex digits: unique among the tests sharing a cluster (with
/// high probability) and short enough for every name derived from it.
fn unique_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..6].to_owned()
}

impl Env {
    /// API server and driver up; no sidecar yet.
    pub async fn new(backend: Backend) -> Env {
        Env::new_with_driver(backend, |_| {}).await
    }

    /// As [`Env::new`], with the driver's configuration adjusted first
    /// (capacity per kind, topology off, ...).
    pub async fn new_with_driver(
        backend: Backend,
        configure: impl FnOnce(&mut csi_hostpath::Config),
    ) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let id = unique_id();
        let (server, client) = match backend {
            Backend::TestServer => {
                let api = TestServer::builder()
                    .controller_manager(true)
                    .gc(true)
                    .build();
                let http = api.serve_http().await.expect("http");
                let client = api.client();
                (Server::Test { api, http }, client)
            }
            Backend::Real(plane) => {
                let client = plane.admin_client().await.expect("admin client");
                (Server::Real(plane), client)
            }
        };
        let mut driver = csi_hostpath::Config::for_tests(dir.path());
        driver.driver_name = format!("{id}.hostpath.csi.k8s.io");
        driver.node_id = format!("node-{id}");
        configure(&mut driver);
        let mut env = Env {
            dir,
            server,
            client,
            ns: format!("e2e-{id}"),
            driver_name: driver.driver_name.clone(),
            node: driver.node_id.clone(),
            id,
            driver,
            driver_in_process: None,
            driver_process: None,
            driver_runs: 0,
            driver_as_process: false,
            sidecar: None,
            sidecar_runs: 0,
            audit_mark: Mutex::new(0),
            our_users: Mutex::new(Default::default()),
            expected_refusals: Mutex::new(Vec::new()),
            kubelet: None,
            snapshotter: None,
            lag_proxy: std::sync::OnceLock::new(),
        };
        env.create_namespace(&env.ns.clone()).await;
        let node = env.node.clone();
        env.add_node(&node).await;
        env.start_driver();
        if env.is_real() {
            env.kubelet = Some(tokio::spawn(play_kubelet(
                env.client.clone(),
                env.ns.clone(),
            )));
        }
        env
    }

    /// Whether the real controller-manager runs `controller` here (never on
    /// the test server).
    pub fn runs_controller(&self, controller: &str) -> bool {
        let Some(plane) = self.plane() else {
            return false;
        };
        let Some(list) = &plane.config().controllers else {
            return false;
        };
        !list.split(',').any(|c| c == format!("-{controller}"))
    }

    pub fn is_real(&self) -> bool {
        matches!(self.server, Server::Real(_))
    }

    /// The API test server, for fault injection and request counters.
    /// Panics on the real cluster: call it only in test-server scenarios.
    pub fn api(&self) -> &TestServer {
        match &self.server {
            Server::Test { api, .. } => api,
            Server::Real(_) => {
                panic!("this step needs the API test server (fault injection or exact counters)")
            }
        }
    }

    /// The real control plane, on that backend.
    pub fn plane(&self) -> Option<&'static ControlPlane> {
        match &self.server {
            Server::Real(plane) => Some(plane),
            Server::Test { .. } => None,
        }
    }

    /// The binary `name` of the real cluster's folder that this test needs
    /// beyond the control plane (the upstream `csi-provisioner`,
    /// `hostpathplugin`). `None` on the test server, and (after one
    /// `SKIPPED real-cluster test` line) when it is missing and skipping is
    /// allowed; fails the test, naming it, when skipping is not allowed.
    pub fn upstream_binary(&self, name: &str) -> Option<PathBuf> {
        self.plane()?.binaries().require(name, &current_test())
    }

    /// A kubeconfig with cluster-admin rights (kubectl, extra clients).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        match &self.server {
            Server::Test { http, .. } => http.kubeconfig_path().to_owned(),
            Server::Real(plane) => plane.admin_kubeconfig().to_owned(),
        }
    }

    /// The user the sidecar runs as on the real cluster.
    pub fn sidecar_user(&self) -> String {
        format!("sidecar-{}", self.id)
    }

    /// The cluster-scoped name of this test's StorageClass `short` (classes
    /// are shared by every test of a real cluster).
    pub fn class(&self, short: &str) -> String {
        format!("{short}-{}", self.id)
    }

    pub async fn create_namespace(&self, name: &str) {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        // The controller-manager creates the `default` service account a
        // moment after the namespace; pods are refused until it exists, so
        // do not wait for it: create it (whoever is second gets a 409). The
        // test server has neither service accounts nor that admission.
        let mut objects = vec![ns];
        if self.is_real() {
            objects.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": name}}));
        }
        for object in objects {
            match self.try_create(object).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("create namespace {name}: {e}"),
            }
        }
    }

    /// The ReferenceGrant CRD, as little of it as the API server needs to
    /// serve the kind (the Gateway API's own CRD validates more); the test
    /// server serves ReferenceGrants without it.
    pub async fn install_reference_grant_crd(&self) {
        if !self.is_real() {
            return; // served by the test server
        }
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            // The API server protects *.k8s.io groups; the Gateway API's CRDs
            // carry this approval.
            "metadata": {"name": "referencegrants.gateway.networking.k8s.io",
                         "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/1538"}},
            "spec": {
                "group": "gateway.networking.k8s.io",
                "names": {"kind": "ReferenceGrant", "listKind": "ReferenceGrantList",
                          "plural": "referencegrants", "singular": "referencegrant",
                          "shortNames": ["refgrant"]},
                "scope": "Namespaced",
                "versions": [{"name": "v1beta1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": {"type": "object",
                                  "x-kubernetes-preserve-unknown-fields": true}}}],
            },
        });
        match self.try_create(crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("ReferenceGrant CRD: {e}"),
        }
        let grants: kube::Api<csi_provisioner::api::reference_grant::ReferenceGrant> =
            kube::Api::all(self.client.clone());
        self.wait_for(
            "ReferenceGrants served",
            Duration::from_secs(30),
            || async { grants.list(&Default::default()).await.ok().map(|_| ()) },
        )
        .await;
    }

    /// Waits (20 s at most) for the driver process to exit, as a fault
    /// such as `Fault::exit_after_backend_change` makes it; fails the test
    /// with the logs otherwise.
    pub async fn wait_driver_exited(&mut self) {
        for _ in 0..200 {
            if self.driver_exited() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the driver did not exit\n{}", self.logs());
    }

    /// A Node with the driver's topology label and its CSINode, as the
    /// kubelet and the node-driver-registrar would create them.
    pub async fn add_node(&self, name: &str) {
        let key = &self.driver.topology_key;
        self.create(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {key: name}}}))
            .await;
        self.create(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": name},
            "spec": {"drivers": [{"name": self.driver_name, "nodeID": name, "topologyKeys": [key]}]}}))
            .await;
    }

    /// Creates any object given as JSON (`apiVersion`, `kind`, `metadata`).
    pub async fn create(&self, object: Value) -> Value {
        let what = describe(&object);
        self.try_create(object)
            .await
            .unwrap_or_else(|e| panic!("create {what}: {e}"))
    }

    pub async fn try_create(&self, object: Value) -> Result<Value, kube::Error> {
        let (api, _) = self.dynamic_api(&object);
        let obj: DynamicObject = serde_json::from_value(object).expect("object JSON");
        let created = api.create(&PostParams::default(), &obj).await?;
        Ok(serde_json::to_value(created).expect("object JSON"))
    }

    /// Replaces an object (its `metadata.resourceVersion` guards the write).
    pub async fn replace(&self, object: Value) -> Value {
        let (api, name) = self.dynamic_api(&object);
        let what = describe(&object);
        let obj: DynamicObject = serde_json::from_value(object).expect("object JSON");
        let done = api
            .replace(&name, &PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("replace {what}: {e}"));
        serde_json::to_value(done).expect("object JSON")
    }

    /// Replaces an object's status (e.g. a pod's phase, as the kubelet
    /// would write it).
    pub async fn replace_status(&self, object: Value) -> Value {
        let (api, name) = self.dynamic_api(&object);
        let what = describe(&object);
        let obj: DynamicObject = serde_json::from_value(object).expect("object JSON");
        let done = api
            .replace_status(&name, &PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("replace status of {what}: {e}"));
        serde_json::to_value(done).expect("object JSON")
    }

    /// Reads an object by apiVersion, kind, namespace ("" when cluster
    /// scoped) and name.
    pub async fn get(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let probe = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": ns}});
        let (api, _) = self.dynamic_api(&probe);
        api.get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("get {kind} {ns}/{name}: {e}"))
            .map(|o| serde_json::to_value(o).expect("object JSON"))
    }

    /// Deletes an object (NotFound is fine).
    pub async fn delete(&self, api_version: &str, kind: &str, ns: &str, name: &str) {
        let probe = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": ns}});
        let (api, _) = self.dynamic_api(&probe);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("delete {kind} {ns}/{name}: {e}"),
        }
    }

    fn dynamic_api(&self, object: &Value) -> (Api<DynamicObject>, String) {
        let api_version = object["apiVersion"].as_str().expect("apiVersion");
        let kind = object["kind"].as_str().expect("kind");
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let api = match object["metadata"]["namespace"].as_str() {
            Some(ns) if !ns.is_empty() => Api::namespaced_with(self.client.clone(), ns, &resource),
            _ => Api::all_with(self.client.clone(), &resource),
        };
        (api, name)
    }

    pub fn start_driver(&mut self) {
        if self.driver_as_process {
            self.driver_runs += 1;
            let log = self
                .dir
                .path()
                .join(format!("driver-{}.log", self.driver_runs));
            let mut command = Command::new(driver_binary());
            command.args(self.driver.to_args()).arg("--v=4");
            self.driver_process = Some(
                GuardedChild::spawn("csi-hostpath", command, &log).expect("spawn csi-hostpath"),
            );
            return;
        }
        self.driver_in_process = Some(csi_hostpath::InProcess::spawn(self.driver.clone()));
    }

    /// From now on the driver runs as a `csi-hostpath` process (restarted
    /// by [`Env::start_driver`]), so that a fault may end it between its
    /// backend change and its reply.
    pub async fn run_driver_as_process(&mut self) {
        self.stop_driver().await;
        self.driver_as_process = true;
        self.start_driver();
    }

    /// Whether the driver process ended (a fault's exit); `false` for the
    /// in-process driver.
    pub fn driver_exited(&mut self) -> bool {
        self.driver_process
            .as_mut()
            .is_some_and(|child| child.try_wait().is_some())
    }

    /// The driver process's exit status once it has ended (`None` while it
    /// runs, and for the in-process driver).
    pub fn driver_exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.driver_process
            .as_mut()
            .and_then(|child| child.try_wait())
    }

    /// The log of the driver's current (or last) process; empty for the
    /// in-process driver.
    pub fn driver_log(&self) -> String {
        if !self.driver_as_process {
            return String::new();
        }
        let log = self
            .dir
            .path()
            .join(format!("driver-{}.log", self.driver_runs));
        std::fs::read_to_string(log).unwrap_or_default()
    }

    pub async fn stop_driver(&mut self) {
        if let Some(mut child) = self.driver_process.take() {
            child.kill();
        }
        if let Some(driver) = self.driver_in_process.take()
            && let Err(e) = driver.stop().await
        {
            eprintln!("hostpath driver stopped: {e}");
        }
    }

    pub fn log_path(&self, run: u32) -> PathBuf {
        self.dir.path().join(format!("sidecar-{run}.log"))
    }

    /// The log of the last sidecar started with [`Env::start_sidecar`],
    /// as it wrote it (no header, no other process's lines).
    #[allow(dead_code)]
    pub fn last_sidecar_log(&self) -> String {
        std::fs::read_to_string(self.log_path(self.sidecar_runs)).unwrap_or_default()
    }

    /// Starts the sidecar with our standard flags plus `extra`.
    pub async fn start_sidecar(&mut self, extra: &[&str]) {
        self.start_sidecar_with_env(extra, &[]).await;
    }

    /// As [`Env::start_sidecar`], with extra environment variables (e.g.
    /// `POD_NAME`).
    pub async fn start_sidecar_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) {
        let kubeconfig = self.sidecar_kubeconfig(extra).await;
        self.start_sidecar_as(&kubeconfig, extra, env);
    }

    /// Starts the sidecar with `kubeconfig` (e.g. of a user bound to other
    /// rules than deploy/'s) instead of the harness's.
    pub fn start_sidecar_as(&mut self, kubeconfig: &Path, extra: &[&str], env: &[(&str, &str)]) {
        assert!(self.sidecar.is_none(), "sidecar already running");
        if let Some(user) = self.user_of_kubeconfig(kubeconfig) {
            self.check_refusals_of(&user);
        }
        self.sidecar_runs += 1;
        let mut launch = self.launch(kubeconfig).args(extra);
        for (key, value) in env {
            launch = launch.env(key, value);
        }
        self.sidecar = Some(launch.spawn("csi-provisioner", &self.log_path(self.sidecar_runs)));
    }

    /// A sidecar command line against this test's driver and namespace
    /// with `kubeconfig`, for a sidecar of the test's own ([`Launch::start`])
    /// beside or instead of [`Env::start_sidecar`]'s.
    pub fn launch(&self, kubeconfig: &Path) -> Launch {
        Launch::new(&self.driver.endpoint, kubeconfig, &self.ns)
    }

    /// The kubeconfig the sidecar runs with. On the real cluster: a user
    /// bound to exactly the RBAC rules of `deploy/` for the gates in
    /// `args` (the base, plus the component of each gated loop turned on);
    /// through this test's [`LagProxy`] when it has one
    /// ([`Env::through_lag_proxy`]), as the same user.
    pub async fn sidecar_kubeconfig(&self, args: &[&str]) -> PathBuf {
        match &self.server {
            Server::Test { http, .. } => http.kubeconfig_path().to_owned(),
            Server::Real(plane) => {
                let user = self.sidecar_user();
                self.check_refusals_of(&user);
                self.grant_deploy_rbac(&user, &components_for(args)).await;
                if let Some(proxy) = self.lag_proxy.get() {
                    return proxy.kubeconfig().to_owned();
                }
                plane
                    .kubeconfig_for(&user, None)
                    .expect("sidecar kubeconfig")
            }
        }
    }

    /// Real cluster: from the next [`Env::start_sidecar`] on, the sidecar
    /// talks to the API server through a [`LagProxy`] that forwards as
    /// [`Env::sidecar_user`] (so its RBAC, audit-log and request-count
    /// checks are the same), ready for [`Env::lag_watch`] at any time
    /// after. Idempotent; nothing on the test server, which lags watches
    /// itself.
    pub fn through_lag_proxy(&self) -> Option<&LagProxy> {
        let plane = self.plane()?;
        Some(self.lag_proxy.get_or_init(|| {
            LagProxy::start(plane, &self.sidecar_user(), None).expect("start the lag proxy")
        }))
    }

    /// From now on the events of the sidecar's watches of `resource`
    /// (plural: `volumeattachments`, ...), open or to come, reach it `lag`
    /// late, in order; lists, gets and writes are not delayed. On the test
    /// server: `TestServer::set_watch_lag` (remote watchers only: the
    /// test's own client is not delayed). On the real cluster: the
    /// sidecar's [`LagProxy`], which must be in place before the sidecar
    /// starts: call this, or [`Env::through_lag_proxy`], before
    /// [`Env::start_sidecar`].
    pub fn lag_watch(&self, resource: &str, lag: Duration) {
        match &self.server {
            Server::Test { api, .. } => api.set_watch_lag(resource, lag),
            Server::Real(_) => {
                assert!(
                    self.lag_proxy.get().is_some() || self.sidecar.is_none(),
                    "Env::lag_watch on the real cluster: the running sidecar does not talk \
                     through a lag proxy; call Env::lag_watch or Env::through_lag_proxy \
                     before Env::start_sidecar"
                );
                self.through_lag_proxy()
                    .expect("a lag proxy on the real cluster")
                    .set_watch_lag(resource, lag);
            }
        }
    }

    /// Ends [`Env::lag_watch`] of `resource`: its events from now on pass
    /// at once (behind those still held, in order).
    pub fn clear_watch_lag(&self, resource: &str) {
        match &self.server {
            Server::Test { api, .. } => api.clear_watch_lag(resource),
            Server::Real(_) => {
                if let Some(proxy) = self.lag_proxy.get() {
                    proxy.clear_watch_lag(resource);
                }
            }
        }
    }

    /// How many watch events of `resource` (bookmarks not counted) the lag
    /// of [`Env::lag_watch`] held back on their way to the sidecar: the
    /// evidence that the fault struck. The test server's count restarts
    /// with [`Env::reset_counters`].
    pub fn watch_events_held(&self, resource: &str) -> u64 {
        match &self.server {
            Server::Test { api, .. } => api.watch_events_held(resource),
            Server::Real(_) => self.lag_proxy.get().map_or(0, |p| p.held(resource)),
        }
    }

    /// Binds `user` to the RBAC objects of `deploy/` with `components`,
    /// renamed for this test (ClusterRole and binding suffixed with the
    /// test id; the Role in the test's namespace). Idempotent: a later call
    /// replaces the rules, so a restart with other gates gets exactly theirs.
    pub async fn grant_deploy_rbac(&self, user: &str, components: &[&str]) {
        let (cluster_rules, namespace_rules) = deploy_rules(components);
        self.grant_rules(user, cluster_rules, namespace_rules).await;
    }

    /// Binds `user` to a ClusterRole with `cluster_rules` and a Role in the
    /// test's namespace with `namespace_rules`.
    pub async fn grant_rules(&self, user: &str, cluster_rules: Value, namespace_rules: Value) {
        let name = format!("{user}-{}", self.id);
        let subject =
            json!([{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]);
        let objects = [
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name}, "rules": cluster_rules}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name}, "subjects": subject,
                "roleRef": {"kind": "ClusterRole", "name": name, "apiGroup": "rbac.authorization.k8s.io"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": name, "namespace": self.ns}, "rules": namespace_rules}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": self.ns}, "subjects": subject,
                "roleRef": {"kind": "Role", "name": name, "apiGroup": "rbac.authorization.k8s.io"}}),
        ];
        for object in objects {
            self.create_or_replace(object).await;
        }
    }

    async fn create_or_replace(&self, object: Value) {
        match self.try_create(object.clone()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let current = self
                    .get(
                        object["apiVersion"].as_str().unwrap_or_default(),
                        object["kind"].as_str().unwrap_or_default(),
                        object["metadata"]["namespace"].as_str().unwrap_or_default(),
                        object["metadata"]["name"].as_str().unwrap_or_default(),
                    )
                    .await
                    .expect("object exists after a conflict");
                let mut object = object;
                object["metadata"]["resourceVersion"] =
                    current["metadata"]["resourceVersion"].clone();
                self.replace(object).await;
            }
            Err(e) => panic!("create {}: {e}", describe(&object)),
        }
    }

    /// SIGKILL: no chance to clean up, as in a node crash.
    pub fn kill_sidecar(&mut self) {
        if let Some(mut child) = self.sidecar.take() {
            child.kill();
        }
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop_sidecar(&mut self) -> Option<i32> {
        let mut child = self.sidecar.take()?;
        child.signal("TERM");
        match child.wait_timeout(Duration::from_secs(20)) {
            Some(status) => status.code(),
            None => {
                child.kill();
                panic!(
                    "sidecar did not stop on SIGTERM within 20s\n{}",
                    self.logs()
                );
            }
        }
    }

    /// All sidecar logs so far (and, on the real cluster, the end of the
    /// controller-manager's), for failure messages.
    pub fn logs(&self) -> String {
        let mut out: String = (1..=self.sidecar_runs)
            .map(|run| {
                let text = std::fs::read_to_string(self.log_path(run)).unwrap_or_default();
                format!("--- sidecar run {run} ---\n{text}")
            })
            .collect();
        if let Some(plane) = self.plane() {
            out.push_str("--- kube-controller-manager (last 30 lines) ---\n");
            out.push_str(&plane.log_tail("kube-controller-manager", 30));
        }
        out.push_str(&self.snapshot_logs());
        out
    }

    /// The sidecar's log lines (all runs) that say a request was forbidden.
    pub fn forbidden_in_logs(&self) -> Vec<String> {
        (1..=self.sidecar_runs)
            .flat_map(|run| {
                std::fs::read_to_string(self.log_path(run))
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Real cluster: the user of a kubeconfig that
    /// [`ControlPlane::kubeconfig_for`] wrote (it names the file after the
    /// user: `<dir>/<user>.kubeconfig`), or of this test's [`LagProxy`]'s
    /// (the sidecar's user); `None` for any other file.
    fn user_of_kubeconfig(&self, kubeconfig: &Path) -> Option<String> {
        let plane = self.plane()?;
        if self
            .lag_proxy
            .get()
            .is_some_and(|p| p.kubeconfig() == kubeconfig)
        {
            return Some(self.sidecar_user());
        }
        if kubeconfig.parent() != Some(plane.dir())
            || kubeconfig.extension().is_none_or(|e| e != "kubeconfig")
        {
            return None;
        }
        Some(kubeconfig.file_stem()?.to_string_lossy().into_owned())
    }

    /// Real cluster: `user` runs our sidecar, so the requests the API server
    /// refused it fail the test ([`Env::refused_requests`]). The harness
    /// registers the users of [`Env::sidecar_kubeconfig`] and
    /// [`Env::start_sidecar_as`]; a test that starts our binary itself
    /// registers its user here. (The Go image's users are not ours to hold
    /// to account.)
    pub fn check_refusals_of(&self, user: &str) {
        if self.is_real() {
            self.our_users
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(user.to_owned());
        }
    }

    /// The opt-out of the refused-request check, for a test that provokes
    /// refusals on purpose (e.g. RBAC without a rule): requests `(verb,
    /// resource, code)` of our sidecar's users (`"*"` for any verb) that the
    /// API server refuses pass; every other refusal still fails the test.
    /// `why` says what the test provokes.
    pub fn expect_refusals(
        &self,
        why: &'static str,
        requests: &[(&'static str, &'static str, u16)],
    ) {
        let mut expected = self
            .expected_refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        expected.extend(
            requests
                .iter()
                .map(|&(verb, resource, code)| ExpectedRefusal {
                    why,
                    verb,
                    resource,
                    code,
                }),
        );
    }

    /// Real cluster: the requests of our sidecar's users (see
    /// [`Env::check_refusals_of`]) that the API server refused, from its
    /// audit log: every `403` (but those of an API server still starting,
    /// whose RBAC caches may be empty), and the `400` and `422` of its own
    /// writes (a write the API server finds malformed or invalid); less the
    /// refusals the test provokes on purpose ([`Env::expect_refusals`]).
    /// Empty on the test server.
    pub fn refused_requests(&self) -> Vec<Refused> {
        self.refusals().0
    }

    /// Real cluster: every request of our sidecar's users (see
    /// [`Env::check_refusals_of`]) in the audit log; empty on the test
    /// server.
    fn our_requests(&self) -> Vec<controlplane::audit::Request> {
        let Some(plane) = self.plane() else {
            return Vec::new();
        };
        let users = self
            .our_users
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if users.is_empty() {
            return Vec::new();
        }
        plane
            .audit()
            .into_iter()
            .filter(|r| users.contains(&r.user.username))
            .collect()
    }

    /// (refusals not expected, expected refusals that did not happen).
    fn refusals(&self) -> (Vec<Refused>, Vec<ExpectedRefusal>) {
        if !self.is_real() {
            return (Vec::new(), Vec::new());
        }
        let expected = self
            .expected_refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let refused: Vec<Refused> = self
            .our_requests()
            .into_iter()
            .filter(|r| {
                let code = r.code();
                (code == 403 && !r.during_startup())
                    || (r.is_write() && code == 400)
                    || (r.is_write() && code == 422 && !is_stale_patch(r))
            })
            .map(|r| Refused::from_audit(&r))
            .collect();
        let unseen = expected
            .iter()
            .filter(|e| !refused.iter().any(|r| e.matches(r)))
            .cloned()
            .collect();
        let unexpected = refused
            .into_iter()
            .filter(|r| !expected.iter().any(|e| e.matches(r)))
            .collect();
        (unexpected, unseen)
    }

    /// On the real cluster, fails when a request of our sidecar was refused
    /// (see [`Env::refused_requests`]): the rules of `deploy/` must cover
    /// every request it makes, and the API server must accept every write.
    /// Runs at the end of every test too (when its [`Env`] is dropped).
    pub fn assert_nothing_refused(&self) {
        let refused = self.refused_requests();
        if refused.is_empty() {
            return;
        }
        let list: Vec<String> = refused.iter().map(|r| format!("  {r}")).collect();
        panic!(
            "the API server refused {} request(s) of the sidecar (verb resource [namespace/]name -> code); \
             a test that provokes a refusal on purpose declares it with Env::expect_refusals:\n{}\n{}",
            refused.len(),
            list.join("\n"),
            self.logs()
        );
    }

    /// Real cluster: fails when our sidecar's users (see
    /// [`Env::check_refusals_of`]) made a request that no loop declares in
    /// its `API_CALLS` ([`undeclared`]), naming each (verb, resource) once
    /// with how often and one example. Runs at the end of every test (when
    /// its [`Env`] is dropped). A failure means a declaration is missing:
    /// add it next to the loop's code (and the RBAC rule the deploy tests
    /// then ask for), never an exception here.
    pub fn assert_every_request_declared(&self) {
        let mut found: std::collections::BTreeMap<String, (usize, String)> = Default::default();
        for r in self.our_requests() {
            if let Some(call) = undeclared(&r) {
                let entry = found
                    .entry(call)
                    .or_insert_with(|| (0, format!("{} by {}", r.request_uri, r.user.username)));
                entry.0 += 1;
            }
        }
        if found.is_empty() {
            return;
        }
        let list: Vec<String> = found
            .iter()
            .map(|(call, (n, example))| format!("  {call}: {n} request(s), e.g. {example}"))
            .collect();
        panic!(
            "the sidecar made {} kind(s) of request that no loop declares in its API_CALLS \
             (api_calls in src/startup.rs gathers them; declare the call next to the loop's code):\n{}",
            found.len(),
            list.join("\n")
        );
    }

    /// [`Env::assert_nothing_refused`] (403s, and 400/422 of writes).
    pub fn assert_nothing_forbidden(&self) {
        self.assert_nothing_refused();
    }

    /// Requests of the sidecar since the last [`Env::reset_counters`], by
    /// verb and resource (`"create persistentvolumes"`): by user from the
    /// audit log of the real cluster, by listener on the test server (the
    /// test's own client is in-process and not counted).
    pub fn sidecar_requests(&self) -> std::collections::BTreeMap<String, usize> {
        match &self.server {
            Server::Test { api, http } => {
                let mut counts = std::collections::BTreeMap::new();
                let sidecar = kube_testserver::Origin::Http(http.port());
                for r in api.requests().into_iter().filter(|r| r.origin == sidecar) {
                    *counts
                        .entry(format!("{} {}", r.verb.as_str(), r.resource))
                        .or_insert(0) += 1;
                }
                counts
            }
            Server::Real(plane) => {
                let mark = *self.audit_mark.lock().unwrap_or_else(|p| p.into_inner());
                let all = plane.audit();
                controlplane::audit::count_by_verb_and_resource(
                    &all[mark.min(all.len())..],
                    &self.sidecar_user(),
                )
            }
        }
    }

    /// The sidecar's requests since the last [`Env::reset_counters`], one
    /// (verb, resource, name, HTTP status) per request, in order.
    pub fn sidecar_request_log(&self) -> Vec<(String, String, String, u16)> {
        match &self.server {
            Server::Test { api, http } => {
                let sidecar = kube_testserver::Origin::Http(http.port());
                api.requests()
                    .into_iter()
                    .filter(|r| r.origin == sidecar)
                    .map(|r| (r.verb.as_str().to_owned(), r.resource, r.name, r.status))
                    .collect()
            }
            Server::Real(plane) => {
                let mark = *self.audit_mark.lock().unwrap_or_else(|p| p.into_inner());
                let user = self.sidecar_user();
                let all = plane.audit();
                all[mark.min(all.len())..]
                    .iter()
                    .filter(|r| r.user.username == user)
                    .map(|r| {
                        let name = r
                            .object_ref
                            .as_ref()
                            .map(|o| o.name.clone())
                            .unwrap_or_default();
                        (r.verb.clone(), r.resource(), name, r.code())
                    })
                    .collect()
            }
        }
    }

    /// How many requests of the sidecar [`Env::sidecar_requests`] counted
    /// for `verb` (`get`, `list`, `create`, ...) on `resource`.
    pub fn sidecar_request_count(&self, verb: &str, resource: &str) -> usize {
        self.sidecar_requests()
            .get(&format!("{verb} {resource}"))
            .copied()
            .unwrap_or(0)
    }

    /// The sidecar's writes (create, update, patch, delete) counted by
    /// [`Env::sidecar_requests`].
    pub fn sidecar_writes(&self) -> usize {
        self.sidecar_requests()
            .iter()
            .filter(|(k, _)| {
                [
                    "create ",
                    "update ",
                    "patch ",
                    "delete ",
                    "deletecollection ",
                ]
                .iter()
                .any(|v| k.starts_with(v))
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// Starts counting requests anew.
    pub fn reset_counters(&self) {
        match &self.server {
            Server::Test { api, .. } => api.reset_counters(),
            Server::Real(plane) => {
                *self.audit_mark.lock().unwrap_or_else(|p| p.into_inner()) = plane.audit().len();
            }
        }
    }

    pub fn set_faults(&self, rules: Vec<Fault>) {
        Faults::with_rules(rules)
            .write(&self.driver.faults_file)
            .expect("faults file");
    }

    /// Writes a whole faults file (rules and the driver-wide switches,
    /// e.g. `busy_above`).
    pub fn set_faults_file(&self, faults: Faults) {
        faults.write(&self.driver.faults_file).expect("faults file");
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

    /// Creates this test's StorageClass `short` (named [`Env::class`]) of
    /// this test's driver.
    pub async fn storage_class(&self, short: &str, binding: &str, reclaim: &str, params: Value) {
        self.storage_class_with(short, binding, reclaim, params, json!({}))
            .await;
    }

    /// As [`Env::storage_class`], with `extra` merged into the object
    /// (allowedTopologies, mountOptions, annotations, ...).
    pub async fn storage_class_with(
        &self,
        short: &str,
        binding: &str,
        reclaim: &str,
        params: Value,
        extra: Value,
    ) {
        let mut class = json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": self.class(short)},
            "provisioner": self.driver_name,
            "reclaimPolicy": reclaim,
            "volumeBindingMode": binding,
            "parameters": params,
        });
        merge(&mut class, extra);
        self.create(class).await;
    }

    /// A claim of this test's class `class` (short name, see
    /// [`Env::class`]; `""` for none).
    pub async fn create_pvc(
        &self,
        namespace: &str,
        name: &str,
        class: &str,
        size: &str,
        extra: Value,
    ) -> PersistentVolumeClaim {
        let mut pvc = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}},
            },
        });
        if !class.is_empty() {
            pvc["spec"]["storageClassName"] = json!(self.class(class));
        }
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

    /// The PVs of this test: of its driver (CSI source or provisioned-by)
    /// or bound to a claim in its namespace.
    pub async fn pvs(&self) -> Vec<PersistentVolume> {
        Api::<PersistentVolume>::all(self.client.clone())
            .list(&Default::default())
            .await
            .expect("list pv")
            .items
            .into_iter()
            .filter(|pv| self.is_ours(pv))
            .collect()
    }

    /// The CSIStorageCapacity objects of this test's driver (labelled
    /// with its name) in its namespace.
    pub async fn capacities(
        &self,
    ) -> Result<Vec<k8s_openapi::api::storage::v1::CSIStorageCapacity>, kube::Error> {
        let objects = Api::<k8s_openapi::api::storage::v1::CSIStorageCapacity>::namespaced(
            self.client.clone(),
            &self.ns,
        )
        .list(&Default::default())
        .await?
        .items;
        Ok(objects
            .into_iter()
            .filter(|o| {
                o.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("csi.storage.k8s.io/drivername"))
                    .is_some_and(|d| *d == self.driver_name)
            })
            .collect())
    }

    fn is_ours(&self, pv: &PersistentVolume) -> bool {
        let spec = pv.spec.as_ref();
        spec.and_then(|s| s.csi.as_ref())
            .is_some_and(|c| c.driver == self.driver_name)
            || pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
                .is_some_and(|p| *p == self.driver_name)
            || spec
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|c| c.namespace.as_deref())
                .is_some_and(|ns| ns == self.ns)
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

    /// The write-ahead journal's entries (claim uid → entry JSON) over all
    /// its segments (ConfigMaps `<driver>-provisioner-journal-<n>`).
    pub async fn journal(&self) -> std::collections::BTreeMap<String, String> {
        let prefix = format!("{}-provisioner-journal", self.driver_name);
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(self.client.clone(), &self.ns)
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
            .collect()
    }

    /// The journal's entries decoded with the sidecar's own codec
    /// (`parse_entries`, then `JournalEntry::request`: base64 protobuf,
    /// deflated when large): claim uid → (entry, its frozen request). An
    /// entry that does not decode fails the test.
    pub async fn journal_entries(
        &self,
    ) -> std::collections::BTreeMap<
        String,
        (
            csi_provisioner::provisioner::journal::JournalEntry,
            csi_proto::v1::CreateVolumeRequest,
        ),
    > {
        let data = self.journal().await;
        let (entries, errors) = csi_provisioner::provisioner::journal::parse_entries(&data);
        assert!(
            errors.is_empty(),
            "journal entries that do not decode: {errors:?}\n{data:#?}"
        );
        entries
            .into_iter()
            .map(|(uid, entry)| {
                let request = entry
                    .request()
                    .unwrap_or_else(|e| panic!("journal entry {uid}: {e}"));
                (uid, (entry, request))
            })
            .collect()
    }

    /// (reason, message) of the events about the PV `name` (events of
    /// cluster-scoped objects are in `default`).
    pub async fn pv_events(&self, name: &str) -> Vec<(String, String)> {
        self.events("default", name).await
    }

    /// Waits for an event of `reason` about `name`; returns its message.
    pub async fn wait_event(&self, namespace: &str, name: &str, reason: &str) -> String {
        self.wait_for(
            &format!("event {reason} on {namespace}/{name}"),
            Duration::from_secs(30),
            || async {
                self.events(namespace, name)
                    .await
                    .into_iter()
                    .find(|(r, _)| r == reason)
                    .map(|(_, m)| m)
            },
        )
        .await
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
    /// controller-manager (or its helper) bound them.
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
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let context = || format!("({})\n{}", self.backend_name(), self.logs());
        poll(what, timeout, Duration::from_millis(50), check, context).await
    }

    /// The holder of the test namespace's Lease, once someone holds it.
    pub async fn lease_holder(&self) -> Option<String> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.ns);
        leases
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find_map(|l| l.spec?.holder_identity.filter(|h| !h.is_empty()))
    }

    pub fn backend_name(&self) -> &'static str {
        match self.server {
            Server::Test { .. } => "test server",
            Server::Real(_) => "real cluster",
        }
    }

    /// Every backend volume is recorded in a PV of ours and every PV of ours
    /// has its backend volume (no leak, no orphan); and nothing of the
    /// sidecar's was refused ([`Env::assert_nothing_refused`]).
    pub async fn assert_consistent(&self) {
        let pvs = self.pvs().await;
        let backend: Vec<String> = self.backend_volumes().into_iter().map(|v| v.id).collect();
        self.assert_consistent_with(&pvs, &backend);
        self.assert_nothing_refused();
    }

    /// The invariant of [`Env::assert_consistent`] over given PVs and
    /// backend volume ids (a test that runs another driver, or that keeps
    /// volumes of an earlier run on the backend, says which are its own):
    /// every volume has a PV of this test's driver with its handle, every
    /// such PV has its volume.
    pub fn assert_consistent_with(&self, pvs: &[PersistentVolume], backend: &[String]) {
        let handles: Vec<String> = pvs
            .iter()
            .filter_map(|pv| pv.spec.as_ref()?.csi.as_ref())
            .filter(|csi| csi.driver == self.driver_name)
            .map(|csi| csi.volume_handle.clone())
            .collect();
        for id in backend {
            assert!(
                handles.contains(id),
                "backend volume {id} has no PV (leak)\nPVs: {handles:?}\n{}",
                self.logs()
            );
        }
        for handle in &handles {
            assert!(
                backend.contains(handle),
                "PV with handle {handle} has no backend volume (orphan)\nbackend: {backend:?}\n{}",
                self.logs()
            );
        }
    }
}

/// Polls `check` every `every` until it returns `Some`; after `timeout`,
/// fails the test with "timed out waiting for `what`" and `context()` (the
/// logs that tell why).
pub async fn poll<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
    context: impl FnOnce() -> String,
) -> T
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
            panic!("timed out waiting for {what} {}", context());
        }
        tokio::time::sleep(every).await;
    }
}

/// What a kubelet does when a pod it runs is deleted gracefully: stop the
/// containers and confirm with a deletion of grace period 0. There is no
/// kubelet on the test's real cluster, so without this every deleted pod
/// that was scheduled would stay Terminating for ever. Pods held by a
/// finalizer stay, as they would.
async fn play_kubelet(client: kube::Client, namespace: String) {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    loop {
        if let Ok(list) = pods.list(&Default::default()).await {
            for pod in list.items {
                let terminating = pod.metadata.deletion_timestamp.is_some()
                    && pod.metadata.deletion_grace_period_seconds != Some(0)
                    && pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
                if terminating && let Some(name) = pod.metadata.name.as_deref() {
                    let _ = pods
                        .delete(name, &DeleteParams::default().grace_period(0))
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Drop for Env {
    /// Stops what the test started, then, on the real cluster and unless the
    /// test already failed, fails it when a request of our sidecar was
    /// refused ([`Env::assert_nothing_refused`]): so every real-cluster test
    /// makes that check at its end, whether or not it made it before.
    fn drop(&mut self) {
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.abort();
        }
        self.kill_sidecar();
        // Told to stop before the fields go (the test's directory first).
        drop(self.driver_in_process.take());
        if !std::thread::panicking() {
            self.assert_nothing_refused();
            self.assert_every_request_declared();
            // An opt-out must name a refusal that happens: one that did not
            // is stale, and would hide the next real one.
            let (_, unseen) = self.refusals();
            assert!(
                unseen.is_empty(),
                "Env::expect_refusals declared refusals the API server never made: {:#?}",
                unseen
                    .iter()
                    .map(|e| format!("{} {} -> {}: {}", e.verb, e.resource, e.code, e.why))
                    .collect::<Vec<_>>()
            );
        }
    }
}

/// The `csi-hostpath` binary beside this test binary's profile directory,
/// built first when missing (`cargo test` builds only this package's
/// binaries).
pub fn driver_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("current exe");
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps/<test>");
            let path = profile_dir.join("csi-hostpath");
            if !path.exists() {
                build_driver(profile_dir);
            }
            path
        })
        .clone()
}

/// The kustomize components of `deploy/` the sidecar needs with `args`.
pub fn components_for(args: &[&str]) -> Vec<&'static str> {
    let gates: Vec<&str> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--feature-gates="))
        .flat_map(|list| list.split(','))
        .filter_map(|kv| kv.strip_suffix("=true"))
        .collect();
    let mut components = Vec::new();
    for (gate, component) in [
        ("PVCProtection", "pvc-protection"),
        ("StatefulSetAutoDeletePVC", "statefulset-auto-delete-pvc"),
        ("PVReleaser", "pv-releaser"),
        (
            "CrossNamespaceVolumeDataSource",
            "cross-namespace-data-source",
        ),
        ("PodPVCProvisioner", "pod-pvc-provisioner"),
    ] {
        if gates.contains(&gate) {
            components.push(component);
        }
    }
    if args
        .iter()
        .any(|a| *a == "--enable-capacity" || *a == "--enable-capacity=true")
    {
        components.push("capacity");
    }
    if args.iter().any(|a| {
        a.strip_prefix("--extra-create-metadata-namespace-labels=")
            .or_else(|| a.strip_prefix("--extra-create-metadata-namespace-annotations="))
            .is_some_and(|keys| keys.split(',').any(|k| !k.trim().is_empty()))
    }) {
        components.push("namespace-metadata");
    }
    components
}

fn describe(object: &Value) -> String {
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// JSON merge of `extra` into `base` (objects merged, the rest replaced).
pub fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(Value::Null), v);
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

/// `cargo build -p csi-hostpath --bin csi-hostpath` for the profile of
/// `profile_dir` (`target/<profile>`), unless the binary there is newer
/// than every source it is built from. Cargo's own check is not enough:
/// `-p csi-hostpath` alone resolves the shared dependencies' features
/// otherwise than `cargo test --workspace` (tokio, tracing-subscriber,
/// ...), so under the workspace's run it compiled a second copy (26 s of
/// CI's real-node test) of a binary that was current.
pub fn build_driver(profile_dir: &Path) {
    if driver_is_current(&profile_dir.join("csi-hostpath")) {
        return;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args([
        "build",
        "--locked",
        "-p",
        "csi-hostpath",
        "--bin",
        "csi-hostpath",
    ]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build -p csi-hostpath failed");
}

/// The driver binary at `binary` was built after the last change to its
/// package, the CSI protocol crate and `Cargo.lock`.
fn driver_is_current(binary: &Path) -> bool {
    fn newest(path: &Path) -> Option<std::time::SystemTime> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_dir() {
            return meta.modified().ok();
        }
        std::fs::read_dir(path)
            .ok()?
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name() != "target")
            .filter_map(|entry| newest(&entry.path()))
            .max()
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some(built) = std::fs::metadata(binary).and_then(|m| m.modified()).ok() else {
        return false;
    };
    ["tests/hostpath-driver", "proto", "Cargo.lock", "Cargo.toml"]
        .iter()
        .all(|source| newest(&workspace.join(source)).is_some_and(|changed| changed <= built))
}

/// A free TCP port on 127.0.0.1 (for `--http-endpoint`), below the
/// ephemeral range ([`controlplane::free_port`]).
pub fn free_port() -> u16 {
    controlplane::free_port().expect("free port")
}

/// A structured field as the sidecar's log shows it in the format the
/// harness runs it with, the default: klog's text format, `key="value"`
/// with the value quoted as Go's `strconv.Quote` (`src/logging.rs`).
#[allow(dead_code)]
pub fn log_field(key: &str, value: &str) -> String {
    format!("{key}={}", csi_provisioner::logging::go_quote(value))
}

/// A plain HTTP/1.1 GET: status and body.
pub async fn http_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, String::new());
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out).await;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    // The Go image answers a large /metrics in chunks.
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

/// The body of an HTTP/1.1 chunked answer: each chunk's size line (hex,
/// maybe with extensions) and the CRLF after its data go; what follows a
/// malformed size is dropped.
pub fn dechunk(mut body: &str) -> String {
    let mut out = String::with_capacity(body.len());
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = size.split(';').next().unwrap_or_default().trim();
        let Ok(size) = usize::from_str_radix(size, 16) else {
            break;
        };
        if size == 0 || rest.len() < size || !rest.is_char_boundary(size) {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
    out
}

/// The RBAC rules of `deploy/` with `components`: (ClusterRole rules,
/// Role rules).
pub fn deploy_rules(components: &[&str]) -> (Value, Value) {
    let objects = render::base_with_components(components).expect("render deploy/");
    let rules_of = |kind: &str| -> Value {
        objects
            .iter()
            .find(|o| o["kind"] == kind)
            .map(|o| o["rules"].clone())
            .unwrap_or_else(|| panic!("deploy/ has no {kind}"))
    };
    (rules_of("ClusterRole"), rules_of("Role"))
}

/// The upstream project's stock RBAC rules (deploy/kubernetes/rbac.yaml of
/// v6.3): (ClusterRole rules, Role rules).
pub fn upstream_stock_rules() -> (Value, Value) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/upstream-v6.3-rbac.yaml"
    ))
    .expect("fixture");
    let rules: Value = serde_yaml_ng::from_str(&text).expect("fixture YAML");
    (
        rules["clusterRules"].clone(),
        rules["namespaceRules"].clone(),
    )
}
