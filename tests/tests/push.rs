//! Pushing to Pyroscope: a receiver written here checks each request the way
//! Pyroscope's documented ingest API expects it (POST /ingest, query
//! name/from/until/format, multipart/form-data with the pprof in file field
//! `profile`), and a receiver that is down for a while loses nothing.

mod service_common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use burstyd_tests::*;
use service_common::*;

#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).expect("bad %-escape"));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// A minimal HTTP/1.1 server on `listener` recording every request and
/// answering 200.
fn receiver(listener: TcpListener) -> Arc<Mutex<Vec<Received>>> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            let mut parts = line.split_whitespace();
            let method = parts.next().unwrap().to_string();
            let target = parts.next().unwrap().to_string();
            let mut headers = BTreeMap::new();
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap();
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
            let len: usize = headers
                .get("content-length")
                .expect("burstyd sends Content-Length")
                .parse()
                .unwrap();
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            let (path, q) = target.split_once('?').unwrap_or((&target, ""));
            let query = q
                .split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect();
            g.lock().unwrap().push(Received {
                method,
                path: path.to_string(),
                query,
                headers,
                body,
            });
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    got
}

/// The parts of a multipart/form-data body: name -> (filename, content).
fn multipart(content_type: &str, body: &[u8]) -> BTreeMap<String, (String, Vec<u8>)> {
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .unwrap_or_else(|| panic!("content type {content_type:?}"));
    let delim = format!("--{boundary}");
    let find = |hay: &[u8], from: usize, needle: &[u8]| {
        hay[from..]
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + from)
    };
    let mut parts = BTreeMap::new();
    let mut at = find(body, 0, delim.as_bytes()).expect("first boundary");
    assert_eq!(at, 0, "body starts with the boundary");
    loop {
        at += delim.len();
        if body[at..].starts_with(b"--") {
            assert_eq!(
                &body[at..],
                b"--\r\n",
                "body ends after the closing boundary"
            );
            break;
        }
        assert!(body[at..].starts_with(b"\r\n"));
        let head_end = find(body, at, b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&body[at + 2..head_end]).to_string();
        let next = find(body, head_end, format!("\r\n{delim}").as_bytes()).unwrap();
        let content = body[head_end + 4..next].to_vec();
        let disp = head
            .lines()
            .find(|l| {
                l.to_ascii_lowercase()
                    .starts_with("content-disposition: form-data;")
            })
            .unwrap_or_else(|| panic!("part without form-data disposition: {head}"));
        let attr = |k: &str| {
            disp.split(';')
                .find_map(|a| a.trim().strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        parts.insert(
            attr("name").unwrap(),
            (attr("filename").unwrap_or_default(), content),
        );
        at = next + 2;
    }
    parts
}

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
