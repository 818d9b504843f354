//! Snapshots, restores and clones: contents are copied.

mod common;

use common::*;
use csi_hostpath::{backend_snapshots, backend_volumes, snapshot_path, volume_path};
use csi_proto::v1::{self as csi, volume_capability::access_mode::Mode, volume_content_source};
use tonic::Code;

fn from_snapshot(name: &str, bytes: i64, snapshot_id: &str) -> csi::CreateVolumeRequest {
    let mut r = create_req(name, bytes);
    r.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: snapshot_id.to_owned(),
            },
        )),
    });
    r
}

fn from_volume(name: &str, bytes: i64, volume_id: &str) -> csi::CreateVolumeRequest {
    let mut r = create_req(name, bytes);
    r.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: volume_id.to_owned(),
            },
        )),
    });
    r
}

#[tokio::test]
async fn snapshot_restore_and_clone_copy_contents() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let state = server.config.state_dir.clone();
    let mut c = server.controller();
    let src = create(&mut c, create_req("src", 4 * MIB))
        .await
        .expect("source");
    let src_dir = volume_path(&state, &src.volume_id);
    std::fs::create_dir(src_dir.join("sub")).expect("mkdir");
    std::fs::write(src_dir.join("sub").join("data.txt"), b"version 1").expect("write");

    let snap = snapshot(&mut c, "snap-1", &src.volume_id)
        .await
        .expect("snapshot");
    assert!(snap.ready_to_use);
    assert_eq!(snap.size_bytes, 4 * MIB);
    assert_eq!(snap.source_volume_id, src.volume_id);
    assert!(snap.creation_time.is_some());
    assert_eq!(
        std::fs::read(
            snapshot_path(&state, &snap.snapshot_id)
                .join("sub")
                .join("data.txt")
        )
        .expect("snapshot content"),
        b"version 1"
    );
    // Idempotent by name and source.
    assert_eq!(
        snapshot(&mut c, "snap-1", &src.volume_id)
            .await
            .expect("repeat"),
        snap
    );

    // The snapshot is a copy: later writes to the source do not change it.
    std::fs::write(src_dir.join("sub").join("data.txt"), b"version 2").expect("write");

    let restored = create(
        &mut c,
        from_snapshot("restored", 4 * MIB, &snap.snapshot_id),
    )
    .await
    .expect("restore");
    assert_eq!(
        restored.content_source,
        from_snapshot("x", 0, &snap.snapshot_id).volume_content_source
    );
    assert_eq!(
        std::fs::read(
            volume_path(&state, &restored.volume_id)
                .join("sub")
                .join("data.txt")
        )
        .expect("restored content"),
        b"version 1"
    );
    let clone = create(&mut c, from_volume("clone", 8 * MIB, &src.volume_id))
        .await
        .expect("clone");
    assert_eq!(clone.capacity_bytes, 8 * MIB);
    assert_eq!(
        clone.content_source,
        from_volume("x", 0, &src.volume_id).volume_content_source
    );
    assert_eq!(
        std::fs::read(
            volume_path(&state, &clone.volume_id)
                .join("sub")
                .join("data.txt")
        )
        .expect("clone content"),
        b"version 2"
    );
    // Idempotent restore; a different source under the same name is not.
    assert_eq!(
        create(
            &mut c,
            from_snapshot("restored", 4 * MIB, &snap.snapshot_id)
        )
        .await
        .expect("repeat restore")
        .volume_id,
        restored.volume_id
    );
    assert_eq!(
        code(create(&mut c, from_volume("restored", 4 * MIB, &src.volume_id)).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(create(&mut c, create_req("restored", 4 * MIB)).await),
        Code::AlreadyExists
    );

    // Deleting the source volume keeps the snapshot (an independent copy),
    // and the snapshot can still be restored.
    delete(&mut c, &src.volume_id).await.expect("delete source");
    assert_eq!(backend_snapshots(&state).expect("records").len(), 1);
    let late = create(&mut c, from_snapshot("late", 4 * MIB, &snap.snapshot_id))
        .await
        .expect("restore after source deletion");
    assert!(
        volume_path(&state, &late.volume_id)
            .join("sub")
            .join("data.txt")
            .exists()
    );
    // The snapshot's repeat still answers with the (deleted) source id.
    assert_eq!(
        snapshot(&mut c, "snap-1", &src.volume_id)
            .await
            .expect("repeat"),
        snap
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn content_source_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let src = create(&mut c, create_req("src", 4 * MIB))
        .await
        .expect("source");
    let snap = snapshot(&mut c, "s", &src.volume_id)
        .await
        .expect("snapshot");

    assert_eq!(
        code(
            create(
                &mut c,
                from_snapshot("a", 4 * MIB, "00000000-0000-0000-0000-000000000000")
            )
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(create(&mut c, from_volume("b", 4 * MIB, "no-such-volume")).await),
        Code::NotFound
    );
    assert_eq!(
        code(create(&mut c, from_snapshot("c", 2 * MIB, &snap.snapshot_id)).await),
        Code::OutOfRange
    );
    assert_eq!(
        code(create(&mut c, from_volume("d", 2 * MIB, &src.volume_id)).await),
        Code::OutOfRange
    );
    let mut block = from_snapshot("e", 4 * MIB, &snap.snapshot_id);
    block.volume_capabilities = vec![block_cap(Mode::SingleNodeWriter)];
    assert_eq!(code(create(&mut c, block).await), Code::InvalidArgument);
    assert_eq!(
        code(create(&mut c, from_snapshot("f", 4 * MIB, "")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        backend_volumes(&server.config.state_dir)
            .expect("records")
            .len(),
        1,
        "failed creations leave nothing behind"
    );

    assert_eq!(
        code(snapshot(&mut c, "", &src.volume_id).await),
        Code::InvalidArgument
    );
    assert_eq!(code(snapshot(&mut c, "x", "").await), Code::InvalidArgument);
    assert_eq!(
        code(snapshot(&mut c, "x", "no-such-volume").await),
        Code::NotFound
    );
    let other = create(&mut c, create_req("other", MIB))
        .await
        .expect("other");
    assert_eq!(
        code(snapshot(&mut c, "s", &other.volume_id).await),
        Code::AlreadyExists
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn block_snapshot_restores_into_a_larger_block_volume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let state = server.config.state_dir.clone();
    let mut c = server.controller();
    let mut req = create_req("blk", 4 * MIB);
    req.volume_capabilities = vec![block_cap(Mode::SingleNodeWriter)];
    let v = create(&mut c, req).await.expect("block");
    let file = volume_path(&state, &v.volume_id).join("block");
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .expect("open");
        f.seek(SeekFrom::Start(MIB as u64)).expect("seek");
        f.write_all(b"sector").expect("write");
    }
    let snap = snapshot(&mut c, "bs", &v.volume_id)
        .await
        .expect("snapshot");
    let mut restore = from_snapshot("big", 8 * MIB, &snap.snapshot_id);
    restore.volume_capabilities = vec![block_cap(Mode::SingleNodeWriter)];
    let big = create(&mut c, restore).await.expect("restore");
    let restored = std::fs::read(volume_path(&state, &big.volume_id).join("block")).expect("read");
    assert_eq!(restored.len(), 8 << 20);
    assert_eq!(&restored[1 << 20..(1 << 20) + 6], b"sector");
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn list_get_and_delete_snapshots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let state = server.config.state_dir.clone();
    let mut c = server.controller();
    let a = create(&mut c, create_req("a", MIB)).await.expect("a");
    let b = create(&mut c, create_req("b", MIB)).await.expect("b");
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            snapshot(&mut c, &format!("a{i}"), &a.volume_id)
                .await
                .expect("snap")
                .snapshot_id,
        );
    }
    let b_snap = snapshot(&mut c, "b0", &b.volume_id).await.expect("snap");
    let list = |req: csi::ListSnapshotsRequest| {
        let mut c = c.clone();
        async move { c.list_snapshots(req).await.map(|r| r.into_inner()) }
    };
    let ids_of = |resp: &csi::ListSnapshotsResponse| -> Vec<String> {
        resp.entries
            .iter()
            .map(|e| e.snapshot.as_ref().expect("snapshot").snapshot_id.clone())
            .collect()
    };
    let all = list(csi::ListSnapshotsRequest::default())
        .await
        .expect("all");
    assert_eq!(all.entries.len(), 4);
    assert!(all.next_token.is_empty());

    let mut of_a = ids.clone();
    of_a.sort();
    let by_source = list(csi::ListSnapshotsRequest {
        source_volume_id: a.volume_id.clone(),
        ..Default::default()
    })
    .await
    .expect("by source");
    assert_eq!(ids_of(&by_source), of_a);

    let by_id = list(csi::ListSnapshotsRequest {
        snapshot_id: b_snap.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .expect("by id");
    assert_eq!(ids_of(&by_id), std::slice::from_ref(&b_snap.snapshot_id));
    let unknown = list(csi::ListSnapshotsRequest {
        snapshot_id: "nope".to_owned(),
        ..Default::default()
    })
    .await
    .expect("unknown id is an empty list");
    assert!(unknown.entries.is_empty());

    // Pagination over the snapshots of a.
    let first = list(csi::ListSnapshotsRequest {
        source_volume_id: a.volume_id.clone(),
        max_entries: 2,
        ..Default::default()
    })
    .await
    .expect("page 1");
    assert_eq!(ids_of(&first), of_a[..2]);
    assert!(!first.next_token.is_empty());
    let second = list(csi::ListSnapshotsRequest {
        source_volume_id: a.volume_id.clone(),
        max_entries: 2,
        starting_token: first.next_token.clone(),
        ..Default::default()
    })
    .await
    .expect("page 2");
    assert_eq!(ids_of(&second), of_a[2..]);
    assert!(second.next_token.is_empty());
    assert_eq!(
        code(
            list(csi::ListSnapshotsRequest {
                starting_token: "bogus".to_owned(),
                ..Default::default()
            })
            .await
        ),
        Code::Aborted
    );
    assert_eq!(
        code(
            list(csi::ListSnapshotsRequest {
                max_entries: -3,
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );

    let got = c
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: b_snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.snapshot, Some(b_snap.clone()));
    assert_eq!(
        code(
            c.get_snapshot(csi::GetSnapshotRequest {
                snapshot_id: "nope".to_owned(),
                ..Default::default()
            })
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(c.get_snapshot(csi::GetSnapshotRequest::default()).await),
        Code::InvalidArgument
    );

    let del = |id: &str| csi::DeleteSnapshotRequest {
        snapshot_id: id.to_owned(),
        ..Default::default()
    };
    c.delete_snapshot(del(&b_snap.snapshot_id))
        .await
        .expect("delete");
    c.delete_snapshot(del(&b_snap.snapshot_id))
        .await
        .expect("delete again");
    assert!(!snapshot_path(&state, &b_snap.snapshot_id).exists());
    assert_eq!(
        code(c.delete_snapshot(del("")).await),
        Code::InvalidArgument
    );
    assert_eq!(backend_snapshots(&state).expect("records").len(), 3);
    server.stop().await.expect("clean stop");
}
