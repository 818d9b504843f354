//! Create, get, list, update, status subresource and generation, checked
//! against the real API server's documented behaviour.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn create_sets_system_fields_from_one_counter() {
    let s = kube_testserver::TestServer::new();
    let (code, a) = post(&s, PVS, pv("a")).await;
    assert_eq!(code, 201, "{a}");
    let (_, b) = post(&s, CMS, cm("b")).await;
    assert!(a["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
    assert!(
        a["metadata"]["creationTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert_eq!(rv(&b), rv(&a) + 1, "one global resourceVersion counter");
    assert_eq!(a["kind"], "PersistentVolume");
    assert_eq!(
        b["metadata"]["namespace"], "default",
        "namespace defaulted from the URL"
    );
    // Cluster-scoped objects carry no namespace even if one is sent.
    let mut p = pv("c");
    p["metadata"]["namespace"] = json!("x");
    let (_, c) = post(&s, PVS, p).await;
    assert!(c["metadata"].get("namespace").is_none(), "{c}");
    // Status of a kind with a status subresource is dropped on create.
    let mut p = pv("d");
    p["status"] = json!({"phase": "Bound"});
    let (_, d) = post(&s, PVS, p).await;
    assert_eq!(d["status"]["phase"], "Pending");
    assert_eq!(
        d["spec"]["persistentVolumeReclaimPolicy"], "Retain",
        "defaulted"
    );
}

#[tokio::test]
async fn create_errors_are_status_objects() {
    let s = kube_testserver::TestServer::new();
    post(&s, PVS, pv("a")).await;
    let (code, st) = post(&s, PVS, pv("a")).await;
    assert_eq!(code, 409);
    assert_eq!(st["kind"], "Status");
    assert_eq!(st["reason"], "AlreadyExists");
    assert_eq!(st["message"], "persistentvolumes \"a\" already exists");
    assert_eq!(
        st["details"],
        json!({"name": "a", "kind": "persistentvolumes"})
    );

    let mut c = cm("x");
    c["metadata"]["namespace"] = json!("other");
    let (code, st) = post(&s, CMS, c).await;
    assert_eq!(code, 400, "{st}");
    assert_eq!(st["reason"], "BadRequest");

    let (code, st) = post(
        &s,
        CMS,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}),
    )
    .await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(st["reason"], "Invalid");

    let (code, st) = post(
        &s,
        CMS,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}),
    )
    .await;
    assert_eq!(code, 400, "kind mismatch: {st}");

    let mut c = cm("y");
    c["metadata"]["resourceVersion"] = json!("5");
    let (code, _) = post(&s, CMS, c).await;
    assert_eq!(code, 500, "resourceVersion set on create");
}

#[tokio::test]
async fn get_not_found_and_unknown_paths() {
    let s = kube_testserver::TestServer::new();
    let (code, st) = get(&s, "/apis/storage.k8s.io/v1/storageclasses/nope").await;
    assert_eq!(code, 404);
    assert_eq!(st["reason"], "NotFound");
    assert_eq!(
        st["message"],
        "storageclasses.storage.k8s.io \"nope\" not found"
    );
    assert_eq!(
        st["details"],
        json!({"name": "nope", "group": "storage.k8s.io", "kind": "storageclasses"})
    );
    let (code, _) = get(&s, "/api/v1/widgets").await;
    assert_eq!(code, 404);
    let (code, _) = get(&s, "/openapi/v2").await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn generate_name_makes_unique_names() {
    let s = kube_testserver::TestServer::new();
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let (code, o) = post(
            &s,
            CMS,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}}),
        )
        .await;
        assert_eq!(code, 201);
        let n = o["metadata"]["name"].as_str().unwrap().to_string();
        assert!(n.starts_with("gen-") && n.len() == 9, "{n}");
        names.insert(n);
    }
    assert_eq!(names.len(), 20);
}

#[tokio::test]
async fn update_conflicts_on_stale_resource_version() {
    let s = kube_testserver::TestServer::new();
    let (_, mut a) = post(&s, CMS, cm("a")).await;
    let stale = a.clone();
    a["data"]["k"] = json!("v2");
    let (code, a2) = put(&s, &format!("{CMS}/a"), a).await;
    assert_eq!(code, 200);
    assert!(rv(&a2) > rv(&stale));
    let mut b = stale.clone();
    b["data"]["k"] = json!("v3");
    let (code, st) = put(&s, &format!("{CMS}/a"), b.clone()).await;
    assert_eq!(code, 409);
    assert_eq!(st["reason"], "Conflict");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("the object has been modified"),
        "{st}"
    );
    // No resourceVersion: unconditional update.
    b["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let (code, b2) = put(&s, &format!("{CMS}/a"), b).await;
    assert_eq!(code, 200, "{b2}");
    assert_eq!(b2["data"]["k"], "v3");
    assert_eq!(b2["metadata"]["uid"], stale["metadata"]["uid"]);
    // Name mismatch and uid change are rejected.
    let mut c = b2.clone();
    c["metadata"]["name"] = json!("other");
    assert_eq!(put(&s, &format!("{CMS}/a"), c).await.0, 400);
    let mut c = b2.clone();
    c["metadata"]["uid"] = json!("0000");
    assert_eq!(put(&s, &format!("{CMS}/a"), c).await.0, 422);
    // Update of a missing object is 404.
    assert_eq!(put(&s, &format!("{CMS}/zzz"), cm("zzz")).await.0, 404);
}

#[tokio::test]
async fn noop_update_keeps_resource_version() {
    let s = kube_testserver::TestServer::new();
    let (_, a) = post(&s, CMS, cm("a")).await;
    let (code, a2) = put(&s, &format!("{CMS}/a"), a.clone()).await;
    assert_eq!(code, 200);
    assert_eq!(rv(&a2), rv(&a));
}

#[tokio::test]
async fn status_subresource_semantics() {
    let s = kube_testserver::TestServer::new();
    let (_, p) = post(&s, PVS, pv("a")).await;
    // Status changes on the main resource are ignored.
    let mut m = p.clone();
    m["status"] = json!({"phase": "Bound"});
    m["spec"]["storageClassName"] = json!("fast");
    let (code, m2) = put(&s, &format!("{PVS}/a"), m).await;
    assert_eq!(code, 200);
    assert_eq!(m2["status"]["phase"], "Pending");
    assert_eq!(m2["spec"]["storageClassName"], "fast");
    // Only status changes are taken from /status.
    let mut st = m2.clone();
    st["status"] = json!({"phase": "Released"});
    st["spec"]["storageClassName"] = json!("slow");
    st["metadata"]["labels"] = json!({"x": "y"});
    let (code, st2) = put(&s, &format!("{PVS}/a/status"), st).await;
    assert_eq!(code, 200, "{st2}");
    assert_eq!(st2["status"]["phase"], "Released");
    assert_eq!(st2["spec"]["storageClassName"], "fast");
    assert!(st2["metadata"].get("labels").is_none());
    // Merge patch on /status.
    let (code, st3) = patch(
        &s,
        &format!("{PVS}/a/status"),
        json!({"status": {"message": "m"}}),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(st3["status"], json!({"phase": "Released", "message": "m"}));
    // ConfigMaps have no status subresource.
    post(&s, CMS, cm("c")).await;
    assert_eq!(get(&s, &format!("{CMS}/c/status")).await.0, 404);
}

#[tokio::test]
async fn generation_bumps_on_spec_changes_only() {
    let s = kube_testserver::TestServer::new();
    let client = s.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    let p = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(p.metadata.generation, Some(1));
    let mut p2 = p.clone();
    p2.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    let p2 = pods
        .replace("p", &PostParams::default(), &p2)
        .await
        .unwrap();
    assert_eq!(p2.metadata.generation, Some(1), "metadata change");
    let mut p3 = p2.clone();
    p3.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    let p3 = pods
        .replace_status("p", &PostParams::default(), &p3)
        .await
        .unwrap();
    assert_eq!(p3.metadata.generation, Some(1), "status change");
    let mut p4 = p3.clone();
    p4.spec.as_mut().unwrap().active_deadline_seconds = Some(5);
    let p4 = pods
        .replace("p", &PostParams::default(), &p4)
        .await
        .unwrap();
    assert_eq!(p4.metadata.generation, Some(2), "spec change");
    // Client-sent generation is ignored.
    let mut p5 = p4.clone();
    p5.metadata.generation = Some(42);
    let p5 = pods
        .replace("p", &PostParams::default(), &p5)
        .await
        .unwrap();
    assert_eq!(p5.metadata.generation, Some(2));
    // Kinds without generation tracking have none.
    let pvs: Api<PersistentVolume> = Api::all(client);
    let v = pvs
        .create(
            &PostParams::default(),
            &serde_json::from_value(pv("v")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(v.metadata.generation, None);
}

#[tokio::test]
async fn kube_client_crud_roundtrip() {
    let s = kube_testserver::TestServer::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let c = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(cm("a")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(cms.get("a").await.unwrap().metadata.uid, c.metadata.uid);
    let err = cms.get("missing").await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.reason, "NotFound");
        }
        other => panic!("{other:?}"),
    }
    let deleted = cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(deleted.is_right(), "ConfigMap delete answers with a Status");
    assert!(s.get::<ConfigMap>("default", "a").is_none());
    // PersistentVolume delete answers with the object.
    let pvs: Api<PersistentVolume> = Api::all(s.client());
    pvs.create(
        &PostParams::default(),
        &serde_json::from_value(pv("v")).unwrap(),
    )
    .await
    .unwrap();
    assert!(
        pvs.delete("v", &DeleteParams::default())
            .await
            .unwrap()
            .is_left()
    );
}

#[tokio::test]
async fn discovery_documents() {
    let s = kube_testserver::TestServer::new();
    let (code, v) = get(&s, "/api/v1").await;
    assert_eq!(code, 200);
    let pvs = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "persistentvolumes")
        .unwrap();
    assert_eq!(pvs["namespaced"], false);
    assert_eq!(pvs["kind"], "PersistentVolume");
    assert_eq!(pvs["singularName"], "persistentvolume");
    assert_eq!(pvs["shortNames"], json!(["pv"]));
    assert!(
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "persistentvolumes/status")
    );
    let (_, groups) = get(&s, "/apis").await;
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    for g in [
        "storage.k8s.io",
        "apps",
        "coordination.k8s.io",
        "events.k8s.io",
        "snapshot.storage.k8s.io",
    ] {
        assert!(names.contains(&g), "{g} in {names:?}");
    }
    let (code, snap) = get(&s, "/apis/snapshot.storage.k8s.io/v1").await;
    assert_eq!(code, 200);
    assert_eq!(
        snap["resources"].as_array().unwrap().len(),
        5,
        "3 kinds + 2 status subresources: {snap}"
    );
    let (code, ver) = get(&s, "/version").await;
    assert_eq!(code, 200);
    assert_eq!(ver["major"], "1");
    // kube-rs discovery works on these documents.
    let d = kube::Discovery::new(s.client()).run().await.unwrap();
    assert!(d.has_group("storage.k8s.io"));
}
