//! End-to-end: swap the image in an existing Go-sidecar deployment and
//! nothing breaks. The sidecar runs on a real API server as a user bound to
//! exactly the upstream project's stock RBAC (tests/fixtures), with the
//! flags of upstream's deploy/kubernetes/deployment.yaml plus every
//! component-base logging flag, and must provision and delete. What the
//! stock rules do not allow (the journal ConfigMap, VolumeAttributesClasses,
//! `patch` on claims) is named once at start, not retried in a hot loop.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Backend, ClusterConfig, Env, free_port, http_get};

e2e_real!(ClusterConfig::standard();
    stock_upstream_rbac_and_flags_provision_and_delete,
    rbac_without_volume_attributes_classes_keeps_the_gate_on_as_the_go_image,
    a_volume_attributes_class_gate_set_on_the_command_line_is_kept_on,
);

/// The opt-out of the harness's refused-request check for the stock rules
/// (see [`support::Env::expect_refusals`]): they grant nothing on ConfigMaps
/// nor VolumeAttributesClasses, so the journal's first read and the
/// VolumeAttributesClass probe are refused, once each (asserted below),
/// and the sidecar goes on without them.
const STOCK_RULES_LACK_JOURNAL_AND_VAC: &str =
    "the stock upstream rules grant neither the journal's ConfigMaps nor VolumeAttributesClasses";
const STOCK_RULES_REFUSE: &[(&str, &str, u16)] = &[VAC_PROBE_REFUSED, ("list", "configmaps", 403)];

/// The opt-out for deploy/'s rules without VolumeAttributesClasses: the
/// probe at start is refused, once, and the classes are read per claim.
const RULES_LACK_VAC: &str = "deploy/'s rules without volumeattributesclasses";
const VAC_PROBE_REFUSED: (&str, &str, u16) = ("list", "volumeattributesclasses", 403);

/// How many log lines contain `needle`.
fn lines_with(env: &Env, needle: &str) -> usize {
    env.logs().lines().filter(|l| l.contains(needle)).count()
}

async fn stock_upstream_rbac_and_flags_provision_and_delete(backend: Backend) {
    let mut env = Env::new(backend).await;
    let plane = env.plane().expect("real cluster");
    let user = format!("stock-{}", env.id);
    let (cluster_rules, namespace_rules) = support::upstream_stock_rules();
    env.grant_rules(&user, cluster_rules, namespace_rules).await;
    env.expect_refusals(STOCK_RULES_LACK_JOURNAL_AND_VAC, STOCK_RULES_REFUSE);
    let kubeconfig = plane.kubeconfig_for(&user, None).expect("kubeconfig");
    env.storage_class("fast", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    let port = free_port();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    // deploy/kubernetes/deployment.yaml of upstream, then every logging
    // flag of component-base.
    env.start_sidecar_as(
        &kubeconfig,
        &[
            "--leader-election",
            &http,
            "--logging-format=text",
            "--log-flush-frequency=5s",
            "--vmodule=claims=4",
            "--log-text-split-stream=false",
            "--log-json-split-stream=false",
            "--log-text-info-buffer-size=0",
            "--log-json-info-buffer-size=0",
        ],
        &[],
    );

    env.create_pvc(&env.ns, "data", "fast", "5Mi", json!({}))
        .await;
    // WaitForFirstConsumer: the scheduler's choice, then our reschedule
    // path is not needed; the selected node comes from the test.
    let claims: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    claims
        .patch(
            "data",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {support::SELECTED_NODE: env.node}}}),
            ),
        )
        .await
        .expect("select node");
    let pv = env.wait_bound(&env.ns, "data").await;
    let pv_name = pv.metadata.name.clone().expect("pv name");
    assert!(
        support::finalizers(&pv).contains(&support::FINALIZER.to_owned()),
        "the PV carries our finalizer (PVs: patch is in the stock rules)"
    );
    // The API server names the field manager after the user agent, as for
    // the Go sidecar (client-go's default agent, from the binary's name).
    let managers: Vec<_> = pv
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.contains(&"csi-provisioner".to_owned()),
        "field managers of the PV: {managers:?}"
    );
    assert!(
        !managers.contains(&"unknown".to_owned()),
        "field managers of the PV: {managers:?}"
    );
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("PV and volume gone", Duration::from_secs(30), || async {
        (env.pv(&pv_name).await.is_none() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;

    // What the stock rules do not allow is said once, at start.
    assert_eq!(
        lines_with(&env, "running WITHOUT the write-ahead journal"),
        1,
        "{}",
        env.logs()
    );
    assert_eq!(
        lines_with(
            &env,
            "RBAC does not allow list/watch of volumeattributesclasses"
        ),
        1,
        "{}",
        env.logs()
    );
    let (status, metrics) = http_get(port, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("csi_provisioner_capability_enabled{capability=\"journal\"} 0"),
        "{metrics}"
    );
    // Kept on, as the Go image keeps it: a claim naming a class would be
    // refused, not provisioned without it.
    assert!(
        metrics.contains(
            "csi_provisioner_capability_enabled{capability=\"volume_attributes_class\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(http_get(port, "/readyz").await.0, 200, "ready");
    // No hot loop of refused requests: the journal read and the
    // VolumeAttributesClass probe, each once.
    let refused: Vec<_> = plane
        .audit()
        .into_iter()
        .filter(|r| r.user.username == user && r.code() == 403)
        .map(|r| format!("{} {}", r.verb, r.request_uri))
        .collect();
    assert!(refused.len() <= 2, "refused requests: {refused:#?}");
    let other_agents: Vec<_> = plane
        .audit()
        .into_iter()
        .filter(|r| r.user.username == user && !r.user_agent.starts_with("csi-provisioner/v"))
        .map(|r| format!("{} {} {:?}", r.verb, r.request_uri, r.user_agent))
        .collect();
    assert!(other_agents.is_empty(), "{other_agents:#?}");
    env.assert_consistent().await;
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}

/// A user bound to deploy/'s rules minus volumeattributesclasses; its
/// kubeconfig.
async fn user_without_volume_attributes_classes(env: &mut Env) -> std::path::PathBuf {
    let plane = env.plane().expect("real cluster");
    let user = format!("novac-{}", env.id);
    // deploy/'s rules minus volumeattributesclasses.
    env.grant_deploy_rbac(&user, &[]).await;
    let cluster_role = format!("{user}-{}", env.id);
    let mut role = env
        .get(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "",
            &cluster_role,
        )
        .await
        .expect("cluster role");
    for rule in role["rules"].as_array_mut().into_iter().flatten() {
        if let Some(resources) = rule["resources"].as_array_mut() {
            resources.retain(|r| r != "volumeattributesclasses");
        }
    }
    env.replace(role).await;
    env.expect_refusals(RULES_LACK_VAC, &[VAC_PROBE_REFUSED]);
    plane.kubeconfig_for(&user, None).expect("kubeconfig")
}

/// The gate not set: RBAC refusing the classes does not turn it off, as
/// in the Go image, which decides by discovery alone (upstream
/// `cmd/csi-provisioner/csi-provisioner.go`): a claim naming a class is
/// refused rather than provisioned without it. `tests/parity.rs`,
/// `the_volume_attributes_class_gate_with_rbac_refusing_the_classes`
/// compares the same with the Go image, both on the stock rules.
async fn rbac_without_volume_attributes_classes_keeps_the_gate_on_as_the_go_image(
    backend: Backend,
) {
    gate_kept_on_with_rbac_refusing_the_classes(backend, &[], "kept on, as the Go image keeps it")
        .await;
}

/// As upstream (#1425): a `VolumeAttributesClass` gate set on the command
/// line is never turned off. With RBAC refusing the class list, the
/// classes are not watched (a watch could never fill) but read per claim,
/// as the Go image always does (upstream `pkg/controller/controller.go`,
/// `prepareProvision`): a claim without a class is provisioned and
/// `/readyz` is 200; a claim naming one is refused (here first for the
/// driver's missing MODIFY_VOLUME, checked before the class, as upstream).
/// `tests/parity.rs`, `a_volume_attributes_class_gate_set_without_the_v1_api`
/// compares the same with the Go image where the API is not served.
async fn a_volume_attributes_class_gate_set_on_the_command_line_is_kept_on(backend: Backend) {
    gate_kept_on_with_rbac_refusing_the_classes(
        backend,
        &["--feature-gates=VolumeAttributesClass=true"],
        "kept on because --feature-gates sets it",
    )
    .await;
}

/// With RBAC refusing the class list, the classes are not watched but read
/// per claim: a claim without one is provisioned, one naming a class is
/// refused, `/readyz` is 200 and the capability metric says on; `line`
/// says why, once.
async fn gate_kept_on_with_rbac_refusing_the_classes(backend: Backend, flags: &[&str], line: &str) {
    let mut env = Env::new(backend).await;
    let kubeconfig = user_without_volume_attributes_classes(&mut env).await;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    let port = free_port();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let mut args = vec![http.as_str()];
    args.extend_from_slice(flags);
    env.start_sidecar_as(&kubeconfig, &args, &[]);
    env.provision(&env.ns, "data", "fast").await;
    env.create_pvc(
        &env.ns,
        "gold",
        "fast",
        "5Mi",
        json!({"spec": {"volumeAttributesClassName": env.class("gold")}}),
    )
    .await;
    let refused = env.wait_event(&env.ns, "gold", "ProvisioningFailed").await;
    assert!(
        refused.contains("MODIFY_VOLUME capability is not reported"),
        "{refused}"
    );
    assert_eq!(lines_with(&env, line), 1, "{}", env.logs());
    assert_eq!(
        http_get(port, "/readyz").await.0,
        200,
        "nothing waits for the classes"
    );
    let (_, metrics) = http_get(port, "/metrics").await;
    assert!(
        metrics.contains(
            "csi_provisioner_capability_enabled{capability=\"volume_attributes_class\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(env.stop_sidecar(), Some(0), "{}", env.logs());
}
