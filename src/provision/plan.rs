//! The `CreateVolume` plan for a claim: everything the I/O layer needs to
//! call the driver and, afterwards, to build the PV — computed once, with no
//! I/O, from objects the caller read from its caches.
//!
//! The plan is frozen per claim uid while its operation is in flight: every
//! retry sends `request` unchanged (after filling `secrets` from
//! `provisioner_secret`), so a retried `CreateVolume` can never ask for a
//! different topology or size than the one that may already be running.

use std::collections::{BTreeMap, HashMap};

use crate::projection::Node;
use crate::projection::PersistentVolumeClaim;
use crate::projection::{CSINode, StorageClass, VolumeAttributesClass};
use csi_proto::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use csi_proto::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability};

use super::claim_metadata::{
    CopiedMetadata, NamedClaim, VolumeContextKeys, copied_claim_metadata,
    resolve_parameter_templates, sends_claim_limit, templated_volume_name, volume_context_keys,
};
use super::config::ProvisionerConfig;
use super::content_source::{DataSourceObjects, SourceFinalizer, content_source, data_source_ref};
use super::error::ProvisionError;
use super::quantity::quantity_bytes;
use super::secrets::{SecretKind, SecretRef, TemplateContext, resolve_secret_ref};
use super::topology::{SelectedNodeTopology, TopologyInputs, accessibility_requirements};
use crate::migration::{InTreePlugin, translate_storage_class_to_csi};
use crate::wellknown as wk;

/// The PV and CSI volume name for a claim: `<prefix>-<uid>`, or with a uuid
/// length the uid without dashes truncated to it. Deterministic, so every
/// `CreateVolume` retry for the claim is idempotent.
pub fn volume_name(
    prefix: &str,
    claim_uid: &str,
    uuid_length: Option<usize>,
) -> Result<String, ProvisionError> {
    if prefix.is_empty() {
        return Err(ProvisionError::EmptyVolumeNamePrefix);
    }
    if claim_uid.is_empty() {
        return Err(ProvisionError::MissingClaimUid);
    }
    let Some(length) = uuid_length else {
        return Ok(format!("{prefix}-{claim_uid}"));
    };
    let compact: String = claim_uid.chars().filter(|c| *c != '-').collect();
    // Upstream slices without a check and would panic here.
    let truncated = compact
        .get(..length)
        .ok_or(ProvisionError::UuidLengthTooLong {
            length,
            available: compact.len(),
        })?;
    Ok(format!("{prefix}-{truncated}"))
}

/// The PV and CSI volume name a claim's first plan decides: the class's
/// name template (gate `ClaimMetadataPropagation`), else [`volume_name`].
pub fn decide_volume_name(
    class: &StorageClass,
    claim: &ClaimIdentity,
    config: &ProvisionerConfig,
) -> Result<String, ProvisionError> {
    if claim.uid.is_empty() {
        return Err(ProvisionError::MissingClaimUid);
    }
    if config.claim_metadata_propagation
        && let Some(name) = templated_volume_name(
            class.metadata.annotations.as_ref(),
            NamedClaim {
                namespace: &claim.namespace,
                name: &claim.name,
                uid: &claim.uid,
            },
        )?
    {
        return Ok(name);
    }
    volume_name(
        &config.volume_name_prefix,
        &claim.uid,
        config.volume_name_uuid_length,
    )
}

/// The node the scheduler selected for the claim (GA annotation, else the
/// 1.11 alpha one), ignoring empty values.
pub fn selected_node_name(claim: &PersistentVolumeClaim) -> Option<&str> {
    let annotations = claim.metadata.annotations.as_ref()?;
    [wk::ANN_SELECTED_NODE, wk::ANN_ALPHA_SELECTED_NODE]
        .iter()
        .find_map(|key| annotations.get(key))
        .map(|node| node.as_str())
        .filter(|node| !node.is_empty())
}

/// The claim's class name as Kubernetes resolves it: the beta annotation
/// wins over `spec.storageClassName`.
pub fn claim_class_name(claim: &PersistentVolumeClaim) -> String {
    if let Some(class) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(wk::ANN_BETA_STORAGE_CLASS))
    {
        return class.to_string();
    }
    claim
        .spec
        .as_ref()
        .and_then(|spec| spec.storage_class_name.as_deref())
        .unwrap_or_default()
        .to_owned()
}

/// The VolumeAttributesClass the claim asks for, when the gate is on.
pub fn volume_attributes_class_name<'a>(
    claim: &'a PersistentVolumeClaim,
    config: &ProvisionerConfig,
) -> Option<&'a str> {
    if !config.volume_attributes_class_enabled {
        return None;
    }
    claim
        .spec
        .as_ref()?
        .volume_attributes_class_name
        .as_deref()
        .filter(|name| !name.is_empty())
}

/// The objects a plan is made from, read by the I/O layer from its caches.
#[derive(Clone, Copy, Debug)]
pub struct ProvisionInputs<'a> {
    pub claim: &'a PersistentVolumeClaim,
    pub class: &'a StorageClass,
    /// The Node named by [`selected_node_name`]; `None` if it does not exist.
    pub selected_node: Option<&'a Node>,
    /// Its CSINode; `None` if it does not exist.
    pub selected_csi_node: Option<&'a CSINode>,
    /// All Nodes and CSINodes (only read for topology aggregation).
    pub nodes: &'a [&'a Node],
    pub csi_nodes: &'a [&'a CSINode],
    /// What [`data_source_ref`] named, fetched; `None` when the claim has no source.
    pub data_source: Option<DataSourceObjects<'a>>,
    /// A ReferenceGrant allows the claim's cross-namespace data source.
    pub data_source_granted: bool,
    /// The class named by [`volume_attributes_class_name`]; `None` if missing.
    pub volume_attributes_class: Option<&'a VolumeAttributesClass>,
    /// The name decided for the claim's volume by an earlier plan of its
    /// operation (in flight, or read back from the journal): kept, so a
    /// class whose name template changed meanwhile cannot rename a volume
    /// that may exist. `None`: this plan decides ([`decide_volume_name`]).
    pub decided_volume_name: Option<&'a str>,
}

/// Identity of the claim, for the PV's claimRef.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: Option<String>,
}

/// Secret references the PV's CSI source and annotations carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PvSecretRefs {
    pub controller_publish: Option<SecretRef>,
    pub node_stage: Option<SecretRef>,
    pub node_publish: Option<SecretRef>,
    pub controller_expand: Option<SecretRef>,
    pub node_expand: Option<SecretRef>,
    /// Not on the CSI source: recorded as PV annotations for the external-resizer.
    pub controller_modify: Option<SecretRef>,
}

/// Everything needed to call `CreateVolume` and then build the PV.
#[derive(Clone, Debug, PartialEq)]
pub struct ProvisionPlan {
    /// PV name and CSI volume name.
    pub volume_name: String,
    /// The request to send; `secrets` is empty and must be filled from the
    /// Secret `provisioner_secret` names (also for cleanup `DeleteVolume`s).
    pub request: CreateVolumeRequest,
    pub provisioner_secret: Option<SecretRef>,
    pub pv_secrets: PvSecretRefs,
    /// Put on the source object before `CreateVolume` (clone or restore).
    pub source_finalizer: Option<SourceFinalizer>,
    pub claim: ClaimIdentity,
    /// Resolved fsType ("" = driver default); not used for block volumes.
    pub fs_type: String,
    pub storage_class_name: String,
    /// Class reclaim policy, `Delete` by default.
    pub reclaim_policy: String,
    pub mount_options: Vec<String>,
    pub access_modes: Vec<String>,
    pub volume_mode: Option<String>,
    pub volume_attributes_class_name: Option<String>,
    pub selected_node: Option<String>,
    /// The claim has a data source: the response must report a content source.
    pub has_data_source: bool,
    /// `ClaimMetadataPropagation`: the claim's labels and annotations the
    /// class copies onto the PV (empty with the gate off); never
    /// overwriting the PV's own.
    pub copied_metadata: CopiedMetadata,
    /// `ClaimMetadataPropagation`: the keys of the driver's `volume_context`
    /// the class puts on the PV (empty with the gate off), checked here,
    /// before the volume exists.
    pub volume_context_keys: VolumeContextKeys,
    /// CSI migration: the class names this in-tree plugin, which our driver
    /// took over. The request was planned from the class translated to CSI,
    /// and the PV is written in the plugin's in-tree form.
    pub migrated_from: Option<InTreePlugin>,
}

impl ProvisionPlan {
    pub fn is_block(&self) -> bool {
        self.volume_mode.as_deref() == Some("Block")
    }

    /// A CSI migration operation: upstream labels its metrics `migrated="true"`.
    pub fn is_migrated(&self) -> bool {
        self.migrated_from.is_some()
    }
}

/// The in-tree plugin a class of our driver's claims names, when our driver
/// took that plugin over (upstream translates exactly then: the class's
/// provisioner is `supportsMigrationFromInTreePluginName`).
pub fn migrated_class_plugin(
    class: &StorageClass,
    config: &ProvisionerConfig,
) -> Option<InTreePlugin> {
    InTreePlugin::from_csi_driver(&config.driver_name)
        .filter(|plugin| class.provisioner == plugin.in_tree_name())
}

/// Builds the plan, validating the claim, class and sources as upstream does.
pub fn plan_provision(
    inputs: &ProvisionInputs<'_>,
    config: &ProvisionerConfig,
) -> Result<ProvisionPlan, ProvisionError> {
    let claim = inputs.claim;
    let migrated_from = migrated_class_plugin(inputs.class, config);
    let translated_class;
    let class = match migrated_from {
        Some(plugin) => {
            translated_class = translate_storage_class_to_csi(plugin, inputs.class)
                .map_err(ProvisionError::StorageClassTranslation)?;
            &translated_class
        }
        None => inputs.class,
    };
    let spec = claim.spec.clone().unwrap_or_default();
    let claim_identity = ClaimIdentity {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        resource_version: claim.metadata.resource_version.clone(),
    };

    let source = data_source_ref(claim, config)?;
    let vac_name = volume_attributes_class_name(claim, config);
    if vac_name.is_some() && !config.capabilities.modify_volume {
        return Err(ProvisionError::ModifyVolumeNotSupported);
    }
    if spec.selector.is_some() {
        return Err(ProvisionError::SelectorNotSupported);
    }
    let name = match inputs.decided_volume_name {
        Some(decided) => decided.to_owned(),
        None => decide_volume_name(inputs.class, &claim_identity, config)?,
    };
    let empty = BTreeMap::new();
    let params = class.parameters.as_ref().unwrap_or(&empty);
    let fs_type = fs_type(params, &config.default_fstype)?;

    let resources = spec.resources.as_ref();
    let storage = |list: Option<&crate::projection::Map<_>>| {
        list.and_then(|list| list.get("storage"))
            .map(quantity_bytes)
    };
    let required_bytes = storage(resources.and_then(|r| r.requests.as_ref()))
        .transpose()
        .map_err(ProvisionError::InvalidCapacity)?
        .unwrap_or(0);
    // The Go image sends only the request (limits ignored, upstream #616);
    // a class opts in to the limit under ClaimMetadataPropagation.
    let sends_limit = config.claim_metadata_propagation
        && sends_claim_limit(inputs.class.metadata.annotations.as_ref())?;
    let limit_bytes = if sends_limit {
        storage(resources.and_then(|r| r.limits.as_ref()))
            .transpose()
            .map_err(ProvisionError::InvalidCapacity)?
            .unwrap_or(0)
    } else {
        0
    };
    if limit_bytes != 0 && limit_bytes < required_bytes {
        return Err(ProvisionError::LimitBelowRequest {
            request: required_bytes,
            limit: limit_bytes,
        });
    }

    let is_block = spec.volume_mode.as_deref() == Some("Block");
    let mount_options = class.mount_options.clone().unwrap_or_default();
    let access_modes: Vec<String> = spec
        .access_modes
        .iter()
        .flatten()
        .map(String::from)
        .collect();
    let volume_capabilities =
        volume_capabilities(&access_modes, is_block, &fs_type, &mount_options, config)?;

    let mut request = CreateVolumeRequest {
        name: name.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes,
            limit_bytes,
        }),
        volume_capabilities,
        ..CreateVolumeRequest::default()
    };

    let mut source_finalizer = None;
    if let Some(source) = &source {
        if source.cross_namespace && !inputs.data_source_granted {
            return Err(ProvisionError::CrossNamespaceSourceNotGranted {
                kind: source.kind.kind_name().to_owned(),
                namespace: source.namespace.clone(),
                name: source.name.clone(),
                claim_namespace: claim.namespace().unwrap_or_default(),
                claim_name: claim.metadata.name.clone().unwrap_or_default(),
            });
        }
        let objects = inputs.data_source.ok_or_else(|| {
            ProvisionError::DataSourceObjectsMismatch(source.kind.kind_name().to_owned())
        })?;
        let (content, finalizer) =
            content_source(source, objects, claim, class, required_bytes, config)?;
        request.volume_content_source = Some(content);
        source_finalizer = Some(finalizer);
    }

    let selected_node = selected_node_name(claim);
    if let Some(node) = selected_node
        && inputs.selected_node.is_none()
    {
        return Err(ProvisionError::SelectedNodeNotFound(node.to_owned()));
    }
    if config.topology_enabled {
        let no_terms = Vec::new();
        request.accessibility_requirements = accessibility_requirements(&TopologyInputs {
            driver_name: &config.driver_name,
            pvc_name: &claim_identity.name,
            allowed_topologies: class.allowed_topologies.as_ref().unwrap_or(&no_terms),
            selected_node: selected_node.map(|name| SelectedNodeTopology {
                name,
                node: inputs.selected_node,
                csi_node: inputs.selected_csi_node,
            }),
            nodes: inputs.nodes,
            csi_nodes: inputs.csi_nodes,
            strict_topology: config.strict_topology,
            immediate_topology: config.immediate_topology,
            immediate_per_key_set: config.immediate_topology_per_key_set,
        })?;
    }

    let template_context = TemplateContext {
        pv_name: &name,
        pvc_name: &claim_identity.name,
        pvc_namespace: &claim_identity.namespace,
        pvc_annotations: claim.metadata.annotations.as_ref(),
        pvc_labels: claim.metadata.labels.as_ref(),
    };
    let secret = |kind| resolve_secret_ref(kind, params, &template_context);
    let provisioner_secret = secret(SecretKind::Provisioner)?;
    let pv_secrets = PvSecretRefs {
        controller_publish: secret(SecretKind::ControllerPublish)?,
        node_stage: secret(SecretKind::NodeStage)?,
        node_publish: secret(SecretKind::NodePublish)?,
        controller_expand: secret(SecretKind::ControllerExpand)?,
        node_expand: secret(SecretKind::NodeExpand)?,
        controller_modify: secret(SecretKind::ControllerModify)?,
    };

    // With the gate on, the parameters the class lists are templates,
    // resolved here so that the request frozen (and journalled) for the
    // claim holds the values: retries, restarts and cleanups send them.
    // Keys the sidecar reads itself (fsType, secrets) are never templated,
    // so reading them from the class's own parameters above stays right.
    let class_annotations = inputs.class.metadata.annotations.as_ref();
    let resolved_params;
    let mut copied_metadata = CopiedMetadata::default();
    let mut context_keys = VolumeContextKeys::default();
    let params = if config.claim_metadata_propagation {
        resolved_params =
            resolve_parameter_templates(class_annotations, params, &template_context)?;
        copied_metadata = copied_claim_metadata(class_annotations, claim)?;
        context_keys = volume_context_keys(class_annotations)?;
        &resolved_params
    } else {
        params
    };
    request.parameters = driver_parameters(params)?;
    if config.extra_create_metadata {
        request
            .parameters
            .insert(wk::PARAM_PVC_NAME.to_owned(), claim_identity.name.clone());
        request.parameters.insert(
            wk::PARAM_PVC_NAMESPACE.to_owned(),
            claim_identity.namespace.clone(),
        );
        request
            .parameters
            .insert(wk::PARAM_PV_NAME.to_owned(), name.clone());
    }

    if let Some(vac_name) = vac_name {
        let vac = inputs
            .volume_attributes_class
            .filter(|vac| vac.metadata.name.as_deref() == Some(vac_name))
            .ok_or_else(|| ProvisionError::VolumeAttributesClassNotFound(vac_name.to_owned()))?;
        if vac.driver_name != config.driver_name {
            return Err(ProvisionError::VolumeAttributesClassDriverMismatch {
                name: vac_name.to_owned(),
                driver: vac.driver_name.clone(),
                ours: config.driver_name.clone(),
            });
        }
        request.mutable_parameters = vac
            .parameters
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
    }

    Ok(ProvisionPlan {
        volume_name: name,
        request,
        provisioner_secret,
        pv_secrets,
        source_finalizer,
        claim: claim_identity,
        fs_type,
        storage_class_name: claim_class_name(claim),
        reclaim_policy: class
            .reclaim_policy
            .clone()
            .unwrap_or_else(|| "Delete".to_owned()),
        mount_options,
        access_modes,
        volume_mode: spec.volume_mode.as_ref().map(String::from),
        volume_attributes_class_name: vac_name.map(str::to_owned),
        selected_node: selected_node.map(str::to_owned),
        has_data_source: source.is_some(),
        copied_metadata,
        volume_context_keys: context_keys,
        migrated_from,
    })
}

/// fsType from `csi.storage.k8s.io/fstype` or the deprecated `fstype` key
/// (any case), else `--default-fstype`; both keys at once is an error.
fn fs_type(
    params: &BTreeMap<String, String>,
    default_fstype: &str,
) -> Result<String, ProvisionError> {
    let found: Vec<&String> = params
        .iter()
        .filter(|(key, _)| {
            key.as_str() == wk::PARAM_FSTYPE || key.eq_ignore_ascii_case(wk::PARAM_LEGACY_FSTYPE)
        })
        .map(|(_, value)| value)
        .collect();
    match found.as_slice() {
        [] => Ok(default_fstype.to_owned()),
        [value] if value.is_empty() => Ok(default_fstype.to_owned()),
        [value] => Ok((*value).clone()),
        _ => Err(ProvisionError::FsTypeSpecifiedTwice),
    }
}

/// Class parameters for the driver: every `csi.storage.k8s.io/` key removed,
/// and an unknown one under that prefix refused (it is probably a typo of a
/// key the sidecar would have honoured).
pub fn driver_parameters(
    params: &BTreeMap<String, String>,
) -> Result<HashMap<String, String>, ProvisionError> {
    let mut out = HashMap::new();
    for (key, value) in params {
        if key.starts_with(wk::CSI_PARAMETER_PREFIX) {
            if !wk::KNOWN_PREFIXED_PARAMETERS.contains(&key.as_str()) {
                return Err(ProvisionError::UnknownPrefixedParameter(key.clone()));
            }
        } else {
            out.insert(key.clone(), value.clone());
        }
    }
    Ok(out)
}

/// CSI access mode of one Kubernetes access mode (csi-lib-utils' mapping; the
/// finer single-node modes only when the driver has SINGLE_NODE_MULTI_WRITER).
pub fn csi_access_mode(mode: &str, single_node_multi_writer: bool) -> Result<Mode, ProvisionError> {
    Ok(match (mode, single_node_multi_writer) {
        ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
        ("ReadWriteOncePod", false) => Mode::SingleNodeWriter,
        ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
        ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
        ("ReadWriteOnce", true) => Mode::SingleNodeMultiWriter,
        ("ReadWriteOnce", false) => Mode::SingleNodeWriter,
        (other, _) => return Err(ProvisionError::UnsupportedAccessMode(other.to_owned())),
    })
}

/// One capability per access mode, block or mount (with fsType and the
/// class's mount options as mount flags).
fn volume_capabilities(
    access_modes: &[String],
    is_block: bool,
    fs_type: &str,
    mount_options: &[String],
    config: &ProvisionerConfig,
) -> Result<Vec<VolumeCapability>, ProvisionError> {
    if access_modes.is_empty() {
        return Err(ProvisionError::NoAccessModes);
    }
    access_modes
        .iter()
        .map(|mode| {
            let mode = csi_access_mode(mode, config.capabilities.single_node_multi_writer)?;
            let access_type = if is_block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: fs_type.to_owned(),
                    mount_flags: mount_options.to_vec(),
                    volume_mount_group: String::new(),
                })
            };
            Ok(VolumeCapability {
                access_mode: Some(AccessMode { mode: mode.into() }),
                access_type: Some(access_type),
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
