//! The watch-delaying proxy ([`controlplane::LagProxy`]) in front of the
//! real API server: a lagged kind's watch events come late and in order,
//! other kinds and every non-watch request pass at once, requests reach the
//! API server as the proxy's user.

use std::time::{Duration, Instant};

use controlplane::{Config, ControlPlane, LagProxy};
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const LAG: Duration = Duration::from_secs(3);

fn attachment(name: &str) -> VolumeAttachment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": "lag-proxy.example.com", "nodeName": "lag-proxy-node",
                 "source": {"persistentVolumeName": name}},
    }))
    .expect("VolumeAttachment")
}

fn volume(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain",
                 "csi": {"driver": "lag-proxy.example.com", "volumeHandle": name}},
    }))
    .expect("PersistentVolume")
}

/// An ADDED event: (kind, name, when it arrived).
type Added = (&'static str, String, Instant);

/// Forwards the ADDED events of `api`'s watch from `version` on.
fn watch_added<K>(
    kind: &'static str,
    api: Api<K>,
    version: String,
    out: tokio::sync::mpsc::UnboundedSender<Added>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let stream = api
            .watch(&WatchParams::default().timeout(290), &version)
            .await
            .expect("watch through the proxy");
        let mut stream = stream.boxed();
        while let Some(event) = stream.try_next().await.expect("watch event") {
            if let WatchEvent::Added(object) = event {
                let name = object.meta().name.clone().unwrap_or_default();
                if out.send((kind, name, Instant::now())).is_err() {
                    return;
                }
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagged_watch_delivers_late_and_in_order_while_the_rest_passes() {
    let test = "a_lagged_watch_delivers_late_and_in_order_while_the_rest_passes";
    let Some(plane) = ControlPlane::shared(&Config::standard(), test) else {
        return;
    };
    let user = format!("lag-proxy-{}", std::process::id());
    let proxy = LagProxy::start(plane, &user, Some("system:masters")).expect("proxy");
    proxy.set_watch_lag("volumeattachments", LAG);
    let proxied = controlplane::client_from(proxy.kubeconfig())
        .await
        .expect("a client of the proxy's kubeconfig (http://, no credentials)");
    let admin = plane.admin_client().await.expect("admin client");
    let attachments: Api<VolumeAttachment> = Api::all(proxied.clone());
    let volumes: Api<PersistentVolume> = Api::all(proxied.clone());

    // A LIST of the lagged kind answers at once.
    let started = Instant::now();
    let listed = attachments
        .list(&ListParams::default())
        .await
        .expect("list through the proxy");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "a LIST waited {:?} in the proxy",
        started.elapsed()
    );
    let volume_version = volumes
        .list(&ListParams::default())
        .await
        .expect("list volumes")
        .metadata
        .resource_version
        .expect("resourceVersion");
    let attachment_version = listed.metadata.resource_version.expect("resourceVersion");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watches = [
        watch_added(
            "attachment",
            attachments.clone(),
            attachment_version,
            tx.clone(),
        ),
        watch_added("volume", volumes.clone(), volume_version, tx),
    ];
    // The watches are open once their first request reached the server;
    // a moment is plenty on loopback.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The attachment first, the volume after it.
    let name = format!("lag-proxy-{}", std::process::id());
    let created = Instant::now();
    Api::<VolumeAttachment>::all(admin.clone())
        .create(&PostParams::default(), &attachment(&name))
        .await
        .expect("create the VolumeAttachment");
    tokio::time::sleep(Duration::from_millis(200)).await;
    Api::<PersistentVolume>::all(admin.clone())
        .create(&PostParams::default(), &volume(&name))
        .await
        .expect("create the PersistentVolume");

    let mut seen: Vec<(&'static str, Instant)> = Vec::new();
    let deadline = Instant::now() + LAG + Duration::from_secs(10);
    while seen.len() < 2 {
        let (kind, got, at) = tokio::time::timeout_at(deadline.into(), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("both ADDED events within the lag; seen {seen:?}"))
            .expect("watches running");
        if got == name {
            seen.push((kind, at));
        } // else another test's object
    }
    let (first, first_at) = seen[0];
    let (_, second_at) = seen[1];
    assert_eq!(
        first,
        "volume",
        "the PersistentVolume created 200 ms after the VolumeAttachment is seen first \
         (at {:?}, the second at {:?} after the attachment's creation)",
        first_at.duration_since(created),
        second_at.duration_since(created)
    );
    assert!(
        first_at.duration_since(created) < Duration::from_secs(1),
        "the volume's event (not lagged) passed at once: {:?}",
        first_at.duration_since(created)
    );
    assert!(
        second_at.duration_since(created) >= LAG,
        "the attachment's event came after the lag: {:?}",
        second_at.duration_since(created)
    );
    assert!(
        proxy.held("volumeattachments") >= 1,
        "held: {}",
        proxy.held("volumeattachments")
    );
    assert_eq!(proxy.held("persistentvolumes"), 0);

    // Cleared: the open watch passes the next event at once.
    proxy.clear_watch_lag("volumeattachments");
    let held = proxy.held("volumeattachments");
    let second = format!("{name}-2");
    let created = Instant::now();
    Api::<VolumeAttachment>::all(admin.clone())
        .create(&PostParams::default(), &attachment(&second))
        .await
        .expect("create the second VolumeAttachment");
    loop {
        let (_, got, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the second attachment's event")
            .expect("watches running");
        if got == second {
            assert!(
                at.duration_since(created) < Duration::from_secs(1),
                "not lagged after clear_watch_lag: {:?}",
                at.duration_since(created)
            );
            break;
        }
    }
    assert_eq!(proxy.held("volumeattachments"), held);

    // The API server saw the proxy's user.
    let audit = plane.audit();
    for (verb, resource) in [
        ("list", "volumeattachments"),
        ("watch", "volumeattachments"),
        ("watch", "persistentvolumes"),
    ] {
        assert!(
            audit
                .iter()
                .any(|r| r.user.username == user && r.verb == verb && r.resource() == resource),
            "{verb} {resource} by {user} in the audit log"
        );
    }

    for watch in watches {
        watch.abort();
    }
    let url = proxy.url();
    drop(proxy);
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the proxy stopped when dropped"
    );
    for n in [&name, &second] {
        let _ = Api::<VolumeAttachment>::all(admin.clone())
            .delete(n, &DeleteParams::default())
            .await;
    }
    let _ = Api::<PersistentVolume>::all(admin)
        .delete(&name, &DeleteParams::default())
        .await;
}
