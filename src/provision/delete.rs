//! Deletion: which PVs are ours, when their backend volume is deleted, and
//! with which request and secret.

use std::collections::BTreeMap;

use crate::projection::{PersistentVolume, Projection, Shared, StorageClass};

use super::config::ProvisionerConfig;
use super::secrets::{SecretError, SecretKind, SecretRef, TemplateContext, resolve_secret_ref};
use super::topology::node_affinity_matches;
use crate::migration::{
    InTreePlugin, MigrationError, translate_in_tree_pv_to_csi, translate_storage_class_to_csi,
};
use crate::wellknown as wk;

/// Whether the PV belongs to this driver: its provisioned-by annotation (or,
/// with that annotation present, a migrated-to annotation) names us; without
/// a provisioned-by annotation (static PV), its CSI driver or migrated-to
/// annotation does. A PV provisioned by another driver is never ours, even if
/// its CSI source names our driver.
///
/// CSI migration: when our driver took over an in-tree plugin, a
/// provisioned-by annotation with the plugin's name is ours too (upstream's
/// additional provisioner name); and a PV with an in-tree source is ours only
/// if that source translates to our driver, since we could not delete it
/// otherwise.
pub fn is_our_volume(pv: &PersistentVolume, config: &ProvisionerConfig) -> bool {
    let driver = config.driver_name.as_str();
    if let Some(plugin) = InTreePlugin::of_in_tree_volume(pv)
        && plugin.csi_driver() != driver
    {
        return false;
    }
    let our_in_tree_name = InTreePlugin::from_csi_driver(driver).map(InTreePlugin::in_tree_name);
    let ours = |value: Option<&Shared>| value.is_some_and(|value| value == driver);
    let annotations = pv.metadata.annotations.as_ref();
    let migrated_to = annotations.and_then(|a| a.get(wk::ANN_MIGRATED_TO));
    match annotations.and_then(|a| a.get(wk::ANN_PROVISIONED_BY)) {
        Some(provisioned_by) => {
            ours(Some(provisioned_by))
                || Some(provisioned_by.as_str()) == our_in_tree_name
                || ours(migrated_to)
        }
        None => match pv.spec.as_ref().and_then(|spec| spec.csi.as_ref()) {
            Some(csi) => csi.driver == config.driver_name,
            None => ours(migrated_to),
        },
    }
}

pub(crate) fn has_finalizer(pv: &PersistentVolume, finalizer: &str) -> bool {
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|present| present == finalizer)
}

/// Whether to delete the backend volume of a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteDecision {
    Delete,
    Skip(DeleteSkipReason),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteSkipReason {
    NotOurs,
    /// Node deployment: the volume is not accessible from this node, so
    /// another instance created it.
    NotProvisionedOnThisNode,
    /// Deletion timestamp and our finalizer gone: the volume was deleted.
    AlreadyDeleted,
    /// Deletion timestamp without HonorPVReclaimPolicy: someone else deletes
    /// the PV object, leave the volume alone (upstream before KEP-2644).
    BeingDeleted,
    NotReleased {
        phase: String,
    },
    ReclaimPolicy {
        policy: String,
    },
}

/// Node deployment: whether the PV's node affinity admits this node's
/// accessible topology (from `NodeGetInfo`), i.e. this node's driver holds
/// the volume. Always true outside node mode, and when the driver reported
/// no topology (upstream then treats every PV as accessible).
pub fn volume_on_this_node(pv: &PersistentVolume, config: &ProvisionerConfig) -> bool {
    let Some(topology) = config
        .node_deployment
        .as_ref()
        .and_then(|node| node.accessible_topology.as_ref())
    else {
        return true;
    };
    node_affinity_matches(
        pv.spec
            .as_ref()
            .and_then(|spec| spec.node_affinity.as_ref()),
        topology,
    )
}

/// Decides whether the PV's backend volume should be deleted now.
pub fn should_delete(pv: &PersistentVolume, config: &ProvisionerConfig) -> DeleteDecision {
    use DeleteDecision::Skip;
    if !is_our_volume(pv, config) {
        return Skip(DeleteSkipReason::NotOurs);
    }
    if !volume_on_this_node(pv, config) {
        return Skip(DeleteSkipReason::NotProvisionedOnThisNode);
    }
    if pv.metadata.deletion_timestamp.is_some() {
        // With the gate on, a PV deleted while bound (KEP-2644) still has our
        // finalizer and is deleted on the backend once Released; without it,
        // the finalizer's absence says we already did.
        if !config.honor_pv_reclaim_policy {
            return Skip(DeleteSkipReason::BeingDeleted);
        }
        if !has_finalizer(pv, wk::FINALIZER_PV) {
            return Skip(DeleteSkipReason::AlreadyDeleted);
        }
    }
    let phase = pv
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .unwrap_or_default()
        .to_owned();
    if phase != "Released" {
        return Skip(DeleteSkipReason::NotReleased { phase });
    }
    let policy = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or_default()
        .to_owned();
    if policy != "Delete" {
        return Skip(DeleteSkipReason::ReclaimPolicy { policy });
    }
    DeleteDecision::Delete
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeleteError {
    /// Ours (by annotation) but with neither a CSI source nor an in-tree one
    /// that translates to CSI: nothing we can delete.
    #[error("invalid CSI PV")]
    NotCsi,
    /// CSI migration: the in-tree PV (or, for its deletion secret, its
    /// in-tree class) cannot be translated to CSI.
    #[error(transparent)]
    Migration(MigrationError),
    #[error("failed to get secretreference for volume {volume}: {error}")]
    Secret { volume: String, error: SecretError },
}

/// What `DeleteVolume` needs for a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletePlan {
    pub volume_id: String,
    /// Fetch it for `DeleteVolume`'s secrets. If it cannot be read, delete
    /// without secrets (it may have been deleted with its namespace), as upstream.
    pub secret: Option<SecretRef>,
    /// CSI migration: the PV is in the in-tree form of this plugin and
    /// `volume_id` comes from its translation to CSI.
    pub migrated_from: Option<InTreePlugin>,
}

impl DeletePlan {
    /// A CSI migration operation: upstream labels its metrics `migrated="true"`.
    pub fn is_migrated(&self) -> bool {
        self.migrated_from.is_some()
    }
}

/// The Secret for `DeleteVolume`: from the PV's deletion-secret annotations
/// when it has both (both empty = none needed), else from the class's
/// provisioner-secret templates resolved with the PV name and its claimRef
/// (no annotations are known then, so annotation tokens fail). Without the
/// class or a claimRef, none.
pub fn deletion_secret_ref(
    pv: &PersistentVolume,
    class: Option<&StorageClass>,
) -> Result<Option<SecretRef>, DeleteError> {
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let annotations = pv.metadata.annotations.as_ref();
    let annotated = annotations.and_then(|a| {
        Some((
            a.get(wk::ANN_DELETION_SECRET_NAME)?,
            a.get(wk::ANN_DELETION_SECRET_NAMESPACE)?,
        ))
    });
    if let Some((name, namespace)) = annotated {
        return Ok(
            (!name.is_empty() && !namespace.is_empty()).then(|| SecretRef {
                name: name.to_string(),
                namespace: namespace.to_string(),
            }),
        );
    }
    let (Some(class), Some(claim_ref)) = (
        class,
        pv.spec.as_ref().and_then(|spec| spec.claim_ref.as_ref()),
    ) else {
        return Ok(None);
    };
    let empty = BTreeMap::new();
    let context = TemplateContext {
        pv_name: &pv_name,
        pvc_name: claim_ref.name.as_deref().unwrap_or_default(),
        pvc_namespace: claim_ref.namespace.as_deref().unwrap_or_default(),
        pvc_annotations: None,
        pvc_labels: None,
    };
    resolve_secret_ref(
        SecretKind::Provisioner,
        class.parameters.as_ref().unwrap_or(&empty),
        &context,
    )
    .map_err(|error| DeleteError::Secret {
        volume: pv_name,
        error,
    })
}

/// The backend volume id of a PV: its CSI volume handle, or (CSI migration)
/// the handle its in-tree source translates to, with that source's plugin.
/// Also what to compare when a PV of the same name already exists.
pub fn volume_id_of(pv: &PersistentVolume) -> Result<(String, Option<InTreePlugin>), DeleteError> {
    let csi_handle = |pv: &PersistentVolume| {
        pv.spec
            .as_ref()
            .and_then(|spec| spec.csi.as_ref())
            .map(|csi| csi.volume_handle.clone())
    };
    match (csi_handle(pv), InTreePlugin::of_in_tree_volume(pv)) {
        (Some(volume_id), _) => Ok((volume_id, None)),
        (None, Some(plugin)) => {
            let translated =
                translate_in_tree_pv_to_csi(&pv.to_object()).map_err(DeleteError::Migration)?;
            let volume_id = translated
                .spec
                .and_then(|spec| spec.csi)
                .map(|csi| csi.volume_handle)
                .ok_or(DeleteError::NotCsi)?;
            Ok((volume_id, Some(plugin)))
        }
        (None, None) => Err(DeleteError::NotCsi),
    }
}

/// Builds the `DeleteVolume` plan of a PV `should_delete` accepted. `class`
/// is the PV's StorageClass if it still exists.
///
/// CSI migration: a PV with an in-tree source is translated to CSI for its
/// volume handle (upstream's `IsPVMigratable` / `TranslateInTreePVToCSI`);
/// its in-tree class, when the deletion secret must come from the class, is
/// translated too (only Portworx's translation yields a provisioner secret).
pub fn plan_delete(
    pv: &PersistentVolume,
    class: Option<&StorageClass>,
) -> Result<DeletePlan, DeleteError> {
    let (volume_id, migrated_from) = volume_id_of(pv)?;
    let has_secret_annotations = pv.metadata.annotations.as_ref().is_some_and(|a| {
        a.contains_key(wk::ANN_DELETION_SECRET_NAME)
            && a.contains_key(wk::ANN_DELETION_SECRET_NAMESPACE)
    });
    let translated_class;
    let class = match (migrated_from, class) {
        (Some(plugin), Some(class))
            if !has_secret_annotations && class.provisioner == plugin.in_tree_name() =>
        {
            translated_class =
                translate_storage_class_to_csi(plugin, class).map_err(DeleteError::Migration)?;
            Some(&translated_class)
        }
        (_, class) => class,
    };
    Ok(DeletePlan {
        volume_id,
        secret: deletion_secret_ref(pv, class)?,
        migrated_from,
    })
}

/// Upstream's wording for a PV that a VolumeAttachment still attaches to
/// `node`: deleting then would pull the volume from under a node, so the
/// caller waits (Warning event, requeue) instead of calling `DeleteVolume`
/// (`provisioner::attached` tells).
pub fn still_attached_message(pv_name: &str, node: &str) -> String {
    format!("persistentvolume {pv_name} is still attached to node {node}")
}

#[cfg(test)]
#[path = "delete_tests.rs"]
mod tests;
