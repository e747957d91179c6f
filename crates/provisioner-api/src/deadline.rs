//! Per-operation deadlines, the seed's `context.WithTimeout` around one sync
//! (`--provision-timeout`, `--deletion-timeout`): [`within`] sets the task's
//! [`Deadline`], backends read it with [`current`]/[`cancelled`], and [`bound`]
//! abandons a call [`ABANDON_GRACE`] after it. Why a task-local:
//! docs/decisions/0007-operation-deadline-is-task-local.md.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

tokio::task_local! {
    static CURRENT: Deadline;
}

/// How long a call wrapped in [`bound`] may run past its deadline to return
/// its own (cancellation) error before it is abandoned.
pub const ABANDON_GRACE: Duration = Duration::from_secs(1);

/// The deadline of one operation: the instant it must be finished by and the
/// configured timeout it was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// The instant the operation must be finished by.
    pub at: Instant,
    /// The configured timeout this deadline was made from.
    pub timeout: Duration,
}

/// A call abandoned [`ABANDON_GRACE`] after its deadline; the message follows
/// Go's `context.DeadlineExceeded` so operators recognise it in events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("context deadline exceeded: the operation did not finish within {timeout:?}")]
pub struct Exceeded {
    /// The configured timeout (`--provision-timeout` / `--deletion-timeout`).
    pub timeout: Duration,
}

/// The deadline of the operation this task is running, if any.
pub fn current() -> Option<Deadline> {
    CURRENT.try_with(|d| *d).ok()
}

/// Completes when the current deadline passes; never, when there is none.
/// For backends: `select!` on it to stop cleanly and return an error.
pub async fn cancelled() {
    match current() {
        Some(d) => tokio::time::sleep_until(d.at).await,
        None => std::future::pending().await,
    }
}

/// Run `fut`, giving up on it [`ABANDON_GRACE`] after the current deadline
/// (unbounded when there is none).
/// Errors: [`Exceeded`] when `fut` was abandoned.
pub async fn bound<F: Future>(fut: F) -> Result<F::Output, Exceeded> {
    match current() {
        None => Ok(fut.await),
        Some(d) => tokio::time::timeout_at(d.at + ABANDON_GRACE, fut)
            .await
            .map_err(|_| Exceeded { timeout: d.timeout }),
    }
}

/// Run `fut` as one operation under `timeout` (`None` or zero: unbounded; seed
/// `context.WithTimeout`): its task sees the [`Deadline`], and it is stopped 2 ×
/// [`ABANDON_GRACE`] after it. Errors: [`Exceeded`] when `fut` was stopped.
pub async fn within<F: Future>(timeout: Option<Duration>, fut: F) -> Result<F::Output, Exceeded> {
    let Some(timeout) = timeout.filter(|t| !t.is_zero()) else {
        return Ok(fut.await);
    };
    let at = Instant::now() + timeout;
    let scoped = CURRENT.scope(Deadline { at, timeout }, fut);
    tokio::time::timeout_at(at + 2 * ABANDON_GRACE, scoped)
        .await
        .map_err(|_| Exceeded { timeout })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(timeout: Duration) -> Deadline {
        let at = Instant::now() + timeout;
        Deadline { at, timeout }
    }

    #[tokio::test(start_paused = true)]
    async fn bound_abandons_a_slow_call_after_the_grace() {
        let d = after(Duration::from_secs(10));
        let start = Instant::now();
        let r = CURRENT
            .scope(d, bound(tokio::time::sleep(Duration::from_secs(3600))))
            .await;
        assert_eq!(
            r,
            Err(Exceeded {
                timeout: Duration::from_secs(10)
            })
        );
        assert_eq!(start.elapsed(), Duration::from_secs(10) + ABANDON_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cooperative_call_sees_the_deadline_and_returns_its_own_error() {
        let start = Instant::now();
        let call = async {
            let seen = current().expect("deadline visible inside the scope");
            cancelled().await;
            Err::<(), _>(format!(
                "stopped, {:?} left",
                seen.at.saturating_duration_since(Instant::now())
            ))
        };
        let r = CURRENT
            .scope(after(Duration::from_secs(5)), bound(call))
            .await;
        assert_eq!(r, Ok(Err("stopped, 0ns left".to_string())));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_scope_nothing_is_bounded() {
        assert_eq!(current(), None);
        let r = bound(tokio::time::sleep(Duration::from_secs(3600))).await;
        assert_eq!(r, Ok(()));
    }
}
