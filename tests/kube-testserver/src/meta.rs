//! Helpers to read and write `metadata` on JSON objects.

use serde_json::{Map, Value, json};

/// `metadata.<field>` as a string.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// `metadata.name`, or `""`.
pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

/// `metadata.namespace`, or `""`.
pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

/// `metadata.uid`, or `""`.
pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid").unwrap_or("")
}

/// `metadata.resourceVersion`, or `""`.
pub fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion").unwrap_or("")
}

/// Whether `metadata.deletionTimestamp` is set.
pub fn is_deleting(obj: &Value) -> bool {
    obj.get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|v| !v.is_null())
}

/// `metadata.generation` (0 when absent).
pub fn generation(obj: &Value) -> i64 {
    obj.get("metadata")
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// `metadata.finalizers` as strings.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata.labels` as a string map.
pub fn labels(obj: &Value) -> Map<String, Value> {
    obj.get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// `metadata.annotations.<key>`.
pub fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.get("metadata")?.get("annotations")?.get(key)?.as_str()
}

/// An owner reference, as stored on a dependent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    /// `apiVersion` of the owner.
    pub api_version: String,
    /// `kind` of the owner.
    pub kind: String,
    /// `name` of the owner.
    pub name: String,
    /// `uid` of the owner.
    pub uid: String,
    /// `blockOwnerDeletion`.
    pub block_owner_deletion: bool,
}

/// `metadata.ownerReferences`, skipping malformed entries.
pub fn owner_refs(obj: &Value) -> Vec<OwnerRef> {
    obj.get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    Some(OwnerRef {
                        api_version: r.get("apiVersion")?.as_str()?.to_string(),
                        kind: r.get("kind")?.as_str()?.to_string(),
                        name: r.get("name")?.as_str()?.to_string(),
                        uid: r.get("uid")?.as_str()?.to_string(),
                        block_owner_deletion: r
                            .get("blockOwnerDeletion")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Mutable `metadata` map, created if missing (or replaced if not an object).
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let Value::Object(map) = obj else {
        unreachable!("just made an object")
    };
    let m = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    match m {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

/// Sets `metadata.<field>` (removes it for `Value::Null`).
pub fn set_meta(obj: &mut Value, field: &str, value: Value) {
    let m = meta_mut(obj);
    if value.is_null() {
        m.remove(field);
    } else {
        m.insert(field.to_string(), value);
    }
}

/// Replaces `metadata.finalizers` (removes the field when empty, as the server
/// omits empty lists).
pub fn set_finalizers(obj: &mut Value, finalizers: &[String]) {
    if finalizers.is_empty() {
        set_meta(obj, "finalizers", Value::Null);
    } else {
        set_meta(obj, "finalizers", json!(finalizers));
    }
}

/// Sets `metadata.annotations.<key>`.
pub fn set_annotation(obj: &mut Value, key: &str, value: &str) {
    let m = meta_mut(obj);
    let a = m
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !a.is_object() {
        *a = Value::Object(Map::new());
    }
    if let Value::Object(a) = a {
        a.insert(key.to_string(), json!(value));
    }
}

/// Current time in the API's RFC 3339 form with second precision.
pub fn now_rfc3339() -> String {
    let ts = jiff::Timestamp::now();
    format!("{}Z", ts.strftime("%Y-%m-%dT%H:%M:%S"))
}

/// Reads a dotted path like `spec.nodeName` from an object.
pub fn get_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(obj, |cur, seg| cur.get(seg))
}

/// Sets a dotted path, creating intermediate objects.
pub fn set_path(obj: &mut Value, path: &str, value: Value) {
    let mut cur = obj;
    let segs: Vec<&str> = path.split('.').collect();
    for (i, seg) in segs.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(map) = cur else { return };
        if i + 1 == segs.len() {
            map.insert((*seg).to_string(), value);
            return;
        }
        cur = map
            .entry((*seg).to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}
