//! Field validation and defaulting, following kube-apiserver's
//! `pkg/apis/<group>/validation` and `v1/defaults.go` for the served kinds (the subset of
//! rules that matters for a storage provisioner).

use super::errors::FieldError;
use super::resources::{self, NAMESPACE};
use serde_json::{json, Value};

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// RFC 1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters).
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// RFC 1123 subdomain (dot-separated labels, at most 253 characters).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Validate `metadata.name` for a resource (`Namespace` names are labels, others subdomains).
pub fn validate_name(res: usize, name: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if res == NAMESPACE {
        if !is_dns1123_label(name) {
            let mut d = DNS1123_LABEL_MSG.to_string();
            if name.len() > 63 {
                d = "must be no more than 63 characters".into();
            }
            errs.push(FieldError::invalid("metadata.name", name, &d));
        }
    } else if !is_dns1123_subdomain(name) {
        let d = if name.len() > 253 {
            "must be no more than 253 characters"
        } else {
            DNS1123_SUBDOMAIN_MSG
        };
        errs.push(FieldError::invalid("metadata.name", name, d));
    }
    errs
}

fn ensure_obj<'a>(v: &'a mut Value, k: &str) -> &'a mut serde_json::Map<String, Value> {
    let m = v.as_object_mut().expect("object");
    let e = m.entry(k.to_string()).or_insert_with(|| json!({}));
    if !e.is_object() {
        *e = json!({});
    }
    e.as_object_mut().unwrap()
}

fn default_str(m: &mut serde_json::Map<String, Value>, k: &str, v: &str) {
    if m.get(k).is_none_or(|x| x.is_null()) {
        m.insert(k.into(), json!(v));
    }
}

/// Apply API defaults (`SetDefaults_*`), which the real server applies on every decode.
pub fn apply_defaults(res: usize, obj: &mut Value) {
    match res {
        resources::PV => {
            let spec = ensure_obj(obj, "spec");
            default_str(spec, "persistentVolumeReclaimPolicy", "Retain");
            default_str(spec, "volumeMode", "Filesystem");
            let st = ensure_obj(obj, "status");
            default_str(st, "phase", "Pending");
        }
        resources::PVC => {
            let spec = ensure_obj(obj, "spec");
            default_str(spec, "volumeMode", "Filesystem");
            let st = ensure_obj(obj, "status");
            default_str(st, "phase", "Pending");
        }
        resources::STORAGE_CLASS => {
            let m = obj.as_object_mut().unwrap();
            default_str(m, "reclaimPolicy", "Delete");
            default_str(m, "volumeBindingMode", "Immediate");
        }
        resources::NAMESPACE => {
            let spec = ensure_obj(obj, "spec");
            if spec.get("finalizers").is_none() {
                spec.insert("finalizers".into(), json!(["kubernetes"]));
            }
            let st = ensure_obj(obj, "status");
            default_str(st, "phase", "Active");
        }
        _ => {}
    }
}

const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];

/// The persistent volume source fields of `PersistentVolumeSpec` (exactly one must be set).
const PV_SOURCES: &[&str] = &[
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "hostPath",
    "glusterfs",
    "nfs",
    "rbd",
    "iscsi",
    "cinder",
    "cephfs",
    "fc",
    "flocker",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "local",
    "storageos",
    "csi",
];

fn access_modes(spec: &Value, errs: &mut Vec<FieldError>, required_detail: &str) {
    match spec.get("accessModes").and_then(|v| v.as_array()) {
        Some(a) if !a.is_empty() => {
            for m in a {
                let s = m.as_str().unwrap_or("");
                if !ACCESS_MODES.contains(&s) {
                    errs.push(FieldError::not_supported(
                        "spec.accessModes",
                        s,
                        ACCESS_MODES,
                    ));
                }
            }
        }
        _ => errs.push(FieldError::required("spec.accessModes", required_detail)),
    }
}

/// The API server's quantity grammar, through the product's parser (`kube_quantity`).
fn is_quantity(s: &str) -> bool {
    provisioner_api::quantity::parse(s).is_some()
}

fn quantity(v: Option<&Value>, field: &str, errs: &mut Vec<FieldError>) {
    if let Some(v) = v {
        let s = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => String::new(),
        };
        if !is_quantity(&s) {
            errs.push(FieldError::invalid(field, &s, "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"));
        } else if s.starts_with('-') {
            errs.push(FieldError::invalid(
                field,
                &s,
                "must be greater than or equal to 0",
            ));
        }
    }
}

fn str_field<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(|x| x.as_str()).unwrap_or("")
}

/// Validate an object on create (`old == None`) or update.
pub fn validate(res: usize, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let null = Value::Null;
    let spec = obj.get("spec").unwrap_or(&null);
    match res {
        resources::PV => {
            match spec.get("capacity").and_then(|v| v.as_object()) {
                // as the real validation: a missing capacity is both Required and
                // (no `storage` key) NotSupported
                None => {
                    errs.push(FieldError::required("spec.capacity", ""));
                    errs.push(FieldError::not_supported_rendered(
                        "spec.capacity",
                        "core.ResourceList(nil)",
                        &["storage"],
                    ));
                }
                Some(c) if c.is_empty() => {
                    errs.push(FieldError::required("spec.capacity", ""));
                    errs.push(FieldError::not_supported_rendered(
                        "spec.capacity",
                        "core.ResourceList{}",
                        &["storage"],
                    ));
                }
                Some(c) => {
                    if !c.contains_key("storage") || c.len() > 1 {
                        let keys: Vec<&str> = c.keys().map(|s| s.as_str()).collect();
                        errs.push(FieldError::not_supported(
                            "spec.capacity",
                            &keys.join(","),
                            &["storage"],
                        ));
                    }
                    quantity(c.get("storage"), "spec.capacity[storage]", &mut errs);
                }
            }
            access_modes(spec, &mut errs, "");
            let n = PV_SOURCES
                .iter()
                .filter(|s| spec.get(**s).is_some_and(|v| !v.is_null()))
                .count();
            if n == 0 {
                errs.push(FieldError::required("spec", "must specify a volume type"));
            } else if n > 1 {
                errs.push(FieldError::forbidden(
                    "spec",
                    "may not specify more than 1 volume type",
                ));
            }
            if spec.get("local").is_some_and(|v| !v.is_null())
                && spec.get("nodeAffinity").is_none_or(|v| v.is_null())
            {
                errs.push(FieldError::required(
                    "spec.nodeAffinity",
                    "Local volume requires node affinity",
                ));
            }
            let rp = str_field(spec, "persistentVolumeReclaimPolicy");
            if !["Delete", "Recycle", "Retain"].contains(&rp) {
                errs.push(FieldError::not_supported(
                    "spec.persistentVolumeReclaimPolicy",
                    rp,
                    &["Delete", "Recycle", "Retain"],
                ));
            }
            let vm = str_field(spec, "volumeMode");
            if !["Block", "Filesystem"].contains(&vm) {
                errs.push(FieldError::not_supported(
                    "spec.volumeMode",
                    vm,
                    &["Block", "Filesystem"],
                ));
            }
            if let Some(cr) = spec.get("claimRef").filter(|v| !v.is_null()) {
                if str_field(cr, "name").is_empty() {
                    errs.push(FieldError::required("spec.claimRef.name", ""));
                }
                if str_field(cr, "namespace").is_empty() {
                    errs.push(FieldError::required("spec.claimRef.namespace", ""));
                }
            }
            if let Some(old) = old {
                let ospec = old.get("spec").unwrap_or(&null);
                let src = |s: &Value| -> Vec<Value> {
                    PV_SOURCES
                        .iter()
                        .map(|k| s.get(*k).cloned().unwrap_or(Value::Null))
                        .collect()
                };
                if src(spec) != src(ospec) {
                    errs.push(FieldError::forbidden(
                        "spec.persistentvolumesource",
                        "spec.persistentvolumesource is immutable after creation",
                    ));
                }
                if spec.get("volumeMode") != ospec.get("volumeMode") {
                    errs.push(FieldError::invalid(
                        "spec.volumeMode",
                        vm,
                        "field is immutable",
                    ));
                }
                if ospec.get("nodeAffinity").is_some_and(|v| !v.is_null())
                    && spec.get("nodeAffinity") != ospec.get("nodeAffinity")
                {
                    errs.push(FieldError::forbidden(
                        "spec.nodeAffinity",
                        "field is immutable",
                    ));
                }
            }
        }
        resources::PVC => {
            access_modes(spec, &mut errs, "at least 1 access mode is required");
            let storage = spec
                .get("resources")
                .and_then(|r| r.get("requests"))
                .and_then(|r| r.get("storage"));
            match storage {
                None => errs.push(FieldError::required("spec.resources[storage]", "")),
                Some(q) => quantity(Some(q), "spec.resources[storage]", &mut errs),
            }
            let vm = str_field(spec, "volumeMode");
            if !["Block", "Filesystem"].contains(&vm) {
                errs.push(FieldError::not_supported(
                    "spec.volumeMode",
                    vm,
                    &["Block", "Filesystem"],
                ));
            }
            if let Some(old) = old {
                let ospec = old.get("spec").unwrap_or(&null);
                let mut a = spec.clone();
                let mut b = ospec.clone();
                for s in [&mut a, &mut b] {
                    if let Some(m) = s.as_object_mut() {
                        if let Some(r) = m.get_mut("resources").and_then(|r| r.as_object_mut()) {
                            r.remove("requests");
                        }
                        m.remove("volumeAttributesClassName");
                    }
                }
                // volumeName may be set once (binding)
                if str_field(ospec, "volumeName").is_empty() {
                    for s in [&mut a, &mut b] {
                        if let Some(m) = s.as_object_mut() {
                            m.remove("volumeName");
                        }
                    }
                }
                if a != b {
                    errs.push(FieldError::forbidden("spec", "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"));
                }
            }
        }
        resources::STORAGE_CLASS => {
            let p = str_field(obj, "provisioner");
            if p.is_empty() {
                errs.push(FieldError::required("provisioner", ""));
            } else if p.len() > 63 {
                errs.push(FieldError::invalid(
                    "provisioner",
                    p,
                    "must be no more than 63 characters",
                ));
            }
            let rp = str_field(obj, "reclaimPolicy");
            if !["Delete", "Retain"].contains(&rp) {
                errs.push(FieldError::not_supported(
                    "reclaimPolicy",
                    rp,
                    &["Delete", "Retain"],
                ));
            }
            let bm = str_field(obj, "volumeBindingMode");
            if !["Immediate", "WaitForFirstConsumer"].contains(&bm) {
                errs.push(FieldError::not_supported(
                    "volumeBindingMode",
                    bm,
                    &["Immediate", "WaitForFirstConsumer"],
                ));
            }
            if let Some(old) = old {
                for f in [
                    "parameters",
                    "provisioner",
                    "reclaimPolicy",
                    "volumeBindingMode",
                ] {
                    let norm = |v: Option<&Value>| match v {
                        Some(Value::Object(m)) if m.is_empty() => None,
                        Some(Value::Null) => None,
                        other => other.cloned(),
                    };
                    if norm(obj.get(f)) != norm(old.get(f)) {
                        errs.push(FieldError::forbidden(
                            f,
                            &format!("updates to {f} are forbidden."),
                        ));
                    }
                }
            }
        }
        resources::LEASE => {
            if let Some(d) = spec.get("leaseDurationSeconds").and_then(|v| v.as_i64()) {
                if d <= 0 {
                    errs.push(FieldError {
                        kind: super::errors::FieldErrorType::Invalid,
                        field: "spec.leaseDurationSeconds".into(),
                        value: Some(d.to_string()),
                        detail: "must be greater than 0".into(),
                    });
                }
            }
            if let Some(d) = spec.get("leaseTransitions").and_then(|v| v.as_i64()) {
                if d < 0 {
                    errs.push(FieldError {
                        kind: super::errors::FieldErrorType::Invalid,
                        field: "spec.leaseTransitions".into(),
                        value: Some(d.to_string()),
                        detail: "must be greater than or equal to 0".into(),
                    });
                }
            }
        }
        // Creation rules (both Event APIs) are in `event_api::validate_create`, called by the
        // registry with the request's namespace; on update the type and note are re-checked.
        resources::EVENTS_EVENT if old.is_some() => {
            let t = str_field(obj, "type");
            if t != "Normal" && t != "Warning" {
                errs.push(FieldError::invalid(
                    "type",
                    "",
                    &format!("has invalid value: {t}"),
                ));
            }
            if str_field(obj, "note").len() > 1024 {
                errs.push(FieldError::invalid(
                    "note",
                    "",
                    "can have at most 1024 characters",
                ));
            }
        }
        _ => {}
    }
    errs
}
