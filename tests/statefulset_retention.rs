//! End-to-end: StatefulSet PVC retention (gate StatefulSetAutoDeletePVC,
//! KEP-1847 test plan) with the real binary, the API test server (garbage
//! collector on) and the hostpath driver. The test server has no
//! StatefulSet controller, so the tests play it: they create the set, its
//! claims (from the template) and its pods, scale by updating
//! `spec.replicas` and deleting the condemned pods themselves.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::without_controllers(&["statefulset"]);
    scale_down_deletes_the_condemned_claim_only_with_when_scaled_delete,
    condemned_claim_whose_pod_is_already_gone_is_deleted_directly,
    deleting_the_set_deletes_claims_only_with_when_deleted_delete,
    orphan_deletion_keeps_the_claims,
    manual_pod_deletion_never_deletes_a_claim,
    policy_flips_update_references,
    gate_off_makes_no_api_writes,
    a_claim_matched_by_name_only_is_never_deleted,
);

e2e_real!(ClusterConfig::standard();
    the_controller_manager_with_a_claim_matched_by_name_only,
);

const GATE: &str = "--feature-gates=StatefulSetAutoDeletePVC=true";
const CLASS: &str = "fast";
const WAIT: Duration = Duration::from_secs(30);

/// An owner reference as the tests compare it: kind, name, and whether it is
/// a controller reference with blockOwnerDeletion.
type Ref = (String, String, bool);

fn set_ref(name: &str) -> Ref {
    ("StatefulSet".into(), name.into(), true)
}

fn pod_ref(name: &str) -> Ref {
    ("Pod".into(), name.into(), true)
}

async fn env_with_class(backend: Backend) -> Env {
    let env = Env::new(backend).await;
    env.storage_class(CLASS, "Immediate", "Delete", json!({}))
        .await;
    env
}

/// Creates a StatefulSet with one claim template `data` of class `fast`.
async fn create_set(
    env: &Env,
    name: &str,
    replicas: i32,
    scaled: &str,
    deleted: &str,
) -> StatefulSet {
    let set: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": env.ns},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "busybox"}]},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": env.class(CLASS),
                    "resources": {"requests": {"storage": "1Mi"}},
                },
            }],
            "persistentVolumeClaimRetentionPolicy": {"whenScaled": scaled, "whenDeleted": deleted},
        },
    }))
    .expect("set json");
    Api::<StatefulSet>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &set)
        .await
        .expect("create set")
}

/// What the StatefulSet controller does for one ordinal: the claim from the
/// template, then the pod (scheduled, controlled by the set, using it).
async fn create_member(env: &Env, set: &StatefulSet, ordinal: i32) {
    let name = set.metadata.name.clone().expect("set name");
    let uid = set.metadata.uid.clone().expect("set uid");
    let claim = format!("data-{name}-{ordinal}");
    if env.pvc(&env.ns, &claim).await.is_none() {
        env.create_pvc(
            &env.ns,
            &claim,
            CLASS,
            "1Mi",
            json!({"metadata": {"labels": {"app": name}}}),
        )
        .await;
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{name}-{ordinal}"),
            "namespace": env.ns,
            "labels": {"app": name},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": uid,
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "nodeName": env.node.as_str(),
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .expect("pod json");
    Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

async fn create_members(env: &Env, set: &StatefulSet, ordinals: std::ops::Range<i32>) {
    let name = set.metadata.name.clone().expect("set name");
    for ordinal in ordinals {
        create_member(env, set, ordinal).await;
        env.wait_bound(&env.ns, &format!("data-{name}-{ordinal}"))
            .await;
    }
}

async fn patch_set(env: &Env, name: &str, spec: serde_json::Value) {
    Api::<StatefulSet>::namespaced(env.client.clone(), &env.ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .expect("patch set");
}

async fn scale(env: &Env, name: &str, replicas: i32) {
    patch_set(env, name, json!({"replicas": replicas})).await;
}

async fn set_policy(env: &Env, name: &str, scaled: &str, deleted: &str) {
    patch_set(
        env,
        name,
        json!({"persistentVolumeClaimRetentionPolicy": {"whenScaled": scaled, "whenDeleted": deleted}}),
    )
    .await;
}

async fn delete_pod(env: &Env, name: &str) {
    Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
}

async fn delete_set(env: &Env, name: &str, policy: PropagationPolicy) {
    let params = DeleteParams {
        propagation_policy: Some(policy),
        ..DeleteParams::default()
    };
    Api::<StatefulSet>::namespaced(env.client.clone(), &env.ns)
        .delete(name, &params)
        .await
        .expect("delete set");
}

/// The claim's owner references, `None` when the claim is gone.
async fn refs(env: &Env, claim: &str) -> Option<Vec<Ref>> {
    let pvc = env.pvc(&env.ns, claim).await?;
    Some(
        pvc.metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|r| {
                let strict = r.controller == Some(true) && r.block_owner_deletion == Some(true);
                (r.kind, r.name, strict)
            })
            .collect(),
    )
}

async fn wait_refs(env: &Env, claim: &str, want: &[Ref]) {
    let what = format!("claim {claim} owned by exactly {want:?}");
    env.wait_for(&what, WAIT, || async {
        (refs(env, claim).await? == want).then_some(())
    })
    .await;
}

async fn wait_gone(env: &Env, claim: &str) {
    let what = format!("claim {claim} deleted");
    env.wait_for(&what, WAIT, || async {
        env.pvc(&env.ns, claim).await.is_none().then_some(())
    })
    .await;
}

/// Every claim deleted above had its PV and backend volume deleted too.
async fn wait_backend_matches_claims(env: &Env, claims: usize) {
    env.wait_for("backend volumes of deleted claims gone", WAIT, || async {
        // Read the driver's state directly: `Env::backend_volumes` panics
        // when a volume file vanishes between listing and reading it, which
        // happens while the driver is deleting; here that is just "not yet".
        let backend = csi_hostpath::backend_volumes(&env.driver.state_dir).ok()?;
        (backend.len() == claims && env.pvs().await.len() == claims).then_some(())
    })
    .await;
    // The backend's records are one per volume id; two of one CSI name
    // (one claim provisioned twice) would still count as two claims above.
    let mut names: Vec<String> = env.backend_volumes().into_iter().map(|v| v.name).collect();
    names.sort();
    let count = names.len();
    names.dedup();
    assert_eq!(
        names.len(),
        count,
        "two backend volumes of one name: {:#?}",
        env.backend_volumes()
    );
    env.assert_consistent().await;
}

/// How many lines of the sidecar's log say `message` about `claim` (the
/// retention loop logs every decision with the claim's `namespace/name`).
fn decisions_about(env: &Env, claim: &str, message: &str) -> usize {
    let field = support::log_field("claim", &format!("{}/{claim}", env.ns));
    env.logs()
        .lines()
        .filter(|l| l.contains(message) && l.split_whitespace().any(|w| w == field))
        .count()
}

/// KEP-1847: scaling down deletes the condemned claim only with
/// whenScaled=Delete; the claims in range are never touched.
async fn scale_down_deletes_the_condemned_claim_only_with_when_scaled_delete(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[GATE]).await;
    // (set, whenScaled, whenDeleted)
    let sets = [
        ("del", "Delete", "Retain"),
        ("both", "Delete", "Delete"),
        ("keep", "Retain", "Retain"),
        ("own", "Retain", "Delete"),
    ];
    for (name, scaled, deleted) in sets {
        let set = create_set(&env, name, 2, scaled, deleted).await;
        create_members(&env, &set, 0..2).await;
    }
    for ordinal in 0..2 {
        wait_refs(&env, &format!("data-del-{ordinal}"), &[]).await;
        wait_refs(&env, &format!("data-keep-{ordinal}"), &[]).await;
        wait_refs(&env, &format!("data-both-{ordinal}"), &[set_ref("both")]).await;
        wait_refs(&env, &format!("data-own-{ordinal}"), &[set_ref("own")]).await;
    }

    for (name, _, _) in sets {
        scale(&env, name, 1).await;
    }
    // Before the pod goes: a condemned claim is owned by its pod alone
    // (whenScaled=Delete), or keeps what whenDeleted says.
    wait_refs(&env, "data-del-1", &[pod_ref("del-1")]).await;
    wait_refs(&env, "data-both-1", &[pod_ref("both-1")]).await;
    wait_refs(&env, "data-own-1", &[set_ref("own")]).await;
    for (name, _, _) in sets {
        delete_pod(&env, &format!("{name}-1")).await;
    }
    wait_gone(&env, "data-del-1").await;
    wait_gone(&env, "data-both-1").await;

    // The retained ones are still there, with the same owners.
    assert_eq!(refs(&env, "data-keep-1").await, Some(vec![]));
    assert_eq!(refs(&env, "data-own-1").await, Some(vec![set_ref("own")]));
    for name in ["del", "keep"] {
        assert_eq!(refs(&env, &format!("data-{name}-0")).await, Some(vec![]));
    }
    for name in ["both", "own"] {
        assert_eq!(
            refs(&env, &format!("data-{name}-0")).await,
            Some(vec![set_ref(name)])
        );
    }
    wait_backend_matches_claims(&env, 6).await;
}

/// A condemned claim whose pod went away before it could own the claim
/// (here: the sidecar was down during the scale-down) is deleted directly,
/// once the live set confirms the scale-down; never with whenScaled=Retain.
async fn condemned_claim_whose_pod_is_already_gone_is_deleted_directly(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[GATE]).await;
    let del = create_set(&env, "del", 3, "Delete", "Retain").await;
    let keep = create_set(&env, "keep", 3, "Retain", "Delete").await;
    create_members(&env, &del, 0..3).await;
    create_members(&env, &keep, 0..3).await;
    wait_refs(&env, "data-keep-2", &[set_ref("keep")]).await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());

    for name in ["del", "keep"] {
        scale(&env, name, 1).await;
        delete_pod(&env, &format!("{name}-1")).await;
        delete_pod(&env, &format!("{name}-2")).await;
    }
    assert!(
        env.pvc(&env.ns, "data-del-1").await.is_some(),
        "nobody owned it yet"
    );
    env.start_sidecar(&[GATE]).await;
    wait_gone(&env, "data-del-1").await;
    wait_gone(&env, "data-del-2").await;
    // whenScaled=Retain: kept, still owned by the set only.
    for ordinal in 0..3 {
        assert_eq!(
            refs(&env, &format!("data-keep-{ordinal}")).await,
            Some(vec![set_ref("keep")])
        );
    }
    assert!(env.pvc(&env.ns, "data-del-0").await.is_some());
    assert!(
        env.logs().contains("deleting the claim"),
        "the direct deletion is logged\n{}",
        env.logs()
    );
    wait_backend_matches_claims(&env, 4).await;
}

/// KEP-1847: deleting the set deletes its claims (through the garbage
/// collector and our owner references) only with whenDeleted=Delete.
async fn deleting_the_set_deletes_claims_only_with_when_deleted_delete(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[GATE]).await;
    let sets = [
        ("own", "Retain", "Delete"),
        ("both", "Delete", "Delete"),
        ("keep", "Retain", "Retain"),
        ("del", "Delete", "Retain"),
    ];
    for (name, scaled, deleted) in sets {
        let set = create_set(&env, name, 2, scaled, deleted).await;
        create_members(&env, &set, 0..2).await;
    }
    for name in ["own", "both"] {
        for ordinal in 0..2 {
            wait_refs(&env, &format!("data-{name}-{ordinal}"), &[set_ref(name)]).await;
        }
    }
    for (name, _, _) in sets {
        delete_set(&env, name, PropagationPolicy::Background).await;
    }
    for name in ["own", "both"] {
        for ordinal in 0..2 {
            wait_gone(&env, &format!("data-{name}-{ordinal}")).await;
        }
    }
    // The pods go with their sets (the garbage collector, in the background:
    // on a real cluster the claims above may be gone before the last pod of
    // another set); the retained claims stay, unowned.
    env.wait_for("pods collected with their sets", WAIT, || async {
        Api::<Pod>::namespaced(env.client.clone(), &env.ns)
            .list(&Default::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    for name in ["keep", "del"] {
        for ordinal in 0..2 {
            assert_eq!(
                refs(&env, &format!("data-{name}-{ordinal}")).await,
                Some(vec![])
            );
        }
    }
    wait_backend_matches_claims(&env, 4).await;
}

/// A set deleted with orphan propagation leaves its claims (and pods)
/// behind, and the sidecar does not take them over.
async fn orphan_deletion_keeps_the_claims(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[GATE]).await;
    let set = create_set(&env, "web", 2, "Delete", "Delete").await;
    create_members(&env, &set, 0..2).await;
    wait_refs(&env, "data-web-0", &[set_ref("web")]).await;
    wait_refs(&env, "data-web-1", &[set_ref("web")]).await;

    delete_set(&env, "web", PropagationPolicy::Orphan).await;
    env.wait_for("set gone", WAIT, || async {
        Api::<StatefulSet>::namespaced(env.client.clone(), &env.ns)
            .get_opt("web")
            .await
            .expect("get set")
            .is_none()
            .then_some(())
    })
    .await;
    // Something the sidecar must do after the orphaning, to know it has
    // seen it: a new set's claim gets its reference.
    let marker = create_set(&env, "marker", 1, "Retain", "Delete").await;
    create_members(&env, &marker, 0..1).await;
    wait_refs(&env, "data-marker-0", &[set_ref("marker")]).await;

    for ordinal in 0..2 {
        assert_eq!(
            refs(&env, &format!("data-web-{ordinal}")).await,
            Some(vec![]),
            "orphaned claims keep existing, unowned\n{}",
            env.logs()
        );
        assert!(
            Api::<Pod>::namespaced(env.client.clone(), &env.ns)
                .get_opt(&format!("web-{ordinal}"))
                .await
                .expect("get pod")
                .is_some(),
            "orphaned pods stay"
        );
    }
    env.assert_consistent().await;
}

/// Deleting a pod by hand (it is not a scale-down: its ordinal is in range)
/// never deletes its claim, whatever the policy.
async fn manual_pod_deletion_never_deletes_a_claim(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[GATE]).await;
    let both = create_set(&env, "both", 2, "Delete", "Delete").await;
    let del = create_set(&env, "del", 2, "Delete", "Retain").await;
    create_members(&env, &both, 0..2).await;
    create_members(&env, &del, 0..2).await;
    wait_refs(&env, "data-both-1", &[set_ref("both")]).await;

    delete_pod(&env, "both-1").await;
    delete_pod(&env, "del-1").await;
    // A scale-down in the same namespace afterwards: once its claim is gone,
    // the sidecar has certainly seen the pod deletions above.
    let marker = create_set(&env, "marker", 2, "Delete", "Retain").await;
    create_members(&env, &marker, 0..2).await;
    scale(&env, "marker", 1).await;
    wait_refs(&env, "data-marker-1", &[pod_ref("marker-1")]).await;
    delete_pod(&env, "marker-1").await;
    wait_gone(&env, "data-marker-1").await;

    assert_eq!(refs(&env, "data-both-1").await, Some(vec![set_ref("both")]));
    assert_eq!(refs(&env, "data-del-1").await, Some(vec![]));
    // The StatefulSet controller re-creates the pods; nothing changes. A
    // pod's creation queues its set: once the loop has decided again about
    // both claims after that (and found them up to date), it has seen the
    // new pods; only then is "nothing changed" worth checking.
    const UP_TO_DATE: &str = "owner references up to date";
    let seen = [
        decisions_about(&env, "data-both-1", UP_TO_DATE),
        decisions_about(&env, "data-del-1", UP_TO_DATE),
    ];
    create_member(&env, &both, 1).await;
    create_member(&env, &del, 1).await;
    env.wait_for(
        "both sets decided again after their pods were re-created",
        WAIT,
        || async {
            (decisions_about(&env, "data-both-1", UP_TO_DATE) > seen[0]
                && decisions_about(&env, "data-del-1", UP_TO_DATE) > seen[1])
                .then_some(())
        },
    )
    .await;
    assert_eq!(refs(&env, "data-both-1").await, Some(vec![set_ref("both")]));
    assert_eq!(refs(&env, "data-del-1").await, Some(vec![]));
    // Four claims of both and del, one of marker.
    wait_backend_matches_claims(&env, 5).await;
}

/// A policy change is applied to every existing claim, in both directions
/// and both fields.
async fn policy_flips_update_references(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[GATE]).await;
    let set = create_set(&env, "web", 3, "Retain", "Retain").await;
    create_members(&env, &set, 0..3).await;
    // The set scaled to 1 with pods 1 and 2 still terminating: both
    // condemned, their pods still there.
    scale(&env, "web", 1).await;
    // (whenScaled, whenDeleted, claim 0 refs, condemned claims' refs)
    /// The wanted references of a condemned claim, given its pod's name.
    type Condemned = fn(&str) -> Vec<Ref>;
    let steps: [(&str, &str, Vec<Ref>, Condemned); 6] = [
        ("Retain", "Retain", vec![], |_| vec![]),
        ("Retain", "Delete", vec![set_ref("web")], |_| {
            vec![set_ref("web")]
        }),
        ("Delete", "Delete", vec![set_ref("web")], |pod| {
            vec![pod_ref(pod)]
        }),
        ("Delete", "Retain", vec![], |pod| vec![pod_ref(pod)]),
        ("Retain", "Delete", vec![set_ref("web")], |_| {
            vec![set_ref("web")]
        }),
        ("Retain", "Retain", vec![], |_| vec![]),
    ];
    for (scaled, deleted, first, condemned) in steps {
        set_policy(&env, "web", scaled, deleted).await;
        wait_refs(&env, "data-web-0", &first).await;
        wait_refs(&env, "data-web-1", &condemned("web-1")).await;
        wait_refs(&env, "data-web-2", &condemned("web-2")).await;
    }
    // Scaling back up brings the condemned claims back under the set.
    set_policy(&env, "web", "Delete", "Delete").await;
    wait_refs(&env, "data-web-2", &[pod_ref("web-2")]).await;
    scale(&env, "web", 3).await;
    for ordinal in 0..3 {
        wait_refs(&env, &format!("data-web-{ordinal}"), &[set_ref("web")]).await;
    }
    env.assert_consistent().await;
}

/// Gate off: the loop does not exist; not a single write to claims, not
/// even a watch of StatefulSets or pods.
async fn gate_off_makes_no_api_writes(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[]).await;
    let set = create_set(&env, "web", 2, "Delete", "Delete").await;
    create_members(&env, &set, 0..2).await;
    scale(&env, "web", 1).await;
    delete_pod(&env, "web-1").await;
    // The provisioner keeps working meanwhile: a new claim gets a volume.
    env.create_pvc(&env.ns, "after", CLASS, "1Mi", json!({}))
        .await;
    env.wait_bound(&env.ns, "after").await;
    // A window for a loop that must not exist to act anyway. With the gate
    // off there is nothing that could report having looked at the set, so
    // no positive signal to wait for: the provisioner having bound `after`
    // (created after the scale-down and the pod's deletion) shows the
    // sidecar is up and has seen events of that time, and a loop running
    // regardless would have listed and watched StatefulSets and pods at
    // start-up, which is asserted below whatever the timing. The one-second
    // wait only gives claim writes of such a loop time to show.
    tokio::time::sleep(Duration::from_secs(1)).await;

    for verb in ["patch", "update", "delete", "deletecollection"] {
        assert_eq!(
            env.sidecar_request_count(verb, "persistentvolumeclaims"),
            0,
            "{verb} of claims with the gate off: {:?}",
            env.sidecar_requests()
        );
    }
    for resource in ["statefulsets", "pods"] {
        for verb in ["list", "watch"] {
            assert_eq!(
                env.sidecar_request_count(verb, resource),
                0,
                "{verb} {resource} with the gate off"
            );
        }
    }
    for ordinal in 0..2 {
        assert_eq!(
            refs(&env, &format!("data-web-{ordinal}")).await,
            Some(vec![])
        );
    }
    assert!(
        !env.logs()
            .contains("StatefulSet PVC retention loop running")
    );
    env.assert_nothing_forbidden();
}

/// Hazard 6 (docs/design.md): set `redis` (template `data-cache`, whenScaled=Delete,
/// scaled to 0) and set `cache-redis` (template `data`) both name a claim
/// `data-cache-redis-0`; it carries `cache-redis`'s labels. Deleting it
/// would lose `cache-redis`'s data: it must be left alone.
async fn a_claim_matched_by_name_only_is_never_deleted(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[GATE]).await;
    let other = create_set(&env, "cache-redis", 1, "Retain", "Retain").await;
    create_members(&env, &other, 0..1).await;
    let redis: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "redis", "namespace": env.ns},
        "spec": {
            "replicas": 0, "serviceName": "redis",
            "selector": {"matchLabels": {"app": "redis"}},
            "template": {"metadata": {"labels": {"app": "redis"}},
                "spec": {"containers": [{"name": "app", "image": "busybox"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data-cache"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": env.class(CLASS),
                         "resources": {"requests": {"storage": "1Mi"}}}}],
            "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"},
        },
    }))
    .expect("set json");
    Api::<StatefulSet>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &redis)
        .await
        .expect("create set");
    // The loop has planned `redis` and decided about the claim its name
    // fits: left alone, its labels being `cache-redis`'s. That decision is
    // the whole of what the loop does with the claim (it writes nothing
    // after deciding to leave a claim alone, and decides the same on every
    // later pass over unchanged objects), so the claim is checked once it
    // is logged, not after a guessed delay.
    env.wait_for(
        "the loop leaving data-cache-redis-0 alone for set redis",
        WAIT,
        || async {
            (decisions_about(&env, "data-cache-redis-0", "labels do not match") > 0).then_some(())
        },
    )
    .await;
    assert!(
        env.pvc(&env.ns, "data-cache-redis-0").await.is_some(),
        "the claim of cache-redis was deleted\n{}",
        env.logs()
    );
    assert_eq!(
        refs(&env, "data-cache-redis-0").await,
        Some(vec![]),
        "and given no owner"
    );
}

/// Hazard 6 (docs/design.md), what the real controller-manager does with the same
/// two sets when its own statefulset controller does the work (our loop
/// off): recorded here so that ours is held to doing no worse.
async fn the_controller_manager_with_a_claim_matched_by_name_only(backend: Backend) {
    let mut env = env_with_class(backend).await;
    env.start_sidecar(&[]).await;
    let set = |name: &str, template: &str, scaled: &str| -> StatefulSet {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": env.ns},
            "spec": {
                "replicas": 1, "serviceName": name,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "app", "image": "busybox"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": template},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": env.class(CLASS),
                             "resources": {"requests": {"storage": "1Mi"}}}}],
                "persistentVolumeClaimRetentionPolicy": {"whenScaled": scaled, "whenDeleted": "Retain"},
            },
        }))
        .expect("set json")
    };
    let sets = Api::<StatefulSet>::namespaced(env.client.clone(), &env.ns);
    sets.create(
        &PostParams::default(),
        &set("cache-redis", "data", "Retain"),
    )
    .await
    .expect("cache-redis");
    env.wait_bound(&env.ns, "data-cache-redis-0").await;
    sets.create(
        &PostParams::default(),
        &set("redis", "data-cache", "Delete"),
    )
    .await
    .expect("redis");
    env.wait_for("redis-0 created", WAIT, || async {
        Api::<Pod>::namespaced(env.client.clone(), &env.ns)
            .get_opt("redis-0")
            .await
            .ok()
            .flatten()
    })
    .await;
    scale(&env, "redis", 0).await;
    env.wait_for("redis-0 gone", WAIT, || async {
        Api::<Pod>::namespaced(env.client.clone(), &env.ns)
            .get_opt("redis-0")
            .await
            .ok()
            .map(|p| p.is_none())
            .filter(|gone| *gone)
    })
    .await;
    // Recorded outcome (Kubernetes 1.36.2): the controller-manager makes
    // redis-0 own `cache-redis`'s claim, and the garbage collector deletes
    // it with the pod: `cache-redis` loses its data. Our loop, in the same
    // case, leaves the claim alone
    // (`a_claim_matched_by_name_only_is_never_deleted`). Waited for (the
    // garbage collector works in the background, behind the pod's
    // deletion); should a release fix this, the wait times out and the
    // note here is to be updated.
    env.wait_for(
        "the garbage collector deleting data-cache-redis-0 with redis-0 (the recorded \
         outcome of Kubernetes 1.36.2: if a release keeps the claim, update this test)",
        WAIT,
        || async {
            let claim = env.pvc(&env.ns, "data-cache-redis-0").await;
            claim
                .is_none_or(|c| c.metadata.deletion_timestamp.is_some())
                .then_some(())
        },
    )
    .await;
    let claim = env.pvc(&env.ns, "data-cache-redis-0").await;
    let owners = claim
        .as_ref()
        .and_then(|c| c.metadata.owner_references.clone())
        .unwrap_or_default();
    let outcome = match &claim {
        None => "deleted the claim".to_owned(),
        Some(c) if c.metadata.deletion_timestamp.is_some() => "is deleting the claim".to_owned(),
        Some(_) => format!(
            "kept the claim, owners {:?}",
            owners
                .iter()
                .map(|o| format!("{}/{}", o.kind, o.name))
                .collect::<Vec<_>>()
        ),
    };
    println!("the controller-manager's statefulset controller {outcome}");
    assert!(
        claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()),
        "the controller-manager {outcome}"
    );
}
