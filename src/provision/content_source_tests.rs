use super::*;
use csi_proto::quantity::{QuantityError, QuantityErrorKind};
use k8s_openapi::api::core::v1::{
    ObjectReference, TypedLocalObjectReference, TypedObjectReference,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::snapshot::{
    VolumeSnapshotContentSpec, VolumeSnapshotContentStatus, VolumeSnapshotSpec,
    VolumeSnapshotStatus,
};
use crate::provision::fixtures::{
    DRIVER, annotate, claim, claim_spec, class, config, now, source_claim, source_volume,
};

fn claim_ref(name: &str) -> DataSourceRef {
    DataSourceRef {
        kind: DataSourceKind::Claim,
        name: name.to_owned(),
        namespace: "ns".to_owned(),
        cross_namespace: false,
    }
}

fn snapshot_ref() -> DataSourceRef {
    DataSourceRef {
        kind: DataSourceKind::Snapshot,
        name: "snap".to_owned(),
        namespace: "ns".to_owned(),
        cross_namespace: false,
    }
}

fn snapshot() -> VolumeSnapshot {
    VolumeSnapshot {
        metadata: ObjectMeta {
            name: Some("snap".to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some("snap-uid".to_owned()),
            ..ObjectMeta::default()
        },
        spec: VolumeSnapshotSpec::default(),
        status: Some(VolumeSnapshotStatus {
            bound_volume_snapshot_content_name: Some("content".to_owned()),
            ready_to_use: Some(true),
            restore_size: Some(Quantity("1Gi".to_owned())),
        }),
        types: None,
    }
}

fn content() -> VolumeSnapshotContent {
    VolumeSnapshotContent {
        metadata: ObjectMeta {
            name: Some("content".to_owned()),
            ..ObjectMeta::default()
        },
        spec: VolumeSnapshotContentSpec {
            volume_snapshot_ref: ObjectReference {
                name: Some("snap".to_owned()),
                namespace: Some("ns".to_owned()),
                uid: Some("snap-uid".to_owned()),
                ..ObjectReference::default()
            },
            driver: DRIVER.to_owned(),
            deletion_policy: "Delete".to_owned(),
            source_volume_mode: Some("Filesystem".to_owned()),
            ..VolumeSnapshotContentSpec::default()
        },
        status: Some(VolumeSnapshotContentStatus {
            snapshot_handle: Some("snap-handle".to_owned()),
            ..VolumeSnapshotContentStatus::default()
        }),
        types: None,
    }
}

fn reason(
    result: Result<(VolumeContentSource, SourceFinalizer), ProvisionError>,
) -> DataSourceError {
    match result {
        Err(ProvisionError::DataSource { reason, .. }) => *reason,
        other => panic!("expected a data source error, got {other:?}"),
    }
}

#[test]
fn data_source_ref_prefers_data_source_over_ref() {
    let mut claim = claim();
    claim_spec(&mut claim).data_source = Some(Box::new(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".to_owned(),
        name: "from-data-source".to_owned(),
    }));
    claim_spec(&mut claim).data_source_ref = Some(Box::new(TypedObjectReference {
        api_group: Some("snapshot.storage.k8s.io".to_owned()),
        kind: "VolumeSnapshot".to_owned(),
        name: "from-ref".to_owned(),
        namespace: None,
    }));
    assert_eq!(
        data_source_ref(&claim, &config()),
        Ok(Some(claim_ref("from-data-source")))
    );
    claim_spec(&mut claim).data_source = None;
    assert_eq!(
        data_source_ref(&claim, &config()),
        Ok(Some(DataSourceRef {
            kind: DataSourceKind::Snapshot,
            name: "from-ref".to_owned(),
            namespace: "ns".to_owned(),
            cross_namespace: false,
        }))
    );
    // An explicit namespace equal to the claim's is not cross-namespace, but
    // the gate is still required for it, as upstream.
    claim_spec(&mut claim)
        .data_source_ref
        .as_mut()
        .expect("ref")
        .namespace = Some("ns".to_owned());
    assert_eq!(
        data_source_ref(&claim, &config()),
        Err(ProvisionError::CrossNamespaceSourceDisabled)
    );
    let gate_on = ProvisionerConfig {
        cross_namespace_data_source: true,
        ..config()
    };
    assert_eq!(
        data_source_ref(&claim, &gate_on).map(|r| r.map(|r| r.cross_namespace)),
        Ok(Some(false))
    );
    claim_spec(&mut claim)
        .data_source_ref
        .as_mut()
        .expect("ref")
        .namespace = Some("other".to_owned());
    assert_eq!(
        data_source_ref(&claim, &gate_on).map(|r| r.map(|r| (r.namespace, r.cross_namespace))),
        Ok(Some(("other".to_owned(), true)))
    );
    claim_spec(&mut claim).data_source_ref = None;
    assert_eq!(data_source_ref(&claim, &config()), Ok(None));
}

fn clone_with(
    source: Option<&PersistentVolumeClaim>,
    volume: Option<&PersistentVolume>,
    claim: &PersistentVolumeClaim,
    requested: i64,
) -> Result<(VolumeContentSource, SourceFinalizer), ProvisionError> {
    content_source(
        &claim_ref("source"),
        DataSourceObjects::Claim {
            claim: source,
            volume,
        },
        claim,
        &class(),
        requested,
        &config(),
    )
}

#[test]
fn clone_source_is_the_source_volume_handle() {
    let mut source = source_claim();
    source.metadata.uid = Some("source-uid".to_owned());
    // The finalizer names the very source the plan was made from.
    let source_uid = Some("source-uid".to_owned());
    let (content, finalizer) =
        clone_with(Some(&source), Some(&source_volume()), &claim(), 1 << 30).expect("clone");
    assert_eq!(
        content.r#type,
        Some(Type::Volume(VolumeSource {
            volume_id: "source-handle".to_owned()
        }))
    );
    assert_eq!(
        finalizer,
        SourceFinalizer {
            kind: DataSourceKind::Claim,
            namespace: "ns".to_owned(),
            name: "source".to_owned(),
            finalizer: wk::FINALIZER_CLONE_SOURCE,
            remove_after_provisioning: false,
            uid: source_uid,
        }
    );
}

#[test]
fn clone_source_refusals() {
    let claim = claim();
    let gi = 1 << 30;
    type Change = Box<dyn Fn(&mut PersistentVolumeClaim, &mut PersistentVolume)>;
    let cases: Vec<(
        &str,
        Change,
        Option<PersistentVolumeClaim>,
        i64,
        DataSourceError,
    )> = vec![
        (
            "not bound",
            Box::new(|c, _| c.status = None),
            None,
            gi,
            DataSourceError::SourceClaimNotBound {
                name: "source".into(),
                phase: String::new(),
            },
        ),
        (
            "being deleted",
            Box::new(|c, _| c.metadata.deletion_timestamp = Some(now())),
            None,
            gi,
            DataSourceError::SourceClaimBeingDeleted("source".into()),
        ),
        (
            "source without class",
            Box::new(|c, _| claim_spec(c).storage_class_name = None),
            None,
            gi,
            DataSourceError::SourceClaimWithoutClass("source".into()),
        ),
        (
            "larger source",
            Box::new(|_, _| {}),
            None,
            gi - 1,
            DataSourceError::SourceClaimLarger {
                requested: gi - 1,
                source_bytes: gi,
            },
        ),
        (
            "source with garbage size",
            Box::new(|c, _| {
                claim_spec(c)
                    .resources
                    .as_mut()
                    .expect("resources")
                    .requests = Some([("storage".to_owned(), Quantity("x".to_owned()))].into());
            }),
            None,
            gi,
            DataSourceError::SourceClaimCapacity {
                name: "source".into(),
                error: QuantityError {
                    input: "x".into(),
                    reason: QuantityErrorKind::NoNumber,
                },
            },
        ),
        (
            "source without volume",
            Box::new(|c, _| claim_spec(c).volume_name = None),
            None,
            gi,
            DataSourceError::SourceClaimWithoutVolume("source".into()),
        ),
        (
            "volume of another driver",
            Box::new(|_, v| {
                v.spec
                    .as_mut()
                    .expect("spec")
                    .csi
                    .as_mut()
                    .expect("csi")
                    .driver = "other".into()
            }),
            None,
            gi,
            DataSourceError::SourceVolumeInvalid,
        ),
        (
            "volume not CSI",
            Box::new(|_, v| v.spec.as_mut().expect("spec").csi = None),
            None,
            gi,
            DataSourceError::SourceVolumeInvalid,
        ),
        (
            "volume without claimRef",
            Box::new(|_, v| v.spec.as_mut().expect("spec").claim_ref = None),
            None,
            gi,
            DataSourceError::SourceVolumeInvalid,
        ),
        (
            "volume bound to another claim uid",
            Box::new(|_, v| {
                v.spec
                    .as_mut()
                    .expect("spec")
                    .claim_ref
                    .as_mut()
                    .expect("ref")
                    .uid = Some("other".into());
            }),
            None,
            gi,
            DataSourceError::SourceVolumeInvalid,
        ),
        (
            "volume not Bound",
            Box::new(|_, v| v.status = None),
            None,
            gi,
            DataSourceError::SourceVolumeInvalid,
        ),
        (
            "volume of another name",
            Box::new(|_, v| v.metadata.name = Some("pv-other".into())),
            None,
            gi,
            DataSourceError::SourceVolumeInvalid,
        ),
        (
            "block source for a filesystem claim",
            Box::new(|_, v| v.spec.as_mut().expect("spec").volume_mode = Some("Block".into())),
            None,
            gi,
            DataSourceError::CloneVolumeModeMismatch {
                source_mode: "Block".into(),
                requested_mode: "Filesystem".into(),
            },
        ),
        (
            "filesystem source for a block claim",
            Box::new(|_, _| {}),
            Some({
                let mut block = claim.clone();
                claim_spec(&mut block).volume_mode = Some("Block".into());
                block
            }),
            gi,
            DataSourceError::CloneVolumeModeMismatch {
                source_mode: "Filesystem".into(),
                requested_mode: "Block".into(),
            },
        ),
        (
            "claim without class",
            Box::new(|_, _| {}),
            Some({
                let mut classless = claim.clone();
                claim_spec(&mut classless).storage_class_name = None;
                classless
            }),
            gi,
            DataSourceError::ClaimWithoutClass("data".into()),
        ),
    ];
    for (name, change, target, requested, expected) in cases {
        let mut source = source_claim();
        let mut volume = source_volume();
        change(&mut source, &mut volume);
        let target = target.unwrap_or_else(|| claim.clone());
        assert_eq!(
            reason(clone_with(Some(&source), Some(&volume), &target, requested)),
            expected,
            "{name}"
        );
    }
    assert_eq!(
        reason(clone_with(None, None, &claim, gi)),
        DataSourceError::SourceClaimNotFound {
            name: "source".into(),
            namespace: "ns".into()
        }
    );
    assert_eq!(
        reason(clone_with(Some(&source_claim()), None, &claim, gi)),
        DataSourceError::SourceVolumeInvalid
    );
    let mut block_claim = claim.clone();
    claim_spec(&mut block_claim).volume_mode = Some("Block".into());
    let mut block_volume = source_volume();
    block_volume.spec.as_mut().expect("spec").volume_mode = Some("Block".into());
    assert!(clone_with(Some(&source_claim()), Some(&block_volume), &block_claim, gi).is_ok());
}

fn restore_with(
    snapshot: Option<&VolumeSnapshot>,
    content: Option<&VolumeSnapshotContent>,
    claim: &PersistentVolumeClaim,
    requested: i64,
    config: &ProvisionerConfig,
) -> Result<(VolumeContentSource, SourceFinalizer), ProvisionError> {
    content_source(
        &snapshot_ref(),
        DataSourceObjects::Snapshot { snapshot, content },
        claim,
        &class(),
        requested,
        config,
    )
}

#[test]
fn snapshot_source_is_the_snapshot_handle() {
    let (source, finalizer) = restore_with(
        Some(&snapshot()),
        Some(&content()),
        &claim(),
        1 << 30,
        &config(),
    )
    .expect("restore");
    assert_eq!(
        source.r#type,
        Some(Type::Snapshot(SnapshotSource {
            snapshot_id: "snap-handle".to_owned()
        }))
    );
    assert_eq!(finalizer.finalizer, wk::FINALIZER_SNAPSHOT_SOURCE);
    assert!(finalizer.remove_after_provisioning);
    // A bigger volume than the snapshot is fine (the driver expands it).
    assert!(
        restore_with(
            Some(&snapshot()),
            Some(&content()),
            &claim(),
            2 << 30,
            &config()
        )
        .is_ok()
    );
    // So is a snapshot without a restore size.
    let mut without_size = snapshot();
    without_size.status.as_mut().expect("status").restore_size = None;
    assert!(
        restore_with(
            Some(&without_size),
            Some(&content()),
            &claim(),
            1,
            &config()
        )
        .is_ok()
    );
    // Being deleted, but this restore already holds our finalizer.
    let mut protected = snapshot();
    protected.metadata.deletion_timestamp = Some(now());
    protected.metadata.finalizers = Some(vec![wk::FINALIZER_SNAPSHOT_SOURCE.to_owned()]);
    assert!(
        restore_with(
            Some(&protected),
            Some(&content()),
            &claim(),
            1 << 30,
            &config()
        )
        .is_ok()
    );
}

#[test]
fn snapshot_source_refusals() {
    let gi = 1 << 30;
    type Change = Box<dyn Fn(&mut VolumeSnapshot, &mut VolumeSnapshotContent)>;
    let not_bound = DataSourceError::SnapshotNotBound("snap".into());
    let cases: Vec<(&str, Change, i64, DataSourceError)> = vec![
        (
            "being deleted",
            Box::new(|s, _| s.metadata.deletion_timestamp = Some(now())),
            gi,
            DataSourceError::SnapshotBeingDeleted("snap".into()),
        ),
        (
            "no status",
            Box::new(|s, _| s.status = None),
            gi,
            not_bound.clone(),
        ),
        (
            "no bound content",
            Box::new(|s, _| {
                s.status
                    .as_mut()
                    .expect("status")
                    .bound_volume_snapshot_content_name = None
            }),
            gi,
            not_bound.clone(),
        ),
        (
            "content of another name",
            Box::new(|_, c| c.metadata.name = Some("other".into())),
            gi,
            not_bound.clone(),
        ),
        (
            "content bound to another snapshot",
            Box::new(|_, c| c.spec.volume_snapshot_ref.uid = Some("other".into())),
            gi,
            not_bound.clone(),
        ),
        (
            "content of another namespace's snapshot",
            Box::new(|_, c| c.spec.volume_snapshot_ref.namespace = Some("other".into())),
            gi,
            not_bound.clone(),
        ),
        (
            "content of another driver",
            Box::new(|_, c| c.spec.driver = "other".into()),
            gi,
            not_bound.clone(),
        ),
        (
            "not ready",
            Box::new(|s, _| s.status.as_mut().expect("status").ready_to_use = Some(false)),
            gi,
            DataSourceError::SnapshotNotReady("snap".into()),
        ),
        (
            "readiness unknown",
            Box::new(|s, _| s.status.as_mut().expect("status").ready_to_use = None),
            gi,
            DataSourceError::SnapshotNotReady("snap".into()),
        ),
        (
            "no handle",
            Box::new(|_, c| c.status = None),
            gi,
            DataSourceError::SnapshotHandleMissing("snap".into()),
        ),
        (
            "restore size above request",
            Box::new(|_, _| {}),
            gi - 1,
            DataSourceError::RequestSmallerThanRestoreSize {
                requested: gi - 1,
                restore_size: gi,
                name: "snap".into(),
            },
        ),
        (
            "garbage restore size",
            Box::new(|s, _| {
                s.status.as_mut().expect("status").restore_size = Some(Quantity("big".into()))
            }),
            gi,
            DataSourceError::SnapshotRestoreSize {
                name: "snap".into(),
                error: QuantityError {
                    input: "big".into(),
                    reason: QuantityErrorKind::NoNumber,
                },
            },
        ),
    ];
    for (name, change, requested, expected) in cases {
        let mut snapshot = snapshot();
        let mut content = content();
        change(&mut snapshot, &mut content);
        assert_eq!(
            reason(restore_with(
                Some(&snapshot),
                Some(&content),
                &claim(),
                requested,
                &config()
            )),
            expected,
            "{name}"
        );
    }
    assert_eq!(
        reason(restore_with(None, None, &claim(), gi, &config())),
        DataSourceError::SnapshotNotFound("snap".into())
    );
    assert_eq!(
        reason(restore_with(
            Some(&snapshot()),
            None,
            &claim(),
            gi,
            &config()
        )),
        not_bound
    );
    let error = restore_with(Some(&snapshot()), None, &claim(), gi, &config()).expect_err("error");
    assert_eq!(
        error.to_string(),
        "error getting handle for DataSource Type VolumeSnapshot by Name snap: snapshot snap not bound"
    );
}

#[test]
fn volume_mode_conversion() {
    let gi = 1 << 30;
    let mut block_claim = claim();
    claim_spec(&mut block_claim).volume_mode = Some("Block".into());
    let with_annotation = |value: Option<&str>| {
        let mut content = content();
        if let Some(value) = value {
            annotate(
                &mut content.metadata,
                wk::ANN_ALLOW_VOLUME_MODE_CHANGE,
                value,
            );
        }
        content
    };
    let run = |content: &VolumeSnapshotContent, config: &ProvisionerConfig| {
        restore_with(Some(&snapshot()), Some(content), &block_claim, gi, config)
    };
    for allowed in ["true", "True", "TRUE", "t", "T", "1"] {
        assert!(
            run(&with_annotation(Some(allowed)), &config()).is_ok(),
            "{allowed}"
        );
    }
    let refused = |content: &VolumeSnapshotContent| match reason(run(content, &config())) {
        DataSourceError::VolumeModeChangeNotAllowed { claim, reason } => {
            assert_eq!(claim, "ns/data");
            reason
        }
        other => panic!("unexpected {other:?}"),
    };
    assert!(
        refused(&with_annotation(None))
            .contains("annotation is not present on snapshotcontent content")
    );
    for denied in ["false", "0", "f", "F", "False", "FALSE"] {
        assert!(
            refused(&with_annotation(Some(denied))).contains("is set to false"),
            "{denied}"
        );
    }
    assert!(refused(&with_annotation(Some("yes"))).contains("failed to convert"));

    let lenient = ProvisionerConfig {
        prevent_volume_mode_conversion: false,
        ..config()
    };
    assert!(
        run(&with_annotation(None), &lenient).is_ok(),
        "the check is off"
    );
    // Unknown modes on either side are not a conversion.
    let mut legacy_content = content();
    legacy_content.spec.source_volume_mode = None;
    assert!(run(&legacy_content, &config()).is_ok());
    assert!(restore_with(Some(&snapshot()), Some(&content()), &claim(), gi, &config()).is_ok());
}

#[test]
fn objects_must_match_the_source_kind() {
    let snapshot = snapshot();
    let result = content_source(
        &claim_ref("source"),
        DataSourceObjects::Snapshot {
            snapshot: Some(&snapshot),
            content: None,
        },
        &claim(),
        &class(),
        1,
        &config(),
    );
    assert_eq!(
        result,
        Err(ProvisionError::DataSourceObjectsMismatch(
            "PersistentVolumeClaim".into()
        ))
    );
}
