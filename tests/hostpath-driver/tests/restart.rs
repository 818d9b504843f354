//! State survives a restart of the driver; leftovers of interrupted
//! operations are cleaned at start.

mod common;

use std::collections::BTreeMap;

use common::*;
use csi_hostpath::{Config, Driver, backend_snapshots, backend_volumes, volume_path};
use csi_proto::v1 as csi;
use tonic::Code;

#[tokio::test]
async fn volumes_and_snapshots_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limited = |c: &mut Config| {
        c.capacity = BTreeMap::from([("k".to_owned(), 10 << 20)]);
    };
    let server = Server::start_in(dir.path(), limited).await;
    let state = server.config.state_dir.clone();
    let mut c = server.controller();
    let a = create(&mut c, create_req("a", 6 * MIB)).await.expect("a");
    std::fs::write(volume_path(&state, &a.volume_id).join("keep.txt"), b"kept").expect("write");
    let snap = snapshot(&mut c, "snap", &a.volume_id)
        .await
        .expect("snapshot");
    let before = list_volume_ids(&mut c).await;
    drop(c);
    server.stop().await.expect("clean stop");
    assert!(
        !dir.path().join("csi.sock").exists(),
        "socket removed on stop"
    );

    // Leftovers as a crash mid-operation would leave them.
    let orphan = volume_path(&state, "11111111-2222-3333-4444-555555555555");
    std::fs::create_dir_all(&orphan).expect("orphan dir");
    std::fs::write(orphan.join("junk"), b"junk").expect("write");
    std::fs::write(state.join("volumes").join(".tmpXYZ"), b"{partial").expect("temp file");

    let server = Server::start_in(dir.path(), limited).await;
    let mut c = server.controller();
    assert_eq!(list_volume_ids(&mut c).await, before);
    assert!(!orphan.exists(), "orphan data directory removed");
    assert!(!state.join("volumes").join(".tmpXYZ").exists());
    // Idempotent create returns the same volume after the restart.
    let again = create(&mut c, create_req("a", 6 * MIB))
        .await
        .expect("repeat");
    assert_eq!(again, a);
    assert_eq!(
        std::fs::read(volume_path(&state, &a.volume_id).join("keep.txt")).expect("data"),
        b"kept"
    );
    // Capacity accounting is rebuilt from the records.
    assert_eq!(
        code(create(&mut c, create_req("b", 6 * MIB)).await),
        Code::ResourceExhausted
    );
    let got = c
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .expect("snapshot survives")
        .into_inner();
    assert_eq!(got.snapshot, Some(snap.clone()));
    assert_eq!(
        snapshot(&mut c, "snap", &a.volume_id)
            .await
            .expect("repeat"),
        snap
    );
    delete(&mut c, &a.volume_id).await.expect("delete");
    drop(c);
    server.stop().await.expect("clean stop");
    assert!(backend_volumes(&state).expect("records").is_empty());
    assert_eq!(backend_snapshots(&state).expect("records").len(), 1);
}

#[test]
fn driver_new_rejects_bad_state_and_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::for_tests(dir.path());
    let volumes = config.state_dir.join("volumes");
    std::fs::create_dir_all(&volumes).expect("mkdir");
    std::fs::write(volumes.join("x.json"), b"not json").expect("write");
    assert!(matches!(
        Driver::new(config.clone()),
        Err(csi_hostpath::Error::Record { .. })
    ));
    std::fs::remove_file(volumes.join("x.json")).expect("rm");
    let driver = Driver::new(config.clone()).expect("empty state is fine");
    assert_eq!(driver.config(), &config);

    for bad in [
        Config {
            driver_name: String::new(),
            ..config.clone()
        },
        Config {
            node_id: String::new(),
            ..config.clone()
        },
        Config {
            max_volume_size: 0,
            ..config.clone()
        },
        Config {
            max_volume_size: u64::MAX,
            ..config.clone()
        },
        Config {
            capacity: BTreeMap::from([(String::new(), 1)]),
            ..config.clone()
        },
        Config {
            topology_key: String::new(),
            ..config.clone()
        },
        Config {
            topology_key: "not a label key".to_owned(),
            ..config.clone()
        },
    ] {
        assert!(
            matches!(
                Driver::new(bad.clone()),
                Err(csi_hostpath::Error::Config(_))
            ),
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn serve_fails_on_an_unusable_endpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::for_tests(dir.path());
    // A regular file where the socket should go is not removed.
    std::fs::write(&config.endpoint, b"not a socket").expect("write");
    let err = csi_hostpath::serve(config.clone(), async {})
        .await
        .expect_err("bind fails");
    assert!(matches!(err, csi_hostpath::Error::Io { .. }), "{err}");
    assert!(config.endpoint.is_file());
    // A second driver on a live socket path replaces the stale socket file
    // of a previous run.
    config.endpoint = dir.path().join("other.sock");
    let server = Server::start(config.clone()).await;
    server.stop().await.expect("clean stop");
    let server = Server::start(config).await;
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn stop_is_bounded_while_a_client_holds_an_idle_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    // A client on its own runtime makes one call, then is never polled
    // again and never closes its connection.
    let socket = server.config.endpoint.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let channel = rt.block_on(async {
            let channel = connect(&socket).await;
            csi::identity_client::IdentityClient::new(channel.clone())
                .probe(csi::ProbeRequest {})
                .await
                .expect("probe");
            channel
        });
        ready_tx.send(()).expect("ready");
        let _ = done_rx.recv();
        drop(channel);
        drop(rt);
    });
    tokio::task::spawn_blocking(move || ready_rx.recv())
        .await
        .expect("join")
        .expect("client ready");
    let start = std::time::Instant::now();
    server.stop().await.expect("clean stop");
    let took = start.elapsed();
    assert!(
        took < csi_hostpath::SHUTDOWN_GRACE + std::time::Duration::from_secs(3),
        "{took:?}"
    );
    assert!(!dir.path().join("csi.sock").exists());
    done_tx.send(()).expect("release client");
    holder.join().expect("client thread");
}
