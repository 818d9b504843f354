//! Well-known strings the sidecar reads or writes on Kubernetes objects.
//!
//! Every annotation, label, finalizer, StorageClass parameter key and event
//! reason lives here, spelled exactly as the Go external-provisioner (and the
//! controller-manager) spell them, so that both can run side by side on the
//! same cluster and users can search for the strings they know.

// ---- PVC annotations -------------------------------------------------------

/// Names the provisioner that should provision a PVC (set by the controller-manager).
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Deprecated beta form of [`ANN_STORAGE_PROVISIONER`]; still read when the GA one is absent.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Node chosen by the scheduler for a `WaitForFirstConsumer` claim.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The Kubernetes 1.11 alpha form of [`ANN_SELECTED_NODE`], still honoured when
/// reading the selected node for provisioning (as the Go library does).
pub const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";
/// Deprecated beta StorageClass annotation on PVCs; wins over `spec.storageClassName`.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

// ---- PV annotations ----------------------------------------------------------

/// Names the driver that dynamically provisioned a PV.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// CSI migration: names the CSI driver an in-tree PV/PVC was migrated to.
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
/// Name of the Secret to pass to `DeleteVolume`, resolved at provisioning time.
pub const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
/// Namespace of the Secret to pass to `DeleteVolume`.
pub const ANN_DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// Name of the Secret the external-resizer passes to `ControllerModifyVolume`.
pub const ANN_CONTROLLER_MODIFY_SECRET_NAME: &str =
    "volume.kubernetes.io/controller-modify-secret-name";
/// Namespace of the Secret the external-resizer passes to `ControllerModifyVolume`.
pub const ANN_CONTROLLER_MODIFY_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/controller-modify-secret-namespace";

/// Volume attribute (PV `csi.volumeAttributes`) naming the provisioner instance.
pub const VOLUME_ATTR_PROVISIONER_IDENTITY: &str = "storage.kubernetes.io/csiProvisionerIdentity";

// ---- CSI migration (k8s.io/csi-translation-lib) -----------------------------

/// GA node and PV label naming the zone; in-tree PVs carry it (or the beta
/// one) and their node affinity uses it.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// GA node and PV label naming the region.
pub const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
/// Beta form of [`LABEL_TOPOLOGY_ZONE`], still on PVs of older clusters.
pub const LABEL_FAILURE_DOMAIN_BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
/// Beta form of [`LABEL_TOPOLOGY_REGION`].
pub const LABEL_FAILURE_DOMAIN_BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Separates the zones of a multi-zone (regional) volume in a zone label.
pub const LABEL_MULTI_ZONE_DELIMITER: &str = "__";
/// Azure File PV annotation keeping the resource group of the share, which
/// the in-tree source has no field for.
pub const ANN_AZURE_FILE_RESOURCE_GROUP: &str = "kubernetes.io/azure-file-resource-group";
/// Portworx class parameter and PV annotation naming the auth Secret.
pub const OPENSTORAGE_AUTH_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
/// Portworx class parameter and PV annotation naming the auth Secret's namespace.
pub const OPENSTORAGE_AUTH_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";

// ---- VolumeSnapshotContent annotations ----------------------------------------

/// Allows restoring a snapshot into a volume of another volume mode.
pub const ANN_ALLOW_VOLUME_MODE_CHANGE: &str =
    "snapshot.storage.kubernetes.io/allow-volume-mode-change";

// ---- Finalizers ----------------------------------------------------------------

/// PV deletion protection (HonorPVReclaimPolicy, KEP-2644).
pub const FINALIZER_PV: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// On a clone-source PVC while a clone from it is being provisioned.
pub const FINALIZER_CLONE_SOURCE: &str = "provisioner.storage.kubernetes.io/cloning-protection";
/// On a VolumeSnapshot while a volume is being restored from it.
pub const FINALIZER_SNAPSHOT_SOURCE: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// PVC protection (controller-manager's pvc-protection controller).
pub const FINALIZER_PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// Put by the API server on an object deleted with `propagationPolicy:
/// Orphan`; the garbage collector strips its dependents' references to it.
pub const FINALIZER_ORPHAN: &str = "orphan";

// ---- Labels (PV releaser, from the seed project) ---------------------------------

/// PVC label associating its PV with a releaser controller id.
pub const LABEL_PVC_MANAGED_BY: &str = "dynamic-pvc-provisioner.kubernetes.io/managed-by";
/// PV label associating it with a releaser controller id.
pub const LABEL_PV_RELEASER_MANAGED_BY: &str = "reclaimable-pv-releaser.kubernetes.io/managed-by";
/// StorageClass annotation associating its PVs with a releaser controller id.
pub const ANN_RELEASER_CONTROLLER_ID: &str = "reclaimable-pv-releaser.kubernetes.io/controller-id";

// ---- StorageClass annotations ---------------------------------------------------

/// Marks the default StorageClass (the DefaultStorageClass admission plugin
/// gives it to claims created without `spec.storageClassName`).
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// Deprecated beta form of [`ANN_DEFAULT_CLASS`], still honoured by the admission plugin.
pub const ANN_BETA_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";

// ---- StorageClass parameters ------------------------------------------------------

/// Parameters under this prefix are for the sidecar and never reach the driver.
pub const CSI_PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";
/// fsType of mount volumes.
pub const PARAM_FSTYPE: &str = "csi.storage.k8s.io/fstype";
/// Deprecated unprefixed fsType key (any case), still honoured by upstream.
pub const PARAM_LEGACY_FSTYPE: &str = "fstype";

pub const PARAM_DEFAULT_SECRET_NAME: &str = "csi.storage.k8s.io/secret-name";
pub const PARAM_DEFAULT_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/secret-namespace";
pub const PARAM_PROVISIONER_SECRET_NAME: &str = "csi.storage.k8s.io/provisioner-secret-name";
pub const PARAM_PROVISIONER_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/provisioner-secret-namespace";
pub const PARAM_CONTROLLER_PUBLISH_SECRET_NAME: &str =
    "csi.storage.k8s.io/controller-publish-secret-name";
pub const PARAM_CONTROLLER_PUBLISH_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/controller-publish-secret-namespace";
pub const PARAM_NODE_STAGE_SECRET_NAME: &str = "csi.storage.k8s.io/node-stage-secret-name";
pub const PARAM_NODE_STAGE_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/node-stage-secret-namespace";
pub const PARAM_NODE_PUBLISH_SECRET_NAME: &str = "csi.storage.k8s.io/node-publish-secret-name";
pub const PARAM_NODE_PUBLISH_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/node-publish-secret-namespace";
pub const PARAM_CONTROLLER_EXPAND_SECRET_NAME: &str =
    "csi.storage.k8s.io/controller-expand-secret-name";
pub const PARAM_CONTROLLER_EXPAND_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/controller-expand-secret-namespace";
pub const PARAM_NODE_EXPAND_SECRET_NAME: &str = "csi.storage.k8s.io/node-expand-secret-name";
pub const PARAM_NODE_EXPAND_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/node-expand-secret-namespace";
pub const PARAM_CONTROLLER_MODIFY_SECRET_NAME: &str =
    "csi.storage.k8s.io/controller-modify-secret-name";
pub const PARAM_CONTROLLER_MODIFY_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/controller-modify-secret-namespace";

/// Deprecated secret keys: read like the prefixed ones but, unlike them, passed
/// through to the driver (upstream keeps them for backwards compatibility).
pub const PARAM_LEGACY_PROVISIONER_SECRET_NAME: &str = "csiProvisionerSecretName";
pub const PARAM_LEGACY_PROVISIONER_SECRET_NAMESPACE: &str = "csiProvisionerSecretNamespace";
pub const PARAM_LEGACY_CONTROLLER_PUBLISH_SECRET_NAME: &str = "csiControllerPublishSecretName";
pub const PARAM_LEGACY_CONTROLLER_PUBLISH_SECRET_NAMESPACE: &str =
    "csiControllerPublishSecretNamespace";
pub const PARAM_LEGACY_NODE_STAGE_SECRET_NAME: &str = "csiNodeStageSecretName";
pub const PARAM_LEGACY_NODE_STAGE_SECRET_NAMESPACE: &str = "csiNodeStageSecretNamespace";
pub const PARAM_LEGACY_NODE_PUBLISH_SECRET_NAME: &str = "csiNodePublishSecretName";
pub const PARAM_LEGACY_NODE_PUBLISH_SECRET_NAMESPACE: &str = "csiNodePublishSecretNamespace";

/// Every `csi.storage.k8s.io/` parameter the sidecar understands; any other key
/// under the prefix is a class error (upstream refuses it rather than guess).
pub const KNOWN_PREFIXED_PARAMETERS: &[&str] = &[
    PARAM_FSTYPE,
    PARAM_DEFAULT_SECRET_NAME,
    PARAM_DEFAULT_SECRET_NAMESPACE,
    PARAM_PROVISIONER_SECRET_NAME,
    PARAM_PROVISIONER_SECRET_NAMESPACE,
    PARAM_CONTROLLER_PUBLISH_SECRET_NAME,
    PARAM_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
    PARAM_NODE_STAGE_SECRET_NAME,
    PARAM_NODE_STAGE_SECRET_NAMESPACE,
    PARAM_NODE_PUBLISH_SECRET_NAME,
    PARAM_NODE_PUBLISH_SECRET_NAMESPACE,
    PARAM_CONTROLLER_EXPAND_SECRET_NAME,
    PARAM_CONTROLLER_EXPAND_SECRET_NAMESPACE,
    PARAM_NODE_EXPAND_SECRET_NAME,
    PARAM_NODE_EXPAND_SECRET_NAMESPACE,
    PARAM_CONTROLLER_MODIFY_SECRET_NAME,
    PARAM_CONTROLLER_MODIFY_SECRET_NAMESPACE,
];

/// CreateVolume parameters added with `--extra-create-metadata`.
pub const PARAM_PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
pub const PARAM_PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PARAM_PV_NAME: &str = "csi.storage.k8s.io/pv/name";

// ---- API groups and kinds ----------------------------------------------------------

pub const SNAPSHOT_API_GROUP: &str = "snapshot.storage.k8s.io";
pub const SNAPSHOT_KIND: &str = "VolumeSnapshot";
pub const PVC_KIND: &str = "PersistentVolumeClaim";
/// Owner references to StatefulSets, as the controller-manager writes them.
pub const STATEFULSET_API_VERSION: &str = "apps/v1";
pub const STATEFULSET_KIND: &str = "StatefulSet";
/// Owner references to Pods, as the controller-manager writes them.
pub const POD_API_VERSION: &str = "v1";
pub const POD_KIND: &str = "Pod";

// ---- StatefulSet PVC retention policy values (KEP-1847) ------------------------------

pub const RETENTION_RETAIN: &str = "Retain";
pub const RETENTION_DELETE: &str = "Delete";

// ---- Event reasons ---------------------------------------------------------------

/// Normal event on a PVC when provisioning starts.
pub const REASON_PROVISIONING: &str = "Provisioning";
/// Normal event on a PVC when its PV was saved.
pub const REASON_PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
/// Warning event on a PVC when provisioning failed.
pub const REASON_PROVISIONING_FAILED: &str = "ProvisioningFailed";
/// Warning event on a PVC when the backend volume of a PV that could not be
/// saved could not be deleted either.
pub const REASON_PROVISIONING_CLEANUP_FAILED: &str = "ProvisioningCleanupFailed";
/// Written by the controller-manager while it waits for an external provisioner;
/// listed so that tests and tools can recognise it.
pub const REASON_EXTERNAL_PROVISIONING: &str = "ExternalProvisioning";
/// Warning event on a PV whose `DeleteVolume` failed.
pub const REASON_VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";
/// Normal event on a PV released by the PV releaser loop.
pub const REASON_RELEASED: &str = "Released";
/// Warning event on a PV the PV releaser loop failed to release.
pub const REASON_ERR_RELEASE_PV: &str = "ErrReleasePV";
/// Warning event on a PV whose finalizer patch the API server refused
/// (422) although the PV was as the patch expected: not a stale cache. No
/// upstream counterpart (the Go image retries such a patch for ever).
pub const REASON_FINALIZER_PATCH_REFUSED: &str = "FinalizerPatchRefused";
/// Warning event on a claim whose PV was saved without an entry of the
/// driver's `volume_context` that its class lists (gate
/// `ClaimMetadataPropagation`). No upstream counterpart.
pub const REASON_VOLUME_CONTEXT_SKIPPED: &str = "VolumeContextSkipped";
