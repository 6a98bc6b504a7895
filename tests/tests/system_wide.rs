//! Scenario 4: system-wide profiling (`burstyd --duration 3 -o OUT`) sees a
//! process it was not told about, with its pid label and functions.

use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;

#[test]
fn system_wide_sees_a_background_process() {
    require_root();
    let exe = fixture("spinner");
    // Runs well past burstyd's 3 s; killed when `bg` drops.
    let bg = Background::spawn(Command::new(&exe).arg("60"));
    bg.wait_exec(&exe);
    let pid = bg.pid().to_string();

    let scratch = Scratch::new("system_wide");
    let run = burstyd(
        &scratch,
        &["--duration", "3"],
        &[],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert!(
        run.finished.elapsed < Duration::from_secs(60),
        "--duration 3 took {:?}",
        run.finished.elapsed
    );
    let p = run.profile();
    assert_contract_shape(&p, "cpu-clock");
    let traces = run.traces();
    let total = count_where(&traces, |_| true);
    let ours = count_where(&traces, |t| t.label("pid") == Some(pid.as_str()));
    let ours_hot = count_where(&traces, |t| {
        t.label("pid") == Some(pid.as_str())
            && t.has_chain(&["spinner_hot_loop", "spinner_outer", "main"])
    });
    assert!(
        ours > 0,
        "no samples with pid={pid} (the background spinner) among {total}\n{}",
        describe_traces(&traces, 15)
    );
    assert!(
        ours_hot as f64 >= 0.8 * ours as f64,
        "only {ours_hot} of the spinner's {ours} samples have spinner_hot_loop <- spinner_outer <- main\n{}",
        describe_traces(&traces, 15)
    );
    for t in traces
        .iter()
        .filter(|t| t.label("pid") == Some(pid.as_str()))
    {
        assert_eq!(
            t.label("comm"),
            Some("spinner"),
            "comm of pid {pid}: {:?}",
            t.labels
        );
    }
    // The spinner ran on a core the whole time: it should have a real share.
    let pids: std::collections::BTreeSet<&str> =
        traces.iter().filter_map(|t| t.label("pid")).collect();
    eprintln!(
        "system-wide: {total} samples, {ours} of pid {pid}, {} pids",
        pids.len()
    );
    assert!(
        ours as f64 >= 0.2 * total as f64,
        "the spinner has only {ours} of {total} samples\n{}",
        describe_traces(&traces, 15)
    );
}
