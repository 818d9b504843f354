//! The shape of a declared Kubernetes API call. Each loop declares the
//! calls it makes next to its code (`pub const API_CALLS` in its own
//! module); `crate::startup::api_calls` gathers them by loop name (there,
//! not here: the loops import this module, and it imports none of them).
//!
//! Two checks read the declarations, so a call without its declaration (or
//! a declaration without its RBAC rule) fails CI instead of a user's
//! cluster: the deploy tests (`tests/deploy.rs`) check that the rules in
//! `deploy/` grant each declared call (and nothing no loop needs), and the
//! real-cluster harness (`tests/support/mod.rs`) checks every request of the
//! sidecar in the API server's audit log against
//! `crate::startup::declaring_api_call`.

/// One (group, resource, verbs) a loop uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Plural resource name, with `/subresource` when it is one.
    pub resource: &'static str,
    /// RBAC verbs: get, list, watch, create, update, patch, delete.
    pub verbs: &'static [&'static str],
    /// True when the call is made only in the sidecar's own namespace (a
    /// Role suffices); false for cluster-wide access (ClusterRole).
    pub namespaced_only: bool,
}

/// A cluster-wide call.
pub const fn call(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
) -> ApiCall {
    ApiCall {
        group,
        resource,
        verbs,
        namespaced_only: false,
    }
}

/// A call made only in the sidecar's own namespace.
pub const fn in_own_namespace(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
) -> ApiCall {
    ApiCall {
        group,
        resource,
        verbs,
        namespaced_only: true,
    }
}

/// A watched kind that is also read one object at a time.
pub const WATCH: &[&str] = &["get", "list", "watch"];

/// A kind read only through the shared watch caches.
pub const LIST_WATCH: &[&str] = &["list", "watch"];

/// The loops among `loops` that declare `verb` on `resource` (with
/// `/subresource`) of `group`; empty when none does.
pub fn declaring(
    loops: &[(&'static str, &'static [ApiCall])],
    verb: &str,
    group: &str,
    resource: &str,
) -> Vec<&'static str> {
    loops
        .iter()
        .filter(|(_, calls)| {
            calls
                .iter()
                .any(|c| c.group == group && c.resource == resource && c.verbs.contains(&verb))
        })
        .map(|(name, _)| *name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[ApiCall] = &[
        call("", "pods", LIST_WATCH),
        in_own_namespace("", "configmaps", &["create"]),
    ];
    const B: &[ApiCall] = &[call("", "pods", &["get"]), call("apps", "pods", &["patch"])];

    #[test]
    fn declaring_matches_group_resource_and_verb() {
        let loops = [("a", A), ("b", B)];
        let cases: &[(&str, &str, &str, &[&str])] = &[
            ("list", "", "pods", &["a"]),
            ("get", "", "pods", &["b"]),
            ("create", "", "configmaps", &["a"]),
            // Another group is another resource.
            ("patch", "", "pods", &[]),
            ("patch", "apps", "pods", &["b"]),
            // A subresource is declared on its own.
            ("get", "", "pods/status", &[]),
            ("delete", "", "pods", &[]),
        ];
        for (verb, group, resource, want) in cases {
            assert_eq!(
                declaring(&loops, verb, group, resource),
                *want,
                "{verb} {group}/{resource}"
            );
        }
    }
}
