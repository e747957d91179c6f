//! The backend contract of the provisioner services, depending on no service:
//! [`provisioner`] (the [`Provisioner`] trait and its optional capabilities),
//! [`provisioning`] (options and states), [`errors`], [`deadline`] (the
//! per-operation deadline), [`quantity`] (resource quantities) and, with
//! feature `testing`, the services' one fake backend.

pub mod deadline;
pub mod errors;
pub mod provisioner;
pub mod provisioning;
pub mod quantity;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use errors::{DeleteError, ProvisionError, VolumeError};
pub use provisioner::{OrphanOutcome, PoolCapacity, Provisioner};
pub use provisioning::{ProvisionOptions, ProvisioningState};
