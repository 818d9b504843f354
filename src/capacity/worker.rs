//! The workers' I/O: a pair's `GetCapacity` and its object's create or
//! update, and the sweep's deletions, each from the diff
//! [`decide::reconcile`](super::decide::reconcile) makes. A deletion of an
//! object whose pair the caches no longer want is confirmed first by one
//! live read ([`decide::obsolete_because`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::projection::{CSINode, CSIStorageCapacity, Node, Projection, StorageClass};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::reflector::ObjectRef;

use super::decide::{self, Action, DeleteReason, Live, LiveRead, Pair, Reported};
use super::{Cached, Capacity, Key, lock, remember};

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
        let cached = self.cached();
        let wanted = cached.wanted(&self.wants);
        let mut first_error = None;
        // The live reads of this sweep, shared by the objects they confirm.
        let mut reads: HashMap<LiveRead, Live> = HashMap::new();
        for action in self.actions(&wanted) {
            match action {
                Action::Delete { name, reason } => {
                    if reason == DeleteReason::NotWanted {
                        match self.still_obsolete(&cached, &name, &mut reads).await {
                            Ok(true) => {}
                            Ok(false) => continue,
                            Err(e) => {
                                first_error.get_or_insert(e);
                                continue;
                            }
                        }
                    }
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

    /// Whether the object `name`, whose pair the caches do not want, is
    /// still not wanted once what that rests on is read live
    /// ([`decide::obsolete_because`], at most one read per sweep for each
    /// fact, kept in `reads`). `false` also when the object is gone.
    async fn still_obsolete(
        &self,
        cached: &Cached,
        name: &str,
        reads: &mut HashMap<LiveRead, Live>,
    ) -> Result<bool, SyncError> {
        let Some(pair) = lock(&self.objects)
            .get(name)
            .and_then(|object| decide::pair_of(object))
        else {
            return Ok(false);
        };
        let (classes, nodes, csi_nodes) = cached.refs();
        let read = decide::obsolete_because(&self.wants, &pair, &classes, &nodes, &csi_nodes);
        if !reads.contains_key(&read) {
            let live = self.read_live(&read).await?;
            reads.insert(read.clone(), live);
        }
        let live = &reads[&read];
        let obsolete =
            decide::still_obsolete(&self.wants, &pair, &classes, &nodes, &csi_nodes, live);
        if !obsolete {
            tracing::info!(csistoragecapacity = %name, %pair, ?read, "not deleting CSIStorageCapacity: the caches no longer want its class and segment, the live read does (a watch event has not arrived yet)");
        }
        Ok(obsolete)
    }

    /// One live read ([`LiveRead`]).
    async fn read_live(&self, read: &LiveRead) -> Result<Live, SyncError> {
        let client = || self.client.clone();
        let failed = |what: String| move |source| SyncError::Read { what, source };
        Ok(match read {
            LiveRead::Nothing => Live::Nothing,
            LiveRead::Class(name) => Live::Class {
                name: name.clone(),
                class: Api::<StorageClass>::all(client())
                    .get_opt(name)
                    .await
                    .map_err(failed(format!("StorageClass {name}")))?,
            },
            LiveRead::CsiNode(name) => Live::CsiNode {
                name: name.clone(),
                csi_node: Api::<CSINode>::all(client())
                    .get_opt(name)
                    .await
                    .map_err(failed(format!("CSINode {name}")))?,
            },
            LiveRead::Node(name) => Live::Node {
                name: name.clone(),
                node: Api::<Node>::all(client())
                    .get_opt(name)
                    .await
                    .map_err(failed(format!("Node {name}")))?,
            },
            LiveRead::NodesInSegment(segment) => {
                let selector = decide::segment_selector(segment);
                let params = ListParams::default()
                    .labels(&selector)
                    .limit(decide::LIVE_NODES_LIMIT);
                Live::Nodes(
                    Api::<Node>::all(client())
                        .list(&params)
                        .await
                        .map_err(failed(format!("the nodes {selector}")))?
                        .items,
                )
            }
        })
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
    #[error("cannot read {what} to confirm a deletion: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot {verb} CSIStorageCapacity {name}: {source}")]
    Write {
        verb: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}
