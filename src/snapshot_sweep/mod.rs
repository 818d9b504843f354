//! The sweep of orphaned snapshot source-protection finalizers
//! (`--snapshot-orphan-sweep-interval`, upstream 6.3, on by default every
//! 5 minutes; 0 turns it off).
//!
//! A VolumeSnapshot gets `snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection`
//! while a claim is restored from it; the claim worker removes it after
//! the restore. When that removal cannot happen (the claim was deleted
//! mid-flight, the sidecar crashed between the two, a final error), the
//! snapshot would stay Terminating for ever. Every interval the sweep lists
//! the VolumeSnapshots (one list: the loop is rare and needs no watch) and
//! removes our finalizer from each that no pending claim restores from
//! ([`decide`]), as upstream's `SnapshotFinalizerController` does.
//!
//! This file is the wiring (the timer, start and stop); [`worker`] makes
//! one sweep's API calls.
//!
//! Runs only when the driver can restore snapshots (CREATE_DELETE_SNAPSHOT)
//! and this replica leads; a cluster without the snapshot CRDs, or RBAC
//! that forbids listing them, turns it off with one log line.

pub mod decide;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::api_calls::{ApiCall, call};
use crate::caches::Caches;
use crate::shared::EmbeddedLoop;

pub use worker::SweepError;

/// The API calls of the sweep (see [`crate::api_calls`]): one list of the
/// VolumeSnapshots and, to confirm candidates, of every claim, in pages;
/// merge patches of a snapshot's finalizers.
pub const API_CALLS: &[ApiCall] = &[
    call(
        "snapshot.storage.k8s.io",
        "volumesnapshots",
        &["list", "patch"],
    ),
    call("", "persistentvolumeclaims", &["list"]),
    // A candidate's content, when an operation in flight restores from a
    // snapshot: its handle says whether it is that one.
    call(
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents",
        &["get"],
    ),
];

pub struct Sweep {
    client: Client,
    caches: Arc<Caches>,
    interval: Duration,
    stop: tokio::sync::watch::Sender<bool>,
    /// The restores of this process's provisioning loop.
    restores: Arc<dyn RestoresInFlight>,
}

/// What the sweep must know of the provisioning loop's operations in
/// flight: a restore replayed from the journal (its claim deleted, the
/// volume being made again to be deleted) is no pending claim, yet its
/// `CreateVolume` reads the snapshot (docs/design.md, "Reading current
/// state").
pub trait RestoresInFlight: Send + Sync {
    /// The backend snapshot ids that operations in flight restore from.
    fn snapshot_ids(&self) -> std::collections::BTreeSet<String>;
    /// Held from the check of [`Self::snapshot_ids`] to the end of the
    /// finalizer's removal; the provisioning loop holds it while it adds
    /// the finalizer for an operation in flight.
    fn source_finalizers(&self) -> &tokio::sync::Mutex<()>;
}

impl EmbeddedLoop for Sweep {
    /// Starts the periodic sweep (the first one after one interval, as
    /// upstream's `wait.Until` after the cache sync).
    fn start(self: Arc<Self>) {
        let this = Arc::clone(&self);
        tokio::spawn(async move {
            let mut stop = this.stop.subscribe();
            loop {
                tokio::select! {
                    () = tokio::time::sleep(this.interval) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                match this.sweep_once().await {
                    Ok(removed) if removed > 0 => {
                        tracing::info!(removed, "snapshot finalizer sweep done");
                    }
                    Ok(_) => {}
                    Err(SweepError::Unavailable(why)) => {
                        tracing::info!("snapshot finalizer sweep turned off: {why}");
                        return;
                    }
                    Err(SweepError::Api(e)) => {
                        tracing::warn!(error = %e, "snapshot finalizer sweep failed; will try again next interval");
                    }
                }
            }
        });
    }

    fn shut_down(&self) {
        self.stop.send_replace(true);
    }
}

impl Sweep {
    pub fn new(
        client: Client,
        caches: Arc<Caches>,
        interval: Duration,
        restores: Arc<dyn RestoresInFlight>,
    ) -> Arc<Sweep> {
        Arc::new(Sweep {
            client,
            caches,
            interval,
            stop: tokio::sync::watch::Sender::new(false),
            restores,
        })
    }
}
