//! `provisioner-ctl queue ...`: what an operator needs to see and repair the
//! queue. Talks to Redis only.

use std::fmt::Write as _;

use anyhow::Context;
use api_types::queue::ClaimKey;
use common::handoff::queue::{DeadLetter, PendingEntry, PendingState, PvQueue};
use common::kube::time::now_ms;

pub use crate::cli::Action;
use crate::cli::QueueCommand;

/// Connect with `command`'s flags, run it and print its text.
/// Errors: Redis unreachable, or as [`run_queue_command`].
pub async fn run(command: &QueueCommand) -> anyhow::Result<()> {
    let (action, common) = command.parts();
    let queue = PvQueue::connect(common.redis(), &common.provisioner_name)
        .await
        .context("connecting to the queue")?;
    print!("{}", run_queue_command(&queue, action).await?);
    Ok(())
}

/// Run `action` against `queue`, returning the text to print on stdout.
///
/// Errors: Redis failures; `requeue` of a PV name that is not dead-lettered.
pub async fn run_queue_command(queue: &PvQueue, action: Action<'_>) -> anyhow::Result<String> {
    let now = now_ms();
    match action {
        Action::List => Ok(format_pending(&queue.list_pending().await?, now)),
        Action::Dead => Ok(format_dead(&queue.list_dead().await?, now)),
        Action::Requeue(pv_name) => {
            if queue.requeue_dead(pv_name).await? {
                Ok(format!("requeued dead letter {pv_name}\n"))
            } else if queue.is_pending(pv_name).await? {
                anyhow::bail!("PV {pv_name} is pending, not dead-lettered; nothing to requeue")
            } else {
                anyhow::bail!("PV {pv_name} is not in the queue")
            }
        }
    }
}

fn seconds(ms: u64) -> String {
    format!("{}s", ms / 1000)
}

fn with_uid(claim: &ClaimKey) -> String {
    format!("{claim} (uid {})", claim.uid)
}

/// Tab-separated table of pending entries: `PV CLAIM CLASS STATE ATTEMPTS AGE`,
/// where STATE is `due`, `retry in <n>s` or `in flight (<n>s left)` and AGE is
/// the time since enqueue. Unreadable payloads show `<unreadable: ...>` as claim.
pub fn format_pending(entries: &[PendingEntry], now_ms: u64) -> String {
    let mut out = String::from("PV\tCLAIM\tCLASS\tSTATE\tATTEMPTS\tAGE\n");
    for e in entries {
        let state = match e.state {
            PendingState::Due(t) if t <= now_ms => "due".to_string(),
            PendingState::Due(t) => format!("retry in {}", seconds(t - now_ms)),
            PendingState::InFlight(t) => {
                format!("in flight ({} left)", seconds(t.saturating_sub(now_ms)))
            }
        };
        let (claim, class, age) = match &e.entry {
            Ok(entry) => (
                with_uid(&entry.claim),
                entry.class.clone(),
                seconds(now_ms.saturating_sub(entry.enqueued_at_ms)),
            ),
            Err(err) => (format!("<unreadable: {err}>"), "-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "{}\t{claim}\t{class}\t{state}\t{}\t{age}",
            e.pv_name, e.attempts
        );
    }
    out
}

/// Tab-separated table of dead letters: `PV CLAIM ATTEMPTS DEAD-FOR REASON`.
pub fn format_dead(letters: &[DeadLetter], now_ms: u64) -> String {
    let mut out = String::from("PV\tCLAIM\tATTEMPTS\tDEAD-FOR\tREASON\n");
    for d in letters {
        let claim = d.claim.as_ref().map_or_else(|| "-".into(), with_uid);
        let _ = writeln!(
            out,
            "{}\t{claim}\t{}\t{}\t{}",
            d.pv_name,
            d.attempts,
            seconds(now_ms.saturating_sub(d.dead_at_ms)),
            d.reason
        );
    }
    out
}
