//! Patch types other than server-side apply: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902) and strategic merge patch (the subset of Kubernetes' strategic merge that
//! the served kinds need: merge-keyed lists `metadata.ownerReferences` (uid),
//! `status.conditions` / `status.addresses` (type), `spec.taints` (key); the merge-strategy
//! primitive list `metadata.finalizers` (`patchStrategy:"merge"` in ObjectMeta) is a
//! union, patch items first, then the server's items not in the patch, as kube-apiserver
//! v1.19 answers; every other list is replaced;
//! `$patch: replace|delete`, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>`
//! and `$retainKeys` directives).

use serde_json::{Map, Value};

/// The patch content types kube-apiserver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply, see `apply`)
    Apply,
}

impl PatchType {
    /// Parse a Content-Type header value.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    if let Value::Object(p) = patch {
        if !target.is_object() {
            *target = Value::Object(Map::new());
        }
        let t = target.as_object_mut().unwrap();
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    } else {
        *target = patch.clone();
    }
}

fn unescape(tok: &str) -> String {
    tok.replace("~1", "/").replace("~0", "~")
}

fn split_pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(vec![]);
    }
    if !p.starts_with('/') {
        return Err(format!("invalid JSON pointer {p:?}"));
    }
    Ok(p[1..].split('/').map(unescape).collect())
}

fn parent_mut<'a>(doc: &'a mut Value, toks: &[String]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(t)
                .ok_or_else(|| format!("path element {t:?} not found"))?,
            Value::Array(a) => {
                let i: usize = t
                    .parse()
                    .map_err(|_| format!("invalid array index {t:?}"))?;
                a.get_mut(i)
                    .ok_or_else(|| format!("array index {i} out of range"))?
            }
            _ => return Err(format!("cannot traverse into {t:?}")),
        };
    }
    Ok(cur)
}

fn get_ptr<'a>(doc: &'a Value, toks: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m.get(t)?,
            Value::Array(a) => a.get(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn add(doc: &mut Value, toks: &[String], v: Value) -> Result<(), String> {
    let Some((last, parent)) = toks.split_last() else {
        *doc = v;
        return Ok(());
    };
    match parent_mut(doc, parent)? {
        Value::Object(m) => {
            m.insert(last.clone(), v);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(v);
                return Ok(());
            }
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i > a.len() {
                return Err(format!("array index {i} out of range"));
            }
            a.insert(i, v);
            Ok(())
        }
        _ => Err("add target is not a container".into()),
    }
}

fn remove(doc: &mut Value, toks: &[String]) -> Result<Value, String> {
    let Some((last, parent)) = toks.split_last() else {
        return Err("cannot remove the root".into());
    };
    match parent_mut(doc, parent)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("unable to remove nonexistent key: {last}")),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i >= a.len() {
                return Err(format!("array index {i} out of range"));
            }
            Ok(a.remove(i))
        }
        _ => Err("remove target is not a container".into()),
    }
}

/// RFC 6902 JSON patch. Errors carry the message the caller wraps into a 422.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops.as_array().ok_or("json patch must be an array")?;
    for op in ops {
        let kind = op
            .get("op")
            .and_then(|v| v.as_str())
            .ok_or("operation missing \"op\"")?;
        let path = split_pointer(
            op.get("path")
                .and_then(|v| v.as_str())
                .ok_or("operation missing \"path\"")?,
        )?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("operation {kind:?} missing \"value\""))
        };
        let from = || -> Result<Vec<String>, String> {
            split_pointer(
                op.get("from")
                    .and_then(|v| v.as_str())
                    .ok_or("operation missing \"from\"")?,
            )
        };
        match kind {
            "add" => add(doc, &path, value()?)?,
            "remove" => {
                remove(doc, &path)?;
            }
            "replace" => {
                remove(doc, &path)?;
                add(doc, &path, value()?)?;
            }
            "move" => {
                let v = remove(doc, &from()?)?;
                add(doc, &path, v)?;
            }
            "copy" => {
                let v = get_ptr(doc, &from()?)
                    .cloned()
                    .ok_or("copy source not found")?;
                add(doc, &path, v)?;
            }
            "test" => {
                let cur = get_ptr(doc, &path);
                if cur != Some(&value()?) {
                    return Err(format!(
                        "testing value {} failed: test failed",
                        op.get("path").and_then(|v| v.as_str()).unwrap_or("")
                    ));
                }
            }
            other => return Err(format!("unexpected kind: {other}")),
        }
    }
    Ok(())
}

/// Primitive lists with `patchStrategy:"merge"` among the served kinds' fields.
const MERGE_PRIMITIVE_LISTS: &[&str] = &["metadata.finalizers"];

fn merge_key(path: &str) -> Option<&'static str> {
    match path {
        "metadata.ownerReferences" => Some("uid"),
        "status.conditions" => Some("type"),
        "status.addresses" => Some("type"),
        "spec.taints" => Some("key"),
        _ => None,
    }
}

/// Strategic merge patch (subset; see module docs).
pub fn strategic(target: &mut Value, patch: &Value) -> Result<(), String> {
    smp(target, patch, "")
}

fn smp(target: &mut Value, patch: &Value, path: &str) -> Result<(), String> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match p.get("$patch").and_then(|v| v.as_str()) {
        Some("replace") => {
            let mut c = p.clone();
            c.remove("$patch");
            *target = Value::Object(c);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) if other != "merge" => return Err(format!("unknown patch type: {other}")),
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (t.get_mut(field), v) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (v, merge_key(&child)) {
            (Value::Array(items), None) if MERGE_PRIMITIVE_LISTS.contains(&child.as_str()) => {
                let server = match t.get(k) {
                    Some(Value::Array(cur)) => cur.clone(),
                    _ => Vec::new(),
                };
                let mut merged: Vec<Value> = Vec::new();
                for x in items.iter().chain(server.iter()) {
                    if !merged.contains(x) {
                        merged.push(x.clone());
                    }
                }
                t.insert(k.clone(), Value::Array(merged));
            }
            (Value::Array(items), Some(key)) => {
                let cur = t.entry(k.clone()).or_insert_with(|| Value::Array(vec![]));
                if !cur.is_array() {
                    *cur = Value::Array(vec![]);
                }
                let list = cur.as_array_mut().unwrap();
                for item in items {
                    let kv = item.get(key).cloned();
                    let pos = kv
                        .as_ref()
                        .and_then(|kv| list.iter().position(|e| e.get(key) == Some(kv)));
                    let del = item.get("$patch").and_then(|v| v.as_str()) == Some("delete");
                    match (pos, del) {
                        (Some(i), true) => {
                            list.remove(i);
                        }
                        (None, true) => {}
                        (Some(i), false) => smp(&mut list[i], item, &child)?,
                        (None, false) => {
                            let mut n = Value::Null;
                            smp(&mut n, item, &child)?;
                            list.push(n);
                        }
                    }
                }
            }
            (Value::Object(_), _) => {
                let e = t.entry(k.clone()).or_insert(Value::Null);
                smp(e, v, &child)?;
                if e.is_null() {
                    t.remove(k);
                }
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}
