//! Which cached pods reference which claim, kept up to date from pod
//! events, so that deciding one claim reads the few pods that name it
//! instead of every pod of its namespace (a cluster may cache 50,000 pods).
//!
//! The index holds names only; the pods themselves are read from the watch
//! cache, so it never disagrees with the cache about a pod's content. It
//! may name a pod the cache no longer has (the event is on its way): the
//! reader skips it.

use std::collections::{BTreeSet, HashMap};

use super::ClaimName;

/// A pod by namespace and name (same shape as a claim's key).
pub type PodName = ClaimName;

#[derive(Debug, Default)]
pub struct PodsByClaim {
    /// What each pod referenced when last seen.
    claims_of: HashMap<PodName, Vec<ClaimName>>,
    /// The inverse: the pods referencing each claim.
    pods_of: HashMap<ClaimName, BTreeSet<PodName>>,
}

impl PodsByClaim {
    /// Records that `pod` now references `claims` (empty: none, or the pod
    /// is gone). Returns every claim it referenced before or now: each may
    /// have to be decided again.
    pub fn set(&mut self, pod: PodName, claims: Vec<ClaimName>) -> Vec<ClaimName> {
        let before = if claims.is_empty() {
            self.claims_of.remove(&pod)
        } else {
            self.claims_of.insert(pod.clone(), claims.clone())
        }
        .unwrap_or_default();
        for claim in &before {
            if let Some(pods) = self.pods_of.get_mut(claim) {
                pods.remove(&pod);
                if pods.is_empty() {
                    self.pods_of.remove(claim);
                }
            }
        }
        for claim in &claims {
            self.pods_of
                .entry(claim.clone())
                .or_default()
                .insert(pod.clone());
        }
        let mut touched = before;
        for claim in claims {
            if !touched.contains(&claim) {
                touched.push(claim);
            }
        }
        touched
    }

    /// The pods referencing `claim`.
    pub fn pods_using(&self, claim: &ClaimName) -> Vec<PodName> {
        self.pods_of
            .get(claim)
            .map(|pods| pods.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Number of pods indexed (for tests and metrics).
    pub fn len(&self) -> usize {
        self.claims_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims_of.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str) -> ClaimName {
        ClaimName::new("ns", name)
    }

    #[test]
    fn follows_pods_as_they_come_change_and_go() {
        let mut index = PodsByClaim::default();
        assert_eq!(
            index.set(c("web-0"), vec![c("data"), c("logs")]),
            vec![c("data"), c("logs")]
        );
        assert_eq!(index.set(c("web-1"), vec![c("data")]), vec![c("data")]);
        assert_eq!(index.pods_using(&c("data")), vec![c("web-0"), c("web-1")]);
        assert_eq!(index.pods_using(&c("logs")), vec![c("web-0")]);

        // web-0 stops using logs: both claims are touched, logs has no user.
        assert_eq!(
            index.set(c("web-0"), vec![c("data")]),
            vec![c("data"), c("logs")]
        );
        assert!(index.pods_using(&c("logs")).is_empty());

        // web-0 goes: data is left to web-1.
        assert_eq!(index.set(c("web-0"), vec![]), vec![c("data")]);
        assert_eq!(index.pods_using(&c("data")), vec![c("web-1")]);
        assert_eq!(index.len(), 1);

        // A pod gone that was never seen touches nothing.
        assert!(index.set(c("ghost"), vec![]).is_empty());
        assert_eq!(index.set(c("web-1"), vec![]), vec![c("data")]);
        assert!(index.is_empty());
        assert!(index.pods_of.is_empty(), "no empty sets left behind");
    }

    #[test]
    fn claims_of_other_namespaces_are_other_claims() {
        let mut index = PodsByClaim::default();
        index.set(ClaimName::new("a", "p"), vec![ClaimName::new("a", "data")]);
        assert!(index.pods_using(&ClaimName::new("b", "data")).is_empty());
    }
}
