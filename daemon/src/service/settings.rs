//! The effective settings the daemon runs with: the configuration file's
//! values ([`super::config`]) overridden by command-line flags, resolved
//! into bursts, push targets, sampling and output settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bursts::estimate::Weighting;
use crate::bursts::options::{BurstOptions, DEFAULT_BURST, Libraries};
use crate::sampling::events::{DEFAULT_FREQ, Sampling};
use crate::service::config::{FileConfig, HttpUrl, Listen, PushKind, Target, parse_listen};

/// Output directory when neither the file nor `-o` names one.
const DEFAULT_OUTPUT: &str = "burstyd-out";
/// Profile interval when push targets are configured but no interval is.
const DEFAULT_PUSH_INTERVAL: Duration = Duration::from_secs(60);
/// Per push target, the on-disk spool's size limit.
const DEFAULT_SPOOL_BYTES: u64 = 64 << 20;

/// Command-line values given explicitly; each beats the file's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overrides {
    pub(crate) event: Option<String>,
    pub(crate) period: Option<u64>,
    pub(crate) freq: Option<u64>,
    pub(crate) interval: Option<f64>,
    pub(crate) output: Option<PathBuf>,
    pub(crate) no_kernel: bool,
    pub(crate) http: Option<String>,
    /// `--pid`: replaces the file's targets.
    pub(crate) pids: Vec<u32>,
    /// `--no-bursts`, `--burst`, `--path-time`, `--exe-only`.
    pub(crate) no_bursts: bool,
    pub(crate) burst: Option<u64>,
    pub(crate) path_time: bool,
    pub(crate) exe_only: bool,
    /// `--max-bursts`.
    pub(crate) max_bursts: Option<u64>,
    /// `--weights`.
    pub(crate) weights: Option<Weighting>,
    /// `--record`, `--refs-stack`.
    pub(crate) record: Vec<crate::bursts::options::Record>,
    pub(crate) refs_stack: bool,
    /// `--refs-burst`.
    pub(crate) refs_burst: Option<u64>,
    /// `--sampler`, `--sample-rate`, `--strata`, `--sampler-reference`.
    pub(crate) sampler: Option<crate::bursts::options::Sampler>,
    pub(crate) sample_rate: Option<u64>,
    pub(crate) strata: Option<u64>,
    pub(crate) sampler_reference: bool,
}

/// How many processes the service traces in bursts at once by default.
pub(crate) const DEFAULT_MAX_TRACED: usize = 4;

/// Bursty tracing, resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BurstSettings {
    /// Whether targets are traced in bursts (a `[[target]]`'s own
    /// `bursts` beats it).
    pub(crate) enabled: bool,
    /// Checks per burst.
    pub(crate) burst: u64,
    /// Processes traced in bursts at once (configured targets).
    pub(crate) max_traced: usize,
    pub(crate) path_time: bool,
    pub(crate) libraries: Libraries,
    /// Bursts at once in one process (on as many threads).
    pub(crate) max_bursts: u64,
    /// How bursts are weighted into the estimates.
    pub(crate) weights: Weighting,
    /// Memory mode.
    pub(crate) refs: userspace_rewriter::codegen::Refs,
    /// `refs_stack`: what a target's own `record = ["refs"]` means.
    pub(crate) refs_stack: bool,
    /// References per burst that records them.
    pub(crate) refs_burst: u64,
    /// Tuple profiles: value tuples, target tuples, and how the target
    /// compresses them.
    pub(crate) values: bool,
    pub(crate) targets: bool,
    pub(crate) tuple_config: burstyd_common::burst::TupleConfig,
}

impl BurstSettings {
    /// The burst options these settings (the file and the command line)
    /// set, with the run-only ones (`full_trace`, `save_bursts`) as given.
    pub(crate) fn options(
        &self,
        full_trace: bool,
        save_bursts: Option<std::path::PathBuf>,
    ) -> BurstOptions {
        BurstOptions {
            burst_len: self.burst,
            full_trace,
            measure: self.path_time,
            max_bursts: self.max_bursts,
            libraries: self.libraries,
            save_bursts,
            weights: self.weights,
            refs: self.refs,
            refs_burst: self.refs_burst,
            values: self.values,
            targets: self.targets,
            tuple_config: self.tuple_config,
        }
    }
}

/// A push destination, resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PushTarget {
    pub(crate) kind: PushKind,
    pub(crate) url: HttpUrl,
    pub(crate) app: String,
    pub(crate) labels: BTreeMap<String, String>,
    /// Time covered by one pushed profile.
    pub(crate) interval: Duration,
    pub(crate) spool_max_bytes: u64,
}

impl PushTarget {
    /// A file-system-safe name, unique per destination (spool directory).
    pub(crate) fn id(&self) -> String {
        let kind = match self.kind {
            PushKind::Pyroscope => "pyroscope",
            PushKind::Parca => "parca",
        };
        let raw = format!(
            "{kind}-{}{}-{}",
            self.url.authority, self.url.base, self.app
        );
        raw.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }
}

/// The effective settings: file values, then command-line overrides, then
/// built-in defaults.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    pub(crate) event: String,
    pub(crate) sampling: Sampling,
    pub(crate) kernel_stacks: bool,
    pub(crate) output: PathBuf,
    /// Interval profiles (context-<time>.pb.gz) every this long.
    pub(crate) interval: Option<Duration>,
    pub(crate) keep: Option<usize>,
    pub(crate) max_age: Option<Duration>,
    pub(crate) http: Option<Listen>,
    pub(crate) push: Vec<PushTarget>,
    /// Selectors from the file (ignored when `--pid` or `run` is used).
    pub(crate) targets: Vec<Target>,
    pub(crate) bursts: BurstSettings,
    /// Which file (if any) these came from, for messages.
    pub(crate) source: Option<PathBuf>,
}

impl Settings {
    pub(crate) fn resolve(
        file: Option<&FileConfig>,
        source: Option<&Path>,
        o: &Overrides,
    ) -> anyhow::Result<Settings> {
        let empty = FileConfig::default();
        let f = file.unwrap_or(&empty);
        let sampling = match (o.period, o.freq) {
            (Some(0), _) | (_, Some(0)) => anyhow::bail!("--period and --freq must be positive"),
            (Some(p), _) => Sampling::Period(p),
            (None, Some(hz)) => Sampling::Frequency(hz),
            (None, None) => match (&f.period, &f.freq) {
                (Some(p), _) => Sampling::Period(*p.get_ref()),
                (None, Some(hz)) => Sampling::Frequency(*hz.get_ref()),
                (None, None) => Sampling::Frequency(DEFAULT_FREQ),
            },
        };
        let interval = match o.interval {
            Some(v) => Some(
                Duration::try_from_secs_f64(v)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        anyhow::anyhow!("--interval must be a positive number of seconds")
                    })?,
            ),
            None => f.output.interval.map(|s| s.0),
        };
        let push_iv: Option<Duration> = f
            .push
            .iter()
            .map(|p| p.interval.map(|s| s.0).unwrap_or(DEFAULT_PUSH_INTERVAL))
            .min();
        // Pushing needs interval profiles; a push interval shorter than the
        // profile interval cannot be honoured, so the profile interval
        // shrinks to it.
        let interval = match (interval, push_iv) {
            (Some(i), Some(p)) => Some(i.min(p)),
            (i, p) => i.or(p),
        };
        let http = match &o.http {
            Some(s) => Some(parse_listen(s).map_err(|e| anyhow::anyhow!("--http: {e}"))?),
            None => f.http.listen.clone(),
        };
        let push = f
            .push
            .iter()
            .map(|p| PushTarget {
                kind: p.kind,
                url: p.url.clone(),
                app: p.app.clone(),
                labels: p.labels.clone(),
                interval: p
                    .interval
                    .map(|s| s.0)
                    .or(interval)
                    .unwrap_or(DEFAULT_PUSH_INTERVAL),
                spool_max_bytes: p.spool_max_bytes.unwrap_or(DEFAULT_SPOOL_BYTES),
            })
            .collect();
        let targets = if o.pids.is_empty() {
            f.targets.clone()
        } else {
            Vec::new()
        };
        // What bursts record: the command line's list, else the file's.
        let record: &[crate::bursts::options::Record] = if o.record.is_empty() {
            f.bursts.record.as_deref().unwrap_or_default()
        } else {
            &o.record
        };
        Ok(Settings {
            event: o
                .event
                .clone()
                .or_else(|| f.event.clone())
                .unwrap_or_else(|| "cycles".into()),
            sampling,
            kernel_stacks: !o.no_kernel && f.kernel_stacks.unwrap_or(true),
            output: o
                .output
                .clone()
                .or_else(|| f.output.dir.clone())
                .unwrap_or_else(|| PathBuf::from(DEFAULT_OUTPUT)),
            interval,
            keep: f.output.keep,
            max_age: f.output.max_age.map(|s| s.0),
            http,
            push,
            targets,
            bursts: BurstSettings {
                enabled: !o.no_bursts && f.bursts.enabled.unwrap_or(true),
                burst: o.burst.or(f.bursts.burst).unwrap_or(DEFAULT_BURST),
                max_traced: f
                    .bursts
                    .max_traced
                    .as_ref()
                    .map(|m| *m.get_ref())
                    .unwrap_or(DEFAULT_MAX_TRACED),
                path_time: o.path_time || f.bursts.path_time.unwrap_or(false),
                libraries: match &f.bursts.libraries {
                    _ if o.exe_only => Libraries::None,
                    Some(l) => l.get_ref().get().unwrap_or(Libraries::Hot),
                    // The service's targets: the hot ones; `--pid` and
                    // `run`: all, from the first instruction.
                    None if o.pids.is_empty() && !f.targets.is_empty() => Libraries::Hot,
                    None => Libraries::All,
                },
                max_bursts: o
                    .max_bursts
                    .or(f.bursts.max_bursts.as_ref().map(|m| *m.get_ref()))
                    .unwrap_or(burstyd_common::burst::DEFAULT_MAX_BURSTS),
                weights: o.weights.or(f.bursts.weights).unwrap_or_default(),
                refs: crate::bursts::options::refs_mode(
                    record,
                    o.refs_stack || f.bursts.refs_stack.unwrap_or(false),
                ),
                refs_stack: o.refs_stack || f.bursts.refs_stack.unwrap_or(false),
                refs_burst: o
                    .refs_burst
                    .or(f.bursts.refs_burst.as_ref().map(|m| *m.get_ref()))
                    .unwrap_or(crate::bursts::options::DEFAULT_REFS_BURST),
                values: record.contains(&crate::bursts::options::Record::Values),
                targets: record.contains(&crate::bursts::options::Record::Targets),
                tuple_config: crate::bursts::options::tuple_config(
                    o.sampler,
                    o.sample_rate,
                    o.strata,
                    o.sampler_reference,
                ),
            },
            source: file.and(source).map(Path::to_path_buf),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::config::{ConfigError, FileConfig, Secs, TargetSpec, parse};
    use burstyd_common::addr::Pid;
    use std::path::Path;

    fn p(text: &str) -> Result<FileConfig, ConfigError> {
        parse(Path::new("/etc/burstyd/burstyd.toml"), text)
    }

    #[test]
    fn full_file_parses() {
        let c = p(r#"
event = "cpu-clock"
freq = 99
[output]
dir = "/var/lib/burstyd"
interval = "1m"
keep = 10
max_age = "7d"
[http]
listen = "127.0.0.1:6060"
[[push]]
kind = "pyroscope"
url = "http://pyro:4040/"
app = "web.cpu"
labels = { env = "prod", region = "eu1" }
interval = 30
[bursts]
burst = 200
max_traced = 2
path_time = true
weights = "static"
record = ["refs"]
[[target]]
exe = "/usr/bin/foo"
bursts = false
record = ["refs"]
[[target]]
unit = "nginx"
[[target]]
cgroup = "/system.slice/x.service/"
[[target]]
pid = 1
"#)
        .unwrap();
        assert_eq!(c.output.interval, Some(Secs(Duration::from_secs(60))));
        assert_eq!(c.output.max_age, Some(Secs(Duration::from_secs(7 * 86400))));
        assert_eq!(
            c.http.listen,
            Some(Listen::Tcp("127.0.0.1:6060".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("/run/burstyd/http.sock"),
            Ok(Listen::Unix(PathBuf::from("/run/burstyd/http.sock")))
        );
        assert_eq!(
            Listen::Unix(PathBuf::from("/run/b.sock")).to_string(),
            "unix:/run/b.sock"
        );
        assert_eq!(c.push[0].url.authority, "pyro:4040");
        assert_eq!(c.push[0].url.base, "");
        assert_eq!(
            c.targets,
            [
                Target {
                    spec: TargetSpec::Exe("/usr/bin/foo".into()),
                    bursts: Some(false),
                    record: Some(vec![crate::bursts::options::Record::Refs]),
                },
                TargetSpec::Unit("nginx.service".into()).into(),
                TargetSpec::Cgroup("/system.slice/x.service".into()).into(),
                TargetSpec::Pid(Pid(1)).into(),
            ]
        );
        let s = Settings::resolve(Some(&c), None, &Overrides::default()).unwrap();
        assert_eq!(s.sampling, Sampling::Frequency(99));
        assert_eq!(
            s.interval,
            Some(Duration::from_secs(30)),
            "push interval shrinks it"
        );
        assert_eq!(s.push[0].interval, Duration::from_secs(30));
        assert_eq!(
            s.bursts,
            BurstSettings {
                enabled: true,
                burst: 200,
                max_traced: 2,
                path_time: true,
                libraries: Libraries::Hot,
                max_bursts: burstyd_common::burst::DEFAULT_MAX_BURSTS,
                weights: Weighting::StaticCost,
                refs: userspace_rewriter::codegen::Refs::Data,
                refs_stack: false,
                refs_burst: crate::bursts::options::DEFAULT_REFS_BURST,
                values: false,
                targets: false,
                tuple_config: crate::bursts::options::tuple_config(None, None, None, false),
            }
        );
        let o = Overrides {
            event: Some("cycles".into()),
            period: Some(1000),
            output: Some("/tmp/x".into()),
            pids: vec![7],
            http: Some("6061".into()),
            no_bursts: true,
            burst: Some(9),
            exe_only: true,
            ..Default::default()
        };
        let s = Settings::resolve(Some(&c), None, &o).unwrap();
        assert_eq!(s.event, "cycles");
        assert_eq!(s.sampling, Sampling::Period(1000));
        assert_eq!(s.output, PathBuf::from("/tmp/x"));
        assert_eq!(s.http, Some(Listen::Tcp("127.0.0.1:6061".parse().unwrap())));
        assert!(s.targets.is_empty());
        assert_eq!(
            (s.bursts.enabled, s.bursts.burst, s.bursts.libraries),
            (false, 9, Libraries::None)
        );
    }

    /// The file shipped beside the unit parses, and its [bursts] are the
    /// defaults of a service with targets.
    #[test]
    fn the_shipped_file_parses() {
        let c = p(include_str!("../../../systemd/burstyd.toml")).unwrap();
        let s = Settings::resolve(Some(&c), None, &Overrides::default()).unwrap();
        let targeted = p("[[target]]\npid = 1\n").unwrap();
        let d = Settings::resolve(Some(&targeted), None, &Overrides::default()).unwrap();
        assert_eq!(s.bursts, d.bursts);
    }

    /// `libraries`: hot by default for `[[target]]`s, all for `--pid`,
    /// the words and booleans, and anything else refused at its place.
    #[test]
    fn libraries_hot_all_none() {
        use Libraries;
        let libs = |text: &str, o: &Overrides| {
            Settings::resolve(Some(&p(text).unwrap()), None, o)
                .unwrap()
                .bursts
                .libraries
        };
        let none = Overrides::default();
        let pid = Overrides {
            pids: vec![7],
            ..Default::default()
        };
        let t = "[[target]]\npid = 1\n";
        assert_eq!(libs(t, &none), Libraries::Hot);
        assert_eq!(libs(t, &pid), Libraries::All);
        assert_eq!(libs("", &none), Libraries::All);
        for (v, want) in [
            ("\"hot\"", Libraries::Hot),
            ("\"all\"", Libraries::All),
            ("true", Libraries::All),
            ("\"none\"", Libraries::None),
            ("false", Libraries::None),
        ] {
            assert_eq!(
                libs(&format!("[bursts]\nlibraries = {v}\n{t}"), &none),
                want,
                "{v}"
            );
        }
        let exe_only = Overrides {
            exe_only: true,
            ..Default::default()
        };
        assert_eq!(
            libs("[bursts]\nlibraries = \"hot\"\n", &exe_only),
            Libraries::None
        );
        let e = p("[bursts]\nlibraries = \"some\"\n").unwrap_err();
        assert!(
            e.place == ":2:13" && e.reason.contains("libraries must be"),
            "{e}"
        );
    }

    #[test]
    fn empty_file_is_defaults() {
        let s = Settings::resolve(Some(&p("").unwrap()), None, &Overrides::default()).unwrap();
        assert_eq!(s.event, "cycles");
        assert_eq!(s.sampling, Sampling::Frequency(DEFAULT_FREQ));
        assert_eq!(s.http, None);
        assert_eq!(s.interval, None);
        assert!(s.kernel_stacks);
        assert_eq!(
            s.bursts,
            BurstSettings {
                enabled: true,
                burst: DEFAULT_BURST,
                max_traced: DEFAULT_MAX_TRACED,
                path_time: false,
                libraries: Libraries::All,
                max_bursts: burstyd_common::burst::DEFAULT_MAX_BURSTS,
                weights: Weighting::Uniform,
                refs: userspace_rewriter::codegen::Refs::Off,
                refs_stack: false,
                refs_burst: crate::bursts::options::DEFAULT_REFS_BURST,
                values: false,
                targets: false,
                tuple_config: crate::bursts::options::tuple_config(None, None, None, false),
            }
        );
    }
}
