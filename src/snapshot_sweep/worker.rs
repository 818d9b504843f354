//! One sweep's I/O: the live lists of VolumeSnapshots and claims, and the
//! finalizer patches, for the snapshots [`decide`](super::decide) finds
//! orphaned.

use std::collections::BTreeSet;

use kube::api::{Api, ListParams};

use super::{Sweep, decide};
use crate::api::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
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

    /// Whether an operation in flight of this process restores from
    /// `snapshot`: its content's snapshot handle is one they read. The
    /// content is read only when some operation restores at all.
    async fn restored_in_flight(&self, snapshot: &VolumeSnapshot) -> Result<bool, kube::Error> {
        let in_flight = self.restores.snapshot_ids();
        if in_flight.is_empty() {
            return Ok(false);
        }
        let Some(content) = snapshot
            .status
            .as_ref()
            .and_then(|s| s.bound_volume_snapshot_content_name.as_deref())
        else {
            // Not bound to a content: no restore can have started from it.
            return Ok(false);
        };
        let content = Api::<VolumeSnapshotContent>::all(self.client.clone())
            .get_opt(content)
            .await?;
        Ok(decide::restored_by(content.as_ref(), &in_flight))
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
            // Held to the end of this snapshot's patch (the loop body).
            let _guard = self.restores.source_finalizers().lock().await;
            match self.restored_in_flight(snapshot).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::info!(snapshot = %format!("{namespace}/{name}"), "an operation in flight restores from this snapshot: its source-protection finalizer stays");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(snapshot = %format!("{namespace}/{name}"), error = %e, "cannot tell whether an operation in flight restores from this snapshot; next sweep");
                    continue;
                }
            }
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
