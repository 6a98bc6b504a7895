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
            "{}:3:7: invalid type: string \"one\", expected u32",
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
