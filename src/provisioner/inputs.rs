//! A plan's inputs, gathered once: the claim's data source (a source claim
//! and its PV from the caches, a VolumeSnapshot and its content read live),
//! the Nodes and CSINodes (the caches', or this node's own in node mode;
//! the selected Node read live when no Node is watched), the
//! VolumeAttributesClass and whether a ReferenceGrant allows a
//! cross-namespace source; then [`plan_provision`] decides.
//!
//! Both the claim worker ([`super::claims`]) and the node-deployment owner
//! check ([`super::owner`], which plans with this node selected to ask for
//! capacity) plan through [`plan`], so they cannot drift apart.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::Context;
use crate::api::reference_grant::ReferenceGrant;
use crate::api::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use crate::projection::{
    CSINode, Node, PersistentVolume, PersistentVolumeClaim, StorageClass, VolumeAttributesClass,
};
use crate::provision::namespace_metadata::namespace_parameters;
use crate::provision::reference_grant::{CrossNamespaceSource, is_granted};
use crate::provision::{
    DataSourceKind, DataSourceObjects, DataSourceRef, ProvisionError, ProvisionInputs,
    ProvisionPlan, data_source_ref, plan_provision, selected_node_name,
    volume_attributes_class_name,
};

/// Why no plan was made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The decision refused the claim (or its data source reference).
    #[error(transparent)]
    Refused(#[from] ProvisionError),
    /// The data source could not be read from the API server.
    #[error(transparent)]
    Source(kube::Error),
    /// The selected Node could not be read from the API server.
    #[error(transparent)]
    SelectedNode(kube::Error),
    /// The claim's VolumeAttributesClass could not be read from the API
    /// server (read there only when the classes are not watched).
    #[error(transparent)]
    AttributesClass(kube::Error),
    /// The claim's namespace could not be read from the API server
    /// (`--extra-create-metadata-namespace-labels` / `-annotations`).
    #[error("failed to get namespace {namespace:?} for create metadata: {error}")]
    Namespace {
        namespace: String,
        error: kube::Error,
    },
}

/// Gathers the inputs of `claim`'s plan (provisioned with `class`, on the
/// node its selected-node annotation names) and plans; `decided_volume_name`
/// is the name an operation in flight already has (see
/// [`ProvisionInputs::decided_volume_name`]).
pub(super) async fn plan(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    decided_volume_name: Option<&str>,
) -> Result<ProvisionPlan, PlanError> {
    let source = data_source_ref(claim, &ctx.config)?;
    let fetched = fetch_source(ctx, source.as_ref())
        .await
        .map_err(PlanError::Source)?;
    let selected = selected_node_name(claim);
    let topology = TopologyObjects::read(ctx, selected)
        .with_unwatched_selected_node(ctx, selected)
        .await
        .map_err(PlanError::SelectedNode)?;
    let vac = attributes_class(ctx, claim)
        .await
        .map_err(PlanError::AttributesClass)?;
    let data_source_granted = data_source_granted(ctx, claim, source.as_ref())
        .await
        .map_err(PlanError::Source)?;
    let plan_with = |topology: &TopologyObjects| {
        let nodes = topology.nodes();
        let csi_nodes = topology.csi_nodes();
        let inputs = ProvisionInputs {
            claim,
            class,
            selected_node: topology.selected_node(),
            selected_csi_node: topology.selected_csi_node(),
            nodes: &nodes,
            csi_nodes: &csi_nodes,
            data_source: fetched.objects(),
            data_source_granted,
            volume_attributes_class: vac.as_deref(),
            decided_volume_name,
        };
        plan_provision(&inputs, &ctx.config)
    };
    let planned = match plan_with(&topology) {
        // A reschedule sends the claim back to the scheduler on the word
        // of the Node and CSINode caches, which may not have seen the node
        // the scheduler (with its own, fresher watch) chose: a node that
        // just joined, a driver that just registered there. Asked live
        // before that (two GETs, on this failure only).
        Err(error) if error.wants_reschedule() && topology.selected_from_caches(ctx) => {
            let Some(selected) = selected else {
                return Err(error.into());
            };
            let live = topology
                .with_live_selected_node(ctx, selected)
                .await
                .map_err(PlanError::SelectedNode)?;
            plan_with(&live)?
        }
        planned => planned?,
    };
    if decided_volume_name.is_some() {
        // An operation in flight: its frozen request replaces this one's
        // (namespace metadata included), so the namespace is not read.
        return Ok(planned);
    }
    with_namespace_metadata(ctx, claim, planned).await
}

/// The plan with the claim's namespace's listed labels and annotations
/// added to its parameters ([`crate::provision::namespace_metadata`]): the
/// namespace read live, once per operation (its first plan; a request read
/// back from the journal keeps the values it was frozen with), and only
/// when a key is listed; the Go image's request otherwise.
async fn with_namespace_metadata(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    mut plan: ProvisionPlan,
) -> Result<ProvisionPlan, PlanError> {
    let keys = &ctx.config.namespace_metadata;
    if keys.is_empty() {
        return Ok(plan);
    }
    let name = claim
        .metadata
        .namespace
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let namespace = Api::<Namespace>::all(ctx.client.clone())
        .get(&name)
        .await
        .map_err(|error| PlanError::Namespace {
            namespace: name,
            error,
        })?;
    plan.request.parameters.extend(namespace_parameters(
        keys,
        namespace.metadata.labels.as_ref(),
        namespace.metadata.annotations.as_ref(),
    ));
    Ok(plan)
}

/// The claim's VolumeAttributesClass: the cache's, or, when the classes
/// are not watched (`ProvisionerConfig::volume_attributes_classes_watched`),
/// the API server's, read as the Go image does at each attempt, and only
/// once the driver can take one (the capability is refused first, as
/// there).
async fn attributes_class(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<Option<Arc<VolumeAttributesClass>>, kube::Error> {
    let Some(name) = volume_attributes_class_name(claim, &ctx.config) else {
        return Ok(None);
    };
    if ctx.config.volume_attributes_classes_watched
        && let Some(cached) = ctx
            .caches
            .attributes_classes
            .store()
            .get(&ObjectRef::new(name))
    {
        return Ok(Some(cached));
    }
    if ctx.config.volume_attributes_classes_watched {
        // Not cached: created a moment ago and still on its way, or truly
        // missing. Asked live, as the Go image always does, rather than
        // failing the claim on the cache's word.
        crate::metrics::count_live_read("get volumeattributesclasses");
        return Api::<VolumeAttributesClass>::all(ctx.client.clone())
            .get_opt(name)
            .await
            .map(|class| class.map(Arc::new));
    }
    if !ctx.config.capabilities.modify_volume {
        return Ok(None);
    }
    Api::<VolumeAttributesClass>::all(ctx.client.clone())
        .get(name)
        .await
        .map(|class| Some(Arc::new(class)))
}

/// Whether a ReferenceGrant allows the claim's data source in another
/// namespace (false for a source in the claim's own namespace, which
/// needs none, and when ReferenceGrants cannot be read). Copying data
/// across namespaces exposes it: the grants of the source's namespace are
/// read as they are now (one list of one namespace, only for a
/// cross-namespace source), so that a grant revoked a moment ago, whose
/// deletion the cache has not seen, allows nothing (docs/design.md,
/// "Reading current state").
async fn data_source_granted(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source: Option<&DataSourceRef>,
) -> Result<bool, kube::Error> {
    let Some(source) = source.filter(|s| s.cross_namespace) else {
        return Ok(false);
    };
    if !ctx.config.reference_grants_readable {
        return Ok(false);
    }
    let api_group = claim
        .spec
        .as_ref()
        .and_then(|s| s.data_source_ref.as_ref())
        .and_then(|r| r.api_group.as_deref());
    crate::metrics::count_live_read("list referencegrants");
    let grants = Api::<ReferenceGrant>::namespaced(ctx.client.clone(), &source.namespace)
        .list(&kube::api::ListParams::default())
        .await?
        .items;
    let refs: Vec<&ReferenceGrant> = grants.iter().collect();
    Ok(is_granted(
        &CrossNamespaceSource {
            claim_namespace: claim.metadata.namespace.as_deref().unwrap_or_default(),
            api_group,
            kind: source.kind.kind_name(),
            name: &source.name,
            namespace: &source.namespace,
        },
        &refs,
    ))
}

/// The data source objects, fetched (claims from the cache, snapshots from
/// the API: they are rare and their CRDs may not even be installed).
enum FetchedSource {
    None,
    Claim(
        Option<Arc<PersistentVolumeClaim>>,
        Option<Arc<PersistentVolume>>,
    ),
    Snapshot(Box<(Option<VolumeSnapshot>, Option<VolumeSnapshotContent>)>),
}

impl FetchedSource {
    fn objects(&self) -> Option<DataSourceObjects<'_>> {
        match self {
            FetchedSource::None => None,
            FetchedSource::Claim(claim, volume) => Some(DataSourceObjects::Claim {
                claim: claim.as_deref(),
                volume: volume.as_deref(),
            }),
            FetchedSource::Snapshot(fetched) => Some(DataSourceObjects::Snapshot {
                snapshot: fetched.0.as_ref(),
                content: fetched.1.as_ref(),
            }),
        }
    }
}

async fn fetch_source(
    ctx: &Context,
    source: Option<&DataSourceRef>,
) -> Result<FetchedSource, kube::Error> {
    let Some(source) = source else {
        return Ok(FetchedSource::None);
    };
    match source.kind {
        // Read live, as a restore's snapshot is: the clone copies the
        // source's volume, so the decision rests on the source as it is
        // now, not on caches that may not have seen it deleted, re-created
        // or re-bound (docs/design.md, "Reading current state"). Once per
        // operation: a retry reuses the plan.
        DataSourceKind::Claim => {
            crate::metrics::count_live_read("get persistentvolumeclaims");
            let claims: Api<crate::projection::Wire<PersistentVolumeClaim>> =
                Api::namespaced(ctx.client.clone(), &source.namespace);
            let claim = claims
                .get_opt(&source.name)
                .await?
                .map(|w| Arc::new(w.object));
            let volume_name = claim
                .as_ref()
                .and_then(|c| c.spec.as_ref()?.volume_name.clone())
                .filter(|v| !v.is_empty());
            let volume = match volume_name {
                Some(name) => {
                    crate::metrics::count_live_read("get persistentvolumes");
                    Api::<crate::projection::Wire<PersistentVolume>>::all(ctx.client.clone())
                        .get_opt(&name)
                        .await?
                        .map(|w| Arc::new(w.object))
                }
                None => None,
            };
            Ok(FetchedSource::Claim(claim, volume))
        }
        DataSourceKind::Snapshot => {
            let snapshots: Api<VolumeSnapshot> =
                Api::namespaced(ctx.client.clone(), &source.namespace);
            let snapshot = snapshots.get_opt(&source.name).await?;
            let content_name = snapshot.as_ref().and_then(|s| {
                s.status
                    .as_ref()?
                    .bound_volume_snapshot_content_name
                    .clone()
            });
            let content = match content_name {
                Some(name) => {
                    Api::<VolumeSnapshotContent>::all(ctx.client.clone())
                        .get_opt(&name)
                        .await?
                }
                None => None,
            };
            Ok(FetchedSource::Snapshot(Box::new((snapshot, content))))
        }
    }
}

/// The Nodes and CSINodes a plan is made with: the caches' (the selected
/// node's and, with topology on, all of them), or in node mode only this
/// node's static objects.
struct TopologyObjects {
    selected_node: Option<Arc<Node>>,
    selected_csi_node: Option<Arc<CSINode>>,
    nodes: Vec<Arc<Node>>,
    csi_nodes: Vec<Arc<CSINode>>,
}

impl TopologyObjects {
    fn read(ctx: &Context, selected: Option<&str>) -> Self {
        if let Some(local) = &ctx.local_topology {
            let node = Arc::new(local.node.clone());
            let csi_node = Arc::new(local.csi_node.clone());
            let is_local = selected == Some(local.name());
            return TopologyObjects {
                selected_node: is_local.then(|| Arc::clone(&node)),
                selected_csi_node: is_local.then(|| Arc::clone(&csi_node)),
                nodes: vec![node],
                csi_nodes: vec![csi_node],
            };
        }
        let topology = ctx.config.topology_enabled;
        TopologyObjects {
            selected_node: selected.and_then(|n| ctx.caches.nodes.store().get(&ObjectRef::new(n))),
            selected_csi_node: selected
                .and_then(|n| ctx.caches.csi_nodes.store().get(&ObjectRef::new(n))),
            nodes: if topology {
                ctx.caches.nodes.store().state()
            } else {
                Vec::new()
            },
            csi_nodes: if topology {
                ctx.caches.csi_nodes.store().state()
            } else {
                Vec::new()
            },
        }
    }

    /// Without CSI topology no Node is watched (upstream's library then
    /// reads the selected node from the API server too): the node the
    /// scheduler chose for a WaitForFirstConsumer claim is asked for live,
    /// once per attempt. It must exist, or the claim is rescheduled. In
    /// node mode the node is this one, whose objects are at hand.
    async fn with_unwatched_selected_node(
        mut self,
        ctx: &Context,
        selected: Option<&str>,
    ) -> Result<Self, kube::Error> {
        if ctx.config.topology_enabled || ctx.local_topology.is_some() {
            return Ok(self);
        }
        let Some(name) = selected.filter(|name| !name.is_empty()) else {
            return Ok(self);
        };
        self.selected_node = Api::<Node>::all(ctx.client.clone())
            .get_opt(name)
            .await?
            .map(Arc::new);
        Ok(self)
    }

    /// Whether the selected Node and CSINode came from the caches (topology
    /// on, not node mode), so that a live read may differ.
    fn selected_from_caches(&self, ctx: &Context) -> bool {
        ctx.config.topology_enabled && ctx.local_topology.is_none()
    }

    /// The same objects with the selected Node and CSINode read live.
    async fn with_live_selected_node(
        &self,
        ctx: &Context,
        selected: &str,
    ) -> Result<TopologyObjects, kube::Error> {
        crate::metrics::count_live_read("get nodes");
        let node = Api::<Node>::all(ctx.client.clone())
            .get_opt(selected)
            .await?
            .map(Arc::new);
        crate::metrics::count_live_read("get csinodes");
        let csi_node = Api::<CSINode>::all(ctx.client.clone())
            .get_opt(selected)
            .await?
            .map(Arc::new);
        tracing::info!(node = %selected, node_found = node.is_some(), csi_node_found = csi_node.is_some(), "re-planning with the selected node read live before a reschedule");
        // The selected node's objects as read, in place of the cached ones
        // (or beside the others, when the cache has none yet): the
        // requisite topology is computed from every node.
        let named = |name: Option<&str>| name == Some(selected);
        let mut nodes: Vec<Arc<Node>> = self
            .nodes
            .iter()
            .filter(|n| !named(n.metadata.name.as_deref()))
            .cloned()
            .collect();
        let mut csi_nodes: Vec<Arc<CSINode>> = self
            .csi_nodes
            .iter()
            .filter(|n| !named(n.metadata.name.as_deref()))
            .cloned()
            .collect();
        if !self.nodes.is_empty() || !self.csi_nodes.is_empty() {
            nodes.extend(node.clone());
            csi_nodes.extend(csi_node.clone());
        }
        Ok(TopologyObjects {
            selected_node: node,
            selected_csi_node: csi_node,
            nodes,
            csi_nodes,
        })
    }

    fn selected_node(&self) -> Option<&Node> {
        self.selected_node.as_deref()
    }

    fn selected_csi_node(&self) -> Option<&CSINode> {
        self.selected_csi_node.as_deref()
    }

    fn nodes(&self) -> Vec<&Node> {
        self.nodes.iter().map(AsRef::as_ref).collect()
    }

    fn csi_nodes(&self) -> Vec<&CSINode> {
        self.csi_nodes.iter().map(AsRef::as_ref).collect()
    }
}
