use super::*;
use crate::provision::fixtures::{annotate, config, now, released_volume};

fn bound(policy: &str, finalizer: bool) -> PersistentVolume {
    let mut pv = released_volume();
    pv.status.as_mut().expect("status").phase = Some("Bound".into());
    pv.spec
        .as_mut()
        .expect("spec")
        .persistent_volume_reclaim_policy = Some(policy.into());
    if !finalizer {
        pv.metadata.finalizers = None;
    }
    pv
}

#[test]
fn finalizer_changes() {
    let gate_on = config();
    let gate_off = ProvisionerConfig {
        honor_pv_reclaim_policy: false,
        ..config()
    };
    let deleting = {
        let mut pv = bound("Delete", false);
        pv.metadata.deletion_timestamp = Some(now());
        pv
    };
    let released_without = {
        let mut pv = released_volume();
        pv.metadata.finalizers = None;
        pv
    };
    let other_driver = {
        let mut pv = bound("Retain", true);
        annotate(&mut pv.metadata, wk::ANN_PROVISIONED_BY, "other.csi");
        pv
    };
    let other_driver_missing = {
        let mut pv = bound("Delete", false);
        annotate(&mut pv.metadata, wk::ANN_PROVISIONED_BY, "other.csi");
        pv
    };
    let static_ours = {
        let mut pv = bound("Delete", false);
        pv.metadata.annotations = None;
        pv
    };
    let cases: Vec<(
        &str,
        PersistentVolume,
        &ProvisionerConfig,
        Option<FinalizerChange>,
    )> = vec![
        (
            "bound Delete without",
            bound("Delete", false),
            &gate_on,
            Some(FinalizerChange::Add),
        ),
        ("bound Delete with", bound("Delete", true), &gate_on, None),
        (
            "static CSI PV of ours once bound",
            static_ours,
            &gate_on,
            Some(FinalizerChange::Add),
        ),
        (
            "released without: not added any more",
            released_without,
            &gate_on,
            None,
        ),
        ("being deleted without: not added", deleting, &gate_on, None),
        (
            "Retain with",
            bound("Retain", true),
            &gate_on,
            Some(FinalizerChange::Remove),
        ),
        (
            "Recycle with",
            bound("Recycle", true),
            &gate_on,
            Some(FinalizerChange::Remove),
        ),
        ("Retain without", bound("Retain", false), &gate_on, None),
        (
            "gate off, with",
            bound("Delete", true),
            &gate_off,
            Some(FinalizerChange::Remove),
        ),
        (
            "gate off, released with",
            released_volume(),
            &gate_off,
            Some(FinalizerChange::Remove),
        ),
        ("gate off, without", bound("Delete", false), &gate_off, None),
        ("other driver's PV with it", other_driver, &gate_on, None),
        (
            "other driver's PV without it",
            other_driver_missing,
            &gate_on,
            None,
        ),
    ];
    for (name, pv, config, expected) in cases {
        assert_eq!(pv_finalizer_change(&pv, config), expected, "{name}");
    }
}

/// CSI migration: in-tree PVs migrated to our driver get and lose the
/// finalizer like our CSI PVs (upstream's observed gp2 PV carries it).
#[test]
fn migrated_volumes_have_the_finalizer_too() {
    use crate::provision::fixtures::{AWS_EBS_PLUGIN, ebs_config, migrated_volume};
    let bound_migrated = |policy: &str, finalizer: bool| {
        let mut pv = migrated_volume();
        pv.status.as_mut().expect("status").phase = Some("Bound".into());
        pv.spec
            .as_mut()
            .expect("spec")
            .persistent_volume_reclaim_policy = Some(policy.into());
        if !finalizer {
            pv.metadata.finalizers = None;
        }
        pv
    };
    let before_migrated_to = {
        let mut pv = bound_migrated("Delete", false);
        pv.metadata.annotations = Some(
            crate::provision::fixtures::map(&[(wk::ANN_PROVISIONED_BY, AWS_EBS_PLUGIN)]).into(),
        );
        pv
    };
    let ebs = ebs_config();
    let hostpath = config();
    let ebs_gate_off = ProvisionerConfig {
        honor_pv_reclaim_policy: false,
        ..ebs_config()
    };
    let cases: Vec<(
        &str,
        PersistentVolume,
        &ProvisionerConfig,
        Option<FinalizerChange>,
    )> = vec![
        (
            "bound, Delete, without",
            bound_migrated("Delete", false),
            &ebs,
            Some(FinalizerChange::Add),
        ),
        (
            "provisioned-by the in-tree name alone",
            before_migrated_to,
            &ebs,
            Some(FinalizerChange::Add),
        ),
        (
            "bound, Delete, with",
            bound_migrated("Delete", true),
            &ebs,
            None,
        ),
        (
            "Retain",
            bound_migrated("Retain", true),
            &ebs,
            Some(FinalizerChange::Remove),
        ),
        (
            "gate off",
            bound_migrated("Delete", true),
            &ebs_gate_off,
            Some(FinalizerChange::Remove),
        ),
        (
            "another driver leaves it alone",
            bound_migrated("Delete", false),
            &hostpath,
            None,
        ),
    ];
    for (name, pv, config, expected) in cases {
        assert_eq!(pv_finalizer_change(&pv, config), expected, "{name}");
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn removal_patch_tests_the_list_and_removes_by_index() {
    let current = strings(&["a", wk::FINALIZER_PV, "b"]);
    assert_eq!(
        remove_finalizer_patch(&current, wk::FINALIZER_PV),
        Some(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": ["a", wk::FINALIZER_PV, "b"]},
            {"op": "remove", "path": "/metadata/finalizers/1"},
        ]))
    );
    let duplicated = strings(&[wk::FINALIZER_PV, "a", wk::FINALIZER_PV]);
    assert_eq!(
        remove_finalizer_patch(&duplicated, wk::FINALIZER_PV),
        Some(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": duplicated},
            {"op": "remove", "path": "/metadata/finalizers/2"},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ]))
    );
    assert_eq!(
        remove_finalizer_patch(&strings(&["a"]), wk::FINALIZER_PV),
        None
    );
    assert_eq!(
        remove_finalizer_patch::<String>(&[], wk::FINALIZER_PV),
        None
    );
}

#[test]
fn addition_patch() {
    assert_eq!(
        add_finalizer_patch(Some(&strings(&["a"])), wk::FINALIZER_PV, "7"),
        Some(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
            {"op": "add", "path": "/metadata/finalizers/-", "value": wk::FINALIZER_PV},
        ]))
    );
    let created = Some(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/metadata/finalizers", "value": [wk::FINALIZER_PV]},
    ]));
    assert_eq!(
        add_finalizer_patch::<String>(None, wk::FINALIZER_PV, "7"),
        created
    );
    assert_eq!(
        add_finalizer_patch::<String>(Some(&[]), wk::FINALIZER_PV, "7"),
        created
    );
    assert_eq!(
        add_finalizer_patch(Some(&strings(&[wk::FINALIZER_PV])), wk::FINALIZER_PV, "7"),
        None
    );
}

/// Applies the RFC 6902 operations these patches use (test, add, remove on
/// JSON pointers without escapes), as the API server would: all or nothing.
fn apply(mut document: Value, patch: Value) -> Result<Value, String> {
    fn parent<'a>(document: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), String> {
        let (parent_path, last) = path.rsplit_once('/').ok_or("bad path")?;
        let parent = document.pointer_mut(parent_path).ok_or("missing parent")?;
        Ok((parent, last.to_owned()))
    }
    for operation in patch.as_array().ok_or("not a list")? {
        let path = operation["path"].as_str().ok_or("no path")?;
        match operation["op"].as_str() {
            Some("test") => {
                if document.pointer(path) != Some(&operation["value"]) {
                    return Err(format!("test of {path} failed"));
                }
            }
            Some("remove") => {
                let (parent, last) = parent(&mut document, path)?;
                let index: usize = last.parse().map_err(|_| "bad index")?;
                let list = parent.as_array_mut().ok_or("not a list")?;
                if index >= list.len() {
                    return Err("index out of range".into());
                }
                list.remove(index);
            }
            Some("add") => {
                let (parent, last) = parent(&mut document, path)?;
                let value = operation["value"].clone();
                match parent {
                    Value::Array(list) if last == "-" => list.push(value),
                    Value::Object(map) => {
                        map.insert(last, value);
                    }
                    _ => return Err("cannot add there".into()),
                }
            }
            _ => return Err("unknown op".into()),
        }
    }
    Ok(document)
}

/// The patches do what they say on the object they were computed from, and
/// fail on a changed one.
#[test]
fn patches_apply_only_to_fresh_state() {
    let object =
        json!({"metadata": {"resourceVersion": "7", "finalizers": ["a", wk::FINALIZER_PV]}});
    let remove = remove_finalizer_patch(&strings(&["a", wk::FINALIZER_PV]), wk::FINALIZER_PV)
        .expect("patch");
    assert_eq!(
        apply(object.clone(), remove.clone()),
        Ok(json!({"metadata": {"resourceVersion": "7", "finalizers": ["a"]}}))
    );
    let changed = json!({"metadata": {"finalizers": [wk::FINALIZER_PV, "a"]}});
    assert!(
        apply(changed, remove).is_err(),
        "a stale list must not be patched"
    );

    let bare = json!({"metadata": {"resourceVersion": "7"}});
    let add = add_finalizer_patch::<String>(None, wk::FINALIZER_PV, "7").expect("patch");
    assert_eq!(
        apply(bare, add.clone()),
        Ok(json!({"metadata": {"resourceVersion": "7", "finalizers": [wk::FINALIZER_PV]}}))
    );
    let newer = json!({"metadata": {"resourceVersion": "8", "finalizers": ["x"]}});
    assert!(
        apply(newer, add).is_err(),
        "a newer object must not be patched"
    );
}

#[test]
fn a_uid_guard_comes_first_and_keeps_the_patch() {
    let patch = remove_finalizer_patch(&["a", wk::FINALIZER_PV], wk::FINALIZER_PV).expect("patch");
    let guarded = guard_uid(patch.clone(), "u1");
    let ops = guarded.as_array().expect("array");
    assert_eq!(
        ops[0],
        serde_json::json!({"op": "test", "path": "/metadata/uid", "value": "u1"})
    );
    assert_eq!(&ops[1..], patch.as_array().expect("array").as_slice());
}
