//! Emulation of the parts of kube-controller-manager a storage provisioner depends on:
//! the PV controller (`pkg/controller/volume/persistentvolume`: storage-provisioner
//! annotations, binding, `Available`/`Released` phases) and the pvc-/pv-protection
//! controllers (removing `kubernetes.io/pvc-protection` / `kubernetes.io/pv-protection`).
//!
//! It runs as one background task that follows every change through the store's
//! broadcast channel (milliseconds of delay), and writes through the same registry
//! update path as API clients (so watchers see its writes; they are not counted as API
//! requests). It keeps a claim → volumes index so it never scans the whole store per event.

use super::registry::{finalizers, meta_str, Registry, Sub, PVC_PROTECTION, PV_PROTECTION};
use super::resources::{PV, PVC, STORAGE_CLASS};
use super::store::{EventType, WatchEvent};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

/// Annotation the PV controller sets on claims an external provisioner should provision.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Deprecated twin of [`ANN_STORAGE_PROVISIONER`], still set by the real controller.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Set by the scheduler for `WaitForFirstConsumer` claims.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set on a claim once binding completed.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set on the object whose binding field the controller (not the user) filled in.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

const MANAGER: &str = "kube-controller-manager";

/// Which parts of the controller emulation run. `Default` = all on.
#[derive(Debug, Clone)]
pub struct PvControllerConfig {
    /// Run the emulation at all.
    pub enabled: bool,
    /// Set `volume.kubernetes.io/storage-provisioner` (+ beta) on pending claims of classes
    /// with an external provisioner (`WaitForFirstConsumer`: once a node is selected).
    pub annotate_provisioner: bool,
    /// Bind volumes whose `spec.claimRef` names a pending claim (and claims whose
    /// `spec.volumeName` names a volume).
    pub bind: bool,
    /// Move new volumes without a claimRef from `Pending` to `Available`.
    pub set_available: bool,
    /// Move bound volumes to `Released` when their claim is gone (or was recreated).
    pub release: bool,
    /// Remove `kubernetes.io/pvc-protection` from deleting claims and
    /// `kubernetes.io/pv-protection` from deleting volumes that are not `Bound`.
    pub remove_protection_finalizers: bool,
}

impl Default for PvControllerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            annotate_provisioner: true,
            bind: true,
            set_available: true,
            release: true,
            remove_protection_finalizers: true,
        }
    }
}

struct Ctl {
    reg: Arc<Registry>,
    cfg: PvControllerConfig,
    pv_claim: HashMap<String, (String, String)>,
    claim_pvs: HashMap<(String, String), BTreeSet<String>>,
}

fn ann<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(k))
        .and_then(|x| x.as_str())
}

fn set_ann(v: &mut Value, k: &str, val: &str) {
    let m = v["metadata"].as_object_mut().unwrap();
    let a = m.entry("annotations").or_insert_with(|| json!({}));
    if !a.is_object() {
        *a = json!({});
    }
    a[k] = json!(val);
}

fn remove_finalizer(v: &mut Value, f: &str) -> bool {
    let fins = finalizers(v);
    if !fins.iter().any(|x| x == f) {
        return false;
    }
    let left: Vec<String> = fins.into_iter().filter(|x| x != f).collect();
    let m = v["metadata"].as_object_mut().unwrap();
    if left.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), json!(left));
    }
    true
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut c = v;
    for p in path {
        match c.get(p) {
            Some(x) => c = x,
            None => return "",
        }
    }
    c.as_str().unwrap_or("")
}

fn deleting(v: &Value) -> bool {
    v.get("metadata")
        .is_some_and(|m| m.get("deletionTimestamp").is_some())
}

/// Spawn the controller task; it stops when `shutdown` is cancelled.
pub fn spawn(
    reg: Arc<Registry>,
    cfg: PvControllerConfig,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (mut rx, _) = reg.store.subscribe();
        let mut ctl = Ctl {
            reg,
            cfg,
            pv_claim: HashMap::new(),
            claim_pvs: HashMap::new(),
        };
        ctl.resync();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = rx.recv() => match r {
                    Ok(ev) => ctl.handle(&ev),
                    Err(RecvError::Lagged(_)) => ctl.resync(),
                    Err(RecvError::Closed) => return,
                }
            }
        }
    })
}

impl Ctl {
    fn index_pv(&mut self, name: &str, pv: Option<&Value>) {
        if let Some(old) = self.pv_claim.remove(name) {
            if let Some(set) = self.claim_pvs.get_mut(&old) {
                set.remove(name);
                if set.is_empty() {
                    self.claim_pvs.remove(&old);
                }
            }
        }
        if let Some(pv) = pv {
            let ns = s(pv, &["spec", "claimRef", "namespace"]);
            let cn = s(pv, &["spec", "claimRef", "name"]);
            if !cn.is_empty() {
                let key = (ns.to_string(), cn.to_string());
                self.pv_claim.insert(name.to_string(), key.clone());
                self.claim_pvs
                    .entry(key)
                    .or_default()
                    .insert(name.to_string());
            }
        }
    }

    fn resync(&mut self) {
        let store = self.reg.store.clone();
        self.pv_claim.clear();
        self.claim_pvs.clear();
        let (pvs, _, _) = store.list(PV, None, None, &|_| true, None);
        for pv in &pvs {
            self.index_pv(meta_str(&pv.obj, "name"), Some(&pv.obj));
        }
        for pv in &pvs {
            self.sync_volume(meta_str(&pv.obj, "name"));
        }
        let (pvcs, _, _) = store.list(PVC, None, None, &|_| true, None);
        for c in &pvcs {
            self.sync_claim(meta_str(&c.obj, "namespace"), meta_str(&c.obj, "name"));
        }
    }

    fn handle(&mut self, ev: &WatchEvent) {
        match ev.res {
            PV => {
                if ev.etype == EventType::Deleted {
                    self.index_pv(&ev.name, None);
                } else {
                    self.index_pv(&ev.name, Some(&ev.obj));
                    self.sync_volume(&ev.name);
                }
            }
            PVC => {
                if ev.etype == EventType::Deleted {
                    let key = (ev.ns.clone(), ev.name.clone());
                    let pvs: Vec<String> = self
                        .claim_pvs
                        .get(&key)
                        .map(|s| s.iter().cloned().collect())
                        .unwrap_or_default();
                    for pv in pvs {
                        self.sync_volume(&pv);
                    }
                } else {
                    self.sync_claim(&ev.ns, &ev.name);
                }
            }
            STORAGE_CLASS if ev.etype != EventType::Deleted => {
                let (pvcs, _, _) = self.reg.store.list(
                    PVC,
                    None,
                    None,
                    &|o| s(o, &["spec", "volumeName"]).is_empty(),
                    None,
                );
                for c in &pvcs {
                    self.sync_claim(meta_str(&c.obj, "namespace"), meta_str(&c.obj, "name"));
                }
            }
            _ => {}
        }
    }

    fn modify(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        sub: Sub,
        f: impl FnOnce(&mut Value) -> bool,
    ) {
        if let Err(e) = self.reg.modify(res, ns, name, sub, MANAGER, f) {
            if e.code != 404 {
                tracing::warn!(name, error = %e.message, "pv controller emulation: write failed");
            }
        }
    }

    fn sync_claim(&mut self, ns: &str, name: &str) {
        let Some(c) = self.reg.store.get(PVC, ns, name) else {
            return;
        };
        let claim = c.obj.clone();
        if deleting(&claim) {
            if self.cfg.remove_protection_finalizers
                && finalizers(&claim).iter().any(|f| f == PVC_PROTECTION)
            {
                self.modify(PVC, ns, name, Sub::Main, |v| {
                    remove_finalizer(v, PVC_PROTECTION)
                });
            }
            return;
        }
        let volume_name = s(&claim, &["spec", "volumeName"]).to_string();
        if volume_name.is_empty() {
            // v1.19 sets only the beta annotation; 1.23+ both.
            let ga = self.reg.admission.kube_version >= crate::realkube::KubeVersion::V1_37;
            let annotated = if ga {
                ann(&claim, ANN_STORAGE_PROVISIONER)
            } else {
                ann(&claim, ANN_BETA_STORAGE_PROVISIONER)
            };
            if self.cfg.annotate_provisioner && annotated.is_none() {
                let class = s(&claim, &["spec", "storageClassName"]);
                if !class.is_empty() {
                    if let Some(sc) = self.reg.store.get(STORAGE_CLASS, "", class) {
                        let prov = s(&sc.obj, &["provisioner"]).to_string();
                        let wffc = s(&sc.obj, &["volumeBindingMode"]) == "WaitForFirstConsumer";
                        let ready = !wffc || ann(&claim, ANN_SELECTED_NODE).is_some();
                        // with a pre-bound volume waiting, the controller binds instead
                        let has_volume = self
                            .claim_pvs
                            .contains_key(&(ns.to_string(), name.to_string()));
                        if !prov.starts_with("kubernetes.io/") && ready && !has_volume {
                            self.modify(PVC, ns, name, Sub::Main, |v| {
                                if ga {
                                    set_ann(v, ANN_STORAGE_PROVISIONER, &prov);
                                }
                                set_ann(v, ANN_BETA_STORAGE_PROVISIONER, &prov);
                                true
                            });
                        }
                    }
                }
            }
            let pvs: Vec<String> = self
                .claim_pvs
                .get(&(ns.to_string(), name.to_string()))
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            for pv in pvs {
                self.sync_volume(&pv);
            }
        } else if s(&claim, &["status", "phase"]) != "Bound" && self.cfg.bind {
            if let Some(pv) = self.reg.store.get(PV, "", &volume_name) {
                let cr_uid = s(&pv.obj, &["spec", "claimRef", "uid"]);
                let cr_name = s(&pv.obj, &["spec", "claimRef", "name"]);
                let free = cr_name.is_empty();
                let mine = cr_name == name
                    && s(&pv.obj, &["spec", "claimRef", "namespace"]) == ns
                    && (cr_uid.is_empty() || cr_uid == meta_str(&claim, "uid"));
                if free || mine {
                    self.bind(&volume_name, ns, name);
                }
            }
        }
    }

    fn set_phase(&self, res: usize, ns: &str, name: &str, phase: &'static str) {
        self.modify(res, ns, name, Sub::Status, |v| {
            if s(v, &["status", "phase"]) == phase {
                return false;
            }
            v["status"]["phase"] = json!(phase);
            if res == PV {
                v["status"]["lastPhaseTransitionTime"] = json!(super::registry::now_rfc3339());
            }
            true
        });
    }

    fn sync_volume(&mut self, name: &str) {
        let Some(p) = self.reg.store.get(PV, "", name) else {
            return;
        };
        let pv = p.obj.clone();
        let phase = s(&pv, &["status", "phase"]).to_string();
        if deleting(&pv)
            && self.cfg.remove_protection_finalizers
            && phase != "Bound"
            && finalizers(&pv).iter().any(|f| f == PV_PROTECTION)
        {
            self.modify(PV, "", name, Sub::Main, |v| {
                remove_finalizer(v, PV_PROTECTION)
            });
        }
        let cr_name = s(&pv, &["spec", "claimRef", "name"]).to_string();
        if cr_name.is_empty() {
            if self.cfg.set_available && phase != "Available" && phase != "Failed" {
                self.set_phase(PV, "", name, "Available");
            }
            return;
        }
        let cr_ns = s(&pv, &["spec", "claimRef", "namespace"]).to_string();
        let cr_uid = s(&pv, &["spec", "claimRef", "uid"]).to_string();
        let claim = self.reg.store.get(PVC, &cr_ns, &cr_name);
        let claim_matches = claim
            .as_ref()
            .is_some_and(|c| cr_uid.is_empty() || meta_str(&c.obj, "uid") == cr_uid);
        if !claim_matches {
            if cr_uid.is_empty() {
                if self.cfg.set_available && phase != "Available" && phase != "Failed" {
                    self.set_phase(PV, "", name, "Available");
                }
            } else if self.cfg.release && phase != "Released" && phase != "Failed" {
                self.set_phase(PV, "", name, "Released");
            }
            return;
        }
        let claim = claim.unwrap();
        let cvn = s(&claim.obj, &["spec", "volumeName"]);
        if deleting(&claim.obj) {
            return;
        }
        if (cvn.is_empty() || cvn == name) && self.cfg.bind {
            self.bind(name, &cr_ns, &cr_name);
        } else if !cvn.is_empty() && cvn != name && self.cfg.set_available && phase == "Pending" {
            self.set_phase(PV, "", name, "Available");
        }
    }

    /// Bind volume `pv` and claim `ns/name` the way `syncVolume`/`bind` does: claimRef
    /// (bound-by-controller on the PV only if the controller set it), PV phase Bound,
    /// claim volumeName + bind-completed (+ bound-by-controller if the controller set
    /// volumeName), claim status Bound with capacity and access modes.
    fn bind(&self, pv: &str, ns: &str, name: &str) {
        let Some(claim) = self.reg.store.get(PVC, ns, name) else {
            return;
        };
        let claim_uid = meta_str(&claim.obj, "uid").to_string();
        let claim_rv = claim.rv.to_string();
        self.modify(PV, "", pv, Sub::Main, |v| {
            let had = !s(v, &["spec", "claimRef", "name"]).is_empty();
            if had && !s(v, &["spec", "claimRef", "uid"]).is_empty() {
                return false;
            }
            v["spec"]["claimRef"] = json!({
                "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": ns, "name": name,
                "uid": claim_uid, "resourceVersion": claim_rv,
            });
            if !had {
                set_ann(v, ANN_BOUND_BY_CONTROLLER, "yes");
            }
            true
        });
        self.set_phase(PV, "", pv, "Bound");
        let Some(pvs) = self.reg.store.get(PV, "", pv) else {
            return;
        };
        let pv_spec = pvs.obj["spec"].clone();
        self.modify(PVC, ns, name, Sub::Main, |v| {
            let cur = s(v, &["spec", "volumeName"]).to_string();
            let mut changed = false;
            if cur.is_empty() {
                v["spec"]["volumeName"] = json!(pv);
                set_ann(v, ANN_BOUND_BY_CONTROLLER, "yes");
                changed = true;
            }
            if ann(v, ANN_BIND_COMPLETED) != Some("yes") {
                set_ann(v, ANN_BIND_COMPLETED, "yes");
                changed = true;
            }
            changed
        });
        self.modify(PVC, ns, name, Sub::Status, |v| {
            let want_modes = pv_spec.get("accessModes").cloned().unwrap_or(json!([]));
            let want_cap = pv_spec.get("capacity").cloned().unwrap_or(json!({}));
            let st = &v["status"];
            if s(v, &["status", "phase"]) == "Bound"
                && st.get("accessModes") == Some(&want_modes)
                && st.get("capacity") == Some(&want_cap)
            {
                return false;
            }
            v["status"]["phase"] = json!("Bound");
            v["status"]["accessModes"] = want_modes;
            v["status"]["capacity"] = want_cap;
            true
        });
    }
}
