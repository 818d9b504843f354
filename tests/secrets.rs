//! Secrets never leak: a full provisioning and deletion
//! with provisioner and deletion secrets, logged at the most verbose level
//! (`--v=10`, `RUST_LOG=trace`), leaves no secret value in the logs, the
//! events, the journal or the PV. (`Debug` of every CSI message with a
//! secret field is redacted: proto/tests.)

mod support;

use std::time::Duration;

use base64::Engine as _;
use serde_json::json;
use support::{Backend, ClusterConfig, Env};

e2e!(ClusterConfig::standard(); secret_values_appear_nowhere);

const SECRET_VALUE: &str = "s3cr3t-Va1ue-that-must-never-be-logged";

async fn secret_values_appear_nowhere(backend: Backend) {
    let mut env = Env::new(backend).await;
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET_VALUE);
    env.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "backend-creds", "namespace": env.ns},
        "data": {"password": b64, "user": base64::engine::general_purpose::STANDARD.encode("admin")}}))
        .await;
    env.storage_class(
        "secret",
        "Immediate",
        "Delete",
        json!({
            "csi.storage.k8s.io/provisioner-secret-name": "backend-creds",
            "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
        }),
    )
    .await;
    env.start_sidecar_with_env(&["--v=10"], &[("RUST_LOG", "trace")])
        .await;
    let (pv, name) = env.provision(&env.ns, "data", "secret").await;
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("volume.kubernetes.io/provisioner-deletion-secret-name")
            .map(String::as_str),
        Some("backend-creds"),
        "the deletion secret is referenced by name"
    );
    let journal = env.journal().await;
    env.delete_pvc(&env.ns, "data").await;
    env.wait_for("PV and volume gone", Duration::from_secs(30), || async {
        (env.pv(&name).await.is_none() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0));

    let logs = env.logs();
    assert!(
        logs.contains("CreateVolume") && logs.lines().count() > 20,
        "verbose logs were written"
    );
    for (what, text) in [
        ("logs", logs.clone()),
        ("PV", serde_json::to_string(&pv).unwrap_or_default()),
        (
            "journal",
            serde_json::to_string(&journal).unwrap_or_default(),
        ),
        ("events", format!("{:?}", env.events(&env.ns, "data").await)),
        ("PV events", format!("{:?}", env.pv_events(&name).await)),
    ] {
        assert!(
            !text.contains(SECRET_VALUE),
            "the secret value is in the {what}"
        );
        assert!(
            !text.contains(&b64),
            "the base64 secret value is in the {what}"
        );
    }
}
