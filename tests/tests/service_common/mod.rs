//! Helpers shared by the service tests (config.rs, http.rs, push.rs): a
//! burstyd running in the background with its log in a file.
#![allow(dead_code)]

pub mod receiver;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use burstyd_tests::*;

/// `burstyd ARGS...` in the background, stderr to `<dir>/burstyd.log`.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    pub fn start(dir: &Path, args: &[&str]) -> Daemon {
        Self::start_with(dir, args, |_| {})
    }

    pub fn start_with(dir: &Path, args: &[&str], f: impl FnOnce(&mut Command)) -> Daemon {
        let log = dir.join("burstyd.log");
        let mut cmd = Command::new(burstyd_bin());
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .env("BURSTYD_LOG", "info")
            .env("NO_COLOR", "1");
        f(&mut cmd);
        let child = cmd.spawn().expect("spawning burstyd");
        Daemon { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` (panics after `secs`).
    pub fn wait_log(&mut self, needle: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if self.log().contains(needle) {
                return;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!(
                    "burstyd exited ({st}) before logging {needle:?}:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "burstyd did not log {needle:?} within {secs} s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGTERM and wait (at most 30 s); returns the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "burstyd ignored SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The interval profiles (context-<time>.pb.gz) in `dir`, oldest first.
pub fn interval_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().path())
                .filter(|p| {
                    let n = p.file_name().unwrap().to_string_lossy();
                    n.starts_with("context-") && n.ends_with(".pb.gz")
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Sample count per `comm` label of a profile.
pub fn samples_by_comm(p: &Profile) -> std::collections::BTreeMap<String, i64> {
    let i = p.value_index("samples").expect("samples/count");
    let mut m = std::collections::BTreeMap::new();
    for s in &p.samples {
        *m.entry(s.label("comm").unwrap_or("?").to_string())
            .or_default() += s.values[i];
    }
    m
}

/// A TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Copies the spinner fixture to `dir/name` (a second executable with its
/// own path and comm).
pub fn spinner_copy(dir: &Path, name: &str) -> PathBuf {
    let dst = dir.join(name);
    std::fs::copy(fixture("spinner"), &dst).unwrap();
    dst
}

/// Replaces a configuration file at once (write, then rename), as an
/// editor or a deployment would: a reload never reads half a file.
pub fn write_config(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Waits for a background program to finish by itself.
pub fn wait_exit(mut b: Background) {
    let _ = b.child.wait();
}
