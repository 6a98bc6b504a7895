//! Bursts follow exec: under `burstyd run`, a command that execs another
//! program (`sh -c "exec prog"`, `env`, a chain of both) and the children
//! a command forks and execs are traced in bursts in the programs they
//! exec, each with its own entry in `summary.json` and its paths in
//! `paths.pb.gz`; their output stays the untraced one's.
//!
//! The program is `paths_known` with a long loop (about a second and a
//! half of CPU): its `kernel` function's paths are what bursts must find.

use std::time::Duration;

use burstyd_tests::summary::read_summary;
use burstyd_tests::*;

/// `paths_known`'s loop count: about 1.4 s of CPU here, long enough for
/// the attach after the exec (the executable's clones come from the plan
/// cache or a short analysis).
const N: &str = "480000000";

/// Runs `prog` untraced and under `burstyd run --freq 999` and checks the
/// output is the same; returns the traced run.
fn traced_as_untraced(scratch: &Scratch, prog: &[&str]) -> BurstydRun {
    let untraced = run_untraced(prog, Duration::from_secs(120));
    let run = burstyd_run(scratch, &["--freq", "999"], prog, Duration::from_secs(300));
    run.assert_ok();
    assert_eq!(
        run.finished.stdout_str(),
        untraced.stdout_str(),
        "{prog:?}: the output under `burstyd run` differs from the untraced output\n{}",
        run.finished.describe()
    );
    run
}

/// The summary's processes that ran `paths_known`, each with bursts taken
/// and paths recorded; asserts there are `n` of them and that the path
/// profile has `kernel`'s paths.
fn assert_bursts_in_paths_known(run: &BurstydRun, n: usize) {
    let summary = read_summary(&run.out_dir);
    let procs = summary.processes();
    let all: Vec<String> = procs.iter().map(|p| p.describe()).collect();
    let pk: Vec<_> = procs
        .iter()
        .filter(|p| p.exe().ends_with("/paths_known"))
        .collect();
    assert_eq!(
        pk.len(),
        n,
        "{n} traced processes running paths_known expected; the summary has:\n{}\n{}",
        all.join("\n"),
        run.finished.describe()
    );
    for p in &pk {
        assert!(
            p.taken() > 0 && p.paths() > 0,
            "no bursts in the exec'd program: {}\n{}",
            p.describe(),
            run.finished.describe()
        );
        assert_eq!(p.records_lost(), 0, "{}", p.describe());
    }
    assert!(
        summary.metric_by("burstyd_execs_total", "traced") >= n as u64,
        "{}",
        all.join("\n")
    );
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    assert!(
        counts.keys().any(|k| k.starts_with("kernel path ")),
        "no path of paths_known's kernel in paths.pb.gz: {:?}",
        counts.keys().take(20).collect::<Vec<_>>()
    );
}

/// `sh -c "<before> paths_known N"` under `run`: the program takes
/// bursts.
fn shell_execs(name: &str, before: &str) {
    require_root();
    let _g = serial();
    let pk = fixture("paths_known");
    let scratch = Scratch::new(name);
    let script = format!("{before} {} {N}", pk.display());
    let run = traced_as_untraced(&scratch, &["/bin/sh", "-c", &script]);
    assert_bursts_in_paths_known(&run, 1);
}

#[test]
fn bursts_follow_a_shell_that_execs_the_program() {
    shell_execs("exec-sh", "exec");
}

#[test]
fn bursts_follow_a_chain_of_execs() {
    // sh execs env, which execs the program: env runs for a moment, so
    // its own attach may still be under way when it execs.
    shell_execs("exec-env", "exec /usr/bin/env BURSTYD_TEST=1");
}

#[test]
fn bursts_follow_the_workers_a_command_forks_and_execs() {
    require_root();
    let _g = serial();
    let pk = fixture("paths_known");
    let fe = fixture("forkexec");
    let scratch = Scratch::new("exec-workers");
    let run = traced_as_untraced(
        &scratch,
        &[fe.to_str().unwrap(), "3", pk.to_str().unwrap(), N],
    );
    assert_bursts_in_paths_known(&run, 3);
}

/// `--pid` on a shell that execs the program once it is traced: the
/// session goes on with the program, which takes bursts, and ends when
/// it exits.
#[test]
fn bursts_follow_an_exec_under_pid() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    require_root();
    let _g = serial();
    let pk = fixture("paths_known");
    let untraced = run_untraced(&[pk.to_str().unwrap(), N], Duration::from_secs(120));
    // The shell waits for a line on its standard input, then execs.
    let script = format!("read line; exec {} {N}", pk.display());
    let mut child = Command::new("/bin/sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let scratch = Scratch::new("exec-pid");
    let out = scratch.join("out");
    let mut daemon = Command::new(burstyd_bin())
        .args(["--pid", &pid.to_string(), "--freq", "999", "-o"])
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Traced: the burst region is mapped in the shell.
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .contains("/memfd:burstyd-bursts")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the shell was not traced within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        untraced.stdout_str()
    );
    let t1 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = daemon.try_wait().unwrap() {
            break s;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(60),
            "burstyd --pid did not end within 60 s of its target"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut daemon.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        status.success(),
        "burstyd failed: {status}\n{}",
        tail(&err, 30)
    );
    let run = BurstydRun {
        finished: Finished {
            status,
            stdout: Vec::new(),
            stderr: err,
            elapsed: t0.elapsed(),
        },
        out_dir: out,
    };
    assert_bursts_in_paths_known(&run, 1);
}

/// Children killed while burstyd attaches to the program they exec'd
/// (SIGKILL 0 to 190 ms after their start, some during the attach's
/// ptrace stop): each is reaped by its parent as untraced. A tracee that
/// dies under the attach must be waited for by its tracer, or its
/// parent's `waitpid` never returns (found by Python's test_subprocess,
/// `test_threadsafe_wait`, under bursts; this is its pattern).
#[test]
fn children_killed_during_their_attach_are_reaped() {
    require_root();
    let _g = serial();
    let py = installed("/usr/bin/python3.11", "python3.11");
    let script = r#"
import subprocess, sys, time
for i in range(40):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(12)"])
    time.sleep(0.01 * (i % 20))
    p.kill()
    try:
        print(i, "reaped", p.wait(timeout=20), flush=True)
    except subprocess.TimeoutExpired:
        print(i, "NOT reaped after 20 s", flush=True)
        sys.exit(1)
"#;
    let scratch = Scratch::new("exec-killed");
    traced_as_untraced(&scratch, &[py, "-c", script]);
}
