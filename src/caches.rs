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

use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::reference_grant::ReferenceGrant;
use crate::informer::{Informer, Waiting};
use crate::projection::{
    CSINode, Job, Node, PersistentVolume, PersistentVolumeClaim, Pod, StatefulSet, StorageClass,
    VolumeAttachment, VolumeAttributesClass,
};
use crate::provision::{ProvisionerConfig, claim_class_name};
use crate::relevance;

/// How often claims and volumes are re-announced to every loop.
pub const RESYNC_PERIOD: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// How every cache lists and watches: a streaming list (`sendInitialEvents`,
/// served by Kubernetes 1.32 and later), so that the initial list and every
/// re-list arrive object by object. Each object is projected and kept or
/// dropped ([`crate::relevance`]) as it arrives: a re-list of 50,000 objects
/// never holds a whole list response, nor a decoded list of full objects,
/// beside the cache. The stream is a consistent read (the API server waits
/// until its watch cache is as fresh as etcd before it sends the initial
/// events), as a list from etcd is: a list from the watch cache
/// (`resourceVersion=0`) may be older than events already seen, and a claim
/// missing from it would be taken for deleted. An API server that refuses
/// streaming lists gets a list in pages instead ([`crate::informer`]).
pub fn list_watch_config() -> watcher::Config {
    watcher::Config::default().streaming_lists()
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
    /// The claims' filter reads the class cache: list claims only once it
    /// is filled (classes are few: it costs one short list), or every claim
    /// of another driver's class would be kept at start-up. Volumes are
    /// listed meanwhile, not before: at 50,000 of them waiting would double
    /// the time to the first provisioned volume, and the volume is the
    /// evidence of one rare case only ([`crate::relevance`]).
    claims_wait_for_classes: bool,
}

impl Default for Caches {
    fn default() -> Self {
        Self::new()
    }
}

impl Caches {
    pub fn new() -> Self {
        // What one watch learns of the API server's list support, all know.
        let list_mode = Arc::default();
        Self {
            claims: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            volumes: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            classes: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            nodes: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            csi_nodes: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            attributes_classes: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            attachments: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            pods: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            stateful_sets: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            reference_grants: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            jobs: Arc::new(Informer::sharing(Arc::clone(&list_mode))),
            wanted: Mutex::default(),
            claims_wait_for_classes: false,
        }
    }

    /// The caches of a sidecar for `config`'s driver: each keeps only what
    /// some loop can act on ([`crate::relevance`]).
    pub fn for_driver(config: &ProvisionerConfig) -> Self {
        let caches = Self::new();
        {
            let config = config.clone();
            caches
                .volumes
                .keep_only(move |pv| relevance::keep_volume(pv, &config));
        }
        {
            let config = config.clone();
            let classes = caches.classes.store();
            let volumes = caches.volumes.store();
            caches.claims.keep_only(move |claim| {
                let class_name = claim_class_name(claim);
                let class = (!class_name.is_empty())
                    .then(|| classes.get(&ObjectRef::new(&class_name)))
                    .flatten();
                let volume = claim
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.volume_name.as_deref())
                    .filter(|name| !name.is_empty())
                    .and_then(|name| volumes.get(&ObjectRef::new(name)));
                relevance::keep_claim(claim, class.as_deref(), volume.as_deref(), &config)
            });
        }
        {
            let driver = config.driver_name.clone();
            caches
                .attachments
                .keep_only(move |attachment| relevance::keep_attachment(attachment, &driver));
        }
        caches.pods.keep_only(relevance::keep_pod);
        caches.jobs.keep_only(relevance::keep_job);
        Self {
            claims_wait_for_classes: true,
            ..caches
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
        // `W`: the type the API client reads (a projection, or a
        // `Wire` around one with a `Meta`); `K`: what the cache keeps.
        fn spawn<W, K>(
            informer: &Arc<Informer<K>>,
            client: &Client,
            resync: Option<std::time::Duration>,
        ) where
            W: kube::Resource<DynamicType = ()>
                + Clone
                + serde::de::DeserializeOwned
                + std::fmt::Debug
                + Send
                + Sync
                + 'static,
            K: kube::runtime::reflector::Lookup<DynamicType = ()>
                + From<W>
                + Clone
                + Send
                + Sync
                + 'static,
        {
            let informer = Arc::clone(informer);
            let api: Api<W> = Api::all(client.clone());
            tokio::spawn(async move { informer.run(api, list_watch_config(), resync).await });
        }
        use crate::projection::Wire;
        let wanted = self.wanted();
        for kind in wanted.iter().copied() {
            match kind {
                Kind::Claims if self.claims_wait() => {
                    let claims = Arc::clone(&self.claims);
                    let classes = wanted
                        .contains(&Kind::Classes)
                        .then(|| Arc::clone(&self.classes));
                    let client = client.clone();
                    tokio::spawn(async move {
                        if let Some(classes) = classes {
                            classes.wait_until_ready().await;
                        }
                        spawn::<Wire<_>, _>(&claims, &client, Some(RESYNC_PERIOD));
                    });
                }
                Kind::Claims => spawn::<Wire<_>, _>(&self.claims, client, Some(RESYNC_PERIOD)),
                Kind::Volumes => spawn::<Wire<_>, _>(&self.volumes, client, Some(RESYNC_PERIOD)),
                Kind::Classes => spawn::<StorageClass, _>(&self.classes, client, None),
                Kind::Nodes => spawn::<Node, _>(&self.nodes, client, None),
                Kind::CsiNodes => spawn::<CSINode, _>(&self.csi_nodes, client, None),
                Kind::AttributesClasses => {
                    spawn::<VolumeAttributesClass, _>(&self.attributes_classes, client, None)
                }
                Kind::Attachments => spawn::<VolumeAttachment, _>(&self.attachments, client, None),
                Kind::Pods => spawn::<Pod, _>(&self.pods, client, None),
                Kind::StatefulSets => spawn::<StatefulSet, _>(&self.stateful_sets, client, None),
                Kind::ReferenceGrants => {
                    spawn::<ReferenceGrant, _>(&self.reference_grants, client, None)
                }
                Kind::Jobs => spawn::<Job, _>(&self.jobs, client, None),
            }
        }
    }

    fn claims_wait(&self) -> bool {
        self.claims_wait_for_classes
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
