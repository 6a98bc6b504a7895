//! A running attachment's controls: arm and disarm, burst options, the
//! module directory and lookup tables put in use ([`Attachment::activate`],
//! [`Attachment::relink`]), stuck-burst reaping, and restoring the target's
//! signal disposition at detach.
//!
//! Detach: disarm (no new bursts; a running one ends at its next check),
//! then under ptrace set the signal to `SIG_IGN` (discarding a signal still
//! pending) and back to its old disposition. The regions stay mapped:
//! threads may still hold return addresses into clones, which lead back to
//! the original code at the next check. A later attach finds the memfd in
//! `/proc/PID/maps` and reuses it.
use std::mem::offset_of;
use std::sync::atomic::Ordering;

use anyhow::Context as _;
use burstyd_common::addr::Pid;
use burstyd_common::burst::{
    ARMED_OFFSET, BurstLocal, BurstSlot, BurstTarget, CLONE_PAGE_SHIFT, LOCAL_OFFSET, MAX_SLOTS,
    ModuleEntry,
};
use tracing::debug;
use userspace_rewriter::inject::{KernelSigaction, SA_RESTORER, Tracee};

use super::options::BurstOptions;
use super::ring::{SharedRegion, TargetCounters};

use super::libraries::LoadRequest;

/// How long a burst may write nothing, with no sample in the clones,
/// before it is taken for lost (see [`Attachment::reap_stuck_burst`]).
pub(super) const STUCK_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// And only once the process was sampled this often meanwhile, none of
/// them in its clones (it ran, elsewhere).
pub(super) const STUCK_SAMPLES: u64 = 5;

/// Slot `i`'s `BurstSlot::owner`, from the control block.
pub(super) fn owner_offset(i: usize) -> u64 {
    (LOCAL_OFFSET
        + offset_of!(BurstLocal, slots)
        + i * std::mem::size_of::<BurstSlot>()
        + offset_of!(BurstSlot, owner)) as u64
}

/// Whether one burst slot's running burst makes progress (see
/// [`Attachment::reap_stuck_bursts`]).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SlotProgress {
    /// (heads\[slot\], slot_tids\[slot\]) at the previous drain.
    pub(super) last: (u64, u64),
    /// Since when the same running burst has made no progress.
    pub(super) idle_since: Option<std::time::Instant>,
    /// Samples of the process (none in its clones) since then.
    pub(super) idle_samples: u64,
}

/// A target with the clones injected and the handler installed: what
/// the session needs to arm, reap and detach it.
pub(crate) struct Attachment {
    pub(super) pid: Pid,
    /// What its clones record besides paths.
    pub(super) rec: userspace_rewriter::codegen::Recording,
    /// Address of the control block in the target.
    pub(super) control_addr: u64,
    pub(super) region: SharedRegion,
    pub(super) signal: i32,
    pub(super) old_action: KernelSigaction,
    /// Target-side counters at attach (an earlier session's are in them).
    pub(super) baseline: TargetCounters,
    /// Per slot: whether its running burst makes progress.
    pub(super) progress: [SlotProgress; MAX_SLOTS],
    /// Pages (address >> `CLONE_PAGE_SHIFT`) of original code with a
    /// rewritten instruction: the eBPF program signals only there.
    pub(super) pages: Vec<u64>,
    /// The lookup tables' header last written into the target (in use
    /// or not, see [`super::linkmap`]).
    pub(super) base: u64,
    /// The process's count of link-map changes last seen, and whether
    /// the tables must be checked against the maps (again).
    pub(super) link_seen: u64,
    pub(super) relink_due: bool,
    /// Modules found unloaded so far: tables built from the target's
    /// before one of them was masked are stale.
    pub(super) forgets: u64,
}

/// The header the daemon last wrote, as the control block records it (an
/// earlier attach's, for a re-arm).
pub(super) fn control_tables_base(region: &SharedRegion) -> u64 {
    let cb = region.control();
    match cb.tables_base {
        0 => cb.tables & burstyd_common::burst::TABLES_HEADER_MASK,
        b => b,
    }
}

impl Attachment {
    /// The eBPF `BURSTS` map entry.
    pub(crate) fn target(&self) -> BurstTarget {
        BurstTarget {
            armed_addr: self.control_addr + ARMED_OFFSET as u64,
            signal: self.signal as u32,
            _pad: 0,
            handler: self.region.control().handler,
        }
    }

    /// The pages of original code where a burst can start.
    pub(crate) fn pages(&self) -> &[u64] {
        &self.pages
    }

    /// Readies libraries' clones for use (see [`Extension::activate`]):
    /// their entries into the module directory (a re-attach reads it),
    /// the merged tables' header as the base that the next
    /// [`Self::relink`] checks against the maps and puts in use — from
    /// then on bursts go into the libraries.
    pub(crate) fn activate(&mut self, tables: u64, entries: Vec<ModuleEntry>) {
        self.region.add_modules(entries);
        self.base = tables;
        self.region.control_mut().tables_base = tables;
        // In use at the next `relink`, once checked against the maps.
        self.relink_due = true;
    }

    /// The loader's link-map hook (`_dl_debug_state`, and the loader's
    /// code around it), for the handler (see `BurstControl::hook`).
    pub(crate) fn set_hook(&mut self, hook: u64, lo: u64, hi: u64) {
        let cb = self.region.control_mut();
        (cb.hook_lo, cb.hook_hi, cb.hook) = (lo, hi, hook);
    }

    /// The eBPF count of the process's link-map changes (`None`: not
    /// watched) moved, or the last [`Self::relink`] did not finish:
    /// whether to relink now.
    pub(crate) fn relink_due(&mut self, changes: Option<u64>) -> bool {
        if let Some(c) = changes
            && c != self.link_seen
        {
            self.link_seen = c;
            self.relink_due = true;
        }
        self.relink_due
    }

    /// Checks the lookup tables against the maps and puts them in use
    /// ([`super::linkmap::relink`]); returns the `[lo, hi)` of each
    /// library found unloaded, whose pages it drops. A failure (the
    /// process gone, its memory unreadable) leaves the tables invalid.
    pub(crate) fn relink(&mut self, exe_path: &str) -> super::linkmap::Relinked {
        match super::linkmap::relink(
            self.pid,
            &self.region,
            self.control_addr,
            self.base,
            exe_path,
        ) {
            Ok(r) => {
                self.relink_due = !r.installed;
                self.forgets += r.unloaded.len() as u64;
                self.pages.retain(|&p| {
                    let a = p << CLONE_PAGE_SHIFT;
                    !r.unloaded
                        .iter()
                        .any(|&(_, lo, hi)| a >= lo & !0xfff && a < hi)
                });
                r
            }
            Err(e) => {
                debug!(pid = %self.pid, "relinking the lookup tables: {e:#}");
                // It may have forgotten modules before it failed: a
                // cloning under way merged tables with their entries live.
                self.forgets += 1;
                super::linkmap::Relinked::default()
            }
        }
    }

    /// What a request for libraries loaded since needs to know
    /// ([`LoadRequest`]).
    pub(crate) fn load_request(
        &self,
        exe_path: &str,
        next_fid: u32,
        libraries: Vec<super::linkmap::Loaded>,
    ) -> LoadRequest {
        LoadRequest {
            pid: self.pid,
            control: self.control_addr,
            exe_path: exe_path.to_owned(),
            next_fid,
            base: self.base,
            forgets: self.forgets,
            libraries,
            rec: self.rec,
        }
    }

    /// The next [`Self::relink_due`] says yes.
    pub(crate) fn relink_soon(&mut self) {
        self.relink_due = true;
    }

    /// Modules found unloaded so far.
    pub(crate) fn forgets(&self) -> u64 {
        self.forgets
    }

    /// More such pages (libraries added).
    pub(crate) fn add_pages(&mut self, pages: Vec<u64>) {
        self.pages.extend(pages);
        self.pages.sort_unstable();
        self.pages.dedup();
    }

    /// The memory shared with the target (control block and record ring).
    pub(crate) fn region(&self) -> &SharedRegion {
        &self.region
    }

    /// The target-side counters since this attach.
    pub(crate) fn counters_since_attach(&self) -> TargetCounters {
        let now = self.region.target_counters();
        std::array::from_fn(|i| now[i].wrapping_sub(self.baseline[i]))
    }

    /// Clears `tracer`: the region is free for another burstyd.
    pub(crate) fn release(&mut self) {
        self.region.control_mut().tracer = 0;
    }

    /// No new bursts; running ones end at their next check.
    pub(crate) fn disarm(&mut self) {
        self.region.control_mut().armed = 0;
        for i in 0..MAX_SLOTS {
            self.clear_owner(i);
        }
    }

    /// New burst length and path timing (a reload), from the next burst
    /// on; the process stays armed.
    pub(crate) fn set_options(&mut self, opts: &BurstOptions) {
        set_run_options(&mut self.region, opts);
    }

    /// Clears the private `owner` of slot `slot` (through
    /// `/proc/PID/mem`: the daemon does not map the target's private
    /// state), so that its burst's thread fails its next check. Best
    /// effort: a process that is gone has no burst to end.
    pub(super) fn clear_owner(&self, slot: usize) {
        use std::os::unix::fs::FileExt;
        let r = crate::sys::open_mem(self.pid, true).and_then(|f| {
            // Only into the program attached to: one the process exec'd
            // has other things there.
            if !super::rooms::runs_ours(&f, self.control_addr) {
                return Ok(());
            }
            f.write_all_at(&0u64.to_ne_bytes(), self.control_addr + owner_offset(slot))
        });
        if let Err(e) = r {
            debug!(pid = %self.pid, "clearing the owner of burst slot {slot}: {e}");
        }
    }

    /// The most bursts that ran at once in the process so far.
    pub(crate) fn concurrent_max(&self) -> u64 {
        self.region.concurrent_max()
    }

    /// Bursts that may run at once in the process.
    pub(crate) fn max_bursts(&self) -> u64 {
        self.region.control().max_bursts
    }

    /// A burst whose thread left the clones without passing a check (an
    /// exception or `longjmp` into original code) keeps its slot and would
    /// hold it for good. A running burst writes records all the time (at
    /// least at every back edge and return); one whose slot's sub-ring got
    /// nothing across two drains (its `heads[slot]` did not move, the same
    /// thread holds it) is ended here, slot by slot; the slots reaped are
    /// returned. Its thread, should it return into a clone later, fails
    /// that return site's check (the owner is cleared first) and goes back
    /// to the original code.
    ///
    /// `heads`: each slot's producer index as the drain read it.
    /// `activity`: the process's samples since the last drain. One in its
    /// clones says a burst is alive, in a loop that writes nothing (a
    /// k-boring loop has no back-edge instrumentation), not lost; samples
    /// are not told apart by thread here, so while any thread's sample is
    /// in the clones no slot is reaped (a stuck slot waits until the
    /// clones are quiet: it costs one slot of concurrency meanwhile, never
    /// a live burst). And a process that was not sampled did not run (a
    /// loaded machine): its silence says nothing either, so a burst is
    /// reaped only after [`STUCK_SAMPLES`] samples elsewhere (a full trace
    /// of `libpk.so` in `llvm_bolt_accepts_the_edge_profile` was once
    /// reaped in `warmup`'s k-boring loop while another test loaded the
    /// machine).
    pub(crate) fn reap_stuck_bursts(
        &mut self,
        heads: &[u64; MAX_SLOTS],
        activity: super::stats::Activity,
    ) -> Vec<usize> {
        let (tids, _) = self.region.burst_state();
        let mut reaped = Vec::new();
        for slot in 0..MAX_SLOTS {
            let p = &mut self.progress[slot];
            let now = (heads[slot], tids[slot]);
            if tids[slot] == 0 || activity.in_clones > 0 || now != p.last {
                *p = SlotProgress {
                    last: now,
                    ..SlotProgress::default()
                };
                continue;
            }
            // Silence counts only while the process runs: one that does
            // not get the CPU (a loaded machine) writes nothing either.
            p.idle_samples += activity.samples;
            let since = *p.idle_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() < STUCK_AFTER || p.idle_samples < STUCK_SAMPLES {
                continue;
            }
            p.idle_since = None;
            p.idle_samples = 0;
            // The owner first (a return into a clone then fails its
            // check), then the slot's tid and the count of running bursts.
            self.clear_owner(slot);
            self.region.free_slot(slot);
            reaped.push(slot);
        }
        reaped
    }

    /// Under ptrace, puts back the target's own disposition of our signal
    /// (through `SIG_IGN`, which discards an instance still pending) —
    /// only if our handler is still installed: a process that exec'd since
    /// (same pid, new image) has its own dispositions. A process that is
    /// gone (or a zombie) needs nothing.
    pub(crate) fn restore_signal(&mut self) -> anyhow::Result<()> {
        match Tracee::attach(self.pid) {
            Ok(mut t) => {
                let ours = self.region.control().handler;
                let current = t.rt_sigaction(self.signal, None)?;
                if current.handler != ours {
                    debug!(
                        pid = %self.pid,
                        "signal {} no longer ours; left alone", self.signal
                    );
                    t.detach()?;
                    return Ok(());
                }
                // SIG_IGN discards an instance still pending; then the old one.
                let ign = KernelSigaction {
                    handler: 1,
                    ..Default::default()
                };
                t.rt_sigaction(self.signal, Some(&ign))?;
                t.rt_sigaction(self.signal, Some(&self.old_action))?;
                t.detach()?;
            }
            Err(e) if !crate::sys::process_running(self.pid) => {
                debug!("pid {} exited before detach: {e}", self.pid);
            }
            Err(e) => return Err(e).context("restoring the target's signal disposition"),
        }
        Ok(())
    }
}

pub(super) fn set_run_options(region: &mut SharedRegion, opts: &BurstOptions) {
    let cb = region.control_mut();
    cb.burst_len = if opts.full_trace {
        u64::MAX
    } else {
        // 0: the handler returns to the original code at once.
        opts.burst_len
    };
    // Memory mode: bursts that record references are long (see
    // `DEFAULT_REFS_BURST`); a full trace records every one.
    (cb.refs_burst, cb.refs_burst_len) = match opts.refs {
        userspace_rewriter::codegen::Refs::Off => (0, 0),
        _ if opts.full_trace => (u64::MAX, u64::MAX),
        _ if opts.burst_len == 0 => (0, 0),
        _ => (
            opts.refs_burst,
            opts.burst_len
                .saturating_mul(super::options::REFS_BURST_CHECKS),
        ),
    };
    // (With memory mode off no burst records references: 1 leaves the
    // handler's countdown alone.)
    let refs_off = matches!(opts.refs, userspace_rewriter::codegen::Refs::Off);
    cb.refs_every = if opts.full_trace || refs_off {
        1
    } else {
        super::data_refs::FIRST_REFS_EVERY
    };
    cb.wait_when_full = u64::from(opts.full_trace);
    // A full trace is one burst from the first overflow to the exit: the
    // associative table would still hold its last outputs when the
    // process exits, so every tuple goes out as it comes.
    cb.tuple_config = burstyd_common::burst::TupleConfig {
        assoc: opts.tuple_config.assoc && !opts.full_trace,
        ..opts.tuple_config
    }
    .to_word();
    cb.max_bursts = opts.max_bursts.clamp(1, MAX_SLOTS as u64);
    cb.measure = if opts.measure {
        burstyd_common::burst::MEASURE_TSC
    } else {
        burstyd_common::burst::MEASURE_NONE
    };
    std::sync::atomic::fence(Ordering::SeqCst);
    cb.armed = 1;
}

pub(super) fn install_handler(
    t: &mut Tracee,
    signal: i32,
    handler: u64,
    restorer: u64,
) -> anyhow::Result<KernelSigaction> {
    let act = KernelSigaction {
        handler,
        // No SA_ONSTACK: a program's alternate stack may be too small for
        // the signal frame (MINSIGSTKSZ is 2 KiB, the x86-64 frame with
        // AVX-512 state is larger). The eBPF program sends no signal to a
        // thread already on its alternate stack.
        flags: (libc::SA_SIGINFO | libc::SA_RESTART) as u64 | SA_RESTORER,
        restorer,
        // Block everything while it runs (it is short).
        mask: !0,
    };
    Ok(t.rt_sigaction(signal, Some(&act))?)
}
