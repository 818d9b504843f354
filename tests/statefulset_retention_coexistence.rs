//! Our retention loop and the controller-manager's StatefulSet controller on
//! the same claims must not fight: neither may undo the other's write. The
//! controller-manager is
//! played by a reference implementation written here from its source
//! (`isClaimOwnerUpToDate` / `updateClaimOwnerRefForSetAndPod` in
//! `pkg/controller/statefulset/stateful_set_utils.go`, Kubernetes 1.32+),
//! acting the way it does: per existing pod of the set, on that pod's
//! claims, with a full update of the claim. Both act alternately on the
//! objects of an in-process API test server; after one of them has acted
//! on a change, the other must find nothing to do, and neither may write
//! again afterwards (counted with the server's request counters).

use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_provisioner::caches::Caches;
use csi_provisioner::events::Recorder;
use csi_provisioner::queue::Backoff;
use csi_provisioner::retention::{self, SetKey};
use csi_provisioner::shared::Shared;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube_testserver::{TestServer, Verb};
use serde_json::json;

const NS: &str = "default";
const DRIVER: &str = "retention.csi.example.com";

// ---- the controller-manager, as a reference ------------------------------------------

mod controller_manager {
    //! A transcription of the controller-manager's claim ownership rules.
    //! Deliberately written apart from `csi_provisioner::retention::decide`
    //! (and in the Go code's shape), so that a shared mistake is unlikely.

    use super::*;

    fn matches_ref(r: &OwnerReference, name: &str, api_version: &str, kind: &str) -> bool {
        r.api_version == api_version && r.kind == kind && r.name == name
    }

    fn uid<K: kube::Resource>(o: &K) -> String {
        o.meta().uid.clone().unwrap_or_default()
    }

    fn name<K: kube::Resource>(o: &K) -> String {
        o.meta().name.clone().unwrap_or_default()
    }

    fn policy(set: &StatefulSet) -> (String, String) {
        let p = set
            .spec
            .persistent_volume_claim_retention_policy
            .clone()
            .unwrap_or_default();
        (
            p.when_scaled.unwrap_or_else(|| "Retain".into()),
            p.when_deleted.unwrap_or_else(|| "Retain".into()),
        )
    }

    fn pod_in_ordinal_range(pod: &Pod, set: &StatefulSet) -> bool {
        let ordinal: i64 = name(pod)
            .rsplit_once('-')
            .and_then(|(_, o)| o.parse().ok())
            .unwrap_or(-1);
        let start = i64::from(
            set.spec
                .ordinals
                .as_ref()
                .and_then(|o| o.start)
                .unwrap_or(0),
        );
        let replicas = i64::from(set.spec.replicas.unwrap_or(1));
        ordinal >= start && ordinal < start + replicas
    }

    fn has_stale_owner_ref(
        claim: &PersistentVolumeClaim,
        name: &str,
        uid: &str,
        av: &str,
        kind: &str,
    ) -> bool {
        for r in claim.metadata.owner_references.iter().flatten() {
            if matches_ref(r, name, av, kind) {
                return r.uid != uid;
            }
        }
        false
    }

    fn has_unexpected_controller(
        claim: &PersistentVolumeClaim,
        set: &StatefulSet,
        pod: &Pod,
    ) -> bool {
        let (scaled, deleted) = policy(set);
        if scaled == "Retain" && deleted == "Retain" {
            return false;
        }
        for r in claim.metadata.owner_references.iter().flatten() {
            if matches_ref(r, &name(set), "apps/v1", "StatefulSet") {
                if r.uid != uid(set) {
                    return true;
                }
                continue;
            }
            if matches_ref(r, &name(pod), "v1", "Pod") {
                if r.uid != uid(pod) {
                    return true;
                }
                continue;
            }
            if r.controller == Some(true) {
                return true;
            }
        }
        false
    }

    fn has_non_controller_owner(
        claim: &PersistentVolumeClaim,
        set: &StatefulSet,
        pod: &Pod,
    ) -> bool {
        claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| (r.uid == uid(set) || r.uid == uid(pod)) && r.controller != Some(true))
    }

    fn has_owner_ref(claim: &PersistentVolumeClaim, owner_uid: &str) -> bool {
        claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.uid == owner_uid)
    }

    pub fn is_claim_owner_up_to_date(
        claim: &PersistentVolumeClaim,
        set: &StatefulSet,
        pod: &Pod,
    ) -> bool {
        if has_stale_owner_ref(claim, &name(set), &uid(set), "apps/v1", "StatefulSet")
            || has_stale_owner_ref(claim, &name(pod), &uid(pod), "v1", "Pod")
        {
            return true;
        }
        if has_unexpected_controller(claim, set, pod) {
            return !(has_owner_ref(claim, &uid(set)) || has_owner_ref(claim, &uid(pod)));
        }
        if has_non_controller_owner(claim, set, pod) {
            return false;
        }
        let (set_ref, pod_ref) = (
            has_owner_ref(claim, &uid(set)),
            has_owner_ref(claim, &uid(pod)),
        );
        let scaled_down = !pod_in_ordinal_range(pod, set);
        match policy(set) {
            (s, d) if s == "Retain" && d == "Delete" => set_ref && !pod_ref,
            (s, d) if s == "Delete" && d == "Retain" => !set_ref && scaled_down == pod_ref,
            (s, d) if s == "Delete" && d == "Delete" => {
                scaled_down != set_ref && scaled_down == pod_ref
            }
            _ => !set_ref && !pod_ref,
        }
    }

    fn new_controller_ref(name: &str, uid: &str, av: &str, kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: av.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn add_controller_ref(refs: &mut Vec<OwnerReference>, owner: OwnerReference) {
        if !refs.iter().any(|r| r.uid == owner.uid) {
            refs.push(owner);
        }
    }

    pub fn update_claim_owner_ref(claim: &mut PersistentVolumeClaim, set: &StatefulSet, pod: &Pod) {
        let unexpected = has_unexpected_controller(claim, set, pod);
        let mut refs: Vec<OwnerReference> = claim
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| {
                !(matches_ref(r, &name(set), "apps/v1", "StatefulSet")
                    || matches_ref(r, &name(pod), "v1", "Pod"))
            })
            .collect();
        if !unexpected {
            let set_ref = new_controller_ref(&name(set), &uid(set), "apps/v1", "StatefulSet");
            let pod_ref = new_controller_ref(&name(pod), &uid(pod), "v1", "Pod");
            let scaled_down = !pod_in_ordinal_range(pod, set);
            match policy(set) {
                (s, d) if s == "Retain" && d == "Delete" => add_controller_ref(&mut refs, set_ref),
                (s, d) if s == "Delete" && d == "Retain" && scaled_down => {
                    add_controller_ref(&mut refs, pod_ref);
                }
                (s, d) if s == "Delete" && d == "Delete" => {
                    if scaled_down {
                        add_controller_ref(&mut refs, pod_ref);
                    } else {
                        add_controller_ref(&mut refs, set_ref);
                    }
                }
                _ => {}
            }
        }
        claim.metadata.owner_references = Some(refs);
    }

    /// One sync of the set: per pod it controls, per template, the claim is
    /// brought in line with a full update (as `UpdatePodClaimForRetentionPolicy`).
    pub async fn sync(client: &kube::Client, set_name: &str) -> usize {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
        let Some(set) = sets.get_opt(set_name).await.expect("get set") else {
            return 0;
        };
        if set.metadata.deletion_timestamp.is_some() {
            return 0;
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
        let mut writes = 0;
        for pod in pods.list(&Default::default()).await.expect("pods").items {
            let owned = pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.controller == Some(true) && r.uid == uid(&set));
            if !owned {
                continue;
            }
            let ordinal = name(&pod)
                .rsplit_once('-')
                .map(|(_, o)| o.to_owned())
                .unwrap_or_default();
            for template in set.spec.volume_claim_templates.iter().flatten() {
                let claim_name = format!("{}-{}-{ordinal}", name(template), set_name);
                let Some(mut claim) = claims.get_opt(&claim_name).await.expect("get claim") else {
                    continue;
                };
                if !is_claim_owner_up_to_date(&claim, &set, &pod) {
                    update_claim_owner_ref(&mut claim, &set, &pod);
                    claims
                        .replace(&claim_name, &PostParams::default(), &claim)
                        .await
                        .expect("update claim");
                    writes += 1;
                }
            }
        }
        writes
    }
}

// ---- harness ----------------------------------------------------------------------------

struct Harness {
    server: TestServer,
    client: kube::Client,
    shared: Shared,
    ctx: Arc<retention::Context>,
}

impl Harness {
    async fn new() -> Harness {
        let server = TestServer::new();
        let client = server.client();
        server
            .create_object(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "fast"}, "provisioner": DRIVER,
            }))
            .expect("class");
        let shared = Shared {
            client: client.clone(),
            driver_name: DRIVER.into(),
            caches: Arc::new(Caches::new()),
            recorder: Arc::new(Recorder::new(client.clone(), "test")),
            backoff: Backoff {
                start: Duration::from_millis(10),
                max: Duration::from_millis(100),
            },
            workers: 1,
            volume_events: Default::default(),
        };
        // No `run()`: no workers; the test drives `process` itself so that
        // the two controllers strictly alternate.
        let ctx = retention::new(&shared, retention::Settings::default());
        shared.caches.start(&client);
        shared.caches.wait_until_ready().await;
        Harness {
            server,
            client,
            shared,
            ctx,
        }
    }

    /// Waits until our caches hold exactly what the server holds, so that
    /// our loop decides on the other's last write (as it would, a moment
    /// later, in a real cluster).
    async fn caches_synced(&self) {
        fn same<K, C>(server: &[K], cache: &Store<C>, version: fn(&C) -> Option<String>) -> bool
        where
            K: kube::Resource<DynamicType = ()>,
            C: kube::runtime::reflector::Lookup<DynamicType = ()> + Clone,
        {
            cache.state().len() == server.len()
                && server.iter().all(|o| {
                    let key = ObjectRef::new(o.meta().name.as_deref().unwrap_or_default())
                        .within(o.meta().namespace.as_deref().unwrap_or_default());
                    cache.get(&key).map(|c| version(&c)) == Some(o.meta().resource_version.clone())
                })
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let caches = &self.shared.caches;
        loop {
            let claims = self.server.list::<PersistentVolumeClaim>(None);
            let pods = self.server.list::<Pod>(None);
            let sets = self.server.list::<StatefulSet>(None);
            if same(&claims, &caches.claims.store(), |c| {
                c.metadata.resource_version.clone()
            }) && same(&pods, &caches.pods.store(), |c| {
                c.metadata.resource_version.clone()
            }) && same(&sets, &caches.stateful_sets.store(), |c| {
                c.metadata.resource_version.clone()
            }) {
                return;
            }
            assert!(Instant::now() < deadline, "caches did not catch up");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Our loop reconciles the set once; returns its writes to claims.
    async fn ours(&self, set: &str) -> u64 {
        self.caches_synced().await;
        let before = self.claim_writes();
        self.ctx
            .process(&SetKey {
                namespace: NS.into(),
                name: set.into(),
            })
            .await;
        self.claim_writes() - before
    }

    /// The reference controller-manager syncs the set once.
    async fn theirs(&self, set: &str) -> u64 {
        let before = self.claim_writes();
        let writes = controller_manager::sync(&self.client, set).await;
        let counted = self.claim_writes() - before;
        assert_eq!(counted, writes as u64, "the server saw every write");
        counted
    }

    fn claim_writes(&self) -> u64 {
        [
            Verb::Create,
            Verb::Update,
            Verb::Patch,
            Verb::Delete,
            Verb::DeleteCollection,
        ]
        .into_iter()
        .map(|v| self.server.request_count(v, "persistentvolumeclaims"))
        .sum()
    }

    async fn refs(&self, claim: &str) -> Vec<(String, String)> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), NS)
            .get(claim)
            .await
            .expect("claim")
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.kind, r.name))
            .collect()
    }
}

fn owned(kind: &str, name: &str) -> (String, String) {
    (kind.into(), name.into())
}

async fn create_world(h: &Harness, replicas: i32) -> StatefulSet {
    let set: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": replicas,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "app", "image": "busybox"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                         "resources": {"requests": {"storage": "1Mi"}}}}],
            "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Retain", "whenDeleted": "Retain"},
        },
    }))
    .expect("set");
    let set = Api::<StatefulSet>::namespaced(h.client.clone(), NS)
        .create(&PostParams::default(), &set)
        .await
        .expect("create set");
    let uid = set.metadata.uid.clone().expect("uid");
    // A real owner for the user's reference: the garbage collector deletes
    // dependents whose owners do not exist.
    let config_map = h
        .server
        .create_object(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "backup-policy", "namespace": NS}}))
        .expect("config map");
    let user_uid = config_map["metadata"]["uid"].clone();
    for ordinal in 0..replicas {
        // data-web-0 carries a user's reference; data-web-1 a non-controller
        // reference to the set (as written by an older controller-manager).
        let extra = match ordinal {
            0 => {
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "backup-policy", "uid": user_uid}])
            }
            1 => {
                json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": uid}])
            }
            _ => json!(null),
        };
        h.server
            .create_object(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("data-web-{ordinal}"), "namespace": NS, "ownerReferences": extra,
                    // As the controller-manager writes them: the set's selector labels.
                    "labels": {"app": "web"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                         "resources": {"requests": {"storage": "1Mi"}}},
            }))
            .expect("claim");
        h.server
            .create_object(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("web-{ordinal}"), "namespace": NS,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                         "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"nodeName": "node", "containers": [{"name": "app", "image": "busybox"}],
                         "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-web-{ordinal}")}}]},
            }))
            .expect("pod");
    }
    set
}

async fn configure(h: &Harness, replicas: i32, scaled: &str, deleted: &str) {
    Api::<StatefulSet>::namespaced(h.client.clone(), NS)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas,
                "persistentVolumeClaimRetentionPolicy": {"whenScaled": scaled, "whenDeleted": deleted}}})),
        )
        .await
        .expect("configure set");
}

/// The claim's wanted owners (besides the user's), as the controller-manager
/// wants them per retention policy.
fn wanted(ordinal: i32, replicas: i32, scaled: &str, deleted: &str) -> Vec<(String, String)> {
    let condemned = ordinal >= replicas;
    match (scaled, deleted, condemned) {
        ("Retain", "Delete", _) | ("Delete", "Delete", false) => vec![owned("StatefulSet", "web")],
        ("Delete", _, true) => vec![owned("Pod", &format!("web-{ordinal}"))],
        _ => vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_loop_and_the_controller_manager_converge_without_ping_pong() {
    let h = Harness::new().await;
    create_world(&h, 3).await;
    // Every pod stays: this is the window in which both controllers own the
    // claims (after a scale-down, before the pods are deleted), where a
    // disagreement would show as a write war.
    let configs = [
        (3, "Retain", "Retain"),
        (3, "Retain", "Delete"),
        (3, "Delete", "Delete"),
        (1, "Delete", "Delete"),
        (1, "Delete", "Retain"),
        (2, "Delete", "Retain"),
        (2, "Retain", "Delete"),
        (0, "Delete", "Delete"),
        (0, "Retain", "Retain"),
        (3, "Delete", "Delete"),
        (1, "Delete", "Delete"),
        (1, "Retain", "Retain"),
    ];
    let mut total = 0;
    for (i, (replicas, scaled, deleted)) in configs.into_iter().enumerate() {
        configure(&h, replicas, scaled, deleted).await;
        let case = format!("replicas={replicas}, whenScaled={scaled}, whenDeleted={deleted}");
        // Alternate who sees the change first.
        let (first, second) = if i % 2 == 0 {
            (h.theirs("web").await, h.ours("web").await)
        } else {
            (h.ours("web").await, h.theirs("web").await)
        };
        assert_eq!(
            second, 0,
            "{case}: the second controller undid or redid the first one's writes"
        );
        total += first;
        for round in 0..2 {
            assert_eq!(
                h.ours("web").await,
                0,
                "{case}: our loop wrote again (round {round})"
            );
            assert_eq!(
                h.theirs("web").await,
                0,
                "{case}: the controller-manager wrote again (round {round})"
            );
        }
        for ordinal in 0..3 {
            let mut want = wanted(ordinal, replicas, scaled, deleted);
            if ordinal == 0 {
                want.insert(0, owned("ConfigMap", "backup-policy"));
            }
            assert_eq!(
                h.refs(&format!("data-web-{ordinal}")).await,
                want,
                "{case}: data-web-{ordinal}"
            );
        }
    }
    assert!(total > 0, "the configurations changed references at all");
    assert_eq!(
        h.server
            .request_count(Verb::Delete, "persistentvolumeclaims"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_controller_and_stale_references_are_respected_by_both() {
    let h = Harness::new().await;
    let set = create_world(&h, 3).await;
    configure(&h, 3, "Delete", "Delete").await;
    h.theirs("web").await;
    assert_eq!(h.ours("web").await, 0);
    // Someone else takes control of data-web-2; a stale set reference
    // appears on data-web-1 (an earlier set of the same name). The garbage
    // collector is off from here: it would resolve the stale reference at
    // once, and the point is what both controllers do before it does.
    h.server.set_gc(false);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), NS);
    let mut claim = claims.get("data-web-2").await.expect("claim");
    claim
        .metadata
        .owner_references
        .get_or_insert_default()
        .push(OwnerReference {
            api_version: "example.com/v1".into(),
            kind: "Backup".into(),
            name: "b".into(),
            uid: "backup-uid".into(),
            controller: Some(true),
            block_owner_deletion: None,
        });
    claims
        .replace("data-web-2", &PostParams::default(), &claim)
        .await
        .expect("update");
    let mut claim = claims.get("data-web-1").await.expect("claim");
    claim.metadata.owner_references = Some(vec![OwnerReference {
        uid: "an-older-set".into(),
        ..claim
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default()
            .remove(0)
    }]);
    claims
        .replace("data-web-1", &PostParams::default(), &claim)
        .await
        .expect("update");
    assert!(set.metadata.uid.is_some());

    for (replicas, first_ours) in [(3, true), (1, false), (3, false), (1, true)] {
        configure(&h, replicas, "Delete", "Delete").await;
        let second = if first_ours {
            h.ours("web").await;
            h.theirs("web").await
        } else {
            h.theirs("web").await;
            h.ours("web").await
        };
        assert_eq!(second, 0, "replicas={replicas}");
        assert_eq!(h.ours("web").await, 0);
        assert_eq!(h.theirs("web").await, 0);
        assert_eq!(
            h.refs("data-web-2").await,
            vec![owned("Backup", "b")],
            "ours removed, theirs kept"
        );
        assert_eq!(
            h.refs("data-web-1").await,
            vec![owned("StatefulSet", "web")],
            "stale reference untouched"
        );
    }
}

/// A claim of the set's template without a pod, with the set's selector
/// labels (as the controller-manager writes them; a claim without them is
/// never the set's).
fn plain_claim(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "web"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                 "resources": {"requests": {"storage": "1Mi"}}},
    })
}

/// A condemned claim without a pod is deleted while its set lives; once the
/// set is being deleted with orphan propagation (the garbage collector has
/// not finished orphaning yet), nothing of the set is touched any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_being_deleted_with_orphan_propagation_is_left_alone() {
    let h = Harness::new().await;
    create_world(&h, 3).await;
    configure(&h, 1, "Delete", "Delete").await;
    assert!(h.ours("web").await > 0);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), NS);

    // Control: a condemned claim whose pod never existed is deleted.
    h.server
        .create_object(plain_claim("data-web-3"))
        .expect("claim");
    assert_eq!(h.ours("web").await, 1);
    assert!(claims.get_opt("data-web-3").await.expect("get").is_none());

    h.server.set_gc(false);
    Api::<StatefulSet>::namespaced(h.client.clone(), NS)
        .delete(
            "web",
            &kube::api::DeleteParams {
                propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await
        .expect("delete set");
    let set = h
        .server
        .get::<StatefulSet>(NS, "web")
        .expect("still there, orphaning");
    assert!(set.metadata.deletion_timestamp.is_some());
    assert!(
        set.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"orphan".to_owned())
    );
    h.server
        .create_object(plain_claim("data-web-4"))
        .expect("claim");
    let before = (
        h.refs("data-web-0").await,
        h.refs("data-web-1").await,
        h.refs("data-web-2").await,
    );
    assert_eq!(
        h.ours("web").await,
        0,
        "no write while the set is orphaning"
    );
    assert!(claims.get_opt("data-web-4").await.expect("get").is_some());
    assert_eq!(
        (
            h.refs("data-web-0").await,
            h.refs("data-web-1").await,
            h.refs("data-web-2").await,
        ),
        before
    );
}
