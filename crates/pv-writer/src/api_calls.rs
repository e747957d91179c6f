//! The Kubernetes API calls pv-writer makes, for the RBAC check of the deploy
//! manifests (see [`api_types::api_calls`]).

use api_types::api_calls::{ApiCall, EVENT_CALLS, LEASE_CALLS};

/// Every call pv-writer makes:
/// * `persistentvolumes`: `create` (the queued PV) and `get` (on `AlreadyExists`,
///   to compare the existing PV's `claimRef.uid` with the entry's claim);
/// * `persistentvolumeclaims`: `get` (before each create, the entry's claim
///   must still exist with the entry's uid);
/// * events (`ProvisioningSucceeded`, `ProvisioningFailed`) through the recorder;
/// * its own Lease for leader election.
pub const API_CALLS: &[ApiCall] = &[
    ApiCall {
        group: "",
        resource: "persistentvolumes",
        verbs: &["get", "create"],
        namespaced: false,
    },
    ApiCall {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get"],
        namespaced: false,
    },
    EVENT_CALLS,
    LEASE_CALLS,
];
