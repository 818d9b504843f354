//! Errors: [`Error`] for the library API, [`ApiError`] for answers the API
//! server sends as a `Status` object.

use serde_json::{Value, json};

use crate::resources::ResourceInfo;

/// Errors of the library API (starting servers, loading files).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// I/O failure (binding a port, writing the kubeconfig, reading a file).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A YAML or JSON document could not be parsed.
    #[error("parsing {context}: {message}")]
    Parse {
        /// Where the document came from.
        context: String,
        /// The parser's message.
        message: String,
    },
    /// The API server refused an object (e.g. while loading files).
    #[error("API error: {0}")]
    Api(#[from] ApiError),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// An error answer of the API server: HTTP code plus a `Status` body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`.
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details`, if any.
    pub details: Option<Value>,
}

impl ApiError {
    /// Generic constructor.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn details_for(res: &ResourceInfo, name: &str) -> Value {
        let mut d = json!({ "name": name, "kind": res.plural });
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        d
    }

    /// 404 NotFound for an object.
    pub fn not_found(res: &ResourceInfo, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", res.qualified_plural(), name),
        )
        .with_details(Self::details_for(res, name))
    }

    /// 409 AlreadyExists.
    pub fn already_exists(res: &ResourceInfo, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", res.qualified_plural(), name),
        )
        .with_details(Self::details_for(res, name))
    }

    /// 409 Conflict with the server's message for a stale resourceVersion.
    pub fn conflict(res: &ResourceInfo, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                res.qualified_plural(),
                name,
                why
            ),
        )
        .with_details(Self::details_for(res, name))
    }

    /// 409 Conflict for a stale resourceVersion.
    pub fn stale(res: &ResourceInfo, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 Invalid.
    pub fn invalid(res: &ResourceInfo, name: &str, field: &str, message: &str) -> Self {
        let mut details = Self::details_for(res, name);
        details["causes"] = json!([{
            "reason": "FieldValueInvalid",
            "message": message,
            "field": field,
        }]);
        let kind = if res.group.is_empty() {
            res.kind.to_string()
        } else {
            format!("{}.{}", res.kind, res.group)
        };
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {field}: {message}"),
        )
        .with_details(details)
    }

    /// 410 Expired (too old resourceVersion / continue token).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 404 for a path that serves nothing.
    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    /// An error with only a code, as injected by a fault; the reason is the
    /// one the real server uses for that code.
    pub fn from_code(code: u16, message: impl Into<String>) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "",
        };
        Self::new(code, reason, message)
    }

    /// The `Status` object sent as the body.
    pub fn status_body(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            v["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}
