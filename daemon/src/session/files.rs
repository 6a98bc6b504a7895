//! Output files: interval profiles' names (UTC timestamps) and
//! retention, and the final outputs an earlier run left behind.
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The UTC timestamp of an interval file's name: `context-<time>.pb.gz`,
/// `paths-<time>.pb.gz`, `values-<time>.pb.gz`, `targets-<time>.pb.gz`,
/// `edges-<module>-<time>.fdata` or
/// `hot-streams-<time>.json` (not `hot-streams-<pid>.json`: the time's
/// form tells them apart).
fn interval_time(name: &str) -> Option<&str> {
    let stem = name
        .strip_suffix(".pb.gz")
        .filter(|s| {
            ["context-", "paths-", "values-", "targets-"]
                .iter()
                .any(|p| s.starts_with(p))
        })
        .or_else(|| {
            name.strip_suffix(".fdata")
                .filter(|s| s.starts_with("edges-"))
        })
        .or_else(|| {
            name.strip_suffix(".json")
                .filter(|s| s.starts_with("hot-streams-"))
        })?;
    let (_, time) = stem.rsplit_once('-')?;
    (time.len() == 20 && time.ends_with('Z') && time.as_bytes()[8] == b'T').then_some(time)
}

/// Deletes interval files (an interval's context profile, path profile
/// and edge profiles together) beyond the newest `keep` intervals and
/// older than `max_age`.
pub(super) fn prune_output(dir: &Path, keep: Option<usize>, max_age: Option<Duration>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(String, PathBuf)> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().into_string().ok()?;
            Some((interval_time(&n)?.to_owned(), e.path()))
        })
        .collect();
    // The names are UTC timestamps: sorting by name sorts by time.
    files.sort();
    let mut times: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
    times.dedup();
    let n = times.len();
    let now = SystemTime::now();
    for (time, path) in &files {
        let i = times.partition_point(|t| t < &time.as_str());
        let too_many = keep.is_some_and(|k| n - i > k);
        let too_old = max_age.is_some_and(|age| {
            std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|a| a > age)
        });
        if (too_many || too_old)
            && let Err(e) = std::fs::remove_file(path)
        {
            tracing::warn!("removing old profile {}: {e}", path.display());
        }
    }
}

/// Whether `name` is one of the files a session writes at its end:
/// `context.pb.gz`, `paths.pb.gz`, `summary.json`, `bursts.jsonl`,
/// `edges.fdata` and `edges-<pid or module>.fdata` (not an interval's),
/// `hot-streams.json` and `hot-streams-<pid>.json`, `values.pb.gz` and
/// `targets.pb.gz`.
fn final_output(name: &str) -> bool {
    matches!(
        name,
        "context.pb.gz"
            | "paths.pb.gz"
            | "summary.json"
            | "bursts.jsonl"
            | "edges.fdata"
            | "hot-streams.json"
            | "values.pb.gz"
            | "targets.pb.gz"
    ) || (name.starts_with("edges-") && name.ends_with(".fdata") && interval_time(name).is_none())
        || (name.starts_with("hot-streams-")
            && name.ends_with(".json")
            && interval_time(name).is_none())
}

/// Removes the final outputs of an earlier run that this one, started at
/// `start`, did not write again (last modified before it): without, a
/// second run into the same directory leaves the first one's
/// `edges-liblzma.so.5.4.1.fdata` beside its own files as if it were
/// its. Only files named as burstyd names its final outputs are touched;
/// interval files are left to retention. Returns the names removed,
/// sorted.
pub(super) fn remove_stale_outputs(dir: &Path, start: SystemTime) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed: Vec<String> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            let meta = e.metadata().ok()?;
            let stale = final_output(&name) && meta.is_file() && meta.modified().ok()? < start;
            if !stale {
                return None;
            }
            match std::fs::remove_file(e.path()) {
                Ok(()) => Some(name),
                Err(err) => {
                    tracing::warn!(
                        "cannot remove {}, left by an earlier run: {err}",
                        e.path().display()
                    );
                    None
                }
            }
        })
        .collect();
    removed.sort();
    removed
}

/// UTC, `YYYYmmddTHHMMSS.mmmZ` (milliseconds, so that a final partial
/// interval never overwrites the one before it), without a date crate.
pub(super) fn timestamp(t: SystemTime) -> String {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = secs / 86400;
    let rem = secs % 86400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn interval_files_are_known_by_their_time() {
        let t = "20261118T110640.042Z";
        for n in [
            format!("context-{t}.pb.gz"),
            format!("paths-{t}.pb.gz"),
            format!("edges-ld-linux-x86-64.so.2-{t}.fdata"),
            format!("hot-streams-{t}.json"),
            format!("values-{t}.pb.gz"),
            format!("targets-{t}.pb.gz"),
        ] {
            assert_eq!(super::interval_time(&n), Some(t), "{n}");
        }
        for n in [
            "context.pb.gz",
            "paths.pb.gz",
            "edges.fdata",
            "edges-123.fdata",
            "edges-libc.so.6.fdata",
            "hot-streams.json",
            "hot-streams-4242.json",
        ] {
            assert_eq!(super::interval_time(n), None, "{n}");
        }
    }

    /// Only the final outputs of an earlier run go: not this run's
    /// (modified since it started), not interval files, not anything
    /// else in the directory.
    #[test]
    fn stale_final_outputs_are_removed_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("burstyd-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let old = [
            "edges-liblzma.so.5.4.1.fdata",
            "edges.fdata",
            "edges-123.fdata",
            "bursts.jsonl",
            "paths.pb.gz",
            "hot-streams.json",
            "hot-streams-77.json",
            "values.pb.gz",
            "targets.pb.gz",
        ];
        let others = [
            "edges-libc.so.6-20261118T110640.042Z.fdata",
            "context-20261118T110640.042Z.pb.gz",
            "notes.txt",
            "edges.fdata.bak",
            "my-paths.pb.gz",
        ];
        for n in old.iter().chain(&others) {
            std::fs::write(dir.join(n), "x").unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let start = std::time::SystemTime::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // This run's own.
        std::fs::write(dir.join("context.pb.gz"), "x").unwrap();
        std::fs::write(dir.join("paths.pb.gz"), "x").unwrap();
        std::fs::write(dir.join("summary.json"), "x").unwrap();
        let removed = super::remove_stale_outputs(&dir, start);
        let mut want: Vec<&str> = old
            .iter()
            .copied()
            .filter(|n| *n != "paths.pb.gz")
            .collect();
        want.sort();
        assert_eq!(removed, want);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut expect: Vec<&str> = others.to_vec();
        expect.extend(["context.pb.gz", "paths.pb.gz", "summary.json"]);
        expect.sort();
        assert_eq!(left, expect);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn timestamps_are_utc_civil() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_042);
        // 2026-11-18 11:06:40 UTC
        assert_eq!(super::timestamp(t), "20261118T110640.042Z");
    }
}
