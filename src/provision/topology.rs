//! Accessibility requirements for `CreateVolume` and node affinity for the PV,
//! as upstream's `GenerateAccessibilityRequirements` / `GenerateVolumeNodeAffinity`.
//!
//! | binding | allowedTopologies | strict | requisite | preferred |
//! |---|---|---|---|---|
//! | delayed (node selected) | any | yes | the selected node's segment (which must be inside allowedTopologies, if any) | = requisite |
//! | delayed | set | no | allowedTopologies flattened | requisite rotated so the first term containing the selected node's segment leads |
//! | delayed | none | no | segments of every Node carrying all the selected node's topology keys | same rotation |
//! | immediate | set | – | allowedTopologies flattened | requisite rotated by the StatefulSet-aware hash of the PVC name |
//! | immediate | none, `--immediate-topology` | – | segments of every Node carrying the keys of the first CSINode that has keys for the driver | same hash rotation |
//! | immediate | none, `--immediate-topology --immediate-topology-per-key-set` | – | for each distinct key set any CSINode registered for the driver, the segments of every Node carrying those keys (the union) | same hash rotation |
//! | immediate | none, `--immediate-topology=false` | – | none (no requirement sent) | none |
//!
//! Requisite terms are sorted (fewer segments first, then by key and value) and
//! deduplicated. The I/O layer reads Nodes and CSINodes from its caches and
//! freezes the result with the rest of the request, so retries do not recompute it.

use std::collections::{BTreeMap, HashMap};

use crate::projection::CSINode;
use crate::projection::Node;
use csi_proto::v1::{Topology, TopologyRequirement};
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, TopologySelectorTerm,
    VolumeNodeAffinity,
};

/// One topology segment set, sorted by key: the AND of its key/value pairs.
type Term = Vec<(String, String)>;

/// The node the scheduler selected, as found in the caches.
#[derive(Clone, Copy, Debug)]
pub struct SelectedNodeTopology<'a> {
    pub name: &'a str,
    /// `None` when the Node does not exist.
    pub node: Option<&'a Node>,
    /// `None` when the node has no CSINode object.
    pub csi_node: Option<&'a CSINode>,
}

/// Everything `accessibility_requirements` decides from.
#[derive(Clone, Copy, Debug)]
pub struct TopologyInputs<'a> {
    pub driver_name: &'a str,
    pub pvc_name: &'a str,
    pub allowed_topologies: &'a [TopologySelectorTerm],
    pub selected_node: Option<SelectedNodeTopology<'a>>,
    /// All Nodes of the cluster (for aggregation).
    pub nodes: &'a [&'a Node],
    /// All CSINodes of the cluster, in the order to search for topology keys
    /// when no node is selected (upstream shuffles them; pass them shuffled to
    /// spread, or sorted to be reproducible).
    pub csi_nodes: &'a [&'a CSINode],
    pub strict_topology: bool,
    pub immediate_topology: bool,
    /// Immediate binding without allowedTopologies: aggregate every
    /// distinct key set the CSINodes registered for the driver (true,
    /// `--immediate-topology-per-key-set`, docs/operations.md, opt-ins), so the
    /// requisite does not depend on the order of `csi_nodes`; or only the
    /// first CSINode's keys (false, the Go image).
    pub immediate_per_key_set: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("node {0:?} selected for the claim does not exist")]
    SelectedNodeNotFound(String),
    #[error("failed to get selected CSINode {0}: not found")]
    SelectedCsiNodeNotFound(String),
    #[error("no topology key found for node {0}")]
    NoTopologyKeys(String),
    #[error(
        "topology labels from selected node {labels:?} does not match topology keys from CSINode {keys:?}"
    )]
    SelectedNodeMissingKeys {
        labels: BTreeMap<String, String>,
        keys: Vec<String>,
    },
    #[error(
        "selected node '{node:?}' topology '{topology:?}' is not in allowed topologies: {allowed:?}"
    )]
    NotInAllowedTopologies {
        node: String,
        topology: Vec<(String, String)>,
        allowed: Vec<Vec<(String, String)>>,
    },
    #[error("no available topology found")]
    NoAvailableTopology,
    #[error("topologyKeys {0:?} were not found on any nodes")]
    KeysNotOnAnyNode(Vec<String>),
    #[error("topology {topology:?} from selected node {node:?} is not in requisite: {requisite:?}")]
    SelectedNotInRequisite {
        node: String,
        topology: Vec<(String, String)>,
        requisite: Vec<Vec<(String, String)>>,
    },
}

impl TopologyError {
    /// Whether the scheduler should pick another node (upstream reschedules
    /// when the selected Node or its CSINode cannot be found).
    pub fn wants_reschedule(&self) -> bool {
        matches!(
            self,
            TopologyError::SelectedNodeNotFound(_) | TopologyError::SelectedCsiNodeNotFound(_)
        )
    }
}

/// The topology keys `driver` registered on a CSINode (empty when none).
pub fn topology_keys<'a>(csi_node: &'a CSINode, driver: &str) -> &'a [String] {
    csi_node
        .spec
        .drivers
        .iter()
        .find(|entry| entry.name == driver)
        .and_then(|entry| entry.topology_keys.as_deref())
        .unwrap_or(&[])
}

/// The node's segment for `keys`, or `None` when it lacks one of them.
fn node_term(node: &Node, keys: &[String]) -> Option<Term> {
    let labels = node.metadata.labels.as_ref();
    let mut term = keys
        .iter()
        .map(|key| Some((key.clone(), labels?.get(key)?.clone())))
        .collect::<Option<Term>>()?;
    term.sort();
    Some(term)
}

/// Computes the `CreateVolume` accessibility requirements; `None` means send none.
pub fn accessibility_requirements(
    inputs: &TopologyInputs<'_>,
) -> Result<Option<TopologyRequirement>, TopologyError> {
    let mut requisite: Vec<Term> = Vec::new();
    let mut selected: Option<(Term, &[String])> = None;

    if let Some(node) = inputs.selected_node {
        let csi_node = node
            .csi_node
            .ok_or_else(|| TopologyError::SelectedCsiNodeNotFound(node.name.to_owned()))?;
        let keys = topology_keys(csi_node, inputs.driver_name);
        if keys.is_empty() {
            // The driver is not (yet) registered there; failing lets the
            // scheduler retry, possibly elsewhere.
            return Err(TopologyError::NoTopologyKeys(node.name.to_owned()));
        }
        let node_object = node
            .node
            .ok_or_else(|| TopologyError::SelectedNodeNotFound(node.name.to_owned()))?;
        let term =
            node_term(node_object, keys).ok_or_else(|| TopologyError::SelectedNodeMissingKeys {
                labels: node_object.metadata.labels.clone().unwrap_or_default(),
                keys: keys.to_vec(),
            })?;
        if inputs.strict_topology {
            if !inputs.allowed_topologies.is_empty() {
                let allowed = flatten(inputs.allowed_topologies);
                if !allowed.iter().any(|candidate| is_subset(candidate, &term)) {
                    return Err(TopologyError::NotInAllowedTopologies {
                        node: node.name.to_owned(),
                        topology: term,
                        allowed,
                    });
                }
            }
            requisite.push(term.clone());
        }
        selected = Some((term, keys));
    }

    if requisite.is_empty() {
        if !inputs.allowed_topologies.is_empty() {
            requisite = flatten(inputs.allowed_topologies);
        } else {
            if selected.is_none() && !inputs.immediate_topology {
                // Neither the class nor the claim restricts placement and the
                // driver does not want the cluster's topology.
                return Ok(None);
            }
            requisite = aggregate(inputs, selected.as_ref().map(|(_, keys)| *keys))?;
            if requisite.is_empty() {
                // The driver has not registered on any node yet; wait for it.
                return Err(TopologyError::NoAvailableTopology);
            }
        }
    }
    requisite.retain(|term| !term.is_empty());
    if requisite.is_empty() {
        // allowedTopologies made only of empty entries: as if topology were off.
        return Ok(None);
    }
    requisite.sort_by(compare_terms);
    requisite.dedup();

    let preferred = match &selected {
        None => {
            let (hash, index) = pvc_name_hash_and_index(inputs.pvc_name);
            let len = u32::try_from(requisite.len()).unwrap_or(u32::MAX);
            let shift = (hash.wrapping_add(index) % len) as usize;
            rotate(&requisite, shift)
        }
        Some(_) if inputs.strict_topology => requisite.clone(),
        Some((term, _)) => match requisite
            .iter()
            .position(|candidate| is_subset(candidate, term))
        {
            Some(shift) => rotate(&requisite, shift),
            None => {
                return Err(TopologyError::SelectedNotInRequisite {
                    node: inputs
                        .selected_node
                        .map(|n| n.name.to_owned())
                        .unwrap_or_default(),
                    topology: term.clone(),
                    requisite,
                });
            }
        },
    };
    Ok(Some(TopologyRequirement {
        requisite: to_csi(&requisite),
        preferred: to_csi(&preferred),
    }))
}

/// All segments in the cluster for the topology keys of the selected node, or
/// (immediate binding) of the first CSINode with keys for the driver.
fn aggregate(
    inputs: &TopologyInputs<'_>,
    selected_keys: Option<&[String]>,
) -> Result<Vec<Term>, TopologyError> {
    if selected_keys.is_none() && inputs.immediate_per_key_set {
        return aggregate_every_key_set(inputs);
    }
    let keys = match selected_keys {
        Some(keys) => keys,
        None => match inputs
            .csi_nodes
            .iter()
            .map(|csi_node| topology_keys(csi_node, inputs.driver_name))
            .find(|keys| !keys.is_empty())
        {
            Some(keys) => keys,
            None => return Ok(Vec::new()),
        },
    };
    let terms: Vec<Term> = inputs
        .nodes
        .iter()
        .filter_map(|node| node_term(node, keys))
        .collect();
    if terms.is_empty() {
        return Err(TopologyError::KeysNotOnAnyNode(keys.to_vec()));
    }
    Ok(terms)
}

/// Immediate binding, per key set: for each distinct set of keys a CSINode
/// registered for the driver (compared sorted), the segments of every Node
/// carrying those keys; their union, whatever the order of the CSINodes.
/// A key set no Node carries adds nothing; an error only when none does.
fn aggregate_every_key_set(inputs: &TopologyInputs<'_>) -> Result<Vec<Term>, TopologyError> {
    let key_sets: std::collections::BTreeSet<Vec<String>> = inputs
        .csi_nodes
        .iter()
        .map(|csi_node| {
            let mut keys = topology_keys(csi_node, inputs.driver_name).to_vec();
            keys.sort();
            keys.dedup();
            keys
        })
        .filter(|keys| !keys.is_empty())
        .collect();
    if key_sets.is_empty() {
        return Ok(Vec::new());
    }
    let terms: Vec<Term> = key_sets
        .iter()
        .flat_map(|keys| inputs.nodes.iter().filter_map(|node| node_term(node, keys)))
        .collect();
    if terms.is_empty() {
        let mut all: Vec<String> = key_sets.into_iter().flatten().collect();
        all.sort();
        all.dedup();
        return Err(TopologyError::KeysNotOnAnyNode(all));
    }
    Ok(terms)
}

/// Distributes the OR of values over the AND of expressions in each
/// allowedTopologies term: `{zone: [a, b], rack: [1]}` → `[{zone: a, rack: 1}, {zone: b, rack: 1}]`.
fn flatten(allowed: &[TopologySelectorTerm]) -> Vec<Term> {
    let mut all = Vec::new();
    for selector_term in allowed {
        let mut terms: Vec<Term> = Vec::new();
        for expression in selector_term.match_label_expressions.iter().flatten() {
            let mut next = Vec::new();
            for value in &expression.values {
                if terms.is_empty() {
                    next.push(vec![(expression.key.clone(), value.clone())]);
                } else {
                    for term in &terms {
                        let mut extended = term.clone();
                        extended.push((expression.key.clone(), value.clone()));
                        next.push(extended);
                    }
                }
            }
            terms = next;
        }
        all.extend(terms);
    }
    for term in &mut all {
        term.sort();
    }
    all
}

/// Upstream's term order: fewer segments first, then segment by segment.
fn compare_terms(a: &Term, b: &Term) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Whether every segment of `part` (sorted) is in `whole` (sorted), walked as upstream does.
fn is_subset(part: &Term, whole: &Term) -> bool {
    if part.is_empty() {
        return true;
    }
    let mut next = 0;
    for (key, value) in whole {
        let (wanted_key, wanted_value) = &part[next];
        if wanted_key != key {
            continue;
        }
        if wanted_value != value {
            return false;
        }
        next += 1;
        if next == part.len() {
            return true;
        }
    }
    false
}

fn rotate(terms: &[Term], shift: usize) -> Vec<Term> {
    terms[shift..]
        .iter()
        .chain(&terms[..shift])
        .cloned()
        .collect()
}

fn to_csi(terms: &[Term]) -> Vec<Topology> {
    terms
        .iter()
        .map(|term| Topology {
            segments: term.iter().cloned().collect::<HashMap<_, _>>(),
        })
        .collect()
}

/// Upstream's (and the in-tree volume util's) spreading heuristic: StatefulSet
/// claims `<claim>-<set>-<ordinal>` hash only `<set>` and offset by the
/// ordinal, so replicas round-robin across topologies while the claims of one
/// replica stay together. FNV-1 32-bit.
pub fn pvc_name_hash_and_index(pvc_name: &str) -> (u32, u32) {
    let mut hashed = pvc_name;
    let mut index = 0;
    if let Some((prefix, suffix)) = pvc_name.rsplit_once('-')
        && let Ok(ordinal) = suffix.parse::<u32>()
        && !suffix.starts_with('+')
    {
        index = ordinal;
        hashed = prefix.rsplit_once('-').map_or(prefix, |(_, set)| set);
    }
    let hash = hashed.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        hash.wrapping_mul(0x0100_0193) ^ u32::from(byte)
    });
    (hash, index)
}

/// The PV's node affinity from the topology `CreateVolume` returned: one
/// NodeSelectorTerm per segment set, one `In` expression per key.
pub fn volume_node_affinity(accessible: &[Topology]) -> Option<VolumeNodeAffinity> {
    if accessible.is_empty() {
        return None;
    }
    let terms = accessible
        .iter()
        .filter(|topology| !topology.segments.is_empty())
        .map(|topology| {
            let sorted: BTreeMap<_, _> = topology.segments.iter().collect();
            NodeSelectorTerm {
                match_expressions: Some(
                    sorted
                        .into_iter()
                        .map(|(key, value)| NodeSelectorRequirement {
                            key: key.clone(),
                            operator: "In".to_owned(),
                            values: Some(vec![value.clone()]),
                        })
                        .collect(),
                ),
                match_fields: None,
            }
        })
        .collect();
    Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}

/// Whether the accessible topology returned by the driver lies inside the
/// requisite topology of the request: each returned segment set must agree
/// with some requisite term on every key they share. Segments without a
/// shared key cannot be judged and pass: drivers may answer with other keys
/// than a class's allowedTopologies used (e.g. a driver-specific zone key for
/// `topology.kubernetes.io/zone`), and refusing those would delete good
/// volumes forever. No requisite (or nothing returned) means nothing to violate.
pub fn satisfies_requisite(
    accessible: &[Topology],
    requirement: Option<&TopologyRequirement>,
) -> bool {
    let Some(requirement) = requirement else {
        return true;
    };
    if requirement.requisite.is_empty() {
        return true;
    }
    accessible.iter().all(|returned| {
        requirement.requisite.iter().any(|wanted| {
            wanted.segments.iter().all(|(key, value)| {
                returned
                    .segments
                    .get(key)
                    .is_none_or(|returned_value| returned_value == value)
            })
        })
    })
}

/// Whether a node with `labels` satisfies the required node affinity (the
/// scheduler's NodeSelector semantics: terms ORed, expressions ANDed; an empty
/// term matches nothing; field selectors never match a label-only node).
pub fn node_affinity_matches(
    affinity: Option<&VolumeNodeAffinity>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(required) = affinity.and_then(|affinity| affinity.required.as_ref()) else {
        return true;
    };
    required.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or(&[]);
        let fields = term.match_fields.as_deref().unwrap_or(&[]);
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        fields.is_empty()
            && expressions
                .iter()
                .all(|requirement| requirement_matches(requirement, labels))
    })
}

fn requirement_matches(
    requirement: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = requirement.values.as_deref().unwrap_or(&[]);
    let label = labels.get(&requirement.key);
    match requirement.operator.as_str() {
        "In" => label.is_some_and(|label| values.contains(label)),
        "NotIn" => label.is_none_or(|label| !values.contains(label)),
        "Exists" => label.is_some(),
        "DoesNotExist" => label.is_none(),
        "Gt" | "Lt" => {
            let (Some(label), [bound]) = (label, values) else {
                return false;
            };
            match (label.parse::<i64>(), bound.parse::<i64>()) {
                (Ok(label), Ok(bound)) if requirement.operator == "Gt" => label > bound,
                (Ok(label), Ok(bound)) => label < bound,
                _ => false,
            }
        }
        _ => false,
    }
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
