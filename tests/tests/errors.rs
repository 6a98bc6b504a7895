//! Scenario 6: error handling and event fallback; exit-code passthrough.

use std::time::Duration;

use burstyd_tests::*;

#[test]
fn missing_pid_is_an_error() {
    require_root();
    let pid = unused_pid().to_string();
    let scratch = Scratch::new("nopid");
    let run = burstyd(
        &scratch,
        &["--pid", &pid, "--duration", "1"],
        &[],
        Duration::from_secs(60),
    );
    assert!(
        !run.finished.status.success(),
        "--pid {pid} (no such pid) exited 0\n{}",
        run.finished.describe()
    );
    let all = format!("{}{}", run.finished.stdout_str(), run.finished.stderr).to_lowercase();
    assert!(
        all.contains("no such process"),
        "--pid {pid}: message lacks \"no such process\"\n{}",
        run.finished.describe()
    );
}

#[test]
fn hardware_event_falls_back_to_cpu_clock_without_pmu() {
    require_root();
    let _serial = serial();
    let pmu = host_has_pmu();
    let exe = fixture("call_chain");
    let scratch = Scratch::new("fallback");
    // ~0.5 s of CPU is enough here.
    let run = burstyd_run(
        &scratch,
        &["--event", "cycles"],
        &[exe.to_str().unwrap(), "200"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    let fell_back = run
        .finished
        .stderr
        .lines()
        .filter(|l| l.contains("falling back to cpu-clock"))
        .count()
        + run
            .finished
            .stdout_str()
            .lines()
            .filter(|l| l.contains("falling back to cpu-clock"))
            .count();
    let p = run.profile();
    let types: Vec<String> = p
        .sample_types
        .iter()
        .map(|(t, u)| format!("{t}/{u}"))
        .collect();
    if pmu {
        eprintln!("host has a PMU: expecting cycles");
        assert_eq!(
            fell_back,
            0,
            "host has a PMU but burstyd fell back:\n{}",
            run.finished.describe()
        );
        assert_contract_shape(&p, "cycles");
    } else {
        assert_eq!(
            fell_back,
            1,
            "no PMU here (perf_event_open of cycles fails): want exactly one \"falling back to cpu-clock\" line\n{}",
            run.finished.describe()
        );
        assert_contract_shape(&p, "cpu-clock");
        assert!(
            !types.iter().any(|t| t.starts_with("cycles")),
            "sample types {types:?} claim cycles"
        );
    }
    if let Some(pt) = &p.raw.period_type {
        let pt = p.string(pt.r#type);
        assert_eq!(pt, if pmu { "cycles" } else { "cpu-clock" }, "period_type");
    }
    // pprof reads it without complaint.
    let _ = run.traces();
}

#[test]
fn run_passes_the_exit_code_through() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("exitcode");
    let run = burstyd_run(
        &scratch,
        &[],
        &["/bin/sh", "-c", "exit 7"],
        Duration::from_secs(60),
    );
    assert_eq!(
        run.finished.status.code(),
        Some(7),
        "burstyd run -- sh -c 'exit 7'\n{}",
        run.finished.describe()
    );
}

#[test]
fn run_of_a_missing_program_fails_promptly() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("noprog");
    // run_timeout fails the test if burstyd hangs.
    let run = burstyd_run(
        &scratch,
        &[],
        &["/nonexistent/burstyd-test-prog"],
        Duration::from_secs(60),
    );
    // As a shell: 127, and no profile of a command that never ran.
    assert_eq!(
        run.finished.status.code(),
        Some(127),
        "burstyd run of a missing program\n{}",
        run.finished.describe()
    );
    assert!(
        !run.out_dir.join("context.pb.gz").exists(),
        "a profile of a command that never ran"
    );
    // One that cannot be executed: 126.
    let run = burstyd_run(&scratch, &[], &["/etc/passwd"], Duration::from_secs(60));
    assert_eq!(
        run.finished.status.code(),
        Some(126),
        "{}",
        run.finished.describe()
    );
}

/// A reader that stops reading (`| head -1`) ends a report normally: exit
/// status 0, no panic. The CFG of python3.11's interpreter loop as
/// Graphviz is some 2 MB, far more than a pipe holds.
#[test]
fn a_closed_stdout_is_a_normal_end() {
    use std::io::{BufRead, BufReader};
    let python = installed("/usr/bin/python3.11", "python3.11");
    let mut child = std::process::Command::new(burstyd_bin())
        .args([
            "analyze",
            "--function",
            "_PyEval_EvalFrameDefault",
            "--dot",
            python,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The read end is closed here.
    let out = child.wait_with_output().unwrap();
    assert!(first.starts_with("digraph"), "{first}");
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Log lines are plain text off a terminal: a file, a pipe, the journal
/// get no terminal escape sequences (colour).
#[test]
fn log_lines_have_no_colour_off_a_terminal() {
    require_root();
    let scratch = Scratch::new("nocolour");
    let run = burstyd_run(
        &scratch,
        &["--no-bursts"],
        &["true"],
        Duration::from_secs(60),
    );
    run.assert_ok();
    assert!(!run.finished.stderr.is_empty());
    assert!(
        !run.finished.stderr.contains('\x1b'),
        "escape bytes in the log: {:?}",
        tail(&run.finished.stderr, 3)
    );
}
