//! The checks, in the order they run. Names follow the upstream Ginkgo
//! descriptions (`<Describe> <Describe> <It>`) so `--focus`/`--skip`
//! patterns written for the Go csi-sanity select the same checks.

/// Builds a [`Check`](crate::runner::Check) from a name and an
/// `async fn(T) -> CheckOutcome`.
macro_rules! check {
    ($name:expr, $f:path) => {
        $crate::runner::Check {
            name: $name,
            run: |t| Box::pin($f(t)),
        }
    };
}

pub mod controller;
pub mod identity;
pub mod node;
pub mod snapshot;
pub mod util;

use crate::runner::Check;

/// Every check, in run order (the final cleanup check is added by the
/// runner).
pub fn all() -> Vec<Check> {
    let mut checks = identity::checks();
    checks.extend(controller::checks());
    checks.extend(snapshot::checks());
    checks.extend(node::checks());
    checks
}

/// Names of every check, including the final cleanup check.
pub fn names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = all().iter().map(|c| c.name).collect();
    names.push(crate::runner::CLEANUP_CHECK);
    names
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_unique_and_hierarchical() {
        let names = super::names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "duplicate check names");
        for n in names {
            assert!(n.split(' ').count() >= 3, "{n}");
            assert!(
                !n.contains(':'),
                "a colon would break the output format: {n}"
            );
        }
    }
}
