//! What a failed `CreateVolume` means for the claim's operation.
//!
//! The question is whether the driver may still be creating the volume: if
//! so, the sidecar must keep sending the same frozen request (even for a
//! deleted claim) until it gets a definite answer, and delete the volume if
//! the claim is gone by then — otherwise the volume leaks.

use tonic::Code;

/// How the operation continues after a failed `CreateVolume`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateVolumeOutcome {
    /// The driver is not working on the volume. Record `ProvisioningFailed`,
    /// drop the frozen request, retry with backoff or when the claim changes.
    Final,
    /// `InvalidArgument`: final, and the request cannot succeed as it is;
    /// retry only slowly (upstream's "infeasible" delay) or when the claim or
    /// its class changes.
    Infeasible,
    /// The operation may still be running on the backend (timeout, lost
    /// connection, cancelled, `Aborted` = pending): keep the frozen request and
    /// retry it, also after the claim was deleted.
    InBackground,
    /// `ResourceExhausted` on a topology-aware driver with a selected node:
    /// final for this node; remove the claim's selected-node annotation so the
    /// scheduler picks another one.
    Reschedule,
}

impl CreateVolumeOutcome {
    /// Whether the backend may still create the volume for this request.
    pub fn may_be_in_progress(self) -> bool {
        self == CreateVolumeOutcome::InBackground
    }
}

/// Whether a failure may send the claim back to the scheduler: only when the
/// driver is topology aware (otherwise the next node gets the same request)
/// and the claim has a selected node (otherwise nobody reschedules it).
pub fn may_reschedule(topology_enabled: bool, selected_node: Option<&str>) -> bool {
    topology_enabled && selected_node.is_some_and(|node| !node.is_empty())
}

/// Classifies the gRPC code of a failed `CreateVolume`. A failure that never
/// reached the driver (no gRPC status at all) must be passed as
/// [`Code::Unavailable`]: we cannot know whether an earlier attempt is running.
///
/// `ResourceExhausted` without rescheduling is treated as in background, as
/// DESIGN §3 asks: the code is also what gRPC reports for oversized messages,
/// and keeping the request frozen is the side that cannot leak. (Upstream
/// treats it as final.)
pub fn classify_create_volume_error(code: Code, may_reschedule: bool) -> CreateVolumeOutcome {
    use crate::csi::error::{ErrorClass, classify};
    match code {
        Code::ResourceExhausted if may_reschedule => CreateVolumeOutcome::Reschedule,
        // The non-final codes are the CSI client's (one list for the whole
        // sidecar).
        _ if classify(code) == ErrorClass::NonFinal => CreateVolumeOutcome::InBackground,
        Code::InvalidArgument => CreateVolumeOutcome::Infeasible,
        _ => CreateVolumeOutcome::Final,
    }
}

/// Go's name of a gRPC code, as it appears in `rpc error: code = … desc = …`.
pub fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// A gRPC failure as Go's status error prints it, which is what users of the
/// Go sidecar see (and search for) in events.
pub fn grpc_error_text(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        go_code_name(status.code()),
        status.message()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use CreateVolumeOutcome::*;

    #[test]
    fn every_code_is_classified() {
        let cases: &[(Code, CreateVolumeOutcome, CreateVolumeOutcome)] = &[
            // code, without reschedule, with reschedule
            (Code::Ok, Final, Final),
            (Code::Cancelled, InBackground, InBackground),
            (Code::Unknown, Final, Final),
            (Code::InvalidArgument, Infeasible, Infeasible),
            (Code::DeadlineExceeded, InBackground, InBackground),
            (Code::NotFound, Final, Final),
            (Code::AlreadyExists, Final, Final),
            (Code::PermissionDenied, Final, Final),
            (Code::ResourceExhausted, InBackground, Reschedule),
            (Code::FailedPrecondition, Final, Final),
            (Code::Aborted, InBackground, InBackground),
            (Code::OutOfRange, Final, Final),
            (Code::Unimplemented, Final, Final),
            (Code::Internal, Final, Final),
            (Code::Unavailable, InBackground, InBackground),
            (Code::DataLoss, Final, Final),
            (Code::Unauthenticated, Final, Final),
        ];
        for (code, without, with) in cases {
            assert_eq!(
                classify_create_volume_error(*code, false),
                *without,
                "{code:?}"
            );
            assert_eq!(
                classify_create_volume_error(*code, true),
                *with,
                "{code:?} may reschedule"
            );
        }
        assert!(InBackground.may_be_in_progress());
        assert!(
            !Final.may_be_in_progress()
                && !Reschedule.may_be_in_progress()
                && !Infeasible.may_be_in_progress()
        );
    }

    #[test]
    fn rescheduling_needs_topology_and_a_selected_node() {
        assert!(may_reschedule(true, Some("node-1")));
        assert!(!may_reschedule(true, Some("")));
        assert!(!may_reschedule(true, None));
        assert!(!may_reschedule(false, Some("node-1")));
    }

    #[test]
    fn go_status_text() {
        let status = tonic::Status::new(Code::ResourceExhausted, "Not enough disk space");
        assert_eq!(
            grpc_error_text(&status),
            "rpc error: code = ResourceExhausted desc = Not enough disk space"
        );
        assert_eq!(go_code_name(Code::Cancelled), "Canceled");
    }
}
