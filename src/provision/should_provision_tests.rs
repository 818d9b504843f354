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
        claim.metadata.annotations = Some(crate::provision::fixtures::map(&[(
            wk::ANN_BETA_STORAGE_PROVISIONER,
            DRIVER,
        )]));
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
        claim.metadata.annotations = Some(crate::provision::fixtures::map(&[
            (wk::ANN_STORAGE_PROVISIONER, "kubernetes.io/gce-pd"),
            (wk::ANN_MIGRATED_TO, DRIVER),
        ]));
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
