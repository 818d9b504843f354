//! The workers' I/O: a pair's `GetCapacity` and its object's create or
//! update, and the sweep's deletions, each from the diff
//! [`decide::reconcile`](super::decide::reconcile) makes.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::projection::{CSIStorageCapacity, Projection};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::ObjectRef;

use super::decide::{self, Action, Pair, Reported};
use super::{Capacity, Key, lock, remember};

impl Capacity {
    /// The diff against the current state; updates the object gauges.
    fn actions(&self, wanted: &BTreeSet<Pair>) -> Vec<Action> {
        let objects: Vec<Arc<CSIStorageCapacity>> = lock(&self.objects).values().cloned().collect();
        let refs: Vec<&CSIStorageCapacity> = objects.iter().map(|o| &**o).collect();
        let reported = {
            let mut reported = lock(&self.reported);
            reported.retain(|pair, _| wanted.contains(pair));
            reported.clone()
        };
        let actions = decide::reconcile(&self.publisher, wanted, &refs, &reported);
        let counts = decide::Counts::of(&actions);
        crate::metrics::set_capacity_objects(counts.goal, counts.current, counts.obsolete);
        actions
    }

    /// Writes send and receive the full API type (with its `apiVersion`
    /// and `kind`); what is remembered is the projection, as cached.
    fn api(&self) -> Api<k8s_openapi::api::storage::v1::CSIStorageCapacity> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    pub(super) async fn process(&self, key: &Key) {
        let result = match key {
            Key::Sweep => self.sweep().await,
            Key::Pair(pair) => self.sync_pair(pair).await,
        };
        match result {
            Ok(()) => self.queue.forget(key),
            Err(e) => {
                let delay = self.queue.add_rate_limited(key.clone());
                tracing::warn!(retry_in = ?delay, "{e}");
            }
        }
    }

    async fn sweep(&self) -> Result<(), SyncError> {
        let wanted = self.wanted();
        let mut first_error = None;
        for action in self.actions(&wanted) {
            match action {
                Action::Delete { name, reason } => {
                    tracing::info!(csistoragecapacity = %name, "deleting CSIStorageCapacity: {reason}");
                    if let Err(e) = self.delete(&name).await {
                        first_error.get_or_insert(e);
                    }
                }
                Action::Pending { pair, name } => {
                    tracing::debug!(csistoragecapacity = %name.as_deref().unwrap_or("-"), %pair, "capacity not known yet; polling");
                    let key = Key::Pair(pair);
                    if self.queue.failures(&key) == 0 {
                        self.queue.add(key);
                    }
                }
                // An object missing (deleted by someone) or showing other
                // values (changed by someone) than last reported: the
                // pair's worker polls again and writes. A pair whose poll is
                // backing off after a failure waits for its retry.
                Action::Create { pair, .. } | Action::Update { pair, .. } => {
                    let key = Key::Pair(pair);
                    if self.queue.failures(&key) == 0 {
                        self.queue.add(key);
                    }
                }
                Action::Keep { .. } => {}
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn delete(&self, name: &str) -> Result<(), SyncError> {
        match self.api().delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(SyncError::Write {
                    verb: "delete",
                    name: name.to_owned(),
                    source,
                });
            }
        }
        lock(&self.objects).remove(name);
        Ok(())
    }

    async fn sync_pair(&self, pair: &Pair) -> Result<(), SyncError> {
        let wanted = self.wanted();
        if !wanted.contains(pair) {
            lock(&self.reported).remove(pair);
            tracing::debug!(%pair, "no longer wanted; not polling it");
            return Ok(());
        }
        let Some(class) = self
            .caches
            .classes
            .store()
            .get(&ObjectRef::new(&pair.class))
        else {
            return Ok(());
        };
        let request = decide::capacity_request(&class, &pair.segment);
        let response =
            self.driver
                .get_capacity(request)
                .await
                .map_err(|source| SyncError::GetCapacity {
                    pair: pair.clone(),
                    source,
                })?;
        let reported =
            Reported::from_response(response.available_capacity, response.maximum_volume_size)
                .map_err(|reason| SyncError::BadCapacity {
                    pair: pair.clone(),
                    reason,
                })?;
        tracing::debug!(%pair, available = reported.available, maximum = ?reported.maximum, "GetCapacity answered");
        lock(&self.reported).insert(pair.clone(), reported);
        for action in self.actions(&wanted) {
            if action.pair() != Some(pair) {
                continue;
            }
            match action {
                Action::Create { object, .. } => {
                    let created = self
                        .api()
                        .create(&PostParams::default(), &object.to_object())
                        .await
                        .map_err(|source| SyncError::Write {
                            verb: "create",
                            name: format!("{} for {pair}", decide::GENERATE_NAME),
                            source,
                        })?;
                    let created = CSIStorageCapacity::project(&created);
                    remember(&self.objects, &created);
                    tracing::info!(csistoragecapacity = %created.metadata.name.as_deref().unwrap_or_default(), %pair, capacity = ?created.capacity.as_ref().map(|q| &q.0), maximum_volume_size = ?created.maximum_volume_size.as_ref().map(|q| &q.0), "created CSIStorageCapacity");
                }
                Action::Update { object, .. } => {
                    let name = object.metadata.name.clone().unwrap_or_default();
                    let updated = self
                        .api()
                        .replace(&name, &PostParams::default(), &object.to_object())
                        .await
                        .map_err(|source| SyncError::Write {
                            verb: "update",
                            name: name.clone(),
                            source,
                        })?;
                    let updated = CSIStorageCapacity::project(&updated);
                    remember(&self.objects, &updated);
                    tracing::info!(csistoragecapacity = %name, %pair, capacity = ?updated.capacity.as_ref().map(|q| &q.0), maximum_volume_size = ?updated.maximum_volume_size.as_ref().map(|q| &q.0), "updated CSIStorageCapacity");
                }
                Action::Keep { name, .. } => {
                    tracing::debug!(csistoragecapacity = %name, %pair, "CSIStorageCapacity up to date");
                }
                Action::Pending { .. } | Action::Delete { .. } => {}
            }
        }
        Ok(())
    }
}

/// Why one key failed; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("GetCapacity for {pair} failed: {source}")]
    GetCapacity {
        pair: Pair,
        #[source]
        source: crate::csi::CsiError,
    },
    #[error("GetCapacity for {pair} answered an unusable value: {reason}")]
    BadCapacity { pair: Pair, reason: String },
    #[error("cannot {verb} CSIStorageCapacity {name}: {source}")]
    Write {
        verb: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}
