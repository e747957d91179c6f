//! HTTP routing: Kubernetes REST paths (`/api/v1/...`, `/apis/<group>/<version>/...`,
//! namespaced and cluster-scoped, `/status` subresource), discovery, and the simulator's
//! control endpoints under `/_sim/...`.

use super::errors::ApiError;
use super::faults::{fault_error, FaultAction, FaultSpec, Faults};
use super::patch::PatchType;
use super::registry::{DeletePreconditions, Deleted, Registry, Sub};
use super::resources::{self, RESOURCES};
use super::selectors::{FieldSelector, LabelSelector, Selectors};
use super::store::{Key, WatchFrom};
use super::watch::{self, WatchParams};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::Router;
use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Shared state of the HTTP layer.
pub struct AppState {
    /// REST semantics.
    pub registry: Arc<Registry>,
    /// Faults and counters.
    pub faults: Arc<Faults>,
    /// Interval between watch BOOKMARKs.
    pub bookmark_interval: Duration,
    /// Watch timeout when the client sends no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// `host:port` reported in `/api`.
    pub address: String,
}

/// The axum router serving everything.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new().fallback(dispatch).with_state(state)
}

fn json_bytes(code: u16, b: Bytes) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(b))
        .unwrap()
}

fn json_value(code: u16, v: &Value) -> Response {
    json_bytes(code, Bytes::from(serde_json::to_vec(v).unwrap()))
}

fn error(e: &ApiError) -> Response {
    let mut r = json_value(e.code, &e.status());
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_str(&s.to_string()).unwrap(),
        );
    }
    r
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

struct Target<'a> {
    res: usize,
    ns: Option<&'a str>,
    name: Option<&'a str>,
    sub: Sub,
}

fn parse_target<'a>(segs: &[&'a str]) -> Option<Target<'a>> {
    let (group, version, rest) = match segs {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, r, ..] if !(rest.len() == 3 && (*r == "status" || *r == "finalize")) => {
            (Some(*ns), &rest[2..])
        }
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(*n), None),
        [p, n, s] => (*p, Some(*n), Some(*s)),
        _ => return None,
    };
    let res = resources::find(group, version, plural)?;
    let ri = &RESOURCES[res];
    if ri.namespaced != ns.is_some() && (name.is_some() || !ri.namespaced) {
        return None;
    }
    let sub = match sub {
        None => Sub::Main,
        Some("status") if ri.status_subresource => Sub::Status,
        _ => return None,
    };
    Some(Target { res, ns, name, sub })
}

async fn dispatch(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query: HashMap<String, String> =
        axum::extract::Query::<HashMap<String, String>>::try_from_uri(&parts.uri)
            .map(|q| q.0)
            .unwrap_or_default();
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let body = match axum::body::to_bytes(body, 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(e) => return error(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    if segs.first() == Some(&"_sim") {
        return control(&st, &parts.method, &segs[1..], &body);
    }
    let method = parts.method.clone();
    if method == Method::GET {
        let doc = match segs.as_slice() {
            ["version"] => Some(resources::version_doc()),
            ["api"] => Some(resources::core_versions(&st.address)),
            ["api", "v1"] => resources::resource_list("", "v1"),
            ["apis"] => Some(resources::group_list()),
            ["apis", g] => resources::group(g),
            ["apis", g, v] => resources::resource_list(g, v),
            _ => None,
        };
        if let Some(doc) = doc {
            return json_value(200, &doc);
        }
    }
    let Some(t) = parse_target(&segs) else {
        return error(&ApiError::unknown_path());
    };
    let ri = &RESOURCES[t.res];
    let is_watch = query.get("watch").is_some_and(|v| v == "true" || v == "1");
    let verb = match (&method, t.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if is_watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => {
            return error(&ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ))
        }
    };
    if t.sub == Sub::Status && !matches!(verb, "get" | "update" | "patch") {
        return error(&ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    let stat_resource = if t.sub == Sub::Status {
        format!("{}/status", ri.qualified_resource())
    } else {
        ri.qualified_resource()
    };
    st.faults.count(verb, &stat_resource);
    let lat = st.faults.latency();
    if !lat.is_zero() {
        tokio::time::sleep(lat).await;
    }
    let plural_sub = if t.sub == Sub::Status {
        format!("{}/status", ri.plural)
    } else {
        ri.plural.to_string()
    };
    match st.faults.check(verb, &plural_sub, ri.group) {
        Some(FaultAction::Error {
            code,
            retry_after_seconds,
        }) => return error(&fault_error(code, retry_after_seconds)),
        Some(FaultAction::Hang { ms }) => tokio::time::sleep(Duration::from_millis(ms)).await,
        None => {}
    }
    let ns = t.ns.unwrap_or("");
    let manager = query
        .get("fieldManager")
        .cloned()
        .or_else(|| {
            parts
                .headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .map(|ua| ua.split('/').next().unwrap_or(ua).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let reg = &st.registry;
    let result: Result<Response, ApiError> = (|| -> Result<Response, ApiError> {
        match verb {
            "get" => reg
                .store
                .get(t.res, ns, t.name.unwrap())
                .map(|s| json_bytes(200, s.full))
                .ok_or_else(|| ApiError::not_found(ri, t.name.unwrap())),
            "list" => list(&st, t.res, t.ns, &query),
            "watch" => watch_resp(&st, t.res, t.ns, &query),
            "create" => {
                let v: Value = parse_json(&body)?;
                Ok(json_bytes(201, reg.create(t.res, ns, v, &manager)?.full))
            }
            "update" => {
                let v: Value = parse_json(&body)?;
                Ok(json_bytes(
                    200,
                    reg.update(t.res, ns, t.name.unwrap(), v, t.sub, &manager)?
                        .stored
                        .full,
                ))
            }
            "patch" => {
                let ct = parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let pt = PatchType::from_content_type(ct)
                    .ok_or_else(|| ApiError::unsupported_media_type(ct))?;
                let force = query.get("force").is_some_and(|v| v == "true");
                let fm = query.get("fieldManager").map(|s| s.as_str());
                let fm = if pt == PatchType::Apply {
                    fm
                } else {
                    Some(fm.unwrap_or(&manager))
                };
                let (w, created) =
                    reg.patch(t.res, ns, t.name.unwrap(), pt, &body, t.sub, fm, force)?;
                Ok(json_bytes(if created { 201 } else { 200 }, w.stored.full))
            }
            "delete" => {
                let pre = delete_preconditions(&body)?;
                match reg.delete(t.res, ns, t.name.unwrap(), &pre)? {
                    Deleted::Pending(s) => Ok(json_bytes(200, s.full)),
                    Deleted::Gone(s) => Ok(json_value(200, &success_status(t.res, &s.obj))),
                }
            }
            "deletecollection" => delete_collection(&st, t.res, t.ns, &query),
            _ => Err(ApiError::unknown_path()),
        }
    })();
    result.unwrap_or_else(|e| error(&e))
}

fn success_status(res: usize, obj: &Value) -> Value {
    let ri = &RESOURCES[res];
    let m = &obj["metadata"];
    let mut d = json!({"name": m["name"], "kind": ri.plural, "uid": m["uid"]});
    if !ri.group.is_empty() {
        d["group"] = json!(ri.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d})
}

fn parse_json(b: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(b)
        .map_err(|e| ApiError::bad_request(format!("the object provided is unrecognized: {e}")))
}

fn delete_preconditions(body: &[u8]) -> Result<DeletePreconditions, ApiError> {
    if body.is_empty() {
        return Ok(DeletePreconditions::default());
    }
    let v = parse_json(body)?;
    let p = &v["preconditions"];
    Ok(DeletePreconditions {
        uid: p.get("uid").and_then(|x| x.as_str()).map(String::from),
        resource_version: p
            .get("resourceVersion")
            .and_then(|x| x.as_str())
            .map(String::from),
    })
}

fn selectors(res: usize, q: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    Ok(Selectors {
        labels: LabelSelector::parse(q.get("labelSelector").map(|s| s.as_str()).unwrap_or(""))?,
        fields: FieldSelector::parse(
            res,
            q.get("fieldSelector").map(|s| s.as_str()).unwrap_or(""),
        )?,
    })
}

fn list(
    st: &AppState,
    res: usize,
    ns: Option<&str>,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let ri = &RESOURCES[res];
    let sel = selectors(res, q)?;
    let store = &st.registry.store;
    if let Some(rv) = q
        .get("resourceVersion")
        .filter(|s| !s.is_empty() && *s != "0")
    {
        let rv: u64 = rv.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {rv:?}: must be a valid resource version"
            ))
        })?;
        let cur = store.current_rv();
        if rv > cur {
            return Err(ApiError::too_large_rv(rv, cur));
        }
        // With `limit` (and no `continue`) the real server reads this exact
        // resourceVersion from etcd: once compacted, 410 Expired.
        let exact = q.contains_key("limit")
            && !q.contains_key("continue")
            && q.get("resourceVersionMatch").is_none_or(|m| m == "Exact");
        if exact && rv < store.oldest_watchable_rv() {
            return Err(ApiError::expired_list());
        }
    }
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let (after, list_rv): (Option<Key>, Option<u64>) =
        match q.get("continue").filter(|s| !s.is_empty()) {
            Some(tok) => {
                let parts: Vec<&str> = tok.split(':').collect();
                let bad =
                    || ApiError::bad_request("continue key is not valid: invalid continue token");
                if parts.len() != 3 {
                    return Err(bad());
                }
                let token_rv: u64 = parts[0].parse().map_err(|_| bad())?;
                // the token's snapshot is gone from the history: 410, as
                // etcd's compaction makes the real server answer
                if token_rv < store.oldest_watchable_rv() {
                    return Err(ApiError::expired_continue());
                }
                (
                    Some((
                        unhex(parts[1]).ok_or_else(bad)?,
                        unhex(parts[2]).ok_or_else(bad)?,
                    )),
                    Some(token_rv),
                )
            }
            None => (None, None),
        };
    let keep = |o: &Value| sel.matches(o);
    let (items, rv, remaining) = store.list(res, ns, after.as_ref(), &keep, limit);
    let rv = list_rv.unwrap_or(rv);
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if remaining > 0 {
        if let Some(last) = items.last() {
            let m = &last.obj["metadata"];
            let tok = format!(
                "{rv}:{}:{}",
                hex(m["namespace"].as_str().unwrap_or("")),
                hex(m["name"].as_str().unwrap_or(""))
            );
            meta["continue"] = json!(tok);
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    let mut b =
        BytesMut::with_capacity(128 + items.iter().map(|i| i.item.len() + 1).sum::<usize>());
    b.extend_from_slice(
        format!(
            "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            ri.kind,
            ri.api_version(),
            meta
        )
        .as_bytes(),
    );
    for (i, it) in items.iter().enumerate() {
        if i > 0 {
            b.extend_from_slice(b",");
        }
        b.extend_from_slice(&it.item);
    }
    b.extend_from_slice(b"]}");
    Ok(json_bytes(200, b.freeze()))
}

fn watch_resp(
    st: &AppState,
    res: usize,
    ns: Option<&str>,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let sel = selectors(res, q)?;
    let from = match q.get("resourceVersion").map(|s| s.as_str()) {
        None | Some("") | Some("0") => WatchFrom::Now,
        Some(rv) => WatchFrom::Rv(rv.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {rv:?}: must be a valid resource version"
            ))
        })?),
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(st.default_watch_timeout);
    let p = WatchParams {
        res,
        ns: ns.map(String::from),
        selectors: sel,
        from,
        bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| v == "true"),
        send_initial_events: q.get("sendInitialEvents").is_some_and(|v| v == "true"),
        timeout,
        bookmark_interval: st.bookmark_interval,
    };
    let stream = watch::start(st.registry.store.clone(), p, st.faults.drop_receiver());
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap())
}

fn delete_collection(
    st: &AppState,
    res: usize,
    ns: Option<&str>,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let ri = &RESOURCES[res];
    let sel = selectors(res, q)?;
    let keep = |o: &Value| sel.matches(o);
    let (items, _, _) = st.registry.store.list(res, ns, None, &keep, None);
    let mut out = Vec::new();
    for it in items {
        let m = &it.obj["metadata"];
        let (ins, name) = (
            m["namespace"].as_str().unwrap_or(""),
            m["name"].as_str().unwrap_or(""),
        );
        match st
            .registry
            .delete(res, ins, name, &DeletePreconditions::default())
        {
            Ok(Deleted::Pending(s)) | Ok(Deleted::Gone(s)) => out.push((*s.obj).clone()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = st.registry.store.current_rv();
    Ok(json_value(
        200,
        &json!({"kind": format!("{}List", ri.kind), "apiVersion": ri.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": out}),
    ))
}

fn control(st: &AppState, method: &Method, segs: &[&str], body: &[u8]) -> Response {
    let f = &st.faults;
    match (method.as_str(), segs) {
        ("GET", ["healthz"]) => json_value(200, &json!({"ok": true})),
        ("GET", ["stats"]) => json_value(200, &serde_json::to_value(f.stats()).unwrap()),
        ("DELETE", ["stats"]) => {
            f.reset_stats();
            json_value(200, &json!({"ok": true}))
        }
        ("POST", ["faults"]) => match serde_json::from_slice::<FaultSpec>(body) {
            Ok(spec) => json_value(201, &json!({"id": f.inject(spec)})),
            Err(e) => error(&ApiError::bad_request(format!("invalid fault spec: {e}"))),
        },
        ("GET", ["faults"]) => {
            let l: Vec<Value> = f
                .list()
                .into_iter()
                .map(|(id, s)| json!({"id": id, "spec": s}))
                .collect();
            json_value(200, &json!(l))
        }
        ("DELETE", ["faults"]) => {
            f.clear();
            json_value(200, &json!({"ok": true}))
        }
        ("DELETE", ["faults", id]) => match id.parse() {
            Ok(id) => {
                f.remove(id);
                json_value(200, &json!({"ok": true}))
            }
            Err(_) => error(&ApiError::bad_request("bad id")),
        },
        ("POST", ["drop-watches"]) => {
            f.drop_watches();
            json_value(200, &json!({"ok": true}))
        }
        ("POST", ["latency"]) => match serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["ms"].as_u64())
        {
            Some(ms) => {
                f.set_latency(Duration::from_millis(ms));
                json_value(200, &json!({"ok": true}))
            }
            None => error(&ApiError::bad_request("expected {\"ms\": N}")),
        },
        ("GET", ["objects", r]) => match resources::by_name(r) {
            Some(res) => {
                let (items, rv, _) = st.registry.store.list(res, None, None, &|_| true, None);
                let v: Vec<Value> = items
                    .iter()
                    .map(|s| serde_json::from_slice(&s.full).unwrap())
                    .collect();
                json_value(200, &json!({"resourceVersion": rv.to_string(), "items": v}))
            }
            None => error(&ApiError::unknown_path()),
        },
        _ => error(&ApiError::unknown_path()),
    }
}
