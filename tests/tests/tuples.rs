//! Tuple profiles end to end (issue 34) on `tuples_known.c`, whose
//! tuples are known by construction: in `step`, the load of `cells[i & 3]`
//! gives 7 three times in four and 42 once, and the indirect call through
//! `table[i & 3]` goes to f1 half the time, to f2 and f3 a quarter each.
//! A full trace with the exact sampler (from the first overflow on, so
//! not every step) counts each of them exactly: each value as its share
//! of the steps traced says, to within one, and both sites the same
//! steps; the program's output is the untraced one.
use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;

/// `burstyd values [--targets] OUT --json`.
fn report(out: &std::path::Path, targets: bool) -> serde_json::Value {
    let mut cmd = Command::new(burstyd_bin());
    cmd.arg("values");
    if targets {
        cmd.arg("--targets");
    }
    let r = run_timeout(cmd.arg(out).arg("--json"), Duration::from_secs(60));
    assert!(r.status.success(), "{}", r.describe());
    serde_json::from_str(&r.stdout_str()).unwrap()
}

/// The report's sites in `step` whose values (or target functions) are
/// those of `want`, each counted as its share of the site's executions
/// says, to within one (the trace starts at any step of the cycle of
/// four).
fn sites_with(rep: &serde_json::Value, key: &str, want: &[(&str, f64)]) -> Vec<serde_json::Value> {
    rep["top"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["function"].as_str() == Some("step"))
        .filter(|s| {
            let total = s["executions"].as_u64().unwrap() as f64;
            let vals = s["values"].as_array().unwrap();
            vals.len() == want.len()
                && want.iter().all(|(v, share)| {
                    vals.iter().any(|x| {
                        x[key].as_str().is_some_and(|k| k == *v)
                            && (x["executions"].as_u64().unwrap() as f64 - share * total).abs()
                                <= 1.0
                    })
                })
        })
        .cloned()
        .collect()
}

#[test]
fn a_full_trace_counts_the_known_tuples_exactly() {
    require_root();
    let _serial = serial();
    let exe = fixture("tuples_known");
    let n = 3_000_000u64;
    let untraced = run_timeout(
        Command::new(&exe).arg(n.to_string()),
        Duration::from_secs(60),
    );
    assert!(untraced.status.success());
    let scratch = Scratch::new("tuples-known");
    let out = scratch.join("out");
    let run = run_timeout(
        Command::new(burstyd_bin())
            .args([
                "run",
                "--exe-only",
                "--full-trace",
                "--record",
                "values,targets",
                "--sampler",
                "exact",
                "-o",
            ])
            .arg(&out)
            .arg("--")
            .arg(&exe)
            .arg(n.to_string()),
        Duration::from_secs(300),
    );
    assert!(run.status.success(), "{}", run.describe());
    assert_eq!(run.stdout_str(), untraced.stdout_str());

    let targets = report(&out, true);
    let calls = sites_with(
        &targets,
        "target",
        &[("f1", 0.5), ("f2", 0.25), ("f3", 0.25)],
    );
    assert_eq!(calls.len(), 1, "the call site in step: {targets:#}");
    let steps = calls[0]["executions"].as_u64().unwrap();
    assert!(steps > n / 2 && steps <= n, "{steps} steps traced of {n}");

    let values = report(&out, false);
    let cells = sites_with(&values, "value", &[("0x7", 0.75), ("0x2a", 0.25)]);
    assert_eq!(cells.len(), 1, "the load of cells[i & 3]: {values:#}");
    // The trace may start between the load and the call.
    let loads = cells[0]["executions"].as_u64().unwrap();
    assert!(loads.abs_diff(steps) <= 1, "{loads} loads, {steps} calls");
    assert!((cells[0]["invariance"].as_f64().unwrap() - 0.75).abs() < 1e-6);
}
