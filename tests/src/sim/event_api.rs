//! Events: one resource behind two APIs, as on a real kube-apiserver.
//!
//! A real server stores `core/v1` Events and `events.k8s.io/v1` Events as one resource
//! (etcd key `/events/<namespace>/<name>`): an Event created through either API is listed,
//! watched, patched and deleted through both, with one uid and one resourceVersion. Each API
//! shows it in its own field names; the mapping below is the one kube-apiserver's conversion
//! does (observed on v1.19.2 and unchanged since):
//!
//! | core/v1 | events.k8s.io/v1 |
//! | --- | --- |
//! | `involvedObject` | `regarding` |
//! | `message` | `note` |
//! | `reportingComponent` | `reportingController` |
//! | `source` | `deprecatedSource` |
//! | `firstTimestamp` / `lastTimestamp` | `deprecatedFirstTimestamp` / `deprecatedLastTimestamp` |
//! | `count` | `deprecatedCount` |
//!
//! (`metadata`, `eventTime`, `series`, `action`, `related`, `reportingInstance`, `reason` and
//! `type` keep their names.) The simulator keeps one map per API view; [`twin`] tells the
//! store which other view to update, with the same resourceVersion, on every write, so both
//! views always agree.
//!
//! [`validate_create`] is kube-apiserver's `ValidateEventCreate` of v1.19 or v1.37: the namespace rule for
//! Events about cluster-scoped objects (`involvedObject.namespace` empty) is the one that
//! matters to a provisioner publishing about PersistentVolumes:
//! * without `eventTime` (a `core/v1`-style Event): the Event's namespace must be `default`
//!   (or empty);
//! * with `eventTime` (every `events.k8s.io/v1` Event, and core Events written by new
//!   recorders): v1.19 accepts only `kube-system`. Kubernetes 1.23 (backported to 1.20.12,
//!   1.21.6, 1.22.3; kubernetes/kubernetes#100125) accepts `default` too, so `kube-system` is
//!   the one namespace every supported version accepts. The simulator enforces the 1.19 rule.

use super::errors::FieldError;
use super::resources::{CORE_EVENT, EVENTS_EVENT};
use serde_json::{Map, Value};

/// `(core/v1 name, events.k8s.io/v1 name)` of every field whose name differs.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// Fields with the same name in both APIs.
const SHARED: &[&str] = &[
    "metadata",
    "eventTime",
    "series",
    "action",
    "related",
    "reportingInstance",
    "reason",
    "type",
];

/// Length limits of kube-apiserver's event validation (characters).
const REPORTING_INSTANCE_LIMIT: usize = 128;
const ACTION_LIMIT: usize = 128;
const REASON_LIMIT: usize = 128;
const NOTE_LIMIT: usize = 1024;

/// The other view of an Event resource index: `Some(EVENTS_EVENT)` for `CORE_EVENT` and the
/// reverse; `None` for every other resource.
pub fn twin(res: usize) -> Option<usize> {
    match res {
        CORE_EVENT => Some(EVENTS_EVENT),
        EVENTS_EVENT => Some(CORE_EVENT),
        _ => None,
    }
}

/// An Event object (without `kind`/`apiVersion`, in either API's field names) as the view
/// `res` (`CORE_EVENT` or `EVENTS_EVENT`) shows it, with the fields the real server always
/// renders (`null` timestamps, empty `source`). Unknown fields are dropped, as the real
/// server's decoding drops them. Any other `res` returns the object unchanged.
pub fn view(res: usize, obj: &Value) -> Value {
    let to_core = match res {
        CORE_EVENT => true,
        EVENTS_EVENT => false,
        _ => return obj.clone(),
    };
    let Some(src) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    for (k, v) in src {
        if SHARED.contains(&k.as_str()) {
            out.insert(k.clone(), v.clone());
        } else if let Some((core, ev)) = RENAMED.iter().find(|(c, e)| k == c || k == e) {
            out.insert(if to_core { core } else { ev }.to_string(), v.clone());
        }
    }
    let defaults: &[(&str, Value)] = if to_core {
        &[
            ("involvedObject", Value::Object(Map::new())),
            ("source", Value::Object(Map::new())),
            ("firstTimestamp", Value::Null),
            ("lastTimestamp", Value::Null),
            ("eventTime", Value::Null),
            ("reportingComponent", Value::String(String::new())),
            ("reportingInstance", Value::String(String::new())),
        ]
    } else {
        &[
            ("eventTime", Value::Null),
            ("deprecatedSource", Value::Object(Map::new())),
            ("deprecatedFirstTimestamp", Value::Null),
            ("deprecatedLastTimestamp", Value::Null),
        ]
    };
    for (k, v) in defaults {
        out.entry(k.to_string()).or_insert_with(|| v.clone());
    }
    Value::Object(out)
}

fn s<'a>(o: &'a Value, k: &str) -> &'a str {
    o.get(k).and_then(|v| v.as_str()).unwrap_or("")
}

fn set(o: &Value, k: &str) -> bool {
    match o.get(k) {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_i64() != Some(0),
        Some(_) => true,
    }
}

/// kubernetes' `IsQualifiedName` name part: 1–63 characters, alphanumerics, `-`, `_`, `.`,
/// starting and ending alphanumeric (an optional DNS-subdomain prefix before `/`).
fn qualified_name_error(v: &str) -> Option<&'static str> {
    let name = v.rsplit_once('/').map_or(v, |(_, n)| n);
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (!ok).then_some(
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
    )
}

/// kube-apiserver `ValidateEventCreate` of `version` for an Event created through `res`
/// (`CORE_EVENT` or `EVENTS_EVENT`) in namespace `ns`; `obj` in that API's field names.
/// Field paths in the errors use the internal (core) names, as the real server's do
/// (e.g. `involvedObject.namespace` even for an `events.k8s.io/v1` request).
pub fn validate_create(
    res: usize,
    ns: &str,
    obj: &Value,
    version: crate::realkube::KubeVersion,
) -> Vec<FieldError> {
    let core = view(CORE_EVENT, obj);
    let mut errs = Vec::new();
    let involved_ns = core
        .get("involvedObject")
        .map(|o| s(o, "namespace"))
        .unwrap_or("");
    // legacyValidateEvent: both APIs.
    if !set(&core, "eventTime") {
        let ok = if involved_ns.is_empty() {
            ns.is_empty() || ns == "default"
        } else {
            ns == involved_ns
        };
        if !ok {
            errs.push(FieldError::invalid(
                "involvedObject.namespace",
                involved_ns,
                "does not match event.namespace",
            ));
        }
    } else {
        // 1.23 (kubernetes#100125) accepts `default` as well as `kube-system`.
        let allowed: &[&str] = if version >= crate::realkube::KubeVersion::V1_37 {
            &["kube-system", "default"]
        } else {
            &["kube-system"]
        };
        if involved_ns.is_empty() && !allowed.contains(&ns) {
            errs.push(FieldError::invalid(
                "involvedObject.namespace",
                involved_ns,
                "does not match event.namespace",
            ));
        }
        let controller = s(&core, "reportingComponent");
        if controller.is_empty() {
            errs.push(FieldError::required("reportingController", ""));
        } else if let Some(msg) = qualified_name_error(controller) {
            errs.push(FieldError::invalid("reportingController", controller, msg));
        }
        for (field, limit) in [
            ("reportingInstance", REPORTING_INSTANCE_LIMIT),
            ("action", ACTION_LIMIT),
            ("reason", REASON_LIMIT),
        ] {
            let v = s(&core, field);
            if v.is_empty() {
                errs.push(FieldError::required(field, ""));
            } else if v.len() > limit {
                errs.push(FieldError::invalid(
                    field,
                    "",
                    &format!("can have at most {limit} characters"),
                ));
            }
        }
    }
    if s(&core, "message").len() > NOTE_LIMIT {
        errs.push(FieldError::invalid(
            "message",
            "",
            &format!("can have at most {NOTE_LIMIT} characters"),
        ));
    }
    if res != EVENTS_EVENT {
        return errs;
    }
    // Strict validation of the events.k8s.io API.
    if let Some(series) = core.get("series").filter(|v| !v.is_null()) {
        if series.get("count").and_then(|c| c.as_i64()).unwrap_or(0) < 2 {
            errs.push(FieldError::invalid(
                "series.count",
                "",
                "should be at least 2",
            ));
        }
        if !set(series, "lastObservedTime") {
            errs.push(FieldError::required("series.lastObservedTime", ""));
        }
    }
    if !set(&core, "eventTime") {
        errs.push(FieldError::required("eventTime", ""));
    }
    let t = s(&core, "type");
    if t != "Normal" && t != "Warning" {
        errs.push(FieldError::invalid(
            "type",
            "",
            &format!("has invalid value: {t}"),
        ));
    }
    for (field, detail) in [
        ("firstTimestamp", "needs to be unset"),
        ("lastTimestamp", "needs to be unset"),
        ("count", "needs to be unset"),
        ("source", "needs to be unset"),
    ] {
        if set(&core, field) {
            errs.push(FieldError::invalid(field, "", detail));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::realkube::KubeVersion::{V1_19, V1_37};
    use serde_json::json;

    #[test]
    fn views_rename_fields_both_ways_and_round_trip() {
        let ev = json!({
            "metadata": {"name": "a", "namespace": "ns"},
            "regarding": {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "c"},
            "note": "n", "reportingController": "rc", "reportingInstance": "ri",
            "action": "Provision", "reason": "Provisioning", "type": "Normal",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z"},
        });
        let core = view(CORE_EVENT, &ev);
        assert_eq!(core["involvedObject"]["name"], "c");
        assert_eq!(core["message"], "n");
        assert_eq!(core["reportingComponent"], "rc");
        assert_eq!(core["series"]["count"], 2);
        assert_eq!(core["source"], json!({}));
        assert!(core.get("regarding").is_none() && core.get("note").is_none());
        let back = view(EVENTS_EVENT, &core);
        for k in [
            "regarding",
            "note",
            "reportingController",
            "series",
            "eventTime",
        ] {
            assert_eq!(back[k], ev[k], "{k}");
        }
        assert!(back.get("involvedObject").is_none());
    }

    fn pv_event(ns: &str) -> Value {
        json!({
            "metadata": {"name": "pv.1", "namespace": ns},
            "regarding": {"apiVersion": "v1", "kind": "PersistentVolume", "name": "pv"},
            "reportingController": "reclaim-svc", "reportingInstance": "r-1",
            "action": "Delete", "reason": "VolumeFailedDelete", "type": "Warning",
            "eventTime": "2026-01-01T00:00:00.000000Z",
        })
    }

    #[test]
    fn cluster_scoped_regarding_is_accepted_only_in_kube_system_as_on_1_19() {
        let v = V1_19;
        assert!(
            validate_create(EVENTS_EVENT, "kube-system", &pv_event("kube-system"), v).is_empty()
        );
        let errs = validate_create(EVENTS_EVENT, "default", &pv_event("default"), v);
        assert_eq!(
            errs.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            ["involvedObject.namespace: Invalid value: \"\": does not match event.namespace"]
        );
        // a core/v1 Event without eventTime about a PV: `default` only.
        let legacy = json!({"involvedObject": {"kind": "PersistentVolume", "name": "pv"},
                            "reason": "R", "type": "Warning"});
        assert!(validate_create(CORE_EVENT, "default", &legacy, v).is_empty());
        assert_eq!(
            validate_create(CORE_EVENT, "kube-system", &legacy, v).len(),
            1
        );
    }

    #[test]
    fn cluster_scoped_regarding_is_accepted_in_default_too_from_1_23() {
        for ns in ["kube-system", "default"] {
            assert!(validate_create(EVENTS_EVENT, ns, &pv_event(ns), V1_37).is_empty());
        }
        let errs = validate_create(EVENTS_EVENT, "other", &pv_event("other"), V1_37);
        assert_eq!(errs.len(), 1, "{errs:?}");
    }

    #[test]
    fn strict_rules_apply_to_events_k8s_io_only() {
        let mut ev = pv_event("kube-system");
        ev["deprecatedCount"] = json!(3);
        ev["type"] = json!("Bogus");
        let errs: Vec<String> = validate_create(EVENTS_EVENT, "kube-system", &ev, V1_37)
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert!(errs.iter().any(|e| e.starts_with("count: ")), "{errs:?}");
        assert!(
            errs.iter().any(|e| e.contains("has invalid value: Bogus")),
            "{errs:?}"
        );
        assert!(validate_create(CORE_EVENT, "kube-system", &ev, V1_37).is_empty());
    }
}
