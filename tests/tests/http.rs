//! The HTTP endpoint end to end: real clients (`curl`, `go tool pprof`)
//! fetch profiles from a running burstyd and read them.

mod service_common;

use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;
use service_common::*;

fn curl(url: &str, out: &std::path::Path) -> (u16, String) {
    let f = run_timeout(
        Command::new("curl").args(["-sS", "-o"]).arg(out).args([
            "-w",
            "%{http_code} %{content_type}",
            url,
        ]),
        Duration::from_secs(60),
    );
    assert!(f.status.success(), "curl {url}: {}", f.describe());
    let s = f.stdout_str();
    let (code, ct) = s.split_once(' ').unwrap_or((&s, ""));
    (code.parse().unwrap(), ct.to_string())
}

#[test]
fn go_tool_pprof_and_curl_read_profiles_from_the_endpoint() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("http");
    let exe = fixture("spinner");
    let target = Background::spawn(Command::new(&exe).arg("20"));
    target.wait_exec(&exe);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = Daemon::start(
        &scratch.path,
        &[
            "--no-config",
            "--pid",
            &target.pid().to_string(),
            "--freq",
            "499",
            "--http",
            &format!("127.0.0.1:{port}"),
            "-o",
            scratch.join("out").to_str().unwrap(),
        ],
    );
    d.wait_log("HTTP endpoint on", 20);

    // go tool pprof, the reference client, straight from the URL.
    let pprof_tmp = scratch.join("pprof");
    std::fs::create_dir_all(&pprof_tmp).unwrap();
    let f = run_timeout(
        Command::new("go")
            .args([
                "tool",
                "pprof",
                "-symbolize=none",
                "-top",
                "-sample_index=samples",
            ])
            .arg(format!("{base}/debug/pprof/profile?seconds=2"))
            .env("PPROF_TMPDIR", &pprof_tmp),
        Duration::from_secs(120),
    );
    assert!(f.status.success(), "go tool pprof: {}", f.describe());
    let (_, rows) = gopprof::parse_top(&f.stdout_str()).unwrap();
    let hot = rows.iter().find(|r| r.name == "spinner_hot_loop");
    assert!(
        hot.is_some_and(|r| r.flat_pct > 50.0),
        "spinner_hot_loop should dominate:\n{}",
        f.describe()
    );

    // curl: a window's profile decodes and holds about `seconds` of samples.
    let w = scratch.join("window.pb.gz");
    let (code, ct) = curl(&format!("{base}/debug/pprof/profile?seconds=1"), &w);
    assert_eq!((code, ct.as_str()), (200, "application/octet-stream"));
    let p = pprof::read_profile(&w).unwrap();
    assert_contract_shape(&p, "cpu-clock");
    let n = p.total_samples();
    assert!((300..=700).contains(&n), "1 s at 499 Hz gave {n} samples");
    assert!(p.samples.iter().any(|s| s.has_function("spinner_hot_loop")));

    // The session so far.
    let c = scratch.join("context.pb.gz");
    assert_eq!(curl(&format!("{base}/debug/pprof/context"), &c).0, 200);
    let ctx = pprof::read_profile(&c).unwrap();
    assert!(ctx.total_samples() >= n, "{} < {n}", ctx.total_samples());

    // No path profile yet: 404 with a reason.
    let m = scratch.join("paths.txt");
    assert_eq!(curl(&format!("{base}/debug/pprof/paths"), &m).0, 404);
    assert!(
        std::fs::read_to_string(&m)
            .unwrap()
            .contains("no path profile")
    );

    // Metrics and health.
    assert_eq!(curl(&format!("{base}/healthz"), &m).0, 200);
    assert_eq!(std::fs::read_to_string(&m).unwrap(), "ok\n");
    let (code, ct) = curl(&format!("{base}/metrics"), &m);
    assert_eq!(
        (code, ct.as_str()),
        (200, "text/plain; version=0.0.4; charset=utf-8")
    );
    let text = std::fs::read_to_string(&m).unwrap();
    let metric = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    };
    assert!(metric("burstyd_samples_total") >= ctx.total_samples() as f64);
    assert_eq!(metric("burstyd_ring_drops_total"), 0.0);
    assert!(metric("process_cpu_seconds_total") > 0.0);
    assert!(metric("process_resident_memory_bytes") > 1e6);
    for name in [
        "burstyd_bursts_taken_total",
        "burstyd_functions_rewritten_total",
        "burstyd_push_spooled_total",
        "burstyd_truncated_stacks_total",
    ] {
        metric(name);
    }
    assert_eq!(curl(&format!("{base}/nope"), &m).0, 404);
    assert!(d.stop().success(), "{}", d.log());
}
