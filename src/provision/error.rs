//! Why a provisioning plan could not be made. Messages follow upstream's
//! wording, since they end up in `ProvisioningFailed` events users search for.

use super::claim_metadata::ClaimMetadataError;
use super::secrets::SecretError;
use super::topology::TopologyError;
use crate::migration::MigrationError;
use csi_proto::quantity::QuantityError;

/// A plan error. None of them means a backend operation may be running: no
/// `CreateVolume` has been sent for the plan that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProvisionError {
    #[error("volume name prefix cannot be of length 0")]
    EmptyVolumeNamePrefix,
    #[error("corrupted PVC object, it is missing UID")]
    MissingClaimUid,
    #[error(
        "volume name uuid length {length} is longer than the {available} characters of the PVC uid without dashes"
    )]
    UuidLengthTooLong { length: usize, available: usize },
    #[error("claim Selector is not supported")]
    SelectorNotSupported,
    #[error(
        "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys"
    )]
    FsTypeSpecifiedTwice,
    #[error("invalid storage request of the claim: {0}")]
    InvalidCapacity(QuantityError),
    #[error("storage limit {limit} of the claim is below its request {request}")]
    LimitBelowRequest { request: i64, limit: i64 },
    #[error("claim has no access modes")]
    NoAccessModes,
    #[error("unsupported AccessMode combination: [{0}]")]
    UnsupportedAccessMode(String),
    #[error(
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"{0}\" with reserved namespace csi.storage.k8s.io/"
    )]
    UnknownPrefixedParameter(String),
    #[error(
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
    )]
    SnapshotRestoreNotSupported,
    #[error(
        "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
    )]
    CloneNotSupported,
    #[error(
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
    )]
    ModifyVolumeNotSupported,
    #[error("the PVC source not found for PVC {0}")]
    DataSourceWithoutName(String),
    #[error(
        "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got {0}"
    )]
    WrongSnapshotApiGroup(String),
    #[error(
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
    )]
    CrossNamespaceSourceDisabled,
    /// Upstream's words (`IsGranted`): no ReferenceGrant in the source's
    /// namespace allows claims of the claim's namespace to refer to it.
    #[error(
        "accessing {namespace}/{name} of {kind} dataSource from {claim_namespace}/{claim_name} isn't allowed"
    )]
    CrossNamespaceSourceNotGranted {
        kind: String,
        namespace: String,
        name: String,
        claim_namespace: String,
        claim_name: String,
    },
    /// Not a failure: an external populator fills the volume.
    #[error(
        "data source ({0}) is not handled by the provisioner, assuming an external populator will provision it"
    )]
    ExternalPopulator(String),
    #[error("the objects given for the data source do not match its kind {0}")]
    DataSourceObjectsMismatch(String),
    #[error("error getting handle for DataSource Type {kind} by Name {name}: {reason}")]
    DataSource {
        kind: String,
        name: String,
        reason: Box<DataSourceError>,
    },
    /// The lister's NotFound, which upstream reports as it is.
    #[error("volumeattributesclasses.storage.k8s.io {0:?} not found")]
    VolumeAttributesClassNotFound(String),
    #[error(
        "VAC {name} referenced in PVC is for driver {driver} which does not match driver name {ours}"
    )]
    VolumeAttributesClassDriverMismatch {
        name: String,
        driver: String,
        ours: String,
    },
    #[error("failed to get target node: node {0:?} not found")]
    SelectedNodeNotFound(String),
    #[error("error generating accessibility requirements: {0}")]
    Topology(TopologyError),
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// `ClaimMetadataPropagation`: a parameter template or a copy list of the
    /// class cannot be applied to the claim.
    #[error(transparent)]
    ClaimMetadata(#[from] ClaimMetadataError),
    /// CSI migration: the in-tree class cannot be translated for the driver.
    #[error("failed to translate storage class: {0}")]
    StorageClassTranslation(MigrationError),
}

impl ProvisionError {
    /// The scheduler should choose another node: remove the selected-node
    /// annotation (upstream's `ProvisioningReschedule` for missing Node/CSINode).
    pub fn wants_reschedule(&self) -> bool {
        match self {
            ProvisionError::SelectedNodeNotFound(_) => true,
            ProvisionError::Topology(error) => error.wants_reschedule(),
            _ => false,
        }
    }

    /// Not ours to provision after all: stop without a `ProvisioningFailed` event.
    pub fn is_ignored(&self) -> bool {
        matches!(self, ProvisionError::ExternalPopulator(_))
    }
}

impl From<TopologyError> for ProvisionError {
    fn from(error: TopologyError) -> Self {
        ProvisionError::Topology(error)
    }
}

/// Why a clone source or snapshot cannot be used (yet).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DataSourceError {
    /// The text after the colon is the claim lister's NotFound, as upstream.
    #[error(
        "error getting PVC {name} (namespace {namespace:?}) from api server: persistentvolumeclaim {name:?} not found"
    )]
    SourceClaimNotFound { name: String, namespace: String },
    #[error("the PVC DataSource {name} must have a status of Bound.  Got {phase:?}")]
    SourceClaimNotBound { name: String, phase: String },
    #[error("the PVC DataSource {0} is currently being deleted")]
    SourceClaimBeingDeleted(String),
    #[error("the source PVC ({0}) storageclass cannot be empty")]
    SourceClaimWithoutClass(String),
    #[error("the requested PVC ({0}) storageclass cannot be empty")]
    ClaimWithoutClass(String),
    #[error(
        "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {requested} but source is {source_bytes}"
    )]
    SourceClaimLarger { requested: i64, source_bytes: i64 },
    #[error("invalid storage request of source PVC {name}: {error}")]
    SourceClaimCapacity { name: String, error: QuantityError },
    #[error("volume name is empty in source PVC {0}")]
    SourceClaimWithoutVolume(String),
    /// The source's PV is missing, not CSI, of another driver, bound to
    /// another claim or not Bound (upstream logs which, and says this).
    #[error("claim in dataSource not bound or invalid")]
    SourceVolumeInvalid,
    #[error(
        "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is {source_mode}, but new PVC requested {requested_mode}"
    )]
    CloneVolumeModeMismatch {
        source_mode: String,
        requested_mode: String,
    },
    /// The text after the colon is the API server's NotFound, as upstream.
    #[error(
        "error getting snapshot {0} from api server: volumesnapshots.snapshot.storage.k8s.io {0:?} not found"
    )]
    SnapshotNotFound(String),
    #[error("snapshot {0} is being deleted")]
    SnapshotBeingDeleted(String),
    /// No bound content, content missing, bound to another snapshot or of
    /// another driver.
    #[error("snapshot {0} not bound")]
    SnapshotNotBound(String),
    #[error("snapshot {0} is not Ready")]
    SnapshotNotReady(String),
    #[error("snapshot handle {0} is not available")]
    SnapshotHandleMissing(String),
    #[error("invalid restore size of snapshot {name}: {error}")]
    SnapshotRestoreSize { name: String, error: QuantityError },
    #[error(
        "requested volume size {requested} is less than the size {restore_size} for the source snapshot {name}"
    )]
    RequestSmallerThanRestoreSize {
        requested: i64,
        restore_size: i64,
        name: String,
    },
    #[error(
        "requested volume {claim} modifies the mode of the source volume but does not have permission to do so. {reason}"
    )]
    VolumeModeChangeNotAllowed { claim: String, reason: String },
}
