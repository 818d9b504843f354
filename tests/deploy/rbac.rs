//! The permissions a rendering gives the provisioner's ServiceAccount, and
//! the comparison with `csi_provisioner::startup::api_calls()`.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde_json::Value;

use super::render::all_of;

/// Where a permission holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Every namespace (ClusterRole bound by a ClusterRoleBinding).
    Cluster,
    /// The sidecar's own namespace (a RoleBinding there).
    OwnNamespace,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Cluster => "cluster-wide",
            Scope::OwnNamespace => "in its namespace",
        })
    }
}

/// One granted (scope, group, resource, verb).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    pub scope: Scope,
    pub group: String,
    pub resource: String,
    pub verb: String,
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "({:?}, {}, {}) {}",
            self.group, self.resource, self.verb, self.scope
        )
    }
}

/// The grants of a rendering to `namespace/service_account`, and the
/// problems found on the way (wildcards, dangling or unused roles, ...).
pub fn grants(
    objects: &[Value],
    namespace: &str,
    service_account: &str,
) -> (BTreeSet<Grant>, Vec<String>) {
    let mut problems = Vec::new();
    let mut out = BTreeSet::new();
    let cluster_roles: Vec<ClusterRole> = all_of(objects, "ClusterRole");
    let roles: Vec<Role> = all_of(objects, "Role");
    let is_ours = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == service_account
                && s.namespace.as_deref() == Some(namespace)
        })
    };
    let mut used_cluster_roles = BTreeSet::new();
    let mut used_roles = BTreeSet::new();
    let mut add =
        |rules: &Option<Vec<PolicyRule>>, scope: Scope, from: &str, problems: &mut Vec<String>| {
            for rule in rules.iter().flatten() {
                if rule.non_resource_urls.is_some() {
                    problems.push(format!("{from}: nonResourceURLs are not needed"));
                }
                if rule.resource_names.is_some() {
                    problems.push(format!(
                        "{from}: resourceNames cannot be checked against the declared API calls; \
                     extend the test before using them"
                    ));
                }
                for group in rule.api_groups.iter().flatten() {
                    for resource in rule.resources.iter().flatten() {
                        for verb in &rule.verbs {
                            if [group, resource, verb].iter().any(|s| s.contains('*')) {
                                problems.push(format!(
                                    "{from}: wildcard in ({group:?}, {resource}, {verb}): \
                                 least privilege means naming each"
                                ));
                            }
                            out.insert(Grant {
                                scope,
                                group: group.clone(),
                                resource: resource.clone(),
                                verb: verb.clone(),
                            });
                        }
                    }
                }
            }
        };
    for binding in all_of::<ClusterRoleBinding>(objects, "ClusterRoleBinding") {
        let bname = binding.metadata.name.clone().unwrap_or_default();
        if !is_ours(&binding.subjects) {
            problems.push(format!(
                "ClusterRoleBinding {bname} does not bind ServiceAccount \
                 {namespace}/{service_account} (the Deployment's)"
            ));
            continue;
        }
        if binding.role_ref.kind != "ClusterRole" {
            problems.push(format!(
                "ClusterRoleBinding {bname}: roleRef kind {}",
                binding.role_ref.kind
            ));
            continue;
        }
        match cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(&binding.role_ref.name))
        {
            Some(role) => {
                used_cluster_roles.insert(binding.role_ref.name.clone());
                add(
                    &role.rules,
                    Scope::Cluster,
                    &format!("ClusterRole {}", binding.role_ref.name),
                    &mut problems,
                );
            }
            None => problems.push(format!(
                "ClusterRoleBinding {bname} refers to ClusterRole {}, which is not deployed",
                binding.role_ref.name
            )),
        }
    }
    for binding in all_of::<RoleBinding>(objects, "RoleBinding") {
        let bname = binding.metadata.name.clone().unwrap_or_default();
        if binding.metadata.namespace.as_deref() != Some(namespace) {
            problems.push(format!(
                "RoleBinding {bname} is in namespace {:?}, not the Deployment's {namespace}",
                binding.metadata.namespace
            ));
            continue;
        }
        if !is_ours(&binding.subjects) {
            problems.push(format!(
                "RoleBinding {bname} does not bind ServiceAccount {namespace}/{service_account}"
            ));
            continue;
        }
        let rules = match binding.role_ref.kind.as_str() {
            "Role" => roles
                .iter()
                .find(|r| {
                    r.metadata.name.as_deref() == Some(&binding.role_ref.name)
                        && r.metadata.namespace.as_deref() == Some(namespace)
                })
                .map(|r| {
                    used_roles.insert(binding.role_ref.name.clone());
                    r.rules.clone()
                }),
            "ClusterRole" => cluster_roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(&binding.role_ref.name))
                .map(|r| {
                    used_cluster_roles.insert(binding.role_ref.name.clone());
                    r.rules.clone()
                }),
            other => {
                problems.push(format!("RoleBinding {bname}: roleRef kind {other}"));
                continue;
            }
        };
        match rules {
            Some(rules) => add(
                &rules,
                Scope::OwnNamespace,
                &format!("{} {}", binding.role_ref.kind, binding.role_ref.name),
                &mut problems,
            ),
            None => problems.push(format!(
                "RoleBinding {bname} refers to {} {}, which is not deployed in {namespace}",
                binding.role_ref.kind, binding.role_ref.name
            )),
        }
    }
    for role in &cluster_roles {
        let n = role.metadata.name.clone().unwrap_or_default();
        if !used_cluster_roles.contains(&n) {
            problems.push(format!("ClusterRole {n} is bound to nobody"));
        }
    }
    for role in &roles {
        let n = role.metadata.name.clone().unwrap_or_default();
        if !used_roles.contains(&n) {
            problems.push(format!("Role {n} is bound to nobody"));
        }
    }
    (out, problems)
}

/// Which component's rules a loop of `startup::api_calls()` is checked against:
/// None for the base (ungated loops), else the component directory. Names
/// are compared without case or punctuation, so `pvc-protection`,
/// `pvc_protection` and `PVCProtection` are the same.
pub fn component_of(loop_name: &str) -> Option<&'static str> {
    let n: String = loop_name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if n.contains("pvcprotection") || n == "protection" {
        Some("pvc-protection")
    } else if n.contains("statefulset") || n.contains("retention") {
        Some("statefulset-auto-delete-pvc")
    } else if n.contains("releaser") {
        Some("pv-releaser")
    } else if n.contains("capacity") {
        Some("capacity")
    } else if n.contains("podpvc") {
        Some("pod-pvc-provisioner")
    } else if n.contains("crossnamespace") {
        Some("cross-namespace-data-source")
    } else if n.contains("namespacemetadata") {
        Some("namespace-metadata")
    } else {
        None
    }
}

/// The loops' names the mapping knows for the base; another name maps to
/// the base too, with a note (so a new gated loop is not silently checked
/// against the wrong rules).
pub const KNOWN_BASE_LOOPS: &[&str] = &[
    "provisioner",
    "provisioning",
    "deleter",
    "leader-election",
    "leaderelection",
    "snapshot-sweep",
    "orphan-audit",
    "events",
    "metrics",
    "cloning-protection",
    "snapshot-protection",
];

/// Granted in the manifests before the loop that needs it declares its
/// calls (its `API_CALLS`, gathered by `api_calls` in src/startup.rs). Such a grant is
/// reported, not failed, while no loop claims it; once a loop lists calls on
/// the same resource the grant is checked like any other. None today.
pub const PENDING: &[(Scope, &str, &str, &str)] = &[];

/// A needed (scope, group, resource, verb), with the loop that needs it.
#[derive(Debug, Clone)]
pub struct Need {
    pub loop_name: &'static str,
    pub namespaced_only: bool,
    pub group: &'static str,
    pub resource: &'static str,
    pub verb: &'static str,
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loop {:?}: ({:?}, {}, {}) {}",
            self.loop_name,
            self.group,
            self.resource,
            self.verb,
            if self.namespaced_only {
                "in its namespace"
            } else {
                "cluster-wide"
            }
        )
    }
}

/// Every call of the loops active with `components`, flattened per verb.
pub fn needs(components: &[&str]) -> Vec<Need> {
    let mut out = Vec::new();
    for (loop_name, calls) in csi_provisioner::startup::api_calls() {
        let active = match component_of(loop_name) {
            None => true,
            Some(c) => components.contains(&c),
        };
        if !active {
            continue;
        }
        for call in calls {
            for verb in call.verbs {
                out.push(Need {
                    loop_name,
                    namespaced_only: call.namespaced_only,
                    group: call.group,
                    resource: call.resource,
                    verb,
                });
            }
        }
    }
    out
}

/// Is `need` granted? A call made only in the sidecar's namespace is
/// granted by a Role there or by a cluster-wide grant.
pub fn granted(grants: &BTreeSet<Grant>, need: &Need) -> bool {
    grants.iter().any(|g| {
        g.group == need.group
            && g.resource == need.resource
            && g.verb == need.verb
            && (g.scope == Scope::Cluster || need.namespaced_only)
    })
}

/// Does some need justify `grant`? A cluster-wide grant for a call made only
/// in the sidecar's namespace is broader than needed, and a namespaced grant
/// for a cluster-wide call is useless: neither justifies it.
pub fn needed(needs: &[Need], grant: &Grant) -> bool {
    needs.iter().any(|n| {
        n.group == grant.group
            && n.resource == grant.resource
            && n.verb == grant.verb
            && (n.namespaced_only == (grant.scope == Scope::OwnNamespace))
    })
}

/// Is `grant` waiting for a loop to list it (see [`PENDING`])?
pub fn pending(all_needs: &[Need], grant: &Grant) -> Option<&'static str> {
    let claimed = all_needs
        .iter()
        .any(|n| n.group == grant.group && n.resource == grant.resource);
    if claimed {
        return None;
    }
    PENDING
        .iter()
        .find(|(scope, group, resource, _)| {
            *scope == grant.scope && *group == grant.group && *resource == grant.resource
        })
        .map(|p| p.3)
}

/// Components none of whose loops are in `startup::api_calls()` yet.
pub fn components_without_loops() -> BTreeSet<&'static str> {
    let listed: BTreeSet<_> = csi_provisioner::startup::api_calls()
        .into_iter()
        .filter_map(|(l, _)| component_of(l))
        .collect();
    super::render::COMPONENTS
        .iter()
        .map(|c| c.dir)
        .filter(|c| !listed.contains(c))
        .collect()
}
