//! The session's side of `summary.json` and the per-process metrics: the
//! processes traced now and those released, summarised at each interval
//! and at the end ([`super::summary`] builds each process's part).
use std::collections::HashMap;

use super::Session;
use super::summary::*;
use crate::bursts::coverage::HotCoverage;
use crate::bursts::stats::BurstStats;
use crate::export::summary::{self, PathFigures, ProcessSummary};
use crate::service::metrics::{METRICS, TracedProcess};

impl Session {
    /// Each process traced now (`missed`: with its libraries' most
    /// sampled uninstrumented functions).
    fn live_summaries(&self, missed: bool) -> Vec<ProcessSummary> {
        let empty = HashMap::new();
        self.bursts
            .tracers()
            .iter()
            .map(|t| {
                let traced = t.traced();
                let leaf = self.pipe.leaf_weights.get(&traced.pid).unwrap_or(&empty);
                let mut attached = self.released.attached.get(&traced.pid).cloned();
                attached.get_or_insert_default().secs = t.attach_secs();
                process_summary(
                    traced,
                    PathFigures::of(t.counts()),
                    Ok(&t.stats()),
                    hot_coverage(traced, leaf, missed),
                    attached.as_ref(),
                )
            })
            .collect()
    }

    /// The processes released during the session (detached).
    fn released_summaries(&self) -> Vec<ProcessSummary> {
        let empty = HashMap::new();
        self.released
            .finished
            .iter()
            .map(|f| finished_summary(f, &self.released.attached, &self.pipe.leaf_weights, &empty))
            .collect()
    }

    /// `/metrics`' per-process series of the processes traced in bursts.
    pub(super) fn publish_traced_metrics(&self) {
        if let Some(sel) = &self.selection {
            METRICS.burst_backoff.set(sel.backing_off() as u64);
        }
        let procs: Vec<TracedProcess> = self
            .live_summaries(false)
            .into_iter()
            .map(|p| p.traced)
            .collect();
        let none = summary::traced_series(
            &BurstStats::default(),
            &PathFigures::default(),
            &HotCoverage::default(),
            0.0,
        );
        METRICS.set_traced(crate::service::metrics::traced_series(&procs, &none));
        let mut all = self.released.totals.clone();
        for t in self.bursts.tracers() {
            all.add(&t.stats());
        }
        set_burst_metrics(&all);
    }

    /// Every interval: `summary.json` of the session so far.
    pub(super) fn write_interval_summary(&self) {
        METRICS.set_kernel_counters(&self.sampler.counters());
        if self.bursts.active() || !self.released.finished.is_empty() {
            self.publish_traced_metrics();
        }
        let mut procs = self.live_summaries(true);
        procs.extend(self.released_summaries());
        write(&self.opts, &procs, None);
    }
}
