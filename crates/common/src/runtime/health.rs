//! What `/healthz` checks: a work-loop heartbeat ([`Heartbeat::beat`] at least
//! once per `--healthz-stall-timeout` while the loop leads; an idle loop beats too)
//! and, for a leader, a Lease renewal confirmed within the renew deadline plus
//! three retry periods: docs/decisions/0003-leader-election-and-the-frame.md.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The last sign of life of a work loop; cheap to clone (clones share it).
#[derive(Clone, Debug)]
pub struct Heartbeat {
    last: Arc<Mutex<Instant>>,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            last: Arc::new(Mutex::new(Instant::now())),
        }
    }
}

impl Heartbeat {
    /// Record that the loop is alive now.
    pub fn beat(&self) {
        *self.last.lock().expect("heartbeat poisoned") = Instant::now();
    }

    /// Time since the last beat.
    pub fn age(&self) -> Duration {
        self.last.lock().expect("heartbeat poisoned").elapsed()
    }
}

/// Beat `heartbeat` every `period` (non-zero: [`beat_period`]) while `stalled_for()` (how long the
/// loop has been stuck, zero when idle or progressing) stays below `stall_timeout`, until
/// `shutdown` fires. Spawn it in the work loop's own `JoinSet`, so it stops with the loop.
pub async fn beat_while_progressing(
    heartbeat: Heartbeat,
    period: Duration,
    stall_timeout: Duration,
    stalled_for: impl Fn() -> Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(period);
    while shutdown.run_until_cancelled(tick.tick()).await.is_some() {
        if stalled_for() < stall_timeout {
            heartbeat.beat();
        }
    }
}

/// The beat period for a stall timeout: often enough that a healthy loop is
/// never reported stalled between two beats.
pub fn beat_period(stall_timeout: Duration) -> Duration {
    (stall_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(5))
}

#[derive(Debug, Default)]
struct LivenessState {
    working: AtomicBool,
    leading: AtomicBool,
    /// Last time the leader's own renewal was confirmed on the Lease.
    renewed: Heartbeat,
}

/// The state `/healthz` answers from; cheap to clone (clones share it).
#[derive(Clone, Debug)]
pub struct Liveness {
    heartbeat: Heartbeat,
    stall_timeout: Duration,
    renew_tolerance: Duration,
    state: Arc<LivenessState>,
}

impl Liveness {
    /// Liveness for a work loop that must beat its [`heartbeat`](Self::heartbeat) within
    /// `stall_timeout`, and a leader whose renewal is unconfirmed for `renew_deadline + 3 ×
    /// retry_period` (one period above the watchdog's worst case; docs/decisions/0003).
    pub fn new(stall_timeout: Duration, renew_deadline: Duration, retry_period: Duration) -> Self {
        Self {
            heartbeat: Heartbeat::default(),
            stall_timeout,
            renew_tolerance: renew_deadline + 3 * retry_period,
            state: Arc::default(),
        }
    }

    /// The heartbeat the work loop beats.
    pub fn heartbeat(&self) -> &Heartbeat {
        &self.heartbeat
    }

    /// The runtime started (`true`) or stopped (`false`) the work loop. Starting
    /// counts as a beat, so a fresh loop has a whole stall timeout to start.
    pub fn set_working(&self, working: bool) {
        if working {
            self.heartbeat.beat();
        }
        self.state.working.store(working, Ordering::SeqCst);
    }

    /// The runtime holds (`true`) or no longer holds (`false`) the Lease.
    /// Taking the Lease counts as a confirmed renewal.
    pub fn set_leading(&self, leading: bool) {
        if leading {
            self.renewed();
        }
        self.state.leading.store(leading, Ordering::SeqCst);
    }

    /// The leader's own renewal was just confirmed on the Lease.
    pub fn renewed(&self) {
        self.state.renewed.beat();
    }

    /// `Ok` when healthy, else why not (the `/healthz` body).
    pub fn check(&self) -> Result<(), Unhealthy> {
        let (age, limit) = (self.heartbeat.age(), self.stall_timeout);
        if self.state.working.load(Ordering::SeqCst) && age > limit {
            return Err(Unhealthy::Stalled { age, limit });
        }
        let (age, limit) = (self.state.renewed.age(), self.renew_tolerance);
        if self.state.leading.load(Ordering::SeqCst) && age > limit {
            return Err(Unhealthy::NotRenewing { age, limit });
        }
        Ok(())
    }

    /// The current leader term as [`LeaderTerm::check`] sees it: current
    /// while leading with the own renewal confirmed within `renew_deadline`.
    pub fn term(&self, renew_deadline: Duration) -> LeaderTerm {
        LeaderTerm {
            state: Some((self.state.clone(), renew_deadline)),
        }
    }
}

/// Why `/healthz` fails ([`Liveness::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// The work loop made no progress for `age` (over `--healthz-stall-timeout`).
    #[error("work loop stalled: no progress for {age:.0?} (limit {limit:?})")]
    Stalled { age: Duration, limit: Duration },
    /// The leader's own renewal is `age` old (over the renew tolerance).
    #[error(
        "leader cannot renew its Lease: last renewal confirmed {age:.0?} ago (limit {limit:?})"
    )]
    NotRenewing { age: Duration, limit: Duration },
}

/// Why a leader term is not current ([`LeaderTerm::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotCurrent {
    /// This replica does not lead.
    #[error("this replica does not hold the Lease")]
    NotLeading,
    /// Its own renewal is `age` old, over the renew `deadline`.
    #[error("leader term not current: own Lease renewal last confirmed {age:.0?} ago (renew deadline {deadline:?})")]
    Stale { age: Duration, deadline: Duration },
}

/// This replica's leader term, checked by the work loop right before an
/// irreversible action (a leader paused past its Lease must not act on what
/// it decided before). Cheap to clone.
#[derive(Clone, Debug)]
pub struct LeaderTerm {
    state: Option<(Arc<LivenessState>, Duration)>,
}

impl LeaderTerm {
    /// A term that is always current: no leader election (the only replica), tests.
    pub fn unconditional() -> Self {
        Self { state: None }
    }

    /// `Ok` while this replica leads and its own Lease renewal was confirmed
    /// within the renew deadline (the watchdog's limit); else why not.
    pub fn check(&self) -> Result<(), NotCurrent> {
        let Some((state, deadline)) = &self.state else {
            return Ok(());
        };
        if !state.leading.load(Ordering::SeqCst) {
            return Err(NotCurrent::NotLeading);
        }
        let (age, deadline) = (state.renewed.age(), *deadline);
        if age > deadline {
            return Err(NotCurrent::Stale { age, deadline });
        }
        Ok(())
    }
}

impl Default for Liveness {
    /// Never unhealthy until the runtime starts a work loop; five-minute stall
    /// timeout, 16 s renew tolerance (client-go's default 10 s deadline, 2 s period).
    fn default() -> Self {
        let secs = Duration::from_secs;
        Self::new(secs(300), secs(10), secs(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Liveness with a stall timeout of `stall` s and a renew tolerance of `renew` s.
    fn liveness(stall: u64, renew: u64) -> Liveness {
        let (stall, renew) = (Duration::from_secs(stall), Duration::from_secs(renew));
        Liveness::new(stall, renew, Duration::ZERO)
    }

    #[tokio::test(start_paused = true)]
    async fn a_term_is_current_only_while_leading_and_renewing() {
        let live = Liveness::default();
        let term = live.term(Duration::from_secs(10));
        assert_eq!(term.check(), Err(NotCurrent::NotLeading));
        live.set_leading(true);
        assert_eq!(term.check(), Ok(()));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(
            matches!(term.check(), Err(NotCurrent::Stale { .. })),
            "paused past the deadline"
        );
        live.renewed();
        assert_eq!(term.check(), Ok(()));
        live.set_leading(false);
        assert!(term.check().is_err());
        assert_eq!(LeaderTerm::unconditional().check(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_loop_is_unhealthy_an_idle_or_stopped_one_is_not() {
        let live = liveness(10, 16);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            live.check(),
            Ok(()),
            "no work loop running: nothing to check"
        );
        live.set_working(true);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(live.check(), Ok(()));
        live.heartbeat().beat();
        tokio::time::advance(Duration::from_secs(11)).await;
        let err = live.check().unwrap_err().to_string();
        assert!(err.contains("work loop stalled"), "{err}");
        live.set_working(false);
        assert_eq!(live.check(), Ok(()), "a stopped loop (standby) is healthy");
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_cannot_renew_is_unhealthy_a_campaigning_one_is_not() {
        let live = liveness(300, 16);
        live.set_leading(true);
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(live.check(), Ok(()));
        live.renewed();
        tokio::time::advance(Duration::from_secs(17)).await;
        let err = live.check().unwrap_err().to_string();
        assert!(err.contains("cannot renew"), "{err}");
        live.set_leading(false);
        assert_eq!(live.check(), Ok(()), "lost the Lease, campaigning: healthy");
        live.set_leading(true);
        assert_eq!(live.check(), Ok(()), "taking the Lease counts as a renewal");
    }

    #[tokio::test(start_paused = true)]
    async fn the_beater_stops_beating_when_the_loop_stalls() {
        let heartbeat = Heartbeat::default();
        let stalled = Arc::new(Mutex::new(Duration::ZERO));
        let stop = CancellationToken::new();
        let task = tokio::spawn(beat_while_progressing(
            heartbeat.clone(),
            Duration::from_secs(1),
            Duration::from_secs(10),
            {
                let stalled = stalled.clone();
                move || *stalled.lock().unwrap()
            },
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(heartbeat.age() <= Duration::from_secs(1), "idle: beats");
        *stalled.lock().unwrap() = Duration::from_secs(11);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            heartbeat.age() >= Duration::from_secs(29),
            "stalled: no beat"
        );
        stop.cancel();
        task.await.unwrap();
    }
}
