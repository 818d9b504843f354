//! Slow retries of infeasible requests, as upstream 6.x does them
//! (sig-storage-lib-external-provisioner v13, `markForSlowRetry` and
//! `delayProvisioningIfRecentlyInfeasible` over csi-lib-utils' `SlowSet`).
//!
//! A `CreateVolume` that failed with `InvalidArgument` cannot succeed as it
//! is: retrying it on the normal backoff only repeats the same refusal (and
//! the driver's log line). Upstream remembers the claim with the time and
//! its class's uid and skips it until `--retry-interval-max` has passed or
//! the class was replaced. We also let a change of the claim itself (its
//! spec or annotations, e.g. a new selected node or a user's fix) end the
//! wait at once: the next request would differ, so it deserves a try.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use crate::projection::PersistentVolumeClaim;
use crate::projection::StorageClass;
use tokio::time::Instant;

/// What an infeasible failure is remembered by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfeasibleMark {
    pub at: Instant,
    /// The uid of the class the request was made with.
    pub class_uid: String,
    /// [`claim_fingerprint`] of the claim the request was made for.
    pub claim: u64,
}

/// Whether to try the claim now: `None` to go ahead (the mark, if any, no
/// longer applies), or how long it still waits.
pub fn infeasible_delay(
    mark: Option<&InfeasibleMark>,
    now: Instant,
    class_uid: &str,
    claim: u64,
    retry_interval_max: Duration,
) -> Option<Duration> {
    let mark = mark?;
    if mark.class_uid != class_uid || mark.claim != claim {
        return None;
    }
    let waited = now.saturating_duration_since(mark.at);
    retry_interval_max
        .checked_sub(waited)
        .filter(|left| !left.is_zero())
}

/// What of a claim feeds its `CreateVolume` request and can change while it
/// is pending: the spec and the annotations (selected node, provisioner).
/// Status, labels, finalizers and the resourceVersion do not count: other
/// controllers touch them without changing the request.
pub fn claim_fingerprint(claim: &PersistentVolumeClaim) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&claim.spec)
        .unwrap_or_default()
        .hash(&mut hasher);
    claim.metadata.annotations.hash(&mut hasher);
    hasher.finish()
}

/// The claims whose last request was infeasible, by claim uid.
#[derive(Debug)]
pub struct InfeasibleClaims {
    retry_interval_max: Duration,
    marks: Mutex<HashMap<String, InfeasibleMark>>,
}

impl InfeasibleClaims {
    pub fn new(retry_interval_max: Duration) -> Self {
        Self {
            retry_interval_max,
            marks: Mutex::default(),
        }
    }

    /// How long the claim is held back after an infeasible failure.
    pub fn retry_interval_max(&self) -> Duration {
        self.retry_interval_max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, InfeasibleMark>> {
        // Each method changes the map in one step: a panic elsewhere leaves
        // it consistent.
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers an infeasible failure of claim `uid`. Without the class
    /// (not in the cache) nothing is remembered, as upstream: the claim
    /// then retries on the normal backoff.
    pub fn mark(&self, uid: &str, class: Option<&StorageClass>, claim: &PersistentVolumeClaim) {
        let Some(class) = class else {
            return;
        };
        let now = Instant::now();
        let mut marks = self.lock();
        // Expired marks go here rather than on a timer.
        let max = self.retry_interval_max;
        marks.retain(|_, m| now.saturating_duration_since(m.at) < max);
        marks.insert(
            uid.to_owned(),
            InfeasibleMark {
                at: now,
                class_uid: class.metadata.uid.clone().unwrap_or_default(),
                claim: claim_fingerprint(claim),
            },
        );
    }

    /// How long claim `uid` must still wait, if at all; forgets a mark that
    /// no longer applies.
    pub fn delay(
        &self,
        uid: &str,
        class: &StorageClass,
        claim: &PersistentVolumeClaim,
    ) -> Option<Duration> {
        let mut marks = self.lock();
        let mark = marks.get(uid)?;
        let wait = infeasible_delay(
            Some(mark),
            Instant::now(),
            class.metadata.uid.as_deref().unwrap_or_default(),
            claim_fingerprint(claim),
            self.retry_interval_max,
        );
        if wait.is_none() {
            marks.remove(uid);
        }
        wait
    }

    /// The claim is done with (provisioned, gone, not ours).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::PersistentVolumeClaimSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn claim(annotations: &[(&str, &str)], class: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("ns".into()),
                uid: Some("claim-uid".into()),
                annotations: (!annotations.is_empty()).then(|| {
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect()
                }),
                ..ObjectMeta::default()
            }
            .into(),
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some(class.into()),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: None,
        }
    }

    fn class(uid: &str) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("fast".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            provisioner: "x".into(),
            ..StorageClass::default()
        }
    }

    #[test]
    fn the_decision() {
        let t0 = Instant::now();
        let max = Duration::from_secs(300);
        let mark = InfeasibleMark {
            at: t0,
            class_uid: "class-1".into(),
            claim: 7,
        };
        let at = |s: u64| t0 + Duration::from_secs(s);
        for (mark, now, class_uid, claim, want) in [
            (None, at(0), "class-1", 7, None),
            (Some(&mark), at(0), "class-1", 7, Some(300)),
            (Some(&mark), at(120), "class-1", 7, Some(180)),
            (Some(&mark), at(299), "class-1", 7, Some(1)),
            (Some(&mark), at(300), "class-1", 7, None),
            (Some(&mark), at(1_000), "class-1", 7, None),
            // The class was deleted and created again.
            (Some(&mark), at(10), "class-2", 7, None),
            // The claim changed.
            (Some(&mark), at(10), "class-1", 8, None),
        ] {
            assert_eq!(
                infeasible_delay(mark, now, class_uid, claim, max),
                want.map(Duration::from_secs),
                "{mark:?} {class_uid} {claim}"
            );
        }
        // A clock that goes nowhere still waits the full interval.
        let later = InfeasibleMark { at: at(5), ..mark };
        assert_eq!(
            infeasible_delay(Some(&later), at(0), "class-1", 7, max),
            Some(max)
        );
    }

    #[test]
    fn fingerprints_follow_what_feeds_the_request() {
        let base = claim(&[("volume.kubernetes.io/selected-node", "a")], "fast");
        let same = {
            let mut c = base.clone();
            c.metadata.resource_version = Some("42".into());
            c.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
            c.metadata.finalizers = Some(vec!["kubernetes.io/pvc-protection".into()]);
            c
        };
        assert_eq!(claim_fingerprint(&base), claim_fingerprint(&same));
        let other_node = claim(&[("volume.kubernetes.io/selected-node", "b")], "fast");
        assert_ne!(claim_fingerprint(&base), claim_fingerprint(&other_node));
        let other_class = claim(&[("volume.kubernetes.io/selected-node", "a")], "slow");
        assert_ne!(claim_fingerprint(&base), claim_fingerprint(&other_class));
    }

    #[tokio::test(start_paused = true)]
    async fn claims_wait_until_the_interval_passes_or_something_changes() {
        let claims = InfeasibleClaims::new(Duration::from_secs(60));
        let data = claim(&[], "fast");
        let fast = class("class-1");
        assert_eq!(claims.delay("claim-uid", &fast, &data), None);
        claims.mark("claim-uid", None, &data);
        assert_eq!(
            claims.delay("claim-uid", &fast, &data),
            None,
            "no class, no mark"
        );

        claims.mark("claim-uid", Some(&fast), &data);
        assert_eq!(
            claims.delay("claim-uid", &fast, &data),
            Some(Duration::from_secs(60))
        );
        tokio::time::advance(Duration::from_secs(45)).await;
        assert_eq!(
            claims.delay("claim-uid", &fast, &data),
            Some(Duration::from_secs(15))
        );
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(claims.delay("claim-uid", &fast, &data), None);
        assert_eq!(
            claims.delay("claim-uid", &fast, &data),
            None,
            "an expired mark is forgotten"
        );

        claims.mark("claim-uid", Some(&fast), &data);
        let edited = claim(&[("example.com/fixed", "true")], "fast");
        assert_eq!(claims.delay("claim-uid", &fast, &edited), None);
        assert_eq!(
            claims.delay("claim-uid", &fast, &data),
            None,
            "the mark went with the change"
        );

        claims.mark("claim-uid", Some(&fast), &data);
        assert_eq!(claims.delay("claim-uid", &class("class-2"), &data), None);

        claims.mark("claim-uid", Some(&fast), &data);
        claims.forget("claim-uid");
        assert_eq!(claims.delay("claim-uid", &fast, &data), None);
    }
}
