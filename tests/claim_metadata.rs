//! End-to-end: the `ClaimMetadataPropagation` gate (claim annotations in
//! CreateVolume parameters, claim labels and annotations on the PV), on the
//! API test server and on a real control plane. The driver records every
//! volume's `CreateVolume` parameters, so what it was sent is read back from
//! its backend; the journal is read back to show that the request frozen
//! for a claim holds the resolved values.
//!
//! Gate off, the same class and claim give the Go image's behaviour:
//! parameters passed on untouched (`${…}` and all), nothing copied, PVs
//! named `pvc-<uid>`.
//!
//! The class `named` names volumes from the claim and puts entries of the
//! driver's `volume_context` on the PV; the hostpath driver answers with
//! the request's parameters as the volume context, so the class's
//! parameters are what the driver "decided".

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use csi_hostpath::faults::Fault;
use csi_provisioner::provisioner::journal::JournalEntry;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::standard();
    gate_on_resolves_parameters_and_copies_metadata,
    gate_off_is_the_go_image,
    a_missing_annotation_fails_until_the_claim_has_it,
    a_restart_sends_the_frozen_request,
    the_cleanup_of_a_deleted_claim_sends_the_frozen_request,
    gate_on_names_the_volume_and_records_the_volume_context,
    gate_off_names_volumes_as_the_go_image,
    a_templated_name_survives_a_restart_with_the_class_changed,
    namespace_labels_and_annotations_are_read_live_when_listed,
);

const GATE: &str = "--feature-gates=ClaimMetadataPropagation=true";

/// The class `tagged`: four templated parameters (one from a label), one a driver's own
/// template that the class does not list, a plain one; two labels and two
/// annotations to copy (one of each the claim will not have).
async fn tagged_class(env: &Env) {
    env.storage_class_with(
        "tagged",
        "Immediate",
        "Delete",
        json!({
            "tags": "cost-center=${pvc.annotations['cost-center']}",
            "subDir": "${pvc.namespace}/${pvc.name}",
            "volume": "${pv.name}",
            "owner": "${pvc.labels['team']}",
            "driverTemplate": "${pvc.metadata.name}",
            "type": "ssd",
        }),
        json!({"metadata": {"annotations": {
            "csi-provisioner-rs.io/parameter-templates": "tags, subDir, volume, owner",
            "csi-provisioner-rs.io/copy-claim-labels": "team,cost-center,absent",
            "csi-provisioner-rs.io/copy-claim-annotations": "cost-center,example.com/ticket,absent",
        }}}),
    )
    .await;
}

/// The claim's labels and annotations.
fn claim_metadata(cost_center: &str) -> Value {
    json!({"metadata": {
        "labels": {"team": "storage", "cost-center": cost_center, "unlisted": "x"},
        "annotations": {"cost-center": cost_center, "example.com/ticket": "T-1", "unlisted": "x"},
    }})
}

/// The CreateVolume parameters the driver recorded for the volume of `pv`.
fn driver_parameters(env: &Env, pv: &PersistentVolume) -> BTreeMap<String, String> {
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|csi| csi.volume_handle.clone())
        .expect("a CSI PV");
    env.backend_volumes()
        .into_iter()
        .find(|v| v.id == handle)
        .unwrap_or_else(|| panic!("no backend volume {handle}"))
        .parameters
}

fn labels(pv: &PersistentVolume) -> BTreeMap<String, String> {
    pv.metadata.labels.clone().unwrap_or_default()
}

fn annotations(pv: &PersistentVolume) -> BTreeMap<String, String> {
    pv.metadata.annotations.clone().unwrap_or_default()
}

/// One line of JSON for the test's output: what the driver saw and the PV's
/// metadata.
fn excerpt(env: &Env, what: &str, params: &BTreeMap<String, String>, pv: &PersistentVolume) {
    eprintln!(
        "{what} ({}): {}",
        env.backend_name(),
        json!({
            "createVolumeParameters": params,
            "pv": {"name": pv.metadata.name, "labels": pv.metadata.labels,
                   "annotations": pv.metadata.annotations},
        })
    );
}

/// The parameters of the journal's only entry, decoded.
async fn journalled_parameters(env: &Env) -> BTreeMap<String, String> {
    let journal = env.journal().await;
    assert_eq!(journal.len(), 1, "one operation in flight: {journal:?}");
    let entry: JournalEntry =
        serde_json::from_str(journal.values().next().expect("entry")).expect("entry JSON");
    entry
        .request()
        .expect("the frozen request decodes")
        .parameters
        .into_iter()
        .collect()
}

async fn patch_claim(env: &Env, name: &str, patch: Value) {
    Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), &env.ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch claim");
}

/// Deletes the claim and waits until its PV and volume are gone.
async fn delete_and_wait_clean(env: &Env, name: &str) {
    delete_all_and_wait_clean(env, &[name]).await;
}

/// Deletes the claims and waits until every PV and volume is gone.
async fn delete_all_and_wait_clean(env: &Env, names: &[&str]) {
    for name in names {
        env.delete_pvc(&env.ns, name).await;
    }
    env.wait_for("PVs and volumes gone", Duration::from_secs(30), || async {
        (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
}

async fn gate_on_resolves_parameters_and_copies_metadata(backend: Backend) {
    let mut env = Env::new(backend).await;
    tagged_class(&env).await;
    env.start_sidecar(&[GATE]).await;
    env.create_pvc(&env.ns, "data", "tagged", "5Mi", claim_metadata("cc-42"))
        .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let pv_name = pv.metadata.name.clone().expect("PV name");
    let params = driver_parameters(&env, &pv);
    excerpt(&env, "gate on", &params, &pv);

    assert_eq!(
        params,
        BTreeMap::from([
            ("tags".to_owned(), "cost-center=cc-42".to_owned()),
            ("subDir".to_owned(), format!("{}/data", env.ns)),
            ("volume".to_owned(), pv_name.clone()),
            ("owner".to_owned(), "storage".to_owned()),
            // Not listed: passed on as it is, for the driver to resolve.
            (
                "driverTemplate".to_owned(),
                "${pvc.metadata.name}".to_owned()
            ),
            ("type".to_owned(), "ssd".to_owned()),
        ]),
        "what the driver was sent"
    );
    assert_eq!(
        labels(&pv),
        BTreeMap::from([
            ("team".to_owned(), "storage".to_owned()),
            ("cost-center".to_owned(), "cc-42".to_owned()),
        ]),
        "only the listed labels the claim has"
    );
    let annotations = annotations(&pv);
    assert_eq!(
        annotations.get("cost-center").map(String::as_str),
        Some("cc-42")
    );
    assert_eq!(
        annotations.get("example.com/ticket").map(String::as_str),
        Some("T-1")
    );
    assert!(!annotations.contains_key("unlisted"));
    assert!(!annotations.contains_key("absent"));
    assert_eq!(
        annotations
            .get("pv.kubernetes.io/provisioned-by")
            .map(String::as_str),
        Some(env.driver_name.as_str()),
        "the provisioner's own keys stay"
    );
    env.assert_consistent().await;
    delete_and_wait_clean(&env, "data").await;
}

async fn gate_off_is_the_go_image(backend: Backend) {
    let mut env = Env::new(backend).await;
    tagged_class(&env).await;
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "data", "tagged", "5Mi", claim_metadata("cc-42"))
        .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let params = driver_parameters(&env, &pv);
    excerpt(&env, "gate off", &params, &pv);

    assert_eq!(
        params,
        BTreeMap::from([
            (
                "tags".to_owned(),
                "cost-center=${pvc.annotations['cost-center']}".to_owned()
            ),
            (
                "subDir".to_owned(),
                "${pvc.namespace}/${pvc.name}".to_owned()
            ),
            ("volume".to_owned(), "${pv.name}".to_owned()),
            ("owner".to_owned(), "${pvc.labels['team']}".to_owned()),
            (
                "driverTemplate".to_owned(),
                "${pvc.metadata.name}".to_owned()
            ),
            ("type".to_owned(), "ssd".to_owned()),
        ]),
        "the class's parameters, untouched"
    );
    assert!(labels(&pv).is_empty(), "no labels: {:?}", labels(&pv));
    let keys: Vec<String> = annotations(&pv).into_keys().collect();
    assert_eq!(
        keys,
        [
            "pv.kubernetes.io/provisioned-by",
            "volume.kubernetes.io/provisioner-deletion-secret-name",
            "volume.kubernetes.io/provisioner-deletion-secret-namespace",
        ],
        "only the provisioner's annotations"
    );
    env.assert_consistent().await;
    delete_and_wait_clean(&env, "data").await;
}

async fn a_missing_annotation_fails_until_the_claim_has_it(backend: Backend) {
    let mut env = Env::new(backend).await;
    tagged_class(&env).await;
    env.start_sidecar(&[GATE]).await;
    env.create_pvc(&env.ns, "data", "tagged", "5Mi", json!({}))
        .await;
    let message = env.wait_event(&env.ns, "data", "ProvisioningFailed").await;
    assert_eq!(
        message,
        "failed to resolve StorageClass parameter \"tags\": the claim has no annotation \"cost-center\" (for \"${pvc.annotations['cost-center']}\")"
    );
    assert!(
        env.backend_volumes().is_empty(),
        "nothing sent to the driver"
    );
    assert!(env.journal().await.is_empty(), "nothing in flight");
    assert!(env.pvs().await.is_empty());

    // The claim changes: provisioned at once, with the new value.
    patch_claim(&env, "data", claim_metadata("cc-7")).await;
    let pv = env.wait_bound(&env.ns, "data").await;
    assert_eq!(
        driver_parameters(&env, &pv).get("tags").map(String::as_str),
        Some("cost-center=cc-7")
    );
    env.assert_consistent().await;
    delete_and_wait_clean(&env, "data").await;
}

/// The request is frozen with its resolved values before the first
/// `CreateVolume`: after a restart the same values are sent, whatever the
/// claim says by then. The PV's copies take the claim's values when the PV
/// is built.
async fn a_restart_sends_the_frozen_request(backend: Backend) {
    let mut env = Env::new(backend).await;
    tagged_class(&env).await;
    // The driver cannot be reached: the operation stays in flight.
    env.set_faults(vec![Fault::error("CreateVolume", tonic::Code::Unavailable)]);
    env.start_sidecar(&[GATE]).await;
    env.create_pvc(&env.ns, "data", "tagged", "5Mi", claim_metadata("cc-1"))
        .await;
    env.wait_event(&env.ns, "data", "ProvisioningFailed").await;
    let journalled = journalled_parameters(&env).await;
    assert_eq!(
        journalled.get("tags").map(String::as_str),
        Some("cost-center=cc-1"),
        "the journal holds the resolved request: {journalled:?}"
    );
    assert_eq!(journalled.get("subDir"), Some(&format!("{}/data", env.ns)));
    env.kill_sidecar();

    patch_claim(&env, "data", claim_metadata("cc-2")).await;
    env.clear_faults();
    env.start_sidecar(&[GATE]).await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let params = driver_parameters(&env, &pv);
    excerpt(&env, "after a restart", &params, &pv);
    assert_eq!(
        params.get("tags").map(String::as_str),
        Some("cost-center=cc-1"),
        "the frozen request was sent"
    );
    assert_eq!(
        labels(&pv).get("cost-center").map(String::as_str),
        Some("cc-2"),
        "copies are the claim's when the PV is built"
    );
    env.assert_consistent().await;
    delete_and_wait_clean(&env, "data").await;
    // Pruned lazily (at most 2 s after the PV was saved).
    env.wait_for("journal emptied", Duration::from_secs(10), || async {
        env.journal().await.is_empty().then_some(())
    })
    .await;
}

/// A claim deleted while its operation is in flight across a restart: the
/// cleanup repeats the journalled request (the claim and its annotations
/// are gone, nothing is resolved again) and deletes the volume.
async fn the_cleanup_of_a_deleted_claim_sends_the_frozen_request(backend: Backend) {
    let mut env = Env::new(backend).await;
    tagged_class(&env).await;
    env.set_faults(vec![Fault::error("CreateVolume", tonic::Code::Unavailable)]);
    env.start_sidecar(&[GATE]).await;
    env.create_pvc(&env.ns, "doomed", "tagged", "5Mi", claim_metadata("cc-1"))
        .await;
    env.wait_event(&env.ns, "doomed", "ProvisioningFailed")
        .await;
    assert_eq!(
        journalled_parameters(&env)
            .await
            .get("tags")
            .map(String::as_str),
        Some("cost-center=cc-1")
    );
    env.kill_sidecar();
    env.delete_pvc(&env.ns, "doomed").await;
    // The cleanup's CreateVolume makes the volume; its DeleteVolume fails
    // a few times, long enough to read what the volume was made with.
    env.set_faults(vec![
        Fault::error("DeleteVolume", tonic::Code::Internal).times(6),
    ]);
    env.start_sidecar(&[GATE]).await;
    let volume = env
        .wait_for("the cleanup's volume", Duration::from_secs(30), || async {
            env.backend_volumes().into_iter().next()
        })
        .await;
    assert_eq!(
        volume.parameters.get("tags").map(String::as_str),
        Some("cost-center=cc-1"),
        "the cleanup sent the journalled request"
    );
    env.wait_for(
        "volume and journal entry gone",
        Duration::from_secs(30),
        || async {
            (env.backend_volumes().is_empty() && env.journal().await.is_empty()).then_some(())
        },
    )
    .await;
    assert!(env.pvs().await.is_empty());
    env.assert_consistent().await;
}

const NAME_TEMPLATE: &str = "${pvc.namespace}-${pvc.name}-${pvc.uid}";

/// The class `named`: PV names from [`NAME_TEMPLATE`]; volume context
/// entries `zone`, `tier` (a value no label may have) and `absent` as
/// labels, `pool` as an annotation.
async fn named_class(env: &Env) {
    env.storage_class_with(
        "named",
        "Immediate",
        "Delete",
        json!({"zone": "zone-1", "tier": "Gold Tier", "pool": "pool-7"}),
        json!({"metadata": {"annotations": {
            "csi-provisioner-rs.io/volume-name-template": NAME_TEMPLATE,
            "csi-provisioner-rs.io/volume-context-labels": "zone, tier, absent",
            "csi-provisioner-rs.io/volume-context-annotations": "pool",
        }}}),
    )
    .await;
}

async fn patch_class(env: &Env, short: &str, patch: Value) {
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(env.client.clone())
        .patch(
            &env.class(short),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("patch class");
}

fn uid_of(claim: &PersistentVolumeClaim) -> String {
    claim.metadata.uid.clone().expect("claim uid")
}

/// The CSI names the driver was asked to create, sorted.
fn backend_names(env: &Env) -> Vec<String> {
    let mut names: Vec<String> = env.backend_volumes().into_iter().map(|v| v.name).collect();
    names.sort();
    names
}

async fn gate_on_names_the_volume_and_records_the_volume_context(backend: Backend) {
    let mut env = Env::new(backend).await;
    named_class(&env).await;
    env.start_sidecar(&[GATE]).await;
    let claim = env
        .create_pvc(&env.ns, "data", "named", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let want = format!("{}-data-{}", env.ns, uid_of(&claim));
    excerpt(&env, "named", &driver_parameters(&env, &pv), &pv);
    assert_eq!(
        pv.metadata.name.as_deref(),
        Some(want.as_str()),
        "the PV name"
    );
    assert_eq!(
        backend_names(&env),
        std::slice::from_ref(&want),
        "the CreateVolume name"
    );
    assert_eq!(
        labels(&pv),
        BTreeMap::from([("zone".to_owned(), "zone-1".to_owned())]),
        "the listed entries with valid values; a key the answer lacks is skipped"
    );
    assert_eq!(
        annotations(&pv).get("pool").map(String::as_str),
        Some("pool-7")
    );
    assert_eq!(
        env.wait_event(&env.ns, "data", "ProvisioningSucceeded")
            .await,
        format!("Successfully provisioned volume {want}")
    );
    assert_eq!(
        env.wait_event(&env.ns, "data", "VolumeContextSkipped")
            .await,
        format!(
            "volume context key \"tier\" is not put on the PV of claim \"{}/data\" as a label: its value \"Gold Tier\" is not a valid label value: it must be empty or consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
            env.ns
        )
    );
    env.assert_consistent().await;
    delete_and_wait_clean(&env, "data").await;
}

async fn gate_off_names_volumes_as_the_go_image(backend: Backend) {
    let mut env = Env::new(backend).await;
    named_class(&env).await;
    env.start_sidecar(&[]).await;
    let claim = env
        .create_pvc(&env.ns, "data", "named", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "data").await;
    let want = format!("pvc-{}", uid_of(&claim));
    assert_eq!(pv.metadata.name.as_deref(), Some(want.as_str()));
    assert_eq!(backend_names(&env), [want]);
    assert!(labels(&pv).is_empty(), "no labels: {:?}", labels(&pv));
    assert!(!annotations(&pv).contains_key("pool"));
    assert!(
        env.events(&env.ns, "data")
            .await
            .iter()
            .all(|(reason, _)| reason != "VolumeContextSkipped"),
        "no warning"
    );
    env.assert_consistent().await;
    delete_and_wait_clean(&env, "data").await;
}

/// The name is decided by the claim's first plan and journalled with the
/// request before the first `CreateVolume`: a restart after the class's
/// template changed keeps it, for the driver and for the PV.
async fn a_templated_name_survives_a_restart_with_the_class_changed(backend: Backend) {
    let mut env = Env::new(backend).await;
    named_class(&env).await;
    env.set_faults(vec![Fault::error("CreateVolume", tonic::Code::Unavailable)]);
    env.start_sidecar(&[GATE]).await;
    let claim = env
        .create_pvc(&env.ns, "data", "named", "5Mi", json!({}))
        .await;
    let uid = uid_of(&claim);
    let want = format!("{}-data-{uid}", env.ns);
    env.wait_event(&env.ns, "data", "ProvisioningFailed").await;
    let journal = env.journal_entries().await;
    let (entry, request) = journal.get(&uid).expect("the claim's journal entry");
    assert_eq!(entry.volume_name, want, "journalled");
    assert_eq!(request.name, want);
    env.kill_sidecar();

    patch_class(
        &env,
        "named",
        json!({"metadata": {"annotations": {
            "csi-provisioner-rs.io/volume-name-template": "renamed-${pvc.uid}",
        }}}),
    )
    .await;
    env.clear_faults();
    env.start_sidecar(&[GATE]).await;
    let pv = env.wait_bound(&env.ns, "data").await;
    assert_eq!(
        pv.metadata.name.as_deref(),
        Some(want.as_str()),
        "the PV name"
    );
    assert_eq!(
        backend_names(&env),
        [want],
        "one volume, of the journalled name"
    );
    env.assert_consistent().await;

    // A new claim of the class takes the new template.
    let other = env
        .create_pvc(&env.ns, "other", "named", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "other").await;
    assert_eq!(
        pv.metadata.name,
        Some(format!("renamed-{}", uid_of(&other)))
    );
    env.assert_consistent().await;
    delete_all_and_wait_clean(&env, &["data", "other"]).await;
}

/// `--extra-create-metadata-namespace-labels` / `-annotations` (beyond the
/// Go image, upstream #1531): the listed keys the claim's namespace has go
/// to the driver under `csi.storage.k8s.io/namespace/labels/` and
/// `.../annotations/`; the namespace is read live, once per provisioning
/// (a change shows in the next claim); without the flags nothing is added
/// and the namespace is not read, as the Go image.
async fn namespace_labels_and_annotations_are_read_live_when_listed(backend: Backend) {
    const LABELS: &str =
        "--extra-create-metadata-namespace-labels=example.com/tier,example.com/absent";
    const ANNOTATIONS: &str =
        "--extra-create-metadata-namespace-annotations=example.com/quota-pool-id";
    let mut env = Env::new(backend).await;
    env.storage_class("plain", "Immediate", "Delete", json!({"type": "ssd"}))
        .await;
    let namespaces = Api::<Namespace>::all(env.client.clone());
    let ns = env.ns.clone();
    let set_namespace = |tier: &'static str| {
        let namespaces = namespaces.clone();
        let ns = ns.clone();
        async move {
            let patch = json!({"metadata": {
                "labels": {"example.com/tier": tier, "unlisted": "x"},
                "annotations": {"example.com/quota-pool-id": "pool-7", "unlisted": "y"},
            }});
            namespaces
                .patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("patch namespace");
        }
    };
    set_namespace("gold").await;
    env.start_sidecar(&[LABELS, ANNOTATIONS]).await;
    let expected = |tier: &str| {
        BTreeMap::from([
            ("type".to_owned(), "ssd".to_owned()),
            (
                "csi.storage.k8s.io/namespace/labels/example.com/tier".to_owned(),
                tier.to_owned(),
            ),
            (
                "csi.storage.k8s.io/namespace/annotations/example.com/quota-pool-id".to_owned(),
                "pool-7".to_owned(),
            ),
        ])
    };
    env.create_pvc(&env.ns, "first", "plain", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "first").await;
    let params = driver_parameters(&env, &pv);
    excerpt(&env, "namespace metadata", &params, &pv);
    assert_eq!(params, expected("gold"), "what the driver was sent");

    // Read live: the namespace's new value goes with the next claim.
    set_namespace("silver").await;
    env.create_pvc(&env.ns, "second", "plain", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "second").await;
    assert_eq!(driver_parameters(&env, &pv), expected("silver"));
    // One read per provisioning (the audit log of a real cluster may lag).
    env.wait_for("two namespace reads", Duration::from_secs(20), || async {
        (env.sidecar_request_count("get", "namespaces") == 2).then_some(())
    })
    .await;

    // Without the flags: the Go image's parameters, no namespace read.
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
    env.reset_counters();
    env.start_sidecar(&[]).await;
    env.create_pvc(&env.ns, "third", "plain", "5Mi", json!({}))
        .await;
    let pv = env.wait_bound(&env.ns, "third").await;
    assert_eq!(
        driver_parameters(&env, &pv),
        BTreeMap::from([("type".to_owned(), "ssd".to_owned())])
    );
    assert_eq!(env.sidecar_request_count("get", "namespaces"), 0);
    env.assert_consistent().await;
    delete_all_and_wait_clean(&env, &["first", "second", "third"]).await;
}
