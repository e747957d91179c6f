//! REST semantics of kube-apiserver's generic registry (`Store.Create/Update/Delete`) and
//! the per-kind strategies: server-assigned metadata, `generateName`, optimistic
//! concurrency, status subresource resets, finalizer-driven graceful deletion, delete
//! preconditions, defaulting, validation, the admission plugins that touch these kinds
//! (NamespaceLifecycle, StorageObjectInUseProtection, DefaultStorageClass), and field
//! ownership.

use super::apply::{self, ManagedEntry};
use super::errors::{ApiError, FieldError};
use super::patch::{self, PatchType};
use super::resources::{self, ResourceInfo, RESOURCES};
use super::store::{Outcome, Store, Stored, WriteResult};
use super::validation;
use rand::Rng;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The field manager of direct store access (`SimHandle::create_object`).
pub const DIRECT_MANAGER: &str = "e2e-sim-direct";

/// Finalizer the StorageObjectInUseProtection admission plugin adds to claims.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// Finalizer the StorageObjectInUseProtection admission plugin adds to volumes.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Admission behaviour switches.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// NamespaceLifecycle: reject creating namespaced objects in a missing namespace (404).
    pub enforce_namespace_exists: bool,
    /// StorageObjectInUseProtection: add `kubernetes.io/pvc-protection` / `pv-protection` on create.
    pub protection_finalizers: bool,
    /// DefaultStorageClass: set `spec.storageClassName` of new claims that have none.
    pub default_storage_class: bool,
    /// The release whose rules apply where releases differ.
    pub kube_version: crate::realkube::KubeVersion,
}

/// Which endpoint a write came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    /// The main resource endpoint.
    Main,
    /// The `/status` subresource.
    Status,
}

/// `DeleteOptions` preconditions.
#[derive(Debug, Clone, Default)]
pub struct DeletePreconditions {
    /// `preconditions.uid`
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`
    pub resource_version: Option<String>,
}

/// Result of a delete.
#[derive(Debug, Clone)]
pub enum Deleted {
    /// The object had finalizers: it now has a deletionTimestamp (or already had one).
    Pending(Stored),
    /// The object is gone (last state, with the deletion's resourceVersion).
    Gone(Stored),
}

/// The REST layer over the [`Store`].
pub struct Registry {
    /// Underlying store.
    pub store: Arc<Store>,
    /// Admission switches.
    pub admission: AdmissionConfig,
}

/// Current time as RFC 3339 seconds (`metadata.creationTimestamp` format).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta(v: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    v.get("metadata")
        .and_then(|m| m.as_object())
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    let m = v.as_object_mut().expect("object");
    let e = m.entry("metadata").or_insert_with(|| json!({}));
    if !e.is_object() {
        *e = json!({});
    }
    e.as_object_mut().unwrap()
}

/// `metadata.<k>` as a string (`""` when absent).
pub fn meta_str<'a>(v: &'a Value, k: &str) -> &'a str {
    meta(v).get(k).and_then(|x| x.as_str()).unwrap_or("")
}

/// `metadata.finalizers`.
pub fn finalizers(v: &Value) -> Vec<String> {
    meta(v)
        .get("finalizers")
        .and_then(|f| f.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn generate_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHA[rng.random_range(0..ALPHA.len())] as char)
        .collect()
}

/// Check and strip `apiVersion`/`kind` of a request body.
fn check_types(ri: &ResourceInfo, body: &mut Value) -> Result<(), ApiError> {
    let Some(m) = body.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the object provided is not a JSON object",
        ));
    };
    if let Some(av) = m.remove("apiVersion") {
        let av = av.as_str().unwrap_or("");
        if !av.is_empty() && av != ri.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                ri.api_version()
            )));
        }
    }
    if let Some(k) = m.remove("kind") {
        let k = k.as_str().unwrap_or("");
        if !k.is_empty() && k != ri.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                ri.kind
            )));
        }
    }
    Ok(())
}

fn strip_for_compare(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    c
}

impl Registry {
    /// From 1.21 on the server sets label `kubernetes.io/metadata.name` of
    /// every Namespace to its name (on create and update).
    fn label_namespace(&self, body: &mut Value, name: &str) {
        if self.admission.kube_version >= crate::realkube::KubeVersion::V1_37 {
            let m = meta_mut(body);
            let labels = m.entry("labels").or_insert_with(|| json!({}));
            if !labels.is_object() {
                *labels = json!({});
            }
            labels["kubernetes.io/metadata.name"] = json!(name);
        }
    }

    /// The PV status strategy's `lastPhaseTransitionTime` (1.28+): kept when the phase
    /// stays and the writer sent none, set to now when the phase changes and the writer
    /// sent none or the old one; v1.19 has no such field (dropped).
    fn pv_phase_transition_time(&self, old: &Value, new: &mut Value) {
        let Some(status) = new.get_mut("status").and_then(|s| s.as_object_mut()) else {
            return;
        };
        if self.admission.kube_version < crate::realkube::KubeVersion::V1_37 {
            status.remove("lastPhaseTransitionTime");
            return;
        }
        let old_status = &old["status"];
        let sent = status
            .get("lastPhaseTransitionTime")
            .filter(|v| !v.is_null())
            .cloned();
        let same_phase = status.get("phase") == old_status.get("phase");
        match sent {
            None if same_phase => match old_status.get("lastPhaseTransitionTime") {
                Some(t) if !t.is_null() => {
                    status.insert("lastPhaseTransitionTime".into(), t.clone());
                }
                _ => {}
            },
            sent if !same_phase
                && (sent.is_none()
                    || sent.as_ref() == old_status.get("lastPhaseTransitionTime")) =>
            {
                status.insert("lastPhaseTransitionTime".into(), json!(now_rfc3339()));
            }
            _ => {}
        }
    }

    /// From 1.26 (RetroactiveDefaultStorageClass) a claim's `spec.storageClassName` may
    /// be set once when it was unset (nil, without the beta class annotation); then the
    /// old object to validate against carries the new class.
    fn storage_class_upgrade_from_nil(
        &self,
        res: usize,
        old: &Value,
        new: &Value,
    ) -> Option<Value> {
        if res != resources::PVC
            || self.admission.kube_version < crate::realkube::KubeVersion::V1_37
        {
            return None;
        }
        let old_class = old["spec"].get("storageClassName").filter(|v| !v.is_null());
        let new_class = new["spec"]
            .get("storageClassName")
            .filter(|v| !v.is_null())?;
        let annotated = old["metadata"]["annotations"]
            .get("volume.beta.kubernetes.io/storage-class")
            .is_some();
        if old_class.is_some() || annotated {
            return None;
        }
        let mut adjusted = old.clone();
        adjusted["spec"]["storageClassName"] = new_class.clone();
        Some(adjusted)
    }

    /// Field errors as the release words them: v1.19 prints Go values
    /// (`core.ResourceList(nil)`) and forbids StorageClass updates field by field
    /// ("updates to X are forbidden."); v1.37 prints JSON (`null`, `{}`) and its
    /// declarative validation says `Invalid value: null: field is immutable`, in the
    /// fields' declaration order.
    fn rendered(&self, errs: Vec<FieldError>) -> Vec<FieldError> {
        if self.admission.kube_version < crate::realkube::KubeVersion::V1_37 {
            return errs;
        }
        const DECLARED: [&str; 4] = [
            "provisioner",
            "parameters",
            "reclaimPolicy",
            "volumeBindingMode",
        ];
        let (mut immutable, mut out): (Vec<FieldError>, Vec<FieldError>) =
            errs.into_iter().partition(|e| {
                DECLARED.contains(&e.field.as_str())
                    && e.detail == format!("updates to {} are forbidden.", e.field)
            });
        immutable.sort_by_key(|e| DECLARED.iter().position(|f| *f == e.field));
        for e in out.iter_mut() {
            match e.value.as_deref() {
                Some("core.ResourceList(nil)") => e.value = Some("null".into()),
                Some("core.ResourceList{}") => e.value = Some("{}".into()),
                _ => {}
            }
        }
        out.extend(immutable.into_iter().map(|e| {
            let mut i = FieldError::invalid(&e.field, "", "field is immutable");
            i.value = Some("null".into());
            i
        }));
        out
    }

    fn ns_check(&self, ri: &ResourceInfo, ns: &str) -> Result<(), ApiError> {
        if ri.namespaced
            && self.admission.enforce_namespace_exists
            && self.store.get(resources::NAMESPACE, "", ns).is_none()
        {
            return Err(ApiError::namespace_not_found(ns));
        }
        Ok(())
    }

    fn default_class(&self) -> Option<String> {
        let (scs, _, _) = self.store.list(
            resources::STORAGE_CLASS,
            None,
            None,
            &|o| {
                let a = o.get("metadata").and_then(|m| m.get("annotations"));
                let get = |k: &str| a.and_then(|a| a.get(k)).and_then(|v| v.as_str());
                get("storageclass.kubernetes.io/is-default-class") == Some("true")
                    || get("storageclass.beta.kubernetes.io/is-default-class") == Some("true")
            },
            None,
        );
        // newest default wins, like the admission plugin (ties: name order)
        scs.iter()
            .max_by(|a, b| {
                meta_str(&a.obj, "creationTimestamp")
                    .cmp(meta_str(&b.obj, "creationTimestamp"))
                    .then(meta_str(&b.obj, "name").cmp(meta_str(&a.obj, "name")))
            })
            .map(|s| meta_str(&s.obj, "name").to_string())
    }

    /// `POST` a new object. `ns` is the URL namespace for namespaced resources.
    /// Create `body` as the API does; `manager` [`DIRECT_MANAGER`] (direct store
    /// access, not the API) keeps a given `metadata.uid`.
    pub fn create(
        &self,
        res: usize,
        ns: &str,
        body: Value,
        manager: &str,
    ) -> Result<Stored, ApiError> {
        self.create_with(res, ns, body, manager, None)
    }

    fn create_with(
        &self,
        res: usize,
        ns: &str,
        mut body: Value,
        manager: &str,
        applied: Option<&Value>,
    ) -> Result<Stored, ApiError> {
        let ri = &RESOURCES[res];
        check_types(ri, &mut body)?;
        let m = meta_mut(&mut body);
        if ri.namespaced {
            let bns = m.get("namespace").and_then(|v| v.as_str()).unwrap_or("");
            if !bns.is_empty() && bns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        let mut name = m
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let gn = m.get("generateName").and_then(|v| v.as_str()).unwrap_or("");
            if gn.is_empty() {
                return Err(ApiError::invalid(
                    ri,
                    "",
                    &[FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
            name = format!("{gn}{}", generate_suffix());
            m.insert("name".into(), json!(name));
        }
        let mut errs = validation::validate_name(res, &name);
        let now = now_rfc3339();
        // Direct store access (`SimHandle::create_object`) may set the uid, to
        // stand in for an object of a known uid; the API always assigns one.
        let given_uid = m
            .get("uid")
            .and_then(|v| v.as_str())
            .filter(|u| manager == DIRECT_MANAGER && !u.is_empty())
            .map(str::to_string);
        let uid = given_uid.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now));
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
            "managedFields",
            "generation",
        ] {
            m.remove(k);
        }
        // strategy PrepareForCreate
        match res {
            resources::PV => {
                body["status"] = json!({"phase": "Pending"});
                if self.admission.kube_version >= crate::realkube::KubeVersion::V1_37 {
                    body["status"]["lastPhaseTransitionTime"] = json!(now);
                }
            }
            resources::PVC => {
                body["status"] = json!({"phase": "Pending"});
            }
            resources::NAMESPACE => self.label_namespace(&mut body, &name),
            _ => {}
        }
        // admission
        if self.admission.protection_finalizers && (res == resources::PV || res == resources::PVC) {
            let f = if res == resources::PV {
                PV_PROTECTION
            } else {
                PVC_PROTECTION
            };
            let mut fins = finalizers(&body);
            if !fins.iter().any(|x| x == f) {
                fins.push(f.to_string());
                meta_mut(&mut body).insert("finalizers".into(), json!(fins));
            }
        }
        if res == resources::PVC && self.admission.default_storage_class {
            let unset = body
                .get("spec")
                .and_then(|s| s.get("storageClassName"))
                .is_none_or(|v| v.is_null());
            if unset {
                if let Some(dc) = self.default_class() {
                    if let Some(s) = body.get_mut("spec").and_then(|s| s.as_object_mut()) {
                        s.insert("storageClassName".into(), json!(dc));
                    }
                }
            }
        }
        validation::apply_defaults(res, &mut body);
        errs.extend(self.rendered(validation::validate(res, &body, None)));
        if super::event_api::twin(res).is_some() {
            errs.extend(super::event_api::validate_create(
                res,
                ns,
                &body,
                self.admission.kube_version,
            ));
        }
        if !errs.is_empty() {
            return Err(ApiError::invalid(ri, &name, &errs));
        }
        self.ns_check(ri, ns)?;
        let key_ns = if ri.namespaced { ns } else { "" };
        let managed = match applied {
            Some(cfg) => apply::apply(ri, &name, None, &[], cfg, manager, true, "", &now)?.1,
            None => apply::record_update(&[], None, &body, manager, &ri.api_version(), "", &now),
        };
        let r = self.store.write(res, key_ns, &name, |old, _| {
            if old.is_some() {
                return Err(ApiError::already_exists(ri, &name));
            }
            let mut b = body;
            meta_mut(&mut b).insert("managedFields".into(), apply::render(&managed));
            Ok(Outcome::Put(b, managed))
        })?;
        Ok(r.stored)
    }

    /// Common update path (PUT, every patch type, and internal controller writes).
    /// `new` is the full desired object (kind/apiVersion optional).
    #[allow(clippy::too_many_arguments)]
    fn finish_update(
        &self,
        res: usize,
        old: &Stored,
        mut new: Value,
        sub: Sub,
        manager: &str,
        managed_override: Option<Vec<ManagedEntry>>,
    ) -> Result<Outcome, ApiError> {
        let ri = &RESOURCES[res];
        check_types(ri, &mut new)?;
        let old_v = &*old.obj;
        let name = meta_str(old_v, "name").to_string();
        {
            let m = meta_mut(&mut new);
            let bn = m.get("name").and_then(|v| v.as_str()).unwrap_or("");
            if !bn.is_empty() && bn != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({bn}) does not match the name on the URL ({name})"
                )));
            }
            if ri.namespaced {
                let bns = m.get("namespace").and_then(|v| v.as_str()).unwrap_or("");
                if !bns.is_empty() && bns != meta_str(old_v, "namespace") {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
            }
            let rv = m
                .get("resourceVersion")
                .and_then(|v| v.as_str())
                .unwrap_or("");
            if !rv.is_empty() && rv.parse::<u64>().ok() != Some(old.rv) {
                return Err(ApiError::conflict(ri, &name));
            }
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match meta(old_v).get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
            m.remove("selfLink");
            m.remove("managedFields");
        }
        if res == resources::NAMESPACE {
            self.label_namespace(&mut new, &name);
        }
        {
            let m = meta_mut(&mut new);
            m.remove("resourceVersion");
        }
        if ri.status_subresource {
            let nm = new.as_object_mut().unwrap();
            match sub {
                Sub::Main => match old_v.get("status") {
                    Some(s) => {
                        nm.insert("status".into(), s.clone());
                    }
                    None => {
                        nm.remove("status");
                    }
                },
                Sub::Status => {
                    nm.retain(|k, _| k == "metadata" || k == "status");
                    if let Some(o) = old_v.as_object() {
                        for (k, v) in o {
                            if k != "metadata" && k != "status" {
                                nm.insert(k.clone(), v.clone());
                            }
                        }
                    }
                }
            }
        }
        if res == resources::PV && sub == Sub::Status {
            self.pv_phase_transition_time(old_v, &mut new);
        }
        // finalizers may not be added while deleting
        let deleting = meta(old_v).contains_key("deletionTimestamp");
        if deleting {
            let oldf = finalizers(old_v);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !oldf.contains(f))
                .collect();
            if !added.is_empty() {
                let list = added
                    .iter()
                    .map(|f| format!("{f:?}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(ApiError::invalid(
                    ri,
                    &name,
                    &[FieldError::forbidden(
                        "metadata.finalizers",
                        &format!("no new finalizers can be added if the object is being deleted, found new finalizers []string{{{list}}}"),
                    )],
                ));
            }
        }
        validation::apply_defaults(res, &mut new);
        let old_for_validation = self.storage_class_upgrade_from_nil(res, old_v, &new);
        let errs = self.rendered(validation::validate(
            res,
            &new,
            Some(old_for_validation.as_ref().unwrap_or(old_v)),
        ));
        if !errs.is_empty() {
            return Err(ApiError::invalid(ri, &name, &errs));
        }
        if strip_for_compare(&new) == strip_for_compare(old_v) {
            return Ok(Outcome::Unchanged);
        }
        if deleting && finalizers(&new).is_empty() {
            return Ok(Outcome::Delete);
        }
        let now = now_rfc3339();
        let subr = if sub == Sub::Status { "status" } else { "" };
        let managed = match managed_override {
            Some(m) => m,
            None => apply::record_update(
                &old.managed,
                Some(old_v),
                &new,
                manager,
                &ri.api_version(),
                subr,
                &now,
            ),
        };
        meta_mut(&mut new).insert("managedFields".into(), apply::render(&managed));
        Ok(Outcome::Put(new, managed))
    }

    /// `PUT` (replace). `404` if missing (these kinds do not allow create-on-update),
    /// `409 Conflict` on a stale `metadata.resourceVersion` (an empty one is unconditional).
    pub fn update(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        body: Value,
        sub: Sub,
        manager: &str,
    ) -> Result<WriteResult, ApiError> {
        let ri = &RESOURCES[res];
        self.store.write(res, ns, name, |old, _| {
            let old = old.ok_or_else(|| ApiError::not_found(ri, name))?;
            self.finish_update(res, old, body, sub, manager, None)
        })
    }

    /// `PATCH` with any patch type. Apply on a missing object creates it.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        ptype: PatchType,
        body: &[u8],
        sub: Sub,
        manager: Option<&str>,
        force: bool,
    ) -> Result<(WriteResult, bool), ApiError> {
        let ri = &RESOURCES[res];
        let parsed: Value = if ptype == PatchType::Apply {
            serde_yaml::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?
        };
        if ptype == PatchType::Apply {
            let Some(manager) = manager.filter(|m| !m.is_empty()) else {
                return Err(ApiError {
                    code: 422,
                    reason: "Invalid".into(),
                    message: "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
                    details: Some(json!({"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply patch", "field": "fieldManager"}]})),
                    retry_after: None,
                });
            };
            let mut cfg = parsed;
            if cfg
                .get("apiVersion")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .is_empty()
                || cfg
                    .get("kind")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .is_empty()
            {
                return Err(ApiError::bad_request("invalid object type: /, Kind="));
            }
            check_types(ri, &mut cfg)?;
            if ri.namespaced {
                self.ns_check(ri, ns)?;
            }
            let exists = self.store.get(res, ns, name).is_some();
            if !exists {
                // apply creates
                let now = now_rfc3339();
                let (mut merged, _) =
                    apply::apply(ri, name, None, &[], &cfg, manager, force, "", &now)?;
                meta_mut(&mut merged).insert("name".into(), json!(name));
                match self.create_with(res, ns, merged, manager, Some(&cfg)) {
                    Ok(s) => {
                        return Ok((
                            WriteResult {
                                stored: s,
                                etype: Some(super::store::EventType::Added),
                            },
                            true,
                        ));
                    }
                    Err(e) if e.reason == "AlreadyExists" => {} // raced: fall through to update
                    Err(e) => return Err(e),
                }
            }
            let subr = if sub == Sub::Status { "status" } else { "" };
            let r = self.store.write(res, ns, name, |old, _| {
                let old = old.ok_or_else(|| ApiError::not_found(ri, name))?;
                let now = now_rfc3339();
                let mut live = (*old.obj).clone();
                if let Some(m) = live.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                    m.remove("managedFields");
                }
                let (merged, managed) = apply::apply(
                    ri,
                    name,
                    Some(&live),
                    &old.managed,
                    &cfg,
                    manager,
                    force,
                    subr,
                    &now,
                )?;
                self.finish_update(res, old, merged, sub, manager, Some(managed))
            })?;
            return Ok((r, false));
        }
        let manager = manager.unwrap_or("");
        let r = self.store.write(res, ns, name, |old, _| {
            let old = old.ok_or_else(|| ApiError::not_found(ri, name))?;
            let mut doc = (*old.obj).clone();
            doc["apiVersion"] = json!(ri.api_version());
            doc["kind"] = json!(ri.kind);
            match ptype {
                PatchType::Merge => patch::merge(&mut doc, &parsed),
                PatchType::Strategic => {
                    patch::strategic(&mut doc, &parsed).map_err(|e| ApiError {
                        code: 422,
                        reason: "Invalid".into(),
                        message: e,
                        details: None,
                        retry_after: None,
                    })?
                }
                PatchType::Json => patch::json_patch(&mut doc, &parsed).map_err(|e| ApiError {
                    code: 422,
                    reason: "Invalid".into(),
                    message: format!(
                        "the server rejected our request due to an error in our request: {e}"
                    ),
                    details: None,
                    retry_after: None,
                })?,
                PatchType::Apply => unreachable!(),
            }
            if !doc.is_object() {
                return Err(ApiError::bad_request("patch produced a non-object"));
            }
            self.finish_update(res, old, doc, sub, manager, None)
        })?;
        Ok((r, false))
    }

    /// `DELETE`. Objects with finalizers get `deletionTimestamp` + `deletionGracePeriodSeconds: 0`
    /// and stay; an object already being deleted is returned unchanged; preconditions that do
    /// not match give `409 Conflict` as kube-apiserver's `rest.BeforeDelete` words it
    /// (`Operation cannot be fulfilled on <Kind>[.<group>] "<name>": the UID in the precondition ...`).
    pub fn delete(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        pre: &DeletePreconditions,
    ) -> Result<Deleted, ApiError> {
        let ri = &RESOURCES[res];
        let mut pending = true;
        let r = self.store.write(res, ns, name, |old, _| {
            let old = old.ok_or_else(|| ApiError::not_found(ri, name))?;
            if let Some(uid) = &pre.uid {
                let cur = meta_str(&old.obj, "uid");
                if cur != uid {
                    return Err(ApiError::precondition_conflict(
                        ri,
                        name,
                        &format!("the UID in the precondition ({uid}) does not match the UID in record ({cur}). The object might have been deleted and then recreated"),
                    ));
                }
            }
            if let Some(rv) = &pre.resource_version {
                if rv.parse::<u64>().ok() != Some(old.rv) {
                    return Err(ApiError::precondition_conflict(
                        ri,
                        name,
                        &format!(
                            "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
                            old.rv
                        ),
                    ));
                }
            }
            if meta(&old.obj).contains_key("deletionTimestamp") {
                return Ok(Outcome::Unchanged);
            }
            if finalizers(&old.obj).is_empty() {
                pending = false;
                return Ok(Outcome::Delete);
            }
            let mut v = (*old.obj).clone();
            let m = meta_mut(&mut v);
            m.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            Ok(Outcome::Put(v, (*old.managed).clone()))
        })?;
        Ok(if pending {
            Deleted::Pending(r.stored)
        } else {
            Deleted::Gone(r.stored)
        })
    }

    /// Internal write used by the controller emulation: read-modify-write `f` on the live
    /// object through the same update path (validation, ownership, finalizer deletion),
    /// without counting as an API request. `f` returns `false` for "no change".
    pub fn modify(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        sub: Sub,
        manager: &str,
        f: impl FnOnce(&mut Value) -> bool,
    ) -> Result<Option<WriteResult>, ApiError> {
        let mut changed = true;
        let r = self.store.write(res, ns, name, |old, _| {
            let old = old.ok_or_else(|| ApiError::not_found(&RESOURCES[res], name))?;
            let mut v = (*old.obj).clone();
            if !f(&mut v) {
                changed = false;
                return Ok(Outcome::Unchanged);
            }
            self.finish_update(res, old, v, sub, manager, None)
        })?;
        Ok(if changed { Some(r) } else { None })
    }
}
