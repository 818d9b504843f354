//! The pure decisions of the capacity loop: which topology segments exist,
//! which (segment, class) pairs want a CSIStorageCapacity object, what to ask
//! `GetCapacity` for a pair, and how the published objects must change
//! ([`reconcile`]). No I/O here; `mod.rs` feeds these from the caches and
//! carries out the actions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use crate::projection::CSIStorageCapacity;
use crate::projection::Node;
use crate::projection::{CSINode, StorageClass};
use csi_proto::v1::{GetCapacityRequest, Topology};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use crate::provision::quantity::{bytes_to_quantity, quantity_bytes};
use crate::provision::topology_keys;
use crate::wellknown::CSI_PARAMETER_PREFIX;

/// Label naming the driver of a CSIStorageCapacity object (upstream's).
pub const LABEL_DRIVER_NAME: &str = "csi.storage.k8s.io/drivername";
/// Label naming the producer of a CSIStorageCapacity object (upstream's).
pub const LABEL_MANAGED_BY: &str = "csi.storage.k8s.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`] for the central (non node-local) deployment.
pub const MANAGED_BY_CENTRAL: &str = "external-provisioner";
/// The [`LABEL_MANAGED_BY`] value of one sidecar: [`MANAGED_BY_CENTRAL`],
/// or with `--node-deployment` `external-provisioner-<node>`, shortened to
/// a label value (63 characters) with upstream's rule
/// (`getNameWithMaxLength`, from openshift's namer), so the sidecars of
/// different nodes own different objects and the names match upstream's.
pub fn managed_by(node: Option<&str>) -> String {
    const MAX: usize = 63;
    let Some(node) = node else {
        return MANAGED_BY_CENTRAL.to_owned();
    };
    let base = MANAGED_BY_CENTRAL;
    let name = format!("{base}-{node}");
    if name.len() <= MAX {
        return name;
    }
    // The length of "-<8 hex digits>-".
    let base_length = MAX as isize - 10 - node.len() as isize;
    if base_length <= 0 {
        let prefix = &base[..base.len().min(MAX - 9)];
        let short = format!("{prefix}-{}", fnv32a_hex(&name));
        return short[..short.len().min(MAX)].to_owned();
    }
    let prefix = &base[..base_length as usize];
    format!("{prefix}-{}-{node}", fnv32a_hex(base))
}

/// FNV-1a, 32 bits, as 8 lowercase hex digits (Go's `hash/fnv` New32a).
fn fnv32a_hex(s: &str) -> String {
    let hash = s.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}

/// The pairs to refresh after a volume was provisioned or deleted, as
/// upstream's provision wrapper: with a node affinity, every pair whose
/// segment satisfies it (those capacities probably changed); without, every
/// pair of the volume's class.
pub fn pairs_touched_by(
    wanted: &BTreeSet<Pair>,
    affinity: Option<&k8s_openapi::api::core::v1::NodeSelector>,
    class: &str,
) -> Vec<Pair> {
    wanted
        .iter()
        .filter(|pair| match affinity {
            Some(selector) => selector.node_selector_terms.iter().any(|term| {
                term.match_expressions.iter().flatten().all(|e| {
                    e.operator == "In"
                        && pair
                            .segment
                            .0
                            .get(&e.key)
                            .is_some_and(|v| e.values.iter().flatten().any(|w| w == v))
                })
            }),
            None => pair.class == class,
        })
        .cloned()
        .collect()
}

/// `metadata.generateName` of the objects.
pub const GENERATE_NAME: &str = "csisc-";

const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";
const IMMEDIATE: &str = "Immediate";

/// A topology segment: the values of the driver's topology keys on some
/// nodes. Empty for a driver without topology (accessible everywhere).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Segment(pub BTreeMap<String, String>);

impl Segment {
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Segment(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The object's `nodeTopology`: an empty selector (all nodes) for the
    /// empty segment, else `matchLabels` of the segment.
    pub fn node_topology(&self) -> LabelSelector {
        LabelSelector {
            match_labels: (!self.0.is_empty()).then(|| self.0.clone()),
            match_expressions: None,
        }
    }

    /// The segment a `nodeTopology` describes, if it is one we could have
    /// written (only `matchLabels`; `None` for an absent selector, which
    /// means "no node", or one with expressions).
    pub fn of_selector(selector: Option<&LabelSelector>) -> Option<Segment> {
        let selector = selector?;
        if selector
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty())
        {
            return None;
        }
        Some(Segment(selector.match_labels.clone().unwrap_or_default()))
    }
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("{}");
        }
        let items: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(f, "{{{}}}", items.join(","))
    }
}

/// One published object's identity: a segment and a StorageClass name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pair {
    pub segment: Segment,
    pub class: String,
}

impl fmt::Display for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "class {} segment {}", self.class, self.segment)
    }
}

/// The segments added and removed between the last computation (`None`:
/// none yet, so every segment is new) and this one: the work of the
/// `csitopology` queue, whose sweep is needed only when one changed.
pub fn segment_changes<'a>(
    last: Option<&'a BTreeSet<Segment>>,
    now: &'a BTreeSet<Segment>,
) -> (Vec<&'a Segment>, Vec<&'a Segment>) {
    match last {
        None => (now.iter().collect(), Vec::new()),
        Some(last) => (
            now.difference(last).collect(),
            last.difference(now).collect(),
        ),
    }
}

/// The distinct segments of the nodes whose CSINode lists `driver`.
///
/// Without topology (`topology == false`: the driver lacks
/// VOLUME_ACCESSIBILITY_CONSTRAINTS or the Topology gate is off) there is
/// one segment, the empty one. With topology, a CSINode contributes the
/// values its Node has for the driver's topology keys; a CSINode without
/// keys for the driver, without its Node, or whose Node lacks one of the
/// labels contributes nothing (as upstream: the driver is not fully
/// registered there yet).
pub fn segments(
    driver: &str,
    topology: bool,
    nodes: &[&Node],
    csi_nodes: &[&CSINode],
) -> BTreeSet<Segment> {
    if !topology {
        return BTreeSet::from([Segment::default()]);
    }
    let nodes: HashMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, *n)))
        .collect();
    let mut out = BTreeSet::new();
    for csi_node in csi_nodes {
        let keys = topology_keys(csi_node, driver);
        if keys.is_empty() {
            continue;
        }
        let Some(node) = csi_node
            .metadata
            .name
            .as_deref()
            .and_then(|name| nodes.get(name))
        else {
            continue;
        };
        let labels = node.metadata.labels.as_ref();
        let segment: Option<BTreeMap<String, String>> = keys
            .iter()
            .map(|k| Some((k.clone(), labels?.get(k)?.clone())))
            .collect();
        if let Some(segment) = segment {
            out.insert(Segment(segment));
        }
    }
    out
}

/// Whether `class` gets capacity objects: provisioned by `driver`, not
/// being deleted, and WaitForFirstConsumer (or Immediate with
/// `--capacity-for-immediate-binding`). An absent binding mode is
/// Immediate, as the API server defaults it.
pub fn class_wanted(class: &StorageClass, driver: &str, immediate: bool) -> bool {
    if class.provisioner != driver || class.metadata.deletion_timestamp.is_some() {
        return false;
    }
    match class.volume_binding_mode.as_deref().unwrap_or(IMMEDIATE) {
        WAIT_FOR_FIRST_CONSUMER => true,
        IMMEDIATE => immediate,
        _ => false,
    }
}

/// Every (segment, class) pair that must have an object.
pub fn wanted(
    driver: &str,
    classes: &[&StorageClass],
    segments: &BTreeSet<Segment>,
    immediate: bool,
) -> BTreeSet<Pair> {
    let mut out = BTreeSet::new();
    for class in classes {
        if !class_wanted(class, driver, immediate) {
            continue;
        }
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        for segment in segments {
            out.insert(Pair {
                segment: segment.clone(),
                class: name.to_owned(),
            });
        }
    }
    out
}

/// The `GetCapacity` request for `pair`: the class parameters without the
/// sidecar's own `csi.storage.k8s.io/` keys, and the segment as accessible
/// topology (none for the empty segment).
pub fn capacity_request(class: &StorageClass, segment: &Segment) -> GetCapacityRequest {
    let parameters = class
        .parameters
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(CSI_PARAMETER_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    GetCapacityRequest {
        volume_capabilities: Vec::new(),
        parameters,
        accessible_topology: (!segment.0.is_empty()).then(|| Topology {
            segments: segment.0.clone().into_iter().collect(),
        }),
    }
}

/// What the driver reported for a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// `available_capacity`, bytes.
    pub available: i64,
    /// `maximum_volume_size`, bytes, when the driver reported it.
    pub maximum: Option<i64>,
}

impl Reported {
    /// Checks a `GetCapacity` answer: negative sizes are refused (a
    /// Quantity of them would tell the scheduler nonsense).
    pub fn from_response(available: i64, maximum: Option<i64>) -> Result<Reported, String> {
        if available < 0 {
            return Err(format!("available_capacity {available} is negative"));
        }
        if let Some(m) = maximum
            && m < 0
        {
            return Err(format!("maximum_volume_size {m} is negative"));
        }
        Ok(Reported { available, maximum })
    }
}

/// Who the objects are for: the labels they carry and the owner they get.
#[derive(Debug, Clone, PartialEq)]
pub struct Publisher {
    pub driver: String,
    /// [`LABEL_MANAGED_BY`] value.
    pub managed_by: String,
    pub namespace: String,
    /// `--capacity-ownerref-level` >= 0: the resolved controller.
    pub owner: Option<OwnerReference>,
}

impl Publisher {
    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_DRIVER_NAME.to_owned(), self.driver.clone()),
            (LABEL_MANAGED_BY.to_owned(), self.managed_by.clone()),
        ])
    }

    /// The label selector of our objects, for the watch.
    pub fn label_selector(&self) -> String {
        format!(
            "{LABEL_DRIVER_NAME}={},{LABEL_MANAGED_BY}={}",
            self.driver, self.managed_by
        )
    }

    /// Whether `object` is ours to manage: it carries our driver and
    /// managed-by labels (upstream's `isManaged`). Its owner does not
    /// matter: an object of a run without (or with another) owner is
    /// adopted and gets our owner added on its next update.
    pub fn manages(&self, object: &CSIStorageCapacity) -> bool {
        let labels = object.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        label(LABEL_DRIVER_NAME) == Some(self.driver.as_str())
            && label(LABEL_MANAGED_BY) == Some(self.managed_by.as_str())
    }

    /// Whether `object` has our owner as its controller, or we have no
    /// owner (upstream's `isOwnedByUs`).
    pub fn owner_ok(&self, object: &CSIStorageCapacity) -> bool {
        match &self.owner {
            None => true,
            Some(owner) => object
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.controller == Some(true) && r.uid == owner.uid),
        }
    }

    /// A new object for `pair`.
    pub fn new_object(&self, pair: &Pair, reported: Reported) -> CSIStorageCapacity {
        CSIStorageCapacity {
            metadata: ObjectMeta {
                generate_name: Some(GENERATE_NAME.to_owned()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels()),
                owner_references: self.owner.clone().map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            storage_class_name: pair.class.clone(),
            node_topology: Some(pair.segment.node_topology()),
            capacity: Some(bytes_to_quantity(reported.available)),
            maximum_volume_size: reported.maximum.map(bytes_to_quantity),
        }
    }
}

/// Whether `object` already publishes `reported` (compared as byte counts,
/// so `1Gi` equals `1073741824`; an unparsable value differs).
pub fn up_to_date(object: &CSIStorageCapacity, reported: Reported) -> bool {
    let bytes =
        |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| q.map(quantity_bytes);
    let capacity_ok =
        matches!(bytes(object.capacity.as_ref()), Some(Ok(b)) if b == reported.available);
    let maximum_ok = match (bytes(object.maximum_volume_size.as_ref()), reported.maximum) {
        (None, None) => true,
        (Some(Ok(b)), Some(m)) => b == m,
        _ => false,
    };
    capacity_ok && maximum_ok
}

/// Why an object is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// Its (segment, class) is not wanted (class gone or not WFFC any more,
    /// segment gone).
    NotWanted,
    /// Another object already publishes the same pair.
    Duplicate,
    /// Its nodeTopology is not one we write (absent, or with expressions).
    UnknownTopology,
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeleteReason::NotWanted => "its class and segment are no longer wanted",
            DeleteReason::Duplicate => "another object publishes the same class and segment",
            DeleteReason::UnknownTopology => "its nodeTopology is not a segment we publish",
        })
    }
}

/// One decision of [`reconcile`].
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// No object for a wanted pair: create this one (generateName).
    Create {
        pair: Pair,
        object: Box<CSIStorageCapacity>,
    },
    /// The pair's object shows other values: replace it with this one
    /// (same name and resourceVersion, new capacity).
    Update {
        pair: Pair,
        object: Box<CSIStorageCapacity>,
    },
    /// The pair's object is up to date.
    Keep { pair: Pair, name: String },
    /// A wanted pair whose capacity is not known yet (never polled, or the
    /// last `GetCapacity` failed): its object, if any, stays as it is.
    Pending { pair: Pair, name: Option<String> },
    /// One of our objects that must go.
    Delete { name: String, reason: DeleteReason },
}

impl Action {
    /// The pair this action is about (`None` for deletions).
    pub fn pair(&self) -> Option<&Pair> {
        match self {
            Action::Create { pair, .. }
            | Action::Update { pair, .. }
            | Action::Keep { pair, .. }
            | Action::Pending { pair, .. } => Some(pair),
            Action::Delete { .. } => None,
        }
    }
}

/// The pair an object publishes; `None` when its nodeTopology is not one we
/// write ([`Segment::of_selector`]).
pub fn pair_of(object: &CSIStorageCapacity) -> Option<Pair> {
    Some(Pair {
        segment: Segment::of_selector(object.node_topology.as_ref())?,
        class: object.storage_class_name.clone(),
    })
}

/// The diff between what is wanted and what is published.
///
/// `existing` are the objects in our namespace; those we do not manage
/// ([`Publisher::manages`]: other driver or producer) are ignored. Each wanted pair adopts the oldest of
/// our objects with its class and segment (by creation time, then name), so
/// objects of a previous run are reused, not duplicated; the others go.
/// A pair with a known capacity gets its object created, or updated only
/// when a value changed or it lacks our owner reference (then added, as
/// upstream does for a deployment that turned owner references on).
pub fn reconcile(
    publisher: &Publisher,
    wanted: &BTreeSet<Pair>,
    existing: &[&CSIStorageCapacity],
    reported: &HashMap<Pair, Reported>,
) -> Vec<Action> {
    let mut ours: Vec<&CSIStorageCapacity> = existing
        .iter()
        .copied()
        .filter(|o| publisher.manages(o) && o.metadata.name.is_some())
        .collect();
    ours.sort_by(|a, b| {
        let created = |o: &CSIStorageCapacity| o.metadata.creation_timestamp.clone().map(|t| t.0);
        created(a)
            .cmp(&created(b))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    let mut actions = Vec::new();
    let mut adopted: BTreeMap<&Pair, &CSIStorageCapacity> = BTreeMap::new();
    for object in ours {
        let name = object.metadata.name.clone().unwrap_or_default();
        let Some(pair) = pair_of(object) else {
            actions.push(Action::Delete {
                name,
                reason: DeleteReason::UnknownTopology,
            });
            continue;
        };
        match wanted.get(&pair) {
            None => actions.push(Action::Delete {
                name,
                reason: DeleteReason::NotWanted,
            }),
            Some(key) if adopted.contains_key(key) => actions.push(Action::Delete {
                name,
                reason: DeleteReason::Duplicate,
            }),
            Some(key) => {
                adopted.insert(key, object);
            }
        }
    }
    for pair in wanted {
        let object = adopted.get(pair).copied();
        let name = object.and_then(|o| o.metadata.name.clone());
        let Some(value) = reported.get(pair).copied() else {
            actions.push(Action::Pending {
                pair: pair.clone(),
                name,
            });
            continue;
        };
        match object {
            None => actions.push(Action::Create {
                pair: pair.clone(),
                object: Box::new(publisher.new_object(pair, value)),
            }),
            Some(object) if up_to_date(object, value) && publisher.owner_ok(object) => {
                actions.push(Action::Keep {
                    pair: pair.clone(),
                    name: name.unwrap_or_default(),
                });
            }
            Some(object) => {
                let mut updated = object.clone();
                updated.capacity = Some(bytes_to_quantity(value.available));
                updated.maximum_volume_size = value.maximum.map(bytes_to_quantity);
                if let Some(owner) = &publisher.owner
                    && !publisher.owner_ok(object)
                {
                    updated
                        .metadata
                        .owner_references
                        .get_or_insert_with(Vec::new)
                        .push(owner.clone());
                }
                actions.push(Action::Update {
                    pair: pair.clone(),
                    object: Box::new(updated),
                });
            }
        }
    }
    actions
}

/// How the wanted pairs are derived ([`segments`], [`wanted`]) besides the
/// objects: the driver, its topology, `--capacity-for-immediate-binding`,
/// and with `--node-deployment` the one segment published (then the Node
/// and CSINode objects are not read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wants {
    pub driver: String,
    pub topology: bool,
    pub immediate: bool,
    pub fixed_segment: Option<Segment>,
}

impl Wants {
    /// The segments the objects are published for.
    pub fn segments(&self, nodes: &[&Node], csi_nodes: &[&CSINode]) -> BTreeSet<Segment> {
        match &self.fixed_segment {
            Some(segment) => BTreeSet::from([segment.clone()]),
            None => segments(&self.driver, self.topology, nodes, csi_nodes),
        }
    }

    /// Every wanted pair.
    pub fn pairs(
        &self,
        classes: &[&StorageClass],
        nodes: &[&Node],
        csi_nodes: &[&CSINode],
    ) -> BTreeSet<Pair> {
        wanted(
            &self.driver,
            classes,
            &self.segments(nodes, csi_nodes),
            self.immediate,
        )
    }

    /// Whether `pair` is wanted.
    pub fn wants(
        &self,
        pair: &Pair,
        classes: &[&StorageClass],
        nodes: &[&Node],
        csi_nodes: &[&CSINode],
    ) -> bool {
        let class_ok = classes.iter().any(|class| {
            class.metadata.name.as_deref() == Some(pair.class.as_str())
                && class_wanted(class, &self.driver, self.immediate)
        });
        class_ok && self.segments(nodes, csi_nodes).contains(&pair.segment)
    }
}

/// The one live read that confirms the deletion of an object whose pair is
/// not wanted ([`DeleteReason::NotWanted`]). The wanted pairs come from the
/// class, Node and CSINode caches, whose watches are not ordered with each
/// other nor with our objects' watch: a class or CSINode that exists but
/// whose event has not arrived would delete an object the scheduler needs
/// (the pods of its WaitForFirstConsumer class are unschedulable in that
/// segment until it is back). The read is of the fact the pair's absence
/// rests on ([`obsolete_because`]); the pair is decided again with it
/// ([`still_obsolete`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LiveRead {
    /// Nothing another watch delivers: a segment this sidecar never
    /// publishes (not its node's, or one with topology off / on). Deleted
    /// without a read.
    Nothing,
    /// The class by name: the class cache has it absent, being deleted, of
    /// another driver or binding mode.
    Class(String),
    /// The CSINode of a cached Node that carries the segment's labels: the
    /// CSINode cache may not have seen the driver registered there.
    CsiNode(String),
    /// The Node of a cached CSINode registering the driver with the
    /// segment's keys, missing from the Node cache.
    Node(String),
    /// Neither cache points at the segment: the nodes carrying its labels
    /// (a label-selected list, [`LIVE_NODES_LIMIT`] at most), checked
    /// against the CSINode cache.
    NodesInSegment(Segment),
}

/// The most nodes [`LiveRead::NodesInSegment`] reads.
pub const LIVE_NODES_LIMIT: u32 = 10;

/// What a live read returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Live {
    Nothing,
    /// The class of that name, or `None` (404).
    Class {
        name: String,
        class: Option<StorageClass>,
    },
    /// The CSINode of that name, or `None` (404).
    CsiNode {
        name: String,
        csi_node: Option<CSINode>,
    },
    /// The Node of that name, or `None` (404).
    Node {
        name: String,
        node: Option<Node>,
    },
    /// The nodes listed with the segment's labels.
    Nodes(Vec<Node>),
}

/// The label selector of the nodes in `segment` (`k=v,...`).
pub fn segment_selector(segment: &Segment) -> String {
    segment
        .0
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `node` carries every label of `segment`.
fn in_segment(node: &Node, segment: &Segment) -> bool {
    let labels = node.metadata.labels.as_ref();
    segment
        .0
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Whether `csi_node` registers `driver` with exactly the segment's keys.
fn registers_keys(csi_node: &CSINode, driver: &str, segment: &Segment) -> bool {
    let keys: BTreeSet<&str> = topology_keys(csi_node, driver)
        .iter()
        .map(String::as_str)
        .collect();
    !keys.is_empty() && keys == segment.0.keys().map(String::as_str).collect()
}

/// What the absence of `pair` from the wanted pairs rests on, besides our
/// own objects: the one object (or label-selected list) to read live
/// before deleting its object. The class first: when the cache does not
/// want the class, that is the fact. With the class wanted, the segment is
/// missing from the Node and CSINode caches: a cached Node in the segment
/// points at its CSINode, else a cached CSINode with the segment's keys
/// and no cached Node at its Node, else the nodes carrying the labels.
pub fn obsolete_because(
    wants: &Wants,
    pair: &Pair,
    classes: &[&StorageClass],
    nodes: &[&Node],
    csi_nodes: &[&CSINode],
) -> LiveRead {
    let class_ok = classes.iter().any(|class| {
        class.metadata.name.as_deref() == Some(pair.class.as_str())
            && class_wanted(class, &wants.driver, wants.immediate)
    });
    if !class_ok {
        return LiveRead::Class(pair.class.clone());
    }
    if wants.fixed_segment.is_some() || !wants.topology || pair.segment.0.is_empty() {
        // Segments that come from no Node or CSINode: the node's own, or
        // the empty one without topology; any other is never published.
        return LiveRead::Nothing;
    }
    let mut in_it: Vec<&str> = nodes
        .iter()
        .filter(|node| in_segment(node, &pair.segment))
        .filter_map(|node| node.metadata.name.as_deref())
        .collect();
    in_it.sort_unstable();
    if let Some(name) = in_it.first() {
        return LiveRead::CsiNode((*name).to_owned());
    }
    let cached_nodes: BTreeSet<&str> = nodes
        .iter()
        .filter_map(|node| node.metadata.name.as_deref())
        .collect();
    let mut nodeless: Vec<&str> = csi_nodes
        .iter()
        .filter(|csi_node| registers_keys(csi_node, &wants.driver, &pair.segment))
        .filter_map(|csi_node| csi_node.metadata.name.as_deref())
        .filter(|name| !cached_nodes.contains(name))
        .collect();
    nodeless.sort_unstable();
    if let Some(name) = nodeless.first() {
        return LiveRead::Node((*name).to_owned());
    }
    LiveRead::NodesInSegment(pair.segment.clone())
}

/// `cached` with `live` in place of the cached object of its name (`None`:
/// the object is gone).
fn overlay<'a, T>(
    cached: &[&'a T],
    name: &str,
    live: Option<&'a T>,
    name_of: impl Fn(&T) -> Option<&str>,
) -> Vec<&'a T> {
    cached
        .iter()
        .copied()
        .filter(|object| name_of(object) != Some(name))
        .chain(live)
        .collect()
}

/// Whether `pair` is still not wanted once the live read replaces the
/// cached objects it names: only then is its object deleted. A pair wanted
/// with the live objects is a cache that has not seen a change yet; its
/// event sweeps again.
pub fn still_obsolete(
    wants: &Wants,
    pair: &Pair,
    classes: &[&StorageClass],
    nodes: &[&Node],
    csi_nodes: &[&CSINode],
    live: &Live,
) -> bool {
    let wanted = match live {
        Live::Nothing => wants.wants(pair, classes, nodes, csi_nodes),
        Live::Class { name, class } => {
            let classes = overlay(classes, name, class.as_ref(), |c| {
                c.metadata.name.as_deref()
            });
            wants.wants(pair, &classes, nodes, csi_nodes)
        }
        Live::CsiNode { name, csi_node } => {
            let csi_nodes = overlay(csi_nodes, name, csi_node.as_ref(), |c| {
                c.metadata.name.as_deref()
            });
            wants.wants(pair, classes, nodes, &csi_nodes)
        }
        Live::Node { name, node } => {
            let nodes = overlay(nodes, name, node.as_ref(), |n| n.metadata.name.as_deref());
            wants.wants(pair, classes, &nodes, csi_nodes)
        }
        Live::Nodes(listed) => {
            let mut nodes = nodes.to_vec();
            for node in listed {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                nodes = overlay(&nodes, name, Some(node), |n| n.metadata.name.as_deref());
            }
            wants.wants(pair, classes, &nodes, csi_nodes)
        }
    };
    !wanted
}

/// Upstream's object gauges, from one [`reconcile`] result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Wanted pairs.
    pub goal: usize,
    /// Wanted pairs that have an object.
    pub current: usize,
    /// Objects about to be deleted.
    pub obsolete: usize,
}

impl Counts {
    pub fn of(actions: &[Action]) -> Counts {
        let mut c = Counts::default();
        for action in actions {
            match action {
                Action::Create { .. } | Action::Pending { name: None, .. } => c.goal += 1,
                Action::Update { .. }
                | Action::Keep { .. }
                | Action::Pending { name: Some(_), .. } => {
                    c.goal += 1;
                    c.current += 1;
                }
                Action::Delete { .. } => c.obsolete += 1,
            }
        }
        c
    }
}

/// The controller reference of an object (the one with `controller: true`).
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// The owner reference naming an object, as upstream's owner lookup builds
/// it (controller, no blockOwnerDeletion). `None` without a uid.
pub fn reference_to(api_version: &str, kind: &str, meta: &ObjectMeta) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: meta.name.clone()?,
        uid: meta.uid.clone().filter(|u| !u.is_empty())?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}
