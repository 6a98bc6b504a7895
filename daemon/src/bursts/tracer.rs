//! One process being traced in bursts ([`BurstTracer`]): its attachment,
//! what the exporters need of it, its path counts; draining its rings,
//! relinking its lookup tables as libraries come and go, cloning hot or
//! newly loaded libraries, and detach.
use std::path::PathBuf;
use std::sync::Arc;

use burstyd_common::addr::Pid;
use burstyd_common::burst::{BurstTarget, MAX_MODULES, MAX_SLOTS, REC_START, TAG_SHIFT};
use std::collections::HashMap;

use super::attach::{self, Attached};
use super::attachment::Attachment;
use super::contexts;
use super::counts::{PathCounts, TraceFile};
use super::data_refs::DataRefs;
use super::decode;
use super::libraries;
use super::linkmap;
use super::options::{BurstOptions, HOT_LIBRARY_SHARE, Libraries};
use super::prepare;
use super::stats::{Activity, BurstStats};
use super::traced::{Traced, TracedModule, fid_facts};
use super::tuples::Tuples;
use crate::stacks::clones::CloneFrames;

/// One process being traced in bursts.
pub(crate) struct BurstTracer {
    pub(super) attachment: Attachment,
    pub(super) traced: Traced,
    pub(super) counts: PathCounts,
    pub(super) trace: Option<TraceFile>,
    /// The clones, for unwinding samples taken during bursts.
    pub(super) frames: Arc<CloneFrames>,
    pub(super) functions_rewritten: usize,
    pub(super) functions_skipped: usize,
    pub(super) records: u64,
    pub(super) reaped: u64,
    /// The handler knows the loader's link-map hook.
    pub(super) hooked: bool,
    /// Clone libraries (not `--exe-only`), also those loaded later.
    pub(super) libraries: Libraries,
    /// Under [`Libraries::Hot`]: the libraries (maps paths) found hot,
    /// which a relink may clone.
    pub(super) hot: std::collections::HashSet<String>,
    /// Libraries loaded since the attach that were sent to be cloned (a
    /// request under way: `loading`), and how often each file was.
    pub(super) tried: std::collections::HashSet<linkmap::Loaded>,
    pub(super) loading: bool,
    pub(super) clonings: std::collections::HashMap<(String, u64), u32>,
    /// The attach's second step (the libraries mapped then) is still to
    /// come: libraries found uncloned now are its business.
    pub(super) awaiting_libraries: bool,
    /// How long the attach (its first step) took.
    pub(super) attach_secs: f64,
    /// Memory mode: the data references of its bursts.
    pub(super) data_refs: Option<DataRefs>,
    /// The tuple profiles, from its first tuple record on (none before:
    /// a process whose clones make no tuples has no tuple outputs).
    pub(super) tuples: Option<Tuples>,
    /// How the runtime compresses tuples (what a tuple record is worth).
    pub(super) tuple_config: burstyd_common::burst::TupleConfig,
    /// Records read off the rings, not counted yet.
    pub(super) held: Held,
}

/// Records [`BurstTracer::drain`] read off the rings and holds to count
/// later.
#[derive(Default)]
pub(super) struct Held {
    /// The records, as read.
    records: Vec<(u64, u64)>,
    /// Per drain and slot, in the order read: the slot, and where its
    /// records end in `records`.
    segments: Vec<(usize, usize)>,
    /// The stack samples of their STARTs, in order, taken as they were
    /// read (`None`: none).
    stacks: std::collections::VecDeque<Option<contexts::StartStack>>,
    /// When the oldest of them was read.
    since: Option<std::time::Instant>,
}

/// How long records may be held before they are counted (see
/// [`BurstTracer::drain`]).
pub(crate) const HOLD_FOR: std::time::Duration = std::time::Duration::from_millis(1000);
/// Records held at most (16 bytes each).
pub(crate) const HOLD_RECORDS: usize = 1 << 18;

/// How often one library file may be cloned anew in a process that
/// unloads and loads it again (each time a ptrace stop, and tables and
/// clones that stay mapped in the target).
pub(super) const MAX_CLONINGS: u32 = 8;

/// A tracer after detach: what the profiles are made of.
pub(crate) struct Finished {
    pub(crate) traced: Traced,
    pub(crate) counts: PathCounts,
    /// Memory mode: the data references of its bursts.
    pub(crate) data_refs: Option<DataRefs>,
    /// The tuple profiles, when its bursts made tuples.
    pub(crate) tuples: Option<Tuples>,
    /// The totals, or why restoring the target's signal failed.
    pub(crate) stats: anyhow::Result<BurstStats>,
    /// A program the process exec'd away from (its pid now runs another):
    /// what the session knew of it by pid, kept with it.
    pub(crate) execd: Option<Execd>,
}

impl Finished {
    /// The event sampled at each of its PCs: `by_pid`'s entry for its
    /// pid, or its own after an exec.
    pub(crate) fn leaf<'a>(
        &'a self,
        by_pid: &'a HashMap<Pid, HashMap<u64, u64>>,
    ) -> Option<&'a HashMap<u64, u64>> {
        match &self.execd {
            Some(e) => Some(&e.leaf),
            None => by_pid.get(&self.traced.pid),
        }
    }
}

/// What the session keeps per pid of a program the process exec'd away
/// from, handed to its [`Finished`].
pub(crate) struct Execd {
    /// Its name (`comm`) while it ran.
    pub(crate) comm: String,
    /// The event sampled at each of its PCs (hot coverage, path time).
    pub(crate) leaf: HashMap<u64, u64>,
}

impl BurstTracer {
    /// Injects (or re-arms) the clones in `pid`. Blocks for the analysis,
    /// the code generation and a short ptrace stop.
    pub(crate) fn attach(
        pid: Pid,
        opts: &BurstOptions,
        held: bool,
    ) -> anyhow::Result<(Self, Option<attach::Then>)> {
        let began = std::time::Instant::now();
        let (
            Attached {
                attachment,
                exe,
                modules,
                frames,
                functions_rewritten,
                functions_skipped,
                code,
            },
            pending,
        ) = attach::attach(pid, opts, held)?;
        // Path counts per fid, over every module's range of them.
        let mut counts = PathCounts::default();
        if opts.full_trace {
            counts.set_exact();
        } else if opts.burst_len > 0 {
            counts.count_checks(opts.burst_len);
        }
        counts.estimates.set_weighting(opts.weights);
        for m in &modules {
            counts.add_functions(m.fid_base, fid_facts(m));
        }
        let modules = modules
            .into_iter()
            .map(|facts| TracedModule::new(pid, &exe, facts))
            .collect();
        let mut tracer = BurstTracer {
            attachment,
            counts,
            trace: opts.save_bursts.as_deref().and_then(TraceFile::create),
            frames: Arc::new(frames),
            functions_rewritten,
            functions_skipped,
            records: 0,
            reaped: 0,
            hooked: false,
            libraries: opts.libraries,
            hot: Default::default(),
            tried: Default::default(),
            loading: false,
            clonings: Default::default(),
            awaiting_libraries: matches!(pending, Some(attach::Then::Libraries(_))),
            attach_secs: began.elapsed().as_secs_f64(),
            data_refs: (opts.refs != userspace_rewriter::codegen::Refs::Off).then(|| {
                let mut d = if opts.full_trace {
                    DataRefs::new(super::data_refs::MAX_REFERENCES_FULL, false)
                } else {
                    DataRefs::new(super::data_refs::MAX_REFERENCES, true)
                };
                d.set_refs_burst(opts.refs_burst);
                if let Some(p) = &opts.save_bursts {
                    d.save_to(&p.with_file_name(format!("references-{pid}.txt")));
                }
                d
            }),
            tuples: None,
            tuple_config: opts.tuple_config,
            held: Held::default(),
            traced: Traced {
                pid,
                exe,
                modules,
                code,
                index: Vec::new(),
                generation: 0,
            },
        };
        tracer.traced.reindex();
        Ok((tracer, pending))
    }

    /// Adds the shared libraries' clones ([`libraries::add_libraries`]);
    /// with `activate`, bursts go into them from now on.
    /// The attach's second step is done (its libraries added or not).
    pub(crate) fn libraries_added(&mut self) {
        self.awaiting_libraries = false;
        self.attachment.relink_soon();
    }

    pub(crate) fn extend(&mut self, ext: prepare::Extension, activate: bool) {
        let prepare::Extension {
            modules,
            regions,
            pages,
            cloned,
            functions_rewritten,
            functions_skipped,
            activate: tables,
        } = ext;
        for m in &modules {
            self.counts.add_functions(m.fid_base, fid_facts(m));
        }
        self.traced.code.add(
            cloned,
            modules.iter().map(|m| (m.name().to_owned(), m.range)),
        );
        self.traced
            .code
            .add_clone_regions(regions.iter().map(|r| (r.range.start, r.range.end)));
        let pid = self.traced.pid;
        let exe = self.traced.exe.clone();
        self.traced
            .modules
            .extend(modules.into_iter().map(|m| TracedModule::new(pid, &exe, m)));
        self.traced.reindex();
        let mut all = self.frames.regions.clone();
        all.extend(regions);
        self.frames = Arc::new(CloneFrames { regions: all });
        self.attachment.add_pages(pages);
        self.functions_rewritten += functions_rewritten;
        self.functions_skipped += functions_skipped;
        // Last: the counts know the new functions before any record of
        // theirs can be written.
        if let (true, Some((header, entries))) = (activate, tables) {
            self.attachment.activate(header, entries);
        }
    }

    pub(crate) fn pid(&self) -> Pid {
        self.traced.pid
    }

    /// How long the attach (its first step) took, in seconds.
    pub(crate) fn attach_secs(&self) -> f64 {
        self.attach_secs
    }

    /// What the exporters need to know about the process.
    pub(crate) fn traced(&self) -> &Traced {
        &self.traced
    }

    /// Memory mode: the data references recorded so far.
    pub(crate) fn data_refs(&self) -> Option<&DataRefs> {
        self.data_refs.as_ref()
    }

    /// The tuple profiles so far (`None` until its bursts made a tuple).
    pub(crate) fn tuples(&self) -> Option<&Tuples> {
        self.tuples.as_ref()
    }

    /// Its path counts.
    pub(crate) fn counts(&self) -> &PathCounts {
        &self.counts
    }

    pub(crate) fn counts_mut(&mut self) -> &mut PathCounts {
        &mut self.counts
    }

    /// Once the dynamic loader is among the modules with clones: tells
    /// the handler where its link-map hook (`_dl_debug_state`) is, and
    /// returns the loader's path for the uprobe that watches it (`None`
    /// before, after, or without a loader).
    pub(crate) fn link_hook(&mut self) -> Option<PathBuf> {
        if self.hooked {
            return None;
        }
        // From the loader's plan; or, re-armed before the libraries are
        // (the loader's plan comes with them), as an earlier attach
        // recorded it: the process's libraries may change meanwhile.
        let hook = self
            .traced
            .modules
            .iter()
            .find_map(|m| {
                let f = m
                    .plan
                    .functions
                    .iter()
                    .find(|f| f.name == "_dl_debug_state")?;
                Some(f.start.wrapping_add(m.bias))
            })
            .or_else(|| Some(self.attachment.region().control().hook).filter(|&h| h != 0))?;
        // The loader's executable mapping around it: the handler reads the
        // bytes before a pc there.
        let maps = userspace_rewriter::inject::maps(self.traced.pid).ok()?;
        let text = maps
            .iter()
            .find(|m| m.is_exec() && (m.start..m.end).contains(&hook))?;
        let path = text.path.clone()?;
        self.attachment.set_hook(hook, text.start, text.end);
        self.hooked = true;
        Some(PathBuf::from(path))
    }

    /// Checks the lookup tables against the maps and puts them in use,
    /// if the loader's count of link-map changes moved (`changes`) or a
    /// check is due; returns the `[lo, hi)` of each library found
    /// unloaded (its clones are never entered again).
    /// Also returns a request to clone the libraries loaded since (none
    /// with `--exe-only`, while one is under way, or for a library tried
    /// before).
    pub(crate) fn relink(
        &mut self,
        changes: Option<u64>,
    ) -> (Vec<(u64, u64)>, Option<libraries::LoadRequest>) {
        if !self.attachment.relink_due(changes) {
            return (Vec::new(), None);
        }
        let exe_path = self.traced.exe_module().path.clone();
        let r = self.attachment.relink(&exe_path);
        let mut gone = Vec::new();
        for &(_, lo, hi) in &r.unloaded {
            gone.push((lo, hi));
            // Loaded again later, it may be cloned again.
            self.tried.retain(|l| l.lo != lo);
            if let Some(m) = self.traced.modules.iter().find(|m| m.range.0 == lo) {
                tracing::info!(
                    pid = %self.traced.pid,
                    "{} was unloaded: its clones are no longer entered",
                    m.name()
                );
            }
        }
        if self.libraries == Libraries::None || self.loading || self.awaiting_libraries {
            return (gone, None);
        }
        // The module directory records what a relink checks: a module it
        // cannot hold is never cloned.
        let mut room = MAX_MODULES.saturating_sub(self.attachment.region().modules().len());
        let mut new = Vec::new();
        for l in r.uncloned {
            if self.tried.contains(&l)
                || (self.libraries == Libraries::Hot && !self.hot.contains(&l.path))
            {
                continue;
            }
            self.tried.insert(l.clone());
            let n = self.clonings.entry((l.path.clone(), l.ino)).or_default();
            if *n >= MAX_CLONINGS || room == 0 {
                tracing::info!(
                    pid = %self.traced.pid,
                    "{} is not cloned: {}",
                    l.path,
                    if room == 0 { "the module directory is full" } else { "loaded and unloaded too often" }
                );
                continue;
            }
            *n += 1;
            room -= 1;
            new.push(l);
        }
        if new.is_empty() {
            return (gone, None);
        }
        self.loading = true;
        let next_fid = self
            .traced
            .modules
            .iter()
            .map(|m| m.fid_base + m.plan.functions.len() as u32)
            .max()
            .unwrap_or(0);
        let req = self.attachment.load_request(&exe_path, next_fid, new);
        (gone, Some(req))
    }

    /// Whether libraries are cloned once hot ([`Libraries::Hot`]).
    pub(crate) fn hot_libraries(&self) -> bool {
        self.libraries == Libraries::Hot
    }

    /// Under [`Libraries::Hot`]: `shares` is the process's user-mode
    /// event weight per mapped file (maps path) and in all; each library
    /// that holds [`HOT_LIBRARY_SHARE`] of it becomes hot, and a relink
    /// soon clones those not cloned yet. Returns the libraries that just
    /// became hot.
    pub(crate) fn note_hot(&mut self, shares: &HashMap<&str, u64>, total: u64) -> Vec<String> {
        if self.libraries != Libraries::Hot || total == 0 {
            return Vec::new();
        }
        let exe = &self.traced.exe_module().path;
        let mut new = Vec::new();
        for (&path, &w) in shares {
            if path != exe
                && path.starts_with('/')
                && w as f64 >= HOT_LIBRARY_SHARE * total as f64
                && !self.hot.contains(path)
            {
                self.hot.insert(path.to_owned());
                new.push(path.to_owned());
            }
        }
        if !new.is_empty() {
            self.attachment.relink_soon();
        }
        new
    }

    /// The libraries of `req` were cloned (`ext`): added, unless a library
    /// was unloaded meanwhile (the tables merged for them are stale: they
    /// are dropped and tried again at the next relink). Returns whether
    /// they were added; [`Self::relink`] puts their tables in use.
    pub(crate) fn loaded(
        &mut self,
        req: &libraries::LoadRequest,
        ext: Option<prepare::Extension>,
    ) -> bool {
        if !self.asked(req) {
            return false;
        }
        self.loading = false;
        // Relink at the next drain: more may have been loaded meanwhile.
        self.attachment.relink_soon();
        let Some(ext) = ext else {
            return false;
        };
        if req.forgets != self.attachment.forgets() {
            for l in &req.libraries {
                self.tried.remove(l);
            }
            tracing::debug!(pid = %self.traced.pid, "a library was unloaded while others were cloned: trying again");
            return false;
        }
        self.extend(ext, true);
        true
    }

    /// Cloning the libraries of `req` failed (the address space changed
    /// under the stop, the stop failed): they are asked for again at the
    /// next relink, within the bound on clonings per file.
    pub(crate) fn load_failed(&mut self, req: &libraries::LoadRequest) {
        if !self.asked(req) {
            return;
        }
        self.loading = false;
        for l in &req.libraries {
            self.tried.remove(l);
        }
        self.attachment.relink_soon();
    }

    /// Whether this tracer asked for `req` (not the tracer of a program
    /// the process exec'd away from: its control block was elsewhere).
    fn asked(&self, req: &libraries::LoadRequest) -> bool {
        req.control == self.attachment.control_addr
    }

    /// The clones, for the unwinder.
    pub(crate) fn clone_frames(&self) -> Arc<CloneFrames> {
        self.frames.clone()
    }

    /// The eBPF `BURSTS` map entry.
    pub(crate) fn target(&self) -> BurstTarget {
        self.attachment.target()
    }

    /// The pages of original code where a burst can start (the eBPF
    /// `CLONE_PAGES` set).
    pub(crate) fn pages(&self) -> &[u64] {
        self.attachment.pages()
    }

    /// Consumes every record the target wrote. Returns how many.
    /// `activity`: the process's samples since the last drain (one in its
    /// clones says its burst is alive even if it wrote nothing);
    /// `stacks`: the stack samples of its burst signals, which give each
    /// burst its calling context.
    /// With `hold`, the records are only read off the rings (which frees
    /// them for the target) and counted later, a batch of several drains
    /// at once ([`HOLD_FOR`], [`HOLD_RECORDS`]): each batch starts with
    /// the daemon's tables out of the processor's caches, and a longer
    /// batch touches fewer of their lines per record (on a saved sqlite3
    /// trace, the distinct context edges, path entries and paths a burst
    /// touches, amortised over a batch: 172 at 9 bursts a batch, 63 at
    /// 45). They are counted in the order a drain without `hold` would
    /// have: the result is the same.
    pub(crate) fn drain(
        &mut self,
        activity: Activity,
        mut stacks: Option<&mut contexts::StartStacks>,
        hold: bool,
    ) -> u64 {
        let (counts, traced) = (&mut self.counts, &self.traced);
        let held = &mut self.held;
        let pid = traced.pid;
        let mut n = 0;
        let mut heads = [0; MAX_SLOTS];
        for (slot, head) in heads.iter_mut().enumerate() {
            let (k, h) = self.attachment.region().take_records(slot, |w0, w1| {
                // A thread is named while it runs (it may be gone by the
                // time its records are counted).
                // and its burst's stack sample is taken now (the samples
                // kept meanwhile are bounded).
                if w0 >> TAG_SHIFT == REC_START {
                    let tid = w0 as u32;
                    if !counts.has_name(tid) {
                        counts.name_thread(
                            tid,
                            crate::sys::thread_comm(pid, tid).unwrap_or_default(),
                        );
                    }
                    held.stacks
                        .push_back(stacks.as_deref_mut().and_then(|s| s.take(tid, w1)));
                }
                held.records.push((w0, w1));
            });
            if k > 0 {
                held.segments.push((slot, held.records.len()));
            }
            n += k;
            *head = h;
        }
        self.records += n;
        let now = std::time::Instant::now();
        if n > 0 && held.since.is_none() {
            held.since = Some(now);
        }
        let reaped = self.attachment.reap_stuck_bursts(&heads, activity);
        let due = !hold
            || !reaped.is_empty()
            || self.held.records.len() >= HOLD_RECORDS
            || self
                .held
                .since
                .is_some_and(|t| now.saturating_duration_since(t) >= HOLD_FOR)
            || self.data_refs.as_ref().is_some_and(|d| d.rate_due(now));
        if due {
            self.count_held();
            if let Some(every) = self.data_refs.as_mut().and_then(|d| d.refs_every(now)) {
                tracing::debug!(pid = %pid, "memory mode: one burst in {every} records references");
                self.attachment.region().set_refs_every(every);
            }
        }
        for slot in reaped {
            self.reaped += 1;
            self.counts.burst_reaped(slot);
        }
        n
    }

    /// Counts the records [`Self::drain`] held, slot by slot within each
    /// drain as they were read: each slot's sub-ring holds its bursts'
    /// records in order (one producer each); PathCounts keeps a burst per
    /// slot.
    fn count_held(&mut self) {
        let (counts, trace, traced) = (&mut self.counts, &mut self.trace, &self.traced);
        let data_refs = &mut self.data_refs;
        let (tuples, tuple_config) = (&mut self.tuples, &self.tuple_config);
        let held = &mut self.held;
        let mut from = 0;
        for &(slot, to) in &held.segments {
            counts.select(slot);
            for &(w0, w1) in &held.records[from..to] {
                let ev = decode::decode(w0, w1);
                if let Some(t) = trace.as_mut() {
                    t.add(&ev);
                }
                if let decode::BurstEvent::Path {
                    fid,
                    path,
                    partial: false,
                    ..
                } = ev
                    && counts.needs_cost(fid, path)
                {
                    counts.set_cost(fid, path, traced.path_cost(fid, path));
                }
                counts.add(&ev);
                if let Some(d) = data_refs.as_mut() {
                    d.add(slot, &ev, traced);
                }
                if let decode::BurstEvent::Tuple { .. } = ev {
                    tuples
                        .get_or_insert_with(|| Tuples::new(tuple_config))
                        .add(&ev, traced);
                }
                if let decode::BurstEvent::Start { .. } = ev {
                    let s = held.stacks.pop_front().flatten();
                    let base = s.map(|s| (traced.context_frames(&s), s.complete));
                    counts.begin(base.as_ref().map(|(f, c)| (f.as_slice(), *c)));
                }
            }
            from = to;
        }
        held.records.clear();
        held.segments.clear();
        held.stacks.clear();
        held.since = None;
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
            declined_behind,
        ] = self.attachment.counters_since_attach();
        BurstStats {
            functions_rewritten: self.functions_rewritten,
            functions_skipped: self.functions_skipped,
            bursts,
            bursts_truncated,
            declined_busy,
            declined_pc,
            declined_budget,
            declined_behind,
            records: self.records,
            records_lost,
            paths: self.counts.paths,
            partial_paths: self.counts.partial_paths,
            bad_records: self.counts.bad_records,
            reaped: self.reaped,
            references: self.data_refs.as_ref().map_or(0, |d| d.seen),
            references_dropped: self
                .data_refs
                .as_ref()
                .map_or(0, |d| d.dropped + d.skipped + d.unplaced),
            burst_ticks: self.counts.estimates.ticks,
            refs_burst_ticks: self.data_refs.as_ref().map_or(0, |d| d.ticks),
            refs_bursts: self.data_refs.as_ref().map_or(0, |d| d.bursts),
            tuple_records: self.tuples.as_ref().map_or(0, |t| t.records),
            tuples_dropped: self.tuples.as_ref().map_or(0, Tuples::dropped),
        }
    }

    /// New burst length and path timing (a reload).
    pub(crate) fn set_options(&mut self, opts: &BurstOptions) {
        // (The session counted the records read so far: they are counted
        // under the old options.)
        self.attachment.set_options(opts);
        self.tuple_config = opts.tuple_config;
        if let Some(t) = &mut self.tuples {
            t.set_config(&opts.tuple_config);
        }
    }

    /// No new bursts; a running one ends at its next check.
    pub(crate) fn disarm(&mut self) {
        self.attachment.disarm();
    }

    /// Whether the process still runs the program this tracer attached
    /// to: its control block is still where the attach mapped it (gone
    /// once the process exec'd).
    pub(crate) fn image_present(&self) -> bool {
        let at = self.attachment.control_addr;
        crate::sys::open_mem(self.pid(), false).is_ok_and(|m| super::rooms::runs_ours(&m, at))
    }

    /// Disarms, drains until the ring is empty (the target may have exited
    /// with it full), lets a signal already in flight arrive and be
    /// declined, drains again and restores the signal disposition. Blocks
    /// (sleeps, ptrace).
    pub(crate) fn detach(self) -> Finished {
        self.finish(true)
    }

    /// The process exec'd: what its old program's bursts recorded,
    /// drained and counted, with nothing done to the process (its new
    /// program owns the pid, its memory and its signal dispositions; no
    /// burst signal reaches it, see the eBPF `on_exec`).
    pub(crate) fn finish_exec(self, execd: Execd) -> Finished {
        let mut f = self.finish(false);
        f.execd = Some(execd);
        f
    }

    fn finish(mut self, restore: bool) -> Finished {
        self.disarm();
        while self.drain(Activity::default(), None, false) > 0 {}
        if restore {
            // Let a signal already in flight arrive and be declined.
            std::thread::sleep(std::time::Duration::from_millis(20));
            self.drain(Activity::default(), None, false);
        }
        // Bursts the target left running (it exited, or was detached,
        // mid-burst) end here.
        self.counts.finish_running();
        if let Some(d) = &mut self.data_refs {
            d.finish();
        }
        let stats = self.stats();
        tracing::info!(
            pid = %self.pid(),
            "burst slots: at most {} ran at once (of {} allowed)",
            crate::words::count(self.attachment.concurrent_max(), "burst", "bursts"),
            self.attachment.max_bursts()
        );
        if let Some(t) = &mut self.trace {
            t.flush();
        }
        let restored = if restore {
            self.attachment.restore_signal()
        } else {
            Ok(())
        };
        // Another burstyd may trace it from now on.
        self.attachment.release();
        Finished {
            traced: self.traced,
            counts: self.counts,
            data_refs: self.data_refs,
            tuples: self.tuples,
            stats: restored.map(|()| stats),
            execd: None,
        }
    }
}
