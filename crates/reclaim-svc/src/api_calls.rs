//! The Kubernetes API calls reclaim-svc makes, for the deploy manifests' RBAC
//! check. Keep in step with the code: `controller` (reflector: list, watch),
//! `finalizer` (patch; get to re-read after a 409 Conflict), `operation`
//! (get to re-read a PV right before deleting its volume, delete; get of a
//! StorageClass for a backend that reads it at delete), `common::kube::events` (events) and `common::runtime::leader` (Lease).

use api_types::api_calls::{ApiCall, EVENT_CALLS, LEASE_CALLS};

/// Every API call of reclaim-svc.
pub const API_CALLS: &[ApiCall] = &[
    ApiCall {
        group: "",
        resource: "persistentvolumes",
        verbs: &["get", "list", "watch", "patch", "delete"],
        namespaced: false,
    },
    ApiCall {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["get"],
        namespaced: false,
    },
    EVENT_CALLS,
    LEASE_CALLS,
];
