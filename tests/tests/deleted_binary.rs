//! A target whose executable was deleted (or replaced) after it started —
//! the everyday case of a service upgraded in place — still symbolizes:
//! burstyd opens the mapped file through /proc/PID/map_files.

use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;

#[test]
fn deleted_executable_still_symbolizes() {
    require_root();
    let spinner = fixture("spinner");
    let scratch = Scratch::new("deleted");
    let copy = scratch.join("spinner-upgraded-away");
    std::fs::copy(&spinner, &copy).unwrap();
    let target = Background::spawn(Command::new(&copy).arg("60"));
    target.wait_exec(&copy);
    std::fs::remove_file(&copy).unwrap();

    let pid = target.pid().to_string();
    let run = burstyd(
        &scratch,
        &["--pid", &pid, "--duration", "2", "--freq", "499"],
        &[],
        Duration::from_secs(120),
    );
    run.assert_ok();
    let traces = run.traces();
    let total = count_where(&traces, |_| true);
    let hot = count_where(&traces, |t| {
        t.frames.iter().any(|f| f == "spinner_hot_loop")
    });
    assert!(
        total > 0 && hot * 10 >= total * 8,
        "only {hot} of {total} samples in spinner_hot_loop of the deleted binary\n{}",
        describe_traces(&traces, 10)
    );
    let p = run.profile();
    assert!(
        p.mapping_files()
            .iter()
            .any(|f| f.contains("spinner-upgraded-away")),
        "mapping of the deleted file missing: {:?}",
        p.mapping_files()
    );
}
