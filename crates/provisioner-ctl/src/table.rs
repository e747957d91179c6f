//! `provisioner-ctl status`'s terminal rendering of a [`Status`].

use std::fmt::Write as _;

use crate::status::Status;

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
            section(
                &mut out,
                "leases",
                &["SERVICE", "LEASE", "HOLDER", "RENEWED", "STATE"],
                p.leases.iter().map(|l| {
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
                    vec![
                        l.service.clone(),
                        match &l.namespace {
                            Some(ns) => format!("{ns}/{}", l.name),
                            None => l.name.clone(),
                        },
                        l.holder.clone().unwrap_or_else(|| "-".into()),
                        l.renewed_seconds_ago
                            .map(|s| format!("{} ago", secs(s)))
                            .unwrap_or_else(|| "-".into()),
                        state.to_string(),
                    ]
                }),
            );
        }
        if let Some(q) = &p.queue {
            section(
                &mut out,
                "in flight",
                &["PV", "CLAIM", "OWNER TERM", "VISIBLE AGAIN IN", "ATTEMPTS"],
                q.in_flight.iter().map(|e| {
                    vec![
                        e.pv_name.clone(),
                        e.claim.clone().unwrap_or_else(|| "<unreadable>".into()),
                        match e.owner_term {
                            Some(t) if e.stale_owner => format!("{t} (stale)"),
                            Some(t) => t.to_string(),
                            None => "-".into(),
                        },
                        secs(e.visible_again_in_seconds),
                        e.attempts.to_string(),
                    ]
                }),
            );
            section(
                &mut out,
                "dead letters",
                &["PV", "CLAIM", "ATTEMPTS", "DEAD FOR", "REASON"],
                q.dead_letters.iter().map(|d| {
                    vec![
                        d.pv_name.clone(),
                        d.claim.clone().unwrap_or_else(|| "-".into()),
                        d.attempts.to_string(),
                        secs(d.dead_for_seconds),
                        d.reason.clone(),
                    ]
                }),
            );
        }
        let intents = "intents (volumes being made)";
        if p.unavailable.contains(&"intents") {
            let _ = writeln!(out, "  {intents}: unavailable");
        } else {
            section(
                &mut out,
                intents,
                &["PV", "CLAIM", "CLASS", "AGE", "IN BACKGROUND"],
                p.intents.iter().map(|i| {
                    vec![
                        i.pv_name.clone(),
                        i.claim.clone(),
                        i.class.clone(),
                        secs(i.age_seconds),
                        i.in_background.to_string(),
                    ]
                }),
            );
        }
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
        for e in &p.errors {
            let _ = writeln!(out, "  ERROR {e}");
        }
    }
    out
}

fn secs(s: f64) -> String {
    format!("{s:.0}s")
}

/// Append `title` and an aligned table (two-space indent, columns padded to
/// their widest cell), or `title: none` when there are no rows.
fn section(
    out: &mut String,
    title: &str,
    header: &[&str],
    rows: impl Iterator<Item = Vec<String>>,
) {
    let rows: Vec<Vec<String>> = rows.collect();
    if rows.is_empty() {
        let _ = writeln!(out, "  {title}: none");
        return;
    }
    let _ = writeln!(out, "  {title}:");
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::from("   ");
        for (i, cell) in row.iter().enumerate() {
            line.push(' ');
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$} ", w = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}
