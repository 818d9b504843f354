//! In-tree StorageClass → the class the CSI driver understands.
//!
//! Parameter keys are matched without regard to case (the in-tree plugins
//! did so); a kept parameter keeps its original spelling. The plugin-specific
//! keys stay here rather than in [`crate::wellknown`]: they are the in-tree
//! plugins' and drivers' vocabulary, read by nothing else in the sidecar.

use std::collections::BTreeMap;

use crate::projection::StorageClass;

use super::topology::{azure_unzoned_to_empty, translate_allowed_topologies, zone_selector};
use super::{InTreePlugin, MigrationError};
use crate::wellknown as wk;

/// In-tree `fsType` (any case); becomes [`wk::PARAM_FSTYPE`] where the driver
/// does not read it itself.
const FSTYPE: &str = "fstype";
/// In-tree single zone; becomes allowedTopologies.
const ZONE: &str = "zone";
/// In-tree comma-separated zones; becomes allowedTopologies.
const ZONES: &str = "zones";
/// EBS IOPS per GiB; kept, and the driver is allowed to raise too-low IOPS
/// to AWS's minimum, as the in-tree plugin did.
const AWS_IOPS_PER_GB: &str = "iopspergb";
const AWS_ALLOW_IOPS_INCREASE: &str = "allowautoiopspergbincrease";
/// Tells the vSphere driver the request is a migrated one: it then answers
/// with the volume's file path (`initialvolumefilepath`), which the in-tree
/// PV needs.
const VSPHERE_CSI_MIGRATION: &str = "csimigration";
/// vSphere in-tree parameters the driver takes under another name (lower
/// case in-tree key, driver key); every other vSphere parameter is dropped.
const VSPHERE_RENAMED: [(&str, &str); 10] = [
    ("storagepolicyname", "storagepolicyname"),
    ("datastore", "datastore-migrationparam"),
    ("diskformat", "diskformat-migrationparam"),
    (
        "hostfailurestotolerate",
        "hostfailurestotolerate-migrationparam",
    ),
    ("forceprovisioning", "forceprovisioning-migrationparam"),
    ("cachereservation", "cachereservation-migrationparam"),
    ("diskstripes", "diskstripes-migrationparam"),
    (
        "objectspacereservation",
        "objectspacereservation-migrationparam",
    ),
    ("iopslimit", "iopslimit-migrationparam"),
    (FSTYPE, wk::PARAM_FSTYPE),
];
/// Portworx's one auth Secret serves every CSI call that takes secrets.
const PORTWORX_SECRET_NAMES: [&str; 6] = [
    wk::PARAM_PROVISIONER_SECRET_NAME,
    wk::PARAM_CONTROLLER_PUBLISH_SECRET_NAME,
    wk::PARAM_NODE_PUBLISH_SECRET_NAME,
    wk::PARAM_NODE_STAGE_SECRET_NAME,
    wk::PARAM_CONTROLLER_EXPAND_SECRET_NAME,
    wk::PARAM_NODE_EXPAND_SECRET_NAME,
];
const PORTWORX_SECRET_NAMESPACES: [&str; 6] = [
    wk::PARAM_PROVISIONER_SECRET_NAMESPACE,
    wk::PARAM_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
    wk::PARAM_NODE_PUBLISH_SECRET_NAMESPACE,
    wk::PARAM_NODE_STAGE_SECRET_NAMESPACE,
    wk::PARAM_CONTROLLER_EXPAND_SECRET_NAMESPACE,
    wk::PARAM_NODE_EXPAND_SECRET_NAMESPACE,
];

/// The CSI form of `class`, a class of `plugin`: parameters and
/// allowedTopologies translated, provisioner set to the CSI driver, every
/// other field unchanged.
pub fn translate_storage_class_to_csi(
    plugin: InTreePlugin,
    class: &StorageClass,
) -> Result<StorageClass, MigrationError> {
    let empty = BTreeMap::new();
    let in_tree = class.parameters.as_ref().unwrap_or(&empty);
    let mut parameters = BTreeMap::new();
    let mut zones: Option<(&str, Vec<String>)> = None;

    for (key, value) in in_tree {
        let lower = key.to_ascii_lowercase();
        let keep = || (key.clone(), value.clone());
        let (new_key, new_value) = match (plugin, lower.as_str()) {
            (InTreePlugin::AzureFile, _) => keep(),
            (
                InTreePlugin::AwsEbs | InTreePlugin::GcePd | InTreePlugin::AzureDisk,
                ZONE | ZONES,
            ) => {
                if zones.is_some() {
                    return Err(MigrationError::ZoneAndZonesParameters);
                }
                zones = Some((key, zone_list(key, value, lower == ZONES)?));
                continue;
            }
            (
                InTreePlugin::AwsEbs
                | InTreePlugin::GcePd
                | InTreePlugin::Cinder
                | InTreePlugin::VsphereVolume,
                FSTYPE,
            ) => (wk::PARAM_FSTYPE.to_owned(), value.clone()),
            (InTreePlugin::AwsEbs, AWS_IOPS_PER_GB) => {
                parameters.insert(AWS_ALLOW_IOPS_INCREASE.to_owned(), "true".to_owned());
                keep()
            }
            (InTreePlugin::VsphereVolume, _) => {
                let Some((_, renamed)) = VSPHERE_RENAMED.iter().find(|(from, _)| *from == lower)
                else {
                    // The driver would refuse it; upstream drops it too.
                    continue;
                };
                ((*renamed).to_owned(), value.clone())
            }
            (InTreePlugin::Portworx, _) if lower == wk::OPENSTORAGE_AUTH_SECRET_NAME => {
                for template in PORTWORX_SECRET_NAMES {
                    parameters.insert(template.to_owned(), value.clone());
                }
                continue;
            }
            (InTreePlugin::Portworx, _) if lower == wk::OPENSTORAGE_AUTH_SECRET_NAMESPACE => {
                for template in PORTWORX_SECRET_NAMESPACES {
                    parameters.insert(template.to_owned(), value.clone());
                }
                continue;
            }
            _ => keep(),
        };
        parameters.insert(new_key, new_value);
    }
    if plugin == InTreePlugin::VsphereVolume {
        parameters.insert(VSPHERE_CSI_MIGRATION.to_owned(), "true".to_owned());
    }

    let allowed = class.allowed_topologies.as_deref().unwrap_or(&[]);
    let allowed_topologies = match (plugin.topology_key(), zones) {
        // Azure File and Portworx keep the class's topology as it is.
        (None, _) => class.allowed_topologies.clone(),
        (Some(_), Some(_)) if !allowed.is_empty() => {
            return Err(MigrationError::ZoneParametersWithAllowedTopologies);
        }
        (Some(key), Some((_, zones))) => Some(zone_selector(key, zones)),
        (Some(_), None) if allowed.is_empty() => class.allowed_topologies.clone(),
        (Some(key), None) => Some(translate_allowed_topologies(allowed, key)),
    };
    let allowed_topologies = match (plugin, allowed_topologies) {
        (InTreePlugin::AzureDisk, Some(terms)) => Some(azure_unzoned_to_empty(
            terms,
            plugin.topology_key().unwrap_or_default(),
        )),
        (_, terms) => terms,
    };

    Ok(StorageClass {
        provisioner: plugin.csi_driver().to_owned(),
        parameters: (!parameters.is_empty()).then_some(parameters),
        allowed_topologies,
        ..class.clone()
    })
}

/// The zones of a `zone` (one) or `zones` (comma-separated) parameter,
/// trimmed; naming none is an error rather than a request for zone "".
fn zone_list(key: &str, value: &str, several: bool) -> Result<Vec<String>, MigrationError> {
    let zones: Vec<String> = if several {
        value
            .split(',')
            .map(str::trim)
            .filter(|zone| !zone.is_empty())
            .map(str::to_owned)
            .collect()
    } else {
        Some(value.trim())
            .filter(|zone| !zone.is_empty())
            .map(str::to_owned)
            .into_iter()
            .collect()
    };
    if zones.is_empty() {
        return Err(MigrationError::EmptyZoneParameter {
            key: key.to_owned(),
        });
    }
    Ok(zones)
}

#[cfg(test)]
#[path = "storage_class_tests.rs"]
mod tests;
