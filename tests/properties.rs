//! Property tests of every parser that reads outside input (issue 16 item
//! 3): feature gates, Go durations, quantities (the sidecar's and the
//! shared one of the driver and csi-sanity), StorageClass secret templates
//! and CSI socket addresses. Each must never panic on any input, and must
//! agree with its own formatter.

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
        let _ = parse_bytes(&input);
        let _ = csi_proto::quantity::parse_quantity(&input);
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
        let annotations = BTreeMap::from([("a".to_owned(), annotation)]);
        let context = TemplateContext {
            pv_name: "pvc-1",
            pvc_name: &pvc_name,
            pvc_namespace: "ns",
            pvc_annotations: Some(&annotations),
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
