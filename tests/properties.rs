//! Property tests of every parser that reads outside input: feature gates,
//! Go durations, quantities (the sidecar's and the shared one of the driver
//! and csi-sanity), StorageClass secret templates, CSI socket addresses and
//! the releaser's selection by controller id. Each must never panic on any
//! input, and must agree with its own formatter or its specification.

use std::collections::BTreeMap;
use std::time::Duration;

use csi_provisioner::duration::{format_go_duration, parse_go_duration};
use csi_provisioner::features::{Feature, FeatureGates};
use csi_provisioner::provision::quantity::{bytes_to_quantity, parse_bytes, quantity_bytes};
use csi_provisioner::provision::{SecretKind, TemplateContext, resolve_secret_ref};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn durations_never_panic(input in ".{0,40}") {
        let _ = parse_go_duration(&input);
    }

    #[test]
    fn durations_round_trip_through_the_go_format(nanos in 0u64..=(1u64 << 52)) {
        let d = Duration::from_nanos(nanos);
        let text = format_go_duration(d);
        prop_assert_eq!(parse_go_duration(&text), Ok(d), "{}", text);
    }

    #[test]
    fn summed_terms_add_up(h in 0u64..100, m in 0u64..600, s in 0u64..600, ms in 0u64..5000) {
        let text = format!("{h}h{m}m{s}s{ms}ms");
        let want = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(ms);
        prop_assert_eq!(parse_go_duration(&text), Ok(want));
    }

    #[test]
    fn feature_gates_never_panic(input in ".{0,80}") {
        let _ = FeatureGates::default().apply(&input);
    }

    #[test]
    fn feature_gates_set_exactly_what_is_written(
        chosen in proptest::collection::vec((0usize..Feature::ALL.len(), any::<bool>()), 0..8),
        spacing in proptest::collection::vec(0usize..3, 8),
    ) {
        let mut spec = String::new();
        let mut want = BTreeMap::new();
        for (i, (index, value)) in chosen.iter().enumerate() {
            let feature = Feature::ALL[*index];
            want.insert(feature.name(), *value);
            let pad = " ".repeat(spacing[i % spacing.len()]);
            let value = if *value { "true" } else { "false" };
            spec.push_str(&format!("{pad}{}={value}{pad},", feature.name()));
        }
        let mut gates = FeatureGates::default();
        prop_assert!(gates.apply(&spec).is_ok(), "{}", spec);
        for feature in Feature::ALL {
            let expected = want.get(feature.name()).copied().unwrap_or(feature.default_enabled());
            prop_assert_eq!(gates.enabled(feature), expected, "{} in {}", feature.name(), spec);
        }
    }

    #[test]
    fn quantities_never_panic(input in ".{0,30}") {
        // The one grammar, through both result types and roundings.
        let _ = parse_bytes(&input);
        let _ = csi_proto::quantity::parse_quantity_with(&input, csi_proto::quantity::Rounding::Exact);
    }

    #[test]
    fn the_sidecars_quantities_round_trip(bytes in 0i64..=i64::MAX) {
        let quantity = bytes_to_quantity(bytes);
        prop_assert_eq!(quantity_bytes(&quantity), Ok(bytes), "{}", quantity.0);
    }

    #[test]
    fn binary_and_decimal_suffixes_scale(n in 0i64..(1 << 20)) {
        for (suffix, factor) in [("", 1i64), ("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("k", 1_000), ("M", 1_000_000), ("G", 1_000_000_000)] {
            let text = format!("{n}{suffix}");
            prop_assert_eq!(parse_bytes(&text), Ok(n * factor), "{}", text);
        }
    }

    #[test]
    fn the_shared_quantities_round_trip(bytes in 0u64..=(1u64 << 62)) {
        let text = csi_proto::quantity::format_quantity(bytes);
        prop_assert_eq!(csi_proto::quantity::parse_quantity(&text).ok(), Some(bytes), "{}", text);
    }

    #[test]
    fn secret_templates_never_panic(
        name in ".{0,40}",
        namespace in ".{0,40}",
        pvc_name in "[a-z0-9-]{1,20}",
        annotation in ".{0,20}",
    ) {
        let params = BTreeMap::from([
            ("csi.storage.k8s.io/provisioner-secret-name".to_owned(), name),
            ("csi.storage.k8s.io/provisioner-secret-namespace".to_owned(), namespace),
        ]);
        let annotations = csi_provisioner::projection::Map::from([("a".to_owned(), annotation)]);
        let context = TemplateContext {
            pv_name: "pvc-1",
            pvc_name: &pvc_name,
            pvc_namespace: "ns",
            pvc_annotations: Some(&annotations),
            pvc_labels: None,
        };
        let _ = resolve_secret_ref(SecretKind::Provisioner, &params, &context);
    }

    #[test]
    fn secret_templates_expand_what_they_name(pvc_name in "[a-z][a-z0-9-]{0,18}[a-z0-9]", ns in "[a-z][a-z0-9]{0,10}") {
        let params = BTreeMap::from([
            ("csi.storage.k8s.io/provisioner-secret-name".to_owned(), "${pvc.name}-creds".to_owned()),
            ("csi.storage.k8s.io/provisioner-secret-namespace".to_owned(), "${pvc.namespace}".to_owned()),
        ]);
        let context = TemplateContext {
            pv_name: "pvc-1",
            pvc_name: &pvc_name,
            pvc_namespace: &ns,
            pvc_annotations: None,
            pvc_labels: None,
        };
        let found = resolve_secret_ref(SecretKind::Provisioner, &params, &context);
        let found = found.ok().flatten();
        prop_assert_eq!(found.as_ref().map(|s| s.name.clone()), Some(format!("{pvc_name}-creds")));
        prop_assert_eq!(found.map(|s| s.namespace), Some(ns));
    }

    #[test]
    fn socket_addresses_never_panic(input in ".{0,60}") {
        let _ = csi_proto::transport::parse_unix_address(&input);
    }

    #[test]
    fn every_spelling_of_a_socket_names_the_same_path(path in "(/[a-zA-Z0-9._-]{1,12}){1,5}") {
        for address in [path.clone(), format!("unix:{path}"), format!("unix://{path}")] {
            prop_assert_eq!(
                csi_proto::transport::parse_unix_address(&address).ok(),
                Some(std::path::PathBuf::from(&path)),
                "{}", address
            );
        }
        prop_assert!(csi_proto::transport::parse_unix_address(&path[1..]).is_err(), "relative");
    }
}

/// The releaser's selection of PVs: the managed-by label
/// and the class annotation are matched as equality selectors on the
/// controller id. Whatever the labels, annotations, phase and policy, a PV
/// is released only when it is ours, selected for our id, Released with a
/// claimRef and not of policy Delete; and nothing panics.
mod releaser_selection {
    use std::collections::BTreeMap;

    use csi_provisioner::projection::PersistentVolume;
    use csi_provisioner::projection::StorageClass;
    use csi_provisioner::provision::ProvisionerConfig;
    use csi_provisioner::releaser::decide::decide;
    use csi_provisioner::releaser::{ReleaserConfig, Verdict};
    use proptest::prelude::*;
    use serde_json::json;

    const LABEL: &str = "reclaimable-pv-releaser.kubernetes.io/managed-by";
    const CLASS_ANNOTATION: &str = "reclaimable-pv-releaser.kubernetes.io/controller-id";
    const DRIVER: &str = "hostpath.csi.k8s.io";

    fn id_like() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("team-a".to_owned()),
            Just("team-b".to_owned()),
            Just("Team-A".to_owned()),
            Just(String::new()),
            Just(" team-a".to_owned()),
            ".{0,12}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn only_pvs_selected_for_our_id_are_released(
            label in proptest::option::of(id_like()),
            class_id in proptest::option::of(id_like()),
            class_matches in any::<bool>(),
            ours in any::<bool>(),
            phase in prop_oneof![Just("Released"), Just("Bound"), Just("Available"), Just("")],
            policy in prop_oneof![Just("Retain"), Just("Delete"), Just("Recycle")],
            claim_ref in any::<bool>(),
            extra_labels in proptest::collection::btree_map("[a-z./-]{1,20}", ".{0,8}", 0..3),
        ) {
            let mut labels: BTreeMap<String, String> = extra_labels;
            if let Some(label) = &label {
                labels.insert(LABEL.to_owned(), label.clone());
            }
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": "pv", "resourceVersion": "1", "labels": labels},
                "spec": {
                    "storageClassName": "gold",
                    "persistentVolumeReclaimPolicy": policy,
                    "csi": {"driver": if ours { DRIVER } else { "other.csi" }, "volumeHandle": "h"},
                    "claimRef": if claim_ref { json!({"namespace": "ns", "name": "c", "uid": "u"}) } else { json!(null) },
                },
                "status": {"phase": phase},
            })).expect("pv");
            let mut annotations = BTreeMap::new();
            if let Some(id) = &class_id {
                annotations.insert(CLASS_ANNOTATION.to_owned(), id.clone());
            }
            let class: StorageClass = serde_json::from_value(json!({
                "metadata": {"name": if class_matches { "gold" } else { "silver" }, "annotations": annotations},
                "provisioner": DRIVER,
            })).expect("class");
            let config = ReleaserConfig {
                controller_id: "team-a".to_owned(),
                automatic_association: true,
                driver: ProvisionerConfig::with_defaults(DRIVER),
            };
            let verdict = decide(&pv, Some(&class), None, &config);
            let selected = match label.as_deref() {
                Some(l) => l == "team-a",
                None => class_matches && class_id.as_deref() == Some("team-a"),
            };
            if let Verdict::Release { .. } = verdict {
                prop_assert!(ours && selected && phase == "Released" && claim_ref && policy != "Delete",
                    "released: label {:?} class {:?}/{} phase {} policy {}", label, class_id, class_matches, phase, policy);
            } else {
                prop_assert!(!(ours && selected && phase == "Released" && claim_ref && policy != "Delete"),
                    "not released ({:?}): label {:?} class {:?}/{}", verdict, label, class_id, class_matches);
            }
        }
    }
}
