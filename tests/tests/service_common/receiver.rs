//! A minimal push receiver (what Pyroscope's ingest endpoint gets) for
//! the service tests.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

pub fn percent_decode(s: &str) -> String {
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
pub fn receiver(listener: TcpListener) -> Arc<Mutex<Vec<Received>>> {
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
pub fn multipart(content_type: &str, body: &[u8]) -> BTreeMap<String, (String, Vec<u8>)> {
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
