use std::collections::HashMap;

use csi_proto::v1::Topology;
use k8s_openapi::api::core::v1::TopologySelectorTerm;

use super::*;
use crate::provision::fixtures::{DRIVER, annotate, claim, class, config, map, topology_term};

const KEY: &str = "topology.hostpath.csi/node";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn node(name: &str, topology: Option<&[(&str, &str)]>) -> NodeDeployment {
    NodeDeployment {
        node_name: name.to_owned(),
        node_id: format!("{name}-id"),
        immediate_binding: true,
        base_delay: ms(100),
        max_delay: ms(500),
        accessible_topology: topology.map(map),
    }
}

#[test]
fn delays_follow_the_jittered_exponential_backoff() {
    let nan = f64::NAN;
    for (base, max, attempt, jitter, want) in [
        // First attempt: up to the base delay.
        (ms(100), ms(500), 0, 0.0, ms(100)),
        (ms(100), ms(500), 0, 0.5, ms(50)),
        (ms(100), ms(500), 0, 1.0, ms(0)),
        // Later attempts double, capped by the maximum.
        (ms(100), ms(500), 1, 0.0, ms(200)),
        (ms(100), ms(500), 1, 0.25, ms(175)),
        (ms(100), ms(500), 2, 0.0, ms(400)),
        (ms(100), ms(500), 3, 0.0, ms(500)),
        (ms(100), ms(500), 3, 0.5, ms(450)),
        // Upstream defaults.
        (ms(20_000), ms(60_000), 0, 0.25, ms(15_000)),
        (ms(20_000), ms(60_000), 5, 0.0, ms(60_000)),
        // Bad inputs: huge attempt counts, jitter outside [0, 1) or NaN,
        // a maximum below the base, zero delays.
        (ms(100), ms(500), u32::MAX, 0.0, ms(500)),
        (ms(100), ms(500), 40, 0.1, ms(490)),
        (ms(100), ms(500), 0, -3.0, ms(100)),
        (ms(100), ms(500), 0, 7.0, ms(0)),
        (ms(100), ms(500), 0, nan, ms(100)),
        (ms(100), ms(500), 0, f64::INFINITY, ms(100)),
        (ms(1000), ms(100), 0, 0.0, ms(100)),
        (ms(1000), ms(100), 0, 0.5, ms(0)),
        (ms(0), ms(0), 3, 0.5, ms(0)),
        (ms(0), ms(500), 3, 0.5, ms(0)),
        (Duration::MAX, Duration::MAX, 2, 0.0, Duration::MAX),
        (Duration::MAX, Duration::MAX, 0, 1.0, ms(0)),
    ] {
        assert_eq!(
            owner_delay(base, max, attempt, jitter),
            want,
            "base {base:?} max {max:?} attempt {attempt} jitter {jitter}"
        );
    }
}

#[test]
fn poll_interval_is_a_hundredth_of_the_base_but_at_least_10ms() {
    for (base, want) in [
        (ms(20_000), ms(200)),
        (ms(100), ms(10)),
        (ms(0), ms(10)),
        (ms(5_000), ms(50)),
    ] {
        assert_eq!(owner_poll_interval(base), want, "{base:?}");
    }
}

#[test]
fn node_name_is_required() {
    for (value, want) in [
        (Some("node-a"), Ok("node-a".to_owned())),
        (Some(" node-a\n"), Ok("node-a".to_owned())),
        (Some(""), Err(NodeDeploymentError::MissingNodeName)),
        (Some("   "), Err(NodeDeploymentError::MissingNodeName)),
        (None, Err(NodeDeploymentError::MissingNodeName)),
    ] {
        assert_eq!(node_name(value), want, "{value:?}");
    }
    assert!(
        NodeDeploymentError::MissingNodeName
            .to_string()
            .contains("NODE_NAME")
    );
    // What would be right.
    assert!(
        NodeDeploymentError::MissingNodeName
            .to_string()
            .ends_with("; set it from the downward API (env NODE_NAME with valueFrom.fieldRef.fieldPath: spec.nodeName)")
    );
}

#[test]
fn settings_from_flags_and_node_info() {
    let flags = NodeDeploymentFlags {
        immediate_binding: false,
        base_delay: ms(1),
        max_delay: ms(2),
    };
    let with_topology = NodeGetInfoResponse {
        node_id: "id-a".into(),
        max_volumes_per_node: 0,
        accessible_topology: Some(Topology {
            segments: HashMap::from([(KEY.to_owned(), "node-a".to_owned())]),
        }),
    };
    assert_eq!(
        node_deployment("node-a", flags, &with_topology),
        NodeDeployment {
            node_name: "node-a".into(),
            node_id: "id-a".into(),
            immediate_binding: false,
            base_delay: ms(1),
            max_delay: ms(2),
            accessible_topology: Some(map(&[(KEY, "node-a")])),
        }
    );
    let without = NodeGetInfoResponse {
        accessible_topology: None,
        ..with_topology
    };
    assert_eq!(
        node_deployment("node-a", flags, &without).accessible_topology,
        None
    );
}

#[test]
fn identity_and_journal_are_per_node() {
    let a = node("node-a", None);
    assert_eq!(node_identity("1-2-d", Some(&a)), "1-2-d-node-a");
    assert_eq!(node_identity("1-2-d", None), "1-2-d");
    assert_eq!(journal_owner(DRIVER, Some(&a)), format!("{DRIVER}-node-a"));
    assert_eq!(journal_owner(DRIVER, None), DRIVER);
    assert_ne!(
        journal_owner(DRIVER, Some(&a)),
        journal_owner(DRIVER, Some(&node("node-b", None)))
    );
}

#[test]
fn local_topology_objects() {
    let local = LocalTopology::new(DRIVER, &node("node-a", Some(&[(KEY, "node-a")])));
    assert_eq!(local.name(), "node-a");
    assert_eq!(local.node.metadata.labels, Some(map(&[(KEY, "node-a")])));
    let entry = &local.csi_node.spec.drivers[0];
    assert_eq!(entry.name, DRIVER);
    assert_eq!(entry.node_id, "node-a-id");
    assert_eq!(entry.topology_keys, Some(vec![KEY.to_owned()]));
    assert_eq!(local.csi_node.metadata.name.as_deref(), Some("node-a"));

    let bare = LocalTopology::new(DRIVER, &node("node-b", None));
    assert_eq!(bare.node.metadata.labels, None);
    assert_eq!(bare.csi_node.spec.drivers[0].topology_keys, None);
}

fn allowed(key: &str, values: &[&str]) -> Vec<TopologySelectorTerm> {
    vec![topology_term(&[(key, values)])]
}

#[test]
fn allowed_topologies_must_admit_this_node() {
    let topology_on = ProvisionerConfig {
        topology_enabled: true,
        ..config()
    };
    let strict = ProvisionerConfig {
        strict_topology: true,
        ..topology_on.clone()
    };
    let topology_off = config();
    let on_a = LocalTopology::new(DRIVER, &node("node-a", Some(&[(KEY, "node-a")])));
    let no_topology = LocalTopology::new(DRIVER, &node("node-a", None));
    let class_with = |terms: Option<Vec<TopologySelectorTerm>>| StorageClass {
        allowed_topologies: terms,
        ..class()
    };
    for (what, class, local, config, admitted) in [
        (
            "no allowedTopologies",
            class_with(None),
            &on_a,
            &topology_on,
            true,
        ),
        (
            "empty allowedTopologies",
            class_with(Some(vec![])),
            &on_a,
            &topology_on,
            true,
        ),
        (
            "this node allowed",
            class_with(Some(allowed(KEY, &["node-a"]))),
            &on_a,
            &topology_on,
            true,
        ),
        (
            "one of several allowed",
            class_with(Some(allowed(KEY, &["node-b", "node-a"]))),
            &on_a,
            &topology_on,
            true,
        ),
        (
            "only another node allowed",
            class_with(Some(allowed(KEY, &["node-b"]))),
            &on_a,
            &topology_on,
            false,
        ),
        (
            "only another node allowed, strict topology",
            class_with(Some(allowed(KEY, &["node-b"]))),
            &on_a,
            &strict,
            false,
        ),
        (
            "this node allowed, strict topology",
            class_with(Some(allowed(KEY, &["node-a"]))),
            &on_a,
            &strict,
            true,
        ),
        (
            "a key this node does not have",
            class_with(Some(allowed("zone", &["z1"]))),
            &on_a,
            &topology_on,
            false,
        ),
        (
            "driver reported no topology",
            class_with(Some(allowed(KEY, &["node-a"]))),
            &no_topology,
            &topology_on,
            false,
        ),
        (
            "topology off: the class cannot restrict",
            class_with(Some(allowed(KEY, &["node-b"]))),
            &on_a,
            &topology_off,
            true,
        ),
    ] {
        let result = allowed_topologies_admit(&class, "data", local, config);
        assert_eq!(result.is_ok(), admitted, "{what}: {result:?}");
    }
}

#[test]
fn polling_the_claim() {
    let uid = crate::provision::fixtures::CLAIM_UID;
    let unowned = claim();
    let mut ours = claim();
    annotate(&mut ours.metadata, wk::ANN_SELECTED_NODE, "node-a");
    let mut theirs = claim();
    annotate(&mut theirs.metadata, wk::ANN_SELECTED_NODE, "node-b");
    let mut empty = claim();
    annotate(&mut empty.metadata, wk::ANN_SELECTED_NODE, "");
    let mut replaced = theirs.clone();
    replaced.metadata.uid = Some("other-uid".into());
    let mut no_uid = claim();
    no_uid.metadata.uid = None;
    for (what, current, want) in [
        ("gone", None, ClaimPoll::Gone),
        ("unowned", Some(&unowned), ClaimPoll::Unowned),
        ("empty annotation", Some(&empty), ClaimPoll::Unowned),
        ("ours", Some(&ours), ClaimPoll::Ours),
        ("theirs", Some(&theirs), ClaimPoll::OwnedBy("node-b".into())),
        ("replaced", Some(&replaced), ClaimPoll::Replaced),
        ("no uid", Some(&no_uid), ClaimPoll::Replaced),
    ] {
        assert_eq!(poll_claim(current, uid, "node-a"), want, "{what}");
    }
}

#[test]
fn the_owned_claim_names_this_node() {
    let owned = claim_owned_by(&claim(), "node-a");
    assert_eq!(crate::provision::selected_node_name(&owned), Some("node-a"));
    let mut theirs = claim();
    annotate(&mut theirs.metadata, wk::ANN_SELECTED_NODE, "node-b");
    let owned = claim_owned_by(&theirs, "node-a");
    assert_eq!(crate::provision::selected_node_name(&owned), Some("node-a"));
    let mut bare = claim();
    bare.metadata.annotations = None;
    assert_eq!(
        crate::provision::selected_node_name(&claim_owned_by(&bare, "n")),
        Some("n")
    );
}

#[test]
fn capacity() {
    for (required, available, want) in [
        (0, &[][..], true),
        (-5, &[][..], true),
        (10, &[][..], false),
        (10, &[5][..], false),
        (10, &[10][..], true),
        (10, &[5, 20][..], true),
        (10, &[0, 0][..], false),
        (i64::MAX, &[i64::MAX][..], true),
    ] {
        assert_eq!(
            has_capacity(required, available),
            want,
            "{required} in {available:?}"
        );
    }
}

#[test]
fn the_patch_is_guarded_by_resource_version_and_uid() {
    assert_eq!(
        become_owner_patch("node-a", "42", "u-1"),
        serde_json::json!({"metadata": {
            "resourceVersion": "42",
            "uid": "u-1",
            "annotations": {"volume.kubernetes.io/selected-node": "node-a"},
        }})
    );
}

#[test]
fn patch_failures() {
    for (code, want) in [
        (Some(409), TakeFailure::Conflict),
        (Some(404), TakeFailure::Gone),
        (Some(422), TakeFailure::Gone),
        (Some(403), TakeFailure::Other),
        (Some(429), TakeFailure::Other),
        (Some(500), TakeFailure::Other),
        (None, TakeFailure::Other),
    ] {
        assert_eq!(take_failure(code), want, "{code:?}");
    }
}
