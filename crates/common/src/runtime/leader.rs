//! Leader election on a `coordination.k8s.io/v1` Lease: acquisition, renewal
//! and release by [`kube_lease_manager`], plus client-go's renew deadline
//! ([`LeaderElector::hold`]: the lead is lost when another holder appears, the
//! Lease is gone, or our `renewTime` has not advanced for a renew deadline).
//! Guarantees and limits (wall-clock expiry, unfenced patches):
//! docs/decisions/0003-leader-election-and-the-frame.md.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::runtime::api_reachability::log_failure;

/// Path of the namespace file of the pod's service account.
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The Lease namespace, as the seed's `getInClusterNamespace` picks it, after an
/// explicit flag: `flag`, else `POD_NAMESPACE` (`pod_namespace`), else the
/// trimmed contents of `sa_file`, else `default`. Empty values are skipped.
pub fn discover_namespace(
    flag: Option<&str>,
    pod_namespace: Option<&str>,
    sa_file: &Path,
) -> String {
    let from_file = std::fs::read_to_string(sa_file).ok();
    let found = [flag, pod_namespace, from_file.as_deref()]
        .into_iter()
        .find_map(non_empty);
    found.unwrap_or_else(|| "default".to_string())
}

/// This replica's identity: `flag`, else `POD_NAME`, else the host name; with a
/// random suffix when derived, so a restarted pod never reuses a stale holder.
pub fn identity(flag: Option<&str>) -> String {
    if let Some(id) = flag.filter(|s| !s.is_empty()) {
        return id.to_string();
    }
    let pod = std::env::var("POD_NAME").ok();
    let host = std::fs::read_to_string("/etc/hostname").ok();
    let base = non_empty(pod.as_deref()).or(non_empty(host.as_deref()));
    let base = base.unwrap_or_else(|| "provisioner".to_string());
    format!("{base}_{}", uuid::Uuid::new_v4().simple())
}

/// `s` trimmed, unless that is empty.
fn non_empty(s: Option<&str>) -> Option<String> {
    let t = s?.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// Timing of the election, client-go's names and defaults (15s / 10s / 2s).
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    /// How long the Lease stays valid after a renewal.
    pub lease_duration: Duration,
    /// How long renewals may fail before the leader gives up.
    pub renew_deadline: Duration,
    /// How often to try to acquire, renew and check the Lease.
    pub retry_period: Duration,
}

impl LeaseTiming {
    /// Validate client-go's constraints: duration > deadline > retry period > 0.
    /// Errors: a message naming the flags of the violated constraint.
    pub fn validate(&self) -> Result<(), String> {
        if self.retry_period.is_zero() {
            return Err("--leader-election-retry-period must be positive".into());
        }
        if self.renew_deadline <= self.retry_period {
            return Err("--leader-election-renew-deadline must be greater than --leader-election-retry-period".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return Err("--leader-election-lease-duration must be greater than --leader-election-renew-deadline".into());
        }
        Ok(())
    }

    /// kube-lease-manager's `(duration, grace)` in whole seconds: the holder
    /// renews `grace` seconds before expiry, so grace = duration − retry period
    /// makes it renew about once per retry period, as client-go does.
    pub fn manager_params(&self) -> (u64, u64) {
        let duration = self.lease_duration.as_secs().max(2);
        let retry = self.retry_period.as_secs().max(1);
        (
            duration,
            duration.saturating_sub(retry).max(1).min(duration - 1),
        )
    }
}

/// Why [`LeaderElector::hold`] returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeadLost {
    /// Another replica holds the Lease now.
    #[error("lease taken over by {0}")]
    OtherHolder(String),
    /// Our renewals did not land within the renew deadline.
    #[error("lease not renewed within the renew deadline")]
    RenewDeadlineExceeded,
    /// The Lease object disappeared.
    #[error("lease deleted")]
    LeaseDeleted,
}

/// One candidate in one Lease's election.
pub struct LeaderElector {
    manager: LeaseManager,
    leases: Api<Lease>,
    lease_name: String,
    identity: String,
    timing: LeaseTiming,
    /// Called each time the watchdog sees our own `renewTime` advance.
    on_renewed: Option<Box<dyn Fn() + Send + Sync>>,
}

impl LeaderElector {
    /// Prepare to compete for `namespace/lease_name` as `identity` with `timing` (checked by
    /// [`LeaseTiming::validate`]). Creates the Lease if it does not exist.
    /// Errors: the Lease cannot be read or created (API down, RBAC).
    pub async fn new(
        client: Client,
        namespace: &str,
        lease_name: &str,
        identity: &str,
        timing: LeaseTiming,
    ) -> anyhow::Result<Self> {
        let (duration, grace) = timing.manager_params();
        let manager = LeaseManagerBuilder::new(client.clone(), lease_name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(duration)
            .with_grace(grace)
            .build()
            .await?;
        Ok(Self {
            manager,
            leases: Api::namespaced(client, namespace),
            lease_name: lease_name.to_string(),
            identity: identity.to_string(),
            timing,
            on_renewed: None,
        })
    }

    /// Call `f` each time [`hold`](Self::hold)'s watchdog confirms a renewal
    /// of ours on the Lease (feeds `/healthz`: [`crate::runtime::health::Liveness::renewed`]).
    pub fn on_renewed(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_renewed = Some(Box::new(f));
        self
    }

    /// Wait until this candidate holds the Lease (`true`), or `cancel` fires (`false`).
    /// API errors are logged and retried every retry period.
    pub async fn acquire(&self, cancel: &CancellationToken) -> bool {
        let acquired = async { while !self.changed("lease acquisition attempt failed").await {} };
        cancel.run_until_cancelled(acquired).await.is_some()
    }

    /// The lease manager's next view of the lead (`true`: ours); an API error is logged as
    /// `failed` and retried after a retry period.
    async fn changed(&self, failed: &str) -> bool {
        loop {
            match self.manager.changed().await {
                Ok(leading) => return leading,
                Err(err) => {
                    log_failure(&self.lease_name, failed, &err);
                    tokio::time::sleep(self.timing.retry_period).await;
                }
            }
        }
    }

    /// While leading: keep renewing, and return as soon as the lead is lost.
    /// Never returns while the lead is intact.
    pub async fn hold(&self) -> LeadLost {
        let renew = async {
            while self.changed("lease renewal failed").await {}
            self.why_lost().await
        };
        tokio::select! {
            lost = renew => lost,
            lost = self.watchdog() => lost,
        }
    }

    /// Why `lease` (as read) ends our lead: gone, or held by another; `None` otherwise.
    fn lost(&self, lease: Option<&Lease>) -> Option<LeadLost> {
        let Some(lease) = lease else {
            return Some(LeadLost::LeaseDeleted);
        };
        let holder = lease.spec.as_ref()?.holder_identity.as_ref()?;
        (!holder.is_empty() && *holder != self.identity)
            .then(|| LeadLost::OtherHolder(holder.clone()))
    }

    /// Classify a loss the lease manager reported: a new holder, or none at all.
    async fn why_lost(&self) -> LeadLost {
        let read = self.leases.get_opt(&self.lease_name).await.ok();
        let lost = read.and_then(|lease| self.lost(lease.as_ref()));
        lost.unwrap_or(LeadLost::RenewDeadlineExceeded)
    }

    async fn watchdog(&self) -> LeadLost {
        let (mut last_renew_time, mut confirmed_at) = (None, Instant::now());
        loop {
            tokio::time::sleep(self.timing.retry_period).await;
            let read = tokio::time::timeout(
                self.timing.retry_period,
                self.leases.get_opt(&self.lease_name),
            )
            .await;
            match read.unwrap_or_else(|_| Err(kube::Error::Service("lease read timed out".into())))
            {
                Ok(lease) => {
                    if let Some(lost) = self.lost(lease.as_ref()) {
                        return lost;
                    }
                    let spec = lease.and_then(|l| l.spec).unwrap_or_default();
                    let ours = spec.holder_identity.as_ref() == Some(&self.identity);
                    if ours && spec.renew_time != last_renew_time {
                        last_renew_time = spec.renew_time;
                        confirmed_at = Instant::now();
                        self.on_renewed.iter().for_each(|f| f());
                    }
                }
                Err(err) => log_failure(&self.lease_name, "reading lease failed", &err),
            }
            if confirmed_at.elapsed() > self.timing.renew_deadline {
                return LeadLost::RenewDeadlineExceeded;
            }
        }
    }

    /// Give the Lease up so a standby takes over at once, waiting at most the
    /// renew deadline (then the Lease expires). Best effort: errors are logged.
    pub async fn release(&self) {
        let (lease, limit) = (&self.lease_name, self.timing.renew_deadline);
        match tokio::time::timeout(limit, self.manager.release()).await {
            Ok(Ok(())) => tracing::info!(lease = %lease, "lease released"),
            Ok(Err(err)) => tracing::warn!(lease = %lease, error = %err, "releasing lease failed"),
            Err(_) => {
                tracing::warn!(lease = %lease, ?limit, "releasing lease timed out; it expires instead")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_discovery_order() {
        let dir = tempfile::tempdir().unwrap();
        let sa = dir.path().join("namespace");
        let missing = dir.path().join("missing");
        std::fs::write(&sa, "from-sa\n").unwrap();
        assert_eq!(discover_namespace(Some("flag"), Some("pod"), &sa), "flag");
        assert_eq!(discover_namespace(None, Some("pod"), &sa), "pod");
        assert_eq!(discover_namespace(Some(""), Some(""), &sa), "from-sa");
        assert_eq!(discover_namespace(None, None, &missing), "default");
        std::fs::write(&sa, "  \n").unwrap();
        assert_eq!(discover_namespace(None, None, &sa), "default");
    }

    #[test]
    fn timing_defaults_are_valid_and_map_to_manager_params() {
        let t = LeaseTiming {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        assert_eq!(t.validate(), Ok(()));
        assert_eq!(t.manager_params(), (15, 13));
        let bad = LeaseTiming {
            renew_deadline: Duration::from_secs(20),
            ..t
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .contains("--leader-election-lease-duration must"));
    }

    #[test]
    fn identity_prefers_flag_and_is_unique_otherwise() {
        assert_eq!(identity(Some("me")), "me");
        assert_ne!(identity(None), identity(None));
    }
}
