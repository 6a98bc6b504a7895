//! Scenario 5: `burstyd --pid P --duration 3` profiles P and its threads
//! only, while another busy process runs next to it.

use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;

#[test]
fn pid_mode_profiles_only_that_process_and_its_threads() {
    require_root();
    let _serial = serial();
    let threads = fixture("threads");
    let spinner = fixture("spinner");
    // `threads 100000` runs far longer than the test; killed on drop.
    let target = Background::spawn(Command::new(&threads).arg("100000"));
    let other = Background::spawn(Command::new(&spinner).arg("60"));
    target.wait_exec(&threads);
    other.wait_exec(&spinner);
    // Let the threads start and name themselves.
    std::thread::sleep(Duration::from_millis(200));
    let pid = target.pid().to_string();

    let scratch = Scratch::new("pid_mode");
    let run = burstyd(
        &scratch,
        &["--pid", &pid, "--duration", "3"],
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
    let foreign = count_where(&traces, |t| t.label("pid") != Some(pid.as_str()));
    assert_eq!(
        foreign,
        0,
        "--pid {pid}: {foreign} of {total} samples are of other processes\n{}",
        describe_traces(&traces, 15)
    );
    assert!(total > 0, "no samples");
    for s in &p.samples {
        assert_eq!(s.label("comm"), Some("threads"), "{:?}", s.labels);
    }
    assert_two_named_threads(&traces, &p);
}

/// A `--pid` target that exits while its parent (here the test) has not
/// reaped it yet — a zombie until after burstyd ends, as a script waiting
/// on both would have it: the session ends once the target exits, with
/// its profile, and does not wait for the reaping.
#[test]
fn a_target_that_exits_unreaped_ends_the_session() {
    require_root();
    let _serial = serial();
    let pk = fixture("paths_known");
    // About half a second of work, then exit; reaped only at the end.
    let mut child = Command::new(&pk)
        .arg("160000000")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let scratch = Scratch::new("pid_mode_zombie");
    let run = burstyd(
        &scratch,
        // (Sampling alone: an attach for bursts under way at the end is
        // waited for, which is not what this measures.)
        &["--pid", &pid, "--freq", "999", "--no-bursts"],
        &[],
        Duration::from_secs(60),
    );
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let _ = child.wait();
    run.assert_ok();
    // Still unreaped when burstyd ended: a zombie.
    assert!(
        state.split(") ").nth(1).is_some_and(|s| s.starts_with('Z')),
        "the target was not a zombie when burstyd ended: {state}"
    );
    assert!(
        run.finished.elapsed < Duration::from_secs(20),
        "burstyd took {:?} to end after its target exited",
        run.finished.elapsed
    );
    let summary = burstyd_tests::summary::read_summary(&run.out_dir);
    assert!(summary.samples() > 0, "no samples of the target");
}
