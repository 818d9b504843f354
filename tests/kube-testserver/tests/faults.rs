//! Fault injection and request observability.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
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

// ----- watch lags -----

const VAS: &str = "volumeattachments";

fn va(name: &str, pv: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": name},
        "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": pv}}
    })
}

/// What a kube-runtime watcher saw: `(label, name or "ready", when)`.
type Seen = tokio::sync::mpsc::UnboundedReceiver<(&'static str, String, Instant)>;

/// Runs a kube-runtime watcher (a LIST, then a WATCH from its
/// resourceVersion; `streaming`: a WATCH with initial events) and forwards
/// the names of the objects it applies, and `"ready"` at each `InitDone`.
/// With a backoff, as users run it: an error (the server gone at the
/// test's end) is retried later, not in a loop that never yields.
fn forward<K>(
    api: Api<K>,
    label: &'static str,
    streaming: bool,
    tx: tokio::sync::mpsc::UnboundedSender<(&'static str, String, Instant)>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use kube::runtime::{WatchStreamExt, watcher};
    let config = if streaming {
        watcher::Config::default().streaming_lists()
    } else {
        watcher::Config::default()
    };
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
        while let Some(event) = stream.next().await {
            let name = match event {
                Ok(watcher::Event::InitDone) => "ready".to_string(),
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    o.meta().name.clone().unwrap_or_default()
                }
                _ => continue,
            };
            if tx.send((label, name, Instant::now())).is_err() {
                return;
            }
        }
    })
}

/// Waits until the server has answered a WATCH of each `(resource,
/// remote)`: a kube-runtime watcher sends it only after its `InitDone`.
async fn wait_watching(s: &TestServer, watches: &[(&str, bool)]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = s.requests();
        let watching = |&(resource, remote): &(&str, bool)| {
            log.iter().any(|r| {
                r.verb == Verb::Watch
                    && r.resource == resource
                    && remote == (r.origin != kube_testserver::Origin::InProcess)
            })
        };
        if watches.iter().all(watching) {
            return;
        }
        assert!(Instant::now() < deadline, "no WATCH of each {watches:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Ends the watchers before their server goes.
async fn stop(tasks: impl IntoIterator<Item = tokio::task::JoinHandle<()>>) {
    for task in tasks {
        task.abort();
        let _ = task.await;
    }
}

async fn next_seen(seen: &mut Seen) -> (&'static str, String, Instant) {
    tokio::time::timeout(Duration::from_secs(5), seen.recv())
        .await
        .expect("a watcher saw something within 5 s")
        .expect("the watchers run")
}

/// The race a lag reproduces: a VolumeAttachment created before a PV
/// reaches a remote watcher after the PV, while a LIST and a GET answer it
/// at once, and the in-process client's own watch is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagged_resource_reaches_remote_watchers_after_later_events_of_others() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let s = TestServer::new();
    let http = s.serve_http().await.unwrap();
    let remote = http.client().unwrap();
    let lag = Duration::from_millis(800);
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let tasks = [
        forward(
            Api::<VolumeAttachment>::all(remote.clone()),
            "va",
            false,
            tx.clone(),
        ),
        forward(
            Api::<PersistentVolume>::all(remote.clone()),
            "pv",
            false,
            tx.clone(),
        ),
        forward(
            Api::<VolumeAttachment>::all(s.client()),
            "local va",
            false,
            tx,
        ),
    ];
    for _ in 0..tasks.len() {
        assert_eq!(next_seen(&mut seen).await.1, "ready");
    }
    wait_watching(
        &s,
        &[(VAS, true), ("persistentvolumes", true), (VAS, false)],
    )
    .await;
    s.set_watch_lag(VAS, lag);
    let created = Instant::now();
    s.create_object(va("va-1", "pv-1")).unwrap();
    // A live read is the cure: it answers at once.
    let vas: Api<VolumeAttachment> = Api::all(remote);
    let listed = vas.list(&Default::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1, "LIST answers the current state");
    vas.get("va-1").await.unwrap();
    assert!(created.elapsed() < lag, "LIST and GET are not held");
    s.create_object(pv("pv-1")).unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        let (label, name, at) = next_seen(&mut seen).await;
        if label == "va" {
            assert!(at >= created + lag, "held {:?}", at - created);
        } else {
            assert!(at < created + lag, "{label} {name} not held");
        }
        order.push(format!("{label} {name}"));
    }
    // The in-process watch's event and the PV's may come in either order.
    assert_eq!(
        order.last().map(String::as_str),
        Some("va va-1"),
        "{order:?}"
    );
    order.sort();
    assert_eq!(order, ["local va va-1", "pv pv-1", "va va-1"]);
    assert_eq!(s.watch_events_held(VAS), 1, "the remote watch's one event");
    assert_eq!(s.watch_events_held("persistentvolumes"), 0);
    stop(tasks).await;
}

/// A lagged watch keeps the order of its events, each sent at its write's
/// time plus the lag at the earliest, and no bookmark comes before an
/// event it covers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagged_watch_keeps_its_order_and_no_bookmark_overtakes_a_held_event() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::WatchEvent;
    let s = TestServer::builder()
        .bookmark_interval(Duration::from_millis(40))
        .build();
    let http = s.serve_http().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(http.client().unwrap());
    let lag = Duration::from_millis(200);
    s.set_watch_lag(VAS, lag);
    let params = kube::api::WatchParams::default().timeout(10);
    let from = s.resource_version().to_string();
    let mut stream = std::pin::pin!(vas.watch(&params, &from).await.unwrap());
    let mut writes = Vec::new();
    let written = |writes: &mut Vec<Instant>| writes.push(Instant::now());
    written(&mut writes);
    let a = s.create_object(va("a", "pv-a")).unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    written(&mut writes);
    let mut changed = a.clone();
    changed["spec"]["nodeName"] = serde_json::json!("m");
    s.update_object(changed).unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    written(&mut writes);
    s.delete_object("storage.k8s.io/v1", "VolumeAttachment", "", "a")
        .unwrap();
    written(&mut writes);
    s.create_object(va("b", "pv-b")).unwrap();
    let mut events = Vec::new();
    // Per bookmark, the last event's resourceVersion before it.
    let mut bookmarks = Vec::new();
    while events.len() < 4 {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("an event within 5 s")
            .expect("the watch goes on")
            .unwrap();
        let at = Instant::now();
        let (kind, object) = match event {
            WatchEvent::Bookmark(b) => {
                let rv: u64 = b.metadata.resource_version.parse().unwrap();
                bookmarks.push((events.len(), rv));
                continue;
            }
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            WatchEvent::Error(e) => panic!("{e:?}"),
        };
        let rv: u64 = object.metadata.resource_version.unwrap().parse().unwrap();
        let name = object.metadata.name.unwrap();
        events.push((format!("{kind} {name}"), rv, at));
    }
    let kinds: Vec<&str> = events.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(kinds, ["ADDED a", "MODIFIED a", "DELETED a", "ADDED b"]);
    for (i, (kind, _, at)) in events.iter().enumerate() {
        assert!(*at >= writes[i] + lag, "{kind} sent before its time");
    }
    assert!(events.windows(2).all(|w| w[0].1 < w[1].1), "{events:?}");
    assert!(!bookmarks.is_empty(), "bookmarks came meanwhile");
    for (before, rv) in bookmarks {
        // The events after the bookmark are all newer than it.
        if let Some((kind, event_rv, _)) = events.get(before) {
            assert!(
                *event_rv > rv,
                "bookmark at {rv} before {kind} at {event_rv}"
            );
        }
    }
    assert_eq!(s.watch_events_held(VAS), 4);
}

/// A watch started during a lag gets its initial events (a streaming
/// list) no sooner than a lagged watch would have brought them; LIST
/// still answers at once, and the in-process client's is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_started_during_a_lag_gets_its_initial_events_as_late() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let s = TestServer::new();
    let http = s.serve_http().await.unwrap();
    let remote = http.client().unwrap();
    let lag = Duration::from_millis(800);
    s.create_object(va("a", "pv-a")).unwrap();
    s.set_watch_lag(VAS, lag);
    let started = Instant::now();
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let tasks = [
        forward(
            Api::<VolumeAttachment>::all(remote.clone()),
            "remote",
            true,
            tx.clone(),
        ),
        forward(
            Api::<VolumeAttachment>::all(s.client()),
            "local",
            true,
            tx.clone(),
        ),
        // A LIST, then a watch: the LIST is not held.
        forward(Api::<VolumeAttachment>::all(remote), "listed", false, tx),
    ];
    let mut order = Vec::new();
    for _ in 0..6 {
        let (label, name, at) = next_seen(&mut seen).await;
        if label == "remote" {
            assert!(at >= started + lag, "held {:?}", at - started);
        } else {
            assert!(at < started + lag, "{label} {name} not held");
        }
        order.push(format!("{label} {name}"));
    }
    assert_eq!(&order[4..], ["remote a", "remote ready"], "{order:?}");
    assert_eq!(s.watch_events_held(VAS), 1);
    stop(tasks).await;
}

/// Clearing a lag does not reorder: an event held keeps its time and the
/// next waits behind it; then events flow at once. `clear_faults` ends a
/// lag too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_a_watch_lag_keeps_the_order_and_ends_the_delay() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::WatchEvent;
    let s = TestServer::new();
    let http = s.serve_http().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(http.client().unwrap());
    let lag = Duration::from_millis(400);
    // Registered once the answer is in: it sees every write below.
    let params = kube::api::WatchParams::default().timeout(10);
    let from = s.resource_version().to_string();
    let mut stream = std::pin::pin!(vas.watch(&params, &from).await.unwrap());
    let mut next = async || loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("an event within 5 s")
            .expect("the watch goes on")
            .unwrap();
        if let WatchEvent::Added(o) = event {
            return (o.metadata.name.unwrap(), Instant::now());
        }
    };
    s.set_watch_lag(VAS, lag);
    let held = Instant::now();
    s.create_object(va("a", "pv-a")).unwrap();
    s.clear_watch_lag(VAS);
    s.create_object(va("b", "pv-b")).unwrap();
    let (first, at) = next().await;
    assert_eq!(first, "a");
    assert!(at >= held + lag, "held {:?}", at - held);
    assert_eq!(next().await.0, "b", "behind a, not before");
    // Held, it would take the lag at least.
    let fast = |at: Instant, since: Instant| at - since < lag;
    let since = Instant::now();
    s.create_object(va("c", "pv-c")).unwrap();
    let (name, at) = next().await;
    assert!(
        name == "c" && fast(at, since),
        "{name} after {:?}",
        at - since
    );
    assert_eq!(s.watch_events_held(VAS), 1, "b was not held");
    s.set_watch_lag(VAS, lag);
    s.clear_faults();
    let since = Instant::now();
    s.create_object(va("d", "pv-d")).unwrap();
    let (name, at) = next().await;
    assert!(
        name == "d" && fast(at, since),
        "{name} after {:?}",
        at - since
    );
    assert_eq!(s.watch_events_held(VAS), 1);
    s.reset_counters();
    assert_eq!(s.watch_events_held(VAS), 0);
}

/// A stale list answers `resourceVersion=0` lists with the picture and
/// revision of its instant; consistent lists answer the current state; a
/// watch from the stale revision replays what changed since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_list_answers_the_watch_cache_lists_with_an_earlier_picture() {
    use kube::api::{ListParams, WatchEvent, WatchParams};
    let s = TestServer::new();
    post(&s, PVS, pv("old")).await;
    s.serve_stale_lists("persistentvolumes");
    post(&s, PVS, pv("new")).await;
    let pvs: Api<PersistentVolume> = Api::all(s.client());
    let names = |list: &kube::api::ObjectList<PersistentVolume>| -> Vec<String> {
        list.items
            .iter()
            .filter_map(|pv| pv.metadata.name.clone())
            .collect()
    };
    let cached = ListParams::default().at("0");
    let stale = pvs.list(&cached).await.expect("rv=0 list");
    assert_eq!(names(&stale), ["old"]);
    let current = pvs.list(&ListParams::default()).await.expect("list");
    assert_eq!(names(&current), ["new", "old"]);
    let stale_rv = stale.metadata.resource_version.clone().expect("rv");
    let revision = |rv: &str| rv.parse::<u64>().expect("a numeric resourceVersion");
    let current_rv = current.metadata.resource_version.clone().expect("rv");
    assert!(revision(&stale_rv) < revision(&current_rv));
    let mut watch = pvs
        .watch(&WatchParams::default(), &stale_rv)
        .await
        .expect("watch")
        .boxed();
    match watch.next().await {
        Some(Ok(WatchEvent::Added(pv))) => assert_eq!(pv.metadata.name.as_deref(), Some("new")),
        other => panic!("the change since the stale picture: {other:?}"),
    }
    s.serve_current_lists("persistentvolumes");
    assert_eq!(
        names(&pvs.list(&cached).await.expect("list")),
        ["new", "old"]
    );
}
