//! Fault injection and request observability.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume};
use kube::Api;
use kube::api::PostParams;
use kube_testserver::{RequestMatch, TestServer, Verb};

#[tokio::test]
async fn fail_next_n_matching_requests() {
    let s = TestServer::new();
    post(&s, PVS, pv("a")).await;
    post(&s, PVS, pv("b")).await;
    s.fail_next(
        2,
        RequestMatch::new(Verb::Get, "persistentvolumes").name("a"),
        503,
    );
    let (code, st) = get(&s, &format!("{PVS}/a")).await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    assert_eq!(
        get(&s, &format!("{PVS}/b")).await.0,
        200,
        "other names unaffected"
    );
    assert_eq!(get(&s, &format!("{PVS}/a")).await.0, 503);
    assert_eq!(get(&s, &format!("{PVS}/a")).await.0, 200, "only two");
    s.fail_next(1, RequestMatch::new(Verb::Create, "configmaps"), 500);
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    match api
        .create(
            &PostParams::default(),
            &serde_json::from_value(cm("x")).unwrap(),
        )
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!((e.code, e.reason.as_str()), (500, "InternalError")),
        other => panic!("{other:?}"),
    }
    assert!(
        s.get::<ConfigMap>("default", "x").is_none(),
        "a failed request has no effect"
    );
    s.fail_next(
        1,
        RequestMatch::new(Verb::Update, "persistentvolumes/status"),
        409,
    );
    let (_, v) = get(&s, &format!("{PVS}/a")).await;
    assert_eq!(put(&s, &format!("{PVS}/a/status"), v.clone()).await.0, 409);
    assert_eq!(put(&s, &format!("{PVS}/a/status"), v).await.0, 200);
}

#[tokio::test]
async fn latency_and_clear() {
    let s = TestServer::new();
    s.add_latency(
        RequestMatch::any().verb(Verb::List),
        Duration::from_millis(200),
    );
    let t = Instant::now();
    get(&s, PVS).await;
    assert!(t.elapsed() >= Duration::from_millis(200));
    let t = Instant::now();
    get(&s, &format!("{PVS}/x")).await;
    assert!(
        t.elapsed() < Duration::from_millis(150),
        "GET is not delayed"
    );
    s.clear_faults();
    let t = Instant::now();
    get(&s, PVS).await;
    assert!(t.elapsed() < Duration::from_millis(150));
}

#[tokio::test]
async fn partition_drops_requests_and_watches() {
    let s = TestServer::new();
    let client = s.client();
    let api: Api<PersistentVolume> = Api::all(client);
    let mut w = WatchReader::open(&s, &format!("{PVS}?watch=true")).await;
    s.set_partitioned(true);
    assert!(
        w.ended_within(Duration::from_secs(1)).await,
        "open watches end"
    );
    let err = api.list(&Default::default()).await.unwrap_err();
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "a connection error, not an API answer: {err:?}"
    );
    s.set_partitioned(false);
    assert!(api.list(&Default::default()).await.is_ok());
    let dropped = s.requests().iter().filter(|r| r.status == 0).count();
    assert_eq!(dropped, 1);
}

#[tokio::test]
async fn request_log_and_counters() {
    let s = TestServer::new();
    let api: Api<PersistentVolume> = Api::all(s.client());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(pv("a")).unwrap(),
    )
    .await
    .unwrap();
    api.get("a").await.unwrap();
    api.get("missing").await.unwrap_err();
    api.list(&Default::default()).await.unwrap();
    api.replace_status("a", &PostParams::default(), &api.get("a").await.unwrap())
        .await
        .unwrap();
    assert_eq!(s.request_count(Verb::Create, "persistentvolumes"), 1);
    assert_eq!(s.request_count(Verb::Get, "persistentvolumes"), 3);
    assert_eq!(s.request_count(Verb::List, "persistentvolumes"), 1);
    assert_eq!(s.request_count(Verb::Update, "persistentvolumes/status"), 1);
    assert_eq!(s.write_count(), 2);
    let log = s.requests();
    let miss = log.iter().find(|r| r.name == "missing").unwrap();
    assert_eq!(
        (miss.verb, miss.status, miss.resource.as_str()),
        (Verb::Get, 404, "persistentvolumes")
    );
    s.reset_counters();
    assert!(s.requests().is_empty());
    assert_eq!(s.write_count(), 0);
    api.get("a").await.unwrap();
    assert_eq!(s.counters().len(), 1);
}
