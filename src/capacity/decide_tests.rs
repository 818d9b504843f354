//! Table tests of the capacity loop's decisions.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::projection::CSIStorageCapacity;
use crate::projection::Node;
use crate::projection::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
};
use serde_json::json;

use super::decide::*;
use super::{CapacityError, Settings, check_driver};

const DRIVER: &str = "hostpath.csi.k8s.io";
const ZONE: &str = "topology.kubernetes.io/zone";
const HOST: &str = "topology.hostpath.csi/node";

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("node")
}

/// A CSINode with `drivers`: (driver name, topology keys or None).
fn csi_node(name: &str, drivers: &[(&str, Option<&[&str]>)]) -> CSINode {
    let drivers: Vec<serde_json::Value> = drivers
        .iter()
        .map(|(d, keys)| match keys {
            Some(keys) => json!({"name": d, "nodeID": name, "topologyKeys": keys}),
            None => json!({"name": d, "nodeID": name}),
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"drivers": drivers}}))
        .expect("csinode")
}

fn seg(pairs: &[(&str, &str)]) -> Segment {
    Segment::from_pairs(pairs.iter().copied())
}

#[test]
fn segments_table() {
    let both = [ZONE, HOST];
    let zone_only = [ZONE];
    type Case = (&'static str, bool, Vec<Node>, Vec<CSINode>, Vec<Segment>);
    let cases: Vec<Case> = vec![
        (
            "no topology: one empty segment, whatever the nodes",
            false,
            vec![node("n1", &[(ZONE, "a")])],
            vec![csi_node("n1", &[(DRIVER, Some(&zone_only))])],
            vec![seg(&[])],
        ),
        (
            "no topology and no nodes: still one segment",
            false,
            vec![],
            vec![],
            vec![seg(&[])],
        ),
        ("topology, no nodes: nothing", true, vec![], vec![], vec![]),
        (
            "nodes of one zone give one segment",
            true,
            vec![node("n1", &[(ZONE, "a")]), node("n2", &[(ZONE, "a")])],
            vec![
                csi_node("n1", &[(DRIVER, Some(&zone_only))]),
                csi_node("n2", &[(DRIVER, Some(&zone_only))]),
            ],
            vec![seg(&[(ZONE, "a")])],
        ),
        (
            "two zones, and a CSINode of another driver ignored",
            true,
            vec![
                node("n1", &[(ZONE, "a")]),
                node("n2", &[(ZONE, "b")]),
                node("n3", &[(ZONE, "c")]),
            ],
            vec![
                csi_node("n1", &[(DRIVER, Some(&zone_only))]),
                csi_node(
                    "n2",
                    &[("other.csi", Some(&zone_only)), (DRIVER, Some(&zone_only))],
                ),
                csi_node("n3", &[("other.csi", Some(&zone_only))]),
            ],
            vec![seg(&[(ZONE, "a")]), seg(&[(ZONE, "b")])],
        ),
        (
            "the driver without topology keys on that node: nothing",
            true,
            vec![node("n1", &[(ZONE, "a")])],
            vec![csi_node("n1", &[(DRIVER, None)])],
            vec![],
        ),
        (
            "a CSINode without its Node: nothing",
            true,
            vec![node("n2", &[(ZONE, "a")])],
            vec![csi_node("n1", &[(DRIVER, Some(&zone_only))])],
            vec![],
        ),
        (
            "a Node missing one of the labels: skipped, the others count",
            true,
            vec![
                node("n1", &[(ZONE, "a")]),
                node("n2", &[(ZONE, "a"), (HOST, "n2")]),
                node("n3", &[]),
            ],
            vec![
                csi_node("n1", &[(DRIVER, Some(&both))]),
                csi_node("n2", &[(DRIVER, Some(&both))]),
                csi_node("n3", &[(DRIVER, Some(&both))]),
            ],
            vec![seg(&[(ZONE, "a"), (HOST, "n2")])],
        ),
        (
            "several keys: one segment per distinct combination, other labels ignored",
            true,
            vec![
                node("n1", &[(ZONE, "a"), (HOST, "n1"), ("x", "1")]),
                node("n2", &[(ZONE, "a"), (HOST, "n2"), ("x", "2")]),
            ],
            vec![
                csi_node("n1", &[(DRIVER, Some(&both))]),
                csi_node("n2", &[(DRIVER, Some(&both))]),
            ],
            vec![
                seg(&[(ZONE, "a"), (HOST, "n1")]),
                seg(&[(ZONE, "a"), (HOST, "n2")]),
            ],
        ),
    ];
    for (what, topology, nodes, csi_nodes, want) in cases {
        let node_refs: Vec<&Node> = nodes.iter().collect();
        let csi_refs: Vec<&CSINode> = csi_nodes.iter().collect();
        let got = segments(DRIVER, topology, &node_refs, &csi_refs);
        let want: BTreeSet<Segment> = want.into_iter().collect();
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn segment_changes_table() {
    let (a, b, c) = (
        seg(&[(ZONE, "a")]),
        seg(&[(ZONE, "b")]),
        seg(&[(ZONE, "c")]),
    );
    let set = |s: &[&Segment]| -> BTreeSet<Segment> { s.iter().map(|s| (*s).clone()).collect() };
    for (name, last, now, added, removed) in [
        (
            "first computation: all new",
            None,
            set(&[&a, &b]),
            vec![&a, &b],
            vec![],
        ),
        ("first computation, none", None, set(&[]), vec![], vec![]),
        (
            "unchanged",
            Some(set(&[&a, &b])),
            set(&[&a, &b]),
            vec![],
            vec![],
        ),
        (
            "one added",
            Some(set(&[&a])),
            set(&[&a, &b]),
            vec![&b],
            vec![],
        ),
        (
            "one removed",
            Some(set(&[&a, &b])),
            set(&[&b]),
            vec![],
            vec![&a],
        ),
        (
            "replaced",
            Some(set(&[&a, &b])),
            set(&[&b, &c]),
            vec![&c],
            vec![&a],
        ),
        ("all gone", Some(set(&[&a])), set(&[]), vec![], vec![&a]),
    ] {
        assert_eq!(
            segment_changes(last.as_ref(), &now),
            (added, removed),
            "{name}"
        );
    }
}

fn class(name: &str, provisioner: &str, mode: Option<&str>) -> StorageClass {
    let mut v = json!({"metadata": {"name": name}, "provisioner": provisioner,
        "parameters": {"kind": "fast", "csi.storage.k8s.io/fstype": "ext4"}});
    if let Some(mode) = mode {
        v["volumeBindingMode"] = json!(mode);
    }
    serde_json::from_value(v).expect("class")
}

#[test]
fn wanted_pairs_table() {
    let mut deleted = class("gone", DRIVER, Some("WaitForFirstConsumer"));
    deleted.metadata.deletion_timestamp = Some(Time(Default::default()));
    let classes = [
        class("wffc", DRIVER, Some("WaitForFirstConsumer")),
        class("imm", DRIVER, Some("Immediate")),
        class("default-mode", DRIVER, None),
        class("other", "other.csi", Some("WaitForFirstConsumer")),
        class("weird", DRIVER, Some("Sometimes")),
        deleted,
    ];
    let refs: Vec<&StorageClass> = classes.iter().collect();
    let segs: BTreeSet<Segment> = [seg(&[(ZONE, "a")]), seg(&[(ZONE, "b")])].into();
    let names = |pairs: BTreeSet<Pair>| -> Vec<(String, String)> {
        let mut v: Vec<_> = pairs
            .into_iter()
            .map(|p| (p.class, p.segment.to_string()))
            .collect();
        v.sort();
        v
    };
    let s = |c: &str, z: &str| (c.to_owned(), format!("{{{ZONE}={z}}}"));
    assert_eq!(
        names(wanted(DRIVER, &refs, &segs, false)),
        vec![s("wffc", "a"), s("wffc", "b")],
        "only WaitForFirstConsumer classes of this driver"
    );
    assert_eq!(
        names(wanted(DRIVER, &refs, &segs, true)),
        vec![
            s("default-mode", "a"),
            s("default-mode", "b"),
            s("imm", "a"),
            s("imm", "b"),
            s("wffc", "a"),
            s("wffc", "b"),
        ],
        "--capacity-for-immediate-binding adds Immediate classes (absent mode = Immediate)"
    );
    assert!(
        wanted(DRIVER, &refs, &BTreeSet::new(), true).is_empty(),
        "no segment, no pair"
    );
    assert!(wanted("nobody", &refs, &segs, true).is_empty());
}

#[test]
fn capacity_request_strips_sidecar_parameters_and_sends_the_segment() {
    let c = class("wffc", DRIVER, Some("WaitForFirstConsumer"));
    let r = capacity_request(&c, &seg(&[(ZONE, "a")]));
    assert_eq!(
        r.parameters,
        HashMap::from([("kind".to_owned(), "fast".to_owned())])
    );
    let topology = r.accessible_topology.expect("topology");
    assert_eq!(
        topology.segments,
        HashMap::from([(ZONE.to_owned(), "a".to_owned())])
    );
    assert!(r.volume_capabilities.is_empty());
    let r = capacity_request(&c, &seg(&[]));
    assert!(r.accessible_topology.is_none(), "no topology: none sent");
    let mut bare = c.clone();
    bare.parameters = None;
    assert!(capacity_request(&bare, &seg(&[])).parameters.is_empty());
}

#[test]
fn reported_values_are_checked() {
    assert_eq!(
        Reported::from_response(10, Some(5)),
        Ok(Reported {
            available: 10,
            maximum: Some(5)
        })
    );
    assert_eq!(
        Reported::from_response(0, None),
        Ok(Reported {
            available: 0,
            maximum: None
        })
    );
    assert!(Reported::from_response(-1, None).is_err());
    assert!(Reported::from_response(1, Some(-1)).is_err());
}

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "me".into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn publisher(owner_uid: Option<&str>) -> Publisher {
    Publisher {
        driver: DRIVER.into(),
        managed_by: MANAGED_BY_CENTRAL.into(),
        namespace: "ns".into(),
        owner: owner_uid.map(owner),
    }
}

fn pair(class: &str, zone: &str) -> Pair {
    Pair {
        segment: seg(&[(ZONE, zone)]),
        class: class.into(),
    }
}

/// One of our objects as the API server returns it.
fn object(
    name: &str,
    p: &Pair,
    capacity: &str,
    max: Option<&str>,
    created: i64,
) -> CSIStorageCapacity {
    let mut o = publisher(None).new_object(
        p,
        Reported {
            available: 0,
            maximum: None,
        },
    );
    o.metadata.name = Some(name.into());
    o.metadata.generate_name = None;
    o.metadata.resource_version = Some("7".into());
    o.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(created).expect("time"),
    ));
    o.capacity = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
        capacity.into(),
    ));
    o.maximum_volume_size =
        max.map(|m| k8s_openapi::apimachinery::pkg::api::resource::Quantity(m.into()));
    o
}

fn rep(available: i64, maximum: Option<i64>) -> Reported {
    Reported { available, maximum }
}

const GI: i64 = 1 << 30;

/// Actions in a comparable form: (verb, name or pair, capacity).
fn summary(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Create { pair, object } => format!(
                "create {pair} {} {:?}",
                object
                    .capacity
                    .as_ref()
                    .map(|q| q.0.as_str())
                    .unwrap_or("-"),
                object.maximum_volume_size.as_ref().map(|q| q.0.as_str())
            ),
            Action::Update { pair, object } => format!(
                "update {} {pair} {} {:?}",
                object.metadata.name.as_deref().unwrap_or("?"),
                object
                    .capacity
                    .as_ref()
                    .map(|q| q.0.as_str())
                    .unwrap_or("-"),
                object.maximum_volume_size.as_ref().map(|q| q.0.as_str())
            ),
            Action::Keep { name, .. } => format!("keep {name}"),
            Action::Pending { pair, name } => format!("pending {pair} {name:?}"),
            Action::Delete { name, reason } => format!("delete {name} {reason:?}"),
        })
        .collect()
}

#[test]
fn reconcile_table() {
    let a = pair("fast", "a");
    let b = pair("fast", "b");
    let mut other_driver = object("csisc-other", &a, "1Gi", None, 1);
    other_driver
        .metadata
        .labels
        .as_mut()
        .expect("labels")
        .insert(LABEL_DRIVER_NAME.into(), "other.csi".into());
    let mut node_local = object("csisc-node", &a, "1Gi", None, 1);
    node_local
        .metadata
        .labels
        .as_mut()
        .expect("labels")
        .insert(LABEL_MANAGED_BY.into(), "external-provisioner-node1".into());
    let mut no_topology = object("csisc-nil", &a, "1Gi", None, 1);
    no_topology.node_topology = None;
    let mut expressions = object("csisc-expr", &a, "1Gi", None, 1);
    expressions.node_topology = Some(LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: ZONE.into(),
            operator: "In".into(),
            values: Some(vec!["a".into()]),
        }]),
    });
    let mut unnamed = object("x", &b, "1Gi", None, 1);
    unnamed.metadata.name = None;

    struct Case {
        what: &'static str,
        wanted: Vec<Pair>,
        existing: Vec<CSIStorageCapacity>,
        reported: Vec<(Pair, Reported)>,
        want: Vec<String>,
    }
    let cases = vec![
        Case {
            what: "nothing published yet: create with capacity and maximum",
            wanted: vec![a.clone()],
            existing: vec![],
            reported: vec![(a.clone(), rep(2 * GI, Some(GI)))],
            want: vec![format!("create {a} 2Gi Some(\"1Gi\")")],
        },
        Case {
            what: "no maximum reported: none published",
            wanted: vec![a.clone()],
            existing: vec![],
            reported: vec![(a.clone(), rep(1000, None))],
            want: vec![format!("create {a} 1000 None")],
        },
        Case {
            what: "same values (other spelling): keep, no write",
            wanted: vec![a.clone()],
            existing: vec![object("csisc-1", &a, "2147483648", Some("1Gi"), 1)],
            reported: vec![(a.clone(), rep(2 * GI, Some(GI)))],
            want: vec!["keep csisc-1".into()],
        },
        Case {
            what: "capacity changed: update in place",
            wanted: vec![a.clone()],
            existing: vec![object("csisc-1", &a, "2Gi", Some("1Gi"), 1)],
            reported: vec![(a.clone(), rep(GI, Some(GI)))],
            want: vec![format!("update csisc-1 {a} 1Gi Some(\"1Gi\")")],
        },
        Case {
            what: "maximum disappeared: update",
            wanted: vec![a.clone()],
            existing: vec![object("csisc-1", &a, "1Gi", Some("1Gi"), 1)],
            reported: vec![(a.clone(), rep(GI, None))],
            want: vec![format!("update csisc-1 {a} 1Gi None")],
        },
        Case {
            what: "unparsable published capacity: update",
            wanted: vec![a.clone()],
            existing: vec![object("csisc-1", &a, "lots", None, 1)],
            reported: vec![(a.clone(), rep(GI, None))],
            want: vec![format!("update csisc-1 {a} 1Gi None")],
        },
        Case {
            what: "capacity not known yet: the object stays, nothing written",
            wanted: vec![a.clone(), b.clone()],
            existing: vec![object("csisc-1", &a, "1Gi", None, 1)],
            reported: vec![],
            want: vec![
                format!("pending {a} Some(\"csisc-1\")"),
                format!("pending {b} None"),
            ],
        },
        Case {
            what: "class or segment no longer wanted: delete",
            wanted: vec![a.clone()],
            existing: vec![
                object("csisc-1", &a, "1Gi", None, 1),
                object("csisc-2", &b, "1Gi", None, 1),
                object("csisc-3", &pair("slow", "a"), "1Gi", None, 1),
            ],
            reported: vec![(a.clone(), rep(GI, None))],
            want: vec![
                "delete csisc-2 NotWanted".into(),
                "delete csisc-3 NotWanted".into(),
                "keep csisc-1".into(),
            ],
        },
        Case {
            what: "objects of a previous run are adopted; the oldest wins, duplicates go",
            wanted: vec![a.clone()],
            existing: vec![
                object("csisc-new", &a, "1Gi", None, 20),
                object("csisc-old", &a, "3Gi", None, 10),
            ],
            reported: vec![(a.clone(), rep(GI, None))],
            want: vec![
                "delete csisc-new Duplicate".into(),
                format!("update csisc-old {a} 1Gi None"),
            ],
        },
        Case {
            what: "nothing wanted: every object of ours goes, others stay",
            wanted: vec![],
            existing: vec![
                object("csisc-1", &a, "1Gi", None, 1),
                other_driver.clone(),
                node_local.clone(),
            ],
            reported: vec![(a.clone(), rep(GI, None))],
            want: vec!["delete csisc-1 NotWanted".into()],
        },
        Case {
            what: "objects of another driver or producer are not adopted",
            wanted: vec![a.clone()],
            existing: vec![other_driver.clone(), node_local.clone()],
            reported: vec![(a.clone(), rep(GI, None))],
            want: vec![format!("create {a} 1Gi None")],
        },
        Case {
            what: "a nodeTopology we never write: delete, and publish the pair anew",
            wanted: vec![a.clone()],
            existing: vec![no_topology.clone(), expressions.clone()],
            reported: vec![(a.clone(), rep(GI, None))],
            want: vec![
                "delete csisc-expr UnknownTopology".into(),
                "delete csisc-nil UnknownTopology".into(),
                format!("create {a} 1Gi None"),
            ],
        },
        Case {
            what: "an object without a name is ignored",
            wanted: vec![b.clone()],
            existing: vec![unnamed.clone()],
            reported: vec![(b.clone(), rep(GI, None))],
            want: vec![format!("create {b} 1Gi None")],
        },
    ];
    for case in cases {
        let wanted: BTreeSet<Pair> = case.wanted.into_iter().collect();
        let refs: Vec<&CSIStorageCapacity> = case.existing.iter().collect();
        let reported: HashMap<Pair, Reported> = case.reported.into_iter().collect();
        let got = reconcile(&publisher(None), &wanted, &refs, &reported);
        assert_eq!(summary(&got), case.want, "{}", case.what);
        let counts = Counts::of(&got);
        assert_eq!(counts.goal, wanted.len(), "{}", case.what);
        assert_eq!(
            counts.obsolete,
            case.want.iter().filter(|a| a.starts_with("delete")).count(),
            "{}",
            case.what
        );
        assert_eq!(
            counts.current,
            case.want
                .iter()
                .filter(|a| a.starts_with("keep")
                    || a.starts_with("update")
                    || (a.starts_with("pending") && !a.ends_with("None")))
                .count(),
            "{}",
            case.what
        );
    }
}

#[test]
fn with_an_owner_objects_get_it_added() {
    let a = pair("fast", "a");
    let b = pair("fast", "b");
    let p = publisher(Some("uid-1"));
    let mut mine = object("csisc-mine", &a, "1Gi", None, 1);
    mine.metadata.owner_references = Some(vec![owner("uid-1")]);
    let mut theirs = object("csisc-theirs", &b, "1Gi", None, 1);
    theirs.metadata.owner_references = Some(vec![owner("uid-2")]);
    let mut not_controller = object("csisc-weak", &b, "1Gi", None, 1);
    let mut weak = owner("uid-1");
    weak.controller = None;
    not_controller.metadata.owner_references = Some(vec![weak]);
    let orphan = object("csisc-orphan", &b, "1Gi", None, 1);
    for (o, managed, owned) in [
        (&mine, true, true),
        (&theirs, true, false),
        (&not_controller, true, false),
        (&orphan, true, false),
    ] {
        assert_eq!(p.manages(o), managed, "{:?}", o.metadata.name);
        assert_eq!(p.owner_ok(o), owned, "{:?}", o.metadata.name);
    }
    assert!(
        publisher(None).owner_ok(&theirs),
        "without an owner, any is fine"
    );

    let wanted: BTreeSet<Pair> = [a.clone(), b.clone()].into();
    let reported = HashMap::from([(a.clone(), rep(GI, None)), (b.clone(), rep(GI, None))]);
    let got = reconcile(&p, &wanted, &[&mine, &orphan], &reported);
    assert_eq!(
        summary(&got),
        vec![
            "keep csisc-mine".to_owned(),
            format!("update csisc-orphan {b} 1Gi None"),
        ],
        "same capacity, but the owner is missing: update"
    );
    let Action::Update {
        object: updated, ..
    } = &got[1]
    else {
        panic!("update expected");
    };
    assert_eq!(
        updated.metadata.owner_references,
        Some(vec![owner("uid-1")])
    );

    let got = reconcile(&p, &wanted, &[&theirs], &reported);
    let Some(Action::Update {
        object: updated, ..
    }) = got.iter().find(|a| matches!(a, Action::Update { .. }))
    else {
        panic!("update expected: {got:?}");
    };
    assert_eq!(
        updated.metadata.owner_references,
        Some(vec![owner("uid-2"), owner("uid-1")]),
        "ours is appended, theirs kept"
    );
    let Some(Action::Create {
        object: created, ..
    }) = got.iter().find(|a| matches!(a, Action::Create { .. }))
    else {
        panic!("create expected for pair a: {got:?}");
    };
    assert_eq!(
        created.metadata.owner_references,
        Some(vec![owner("uid-1")]),
        "new objects carry the owner"
    );
    let got = reconcile(&p, &BTreeSet::new(), &[&mine, &theirs], &reported);
    assert_eq!(
        summary(&got),
        vec![
            "delete csisc-mine NotWanted".to_owned(),
            "delete csisc-theirs NotWanted".to_owned()
        ]
    );
}

#[test]
fn new_objects_have_upstreams_shape() {
    let p = publisher(None);
    let o = p.new_object(&pair("fast", "a"), rep(5 * GI, Some(GI)));
    // As sent: the full API type.
    let v = serde_json::to_value(crate::projection::Projection::to_object(&o)).expect("json");
    assert_eq!(
        v,
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIStorageCapacity",
            "metadata": {
                "generateName": "csisc-",
                "namespace": "ns",
                "labels": {
                    "csi.storage.k8s.io/drivername": DRIVER,
                    "csi.storage.k8s.io/managed-by": "external-provisioner",
                },
            },
            "storageClassName": "fast",
            "nodeTopology": {"matchLabels": {ZONE: "a"}},
            "capacity": "5Gi",
            "maximumVolumeSize": "1Gi",
        })
    );
    let o = p.new_object(
        &Pair {
            segment: seg(&[]),
            class: "fast".into(),
        },
        rep(0, None),
    );
    // As sent: the full API type.
    let v = serde_json::to_value(crate::projection::Projection::to_object(&o)).expect("json");
    assert_eq!(
        v["nodeTopology"],
        json!({}),
        "no topology: an empty selector (all nodes), not an absent one (no node)"
    );
    assert_eq!(v["capacity"], json!("0"));
    assert!(v.get("maximumVolumeSize").is_none());
    assert_eq!(
        p.label_selector(),
        format!(
            "csi.storage.k8s.io/drivername={DRIVER},csi.storage.k8s.io/managed-by=external-provisioner"
        )
    );
}

#[test]
fn segments_of_selectors() {
    assert_eq!(Segment::of_selector(None), None);
    assert_eq!(
        Segment::of_selector(Some(&LabelSelector::default())),
        Some(seg(&[]))
    );
    let s = seg(&[(ZONE, "a"), (HOST, "n")]);
    assert_eq!(Segment::of_selector(Some(&s.node_topology())), Some(s));
    let empty_expressions = LabelSelector {
        match_labels: Some(BTreeMap::from([(ZONE.to_owned(), "a".to_owned())])),
        match_expressions: Some(vec![]),
    };
    assert_eq!(
        Segment::of_selector(Some(&empty_expressions)),
        Some(seg(&[(ZONE, "a")]))
    );
}

fn meta(name: Option<&str>, uid: Option<&str>, owners: Vec<OwnerReference>) -> ObjectMeta {
    ObjectMeta {
        name: name.map(Into::into),
        uid: uid.map(Into::into),
        owner_references: (!owners.is_empty()).then_some(owners),
        ..ObjectMeta::default()
    }
}

#[test]
fn owner_chain_steps() {
    let mut not_controller = owner("rs-0");
    not_controller.controller = None;
    let mut rs = owner("rs-1");
    rs.kind = "ReplicaSet".into();
    rs.api_version = "apps/v1".into();
    let m = meta(
        Some("pod"),
        Some("u"),
        vec![not_controller.clone(), rs.clone()],
    );
    assert_eq!(controller_of(&m), Some(&rs));
    assert_eq!(
        controller_of(&meta(Some("pod"), Some("u"), vec![not_controller])),
        None
    );
    assert_eq!(controller_of(&meta(Some("pod"), Some("u"), vec![])), None);

    let r = reference_to(
        "apps/v1",
        "Deployment",
        &meta(Some("d"), Some("u1"), vec![]),
    )
    .expect("reference");
    assert_eq!(
        r,
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "d".into(),
            uid: "u1".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    );
    assert_eq!(
        reference_to("v1", "Pod", &meta(Some("p"), None, vec![])),
        None
    );
    assert_eq!(
        reference_to("v1", "Pod", &meta(Some("p"), Some(""), vec![])),
        None
    );
    assert_eq!(
        reference_to("v1", "Pod", &meta(None, Some("u"), vec![])),
        None
    );
}

fn options(args: &[&str]) -> crate::cli::Options {
    crate::cli::Options::parse_from_args(
        std::iter::once("csi-provisioner").chain(args.iter().copied()),
    )
    .expect("options")
}

#[test]
fn settings_need_the_pod_environment() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let o = options(&[
        "--enable-capacity",
        "--capacity-threads=3",
        "--capacity-poll-interval=5s",
    ]);
    let s = Settings::from_options(&o, true, env(&[("NAMESPACE", "ns"), ("POD_NAME", "p")]))
        .expect("settings");
    assert_eq!(s.namespace, "ns");
    assert_eq!(
        s.owner,
        Some(super::OwnerSpec {
            pod: "p".into(),
            level: 1
        }),
        "default level 1"
    );
    assert_eq!(s.threads, 3);
    assert_eq!(s.poll_interval, std::time::Duration::from_secs(5));
    assert!(s.topology);

    let e = Settings::from_options(&o, true, env(&[("NAMESPACE", "ns")])).expect_err("no pod");
    assert!(
        matches!(
            e,
            CapacityError::MissingEnv {
                var: "POD_NAME",
                ..
            }
        ),
        "{e}"
    );
    let e = Settings::from_options(&o, true, env(&[("NAMESPACE", ""), ("POD_NAME", "p")]))
        .expect_err("empty namespace");
    assert!(
        matches!(
            e,
            CapacityError::MissingEnv {
                var: "NAMESPACE",
                ..
            }
        ),
        "{e}"
    );

    let o = options(&["--enable-capacity", "--capacity-ownerref-level=-1"]);
    let s = Settings::from_options(&o, false, env(&[("NAMESPACE", "ns")])).expect("no owner");
    assert_eq!(s.owner, None);
    let o = options(&["--enable-capacity", "--capacity-ownerref-level=0"]);
    let s = Settings::from_options(&o, false, env(&[("NAMESPACE", "ns"), ("POD_NAME", "p")]))
        .expect("pod owner");
    assert_eq!(s.owner.map(|o| o.level), Some(0));
}

#[test]
fn capacity_flags_are_validated() {
    for bad in [
        "--capacity-threads=0",
        "--capacity-poll-interval=0s",
        "--capacity-ownerref-level=-2",
    ] {
        let e = crate::cli::Options::parse_from_args(["csi-provisioner", bad])
            .expect_err(bad)
            .to_string();
        let flag = bad.trim_start_matches("--").split('=').next().unwrap_or("");
        assert!(e.contains(flag), "{bad}: {e}");
    }
    let o = options(&[]);
    assert!(!o.enable_capacity);
    assert!(
        o.set_but_not_implemented().is_empty(),
        "capacity flags are implemented"
    );
    let o = options(&[
        "--enable-capacity",
        "--capacity-threads=2",
        "--capacity-poll-interval=1s",
        "--capacity-for-immediate-binding",
        "--capacity-ownerref-level=2",
    ]);
    assert!(o.set_but_not_implemented().is_empty());
}

#[test]
fn a_driver_without_get_capacity_is_refused() {
    use csi_proto::v1::controller_service_capability::rpc::Type as Cap;
    let mut info = crate::csi::DriverInfo {
        name: DRIVER.into(),
        vendor_version: "1".into(),
        manifest: BTreeMap::new(),
        plugin: crate::csi::driver::PluginCapabilities::default(),
        controller: crate::csi::driver::ControllerCapabilities::from_types([
            Cap::CreateDeleteVolume,
        ]),
    };
    let e = check_driver(&info).expect_err("refused");
    assert!(e.to_string().contains("GET_CAPACITY"), "{e}");
    assert!(e.to_string().contains(DRIVER), "{e}");
    info.controller = crate::csi::driver::ControllerCapabilities::from_types([
        Cap::CreateDeleteVolume,
        Cap::GetCapacity,
    ]);
    check_driver(&info).expect("accepted");
}

/// `--node-deployment`: each node's objects are labelled with its own
/// managed-by value, shortened exactly as upstream's getNameWithMaxLength
/// (its test cases).
#[test]
fn managed_by_per_node_as_upstream_names_it() {
    let a = |n: usize| "a".repeat(n);
    let cases: Vec<(Option<String>, String)> = vec![
        (None, "external-provisioner".to_owned()),
        (
            Some("node01".to_owned()),
            "external-provisioner-node01".to_owned(),
        ),
        (
            Some(format!("node{}", a(38))),
            format!("external-provisioner-node{}", a(38)),
        ),
        (
            Some(format!("node{}", a(39))),
            format!("external-p-53f40b57-node{}", a(39)),
        ),
        (
            Some(format!("node{}", a(48))),
            format!("e-53f40b57-node{}", a(48)),
        ),
        (
            Some(format!("node{}", a(49))),
            "external-provisioner-a3607ff1".to_owned(),
        ),
        (
            Some(format!("node{}", a(63))),
            "external-provisioner-df38e37f".to_owned(),
        ),
    ];
    for (node, want) in cases {
        let got = managed_by(node.as_deref());
        assert_eq!(got, want, "{node:?}");
        assert!(got.len() <= 63, "{got}");
    }
}

/// After a provision or delete: the pairs whose segment the volume's node
/// affinity selects (any class), else every pair of its class.
#[test]
fn pairs_touched_by_a_volume() {
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
    let seg = |zone: &str| Segment::from_pairs([("zone", zone)]);
    let pair = |zone: &str, class: &str| Pair {
        segment: seg(zone),
        class: class.to_owned(),
    };
    let wanted: BTreeSet<Pair> = [
        pair("a", "fast"),
        pair("a", "slow"),
        pair("b", "fast"),
        pair("b", "slow"),
    ]
    .into();
    let in_zone = |values: &[&str]| NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "zone".to_owned(),
                operator: "In".to_owned(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
            match_fields: None,
        }],
    };
    assert_eq!(
        pairs_touched_by(&wanted, Some(&in_zone(&["a"])), "fast"),
        vec![pair("a", "fast"), pair("a", "slow")]
    );
    assert_eq!(
        pairs_touched_by(&wanted, Some(&in_zone(&["a", "b"])), "fast").len(),
        4
    );
    assert!(pairs_touched_by(&wanted, Some(&in_zone(&["c"])), "fast").is_empty());
    assert_eq!(
        pairs_touched_by(&wanted, None, "slow"),
        vec![pair("a", "slow"), pair("b", "slow")]
    );
}

fn wants(topology: bool, fixed: Option<Segment>) -> Wants {
    Wants {
        driver: DRIVER.into(),
        topology,
        immediate: false,
        fixed_segment: fixed,
    }
}

/// What a deletion of a pair the caches do not want rests on: the one
/// thing to read live before deleting.
#[test]
fn the_live_read_a_deletion_rests_on() {
    let zone = [ZONE];
    let wffc = class("wffc", DRIVER, Some("WaitForFirstConsumer"));
    let imm = class("imm", DRIVER, Some("Immediate"));
    type Case = (
        &'static str,
        Wants,
        Pair,
        Vec<StorageClass>,
        Vec<Node>,
        Vec<CSINode>,
        LiveRead,
    );
    let cases: Vec<Case> = vec![
        (
            "class not in the cache: the class",
            wants(true, None),
            pair("wffc", "a"),
            vec![],
            vec![node("n1", &[(ZONE, "a")])],
            vec![csi_node("n1", &[(DRIVER, Some(&zone))])],
            LiveRead::Class("wffc".into()),
        ),
        (
            "class not wanted in the cache (Immediate): the class",
            wants(true, None),
            pair("imm", "a"),
            vec![imm.clone()],
            vec![],
            vec![],
            LiveRead::Class("imm".into()),
        ),
        (
            "a cached node in the segment, its CSINode without the driver: that CSINode",
            wants(true, None),
            pair("wffc", "a"),
            vec![wffc.clone()],
            vec![node("n2", &[(ZONE, "a")]), node("n1", &[(ZONE, "a")])],
            vec![csi_node("n1", &[("other.csi", Some(&zone))])],
            LiveRead::CsiNode("n1".into()),
        ),
        (
            "a cached CSINode with the segment's keys and no cached Node: that Node",
            wants(true, None),
            pair("wffc", "a"),
            vec![wffc.clone()],
            vec![node("n1", &[(ZONE, "b")])],
            vec![
                csi_node("n1", &[(DRIVER, Some(&zone))]),
                csi_node("n9", &[(DRIVER, Some(&zone))]),
            ],
            LiveRead::Node("n9".into()),
        ),
        (
            "neither cache points at the segment: the nodes with its labels",
            wants(true, None),
            pair("wffc", "a"),
            vec![wffc.clone()],
            vec![node("n1", &[(ZONE, "b")])],
            vec![csi_node("n1", &[(DRIVER, Some(&zone))])],
            LiveRead::NodesInSegment(seg(&[(ZONE, "a")])),
        ),
        (
            "node deployment, another segment: never published, nothing to read",
            wants(true, Some(seg(&[(ZONE, "b")]))),
            pair("wffc", "a"),
            vec![wffc.clone()],
            vec![],
            vec![],
            LiveRead::Nothing,
        ),
        (
            "node deployment, class gone: the class",
            wants(true, Some(seg(&[(ZONE, "a")]))),
            pair("wffc", "a"),
            vec![],
            vec![],
            vec![],
            LiveRead::Class("wffc".into()),
        ),
        (
            "no topology, a segment: never published, nothing to read",
            wants(false, None),
            pair("wffc", "a"),
            vec![wffc.clone()],
            vec![],
            vec![],
            LiveRead::Nothing,
        ),
    ];
    for (what, wants, pair, classes, nodes, csi_nodes, want) in cases {
        let classes: Vec<&StorageClass> = classes.iter().collect();
        let nodes: Vec<&Node> = nodes.iter().collect();
        let csi_nodes: Vec<&CSINode> = csi_nodes.iter().collect();
        assert!(
            !wants.wants(&pair, &classes, &nodes, &csi_nodes),
            "{what}: the caches do not want the pair"
        );
        assert_eq!(
            obsolete_because(&wants, &pair, &classes, &nodes, &csi_nodes),
            want,
            "{what}"
        );
    }
}

/// The pair decided again with the live read in place of the cached
/// objects: deleted only when still not wanted.
#[test]
fn a_deletion_is_made_only_when_the_live_read_agrees() {
    let zone = [ZONE];
    let wffc = class("wffc", DRIVER, Some("WaitForFirstConsumer"));
    let wants = wants(true, None);
    let a = pair("wffc", "a");
    let n1 = node("n1", &[(ZONE, "a")]);
    let registered = csi_node("n1", &[(DRIVER, Some(&zone))]);
    let unregistered = csi_node("n1", &[]);
    type Case = (
        &'static str,
        Vec<StorageClass>,
        Vec<Node>,
        Vec<CSINode>,
        Live,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            "class re-created: exists live, kept",
            vec![],
            vec![n1.clone()],
            vec![registered.clone()],
            Live::Class {
                name: "wffc".into(),
                class: Some(wffc.clone()),
            },
            false,
        ),
        (
            "class gone live too (404): deleted",
            vec![],
            vec![n1.clone()],
            vec![registered.clone()],
            Live::Class {
                name: "wffc".into(),
                class: None,
            },
            true,
        ),
        (
            "class Immediate live too: deleted",
            vec![],
            vec![n1.clone()],
            vec![registered.clone()],
            Live::Class {
                name: "wffc".into(),
                class: Some(class("wffc", DRIVER, Some("Immediate"))),
            },
            true,
        ),
        (
            "cache still wants the class being deleted live: deleted",
            vec![wffc.clone()],
            vec![n1.clone()],
            vec![registered.clone()],
            Live::Class {
                name: "wffc".into(),
                class: {
                    let mut c = wffc.clone();
                    c.metadata.deletion_timestamp = Some(Time(Default::default()));
                    Some(c)
                },
            },
            true,
        ),
        (
            "driver registered again, the CSINode cache behind: kept",
            vec![wffc.clone()],
            vec![n1.clone()],
            vec![unregistered.clone()],
            Live::CsiNode {
                name: "n1".into(),
                csi_node: Some(registered.clone()),
            },
            false,
        ),
        (
            "driver not registered live either: deleted",
            vec![wffc.clone()],
            vec![n1.clone()],
            vec![unregistered.clone()],
            Live::CsiNode {
                name: "n1".into(),
                csi_node: Some(unregistered.clone()),
            },
            true,
        ),
        (
            "CSINode gone live: deleted",
            vec![wffc.clone()],
            vec![n1.clone()],
            vec![],
            Live::CsiNode {
                name: "n1".into(),
                csi_node: None,
            },
            true,
        ),
        (
            "the Node the cache lacks exists with the labels: kept",
            vec![wffc.clone()],
            vec![],
            vec![registered.clone()],
            Live::Node {
                name: "n1".into(),
                node: Some(n1.clone()),
            },
            false,
        ),
        (
            "the Node is gone live too: deleted",
            vec![wffc.clone()],
            vec![],
            vec![registered.clone()],
            Live::Node {
                name: "n1".into(),
                node: None,
            },
            true,
        ),
        (
            "the cached Node relabelled live into the segment: kept",
            vec![wffc.clone()],
            vec![node("n1", &[(ZONE, "b")])],
            vec![registered.clone()],
            Live::Nodes(vec![n1.clone()]),
            false,
        ),
        (
            "no node carries the labels live: deleted",
            vec![wffc.clone()],
            vec![node("n1", &[(ZONE, "b")])],
            vec![registered.clone()],
            Live::Nodes(vec![]),
            true,
        ),
        (
            "a node carries the labels, its CSINode lacks the driver: deleted",
            vec![wffc.clone()],
            vec![],
            vec![unregistered.clone()],
            Live::Nodes(vec![n1.clone()]),
            true,
        ),
        (
            "nothing to read: as the caches say",
            vec![wffc.clone()],
            vec![],
            vec![],
            Live::Nothing,
            true,
        ),
    ];
    for (what, classes, nodes, csi_nodes, live, obsolete) in cases {
        let classes: Vec<&StorageClass> = classes.iter().collect();
        let nodes: Vec<&Node> = nodes.iter().collect();
        let csi_nodes: Vec<&CSINode> = csi_nodes.iter().collect();
        assert_eq!(
            still_obsolete(&wants, &a, &classes, &nodes, &csi_nodes, &live),
            obsolete,
            "{what}"
        );
    }
}

#[test]
fn wants_agrees_with_wanted_and_pairs_come_from_objects() {
    let zone = [ZONE];
    let classes = [
        class("wffc", DRIVER, Some("WaitForFirstConsumer")),
        class("imm", DRIVER, Some("Immediate")),
    ];
    let nodes = [node("n1", &[(ZONE, "a")]), node("n2", &[(ZONE, "b")])];
    let csi_nodes = [
        csi_node("n1", &[(DRIVER, Some(&zone))]),
        csi_node("n2", &[(DRIVER, Some(&zone))]),
    ];
    let classes: Vec<&StorageClass> = classes.iter().collect();
    let nodes: Vec<&Node> = nodes.iter().collect();
    let csi_nodes: Vec<&CSINode> = csi_nodes.iter().collect();
    for w in [
        wants(true, None),
        wants(false, None),
        wants(true, Some(seg(&[(ZONE, "b")]))),
    ] {
        let pairs = w.pairs(&classes, &nodes, &csi_nodes);
        for class in ["wffc", "imm"] {
            for segment in [seg(&[(ZONE, "a")]), seg(&[(ZONE, "b")]), seg(&[])] {
                let p = Pair {
                    segment,
                    class: class.into(),
                };
                assert_eq!(
                    w.wants(&p, &classes, &nodes, &csi_nodes),
                    pairs.contains(&p),
                    "{w:?} {p}"
                );
            }
        }
    }
    assert_eq!(
        segment_selector(&seg(&[(ZONE, "a"), (HOST, "n1")])),
        format!("{HOST}=n1,{ZONE}=a")
    );
    let p = pair("wffc", "a");
    let o = object("csisc-1", &p, "1Gi", None, 1);
    assert_eq!(pair_of(&o), Some(p));
    let mut no_topology = o.clone();
    no_topology.node_topology = None;
    assert_eq!(pair_of(&no_topology), None);
}
