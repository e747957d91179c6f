//! The real-plane outcome of each test variant (ran, or skipped and why), so
//! a skip never passes unnoticed: every record is written to
//! `<target dir>/realkube-summary/<test binary>.tsv` (rewritten by each run of
//! that binary), and at exit the binary prints its totals per version to
//! stderr. `tools/realkube/summary.sh` adds up every binary's file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use super::assets::KubeVersion;
use crate::harness::binaries::target_dir;

struct Record {
    version: KubeVersion,
    test: String,
    skipped: Option<String>,
}

static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());

/// The folder of the per-binary record files: `<target dir>/realkube-summary`.
pub fn dir() -> PathBuf {
    target_dir().join("realkube-summary")
}

fn binary_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".into())
}

/// One line a record: `<release>\tran|skipped\t<test>\t<why skipped>` (tabs and
/// newlines in the reason become spaces).
fn line(r: &Record) -> String {
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    match &r.skipped {
        None => format!("{}\tran\t{}\t\n", r.version, clean(&r.test)),
        Some(why) => format!(
            "{}\tskipped\t{}\t{}\n",
            r.version,
            clean(&r.test),
            clean(why)
        ),
    }
}

/// Record that `test` ran on `version` (`skipped: None`) or was skipped and
/// why, rewrite this binary's record file, and (first call) register the
/// exit-time totals. Write errors are ignored: the record is a report.
pub fn record(test: &str, version: KubeVersion, skipped: Option<&str>) {
    let mut records = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    if records.is_empty() {
        // SAFETY: registers a plain `extern "C" fn()` with libc.
        unsafe {
            libc::atexit(print_totals);
        }
    }
    records.push(Record {
        version,
        test: test.to_string(),
        skipped: skipped.map(str::to_string),
    });
    let text: String = records.iter().map(line).collect();
    let dir = dir();
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(format!("{}.tsv", binary_name())), text);
    }
}

/// `v1.19.2: 3 ran; v1.37.2: 0 ran, 3 skipped (why)`, for the records so far.
fn totals(records: &[Record]) -> String {
    let mut by: BTreeMap<KubeVersion, (usize, usize, Option<&str>)> = BTreeMap::new();
    for r in records {
        let e = by.entry(r.version).or_default();
        match &r.skipped {
            None => e.0 += 1,
            Some(why) => {
                e.1 += 1;
                e.2.get_or_insert(why);
            }
        }
    }
    by.iter()
        .map(|(v, (ran, skipped, why))| match why {
            None => format!("{v}: {ran} ran"),
            Some(why) => format!("{v}: {ran} ran, {skipped} SKIPPED ({why})"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

extern "C" fn print_totals() {
    let records = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr().lock(),
        "realkube: real-plane tests of this binary: {}",
        totals(&records)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_count_ran_and_skipped_per_version_with_the_reason() {
        let r = |version, skipped: Option<&str>| Record {
            version,
            test: "a::b".into(),
            skipped: skipped.map(str::to_string),
        };
        let records = [
            r(KubeVersion::V1_37, Some("no kube-apiserver")),
            r(KubeVersion::V1_19, None),
            r(KubeVersion::V1_19, None),
            r(KubeVersion::V1_37, Some("no kube-apiserver")),
        ];
        assert_eq!(
            totals(&records),
            "v1.19.2: 2 ran; v1.37.2: 0 ran, 2 SKIPPED (no kube-apiserver)"
        );
        assert_eq!(
            line(&records[0]),
            "v1.37.2\tskipped\ta::b\tno kube-apiserver\n"
        );
        assert_eq!(line(&records[1]), "v1.19.2\tran\ta::b\t\n");
    }
}
