//! `provisioner-ctl status`'s terminal rendering of a [`Status`].

use std::fmt::Write as _;

use crate::status::{LeaseStatus, ProvisionerStatus, QueueStatus, Status};

/// The terminal rendering: per provisioner name a summary line, then the
/// Leases, in-flight entries, dead letters, intents and orphans as aligned
/// tables (a section with nothing in it says so in one line).
pub fn render_table(status: &Status) -> String {
    let mut out = String::new();
    for p in &status.provisioners {
        let _ = writeln!(out, "PROVISIONER {}", p.provisioner_name);
        match &p.queue {
            Some(q) => {
                let _ = writeln!(
                    out,
                    "  queue: depth {}, oldest pending {}, in flight {}, dead letters {}, pv-writer term {}",
                    q.depth,
                    secs(q.oldest_pending_age_seconds),
                    q.in_flight.len(),
                    q.dead_letters.len(),
                    q.current_term
                );
            }
            None => out.push_str("  queue: unavailable\n"),
        }
        if !p.leases.is_empty() {
            let header = ["SERVICE", "LEASE", "HOLDER", "RENEWED", "STATE"];
            section(&mut out, "leases", header, p.leases.iter().map(lease_row));
        }
        if let Some(q) = &p.queue {
            queue_sections(&mut out, q);
        }
        intents_section(&mut out, p);
        orphans_section(&mut out, p);
        for e in &p.errors {
            let _ = writeln!(out, "  ERROR {e}");
        }
    }
    out
}

/// The in-flight entries and dead letters of `q`, one table each.
fn queue_sections(out: &mut String, q: &QueueStatus) {
    let header = ["PV", "CLAIM", "OWNER TERM", "VISIBLE AGAIN IN", "ATTEMPTS"];
    let rows = q.in_flight.iter().map(|e| {
        let term = match e.owner_term {
            Some(t) if e.stale_owner => format!("{t} (stale)"),
            Some(t) => t.to_string(),
            None => "-".into(),
        };
        [
            e.pv_name.clone(),
            e.claim.clone().unwrap_or_else(|| "<unreadable>".into()),
            term,
            secs(e.visible_again_in_seconds),
            e.attempts.to_string(),
        ]
    });
    section(out, "in flight", header, rows);
    let header = ["PV", "CLAIM", "ATTEMPTS", "DEAD FOR", "REASON"];
    let rows = q.dead_letters.iter().map(|d| {
        [
            d.pv_name.clone(),
            dash(d.claim.clone()),
            d.attempts.to_string(),
            secs(d.dead_for_seconds),
            d.reason.clone(),
        ]
    });
    section(out, "dead letters", header, rows);
}

/// The provisioning intents of `p` as a table, or `unavailable`.
fn intents_section(out: &mut String, p: &ProvisionerStatus) {
    let intents = "intents (volumes being made)";
    if p.unavailable.contains(&"intents") {
        let _ = writeln!(out, "  {intents}: unavailable");
        return;
    }
    let header = ["PV", "CLAIM", "CLASS", "AGE", "IN BACKGROUND"];
    let rows = p.intents.iter().map(|i| {
        [
            i.pv_name.clone(),
            i.claim.clone(),
            i.class.clone(),
            secs(i.age_seconds),
            i.in_background.to_string(),
        ]
    });
    section(out, intents, header, rows);
}

/// The last orphan report of `p`: its summary line and one line per orphan.
fn orphans_section(out: &mut String, p: &ProvisionerStatus) {
    match &p.orphan_report {
        Some(r) => {
            let _ = writeln!(
                out,
                "  orphan sweep: {} orphan(s), {} archived, by {} {} ago",
                r.orphans.len(),
                r.archived,
                r.reporter,
                secs(p.orphan_report_age_seconds.unwrap_or_default())
            );
            for o in &r.orphans {
                let _ = writeln!(out, "    {o}");
            }
        }
        None if p.unavailable.contains(&"orphan sweep") => {
            out.push_str("  orphan sweep: unavailable\n")
        }
        None => out.push_str("  orphan sweep: no report yet\n"),
    }
}

/// A Lease's row: service, `namespace/name`, holder, last renewal and state.
fn lease_row(l: &LeaseStatus) -> [String; 5] {
    let state = if l.error.is_some() {
        "unreadable"
    } else if !l.found {
        "not found"
    } else if l.holder.is_none() {
        "no holder"
    } else if l.expired {
        "expired"
    } else {
        "held"
    };
    let name = match &l.namespace {
        Some(ns) => format!("{ns}/{}", l.name),
        None => l.name.clone(),
    };
    let holder = dash(l.holder.clone());
    let renewed = dash(l.renewed_seconds_ago.map(|s| format!("{} ago", secs(s))));
    [l.service.clone(), name, holder, renewed, state.to_string()]
}

fn secs(s: f64) -> String {
    format!("{s:.0}s")
}

fn dash(cell: Option<String>) -> String {
    cell.unwrap_or_else(|| "-".into())
}

/// Append `title` and an aligned table (two-space indent, columns padded to
/// their widest cell), or `title: none` when there are no rows.
fn section(
    out: &mut String,
    title: &str,
    header: [&str; 5],
    rows: impl Iterator<Item = [String; 5]>,
) {
    let rows: Vec<[String; 5]> = std::iter::once(header.map(String::from))
        .chain(rows)
        .collect();
    if rows.len() == 1 {
        let _ = writeln!(out, "  {title}: none");
        return;
    }
    let _ = writeln!(out, "  {title}:");
    let widths: [usize; 5] =
        std::array::from_fn(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0));
    for row in &rows {
        let cells = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}"));
        let line = format!("    {}", cells.collect::<Vec<_>>().join("  "));
        let _ = writeln!(out, "{}", line.trim_end());
    }
}
