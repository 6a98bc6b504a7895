//! Bursty tracing in the service (a configuration file, no `--pid`): a
//! target started after the daemon is traced in bursts, a restarted one
//! is traced again, a SIGHUP that drops it detaches it and it runs on
//! unharmed; interval path profiles appear and `go tool pprof` reads
//! each; `/debug/pprof/paths?seconds=2` returns the paths of those 2 s;
//! `/metrics` has the traced process's series.

mod service_common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use burstyd_tests::*;
use service_common::*;

fn config(out: &Path, port: u16, exe: &Path) -> String {
    format!(
        "event = \"cpu-clock\"\nfreq = 499\n\n[output]\ndir = \"{}\"\ninterval = \"1s\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n\n[bursts]\nmax_traced = 2\n\n[[target]]\nexe = \"{}\"\n",
        out.display(),
        exe.display()
    )
}

/// With a Pyroscope destination at `push_port`.
fn config_pushing(out: &Path, port: u16, exe: &Path, push_port: u16) -> String {
    config(out, port, exe)
        + &format!(
            "\n[[push]]\nkind = \"pyroscope\"\nurl = \"http://127.0.0.1:{push_port}\"\napp = \"svc\"\n"
        )
}

/// `curl URL -o out`: the HTTP status.
fn curl(url: &str, out: &Path) -> u16 {
    let f = run_timeout(
        Command::new("curl")
            .args(["-sS", "-o"])
            .arg(out)
            .args(["-w", "%{http_code}", url]),
        Duration::from_secs(60),
    );
    assert!(f.status.success(), "curl {url}: {}", f.describe());
    f.stdout_str().trim().parse().unwrap()
}

/// Waits until the daemon's HTTP endpoint at `port` answers.
fn wait_http(port: u16, scratch: &Scratch, d: &mut Daemon) {
    let health = scratch.join("health.txt");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Command::new("curl")
        .args(["-sf", "-o"])
        .arg(&health)
        .arg(format!("http://127.0.0.1:{port}/healthz"))
        .status()
        .map_or(true, |s| !s.success())
    {
        assert!(d.running(), "burstyd exited:\n{}", d.log());
        assert!(
            Instant::now() < deadline,
            "no HTTP within 20 s:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A service started by [`start_recording`]: the daemon, its HTTP port,
/// its output directory and what its push destination received.
struct Recording {
    d: Daemon,
    port: u16,
    out: std::path::PathBuf,
    pushed: std::sync::Arc<std::sync::Mutex<Vec<receiver::Received>>>,
}

/// The service over the target `exe` whose own `record = [RECORD]` says
/// what its bursts record, pushing to a Pyroscope receiver as `svc`;
/// returns once its HTTP endpoint answers.
fn start_recording(scratch: &Scratch, exe: &Path, record: &str) -> Recording {
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    let port = free_port();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let push_port = listener.local_addr().unwrap().port();
    let pushed = receiver::receiver(listener);
    let target_line = format!("exe = \"{}\"\n", exe.display());
    let line = format!("record = [{record}]\n");
    let text = config_pushing(&out, port, exe, push_port)
        .replace(&target_line, &format!("{target_line}{line}"));
    assert!(text.contains(&line), "{text}");
    write_config(&cfg, &text);
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    wait_http(port, scratch, &mut d);
    Recording {
        d,
        port,
        out,
        pushed,
    }
}

/// Waits (20 s at most) until `out` holds two interval files named
/// `PREFIX…SUFFIX` (the prefix up to the time's first digit); returns
/// them.
fn wait_intervals(out: &Path, prefix: &str, suffix: &str, d: &Daemon) -> Vec<std::path::PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let files: Vec<_> = std::fs::read_dir(out)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().unwrap().to_str().unwrap();
                n.starts_with(prefix) && n.ends_with(suffix)
            })
            .collect();
        if files.len() >= 2 {
            return files;
        }
        assert!(
            Instant::now() < deadline,
            "no interval files {prefix}*{suffix}:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `burstyd_traced_bursts_total{pid="PID",...}` from /metrics (0 when
/// absent).
fn bursts_of(port: u16, pid: u32, scratch: &Scratch) -> u64 {
    let m = scratch.join("metrics.txt");
    assert_eq!(curl(&format!("http://127.0.0.1:{port}/metrics"), &m), 200);
    let text = std::fs::read_to_string(&m).unwrap();
    text.lines()
        .find(|l| {
            l.starts_with("burstyd_traced_bursts_total{") && l.contains(&format!("pid=\"{pid}\""))
        })
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or(0)
}

/// Waits until `pid` took bursts (per /metrics).
fn wait_bursts(port: u16, pid: u32, scratch: &Scratch, d: &Daemon) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = bursts_of(port, pid, scratch);
        if n > 20 {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} took no bursts within 30 s ({n}):\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether `pid` catches real-time signal 64 (`SigCgt` in its status):
/// the injected handler is installed there.
fn catches_sig64(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let cgt = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .unwrap()
        .trim();
    u64::from_str_radix(cgt, 16).unwrap() & (1 << 63) != 0
}

#[test]
fn the_service_traces_its_targets_in_bursts_as_they_come_and_go() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("service-bursts");
    let exe = spinner_copy(&scratch.path, "svc_spin");
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    let port = free_port();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let push_port = listener.local_addr().unwrap().port();
    let pushed = receiver::receiver(listener);
    write_config(&cfg, &config_pushing(&out, port, &exe, push_port));
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    d.wait_log("sampling targets", 20);

    // 1. Started after the daemon: attached and traced in bursts.
    let first = Background::spawn(Command::new(&exe).arg("30"));
    first.wait_exec(&exe);
    d.wait_log(
        &format!("tracing svc_spin ({}) in bursts: attaching", exe.display()),
        10,
    );
    wait_bursts(port, first.pid(), &scratch, &d);
    assert!(catches_sig64(first.pid()), "the handler is installed");

    // 2. The paths of the next 2 seconds.
    let window = scratch.join("window.pb.gz");
    let t = Instant::now();
    assert_eq!(
        curl(
            &format!("http://127.0.0.1:{port}/debug/pprof/paths?seconds=2"),
            &window
        ),
        200,
        "{}",
        d.log()
    );
    let took = t.elapsed();
    assert!(took >= Duration::from_secs(2), "answered after {took:?}");
    let w = pprof::read_profile(&window).unwrap();
    let secs = w.raw.duration_nanos as f64 / 1e9;
    assert!((1.9..4.0).contains(&secs), "window of {secs} s");
    let execs = w.value_index("executions").expect("executions/count");
    let hot: i64 = w
        .samples
        .iter()
        .filter(|s| s.has_function("spinner_hot_loop"))
        .map(|s| s.values[execs])
        .sum();
    assert!(
        hot > 1000,
        "{hot} executions of spinner_hot_loop's paths in the window"
    );
    let (_, top) = gopprof::top(&window, Some("executions")).unwrap();
    assert!(
        top.iter().any(|r| r.name.contains("spinner_hot_loop path")),
        "{}",
        describe_top(&top, 5)
    );

    // 3. Restarted (the process dies, a new one of the program starts):
    // the old one is released, the new one traced.
    let (old, mut first) = (first.pid(), first);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    d.wait_log(&format!("exited: its bursts are released pid={old}"), 10);
    let second = Background::spawn(Command::new(&exe).arg("8"));
    second.wait_exec(&exe);
    let pid = second.pid();
    wait_bursts(port, pid, &scratch, &d);

    // 4. A reload that drops the target: detached (its signal restored),
    // and it runs on to its normal end.
    let other = scratch.join("not_running");
    write_config(&cfg, &config_pushing(&out, port, &other, push_port));
    d.signal(libc::SIGHUP);
    d.wait_log(
        &format!("no longer selected for bursts: detaching (the process runs on) pid={pid}"),
        10,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while catches_sig64(pid) {
        assert!(Instant::now() < deadline, "the handler is still installed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut second = second;
    let status = second.child.wait().unwrap();
    assert!(status.success(), "the detached target ended with {status}");

    assert!(d.stop().success(), "{}", d.log());
    let log = d.log();
    // Interval path profiles: one per interval with bursts, each read by
    // go tool pprof.
    let mut intervals: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("paths-") && n.ends_with(".pb.gz")
        })
        .collect();
    intervals.sort();
    assert!(intervals.len() >= 4, "{intervals:?}\n{log}");
    let mut pids = std::collections::BTreeSet::new();
    for f in &intervals {
        let (_, top) = gopprof::top(f, Some("executions"))
            .unwrap_or_else(|e| panic!("go tool pprof {}: {e:#}", f.display()));
        assert!(!top.is_empty(), "{}", f.display());
        let p = pprof::read_profile(f).unwrap();
        pids.extend(
            p.samples
                .iter()
                .filter_map(|s| s.num_labels.get("pid").copied()),
        );
    }
    assert!(
        pids.contains(&i64::from(old)) && pids.contains(&i64::from(pid)),
        "both processes' paths are in the interval profiles: {pids:?}"
    );
    // Their BOLT profiles, per binary.
    assert!(
        std::fs::read_dir(&out).unwrap().any(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.starts_with("edges-svc_spin-") && n.ends_with(".fdata")
        }),
        "no interval edge profile of svc_spin"
    );
    // The session's path profile has both.
    let total = pprof::read_profile(&out.join("paths.pb.gz")).unwrap();
    let total_pids: std::collections::BTreeSet<_> = total
        .samples
        .iter()
        .filter_map(|s| s.num_labels.get("pid").copied())
        .collect();
    assert!(total_pids.contains(&i64::from(old)) && total_pids.contains(&i64::from(pid)));
    assert!(
        !log.contains("records lost: 1") && !log.contains(" ERROR "),
        "{log}"
    );
    // The push receiver got the path profiles, as their own application.
    let got = pushed.lock().unwrap().clone();
    let paths: Vec<_> = got
        .iter()
        .filter(|r| r.query.get("name").map(String::as_str) == Some("svc.paths{}"))
        .collect();
    assert!(
        paths.len() >= 4 && got.len() > paths.len(),
        "{} path profiles pushed of {} pushes",
        paths.len(),
        got.len()
    );
    let with_spinner = paths
        .iter()
        .filter(|r| {
            let parts = receiver::multipart(&r.headers["content-type"], &r.body);
            let p = pprof::decode_profile(&parts["profile"].1).unwrap();
            p.value_index("executions").is_some()
                && p.samples.iter().any(|s| s.has_function("spinner_hot_loop"))
        })
        .count();
    assert!(
        with_spinner >= 4,
        "{with_spinner} pushed path profiles hold the spinner's paths"
    );
}

#[test]
fn an_executable_that_cannot_be_traced_is_reported_once_and_sampled() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("service-bursts-fail");
    // A program without libc (no thread pointer: bursts need one), so
    // the attach fails at once.
    let exe = scratch.join("nothing");
    std::fs::write(
        scratch.join("nothing.s"),
        ".globl _start\n_start: jmp _start\n",
    )
    .unwrap();
    let cc = run_timeout(
        Command::new("cc")
            .args(["-nostdlib", "-static", "-s", "-o"])
            .arg(&exe)
            .arg(scratch.join("nothing.s")),
        Duration::from_secs(60),
    );
    assert!(cc.status.success(), "{}", cc.describe());
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    let port = free_port();
    write_config(&cfg, &config(&out, port, &exe));
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    d.wait_log("sampling targets", 20);
    let mut procs = Vec::new();
    for _ in 0..3 {
        let b = Background::spawn(&mut Command::new(&exe));
        b.wait_exec(&exe);
        procs.push(b);
        std::thread::sleep(Duration::from_millis(1500));
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert!(d.stop().success(), "{}", d.log());
    for mut b in procs {
        let _ = b.child.kill();
        let _ = b.child.wait();
    }
    let log = d.log();
    let warned = log.matches("in bursts (it is sampled only").count();
    assert_eq!(warned, 1, "one warning for the executable:\n{log}");
    assert!(log.contains("tried again in 10 s"), "{log}");
    // Backing off: the second and third processes were not attached.
    let attaches = log.matches("in bursts: attaching").count();
    assert_eq!(attaches, 1, "{log}");
    // Still sampled.
    let files = interval_files(&out);
    let sampled: i64 = files
        .iter()
        .map(|f| {
            samples_by_comm(&pprof::read_profile(f).unwrap())
                .get("nothing")
                .copied()
                .unwrap_or(0)
        })
        .sum();
    assert!(sampled > 100, "{sampled} samples of the untraced processes");
}

/// The service clones a target's shared libraries once they are hot
/// (`libraries = "hot"`, its default): `libc_heavy` spends most of its
/// time in libc (qsort, strcmp, memcpy), so libc is cloned within seconds
/// of the attach and bursts run in its clones; the loader, mapped too but
/// idle, is never cloned; the program's output is as untraced (its first
/// rounds, up to 1000: it runs until killed, after the daemon's stop).
#[test]
fn only_the_libraries_where_a_target_spends_time_are_cloned() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("service-bursts-hot-libs");
    let exe = scratch.join("svc_libc");
    std::fs::copy(fixture("libc_heavy"), &exe).unwrap();
    let untraced = run_untraced(&[exe.to_str().unwrap(), "1000"], Duration::from_secs(60));
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    let port = free_port();
    write_config(&cfg, &config(&out, port, &exe));
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    d.wait_log("sampling targets", 20);
    // Runs until killed: libc's first analysis (no plan cache yet, a
    // worker process) may take longer than a fixed run would last.
    let printed = scratch.join("target.out");
    let target = Background {
        child: Command::new(&exe)
            .arg("1000000")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&printed).unwrap())
            .spawn()
            .unwrap(),
    };
    target.wait_exec(&exe);
    d.wait_log("libc.so.6) loaded since the attach rewritten", 120);
    // Bursts in libc's clones for a while, then the daemon stops: the
    // target is detached and runs on.
    std::thread::sleep(Duration::from_secs(2));
    let log = d.log();
    assert!(d.stop().success(), "{}", d.log());
    std::thread::sleep(Duration::from_millis(300));
    let mut target = target;
    assert!(
        target.child.try_wait().unwrap().is_none(),
        "the target did not survive the daemon's stop"
    );
    drop(target);
    // Every round it printed (complete lines) is the untraced one.
    let text = std::fs::read_to_string(&printed).unwrap();
    let mut got: Vec<&str> = text.split_inclusive('\n').collect();
    if got.last().is_some_and(|l| !l.ends_with('\n')) {
        got.pop();
    }
    let want_text = untraced.stdout_str();
    let want: Vec<&str> = want_text.split_inclusive('\n').collect();
    let n = got.len().min(want.len());
    assert!(n >= 100, "the target printed only {n} rounds");
    assert_eq!(
        got[..n],
        want[..n],
        "the target's output under the service differs from its untraced output"
    );
    // The attach clones the executable only; libc follows once hot.
    assert!(
        log.contains("in 1 module(s) (svc_libc)"),
        "the attach cloned more than the executable:\n{log}"
    );
    assert!(
        log.contains("libc.so.6 holds")
            && log.contains("of a library (libc.so.6) loaded since the attach rewritten"),
        "libc was not cloned once hot:\n{log}"
    );
    assert!(
        !log.contains("ld-linux-x86-64.so.2 holds") && !log.contains("(ld-linux"),
        "the idle loader was cloned:\n{log}"
    );
    // Bursts ran in libc's clones: its functions have paths.
    let paths = path_counts(&out.join("paths.pb.gz"));
    let in_libc: i64 = paths
        .iter()
        .filter(|(f, _)| f.contains("msort") || f.contains("strcmp") || f.contains("memcpy"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        in_libc > 0,
        "no path of libc's qsort/strcmp/memcpy in paths.pb.gz: {paths:?}\n{log}"
    );
}

/// Memory mode in the service (a target's `record = ["refs"]`): the hot data
/// streams of `streams`' references are served live
/// (`/debug/pprof/streams?seconds=4`: the hot walk, 24 references long, is
/// the hottest stream), written per interval (`hot-streams-<time>.json`,
/// also served as the latest on `/debug/pprof/streams`) and pushed as
/// their own application (`svc.streams`).
#[test]
fn the_service_serves_hot_data_streams_live() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("service-streams");
    let exe = fixture("streams");
    // Memory mode asked for by the target itself.
    let Recording {
        mut d,
        port,
        out,
        pushed,
    } = start_recording(&scratch, &exe, "\"refs\"");
    let target = Background::spawn(Command::new(&exe).arg("1000000000"));
    target.wait_exec(&exe);
    wait_bursts(port, target.pid(), &scratch, &d);

    // The streams of the next 4 seconds (a burst that records references
    // is a long one, taken about once a second at the analysis rate).
    let window = scratch.join("window.json");
    let url = format!("http://127.0.0.1:{port}/debug/pprof/streams");
    assert_eq!(
        curl(&format!("{url}?seconds=4"), &window),
        200,
        "{}",
        d.log()
    );
    let top_is_the_hot_walk = |file: &Path| {
        let text = std::fs::read_to_string(file).unwrap();
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        let top = &r["streams"][0];
        let why = format!(
            "{}: {} references, top {top}",
            file.display(),
            r["references"]
        );
        assert!(r["references"].as_u64().unwrap() > 1000, "{why}");
        assert_eq!(top["length"], 24, "{why}");
        let sites = top["signature"].as_array().unwrap();
        assert!(sites.iter().all(|s| s["function"] == "walk_hot"), "{why}");
    };
    top_is_the_hot_walk(&window);

    // Interval files, the latest served without ?seconds.
    let intervals = wait_intervals(&out, "hot-streams-2", "Z.json", &d);
    top_is_the_hot_walk(&intervals[0]);
    let latest = scratch.join("latest.json");
    assert_eq!(curl(&url, &latest), 200);
    top_is_the_hot_walk(&latest);
    drop(target);
    assert!(d.stop().success(), "{}", d.log());

    // Pushed as their own application, a stream a sample.
    let got = pushed.lock().unwrap().clone();
    let streams: Vec<_> = got
        .iter()
        .filter(|r| r.query.get("name").map(String::as_str) == Some("svc.streams{}"))
        .collect();
    assert!(
        !streams.is_empty(),
        "{} pushes, none svc.streams",
        got.len()
    );
    let parts = receiver::multipart(&streams[0].headers["content-type"], &streams[0].body);
    let p = pprof::decode_profile(&parts["profile"].1).unwrap();
    let refs = p.value_index("references").expect("references/count");
    assert!(
        p.samples
            .iter()
            .any(|s| s.has_function("walk_hot") && s.values[refs] > 0),
        "no pushed stream in walk_hot"
    );
}

/// The sites of `tuples_known`'s `step` in a tuple profile (gzip'd
/// pprof, `values.pb.gz` or `targets.pb.gz`): per site (label `site`),
/// each value's (label `key`: `value` or `target`) share of the site's
/// tuples (`tuples/count`).
fn step_sites(gz: &[u8], key: &str) -> Vec<std::collections::BTreeMap<String, f64>> {
    let p = pprof::decode_profile(gz).unwrap();
    let n = p.value_index("tuples").expect("tuples/count");
    let mut sites: std::collections::BTreeMap<i64, std::collections::BTreeMap<String, f64>> =
        Default::default();
    for s in p.samples.iter().filter(|s| s.has_function("step")) {
        let site = sites.entry(s.num_labels["site"]).or_default();
        *site.entry(s.label(key).unwrap().to_owned()).or_default() += s.values[n] as f64;
    }
    for site in sites.values_mut() {
        let total: f64 = site.values().sum();
        site.values_mut().for_each(|v| *v /= total);
    }
    sites.into_values().collect()
}

/// The tuples of `step`'s sites in a tuple profile (`tuples/count`).
fn step_tuples(gz: &[u8]) -> i64 {
    let p = pprof::decode_profile(gz).unwrap();
    let n = p.value_index("tuples").expect("tuples/count");
    p.samples
        .iter()
        .filter(|s| s.has_function("step"))
        .map(|s| s.values[n])
        .sum()
}

/// Whether one of `step`'s sites in `gz` has the values of `want`, each
/// with its share to within 3% of the site's tuples, and no other.
fn has_step_site(gz: &[u8], key: &str, want: &[(&str, f64)]) -> Result<(), String> {
    let sites = step_sites(gz, key);
    let matches = |site: &std::collections::BTreeMap<String, f64>| {
        site.len() == want.len()
            && want
                .iter()
                .all(|(v, share)| site.get(*v).is_some_and(|s| (s - share).abs() < 0.03))
    };
    if sites.iter().any(matches) {
        Ok(())
    } else {
        Err(format!("no site of step with {want:?}: {sites:?}"))
    }
}

/// Tuple profiles in the service (a target's own `record = ["values",
/// "targets"]`) on `tuples_known`, whose tuples are known by construction
/// (tests/tuples.rs): in `step`, the load of `cells[i & 3]` gives 7 three
/// times in four and 42 once, and the indirect call through `table[i &
/// 3]` goes to f1 half the time, to f2 and f3 a quarter each. Each
/// profile in those shares: served live (`/debug/pprof/values?seconds=3`,
/// `/debug/pprof/targets?seconds=3`), written per interval
/// (`values-<time>.pb.gz`, `targets-<time>.pb.gz`, also served as the
/// latest without `?seconds`) and pushed as their own applications
/// (`svc.values`, `svc.targets`). A window's, an interval's and the
/// latest interval's are theirs alone: each holds well under the tuples
/// of the session's (`values.pb.gz`, `targets.pb.gz` at its end), which
/// lasts 7 s or more.
#[test]
fn the_service_serves_tuple_profiles_live() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("service-tuples");
    let exe = fixture("tuples_known");
    let Recording {
        mut d,
        port,
        out,
        pushed,
    } = start_recording(&scratch, &exe, "\"values\", \"targets\"");
    let target = Background::spawn(Command::new(&exe).arg("100000000000"));
    target.wait_exec(&exe);
    wait_bursts(port, target.pid(), &scratch, &d);

    let values: &[(&str, f64)] = &[("0x7", 0.75), ("0x2a", 0.25)];
    let targets: &[(&str, f64)] = &[("f1", 0.5), ("f2", 0.25), ("f3", 0.25)];
    let base = format!("http://127.0.0.1:{port}/debug/pprof");
    let mut live = Vec::new();
    for (what, key, want) in [("values", "value", values), ("targets", "target", targets)] {
        // The next 3 seconds' tuples.
        let window = scratch.join(&format!("{what}-window.pb.gz"));
        let url = format!("{base}/{what}");
        assert_eq!(
            curl(&format!("{url}?seconds=3"), &window),
            200,
            "{}",
            d.log()
        );
        let gz = std::fs::read(&window).unwrap();
        has_step_site(&gz, key, want).unwrap_or_else(|e| panic!("{what} window: {e}"));
        live.push((what, "window", step_tuples(&gz)));

        // Interval files, the latest served without ?seconds.
        let intervals = wait_intervals(&out, &format!("{what}-2"), "Z.pb.gz", &d);
        let gz = std::fs::read(&intervals[0]).unwrap();
        has_step_site(&gz, key, want).unwrap_or_else(|e| panic!("{}: {e}", intervals[0].display()));
        live.push((what, "interval", step_tuples(&gz)));
        let latest = scratch.join(&format!("{what}-latest.pb.gz"));
        assert_eq!(curl(&url, &latest), 200, "{}", d.log());
        let gz = std::fs::read(&latest).unwrap();
        has_step_site(&gz, key, want).unwrap_or_else(|e| panic!("latest {what}: {e}"));
        live.push((what, "latest", step_tuples(&gz)));
    }
    // The interval edge profiles carry the indirect calls of the
    // call-target profile: step's call to f1, f2 and f3, f1 counted about
    // twice as often as each of the others.
    let fdatas = wait_intervals(&out, "edges-tuples_known-", ".fdata", &d);
    let text: String = fdatas
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let calls = |to: &str| -> u64 {
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 8
                    && f[1] == "step"
                    && (f[4] == to || f[4].starts_with(&format!("{to}/"))))
                .then(|| f[7].parse::<u64>().unwrap())
            })
            .sum()
    };
    let (f1, f2, f3) = (calls("f1"), calls("f2"), calls("f3"));
    let ratio = f1 as f64 / ((f2 + f3) as f64 / 2.0);
    assert!(
        f2 > 0 && f3 > 0 && ratio > 1.3 && ratio < 3.0,
        "indirect calls in {} interval edge profiles: f1 {f1}, f2 {f2}, f3 {f3}\n{text}",
        fdatas.len()
    );
    drop(target);
    assert!(d.stop().success(), "{}", d.log());
    for (what, when, n) in live {
        let session = std::fs::read(out.join(format!("{what}.pb.gz"))).unwrap();
        let all = step_tuples(&session);
        assert!(
            n > 0 && (n as f64) < 0.75 * all as f64,
            "{what}: {n} tuples in the {when} profile, {all} in the session's"
        );
    }

    // Pushed as their own applications.
    let got = pushed.lock().unwrap().clone();
    for (what, key, want) in [("values", "value", values), ("targets", "target", targets)] {
        let name = format!("svc.{what}{{}}");
        let mine: Vec<_> = got
            .iter()
            .filter(|r| r.query.get("name") == Some(&name))
            .collect();
        assert!(!mine.is_empty(), "{} pushes, none {name}", got.len());
        let parts = receiver::multipart(&mine[0].headers["content-type"], &mine[0].body);
        has_step_site(&parts["profile"].1, key, want)
            .unwrap_or_else(|e| panic!("pushed {what}: {e}"));
    }
}
