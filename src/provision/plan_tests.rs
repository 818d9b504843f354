use super::*;
use csi_proto::quantity::{QuantityError, QuantityErrorKind};
use csi_proto::v1::TopologyRequirement;
use k8s_openapi::api::core::v1::TypedLocalObjectReference;
use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::provision::claim_metadata::CopiedMetadata;
use crate::provision::content_source::DataSourceObjects;
use crate::provision::fixtures::{
    CLAIM_UID, DRIVER, VOLUME, annotate, claim, claim_spec, class, config, inputs, map,
    source_claim, source_volume,
};
use crate::provision::secrets::SecretError;
use crate::provision::topology::TopologyError;

fn plan(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    config: &ProvisionerConfig,
) -> Result<ProvisionPlan, ProvisionError> {
    plan_provision(&inputs(claim, class), config)
}

fn mount(fs_type: &str, flags: &[&str], mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode.into() }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            volume_mount_group: String::new(),
        })),
    }
}

fn class_with(params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        parameters: Some(map(params)),
        ..class()
    }
}

#[test]
fn volume_names() {
    let uid = CLAIM_UID;
    assert_eq!(volume_name("pvc", uid, None), Ok(VOLUME.to_owned()));
    assert_eq!(
        volume_name("pvc", uid, Some(8)),
        Ok("pvc-0a1b2c3d".to_owned())
    );
    assert_eq!(volume_name("x", uid, Some(0)), Ok("x-".to_owned()));
    assert_eq!(
        volume_name("p", uid, Some(32)),
        Ok("p-0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d".to_owned())
    );
    assert_eq!(
        volume_name("p", uid, Some(33)),
        Err(ProvisionError::UuidLengthTooLong {
            length: 33,
            available: 32
        })
    );
    assert_eq!(
        volume_name("", uid, None),
        Err(ProvisionError::EmptyVolumeNamePrefix)
    );
    assert_eq!(
        volume_name("pvc", "", None),
        Err(ProvisionError::MissingClaimUid)
    );
}

#[test]
fn selected_node_and_class_names() {
    let mut claim = claim();
    assert_eq!(selected_node_name(&claim), None);
    annotate(&mut claim.metadata, wk::ANN_ALPHA_SELECTED_NODE, "alpha");
    assert_eq!(selected_node_name(&claim), Some("alpha"));
    annotate(&mut claim.metadata, wk::ANN_SELECTED_NODE, "ga");
    assert_eq!(selected_node_name(&claim), Some("ga"));
    annotate(&mut claim.metadata, wk::ANN_SELECTED_NODE, "");
    assert_eq!(
        selected_node_name(&claim),
        None,
        "an empty GA annotation hides the alpha one"
    );

    assert_eq!(claim_class_name(&claim), "fast");
    annotate(&mut claim.metadata, wk::ANN_BETA_STORAGE_CLASS, "beta");
    assert_eq!(claim_class_name(&claim), "beta");
    let mut classless = crate::provision::fixtures::claim();
    claim_spec(&mut classless).storage_class_name = None;
    assert_eq!(claim_class_name(&classless), "");
}

#[test]
fn basic_plan() {
    let plan = plan(&claim(), &class(), &config()).expect("plan");
    assert_eq!(plan.volume_name, VOLUME);
    assert_eq!(
        plan.request,
        CreateVolumeRequest {
            name: VOLUME.to_owned(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0
            }),
            volume_capabilities: vec![mount("", &[], Mode::SingleNodeWriter)],
            ..CreateVolumeRequest::default()
        }
    );
    assert_eq!(
        plan.claim,
        ClaimIdentity {
            namespace: "ns".to_owned(),
            name: "data".to_owned(),
            uid: CLAIM_UID.to_owned(),
            resource_version: Some("42".to_owned()),
        }
    );
    assert_eq!(plan.provisioner_secret, None);
    assert_eq!(plan.pv_secrets, PvSecretRefs::default());
    assert_eq!(plan.source_finalizer, None);
    assert_eq!(plan.reclaim_policy, "Delete");
    assert_eq!(plan.storage_class_name, "fast");
    assert_eq!(plan.access_modes, vec!["ReadWriteOnce".to_owned()]);
    assert_eq!(plan.volume_mode, None);
    assert!(!plan.is_block());
    assert!(!plan.has_data_source);
    assert_eq!(plan.selected_node, None);
}

#[test]
fn access_modes_map_as_csi_lib_utils() {
    let cases: &[(&str, bool, Mode)] = &[
        ("ReadWriteOnce", false, Mode::SingleNodeWriter),
        ("ReadWriteOnce", true, Mode::SingleNodeMultiWriter),
        ("ReadWriteOncePod", false, Mode::SingleNodeWriter),
        ("ReadWriteOncePod", true, Mode::SingleNodeSingleWriter),
        ("ReadOnlyMany", false, Mode::MultiNodeReaderOnly),
        ("ReadOnlyMany", true, Mode::MultiNodeReaderOnly),
        ("ReadWriteMany", false, Mode::MultiNodeMultiWriter),
        ("ReadWriteMany", true, Mode::MultiNodeMultiWriter),
    ];
    for (mode, snmw, expected) in cases {
        assert_eq!(csi_access_mode(mode, *snmw), Ok(*expected), "{mode} {snmw}");
    }
    assert_eq!(
        csi_access_mode("ReadWriteSometimes", false),
        Err(ProvisionError::UnsupportedAccessMode(
            "ReadWriteSometimes".to_owned()
        ))
    );
}

#[test]
fn one_capability_per_access_mode_with_mount_options_and_fstype() {
    let mut claim = claim();
    claim_spec(&mut claim).access_modes = Some(vec!["ReadOnlyMany".into(), "ReadWriteMany".into()]);
    let class = StorageClass {
        mount_options: Some(vec!["noatime".to_owned(), "debug".to_owned()]),
        ..class_with(&[(wk::PARAM_FSTYPE, "xfs")])
    };
    let plan = plan(&claim, &class, &config()).expect("plan");
    assert_eq!(
        plan.request.volume_capabilities,
        vec![
            mount("xfs", &["noatime", "debug"], Mode::MultiNodeReaderOnly),
            mount("xfs", &["noatime", "debug"], Mode::MultiNodeMultiWriter),
        ]
    );
    assert_eq!(
        plan.mount_options,
        vec!["noatime".to_owned(), "debug".to_owned()]
    );
    assert_eq!(plan.fs_type, "xfs");
}

#[test]
fn block_volumes_have_no_mount() {
    let mut claim = claim();
    claim_spec(&mut claim).volume_mode = Some("Block".into());
    let plan = plan(&claim, &class_with(&[(wk::PARAM_FSTYPE, "xfs")]), &config()).expect("plan");
    assert_eq!(
        plan.request.volume_capabilities,
        vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter.into()
            }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        }]
    );
    assert!(plan.is_block());
}

#[test]
fn fstype_sources() {
    let with_default = ProvisionerConfig {
        default_fstype: "ext4".to_owned(),
        ..config()
    };
    let fs = |params: &[(&str, &str)], config: &ProvisionerConfig| {
        plan(&claim(), &class_with(params), config).map(|p| p.fs_type)
    };
    assert_eq!(fs(&[], &config()), Ok(String::new()));
    assert_eq!(fs(&[], &with_default), Ok("ext4".to_owned()));
    assert_eq!(
        fs(&[(wk::PARAM_FSTYPE, "xfs")], &with_default),
        Ok("xfs".to_owned())
    );
    assert_eq!(
        fs(&[(wk::PARAM_FSTYPE, "")], &with_default),
        Ok("ext4".to_owned())
    );
    assert_eq!(
        fs(&[("FsType", "btrfs")], &with_default),
        Ok("btrfs".to_owned())
    );
    assert_eq!(
        fs(&[("fstype", "btrfs"), (wk::PARAM_FSTYPE, "xfs")], &config()),
        Err(ProvisionError::FsTypeSpecifiedTwice)
    );
    // The deprecated unprefixed key still reaches the driver, as upstream.
    let legacy = plan(&claim(), &class_with(&[("fsType", "btrfs")]), &config()).expect("plan");
    assert_eq!(
        legacy.request.parameters.get("fsType").map(String::as_str),
        Some("btrfs")
    );
}

#[test]
fn parameters_lose_the_reserved_prefix() {
    let class = class_with(&[
        ("type", "ssd"),
        (wk::PARAM_FSTYPE, "xfs"),
        (wk::PARAM_PROVISIONER_SECRET_NAME, "s"),
        (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
        ("csiNodePublishSecretName", "legacy"),
        ("csiNodePublishSecretNamespace", "ns"),
    ]);
    let plan = plan(&claim(), &class, &config()).expect("plan");
    assert_eq!(
        plan.request.parameters,
        HashMap::from([
            ("type".to_owned(), "ssd".to_owned()),
            ("csiNodePublishSecretName".to_owned(), "legacy".to_owned()),
            ("csiNodePublishSecretNamespace".to_owned(), "ns".to_owned()),
        ])
    );
    for key in wk::KNOWN_PREFIXED_PARAMETERS {
        assert!(
            driver_parameters(&map(&[(key, "v")]))
                .expect("known")
                .is_empty(),
            "{key}"
        );
    }
    assert_eq!(
        plan_provision(
            &inputs(&claim(), &class_with(&[("csi.storage.k8s.io/typo", "x")])),
            &config()
        ),
        Err(ProvisionError::UnknownPrefixedParameter(
            "csi.storage.k8s.io/typo".to_owned()
        ))
    );
}

#[test]
fn extra_create_metadata() {
    let config = ProvisionerConfig {
        extra_create_metadata: true,
        ..config()
    };
    let plan = plan(&claim(), &class_with(&[("type", "ssd")]), &config).expect("plan");
    assert_eq!(
        plan.request.parameters,
        HashMap::from([
            ("type".to_owned(), "ssd".to_owned()),
            (wk::PARAM_PVC_NAME.to_owned(), "data".to_owned()),
            (wk::PARAM_PVC_NAMESPACE.to_owned(), "ns".to_owned()),
            (wk::PARAM_PV_NAME.to_owned(), VOLUME.to_owned()),
        ])
    );
}

/// A claim with a label and an annotation, of a class that templates two
/// parameters (one of them malformed) and copies labels (one key invalid):
/// what the gate changes.
fn claim_metadata_inputs() -> (PersistentVolumeClaim, StorageClass) {
    use crate::provision::claim_metadata::{
        ANN_COPY_CLAIM_ANNOTATIONS, ANN_COPY_CLAIM_LABELS, ANN_PARAMETER_TEMPLATES,
    };
    let mut claim = claim();
    claim.metadata.labels = Some(map(&[("team", "storage"), ("other", "x")]).into());
    annotate(&mut claim.metadata, "cost-center", "cc-42");
    let mut class = class_with(&[
        ("tags", "cost-center=${pvc.annotations['cost-center']}"),
        ("subDir", "${pvc.namespace}/${pvc.name}"),
        ("volume", "${pv.name}"),
        ("owner", "${pvc.labels['team']}"),
        ("type", "ssd"),
        (wk::PARAM_FSTYPE, "xfs"),
    ]);
    class.metadata.annotations = Some(map(&[
        (ANN_PARAMETER_TEMPLATES, "tags, subDir,volume,owner"),
        (ANN_COPY_CLAIM_LABELS, "team,absent"),
        (ANN_COPY_CLAIM_ANNOTATIONS, "cost-center"),
    ]));
    (claim, class)
}

#[test]
fn claim_metadata_gate_off_is_the_go_images_plan() {
    let (claim, class) = claim_metadata_inputs();
    let off = plan(&claim, &class, &config()).expect("plan");
    assert_eq!(
        off.request.parameters,
        HashMap::from([
            (
                "tags".to_owned(),
                "cost-center=${pvc.annotations['cost-center']}".to_owned()
            ),
            (
                "subDir".to_owned(),
                "${pvc.namespace}/${pvc.name}".to_owned()
            ),
            ("volume".to_owned(), "${pv.name}".to_owned()),
            ("owner".to_owned(), "${pvc.labels['team']}".to_owned()),
            ("type".to_owned(), "ssd".to_owned()),
        ]),
        "parameters pass through untouched, even with `${{`"
    );
    assert_eq!(off.copied_metadata, CopiedMetadata::default());
    // The same plan as for the class without the annotations.
    let plain = StorageClass {
        metadata: ObjectMeta {
            annotations: None,
            ..class.metadata.clone()
        },
        ..class.clone()
    };
    assert_eq!(plan(&claim, &plain, &config()), Ok(off));
    // Bad lists are not even read with the gate off.
    let mut bad = class.clone();
    bad.metadata.annotations = Some(map(&[
        (
            crate::provision::claim_metadata::ANN_PARAMETER_TEMPLATES,
            "csi.storage.k8s.io/fstype,nothing",
        ),
        (
            crate::provision::claim_metadata::ANN_COPY_CLAIM_LABELS,
            "not a key",
        ),
    ]));
    assert!(plan(&claim, &bad, &config()).is_ok());
}

#[test]
fn claim_metadata_gate_on_resolves_and_copies() {
    let gate_on = ProvisionerConfig {
        claim_metadata_propagation: true,
        extra_create_metadata: true,
        ..config()
    };
    let (claim, class) = claim_metadata_inputs();
    let plan = plan(&claim, &class, &gate_on).expect("plan");
    assert_eq!(
        plan.request.parameters,
        HashMap::from([
            ("tags".to_owned(), "cost-center=cc-42".to_owned()),
            ("subDir".to_owned(), "ns/data".to_owned()),
            ("volume".to_owned(), VOLUME.to_owned()),
            ("owner".to_owned(), "storage".to_owned()),
            ("type".to_owned(), "ssd".to_owned()),
            (wk::PARAM_PVC_NAME.to_owned(), "data".to_owned()),
            (wk::PARAM_PVC_NAMESPACE.to_owned(), "ns".to_owned()),
            (wk::PARAM_PV_NAME.to_owned(), VOLUME.to_owned()),
        ])
    );
    assert_eq!(plan.fs_type, "xfs", "reserved keys keep their meaning");
    assert_eq!(
        plan.copied_metadata,
        CopiedMetadata {
            labels: map(&[("team", "storage")]),
            annotations: map(&[("cost-center", "cc-42")]),
        }
    );
}

#[test]
fn claim_metadata_errors_fail_the_plan() {
    use crate::provision::claim_metadata::{
        ANN_COPY_CLAIM_LABELS, ANN_PARAMETER_TEMPLATES, ClaimMetadataError, Malformed,
    };
    let gate_on = ProvisionerConfig {
        claim_metadata_propagation: true,
        ..config()
    };
    let (claim, class) = claim_metadata_inputs();
    let mut without_annotation = claim.clone();
    without_annotation
        .metadata
        .annotations
        .as_mut()
        .expect("annotations")
        .remove("cost-center");
    let with = |key: &str, list: &str| {
        let mut class = class.clone();
        class
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(key.to_owned(), list.to_owned());
        class
    };
    let mut without_label = claim.clone();
    without_label.metadata.labels = Some(map(&[("other", "x")]).into());
    let mut malformed = class_with(&[("subDir", "${pvc.namespace")]);
    malformed.metadata.annotations = Some(map(&[(ANN_PARAMETER_TEMPLATES, "subDir")]));
    let cases = [
        (
            without_annotation,
            class.clone(),
            ClaimMetadataError::MissingAnnotation {
                key: "tags".into(),
                annotation: "cost-center".into(),
            },
        ),
        (
            without_label,
            class.clone(),
            ClaimMetadataError::MissingLabel {
                key: "owner".into(),
                label: "team".into(),
            },
        ),
        (
            claim.clone(),
            malformed,
            ClaimMetadataError::MalformedTemplate {
                key: "subDir".into(),
                template: "${pvc.namespace".into(),
                problem: Malformed::Unterminated,
            },
        ),
        (
            claim.clone(),
            with(ANN_PARAMETER_TEMPLATES, wk::PARAM_FSTYPE),
            ClaimMetadataError::ReservedParameter {
                key: wk::PARAM_FSTYPE.into(),
            },
        ),
        (
            claim.clone(),
            with(ANN_COPY_CLAIM_LABELS, "team,Cost Center"),
            ClaimMetadataError::InvalidKey {
                annotation: ANN_COPY_CLAIM_LABELS,
                what: "label",
                key: "Cost Center".into(),
                reason: "the name must consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
            },
        ),
    ];
    for (claim, class, want) in cases {
        let got = plan(&claim, &class, &gate_on);
        assert_eq!(got, Err(ProvisionError::ClaimMetadata(want.clone())));
        assert_eq!(
            got.expect_err("error").to_string(),
            want.to_string(),
            "the event says exactly what the error says"
        );
    }
}

fn with_resources(requests: Option<&str>, limits: Option<&str>) -> PersistentVolumeClaim {
    let mut claim = claim();
    let storage = |value: Option<&str>| {
        value.map(|v| BTreeMap::from([("storage".to_owned(), Quantity(v.to_owned()))]))
    };
    claim_spec(&mut claim).resources = Some(crate::projection::VolumeResourceRequirements {
        requests: storage(requests).map(Into::into),
        limits: storage(limits).map(Into::into),
    });
    claim
}

#[test]
fn capacity_from_requests_and_limits() {
    use crate::provision::claim_metadata::{ANN_CLAIM_STORAGE_LIMIT, ClaimMetadataError};
    let range_with =
        |claim: PersistentVolumeClaim, class: &StorageClass, config: &ProvisionerConfig| {
            plan(&claim, class, config).map(|p| {
                let range = p.request.capacity_range.expect("range");
                (range.required_bytes, range.limit_bytes)
            })
        };
    // As the Go image: only the request is sent, limits are not read.
    let range = |claim: PersistentVolumeClaim| range_with(claim, &class(), &config());
    assert_eq!(range(with_resources(None, None)), Ok((0, 0)));
    assert_eq!(range(with_resources(Some("10Gi"), None)), Ok((10 << 30, 0)));
    assert_eq!(range(with_resources(Some("100m"), None)), Ok((1, 0)));
    assert_eq!(
        range(with_resources(Some("1G"), Some("2G"))),
        Ok((1_000_000_000, 0))
    );
    assert_eq!(
        range(with_resources(Some("2G"), Some("1G"))),
        Ok((2_000_000_000, 0))
    );
    assert_eq!(
        range(with_resources(Some("1Gi"), Some("-1"))),
        Ok((1 << 30, 0))
    );
    assert_eq!(
        range(with_resources(Some("lots"), None)),
        Err(ProvisionError::InvalidCapacity(QuantityError {
            input: "lots".to_owned(),
            reason: QuantityErrorKind::NoNumber,
        }))
    );

    // A class that opts in, gate on: the limit is sent.
    let gate_on = ProvisionerConfig {
        claim_metadata_propagation: true,
        ..config()
    };
    let class_saying = |value: &str| {
        let mut class = class();
        class.metadata.annotations = Some(map(&[(ANN_CLAIM_STORAGE_LIMIT, value)]));
        class
    };
    let opted_in = class_saying("true");
    let range = |claim: PersistentVolumeClaim| range_with(claim, &opted_in, &gate_on);
    assert_eq!(
        range(with_resources(Some("1G"), Some("2G"))),
        Ok((1_000_000_000, 2_000_000_000))
    );
    assert_eq!(
        range(with_resources(None, Some("2G"))),
        Ok((0, 2_000_000_000))
    );
    assert_eq!(
        range(with_resources(Some("2G"), Some("1G"))),
        Err(ProvisionError::LimitBelowRequest {
            request: 2_000_000_000,
            limit: 1_000_000_000
        })
    );
    assert_eq!(
        range(with_resources(Some("1Gi"), Some("-1"))),
        Err(ProvisionError::InvalidCapacity(QuantityError {
            input: "-1".to_owned(),
            reason: QuantityErrorKind::Negative,
        }))
    );
    // Opted in but the gate off, or opted out: the Go image's request.
    let claim = || with_resources(Some("1G"), Some("2G"));
    assert_eq!(
        range_with(claim(), &opted_in, &config()),
        Ok((1_000_000_000, 0))
    );
    assert_eq!(
        range_with(claim(), &class_saying("false"), &gate_on),
        Ok((1_000_000_000, 0))
    );
    // Neither true nor false: refused, naming the annotation.
    let refused = range_with(claim(), &class_saying("yes"), &gate_on);
    assert_eq!(
        refused,
        Err(ProvisionError::ClaimMetadata(
            ClaimMetadataError::NotABool {
                annotation: ANN_CLAIM_STORAGE_LIMIT,
                value: "yes".to_owned(),
            }
        ))
    );
    assert_eq!(
        refused.map_err(|e| e.to_string()),
        Err("StorageClass annotation csi-provisioner-rs.io/claim-storage-limit is \"yes\"; it must be \"true\" or \"false\"".to_owned())
    );
}

#[test]
fn claim_shape_errors() {
    let mut selector = claim();
    claim_spec(&mut selector).selector = Some(Box::new(LabelSelector::default()));
    assert_eq!(
        plan(&selector, &class(), &config()),
        Err(ProvisionError::SelectorNotSupported)
    );

    let mut no_modes = claim();
    claim_spec(&mut no_modes).access_modes = None;
    assert_eq!(
        plan(&no_modes, &class(), &config()),
        Err(ProvisionError::NoAccessModes)
    );

    let mut bad_mode = claim();
    claim_spec(&mut bad_mode).access_modes = Some(vec!["Sometimes".into()]);
    assert_eq!(
        plan(&bad_mode, &class(), &config()),
        Err(ProvisionError::UnsupportedAccessMode(
            "Sometimes".to_owned()
        ))
    );

    let mut no_uid = claim();
    no_uid.metadata.uid = None;
    assert_eq!(
        plan(&no_uid, &class(), &config()),
        Err(ProvisionError::MissingClaimUid)
    );

    let empty_prefix = ProvisionerConfig {
        volume_name_prefix: String::new(),
        ..config()
    };
    assert_eq!(
        plan(&claim(), &class(), &empty_prefix),
        Err(ProvisionError::EmptyVolumeNamePrefix)
    );

    let truncated = ProvisionerConfig {
        volume_name_prefix: "vol".to_owned(),
        volume_name_uuid_length: Some(4),
        ..config()
    };
    let plan = plan(&claim(), &class(), &truncated).expect("plan");
    assert_eq!(plan.volume_name, "vol-0a1b");
    assert_eq!(plan.request.name, "vol-0a1b");
}

#[test]
fn class_fields_reach_the_plan() {
    let mut claim = claim();
    annotate(&mut claim.metadata, wk::ANN_BETA_STORAGE_CLASS, "beta-name");
    let class = StorageClass {
        reclaim_policy: Some("Retain".to_owned()),
        ..class()
    };
    let plan = plan(&claim, &class, &config()).expect("plan");
    assert_eq!(plan.reclaim_policy, "Retain");
    assert_eq!(plan.storage_class_name, "beta-name");
}

fn vac(name: &str, driver: &str) -> VolumeAttributesClass {
    VolumeAttributesClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        driver_name: driver.to_owned(),
        parameters: Some(map(&[("iops", "3000")])),
    }
}

#[test]
fn volume_attributes_class() {
    let mut claim = claim();
    claim_spec(&mut claim).volume_attributes_class_name = Some("gold".into());
    let class = class();
    let run = |vac: Option<&VolumeAttributesClass>, config: &ProvisionerConfig| {
        plan_provision(
            &ProvisionInputs {
                volume_attributes_class: vac,
                ..inputs(&claim, &class)
            },
            config,
        )
    };
    let gold = vac("gold", DRIVER);
    let plan = run(Some(&gold), &config()).expect("plan");
    assert_eq!(
        plan.request.mutable_parameters,
        HashMap::from([("iops".to_owned(), "3000".to_owned())])
    );
    assert_eq!(plan.volume_attributes_class_name.as_deref(), Some("gold"));

    assert_eq!(
        run(Some(&vac("gold", "other.csi")), &config()),
        Err(ProvisionError::VolumeAttributesClassDriverMismatch {
            name: "gold".to_owned(),
            driver: "other.csi".to_owned(),
            ours: DRIVER.to_owned(),
        })
    );
    assert_eq!(
        run(None, &config()),
        Err(ProvisionError::VolumeAttributesClassNotFound(
            "gold".to_owned()
        ))
    );
    assert_eq!(
        run(Some(&vac("silver", DRIVER)), &config()),
        Err(ProvisionError::VolumeAttributesClassNotFound(
            "gold".to_owned()
        )),
        "a class of another name is not the one asked for"
    );
    let mut no_modify = config();
    no_modify.capabilities.modify_volume = false;
    assert_eq!(
        run(Some(&gold), &no_modify),
        Err(ProvisionError::ModifyVolumeNotSupported)
    );

    let gate_off = ProvisionerConfig {
        volume_attributes_class_enabled: false,
        ..no_modify
    };
    let plan = run(None, &gate_off).expect("gate off ignores the class");
    assert!(plan.request.mutable_parameters.is_empty());
    assert_eq!(plan.volume_attributes_class_name, None);
}

#[test]
fn secrets_are_resolved_not_read() {
    let mut claim = claim();
    annotate(&mut claim.metadata, "team/key", "team-secret");
    let class = class_with(&[
        (wk::PARAM_PROVISIONER_SECRET_NAME, "prov-${pvc.name}"),
        (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "${pvc.namespace}"),
        (
            wk::PARAM_NODE_PUBLISH_SECRET_NAME,
            "${pvc.annotations['team/key']}",
        ),
        (wk::PARAM_NODE_PUBLISH_SECRET_NAMESPACE, "${pvc.namespace}"),
        (wk::PARAM_DEFAULT_SECRET_NAME, "default"),
        (wk::PARAM_DEFAULT_SECRET_NAMESPACE, "storage"),
    ]);
    let plan = plan(&claim, &class, &config()).expect("plan");
    let secret = |name: &str, namespace: &str| {
        Some(SecretRef {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        })
    };
    assert!(plan.request.secrets.is_empty());
    assert_eq!(plan.provisioner_secret, secret("prov-data", "ns"));
    assert_eq!(
        plan.pv_secrets,
        PvSecretRefs {
            controller_publish: secret("default", "storage"),
            node_stage: secret("default", "storage"),
            node_publish: secret("team-secret", "ns"),
            controller_expand: secret("default", "storage"),
            node_expand: secret("default", "storage"),
            controller_modify: secret("default", "storage"),
        }
    );

    let half = class_with(&[(wk::PARAM_NODE_STAGE_SECRET_NAME, "x")]);
    assert_eq!(
        plan_provision(&inputs(&claim, &half), &config()),
        Err(ProvisionError::Secret(SecretError::HalfSpecified {
            kind: "NodeStage"
        }))
    );
}

fn csi_node(name: &str, keys: &[&str]) -> CSINode {
    CSINode {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: DRIVER.to_owned(),
                node_id: name.to_owned(),
                topology_keys: Some(keys.iter().map(|k| (*k).to_owned()).collect()),
                allocatable: None,
            }],
        },
    }
}

fn node(name: &str, zone: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(map(&[("zone", zone)])),
            ..ObjectMeta::default()
        },
    }
}

#[test]
fn selected_node_and_topology() {
    let mut claim = claim();
    annotate(&mut claim.metadata, wk::ANN_SELECTED_NODE, "n1");
    let class = class();
    let n1 = node("n1", "a");
    let n2 = node("n2", "b");
    let c1 = csi_node("n1", &["zone"]);
    let nodes = [&n1, &n2];
    let topology = ProvisionerConfig {
        topology_enabled: true,
        ..config()
    };

    // The Node must exist even without topology: otherwise reschedule.
    let missing = plan_provision(&inputs(&claim, &class), &config()).expect_err("no node");
    assert_eq!(
        missing,
        ProvisionError::SelectedNodeNotFound("n1".to_owned())
    );
    assert!(missing.wants_reschedule());

    let with_node = ProvisionInputs {
        selected_node: Some(&n1),
        selected_csi_node: Some(&c1),
        nodes: &nodes,
        ..inputs(&claim, &class)
    };
    let without_topology = plan_provision(&with_node, &config()).expect("plan");
    assert_eq!(without_topology.request.accessibility_requirements, None);
    assert_eq!(without_topology.selected_node.as_deref(), Some("n1"));

    let zone = |z: &str| csi_proto::v1::Topology {
        segments: HashMap::from([("zone".to_owned(), z.to_owned())]),
    };
    let with_topology = plan_provision(&with_node, &topology).expect("plan");
    assert_eq!(
        with_topology.request.accessibility_requirements,
        Some(TopologyRequirement {
            requisite: vec![zone("a"), zone("b")],
            preferred: vec![zone("a"), zone("b")],
        })
    );

    let no_csi_node = ProvisionInputs {
        selected_csi_node: None,
        ..with_node
    };
    let error = plan_provision(&no_csi_node, &topology).expect_err("no CSINode");
    assert_eq!(
        error,
        ProvisionError::Topology(TopologyError::SelectedCsiNodeNotFound("n1".to_owned()))
    );
    assert!(error.wants_reschedule());
    assert!(!error.is_ignored());
}

#[test]
fn data_source_errors_before_reading_objects() {
    let class = class();
    let with_source = |kind: &str, group: Option<&str>, name: &str| {
        let mut claim = claim();
        claim_spec(&mut claim).data_source = Some(Box::new(TypedLocalObjectReference {
            api_group: group.map(str::to_owned),
            kind: kind.to_owned(),
            name: name.to_owned(),
        }));
        claim
    };
    let populator = plan(
        &with_source("Bucket", Some("example.com"), "b"),
        &class,
        &config(),
    )
    .expect_err("populator");
    assert_eq!(
        populator,
        ProvisionError::ExternalPopulator("Bucket".to_owned())
    );
    assert!(populator.is_ignored());
    assert!(!populator.wants_reschedule());

    assert_eq!(
        plan(
            &with_source("VolumeSnapshot", Some("snapshot.example.com"), "s"),
            &class,
            &config()
        ),
        Err(ProvisionError::WrongSnapshotApiGroup(
            "snapshot.example.com".to_owned()
        ))
    );
    assert_eq!(
        plan(
            &with_source("PersistentVolumeClaim", None, ""),
            &class,
            &config()
        ),
        Err(ProvisionError::DataSourceWithoutName("data".to_owned()))
    );
    let mut no_clone = config();
    no_clone.capabilities.clone_volume = false;
    assert_eq!(
        plan(
            &with_source("PersistentVolumeClaim", None, "source"),
            &class,
            &no_clone
        ),
        Err(ProvisionError::CloneNotSupported)
    );
    let mut no_snapshot = config();
    no_snapshot.capabilities.create_delete_snapshot = false;
    assert_eq!(
        plan(
            &with_source("VolumeSnapshot", Some("snapshot.storage.k8s.io"), "s"),
            &class,
            &no_snapshot
        ),
        Err(ProvisionError::SnapshotRestoreNotSupported)
    );
    assert_eq!(
        plan(
            &with_source("PersistentVolumeClaim", None, "source"),
            &class,
            &config()
        ),
        Err(ProvisionError::DataSourceObjectsMismatch(
            "PersistentVolumeClaim".to_owned()
        )),
        "the caller must pass the objects the source names"
    );
}

#[test]
fn clone_plan_and_cross_namespace_sources() {
    let class = class();
    let source = source_claim();
    let source_pv = source_volume();
    let objects = DataSourceObjects::Claim {
        claim: Some(&source),
        volume: Some(&source_pv),
    };
    let mut same_namespace = claim();
    claim_spec(&mut same_namespace).data_source = Some(Box::new(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".to_owned(),
        name: "source".to_owned(),
    }));
    let plan = plan_provision(
        &ProvisionInputs {
            data_source: Some(objects),
            ..inputs(&same_namespace, &class)
        },
        &config(),
    )
    .expect("plan");
    assert!(plan.has_data_source);
    assert_eq!(
        plan.request.volume_content_source,
        Some(csi_proto::v1::VolumeContentSource {
            r#type: Some(csi_proto::v1::volume_content_source::Type::Volume(
                csi_proto::v1::volume_content_source::VolumeSource {
                    volume_id: "source-handle".to_owned()
                }
            )),
        })
    );
    assert_eq!(
        plan.source_finalizer
            .map(|f| (f.namespace, f.name, f.finalizer)),
        Some((
            "ns".to_owned(),
            "source".to_owned(),
            wk::FINALIZER_CLONE_SOURCE
        ))
    );

    let mut cross = claim();
    claim_spec(&mut cross).data_source_ref =
        Some(Box::new(k8s_openapi::api::core::v1::TypedObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".to_owned(),
            name: "source".to_owned(),
            namespace: Some("other".to_owned()),
        }));
    assert_eq!(
        plan_provision(&inputs(&cross, &class), &config()),
        Err(ProvisionError::CrossNamespaceSourceDisabled)
    );
    let gate_on = ProvisionerConfig {
        cross_namespace_data_source: true,
        ..config()
    };
    assert_eq!(
        plan_provision(
            &ProvisionInputs {
                data_source: Some(objects),
                ..inputs(&cross, &class)
            },
            &gate_on
        ),
        Err(ProvisionError::CrossNamespaceSourceNotGranted {
            kind: "PersistentVolumeClaim".to_owned(),
            namespace: "other".to_owned(),
            name: "source".to_owned(),
            claim_namespace: "ns".to_owned(),
            claim_name: "data".to_owned(),
        })
    );
    assert_eq!(
        ProvisionError::CrossNamespaceSourceNotGranted {
            kind: "PersistentVolumeClaim".to_owned(),
            namespace: "other".to_owned(),
            name: "source".to_owned(),
            claim_namespace: "ns".to_owned(),
            claim_name: "data".to_owned(),
        }
        .to_string(),
        "accessing other/source of PersistentVolumeClaim dataSource from ns/data isn't allowed",
        "upstream's message"
    );
    // Granted: planned as a clone of the source in the other namespace.
    let granted = plan_provision(
        &ProvisionInputs {
            data_source: Some(objects),
            data_source_granted: true,
            ..inputs(&cross, &class)
        },
        &gate_on,
    )
    .expect("granted");
    assert!(granted.has_data_source);
}

/// CSI migration: a class naming the in-tree plugin our driver took over is
/// planned from its CSI translation.
#[test]
fn migrated_in_tree_classes() {
    use crate::migration::{InTreePlugin, MigrationError};
    use crate::provision::fixtures::{EBS_DRIVER, ebs_config, gp2_claim, gp2_class, topology_term};
    use std::collections::HashMap;

    let ebs = ebs_config();
    let gp2 = plan(&gp2_claim(), &gp2_class(), &ebs).expect("plan");
    assert_eq!(gp2.migrated_from, Some(InTreePlugin::AwsEbs));
    assert!(gp2.is_migrated());
    assert_eq!(
        gp2.request.parameters,
        HashMap::from([("type".to_owned(), "gp2".to_owned())]),
        "fsType moved to csi.storage.k8s.io/fstype, which the driver does not get"
    );
    assert_eq!(gp2.fs_type, "ext4");
    assert_eq!(
        gp2.request.volume_capabilities,
        vec![mount("ext4", &[], Mode::SingleNodeWriter)]
    );
    assert_eq!(gp2.storage_class_name, "gp2");
    assert_eq!(gp2.reclaim_policy, "Delete");

    // A native class of the same driver is not translated: its fsType key is
    // the deprecated one, passed on as upstream does.
    let native = StorageClass {
        provisioner: EBS_DRIVER.to_owned(),
        ..gp2_class()
    };
    let native_plan = plan(&gp2_claim(), &native, &ebs).expect("plan");
    assert_eq!(native_plan.migrated_from, None);
    assert!(!native_plan.is_migrated());
    assert_eq!(
        native_plan
            .request
            .parameters
            .get("fsType")
            .map(String::as_str),
        Some("ext4")
    );
    // A driver that took over no plugin never translates.
    assert_eq!(
        plan(&gp2_claim(), &gp2_class(), &config())
            .expect("plan")
            .migrated_from,
        None
    );

    // zone/zones parameters and allowedTopologies become requirements with
    // the driver's own topology key.
    let topology = ProvisionerConfig {
        topology_enabled: true,
        ..ebs_config()
    };
    let requisite = |class: &StorageClass| {
        let mut zones: Vec<Vec<(String, String)>> = plan(&gp2_claim(), class, &topology)
            .expect("plan")
            .request
            .accessibility_requirements
            .expect("requirements")
            .requisite
            .into_iter()
            .map(|t| t.segments.into_iter().collect())
            .collect();
        zones.sort();
        zones
    };
    let ebs_zone = |zone: &str| vec![("topology.ebs.csi.aws.com/zone".to_owned(), zone.to_owned())];
    let zonal = StorageClass {
        parameters: Some(map(&[("type", "gp3"), ("zones", "us-east-1a,us-east-1b")])),
        ..gp2_class()
    };
    assert_eq!(
        requisite(&zonal),
        vec![ebs_zone("us-east-1a"), ebs_zone("us-east-1b")]
    );
    let allowed = |key: &str| StorageClass {
        allowed_topologies: Some(vec![topology_term(&[(key, &["us-east-1c"])])]),
        ..gp2_class()
    };
    assert_eq!(
        requisite(&allowed("topology.kubernetes.io/zone")),
        vec![ebs_zone("us-east-1c")]
    );
    assert_eq!(
        requisite(&allowed("failure-domain.beta.kubernetes.io/zone")),
        vec![ebs_zone("us-east-1c")]
    );

    // A class the translation refuses fails the plan with upstream's words.
    let broken = StorageClass {
        parameters: Some(map(&[("zone", "us-east-1a")])),
        ..allowed("topology.kubernetes.io/zone")
    };
    let error = plan(&gp2_claim(), &broken, &ebs).expect_err("untranslatable");
    assert_eq!(
        error,
        ProvisionError::StorageClassTranslation(
            MigrationError::ZoneParametersWithAllowedTopologies
        )
    );
    assert_eq!(
        error.to_string(),
        "failed to translate storage class: cannot simultaneously set allowed topologies and zone/zones parameters"
    );
    assert!(!error.wants_reschedule() && !error.is_ignored());
}

#[test]
fn migrated_classes_of_other_plugins() {
    use crate::migration::InTreePlugin;
    use crate::provision::fixtures::gp2_claim;
    use std::collections::HashMap;

    let config_for = |plugin: InTreePlugin| ProvisionerConfig {
        driver_name: plugin.csi_driver().to_owned(),
        ..config()
    };
    let in_tree = |plugin: InTreePlugin, params: &[(&str, &str)]| StorageClass {
        provisioner: plugin.in_tree_name().to_owned(),
        parameters: Some(map(params)),
        ..class()
    };
    // Portworx: the auth secret becomes every secret template.
    let portworx = plan(
        &gp2_claim(),
        &in_tree(
            InTreePlugin::Portworx,
            &[
                ("repl", "3"),
                ("openstorage.io/auth-secret-name", "px-auth"),
                ("openstorage.io/auth-secret-namespace", "kube-system"),
            ],
        ),
        &config_for(InTreePlugin::Portworx),
    )
    .expect("plan");
    let px = Some(SecretRef {
        name: "px-auth".to_owned(),
        namespace: "kube-system".to_owned(),
    });
    assert_eq!(portworx.provisioner_secret, px);
    assert_eq!(portworx.pv_secrets.node_publish, px);
    assert_eq!(
        portworx.request.parameters,
        HashMap::from([("repl".to_owned(), "3".to_owned())])
    );
    // vSphere: renamed parameters and the migration marker for the driver.
    let vsphere = plan(
        &gp2_claim(),
        &in_tree(
            InTreePlugin::VsphereVolume,
            &[("datastore", "ds1"), ("fsType", "xfs")],
        ),
        &config_for(InTreePlugin::VsphereVolume),
    )
    .expect("plan");
    assert_eq!(
        vsphere.request.parameters,
        HashMap::from([
            ("datastore-migrationparam".to_owned(), "ds1".to_owned()),
            ("csimigration".to_owned(), "true".to_owned()),
        ])
    );
    assert_eq!(vsphere.fs_type, "xfs");
    assert_eq!(vsphere.migrated_from, Some(InTreePlugin::VsphereVolume));
}

/// `ClaimMetadataPropagation`: a class's name template names the PV and the
/// CSI volume, and everything that says the name (`${pv.name}` templates,
/// `--extra-create-metadata`); an operation's decided name wins over the
/// class; gate off the template is not read.
#[test]
fn volume_name_templates_name_the_volume() {
    use crate::provision::claim_metadata::{
        ANN_PARAMETER_TEMPLATES, ANN_VOLUME_NAME_TEMPLATE, ClaimMetadataError,
    };
    let gate_on = ProvisionerConfig {
        claim_metadata_propagation: true,
        extra_create_metadata: true,
        ..config()
    };
    let claim = claim();
    let mut class = class_with(&[("volume", "${pv.name}")]);
    class.metadata.annotations = Some(map(&[
        (
            ANN_VOLUME_NAME_TEMPLATE,
            "${pvc.namespace}-${pvc.name}-${pvc.uid}",
        ),
        (ANN_PARAMETER_TEMPLATES, "volume"),
    ]));
    let templated = format!("ns-data-{CLAIM_UID}");
    let on = plan(&claim, &class, &gate_on).expect("plan");
    assert_eq!(on.volume_name, templated);
    assert_eq!(on.request.name, templated);
    assert_eq!(on.request.parameters.get("volume"), Some(&templated));
    assert_eq!(
        on.request.parameters.get(wk::PARAM_PV_NAME),
        Some(&templated)
    );

    // Decided before (in flight, journalled): kept, whatever the class says.
    let decided = plan_provision(
        &ProvisionInputs {
            decided_volume_name: Some("pvc-decided"),
            ..inputs(&claim, &class)
        },
        &gate_on,
    )
    .expect("plan");
    assert_eq!(decided.volume_name, "pvc-decided");
    assert_eq!(decided.request.name, "pvc-decided");
    assert_eq!(
        decided.request.parameters.get("volume").map(String::as_str),
        Some("pvc-decided")
    );
    let mut bad = class.clone();
    bad.metadata.annotations = Some(map(&[(ANN_VOLUME_NAME_TEMPLATE, "no-uid")]));
    assert_eq!(
        plan_provision(
            &ProvisionInputs {
                decided_volume_name: Some("pvc-decided"),
                ..inputs(&claim, &bad)
            },
            &gate_on,
        )
        .map(|plan| plan.volume_name),
        Ok("pvc-decided".to_owned()),
        "a decided name is not made again: the class's template is not read"
    );
    // A bad template fails the plan, naming the rule.
    assert_eq!(
        plan(&claim, &bad, &gate_on),
        Err(ProvisionError::ClaimMetadata(
            ClaimMetadataError::NameTemplateWithoutUid {
                template: "no-uid".into()
            }
        ))
    );

    // Gate off: the Go image's name, the template not even read.
    let off = ProvisionerConfig {
        extra_create_metadata: true,
        ..config()
    };
    assert_eq!(
        plan(&claim, &class, &off).expect("plan").volume_name,
        VOLUME
    );
    assert_eq!(plan(&claim, &bad, &off).expect("plan").volume_name, VOLUME);
    // Gate on without a template: the default name, prefix and uuid length
    // as the flags say.
    let short = ProvisionerConfig {
        volume_name_prefix: "vol".into(),
        volume_name_uuid_length: Some(8),
        ..gate_on.clone()
    };
    assert_eq!(
        plan(&claim, &class_with(&[]), &short)
            .expect("plan")
            .volume_name,
        "vol-0a1b2c3d"
    );
    // With a template the flags do not apply.
    assert_eq!(
        plan(&claim, &class, &short).expect("plan").volume_name,
        templated
    );
}

/// `ClaimMetadataPropagation`: the volume context lists are checked by the
/// plan, before any `CreateVolume`; gate off they are not read.
#[test]
fn volume_context_lists_are_checked_before_the_volume_exists() {
    use crate::provision::claim_metadata::{
        ANN_VOLUME_CONTEXT_ANNOTATIONS, ANN_VOLUME_CONTEXT_LABELS, ClaimMetadataError,
        VolumeContextKeys,
    };
    let gate_on = ProvisionerConfig {
        claim_metadata_propagation: true,
        ..config()
    };
    let claim = claim();
    let mut class = class();
    class.metadata.annotations = Some(map(&[
        (ANN_VOLUME_CONTEXT_LABELS, "zone,example.com/pool"),
        (ANN_VOLUME_CONTEXT_ANNOTATIONS, "detail"),
    ]));
    assert_eq!(
        plan(&claim, &class, &gate_on)
            .expect("plan")
            .volume_context_keys,
        VolumeContextKeys {
            labels: vec!["example.com/pool".into(), "zone".into()],
            annotations: vec!["detail".into()],
        }
    );
    let mut bad = class.clone();
    bad.metadata.annotations = Some(map(&[(
        ANN_VOLUME_CONTEXT_ANNOTATIONS,
        "volume.beta.kubernetes.io/storage-class",
    )]));
    assert_eq!(
        plan(&claim, &bad, &gate_on),
        Err(ProvisionError::ClaimMetadata(
            ClaimMetadataError::ReservedKey {
                annotation: ANN_VOLUME_CONTEXT_ANNOTATIONS,
                key: "volume.beta.kubernetes.io/storage-class".into(),
            }
        ))
    );
    for class in [&class, &bad] {
        assert_eq!(
            plan(&claim, class, &config())
                .expect("plan")
                .volume_context_keys,
            VolumeContextKeys::default(),
            "gate off: not read"
        );
    }
}
