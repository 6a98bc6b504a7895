//! A traced program cannot tell: each mode of the `transparency` fixture
//! observes something a stray burst signal would change (a short read, a
//! pending signal, a handler that runs too often, a death), and prints it.
//! Traced (`burstyd run`, default settings and `--freq 2000`, bursts on)
//! and untraced, stdout and exit status must be identical, and bursts must
//! really have run in the traced runs (else the comparison proves nothing).

use std::time::Duration;

use burstyd_tests::*;

/// The run's count of overflows that sent no burst signal for `reason`
/// (`signal_blocked`, `handler_replaced`, ...).
fn not_sent(s: &Summary, reason: &str) -> u64 {
    s.metric_by("burstyd_burst_signals_declined_total", reason)
}

/// Runs `transparency MODE UNITS` untraced, then traced at each setting
/// (plus `extra`); asserts identical stdout and exit status; returns the
/// traced runs' stderr and summaries.
fn compare_traced_and_untraced(mode: &str, units: &str, extra: &[&str]) -> Vec<(String, Summary)> {
    require_root();
    let _serial = serial();
    let exe = fixture("transparency");
    let prog = [exe.to_str().unwrap(), mode, units];
    let untraced = run_untraced(&prog, Duration::from_secs(120));
    assert!(
        untraced.status.success(),
        "{mode}: fails untraced\n{}",
        untraced.describe()
    );
    let mut stderrs = Vec::new();
    for settings in [&[][..], &["--freq", "2000"][..]] {
        let scratch = Scratch::new(&format!("transparency-{mode}"));
        let settings: Vec<&str> = settings.iter().chain(extra).copied().collect();
        let run = burstyd_run(&scratch, &settings, &prog, Duration::from_secs(180));
        let f = &run.finished;
        assert_eq!(
            (f.status.code(), f.stdout_str()),
            (untraced.status.code(), untraced.stdout_str()),
            "{mode} {settings:?}: traced differs from untraced\n{}",
            f.describe()
        );
        stderrs.push((f.stderr.clone(), read_summary(&run.out_dir)));
    }
    stderrs
}

/// [`compare_traced_and_untraced`], where bursts must really have run in
/// the traced runs (else the comparison proves nothing); returns their
/// summaries.
fn same_traced_and_untraced(mode: &str, units: &str) -> Vec<Summary> {
    let mut summaries = Vec::new();
    for (_, summary) in compare_traced_and_untraced(mode, units, &[]) {
        let t = summary.traced();
        assert!(
            t.taken() >= 1,
            "{mode}: no burst ran, nothing was tested: {}",
            t.describe()
        );
        summaries.push(summary);
    }
    summaries
}

/// A seccomp filter that kills on `memfd_create`: nothing is injected, the
/// program is sampled only, and the daemon says why, by syscall name.
/// (The fixture installs its filter in `main`: `--no-hold` attaches while
/// it runs, as `--pid` does; held at its entry point it has none yet.)
#[test]
fn a_seccomp_filter_keeps_the_injection_out() {
    for (stderr, summary) in compare_traced_and_untraced("seccomp", "40", &["--no-hold"]) {
        assert!(
            stderr.contains("seccomp filter")
                && stderr.contains("memfd_create")
                && stderr.contains("sampled only"),
            "{stderr}"
        );
        assert!(summary.samples() > 0, "{:#}", summary.json);
        assert!(summary.processes().is_empty(), "{:#}", summary.json);
    }
}

/// 32 MiB reads of /dev/zero, 1 MiB pipe writes to a slow reader,
/// 4 MiB getrandom, poll with a timeout: never short, never EINTR.
#[test]
fn system_calls_return_in_full() {
    for s in same_traced_and_untraced("syscalls", "40") {
        assert!(not_sent(&s, "in_kernel") >= 1, "{:#}", s.json);
    }
}

/// A program that resets every disposition to SIG_DFL mid-run is not
/// killed by the next burst signal.
#[test]
fn reset_dispositions_are_respected() {
    for s in same_traced_and_untraced("sigdfl", "60") {
        assert!(not_sent(&s, "handler_replaced") >= 1, "{:#}", s.json);
    }
}

/// A MINSIGSTKSZ alternate stack: the burst handler never runs on it.
#[test]
fn a_small_alternate_stack_is_not_used() {
    same_traced_and_untraced("altstack", "60");
}

/// Signals blocked: none of ours is queued (the program drains its
/// pending signals and finds none; its own sigqueue still fits).
#[test]
fn blocked_threads_get_no_signal() {
    for s in same_traced_and_untraced("blocked", "60") {
        assert!(not_sent(&s, "signal_blocked") >= 1, "{:#}", s.json);
    }
}

/// Signals blocked, then exec: the new image (default dispositions,
/// unblocked) does not die of a signal left pending.
#[test]
fn exec_after_blocking_inherits_no_pending_signal() {
    same_traced_and_untraced("blockexec", "60");
}

/// The program takes every real-time signal for itself mid-run: its
/// handler for our signal runs only when it raises it.
#[test]
fn a_taken_over_signal_is_not_sent() {
    for s in same_traced_and_untraced("rt", "60") {
        assert!(not_sent(&s, "handler_replaced") >= 1, "{:#}", s.json);
    }
}

/// Waits until thread `pid` is blocked in one of the system calls `nrs`
/// (`/proc/PID/syscall` starts with the number while it is).
/// What a program can see of its own code: calls in the clones push the
/// original return address, so `backtrace()` + `dladdr` name every caller;
/// a division that would fault in a clone leaves the clones first and
/// faults at its original address, which the SIGFPE handler's `dladdr`
/// names. Under a full trace too, where the thread spends most of the run
/// in the clones (thousands of faults and backtraces in bursts).
#[test]
fn return_and_fault_addresses_are_original() {
    for s in same_traced_and_untraced("observe", "20") {
        let t = s.traced();
        assert!(t.taken() >= 20, "{}", t.describe());
    }
    let _serial = serial();
    let exe = fixture("transparency");
    let prog = [exe.to_str().unwrap(), "observe", "20"];
    let untraced = run_untraced(&prog, Duration::from_secs(120));
    assert!(untraced.stdout_str().contains(" unnamed 0\n"));
    let scratch = Scratch::new("transparency-observe-full");
    let run = burstyd_run(
        &scratch,
        &["--freq", "2000", "--full-trace"],
        &prog,
        Duration::from_secs(180),
    );
    let f = &run.finished;
    assert_eq!(
        (f.status.code(), f.stdout_str()),
        (untraced.status.code(), untraced.stdout_str()),
        "full trace: traced differs from untraced\n{}",
        f.describe()
    );
    let t = read_summary(&run.out_dir).traced().taken();
    assert!(t >= 20, "{t} bursts\n{}", f.stderr);
}

fn wait_in_syscall(pid: u32, nrs: &[&str], what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let nr = std::fs::read_to_string(format!("/proc/{pid}/syscall"))
            .ok()
            .and_then(|s| s.split_whitespace().next().map(str::to_owned));
        if nr.is_some_and(|nr| nrs.contains(&nr.as_str())) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never saw pid {pid} in {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `burstyd --pid` attaches while the program waits in `epoll_wait` and
/// detaches (SIGINT) while it waits in `sigtimedwait`: both calls time out
/// as they do untraced (the kernel restarts neither after a ptrace stop;
/// attach and detach rerun them).
#[test]
fn blocking_waits_survive_attach_and_detach() {
    require_root();
    let _serial = serial();
    let exe = fixture("transparency");
    let prog = [exe.to_str().unwrap(), "idle", "3000"];
    let untraced = run_untraced(&prog, Duration::from_secs(60));
    let child = std::process::Command::new(&exe)
        .args(&prog[1..])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_in_syscall(pid, &["232", "281", "441"], "epoll_wait");
    let scratch = Scratch::new("transparency-idle");
    let out_dir = scratch.join("out");
    let daemon = std::process::Command::new(burstyd_bin())
        .args(["--pid", &pid.to_string(), "-o"])
        .arg(&out_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_in_syscall(pid, &["128"], "rt_sigtimedwait");
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGINT) };
    let daemon = daemon.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&daemon.stderr);
    let out = child.wait_with_output().unwrap();
    let summary = read_summary(&out_dir);
    assert!(
        summary
            .processes()
            .iter()
            .any(|p| p.metric("burstyd_traced_functions_rewritten") > 0),
        "the clones were never injected and removed: nothing was tested\n{stderr}"
    );
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
        ),
        (untraced.status.code(), untraced.stdout_str()),
        "the waits noticed the attach or the detach\n{stderr}"
    );
}

/// Two burstyd instances on one pid: the second finds the first's region
/// armed by a live burstyd, says so, and samples only; the first's bursts
/// go on.
#[test]
fn a_second_burstyd_samples_only() {
    require_root();
    let _serial = serial();
    let exe = fixture("transparency");
    let mut target = std::process::Command::new(&exe)
        .args(["blocked", "400"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = target.id().to_string();
    let scratch = Scratch::new("two-tracers");
    let first = std::process::Command::new(burstyd_bin())
        .args(["--pid", &pid, "-o"])
        .arg(scratch.join("first"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first instance's region appears in the target's maps; give it
    // the moment to finish arming.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .contains("burstyd-bursts")
    {
        assert!(std::time::Instant::now() < deadline, "never injected");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let second = burstyd(
        &scratch,
        &["--pid", &pid, "--duration", "1"],
        &[],
        Duration::from_secs(60),
    );
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(first.id() as i32, libc::SIGINT) };
    let first = first.wait_with_output().unwrap();
    let _ = target.kill();
    let _ = target.wait();
    let first_err = String::from_utf8_lossy(&first.stderr);
    second.assert_ok();
    assert!(
        second
            .finished
            .stderr
            .contains("already traced in bursts by another burstyd"),
        "{}",
        second.finished.describe()
    );
    let t = read_summary(&scratch.join("first")).traced().taken();
    assert!(t >= 1, "{t} bursts\n{first_err}");
}

/// `burstyd run` follows the command's children: 100 forked children that
/// live ~30 ms each, mostly gone before the daemon reads their maps, are
/// symbolized with their parent's maps (they forked without exec).
#[test]
fn short_lived_children_are_symbolized() {
    require_root();
    let _serial = serial();
    let exe = fixture("transparency");
    let scratch = Scratch::new("forks");
    let run = burstyd_run(
        &scratch,
        &[],
        &[exe.to_str().unwrap(), "forks", "100"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), "100 children exited 0\n");
    let traces = run.traces();
    let parent = traces
        .iter()
        .filter_map(|t| t.label("pid"))
        .min_by_key(|p| p.parse::<u32>().unwrap_or(u32::MAX))
        .unwrap()
        .to_string();
    // The children's own code: not the kernel's work of exiting them
    // (`do_exit`, about one sample per child, whose user stack is being
    // unmapped), which names no user function.
    let children: Vec<_> = traces
        .iter()
        .filter(|t| t.label("pid") != Some(parent.as_str()) && !t.has("do_exit"))
        .collect();
    let named = children
        .iter()
        .filter(|t| t.has("work") || t.has("mix"))
        .count();
    assert!(
        children.len() >= 50 && named * 10 >= children.len() * 9,
        "{named} of {} children's stacks name work/mix\n{}",
        children.len(),
        describe_traces(&traces, 10)
    );
}

/// Children forked from a hot loop, in the middle of the parent's bursts:
/// their results (exit statuses) are the same traced and untraced, and in
/// a full trace — where every fork happens inside a burst — none of the
/// work only children do reaches the parent's path profile (a child's
/// private burst state reads as zeros: it writes no record and leaves the
/// clones at its first check).
#[test]
fn children_forked_mid_burst_stay_out_of_the_parents_profile() {
    same_traced_and_untraced("forkhot", "40");
    let _serial = serial();
    let exe = fixture("transparency");
    let prog = [exe.to_str().unwrap(), "forkhot", "40"];
    let untraced = run_untraced(&prog, Duration::from_secs(120));
    let scratch = Scratch::new("transparency-forkhot-full");
    let run = burstyd_run(&scratch, &["--full-trace"], &prog, Duration::from_secs(300));
    run.assert_ok();
    assert_eq!(
        run.finished.stdout_str(),
        untraced.stdout_str(),
        "{}",
        run.finished.describe()
    );
    let names = path_counts(&run.out_dir.join("paths.pb.gz"));
    let of = |f: &str| -> i64 {
        names
            .iter()
            .filter(|(n, _)| {
                // "childwork path 3: ..." or "childwork.constprop.0 path 3: ..."
                n.strip_prefix(f)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('.'))
            })
            .map(|(_, c)| c)
            .sum()
    };
    assert!(
        of("forkhot") >= 1 && of("mix") >= 1000,
        "the parent's own paths are missing: {names:#?}"
    );
    assert_eq!(
        (of("childwork"), of("childmix")),
        (0, 0),
        "children's paths in the parent's profile: {names:#?}"
    );
}

/// posix_spawn and vfork + exec from a hot loop (children that share the
/// parent's memory until they exec): the same results traced.
#[test]
fn spawned_children_are_unaffected() {
    same_traced_and_untraced("spawns", "40");
}

/// A pre-fork server: the worker inherits the master's burst region. A
/// second burstyd on the worker refuses bursts with one clear line (the
/// region is the master's) and samples it; the master's trace goes on.
#[test]
fn a_worker_of_a_traced_master_is_sampled_only() {
    require_root();
    let _serial = serial();
    let exe = fixture("transparency");
    let exe_s = exe.to_str().unwrap().to_string();
    let scratch = Scratch::new("transparency-worker");
    let master_scratch = Scratch::new("transparency-master");
    let prog = exe_s.clone();
    let master = std::thread::spawn(move || {
        let run = burstyd_run(
            &master_scratch,
            &[],
            &[&prog, "worker", "400"],
            Duration::from_secs(120),
        );
        (run, master_scratch)
    });
    // The worker: a `transparency worker` whose parent is one too.
    let cmdline = |pid: &str| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let ours = |pid: &str| {
        let c = cmdline(pid);
        c.starts_with(exe_s.as_bytes()) && c.windows(7).any(|w| w == b"\0worker")
    };
    let t0 = std::time::Instant::now();
    let (worker, master_pid) = loop {
        let found = std::fs::read_dir("/proc").unwrap().find_map(|e| {
            let pid = e.ok()?.file_name().into_string().ok()?;
            if !ours(&pid) {
                return None;
            }
            let ppid = sys_ppid(&pid)?;
            ours(&ppid).then_some((pid, ppid))
        });
        if let Some(f) = found {
            break f;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no worker appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    let second = burstyd(
        &scratch,
        &["--pid", &worker, "--duration", "1"],
        &[],
        Duration::from_secs(60),
    );
    let f = &second.finished;
    assert!(f.status.success(), "{}", f.describe());
    assert!(
        f.stderr.contains(&format!(
            "inherited its burst region through fork from pid {master_pid}"
        )) && f.stderr.contains("sampled only"),
        "{}",
        f.describe()
    );
    assert!(
        second.profile_path().is_file(),
        "no profile\n{}",
        f.describe()
    );
    let (first, _master_scratch) = master.join().unwrap();
    first.assert_ok();
    assert_eq!(first.finished.stdout_str(), "worker exited 0\n");
    let t = read_summary(&first.out_dir).traced().taken();
    assert!(t >= 1, "{t} bursts\n{}", first.finished.stderr);
}

/// The parent pid of `pid`, from `/proc/PID/stat`.
fn sys_ppid(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1).map(str::to_string)
}
