//! The API server's audit log, as a record of which requests each identity
//! really made (kube-apiserver's `--audit-log-path`, JSON lines of
//! `audit.k8s.io/v1` `Event`s, written in `blocking` mode so a request's record
//! is in the file when its response has been sent).
//!
//! The policy ([`POLICY`]) logs every request at `Metadata` level (who, verb,
//! object reference, response code; no bodies) and omits the
//! `RequestReceived` stage, so a request has one `ResponseComplete` (or
//! `Panic`) event, and a watch also one `ResponseStarted` event when it
//! begins. [`parse`] turns that into one [`AuditRecord`] per request.

use std::collections::HashSet;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

/// The audit policy file's contents: everything at `Metadata` level.
pub const POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: Metadata
";

/// One API request as the API server's audit log saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// Authenticated user name (`admin`, `system:kube-controller-manager`,
    /// `system:serviceaccount:<ns>:<name>`, `system:anonymous`, ...).
    pub user: String,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`); for non-resource URLs the lower-case HTTP
    /// method (`get`, `post`).
    pub verb: String,
    /// API group of the resource, `""` for the core group (and for non-resource URLs).
    pub api_group: String,
    /// Plural resource name (`persistentvolumes`); `""` for non-resource URLs
    /// such as `/api` or `/readyz` (see [`AuditRecord::request_uri`]).
    pub resource: String,
    /// Subresource (`status`, `binding`), if any.
    pub subresource: Option<String>,
    /// Namespace of a namespaced request.
    pub namespace: Option<String>,
    /// Object name, for requests on one object.
    pub name: Option<String>,
    /// HTTP response code (for a watch: 200 when it started). `None` if the
    /// server panicked before answering.
    pub code: Option<u16>,
    /// The request's path and query (`/api/v1/persistentvolumes?watch=true`).
    /// An addition to the shared contract, for non-resource requests.
    pub request_uri: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default, rename = "auditID")]
    audit_id: String,
    #[serde(default)]
    stage: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    user: User,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
}

#[derive(Deserialize, Default)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    api_group: String,
    subresource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    code: Option<u16>,
}

/// Parse audit-log text (JSON lines) into one record per request, in log order.
///
/// A watch is recorded once, at its `ResponseStarted` event (its
/// `ResponseComplete` at the end of the watch is dropped). A last line without
/// its newline (the server is still writing it) is ignored.
///
/// Errors: a complete line that is not an audit event (names the line number).
pub fn parse(text: &str) -> anyhow::Result<Vec<AuditRecord>> {
    let mut started: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    for (i, line) in complete.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let ev: Event = serde_json::from_str(line)
            .with_context(|| format!("audit log line {}: not an audit event", i + 1))?;
        match ev.stage.as_str() {
            "ResponseStarted" => {
                started.insert(ev.audit_id.clone());
            }
            "ResponseComplete" | "Panic" => {
                if started.remove(&ev.audit_id) {
                    continue;
                }
            }
            _ => continue,
        }
        let obj = ev.object_ref.unwrap_or_default();
        out.push(AuditRecord {
            user: ev.user.username,
            verb: ev.verb,
            api_group: obj.api_group,
            resource: obj.resource,
            subresource: obj.subresource,
            namespace: obj.namespace,
            name: obj.name,
            code: ev.response_status.and_then(|s| s.code),
            request_uri: ev.request_uri,
        });
    }
    Ok(out)
}

/// Read and [`parse`] the audit log at `path` (no file yet: no records).
///
/// Errors: the file cannot be read, or a line is not an audit event.
pub fn read(path: &Path) -> anyhow::Result<Vec<AuditRecord>> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading audit log {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/persistentvolumes","verb":"list","user":{"username":"system:serviceaccount:ns:sa","groups":["system:serviceaccounts"]},"objectRef":{"resource":"persistentvolumes","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure","reason":"Forbidden","code":403}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w1","stage":"ResponseStarted","requestURI":"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?watch=true","verb":"watch","user":{"username":"admin"},"objectRef":{"resource":"leases","namespace":"kube-system","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseComplete","requestURI":"/api/v1/persistentvolumes/pv-1/status","verb":"update","user":{"username":"admin"},"objectRef":{"resource":"persistentvolumes","name":"pv-1","apiVersion":"v1","subresource":"status"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w1","stage":"ResponseComplete","requestURI":"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?watch=true","verb":"watch","user":{"username":"admin"},"objectRef":{"resource":"leases","namespace":"kube-system","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"n1","stage":"ResponseComplete","requestURI":"/readyz","verb":"get","user":{"username":"admin"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Met"#;

    #[test]
    fn one_record_per_request_with_watches_at_their_start() {
        let recs = parse(LOG).unwrap();
        assert_eq!(recs.len(), 4, "{recs:#?}");
        assert_eq!(
            recs[0],
            AuditRecord {
                user: "system:serviceaccount:ns:sa".into(),
                verb: "list".into(),
                api_group: "".into(),
                resource: "persistentvolumes".into(),
                subresource: None,
                namespace: None,
                name: None,
                code: Some(403),
                request_uri: "/api/v1/persistentvolumes".into(),
            }
        );
        assert_eq!(recs[1].verb, "watch");
        assert_eq!(recs[1].api_group, "coordination.k8s.io");
        assert_eq!(recs[1].namespace.as_deref(), Some("kube-system"));
        assert_eq!(recs[2].subresource.as_deref(), Some("status"), "{recs:#?}");
        assert_eq!(recs[2].name.as_deref(), Some("pv-1"));
        assert_eq!(recs[3].resource, "");
        assert_eq!(recs[3].request_uri, "/readyz");
    }

    #[test]
    fn a_garbled_complete_line_is_an_error_naming_it() {
        let err = parse("{\"stage\":\"ResponseComplete\"}\nnot json\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }
}
