//! Controller-manager helpers: provisioner annotation, binding, Released,
//! Available.

mod common;

use common::*;
use kube_testserver::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER, TestServer,
};
use serde_json::{Value, json};

const PVCS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";
const SCS: &str = "/apis/storage.k8s.io/v1/storageclasses";

fn sc(name: &str, provisioner: &str, mode: &str) -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
           "provisioner": provisioner, "volumeBindingMode": mode})
}

fn pvc(name: &str, class: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}}})
}

fn claimed_pv(name: &str, claim: &Value) -> Value {
    let mut p = pv(name);
    p["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
        "name": claim["metadata"]["name"], "uid": claim["metadata"]["uid"]});
    p
}

fn ann<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o["metadata"]["annotations"][k].as_str()
}

#[tokio::test]
async fn provisioner_annotation_for_external_provisioners() {
    let s = TestServer::builder().controller_manager(true).build();
    post(&s, SCS, sc("ext", "csi.example.com", "Immediate")).await;
    post(
        &s,
        SCS,
        sc("intree", "kubernetes.io/no-provisioner", "Immediate"),
    )
    .await;
    post(
        &s,
        SCS,
        sc("wffc", "csi.example.com", "WaitForFirstConsumer"),
    )
    .await;
    post(&s, PVCS, pvc("a", "ext")).await;
    post(&s, PVCS, pvc("b", "intree")).await;
    post(&s, PVCS, pvc("c", "wffc")).await;
    post(&s, PVCS, pvc("d", "missing-class")).await;
    let (_, a) = get(&s, &format!("{PVCS}/a")).await;
    assert_eq!(ann(&a, ANN_STORAGE_PROVISIONER), Some("csi.example.com"));
    assert_eq!(
        ann(&a, ANN_BETA_STORAGE_PROVISIONER),
        Some("csi.example.com")
    );
    assert_eq!(a["status"]["phase"], "Pending");
    assert!(
        ann(
            &get(&s, &format!("{PVCS}/b")).await.1,
            ANN_STORAGE_PROVISIONER
        )
        .is_none()
    );
    assert!(
        ann(
            &get(&s, &format!("{PVCS}/d")).await.1,
            ANN_STORAGE_PROVISIONER
        )
        .is_none()
    );
    // WaitForFirstConsumer: only once the scheduler selected a node.
    let (_, c) = get(&s, &format!("{PVCS}/c")).await;
    assert!(ann(&c, ANN_STORAGE_PROVISIONER).is_none());
    patch(
        &s,
        &format!("{PVCS}/c"),
        json!({"metadata": {"annotations": {ANN_SELECTED_NODE: "node-1"}}}),
        "application/merge-patch+json",
    )
    .await;
    let (_, c) = get(&s, &format!("{PVCS}/c")).await;
    assert_eq!(ann(&c, ANN_STORAGE_PROVISIONER), Some("csi.example.com"));
    // A class created after the claim annotates it too.
    post(
        &s,
        SCS,
        sc("missing-class", "other.example.com", "Immediate"),
    )
    .await;
    assert_eq!(
        ann(
            &get(&s, &format!("{PVCS}/d")).await.1,
            ANN_STORAGE_PROVISIONER
        ),
        Some("other.example.com")
    );
}

#[tokio::test]
async fn helpers_are_off_by_default() {
    let s = TestServer::new();
    post(&s, SCS, sc("ext", "csi.example.com", "Immediate")).await;
    let (_, c) = post(&s, PVCS, pvc("a", "ext")).await;
    post(&s, PVS, claimed_pv("v", &c)).await;
    let (_, c) = get(&s, &format!("{PVCS}/a")).await;
    assert!(ann(&c, ANN_STORAGE_PROVISIONER).is_none());
    assert_eq!(c["status"]["phase"], "Pending");
    s.set_controller_manager(true);
    let (_, c) = get(&s, &format!("{PVCS}/a")).await;
    assert_eq!(
        c["status"]["phase"], "Bound",
        "turning on processes existing objects"
    );
}

#[tokio::test]
async fn binds_claim_to_the_pv_that_claims_it() {
    let s = TestServer::builder().controller_manager(true).build();
    post(&s, SCS, sc("ext", "csi.example.com", "Immediate")).await;
    let (_, claim) = post(&s, PVCS, pvc("c", "ext")).await;
    let mut v = claimed_pv("pv-c", &claim);
    v["spec"]["storageClassName"] = json!("ext");
    v["spec"]["capacity"] = json!({"storage": "2Gi"});
    post(&s, PVS, v).await;
    let (_, c) = get(&s, &format!("{PVCS}/c")).await;
    assert_eq!(c["spec"]["volumeName"], "pv-c");
    assert_eq!(c["status"]["phase"], "Bound");
    assert_eq!(c["status"]["capacity"]["storage"], "2Gi");
    assert_eq!(c["status"]["accessModes"], json!(["ReadWriteOnce"]));
    assert_eq!(ann(&c, ANN_BIND_COMPLETED), Some("yes"));
    assert_eq!(ann(&c, ANN_BOUND_BY_CONTROLLER), Some("yes"));
    let (_, p) = get(&s, &format!("{PVS}/pv-c")).await;
    assert_eq!(p["status"]["phase"], "Bound");
    // A PV whose claimRef names another uid does not bind.
    let (_, other) = post(&s, PVCS, pvc("o", "ext")).await;
    let mut stale = claimed_pv("pv-o", &other);
    stale["spec"]["claimRef"]["uid"] = json!("not-the-claim");
    post(&s, PVS, stale).await;
    let (_, o) = get(&s, &format!("{PVCS}/o")).await;
    assert!(o["spec"].get("volumeName").is_none());
    assert_eq!(
        get(&s, &format!("{PVS}/pv-o")).await.1["status"]["phase"],
        "Released"
    );
}

#[tokio::test]
async fn claim_with_volume_name_binds_free_pv() {
    let s = TestServer::builder().controller_manager(true).build();
    post(&s, PVS, pv("free")).await;
    assert_eq!(
        get(&s, &format!("{PVS}/free")).await.1["status"]["phase"],
        "Available"
    );
    let mut c = pvc("c", "");
    c["spec"]["volumeName"] = json!("free");
    let (_, claim) = post(&s, PVCS, c).await;
    let (_, p) = get(&s, &format!("{PVS}/free")).await;
    assert_eq!(p["spec"]["claimRef"]["uid"], claim["metadata"]["uid"]);
    assert_eq!(p["status"]["phase"], "Bound");
    let (_, c) = get(&s, &format!("{PVCS}/c")).await;
    assert_eq!(c["status"]["phase"], "Bound");
    assert_eq!(ann(&c, ANN_BIND_COMPLETED), Some("yes"));
    assert!(
        ann(&c, ANN_BOUND_BY_CONTROLLER).is_none(),
        "the user chose the volume"
    );
}

#[tokio::test]
async fn released_when_claim_is_gone_or_replaced() {
    let s = TestServer::builder().controller_manager(true).build();
    let (_, claim) = post(&s, PVCS, pvc("c", "")).await;
    post(&s, PVS, claimed_pv("v", &claim)).await;
    assert_eq!(
        get(&s, &format!("{PVS}/v")).await.1["status"]["phase"],
        "Bound"
    );
    delete(&s, &format!("{PVCS}/c"), None).await;
    assert_eq!(
        get(&s, &format!("{PVS}/v")).await.1["status"]["phase"],
        "Released"
    );
    // A new claim with the same name (new uid) does not bind the released PV.
    post(&s, PVCS, pvc("c", "")).await;
    assert_eq!(
        get(&s, &format!("{PVS}/v")).await.1["status"]["phase"],
        "Released"
    );
    assert_eq!(
        get(&s, &format!("{PVCS}/c")).await.1["status"]["phase"],
        "Pending"
    );
    // Clearing the claimRef makes it Available again.
    patch(
        &s,
        &format!("{PVS}/v"),
        json!({"spec": {"claimRef": null}}),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(
        get(&s, &format!("{PVS}/v")).await.1["status"]["phase"],
        "Available"
    );
    // A claimRef without uid to a missing claim is a pre-bound PV: Available.
    let mut pre = pv("pre");
    pre["spec"]["claimRef"] = json!({"namespace": "default", "name": "later"});
    post(&s, PVS, pre).await;
    assert_eq!(
        get(&s, &format!("{PVS}/pre")).await.1["status"]["phase"],
        "Available"
    );
    post(&s, PVCS, pvc("later", "")).await;
    assert_eq!(
        get(&s, &format!("{PVCS}/later")).await.1["spec"]["volumeName"],
        "pre"
    );
}

#[tokio::test]
async fn default_storage_class_admission() {
    // Admission, not a controller: on even with the helpers off.
    let s = TestServer::new();
    let mut older = sc("older", "csi.example.com", "Immediate");
    older["metadata"]["annotations"] =
        json!({"storageclass.kubernetes.io/is-default-class": "true"});
    post(&s, SCS, older).await;
    let mut newer = sc("newer", "csi.example.com", "Immediate");
    newer["metadata"]["annotations"] =
        json!({"storageclass.kubernetes.io/is-default-class": "true"});
    post(&s, SCS, newer).await;
    post(&s, SCS, sc("plain", "csi.example.com", "Immediate")).await;
    let mut no_class = pvc("a", "");
    no_class["spec"]
        .as_object_mut()
        .unwrap()
        .remove("storageClassName");
    let (_, a) = post(&s, PVCS, no_class).await;
    assert_eq!(a["spec"]["storageClassName"], "newer");
    let (_, b) = post(&s, PVCS, pvc("b", "")).await;
    assert_eq!(
        b["spec"]["storageClassName"], "",
        "an explicit empty class stays empty"
    );
}
