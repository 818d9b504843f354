//! Every patch type on metadata.finalizers and metadata.ownerReferences,
//! strategic-merge directives, server-side apply.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_testserver::TestServer;
use serde_json::{Value, json};

const MERGE: &str = "application/merge-patch+json";
const JSON: &str = "application/json-patch+json";
const SMP: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

fn owner(uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "name": format!("o-{uid}"), "uid": uid})
}

async fn with_meta(s: &TestServer, meta: Value) -> Value {
    let mut c = cm("t");
    c["metadata"]
        .as_object_mut()
        .unwrap()
        .extend(meta.as_object().unwrap().clone());
    // The owners are unknown uids: keep GC out of the way.
    s.set_gc(false);
    let (code, o) = post(s, CMS, c).await;
    assert_eq!(code, 201, "{o}");
    o
}

#[tokio::test]
async fn finalizers_with_every_patch_type() {
    let s = TestServer::new();
    let path = format!("{CMS}/t");
    with_meta(&s, json!({"finalizers": ["a", "b"]})).await;
    // Merge patch replaces the list.
    let (_, o) = patch(&s, &path, json!({"metadata": {"finalizers": ["c"]}}), MERGE).await;
    assert_eq!(o["metadata"]["finalizers"], json!(["c"]));
    // Strategic merge patch: set union.
    let (_, o) = patch(
        &s,
        &path,
        json!({"metadata": {"finalizers": ["a", "c"]}}),
        SMP,
    )
    .await;
    assert_eq!(
        o["metadata"]["finalizers"],
        json!(["a", "c"]),
        "patch order first"
    );
    let (_, o) = patch(&s, &path, json!({"metadata": {"finalizers": ["d"]}}), SMP).await;
    // As in apimachinery's mergeSortedSlice: items new to the list go before
    // server-only items.
    assert_eq!(o["metadata"]["finalizers"], json!(["d", "a", "c"]));
    // $deleteFromPrimitiveList.
    let (_, o) = patch(
        &s,
        &path,
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["c", "d"]}}),
        SMP,
    )
    .await;
    assert_eq!(o["metadata"]["finalizers"], json!(["a"]));
    // JSON patch add / test / remove.
    let (_, o) = patch(
        &s,
        &path,
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "z"}]),
        JSON,
    )
    .await;
    assert_eq!(o["metadata"]["finalizers"], json!(["a", "z"]));
    let (code, st) = patch(&s, &path, json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "nope"}, {"op": "remove", "path": "/metadata/finalizers/0"}]), JSON).await;
    assert_eq!(code, 422, "failed test op: {st}");
    let (_, o) = patch(&s, &path, json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "a"}, {"op": "remove", "path": "/metadata/finalizers/0"}]), JSON).await;
    assert_eq!(o["metadata"]["finalizers"], json!(["z"]));
    // Server-side apply merges the applied list as a set.
    let (code, o) = raw(
        &s,
        http::Method::PATCH,
        &format!("{path}?fieldManager=test&force=true"),
        Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "t", "finalizers": ["y"]}})),
        APPLY,
    )
    .await;
    assert_eq!(code, 200, "{o}");
    assert_eq!(o["metadata"]["finalizers"], json!(["z", "y"]));
    // Merge patch null removes the field.
    let (_, o) = patch(&s, &path, json!({"metadata": {"finalizers": null}}), MERGE).await;
    assert!(o["metadata"].get("finalizers").is_none());
}

#[tokio::test]
async fn owner_references_with_every_patch_type() {
    let s = TestServer::new();
    let path = format!("{CMS}/t");
    with_meta(&s, json!({"ownerReferences": [owner("1"), owner("2")]})).await;
    let uids = |o: &Value| -> Vec<String> {
        o["metadata"]["ownerReferences"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| r["uid"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    // SMP: merged by uid; an existing entry is updated in place.
    let mut changed = owner("2");
    changed["controller"] = json!(true);
    let (_, o) = patch(
        &s,
        &path,
        json!({"metadata": {"ownerReferences": [changed, owner("3")]}}),
        SMP,
    )
    .await;
    assert_eq!(uids(&o), ["1", "2", "3"]);
    assert_eq!(o["metadata"]["ownerReferences"][1]["controller"], true);
    // SMP $patch: delete by key.
    let (_, o) = patch(
        &s,
        &path,
        json!({"metadata": {"ownerReferences": [{"uid": "1", "$patch": "delete"}]}}),
        SMP,
    )
    .await;
    assert_eq!(uids(&o), ["2", "3"]);
    // SMP $patch: replace.
    let (_, o) = patch(
        &s,
        &path,
        json!({"metadata": {"ownerReferences": [owner("9"), {"$patch": "replace"}]}}),
        SMP,
    )
    .await;
    assert_eq!(uids(&o), ["9"]);
    // Merge patch replaces.
    let (_, o) = patch(
        &s,
        &path,
        json!({"metadata": {"ownerReferences": [owner("4"), owner("5")]}}),
        MERGE,
    )
    .await;
    assert_eq!(uids(&o), ["4", "5"]);
    // JSON patch by index.
    let (_, o) = patch(
        &s,
        &path,
        json!([{"op": "remove", "path": "/metadata/ownerReferences/0"}]),
        JSON,
    )
    .await;
    assert_eq!(uids(&o), ["5"]);
    // Apply merges by uid.
    let (code, o) = raw(
        &s,
        http::Method::PATCH,
        &format!("{path}?fieldManager=m"),
        Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "t", "ownerReferences": [owner("6")]}})),
        APPLY,
    )
    .await;
    assert_eq!(code, 200, "{o}");
    assert_eq!(uids(&o), ["5", "6"]);
}

#[tokio::test]
async fn patch_errors() {
    let s = TestServer::new();
    post(&s, CMS, cm("a")).await;
    let path = format!("{CMS}/a");
    assert_eq!(
        patch(&s, &format!("{CMS}/missing"), json!({}), MERGE)
            .await
            .0,
        404
    );
    assert_eq!(patch(&s, &path, json!({}), "application/json").await.0, 415);
    let (code, st) = raw(
        &s,
        http::Method::PATCH,
        &path,
        Some(json!({"apiVersion": "v1", "kind": "ConfigMap"})),
        APPLY,
    )
    .await;
    assert_eq!(code, 422, "apply needs fieldManager: {st}");
    // A stale resourceVersion in a patch conflicts.
    let (code, st) = patch(
        &s,
        &path,
        json!({"metadata": {"resourceVersion": "1"}, "data": {"k": "x"}}),
        MERGE,
    )
    .await;
    assert_eq!(code, 409, "{st}");
    // Strategic merge patch is not supported for custom resources.
    let vs = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass", "metadata": {"name": "c"}, "driver": "d", "deletionPolicy": "Delete"});
    let (code, _) = post(
        &s,
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses",
        vs,
    )
    .await;
    assert_eq!(code, 201);
    let (code, _) = patch(
        &s,
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses/c",
        json!({"driver": "e"}),
        SMP,
    )
    .await;
    assert_eq!(code, 415);
    let (code, o) = patch(
        &s,
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses/c",
        json!({"driver": "e"}),
        MERGE,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        o["metadata"]["generation"], 2,
        "custom resources track generation"
    );
}

#[tokio::test]
async fn kube_client_patches_and_apply_creates() {
    let s = TestServer::new();
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    let pp = PatchParams::apply("tester").force();
    let applied = api
        .patch("ssa", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}})))
        .await
        .unwrap();
    assert_eq!(applied.data.unwrap()["a"], "1");
    let again = api
        .patch("ssa", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"b": "2"}})))
        .await
        .unwrap();
    let data = again.data.unwrap();
    assert_eq!(
        (data["a"].as_str(), data["b"].as_str()),
        ("1", "2"),
        "simplified apply merges"
    );
    let p: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]),
    )
    .unwrap();
    let j = api
        .patch("ssa", &PatchParams::default(), &Patch::<()>::Json(p))
        .await
        .unwrap();
    assert_eq!(j.metadata.labels.unwrap()["x"], "y");
    let st = api
        .patch(
            "ssa",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"finalizers": ["f"]}})),
        )
        .await
        .unwrap();
    assert_eq!(st.metadata.finalizers.unwrap(), ["f"]);
    // Apply on the status subresource changes only status.
    let pvs: Api<PersistentVolume> = Api::all(s.client());
    pvs.create(
        &Default::default(),
        &serde_json::from_value(pv("v")).unwrap(),
    )
    .await
    .unwrap();
    let v = pvs
        .patch_status("v", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "v"}, "status": {"phase": "Failed"}, "spec": {"storageClassName": "ignored"}})))
        .await
        .unwrap();
    assert_eq!(v.status.unwrap().phase.as_deref(), Some("Failed"));
    assert_eq!(v.spec.unwrap().storage_class_name, None);
}

#[tokio::test]
async fn smp_on_containers_env_and_conditions() {
    let s = TestServer::new();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "x", "env": [{"name": "E1", "value": "1"}], "ports": [{"containerPort": 80}]}]}});
    post(&s, "/api/v1/namespaces/default/pods", pod).await;
    let (code, o) = patch(&s, "/api/v1/namespaces/default/pods/p",
        json!({"spec": {"containers": [{"name": "a", "env": [{"name": "E2", "value": "2"}], "ports": [{"containerPort": 81}]}]}}), SMP).await;
    assert_eq!(code, 200, "{o}");
    let c = &o["spec"]["containers"][0];
    assert_eq!(c["image"], "x");
    // New items go first (apimachinery's element order normalisation).
    assert_eq!(
        c["env"],
        json!([{"name": "E2", "value": "2"}, {"name": "E1", "value": "1"}])
    );
    assert_eq!(
        c["ports"],
        json!([{"containerPort": 81}, {"containerPort": 80}])
    );
    let cond = |t: &str, st: &str| json!({"type": t, "status": st});
    patch(
        &s,
        "/api/v1/namespaces/default/pods/p/status",
        json!({"status": {"conditions": [cond("Ready", "False"), cond("Init", "True")]}}),
        SMP,
    )
    .await;
    let (_, o) = patch(
        &s,
        "/api/v1/namespaces/default/pods/p/status",
        json!({"status": {"conditions": [cond("Ready", "True")]}}),
        SMP,
    )
    .await;
    assert_eq!(
        o["status"]["conditions"],
        json!([cond("Ready", "True"), cond("Init", "True")])
    );
}
