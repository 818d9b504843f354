//! One sweep's I/O: the live lists of VolumeSnapshots and claims, and the
//! finalizer patches, for the snapshots [`decide`](super::decide) finds
//! orphaned.

use std::collections::BTreeSet;

use kube::api::{Api, ListParams};

use super::{Sweep, decide};
use crate::api::snapshot::VolumeSnapshot;
use crate::projection::PersistentVolumeClaim;
use crate::wellknown as wk;

impl Sweep {
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
