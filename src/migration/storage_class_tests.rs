use super::*;
use crate::provision::fixtures::{map, topology_term};
use k8s_openapi::api::core::v1::TopologySelectorTerm;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn class(
    plugin: InTreePlugin,
    parameters: &[(&str, &str)],
    allowed: Option<Vec<TopologySelectorTerm>>,
) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("gp2".to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: plugin.in_tree_name().to_owned(),
        parameters: (!parameters.is_empty()).then(|| map(parameters)),
        allowed_topologies: allowed,
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
        mount_options: Some(vec!["debug".to_owned()]),
        allow_volume_expansion: Some(true),
    }
}

/// What the translation should give: the same class for the driver, with
/// these parameters and allowedTopologies.
fn translated(
    plugin: InTreePlugin,
    parameters: &[(&str, &str)],
    allowed: Option<Vec<TopologySelectorTerm>>,
) -> StorageClass {
    StorageClass {
        provisioner: plugin.csi_driver().to_owned(),
        ..class(plugin, parameters, allowed)
    }
}

const GA_ZONE: &str = "topology.kubernetes.io/zone";
const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const EBS_ZONE: &str = "topology.ebs.csi.aws.com/zone";
const PD_ZONE: &str = "topology.gke.io/zone";
const DISK_ZONE: &str = "topology.disk.csi.azure.com/zone";
const CINDER_ZONE: &str = "topology.cinder.csi.openstack.org/zone";
const VSPHERE_ZONE: &str = "topology.csi.vmware.com/zone";

#[test]
fn translations() {
    use InTreePlugin::*;
    type Case = (
        &'static str,
        StorageClass,
        InTreePlugin,
        Result<StorageClass, MigrationError>,
    );
    let cases: Vec<Case> = vec![
        // ---- AWS EBS
        (
            "aws: EKS gp2",
            class(AwsEbs, &[("type", "gp2"), ("fsType", "ext4")], None),
            AwsEbs,
            Ok(translated(
                AwsEbs,
                &[("type", "gp2"), ("csi.storage.k8s.io/fstype", "ext4")],
                None,
            )),
        ),
        (
            "aws: iopsPerGB allows the driver to raise IOPS",
            class(AwsEbs, &[("type", "io1"), ("iopsPerGB", "10")], None),
            AwsEbs,
            Ok(translated(
                AwsEbs,
                &[
                    ("type", "io1"),
                    ("iopsPerGB", "10"),
                    ("allowautoiopspergbincrease", "true"),
                ],
                None,
            )),
        ),
        (
            "aws: zone",
            class(AwsEbs, &[("zone", "us-east-1a")], None),
            AwsEbs,
            Ok(translated(
                AwsEbs,
                &[],
                Some(vec![topology_term(&[(EBS_ZONE, &["us-east-1a"])])]),
            )),
        ),
        (
            "aws: zones, trimmed, any case",
            class(AwsEbs, &[("Zones", "us-east-1a, us-east-1b,")], None),
            AwsEbs,
            Ok(translated(
                AwsEbs,
                &[],
                Some(vec![topology_term(&[(
                    EBS_ZONE,
                    &["us-east-1a", "us-east-1b"],
                )])]),
            )),
        ),
        (
            "aws: zone and allowedTopologies",
            class(
                AwsEbs,
                &[("zone", "us-east-1a")],
                Some(vec![topology_term(&[(GA_ZONE, &["us-east-1b"])])]),
            ),
            AwsEbs,
            Err(MigrationError::ZoneParametersWithAllowedTopologies),
        ),
        (
            "aws: zone and zones",
            class(AwsEbs, &[("zone", "a"), ("zones", "b")], None),
            AwsEbs,
            Err(MigrationError::ZoneAndZonesParameters),
        ),
        (
            "aws: empty zones",
            class(AwsEbs, &[("zones", " , ")], None),
            AwsEbs,
            Err(MigrationError::EmptyZoneParameter {
                key: "zones".to_owned(),
            }),
        ),
        (
            "aws: allowedTopologies zone keys (GA and beta) become the driver's, others stay",
            class(
                AwsEbs,
                &[],
                Some(vec![
                    topology_term(&[(GA_ZONE, &["us-east-1a"]), ("example.com/rack", &["r1"])]),
                    topology_term(&[(BETA_ZONE, &["us-east-1b"])]),
                ]),
            ),
            AwsEbs,
            Ok(translated(
                AwsEbs,
                &[],
                Some(vec![
                    topology_term(&[(EBS_ZONE, &["us-east-1a"]), ("example.com/rack", &["r1"])]),
                    topology_term(&[(EBS_ZONE, &["us-east-1b"])]),
                ]),
            )),
        ),
        // ---- GCE PD
        (
            "gce: type, fsType and zones",
            class(
                GcePd,
                &[
                    ("type", "pd-ssd"),
                    ("FSTYPE", "xfs"),
                    ("zones", "us-central1-a,us-central1-b"),
                    ("replication-type", "regional-pd"),
                ],
                None,
            ),
            GcePd,
            Ok(translated(
                GcePd,
                &[
                    ("type", "pd-ssd"),
                    ("csi.storage.k8s.io/fstype", "xfs"),
                    ("replication-type", "regional-pd"),
                ],
                Some(vec![topology_term(&[(
                    PD_ZONE,
                    &["us-central1-a", "us-central1-b"],
                )])]),
            )),
        ),
        (
            "gce: allowedTopologies",
            class(
                GcePd,
                &[],
                Some(vec![topology_term(&[(BETA_ZONE, &["us-central1-a"])])]),
            ),
            GcePd,
            Ok(translated(
                GcePd,
                &[],
                Some(vec![topology_term(&[(PD_ZONE, &["us-central1-a"])])]),
            )),
        ),
        // ---- Azure Disk
        (
            "azure disk: fsType stays (the driver reads it), zone moves",
            class(
                AzureDisk,
                &[
                    ("skuName", "Premium_LRS"),
                    ("fsType", "ext4"),
                    ("zone", "eastus-1"),
                ],
                None,
            ),
            AzureDisk,
            Ok(translated(
                AzureDisk,
                &[("skuName", "Premium_LRS"), ("fsType", "ext4")],
                Some(vec![topology_term(&[(DISK_ZONE, &["eastus-1"])])]),
            )),
        ),
        (
            "azure disk: numeric fault domains are the driver's zone \"\"",
            class(
                AzureDisk,
                &[],
                Some(vec![topology_term(&[
                    (GA_ZONE, &["0", "westus-1"]),
                    ("topology.kubernetes.io/region", &["westus"]),
                ])]),
            ),
            AzureDisk,
            Ok(translated(
                AzureDisk,
                &[],
                Some(vec![topology_term(&[
                    (DISK_ZONE, &["", "westus-1"]),
                    ("topology.kubernetes.io/region", &["westus"]),
                ])]),
            )),
        ),
        // ---- Azure File: nothing to translate
        (
            "azure file: unchanged but for the provisioner",
            class(
                AzureFile,
                &[("skuName", "Standard_LRS"), ("fsType", "x"), ("zone", "z")],
                Some(vec![topology_term(&[(GA_ZONE, &["z"])])]),
            ),
            AzureFile,
            Ok(translated(
                AzureFile,
                &[("skuName", "Standard_LRS"), ("fsType", "x"), ("zone", "z")],
                Some(vec![topology_term(&[(GA_ZONE, &["z"])])]),
            )),
        ),
        // ---- Cinder
        (
            "cinder: fsType moves, availability stays a parameter",
            class(
                Cinder,
                &[
                    ("fsType", "ext4"),
                    ("availability", "nova"),
                    ("type", "ssd"),
                ],
                Some(vec![topology_term(&[(BETA_ZONE, &["nova"])])]),
            ),
            Cinder,
            Ok(translated(
                Cinder,
                &[
                    ("csi.storage.k8s.io/fstype", "ext4"),
                    ("availability", "nova"),
                    ("type", "ssd"),
                ],
                Some(vec![topology_term(&[(CINDER_ZONE, &["nova"])])]),
            )),
        ),
        (
            "cinder: a zone parameter is just a parameter",
            class(Cinder, &[("zone", "nova")], None),
            Cinder,
            Ok(translated(Cinder, &[("zone", "nova")], None)),
        ),
        // ---- vSphere
        (
            "vsphere: renamed, unknown dropped, csimigration added",
            class(
                VsphereVolume,
                &[
                    ("fsType", "ext4"),
                    ("StoragePolicyName", "gold"),
                    ("datastore", "ds1"),
                    ("diskformat", "thin"),
                    ("hostFailuresToTolerate", "1"),
                    ("forceProvisioning", "true"),
                    ("cacheReservation", "20"),
                    ("diskStripes", "2"),
                    ("objectSpaceReservation", "30"),
                    ("iopsLimit", "100"),
                    ("unknown", "x"),
                ],
                Some(vec![topology_term(&[
                    (GA_ZONE, &["zone-a"]),
                    ("topology.kubernetes.io/region", &["region-1"]),
                ])]),
            ),
            VsphereVolume,
            Ok(translated(
                VsphereVolume,
                &[
                    ("csi.storage.k8s.io/fstype", "ext4"),
                    ("storagepolicyname", "gold"),
                    ("datastore-migrationparam", "ds1"),
                    ("diskformat-migrationparam", "thin"),
                    ("hostfailurestotolerate-migrationparam", "1"),
                    ("forceprovisioning-migrationparam", "true"),
                    ("cachereservation-migrationparam", "20"),
                    ("diskstripes-migrationparam", "2"),
                    ("objectspacereservation-migrationparam", "30"),
                    ("iopslimit-migrationparam", "100"),
                    ("csimigration", "true"),
                ],
                Some(vec![topology_term(&[
                    (VSPHERE_ZONE, &["zone-a"]),
                    ("topology.kubernetes.io/region", &["region-1"]),
                ])]),
            )),
        ),
        (
            "vsphere: no parameters still says csimigration",
            class(VsphereVolume, &[], None),
            VsphereVolume,
            Ok(translated(VsphereVolume, &[("csimigration", "true")], None)),
        ),
        // ---- Portworx
        (
            "portworx: the auth secret serves every call",
            class(
                Portworx,
                &[
                    ("repl", "2"),
                    ("openstorage.io/auth-secret-name", "px-secret"),
                    ("openstorage.io/auth-secret-namespace", "px"),
                ],
                Some(vec![topology_term(&[(GA_ZONE, &["z"])])]),
            ),
            Portworx,
            Ok(translated(
                Portworx,
                &[
                    ("repl", "2"),
                    ("csi.storage.k8s.io/provisioner-secret-name", "px-secret"),
                    (
                        "csi.storage.k8s.io/controller-publish-secret-name",
                        "px-secret",
                    ),
                    ("csi.storage.k8s.io/node-publish-secret-name", "px-secret"),
                    ("csi.storage.k8s.io/node-stage-secret-name", "px-secret"),
                    (
                        "csi.storage.k8s.io/controller-expand-secret-name",
                        "px-secret",
                    ),
                    ("csi.storage.k8s.io/node-expand-secret-name", "px-secret"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "px"),
                    (
                        "csi.storage.k8s.io/controller-publish-secret-namespace",
                        "px",
                    ),
                    ("csi.storage.k8s.io/node-publish-secret-namespace", "px"),
                    ("csi.storage.k8s.io/node-stage-secret-namespace", "px"),
                    (
                        "csi.storage.k8s.io/controller-expand-secret-namespace",
                        "px",
                    ),
                    ("csi.storage.k8s.io/node-expand-secret-namespace", "px"),
                ],
                Some(vec![topology_term(&[(GA_ZONE, &["z"])])]),
            )),
        ),
        (
            "portworx: nothing to translate",
            class(Portworx, &[], None),
            Portworx,
            Ok(translated(Portworx, &[], None)),
        ),
    ];
    for (name, class, plugin, expected) in cases {
        assert_eq!(
            translate_storage_class_to_csi(plugin, &class),
            expected,
            "{name}"
        );
    }
}

#[test]
fn zone_parameters_of_every_zonal_plugin() {
    for (plugin, key) in [
        (InTreePlugin::AwsEbs, EBS_ZONE),
        (InTreePlugin::GcePd, PD_ZONE),
        (InTreePlugin::AzureDisk, DISK_ZONE),
    ] {
        let translated =
            translate_storage_class_to_csi(plugin, &class(plugin, &[("ZONE", " z-1 ")], None));
        assert_eq!(
            translated.map(|class| class.allowed_topologies),
            Ok(Some(vec![topology_term(&[(key, &["z-1"])])])),
            "{plugin}"
        );
        assert_eq!(
            translate_storage_class_to_csi(plugin, &class(plugin, &[("zone", "")], None)),
            Err(MigrationError::EmptyZoneParameter {
                key: "zone".to_owned()
            }),
            "{plugin}"
        );
    }
}

#[test]
fn translated_parameters_pass_the_sidecars_own_checks() {
    // Every csi.storage.k8s.io/ key the translation writes is one the
    // sidecar knows (an unknown one fails provisioning).
    for plugin in InTreePlugin::ALL {
        let class = class(
            plugin,
            &[
                ("fsType", "ext4"),
                ("openstorage.io/auth-secret-name", "s"),
                ("openstorage.io/auth-secret-namespace", "n"),
            ],
            None,
        );
        let translated = translate_storage_class_to_csi(plugin, &class).expect("translates");
        let parameters = translated.parameters.unwrap_or_default();
        assert!(
            crate::provision::driver_parameters(&parameters).is_ok(),
            "{plugin}: {parameters:?}"
        );
    }
}
