//! Deletion: finalizers and deletionTimestamp, preconditions, propagation
//! policies and the garbage collector.

mod common;

use std::time::Duration;

use common::*;
use kube_testserver::TestServer;
use serde_json::{Value, json};

fn owned(name: &str, owner: &Value, block: bool) -> Value {
    let mut c = cm(name);
    c["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "v1", "kind": "ConfigMap",
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "blockOwnerDeletion": block,
    }]);
    c
}

async fn exists(s: &TestServer, name: &str) -> Option<Value> {
    let (code, v) = get(s, &format!("{CMS}/{name}")).await;
    (code == 200).then_some(v)
}

#[tokio::test]
async fn finalizer_lifecycle_with_watch_events() {
    let s = TestServer::new();
    let mut c = cm("f");
    c["metadata"]["finalizers"] = json!(["example.com/a", "example.com/b"]);
    let (_, created) = post(&s, CMS, c).await;
    let mut w = WatchReader::open(
        &s,
        &format!("{CMS}?watch=true&resourceVersion={}", rv(&created)),
    )
    .await;

    let (code, del) = delete(&s, &format!("{CMS}/f"), None).await;
    assert_eq!(code, 200);
    assert_eq!(
        del["kind"], "ConfigMap",
        "still present: the object is returned"
    );
    assert!(del["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(del["metadata"]["deletionGracePeriodSeconds"], 0);
    let e = w.next().await;
    assert_eq!(e["type"], "MODIFIED");
    assert!(e["object"]["metadata"]["deletionTimestamp"].is_string());

    // Deleting again changes nothing.
    let (code, again) = delete(&s, &format!("{CMS}/f"), None).await;
    assert_eq!(code, 200);
    assert_eq!(rv(&again), rv(&del));
    // No new finalizers while deleting.
    let (code, st) = patch(
        &s,
        &format!("{CMS}/f"),
        json!({"metadata": {"finalizers": ["example.com/a", "example.com/b", "x"]}}),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 422, "{st}");
    // deletionTimestamp cannot be removed by an update.
    let mut upd = del.clone();
    upd["metadata"]["deletionTimestamp"] = Value::Null;
    upd["metadata"]["finalizers"] = json!(["example.com/a"]);
    let (code, o) = put(&s, &format!("{CMS}/f"), upd).await;
    assert_eq!(code, 200, "{o}");
    assert!(o["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(w.next().await["type"], "MODIFIED");

    // Removing the last finalizer removes the object.
    let (code, _) = patch(
        &s,
        &format!("{CMS}/f"),
        json!([{"op": "remove", "path": "/metadata/finalizers"}]),
        "application/json-patch+json",
    )
    .await;
    assert_eq!(code, 200);
    let e = w.next().await;
    assert_eq!(e["type"], "DELETED");
    assert!(exists(&s, "f").await.is_none());
    w.assert_quiet(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn delete_preconditions() {
    let s = TestServer::new();
    let (_, c) = post(&s, CMS, cm("p")).await;
    let path = format!("{CMS}/p");
    let (code, st) = delete(&s, &path, Some(json!({"preconditions": {"uid": "wrong"}}))).await;
    assert_eq!(code, 409, "{st}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("Precondition failed: UID in precondition: wrong")
    );
    let (code, _) = delete(
        &s,
        &path,
        Some(json!({"preconditions": {"resourceVersion": "1"}})),
    )
    .await;
    assert_eq!(code, 409);
    let (code, _) = delete(&s, &path, Some(json!({"preconditions": {"uid": c["metadata"]["uid"], "resourceVersion": c["metadata"]["resourceVersion"]}}))).await;
    assert_eq!(code, 200);
    let (code, st) = delete(&s, &path, None).await;
    assert_eq!((code, st["reason"].as_str()), (404, Some("NotFound")));
}

#[tokio::test]
async fn gc_background_deletes_dependents_of_gone_owners() {
    let s = TestServer::new();
    let (_, owner) = post(&s, CMS, cm("owner")).await;
    let (_, owner2) = post(&s, CMS, cm("owner2")).await;
    post(&s, CMS, owned("dep", &owner, false)).await;
    post(
        &s,
        CMS,
        owned("dep-of-dep", &exists(&s, "dep").await.unwrap(), false),
    )
    .await;
    // A dependent with two owners survives losing one, without that reference.
    let mut two = owned("two", &owner, false);
    two["metadata"]["ownerReferences"]
        .as_array_mut()
        .unwrap()
        .push(owned("x", &owner2, false)["metadata"]["ownerReferences"][0].clone());
    post(&s, CMS, two).await;
    // A dependent with a finalizer is marked deleting and stays.
    let mut fin = owned("fin", &owner, false);
    fin["metadata"]["finalizers"] = json!(["keep"]);
    post(&s, CMS, fin).await;

    let (code, _) = delete(
        &s,
        &format!("{CMS}/owner"),
        Some(json!({"propagationPolicy": "Background"})),
    )
    .await;
    assert_eq!(code, 200);
    assert!(exists(&s, "owner").await.is_none());
    assert!(exists(&s, "dep").await.is_none());
    assert!(exists(&s, "dep-of-dep").await.is_none(), "cascades");
    let two = exists(&s, "two").await.unwrap();
    assert_eq!(
        two["metadata"]["ownerReferences"].as_array().unwrap().len(),
        1
    );
    assert_eq!(
        two["metadata"]["ownerReferences"][0]["uid"],
        owner2["metadata"]["uid"]
    );
    let fin = exists(&s, "fin").await.unwrap();
    assert!(fin["metadata"]["deletionTimestamp"].is_string());

    // A dependent created for an owner that does not exist is collected.
    let ghost =
        json!({"metadata": {"name": "ghost", "uid": "00000000-0000-0000-0000-000000000000"}});
    post(&s, CMS, owned("orphaned", &ghost, false)).await;
    assert!(exists(&s, "orphaned").await.is_none());
    // Owner references to kinds the server does not know are left alone.
    let mut unknown = cm("unknown-owner");
    unknown["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "example.com/v1", "kind": "Thing", "name": "t", "uid": "u"}]);
    post(&s, CMS, unknown).await;
    assert!(exists(&s, "unknown-owner").await.is_some());
}

#[tokio::test]
async fn gc_off_keeps_dependents_until_turned_on() {
    let s = TestServer::builder().gc(false).build();
    let (_, owner) = post(&s, CMS, cm("owner")).await;
    post(&s, CMS, owned("dep", &owner, false)).await;
    delete(&s, &format!("{CMS}/owner"), None).await;
    assert!(exists(&s, "dep").await.is_some());
    s.set_gc(true);
    assert!(exists(&s, "dep").await.is_none());
}

#[tokio::test]
async fn gc_foreground_waits_for_blocking_dependents() {
    let s = TestServer::new();
    let (_, owner) = post(&s, CMS, cm("owner")).await;
    let mut blocking = owned("blocking", &owner, true);
    blocking["metadata"]["finalizers"] = json!(["hold"]);
    post(&s, CMS, blocking).await;
    post(&s, CMS, owned("plain", &owner, true)).await;
    let mut w = WatchReader::open(
        &s,
        &format!(
            "{CMS}?watch=true&fieldSelector=metadata.name%3Downer&resourceVersion={}",
            s.resource_version()
        ),
    )
    .await;

    let (code, o) = delete(
        &s,
        &format!("{CMS}/owner"),
        Some(json!({"propagationPolicy": "Foreground"})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(o["metadata"]["finalizers"], json!(["foregroundDeletion"]));
    assert!(o["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(w.next().await["type"], "MODIFIED");
    // The owner stays while a blocking dependent exists.
    assert!(exists(&s, "plain").await.is_none());
    let blocking = exists(&s, "blocking").await.unwrap();
    assert!(blocking["metadata"]["deletionTimestamp"].is_string());
    assert!(exists(&s, "owner").await.is_some());
    // Releasing the dependent lets the owner go.
    patch(
        &s,
        &format!("{CMS}/blocking"),
        json!({"metadata": {"finalizers": null}}),
        "application/merge-patch+json",
    )
    .await;
    assert!(exists(&s, "blocking").await.is_none());
    assert!(exists(&s, "owner").await.is_none());
    let mut types = Vec::new();
    while let Some(e) = w.next_within(Duration::from_millis(100)).await {
        types.push(e["type"].as_str().unwrap().to_string());
    }
    assert_eq!(types.last().map(String::as_str), Some("DELETED"));
}

#[tokio::test]
async fn gc_foreground_without_blocking_dependents_completes() {
    let s = TestServer::new();
    let (_, owner) = post(&s, CMS, cm("owner")).await;
    let mut nb = owned("nonblocking", &owner, false);
    nb["metadata"]["finalizers"] = json!(["hold"]);
    post(&s, CMS, nb).await;
    delete(
        &s,
        &format!("{CMS}/owner"),
        Some(json!({"propagationPolicy": "Foreground"})),
    )
    .await;
    assert!(
        exists(&s, "owner").await.is_none(),
        "only blockOwnerDeletion dependents block"
    );
    assert!(exists(&s, "nonblocking").await.unwrap()["metadata"]["deletionTimestamp"].is_string());
}

#[tokio::test]
async fn gc_orphan_strips_owner_references() {
    let s = TestServer::new();
    let (_, owner) = post(&s, CMS, cm("owner")).await;
    post(&s, CMS, owned("dep", &owner, true)).await;
    let (code, o) = delete(
        &s,
        &format!("{CMS}/owner"),
        Some(json!({"propagationPolicy": "Orphan"})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        o["metadata"]["finalizers"],
        json!(["orphan"]),
        "returned before the GC ran"
    );
    assert!(
        exists(&s, "owner").await.is_none(),
        "orphan finalizer processed"
    );
    let dep = exists(&s, "dep").await.unwrap();
    assert!(dep["metadata"].get("ownerReferences").is_none(), "{dep}");
    // Deprecated orphanDependents=true means the same.
    let (_, owner) = post(&s, CMS, cm("owner-b")).await;
    post(&s, CMS, owned("dep-b", &owner, false)).await;
    delete(&s, &format!("{CMS}/owner-b?orphanDependents=true"), None).await;
    assert!(exists(&s, "dep-b").await.is_some());
}

#[tokio::test]
async fn generation_bumps_when_marked_deleting() {
    let s = TestServer::new();
    let vs = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "s", "finalizers": ["x"]}, "spec": {"source": {"persistentVolumeClaimName": "c"}}});
    let path = "/apis/snapshot.storage.k8s.io/v1/namespaces/default/volumesnapshots";
    let (_, o) = post(&s, path, vs).await;
    assert_eq!(o["metadata"]["generation"], 1);
    let (_, d) = delete(&s, &format!("{path}/s"), None).await;
    assert_eq!(d["metadata"]["generation"], 2);
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_objects() {
    let s = TestServer::new();
    post(
        &s,
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tmp"}}),
    )
    .await;
    let mut c = cm("a");
    c["metadata"]["namespace"] = json!("tmp");
    post(&s, "/api/v1/namespaces/tmp/configmaps", c).await;
    let (code, _) = delete(&s, "/api/v1/namespaces/tmp", None).await;
    assert_eq!(code, 200);
    assert_eq!(get(&s, "/api/v1/namespaces/tmp/configmaps/a").await.0, 404);
    assert_eq!(get(&s, "/api/v1/namespaces/tmp").await.0, 404);
}

#[tokio::test]
async fn delete_collection_with_selector() {
    let s = TestServer::new();
    for (name, app) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let mut c = cm(name);
        c["metadata"]["labels"] = json!({"app": app});
        post(&s, CMS, c).await;
    }
    let (code, l) = delete(&s, &format!("{CMS}?labelSelector=app%3Dx"), None).await;
    assert_eq!(code, 200, "{l}");
    assert_eq!(l["kind"], "ConfigMapList");
    assert_eq!(l["items"].as_array().unwrap().len(), 2);
    assert!(exists(&s, "a").await.is_none());
    assert!(exists(&s, "c").await.is_some());
}
