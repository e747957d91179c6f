//! Error kinds a backend returns. The seed distinguishes an `IgnoredError`
//! ("not mine, let another provisioner handle it") from a real failure; so do we.

use crate::ProvisioningState;

/// Failure of [`Provisioner::provision`](crate::Provisioner::provision).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvisionError {
    /// The backend declines this claim (seed `IgnoredError`): no event, no retry.
    #[error("provisioning ignored: {reason}")]
    Ignored {
        /// Why the backend declined, for the log.
        reason: String,
    },
    /// The backend tried and failed. `state` says whether an asset may still be
    /// in the making ([`ProvisioningState::InBackground`]), whether the node must
    /// be re-selected ([`ProvisioningState::Reschedule`]), and so on.
    #[error("{reason}")]
    Failed {
        /// Where provisioning stands after the failure.
        state: ProvisioningState,
        /// Human-readable reason; becomes the `ProvisioningFailed` event message.
        reason: String,
    },
}

impl ProvisionError {
    /// A final failure ([`ProvisioningState::Finished`]) with `reason`.
    pub fn finished(reason: impl Into<String>) -> Self {
        ProvisionError::Failed {
            state: ProvisioningState::Finished,
            reason: reason.into(),
        }
    }
}

/// Failure of [`Provisioner::delete`](crate::Provisioner::delete).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeleteError {
    /// The backend declines this volume (seed `IgnoredError`): nothing is done.
    #[error("deletion ignored: {reason}")]
    Ignored {
        /// Why the backend declined, for the log.
        reason: String,
    },
    /// Deletion failed; retried with backoff up to the failed-delete threshold.
    #[error("{reason}")]
    Failed {
        /// Human-readable reason; becomes the `VolumeFailedDelete` event message.
        reason: String,
    },
    /// Deletion was refused because acting would be unsafe (e.g. a path outside
    /// the backend's base directory). Reported like `Failed`, never forced.
    #[error("deletion refused: {reason}")]
    Refused {
        /// What made the deletion unsafe.
        reason: String,
    },
}

/// Failure of the volume checks, listings and expansion ([`validate_volume`](crate::Provisioner::validate_volume),
/// [`list_volumes`](crate::Provisioner::list_volumes), [`expand`](crate::Provisioner::expand)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// The PV is not one this backend could have made; the reason names the check.
    #[error("{0}")]
    NotOurs(String),
    /// The backend's volumes or records cannot be read; the reason names the cause.
    #[error("{0}")]
    Unreadable(String),
    /// The volume cannot take the change (e.g. no room to grow); the reason says why.
    #[error("{0}")]
    Refused(String),
}
