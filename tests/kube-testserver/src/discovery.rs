//! Discovery documents: /version, /api, /api/v1, /apis, /apis/<group>/<version>.

use serde_json::{Value, json};

use crate::resources::{Registry, ResourceInfo};

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "gitVersion": "v1.34.0-kube-testserver",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

/// `/apis`.
pub fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .into_iter()
        .map(|(g, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            let preferred = vs.first().cloned().unwrap_or(Value::Null);
            json!({"name": g, "versions": vs, "preferredVersion": preferred})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`.
pub fn group(reg: &Registry, group: &str) -> Option<Value> {
    let (_, versions) = reg.groups().into_iter().find(|(g, _)| *g == group)?;
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": vs, "preferredVersion": preferred}),
    )
}

fn resource_entries(r: &ResourceInfo) -> Vec<Value> {
    let mut main = json!({
        "name": r.plural,
        "singularName": r.singular(),
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": VERBS,
    });
    if !r.short_names.is_empty() {
        main["shortNames"] = json!(r.short_names);
    }
    let mut out = vec![main];
    if r.status_subresource {
        out.push(json!({
            "name": format!("{}/status", r.plural),
            "singularName": "",
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    out
}

/// `/api/v1` or `/apis/<group>/<version>`.
pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    if !reg.has_group_version(group, version) {
        return None;
    }
    let resources: Vec<Value> = reg
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(resource_entries)
        .collect();
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}
