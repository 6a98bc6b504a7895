//! The estimates bursts give, against counts known by construction: the
//! five paths of `shares`'s loop, picked at random per iteration and
//! counted by the program itself, under default bursts, and the 95%
//! intervals `paths.pb.gz` gives them (label `ci95_ppm`); and `density`'s
//! two loops, equally often run and 30 times apart in checks per unit of
//! time, under either weighting of the bursts.
use std::process::Command;
use std::time::Duration;

use burstyd_tests::pprof::read_profile;
use burstyd_tests::*;

/// Every one of the five paths' estimated share of all executions lies
/// within twice its 95% interval of the truth (outside 3.9 standard
/// errors: one time in ten thousand), at least three of them within the
/// interval itself, and the intervals are neither zero nor useless (each
/// below 25% of the share, with thousands of bursts). The program's output
/// (its own counts) is its untraced output.
#[test]
fn the_intervals_hold_the_known_path_shares() {
    require_root();
    let _serial = serial();
    let exe = fixture("shares");
    let exe_s = exe.to_str().unwrap();
    // About 3 s of the loop under bursts: some 2,500 bursts at 997 Hz.
    let n = "150000000";
    let untraced = run_untraced(&[exe_s, n], Duration::from_secs(120));
    let scratch = Scratch::new("estimates-shares");
    let run = burstyd_run(
        &scratch,
        &["-F", "997"],
        &[exe_s, n],
        Duration::from_secs(300),
    );
    run.assert_ok();
    let out = run.finished.stdout_str();
    assert_eq!(out, untraced.stdout_str());
    // "shares N c0 c1 c2 c3 c4"
    let nums: Vec<f64> = out
        .split_whitespace()
        .skip(1)
        .map(|w| w.parse().unwrap())
        .collect();
    let mut truth: Vec<f64> = nums[1..].iter().map(|c| c / nums[0]).collect();
    truth.sort_by(|a, b| b.total_cmp(a));
    let p = read_profile(&run.out_dir.join("paths.pb.gz")).unwrap_or_else(|e| panic!("{e:#}"));
    let all: i64 = p.samples.iter().map(|s| s.values[0]).sum();
    // Per kernel path: (estimated executions, ci95 relative).
    let mut paths: std::collections::BTreeMap<i64, (i64, f64)> = Default::default();
    for s in &p.samples {
        if s.label("symbol") != Some("kernel") {
            continue;
        }
        let path = s.num_labels["path"];
        let ci = s.num_labels.get("ci95_ppm").copied().unwrap_or_else(|| {
            panic!(
                "kernel path {path} has no ci95_ppm label: {:?}",
                s.num_labels
            )
        });
        let e = paths.entry(path).or_insert((0, 0.0));
        e.0 += s.values[0];
        e.1 = ci as f64 / 1e6;
    }
    // The five body paths are the five most executed (the loop's entry
    // and exit paths run once); the two of 2/16 are alike: by rank.
    let mut top: Vec<(i64, f64)> = paths.values().copied().collect();
    top.sort_by_key(|t| std::cmp::Reverse(t.0));
    assert!(top.len() >= 5, "kernel paths: {paths:?}");
    top.truncate(5);
    let rows: Vec<String> = top
        .iter()
        .zip(&truth)
        .map(|((n, ci), t)| {
            let share = *n as f64 / all as f64;
            format!(
                "share {share:.5} (truth {t:.5}, off {:+.3}%) ±{:.3}%",
                100.0 * (share / t - 1.0),
                100.0 * ci
            )
        })
        .collect();
    let summary = read_summary(&run.out_dir);
    let why = format!(
        "kernel paths:\n  {}\n{}",
        rows.join("\n  "),
        summary.traced().describe()
    );
    let mut inside = 0;
    for ((n, ci), t) in top.iter().zip(&truth) {
        let off = (*n as f64 / all as f64 / t - 1.0).abs();
        assert!(*ci > 0.0 && *ci < 0.25, "an interval of ±{ci}: {why}");
        assert!(off <= 2.0 * ci, "a path outside twice its interval: {why}");
        if off <= *ci {
            inside += 1;
        }
    }
    // Calibrated 95% intervals leave all five inside with probability
    // 0.77, four 0.20, three 0.02: asking four failed one run in 44 by
    // design (3 of 5 once in the fresh-clone suite, 2026-11-29, each of
    // the two outside within 1.3 times its interval). Three fail one in
    // 800; a bias shows first against twice the interval (above).
    assert!(
        inside >= 3,
        "{inside} of 5 paths within their interval: {why}"
    );
}

/// The share of all estimated executions that `density`'s dense loop
/// holds in a `paths.pb.gz`, and the 95% interval (relative, from
/// `ci95_ppm`) of its most executed path, the loop's body.
fn dense_share(paths: &std::path::Path) -> (f64, f64) {
    let p = read_profile(paths).unwrap_or_else(|e| panic!("{e:#}"));
    // Without --path-time the default type is the sampled event's, the
    // second (readers take the last without one: the raw counts).
    assert_eq!(
        p.string(p.raw.default_sample_type),
        p.sample_types[1].0,
        "{:?}",
        p.sample_types
    );
    let all: i64 = p.samples.iter().map(|s| s.values[0]).sum();
    let dense: Vec<_> = p
        .samples
        .iter()
        .filter(|s| s.label("symbol") == Some("dense"))
        .collect();
    let top = dense
        .iter()
        .max_by_key(|s| s.values[0])
        .unwrap_or_else(|| panic!("no path of dense in {}", paths.display()));
    let ci = top.num_labels.get("ci95_ppm").copied().unwrap_or(0) as f64 / 1e6;
    let n: i64 = dense.iter().map(|s| s.values[0]).sum();
    (n as f64 / all as f64, ci)
}

/// `density` runs two loops equally often, one 30 times denser in checks
/// (in time) than the other: half of all executions are the dense loop's,
/// by construction. Counted alike (`--weights uniform`, the default),
/// bursts give it its share of the *time*, a few percent; weighted by
/// their paths' static cost (`--weights static`) the estimate is one
/// half within its interval, under `run` and under `--pid`. The output is
/// the untraced one.
#[test]
fn static_weights_undo_the_check_density_bias() {
    require_root();
    let _serial = serial();
    let exe = fixture("density");
    let exe_s = exe.to_str().unwrap();
    let rounds = "2000";
    let untraced = run_untraced(&[exe_s, rounds], Duration::from_secs(120));
    let mut shares = Vec::new();
    for weights in ["uniform", "static"] {
        let scratch = Scratch::new(&format!("estimates-density-{weights}"));
        let run = burstyd_run(
            &scratch,
            &["-F", "997", "--weights", weights],
            &[exe_s, rounds],
            Duration::from_secs(300),
        );
        run.assert_ok();
        assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
        let bursts = read_summary(&run.out_dir).traced().taken();
        shares.push((
            weights,
            dense_share(&run.out_dir.join("paths.pb.gz")),
            bursts,
        ));
    }
    // --pid, on a longer run of the same loops.
    let scratch = Scratch::new("estimates-density-pid");
    let target = Background::spawn(Command::new(exe_s).arg("60000"));
    target.wait_exec(&exe);
    let pid = target.pid().to_string();
    let run = burstyd(
        &scratch,
        &[
            "--pid",
            &pid,
            "--duration",
            "4",
            "-F",
            "997",
            "--weights",
            "static",
        ],
        &[],
        Duration::from_secs(120),
    );
    run.assert_ok();
    let bursts = read_summary(&run.out_dir).traced().taken();
    shares.push((
        "static --pid",
        dense_share(&run.out_dir.join("paths.pb.gz")),
        bursts,
    ));
    drop(target);
    let why = shares
        .iter()
        .map(|(w, (s, ci), b)| {
            format!(
                "{w}: dense {:.1}% ±{:.1}% of it, {b} bursts",
                100.0 * s,
                100.0 * ci
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    eprintln!("{why}");
    let (uniform, _) = shares[0].1;
    assert!(
        uniform < 0.4,
        "counted alike, off by more than 10 points: {why}"
    );
    for (_, (share, ci), _) in &shares[1..] {
        assert!(*ci > 0.0 && *ci < 0.25, "an interval of ±{ci}: {why}");
        assert!(
            (share / 0.5 - 1.0).abs() <= 2.0 * ci,
            "static weights: one half outside twice the interval: {why}"
        );
    }
}
