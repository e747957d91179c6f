//! The resource kinds the simulator serves and the discovery documents describing them
//! (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`, `/version`), shaped like a
//! real kube-apiserver v1.33's legacy (non-aggregated) discovery.

use serde_json::{json, Value};

/// Static description of one served resource (one REST collection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceInfo {
    /// API group (`""` for core).
    pub group: &'static str,
    /// API version, e.g. `v1`.
    pub version: &'static str,
    /// Plural resource name used in URLs, e.g. `persistentvolumes`.
    pub plural: &'static str,
    /// Singular name, e.g. `persistentvolume`.
    pub singular: &'static str,
    /// Kind, e.g. `PersistentVolume`.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Whether the resource has a `/status` subresource (and its main endpoint ignores
    /// status changes, as the real server does for these kinds).
    pub status_subresource: bool,
    /// kubectl short names (only reported in discovery).
    pub short_names: &'static [&'static str],
}

impl ResourceInfo {
    /// `apiVersion` string: `v1` or `<group>/<version>`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Kind qualified with the group as the real server prints it in `Invalid` errors,
    /// e.g. `PersistentVolume` or `StorageClass.storage.k8s.io`.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// Resource qualified with the group, e.g. `persistentvolumes` or
    /// `storageclasses.storage.k8s.io` (the form used in `NotFound` messages).
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// All resources served, indexed by position (the store keeps one map per entry).
pub static RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "persistentvolumes",
        singular: "persistentvolume",
        kind: "PersistentVolume",
        namespaced: false,
        status_subresource: true,
        short_names: &["pv"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "persistentvolumeclaims",
        singular: "persistentvolumeclaim",
        kind: "PersistentVolumeClaim",
        namespaced: true,
        status_subresource: true,
        short_names: &["pvc"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        status_subresource: true,
        short_names: &["no"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        status_subresource: true,
        short_names: &["ns"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        short_names: &["ev"],
    },
    ResourceInfo {
        group: "storage.k8s.io",
        version: "v1",
        plural: "storageclasses",
        singular: "storageclass",
        kind: "StorageClass",
        namespaced: false,
        status_subresource: false,
        short_names: &["sc"],
    },
    ResourceInfo {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        status_subresource: false,
        short_names: &[],
    },
    ResourceInfo {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        short_names: &["ev"],
    },
];

/// Index of PersistentVolume in [`RESOURCES`].
pub const PV: usize = 0;
/// Index of PersistentVolumeClaim in [`RESOURCES`].
pub const PVC: usize = 1;
/// Index of Node in [`RESOURCES`].
pub const NODE: usize = 2;
/// Index of Namespace in [`RESOURCES`].
pub const NAMESPACE: usize = 3;
/// Index of core/v1 Event in [`RESOURCES`].
pub const CORE_EVENT: usize = 4;
/// Index of StorageClass in [`RESOURCES`].
pub const STORAGE_CLASS: usize = 5;
/// Index of Lease in [`RESOURCES`].
pub const LEASE: usize = 6;
/// Index of events.k8s.io/v1 Event in [`RESOURCES`].
pub const EVENTS_EVENT: usize = 7;

/// Find a resource by URL coordinates.
pub fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Find a resource by a test-facing name: `plural` (core group preferred, e.g. `events`
/// is core/v1 Event) or `plural.group` (e.g. `events.events.k8s.io`, `leases.coordination.k8s.io`).
pub fn by_name(name: &str) -> Option<usize> {
    let name = name.split('/').next().unwrap_or(name);
    RESOURCES
        .iter()
        .position(|r| r.plural == name || r.qualified_resource() == name)
}

/// `GET /version`.
pub fn version_doc() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `GET /api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn groups() -> Vec<&'static str> {
    let mut g: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !g.contains(&r.group) {
            g.push(r.group);
        }
    }
    g
}

fn group_doc(group: &str) -> Value {
    let gv = format!("{group}/v1");
    json!({
        "name": group,
        "versions": [{"groupVersion": gv, "version": "v1"}],
        "preferredVersion": {"groupVersion": gv, "version": "v1"}
    })
}

/// `GET /apis`.
pub fn group_list() -> Value {
    let groups: Vec<Value> = groups().into_iter().map(group_doc).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`, or `None` if the group is not served.
pub fn group(group: &str) -> Option<Value> {
    if groups().contains(&group) {
        let mut d = group_doc(group);
        d["kind"] = json!("APIGroup");
        d["apiVersion"] = json!("v1");
        Some(d)
    } else {
        None
    }
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`, or `None` if not served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut out = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut verbs = vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        if r.plural == "namespaces" {
            verbs.retain(|v| *v != "deletecollection");
        }
        out.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs,
            "shortNames": r.short_names,
        }));
        if r.status_subresource {
            out.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if out.is_empty() {
        return None;
    }
    for v in out.iter_mut() {
        if v["shortNames"].as_array().is_some_and(|a| a.is_empty()) {
            v.as_object_mut().unwrap().remove("shortNames");
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}),
    )
}
