//! `burstyd run` as a wrapper: signals go to the command, burstyd exits
//! with the command's status whatever happens to the profile (a full
//! disk, a duration that ends first); what cannot work is refused before
//! the command starts (an output path that is a file or read-only, a
//! frequency above the kernel's limit); `--pid` refuses what it cannot
//! trace (pid 0, kernel threads, zombies).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burstyd_tests::*;

/// burstyd started in the background, its output collected.
struct Running {
    child: Child,
    stdout: Option<std::thread::JoinHandle<Vec<u8>>>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
    start: Instant,
}

impl Running {
    fn spawn(args: &[&str], out: &Path, prog: &[&str]) -> Running {
        let mut child = Command::new(burstyd_bin())
            .args(args)
            .arg("-o")
            .arg(out)
            .arg("--")
            .args(prog)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning burstyd");
        let mut so = child.stdout.take().unwrap();
        let mut se = child.stderr.take().unwrap();
        Running {
            child,
            stdout: Some(std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = so.read_to_end(&mut v);
                v
            })),
            stderr: Some(std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = se.read_to_end(&mut v);
                v
            })),
            start: Instant::now(),
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for burstyd to exit (killing it after `timeout`).
    fn finish(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let err = self.stderr.take().unwrap().join().unwrap_or_default();
                panic!(
                    "burstyd did not exit within {timeout:?}\n--- stderr ---\n{}",
                    tail(&String::from_utf8_lossy(&err), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Finished {
            status,
            stdout: self.stdout.take().unwrap().join().unwrap_or_default(),
            stderr: String::from_utf8_lossy(
                &self.stderr.take().unwrap().join().unwrap_or_default(),
            )
            .into_owned(),
            elapsed: self.start.elapsed(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `path` exists (the fixture's handlers are in place).
fn wait_for_file(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{what}: {} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lines a clean run should not print.
fn assert_nothing_odd(f: &Finished) {
    for bad in ["WARN", "ERROR", "error:", "untraced", "still running"] {
        assert!(
            !f.stderr.contains(bad),
            "stderr says {bad:?}:\n{}",
            f.describe()
        );
    }
}

fn assert_profile_written(out: &Path, f: &Finished) {
    let p = pprof::read_profile(&out.join("context.pb.gz"))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", f.describe()));
    assert!(p.total_samples() > 0, "no samples\n{}", f.describe());
}

/// Runs `signals COUNT READY` under `burstyd run`, sends `sigs` to
/// burstyd once the handlers are in place (half a second apart), checks
/// that burstyd waits until the command exits, and returns its output.
fn signal_run(name: &str, sigs: &[i32]) -> (Finished, Scratch) {
    require_root();
    let _serial = serial();
    let exe = fixture("signals");
    let scratch = Scratch::new(name);
    let ready = scratch.join("ready");
    let out = scratch.join("out");
    let count = sigs.len().to_string();
    let mut b = Running::spawn(
        &["run", "-e", "cpu-clock"],
        &out,
        &[exe.to_str().unwrap(), &count, ready.to_str().unwrap()],
    );
    wait_for_file(&ready, name);
    // Let it be sampled (and attached for bursts) for a while.
    std::thread::sleep(Duration::from_millis(1500));
    for (i, &sig) in sigs.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(500));
            assert!(
                b.running(),
                "burstyd exited after signal {} of {} (it must wait for the command)",
                i,
                sigs.len()
            );
        }
        b.signal(sig);
    }
    let f = b.finish(Duration::from_secs(60));
    (f, scratch)
}

#[test]
fn sigterm_goes_to_the_command_and_burstyd_exits_with_its_status() {
    let (f, scratch) = signal_run("sigterm", &[libc::SIGTERM]);
    assert_eq!(f.status.code(), Some(3), "{}", f.describe());
    assert_eq!(f.stdout_str(), "got 15\n", "{}", f.describe());
    assert_nothing_odd(&f);
    assert_profile_written(&scratch.join("out"), &f);
}

#[test]
fn sigint_twice_goes_to_the_command_twice() {
    let (f, scratch) = signal_run("sigint", &[libc::SIGINT, libc::SIGINT]);
    assert_eq!(f.status.code(), Some(3), "{}", f.describe());
    assert_eq!(f.stdout_str(), "got 2\ngot 2\n", "{}", f.describe());
    assert_nothing_odd(&f);
    assert_profile_written(&scratch.join("out"), &f);
}

#[test]
fn sighup_goes_to_the_command() {
    let (f, scratch) = signal_run("sighup", &[libc::SIGHUP]);
    assert_eq!(f.status.code(), Some(3), "{}", f.describe());
    assert_eq!(f.stdout_str(), "got 1\n", "{}", f.describe());
    assert_nothing_odd(&f);
    assert_profile_written(&scratch.join("out"), &f);
}

/// ^C in a terminal: the terminal sends SIGINT to its whole foreground
/// process group, burstyd and the command alike, so burstyd must not pass
/// it on a second time (a command counting ^Cs, "press again to force
/// quit", would see two), and must still wait for the command.
#[test]
fn ctrl_c_in_a_terminal_reaches_the_command_once() {
    use std::io::Write;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    require_root();
    let _serial = serial();
    let exe = fixture("signals");
    let scratch = Scratch::new("ctrl-c");
    let ready = scratch.join("ready");
    let (mut master, slave) = {
        let (mut m, mut s) = (-1, -1);
        // SAFETY: openpty writes two descriptors; the rest may be null.
        let r = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: openpty just returned both; we own them.
        unsafe { (std::fs::File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
    };
    let mut cmd = Command::new(burstyd_bin());
    cmd.args(["run", "-e", "cpu-clock", "-o"])
        .arg(scratch.join("out"))
        .args(["--", exe.to_str().unwrap(), "2", ready.to_str().unwrap()])
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    // SAFETY: setsid and ioctl are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // A session of its own with the pty as its terminal: burstyd
            // and the command are its foreground process group.
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawning burstyd on a pty");
    // `cmd` holds copies of the slave too: the reader below sees EIO only
    // once every slave descriptor is closed.
    drop(cmd);
    drop(slave);
    let mut reader = master.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            v.extend_from_slice(&buf[..n]);
        }
        let _ = tx.send(String::from_utf8_lossy(&v).into_owned());
    });
    let output = move || {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| "(the terminal's output never ended)".into())
    };
    let kill = |child: &mut Child| {
        let _ = child.kill();
        let _ = child.wait();
    };
    wait_for_file(&ready, "ctrl-c");
    std::thread::sleep(Duration::from_millis(1000));
    master.write_all(b"\x03").unwrap();
    std::thread::sleep(Duration::from_millis(700));
    if child.try_wait().unwrap().is_some() {
        kill(&mut child);
        panic!(
            "burstyd exited after one ^C (the command got SIGINT twice, or burstyd stopped waiting)\n{}",
            output()
        );
    }
    master.write_all(b"\x03").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            kill(&mut child);
            panic!("burstyd did not exit after the second ^C");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(master);
    let out = output();
    assert_eq!(status.code(), Some(3), "{out}");
    assert_eq!(out.matches("got 2").count(), 2, "{out}");
}

#[test]
fn a_command_killed_by_a_signal_gives_128_plus_the_signal() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("killed");
    let run = burstyd_run(
        &scratch,
        &["-e", "cpu-clock"],
        &["/bin/sh", "-c", "kill -USR1 $$"],
        Duration::from_secs(60),
    );
    assert_eq!(
        run.finished.status.code(),
        Some(128 + libc::SIGUSR1),
        "{}",
        run.finished.describe()
    );
}

#[test]
fn run_with_a_duration_still_waits_for_the_command() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("duration");
    let run = burstyd_run(
        &scratch,
        &["-e", "cpu-clock", "--duration", "1"],
        // Some CPU first, so that the second of sampling has samples
        // (a shell that only sleeps may give none at 199 Hz).
        &[
            "/bin/sh",
            "-c",
            "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; sleep 3; exit 4",
        ],
        Duration::from_secs(60),
    );
    let f = &run.finished;
    assert_eq!(f.status.code(), Some(4), "{}", f.describe());
    assert!(
        f.elapsed >= Duration::from_secs(3),
        "burstyd exited after {:?}, before the command\n{}",
        f.elapsed,
        f.describe()
    );
    assert_profile_written(&run.out_dir, f);
}

/// A tmpfs of 64 KiB mounted on `dir` (unmounted on drop), filled up
/// unless `read_only`.
struct SmallDisk {
    dir: PathBuf,
    filler: PathBuf,
}

impl SmallDisk {
    fn mount(dir: &Path, read_only: bool) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let opts = if read_only { "size=64k,ro" } else { "size=64k" };
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(st.success(), "mount -t tmpfs on {}: {st}", dir.display());
        let disk = SmallDisk {
            dir: dir.to_path_buf(),
            filler: dir.join("filler"),
        };
        if !read_only {
            use std::io::Write;
            let mut f = std::fs::File::create(&disk.filler).unwrap();
            let block = [0x5au8; 4096];
            loop {
                match f.write(&block) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => panic!("filling {}: {e}", disk.filler.display()),
                }
            }
            let _ = f.sync_all();
            // Really full: not one more block.
            assert!(
                std::fs::write(dir.join("probe"), [1u8; 4096]).is_err(),
                "the tmpfs is not full"
            );
            let _ = std::fs::remove_file(dir.join("probe"));
        }
        disk
    }

    /// Every file in the directory (hidden ones too) but the filler.
    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "filler")
            .collect();
        v.sort();
        v
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

#[test]
fn a_full_disk_with_interval_keeps_the_commands_exit_status() {
    require_root();
    let _serial = serial();
    let spinner = fixture("spinner");
    let scratch = Scratch::new("fulldisk");
    let out = scratch.join("out");
    let disk = SmallDisk::mount(&out, false);
    let script = format!("{} 2 >/dev/null; exit 5", spinner.display());
    let f = run_timeout(
        Command::new(burstyd_bin())
            .args(["run", "-e", "cpu-clock", "--interval", "0.5", "-o"])
            .arg(&out)
            .args(["--", "/bin/sh", "-c", &script]),
        Duration::from_secs(60),
    );
    let files = disk.files();
    drop(disk);
    assert_eq!(f.status.code(), Some(5), "{}", f.describe());
    assert!(
        f.stderr.contains("cannot write the interval profile")
            && f.stderr.contains(&format!("{}/context-", out.display()))
            && f.stderr.contains("No space left on device"),
        "stderr should name the interval profiles it could not write and why\n{}",
        f.describe()
    );
    assert!(
        f.stderr.contains(&format!(
            "writing {}: No space left on device",
            out.join("context.pb.gz").display()
        )),
        "stderr should name the final profile it could not write and why\n{}",
        f.describe()
    );
    assert!(
        files.iter().all(|n| !n.ends_with(".tmp")),
        "temp files left behind: {files:?}\n{}",
        f.describe()
    );
}

#[test]
fn interval_write_failures_keep_the_samples_for_the_final_profile() {
    require_root();
    let _serial = serial();
    let spinner = fixture("spinner");
    let scratch = Scratch::new("diskfrees");
    let out = scratch.join("out");
    let disk = SmallDisk::mount(&out, false);
    // The disk is full for 2 s of intervals, then the command frees it.
    let script = format!(
        "{} 2 >/dev/null; rm {}",
        spinner.display(),
        disk.filler.display()
    );
    let f = run_timeout(
        Command::new(burstyd_bin())
            .args([
                "run",
                "-e",
                "cpu-clock",
                "--freq",
                "499",
                "--interval",
                "0.5",
                "-o",
            ])
            .arg(&out)
            .args(["--", "/bin/sh", "-c", &script]),
        Duration::from_secs(60),
    );
    let p = pprof::read_profile(&out.join("context.pb.gz"));
    let files = disk.files();
    drop(disk);
    let p = p.unwrap_or_else(|e| panic!("{e:#}\n{}", f.describe()));
    assert!(f.status.success(), "{}", f.describe());
    assert!(
        f.stderr.contains("cannot write the interval profile"),
        "no interval write failed: the disk was not full?\n{}",
        f.describe()
    );
    // 2 s of spinning at 499 Hz: about 1000 samples, all in the final
    // profile though most intervals were never written.
    assert!(
        p.total_samples() >= 500,
        "the final profile has {} samples of 2 s at 499 Hz\n{}",
        p.total_samples(),
        f.describe()
    );
    assert!(
        files.iter().all(|n| !n.ends_with(".tmp")),
        "temp files left behind: {files:?}"
    );
}

/// `burstyd run ARGS -o OUT -- sh -c 'touch MARKER'` must fail before the
/// command runs; returns its output.
fn refused_before_the_command(name: &str, args: &[&str], out: &Path) -> Finished {
    let scratch = Scratch::new(name);
    let marker = scratch.join("the-command-ran");
    let f = run_timeout(
        Command::new(burstyd_bin())
            .arg("run")
            .args(args)
            .arg("-o")
            .arg(out)
            .args(["--", "/bin/sh", "-c"])
            .arg(format!("touch {}", marker.display())),
        Duration::from_secs(60),
    );
    // An abandoned command would run once burstyd is gone.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(f.status.code(), Some(1), "{}", f.describe());
    assert!(!marker.exists(), "the command ran\n{}", f.describe());
    let errors: Vec<&str> = f.stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "want one error line\n{}", f.describe());
    f
}

#[test]
fn an_output_path_that_is_a_file_fails_before_the_command_runs() {
    require_root();
    let scratch = Scratch::new("outfile");
    let file = scratch.join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let f = refused_before_the_command("outfile-run", &["-e", "cpu-clock"], &file);
    assert!(
        f.stderr
            .contains(&format!("output directory {} is a file", file.display())),
        "{}",
        f.describe()
    );
}

#[test]
fn a_read_only_output_dir_fails_before_the_command_runs() {
    require_root();
    let scratch = Scratch::new("readonly");
    let out = scratch.join("out");
    let disk = SmallDisk::mount(&out, true);
    let f = refused_before_the_command("readonly-run", &["-e", "cpu-clock"], &out);
    drop(disk);
    assert!(
        f.stderr.contains(&format!(
            "cannot write to the output directory {}",
            out.display()
        )) && f.stderr.contains("Read-only file system"),
        "{}",
        f.describe()
    );
}

#[test]
fn a_frequency_above_the_kernel_limit_fails_before_the_command_runs() {
    require_root();
    let max: u64 = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let freq = (max + 1).to_string();
    let scratch = Scratch::new("freq");
    let f = refused_before_the_command(
        "freq-run",
        &["-e", "cpu-clock", "--freq", &freq],
        &scratch.join("out"),
    );
    assert!(
        f.stderr.contains(&format!(
            "--freq {freq} is above kernel.perf_event_max_sample_rate ({max})"
        )),
        "{}",
        f.describe()
    );
}

/// `burstyd --pid PID --duration 1` must fail with one line saying `want`.
fn pid_refused(pid: &str, want: &str) -> Finished {
    let scratch = Scratch::new("pid");
    let f = run_timeout(
        Command::new(burstyd_bin())
            .args(["--pid", pid, "--duration", "1", "-o"])
            .arg(scratch.join("out")),
        Duration::from_secs(60),
    );
    assert!(
        !f.status.success(),
        "--pid {pid} exited 0\n{}",
        f.describe()
    );
    assert!(
        f.stderr.contains(want),
        "--pid {pid}: want {want:?}\n{}",
        f.describe()
    );
    assert!(
        !scratch.join("out/context.pb.gz").exists(),
        "--pid {pid} wrote a profile"
    );
    f
}

#[test]
fn pid_0_is_refused() {
    require_root();
    let f = pid_refused("0", "0 is not a process id");
    // A usage error, like every bad argument.
    assert_eq!(f.status.code(), Some(2), "{}", f.describe());
}

#[test]
fn kernel_threads_are_refused() {
    require_root();
    let f = pid_refused(
        "2",
        "2 is a kernel thread (kthreadd): burstyd profiles user-space programs",
    );
    assert_eq!(f.status.code(), Some(1), "{}", f.describe());
    // Another kernel thread: a child of kthreadd.
    let kthread = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&p| {
            p > 2
                && std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .ok()
                    .and_then(|s| {
                        s.rsplit_once(')')
                            .map(|(_, r)| r.split_whitespace().nth(1) == Some("2"))
                    })
                    .unwrap_or(false)
        })
        .expect("a kernel thread other than kthreadd");
    let f = pid_refused(&kthread.to_string(), "is a kernel thread");
    assert_eq!(f.status.code(), Some(1), "{}", f.describe());
}

#[test]
fn a_zombie_is_refused() {
    require_root();
    // Our own child, exited and not reaped yet.
    let mut child = Command::new("/bin/true").spawn().unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        if stat.rsplit_once(')').unwrap().1.split_whitespace().next() == Some("Z") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{pid} never became a zombie: {stat}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let f = pid_refused(
        &pid.to_string(),
        &format!("process {pid} has exited (zombie), nothing to profile"),
    );
    let _ = child.wait();
    assert_eq!(f.status.code(), Some(1), "{}", f.describe());
}
