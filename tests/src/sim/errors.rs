//! API errors rendered as `meta/v1 Status` bodies exactly like kube-apiserver's
//! `k8s.io/apimachinery/pkg/api/errors` constructors.

use super::resources::ResourceInfo;
use serde_json::{json, Map, Value};

/// Kind of a field validation error (`field.ErrorType` in apimachinery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorType {
    /// `FieldValueRequired` / "Required value".
    Required,
    /// `FieldValueInvalid` / "Invalid value".
    Invalid,
    /// `FieldValueForbidden` / "Forbidden".
    Forbidden,
    /// `FieldValueNotSupported` / "Unsupported value".
    NotSupported,
}

/// One field validation error (`field.Error`).
#[derive(Debug, Clone)]
pub struct FieldError {
    /// Error type.
    pub kind: FieldErrorType,
    /// Field path, e.g. `spec.capacity`.
    pub field: String,
    /// Offending value, already rendered (strings are quoted by [`FieldError::invalid`]).
    pub value: Option<String>,
    /// Detail text (may be empty).
    pub detail: String,
}

impl FieldError {
    /// "Required value".
    pub fn required(field: &str, detail: &str) -> Self {
        Self {
            kind: FieldErrorType::Required,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }
    /// "Invalid value: \"v\"".
    pub fn invalid(field: &str, value: &str, detail: &str) -> Self {
        Self {
            kind: FieldErrorType::Invalid,
            field: field.into(),
            value: Some(format!("{value:?}")),
            detail: detail.into(),
        }
    }
    /// "Forbidden".
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self {
            kind: FieldErrorType::Forbidden,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }
    /// "Unsupported value: \"v\": supported values: ...".
    pub fn not_supported(field: &str, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self {
            kind: FieldErrorType::NotSupported,
            field: field.into(),
            value: Some(format!("{value:?}")),
            detail: format!("supported values: {}", list.join(", ")),
        }
    }
    /// "Unsupported value: v: supported values: ..." with `value` already
    /// rendered as Go prints a non-string value (e.g. `core.ResourceList(nil)`).
    pub fn not_supported_rendered(field: &str, value: &str, supported: &[&str]) -> Self {
        Self {
            value: Some(value.to_string()),
            ..Self::not_supported(field, "", supported)
        }
    }
    fn reason(&self) -> &'static str {
        match self.kind {
            FieldErrorType::Required => "FieldValueRequired",
            FieldErrorType::Invalid => "FieldValueInvalid",
            FieldErrorType::Forbidden => "FieldValueForbidden",
            FieldErrorType::NotSupported => "FieldValueNotSupported",
        }
    }
    /// `ErrorBody()`: the message without the field prefix.
    pub fn body(&self) -> String {
        let mut s = match self.kind {
            FieldErrorType::Required => "Required value".to_string(),
            FieldErrorType::Forbidden => "Forbidden".to_string(),
            FieldErrorType::Invalid => {
                format!("Invalid value: {}", self.value.clone().unwrap_or_default())
            }
            FieldErrorType::NotSupported => {
                format!(
                    "Unsupported value: {}",
                    self.value.clone().unwrap_or_default()
                )
            }
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// An error answered as a `Status` (`kind: Status, apiVersion: v1, status: Failure`).
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status code (also the Status `code`).
    pub code: u16,
    /// Status `reason` (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ...).
    pub reason: String,
    /// Status `message`.
    pub message: String,
    /// Status `details`, if any.
    pub details: Option<Value>,
    /// `Retry-After` header value in seconds (429 and some 5xx).
    pub retry_after: Option<u64>,
}

fn details(r: &ResourceInfo, name: &str, kind: &str) -> Value {
    let mut m = Map::new();
    if !name.is_empty() {
        m.insert("name".into(), json!(name));
    }
    if !r.group.is_empty() {
        m.insert("group".into(), json!(r.group));
    }
    m.insert("kind".into(), json!(kind));
    Value::Object(m)
}

impl ApiError {
    fn new(code: u16, reason: &str, message: String, details: Option<Value>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message,
            details,
            retry_after: None,
        }
    }

    /// The `Status` body.
    pub fn status(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), json!("Status"));
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), json!("Failure"));
        m.insert("message".into(), json!(self.message));
        if !self.reason.is_empty() {
            m.insert("reason".into(), json!(self.reason));
        }
        if let Some(d) = &self.details {
            m.insert("details".into(), d.clone());
        }
        m.insert("code".into(), json!(self.code));
        Value::Object(m)
    }

    /// 404 `NotFound`: `persistentvolumes "x" not found`.
    pub fn not_found(r: &ResourceInfo, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", r.qualified_resource(), name),
            Some(details(r, name, r.plural)),
        )
    }

    /// 404 for a missing namespace when creating a namespaced object
    /// (NamespaceLifecycle admission): `namespaces "x" not found`.
    pub fn namespace_not_found(ns: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("namespaces \"{ns}\" not found"),
            Some(json!({"name": ns, "kind": "namespaces"})),
        )
    }

    /// 409 `AlreadyExists`: `persistentvolumes "x" already exists`.
    pub fn already_exists(r: &ResourceInfo, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", r.qualified_resource(), name),
            Some(details(r, name, r.plural)),
        )
    }

    /// 409 `Conflict` for a stale resourceVersion.
    pub fn conflict(r: &ResourceInfo, name: &str) -> Self {
        Self::conflict_msg(
            r,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 `Conflict`: `Operation cannot be fulfilled on <resource> "<name>": <msg>`.
    pub fn conflict_msg(r: &ResourceInfo, name: &str, msg: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                r.qualified_resource(),
                name,
                msg
            ),
            Some(details(r, name, r.plural)),
        )
    }

    /// 409 `Conflict` for a delete precondition (uid or resourceVersion) that
    /// does not match: kube-apiserver's `rest.BeforeDelete` names the kind, not
    /// the resource (`Operation cannot be fulfilled on Lease.coordination.k8s.io "x": <msg>`).
    pub fn precondition_conflict(r: &ResourceInfo, name: &str, msg: &str) -> Self {
        let kind = if r.group.is_empty() {
            r.kind.to_string()
        } else {
            format!("{}.{}", r.kind, r.group)
        };
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {kind} \"{name}\": {msg}"),
            Some(details(r, name, r.kind)),
        )
    }

    /// 422 `Invalid` with field causes: `Kind "name" is invalid: <errs>`.
    pub fn invalid(r: &ResourceInfo, name: &str, errs: &[FieldError]) -> Self {
        let msg = if errs.len() == 1 {
            errs[0].to_string()
        } else {
            format!(
                "[{}]",
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let mut d = details(r, name, r.kind);
        d["causes"] = Value::Array(
            errs.iter()
                .map(|e| json!({"reason": e.reason(), "message": e.body(), "field": e.field}))
                .collect(),
        );
        Self::new(
            422,
            "Invalid",
            format!("{} \"{}\" is invalid: {}", r.qualified_kind(), name, msg),
            Some(d),
        )
    }

    /// 400 `BadRequest`.
    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", msg.into(), None)
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(msg: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", msg.into(), None)
    }

    /// 404 for an unknown URL (`the server could not find the requested resource`).
    pub fn unknown_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
            None,
        )
    }

    /// 415 `UnsupportedMediaType`.
    pub fn unsupported_media_type(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ct:?})"),
            None,
        )
    }

    /// 500 `InternalError`: `Internal error occurred: <msg>`.
    pub fn internal(msg: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {msg}"),
            Some(json!({"causes": [{"message": msg}]})),
        )
    }

    /// 429 `TooManyRequests` with `Retry-After`.
    pub fn too_many_requests(retry_after: u64) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.".into(),
            Some(json!({"retryAfterSeconds": retry_after})),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 503 `ServiceUnavailable`.
    pub fn service_unavailable(msg: &str) -> Self {
        Self::new(503, "ServiceUnavailable", msg.into(), None)
    }

    /// 410 `Expired` for a list at an exact resourceVersion that is no longer
    /// in the history (kube-apiserver v1.19 on etcd's `ErrCompacted`).
    pub fn expired_list() -> Self {
        Self::new(
            410,
            "Expired",
            "The resourceVersion for the provided list is too old.".into(),
            None,
        )
    }

    /// 410 `Expired` for a `continue` token whose snapshot is no longer in the
    /// history (kube-apiserver v1.19 on etcd's `ErrCompacted` while paging).
    pub fn expired_continue() -> Self {
        Self::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retry with the inconsistent list.".into(),
            None,
        )
    }

    /// 410 `Expired` (`too old resource version: <requested> (<oldest available>)`).
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
            None,
        )
    }

    /// 504 `Timeout` for a resourceVersion newer than the server has.
    pub fn too_large_rv(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
            Some(
                json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
            ),
        );
        e.retry_after = Some(1);
        e
    }

    /// Any code with a generic reason derived from it (used by fault injection).
    pub fn from_code(code: u16, retry_after: Option<u64>) -> Self {
        match code {
            429 => Self::too_many_requests(retry_after.unwrap_or(1)),
            503 => {
                let mut e = Self::service_unavailable("the server is currently unable to handle the request (injected fault)");
                e.retry_after = retry_after;
                e
            }
            500 => Self::internal("injected fault"),
            504 => Self::new(504, "Timeout", "the server was unable to return a response in the time allotted, but may still be processing the request (injected fault)".into(), None),
            c => Self::new(c, "", format!("injected fault (HTTP {c})"), None),
        }
    }
}
