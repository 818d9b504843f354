//! Patch types: JSON merge patch (RFC 7386), JSON patch (RFC 6902),
//! strategic merge patch and the simple server-side apply merge.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// The patch types the server accepts, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply)
    Apply,
}

impl PatchType {
    /// Patch type for a `Content-Type` header value (parameters ignored).
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// How a list field is merged by strategic merge patch.
enum ListStrategy {
    /// Lists of primitives merged as a set (`metadata.finalizers`).
    PrimitiveSet,
    /// Lists of objects merged by a key field.
    MergeKey(&'static str),
    /// Replaced wholesale (the default for lists without a patch strategy).
    Replace,
}

/// Patch strategy of a list, by field name. The served kinds use each of these
/// names with one meaning, so the field name alone decides.
fn list_strategy(field: &str) -> ListStrategy {
    match field {
        "finalizers" => ListStrategy::PrimitiveSet,
        "ownerReferences" => ListStrategy::MergeKey("uid"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "drivers"
        | "resourceClaims" => ListStrategy::MergeKey("name"),
        "ports" => ListStrategy::MergeKey("containerPort"),
        "conditions" | "addresses" => ListStrategy::MergeKey("type"),
        "volumeMounts" => ListStrategy::MergeKey("mountPath"),
        "volumeDevices" => ListStrategy::MergeKey("devicePath"),
        "hostAliases" => ListStrategy::MergeKey("ip"),
        _ => ListStrategy::Replace,
    }
}

/// Applies an RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Applies an RFC 6902 JSON patch; failures are 422 as on the real server.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    json_patch::patch(target, &p).map_err(|e| ApiError::new(422, "", e.to_string()))
}

/// Applies a strategic merge patch.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Value::Object(p) = patch else {
        return Err(ApiError::bad_request(
            "strategic merge patch must be a JSON object",
        ));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        merge_map(t, p, true)?;
    }
    Ok(())
}

/// Server-side apply, simplified: the applied configuration is merged into the
/// live object with strategic-merge semantics (without directives). Fields
/// the manager applied before but leaves out now are not removed.
pub fn apply_merge(target: &mut Value, applied: &Value) -> Result<(), ApiError> {
    let Value::Object(p) = applied else {
        return Err(ApiError::bad_request("apply patch must be an object"));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        merge_map(t, p, false)?;
    }
    Ok(())
}

/// Removes strategic-merge directives from a value that is inserted as is.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|e| !is_directive_element(e))
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn is_directive_element(e: &Value) -> bool {
    e.as_object()
        .is_some_and(|m| m.len() == 1 && m.contains_key("$patch"))
}

fn merge_map(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    directives: bool,
) -> Result<(), ApiError> {
    if directives {
        match patch.get("$patch").and_then(Value::as_str) {
            Some("replace") => {
                *target = match strip_directives(&Value::Object(patch.clone())) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                return Ok(());
            }
            Some("delete") => {
                target.clear();
                return Ok(());
            }
            Some("merge") | None => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "unknown patch type: {other} in map"
                )));
            }
        }
    }
    for (key, pv) in patch {
        if directives && key.starts_with('$') {
            if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
                let Value::Array(remove) = pv else {
                    return Err(ApiError::bad_request(
                        "invalid $deleteFromPrimitiveList: must be a list",
                    ));
                };
                if let Some(Value::Array(list)) = target.get_mut(field) {
                    list.retain(|e| !remove.contains(e));
                }
            }
            // $setElementOrder/*, $retainKeys and $patch are handled elsewhere or
            // only order/prune fields the merge already produced.
            continue;
        }
        if pv.is_null() {
            target.remove(key);
            continue;
        }
        if directives
            && pv.is_object()
            && pv.get("$patch").and_then(Value::as_str) == Some("delete")
        {
            target.remove(key);
            continue;
        }
        match (target.get_mut(key), pv) {
            (Some(Value::Object(tm)), Value::Object(pm)) => merge_map(tm, pm, directives)?,
            (Some(Value::Array(tl)), Value::Array(pl)) => {
                let order = patch
                    .get(&format!("$setElementOrder/{key}"))
                    .and_then(Value::as_array)
                    .filter(|_| directives);
                merge_list(key, tl, pl, order, directives)?
            }
            (_, Value::Object(pm)) => {
                let mut m = Map::new();
                merge_map(&mut m, pm, directives)?;
                target.insert(key.clone(), Value::Object(m));
            }
            (_, Value::Array(pl)) => {
                let mut l = Vec::new();
                merge_list(key, &mut l, pl, None, directives)?;
                target.insert(key.clone(), Value::Array(l));
            }
            _ => {
                target.insert(key.clone(), pv.clone());
            }
        }
    }
    if directives && let Some(Value::Array(retain)) = patch.get("$retainKeys") {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn merge_list(
    field: &str,
    target: &mut Vec<Value>,
    patch: &[Value],
    order: Option<&Vec<Value>>,
    directives: bool,
) -> Result<(), ApiError> {
    let original = target.clone();
    if directives
        && patch.iter().any(|e| {
            is_directive_element(e) && e.get("$patch").and_then(Value::as_str) == Some("replace")
        })
    {
        *target = patch
            .iter()
            .filter(|e| !is_directive_element(e))
            .map(strip_directives)
            .collect();
        return Ok(());
    }
    match list_strategy(field) {
        ListStrategy::Replace => {
            *target = patch.iter().map(strip_directives).collect();
        }
        ListStrategy::PrimitiveSet => {
            for e in patch {
                if !target.contains(e) {
                    target.push(e.clone());
                }
            }
            if directives {
                let merged = std::mem::take(target);
                *target = normalize_order(merged, order.map_or(patch, |o| o), &original, None);
            }
        }
        ListStrategy::MergeKey(mk) => {
            for e in patch {
                let Value::Object(pe) = e else {
                    return Err(ApiError::bad_request(format!(
                        "list {field} must contain objects with merge key {mk}"
                    )));
                };
                if is_directive_element(e) {
                    continue;
                }
                let Some(key) = pe.get(mk) else {
                    return Err(ApiError::bad_request(format!(
                        "map: {e} does not contain declared merge key: {mk}"
                    )));
                };
                let pos = target.iter().position(|t| t.get(mk) == Some(key));
                let delete =
                    directives && pe.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        target.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => {
                        if let Some(Value::Object(tm)) = target.get_mut(i) {
                            merge_map(tm, pe, directives)?;
                        }
                    }
                    (None, false) => target.push(strip_directives(e)),
                }
            }
            if directives {
                let merged = std::mem::take(target);
                *target = normalize_order(merged, order.map_or(patch, |o| o), &original, Some(mk));
            }
        }
    }
    Ok(())
}

/// Element order after a merge, as the API server's strategic merge
/// produces it: elements named in the patch (or its `$setElementOrder`)
/// keep the patch's order, the others keep their original order, and the
/// two sequences are interleaved by their positions in the original list.
fn normalize_order(
    merged: Vec<Value>,
    patch_order: &[Value],
    original: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let id = |v: &Value| -> Value {
        match key {
            Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
            None => v.clone(),
        }
    };
    let patch_ids: Vec<Value> = patch_order
        .iter()
        .filter(|e| !is_directive_element(e))
        .map(id)
        .collect();
    let orig_ids: Vec<Value> = original.iter().map(id).collect();
    let (mut from_patch, server_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|e| patch_ids.contains(&id(e)));
    from_patch.sort_by_key(|e| patch_ids.iter().position(|p| *p == id(e)));
    let orig_pos = |e: &Value| orig_ids.iter().position(|o| *o == id(e));
    let mut out = Vec::with_capacity(from_patch.len() + server_only.len());
    let (mut l, mut r) = (
        server_only.into_iter().peekable(),
        from_patch.into_iter().peekable(),
    );
    loop {
        let take_left = match (l.peek(), r.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => matches!((orig_pos(a), orig_pos(b)), (Some(x), Some(y)) if x < y),
        };
        let next = if take_left { l.next() } else { r.next() };
        out.extend(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn smp_finalizers_are_a_set_and_delete_from_primitive_list() {
        let mut o = json!({"metadata": {"finalizers": ["a", "b"]}});
        strategic_merge(&mut o, &json!({"metadata": {"finalizers": ["b", "c"]}})).unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["a", "b", "c"]));
        strategic_merge(
            &mut o,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a", "c"]}}),
        )
        .unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn smp_merge_key_and_delete_directive() {
        let mut o = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        strategic_merge(
            &mut o,
            &json!({"spec": {"containers": [{"name": "a", "image": "z"}, {"name": "b", "$patch": "delete"}, {"name": "c"}]}}),
        )
        .unwrap();
        assert_eq!(
            o["spec"]["containers"],
            json!([{"name": "a", "image": "z"}, {"name": "c"}])
        );
    }

    #[test]
    fn smp_replace_directive_and_plain_lists() {
        let mut o = json!({"spec": {"accessModes": ["A", "B"], "containers": [{"name": "a"}]}});
        strategic_merge(
            &mut o,
            &json!({"spec": {"accessModes": ["C"], "containers": [{"name": "z"}, {"$patch": "replace"}]}}),
        )
        .unwrap();
        assert_eq!(o["spec"]["accessModes"], json!(["C"]));
        assert_eq!(o["spec"]["containers"], json!([{"name": "z"}]));
    }

    #[test]
    fn smp_requires_merge_key() {
        let mut o = json!({"metadata": {"ownerReferences": [{"uid": "1"}]}});
        let err = strategic_merge(
            &mut o,
            &json!({"metadata": {"ownerReferences": [{"name": "x"}]}}),
        )
        .unwrap_err();
        assert_eq!(err.code, 400);
    }
}
