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
//! Runs only when the driver can restore snapshots (CREATE_DELETE_SNAPSHOT)
//! and this replica leads; a cluster without the snapshot CRDs, or RBAC
//! that forbids listing them, turns it off with one log line.

pub mod decide;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::projection::PersistentVolumeClaim;
use kube::Client;
use kube::api::{Api, ListParams};

use crate::api::snapshot::VolumeSnapshot;
use crate::caches::Caches;
use crate::shared::EmbeddedLoop;
use crate::wellknown as wk;

pub struct Sweep {
    client: Client,
    caches: Arc<Caches>,
    interval: Duration,
    stop: tokio::sync::watch::Sender<bool>,
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
    pub fn new(client: Client, caches: Arc<Caches>, interval: Duration) -> Arc<Sweep> {
        Arc::new(Sweep {
            client,
            caches,
            interval,
            stop: tokio::sync::watch::Sender::new(false),
        })
    }

    /// The snapshots that pending claims of any driver restore from, from a
    /// live list of every claim in pages of 500 (only the pairs are kept).
    async fn live_pending(&self) -> Result<BTreeSet<String>, kube::Error> {
        let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
            Api::all(self.client.clone());
        let mut pending = BTreeSet::new();
        let mut params = ListParams::default().limit(500);
        loop {
            let page = api.list(&params).await?;
            pending.extend(decide::pending_snapshots(
                page.items.iter().map(|w| &w.object),
            ));
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(pending),
            }
        }
    }

    /// One sweep; returns how many finalizers it removed.
    pub async fn sweep_once(&self) -> Result<usize, SweepError> {
        let api: Api<VolumeSnapshot> = Api::all(self.client.clone());
        let snapshots = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(SweepError::Unavailable(
                    "the API server does not serve snapshot.storage.k8s.io/v1 VolumeSnapshots"
                        .into(),
                ));
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                return Err(SweepError::Unavailable(format!(
                    "RBAC does not allow listing volumesnapshots ({})",
                    s.message
                )));
            }
            Err(e) => return Err(SweepError::Api(e)),
        };
        let claims = self.caches.claims.store().state();
        let cached_pending = decide::pending_snapshots(claims.iter().map(AsRef::as_ref));
        let candidates: Vec<&VolumeSnapshot> = snapshots
            .iter()
            .filter(|s| decide::is_orphaned(s, &cached_pending))
            .collect();
        tracing::debug!(
            snapshots = snapshots.len(),
            pending = cached_pending.len(),
            candidates = candidates.len(),
            "sweeping snapshot source-protection finalizers"
        );
        if candidates.is_empty() {
            return Ok(0);
        }
        // The finalizer is every provisioner's, but the claim cache holds
        // only this driver's claims (crate::relevance): another driver's
        // claim may still be restoring from a candidate, and removing the
        // finalizer under it would let its snapshot go mid-restore. So the
        // candidates are confirmed against every claim of the cluster, read
        // live page by page (upstream reads its cache of every claim).
        let pending = self.live_pending().await.map_err(SweepError::Api)?;
        let mut removed = 0;
        for snapshot in candidates
            .into_iter()
            .filter(|s| decide::is_orphaned(s, &pending))
        {
            let namespace = snapshot.metadata.namespace.clone().unwrap_or_default();
            let name = snapshot.metadata.name.clone().unwrap_or_default();
            let finalizers: Vec<&String> = snapshot
                .metadata
                .finalizers
                .iter()
                .flatten()
                .filter(|f| *f != wk::FINALIZER_SNAPSHOT_SOURCE)
                .collect();
            let patch = serde_json::json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": snapshot.metadata.resource_version,
            }});
            let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &namespace);
            match crate::writes::merge_patch(&api, &name, &patch).await {
                Ok(_) => {
                    removed += 1;
                    tracing::info!(snapshot = %format!("{namespace}/{name}"), "removed an orphaned source-protection finalizer: no pending claim restores from this snapshot");
                }
                // Changed or gone meanwhile: the next sweep looks again.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    tracing::debug!(snapshot = %format!("{namespace}/{name}"), "snapshot changed or gone while sweeping; next sweep");
                }
                Err(e) => {
                    tracing::warn!(snapshot = %format!("{namespace}/{name}"), error = %e, "cannot remove an orphaned source-protection finalizer");
                }
            }
        }
        Ok(removed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Api(#[from] kube::Error),
}
