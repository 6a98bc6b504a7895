//! BOLT reads the call-target profile (issue 34): the indirect-call
//! records of `edges.fdata` give `llvm-bolt` the targets of
//! `icp_known.c`'s one hot indirect call site (`hot` six times in eight,
//! `warm` and `cold` once each), and its indirect call promotion turns the
//! two hottest into compares and direct calls. What is read is BOLT's own
//! output: the candidate site's targets with their calls and shares, its
//! statistics, and the promoted function as `-print-icp` prints it.
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;

/// BOLT's `  NAME, calls = N, mispreds = M, taken freq = P%` lines (the
/// targets of an ICP candidate, printed with `-v=1`): calls per target.
fn candidate_targets(log: &str) -> BTreeMap<String, u64> {
    log.lines()
        .filter_map(|l| l.strip_prefix("BOLT-INFO:   "))
        .filter_map(|l| {
            let (name, rest) = l.split_once(", calls = ")?;
            let (calls, _) = rest.split_once(',')?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

#[test]
fn llvm_bolt_promotes_the_indirect_call_the_target_profile_saw() {
    require_root();
    let _serial = serial();
    let bolt = ["llvm-bolt-19", "llvm-bolt"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .expect("llvm-bolt not found: scripts/setup.sh installs bolt-19");
    // Linked with --emit-relocs (its `// link:` line), as BOLT wants.
    let exe = fixture("icp_known");
    let exe_s = exe.to_str().unwrap();
    let n = 10_000_000u64;
    let arg = n.to_string();
    let untraced = run_untraced(&[exe_s, &arg], Duration::from_secs(60));
    let scratch = Scratch::new("bolt-icp");
    let run = burstyd_run(
        &scratch,
        &[
            "--freq",
            "999",
            "--exe-only",
            "--full-trace",
            "--record",
            "targets",
            "--sampler",
            "exact",
        ],
        &[exe_s, &arg],
        Duration::from_secs(300),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let fdata = run.out_dir.join("edges.fdata");

    let out = scratch.join("icp_known.bolt");
    let b = run_timeout(
        Command::new(bolt)
            .arg(&exe)
            .arg("-o")
            .arg(&out)
            .arg(format!("-data={}", fdata.display()))
            // The two hottest targets, whatever their share of the calls.
            .args([
                "-indirect-call-promotion=calls",
                "-icp-calls-topn=2",
                "-icp-calls-total-percent-threshold=1",
                "-icp-calls-remaining-percent-threshold=1",
                "-print-icp",
                "-v=1",
            ]),
        Duration::from_secs(120),
    );
    let log = format!("{}{}", b.stdout_str(), b.stderr);
    assert!(b.status.success(), "{}", b.describe());
    assert!(!log.contains("invalid (possibly stale) profile"), "{log}");
    assert!(
        log.contains("BOLT-INFO: ICP total indirect callsites with profile = 1\n"),
        "BOLT saw no profiled indirect call:\n{log}"
    );
    assert!(log.contains("BOLT-INFO: ICP succeeded in step @ "), "{log}");

    // The site's targets as BOLT read them: `hot` three calls in four (the
    // trace starts at any step of the cycle of eight), and the next
    // hottest, `warm` or `cold`, one in eight.
    let targets = candidate_targets(&log);
    let total: u64 = log
        .split("BOLT-INFO: ICP Total indirect calls = ")
        .nth(1)
        .and_then(|s| s.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no total of indirect calls:\n{log}"));
    // The trace starts at the first overflow, after the attach.
    assert!(total > n / 4 && total <= n, "{total} calls of {n} steps");
    assert_eq!(targets.len(), 2, "the two targets promoted: {targets:?}");
    let hot = targets["hot"] as f64;
    assert!((hot - 0.75 * total as f64).abs() <= 8.0, "{targets:?}");
    let next = ["warm", "cold"]
        .iter()
        .find_map(|t| targets.get(*t))
        .copied()
        .unwrap_or_else(|| panic!("neither warm nor cold: {targets:?}"));
    assert!(
        (next as f64 - 0.125 * total as f64).abs() <= 8.0,
        "{targets:?}"
    );
    // BOLT's own count of the calls the two promoted targets take.
    assert!(
        log.contains("BOLT-INFO: ICP percentage of indirect calls that can be optimized = 87.5%"),
        "{log}"
    );
    // The promoted `step`: a compare against `hot` and a direct call to it
    // before the indirect call that is left.
    let step = log
        .split("Binary Function \"step\" after indirect-call-promotion {")
        .nth(1)
        .and_then(|s| s.split("End of Function").next())
        .unwrap_or_else(|| panic!("no promoted step:\n{log}"));
    assert!(step.contains("cmpq\t$hot, "), "{step}");
    assert!(step.contains("callq\thot\n"), "{step}");

    let bolted = run_untraced(&[out.to_str().unwrap(), &arg], Duration::from_secs(60));
    assert_eq!(bolted.stdout_str(), untraced.stdout_str());
}
