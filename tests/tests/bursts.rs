//! Bursty tracing of live processes: clones injected, bursts started by the
//! eBPF overflow program, path profiles written; the traced program's output
//! is byte-identical to its untraced output, across attach/detach cycles and
//! a SIGKILLed daemon.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burstyd_tests::pprof::read_profile;
use burstyd_tests::*;

#[test]
fn bursts_record_paths_and_keep_output_identical() {
    require_root();
    let _serial = serial();
    let exe = fixture("bursty");
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s, "150"], Duration::from_secs(60));
    let scratch = Scratch::new("bursts");
    let run = burstyd_run(
        &scratch,
        &["--freq", "499", "--save-bursts", "--path-time"],
        &[exe_s, "150"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(
        run.finished.stdout_str(),
        untraced.stdout_str(),
        "output differs under bursty tracing\n{}",
        run.finished.describe()
    );
    let summary = read_summary(&run.out_dir);
    let traced = summary.traced();
    assert!(traced.taken() >= 20, "{}", traced.describe());
    assert_eq!(traced.records_lost(), 0, "{}", traced.describe());
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    // classify's switch on x & 7 splits into 8 paths per branch of the
    // x % 3 test; x runs through consecutive integers, so the 8 switch
    // cases are equally frequent: each of the 8 heaviest classify paths
    // must be within a factor 1.6 of the others.
    let mut classify: Vec<i64> = counts
        .iter()
        .filter(|(k, _)| k.starts_with("classify path "))
        .map(|(_, v)| *v)
        .collect();
    classify.sort_unstable_by(|a, b| b.cmp(a));
    assert!(classify.len() >= 8, "{counts:#?}");
    let top8 = &classify[..8];
    assert!(
        top8[0] as f64 <= top8[7] as f64 * 1.6 && top8[7] >= 50,
        "switch cases not uniform: {top8:?}\n{counts:#?}"
    );
    // The sampled event is attributed to paths: the second value, summed,
    // is most of the event the stack samples of the program saw.
    let paths = read_profile(&run.out_dir.join("paths.pb.gz")).unwrap();
    let ctx = run.profile();
    assert_eq!(paths.sample_types.len(), 4, "{:?}", paths.sample_types);
    let event = paths.sample_types[1].0.clone();
    // Each path's time, measured in bursts with the time-stamp counter;
    // then the executions recorded (before the estimator's weights).
    assert_eq!(
        paths.sample_types[2],
        ("measured-time".to_string(), "nanoseconds".to_string())
    );
    assert_eq!(
        paths.sample_types[3],
        ("recorded".to_string(), "count".to_string())
    );
    let recorded: i64 = paths.samples.iter().map(|s| s.values[3]).sum();
    let estimated: i64 = paths.samples.iter().map(|s| s.values[0]).sum();
    // Span weights only ever add (each at least 1; rounding aside).
    assert!(
        recorded > 0 && estimated as f64 >= 0.99 * recorded as f64,
        "estimated {estimated}, recorded {recorded}"
    );
    let measured: i64 = paths.samples.iter().map(|s| s.values[2]).sum();
    assert!(measured > 0, "no path time measured");
    let on_paths: i64 = paths.samples.iter().map(|s| s.values[1]).sum();
    let ci = ctx.value_index(&event).expect("event in context.pb.gz");
    let sampled: i64 = ctx.samples.iter().map(|s| s.values[ci]).sum();
    assert!(
        on_paths as f64 >= 0.5 * sampled as f64 && on_paths as f64 <= 1.01 * sampled as f64,
        "{event} on paths {on_paths} vs sampled {sampled}"
    );
    // Paths name their blocks' source lines.
    assert!(
        counts
            .keys()
            .any(|k| k.contains(": L") && !k.contains("L0")),
        "{counts:#?}"
    );
    // go tool pprof reads it.
    let top =
        gopprof::top(&run.out_dir.join("paths.pb.gz"), None).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        top.1.iter().any(|r| r.name.contains("classify path")),
        "{:?}",
        top.1
    );
    // `burstyd hot-paths` reads it: its totals are the profile's, the
    // classify paths are among the hottest by executions, and a context
    // profile is refused with a clear error.
    let paths_file = run.out_dir.join("paths.pb.gz");
    let report = run_timeout(
        Command::new(burstyd_bin())
            .args([
                "hot-paths",
                "--json",
                "--metric",
                "executions",
                "--top",
                "30",
            ])
            .arg(&paths_file),
        Duration::from_secs(60),
    );
    assert!(report.status.success(), "{}", report.describe());
    let r: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let executions: i64 = paths.samples.iter().map(|s| s.values[0]).sum();
    assert_eq!(r["total"].as_i64(), Some(executions), "{r}");
    assert_eq!(r["executions"].as_i64(), Some(executions), "{r}");
    assert_eq!(r["paths"].as_u64(), Some(counts.len() as u64), "{r}");
    let top = top_names(&r);
    assert!(
        top.iter()
            .filter(|n| n.starts_with("classify path "))
            .count()
            >= 8,
        "{top:?}"
    );
    let refused = run_timeout(
        Command::new(burstyd_bin())
            .arg("hot-paths")
            .arg(run.profile_path()),
        Duration::from_secs(60),
    );
    assert!(
        !refused.status.success() && refused.stderr.contains("not a burstyd path profile"),
        "{}",
        refused.describe()
    );
    // Raw traces: bursts start, enter functions, end paths.
    let jsonl = std::fs::read_to_string(run.out_dir.join("bursts.jsonl")).unwrap();
    assert!(jsonl.lines().any(|l| l.contains("\"burst\":\"start\"")));
    assert!(jsonl.lines().any(|l| l.contains("\"path\":")));
    // Each path's measured time follows its record.
    assert!(jsonl.lines().any(|l| l.contains("\"cost\":")));
    for l in jsonl.lines().take(1000) {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{l}: {e}"));
    }
}

/// In a raw trace: (UNWIND records, those whose landing left the clones —
/// the END that `rt_unwind` writes right after its UNWIND when the target
/// has no clone, reason `END_LEFT_CLONES` —, and how many of the first paths the landing function records after
/// one — at the depth the jump left, not in a callee — are complete or
/// partial).
fn landings(jsonl: &std::path::Path) -> (usize, usize, usize, usize) {
    let recs: Vec<serde_json::Value> = std::fs::read_to_string(jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let (mut unwinds, mut left, mut valid, mut partial) = (0, 0, 0, 0);
    for (i, r) in recs.iter().enumerate() {
        if r.get("unwind").is_none() {
            continue;
        }
        unwinds += 1;
        // An END of another reason right after is the handler's, later: the
        // thread left the clones somewhere after the landing, before its
        // next record (a paused burst), not at it.
        left += usize::from(recs.get(i + 1).is_some_and(|n| {
            n["burst"] == "end"
                && n["reason"].as_u64() == Some(burstyd_common::burst::END_LEFT_CLONES)
        }));
        let mut depth = 0usize;
        for r in &recs[i + 1..] {
            if r.get("burst").is_some() || r.get("unwind").is_some() {
                break;
            }
            if r.get("enter").is_some() {
                depth += 1;
            } else if let Some(p) = r.get("path").and_then(|p| p.as_u64()) {
                if depth == 0 {
                    if p >= 1 << 63 {
                        partial += 1;
                    } else {
                        valid += 1;
                    }
                    break;
                }
                if matches!(r["kind"].as_u64(), Some(0 | 2)) {
                    depth -= 1;
                }
            }
        }
    }
    (unwinds, left, valid, partial)
}

fn spawn_fixture(args: &[&str]) -> std::process::Child {
    Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: std::process::Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "fixture failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `n` cycles of `burstyd --pid PID --duration SECS` on one running
/// process: (re-arms of the first injection, bursts taken). `state`
/// describes the target for a failure message.
fn attach_cycles(
    scratch: &Scratch,
    pid: &str,
    secs: &str,
    n: usize,
    mut state: impl FnMut() -> String,
) -> (usize, u64) {
    let (mut rearmed, mut bursts) = (0, 0);
    for i in 0..n {
        let run = burstyd(
            scratch,
            &["--pid", pid, "--duration", secs, "--freq", "999"],
            &[],
            Duration::from_secs(60),
        );
        assert!(
            run.finished.status.success() && !read_summary(&run.out_dir).processes().is_empty(),
            "cycle {i}: {}\n{}",
            state(),
            run.finished.describe()
        );
        if run.finished.stderr.contains("re-armed") {
            rearmed += 1;
        }
        bursts += read_summary(&run.out_dir).traced().taken();
    }
    (rearmed, bursts)
}

#[test]
fn twenty_attach_detach_cycles_during_one_run() {
    require_root();
    let _serial = serial();
    let exe = fixture("bursty");
    let exe_s = exe.to_str().unwrap();
    // About 24 s untraced: 20 cycles of 0.1 s take 10-15 s (each re-arms
    // the executable's clones at once, and ends while libc's are still
    // being analysed for the second step).
    let untraced = run_untraced(&[exe_s, "10000"], Duration::from_secs(120));
    let child = spawn_fixture(&[exe_s, "10000"]);
    let pid = child.id().to_string();
    let scratch = Scratch::new("attach-cycles");
    let mut child = child;
    let t0 = Instant::now();
    let (rearmed, bursts) = attach_cycles(&scratch, &pid, "0.1", 20, || {
        format!("fixture {:?}", child.try_wait())
    });
    assert!(
        t0.elapsed() < Duration::from_secs(40),
        "the fixture must still be running: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        rearmed, 19,
        "every attach after the first reuses the injected clones"
    );
    assert!(bursts >= 20, "{bursts} bursts in 20 attaches");
    assert_eq!(finish(child), untraced.stdout_str());
}

/// A daemon SIGKILLed while the target runs a burst: the burst goes on
/// on its own (its checks end it, its records go to a ring nobody reads)
/// and the target's output is unchanged. The kill comes once bursts have
/// run and right after one is seen running (long bursts make that
/// likely), so the test fails if nothing was injected or no burst ran.
#[test]
fn sigkilled_daemon_leaves_the_target_running_correctly() {
    use burstyd_common::burst::BurstControl;
    use std::mem::offset_of;
    require_root();
    let _serial = serial();
    let exe = fixture("bursty");
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s, "400"], Duration::from_secs(120));
    let child = spawn_fixture(&[exe_s, "400"]);
    let pid = child.id();
    let scratch = Scratch::new("sigkill");
    let mut daemon = Command::new(burstyd_bin())
        .args([
            "--pid",
            &pid.to_string(),
            "--freq",
            "999",
            "--burst",
            "100000",
            "-o",
        ])
        .arg(scratch.join("out"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let word = |f| control_word(pid, f).unwrap_or(0);
    let t0 = Instant::now();
    // (`active` is a u32: the low half of the word read.)
    loop {
        let seen = (
            word(offset_of!(BurstControl, bursts)),
            word(offset_of!(BurstControl, active)) & 0xffff_ffff,
        );
        if seen.0 >= 3 && seen.1 > 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no burst running after 60 s (bursts, running): {seen:?}"
        );
    }
    daemon.kill().unwrap();
    let _ = daemon.wait();
    assert_eq!(finish(child), untraced.stdout_str());
}

/// The control block word at `off` of `pid`'s burst region, read through
/// `/proc/PID/map_files` (the memfd's first mapping is the control page);
/// None before the region is mapped.
fn control_word(pid: u32, off: usize) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let range = maps
        .lines()
        .find(|l| l.contains("/memfd:burstyd-bursts"))?
        .split_whitespace()
        .next()?;
    let f = std::fs::File::open(format!("/proc/{pid}/map_files/{range}")).ok()?;
    let mut w = [0u8; 8];
    f.read_exact_at(&mut w, off as u64).ok()?;
    Some(u64::from_ne_bytes(w))
}

/// `--full-trace` makes a full ring wait for the daemon, but never for a
/// dead one: after a SIGKILL the target finds the tracer gone at its next
/// full ring (`kill(tracer, 0)`: ESRCH), stops waiting for good
/// (`wait_when_full` cleared) and counts what it cannot write as lost; its
/// output is unchanged.
#[test]
fn a_full_trace_does_not_wait_for_a_dead_daemon() {
    use burstyd_common::burst::BurstControl;
    use std::mem::offset_of;
    require_root();
    let _serial = serial();
    // `kernel`'s loop calls nothing: the trace runs in the clones for good
    // and fills the ring (a burst that calls code that is not instrumented
    // pauses there, and without the daemon's eBPF program it would never
    // resume and fill the ring).
    let exe = fixture("paths_known");
    let exe_s = exe.to_str().unwrap();
    let n = "120000000";
    let untraced = run_untraced(&[exe_s, n], Duration::from_secs(120));
    let child = spawn_fixture(&[exe_s, n]);
    let pid = child.id();
    let scratch = Scratch::new("sigkill-full");
    let mut daemon = Command::new(burstyd_bin())
        .args(["--pid", &pid.to_string(), "--full-trace", "-o"])
        .arg(scratch.join("out"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Armed for a full trace, and a burst (the trace) under way.
    let t0 = Instant::now();
    let word = |f| control_word(pid, f).unwrap_or(0);
    while word(offset_of!(BurstControl, bursts)) == 0
        || word(offset_of!(BurstControl, wait_when_full)) == 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no full-trace burst started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.kill().unwrap();
    let _ = daemon.wait();
    let t0 = Instant::now();
    loop {
        let waits = control_word(pid, offset_of!(BurstControl, wait_when_full))
            .expect("the target exited before it stopped waiting for the dead daemon");
        if waits == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the target still waits for the dead daemon after 30 s (lost records {})",
            word(offset_of!(BurstControl, lost_records))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(word(offset_of!(BurstControl, lost_records)) >= 1);
    assert_eq!(finish(child), untraced.stdout_str());
}

#[test]
fn cpp_exceptions_unwind_through_instrumented_frames() {
    require_root();
    let _serial = serial();
    let exe = fixture("throwing");
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s, "1500"], Duration::from_secs(60));
    let scratch = Scratch::new("throwing");
    // Long bursts: many exceptions are thrown while a thread runs in the
    // clones of `middle` and `outer`, which only pass them on. Without the
    // clones' unwind info registered the program would call terminate().
    let run = burstyd_run(
        &scratch,
        &["--freq", "999", "--burst", "100000"],
        &[exe_s, "1500"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(
        run.finished.stdout_str(),
        untraced.stdout_str(),
        "{}",
        run.finished.describe()
    );
    let summary = read_summary(&run.out_dir);
    let line = summary.traced().describe();
    // A burst of 100000 checks writes most of half a sub-ring, and the
    // handler declines bursts while one is more than half full: the
    // daemon drains rings that held many records again within 5 ms
    // (101-118 bursts here), not at the next 50 ms tick (19, with 844
    // signals declined as "daemon behind").
    assert!(summary.traced().taken() >= 40, "{line}");
    // Long bursts: many stack samples land in the clones; they must still
    // unwind (through the clones' registered unwind info, then the
    // original return addresses above) to main and name the original
    // functions.
    // (Stacks outside them -- the loader before main, the exit after it,
    // the injection's own mmap -- do not count.)
    let traces = run.traces();
    let ours: Vec<_> = traces
        .iter()
        .filter(|t| t.has("middle(long)") || t.has("outer(long)"))
        .collect();
    let with_main = ours.iter().filter(|t| t.has("main")).count();
    assert!(ours.len() >= 20, "{} stacks in middle/outer", ours.len());
    // Samples inside a clone's snippets (a call's pushed return address,
    // the saved registers around a routine call, the return sequence)
    // unwind with rows moved by the snippet's stack height, and samples in
    // the runtime's routines with the routines' own rows: 954 of 954 such
    // stacks reached main in three runs here. Before the snippets had rows
    // of their own, 15-17% stopped after their leaf (26 of 259 in one CI
    // run, 59 of 374 in another). The one instruction left (the jump after
    // a return's `lea rsp`, whose return address is below `rsp`, outside
    // the sampled stack) is what the 2% allow.
    assert!(
        with_main * 100 >= ours.len() * 98,
        "{with_main} of {} stacks through middle/outer reach main",
        ours.len()
    );
    // The runtime's frames are named as such, and unwind (with the
    // routines' own rows) to the clone that called the routine and on to
    // main.
    let runtime: Vec<_> = traces
        .iter()
        .filter(|t| t.has("[burstyd burst runtime]"))
        .collect();
    assert!(
        !runtime.is_empty() && runtime.iter().all(|t| t.has("main")),
        "{} stacks through the runtime, {} of them reach main",
        runtime.len(),
        runtime.iter().filter(|t| t.has("main")).count()
    );
    assert!(
        traces
            .iter()
            .any(|t| t.has_chain(&["middle(long)", "outer(long)", "main"]))
    );
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    assert!(
        counts.keys().any(|k| k.starts_with("middle(long) path ")),
        "{counts:#?}"
    );
}

/// C++ exceptions in normal operation, through functions that have landing
/// pads (destructors, `try`/`catch`) and are cloned: throw, catch by type,
/// `catch (...)`, rethrow, nested `try`, destructors during unwinding, and
/// an exception escaping a `noexcept` function (`std::terminate`). Calls in
/// the clones push the original return address, so the unwinder finds each
/// frame's own FDE and call-site table and computes the original landing
/// pad; the unwinder (libgcc's, cloned) then jumps to that pad's clone, and
/// the burst goes on. The output (a checksum of which handlers and
/// destructors ran, in order) and the exit status are those of the
/// untraced run, with a full trace and with default bursts.
#[test]
fn exceptions_through_cloned_frames_with_landing_pads() {
    require_root();
    let _serial = serial();
    let exe = fixture("exceptions");
    let exe_s = exe.to_str().unwrap();
    // The full trace runs 300 thousand iterations (about 70,000 throws, all
    // traced: with 3000 it took 2 minutes); default bursts need the longer
    // run for their 10 bursts.
    for (name, extra, thousands) in [
        ("full", &["--freq", "999", "--full-trace"][..], "300"),
        ("bursts", &["--freq", "999"][..], "3000"),
    ] {
        let untraced = run_untraced(&[exe_s, "mix", thousands], Duration::from_secs(60));
        let scratch = Scratch::new(&format!("exceptions-{name}"));
        let run = burstyd_run(
            &scratch,
            extra,
            &[exe_s, "mix", thousands],
            Duration::from_secs(180),
        );
        run.assert_ok();
        assert_eq!(
            run.finished.stdout_str(),
            untraced.stdout_str(),
            "{name}: {}",
            run.finished.describe()
        );
        // A full trace no longer pauses at a throw: one burst may be all.
        let traced = read_summary(&run.out_dir).traced().describe();
        let want = if name == "full" { 1 } else { 10 };
        let taken = read_summary(&run.out_dir).traced().taken();
        assert!(taken >= want, "{name}: {traced}");
        // The functions with landing pads are cloned and traced.
        let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
        for f in [
            "nested(long)",
            "catcher(long)",
            "middle(long)",
            "leaf(long)",
        ] {
            assert!(
                counts.keys().any(|k| k.starts_with(&format!("{f} path "))),
                "{name}: no paths of {f}: {counts:#?}"
            );
        }
        // The unwinder is cloned too: its jump into the landing pad
        // (`rt_unwind`, an UNWIND record) continues in the landing pad's
        // clone; none leaves the burst there.
    }
    // The raw trace of a short full trace (the full trace above never
    // pauses now: its raw trace would take tens of GB).
    let scratch = Scratch::new("exceptions-raw");
    let untraced_short = run_untraced(&[exe_s, "mix", "2"], Duration::from_secs(60));
    let run = burstyd_run(
        &scratch,
        &["--freq", "999", "--full-trace", "--save-bursts"],
        &[exe_s, "mix", "2"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced_short.stdout_str());
    let (unwinds, left, valid, partial) = landings(&run.out_dir.join("bursts.jsonl"));
    assert!(unwinds >= 50, "{unwinds} unwinds");
    assert_eq!(left, 0, "{left} of {unwinds} landings left the clones");
    // The landing pad's clone starts a path there (its entry stub): the
    // catching function's path is complete.
    assert!(
        valid >= unwinds / 2 && partial == 0,
        "paths from landing pads: {valid} complete, {partial} partial, of {unwinds}"
    );

    // std::terminate from a noexcept frame: same output, exit status 3
    // (the fixture's terminate handler). 100 thousand iterations of `mix`
    // before it (about 23,000 throws, traced; 1000 thousand took 20 s).
    let untraced = run_timeout(
        Command::new(exe_s).args(["noexcept", "100"]),
        Duration::from_secs(60),
    );
    assert_eq!(untraced.status.code(), Some(3), "{}", untraced.describe());
    let scratch = Scratch::new("exceptions-noexcept");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999", "--full-trace"],
        &[exe_s, "noexcept", "100"],
        Duration::from_secs(180),
    );
    assert_eq!(
        run.finished.status.code(),
        Some(3),
        "{}",
        run.finished.describe()
    );
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
}

/// A jump table the analysis cannot bound (no guard, no mask: written in
/// assembly, `tests/fixtures/unguarded.c`): its entries are code pointers
/// the binary states, so the clone dispatches over them and each entry
/// starts a path. In a full trace the four cases' paths (and the four
/// paths from the entry to the jump that end there) count exactly 2, 2, 2
/// and 1 million for 7 million calls; the output is the same as untraced.
#[test]
fn an_unguarded_jump_table_is_traced_exactly() {
    require_root();
    let _serial = serial();
    let exe = fixture("unguarded");
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s, "7000000"], Duration::from_secs(60));
    let scratch = Scratch::new("unguarded");
    let run = burstyd_run(
        &scratch,
        &["--full-trace"],
        &[exe_s, "7000000"],
        Duration::from_secs(300),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    let mut hot: Vec<i64> = counts
        .iter()
        .filter(|(n, c)| n.starts_with("dispatch4 path ") && **c > 1000)
        .map(|(_, &c)| c)
        .collect();
    hot.sort_unstable();
    assert_eq!(
        hot,
        [1, 1, 2, 2, 2, 2, 2, 2].map(|m| m * 1_000_000),
        "dispatch4's paths: {counts:#?}"
    );
}

/// Fixture `name` with argument `n` under `burstyd run --full-trace`,
/// checked to exit as untraced with the same output (the scratch holds
/// the run's output directory).
fn full_trace_as_untraced(name: &str, n: i64) -> (BurstydRun, Scratch) {
    let exe = fixture(name);
    let exe_s = exe.to_str().unwrap();
    let arg = n.to_string();
    let untraced = run_untraced(&[exe_s, &arg], Duration::from_secs(60));
    let scratch = Scratch::new(name);
    let run = burstyd_run(
        &scratch,
        &["--freq", "999", "--full-trace"],
        &[exe_s, &arg],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    (run, scratch)
}

#[test]
fn full_trace_path_counts_are_exact() {
    require_root();
    let _serial = serial();
    let n: i64 = 1_200_000;
    let (run, _scratch) = full_trace_as_untraced("paths_known", n);
    assert_paths_known_counts(&run, n);
}

/// A function that falls through alignment padding into the next one
/// (`padded_fallthrough`'s `chk_copy`, glibc's `__memmove_chk_*`) has a
/// conditional jump whose two sides both leave it: the clone takes each
/// to its own side (`chk_fail` when the size is too big, `plain_copy`
/// else), as the original does. A full trace runs every call in the
/// clones: same output, and each call a path of both functions.
#[test]
fn a_fall_through_past_padding_goes_where_the_original_goes() {
    require_root();
    let _serial = serial();
    let n: i64 = 2_000_000;
    let (run, _scratch) = full_trace_as_untraced("padded_fallthrough", n);
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    let of = |f: &str| -> i64 {
        counts
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{f} path ")))
            .map(|(_, v)| *v)
            .sum()
    };
    // The trace starts at the first overflow, after some of the calls
    // (18% of 200,000 once, in a debug build on a loaded machine); from
    // there every call is a path of each (one may be partial).
    let (chk, plain) = (of("chk_copy"), of("plain_copy"));
    assert!(
        chk > n / 2 && chk <= n && (chk - plain).abs() <= 1,
        "chk_copy {chk}, plain_copy {plain} paths for {n} calls: {counts:#?}"
    );
}

/// The real programs of scripts/realprogs.sh with their arguments (output
/// to stdout) and an input size for one test run (a few tenths of a second
/// or more, so that burstyd attaches before the program ends even on a
/// loaded machine): bzip2, xz (liblzma through function pointers), gzip,
/// zstd (multi-threaded: a worker compresses) and lzip (C++).
const REAL_PROGRAMS: [(&str, &[&str], usize); 5] = [
    ("bzip2", &["-9", "-c"], 4 << 20),
    ("xz", &["-6", "-T1", "-c"], 2 << 20),
    ("gzip", &["-9", "-n", "-c"], 16 << 20),
    ("zstd", &["-q", "-12", "-T2", "-c"], 24 << 20),
    ("lzip", &["-2", "-c"], 2 << 20),
];

/// The real programs compress byte-identically under a full trace (every
/// path of one thread from the first burst on; on a quarter of the input,
/// as a full trace runs 10-25x slower) and under default bursts.
#[test]
fn real_programs_compress_identically_under_full_trace_and_bursts() {
    require_root();
    let _serial = serial();
    let bin = realprogs();
    let scratch = Scratch::new("real-full-trace");
    for (prog, args, size) in REAL_PROGRAMS {
        let exe = bin.join(prog);
        for (mode, size) in [
            (&["--full-trace"][..], size / 4),
            (&["--freq", "999"][..], size),
        ] {
            let input = scratch.join(&format!("{prog}-{size}.txt"));
            generate_text(&input, size, 3);
            let mut cmd: Vec<&str> = vec![exe.to_str().unwrap()];
            cmd.extend(args);
            cmd.push(input.to_str().unwrap());
            let untraced = run_untraced(&cmd, Duration::from_secs(120));
            let run = burstyd_run(&scratch, mode, &cmd, Duration::from_secs(300));
            run.assert_ok();
            assert!(
                run.finished.stdout == untraced.stdout,
                "{prog} {mode:?}: compressed output differs\n{}",
                run.finished.describe()
            );
            let summary = read_summary(&run.out_dir);
            let (t, line) = (summary.traced(), summary.traced().describe());
            assert!(t.taken() >= 1, "{prog} {mode:?}: {line}");
            assert_eq!(t.records_lost(), 0, "{prog} {mode:?}: {line}");
            let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
            assert!(!counts.is_empty(), "{prog} {mode:?}: no paths");
        }
    }
}

/// A real program compressing its stdin, fed by a thread from a text file
/// (cyclically) at a bounded rate until `stop`; the bytes fed and the
/// program's output come back from `finish`.
struct Fed {
    child: std::process::Child,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    feeder: std::thread::JoinHandle<Vec<u8>>,
    reader: std::thread::JoinHandle<Vec<u8>>,
}

impl Fed {
    fn spawn(cmd: &[&str], text: Vec<u8>) -> Fed {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, Ordering};
        let mut child = Command::new(cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let flag = stop.clone();
        let feeder = std::thread::spawn(move || {
            // 64 KiB every 16 ms: at most 4 MiB/s.
            let mut fed = Vec::new();
            for chunk in text.chunks(64 << 10).cycle() {
                if flag.load(Ordering::Relaxed) || stdin.write_all(chunk).is_err() {
                    break;
                }
                fed.extend_from_slice(chunk);
                std::thread::sleep(Duration::from_millis(16));
            }
            fed
        });
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            stdout.read_to_end(&mut out).unwrap();
            out
        });
        Fed {
            child,
            stop,
            feeder,
            reader,
        }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Stops feeding (closing stdin) and waits for the program: (input
    /// fed, its output).
    fn finish(self) -> (Vec<u8>, Vec<u8>) {
        let Fed {
            mut child,
            stop,
            feeder,
            reader,
        } = self;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let fed = feeder.join().unwrap();
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(t0.elapsed() < Duration::from_secs(300), "program hangs");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{status}");
        (fed, reader.join().unwrap())
    }
}

/// Each real program, compressing its stdin for one long run, survives 4
/// `burstyd --pid` attach/detach cycles and then a burstyd SIGKILLed
/// mid-run; its output equals the untraced output for the same input.
#[test]
fn real_programs_survive_attach_cycles_and_a_sigkilled_daemon() {
    require_root();
    let _serial = serial();
    let bin = realprogs();
    let scratch = Scratch::new("real-cycles");
    let text_path = scratch.join("text.txt");
    generate_text(&text_path, 8 << 20, 5);
    let text = std::fs::read(&text_path).unwrap();
    for (prog, args, _) in REAL_PROGRAMS {
        let exe = bin.join(prog);
        let mut cmd: Vec<&str> = vec![exe.to_str().unwrap()];
        cmd.extend(args);
        let mut fed = Fed::spawn(&cmd, text.clone());
        let pid = fed.child.id().to_string();
        // zstd's analysis and generation take most of 0.4 s on a loaded
        // machine. Four cycles: twenty_attach_detach_cycles_during_one_run
        // does twenty.
        let (rearmed, bursts) = attach_cycles(&scratch, &pid, "0.8", 4, || {
            format!("{prog} alive {}", fed.alive())
        });
        assert_eq!(
            rearmed, 3,
            "{prog}: attaches after the first reuse the clones"
        );
        assert!(bursts >= 4, "{prog}: {bursts} bursts in 4 attaches");

        let mut daemon = Command::new(burstyd_bin())
            .args(["--pid", &pid, "--freq", "999", "-o"])
            .arg(scratch.join("killed"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        daemon.kill().unwrap();
        let _ = daemon.wait();
        std::thread::sleep(Duration::from_millis(300));
        assert!(fed.alive(), "{prog} died with the daemon");

        let (input, traced) = fed.finish();
        // The same input on stdin (headers differ for a named file).
        let input_path = scratch.join("fed.txt");
        std::fs::write(&input_path, &input).unwrap();
        let untraced = Command::new(cmd[0])
            .args(&cmd[1..])
            .stdin(std::fs::File::open(&input_path).unwrap())
            .output()
            .unwrap();
        assert!(untraced.status.success(), "{untraced:?}");
        assert!(
            traced == untraced.stdout,
            "{prog}: output differs after attach cycles and SIGKILL ({} bytes fed)",
            input.len()
        );
    }
}

/// Runs gcc with `args`.
fn gcc(args: &[&std::ffi::OsStr]) {
    let cc = run_timeout(Command::new("gcc").args(args), Duration::from_secs(60));
    assert!(cc.status.success(), "{}", cc.describe());
}

/// `cmd` untraced, then under `burstyd run --full-trace --freq 999`.
fn full_trace(scratch: &Scratch, cmd: &[&str]) -> (Finished, BurstydRun) {
    let untraced = run_untraced(cmd, Duration::from_secs(60));
    let run = burstyd_run(
        scratch,
        &["--freq", "999", "--full-trace"],
        cmd,
        Duration::from_secs(120),
    );
    run.assert_ok();
    (untraced, run)
}

/// `llvm-bolt` (Debian's bolt-19, installed by scripts/setup.sh) takes
/// edges.fdata for a binary linked with --emit-relocs: every profiled
/// function matches (no stale profile), it reorders blocks, and the
/// optimized binary prints what the original prints. The same for a
/// shared library with its own `edges-<library>.fdata`.
#[test]
fn llvm_bolt_accepts_the_edge_profile() {
    require_root();
    let _serial = serial();
    let bolt = ["llvm-bolt-19", "llvm-bolt"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .expect("llvm-bolt not found: scripts/setup.sh installs bolt-19");
    let scratch = Scratch::new("bolt");
    let exe = scratch.join("paths_known");
    let src = workspace_root().join("tests/fixtures/paths_known.c");
    gcc(&[
        "-O2".as_ref(),
        "-g".as_ref(),
        "-Wl,--emit-relocs".as_ref(),
        "-o".as_ref(),
        exe.as_os_str(),
        src.as_os_str(),
    ]);
    let (untraced, run) = full_trace(&scratch, &[exe.to_str().unwrap(), "1200000"]);
    let fdata = run.out_dir.join("edges.fdata");
    let text = std::fs::read_to_string(&fdata).unwrap();
    assert!(text.lines().any(|l| l.starts_with("1 kernel ")), "{text}");
    let out = scratch.join("paths_known.bolt");
    let b = run_timeout(
        Command::new(bolt)
            .arg(&exe)
            .arg("-o")
            .arg(&out)
            .arg(format!("-data={}", fdata.display()))
            .args([
                "-reorder-blocks=ext-tsp",
                "-reorder-functions=hfsort",
                "-split-functions",
            ]),
        Duration::from_secs(120),
    );
    let log = format!("{}{}", b.stdout_str(), b.stderr);
    assert!(b.status.success(), "{}", b.describe());
    assert!(log.contains("have non-empty execution profile"), "{log}");
    assert!(!log.contains("invalid (possibly stale) profile"), "{log}");
    assert!(!log.contains("modified layout of 0 functions"), "{log}");
    let bolted = run_untraced(&[out.to_str().unwrap(), "1200000"], Duration::from_secs(60));
    assert_eq!(bolted.stdout_str(), untraced.stdout_str());

    // bzip2 (static functions, which BOLT names `name/N`) profiled in
    // default bursts: BOLT finds every function the profile names.
    let exe = realprogs().join("bzip2");
    let input = scratch.join("input.txt");
    generate_text(&input, 8 << 20, 9);
    let cmd = [exe.to_str().unwrap(), "-9", "-c", input.to_str().unwrap()];
    let untraced = run_untraced(&cmd, Duration::from_secs(60));
    let run = burstyd_run(&scratch, &["--freq", "999"], &cmd, Duration::from_secs(120));
    run.assert_ok();
    let fdata = run.out_dir.join("edges.fdata");
    let text = std::fs::read_to_string(&fdata).unwrap();
    let names: std::collections::BTreeSet<&str> =
        text.lines().filter_map(|l| l.split(' ').nth(1)).collect();
    assert!(names.contains("mainSort/1"), "{names:?}");
    let out = scratch.join("bzip2.bolt");
    let b = run_timeout(
        Command::new(bolt)
            .arg(&exe)
            .arg("-o")
            .arg(&out)
            .arg(format!("-data={}", fdata.display()))
            .args(["-reorder-blocks=ext-tsp", "-split-functions", "-v=1"]),
        Duration::from_secs(120),
    );
    let log = format!("{}{}", b.stdout_str(), b.stderr);
    assert!(b.status.success(), "{}", b.describe());
    // BOLT cannot optimise bzip2's `main` (its PIC jump table: "failed to
    // post-process indirect branches for main"), whether or not a burst
    // gave it paths; nor `register_tm_clones` (its indirect tail call),
    // which a burst that starts while libc's start-up code runs the
    // constructors can record, as it can `_init`. BOLT counts such a
    // function apart. Every other function of the profile must be matched.
    let not_simple: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| {
            // BOLT names a function with several symbols `name(*N)`.
            let why = format!("failed to post-process indirect branches for {n}");
            log.contains(&format!("{why}\n")) || log.contains(&format!("{why}(*"))
        })
        .collect();
    let matched = names.len() - not_simple.len();
    assert!(
        log.contains(&format!("BOLT-INFO: {matched} out of ")),
        "BOLT must match all {} functions of the profile but {not_simple:?}: {names:?}\n{log}",
        names.len()
    );
    if !not_simple.is_empty() {
        let n = not_simple.len();
        assert!(
            log.contains(&format!("BOLT-INFO: {n} function")),
            "{not_simple:?} are not simple to BOLT but it does not count them:\n{log}"
        );
    }
    assert!(!log.contains("was ignored"), "{log}");
    assert!(!log.contains("invalid (possibly stale) profile"), "{log}");
    let bolted = run_untraced(
        &[out.to_str().unwrap(), "-9", "-c", input.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert!(bolted.stdout == untraced.stdout, "the BOLTed bzip2 differs");

    // A shared library linked with --emit-relocs (paths_known.c as
    // libpk.so, its main renamed, called by a two-line executable): its
    // own edges-libpk.so.fdata is what BOLT takes for it, and the program
    // with the BOLTed library prints what it printed.
    let lib = scratch.join("libpk.so");
    gcc(&[
        "-O2".as_ref(),
        "-g".as_ref(),
        "-fPIC".as_ref(),
        "-shared".as_ref(),
        "-Wl,--emit-relocs".as_ref(),
        "-Dmain=paths_known_main".as_ref(),
        "-o".as_ref(),
        lib.as_os_str(),
        src.as_os_str(),
    ]);
    let main_c = scratch.join("pk.c");
    std::fs::write(
        &main_c,
        "int paths_known_main(int, char **);\n\
         int main(int c, char **v) { return paths_known_main(c, v); }\n",
    )
    .unwrap();
    let exe = scratch.join("pk");
    let libdir = format!("-L{}", scratch.join("").display());
    gcc(&[
        "-O2".as_ref(),
        "-o".as_ref(),
        exe.as_os_str(),
        main_c.as_os_str(),
        libdir.as_ref(),
        "-lpk".as_ref(),
        "-Wl,-rpath,$ORIGIN".as_ref(),
    ]);
    let (untraced, run) = full_trace(&scratch, &[exe.to_str().unwrap(), "1200000"]);
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let fdata = run.out_dir.join("edges-libpk.so.fdata");
    let text =
        std::fs::read_to_string(&fdata).unwrap_or_else(|e| panic!("{}: {e}", fdata.display()));
    assert!(
        text.lines().any(|l| l.starts_with("1 kernel ")),
        "{text}\n{}",
        tail(&run.finished.stderr, 20)
    );
    let bolted_dir = scratch.join("bolted");
    std::fs::create_dir_all(&bolted_dir).unwrap();
    let b = run_timeout(
        Command::new(bolt)
            .arg(&lib)
            .arg("-o")
            .arg(bolted_dir.join("libpk.so"))
            .arg(format!("-data={}", fdata.display()))
            .args(["-reorder-blocks=ext-tsp", "-split-functions"]),
        Duration::from_secs(120),
    );
    let log = format!("{}{}", b.stdout_str(), b.stderr);
    assert!(b.status.success(), "{}", b.describe());
    assert!(log.contains("shared object"), "{log}");
    assert!(log.contains("have non-empty execution profile"), "{log}");
    assert!(!log.contains("invalid (possibly stale) profile"), "{log}");
    assert!(!log.contains("modified layout of 0 functions"), "{log}");
    std::fs::copy(&exe, bolted_dir.join("pk")).unwrap();
    let bolted = run_untraced(
        &[bolted_dir.join("pk").to_str().unwrap(), "1200000"],
        Duration::from_secs(60),
    );
    assert_eq!(bolted.stdout_str(), untraced.stdout_str());
}

/// longjmp out of cloned frames in the middle of bursts: the shadow stack
/// drops the abandoned frames (by stack pointer) and the output stays the
/// same; long bursts so that many jumps happen inside one.
#[test]
fn longjmp_out_of_instrumented_frames() {
    require_root();
    let _serial = serial();
    let exe = fixture("longjmp");
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s, "1000"], Duration::from_secs(60));
    let scratch = Scratch::new("longjmp");
    for extra in [&["--burst", "100000"][..], &["--full-trace"][..]] {
        let mut args = vec!["--freq", "999"];
        args.extend_from_slice(extra);
        let run = burstyd_run(&scratch, &args, &[exe_s, "1000"], Duration::from_secs(120));
        run.assert_ok();
        assert_eq!(
            run.finished.stdout_str(),
            untraced.stdout_str(),
            "{extra:?}\n{}",
            run.finished.describe()
        );
        let taken = read_summary(&run.out_dir).traced().taken();
        assert!(taken >= 1, "{extra:?}: {taken} bursts");
        let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
        assert!(
            counts.keys().any(|k| k.starts_with("depth3 path ")),
            "{counts:#?}"
        );
    }
}

/// A burst that outruns the daemon fills the ring: it is truncated (the
/// program goes on in its original code), counted, and the records that
/// did not fit are counted as lost; the output is unchanged and the paths
/// recorded before the ring filled are in the profile.
#[test]
fn a_full_ring_truncates_the_burst_and_counts_it() {
    require_root();
    let _serial = serial();
    let exe = fixture("paths_known");
    let exe_s = exe.to_str().unwrap();
    let arg = "60000000";
    let untraced = run_untraced(&[exe_s, arg], Duration::from_secs(60));
    let scratch = Scratch::new("full-ring");
    // Bursts that never end by themselves: about 20 M paths/s instrumented
    // against a 256 Ki-record ring drained every 50 ms.
    let run = burstyd_run(
        &scratch,
        &["--freq", "99", "--burst", "4000000000000"],
        &[exe_s, arg],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let summary = read_summary(&run.out_dir);
    let (t, line) = (summary.traced(), summary.traced().describe());
    assert!(t.truncated() >= 1, "{line}");
    assert!(t.records_lost() >= 1, "{line}");
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    assert!(
        counts.keys().any(|k| k.starts_with("kernel path ")),
        "{counts:#?}"
    );
}

/// A stripped executable (no .symtab): functions come from its unwind
/// info, bursts run, the output is unchanged and paths are recorded.
#[test]
fn a_stripped_executable_is_traced_in_bursts() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("stripped");
    let exe = scratch.join("bursty-stripped");
    let st = run_timeout(
        Command::new("strip")
            .arg("-o")
            .arg(&exe)
            .arg(fixture("bursty")),
        Duration::from_secs(30),
    );
    assert!(st.status.success(), "{}", st.describe());
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s, "400"], Duration::from_secs(60));
    let run = burstyd_run(
        &scratch,
        &["--freq", "999"],
        &[exe_s, "400"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let summary = read_summary(&run.out_dir);
    let (t, line) = (summary.traced(), summary.traced().describe());
    assert!(t.taken() >= 1, "{line}");
    assert_eq!(t.records_lost(), 0, "{line}");
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    assert!(!counts.is_empty(), "{line}");
    // A function no symbol names carries one name, with its module, in
    // both profiles: `bursty-stripped!sub_<start>`.
    let unnamed = "bursty-stripped!sub_";
    let paths = read_profile(&run.out_dir.join("paths.pb.gz")).unwrap();
    // The executable's functions (libc's have names). Those the dynamic
    // section names keep their ELF names: `_init` (DT_INIT) and `_fini`
    // (DT_FINI, which a burst at the exit may reach).
    let path_fns: std::collections::BTreeSet<String> = paths
        .samples
        .iter()
        .map(|s| &s.frames[1])
        .filter(|f| f.mapping_file.ends_with("/bursty-stripped"))
        .map(|f| f.name())
        .filter(|n| n != "_init" && n != "_fini")
        .collect();
    assert!(
        !path_fns.is_empty() && path_fns.iter().all(|n| n.starts_with(unnamed)),
        "{path_fns:?}"
    );
    let context = read_profile(&run.profile_path()).unwrap();
    let names: std::collections::BTreeSet<String> = context
        .samples
        .iter()
        .flat_map(|s| s.names())
        .chain(paths.samples.iter().flat_map(|s| s.names()))
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with("sub_")),
        "a name without its module: {names:?}"
    );
    let in_context: std::collections::BTreeSet<String> =
        context.samples.iter().flat_map(|s| s.names()).collect();
    assert!(
        path_fns.iter().any(|n| in_context.contains(n)),
        "no function named alike in both: paths {path_fns:?}, context {in_context:?}"
    );
    // Without source lines the hot paths show their blocks' addresses
    // (as nm prints them: in the function, from its start on), not L0.
    let report = run_timeout(
        Command::new(burstyd_bin())
            .args(["hot-paths", "--json", "--top", "10"])
            .arg(run.out_dir.join("paths.pb.gz")),
        Duration::from_secs(60),
    );
    assert!(report.status.success(), "{}", report.describe());
    let r: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let top = top_names(&r);
    assert!(
        top.iter()
            .all(|n| !n.contains(": L0") && !n.contains("→L0")),
        "{top:?}"
    );
    let ours: Vec<&&str> = top.iter().filter(|n| n.starts_with(unnamed)).collect();
    assert!(!ours.is_empty(), "{top:?}");
    for name in ours {
        // `bursty-stripped!sub_1180 path 3: 0x1180→0x11a4`
        let (function, blocks) = name.split_once(": ").unwrap_or((name, ""));
        let start = function
            .strip_prefix(unnamed)
            .and_then(|f| f.split(' ').next())
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .unwrap_or_else(|| panic!("{name}"));
        let addrs: Vec<u64> = blocks
            .split('→')
            .map(|b| {
                b.strip_prefix("0x")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .unwrap_or_else(|| panic!("block {b:?} of {name}"))
            })
            .collect();
        assert!(
            !addrs.is_empty() && addrs.iter().all(|&a| a >= start),
            "{name}"
        );
    }
}

/// The traced process execs another program (same pid, new image: our
/// region and handler are gone, the signal's disposition is back to its
/// default, which would kill it). The eBPF program checks the control
/// block's magic word before signalling and the final detach leaves a
/// disposition that is not ours alone: the new program runs to the end
/// with its normal output.
#[test]
fn a_process_that_execs_is_left_alone() {
    require_root();
    let _serial = serial();
    let exe = fixture("bursty");
    let script = format!("sleep 0.7; exec {} 400", exe.display());
    let untraced = run_untraced(&[&exe.to_string_lossy(), "400"], Duration::from_secs(60));
    let scratch = Scratch::new("exec");
    // A high rate, so that overflows also land inside the execve itself
    // (a signal queued there would outlive the exec and kill the program).
    let run = burstyd_run(
        &scratch,
        &["--freq", "19999"],
        &["/bin/sh", "-c", &script],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let summary = read_summary(&run.out_dir);
    assert!(
        !summary.processes().is_empty(),
        "the shell was traced before its exec:\n{}",
        run.finished.describe()
    );
}

/// Two processes traced in one session: paths.pb.gz holds both (pid
/// labels), each gets its own edges-<pid>.fdata, and both run unharmed.
#[test]
fn two_processes_traced_in_one_session() {
    require_root();
    let _serial = serial();
    let exe = fixture("bursty");
    let exe_s = exe.to_str().unwrap();
    // About 2 s each: both still run when the attach comes (with 60,
    // 0.2 s, a loaded machine once saw the second one exit first).
    let untraced = run_untraced(&[exe_s, "600"], Duration::from_secs(60));
    let a = spawn_fixture(&[exe_s, "600"]);
    let b = spawn_fixture(&[exe_s, "600"]);
    let (pa, pb) = (a.id(), b.id());
    let scratch = Scratch::new("two-pids");
    let run = burstyd(
        &scratch,
        &[
            "--pid",
            &pa.to_string(),
            "--pid",
            &pb.to_string(),
            "--duration",
            "1",
            "--freq",
            "999",
        ],
        &[],
        Duration::from_secs(60),
    );
    run.assert_ok();
    assert_eq!(finish(a), untraced.stdout_str());
    assert_eq!(finish(b), untraced.stdout_str());
    let p = read_profile(&run.out_dir.join("paths.pb.gz")).unwrap();
    let pids: std::collections::BTreeSet<i64> = p
        .samples
        .iter()
        .filter_map(|s| s.num_labels.get("pid").copied())
        .collect();
    assert_eq!(
        pids,
        [i64::from(pa), i64::from(pb)].into_iter().collect(),
        "{}",
        run.finished.describe()
    );
    for pid in [pa, pb] {
        let f = run.out_dir.join(format!("edges-{pid}.fdata"));
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        assert!(text.starts_with("1 "), "{}: {text:?}", f.display());
    }
    assert!(run.out_dir.join("edges.fdata").exists());
}

/// Hot coverage is measured by samples, not functions: `interp` has 10
/// functions and only one is skipped (`plain`, for data in its code), but
/// that one holds about half of the time, and the summary says so — by
/// name and reason; `burstyd analyze --profile` finds the same offline.
#[test]
fn hot_coverage_weighs_functions_by_their_samples() {
    require_root();
    let _serial = serial();
    let exe = fixture("interp");
    let scratch = Scratch::new("hot-coverage");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999"],
        &[exe.to_str().unwrap(), "300"],
        Duration::from_secs(120),
    );
    run.assert_ok();
    let summary = read_summary(&run.out_dir);
    let t = summary.traced();
    let line = t.hot_coverage();
    let covered = t.exe_coverage_pct();
    assert!(
        (15.0..=85.0).contains(&covered),
        "instrumented share {covered}% is not about half: {line}"
    );
    assert!(t.exe_share_pct() >= 90.0, "{line}");
    let missed = t.missed_in_exe();
    let (name, plain_pct, why) = missed
        .first()
        .unwrap_or_else(|| panic!("no uninstrumented function: {line}"));
    assert!(
        name.starts_with("plain") && why.starts_with("skipped: data in code"),
        "{line}"
    );
    assert!(
        (covered + plain_pct - 100.0).abs() < 2.0,
        "instrumented {covered}% + {name} {plain_pct}% should make up the executable: {line}"
    );
    // `burstyd analyze --profile` finds the same from the written profile
    // (by the plan's analysed functions and the profile's addresses).
    let out = std::process::Command::new(burstyd_bin())
        .arg("analyze")
        .arg(&exe)
        .arg("--profile")
        .arg(run.out_dir.join("context.pb.gz"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let offline: f64 = text
        .lines()
        .find(|l| l.contains("of their weight lands in functions the rewriter instruments"))
        .and_then(|l| l.trim().split('%').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no hot coverage in analyze's output:\n{text}"));
    assert!(
        (offline - covered).abs() < 3.0,
        "analyze --profile says {offline}%, the run said {covered}%\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("%  {name}  (skipped: data in code"))),
        "{text}"
    );
}

/// Computed gotos: `interp`'s `run` dispatches with `goto *ops[*pc++]`, an
/// indirect jump no switch pattern explains; the labels stored in `ops`
/// are its targets. Each dispatch ends a path and each label starts one,
/// so in a full trace the six handler paths of the 6-op program run exactly
/// equally often (once per iteration, `add` twice as two paths), and the
/// output is the same traced (full trace and default bursts) as untraced.
#[test]
fn computed_goto_dispatch_is_traced_exactly() {
    require_root();
    let _serial = serial();
    let exe = fixture("interp");
    let exe_s = exe.to_str().unwrap();
    const UNITS: u32 = 100;
    let units = UNITS.to_string();
    // The full trace runs 100,000 iterations per call (not the default
    // 1,000,000): each traced call still gives each handler path 100,000
    // executions, far above the bound on volume below, and the trace of
    // the whole run takes seconds, not half a minute.
    let iterations = "100000";
    let untraced_short = run_untraced(&[exe_s, &units, iterations], Duration::from_secs(60));
    let scratch = Scratch::new("computed-goto");
    let run = burstyd_run(
        &scratch,
        &["--full-trace"],
        &[exe_s, &units, iterations],
        Duration::from_secs(300),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced_short.stdout_str());
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    let mut hot: Vec<(&String, i64)> = counts
        .iter()
        .filter(|(n, c)| n.starts_with("run path ") && **c > 1000)
        .map(|(n, &c)| (n, c))
        .collect();
    hot.sort_by_key(|&(_, c)| std::cmp::Reverse(c));
    assert_eq!(hot.len(), 6, "run's hot paths: {hot:?}\n{counts:#?}");
    // Once per iteration each; the `loop` handler's path back to `add`
    // misses the last iteration of each call (it goes to `halt`). The trace
    // pauses whenever `main` calls `plain`, which is not instrumented, and
    // resumes at the thread's next overflow, which may land inside `run`:
    // how much of each call is traced depends on when the overflows come
    // (and on how soon the attach finishes under load), so the bound on
    // volume is low; equality within one per call is what shows exactness.
    let (max, min) = (hot[0].1, hot[5].1);
    assert!(
        max - min <= UNITS as i64 + 2 && min >= 10_000,
        "the six handler paths should run equally often (once per iteration): {hot:?}"
    );
    // Default bursts: same output, bursts taken, `run` instrumented.
    let untraced = run_untraced(&[exe_s, &units], Duration::from_secs(60));
    let scratch = Scratch::new("computed-goto-bursts");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999"],
        &[exe_s, &units],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let summary = read_summary(&run.out_dir);
    let t = summary.traced();
    assert!(t.taken() >= 10, "{}", t.describe());
    assert!(
        !t.missed().iter().any(|(f, _)| f == "run"),
        "run is not instrumented: {}",
        t.hot_coverage()
    );
}

/// A jump into a function's `.cold` part and back stays in the clones:
/// `cold_parts`' `step` jumps to `step.cold` on every fourth call (GCC
/// moved the block that calls a `cold` function there), which jumps back
/// into the middle of `step`. In a full trace the burst runs through: the
/// path of `step` that ends at the jump, the paths of `step.cold` and the
/// path of `step` that starts where it comes back each run once per fourth
/// call, and `step`'s own path three times as often; the output is the
/// same as untraced. (When the jump ended the burst, `step.cold` had no
/// complete path at all.)
#[test]
fn jumps_into_cold_parts_and_back_stay_in_the_clones() {
    require_root();
    let _serial = serial();
    let exe = fixture("cold_parts");
    let exe_s = exe.to_str().unwrap();
    let calls = "10000000";
    let untraced = run_untraced(&[exe_s, calls], Duration::from_secs(60));
    let scratch = Scratch::new("cold-parts");
    let run = burstyd_run(
        &scratch,
        &["--full-trace"],
        &[exe_s, calls],
        Duration::from_secs(300),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    let of = |prefix: &str| -> Vec<i64> {
        let mut v: Vec<i64> = counts
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, &c)| c)
            .collect();
        v.sort_unstable();
        v
    };
    let cold: i64 = of("step.cold path ").iter().sum();
    let step = of("step path ");
    let rare: i64 = of("rare path ").iter().sum();
    assert!(cold >= 500_000, "step.cold ran {cold} paths: {counts:#?}");
    let near = |a: i64, b: i64| (a - b).abs() <= 4;
    assert!(
        step.len() == 3
            && near(step[0], cold)
            && near(step[1], cold)
            && near(step[2], 3 * cold)
            && near(rare, cold),
        "step's paths {step:?}, step.cold's {cold}, rare's {rare}: {counts:#?}"
    );
    // Default bursts: the same output.
    let scratch = Scratch::new("cold-parts-bursts");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999"],
        &[exe_s, calls],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let t = read_summary(&run.out_dir).traced().taken();
    assert!(t >= 10, "{t} bursts");
}

/// A `.cold` part that jumps back to a loop header its function's CFG
/// cannot take as a root (`cold_return`'s `scan`: the switch's table base
/// is loaded before the loop) lands on a block start of the clone all the
/// same, and the burst goes on: in a full trace `scan.cold` runs once per
/// 4 iterations, and so do the complete paths of cases 1 and 2 and case
/// 3's path to the jump into `scan.cold` (case 0's begin where the jump
/// back lands, with the path invalid). Before, the burst ended at each
/// jump back and the counts were a fraction of that.
#[test]
fn jumps_back_to_a_block_that_is_no_entry_stay_in_the_clones() {
    require_root();
    let _serial = serial();
    let exe = fixture("cold_return");
    let exe_s = exe.to_str().unwrap();
    const N: i64 = 4_000_000;
    let n = N.to_string();
    let scratch = Scratch::new("cold-return");
    let (untraced, run) = full_trace(&scratch, &[exe_s, &n]);
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    let cold: i64 = counts
        .iter()
        .filter(|(k, _)| k.starts_with("scan.cold path "))
        .map(|(_, &c)| c)
        .sum();
    let mut cases: Vec<i64> = counts
        .iter()
        .filter(|(k, c)| k.starts_with("scan path ") && **c >= N / 8)
        .map(|(_, &c)| c)
        .collect();
    cases.sort_unstable();
    assert!(
        cold == N / 4 && cases == [N / 4; 3],
        "scan.cold {cold}, scan's frequent paths {cases:?} (want {} each): {counts:#?}",
        N / 4
    );
}

/// A function with 2^70 paths (`manypaths`' `branchy`: 70 branches in a
/// row) is cut into regions and gets path numbers: in a full trace its
/// paths are recorded (each call crosses the same cut blocks, so the same
/// number of path records per call), none is malformed, and the output is
/// the same as untraced.
#[test]
fn functions_with_too_many_paths_are_cut_into_regions() {
    require_root();
    let _serial = serial();
    let exe = fixture("manypaths");
    let exe_s = exe.to_str().unwrap();
    let out = std::process::Command::new(burstyd_bin())
        .args(["analyze", "--function", "branchy", exe_s])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cut into regions at"), "{text}");
    let untraced = run_untraced(&[exe_s, "150000"], Duration::from_secs(60));
    let scratch = Scratch::new("manypaths");
    let run = burstyd_run(
        &scratch,
        &["--full-trace"],
        &[exe_s, "150000"],
        Duration::from_secs(300),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let summary = read_summary(&run.out_dir);
    let line = summary.traced().describe();
    assert_eq!(summary.traced().bad_records(), 0, "{line}");
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    let branchy: i64 = counts
        .iter()
        .filter(|(n, _)| n.starts_with("branchy"))
        .map(|(_, c)| c)
        .sum();
    // At least two path records (a region end, then the return) per call
    // for most of the calls.
    assert!(
        branchy >= 150_000,
        "{branchy} branchy paths for 150000 calls: {line}"
    );
}

/// The names of a `hot-paths --json` report's top paths.
fn top_names(r: &serde_json::Value) -> Vec<&str> {
    r["top"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect()
}
