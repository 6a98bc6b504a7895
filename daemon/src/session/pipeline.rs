//! Samples → calling context trees: unwinding each raw sample, adding it
//! to its thread's tree (and to every open `/debug/pprof/profile` window),
//! and the sampled event per PC of the processes traced in bursts.
use std::collections::HashMap;
use std::time::SystemTime;

use burstyd_common::addr::Pid;
use burstyd_common::{SAMPLE_BURST_SIGNAL, SAMPLE_USER_REGS, SAMPLE_USTACK_SHORT, Sample};

use super::intervals::Meta;
use super::options::SessionStats;
use crate::bursts::contexts::{StartStack, StartStacks};
use crate::export::context::build_profile;
use crate::export::pprof::encode_gzip;
use crate::service::metrics::METRICS;
use crate::stacks::cct::Cct;
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::table::ProcessTable;
use crate::stacks::unwind::{UnwindEnd, Unwinder, UserRegs};

/// A `/debug/pprof/profile?seconds=N` request being collected.
pub(super) struct Window {
    pub(super) cct: Cct,
    pub(super) start: SystemTime,
    pub(super) end: tokio::time::Instant,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}

/// Turns raw samples into CCT entries.
pub(super) struct Pipeline {
    pub(super) procs: ProcessTable,
    unwinder: Unwinder,
    pub(super) cct: Cct,
    pub(super) stats: SessionStats,
    frames: Vec<u64>,
    /// Open HTTP profile windows: every sample also goes into each.
    pub(super) windows: Vec<Window>,
    /// For processes traced in bursts: event weight per sampled PC (the
    /// original address), to attribute the event to paths.
    pub(super) leaf_weights: HashMap<Pid, HashMap<u64, u64>>,
    /// The same since the last interval profile.
    pub(super) interval_leaf_weights: HashMap<Pid, HashMap<u64, u64>>,
    /// Per process traced in bursts, since the last drain of its records:
    /// its samples whose pc was in its clones (its burst is alive), and
    /// all its samples (it ran).
    pub(super) in_clones: HashMap<Pid, crate::bursts::stats::Activity>,
    /// Per process traced in bursts: the stacks of the samples that sent
    /// a burst signal, until their bursts' START records take them.
    pub(super) start_stacks: HashMap<Pid, StartStacks>,
}

impl Pipeline {
    pub(super) fn new() -> Self {
        Pipeline {
            procs: ProcessTable::new(),
            unwinder: Unwinder::new(),
            cct: Cct::new(),
            stats: SessionStats::default(),
            frames: Vec::with_capacity(256),
            windows: Vec::new(),
            leaf_weights: HashMap::new(),
            interval_leaf_weights: HashMap::new(),
            in_clones: HashMap::new(),
            start_stacks: HashMap::new(),
        }
    }

    pub(super) fn handle(&mut self, s: &Sample) {
        self.stats.samples += 1;
        METRICS.samples.inc();
        // The sample's `#[repr(C)]` pid is the kernel's u32 tgid.
        let pid = Pid(s.pid);
        let thread_name = comm_str(&s.comm);
        // The main thread's name at sample time is exact, and follows exec;
        // another thread's name is not the process's.
        let main_thread = s.tid == s.pid;
        self.cct.name_process(pid, main_thread, || {
            if main_thread {
                return thread_name.to_owned();
            }
            crate::sys::comm(pid).unwrap_or_else(|| thread_name.to_owned())
        });
        if s.ppid != 0 {
            self.procs.inherit(pid, Pid(s.ppid), thread_name);
        }
        let kernel = &s.kstack[..(s.kstack_len as usize).min(s.kstack.len())];
        self.frames.clear();
        let mut truncated = false;
        if s.flags & SAMPLE_USER_REGS != 0 {
            let regs = UserRegs {
                rip: s.rip,
                rsp: s.rsp,
                rbp: s.rbp,
            };
            let stack = &s.ustack[..(s.ustack_len as usize).min(s.ustack.len())];
            let end = self
                .unwinder
                .unwind(&mut self.procs, pid, &regs, stack, &mut self.frames);
            match end {
                UnwindEnd::Complete => {}
                UnwindEnd::StackTruncated | UnwindEnd::MaxDepth => {
                    truncated = true;
                    self.stats.truncated_stacks += 1;
                    METRICS.truncated_stacks.inc();
                }
                UnwindEnd::NoUnwindInfo => {
                    truncated = true;
                    self.stats.no_unwind_info += 1;
                    METRICS.no_unwind_info.inc();
                }
                UnwindEnd::Error => {
                    truncated = true;
                    self.stats.unwind_errors += 1;
                    METRICS.unwind_errors.inc();
                }
            }
            if s.flags & SAMPLE_USTACK_SHORT != 0 && s.ustack_len == 0 {
                truncated = true;
            }
        } else {
            self.stats.kernel_only += 1;
            METRICS.kernel_only.inc();
        }
        self.cct.add(
            pid,
            s.tid,
            thread_name,
            &self.frames,
            kernel,
            truncated,
            s.period.max(1),
        );
        if s.flags & (SAMPLE_BURST_SIGNAL | SAMPLE_USER_REGS)
            == SAMPLE_BURST_SIGNAL | SAMPLE_USER_REGS
        {
            self.start_stacks.entry(pid).or_default().push(
                s.tid,
                StartStack {
                    pc: s.rip,
                    frames: self.frames.clone(),
                    complete: !truncated,
                },
            );
        }
        if let Some(m) = self.leaf_weights.get_mut(&pid)
            && let Some(&pc) = self.frames.first()
        {
            *m.entry(pc).or_insert(0) += s.period.max(1);
            *self
                .interval_leaf_weights
                .entry(pid)
                .or_default()
                .entry(pc)
                .or_insert(0) += s.period.max(1);
        }
        if let Some(c) = self.procs.clone_frames(pid) {
            let a = self.in_clones.entry(pid).or_default();
            a.samples += 1;
            if s.flags & SAMPLE_USER_REGS != 0 && c.regions.iter().any(|r| r.range.contains(&s.rip))
            {
                a.in_clones += 1;
            }
        }
        for w in &mut self.windows {
            if let Some(n) = self.cct.process_names.get(&pid) {
                w.cct.name_process(pid, true, || n.clone());
            }
            w.cct.add(
                pid,
                s.tid,
                thread_name,
                &self.frames,
                kernel,
                truncated,
                s.period.max(1),
            );
        }
    }

    /// Answers the windows whose time is up (all of them with `all`).
    pub(super) fn finish_windows(&mut self, all: bool, symbolizer: &mut Symbolizer, meta: &Meta) {
        if self.windows.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        let (done, open): (Vec<Window>, Vec<Window>) = std::mem::take(&mut self.windows)
            .into_iter()
            .partition(|w| all || w.end <= now);
        self.windows = open;
        for w in done {
            let p = build_profile(
                &w.cct,
                &self.procs,
                symbolizer,
                &meta.span(w.start, SystemTime::now()),
            );
            let _ = w.reply.send(encode_gzip(&p).map_err(|e| e.to_string()));
        }
    }
}

fn comm_str(comm: &[u8; 16]) -> &str {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    std::str::from_utf8(&comm[..end]).unwrap_or("?")
}
