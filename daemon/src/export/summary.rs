//! `summary.json`: the run's counters as data, next to the profiles.
//!
//! Every figure the end-of-run summaries print (the sampling summary, and
//! per process traced in bursts its bursts, path contexts and hot
//! coverage) under the name of the Prometheus metric that carries it:
//! the run-wide figures are [`Metrics::table`], the per-process ones
//! [`traced_series`], the same tables `/metrics` is rendered from, so the
//! names cannot diverge. A labelled metric becomes an object keyed by
//! label value (`"burstyd_burst_signals_declined_total": {"in_kernel": 0,
//! …}`).
//!
//! ```json
//! {"version": 1, "final": true, "event": "cpu-clock",
//!  "sampling": {"frequency_hz": 999},
//!  "metrics": {"burstyd_samples_total": 4242, …},
//!  "session": {"sampling_seconds": 3.1, …},
//!  "processes": [{"pid": 7, "comm": "prog", "exe": "/usr/bin/prog",
//!                 "metrics": {"burstyd_traced_bursts_total": 96, …},
//!                 "hot_coverage": {"total": …, "libraries": […], …}}]}
//! ```
//!
//! [`Metrics::table`]: crate::service::metrics::Metrics::table
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json, json};

use crate::bursts::counts::PathCounts;
use crate::bursts::coverage::HotCoverage;
use crate::bursts::stats::BurstStats;
use crate::sampling::events::Sampling;
use crate::service::metrics::{COUNTER, GAUGE, HOT_WHERE, Series, TracedProcess, Value};

/// The format's version: raised when a key changes meaning or goes.
pub(crate) const VERSION: u64 = 1;

/// The file's name in the output directory.
pub(crate) const FILE: &str = "summary.json";

/// A traced process's path-context figures (from its [`PathCounts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PathFigures {
    pub(crate) joined: u64,
    pub(crate) unjoined: u64,
    pub(crate) rooted_paths: u64,
    pub(crate) context_nodes: u64,
    pub(crate) context_bytes: u64,
    pub(crate) contexts_cut: u64,
    pub(crate) dropped: u64,
}

impl PathFigures {
    pub(crate) fn of(c: &PathCounts) -> Self {
        let ctx = c.contexts();
        PathFigures {
            joined: c.joined,
            unjoined: c.unjoined,
            rooted_paths: c.rooted_paths,
            context_nodes: ctx.len() as u64,
            context_bytes: ctx.bytes() as u64,
            contexts_cut: ctx.overflow,
            dropped: c.dropped,
        }
    }
}

/// `a / b`, 0 when `b` is.
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The event weight of `hot` by where the leaf lies, in [`HOT_WHERE`]
/// order (what `burstyd_hot_weight_total` adds up).
pub(crate) fn hot_weights(hot: &HotCoverage) -> [u64; 4] {
    let in_libs = hot.instrumented_all.saturating_sub(hot.instrumented);
    [
        hot.instrumented,
        hot.in_exe.saturating_sub(hot.instrumented),
        in_libs,
        hot.total.saturating_sub(hot.in_exe + in_libs),
    ]
}

/// One traced process's `burstyd_traced_*` series: `/metrics` labels them
/// with the process, `summary.json` lists them under it.
pub(crate) fn traced_series(
    s: &BurstStats,
    p: &PathFigures,
    hot: &HotCoverage,
    attach_secs: f64,
) -> Vec<Series> {
    let c = |name, help, n: u64| Series::new(name, COUNTER, help, Value::Count(n));
    let g = |name, help, n: u64| Series::new(name, GAUGE, help, Value::Count(n));
    vec![
        c(
            "burstyd_traced_bursts_total",
            "Bursts taken, per process traced in bursts.",
            s.bursts,
        ),
        c(
            "burstyd_traced_bursts_truncated_total",
            "Bursts cut short, per process.",
            s.bursts_truncated,
        ),
        Series::new(
            "burstyd_traced_bursts_declined_total",
            COUNTER,
            "Burst signals the injected handler declined, per process and reason.",
            Value::by_label(
                "reason",
                [
                    ("busy", s.declined_busy),
                    ("pc_not_rewritten", s.declined_pc),
                    ("budget_0", s.declined_budget),
                    ("behind", s.declined_behind),
                ],
            ),
        ),
        c(
            "burstyd_traced_bursts_reaped_total",
            "Bursts the daemon ended (the thread left the clones without a check), per process.",
            s.reaped,
        ),
        g(
            "burstyd_traced_functions_rewritten",
            "Functions rewritten, per process.",
            s.functions_rewritten as u64,
        ),
        g(
            "burstyd_traced_functions_skipped",
            "Functions the rewriter skipped, per process.",
            s.functions_skipped as u64,
        ),
        c(
            "burstyd_traced_paths_total",
            "Complete Ball-Larus paths recorded, per process.",
            s.paths,
        ),
        c(
            "burstyd_traced_partial_paths_total",
            "Paths whose start a burst did not see (left out), per process.",
            s.partial_paths,
        ),
        c(
            "burstyd_traced_records_total",
            "Burst records read, per process.",
            s.records,
        ),
        c(
            "burstyd_traced_records_lost_total",
            "Burst records lost (ring full), per process.",
            s.records_lost,
        ),
        c(
            "burstyd_traced_references_total",
            "Data references read from bursts in memory mode (--record refs), per process.",
            s.references,
        ),
        c(
            "burstyd_traced_references_dropped_total",
            "Data references read but not analysed for hot data streams (bursts beyond the analysis rate, the bound on references held), per process.",
            s.references_dropped,
        ),
        Series::new(
            "burstyd_traced_burst_seconds_total",
            COUNTER,
            "Time the process's threads spent in bursts (each burst from its first record to its end, by the time-stamp counter; bursts ended after the fact left out), per process: at most what the bursts cost it.",
            Value::Real(s.burst_ticks as f64 / crate::sys::tsc_hz(), 4),
        ),
        c(
            "burstyd_traced_refs_bursts_total",
            "Bursts that recorded data references (memory mode), per process.",
            s.refs_bursts,
        ),
        Series::new(
            "burstyd_traced_refs_burst_seconds_total",
            COUNTER,
            "Time the process's threads spent in bursts that recorded data references (memory mode), per process.",
            Value::Real(s.refs_burst_ticks as f64 / crate::sys::tsc_hz(), 4),
        ),
        c(
            "burstyd_traced_tuple_records_total",
            "Tuple records read (the value and call-target profiles, --record values,targets), per process.",
            s.tuple_records,
        ),
        c(
            "burstyd_traced_tuples_dropped_total",
            "Tuple records read but left out of the tuple profiles (a site in no traced function, beyond the bound on sites, an unknown kind), per process.",
            s.tuples_dropped,
        ),
        c(
            "burstyd_traced_bad_records_total",
            "Burst records malformed or with a path number out of range, per process.",
            s.bad_records,
        ),
        c(
            "burstyd_traced_bursts_joined_total",
            "Bursts that began with their stack sample (their paths have a calling context), per process.",
            p.joined,
        ),
        c(
            "burstyd_traced_bursts_unjoined_total",
            "Bursts that began without their stack sample, per process.",
            p.unjoined,
        ),
        c(
            "burstyd_traced_rooted_paths_total",
            "Paths counted in a context that reaches the thread's root, per process.",
            p.rooted_paths,
        ),
        g(
            "burstyd_traced_context_nodes",
            "Nodes of the calling context tree the paths hang on, per process.",
            p.context_nodes,
        ),
        g(
            "burstyd_traced_context_bytes",
            "Bytes the calling context tree holds, roughly, per process.",
            p.context_bytes,
        ),
        c(
            "burstyd_traced_contexts_cut_total",
            "Contexts cut short because the tree was full, per process.",
            p.contexts_cut,
        ),
        c(
            "burstyd_traced_paths_dropped_total",
            "Paths dropped because there were too many distinct ones, per process.",
            p.dropped,
        ),
        Series::new(
            "burstyd_traced_hot_coverage_ratio",
            GAUGE,
            "Share of the process's sampled user-mode event weight in instrumented code.",
            Value::Real(ratio(hot.instrumented_all, hot.total), 4),
        ),
        Series::new(
            "burstyd_traced_exe_hot_coverage_ratio",
            GAUGE,
            "Share of the process's sampled user-mode event weight in its executable that lands in instrumented code.",
            Value::Real(ratio(hot.instrumented, hot.in_exe), 4),
        ),
        Series::new(
            "burstyd_traced_hot_weight_total",
            COUNTER,
            "Event weight of the process's user-mode samples, by where the leaf PC lies (as burstyd_hot_weight_total).",
            Value::by_label("where", HOT_WHERE.into_iter().zip(hot_weights(hot))),
        ),
        c(
            "burstyd_traced_runtime_weight_total",
            "Event weight of the process's user-mode samples in burstyd's runtime routines (the tracing's own cost, left out of every share).",
            hot.runtime,
        ),
        Series::new(
            "burstyd_traced_attach_seconds",
            GAUGE,
            "Wall time the attach took (analysis or plan cache, generation, the ptrace stop).",
            Value::Real(attach_secs, 3),
        ),
    ]
}

/// One traced process in `summary.json`.
pub(crate) struct ProcessSummary {
    pub(crate) traced: TracedProcess,
    pub(crate) comm: String,
    pub(crate) hot: HotCoverage,
    /// Why its burst counts are missing (its detach failed).
    pub(crate) error: Option<String>,
}

/// The session's own figures, known at the end of the run.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SessionFigures {
    pub(crate) sampling_seconds: f64,
    pub(crate) processes: u64,
    pub(crate) threads: u64,
    pub(crate) startup_cpu_ms: u64,
    pub(crate) sampling_cpu_ms: u64,
    pub(crate) final_cpu_ms: u64,
    pub(crate) peak_rss_bytes: u64,
}

/// What `summary.json` is made of.
pub(crate) struct Run<'a> {
    pub(crate) event: &'a str,
    pub(crate) sampling: Sampling,
    /// The run-wide series ([`crate::service::metrics::Metrics::table`]).
    pub(crate) table: &'a [Series],
    pub(crate) processes: &'a [ProcessSummary],
    /// At the end of the run; `None` for an interval's summary.
    pub(crate) session: Option<&'a SessionFigures>,
}

/// Series → `{name: value}` (a labelled one: `{name: {label value: n}}`).
pub(crate) fn series_json(series: &[Series]) -> Json {
    let mut m = Map::new();
    for s in series {
        let v = match &s.value {
            Value::Count(n) => json!(n),
            Value::Real(x, _) => json!(x),
            Value::ByLabel(_, rows) => {
                Json::Object(rows.iter().map(|(l, n)| (l.clone(), json!(n))).collect())
            }
        };
        m.insert(s.name.to_owned(), v);
    }
    Json::Object(m)
}

/// The figures [`HotCoverage`] computes, with the shares they give.
fn hot_json(h: &HotCoverage) -> Json {
    let missed = |m: &[(String, u64, String)]| -> Json {
        m.iter()
            .map(|(f, w, why)| json!({"function": f, "weight": w, "why": why}))
            .collect()
    };
    json!({
        "total": h.total,
        "runtime": h.runtime,
        "in_exe": h.in_exe,
        "instrumented": h.instrumented,
        "instrumented_all": h.instrumented_all,
        "exe_ratio": ratio(h.instrumented, h.in_exe),
        "exe_share": ratio(h.in_exe, h.total),
        "all_ratio": ratio(h.instrumented_all, h.total),
        "missed": missed(&h.missed),
        "libraries": h.libraries.iter().map(|l| json!({
            "name": l.name,
            "weight": l.weight,
            "instrumented": l.instrumented,
            "ratio": ratio(l.instrumented, l.weight),
            "missed": missed(&l.missed),
        })).collect::<Vec<_>>(),
    })
}

/// The whole document.
pub(crate) fn build(run: &Run) -> Json {
    let sampling = match run.sampling {
        Sampling::Frequency(hz) => json!({ "frequency_hz": hz }),
        Sampling::Period(n) => json!({ "period": n }),
    };
    let processes: Vec<Json> = run
        .processes
        .iter()
        .map(|p| {
            json!({
                "pid": p.traced.pid,
                "comm": p.comm,
                "exe": p.traced.exe,
                "error": p.error,
                "metrics": series_json(&p.traced.series),
                "hot_coverage": hot_json(&p.hot),
            })
        })
        .collect();
    let session = run.session.map(|s| {
        json!({
            "sampling_seconds": s.sampling_seconds,
            "processes": s.processes,
            "threads": s.threads,
            "startup_cpu_ms": s.startup_cpu_ms,
            "sampling_cpu_ms": s.sampling_cpu_ms,
            "final_cpu_ms": s.final_cpu_ms,
            "peak_rss_bytes": s.peak_rss_bytes,
        })
    });
    json!({
        "version": VERSION,
        "final": run.session.is_some(),
        "event": run.event,
        "sampling": sampling,
        "metrics": series_json(run.table),
        "session": session,
        "processes": processes,
    })
}

/// Writes `summary.json` to `dir` atomically.
pub(crate) fn write(dir: &Path, run: &Run) -> std::io::Result<PathBuf> {
    let mut text = serde_json::to_string_pretty(&build(run)).map_err(std::io::Error::other)?;
    text.push('\n');
    super::write_atomic(dir, FILE, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bursts::coverage::LibraryCoverage;
    use crate::service::metrics::{Metrics, traced_series as render_traced};

    fn stats() -> BurstStats {
        BurstStats {
            functions_rewritten: 12,
            functions_skipped: 3,
            bursts: 96,
            bursts_truncated: 2,
            declined_busy: 5,
            declined_pc: 6,
            declined_budget: 7,
            declined_behind: 8,
            records: 1000,
            records_lost: 1,
            paths: 900,
            partial_paths: 4,
            bad_records: 0,
            reaped: 9,
            references: 0,
            references_dropped: 0,
            burst_ticks: 0,
            refs_burst_ticks: 0,
            refs_bursts: 2,
            tuple_records: 31,
            tuples_dropped: 3,
        }
    }

    fn hot() -> HotCoverage {
        HotCoverage {
            total: 100,
            runtime: 3,
            in_exe: 80,
            instrumented: 60,
            instrumented_all: 70,
            libraries: vec![LibraryCoverage {
                name: "libc.so.6".into(),
                weight: 15,
                instrumented: 10,
                missed: vec![("memchr".into(), 5, "no CFG".into())],
            }],
            missed: vec![("spin".into(), 20, "too small".into())],
        }
    }

    fn process() -> ProcessSummary {
        let paths = PathFigures {
            joined: 90,
            unjoined: 6,
            rooted_paths: 850,
            context_nodes: 40,
            context_bytes: 4096,
            contexts_cut: 0,
            dropped: 11,
        };
        ProcessSummary {
            traced: TracedProcess {
                pid: 42,
                exe: "/bin/prog".into(),
                series: traced_series(&stats(), &paths, &hot(), 0.25),
            },
            comm: "prog".into(),
            hot: hot(),
            error: None,
        }
    }

    #[test]
    fn every_figure_is_under_its_metric_name() {
        let m = Metrics::new();
        m.samples.add(4242);
        m.no_unwind_info.add(3);
        m.burst_signals_declined[2].set(17);
        m.link_signalled.set(32);
        let table = m.table();
        let procs = [process()];
        let session = SessionFigures {
            sampling_seconds: 2.5,
            processes: 1,
            threads: 4,
            ..Default::default()
        };
        let j = build(&Run {
            event: "cpu-clock",
            sampling: Sampling::Frequency(999),
            table: &table,
            processes: &procs,
            session: Some(&session),
        });
        assert_eq!(j["version"], 1);
        assert_eq!(j["final"], true);
        assert_eq!(j["event"], "cpu-clock");
        assert_eq!(j["sampling"]["frequency_hz"], 999);
        assert_eq!(j["session"]["threads"], 4);
        let run = &j["metrics"];
        assert_eq!(run["burstyd_samples_total"], 4242);
        assert_eq!(run["burstyd_stacks_without_unwind_info_total"], 3);
        assert_eq!(
            run["burstyd_burst_signals_declined_total"]["signal_blocked"],
            17
        );
        assert_eq!(run["burstyd_link_map_changes_total"]["signalled"], 32);
        let p = &j["processes"][0];
        assert_eq!(p["pid"], 42);
        assert_eq!(p["comm"], "prog");
        assert_eq!(p["exe"], "/bin/prog");
        assert!(p["error"].is_null());
        let pm = &p["metrics"];
        assert_eq!(pm["burstyd_traced_bursts_total"], 96);
        assert_eq!(pm["burstyd_traced_bursts_truncated_total"], 2);
        assert_eq!(pm["burstyd_traced_bursts_declined_total"]["busy"], 5);
        assert_eq!(pm["burstyd_traced_bursts_declined_total"]["behind"], 8);
        assert_eq!(pm["burstyd_traced_bursts_reaped_total"], 9);
        assert_eq!(pm["burstyd_traced_functions_rewritten"], 12);
        assert_eq!(pm["burstyd_traced_partial_paths_total"], 4);
        assert_eq!(pm["burstyd_traced_records_lost_total"], 1);
        assert_eq!(pm["burstyd_traced_refs_bursts_total"], 2);
        assert_eq!(pm["burstyd_traced_tuple_records_total"], 31);
        assert_eq!(pm["burstyd_traced_tuples_dropped_total"], 3);
        assert_eq!(pm["burstyd_traced_burst_seconds_total"], 0.0);
        assert_eq!(pm["burstyd_traced_rooted_paths_total"], 850);
        assert_eq!(pm["burstyd_traced_paths_dropped_total"], 11);
        assert_eq!(pm["burstyd_traced_attach_seconds"], 0.25);
        assert_eq!(pm["burstyd_traced_hot_coverage_ratio"], 0.7);
        assert_eq!(pm["burstyd_traced_exe_hot_coverage_ratio"], 0.75);
        assert_eq!(
            pm["burstyd_traced_hot_weight_total"],
            json!({"instrumented": 60, "executable_uninstrumented": 20,
                   "library_instrumented": 10, "other_modules": 10})
        );
        let h = &p["hot_coverage"];
        assert_eq!(h["runtime"], 3);
        assert_eq!(h["missed"][0]["function"], "spin");
        assert_eq!(h["libraries"][0]["name"], "libc.so.6");
        assert_eq!(h["libraries"][0]["missed"][0]["why"], "no CFG");
    }

    #[test]
    fn metrics_and_summary_share_the_names() {
        // Every per-process series of /metrics is a key of the process's
        // object, and every run-wide one a key of "metrics".
        let procs = [process()];
        let m = Metrics::new();
        let table = m.table();
        let j = build(&Run {
            event: "e",
            sampling: Sampling::Period(10_000),
            table: &table,
            processes: &procs,
            session: None,
        });
        assert_eq!(j["final"], false);
        assert!(j["session"].is_null());
        assert_eq!(j["sampling"]["period"], 10_000);
        let text = render_traced(&[process().traced], &[]) + &m.render();
        let mut names = 0;
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = l.split(' ').nth(2).unwrap();
            let found = if name.starts_with("burstyd_traced_") {
                &j["processes"][0]["metrics"][name]
            } else {
                &j["metrics"][name]
            };
            assert!(!found.is_null(), "{name} missing from summary.json");
            names += 1;
        }
        assert!(names >= 50, "{names} families");
        // And the labelled rows carry the same numbers.
        assert!(
            text.contains(
                "burstyd_traced_bursts_declined_total{pid=\"42\",exe=\"/bin/prog\",reason=\"budget_0\"} 7\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "burstyd_traced_exe_hot_coverage_ratio{pid=\"42\",exe=\"/bin/prog\"} 0.7500\n"
        ));
    }

    #[test]
    fn written_atomically_and_parsable() {
        let dir = std::env::temp_dir().join(format!("burstyd-summary-{}", std::process::id()));
        let table = Metrics::new().table();
        let procs = [process()];
        let run = Run {
            event: "cpu-clock",
            sampling: Sampling::Frequency(99),
            table: &table,
            processes: &procs,
            session: None,
        };
        let path = write(&dir, &run).unwrap();
        let back: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            back["processes"][0]["metrics"]["burstyd_traced_bursts_total"],
            96
        );
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from(FILE)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
