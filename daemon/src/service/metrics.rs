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
    pub(crate) functions_rewritten: Counter,
    pub(crate) functions_skipped: Counter,
    /// Event weight of traced processes' user-mode samples by where their
    /// leaf lies ([`HOT_WHERE`] order), added when a process's tracing ends.
    pub(crate) hot_weight: [Counter; 4],
    // Configuration.
    pub(crate) config_reloads: Counter,
    pub(crate) config_reload_failures: Counter,
    /// Gauge: executables whose attach failed, backing off.
    pub(crate) burst_backoff: Counter,
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
            functions_rewritten: Counter::new(),
            functions_skipped: Counter::new(),
            hot_weight: [const { Counter::new() }; 4],
            config_reloads: Counter::new(),
            config_reload_failures: Counter::new(),
            burst_backoff: Counter::new(),
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
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub(crate) fn render(&self) -> String {
        let mut s = String::with_capacity(4096);
        let mut one = |name: &str, kind: &str, help: &str, v: String| {
            let _ = write!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            );
        };
        let c = |x: &Counter| x.get().to_string();
        one(
            "burstyd_samples_total",
            "counter",
            "Samples handled by the daemon.",
            c(&self.samples),
        );
        one(
            "burstyd_ring_drops_total",
            "counter",
            "Samples lost because the ring buffer was full.",
            c(&self.ring_drops),
        );
        one(
            "burstyd_truncated_stacks_total",
            "counter",
            "Samples whose user stack could not be unwound to its end.",
            c(&self.truncated_stacks),
        );
        one(
            "burstyd_profiles_written_total",
            "counter",
            "Profiles written to the output directory.",
            c(&self.profiles_written),
        );
        one(
            "burstyd_targets",
            "gauge",
            "Processes currently selected by the configured targets.",
            c(&self.targets),
        );
        one(
            "burstyd_push_success_total",
            "counter",
            "Profiles accepted by a push backend.",
            c(&self.push_ok),
        );
        one(
            "burstyd_push_failures_total",
            "counter",
            "Push attempts that failed (each is retried).",
            c(&self.push_failed),
        );
        one(
            "burstyd_push_spooled_total",
            "counter",
            "Profiles queued in the on-disk push spool.",
            c(&self.push_spooled),
        );
        one(
            "burstyd_push_queued",
            "gauge",
            "Profiles waiting in the push spool.",
            c(&self.push_queued),
        );
        one(
            "burstyd_push_dropped_total",
            "counter",
            "Profiles dropped: spool full, or rejected by the backend as invalid.",
            c(&self.push_dropped),
        );
        one(
            "burstyd_bursts_taken_total",
            "counter",
            "Tracing bursts taken.",
            c(&self.bursts_taken),
        );
        one(
            "burstyd_bursts_truncated_total",
            "counter",
            "Tracing bursts cut short.",
            c(&self.bursts_truncated),
        );
        one(
            "burstyd_bursts_declined_total",
            "counter",
            "Tracing bursts declined.",
            c(&self.bursts_declined),
        );
        one(
            "burstyd_functions_rewritten_total",
            "counter",
            "Functions rewritten for bursty tracing.",
            c(&self.functions_rewritten),
        );
        one(
            "burstyd_burst_signals_total",
            "counter",
            "Burst signals sent by the eBPF program.",
            c(&self.burst_signals),
        );
        let name = "burstyd_burst_signals_declined_total";
        let _ = write!(
            s,
            "# HELP {name} Overflows in traced processes that sent no burst signal, by reason (the program could have noticed it).\n# TYPE {name} counter\n"
        );
        for (c, (reason, _)) in self
            .burst_signals_declined
            .iter()
            .zip(Declined::default().reasons())
        {
            let _ = writeln!(s, "{name}{{reason=\"{reason}\"}} {}", c.get());
        }
        let mut one = |name: &str, kind: &str, help: &str, v: String| {
            let _ = write!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            );
        };
        one(
            "burstyd_functions_skipped_total",
            "counter",
            "Functions the rewriter skipped.",
            c(&self.functions_skipped),
        );
        let name = "burstyd_hot_weight_total";
        let _ = write!(
            s,
            "# HELP {name} Event weight of bursty-traced processes' user-mode samples, by where the leaf PC lies (the executable's hot coverage = instrumented / (instrumented + executable_uninstrumented); the process's = (instrumented + library_instrumented) / all; other_modules holds what is not instrumented outside the executable).\n# TYPE {name} counter\n"
        );
        for (c, w) in self.hot_weight.iter().zip(HOT_WHERE) {
            let _ = writeln!(s, "{name}{{where=\"{w}\"}} {}", c.get());
        }
        let mut one = |name: &str, kind: &str, help: &str, v: String| {
            let _ = write!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            );
        };
        one(
            "burstyd_config_reloads_total",
            "counter",
            "Successful configuration reloads (SIGHUP).",
            c(&self.config_reloads),
        );
        one(
            "burstyd_config_reload_failures_total",
            "counter",
            "Rejected configuration reloads (the previous configuration stays).",
            c(&self.config_reload_failures),
        );
        let (cpu, rss) = self_cpu_and_rss();
        one(
            "process_cpu_seconds_total",
            "counter",
            "CPU time (user + system) of the daemon, from /proc/self/stat.",
            format!("{cpu:.3}"),
        );
        one(
            "process_resident_memory_bytes",
            "gauge",
            "Resident set size of the daemon, from /proc/self/statm.",
            rss.to_string(),
        );
        one(
            "burstyd_burst_backoff_executables",
            "gauge",
            "Executables whose attach for bursts failed, waiting to be tried again.",
            c(&self.burst_backoff),
        );
        one(
            "burstyd_dwarf_worker_peak_rss_bytes",
            "gauge",
            "The largest peak RSS of a DWARF worker process so far (a module's DWARF is read in a process of its own, for a moment, not in the daemon).",
            crate::stacks::dwarf_worker::PEAK_RSS
                .load(Ordering::Relaxed)
                .to_string(),
        );
        s.push_str(&self.traced.lock().unwrap_or_else(|e| e.into_inner()));
        s
    }
}

/// One process traced in bursts, for [`traced_series`].
pub(crate) struct TracedProcess {
    pub(crate) pid: u32,
    pub(crate) exe: String,
    pub(crate) bursts: u64,
    /// Declined by the injected handler: (reason, count).
    pub(crate) declined: [(&'static str, u64); 4],
    pub(crate) records_lost: u64,
    /// Share of the process's user-mode samples in instrumented code.
    pub(crate) hot_coverage: f64,
    pub(crate) attach_seconds: f64,
    pub(crate) paths: u64,
}

/// The per-process series of the processes traced in bursts (labels
/// `pid`, `exe`), Prometheus text.
pub(crate) fn traced_series(procs: &[TracedProcess]) -> String {
    let mut s = String::new();
    let esc = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"");
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(s, "{name}{{{labels}}} {v}");
        }
    };
    let l = |p: &TracedProcess| format!("pid=\"{}\",exe=\"{}\"", p.pid, esc(&p.exe));
    family(
        "burstyd_traced_bursts_total",
        "counter",
        "Bursts taken, per process traced in bursts.",
        procs.iter().map(|p| (l(p), p.bursts.to_string())).collect(),
    );
    family(
        "burstyd_traced_bursts_declined_total",
        "counter",
        "Burst signals the injected handler declined, per process and reason.",
        procs
            .iter()
            .flat_map(|p| {
                p.declined
                    .iter()
                    .map(move |(r, n)| (format!("{},reason=\"{r}\"", l(p)), n.to_string()))
            })
            .collect(),
    );
    family(
        "burstyd_traced_records_lost_total",
        "counter",
        "Burst records lost (ring full), per process.",
        procs
            .iter()
            .map(|p| (l(p), p.records_lost.to_string()))
            .collect(),
    );
    family(
        "burstyd_traced_paths_total",
        "counter",
        "Complete Ball-Larus paths recorded, per process.",
        procs.iter().map(|p| (l(p), p.paths.to_string())).collect(),
    );
    family(
        "burstyd_traced_hot_coverage_ratio",
        "gauge",
        "Share of the process's sampled user-mode event weight in instrumented code.",
        procs
            .iter()
            .map(|p| (l(p), format!("{:.4}", p.hot_coverage)))
            .collect(),
    );
    family(
        "burstyd_traced_attach_seconds",
        "gauge",
        "Wall time the attach took (analysis or plan cache, generation, the ptrace stop).",
        procs
            .iter()
            .map(|p| (l(p), format!("{:.3}", p.attach_seconds)))
            .collect(),
    );
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
