//! PV sources between the CSI form the sidecar builds and the in-tree form
//! it saves for migrated classes (and finds again when deleting).
//!
//! Go's zero values are absent fields: an empty fsType, `readOnly: false`
//! and partition 0 are written as `None` on both sides, so that a
//! translated PV compares equal to one read back from the API server.
//! Fields that are pointers in Go (Azure Disk's `fsType`, `readOnly`,
//! `kind`, Azure File's `secretNamespace`) are written even when empty, as
//! upstream does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource,
    PersistentVolume, PersistentVolumeSpec, PortworxVolumeSource, SecretReference,
    VsphereVirtualDiskVolumeSource,
};

use super::handles::{
    aws_region, azure_account_of_secret, azure_account_secret_name, azure_disk_name, azure_file_id,
    ebs_volume_id, gce_pd_name, gce_region, gce_volume_handle,
};
use super::topology::{
    csi_to_in_tree, in_tree_to_csi, vsphere_csi_to_in_tree, vsphere_in_tree_to_csi,
};
use super::{InTreePlugin, MigrationError, VSPHERE_REGION_TOPOLOGY_KEY};
use crate::wellknown as wk;

/// Volume attribute: the partition of an EBS or PD volume.
const ATTR_PARTITION: &str = "partition";
/// Volume attributes of the Azure Disk driver.
const ATTR_AZURE_KIND: &str = "kind";
const ATTR_AZURE_CACHING_MODE: &str = "cachingmode";
const ATTR_AZURE_FSTYPE: &str = "fstype";
/// The only disk kind the Azure Disk driver serves, as attribute and as
/// in-tree `kind`.
const AZURE_MANAGED_ATTR: &str = "managed";
const AZURE_MANAGED_KIND: &str = "Managed";
/// Volume attributes of the Azure File driver.
const ATTR_AZURE_SHARE_NAME: &str = "sharename";
const ATTR_AZURE_SECRET_NAME: &str = "secretname";
const ATTR_AZURE_SECRET_NAMESPACE: &str = "secretnamespace";
/// Where an Azure File Secret lives when nothing says otherwise.
const AZURE_DEFAULT_SECRET_NAMESPACE: &str = "default";
/// Volume attribute of the vSphere driver: the storage policy, and (answered
/// to `csimigration` requests) the path of the volume's file.
const ATTR_VSPHERE_STORAGE_POLICY: &str = "storagepolicyname";
const ATTR_VSPHERE_VOLUME_PATH: &str = "initialvolumefilepath";

fn non_empty(value: Option<&str>) -> Option<String> {
    value.filter(|value| !value.is_empty()).map(str::to_owned)
}

fn only_true(value: Option<bool>) -> Option<bool> {
    value.filter(|set| *set)
}

/// An attribute by lower-case name, matched without regard to case (the
/// Azure drivers do).
fn attribute_ignoring_case<'a>(
    attributes: &'a BTreeMap<String, String>,
    name: &str,
) -> Option<&'a String> {
    attributes
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value)
}

fn parse_partition(value: &str) -> Result<Option<i32>, MigrationError> {
    let partition: i32 = value
        .trim()
        .parse()
        .map_err(|_| MigrationError::InvalidPartition {
            value: value.to_owned(),
        })?;
    Ok((partition != 0).then_some(partition))
}

/// The in-tree form of a CSI PV of a migrated driver: the CSI source replaced
/// by the plugin's, the topology in Kubernetes labels (see the module docs).
/// Metadata other than labels (and Azure File's resource group annotation)
/// is kept; the caller sets the migration annotations.
pub fn translate_csi_pv_to_in_tree(
    pv: &PersistentVolume,
) -> Result<PersistentVolume, MigrationError> {
    let csi = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.csi.as_ref())
        .ok_or(MigrationError::NotCsi)?;
    let plugin = InTreePlugin::from_csi_driver(&csi.driver)
        .ok_or_else(|| MigrationError::NotAMigratedDriver(csi.driver.clone()))?;
    if csi.volume_handle.is_empty() {
        return Err(MigrationError::EmptyVolumeId { plugin });
    }
    let handle = csi.volume_handle.clone();
    let no_attributes = BTreeMap::new();
    let attributes = csi.volume_attributes.as_ref().unwrap_or(&no_attributes);
    let fs_type = non_empty(csi.fs_type.as_deref());
    let read_only = only_true(csi.read_only);
    let zone_key = plugin.topology_key().unwrap_or_default();

    let mut out = pv.clone();
    let mut resource_group = None;
    let source = match plugin {
        InTreePlugin::AwsEbs => {
            let partition = match attributes.get(ATTR_PARTITION) {
                Some(value) => parse_partition(value)?,
                None => None,
            };
            csi_to_in_tree(&mut out, zone_key, Some(aws_region))?;
            InTreeSource::AwsEbs(AWSElasticBlockStoreVolumeSource {
                volume_id: handle,
                fs_type,
                partition,
                read_only,
            })
        }
        InTreePlugin::GcePd => {
            let pd_name = gce_pd_name(&handle)?.to_owned();
            let partition = match attributes.get(ATTR_PARTITION) {
                Some(value) if !value.is_empty() => parse_partition(value)?,
                _ => None,
            };
            csi_to_in_tree(&mut out, zone_key, Some(gce_region))?;
            InTreeSource::GcePd(GCEPersistentDiskVolumeSource {
                pd_name,
                fs_type,
                partition,
                read_only,
            })
        }
        InTreePlugin::AzureDisk => {
            let disk_name = azure_disk_name(&handle)?.to_owned();
            let attribute =
                |name| non_empty(attribute_ignoring_case(attributes, name).map(String::as_str));
            InTreeSource::AzureDisk(AzureDiskVolumeSource {
                caching_mode: attribute(ATTR_AZURE_CACHING_MODE),
                disk_name,
                disk_uri: handle,
                fs_type: Some(attribute(ATTR_AZURE_FSTYPE).or(fs_type).unwrap_or_default()),
                kind: Some(AZURE_MANAGED_KIND.to_owned()),
                read_only: Some(csi.read_only.unwrap_or(false)),
            })
        }
        InTreePlugin::AzureFile => {
            let attribute = |name| attribute_ignoring_case(attributes, name).cloned();
            let mut share_name = attribute(ATTR_AZURE_SHARE_NAME).unwrap_or_default();
            let mut secret_name = attribute(ATTR_AZURE_SECRET_NAME).unwrap_or_default();
            let mut secret_namespace = attribute(ATTR_AZURE_SECRET_NAMESPACE);
            if let Some(reference) = &csi.node_stage_secret_ref
                && let Some(name) = reference.name.as_deref().filter(|name| !name.is_empty())
            {
                secret_name = name.to_owned();
                secret_namespace = Some(reference.namespace.clone().unwrap_or_default());
            }
            if share_name.is_empty() || secret_name.is_empty() {
                let id = azure_file_id(&handle)?;
                if share_name.is_empty() {
                    share_name = id.share.to_owned();
                }
                if secret_name.is_empty() {
                    secret_name = azure_account_secret_name(id.account);
                }
                resource_group = Some(id.resource_group.to_owned()).filter(|rg| !rg.is_empty());
            }
            InTreeSource::AzureFile(AzureFilePersistentVolumeSource {
                read_only,
                secret_name,
                secret_namespace: Some(
                    secret_namespace.unwrap_or_else(|| AZURE_DEFAULT_SECRET_NAMESPACE.to_owned()),
                ),
                share_name,
            })
        }
        InTreePlugin::Cinder => {
            // No region: it cannot be told from an OpenStack zone.
            csi_to_in_tree(&mut out, zone_key, None)?;
            InTreeSource::Cinder(CinderPersistentVolumeSource {
                fs_type,
                read_only,
                secret_ref: None,
                volume_id: handle,
            })
        }
        InTreePlugin::VsphereVolume => {
            let volume_path = attributes
                .get(ATTR_VSPHERE_VOLUME_PATH)
                .filter(|path| !path.is_empty())
                .cloned()
                .ok_or(MigrationError::MissingVsphereVolumePath)?;
            vsphere_csi_to_in_tree(&mut out, zone_key, VSPHERE_REGION_TOPOLOGY_KEY);
            InTreeSource::VsphereVolume(VsphereVirtualDiskVolumeSource {
                fs_type,
                volume_path,
                ..VsphereVirtualDiskVolumeSource::default()
            })
        }
        InTreePlugin::Portworx => InTreeSource::Portworx(PortworxVolumeSource {
            fs_type,
            read_only,
            volume_id: handle,
        }),
    };
    if let Some(resource_group) = resource_group {
        out.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(wk::ANN_AZURE_FILE_RESOURCE_GROUP.to_owned(), resource_group);
    }
    let spec = out.spec.get_or_insert_with(PersistentVolumeSpec::default);
    spec.csi = None;
    source.put_into(spec);
    Ok(out)
}

/// One in-tree source, to be put into a spec whose CSI source was removed.
enum InTreeSource {
    AwsEbs(AWSElasticBlockStoreVolumeSource),
    GcePd(GCEPersistentDiskVolumeSource),
    AzureDisk(AzureDiskVolumeSource),
    AzureFile(AzureFilePersistentVolumeSource),
    Cinder(CinderPersistentVolumeSource),
    VsphereVolume(VsphereVirtualDiskVolumeSource),
    Portworx(PortworxVolumeSource),
}

impl InTreeSource {
    fn put_into(self, spec: &mut PersistentVolumeSpec) {
        match self {
            InTreeSource::AwsEbs(source) => spec.aws_elastic_block_store = Some(source),
            InTreeSource::GcePd(source) => spec.gce_persistent_disk = Some(source),
            InTreeSource::AzureDisk(source) => spec.azure_disk = Some(source),
            InTreeSource::AzureFile(source) => spec.azure_file = Some(source),
            InTreeSource::Cinder(source) => spec.cinder = Some(source),
            InTreeSource::VsphereVolume(source) => spec.vsphere_volume = Some(source),
            InTreeSource::Portworx(source) => spec.portworx_volume = Some(source),
        }
    }
}

/// The CSI form of an in-tree PV whose plugin migrated (for `DeleteVolume`
/// and anything else that needs the volume handle): the in-tree source
/// replaced by a CSI source of the plugin's driver, the Kubernetes zone keys
/// in the node affinity by the driver's.
pub fn translate_in_tree_pv_to_csi(
    pv: &PersistentVolume,
) -> Result<PersistentVolume, MigrationError> {
    let plugin = InTreePlugin::of_in_tree_volume(&crate::projection::Projection::project(pv))
        .ok_or_else(|| {
            MigrationError::NoMigratableSource(pv.metadata.name.clone().unwrap_or_default())
        })?;
    let mut out = pv.clone();
    let zone_key = plugin.topology_key().unwrap_or_default();
    let empty_id = || MigrationError::EmptyVolumeId { plugin };
    let csi = {
        let spec = out.spec.get_or_insert_with(PersistentVolumeSpec::default);
        let csi = |handle: String| CSIPersistentVolumeSource {
            driver: plugin.csi_driver().to_owned(),
            volume_handle: handle,
            ..CSIPersistentVolumeSource::default()
        };
        match plugin {
            InTreePlugin::AwsEbs => {
                let source = spec.aws_elastic_block_store.take().unwrap_or_default();
                CSIPersistentVolumeSource {
                    fs_type: non_empty(source.fs_type.as_deref()),
                    read_only: only_true(source.read_only),
                    volume_attributes: Some(BTreeMap::from([(
                        ATTR_PARTITION.to_owned(),
                        source.partition.unwrap_or(0).to_string(),
                    )])),
                    ..csi(ebs_volume_id(&source.volume_id)?)
                }
            }
            InTreePlugin::GcePd => {
                let source = spec.gce_persistent_disk.take().unwrap_or_default();
                if source.pd_name.is_empty() {
                    return Err(empty_id());
                }
                let labels = pv.metadata.labels.as_ref();
                let zone_label = [wk::LABEL_FAILURE_DOMAIN_BETA_ZONE, wk::LABEL_TOPOLOGY_ZONE]
                    .into_iter()
                    .find_map(|key| labels?.get(key).filter(|zones| !zones.is_empty()));
                let zones: Vec<String> = zone_label
                    .map(|zones| {
                        zones
                            .split(wk::LABEL_MULTI_ZONE_DELIMITER)
                            .filter(|zone| !zone.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                let partition = source
                    .partition
                    .filter(|partition| *partition != 0)
                    .map(|partition| partition.to_string())
                    .unwrap_or_default();
                spec.access_modes = spec.access_modes.take().map(gce_access_modes);
                CSIPersistentVolumeSource {
                    fs_type: non_empty(source.fs_type.as_deref()),
                    read_only: only_true(source.read_only),
                    volume_attributes: Some(BTreeMap::from([(
                        ATTR_PARTITION.to_owned(),
                        partition,
                    )])),
                    ..csi(gce_volume_handle(&zones, &source.pd_name)?)
                }
            }
            InTreePlugin::AzureDisk => {
                let source = spec.azure_disk.take().unwrap_or_default();
                if let Some(kind) = source
                    .kind
                    .as_deref()
                    .filter(|kind| !kind.eq_ignore_ascii_case(AZURE_MANAGED_KIND))
                {
                    return Err(MigrationError::UnsupportedAzureDiskKind(kind.to_owned()));
                }
                if source.disk_uri.is_empty() {
                    return Err(empty_id());
                }
                // Checked here too, so that a bad URI fails before the driver is called.
                azure_disk_name(&source.disk_uri)?;
                let mut attributes =
                    BTreeMap::from([(ATTR_AZURE_KIND.to_owned(), AZURE_MANAGED_ATTR.to_owned())]);
                if let Some(mode) = &source.caching_mode {
                    attributes.insert(ATTR_AZURE_CACHING_MODE.to_owned(), mode.clone());
                }
                if let Some(fs_type) = &source.fs_type {
                    attributes.insert(ATTR_AZURE_FSTYPE.to_owned(), fs_type.clone());
                }
                CSIPersistentVolumeSource {
                    fs_type: non_empty(source.fs_type.as_deref()),
                    read_only: only_true(source.read_only),
                    volume_attributes: Some(attributes),
                    ..csi(source.disk_uri)
                }
            }
            InTreePlugin::AzureFile => {
                let source = spec.azure_file.take().unwrap_or_default();
                let account = azure_account_of_secret(&source.secret_name)
                    .unwrap_or(&source.secret_name)
                    .to_owned();
                let resource_group = pv
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|annotations| annotations.get(wk::ANN_AZURE_FILE_RESOURCE_GROUP))
                    .cloned()
                    .unwrap_or_default();
                // The Secret's namespace is needed to mount; the pod is not
                // known here, so take the claim's.
                let namespace = source
                    .secret_namespace
                    .clone()
                    .or_else(|| spec.claim_ref.as_ref()?.namespace.clone())
                    .filter(|namespace| !namespace.is_empty())
                    .ok_or(MigrationError::AzureFileSecretNamespaceMissing)?;
                let pv_name = pv.metadata.name.clone().unwrap_or_default();
                let share = &source.share_name;
                CSIPersistentVolumeSource {
                    node_stage_secret_ref: Some(SecretReference {
                        name: Some(source.secret_name.clone()),
                        namespace: Some(namespace.clone()),
                    }),
                    read_only: only_true(source.read_only),
                    volume_attributes: Some(BTreeMap::from([(
                        ATTR_AZURE_SHARE_NAME.to_owned(),
                        share.clone(),
                    )])),
                    ..csi(format!(
                        "{resource_group}#{account}#{share}#{pv_name}#{namespace}"
                    ))
                }
            }
            InTreePlugin::Cinder => {
                let source = spec.cinder.take().unwrap_or_default();
                if source.volume_id.is_empty() {
                    return Err(empty_id());
                }
                CSIPersistentVolumeSource {
                    fs_type: non_empty(source.fs_type.as_deref()),
                    read_only: only_true(source.read_only),
                    ..csi(source.volume_id)
                }
            }
            InTreePlugin::VsphereVolume => {
                let source = spec.vsphere_volume.take().unwrap_or_default();
                if source.volume_path.is_empty() {
                    return Err(empty_id());
                }
                let attributes: BTreeMap<String, String> =
                    non_empty(source.storage_policy_name.as_deref())
                        .map(|policy| (ATTR_VSPHERE_STORAGE_POLICY.to_owned(), policy))
                        .into_iter()
                        .collect();
                CSIPersistentVolumeSource {
                    fs_type: non_empty(source.fs_type.as_deref()),
                    volume_attributes: (!attributes.is_empty()).then_some(attributes),
                    ..csi(source.volume_path)
                }
            }
            InTreePlugin::Portworx => {
                let source = spec.portworx_volume.take().unwrap_or_default();
                if source.volume_id.is_empty() {
                    return Err(empty_id());
                }
                let annotations = pv.metadata.annotations.as_ref();
                let secret = annotations.and_then(|annotations| {
                    Some(SecretReference {
                        name: Some(annotations.get(wk::OPENSTORAGE_AUTH_SECRET_NAME)?.clone()),
                        namespace: Some(
                            annotations
                                .get(wk::OPENSTORAGE_AUTH_SECRET_NAMESPACE)?
                                .clone(),
                        ),
                    })
                });
                CSIPersistentVolumeSource {
                    fs_type: non_empty(source.fs_type.as_deref()),
                    read_only: only_true(source.read_only),
                    controller_publish_secret_ref: secret.clone(),
                    node_stage_secret_ref: secret.clone(),
                    node_publish_secret_ref: secret.clone(),
                    controller_expand_secret_ref: secret.clone(),
                    node_expand_secret_ref: secret,
                    ..csi(source.volume_id)
                }
            }
        }
    };
    match plugin {
        InTreePlugin::AwsEbs | InTreePlugin::GcePd | InTreePlugin::Cinder => {
            in_tree_to_csi(&mut out, zone_key);
        }
        InTreePlugin::VsphereVolume => {
            vsphere_in_tree_to_csi(&mut out, zone_key, VSPHERE_REGION_TOPOLOGY_KEY);
        }
        // The Azure and Portworx drivers read the PV's topology as it is.
        InTreePlugin::AzureDisk | InTreePlugin::AzureFile | InTreePlugin::Portworx => {}
    }
    if let Some(spec) = out.spec.as_mut() {
        spec.csi = Some(csi);
    }
    Ok(out)
}

/// GCE PD's in-tree plugin attached every disk read-write to one node, whatever
/// the modes said; the CSI driver enforces them, so legacy modes are mapped to
/// what the plugin really did: ReadWriteMany is ReadWriteOnce, ReadWriteOnce
/// wins over ReadOnlyMany, and anything else is ReadWriteOnce.
fn gce_access_modes(modes: Vec<String>) -> Vec<String> {
    let has = |wanted: &str| {
        modes
            .iter()
            .any(|mode| mode == wanted || (wanted == "ReadWriteOnce" && mode == "ReadWriteMany"))
    };
    let mode = if has("ReadWriteOnce") {
        "ReadWriteOnce"
    } else if has("ReadOnlyMany") {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    };
    vec![mode.to_owned()]
}

#[cfg(test)]
#[path = "volume_tests.rs"]
mod tests;
