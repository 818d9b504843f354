//! Watch protocol: events, resume, 410 Gone, bookmarks, selector transitions,
//! timeouts, and kube-runtime's watcher + reflector.

mod common;

use std::time::Duration;

use common::*;
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_testserver::TestServer;
use serde_json::json;

#[tokio::test]
async fn watch_from_version_replays_then_follows() {
    let s = TestServer::new();
    let (_, a) = post(&s, CMS, cm("a")).await;
    let start = rv(&a);
    let (_, mut b) = post(&s, CMS, cm("b")).await;
    b["data"]["k"] = json!("2");
    put(&s, &format!("{CMS}/b"), b).await;
    let mut w = WatchReader::open(&s, &format!("{CMS}?watch=true&resourceVersion={start}")).await;
    assert_eq!(w.status, 200);
    let e1 = w.next().await;
    assert_eq!(
        (
            e1["type"].as_str(),
            e1["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("b"))
    );
    let e2 = w.next().await;
    assert_eq!(
        (e2["type"].as_str(), e2["object"]["data"]["k"].as_str()),
        (Some("MODIFIED"), Some("2"))
    );
    delete(&s, &format!("{CMS}/a"), None).await;
    let e3 = w.next().await;
    assert_eq!(e3["type"], "DELETED");
    assert_eq!(e3["object"]["metadata"]["name"], "a");
    assert!(
        rv(&e3["object"]) > rv(&e2["object"]),
        "DELETED carries the deletion's resourceVersion"
    );
    w.assert_quiet(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn watch_without_version_starts_with_current_state() {
    let s = TestServer::new();
    post(&s, CMS, cm("a")).await;
    post(&s, CMS, cm("b")).await;
    for rv in ["", "&resourceVersion=0"] {
        let mut w = WatchReader::open(&s, &format!("{CMS}?watch=true{rv}")).await;
        let names: Vec<String> = vec![w.next().await, w.next().await]
            .into_iter()
            .map(|e| {
                assert_eq!(e["type"], "ADDED");
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["a", "b"]);
        w.assert_quiet(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn resume_after_reconnect_loses_no_event() {
    let s = TestServer::new();
    let (_, first) = post(&s, CMS, cm("c0")).await;
    let mut last = rv(&first);
    let mut seen = Vec::new();
    for round in 0..5 {
        let mut w =
            WatchReader::open(&s, &format!("{CMS}?watch=true&resourceVersion={last}")).await;
        // Writes while connected and while disconnected.
        for i in 0..3 {
            post(&s, CMS, cm(&format!("r{round}-{i}"))).await;
        }
        for _ in 0..2 {
            let e = w.next().await;
            last = rv(&e["object"]);
            seen.push(
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        drop(w); // reconnect: one event of this round is still pending
        s.close_watches();
    }
    let mut w = WatchReader::open(&s, &format!("{CMS}?watch=true&resourceVersion={last}")).await;
    while let Some(e) = w.next_within(Duration::from_millis(100)).await {
        seen.push(
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let want: Vec<String> = (0..5)
        .flat_map(|r| (0..3).map(move |i| format!("r{r}-{i}")))
        .collect();
    assert_eq!(seen, want);
}

#[tokio::test]
async fn gone_after_compaction_and_outside_history_window() {
    let s = TestServer::builder().history_limit(3).build();
    let (_, a) = post(&s, CMS, cm("a")).await;
    let old = rv(&a);
    for i in 0..5 {
        post(&s, CMS, cm(&format!("x{i}"))).await;
    }
    let mut w = WatchReader::open(&s, &format!("{CMS}?watch=true&resourceVersion={old}")).await;
    assert_eq!(
        w.status, 200,
        "watch answers 200 and sends the error as an event"
    );
    let e = w.next().await;
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    assert!(w.ended_within(Duration::from_secs(1)).await);

    let s = TestServer::new();
    let (_, a) = post(&s, CMS, cm("a")).await;
    let mut ok =
        WatchReader::open(&s, &format!("{CMS}?watch=true&resourceVersion={}", rv(&a))).await;
    s.compact();
    ok.assert_quiet(Duration::from_millis(50)).await; // open watches are not affected
    let mut w = WatchReader::open(
        &s,
        &format!("{CMS}?watch=true&resourceVersion={}", rv(&a) - 1),
    )
    .await;
    assert_eq!(w.next().await["object"]["code"], 410);
    // Resuming from the current version still works.
    let mut w = WatchReader::open(
        &s,
        &format!("{CMS}?watch=true&resourceVersion={}", s.resource_version()),
    )
    .await;
    post(&s, CMS, cm("b")).await;
    assert_eq!(w.next().await["type"], "ADDED");
}

#[tokio::test]
async fn bookmarks_when_allowed() {
    let s = TestServer::builder()
        .bookmark_interval(Duration::from_millis(50))
        .build();
    let (_, a) = post(&s, CMS, cm("a")).await;
    let mut w = WatchReader::open(
        &s,
        &format!(
            "{CMS}?watch=true&allowWatchBookmarks=true&resourceVersion={}",
            rv(&a)
        ),
    )
    .await;
    let b = w.next().await;
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(b["object"]["kind"], "ConfigMap");
    assert_eq!(b["object"]["apiVersion"], "v1");
    assert_eq!(rv(&b["object"]), s.resource_version());
    let mut plain =
        WatchReader::open(&s, &format!("{CMS}?watch=true&resourceVersion={}", rv(&a))).await;
    assert!(
        plain
            .next_within(Duration::from_millis(200))
            .await
            .is_none(),
        "no bookmarks unless asked"
    );
}

/// As kube-apiserver: a watch with bookmarks gets one two seconds before
/// its timeout, whatever the interval, at the server's revision (here past
/// the watch's start: a write of another kind came since); one of two
/// seconds or less gets none that way.
#[tokio::test]
async fn a_bookmark_comes_two_seconds_before_the_timeout() {
    let s = TestServer::new();
    s.set_bookmark_interval(Duration::from_secs(60));
    let (_, a) = post(&s, CMS, cm("a")).await;
    post(
        &s,
        "/api/v1/namespaces/default/secrets",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other-kind"}}),
    )
    .await;
    let opened = std::time::Instant::now();
    let mut w = WatchReader::open(
        &s,
        &format!(
            "{CMS}?watch=true&allowWatchBookmarks=true&timeoutSeconds=3&resourceVersion={}",
            rv(&a)
        ),
    )
    .await;
    let b = w.next().await;
    let after = opened.elapsed();
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(rv(&b["object"]), s.resource_version());
    assert!(rv(&b["object"]) > rv(&a));
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_millis(2500),
        "{after:?}"
    );
    let mut short = WatchReader::open(
        &s,
        &format!(
            "{CMS}?watch=true&allowWatchBookmarks=true&timeoutSeconds=2&resourceVersion={}",
            rv(&a)
        ),
    )
    .await;
    assert!(
        short
            .next_within(Duration::from_millis(2500))
            .await
            .is_none(),
        "a watch of 2 s gets no bookmark before its end"
    );
}

#[tokio::test]
async fn send_initial_events_ends_with_marked_bookmark() {
    let s = TestServer::new();
    post(&s, CMS, cm("a")).await;
    let mut w = WatchReader::open(
        &s,
        &format!("{CMS}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"),
    )
    .await;
    assert_eq!(w.next().await["type"], "ADDED");
    let b = w.next().await;
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(
        b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

#[tokio::test]
async fn selector_transitions_become_added_and_deleted() {
    let s = TestServer::new();
    let (_, c) = post(&s, CMS, cm("a")).await;
    let mut w = WatchReader::open(
        &s,
        &format!(
            "{CMS}?watch=true&labelSelector=app%3Dweb&resourceVersion={}",
            rv(&c)
        ),
    )
    .await;
    let p = |labels| json!({"metadata": {"labels": labels}});
    patch(
        &s,
        &format!("{CMS}/a"),
        p(json!({"app": "web"})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(w.next().await["type"], "ADDED", "entering the selector");
    patch(
        &s,
        &format!("{CMS}/a"),
        json!({"data": {"k": "z"}}),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(w.next().await["type"], "MODIFIED");
    patch(
        &s,
        &format!("{CMS}/a"),
        p(json!({"app": "db"})),
        "application/merge-patch+json",
    )
    .await;
    let e = w.next().await;
    assert_eq!(e["type"], "DELETED", "leaving the selector");
    assert_eq!(
        e["object"]["metadata"]["labels"]["app"], "web",
        "previous state"
    );
    patch(
        &s,
        &format!("{CMS}/a"),
        json!({"data": {"k": "q"}}),
        "application/merge-patch+json",
    )
    .await;
    w.assert_quiet(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn watch_scoped_to_namespace_and_field_selector() {
    let s = TestServer::new();
    let mut w = WatchReader::open(
        &s,
        "/api/v1/namespaces/default/configmaps?watch=true&fieldSelector=metadata.name%3Db",
    )
    .await;
    let mut other = cm("b");
    other["metadata"]["namespace"] = json!("kube-system");
    post(&s, "/api/v1/namespaces/kube-system/configmaps", other).await;
    post(&s, CMS, cm("a")).await;
    post(&s, CMS, cm("b")).await;
    let e = w.next().await;
    assert_eq!(e["object"]["metadata"]["name"], "b");
    assert_eq!(e["object"]["metadata"]["namespace"], "default");
    w.assert_quiet(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn timeout_and_closed_watches_end_the_stream() {
    let s = TestServer::new();
    let mut w = WatchReader::open(&s, &format!("{CMS}?watch=true&timeoutSeconds=1")).await;
    assert!(!w.ended_within(Duration::from_millis(500)).await);
    assert!(w.ended_within(Duration::from_secs(2)).await);
    let mut w = WatchReader::open(&s, &format!("{CMS}?watch=true")).await;
    s.close_watches();
    assert!(w.ended_within(Duration::from_secs(1)).await);
}

#[tokio::test]
async fn watch_wire_format_is_newline_delimited_json() {
    let s = TestServer::new();
    let resp = send(
        &s,
        http::Method::GET,
        &format!("{CMS}?watch=true"),
        None,
        "",
    )
    .await;
    assert_eq!(resp.headers()["content-type"], "application/json");
    post(&s, CMS, cm("a")).await;
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let text = std::str::from_utf8(&frame).unwrap();
    assert!(text.ends_with('\n'));
    let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(
        v.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["object", "type"]
    );
}

#[tokio::test]
async fn kube_runtime_reflector_converges_list_watch() {
    reflector_converges(watcher::Config::default().page_size(2)).await;
}

#[tokio::test]
async fn kube_runtime_reflector_converges_any_semantic() {
    reflector_converges(watcher::Config::default().any_semantic()).await;
}

#[tokio::test]
async fn kube_runtime_reflector_converges_streaming_lists() {
    reflector_converges(watcher::Config::default().streaming_lists()).await;
}

async fn reflector_converges(config: watcher::Config) {
    let s = TestServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .build();
    let client = s.client();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &serde_json::from_value(cm(&format!("pre{i}"))).unwrap(),
        )
        .await
        .unwrap();
    }
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(writer, watcher(api.clone(), config))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.try_next().await.is_ok() {}
    });
    reader.wait_until_ready().await.unwrap();
    // Changes, with watches dropped and history compacted in between.
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &serde_json::from_value(cm(&format!("new{i}"))).unwrap(),
        )
        .await
        .unwrap();
    }
    s.close_watches();
    api.delete("pre0", &DeleteParams::default()).await.unwrap();
    api.patch(
        "pre1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "changed"}})),
    )
    .await
    .unwrap();
    s.compact();
    s.close_watches();
    api.delete("new4", &DeleteParams::default()).await.unwrap();
    let want: std::collections::BTreeSet<String> = [
        "pre1", "pre2", "pre3", "pre4", "new0", "new1", "new2", "new3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let have: std::collections::BTreeSet<String> = reader
            .state()
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        let pre1 = reader
            .state()
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some("pre1"));
        let changed = pre1.is_some_and(|c| {
            c.data.as_ref().and_then(|d| d.get("k")).map(String::as_str) == Some("changed")
        });
        if have == want && changed {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "store did not converge: {have:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    task.abort();
}

#[tokio::test]
async fn kube_watch_api_sees_events() {
    let s = TestServer::new();
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    let stream = api
        .watch(&kube::api::WatchParams::default().timeout(5), "0")
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(cm("a")).unwrap(),
    )
    .await
    .unwrap();
    let ev = stream.next().await.unwrap().unwrap();
    assert!(
        matches!(ev, kube::api::WatchEvent::Added(c) if c.metadata.name.as_deref() == Some("a"))
    );
}
