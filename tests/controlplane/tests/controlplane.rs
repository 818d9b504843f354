//! The control plane itself: starts, serves, authorises, audits, restarts.

use controlplane::{Config, ControlPlane};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_rbac_audits_and_restarts() {
    let Some(plane) = ControlPlane::shared(&Config::standard(), "serves_rbac_audits_and_restarts")
    else {
        return;
    };
    let admin = plane.admin_client().await.expect("admin client");
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "cp-test"}}))
            .expect("namespace");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("admin creates a namespace");

    // An ordinary user has no rights until bound.
    let kubeconfig = plane
        .kubeconfig_for("nobody", None)
        .expect("user kubeconfig");
    let nobody = controlplane::client_from(&kubeconfig)
        .await
        .expect("user client");
    let err = Api::<Namespace>::all(nobody)
        .list(&Default::default())
        .await
        .expect_err("forbidden");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err:?}"
    );

    let audit = plane.audit();
    assert!(
        audit
            .iter()
            .any(|r| r.user.username == "nobody" && r.verb == "list" && r.code() == 403),
        "the forbidden list is in the audit log"
    );
    assert!(
        audit.iter().any(|r| r.user.username == "controlplane-admin"
            && r.verb == "create"
            && r.resource() == "namespaces"),
        "the namespace create is in the audit log"
    );

    plane.restart_apiserver().expect("restart");
    let admin = plane.admin_client().await.expect("admin client");
    Api::<Namespace>::all(admin)
        .get("cp-test")
        .await
        .expect("data survives a restart of the API server");
}
