//! The systemd unit and the readiness protocol: the unit verifies, and the
//! daemon, run the way the unit runs it, sends READY=1 once sampling,
//! STATUS= lines, watchdog pings and STOPPING=1 on a real notify socket.

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;

#[test]
fn unit_file_verifies() {
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("SKIP: systemd-analyze is not installed here");
        return;
    };
    assert!(out.status.success());
    let scratch = Scratch::new("unit");
    let unit = std::fs::read_to_string(workspace_root().join("systemd/burstyd.service")).unwrap();
    // Point ExecStart at the binary under test (verify checks it exists).
    let unit = unit.replace("/usr/local/bin/burstyd", burstyd_bin().to_str().unwrap());
    let path = scratch.join("burstyd.service");
    std::fs::write(&path, unit).unwrap();
    let f = run_timeout(
        Command::new("systemd-analyze").arg("verify").arg(&path),
        Duration::from_secs(60),
    );
    assert!(
        f.status.success() && f.stderr.trim().is_empty(),
        "{}",
        f.describe()
    );
}

/// `systemd-analyze security` rates the unit's exposure below 4.0 (its
/// figure, 0 to 10, from the "Overall exposure level" line of its
/// output): what the service may do is bounded to what it needs.
#[test]
fn unit_exposure_is_below_4() {
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("SKIP: systemd-analyze is not installed here");
        return;
    };
    // `security --offline` (reading a unit file, no running manager)
    // came with systemd 250.
    let version: u32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if version < 250 {
        println!("SKIP: systemd {version} has no `systemd-analyze security --offline`");
        return;
    }
    let scratch = Scratch::new("unit-security");
    let unit = std::fs::read_to_string(workspace_root().join("systemd/burstyd.service")).unwrap();
    let unit = unit.replace("/usr/local/bin/burstyd", burstyd_bin().to_str().unwrap());
    let path = scratch.join("burstyd.service");
    std::fs::write(&path, unit).unwrap();
    let f = run_timeout(
        Command::new("systemd-analyze")
            .args(["security", "--offline=yes", "--no-pager"])
            .arg(&path),
        Duration::from_secs(60),
    );
    // "→ Overall exposure level for burstyd.service: 3.3 OK 🙂"
    let text = f.stdout_str();
    let exposure: f64 = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .and_then(|l| l.rsplit_once(": "))
        .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level: {}", f.describe()));
    assert!(exposure < 4.0, "exposure {exposure}:\n{text}");
}

#[test]
fn readiness_status_watchdog_and_stopping_reach_the_notify_socket() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("notify");
    let sock_path = scratch.join("notify.sock");
    let rx = UnixDatagram::bind(&sock_path).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // Read while the daemon runs, as systemd does: the socket's queue holds
    // only net.unix.max_dgram_qlen (10) datagrams.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut msgs = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match rx.recv(&mut buf) {
                    Ok(n) => msgs.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                    Err(_) if stop.load(std::sync::atomic::Ordering::SeqCst) => break msgs,
                    Err(_) => {}
                }
            }
        })
    };
    let f = run_timeout(
        Command::new(burstyd_bin())
            .args(["--duration", "3", "--interval", "1", "-o"])
            .arg(scratch.join("out"))
            .env("NOTIFY_SOCKET", &sock_path)
            .env("WATCHDOG_USEC", "1000000"),
        Duration::from_secs(120),
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let msgs = reader.join().unwrap();
    assert!(f.status.success(), "{}", f.describe());
    let count = |p: &str| msgs.iter().filter(|m| m.contains(p)).count();
    assert!(
        msgs.first()
            .is_some_and(|m| m.starts_with("READY=1\nSTATUS=sampling every process")),
        "{msgs:?}"
    );
    assert!(
        count("WATCHDOG=1") >= 4,
        "watchdog every 0.5 s for 3 s: {msgs:?}"
    );
    assert!(
        count("STATUS=wrote ") >= 2,
        "interval status lines: {msgs:?}"
    );
    assert!(
        msgs.last().is_some_and(|m| m.starts_with("STOPPING=1")),
        "{msgs:?}"
    );
}
