//! Field ownership (`metadata.managedFields`) and server-side apply
//! (`application/apply-patch+yaml`).
//!
//! Ownership is tracked per leaf field; lists are atomic leaves (the real server tracks
//! associative/set lists per element — a known simplification). As on the real server:
//! every non-apply write makes its field manager (operation `Update`) own the fields it
//! changed and takes them away from everyone else; an apply whose value differs from the
//! current value of a field owned by another manager fails with `409 Conflict`
//! (`Apply failed with N conflict(s): conflict with "<manager>" ...`) unless `force=true`;
//! fields a manager applied before and omits now are removed unless someone else owns them.

use super::errors::ApiError;
use super::resources::ResourceInfo;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// A field path, e.g. `["spec", "holderIdentity"]`.
pub type FieldPath = Vec<String>;

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedEntry {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: &'static str,
    /// API version of the request.
    pub api_version: String,
    /// RFC 3339 time of the last change by this entry.
    pub time: String,
    /// `""` or `status`.
    pub subresource: String,
    /// Owned leaf fields.
    pub fields: BTreeSet<FieldPath>,
}

fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                path.push(k.clone());
                walk(c, path, out);
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Leaf fields of an object that participate in ownership: everything but
/// `apiVersion`/`kind` and server-managed metadata (only metadata labels, annotations,
/// finalizers and ownerReferences are tracked).
pub fn leaf_paths(obj: &Value) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    let Some(m) = obj.as_object() else { return out };
    for (k, v) in m {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for mk in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(c) = v.get(mk) {
                        let mut p = vec!["metadata".to_string(), mk.to_string()];
                        walk(c, &mut p, &mut out);
                    }
                }
            }
            _ => {
                let mut p = vec![k.clone()];
                walk(v, &mut p, &mut out);
            }
        }
    }
    out
}

/// Value at a field path.
pub fn get_path<'a>(obj: &'a Value, p: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for s in p {
        cur = cur.get(s)?;
    }
    Some(cur)
}

fn remove_path(obj: &mut Value, p: &[String]) {
    let Some((last, parent)) = p.split_last() else {
        return;
    };
    {
        let mut cur = &mut *obj;
        for s in parent {
            match cur.get_mut(s) {
                Some(c) => cur = c,
                None => return,
            }
        }
        if let Some(m) = cur.as_object_mut() {
            m.remove(last);
        }
    }
    // prune now-empty parent maps (as structured-merge-diff does)
    if !parent.is_empty() {
        let empty = get_path(obj, parent)
            .and_then(|v| v.as_object())
            .is_some_and(|m| m.is_empty());
        if empty {
            remove_path(obj, parent);
        }
    }
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Record a non-apply write by `manager` that turned `old` into `new`.
pub fn record_update(
    entries: &[ManagedEntry],
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    api_version: &str,
    subresource: &str,
    now: &str,
) -> Vec<ManagedEntry> {
    let new_paths = leaf_paths(new);
    let old_paths = old.map(leaf_paths).unwrap_or_default();
    let mut changed: BTreeSet<FieldPath> = BTreeSet::new();
    for p in &new_paths {
        if old.and_then(|o| get_path(o, p)) != get_path(new, p) {
            changed.insert(p.clone());
        }
    }
    for p in &old_paths {
        if !new_paths.contains(p) {
            changed.insert(p.clone());
        }
    }
    let mut out: Vec<ManagedEntry> = entries.to_vec();
    if changed.is_empty() {
        return prune(out, &new_paths);
    }
    for e in out.iter_mut() {
        if !(e.manager == manager && e.operation == "Update" && e.subresource == subresource) {
            e.fields.retain(|f| !changed.iter().any(|c| overlaps(f, c)));
        }
    }
    let mine = match out.iter().position(|e| {
        e.manager == manager && e.operation == "Update" && e.subresource == subresource
    }) {
        Some(i) => i,
        None => {
            out.push(ManagedEntry {
                manager: manager.to_string(),
                operation: "Update",
                api_version: api_version.to_string(),
                time: now.to_string(),
                subresource: subresource.to_string(),
                fields: BTreeSet::new(),
            });
            out.len() - 1
        }
    };
    out[mine].time = now.to_string();
    out[mine].api_version = api_version.to_string();
    for c in changed {
        if new_paths.contains(&c) {
            out[mine].fields.insert(c);
        }
    }
    prune(out, &new_paths)
}

fn prune(mut entries: Vec<ManagedEntry>, existing: &BTreeSet<FieldPath>) -> Vec<ManagedEntry> {
    for e in entries.iter_mut() {
        e.fields.retain(|f| existing.contains(f));
    }
    entries.retain(|e| !e.fields.is_empty());
    entries
}

fn deep_merge(target: &mut Value, cfg: &Value) {
    match (target, cfg) {
        (Value::Object(t), Value::Object(c)) => {
            for (k, v) in c {
                match t.get_mut(k) {
                    Some(tv) if tv.is_object() && v.is_object() => deep_merge(tv, v),
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, c) => *t = c.clone(),
    }
}

fn strip_nulls(v: &mut Value) {
    if let Value::Object(m) = v {
        m.retain(|_, c| !c.is_null());
        for c in m.values_mut() {
            strip_nulls(c);
        }
    }
}

/// Server-side apply of `cfg` (already stripped of kind/apiVersion checks) by `manager` onto
/// `live` (`None` = create). Returns the merged object and the new ownership, or a
/// `409 Conflict` listing conflicting fields.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    ri: &ResourceInfo,
    name: &str,
    live: Option<&Value>,
    entries: &[ManagedEntry],
    cfg: &Value,
    manager: &str,
    force: bool,
    subresource: &str,
    now: &str,
) -> Result<(Value, Vec<ManagedEntry>), ApiError> {
    let mut cfg = cfg.clone();
    strip_nulls(&mut cfg);
    let applied = leaf_paths(&cfg);
    let empty = Value::Object(Map::new());
    let live_v = live.unwrap_or(&empty);
    let is_me = |e: &ManagedEntry| {
        e.manager == manager && e.operation == "Apply" && e.subresource == subresource
    };
    // conflicts
    let mut conflicts: Vec<(String, String)> = Vec::new();
    for p in &applied {
        let differs = get_path(live_v, p) != get_path(&cfg, p);
        if !differs {
            continue;
        }
        for e in entries.iter().filter(|e| !is_me(e)) {
            if e.fields.iter().any(|f| overlaps(f, p)) {
                conflicts.push((e.manager.clone(), format!(".{}", p.join("."))));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let n = conflicts.len();
        let av = ri.api_version();
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(m, f)| format!("conflict with \"{m}\" using {av}: {f}"))
            .collect();
        let message = if n == 1 {
            format!("Apply failed with 1 conflict: {}", lines[0])
        } else {
            format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
        };
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, f)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {av}"), "field": f}))
            .collect();
        let mut e = ApiError::conflict_msg(ri, name, "");
        e.message = message;
        let mut d = json!({"name": name, "kind": ri.plural, "causes": causes});
        if !ri.group.is_empty() {
            d["group"] = json!(ri.group);
        }
        e.details = Some(d);
        return Err(e);
    }
    let mut merged = live_v.clone();
    deep_merge(&mut merged, &cfg);
    let prev_applied: BTreeSet<FieldPath> = entries
        .iter()
        .filter(|e| is_me(e))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let mut out: Vec<ManagedEntry> = entries.iter().filter(|e| !is_me(e)).cloned().collect();
    for p in prev_applied.difference(&applied) {
        let owned_by_other = out.iter().any(|e| e.fields.iter().any(|f| overlaps(f, p)));
        if !owned_by_other {
            remove_path(&mut merged, p);
        }
    }
    for e in out.iter_mut() {
        // fields whose value changed move to the applier (forced or unowned)
        e.fields.retain(|f| {
            !applied
                .iter()
                .any(|p| overlaps(f, p) && get_path(live_v, p) != get_path(&cfg, p))
        });
    }
    out.push(ManagedEntry {
        manager: manager.to_string(),
        operation: "Apply",
        api_version: ri.api_version(),
        time: now.to_string(),
        subresource: subresource.to_string(),
        fields: applied,
    });
    let existing = leaf_paths(&merged);
    Ok((merged, prune(out, &existing)))
}

/// Render entries as `metadata.managedFields` (`fieldsType: FieldsV1`).
pub fn render(entries: &[ManagedEntry]) -> Value {
    let arr: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut root = Map::new();
            for f in &e.fields {
                let mut cur = &mut root;
                for s in f {
                    let k = format!("f:{s}");
                    cur = cur
                        .entry(k)
                        .or_insert_with(|| Value::Object(Map::new()))
                        .as_object_mut()
                        .unwrap();
                }
            }
            let mut m = Map::new();
            m.insert("manager".into(), json!(e.manager));
            m.insert("operation".into(), json!(e.operation));
            m.insert("apiVersion".into(), json!(e.api_version));
            m.insert("time".into(), json!(e.time));
            m.insert("fieldsType".into(), json!("FieldsV1"));
            m.insert("fieldsV1".into(), Value::Object(root));
            if !e.subresource.is_empty() {
                m.insert("subresource".into(), json!(e.subresource));
            }
            Value::Object(m)
        })
        .collect();
    Value::Array(arr)
}
