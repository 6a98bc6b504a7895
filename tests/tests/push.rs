//! Pushing to Pyroscope: a receiver written here checks each request the way
//! Pyroscope's documented ingest API expects it (POST /ingest, query
//! name/from/until/format, multipart/form-data with the pprof in file field
//! `profile`), and a receiver that is down for a while loses nothing.

mod service_common;

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, SystemTime};

use burstyd_tests::*;
use service_common::receiver::*;
use service_common::*;

fn push_config(out: &std::path::Path, port: u16, interval: &str) -> String {
    format!(
        r#"event = "cpu-clock"
freq = 199

[output]
dir = "{}"
interval = "{interval}"

[[push]]
kind = "pyroscope"
url = "http://127.0.0.1:{port}"
app = "burstyd.test"
labels = {{ env = "ci", host = "t1" }}
"#,
        out.display()
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The path profiles pushed: one per interval path profile written
/// (`paths-<time>.pb.gz`), byte for byte, each under `APP.paths` with the
/// path profile's sample types.
fn check_path_pushes(paths: &[Received], out: &std::path::Path, t0: u64) {
    let mut written: Vec<Vec<u8>> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("paths-") && n.ends_with(".pb.gz")
        })
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert!(!written.is_empty(), "no interval path profile was written");
    let mut pushed: Vec<Vec<u8>> = paths
        .iter()
        .map(|r| {
            assert_eq!(r.path, "/ingest");
            assert_eq!(
                r.query.get("name").map(String::as_str),
                Some("burstyd.test.paths{env=ci,host=t1}")
            );
            let from: u64 = r.query["from"].parse().unwrap();
            assert!(t0 <= from, "{from} {t0}");
            let parts = multipart(&r.headers["content-type"], &r.body);
            let stc: serde_json::Value =
                serde_json::from_slice(&parts["sample_type_config"].1).unwrap();
            assert_eq!(stc["executions"]["aggregation"], "sum", "{stc}");
            let profile = parts["profile"].1.clone();
            let p = pprof::decode_profile(&profile).unwrap();
            assert!(p.value_index("executions").is_some());
            assert!(
                p.samples.iter().any(|s| s.has_function("spinner_hot_loop")),
                "a pushed path profile without the spinner's paths"
            );
            profile
        })
        .collect();
    pushed.sort();
    written.sort();
    assert!(
        pushed == written,
        "the pushed path profiles are the interval path profiles written ({} pushed, {} written)",
        pushed.len(),
        written.len()
    );
}

/// Checks one request against Pyroscope's ingest API and returns the
/// pushed profile bytes.
fn check_ingest(r: &Received, t0: u64) -> Vec<u8> {
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/ingest");
    assert_eq!(
        r.query.get("name").map(String::as_str),
        Some("burstyd.test{env=ci,host=t1}"),
        "{:?}",
        r.query
    );
    assert_eq!(r.query.get("format").map(String::as_str), Some("pprof"));
    assert_eq!(r.query.get("sampleRate").map(String::as_str), Some("199"));
    let from: u64 = r.query["from"].parse().expect("from is unix seconds");
    let until: u64 = r.query["until"].parse().expect("until is unix seconds");
    assert!(
        t0 <= from && from < until && until <= unix_now() + 1,
        "{from} {until} (t0 {t0})"
    );
    let parts = multipart(&r.headers["content-type"], &r.body);
    let (fname, profile) = &parts["profile"];
    assert!(!fname.is_empty(), "profile must be a form file field");
    let p = pprof::decode_profile(profile).unwrap_or_else(|e| panic!("pushed profile: {e:#}"));
    assert!(p.value_index("samples").is_some() && p.value_index("cpu-clock").is_some());
    let (_, stc) = &parts["sample_type_config"];
    let stc: serde_json::Value = serde_json::from_slice(stc).unwrap();
    assert_eq!(stc["samples"]["units"], "samples", "{stc}");
    assert_eq!(stc["cpu-clock"]["aggregation"], "sum", "{stc}");
    profile.clone()
}

#[test]
fn pushes_each_profile_as_pyroscope_ingest_expects() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("push");
    let exe = fixture("spinner");
    let target = Background::spawn(Command::new(&exe).arg("20"));
    target.wait_exec(&exe);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = receiver(listener);
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    std::fs::write(&cfg, push_config(&out, port, "1s")).unwrap();
    let t0 = unix_now();
    let mut d = Daemon::start(
        &scratch.path,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--pid",
            &target.pid().to_string(),
        ],
    );
    d.wait_log("sampling pid", 20);
    std::thread::sleep(Duration::from_millis(3300));
    assert!(d.stop().success(), "{}", d.log());
    let all = got.lock().unwrap().clone();
    // Bursts (on for --pid) add the path profiles, pushed as their own
    // application, `burstyd.test.paths`.
    let (paths, got): (Vec<_>, Vec<_>) = all.into_iter().partition(|r| {
        r.query
            .get("name")
            .is_some_and(|n| n.starts_with("burstyd.test.paths{"))
    });
    let files = interval_files(&out);
    assert!(files.len() >= 3, "{files:?}");
    assert_eq!(
        got.len(),
        files.len(),
        "one push per interval profile:\n{}",
        d.log()
    );
    check_path_pushes(&paths, &out, t0);
    let mut pushed: Vec<Vec<u8>> = got.iter().map(|r| check_ingest(r, t0)).collect();
    let mut written: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    pushed.sort();
    written.sort();
    assert!(
        pushed == written,
        "the pushed profiles are the interval profiles written"
    );
    let spinner: i64 = got
        .iter()
        .map(|r| {
            let p =
                pprof::decode_profile(&multipart(&r.headers["content-type"], &r.body)["profile"].1)
                    .unwrap();
            p.samples
                .iter()
                .filter(|s| s.has_function("spinner_hot_loop"))
                .map(|s| s.values[0])
                .sum::<i64>()
        })
        .sum();
    assert!(
        spinner > 300,
        "{spinner} samples in spinner_hot_loop pushed"
    );
}

#[test]
fn receiver_down_for_a_while_loses_nothing() {
    require_root();
    let _serial = serial();
    let scratch = Scratch::new("outage");
    let exe = fixture("spinner");
    let target = Background::spawn(Command::new(&exe).arg("20"));
    target.wait_exec(&exe);
    let port = free_port();
    let out = scratch.join("out");
    let cfg = scratch.join("burstyd.toml");
    std::fs::write(&cfg, push_config(&out, port, "500ms")).unwrap();
    let t0 = unix_now();
    let mut d = Daemon::start(
        &scratch.path,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--pid",
            &target.pid().to_string(),
            // Context profiles only: path profiles are checked above.
            "--no-bursts",
        ],
    );
    d.wait_log("sampling pid", 20);
    // Nothing listens: pushes fail and profiles pile up in the spool.
    d.wait_log("retrying with backoff", 10);
    std::thread::sleep(Duration::from_millis(2000));
    let spool_dir = out.join("spool");
    let spooled = |dir: &std::path::Path| -> usize {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| std::fs::read_dir(e.path()).map(|r| r.count()).unwrap_or(0))
                    .sum()
            })
            .unwrap_or(0)
    };
    let waiting = spooled(&spool_dir);
    assert!(waiting >= 3, "{waiting} profiles spooled during the outage");
    // The backend comes back.
    let got = receiver(TcpListener::bind(("127.0.0.1", port)).unwrap());
    d.wait_log("works again", 40);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(d.stop().success(), "{}", d.log());
    let got = got.lock().unwrap().clone();
    let files = interval_files(&out);
    assert_eq!(
        got.len(),
        files.len(),
        "every profile produced was received ({} spooled during the outage)\n{}",
        waiting,
        d.log()
    );
    let mut pushed: Vec<Vec<u8>> = got.iter().map(|r| check_ingest(r, t0)).collect();
    // Resent in order.
    let froms: Vec<u64> = got
        .iter()
        .map(|r| r.query["from"].parse().unwrap())
        .collect();
    assert!(froms.windows(2).all(|w| w[0] <= w[1]), "{froms:?}");
    let mut written: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    pushed.sort();
    written.sort();
    assert!(
        pushed == written,
        "the received profiles are exactly the ones written"
    );
    assert_eq!(spooled(&spool_dir), 0, "the spool is empty at the end");
}
