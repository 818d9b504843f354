//! The claim worker: one PVC key at a time, never two workers on one key.
//!
//! Crash windows (no backend volume may outlive a crash at any instant;
//! docs/design.md, "Crash windows", has the whole table). Each step that
//! changes the backend is preceded by a write that lets a restarted sidecar
//! find it:
//! 1. Before the journal write: nothing was sent to the driver. A crash
//!    leaves nothing behind.
//! 2. Journal written, `CreateVolume` sent or answered, PV not yet saved:
//!    the restarted sidecar loads the journal entry (claim uid, frozen
//!    request). If the claim still exists, provisioning continues with the
//!    same request (same volume name, so the driver returns the same
//!    volume). If it is gone, [`finish_deleted_claim`] repeats the
//!    `CreateVolume` to learn the volume id and deletes the volume.
//! 3. PV saved, journal entry not yet removed: the restarted sidecar finds
//!    the PV for the entry (in its cache, or live when the claim is gone)
//!    and only removes the entry. The PV itself carries the volume from
//!    then on (and our finalizer). If the claim and its PV are both gone by
//!    then, the entry is treated as in 2: the volume is made again and
//!    deleted (a Retain class's recorded in a Released PV), nothing leaks.
//!
//! The same holds without a crash: an operation with a non-final error
//! stays in flight ([`super::operations`]) and is retried with its frozen request
//! until its outcome is known, whatever happens to the claim.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;

use super::inputs::{self, PlanError};
use super::operations::InFlight;
use super::slo::{self, timed_driver_call};
use super::{ClaimKey, Context, Next};
use crate::api::snapshot::VolumeSnapshot;
use crate::csi::{CsiError, grpc_error_text};
use crate::events::EventNote;
use crate::projection::{PersistentVolumeClaim, Projection, StorageClass};
use crate::provision::claim_metadata::ANN_VOLUME_NAME_TEMPLATE;
use crate::provision::events as notes;
use crate::provision::{
    CLEANUP_FINAL_ANSWERS, ClaimIdentity, CleanupAfterError, CreateVolumeOutcome, DataSourceKind,
    ProvisionDecision, ProvisionPlan, SourceFinalizer, build_pv, classify_create_volume_error,
    cleanup_after_error, may_reschedule, records_same_volume, retained_volume_pv, should_provision,
    skipped_volume_context, topology_outside_requisite, volume_name,
};
use crate::wellknown as wk;

/// Attempts to save a PV within one pass; then the claim is retried with
/// backoff (the volume kept), for as long as it takes.
const SAVE_ATTEMPTS: u32 = 5;

/// Processes one claim key; schedules its own retries.
pub async fn process(ctx: &Arc<Context>, key: &ClaimKey) {
    match provision(ctx, key).await {
        Next::Done => {
            ctx.claims.forget(key);
            ctx.infeasible.forget(&key.uid);
        }
        Next::Retry => {
            let delay = ctx.claims.add_rate_limited(key.clone());
            tracing::debug!(claim = %key, ?delay, "retrying claim");
        }
        Next::RetryAfter(delay) => {
            ctx.claims.add_after(key.clone(), delay);
            tracing::debug!(claim = %key, ?delay, "retrying claim");
        }
    }
}

fn cached_claim(ctx: &Context, key: &ClaimKey) -> Option<Arc<PersistentVolumeClaim>> {
    ctx.caches
        .claims
        .store()
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
        .filter(|c| c.uid().as_deref() == Some(key.uid.as_str()))
}

async fn note(ctx: &Context, claim: &PersistentVolumeClaim, note: EventNote) {
    ctx.recorder.record_note(claim, &note).await;
}

async fn provision(ctx: &Arc<Context>, key: &ClaimKey) -> Next {
    // The upstream duration metric times one attempt, not the claim's age.
    let started = std::time::Instant::now();
    let claim = match cached_claim(ctx, key) {
        Some(claim) => claim,
        None => match claim_behind_the_cache(ctx, key).await {
            Ok(Some(claim)) => claim,
            Ok(None) => return finish_deleted_claim(ctx, key).await,
            Err(e) => {
                tracing::warn!(claim = %key, error = %e, "the claim is not in the cache and reading it failed; will look again");
                return Next::Retry;
            }
        },
    };
    if claim
        .finalizers()
        .iter()
        .any(|f| f == wk::FINALIZER_CLONE_SOURCE)
        && let Err(e) = release_clone_source(ctx, &claim).await
    {
        tracing::warn!(claim = %key, error = %e, "cannot remove the cloning-protection finalizer; will retry");
        return Next::Retry;
    }
    let class_name = crate::provision::claim_class_name(&claim);
    let class = ctx.caches.classes.store().get(&ObjectRef::new(&class_name));

    match should_provision(&claim, class.as_deref(), &ctx.config) {
        ProvisionDecision::Provision => {}
        ProvisionDecision::BecomeOwner => {
            if ctx.operations.get(&key.uid).is_some() {
                // This node started a volume and lost the selected-node
                // annotation meanwhile: clean that volume up before
                // competing for the claim again.
                tracing::info!(claim = %key, "claim no longer assigned to this node while provisioning was in flight; cleaning up");
                if let Next::Retry = finish_deleted_claim(ctx, key).await {
                    return Next::Retry;
                }
            }
            if let Some(class) = class.as_deref() {
                return super::owner::become_owner(ctx, key, class).await;
            }
            tracing::debug!(claim = %key, class = %class_name, "storage class not in the cache yet");
            return Next::Retry;
        }
        ProvisionDecision::Skip(reason) => {
            if ctx.operations.get(&key.uid).is_some() {
                // It stopped being ours (bound elsewhere, annotation changed)
                // while a volume may exist: finish it like a deleted claim;
                // but only when the claim and its class as they are now say
                // so, not the caches, which may lag (docs/design.md,
                // "Reading current state").
                return match skip_confirmed_live(ctx, key, &class_name).await {
                    Ok(LiveSkip::Confirmed(reason)) => {
                        tracing::info!(claim = %key, %reason, "claim no longer ours while provisioning was in flight; cleaning up");
                        finish_deleted_claim(ctx, key).await
                    }
                    Ok(LiveSkip::ClaimGone) => finish_deleted_claim(ctx, key).await,
                    Ok(LiveSkip::ClassMissing(reason)) => {
                        // Upstream answers a missing class with an error
                        // and a retry; a volume may exist for the claim,
                        // which still wants it: keep the operation.
                        tracing::warn!(claim = %key, %reason, "the claim's class is gone while its provisioning is in flight; keeping the operation and retrying");
                        Next::Retry
                    }
                    Ok(LiveSkip::CacheBehind) => {
                        tracing::info!(claim = %key, %reason, "the caches say skip but the claim and its class as they are now do not; waiting for the caches");
                        Next::Retry
                    }
                    Err(e) => {
                        tracing::warn!(claim = %key, error = %e, "cannot read the claim or its class to confirm a skip; will retry");
                        Next::Retry
                    }
                };
            }
            tracing::debug!(claim = %key, %reason, "not provisioning");
            ctx.recorder.forget(&key.uid);
            return if reason.retry_later() {
                Next::Retry
            } else {
                Next::Done
            };
        }
    }
    let Some(class) = class else {
        tracing::debug!(claim = %key, class = %class_name, "storage class not in the cache yet");
        return Next::Retry;
    };
    if let Some(wait) = ctx.infeasible.delay(&key.uid, &class, &claim) {
        tracing::debug!(claim = %key, ?wait, "the last request was infeasible and neither the claim nor its class changed; waiting");
        return Next::RetryAfter(wait);
    }

    let attempt = attempt(ctx, key, &claim, &class, &class_name, started).await;
    // Counted here, once per pass, from how it ended (upstream counts each
    // attempt that failed, and each success with its duration).
    match &attempt {
        Attempt::Provisioned { took } => {
            crate::metrics::provision_succeeded(&class_name, source_kind(&claim), *took);
            // Once per claim: a pass reaches here only by saving the PV,
            // and a later pass finds it saved (`Attempt::Uncounted`).
            if let Some(since_created) = slo::age(
                claim.metadata.creation_timestamp.as_ref(),
                k8s_openapi::jiff::Timestamp::now(),
            ) {
                crate::metrics::claim_provisioned(&class_name, since_created);
            }
        }
        Attempt::Failed(_) => crate::metrics::provision_failed(&class_name, source_kind(&claim)),
        Attempt::Uncounted(_) => {}
    }
    attempt.next()
}

/// A claim the cache does not hold (or holds with another uid). With no
/// `CreateVolume` sent for it there is nothing to lose: `None`, the caller
/// finishes it as deleted. With one sent, cleaning up deletes the volume,
/// so the claim is read live first: a claim the cache does not have yet
/// (a fresh leader's replay, a claim the claims filter dropped while its
/// class was not cached) is provisioned from its live state instead.
async fn claim_behind_the_cache(
    ctx: &Context,
    key: &ClaimKey,
) -> Result<Option<Arc<PersistentVolumeClaim>>, kube::Error> {
    if !ctx
        .operations
        .get(&key.uid)
        .is_some_and(|op| op.create_sent)
    {
        return Ok(None);
    }
    Ok(live_claim(ctx, key).await?.map(|claim| {
        tracing::info!(claim = %key, "the claim of an operation in flight is not in the cache but exists: going on from its live state");
        Arc::new(claim)
    }))
}

/// The claim `key` as the API server has it now (`None`: gone, or another
/// claim of the same name).
async fn live_claim(
    ctx: &Context,
    key: &ClaimKey,
) -> Result<Option<PersistentVolumeClaim>, kube::Error> {
    crate::metrics::count_live_read("get persistentvolumeclaims");
    let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
        Api::namespaced(ctx.client.clone(), &key.namespace);
    Ok(api
        .get_opt(&key.name)
        .await?
        .map(|wire| wire.object)
        .filter(|claim| claim.uid().as_deref() == Some(key.uid.as_str())))
}

/// What the claim and its class as they are now say of a skip the caches
/// decided for a claim with an operation in flight.
enum LiveSkip {
    /// Still skipped, for this reason: the operation is finished as for a
    /// deleted claim.
    Confirmed(crate::provision::SkipReason),
    /// The claim is gone.
    ClaimGone,
    /// The class is missing: kept and retried (upstream's error).
    ClassMissing(crate::provision::SkipReason),
    /// Not skipped any more: a cache was behind.
    CacheBehind,
}

async fn skip_confirmed_live(
    ctx: &Context,
    key: &ClaimKey,
    class_name: &str,
) -> Result<LiveSkip, kube::Error> {
    let Some(claim) = live_claim(ctx, key).await? else {
        return Ok(LiveSkip::ClaimGone);
    };
    // The class the claim names now (it may have changed with the claim).
    let class_name = match crate::provision::claim_class_name(&claim) {
        name if name.is_empty() => class_name.to_owned(),
        name => name,
    };
    let class = if class_name.is_empty() {
        None
    } else {
        crate::metrics::count_live_read("get storageclasses");
        Api::<StorageClass>::all(ctx.client.clone())
            .get_opt(&class_name)
            .await?
    };
    Ok(
        match should_provision(&claim, class.as_ref(), &ctx.config) {
            ProvisionDecision::Skip(
                reason @ crate::provision::SkipReason::StorageClassNotFound { .. },
            ) => LiveSkip::ClassMissing(reason),
            ProvisionDecision::Skip(reason) => LiveSkip::Confirmed(reason),
            ProvisionDecision::Provision | ProvisionDecision::BecomeOwner => LiveSkip::CacheBehind,
        },
    )
}

/// How a pass that got as far as the volume's name ended, as the
/// provisioning metrics count it.
enum Attempt {
    /// The PV is saved; `took` since the pass began.
    Provisioned { took: std::time::Duration },
    /// Planning, `CreateVolume` or the PV failed.
    Failed(Next),
    /// Nothing the metrics count: done already, or waiting for an input,
    /// the journal, a Secret or the source's finalizer.
    Uncounted(Next),
}

impl Attempt {
    fn next(self) -> Next {
        match self {
            Attempt::Provisioned { .. } => Next::Done,
            Attempt::Failed(next) | Attempt::Uncounted(next) => next,
        }
    }
}

/// Plan (once per operation), journal, `CreateVolume`, PV.
async fn attempt(
    ctx: &Arc<Context>,
    key: &ClaimKey,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    class_name: &str,
    started: std::time::Instant,
) -> Attempt {
    // Already provisioned: the PV of the name decided for the claim, the
    // journalled one while an operation is in flight (a class's name
    // template may have changed since), else the default one.
    let decided_name = ctx
        .operations
        .get(&key.uid)
        .map(|op| op.frozen.request.name);
    let pv_name = match &decided_name {
        Some(name) => name.clone(),
        None => match volume_name(
            &ctx.config.volume_name_prefix,
            &key.uid,
            ctx.config.volume_name_uuid_length,
        ) {
            Ok(name) => name,
            Err(e) => {
                tracing::warn!(claim = %key, error = %e, "cannot name the volume");
                note(ctx, claim, notes::provisioning_failed(&e.to_string())).await;
                return Attempt::Uncounted(Next::Retry);
            }
        },
    };
    if let Some(pv) = saved_pv(ctx, key, class, &pv_name, decided_name.is_some()) {
        tracing::debug!(claim = %key, volume = %pv, "PV already exists");
        finish_operation(ctx, &key.namespace, &key.uid);
        return Attempt::Uncounted(Next::Done);
    }

    // A retry in this process reuses the first attempt's plan, whose
    // request is the frozen one.
    let planned = ctx
        .operations
        .get(&key.uid)
        .and_then(|op| op.plan.clone().map(|plan| (plan, op)));
    let (plan, in_flight) = match planned {
        Some(planned) => planned,
        None => match plan_and_record(ctx, key, claim, class, decided_name.as_deref()).await {
            Ok(planned) => planned,
            Err(attempt) => return attempt,
        },
    };

    note(
        ctx,
        claim,
        notes::provisioning_started(&key.namespace, &key.name),
    )
    .await;

    if let Some(finalizer) = &plan.source_finalizer
        && let Err(e) = {
            // With the operation in flight (recorded above) and under the
            // lock the snapshot sweep takes (`Operations::source_finalizers`).
            let _guard = ctx.operations.lock_source_finalizers().await;
            add_source_finalizer(ctx, finalizer).await
        }
    {
        tracing::warn!(claim = %key, error = %e, "cannot protect the data source");
        return Attempt::Uncounted(Next::Retry);
    }

    let mut request = in_flight.frozen.request.clone();
    if let Some(secret) = &in_flight.frozen.secret {
        match ctx.secret_data(secret).await {
            Ok(data) => request.secrets = data,
            Err(e) => {
                let message = notes::secret_error(
                    &secret.namespace,
                    &secret.name,
                    &notes::kube_error_text(&e),
                );
                note(ctx, claim, notes::provisioning_failed(&message)).await;
                return Attempt::Uncounted(Next::Retry);
            }
        }
    }

    if !in_flight.create_sent {
        ctx.operations.update(&key.uid, |op| op.create_sent = true);
    }
    tracing::info!(claim = %key, volume = %plan.volume_name, "calling CreateVolume");
    let response = match timed_driver_call(
        class_name,
        "CreateVolume",
        ctx.driver
            .create_volume(request.clone(), plan.is_migrated()),
    )
    .await
    {
        Ok(response) => response,
        Err(e) => return Attempt::Failed(create_failed(ctx, claim, class_name, &plan, e).await),
    };

    let pv = match build_pv(&plan, &response, &ctx.config) {
        Ok(pv) => pv,
        Err(e) => {
            // The driver answered with something we cannot record: delete
            // what it created, then try again from scratch.
            note(ctx, claim, notes::provisioning_failed(&e.to_string())).await;
            if let Some(id) = e.volume_to_delete(&response)
                && let Err(del) = timed_driver_call(
                    class_name,
                    "DeleteVolume",
                    ctx.driver
                        .delete_volume(id, request.secrets.clone(), plan.is_migrated()),
                )
                .await
            {
                tracing::error!(claim = %key, volume_id = id, error = %del, "cannot delete an unusable volume; will retry");
                return Attempt::Failed(Next::Retry);
            }
            finish_operation(ctx, &key.namespace, &key.uid);
            return Attempt::Failed(Next::Retry);
        }
    };

    match save_pv(ctx, key, &pv).await {
        SaveOutcome::Saved => {
            // Before any further await: a pass that follows finds it saved.
            ctx.saved_volumes.saved(&pv.name_any(), &key.uid);
            let took = started.elapsed();
            tracing::info!(claim = %key, volume = %plan.volume_name, "provisioned");
            ctx.volume_events
                .changed(&crate::projection::PersistentVolume::project(&pv));
            note(ctx, claim, notes::provisioning_succeeded(&plan.volume_name)).await;
            finish_operation(ctx, &key.namespace, &key.uid);
            if let Some(warning) = topology_outside_requisite(&plan, &response, &ctx.config) {
                tracing::warn!(claim = %key, volume = %plan.volume_name, "{warning}");
            }
            for skipped in skipped_volume_context(&plan, &response) {
                let warning = notes::volume_context_skipped(&key.namespace, &key.name, &skipped);
                tracing::warn!(claim = %key, volume = %plan.volume_name, "{}", warning.message);
                note(ctx, claim, warning).await;
            }
            // Another clone of the same source still in flight keeps the
            // source protected; its own success removes the finalizer.
            if let Some(finalizer) = plan
                .source_finalizer
                .as_ref()
                .filter(|f| f.remove_after_provisioning)
                && !ctx
                    .operations
                    .source_in_use(&plan.request.volume_content_source)
                && let Err(e) = remove_source_finalizer(ctx, finalizer).await
            {
                tracing::warn!(claim = %key, error = %e, "cannot remove the data source finalizer");
            }
            Attempt::Provisioned { took }
        }
        SaveOutcome::Failed(reason) => {
            // The PV may exist after all (created, answer lost): the volume
            // must not be deleted (docs/design.md, hazard 2). The operation stays in
            // flight and journalled; the retry repeats the same CreateVolume
            // (same volume) and the save, for ever, as upstream does.
            tracing::warn!(claim = %key, volume = %plan.volume_name, error = %reason, "saving the PV failed; will retry (the volume is kept)");
            note(
                ctx,
                claim,
                notes::pv_save_failed(&key.namespace, &key.name, &reason),
            )
            .await;
            Attempt::Failed(Next::Retry)
        }
        SaveOutcome::Orphan(reason) => {
            // A PV of that name records another claim or volume: ours can
            // never be recorded under it, so delete it (upstream #1469).
            let volume_id = response
                .volume
                .as_ref()
                .map(|v| v.volume_id.clone())
                .unwrap_or_default();
            note(
                ctx,
                claim,
                notes::pv_save_failed(&key.namespace, &key.name, &reason),
            )
            .await;
            match timed_driver_call(
                class_name,
                "DeleteVolume",
                ctx.driver
                    .delete_volume(&volume_id, request.secrets, plan.is_migrated()),
            )
            .await
            {
                Ok(()) => finish_operation(ctx, &key.namespace, &key.uid),
                Err(e) => {
                    note(
                        ctx,
                        claim,
                        notes::pv_save_cleanup_failed(&plan.volume_name, &e.to_string()),
                    )
                    .await;
                }
            }
            Attempt::Failed(Next::Retry)
        }
    }
}

/// The name of the claim's saved PV, if the cache has one: the PV named
/// `name` that records the claim. With no name decided yet, the gate
/// `ClaimMetadataPropagation` on and a class with a name template, the PV
/// may have been named from the template as it was (it may have changed
/// since): any PV of ours recording the claim counts. Only then is the
/// cache scanned, so that every new claim of other classes costs one
/// lookup, not a pass over every PV.
fn saved_pv(
    ctx: &Context,
    key: &ClaimKey,
    class: &StorageClass,
    name: &str,
    decided: bool,
) -> Option<String> {
    let volumes = ctx.caches.volumes.store();
    let records_claim =
        |pv: &crate::projection::PersistentVolume| claim_uid_of(pv) == Some(key.uid.as_str());
    if volumes
        .get(&ObjectRef::new(name))
        .is_some_and(|pv| records_claim(&pv))
        || ctx.saved_volumes.records(name, &key.uid)
    {
        return Some(name.to_owned());
    }
    let templated = class
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANN_VOLUME_NAME_TEMPLATE));
    if decided || !ctx.config.claim_metadata_propagation || !templated {
        return None;
    }
    volumes
        .find(|pv| records_claim(pv))
        .map(|pv| pv.name_any())
        .or_else(|| ctx.saved_volumes.saved_for(&key.uid))
}

/// Plans from the inputs ([`inputs::plan`]) and records a new operation
/// before any `CreateVolume`; an operation read back from the journal keeps
/// its recorded request and name (`decided_name`). The plan stays with the
/// operation for this process's retries.
async fn plan_and_record(
    ctx: &Arc<Context>,
    key: &ClaimKey,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    decided_name: Option<&str>,
) -> Result<(Arc<ProvisionPlan>, InFlight), Attempt> {
    let mut plan = match inputs::plan(ctx, claim, class, decided_name).await {
        Ok(plan) => plan,
        Err(PlanError::Refused(e)) => return Err(plan_failed(ctx, claim, &e).await),
        Err(PlanError::Source(e)) => {
            tracing::warn!(claim = %key, error = %e, "cannot read the data source");
            return Err(Attempt::Uncounted(Next::Retry));
        }
        Err(PlanError::SelectedNode(e)) => {
            tracing::warn!(claim = %key, error = %e, "cannot read the selected node");
            let message = format!("failed to get target node: {}", notes::kube_error_text(&e));
            note(ctx, claim, notes::provisioning_failed(&message)).await;
            return Err(Attempt::Uncounted(Next::Retry));
        }
        // The Go image's words: the API server's, as they are.
        Err(PlanError::AttributesClass(e)) => {
            tracing::warn!(claim = %key, error = %e, "cannot read the VolumeAttributesClass");
            let message = notes::kube_error_text(&e);
            note(ctx, claim, notes::provisioning_failed(&message)).await;
            return Err(Attempt::Uncounted(Next::Retry));
        }
        // The wording of the upstream request (docs/operations.md, opt-ins).
        Err(PlanError::Namespace { namespace, error }) => {
            tracing::warn!(claim = %key, error = %error, "cannot read the claim's namespace");
            let message = format!(
                "failed to get namespace {namespace:?} for create metadata: {}",
                notes::kube_error_text(&error)
            );
            note(ctx, claim, notes::provisioning_failed(&message)).await;
            return Err(Attempt::Uncounted(Next::Retry));
        }
    };
    // Read back from the journal: a retry sends exactly the request of the
    // first attempt, so the plan takes the recorded one.
    if let Some(op) = ctx.operations.get(&key.uid) {
        plan.request = op.frozen.request.clone();
        // The PV takes the journalled name too (the one the plan was given
        // when the operation was in flight before the plan began).
        plan.volume_name = op.frozen.request.name.clone();
        let plan = Arc::new(plan);
        return ctx
            .operations
            .update(&key.uid, |op| op.plan = Some(Arc::clone(&plan)))
            .map(|op| (plan, op))
            .ok_or(Attempt::Uncounted(Next::Retry));
    }
    let plan = Arc::new(plan);
    match ctx.operations.record(key, Arc::clone(&plan)).await {
        Ok(op) => Ok((plan, op)),
        Err(e) => {
            tracing::warn!(claim = %key, error = %e, "cannot record the operation in the journal; not calling CreateVolume yet");
            if let super::journal::JournalError::Rejected { rejection, .. } = &e {
                note(ctx, claim, notes::journal_refused(&rejection.to_string())).await;
            }
            Err(Attempt::Uncounted(Next::Retry))
        }
    }
}

/// The `source` label of the provisioning metrics: the kind of the claim's
/// `dataSource`, empty without one (as the upstream library).
fn source_kind(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.data_source.as_ref())
        .map_or("", |d| d.kind.as_str())
}

/// The claim this claim clones from (same namespace), if it is a clone.
pub fn clone_source_name(claim: &PersistentVolumeClaim) -> Option<String> {
    let spec = claim.spec.as_ref()?;
    let is_claim = |kind: &str, group: Option<&String>| {
        kind == wk::PVC_KIND && group.is_none_or(|g| g.is_empty())
    };
    if let Some(source) = &spec.data_source_ref
        && is_claim(&source.kind, source.api_group.as_ref())
        && source
            .namespace
            .as_deref()
            .is_none_or(|ns| Some(ns) == claim.metadata.namespace.as_deref())
    {
        return Some(source.name.clone());
    }
    spec.data_source
        .as_ref()
        .filter(|source| is_claim(&source.kind, source.api_group.as_ref()))
        .map(|source| source.name.clone())
}

/// Ends the operation of claim `uid` in `namespace` here and in the
/// journal. One that cloned a claim kept its source protected: every claim
/// of the namespace that still carries the cloning protection is queued, so
/// that its own pass looks again, however the operation ended (PV saved,
/// final error, found saved after a restart, cleaned up after the claim
/// went). Queued only on the success path before, a source whose clone was
/// finished by a restarted sidecar kept the finalizer until its next event
/// (tests/cancellation.rs, clone dropped after poll 3, then restarted).
fn finish_operation(ctx: &Context, namespace: &str, uid: &str) {
    let Some(finished) = ctx.operations.finish(uid) else {
        return;
    };
    if !is_clone(&finished.frozen.request.volume_content_source) {
        return;
    }
    for claim in ctx.caches.claims.store().state() {
        if claim.namespace().as_deref() == Some(namespace)
            && claim
                .finalizers()
                .iter()
                .any(|f| f == wk::FINALIZER_CLONE_SOURCE)
            && let Some(key) = ClaimKey::of(&claim)
        {
            ctx.claims.add(key);
        }
    }
}

/// Whether a request clones a volume (rather than restoring a snapshot).
fn is_clone(source: &Option<csi_proto::v1::VolumeContentSource>) -> bool {
    matches!(
        source.as_ref().and_then(|s| s.r#type.as_ref()),
        Some(csi_proto::v1::volume_content_source::Type::Volume(_))
    )
}

/// Upstream's clone-protection rule: a source keeps the finalizer while any
/// claim of its namespace that clones from it is still unbound and not being
/// deleted, or a clone from it is in flight here; then it is removed.
async fn release_clone_source(
    ctx: &Context,
    source: &PersistentVolumeClaim,
) -> Result<(), kube::Error> {
    let namespace = source.namespace().unwrap_or_default();
    let name = source.name_any();
    let claim_name = format!("{namespace}/{name}");
    // Cheap answers first: a pending clone in the cache, or an operation
    // of this process reading from the source's volume.
    let cached_pending = ctx
        .caches
        .claims
        .store()
        .state()
        .iter()
        .any(|claim| is_pending_clone_of(claim, &namespace, &name));
    let source_volume = match source
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|pv| !pv.is_empty())
    {
        Some(pv) => match ctx.caches.volumes.store().get(&ObjectRef::new(&pv)) {
            Some(cached) => Some((*cached).clone()),
            // Not cached (yet): its volume id decides whether an operation
            // in flight reads from it, so read it.
            None => {
                crate::metrics::count_live_read("get persistentvolumes");
                Api::<crate::projection::Wire<crate::projection::PersistentVolume>>::all(
                    ctx.client.clone(),
                )
                .get_opt(&pv)
                .await?
                .map(|wire| wire.object)
            }
        },
        None => None,
    };
    let source_volume_id = source_volume.and_then(|pv| {
        pv.spec
            .as_ref()?
            .csi
            .as_ref()
            .map(|c| c.volume_handle.clone())
    });
    let in_flight = source_volume_id.is_some_and(|id| {
        ctx.operations
            .source_in_use(&Some(csi_proto::v1::VolumeContentSource {
                r#type: Some(csi_proto::v1::volume_content_source::Type::Volume(
                    csi_proto::v1::volume_content_source::VolumeSource { volume_id: id },
                )),
            }))
    });
    if cached_pending || in_flight {
        tracing::debug!(claim = %claim_name, cached_pending, in_flight, "clone source still protected");
        return Ok(());
    }
    // Removing the finalizer lets a source being deleted go: a clone
    // created a moment ago may not be in the cache yet, so the claims of
    // the namespace are read as they are now (one list of one namespace,
    // only when the finalizer is about to go).
    crate::metrics::count_live_read("list persistentvolumeclaims");
    let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
        Api::namespaced(ctx.client.clone(), &namespace);
    let live = api.list(&kube::api::ListParams::default()).await?;
    if live
        .items
        .iter()
        .any(|claim| is_pending_clone_of(&claim.object, &namespace, &name))
    {
        tracing::debug!(claim = %claim_name, "a clone the cache has not seen yet is pending: the source stays protected");
        return Ok(());
    }
    tracing::info!(claim = %claim_name, "no clone of this claim is pending: removing the cloning-protection finalizer");
    remove_source_finalizer(
        ctx,
        &SourceFinalizer {
            kind: DataSourceKind::Claim,
            namespace,
            name,
            finalizer: wk::FINALIZER_CLONE_SOURCE,
            remove_after_provisioning: false,
            uid: None,
        },
    )
    .await
}

/// Whether `claim` is a clone of the claim `name` in `namespace` that is
/// still to be provisioned (not bound, not being deleted).
pub fn is_pending_clone_of(claim: &PersistentVolumeClaim, namespace: &str, name: &str) -> bool {
    claim.namespace().as_deref() == Some(namespace)
        && clone_source_name(claim).as_deref() == Some(name)
        && claim.metadata.deletion_timestamp.is_none()
        && claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty)
}

pub(super) fn claim_uid_of(pv: &crate::projection::PersistentVolume) -> Option<&str> {
    pv.spec.as_ref()?.claim_ref.as_ref()?.uid.as_deref()
}

async fn plan_failed(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    error: &crate::provision::ProvisionError,
) -> Attempt {
    let claim_name = format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
    if error.is_ignored() {
        tracing::info!(claim = %claim_name, "{error}");
        note(ctx, claim, notes::external_populator()).await;
        return Attempt::Uncounted(Next::Done);
    }
    tracing::warn!(claim = %claim_name, error = %error, reschedule = error.wants_reschedule(), "cannot provision");
    note(ctx, claim, notes::provisioning_failed(&error.to_string())).await;
    if error.wants_reschedule() {
        return Attempt::Failed(match reschedule(ctx, claim).await {
            Ok(()) => Next::Done,
            Err(()) => Next::Retry,
        });
    }
    Attempt::Failed(Next::Retry)
}

async fn create_failed(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class_name: &str,
    plan: &crate::provision::ProvisionPlan,
    error: CsiError,
) -> Next {
    let uid = claim.uid().unwrap_or_default();
    let text = grpc_error_text(&error.status);
    let outcome = classify_create_volume_error(
        error.code(),
        may_reschedule(ctx.config.topology_enabled, plan.selected_node.as_deref()),
    );
    tracing::warn!(claim = %format!("{}/{}", claim.namespace().unwrap_or_default(), claim.name_any()), ?outcome, error = %text, "CreateVolume failed");
    match outcome {
        CreateVolumeOutcome::InBackground => {
            // The volume may still appear: keep the frozen request.
            note(ctx, claim, notes::provisioning_failed(&text)).await;
        }
        CreateVolumeOutcome::Final => {
            note(ctx, claim, notes::provisioning_failed(&text)).await;
            finish_operation(ctx, &claim.namespace().unwrap_or_default(), &uid);
        }
        CreateVolumeOutcome::Infeasible => {
            note(ctx, claim, notes::provisioning_infeasible(&text)).await;
            finish_operation(ctx, &claim.namespace().unwrap_or_default(), &uid);
            let class = ctx.caches.classes.store().get(&ObjectRef::new(class_name));
            ctx.infeasible.mark(&uid, class.as_deref(), claim);
            if class.is_some() {
                return Next::RetryAfter(ctx.infeasible.retry_interval_max());
            }
        }
        CreateVolumeOutcome::Reschedule => {
            note(ctx, claim, notes::provisioning_failed(&text)).await;
            finish_operation(ctx, &claim.namespace().unwrap_or_default(), &uid);
            // Until the annotation is gone the scheduler cannot pick another
            // node: a failed patch is retried (docs/design.md, hazard 7).
            return match reschedule(ctx, claim).await {
                Ok(()) => Next::Done,
                Err(()) => Next::Retry,
            };
        }
    }
    Next::Retry
}

/// Lets the scheduler pick another node: drop the selected-node annotation.
/// A claim that is gone needs nothing.
async fn reschedule(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), ()> {
    let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"annotations": {wk::ANN_SELECTED_NODE: null}}});
    match crate::writes::merge_patch(&api, &claim.name_any(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => {
            tracing::warn!(claim = %claim.name_any(), error = %e, "cannot remove the selected-node annotation; will retry");
            Err(())
        }
    }
}

/// The claim is gone (or no longer ours). If an operation may have created
/// a volume, learn its id by repeating the frozen `CreateVolume` and delete
/// it; otherwise there is nothing to do.
pub(super) async fn finish_deleted_claim(ctx: &Context, key: &ClaimKey) -> Next {
    ctx.recorder.forget(&key.uid);
    ctx.forget_owner_attempts(&key.uid);
    let Some(op) = ctx.operations.get(&key.uid) else {
        return Next::Done;
    };
    if !op.create_sent {
        tracing::info!(claim = %key, volume = %op.frozen.request.name, "no CreateVolume was sent for the claim; nothing to clean up");
        finish_operation(ctx, &key.namespace, &key.uid);
        return Next::Done;
    }
    // Saved as a PV after all: the PV owns the volume now. Asked live: the
    // cache may not have seen a PV whose create just committed.
    match Api::<crate::projection::Wire<crate::projection::PersistentVolume>>::all(
        ctx.client.clone(),
    )
    .get_opt(&op.frozen.request.name)
    .await
    {
        Ok(Some(pv)) if claim_uid_of(&pv.object) == Some(key.uid.as_str()) => {
            tracing::info!(claim = %key, volume = %pv.object.name_any(), "the claim's PV was saved after all; it owns the volume");
            finish_operation(ctx, &key.namespace, &key.uid);
            return Next::Done;
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(claim = %key, error = %e, "cannot tell whether the PV was saved; will look again");
            return Next::Retry;
        }
    }
    // A Retain class keeps its volumes: one that a PV held (deleted since)
    // must not be deleted by a replay (docs/design.md, hazard 10). It is recorded in
    // a Released PV instead (below), so it is neither lost nor leaked; an
    // in-tree (migrated) one has no CSI form to record it in and is only
    // kept, and said so.
    if op.frozen.retain && op.frozen.migrated {
        tracing::warn!(claim = %key, volume = %op.frozen.request.name, "the claim is gone and its class retains volumes: the volume, if it was created, is kept on the backend");
        finish_operation(ctx, &key.namespace, &key.uid);
        return Next::Done;
    }
    let mut request = op.frozen.request.clone();
    if let Some(secret) = &op.frozen.secret {
        match ctx.secret_data(secret).await {
            Ok(data) => request.secrets = data,
            // Gone with the claim's namespace, or not readable: clean up
            // without credentials, as a PV's deletion does (docs/design.md,
            // hazard 3); waiting would keep the volume for ever.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => {
                tracing::warn!(claim = %key, secret = %format!("{}/{}", secret.namespace, secret.name), error = %s.message, "provisioner secret not available; cleaning up without credentials");
            }
            Err(e) => {
                tracing::warn!(claim = %key, error = %e, "cannot read the provisioner secret to clean up; will retry");
                return Next::Retry;
            }
        }
    }
    let secrets = request.secrets.clone();
    match ctx.driver.create_volume(request, op.frozen.migrated).await {
        Ok(response) => {
            let Some(id) = response
                .volume
                .as_ref()
                .map(|v| v.volume_id.clone())
                .filter(|id| !id.is_empty())
            else {
                tracing::warn!(claim = %key, volume = %op.frozen.request.name, "cleanup CreateVolume answered without a volume id; nothing to clean up");
                finish_operation(ctx, &key.namespace, &key.uid);
                return Next::Done;
            };
            if op.frozen.retain {
                return record_retained_volume(ctx, key, &op, &response).await;
            }
            match ctx
                .driver
                .delete_volume(&id, secrets, op.frozen.migrated)
                .await
            {
                Ok(()) => {
                    tracing::info!(claim = %key, volume_id = %id, "deleted the volume of a claim deleted during provisioning");
                    finish_operation(ctx, &key.namespace, &key.uid);
                    Next::Done
                }
                Err(e) => {
                    tracing::warn!(claim = %key, volume_id = %id, error = %e, "cleanup DeleteVolume failed; will retry");
                    Next::Retry
                }
            }
        }
        Err(e) => match cleanup_after_error(e.code(), op.final_cleanup_answers) {
            CleanupAfterError::AskAgain { final_answers }
                if final_answers > op.final_cleanup_answers =>
            {
                tracing::warn!(claim = %key, volume = %op.frozen.request.name, error = %e, answers = final_answers, "cleanup CreateVolume failed; asking again before taking it for no volume");
                ctx.operations
                    .update(&key.uid, |op| op.final_cleanup_answers = final_answers);
                Next::Retry
            }
            CleanupAfterError::AskAgain { .. } => {
                tracing::warn!(claim = %key, volume = %op.frozen.request.name, error = %e, "cleanup CreateVolume failed; will retry");
                Next::Retry
            }
            CleanupAfterError::NoVolume => {
                tracing::info!(claim = %key, volume = %op.frozen.request.name, error = %e, answers = CLEANUP_FINAL_ANSWERS, "cleanup CreateVolume failed for good: no volume to clean up");
                finish_operation(ctx, &key.namespace, &key.uid);
                Next::Done
            }
        },
    }
}

/// Saves the Released PV that records the retained volume of a claim that
/// is gone (see [`retained_volume_pv`]).
async fn record_retained_volume(
    ctx: &Context,
    key: &ClaimKey,
    op: &InFlight,
    response: &csi_proto::v1::CreateVolumeResponse,
) -> Next {
    let Some(volume) = response.volume.as_ref() else {
        finish_operation(ctx, &key.namespace, &key.uid);
        return Next::Done;
    };
    let claim = ClaimIdentity {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        uid: key.uid.clone(),
        resource_version: None,
    };
    let pv = retained_volume_pv(&claim, &op.frozen.request, volume, &ctx.config);
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let save = ctx.operations.save_attempt(&key.uid);
    let saved = match api.create(&PostParams::default(), &pv).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&pv.name_any()).await {
            Ok(Some(existing)) if records_same_volume(&existing, &pv) => true,
            Ok(Some(_)) => {
                tracing::error!(claim = %key, volume = %pv.name_any(), volume_id = %volume.volume_id, "the claim is gone, its class retains volumes, and another PV holds the name: the volume is kept on the backend without a PV");
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(claim = %key, error = %e, "cannot read the PV in the way; will retry");
                false
            }
        },
        Err(e) => {
            tracing::warn!(claim = %key, volume = %pv.name_any(), error = %e, "cannot save the PV of a retained volume; will retry");
            false
        }
    };
    if !saved {
        save.failed();
        return Next::Retry;
    }
    save.saved();
    tracing::info!(claim = %key, volume = %pv.name_any(), volume_id = %volume.volume_id, "the claim went away during provisioning and its class retains volumes: the volume is recorded in a Released PV");
    ctx.volume_events
        .changed(&crate::projection::PersistentVolume::project(&pv));
    finish_operation(ctx, &key.namespace, &key.uid);
    Next::Done
}

enum SaveOutcome {
    Saved,
    /// A PV of that name records another claim or volume.
    Orphan(String),
    Failed(String),
}

/// Saves the PV of the claim `key`'s operation, each attempt measured as
/// the `unsavedpvs` queue's work ([`super::operations::SaveAttempt`]).
async fn save_pv(ctx: &Context, key: &ClaimKey, pv: &PersistentVolume) -> SaveOutcome {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let name = pv.name_any();
    let mut last_error = String::new();
    for attempt in 1..=SAVE_ATTEMPTS {
        let save = ctx.operations.save_attempt(&key.uid);
        match api.create(&PostParams::default(), pv).await {
            Ok(_) => {
                save.saved();
                return SaveOutcome::Saved;
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Saved by an earlier attempt whose answer was lost, or a
                // different PV of the same name (upstream #1469): compare.
                let outcome = match api.get_opt(&name).await {
                    Ok(Some(existing)) if records_same_volume(&existing, pv) => SaveOutcome::Saved,
                    Ok(Some(_)) => SaveOutcome::Orphan(format!(
                        "PersistentVolume {name} already exists for another claim or volume"
                    )),
                    Ok(None) => {
                        save.failed();
                        continue;
                    }
                    Err(e) => SaveOutcome::Failed(e.to_string()),
                };
                match outcome {
                    SaveOutcome::Saved => save.saved(),
                    _ => save.failed(),
                }
                return outcome;
            }
            Err(e) => {
                save.failed();
                last_error = e.to_string();
                tracing::warn!(claim = %key, volume = %name, attempt, error = %e, "saving the PV failed");
                tokio::time::sleep(std::time::Duration::from_millis(200 * u64::from(attempt)))
                    .await;
            }
        }
    }
    SaveOutcome::Failed(last_error)
}

fn finalizer_patch(finalizers: Vec<String>, resource_version: Option<String>) -> serde_json::Value {
    serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}})
}

/// Adds the protection finalizer to a clone source or snapshot, guarded by
/// its resourceVersion so a concurrent change is not overwritten.
async fn add_source_finalizer(
    ctx: &Context,
    finalizer: &SourceFinalizer,
) -> Result<(), kube::Error> {
    edit_source_finalizers(ctx, finalizer, true).await
}

async fn remove_source_finalizer(
    ctx: &Context,
    finalizer: &SourceFinalizer,
) -> Result<(), kube::Error> {
    edit_source_finalizers(ctx, finalizer, false).await
}

/// The error of a data source that cannot be protected: the claim waits.
fn source_unusable(name: &str, why: &str) -> kube::Error {
    kube::Error::Api(Box::new(kube::core::Status::failure(
        &format!("the data source {name} cannot be protected: {why}"),
        "NotFound",
    )))
}

async fn edit_source_finalizers(
    ctx: &Context,
    finalizer: &SourceFinalizer,
    add: bool,
) -> Result<(), kube::Error> {
    async fn edit<K>(api: Api<K>, source: &SourceFinalizer, add: bool) -> Result<(), kube::Error>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let (name, uid, finalizer) = (
            source.name.as_str(),
            source.uid.as_deref(),
            source.finalizer,
        );
        for _ in 0..5 {
            let Some(obj) = api.get_opt(name).await? else {
                // Gone: nothing to remove; but nothing to protect either,
                // and a clone or restore from it must not go on.
                return if add {
                    Err(source_unusable(name, "it does not exist"))
                } else {
                    Ok(())
                };
            };
            if add && uid.is_some_and(|uid| obj.uid().as_deref() != Some(uid)) {
                // Deleted and re-created under the name since the plan read
                // it: its volume or snapshot is not the one planned from.
                return Err(source_unusable(
                    name,
                    "it was replaced by a new object of the same name",
                ));
            }
            let mut finalizers = obj.finalizers().to_vec();
            let present = finalizers.iter().any(|f| f == finalizer);
            if present == add {
                return Ok(());
            }
            if add && kube::Resource::meta(&obj).deletion_timestamp.is_some() {
                // The API server refuses new finalizers on an object being
                // deleted; reading from it now races its deletion.
                return Err(source_unusable(name, "it is being deleted"));
            }
            if add {
                finalizers.push(finalizer.to_owned());
            } else {
                finalizers.retain(|f| f != finalizer);
            }
            let patch = finalizer_patch(finalizers, obj.resource_version());
            match crate::writes::merge_patch(&api, name, &patch).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        // Still conflicting: not done. The caller retries rather than
        // clone or restore from an unprotected source (docs/design.md, hazard 9).
        Err(kube::Error::Api(Box::new(kube::core::Status::failure(
            &format!(
                "the finalizer of {name} could not be changed: it kept changing (5 conflicts)"
            ),
            "Conflict",
        ))))
    }
    match finalizer.kind {
        DataSourceKind::Claim => {
            let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
                Api::namespaced(ctx.client.clone(), &finalizer.namespace);
            edit(api, finalizer, add).await
        }
        DataSourceKind::Snapshot => {
            let api: Api<VolumeSnapshot> =
                Api::namespaced(ctx.client.clone(), &finalizer.namespace);
            edit(api, finalizer, add).await
        }
    }
}
