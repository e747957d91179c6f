//! Plain data shared across the provisioner services.
//!
//! Nothing in this crate performs I/O. It holds the names the seed controller
//! (sig-storage-lib-external-provisioner v8) reads and writes on Kubernetes
//! objects, the [`ProvisioningState`] a backend reports, the
//! [`ProvisionOptions`] it receives, the error kinds it returns, and the
//! versioned schema of the records kept in Redis ([`queue::QueuedPvWrite`],
//! [`queue::ProvisionIntent`]).

pub mod annotations;
pub mod api_calls;
pub mod errors;
pub mod provisioning;
pub mod queue;

pub use annotations::*;
pub use errors::{DeleteError, ProvisionError};
pub use provisioning::{ProvisionOptions, ProvisioningState};
