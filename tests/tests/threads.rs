//! Scenario 2: a process with two named threads: every sample carries the
//! process's comm, the sampled thread's name and tid, and each thread's
//! spin function is attributed to that thread.

use burstyd_tests::*;

#[test]
fn thread_names_and_functions() {
    require_root();
    let (run, _untraced, _scratch) = profile_fixture("threads");

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
