//! A minimal OpenAPI v3 document set: for each served resource, a PATCH
//! operation tagged with its group/version/kind that lists the
//! `fieldValidation` query parameter. kubectl reads exactly that to decide
//! that the server validates fields itself (otherwise `kubectl create`
//! insists on downloading schemas for client-side validation). No schemas
//! are served.

use serde_json::{Map, Value, json};

use crate::resources::Registry;

const HASH: &str = "kube-testserver-1";

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of group-version documents.
pub fn index(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for r in reg.all() {
        let p = gv_path(r.group, r.version);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={HASH}")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`.
pub fn group_version(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    if !reg.has_group_version(group, version) {
        return None;
    }
    let prefix = gv_path(group, version);
    let mut paths = Map::new();
    for r in reg
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let path = if r.namespaced {
            format!("/{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("/{prefix}/{}/{{name}}", r.plural)
        };
        paths.insert(
            path,
            json!({"patch": {
                "operationId": format!("patch{}", r.kind),
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
                "parameters": [
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}
                ],
                "responses": {"200": {"description": "OK"}}
            }}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0-kube-testserver"},
        "paths": paths,
    }))
}
