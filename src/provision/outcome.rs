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
/// `AlreadyExists` is in background too (see below).
///
/// `ResourceExhausted` without rescheduling is treated as in background, on
/// purpose: the code is also what gRPC reports for oversized messages
/// (tonic says `OutOfRange`; src/csi/mod.rs turns it into this code),
/// and keeping the request frozen is the side that cannot leak. (Upstream
/// treats it as final.)
pub fn classify_create_volume_error(code: Code, may_reschedule: bool) -> CreateVolumeOutcome {
    use crate::csi::error::{ErrorClass, classify};
    match code {
        Code::ResourceExhausted if may_reschedule => CreateVolumeOutcome::Reschedule,
        // The non-final codes are the CSI client's (one list for the whole
        // sidecar).
        _ if classify(code) == ErrorClass::NonFinal => CreateVolumeOutcome::InBackground,
        // A driver may answer a repeat with ALREADY_EXISTS while its first
        // call for the name still runs (docs/driver-habits.md, row 5): that
        // call may still make the volume, so the request stays in flight
        // (a claim deleted meanwhile would leak it). The cleanup never
        // takes this code for "no volume" either (`cleanup_after_error`).
        // Upstream treats it as final.
        Code::AlreadyExists => CreateVolumeOutcome::InBackground,
        Code::InvalidArgument => CreateVolumeOutcome::Infeasible,
        _ => CreateVolumeOutcome::Final,
    }
}

/// How many final errors the repeated `CreateVolume` of a claim deleted
/// during provisioning must get before the cleanup takes them for "no
/// volume exists". The first call's answer was lost, so the volume may
/// exist; a compliant driver then answers the identical request with it,
/// but a driver whose backend hiccups (INTERNAL, or any code on a bad
/// moment) would have one error leak the volume for ever (chaos seeds 686
/// and 828). Asked again over the retry back-off (at least 15 s at the
/// default `--retry-interval-start`), a final answer that holds is
/// believed; upstream believes the first one.
pub const CLEANUP_FINAL_ANSWERS: u32 = 5;

/// How the cleanup of a claim deleted during provisioning goes on after
/// its repeated `CreateVolume` failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupAfterError {
    /// Send the same request again; `final_answers` is the count of final
    /// errors so far (unchanged by an error that is not one).
    AskAgain { final_answers: u32 },
    /// The driver holds to a final error: it did not create (and will not
    /// create) the volume.
    NoVolume,
}

/// The cleanup's step after an error `code`, when `final_answers` final
/// errors came before. `ALREADY_EXISTS` says a volume of that name exists,
/// so it never counts towards "no volume" (chaos seed 453 leaked it so).
pub fn cleanup_after_error(code: Code, final_answers: u32) -> CleanupAfterError {
    use crate::csi::error::{ErrorClass, classify};
    if code == Code::AlreadyExists || classify(code) == ErrorClass::NonFinal {
        return CleanupAfterError::AskAgain { final_answers };
    }
    let final_answers = final_answers.saturating_add(1);
    if final_answers < CLEANUP_FINAL_ANSWERS {
        CleanupAfterError::AskAgain { final_answers }
    } else {
        CleanupAfterError::NoVolume
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CreateVolumeOutcome::*;

    #[test]
    fn a_cleanup_believes_only_a_final_error_that_holds() {
        use CleanupAfterError::*;
        let last = CLEANUP_FINAL_ANSWERS - 1;
        let cases: &[(Code, CleanupAfterError, CleanupAfterError)] = &[
            // code, after no final answer, after all but the last
            (
                Code::Cancelled,
                AskAgain { final_answers: 0 },
                AskAgain {
                    final_answers: last,
                },
            ),
            (Code::Unknown, AskAgain { final_answers: 1 }, NoVolume),
            (
                Code::InvalidArgument,
                AskAgain { final_answers: 1 },
                NoVolume,
            ),
            (
                Code::DeadlineExceeded,
                AskAgain { final_answers: 0 },
                AskAgain {
                    final_answers: last,
                },
            ),
            (Code::NotFound, AskAgain { final_answers: 1 }, NoVolume),
            (
                Code::AlreadyExists,
                AskAgain { final_answers: 0 },
                AskAgain {
                    final_answers: last,
                },
            ),
            (
                Code::PermissionDenied,
                AskAgain { final_answers: 1 },
                NoVolume,
            ),
            (
                Code::ResourceExhausted,
                AskAgain { final_answers: 0 },
                AskAgain {
                    final_answers: last,
                },
            ),
            (
                Code::FailedPrecondition,
                AskAgain { final_answers: 1 },
                NoVolume,
            ),
            (
                Code::Aborted,
                AskAgain { final_answers: 0 },
                AskAgain {
                    final_answers: last,
                },
            ),
            (Code::OutOfRange, AskAgain { final_answers: 1 }, NoVolume),
            (Code::Unimplemented, AskAgain { final_answers: 1 }, NoVolume),
            (Code::Internal, AskAgain { final_answers: 1 }, NoVolume),
            (
                Code::Unavailable,
                AskAgain { final_answers: 0 },
                AskAgain {
                    final_answers: last,
                },
            ),
            (Code::DataLoss, AskAgain { final_answers: 1 }, NoVolume),
            (
                Code::Unauthenticated,
                AskAgain { final_answers: 1 },
                NoVolume,
            ),
        ];
        for (code, first, at_last) in cases {
            assert_eq!(cleanup_after_error(*code, 0), *first, "{code:?}");
            assert_eq!(cleanup_after_error(*code, last), *at_last, "{code:?}");
        }
        // Never wraps around into asking for ever or believing at once.
        assert_eq!(cleanup_after_error(Code::Internal, u32::MAX), NoVolume);
    }

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
            (Code::AlreadyExists, InBackground, InBackground),
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
}
