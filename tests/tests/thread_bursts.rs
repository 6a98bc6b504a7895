//! Several bursts at once in one process, one per thread: eight threads
//! that are busy for different fractions of the time all get bursts, in
//! proportion to their CPU time, and their paths are told apart by thread
//! in `paths.pb.gz` (read back with `go tool pprof`).
use std::collections::BTreeMap;
use std::time::Duration;

use burstyd_tests::pprof::read_profile;
use burstyd_tests::*;

/// Bursts per thread id, and the most bursts that were running at once
/// (the `running` count each START record carries: the bursts running in
/// the process right after its slot was claimed, itself included), from
/// `bursts.jsonl`.
fn bursts_per_tid(jsonl: &str) -> (BTreeMap<i64, u64>, u64) {
    let mut per_tid = BTreeMap::new();
    let mut most = 0;
    for line in jsonl.lines().filter(|l| l.contains(r#""burst":"start""#)) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        let tid = v["tid"].as_i64().unwrap_or_else(|| panic!("{line}"));
        *per_tid.entry(tid).or_insert(0) += 1;
        most = most.max(v["running"].as_u64().unwrap_or_else(|| panic!("{line}")));
    }
    (per_tid, most)
}

/// Done-means 1: eight busy threads doing unequal amounts of work
/// (thread `mix-i` runs i + 1 units per round), traced with bursts.
/// - the program's output is the same as untraced;
/// - every thread appears in the path profile (`thread` label, through
///   `go tool pprof -traces`);
/// - each thread's share of the *bursts* (START records in
///   `bursts.jsonl`, by tid) is within a factor 1.5 of its share of the
///   *stack samples* (`context.pb.gz`, by its `thread` label);
/// - more than one burst ran at once at some point: a START record says
///   two or more were running when it began (and the daemon's own count
///   agrees).
#[test]
fn busy_threads_get_bursts_in_proportion_to_their_cpu_time() {
    require_root();
    let _serial = serial();
    let exe = fixture("thread_mix");
    let prog = [exe.to_str().unwrap()];
    let untraced = run_untraced(&prog, Duration::from_secs(120));
    let scratch = Scratch::new("thread_bursts");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999", "--save-bursts"],
        &prog,
        Duration::from_secs(240),
    );
    run.assert_ok();
    assert_eq!(
        run.finished.stdout_str(),
        untraced.stdout_str(),
        "thread_mix's output under bursty tracing differs from its untraced output\n{}",
        run.finished.describe()
    );
    let stderr = &run.finished.stderr;
    let summary = read_summary(&run.out_dir);
    let (t, line) = (summary.traced(), summary.traced().describe());
    assert!(t.taken() >= 200, "{line}");
    assert_eq!(t.records_lost(), 0, "{line}");
    let names: Vec<String> = (0..8).map(|i| format!("mix-{i}")).collect();

    // Stack samples per thread, and each thread's tid.
    let ctx = run.profile();
    let mut samples: BTreeMap<String, i64> = BTreeMap::new();
    let mut tid_of: BTreeMap<String, i64> = BTreeMap::new();
    for s in &ctx.samples {
        let Some(th) = s.label("thread").filter(|t| t.starts_with("mix-")) else {
            continue;
        };
        *samples.entry(th.to_owned()).or_insert(0) += ctx.weight(s);
        if let Some(&tid) = s.num_labels.get("tid") {
            assert_eq!(*tid_of.entry(th.to_owned()).or_insert(tid), tid, "{th}");
        }
    }
    assert_eq!(
        samples.keys().cloned().collect::<Vec<_>>(),
        names,
        "{samples:?}"
    );

    // Every thread is in the path profile, by name and with its tid.
    let paths = run.out_dir.join("paths.pb.gz");
    let (_, traces) =
        gopprof::traces(&paths, Some("executions")).unwrap_or_else(|e| panic!("{e:#}"));
    let mut executions: BTreeMap<String, i64> = BTreeMap::new();
    for t in &traces {
        if let Some(th) = t.label("thread").filter(|t| t.starts_with("mix-")) {
            *executions.entry(th.to_owned()).or_insert(0) += t.count();
        }
    }
    assert_eq!(
        executions.keys().cloned().collect::<Vec<_>>(),
        names,
        "threads in paths.pb.gz: {executions:?}\n{}",
        describe_traces(&traces, 12)
    );
    let p = read_profile(&paths).unwrap_or_else(|e| panic!("{e:#}"));
    for s in &p.samples {
        if let (Some(th), Some(tid)) = (s.label("thread"), s.num_labels.get("tid"))
            && let Some(want) = tid_of.get(th)
        {
            assert_eq!(tid, want, "{th}'s paths carry another tid");
        }
    }

    // Bursts per thread against stack samples per thread.
    let jsonl = std::fs::read_to_string(run.out_dir.join("bursts.jsonl")).unwrap();
    let (per_tid, most_running) = bursts_per_tid(&jsonl);
    let bursts: BTreeMap<String, u64> = names
        .iter()
        .map(|n| (n.clone(), per_tid.get(&tid_of[n]).copied().unwrap_or(0)))
        .collect();
    let total_bursts: u64 = bursts.values().sum();
    let total_samples: i64 = samples.values().sum();
    let mut table = String::new();
    for n in &names {
        let b = bursts[n] as f64 / total_bursts as f64;
        let s = samples[n] as f64 / total_samples as f64;
        table += &format!(
            "{n}: {} bursts ({:.1}%), {} samples ({:.1}%)\n",
            bursts[n],
            100.0 * b,
            samples[n],
            100.0 * s
        );
    }
    for n in &names {
        let b = bursts[n] as f64 / total_bursts as f64;
        let s = samples[n] as f64 / total_samples as f64;
        assert!(
            b <= 1.5 * s && s <= 1.5 * b,
            "{n}'s share of the bursts is not within a factor 1.5 of its share of the stack samples:\n{table}{line}"
        );
    }
    // The threads were busy for different fractions of the time.
    assert!(
        samples["mix-7"] as f64 >= 3.0 * samples["mix-0"] as f64,
        "{table}"
    );

    // More than one burst at once, from the records; the daemon's count
    // (the runtime's highest `active`) agrees.
    assert!(
        most_running >= 2,
        "no START record saw another burst running\n{table}"
    );
    let at_once = stderr
        .lines()
        .find_map(|l| {
            l.split("at most ")
                .nth(1)?
                .split(" bursts ran at once")
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| {
            panic!(
                "no \"at most N bursts ran at once\" line:\n{}",
                tail(stderr, 20)
            )
        });
    assert!(
        (most_running..=4).contains(&at_once),
        "at once: {at_once}, START records: {most_running}"
    );
    eprintln!("{table}bursts at once: {at_once} (START records: {most_running})");
}

/// Backpressure: the daemon stops draining (SIGSTOP for 2 s) while eight
/// threads take bursts. The handler declines new bursts once a sub-ring is
/// more than half full ("daemon behind"), so no burst runs into a full
/// ring: no record is lost, none truncated by a full ring, and the
/// program's output is as untraced.
#[test]
fn a_daemon_that_falls_behind_loses_no_records() {
    require_root();
    let _serial = serial();
    let exe = fixture("thread_mix");
    let prog = [exe.to_str().unwrap(), "500"];
    let untraced = run_untraced(&prog, Duration::from_secs(120));
    let scratch = Scratch::new("thread_bursts_behind");
    let out = scratch.join("out");
    let (stdout, stderr) = (scratch.join("stdout"), scratch.join("stderr"));
    let mut child = std::process::Command::new(burstyd_bin())
        .args(["run", "--freq", "999", "-o"])
        .arg(&out)
        .arg("--")
        .args(prog)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(&stderr)
        .unwrap()
        .contains("bursty tracing: ")
    {
        assert!(
            std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "never attached:\n{}",
            std::fs::read_to_string(&stderr).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let status = child.wait().unwrap();
    let err = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        status.success(),
        "burstyd failed: {status}\n{}",
        tail(&err, 30)
    );
    assert_eq!(
        std::fs::read_to_string(&stdout).unwrap(),
        untraced.stdout_str(),
        "thread_mix's output under bursty tracing differs from its untraced output"
    );
    let summary = read_summary(&out);
    let (t, line) = (summary.traced(), summary.traced().describe());
    assert!(
        t.declined("behind") > 0,
        "the daemon was stopped for 2 s but no burst was declined for it: {line}"
    );
    assert_eq!(t.records_lost(), 0, "{line}");
    assert_eq!(t.truncated(), 0, "{line}");
    eprintln!("{line}");
}
