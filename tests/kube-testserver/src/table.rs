//! `meta.k8s.io/v1` Table output (what `kubectl get` asks for), with the
//! default columns the server uses for kinds without printers: Name and Age.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::ResourceInfo;

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|a| {
        let params: Vec<&str> = a.split(';').map(str::trim).collect();
        params.contains(&"as=Table")
            && params.contains(&"g=meta.k8s.io")
            && params.contains(&"v=v1")
    })
}

/// Human duration as kubectl prints ages ("5s", "3m", "2h", "4d").
fn age(created: Option<&str>) -> String {
    let Some(ts) = created.and_then(|c| c.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".to_string();
    };
    let secs = (jiff::Timestamp::now().as_second() - ts.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A Table of objects.
pub fn table(
    _info: &ResourceInfo,
    items: &[Arc<Value>],
    continue_token: Option<&str>,
    rv: &str,
) -> Value {
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let meta = o.get("metadata");
            let name = meta
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let created = meta
                .and_then(|m| m.get("creationTimestamp"))
                .and_then(Value::as_str);
            json!({"cells": [name, age(created)], "object": partial(o)})
        })
        .collect();
    let mut meta = json!({});
    if !rv.is_empty() {
        meta["resourceVersion"] = json!(rv);
    }
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "Time since the object was created.", "priority": 0},
        ],
        "rows": rows,
    })
}
