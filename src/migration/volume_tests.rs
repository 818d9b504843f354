use super::*;
use crate::migration::{RegionError, TopologyTranslationError};
use crate::provision::fixtures::map;
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const GA_ZONE: &str = "topology.kubernetes.io/zone";
const GA_REGION: &str = "topology.kubernetes.io/region";
const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
const AZURE_URI: &str =
    "/subscriptions/sub-1/resourceGroups/rg/providers/Microsoft.Compute/disks/pvc-1";

/// One node selector term of `In` expressions.
fn affinity(terms: &[&[(&str, &str)]]) -> Option<VolumeNodeAffinity> {
    Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms
                .iter()
                .map(|expressions| NodeSelectorTerm {
                    match_expressions: Some(
                        expressions
                            .iter()
                            .map(|(key, value)| NodeSelectorRequirement {
                                key: (*key).to_owned(),
                                operator: "In".to_owned(),
                                values: Some(vec![(*value).to_owned()]),
                            })
                            .collect(),
                    ),
                    match_fields: None,
                })
                .collect(),
        }),
    })
}

/// A Released-looking PV `pvc-1` of claim `ns/data`, without a source.
fn base() -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pvc-1".to_owned()),
            annotations: Some(map(&[("pv.kubernetes.io/provisioned-by", "someone")])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            claim_ref: Some(ObjectReference {
                namespace: Some("ns".to_owned()),
                name: Some("data".to_owned()),
                ..ObjectReference::default()
            }),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            storage_class_name: Some("standard".to_owned()),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

fn with(change: impl FnOnce(&mut PersistentVolume)) -> PersistentVolume {
    let mut pv = base();
    change(&mut pv);
    pv
}

fn spec(pv: &mut PersistentVolume) -> &mut PersistentVolumeSpec {
    pv.spec.get_or_insert_with(Default::default)
}

fn csi(driver: &str, handle: &str) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: driver.to_owned(),
        volume_handle: handle.to_owned(),
        ..CSIPersistentVolumeSource::default()
    }
}

fn csi_pv(source: CSIPersistentVolumeSource) -> PersistentVolume {
    with(|pv| spec(pv).csi = Some(source))
}

fn label(pv: &mut PersistentVolume, key: &str, value: &str) {
    pv.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(key.to_owned(), value.to_owned());
}

#[test]
fn csi_to_in_tree() {
    type Case = (
        &'static str,
        PersistentVolume,
        Result<PersistentVolume, MigrationError>,
    );
    let cases: Vec<Case> = vec![
        // ---- AWS EBS
        (
            "aws: the volume id as is, fsType (observed from the Go sidecar)",
            csi_pv(CSIPersistentVolumeSource {
                fs_type: Some("ext4".to_owned()),
                volume_attributes: Some(map(&[(
                    "storage.kubernetes.io/csiProvisionerIdentity",
                    "1-2-ebs.csi.aws.com",
                )])),
                ..csi("ebs.csi.aws.com", "vol-0a1b2c")
            }),
            Ok(with(|pv| {
                spec(pv).aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "vol-0a1b2c".to_owned(),
                    fs_type: Some("ext4".to_owned()),
                    ..AWSElasticBlockStoreVolumeSource::default()
                });
            })),
        ),
        (
            "aws: topology becomes zone and region labels and terms",
            with(|pv| {
                let spec = spec(pv);
                spec.csi = Some(CSIPersistentVolumeSource {
                    read_only: Some(true),
                    volume_attributes: Some(map(&[("partition", "2")])),
                    ..csi("ebs.csi.aws.com", "vol-1")
                });
                spec.node_affinity =
                    affinity(&[&[("topology.ebs.csi.aws.com/zone", "us-east-1a")]]);
            }),
            Ok(with(|pv| {
                label(pv, GA_ZONE, "us-east-1a");
                label(pv, GA_REGION, "us-east-1");
                let spec = spec(pv);
                spec.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "vol-1".to_owned(),
                    partition: Some(2),
                    read_only: Some(true),
                    ..AWSElasticBlockStoreVolumeSource::default()
                });
                spec.node_affinity =
                    affinity(&[&[(GA_ZONE, "us-east-1a"), (GA_REGION, "us-east-1")]]);
            })),
        ),
        (
            "aws: partition 0 and readOnly false are Go's zero values",
            csi_pv(CSIPersistentVolumeSource {
                read_only: Some(false),
                fs_type: Some(String::new()),
                volume_attributes: Some(map(&[("partition", "0")])),
                ..csi("ebs.csi.aws.com", "vol-1")
            }),
            Ok(with(|pv| {
                spec(pv).aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "vol-1".to_owned(),
                    ..AWSElasticBlockStoreVolumeSource::default()
                });
            })),
        ),
        (
            "aws: a partition that is no number",
            csi_pv(CSIPersistentVolumeSource {
                volume_attributes: Some(map(&[("partition", "first")])),
                ..csi("ebs.csi.aws.com", "vol-1")
            }),
            Err(MigrationError::InvalidPartition {
                value: "first".to_owned(),
            }),
        ),
        (
            "aws: a topology key the translation does not know",
            with(|pv| {
                let spec = spec(pv);
                spec.csi = Some(csi("ebs.csi.aws.com", "vol-1"));
                spec.node_affinity = affinity(&[&[("example.com/rack", "r1")]]);
            }),
            Err(MigrationError::Topology(
                TopologyTranslationError::TermWithoutZone {
                    zone_key: GA_ZONE.to_owned(),
                    keys: vec!["example.com/rack".to_owned()],
                },
            )),
        ),
        // ---- GCE PD
        (
            "gce: pdName from the handle, partition, regional topology",
            with(|pv| {
                let spec = spec(pv);
                spec.csi = Some(CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    volume_attributes: Some(map(&[("partition", "1")])),
                    ..csi(
                        "pd.csi.storage.gke.io",
                        "projects/p/regions/us-central1/disks/pvc-1",
                    )
                });
                spec.node_affinity = affinity(&[
                    &[("topology.gke.io/zone", "us-central1-a")],
                    &[("topology.gke.io/zone", "us-central1-b")],
                ]);
            }),
            Ok(with(|pv| {
                label(pv, GA_ZONE, "us-central1-a__us-central1-b");
                label(pv, GA_REGION, "us-central1");
                let spec = spec(pv);
                spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "pvc-1".to_owned(),
                    fs_type: Some("ext4".to_owned()),
                    partition: Some(1),
                    read_only: None,
                });
                spec.node_affinity = affinity(&[
                    &[(GA_ZONE, "us-central1-a"), (GA_REGION, "us-central1")],
                    &[(GA_ZONE, "us-central1-b"), (GA_REGION, "us-central1")],
                ]);
            })),
        ),
        (
            "gce: an empty partition is none",
            csi_pv(CSIPersistentVolumeSource {
                volume_attributes: Some(map(&[("partition", "")])),
                ..csi("pd.csi.storage.gke.io", "projects/p/zones/z/disks/d")
            }),
            Ok(with(|pv| {
                spec(pv).gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "d".to_owned(),
                    ..GCEPersistentDiskVolumeSource::default()
                });
            })),
        ),
        (
            "gce: a handle of unknown form",
            csi_pv(csi("pd.csi.storage.gke.io", "pvc-1")),
            Err(MigrationError::InvalidGcePdHandle {
                handle: "pvc-1".to_owned(),
            }),
        ),
        (
            "gce: a zone of unknown form",
            with(|pv| {
                let spec = spec(pv);
                spec.csi = Some(csi("pd.csi.storage.gke.io", "projects/p/zones/z/disks/d"));
                spec.node_affinity = affinity(&[&[("topology.gke.io/zone", "z")]]);
            }),
            Err(MigrationError::Topology(TopologyTranslationError::Region(
                RegionError::UnexpectedZone {
                    plugin: InTreePlugin::GcePd,
                    zone: "z".to_owned(),
                },
            ))),
        ),
        // ---- Azure Disk
        (
            "azure disk: URI, name, attributes, topology left alone",
            with(|pv| {
                let spec = spec(pv);
                spec.csi = Some(CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    volume_attributes: Some(map(&[("cachingMode", "ReadOnly"), ("FSType", "xfs")])),
                    ..csi("disk.csi.azure.com", AZURE_URI)
                });
                spec.node_affinity =
                    affinity(&[&[("topology.disk.csi.azure.com/zone", "eastus-1")]]);
            }),
            Ok(with(|pv| {
                let spec = spec(pv);
                spec.azure_disk = Some(AzureDiskVolumeSource {
                    caching_mode: Some("ReadOnly".to_owned()),
                    disk_name: "pvc-1".to_owned(),
                    disk_uri: AZURE_URI.to_owned(),
                    fs_type: Some("xfs".to_owned()),
                    kind: Some("Managed".to_owned()),
                    read_only: Some(false),
                });
                spec.node_affinity =
                    affinity(&[&[("topology.disk.csi.azure.com/zone", "eastus-1")]]);
            })),
        ),
        (
            "azure disk: no attributes, Go's pointers written empty",
            csi_pv(csi("disk.csi.azure.com", AZURE_URI)),
            Ok(with(|pv| {
                spec(pv).azure_disk = Some(AzureDiskVolumeSource {
                    caching_mode: None,
                    disk_name: "pvc-1".to_owned(),
                    disk_uri: AZURE_URI.to_owned(),
                    fs_type: Some(String::new()),
                    kind: Some("Managed".to_owned()),
                    read_only: Some(false),
                });
            })),
        ),
        (
            "azure disk: a bad URI",
            csi_pv(csi("disk.csi.azure.com", "disk-1")),
            Err(MigrationError::InvalidAzureDiskUri {
                uri: "disk-1".to_owned(),
            }),
        ),
        // ---- Azure File
        (
            "azure file: share and secret from the handle, resource group annotated",
            csi_pv(csi("file.csi.azure.com", "rg#acct#share-1#pvc-1#ns")),
            Ok(with(|pv| {
                pv.metadata.annotations = Some(map(&[
                    ("pv.kubernetes.io/provisioned-by", "someone"),
                    ("kubernetes.io/azure-file-resource-group", "rg"),
                ]));
                spec(pv).azure_file = Some(AzureFilePersistentVolumeSource {
                    read_only: None,
                    secret_name: "azure-storage-account-acct-secret".to_owned(),
                    secret_namespace: Some("default".to_owned()),
                    share_name: "share-1".to_owned(),
                });
            })),
        ),
        (
            "azure file: attributes and the node-stage secret win",
            csi_pv(CSIPersistentVolumeSource {
                read_only: Some(true),
                volume_attributes: Some(map(&[
                    ("shareName", "share-2"),
                    ("secretName", "ignored"),
                    ("secretNamespace", "ignored"),
                ])),
                node_stage_secret_ref: Some(SecretReference {
                    name: Some("stage".to_owned()),
                    namespace: Some("sec".to_owned()),
                }),
                ..csi("file.csi.azure.com", "not-parsed")
            }),
            Ok(with(|pv| {
                spec(pv).azure_file = Some(AzureFilePersistentVolumeSource {
                    read_only: Some(true),
                    secret_name: "stage".to_owned(),
                    secret_namespace: Some("sec".to_owned()),
                    share_name: "share-2".to_owned(),
                });
            })),
        ),
        (
            "azure file: a handle without two #",
            csi_pv(csi("file.csi.azure.com", "acct#share")),
            Err(MigrationError::InvalidAzureFileHandle {
                handle: "acct#share".to_owned(),
            }),
        ),
        // ---- Cinder
        (
            "cinder: volume id, zone without region",
            with(|pv| {
                let spec = spec(pv);
                spec.csi = Some(CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    ..csi("cinder.csi.openstack.org", "uuid-1")
                });
                spec.node_affinity =
                    affinity(&[&[("topology.cinder.csi.openstack.org/zone", "nova")]]);
            }),
            Ok(with(|pv| {
                label(pv, GA_ZONE, "nova");
                let spec = spec(pv);
                spec.cinder = Some(CinderPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    volume_id: "uuid-1".to_owned(),
                    ..CinderPersistentVolumeSource::default()
                });
                spec.node_affinity = affinity(&[&[(GA_ZONE, "nova")]]);
            })),
        ),
        // ---- vSphere
        (
            "vsphere: the path the driver answered with",
            with(|pv| {
                let spec = spec(pv);
                spec.csi = Some(CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    volume_attributes: Some(map(&[(
                        "initialvolumefilepath",
                        "[ds1] kubevols/pvc-1.vmdk",
                    )])),
                    ..csi("csi.vsphere.vmware.com", "fcd-uuid")
                });
                spec.node_affinity = affinity(&[&[
                    ("topology.csi.vmware.com/region", "region-1"),
                    ("topology.csi.vmware.com/zone", "zone-a"),
                ]]);
            }),
            Ok(with(|pv| {
                label(pv, GA_ZONE, "zone-a");
                label(pv, GA_REGION, "region-1");
                let spec = spec(pv);
                spec.vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    volume_path: "[ds1] kubevols/pvc-1.vmdk".to_owned(),
                    ..VsphereVirtualDiskVolumeSource::default()
                });
                spec.node_affinity = affinity(&[&[(GA_REGION, "region-1"), (GA_ZONE, "zone-a")]]);
            })),
        ),
        (
            "vsphere: no path in the volume context",
            csi_pv(csi("csi.vsphere.vmware.com", "fcd-uuid")),
            Err(MigrationError::MissingVsphereVolumePath),
        ),
        // ---- Portworx
        (
            "portworx: volume id, readOnly",
            csi_pv(CSIPersistentVolumeSource {
                read_only: Some(true),
                fs_type: Some("ext4".to_owned()),
                ..csi("pxd.portworx.com", "px-1")
            }),
            Ok(with(|pv| {
                spec(pv).portworx_volume = Some(PortworxVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    read_only: Some(true),
                    volume_id: "px-1".to_owned(),
                });
            })),
        ),
        // ---- not translatable at all
        (
            "a driver that replaced no in-tree plugin",
            csi_pv(csi("hostpath.csi.k8s.io", "h-1")),
            Err(MigrationError::NotAMigratedDriver(
                "hostpath.csi.k8s.io".to_owned(),
            )),
        ),
        ("no CSI source", base(), Err(MigrationError::NotCsi)),
        (
            "an empty volume handle",
            csi_pv(csi("pxd.portworx.com", "")),
            Err(MigrationError::EmptyVolumeId {
                plugin: InTreePlugin::Portworx,
            }),
        ),
    ];
    for (name, input, expected) in cases {
        assert_eq!(translate_csi_pv_to_in_tree(&input), expected, "{name}");
    }
}

#[test]
fn in_tree_to_csi() {
    type Case = (
        &'static str,
        PersistentVolume,
        Result<PersistentVolume, MigrationError>,
    );
    let csi_with = |source: CSIPersistentVolumeSource, change: &dyn Fn(&mut PersistentVolume)| {
        let mut pv = csi_pv(source);
        change(&mut pv);
        pv
    };
    let no_change = |_: &mut PersistentVolume| {};
    let cases: Vec<Case> = vec![
        // ---- AWS EBS
        (
            "aws: aws://zone/vol-id, zone label to affinity",
            with(|pv| {
                label(pv, BETA_ZONE, "us-east-1a");
                spec(pv).aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "aws://us-east-1a/vol-1".to_owned(),
                    fs_type: Some("ext4".to_owned()),
                    ..AWSElasticBlockStoreVolumeSource::default()
                });
            }),
            Ok(csi_with(
                CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    volume_attributes: Some(map(&[("partition", "0")])),
                    ..csi("ebs.csi.aws.com", "vol-1")
                },
                &|pv| {
                    label(pv, BETA_ZONE, "us-east-1a");
                    spec(pv).node_affinity =
                        affinity(&[&[("topology.ebs.csi.aws.com/zone", "us-east-1a")]]);
                },
            )),
        ),
        (
            "aws: a malformed aws:// id",
            with(|pv| {
                spec(pv).aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "aws://us-east-1a/".to_owned(),
                    ..AWSElasticBlockStoreVolumeSource::default()
                });
            }),
            Err(MigrationError::InvalidEbsVolumeId {
                id: "aws://us-east-1a/".to_owned(),
                reason: "is not of the form aws://<zone>/vol-<id>",
            }),
        ),
        // ---- GCE PD
        (
            "gce: zonal handle from the zone label, modes made legacy-compatible",
            with(|pv| {
                label(pv, GA_ZONE, "us-central1-a");
                let spec = spec(pv);
                spec.access_modes =
                    Some(vec!["ReadOnlyMany".to_owned(), "ReadWriteMany".to_owned()]);
                spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "pvc-1".to_owned(),
                    partition: Some(3),
                    ..GCEPersistentDiskVolumeSource::default()
                });
            }),
            Ok(csi_with(
                CSIPersistentVolumeSource {
                    volume_attributes: Some(map(&[("partition", "3")])),
                    ..csi(
                        "pd.csi.storage.gke.io",
                        "projects/UNSPECIFIED/zones/us-central1-a/disks/pvc-1",
                    )
                },
                &|pv| {
                    label(pv, GA_ZONE, "us-central1-a");
                    let spec = spec(pv);
                    spec.access_modes = Some(vec!["ReadWriteOnce".to_owned()]);
                    spec.node_affinity = affinity(&[&[("topology.gke.io/zone", "us-central1-a")]]);
                },
            )),
        ),
        (
            "gce: regional handle, beta label wins",
            with(|pv| {
                label(pv, BETA_ZONE, "europe-west1-b__europe-west1-c");
                label(pv, GA_ZONE, "ignored-1-a");
                spec(pv).gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "pvc-1".to_owned(),
                    ..GCEPersistentDiskVolumeSource::default()
                });
            }),
            Ok(csi_with(
                CSIPersistentVolumeSource {
                    volume_attributes: Some(map(&[("partition", "")])),
                    ..csi(
                        "pd.csi.storage.gke.io",
                        "projects/UNSPECIFIED/regions/europe-west1/disks/pvc-1",
                    )
                },
                &|pv| {
                    label(pv, BETA_ZONE, "europe-west1-b__europe-west1-c");
                    label(pv, GA_ZONE, "ignored-1-a");
                    // GA wins in the affinity lookup: the PV's labels carry
                    // both, GA is looked at first.
                    spec(pv).node_affinity =
                        affinity(&[&[("topology.gke.io/zone", "ignored-1-a")]]);
                },
            )),
        ),
        (
            "gce: zones in two regions",
            with(|pv| {
                label(pv, GA_ZONE, "europe-west1-b__us-central1-a");
                spec(pv).gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "pvc-1".to_owned(),
                    ..GCEPersistentDiskVolumeSource::default()
                });
            }),
            Err(MigrationError::Region(RegionError::NotOneRegion(vec![
                "europe-west1".to_owned(),
                "us-central1".to_owned(),
            ]))),
        ),
        (
            "gce: no pdName",
            with(|pv| spec(pv).gce_persistent_disk = Some(Default::default())),
            Err(MigrationError::EmptyVolumeId {
                plugin: InTreePlugin::GcePd,
            }),
        ),
        // ---- Azure Disk
        (
            "azure disk: URI is the handle",
            with(|pv| {
                spec(pv).azure_disk = Some(AzureDiskVolumeSource {
                    caching_mode: Some("ReadWrite".to_owned()),
                    disk_name: "pvc-1".to_owned(),
                    disk_uri: AZURE_URI.to_owned(),
                    fs_type: Some("ext4".to_owned()),
                    kind: Some("Managed".to_owned()),
                    read_only: Some(false),
                });
            }),
            Ok(csi_with(
                CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    volume_attributes: Some(map(&[
                        ("cachingmode", "ReadWrite"),
                        ("fstype", "ext4"),
                        ("kind", "managed"),
                    ])),
                    ..csi("disk.csi.azure.com", AZURE_URI)
                },
                &no_change,
            )),
        ),
        (
            "azure disk: shared blob disks cannot migrate",
            with(|pv| {
                spec(pv).azure_disk = Some(AzureDiskVolumeSource {
                    disk_uri: AZURE_URI.to_owned(),
                    kind: Some("Shared".to_owned()),
                    ..AzureDiskVolumeSource::default()
                });
            }),
            Err(MigrationError::UnsupportedAzureDiskKind(
                "Shared".to_owned(),
            )),
        ),
        (
            "azure disk: a bad URI fails before the driver is asked",
            with(|pv| {
                spec(pv).azure_disk = Some(AzureDiskVolumeSource {
                    disk_uri: "disk-1".to_owned(),
                    ..AzureDiskVolumeSource::default()
                });
            }),
            Err(MigrationError::InvalidAzureDiskUri {
                uri: "disk-1".to_owned(),
            }),
        ),
        // ---- Azure File
        (
            "azure file: id from resource group, account, share, PV and namespace",
            with(|pv| {
                pv.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(
                        "kubernetes.io/azure-file-resource-group".into(),
                        "rg".into(),
                    );
                spec(pv).azure_file = Some(AzureFilePersistentVolumeSource {
                    read_only: Some(true),
                    secret_name: "azure-storage-account-acct-secret".to_owned(),
                    secret_namespace: None,
                    share_name: "share-1".to_owned(),
                });
            }),
            Ok(csi_with(
                CSIPersistentVolumeSource {
                    read_only: Some(true),
                    node_stage_secret_ref: Some(SecretReference {
                        name: Some("azure-storage-account-acct-secret".to_owned()),
                        namespace: Some("ns".to_owned()),
                    }),
                    volume_attributes: Some(map(&[("sharename", "share-1")])),
                    ..csi("file.csi.azure.com", "rg#acct#share-1#pvc-1#ns")
                },
                &|pv| {
                    pv.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(
                            "kubernetes.io/azure-file-resource-group".into(),
                            "rg".into(),
                        );
                },
            )),
        ),
        (
            "azure file: no namespace anywhere",
            with(|pv| {
                let spec = spec(pv);
                spec.claim_ref = None;
                spec.azure_file = Some(AzureFilePersistentVolumeSource {
                    secret_name: "s".to_owned(),
                    share_name: "share-1".to_owned(),
                    ..AzureFilePersistentVolumeSource::default()
                });
            }),
            Err(MigrationError::AzureFileSecretNamespaceMissing),
        ),
        // ---- Cinder
        (
            "cinder: volume id, beta zone to the driver key, beta region to GA",
            with(|pv| {
                let spec = spec(pv);
                spec.cinder = Some(CinderPersistentVolumeSource {
                    volume_id: "uuid-1".to_owned(),
                    fs_type: Some("ext4".to_owned()),
                    read_only: Some(false),
                    secret_ref: None,
                });
                spec.node_affinity = affinity(&[&[(BETA_ZONE, "nova"), (BETA_REGION, "r1")]]);
            }),
            Ok(csi_with(
                CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    ..csi("cinder.csi.openstack.org", "uuid-1")
                },
                &|pv| {
                    spec(pv).node_affinity = affinity(&[&[
                        ("topology.cinder.csi.openstack.org/zone", "nova"),
                        (GA_REGION, "r1"),
                    ]]);
                },
            )),
        ),
        // ---- vSphere
        (
            "vsphere: the path is the handle, the policy an attribute",
            with(|pv| {
                label(pv, GA_ZONE, "zone-a");
                spec(pv).vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    storage_policy_name: Some("gold".to_owned()),
                    volume_path: "[ds1] kubevols/pvc-1.vmdk".to_owned(),
                    storage_policy_id: None,
                });
            }),
            Ok(csi_with(
                CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    volume_attributes: Some(map(&[("storagepolicyname", "gold")])),
                    ..csi("csi.vsphere.vmware.com", "[ds1] kubevols/pvc-1.vmdk")
                },
                &|pv| {
                    label(pv, GA_ZONE, "zone-a");
                    spec(pv).node_affinity =
                        affinity(&[&[("topology.csi.vmware.com/zone", "zone-a")]]);
                },
            )),
        ),
        // ---- Portworx
        (
            "portworx: the auth secret for every call",
            with(|pv| {
                let annotations = pv.metadata.annotations.get_or_insert_with(Default::default);
                annotations.insert("openstorage.io/auth-secret-name".into(), "px".into());
                annotations.insert("openstorage.io/auth-secret-namespace".into(), "pxns".into());
                spec(pv).portworx_volume = Some(PortworxVolumeSource {
                    volume_id: "px-1".to_owned(),
                    ..PortworxVolumeSource::default()
                });
            }),
            Ok(csi_with(
                {
                    let secret = Some(SecretReference {
                        name: Some("px".to_owned()),
                        namespace: Some("pxns".to_owned()),
                    });
                    CSIPersistentVolumeSource {
                        controller_publish_secret_ref: secret.clone(),
                        node_stage_secret_ref: secret.clone(),
                        node_publish_secret_ref: secret.clone(),
                        controller_expand_secret_ref: secret.clone(),
                        node_expand_secret_ref: secret,
                        ..csi("pxd.portworx.com", "px-1")
                    }
                },
                &|pv| {
                    let annotations = pv.metadata.annotations.get_or_insert_with(Default::default);
                    annotations.insert("openstorage.io/auth-secret-name".into(), "px".into());
                    annotations
                        .insert("openstorage.io/auth-secret-namespace".into(), "pxns".into());
                },
            )),
        ),
        (
            "portworx: no volume id",
            with(|pv| spec(pv).portworx_volume = Some(Default::default())),
            Err(MigrationError::EmptyVolumeId {
                plugin: InTreePlugin::Portworx,
            }),
        ),
        // ---- nothing to translate
        (
            "a CSI PV",
            csi_pv(csi("ebs.csi.aws.com", "vol-1")),
            Err(MigrationError::NoMigratableSource("pvc-1".to_owned())),
        ),
        (
            "no source",
            base(),
            Err(MigrationError::NoMigratableSource("pvc-1".to_owned())),
        ),
    ];
    for (name, input, expected) in cases {
        assert_eq!(translate_in_tree_pv_to_csi(&input), expected, "{name}");
    }
}

/// In-tree PVs as the in-tree plugins (or this sidecar, for a migrated
/// class) wrote them, with consistent labels and node affinity: translating
/// to CSI and back must give the same PV.
#[test]
fn in_tree_round_trips() {
    let zonal = |pv: &mut PersistentVolume, zone_key, zone, region_key, region| {
        label(pv, zone_key, zone);
        label(pv, region_key, region);
        spec(pv).node_affinity = affinity(&[&[(zone_key, zone), (region_key, region)]]);
    };
    let cases: Vec<(&str, PersistentVolume)> = vec![
        (
            "aws, bare id, GA keys",
            with(|pv| {
                zonal(pv, GA_ZONE, "us-east-1a", GA_REGION, "us-east-1");
                spec(pv).aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "vol-1".to_owned(),
                    fs_type: Some("ext4".to_owned()),
                    partition: Some(1),
                    read_only: Some(true),
                });
            }),
        ),
        (
            "aws, no topology",
            with(|pv| {
                spec(pv).aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "vol-1".to_owned(),
                    ..AWSElasticBlockStoreVolumeSource::default()
                });
            }),
        ),
        (
            "gce, zonal",
            with(|pv| {
                zonal(pv, GA_ZONE, "us-central1-a", GA_REGION, "us-central1");
                spec(pv).gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "pvc-1".to_owned(),
                    fs_type: Some("ext4".to_owned()),
                    partition: Some(2),
                    read_only: None,
                });
            }),
        ),
        (
            "gce, regional",
            with(|pv| {
                label(pv, GA_ZONE, "us-central1-a__us-central1-b");
                label(pv, GA_REGION, "us-central1");
                let spec = spec(pv);
                spec.node_affinity = affinity(&[
                    &[(GA_ZONE, "us-central1-a"), (GA_REGION, "us-central1")],
                    &[(GA_ZONE, "us-central1-b"), (GA_REGION, "us-central1")],
                ]);
                spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "pvc-1".to_owned(),
                    ..GCEPersistentDiskVolumeSource::default()
                });
            }),
        ),
        (
            "azure disk",
            with(|pv| {
                spec(pv).azure_disk = Some(AzureDiskVolumeSource {
                    caching_mode: Some("ReadOnly".to_owned()),
                    disk_name: "pvc-1".to_owned(),
                    disk_uri: AZURE_URI.to_owned(),
                    fs_type: Some("ext4".to_owned()),
                    kind: Some("Managed".to_owned()),
                    read_only: Some(true),
                });
            }),
        ),
        (
            "azure file",
            with(|pv| {
                pv.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(
                        "kubernetes.io/azure-file-resource-group".into(),
                        "rg".into(),
                    );
                spec(pv).azure_file = Some(AzureFilePersistentVolumeSource {
                    read_only: Some(true),
                    secret_name: "azure-storage-account-acct-secret".to_owned(),
                    secret_namespace: Some("sec".to_owned()),
                    share_name: "share-1".to_owned(),
                });
            }),
        ),
        (
            "cinder, beta zone key kept",
            with(|pv| {
                label(pv, BETA_ZONE, "nova");
                let spec = spec(pv);
                spec.node_affinity = affinity(&[&[(BETA_ZONE, "nova")]]);
                spec.cinder = Some(CinderPersistentVolumeSource {
                    volume_id: "uuid-1".to_owned(),
                    fs_type: Some("xfs".to_owned()),
                    read_only: Some(true),
                    secret_ref: None,
                });
            }),
        ),
        (
            "portworx",
            with(|pv| {
                spec(pv).portworx_volume = Some(PortworxVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    read_only: Some(true),
                    volume_id: "px-1".to_owned(),
                });
            }),
        ),
    ];
    for (name, in_tree) in cases {
        let csi = translate_in_tree_pv_to_csi(&in_tree).expect(name);
        assert!(
            csi.spec.as_ref().and_then(|s| s.csi.as_ref()).is_some(),
            "{name}"
        );
        assert_eq!(
            translate_csi_pv_to_in_tree(&csi).as_ref(),
            Ok(&in_tree),
            "{name}"
        );
    }
}

/// Where upstream's translation normalises, a round trip gives the
/// normalised PV: this pins those rules down.
#[test]
fn in_tree_round_trips_that_normalise() {
    // aws://zone/vol-id comes back as the bare id (the zone is in the labels).
    let aws = with(|pv| {
        spec(pv).aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
            volume_id: "aws://us-east-1a/vol-1".to_owned(),
            ..AWSElasticBlockStoreVolumeSource::default()
        });
    });
    let back = translate_in_tree_pv_to_csi(&aws).and_then(|csi| translate_csi_pv_to_in_tree(&csi));
    assert_eq!(
        back.map(|pv| pv.spec.and_then(|s| s.aws_elastic_block_store)),
        Ok(Some(AWSElasticBlockStoreVolumeSource {
            volume_id: "vol-1".to_owned(),
            ..AWSElasticBlockStoreVolumeSource::default()
        }))
    );

    // A beta region key comes back GA, with the beta one derived next to it.
    let beta = with(|pv| {
        label(pv, BETA_ZONE, "us-east-1a");
        label(pv, BETA_REGION, "us-east-1");
        let spec = spec(pv);
        spec.node_affinity = affinity(&[&[(BETA_ZONE, "us-east-1a"), (BETA_REGION, "us-east-1")]]);
        spec.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
            volume_id: "vol-1".to_owned(),
            ..AWSElasticBlockStoreVolumeSource::default()
        });
    });
    let back = translate_in_tree_pv_to_csi(&beta).and_then(|csi| translate_csi_pv_to_in_tree(&csi));
    assert_eq!(
        back.map(|pv| pv.spec.and_then(|s| s.node_affinity)),
        Ok(affinity(&[&[
            (BETA_ZONE, "us-east-1a"),
            (GA_REGION, "us-east-1"),
            (BETA_REGION, "us-east-1"),
        ]]))
    );

    // vSphere: the CSI form of an in-tree PV has no initialvolumefilepath
    // (the driver adds it when it provisions), so it cannot go back.
    let vsphere = with(|pv| {
        spec(pv).vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
            volume_path: "[ds1] v.vmdk".to_owned(),
            ..VsphereVirtualDiskVolumeSource::default()
        });
    });
    let csi = translate_in_tree_pv_to_csi(&vsphere).expect("to CSI");
    assert_eq!(
        translate_csi_pv_to_in_tree(&csi),
        Err(MigrationError::MissingVsphereVolumePath)
    );
}

/// CSI PVs as the sidecar builds them, to in-tree and back: the handle and
/// the driver's topology keys survive.
#[test]
fn csi_round_trips() {
    let topology = |pv: &mut PersistentVolume, key: &str, zone: &str| {
        spec(pv).node_affinity = affinity(&[&[(key, zone)]]);
    };
    let cases: Vec<(&str, PersistentVolume)> = vec![
        (
            "aws",
            with(|pv| {
                spec(pv).csi = Some(CSIPersistentVolumeSource {
                    fs_type: Some("ext4".to_owned()),
                    ..csi("ebs.csi.aws.com", "vol-1")
                });
                topology(pv, "topology.ebs.csi.aws.com/zone", "us-east-1a");
            }),
        ),
        (
            "gce",
            with(|pv| {
                spec(pv).csi = Some(csi(
                    "pd.csi.storage.gke.io",
                    "projects/UNSPECIFIED/zones/us-central1-a/disks/pvc-1",
                ));
                topology(pv, "topology.gke.io/zone", "us-central1-a");
            }),
        ),
        (
            "cinder",
            with(|pv| {
                spec(pv).csi = Some(csi("cinder.csi.openstack.org", "uuid-1"));
                topology(pv, "topology.cinder.csi.openstack.org/zone", "nova");
            }),
        ),
        (
            "azure disk",
            with(|pv| {
                spec(pv).csi = Some(csi("disk.csi.azure.com", AZURE_URI));
                topology(pv, "topology.disk.csi.azure.com/zone", "eastus-1");
            }),
        ),
        (
            "portworx",
            with(|pv| spec(pv).csi = Some(csi("pxd.portworx.com", "px-1"))),
        ),
    ];
    for (name, csi_form) in cases {
        let back = translate_csi_pv_to_in_tree(&csi_form)
            .and_then(|in_tree| translate_in_tree_pv_to_csi(&in_tree))
            .expect(name);
        let original = csi_form.spec.as_ref().expect("spec");
        let spec = back.spec.as_ref().expect("spec");
        let source = spec.csi.as_ref().expect("csi");
        let expected = original.csi.as_ref().expect("csi");
        assert_eq!(source.driver, expected.driver, "{name}");
        assert_eq!(source.volume_handle, expected.volume_handle, "{name}");
        let driver_key =
            InTreePlugin::from_csi_driver(&expected.driver).and_then(InTreePlugin::topology_key);
        if let Some(key) = driver_key
            && original.node_affinity.is_some()
        {
            let keys: Vec<&str> = spec
                .node_affinity
                .iter()
                .filter_map(|a| a.required.as_ref())
                .flat_map(|r| &r.node_selector_terms)
                .flat_map(|t| t.match_expressions.iter().flatten())
                .map(|e| e.key.as_str())
                .collect();
            assert!(keys.contains(&key), "{name}: {keys:?}");
            assert!(!keys.contains(&GA_ZONE), "{name}: {keys:?}");
        }
    }
}

#[test]
fn gce_access_modes_as_the_in_tree_plugin_used_them() {
    let cases: &[(&[&str], &str)] = &[
        (&["ReadWriteOnce"], "ReadWriteOnce"),
        (&["ReadWriteMany"], "ReadWriteOnce"),
        (&["ReadOnlyMany"], "ReadOnlyMany"),
        (&["ReadOnlyMany", "ReadWriteOnce"], "ReadWriteOnce"),
        (&["ReadOnlyMany", "ReadWriteMany"], "ReadWriteOnce"),
        (&["ReadWriteOncePod"], "ReadWriteOnce"),
        (&[], "ReadWriteOnce"),
    ];
    for (modes, expected) in cases {
        let modes = modes.iter().map(|m| (*m).to_owned()).collect();
        assert_eq!(gce_access_modes(modes), vec![(*expected).to_owned()]);
    }
}
