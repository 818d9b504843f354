//! Topology keys between the in-tree and the CSI world: the Kubernetes zone
//! and region labels (GA or beta) that in-tree PVs and classes use, and the
//! CSI driver's own zone key.
//!
//! In a PV, node affinity wins over labels: a PV's zone key is the GA one if
//! its node affinity uses it, else the beta one if the affinity uses that,
//! else whichever its labels carry, GA by default.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    TopologySelectorLabelRequirement, TopologySelectorTerm, VolumeNodeAffinity,
};

use super::handles::RegionError;
use crate::wellknown as wk;

/// Why the topology of a CSI PV cannot be written in the in-tree form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyTranslationError {
    /// A node selector term with only keys the translation does not know: the
    /// region the in-tree form needs cannot be derived.
    #[error(
        "node selector term with keys {keys:?} has no {zone_key} value to derive the region from"
    )]
    TermWithoutZone { zone_key: String, keys: Vec<String> },
    #[error("failed to handle region topology: {0}")]
    Region(#[from] RegionError),
}

/// Derives the one region of a term's zones.
pub(super) type RegionOfZones = fn(&[String]) -> Result<String, RegionError>;

/// Renames the Kubernetes zone keys (GA and beta) in a class's
/// allowedTopologies to the CSI driver's `key`; other keys pass unchanged.
pub fn translate_allowed_topologies(
    terms: &[TopologySelectorTerm],
    key: &str,
) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|term| TopologySelectorTerm {
            match_label_expressions: term.match_label_expressions.as_ref().map(|expressions| {
                expressions
                    .iter()
                    .map(|expression| TopologySelectorLabelRequirement {
                        key: if is_zone_label(&expression.key) {
                            key.to_owned()
                        } else {
                            expression.key.clone()
                        },
                        values: expression.values.clone(),
                    })
                    .collect()
            }),
        })
        .collect()
}

fn is_zone_label(key: &str) -> bool {
    key == wk::LABEL_TOPOLOGY_ZONE || key == wk::LABEL_FAILURE_DOMAIN_BETA_ZONE
}

/// The allowedTopologies of a class's `zone`/`zones` parameter.
pub(super) fn zone_selector(key: &str, zones: Vec<String>) -> Vec<TopologySelectorTerm> {
    vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: key.to_owned(),
            values: zones,
        }]),
    }]
}

fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|spec| spec.node_affinity.as_ref())
        .and_then(|affinity| affinity.required.as_ref())
        .map_or(&[], |required| required.node_selector_terms.as_slice())
}

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    pv.spec
        .as_mut()?
        .node_affinity
        .as_mut()?
        .required
        .as_mut()
        .map(|required| &mut required.node_selector_terms)
}

fn expressions(term: &NodeSelectorTerm) -> &[NodeSelectorRequirement] {
    term.match_expressions.as_deref().unwrap_or(&[])
}

fn affinity_has_key(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv)
        .iter()
        .flat_map(expressions)
        .any(|expression| expression.key == key)
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a String> {
    pv.metadata.labels.as_ref()?.get(key)
}

/// The (zone, region) label keys the PV uses (see the module docs).
fn zone_and_region_labels(pv: &PersistentVolume) -> (&'static str, &'static str) {
    const GA: (&str, &str) = (wk::LABEL_TOPOLOGY_ZONE, wk::LABEL_TOPOLOGY_REGION);
    const BETA: (&str, &str) = (
        wk::LABEL_FAILURE_DOMAIN_BETA_ZONE,
        wk::LABEL_FAILURE_DOMAIN_BETA_REGION,
    );
    if affinity_has_key(pv, GA.0) {
        GA
    } else if affinity_has_key(pv, BETA.0) {
        BETA
    } else if label(pv, GA.0).is_some() {
        GA
    } else if label(pv, BETA.0).is_some() {
        BETA
    } else {
        GA
    }
}

/// Every value of `key` in the node affinity, deduplicated and sorted. Zones
/// of several terms collapse into one list, meant as OR.
fn affinity_values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    terms(pv)
        .iter()
        .flat_map(expressions)
        .filter(|expression| expression.key == key)
        .flat_map(|expression| expression.values.iter().flatten().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Renames `old` to `new` in every expression of the node affinity (an
/// expression with `new` already present is not merged, as upstream).
fn rename_key(pv: &mut PersistentVolume, old: &str, new: &str) {
    let Some(terms) = terms_mut(pv) else {
        return;
    };
    for expression in terms
        .iter_mut()
        .flat_map(|term| term.match_expressions.iter_mut().flatten())
    {
        if expression.key == old {
            expression.key = new.to_owned();
        }
    }
}

/// Adds `key In zones` to every term (creating the affinity and one term if
/// needed); blank zones are dropped, and without any zone nothing changes.
fn add_to_every_term(pv: &mut PersistentVolume, key: &str, zones: &[&str]) {
    let zones: BTreeSet<String> = zones
        .iter()
        .map(|zone| zone.trim())
        .filter(|zone| !zone.is_empty())
        .map(str::to_owned)
        .collect();
    if zones.is_empty() {
        return;
    }
    let spec = pv.spec.get_or_insert_with(Default::default);
    let required = spec
        .node_affinity
        .get_or_insert_with(VolumeNodeAffinity::default)
        .required
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(NodeSelectorRequirement {
                key: key.to_owned(),
                operator: "In".to_owned(),
                values: Some(zones.iter().cloned().collect()),
            });
    }
}

fn set_label_if_absent(pv: &mut PersistentVolume, key: &str, value: String) {
    pv.metadata
        .labels
        .get_or_insert_with(Default::default)
        .entry(key.to_owned())
        .or_insert(value);
}

/// In-tree → CSI (AWS EBS, GCE PD, Cinder): the zone key of the node affinity
/// becomes the driver's; without one, the zone label (`a__b` for several
/// zones) becomes a node affinity term with the driver's key. A beta region
/// key becomes the GA one, so that nodes with only GA labels still match.
pub(super) fn in_tree_to_csi(pv: &mut PersistentVolume, csi_zone_key: &str) {
    let (zone_label, region_label) = zone_and_region_labels(pv);
    if !affinity_values(pv, zone_label).is_empty() {
        rename_key(pv, zone_label, csi_zone_key);
    } else if let Some(zones) = label(pv, zone_label).cloned() {
        let zones: Vec<&str> = zones.split(wk::LABEL_MULTI_ZONE_DELIMITER).collect();
        add_to_every_term(pv, csi_zone_key, &zones);
    }
    if region_label == wk::LABEL_FAILURE_DOMAIN_BETA_REGION
        && !affinity_values(pv, region_label).is_empty()
    {
        rename_key(pv, region_label, wk::LABEL_TOPOLOGY_REGION);
    }
}

/// In-tree → CSI for vSphere, which has a CSI key for the region too. Its
/// labels hold one zone and one region each.
pub(super) fn vsphere_in_tree_to_csi(
    pv: &mut PersistentVolume,
    csi_zone_key: &str,
    csi_region_key: &str,
) {
    let (zone_label, region_label) = zone_and_region_labels(pv);
    for (in_tree, csi) in [(zone_label, csi_zone_key), (region_label, csi_region_key)] {
        if !affinity_values(pv, in_tree).is_empty() {
            rename_key(pv, in_tree, csi);
        } else if let Some(value) = label(pv, in_tree).cloned() {
            add_to_every_term(pv, csi, &[value.as_str()]);
        }
    }
}

/// CSI → in-tree (AWS EBS, GCE PD, Cinder): the driver's zone key becomes the
/// Kubernetes zone label; with `region_of` (AWS, GCE), every term without a
/// region gets the region of its zones — a term without any zone fails,
/// since the region cannot be known; finally the zone label (`a__b`) and the
/// single region label are set on the PV unless present.
pub(super) fn csi_to_in_tree(
    pv: &mut PersistentVolume,
    csi_zone_key: &str,
    region_of: Option<RegionOfZones>,
) -> Result<(), TopologyTranslationError> {
    let (zone_label, _) = zone_and_region_labels(pv);
    rename_key(pv, csi_zone_key, zone_label);
    if let Some(region_of) = region_of {
        add_regions(pv, region_of)?;
    }
    let zones = affinity_values(pv, zone_label);
    if !zones.is_empty() {
        set_label_if_absent(pv, zone_label, zones.join(wk::LABEL_MULTI_ZONE_DELIMITER));
    }
    Ok(())
}

fn add_regions(
    pv: &mut PersistentVolume,
    region_of: RegionOfZones,
) -> Result<(), TopologyTranslationError> {
    let (zone_label, region_label) = zone_and_region_labels(pv);
    let Some(terms) = terms_mut(pv) else {
        return Ok(());
    };
    for term in terms.iter_mut() {
        let expressions = term.match_expressions.get_or_insert_with(Vec::new);
        if expressions.iter().any(|e| e.key == region_label) {
            continue;
        }
        let zones: Vec<String> = expressions
            .iter()
            .filter(|e| e.key == zone_label)
            .flat_map(|e| e.values.iter().flatten().cloned())
            .collect();
        if zones.is_empty() {
            return Err(TopologyTranslationError::TermWithoutZone {
                zone_key: zone_label.to_owned(),
                keys: expressions.iter().map(|e| e.key.clone()).collect(),
            });
        }
        expressions.push(NodeSelectorRequirement {
            key: region_label.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![region_of(&zones)?]),
        });
    }
    if let [region] = affinity_values(pv, region_label).as_slice() {
        set_label_if_absent(pv, region_label, region.clone());
    }
    Ok(())
}

/// CSI → in-tree for vSphere: both driver keys become the Kubernetes labels,
/// and the PV is labelled with the first zone and region (vSphere volumes
/// live in one zone).
pub(super) fn vsphere_csi_to_in_tree(
    pv: &mut PersistentVolume,
    csi_zone_key: &str,
    csi_region_key: &str,
) {
    let (zone_label, region_label) = zone_and_region_labels(pv);
    rename_key(pv, csi_zone_key, zone_label);
    rename_key(pv, csi_region_key, region_label);
    for key in [zone_label, region_label] {
        if let Some(first) = affinity_values(pv, key).into_iter().next() {
            set_label_if_absent(pv, key, first);
        }
    }
}

/// Azure Disk: zones named by a plain number ("0", "1") are the fault
/// domains of regions without availability zones, which the CSI driver calls
/// zone "".
pub(super) fn azure_unzoned_to_empty(
    terms: Vec<TopologySelectorTerm>,
    key: &str,
) -> Vec<TopologySelectorTerm> {
    terms
        .into_iter()
        .map(|mut term| {
            for expression in term.match_label_expressions.iter_mut().flatten() {
                if expression.key != key {
                    continue;
                }
                for value in &mut expression.values {
                    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
                        value.clear();
                    }
                }
            }
            term
        })
        .collect()
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
