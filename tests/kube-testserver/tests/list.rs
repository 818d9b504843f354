//! List: label and field selectors, pagination with limit/continue.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kube_testserver::TestServer;
use serde_json::{Value, json};

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

async fn labelled(s: &TestServer) {
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "front"})),
        ("b", json!({"app": "db", "tier": "back"})),
        ("c", json!({"app": "web"})),
        ("d", json!({})),
    ] {
        let mut c = cm(name);
        c["metadata"]["labels"] = labels;
        post(s, CMS, c).await;
    }
}

#[tokio::test]
async fn label_selectors() {
    let s = TestServer::new();
    labelled(&s).await;
    let cases = [
        ("app%3Dweb", vec!["a", "c"]),
        ("app%3D%3Dweb", vec!["a", "c"]),
        ("app!%3Dweb", vec!["b", "d"]),
        ("app+in+(web,db)", vec!["a", "b", "c"]),
        ("app%20notin%20(web)", vec!["b", "d"]),
        ("tier", vec!["a", "b"]),
        ("!tier", vec!["c", "d"]),
        ("app%3Dweb,tier", vec!["a"]),
    ];
    for (sel, want) in cases {
        let (code, l) = get(&s, &format!("{CMS}?labelSelector={sel}")).await;
        assert_eq!(code, 200, "{sel}: {l}");
        assert_eq!(names(&l), want, "{sel}");
    }
    let (code, st) = get(&s, &format!("{CMS}?labelSelector=app+in+web")).await;
    assert_eq!(code, 400, "{st}");
}

#[tokio::test]
async fn field_selectors() {
    let s = TestServer::new();
    labelled(&s).await;
    let (_, l) = get(&s, &format!("{CMS}?fieldSelector=metadata.name%3Db")).await;
    assert_eq!(names(&l), ["b"]);
    let (_, l) = get(&s, &format!("{CMS}?fieldSelector=metadata.name!%3Db")).await;
    assert_eq!(names(&l), ["a", "c", "d"]);
    let (_, l) = get(
        &s,
        "/api/v1/configmaps?fieldSelector=metadata.namespace%3Ddefault",
    )
    .await;
    assert_eq!(names(&l).len(), 4);
    let (code, st) = get(&s, &format!("{CMS}?fieldSelector=data.k%3Dv")).await;
    assert_eq!(code, 400);
    assert_eq!(st["message"], "field label not supported: data.k");

    let pods: Api<Pod> = Api::default_namespaced(s.client());
    for (name, node, phase) in [
        ("p1", "n1", "Running"),
        ("p2", "n2", "Running"),
        ("p3", "n1", "Pending"),
    ] {
        let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}});
        post(&s, "/api/v1/namespaces/default/pods", p).await;
        put(&s, &format!("/api/v1/namespaces/default/pods/{name}/status"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "status": {"phase": phase}})).await;
    }
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    let got: Vec<_> = on_n1
        .items
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(got, ["p1", "p3"]);
    let running = pods
        .list(&ListParams::default().fields("status.phase=Running,spec.nodeName!=n2"))
        .await
        .unwrap();
    assert_eq!(running.items.len(), 1);
    // An unset field compares as the empty string.
    let none = pods
        .list(&ListParams::default().fields("spec.nodeName="))
        .await
        .unwrap();
    assert!(none.items.is_empty());
}

#[tokio::test]
async fn pagination_is_consistent() {
    let s = TestServer::new();
    for i in 0..10 {
        post(&s, CMS, cm(&format!("c{i:02}"))).await;
    }
    let (_, first) = get(&s, &format!("{CMS}?limit=4")).await;
    assert_eq!(names(&first), ["c00", "c01", "c02", "c03"]);
    assert_eq!(first["metadata"]["remainingItemCount"], 6);
    let list_rv = first["metadata"]["resourceVersion"].clone();
    // Writes between pages do not show in later pages.
    post(&s, CMS, cm("c05a")).await;
    delete(&s, &format!("{CMS}/c06"), None).await;
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let mut all = names(&first);
    loop {
        let (code, page) = get(&s, &format!("{CMS}?limit=4&continue={token}")).await;
        assert_eq!(code, 200, "{page}");
        assert_eq!(page["metadata"]["resourceVersion"], list_rv);
        all.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(t) => token = t.to_string(),
            None => break,
        }
    }
    let want: Vec<String> = (0..10).map(|i| format!("c{i:02}")).collect();
    assert_eq!(all, want);
    // Expired after compaction.
    let (_, first) = get(&s, &format!("{CMS}?limit=2")).await;
    s.compact();
    let token = first["metadata"]["continue"].as_str().unwrap();
    let (code, st) = get(&s, &format!("{CMS}?limit=2&continue={token}")).await;
    assert_eq!((code, st["reason"].as_str()), (410, Some("Expired")));
    let (code, _) = get(&s, &format!("{CMS}?limit=2&continue=garbage")).await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn list_metadata_and_items() {
    let s = TestServer::new();
    post(&s, CMS, cm("a")).await;
    let (_, l) = get(&s, CMS).await;
    assert_eq!(l["kind"], "ConfigMapList");
    assert_eq!(l["apiVersion"], "v1");
    assert_eq!(
        l["metadata"]["resourceVersion"],
        s.resource_version().to_string()
    );
    assert!(l["metadata"].get("continue").is_none());
    // kube-rs paginated listing.
    for i in 0..7 {
        post(&s, CMS, cm(&format!("p{i}"))).await;
    }
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::default_namespaced(s.client());
    let mut lp = ListParams::default().limit(3);
    let mut count = 0;
    loop {
        let page = api.list(&lp).await.unwrap();
        count += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(count, 8);
}
