//! Data sources: cloning a PVC and restoring a VolumeSnapshot.
//!
//! Two steps so the I/O layer knows what to read: [`data_source_ref`] says
//! which object the claim points at (from `dataSource`, else `dataSourceRef`),
//! the I/O layer fetches it (and the PV or VolumeSnapshotContent behind it)
//! into [`DataSourceObjects`], and [`content_source`] validates them as
//! upstream does and yields the CSI `VolumeContentSource` plus the finalizer
//! that protects the source while the volume is made from it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::projection::StorageClass;
use crate::projection::{PersistentVolume, PersistentVolumeClaim, Shared};
use csi_proto::v1::VolumeContentSource;
use csi_proto::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::config::ProvisionerConfig;
use super::error::{DataSourceError, ProvisionError};
use super::quantity::{parse_bytes, quantity_bytes};
use crate::api::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use crate::wellknown as wk;

/// What a claim's data source is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSourceKind {
    /// Clone of another PVC.
    Claim,
    /// Restore of a `snapshot.storage.k8s.io` VolumeSnapshot.
    Snapshot,
}

impl DataSourceKind {
    /// The Kubernetes kind of such a source.
    pub fn kind_name(&self) -> &'static str {
        match self {
            DataSourceKind::Claim => wk::PVC_KIND,
            DataSourceKind::Snapshot => wk::SNAPSHOT_KIND,
        }
    }
}

/// The object a claim wants its volume filled from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSourceRef {
    pub kind: DataSourceKind,
    pub name: String,
    pub namespace: String,
    /// The source lives in another namespace than the claim: the I/O layer must
    /// check a ReferenceGrant before planning (`ProvisionInputs::data_source_granted`).
    pub cross_namespace: bool,
}

/// The source objects as the I/O layer found them (`None` = does not exist).
#[derive(Clone, Copy, Debug)]
pub enum DataSourceObjects<'a> {
    Claim {
        claim: Option<&'a PersistentVolumeClaim>,
        /// The PV named by the source claim's `spec.volumeName`.
        volume: Option<&'a PersistentVolume>,
    },
    Snapshot {
        snapshot: Option<&'a VolumeSnapshot>,
        /// The content named by the snapshot's `status.boundVolumeSnapshotContentName`.
        content: Option<&'a VolumeSnapshotContent>,
    },
}

/// A finalizer the I/O layer puts on the source before `CreateVolume`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFinalizer {
    pub kind: DataSourceKind,
    pub namespace: String,
    pub name: String,
    pub finalizer: &'static str,
    /// Upstream removes the snapshot finalizer right after the PV is saved;
    /// the clone finalizer is removed by the clone-protection loop once no
    /// pending claim clones from the source any more.
    pub remove_after_provisioning: bool,
    /// The uid of the source object the plan was made from: the finalizer
    /// goes on that object only, never on one re-created under its name
    /// (whose volume is another). `None`: any object of the name (removal).
    pub uid: Option<String>,
}

/// Which object the claim's data source names; `None` without one. An
/// unknown kind is an external populator ([`ProvisionError::ExternalPopulator`]).
pub fn data_source_ref(
    claim: &PersistentVolumeClaim,
    config: &ProvisionerConfig,
) -> Result<Option<DataSourceRef>, ProvisionError> {
    let claim_namespace = claim.namespace().unwrap_or_default();
    let spec = claim.spec.as_ref();
    let (kind, name, api_group, namespace) =
        if let Some(source) = spec.and_then(|s| s.data_source.as_ref()) {
            (
                &source.kind,
                &source.name,
                source.api_group.as_deref(),
                claim_namespace.clone(),
            )
        } else if let Some(source) = spec.and_then(|s| s.data_source_ref.as_ref()) {
            let namespace = match source.namespace.as_deref() {
                Some(namespace) if !namespace.is_empty() => {
                    if !config.cross_namespace_data_source {
                        return Err(ProvisionError::CrossNamespaceSourceDisabled);
                    }
                    namespace.to_owned()
                }
                _ => claim_namespace.clone(),
            };
            (
                &source.kind,
                &source.name,
                source.api_group.as_deref(),
                namespace,
            )
        } else {
            return Ok(None);
        };
    if name.is_empty() {
        return Err(ProvisionError::DataSourceWithoutName(
            claim.metadata.name.clone().unwrap_or_default(),
        ));
    }
    let kind = match kind.as_str() {
        wk::SNAPSHOT_KIND => {
            let group = api_group.unwrap_or("");
            if group != wk::SNAPSHOT_API_GROUP {
                return Err(ProvisionError::WrongSnapshotApiGroup(group.to_owned()));
            }
            if !config.capabilities.create_delete_snapshot {
                return Err(ProvisionError::SnapshotRestoreNotSupported);
            }
            DataSourceKind::Snapshot
        }
        // Core kinds have no API group; upstream does not check it for PVCs.
        wk::PVC_KIND => {
            if !config.capabilities.clone_volume {
                return Err(ProvisionError::CloneNotSupported);
            }
            DataSourceKind::Claim
        }
        other => return Err(ProvisionError::ExternalPopulator(other.to_owned())),
    };
    Ok(Some(DataSourceRef {
        kind,
        name: name.clone(),
        cross_namespace: namespace != claim_namespace,
        namespace,
    }))
}

/// Validates the fetched source and returns what to put into the request.
pub fn content_source(
    source: &DataSourceRef,
    objects: DataSourceObjects<'_>,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    requested_bytes: i64,
    config: &ProvisionerConfig,
) -> Result<(VolumeContentSource, SourceFinalizer), ProvisionError> {
    let wrap = |reason: DataSourceError| ProvisionError::DataSource {
        kind: source.kind.kind_name().to_owned(),
        name: source.name.clone(),
        reason: Box::new(reason),
    };
    let uid = match &objects {
        DataSourceObjects::Claim { claim, .. } => claim.and_then(|c| c.metadata.uid.clone()),
        DataSourceObjects::Snapshot { snapshot, .. } => {
            snapshot.and_then(|s| s.metadata.uid.clone())
        }
    };
    let content_type = match (&source.kind, objects) {
        (
            DataSourceKind::Claim,
            DataSourceObjects::Claim {
                claim: source_claim,
                volume,
            },
        ) => clone_source(source, source_claim, volume, claim, class, requested_bytes)
            .map_err(wrap)?,
        (DataSourceKind::Snapshot, DataSourceObjects::Snapshot { snapshot, content }) => {
            snapshot_source(
                source,
                snapshot,
                content,
                claim,
                class,
                requested_bytes,
                config,
            )
            .map_err(wrap)?
        }
        (kind, _) => {
            return Err(ProvisionError::DataSourceObjectsMismatch(
                kind.kind_name().to_owned(),
            ));
        }
    };
    let (finalizer, remove_after_provisioning) = match source.kind {
        DataSourceKind::Claim => (wk::FINALIZER_CLONE_SOURCE, false),
        DataSourceKind::Snapshot => (wk::FINALIZER_SNAPSHOT_SOURCE, true),
    };
    Ok((
        VolumeContentSource {
            r#type: Some(content_type),
        },
        SourceFinalizer {
            kind: source.kind.clone(),
            namespace: source.namespace.clone(),
            name: source.name.clone(),
            finalizer,
            remove_after_provisioning,
            uid,
        },
    ))
}

fn volume_mode(mode: Option<&Shared>) -> &str {
    mode.map_or("Filesystem", Shared::as_str)
}

fn clone_source(
    source: &DataSourceRef,
    source_claim: Option<&PersistentVolumeClaim>,
    volume: Option<&PersistentVolume>,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    requested_bytes: i64,
) -> Result<Type, DataSourceError> {
    let source_claim = source_claim.ok_or_else(|| DataSourceError::SourceClaimNotFound {
        name: source.name.clone(),
        namespace: claim.namespace().unwrap_or_default(),
    })?;
    let phase = source_claim
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .unwrap_or_default()
        .to_owned();
    if phase != "Bound" {
        return Err(DataSourceError::SourceClaimNotBound {
            name: source.name.clone(),
            phase,
        });
    }
    if source_claim.metadata.deletion_timestamp.is_some() {
        return Err(DataSourceError::SourceClaimBeingDeleted(
            source.name.clone(),
        ));
    }
    let source_spec = source_claim.spec.clone().unwrap_or_default();
    let spec = claim.spec.clone().unwrap_or_default();
    if source_spec.storage_class_name.is_none() {
        return Err(DataSourceError::SourceClaimWithoutClass(
            source.name.clone(),
        ));
    }
    if spec.storage_class_name.is_none() {
        return Err(DataSourceError::ClaimWithoutClass(
            claim.metadata.name.clone().unwrap_or_default(),
        ));
    }
    let source_bytes = match source_spec
        .resources
        .as_ref()
        .and_then(|resources| resources.requests.as_ref())
        .and_then(|requests| requests.get("storage"))
    {
        Some(quantity) => {
            quantity_bytes(quantity).map_err(|error| DataSourceError::SourceClaimCapacity {
                name: source.name.clone(),
                error,
            })?
        }
        None => 0,
    };
    if requested_bytes < source_bytes {
        return Err(DataSourceError::SourceClaimLarger {
            requested: requested_bytes,
            source_bytes,
        });
    }
    let volume_name = source_spec.volume_name.clone().unwrap_or_default();
    if volume_name.is_empty() {
        return Err(DataSourceError::SourceClaimWithoutVolume(
            source.name.clone(),
        ));
    }
    // Upstream reports every inconsistency of the source PV the same way.
    let volume = volume
        .filter(|volume| volume.metadata.name.as_deref() == Some(volume_name.as_str()))
        .ok_or(DataSourceError::SourceVolumeInvalid)?;
    let volume_spec = volume
        .spec
        .as_ref()
        .ok_or(DataSourceError::SourceVolumeInvalid)?;
    let csi = volume_spec
        .csi
        .as_ref()
        .filter(|csi| csi.driver == class.provisioner)
        .ok_or(DataSourceError::SourceVolumeInvalid)?;
    let claim_ref = volume_spec
        .claim_ref
        .as_ref()
        .ok_or(DataSourceError::SourceVolumeInvalid)?;
    if claim_ref.uid != source_claim.metadata.uid
        || claim_ref.namespace.as_deref() != source_claim.metadata.namespace.as_deref()
        || claim_ref.name != source_claim.metadata.name
    {
        return Err(DataSourceError::SourceVolumeInvalid);
    }
    if volume
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        != Some("Bound")
    {
        return Err(DataSourceError::SourceVolumeInvalid);
    }
    let requested_mode = volume_mode(spec.volume_mode.as_ref());
    let source_mode = volume_mode(volume_spec.volume_mode.as_ref());
    if requested_mode != source_mode {
        return Err(DataSourceError::CloneVolumeModeMismatch {
            source_mode: source_mode.to_owned(),
            requested_mode: requested_mode.to_owned(),
        });
    }
    Ok(Type::Volume(VolumeSource {
        volume_id: csi.volume_handle.clone(),
    }))
}

fn snapshot_source(
    source: &DataSourceRef,
    snapshot: Option<&VolumeSnapshot>,
    content: Option<&VolumeSnapshotContent>,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    requested_bytes: i64,
    config: &ProvisionerConfig,
) -> Result<Type, DataSourceError> {
    let name = &source.name;
    let snapshot = snapshot.ok_or_else(|| DataSourceError::SnapshotNotFound(name.clone()))?;
    // A snapshot being deleted may still be restored when our finalizer shows
    // that this restore started before the deletion, so the volume is not leaked.
    if snapshot.metadata.deletion_timestamp.is_some()
        && !snapshot
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|finalizer| finalizer == wk::FINALIZER_SNAPSHOT_SOURCE)
    {
        return Err(DataSourceError::SnapshotBeingDeleted(name.clone()));
    }
    let not_bound = || DataSourceError::SnapshotNotBound(name.clone());
    let status = snapshot.status.as_ref().ok_or_else(not_bound)?;
    let content_name = status
        .bound_volume_snapshot_content_name
        .as_ref()
        .ok_or_else(not_bound)?;
    let content = content
        .filter(|content| content.metadata.name.as_ref() == Some(content_name))
        .ok_or_else(not_bound)?;
    let snapshot_ref = &content.spec.volume_snapshot_ref;
    if snapshot_ref.uid != snapshot.metadata.uid
        || snapshot_ref.namespace != snapshot.metadata.namespace
        || snapshot_ref.name != snapshot.metadata.name
        || content.spec.driver != class.provisioner
    {
        return Err(not_bound());
    }
    if status.ready_to_use != Some(true) {
        return Err(DataSourceError::SnapshotNotReady(name.clone()));
    }
    let handle = content
        .status
        .as_ref()
        .and_then(|status| status.snapshot_handle.clone())
        .ok_or_else(|| DataSourceError::SnapshotHandleMissing(name.clone()))?;
    if let Some(restore_size) = &status.restore_size {
        let restore_size =
            parse_bytes(&restore_size.0).map_err(|error| DataSourceError::SnapshotRestoreSize {
                name: name.clone(),
                error,
            })?;
        if requested_bytes < restore_size {
            return Err(DataSourceError::RequestSmallerThanRestoreSize {
                requested: requested_bytes,
                restore_size,
                name: name.clone(),
            });
        }
    }
    let claim_mode = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_mode.as_ref());
    if config.prevent_volume_mode_conversion
        && let (Some(source_mode), Some(claim_mode)) =
            (content.spec.source_volume_mode.as_ref(), claim_mode)
        && source_mode != claim_mode
    {
        check_mode_change_allowed(claim, content)?;
    }
    Ok(Type::Snapshot(SnapshotSource {
        snapshot_id: handle,
    }))
}

fn check_mode_change_allowed(
    claim: &PersistentVolumeClaim,
    content: &VolumeSnapshotContent,
) -> Result<(), DataSourceError> {
    let claim_key = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let content_name = content.metadata.name.as_deref().unwrap_or_default();
    let refuse = |reason: String| DataSourceError::VolumeModeChangeNotAllowed {
        claim: claim_key.clone(),
        reason,
    };
    let annotations = annotations(&content.metadata);
    let Some(value) = annotations.get(wk::ANN_ALLOW_VOLUME_MODE_CHANGE) else {
        return Err(refuse(format!(
            "{} annotation is not present on snapshotcontent {content_name}",
            wk::ANN_ALLOW_VOLUME_MODE_CHANGE
        )));
    };
    // Go's strconv.ParseBool.
    match value.as_str() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(()),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Err(refuse(format!(
            "{} is set to false on snapshotcontent {content_name}",
            wk::ANN_ALLOW_VOLUME_MODE_CHANGE
        ))),
        other => Err(refuse(format!(
            "failed to convert {} annotation value to boolean with error: strconv.ParseBool: parsing {other:?}: invalid syntax",
            wk::ANN_ALLOW_VOLUME_MODE_CHANGE
        ))),
    }
}

/// Annotations of a content, empty when it has none.
fn annotations(metadata: &ObjectMeta) -> Cow<'_, BTreeMap<String, String>> {
    match &metadata.annotations {
        Some(annotations) => Cow::Borrowed(annotations),
        None => Cow::Owned(BTreeMap::new()),
    }
}

#[cfg(test)]
#[path = "content_source_tests.rs"]
mod tests;
