//! Polling with deadlines: every wait in a scenario is bounded, and a timeout
//! names what was awaited.

use std::future::Future;
use std::time::{Duration, Instant};

/// Poll interval of [`wait_until`] and [`wait_for`].
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Poll `check` every 50 ms until it returns `true`.
///
/// Errors: `timeout` elapsed first; the message names `what` and the timeout.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting until {what}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Poll `probe` every 50 ms until it yields `Some(value)`, and return it.
///
/// Errors: `timeout` elapsed first; the message names `what`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Poll `value` every 50 ms until it equals `expected`, returning the time it took.
///
/// Errors: timeout; the message names `what`, the expected and the last value.
pub async fn wait_eq<T, F, Fut>(
    timeout: Duration,
    what: &str,
    expected: T,
    mut value: F,
) -> anyhow::Result<Duration>
where
    T: PartialEq + std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        let last = value().await;
        if matches!(&last, Ok(v) if *v == expected) {
            return Ok(start.elapsed());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "timed out after {timeout:?} waiting for {what} == {expected:?}; last: {last:?}"
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_eq_times_out_with_last_value() {
        let err = wait_eq(Duration::from_millis(120), "answer", 42, || async {
            Ok::<_, anyhow::Error>(41)
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("answer == 42; last: Ok(41)"), "{err}");
        let mut n = 0;
        wait_until(Duration::from_secs(2), "third poll", || {
            n += 1;
            let done = n >= 3;
            async move { done }
        })
        .await
        .unwrap();
        assert_eq!(n, 3);
    }
}
