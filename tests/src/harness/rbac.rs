//! The deploy's RBAC, for real: `deploy/base` rendered with `kubectl kustomize`,
//! its ServiceAccounts, ClusterRoles, ClusterRoleBindings, Roles and
//! RoleBindings created on a real API server (which enforces them), and the
//! checks run after a real-plane scenario:
//!
//! * no service log line reports a `403`/`Forbidden` ([`forbidden_lines`]);
//! * every call a service's identity made, as the API server's audit log
//!   records it, is declared in that service's `api_calls::API_CALLS`
//!   ([`check_audit`]); a declared call never made is only reported.
//!
//! Hand-written rather than `kubectl apply -k`: the harness must create exactly
//! the RBAC objects (not the Deployments, which would need a kubelet and an
//! image) and read the `PROVISIONER_NAME` the Lease Roles' `resourceNames` are
//! written for.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use api_types::api_calls::ApiCall;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::Value;

use super::binaries::{target_dir, workspace_root};
use super::services::Service;
use crate::realkube::AuditRecord;

/// Kinds of the rendered stream the harness creates, in creation order.
pub const RBAC_KINDS: [&str; 6] = [
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// What the rendered `deploy/base` says the services run as.
#[derive(Debug, Clone)]
pub struct DeployRbac {
    /// Each service's namespace (its ServiceAccount's; its Lease Role and Lease live
    /// there too): `split-provisioner` for pv-writer, `split-provisioner-volumes` for
    /// provision-svc and reclaim-svc (see deploy/README.md, "Pod Security").
    pub namespaces: BTreeMap<Service, String>,
    /// `PROVISIONER_NAME` of the shared ConfigMap (the Lease Roles' `resourceNames` follow it).
    pub provisioner_name: String,
    /// Every rendered RBAC object (kinds in [`RBAC_KINDS`]) as JSON, in stream order.
    pub objects: Vec<Value>,
}

impl DeployRbac {
    /// Render `deploy/base` with `kubectl kustomize` and keep the RBAC objects.
    ///
    /// Errors: kubectl missing or failing, a document that is not YAML, no
    /// `PROVISIONER_NAME` in a ConfigMap, or no ServiceAccount per service.
    pub fn render() -> anyhow::Result<Self> {
        let dir = workspace_root().join("deploy/base");
        let out = std::process::Command::new("kubectl")
            .arg("kustomize")
            .arg(&dir)
            .output()
            .context("running kubectl kustomize (is kubectl installed?)")?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Self::parse(&String::from_utf8(out.stdout)?)
    }

    /// Parse a rendered YAML stream (see [`DeployRbac::render`]).
    ///
    /// Errors: as [`DeployRbac::render`].
    pub fn parse(yaml: &str) -> anyhow::Result<Self> {
        use serde::Deserialize;
        let mut objects = Vec::new();
        let mut namespaces = BTreeMap::new();
        let mut provisioner_name = None;
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let v = Value::deserialize(doc).context("a rendered document is not YAML")?;
            let kind = v["kind"].as_str().unwrap_or_default();
            if kind == "ConfigMap" {
                if let Some(p) = v["data"]["PROVISIONER_NAME"].as_str() {
                    provisioner_name = Some(p.to_string());
                }
            }
            if kind == "ServiceAccount" {
                let name = v["metadata"]["name"].as_str().unwrap_or_default();
                if let (Some(s), Some(ns)) = (
                    Service::ALL.into_iter().find(|s| s.binary_name() == name),
                    v["metadata"]["namespace"].as_str(),
                ) {
                    namespaces.insert(s, ns.to_string());
                }
            }
            if RBAC_KINDS.contains(&kind) {
                objects.push(v);
            }
        }
        let rbac = Self {
            namespaces,
            provisioner_name: provisioner_name
                .context("no PROVISIONER_NAME in the rendered deploy's ConfigMaps")?,
            objects,
        };
        for s in Service::ALL {
            anyhow::ensure!(
                rbac.service_account(s).is_some() && rbac.namespaces.contains_key(&s),
                "the rendered deploy has no ServiceAccount {} with a namespace",
                s.binary_name()
            );
        }
        Ok(rbac)
    }

    /// The ServiceAccount object of `service` (named after its binary).
    pub fn service_account(&self, service: Service) -> Option<&Value> {
        self.objects.iter().find(|o| {
            o["kind"] == "ServiceAccount" && o["metadata"]["name"] == service.binary_name()
        })
    }

    /// Namespace of `service` (its ServiceAccount, Lease Role and Lease).
    pub fn namespace(&self, service: Service) -> &str {
        self.namespaces
            .get(&service)
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// The API-server user name of `service`'s ServiceAccount:
    /// `system:serviceaccount:<namespace>:<binary>`.
    pub fn user(&self, service: Service) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace(service),
            service.binary_name()
        )
    }

    /// Create every RBAC object on the API server behind `admin` (creation
    /// order of [`RBAC_KINDS`]); an object that already exists is left as is.
    ///
    /// Errors: the API rejects an object.
    pub async fn apply(&self, admin: &kube::Client) -> anyhow::Result<()> {
        for kind in RBAC_KINDS {
            for o in self.objects.iter().filter(|o| o["kind"] == kind) {
                let (group, version) =
                    match o["apiVersion"].as_str().unwrap_or("v1").split_once('/') {
                        Some((g, v)) => (g.to_string(), v.to_string()),
                        None => (
                            String::new(),
                            o["apiVersion"].as_str().unwrap_or("v1").to_string(),
                        ),
                    };
                // Every kind here pluralises regularly (namespaces, roles, ...).
                let plural = format!("{}s", kind.to_ascii_lowercase());
                let ar = ApiResource {
                    group: group.clone(),
                    version: version.clone(),
                    api_version: o["apiVersion"].as_str().unwrap_or("v1").to_string(),
                    kind: kind.to_string(),
                    plural,
                };
                let obj: DynamicObject = serde_json::from_value(o.clone())?;
                let api: Api<DynamicObject> = match o["metadata"]["namespace"].as_str() {
                    Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
                    None => Api::all_with(admin.clone(), &ar),
                };
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => {
                        return Err(anyhow::Error::from(e).context(format!(
                            "creating {kind} {}",
                            o["metadata"]["name"].as_str().unwrap_or_default()
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Every `(apiGroup, resource, verb)` the deploy grants `service` through
    /// the (Cluster)RoleBindings naming its ServiceAccount.
    pub fn granted(&self, service: Service) -> BTreeSet<(String, String, String)> {
        let sa = service.binary_name();
        let mut roles = BTreeSet::new();
        for b in self
            .objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
        {
            let subjects = b["subjects"].as_array().cloned().unwrap_or_default();
            if subjects
                .iter()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa)
            {
                roles.insert((
                    b["roleRef"]["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    b["roleRef"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ));
            }
        }
        let mut out = BTreeSet::new();
        for r in self.objects.iter().filter(|o| {
            roles.contains(&(
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ))
        }) {
            for rule in r["rules"].as_array().cloned().unwrap_or_default() {
                let strs = |k: &str| -> Vec<String> {
                    rule[k]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|s| s.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                for g in strs("apiGroups") {
                    for res in strs("resources") {
                        for v in strs("verbs") {
                            out.insert((g.clone(), res.clone(), v));
                        }
                    }
                }
            }
        }
        out
    }
}

/// Lines of `log` that report a refused API call (`Forbidden`, `forbidden`,
/// or a status `code: 403` as kube's `ErrorResponse` prints it).
pub fn forbidden_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains("Forbidden")
                || l.contains("forbidden")
                || l.contains("code: 403")
                || l.contains("\"code\":403")
        })
        .map(str::to_string)
        .collect()
}

/// One API call as the audit log shows it: `(apiGroup, resource[/subresource], verb)`.
pub type Call = (String, String, String);

/// The calls `user` made according to `records`, with the namespace of each.
pub fn calls_of(records: &[AuditRecord], user: &str) -> BTreeMap<Call, BTreeSet<Option<String>>> {
    let mut out: BTreeMap<Call, BTreeSet<Option<String>>> = BTreeMap::new();
    // Non-resource requests (`/api`, `/version`: discovery, which every
    // authenticated user may do) name no resource and need no RBAC rule.
    for r in records
        .iter()
        .filter(|r| r.user == user && !r.resource.is_empty())
    {
        let resource = match &r.subresource {
            Some(sub) => format!("{}/{sub}", r.resource),
            None => r.resource.clone(),
        };
        out.entry((r.api_group.clone(), resource, r.verb.clone()))
            .or_default()
            .insert(r.namespace.clone());
    }
    out
}

/// Whether the refused request `records[idx]` (a 403) was transient: the same
/// user made the same call (verb, group, resource, subresource, namespace,
/// name) later and it was not refused. A restarted v1.19 kube-apiserver
/// answers `/readyz` before its RBAC authorizer has synced and refuses, for a
/// moment, calls that RBAC allows; a grant that really is missing is refused
/// every time.
pub fn is_transient_403(records: &[AuditRecord], idx: usize) -> bool {
    let r = &records[idx];
    records[idx + 1..].iter().any(|later| {
        later.user == r.user
            && later.verb == r.verb
            && later.api_group == r.api_group
            && later.resource == r.resource
            && later.subresource == r.subresource
            && later.namespace == r.namespace
            && later.name == r.name
            && later.code.is_some_and(|c| c != 403)
    })
}

/// The call a kube "forbidden" message names: `(user, verb, resource, group,
/// namespace)` from `User "<user>" cannot <verb> resource "<resource>" in API
/// group "<group>"[ in the namespace "<ns>"]`; `None` for any other line.
pub fn forbidden_call(line: &str) -> Option<(String, String, String, String, Option<String>)> {
    fn quoted_after<'a>(s: &'a str, key: &str) -> Option<(&'a str, &'a str)> {
        let rest = &s[s.find(key)? + key.len()..];
        let end = rest.find('"')?;
        Some((&rest[..end], &rest[end + 1..]))
    }
    let (user, rest) = quoted_after(line, "User \"").or_else(|| quoted_after(line, "User \\\""))?;
    let rest = rest.trim_start_matches('\\');
    let rest = rest.strip_prefix(" cannot ")?;
    let (verb, rest) = rest.split_once(' ')?;
    let (resource, rest) = quoted_after(rest, "resource \"")?;
    let (group, rest) = quoted_after(rest, "API group \"")?;
    let namespace = quoted_after(rest, "the namespace \"").map(|(ns, _)| ns.to_string());
    Some((
        user.to_string(),
        verb.to_string(),
        resource.to_string(),
        group.to_string(),
        namespace,
    ))
}

/// Whether a service log line reporting a refused call names a call that the
/// audit log shows refused only transiently ([`is_transient_403`]) — the
/// API-server restart window — and never refused for good.
pub fn is_transient_forbidden_line(line: &str, records: &[AuditRecord]) -> bool {
    let Some((user, verb, resource, group, namespace)) = forbidden_call(line) else {
        return false;
    };
    let mut refused = records.iter().enumerate().filter(|(_, r)| {
        r.code == Some(403)
            && r.user == user
            && r.verb == verb
            && r.resource == resource
            && r.api_group == group
            && r.namespace == namespace
    });
    let mut any = false;
    let all_transient = refused.all(|(i, _)| {
        any = true;
        is_transient_403(records, i)
    });
    any && all_transient
}

/// Check what `service` really did (`records`, filtered to its identity in
/// `rbac`) against its declaration `declared` (`api_calls::API_CALLS`): every
/// call made must be declared, a namespaced declaration only in the service's
/// namespace, and no request may have been refused (403) — except transiently,
/// while a restarted API server's RBAC authorizer syncs ([`is_transient_403`]). Returns the calls
/// made, for [`record_exercised`].
///
/// Errors: one line per undeclared or refused call.
pub fn check_audit(
    rbac: &DeployRbac,
    service: Service,
    declared: &[ApiCall],
    records: &[AuditRecord],
) -> Result<BTreeSet<Call>, String> {
    let user = rbac.user(service);
    let mut problems = Vec::new();
    for (_, r) in records
        .iter()
        .enumerate()
        .filter(|(i, r)| r.user == user && r.code == Some(403) && !is_transient_403(records, *i))
    {
        problems.push(format!(
            "{}: {} {}/{} {:?} in {:?} was refused (403)",
            service.binary_name(),
            r.verb,
            r.api_group,
            r.resource,
            r.name,
            r.namespace
        ));
    }
    let made = calls_of(records, &user);
    for ((group, resource, verb), namespaces) in &made {
        let decl = declared.iter().find(|d| {
            d.group == group && d.resource == resource && d.verbs.contains(&verb.as_str())
        });
        match decl {
            None => problems.push(format!(
                "{}: made {verb} on {group}/{resource} (namespaces {namespaces:?}), which its api_calls::API_CALLS does not declare",
                service.binary_name()
            )),
            Some(d) if d.namespaced && namespaces.iter().any(|n| n.as_deref() != Some(rbac.namespace(service))) => {
                problems.push(format!(
                    "{}: {verb} on {group}/{resource} is declared namespaced but was made in {namespaces:?}",
                    service.binary_name()
                ))
            }
            Some(_) => {}
        }
    }
    if problems.is_empty() {
        Ok(made.into_keys().collect())
    } else {
        Err(problems.join("\n"))
    }
}

/// `service`'s declaration of the calls it makes (`<crate>::api_calls::API_CALLS`).
pub fn declared(service: Service) -> &'static [ApiCall] {
    match service {
        Service::Provision => provision_svc::api_calls::API_CALLS,
        Service::PvWriter => pv_writer::api_calls::API_CALLS,
        Service::Reclaim => reclaim_svc::api_calls::API_CALLS,
    }
}

/// File where real-plane scenarios record the calls each identity exercised:
/// `<target>/realkube-rbac/exercised.tsv`, one `service\tgroup\tresource\tverb` a line.
pub fn exercised_file() -> PathBuf {
    target_dir().join("realkube-rbac").join("exercised.tsv")
}

/// Append `calls` of `service` to [`exercised_file`] (best effort: a write
/// failure only loses the report) and return the granted calls of `service`
/// that no scenario recorded so far.
pub fn record_exercised(
    rbac: &DeployRbac,
    service: Service,
    calls: &BTreeSet<Call>,
) -> BTreeSet<Call> {
    let file = exercised_file();
    let _ = append_lines(
        &file,
        calls
            .iter()
            .map(|(g, r, v)| format!("{}\t{g}\t{r}\t{v}", service.binary_name())),
    );
    let seen: BTreeSet<Call> = std::fs::read_to_string(&file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() == 4 && f[0] == service.binary_name())
                .then(|| (f[1].to_string(), f[2].to_string(), f[3].to_string()))
        })
        .collect();
    rbac.granted(service)
        .into_iter()
        .filter(|c| !seen.contains(c))
        .collect()
}

fn append_lines(file: &Path, lines: impl Iterator<Item = String>) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    let text: String = lines.map(|l| l + "\n").collect();
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: sp}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: split-provisioner-config-abc, namespace: sp}
data: {PROVISIONER_NAME: example.com/hostpath}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: provision-svc, namespace: sp-volumes}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: pv-writer, namespace: sp}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: reclaim-svc, namespace: sp}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pv}
rules:
  - {apiGroups: [""], resources: [persistentvolumes], verbs: [create, get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: pv}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pv}
subjects: [{kind: ServiceAccount, name: pv-writer, namespace: sp}]
"#;

    fn record(user: &str, verb: &str, resource: &str, code: u16) -> AuditRecord {
        AuditRecord {
            user: user.into(),
            verb: verb.into(),
            api_group: String::new(),
            resource: resource.into(),
            subresource: None,
            namespace: None,
            name: None,
            code: Some(code),
            request_uri: format!("/api/v1/{resource}"),
        }
    }

    #[test]
    fn a_403_later_answered_is_transient_one_never_answered_is_not() {
        let u = "system:serviceaccount:ns:pv-writer";
        let records = vec![
            record(u, "get", "leases", 403),
            record(u, "get", "leases", 404),
            record(u, "get", "persistentvolumes", 403),
            record(u, "list", "persistentvolumes", 200),
        ];
        assert!(is_transient_403(&records, 0), "a later get answered");
        assert!(
            !is_transient_403(&records, 2),
            "only a list was answered later"
        );
    }

    #[test]
    fn forbidden_log_lines_name_their_call() {
        let line = r#"WARN cannot prepare leader election error=ApiError: leases.coordination.k8s.io "l" is forbidden: User "system:serviceaccount:ns:pv-writer" cannot get resource "leases" in API group "coordination.k8s.io" in the namespace "ns": Forbidden"#;
        assert_eq!(
            forbidden_call(line),
            Some((
                "system:serviceaccount:ns:pv-writer".into(),
                "get".into(),
                "leases".into(),
                "coordination.k8s.io".into(),
                Some("ns".into())
            ))
        );
        let u = "system:serviceaccount:ns:pv-writer";
        let lease = |code| AuditRecord {
            api_group: "coordination.k8s.io".into(),
            namespace: Some("ns".into()),
            ..record(u, "get", "leases", code)
        };
        assert!(is_transient_forbidden_line(line, &[lease(403), lease(200)]));
        assert!(!is_transient_forbidden_line(
            line,
            &[lease(200), lease(403)]
        ));
        assert!(
            !is_transient_forbidden_line(line, &[]),
            "no audit record: not excused"
        );
        assert!(!is_transient_forbidden_line(
            "Forbidden",
            &[lease(403), lease(200)]
        ));
    }

    const DECLARED: &[ApiCall] = &[ApiCall {
        group: "",
        resource: "persistentvolumes",
        verbs: &["create", "get"],
        namespaced: false,
    }];

    #[test]
    fn parses_namespace_provisioner_and_grants() {
        let r = DeployRbac::parse(STREAM).unwrap();
        assert_eq!(r.namespace(Service::PvWriter), "sp");
        assert_eq!(r.namespace(Service::Provision), "sp-volumes");
        assert_eq!(
            r.user(Service::Provision),
            "system:serviceaccount:sp-volumes:provision-svc"
        );
        assert_eq!(r.provisioner_name, "example.com/hostpath");
        assert_eq!(r.objects.len(), 6, "Namespace, 3 SAs, ClusterRole, binding");
        assert_eq!(
            r.user(Service::PvWriter),
            "system:serviceaccount:sp:pv-writer"
        );
        let g = r.granted(Service::PvWriter);
        assert!(g.contains(&("".into(), "persistentvolumes".into(), "create".into())));
        assert_eq!(g.len(), 2);
        assert!(r.granted(Service::Reclaim).is_empty());
    }

    #[test]
    fn an_undeclared_or_refused_call_fails_the_audit_check() {
        let r = DeployRbac::parse(STREAM).unwrap();
        let user = r.user(Service::PvWriter);
        let ok = vec![record(&user, "create", "persistentvolumes", 201)];
        assert_eq!(
            check_audit(&r, Service::PvWriter, DECLARED, &ok)
                .unwrap()
                .len(),
            1
        );
        let undeclared = vec![record(&user, "delete", "persistentvolumes", 200)];
        let e = check_audit(&r, Service::PvWriter, DECLARED, &undeclared).unwrap_err();
        assert!(e.contains("delete on /persistentvolumes"), "{e}");
        let refused = vec![record(&user, "get", "persistentvolumes", 403)];
        let e = check_audit(&r, Service::PvWriter, DECLARED, &refused).unwrap_err();
        assert!(e.contains("refused (403)"), "{e}");
        // Other identities' calls are not this service's.
        let other = vec![record("admin", "delete", "nodes", 200)];
        assert!(check_audit(&r, Service::PvWriter, DECLARED, &other)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn forbidden_log_lines_are_found() {
        let log = "ok line\nERROR persistentvolumes is forbidden: User cannot create\nfine";
        assert_eq!(forbidden_lines(log).len(), 1);
        assert!(forbidden_lines("all good\n").is_empty());
    }
}
