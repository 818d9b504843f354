//! Snapshots: CreateSnapshot, DeleteSnapshot and ListSnapshots.

use std::collections::HashSet;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1 as csi;
use tonic::Code;

use super::util::{Must, ensure, expect_code, fail, list_all_snapshots, status_text};
use crate::runner::{Check, CheckOutcome, Resource, T, Verdict};

pub const CREATE_NO_NAME: &str =
    "CreateSnapshot [Controller Server] should fail when no name is provided";
pub const CREATE_NO_SOURCE: &str =
    "CreateSnapshot [Controller Server] should fail when no source volume id is provided";
pub const CREATE_PLAIN: &str = "CreateSnapshot [Controller Server] should return appropriate values (no optional values added)";
pub const CREATE_IDEMPOTENT: &str = "CreateSnapshot [Controller Server] should succeed when requesting to create a snapshot with already existing name and same source volume ID";
pub const CREATE_CONFLICT: &str = "CreateSnapshot [Controller Server] should fail when requesting to create a snapshot with already existing name and different source volume ID";
pub const CREATE_MAX_NAME: &str = "CreateSnapshot [Controller Server] should succeed when creating snapshot with maximum-length name";
pub const DELETE_NO_ID: &str =
    "DeleteSnapshot [Controller Server] should fail when no snapshot id is provided";
pub const DELETE_UNKNOWN: &str =
    "DeleteSnapshot [Controller Server] should succeed when an invalid snapshot id is used";
pub const DELETE_PLAIN: &str = "DeleteSnapshot [Controller Server] should return appropriate values (no optional values added)";
pub const LIST_PLAIN: &str =
    "ListSnapshots [Controller Server] should return appropriate values (no optional values added)";
pub const LIST_BY_ID: &str = "ListSnapshots [Controller Server] should return snapshots that match the specified snapshot id";
pub const LIST_BY_ID_MISSING: &str = "ListSnapshots [Controller Server] should return empty when the specified snapshot id does not exist";
pub const LIST_BY_SOURCE: &str = "ListSnapshots [Controller Server] should return snapshots that match the specified source volume id";
pub const LIST_BY_SOURCE_MISSING: &str = "ListSnapshots [Controller Server] should return empty when the specified source volume id does not exist";
pub const LIST_PRESENCE: &str =
    "ListSnapshots [Controller Server] check the presence of new snapshots in the snapshot list";
pub const LIST_PAGES: &str = "ListSnapshots [Controller Server] should return next token when a limited number of entries are requested";
pub const LIST_BAD_TOKEN: &str =
    "ListSnapshots [Controller Server] should fail when an invalid starting_token is passed";

pub fn checks() -> Vec<Check> {
    vec![
        check!(CREATE_NO_NAME, create_no_name),
        check!(CREATE_NO_SOURCE, create_no_source),
        check!(CREATE_PLAIN, create_plain),
        check!(CREATE_IDEMPOTENT, create_idempotent),
        check!(CREATE_CONFLICT, create_conflict),
        check!(CREATE_MAX_NAME, create_max_name),
        check!(DELETE_NO_ID, delete_no_id),
        check!(DELETE_UNKNOWN, delete_unknown),
        check!(DELETE_PLAIN, delete_plain),
        check!(LIST_PLAIN, list_plain),
        check!(LIST_BY_ID, list_by_id),
        check!(LIST_BY_ID_MISSING, list_by_id_missing),
        check!(LIST_BY_SOURCE, list_by_source),
        check!(LIST_BY_SOURCE_MISSING, list_by_source_missing),
        check!(LIST_PRESENCE, list_presence),
        check!(LIST_PAGES, list_pages),
        check!(LIST_BAD_TOKEN, list_bad_token),
    ]
}

fn require_snapshots(t: &T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteSnapshot)?;
    t.require_controller_cap(Rpc::CreateDeleteVolume)
}

fn require_list(t: &T) -> CheckOutcome {
    t.require_controller_cap(Rpc::ListSnapshots)
}

/// Registers a snapshot a negative test created by mistake.
fn register_created(
    t: &T,
    res: &Result<tonic::Response<csi::CreateSnapshotResponse>, tonic::Status>,
) {
    if let Ok(resp) = res
        && let Some(s) = &resp.get_ref().snapshot
        && !s.snapshot_id.is_empty()
    {
        t.register(Resource::Snapshot(s.snapshot_id.clone()));
    }
}

async fn create_no_name(t: T) -> CheckOutcome {
    require_snapshots(&t)?;
    let vol = t.new_volume("snap-noname-src").await?;
    let req = t.snapshot_request("", &vol.volume_id);
    let res = t.ctrl().create_snapshot(req).await;
    register_created(&t, &res);
    expect_code(res, "CreateSnapshot without a name", Code::InvalidArgument)
}

async fn create_no_source(t: T) -> CheckOutcome {
    require_snapshots(&t)?;
    let req = t.snapshot_request(&t.unique_name("snap-nosource"), "");
    let res = t.ctrl().create_snapshot(req).await;
    register_created(&t, &res);
    expect_code(
        res,
        "CreateSnapshot without a source volume id",
        Code::InvalidArgument,
    )
}

async fn create_plain(t: T) -> CheckOutcome {
    require_snapshots(&t)?;
    let vol = t.new_volume("snap-src").await?;
    // create_snapshot checks the REQUIRED fields of the response.
    t.create_snapshot(t.snapshot_request(&t.unique_name("snap"), &vol.volume_id))
        .await?;
    Ok(())
}

async fn create_idempotent(t: T) -> CheckOutcome {
    require_snapshots(&t)?;
    let vol = t.new_volume("snap-twice-src").await?;
    let req = t.snapshot_request(&t.unique_name("snap-twice"), &vol.volume_id);
    let first = t.create_snapshot(req.clone()).await?;
    let second = t.create_snapshot(req).await?;
    ensure!(
        first.snapshot_id == second.snapshot_id,
        "repeating CreateSnapshot with the same name and source returned a different snapshot: {:?} then {:?}",
        first.snapshot_id,
        second.snapshot_id
    );
    Ok(())
}

async fn create_conflict(t: T) -> CheckOutcome {
    require_snapshots(&t)?;
    let name = t.unique_name("snap-conflict");
    let vol1 = t.new_volume("snap-conflict-src1").await?;
    t.create_snapshot(t.snapshot_request(&name, &vol1.volume_id))
        .await?;
    let vol2 = t.new_volume("snap-conflict-src2").await?;
    let res = t
        .ctrl()
        .create_snapshot(t.snapshot_request(&name, &vol2.volume_id))
        .await;
    register_created(&t, &res);
    expect_code(
        res,
        "CreateSnapshot with an existing name and a different source volume",
        Code::AlreadyExists,
    )
}

async fn create_max_name(t: T) -> CheckOutcome {
    require_snapshots(&t)?;
    let vol = t.new_volume("snap-maxlen-src").await?;
    let mut name = t.unique_name("snap-maxlen");
    name.push('-');
    while name.len() < 128 {
        name.push('x');
    }
    let req = t.snapshot_request(&name, &vol.volume_id);
    let first = t.create_snapshot(req.clone()).await?;
    let second = t.create_snapshot(req).await?;
    ensure!(
        first.snapshot_id == second.snapshot_id,
        "repeating CreateSnapshot with a 128-character name returned {:?} then {:?}",
        first.snapshot_id,
        second.snapshot_id
    );
    Ok(())
}

async fn delete_no_id(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteSnapshot)?;
    let res = t
        .ctrl()
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: String::new(),
            secrets: t.config().secrets.delete_snapshot_secret.clone(),
        })
        .await;
    expect_code(
        res,
        "DeleteSnapshot without a snapshot id",
        Code::InvalidArgument,
    )
}

async fn delete_unknown(t: T) -> CheckOutcome {
    t.require_controller_cap(Rpc::CreateDeleteSnapshot)?;
    let id = format!("sanity-{}-nonexistent-snapshot", t.run_id());
    t.ctrl()
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            secrets: t.config().secrets.delete_snapshot_secret.clone(),
        })
        .await
        .map_err(|s| {
            Verdict::Fail(format!(
                "DeleteSnapshot of unknown snapshot {id:?} returned {}, the spec requires OK",
                status_text(&s)
            ))
        })?;
    Ok(())
}

async fn delete_plain(t: T) -> CheckOutcome {
    require_snapshots(&t)?;
    let (_, snap) = t.new_snapshot("snap-delete").await?;
    t.delete_snapshot(&snap.snapshot_id).await?;
    t.ctrl()
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            secrets: t.config().secrets.delete_snapshot_secret.clone(),
        })
        .await
        .map_err(|s| {
            Verdict::Fail(format!(
                "second DeleteSnapshot of {:?} returned {}, the spec requires OK",
                snap.snapshot_id,
                status_text(&s)
            ))
        })?;
    Ok(())
}

fn verify_listed(s: &csi::Snapshot) -> CheckOutcome {
    ensure!(
        !s.source_volume_id.is_empty(),
        "listed snapshot {:?} has an empty source_volume_id",
        s.snapshot_id
    );
    ensure!(
        s.creation_time.is_some(),
        "listed snapshot {:?} has no creation_time",
        s.snapshot_id
    );
    Ok(())
}

async fn list_plain(t: T) -> CheckOutcome {
    require_list(&t)?;
    let snaps = list_all_snapshots(&t, csi::ListSnapshotsRequest::default()).await?;
    let mut seen = HashSet::new();
    for s in &snaps {
        verify_listed(s)?;
        ensure!(
            seen.insert(&s.snapshot_id),
            "ListSnapshots returned snapshot {:?} more than once",
            s.snapshot_id
        );
    }
    Ok(())
}

async fn list_by_id(t: T) -> CheckOutcome {
    require_list(&t)?;
    require_snapshots(&t)?;
    t.new_snapshot("list-unrelated").await?;
    let (_, target) = t.new_snapshot("list-target").await?;
    let snaps = list_all_snapshots(
        &t,
        csi::ListSnapshotsRequest {
            snapshot_id: target.snapshot_id.clone(),
            ..Default::default()
        },
    )
    .await?;
    ensure!(
        snaps.len() == 1,
        "ListSnapshots by snapshot id {:?} returned {} snapshots, want exactly 1",
        target.snapshot_id,
        snaps.len()
    );
    ensure!(
        snaps[0].snapshot_id == target.snapshot_id,
        "ListSnapshots by snapshot id {:?} returned snapshot {:?}",
        target.snapshot_id,
        snaps[0].snapshot_id
    );
    verify_listed(&snaps[0])
}

async fn list_by_id_missing(t: T) -> CheckOutcome {
    require_list(&t)?;
    let id = format!("sanity-{}-nonexistent-snapshot", t.run_id());
    let resp = t
        .ctrl()
        .list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: id.clone(),
            secrets: t.config().secrets.list_snapshots_secret.clone(),
            ..Default::default()
        })
        .await
        .must("ListSnapshots by a nonexistent snapshot id")?;
    ensure!(
        resp.entries.is_empty(),
        "ListSnapshots by nonexistent snapshot id {id:?} returned {} entries",
        resp.entries.len()
    );
    Ok(())
}

async fn list_by_source(t: T) -> CheckOutcome {
    require_list(&t)?;
    require_snapshots(&t)?;
    t.new_snapshot("list-src-unrelated").await?;
    let (vol, target) = t.new_snapshot("list-src-target").await?;
    let snaps = list_all_snapshots(
        &t,
        csi::ListSnapshotsRequest {
            source_volume_id: vol.volume_id.clone(),
            ..Default::default()
        },
    )
    .await?;
    for s in &snaps {
        ensure!(
            s.source_volume_id == vol.volume_id,
            "ListSnapshots by source volume {:?} returned snapshot {:?} of volume {:?}",
            vol.volume_id,
            s.snapshot_id,
            s.source_volume_id
        );
        verify_listed(s)?;
    }
    ensure!(
        snaps.len() == 1 && snaps[0].snapshot_id == target.snapshot_id,
        "ListSnapshots by source volume {:?} returned {:?}, want exactly [{:?}]",
        vol.volume_id,
        snaps.iter().map(|s| &s.snapshot_id).collect::<Vec<_>>(),
        target.snapshot_id
    );
    Ok(())
}

async fn list_by_source_missing(t: T) -> CheckOutcome {
    require_list(&t)?;
    let id = format!("sanity-{}-nonexistent-volume", t.run_id());
    let resp = t
        .ctrl()
        .list_snapshots(csi::ListSnapshotsRequest {
            source_volume_id: id.clone(),
            secrets: t.config().secrets.list_snapshots_secret.clone(),
            ..Default::default()
        })
        .await
        .must("ListSnapshots by a nonexistent source volume")?;
    ensure!(
        resp.entries.is_empty(),
        "ListSnapshots by nonexistent source volume {id:?} returned {} entries",
        resp.entries.len()
    );
    Ok(())
}

async fn list_presence(t: T) -> CheckOutcome {
    require_list(&t)?;
    require_snapshots(&t)?;
    let (_, snap) = t.new_snapshot("list-presence").await?;
    let listed = list_all_snapshots(&t, csi::ListSnapshotsRequest::default()).await?;
    ensure!(
        listed.iter().any(|s| s.snapshot_id == snap.snapshot_id),
        "new snapshot {:?} is missing from ListSnapshots",
        snap.snapshot_id
    );
    t.delete_snapshot(&snap.snapshot_id).await?;
    let listed = list_all_snapshots(&t, csi::ListSnapshotsRequest::default()).await?;
    ensure!(
        !listed.iter().any(|s| s.snapshot_id == snap.snapshot_id),
        "deleted snapshot {:?} is still listed by ListSnapshots",
        snap.snapshot_id
    );
    Ok(())
}

async fn list_pages(t: T) -> CheckOutcome {
    require_list(&t)?;
    require_snapshots(&t)?;
    const MAX_ENTRIES: i32 = 2;
    let vol = t.new_volume("list-pages-src").await?;
    let mut ours = Vec::new();
    for _ in 0..3 {
        let name = t.unique_name("list-pages");
        ours.push(t.ready_snapshot(&name, &vol.volume_id).await?.snapshot_id);
    }
    let first = t
        .ctrl()
        .list_snapshots(csi::ListSnapshotsRequest {
            max_entries: MAX_ENTRIES,
            secrets: t.config().secrets.list_snapshots_secret.clone(),
            ..Default::default()
        })
        .await
        .must("ListSnapshots")?;
    ensure!(
        first.entries.len() <= MAX_ENTRIES as usize,
        "ListSnapshots returned {} entries with max_entries {MAX_ENTRIES}",
        first.entries.len()
    );
    ensure!(
        !first.next_token.is_empty(),
        "ListSnapshots with max_entries {MAX_ENTRIES} returned no next_token although at least 3 snapshots exist"
    );
    let paged = list_all_snapshots(
        &t,
        csi::ListSnapshotsRequest {
            max_entries: MAX_ENTRIES,
            ..Default::default()
        },
    )
    .await?;
    let mut seen = HashSet::new();
    for s in &paged {
        ensure!(
            seen.insert(s.snapshot_id.clone()),
            "snapshot {:?} appeared on more than one page",
            s.snapshot_id
        );
    }
    for id in &ours {
        ensure!(
            seen.contains(id),
            "snapshot {id:?} was not on any page of ListSnapshots with max_entries {MAX_ENTRIES}"
        );
    }
    let all: HashSet<String> = list_all_snapshots(&t, csi::ListSnapshotsRequest::default())
        .await?
        .into_iter()
        .map(|s| s.snapshot_id)
        .collect();
    if all != seen {
        fail!(
            "walking the pages found {} snapshots, an unpaged listing {}",
            seen.len(),
            all.len()
        );
    }
    Ok(())
}

async fn list_bad_token(t: T) -> CheckOutcome {
    require_list(&t)?;
    let res = t
        .ctrl()
        .list_snapshots(csi::ListSnapshotsRequest {
            starting_token: "invalid-token".into(),
            secrets: t.config().secrets.list_snapshots_secret.clone(),
            ..Default::default()
        })
        .await;
    expect_code(
        res,
        "ListSnapshots with starting_token \"invalid-token\"",
        Code::Aborted,
    )
}
