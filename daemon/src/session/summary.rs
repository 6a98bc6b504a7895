//! The counters of the processes traced in bursts for `/metrics`, and
//! `summary.json` (see [`crate::export::summary`]) with every profile
//! written: each interval's, and the run's at the end.
use std::collections::HashMap;

use tracing::warn;

use crate::bursts::coverage::HotCoverage;
use crate::bursts::stats::BurstStats;
use crate::bursts::traced::Traced;
use crate::bursts::tracer::Finished;
use crate::export::summary::{self, PathFigures, ProcessSummary, Run, SessionFigures};
use crate::service::metrics::{METRICS, TracedProcess};
use burstyd_common::addr::Pid;

/// What is known of a traced process from its attach: its name then, and
/// how long the attach took (a detached tracer no longer says).
#[derive(Clone, Debug, Default)]
pub(super) struct Attached {
    pub(super) comm: String,
    pub(super) secs: f64,
}

/// The process's hot coverage: the executable's, each library's, and
/// (`missed`) the libraries' most sampled uninstrumented functions.
pub(super) fn hot_coverage(traced: &Traced, leaf: &HashMap<u64, u64>, missed: bool) -> HotCoverage {
    let exe = traced.exe_module();
    let mut hot = HotCoverage::measure(&traced.code, &exe.plan, exe.bias, leaf);
    if missed {
        for (l, m) in hot
            .libraries
            .iter_mut()
            .zip(traced.modules.iter().filter(|m| !m.is_exe))
        {
            l.missed = HotCoverage::missed_in(&traced.code, &m.plan, m.bias, m.range, leaf);
        }
    }
    hot
}

/// One process's summary: its series and hot coverage.
pub(super) fn process_summary(
    traced: &Traced,
    paths: PathFigures,
    stats: Result<&BurstStats, String>,
    hot: HotCoverage,
    attached: Option<&Attached>,
) -> ProcessSummary {
    let (stats, error) = match stats {
        Ok(s) => (s.clone(), None),
        Err(e) => (BurstStats::default(), Some(e)),
    };
    let secs = attached.map_or(0.0, |a| a.secs);
    ProcessSummary {
        traced: TracedProcess {
            pid: traced.pid.0,
            exe: traced.exe_module().path.clone(),
            series: summary::traced_series(&stats, &paths, &hot, secs),
        },
        comm: attached.map_or_else(String::new, |a| a.comm.clone()),
        hot,
        error,
    }
}

/// A detached process's summary.
pub(super) fn finished_summary(
    f: &Finished,
    attached: &HashMap<Pid, Attached>,
    leaf: &HashMap<Pid, HashMap<u64, u64>>,
    empty: &HashMap<u64, u64>,
) -> ProcessSummary {
    let pid = f.traced.pid;
    // A program the process exec'd away from: its own name.
    let own = f.execd.as_ref().map(|e| Attached {
        comm: e.comm.clone(),
        secs: attached.get(&pid).map_or(0.0, |a| a.secs),
    });
    process_summary(
        &f.traced,
        PathFigures::of(&f.counts),
        f.stats.as_ref().map_err(|e| format!("{e:#}")),
        hot_coverage(&f.traced, f.leaf(leaf).unwrap_or(empty), true),
        own.as_ref().or_else(|| attached.get(&pid)),
    )
}

/// Writes `summary.json` (`session`: the run's end).
pub(super) fn write(
    opts: &super::options::SessionOptions,
    procs: &[ProcessSummary],
    session: Option<&SessionFigures>,
) {
    let table = METRICS.table();
    let run = Run {
        event: &opts.event.name,
        sampling: opts.sampling,
        table: &table,
        processes: procs,
        session,
    };
    if let Err(e) = summary::write(&opts.output, &run) {
        warn!("writing {}: {e}", opts.output.join(summary::FILE).display());
    }
}

/// The daemon-wide burst counters of `/metrics`: the processes released
/// and those traced now.
pub(super) fn set_burst_metrics(s: &crate::bursts::stats::BurstStats) {
    METRICS.bursts_taken.set(s.bursts);
    METRICS.bursts_truncated.set(s.bursts_truncated);
    METRICS.bursts_declined.set(s.declined());
}
