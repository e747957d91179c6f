//! The backend contract of the provisioner services: everything a storage
//! backend implements or receives, in one crate that depends on no service.
//!
//! * [`provisioner`] — the [`Provisioner`] trait (seed `Provisioner`) and its
//!   optional capabilities (qualifier, deletion guard, block support, listing
//!   and archiving volumes, deleting by PV name, validating a queued PV);
//! * [`provisioning`] — what a backend is told ([`ProvisionOptions`]) and
//!   reports ([`ProvisioningState`]);
//! * [`errors`] — [`ProvisionError`], [`DeleteError`];
//! * [`deadline`] — the per-operation deadline a backend call sees (the seed's
//!   context timeout);
//! * [`claim`] — claim checks shared by filesystem backends;
//! * [`quantity`] — Kubernetes resource quantities (`kube_quantity` plus the API server's rules);
//! * [`safe_fs`] — cap-std directory-handle-relative operations below a
//!   backend's root directory (hostpath's base dir, nfs-subdir's mount);
//! * `testing` (feature `testing`) — [`FakeProvisioner`](testing::FakeProvisioner),
//!   the one scriptable fake backend of the services' tests.

pub mod claim;
pub mod deadline;
pub mod errors;
pub mod provisioner;
pub mod provisioning;
pub mod quantity;
pub mod safe_fs;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use errors::{DeleteError, ProvisionError};
pub use provisioner::{OrphanOutcome, Provisioner};
pub use provisioning::{ProvisionOptions, ProvisioningState};
