//! The process's watch caches: one [`Informer`] per resource type, shared by
//! every loop. A kind is watched only when some loop asked for it
//! ([`Caches::want`]) before [`Caches::start`], so a sidecar with the
//! optional loops off never watches Pods or StatefulSets.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;

use crate::informer::Informer;

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
        fn spawn<K>(informer: &Arc<Informer<K>>, client: &Client)
        where
            K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
                + Clone
                + serde::de::DeserializeOwned
                + std::fmt::Debug
                + Send
                + Sync
                + 'static,
        {
            let informer = Arc::clone(informer);
            let api: Api<K> = Api::all(client.clone());
            tokio::spawn(async move { informer.run(api, watcher::Config::default(), None).await });
        }
        fn spawn_namespaced<K>(informer: &Arc<Informer<K>>, client: &Client)
        where
            K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
                + Clone
                + serde::de::DeserializeOwned
                + std::fmt::Debug
                + Send
                + Sync
                + 'static,
        {
            let informer = Arc::clone(informer);
            let api: Api<K> = Api::all(client.clone());
            tokio::spawn(async move { informer.run(api, watcher::Config::default(), None).await });
        }
        for kind in self.wanted() {
            match kind {
                Kind::Claims => spawn_namespaced(&self.claims, client),
                Kind::Volumes => spawn(&self.volumes, client),
                Kind::Classes => spawn(&self.classes, client),
                Kind::Nodes => spawn(&self.nodes, client),
                Kind::CsiNodes => spawn(&self.csi_nodes, client),
                Kind::AttributesClasses => spawn(&self.attributes_classes, client),
                Kind::Attachments => spawn(&self.attachments, client),
                Kind::Pods => spawn_namespaced(&self.pods, client),
                Kind::StatefulSets => spawn_namespaced(&self.stateful_sets, client),
            }
        }
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
            }
        }
    }
}
