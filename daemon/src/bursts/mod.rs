//! Bursty tracing of live processes (`--pid`, `run`): inject the
//! instrumented clones, arm them, turn the records their bursts write into
//! path counts, disarm.
//!
//! - [`lifecycle`]: attach / re-arm / detach under ptrace, the signal
//!   handler, stuck-burst reaping;
//! - [`tables`]: the lookup tables it writes, streamed from a cache entry
//!   or the target's memory;
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
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use burstyd_common::addr::Pid;
use burstyd_common::burst::{BurstTarget, MAX_MODULES, MAX_SLOTS};
use std::collections::HashMap;
use tokio::sync::mpsc;
use tracing::warn;
use userspace_rewriter::analysis::plan::FunctionStatus;

use crate::stacks::clones::CloneFrames;

pub(crate) mod cache;
pub(crate) mod contexts;
pub(crate) mod counts;
pub(crate) mod coverage;
pub(crate) mod decode;
pub(crate) mod lifecycle;
pub(crate) mod linkmap;
pub(crate) mod modules;
mod parallel;
pub(crate) mod ring;
pub(crate) mod selection;
pub(crate) mod tables;
pub(crate) mod worker;

use counts::{PathCounts, TraceFile};
use lifecycle::{Attached, Attachment};

/// Per function of module `m`, in fid order: its number of paths (none
/// without numbering) and the fid of its family (the first part of the
/// function it belongs to, see [`PathCounts`]).
fn fid_facts(m: &lifecycle::ModuleFacts) -> impl Iterator<Item = (Option<u64>, u32)> + '_ {
    m.plan.functions.iter().map(move |f| {
        let paths = match &f.status {
            FunctionStatus::Analyzed(fa) => fa.paths,
            _ => None,
        };
        (paths, m.fid_base + f.family as u32)
    })
}

/// The samples of a traced process between two drains of its records.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Activity {
    /// All of them (it ran).
    pub(crate) samples: u64,
    /// Those whose pc was in its clones.
    pub(crate) in_clones: u64,
}

/// How bursts run.
#[derive(Clone, Debug)]
pub(crate) struct BurstOptions {
    /// Checks per burst (`--burst`).
    pub(crate) burst_len: u64,
    /// Every event, from the first burst on, for ground truth.
    pub(crate) full_trace: bool,
    /// Measure each path's time with the time-stamp counter.
    pub(crate) measure: bool,
    /// Bursts that may run at once in a process, on as many threads (1
    /// to `MAX_SLOTS`).
    pub(crate) max_bursts: u64,
    /// Which shared libraries are cloned besides the executable.
    pub(crate) libraries: Libraries,
    /// Write raw burst traces here (`--save-bursts`).
    pub(crate) save_bursts: Option<PathBuf>,
}

impl BurstOptions {
    /// The options `b` (the file and the command line) sets, with the
    /// run-only ones (`full_trace`, `save_bursts`) as given.
    pub(crate) fn from_settings(
        b: &crate::service::config::BurstSettings,
        full_trace: bool,
        save_bursts: Option<PathBuf>,
    ) -> Self {
        BurstOptions {
            burst_len: b.burst,
            full_trace,
            measure: b.path_time,
            max_bursts: b.max_bursts,
            libraries: b.libraries,
            save_bursts,
        }
    }
}

/// Which of a traced process's shared libraries get clones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Libraries {
    /// The executable only (`--exe-only`, `libraries = false`).
    None,
    /// Those where the process spends its time: a library is cloned once
    /// it holds [`HOT_LIBRARY_SHARE`] of the process's user-mode samples
    /// (the service's default). A long-running server maps many
    /// libraries it hardly runs (redis: 17, of which libc holds nearly
    /// all the library time); their plans, maps and clones cost the
    /// daemon about 3 MB each and cover no samples.
    Hot,
    /// All of them at attach, and those loaded later (`--pid`, `run`:
    /// a command held at its entry point is covered from its first
    /// instruction).
    All,
}

/// The share of a process's user-mode samples (event weight) a library
/// must hold to be cloned under [`Libraries::Hot`].
pub(crate) const HOT_LIBRARY_SHARE: f64 = 0.01;

/// Records one drain of a process's rings must find for the next drain to
/// come after [`BUSY_DRAIN_AGAIN`] rather than the usual interval: long
/// bursts (`--burst 100000`) or many threads write half a sub-ring within
/// the 50 ms between drains, and the handler declines bursts meanwhile
/// ("daemon behind"). 4096 records is a sixteenth of half a sub-ring.
pub(crate) const BUSY_DRAIN_RECORDS: u64 = 4096;

/// How soon rings that held many records are drained again.
pub(crate) const BUSY_DRAIN_AGAIN: std::time::Duration = std::time::Duration::from_millis(5);

/// Default checks per burst. A path is counted only when its burst saw
/// it start, so a path that spans calls into long-running callees needs
/// a burst longer than the callees: xerces-c's parser's edge profile
/// reached 0.940 relative overlap against callgrind with 200 checks, 0.974
/// with 500, 0.980 with 1000 (eight `run`s of a 3 MiB input each,
/// 2026-11-26). A burst's checks cost less than its signal (36 µs a burst
/// at 200 checks, 27 µs of it the signal, for xerces; xz's checks are the
/// densest: 19 µs of 42), so 500 keeps bursts within the 2% target.
pub(crate) const DEFAULT_BURST: u64 = 500;

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
    /// Signals declined because the daemon was behind (the burst's
    /// sub-ring more than half full): a burst then could have lost
    /// records.
    pub(crate) declined_behind: u64,
    pub(crate) records: u64,
    pub(crate) records_lost: u64,
    pub(crate) paths: u64,
    pub(crate) partial_paths: u64,
    pub(crate) bad_records: u64,
    /// Bursts ended by the daemon: their thread left the clones without a
    /// check (an exception or longjmp into original code).
    pub(crate) reaped: u64,
}

impl BurstStats {
    /// Signals the handler declined, for every reason.
    pub(crate) fn declined(&self) -> u64 {
        self.declined_busy + self.declined_pc + self.declined_budget + self.declined_behind
    }

    /// Adds `o`'s counts (the burst and record counts, not the
    /// functions).
    pub(crate) fn add(&mut self, o: &BurstStats) {
        self.bursts += o.bursts;
        self.bursts_truncated += o.bursts_truncated;
        self.declined_busy += o.declined_busy;
        self.declined_pc += o.declined_pc;
        self.declined_budget += o.declined_budget;
        self.declined_behind += o.declined_behind;
        self.records += o.records;
        self.records_lost += o.records_lost;
        self.paths += o.paths;
        self.partial_paths += o.partial_paths;
        self.bad_records += o.bad_records;
        self.reaped += o.reaped;
    }
}

/// What the exporters need to know about a traced process and its
/// modules with clones.
pub(crate) struct Traced {
    pub(crate) pid: Pid,
    /// `/proc/PID/exe`.
    pub(crate) exe: PathBuf,
    /// The executable first, then the libraries, in `fid` order.
    pub(crate) modules: Vec<TracedModule>,
    /// Where the modules and their clones' originals are (hot coverage).
    pub(crate) code: coverage::CodeMap,
    /// Every function of every module by address: `(AVMA start, end,
    /// fid)`, sorted ([`Self::reindex`]).
    index: Vec<(u64, u64, u32)>,
}

/// One module with clones.
pub(crate) struct TracedModule {
    pub(crate) facts: lifecycle::ModuleFacts,
    /// The file with the module's DWARF lines, opened while the process
    /// lives (its files may be gone when its paths are exported) and
    /// parsed only while they are: python3.11's lines take 40 MB parsed.
    lines_file: Option<std::fs::File>,
}

impl TracedModule {
    fn new(pid: Pid, exe: &std::path::Path, facts: lifecycle::ModuleFacts) -> Self {
        let file = if facts.is_exe {
            exe.to_owned()
        } else {
            facts
                .debug_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("/proc/{pid}/root{}", facts.path)))
        };
        TracedModule {
            lines_file: std::fs::File::open(file).ok(),
            facts,
        }
    }

    /// `(file, line)` of the SVMAs `addrs` that the module's DWARF has.
    pub(crate) fn lines(&self, addrs: &[u64]) -> HashMap<u64, (Option<String>, u32)> {
        match &self.lines_file {
            Some(f) => crate::export::lines::lines_in_file(f, addrs),
            None => HashMap::new(),
        }
    }
}

impl std::ops::Deref for TracedModule {
    type Target = lifecycle::ModuleFacts;
    fn deref(&self) -> &lifecycle::ModuleFacts {
        &self.facts
    }
}

impl Traced {
    /// The module of record `fid`, and the function's index in its plan.
    pub(crate) fn function(&self, fid: u32) -> Option<(&TracedModule, usize)> {
        let i = self
            .modules
            .partition_point(|m| m.fid_base <= fid)
            .checked_sub(1)?;
        let m = &self.modules[i];
        let local = (fid - m.fid_base) as usize;
        (local < m.plan.functions.len()).then_some((m, local))
    }

    /// Rebuilds the address index once the modules changed.
    fn reindex(&mut self) {
        self.index = self
            .modules
            .iter()
            .flat_map(|m| {
                m.plan.functions.iter().enumerate().map(|(i, f)| {
                    let a = f.start.wrapping_add(m.bias);
                    (a, a + f.size.max(1), m.fid_base + i as u32)
                })
            })
            .collect();
        self.index.sort_unstable();
    }

    /// The function of a traced module that holds `avma`.
    pub(crate) fn fid_at(&self, avma: u64) -> Option<u32> {
        let i = self.index.partition_point(|e| e.0 <= avma).checked_sub(1)?;
        let (_, end, fid) = self.index[i];
        (avma < end).then_some(fid)
    }

    /// A burst's stack sample as context frames, outermost first, down to
    /// the function the burst began in. A leaf in a PLT stub is left out
    /// (the stub jumps to its target, which the burst enters).
    pub(crate) fn context_frames(&self, s: &contexts::StartStack) -> Vec<contexts::FrameKey> {
        let mut out = Vec::with_capacity(s.frames.len());
        for (i, &a) in s.frames.iter().enumerate() {
            // Return addresses point after their call.
            let lookup = if i == 0 { a } else { a.wrapping_sub(1) };
            match self.fid_at(lookup) {
                Some(fid) => {
                    let plt = self.function(fid).is_some_and(|(m, l)| {
                        matches!(m.plan.functions[l].status, FunctionStatus::Plt)
                    });
                    if !(i == 0 && plt) {
                        out.push(contexts::FrameKey::Function(fid));
                    }
                }
                None => out.push(contexts::FrameKey::Address(a)),
            }
        }
        out.reverse();
        out
    }

    /// The executable.
    pub(crate) fn exe_module(&self) -> &TracedModule {
        &self.modules[0]
    }

    /// The CFGs and path numberings of functions `fids` (those that have
    /// them), read once each.
    pub(crate) fn path_details(
        &self,
        fids: impl IntoIterator<Item = u32>,
    ) -> HashMap<u32, lifecycle::PathFacts<'_>> {
        let mut out = HashMap::new();
        for fid in fids {
            if let std::collections::hash_map::Entry::Vacant(v) = out.entry(fid)
                && let Some(d) = self.function(fid).and_then(|(m, i)| m.path_details(i))
            {
                v.insert(d);
            }
        }
        out
    }
}

/// One process being traced in bursts.
/// Thread `tid` of `pid`'s name (its `comm`), or "" once it is gone.
fn thread_name(pid: Pid, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end_matches('\n').to_owned())
        .unwrap_or_default()
}

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
    /// The handler knows the loader's link-map hook.
    hooked: bool,
    /// Clone libraries (not `--exe-only`), also those loaded later.
    libraries: Libraries,
    /// Under [`Libraries::Hot`]: the libraries (maps paths) found hot,
    /// which a relink may clone.
    hot: std::collections::HashSet<String>,
    /// Libraries loaded since the attach that were sent to be cloned (a
    /// request under way: `loading`), and how often each file was.
    tried: std::collections::HashSet<linkmap::Loaded>,
    loading: bool,
    clonings: std::collections::HashMap<(String, u64), u32>,
    /// The attach's second step (the libraries mapped then) is still to
    /// come: libraries found uncloned now are its business.
    awaiting_libraries: bool,
    /// How long the attach (its first step) took.
    attach_secs: f64,
}

/// How often one library file may be cloned anew in a process that
/// unloads and loads it again (each time a ptrace stop, and tables and
/// clones that stay mapped in the target).
const MAX_CLONINGS: u32 = 8;

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
    pub(crate) fn attach(
        pid: Pid,
        opts: &BurstOptions,
        held: bool,
    ) -> anyhow::Result<(Self, Option<lifecycle::Then>)> {
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
        ) = lifecycle::attach(pid, opts, held)?;
        // Path counts per fid, over every module's range of them.
        let mut counts = PathCounts::default();
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
            awaiting_libraries: matches!(pending, Some(lifecycle::Then::Libraries(_))),
            attach_secs: began.elapsed().as_secs_f64(),
            traced: Traced {
                pid,
                exe,
                modules,
                code,
                index: Vec::new(),
            },
        };
        tracer.traced.reindex();
        Ok((tracer, pending))
    }

    /// Adds the shared libraries' clones ([`lifecycle::add_libraries`]);
    /// with `activate`, bursts go into them from now on.
    /// The attach's second step is done (its libraries added or not).
    pub(crate) fn libraries_added(&mut self) {
        self.awaiting_libraries = false;
        self.attachment.relink_soon();
    }

    pub(crate) fn extend(&mut self, ext: lifecycle::Extension, activate: bool) {
        let lifecycle::Extension {
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
    ) -> (Vec<(u64, u64)>, Option<lifecycle::LoadRequest>) {
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
        req: &lifecycle::LoadRequest,
        ext: Option<lifecycle::Extension>,
    ) -> bool {
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
    pub(crate) fn load_failed(&mut self, req: &lifecycle::LoadRequest) {
        self.loading = false;
        for l in &req.libraries {
            self.tried.remove(l);
        }
        self.attachment.relink_soon();
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
    pub(crate) fn drain(
        &mut self,
        activity: Activity,
        mut stacks: Option<&mut contexts::StartStacks>,
    ) -> u64 {
        let (counts, trace, traced) = (&mut self.counts, &mut self.trace, &self.traced);
        let pid = traced.pid;
        let mut n = 0;
        let mut heads = [0; MAX_SLOTS];
        // Slot by slot: each slot's sub-ring holds its bursts' records in
        // order (one producer each); PathCounts keeps a burst per slot.
        for (slot, head) in heads.iter_mut().enumerate() {
            counts.select(slot);
            let (k, h) = self.attachment.region().take_records(slot, |w0, w1| {
                let ev = decode::decode(w0, w1);
                if let Some(t) = trace.as_mut() {
                    t.add(&ev);
                }
                counts.add(&ev);
                if let decode::BurstEvent::Start { tid, pc, .. } = ev {
                    if !counts.has_name(tid) {
                        counts.name_thread(tid, thread_name(pid, tid));
                    }
                    let s = stacks.as_deref_mut().and_then(|s| s.take(tid, pc));
                    let base = s.map(|s| (traced.context_frames(&s), s.complete));
                    counts.begin(base.as_ref().map(|(f, c)| (f.as_slice(), *c)));
                }
            });
            n += k;
            *head = h;
        }
        self.records += n;
        for slot in self.attachment.reap_stuck_bursts(&heads, activity) {
            self.reaped += 1;
            self.counts.burst_reaped(slot);
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
        }
    }

    /// New burst length and path timing (a reload).
    pub(crate) fn set_options(&mut self, opts: &BurstOptions) {
        self.attachment.set_options(opts);
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
        while self.drain(Activity::default(), None) > 0 {}
        // Let a signal already in flight arrive and be declined.
        std::thread::sleep(std::time::Duration::from_millis(20));
        self.drain(Activity::default(), None);
        let stats = self.stats();
        tracing::info!(
            pid = %self.pid(),
            "burst slots: at most {} bursts ran at once (of {} allowed)",
            self.attachment.concurrent_max(),
            self.attachment.max_bursts()
        );
        if let Some(t) = &mut self.trace {
            t.flush();
        }
        let restored = self.attachment.restore_signal();
        // Another burstyd may trace it from now on.
        self.attachment.release();
        Finished {
            traced: self.traced,
            counts: self.counts,
            stats: restored.map(|()| stats),
        }
    }
}

/// What the attach thread sends: a finished attach, then (unless
/// `--exe-only`) the shared libraries it added to it.
pub(crate) enum Attach {
    Tracer {
        pid: Pid,
        tracer: anyhow::Result<Box<BurstTracer>>,
        /// Told once bursts are armed for it (a held command waits).
        armed: std::sync::mpsc::Sender<()>,
    },
    Libraries {
        pid: Pid,
        libraries: anyhow::Result<Option<lifecycle::Extension>>,
    },
    /// Libraries loaded since the attach ([`BurstTracer::relink`]'s
    /// request), cloned.
    Loaded {
        request: lifecycle::LoadRequest,
        libraries: anyhow::Result<Option<lifecycle::Extension>>,
    },
}

/// Work for the attach thread.
pub(crate) enum Job {
    /// Attach to a process (the service's targets, as they are selected).
    Attach { pid: Pid, opts: BurstOptions },
    /// Clone the libraries a traced process loaded since its attach
    /// ([`BurstTracer::relink`]'s request).
    Load(lifecycle::LoadRequest),
}

/// The attach thread's work, in its order: executables first (each
/// target takes bursts within milliseconds), then their libraries, then
/// the libraries loaded since.
#[derive(Default)]
struct Queue {
    attaches: std::collections::VecDeque<(Pid, BurstOptions)>,
    libraries: std::collections::VecDeque<(Pid, lifecycle::Pending)>,
    loads: std::collections::VecDeque<lifecycle::LoadRequest>,
}

impl Queue {
    fn push(&mut self, j: Job) {
        match j {
            Job::Attach { pid, opts } => self.attaches.push_back((pid, opts)),
            Job::Load(r) => self.loads.push_back(r),
        }
    }
}

/// The bursty-tracing side of a session: one tracer per target, and the
/// thread attaching to them.
pub(crate) struct Bursts {
    tracers: Vec<BurstTracer>,
    full_trace: bool,
    /// Bursts measure their paths' time (some tracer's, ever).
    measure: bool,
    /// The options of further attaches (the service's, changed by a
    /// reload).
    opts: Option<BurstOptions>,
    /// Finished attaches, until the attach thread is done (the channel
    /// closes when it returns).
    attaching: Option<mpsc::UnboundedReceiver<Attach>>,
    /// Set when the session ends: the attach thread starts no further
    /// attach (the one under way runs to its end and is detached).
    cancel: Arc<AtomicBool>,
    /// Processes to attach to and libraries loaded since an attach, for
    /// the attach thread (dropped when the session ends: the thread
    /// returns).
    jobs: Option<std::sync::mpsc::Sender<Job>>,
}

impl Bursts {
    /// Starts attaching to each target (waiting for `run`'s command to
    /// have exec'd), one after the other, on a thread of its own
    /// (`burstyd-attach`): the analysis, the code generation and the
    /// ptrace stop take seconds for a big binary, and the session keeps
    /// sampling, serving HTTP and pinging the watchdog meanwhile. The
    /// tracers (or why a target cannot be traced) arrive through
    /// [`Self::next_attach`]. The thread then waits for more work
    /// ([`Self::attach`], libraries loaded later) until the session ends.
    ///
    /// With `gate` (`run`'s command, `pids[0]`, waits on it to exec), the
    /// attach thread first becomes the command's tracer, then closes the
    /// gate and holds the command at its entry point until its clones
    /// (and its libraries') are in place: bursts cover it from its first
    /// instruction. Should that fail, it is released and attached to as
    /// it runs.
    pub(crate) fn start(
        opts: Option<&BurstOptions>,
        pids: &[Pid],
        gate: Option<std::os::fd::OwnedFd>,
    ) -> Self {
        let mut bursts = Bursts {
            tracers: Vec::new(),
            full_trace: opts.is_some_and(|o| o.full_trace),
            measure: opts.is_some_and(|o| o.measure),
            opts: opts.cloned(),
            attaching: None,
            cancel: Arc::new(AtomicBool::new(false)),
            jobs: None,
        };
        let Some(opts) = opts else {
            return bursts;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (jobs, queued) = std::sync::mpsc::channel::<Job>();
        bursts.jobs = Some(jobs);
        let mut queue = Queue::default();
        for &pid in pids {
            queue.attaches.push_back((pid, opts.clone()));
        }
        let (first, cancel) = (pids.first().copied(), bursts.cancel.clone());
        let spawned = std::thread::Builder::new()
            .name("burstyd-attach".into())
            .spawn(move || {
                let mut held = first
                    .zip(gate)
                    .map(|(pid, g)| lifecycle::hold_command(pid, g));
                let mut niced = false;
                loop {
                    let mut open = true;
                    loop {
                        match queued.try_recv() {
                            Ok(j) => queue.push(j),
                            Err(std::sync::mpsc::TryRecvError::Empty) => break,
                            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                                open = false;
                                break;
                            }
                        }
                    }
                    if cancel.load(Ordering::Relaxed) {
                        if let (Some(true), Some(pid)) = (held.take(), first) {
                            userspace_rewriter::inject::hold::release(pid);
                        }
                        return;
                    }
                    if let Some((pid, opts)) = queue.attaches.pop_front() {
                        // Only the first can be `run`'s held command.
                        let hold = held.take() == Some(true);
                        match attach_one(pid, &opts, hold, &tx) {
                            Some(Some(p)) => queue.libraries.push_back((pid, p)),
                            Some(None) => {}
                            None => return,
                        }
                        continue;
                    }
                    // The libraries are background work: the session
                    // (draining rings, sampling) and the targets come
                    // first. (Not `run`'s or `--pid`'s executables: a
                    // short program must be armed early.)
                    if !niced {
                        // SAFETY: setpriority on this thread (PRIO_PROCESS
                        // with a tid) has no memory effects.
                        unsafe {
                            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10)
                        };
                        niced = true;
                    }
                    if let Some((pid, p)) = queue.libraries.pop_front() {
                        // Sent also when there is nothing to add: the
                        // session then looks for libraries loaded since.
                        let libraries = match lifecycle::add_libraries(pid, p, &cancel) {
                            Ok(None) if cancel.load(Ordering::Relaxed) => {
                                tracing::info!(%pid, "the session ended before its shared libraries were cloned");
                                continue;
                            }
                            // It exited meanwhile: nothing to say.
                            Err(_) if !crate::sys::process_running(pid) => continue,
                            r => r,
                        };
                        if tx.send(Attach::Libraries { pid, libraries }).is_err() {
                            return;
                        }
                        crate::sys::return_free_memory();
                        continue;
                    }
                    if let Some(request) = queue.loads.pop_front() {
                        let libraries = lifecycle::add_loaded(&request);
                        if tx.send(Attach::Loaded { request, libraries }).is_err() {
                            return;
                        }
                        crate::sys::return_free_memory();
                        continue;
                    }
                    if !open {
                        return;
                    }
                    match queued.recv() {
                        Ok(j) => queue.push(j),
                        Err(_) => return,
                    }
                }
            });
        match spawned {
            Ok(_) => bursts.attaching = Some(rx),
            Err(e) => warn!("bursty tracing disabled: cannot start the attach thread: {e}"),
        }
        bursts
    }

    /// Attaches to `pid` on the attach thread ([`Self::next_attach`]
    /// reports it), with the options in force.
    pub(crate) fn attach(&self, pid: Pid) {
        if let (Some(tx), Some(opts)) = (&self.jobs, &self.opts) {
            let _ = tx.send(Job::Attach {
                pid,
                opts: opts.clone(),
            });
        }
    }

    /// The options of further attaches (`None` without bursts).
    pub(crate) fn options(&self) -> Option<&BurstOptions> {
        self.opts.as_ref()
    }

    /// New options (a reload): for further attaches, and the burst length
    /// and path timing of every traced process from its next burst on.
    pub(crate) fn set_options(&mut self, opts: BurstOptions) {
        self.measure |= opts.measure;
        for t in &mut self.tracers {
            t.set_options(&opts);
        }
        self.opts = Some(opts);
    }

    /// Takes `pid`'s tracer out of the set (to be disarmed and detached);
    /// `None` when it is not traced (yet).
    pub(crate) fn release(&mut self, pid: Pid) -> Option<BurstTracer> {
        let i = self.tracers.iter().position(|t| t.pid() == pid)?;
        Some(self.tracers.swap_remove(i))
    }

    /// The next finished attach; `None` when the attach thread is done
    /// (then [`Self::attaching`] turns false) or was never started.
    /// Cancel safe.
    pub(crate) async fn next_attach(&mut self) -> Option<Attach> {
        let a = self.attaching.as_mut()?.recv().await;
        if a.is_none() {
            self.attaching = None;
        }
        a
    }

    /// Whether attaches are still under way.
    pub(crate) fn attaching(&self) -> bool {
        self.attaching.is_some()
    }

    /// No further attaches (the one under way still finishes).
    pub(crate) fn cancel_pending(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.jobs = None;
    }

    /// The tracer of `pid`, if it is traced.
    pub(crate) fn tracer_mut(&mut self, pid: Pid) -> Option<&mut BurstTracer> {
        self.tracers.iter_mut().find(|t| t.pid() == pid)
    }

    /// The processes traced now.
    pub(crate) fn tracers(&self) -> &[BurstTracer] {
        &self.tracers
    }

    pub(crate) fn tracers_mut(&mut self) -> &mut [BurstTracer] {
        &mut self.tracers
    }

    /// A tracer attached (by [`Self::next_attach`]) joins the set.
    pub(crate) fn add(&mut self, t: BurstTracer) {
        self.tracers.push(t);
    }

    /// Whether any process is traced.
    pub(crate) fn active(&self) -> bool {
        !self.tracers.is_empty()
    }

    /// Disarms every tracer (no new bursts; running ones end at their next
    /// check) after `untarget(pid)` took it out of the eBPF map.
    pub(crate) fn disarm(&mut self, mut untarget: impl FnMut(Pid)) {
        for t in &mut self.tracers {
            untarget(t.pid());
            t.disarm();
        }
    }

    /// The time-stamp counter's rate when bursts measure their paths'
    /// time with it (calibrated against the monotonic clock over 20 ms).
    pub(crate) fn tsc_hz(&self) -> Option<f64> {
        self.measure.then(crate::sys::tsc_hz)
    }

    /// How often to drain the record rings: a full trace fills them fast.
    pub(crate) fn drain_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(if self.full_trace { 5 } else { 50 })
    }

    /// `activity(pid)`: the samples of `pid` since the last drain;
    /// `stacks`: its burst signals' stack samples. Returns whether the
    /// rings held many records ([`BUSY_DRAIN_RECORDS`] in one process):
    /// then they should be drained again soon ([`BUSY_DRAIN_AGAIN`]), not
    /// at the next [`Self::drain_interval`], since the handler declines
    /// bursts while a sub-ring is more than half full.
    pub(crate) fn drain(
        &mut self,
        mut activity: impl FnMut(Pid) -> Activity,
        stacks: &mut HashMap<Pid, contexts::StartStacks>,
    ) -> bool {
        let mut busy = false;
        for t in &mut self.tracers {
            let a = activity(t.pid());
            busy |= t.drain(a, stacks.get_mut(&t.pid())) >= BUSY_DRAIN_RECORDS;
        }
        busy
    }

    /// Relinks each tracer that needs it ([`BurstTracer::relink`]);
    /// `changes(pid)` is its loader's count of link-map changes. Returns
    /// the ranges of the libraries found unloaded, per process.
    pub(crate) fn relink(
        &mut self,
        mut changes: impl FnMut(Pid) -> Option<u64>,
    ) -> Vec<(Pid, Vec<(u64, u64)>)> {
        let mut out = Vec::new();
        let jobs = self.jobs.as_ref();
        for t in &mut self.tracers {
            let (gone, request) = t.relink(changes(t.pid()));
            if let (Some(r), Some(tx)) = (request, jobs) {
                let _ = tx.send(Job::Load(r));
            }
            if !gone.is_empty() {
                out.push((t.pid(), gone));
            }
        }
        out
    }

    /// Asks the attach thread to clone libraries loaded since.
    pub(crate) fn request(&self, r: lifecycle::LoadRequest) {
        if let Some(tx) = &self.jobs {
            let _ = tx.send(Job::Load(r));
        }
    }

    /// The tracers, for detaching (the set is empty afterwards).
    pub(crate) fn take(&mut self) -> Vec<BurstTracer> {
        std::mem::take(&mut self.tracers)
    }
}

/// On the attach thread: attaches to `pid` (held at its entry point with
/// `hold`) and sends the tracer, or why it cannot be traced. Returns the
/// libraries to clone next (`Some(Some(..))`), or `None` when the session
/// is gone (the thread returns).
fn attach_one(
    pid: Pid,
    opts: &BurstOptions,
    hold: bool,
    tx: &mpsc::UnboundedSender<Attach>,
) -> Option<Option<lifecycle::Pending>> {
    if !hold {
        lifecycle::wait_for_exec(pid);
    }
    let (tracer, then) = match BurstTracer::attach(pid, opts, hold) {
        Ok((t, then)) => (Ok(Box::new(t)), then),
        Err(e) => {
            if hold {
                // Still held by this thread: let it run.
                userspace_rewriter::inject::hold::release(pid);
            }
            (Err(e), None)
        }
    };
    let (armed, armed_rx) = std::sync::mpsc::channel();
    let sent = tx.send(Attach::Tracer { pid, tracer, armed });
    crate::sys::return_free_memory();
    let mut libraries = None;
    match then {
        Some(lifecycle::Then::Libraries(p)) => libraries = Some(p),
        Some(lifecycle::Then::Release(held)) => {
            // Bursts armed (or the session gone): it runs.
            let _ = armed_rx.recv_timeout(std::time::Duration::from_secs(5));
            if let Err(e) = held.detach() {
                warn!(%pid, "releasing the held command: {e}");
            }
        }
        None => {}
    }
    if let Err(mpsc::error::SendError(a)) = sent {
        // Nobody will drain it: leave the target as it was.
        if let Attach::Tracer { tracer: Ok(t), .. } = a {
            let _ = (*t).detach();
        }
        return None;
    }
    Some(libraries)
}
