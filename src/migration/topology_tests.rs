use super::*;
use crate::migration::handles::{aws_region, gce_region};
use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

const GA_ZONE: &str = "topology.kubernetes.io/zone";
const GA_REGION: &str = "topology.kubernetes.io/region";
const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
const EBS_ZONE: &str = "topology.ebs.csi.aws.com/zone";
const VSPHERE_ZONE: &str = "topology.csi.vmware.com/zone";
const VSPHERE_REGION: &str = "topology.csi.vmware.com/region";

type Expressions<'a> = &'a [(&'a str, &'a [&'a str])];

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    })
}

/// A PV with these labels and one node selector term per entry of `terms`.
fn pv(label_pairs: &[(&str, &str)], terms: &[Expressions<'_>]) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv".to_owned()),
            labels: labels(label_pairs),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            node_affinity: (!terms.is_empty()).then(|| VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: terms
                        .iter()
                        .map(|expressions| NodeSelectorTerm {
                            match_expressions: Some(
                                expressions
                                    .iter()
                                    .map(|(key, values)| NodeSelectorRequirement {
                                        key: (*key).to_owned(),
                                        operator: "In".to_owned(),
                                        values: Some(
                                            values.iter().map(|v| (*v).to_owned()).collect(),
                                        ),
                                    })
                                    .collect(),
                            ),
                            match_fields: None,
                        })
                        .collect(),
                }),
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

#[test]
fn in_tree_to_csi_topology() {
    let cases: Vec<(&str, PersistentVolume, PersistentVolume)> = vec![
        (
            "GA zone in the affinity",
            pv(&[], &[&[(GA_ZONE, &["us-east-1a"])]]),
            pv(&[], &[&[(EBS_ZONE, &["us-east-1a"])]]),
        ),
        (
            "beta zone and region in the affinity: region becomes GA",
            pv(
                &[],
                &[&[(BETA_ZONE, &["us-east-1a"]), (BETA_REGION, &["us-east-1"])]],
            ),
            pv(
                &[],
                &[&[(EBS_ZONE, &["us-east-1a"]), (GA_REGION, &["us-east-1"])]],
            ),
        ),
        (
            "GA region stays",
            pv(
                &[],
                &[&[(GA_ZONE, &["us-east-1a"]), (GA_REGION, &["us-east-1"])]],
            ),
            pv(
                &[],
                &[&[(EBS_ZONE, &["us-east-1a"]), (GA_REGION, &["us-east-1"])]],
            ),
        ),
        (
            "zone labels without affinity: a term from the label",
            pv(
                &[(BETA_ZONE, "us-east-1a"), (BETA_REGION, "us-east-1")],
                &[],
            ),
            pv(
                &[(BETA_ZONE, "us-east-1a"), (BETA_REGION, "us-east-1")],
                &[&[(EBS_ZONE, &["us-east-1a"])]],
            ),
        ),
        (
            "multi-zone label, blank zones dropped, sorted",
            pv(&[(GA_ZONE, "b__a__ __a")], &[]),
            pv(&[(GA_ZONE, "b__a__ __a")], &[&[(EBS_ZONE, &["a", "b"])]]),
        ),
        (
            "affinity wins over the label",
            pv(&[(GA_ZONE, "us-east-1a")], &[&[(GA_ZONE, &["us-east-2a"])]]),
            pv(
                &[(GA_ZONE, "us-east-1a")],
                &[&[(EBS_ZONE, &["us-east-2a"])]],
            ),
        ),
        (
            "label zone added to every term lacking a zone",
            pv(
                &[(GA_ZONE, "us-east-1a")],
                &[
                    &[("example.com/rack", &["r1"])],
                    &[("example.com/rack", &["r2"])],
                ],
            ),
            pv(
                &[(GA_ZONE, "us-east-1a")],
                &[
                    &[("example.com/rack", &["r1"]), (EBS_ZONE, &["us-east-1a"])],
                    &[("example.com/rack", &["r2"]), (EBS_ZONE, &["us-east-1a"])],
                ],
            ),
        ),
        (
            "a blank label adds nothing",
            pv(&[(GA_ZONE, "")], &[]),
            pv(&[(GA_ZONE, "")], &[]),
        ),
        ("no topology at all", pv(&[], &[]), pv(&[], &[])),
        (
            "multiple terms",
            pv(&[], &[&[(GA_ZONE, &["a"])], &[(GA_ZONE, &["b"])]]),
            pv(&[], &[&[(EBS_ZONE, &["a"])], &[(EBS_ZONE, &["b"])]]),
        ),
    ];
    for (name, mut input, expected) in cases {
        in_tree_to_csi(&mut input, EBS_ZONE);
        assert_eq!(input, expected, "{name}");
    }
}

#[test]
fn csi_to_in_tree_topology() {
    type Case = (
        &'static str,
        PersistentVolume,
        Option<RegionOfZones>,
        Result<PersistentVolume, TopologyTranslationError>,
    );
    let aws: Option<RegionOfZones> = Some(aws_region);
    let cases: Vec<Case> = vec![
        (
            "driver zone: GA zone, region term and labels",
            pv(&[], &[&[(EBS_ZONE, &["us-east-1a"])]]),
            aws,
            Ok(pv(
                &[(GA_REGION, "us-east-1"), (GA_ZONE, "us-east-1a")],
                &[&[(GA_ZONE, &["us-east-1a"]), (GA_REGION, &["us-east-1"])]],
            )),
        ),
        (
            "the driver also answered with the GA key",
            pv(
                &[],
                &[&[(GA_ZONE, &["us-east-1a"]), (EBS_ZONE, &["us-east-1a"])]],
            ),
            aws,
            Ok(pv(
                &[(GA_REGION, "us-east-1"), (GA_ZONE, "us-east-1a")],
                &[&[
                    (GA_ZONE, &["us-east-1a"]),
                    (GA_ZONE, &["us-east-1a"]),
                    (GA_REGION, &["us-east-1"]),
                ]],
            )),
        ),
        (
            "the PV's beta label decides the keys",
            pv(
                &[(BETA_ZONE, "us-east-1a")],
                &[&[(EBS_ZONE, &["us-east-1a"])]],
            ),
            aws,
            Ok(pv(
                &[(BETA_REGION, "us-east-1"), (BETA_ZONE, "us-east-1a")],
                &[&[(BETA_ZONE, &["us-east-1a"]), (BETA_REGION, &["us-east-1"])]],
            )),
        ),
        (
            "several terms: zones joined in the label, one region",
            pv(
                &[],
                &[
                    &[(EBS_ZONE, &["us-east-1b"])],
                    &[(EBS_ZONE, &["us-east-1a"])],
                ],
            ),
            aws,
            Ok(pv(
                &[
                    (GA_REGION, "us-east-1"),
                    (GA_ZONE, "us-east-1a__us-east-1b"),
                ],
                &[
                    &[(GA_ZONE, &["us-east-1b"]), (GA_REGION, &["us-east-1"])],
                    &[(GA_ZONE, &["us-east-1a"]), (GA_REGION, &["us-east-1"])],
                ],
            )),
        ),
        (
            "terms in two regions: no region label",
            pv(
                &[],
                &[
                    &[(EBS_ZONE, &["us-east-1a"])],
                    &[(EBS_ZONE, &["us-west-2a"])],
                ],
            ),
            aws,
            Ok(pv(
                &[(GA_ZONE, "us-east-1a__us-west-2a")],
                &[
                    &[(GA_ZONE, &["us-east-1a"]), (GA_REGION, &["us-east-1"])],
                    &[(GA_ZONE, &["us-west-2a"]), (GA_REGION, &["us-west-2"])],
                ],
            )),
        ),
        (
            "a term with a region already keeps it",
            pv(
                &[],
                &[&[(EBS_ZONE, &["us-east-1a"]), (GA_REGION, &["custom"])]],
            ),
            aws,
            Ok(pv(
                &[(GA_REGION, "custom"), (GA_ZONE, "us-east-1a")],
                &[&[(GA_ZONE, &["us-east-1a"]), (GA_REGION, &["custom"])]],
            )),
        ),
        (
            "other keys pass next to the zone",
            pv(
                &[],
                &[&[
                    ("topology.ebs.csi.aws.com/outpost-id", &["op-1"]),
                    (EBS_ZONE, &["us-east-1a"]),
                ]],
            ),
            aws,
            Ok(pv(
                &[(GA_REGION, "us-east-1"), (GA_ZONE, "us-east-1a")],
                &[&[
                    ("topology.ebs.csi.aws.com/outpost-id", &["op-1"]),
                    (GA_ZONE, &["us-east-1a"]),
                    (GA_REGION, &["us-east-1"]),
                ]],
            )),
        ),
        (
            "a key the translation does not know: no zone, no region",
            pv(&[], &[&[("topology.hostpath.csi/node", &["node-1"])]]),
            aws,
            Err(TopologyTranslationError::TermWithoutZone {
                zone_key: GA_ZONE.to_owned(),
                keys: vec!["topology.hostpath.csi/node".to_owned()],
            }),
        ),
        (
            "an unknown key in one term of two",
            pv(
                &[],
                &[
                    &[(EBS_ZONE, &["us-east-1a"])],
                    &[("example.com/rack", &["r1"])],
                ],
            ),
            aws,
            Err(TopologyTranslationError::TermWithoutZone {
                zone_key: GA_ZONE.to_owned(),
                keys: vec!["example.com/rack".to_owned()],
            }),
        ),
        (
            "a zone AWS cannot read",
            pv(&[], &[&[(EBS_ZONE, &["moon"])]]),
            aws,
            Err(TopologyTranslationError::Region(
                RegionError::UnexpectedZone {
                    plugin: crate::migration::InTreePlugin::AwsEbs,
                    zone: "moon".to_owned(),
                },
            )),
        ),
        (
            "GCE zones of one term in two regions",
            pv(&[], &[&[(EBS_ZONE, &["us-central1-a", "europe-west1-b"])]]),
            Some(gce_region),
            Err(TopologyTranslationError::Region(RegionError::NotOneRegion(
                vec!["europe-west1".to_owned(), "us-central1".to_owned()],
            ))),
        ),
        (
            "without a region parser (Cinder) unknown keys pass",
            pv(
                &[],
                &[&[(EBS_ZONE, &["nova"]), ("example.com/rack", &["r1"])]],
            ),
            None,
            Ok(pv(
                &[(GA_ZONE, "nova")],
                &[&[(GA_ZONE, &["nova"]), ("example.com/rack", &["r1"])]],
            )),
        ),
        ("no topology", pv(&[], &[]), aws, Ok(pv(&[], &[]))),
    ];
    for (name, mut input, region_of, expected) in cases {
        let result = csi_to_in_tree(&mut input, EBS_ZONE, region_of).map(|()| input);
        assert_eq!(result, expected, "{name}");
    }
}

#[test]
fn vsphere_topology_both_ways() {
    let in_tree = pv(
        &[(GA_ZONE, "zone-a"), (GA_REGION, "region-1")],
        &[&[(GA_ZONE, &["zone-a"]), (GA_REGION, &["region-1"])]],
    );
    let csi = pv(
        &[(GA_ZONE, "zone-a"), (GA_REGION, "region-1")],
        &[&[(VSPHERE_ZONE, &["zone-a"]), (VSPHERE_REGION, &["region-1"])]],
    );
    let mut translated = in_tree.clone();
    vsphere_in_tree_to_csi(&mut translated, VSPHERE_ZONE, VSPHERE_REGION);
    assert_eq!(translated, csi);
    vsphere_csi_to_in_tree(&mut translated, VSPHERE_ZONE, VSPHERE_REGION);
    assert_eq!(translated, in_tree, "round trip");

    // Labels only: terms from the labels (one value each, not split).
    let mut from_labels = pv(&[(BETA_ZONE, "zone-a"), (BETA_REGION, "region-1")], &[]);
    vsphere_in_tree_to_csi(&mut from_labels, VSPHERE_ZONE, VSPHERE_REGION);
    assert_eq!(
        from_labels,
        pv(
            &[(BETA_ZONE, "zone-a"), (BETA_REGION, "region-1")],
            &[&[(VSPHERE_ZONE, &["zone-a"]), (VSPHERE_REGION, &["region-1"])]],
        )
    );

    // A fresh CSI PV: GA keys, the first value of each as the labels.
    let mut fresh = pv(
        &[],
        &[
            &[(VSPHERE_ZONE, &["zone-b"]), (VSPHERE_REGION, &["region-1"])],
            &[(VSPHERE_ZONE, &["zone-a"]), (VSPHERE_REGION, &["region-1"])],
        ],
    );
    vsphere_csi_to_in_tree(&mut fresh, VSPHERE_ZONE, VSPHERE_REGION);
    assert_eq!(
        fresh,
        pv(
            &[(GA_ZONE, "zone-a"), (GA_REGION, "region-1")],
            &[
                &[(GA_ZONE, &["zone-b"]), (GA_REGION, &["region-1"])],
                &[(GA_ZONE, &["zone-a"]), (GA_REGION, &["region-1"])],
            ],
        )
    );
}

#[test]
fn allowed_topologies() {
    let term = crate::provision::fixtures::topology_term;
    let empty_term = TopologySelectorTerm {
        match_label_expressions: None,
    };
    assert_eq!(
        translate_allowed_topologies(
            &[
                term(&[(GA_ZONE, &["a", "b"]), (GA_REGION, &["r"])]),
                term(&[(BETA_ZONE, &["c"])]),
                empty_term.clone(),
            ],
            EBS_ZONE
        ),
        vec![
            term(&[(EBS_ZONE, &["a", "b"]), (GA_REGION, &["r"])]),
            term(&[(EBS_ZONE, &["c"])]),
            empty_term,
        ]
    );
    assert_eq!(translate_allowed_topologies(&[], EBS_ZONE), vec![]);
    assert_eq!(
        azure_unzoned_to_empty(
            vec![term(&[
                (
                    "topology.disk.csi.azure.com/zone",
                    &["0", "12", "eastus-1", ""]
                ),
                (GA_REGION, &["1"]),
            ])],
            "topology.disk.csi.azure.com/zone"
        ),
        vec![term(&[
            (
                "topology.disk.csi.azure.com/zone",
                &["", "", "eastus-1", ""]
            ),
            (GA_REGION, &["1"]),
        ])]
    );
}
