//! The volume worker: one PV name at a time.
//!
//! - Keeps our finalizer in line with HonorPVReclaimPolicy (docs/design.md,
//!   "Finalizers"): PVs that existed before the sidecar started get it on
//!   the initial list, a rollback (gate off) removes it.
//! - Deletes the backend volume of a Released PV with policy Delete, then the
//!   PV object, then drops the finalizer. A crash between these steps only
//!   repeats idempotent steps: `DeleteVolume` of a missing volume is `OK`
//!   (the CSI spec; a driver that answers `NOT_FOUND` is retried instead,
//!   see `Driver::delete_volume`),
//!   deleting a PV that has a deletion timestamp changes nothing, and
//!   removing the finalizer uses a JSON patch that tests the list first.

use std::sync::Arc;

use crate::projection::{PersistentVolume, Shared};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;

use super::slo::{self, timed_driver_call};
use super::{Context, DeletedVolume};
use crate::provision::events as notes;
use crate::provision::{
    DeleteDecision, FinalizerChange, add_finalizer_patch, plan_delete, pv_finalizer_change,
    remove_finalizer_patch, should_delete, volume_on_this_node,
};
use crate::wellknown as wk;

/// Processes one PV name; schedules its own retries.
pub async fn process(ctx: &Arc<Context>, name: &str) {
    match reconcile(ctx, name).await {
        Ok(()) => ctx.volumes.forget(&name.to_owned()),
        Err(Retry::Backoff) => {
            ctx.volumes.add_rate_limited(name.to_owned());
        }
    }
}

enum Retry {
    Backoff,
}

async fn reconcile(ctx: &Context, name: &str) -> Result<(), Retry> {
    let Some(pv) = ctx.caches.volumes.store().get(&ObjectRef::new(name)) else {
        return Ok(());
    };
    if !volume_on_this_node(&pv, &ctx.config) {
        tracing::debug!(volume = %name, "not on this node: left to the node that holds it");
        return Ok(());
    }
    let api: Api<crate::projection::Wire<PersistentVolume>> = Api::all(ctx.client.clone());

    if let Some(change) = pv_finalizer_change(&pv, &ctx.config) {
        let resource_version = pv.metadata.resource_version.as_deref().unwrap_or_default();
        let uid = pv.uid().unwrap_or_default();
        if ctx.finalizer_writes.written(&uid, resource_version) {
            // Patched from this very state: the cache has not seen our
            // write yet, and its update event queues the PV again.
            tracing::debug!(volume = %name, "finalizer already changed; the cache has not seen it yet");
            return Ok(());
        }
        let (patch, what) = match change {
            FinalizerChange::Add => (
                add_finalizer_patch(
                    pv.metadata.finalizers.as_deref(),
                    wk::FINALIZER_PV,
                    resource_version,
                ),
                "add the finalizer",
            ),
            FinalizerChange::Remove => (
                remove_finalizer_patch(pv.finalizers(), wk::FINALIZER_PV),
                "remove the finalizer",
            ),
        };
        if let Some(patch) = patch {
            apply_json_patch(ctx, &api, &pv, guard_uid(patch, &uid), what).await?;
            ctx.finalizer_writes.wrote(&uid, resource_version);
            return Ok(());
        }
    }

    if should_delete(&pv, &ctx.config) != DeleteDecision::Delete {
        return Ok(());
    }
    let uid = pv.uid().unwrap_or_default();
    let already_deleted = ctx
        .deleted_volumes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&uid)
        .copied();
    if already_deleted.is_none() && !still_cached(ctx, name, &uid) {
        // Gone since this worker read it: its deletion is complete.
        return Ok(());
    }
    if already_deleted.is_none() {
        // The release arrived on the PV watch, possibly behind an
        // administrator's change of the reclaim policy (Delete → Retain)
        // made a moment later: the decision to delete data is made on the
        // PV as it is now, one GET (docs/design.md, "Reading current
        // state").
        let pv = match live_volume(&api, name, &uid).await? {
            Some(live) => live,
            None => {
                tracing::info!(volume = %name, "the PV is gone or was replaced since the cache saw it; nothing to delete");
                return Ok(());
            }
        };
        if let DeleteDecision::Skip(reason) = should_delete(&pv, &ctx.config) {
            tracing::info!(volume = %name, ?reason, "the PV changed since the cache saw it: not deleting the volume");
            return Ok(());
        }
        let class_name = pv
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        if let Some(attachments) = &ctx.attachments {
            let revision = pv
                .metadata
                .resource_version
                .as_deref()
                .and_then(|rv| rv.parse().ok());
            match attachments
                .attached_node(&ctx.caches.attachments, name, revision)
                .await
            {
                Ok(None) => {}
                Ok(Some(node)) => {
                    // Upstream #1574: a failed delete as upstream reports it
                    // (Warning VolumeFailedDelete, counted), retried with
                    // backoff; the event once per transition, not per retry.
                    crate::metrics::delete_failed(&class_name);
                    ctx.recorder
                        .record_note(&*pv, &notes::delete_waiting_for_detach(name, &node))
                        .await;
                    return Err(Retry::Backoff);
                }
                Err(e) => {
                    tracing::warn!(volume = %name, error = %e, "cannot tell whether the volume is still attached (listing VolumeAttachments failed); not deleting it yet");
                    return Err(Retry::Backoff);
                }
            }
        }
        let started = std::time::Instant::now();
        let class = ctx.caches.classes.store().get(&ObjectRef::new(&class_name));
        let plan = match plan_delete(&pv, class.as_deref()) {
            Ok(plan) => plan,
            Err(e) => {
                crate::metrics::delete_failed(&class_name);
                ctx.recorder
                    .record_note(&*pv, &notes::delete_failed(&e.to_string()))
                    .await;
                return Err(Retry::Backoff);
            }
        };
        let secrets = match &plan.secret {
            Some(secret) => match ctx.secret_data(secret).await {
                Ok(data) => data,
                // Gone (its namespace was deleted with the claim) or not
                // readable: delete without credentials, as upstream does
                // ("the secret may have already been deleted"); waiting
                // would keep the PV and leak the volume for ever.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => {
                    tracing::warn!(volume = %name, secret = %format!("{}/{}", secret.namespace, secret.name), error = %s.message, "deletion secret not available; calling DeleteVolume without credentials");
                    Default::default()
                }
                Err(e) => {
                    crate::metrics::delete_failed(&class_name);
                    let message = format!(
                        "failed to get secret {}/{}: {e}",
                        secret.namespace, secret.name
                    );
                    ctx.recorder
                        .record_note(&*pv, &notes::delete_failed(&message))
                        .await;
                    return Err(Retry::Backoff);
                }
            },
            None => Default::default(),
        };
        tracing::info!(volume = %name, volume_id = %plan.volume_id, "calling DeleteVolume");
        if let Err(e) = timed_driver_call(
            &class_name,
            "DeleteVolume",
            ctx.driver
                .delete_volume(&plan.volume_id, secrets, plan.is_migrated()),
        )
        .await
        {
            let text = crate::csi::grpc_error_text(&e.status);
            crate::metrics::delete_failed(&class_name);
            tracing::warn!(volume = %name, error = %text, "DeleteVolume failed");
            ctx.recorder
                .record_note(&*pv, &notes::delete_failed(&text))
                .await;
            return Err(Retry::Backoff);
        }
        {
            let mut deleted = ctx
                .deleted_volumes
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // The PV may have gone while DeleteVolume ran (this worker read
            // it just before its deletion event); remembered then, its uid
            // would never be forgotten. The deletion handler takes this lock
            // after the store dropped the PV, so checking under it is exact.
            if still_cached(ctx, name, &uid) {
                deleted.insert(uid.clone(), DeletedVolume::default());
            }
            crate::metrics::set_remembered("deleted_volumes", deleted.len());
        }
        crate::metrics::delete_succeeded(&class_name, started.elapsed());
        // Once per volume: `deleted_volumes` keeps later passes from here.
        if let Some(since_released) =
            slo::age(slo::released_at(&pv), k8s_openapi::jiff::Timestamp::now())
        {
            crate::metrics::volume_deleted(&class_name, since_released);
        }
        ctx.volume_events.changed(&pv);
        tracing::info!(volume = %name, "backend volume deleted");
    }

    // Delete the PV object, only the one we looked at.
    if pv.metadata.deletion_timestamp.is_none() {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            // The uid precondition failed when the name belongs to a new PV
            // now: ours is gone, and the new one's finalizer is not ours to
            // touch (docs/design.md, hazard 11). A 409 can also be a plain conflict
            // (found by the chaos harness): then ours is still there, and
            // giving up would leave it Released for ever with its volume
            // gone. Fresh state tells which.
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(name).await {
                Ok(Some(current)) if current.uid().as_deref() == Some(uid.as_str()) => {
                    tracing::warn!(volume = %name, error = %s.message, "deleting the PV conflicted; retrying");
                    return Err(Retry::Backoff);
                }
                Ok(_) => {
                    tracing::info!(volume = %name, "the PV was replaced by another of the same name; nothing left to do");
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(volume = %name, error = %e, "deleting the PV conflicted and reading it failed");
                    return Err(Retry::Backoff);
                }
            },
            Err(e) => {
                tracing::warn!(volume = %name, error = %e, "deleting the PV failed");
                return Err(Retry::Backoff);
            }
        }
    }
    if already_deleted.is_some_and(|d| d.finalizer_removed) {
        tracing::debug!(volume = %name, "finalizer already removed; the cache has not seen it yet");
        return Ok(());
    }
    if let Some(patch) = finalizer_removal_patch(pv.finalizers(), &uid) {
        apply_json_patch(ctx, &api, &pv, patch, "remove the finalizer").await?;
        if let Some(deleted) = ctx
            .deleted_volumes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&uid)
        {
            deleted.finalizer_removed = true;
        }
    }
    Ok(())
}

/// The PV `name` as the API server has it now, if it is still the one with
/// `uid`; `None` when it is gone or another PV took the name.
async fn live_volume(
    api: &Api<crate::projection::Wire<PersistentVolume>>,
    name: &str,
    uid: &str,
) -> Result<Option<Arc<PersistentVolume>>, Retry> {
    crate::metrics::count_live_read("get persistentvolumes");
    match api.get_opt(name).await {
        Ok(Some(live)) if live.object.uid().as_deref() == Some(uid) => {
            Ok(Some(Arc::new(live.object)))
        }
        Ok(_) => Ok(None),
        Err(e) => {
            tracing::warn!(volume = %name, error = %e, "reading the PV before deleting its volume failed");
            Err(Retry::Backoff)
        }
    }
}

/// Whether the cache still holds the PV `name` with `uid`.
fn still_cached(ctx: &Context, name: &str, uid: &str) -> bool {
    ctx.caches
        .volumes
        .store()
        .get(&ObjectRef::new(name))
        .is_some_and(|pv| pv.uid().as_deref() == Some(uid))
}

/// The JSON patch that removes our finalizer from the PV with `uid` (and
/// from no other PV of the same name); `None` when it is not there.
pub fn finalizer_removal_patch(finalizers: &[Shared], uid: &str) -> Option<serde_json::Value> {
    remove_finalizer_patch(finalizers, wk::FINALIZER_PV).map(|patch| guard_uid(patch, uid))
}

/// Makes a JSON patch apply only to the PV with `uid`: a PV deleted and
/// re-created under the same name meanwhile fails the `test` (422), so a
/// finalizer is never removed from the wrong PV.
fn guard_uid(patch: serde_json::Value, uid: &str) -> serde_json::Value {
    let mut ops = vec![serde_json::json!({"op": "test", "path": "/metadata/uid", "value": uid})];
    if let serde_json::Value::Array(rest) = patch {
        ops.extend(rest);
    }
    serde_json::Value::Array(ops)
}

/// Applies a JSON patch built from the cached object `pv`. Its `test`
/// operations fail (422) when the cache was stale; the update event that
/// made it stale queues the PV again. But a 422 is also the API server
/// refusing a patch whose tests hold (an invalid result): retrying that
/// from the same state can never succeed, so a live read tells the two
/// apart ([`patch_applies`]). NotFound is done.
async fn apply_json_patch(
    ctx: &Context,
    api: &Api<crate::projection::Wire<PersistentVolume>>,
    pv: &PersistentVolume,
    patch: serde_json::Value,
    what: &str,
) -> Result<(), Retry> {
    let name = pv.name_any();
    let name = name.as_str();
    let patch: json_patch::Patch = match serde_json::from_value(patch) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(volume = %name, error = %e, "internal: bad JSON patch to {what}");
            return Err(Retry::Backoff);
        }
    };
    match api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::<()>::Json(patch.clone()),
        )
        .await
    {
        Ok(_) => {
            tracing::debug!(volume = %name, "{what}: done");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 422 => {
            refused_or_stale(ctx, pv, &patch, what, &s.message).await
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            tracing::debug!(volume = %name, "{what}: conflict, waiting for the next event");
            Err(Retry::Backoff)
        }
        Err(e) => {
            tracing::warn!(volume = %name, error = %e, "{what} failed");
            Err(Retry::Backoff)
        }
    }
}

/// After a 422: reads the PV live. When the patch still applies to it, the
/// API server refused the result, not a stale test: a warning, an event
/// and a metric, and no retry until the PV changes (its next event queues
/// it). Otherwise the cache was stale: retried with backoff.
async fn refused_or_stale(
    ctx: &Context,
    pv: &PersistentVolume,
    patch: &json_patch::Patch,
    what: &str,
    message: &str,
) -> Result<(), Retry> {
    let name = pv.name_any();
    // The whole object, not the projection: the patch may test any field.
    let api: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(ctx.client.clone());
    let live = match api.get_opt(&name).await {
        Ok(Some(live)) => live,
        Ok(None) => return Ok(()),
        Err(e) => {
            tracing::warn!(volume = %name, error = %e, "{what}: refused (422), and reading the PV failed");
            return Err(Retry::Backoff);
        }
    };
    let applies = serde_json::to_value(&live).is_ok_and(|live| patch_applies(&live, patch));
    if !applies {
        tracing::debug!(volume = %name, "{what}: cache was stale, waiting for the next event");
        return Err(Retry::Backoff);
    }
    tracing::warn!(volume = %name, error = %message, "{what}: the API server refused the patch although the PV is as it expects; not retrying until the PV changes");
    crate::metrics::count_patch_refused(what);
    ctx.recorder
        .record_note(pv, &notes::finalizer_patch_refused(what, message))
        .await;
    Ok(())
}

/// Whether every operation of `patch` (its tests first) applies to `live`.
pub fn patch_applies(live: &serde_json::Value, patch: &json_patch::Patch) -> bool {
    let mut document = live.clone();
    json_patch::patch(&mut document, patch).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patch(value: serde_json::Value) -> json_patch::Patch {
        serde_json::from_value(value).expect("a JSON patch")
    }

    #[test]
    fn a_patch_applies_only_when_its_tests_hold_on_the_live_object() {
        let live = json!({"metadata": {"uid": "u1", "resourceVersion": "7", "finalizers": ["a", wk::FINALIZER_PV]}});
        let remove = finalizer_removal_patch(&["a".into(), wk::FINALIZER_PV.into()], "u1")
            .map(patch)
            .expect("a removal");
        assert!(
            patch_applies(&live, &remove),
            "tests hold: a refusal is not staleness"
        );
        let other_uid = finalizer_removal_patch(&["a".into(), wk::FINALIZER_PV.into()], "u2")
            .map(patch)
            .expect("a removal");
        assert!(!patch_applies(&live, &other_uid), "another PV of the name");
        let stale_list = finalizer_removal_patch(&[wk::FINALIZER_PV.into()], "u1")
            .map(patch)
            .expect("a removal");
        assert!(!patch_applies(&live, &stale_list), "the list changed");
        let add = add_finalizer_patch::<&str>(None, wk::FINALIZER_PV, "7")
            .map(|p| patch(guard_uid(p, "u1")))
            .expect("an addition");
        let bare = json!({"metadata": {"uid": "u1", "resourceVersion": "7"}});
        assert!(patch_applies(&bare, &add));
        let newer = json!({"metadata": {"uid": "u1", "resourceVersion": "8"}});
        assert!(
            !patch_applies(&newer, &add),
            "written since the cache saw it"
        );
    }
}
