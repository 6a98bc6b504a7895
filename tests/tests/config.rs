//! The configuration file: SIGHUP reload changes what is sampled, a bad
//! file is rejected with its line and reason while the old one stays in
//! force, and targets selected by executable path or systemd unit are
//! picked up when they start and dropped when they exit.

mod service_common;

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;
use service_common::*;

fn base_config(out: &std::path::Path, targets: &str) -> String {
    format!(
        "event = \"cpu-clock\"\nfreq = 499\n\n[output]\ndir = \"{}\"\ninterval = \"500ms\"\n\n{targets}",
        out.display()
    )
}

#[test]
fn sighup_reload_switches_targets() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("reload");
    let a = spinner_copy(&scratch.path, "spin_a");
    let b = spinner_copy(&scratch.path, "spin_b");
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    write_config(
        &cfg,
        &base_config(&out, &format!("[[target]]\nexe = \"{}\"\n", a.display())),
    );
    let pa = Background::spawn(Command::new(&a).arg("8"));
    let pb = Background::spawn(Command::new(&b).arg("8"));
    pa.wait_exec(&a);
    pb.wait_exec(&b);
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    d.wait_log(&format!("(pid {} now)", pa.pid()), 20);
    std::thread::sleep(Duration::from_millis(1200));
    write_config(
        &cfg,
        &base_config(&out, &format!("[[target]]\nexe = \"{}\"\n", b.display())),
    );
    d.signal(libc::SIGHUP);
    d.wait_log("configuration reloaded", 10);
    d.wait_log(&format!("target pid {} (spin_b) appeared", pb.pid()), 5);
    // The reload happened before this instant: an interval profile whose
    // recorded start (`time_nanos`) is later began after it and holds only
    // B. Which file that is depends on when the daemon wrote each interval
    // (a loaded machine, a first symbolization of libc), so the profiles
    // are told apart by their own start, not by when they appeared.
    let reloaded = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let started_after = |out: &std::path::Path| -> Vec<(std::path::PathBuf, pprof::Profile)> {
        interval_files(out)
            .into_iter()
            .filter_map(|f| pprof::read_profile(&f).ok().map(|p| (f, p)))
            .filter(|(_, p)| p.raw.time_nanos >= reloaded)
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while started_after(&out).len() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(d.stop().success(), "{}", d.log());
    let files = interval_files(&out);
    let after = started_after(&out);
    assert!(
        !files.is_empty() && after.len() >= 2,
        "interval profiles {files:?}, {} begun after the reload:\n{}",
        after.len(),
        d.log()
    );
    let first = samples_by_comm(&pprof::read_profile(&files[0]).unwrap());
    assert!(
        first.keys().all(|c| c == "spin_a") && first.get("spin_a").copied().unwrap_or(0) > 50,
        "before the reload only spin_a is sampled: {first:?}"
    );
    let mut b_samples = 0;
    for (f, p) in &after {
        let m = samples_by_comm(p);
        assert!(
            m.keys().all(|c| c == "spin_b"),
            "after the reload only spin_b: {m:?} in {f:?}"
        );
        b_samples += m.get("spin_b").copied().unwrap_or(0);
    }
    assert!(
        b_samples > 100,
        "spin_b has {b_samples} samples after the reload"
    );
}

#[test]
fn bad_config_is_rejected_with_line_and_reason_and_the_old_one_stays() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("badcfg");
    let a = spinner_copy(&scratch.path, "spin_keep");
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");

    // At start-up a bad file is an error, before anything is loaded.
    write_config(&cfg, "event = \"cpu-clock\"\n\n[output]\nintervall = 5\n");
    let f = run_timeout(
        Command::new(burstyd_bin()).args(["--config", cfg.to_str().unwrap(), "--duration", "1"]),
        Duration::from_secs(30),
    );
    assert!(!f.status.success(), "{}", f.describe());
    let want = format!("{}:4:1: unknown field `intervall`", cfg.display());
    assert!(f.stderr.contains(&want), "want {want:?}:\n{}", f.describe());
    // An explicit --config that does not exist is an error too.
    let f = run_timeout(
        Command::new(burstyd_bin()).args(["--config", "/nonexistent/b.toml", "--duration", "1"]),
        Duration::from_secs(30),
    );
    assert!(
        !f.status.success()
            && f.stderr
                .contains("/nonexistent/b.toml: cannot read the configuration file"),
        "{}",
        f.describe()
    );

    write_config(
        &cfg,
        &base_config(&out, &format!("[[target]]\nexe = \"{}\"\n", a.display())),
    );
    let pa = Background::spawn(Command::new(&a).arg("8"));
    pa.wait_exec(&a);
    let sock_path = scratch.join("notify.sock");
    let rx = UnixDatagram::bind(&sock_path).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut d = Daemon::start_with(&scratch.path, &["--config", cfg.to_str().unwrap()], |c| {
        c.env("NOTIFY_SOCKET", &sock_path);
    });
    d.wait_log(&format!("(pid {} now)", pa.pid()), 20);
    // Line 3: a string where a number belongs.
    write_config(&cfg, "event = \"cpu-clock\"\n[[target]]\npid = \"one\"\n");
    d.signal(libc::SIGHUP);
    d.wait_log("configuration reload rejected", 10);
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("configuration reload rejected"))
        .unwrap();
    assert!(
        line.contains(&format!(
            "{}:3:7: invalid type: string \"one\", expected a whole number",
            cfg.display()
        )),
        "the message names file:line:col and the reason: {line}"
    );
    assert!(line.contains("previous configuration stays"), "{line}");
    let before = interval_files(&out).len();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        d.running(),
        "burstyd exited after a bad reload:\n{}",
        d.log()
    );
    assert!(d.stop().success(), "{}", d.log());
    // The old configuration (exe target, 500 ms intervals) went on.
    let files = interval_files(&out);
    assert!(files.len() >= before + 2, "{before} -> {}", files.len());
    let last = samples_by_comm(&pprof::read_profile(&files[files.len() - 2]).unwrap());
    assert!(last.get("spin_keep").copied().unwrap_or(0) > 50, "{last:?}");
    // systemd is told too.
    let mut msgs = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = rx.recv(&mut buf) {
        msgs.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("STATUS=configuration reload rejected") && m.contains(":3:7:")),
        "{msgs:?}"
    );
}

#[test]
fn exe_target_started_later_is_picked_up() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("late");
    let exe = spinner_copy(&scratch.path, "spin_late");
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    write_config(
        &cfg,
        &base_config(&out, &format!("[[target]]\nexe = \"{}\"\n", exe.display())),
    );
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    d.wait_log("(no process now)", 20);
    std::thread::sleep(Duration::from_millis(300));
    let late = Background::spawn(Command::new(&exe).arg("2"));
    d.wait_log(
        &format!("target pid {} (spin_late) appeared", late.pid()),
        5,
    );
    let pid = late.pid();
    wait_exit(late);
    std::thread::sleep(Duration::from_millis(1200));
    assert!(d.stop().success(), "{}", d.log());
    let p = pprof::read_profile(&out.join("context.pb.gz")).unwrap();
    let pid_s = pid.to_string();
    let hot: i64 = p
        .samples
        .iter()
        .filter(|s| s.label("pid") == Some(&pid_s) && s.has_function("spinner_hot_loop"))
        .map(|s| s.values[0])
        .sum();
    // 2 s at 499 Hz, minus up to a second until the scan sees it.
    assert!(
        hot > 300,
        "{hot} samples of spin_late in spinner_hot_loop:\n{:?}",
        samples_by_comm(&p)
    );
    assert!(
        samples_by_comm(&p).keys().all(|c| c == "spin_late"),
        "{:?}",
        samples_by_comm(&p)
    );
}

#[test]
fn exited_target_is_dropped_and_a_new_instance_picked_up() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("exit");
    let exe = spinner_copy(&scratch.path, "spin_exit");
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    write_config(
        &cfg,
        &base_config(&out, &format!("[[target]]\nexe = \"{}\"\n", exe.display())),
    );
    let first = Background::spawn(Command::new(&exe).arg("1.5"));
    first.wait_exec(&exe);
    let p1 = first.pid();
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    d.wait_log(&format!("(pid {p1} now)"), 20);
    d.wait_log(&format!("target pid {p1} exited"), 10);
    assert!(
        d.running(),
        "burstyd must outlive its configured targets:\n{}",
        d.log()
    );
    // Longer than the first: it is found by a rescan (up to a second
    // late), and a loaded machine gives the spinner less than a core.
    let second = Background::spawn(Command::new(&exe).arg("3"));
    let p2 = second.pid();
    d.wait_log(&format!("target pid {p2} (spin_exit) appeared"), 5);
    d.wait_log(&format!("target pid {p2} exited"), 15);
    assert!(d.stop().success(), "{}", d.log());
    let p = pprof::read_profile(&out.join("context.pb.gz")).unwrap();
    let by_pid = |pid: u32| -> i64 {
        let s = pid.to_string();
        p.samples
            .iter()
            .filter(|x| x.label("pid") == Some(&s))
            .map(|x| x.values[0])
            .sum()
    };
    assert!(
        by_pid(p1) > 200 && by_pid(p2) > 200,
        "pid {p1}: {}, pid {p2}: {}",
        by_pid(p1),
        by_pid(p2)
    );
}

/// The cgroup v2 mount point (the unified hierarchy on hybrid hosts).
fn cgroup2_root() -> Option<std::path::PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(Into::into))?
    })
}

#[test]
fn unit_target_started_later_is_picked_up() {
    require_root();
    let _serial = serial();
    let Some(root) = cgroup2_root() else {
        println!("SKIP: no cgroup2 hierarchy mounted");
        return;
    };
    let scratch = Scratch::new("unit");
    let exe = fixture("spinner");
    let unit = format!("burstyd-test-{}.service", std::process::id());
    let cg = root.join(&unit);
    std::fs::create_dir_all(&cg).unwrap();
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _rm = Rm(cg.clone());
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    write_config(
        &cfg,
        &base_config(&out, &format!("[[target]]\nunit = \"{unit}\"\n")),
    );
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    d.wait_log("(no process now)", 20);
    // A process that joins the unit's cgroup, then becomes the spinner
    // (for 3 s: on a loaded machine a 2 s spinner drew 282 samples).
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {} 3",
        cg.display(),
        exe.display()
    );
    let late = Background::spawn(Command::new("sh").args(["-c", &script]));
    d.wait_log(&format!("target pid {} ", late.pid()), 5);
    wait_exit(late);
    assert!(d.stop().success(), "{}", d.log());
    let p = pprof::read_profile(&out.join("context.pb.gz")).unwrap();
    let m = samples_by_comm(&p);
    assert!(m.get("spinner").copied().unwrap_or(0) > 300, "{m:?}");
}

/// The UTC time in an interval file's name (`context-<time>.pb.gz`,
/// `paths-<time>.pb.gz`, `edges-<module>-<time>.fdata`), in milliseconds
/// since the month began; `None` for other files.
fn interval_ms(name: &str) -> Option<u64> {
    let stem = name
        .strip_suffix(".pb.gz")
        .or_else(|| name.strip_suffix(".fdata"))?;
    let t = stem.rsplit_once('-')?.1;
    // YYYYmmddTHHMMSS.mmmZ
    if t.len() != 20 || !t.ends_with('Z') {
        return None;
    }
    let n = |r: std::ops::Range<usize>| t.get(r)?.parse::<u64>().ok();
    Some((((n(6..8)? * 24 + n(9..11)?) * 60 + n(11..13)?) * 60 + n(13..15)?) * 1000 + n(16..19)?)
}

/// Two SIGHUPs within an interval (the file unchanged) do not move the
/// interval clock: the next interval profile ends one interval after the
/// one before, not an interval after the last reload. And with `keep =
/// 3`, three whole intervals are left after SIGTERM, the last partial
/// one included: its path profile carries its context profile's time.
/// Read from the files' names only.
#[test]
fn reloads_keep_the_interval_clock_and_retention_keeps_whole_intervals() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("reload-clock");
    let exe = spinner_copy(&scratch.path, "spin_clock");
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    write_config(
        &cfg,
        &format!(
            "event = \"cpu-clock\"\nfreq = 199\n\n[output]\ndir = \"{}\"\ninterval = \"2s\"\nkeep = 3\n\n[bursts]\nmax_traced = 1\n\n[[target]]\nexe = \"{}\"\n",
            out.display(),
            exe.display()
        ),
    );
    let p = Background::spawn(Command::new(&exe).arg("40"));
    p.wait_exec(&exe);
    let mut d = Daemon::start(&scratch.path, &["--config", cfg.to_str().unwrap()]);
    let times = |out: &std::path::Path| -> Vec<u64> {
        interval_files(out)
            .iter()
            .filter_map(|f| interval_ms(&f.file_name().unwrap().to_string_lossy()))
            .collect()
    };
    let wait_for = |n: usize, d: &mut Daemon| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while times(&out).len() < n {
            assert!(d.running(), "burstyd ended:\n{}", d.log());
            assert!(
                std::time::Instant::now() < deadline,
                "fewer than {n} interval profiles in 20 s:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(1, &mut d);
    // Two reloads, 0.5 and 1.2 s into the second interval: restarted
    // by each, the clock would end it 3.2 s after the first.
    std::thread::sleep(Duration::from_millis(500));
    d.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(700));
    d.signal(libc::SIGHUP);
    wait_for(2, &mut d);
    let t = times(&out);
    let gap = t[1] - t[0];
    assert!(
        (1500..2800).contains(&gap),
        "{gap} ms between the first two interval profiles, for an interval of 2 s: {:?}",
        interval_files(&out)
    );
    // Two more intervals (retention holds it at 3), then the end.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while times(&out).last().is_none_or(|&l| l < t[1] + 3900) {
        assert!(std::time::Instant::now() < deadline, "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(d.stop().success(), "{}", d.log());
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let context = times(&out);
    let all: std::collections::BTreeSet<u64> =
        names.iter().filter_map(|n| interval_ms(n)).collect();
    assert_eq!(context.len(), 3, "interval files left: {names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("paths-")),
        "no interval path profile: {names:?}"
    );
    assert_eq!(
        all,
        context.iter().copied().collect(),
        "every interval kept has its context profile: {names:?}"
    );
}
