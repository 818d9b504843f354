//! End-to-end: storage capacity tracking (`--enable-capacity`) with the real
//! binary, the API test server and the hostpath driver with a capacity per
//! `kind`. The test reads objects directly from the server (not through
//! HTTP), so the request counters only show the sidecar's requests.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube_testserver::Verb;
use serde_json::json;
use support::{Backend, Env};

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;
const RESOURCE: &str = "csistoragecapacities";

/// Driver with 1Gi of kind `fast` (maximum volume size 1Gi too).
async fn env_with_capacity(topology: bool) -> Env {
    Env::new_with_driver(Backend::TestServer, |c| {
        c.capacity = BTreeMap::from([("fast".to_owned(), GI)]);
        c.max_volume_size = GI;
        c.enable_topology = topology;
    })
    .await
}

fn objects(env: &Env) -> Vec<CSIStorageCapacity> {
    let mut v: Vec<CSIStorageCapacity> = env.api().list(Some(&env.ns));
    v.sort_by(|a, b| a.storage_class_name.cmp(&b.storage_class_name));
    v
}

/// Our driver's objects of `class`.
fn of_class(env: &Env, class: &str) -> Vec<CSIStorageCapacity> {
    objects(env)
        .into_iter()
        .filter(|o| {
            o.storage_class_name == env.class(class)
                && o.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("csi.storage.k8s.io/drivername"))
                    .is_some_and(|d| d == env.driver_name.as_str())
        })
        .collect()
}

fn capacity(o: &CSIStorageCapacity) -> Option<&str> {
    o.capacity.as_ref().map(|q| q.0.as_str())
}

fn sidecar_capacity_requests(env: &Env) -> Vec<String> {
    env.api()
        .requests()
        .into_iter()
        .filter(|r| r.resource.starts_with(RESOURCE))
        .map(|r| format!("{:?} {} {}", r.verb, r.resource, r.name))
        .collect()
}

/// Waits for exactly one object of `class` with capacity `want`.
async fn wait_capacity(env: &Env, class: &str, want: &str) -> CSIStorageCapacity {
    env.wait_for(
        &format!("one CSIStorageCapacity of class {class} with capacity {want}"),
        Duration::from_secs(20),
        || async {
            let found = of_class(env, class);
            (found.len() == 1 && capacity(&found[0]) == Some(want)).then(|| found[0].clone())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_capacity_and_follows_provisioning_and_classes() {
    let mut env = env_with_capacity(true).await;
    let fast = json!({"kind": "fast", "csi.storage.k8s.io/fstype": "ext4"});
    env.storage_class("wffc", "WaitForFirstConsumer", "Delete", fast.clone())
        .await;
    env.storage_class("imm", "Immediate", "Delete", fast.clone())
        .await;
    env.api()
        .create_object(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "foreign"}, "provisioner": "other.csi.k8s.io",
            "volumeBindingMode": "WaitForFirstConsumer",
        }))
        .expect("foreign class");
    env.start_sidecar(&[
        "--enable-capacity",
        "--capacity-poll-interval=1s",
        "--capacity-ownerref-level=-1",
    ])
    .await;

    let first = wait_capacity(&env, "wffc", "1Gi").await;
    let labels = first.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("csi.storage.k8s.io/drivername")
            .map(String::as_str),
        Some(env.driver_name.as_str())
    );
    assert_eq!(
        labels
            .get("csi.storage.k8s.io/managed-by")
            .map(String::as_str),
        Some("external-provisioner")
    );
    assert!(
        first
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("csisc-")),
        "{:?}",
        first.metadata.name
    );
    assert_eq!(
        first
            .node_topology
            .as_ref()
            .and_then(|t| t.match_labels.clone()),
        Some(BTreeMap::from([(
            csi_hostpath::TOPOLOGY_KEY.to_owned(),
            env.node.as_str().to_owned()
        )]))
    );
    assert_eq!(
        first.maximum_volume_size.as_ref().map(|q| q.0.as_str()),
        Some("1Gi")
    );
    assert_eq!(first.metadata.owner_references, None, "level -1: no owner");
    assert!(
        of_class(&env, "imm").is_empty(),
        "Immediate class without --capacity-for-immediate-binding"
    );
    assert!(of_class(&env, "foreign").is_empty(), "other provisioner");

    // Unchanged capacity: polled every second, written never.
    let writes = |env: &Env| {
        [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete]
            .into_iter()
            .map(|v| env.api().request_count(v, RESOURCE))
            .sum::<u64>()
    };
    let before = writes(&env);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        writes(&env),
        before,
        "no write while nothing changes: {:?}",
        sidecar_capacity_requests(&env)
    );

    // A 100Mi volume of kind fast lowers the published capacity at the
    // next poll; the object is updated in place.
    env.create_pvc(&env.ns, "c1", "imm", "100Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "c1").await;
    let want = format!("{}Mi", (GI - 100 * MI) / MI);
    let updated = wait_capacity(&env, "wffc", &want).await;
    assert_eq!(updated.metadata.name, first.metadata.name, "same object");
    assert_eq!(
        env.api().request_count(Verb::Create, RESOURCE),
        1,
        "{:?}",
        sidecar_capacity_requests(&env)
    );
    assert!(env.api().request_count(Verb::Update, RESOURCE) >= 1);

    // Deleting the class deletes its object.
    env.api()
        .delete_object("storage.k8s.io/v1", "StorageClass", "", &env.class("wffc"))
        .expect("delete class");
    env.wait_for(
        "the object of wffc deleted",
        Duration::from_secs(20),
        || async { of_class(&env, "wffc").is_empty().then_some(()) },
    )
    .await;
    assert!(objects(&env).is_empty(), "{:?}", objects(&env));
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_pod_immediate_classes_and_no_topology() {
    let mut env = env_with_capacity(false).await;
    env.storage_class(
        "wffc",
        "WaitForFirstConsumer",
        "Delete",
        json!({"kind": "fast"}),
    )
    .await;
    env.storage_class("imm", "Immediate", "Delete", json!({"kind": "fast"}))
        .await;
    let pod: Pod = env
        .api()
        .create(
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "csi-provisioner-0", "namespace": &env.ns},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }))
            .expect("pod json"),
        )
        .expect("pod");
    let uid = pod.metadata.uid.clone().expect("uid");
    // An object of an earlier run without owner references, already right:
    // adopted, and updated only to get the owner.
    env.api()
        .create_object(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
            "metadata": {"name": "csisc-legacy", "namespace": &env.ns, "labels": {
                "csi.storage.k8s.io/drivername": env.driver_name.as_str(),
                "csi.storage.k8s.io/managed-by": "external-provisioner",
            }},
            "storageClassName": env.class("wffc"), "nodeTopology": {},
            "capacity": "1Gi", "maximumVolumeSize": "1Gi",
        }))
        .expect("legacy object");
    env.start_sidecar_with_env(
        &[
            "--enable-capacity",
            "--capacity-poll-interval=1s",
            "--capacity-ownerref-level=0",
            "--capacity-for-immediate-binding",
            "--capacity-threads=2",
        ],
        &[("POD_NAME", "csi-provisioner-0")],
    )
    .await;
    for class in ["imm", "wffc"] {
        let o = env
            .wait_for(
                &format!("the object of {class} with an owner"),
                Duration::from_secs(20),
                || async {
                    let found = of_class(&env, class);
                    (found.len() == 1 && found[0].metadata.owner_references.is_some())
                        .then(|| found[0].clone())
                },
            )
            .await;
        assert_eq!(capacity(&o), Some("1Gi"));
        let owners = o.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(owners[0].kind, "Pod");
        assert_eq!(owners[0].api_version, "v1");
        assert_eq!(owners[0].name, "csi-provisioner-0");
        assert_eq!(owners[0].uid, uid);
        assert_eq!(owners[0].controller, Some(true));
        let topology = o.node_topology.clone().expect("nodeTopology");
        assert!(
            topology.match_labels.is_none() && topology.match_expressions.is_none(),
            "driver without topology: the empty selector (all nodes), got {topology:?}"
        );
    }
    assert_eq!(objects(&env).len(), 2);
    assert_eq!(
        of_class(&env, "wffc")[0].metadata.name.as_deref(),
        Some("csisc-legacy")
    );
    assert_eq!(
        env.api().request_count(Verb::Create, RESOURCE),
        1,
        "only imm's object is new: {:?}",
        sidecar_capacity_requests(&env)
    );
    // The garbage collector removes the objects with their owner (the
    // sidecar is stopped first, as it would be with its pod).
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
    env.api()
        .delete_object("v1", "Pod", &env.ns, "csi-provisioner-0")
        .expect("delete pod");
    assert!(objects(&env).is_empty(), "{:?}", objects(&env));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopts_and_cleans_up_objects_of_a_previous_run() {
    let mut env = env_with_capacity(true).await;
    env.storage_class(
        "wffc",
        "WaitForFirstConsumer",
        "Delete",
        json!({"kind": "fast"}),
    )
    .await;
    let labels = json!({
        "csi.storage.k8s.io/drivername": env.driver_name.as_str(),
        "csi.storage.k8s.io/managed-by": "external-provisioner",
    });
    let topology = json!({"matchLabels": {csi_hostpath::TOPOLOGY_KEY: env.node.as_str()}});
    let object = |name: &str, class: &str, capacity: &str, labels: &serde_json::Value| {
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
            "metadata": {"name": name, "namespace": &env.ns, "labels": labels},
            "storageClassName": env.class(class), "nodeTopology": topology, "capacity": capacity,
        })
    };
    for o in [
        object("csisc-old", "wffc", "5Gi", &labels),
        object("csisc-dup", "wffc", "5Gi", &labels),
        object("csisc-gone", "deleted-class", "5Gi", &labels),
        object(
            "someone-else",
            "wffc",
            "5Gi",
            &json!({"csi.storage.k8s.io/drivername": "other.csi.k8s.io"}),
        ),
    ] {
        env.api().create_object(o).expect("object");
    }
    env.start_sidecar(&[
        "--enable-capacity",
        "--capacity-poll-interval=1s",
        "--capacity-ownerref-level=-1",
    ])
    .await;
    let adopted = wait_capacity(&env, "wffc", "1Gi").await;
    env.wait_for("stale objects deleted", Duration::from_secs(20), || async {
        let names: Vec<String> = objects(&env)
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect();
        (names.len() == 2).then_some(names)
    })
    .await;
    let mut names: Vec<String> = objects(&env)
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    names.sort();
    // Both were created in the same second: the name breaks the tie.
    assert_eq!(adopted.metadata.name.as_deref(), Some("csisc-dup"));
    assert_eq!(names, ["csisc-dup", "someone-else"]);
    assert_eq!(
        env.api().request_count(Verb::Create, RESOURCE),
        0,
        "adopted, not created: {:?}",
        sidecar_capacity_requests(&env)
    );
    let foreign: CSIStorageCapacity = env
        .api()
        .get(&env.ns, "someone-else")
        .expect("foreign object");
    assert_eq!(capacity(&foreign), Some("5Gi"), "not ours: untouched");
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_no_capacity_request_is_made() {
    let mut env = env_with_capacity(true).await;
    env.storage_class(
        "wffc",
        "WaitForFirstConsumer",
        "Delete",
        json!({"kind": "fast"}),
    )
    .await;
    env.storage_class("imm", "Immediate", "Delete", json!({"kind": "fast"}))
        .await;
    env.start_sidecar(&["--capacity-poll-interval=1s"]).await;
    env.create_pvc(&env.ns, "c1", "imm", "10Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "c1").await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(sidecar_capacity_requests(&env), Vec::<String>::new());
    assert!(objects(&env).is_empty());
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_pod_name_stops_the_sidecar() {
    let mut env = env_with_capacity(true).await;
    // Default --capacity-ownerref-level=1 needs POD_NAME.
    env.start_sidecar(&["--enable-capacity"]).await;
    let mut child = env.sidecar.take().expect("sidecar");
    let status = env
        .wait_for("the sidecar to exit", Duration::from_secs(20), || {
            let exited = child.try_wait();
            async move { exited }
        })
        .await;
    assert!(!status.success());
    let logs = env.logs();
    assert!(logs.contains("POD_NAME"), "{logs}");
    assert_eq!(sidecar_capacity_requests(&env), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_nodes_and_recreates_a_deleted_object() {
    let mut env = env_with_capacity(true).await;
    env.storage_class(
        "wffc",
        "WaitForFirstConsumer",
        "Delete",
        json!({"kind": "fast"}),
    )
    .await;
    // A long poll interval: what follows must come from watch events.
    let port = support::free_port();
    env.start_sidecar(&[
        "--enable-capacity",
        "--capacity-poll-interval=1h",
        "--capacity-ownerref-level=-1",
        &format!("--http-endpoint=127.0.0.1:{port}"),
    ])
    .await;
    let first = wait_capacity(&env, "wffc", "1Gi").await;

    // A second node with the driver: a second segment. The hostpath driver
    // has no storage for another node's topology, so it reports 0.
    env.add_node("node-2").await;
    let segment_of = |o: &CSIStorageCapacity| {
        o.node_topology
            .as_ref()
            .and_then(|t| t.match_labels.as_ref())
            .and_then(|l| l.get(csi_hostpath::TOPOLOGY_KEY).cloned())
    };
    let published = env
        .wait_for("an object per node", Duration::from_secs(20), || async {
            let found = of_class(&env, "wffc");
            (found.len() == 2).then_some(found)
        })
        .await;
    let mut by_node: Vec<(Option<String>, Option<String>)> = published
        .iter()
        .map(|o| (segment_of(o), capacity(o).map(str::to_owned)))
        .collect();
    by_node.sort();
    let mut expected = vec![
        (Some("node-2".to_owned()), Some("0".to_owned())),
        (Some(env.node.as_str().to_owned()), Some("1Gi".to_owned())),
    ];
    expected.sort();
    assert_eq!(by_node, expected);

    // Someone deletes our object: it is published again.
    let name = first.metadata.name.clone().expect("name");
    env.api()
        .delete_object("storage.k8s.io/v1", "CSIStorageCapacity", &env.ns, &name)
        .expect("delete object");
    let again = env
        .wait_for("the object recreated", Duration::from_secs(20), || async {
            of_class(&env, "wffc")
                .into_iter()
                .find(|o| segment_of(o).as_deref() == Some(env.node.as_str()))
        })
        .await;
    assert_ne!(again.metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(capacity(&again), Some("1Gi"));

    // Someone changes its capacity: it is corrected.
    let again_name = again.metadata.name.clone().expect("name");
    let mut edited = env
        .api()
        .get_object(
            "storage.k8s.io/v1",
            "CSIStorageCapacity",
            &env.ns,
            &again_name,
        )
        .expect("object");
    edited["capacity"] = json!("7Gi");
    env.api().update_object(edited).expect("edit object");
    env.wait_for(
        "the capacity corrected",
        Duration::from_secs(20),
        || async {
            let o: CSIStorageCapacity = env.api().get(&env.ns, &again_name)?;
            (capacity(&o) == Some("1Gi")).then_some(())
        },
    )
    .await;

    // The node's CSINode loses the driver: its segment goes.
    env.api()
        .delete_object("storage.k8s.io/v1", "CSINode", "", "node-2")
        .expect("delete csinode");
    env.wait_for(
        "node-2's object deleted",
        Duration::from_secs(20),
        || async {
            let found = of_class(&env, "wffc");
            (found.len() == 1 && segment_of(&found[0]).as_deref() == Some(env.node.as_str()))
                .then_some(())
        },
    )
    .await;
    // The Go image's two queues of this loop, measured on their work: the
    // segments computed again at start and after the Node and CSINode
    // changes (`csitopology`), the pairs and sweeps (`csistoragecapacity`).
    let (_, metrics) = support::http_get(port, "/metrics").await;
    let value = |family: &str, queue: &str| -> f64 {
        let series = format!("{family}{{name=\"{queue}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
    };
    for (queue, at_least) in [("csitopology", 3.0), ("csistoragecapacity", 4.0)] {
        assert!(
            value("workqueue_adds_total", queue) >= at_least,
            "{queue}: {metrics}"
        );
        assert!(
            value("workqueue_work_duration_seconds_count", queue) >= at_least,
            "{queue}: {metrics}"
        );
        assert!(
            value("workqueue_queue_duration_seconds_count", queue) >= at_least,
            "{queue}: {metrics}"
        );
        assert_eq!(value("workqueue_depth", queue), 0.0, "{queue}: {metrics}");
    }
    assert!(
        env.logs()
            .lines()
            .filter(|l| l.contains("\"topology changed\""))
            .count()
            >= 2,
        "a segment added, then removed\n{}",
        env.logs()
    );
    assert!(
        !metrics.contains("name=\"capacity\""),
        "the queue has the Go image's name\n{metrics}"
    );
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_get_capacity_is_retried_and_keeps_the_published_value() {
    let mut env = env_with_capacity(true).await;
    env.storage_class(
        "wffc",
        "WaitForFirstConsumer",
        "Delete",
        json!({"kind": "fast"}),
    )
    .await;
    // The first two calls fail: the object appears after the retries.
    env.set_faults(vec![
        csi_hostpath::faults::Fault::error("GetCapacity", tonic::Code::Unavailable).times(2),
    ]);
    env.start_sidecar(&[
        "--enable-capacity",
        "--capacity-poll-interval=1s",
        "--capacity-ownerref-level=-1",
    ])
    .await;
    let first = wait_capacity(&env, "wffc", "1Gi").await;
    let logs = env.logs();
    assert!(
        logs.contains("GetCapacity for class wffc") && logs.contains("failed"),
        "the failure is logged\n{logs}"
    );

    // While the driver fails, the published object stays as it is.
    env.set_faults(vec![csi_hostpath::faults::Fault::error(
        "GetCapacity",
        tonic::Code::Internal,
    )]);
    let failed_before = env.logs().matches("GetCapacity for class wffc").count();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(
        env.logs().matches("GetCapacity for class wffc").count() > failed_before,
        "still polled, still failing\n{}",
        env.logs()
    );
    let still = of_class(&env, "wffc");
    assert_eq!(still.len(), 1);
    assert_eq!(still[0].metadata.name, first.metadata.name);
    assert_eq!(capacity(&still[0]), Some("1Gi"));
    env.clear_faults();
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn level_one_owner_is_the_pods_statefulset() {
    let mut env = env_with_capacity(true).await;
    env.storage_class(
        "wffc",
        "WaitForFirstConsumer",
        "Delete",
        json!({"kind": "fast"}),
    )
    .await;
    let set = env
        .api()
        .create_object(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "csi-controller", "namespace": &env.ns},
            "spec": {
                "serviceName": "csi", "replicas": 1,
                "selector": {"matchLabels": {"app": "csi"}},
                "template": {"metadata": {"labels": {"app": "csi"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]}},
            },
        }))
        .expect("statefulset");
    let set_uid = set["metadata"]["uid"].as_str().expect("uid").to_owned();
    env.api()
        .create_object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "csi-controller-0", "namespace": &env.ns,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "csi-controller", "uid": set_uid, "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }))
        .expect("pod");
    env.start_sidecar_with_env(
        &[
            "--enable-capacity",
            "--capacity-poll-interval=1s",
            "--capacity-ownerref-level=1",
        ],
        &[("POD_NAME", "csi-controller-0")],
    )
    .await;
    let o = wait_capacity(&env, "wffc", "1Gi").await;
    let owners = o.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0].api_version.as_str(),
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].uid.as_str(),
            owners[0].controller
        ),
        (
            "apps/v1",
            "StatefulSet",
            "csi-controller",
            set_uid.as_str(),
            Some(true)
        )
    );
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());

    // Level 2 above a StatefulSet: nothing controls it, the sidecar refuses.
    env.start_sidecar_with_env(
        &["--enable-capacity", "--capacity-ownerref-level=2"],
        &[("POD_NAME", "csi-controller-0")],
    )
    .await;
    let mut child = env.sidecar.take().expect("sidecar");
    let status = env
        .wait_for("the sidecar to exit", Duration::from_secs(20), || {
            let exited = child.try_wait();
            async move { exited }
        })
        .await;
    assert!(!status.success());
    let logs = env.logs();
    let expected = format!(
        "StatefulSet {}/csi-controller has no controlling owner",
        env.ns
    );
    assert!(logs.contains(&expected), "{logs}");
}

/// How long the sidecar's watch of one kind is held back below.
const WATCH_LAG: Duration = Duration::from_secs(4);

/// The log line of a deletion the live read refused (src/capacity/worker.rs).
const KEPT: &str = "not deleting CSIStorageCapacity";

/// The sidecar's DELETE requests of CSIStorageCapacity objects.
fn capacity_deletes(env: &Env) -> u64 {
    env.api().request_count(Verb::Delete, RESOURCE)
}

/// A class deleted and re-created at once (to change a field that cannot
/// be updated): while the class watch lags, the sidecar's cache sees the
/// class gone a second after it is back. Its objects rest on the class, so
/// the deletion is confirmed by a live read of the class, which exists:
/// the object stays, and the pods of the class stay schedulable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_recreated_while_its_watch_lags_keeps_its_object() {
    let mut env = env_with_capacity(true).await;
    let fast = json!({"kind": "fast"});
    env.storage_class("wffc", "WaitForFirstConsumer", "Delete", fast.clone())
        .await;
    env.start_sidecar(&[
        "--enable-capacity",
        "--capacity-poll-interval=1h",
        "--capacity-ownerref-level=-1",
    ])
    .await;
    let first = wait_capacity(&env, "wffc", "1Gi").await;

    env.lag_watch("storageclasses", WATCH_LAG);
    env.api()
        .delete_object("storage.k8s.io/v1", "StorageClass", "", &env.class("wffc"))
        .expect("delete class");
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.storage_class("wffc", "WaitForFirstConsumer", "Delete", fast)
        .await;
    // Both events reach the sidecar, a second apart.
    tokio::time::sleep(WATCH_LAG + Duration::from_secs(2)).await;
    assert!(
        env.watch_events_held("storageclasses") >= 2,
        "the class watch was held back"
    );
    assert_eq!(
        capacity_deletes(&env),
        0,
        "no deletion: {:?}\n{}",
        sidecar_capacity_requests(&env),
        env.logs()
    );
    let now = wait_capacity(&env, "wffc", "1Gi").await;
    assert_eq!(now.metadata.name, first.metadata.name, "the same object");
    assert!(env.logs().contains(KEPT), "{}", env.logs());
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

/// The driver re-registers on a node (its CSINode deleted and re-created)
/// while the CSINode watch lags: the sidecar's cache sees the node's
/// segment gone a second after it is back. The deletion of the segment's
/// object is confirmed by a live read of the node's CSINode, which lists
/// the driver again: the object stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csinode_recreated_while_its_watch_lags_keeps_its_segment() {
    recreated_while_its_watch_lags_keeps_its_segment("csinodes", "storage.k8s.io/v1", "CSINode")
        .await;
}

/// The same with the node's Node object (re-registered by its kubelet)
/// and the Node watch: confirmed by a live read of the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_recreated_while_its_watch_lags_keeps_its_segment() {
    recreated_while_its_watch_lags_keeps_its_segment("nodes", "v1", "Node").await;
}

async fn recreated_while_its_watch_lags_keeps_its_segment(
    resource: &str,
    api_version: &str,
    kind: &str,
) {
    let mut env = env_with_capacity(true).await;
    env.storage_class(
        "wffc",
        "WaitForFirstConsumer",
        "Delete",
        json!({"kind": "fast"}),
    )
    .await;
    env.add_node("node-2").await;
    env.start_sidecar(&[
        "--enable-capacity",
        "--capacity-poll-interval=1h",
        "--capacity-ownerref-level=-1",
    ])
    .await;
    let published = env
        .wait_for("an object per node", Duration::from_secs(20), || async {
            let found = of_class(&env, "wffc");
            (found.len() == 2).then_some(found)
        })
        .await;
    let mut names: Vec<String> = published
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    names.sort();

    env.lag_watch(resource, WATCH_LAG);
    let object = env
        .api()
        .get_object(api_version, kind, "", "node-2")
        .expect("node-2's object");
    env.api()
        .delete_object(api_version, kind, "", "node-2")
        .expect("delete");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut again = json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": "node-2", "labels": object["metadata"]["labels"]},
    });
    if !object["spec"].is_null() {
        again["spec"] = object["spec"].clone();
    }
    env.create(again).await;
    tokio::time::sleep(WATCH_LAG + Duration::from_secs(2)).await;
    assert!(
        env.watch_events_held(resource) >= 2,
        "the {resource} watch was held back"
    );
    assert_eq!(
        capacity_deletes(&env),
        0,
        "no deletion: {:?}\n{}",
        sidecar_capacity_requests(&env),
        env.logs()
    );
    let mut now: Vec<String> = of_class(&env, "wffc")
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    now.sort();
    assert_eq!(now, names, "the same objects");
    assert!(env.logs().contains(KEPT), "{}", env.logs());

    // A segment really gone still goes (the live read agrees).
    env.clear_watch_lag(resource);
    env.api()
        .delete_object(api_version, kind, "", "node-2")
        .expect("delete");
    env.wait_for(
        "node-2's object deleted",
        Duration::from_secs(20 + WATCH_LAG.as_secs()),
        || async { (of_class(&env, "wffc").len() == 1).then_some(()) },
    )
    .await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}
