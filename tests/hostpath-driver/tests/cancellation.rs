//! A request whose caller goes away still finishes, or never starts.
//!
//! tonic drops a handler's future when the client's deadline passes or its
//! connection closes (the sidecar runs with a 1 s `--timeout` in chaos, and
//! is killed there). A handler dropped between writing a record and
//! updating the in-memory index left the two apart: the retry of a
//! `CreateVolume` made a second volume of the same name, and the next start
//! refused the state directory ("two volume records have the name"). These
//! tests call the service directly, poll a request N times, drop it, let the
//! background work settle, and check that the index and the records agree,
//! that a retry finds the first volume, and that the driver starts again.

mod common;

use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::*;
use csi_hostpath::{Config, Driver, backend_snapshots, backend_volumes};
use csi_proto::v1::{self as csi, controller_server::Controller};
use tonic::{Request, Response, Status};

/// The most polls tried before a request must have completed.
const MOST_POLLS: usize = 50;

/// Polls `future` up to `polls` times, letting background tasks run between
/// polls; drops it if it has not completed. `Some` when it completed.
async fn poll_then_drop<T>(future: impl Future<Output = T>, polls: usize) -> Option<T> {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for poll in 0..polls {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return Some(value);
        }
        if poll + 1 < polls {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    None
}

/// Waits until `settled` holds (the work of a dropped request finished),
/// at most 10 s.
async fn settle(what: &str, settled: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !settled() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not settled within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The volume records; a read that races with a record's removal (the
/// dropped request's work still running) is read again.
fn volume_records(state: &Path) -> Vec<csi_hostpath::VolumeRecord> {
    let mut tries = 0;
    loop {
        match backend_volumes(state) {
            Ok(records) => return records,
            Err(e) if tries < 100 => {
                tries += 1;
                let _ = e;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("volume records: {e}"),
        }
    }
}

fn volume_names(state: &Path) -> Vec<String> {
    let mut names: Vec<String> = volume_records(state).into_iter().map(|v| v.name).collect();
    names.sort();
    names
}

/// The ids the driver's index lists, sorted.
async fn indexed_volume_ids(driver: &Driver) -> Vec<String> {
    let mut ids: Vec<String> = driver
        .list_volumes(Request::new(csi::ListVolumesRequest::default()))
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.expect("entry has a volume").volume_id)
        .collect();
    ids.sort();
    ids
}

fn recorded_volume_ids(state: &Path) -> Vec<String> {
    let mut ids: Vec<String> = volume_records(state).into_iter().map(|v| v.id).collect();
    ids.sort();
    ids
}

async fn create_volume(driver: &Driver, name: &str) -> Result<csi::Volume, Status> {
    driver
        .create_volume(Request::new(create_req(name, MIB)))
        .await
        .map(|r| r.into_inner().volume.expect("a volume"))
}

fn volume_of(response: Result<Response<csi::CreateVolumeResponse>, Status>) -> csi::Volume {
    response
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume")
}

/// The index and the records agree, and a new driver loads the directory.
async fn assert_consistent(driver: &Driver, config: &Config, what: &str) {
    assert_eq!(
        indexed_volume_ids(driver).await,
        recorded_volume_ids(&config.state_dir),
        "{what}: the index lists exactly the recorded volumes"
    );
    if let Err(e) = Driver::new(config.clone()) {
        panic!("{what}: the driver does not start again: {e}");
    }
}

#[tokio::test]
async fn a_create_volume_dropped_after_any_poll_leaves_one_volume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::for_tests(dir.path());
    let driver = Driver::new(config.clone()).expect("driver");
    for polls in 1..=MOST_POLLS {
        let name = format!("dropped-after-{polls}");
        let request = Request::new(create_req(&name, MIB));
        let completed = poll_then_drop(driver.create_volume(request), polls).await;
        let first = match completed {
            Some(response) => Some(volume_of(response)),
            None => {
                // The caller is gone; the volume is made all the same.
                settle(&name, || volume_names(&config.state_dir).contains(&name)).await;
                None
            }
        };
        let retry = create_volume(&driver, &name).await.expect("retry");
        if let Some(first) = &first {
            assert_eq!(&retry, first, "{name}: the retry returns the volume");
        }
        let records = volume_names(&config.state_dir)
            .into_iter()
            .filter(|n| *n == name)
            .count();
        assert_eq!(records, 1, "{name}: one record after the retry");
        assert_consistent(&driver, &config, &name).await;
        if first.is_some() {
            return;
        }
    }
    panic!("CreateVolume did not complete within {MOST_POLLS} polls");
}

#[tokio::test]
async fn a_delete_volume_dropped_after_any_poll_deletes_it_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::for_tests(dir.path());
    let driver = Driver::new(config.clone()).expect("driver");
    for polls in 1..=MOST_POLLS {
        let name = format!("deleted-after-{polls}");
        let volume = create_volume(&driver, &name).await.expect("create");
        let request = Request::new(csi::DeleteVolumeRequest {
            volume_id: volume.volume_id.clone(),
            ..Default::default()
        });
        let completed = poll_then_drop(driver.delete_volume(request), polls).await;
        if let Some(response) = &completed {
            assert!(response.is_ok(), "{name}: DeleteVolume: {response:?}");
        } else {
            settle(&name, || !volume_names(&config.state_dir).contains(&name)).await;
        }
        assert_consistent(&driver, &config, &name).await;
        // The name is free: a new volume, not the deleted one.
        let again = create_volume(&driver, &name).await.expect("create again");
        assert_ne!(
            again.volume_id, volume.volume_id,
            "{name}: a deleted volume is not handed out again"
        );
        assert_consistent(&driver, &config, &name).await;
        if completed.is_some() {
            return;
        }
    }
    panic!("DeleteVolume did not complete within {MOST_POLLS} polls");
}

#[tokio::test]
async fn a_create_snapshot_dropped_after_any_poll_leaves_one_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::for_tests(dir.path());
    let driver = Driver::new(config.clone()).expect("driver");
    let source = create_volume(&driver, "source").await.expect("source");
    let snapshot_names = || -> Vec<String> {
        backend_snapshots(&config.state_dir)
            .expect("snapshot records")
            .into_iter()
            .map(|s| s.name)
            .collect()
    };
    let request = |name: &str| {
        Request::new(csi::CreateSnapshotRequest {
            name: name.to_owned(),
            source_volume_id: source.volume_id.clone(),
            ..Default::default()
        })
    };
    for polls in 1..=MOST_POLLS {
        let name = format!("snapshot-dropped-after-{polls}");
        let completed = poll_then_drop(driver.create_snapshot(request(&name)), polls).await;
        if completed.is_none() {
            settle(&name, || snapshot_names().contains(&name)).await;
        }
        let retry = driver
            .create_snapshot(request(&name))
            .await
            .expect("retry")
            .into_inner()
            .snapshot
            .expect("a snapshot");
        let records = snapshot_names().into_iter().filter(|n| *n == name).count();
        assert_eq!(records, 1, "{name}: one record after the retry");
        if let Err(e) = Driver::new(config.clone()) {
            panic!("{name}: the driver does not start again: {e}");
        }
        if let Some(first) = completed {
            let first = first.expect("CreateSnapshot").into_inner().snapshot;
            assert_eq!(first.as_ref(), Some(&retry), "{name}: the same snapshot");
            return;
        }
    }
    panic!("CreateSnapshot did not complete within {MOST_POLLS} polls");
}

#[tokio::test]
async fn a_delete_snapshot_dropped_after_any_poll_deletes_it_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::for_tests(dir.path());
    let driver = Driver::new(config.clone()).expect("driver");
    let source = create_volume(&driver, "source").await.expect("source");
    let create = |name: &str| {
        Request::new(csi::CreateSnapshotRequest {
            name: name.to_owned(),
            source_volume_id: source.volume_id.clone(),
            ..Default::default()
        })
    };
    for polls in 1..=MOST_POLLS {
        let name = format!("snapshot-deleted-after-{polls}");
        let snapshot = driver
            .create_snapshot(create(&name))
            .await
            .expect("create")
            .into_inner()
            .snapshot
            .expect("a snapshot");
        let request = Request::new(csi::DeleteSnapshotRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            ..Default::default()
        });
        let completed = poll_then_drop(driver.delete_snapshot(request), polls).await;
        let recorded = || {
            backend_snapshots(&config.state_dir)
                .expect("snapshot records")
                .into_iter()
                .any(|s| s.id == snapshot.snapshot_id)
        };
        if completed.is_none() {
            settle(&name, || !recorded()).await;
        }
        let again = driver
            .create_snapshot(create(&name))
            .await
            .expect("create again")
            .into_inner()
            .snapshot
            .expect("a snapshot");
        assert_ne!(
            again.snapshot_id, snapshot.snapshot_id,
            "{name}: a deleted snapshot is not handed out again"
        );
        if completed.is_some() {
            return;
        }
    }
    panic!("DeleteSnapshot did not complete within {MOST_POLLS} polls");
}
