use super::*;
use crate::provision::fixtures::topology_term;
use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const DRIVER: &str = "hostpath.csi.k8s.io";
const ZONE: &str = "topology.kubernetes.io/zone";
const RACK: &str = "example.com/rack";

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
    }
}

fn csi_node(name: &str, drivers: &[(&str, &[&str])]) -> CSINode {
    CSINode {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|(driver, keys)| CSINodeDriver {
                    name: (*driver).to_owned(),
                    node_id: "id".to_owned(),
                    topology_keys: Some(keys.iter().map(|k| (*k).to_owned()).collect()),
                    allocatable: None,
                })
                .collect(),
        },
    }
}

fn topo(pairs: &[(&str, &str)]) -> Topology {
    Topology {
        segments: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn zones(names: &[&str]) -> Vec<Topology> {
    names.iter().map(|zone| topo(&[(ZONE, zone)])).collect()
}

/// Three nodes in zones a, b, c, plus one node without the zone label; every
/// node registered the driver with the zone key.
struct Cluster {
    nodes: Vec<Node>,
    csi_nodes: Vec<CSINode>,
}

impl Cluster {
    fn zoned() -> Self {
        Cluster {
            nodes: vec![
                node("n-a", &[(ZONE, "a")]),
                node("n-b", &[(ZONE, "b")]),
                node("n-c", &[(ZONE, "c")]),
                node("n-c2", &[(ZONE, "c")]),
                node("unlabelled", &[]),
            ],
            csi_nodes: ["n-a", "n-b", "n-c", "n-c2", "unlabelled"]
                .iter()
                .map(|name| csi_node(name, &[(DRIVER, &[ZONE])]))
                .collect(),
        }
    }

    fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    }

    fn csi_node(&self, name: &str) -> Option<&CSINode> {
        self.csi_nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    }

    fn run(
        &self,
        selected: Option<&str>,
        allowed_topologies: &[TopologySelectorTerm],
        strict: bool,
        immediate: bool,
    ) -> Result<Option<TopologyRequirement>, TopologyError> {
        let nodes: Vec<&Node> = self.nodes.iter().collect();
        let csi_nodes: Vec<&CSINode> = self.csi_nodes.iter().collect();
        accessibility_requirements(&TopologyInputs {
            driver_name: DRIVER,
            pvc_name: "data-web-0",
            allowed_topologies,
            selected_node: selected.map(|name| SelectedNodeTopology {
                name,
                node: self.node(name),
                csi_node: self.csi_node(name),
            }),
            nodes: &nodes,
            csi_nodes: &csi_nodes,
            strict_topology: strict,
            immediate_topology: immediate,
            immediate_per_key_set: false,
        })
    }
}

fn requirement(requisite: Vec<Topology>, preferred: Vec<Topology>) -> Option<TopologyRequirement> {
    Some(TopologyRequirement {
        requisite,
        preferred,
    })
}

#[test]
fn delayed_strict_without_allowed_topologies_sends_only_the_selected_node() {
    let cluster = Cluster::zoned();
    assert_eq!(
        cluster.run(Some("n-b"), &[], true, true),
        Ok(requirement(zones(&["b"]), zones(&["b"])))
    );
}

#[test]
fn delayed_strict_with_allowed_topologies_containing_the_node() {
    let cluster = Cluster::zoned();
    let allowed_topologies = [topology_term(&[(ZONE, &["b", "c"])])];
    assert_eq!(
        cluster.run(Some("n-b"), &allowed_topologies, true, true),
        Ok(requirement(zones(&["b"]), zones(&["b"])))
    );
}

#[test]
fn delayed_strict_with_allowed_topologies_excluding_the_node() {
    let cluster = Cluster::zoned();
    let allowed_topologies = [topology_term(&[(ZONE, &["c"])])];
    let error = cluster.run(Some("n-b"), &allowed_topologies, true, true);
    assert!(
        matches!(error, Err(TopologyError::NotInAllowedTopologies { ref node, .. }) if node == "n-b"),
        "{error:?}"
    );
}

#[test]
fn delayed_with_allowed_topologies_prefers_the_selected_node_first() {
    let cluster = Cluster::zoned();
    let allowed_topologies = [topology_term(&[(ZONE, &["c", "a", "b"])])];
    assert_eq!(
        cluster.run(Some("n-b"), &allowed_topologies, false, true),
        Ok(requirement(
            zones(&["a", "b", "c"]),
            zones(&["b", "c", "a"])
        ))
    );
}

#[test]
fn delayed_without_allowed_topologies_aggregates_the_cluster() {
    let cluster = Cluster::zoned();
    // The unlabelled node is left out, the two nodes in c collapse into one term.
    assert_eq!(
        cluster.run(Some("n-c"), &[], false, false),
        Ok(requirement(
            zones(&["a", "b", "c"]),
            zones(&["c", "a", "b"])
        ))
    );
}

#[test]
fn delayed_with_allowed_topologies_not_containing_the_node() {
    let cluster = Cluster::zoned();
    let allowed_topologies = [topology_term(&[(ZONE, &["c"])])];
    assert!(matches!(
        cluster.run(Some("n-a"), &allowed_topologies, false, true),
        Err(TopologyError::SelectedNotInRequisite { .. })
    ));
}

#[test]
fn immediate_with_allowed_topologies_rotates_by_the_claim_name() {
    let cluster = Cluster::zoned();
    let allowed_topologies = [topology_term(&[(ZONE, &["c", "b", "a"])])];
    // hash("web") % 3 == 0 and the ordinal offsets it (see the hash test).
    for (claim, first) in [
        ("data-web-0", "a"),
        ("data-web-1", "b"),
        ("data-web-2", "c"),
    ] {
        let nodes: Vec<&Node> = cluster.nodes.iter().collect();
        let csi_nodes: Vec<&CSINode> = cluster.csi_nodes.iter().collect();
        let result = accessibility_requirements(&TopologyInputs {
            driver_name: DRIVER,
            pvc_name: claim,
            allowed_topologies: &allowed_topologies,
            selected_node: None,
            nodes: &nodes,
            csi_nodes: &csi_nodes,
            strict_topology: false,
            immediate_topology: false,
            immediate_per_key_set: false,
        })
        .expect("requirements")
        .expect("some");
        assert_eq!(result.requisite, zones(&["a", "b", "c"]));
        assert_eq!(result.preferred[0], topo(&[(ZONE, first)]), "{claim}");
        assert_eq!(result.preferred.len(), 3);
    }
}

#[test]
fn immediate_without_allowed_topologies_aggregates_when_enabled() {
    let cluster = Cluster::zoned();
    assert_eq!(
        cluster.run(None, &[], false, true),
        Ok(requirement(
            zones(&["a", "b", "c"]),
            zones(&["a", "b", "c"])
        ))
    );
    // Strict topology has no effect without a selected node.
    assert_eq!(
        cluster.run(None, &[], true, true),
        Ok(requirement(
            zones(&["a", "b", "c"]),
            zones(&["a", "b", "c"])
        ))
    );
}

#[test]
fn immediate_without_allowed_topologies_sends_nothing_when_disabled() {
    let cluster = Cluster::zoned();
    assert_eq!(cluster.run(None, &[], false, false), Ok(None));
}

#[test]
fn immediate_uses_the_keys_of_the_first_csinode_that_has_some() {
    let mut cluster = Cluster::zoned();
    cluster
        .nodes
        .push(node("racked", &[(ZONE, "a"), (RACK, "r1")]));
    cluster
        .csi_nodes
        .insert(0, csi_node("no-driver", &[("other.driver", &[RACK])]));
    cluster
        .csi_nodes
        .insert(1, csi_node("racked", &[(DRIVER, &[ZONE, RACK])]));
    let both = |zone: &str| topo(&[(ZONE, zone), (RACK, "r1")]);
    assert_eq!(
        cluster.run(None, &[], false, true),
        Ok(requirement(vec![both("a")], vec![both("a")]))
    );
}

#[test]
fn immediate_without_any_registered_driver_waits() {
    let mut cluster = Cluster::zoned();
    cluster.csi_nodes = vec![
        csi_node("n-a", &[("other.driver", &[ZONE])]),
        csi_node("n-b", &[(DRIVER, &[])]),
    ];
    assert_eq!(
        cluster.run(None, &[], false, true),
        Err(TopologyError::NoAvailableTopology)
    );
}

#[test]
fn topology_keys_on_no_node_is_an_error() {
    let mut cluster = Cluster::zoned();
    cluster.csi_nodes = vec![csi_node("n-a", &[(DRIVER, &[RACK])])];
    assert_eq!(
        cluster.run(None, &[], false, true),
        Err(TopologyError::KeysNotOnAnyNode(vec![RACK.to_owned()]))
    );
}

#[test]
fn selected_node_without_csinode_asks_for_reschedule() {
    let mut cluster = Cluster::zoned();
    cluster
        .csi_nodes
        .retain(|n| n.metadata.name.as_deref() != Some("n-a"));
    let error = cluster
        .run(Some("n-a"), &[], false, true)
        .expect_err("must fail");
    assert_eq!(
        error,
        TopologyError::SelectedCsiNodeNotFound("n-a".to_owned())
    );
    assert!(error.wants_reschedule());
}

#[test]
fn selected_node_missing_asks_for_reschedule() {
    let mut cluster = Cluster::zoned();
    cluster
        .nodes
        .retain(|n| n.metadata.name.as_deref() != Some("n-a"));
    let error = cluster
        .run(Some("n-a"), &[], false, true)
        .expect_err("must fail");
    assert_eq!(error, TopologyError::SelectedNodeNotFound("n-a".to_owned()));
    assert!(error.wants_reschedule());
}

#[test]
fn selected_node_without_driver_keys_is_an_error() {
    let mut cluster = Cluster::zoned();
    cluster.csi_nodes = vec![csi_node("n-a", &[("other.driver", &[ZONE])])];
    let error = cluster
        .run(Some("n-a"), &[], false, true)
        .expect_err("must fail");
    assert_eq!(error, TopologyError::NoTopologyKeys("n-a".to_owned()));
    assert!(!error.wants_reschedule());
}

#[test]
fn selected_node_lacking_a_topology_label_is_an_error() {
    let cluster = Cluster::zoned();
    let error = cluster
        .run(Some("unlabelled"), &[], false, true)
        .expect_err("must fail");
    assert_eq!(
        error,
        TopologyError::SelectedNodeMissingKeys {
            labels: BTreeMap::new(),
            keys: vec![ZONE.to_owned()]
        }
    );
}

#[test]
fn allowed_topologies_of_only_empty_terms_send_nothing() {
    let cluster = Cluster::zoned();
    let empty = [
        topology_term(&[(ZONE, &[])]),
        TopologySelectorTerm::default(),
    ];
    assert_eq!(cluster.run(None, &empty, false, true), Ok(None));
}

#[test]
fn flatten_distributes_values_and_dedups() {
    let cluster = Cluster::zoned();
    let allowed_topologies = [
        topology_term(&[(ZONE, &["b", "a"]), (RACK, &["r1", "r2"])]),
        topology_term(&[(ZONE, &["a"]), (RACK, &["r1"])]),
        topology_term(&[(ZONE, &["c"])]),
    ];
    let pair = |zone: &str, rack: &str| topo(&[(ZONE, zone), (RACK, rack)]);
    let result = cluster
        .run(None, &allowed_topologies, false, false)
        .expect("ok")
        .expect("some");
    // Fewer segments sort first; the duplicate {a, r1} appears once.
    assert_eq!(
        result.requisite,
        vec![
            topo(&[(ZONE, "c")]),
            pair("a", "r1"),
            pair("b", "r1"),
            pair("a", "r2"),
            pair("b", "r2"),
        ]
    );
}

#[test]
fn subset_walk_matches_upstream() {
    let term = |pairs: &[(&str, &str)]| -> Term {
        let mut term: Term = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        term.sort();
        term
    };
    assert!(is_subset(&term(&[]), &term(&[("a", "1")])));
    assert!(is_subset(
        &term(&[("b", "1")]),
        &term(&[("a", "0"), ("b", "1")])
    ));
    assert!(!is_subset(
        &term(&[("b", "2")]),
        &term(&[("a", "0"), ("b", "1")])
    ));
    assert!(!is_subset(
        &term(&[("a", "0"), ("c", "1")]),
        &term(&[("b", "0"), ("c", "1")])
    ));
    assert!(!is_subset(&term(&[("a", "0")]), &term(&[])));
}

#[test]
fn pvc_name_hash_follows_the_statefulset_heuristic() {
    // FNV-1 32-bit reference vectors.
    assert_eq!(pvc_name_hash_and_index("foobar"), (0x31f0_b262, 0));
    assert_eq!(pvc_name_hash_and_index("a"), (0x050c_5d7e, 0));
    let web = pvc_name_hash_and_index("web").0;
    assert_eq!(web, 0x4666_1985);
    assert_eq!(pvc_name_hash_and_index("data-web-2"), (web, 2));
    assert_eq!(pvc_name_hash_and_index("other-claim-web-7"), (web, 7));
    assert_eq!(pvc_name_hash_and_index("web-3"), (web, 3));
    assert_eq!(pvc_name_hash_and_index("web-x").1, 0);
    assert_eq!(pvc_name_hash_and_index("web-+3").1, 0);
    assert_eq!(
        pvc_name_hash_and_index("web-99999999999").1,
        0,
        "beyond 32 bits is not an ordinal"
    );
}

#[test]
fn node_affinity_from_accessible_topology() {
    assert_eq!(volume_node_affinity(&[]), None);
    let affinity = volume_node_affinity(&[
        topo(&[(ZONE, "a"), (RACK, "r1")]),
        topo(&[]),
        topo(&[(ZONE, "b")]),
    ])
    .expect("affinity");
    let terms = affinity.required.expect("required").node_selector_terms;
    let expression = |key: &str, value: &str| NodeSelectorRequirement {
        key: key.to_owned(),
        operator: "In".to_owned(),
        values: Some(vec![value.to_owned()]),
    };
    assert_eq!(
        terms,
        vec![
            NodeSelectorTerm {
                match_expressions: Some(vec![expression(RACK, "r1"), expression(ZONE, "a")]),
                match_fields: None,
            },
            NodeSelectorTerm {
                match_expressions: Some(vec![expression(ZONE, "b")]),
                match_fields: None,
            },
        ]
    );
}

#[test]
fn returned_topology_must_lie_inside_the_requisite() {
    let wanted = TopologyRequirement {
        requisite: zones(&["a", "b"]),
        preferred: vec![],
    };
    assert!(satisfies_requisite(&zones(&["a"]), Some(&wanted)));
    assert!(satisfies_requisite(
        &[topo(&[(ZONE, "b"), (RACK, "r1")])],
        Some(&wanted)
    ));
    assert!(satisfies_requisite(&[], Some(&wanted)));
    assert!(satisfies_requisite(&zones(&["z"]), None));
    assert!(!satisfies_requisite(&zones(&["c"]), Some(&wanted)));
    assert!(!satisfies_requisite(&zones(&["a", "c"]), Some(&wanted)));
    assert!(
        satisfies_requisite(&[topo(&[(RACK, "r1")])], Some(&wanted)),
        "no shared key: cannot be judged"
    );
    assert!(!satisfies_requisite(
        &[topo(&[(ZONE, "c"), (RACK, "r1")])],
        Some(&wanted)
    ));
    let pairs = TopologyRequirement {
        requisite: vec![topo(&[(ZONE, "a"), (RACK, "r1")])],
        preferred: vec![],
    };
    assert!(satisfies_requisite(&zones(&["a"]), Some(&pairs)));
    assert!(!satisfies_requisite(
        &[topo(&[(ZONE, "a"), (RACK, "r2")])],
        Some(&pairs)
    ));
}

#[test]
fn node_affinity_matching() {
    let labels: BTreeMap<String, String> = [(ZONE, "a"), ("size", "5")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let requirement = |key: &str, operator: &str, values: &[&str]| NodeSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
    };
    let affinity = |terms: Vec<Vec<NodeSelectorRequirement>>| VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms
                .into_iter()
                .map(|expressions| NodeSelectorTerm {
                    match_expressions: Some(expressions),
                    match_fields: None,
                })
                .collect(),
        }),
    };
    assert!(node_affinity_matches(None, &labels));
    assert!(node_affinity_matches(
        Some(&VolumeNodeAffinity { required: None }),
        &labels
    ));
    let cases: &[(Vec<Vec<NodeSelectorRequirement>>, bool)] = &[
        (vec![vec![requirement(ZONE, "In", &["a", "b"])]], true),
        (vec![vec![requirement(ZONE, "In", &["b"])]], false),
        (
            vec![
                vec![requirement(ZONE, "In", &["b"])],
                vec![requirement(ZONE, "In", &["a"])],
            ],
            true,
        ),
        (vec![vec![requirement(ZONE, "NotIn", &["b"])]], true),
        (vec![vec![requirement(RACK, "NotIn", &["b"])]], true),
        (vec![vec![requirement(ZONE, "Exists", &[])]], true),
        (vec![vec![requirement(RACK, "Exists", &[])]], false),
        (vec![vec![requirement(RACK, "DoesNotExist", &[])]], true),
        (vec![vec![requirement("size", "Gt", &["4"])]], true),
        (vec![vec![requirement("size", "Lt", &["4"])]], false),
        (vec![vec![requirement("size", "Gt", &["x"])]], false),
        (vec![vec![requirement(ZONE, "Bogus", &["a"])]], false),
        (vec![vec![]], false),
        (
            vec![vec![
                requirement(ZONE, "In", &["a"]),
                requirement(RACK, "Exists", &[]),
            ]],
            false,
        ),
    ];
    for (terms, expected) in cases {
        assert_eq!(
            node_affinity_matches(Some(&affinity(terms.clone())), &labels),
            *expected,
            "{terms:?}"
        );
    }
}

// --- `--immediate-topology-per-key-set` (docs/operations.md, opt-ins) ---

const REGION: &str = "topology.kubernetes.io/region";

/// Nodes that registered different key sets for the driver, as in upstream
/// The upstream report: two region-only nodes, two with region and zone (one listing its
/// keys in the other order), a node of another driver and a CSINode of the
/// driver without keys.
fn mixed_key_sets() -> (Vec<Node>, Vec<CSINode>) {
    let nodes = vec![
        node("r-1", &[(REGION, "r1")]),
        node("r-2", &[(REGION, "r2")]),
        node("z-1", &[(REGION, "r1"), (ZONE, "a")]),
        node("z-2", &[(REGION, "r2"), (ZONE, "b")]),
        node("other", &[(RACK, "k")]),
        node("keyless", &[(REGION, "r3")]),
    ];
    let csi_nodes = vec![
        csi_node("r-1", &[(DRIVER, &[REGION])]),
        csi_node("r-2", &[(DRIVER, &[REGION])]),
        csi_node("z-1", &[(DRIVER, &[ZONE, REGION])]),
        csi_node("z-2", &[(DRIVER, &[REGION, ZONE])]),
        csi_node("other", &[("other.csi.k8s.io", &[RACK])]),
        csi_node("keyless", &[(DRIVER, &[])]),
    ];
    (nodes, csi_nodes)
}

/// Every order of `items`.
fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut tail in permutations(&rest) {
            tail.insert(0, first.clone());
            out.push(tail);
        }
    }
    out
}

fn immediate(
    nodes: &[Node],
    csi_nodes: &[&CSINode],
    pvc_name: &str,
    allowed_topologies: &[TopologySelectorTerm],
    per_key_set: bool,
) -> Result<Option<TopologyRequirement>, TopologyError> {
    let nodes: Vec<&Node> = nodes.iter().collect();
    accessibility_requirements(&TopologyInputs {
        driver_name: DRIVER,
        pvc_name,
        allowed_topologies,
        selected_node: None,
        nodes: &nodes,
        csi_nodes,
        strict_topology: false,
        immediate_topology: true,
        immediate_per_key_set: per_key_set,
    })
}

/// The region-only terms, the region+zone terms, and their union (fewer
/// segments first, as every requisite is sorted).
/// (The node whose CSINode has no keys counts by its labels, as in the
/// Go image: nodes are selected by label, whatever their CSINode says.)
fn region_terms() -> Vec<Topology> {
    vec![
        topo(&[(REGION, "r1")]),
        topo(&[(REGION, "r2")]),
        topo(&[(REGION, "r3")]),
    ]
}

fn region_zone_terms() -> Vec<Topology> {
    vec![
        topo(&[(REGION, "r1"), (ZONE, "a")]),
        topo(&[(REGION, "r2"), (ZONE, "b")]),
    ]
}

/// `terms` rotated as the claim `pvc_name` is spread.
fn rotated_for(terms: &[Topology], pvc_name: &str) -> Vec<Topology> {
    let (hash, index) = pvc_name_hash_and_index(pvc_name);
    let shift = (hash.wrapping_add(index) % terms.len() as u32) as usize;
    terms[shift..]
        .iter()
        .chain(&terms[..shift])
        .cloned()
        .collect()
}

/// Every claim of [`CLAIMS`] is asked with `requisite`, and prefers it
/// rotated by its name's hash.
fn assert_every_claim(
    nodes: &[Node],
    csi_nodes: &[&CSINode],
    per_key_set: bool,
    requisite: &[Topology],
) {
    for claim in CLAIMS {
        let got = immediate(nodes, csi_nodes, claim, &[], per_key_set)
            .expect("requirements")
            .expect("some");
        assert_eq!(
            got.requisite, requisite,
            "{claim} (per key set: {per_key_set})"
        );
        assert_eq!(got.preferred, rotated_for(requisite, claim), "{claim}");
    }
}

const CLAIMS: &[&str] = &[
    "data-web-0",
    "data-web-1",
    "data-web-2",
    "data-web-3",
    "solo",
];

/// The Go image's choice, in every order of the CSINodes: the keys of the
/// first CSINode with keys for the driver decide, so the requisite is the
/// region terms or the region+zone terms depending on the order, the
/// non-determinism the upstream report describes (docs/operations.md, opt-ins).
#[test]
fn by_default_the_first_csinode_with_keys_decides_in_every_order() {
    let (nodes, csi_nodes) = mixed_key_sets();
    let mut seen = std::collections::BTreeSet::new();
    for order in permutations(&csi_nodes.iter().collect::<Vec<_>>()) {
        let first_keys = order
            .iter()
            .map(|c| topology_keys(c, DRIVER))
            .find(|keys| !keys.is_empty())
            .expect("a CSINode with keys");
        let expected = if first_keys.len() == 1 {
            region_terms()
        } else {
            region_zone_terms()
        };
        assert_every_claim(&nodes, &order, false, &expected);
        seen.insert(first_keys.len());
    }
    assert_eq!(seen.len(), 2, "both outcomes occur: {seen:?}");
}

/// Per key set, in every order of the CSINodes: always the union of both
/// key sets' terms, each claim's preferred list the same rotation of it.
#[test]
fn per_key_set_is_the_same_union_in_every_order() {
    let (nodes, csi_nodes) = mixed_key_sets();
    let union: Vec<Topology> = region_terms()
        .into_iter()
        .chain(region_zone_terms())
        .collect();
    for order in permutations(&csi_nodes.iter().collect::<Vec<_>>()) {
        assert_every_claim(&nodes, &order, true, &union);
    }
    // The replicas of a StatefulSet still spread: each of the four starts
    // on another term.
    let (_, csi_nodes) = mixed_key_sets();
    let refs: Vec<&CSINode> = csi_nodes.iter().collect();
    let firsts: std::collections::BTreeSet<String> = CLAIMS[..4]
        .iter()
        .map(|claim| {
            let got = immediate(&nodes, &refs, claim, &[], true)
                .expect("requirements")
                .expect("some");
            format!("{:?}", got.preferred[0].segments)
        })
        .collect();
    assert_eq!(firsts.len(), 4, "{firsts:?}");
}

/// When every node registered the same keys, both modes give the Go
/// image's requirement, in every order; with allowedTopologies, or with
/// immediate topology off, the flag changes nothing.
#[test]
fn per_key_set_equals_the_default_where_the_default_is_deterministic() {
    let cluster = Cluster::zoned();
    for order in permutations(&cluster.csi_nodes.iter().collect::<Vec<_>>()) {
        for claim in CLAIMS {
            assert_eq!(
                immediate(&cluster.nodes, &order, claim, &[], true),
                immediate(&cluster.nodes, &order, claim, &[], false),
                "{claim}"
            );
        }
    }
    let (nodes, csi_nodes) = mixed_key_sets();
    let refs: Vec<&CSINode> = csi_nodes.iter().collect();
    let allowed = [topology_term(&[(ZONE, &["b", "a"])])];
    for claim in CLAIMS {
        assert_eq!(
            immediate(&nodes, &refs, claim, &allowed, true),
            immediate(&nodes, &refs, claim, &allowed, false),
            "{claim}"
        );
    }
    let node_refs: Vec<&Node> = nodes.iter().collect();
    for per_key_set in [false, true] {
        let off = accessibility_requirements(&TopologyInputs {
            driver_name: DRIVER,
            pvc_name: "solo",
            allowed_topologies: &[],
            selected_node: None,
            nodes: &node_refs,
            csi_nodes: &refs,
            strict_topology: false,
            immediate_topology: false,
            immediate_per_key_set: per_key_set,
        });
        assert_eq!(off, Ok(None), "--immediate-topology=false");
    }
}

/// A selected node (WaitForFirstConsumer) uses its own keys in both modes.
#[test]
fn per_key_set_does_not_touch_delayed_binding() {
    let (nodes, csi_nodes) = mixed_key_sets();
    let node_refs: Vec<&Node> = nodes.iter().collect();
    let refs: Vec<&CSINode> = csi_nodes.iter().collect();
    let run = |per_key_set| {
        accessibility_requirements(&TopologyInputs {
            driver_name: DRIVER,
            pvc_name: "solo",
            allowed_topologies: &[],
            selected_node: Some(SelectedNodeTopology {
                name: "z-2",
                node: Some(&nodes[3]),
                csi_node: Some(&csi_nodes[3]),
            }),
            nodes: &node_refs,
            csi_nodes: &refs,
            strict_topology: false,
            immediate_topology: true,
            immediate_per_key_set: per_key_set,
        })
    };
    let expected = requirement(
        region_zone_terms(),
        vec![
            region_zone_terms()[1].clone(),
            region_zone_terms()[0].clone(),
        ],
    );
    assert_eq!(run(false), Ok(expected.clone()));
    assert_eq!(run(true), Ok(expected));
}

/// No key registered anywhere: wait (as the Go image). Keys no node
/// carries: an error naming them, unless another key set has nodes.
#[test]
fn per_key_set_errors_only_when_no_key_set_has_nodes() {
    let nodes = vec![node("n-1", &[(ZONE, "a")]), node("n-2", &[])];
    let keyless = [csi_node("n-1", &[(DRIVER, &[])])];
    let keyless: Vec<&CSINode> = keyless.iter().collect();
    assert_eq!(
        immediate(&nodes, &keyless, "solo", &[], true),
        Err(TopologyError::NoAvailableTopology)
    );
    let unlabelled = [
        csi_node("n-1", &[(DRIVER, &[RACK])]),
        csi_node("n-2", &[(DRIVER, &[REGION, RACK])]),
    ];
    let unlabelled: Vec<&CSINode> = unlabelled.iter().collect();
    assert_eq!(
        immediate(&nodes, &unlabelled, "solo", &[], true),
        Err(TopologyError::KeysNotOnAnyNode(vec![
            RACK.to_owned(),
            REGION.to_owned()
        ]))
    );
    let one_good = [
        csi_node("n-1", &[(DRIVER, &[ZONE])]),
        csi_node("n-2", &[(DRIVER, &[RACK])]),
    ];
    for order in permutations(&one_good.iter().collect::<Vec<_>>()) {
        assert_eq!(
            immediate(&nodes, &order, "solo", &[], true),
            Ok(requirement(zones(&["a"]), zones(&["a"])))
        );
    }
}
