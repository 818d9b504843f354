use super::*;
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
};

use crate::provision::config::NodeDeployment;
use crate::provision::fixtures::{
    AWS_EBS_PLUGIN, DRIVER, EBS_DRIVER, VOLUME, annotate, class, config, ebs_config, gp2_class,
    map, migrated_volume, now, released_volume,
};

fn without_gate() -> ProvisionerConfig {
    ProvisionerConfig {
        honor_pv_reclaim_policy: false,
        ..config()
    }
}

fn edit(change: impl FnOnce(&mut PersistentVolume)) -> PersistentVolume {
    let mut pv = released_volume();
    change(&mut pv);
    pv
}

#[test]
fn ownership() {
    let ours = config();
    let cases: Vec<(&str, PersistentVolume, bool)> = vec![
        ("provisioned by us", released_volume(), true),
        (
            "provisioned by another driver with our CSI source",
            edit(|pv| annotate(&mut pv.metadata, wk::ANN_PROVISIONED_BY, "other.csi")),
            false,
        ),
        (
            "provisioned by an in-tree plugin, migrated to us",
            edit(|pv| {
                annotate(
                    &mut pv.metadata,
                    wk::ANN_PROVISIONED_BY,
                    "kubernetes.io/gce-pd",
                );
                annotate(&mut pv.metadata, wk::ANN_MIGRATED_TO, DRIVER);
            }),
            true,
        ),
        (
            "static PV with our CSI source",
            edit(|pv| pv.metadata.annotations = None),
            true,
        ),
        (
            "static PV of another driver",
            edit(|pv| {
                pv.metadata.annotations = None;
                pv.spec
                    .as_mut()
                    .expect("spec")
                    .csi
                    .as_mut()
                    .expect("csi")
                    .driver = "other.csi".into();
            }),
            false,
        ),
        (
            "static in-tree PV migrated to us",
            edit(|pv| {
                pv.metadata.annotations = Some(map(&[(wk::ANN_MIGRATED_TO, DRIVER)]).into());
                pv.spec.as_mut().expect("spec").csi = None;
            }),
            true,
        ),
        (
            "static in-tree PV",
            edit(|pv| {
                pv.metadata.annotations = None;
                pv.spec.as_mut().expect("spec").csi = None;
            }),
            false,
        ),
    ];
    for (name, pv, expected) in cases {
        assert_eq!(is_our_volume(&pv, &ours), expected, "{name}");
    }
}

#[test]
fn decisions() {
    let skip = DeleteDecision::Skip;
    let gate_on = config();
    let gate_off = without_gate();
    let deleting = edit(|pv| pv.metadata.deletion_timestamp = Some(now()));
    let deleting_without_finalizer = edit(|pv| {
        pv.metadata.deletion_timestamp = Some(now());
        pv.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
    });
    let cases: Vec<(&str, PersistentVolume, &ProvisionerConfig, DeleteDecision)> = vec![
        (
            "released, Delete",
            released_volume(),
            &gate_on,
            DeleteDecision::Delete,
        ),
        (
            "released, Delete, gate off",
            released_volume(),
            &gate_off,
            DeleteDecision::Delete,
        ),
        (
            "not ours",
            edit(|pv| annotate(&mut pv.metadata, wk::ANN_PROVISIONED_BY, "other.csi")),
            &gate_on,
            skip(DeleteSkipReason::NotOurs),
        ),
        (
            "bound",
            edit(|pv| pv.status.as_mut().expect("status").phase = Some("Bound".into())),
            &gate_on,
            skip(DeleteSkipReason::NotReleased {
                phase: "Bound".into(),
            }),
        ),
        (
            "no status",
            edit(|pv| pv.status = None),
            &gate_on,
            skip(DeleteSkipReason::NotReleased {
                phase: String::new(),
            }),
        ),
        (
            "Retain",
            edit(|pv| {
                pv.spec
                    .as_mut()
                    .expect("spec")
                    .persistent_volume_reclaim_policy = Some("Retain".into())
            }),
            &gate_on,
            skip(DeleteSkipReason::ReclaimPolicy {
                policy: "Retain".into(),
            }),
        ),
        (
            "Recycle",
            edit(|pv| {
                pv.spec
                    .as_mut()
                    .expect("spec")
                    .persistent_volume_reclaim_policy = Some("Recycle".into())
            }),
            &gate_on,
            skip(DeleteSkipReason::ReclaimPolicy {
                policy: "Recycle".into(),
            }),
        ),
        (
            "KEP-2644: deleted PV with our finalizer, released",
            deleting.clone(),
            &gate_on,
            DeleteDecision::Delete,
        ),
        (
            "KEP-2644: deleted PV with our finalizer, still bound",
            edit(|pv| {
                pv.metadata.deletion_timestamp = Some(now());
                pv.status.as_mut().expect("status").phase = Some("Bound".into());
            }),
            &gate_on,
            skip(DeleteSkipReason::NotReleased {
                phase: "Bound".into(),
            }),
        ),
        (
            "deleted PV without our finalizer",
            deleting_without_finalizer.clone(),
            &gate_on,
            skip(DeleteSkipReason::AlreadyDeleted),
        ),
        (
            "deleted PV, gate off",
            deleting,
            &gate_off,
            skip(DeleteSkipReason::BeingDeleted),
        ),
        (
            "deleted PV without finalizer, gate off",
            deleting_without_finalizer,
            &gate_off,
            skip(DeleteSkipReason::BeingDeleted),
        ),
    ];
    for (name, pv, config, expected) in cases {
        assert_eq!(should_delete(&pv, config), expected, "{name}");
    }
}

#[test]
fn node_deployment_deletes_only_its_own_volumes() {
    let node_config = |zone: Option<&str>| ProvisionerConfig {
        node_deployment: Some(NodeDeployment {
            node_name: "node-1".into(),
            immediate_binding: true,
            accessible_topology: zone.map(|zone| map(&[("zone", zone)])),
            ..NodeDeployment::default()
        }),
        ..config()
    };
    let pinned = edit(|pv| {
        pv.spec.as_mut().expect("spec").node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "zone".into(),
                        operator: "In".into(),
                        values: Some(vec!["a".into()]),
                    }]),
                    match_fields: None,
                }],
            }),
        });
    });
    assert_eq!(
        should_delete(&pinned, &node_config(Some("a"))),
        DeleteDecision::Delete
    );
    assert_eq!(
        should_delete(&pinned, &node_config(Some("b"))),
        DeleteDecision::Skip(DeleteSkipReason::NotProvisionedOnThisNode)
    );
    assert_eq!(
        should_delete(&pinned, &node_config(None)),
        DeleteDecision::Delete
    );
    assert_eq!(
        should_delete(&released_volume(), &node_config(Some("b"))),
        DeleteDecision::Delete
    );
}

#[test]
fn which_volumes_are_on_this_node() {
    let node_config = |topology: Option<&[(&str, &str)]>| ProvisionerConfig {
        node_deployment: Some(NodeDeployment {
            node_name: "node-1".into(),
            accessible_topology: topology.map(map),
            ..NodeDeployment::default()
        }),
        ..config()
    };
    let pinned_to = |operator: &str, values: Option<Vec<String>>| {
        edit(|pv| {
            pv.spec.as_mut().expect("spec").node_affinity = Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "node".into(),
                            operator: operator.into(),
                            values: values.clone(),
                        }]),
                        match_fields: None,
                    }],
                }),
            });
        })
    };
    let on_1 = pinned_to("In", Some(vec!["node-1".into()]));
    let on_2 = pinned_to("In", Some(vec!["node-2".into()]));
    let anywhere = released_volume();
    let has_key = pinned_to("Exists", None);
    let here: &[(&str, &str)] = &[("node", "node-1")];
    let elsewhere_key: &[(&str, &str)] = &[("zone", "a")];
    for (what, pv, config, expected) in [
        ("not node mode", &on_2, config(), true),
        ("pinned here", &on_1, node_config(Some(here)), true),
        (
            "pinned to another node",
            &on_2,
            node_config(Some(here)),
            false,
        ),
        ("no node affinity", &anywhere, node_config(Some(here)), true),
        (
            "driver reported no topology",
            &on_2,
            node_config(None),
            true,
        ),
        (
            "topology without the key",
            &on_1,
            node_config(Some(elsewhere_key)),
            false,
        ),
        ("Exists on our key", &has_key, node_config(Some(here)), true),
        (
            "Exists without our key",
            &has_key,
            node_config(Some(elsewhere_key)),
            false,
        ),
    ] {
        assert_eq!(volume_on_this_node(pv, &config), expected, "{what}");
    }
}

fn secret(name: &str, namespace: &str) -> Option<SecretRef> {
    Some(SecretRef {
        name: name.into(),
        namespace: namespace.into(),
    })
}

fn templated_class() -> StorageClass {
    StorageClass {
        parameters: Some(map(&[
            (wk::PARAM_PROVISIONER_SECRET_NAME, "${pvc.name}-${pv.name}"),
            (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "${pvc.namespace}"),
        ])),
        ..class()
    }
}

#[test]
fn deletion_secrets() {
    let class = templated_class();
    let with_annotations = |name: &str, namespace: &str| {
        edit(|pv| {
            annotate(&mut pv.metadata, wk::ANN_DELETION_SECRET_NAME, name);
            annotate(
                &mut pv.metadata,
                wk::ANN_DELETION_SECRET_NAMESPACE,
                namespace,
            );
        })
    };
    assert_eq!(
        deletion_secret_ref(&with_annotations("s", "ns"), Some(&class)),
        Ok(secret("s", "ns")),
        "annotations win over the class"
    );
    assert_eq!(
        deletion_secret_ref(&with_annotations("", ""), Some(&class)),
        Ok(None),
        "empty annotations record that no secret is needed"
    );
    assert_eq!(
        deletion_secret_ref(&with_annotations("s", ""), Some(&class)),
        Ok(None)
    );
    let only_name = edit(|pv| annotate(&mut pv.metadata, wk::ANN_DELETION_SECRET_NAME, "s"));
    assert_eq!(
        deletion_secret_ref(&only_name, Some(&class)),
        Ok(secret(&format!("data-{VOLUME}"), "ns")),
        "half the annotation pair falls back to the class"
    );
    assert_eq!(
        deletion_secret_ref(&released_volume(), Some(&class)),
        Ok(secret(&format!("data-{VOLUME}"), "ns"))
    );
    assert_eq!(
        deletion_secret_ref(&released_volume(), None),
        Ok(None),
        "class gone"
    );
    assert_eq!(
        deletion_secret_ref(
            &released_volume(),
            Some(&crate::provision::fixtures::class())
        ),
        Ok(None)
    );
    let no_claim_ref = edit(|pv| pv.spec.as_mut().expect("spec").claim_ref = None);
    assert_eq!(deletion_secret_ref(&no_claim_ref, Some(&class)), Ok(None));

    let annotation_template = StorageClass {
        parameters: Some(map(&[
            (wk::PARAM_PROVISIONER_SECRET_NAME, "${pvc.annotations['k']}"),
            (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
        ])),
        ..crate::provision::fixtures::class()
    };
    let error = deletion_secret_ref(&released_volume(), Some(&annotation_template))
        .expect_err("no annotations");
    assert!(matches!(error, DeleteError::Secret { ref volume, .. } if volume == VOLUME));
    assert!(error.to_string().starts_with(&format!(
        "failed to get secretreference for volume {VOLUME}"
    )));
}

#[test]
fn delete_plans() {
    assert_eq!(
        plan_delete(&released_volume(), Some(&templated_class())),
        Ok(DeletePlan {
            volume_id: "handle-1".into(),
            secret: secret(&format!("data-{VOLUME}"), "ns"),
            migrated_from: None,
        })
    );
    let not_csi = edit(|pv| pv.spec.as_mut().expect("spec").csi = None);
    assert_eq!(plan_delete(&not_csi, None), Err(DeleteError::NotCsi));
    // A source the translation does not know (NFS) is no CSI PV either.
    // (As the cache decodes it: the projection has no NFS source.)
    let nfs: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": VOLUME},
        "spec": {"nfs": {"path": "/export", "server": "nfs"}, "persistentVolumeReclaimPolicy": "Delete"},
    }))
    .expect("pv");
    assert_eq!(plan_delete(&nfs, None), Err(DeleteError::NotCsi));
}

fn migrated(change: impl FnOnce(&mut PersistentVolume)) -> PersistentVolume {
    let mut pv = migrated_volume();
    change(&mut pv);
    pv
}

fn in_tree_source(pv: &mut PersistentVolume) -> &mut crate::projection::PersistentVolumeSpec {
    let spec = pv.spec.as_mut().expect("spec");
    spec.aws_elastic_block_store = None;
    spec
}

#[test]
fn migrated_volume_ownership() {
    use k8s_openapi::api::core::v1::{GCEPersistentDiskVolumeSource, PortworxVolumeSource};
    let ebs = ebs_config();
    let hostpath = config();
    let cases: Vec<(&str, PersistentVolume, &ProvisionerConfig, bool)> = vec![
        (
            "provisioned-by in-tree, migrated-to us",
            migrated_volume(),
            &ebs,
            true,
        ),
        (
            "provisioned-by in-tree, no migrated-to yet",
            migrated(|pv| {
                pv.metadata.annotations =
                    Some(map(&[(wk::ANN_PROVISIONED_BY, AWS_EBS_PLUGIN)]).into())
            }),
            &ebs,
            true,
        ),
        (
            "static in-tree PV migrated to us",
            migrated(|pv| {
                pv.metadata.annotations = Some(map(&[(wk::ANN_MIGRATED_TO, EBS_DRIVER)]).into())
            }),
            &ebs,
            true,
        ),
        (
            "static in-tree PV, not migrated",
            migrated(|pv| pv.metadata.annotations = None),
            &ebs,
            false,
        ),
        (
            "provisioned by another in-tree plugin",
            migrated(|pv| {
                pv.metadata.annotations =
                    Some(map(&[(wk::ANN_PROVISIONED_BY, "kubernetes.io/gce-pd")]).into())
            }),
            &ebs,
            false,
        ),
        (
            "annotated for us but the source is another plugin's",
            migrated(|pv| {
                in_tree_source(pv).gce_persistent_disk =
                    Some(Box::new(GCEPersistentDiskVolumeSource {
                        pd_name: "d".into(),
                        ..Default::default()
                    }));
            }),
            &ebs,
            false,
        ),
        (
            "a driver that took over no plugin: an in-tree PV is never ours",
            migrated(|pv| {
                pv.metadata.annotations = Some(map(&[(wk::ANN_PROVISIONED_BY, DRIVER)]).into());
                in_tree_source(pv).portworx_volume = Some(Box::new(PortworxVolumeSource {
                    volume_id: "px".into(),
                    ..Default::default()
                }));
            }),
            &hostpath,
            false,
        ),
        (
            "the in-tree name means nothing to another driver",
            migrated_volume(),
            &hostpath,
            false,
        ),
        (
            "native CSI PV of the EBS driver",
            released_volume_of(EBS_DRIVER),
            &ebs,
            true,
        ),
    ];
    for (name, pv, config, expected) in cases {
        assert_eq!(is_our_volume(&pv, config), expected, "{name}");
    }
    assert_eq!(
        should_delete(&migrated_volume(), &ebs),
        DeleteDecision::Delete
    );
}

fn released_volume_of(driver: &str) -> PersistentVolume {
    let mut pv = released_volume();
    annotate(&mut pv.metadata, wk::ANN_PROVISIONED_BY, driver);
    if let Some(csi) = pv.spec.as_mut().and_then(|spec| spec.csi.as_mut()) {
        csi.driver = driver.into();
    }
    pv
}

#[test]
fn migrated_delete_plans() {
    use crate::migration::{InTreePlugin, MigrationError};
    use k8s_openapi::api::core::v1::PortworxVolumeSource;

    // The handle comes from the translation (aws://zone/vol-id → vol-id).
    assert_eq!(
        plan_delete(&migrated_volume(), Some(&gp2_class())),
        Ok(DeletePlan {
            volume_id: "vol-0123".into(),
            secret: None,
            migrated_from: Some(InTreePlugin::AwsEbs),
        })
    );
    assert!(
        plan_delete(&migrated_volume(), None)
            .expect("plan")
            .is_migrated()
    );
    assert!(
        !plan_delete(&released_volume(), None)
            .expect("plan")
            .is_migrated()
    );

    // The id to compare a same-named existing PV by, for both forms.
    assert_eq!(
        volume_id_of(&migrated_volume()),
        Ok(("vol-0123".to_owned(), Some(InTreePlugin::AwsEbs)))
    );
    assert_eq!(
        volume_id_of(&released_volume()),
        Ok(("handle-1".to_owned(), None))
    );

    let malformed = migrated(|pv| {
        if let Some(ebs) = pv
            .spec
            .as_mut()
            .and_then(|spec| spec.aws_elastic_block_store.as_mut())
        {
            ebs.volume_id = "aws://us-east-1a/".into();
        }
    });
    let error = plan_delete(&malformed, None).expect_err("malformed id");
    assert_eq!(
        error,
        DeleteError::Migration(MigrationError::InvalidEbsVolumeId {
            id: "aws://us-east-1a/".into(),
            reason: "is not of the form aws://<zone>/vol-<id>",
        })
    );
    assert!(
        error
            .to_string()
            .starts_with("failed to translate Kubernetes ID to EBS Volume ID")
    );

    // Deletion secrets: the annotations first; the in-tree class only when
    // they are missing, and then translated (Portworx's auth secret becomes
    // the provisioner secret).
    let portworx = migrated(|pv| {
        pv.metadata.annotations =
            Some(map(&[(wk::ANN_PROVISIONED_BY, "kubernetes.io/portworx-volume")]).into());
        in_tree_source(pv).portworx_volume = Some(Box::new(PortworxVolumeSource {
            volume_id: "px-1".into(),
            ..Default::default()
        }));
    });
    let portworx_class = StorageClass {
        provisioner: "kubernetes.io/portworx-volume".into(),
        parameters: Some(map(&[
            ("openstorage.io/auth-secret-name", "px-${pvc.name}"),
            ("openstorage.io/auth-secret-namespace", "${pvc.namespace}"),
        ])),
        ..gp2_class()
    };
    assert_eq!(
        plan_delete(&portworx, Some(&portworx_class)),
        Ok(DeletePlan {
            volume_id: "px-1".into(),
            secret: secret("px-data", "ns"),
            migrated_from: Some(InTreePlugin::Portworx),
        })
    );
    let broken_class = StorageClass {
        parameters: Some(map(&[("zone", "us-east-1a")])),
        allowed_topologies: Some(vec![Default::default()]),
        ..gp2_class()
    };
    assert_eq!(
        plan_delete(&migrated_volume(), Some(&broken_class)),
        Err(DeleteError::Migration(
            MigrationError::ZoneParametersWithAllowedTopologies
        )),
        "the class is needed for the secret and cannot be translated"
    );
    let annotated = migrated(|pv| {
        annotate(&mut pv.metadata, wk::ANN_DELETION_SECRET_NAME, "");
        annotate(&mut pv.metadata, wk::ANN_DELETION_SECRET_NAMESPACE, "");
    });
    assert_eq!(
        plan_delete(&annotated, Some(&broken_class)).map(|plan| plan.secret),
        Ok(None),
        "with the annotations the class is not read"
    );
}

#[test]
fn the_detach_wait_has_upstreams_wording() {
    assert_eq!(
        still_attached_message(VOLUME, "node-b"),
        format!("persistentvolume {VOLUME} is still attached to node node-b")
    );
}
