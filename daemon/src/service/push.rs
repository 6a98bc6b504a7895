//! Pushing profiles to a Pyroscope or Parca server.
//!
//! Every profile meant for a destination is first written to that
//! destination's spool directory (`<output>/spool/<id>/NNNNNNNNNNNN.job`), then
//! sent oldest first by one task per destination; a file is deleted only
//! once the server accepted it. A failed send is retried with exponential
//! backoff (0.5 s doubling to 30 s), so an outage loses nothing as long as
//! the spool stays under its size limit (`spool_max_bytes`; over it the
//! oldest profiles go first, counted as dropped). Profiles still spooled at
//! exit are sent at the next start.
//!
//! Wire formats, as the servers document them:
//! - Pyroscope: `POST /ingest?name=APP{k=v,...}&from=S&until=S&format=pprof
//!   &sampleRate=HZ&spyName=burstyd`, body `multipart/form-data` with the
//!   gzip'd pprof in file field `profile` and, since our sample types are
//!   not Go's, a `sample_type_config` JSON file field.
//! - Parca: `POST /profiles/writeraw` (the gRPC gateway of
//!   `ProfileStoreService.WriteRaw`), JSON `{"series": [{"labels": {"labels":
//!   [{"name", "value"}...]}, "samples": [{"rawProfile": base64}]}]}`.
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{CONTENT_TYPE, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::service::config::PushKind;
use crate::service::metrics::METRICS;
use crate::service::settings::PushTarget;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// One profile to push.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Job {
    /// Unix seconds the profile starts and ends.
    pub(crate) from: u64,
    pub(crate) until: u64,
    /// Sampling frequency (0 in period mode).
    pub(crate) rate_hz: u64,
    /// The event sampled (the profile's second sample type).
    pub(crate) event: String,
    /// Which profile it is: a context profile goes by `APP`, the others
    /// each as its own profile, `APP.paths` and so on (Pyroscope's
    /// application name, Parca's `__name__`).
    #[serde(default)]
    pub(crate) family: Family,
    #[serde(skip)]
    pub(crate) profile: Vec<u8>,
}

/// Which profile family a job is: its name and sample types.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Family {
    /// The sampled calling contexts (`APP`).
    #[default]
    Contexts,
    /// A path profile of bursty tracing (`APP.paths`).
    Paths,
    /// Hot data streams, memory mode (`APP.streams`).
    Streams,
    /// The value profile, `--record values` (`APP.values`).
    Values,
    /// The call-target profile, `--record targets` (`APP.targets`).
    Targets,
}

impl Job {
    fn family(&self) -> Family {
        self.family
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("plain struct");
        v.push(b'\n');
        v.extend_from_slice(&self.profile);
        v
    }
    fn decode(bytes: &[u8]) -> Option<Job> {
        let nl = bytes.iter().position(|&b| b == b'\n')?;
        let mut j: Job = serde_json::from_slice(&bytes[..nl]).ok()?;
        j.profile = bytes[nl + 1..].to_vec();
        Some(j)
    }
}

/// A destination's on-disk queue.
struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    files: VecDeque<(PathBuf, u64)>,
    bytes: u64,
    next: u64,
}

impl Spool {
    fn open(dir: PathBuf, max_bytes: u64) -> std::io::Result<Spool> {
        std::fs::create_dir_all(&dir)?;
        let mut files: Vec<(u64, PathBuf, u64)> = std::fs::read_dir(&dir)?
            .filter_map(|e| {
                let e = e.ok()?;
                let seq = e.file_name().to_str()?.strip_suffix(".job")?.parse().ok()?;
                Some((seq, e.path(), e.metadata().ok()?.len()))
            })
            .collect();
        files.sort();
        let next = files.last().map(|f| f.0 + 1).unwrap_or(0);
        let bytes = files.iter().map(|f| f.2).sum();
        METRICS.push_queued.add(files.len() as u64);
        Ok(Spool {
            dir,
            max_bytes,
            files: files.into_iter().map(|(_, p, n)| (p, n)).collect(),
            bytes,
            next,
        })
    }

    fn push(&mut self, job: &Job) -> std::io::Result<()> {
        let data = job.encode();
        let path = self.dir.join(format!("{:012}.job", self.next));
        let tmp = self.dir.join(format!(".{:012}.tmp", self.next));
        std::io::Write::write_all(&mut crate::sys::create_output_file(&tmp)?, &data)?;
        std::fs::rename(&tmp, &path)?;
        self.next += 1;
        self.bytes += data.len() as u64;
        self.files.push_back((path, data.len() as u64));
        METRICS.push_spooled.inc();
        METRICS.push_queued.inc();
        while self.bytes > self.max_bytes && self.files.len() > 1 {
            let (p, _) = self.files.front().cloned().expect("len > 1");
            tracing::warn!(
                "push spool {} is over its limit of {} bytes: dropping the oldest profile {}",
                self.dir.display(),
                self.max_bytes,
                p.display()
            );
            self.pop();
            METRICS.push_dropped.inc();
        }
        Ok(())
    }

    fn front(&self) -> Option<&Path> {
        self.files.front().map(|f| f.0.as_path())
    }

    fn pop(&mut self) {
        if let Some((p, n)) = self.files.pop_front() {
            let _ = std::fs::remove_file(&p);
            self.bytes -= n;
            METRICS.push_queued.sub(1);
        }
    }

    fn len(&self) -> usize {
        self.files.len()
    }
}

/// Why a send failed.
#[derive(Debug)]
enum SendError {
    /// Worth retrying: connection refused, timeout, 5xx, 408, 429.
    Retry(String),
    /// The server refused this profile (4xx): retrying cannot help.
    Reject(String),
}

/// The push tasks, one per destination.
pub(crate) struct Pusher {
    workers: Vec<Worker>,
}

struct Worker {
    target: PushTarget,
    tx: Option<mpsc::UnboundedSender<Job>>,
    task: tokio::task::JoinHandle<()>,
}

impl Pusher {
    /// Starts one task per destination, spooling under `spool_root`.
    pub(crate) fn start(targets: &[PushTarget], spool_root: &Path) -> Pusher {
        let workers = targets
            .iter()
            .map(|t| {
                let (tx, rx) = mpsc::unbounded_channel();
                let dir = spool_root.join(t.id());
                let task = tokio::spawn(run_worker(t.clone(), dir, rx));
                Worker {
                    target: t.clone(),
                    tx: Some(tx),
                    task,
                }
            })
            .collect();
        Pusher { workers }
    }

    pub(crate) fn targets(&self) -> impl Iterator<Item = &PushTarget> {
        self.workers.iter().map(|w| &w.target)
    }

    /// Queues `job` for destination `i` (an index into the targets).
    pub(crate) fn submit(&self, i: usize, job: Job) {
        if let Some(tx) = self.workers.get(i).and_then(|w| w.tx.as_ref()) {
            let _ = tx.send(job);
        }
    }

    /// Lets every task send what it has for up to `grace`, then stops them;
    /// whatever is left stays in the spool for the next start.
    pub(crate) async fn shutdown(mut self, grace: Duration) {
        for w in &mut self.workers {
            w.tx = None;
        }
        let deadline = tokio::time::Instant::now() + grace;
        for w in &mut self.workers {
            if tokio::time::timeout_at(deadline, &mut w.task)
                .await
                .is_err()
            {
                w.task.abort();
                tracing::warn!(
                    "push to {}: not all profiles sent before exit; they stay spooled and are sent at the next start",
                    w.target.url
                );
            }
        }
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        for w in &self.workers {
            w.task.abort();
        }
    }
}

async fn run_worker(target: PushTarget, dir: PathBuf, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut spool = match Spool::open(dir.clone(), target.spool_max_bytes) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(
                "push to {}: cannot use spool directory {}: {e}; pushing to it is off",
                target.url,
                dir.display()
            );
            return;
        }
    };
    if spool.len() > 0 {
        tracing::info!(
            "push to {}: {} profiles left from an earlier run are queued",
            target.url,
            spool.len()
        );
    }
    let mut closed = false;
    let mut backoff = BACKOFF_MIN;
    let mut failing = false;
    let accept = |spool: &mut Spool, job: Job| {
        if let Err(e) = spool.push(&job) {
            tracing::error!("push spool {}: {e}; profile dropped", spool.dir.display());
            METRICS.push_dropped.inc();
        }
    };
    loop {
        while let Ok(job) = rx.try_recv() {
            accept(&mut spool, job);
        }
        let Some(path) = spool.front().map(Path::to_path_buf) else {
            if closed {
                return;
            }
            match rx.recv().await {
                Some(job) => accept(&mut spool, job),
                None => closed = true,
            }
            continue;
        };
        let job = match std::fs::read(&path).ok().and_then(|b| Job::decode(&b)) {
            Some(j) => j,
            None => {
                tracing::warn!("push spool: {} is unreadable; removed", path.display());
                spool.pop();
                METRICS.push_dropped.inc();
                continue;
            }
        };
        match send(&target, &job).await {
            Ok(()) => {
                spool.pop();
                METRICS.push_ok.inc();
                if failing {
                    tracing::info!(
                        "push to {} works again; {} profiles still queued",
                        target.url,
                        spool.len()
                    );
                }
                failing = false;
                backoff = BACKOFF_MIN;
            }
            Err(SendError::Reject(e)) => {
                METRICS.push_failed.inc();
                METRICS.push_dropped.inc();
                tracing::error!(
                    "push to {}: the server rejected a profile ({e}); dropped",
                    target.url
                );
                spool.pop();
            }
            Err(SendError::Retry(e)) => {
                METRICS.push_failed.inc();
                if !failing {
                    tracing::warn!(
                        "push to {} failed ({e}); retrying with backoff, profiles are kept in {}",
                        target.url,
                        dir.display()
                    );
                } else {
                    tracing::debug!("push to {} failed again: {e}", target.url);
                }
                failing = true;
                // Wait out the backoff, still accepting new profiles.
                let until = tokio::time::Instant::now() + backoff;
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => break,
                        j = rx.recv(), if !closed => match j {
                            Some(job) => accept(&mut spool, job),
                            None => closed = true,
                        },
                    }
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved).
fn query_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// The name a job's profiles go by: `APP`, `APP.paths` for path
/// profiles, `APP.streams` for hot data streams, `APP.values` and
/// `APP.targets` for the tuple profiles.
fn profile_name(t: &PushTarget, job: &Job) -> String {
    match job.family() {
        Family::Contexts => t.app.clone(),
        Family::Paths => format!("{}.paths", t.app),
        Family::Streams => format!("{}.streams", t.app),
        Family::Values => format!("{}.values", t.app),
        Family::Targets => format!("{}.targets", t.app),
    }
}

/// Pyroscope's application name: `app{k=v,...}`.
fn pyroscope_name(t: &PushTarget, job: &Job) -> String {
    let labels: Vec<String> = t.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{}{{{}}}", profile_name(t, job), labels.join(","))
}

/// The request (path with query, content type, body) for `job`.
fn build_request(t: &PushTarget, job: &Job) -> (String, String, Vec<u8>) {
    match t.kind {
        PushKind::Pyroscope => {
            let mut q = format!(
                "name={}&from={}&until={}&format=pprof",
                query_escape(&pyroscope_name(t, job)),
                job.from,
                job.until
            );
            if job.rate_hz > 0 {
                q += &format!("&sampleRate={}", job.rate_hz);
            }
            q += "&spyName=burstyd";
            let config = match job.family() {
                // Path executions, and the event attributed to paths.
                Family::Paths => serde_json::json!({
                    "executions": {"units": "objects", "aggregation": "sum", "display-name": "path_executions", "sampled": true},
                    job.event.clone(): {"units": "samples", "aggregation": "sum", "display-name": format!("path_{}", job.event.replace('-', "_")), "sampled": true},
                }),
                // The references a stream accounts for, its occurrences.
                Family::Streams => serde_json::json!({
                    "references": {"units": "objects", "aggregation": "sum", "display-name": "stream_references", "sampled": true},
                    "occurrences": {"units": "objects", "aggregation": "sum", "display-name": "stream_occurrences", "sampled": true},
                }),
                // The occurrences of each tuple (estimated).
                Family::Values | Family::Targets => serde_json::json!({
                    "tuples": {"units": "objects", "aggregation": "sum", "display-name": if job.family == Family::Values { "value_tuples" } else { "target_tuples" }, "sampled": true},
                }),
                Family::Contexts => serde_json::json!({
                    "samples": {"units": "samples", "aggregation": "sum", "display-name": "cpu", "sampled": true},
                    job.event.clone(): {"units": "samples", "aggregation": "sum", "display-name": job.event.replace('-', "_"), "sampled": true},
                }),
            };
            let config = serde_json::to_vec(&config).expect("json");
            let boundary = boundary_for(&[&job.profile, &config]);
            let mut body = Vec::with_capacity(job.profile.len() + config.len() + 512);
            for (name, file, ctype, data) in [
                (
                    "profile",
                    "profile.pb.gz",
                    "application/octet-stream",
                    &job.profile,
                ),
                (
                    "sample_type_config",
                    "sample_type_config.json",
                    "application/json",
                    &config,
                ),
            ] {
                body.extend_from_slice(
                    format!(
                        "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: {ctype}\r\n\r\n"
                    )
                    .as_bytes(),
                );
                body.extend_from_slice(data);
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
            (
                format!("{}/ingest?{q}", t.url.base),
                format!("multipart/form-data; boundary={boundary}"),
                body,
            )
        }
        PushKind::Parca => {
            let mut labels =
                vec![serde_json::json!({"name": "__name__", "value": profile_name(t, job)})];
            for (k, v) in &t.labels {
                labels.push(serde_json::json!({"name": k, "value": v}));
            }
            let body = serde_json::json!({
                "series": [{
                    "labels": {"labels": labels},
                    "samples": [{"rawProfile": base64(&job.profile)}],
                }],
                "normalized": false,
            });
            (
                format!("{}/profiles/writeraw", t.url.base),
                "application/json".into(),
                serde_json::to_vec(&body).expect("json"),
            )
        }
    }
}

/// A multipart boundary that occurs in none of `parts`.
fn boundary_for(parts: &[&[u8]]) -> String {
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (std::process::id() as u64) << 32;
    loop {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let b = format!("burstyd-{seed:016x}");
        if !parts
            .iter()
            .any(|p| p.windows(b.len()).any(|w| w == b.as_bytes()))
        {
            return b;
        }
    }
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        o.push(A[(n >> 18) as usize & 63] as char);
        o.push(A[(n >> 12) as usize & 63] as char);
        o.push(if c.len() > 1 {
            A[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        o.push(if c.len() > 2 {
            A[n as usize & 63] as char
        } else {
            '='
        });
    }
    o
}

async fn send(t: &PushTarget, job: &Job) -> Result<(), SendError> {
    let (path, ctype, body) = build_request(t, job);
    let retry = |what: &str, e: &dyn std::fmt::Display| SendError::Retry(format!("{what}: {e}"));
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect(&t.url.authority),
    )
    .await
    .map_err(|e| retry("connect", &e))?
    .map_err(|e| retry("connect", &e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| retry("handshake", &e))?;
    let conn = tokio::spawn(conn);
    let req = Request::post(path)
        .header(HOST, &t.url.authority)
        .header(CONTENT_TYPE, ctype)
        .header(USER_AGENT, concat!("burstyd/", env!("CARGO_PKG_VERSION")))
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| SendError::Reject(format!("building the request: {e}")))?;
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| retry("request", &e))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if status.is_success() {
            return Ok(());
        }
        let msg = format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)]).trim()
        );
        if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429 {
            Err(SendError::Reject(msg))
        } else {
            Err(SendError::Retry(msg))
        }
    };
    let r = tokio::time::timeout(REQUEST_TIMEOUT, result)
        .await
        .unwrap_or_else(|e| Err(retry("request", &e)));
    conn.abort();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::config::HttpUrl;

    fn target(kind: PushKind) -> PushTarget {
        PushTarget {
            kind,
            url: HttpUrl::parse("http://127.0.0.1:4040/base").unwrap(),
            app: "web".into(),
            labels: [
                ("env".to_string(), "prod".to_string()),
                ("az".to_string(), "b".to_string()),
            ]
            .into_iter()
            .collect(),
            interval: Duration::from_secs(10),
            spool_max_bytes: 1 << 20,
        }
    }

    fn job() -> Job {
        Job {
            from: 100,
            until: 110,
            rate_hz: 199,
            event: "cpu-clock".into(),
            family: Family::Contexts,
            profile: vec![0x1f, 0x8b, 1, 2, 3],
        }
    }

    #[test]
    fn pyroscope_request() {
        let (path, ct, body) = build_request(&target(PushKind::Pyroscope), &job());
        assert_eq!(
            path,
            "/base/ingest?name=web%7Baz%3Db%2Cenv%3Dprod%7D&from=100&until=110&format=pprof&sampleRate=199&spyName=burstyd"
        );
        let b = ct.strip_prefix("multipart/form-data; boundary=").unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with(&format!(
            "--{b}\r\nContent-Disposition: form-data; name=\"profile\""
        )));
        assert!(text.ends_with(&format!("--{b}--\r\n")));
        assert!(text.contains("name=\"sample_type_config\""));
    }

    /// Hot data streams and the tuple profiles are profiles of their own,
    /// with their own sample types; a spooled job keeps its family.
    #[test]
    fn streams_and_tuples_go_by_their_own_name() {
        for (family, name, display) in [
            (Family::Streams, "streams", "stream_references"),
            (Family::Values, "values", "value_tuples"),
            (Family::Targets, "targets", "target_tuples"),
        ] {
            let mut j = job();
            j.family = family;
            let (path, _, body) = build_request(&target(PushKind::Pyroscope), &j);
            assert!(path.contains(&format!("name=web.{name}%7B")), "{path}");
            assert!(String::from_utf8_lossy(&body).contains(display));
            let (_, _, body) = build_request(&target(PushKind::Parca), &j);
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                v["series"][0]["labels"]["labels"][0]["value"],
                format!("web.{name}")
            );
            assert_eq!(Job::decode(&j.encode()).unwrap(), j);
        }
    }

    #[test]
    fn parca_request() {
        let (path, ct, body) = build_request(&target(PushKind::Parca), &job());
        assert_eq!(path, "/base/profiles/writeraw");
        assert_eq!(ct, "application/json");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["series"][0]["samples"][0]["rawProfile"], "H4sBAgM=");
        assert_eq!(v["series"][0]["labels"]["labels"][0]["value"], "web");
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn spool_round_trip_and_limit() {
        let dir = std::env::temp_dir().join(format!("burstyd-spool-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = Spool::open(dir.clone(), 1 << 20).unwrap();
        for i in 0..3 {
            let mut j = job();
            j.from = i;
            s.push(&j).unwrap();
        }
        drop(s);
        let mut s = Spool::open(dir.clone(), 200).unwrap();
        assert_eq!(s.len(), 3);
        let first = Job::decode(&std::fs::read(s.front().unwrap()).unwrap()).unwrap();
        assert_eq!((first.from, &first.profile[..]), (0, &job().profile[..]));
        // Over the limit: the oldest go first.
        s.push(&job()).unwrap();
        assert!(s.bytes <= 200 && s.len() >= 1, "{} bytes", s.bytes);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
