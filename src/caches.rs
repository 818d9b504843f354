//! The process's watch caches: one [`Informer`] per resource type, shared by
//! every loop. A kind is watched only when some loop asked for it
//! ([`Caches::want`]) before [`Caches::start`], so a sidecar with the
//! optional loops off never watches Pods or StatefulSets.
//!
//! Claims and volumes are re-announced every [`RESYNC_PERIOD`] (upstream's
//! provisioning library resyncs them every 15 minutes too), so a change
//! missed for any reason is acted on at the latest then.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;

use crate::informer::{Informer, Waiting};
use crate::provision::reference_grant::ReferenceGrant;
use crate::trim::Trim;

/// How often claims and volumes are re-announced to every loop.
pub const RESYNC_PERIOD: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// How every cache lists and watches: one list request per kind, however
/// many objects the cluster holds, as client-go's informers (kube's default
/// pages by 500; at `--kube-api-qps=5` the pages of 8,000 claims and PVs
/// took 3 s of the budget PV creates need at start). The list stays a
/// consistent read: a list from the watch cache (`resourceVersion=0`) may be
/// older than events already seen, and a claim missing from it would be
/// taken for deleted.
pub fn list_watch_config() -> watcher::Config {
    watcher::Config {
        page_size: None,
        ..watcher::Config::default()
    }
}

/// The kinds we can watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Claims,
    Volumes,
    Classes,
    Nodes,
    CsiNodes,
    AttributesClasses,
    Attachments,
    Pods,
    StatefulSets,
    /// Jobs, for the pod/Job PVC provisioner.
    Jobs,
    /// `gateway.networking.k8s.io/v1beta1` ReferenceGrants, watched only
    /// with the `CrossNamespaceVolumeDataSource` gate.
    ReferenceGrants,
}

/// One informer per kind.
pub struct Caches {
    pub claims: Arc<Informer<PersistentVolumeClaim>>,
    pub volumes: Arc<Informer<PersistentVolume>>,
    pub classes: Arc<Informer<StorageClass>>,
    pub nodes: Arc<Informer<Node>>,
    pub csi_nodes: Arc<Informer<CSINode>>,
    pub attributes_classes: Arc<Informer<VolumeAttributesClass>>,
    pub attachments: Arc<Informer<VolumeAttachment>>,
    pub pods: Arc<Informer<Pod>>,
    pub stateful_sets: Arc<Informer<StatefulSet>>,
    pub reference_grants: Arc<Informer<ReferenceGrant>>,
    pub jobs: Arc<Informer<Job>>,
    wanted: Mutex<BTreeSet<Kind>>,
}

impl Default for Caches {
    fn default() -> Self {
        Self::new()
    }
}

impl Caches {
    pub fn new() -> Self {
        Self {
            claims: Arc::new(Informer::new()),
            volumes: Arc::new(Informer::new()),
            classes: Arc::new(Informer::new()),
            nodes: Arc::new(Informer::new()),
            csi_nodes: Arc::new(Informer::new()),
            attributes_classes: Arc::new(Informer::new()),
            attachments: Arc::new(Informer::new()),
            pods: Arc::new(Informer::new()),
            stateful_sets: Arc::new(Informer::new()),
            reference_grants: Arc::new(Informer::new()),
            jobs: Arc::new(Informer::new()),
            wanted: Mutex::default(),
        }
    }

    /// Asks for `kinds` to be watched. Call before [`start`](Self::start).
    pub fn want(&self, kinds: &[Kind]) {
        self.wanted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(kinds.iter().copied());
    }

    pub fn wanted(&self) -> BTreeSet<Kind> {
        self.wanted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Starts one watch per wanted kind.
    pub fn start(&self, client: &Client) {
        // Cluster-wide for both scopes: `Api::all` lists namespaced kinds
        // in every namespace.
        fn spawn<K>(
            informer: &Arc<Informer<K>>,
            client: &Client,
            resync: Option<std::time::Duration>,
        ) where
            K: kube::Resource<DynamicType = ()>
                + Trim
                + Clone
                + serde::de::DeserializeOwned
                + std::fmt::Debug
                + Send
                + Sync
                + 'static,
        {
            let informer = Arc::clone(informer);
            let api: Api<K> = Api::all(client.clone());
            tokio::spawn(async move { informer.run(api, list_watch_config(), resync).await });
        }
        for kind in self.wanted() {
            match kind {
                Kind::Claims => spawn(&self.claims, client, Some(RESYNC_PERIOD)),
                Kind::Volumes => spawn(&self.volumes, client, Some(RESYNC_PERIOD)),
                Kind::Classes => spawn(&self.classes, client, None),
                Kind::Nodes => spawn(&self.nodes, client, None),
                Kind::CsiNodes => spawn(&self.csi_nodes, client, None),
                Kind::AttributesClasses => spawn(&self.attributes_classes, client, None),
                Kind::Attachments => spawn(&self.attachments, client, None),
                Kind::Pods => spawn(&self.pods, client, None),
                Kind::StatefulSets => spawn(&self.stateful_sets, client, None),
                Kind::ReferenceGrants => spawn(&self.reference_grants, client, None),
                Kind::Jobs => spawn(&self.jobs, client, None),
            }
        }
    }

    /// The wanted kinds whose cache is not filled yet, with why (for
    /// `/readyz`); empty once every cache is ready.
    pub fn not_ready(&self) -> Vec<(Kind, Waiting)> {
        self.wanted()
            .into_iter()
            .filter_map(|kind| {
                let waiting = match kind {
                    Kind::Claims => self.claims.waiting(),
                    Kind::Volumes => self.volumes.waiting(),
                    Kind::Classes => self.classes.waiting(),
                    Kind::Nodes => self.nodes.waiting(),
                    Kind::CsiNodes => self.csi_nodes.waiting(),
                    Kind::AttributesClasses => self.attributes_classes.waiting(),
                    Kind::Attachments => self.attachments.waiting(),
                    Kind::Pods => self.pods.waiting(),
                    Kind::StatefulSets => self.stateful_sets.waiting(),
                    Kind::ReferenceGrants => self.reference_grants.waiting(),
                    Kind::Jobs => self.jobs.waiting(),
                };
                waiting.map(|w| (kind, w))
            })
            .collect()
    }

    /// Waits until every wanted kind has its initial list.
    pub async fn wait_until_ready(&self) {
        for kind in self.wanted() {
            match kind {
                Kind::Claims => self.claims.wait_until_ready().await,
                Kind::Volumes => self.volumes.wait_until_ready().await,
                Kind::Classes => self.classes.wait_until_ready().await,
                Kind::Nodes => self.nodes.wait_until_ready().await,
                Kind::CsiNodes => self.csi_nodes.wait_until_ready().await,
                Kind::AttributesClasses => self.attributes_classes.wait_until_ready().await,
                Kind::Attachments => self.attachments.wait_until_ready().await,
                Kind::Pods => self.pods.wait_until_ready().await,
                Kind::StatefulSets => self.stateful_sets.wait_until_ready().await,
                Kind::ReferenceGrants => self.reference_grants.wait_until_ready().await,
                Kind::Jobs => self.jobs.wait_until_ready().await,
            }
        }
    }
}
