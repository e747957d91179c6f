//! Label and field selectors (`labelSelector`, `fieldSelector` query parameters).

use super::errors::ApiError;
use super::resources;
use serde_json::Value;

#[derive(Debug, Clone)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (`a=b,c!=d,e,!f,g in (x,y),h notin (z)`).
#[derive(Debug, Clone, Default)]
pub struct LabelSelector(Vec<LabelReq>);

fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

fn set(s: &str) -> Result<Vec<String>, ApiError> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{s}', expected: '('"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parse; `400 BadRequest` on syntax errors.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            if let Some((k, v)) = p.split_once("!=") {
                reqs.push(LabelReq::Ne(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = p.split_once("==") {
                reqs.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = p.split_once('=') {
                reqs.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
            } else if let Some(k) = p.strip_prefix('!') {
                reqs.push(LabelReq::NotExists(k.trim().into()));
            } else if let Some(i) = p.find(" notin ") {
                reqs.push(LabelReq::NotIn(p[..i].trim().into(), set(&p[i + 7..])?));
            } else if let Some(i) = p.find(" in ") {
                reqs.push(LabelReq::In(p[..i].trim().into(), set(&p[i + 4..])?));
            } else if p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                reqs.push(LabelReq::Exists(p.into()));
            } else {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: {p}"
                )));
            }
        }
        Ok(Self(reqs))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Match an object's `metadata.labels`.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(|v| v.as_str());
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector (`metadata.name=x,metadata.namespace!=y`). Supported fields:
/// `metadata.name`, `metadata.namespace` for every kind, plus the kind-specific ones the
/// real server indexes (core Event `involvedObject.*`, `reason`, `type`, `source`,
/// `reportingComponent`; events.k8s.io Event `regarding.*`, `reason`, `type`,
/// `reportingController`; Namespace `status.phase`; Node `spec.unschedulable`;
/// PersistentVolumeClaim `spec.volumeName` is not supported by the real server and is rejected).
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(Vec<String>, bool, String)>);

fn allowed(res: usize, field: &str) -> bool {
    if field == "metadata.name" || field == "metadata.namespace" {
        return true;
    }
    match res {
        resources::CORE_EVENT => {
            field.starts_with("involvedObject.")
                || ["reason", "type", "source", "reportingComponent"].contains(&field)
        }
        resources::EVENTS_EVENT => {
            field.starts_with("regarding.")
                || ["reason", "type", "reportingController"].contains(&field)
        }
        resources::NAMESPACE => field == "status.phase",
        resources::NODE => field == "spec.unschedulable",
        _ => false,
    }
}

/// kube-apiserver's message for an unsupported field selector `field`:
/// kinds with their own field-label conversion (core Events, Namespaces,
/// Nodes) say `field label not supported: <field>`; the others go through
/// `runtime.DefaultMetaV1FieldSelectorConversion` (as PersistentVolumes do
/// on v1.19), which names the two metadata fields.
fn unsupported_field_message(res: usize, field: &str) -> String {
    match res {
        resources::CORE_EVENT | resources::EVENTS_EVENT | resources::NAMESPACE | resources::NODE => {
            format!("field label not supported: {field}")
        }
        _ => format!(
            "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        ),
    }
}

impl FieldSelector {
    /// Parse for resource `res`; `400 BadRequest` for unsupported fields, with the real
    /// server's message (see `unsupported_field_message`).
    pub fn parse(res: usize, s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, neg, v) = if let Some((k, v)) = p.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{p}'"
                )));
            };
            let k = k.trim();
            if !allowed(res, k) {
                return Err(ApiError::bad_request(unsupported_field_message(res, k)));
            }
            let path = if k == "source" {
                vec!["source".to_string(), "component".to_string()]
            } else {
                k.split('.').map(String::from).collect()
            };
            reqs.push((path, neg, v.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Match an object.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, neg, v)| {
            let mut cur = Some(obj);
            for s in path {
                cur = cur.and_then(|c| c.get(s));
            }
            let actual = match cur {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (actual == *v) != *neg
        })
    }
}

/// Both selectors together.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Match an object.
    pub fn matches(&self, obj: &Value) -> bool {
        (self.labels.is_empty() || self.labels.matches(obj))
            && (self.fields.is_empty() || self.fields.matches(obj))
    }
}
