use super::*;
use serde_json::json;

fn vol(id: &str, bytes: i64) -> Listed {
    Listed {
        volume_id: id.to_owned(),
        capacity_bytes: bytes,
        volume_context: BTreeMap::new(),
    }
}

fn with_context(id: &str, context: &[(&str, &str)]) -> Listed {
    Listed {
        volume_context: context
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..vol(id, 0)
    }
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

fn ids(volumes: &[Listed]) -> Vec<&str> {
    volumes.iter().map(|v| v.volume_id.as_str()).collect()
}

/// The default naming: `--volume-name-prefix=pvc`, no uuid length, no
/// name templates.
fn pvc() -> Naming {
    naming("pvc", None, false)
}

fn naming(prefix: &str, uuid_length: Option<usize>, templates: bool) -> Naming {
    Naming {
        prefix: prefix.to_owned(),
        uuid_length,
        templates,
    }
}

fn run(
    listed: &[Listed],
    named: &[&str],
    in_flight: &[&str],
    previous: Option<&[&str]>,
) -> Outcome {
    run_as(&pvc(), listed, named, in_flight, previous)
}

fn run_as(
    naming: &Naming,
    listed: &[Listed],
    named: &[&str],
    in_flight: &[&str],
    previous: Option<&[&str]>,
) -> Outcome {
    let named = set(named);
    let in_flight = set(in_flight);
    let previous = previous.map(set);
    audit(Inputs {
        listed,
        named: &named,
        in_flight: &in_flight,
        previous: previous.as_ref(),
        naming,
    })
}

/// A claim uid as the API server writes it.
const UID: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

/// Every combination of the four facts about one listed volume, at a first
/// audit and at a later one: only a volume no PV names, that no operation in
/// flight may be making, whose names do not show only other prefixes, and
/// that was a suspect at the previous audit is an orphan. A volume of
/// another prefix is counted, never a suspect.
#[test]
fn every_combination_of_one_volume() {
    let ours = format!("pvc-{UID}");
    let other = format!("other-{UID}");
    for (id, made) in [
        (UID, MadeBy::Unknown),
        (ours.as_str(), MadeBy::OurPrefix),
        (other.as_str(), MadeBy::OtherPrefixes),
    ] {
        assert_eq!(made_by(&vol(id, 1), &pvc()), made, "{id}");
        for named in [false, true] {
            for in_flight in [false, true] {
                for was_suspect in [false, true] {
                    for first in [false, true] {
                        let listed = [vol(id, 1)];
                        let named_ids: &[&str] = if named { &[id] } else { &[] };
                        let flight: &[&str] = if in_flight { &[id] } else { &[] };
                        let previous: &[&str] = if was_suspect { &[id] } else { &[] };
                        let out = run(&listed, named_ids, flight, (!first).then_some(previous));
                        let case = format!(
                            "made={made:?} named={named} in_flight={in_flight} \
                             was_suspect={was_suspect} first={first}"
                        );
                        let left_out = !named && !in_flight && made == MadeBy::OtherPrefixes;
                        let suspect = !named && !in_flight && !left_out;
                        let orphan = suspect && was_suspect && !first;
                        assert_eq!(out.suspects.contains(id), suspect, "{case}");
                        assert_eq!(out.orphans.len(), usize::from(orphan), "{case}");
                        assert_eq!(
                            out.awaiting_confirmation,
                            usize::from(suspect && !orphan),
                            "{case}"
                        );
                        assert_eq!(out.confirmed, !first, "{case}");
                        assert_eq!(out.listed, 1, "{case}");
                        assert_eq!(out.named, usize::from(named), "{case}");
                        assert_eq!(out.in_flight, usize::from(!named && in_flight), "{case}");
                        assert_eq!(out.other_prefix, usize::from(left_out), "{case}");
                    }
                }
            }
        }
    }
}

/// The names a volume shows, in its id and its volume context's values,
/// and who made it by them, for each naming of this sidecar.
#[test]
fn who_made_a_volume_by_the_names_it_shows() {
    use MadeBy::{OtherPrefixes as Other, OurPrefix as Ours, Unknown};
    let upper = UID.to_ascii_uppercase();
    let nfs = |prefix: &str| format!("nfs-server.default.svc.cluster.local#share#{prefix}-{UID}#");
    let cases: Vec<(&str, Listed, Naming, MadeBy)> = vec![
        // The hostpath driver: a generated uuid, no context.
        ("bare uuid id", vol(UID, 1), pvc(), Unknown),
        (
            "bare uuid in the context",
            with_context(UID, &[("id", UID)]),
            pvc(),
            Unknown,
        ),
        (
            "a uuid after a lone dash",
            vol(&format!("/-{UID}"), 1),
            pvc(),
            Unknown,
        ),
        (
            "a generated id",
            vol("vol-0123456789abcdef0", 1),
            pvc(),
            Unknown,
        ),
        ("empty", vol("", 1), pvc(), Unknown),
        // democratic-csi: the name is the id.
        ("the name as id", vol(&format!("pvc-{UID}"), 1), pvc(), Ours),
        (
            "another prefix as id",
            vol(&format!("other-{UID}"), 1),
            pvc(),
            Other,
        ),
        // csi-driver-nfs: `server#share#name#`.
        ("nfs, ours", vol(&nfs("pvc"), 1), pvc(), Ours),
        ("nfs, another prefix", vol(&nfs("other"), 1), pvc(), Other),
        (
            "nfs with a subdirectory",
            vol(&format!("10.0.0.1#/exports#team/pvc-{UID}#"), 1),
            pvc(),
            Ours,
        ),
        // The name echoed into the context.
        (
            "the name in the context",
            with_context(
                UID,
                &[("csi.storage.k8s.io/pv/name", &format!("pvc-{UID}"))],
            ),
            pvc(),
            Ours,
        ),
        (
            "another prefix in the context",
            with_context(UID, &[("csi.storage.k8s.io/pv/name", &format!("b-{UID}"))]),
            pvc(),
            Other,
        ),
        (
            "a name as a context key is not read",
            with_context(UID, &[(&format!("pvc-{UID}"), "x")]),
            pvc(),
            Unknown,
        ),
        (
            "ours anywhere wins over others",
            with_context(&format!("other-{UID}"), &[("name", &format!("pvc-{UID}"))]),
            pvc(),
            Ours,
        ),
        (
            "several other prefixes",
            with_context(&format!("a-{UID}"), &[("name", &format!("b-{UID}"))]),
            pvc(),
            Other,
        ),
        // The prefix is the whole token before the uuid.
        (
            "a longer prefix",
            vol(&format!("my-pvc-{UID}"), 1),
            pvc(),
            Other,
        ),
        (
            "a prefix with dots",
            vol(&format!("a.pvc-{UID}"), 1),
            pvc(),
            Other,
        ),
        (
            "our prefix with dots",
            vol(&format!("x#cluster.a-{UID}"), 1),
            naming("cluster.a", None, false),
            Ours,
        ),
        // What is not `<prefix>-<uuid>` is no name.
        (
            "an uppercase uuid",
            vol(&format!("pvc-{upper}"), 1),
            pvc(),
            Unknown,
        ),
        (
            "an uppercase uuid of another prefix",
            vol(&format!("other-{upper}"), 1),
            pvc(),
            Unknown,
        ),
        (
            "a suffix after the uuid",
            vol(&format!("pvc-{UID}.img"), 1),
            pvc(),
            Unknown,
        ),
        (
            "a dash after the uuid",
            vol(&format!("other-{UID}-snap"), 1),
            pvc(),
            Unknown,
        ),
        (
            "a short uuid",
            vol(&format!("other-{}", &UID[1..]), 1),
            pvc(),
            Unknown,
        ),
        (
            "a uuid without dashes",
            vol(&format!("other-{}", UID.replace('-', "")), 1),
            pvc(),
            Unknown,
        ),
        (
            "dashes out of place",
            vol("other-0a1b2c3d4-e5f-4a6b-8c7d-9e0f1a2b3c4d", 1),
            pvc(),
            Unknown,
        ),
        (
            "not hex",
            vol("other-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4g", 1),
            pvc(),
            Unknown,
        ),
        // `--volume-name-uuid-length`: the uid without dashes, cut.
        (
            "cut to 8",
            vol("pvc-0a1b2c3d", 1),
            naming("pvc", Some(8), false),
            Ours,
        ),
        (
            "cut, too short",
            vol("pvc-0a1b2c3", 1),
            naming("pvc", Some(8), false),
            Unknown,
        ),
        (
            "cut, too long",
            vol("pvc-0a1b2c3d4", 1),
            naming("pvc", Some(8), false),
            Unknown,
        ),
        (
            "cut, not hex",
            vol("pvc-0a1b2c3g", 1),
            naming("pvc", Some(8), false),
            Unknown,
        ),
        (
            "cut, uppercase",
            vol("pvc-0A1B2C3D", 1),
            naming("pvc", Some(8), false),
            Unknown,
        ),
        ("cut, no length set", vol("pvc-0a1b2c3d", 1), pvc(), Unknown),
        (
            "cut, another prefix: its length is unknown",
            vol("other-0a1b2c3d", 1),
            naming("pvc", Some(8), false),
            Unknown,
        ),
        (
            "a length set, a whole uuid",
            vol(&format!("pvc-{UID}"), 1),
            naming("pvc", Some(8), false),
            Ours,
        ),
        (
            "a length set, another prefix with a whole uuid",
            vol(&format!("other-{UID}"), 1),
            naming("pvc", Some(8), false),
            Other,
        ),
        (
            "length 0 makes no name",
            vol("pvc-", 1),
            naming("pvc", Some(0), false),
            Unknown,
        ),
        // Names with other prefixes prove nothing when this sidecar's
        // names may have any prefix, or cannot be found.
        (
            "name templates, another prefix",
            vol(&format!("team-a-data-{UID}"), 1),
            naming("pvc", None, true),
            Unknown,
        ),
        (
            "name templates, ours",
            vol(&format!("pvc-{UID}"), 1),
            naming("pvc", None, true),
            Ours,
        ),
        (
            "a prefix no PV name can hold",
            vol(&format!("other-{UID}"), 1),
            naming("PVC", None, false),
            Unknown,
        ),
        (
            "a prefix no PV name can hold, its own names",
            vol(&format!("PVC-{UID}"), 1),
            naming("PVC", None, false),
            Unknown,
        ),
    ];
    for (case, volume, naming, want) in cases {
        assert_eq!(
            made_by(&volume, &naming),
            want,
            "{case}: {volume:?} {naming:?}"
        );
    }
}

/// The names `volume_name` (src/provision/plan.rs) makes are found as this
/// sidecar's, and as another prefix's by a sidecar with another prefix
/// (except cut ones: another sidecar's length is unknown).
#[test]
fn the_names_the_provisioner_makes_are_found() {
    for prefix in ["pvc", "cluster-a", "a.b", "x"] {
        for length in [None, Some(1), Some(8), Some(16), Some(32)] {
            let name = crate::provision::volume_name(prefix, UID, length).expect("a name");
            let ours = naming(prefix, length, false);
            let case = format!("{name} ({prefix}, {length:?})");
            for volume in [
                vol(&name, 1),
                vol(&format!("server#share#{name}#"), 1),
                with_context(UID, &[("csi.storage.k8s.io/pv/name", &name)]),
            ] {
                assert_eq!(made_by(&volume, &ours), MadeBy::OurPrefix, "{case}");
                let theirs = naming("another", length, false);
                let want = match length {
                    None => MadeBy::OtherPrefixes,
                    Some(_) => MadeBy::Unknown,
                };
                assert_eq!(made_by(&volume, &theirs), want, "{case}, seen by another");
            }
        }
    }
}

/// Many volumes: those of other prefixes are counted, never suspects, and
/// the two-audit rule holds for the rest, ours and unknown alike.
#[test]
fn volumes_of_other_prefixes_are_left_out_and_the_rest_confirmed_twice() {
    let ours = format!("pvc-{UID}");
    let other = format!("other-{UID}");
    let nfs_other = format!("srv#share#b-{UID}#");
    let listed = [
        vol(&ours, 1),
        vol(&other, 2),
        vol(UID, 3),
        vol(&nfs_other, 4),
        vol("named", 5),
    ];
    let first = run(&listed, &["named"], &[], None);
    assert_eq!(first.other_prefix, 2);
    assert_eq!(first.suspects, set(&[&ours, UID]));
    assert_eq!(first.awaiting_confirmation, 2);
    assert!(first.orphans.is_empty());
    let previous: Vec<&str> = first.suspects.iter().map(String::as_str).collect();
    let second = run(&listed, &["named"], &[], Some(&previous));
    assert_eq!(ids(&second.orphans), [UID, ours.as_str()]);
    assert_eq!(second.other_prefix, 2);
    assert_eq!((second.listed, second.named), (5, 1));
    // Even remembered as a suspect (the same process cannot, but the rule
    // does not rest on it), another prefix's volume is no orphan.
    let third = run(&listed, &["named"], &[], Some(&[&other, &nfs_other]));
    assert!(third.orphans.is_empty());
    assert_eq!(third.other_prefix, 2);
    // With name templates every volume of a name counts.
    let templates = naming("pvc", None, true);
    let all = run_as(&templates, &listed, &["named"], &[], Some(&[]));
    assert_eq!(all.other_prefix, 0);
    assert_eq!(all.suspects.len(), 4);
}

#[test]
fn naming_comes_from_the_provisioner_config() {
    let mut config = crate::provision::ProvisionerConfig::with_defaults("d".to_owned());
    assert_eq!(Naming::of(&config), naming("pvc", None, false));
    config.volume_name_prefix = "cluster-a".to_owned();
    config.volume_name_uuid_length = Some(8);
    config.claim_metadata_propagation = true;
    assert_eq!(Naming::of(&config), naming("cluster-a", Some(8), true));
}

#[test]
fn a_first_audit_reports_nothing_and_remembers_its_suspects() {
    let listed = [vol("a", 1), vol("b", 2), vol("c", 3)];
    let out = run(&listed, &["b"], &[], None);
    assert!(!out.confirmed);
    assert!(out.orphans.is_empty());
    assert_eq!(out.suspects, set(&["a", "c"]));
    assert_eq!(out.awaiting_confirmation, 2);
}

#[test]
fn a_suspect_twice_is_an_orphan_and_a_new_one_waits() {
    let listed = [vol("old", 1), vol("new", 2)];
    let out = run(&listed, &[], &[], Some(&["old"]));
    assert!(out.confirmed);
    assert_eq!(ids(&out.orphans), ["old"]);
    assert_eq!(out.suspects, set(&["old", "new"]));
    assert_eq!(out.awaiting_confirmation, 1);
}

/// A volume being provisioned: listed before its PV was saved (a suspect),
/// then named by its PV at the next audit: never an orphan.
#[test]
fn a_volume_whose_pv_appears_is_dropped() {
    let listed = [vol("v", 1)];
    let first = run(&listed, &[], &[], Some(&[]));
    assert_eq!(first.suspects, set(&["v"]));
    assert!(first.orphans.is_empty());
    let previous: Vec<&str> = first.suspects.iter().map(String::as_str).collect();
    let second = run(&listed, &["v"], &[], Some(&previous));
    assert!(second.orphans.is_empty());
    assert!(second.suspects.is_empty());
    assert_eq!(second.named, 1);
}

/// A volume being deleted: listed after its PV went, gone at the next
/// audit: a suspect once, never reported.
#[test]
fn a_volume_deleted_meanwhile_is_never_reported() {
    let first = run(&[vol("v", 1)], &[], &[], Some(&[]));
    let previous: Vec<&str> = first.suspects.iter().map(String::as_str).collect();
    let second = run(&[], &[], &[], Some(&previous));
    assert!(second.orphans.is_empty());
    assert!(second.suspects.is_empty());
}

#[test]
fn an_operation_in_flight_is_matched_by_id_or_by_context() {
    let listed = [
        vol("pvc-1", 1),
        with_context("uuid-2", &[("csi.example.com/name", "pvc-2")]),
        with_context("uuid-3", &[("name", "pvc-other")]),
        // The name as a key is not the name as a value.
        with_context("uuid-4", &[("pvc-4", "x")]),
    ];
    let out = run(
        &listed,
        &[],
        &["pvc-1", "pvc-2", "pvc-4"],
        Some(&["pvc-1", "uuid-2", "uuid-3", "uuid-4"]),
    );
    assert_eq!(out.in_flight, 2);
    assert_eq!(ids(&out.orphans), ["uuid-3", "uuid-4"]);
}

#[test]
fn duplicate_and_empty_ids_are_counted_once_or_not_at_all() {
    // A driver whose pages overlap (volumes created between pages) lists
    // a volume twice; an entry without an id names nothing.
    let listed = [vol("a", 1), vol("", 5), vol("a", 1), vol("b", 2)];
    let out = run(&listed, &[], &[], Some(&["a", "b", ""]));
    assert_eq!(out.listed, 2);
    assert_eq!(ids(&out.orphans), ["a", "b"]);
    assert_eq!(out.suspects, set(&["a", "b"]));
}

#[test]
fn orphans_are_sorted_by_id() {
    let listed = [vol("c", 1), vol("a", 1), vol("b", 1)];
    let out = run(&listed, &[], &[], Some(&["a", "b", "c"]));
    assert_eq!(ids(&out.orphans), ["a", "b", "c"]);
}

#[test]
fn nothing_listed_finds_nothing() {
    let out = run(&[], &["x"], &["y"], Some(&["z"]));
    assert_eq!(
        out,
        Outcome {
            confirmed: true,
            ..Outcome::default()
        }
    );
}

#[test]
fn total_bytes_counts_what_the_driver_gave() {
    let cases: &[(&[i64], Option<u64>)] = &[
        (&[], Some(0)),
        (&[5, 7], Some(12)),
        // Unknown capacities count nothing...
        (&[5, 0, -1], Some(5)),
        // ...and with none known there is no total at all.
        (&[0], None),
        (&[0, -3], None),
        (&[i64::MAX, i64::MAX, i64::MAX], Some(u64::MAX)),
    ];
    for (capacities, want) in cases {
        let orphans: Vec<Listed> = capacities
            .iter()
            .enumerate()
            .map(|(i, b)| vol(&i.to_string(), *b))
            .collect();
        assert_eq!(total_bytes(&orphans), *want, "{capacities:?}");
    }
}

fn pv(spec: serde_json::Value) -> PersistentVolume {
    serde_json::from_value(json!({"metadata": {"name": "pv"}, "spec": spec})).expect("pv")
}

#[test]
fn which_pvs_name_a_volume_of_this_driver() {
    let driver = "ebs.csi.aws.com";
    let cases = [
        (
            "CSI, this driver",
            pv(json!({"csi": {"driver": driver, "volumeHandle": "vol-1"}})),
            Some("vol-1"),
        ),
        (
            "CSI, another driver",
            pv(json!({"csi": {"driver": "other.example.com", "volumeHandle": "vol-1"}})),
            None,
        ),
        (
            "CSI, empty handle",
            pv(json!({"csi": {"driver": driver, "volumeHandle": ""}})),
            None,
        ),
        (
            "in-tree, migrated to this driver",
            pv(json!({"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-2"}})),
            Some("vol-2"),
        ),
        (
            "in-tree, migrated to another driver",
            pv(json!({"gcePersistentDisk": {"pdName": "disk-1"}})),
            None,
        ),
        (
            "in-tree, not translatable",
            pv(json!({"awsElasticBlockStore": {"volumeID": ""}})),
            None,
        ),
        ("no source", pv(json!({})), None),
    ];
    for (case, pv, want) in cases {
        assert_eq!(named_handle(&pv, driver).as_deref(), want, "{case}");
    }
    let no_spec: PersistentVolume =
        serde_json::from_value(json!({"metadata": {"name": "pv"}})).expect("pv");
    assert_eq!(named_handle(&no_spec, driver), None, "no spec");
}

#[test]
fn report_names() {
    assert_eq!(
        report_name("hostpath.csi.k8s.io", None),
        "hostpath-csi-k8s-io-orphan-audit"
    );
    assert_eq!(
        report_name("hostpath.csi.k8s.io", Some("")),
        "hostpath-csi-k8s-io-orphan-audit"
    );
    assert_eq!(
        report_name("hostpath.csi.k8s.io", Some("node-1.example")),
        "hostpath-csi-k8s-io-orphan-audit-node-1.example"
    );
    let long = report_name("d.example.com", Some(&"n".repeat(300)));
    assert_eq!(long.len(), 253);
    let cut = report_name("d", Some(&format!("{}.-x", "n".repeat(230))));
    assert!(
        !cut.ends_with(['-', '.']) && cut.len() <= 253,
        "a valid name: {cut}"
    );
}

fn header() -> ReportHeader<'static> {
    ReportHeader {
        driver: "hostpath.csi.k8s.io",
        volume_name_prefix: "pvc",
        audited_at: "2026-11-29T16:00:00Z",
        interval: "6h0m0s",
    }
}

fn summary_of(data: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let summary: serde_json::Value =
        serde_yaml_ng::from_str(&data["summary"]).expect("the summary is YAML");
    summary
        .as_object()
        .expect("a map")
        .iter()
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            (k.clone(), v)
        })
        .collect()
}

#[test]
fn the_report_states_the_audit_and_lists_each_orphan() {
    let other = format!("other-{UID}");
    let listed = [
        with_context("b", &[("k", "v \"quoted\"")]),
        vol("a", 5 << 20),
        vol("named", 1),
        vol(&other, 7),
    ];
    let out = run(&listed, &["named"], &[], Some(&["a", "b", &other]));
    let data = report_data(&header(), &out, ReportLimits::default());
    let summary = summary_of(&data);
    for (key, want) in [
        ("driver", "hostpath.csi.k8s.io"),
        ("volumeNamePrefix", "pvc"),
        ("auditedAt", "2026-11-29T16:00:00Z"),
        ("interval", "6h0m0s"),
        ("listed", "4"),
        ("namedByPVs", "1"),
        ("inFlight", "0"),
        ("madeByOtherPrefixes", "1"),
        ("orphans", "2"),
        ("orphanBytes", "5242880"),
        ("shown", "2"),
        ("notShown", "0"),
        ("awaitingConfirmation", "0"),
    ] {
        assert_eq!(summary.get(key).map(String::as_str), Some(want), "{key}");
    }
    assert!(summary["howToDelete"].contains("Orphan audit"));
    let lines: Vec<serde_json::Value> = data["orphans"]
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(
        lines,
        [
            json!({"volumeId": "a", "capacityBytes": 5 << 20, "volumeContext": {}}),
            json!({"volumeId": "b", "volumeContext": {"k": "v \"quoted\""}}),
        ]
    );
}

#[test]
fn the_report_is_bounded_in_entries_and_in_bytes() {
    let listed: Vec<Listed> = (0..50).map(|i| vol(&format!("v{i:02}"), 1)).collect();
    let all: Vec<String> = listed.iter().map(|v| v.volume_id.clone()).collect();
    let previous: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = run(&listed, &[], &[], Some(&previous));
    assert_eq!(out.orphans.len(), 50);
    let by_entries = report_data(
        &header(),
        &out,
        ReportLimits {
            max_entries: 10,
            max_bytes: 1 << 20,
        },
    );
    assert_eq!(by_entries["orphans"].lines().count(), 10);
    let summary = summary_of(&by_entries);
    assert_eq!(
        (
            summary["orphans"].as_str(),
            summary["shown"].as_str(),
            summary["notShown"].as_str()
        ),
        ("50", "10", "40")
    );
    let line = report_line(&out.orphans[0]).len() + 1;
    let by_bytes = report_data(
        &header(),
        &out,
        ReportLimits {
            max_entries: 1000,
            max_bytes: 3 * line + 1,
        },
    );
    assert_eq!(by_bytes["orphans"].lines().count(), 3);
    assert!(by_bytes["orphans"].len() <= 3 * line + 1);
    assert_eq!(summary_of(&by_bytes)["notShown"], "47");
    // The defaults keep a ConfigMap far below its 1 MiB.
    let limits = ReportLimits::default();
    assert!(limits.max_bytes <= 512 * 1024 && limits.max_entries > 0);
}

#[test]
fn a_report_without_orphans_or_capacities() {
    let none = report_data(
        &header(),
        &run(&[], &[], &[], Some(&[])),
        ReportLimits::default(),
    );
    assert_eq!(none["orphans"], "");
    let summary = summary_of(&none);
    assert_eq!(
        (summary["orphans"].as_str(), summary["orphanBytes"].as_str()),
        ("0", "0")
    );
    let unknown = run(&[vol("a", 0)], &[], &[], Some(&["a"]));
    let summary = summary_of(&report_data(&header(), &unknown, ReportLimits::default()));
    assert_eq!(summary["orphanBytes"], "unknown");
}
