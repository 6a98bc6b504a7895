//! A long attach shows as data while it runs: the service's first attach
//! to python3.11 with an empty plan cache (seconds of analysis in a worker
//! process) is `burstyd_attaching` 1 and a rising
//! `burstyd_attach_progress_ratio` on `/metrics`, and
//! `/debug/pprof/paths?seconds=N` answers 503 with `Retry-After` naming
//! the process (not 404 "no process is traced"); once its bursts run,
//! the gauge is 0 and the window answers 200.

mod service_common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use burstyd_tests::*;
use service_common::*;

/// `curl URL`: the HTTP status, the response headers (lower case) and the
/// body.
fn get(url: &str, dir: &Path) -> (u16, String, String) {
    let (head, body) = (dir.join("head.txt"), dir.join("body.txt"));
    let f = run_timeout(
        Command::new("curl")
            .args(["-sS", "-D"])
            .arg(&head)
            .arg("-o")
            .arg(&body)
            .args(["-w", "%{http_code}", url]),
        Duration::from_secs(60),
    );
    assert!(f.status.success(), "curl {url}: {}", f.describe());
    (
        f.stdout_str().trim().parse().unwrap(),
        std::fs::read_to_string(&head).unwrap().to_lowercase(),
        std::fs::read_to_string(&body).unwrap_or_default(),
    )
}

/// The value of the unlabelled series `name` in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// `burstyd_traced_bursts_total` of `pid` (0 when absent).
fn bursts_of(text: &str, pid: u32) -> f64 {
    text.lines()
        .find(|l| {
            l.starts_with("burstyd_traced_bursts_total{") && l.contains(&format!("pid=\"{pid}\""))
        })
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_cold_attach_shows_as_attaching_in_metrics_and_http() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("attach-progress");
    // A copy: a path of its own for the target, and the same bytes (a
    // plan cache key) as the installed one; the cache is this test's, so
    // empty.
    let python = scratch.join("python3.11");
    std::fs::copy(installed("/usr/bin/python3.11", "python3.11"), &python).unwrap();
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    let port = free_port();
    write_config(
        &cfg,
        &format!(
            "event = \"cpu-clock\"\n\n[output]\ndir = \"{}\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n\n[bursts]\nmax_traced = 1\n\n[[target]]\nexe = \"{}\"\n",
            out.display(),
            python.display()
        ),
    );
    let cache = scratch.join("cache");
    let mut d = Daemon::start_with(&scratch.path, &["--config", cfg.to_str().unwrap()], |c| {
        c.env("BURSTYD_CACHE_DIR", &cache);
    });
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(d.running(), "burstyd exited:\n{}", d.log());
        assert!(Instant::now() < deadline, "no HTTP endpoint:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Nothing to attach: idle, and no paths.
    let (_, _, m) = get(&format!("{base}/metrics"), &scratch.path);
    assert_eq!(metric(&m, "burstyd_attaching"), Some(0.0), "{m}");
    assert_eq!(
        metric(&m, "burstyd_attach_progress_ratio"),
        Some(0.0),
        "{m}"
    );
    let (status, _, body) = get(
        &format!("{base}/debug/pprof/paths?seconds=1"),
        &scratch.path,
    );
    assert_eq!(status, 404, "{body}");

    let target = Background::spawn(Command::new(&python).args([
        "-c",
        // Some work, mostly asleep: the attach has the CPUs.
        "import time\nt = time.time()\nwhile time.time() - t < 120:\n    sum(range(10000))\n    time.sleep(0.005)",
    ]));
    target.wait_exec(&python);
    let pid = target.pid();

    // While it is attached: what /metrics and the paths window say.
    let mut attaching_seen = 0;
    let mut ratios = Vec::new();
    let mut unavailable = Vec::new();
    let mut streams_unavailable = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, _, m) = get(&format!("{base}/metrics"), &scratch.path);
        if bursts_of(&m, pid) > 0.0 {
            break;
        }
        let attaching = metric(&m, "burstyd_attaching").expect("burstyd_attaching");
        let ratio = metric(&m, "burstyd_attach_progress_ratio").expect("the progress ratio");
        assert!((0.0..=1.0).contains(&ratio), "{m}");
        if attaching >= 1.0 {
            attaching_seen += 1;
            ratios.push(ratio);
            let (status, head, body) = get(
                &format!("{base}/debug/pprof/paths?seconds=0.1"),
                &scratch.path,
            );
            if status == 503 {
                assert!(head.contains("retry-after: "), "{head}");
                assert!(body.contains(&format!("pid {pid}")), "{body}");
                unavailable.push(body);
            }
            // The streams window too (what it would trace is not known
            // before the attach ends).
            let (status, head, body) = get(
                &format!("{base}/debug/pprof/streams?seconds=0.1"),
                &scratch.path,
            );
            if status == 503 {
                assert!(head.contains("retry-after: "), "{head}");
                streams_unavailable += 1;
            } else {
                assert!([200, 404].contains(&status), "{status} {body}");
            }
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} took no bursts within 120 s:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(attaching_seen > 0, "never attaching:\n{}", d.log());
    assert!(
        ratios.iter().any(|&r| r > 0.0 && r < 1.0),
        "no progress seen while attaching: {ratios:?}\n{}",
        d.log()
    );
    assert!(
        !unavailable.is_empty(),
        "the paths window never answered 503 while attaching ({attaching_seen} polls):\n{}",
        d.log()
    );

    assert!(
        streams_unavailable > 0,
        "the streams window never answered 503 while attaching"
    );

    // Traced: the gauge goes back to 0 (set each second), the window has
    // paths.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, m) = get(&format!("{base}/metrics"), &scratch.path);
        if metric(&m, "burstyd_attaching") == Some(0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "still attaching:\n{m}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, _, _) = get(
        &format!("{base}/debug/pprof/paths?seconds=1"),
        &scratch.path,
    );
    assert_eq!(status, 200, "{}", d.log());
    // Traced, but not in memory mode: no streams.
    let (status, _, body) = get(
        &format!("{base}/debug/pprof/streams?seconds=0.5"),
        &scratch.path,
    );
    assert_eq!(status, 404, "{body}");

    drop(target);
    assert!(d.stop().success(), "{}", d.log());
}
