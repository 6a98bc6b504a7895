//! The HTTP endpoint (off unless `[http] listen` or `--http` is set):
//!
//! - `GET /debug/pprof/profile?seconds=N`: samples from now for N seconds
//!   (default 30), then that window as gzip'd pprof — what `go tool pprof
//!   http://HOST/debug/pprof/profile?seconds=N` and Parca/Pyroscope scrape
//!   jobs fetch.
//! - `GET /debug/pprof/context`: the last interval profile, or without
//!   intervals everything since start (what context.pb.gz will hold).
//! - `GET /debug/pprof/paths`: the latest path profile (bursty tracing: the
//!   last interval's, or at the end the session's), 404 while there is
//!   none; `?seconds=N`: the paths recorded from now for N seconds, like
//!   `/debug/pprof/profile` (404 when no process is traced in bursts).
//!   Both answer 503 with `Retry-After` while the first process is being
//!   attached (what and how far: [`crate::bursts::progress`]).
//! - `GET /debug/pprof/streams`: the latest interval's hot data streams
//!   (memory mode, `--record refs`; the JSON of `hot-streams.json`), or
//!   the output's `hot-streams.json`; `?seconds=N`: the streams of the
//!   references recorded from now for N seconds (404 when no process is
//!   traced in memory mode).
//! - `GET /metrics`: Prometheus text ([`crate::service::metrics`]).
//! - `GET /healthz`: `ok`.
//!
//! On TCP (no authentication: whoever can connect reads every profile)
//! or on a Unix socket (mode 0660: its owner and group only; `curl
//! --unix-socket PATH http://burstyd/metrics`).
//!
//! hyper's HTTP/1 server on the daemon's single-threaded runtime. Profiles
//! are built by the session loop, which owns the trees: a request carries a
//! oneshot sender through a channel and waits for the bytes.
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};

use crate::service::config::Listen;

/// What a profile request asks the session for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ProfileKind {
    /// Samples from now for this long.
    Window(Duration),
    /// The last interval profile, or the whole session so far.
    Context,
    /// The paths bursts record from now for this long.
    Paths(Duration),
    /// The hot data streams of the references bursts record from now for
    /// this long (memory mode; JSON).
    Streams(Duration),
    /// The tuple profile of a kind (`--record values` or `targets`) of
    /// the tuples bursts make from now for this long.
    Tuples(crate::bursts::decode::TupleKind, Duration),
}

/// The start of a reply that is a 404 (nothing to profile), not a failure.
pub(crate) const NOT_FOUND: &str = "not found: ";
/// The prefix of an error that will pass (an attach under way): 503 with
/// `Retry-After`.
pub(crate) const UNAVAILABLE: &str = "unavailable: ";

/// Seconds a client is asked to wait when a profile is not ready yet.
const RETRY_AFTER_SECS: u64 = 5;

/// 503, try again in a few seconds: `why` (a line for a person).
fn retry_later(why: &str) -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"));
    r.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from(RETRY_AFTER_SECS),
    );
    r
}

/// A request to the session loop; it answers with gzip'd pprof.
#[derive(Debug)]
pub(crate) struct ProfileRequest {
    pub(crate) kind: ProfileKind,
    pub(crate) reply: oneshot::Sender<Result<Vec<u8>, String>>,
}

/// Longest window `/debug/pprof/profile` accepts.
const MAX_WINDOW: Duration = Duration::from_secs(3600);

static PATHS: Mutex<Option<Vec<u8>>> = Mutex::new(None);

/// Hook for bursty tracing: publishes the latest path profile (gzip'd
/// pprof, the content of `paths.pb.gz`) for `/debug/pprof/paths`.
pub(crate) fn set_paths_profile(gz: Vec<u8>) {
    *PATHS.lock().unwrap_or_else(|e| e.into_inner()) = Some(gz);
}

/// The latest published path profile, if any.
fn paths_profile() -> Option<Vec<u8>> {
    PATHS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

static STREAMS: Mutex<Option<Vec<u8>>> = Mutex::new(None);

/// Publishes the latest interval's hot data streams (the JSON of
/// `hot-streams.json`) for `/debug/pprof/streams`.
pub(crate) fn set_streams_report(json: Vec<u8>) {
    *STREAMS.lock().unwrap_or_else(|e| e.into_inner()) = Some(json);
}

fn streams_report() -> Option<Vec<u8>> {
    STREAMS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

static VALUES: Mutex<Option<Vec<u8>>> = Mutex::new(None);
static TARGETS: Mutex<Option<Vec<u8>>> = Mutex::new(None);

/// Where the latest tuple profile of `kind` is published.
fn tuples_slot(kind: crate::bursts::decode::TupleKind) -> &'static Mutex<Option<Vec<u8>>> {
    match kind {
        crate::bursts::decode::TupleKind::Target => &TARGETS,
        _ => &VALUES,
    }
}

/// Publishes the latest interval's tuple profile of `kind` (gzip'd
/// pprof, the content of `values.pb.gz` or `targets.pb.gz`) for
/// `/debug/pprof/values` or `/debug/pprof/targets`.
pub(crate) fn set_tuple_profile(kind: crate::bursts::decode::TupleKind, gz: Vec<u8>) {
    *tuples_slot(kind).lock().unwrap_or_else(|e| e.into_inner()) = Some(gz);
}

fn tuple_profile(kind: crate::bursts::decode::TupleKind) -> Option<Vec<u8>> {
    tuples_slot(kind)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

struct State {
    requests: mpsc::Sender<ProfileRequest>,
    /// Output directory: `/debug/pprof/paths` falls back to its paths.pb.gz.
    output: Mutex<PathBuf>,
}

/// A running endpoint; dropping it stops accepting connections (and
/// removes its Unix socket).
pub(crate) struct Server {
    listen: Listen,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
        if let Listen::Unix(p) = &self.listen {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The mode of the endpoint's Unix socket: its owner and group may
/// connect (connecting needs write permission), nobody else.
const SOCKET_MODE: u32 = 0o660;

/// Serves one connection.
fn serve<S>(st: Arc<State>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let svc = service_fn(move |req| handle(st.clone(), req));
        if let Err(e) = http1::Builder::new()
            .serve_connection(TokioIo::new(stream), svc)
            .await
        {
            tracing::debug!("http: connection: {e}");
        }
    });
}

/// An accept that failed: said, and a pause before the next.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!("http: accept: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

impl Server {
    /// Binds `listen` now (so that a port in use is an immediate error)
    /// and serves on the current runtime. A Unix socket left by an
    /// earlier run is replaced; the new one gets [`SOCKET_MODE`].
    pub(crate) fn start(
        listen: &Listen,
        requests: mpsc::Sender<ProfileRequest>,
        output: PathBuf,
    ) -> std::io::Result<Server> {
        let state = Arc::new(State {
            requests,
            output: Mutex::new(output),
        });
        let st = state.clone();
        let (listen, task) = match listen {
            Listen::Tcp(addr) => {
                let std_listener = std::net::TcpListener::bind(addr)?;
                std_listener.set_nonblocking(true)?;
                let listener = tokio::net::TcpListener::from_std(std_listener)?;
                let addr = listener.local_addr()?;
                let task = tokio::spawn(async move {
                    loop {
                        match listener.accept().await {
                            Ok((stream, _)) => serve(st.clone(), stream),
                            Err(e) => accept_failed(e).await,
                        }
                    }
                });
                (Listen::Tcp(addr), task)
            }
            Listen::Unix(path) => {
                use std::os::unix::fs::{FileTypeExt, PermissionsExt};
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                    std::fs::remove_file(path)?;
                }
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let std_listener = std::os::unix::net::UnixListener::bind(path)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))?;
                std_listener.set_nonblocking(true)?;
                let listener = tokio::net::UnixListener::from_std(std_listener)?;
                let task = tokio::spawn(async move {
                    loop {
                        match listener.accept().await {
                            Ok((stream, _)) => serve(st.clone(), stream),
                            Err(e) => accept_failed(e).await,
                        }
                    }
                });
                (Listen::Unix(path.clone()), task)
            }
        };
        Ok(Server {
            listen,
            state,
            task,
        })
    }

    /// Where it listens (a TCP port 0 resolved).
    pub(crate) fn listen(&self) -> &Listen {
        &self.listen
    }

    pub(crate) fn set_output(&self, dir: PathBuf) {
        *self.state.output.lock().unwrap_or_else(|e| e.into_inner()) = dir;
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body.into())))
        .expect("static response parts are valid")
}

fn json(body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

fn pprof(body: Vec<u8>, name: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(
            CONTENT_DISPOSITION,
            format!("attachment; filename=\"{name}\""),
        )
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// `seconds` from a query string: default 30, positive, at most an hour.
fn window_seconds(query: Option<&str>) -> Result<Duration, String> {
    let Some(v) = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("seconds="))
    else {
        return Ok(Duration::from_secs(30));
    };
    v.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero() && *d <= MAX_WINDOW)
        .ok_or_else(|| {
            format!(
                "seconds={v}: want a positive number of seconds, at most {}",
                MAX_WINDOW.as_secs()
            )
        })
}

async fn ask(st: &State, kind: ProfileKind) -> Response<Full<Bytes>> {
    let (tx, rx) = oneshot::channel();
    if st
        .requests
        .send(ProfileRequest { kind, reply: tx })
        .await
        .is_err()
    {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "burstyd is shutting down\n",
        );
    }
    match rx.await {
        Ok(Ok(bytes)) if matches!(kind, ProfileKind::Streams(_)) => json(bytes),
        Ok(Ok(bytes)) => pprof(bytes, "profile.pb.gz"),
        Ok(Err(e)) => match (e.strip_prefix(NOT_FOUND), e.strip_prefix(UNAVAILABLE)) {
            (Some(e), _) => text(StatusCode::NOT_FOUND, format!("{e}\n")),
            (_, Some(e)) => retry_later(e),
            _ => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        },
        Err(_) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "burstyd is shutting down\n",
        ),
    }
}

/// The latest published profile (`published`), else the output's file
/// `name`, as `answer` serves it; without either, 503 while a process is being attached (it will
/// come), else 404 saying there is no `what` and why (`never`).
fn latest(
    st: &State,
    name: &str,
    published: Option<Vec<u8>>,
    what: &str,
    never: &str,
    answer: impl FnOnce(Vec<u8>) -> Response<Full<Bytes>>,
) -> Response<Full<Bytes>> {
    let file = st
        .output
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .join(name);
    if let Some(b) = published.or_else(|| std::fs::read(&file).ok()) {
        return answer(b);
    }
    if crate::service::metrics::METRICS.attaching.get() > 0 {
        return retry_later(&format!(
            "no {what} yet: {}",
            crate::bursts::progress::now().map_or("an attach is queued".into(), |s| s.describe())
        ));
    }
    text(
        StatusCode::NOT_FOUND,
        format!("no {what} yet: {never} (nor is there {})\n", file.display()),
    )
}

async fn handle(
    st: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n"));
    }
    let resp = match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/metrics" => Response::builder()
            .header(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(Bytes::from(
                crate::service::metrics::METRICS.render(),
            )))
            .expect("static response parts are valid"),
        "/debug/pprof/profile" => match window_seconds(req.uri().query()) {
            Ok(d) => ask(&st, ProfileKind::Window(d)).await,
            Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
        },
        "/debug/pprof/context" => ask(&st, ProfileKind::Context).await,
        "/debug/pprof/paths" if req.uri().query().is_some_and(|q| q.contains("seconds=")) => {
            match window_seconds(req.uri().query()) {
                Ok(d) => ask(&st, ProfileKind::Paths(d)).await,
                Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            }
        }
        "/debug/pprof/paths" => latest(
            &st,
            "paths.pb.gz",
            paths_profile(),
            "path profile",
            "bursty tracing has not produced one",
            |b| pprof(b, "paths.pb.gz"),
        ),
        "/debug/pprof/streams" if req.uri().query().is_some_and(|q| q.contains("seconds=")) => {
            match window_seconds(req.uri().query()) {
                Ok(d) => ask(&st, ProfileKind::Streams(d)).await,
                Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            }
        }
        "/debug/pprof/streams" => latest(
            &st,
            "hot-streams.json",
            streams_report(),
            "hot data streams",
            "no interval of memory mode (--record refs) has ended",
            json,
        ),
        p @ ("/debug/pprof/values" | "/debug/pprof/targets") => {
            use crate::bursts::decode::TupleKind;
            let kind = if p.ends_with("targets") {
                TupleKind::Target
            } else {
                TupleKind::Value
            };
            let name = if kind == TupleKind::Target {
                "targets.pb.gz"
            } else {
                "values.pb.gz"
            };
            match req.uri().query().filter(|q| q.contains("seconds=")) {
                Some(q) => match window_seconds(Some(q)) {
                    Ok(d) => ask(&st, ProfileKind::Tuples(kind, d)).await,
                    Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
                },
                None => latest(
                    &st,
                    name,
                    tuple_profile(kind),
                    if kind == TupleKind::Target {
                        "call-target profile"
                    } else {
                        "value profile"
                    },
                    if kind == TupleKind::Target {
                        "no interval of bursts that record targets (--record targets) has ended"
                    } else {
                        "no interval of bursts that record values (--record values) has ended"
                    },
                    |b| pprof(b, name),
                ),
            }
        }
        "/" | "/debug/pprof" | "/debug/pprof/" => text(
            StatusCode::OK,
            "burstyd: /debug/pprof/profile?seconds=N /debug/pprof/context /debug/pprof/paths[?seconds=N] /debug/pprof/streams[?seconds=N] /debug/pprof/values[?seconds=N] /debug/pprof/targets[?seconds=N] /metrics /healthz\n",
        ),
        p => text(StatusCode::NOT_FOUND, format!("no such endpoint: {p}\n")),
    };
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_parameter() {
        assert_eq!(window_seconds(None), Ok(Duration::from_secs(30)));
        assert_eq!(
            window_seconds(Some("seconds=2")),
            Ok(Duration::from_secs(2))
        );
        assert_eq!(
            window_seconds(Some("a=b&seconds=0.5")),
            Ok(Duration::from_millis(500))
        );
        assert!(window_seconds(Some("seconds=0")).is_err());
        assert!(window_seconds(Some("seconds=x")).is_err());
        assert!(window_seconds(Some("seconds=100000")).is_err());
    }

    /// On a Unix socket: the endpoint answers there, the socket is mode
    /// 0660 (its owner and group may connect, nobody else), a socket an
    /// earlier run left is replaced, and the server removes it when it
    /// stops.
    #[test]
    fn a_unix_socket_serves_its_owner_and_group_only() {
        use std::os::unix::fs::PermissionsExt;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = std::env::temp_dir().join(format!("burstyd-http-unix-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("run/http.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, _rx) = mpsc::channel(1);
            let listen = Listen::Unix(path.clone());
            // An earlier run's socket is in the way.
            drop(std::os::unix::net::UnixListener::bind({
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                &path
            }));
            let server = Server::start(&listen, tx, dir.clone()).unwrap();
            assert_eq!(server.listen(), &listen);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o660, "{mode:o}");
            let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: burstyd\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut reply = String::new();
            c.read_to_string(&mut reply).await.unwrap();
            assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
            assert!(reply.ends_with("ok\n"), "{reply}");
            drop(server);
            assert!(!path.exists());
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
