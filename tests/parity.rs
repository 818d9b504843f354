//! Side by side with the upstream Go `csi-provisioner` on a real cluster:
//! the same claims of the same classes, against the same driver, one image
//! after the other, each as a user bound to `deploy/`'s rules with the same
//! flags. What each writes (PVs, the events of claims and PVs and how many
//! times each reason was said, every volume either left on the backend
//! after provisioning and after deletion) must be the same, up to names,
//! uids, times and volume ids, and up to the differences the README lists
//! (and the retry counts of [`AT_LEAST_ONCE`]); and each run must keep the
//! harness's invariant (every volume of the run has its PV, every PV its
//! volume) after provisioning and after deletion. Real cluster only (needs
//! the upstream binary of `../shared/k8s`). Snapshot restores are compared too: the snapshot CRDs,
//! the upstream snapshot-controller and a csi-snapshotter next to the
//! driver take the snapshots both images restore.

mod support;
// The real-node test (issue 34) shares this binary: see its module docs.
#[path = "parity/real_node.rs"]
mod real_node;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_hostpath::faults::Fault;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::sidecar::Sidecar;
use support::snapshots::{Hostpathplugin, PROVISIONER_SOURCE_FINALIZER, SNAPSHOT_API};
use support::{Backend, ClusterConfig, Env};

e2e_real!(ClusterConfig::standard();
    the_same_claims_give_the_same_objects_as_the_go_sidecar,
    with_other_naming_and_topology_flags_too,
    without_the_topology_gate,
    in_node_deployment,
    against_the_upstream_hostpath_driver,
    capacity_objects_of_the_go_image_are_taken_over,
);

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Image {
    Go,
    Rust,
}

impl Image {
    fn short(self) -> &'static str {
        match self {
            Image::Go => "go",
            Image::Rust => "rs",
        }
    }
}

/// The flags both images run with beside the harness's
/// ([`support::sidecar::HARNESS_FLAGS`], which both take too): the
/// metadata parameters, so the driver's records tell the runs apart.
const FLAGS: &[&str] = &["--extra-create-metadata", "--v=5"];

/// Claims that are provisioned, and how.
fn good_claims(env: &Env) -> Vec<(&'static str, &'static str, &'static str, Value)> {
    vec![
        ("plain", "plain", "5Mi", json!({})),
        (
            "full",
            "full",
            "7Mi",
            json!({"metadata": {"annotations": {"team": "blue"}},
                   "spec": {"accessModes": ["ReadWriteOncePod"]}}),
        ),
        (
            "block",
            "plain",
            "3Mi",
            json!({"spec": {"volumeMode": "Block"}}),
        ),
        (
            "late",
            "late",
            "4Mi",
            json!({"metadata": {"annotations": {support::SELECTED_NODE: env.node}}}),
        ),
        // The Go image sends no limit (upstream #616): the driver records
        // what it was asked, so a limit sent by one image only shows.
        (
            "limited",
            "plain",
            "5Mi",
            json!({"spec": {"resources": {"limits": {"storage": "6Mi"}}}}),
        ),
    ]
}

/// Claims whose outcome is only compared: neither image may provision
/// them, and what each says (or not) must be the same.
fn other_claims(env: &Env) -> Vec<(&'static str, &'static str, &'static str, Value)> {
    vec![
        (
            "populated",
            "plain",
            "5Mi",
            json!({"spec": {"dataSourceRef": {"apiGroup": "example.com", "kind": "Sample", "name": "x"}}}),
        ),
        // The driver does not report MODIFY_VOLUME: refused, as upstream.
        (
            "gold",
            "plain",
            "5Mi",
            json!({"spec": {"volumeAttributesClassName": env.class("gold")}}),
        ),
        (
            "novac",
            "plain",
            "5Mi",
            json!({"spec": {"volumeAttributesClassName": env.class("absent")}}),
        ),
    ]
}

/// Claims that cannot be provisioned, and the reason of their event.
fn bad_claims() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    vec![
        ("toobig", "plain", "2Pi", json!({})),
        ("nosecret", "nosecret", "5Mi", json!({})),
        (
            "nosource",
            "plain",
            "5Mi",
            json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "absent"}}}),
        ),
        (
            "selector",
            "plain",
            "5Mi",
            json!({"spec": {"selector": {"matchLabels": {"disk": "fast"}}}}),
        ),
    ]
}

/// Snapshots (name, source claim) taken once the good claims are bound,
/// after a claim asked for the last one (see [`restore_claims`]).
const SNAPSHOTS: &[(&str, &str)] = &[
    ("snap-fs", "plain"),
    ("snap-block", "block"),
    ("snap-late", "plain"),
];

/// Claims restored from those snapshots: (name, class, size, extra).
/// `plain` is 5Mi, `block` 3Mi: same size, and larger. `nosnap` (last)
/// names a snapshot that does not exist yet: refused (upstream's message)
/// until it is taken. (Refused for ever, it would be retried every second
/// to the end, and its events with the other failing claims' would exceed
/// the Go image's client-side budget of 5 writes/s and delay the others'.)
fn restore_claims() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let from = |snapshot: &str| json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snapshot});
    vec![
        (
            "restore",
            "plain",
            "5Mi",
            json!({"spec": {"dataSource": from("snap-fs")}}),
        ),
        (
            "restore-block",
            "plain",
            "3Mi",
            json!({"spec": {"dataSource": from("snap-block"), "volumeMode": "Block"}}),
        ),
        (
            "restore-big",
            "plain",
            "9Mi",
            json!({"spec": {"dataSource": from("snap-fs")}}),
        ),
        (
            "nosnap",
            "plain",
            "5Mi",
            json!({"spec": {"dataSource": from("snap-late")}}),
        ),
    ]
}

/// Whether the image on `port` counted a failed restore
/// (`controller_persistentvolumeclaim_provision_failed_total` with source
/// `VolumeSnapshot`).
async fn restore_failed(port: u16) -> bool {
    let (_, metrics) = support::http_get(port, "/metrics").await;
    metrics.lines().any(|line| {
        line.starts_with("controller_persistentvolumeclaim_provision_failed_total{")
            && line.contains("source=\"VolumeSnapshot\"")
            && line
                .rsplit_once(' ')
                .and_then(|(_, v)| v.parse::<f64>().ok())
                .is_some_and(|v| v >= 1.0)
    })
}

/// What one image left behind, normalized.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    /// Claim name → its PV.
    pvs: BTreeMap<String, Value>,
    /// Claim name → its claim (metadata and spec the sidecar may touch).
    claims: BTreeMap<String, Value>,
    /// Claim name → distinct events written by the sidecar about the claim.
    claim_events: BTreeMap<String, BTreeSet<String>>,
    /// Claim name → distinct events about its PV.
    pv_events: BTreeMap<String, BTreeSet<String>>,
    /// `<claim> <reason>` → how many times the sidecar said it about the
    /// claim (the events' `count`s summed; see [`count_differences`]).
    claim_event_counts: BTreeMap<String, u64>,
    /// `<claim> <reason>` → the same about the claim's PV.
    pv_event_counts: BTreeMap<String, u64>,
    /// Every volume this run left on the backend once the claims were
    /// provisioned (not only those of the claims that got a PV: a bad
    /// claim's leaked volume shows here), by the claim whose volume name it
    /// has (`unclaimed <name>` for none) → the driver's record of it.
    volumes: BTreeMap<String, Value>,
    /// The same once every claim (and the Retain PVs, by hand) was deleted
    /// and the events settled: the Retain volumes, and nothing else.
    volumes_after_delete: BTreeMap<String, Value>,
    /// Claim name → what was left after the claim (and a Retain PV) was
    /// deleted: "pv" and/or "volume".
    left_after_delete: BTreeMap<String, BTreeSet<&'static str>>,
    /// The provisioning metrics at the end: series → value, see
    /// [`provisioning_metrics`].
    metrics: BTreeMap<String, String>,
    /// The whole `/metrics` answer at the end, for [`metric_shapes`].
    exposition: String,
    /// The image's log as it wrote it, for [`klog_text_lines`].
    raw_log: String,
    /// VolumeSnapshot name → its finalizers once its restores are bound
    /// (after waiting up to 30 s for the provisioner's to go).
    snapshot_finalizers: BTreeMap<String, Value>,
    /// VolumeSnapshot name → what was left after its restores and then the
    /// snapshot were deleted: "snapshot", "content" and/or "backend".
    snapshots_left: BTreeMap<String, BTreeSet<&'static str>>,
}

/// The series of the sidecar's own metric families (CSI calls, the
/// provisioning controller's counters). Retries and their failures count
/// by timing (and the Go image repeats DeleteVolume when the PV it would
/// delete is gone already), so most series are compared by name and
/// labels only; successful provisionings and `CreateVolume`s that answered
/// OK are one per volume, and compared by value too.
fn provisioning_metrics(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with("csi_sidecar_") || l.starts_with("controller_persistentvolume"))
        .filter(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or_default();
            // The Go image also counts there its retries of deleting a PV
            // that is gone already.
            !name.ends_with("_bucket")
                && !name.ends_with("_sum")
                && name != "controller_persistentvolume_delete_failed_total"
        })
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            // Label order is each library's own.
            let series = match series.split_once('{') {
                Some((name, labels)) => {
                    let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                    labels.sort_unstable();
                    format!("{name}{{{}}}", labels.join(","))
                }
                None => series.to_owned(),
            };
            let counted = series.starts_with("controller_persistentvolumeclaim_provision_total{")
                || (series.starts_with("csi_sidecar_operations_seconds_count{")
                    && series.contains("CreateVolume")
                    && series.contains("grpc_status_code=\"OK\""));
            let value = if counted { value } else { "any" };
            // Which classes saw a failure, or a deletion counted only when
            // the PV delete also succeeded at once, is timing: uncounted
            // series keep the names of their labels but only the values
            // that name the driver, the call and its code.
            let series = if counted {
                series
            } else {
                let (name, labels) = series.split_once('{').unwrap_or((&series, "}"));
                let labels: Vec<String> = labels
                    .trim_end_matches('}')
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(|label| match label.split_once('=') {
                        Some((key, _))
                            if !matches!(
                                key,
                                "driver_name" | "method_name" | "grpc_status_code" | "migrated"
                            ) =>
                        {
                            format!("{key}=*")
                        }
                        _ => label.to_owned(),
                    })
                    .collect();
                format!("{name}{{{}}}", labels.join(","))
            };
            Some((series, value.to_owned()))
        })
        .collect()
}

/// One shape of a metric family: its name, type, and the label names of
/// one of its series (sorted; without a histogram's `le` and a summary's
/// `quantile`).
type Shape = (String, String, Vec<String>);

/// The label names and values of a series' `{...}` block (values
/// unescaped enough to be compared: `\"` and `\\`).
fn label_pairs(block: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = block.trim_start_matches('{').trim_end_matches('}');
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| c)),
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        pairs.push((name.trim_start_matches(',').to_owned(), value));
        rest = &after[end..];
    }
    pairs
}

/// Every shape of every family of a Prometheus text exposition, with the
/// values of each family's series (a family declared without series has
/// one shape without labels).
fn metric_samples(text: &str) -> BTreeMap<Shape, Vec<f64>> {
    let types: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let family_of = |sample: &str| -> Option<(&str, &str)> {
        types
            .get_key_value(sample)
            .map(|(n, t)| (*n, *t))
            .or_else(|| {
                ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
                    let name = sample.strip_suffix(suffix)?;
                    types
                        .get_key_value(name)
                        .filter(|(_, t)| matches!(**t, "histogram" | "summary"))
                        .map(|(n, t)| (*n, *t))
                })
            })
    };
    let mut out: BTreeMap<Shape, Vec<f64>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        let (sample, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, label_pairs(labels)),
            None => (series, Vec::new()),
        };
        let Some((family, kind)) = family_of(sample) else {
            continue;
        };
        let mut names: Vec<String> = labels
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n != "le" && n != "quantile")
            .collect();
        names.sort();
        out.entry((family.to_owned(), kind.to_owned(), names))
            .or_default()
            .extend(value.parse::<f64>().ok());
    }
    for (family, kind) in types {
        if !out.keys().any(|(f, ..)| f == family) {
            out.insert((family.to_owned(), kind.to_owned(), Vec::new()), Vec::new());
        }
    }
    out
}

/// The shapes of [`metric_samples`].
fn metric_shapes(text: &str) -> BTreeSet<Shape> {
    metric_samples(text).into_keys().collect()
}

/// The `name` of every `workqueue_*` series.
fn workqueue_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| l.starts_with("workqueue_"))
        .filter_map(|l| l.split_once('{'))
        .flat_map(|(_, labels)| label_pairs(labels.rsplit_once('}').map_or(labels, |(l, _)| l)))
        .filter(|(name, _)| name == "name")
        .map(|(_, value)| value)
        .collect()
}

/// The Go image's families that ours does not have, by name prefix, each
/// with why (docs/design.md, "Deliberate differences from the Go image").
const NOT_OURS: &[(&str, &str)] = &[
    (
        "go_",
        "the Go runtime's own figures (goroutines, garbage collector, memstats); ours has process_*",
    ),
    (
        "apiserver_",
        "API-server metrics the Go image's libraries register; a sidecar never moves them (checked: all zero)",
    ),
    (
        "aggregator_",
        "API-server metrics the Go image's libraries register; a sidecar never moves them (checked: all zero)",
    ),
    (
        "registered_metrics_total",
        "component-base's count of its own registrations",
    ),
    (
        "disabled_metrics_total",
        "component-base's count of metrics turned off by its flags, which ours does not have",
    ),
    (
        "hidden_metrics_total",
        "component-base's count of deprecated metrics hidden, which ours does not have",
    ),
    (
        "cardinality_enforcement_unexpected_categorizations_total",
        "component-base's label-cardinality limits, which ours does not have",
    ),
];

/// Families whose series appear only once something happens that the two
/// images do not both do in a run, each with why: compared only when both
/// have them.
const ONLY_WHEN_IT_HAPPENS: &[(&str, &str)] = &[
    (
        "controller_persistentvolume_delete_failed_total",
        "the Go image also counts its retries of deleting a PV that is gone already",
    ),
    (
        "leader_election_slowpath_total",
        "client-go's counter appears at a renewal after a failed write from its last copy of the \
         Lease, ours at a renewal round after a failed one (docs/design.md); neither happens in a \
         healthy run",
    ),
];

/// The Go image's work queues that ours does not have, each with why.
const NOT_OUR_QUEUES: &[(&str, &str)] = &[(
    "DynamicClientCertificate",
    "client-go's reload of a kubeconfig's client certificate files (only with such a kubeconfig, \
     never in-cluster); ours reads them once (docs/design.md)",
)];

/// Compares the shapes of two expositions: every shape of the Go image's
/// (but [`NOT_OURS`]) must be one of ours, and every `workqueue_*` name
/// too; what ours has beyond is printed. The excluded API-server families
/// of the Go image must all be zero, as their reason says.
fn compare_metric_shapes(what: &str, go: &str, ours: &str, out: &mut Vec<String>) {
    let go_samples = metric_samples(go);
    let ours_shapes = metric_shapes(ours);
    let excluded = |family: &str| {
        NOT_OURS
            .iter()
            .find(|(prefix, _)| family.starts_with(prefix))
    };
    for ((family, kind, labels), values) in &go_samples {
        match excluded(family) {
            Some((prefix, _)) if matches!(*prefix, "apiserver_" | "aggregator_") => {
                if values.iter().any(|v| *v != 0.0) {
                    out.push(format!(
                        "{what}: the Go image's {family} is not zero ({values:?}): revisit NOT_OURS"
                    ));
                }
            }
            Some(_) => {}
            None => {
                let happened = |shapes: &BTreeSet<Shape>| shapes.iter().any(|(f, ..)| f == family);
                if ONLY_WHEN_IT_HAPPENS.iter().any(|(f, _)| f == family) && !happened(&ours_shapes)
                {
                    continue;
                }
                if !ours_shapes.contains(&(family.clone(), kind.clone(), labels.clone())) {
                    out.push(format!(
                        "{what}: ours lacks {family} ({kind}) with labels {labels:?}"
                    ));
                }
            }
        }
    }
    let (go_queues, our_queues) = (workqueue_names(go), workqueue_names(ours));
    for name in go_queues.difference(&our_queues) {
        if !NOT_OUR_QUEUES.iter().any(|(queue, _)| queue == name) {
            out.push(format!("{what}: ours lacks the work queue {name:?}"));
        }
    }
    let go_shapes: BTreeSet<&Shape> = go_samples.keys().collect();
    let beyond: Vec<String> = ours_shapes
        .iter()
        .filter(|shape| !go_shapes.contains(shape))
        .map(|(family, kind, labels)| format!("{family} ({kind}) {labels:?}"))
        .collect();
    eprintln!(
        "{what}: ours beyond the Go image's metrics:\n  {}\nwork queues beyond: {:?}",
        beyond.join("\n  "),
        our_queues.difference(&go_queues).collect::<Vec<_>>()
    );
}

/// klog's text format, as both images write it (`src/logging.rs`): the
/// header `Lmmdd hh:mm:ss.uuuuuu pid file:line] `, the quoted message,
/// then `key=value` pairs, a value quoted, bare, or `<` opening klog's
/// multi-line form.
const KLOG_TEXT: &str = r#"^[IWEF](0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01]) ([01]\d|2[0-3]):[0-5]\d:[0-6]\d\.\d{6} +\d{1,7} [^ :\]]+:\d+\] "(?:[^"\\]|\\.)*"(?: [^\s="]+=(?:"(?:[^"\\]|\\.)*"|<$|[^\s"<][^\s"]*))*$"#;

/// The log's entries that are and are not in klog's text format (the
/// continuation lines of a multi-line value, after a tab or ` >`, are
/// part of their entry).
fn klog_text_lines(log: &str) -> (Vec<&str>, Vec<&str>) {
    let re = regex::Regex::new(KLOG_TEXT).expect("the klog regex");
    log.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('\t') && !l.starts_with(" >"))
        .partition(|l| re.is_match(l))
}

#[test]
fn klog_text_regex_and_metric_shapes() {
    let (good, bad) = klog_text_lines(concat!(
        "I1129 08:50:32.013368    7672 csi-provisioner.go:156] \"Version\" version=\"v6.3.0-56-g0688604fa\"\n",
        "E0102 03:04:05.000006       1 claims.rs:7] \"saving \\\"x\\\" failed\" attempt=3 ok=true err=\"a b\" v=<\n",
        "\tline 1\n",
        " >\n",
        "W1231 23:59:59.999999 1234567 mod.rs:0] \"m\"\n",
        "I1129 08:50:32.042090    7672 csi-provisioner.go:246] Detected CSI driver hostpath.csi.k8s.io\n",
        "2026-11-29T08:51:15.162657Z  INFO csi-provisioner starting version=\"0.1.0\"\n",
        "I1329 08:50:32.013368    7672 a.go:1] \"bad month\"\n",
        "I1129 08:50:32.013368    7672 a.go:1] \"unterminated\n",
        "I1129 08:50:32.013368    7672 a.go:1] \"m\" key=\"open\n",
    ));
    assert_eq!(good.len(), 3, "{good:#?}");
    assert_eq!(bad.len(), 5, "{bad:#?}");

    // The Go image answers /metrics in chunks, which the harness joins.
    assert_eq!(
        support::dechunk("5\r\nwork\n\r\n3;x=1\r\nque\r\n0\r\n\r\n"),
        "work\nque"
    );
    assert_eq!(support::dechunk("0\r\n\r\n"), "");
    assert_eq!(support::dechunk("zz\r\nabc"), "");
    assert_eq!(support::dechunk("2\r\nab\r\n9\r\nshort"), "ab");

    let text = "# HELP a_total A.\n# TYPE a_total counter\na_total{code=\"200\"} 1\na_total{code=\"5,\\\"0\"} 0\n\
        # TYPE h histogram\nh_bucket{name=\"q\",le=\"1\"} 1\nh_bucket{name=\"q\",le=\"+Inf\"} 1\nh_sum{name=\"q\"} 0.5\nh_count{name=\"q\"} 1\n\
        # TYPE g gauge\ng 3\n# TYPE empty counter\n\
        # TYPE workqueue_depth gauge\nworkqueue_depth{name=\"claims\"} 0\nworkqueue_depth{name=\"unsavedpvs\"} 2\n";
    let shapes = metric_shapes(text);
    let shape = |f: &str, k: &str, l: &[&str]| -> Shape {
        (
            f.to_owned(),
            k.to_owned(),
            l.iter().map(|s| (*s).to_owned()).collect(),
        )
    };
    assert_eq!(
        shapes,
        BTreeSet::from([
            shape("a_total", "counter", &["code"]),
            shape("h", "histogram", &["name"]),
            shape("g", "gauge", &[]),
            shape("empty", "counter", &[]),
            shape("workqueue_depth", "gauge", &["name"]),
        ])
    );
    assert_eq!(
        label_pairs(r#"{code="5,\"0",le="+Inf"}"#),
        vec![
            ("code".to_owned(), "5,\"0".to_owned()),
            ("le".to_owned(), "+Inf".to_owned())
        ]
    );
    assert_eq!(
        workqueue_names(text),
        BTreeSet::from(["claims".to_owned(), "unsavedpvs".to_owned()])
    );
    let mut out = Vec::new();
    compare_metric_shapes("same", text, text, &mut out);
    assert!(out.is_empty(), "{out:#?}");
    let go = format!(
        "{text}# TYPE go_goroutines gauge\ngo_goroutines 9\n# TYPE apiserver_x counter\napiserver_x 0\n"
    );
    compare_metric_shapes("excluded", &go, text, &mut out);
    assert!(out.is_empty(), "{out:#?}");
    let moved = "# TYPE apiserver_x counter\napiserver_x 1\n# TYPE workqueue_depth gauge\nworkqueue_depth{name=\"csitopology\"} 0\n";
    compare_metric_shapes("missing", moved, "# TYPE g gauge\ng 1\n", &mut out);
    assert_eq!(out.len(), 3, "{out:#?}");
    // client-go's slow-path counter, as the Go image exposes it after a
    // renewal took the slow path: compared when ours has it too, by shape.
    let slowpath = |labels: &str| {
        format!(
            "{text}# HELP leader_election_slowpath_total [ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.\n\
             # TYPE leader_election_slowpath_total counter\nleader_election_slowpath_total{labels} 1\n"
        )
    };
    let mut out = Vec::new();
    compare_metric_shapes("slow path", &slowpath("{name=\"\"}"), text, &mut out);
    compare_metric_shapes(
        "slow path",
        &slowpath("{name=\"\"}"),
        &slowpath("{name=\"\"}"),
        &mut out,
    );
    assert!(out.is_empty(), "{out:#?}");
    compare_metric_shapes(
        "slow path",
        &slowpath("{name=\"\"}"),
        &slowpath("{lease=\"\"}"),
        &mut out,
    );
    assert_eq!(out.len(), 1, "{out:#?}");
}

/// Replaces run-specific strings (namespace, uids, PV names, volume ids)
/// with placeholders, in every string of `value`.
fn normalize(value: &mut Value, replacements: &[(String, String)]) {
    match value {
        Value::String(s) => normalize_str(s, replacements),
        Value::Array(items) => items.iter_mut().for_each(|v| normalize(v, replacements)),
        Value::Object(map) => map.values_mut().for_each(|v| normalize(v, replacements)),
        _ => {}
    }
}

/// [`normalize`] of one string.
fn normalize_str(s: &mut String, replacements: &[(String, String)]) {
    for (from, to) in replacements {
        if !from.is_empty() && s.contains(from.as_str()) {
            *s = s.replace(from.as_str(), to);
        }
    }
}

/// An event source `<driver>_<host>_<uuid>` without its per-process uuid.
fn without_uuid(component: &str) -> String {
    match component.rsplit_once('_') {
        Some((rest, last)) if uuid::Uuid::parse_str(last).is_ok() => format!("{rest}_UUID"),
        _ => component.to_owned(),
    }
}

/// Drops the fields every write changes.
fn strip_meta(object: &mut Value) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            meta.remove(key);
        }
    }
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
        status.remove("lastPhaseTransitionTime");
    }
    if let Some(claim_ref) = object
        .pointer_mut("/spec/claimRef")
        .and_then(Value::as_object_mut)
    {
        claim_ref.remove("uid");
        claim_ref.remove("resourceVersion");
    }
}

/// Starts the upstream image with `flags`, on the test's node.
fn start_go(env: &Env, kubeconfig: &Path, bin: &Path, flags: &[&str]) -> Sidecar {
    env.launch(kubeconfig)
        .binary(bin)
        .args(flags)
        .env("NODE_NAME", &env.node)
        .start("csi-provisioner-go", &env.dir.path().join("go.log"))
}

/// The CSI driver both images run against.
enum Driver {
    /// This repository's `csi-hostpath`, run by the harness.
    Ours,
    /// The upstream Go `hostpathplugin` of `../shared/k8s`, as the checks
    /// outside this repository run it.
    Upstream(Hostpathplugin),
}

impl Driver {
    /// Starts the upstream driver in place of ours, with the same name,
    /// node and socket. None off the real cluster, and, said once, without
    /// the binary where skipping is allowed (else the test fails).
    async fn upstream(env: &mut Env, extra: &[&str]) -> Option<Driver> {
        Hostpathplugin::start(env, extra)
            .await
            .map(Driver::Upstream)
    }

    /// The backend's snapshot ids.
    fn snapshot_ids(&self, env: &Env) -> Vec<String> {
        match self {
            Driver::Ours => env.backend_snapshots().into_iter().map(|s| s.id).collect(),
            // hostpathplugin's state file: {"Snapshots": [{"Id", ...}]}.
            Driver::Upstream(plugin) => std::fs::read(plugin.state_dir.join("state.json"))
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
                .and_then(|state| state["Snapshots"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|s| s["Id"].as_str().map(str::to_owned))
                .collect(),
        }
    }

    /// The id of a volume as [`Driver::volumes`] records it (the PV's
    /// handle): ours `id`, hostpathplugin's `VolID`.
    fn volume_id(record: &Value) -> String {
        record["id"]
            .as_str()
            .or_else(|| record["VolID"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// The CSI name of a volume as [`Driver::volumes`] records it (the PV's
    /// name): ours `name`, hostpathplugin's `VolName`.
    fn volume_name(record: &Value) -> String {
        record["name"]
            .as_str()
            .or_else(|| record["VolName"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// The backend's volumes by volume id, as each driver records them.
    /// Keyed by id, not by CSI name: two volumes of one name (a claim
    /// provisioned twice) would be one entry of a map by name; they fail
    /// the test here instead.
    fn volumes(&self, env: &Env) -> BTreeMap<String, Value> {
        let records: Vec<Value> = match self {
            Driver::Ours => env
                .backend_volumes()
                .into_iter()
                .map(|record| {
                    let mut value = serde_json::to_value(&record).expect("json");
                    if let Some(map) = value.as_object_mut() {
                        map.remove("creation_time");
                    }
                    value
                })
                .collect(),
            // hostpathplugin's state file: {"Volumes": [{"VolName", ...}]}.
            Driver::Upstream(plugin) => std::fs::read_dir(&plugin.state_dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| std::fs::read(entry.path()).ok())
                .filter_map(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
                .flat_map(|state| state["Volumes"].as_array().cloned().unwrap_or_default())
                .collect(),
        };
        let mut by_id = BTreeMap::new();
        let mut names = BTreeSet::new();
        for record in records {
            let name = Driver::volume_name(&record);
            assert!(
                names.insert(name.clone()),
                "two backend volumes named {name:?}: {record:#}\nand {:#}",
                by_id
                    .values()
                    .find(|v| Driver::volume_name(v) == name)
                    .unwrap_or(&Value::Null)
            );
            let id = Driver::volume_id(&record);
            if let Some(other) = by_id.insert(id.clone(), record) {
                panic!("two backend volume records of id {id:?}: {other:#}");
            }
        }
        by_id
    }

    /// Whether the backend has a volume of CSI name `name`.
    fn has_volume_named(&self, env: &Env, name: &str) -> bool {
        self.volumes(env)
            .values()
            .any(|v| Driver::volume_name(v) == name)
    }
}

/// The PV of claim `ns/name` once bound; fails with the image's log.
async fn bound(env: &Env, ns: &str, name: &str, log: &impl Fn(&Env) -> String) -> PersistentVolume {
    let started = std::time::Instant::now();
    loop {
        if let Some(claim) = env.pvc(ns, name).await
            && claim.status.and_then(|s| s.phase).as_deref() == Some("Bound")
            && let Some(volume) = claim.spec.and_then(|s| s.volume_name)
            && let Some(pv) = env.pv(&volume).await
        {
            return pv;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "claim {ns}/{name} not bound\n{}",
            tail(&log(env), 80)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The name of the volume of claim `uid` under `flags`.
fn volume_name(flags: &[&str], uid: &str) -> String {
    let value = |name: &str| {
        flags
            .iter()
            .find_map(|f| f.strip_prefix(&format!("--{name}=")))
    };
    csi_provisioner::provision::volume_name(
        value("volume-name-prefix").unwrap_or("pvc"),
        uid,
        value("volume-name-uuid-length").and_then(|l| l.parse().ok()),
    )
    .expect("volume name")
}

async fn run(
    env: &mut Env,
    image: Image,
    (go_bin, go_config): (&Path, &Path),
    extra_flags: &[&str],
    driver: &Driver,
) -> (Outcome, String) {
    let ns = format!("{}-{}", env.ns, image.short());
    let port = support::free_port();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let flags: Vec<&str> = FLAGS
        .iter()
        .chain(extra_flags)
        .copied()
        .chain([http.as_str()])
        .collect();
    env.create_namespace(&ns).await;
    env.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds", "namespace": ns}, "stringData": {"password": "x"}}))
        .await;
    // The volumes an earlier run left (its Retain volume) are not this
    // run's: their ids.
    let before: BTreeSet<String> = driver.volumes(env).into_keys().collect();
    let mut go = None;
    match image {
        Image::Go => go = Some(start_go(env, go_config, go_bin, &flags)),
        Image::Rust => {
            let node = env.node.clone();
            env.start_sidecar_with_env(&flags, &[("NODE_NAME", &node)])
                .await
        }
    }
    let logs = |env: &Env| match &go {
        Some(go) => go.log(),
        None => env.logs(),
    };

    for (name, class, size, extra) in good_claims(env)
        .into_iter()
        .chain(bad_claims())
        .chain(other_claims(env))
    {
        env.create_pvc(&ns, name, class, size, extra).await;
    }
    let mut outcome = Outcome::default();
    let mut replacements = vec![(ns.clone(), "NS".to_owned())];
    let mut pv_names = BTreeMap::new();
    for (name, ..) in good_claims(env) {
        let pv = bound(env, &ns, name, &logs).await;
        let pv_name = pv.metadata.name.clone().expect("PV name");
        let claim = env.pvc(&ns, name).await.expect("claim");
        let handle = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone())
            .unwrap_or_default();
        replacements.push((pv_name.clone(), "PV".to_owned()));
        replacements.push((claim.metadata.uid.clone().unwrap_or_default(), "UID".into()));
        replacements.push((handle, "ID".into()));
        if let Some(identity) = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .and_then(|c| c.volume_attributes.as_ref())
            .and_then(|a| a.get("storage.kubernetes.io/csiProvisionerIdentity"))
        {
            // `<start time>-<random>-<driver>`: one per process.
            replacements.push((identity.clone(), "IDENTITY".into()));
        }
        pv_names.insert(name, pv_name);
    }
    // A clone of a bound claim.
    env.create_pvc(
        &ns,
        "clone",
        "plain",
        "5Mi",
        json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "plain"}}}),
    )
    .await;
    let pv = bound(env, &ns, "clone", &logs).await;
    let claim = env.pvc(&ns, "clone").await.expect("clone");
    replacements.push((pv.metadata.name.clone().expect("PV name"), "PV".into()));
    replacements.push((claim.metadata.uid.clone().unwrap_or_default(), "UID".into()));
    if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        replacements.push((csi.volume_handle.clone(), "ID".into()));
    }
    pv_names.insert("clone", pv.metadata.name.clone().expect("PV name"));
    // Only our driver takes injected faults; the upstream one offers
    // MODIFY_VOLUME, so a VolumeAttributesClass is provisioned there.
    let faults = matches!(driver, Driver::Ours);
    if faults {
        // The driver's faults, aimed at single volumes: the node the scheduler
        // chose for `rx` is full (reschedule), and deleting `plain`'s volume
        // fails twice.
        let rx = env.create_pvc(&ns, "rx", "late", "5Mi", json!({})).await;
        let rx_uid = rx.metadata.uid.clone().unwrap_or_default();
        let plain_handle = env
            .pv(&pv_names["plain"])
            .await
            .and_then(|pv| pv.spec?.csi.map(|c| c.volume_handle))
            .expect("plain's volume");
        env.set_faults(vec![
            Fault::error("CreateVolume", tonic::Code::ResourceExhausted)
                .on(&volume_name(&flags, &rx_uid)),
            Fault::error("DeleteVolume", tonic::Code::Internal)
                .on(&plain_handle)
                .times(2),
        ]);
        Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), &ns)
            .patch(
                "rx",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {support::SELECTED_NODE: env.node}}}),
                ),
            )
            .await
            .expect("select a node");
        let topology_off = flags.contains(&"--feature-gates=Topology=false");
        env.wait_for(
            &format!("{image:?}: {ns}/rx rescheduled"),
            Duration::from_secs(30),
            || async {
                let claim = env.pvc(&ns, "rx").await?;
                let annotations = claim.metadata.annotations.unwrap_or_default();
                let failed = env
                    .events(&ns, "rx")
                    .await
                    .into_iter()
                    .any(|(reason, _)| reason == "ProvisioningFailed");
                // Without CSI topology there is nowhere else to go: upstream
                // does not reschedule.
                (failed && (topology_off || !annotations.contains_key(support::SELECTED_NODE)))
                    .then_some(())
            },
        )
        .await;
        replacements.push((rx_uid, "UID".into()));
    } else {
        let pv = bound(env, &ns, "gold", &logs).await;
        if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
            replacements.push((csi.volume_handle.clone(), "ID".into()));
        }
        let pv_name = pv.metadata.name.clone().expect("PV name");
        replacements.push((pv_name.clone(), "PV".into()));
        pv_names.insert("gold", pv_name);
    }
    // Snapshots of two bound claims (filesystem and block), restored at
    // their size and larger; before them, alone, a claim of a snapshot that
    // does not exist yet: once the image counted its failure (its event is
    // then on its way), the snapshot is taken. (Waiting for the event
    // itself can take the Go image's event backlog, tens of seconds, over
    // which the claim is retried every second and the image's spam filter,
    // 25 events per object, would drop its success.)
    let mut restores = restore_claims();
    let (nosnap, class, size, extra) = restores.pop().expect("nosnap");
    env.create_pvc(&ns, nosnap, class, size, extra).await;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(30) && !restore_failed(port).await {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (snapshot, claim) in SNAPSHOTS {
        env.take_snapshot(&ns, snapshot, "snap", claim).await;
    }
    // The other restores only once their snapshots are ready: a claim
    // that comes first is refused while they are not (not bound, not
    // Ready), as many times as its retries fall into that second.
    let mut snapshots = BTreeMap::new();
    for (snapshot, _) in SNAPSHOTS {
        let ready = env.wait_snapshot_ready(&ns, snapshot).await;
        replacements.push((ready.handle.clone(), "SNAPID".into()));
        replacements.push((ready.content.clone(), "CONTENT".into()));
        snapshots.insert(*snapshot, ready);
    }
    for (name, class, size, extra) in restores {
        env.create_pvc(&ns, name, class, size, extra).await;
    }
    for (name, ..) in restore_claims() {
        let pv = bound(env, &ns, name, &logs).await;
        let claim = env.pvc(&ns, name).await.expect("restore");
        let pv_name = pv.metadata.name.clone().expect("PV name");
        replacements.push((pv_name.clone(), "PV".into()));
        replacements.push((claim.metadata.uid.clone().unwrap_or_default(), "UID".into()));
        if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
            replacements.push((csi.volume_handle.clone(), "ID".into()));
        }
        pv_names.insert(name, pv_name);
    }
    // The provisioner's source protection goes once the restores are
    // bound (when depends on each image's throttling: wait up to 30 s).
    for (snapshot, _) in SNAPSHOTS {
        let started = std::time::Instant::now();
        let mut finalizers = loop {
            let finalizers = env
                .snapshot_finalizers(&ns, snapshot)
                .await
                .unwrap_or_default();
            if !finalizers.iter().any(|f| f == PROVISIONER_SOURCE_FINALIZER)
                || started.elapsed() > Duration::from_secs(30)
            {
                break finalizers;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        finalizers.sort();
        outcome
            .snapshot_finalizers
            .insert(snapshot.to_string(), json!(finalizers));
    }
    // Every bad claim gets its failure event, normally: wait up to 30 s in
    // all (not every mode says so, and the comparison tells what each
    // said).
    let started = std::time::Instant::now();
    for (name, ..) in bad_claims() {
        while started.elapsed() < Duration::from_secs(30)
            && !env
                .events(&ns, name)
                .await
                .into_iter()
                .any(|(reason, _)| reason == "ProvisioningFailed")
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The claim uids of the bad claims appear in volume names of messages.
    for (name, ..) in bad_claims().into_iter().chain(other_claims(env)) {
        let claim = env.pvc(&ns, name).await.expect("bad claim");
        replacements.push((claim.metadata.uid.clone().unwrap_or_default(), "UID".into()));
    }
    // Longest first: a PV name contains its claim's uid.
    replacements.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));

    for (claim, pv_name) in &pv_names {
        let mut pv = serde_json::to_value(env.pv(pv_name).await.expect("PV")).expect("json");
        strip_meta(&mut pv);
        normalize(&mut pv, &replacements);
        outcome.pvs.insert(claim.to_string(), pv);
    }
    let all_claims = good_claims(env)
        .into_iter()
        .chain(bad_claims())
        .map(|(name, ..)| name)
        .chain(other_claims(env).into_iter().map(|(name, ..)| name))
        .chain(["clone"])
        .chain(restore_claims().into_iter().map(|(name, ..)| name))
        .chain(faults.then_some("rx"))
        .collect::<Vec<_>>();
    // Volume name → the claim it is named after.
    let mut claim_of_volume = BTreeMap::new();
    for name in &all_claims {
        let mut claim: Value =
            serde_json::to_value(env.pvc(&ns, name).await.expect("claim")).expect("json");
        if let Some(uid) = claim.pointer("/metadata/uid").and_then(Value::as_str) {
            claim_of_volume.insert(volume_name(&flags, uid), name.to_string());
        }
        strip_meta(&mut claim);
        // The controller-manager's, not the sidecar's.
        if let Some(status) = claim.get_mut("status").and_then(Value::as_object_mut) {
            status.remove("conditions");
        }
        // The clone source's protection is removed once the clone is
        // provisioned: when depends on each image's client-side throttling.
        if let Some(finalizers) = claim
            .pointer_mut("/metadata/finalizers")
            .and_then(Value::as_array_mut)
        {
            finalizers.retain(|f| f != "provisioner.storage.kubernetes.io/cloning-protection");
        }
        normalize(&mut claim, &replacements);
        outcome.claims.insert(name.to_string(), claim);
    }
    // Every volume of this run on the backend, by claim; and the harness's
    // invariant over them: each has its PV, each PV of the run its volume.
    // By volume id.
    let run_volumes = |env: &Env| -> BTreeMap<String, Value> {
        driver
            .volumes(env)
            .into_iter()
            .filter(|(id, _)| !before.contains(id))
            .collect()
    };
    let run_pvs = |pvs: Vec<PersistentVolume>| -> Vec<PersistentVolume> {
        pvs.into_iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .and_then(|c| c.namespace.as_deref())
                    == Some(ns.as_str())
            })
            .collect()
    };
    // (Names are unique: `Driver::volumes` checks it.)
    let by_claim = |volumes: &BTreeMap<String, Value>, replacements: &[(String, String)]| {
        volumes
            .values()
            .map(|volume| {
                let name = Driver::volume_name(volume);
                let claim = claim_of_volume
                    .get(&name)
                    .cloned()
                    .unwrap_or_else(|| format!("unclaimed {name}"));
                let mut volume = volume.clone();
                normalize(&mut volume, replacements);
                (claim, volume)
            })
            .collect::<BTreeMap<String, Value>>()
    };
    let listed = run_volumes(env);
    let ids: Vec<String> = listed.keys().cloned().collect();
    env.assert_consistent_with(&run_pvs(env.pvs().await), &ids);
    // A volume without a PV (a leak) has an id no replacement knows yet.
    for id in &ids {
        if !replacements.iter().any(|(from, _)| from == id) {
            replacements.push((id.clone(), "ID".into()));
        }
    }
    replacements.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    outcome.volumes = by_claim(&listed, &replacements);
    // Events the sidecar wrote (the controller-manager's are the same for
    // both and their timing differs): by claim, the distinct events, and
    // how many times each reason was said (`<claim> <reason>` → the sum of
    // the events' `count`: the Go image's recorder counts a repeat on the
    // event it repeats, ours writes an event per transition).
    let sidecar_events =
        |events: Vec<Event>, names: &BTreeMap<String, String>| {
            let mut by_claim: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let mut counts: BTreeMap<String, u64> = BTreeMap::new();
            for event in events {
                let component = event
                    .source
                    .as_ref()
                    .and_then(|s| s.component.clone())
                    .unwrap_or_default();
                if component == "persistentvolume-controller" {
                    continue;
                }
                let Some(claim) = event
                    .involved_object
                    .name
                    .as_ref()
                    .and_then(|n| names.get(n))
                else {
                    continue;
                };
                let reason = event.reason.unwrap_or_default();
                // README: a `Provisioning` note is replaced by the outcome
                // that comes within 2 s.
                if reason == "Provisioning" {
                    continue;
                }
                // `nosnap` is retried while its snapshot, just taken, is not
                // bound or not ready yet: whether a retry falls into that
                // second is timing.
                if claim == "nosnap"
                    && event.message.as_deref().is_some_and(|m| {
                        m.ends_with("snapshot snap-late not bound")
                            || m.ends_with("snapshot snap-late is not Ready")
                    })
                {
                    continue;
                }
                // Two restores from one snapshot at once: the Go image's
                // finalizer update of the VolumeSnapshot may conflict, which
                // it reports as a failure and retries; ours retries the
                // conflict at once (timing, not a result).
                if event.message.as_deref().is_some_and(|m| {
                    m.starts_with(
                        "Operation cannot be fulfilled on volumesnapshots.snapshot.storage.k8s.io",
                    )
                }) {
                    continue;
                }
                // The Go image in node mode reports its node check of a claim
                // deleted meanwhile; ours drops a deleted claim silently.
                if event.message.as_deref().is_some_and(|m| {
                    m.starts_with("node check failed") && m.contains("PVC not found")
                }) {
                    continue;
                }
                let mut line = json!(format!(
                    "{} {} {reason} [{} host={:?} reporting={:?}/{:?}] {}",
                    event.type_.unwrap_or_default(),
                    event.involved_object.kind.unwrap_or_default(),
                    without_uuid(&component),
                    event.source.as_ref().and_then(|s| s.host.clone()),
                    event.reporting_component.as_deref().map(without_uuid),
                    event.reporting_instance,
                    event.message.unwrap_or_default()
                ));
                normalize(&mut line, &replacements);
                by_claim
                    .entry(claim.clone())
                    .or_default()
                    .insert(line.as_str().unwrap_or_default().to_owned());
                *counts.entry(format!("{claim} {reason}")).or_default() +=
                    u64::try_from(event.count.unwrap_or(1).max(1)).unwrap_or(1);
            }
            (by_claim, counts)
        };

    // Deletion: every claim goes; a Retain PV is then deleted by hand.
    let pvs_by_name: BTreeMap<String, String> = pv_names
        .iter()
        .map(|(claim, pv)| (pv.clone(), claim.to_string()))
        .collect();
    for name in &all_claims {
        env.delete_pvc(&ns, name).await;
    }
    let pv_api = Api::<PersistentVolume>::all(env.client.clone());
    // The volumes of the Retain PVs deleted by hand: kept on the backend
    // on purpose, without a PV.
    let mut retained = BTreeSet::new();
    for (claim, pv_name) in &pv_names {
        let policy = outcome.pvs[*claim]
            .pointer("/spec/persistentVolumeReclaimPolicy")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if policy == "Retain" {
            env.wait_for(
                &format!("{image:?}: PV of {claim} released"),
                Duration::from_secs(30),
                || async {
                    let pv = env.pv(pv_name).await?;
                    (pv.status?.phase.as_deref() == Some("Released")).then_some(())
                },
            )
            .await;
            let _ = pv_api.delete(pv_name, &Default::default()).await;
            retained.insert(pv_name.clone());
        }
    }
    for (claim, pv_name) in &pv_names {
        let mut gone = false;
        for _ in 0..150 {
            if env.pv(pv_name).await.is_none() {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut left = BTreeSet::new();
        if !gone {
            left.insert("pv");
        }
        if driver.has_volume_named(env, pv_name) {
            left.insert("volume");
        }
        outcome.left_after_delete.insert(claim.to_string(), left);
    }
    // Events are written behind the work (the Go image's client-side
    // throttling, our queue): wait for the ones both must write, then
    // until no new one comes for 3 s.
    let claim_names: BTreeMap<String, String> = all_claims
        .iter()
        .map(|n| (n.to_string(), n.to_string()))
        .collect();
    let (mut seen, mut quiet_since) = (0, std::time::Instant::now());
    let started = std::time::Instant::now();
    loop {
        let claim_events = Api::<Event>::namespaced(env.client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .expect("events")
            .items;
        let pv_events = Api::<Event>::namespaced(env.client.clone(), "default")
            .list(&ListParams::default())
            .await
            .expect("events")
            .items;
        let count = claim_events.len() + pv_events.len();
        let succeeded: BTreeSet<&str> = claim_events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ProvisioningSucceeded"))
            .filter_map(|e| e.involved_object.name.as_deref())
            .collect();
        let failed_delete = !faults
            || pv_events.iter().any(|e| {
                e.reason.as_deref() == Some("VolumeFailedDelete")
                    && e.involved_object.name.as_deref() == Some(pv_names["plain"].as_str())
            });
        let all_succeeded = failed_delete && pv_names.keys().all(|claim| succeeded.contains(claim));
        if count != seen {
            (seen, quiet_since) = (count, std::time::Instant::now());
        } else if (all_succeeded && quiet_since.elapsed() > Duration::from_secs(3))
            || started.elapsed() > Duration::from_secs(60)
        {
            eprintln!(
                "{image:?}: events settled after {:.1}s (all expected: {all_succeeded})",
                started.elapsed().as_secs_f64()
            );
            (outcome.claim_events, outcome.claim_event_counts) =
                sidecar_events(claim_events, &claim_names);
            (outcome.pv_events, outcome.pv_event_counts) = sidecar_events(pv_events, &pvs_by_name);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for name in &all_claims {
        env.wait_for(
            &format!("{image:?}: claim {name} gone"),
            Duration::from_secs(30),
            || async { env.pvc(&ns, name).await.is_none().then_some(()) },
        )
        .await;
    }
    // Then the snapshots go, with their contents and backend snapshots.
    for (snapshot, _) in SNAPSHOTS {
        env.delete(SNAPSHOT_API, "VolumeSnapshot", &ns, snapshot)
            .await;
    }
    for (snapshot, ready) in &snapshots {
        let started = std::time::Instant::now();
        let left = loop {
            let mut left = BTreeSet::new();
            if env.volume_snapshot(&ns, snapshot).await.is_some() {
                left.insert("snapshot");
            }
            if env.snapshot_content(&ready.content).await.is_some() {
                left.insert("content");
            }
            if driver.snapshot_ids(env).contains(&ready.handle) {
                left.insert("backend");
            }
            if left.is_empty() || started.elapsed() > Duration::from_secs(30) {
                break left;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        outcome.snapshots_left.insert(snapshot.to_string(), left);
    }
    // What is left on the backend once all is deleted and quiet: the
    // Retain volumes only, each without a PV; any other volume is a leak.
    let left = run_volumes(env);
    let ids: Vec<String> = left
        .iter()
        .filter(|(_, volume)| !retained.contains(&Driver::volume_name(volume)))
        .map(|(id, _)| id.clone())
        .collect();
    env.assert_consistent_with(&run_pvs(env.pvs().await), &ids);
    outcome.volumes_after_delete = by_claim(&left, &replacements);
    let (status, metrics) = support::http_get(port, "/metrics").await;
    assert_eq!(status, 200, "{image:?}: /metrics");
    outcome.exposition = metrics.clone();
    let mut metrics = json!(provisioning_metrics(&metrics));
    normalize(&mut metrics, &replacements);
    outcome.metrics = serde_json::from_value(metrics).expect("metrics");
    env.clear_faults();
    let log = logs(env);
    outcome.raw_log = match &go {
        Some(go) => go.log(),
        None => env.last_sidecar_log(),
    };
    match go {
        Some(mut go) => go.kill(),
        None => {
            env.stop_sidecar();
        }
    }
    // Volumes a Retain PV kept stay on the backend (compared above, in
    // `volumes_after_delete`); the next run leaves them out.
    (outcome, log)
}

/// Field-by-field differences of two JSON values, as `path: go | ours`.
fn differences(path: &str, go: &Value, ours: &Value, out: &mut Vec<String>) {
    match (go, ours) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let null = Value::Null;
                differences(
                    &format!("{path}/{key}"),
                    a.get(key).unwrap_or(&null),
                    b.get(key).unwrap_or(&null),
                    out,
                );
            }
        }
        _ if go != ours => out.push(format!("{path}: {go} | {ours}")),
        _ => {}
    }
}

/// Event reasons whose count is timing: compared at least once (both
/// images said it about the object, or neither), not exactly. Every other
/// (object, reason) must have been said as many times by both.
const AT_LEAST_ONCE: &[(&str, &str)] = &[
    (
        "ProvisioningFailed",
        "a claim that cannot be provisioned (yet) is retried with backoff (100 ms doubling \
         to 1 s here) until it is deleted or its cause goes, so how many retries fall into \
         the run is timing; and the Go image says it again at each retry (its recorder \
         counts the repeats), ours once per distinct message (README: once per transition)",
    ),
    (
        "VolumeFailedDelete",
        "the DeleteVolume of `plain`'s PV fails twice (the driver's fault) and is retried \
         with backoff: the Go image says it at each retry (2), ours once for the same \
         message (1; README: once per transition)",
    ),
];

/// Differences of how many times each (object, reason) was said, as
/// `what <claim> <reason>: Go n | ours m`; see [`AT_LEAST_ONCE`].
fn count_differences(
    what: &str,
    go: &BTreeMap<String, u64>,
    ours: &BTreeMap<String, u64>,
    out: &mut Vec<String>,
) {
    let keys: BTreeSet<&String> = go.keys().chain(ours.keys()).collect();
    for key in keys {
        let (a, b) = (
            go.get(key).copied().unwrap_or(0),
            ours.get(key).copied().unwrap_or(0),
        );
        let reason = key.rsplit_once(' ').map_or("", |(_, r)| r);
        match AT_LEAST_ONCE.iter().find(|(r, _)| *r == reason) {
            Some(_) if (a > 0) == (b > 0) => {}
            Some(_) => out.push(format!(
                "{what} {key}: Go {a} | ours {b} (compared at least once)"
            )),
            None if a != b => out.push(format!("{what} {key}: Go {a} | ours {b} times")),
            None => {}
        }
    }
}

fn set_differences(
    what: &str,
    go: &BTreeMap<String, BTreeSet<String>>,
    ours: &BTreeMap<String, BTreeSet<String>>,
    out: &mut Vec<String>,
) {
    let claims: BTreeSet<&String> = go.keys().chain(ours.keys()).collect();
    let empty = BTreeSet::new();
    for claim in claims {
        let a = go.get(claim).unwrap_or(&empty);
        let b = ours.get(claim).unwrap_or(&empty);
        for only in a.difference(b) {
            out.push(format!("{what} {claim}: only Go: {only}"));
        }
        for only in b.difference(a) {
            out.push(format!("{what} {claim}: only ours: {only}"));
        }
    }
}

/// The upstream binary and a kubeconfig of a user bound to its project's
/// stock rules (plus `secrets: get`, commented out there, for classes with
/// secrets; deploy/'s rules differ: patch instead of update on claims).
/// None off the real cluster, and, said once, without the binary where
/// skipping is allowed (else the test fails).
async fn go_image(env: &Env) -> Option<(PathBuf, PathBuf)> {
    env.plane()?;
    let go_bin = env.upstream_binary("csi-provisioner")?;
    let extra = [
        json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
        // As deploy/ grants ours (without it both read each claim's class
        // and are refused).
        json!({"apiGroups": ["storage.k8s.io"],
            "resources": ["volumeattributesclasses"], "verbs": ["get", "list", "watch"]}),
    ];
    let (_, kubeconfig) = stock_rules_user(env, "go", &extra, &[]).await;
    Some((go_bin, kubeconfig))
}

/// The user `<prefix>-<test id>`, bound to the upstream stock rules
/// ([`support::upstream_stock_rules`]) plus `cluster` and `namespace`
/// rules; its name and kubeconfig. Real cluster only.
async fn stock_rules_user(
    env: &Env,
    prefix: &str,
    cluster: &[Value],
    namespace: &[Value],
) -> (String, PathBuf) {
    let plane = env.plane().expect("real cluster");
    let user = format!("{prefix}-{}", env.id);
    let (mut cluster_rules, mut namespace_rules) = support::upstream_stock_rules();
    for (rules, extra) in [
        (&mut cluster_rules, cluster),
        (&mut namespace_rules, namespace),
    ] {
        rules
            .as_array_mut()
            .expect("a list of rules")
            .extend_from_slice(extra);
    }
    env.grant_rules(&user, cluster_rules, namespace_rules).await;
    let kubeconfig = plane.kubeconfig_for(&user, None).expect("kubeconfig");
    (user, kubeconfig)
}

async fn the_same_claims_give_the_same_objects_as_the_go_sidecar(backend: Backend) {
    compare_with_the_go_image(backend, &[]).await;
}

/// Other naming and topology flags (and no CSI topology at all).
async fn with_other_naming_and_topology_flags_too(backend: Backend) {
    compare_with_the_go_image(
        backend,
        &[
            "--volume-name-prefix=vol",
            "--volume-name-uuid-length=10",
            "--default-fstype=ext4",
            "--strict-topology",
            "--immediate-topology=false",
        ],
    )
    .await;
}

/// One provisioner per node (NODE_NAME): the test's node takes every claim.
async fn in_node_deployment(backend: Backend) {
    compare_with_the_go_image(
        backend,
        &[
            "--node-deployment=true",
            "--node-deployment-base-delay=100ms",
            "--node-deployment-max-delay=1s",
        ],
    )
    .await;
}

async fn without_the_topology_gate(backend: Backend) {
    compare_with_the_go_image(backend, &["--feature-gates=Topology=false"]).await;
}

async fn compare_with_the_go_image(backend: Backend, flags: &[&str]) {
    compare_with_the_go_image_on(backend, flags, None).await;
}

/// The same claims against the upstream `hostpathplugin` (with `driver_flags`).
async fn against_the_upstream_hostpath_driver(backend: Backend) {
    compare_with_the_go_image_on(backend, &[], Some(&["--enable-controller-modify-volume"])).await;
}

async fn compare_with_the_go_image_on(
    backend: Backend,
    flags: &[&str],
    upstream_driver: Option<&[&str]>,
) {
    let mut env = Env::new(backend).await;
    let Some((go_bin, go_config)) = go_image(&env).await else {
        return;
    };

    env.storage_class_with(
        "plain",
        "Immediate",
        "Delete",
        json!({"color": "red"}),
        json!({"mountOptions": ["noatime"], "allowVolumeExpansion": true}),
    )
    .await;
    env.storage_class(
        "full",
        "Immediate",
        "Retain",
        json!({
            "csi.storage.k8s.io/fstype": "xfs",
            "csi.storage.k8s.io/provisioner-secret-name": "creds",
            "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
            "csi.storage.k8s.io/controller-publish-secret-name": "${pvc.name}-publish",
            "csi.storage.k8s.io/controller-publish-secret-namespace": "${pvc.namespace}",
            "csi.storage.k8s.io/node-stage-secret-name": "${pvc.annotations['team']}",
            "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}",
            "csi.storage.k8s.io/node-publish-secret-name": "publish",
            "csi.storage.k8s.io/node-publish-secret-namespace": "${pvc.namespace}",
            "csi.storage.k8s.io/controller-expand-secret-name": "creds",
            "csi.storage.k8s.io/controller-expand-secret-namespace": "${pvc.namespace}",
            "csi.storage.k8s.io/node-expand-secret-name": "creds",
            "csi.storage.k8s.io/node-expand-secret-namespace": "${pvc.namespace}",
            "color": "blue",
        }),
    )
    .await;
    env.storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    env.create(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttributesClass",
        "metadata": {"name": env.class("gold")}, "driverName": env.driver_name,
        "parameters": {"iops": "100"}}),
    )
    .await;
    env.storage_class(
        "nosecret",
        "Immediate",
        "Delete",
        json!({
            "csi.storage.k8s.io/provisioner-secret-name": "missing",
            "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
        }),
    )
    .await;

    let driver = match upstream_driver {
        None => Driver::Ours,
        Some(extra) => match Driver::upstream(&mut env, extra).await {
            Some(driver) => driver,
            None => return,
        },
    };
    // The snapshot components, next to the driver in its final form.
    if env.start_snapshotter().await.is_none() {
        return;
    }
    env.snapshot_class("snap").await;
    let go_image = (go_bin.as_path(), go_config.as_path());
    let (go, go_log) = run(&mut env, Image::Go, go_image, flags, &driver).await;
    let (ours, our_log) = run(&mut env, Image::Rust, go_image, flags, &driver).await;

    let mut out = Vec::new();
    let go_json = |o: &Outcome| {
        json!({"pvs": o.pvs, "claims": o.claims, "volumes": o.volumes,
               "volumes_after_delete": o.volumes_after_delete,
               "left_after_delete": o.left_after_delete, "metrics": o.metrics,
               "snapshot_finalizers": o.snapshot_finalizers,
               "snapshots_left": o.snapshots_left})
    };
    differences("", &go_json(&go), &go_json(&ours), &mut out);
    set_differences(
        "claim events",
        &go.claim_events,
        &ours.claim_events,
        &mut out,
    );
    set_differences("PV events", &go.pv_events, &ours.pv_events, &mut out);
    count_differences(
        "claim events",
        &go.claim_event_counts,
        &ours.claim_event_counts,
        &mut out,
    );
    count_differences(
        "PV events",
        &go.pv_event_counts,
        &ours.pv_event_counts,
        &mut out,
    );
    compare_metric_shapes("/metrics", &go.exposition, &ours.exposition, &mut out);
    compare_logs(&go.raw_log, &ours.raw_log, &mut out);
    assert!(
        out.is_empty(),
        "differences from the Go sidecar (path: Go | ours):\n{}\n\n--- Go log (tail) ---\n{}\n--- our log (tail) ---\n{}",
        out.join("\n"),
        tail(&go_log, 60),
        tail(&our_log, 60),
    );
    // The case of the missing snapshot happened: both refused it first.
    for (image, outcome) in [("Go", &go), ("ours", &ours)] {
        let events = outcome
            .claim_events
            .get("nosnap")
            .cloned()
            .unwrap_or_default();
        assert!(
            events
                .iter()
                .any(|e| e.contains("ProvisioningFailed") && e.contains("\"snap-late\" not found")),
            "{image}: the claim of a missing snapshot was not refused first: {events:#?}"
        );
    }
}

/// Both logs are klog's text format: some entries of the Go image's (its
/// printf-style ones have an unquoted message) and every entry of ours,
/// which runs with the default `--logging-format`.
fn compare_logs(go: &str, ours: &str, out: &mut Vec<String>) {
    let (go_good, _) = klog_text_lines(go);
    if go_good.is_empty() {
        out.push("no line of the Go image's log matches KLOG_TEXT".to_owned());
    }
    let (our_good, our_bad) = klog_text_lines(ours);
    if our_good.is_empty() || !our_bad.is_empty() {
        out.push(format!(
            "{} lines of our log match KLOG_TEXT, these do not:\n{}",
            our_good.len(),
            our_bad.join("\n")
        ));
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The CSIStorageCapacity objects of `env`'s driver, normalized, by name.
async fn capacity_objects(env: &Env) -> BTreeMap<String, Value> {
    env.capacities()
        .await
        .expect("list capacities")
        .into_iter()
        .map(|o| {
            let name = o.metadata.name.clone().unwrap_or_default();
            let mut value = serde_json::to_value(o).expect("json");
            strip_meta(&mut value);
            (name, value)
        })
        .collect()
}

/// The image swap with `--enable-capacity`: the objects the Go image
/// published are adopted as they are (same names, same content, none
/// created or deleted), then kept up to date.
async fn capacity_objects_of_the_go_image_are_taken_over(backend: Backend) {
    const GI: u64 = 1 << 30;
    let mut env = Env::new_with_driver(backend, |c| {
        c.capacity = BTreeMap::from([("fast".to_owned(), GI)]);
        c.max_volume_size = GI;
    })
    .await;
    let Some((go_bin, go_config)) = go_image(&env).await else {
        return;
    };
    env.storage_class(
        "wffc",
        "WaitForFirstConsumer",
        "Delete",
        json!({"kind": "fast"}),
    )
    .await;
    env.storage_class("other", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    // With leader election (short, so that ours takes over quickly after
    // the Go image is killed) and each image's metrics endpoint, whose
    // families and work queues are compared at the end.
    let lease_namespace = format!("--leader-election-namespace={}", env.ns);
    let flags = [
        "--enable-capacity",
        "--capacity-poll-interval=1s",
        "--capacity-ownerref-level=-1",
        "--leader-election",
        &lease_namespace,
        "--leader-election-lease-duration=2s",
        "--leader-election-renew-deadline=1s",
        "--leader-election-retry-period=500ms",
    ];
    let go_port = support::free_port();
    let go_http = format!("--http-endpoint=127.0.0.1:{go_port}");
    let go_flags: Vec<&str> = flags.iter().copied().chain([go_http.as_str()]).collect();
    let mut go = start_go(&env, &go_config, &go_bin, &go_flags);
    // Both classes published, then nothing changes for 3 polls.
    let mut last = BTreeMap::new();
    let mut stable_since = std::time::Instant::now();
    let started = std::time::Instant::now();
    let published = loop {
        let now = capacity_objects(&env).await;
        if now != last {
            (last, stable_since) = (now, std::time::Instant::now());
        } else if last.len() == 2 && stable_since.elapsed() > Duration::from_secs(3) {
            break last;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the Go image published {last:#?}\n{}",
            go.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (status, go_metrics) = support::http_get(go_port, "/metrics").await;
    assert_eq!(status, 200, "the Go image's /metrics");
    let go_log = go.log();
    go.kill();

    let our_port = support::free_port();
    let our_http = format!("--http-endpoint=127.0.0.1:{our_port}");
    let our_flags: Vec<&str> = flags.iter().copied().chain([our_http.as_str()]).collect();
    env.start_sidecar(&our_flags).await;
    // Several polls of ours, each having found every object of the Go
    // image up to date (its log says so per object and poll), before the
    // objects are compared: only then is "nothing changed" worth checking.
    const POLLS: usize = 3;
    env.wait_for(
        &format!("{POLLS} polls of ours finding each of the Go image's objects up to date"),
        Duration::from_secs(60),
        || async {
            let logs = env.logs();
            published
                .keys()
                .all(|name| {
                    let field = support::log_field("csistoragecapacity", name);
                    logs.lines()
                        .filter(|l| {
                            l.contains("CSIStorageCapacity up to date")
                                && l.split_whitespace().any(|w| w == field)
                        })
                        .count()
                        >= POLLS
                })
                .then_some(())
        },
    )
    .await;
    let adopted = capacity_objects(&env).await;
    let mut out = Vec::new();
    differences("", &json!(published), &json!(adopted), &mut out);
    let (status, our_metrics) = support::http_get(our_port, "/metrics").await;
    assert_eq!(status, 200, "our /metrics");
    compare_metric_shapes(
        "/metrics with --enable-capacity",
        &go_metrics,
        &our_metrics,
        &mut out,
    );
    compare_logs(&go_log, &env.last_sidecar_log(), &mut out);
    assert!(
        out.is_empty(),
        "differences from the Go image (objects: path: Go | ours; metrics; logs):\n{}\n{}",
        out.join("\n"),
        env.logs()
    );
    let plane = env.plane().expect("real cluster");
    let user = env.sidecar_user();
    let writes: Vec<String> = plane
        .audit()
        .into_iter()
        .filter(|r| {
            r.user.username == user
                && r.resource() == "csistoragecapacities"
                && matches!(r.verb.as_str(), "create" | "delete")
        })
        .map(|r| format!("{} {}", r.verb, r.request_uri))
        .collect();
    assert!(writes.is_empty(), "adopted, not replaced: {writes:#?}");

    // A volume of kind `fast` on the node: the adopted object follows.
    let name_of_fast = adopted
        .iter()
        .find(|(_, o)| o["storageClassName"] == env.class("wffc"))
        .map(|(name, _)| name.clone())
        .expect("the wffc object");
    env.create_pvc(
        &env.ns,
        "data",
        "wffc",
        "100Mi",
        json!({"metadata": {"annotations": {support::SELECTED_NODE: env.node}}}),
    )
    .await;
    env.wait_bound(&env.ns, "data").await;
    env.wait_for(
        "the adopted object shows the volume",
        Duration::from_secs(20),
        || async {
            let now = capacity_objects(&env).await;
            (now.get(&name_of_fast)?["capacity"] == "924Mi" && now.len() == 2).then_some(())
        },
    )
    .await;
    env.delete_pvc(&env.ns, "data").await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

/// `--runtime-config` of an API server without the v1
/// VolumeAttributesClass API (a cluster older than 1.34, or one that turned
/// it off): a control plane of its own, started for the test that needs it.
const WITHOUT_VAC_API: &str = "storage.k8s.io/v1/volumeattributesclasses=false";

e2e_real!(ClusterConfig::standard().with_apiserver_runtime_config(WITHOUT_VAC_API);
    a_volume_attributes_class_gate_set_without_the_v1_api,
);

e2e_real!(ClusterConfig::standard();
    the_volume_attributes_class_gate_with_rbac_refusing_the_classes,
);

/// What one image did with the VolumeAttributesClass gate in a case of
/// [`compare_the_gate`], normalized.
#[derive(Debug, Default, PartialEq)]
struct GateOutcome {
    /// The PV of `plain` (none: not provisioned within 30 s).
    plain: Option<Value>,
    /// The distinct events about `gold`, `reason: message`, but the short
    /// `Provisioning` note (README: superseded by the outcome).
    gold_events: BTreeSet<String>,
    /// Whether `gold` got a PV.
    gold_bound: bool,
}

/// The claims of [`compare_the_gate`]: one plain, one naming the
/// VolumeAttributesClass `gold` (an object only where the API serves it).
fn gate_claims(env: &Env) -> [(&'static str, Value); 2] {
    [
        ("plain", json!({})),
        (
            "gold",
            json!({"spec": {"volumeAttributesClassName": env.class("gold")}}),
        ),
    ]
}

/// A case of [`compare_the_gate`]: how each image runs, and what the Go
/// image is known to do there.
struct GateCase<'a> {
    /// The flags of both images.
    flags: &'a [&'a str],
    /// The Go image's binary and kubeconfig.
    go_image: (PathBuf, PathBuf),
    /// Our kubeconfig; None: the harness's (deploy/'s rules for `flags`).
    our_config: Option<PathBuf>,
    /// What ours logs of the gate, once, at start.
    our_line: &'static str,
    /// What the Go image's `ProvisioningFailed` about `gold` says, each.
    go_refusal: &'static [&'static str],
    /// Run-specific strings of the events (a user's name in a 403) and
    /// their placeholders.
    replacements: Vec<(String, String)>,
}

/// Runs the Go image, then ours, as `case` says, against `driver` (which
/// must offer MODIFY_VOLUME, so that both get past the capability check to
/// the class itself), each on [`gate_claims`] in a namespace of its own;
/// fails unless the Go image provisions `plain`, leaves `gold` unbound
/// with a `ProvisioningFailed` saying `case.go_refusal` and keeps running,
/// and ours does the same: the same PV of `plain` and the same events of
/// `gold`, up to names.
async fn compare_the_gate(env: &mut Env, driver: &Driver, case: GateCase<'_>) {
    env.storage_class("plain", "Immediate", "Delete", json!({}))
        .await;
    let (go_bin, go_config) = &case.go_image;
    let mut outcomes = BTreeMap::new();
    for image in [Image::Go, Image::Rust] {
        let ns = format!("{}-{}", env.ns, image.short());
        env.create_namespace(&ns).await;
        let mut running = Running::start_as(
            env,
            image,
            (go_bin.as_path(), go_config.as_path()),
            case.our_config.as_deref(),
            case.flags,
        )
        .await;
        for (name, extra) in gate_claims(env) {
            env.create_pvc(&ns, name, "plain", "5Mi", extra).await;
        }
        // `plain` bound and `gold` refused, or 30 s: what each image does
        // is what is compared.
        let mut outcome = GateOutcome::default();
        let started = std::time::Instant::now();
        let mut plain = None;
        while (plain.is_none() || outcome.gold_events.len() < 2)
            && started.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
            plain = env
                .pvc(&ns, "plain")
                .await
                .and_then(|c| c.spec?.volume_name);
            outcome.gold_events = env
                .events(&ns, "gold")
                .await
                .into_iter()
                .filter(|(reason, _)| reason != "Provisioning")
                .map(|(reason, message)| {
                    let mut event = format!("{reason}: {message}");
                    normalize_str(&mut event, &case.replacements);
                    event
                })
                .collect();
        }
        if let Some(name) = plain {
            let pv = env.pv(&name).await.expect("plain's PV");
            let mut replacements = vec![(ns.clone(), "NS".to_owned()), (name, "PV".to_owned())];
            if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
                replacements.push((csi.volume_handle.clone(), "ID".to_owned()));
                if let Some(identity) = csi
                    .volume_attributes
                    .as_ref()
                    .and_then(|a| a.get("storage.kubernetes.io/csiProvisionerIdentity"))
                {
                    replacements.push((identity.clone(), "IDENTITY".to_owned()));
                }
            }
            let mut pv = serde_json::to_value(pv).expect("json");
            strip_meta(&mut pv);
            normalize(&mut pv, &replacements);
            outcome.plain = Some(pv);
        }
        outcome.gold_bound = env
            .pvc(&ns, "gold")
            .await
            .and_then(|c| c.spec?.volume_name)
            .is_some();
        // Still running: neither exits nor waits for ever.
        assert_eq!(running.exited(env), None, "{image:?}\n{}", running.log(env));
        if image == Image::Rust {
            let log = running.log(env);
            let said = log.lines().filter(|l| l.contains(case.our_line)).count();
            assert_eq!(said, 1, "{:?} said once at start\n{log}", case.our_line);
        }
        outcomes.insert(image, (outcome, running.log(env)));
        // The next image must not see this run's claims.
        for (name, _) in gate_claims(env) {
            env.delete_pvc(&ns, name).await;
        }
        env.wait_for("the run's volume gone", Duration::from_secs(30), || async {
            driver.volumes(env).is_empty().then_some(())
        })
        .await;
        running.kill(env);
    }
    let (go, go_log) = &outcomes[&Image::Go];
    let (ours, our_log) = &outcomes[&Image::Rust];
    // What the Go image does, so that this test fails when it changes.
    let plain = go
        .plain
        .as_ref()
        .unwrap_or_else(|| panic!("the Go image provisions a claim without a class\n{go_log}"));
    assert_eq!(plain["spec"].get("volumeAttributesClassName"), None);
    assert!(!go.gold_bound, "{go_log}");
    assert!(
        go.gold_events.iter().any(|event| {
            event.starts_with("ProvisioningFailed: ")
                && case.go_refusal.iter().all(|part| event.contains(part))
        }),
        "the Go image's ProvisioningFailed about gold says {:?}: {:#?}\n{go_log}",
        case.go_refusal,
        go.gold_events
    );
    let mut out = Vec::new();
    differences(
        "",
        &json!({"plain": go.plain, "gold_bound": go.gold_bound}),
        &json!({"plain": ours.plain, "gold_bound": ours.gold_bound}),
        &mut out,
    );
    set_differences(
        "gold events",
        &BTreeMap::from([("gold".to_owned(), go.gold_events.clone())]),
        &BTreeMap::from([("gold".to_owned(), ours.gold_events.clone())]),
        &mut out,
    );
    assert!(
        out.is_empty(),
        "differences from the Go sidecar (path: Go | ours):\n{}\n--- Go log (tail) ---\n{}\n--- our log (tail) ---\n{}",
        out.join("\n"),
        tail(go_log, 40),
        tail(our_log, 40),
    );
}

/// `--feature-gates=VolumeAttributesClass=true` where the API server does
/// not serve the v1 kind. Neither image turns the gate off (upstream
/// #1425). The Go image never watches the classes: it reads a claim's
/// class when it provisions it (`pkg/controller/controller.go`,
/// `prepareProvision`), so the plain claim is provisioned and the other is
/// refused with the API server's answer, again at each retry. Ours the
/// same (before, its class cache could not fill and nothing was
/// provisioned).
async fn a_volume_attributes_class_gate_set_without_the_v1_api(backend: Backend) {
    let mut env = Env::new(backend).await;
    let Some(go_image) = go_image(&env).await else {
        return;
    };
    let Some(driver) = Driver::upstream(&mut env, &["--enable-controller-modify-volume"]).await
    else {
        return;
    };
    let case = GateCase {
        flags: &["--feature-gates=VolumeAttributesClass=true", "--v=5"],
        go_image,
        our_config: None,
        our_line: "kept on because --feature-gates sets it",
        go_refusal: &["the server could not find the requested resource"],
        replacements: Vec::new(),
    };
    compare_the_gate(&mut env, &driver, case).await;
}

/// Why ours is refused in
/// [`the_volume_attributes_class_gate_with_rbac_refusing_the_classes`]
/// (see [`support::Env::expect_refusals`]).
const STOCK_RULES_LACK_VAC: &str = "the stock upstream rules grant no volumeattributesclasses";
/// What is refused there: the probe's list at start, and the read of
/// `gold`'s class at each attempt.
const VAC_REFUSED: &[(&str, &str, u16)] = &[
    ("list", "volumeattributesclasses", 403),
    ("get", "volumeattributesclasses", 403),
];

/// The gate not set, the v1 API served and a class `gold` of this driver
/// there, but RBAC granting no volumeattributesclasses: the upstream stock
/// rules (`tests/fixtures/upstream-v6.3-rbac.yaml`). The Go image turns
/// the gate off by discovery alone (upstream
/// `cmd/csi-provisioner/csi-provisioner.go`), so here it stays on, and its
/// read of a claim's class is refused: the plain claim is provisioned, the
/// other gets `ProvisioningFailed` with the 403, again at each retry. Ours
/// the same (`src/startup.rs`, `volume_attributes_class_gate`); before, it
/// turned the gate off and provisioned `gold` without its class.
async fn the_volume_attributes_class_gate_with_rbac_refusing_the_classes(backend: Backend) {
    let mut env = Env::new(backend).await;
    let Some(go_bin) = env.upstream_binary("csi-provisioner") else {
        return;
    };
    let Some(driver) = Driver::upstream(&mut env, &["--enable-controller-modify-volume"]).await
    else {
        return;
    };
    // Served and of this driver: RBAC is the only reason to refuse it.
    env.create(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttributesClass",
        "metadata": {"name": env.class("gold")}, "driverName": env.driver_name,
        "parameters": {"iops": "100"}}),
    )
    .await;
    let (go_user, go_config) = stock_rules_user(&env, "go", &[], &[]).await;
    // deploy/'s rule for the journal's ConfigMaps too: without it ours runs
    // without the journal (tests/drop_in.rs), which is not the point here.
    let (_, deploy_namespace_rules) = support::deploy_rules(&[]);
    let journal: Vec<Value> = deploy_namespace_rules
        .as_array()
        .into_iter()
        .flatten()
        .filter(|rule| rule["resources"] == json!(["configmaps"]))
        .cloned()
        .collect();
    assert_eq!(journal.len(), 1, "deploy/'s ConfigMap rule: {journal:?}");
    let (our_user, our_config) = stock_rules_user(&env, "rs", &[], &journal).await;
    env.expect_refusals(STOCK_RULES_LACK_VAC, VAC_REFUSED);
    let case = GateCase {
        flags: &["--v=5"],
        go_image: (go_bin, go_config),
        our_config: Some(our_config),
        our_line: "kept on, as the Go image keeps it",
        go_refusal: &["forbidden", "volumeattributesclasses"],
        // The 403 names the user: `User "go-…" cannot get resource`.
        replacements: [go_user, our_user]
            .into_iter()
            .map(|user| (format!("\"{user}\""), "\"USER\"".to_owned()))
            .collect(),
    };
    compare_the_gate(&mut env, &driver, case).await;
}

e2e_real!(ClusterConfig::standard();
    the_driver_socket_absent_at_start,
    the_driver_gone_while_running,
);

/// Stops the test's driver and removes its socket, as when its container
/// is gone.
async fn remove_driver(env: &mut Env) {
    env.stop_driver().await;
    match std::fs::remove_file(&env.driver.endpoint) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("remove the driver's socket: {e}"),
    }
}

/// The Go image's exit on a lost driver connection writes
/// `/dev/termination-log` (csi-lib-utils `connection.ExitOnConnectionLoss`),
/// which on a test machine run as root is the host's: the image runs in a
/// mount namespace of its own whose `/dev` is this folder of the test's
/// (with the host's `/dev/shm`). A script that does so, and the folder.
fn go_in_own_dev(env: &Env, go_bin: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dev = env.dir.path().join("go-dev");
    std::fs::create_dir_all(&dev).expect("go-dev");
    let script = env.dir.path().join("go-in-own-dev.sh");
    std::fs::write(
        &script,
        format!(
            // `/dev/shm` stays: the control plane's files are there.
            "#!/bin/sh\nmkdir -p '{0}/shm' && exec unshare --mount --propagation private sh -c 'mount --bind /dev/shm \"$0/shm\" && mount --rbind \"$0\" /dev && exec \"$@\"' '{0}' '{1}' \"$@\"\n",
            dev.display(),
            go_bin.display()
        ),
    )
    .expect("write the script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (script, dev)
}

/// An image started by [`Running::start`]: the Go image as a [`Sidecar`],
/// ours as `env`'s sidecar.
enum Running {
    Go(Sidecar),
    Rust,
}

impl Running {
    async fn start(
        env: &mut Env,
        image: Image,
        go_image: (&Path, &Path),
        flags: &[&str],
    ) -> Running {
        Running::start_as(env, image, go_image, None, flags).await
    }

    /// As [`Running::start`], ours with `our_config` (None: the
    /// harness's, of deploy/'s rules for `flags`).
    async fn start_as(
        env: &mut Env,
        image: Image,
        (go_bin, go_config): (&Path, &Path),
        our_config: Option<&Path>,
        flags: &[&str],
    ) -> Running {
        match (image, our_config) {
            (Image::Go, _) => Running::Go(start_go(env, go_config, go_bin, flags)),
            (Image::Rust, None) => {
                env.start_sidecar(flags).await;
                Running::Rust
            }
            (Image::Rust, Some(config)) => {
                env.start_sidecar_as(config, flags, &[]);
                Running::Rust
            }
        }
    }

    fn log(&self, env: &Env) -> String {
        match self {
            Running::Go(go) => go.log(),
            Running::Rust => env.logs(),
        }
    }

    /// The exit code once it ended; None while it runs.
    fn exited(&mut self, env: &mut Env) -> Option<i32> {
        match self {
            Running::Go(go) => go.wait_exit(Duration::ZERO),
            Running::Rust => env
                .sidecar
                .as_mut()
                .and_then(|child| child.try_wait())
                .map(|status| status.code().unwrap_or(-1)),
        }
    }

    /// Its exit code, waiting up to `timeout`.
    async fn exit_within(&mut self, env: &mut Env, timeout: Duration) -> i32 {
        let started = std::time::Instant::now();
        loop {
            if let Some(code) = self.exited(env) {
                return code;
            }
            assert!(
                started.elapsed() < timeout,
                "still running after {timeout:?}\n{}",
                tail(&self.log(env), 40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kill(&mut self, env: &mut Env) {
        match self {
            Running::Go(go) => go.kill(),
            Running::Rust => env.kill_sidecar(),
        }
    }
}

/// What each image logs while it waits for the socket: the Go image's
/// `connection.Connect` (csi-lib-utils, at `--v=5`), ours
/// `src/csi/connection.rs`.
fn waiting_line(image: Image) -> &'static str {
    match image {
        Image::Go => "\"Connecting\" address=\"unix://",
        Image::Rust => "still connecting to the CSI driver",
    }
}

/// Started without the driver's socket. Each image waits for it and, when
/// the driver comes a moment later, provisions. Absent for longer: the Go
/// image gives up after the 30 s of csi-lib-utils `connection.Connect`
/// (`WithTimeout(30s)`, whatever `--timeout` says) and exits 1 with
/// "context deadline exceeded" (`cmd/csi-provisioner/csi-provisioner.go`,
/// after `ctrl.Connect`); ours waits on (docs/design.md, "Deliberate
/// differences") and provisions once the driver is there.
async fn the_driver_socket_absent_at_start(backend: Backend) {
    let mut env = Env::new(backend).await;
    let Some((go_bin, go_config)) = go_image(&env).await else {
        return;
    };
    let go_image = (go_bin.as_path(), go_config.as_path());
    env.storage_class("plain", "Immediate", "Delete", json!({}))
        .await;
    for image in [Image::Go, Image::Rust] {
        remove_driver(&mut env).await;
        let mut running = Running::start(&mut env, image, go_image, &["--v=5"]).await;
        env.wait_for(
            &format!("{image:?} waiting for the socket"),
            Duration::from_secs(20),
            || async {
                running
                    .log(&env)
                    .contains(waiting_line(image))
                    .then_some(())
            },
        )
        .await;
        env.start_driver();
        let claim = format!("late-{}", image.short());
        env.create_pvc(&env.ns, &claim, "plain", "5Mi", json!({}))
            .await;
        bound(&env, &env.ns, &claim, &|env: &Env| running.log(env)).await;
        assert_eq!(running.exited(&mut env), None, "{image:?}");
        running.kill(&mut env);
        env.delete_pvc(&env.ns, &claim).await;
    }

    // Both at once, the socket absent for longer than the Go image waits
    // (each image provisions every claim of the driver: only one of them
    // may be running once the driver is back).
    remove_driver(&mut env).await;
    let started = std::time::Instant::now();
    let mut go = Running::start(&mut env, Image::Go, go_image, &["--v=5"]).await;
    let mut ours = Running::start(&mut env, Image::Rust, go_image, &["--v=5"]).await;
    let code = go.exit_within(&mut env, Duration::from_secs(60)).await;
    let waited = started.elapsed();
    let go_log = go.log(&env);
    assert_eq!(code, 1, "{go_log}");
    assert!(waited >= Duration::from_secs(30), "{waited:?}\n{go_log}");
    assert!(
        go_log
            .lines()
            .last()
            .is_some_and(|l| l.ends_with("context deadline exceeded")),
        "{go_log}"
    );
    assert!(
        go_log.contains("\"Still connecting\" address=\"unix://"),
        "{go_log}"
    );
    assert_eq!(
        ours.exited(&mut env),
        None,
        "ours waits on\n{}",
        ours.log(&env)
    );
    env.start_driver();
    env.create_pvc(&env.ns, "later", "plain", "5Mi", json!({}))
        .await;
    bound(&env, &env.ns, "later", &|env: &Env| ours.log(env)).await;
    assert_eq!(ours.exited(&mut env), None, "{}", ours.log(&env));
}

/// Both started with the driver there; the driver then stopped and its
/// socket removed for three times `--timeout`, then started again, and a
/// claim created. The Go image notices nothing until it calls the driver:
/// gRPC (pick-first) dials again only for a call, and csi-lib-utils's
/// dialer, asked to dial after having connected, runs the provisioner's
/// `connection.OnConnectionLoss(connection.ExitOnConnectionLoss())`
/// (`pkg/controller/controller.go`, `Connect`): "Lost connection to CSI
/// driver, exiting", exit 1, even though the driver is back; the claim is
/// provisioned by the Go image restarted (as the kubelet would). Ours
/// re-dials: `/readyz` fails while the driver is gone and the same process
/// provisions the claim (docs/design.md, "Deliberate differences").
async fn the_driver_gone_while_running(backend: Backend) {
    let mut env = Env::new(backend).await;
    let Some((go_bin, go_config)) = go_image(&env).await else {
        return;
    };
    let (contained_go, dev) = go_in_own_dev(&env, &go_bin);
    let go_image = (contained_go.as_path(), go_config.as_path());
    env.storage_class("plain", "Immediate", "Delete", json!({}))
        .await;
    const TIMEOUT: Duration = Duration::from_secs(2);
    for image in [Image::Go, Image::Rust] {
        let port = support::free_port();
        let http = format!("--http-endpoint=127.0.0.1:{port}");
        let flags = ["--v=5", "--timeout=2s", http.as_str()];
        let mut running = Running::start(&mut env, image, go_image, &flags).await;
        let short = image.short();
        let before = format!("before-{short}");
        env.create_pvc(&env.ns, &before, "plain", "5Mi", json!({}))
            .await;
        bound(&env, &env.ns, &before, &|env: &Env| running.log(env)).await;

        remove_driver(&mut env).await;
        let gone = std::time::Instant::now();
        env.wait_for(
            &format!("{image:?}: the driver gone for 3 × --timeout"),
            Duration::from_secs(20),
            || async {
                let ready = support::http_get(port, "/readyz").await.0 == 200;
                // The Go image serves no /readyz.
                let ready = ready && image == Image::Rust;
                (gone.elapsed() >= 3 * TIMEOUT && !ready).then_some(())
            },
        )
        .await;
        assert_eq!(
            running.exited(&mut env),
            None,
            "{image:?}: no call, no exit\n{}",
            running.log(&env)
        );
        env.start_driver();
        let after = format!("after-{short}");
        env.create_pvc(&env.ns, &after, "plain", "5Mi", json!({}))
            .await;
        match image {
            Image::Go => {
                let code = running.exit_within(&mut env, Duration::from_secs(30)).await;
                let log = running.log(&env);
                assert_eq!(code, 1, "{log}");
                assert!(
                    log.lines()
                        .last()
                        .is_some_and(|l| l.contains("\"Lost connection to CSI driver, exiting\"")),
                    "{log}"
                );
                assert_eq!(
                    std::fs::read_to_string(dev.join("termination-log"))
                        .ok()
                        .as_deref(),
                    Some("Lost connection to CSI driver, exiting"),
                );
                assert!(
                    env.pvc(&env.ns, &after)
                        .await
                        .and_then(|c| c.spec?.volume_name)
                        .is_none(),
                    "{log}"
                );
                // Restarted, as the kubelet would: it provisions.
                running = Running::start(&mut env, image, go_image, &flags).await;
                bound(&env, &env.ns, &after, &|env: &Env| running.log(env)).await;
            }
            Image::Rust => {
                bound(&env, &env.ns, &after, &|env: &Env| running.log(env)).await;
                env.wait_for("/readyz again", Duration::from_secs(30), || async {
                    (support::http_get(port, "/readyz").await.0 == 200).then_some(())
                })
                .await;
                assert_eq!(running.exited(&mut env), None, "{}", running.log(&env));
            }
        }
        for claim in [&before, &after] {
            env.delete_pvc(&env.ns, claim).await;
        }
        env.wait_for(
            "the run's volumes gone",
            Duration::from_secs(30),
            || async { env.backend_volumes().is_empty().then_some(()) },
        )
        .await;
        running.kill(&mut env);
    }
}
