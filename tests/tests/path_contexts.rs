//! Flow- and context-sensitive path profiles (Ammons, Ball & Larus): every
//! path in its full calling context (the burst's records joined with the
//! stack sample of the overflow that started it), read back with the
//! reference reader, `go tool pprof -traces`.
use std::collections::BTreeMap;
use std::time::Duration;

use burstyd_tests::gopprof::{self, TraceSample};
use burstyd_tests::*;

/// The number in "... path N: ..." of a leaf pseudo-frame.
fn path_of(leaf: &str) -> Option<u64> {
    let rest = leaf.split(" path ").nth(1)?;
    rest.split(':').next()?.parse().ok()
}

/// `shape`'s paths per caller of `shape` (the frame above it), in
/// executions, from `-traces`; and the executions whose context does not
/// reach `main` and `_start`.
fn shape_paths_by_caller(traces: &[TraceSample]) -> (BTreeMap<String, BTreeMap<u64, i64>>, i64) {
    let mut by_caller: BTreeMap<String, BTreeMap<u64, i64>> = BTreeMap::new();
    let mut unrooted = 0;
    for t in traces {
        if !t.frames[0].starts_with("shape path ")
            || t.frames.get(1).map(String::as_str) != Some("shape")
        {
            continue;
        }
        let n = t.count();
        let rooted = t.frames.iter().any(|f| f == "main")
            && t.frames.last().map(String::as_str) == Some("_start");
        if !rooted {
            unrooted += n;
            continue;
        }
        let caller = t.frames.get(2).cloned().unwrap_or_default();
        *by_caller
            .entry(caller)
            .or_default()
            .entry(path_of(&t.frames[0]).expect("path number"))
            .or_insert(0) += n;
    }
    (by_caller, unrooted)
}

/// Done-means 1 of the issue: one function called from two callers with
/// different inputs, so that its hot path differs by caller. `go tool
/// pprof -traces paths.pb.gz` shows the two contexts with their different
/// paths, rooted at `main` (and above it at `_start`).
#[test]
fn a_function_shows_a_different_hot_path_under_each_caller() {
    require_root();
    let _serial = serial();
    let exe = fixture("two_callers");
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s, "600"], Duration::from_secs(60));
    let scratch = Scratch::new("two_callers");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999"],
        &[exe_s, "600"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(
        run.finished.stdout_str(),
        untraced.stdout_str(),
        "{}",
        run.finished.describe()
    );
    let stderr = &run.finished.stderr;
    let line = stderr
        .lines()
        .find(|l| l.contains("path contexts:"))
        .unwrap_or_else(|| panic!("no path contexts line:\n{}", tail(stderr, 20)));
    // "path contexts: J of B bursts began with their stack sample; R of P
    // paths in a context up to the thread's root; ..."
    let words: Vec<&str> = line.split_whitespace().collect();
    let num = |after: &str, k: usize| -> u64 {
        let i = words
            .iter()
            .position(|w| *w == after)
            .unwrap_or_else(|| panic!("{line}"));
        words[i + k]
            .trim_end_matches(';')
            .parse()
            .unwrap_or_else(|_| panic!("{line}"))
    };
    let (joined, bursts) = (num("contexts:", 1), num("contexts:", 3));
    assert!(
        bursts >= 200 && joined as f64 >= 0.95 * bursts as f64,
        "{line}"
    );

    let (_, traces) = gopprof::traces(&run.out_dir.join("paths.pb.gz"), Some("executions"))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let (by_caller, unrooted) = shape_paths_by_caller(&traces);
    let describe = || {
        format!(
            "{by_caller:?}, unrooted {unrooted}\n{}",
            describe_traces(&traces, 12)
        )
    };
    let dominant = |caller: &str| -> (u64, f64, i64) {
        let paths = by_caller
            .get(caller)
            .unwrap_or_else(|| panic!("no shape under {caller}: {}", describe()));
        let total: i64 = paths.values().sum();
        let (&p, &n) = paths.iter().max_by_key(|e| *e.1).unwrap();
        (p, n as f64 / total as f64, total)
    };
    let (even_path, even_share, even_n) = dominant("even_caller");
    let (odd_path, odd_share, odd_n) = dominant("odd_caller");
    // Each caller drives shape down one branch only.
    assert!(even_share >= 0.999 && odd_share >= 0.999, "{}", describe());
    assert_ne!(even_path, odd_path, "{}", describe());
    assert!(even_n >= 1000 && odd_n >= 1000, "{}", describe());
    // Nearly every execution has its context up to the root.
    let rooted = even_n + odd_n;
    assert!(
        unrooted as f64 <= 0.05 * (rooted + unrooted) as f64,
        "{}",
        describe()
    );
}
