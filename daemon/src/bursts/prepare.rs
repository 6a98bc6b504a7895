//! Preparing one module's clones, with no process touched: analysis
//! ([`analyse_fresh`]), generation for a layout ([`generate_at`]), moving a
//! plan cache entry to this process's layout, storing what was made now
//! ([`remember`]), and the worker's side of a cache entry
//! ([`prepare_entry`]). Deterministic in the module's bytes and the layout:
//! a re-arm regenerates exactly what an earlier attach wrote.

use anyhow::{Context as _, bail};
use burstyd_common::burst::{CLONE_PAGE_SHIFT, ModuleEntry};
use tracing::{debug, warn};
use userspace_rewriter::PAGE_SIZE;
use userspace_rewriter::analysis::plan::{self, FunctionStatus, Plan, PlanOptions};
use userspace_rewriter::codegen::unwind_info;
use userspace_rewriter::codegen::{self, Layout, NO_PATH, TableSource};

use super::cache;
use super::modules::{self, Module};
use super::tables::FileTables;
use crate::stacks::clones::CloneRegion;

use super::facts::ModuleFacts;
use super::fdata_facts::FdataFacts;

/// One module analysed (or found in the plan cache), before generation.
pub(super) struct Analysed {
    pub(super) module: Module,
    pub(super) plan: Plan,
    pub(super) made: Made,
    /// The hash of its bytes ([`Module::hash`]).
    pub(super) id: u64,
    pub(super) fid_base: u32,
    /// Bytes its clones needed where a generation found too little room.
    pub(super) outgrew: u64,
    /// Its key in the plan cache, when there is one.
    pub(super) key: Option<String>,
    /// A worker process made its cache entry now ([`super::worker`]).
    pub(super) worker: Option<WorkerReport>,
}

/// Where a module's clones come from.
pub(super) enum Made {
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
    pub(super) fn cached_before(&self) -> bool {
        matches!(self.made, Made::Cached(_)) && self.worker.is_none()
    }

    /// Gives the module's functions the `fid`s from `*next` on, and moves
    /// `*next` past them; false (nothing changed) when the `fid`s would
    /// run out.
    pub(super) fn take_fids(&mut self, next: &mut u32) -> bool {
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
    pub(super) fn room(&self) -> u64 {
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
pub(super) fn code_len(bytes: u64, eh: &[u8]) -> u64 {
    (((bytes + 15) & !15) + eh.len() as u64 + 0xfff) & !0xfff
}

/// One module's clones, generated for their address (the analysis is
/// dropped once the exporters' facts are taken from it).
pub(super) struct Generated {
    pub(super) facts: ModuleFacts,
    pub(super) id: u64,
    pub(super) img: codegen::CloneImage,
    /// Where the runtime and clones go, and the mapping's length (code,
    /// then the unwind info, in whole pages).
    pub(super) code: u64,
    pub(super) code_len: u64,
    /// The clones' `.eh_frame`: address in the target and bytes.
    pub(super) eh: (u64, Vec<u8>),
    /// The module throws C++ exceptions (or unwinds with libgcc).
    pub(super) exceptions: bool,
    /// Its key in the plan cache, if it is to be stored there (generated
    /// now).
    pub(super) key: Option<String>,
    /// Where the bytes of `img` are.
    pub(super) code_bytes: CodeBytes,
    /// Its lookup tables, when they are not in `img` but in its plan
    /// cache entry.
    pub(super) tables: Option<FileTables>,
}

/// Where a module's clone code is, to be written into the process.
pub(super) enum CodeBytes {
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
    pub(super) fn len(&self, img: &codegen::CloneImage) -> u64 {
        match self {
            CodeBytes::InImage => img.bytes.len() as u64,
            CodeBytes::Cached { bytes, .. } => bytes.len(),
        }
    }
}

/// Pieces of cached clone code are read and written this many bytes at a
/// time.
pub(super) const CODE_PIECE: u64 = 1 << 20;

impl Generated {
    /// What its plan cache entry is written from.
    pub(super) fn stored(&self) -> cache::Stored<'_> {
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
    pub(super) fn tables(&self) -> &dyn TableSource {
        match &self.tables {
            Some(t) => t,
            None => &self.img.tables,
        }
    }

    /// Bytes of clone code.
    pub(super) fn code_bytes_len(&self) -> u64 {
        self.code_bytes.len(&self.img)
    }

    /// Hands `write` the clone code for this process (address, bytes), in
    /// pieces.
    pub(super) fn write_code(
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
pub(super) fn moved_pieces(
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
    pub(super) fn entry(&self) -> ModuleEntry {
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
pub(super) const PROVISIONAL_CONTROL: u64 = 0x4000_0000;

/// Where a worker's clones of the module at `[lo, hi)` go: 64 MiB above
/// it, or below it when that would leave the user address space. An
/// attach's gap is near the module too: the move changes no field's form.
pub(super) fn provisional_code(lo: u64, hi: u64, room: u64) -> u64 {
    const GAP: u64 = 64 << 20;
    let above = (hi + GAP).next_multiple_of(PAGE_SIZE);
    if above + room < 0x7fff_ffff_0000 {
        above
    } else {
        lo.saturating_sub(GAP + room) & !(PAGE_SIZE - 1)
    }
}

pub(super) fn analyse_fresh(module: Module, id: u64) -> anyhow::Result<Analysed> {
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

/// Generates `a`'s clones at `code`; with `room`, gives `a` back (with
/// [`Analysed::outgrew`] set to the bytes needed) when they need more.
#[allow(clippy::type_complexity)]
pub(super) fn generate_at(
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
            let img =
                codegen::generate_excluding(&a.plan, analysis, &layout, exclude, a.module.rec)?;
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

/// Bytes of room for a module's clones and unwind info, from its
/// original code bytes: a generous bound (clones run at 6-10x the
/// original bytes), used for the executable's gap and the libraries'
/// rooms alike.
pub(super) fn code_room(exec: u64) -> u64 {
    (32 * exec + (2 << 20))
        .min(256 << 20)
        .next_multiple_of(PAGE_SIZE)
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

impl Extension {
    /// What the daemon keeps of generated modules.
    pub(super) fn of(gens: Vec<Generated>) -> Extension {
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

/// Stores the modules generated now in the plan cache (once the program
/// runs with them: the next attach to the same files moves these). A
/// module stored keeps its CFGs and path numberings in its entry only.
pub(super) fn remember(gens: &mut [Generated]) {
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

/// Whether the program throws C++ exceptions (or otherwise unwinds with
/// libgcc): landing pads, or imports of the throwing/unwinding entry points.
pub(super) fn uses_exceptions(
    data: &[u8],
    analysis: &userspace_rewriter::analysis::cfg::Analysis,
) -> bool {
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

/// What a worker reports on its standard output (one JSON line).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct WorkerReport {
    pub(crate) analysis_ms: u64,
    pub(crate) generation_ms: u64,
    /// The worker's peak RSS.
    pub(crate) peak_rss_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_mappings_are_whole_pages_with_the_unwind_info_after_aligned_code() {
        assert_eq!(code_len(1, &[]), 0x1000);
        assert_eq!(code_len(0x1000, &[]), 0x1000);
        // 0xff1 bytes of code round to 0x1000, then 1 byte of unwind info.
        assert_eq!(code_len(0xff1, &[0]), 0x2000);
        assert_eq!(code_len(0xff0, &[0; 16]), 0x1000);
    }

    #[test]
    fn rooms_are_generous_bounded_and_whole_pages() {
        assert_eq!(code_room(0), 2 << 20);
        assert_eq!(code_room(0x1000), 32 * 0x1000 + (2 << 20));
        assert_eq!(code_room(1 << 30), 256 << 20);
        assert_eq!(code_room(3) % PAGE_SIZE, 0);
    }

    #[test]
    fn a_workers_provisional_clones_go_above_the_module_or_below_it_at_the_top() {
        let above = provisional_code(0x40_0000, 0x50_0000, 0x10_0000);
        assert_eq!(above, 0x50_0000 + (64 << 20));
        let hi = 0x7fff_fe00_0000;
        let below = provisional_code(hi - 0x10_0000, hi, 0x20_0000);
        assert_eq!(below, hi - 0x10_0000 - (64 << 20) - 0x20_0000);
        assert_eq!(below % PAGE_SIZE, 0);
    }
}
