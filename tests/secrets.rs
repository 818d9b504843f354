//! Secrets never leak: a full provisioning and deletion
//! with provisioner and deletion secrets, logged at the most verbose level
//! (`--v=10`, `RUST_LOG=trace`), leaves no secret value in the logs, the
//! events, the journal or the PV. (`Debug` of every CSI message with a
//! secret field is redacted: proto/tests.) The journal is read while the
//! `CreateVolume`s that carry the secrets are held by the driver (each
//! attempt answered `UNAVAILABLE`, so the sidecar keeps the operation open
//! and calls again, until the test lets them through), and its entries
//! decoded (base64 protobuf, deflated when large) with the sidecar's own
//! codec: each claim has its entry then, the entry references the secret,
//! and no secret value is in it.

mod support;

use std::time::Duration;

use base64::Engine as _;
use csi_hostpath::faults::Fault;
use prost::Message as _;
use serde_json::json;
use support::{Backend, ClusterConfig, Env};
use tonic::Code;

e2e!(ClusterConfig::standard(); secret_values_appear_nowhere);

const SECRET_VALUE: &str = "s3cr3t-Va1ue-that-must-never-be-logged";
const SECRET_USER: &str = "admin-of-the-backend";

/// How long the driver holds each `CreateVolume` attempt before it answers
/// `UNAVAILABLE` (while the test holds the calls): the calls spend most of
/// the time in the driver, and the sidecar's retries stay few.
const HELD: Duration = Duration::from_millis(500);

/// (claim, class): `small`'s frozen request is stored as it is, `large`'s
/// (a parameter of 8 KiB) deflated.
const CLAIMS: &[(&str, &str)] = &[("small", "secret"), ("large", "large")];

async fn secret_values_appear_nowhere(backend: Backend) {
    let mut env = Env::new(backend).await;
    let b64 = |value: &str| base64::engine::general_purpose::STANDARD.encode(value);
    env.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "backend-creds", "namespace": env.ns},
        "data": {"password": b64(SECRET_VALUE), "user": b64(SECRET_USER)}}))
        .await;
    let secret_params = json!({
        "csi.storage.k8s.io/provisioner-secret-name": "backend-creds",
        "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
    });
    env.storage_class("secret", "Immediate", "Delete", secret_params.clone())
        .await;
    let mut large = secret_params;
    large["padding"] = json!("p".repeat(8 << 10));
    env.storage_class("large", "Immediate", "Delete", large)
        .await;
    // Every CreateVolume is held until the test lets go: the secrets are in
    // use. The driver answers each attempt `UNAVAILABLE` ("may still be in
    // progress") after a while, without touching its backend; the sidecar
    // keeps the operation and its journal entry, and calls again. So the
    // reads below happen with the operations open however slow the
    // machine is, where a fixed delay would let them answer meanwhile.
    env.set_faults(vec![
        Fault::error("CreateVolume", Code::Unavailable)
            .with_delay(HELD)
            .with_message("held by the test"),
    ]);
    env.start_sidecar_with_env(&["--v=10"], &[("RUST_LOG", "trace")])
        .await;
    let mut uids = Vec::new();
    for (claim, class) in CLAIMS {
        let pvc = env
            .create_pvc(&env.ns, claim, class, "5Mi", json!({}))
            .await;
        uids.push(pvc.metadata.uid.clone().expect("claim uid"));
    }

    // Both calls sent (the sidecar logs that right before it calls, the
    // secret read), none let through: the journal read now holds both
    // operations, and the backend check after it shows that nothing was
    // created before the read (the driver refuses every call until the
    // faults are cleared).
    env.wait_for(
        "both CreateVolume calls sent",
        Duration::from_secs(20),
        || async {
            let logs = env.logs();
            CLAIMS
                .iter()
                .all(|(claim, _)| {
                    logs.lines().any(|l| {
                        l.contains("calling CreateVolume")
                            && l.contains(&support::log_field(
                                "claim",
                                &format!("{}/{claim}", env.ns),
                            ))
                    })
                })
                .then_some(())
        },
    )
    .await;
    let in_flight = env.journal().await;
    let entries = env.journal_entries().await;
    assert!(
        env.backend_volumes().is_empty(),
        "a CreateVolume created a volume before the journal was read, although the driver \
         was told to refuse them: nothing shows the entries held while the secret was in use\n{}",
        env.logs()
    );
    let secret_reads = env
        .sidecar_request_log()
        .into_iter()
        .filter(|(verb, resource, name, _)| {
            verb == "get" && resource == "secrets" && name == "backend-creds"
        })
        .count();
    assert!(
        secret_reads >= 1,
        "the sidecar read the secret before its calls: {:?}",
        env.sidecar_request_log()
    );
    for ((claim, _), uid) in CLAIMS.iter().zip(&uids) {
        let Some((entry, request)) = entries.get(uid) else {
            panic!(
                "no journal entry for claim {claim} (uid {uid}) while its CreateVolume with \
                 secrets was in flight: {entries:#?}\n{}",
                env.logs()
            );
        };
        assert_eq!(
            (
                entry.secret_name.as_deref(),
                entry.secret_namespace.as_deref()
            ),
            (Some("backend-creds"), Some(env.ns.as_str())),
            "the entry of {claim} references the secret: {entry:#?}"
        );
        assert!(
            request.secrets.is_empty(),
            "the frozen request of {claim} holds secrets (keys {:?})",
            request.secrets.keys().collect::<Vec<_>>()
        );
        assert_eq!(
            (entry.volume_name.as_str(), entry.compressed),
            (request.name.as_str(), *claim == "large"),
            "the entry of {claim}: volume name, and deflated only when large"
        );
        // The decoded request, every byte of it (the `Debug` of a request
        // redacts secrets, so it would not show one), and the entry as the
        // journal stores it.
        let decoded = request.encode_to_vec();
        let stored = in_flight.get(uid).expect("stored entry");
        for value in [SECRET_VALUE, SECRET_USER] {
            for (what, bytes) in [
                ("decoded request", decoded.as_slice()),
                ("stored entry", stored.as_bytes()),
            ] {
                for needle in [value.to_owned(), b64(value)] {
                    assert!(
                        !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                        "a secret value ({needle}) is in the {what} of {claim}'s journal entry: \
                         {entry:#?}"
                    );
                }
            }
        }
    }

    // Let the calls through: the sidecar's next attempts create the volumes.
    env.clear_faults();
    let mut pvs = Vec::new();
    for (claim, _) in CLAIMS {
        pvs.push(env.wait_bound(&env.ns, claim).await);
    }
    for pv in &pvs {
        let annotations = pv.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get("volume.kubernetes.io/provisioner-deletion-secret-name")
                .map(String::as_str),
            Some("backend-creds"),
            "the deletion secret is referenced by name"
        );
    }
    env.wait_for(
        "the journal emptied once the PVs are saved",
        Duration::from_secs(20),
        || async { env.journal().await.is_empty().then_some(()) },
    )
    .await;
    for (claim, _) in CLAIMS {
        env.delete_pvc(&env.ns, claim).await;
    }
    env.wait_for("PVs and volumes gone", Duration::from_secs(30), || async {
        (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
    })
    .await;
    assert_eq!(env.stop_sidecar(), Some(0));

    let logs = env.logs();
    assert!(
        logs.contains("CreateVolume") && logs.lines().count() > 20,
        "verbose logs were written"
    );
    let mut texts = vec![
        ("logs", logs.clone()),
        ("PVs", serde_json::to_string(&pvs).unwrap_or_default()),
        (
            "journal",
            serde_json::to_string(&in_flight).unwrap_or_default(),
        ),
    ];
    for (claim, _) in CLAIMS {
        texts.push(("events", format!("{:?}", env.events(&env.ns, claim).await)));
    }
    for pv in &pvs {
        let name = pv.metadata.name.as_deref().expect("PV name");
        texts.push(("PV events", format!("{:?}", env.pv_events(name).await)));
    }
    for (what, text) in texts {
        for value in [SECRET_VALUE, SECRET_USER] {
            assert!(!text.contains(value), "the secret value is in the {what}");
            assert!(
                !text.contains(&b64(value)),
                "the base64 secret value is in the {what}"
            );
        }
    }
}
