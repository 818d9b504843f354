//! Events of the provisioning and deletion flows, worded as upstream's so
//! users can search for what they know from the Go sidecar. The I/O layer
//! records each at most once per transition, not once per retry.

use crate::events::{EventNote, EventType};
use crate::wellknown as wk;

/// On the claim, once its PV is saved without a `volume_context` entry its
/// class lists (gate `ClaimMetadataPropagation`); the success event names
/// the PV.
pub fn volume_context_skipped(
    namespace: &str,
    name: &str,
    skipped: &crate::provision::claim_metadata::SkippedEntry,
) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_VOLUME_CONTEXT_SKIPPED,
        message: format!(
            "volume context key {key:?} is not put on the PV of claim \"{namespace}/{name}\" as {what}: {why}",
            key = skipped.key,
            what = skipped.what,
            why = skipped.why,
        ),
    }
}

/// On the claim, when a provisioning attempt starts.
pub fn provisioning_started(namespace: &str, name: &str) -> EventNote {
    EventNote {
        event_type: EventType::Normal,
        reason: wk::REASON_PROVISIONING,
        message: format!(
            "External provisioner is provisioning volume for claim \"{namespace}/{name}\""
        ),
    }
}

/// On the claim, when its data source is for an external populator.
pub fn external_populator() -> EventNote {
    EventNote {
        event_type: EventType::Normal,
        reason: wk::REASON_PROVISIONING,
        message: "Assuming an external populator will provision the volume".to_owned(),
    }
}

/// On the claim, once its PV is saved.
pub fn provisioning_succeeded(volume_name: &str) -> EventNote {
    EventNote {
        event_type: EventType::Normal,
        reason: wk::REASON_PROVISIONING_SUCCEEDED,
        message: format!("Successfully provisioned volume {volume_name}"),
    }
}

/// On the claim, when provisioning failed; `error` is the plan error or the
/// driver's error as [`crate::csi::grpc_error_text`] prints it. v6
/// writes the error alone (sig-storage-lib-external-provisioner v13 records
/// `err.Error()`; the `failed to provision volume with StorageClass "…": `
/// prefix of older releases is gone), so the event says exactly what the
/// driver or the plan said.
pub fn provisioning_failed(error: &str) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_PROVISIONING_FAILED,
        message: error.to_owned(),
    }
}

/// On the claim, when the write-ahead journal cannot take its operation
/// (too large, or too many in flight): CreateVolume is not called, the
/// claim is retried with backoff.
pub fn journal_refused(reason: &str) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_PROVISIONING_FAILED,
        message: format!(
            "cannot record the operation in the write-ahead journal, not provisioning yet: {reason}"
        ),
    }
}

/// On the claim, when the driver refused the request as invalid
/// (`InvalidArgument`) and it is not retried before `--retry-interval-max`
/// unless the claim or its class changes.
pub fn provisioning_infeasible(error: &str) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_PROVISIONING_FAILED,
        message: format!(
            "Volume provisioning failed with infeasible error. Retries will be delayed. {error}"
        ),
    }
}

/// Upstream's text for a provisioner secret that cannot be read
/// (`getCredentials`).
pub fn secret_error(namespace: &str, name: &str, error: &str) -> String {
    format!("error getting secret {name} in namespace {namespace}: {error}")
}

/// An API error as Go's client prints it: the status message alone
/// (`secrets "x" not found`), not kube's debug rendering of the status.
pub fn kube_error_text(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// On the claim, when the PV could not be saved and the backend volume was
/// deleted again.
pub fn pv_save_failed(namespace: &str, name: &str, error: &str) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_PROVISIONING_FAILED,
        message: format!(
            "Error creating provisioned PV object for claim {namespace}/{name}: {error}. Deleting the volume."
        ),
    }
}

/// On the claim, when deleting the backend volume of an unsaved PV failed too.
pub fn pv_save_cleanup_failed(volume_name: &str, error: &str) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_PROVISIONING_CLEANUP_FAILED,
        message: format!(
            "Error cleaning provisioned volume {volume_name}: {error}. Please delete manually."
        ),
    }
}

/// On the volume, when `DeleteVolume` failed.
pub fn delete_failed(error: &str) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_VOLUME_FAILED_DELETE,
        message: error.to_owned(),
    }
}

/// On the volume, while a VolumeAttachment still holds it: a failed delete
/// with upstream's wording, retried with backoff (and, here, recorded once
/// per transition rather than once per retry).
pub fn delete_waiting_for_detach(volume_name: &str, node: &str) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_VOLUME_FAILED_DELETE,
        message: super::delete::still_attached_message(volume_name, node),
    }
}

/// On the volume, when the API server refused a finalizer patch whose
/// tests held on the live PV (`what` says which change).
pub fn finalizer_patch_refused(what: &str, error: &str) -> EventNote {
    EventNote {
        event_type: EventType::Warning,
        reason: wk::REASON_FINALIZER_PATCH_REFUSED,
        message: format!(
            "the API server refused to {what} although the volume is as the patch expects: {error}; not retried until the volume changes. A validating admission webhook or policy on PersistentVolumes is the likely cause: let it allow this change"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_wording() {
        let cases = [
            (
                provisioning_started("ns", "data"),
                EventType::Normal,
                "Provisioning",
                "External provisioner is provisioning volume for claim \"ns/data\"",
            ),
            (
                provisioning_succeeded("pvc-1"),
                EventType::Normal,
                "ProvisioningSucceeded",
                "Successfully provisioned volume pvc-1",
            ),
            // v6.3's wording for each kind of failure: the driver's gRPC
            // error, a plan error, a secret, an unusable answer.
            (
                provisioning_failed("rpc error: code = Internal desc = boom"),
                EventType::Warning,
                "ProvisioningFailed",
                "rpc error: code = Internal desc = boom",
            ),
            (
                provisioning_failed(
                    &crate::provision::ProvisionError::SelectorNotSupported.to_string(),
                ),
                EventType::Warning,
                "ProvisioningFailed",
                "claim Selector is not supported",
            ),
            (
                provisioning_failed(&secret_error("ns", "creds", "secrets \"creds\" not found")),
                EventType::Warning,
                "ProvisioningFailed",
                "error getting secret creds in namespace ns: secrets \"creds\" not found",
            ),
            (
                provisioning_failed(
                    &crate::provision::PvBuildError::CapacityTooSmall {
                        returned: 1,
                        requested: 2,
                    }
                    .to_string(),
                ),
                EventType::Warning,
                "ProvisioningFailed",
                "created volume capacity 1 less than requested capacity 2",
            ),
            (
                provisioning_infeasible("rpc error: code = InvalidArgument desc = no"),
                EventType::Warning,
                "ProvisioningFailed",
                "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = no",
            ),
            (
                external_populator(),
                EventType::Normal,
                "Provisioning",
                "Assuming an external populator will provision the volume",
            ),
            (
                pv_save_failed("ns", "data", "boom"),
                EventType::Warning,
                "ProvisioningFailed",
                "Error creating provisioned PV object for claim ns/data: boom. Deleting the volume.",
            ),
            (
                pv_save_cleanup_failed("pvc-1", "boom"),
                EventType::Warning,
                "ProvisioningCleanupFailed",
                "Error cleaning provisioned volume pvc-1: boom. Please delete manually.",
            ),
            (
                delete_failed("boom"),
                EventType::Warning,
                "VolumeFailedDelete",
                "boom",
            ),
            (
                delete_waiting_for_detach("pvc-1", "node-a"),
                EventType::Warning,
                "VolumeFailedDelete",
                "persistentvolume pvc-1 is still attached to node node-a",
            ),
        ];
        // Ours: no upstream counterpart, says what to look at.
        let refused = finalizer_patch_refused("add the finalizer", "denied by policy");
        assert_eq!(refused.reason, "FinalizerPatchRefused");
        assert_eq!(
            refused.message,
            "the API server refused to add the finalizer although the volume is as the patch \
             expects: denied by policy; not retried until the volume changes. A validating \
             admission webhook or policy on PersistentVolumes is the likely cause: let it allow \
             this change"
        );
        for (note, event_type, reason, message) in cases {
            assert_eq!(note.event_type, event_type, "{message}");
            assert_eq!(note.reason, reason, "{message}");
            assert_eq!(note.message, message);
        }
        assert_eq!(EventType::Warning.as_str(), "Warning");
    }

    #[test]
    fn api_errors_read_like_gos() {
        let not_found = kube::Error::Api(Box::new(kube::core::Status {
            message: "secrets \"creds\" not found".into(),
            reason: "NotFound".into(),
            code: 404,
            ..Default::default()
        }));
        assert_eq!(kube_error_text(&not_found), "secrets \"creds\" not found");
        let other = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(kube_error_text(&other), other.to_string());
    }
}
