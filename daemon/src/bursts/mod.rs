//! Bursty tracing of live processes (`--pid`, `run`): inject the
//! instrumented clones, arm them, turn the records their bursts write into
//! path counts, disarm.
//!
//! - [`lifecycle`]: attach / re-arm / detach under ptrace, the signal
//!   handler, stuck-burst reaping;
//! - [`ring`]: the memory shared with the target → raw `(w0, w1)` records;
//! - [`decode`]: raw records → [`decode::BurstEvent`]s, the only code that
//!   knows the record format;
//! - [`counts`]: events → path counts per calling context within a burst,
//!   and the raw trace (`--save-bursts`).
//!
//! The profiles made of the counts are in [`crate::export::paths`] and
//! [`crate::export::fdata`].
//!
//! If the daemon dies, the target keeps its handler and regions; without
//! the eBPF program no burst starts, and nothing in the target waits for
//! the daemon (a full ring truncates the burst; in full-trace mode the
//! writer yields a bounded number of times, then drops).
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burstyd_common::burst::BurstTarget;
use tracing::{debug, info, warn};
use userspace_rewriter::paths::PathNumbering;
use userspace_rewriter::plan::{FunctionStatus, Plan};

use crate::export::fdata::FdataFacts;
use crate::export::pprof::encode_gzip;
use crate::service::metrics::METRICS;
use crate::stacks::clones::CloneFrames;

pub(crate) mod counts;
pub(crate) mod decode;
pub(crate) mod lifecycle;
pub(crate) mod ring;

use counts::{PathCounts, TraceFile};
use lifecycle::{Attached, Attachment};

/// How bursts run.
#[derive(Clone, Debug)]
pub(crate) struct BurstOptions {
    /// Checks per burst (`--burst`).
    pub(crate) burst_len: u64,
    /// Every event, from the first burst on, for ground truth.
    pub(crate) full_trace: bool,
    /// Write raw burst traces here (`--save-bursts`).
    pub(crate) save_bursts: Option<PathBuf>,
}

/// Default checks per burst.
pub(crate) const DEFAULT_BURST: u64 = 200;

/// Totals reported at the end.
#[derive(Clone, Debug, Default)]
pub(crate) struct BurstStats {
    pub(crate) functions_rewritten: usize,
    pub(crate) functions_skipped: usize,
    pub(crate) bursts: u64,
    pub(crate) bursts_truncated: u64,
    pub(crate) declined_busy: u64,
    pub(crate) declined_pc: u64,
    /// Signals handled with `--burst 0` (straight back to the original).
    pub(crate) declined_budget: u64,
    pub(crate) records: u64,
    pub(crate) records_lost: u64,
    pub(crate) paths: u64,
    pub(crate) partial_paths: u64,
    pub(crate) bad_records: u64,
    /// Bursts ended by the daemon: their thread left the clones without a
    /// check (an exception or longjmp into original code).
    pub(crate) reaped: u64,
}

/// What the exporters need to know about a traced process and its
/// executable.
pub(crate) struct Traced {
    pub(crate) pid: u32,
    /// `/proc/PID/exe`.
    pub(crate) exe: PathBuf,
    pub(crate) plan: Plan,
    /// Load bias of the executable (AVMA − SVMA).
    pub(crate) bias: u64,
    /// DWARF lines of the executable, opened while the process lives.
    pub(crate) lines: Option<addr2line::Loader>,
    pub(crate) fdata: FdataFacts,
}

impl Traced {
    /// The path numbering of function `fid`, if it has one.
    pub(crate) fn numbering(&self, fid: u32) -> Option<&PathNumbering> {
        match &self.plan.functions.get(fid as usize)?.status {
            FunctionStatus::Analyzed(fa) => fa.numbering.as_ref(),
            _ => None,
        }
    }
}

/// One process being traced in bursts.
pub(crate) struct BurstTracer {
    attachment: Attachment,
    traced: Traced,
    counts: PathCounts,
    trace: Option<TraceFile>,
    /// The clones, for unwinding samples taken during bursts.
    frames: Arc<CloneFrames>,
    functions_rewritten: usize,
    functions_skipped: usize,
    records: u64,
    reaped: u64,
}

/// A tracer after detach: what the profiles are made of.
pub(crate) struct Finished {
    pub(crate) traced: Traced,
    pub(crate) counts: PathCounts,
    /// The totals, or why restoring the target's signal failed.
    pub(crate) stats: anyhow::Result<BurstStats>,
}

impl BurstTracer {
    /// Injects (or re-arms) the clones in `pid`. Blocks for the analysis,
    /// the code generation and a short ptrace stop.
    pub(crate) fn attach(pid: u32, opts: &BurstOptions) -> anyhow::Result<Self> {
        let Attached {
            attachment,
            exe,
            plan,
            bias,
            frames,
            fdata,
            functions_rewritten,
            functions_skipped,
        } = lifecycle::attach(pid, opts)?;
        let total_paths = plan
            .functions
            .iter()
            .map(|f| match &f.status {
                FunctionStatus::Analyzed(fa) => fa.numbering.as_ref().map(|n| n.total_paths()),
                _ => None,
            })
            .collect();
        Ok(BurstTracer {
            attachment,
            counts: PathCounts::new(total_paths),
            trace: opts.save_bursts.as_deref().and_then(TraceFile::create),
            frames: Arc::new(frames),
            functions_rewritten,
            functions_skipped,
            records: 0,
            reaped: 0,
            traced: Traced {
                pid,
                lines: addr2line::Loader::new(&exe).ok(),
                exe,
                plan,
                bias,
                fdata,
            },
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.traced.pid
    }

    /// The clones, for the unwinder.
    pub(crate) fn clone_frames(&self) -> Arc<CloneFrames> {
        self.frames.clone()
    }

    /// The eBPF `BURSTS` map entry.
    pub(crate) fn target(&self) -> BurstTarget {
        self.attachment.target()
    }

    /// Consumes every record the target wrote. Returns how many.
    pub(crate) fn drain(&mut self) -> u64 {
        let (counts, trace) = (&mut self.counts, &mut self.trace);
        let (n, head) = self.attachment.region().take_records(|w0, w1| {
            let ev = decode::decode(w0, w1);
            if let Some(t) = trace.as_mut() {
                t.add(&ev);
            }
            counts.add(&ev);
        });
        self.records += n;
        if self.attachment.reap_stuck_burst(head) {
            self.reaped += 1;
            self.counts.burst_reaped();
        }
        n
    }

    /// The totals so far, with the target side's counters (this
    /// session's).
    pub(crate) fn stats(&self) -> BurstStats {
        let [
            bursts,
            bursts_truncated,
            declined_busy,
            declined_pc,
            records_lost,
            declined_budget,
        ] = self.attachment.counters_since_attach();
        BurstStats {
            functions_rewritten: self.functions_rewritten,
            functions_skipped: self.functions_skipped,
            bursts,
            bursts_truncated,
            declined_busy,
            declined_pc,
            declined_budget,
            records: self.records,
            records_lost,
            paths: self.counts.paths,
            partial_paths: self.counts.partial_paths,
            bad_records: self.counts.bad_records,
            reaped: self.reaped,
        }
    }

    /// No new bursts; a running one ends at its next check.
    pub(crate) fn disarm(&mut self) {
        self.attachment.disarm();
    }

    /// Disarms, drains until the ring is empty (the target may have exited
    /// with it full), lets a signal already in flight arrive and be
    /// declined, drains again and restores the signal disposition. Blocks
    /// (sleeps, ptrace).
    pub(crate) fn detach(mut self) -> Finished {
        self.disarm();
        while self.drain() > 0 {}
        // Let a signal already in flight arrive and be declined.
        std::thread::sleep(std::time::Duration::from_millis(20));
        self.drain();
        let stats = self.stats();
        if let Some(t) = &mut self.trace {
            t.flush();
        }
        let restored = self.attachment.restore_signal();
        Finished {
            traced: self.traced,
            counts: self.counts,
            stats: restored.map(|()| stats),
        }
    }
}

/// The bursty-tracing side of a session: one tracer per target.
pub(crate) struct Bursts {
    tracers: Vec<BurstTracer>,
    full_trace: bool,
}

impl Bursts {
    /// Attaches to each target (waiting for `run`'s command to have
    /// exec'd). A target that cannot be traced in bursts is still sampled;
    /// the reason is logged.
    pub(crate) fn start(
        opts: Option<&BurstOptions>,
        pids: &[u32],
        sampler: &mut crate::sampling::sampler::Sampler,
    ) -> Self {
        let mut tracers = Vec::new();
        let Some(opts) = opts else {
            return Bursts {
                tracers,
                full_trace: false,
            };
        };
        for &pid in pids {
            lifecycle::wait_for_exec(pid);
            match BurstTracer::attach(pid, opts) {
                Ok(t) => {
                    // Also with --burst 0: every overflow still reaches the
                    // handler, which returns to the original code at once
                    // (what being attached costs without bursts).
                    if let Err(e) = sampler.set_burst_target(pid, Some(t.target())) {
                        warn!(pid, "cannot arm bursts: {e}");
                    }
                    let s = t.stats();
                    METRICS
                        .functions_rewritten
                        .add(s.functions_rewritten as u64);
                    METRICS.functions_skipped.add(s.functions_skipped as u64);
                    tracers.push(t);
                }
                Err(e) => warn!(pid, "bursty tracing disabled for this process: {e:#}"),
            }
        }
        Bursts {
            tracers,
            full_trace: opts.full_trace,
        }
    }

    pub(crate) fn active(&self) -> bool {
        !self.tracers.is_empty()
    }

    /// The processes traced in bursts.
    pub(crate) fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.tracers.iter().map(|t| t.pid())
    }

    /// Lets the unwinder see through the clones of every traced process.
    pub(crate) fn register_clone_frames(&self, procs: &mut crate::stacks::table::ProcessTable) {
        for t in &self.tracers {
            procs.set_clone_frames(t.pid(), t.clone_frames());
        }
    }

    /// How often to drain the record rings: a full trace fills them fast.
    pub(crate) fn drain_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(if self.full_trace { 5 } else { 50 })
    }

    pub(crate) fn drain(&mut self) {
        for t in &mut self.tracers {
            t.drain();
        }
    }

    /// Disarms, drains, detaches; writes `paths.pb.gz` and `edges.fdata`
    /// and logs the summary.
    pub(crate) fn finish(
        &mut self,
        sampler: &mut crate::sampling::sampler::Sampler,
        output: &Path,
        event: &str,
        counters: &crate::sampling::sampler::KernelCounters,
        leaf_weights: &HashMap<u32, HashMap<u64, u64>>,
    ) {
        if self.tracers.is_empty() {
            return;
        }
        let mut paths = crate::export::paths::paths_builder(event);
        let mut fdatas = Vec::new();
        for t in self.tracers.drain(..) {
            let pid = t.pid();
            let _ = sampler.set_burst_target(pid, None);
            let Finished {
                traced,
                counts,
                stats,
            } = t.detach();
            let empty = HashMap::new();
            crate::export::paths::add_paths(
                &mut paths,
                &traced,
                &counts,
                leaf_weights.get(&pid).unwrap_or(&empty),
            );
            fdatas.push((
                pid,
                crate::export::fdata::fdata(&traced.plan, &traced.fdata, &counts),
            ));
            let stats = match stats {
                Ok(s) => s,
                Err(e) => {
                    warn!(pid, "detaching: {e:#}");
                    continue;
                }
            };
            METRICS.bursts_taken.add(stats.bursts);
            METRICS.bursts_truncated.add(stats.bursts_truncated);
            METRICS
                .bursts_declined
                .add(stats.declined_busy + stats.declined_pc + stats.declined_budget);
            info!(
                pid,
                "bursts: {} taken, {} truncated, {} declined (busy {}, PC not rewritten {}, budget 0 {}), {} reaped; {} signals sent, {} overflows during a burst; functions rewritten {}, skipped {}; {} paths recorded ({} partial), records lost: {}",
                stats.bursts,
                stats.bursts_truncated,
                stats.declined_busy + stats.declined_pc + stats.declined_budget,
                stats.declined_busy,
                stats.declined_pc,
                stats.declined_budget,
                stats.reaped,
                counters.burst_signals,
                counters.burst_busy,
                stats.functions_rewritten,
                stats.functions_skipped,
                stats.paths,
                stats.partial_paths,
                stats.records_lost
            );
            debug!(
                pid,
                "burst records: {} read, {} malformed or with a path number out of range",
                stats.records,
                stats.bad_records
            );
        }
        let _ = std::fs::create_dir_all(output);
        // edges.fdata is for one binary: the first process's; with several
        // processes each also gets edges-<pid>.fdata.
        let several = fdatas.len() > 1;
        for (i, (pid, fdata)) in fdatas.iter().enumerate() {
            let mut names = Vec::new();
            if i == 0 {
                names.push("edges.fdata".to_string());
            }
            if several {
                names.push(format!("edges-{pid}.fdata"));
            }
            for name in names {
                if let Err(e) = crate::export::write_atomic(output, &name, fdata.as_bytes()) {
                    warn!("writing {}: {e}", output.join(name).display());
                }
            }
        }
        let path = output.join("paths.pb.gz");
        match encode_gzip(&paths.finish()).map_err(anyhow::Error::from) {
            Ok(p) => match crate::export::write_atomic(output, "paths.pb.gz", &p) {
                Ok(_) => {
                    info!("wrote {}", path.display());
                    crate::service::http::set_paths_profile(p);
                }
                Err(e) => warn!("writing {}: {e}", path.display()),
            },
            Err(e) => warn!("path profile: {e:#}"),
        }
    }
}
