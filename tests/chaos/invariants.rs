//! What must hold once a chaos run is quiet, as a pure function of what
//! the API server and the backend hold and of what the workload did. Every
//! rule is a way to lose money (a leaked backend volume) or data (a
//! deleted volume that should have been kept, a claim in use removed).

use std::collections::BTreeMap;

use crate::plan::{Class, Reclaim};

pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

#[derive(Debug, Clone, Default)]
pub struct BackendVolume {
    pub id: String,
    /// The CreateVolume name: `pvc-<claim uid>`.
    pub name: String,
}

#[derive(Debug, Clone, Default)]
pub struct PvFact {
    pub name: String,
    pub handle: String,
    pub reclaim: String,
    pub claim_uid: Option<String>,
    pub phase: String,
    pub deleting: bool,
    pub finalizers: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ClaimFact {
    pub name: String,
    pub uid: String,
    pub phase: String,
    pub volume_name: Option<String>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
}

/// What the API server and the backend hold (the run's driver and
/// namespace only).
#[derive(Debug, Clone, Default)]
pub struct World {
    /// The backend's volumes by volume id, their one key: a claim
    /// provisioned twice shows as two volumes of one name, which a map by
    /// name would hide ([`backend_violations`]).
    pub backend: BTreeMap<String, BackendVolume>,
    pub pvs: Vec<PvFact>,
    pub claims: Vec<ClaimFact>,
    /// The write-ahead journal's entries.
    pub journal: Vec<JournalFact>,
}

/// What the workload did to one claim.
#[derive(Debug, Clone)]
pub struct ClaimRecord {
    pub name: String,
    pub uid: String,
    pub class: Class,
    pub deleted: bool,
    /// The claim was Bound when the workload deleted it: its Retain volume
    /// exists and must survive.
    pub bound_at_deletion: bool,
}

/// What the workload did to one StatefulSet (claims `data-<name>-<ordinal>`).
#[derive(Debug, Clone)]
pub struct SetRecord {
    pub name: String,
    /// The last `spec.replicas`.
    pub replicas: u32,
    /// Ordinals `0..ordinals` ever had a claim.
    pub ordinals: u32,
    pub when_scaled: Reclaim,
    pub when_deleted: Reclaim,
    pub deleted: bool,
}

/// A claim that must still be there, the very object the workload made
/// (same uid), whenever it is checked: a StatefulSet's claim of a live
/// replica, one kept on scale-down (`whenScaled: Retain`) or after its
/// set's deletion (`whenDeleted: Retain`). Its volume is the user's data:
/// a claim deleted by mistake and made anew by the StatefulSet controller
/// (or the runner playing it) has the same name and an empty volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptClaim {
    pub uid: String,
    /// Why it must be kept, for the message.
    pub why: String,
}

/// Every claim of `kept` (by name) that is gone, being deleted, or
/// another object than the one kept. Checked before the StatefulSet
/// controller's part makes missing claims again.
pub fn kept_violations(world: &World, kept: &BTreeMap<String, KeptClaim>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, claim) in kept {
        match world.claims.iter().find(|c| &c.name == name) {
            None => out.push(format!("claim {name} ({}) is gone: data lost", claim.why)),
            Some(c) if c.uid != claim.uid => out.push(format!(
                "claim {name} ({}) was deleted and made anew (uid {} is now {}): data lost",
                claim.why, claim.uid, c.uid
            )),
            Some(c) if c.deleting => out.push(format!(
                "claim {name} ({}) is being deleted: data lost",
                claim.why
            )),
            Some(_) => {}
        }
    }
    out
}

/// One entry of the write-ahead journal, as its ConfigMaps hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalFact {
    /// The claim's uid (the entry's key).
    pub uid: String,
    /// `namespace/name` of the claim.
    pub claim: String,
    pub volume_name: String,
}

/// After a graceful shutdown: no journal entry outlives its saved PV (the
/// next start would replay it, and once the claim and the PV are gone,
/// make the volume again to delete it). An entry whose PV is not saved yet
/// is in flight and must stay.
pub fn journal_violations(entries: &[JournalFact], pvs: &[PvFact]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|entry| {
            let pv = pvs.iter().find(|pv| {
                pv.claim_uid.as_deref() == Some(entry.uid.as_str()) || pv.name == entry.volume_name
            })?;
            Some(format!(
                "journal entry of claim {} (uid {}) outlived the sidecar's graceful exit though its PV {} is saved",
                entry.claim, entry.uid, pv.name
            ))
        })
        .collect()
}

/// A CSIStorageCapacity object of the run's driver.
#[derive(Debug, Clone, Default)]
pub struct CapacityFact {
    pub name: String,
    pub class: String,
    /// `capacity` in bytes (`None`: absent, or not a quantity).
    pub capacity: Option<u64>,
    /// `maximumVolumeSize` in bytes.
    pub maximum: Option<u64>,
}

/// With capacity tracking, once quiet: exactly one object for each class
/// of `classes` (the run's WaitForFirstConsumer classes, on its one node)
/// showing what the driver's `GetCapacity` answers now (`free` bytes, as
/// capacity and as the largest volume), and none for another class. A
/// `GetCapacity` that failed (a fault) may leave an object stale for a
/// while, never for good.
pub fn capacity_violations(objects: &[CapacityFact], classes: &[String], free: u64) -> Vec<String> {
    let mut out = Vec::new();
    for class in classes {
        let of_class: Vec<&CapacityFact> = objects.iter().filter(|o| &o.class == class).collect();
        match of_class.as_slice() {
            [] => out.push(format!(
                "class {class} has no CSIStorageCapacity object: lost"
            )),
            [object] => {
                if object.capacity != Some(free) || object.maximum != Some(free) {
                    out.push(format!(
                        "CSIStorageCapacity {} of class {class} shows capacity {:?}, maximumVolumeSize {:?}; the driver has {free} bytes free: stale",
                        object.name, object.capacity, object.maximum
                    ));
                }
            }
            many => {
                let names: Vec<&str> = many.iter().map(|o| o.name.as_str()).collect();
                out.push(format!(
                    "class {class} has {} CSIStorageCapacity objects {names:?}: duplicated",
                    many.len()
                ));
            }
        }
    }
    for object in objects {
        if !classes.contains(&object.class) {
            out.push(format!(
                "CSIStorageCapacity {} is of class {}, which needs none",
                object.name, object.class
            ));
        }
    }
    out
}

/// The StatefulSet retention rules (KEP-1847) at quiescence.
pub fn set_violations(world: &World, sets: &[SetRecord]) -> Vec<String> {
    let mut out = Vec::new();
    for set in sets {
        for ordinal in 0..set.ordinals.max(set.replicas) {
            let name = format!("data-{}-{ordinal}", set.name);
            let claim = world.claims.iter().find(|c| c.name == name);
            let kept = claim.is_some_and(|c| !c.deleting);
            if set.deleted {
                if set.when_deleted == Reclaim::Delete && claim.is_some() {
                    out.push(format!(
                        "claim {name} of deleted set {} stays (whenDeleted: Delete)",
                        set.name
                    ));
                }
            } else if ordinal < set.replicas {
                if !kept {
                    out.push(format!(
                        "set {} has {} replicas and no claim {name}",
                        set.name, set.replicas
                    ));
                }
            } else if set.when_scaled == Reclaim::Delete && claim.is_some() {
                out.push(format!(
                    "condemned claim {name} of set {} (replicas {}) stays (whenScaled: Delete)",
                    set.name, set.replicas
                ));
            }
        }
    }
    out
}

/// The backend's volumes by id, from a list of them.
pub fn by_id(volumes: impl IntoIterator<Item = BackendVolume>) -> BTreeMap<String, BackendVolume> {
    volumes.into_iter().map(|v| (v.id.clone(), v)).collect()
}

/// What is wrong with the backend's volumes on their own: two of one name
/// (the CreateVolume name is the claim's, `pvc-<uid>`: one claim
/// provisioned twice), or a record under another id than its own.
pub fn backend_violations(backend: &BTreeMap<String, BackendVolume>) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_name: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (id, volume) in backend {
        if *id != volume.id {
            out.push(format!(
                "backend volume {id} records the id {}: keyed wrong",
                volume.id
            ));
        }
        by_name
            .entry(volume.name.as_str())
            .or_default()
            .push(id.as_str());
    }
    for (name, ids) in by_name {
        if ids.len() > 1 {
            out.push(format!(
                "{} backend volumes have the name {name}: {ids:?}",
                ids.len()
            ));
        }
    }
    out
}

/// Every rule `world` breaks, one sentence each; empty when all hold.
pub fn violations(world: &World, claims: &[ClaimRecord]) -> Vec<String> {
    let mut out = backend_violations(&world.backend);
    let pvs_by_handle = count_by(world.pvs.iter().map(|pv| pv.handle.as_str()));
    for volume in world.backend.values() {
        match pvs_by_handle.get(volume.id.as_str()).copied().unwrap_or(0) {
            1 => {}
            0 => out.push(format!(
                "backend volume {} ({}) has no PV: leaked",
                volume.id, volume.name
            )),
            n => out.push(format!(
                "backend volume {} is recorded in {n} PVs",
                volume.id
            )),
        }
    }
    for pv in &world.pvs {
        if !world.backend.contains_key(&pv.handle) {
            out.push(format!(
                "PV {} ({}) names backend volume {} which does not exist: orphaned or deleted while kept",
                pv.name, pv.reclaim, pv.handle
            ));
        }
        if pv.deleting {
            out.push(format!(
                "PV {} is being deleted and stays, finalizers {:?}",
                pv.name, pv.finalizers
            ));
        } else if pv.reclaim == "Delete" && !pv.finalizers.iter().any(|f| f == PV_FINALIZER) {
            out.push(format!(
                "PV {} (Delete) lacks the finalizer {PV_FINALIZER}",
                pv.name
            ));
        }
    }
    // Nothing is in flight once quiet: every entry is done (PV saved, or
    // the volume known gone) and its removal written (at most the
    // journal's idle flush later). One left would be replayed by every
    // start (issue 22).
    for entry in &world.journal {
        out.push(format!(
            "journal entry of claim {} (uid {}) stays at quiescence",
            entry.claim, entry.uid
        ));
    }
    for claim in &world.claims {
        if claim.deleting {
            out.push(format!(
                "claim {} is being deleted and stays, finalizers {:?}",
                claim.name, claim.finalizers
            ));
        } else if claim.phase != "Bound" && !claims.iter().any(|r| r.uid == claim.uid) {
            out.push(format!(
                "claim {} is {} at quiescence, not Bound",
                claim.name, claim.phase
            ));
        }
    }
    for record in claims {
        out.extend(claim_violations(world, record));
    }
    out
}

fn claim_violations(world: &World, record: &ClaimRecord) -> Vec<String> {
    let mut out = Vec::new();
    let name = &record.name;
    let pvs: Vec<&PvFact> = world
        .pvs
        .iter()
        .filter(|pv| pv.claim_uid.as_deref() == Some(record.uid.as_str()))
        .collect();
    let volume_name = format!("pvc-{}", record.uid);
    let volumes = world
        .backend
        .values()
        .filter(|v| v.name == volume_name)
        .count();
    if pvs.len() > 1 {
        let names: Vec<&str> = pvs.iter().map(|pv| pv.name.as_str()).collect();
        out.push(format!("claim {name} got {} PVs: {names:?}", pvs.len()));
    }
    if volumes > 1 {
        out.push(format!("claim {name} got {volumes} backend volumes"));
    }
    let live = world.claims.iter().find(|c| c.uid == record.uid);
    match (record.deleted, record.class.reclaim) {
        (false, _) => match live {
            None => out.push(format!("claim {name} was never deleted and is gone")),
            Some(claim) if claim.phase != "Bound" => out.push(format!(
                "claim {name} is {} at quiescence, not Bound",
                claim.phase
            )),
            Some(claim) => {
                let bound = claim.volume_name.as_deref();
                if !pvs.iter().any(|pv| Some(pv.name.as_str()) == bound) {
                    out.push(format!(
                        "claim {name} is bound to {bound:?}, which is not a PV of its uid"
                    ));
                }
            }
        },
        (true, Reclaim::Delete) => {
            if let Some(claim) = live.filter(|c| !c.deleting) {
                out.push(format!("claim {} was deleted and is back", claim.name));
            }
            for pv in &pvs {
                out.push(format!(
                    "PV {} (Delete) of deleted claim {name} stays ({})",
                    pv.name, pv.phase
                ));
            }
            if volumes > 0 && pvs.is_empty() {
                // Reported above as a leak too; this names the claim.
                out.push(format!(
                    "backend volume {volume_name} of deleted claim {name} (Delete) stays"
                ));
            }
        }
        (true, Reclaim::Retain) => {
            if record.bound_at_deletion && pvs.is_empty() {
                out.push(format!(
                    "claim {name} (Retain) was Bound when deleted and its PV is gone"
                ));
            }
            if record.bound_at_deletion && volumes == 0 {
                out.push(format!(
                    "claim {name} (Retain) was Bound when deleted and its backend volume is gone: data lost"
                ));
            }
        }
    }
    out
}

/// The rule that holds while a pod uses `claim`: the claim is there (a
/// deletion waits for the pod) and keeps its protection finalizer.
pub fn protection_violation(name: &str, claim: Option<&ClaimFact>) -> Option<String> {
    match claim {
        None => Some(format!("claim {name} in use by a pod was removed")),
        Some(c) if !c.finalizers.iter().any(|f| f == PVC_PROTECTION) => Some(format!(
            "claim {name} in use by a pod lost {PVC_PROTECTION} (finalizers {:?})",
            c.finalizers
        )),
        Some(_) => None,
    }
}

fn count_by<'a>(keys: impl Iterator<Item = &'a str>) -> BTreeMap<&'a str, usize> {
    let mut counts = BTreeMap::new();
    for key in keys {
        *counts.entry(key).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Binding;

    const DELETE: Class = Class::new(Binding::Immediate, Reclaim::Delete);
    const RETAIN: Class = Class::new(Binding::Immediate, Reclaim::Retain);

    fn pv(name: &str, handle: &str, reclaim: &str, uid: &str) -> PvFact {
        PvFact {
            name: name.to_owned(),
            handle: handle.to_owned(),
            reclaim: reclaim.to_owned(),
            claim_uid: Some(uid.to_owned()),
            phase: "Bound".to_owned(),
            deleting: false,
            finalizers: vec![PV_FINALIZER.to_owned()],
        }
    }

    fn volume(id: &str, uid: &str) -> BackendVolume {
        BackendVolume {
            id: id.to_owned(),
            name: format!("pvc-{uid}"),
        }
    }

    fn claim(name: &str, uid: &str, volume: &str) -> ClaimFact {
        ClaimFact {
            name: name.to_owned(),
            uid: uid.to_owned(),
            phase: "Bound".to_owned(),
            volume_name: Some(volume.to_owned()),
            deleting: false,
            finalizers: vec![PVC_PROTECTION.to_owned()],
        }
    }

    fn record(name: &str, uid: &str, class: Class, deleted: bool) -> ClaimRecord {
        ClaimRecord {
            name: name.to_owned(),
            uid: uid.to_owned(),
            class,
            deleted,
            bound_at_deletion: deleted,
        }
    }

    fn healthy() -> (World, Vec<ClaimRecord>) {
        let world = World {
            backend: by_id([volume("v1", "u1"), volume("v2", "u2")]),
            pvs: vec![
                pv("pvc-u1", "v1", "Delete", "u1"),
                pv("pvc-u2", "v2", "Retain", "u2"),
            ],
            claims: vec![claim("a", "u1", "pvc-u1")],
            journal: vec![],
        };
        let claims = vec![
            record("a", "u1", DELETE, false),
            record("b", "u2", RETAIN, true),
        ];
        (world, claims)
    }

    #[test]
    fn a_consistent_world_breaks_nothing() {
        let (mut world, claims) = healthy();
        world.pvs[1].phase = "Released".to_owned();
        assert_eq!(violations(&world, &claims), Vec::<String>::new());
    }

    /// Each broken world names its rule; a harness whose checks cannot fail
    /// proves nothing.
    #[test]
    fn every_rule_fires_on_its_own_breakage() {
        type Breakage = fn(&mut World, &mut Vec<ClaimRecord>);
        let cases: [(&str, Breakage); 16] = [
            ("keyed wrong", |w, _| {
                w.backend.insert("v8".to_owned(), volume("v9", "u9"));
            }),
            ("has no PV: leaked", |w, _| {
                w.backend.insert("v9".to_owned(), volume("v9", "u9"));
            }),
            // One claim provisioned twice: two ids, one name.
            ("claim a got 2 backend volumes", |w, _| {
                w.backend.insert("v1b".to_owned(), volume("v1b", "u1"));
            }),
            ("2 backend volumes have the name pvc-u1", |w, _| {
                w.backend.insert("v1b".to_owned(), volume("v1b", "u1"));
            }),
            ("recorded in 2 PVs", |w, _| {
                w.pvs.push(pv("pvc-x", "v1", "Delete", "ux"))
            }),
            ("which does not exist", |w, _| {
                w.backend.remove("v2");
            }),
            ("is being deleted and stays", |w, _| {
                w.pvs[0].deleting = true
            }),
            ("lacks the finalizer", |w, _| w.pvs[0].finalizers.clear()),
            ("claim a is being deleted", |w, _| {
                w.claims[0].deleting = true
            }),
            ("got 2 PVs", |w, _| {
                w.backend.insert("v3".to_owned(), volume("v3", "u1"));
                w.pvs.push(pv("pvc-u1b", "v3", "Delete", "u1"))
            }),
            ("never deleted and is gone", |w, _| w.claims.clear()),
            ("not Bound", |w, _| w.claims[0].phase = "Pending".to_owned()),
            ("of deleted claim a stays", |w, c| {
                w.claims.clear();
                c[0].deleted = true
            }),
            ("its PV is gone", |w, _| {
                w.pvs.retain(|pv| pv.reclaim != "Retain")
            }),
            ("data lost", |w, _| {
                w.backend.remove("v2");
            }),
            ("stays at quiescence", |w, _| {
                w.journal.push(JournalFact {
                    uid: "u1".to_owned(),
                    claim: "ns/a".to_owned(),
                    volume_name: "pvc-u1".to_owned(),
                })
            }),
        ];
        for (want, breakage) in cases {
            let (mut world, mut claims) = healthy();
            breakage(&mut world, &mut claims);
            let found = violations(&world, &claims);
            assert!(
                found.iter().any(|v| v.contains(want)),
                "want a violation with {want:?}, got {found:?}"
            );
        }
    }

    #[test]
    fn a_deleted_delete_claim_leaves_nothing() {
        let world = World {
            backend: by_id([volume("v1", "u1")]),
            ..World::default()
        };
        let found = violations(&world, &[record("a", "u1", DELETE, true)]);
        assert!(found.iter().any(|v| v.contains("leaked")), "{found:?}");
        assert!(
            found.iter().any(|v| v.contains("(Delete) stays")),
            "{found:?}"
        );
    }

    #[test]
    fn statefulset_claims_follow_their_retention_policy() {
        let set = |replicas, ordinals, when_scaled, when_deleted, deleted| SetRecord {
            name: "s".to_owned(),
            replicas,
            ordinals,
            when_scaled,
            when_deleted,
            deleted,
        };
        let world = |names: &[&str]| World {
            claims: names
                .iter()
                .map(|n| claim(n, &format!("uid-{n}"), "pv"))
                .collect(),
            ..World::default()
        };
        use Reclaim::{Delete, Retain};
        let cases: [(&str, SetRecord, &[&str], Option<&str>); 8] = [
            (
                "scaled to 1 of 2, kept",
                set(1, 2, Retain, Delete, false),
                &["data-s-0", "data-s-1"],
                None,
            ),
            (
                "scaled to 1 of 2, deleted",
                set(1, 2, Delete, Retain, false),
                &["data-s-0"],
                None,
            ),
            (
                "scaled, Delete, stays",
                set(1, 2, Delete, Retain, false),
                &["data-s-0", "data-s-1"],
                Some("condemned claim data-s-1"),
            ),
            (
                "a replica without its claim",
                set(2, 2, Retain, Retain, false),
                &["data-s-0"],
                Some("no claim data-s-1"),
            ),
            (
                "set deleted, Retain",
                set(2, 2, Delete, Retain, true),
                &["data-s-0", "data-s-1"],
                None,
            ),
            (
                "set deleted, Delete, all gone",
                set(2, 2, Retain, Delete, true),
                &[],
                None,
            ),
            (
                "set deleted, Delete, one stays",
                set(2, 3, Retain, Delete, true),
                &["data-s-2"],
                Some("of deleted set s stays"),
            ),
            (
                "another set's claims are not ours",
                set(0, 1, Delete, Delete, false),
                &["data-t-0"],
                None,
            ),
        ];
        for (what, record, claims, want) in cases {
            let found = set_violations(&world(claims), &[record]);
            match want {
                None => assert!(found.is_empty(), "{what}: {found:?}"),
                Some(text) => assert!(found.iter().any(|v| v.contains(text)), "{what}: {found:?}"),
            }
        }
    }

    /// Each way the published capacity can be wrong is named; the right
    /// one passes.
    #[test]
    fn capacity_objects_must_show_the_drivers_capacity() {
        let classes = ["wffc-a".to_owned(), "wffc-b".to_owned()];
        let object = |name: &str, class: &str, bytes: u64| CapacityFact {
            name: name.to_owned(),
            class: class.to_owned(),
            capacity: Some(bytes),
            maximum: Some(bytes),
        };
        let good = vec![object("x", "wffc-a", 100), object("y", "wffc-b", 100)];
        assert_eq!(
            capacity_violations(&good, &classes, 100),
            Vec::<String>::new()
        );
        let stale_maximum = {
            let mut objects = good.clone();
            objects[1].maximum = Some(200);
            objects
        };
        let cases: [(&str, Vec<CapacityFact>); 5] = [
            (
                "stale",
                vec![object("x", "wffc-a", 100), object("y", "wffc-b", 99)],
            ),
            ("stale", stale_maximum),
            ("lost", vec![object("x", "wffc-a", 100)]),
            (
                "duplicated",
                vec![
                    object("x", "wffc-a", 100),
                    object("y", "wffc-b", 100),
                    object("z", "wffc-b", 100),
                ],
            ),
            (
                "needs none",
                vec![
                    object("x", "wffc-a", 100),
                    object("y", "wffc-b", 100),
                    object("i", "immediate", 100),
                ],
            ),
        ];
        for (want, objects) in cases {
            let found = capacity_violations(&objects, &classes, 100);
            assert!(
                found.iter().any(|v| v.contains(want)),
                "want {want:?}, got {found:?}"
            );
        }
    }

    #[test]
    fn a_kept_claim_must_be_the_same_object() {
        let world = World {
            claims: vec![claim("data-s-0", "u1", "pvc-u1")],
            ..World::default()
        };
        let kept = |uid: &str| {
            BTreeMap::from([(
                "data-s-0".to_owned(),
                KeptClaim {
                    uid: uid.to_owned(),
                    why: "whenScaled: Retain".to_owned(),
                },
            )])
        };
        assert_eq!(kept_violations(&world, &kept("u1")), Vec::<String>::new());
        let replaced = kept_violations(&world, &kept("u0"));
        assert!(
            replaced.iter().any(|v| v.contains("made anew")),
            "{replaced:?}"
        );
        let gone = kept_violations(&World::default(), &kept("u1"));
        assert!(gone.iter().any(|v| v.contains("is gone")), "{gone:?}");
        let mut deleting = world.clone();
        deleting.claims[0].deleting = true;
        let found = kept_violations(&deleting, &kept("u1"));
        assert!(
            found.iter().any(|v| v.contains("being deleted")),
            "{found:?}"
        );
    }

    #[test]
    fn no_journal_entry_outlives_its_saved_pv() {
        let entry = |uid: &str| JournalFact {
            uid: uid.to_owned(),
            claim: format!("ns/{uid}"),
            volume_name: format!("pvc-{uid}"),
        };
        let pvs = [pv("pvc-u1", "v1", "Delete", "u1")];
        // In flight: no PV yet.
        assert!(journal_violations(&[entry("u2")], &pvs).is_empty());
        let found = journal_violations(&[entry("u1"), entry("u2")], &pvs);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("uid u1"), "{found:?}");
    }

    #[test]
    fn a_claim_in_use_keeps_its_protection() {
        let mut c = claim("a", "u1", "pvc-u1");
        assert_eq!(protection_violation("a", Some(&c)), None);
        c.deleting = true;
        assert_eq!(protection_violation("a", Some(&c)), None);
        c.finalizers.clear();
        assert!(protection_violation("a", Some(&c)).is_some());
        assert!(protection_violation("a", None).is_some());
    }
}
