//! Tuple profiles end to end (issue 34) on `tuples_known.c`, whose
//! tuples are known by construction: in `step`, the load of `cells[i & 3]`
//! gives 7 three times in four and 42 once, and the indirect call through
//! `table[i & 3]` goes to f1 half the time, to f2 and f3 a quarter each,
//! and the switch in `choose` (a jump table) to each of four cases a
//! quarter of the time.
//! A full trace with the exact sampler (from the first overflow on, so
//! not every step) counts each of them exactly: each value as its share
//! of the steps traced says, to within one, and both sites the same
//! steps; the program's output is the untraced one.
//!
//! The random and stratified samplers, each with its exact copies
//! (`--sampler-reference`), on the fixture's random indices: each
//! estimated share within its statistical bound of the exact copies'
//! share, which is within its own bound of the constructed one; under
//! `run` (a full trace) and `--pid` (bursts), the program's output the
//! untraced one.
use std::process::{Command, Stdio};
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

/// The fixture's output untraced, with `args`.
fn untraced(exe: &std::path::Path, args: &[&str], timeout: Duration) -> String {
    let r = run_timeout(Command::new(exe).args(args), timeout);
    assert!(r.status.success(), "{}", r.describe());
    r.stdout_str()
}

/// `burstyd run --exe-only --full-trace --record values,targets EXTRA`
/// on the fixture with `args`, whose output must be `want`: the scratch
/// directory and the output directory in it.
fn full_trace(
    name: &str,
    extra: &[&str],
    exe: &std::path::Path,
    args: &[&str],
    want: &str,
) -> (Scratch, std::path::PathBuf) {
    let scratch = Scratch::new(name);
    let out = scratch.join("out");
    let run = run_timeout(
        Command::new(burstyd_bin())
            .args([
                "run",
                "--exe-only",
                "--full-trace",
                "--record",
                "values,targets",
            ])
            .args(extra)
            .arg("-o")
            .arg(&out)
            .arg("--")
            .arg(exe)
            .args(args),
        Duration::from_secs(300),
    );
    assert!(run.status.success(), "{}", run.describe());
    assert_eq!(run.stdout_str(), want, "{name}");
    (scratch, out)
}

#[test]
fn a_full_trace_counts_the_known_tuples_exactly() {
    require_root();
    let _serial = serial();
    let exe = fixture("tuples_known");
    let n = 3_000_000u64;
    let args = [n.to_string()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let want = untraced(&exe, &args, Duration::from_secs(60));
    let (_scratch, out) = full_trace("tuples-known", &["--sampler", "exact"], &exe, &args, &want);

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

    // The switch in `choose` (a jump table): its four cases a quarter
    // of the steps each.
    jump_targets(&targets, "choose", steps, &[0.25, 0.25, 0.25, 0.25]);
    // The computed goto in `dispatch`: its labels A, B, C half, a quarter
    // and a quarter of the steps.
    jump_targets(&targets, "dispatch", steps, &[0.5, 0.25, 0.25]);
}

/// The one target site in `function` of report `targets`: executed once a
/// step (to within one), its targets named as places in `function`
/// (`function+0x..`), counted as `shares` (largest first) of its
/// executions to within one.
fn jump_targets(targets: &serde_json::Value, function: &str, steps: u64, shares: &[f64]) {
    let sites: Vec<_> = targets["top"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["function"].as_str() == Some(function))
        .collect();
    assert_eq!(sites.len(), 1, "the jump in {function}: {targets:#}");
    let jumps = sites[0]["executions"].as_u64().unwrap();
    assert!(jumps.abs_diff(steps) <= 1, "{jumps} jumps, {steps} calls");
    let mut counts: Vec<f64> = sites[0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert!(
                c["target"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{function}+0x")),
                "{c}"
            );
            c["executions"].as_u64().unwrap() as f64
        })
        .collect();
    counts.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(counts.len(), shares.len(), "{:#}", sites[0]);
    for (n, want) in counts.iter().zip(shares) {
        assert!((n - want * jumps as f64).abs() <= 1.0, "{:#}", sites[0]);
    }
}

/// The site in `step` of report `rep` whose values (`key`: `value`, or
/// `target` for a target's function) include each of `want`.
fn site_in_step<'a>(rep: &'a serde_json::Value, key: &str, want: &[&str]) -> &'a serde_json::Value {
    let sites: Vec<_> = rep["top"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["function"].as_str() == Some("step"))
        .filter(|s| {
            let vals = s["values"].as_array().unwrap();
            want.iter()
                .all(|w| vals.iter().any(|x| x[key].as_str() == Some(*w)))
        })
        .collect();
    assert_eq!(sites.len(), 1, "{want:?} in step: {rep:#}");
    sites[0]
}

/// Checks one site of a sampled profile with exact copies: each value's
/// estimated share is within its bound of its share in the exact copies
/// (5 standard deviations of a sampler that keeps one tuple in `rate`,
/// each standing for `rate`: `sqrt(rate · p / N)` for N executions, plus
/// `2 · rate / N` for the outputs a substream holds back), and that
/// share within 5 standard deviations of the constructed one (the
/// indices are drawn); and the site's estimated executions within the
/// same bound of the copies' (`sqrt(rate · N)`, `rate` per value), less
/// at most `lost` of them (outputs still in the merging table when the
/// process exits). Returns the site's executions in the copies.
fn check_site(
    site: &serde_json::Value,
    key: &str,
    want: &[(&str, f64)],
    rate: f64,
    lost: f64,
    how: &str,
) -> f64 {
    let n = site["reference_executions"]
        .as_u64()
        .unwrap_or_else(|| panic!("{how}: no exact copies: {site:#}")) as f64;
    assert!(n >= 5_000.0, "{how}: {n} executions in the exact copies");
    let est = site["executions"].as_u64().unwrap() as f64;
    let bound = 5.0 * (rate * n).sqrt() + rate * want.len() as f64;
    assert!(
        est <= n + bound && est >= n * (1.0 - lost) - bound,
        "{how}: {est} executions estimated, {n} exact"
    );
    let vals = site["values"].as_array().unwrap();
    for &(v, p) in want {
        let row = vals.iter().find(|x| x[key].as_str() == Some(v)).unwrap();
        let (est, exact) = (
            row["share"].as_f64().unwrap(),
            row["reference_share"].as_f64().unwrap(),
        );
        let sampled = 5.0 * (rate * p / n).sqrt() + 2.0 * rate / n;
        let drawn = 5.0 * (p * (1.0 - p) / n).sqrt();
        let why = format!(
            "{how}: {v}: estimated share {est:.4}, exact {exact:.4}, constructed {p} over {n} executions; bounds {sampled:.4} and {drawn:.4}"
        );
        assert!((est - exact).abs() <= sampled, "{why}");
        assert!((exact - p).abs() <= drawn, "{why}");
    }
    n
}

/// Checks the value and call-target profiles of `out` (a run with
/// `--sampler-reference` at rate 16; `lost` as [`check_site`] says).
fn check_sampled(out: &std::path::Path, lost: f64, how: &str) {
    let targets = report(out, true);
    assert!(targets["error"].is_object(), "{how}: {targets:#}");
    let call = site_in_step(&targets, "target", &["f1", "f2", "f3"]);
    let calls = check_site(
        call,
        "target",
        &[("f1", 0.5), ("f2", 0.25), ("f3", 0.25)],
        16.0,
        lost,
        how,
    );
    let values = report(out, false);
    let load = site_in_step(&values, "value", &["0x7", "0x2a"]);
    let loads = check_site(
        load,
        "value",
        &[("0x7", 0.75), ("0x2a", 0.25)],
        16.0,
        lost,
        how,
    );
    // Both sites run once a step (a burst may begin or end between them).
    assert!(
        (loads - calls).abs() <= 0.01 * calls,
        "{how}: {loads} loads, {calls} calls"
    );
}

#[test]
fn the_samplers_estimate_the_known_tuples_within_their_bounds() {
    require_root();
    let _serial = serial();
    let exe = fixture("tuples_known");
    let args = ["3000000", "random"];
    let want = untraced(&exe, &args, Duration::from_secs(60));
    for sampler in ["random", "stratified"] {
        let (_scratch, out) = full_trace(
            &format!("tuples-{sampler}"),
            &[
                "--sampler",
                sampler,
                "--sample-rate",
                "16",
                "--sampler-reference",
            ],
            &exe,
            &args,
            &want,
        );
        check_sampled(&out, 0.0, &format!("run, {sampler}"));
    }
}

/// The stratified sampler in bursts, attached with `--pid` to a process
/// that runs on: its estimates as bounded, its output the untraced one.
#[test]
fn the_stratified_sampler_in_bursts_under_pid() {
    require_root();
    let _serial = serial();
    let exe = fixture("tuples_known");
    let args = ["150000000", "random"];
    let want = untraced(&exe, &args, Duration::from_secs(120));
    let target = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = target.id().to_string();
    let scratch = Scratch::new("tuples-pid");
    let run = burstyd(
        &scratch,
        &[
            "--pid",
            &pid,
            "--exe-only",
            "--record",
            "values,targets",
            "--sampler",
            "stratified",
            "--sample-rate",
            "16",
            "--sampler-reference",
        ],
        &[],
        Duration::from_secs(120),
    );
    let out = target.wait_with_output().unwrap();
    run.assert_ok();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    let summary = read_summary(&run.out_dir);
    assert_eq!(summary.traced().records_lost(), 0);
    check_sampled(&run.out_dir, 0.1, "--pid, stratified");
}
