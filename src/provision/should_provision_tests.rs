use super::*;
use crate::provision::config::NodeDeployment;
use crate::provision::fixtures::{DRIVER, annotate, claim, claim_spec, class, config, now};

fn node_config(immediate_binding: bool) -> ProvisionerConfig {
    ProvisionerConfig {
        node_deployment: Some(NodeDeployment {
            node_name: "node-1".to_owned(),
            immediate_binding,
            accessible_topology: None,
            ..NodeDeployment::default()
        }),
        ..config()
    }
}

fn wffc() -> StorageClass {
    StorageClass {
        volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
        ..class()
    }
}

fn with_selected(node: &str) -> PersistentVolumeClaim {
    let mut claim = claim();
    annotate(&mut claim.metadata, wk::ANN_SELECTED_NODE, node);
    claim
}

#[test]
fn decisions() {
    let skip = ProvisionDecision::Skip;
    let bound = {
        let mut claim = claim();
        claim_spec(&mut claim).volume_name = Some("pv-1".to_owned());
        claim
    };
    let empty_volume_name = {
        let mut claim = claim();
        claim_spec(&mut claim).volume_name = Some(String::new());
        claim
    };
    let deleting = {
        let mut claim = claim();
        claim.metadata.deletion_timestamp = Some(now());
        claim
    };
    let other_driver = {
        let mut claim = claim();
        annotate(
            &mut claim.metadata,
            wk::ANN_STORAGE_PROVISIONER,
            "other.csi",
        );
        claim
    };
    let unannotated = {
        let mut claim = claim();
        claim.metadata.annotations = None;
        claim
    };
    let beta_only = {
        let mut claim = claim();
        claim.metadata.annotations = Some(
            crate::provision::fixtures::map(&[(wk::ANN_BETA_STORAGE_PROVISIONER, DRIVER)]).into(),
        );
        claim
    };
    let ga_wins_over_beta = {
        let mut claim = claim();
        annotate(
            &mut claim.metadata,
            wk::ANN_STORAGE_PROVISIONER,
            "other.csi",
        );
        annotate(
            &mut claim.metadata,
            wk::ANN_BETA_STORAGE_PROVISIONER,
            DRIVER,
        );
        claim
    };
    let migrated_only = {
        let mut claim = claim();
        claim.metadata.annotations = Some(
            crate::provision::fixtures::map(&[
                (wk::ANN_STORAGE_PROVISIONER, "kubernetes.io/gce-pd"),
                (wk::ANN_MIGRATED_TO, DRIVER),
            ])
            .into(),
        );
        claim
    };
    let other_class = StorageClass {
        provisioner: "other.csi".to_owned(),
        ..class()
    };
    let alpha_selected = {
        let mut claim = claim();
        annotate(&mut claim.metadata, wk::ANN_ALPHA_SELECTED_NODE, "node-1");
        claim
    };
    let unset_binding = StorageClass {
        volume_binding_mode: None,
        ..class()
    };

    let cases: Vec<(
        &str,
        PersistentVolumeClaim,
        Option<StorageClass>,
        ProvisionerConfig,
        ProvisionDecision,
    )> = vec![
        (
            "immediate claim",
            claim(),
            Some(class()),
            config(),
            ProvisionDecision::Provision,
        ),
        (
            "bound claim",
            bound,
            Some(class()),
            config(),
            skip(SkipReason::AlreadyBound {
                volume_name: "pv-1".to_owned(),
            }),
        ),
        (
            "empty volumeName is unbound",
            empty_volume_name,
            Some(class()),
            config(),
            ProvisionDecision::Provision,
        ),
        (
            "claim being deleted",
            deleting,
            Some(class()),
            config(),
            skip(SkipReason::BeingDeleted),
        ),
        (
            "other provisioner",
            other_driver,
            Some(class()),
            config(),
            skip(SkipReason::NotOurProvisioner {
                annotated: Some("other.csi".to_owned()),
            }),
        ),
        (
            "no annotation",
            unannotated,
            Some(class()),
            config(),
            skip(SkipReason::NotOurProvisioner { annotated: None }),
        ),
        (
            "beta annotation",
            beta_only,
            Some(class()),
            config(),
            ProvisionDecision::Provision,
        ),
        (
            "GA annotation wins",
            ga_wins_over_beta,
            Some(class()),
            config(),
            skip(SkipReason::NotOurProvisioner {
                annotated: Some("other.csi".to_owned()),
            }),
        ),
        (
            "migrated-to alone is not enough without migration support",
            migrated_only,
            Some(class()),
            config(),
            skip(SkipReason::NotOurProvisioner {
                annotated: Some("kubernetes.io/gce-pd".to_owned()),
            }),
        ),
        (
            "class missing",
            claim(),
            None,
            config(),
            skip(SkipReason::StorageClassNotFound {
                name: "fast".to_owned(),
            }),
        ),
        (
            "class of another provisioner",
            claim(),
            Some(other_class),
            config(),
            skip(SkipReason::ClassOfOtherProvisioner {
                provisioner: "other.csi".to_owned(),
            }),
        ),
        (
            "WFFC without node",
            claim(),
            Some(wffc()),
            config(),
            skip(SkipReason::WaitingForSelectedNode),
        ),
        (
            "WFFC with empty node",
            with_selected(""),
            Some(wffc()),
            config(),
            skip(SkipReason::WaitingForSelectedNode),
        ),
        (
            "WFFC with node",
            with_selected("node-9"),
            Some(wffc()),
            config(),
            ProvisionDecision::Provision,
        ),
        (
            "WFFC ignores the alpha annotation",
            alpha_selected,
            Some(wffc()),
            config(),
            skip(SkipReason::WaitingForSelectedNode),
        ),
        (
            "node mode: our node",
            with_selected("node-1"),
            Some(wffc()),
            node_config(true),
            ProvisionDecision::Provision,
        ),
        (
            "node mode: other node",
            with_selected("node-2"),
            Some(wffc()),
            node_config(true),
            skip(SkipReason::SelectedOtherNode {
                node: "node-2".to_owned(),
            }),
        ),
        (
            "node mode: immediate, take it",
            claim(),
            Some(class()),
            node_config(true),
            ProvisionDecision::BecomeOwner,
        ),
        (
            "node mode: immediate binding off",
            claim(),
            Some(class()),
            node_config(false),
            skip(SkipReason::NotForThisNode),
        ),
        (
            "node mode: WFFC without node",
            claim(),
            Some(wffc()),
            node_config(true),
            skip(SkipReason::NotForThisNode),
        ),
        (
            "node mode: unset binding mode is not Immediate",
            claim(),
            Some(unset_binding),
            node_config(true),
            skip(SkipReason::NotForThisNode),
        ),
    ];
    for (name, claim, class, config, expected) in cases {
        assert_eq!(
            should_provision(&claim, class.as_ref(), &config),
            expected,
            "{name}"
        );
    }
}

#[test]
fn only_a_missing_class_is_retried() {
    assert!(SkipReason::StorageClassNotFound { name: "x".into() }.retry_later());
    assert!(!SkipReason::BeingDeleted.retry_later());
    assert!(!SkipReason::WaitingForSelectedNode.retry_later());
    assert_eq!(
        SkipReason::StorageClassNotFound { name: "x".into() }.to_string(),
        "storageClass \"x\" not found"
    );
}

/// CSI migration (upstream's TestProvisionWithMigration, with the real
/// plugin names): our driver `ebs.csi.aws.com` also answers for
/// `kubernetes.io/aws-ebs`.
#[test]
fn migrated_claims() {
    use crate::provision::fixtures::{
        AWS_EBS_PLUGIN, EBS_DRIVER, ebs_config, gp2_claim, gp2_class, map,
    };
    let skip = ProvisionDecision::Skip;
    let annotated = |pairs: &[(&str, &str)]| {
        let mut claim = gp2_claim();
        claim.metadata.annotations = Some(map(pairs).into());
        claim
    };
    let class_of = |provisioner: &str| StorageClass {
        provisioner: provisioner.to_owned(),
        ..gp2_class()
    };
    let wffc_gp2 = StorageClass {
        volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
        ..gp2_class()
    };
    let ebs = ebs_config();
    let cases: Vec<(
        &str,
        PersistentVolumeClaim,
        StorageClass,
        ProvisionerConfig,
        ProvisionDecision,
    )> = vec![
        (
            "1.36 form: CSI name on the claim, in-tree class",
            gp2_claim(),
            gp2_class(),
            ebs.clone(),
            ProvisionDecision::Provision,
        ),
        (
            "1.36 form, beta annotation only",
            annotated(&[(wk::ANN_BETA_STORAGE_PROVISIONER, EBS_DRIVER)]),
            gp2_class(),
            ebs.clone(),
            ProvisionDecision::Provision,
        ),
        (
            "old form: in-tree name and migrated-to us",
            annotated(&[
                (wk::ANN_BETA_STORAGE_PROVISIONER, AWS_EBS_PLUGIN),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
            ]),
            gp2_class(),
            ebs.clone(),
            ProvisionDecision::Provision,
        ),
        (
            "old form, GA annotation",
            annotated(&[
                (wk::ANN_STORAGE_PROVISIONER, AWS_EBS_PLUGIN),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
            ]),
            gp2_class(),
            ebs.clone(),
            ProvisionDecision::Provision,
        ),
        (
            "CSI name and migrated-to us",
            annotated(&[
                (wk::ANN_STORAGE_PROVISIONER, EBS_DRIVER),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
            ]),
            gp2_class(),
            ebs.clone(),
            ProvisionDecision::Provision,
        ),
        (
            "in-tree name without migrated-to: the in-tree plugin's claim",
            annotated(&[(wk::ANN_STORAGE_PROVISIONER, AWS_EBS_PLUGIN)]),
            gp2_class(),
            ebs.clone(),
            skip(SkipReason::InTreeNotMigrated {
                provisioner: AWS_EBS_PLUGIN.to_owned(),
            }),
        ),
        (
            "in-tree name, migrated to some other driver",
            annotated(&[
                (wk::ANN_STORAGE_PROVISIONER, AWS_EBS_PLUGIN),
                (wk::ANN_MIGRATED_TO, "foo"),
            ]),
            gp2_class(),
            ebs.clone(),
            skip(SkipReason::InTreeNotMigrated {
                provisioner: AWS_EBS_PLUGIN.to_owned(),
            }),
        ),
        (
            "random provisioner migrated to us",
            annotated(&[
                (wk::ANN_STORAGE_PROVISIONER, "foo"),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
            ]),
            gp2_class(),
            ebs.clone(),
            skip(SkipReason::NotOurProvisioner {
                annotated: Some("foo".to_owned()),
            }),
        ),
        (
            "another plugin's in-tree name migrated to us",
            annotated(&[
                (wk::ANN_STORAGE_PROVISIONER, "kubernetes.io/gce-pd"),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
            ]),
            gp2_class(),
            ebs.clone(),
            skip(SkipReason::NotOurProvisioner {
                annotated: Some("kubernetes.io/gce-pd".to_owned()),
            }),
        ),
        (
            "native CSI class of our driver",
            gp2_claim(),
            class_of(EBS_DRIVER),
            ebs.clone(),
            ProvisionDecision::Provision,
        ),
        (
            "old form with a native CSI class (upstream accepts it)",
            annotated(&[
                (wk::ANN_STORAGE_PROVISIONER, AWS_EBS_PLUGIN),
                (wk::ANN_MIGRATED_TO, EBS_DRIVER),
            ]),
            class_of(EBS_DRIVER),
            ebs.clone(),
            ProvisionDecision::Provision,
        ),
        (
            "class of another in-tree plugin",
            gp2_claim(),
            class_of("kubernetes.io/gce-pd"),
            ebs.clone(),
            skip(SkipReason::ClassOfOtherProvisioner {
                provisioner: "kubernetes.io/gce-pd".to_owned(),
            }),
        ),
        (
            "WaitForFirstConsumer still waits for the scheduler",
            gp2_claim(),
            wffc_gp2,
            ebs.clone(),
            skip(SkipReason::WaitingForSelectedNode),
        ),
        (
            "a driver that took over no plugin does not answer for in-tree classes",
            claim(),
            class_of(AWS_EBS_PLUGIN),
            config(),
            skip(SkipReason::ClassOfOtherProvisioner {
                provisioner: AWS_EBS_PLUGIN.to_owned(),
            }),
        ),
    ];
    for (name, claim, class, config, expected) in cases {
        assert_eq!(
            should_provision(&claim, Some(&class), &config),
            expected,
            "{name}"
        );
        assert_eq!(
            is_annotated_for_us(&claim, &config),
            !matches!(
                expected,
                ProvisionDecision::Skip(
                    SkipReason::NotOurProvisioner { .. } | SkipReason::InTreeNotMigrated { .. }
                )
            ),
            "{name}: annotation filter"
        );
    }
    assert_eq!(
        SkipReason::InTreeNotMigrated {
            provisioner: AWS_EBS_PLUGIN.to_owned()
        }
        .to_string(),
        "claim is annotated for in-tree provisioner \"kubernetes.io/aws-ebs\" without pv.kubernetes.io/migrated-to: not migrated"
    );
}
