use std::collections::HashMap;

use super::*;
use csi_proto::v1::{Topology, TopologyRequirement, Volume, VolumeContentSource};
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::provision::fixtures::{
    CLAIM_UID, DRIVER, VOLUME, claim, claim_spec, class, config, map, planned,
};
use crate::provision::secrets::SecretRef;

fn plan_for(
    claim: &crate::projection::PersistentVolumeClaim,
    config: &ProvisionerConfig,
) -> ProvisionPlan {
    planned(claim, &class(), config)
}

fn response(volume_id: &str, capacity_bytes: i64) -> CreateVolumeResponse {
    CreateVolumeResponse {
        volume: Some(Volume {
            volume_id: volume_id.to_owned(),
            capacity_bytes,
            volume_context: HashMap::from([("ctx".to_owned(), "1".to_owned())]),
            ..Volume::default()
        }),
    }
}

fn zone(value: &str) -> Topology {
    Topology {
        segments: HashMap::from([("zone".to_owned(), value.to_owned())]),
    }
}

#[test]
fn pv_of_a_basic_claim() {
    let plan = plan_for(&claim(), &config());
    let pv = build_pv(&plan, &response("vol-1", 2 << 30), &config()).expect("pv");
    let expected = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(VOLUME.to_owned()),
            annotations: Some(map(&[
                (wk::ANN_PROVISIONED_BY, DRIVER),
                (wk::ANN_DELETION_SECRET_NAME, ""),
                (wk::ANN_DELETION_SECRET_NAMESPACE, ""),
            ])),
            finalizers: Some(vec![wk::FINALIZER_PV.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("2Gi".to_owned()),
            )])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: Some("ns".to_owned()),
                name: Some("data".to_owned()),
                uid: Some(CLAIM_UID.to_owned()),
                resource_version: Some("42".to_owned()),
                field_path: None,
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.to_owned(),
                volume_handle: "vol-1".to_owned(),
                volume_attributes: Some(map(&[
                    ("ctx", "1"),
                    (
                        wk::VOLUME_ATTR_PROVISIONER_IDENTITY,
                        "1700000000000-1234-hostpath.csi.k8s.io",
                    ),
                ])),
                ..CSIPersistentVolumeSource::default()
            }),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            storage_class_name: Some("fast".to_owned()),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    };
    assert_eq!(pv, expected);
}

#[test]
fn capacity_rules() {
    let plan = plan_for(&claim(), &config());
    let capacity = |bytes| {
        build_pv(&plan, &response("vol-1", bytes), &config()).map(|pv| {
            pv.spec.expect("spec").capacity.expect("capacity")["storage"]
                .0
                .clone()
        })
    };
    assert_eq!(
        capacity(0),
        Ok("1Gi".to_owned()),
        "unknown capacity records the request"
    );
    assert_eq!(capacity(1 << 30), Ok("1Gi".to_owned()));
    assert_eq!(capacity((1 << 30) + 1), Ok("1073741825".to_owned()));
    assert_eq!(
        capacity((1 << 30) - 1),
        Err(PvBuildError::CapacityTooSmall {
            returned: (1 << 30) - 1,
            requested: 1 << 30
        })
    );
    assert_eq!(capacity(-5), Err(PvBuildError::NegativeCapacity(-5)));
}

#[test]
fn unusable_responses() {
    let plan = plan_for(&claim(), &config());
    let none = CreateVolumeResponse { volume: None };
    assert_eq!(
        build_pv(&plan, &none, &config()),
        Err(PvBuildError::MissingVolume)
    );
    assert_eq!(PvBuildError::MissingVolume.volume_to_delete(&none), None);
    let empty_id = response("", 1 << 30);
    assert_eq!(
        build_pv(&plan, &empty_id, &config()),
        Err(PvBuildError::EmptyVolumeId)
    );
    assert_eq!(
        PvBuildError::EmptyVolumeId.volume_to_delete(&empty_id),
        None
    );
    let small = response("vol-9", 1);
    let error = build_pv(&plan, &small, &config()).expect_err("too small");
    assert_eq!(error.volume_to_delete(&small), Some("vol-9"));

    let mut cloned = plan.clone();
    cloned.has_data_source = true;
    assert_eq!(
        build_pv(&cloned, &response("vol-1", 0), &config()),
        Err(PvBuildError::MissingContentSource)
    );
    let mut with_source = response("vol-1", 0);
    if let Some(volume) = with_source.volume.as_mut() {
        volume.content_source = Some(VolumeContentSource::default());
    }
    assert!(build_pv(&cloned, &with_source, &config()).is_ok());
}

#[test]
fn topology_becomes_node_affinity_even_outside_the_request() {
    let topology = ProvisionerConfig {
        topology_enabled: true,
        ..config()
    };
    let mut plan = plan_for(&claim(), &config());
    plan.request.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![zone("a"), zone("b")],
        preferred: vec![zone("a"), zone("b")],
    });
    let mut inside = response("vol-1", 0);
    if let Some(volume) = inside.volume.as_mut() {
        volume.accessible_topology = vec![zone("b")];
    }
    let pv = build_pv(&plan, &inside, &topology).expect("pv");
    assert_eq!(
        pv.spec.expect("spec").node_affinity,
        Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "zone".to_owned(),
                        operator: "In".to_owned(),
                        values: Some(vec!["b".to_owned()]),
                    }]),
                    match_fields: None,
                }],
            }),
        })
    );
    // Without topology support the returned topology is not recorded.
    let pv = build_pv(&plan, &inside, &config()).expect("pv");
    assert_eq!(pv.spec.expect("spec").node_affinity, None);

    let mut outside = response("vol-1", 0);
    if let Some(volume) = outside.volume.as_mut() {
        volume.accessible_topology = vec![zone("c")];
    }
    // Outside the requisite: recorded as the driver answered (the Go
    // image's `Provision`), with a warning for the claim.
    let pv = build_pv(&plan, &outside, &topology).expect("pv");
    assert_eq!(
        pv.spec.expect("spec").node_affinity,
        Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "zone".into(),
                        operator: "In".into(),
                        values: Some(vec!["c".into()]),
                    }]),
                    ..Default::default()
                }],
            }),
        })
    );
    assert_eq!(
        topology_outside_requisite(&plan, &outside, &topology).as_deref(),
        Some(
            "created volume is accessible from [{\"zone\": \"c\"}], outside the requested topology [{\"zone\": \"a\"}, {\"zone\": \"b\"}]; recorded on the PV as the driver answered"
        )
    );
    assert_eq!(topology_outside_requisite(&plan, &inside, &topology), None);
    assert_eq!(
        topology_outside_requisite(&plan, &outside, &config()),
        None,
        "topology off"
    );
}

#[test]
fn secrets_modes_and_flags() {
    let mut claim = claim();
    claim_spec(&mut claim).access_modes = Some(vec!["ReadOnlyMany".into()]);
    claim_spec(&mut claim).volume_mode = Some("Block".into());
    claim_spec(&mut claim).volume_attributes_class_name = None;
    let readonly = ProvisionerConfig {
        controller_publish_readonly: true,
        honor_pv_reclaim_policy: false,
        ..config()
    };
    let mut plan = plan_for(&claim, &readonly);
    let secret = |name: &str| {
        Some(SecretRef {
            name: name.to_owned(),
            namespace: "sec".to_owned(),
        })
    };
    plan.fs_type = "xfs".to_owned();
    plan.provisioner_secret = secret("prov");
    plan.pv_secrets = super::super::plan::PvSecretRefs {
        controller_publish: secret("cp"),
        node_stage: secret("ns"),
        node_publish: secret("np"),
        controller_expand: secret("ce"),
        node_expand: secret("ne"),
        controller_modify: secret("cm"),
    };
    plan.mount_options = vec!["ro".to_owned()];
    plan.volume_attributes_class_name = Some("gold".to_owned());
    let pv = build_pv(&plan, &response("vol-1", 0), &readonly).expect("pv");
    let annotations = pv.metadata.annotations.clone().expect("annotations");
    assert_eq!(annotations[wk::ANN_DELETION_SECRET_NAME], "prov");
    assert_eq!(annotations[wk::ANN_DELETION_SECRET_NAMESPACE], "sec");
    assert_eq!(annotations[wk::ANN_CONTROLLER_MODIFY_SECRET_NAME], "cm");
    assert_eq!(
        annotations[wk::ANN_CONTROLLER_MODIFY_SECRET_NAMESPACE],
        "sec"
    );
    assert_eq!(
        pv.metadata.finalizers, None,
        "no finalizer with the gate off"
    );
    let spec = pv.spec.expect("spec");
    let csi = spec.csi.expect("csi");
    let reference = |name: &str| {
        Some(SecretReference {
            name: Some(name.to_owned()),
            namespace: Some("sec".to_owned()),
        })
    };
    assert_eq!(csi.controller_publish_secret_ref, reference("cp"));
    assert_eq!(csi.node_stage_secret_ref, reference("ns"));
    assert_eq!(csi.node_publish_secret_ref, reference("np"));
    assert_eq!(csi.controller_expand_secret_ref, reference("ce"));
    assert_eq!(csi.node_expand_secret_ref, reference("ne"));
    assert_eq!(csi.fs_type, None, "block volumes have no fsType");
    assert_eq!(csi.read_only, Some(true), "ReadOnlyMany only");
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(spec.mount_options, Some(vec!["ro".to_owned()]));
    assert_eq!(spec.volume_attributes_class_name.as_deref(), Some("gold"));

    // Read-only needs the flag, and a single ReadOnlyMany mode.
    let pv = build_pv(&plan, &response("vol-1", 0), &config()).expect("pv");
    assert_eq!(pv.spec.expect("spec").csi.expect("csi").read_only, None);
    let mut two_modes = claim.clone();
    claim_spec(&mut two_modes).access_modes =
        Some(vec!["ReadOnlyMany".into(), "ReadWriteMany".into()]);
    let plan = plan_for(&two_modes, &readonly);
    let pv = build_pv(&plan, &response("vol-1", 0), &readonly).expect("pv");
    assert_eq!(pv.spec.expect("spec").csi.expect("csi").read_only, None);
}

#[test]
fn filesystem_volumes_record_the_fstype() {
    let mut plan = plan_for(&claim(), &config());
    plan.fs_type = "ext4".to_owned();
    let pv = build_pv(&plan, &response("vol-1", 0), &config()).expect("pv");
    assert_eq!(
        pv.spec.expect("spec").csi.expect("csi").fs_type.as_deref(),
        Some("ext4")
    );
}

fn gp2_plan(config: &ProvisionerConfig, class: &crate::projection::StorageClass) -> ProvisionPlan {
    planned(&crate::provision::fixtures::gp2_claim(), class, config)
}

/// CSI migration: what the Go sidecar saved for EKS's gp2 class —
/// provisioned-by the in-tree plugin, migrated-to the driver, our finalizer,
/// and `awsElasticBlockStore: {volumeID: <CSI volume id>, fsType: ext4}`.
#[test]
fn migrated_pv_is_saved_in_its_in_tree_form() {
    use crate::provision::fixtures::{AWS_EBS_PLUGIN, EBS_DRIVER, ebs_config, gp2_class};
    use k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource;

    let ebs = ebs_config();
    let plan = gp2_plan(&ebs, &gp2_class());
    let pv = build_pv(&plan, &response("vol-0123", 1 << 30), &ebs).expect("pv");
    let expected = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(VOLUME.to_owned()),
            annotations: Some(map(&[
                (wk::ANN_PROVISIONED_BY, AWS_EBS_PLUGIN),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
                (wk::ANN_DELETION_SECRET_NAME, ""),
                (wk::ANN_DELETION_SECRET_NAMESPACE, ""),
            ])),
            finalizers: Some(vec![wk::FINALIZER_PV.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: "vol-0123".to_owned(),
                fs_type: Some("ext4".to_owned()),
                ..AWSElasticBlockStoreVolumeSource::default()
            }),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("1Gi".to_owned()),
            )])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: Some("ns".to_owned()),
                name: Some("data".to_owned()),
                uid: Some(CLAIM_UID.to_owned()),
                resource_version: Some("42".to_owned()),
                field_path: None,
            }),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            storage_class_name: Some("gp2".to_owned()),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    };
    assert_eq!(pv, expected);
    // The saved PV is ours: the volume loop finds and deletes it.
    // As the volume cache will hold it.
    let cached = crate::projection::Projection::project(&pv);
    assert!(crate::provision::is_our_volume(&cached, &ebs));
    assert_eq!(
        crate::provision::plan_delete(&cached, None).map(|plan| plan.volume_id),
        Ok("vol-0123".to_owned())
    );

    // A native class of the same driver gets a CSI PV.
    let native = crate::projection::StorageClass {
        provisioner: EBS_DRIVER.to_owned(),
        ..gp2_class()
    };
    let pv = build_pv(&gp2_plan(&ebs, &native), &response("vol-0123", 0), &ebs).expect("pv");
    let annotations = pv.metadata.annotations.expect("annotations");
    assert_eq!(annotations[wk::ANN_PROVISIONED_BY], EBS_DRIVER);
    assert!(!annotations.contains_key(wk::ANN_MIGRATED_TO));
    assert!(pv.spec.expect("spec").csi.is_some());
}

#[test]
fn migrated_pv_topology_uses_the_in_tree_keys() {
    use crate::provision::fixtures::{ebs_config, gp2_class};

    let topology = ProvisionerConfig {
        topology_enabled: true,
        ..ebs_config()
    };
    // Planned without nodes to aggregate (no requirement sent); the PV
    // records what the driver answered.
    let plan = gp2_plan(&ebs_config(), &gp2_class());
    let mut answer = response("vol-0123", 0);
    if let Some(volume) = answer.volume.as_mut() {
        volume.accessible_topology = vec![Topology {
            segments: HashMap::from([(
                "topology.ebs.csi.aws.com/zone".to_owned(),
                "us-east-1a".to_owned(),
            )]),
        }];
    }
    let pv = build_pv(&plan, &answer, &topology).expect("pv");
    assert_eq!(
        pv.metadata.labels,
        Some(map(&[
            ("topology.kubernetes.io/region", "us-east-1"),
            ("topology.kubernetes.io/zone", "us-east-1a"),
        ]))
    );
    let in_ = |key: &str, value: &str| NodeSelectorRequirement {
        key: key.to_owned(),
        operator: "In".to_owned(),
        values: Some(vec![value.to_owned()]),
    };
    assert_eq!(
        pv.spec.expect("spec").node_affinity,
        Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![
                        in_("topology.kubernetes.io/zone", "us-east-1a"),
                        in_("topology.kubernetes.io/region", "us-east-1"),
                    ]),
                    match_fields: None,
                }],
            }),
        })
    );

    // A key the translation does not know: upstream's "failed to translate
    // topology", and the created volume must be deleted again.
    let mut unknown = response("vol-0123", 0);
    if let Some(volume) = unknown.volume.as_mut() {
        volume.accessible_topology = vec![Topology {
            segments: HashMap::from([(
                "topology.hostpath.csi/node".to_owned(),
                "node-1".to_owned(),
            )]),
        }];
    }
    let error = build_pv(&plan, &unknown, &topology).expect_err("unknown key");
    assert!(
        matches!(
            error,
            PvBuildError::InTreeTranslation(crate::migration::MigrationError::Topology(_))
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("failed to translate topology"),
        "{error}"
    );
    assert_eq!(error.volume_to_delete(&unknown), Some("vol-0123"));
}

#[test]
fn migrated_pv_with_a_malformed_handle() {
    use crate::migration::{InTreePlugin, MigrationError};
    use crate::provision::fixtures::gp2_class;

    let gce = ProvisionerConfig {
        driver_name: InTreePlugin::GcePd.csi_driver().to_owned(),
        ..config()
    };
    let class = crate::projection::StorageClass {
        provisioner: InTreePlugin::GcePd.in_tree_name().to_owned(),
        ..gp2_class()
    };
    let plan = gp2_plan(&gce, &class);
    let answer = response("disk-without-project", 0);
    let error = build_pv(&plan, &answer, &gce).expect_err("bad handle");
    assert_eq!(
        error,
        PvBuildError::InTreeTranslation(MigrationError::InvalidGcePdHandle {
            handle: "disk-without-project".to_owned()
        })
    );
    assert_eq!(
        error.volume_to_delete(&answer),
        Some("disk-without-project")
    );
    let good = build_pv(
        &plan,
        &response("projects/p/zones/us-central1-a/disks/pvc-1", 0),
        &gce,
    )
    .expect("pv");
    assert_eq!(
        good.spec
            .and_then(|spec| spec.gce_persistent_disk)
            .map(|pd| pd.pd_name),
        Some("pvc-1".to_owned())
    );
}

/// A 409 on our PV create: the PV there is ours (an earlier attempt whose
/// answer was lost) only when it records the same claim and backend volume;
/// two in-tree PVs (no CSI handle) are compared by their translated ids.
#[test]
fn records_same_volume_compares_claim_and_backend_id() {
    use crate::provision::fixtures::{migrated_volume, released_volume};
    // Full objects, as the create path compares them.
    let csi = crate::projection::Projection::to_object(&released_volume());
    let in_tree = crate::projection::Projection::to_object(&migrated_volume());
    let with_claim_uid = |pv: &PersistentVolume, uid: &str| {
        let mut pv = pv.clone();
        if let Some(c) = pv.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
            c.uid = Some(uid.to_owned());
        }
        pv
    };
    let with_ebs_id = |id: &str| {
        let mut pv = in_tree.clone();
        if let Some(ebs) = pv
            .spec
            .as_mut()
            .and_then(|s| s.aws_elastic_block_store.as_mut())
        {
            ebs.volume_id = id.to_owned();
        }
        pv
    };
    let with_handle = |handle: &str| {
        let mut pv = csi.clone();
        if let Some(c) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
            c.volume_handle = handle.to_owned();
        }
        pv
    };
    let mut no_source = csi.clone();
    if let Some(spec) = no_source.spec.as_mut() {
        spec.csi = None;
    }
    let cases: Vec<(&str, PersistentVolume, PersistentVolume, bool)> = vec![
        ("same CSI PV", csi.clone(), csi.clone(), true),
        ("same in-tree PV", in_tree.clone(), in_tree.clone(), true),
        (
            "in-tree volume id with and without its zone",
            in_tree.clone(),
            with_ebs_id("vol-0123"),
            true,
        ),
        (
            "in-tree PVs of the same claim, different volumes",
            in_tree.clone(),
            with_ebs_id("vol-0456"),
            false,
        ),
        (
            "CSI PVs, different handles",
            csi.clone(),
            with_handle("handle-2"),
            false,
        ),
        (
            "another claim",
            csi.clone(),
            with_claim_uid(&csi, "other-uid"),
            false,
        ),
        ("no readable volume id", no_source.clone(), no_source, false),
    ];
    for (what, existing, wanted, same) in cases {
        assert_eq!(records_same_volume(&existing, &wanted), same, "{what}");
    }
}

/// A Retain volume whose claim went away before its PV was saved is
/// recorded in the PV it would have been (what the journal holds allows):
/// same name, handle, size, modes, claim and node affinity.
#[test]
fn a_retained_volume_is_recorded_as_its_claim_would_have_had_it() {
    let config = config();
    let plan = plan_for(&claim(), &config);
    let mut answer = response("vol-1", 2 << 30);
    if let Some(volume) = answer.volume.as_mut() {
        volume.accessible_topology = vec![zone("a")];
    }
    let built = build_pv(&plan, &answer, &config).expect("pv");
    let volume = answer.volume.as_ref().expect("volume");
    let retained = retained_volume_pv(&plan.claim, &plan.request, volume, &config);
    assert!(records_same_volume(&built, &retained));
    assert_eq!(retained.metadata.name, built.metadata.name);
    assert_eq!(retained.metadata.finalizers, None);
    let (spec, want) = (
        retained.spec.as_ref().expect("spec"),
        built.spec.as_ref().expect("spec"),
    );
    assert_eq!(spec.access_modes, want.access_modes);
    assert_eq!(spec.capacity, want.capacity);
    assert_eq!(spec.node_affinity, want.node_affinity);
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    let (csi, want_csi) = (
        spec.csi.as_ref().expect("csi"),
        want.csi.as_ref().expect("csi"),
    );
    assert_eq!(csi.volume_handle, want_csi.volume_handle);
    assert_eq!(csi.fs_type, want_csi.fs_type);
    assert_eq!(csi.volume_attributes, want_csi.volume_attributes);
    let (claim_ref, want_ref) = (
        spec.claim_ref.as_ref().expect("claimRef"),
        want.claim_ref.as_ref().expect("claimRef"),
    );
    assert_eq!(
        (&claim_ref.namespace, &claim_ref.name, &claim_ref.uid),
        (&want_ref.namespace, &want_ref.name, &want_ref.uid)
    );
    assert_eq!(
        retained
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(wk::ANN_PROVISIONED_BY)),
        Some(&DRIVER.to_owned())
    );
}

#[test]
fn a_retained_volume_keeps_its_access_modes_and_block_mode() {
    use csi_proto::v1::VolumeCapability;
    use csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
    let config = config();
    let mut plan = plan_for(&claim(), &config);
    let cases = [
        (Mode::SingleNodeWriter, "ReadWriteOnce"),
        (Mode::SingleNodeSingleWriter, "ReadWriteOncePod"),
        (Mode::MultiNodeReaderOnly, "ReadOnlyMany"),
        (Mode::MultiNodeMultiWriter, "ReadWriteMany"),
    ];
    for (mode, want) in cases {
        plan.request.volume_capabilities = vec![VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        }];
        let answer = response("vol-1", 0);
        let volume = answer.volume.as_ref().expect("volume");
        let pv = retained_volume_pv(&plan.claim, &plan.request, volume, &config);
        let spec = pv.spec.expect("spec");
        assert_eq!(spec.access_modes, Some(vec![want.to_owned()]), "{mode:?}");
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert_eq!(spec.csi.and_then(|c| c.fs_type), None);
        // No capacity in the answer: the request's.
        let requested = plan
            .request
            .capacity_range
            .as_ref()
            .map(|r| r.required_bytes);
        assert_eq!(
            spec.capacity.and_then(|c| c.get("storage").cloned()),
            requested.map(bytes_to_quantity)
        );
    }
}

#[test]
fn copied_claim_metadata_never_overwrites_the_pvs_own() {
    use crate::provision::claim_metadata::CopiedMetadata;
    let plain = plan_for(&claim(), &config());
    let go_pv = build_pv(&plain, &response("vol-1", 2 << 30), &config()).expect("pv");
    assert_eq!(
        go_pv.metadata.labels, None,
        "nothing copied: no labels at all"
    );

    let mut plan = plain.clone();
    plan.copied_metadata = CopiedMetadata {
        labels: map(&[("team", "storage")]),
        annotations: map(&[
            (wk::ANN_PROVISIONED_BY, "someone-else"),
            (wk::ANN_DELETION_SECRET_NAME, "stolen"),
            ("cost-center", "cc-42"),
        ]),
    };
    let pv = build_pv(&plan, &response("vol-1", 2 << 30), &config()).expect("pv");
    assert_eq!(pv.metadata.labels, Some(map(&[("team", "storage")])));
    let mut want = go_pv.metadata.annotations.clone().expect("annotations");
    want.insert("cost-center".to_owned(), "cc-42".to_owned());
    assert_eq!(pv.metadata.annotations, Some(want));
    assert_eq!(
        pv.metadata.annotations.as_ref().expect("annotations")[wk::ANN_PROVISIONED_BY],
        DRIVER
    );
    assert_eq!(
        without_labels_and(&pv, "cost-center"),
        go_pv,
        "everything else is the Go image's PV"
    );
}

/// `pv` without labels and without the annotation `annotation`.
fn without_labels_and(pv: &PersistentVolume, annotation: &str) -> PersistentVolume {
    let mut without = pv.clone();
    without.metadata.labels = None;
    if let Some(annotations) = without.metadata.annotations.as_mut() {
        annotations.remove(annotation);
    }
    without
}

#[test]
fn copied_claim_metadata_on_an_in_tree_pv() {
    use crate::provision::claim_metadata::CopiedMetadata;
    let config = crate::provision::fixtures::ebs_config();
    let mut plan = gp2_plan(&config, &crate::provision::fixtures::gp2_class());
    plan.copied_metadata = CopiedMetadata {
        labels: map(&[("team", "storage")]),
        annotations: map(&[(wk::ANN_PROVISIONED_BY, "x"), ("note", "n")]),
    };
    let pv = build_pv(&plan, &response("vol-1", 2 << 30), &config).expect("pv");
    let annotations = pv.metadata.annotations.clone().expect("annotations");
    assert_eq!(annotations[wk::ANN_PROVISIONED_BY], "kubernetes.io/aws-ebs");
    assert_eq!(annotations["note"], "n");
    assert_eq!(
        pv.metadata.labels.as_ref().and_then(|l| l.get("team")),
        Some(&"storage".to_owned())
    );
}

/// `ClaimMetadataPropagation`: the volume context entries the class lists
/// go on the PV after the PV's own keys and the claim's copies, never
/// replacing one; an invalid label value is left off (and reported by
/// `skipped_volume_context`) while the PV is still built.
#[test]
fn volume_context_entries_on_the_pv() {
    use crate::provision::claim_metadata::{CopiedMetadata, VolumeContextKeys};
    let plain = plan_for(&claim(), &config());
    let answer = CreateVolumeResponse {
        volume: Some(Volume {
            volume_id: "vol-1".into(),
            capacity_bytes: 2 << 30,
            volume_context: HashMap::from(
                [
                    ("zone", "us-east-1a"),
                    ("tier", "Gold Tier"),
                    ("team", "from-driver"),
                    ("pool", "p1"),
                    (wk::ANN_PROVISIONED_BY, "driver-says"),
                ]
                .map(|(k, v)| (k.to_owned(), v.to_owned())),
            ),
            ..Volume::default()
        }),
    };
    let go_pv = build_pv(&plain, &answer, &config()).expect("pv");
    assert_eq!(go_pv.metadata.labels, None, "nothing listed, nothing added");
    assert!(skipped_volume_context(&plain, &answer).is_empty());

    let mut plan = plain.clone();
    plan.copied_metadata = CopiedMetadata {
        labels: map(&[("team", "storage")]),
        annotations: BTreeMap::new(),
    };
    plan.volume_context_keys = VolumeContextKeys {
        labels: ["absent", "team", "tier", "zone"]
            .map(String::from)
            .to_vec(),
        // A key the PV has (only listable by a plan made by hand: the
        // plan refuses volume-machinery keys) is not replaced.
        annotations: ["pool", wk::ANN_PROVISIONED_BY].map(String::from).to_vec(),
    };
    let pv = build_pv(&plan, &answer, &config()).expect("pv");
    assert_eq!(
        pv.metadata.labels,
        Some(map(&[("team", "storage"), ("zone", "us-east-1a")])),
        "the claim's copy stays; the invalid value is left off"
    );
    let annotations = pv.metadata.annotations.clone().expect("annotations");
    assert_eq!(annotations["pool"], "p1");
    assert_eq!(annotations[wk::ANN_PROVISIONED_BY], DRIVER);
    // What each entry says is claim_metadata_tests.rs's.
    let skipped = skipped_volume_context(&plan, &answer);
    assert_eq!(
        skipped
            .iter()
            .map(|entry| (entry.key.as_str(), entry.what))
            .collect::<Vec<_>>(),
        [("tier", "a label")]
    );
    assert!(
        skipped_volume_context(&plan, &CreateVolumeResponse { volume: None }).is_empty(),
        "no volume, nothing to report"
    );
    assert_eq!(
        without_labels_and(&pv, "pool"),
        go_pv,
        "everything else is the Go image's PV"
    );
}
