//! Which claims are this driver's, for the loops that act on claims they
//! did not provision (PVC protection; the caches' relevance filter).

use crate::projection::StorageClass;
use crate::projection::{PersistentVolume, PersistentVolumeClaim};

use super::config::ProvisionerConfig;
use super::delete::is_our_volume;
use super::plan::{claim_class_name, migrated_class_plugin};
use super::should_provision::is_annotated_for_us;
use crate::migration::InTreePlugin;

/// Whether a claim belongs to this driver: its StorageClass names the driver
/// as provisioner, or the PV it is bound to is a CSI volume of the driver
/// (static PVs, or a class deleted since), or the controller-manager
/// annotated it for the driver (`volume.kubernetes.io/storage-provisioner`,
/// copied from the class; it keeps an unbound claim ours after its class is
/// deleted, so that a finalizer we added is also removed by us). CSI
/// migration: a class of the in-tree plugin our driver took over, an
/// in-tree PV of that plugin, or the older annotation form (in-tree name
/// plus `migrated-to`) count too. `class` and `volume` are the objects the
/// claim names, if they exist in the caches.
pub fn is_our_claim(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    volume: Option<&PersistentVolume>,
    config: &ProvisionerConfig,
) -> bool {
    let class_name = claim_class_name(claim);
    let by_class = class.is_some_and(|class| {
        !class_name.is_empty()
            && class.metadata.name.as_deref() == Some(class_name.as_str())
            && (class.provisioner == config.driver_name
                || migrated_class_plugin(class, config).is_some())
    });
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref())
        .filter(|name| !name.is_empty());
    let by_volume = match (volume_name, volume) {
        (Some(name), Some(pv)) => {
            pv.metadata.name.as_deref() == Some(name)
                && (pv
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.csi.as_ref())
                    .is_some_and(|csi| csi.driver == config.driver_name)
                    || InTreePlugin::of_in_tree_volume(pv)
                        .is_some_and(|plugin| plugin.csi_driver() == config.driver_name))
                && is_our_volume(pv, config)
        }
        _ => false,
    };
    let by_annotation = is_annotated_for_us(claim, config);
    by_class || by_volume || by_annotation
}
