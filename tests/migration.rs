//! CSI migration end to end: claims of in-tree StorageClasses
//! (`kubernetes.io/aws-ebs`, EKS's `gp2`; `kubernetes.io/gce-pd`) served by
//! the sidecar of their CSI migration target, provisioned as in-tree PVs and
//! deleted through their translated volume handle.
//!
//! Real cluster only: it is the controller-manager's PV binder that writes
//! the claim's storage-provisioner annotations of an in-tree class (a 1.36
//! one writes the CSI driver's name); our API test server would copy the
//! class's provisioner instead, which no release does for these classes.
//!
//! Every test here runs the same driver name (a migration target is a fixed
//! name) on one shared cluster, so they take turns: two sidecars of one
//! driver would both serve each other's claims.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::json;
use support::{Backend, ClusterConfig, Env, http_get};
use tokio::sync::Mutex;

e2e_real!(ClusterConfig::standard();
    aws_ebs_class_with_topology,
    aws_ebs_class_without_topology,
    gce_pd_class_with_topology,
    a_topology_key_the_translation_does_not_know_fails_the_claim,
);

static ONE_DRIVER_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const REGION_LABEL: &str = "topology.kubernetes.io/region";

/// One in-tree plugin and the CSI driver that took it over.
#[derive(Clone, Copy)]
struct Plugin {
    in_tree: &'static str,
    driver: &'static str,
    topology_key: &'static str,
    /// The class parameters of the usual default class.
    parameters: &'static [(&'static str, &'static str)],
    /// A zone of the cloud's form, unique to the test (the Node's name too),
    /// and its region.
    zone: fn(&str) -> (String, String),
}

const AWS_EBS: Plugin = Plugin {
    in_tree: "kubernetes.io/aws-ebs",
    driver: "ebs.csi.aws.com",
    topology_key: "topology.ebs.csi.aws.com/zone",
    parameters: &[("type", "gp2"), ("fsType", "ext4")],
    zone: |id| (format!("mg-{id}-1a"), format!("mg-{id}-1")),
};

const GCE_PD: Plugin = Plugin {
    in_tree: "kubernetes.io/gce-pd",
    driver: "pd.csi.storage.gke.io",
    topology_key: "topology.gke.io/zone",
    parameters: &[("type", "pd-standard"), ("fsType", "ext4")],
    zone: |id| (format!("mg-{id}-a"), format!("mg-{id}")),
};

/// An environment whose driver is `plugin`'s CSI driver, on a node named
/// after a zone of the cloud's form; returns it with the zone and region.
async fn env_for(
    backend: Backend,
    plugin: Plugin,
    topology_key: &str,
    configure: impl FnOnce(&mut csi_hostpath::Config),
) -> (Env, String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string()[..6].to_owned();
    let (zone, region) = (plugin.zone)(&id);
    let node = zone.clone();
    let key = topology_key.to_owned();
    let env = Env::new_with_driver(backend, move |driver| {
        driver.driver_name = plugin.driver.to_owned();
        driver.topology_key = key;
        driver.node_id = node;
        configure(driver);
    })
    .await;
    remove_other_nodes_of(&env, plugin.driver).await;
    (env, zone, region)
}

/// Removes the nodes an earlier test of this driver left behind (it failed
/// before its own cleanup): their topology would be requested too.
async fn remove_other_nodes_of(env: &Env, driver: &str) {
    use k8s_openapi::api::storage::v1::CSINode;
    let nodes: kube::Api<CSINode> = kube::Api::all(env.client.clone());
    let listed = nodes
        .list(&Default::default())
        .await
        .expect("list CSINodes");
    for node in listed.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        let has_driver = node.spec.drivers.iter().any(|d| d.name == driver);
        if has_driver && name != env.node {
            env.delete("v1", "Node", "", &name).await;
            env.delete("storage.k8s.io/v1", "CSINode", "", &name).await;
        }
    }
}

/// The in-tree StorageClass, as the cloud's installer writes it; returns
/// its short name (see `Env::class`).
async fn in_tree_class(env: &Env, plugin: Plugin) -> &'static str {
    let name = env.class("default");
    let parameters: serde_json::Map<String, serde_json::Value> = plugin
        .parameters
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    env.create(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": plugin.in_tree,
        "parameters": parameters,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }))
    .await;
    "default"
}

/// Removes the test's Node and CSINode (the driver name is shared, so a
/// later test must not find this node's topology).
async fn remove_node(env: &Env) {
    env.delete("v1", "Node", "", &env.node).await;
    env.delete("storage.k8s.io/v1", "CSINode", "", &env.node)
        .await;
}

fn in_tree_volume_id(pv: &PersistentVolume, plugin: Plugin) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    match plugin.in_tree {
        "kubernetes.io/aws-ebs" => spec
            .aws_elastic_block_store
            .as_ref()
            .map(|s| s.volume_id.clone()),
        "kubernetes.io/gce-pd" => spec.gce_persistent_disk.as_ref().map(|s| s.pd_name.clone()),
        _ => None,
    }
}

fn in_tree_fs_type(pv: &PersistentVolume) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    spec.aws_elastic_block_store
        .as_ref()
        .and_then(|s| s.fs_type.clone())
        .or_else(|| {
            spec.gce_persistent_disk
                .as_ref()
                .and_then(|s| s.fs_type.clone())
        })
}

/// The count of `method`'s CSI calls with `migrated="<migrated>"`.
fn csi_calls(metrics: &str, method: &str, migrated: bool) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count{"))
        .filter(|l| l.contains(&format!("method_name=\"/csi.v1.Controller/{method}\"")))
        .filter(|l| l.contains(&format!("migrated=\"{migrated}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Provision and delete one claim of the in-tree class, checking every
/// field upstream writes.
async fn provision_and_delete(backend: Backend, plugin: Plugin, topology: bool) {
    let _turn = ONE_DRIVER_AT_A_TIME.lock().await;
    let (mut env, zone, region) = env_for(backend, plugin, plugin.topology_key, |d| {
        if plugin.in_tree == GCE_PD.in_tree {
            d.volume_id_format = csi_hostpath::VolumeIdFormat::GcePd;
        }
    })
    .await;
    let class = in_tree_class(&env, plugin).await;
    let port = support::free_port();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let mut args = vec![http.as_str()];
    if !topology {
        args.push("--feature-gates=Topology=false");
    }
    env.start_sidecar(&args).await;

    env.create_pvc(&env.ns, "data", class, "1Gi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let pv_name = pv.metadata.name.clone().expect("PV name");

    // What the real controller-manager wrote on the claim.
    let claim = env.pvc(&env.ns, "data").await.expect("claim");
    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(STORAGE_PROVISIONER).map(String::as_str),
        Some(plugin.driver),
        "{annotations:?}"
    );
    assert_eq!(
        annotations
            .get(BETA_STORAGE_PROVISIONER)
            .map(String::as_str),
        Some(plugin.driver)
    );

    // The PV in its in-tree form, as the Go sidecar writes it.
    let pv_annotations = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        pv_annotations.get(PROVISIONED_BY).map(String::as_str),
        Some(plugin.in_tree)
    );
    assert_eq!(
        pv_annotations.get(MIGRATED_TO).map(String::as_str),
        Some(plugin.driver)
    );
    assert!(
        support::finalizers(&pv).contains(&FINALIZER.to_owned()),
        "{:?}",
        support::finalizers(&pv)
    );
    let spec = pv.spec.clone().expect("spec");
    assert!(spec.csi.is_none(), "an in-tree PV has no CSI source");
    assert_eq!(in_tree_fs_type(&pv).as_deref(), Some("ext4"));
    let backend = env.backend_volumes();
    assert_eq!(backend.len(), 1, "one backend volume: {backend:?}");
    let volume = &backend[0];
    let in_tree_id = in_tree_volume_id(&pv, plugin).expect("in-tree source");
    assert!(
        volume.id.ends_with(&in_tree_id),
        "the PV records the backend volume: {} vs {in_tree_id}",
        volume.id
    );
    let wanted_type = plugin.parameters[0].1;
    assert_eq!(
        volume.parameters.get("type").map(String::as_str),
        Some(wanted_type),
        "the translated class parameters reach CreateVolume: {:?}",
        volume.parameters
    );
    assert!(
        !volume.parameters.contains_key("fsType"),
        "fsType is the sidecar's, not the driver's: {:?}",
        volume.parameters
    );
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    let affinity_keys: Vec<String> = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .map(|e| {
                    format!(
                        "{}={}",
                        e.key,
                        e.values.clone().unwrap_or_default().join(",")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    if topology {
        assert_eq!(labels.get(ZONE_LABEL), Some(&zone), "{labels:?}");
        assert_eq!(labels.get(REGION_LABEL), Some(&region), "{labels:?}");
        assert_eq!(
            affinity_keys,
            [
                format!("{ZONE_LABEL}={zone}"),
                format!("{REGION_LABEL}={region}")
            ],
            "node affinity with the in-tree keys (csi-translation-lib adds the region)"
        );
    } else {
        assert!(!labels.contains_key(ZONE_LABEL), "{labels:?}");
        assert!(affinity_keys.is_empty(), "{affinity_keys:?}");
    }
    env.wait_event(&env.ns, "data", "ProvisioningSucceeded")
        .await;

    // Deleting the claim deletes the backend volume through the translated
    // handle, then the PV.
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for(
        "the in-tree PV and its backend volume gone",
        Duration::from_secs(60),
        || async {
            (env.pv(&pv_name).await.is_none() && env.backend_volumes().is_empty()).then_some(())
        },
    )
    .await;
    let (_, metrics) = http_get(port, "/metrics").await;
    for method in ["CreateVolume", "DeleteVolume"] {
        assert_eq!(csi_calls(&metrics, method, true), 1, "{method}\n{metrics}");
        assert_eq!(csi_calls(&metrics, method, false), 0, "{method}\n{metrics}");
    }
    env.assert_nothing_forbidden();
    remove_node(&env).await;
}

async fn aws_ebs_class_with_topology(backend: Backend) {
    provision_and_delete(backend, AWS_EBS, true).await;
}

async fn aws_ebs_class_without_topology(backend: Backend) {
    provision_and_delete(backend, AWS_EBS, false).await;
}

async fn gce_pd_class_with_topology(backend: Backend) {
    provision_and_delete(backend, GCE_PD, true).await;
}

/// A driver reporting a topology key the translation does not know: the
/// volume cannot be written as an in-tree PV. Upstream fails with "failed
/// to translate topology"; so do we, with that event, no PV, and the
/// volume deleted again.
async fn a_topology_key_the_translation_does_not_know_fails_the_claim(backend: Backend) {
    let _turn = ONE_DRIVER_AT_A_TIME.lock().await;
    let (mut env, _, _) = env_for(backend, AWS_EBS, "topology.example.com/rack", |_| {}).await;
    let class = in_tree_class(&env, AWS_EBS).await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "data", class, "1Gi", json!({}))
        .await;
    let message = env.wait_event(&env.ns, "data", "ProvisioningFailed").await;
    assert!(
        message.contains("failed to translate topology"),
        "{message}"
    );
    let claim = env.pvc(&env.ns, "data").await.expect("claim");
    assert_eq!(
        claim.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    assert!(
        claim.spec.and_then(|s| s.volume_name).is_none(),
        "no PV for the claim"
    );
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for(
        "no backend volume left",
        Duration::from_secs(60),
        || async { env.backend_volumes().is_empty().then_some(()) },
    )
    .await;
    env.assert_nothing_forbidden();
    remove_node(&env).await;
}
