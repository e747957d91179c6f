//! Declaration of the Kubernetes API calls a service makes, so the deploy
//! manifests' RBAC can be checked against the code (one list per service, kept
//! next to the code that makes the calls).

/// One resource a service touches and the verbs it uses on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    /// API group: `""` for core, e.g. `"storage.k8s.io"`.
    pub group: &'static str,
    /// Plural resource name, with `/subresource` when one is used (e.g. `"persistentvolumeclaims"`).
    pub resource: &'static str,
    /// RBAC verbs used: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
    pub verbs: &'static [&'static str],
    /// True when the call is confined to the service's own namespace (its Lease),
    /// so a namespaced Role grants it; false for cluster-wide calls (ClusterRole).
    pub namespaced: bool,
}

impl ApiCall {
    /// A cluster-wide call (ClusterRole) of `verbs` on `resource` in `group`.
    pub const fn cluster(
        group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
    ) -> Self {
        Self {
            group,
            resource,
            verbs,
            namespaced: false,
        }
    }
}

/// Lease calls every service makes for leader election (kube-lease-manager).
pub const LEASE_CALLS: ApiCall = ApiCall {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "update", "patch"],
    namespaced: true,
};

/// Event creation and series patches (events.k8s.io/v1, `common::kube::events`): in the
/// claim's namespace, and in `kube-system` for PersistentVolumes (cluster-wide grant).
pub const EVENT_CALLS: ApiCall = ApiCall::cluster("events.k8s.io", "events", &["create", "patch"]);
