//! Daemon-wide counters, served by `/metrics` in Prometheus text format.
//!
//! One static [`METRICS`] with atomic counters: any module increments what
//! it counts (`METRICS.bursts_taken.inc()`), the HTTP endpoint renders them.
//! Relaxed ordering throughout: these are statistics, not synchronisation.
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sampling::sampler::{Declined, KernelCounters};

/// One counter (monotonic) or gauge (set).
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub(crate) fn inc(&self) {
        self.add(1);
    }
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn sub(&self, n: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }
    pub(crate) fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Everything `/metrics` reports besides the process's own CPU and RSS.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    // Sampling (session loop).
    pub(crate) samples: Counter,
    pub(crate) ring_drops: Counter,
    pub(crate) truncated_stacks: Counter,
    pub(crate) no_unwind_info: Counter,
    pub(crate) unwind_errors: Counter,
    pub(crate) kernel_only: Counter,
    pub(crate) profiles_written: Counter,
    /// Gauge: processes currently selected by config targets.
    pub(crate) targets: Counter,
    // Push (push.rs).
    pub(crate) push_ok: Counter,
    pub(crate) push_failed: Counter,
    /// Profiles written to the spool (every pushed profile goes through it).
    pub(crate) push_spooled: Counter,
    /// Gauge: profiles waiting in the spool.
    pub(crate) push_queued: Counter,
    /// Profiles dropped: spool over its size limit, or rejected by the
    /// backend as malformed (4xx).
    pub(crate) push_dropped: Counter,
    // Bursty tracing (burst*.rs).
    pub(crate) bursts_taken: Counter,
    pub(crate) bursts_truncated: Counter,
    pub(crate) bursts_declined: Counter,
    /// Gauges mirroring the eBPF program's counters: burst signals sent,
    /// and not sent by reason ([`Declined::reasons`] order).
    pub(crate) burst_signals: Counter,
    pub(crate) burst_signals_declined: [Counter; 7],
    /// Gauges mirroring the eBPF program's counters: overflows while a
    /// burst ran, failed sends, link-map changes signalled and not.
    pub(crate) burst_busy: Counter,
    pub(crate) burst_signal_failed: Counter,
    pub(crate) link_signalled: Counter,
    pub(crate) link_unsignalled: Counter,
    pub(crate) functions_rewritten: Counter,
    pub(crate) functions_skipped: Counter,
    /// Execs of traced processes and `run`'s children whose new program
    /// was attached to, or not (`max_traced` reached).
    pub(crate) execs_followed: Counter,
    pub(crate) execs_not_followed: Counter,
    /// Event weight of traced processes' user-mode samples by where their
    /// leaf lies ([`HOT_WHERE`] order), added when a process's tracing ends.
    pub(crate) hot_weight: [Counter; 4],
    // Configuration.
    pub(crate) config_reloads: Counter,
    pub(crate) config_reload_failures: Counter,
    /// Gauge: executables whose attach failed, backing off.
    pub(crate) burst_backoff: Counter,
    /// Gauge: processes whose attach is queued or under way (set by the
    /// session; how far it is: [`crate::bursts::progress`]).
    pub(crate) attaching: Counter,
    /// The per-process series of the processes traced in bursts now
    /// (rendered text, refreshed by the session every second).
    pub(crate) traced: std::sync::Mutex<String>,
}

/// `where` labels of `burstyd_hot_weight_total`.
pub(crate) const HOT_WHERE: [&str; 4] = [
    "instrumented",
    "executable_uninstrumented",
    "library_instrumented",
    "other_modules",
];

impl Metrics {
    pub(crate) const fn new() -> Self {
        Metrics {
            samples: Counter::new(),
            ring_drops: Counter::new(),
            truncated_stacks: Counter::new(),
            no_unwind_info: Counter::new(),
            unwind_errors: Counter::new(),
            kernel_only: Counter::new(),
            profiles_written: Counter::new(),
            targets: Counter::new(),
            push_ok: Counter::new(),
            push_failed: Counter::new(),
            push_spooled: Counter::new(),
            push_queued: Counter::new(),
            push_dropped: Counter::new(),
            bursts_taken: Counter::new(),
            bursts_truncated: Counter::new(),
            bursts_declined: Counter::new(),
            burst_signals: Counter::new(),
            burst_signals_declined: [const { Counter::new() }; 7],
            burst_busy: Counter::new(),
            burst_signal_failed: Counter::new(),
            link_signalled: Counter::new(),
            link_unsignalled: Counter::new(),
            functions_rewritten: Counter::new(),
            functions_skipped: Counter::new(),
            execs_followed: Counter::new(),
            execs_not_followed: Counter::new(),
            hot_weight: [const { Counter::new() }; 4],
            config_reloads: Counter::new(),
            config_reload_failures: Counter::new(),
            burst_backoff: Counter::new(),
            attaching: Counter::new(),
            traced: std::sync::Mutex::new(String::new()),
        }
    }

    /// Replaces the per-process series (see [`traced_series`]).
    pub(crate) fn set_traced(&self, text: String) {
        *self.traced.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    /// Mirrors the eBPF program's counters.
    pub(crate) fn set_kernel_counters(&self, k: &KernelCounters) {
        self.ring_drops.set(k.ring_full);
        self.burst_signals.set(k.burst_signals);
        for (c, (_, n)) in self.burst_signals_declined.iter().zip(k.declined.reasons()) {
            c.set(n);
        }
        self.burst_busy.set(k.burst_busy);
        self.burst_signal_failed.set(k.burst_signal_failed);
        self.link_signalled.set(k.link_signalled);
        self.link_unsignalled.set(k.link_unsignalled);
    }

    /// Every series but the per-process ones: the one table `/metrics`
    /// and `summary.json` are both made from.
    pub(crate) fn table(&self) -> Vec<Series> {
        let c =
            |name, kind, help, x: &Counter| Series::new(name, kind, help, Value::Count(x.get()));
        let declined = Declined::default().reasons();
        let (cpu, rss) = self_cpu_and_rss();
        vec![
            c(
                "burstyd_samples_total",
                COUNTER,
                "Samples handled by the daemon.",
                &self.samples,
            ),
            c(
                "burstyd_ring_drops_total",
                COUNTER,
                "Samples lost because the ring buffer was full.",
                &self.ring_drops,
            ),
            c(
                "burstyd_truncated_stacks_total",
                COUNTER,
                "Samples whose user stack could not be unwound to its end.",
                &self.truncated_stacks,
            ),
            c(
                "burstyd_stacks_without_unwind_info_total",
                COUNTER,
                "Samples whose user stack stopped at code without unwind information.",
                &self.no_unwind_info,
            ),
            c(
                "burstyd_unwind_errors_total",
                COUNTER,
                "Samples whose user stack could not be unwound (an error).",
                &self.unwind_errors,
            ),
            c(
                "burstyd_kernel_only_samples_total",
                COUNTER,
                "Samples without user registers (kernel threads, or taken in the kernel only).",
                &self.kernel_only,
            ),
            c(
                "burstyd_profiles_written_total",
                COUNTER,
                "Profiles written to the output directory.",
                &self.profiles_written,
            ),
            c(
                "burstyd_targets",
                GAUGE,
                "Processes currently selected by the configured targets.",
                &self.targets,
            ),
            c(
                "burstyd_push_success_total",
                COUNTER,
                "Profiles accepted by a push backend.",
                &self.push_ok,
            ),
            c(
                "burstyd_push_failures_total",
                COUNTER,
                "Push attempts that failed (each is retried).",
                &self.push_failed,
            ),
            c(
                "burstyd_push_spooled_total",
                COUNTER,
                "Profiles queued in the on-disk push spool.",
                &self.push_spooled,
            ),
            c(
                "burstyd_push_queued",
                GAUGE,
                "Profiles waiting in the push spool.",
                &self.push_queued,
            ),
            c(
                "burstyd_push_dropped_total",
                COUNTER,
                "Profiles dropped: spool full, or rejected by the backend as invalid.",
                &self.push_dropped,
            ),
            c(
                "burstyd_bursts_taken_total",
                COUNTER,
                "Tracing bursts taken.",
                &self.bursts_taken,
            ),
            c(
                "burstyd_bursts_truncated_total",
                COUNTER,
                "Tracing bursts cut short.",
                &self.bursts_truncated,
            ),
            c(
                "burstyd_bursts_declined_total",
                COUNTER,
                "Tracing bursts declined.",
                &self.bursts_declined,
            ),
            c(
                "burstyd_functions_rewritten_total",
                COUNTER,
                "Functions rewritten for bursty tracing.",
                &self.functions_rewritten,
            ),
            c(
                "burstyd_burst_signals_total",
                COUNTER,
                "Burst signals sent by the eBPF program.",
                &self.burst_signals,
            ),
            Series::new(
                "burstyd_burst_signals_declined_total",
                COUNTER,
                "Overflows in traced processes that sent no burst signal, by reason (the program could have noticed it).",
                Value::by_label(
                    "reason",
                    declined
                        .iter()
                        .zip(&self.burst_signals_declined)
                        .map(|((r, _), c)| (*r, c.get())),
                ),
            ),
            c(
                "burstyd_burst_overflows_busy_total",
                COUNTER,
                "Overflows in traced processes while one of their bursts ran (no signal sent).",
                &self.burst_busy,
            ),
            c(
                "burstyd_burst_signal_failures_total",
                COUNTER,
                "Burst signals the eBPF program failed to send.",
                &self.burst_signal_failed,
            ),
            Series::new(
                "burstyd_link_map_changes_total",
                COUNTER,
                "Link-map changes (dlopen, dlclose) announced by traced processes' loaders: the handler was signalled to invalidate its tables, or not (the daemon did at its next drain).",
                Value::by_label(
                    "handler",
                    [
                        ("signalled", self.link_signalled.get()),
                        ("not_signalled", self.link_unsignalled.get()),
                    ],
                ),
            ),
            c(
                "burstyd_functions_skipped_total",
                COUNTER,
                "Functions the rewriter skipped.",
                &self.functions_skipped,
            ),
            Series::new(
                "burstyd_execs_total",
                COUNTER,
                "Execs of processes traced in bursts (and of run's command's children): the new program attached to (traced), or sampled only (max_traced processes traced already).",
                Value::by_label(
                    "program",
                    [
                        ("traced", self.execs_followed.get()),
                        ("sampled_only", self.execs_not_followed.get()),
                    ],
                ),
            ),
            Series::new(
                "burstyd_hot_weight_total",
                COUNTER,
                "Event weight of bursty-traced processes' user-mode samples, by where the leaf PC lies (the executable's hot coverage = instrumented / (instrumented + executable_uninstrumented); the process's = (instrumented + library_instrumented) / all; other_modules holds what is not instrumented outside the executable).",
                Value::by_label(
                    "where",
                    HOT_WHERE
                        .iter()
                        .zip(&self.hot_weight)
                        .map(|(w, c)| (*w, c.get())),
                ),
            ),
            c(
                "burstyd_config_reloads_total",
                COUNTER,
                "Successful configuration reloads (SIGHUP).",
                &self.config_reloads,
            ),
            c(
                "burstyd_config_reload_failures_total",
                COUNTER,
                "Rejected configuration reloads (the previous configuration stays).",
                &self.config_reload_failures,
            ),
            Series::new(
                "process_cpu_seconds_total",
                COUNTER,
                "CPU time (user + system) of the daemon, from /proc/self/stat.",
                Value::Real(cpu, 3),
            ),
            Series::new(
                "process_resident_memory_bytes",
                GAUGE,
                "Resident set size of the daemon, from /proc/self/statm.",
                Value::Count(rss),
            ),
            c(
                "burstyd_burst_backoff_executables",
                GAUGE,
                "Executables whose attach for bursts failed, waiting to be tried again.",
                &self.burst_backoff,
            ),
            c(
                "burstyd_attaching",
                GAUGE,
                "Processes selected for bursty tracing whose attach is queued or under way (not traced in bursts yet).",
                &self.attaching,
            ),
            Series::new(
                "burstyd_attach_progress_ratio",
                GAUGE,
                "How far the attach thread's work under way is, 0 to 1: an attach, or the cloning of a traced process's shared libraries (0 when it is idle; the log says which every few seconds).",
                Value::Real(crate::bursts::progress::now().map_or(0.0, |s| s.ratio), 3),
            ),
            Series::new(
                "burstyd_dwarf_worker_peak_rss_bytes",
                GAUGE,
                "The largest peak RSS of a DWARF worker process so far (a module's DWARF is read in a process of its own, for a moment, not in the daemon).",
                Value::Count(crate::stacks::dwarf_worker::PEAK_RSS.load(Ordering::Relaxed)),
            ),
        ]
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub(crate) fn render(&self) -> String {
        let mut s = String::with_capacity(4096);
        for series in self.table() {
            series.render_family(&mut s);
            series.render_rows(&mut s, "");
        }
        s.push_str(&self.traced.lock().unwrap_or_else(|e| e.into_inner()));
        s
    }
}

/// `# TYPE` of a series.
pub(crate) const COUNTER: &str = "counter";
pub(crate) const GAUGE: &str = "gauge";

/// A series' value: one number, or one per value of a label.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Count(u64),
    /// A real number, shown with this many decimals in `/metrics`.
    Real(f64, usize),
    /// (label name, [(label value, count)]).
    ByLabel(&'static str, Vec<(String, u64)>),
}

impl Value {
    pub(crate) fn by_label<S: Into<String>>(
        label: &'static str,
        rows: impl IntoIterator<Item = (S, u64)>,
    ) -> Self {
        Value::ByLabel(
            label,
            rows.into_iter().map(|(l, n)| (l.into(), n)).collect(),
        )
    }
}

/// One metric family: its name, `# TYPE`, `# HELP` and value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Series {
    pub(crate) name: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) help: &'static str,
    pub(crate) value: Value,
}

impl Series {
    pub(crate) fn new(
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        value: Value,
    ) -> Self {
        Series {
            name,
            kind,
            help,
            value,
        }
    }

    /// `# HELP` and `# TYPE`.
    fn render_family(&self, s: &mut String) {
        let name = self.name;
        let _ = writeln!(
            s,
            "# HELP {name} {}\n# TYPE {name} {}",
            self.help, self.kind
        );
    }

    /// The sample lines, with `labels` (`a="x",b="y"`) before the value's
    /// own.
    fn render_rows(&self, s: &mut String, labels: &str) {
        let name = self.name;
        let braces = |extra: &str| match (labels.is_empty(), extra.is_empty()) {
            (true, true) => String::new(),
            (false, true) => format!("{{{labels}}}"),
            (true, false) => format!("{{{extra}}}"),
            (false, false) => format!("{{{labels},{extra}}}"),
        };
        match &self.value {
            Value::Count(n) => {
                let _ = writeln!(s, "{name}{} {n}", braces(""));
            }
            Value::Real(x, decimals) => {
                let d = *decimals;
                let _ = writeln!(s, "{name}{} {x:.d$}", braces(""));
            }
            Value::ByLabel(label, rows) => {
                for (v, n) in rows {
                    let _ = writeln!(
                        s,
                        "{name}{} {n}",
                        braces(&format!("{label}=\"{}\"", esc(v)))
                    );
                }
            }
        }
    }
}

/// A label value, escaped for the text format.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

/// One process traced in bursts: its labels and its series (the same for
/// `/metrics` and `summary.json`).
pub(crate) struct TracedProcess {
    pub(crate) pid: u32,
    pub(crate) exe: String,
    /// Its `burstyd_traced_*` series, the same names in the same order
    /// for every process.
    pub(crate) series: Vec<Series>,
}

/// The per-process series of the processes traced in bursts (labels
/// `pid`, `exe`), Prometheus text. `empty` gives the families' names and
/// help when no process is traced.
pub(crate) fn traced_series(procs: &[TracedProcess], empty: &[Series]) -> String {
    let mut s = String::new();
    let families = procs.first().map_or(empty, |p| &p.series[..]);
    for (i, family) in families.iter().enumerate() {
        family.render_family(&mut s);
        for p in procs {
            if let Some(series) = p.series.get(i).filter(|x| x.name == family.name) {
                let labels = format!("pid=\"{}\",exe=\"{}\"", p.pid, esc(&p.exe));
                series.render_rows(&mut s, &labels);
            }
        }
    }
    s
}

/// The daemon's counters.
pub(crate) static METRICS: Metrics = Metrics::new();

/// (CPU seconds, RSS bytes) of this process from /proc/self.
fn self_cpu_and_rss() -> (f64, u64) {
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_stat_cpu_ticks(&s))
        .map(|t| t as f64 / tck)
        .unwrap_or(0.0);
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|p| p * page)
        .unwrap_or(0);
    (cpu, rss)
}

/// utime + stime (fields 14 and 15) of a /proc/PID/stat line; the comm
/// field may contain spaces and parentheses, so count from the last ')'.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 → index 11.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm() {
        let s = "1234 (a) b (c) R 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat_cpu_ticks(s), Some(300));
    }

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::new();
        m.samples.add(5);
        m.push_queued.add(2);
        m.push_queued.sub(3);
        let t = m.render();
        assert!(t.contains("# TYPE burstyd_samples_total counter\nburstyd_samples_total 5\n"));
        assert!(t.contains("burstyd_push_queued 0\n"));
        assert!(t.contains("process_resident_memory_bytes "));
        // Declines by reason, as labels.
        let mut k = KernelCounters::default();
        k.declined.blocked = 7;
        m.set_kernel_counters(&k);
        let t = m.render();
        assert!(
            t.contains("burstyd_burst_signals_declined_total{reason=\"signal_blocked\"} 7\n"),
            "{t}"
        );
        // Hot coverage weights, by where the leaf lies.
        m.hot_weight[1].add(30);
        let t = m.render();
        assert!(
            t.contains("burstyd_hot_weight_total{where=\"executable_uninstrumented\"} 30\n"),
            "{t}"
        );
        // Every line is a comment or `name value` / `name{label="v"} value`.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let (n, v) = l.rsplit_once(' ').unwrap();
            let name = n.split('{').next().unwrap();
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{l}"
            );
            if let Some(labels) = n.strip_prefix(name) {
                assert!(
                    labels.is_empty() || (labels.starts_with('{') && labels.ends_with("\"}")),
                    "{l}"
                );
            }
            assert!(v.parse::<f64>().is_ok(), "{l}");
        }
        let (cpu, rss) = self_cpu_and_rss();
        assert!(cpu >= 0.0 && rss > 0);
    }
}
