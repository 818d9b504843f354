//! The PV for a volume `CreateVolume` returned, or why the returned volume
//! cannot be used (then it must be deleted again).

use std::collections::BTreeMap;

use csi_proto::v1::CreateVolumeResponse;
use csi_proto::v1::volume_capability::access_mode::Mode;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
    SecretReference,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::claim_metadata::{CopiedMetadata, SkippedEntry, volume_context_metadata};
use super::config::ProvisionerConfig;
use super::plan::{ClaimIdentity, ProvisionPlan};
use super::quantity::bytes_to_quantity;
use super::topology::{satisfies_requisite, volume_node_affinity};
use crate::migration::{MigrationError, translate_csi_pv_to_in_tree};
use crate::wellknown as wk;

/// The driver created something we cannot record as the claim's PV. The
/// volume exists on the backend (if its id is known): the caller must
/// `DeleteVolume` it with the provisioner secrets and retry (upstream's
/// `ProvisioningInBackground` after cleanup).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PvBuildError {
    #[error("CreateVolume returned no volume")]
    MissingVolume,
    #[error("CreateVolume returned an empty volume id")]
    EmptyVolumeId,
    #[error("created volume capacity {returned} less than requested capacity {requested}")]
    CapacityTooSmall { returned: i64, requested: i64 },
    #[error("created volume capacity {0} is negative")]
    NegativeCapacity(i64),
    #[error("volume content source missing")]
    MissingContentSource,
    /// CSI migration: the volume cannot be written in the in-tree form (for
    /// instance its topology has a key the translation does not know; the
    /// message then says "failed to translate topology", as upstream's).
    #[error(transparent)]
    InTreeTranslation(MigrationError),
}

impl PvBuildError {
    /// The backend volume to delete before retrying, when the driver named one.
    pub fn volume_to_delete<'a>(&self, response: &'a CreateVolumeResponse) -> Option<&'a str> {
        response
            .volume
            .as_ref()
            .map(|volume| volume.volume_id.as_str())
            .filter(|id| !id.is_empty())
    }
}

fn secret_reference(secret: Option<&super::secrets::SecretRef>) -> Option<SecretReference> {
    secret.map(SecretReference::from)
}

/// Builds the PV recording the created volume for the planned claim. For a
/// migrated plan, the PV is the in-tree form of the CSI PV, with
/// `provisioned-by: <in-tree name>` (upstream records the class's
/// provisioner) and `migrated-to: <our driver>` (which the controller-manager
/// would add anyway; written at once, so the PV is recognisably ours from
/// its first version).
pub fn build_pv(
    plan: &ProvisionPlan,
    response: &CreateVolumeResponse,
    config: &ProvisionerConfig,
) -> Result<PersistentVolume, PvBuildError> {
    let volume = response
        .volume
        .as_ref()
        .ok_or(PvBuildError::MissingVolume)?;
    if volume.volume_id.is_empty() {
        return Err(PvBuildError::EmptyVolumeId);
    }
    let requested = plan
        .request
        .capacity_range
        .as_ref()
        .map_or(0, |range| range.required_bytes);
    // Capacity 0 means "unknown" (NFS and the like); record the request then.
    let capacity = match volume.capacity_bytes {
        0 => requested,
        negative if negative < 0 => return Err(PvBuildError::NegativeCapacity(negative)),
        returned if returned < requested => {
            return Err(PvBuildError::CapacityTooSmall {
                returned,
                requested,
            });
        }
        returned => returned,
    };
    if plan.has_data_source && volume.content_source.is_none() {
        return Err(PvBuildError::MissingContentSource);
    }
    let volume_attributes = volume_attributes(volume, config);

    // Only a claim that is ReadOnlyMany and nothing else is published read-only.
    let capabilities = &plan.request.volume_capabilities;
    let read_only = config.controller_publish_readonly
        && capabilities.len() == 1
        && capabilities[0].access_mode.as_ref().map(|mode| mode.mode)
            == Some(Mode::MultiNodeReaderOnly as i32);

    let secrets = &plan.pv_secrets;
    let csi = CSIPersistentVolumeSource {
        driver: config.driver_name.clone(),
        volume_handle: volume.volume_id.clone(),
        fs_type: (!plan.is_block() && !plan.fs_type.is_empty()).then(|| plan.fs_type.clone()),
        volume_attributes: Some(volume_attributes),
        read_only: read_only.then_some(true),
        controller_publish_secret_ref: secret_reference(secrets.controller_publish.as_ref()),
        node_stage_secret_ref: secret_reference(secrets.node_stage.as_ref()),
        node_publish_secret_ref: secret_reference(secrets.node_publish.as_ref()),
        controller_expand_secret_ref: secret_reference(secrets.controller_expand.as_ref()),
        node_expand_secret_ref: secret_reference(secrets.node_expand.as_ref()),
    };

    // Upstream always writes the deletion-secret pair, empty when the class has
    // no provisioner secret: that records "no secret needed" so deletion does
    // not fall back to the (possibly changed) class.
    let (deletion_name, deletion_namespace) = plan
        .provisioner_secret
        .as_ref()
        .map(|secret| (secret.name.clone(), secret.namespace.clone()))
        .unwrap_or_default();
    let mut annotations = BTreeMap::from([
        (
            wk::ANN_PROVISIONED_BY.to_owned(),
            config.driver_name.clone(),
        ),
        (wk::ANN_DELETION_SECRET_NAME.to_owned(), deletion_name),
        (
            wk::ANN_DELETION_SECRET_NAMESPACE.to_owned(),
            deletion_namespace,
        ),
    ]);
    if let Some(modify) = &secrets.controller_modify {
        annotations.insert(
            wk::ANN_CONTROLLER_MODIFY_SECRET_NAME.to_owned(),
            modify.name.clone(),
        );
        annotations.insert(
            wk::ANN_CONTROLLER_MODIFY_SECRET_NAMESPACE.to_owned(),
            modify.namespace.clone(),
        );
    }

    let claim = &plan.claim;
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(plan.volume_name.clone()),
            annotations: Some(annotations),
            // Only a volume the PV's deletion may delete needs protecting;
            // for Retain/Recycle the volume loop would remove it again.
            finalizers: (config.honor_pv_reclaim_policy && plan.reclaim_policy == "Delete")
                .then(|| vec![wk::FINALIZER_PV.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(plan.access_modes.clone()),
            capacity: Some(storage_capacity(capacity)),
            claim_ref: Some(claim_reference(claim)),
            csi: Some(csi),
            mount_options: (!plan.mount_options.is_empty()).then(|| plan.mount_options.clone()),
            node_affinity: if config.topology_enabled {
                volume_node_affinity(&volume.accessible_topology)
            } else {
                None
            },
            persistent_volume_reclaim_policy: Some(plan.reclaim_policy.clone()),
            storage_class_name: (!plan.storage_class_name.is_empty())
                .then(|| plan.storage_class_name.clone()),
            volume_attributes_class_name: plan.volume_attributes_class_name.clone(),
            volume_mode: plan.volume_mode.clone(),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    };
    let mut pv = match plan.migrated_from {
        None => pv,
        Some(plugin) => {
            let mut pv =
                translate_csi_pv_to_in_tree(&pv).map_err(PvBuildError::InTreeTranslation)?;
            let annotations = pv.metadata.annotations.get_or_insert_with(BTreeMap::new);
            annotations.insert(
                wk::ANN_PROVISIONED_BY.to_owned(),
                plugin.in_tree_name().to_owned(),
            );
            annotations.insert(wk::ANN_MIGRATED_TO.to_owned(), config.driver_name.clone());
            pv
        }
    };
    // `ClaimMetadataPropagation`: the claim labels and annotations the class
    // copies, then the volume context entries it lists, added last so that
    // none replaces a key the PV already has (`pv.kubernetes.io/provisioned-by`,
    // the deletion secret, zone labels of an in-tree PV, a claim's copy, ...).
    add_missing(&mut pv, &plan.copied_metadata);
    add_missing(&mut pv, &context_metadata(plan, volume).0);
    Ok(pv)
}

/// `ClaimMetadataPropagation`: the volume context entries the class lists
/// and the ones left off (see [`volume_context_metadata`]).
fn context_metadata(
    plan: &ProvisionPlan,
    volume: &csi_proto::v1::Volume,
) -> (CopiedMetadata, Vec<SkippedEntry>) {
    let copied_bytes = plan
        .copied_metadata
        .annotations
        .iter()
        .map(|(key, value)| key.len() + value.len())
        .sum();
    volume_context_metadata(
        &plan.volume_context_keys,
        &volume.volume_context,
        copied_bytes,
    )
}

/// A returned topology outside the requested one, for the claim's warning:
/// `build_pv` records it on the PV anyway, as the Go image does (its
/// `Provision` writes whatever `accessible_topology` says). The driver knows
/// where it made the volume; deleting it and asking again would churn the
/// backend for ever with a driver that always answers its own node or zone
/// (docs/driver-habits.md, row 3), and a WaitForFirstConsumer pod is
/// scheduled again to where the PV's node affinity points. `None` when
/// topology is off or the answer lies inside the requisite.
pub fn topology_outside_requisite(
    plan: &ProvisionPlan,
    response: &CreateVolumeResponse,
    config: &ProvisionerConfig,
) -> Option<String> {
    let volume = response.volume.as_ref()?;
    let requirements = plan.request.accessibility_requirements.as_ref();
    if !config.topology_enabled || satisfies_requisite(&volume.accessible_topology, requirements) {
        return None;
    }
    let sorted = |topologies: &[csi_proto::v1::Topology]| -> Vec<BTreeMap<String, String>> {
        topologies
            .iter()
            .map(|t| t.segments.clone().into_iter().collect())
            .collect()
    };
    Some(format!(
        "created volume is accessible from {:?}, outside the requested topology {:?}; recorded on the PV as the driver answered",
        sorted(&volume.accessible_topology),
        requirements
            .map(|r| sorted(&r.requisite))
            .unwrap_or_default()
    ))
}

/// The listed volume context entries that [`build_pv`] left off the PV, for
/// the claim's warnings; none when the response has no volume.
pub fn skipped_volume_context(
    plan: &ProvisionPlan,
    response: &CreateVolumeResponse,
) -> Vec<SkippedEntry> {
    response
        .volume
        .as_ref()
        .map(|volume| context_metadata(plan, volume).1)
        .unwrap_or_default()
}

/// Adds the labels and annotations the PV does not have yet. Nothing to add
/// leaves the metadata untouched (no empty `labels`), so the PV is the Go
/// image's.
fn add_missing(pv: &mut PersistentVolume, copied: &CopiedMetadata) {
    for (from, to) in [
        (&copied.labels, &mut pv.metadata.labels),
        (&copied.annotations, &mut pv.metadata.annotations),
    ] {
        if from.is_empty() {
            continue;
        }
        let to = to.get_or_insert_with(BTreeMap::new);
        for (key, value) in from {
            to.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
}

/// The PV that records a Retain class's volume whose claim went away
/// before its PV was saved (a restart replayed the journal): what the PV
/// would have been had it been saved just before the claim's deletion, so
/// the PV binder marks it Released and the volume stays visible and
/// reclaimable by an administrator rather than leaked on the backend. It is
/// built from what the journal holds: the frozen `CreateVolume` request and
/// the driver's repeated answer; the class, mount options and secrets went
/// with the claim and are not recorded.
pub fn retained_volume_pv(
    claim: &ClaimIdentity,
    request: &csi_proto::v1::CreateVolumeRequest,
    volume: &csi_proto::v1::Volume,
    config: &ProvisionerConfig,
) -> PersistentVolume {
    use csi_proto::v1::volume_capability::AccessType;
    let capabilities = &request.volume_capabilities;
    let block = capabilities
        .iter()
        .any(|c| matches!(c.access_type, Some(AccessType::Block(_))));
    let fs_type = capabilities.iter().find_map(|c| match &c.access_type {
        Some(AccessType::Mount(mount)) if !mount.fs_type.is_empty() => Some(mount.fs_type.clone()),
        _ => None,
    });
    let mut access_modes: Vec<String> = capabilities
        .iter()
        .filter_map(|c| c.access_mode.as_ref())
        .filter_map(|m| access_mode_name(m.mode))
        .map(str::to_owned)
        .collect();
    access_modes.dedup();
    if access_modes.is_empty() {
        access_modes.push("ReadWriteOnce".to_owned());
    }
    let requested = request
        .capacity_range
        .as_ref()
        .map_or(0, |range| range.required_bytes);
    let capacity = if volume.capacity_bytes > 0 {
        volume.capacity_bytes
    } else {
        requested
    };
    let volume_attributes = volume_attributes(volume, config);
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(request.name.clone()),
            annotations: Some(BTreeMap::from([(
                wk::ANN_PROVISIONED_BY.to_owned(),
                config.driver_name.clone(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(access_modes),
            capacity: Some(storage_capacity(capacity)),
            claim_ref: Some(claim_reference(claim)),
            csi: Some(CSIPersistentVolumeSource {
                driver: config.driver_name.clone(),
                volume_handle: volume.volume_id.clone(),
                fs_type: fs_type.filter(|_| !block),
                volume_attributes: Some(volume_attributes),
                ..CSIPersistentVolumeSource::default()
            }),
            node_affinity: if config.topology_enabled {
                volume_node_affinity(&volume.accessible_topology)
            } else {
                None
            },
            persistent_volume_reclaim_policy: Some("Retain".to_owned()),
            volume_mode: Some(if block { "Block" } else { "Filesystem" }.to_owned()),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

/// The claim reference of a PV (the resourceVersion when known).
fn claim_reference(claim: &ClaimIdentity) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some(wk::PVC_KIND.to_owned()),
        namespace: Some(claim.namespace.clone()),
        name: Some(claim.name.clone()),
        uid: Some(claim.uid.clone()),
        resource_version: claim.resource_version.clone(),
        field_path: None,
    }
}

fn storage_capacity(
    bytes: i64,
) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    BTreeMap::from([("storage".to_owned(), bytes_to_quantity(bytes))])
}

/// The PV's CSI volume attributes: the provisioner identity, then the
/// driver's volume context.
fn volume_attributes(
    volume: &csi_proto::v1::Volume,
    config: &ProvisionerConfig,
) -> BTreeMap<String, String> {
    let mut attributes = BTreeMap::from([(
        wk::VOLUME_ATTR_PROVISIONER_IDENTITY.to_owned(),
        config.provisioner_identity.clone(),
    )]);
    attributes.extend(
        volume
            .volume_context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    attributes
}

/// The Kubernetes access mode of a CSI one.
fn access_mode_name(mode: i32) -> Option<&'static str> {
    match Mode::try_from(mode).ok()? {
        Mode::SingleNodeWriter | Mode::SingleNodeMultiWriter => Some("ReadWriteOnce"),
        Mode::SingleNodeSingleWriter => Some("ReadWriteOncePod"),
        Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly => Some("ReadOnlyMany"),
        Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => Some("ReadWriteMany"),
        Mode::Unknown => None,
    }
}

/// Whether two PVs record the same volume for the same claim: what a
/// 409 on our PV create compares (our earlier attempt, its answer lost, vs
/// another claim's PV of that name). Volumes are compared by backend id,
/// so an in-tree PV (CSI migration) and its CSI form count as the same; a
/// PV whose id cannot be read matches nothing, and is never taken for ours.
pub fn records_same_volume(existing: &PersistentVolume, wanted: &PersistentVolume) -> bool {
    let claim_uid = |pv: &PersistentVolume| {
        pv.spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|c| c.uid.clone())
    };
    let id = |pv: &PersistentVolume| {
        super::delete::volume_id_of(&crate::projection::Projection::project(pv))
            .ok()
            .map(|(id, _)| id)
    };
    claim_uid(existing).is_some()
        && claim_uid(existing) == claim_uid(wanted)
        && id(existing).is_some()
        && id(existing) == id(wanted)
}

#[cfg(test)]
#[path = "pv_tests.rs"]
mod tests;
