//! The API server's audit log: an honest count of every request, by user,
//! verb and resource, for tests (no forbidden request, no write ping-pong)
//! and benchmarks (requests per volume).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// What the policy written by [`crate::ControlPlane`] logs: one line per
/// finished request (stage `ResponseComplete`), and for watches also one
/// when the response starts (`ResponseStarted`).
pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
";

/// One request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub stage: String,
    pub verb: String,
    /// `requestURI` in the log (not camelCase's `requestUri`).
    #[serde(default, rename = "requestURI")]
    pub request_uri: String,
    pub user: User,
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    /// RFC 3339 with microseconds.
    #[serde(default)]
    pub request_received_timestamp: String,
    #[serde(default)]
    pub stage_timestamp: String,
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub user_agent: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct User {
    #[serde(default)]
    pub username: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub api_group: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
    /// `Forbidden`, `Invalid`, ... (empty for some errors and successes).
    #[serde(default)]
    pub reason: String,
    /// The error's text (empty on success).
    #[serde(default)]
    pub message: String,
    /// The error's details (causes), when the API server gave any.
    #[serde(default)]
    pub details: Option<serde_json::Value>,
}

impl Request {
    /// `persistentvolumes`, `persistentvolumeclaims/status`, ...
    pub fn resource(&self) -> String {
        match &self.object_ref {
            Some(o) if o.subresource.is_empty() => o.resource.clone(),
            Some(o) => format!("{}/{}", o.resource, o.subresource),
            None => String::new(),
        }
    }

    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }

    /// The text of the error the request was answered with.
    pub fn message(&self) -> &str {
        self.response_status
            .as_ref()
            .map_or("", |s| s.message.as_str())
    }

    /// create, update, patch, delete, deletecollection.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// Answered by an API server that had not finished starting (its RBAC
    /// caches may be empty: a 403 then says nothing about the rules).
    pub fn during_startup(&self) -> bool {
        self.annotations
            .get("apiserver.k8s.io/startup")
            .is_some_and(|v| v.contains("early=true"))
    }

    pub fn namespace(&self) -> &str {
        self.object_ref
            .as_ref()
            .map_or("", |o| o.namespace.as_str())
    }
}

/// Every request in the log at `path`, once: watches when they start
/// (they may run for the whole test), everything else when it finished.
/// Lines that do not parse (a line being written) are skipped.
pub fn read(path: &Path) -> Vec<Request> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| serde_json::from_str::<Request>(line).ok())
        .filter(|r| {
            if r.verb == "watch" {
                r.stage == "ResponseStarted"
            } else {
                r.stage == "ResponseComplete"
            }
        })
        .collect()
}

/// Requests of `user` by "verb resource" (e.g. `create persistentvolumes`).
pub fn count_by_verb_and_resource(requests: &[Request], user: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in requests.iter().filter(|r| r.user.username == user) {
        *counts
            .entry(format!("{} {}", r.verb, r.resource()))
            .or_insert(0) += 1;
    }
    counts
}
