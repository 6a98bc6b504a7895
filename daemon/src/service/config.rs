//! The configuration file (`/etc/burstyd/burstyd.toml`, or `--config FILE`)
//! and the effective settings: file values overridden by command-line flags.
//!
//! Every error names the file, line and column and says why; on SIGHUP a
//! file with an error is rejected as a whole and the previous settings stay.
//! Unknown keys are errors (a typo must not silently do nothing).
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use burstyd_common::addr::Pid;
use serde::{Deserialize, Deserializer, de};
use toml::Spanned;

use crate::bursts::options::Libraries;

/// Where the service looks when no `--config` is given.
pub(crate) const DEFAULT_PATH: &str = "/etc/burstyd/burstyd.toml";

/// The file as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub(crate) event: Option<String>,
    pub(crate) period: Option<Spanned<u64>>,
    pub(crate) freq: Option<Spanned<u64>>,
    pub(crate) kernel_stacks: Option<bool>,
    #[serde(default)]
    pub(crate) output: OutputConfig,
    #[serde(default)]
    pub(crate) http: HttpConfig,
    #[serde(default)]
    pub(crate) push: Vec<PushConfig>,
    #[serde(default)]
    pub(crate) bursts: BurstsConfig,
    #[serde(default, rename = "target")]
    pub(crate) targets: Vec<Target>,
}

/// `[bursts]`: bursty tracing of the processes `[[target]]` selects.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct BurstsConfig {
    /// Whether selected processes are traced in bursts (a `[[target]]`'s
    /// own `bursts` beats it); sampling every process never is.
    pub(crate) enabled: Option<bool>,
    /// Checks per burst (`--burst`).
    pub(crate) burst: Option<u64>,
    /// How many processes are traced in bursts at once; the others are
    /// sampled only.
    pub(crate) max_traced: Option<Spanned<usize>>,
    /// Measure each path's time (`--path-time`).
    pub(crate) path_time: Option<bool>,
    /// Which shared libraries get clones: `"hot"` (those holding 1% of
    /// the process's samples; the default for `[[target]]`s), `"all"` or
    /// `true`, `"none"` or `false` (`--exe-only`).
    pub(crate) libraries: Option<Spanned<LibrariesValue>>,
    /// Bursts at once in one process, each on its own thread (1 to 8).
    pub(crate) max_bursts: Option<Spanned<u64>>,
    /// Refused with a reason: a full trace is for `burstyd run`.
    pub(crate) full_trace: Option<Spanned<bool>>,
    /// How bursts are weighted into the estimates: `"uniform"` or
    /// `"static"` (`--weights`).
    pub(crate) weights: Option<crate::bursts::estimate::Weighting>,
    /// What bursts record besides paths: `["refs"]` (`--record refs`).
    pub(crate) record: Option<Vec<crate::bursts::options::Record>>,
    /// With `record = ["refs"]`, the stack's references too
    /// (`--refs-stack`).
    pub(crate) refs_stack: Option<bool>,
    /// With `record = ["refs"]`, the references one burst records (1 to
    /// 65536, `--refs-burst`).
    pub(crate) refs_burst: Option<Spanned<u64>>,
}

/// `libraries = true | false | "hot" | "all" | "none"`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub(crate) enum LibrariesValue {
    Bool(bool),
    Word(String),
}

impl LibrariesValue {
    pub(crate) fn get(&self) -> Option<Libraries> {
        use Libraries;
        Some(match self {
            LibrariesValue::Bool(true) => Libraries::All,
            LibrariesValue::Bool(false) => Libraries::None,
            LibrariesValue::Word(w) => match w.as_str() {
                "hot" => Libraries::Hot,
                "all" => Libraries::All,
                "none" => Libraries::None,
                _ => return None,
            },
        })
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct OutputConfig {
    pub(crate) dir: Option<PathBuf>,
    pub(crate) interval: Option<Secs>,
    /// Keep at most this many interval profiles (oldest deleted first).
    pub(crate) keep: Option<usize>,
    /// Delete interval profiles older than this.
    pub(crate) max_age: Option<Secs>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpConfig {
    /// `host:port`, or a Unix socket's path; absent = no HTTP endpoint.
    /// A bare port means loopback.
    #[serde(default, deserialize_with = "de_listen")]
    pub(crate) listen: Option<Listen>,
}

/// Where the HTTP endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Listen {
    /// A TCP address: whoever can connect reads every profile.
    Tcp(SocketAddr),
    /// A Unix socket, mode 0660: only its owner (root) and its group can
    /// connect.
    Unix(PathBuf),
}

impl std::fmt::Display for Listen {
    /// As a person would reach it: `http://127.0.0.1:6060/`, or
    /// `unix:/run/burstyd/http.sock` (`curl --unix-socket PATH http://x/`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "http://{a}/"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PushKind {
    Pyroscope,
    Parca,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct PushConfig {
    pub(crate) kind: PushKind,
    #[serde(deserialize_with = "de_http_url")]
    pub(crate) url: HttpUrl,
    #[serde(default = "default_app", deserialize_with = "de_app")]
    pub(crate) app: String,
    #[serde(default, deserialize_with = "de_labels")]
    pub(crate) labels: BTreeMap<String, String>,
    /// How much time one pushed profile covers (default: the profile
    /// interval).
    pub(crate) interval: Option<Secs>,
    pub(crate) spool_max_bytes: Option<u64>,
}

fn default_app() -> String {
    "burstyd".into()
}

/// A `[[target]]`: which processes to sample, whether to trace them in
/// bursts (`None`: as `[bursts] enabled` says), and what their bursts
/// record besides paths (`None`: as `[bursts] record` says).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Target {
    pub(crate) spec: TargetSpec,
    pub(crate) bursts: Option<bool>,
    pub(crate) record: Option<Vec<crate::bursts::options::Record>>,
}

impl From<TargetSpec> for Target {
    fn from(spec: TargetSpec) -> Target {
        Target {
            spec,
            bursts: None,
            record: None,
        }
    }
}

/// Which processes to sample: `{ pid = N }`, `{ exe = "/usr/bin/foo" }`,
/// `{ unit = "nginx.service" }` or `{ cgroup = "/system.slice/x" }`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum TargetSpec {
    Pid(Pid),
    Exe(PathBuf),
    Unit(String),
    Cgroup(String),
}

impl std::fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::Pid(p) => write!(f, "pid {p}"),
            TargetSpec::Exe(p) => write!(f, "exe {}", p.display()),
            TargetSpec::Unit(u) => write!(f, "unit {u}"),
            TargetSpec::Cgroup(c) => write!(f, "cgroup {c}"),
        }
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            pid: Option<u32>,
            exe: Option<PathBuf>,
            unit: Option<String>,
            cgroup: Option<String>,
            bursts: Option<bool>,
            record: Option<Vec<crate::bursts::options::Record>>,
        }
        let r = Raw::deserialize(d)?;
        let mut v = Vec::new();
        if let Some(p) = r.pid {
            v.push(TargetSpec::Pid(Pid(p)));
        }
        if let Some(e) = r.exe {
            if !e.is_absolute() {
                return Err(de::Error::custom(format!(
                    "target exe {:?} must be an absolute path",
                    e.display().to_string()
                )));
            }
            v.push(TargetSpec::Exe(e));
        }
        if let Some(u) = r.unit {
            if u.is_empty() || u.contains('/') {
                return Err(de::Error::custom(format!(
                    "target unit {u:?} must be a unit name such as \"nginx.service\""
                )));
            }
            // systemctl's convention: a bare name is a service.
            let u = if u.contains('.') {
                u
            } else {
                format!("{u}.service")
            };
            v.push(TargetSpec::Unit(u));
        }
        if let Some(c) = r.cgroup {
            if !c.starts_with('/') {
                return Err(de::Error::custom(format!(
                    "target cgroup {c:?} must be a cgroup path starting with / (as in /proc/PID/cgroup)"
                )));
            }
            let c = c.trim_end_matches('/').to_string();
            v.push(TargetSpec::Cgroup(if c.is_empty() {
                "/".into()
            } else {
                c
            }));
        }
        match v.len() {
            1 => Ok(Target {
                spec: v.pop().unwrap(),
                bursts: r.bursts,
                record: r.record,
            }),
            0 => Err(de::Error::custom(
                "a [[target]] needs one of pid, exe, unit or cgroup",
            )),
            _ => Err(de::Error::custom(
                "a [[target]] takes only one of pid, exe, unit or cgroup (use one [[target]] per selector)",
            )),
        }
    }
}

/// Seconds: a number (`30`, `0.5`) or a string with a unit (`"500ms"`,
/// `"30s"`, `"5m"`, `"1h"`, `"7d"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Secs(pub Duration);

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            I(i64),
            F(f64),
            S(String),
        }
        let secs = match Raw::deserialize(d)? {
            Raw::I(i) => i as f64,
            Raw::F(f) => f,
            Raw::S(s) => parse_duration(&s).map_err(de::Error::custom)?,
        };
        Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|d| !d.is_zero())
            .map(Secs)
            .ok_or_else(|| de::Error::custom(format!("{secs} is not a positive duration")))
    }
}

fn parse_duration(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        format!("{s:?} is not a duration (e.g. 30, \"500ms\", \"30s\", \"5m\", \"1h\", \"7d\")")
    })?;
    let mul = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        u => {
            return Err(format!(
                "unknown unit {u:?} in {s:?} (use ms, s, m, h or d)"
            ));
        }
    };
    Ok(n * mul)
}

fn de_listen<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Listen>, D::Error> {
    let s = String::deserialize(d)?;
    parse_listen(&s).map(Some).map_err(de::Error::custom)
}

/// `host:port`, `[v6]:port`, a bare port (loopback), or an absolute path
/// (a Unix socket).
pub(crate) fn parse_listen(s: &str) -> Result<Listen, String> {
    if s.starts_with('/') {
        return Ok(Listen::Unix(PathBuf::from(s)));
    }
    if let Ok(port) = s.parse::<u16>() {
        return Ok(Listen::Tcp(SocketAddr::from(([127, 0, 0, 1], port))));
    }
    let s = s.replace("localhost:", "127.0.0.1:");
    s.parse().map(Listen::Tcp).map_err(|_| {
        format!(
            "listen address {s:?} is neither host:port (e.g. \"127.0.0.1:6060\") nor a Unix socket's absolute path"
        )
    })
}

/// An `http://host[:port][/base]` URL (no TLS: put a local proxy or agent
/// in front of a TLS-only backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpUrl {
    /// `host:port` to connect to (and the Host header).
    pub(crate) authority: String,
    /// Path prefix without trailing slash ("" for none).
    pub(crate) base: String,
}

impl HttpUrl {
    pub(crate) fn parse(s: &str) -> Result<HttpUrl, String> {
        if s.starts_with("https://") {
            return Err(format!(
                "{s:?}: https is not supported; push over http:// to the backend or a local TLS-terminating proxy"
            ));
        }
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| format!("{s:?} is not an http:// URL"))?;
        let (auth, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if auth.is_empty() || path.contains(['?', '#']) {
            return Err(format!("{s:?} is not an http://host[:port][/path] URL"));
        }
        let authority = if auth
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !auth.ends_with(']')
        {
            auth.to_string()
        } else {
            format!("{auth}:80")
        };
        Ok(HttpUrl {
            authority,
            base: path.trim_end_matches('/').to_string(),
        })
    }
}

impl std::fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.base)
    }
}

fn de_http_url<'de, D: Deserializer<'de>>(d: D) -> Result<HttpUrl, D::Error> {
    HttpUrl::parse(&String::deserialize(d)?).map_err(de::Error::custom)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn de_app<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if valid_name(&s) {
        Ok(s)
    } else {
        Err(de::Error::custom(format!(
            "app name {s:?} may only contain letters, digits, '_', '-' and '.'"
        )))
    }
}

fn de_labels<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let m = BTreeMap::<String, String>::deserialize(d)?;
    for (k, v) in &m {
        if !valid_name(k) || k.contains(['-', '.']) {
            return Err(de::Error::custom(format!(
                "label name {k:?} may only contain letters, digits and '_'"
            )));
        }
        if v.is_empty() || v.contains([',', '{', '}', '=', '"', '\n']) {
            return Err(de::Error::custom(format!(
                "label {k}: value {v:?} must be non-empty without , {{ }} = or quotes"
            )));
        }
    }
    Ok(m)
}

/// A configuration error with its place in the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}{place}: {reason}")]
pub(crate) struct ConfigError {
    pub(crate) path: String,
    /// `:LINE:COL`, or empty when the error concerns the whole file.
    pub(crate) place: String,
    pub(crate) reason: String,
}

impl ConfigError {
    fn at(path: &Path, text: &str, span: Option<Range<usize>>, reason: String) -> Self {
        let place = span
            .map(|s| {
                let (l, c) = line_col(text, s.start);
                format!(":{l}:{c}")
            })
            .unwrap_or_default();
        ConfigError {
            path: path.display().to_string(),
            place,
            reason,
        }
    }
}

/// 1-based line and column of byte offset `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, col)
}

/// A deserializer's message in words: Rust's type names (`expected
/// u64`) become what a value of that type is.
fn in_words(message: &str) -> String {
    let mut m = message.to_string();
    for (ty, words) in [
        ("u64", "a whole number"),
        ("u32", "a whole number"),
        ("usize", "a whole number"),
        ("i64", "a whole number"),
        ("f64", "a number"),
    ] {
        m = m.replace(&format!("expected {ty}"), &format!("expected {words}"));
    }
    m
}

/// Parses and checks configuration text (`path` is for messages).
pub(crate) fn parse(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    let cfg: FileConfig = toml::from_str(text).map_err(|e| {
        // toml's message carries its own location banner; keep the reason.
        ConfigError::at(path, text, e.span(), in_words(e.message().trim()))
    })?;
    if let (Some(p), Some(f)) = (&cfg.period, &cfg.freq) {
        let later = if p.span().start > f.span().start {
            p
        } else {
            f
        };
        return Err(ConfigError::at(
            path,
            text,
            Some(later.span()),
            "period and freq are exclusive: give one of them".into(),
        ));
    }
    for v in [&cfg.period, &cfg.freq].into_iter().flatten() {
        if *v.get_ref() == 0 {
            return Err(ConfigError::at(
                path,
                text,
                Some(v.span()),
                "period and freq must be positive".into(),
            ));
        }
    }
    if let Some(f) = &cfg.bursts.full_trace {
        return Err(ConfigError::at(
            path,
            text,
            Some(f.span()),
            "full_trace is not allowed in the service: it traces every event from the first burst on and slows the target many times over; use `burstyd run --full-trace -- PROGRAM` for ground truth".into(),
        ));
    }
    if let Some(l) = &cfg.bursts.libraries
        && l.get_ref().get().is_none()
    {
        return Err(ConfigError::at(
            path,
            text,
            Some(l.span()),
            "libraries must be \"hot\" (the libraries holding 1% of a process's samples), \"all\" (or true) or \"none\" (or false)".into(),
        ));
    }
    if let Some(m) = &cfg.bursts.max_traced
        && *m.get_ref() == 0
    {
        return Err(ConfigError::at(
            path,
            text,
            Some(m.span()),
            "max_traced must be at least 1 (to trace no process in bursts, set enabled = false)"
                .into(),
        ));
    }
    if let Some(m) = &cfg.bursts.max_bursts
        && !(1..=burstyd_common::burst::MAX_SLOTS as u64).contains(m.get_ref())
    {
        return Err(ConfigError::at(
            path,
            text,
            Some(m.span()),
            format!(
                "max_bursts must be 1 to {} (bursts at once in one process, each on its own thread)",
                burstyd_common::burst::MAX_SLOTS
            ),
        ));
    }
    if let Some(m) = &cfg.bursts.refs_burst
        && !(1..=1 << 16).contains(m.get_ref())
    {
        return Err(ConfigError::at(
            path,
            text,
            Some(m.span()),
            "refs_burst must be 1 to 65536 (the data references one burst records)".into(),
        ));
    }
    if let Some(e) = &cfg.event
        && let Err(err) = crate::sampling::events::parse_event(e)
    {
        // Span of the value: find `event` key's line.
        let at = text.find("event").map(|i| i..i + 5);
        return Err(ConfigError::at(path, text, at, format!("{err:#}")));
    }
    Ok(cfg)
}

/// Where the configuration comes from.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    /// Named with `--config`: a missing file is an error. The default path
    /// may be absent (built-in defaults then).
    pub(crate) explicit: bool,
}

/// Reads and parses the configuration. `Ok(None)`: the default file does
/// not exist.
pub(crate) fn load(src: &Source) -> Result<Option<FileConfig>, ConfigError> {
    match std::fs::read_to_string(&src.path) {
        Ok(text) => parse(&src.path, &text).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !src.explicit => Ok(None),
        Err(e) => Err(ConfigError {
            path: src.path.display().to_string(),
            place: String::new(),
            reason: format!("cannot read the configuration file: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<FileConfig, ConfigError> {
        parse(Path::new("/etc/burstyd/burstyd.toml"), text)
    }

    /// A value of the wrong type is told in words, not Rust's type names.
    #[test]
    fn wrong_types_are_said_in_words() {
        let e = p("[bursts]\nburst = \"x\"\n").unwrap_err();
        assert!(e.reason.contains("expected a whole number"), "{e}");
        assert!(!e.reason.contains("u64"), "{e}");
    }

    #[test]
    fn errors_have_line_and_reason() {
        let e = p("event = \"cpu-clock\"\n\n[output]\nintervall = 5\n").unwrap_err();
        assert!(
            e.to_string().starts_with("/etc/burstyd/burstyd.toml:4:1: "),
            "{e}"
        );
        assert!(e.reason.contains("unknown field `intervall`"), "{e}");
        let e = p("freq = 99\nperiod = 100\n").unwrap_err();
        assert_eq!(e.place, ":2:10", "{e}");
        assert!(e.reason.contains("exclusive"), "{e}");
        let e = p("[[target]]\nexe = \"/a\"\npid = 3\n").unwrap_err();
        assert!(
            e.place.starts_with(":1:") || e.place.starts_with(":2:"),
            "{e}"
        );
        assert!(e.reason.contains("only one of"), "{e}");
        let e = p("[http]\nlisten = \"nope\"\n").unwrap_err();
        assert_eq!(e.place, ":2:10", "{e}");
        let e = p("[output]\ninterval = \"5 parsecs\"\n").unwrap_err();
        assert!(
            e.place.starts_with(":2:") && e.reason.contains("unknown unit"),
            "{e}"
        );
        let e = p("[[push]]\nkind = \"pyroscope\"\nurl = \"https://x\"\n").unwrap_err();
        assert!(
            e.place.starts_with(":3:") && e.reason.contains("https"),
            "{e}"
        );
        let e = p("[[push]]\nkind = \"zipkin\"\nurl = \"http://x\"\n").unwrap_err();
        assert!(e.place.starts_with(":2:"), "{e}");
        let e = p("event = \"bogus\"\n").unwrap_err();
        assert!(e.place.starts_with(":1:"), "{e}");
        let e = p("[bursts]\nfull_trace = true\n").unwrap_err();
        assert!(
            e.place == ":2:14" && e.reason.contains("burstyd run --full-trace"),
            "{e}"
        );
        let e = p("[bursts]\nmax_bursts = 9\n").unwrap_err();
        assert!(e.place == ":2:14" && e.reason.contains("1 to 8"), "{e}");
        let e = p("[bursts]\nrefs_burst = 0\n").unwrap_err();
        assert!(e.place == ":2:14" && e.reason.contains("1 to 65536"), "{e}");
        let e = p("[bursts]\nmax_traced = 0\n").unwrap_err();
        assert!(e.place == ":2:14" && e.reason.contains("at least 1"), "{e}");
        let e = p("[[target]]\nexe = \"/a\"\nbursts = \"yes\"\n").unwrap_err();
        assert!(
            e.place.starts_with(":1:") || e.place.starts_with(":3:"),
            "{e}"
        );
        let e = p("freq = \n").unwrap_err();
        assert!(e.place.starts_with(":1:"), "{e}");
    }

    #[test]
    fn missing_files() {
        let dflt = Source {
            path: "/nonexistent/burstyd.toml".into(),
            explicit: false,
        };
        assert!(load(&dflt).unwrap().is_none());
        let expl = Source {
            explicit: true,
            ..dflt
        };
        let e = load(&expl).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
    }

    #[test]
    fn urls() {
        let u = HttpUrl::parse("http://127.0.0.1:4040/base/").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.base.as_str()),
            ("127.0.0.1:4040", "/base")
        );
        assert_eq!(HttpUrl::parse("http://pyro").unwrap().authority, "pyro:80");
        assert!(HttpUrl::parse("ftp://x").is_err());
        assert!(HttpUrl::parse("http://x/a?b").is_err());
    }
}
