//! The service-level figures of provisioning and deletion, per StorageClass
//! (docs/operations.md, "Metrics" and "Alerts"): how long a claim waited for
//! its PV and a released volume for its deletion (histograms, observed by
//! the workers), what waits now and since when (gauges, computed here at
//! each scrape), and the driver calls timed by class.
//!
//! The gauges are computed from the watch caches at scrape time rather
//! than kept up to date per event: the caches already hold every claim and
//! PV, and one pass over them (a pointer copy and an annotation lookup per
//! object, a few milliseconds at 50 000 claims) once per scrape (every
//! 15-60 s) costs less than a count kept on every event of every claim
//! (the initial list's 50 000 included), and cannot drift from the caches
//! the way a second copy of their state could after a missed event.
//!
//! Only the leader has the loop that registers the probe, so only it
//! reports the gauges; the others' are absent, not 0 (a replica that does
//! not provision does not know what waits). An alert takes `max by
//! (storage_class)` across replicas, which keeps its series (and its
//! `for`) through a change of leader.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::Context;
use crate::csi::CsiError;
use crate::metrics::{Backlog, Backlogs};
use crate::projection::{PersistentVolume, PersistentVolumeClaim};
use crate::provision::{
    DeleteDecision, ProvisionerConfig, claim_class_name, is_annotated_for_us, should_delete,
};

/// Whether `claim` waits for this sidecar to provision it: annotated for
/// our provisioner (or for an in-tree plugin migrated to us), without a
/// volume, not being deleted. A WaitForFirstConsumer claim is annotated
/// only once its pod is scheduled, so one whose pod waits is not counted.
pub fn claim_waits(claim: &PersistentVolumeClaim, config: &ProvisionerConfig) -> bool {
    claim.metadata.deletion_timestamp.is_none()
        && claim
            .spec
            .as_ref()
            .and_then(|spec| spec.volume_name.as_deref())
            .is_none_or(str::is_empty)
        && is_annotated_for_us(claim, config)
}

/// Whether the backend volume of `pv` waits for this sidecar to delete it:
/// the deletion decision says delete (ours, on this node, Released, policy
/// Delete) and the volume is not `known_deleted` (then only the PV object
/// and our finalizer are left, which take no driver call).
pub fn volume_waits(
    pv: &PersistentVolume,
    config: &ProvisionerConfig,
    known_deleted: bool,
) -> bool {
    !known_deleted && should_delete(pv, config) == DeleteDecision::Delete
}

/// When `pv` became Released: its `lastPhaseTransitionTime` while its phase
/// is Released. A PV deleted while bound counts from its release too, not
/// from its deletion timestamp: its volume may not be deleted before, and
/// the time its claim still used it is not a deletion delay.
pub fn released_at(pv: &PersistentVolume) -> Option<&Time> {
    let status = pv.status.as_ref()?;
    (status.phase.as_deref() == Some("Released"))
        .then_some(status.last_phase_transition_time.as_ref())
        .flatten()
}

/// The time from `since` to `now`; zero when `since` is later (the API
/// server's clock ahead of this node's), `None` without a `since`.
pub fn age(since: Option<&Time>, now: Timestamp) -> Option<Duration> {
    let since = since?;
    Some(Duration::try_from(now.duration_since(since.0)).unwrap_or(Duration::ZERO))
}

/// Per class: how many wait and the oldest one's age in seconds (0 for
/// those of unknown age). Every class of `classes` is reported, 0 without
/// any waiting, so that a dashboard shows a class that drained rather than
/// a gap.
pub fn by_class<'a>(
    classes: impl IntoIterator<Item = &'a str>,
    waiting: impl IntoIterator<Item = (String, Option<Duration>)>,
) -> BTreeMap<String, Backlog> {
    let mut backlogs: BTreeMap<String, Backlog> = classes
        .into_iter()
        .map(|class| (class.to_owned(), Backlog::default()))
        .collect();
    for (class, age) in waiting {
        let backlog = backlogs.entry(class).or_default();
        backlog.count += 1;
        if let Some(age) = age {
            backlog.oldest_seconds = backlog.oldest_seconds.max(age.as_secs_f64());
        }
    }
    backlogs
}

impl Context {
    /// What the backlog gauges show now (see the module's doc for why at
    /// scrape time).
    pub fn backlogs(&self) -> Backlogs {
        let now = Timestamp::now();
        let classes = self.caches.classes.store().state();
        let ours: Vec<&str> = classes
            .iter()
            .filter(|class| class.provisioner == self.config.driver_name)
            .filter_map(|class| class.metadata.name.as_deref())
            .collect();
        let claims = self.caches.claims.store().state();
        let claims = by_class(
            ours.iter().copied(),
            claims
                .iter()
                .filter(|claim| claim_waits(claim, &self.config))
                .map(|claim| {
                    (
                        claim_class_name(claim),
                        age(claim.metadata.creation_timestamp.as_ref(), now),
                    )
                }),
        );
        let volumes = self.caches.volumes.store().state();
        // The deletions due first, then the map of volumes known deleted,
        // locked for those few only: the volume workers and the watch's
        // handler take it too.
        let due: Vec<&PersistentVolume> = volumes
            .iter()
            .map(|pv| &**pv)
            .filter(|pv| volume_waits(pv, &self.config, false))
            .collect();
        let waiting: Vec<(String, Option<Duration>)> = {
            let deleted = self
                .deleted_volumes
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            due.into_iter()
                .filter(|pv| {
                    let known_deleted = pv
                        .metadata
                        .uid
                        .as_ref()
                        .is_some_and(|uid| deleted.contains_key(uid));
                    volume_waits(pv, &self.config, known_deleted)
                })
                .map(|pv| (volume_class_name(pv), age(released_at(pv), now)))
                .collect()
        };
        let volumes = by_class(ours.iter().copied(), waiting);
        Backlogs {
            claims,
            volumes,
            journal: self.operations.backlog(tokio::time::Instant::now()),
        }
    }
}

/// The `storage_class` label of a PV's figures.
pub fn volume_class_name(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|spec| spec.storage_class_name.as_deref())
        .unwrap_or_default()
        .to_owned()
}

/// Reports `ctx`'s backlogs at each scrape from now on, for as long as it
/// exists (called once the process leads and the loop starts).
pub fn report_backlogs(ctx: &Arc<Context>) {
    let ctx = Arc::downgrade(ctx);
    crate::metrics::set_backlog_probe(Box::new(move || ctx.upgrade().map(|ctx| ctx.backlogs())));
}

/// A `CreateVolume` or `DeleteVolume` made for a claim or volume of
/// `class_name`, timed into `csi_provisioner_driver_call_seconds`. Dropped
/// before it ends, it observes nothing (as the call's own timing).
pub async fn timed_driver_call<T>(
    class_name: &str,
    method: &'static str,
    call: impl Future<Output = Result<T, CsiError>>,
) -> Result<T, CsiError> {
    let started = std::time::Instant::now();
    let result = call.await;
    let code = match &result {
        Ok(_) => tonic::Code::Ok,
        Err(e) => e.code(),
    };
    crate::metrics::observe_driver_call(class_name, method, code, started.elapsed());
    result
}

#[cfg(test)]
#[path = "slo_tests.rs"]
mod tests;
