//! The ptrace side of bursty tracing: attach (inject the clones, or re-arm
//! an earlier injection), the handler's installation, stuck-burst reaping
//! and detach.
//!
//! Attach: analyse the executable (the plan), stop the process with ptrace,
//! map a memfd (`MAP_SHARED`: the [`BurstControl`] page and the record
//! ring, also mapped by the daemon) and an executable region next to it,
//! both within ±2 GiB of the binary; generate the clones for that address,
//! write them, install the handler on a signal the target does not use,
//! arm, resume. The original code is never written. Everything slow
//! (analysis, generation) happens before the target is stopped; all of it
//! blocks the calling thread, which is why the session runs it on a thread
//! of its own ([`super::Bursts::start`]).
//!
//! Detach: disarm (no new bursts; a running one ends at its next check),
//! then under ptrace set the signal to `SIG_IGN` (discarding a signal still
//! pending) and back to its old disposition. The regions stay mapped:
//! threads may still hold return addresses into clones, which lead back to
//! the original code at the next check. A later attach finds the memfd in
//! `/proc/PID/maps` and reuses it.
use std::borrow::Cow;
use std::mem::offset_of;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::{Context as _, bail};
use burstyd_common::addr::Pid;
use burstyd_common::burst::{
    ARMED_OFFSET, BurstControl, BurstLocal, BurstSlot, BurstTarget, CLONE_PAGE_SHIFT,
    CONTROL_BYTES, CONTROL_MAGIC, LOCAL_BYTES, LOCAL_OFFSET, MAX_MODULES, MAX_SLOTS, ModuleEntry,
};
use tracing::{debug, info, warn};
use userspace_rewriter::PAGE_SIZE;
use userspace_rewriter::analysis::plan::{self, FunctionStatus, Plan, PlanOptions};
use userspace_rewriter::codegen::unwind_info;
use userspace_rewriter::codegen::{self, LOW_STATE_LIMIT, Layout, NO_PATH, TableSource};
use userspace_rewriter::inject::{self, KernelSigaction, SA_RESTORER, Tracee};

use super::cache;
use super::coverage::CodeMap;
use super::modules::{self, Module};
use super::ring::{SharedRegion, TargetCounters};
use super::tables::{FileTables, Merged};
use super::worker;
use super::{BurstOptions, Libraries};
use crate::export::fdata::FdataFacts;
use crate::stacks::clones::{CloneFrames, CloneRegion};

/// Record ring sizes (words of 8 bytes), split into `MAX_SLOTS` sub-rings:
/// 2 MiB per slot (with 512 KiB, eight threads bursting on two loaded CPUs
/// lost 411 of 2.4 million records between two drains; memory is touched
/// only in the slots used, `max_bursts` of them); 8 MiB per slot in a
/// full trace, which waits rather than lose.
const RING_WORDS: u64 = 1 << 21; // 16 MiB
const RING_WORDS_FULL: u64 = 1 << 23; // 64 MiB

const MEMFD_NAME: &str = "burstyd-bursts";

/// How long a burst may write nothing, with no sample in the clones,
/// before it is taken for lost (see [`Attachment::reap_stuck_burst`]).
const STUCK_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// And only once the process was sampled this often meanwhile, none of
/// them in its clones (it ran, elsewhere).
const STUCK_SAMPLES: u64 = 5;

/// Slot `i`'s `BurstSlot::owner`, from the control block.
fn owner_offset(i: usize) -> u64 {
    (LOCAL_OFFSET
        + offset_of!(BurstLocal, slots)
        + i * std::mem::size_of::<BurstSlot>()
        + offset_of!(BurstSlot, owner)) as u64
}

/// Whether `pid`'s libc is glibc 2.26 or later, whose thread control
/// block has the 512 unused bytes (`tcbhead_t.__glibc_unused2`, at
/// `fs:0x80`) where the burst runtime keeps each thread's burst registers
/// (see `burstyd_common::burst`). Anything else (musl, whose thread
/// structure is there; a static executable, whose libc we cannot tell
/// apart; glibc 2.25 or older, which saved vector registers there) gets
/// no bursts: writing there would corrupt it. `Err` says why not.
fn check_glibc(pid: Pid) -> anyhow::Result<()> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("reading /proc/{pid}/maps"))?;
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            p.rsplit('/').next() == Some("libc.so.6") || {
                let n = p.rsplit('/').next().unwrap_or("");
                n.starts_with("libc-2.") && n.ends_with(".so")
            }
        })
        .map(str::to_owned);
    let Some(libc) = libc else {
        bail!(
            "pid {pid} maps no libc.so.6 (musl, or a static executable): bursts need glibc 2.26 or later, whose thread control block holds each thread's burst state"
        );
    };
    let bytes = std::fs::read(format!("/proc/{pid}/root{libc}"))
        .with_context(|| format!("reading {libc} of pid {pid}"))?;
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(&*bytes).with_context(|| format!("parsing {libc}"))?;
    let dynstr = file
        .section_by_name(".dynstr")
        .and_then(|s| s.data().ok())
        .unwrap_or_default();
    if !dynstr.split(|&b| b == 0).any(|name| name == b"GLIBC_2.26") {
        bail!(
            "pid {pid}: {libc} defines no GLIBC_2.26 version (not glibc, or older than 2.26): bursts need glibc 2.26 or later, whose thread control block holds each thread's burst state"
        );
    }
    Ok(())
}

/// Whether one burst slot's running burst makes progress (see
/// [`Attachment::reap_stuck_bursts`]).
#[derive(Clone, Copy, Debug, Default)]
struct SlotProgress {
    /// (heads\[slot\], slot_tids\[slot\]) at the previous drain.
    last: (u64, u64),
    /// Since when the same running burst has made no progress.
    idle_since: Option<std::time::Instant>,
    /// Samples of the process (none in its clones) since then.
    idle_samples: u64,
}

/// A target with the clones injected and the handler installed: what
/// the session needs to arm, reap and detach it.
pub(crate) struct Attachment {
    pid: Pid,
    /// Address of the control block in the target.
    control_addr: u64,
    region: SharedRegion,
    signal: i32,
    old_action: KernelSigaction,
    /// Target-side counters at attach (an earlier session's are in them).
    baseline: TargetCounters,
    /// Per slot: whether its running burst makes progress.
    progress: [SlotProgress; MAX_SLOTS],
    /// Pages (address >> `CLONE_PAGE_SHIFT`) of original code with a
    /// rewritten instruction: the eBPF program signals only there.
    pages: Vec<u64>,
    /// The lookup tables' header last written into the target (in use
    /// or not, see [`super::linkmap`]).
    base: u64,
    /// The process's count of link-map changes last seen, and whether
    /// the tables must be checked against the maps (again).
    link_seen: u64,
    relink_due: bool,
    /// Modules found unloaded so far: tables built from the target's
    /// before one of them was masked are stale.
    forgets: u64,
}

/// What an attach produced: the attachment, and what the tracer keeps of
/// the analysis (the analyses themselves and the files' bytes are dropped).
pub(crate) struct Attached {
    pub(crate) attachment: Attachment,
    /// `/proc/PID/exe`.
    pub(crate) exe: PathBuf,
    /// The modules with clones, the executable first, in `fid` order.
    pub(crate) modules: Vec<ModuleFacts>,
    /// The clones, for unwinding samples taken during bursts.
    pub(crate) frames: CloneFrames,
    pub(crate) functions_rewritten: usize,
    pub(crate) functions_skipped: usize,
    /// What the hot coverage needs: where the modules and their cloned
    /// functions are.
    pub(crate) code: CodeMap,
}

/// What the exporters need of one module with clones.
pub(crate) struct ModuleFacts {
    /// Its path as `/proc/PID/maps` shows it.
    pub(crate) path: String,
    pub(crate) is_exe: bool,
    pub(crate) plan: Plan,
    /// AVMA − SVMA.
    pub(crate) bias: u64,
    /// `[lo, hi)` of its mappings.
    pub(crate) range: (u64, u64),
    /// The inode of its file.
    pub(crate) ino: u64,
    /// Its functions' `fid`s are `fid_base + index in plan`.
    pub(crate) fid_base: u32,
    /// What `edges.fdata` needs from the file and the analysis.
    pub(crate) fdata: FdataFacts,
    /// Where the plan's CFGs and path numberings are when the plan holds
    /// none: its plan cache entry (see [`ModuleFacts::path_details`]).
    details: Option<cache::Details>,
    details_failed: std::sync::atomic::AtomicBool,
    /// Its separate debug file (DWARF lines of a stripped library).
    pub(crate) debug_file: Option<PathBuf>,
}

/// A function's CFG and path numbering (see [`ModuleFacts::path_details`]).
pub(crate) struct PathFacts<'a> {
    pub(crate) cfg: Cow<'a, userspace_rewriter::analysis::cfg::Cfg>,
    pub(crate) numbering: Cow<'a, userspace_rewriter::analysis::paths::PathNumbering>,
}

/// One module analysed (or found in the plan cache), before generation.
struct Analysed {
    module: Module,
    plan: Plan,
    made: Made,
    /// The hash of its bytes ([`Module::hash`]).
    id: u64,
    fid_base: u32,
    /// Bytes its clones needed where a generation found too little room.
    outgrew: u64,
    /// Its key in the plan cache, when there is one.
    key: Option<String>,
    /// A worker process made its cache entry now ([`super::worker`]).
    worker: Option<worker::Report>,
}

/// Where a module's clones come from.
enum Made {
    /// Generated from the analysis done now.
    Fresh {
        analysis: userspace_rewriter::analysis::cfg::Analysis,
        /// Functions whose unwind info cannot be restated: not cloned (C++
        /// exceptions and backtraces must unwind through every clone).
        exclude: std::collections::BTreeMap<u64, &'static str>,
        /// The module's bytes (read for this analysis).
        data: Vec<u8>,
    },
    /// Moved from the plan cache to this process's layout (taken when
    /// moved).
    Cached(Option<Box<cache::Entry>>),
}

impl Analysed {
    /// Found in the plan cache as it was (not made now by a worker).
    fn cached_before(&self) -> bool {
        matches!(self.made, Made::Cached(_)) && self.worker.is_none()
    }

    /// Gives the module's functions the `fid`s from `*next` on, and moves
    /// `*next` past them; false (nothing changed) when the `fid`s would
    /// run out.
    fn take_fids(&mut self, next: &mut u32) -> bool {
        let Some(after) = next
            .checked_add(self.plan.functions.len() as u32)
            .filter(|&b| b < NO_PATH)
        else {
            return false;
        };
        self.fid_base = *next;
        *next = after;
        true
    }

    /// The room to look for: the exact size of cached clones, a generous
    /// bound on fresh ones (by the bytes of the functions analysed).
    fn room(&self) -> u64 {
        match &self.made {
            Made::Cached(Some(c)) => code_len(c.bytes.len(), &c.eh),
            Made::Cached(None) => 0,
            Made::Fresh { .. } => code_room(
                self.plan
                    .functions
                    .iter()
                    .filter(|f| matches!(f.status, FunctionStatus::Analyzed(_)))
                    .map(|f| f.size)
                    .sum(),
            ),
        }
    }
}

/// Bytes of the mapping for clones and their unwind info (whole pages).
fn code_len(bytes: u64, eh: &[u8]) -> u64 {
    (((bytes + 15) & !15) + eh.len() as u64 + 0xfff) & !0xfff
}

/// One module's clones, generated for their address (the analysis is
/// dropped once the exporters' facts are taken from it).
struct Generated {
    facts: ModuleFacts,
    id: u64,
    img: codegen::CloneImage,
    /// Where the runtime and clones go, and the mapping's length (code,
    /// then the unwind info, in whole pages).
    code: u64,
    code_len: u64,
    /// The clones' `.eh_frame`: address in the target and bytes.
    eh: (u64, Vec<u8>),
    /// The module throws C++ exceptions (or unwinds with libgcc).
    exceptions: bool,
    /// Its key in the plan cache, if it is to be stored there (generated
    /// now).
    key: Option<String>,
    /// Where the bytes of `img` are.
    code_bytes: CodeBytes,
    /// Its lookup tables, when they are not in `img` but in its plan
    /// cache entry.
    tables: Option<FileTables>,
}

/// Where a module's clone code is, to be written into the process.
enum CodeBytes {
    /// In the image (generated now).
    InImage,
    /// In the plan cache entry, encoded for another layout: read, moved
    /// and written a piece at a time (never held whole).
    Cached {
        bytes: cache::CachedBytes,
        mv: Box<codegen::BytesMove>,
    },
}

impl CodeBytes {
    /// Bytes of clone code of `img` (whose bytes these are).
    fn len(&self, img: &codegen::CloneImage) -> u64 {
        match self {
            CodeBytes::InImage => img.bytes.len() as u64,
            CodeBytes::Cached { bytes, .. } => bytes.len(),
        }
    }
}

/// Pieces of cached clone code are read and written this many bytes at a
/// time.
const CODE_PIECE: u64 = 1 << 20;

impl Generated {
    /// What its plan cache entry is written from.
    fn stored(&self) -> cache::Stored<'_> {
        cache::Stored {
            path: &self.facts.path,
            plan: &self.facts.plan,
            fdata: &self.facts.fdata,
            img: &self.img,
            eh: &self.eh.1,
            exceptions: self.exceptions,
        }
    }

    /// Its lookup tables, wherever they are.
    fn tables(&self) -> &dyn TableSource {
        match &self.tables {
            Some(t) => t,
            None => &self.img.tables,
        }
    }

    /// Bytes of clone code.
    fn code_bytes_len(&self) -> u64 {
        self.code_bytes.len(&self.img)
    }

    /// Hands `write` the clone code for this process (address, bytes), in
    /// pieces.
    fn write_code(
        &self,
        mut write: impl FnMut(u64, &[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        match &self.code_bytes {
            CodeBytes::InImage => write(self.code, &self.img.bytes),
            CodeBytes::Cached { bytes, mv } => {
                moved_pieces(bytes, mv, |at, b| write(self.code + at, b))
            }
        }
    }
}

/// Reads cached clone code a piece at a time, moves each for this
/// process and hands it to `f` with its offset.
fn moved_pieces(
    bytes: &cache::CachedBytes,
    mv: &codegen::BytesMove,
    mut f: impl FnMut(u64, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    let mut start = 0;
    while start < mv.len() {
        let end = mv.piece_end(start, start + CODE_PIECE);
        buf.resize((end - start) as usize, 0);
        bytes.read_at(start, &mut buf)?;
        mv.patch(&mut buf, start).map_err(anyhow::Error::msg)?;
        f(start, &buf)?;
        start = end;
    }
    Ok(())
}

impl Generated {
    /// Its entry in the control block's module directory.
    fn entry(&self) -> ModuleEntry {
        ModuleEntry {
            id: self.id,
            code: self.code,
            fid_base: self.facts.fid_base.into(),
            bias: self.facts.bias,
            lo: self.facts.range.0,
            hi: self.facts.range.1,
            ino: self.facts.ino,
        }
    }
}

/// Finds `module` in the plan cache, or has a worker process make its
/// entry there ([`super::worker`]), or (without a cache, or should the
/// worker fail) analyses it in this process.
fn analyse(module: Module) -> anyhow::Result<Analysed> {
    let id = module.hash;
    let key = cache::get().map(|_| module.key());
    if let (Some(cache), Some(k)) = (cache::get(), key.as_deref()) {
        let mut found = cache.load(k).map(|e| (e, None));
        if found.is_none() && cache.usable() {
            match worker::prepare(&module, k) {
                Ok(report) => match cache.load(k) {
                    Some(e) => found = Some((e, Some(report))),
                    None => warn!(
                        "{}: the worker's plan cache entry cannot be read; analysing it in the daemon",
                        module.path
                    ),
                },
                Err(e) => warn!("{}: {e:#}; analysing it in the daemon", module.path),
            }
        }
        if let Some(((plan, entry), worker)) = found {
            return Ok(Analysed {
                module,
                plan,
                made: Made::Cached(Some(Box::new(entry))),
                id,
                fid_base: 0,
                outgrew: 0,
                key: None,
                worker,
            });
        }
    }
    let mut a = analyse_fresh(module, id)?;
    a.key = key;
    Ok(a)
}

/// A worker's side of [`analyse`] ([`super::worker`]): analyses `module`,
/// generates its clones for a provisional layout near it (the control
/// block in the low 2 GiB, where attaches put it) and stores them in the
/// plan cache under `key`. Returns the analysis and generation times
/// (ms).
pub(crate) fn prepare_entry(module: Module, id: u64, key: &str) -> anyhow::Result<(u64, u64)> {
    let cache = cache::get().context("no plan cache")?;
    let t0 = std::time::Instant::now();
    let mut a = analyse_fresh(module, id)?;
    let analysis_ms = t0.elapsed().as_millis() as u64;
    a.key = Some(key.to_owned());
    let (lo, hi) = a.module.range;
    let code = provisional_code(lo, hi, a.room());
    let g = match generate_at(a, PROVISIONAL_CONTROL, code, None)? {
        Ok(g) => g,
        Err(_) => bail!("the clones outgrew a room that had no bound"),
    };
    let generation_ms = t0.elapsed().as_millis() as u64 - analysis_ms;
    match cache.store(key, &g.stored())? {
        Some(_) => Ok((analysis_ms, generation_ms)),
        None => bail!(
            "the plan cache did not take the entry (clones that cannot be moved, or a directory others may write)"
        ),
    }
}

/// Where a worker's control block goes: in the low 2 GiB, like an
/// attach's (a control block high up is rare; clones made for a low one
/// cannot be moved there and are generated again by the attach).
const PROVISIONAL_CONTROL: u64 = 0x4000_0000;

/// Where a worker's clones of the module at `[lo, hi)` go: 64 MiB above
/// it, or below it when that would leave the user address space. An
/// attach's gap is near the module too: the move changes no field's form.
fn provisional_code(lo: u64, hi: u64, room: u64) -> u64 {
    const GAP: u64 = 64 << 20;
    let above = (hi + GAP).next_multiple_of(PAGE_SIZE);
    if above + room < 0x7fff_ffff_0000 {
        above
    } else {
        lo.saturating_sub(GAP + room) & !(PAGE_SIZE - 1)
    }
}

fn analyse_fresh(module: Module, id: u64) -> anyhow::Result<Analysed> {
    let data = module.bytes()?;
    let (report, analysis) = plan::analyze_with_insns(&data, &PlanOptions::default())
        .with_context(|| format!("analysing {}", module.path))?;
    let mut plan = report.plan;
    modules::name_from_debug_file(&mut plan, module.build_id.as_deref());
    let mut exclude: std::collections::BTreeMap<u64, &'static str> = unwind_info::untranslatable(
        &data,
        plan.functions.iter().filter_map(|f| match f.status {
            FunctionStatus::Analyzed(_) => Some(f.start),
            _ => None,
        }),
    )
    .into_iter()
    .map(|start| (start, "unwind info not restatable"))
    .collect();
    // The dynamic loader's `_dl_debug_state` is where debuggers put the
    // breakpoint that tells them of every dlopen/dlclose (`r_debug.r_brk`):
    // it must run at its own address, so it keeps no clone.
    for f in plan
        .functions
        .iter()
        .filter(|f| f.name == "_dl_debug_state")
    {
        exclude.insert(f.start, "debugger hook (r_brk)");
    }
    Ok(Analysed {
        id,
        module,
        plan,
        made: Made::Fresh {
            analysis,
            exclude,
            data,
        },
        fid_base: 0,
        outgrew: 0,
        key: None,
        worker: None,
    })
}

/// Generates `a`'s clones against the control block at `control`: at
/// `fixed` (a re-arm regenerates what an earlier attach wrote there), or
/// in a gap near the module that avoids `reserved` (and is added to it).
/// The gap is sized for a generous bound on the code (clones plus unwind
/// info run at 6-10x the original bytes); in the rare case the code
/// outgrows it, a second generation at a gap of the exact size follows.
fn generate(
    pid: Pid,
    a: Analysed,
    control: u64,
    fixed: Option<u64>,
    reserved: &mut Vec<(u64, u64)>,
) -> anyhow::Result<Generated> {
    let (lo, hi) = a.module.range;
    let mut code_len = a.room();
    let mut a = a;
    loop {
        let code = match fixed {
            Some(c) => c,
            None => inject::find_gap_near(pid, lo, hi, code_len, reserved)?,
        };
        match generate_at(a, control, code, fixed.is_none().then_some(code_len))? {
            Ok(g) => {
                if fixed.is_none() {
                    reserved.push((code, code + g.code_len));
                }
                return Ok(g);
            }
            Err(back) => {
                a = *back;
                code_len = a.outgrew;
                if code_len > 1 << 31 {
                    bail!(
                        "the clones of {} would take {code_len} bytes: too large to map near it",
                        a.module.path
                    );
                }
            }
        }
    }
}

/// Generates `a`'s clones at `code`; with `room`, gives `a` back (with
/// [`Analysed::outgrew`] set to the bytes needed) when they need more.
#[allow(clippy::type_complexity)]
fn generate_at(
    a: Analysed,
    control: u64,
    code: u64,
    room: Option<u64>,
) -> anyhow::Result<Result<Generated, Box<Analysed>>> {
    let layout = Layout {
        bias: a.module.bias,
        control,
        code,
        fid_base: a.fid_base,
    };
    let mut a = a;
    let (img, eh, exceptions, fdata, details, code_bytes, tables) = match &mut a.made {
        Made::Cached(c) => {
            let c = *c.take().context("cached clones moved twice")?;
            let from = c.img.layout.code;
            let tables = c.tables.moved(
                layout.bias.wrapping_sub(c.img.layout.bias),
                code.wrapping_sub(from),
            );
            // Every piece is moved once now, to see that every field fits
            // (or to analyse afresh), and again as it is written.
            let moved = c
                .img
                .relocate_lazily(&layout, c.bytes.len())
                .map_err(anyhow::Error::from)
                .and_then(|(img, mv)| {
                    moved_pieces(&c.bytes, &mv, |_, _| Ok(()))?;
                    Ok((img, mv))
                });
            match moved {
                Ok((img, mv)) => {
                    let mut eh = c.eh;
                    unwind_info::relocate_eh_frame(&mut eh, code.wrapping_sub(from))
                        .map_err(anyhow::Error::msg)?;
                    let code_bytes = CodeBytes::Cached {
                        bytes: c.bytes,
                        mv: Box::new(mv),
                    };
                    (
                        img,
                        eh,
                        c.exceptions,
                        c.fdata,
                        Some(c.details),
                        code_bytes,
                        Some(tables),
                    )
                }
                Err(e) => {
                    // Analysed as if it were not cached.
                    warn!("{}: {e}; analysing it again", a.module.path);
                    let fresh = analyse_fresh(a.module, a.id)?;
                    let a = Analysed {
                        fid_base: a.fid_base,
                        ..fresh
                    };
                    return generate_at(a, control, code, room);
                }
            }
        }
        Made::Fresh {
            analysis,
            exclude,
            data,
        } => {
            let img = codegen::generate_excluding(&a.plan, analysis, &layout, exclude)?;
            let eh = unwind_info::eh_frame(data, &img, a.module.bias)
                .map_err(anyhow::Error::msg)?
                .bytes;
            let exceptions = uses_exceptions(data, analysis);
            let fdata = FdataFacts::new(data, &a.plan, analysis);
            (img, eh, exceptions, fdata, None, CodeBytes::InImage, None)
        }
    };
    let code_size = code_bytes.len(&img);
    let need = code_len(code_size, &eh);
    if room.is_some_and(|r| need > r) {
        if matches!(a.made, Made::Cached(_)) {
            // The room was sized for them.
            bail!("the cached clones of {} need {need} bytes", a.module.path);
        }
        a.outgrew = need;
        return Ok(Err(Box::new(a)));
    }
    let eh_addr = code + ((code_size + 15) & !15);
    Ok(Ok(Generated {
        facts: ModuleFacts {
            path: a.module.path,
            is_exe: a.module.is_exe,
            plan: a.plan,
            bias: a.module.bias,
            range: a.module.range,
            ino: a.module.ino,
            fid_base: a.fid_base,
            fdata,
            details,
            details_failed: Default::default(),
            debug_file: (!a.module.is_exe)
                .then(|| modules::debug_file(a.module.build_id.as_deref()))
                .flatten(),
        },
        id: a.id,
        img,
        code,
        code_len: need,
        eh: (eh_addr, eh),
        exceptions,
        key: a.key,
        code_bytes,
        tables,
    }))
}

/// What an attach put into the target.
struct Injected {
    pid: Pid,
    exe: PathBuf,
    /// The executable first.
    modules: Vec<Generated>,
    /// Address of the control block in the target.
    control: u64,
    region: SharedRegion,
    signal: i32,
    old_action: KernelSigaction,
}

impl Injected {
    fn attached(self) -> Attached {
        let Injected {
            pid,
            exe,
            modules,
            control,
            region,
            signal,
            old_action,
        } = self;
        let baseline = region.target_counters();
        let base = control_tables_base(&region);
        let exe_range = modules[0].facts.range;
        let Extension {
            modules: facts,
            regions,
            pages,
            cloned,
            functions_rewritten,
            functions_skipped,
            activate: _,
        } = Extension::of(modules);
        let mut code = CodeMap::new(exe_range, cloned).with_libraries(
            facts
                .iter()
                .filter(|m| !m.is_exe)
                .map(|m| (m.name().to_owned(), m.range)),
        );
        code.add_clone_regions(regions.iter().map(|r| (r.range.start, r.range.end)));
        Attached {
            attachment: Attachment {
                pid,
                control_addr: control,
                region,
                signal,
                old_action,
                baseline,
                progress: Default::default(),
                pages,
                base,
                link_seen: 0,
                relink_due: true,
                forgets: 0,
            },
            exe,
            modules: facts,
            frames: CloneFrames { regions },
            functions_rewritten,
            functions_skipped,
            code,
        }
    }
}

impl ModuleFacts {
    /// The CFG and path numbering of function `local` (index in the
    /// plan), from the plan or, where the plan keeps none, from its plan
    /// cache entry; `None` where it has none (or its entry cannot be
    /// read: said once per module).
    pub(crate) fn path_details(&self, local: usize) -> Option<PathFacts<'_>> {
        if let Some((cfg, numbering)) = self.plan.details_of(local) {
            return Some(PathFacts {
                cfg: Cow::Borrowed(cfg),
                numbering: Cow::Borrowed(numbering),
            });
        }
        match self.details.as_ref()?.get(local) {
            Ok(d) => d.map(|d| PathFacts {
                cfg: Cow::Owned(d.cfg),
                numbering: Cow::Owned(d.numbering),
            }),
            Err(e) => {
                if !self.details_failed.swap(true, Ordering::Relaxed) {
                    warn!("{}: {e:#}; its paths are left out", self.path);
                }
                None
            }
        }
    }

    /// The file name.
    pub(crate) fn name(&self) -> &str {
        Path::new(&self.path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(&self.path)
    }
}

/// Our pid for `BurstControl::tracer`: as the target's pid namespace
/// sees it, which is ours only if we share it (0 otherwise: the target
/// cannot check on us).
fn tracer_as_seen_by(pid: Pid) -> u64 {
    let ns = |p: &str| std::fs::metadata(format!("/proc/{p}/ns/pid")).map(|m| m.ino());
    match (ns("self"), ns(&pid.to_string())) {
        (Ok(a), Ok(b)) if a == b => std::process::id().into(),
        _ => 0,
    }
}

/// The daemon named by a region's `tracer`, if it is another burstyd that
/// is still running.
fn live_tracer(tracer: u64) -> Option<u64> {
    let t = u32::try_from(tracer).ok().filter(|&t| t != 0)?;
    if t == std::process::id() || !crate::sys::process_running(Pid(t)) {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{t}/comm")).ok()?;
    comm.starts_with("burstyd").then_some(tracer)
}

/// Injects (or re-arms) the clones in `pid`: of its executable and, with
/// `opts.libraries`, of every shared library it has mapped.
/// With `held` the program is this thread's tracee, stopped at its entry
/// point ([`hold_command`]): every module is cloned in this one step (the
/// program waits anyway), and the stop is adopted rather than made.
pub(crate) fn attach(
    pid: Pid,
    opts: &BurstOptions,
    held: bool,
) -> anyhow::Result<(Attached, Option<Then>)> {
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let exe_file = std::fs::File::open(&exe)
        .with_context(|| format!("opening the executable of pid {pid} ({})", exe.display()))?;
    if inject::shadow_stack_enabled(pid) {
        bail!("pid {pid} runs with CET shadow stacks; bursty tracing cannot redirect its returns");
    }
    let t0 = std::time::Instant::now();

    // Where the modules are mapped. An executable removed or replaced on
    // disk since it started is still the mapped one: `/proc/PID/exe` and
    // the maps lines then end in " (deleted)", which the paths compared
    // here lack.
    let maps = inject::maps(pid)?;
    let exe_link = std::fs::read_link(&exe).unwrap_or_default();
    let exe_link = exe_link.to_string_lossy();
    let exe_path = exe_link.strip_suffix(" (deleted)").unwrap_or(&exe_link);
    let mut analysed = Vec::new();
    let mut fid_base = 0u32;
    // The executable now; its libraries in a second step
    // ([`add_libraries`]), so that a short program is traced from early on.
    // Each module on a thread of its own (held, the libraries too).
    let mut mapped = modules::mapped_modules(
        pid,
        &maps,
        exe_path,
        exe_file,
        held && opts.libraries == Libraries::All,
    )?;
    cap_modules(pid, &mut mapped, 0);
    // The executable's id: the hash of its bytes.
    let id = mapped[0].hash;
    let names: Vec<(bool, String)> = mapped.iter().map(|m| (m.is_exe, m.path.clone())).collect();
    for ((is_exe, path), result) in names.into_iter().zip(super::parallel::map(mapped, analyse)) {
        match result {
            Ok(mut a) => {
                if !a.take_fids(&mut fid_base) {
                    bail!("too many functions to number");
                }
                analysed.push(a);
            }
            Err(e) if is_exe => return Err(e),
            Err(e) => warn!(%pid, "{path} is not cloned: {e:#}"),
        }
    }
    let analysis_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cached = cached_note(&analysed);

    // An earlier attach's region, if it was made for this file (a memfd's
    // maps line says " (deleted)"; the path here is without it). Its
    // control block is the mapping at offset 0.
    let memfd = format!("/memfd:{MEMFD_NAME}");
    if let Some(m) = maps
        .iter()
        .find(|m| m.offset == 0 && m.path.as_deref().is_some_and(|p| p.starts_with(&memfd)))
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
            .context("opening the existing burst region")?;
        // SAFETY: shared memory with the target; we only access it
        // through volatile/atomic reads and writes of plain integers.
        let shm = unsafe { memmap2::MmapMut::map_mut(&f)? };
        let cb = shm.as_ptr() as *const BurstControl;
        // SAFETY: the mapping is at least a page, BurstControl fits.
        let (magic, old_id) = unsafe { ((*cb).magic, (*cb).exe_id) };
        if magic == CONTROL_MAGIC && old_id == id {
            // SAFETY: as above.
            let (made_for, tracer) = unsafe { ((*cb).made_for, (*cb).tracer) };
            if made_for != u64::from(pid.0) {
                bail!(
                    "pid {pid} inherited its burst region through fork from pid {made_for}, which it still shares with it; tracing it in bursts would mix the two"
                );
            }
            if let Some(other) = live_tracer(tracer) {
                bail!(
                    "pid {pid} is already traced in bursts by another burstyd (pid {other}); one tracer per process"
                );
            }
            let attached = rearm(pid, exe, analysed, m.start, SharedRegion::new(shm), opts)?;
            let entries = {
                let cb = attached.attachment.region.control();
                cb.modules[..(cb.n_modules as usize).min(MAX_MODULES)].to_vec()
            };
            let pending = (opts.libraries != Libraries::None).then(|| Pending {
                control: m.start,
                exe_path: exe_path.to_owned(),
                tables: 0,
                next_fid: 0,
                rearm: Some(entries),
                rooms: Rooms::default(),
            });
            return Ok((attached, pending.map(Then::Libraries)));
        }
        if magic != CONTROL_MAGIC {
            bail!(
                "pid {pid} already holds a burst region made by another version of burstyd; restart it to trace it again"
            );
        }
        bail!(
            "pid {pid} already holds a burst region for another executable (from an earlier burstyd); restart it to trace it again"
        );
    }

    check_glibc(pid)?;
    let ring_words = if opts.full_trace {
        RING_WORDS_FULL
    } else {
        RING_WORDS
    };
    let shm_len = CONTROL_BYTES as u64 + ring_words * 8;

    // Everything that takes time happens before the process is stopped:
    // pick the addresses, generate the clones and their unwind info for
    // them. Only the mappings, the writes and the handler installation
    // stop the target. The control block goes into the low 2 GiB, where
    // the clones of every module reach it with absolute operands; without
    // room there, next to the executable, whose clones alone then reach it.
    let control = match inject::find_low_gap(pid, CONTROL_BYTES as u64, LOW_STATE_LIMIT, &[])? {
        Some(c) => c,
        None => {
            if analysed.len() > 1 {
                warn!(%pid, "no room for the burst state in the low 2 GiB: only the executable is cloned");
                analysed.truncate(1);
            }
            let (lo, hi) = analysed[0].module.range;
            inject::find_gap_near(pid, lo, hi, CONTROL_BYTES as u64, &[])?
        }
    };
    let register_frame = register_frame_fn(pid, &maps, &analysed[0].plan, analysed[0].module.bias);
    let mut reserved = vec![(control, control + CONTROL_BYTES as u64)];
    let mut gens: Vec<Generated> = Vec::new();
    // Gaps first (in turn: each avoids the ones before), then each
    // module's code on a thread of its own; one that outgrew its gap is
    // generated again, in turn, at a gap of its exact size.
    let mut placed = Vec::new();
    for a in analysed {
        let (is_exe, path) = (a.module.is_exe, a.module.path.clone());
        let len = a.room();
        let (lo, hi) = a.module.range;
        match inject::find_gap_near(pid, lo, hi, len, &reserved) {
            Ok(code) => {
                reserved.push((code, code + len));
                placed.push((a, code, len));
            }
            Err(e) if is_exe => return Err(e.into()),
            Err(e) => warn!(%pid, "{path} is not cloned: {e:#}"),
        }
    }
    let names: Vec<(bool, String)> = placed
        .iter()
        .map(|(a, _, _)| (a.module.is_exe, a.module.path.clone()))
        .collect();
    let generated = super::parallel::map(placed, |(a, code, len)| {
        generate_at(a, control, code, Some(len))
    });
    for ((is_exe, path), result) in names.into_iter().zip(generated) {
        let result = match result {
            Ok(Err(a)) => generate(pid, *a, control, None, &mut reserved),
            Ok(Ok(g)) => Ok(g),
            Err(e) => Err(e),
        };
        match result {
            Ok(g) => gens.push(g),
            Err(e) if is_exe => return Err(e),
            Err(e) => warn!(%pid, "{path} is not cloned: {e:#}"),
        }
    }
    let tables = Merged::new(gens.iter().map(Generated::tables).collect());
    let tables_len = tables.len_bytes().next_multiple_of(PAGE_SIZE);

    let generation_ms = t0.elapsed().as_secs_f64() * 1e3 - analysis_ms;
    let mut t = if held {
        Tracee::adopt(pid).context("taking over the held command")?
    } else {
        Tracee::attach(pid).context("stopping the target with ptrace")?
    };
    let stopped = std::time::Instant::now();
    for &tid in t.threads() {
        if t.regs(tid).fs_base == 0 {
            bail!("thread {tid} of pid {pid} has no TLS (fs base 0); cannot trace it in bursts");
        }
    }
    let signal = inject::free_signal(pid)?;
    // Room for the libraries' clones and the tables of all modules, mapped
    // in this stop (untouched pages cost nothing) and filled by the second
    // step through /proc/PID/mem without stopping the program again: a
    // ptrace stop cuts short a `getrandom` or a pipe `read` under way.
    // Sought now, while the address space holds still: the gap below a
    // library is where the program's next mmap goes.
    let rooms = if opts.libraries == Libraries::All && !held {
        let maps = inject::maps(pid)?;
        library_rooms(pid, &maps, exe_path, tables.len_bytes(), &mut reserved)
    } else {
        Rooms::default()
    };
    // Ask the target's seccomp filters about every call below before
    // making the first: a filter that kills on one must not see any.
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let shared = libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | libc::MAP_POPULATE;
    // Over our own fresh mapping, so MAP_FIXED replaces nothing else.
    let local = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    let local_addr = control + LOCAL_OFFSET as u64;
    let ring_bytes = ring_words * 8;
    let calls = vec![
        (libc::SYS_memfd_create, vec![0, libc::MFD_CLOEXEC as u64]),
        (libc::SYS_ftruncate, vec![0, shm_len]),
        (
            libc::SYS_mmap,
            vec![
                control,
                CONTROL_BYTES as u64,
                rw as u64,
                shared as u64,
                0,
                0,
            ],
        ),
        (
            libc::SYS_mmap,
            vec![
                local_addr,
                LOCAL_BYTES as u64,
                rw as u64,
                local as u64,
                u64::MAX,
                0,
            ],
        ),
        (
            libc::SYS_madvise,
            vec![local_addr, LOCAL_BYTES as u64, libc::MADV_WIPEONFORK as u64],
        ),
        (
            libc::SYS_mmap,
            vec![
                0,
                ring_bytes,
                rw as u64,
                libc::MAP_SHARED as u64,
                0,
                CONTROL_BYTES as u64,
            ],
        ),
        (libc::SYS_close, vec![0]),
        (libc::SYS_rt_sigaction, vec![signal as u64, 0, 0, 8]),
    ];
    for (nr, args) in calls {
        t.check_syscall(nr, &args)?;
    }
    place_checks(&mut t, &gens, tables_len)?;
    rooms.checks(&mut t)?;
    if opts.full_trace {
        // What the runtime itself calls while a full ring waits.
        t.check_syscall(libc::SYS_sched_yield, &[])?;
        t.check_syscall(libc::SYS_kill, &[tracer_as_seen_by(pid), 0])?;
    }
    // Every mapping at an address of our choosing first: anything the
    // kernel places (the tables, the ring, even the page memfd_create's
    // name is passed in) goes where the next mmap would, which may be a
    // gap picked here.
    let mut rooms = rooms;
    rooms.map_fixed(&mut t, pid);
    let (tables_at, exe_eh) = place(&mut t, pid, &gens, &tables, tables_len, register_frame)?;
    let rooms = rooms.map_tables(&mut t)?;
    let fd = t.memfd_create(MEMFD_NAME, libc::MFD_CLOEXEC)?;
    t.syscall(libc::SYS_ftruncate, &[fd as u64, shm_len])?;
    // MAP_FIXED_NOREPLACE: if the program mapped something into the
    // gap since we looked, this fails cleanly and nothing is replaced.
    // Populated: the eBPF program reads `armed`/`active` with
    // bpf_probe_read_user, which cannot fault a page in.
    t.mmap(control, CONTROL_BYTES as u64, rw, shared, fd, 0).context(
        "mapping the burst control block (the address space changed while the clones were generated?)",
    )?;
    // The burst's own state is private to the process and reads as
    // zeros in a forked child (see `BurstLocal`).
    t.mmap(local_addr, LOCAL_BYTES as u64, rw, local, -1, 0)
        .context("mapping the private burst state")?;
    t.syscall(
        libc::SYS_madvise,
        &[local_addr, LOCAL_BYTES as u64, libc::MADV_WIPEONFORK as u64],
    )
    .context("madvise(MADV_WIPEONFORK) on the private burst state")?;
    t.write_memory(
        local_addr + offset_of!(BurstLocal, present) as u64,
        &1u64.to_ne_bytes(),
    )?;
    // The clones, their unwind info and the lookup tables (fixed
    // addresses first: the kernel's choices below must not take them).
    // The record ring is reached through a pointer in the control block:
    // anywhere the kernel puts it.
    let ring_at = t
        .mmap(
            0,
            ring_bytes,
            rw,
            libc::MAP_SHARED,
            fd,
            CONTROL_BYTES as u64,
        )
        .context("mapping the record ring")?;
    let shm_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .context("opening the burst memfd")?;
    t.close(fd)?;
    // SAFETY: as above.
    let mut region = SharedRegion::new(unsafe { memmap2::MmapMut::map_mut(&shm_file)? });
    {
        let cb = region.control_mut();
        cb.magic = CONTROL_MAGIC;
        // MAX_SLOTS sub-rings, one per burst slot.
        cb.ring_mask = ring_words / MAX_SLOTS as u64 - 1;
        cb.ring_addr = ring_at;
        cb.tables = tables_at;
        cb.tables_base = tables_at;
        cb.clone_lo = gens[0].img.code_range.0;
        cb.clone_hi = gens[0].img.code_range.1;
        cb.handler = gens[0].img.handler;
        cb.restorer = gens[0].img.restorer;
        cb.signal = signal as u64;
        cb.exe_id = id;
        cb.eh_frame = exe_eh;
        cb.made_for = pid.0.into();
        cb.tracer = tracer_as_seen_by(pid);
    }
    region.add_modules(gens.iter().map(Generated::entry));
    let (handler, restorer) = (gens[0].img.handler, gens[0].img.restorer);
    let old_action = install_handler(&mut t, signal, handler, restorer)?;
    set_run_options(&mut region, opts);
    // Held: it goes once the session has armed the eBPF side (the attach
    // thread detaches it then), so that its first instructions can take
    // bursts.
    let still_held = if held {
        Some(t)
    } else {
        t.detach()?;
        None
    };
    let stopped_ms = stopped.elapsed().as_secs_f64() * 1e3;
    let rewritten: usize = gens.iter().map(|g| g.img.cloned_functions()).sum();
    let skipped: usize = gens
        .iter()
        .map(|g| {
            g.img.skipped.values().sum::<usize>()
                + g.facts.plan.summary.skipped.values().sum::<usize>()
        })
        .sum();
    let kib = gens.iter().map(Generated::code_bytes_len).sum::<u64>() / 1024;
    let eh_kib = gens.iter().map(|g| g.eh.1.len() as u64).sum::<u64>() / 1024;
    let names: Vec<&str> = gens.iter().map(|g| g.facts.name()).collect();
    let stop = if held {
        format!(
            "the command held at its entry point for {:.0} ms",
            t0.elapsed().as_secs_f64() * 1e3
        )
    } else {
        format!("target stopped {stopped_ms:.1} ms")
    };
    info!(
        %pid,
        "bursty tracing: {rewritten} functions rewritten ({skipped} skipped) in {} module(s) ({}), {kib} KiB of clones and {eh_kib} KiB of their unwind info, signal {signal}; analysis {analysis_ms:.0} ms, generation {generation_ms:.0} ms{cached}, {stop}",
        gens.len(),
        names.join(", "),
    );
    remember(&mut gens);
    let then = match still_held {
        Some(t) => Some(Then::Release(t)),
        None => (opts.libraries == Libraries::All).then(|| {
            Then::Libraries(Pending {
                control,
                exe_path: exe_path.to_owned(),
                tables: tables_at,
                next_fid: fid_base,
                rearm: None,
                rooms,
            })
        }),
    };
    Ok((
        Injected {
            pid,
            exe,
            modules: gens,
            control,
            region,
            signal,
            old_action,
        }
        .attached(),
        then,
    ))
}

/// What the attach thread does after the first step of an attach.
pub(crate) enum Then {
    /// The second step: the libraries ([`add_libraries`]).
    Libraries(Pending),
    /// Let the held command go (every module is cloned): detach this
    /// stop once the session has armed bursts for it.
    Release(Tracee),
}

/// What the second step of an attach ([`add_libraries`]) needs from the
/// first.
pub(crate) struct Pending {
    /// The control block.
    control: u64,
    /// The executable's maps path (not a library).
    exe_path: String,
    /// The header of the lookup tables in the target now (the first
    /// step's).
    tables: u64,
    /// The first `fid` the libraries may use.
    next_fid: u32,
    /// Modules an earlier attach injected (a re-arm): regenerated at
    /// their addresses, nothing mapped.
    rearm: Option<Vec<ModuleEntry>>,
    /// Where the libraries' clones and the merged tables go.
    rooms: Rooms,
}

/// Address space mapped in the first stop for the second step: per
/// library `(path, lowest mapped address, at, len)` near it, and one
/// `(at, len)` for the tables.
#[derive(Default)]
pub(crate) struct Rooms {
    libraries: Vec<(String, u64, u64, u64)>,
    tables: (u64, u64),
}

/// Bytes of room for a module's clones and unwind info, from its
/// original code bytes: a generous bound (clones run at 6-10x the
/// original bytes), used for the executable's gap and the libraries'
/// rooms alike.
fn code_room(exec: u64) -> u64 {
    (32 * exec + (2 << 20))
        .min(256 << 20)
        .next_multiple_of(PAGE_SIZE)
}

/// Rooms near each library mapped in `pid` (but the executable) and for the tables of all modules: at most one entry
/// per instruction byte, function byte, and two bytes of calls, 16 bytes
/// each. Gaps are found without analysing anything; a library without
/// room is left out (logged).
fn library_rooms(
    pid: Pid,
    maps: &[inject::MapEntry],
    exe_path: &str,
    exe_tables_len: u64,
    reserved: &mut Vec<(u64, u64)>,
) -> Rooms {
    let mut rooms = Rooms::default();
    let mut exec_total = 0;
    for p in modules::library_paths(maps, exe_path) {
        let own = maps.iter().filter(|x| x.is_path(p));
        let (lo, hi) = own.clone().fold((u64::MAX, 0), |(lo, hi), x| {
            (lo.min(x.start), hi.max(x.end))
        });
        let exec: u64 = own.filter(|x| x.is_exec()).map(|x| x.end - x.start).sum();
        let len = code_room(exec);
        match inject::find_gap_near(pid, lo, hi, len, reserved) {
            Ok(at) => {
                reserved.push((at, at + len));
                rooms.libraries.push((p.to_owned(), lo, at, len));
                exec_total += exec;
            }
            Err(e) if crate::sys::process_running(pid) => warn!(%pid, "{p} is not cloned: {e}"),
            Err(_) => return Rooms::default(),
        }
    }
    if !rooms.libraries.is_empty() {
        let len = (exe_tables_len + 40 * exec_total + 4096).next_multiple_of(PAGE_SIZE);
        rooms.tables = (0, len);
    }
    rooms
}

impl Rooms {
    /// Asks the target's seccomp filters about [`Self::map`]'s calls.
    fn checks(&self, t: &mut Tracee) -> anyhow::Result<()> {
        for &(_, _, at, len) in &self.libraries {
            t.check_syscall(
                libc::SYS_mmap,
                &[at, len, RX as u64, CODE_FLAGS as u64, u64::MAX, 0],
            )?;
        }
        if self.tables.1 > 0 {
            t.check_syscall(
                libc::SYS_mmap,
                &[
                    0,
                    self.tables.1,
                    libc::PROT_READ as u64,
                    TABLE_FLAGS as u64,
                    u64::MAX,
                    0,
                ],
            )?;
        }
        Ok(())
    }

    /// Maps the libraries' rooms (under ptrace; before any mapping the
    /// kernel places, which could take their gaps); a library whose room
    /// cannot be mapped is left out.
    fn map_fixed(&mut self, t: &mut Tracee, pid: Pid) {
        self.libraries.retain(|(path, _, at, len)| {
            match t.mmap(*at, *len, RX, CODE_FLAGS, -1, 0) {
                Ok(_) => true,
                Err(e) => {
                    warn!(%pid, "{path} is not cloned: mapping room for its clones at {at:#x}..{:#x}: {e}", at + len);
                    false
                }
            }
        });
    }

    /// Maps the tables' room, where the kernel puts it (after every fixed
    /// mapping).
    fn map_tables(mut self, t: &mut Tracee) -> anyhow::Result<Rooms> {
        if self.tables.1 > 0 && !self.libraries.is_empty() {
            self.tables.0 = t
                .mmap(0, self.tables.1, libc::PROT_READ, TABLE_FLAGS, -1, 0)
                .context("mapping room for the lookup tables")?;
        } else {
            self.libraries.clear();
        }
        Ok(self)
    }
}

/// The shared libraries' clones, added to a running attachment.
pub(crate) struct Extension {
    pub(crate) modules: Vec<ModuleFacts>,
    pub(crate) regions: Vec<CloneRegion>,
    /// Pages of original code with a rewritten instruction.
    pub(crate) pages: Vec<u64>,
    /// `[start, end)` AVMAs of the cloned functions.
    pub(crate) cloned: Vec<(u64, u64)>,
    pub(crate) functions_rewritten: usize,
    pub(crate) functions_skipped: usize,
    /// The merged tables' header and the modules' directory entries, for
    /// [`Attachment::activate`] once the session knows the new functions
    /// (a record of theirs drained before would be taken for a bad one);
    /// `None` for a re-arm (in place already).
    pub(crate) activate: Option<(u64, Vec<ModuleEntry>)>,
}

/// The second step of an attach: every shared library mapped in `pid`
/// (but the dynamic loader) is analysed and cloned near itself with
/// `fid`s after the executable's; a short ptrace stop maps and writes the
/// clones and the merged lookup tables, then one store into the control
/// block (`tables`) puts them in use while the program runs (a lookup
/// under way finishes on the old tables, which stay mapped). From then
/// on calls from a burst into a library, and returns from it, stay in the
/// burst. `None` when there is nothing to add.
/// Gives up (`None`) once `cancel` is set: the session is ending.
pub(crate) fn add_libraries(
    pid: Pid,
    pending: Pending,
    cancel: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Option<Extension>> {
    let cancelled = || cancel.load(Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    let maps = inject::maps(pid)?;
    let mut all = modules::mapped_libraries(pid, &maps, &pending.exe_path);
    cap_modules(pid, &mut all, 1);
    if all.is_empty() {
        return Ok(None);
    }
    let mut fid_base = pending.next_fid;
    let mut gens = Vec::new();
    let mut from_cache = 0;
    for module in all {
        if cancelled() {
            return Ok(None);
        }
        let path = module.path.clone();
        let a = match analyse(module) {
            Ok(mut a) => {
                if !a.take_fids(&mut fid_base) {
                    warn!(%pid, "{path} is not cloned: too many functions to number");
                    continue;
                }
                a
            }
            Err(e) => {
                warn!(%pid, "{path} is not cloned: {e:#}");
                continue;
            }
        };
        if cancelled() {
            return Ok(None);
        }
        from_cache += usize::from(a.cached_before());
        if let Some(entries) = &pending.rearm {
            // Re-armed: what an earlier attach wrote is in place.
            let Some(e) = entries
                .iter()
                .find(|e| e.id == a.id && e.bias == a.module.bias)
            else {
                continue;
            };
            let mut a = a;
            a.fid_base = e.fid_base as u32;
            match generate(pid, a, pending.control, Some(e.code), &mut Vec::new()) {
                Ok(g) => gens.push(g),
                Err(e) => warn!(%pid, "{path} is not re-armed: {e:#}"),
            }
            continue;
        }
        let Some(&(_, _, at, len)) = pending
            .rooms
            .libraries
            .iter()
            .find(|r| r.0 == a.module.path && r.1 == a.module.range.0)
        else {
            continue; // mapped after the first step
        };
        match generate(pid, a, pending.control, Some(at), &mut Vec::new()) {
            Ok(g) if g.code_len <= len => gens.push(g),
            Ok(g) => {
                warn!(%pid, "{path} is not cloned: its clones need {} bytes, {len} were set aside", g.code_len)
            }
            Err(e) => warn!(%pid, "{path} is not cloned: {e:#}"),
        }
    }
    if gens.is_empty() || cancelled() {
        return Ok(None);
    }
    let prepared_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut activate = None;
    if pending.rearm.is_none() {
        let current = FileTables::in_process(pid, pending.tables)?;
        let tables = Merged::new(
            std::iter::once(&current as &dyn TableSource)
                .chain(gens.iter().map(Generated::tables))
                .collect(),
        );
        let (tables_at, room) = pending.rooms.tables;
        let need = tables.len_bytes();
        if need > room {
            bail!("the lookup tables need {need} bytes, {room} were set aside");
        }
        write_unused(pid, &gens, &tables, tables_at)?;
        activate = Some((tables_at, gens.iter().map(Generated::entry).collect()));
    }
    remember(&mut gens);
    let names: Vec<&str> = gens.iter().map(|g| g.facts.name()).collect();
    let n = gens.len();
    let names = names.join(", ");
    let mut ext = Extension::of(gens);
    ext.activate = activate;
    info!(
        %pid,
        "bursty tracing: {} functions of {n} librar{} ({names}) rewritten ({} skipped); analysis and generation {prepared_ms:.0} ms{}, added without stopping the program",
        ext.functions_rewritten,
        if n == 1 { "y" } else { "ies" },
        ext.functions_skipped,
        from_cache_note(from_cache),
    );
    Ok(Some(ext))
}

impl Extension {
    /// What the daemon keeps of generated modules.
    fn of(gens: Vec<Generated>) -> Extension {
        // (Each table is sorted: its pages come in order, so only the
        // pages are collected, not an entry per instruction.)
        let mut pages: Vec<u64> = Vec::new();
        for g in &gens {
            for (orig, _) in g.tables().pairs(0) {
                let page = orig >> CLONE_PAGE_SHIFT;
                if pages.last() != Some(&page) {
                    pages.push(page);
                }
            }
        }
        pages.sort_unstable();
        pages.dedup();
        let cloned = gens
            .iter()
            .flat_map(|g| {
                g.img.functions.iter().map(|f| {
                    let len = f
                        .plt_stub_len()
                        .unwrap_or(g.facts.plan.functions[f.fid() as usize].size);
                    (f.orig(), f.orig() + len)
                })
            })
            .collect();
        let functions_rewritten = gens.iter().map(|g| g.img.cloned_functions()).sum();
        let functions_skipped = gens
            .iter()
            .map(|g| {
                g.img.skipped.values().sum::<usize>()
                    + g.facts.plan.summary.skipped.values().sum::<usize>()
            })
            .sum();
        let mut regions = Vec::new();
        let mut modules = Vec::new();
        for g in gens {
            regions.push(CloneRegion {
                range: g.img.code_range.0..g.img.code_range.1,
                eh_frame: g.eh.1.into(),
                eh_frame_addr: g.eh.0,
                map: g.img.reverse,
            });
            modules.push(g.facts);
        }
        Extension {
            modules,
            regions,
            pages,
            cloned,
            functions_rewritten,
            functions_skipped,
            activate: None,
        }
    }
}

/// The header the daemon last wrote, as the control block records it (an
/// earlier attach's, for a re-arm).
fn control_tables_base(region: &SharedRegion) -> u64 {
    let cb = region.control();
    match cb.tables_base {
        0 => cb.tables & burstyd_common::burst::TABLES_HEADER_MASK,
        b => b,
    }
}

/// Leaves out the modules beyond what the control block's directory can
/// record after `before` others (a relink checks only what it records:
/// an unloaded module it did not record would keep its table entries).
fn cap_modules(pid: Pid, modules: &mut Vec<Module>, before: usize) {
    let room = MAX_MODULES.saturating_sub(before);
    if modules.len() > room {
        for m in &modules[room..] {
            warn!(%pid, "{} is not cloned: the module directory is full ({MAX_MODULES} modules)", m.path);
        }
        modules.truncate(room);
    }
}

/// Libraries mapped after the attach (`dlopen`), to be cloned and added
/// ([`add_loaded`]).
#[derive(Debug)]
pub(crate) struct LoadRequest {
    pub(crate) pid: Pid,
    control: u64,
    exe_path: String,
    /// The first `fid` they may use.
    next_fid: u32,
    /// The tables in the target now, to merge theirs with.
    base: u64,
    /// [`Attachment::forgets`] when asked: if it moved by the time the
    /// clones are ready, the tables merged here are stale.
    pub(crate) forgets: u64,
    pub(crate) libraries: Vec<super::linkmap::Loaded>,
}

/// Clones libraries mapped since the attach (`dlopen`): each is analysed
/// and generated for a gap near it while the program runs, then a short
/// ptrace stop maps room for their clones and for the lookup tables of
/// every module (the target's current ones, masked entries left out, with
/// theirs), which are written through `/proc/PID/mem` once it runs again,
/// as the second step of an attach does. The session puts them in use
/// ([`Attachment::activate`]). `None` when none could be cloned.
pub(crate) fn add_loaded(req: &LoadRequest) -> anyhow::Result<Option<Extension>> {
    let pid = req.pid;
    let t0 = std::time::Instant::now();
    let maps = inject::maps(pid)?;
    let mut fid_base = req.next_fid;
    let mut gens = Vec::new();
    let mut reserved = Vec::new();
    let mut from_cache = 0;
    for module in modules::mapped_libraries(pid, &maps, &req.exe_path) {
        if !req
            .libraries
            .iter()
            .any(|l| l.path == module.path && l.lo == module.range.0 && l.ino == module.ino)
        {
            continue;
        }
        let path = module.path.clone();
        let mut a = match analyse(module) {
            Ok(a) => a,
            Err(e) => {
                warn!(%pid, "{path} (loaded since the attach) is not cloned: {e:#}");
                continue;
            }
        };
        if !a.take_fids(&mut fid_base) {
            warn!(%pid, "{path} is not cloned: too many functions to number");
            continue;
        }
        from_cache += usize::from(a.cached_before());
        match generate(pid, a, req.control, None, &mut reserved) {
            Ok(g) => gens.push(g),
            Err(e) => warn!(%pid, "{path} (loaded since the attach) is not cloned: {e:#}"),
        }
    }
    if gens.is_empty() {
        return Ok(None);
    }
    let current = FileTables::in_process(pid, req.base)?;
    let tables = Merged::new(
        std::iter::once(&current as &dyn TableSource)
            .chain(gens.iter().map(Generated::tables))
            .collect(),
    );
    let tables_len = tables.len_bytes().next_multiple_of(PAGE_SIZE);
    let prepared_ms = t0.elapsed().as_secs_f64() * 1e3;
    // The stop only maps (a ptrace stop can cut a system call under way
    // short: as short as it can be); the bytes go in after it.
    let mut t = Tracee::attach(pid).context("stopping the target with ptrace")?;
    let stopped = std::time::Instant::now();
    place_checks(&mut t, &gens, tables_len)?;
    for g in &gens {
        t.mmap(g.code, g.code_len, RX, CODE_FLAGS, -1, 0)
            .with_context(|| format!("mapping the clone code of {}", g.facts.path))?;
    }
    let tables_at = t
        .mmap(0, tables_len, libc::PROT_READ, TABLE_FLAGS, -1, 0)
        .context("mapping the lookup tables")?;
    t.detach()?;
    let stopped_ms = stopped.elapsed().as_secs_f64() * 1e3;
    write_unused(pid, &gens, &tables, tables_at)?;
    remember(&mut gens);
    let entries = gens.iter().map(Generated::entry).collect();
    let names: Vec<String> = gens.iter().map(|g| g.facts.name().to_owned()).collect();
    let mut ext = Extension::of(gens);
    ext.activate = Some((tables_at, entries));
    info!(
        %pid,
        "bursty tracing: {} functions of {} ({}) loaded since the attach rewritten ({} skipped); analysis and generation {prepared_ms:.0} ms{}, target stopped {stopped_ms:.1} ms",
        ext.functions_rewritten,
        if names.len() == 1 { "a library" } else { "libraries" },
        names.join(", "),
        ext.functions_skipped,
        from_cache_note(from_cache),
    );
    Ok(Some(ext))
}

/// `" (N of M modules from the plan cache)"`, or nothing when none was;
/// then what worker processes made, if any ([`worker_note`]).
fn cached_note(analysed: &[Analysed]) -> String {
    let n = analysed.iter().filter(|a| a.cached_before()).count();
    let workers = worker_note(analysed);
    if n == 0 {
        return workers;
    }
    format!(
        " ({n} of {} modules from the plan cache){workers}",
        analysed.len()
    )
}

/// `" (N analysed in worker processes; their peak RSS up to X MB)"`, or
/// nothing.
fn worker_note(analysed: &[Analysed]) -> String {
    let reports: Vec<&worker::Report> = analysed.iter().filter_map(|a| a.worker.as_ref()).collect();
    let Some(peak) = reports.iter().map(|r| r.peak_rss_bytes).max() else {
        return String::new();
    };
    format!(
        " ({} analysed in worker processes; their peak RSS up to {:.1} MB)",
        reports.len(),
        peak as f64 / 1e6
    )
}

/// `" (N from the plan cache)"`, or nothing for none.
fn from_cache_note(n: usize) -> String {
    if n == 0 {
        return String::new();
    }
    format!(" ({n} from the plan cache)")
}

/// Stores the modules generated now in the plan cache (once the program
/// runs with them: the next attach to the same files moves these). A
/// module stored keeps its CFGs and path numberings in its entry only.
fn remember(gens: &mut [Generated]) {
    let Some(cache) = cache::get() else {
        return;
    };
    for g in gens {
        let Some(key) = &g.key else {
            continue;
        };
        let t0 = std::time::Instant::now();
        match cache.store(key, &g.stored()) {
            Ok(details) => {
                debug!(
                    "{} stored in the plan cache in {:.0} ms",
                    g.facts.path,
                    t0.elapsed().as_secs_f64() * 1e3
                );
                if let Some(d) = details {
                    drop(g.facts.plan.take_details());
                    g.facts.details = Some(d);
                }
            }
            Err(e) => warn!("{} is not stored in the plan cache: {e:#}", g.facts.path),
        }
    }
}

/// Writes clones and lookup tables through `/proc/PID/mem` while the
/// program runs: nothing points at these bytes until the session puts the
/// tables in use.
fn write_unused(
    pid: Pid,
    gens: &[Generated],
    tables: &Merged<'_>,
    tables_at: u64,
) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .context("opening the target's memory")?;
    let write = |at: u64, bytes: &[u8]| {
        mem.write_all_at(bytes, at)
            .with_context(|| format!("writing {} bytes at {at:#x} in pid {pid}", bytes.len()))
    };
    for g in gens {
        g.write_code(write)?;
        write(g.eh.0, &g.eh.1)?;
    }
    tables.write(tables_at, write)
}

/// Protections and flags of the clone code and table mappings.
const RX: i32 = libc::PROT_READ | libc::PROT_EXEC;
const CODE_FLAGS: i32 = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
const TABLE_FLAGS: i32 = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;

/// Asks the target's seccomp filters about the calls [`place`] makes.
fn place_checks(t: &mut Tracee, gens: &[Generated], tables_len: u64) -> anyhow::Result<()> {
    for g in gens {
        t.check_syscall(
            libc::SYS_mmap,
            &[
                g.code,
                g.code_len,
                RX as u64,
                CODE_FLAGS as u64,
                u64::MAX,
                0,
            ],
        )?;
    }
    t.check_syscall(
        libc::SYS_mmap,
        &[
            0,
            tables_len,
            libc::PROT_READ as u64,
            TABLE_FLAGS as u64,
            u64::MAX,
            0,
        ],
    )?;
    Ok(())
}

/// Under ptrace: maps and writes each module's clones and unwind info at
/// their addresses, registers the unwind info with the target's unwinder
/// (`register_frame`), and maps the lookup `tables` anywhere. Returns the
/// tables' header address and the executable's registered `.eh_frame`
/// (0 if none). Fixed addresses first: the kernel's choice for the tables
/// must not take them.
fn place(
    t: &mut Tracee,
    pid: Pid,
    gens: &[Generated],
    tables: &Merged<'_>,
    tables_len: u64,
    register_frame: Option<u64>,
) -> anyhow::Result<(u64, u64)> {
    for g in gens {
        t.mmap(g.code, g.code_len, RX, CODE_FLAGS, -1, 0)
            .with_context(|| format!("mapping the clone code of {}", g.facts.path))?;
    }
    let tables_at = t
        .mmap(0, tables_len, libc::PROT_READ, TABLE_FLAGS, -1, 0)
        .context("mapping the lookup tables")?;
    tables.write(tables_at, |at, b| Ok(t.write_memory(at, b)?))?;
    let mut exe_eh = 0;
    for g in gens {
        g.write_code(|at, b| Ok(t.write_memory(at, b)?))?;
        t.write_memory(g.eh.0, &g.eh.1)?;
        // Register the clones' unwind info with the target's unwinder, so
        // that backtraces from signal frames pass through clone frames.
        let registered = match register_frame {
            Some(f) => match t.call(f, &[g.eh.0]) {
                Ok(_) => true,
                Err(e) => {
                    warn!(%pid, "registering the unwind info of the clones of {} failed: {e}", g.facts.path);
                    false
                }
            },
            None => false,
        };
        // Not fatal: calls in clones push original return addresses, so
        // an exception thrown in a burst unwinds through original frames
        // only (the unwinder starts in its own frame, whose return
        // address is original too). The clones' FDEs matter only to an
        // unwinder starting at a clone pc: from a signal frame
        // (asynchronous cancellation, -fnon-call-exceptions) or a
        // debugger's backtrace.
        if g.exceptions && !registered {
            debug!(
                %pid,
                "{} has landing pads but the clones' unwind info is not registered (no __register_frame)",
                g.facts.path
            );
        }
        if g.facts.is_exe && registered {
            exe_eh = g.eh.0;
        }
    }
    Ok((tables_at, exe_eh))
}

/// Re-arms the clones an earlier attach injected for this very
/// executable: each module it recorded (same file, same load bias) is
/// regenerated at its recorded address, which is a pure function of the
/// plan and the layout; nothing is mapped or written but the handler.
fn rearm(
    pid: Pid,
    exe: PathBuf,
    analysed: Vec<Analysed>,
    control: u64,
    mut region: SharedRegion,
    opts: &BurstOptions,
) -> anyhow::Result<Attached> {
    let (handler, restorer, signal, entries) = {
        let cb = region.control_mut();
        let n = (cb.n_modules as usize).min(MAX_MODULES);
        (
            cb.handler,
            cb.restorer,
            cb.signal as i32,
            cb.modules[..n].to_vec(),
        )
    };
    let mut gens = Vec::new();
    for mut a in analysed {
        let Some(e) = entries
            .iter()
            .find(|e| e.id == a.id && e.bias == a.module.bias)
        else {
            continue;
        };
        a.fid_base = e.fid_base as u32;
        gens.push(generate(pid, a, control, Some(e.code), &mut Vec::new())?);
    }
    if !gens.first().is_some_and(|g| g.facts.is_exe) {
        bail!("pid {pid}: the burst region injected earlier has no clones of its executable");
    }
    let mut t = Tracee::attach(pid).context("stopping the target with ptrace")?;
    let current = t.rt_sigaction(signal, None)?;
    if current.handler > 1 && current.handler != handler {
        bail!("pid {pid} now uses signal {signal} itself; cannot re-arm bursts");
    }
    let old_action = install_handler(&mut t, signal, handler, restorer)?;
    // Whatever an interrupted earlier session left.
    for i in 0..MAX_SLOTS {
        t.write_memory(control + owner_offset(i), &0u64.to_ne_bytes())?;
    }
    region.clear_active();
    region.control_mut().tracer = tracer_as_seen_by(pid);
    set_run_options(&mut region, opts);
    t.detach()?;
    info!(
        %pid,
        "bursty tracing: re-armed the clones injected earlier in {} module(s) (signal {signal})",
        gens.len()
    );
    Ok(Injected {
        pid,
        exe,
        modules: gens,
        control,
        region,
        signal,
        old_action,
    }
    .attached())
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
        match super::linkmap::relink(self.pid, &self.region, self.base, exe_path) {
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
    fn clear_owner(&self, slot: usize) {
        use std::os::unix::fs::FileExt;
        let r = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", self.pid))
            .and_then(|f| {
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
        activity: super::Activity,
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

fn set_run_options(region: &mut SharedRegion, opts: &BurstOptions) {
    let cb = region.control_mut();
    cb.burst_len = if opts.full_trace {
        u64::MAX
    } else {
        // 0: the handler returns to the original code at once.
        opts.burst_len
    };
    cb.wait_when_full = u64::from(opts.full_trace);
    cb.max_bursts = opts.max_bursts.clamp(1, MAX_SLOTS as u64);
    cb.measure = if opts.measure {
        burstyd_common::burst::MEASURE_TSC
    } else {
        burstyd_common::burst::MEASURE_NONE
    };
    std::sync::atomic::fence(Ordering::SeqCst);
    cb.armed = 1;
}

fn install_handler(
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

/// Whether the program throws C++ exceptions (or otherwise unwinds with
/// libgcc): landing pads, or imports of the throwing/unwinding entry points.
fn uses_exceptions(data: &[u8], analysis: &userspace_rewriter::analysis::cfg::Analysis) -> bool {
    use object::{Object, ObjectSymbol};
    if analysis.functions.iter().any(|f| f.has_lsda) {
        return true;
    }
    let Ok(file) = object::File::parse(data) else {
        return true;
    };
    file.dynamic_symbols().any(|s| {
        s.is_undefined()
            && matches!(
                s.name(),
                Ok("__cxa_throw"
                    | "__cxa_rethrow"
                    | "_Unwind_RaiseException"
                    | "_Unwind_Resume"
                    | "_Unwind_ForcedUnwind")
            )
    })
}

/// `__register_frame` in the target: libgcc_s's export, or a copy linked
/// into the executable (static libgcc_eh).
fn register_frame_fn(pid: Pid, maps: &[inject::MapEntry], plan: &Plan, bias: u64) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    if let Some(f) = plan.functions.iter().find(|f| f.name == "__register_frame") {
        return Some(f.start.wrapping_add(bias));
    }
    // By file name: a libgcc_s replaced on disk (its maps line says
    // " (deleted)") is still the one mapped, and read through map_files.
    let lib: Vec<&inject::MapEntry> = maps
        .iter()
        .filter(|m| {
            m.path
                .as_deref()
                .and_then(|p| Path::new(p).file_name())
                .is_some_and(|n| n.to_string_lossy().starts_with("libgcc_s.so"))
        })
        .collect();
    let first = lib.iter().min_by_key(|m| m.offset)?;
    let data = std::fs::read(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        first.start, first.end
    ))
    .ok()?;
    let elf = userspace_rewriter::analysis::elf::ElfInfo::parse(&data[..]).ok()?;
    let lbias = elf.load_bias_for(first.start, first.offset, first.is_exec())?;
    let file = object::File::parse(&*data).ok()?;
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("__register_frame") && !s.is_undefined())?;
    Some(sym.address().wrapping_add(lbias))
}

/// `burstyd run` releases its command just before the session starts; the
/// exec replaces the gate (burstyd itself) within milliseconds.
/// `run`'s command `pid`, still waiting on its `gate` to exec: becomes
/// its tracer, releases the gate, and runs it to its entry point
/// ([`hold::run_to_entry`]). Whether it is held there now (by this
/// thread); otherwise it runs (or ended), and why is logged.
pub(crate) fn hold_command(pid: Pid, gate: std::os::fd::OwnedFd) -> bool {
    use userspace_rewriter::inject::hold;
    let seized = hold::seize_before_exec(pid);
    drop(gate);
    if let Err(e) = seized {
        warn!(%pid, "cannot hold the command at its entry point ({e}); it starts at once and bursts begin after the analysis");
        return false;
    }
    match hold::run_to_entry(pid) {
        Ok(hold::Entry::Held(entry)) => {
            info!(%pid, "holding the command at its entry point {entry:#x} until its clones are in place");
            true
        }
        Ok(hold::Entry::Static) => {
            info!(%pid, "a static executable: it starts at once, and bursts begin after the analysis");
            false
        }
        Err(e) => {
            if crate::sys::process_running(pid) {
                warn!(%pid, "cannot hold the command at its entry point ({e}); bursts begin after the analysis");
            }
            false
        }
    }
}

pub(crate) fn wait_for_exec(pid: Pid) {
    let me = std::fs::read_link("/proc/self/exe").ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(p) if Some(&p) != me.as_ref() => {
                // Let the dynamic loader map the libraries and set up TLS.
                std::thread::sleep(std::time::Duration::from_millis(5));
                return;
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            Err(_) => return,
        }
    }
}
