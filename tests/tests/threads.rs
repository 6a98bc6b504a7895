//! Scenario 2: a process with two named threads: every sample carries the
//! process's comm, the sampled thread's name and tid, and each thread's
//! spin function is attributed to that thread.

use std::time::Duration;

use burstyd_tests::*;

#[test]
fn thread_names_and_functions() {
    require_root();
    let exe = fixture("threads");
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s], Duration::from_secs(60));
    let scratch = Scratch::new("threads");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999"],
        &[exe_s],
        Duration::from_secs(180),
    );
    run.assert_ok();
    assert_eq!(
        run.finished.stdout_str(),
        untraced.stdout_str(),
        "stdout differs under burstyd"
    );

    let p = run.profile();
    assert_contract_shape(&p, "cpu-clock");
    for s in &p.samples {
        assert_eq!(
            s.label("comm"),
            Some("threads"),
            "comm must be the process name: {:?}",
            s.labels
        );
    }
    assert_two_named_threads(&run.traces(), &p);
}
