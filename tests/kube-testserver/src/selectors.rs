//! Label and field selectors, parsed as the API server parses them.

use serde_json::Value;

use crate::error::ApiError;
use crate::meta;
use crate::resources::ResourceInfo;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

impl Requirement {
    fn matches(&self, value: Option<&str>) -> bool {
        match &self.op {
            Op::Eq(v) => value == Some(v.as_str()),
            Op::NotEq(v) => value != Some(v.as_str()),
            Op::In(vs) => value.is_some_and(|x| vs.iter().any(|v| v == x)),
            Op::NotIn(vs) => !value.is_some_and(|x| vs.iter().any(|v| v == x)),
            Op::Exists => value.is_some(),
            Op::NotExists => value.is_none(),
            Op::Gt(n) => value
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Op::Lt(n) => value
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        }
    }
}

/// A parsed label selector (`a=b,c!=d,e in (f,g),!h`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_set(rest: &str, raw: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| ApiError::bad_request(format!("unable to parse requirement: {raw}")))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn validate_key(key: &str, raw: &str) -> Result<(), ApiError> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "unable to parse requirement: invalid label key \"{key}\" in \"{raw}\""
        )))
    }
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { reqs });
        }
        for part in split_top_level(s) {
            let part = part.trim();
            if part.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: empty requirement in \"{s}\""
                )));
            }
            reqs.push(Self::parse_requirement(part)?);
        }
        Ok(Self { reqs })
    }

    fn parse_requirement(part: &str) -> Result<Requirement, ApiError> {
        if let Some(key) = part.strip_prefix('!') {
            let key = key.trim();
            validate_key(key, part)?;
            return Ok(Requirement {
                key: key.to_string(),
                op: Op::NotExists,
            });
        }
        // Set-based: "key in (..)" / "key notin (..)".
        let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
        if words.len() == 2 {
            let rest = words[1].trim_start();
            if let Some(set) = rest.strip_prefix("notin") {
                validate_key(words[0], part)?;
                return Ok(Requirement {
                    key: words[0].to_string(),
                    op: Op::NotIn(parse_set(set, part)?),
                });
            }
            if let Some(set) = rest.strip_prefix("in") {
                validate_key(words[0], part)?;
                return Ok(Requirement {
                    key: words[0].to_string(),
                    op: Op::In(parse_set(set, part)?),
                });
            }
        }
        for (tok, kind) in [("!=", 0), ("==", 1), ("=", 1), (">", 2), ("<", 3)] {
            if let Some((k, v)) = part.split_once(tok) {
                let key = k.trim();
                let val = v.trim().to_string();
                validate_key(key, part)?;
                let op = match kind {
                    0 => Op::NotEq(val),
                    1 => Op::Eq(val),
                    _ => {
                        let n = val.parse::<i64>().map_err(|_| {
                            ApiError::bad_request(format!(
                                "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {part}"
                            ))
                        })?;
                        if kind == 2 { Op::Gt(n) } else { Op::Lt(n) }
                    }
                };
                return Ok(Requirement {
                    key: key.to_string(),
                    op,
                });
            }
        }
        validate_key(part, part)?;
        Ok(Requirement {
            key: part.to_string(),
            op: Op::Exists,
        })
    }

    /// Whether the object's labels satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let labels = meta::labels(obj);
        self.reqs
            .iter()
            .all(|r| r.matches(labels.get(&r.key).and_then(Value::as_str)))
    }
}

/// A parsed field selector (`metadata.name=x,spec.nodeName!=y`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    reqs: Vec<Requirement>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` parameter, rejecting fields the kind does not
    /// support with the server's 400 `field label not supported`.
    pub fn parse(s: &str, res: &ResourceInfo) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { reqs });
        }
        for part in s.split(',') {
            let part = part.trim();
            let (key, op) = if let Some((k, v)) = part.split_once("!=") {
                (k, Op::NotEq(v.to_string()))
            } else if let Some((k, v)) = part.split_once("==") {
                (k, Op::Eq(v.to_string()))
            } else if let Some((k, v)) = part.split_once('=') {
                (k, Op::Eq(v.to_string()))
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let key = key.trim();
            let supported = key == "metadata.name"
                || (key == "metadata.namespace" && res.namespaced)
                || res.extra_fields.contains(&key);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key}"
                )));
            }
            reqs.push(Requirement {
                key: key.to_string(),
                op,
            });
        }
        Ok(Self { reqs })
    }

    /// Whether the object satisfies every requirement. Missing fields compare
    /// as the empty string, as the server's field sets do.
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|r| {
            let v = field_value(obj, &r.key);
            r.matches(Some(v.as_str()))
        })
    }
}

fn field_value(obj: &Value, key: &str) -> String {
    match meta::get_path(obj, key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// Label and field selector together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selectors {
    /// The label selector.
    pub labels: LabelSelector,
    /// The field selector.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Whether the object matches both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}})
    }

    #[test]
    fn label_ops() {
        let o = obj(json!({"app": "web", "tier": "1"}));
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (db, web)", true),
            ("app notin (db,web)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("tier>0", true),
            ("tier<1", false),
            ("app=web,tier=2", false),
            ("", true),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).expect(sel);
            assert_eq!(s.matches(&o), want, "{sel}");
        }
    }

    #[test]
    fn bad_label_selectors() {
        for sel in ["app in db", "a b=c", "x,,y", "tier>z"] {
            assert!(LabelSelector::parse(sel).is_err(), "{sel}");
        }
    }
}
