//! How a session ends and what it leaves behind: SIGTERM/SIGINT flush the
//! last profile, `--interval` writes one profile per interval whose samples
//! add up to the final one, an unprivileged user gets a clear error.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burstyd_tests::*;

/// Starts `burstyd --pid P -o OUT EXTRA...` in the background, lets it
/// sample for `secs`, sends `signal`, and waits for it.
fn run_until_signal(
    scratch: &Scratch,
    pid: u32,
    extra: &[&str],
    secs: u64,
    signal: i32,
) -> Finished {
    let out = scratch.join("out");
    let mut child = Command::new(burstyd_bin())
        .args(["--pid", &pid.to_string(), "-o"])
        .arg(&out)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning burstyd");
    std::thread::sleep(Duration::from_secs(secs));
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "burstyd did not exit within 30 s of signal {signal}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Finished {
        status: out.status,
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
    }
}

#[test]
fn sigterm_flushes_and_intervals_add_up() {
    require_root();
    let _serial = serial();
    let exe = fixture("spinner");
    let target = Background::spawn(Command::new(&exe).arg("30"));
    target.wait_exec(&exe);
    let scratch = Scratch::new("sigterm");
    let f = run_until_signal(
        &scratch,
        target.pid(),
        &["--interval", "1", "--freq", "499"],
        4,
        libc::SIGTERM,
    );
    assert!(
        f.status.success(),
        "burstyd after SIGTERM:\n{}",
        f.describe()
    );
    let out = scratch.join("out");
    let total = pprof::read_profile(&out.join("context.pb.gz"))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", f.describe()));
    let mut intervals: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("context-") && n.ends_with(".pb.gz")
        })
        .collect();
    intervals.sort();
    assert!(
        intervals.len() >= 3,
        "4 s at --interval 1 wrote {} interval profiles\n{}",
        intervals.len(),
        f.describe()
    );
    let sum: i64 = intervals
        .iter()
        .map(|p| pprof::read_profile(p).unwrap().total_samples())
        .sum();
    assert!(
        total.total_samples() > 1000,
        "only {} samples",
        total.total_samples()
    );
    assert_eq!(
        sum,
        total.total_samples(),
        "interval profiles must add up to the final one"
    );
}

#[test]
fn sigint_flushes_the_profile() {
    require_root();
    let _serial = serial();
    let exe = fixture("spinner");
    let target = Background::spawn(Command::new(&exe).arg("30"));
    target.wait_exec(&exe);
    let scratch = Scratch::new("sigint");
    let f = run_until_signal(&scratch, target.pid(), &["--freq", "499"], 2, libc::SIGINT);
    assert!(
        f.status.success(),
        "burstyd after SIGINT:\n{}",
        f.describe()
    );
    let p = pprof::read_profile(&scratch.join("out/context.pb.gz"))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", f.describe()));
    assert!(
        p.total_samples() > 300,
        "only {} samples",
        p.total_samples()
    );
    let summary = read_summary(&scratch.join("out"));
    assert_eq!(
        summary.metric("burstyd_ring_drops_total"),
        0,
        "{}",
        f.describe()
    );
}

#[test]
fn unprivileged_user_gets_a_clear_error() {
    require_root();
    let scratch = Scratch::new("noperm");
    let f = run_timeout(
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(burstyd_bin())
            .args(["--duration", "1", "-o"])
            .arg(scratch.join("out")),
        Duration::from_secs(60),
    );
    assert!(
        !f.status.success(),
        "unprivileged burstyd succeeded:\n{}",
        f.describe()
    );
    assert!(
        f.stderr.contains("not permitted") && f.stderr.contains("root"),
        "message should say it is not permitted and how to fix it:\n{}",
        f.describe()
    );
}

/// A run into a directory an earlier run wrote: the earlier run's final
/// outputs that this one does not write again go (an
/// `edges-liblzma.so.5.4.1.fdata` of another program), files burstyd
/// does not name so, and interval files (retention's), stay; and no
/// empty file is left that looks like a profile (a traced `sleep` takes
/// no burst: its `edges.fdata` would have no branch).
#[test]
fn a_second_run_replaces_the_first_runs_outputs_and_writes_no_empty_file() {
    require_root();
    let scratch = Scratch::new("stale-outputs");
    let out = scratch.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let old = ["edges-liblzma.so.5.4.1.fdata", "bursts.jsonl"];
    let others = [
        "notes.txt",
        "context-20261118T110640.042Z.pb.gz",
        "edges.fdata.orig",
    ];
    for n in old.iter().chain(&others) {
        std::fs::write(out.join(n), "an earlier run's\n").unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    let run = run_timeout(
        Command::new(burstyd_bin())
            .args(["run", "--exe-only", "-F", "199", "-o"])
            .arg(&out)
            .args(["--", "sleep", "0.5"]),
        Duration::from_secs(60),
    );
    assert!(run.status.success(), "{}", run.describe());
    let left: std::collections::BTreeMap<String, u64> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let n = e.file_name().to_string_lossy().into_owned();
            (n, e.metadata().unwrap().len())
        })
        .collect();
    for n in old {
        assert!(
            !left.contains_key(n),
            "{n} of the earlier run is left: {left:?}"
        );
    }
    for n in others.iter().chain(&["context.pb.gz", "summary.json"]) {
        assert!(left.contains_key(*n), "{n} is gone: {left:?}");
    }
    assert!(
        left.iter().all(|(_, &len)| len > 0),
        "an empty file: {left:?}"
    );
}
