//! Volume ids as the in-tree plugins and the CSI drivers spell them, and the
//! region a set of zones lies in. Every parser returns an error for input it
//! does not understand and none can panic: each slice bound comes from a
//! length check or from a `find` on the same (ASCII-lowered) string.

use std::collections::BTreeSet;

use super::{InTreePlugin, MigrationError};

/// Why no single region could be derived from a set of zones.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    #[error("no zones specified")]
    NoZones,
    #[error("unexpected zone format: {zone:?} is not a valid {plugin} zone")]
    UnexpectedZone { plugin: InTreePlugin, zone: String },
    #[error("multiple or no regions gotten from zones, got: {0:?}")]
    NotOneRegion(Vec<String>),
}

/// The region of AWS zones, which come in four forms: `us-west-2a`,
/// `us-gov-east-1a`, `us-west-2-lax-1a` (local zone) and
/// `us-east-1-wl1-bos-wlz-1` (wavelength zone).
pub(super) fn aws_region(zones: &[String]) -> Result<String, RegionError> {
    one_region(zones, |zone| {
        let parts: Vec<&str> = zone.split('-').collect();
        match parts[..] {
            // The zone letter follows the region number: `2a` → `2`. (This
            // breaks for a location with more than nine regions; so does AWS's
            // own naming.)
            [.., last] if matches!(parts.len(), 3 | 4) && last.len() == 2 => {
                last.get(..1).map(|number| {
                    let mut region = parts[..parts.len() - 1].to_vec();
                    region.push(number);
                    region.join("-")
                })
            }
            [a, b, c, _, _] | [a, b, c, _, _, _, _] => Some([a, b, c].join("-")),
            _ => None,
        }
        .ok_or_else(|| RegionError::UnexpectedZone {
            plugin: InTreePlugin::AwsEbs,
            zone: zone.to_owned(),
        })
    })
}

/// The region of GCE zones, `{locale}-{region}-{zone}` (`europe-west1-b`).
pub(super) fn gce_region(zones: &[String]) -> Result<String, RegionError> {
    one_region(
        zones,
        |zone| match zone.split('-').collect::<Vec<_>>()[..] {
            [locale, region, _] => Ok(format!("{locale}-{region}")),
            _ => Err(RegionError::UnexpectedZone {
                plugin: InTreePlugin::GcePd,
                zone: zone.to_owned(),
            }),
        },
    )
}

fn one_region(
    zones: &[String],
    region_of: impl Fn(&str) -> Result<String, RegionError>,
) -> Result<String, RegionError> {
    if zones.is_empty() {
        return Err(RegionError::NoZones);
    }
    let regions = zones
        .iter()
        .map(|zone| region_of(zone))
        .collect::<Result<BTreeSet<_>, _>>()?;
    let mut regions = regions.into_iter();
    match (regions.next(), regions.next()) {
        (Some(region), None) => Ok(region),
        (first, second) => Err(RegionError::NotOneRegion(
            first.into_iter().chain(second).chain(regions).collect(),
        )),
    }
}

/// The EBS volume id (`vol-…`) of a Kubernetes EBS volume id, which is one of
/// `aws://<zone>/<vol-id>`, `aws:///<vol-id>` or the bare id (taken as is, as
/// upstream does: other AWS partitions use other id forms).
pub(super) fn ebs_volume_id(kubernetes_id: &str) -> Result<String, MigrationError> {
    let invalid = |reason| MigrationError::InvalidEbsVolumeId {
        id: kubernetes_id.to_owned(),
        reason,
    };
    if kubernetes_id.is_empty() {
        return Err(MigrationError::EmptyVolumeId {
            plugin: InTreePlugin::AwsEbs,
        });
    }
    let Some(rest) = kubernetes_id.strip_prefix("aws://") else {
        return Ok(kubernetes_id.to_owned());
    };
    // Upstream parses a URL; ids never need escapes, queries or fragments,
    // so refuse them rather than guess what the writer meant.
    if rest.contains(['?', '#', '%']) {
        return Err(invalid("is not of the form aws://<zone>/<vol-id>"));
    }
    // The zone (URL host) is informational: PVs carry it in their labels.
    let path = rest.split_once('/').map_or("", |(_zone, path)| path);
    let id = path.trim_matches('/');
    if !id.starts_with("vol-") || id.contains('/') {
        return Err(invalid("is not of the form aws://<zone>/vol-<id>"));
    }
    Ok(id.to_owned())
}

/// The GCE PD CSI handle of a disk: zonal with one zone, regional (region
/// derived from the zones) with several, and with the zone `UNSPECIFIED`
/// (which the driver resolves) without. The project is always `UNSPECIFIED`.
pub(super) fn gce_volume_handle(zones: &[String], pd_name: &str) -> Result<String, MigrationError> {
    const UNSPECIFIED: &str = "UNSPECIFIED";
    Ok(match zones {
        [] => format!("projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{pd_name}"),
        [zone] => format!("projects/{UNSPECIFIED}/zones/{zone}/disks/{pd_name}"),
        _ => {
            let region = gce_region(zones).map_err(MigrationError::Region)?;
            format!("projects/{UNSPECIFIED}/regions/{region}/disks/{pd_name}")
        }
    })
}

/// The disk name in a GCE PD CSI handle,
/// `projects/<project>/{zones|regions}/<location>/disks/<name>`.
pub(super) fn gce_pd_name(handle: &str) -> Result<&str, MigrationError> {
    match handle.split('/').collect::<Vec<_>>()[..] {
        [
            "projects",
            project,
            "zones" | "regions",
            location,
            "disks",
            name,
        ] if !project.is_empty() && !location.is_empty() && !name.is_empty() => Ok(name),
        _ => Err(MigrationError::InvalidGcePdHandle {
            handle: handle.to_owned(),
        }),
    }
}

/// The disk name in an Azure disk URI: a managed disk's resource id
/// `…/subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Compute/disks/<name>`,
/// or an unmanaged disk's blob URL `http(s)://…/vhds/<name>`.
pub(super) fn azure_disk_name(uri: &str) -> Result<&str, MigrationError> {
    let invalid = || MigrationError::InvalidAzureDiskUri {
        uri: uri.to_owned(),
    };
    // Azure resource ids are case-insensitive; compare in lower case and
    // slice the original (ASCII lowering keeps byte offsets).
    let lower = uri.to_ascii_lowercase();
    let name_start = if lower.starts_with("http") && uri.len() > 4 {
        let scheme_end = lower.find("://").ok_or_else(invalid)?;
        let marker = "/vhds/";
        let at = lower[scheme_end..].rfind(marker).ok_or_else(invalid)?;
        scheme_end + at + marker.len()
    } else {
        let subscriptions = lower.find("/subscriptions/").ok_or_else(invalid)?;
        let groups = lower[subscriptions..]
            .find("/resourcegroups/")
            .ok_or_else(invalid)?;
        let marker = "/providers/microsoft.compute/disks/";
        let after_groups = subscriptions + groups;
        let at = lower[after_groups..].rfind(marker).ok_or_else(invalid)?;
        after_groups + at + marker.len()
    };
    uri.get(name_start..)
        .filter(|name| !name.is_empty())
        .ok_or_else(invalid)
}

/// The parts of an Azure File CSI volume id,
/// `<resource group>#<account>#<share>[#<disk>[#…]]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AzureFileId<'a> {
    pub resource_group: &'a str,
    pub account: &'a str,
    pub share: &'a str,
}

pub(super) fn azure_file_id(handle: &str) -> Result<AzureFileId<'_>, MigrationError> {
    match handle.split('#').collect::<Vec<_>>()[..] {
        [resource_group, account, share, ..] => Ok(AzureFileId {
            resource_group,
            account,
            share,
        }),
        _ => Err(MigrationError::InvalidAzureFileHandle {
            handle: handle.to_owned(),
        }),
    }
}

const AZURE_SECRET_PREFIX: &str = "azure-storage-account-";
const AZURE_SECRET_SUFFIX: &str = "-secret";

/// The Secret the in-tree Azure File plugin created for a storage account.
pub(super) fn azure_account_secret_name(account: &str) -> String {
    format!("{AZURE_SECRET_PREFIX}{account}{AZURE_SECRET_SUFFIX}")
}

/// The storage account of such a Secret name, if it has that form.
pub(super) fn azure_account_of_secret(secret_name: &str) -> Option<&str> {
    let start = secret_name.find(AZURE_SECRET_PREFIX)? + AZURE_SECRET_PREFIX.len();
    let rest = secret_name.get(start..)?;
    let end = rest.rfind(AZURE_SECRET_SUFFIX)?;
    rest.get(..end).filter(|account| !account.is_empty())
}

#[cfg(test)]
#[path = "handles_tests.rs"]
mod tests;
