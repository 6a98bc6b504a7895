//! The clone image of a whole plan: which functions get a clone (Hirzel &
//! Chilimbi's instrumented copies), the runtime in front of them, the
//! encoding for the address they will live at, and the sorted `(original,
//! clone)` tables the runtime searches ([`Tables`]); moving an image to
//! another process's layout.

use std::collections::{BTreeMap, HashMap};

use burstyd_common::burst::{END_LEFT_CLONES, PATH_INVALID};

use iced_x86::{OpKind, Register};
use serde::Serialize;

use super::batches::{BATCH_INSTRUCTIONS, Batches};
use super::emitter::Emitter;
use super::function::{FnGen, PltSlot, Skip};
use super::instrument::{Arg, call_routine};
use super::layout::{GenError, GenStats, Layout, Recording};
use super::operand::LOW_STATE_LIMIT;
use super::references::sets_up_frame_pointer;
use super::relocs::Relocs;
use super::reverse::ReverseMap;
use super::runtime;
use super::tables::Tables;
use super::transfers;
use crate::analysis::cfg::{self, Cfg};
use crate::analysis::disasm::Insn;
use crate::analysis::plan::{FunctionStatus, Plan};
use crate::progress::Stage;

/// One cloned function.
#[derive(Clone, Debug, Serialize)]
pub struct ClonedFunction {
    /// Index into the plan's `functions` (the `fid` in records).
    fid: u32,
    /// AVMA of the original.
    pub(crate) orig: u64,
    /// AVMA of the clone's entry.
    pub(crate) clone: u64,
    /// Whether its path records are valid Ball-Larus numbers.
    paths: bool,
    /// For a PLT stub's trampoline ([`Self::plt_stub`]), the length of the
    /// stub's code it takes over; 0 for a function's clone.
    plt_len: u32,
}

impl ClonedFunction {
    /// A cloned function read back (a cached image).
    pub fn new(fid: u32, orig: u64, clone: u64, paths: bool) -> Self {
        ClonedFunction {
            fid,
            orig,
            clone,
            paths,
            plt_len: 0,
        }
    }

    /// A PLT stub's trampoline read back: the stub's first `len` bytes
    /// (up to its GOT jump) are taken over.
    pub fn plt_stub(fid: u32, orig: u64, clone: u64, len: u32) -> Self {
        ClonedFunction {
            fid,
            orig,
            clone,
            paths: false,
            plt_len: len,
        }
    }

    /// For a PLT stub's trampoline, how many bytes of the stub (from its
    /// start) a burst can start in; `None` for a function's clone. A
    /// trampoline records nothing: a burst that starts there follows the
    /// stub's jump into the clone of its target.
    pub fn plt_stub_len(&self) -> Option<u64> {
        (self.plt_len > 0).then_some(u64::from(self.plt_len))
    }

    /// Index into the plan's `functions`.
    pub fn fid(&self) -> u32 {
        self.fid
    }

    /// AVMA of the clone's entry.
    pub fn clone_entry(&self) -> u64 {
        self.clone
    }

    /// Whether its path records are valid Ball-Larus numbers.
    pub fn paths(&self) -> bool {
        self.paths
    }

    /// AVMA of the original function.
    pub fn orig(&self) -> u64 {
        self.orig
    }
}

/// The generated code and tables.
#[derive(Clone, Debug)]
pub struct CloneImage {
    /// The runtime, then (16-aligned) the clones.
    pub bytes: Vec<u8>,
    /// AVMA of the signal handler (`SA_SIGINFO`).
    pub handler: u64,
    /// AVMA of the `rt_sigreturn` restorer (`SA_RESTORER`).
    pub restorer: u64,
    /// `[clone_lo, clone_hi)`: the code.
    pub code_range: (u64, u64),
    /// The runtime's lookup tables for this image: where it may start a
    /// burst, the cloned functions' entries, the calls' return sites. The
    /// tables the runtime searches are these of every module merged
    /// ([`Tables::merge`]), written where the control block points.
    pub tables: Tables,
    pub functions: Vec<ClonedFunction>,
    /// Functions the plan analysed but the generator left out, by reason.
    pub skipped: BTreeMap<String, usize>,
    /// Instrumentation points emitted.
    pub stats: GenStats,
    /// The original instruction of every copied instruction (clone frames
    /// → original).
    pub reverse: ReverseMap,
    /// The layout it is encoded for, and where its bytes depend on it.
    pub layout: Layout,
    pub relocs: Relocs,
    /// Offset of the first clone (after the runtime).
    pub clones_offset: u64,
}

impl CloneImage {
    /// How many functions have a clone (PLT stubs' trampolines are not
    /// counted).
    pub fn cloned_functions(&self) -> usize {
        self.functions
            .iter()
            .filter(|f| f.plt_stub_len().is_none())
            .count()
    }

    /// The `(original, clone)` pairs of every rewritten instruction.
    pub fn table(&self) -> &[(u64, u64)] {
        self.tables.table(0)
    }
}

/// Functions with this many paths or more are cloned without path numbers.
const MAX_CLONE_PATHS: u64 = 1 << 62;

/// Generates the clones of every analysed function in `plan` (computed with
/// `keep_details`), whose instructions are `analysis.insns`.
///
/// For the tests (`tests/clone_gen.rs`): the daemon calls
/// [`generate_excluding`] with the functions whose unwind information
/// cannot be restated.
pub fn generate(
    plan: &Plan,
    analysis: &cfg::Analysis,
    layout: &Layout,
) -> Result<CloneImage, GenError> {
    generate_excluding(
        plan,
        analysis,
        layout,
        &Default::default(),
        Recording::default(),
    )
}

/// [`generate`], leaving out the functions starting at the keys of
/// `exclude` (SVMAs), counted under their values as skip reasons: those
/// whose unwind information cannot be restated
/// ([`crate::codegen::unwind_info::untranslatable`]), a debugger's hook;
/// recording what `rec` says besides paths.
pub fn generate_excluding(
    plan: &Plan,
    analysis: &cfg::Analysis,
    layout: &Layout,
    exclude: &BTreeMap<u64, &'static str>,
    rec: Recording,
) -> Result<CloneImage, GenError> {
    // The runtime first, then the clones (16-aligned) after it; the clones
    // call the runtime's routines at their absolute addresses.
    let rt = runtime::assemble(layout.control, layout.code)?;
    let clones_at = (layout.code + rt.bytes.len() as u64).next_multiple_of(16);
    let mut em = Emitter::new();

    // Which functions get a clone, and their entry labels.
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    let mut entry_label: HashMap<u64, u64> = HashMap::new(); // SVMA -> label
    let mut chosen = Vec::new();
    let mut have_details = false;
    for (i, f) in plan.functions.iter().enumerate() {
        let FunctionStatus::Analyzed(fa) = &f.status else {
            continue;
        };
        let Some(cfg) = fa.cfg.as_ref() else {
            continue;
        };
        have_details = true;
        if let Some(&why) = exclude.get(&f.start) {
            *skipped.entry(why.into()).or_default() += 1;
            continue;
        }
        if let Err(Skip(why)) = precheck(cfg, &analysis.insns[i]) {
            *skipped.entry(why.into()).or_default() += 1;
            continue;
        }
        entry_label.insert(f.start, em.label());
        chosen.push(i);
    }
    if !have_details && plan.summary.functions_analyzable > 0 {
        return Err(GenError::NoDetails);
    }
    let plt_slots = plt_slots(plan, analysis);
    let part_entries = part_entries(plan, &chosen, &mut em);
    // PLT stubs, each with a trampoline (`plt_trampoline`).
    let stubs: Vec<(usize, u64)> = plan
        .functions
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.status, FunctionStatus::Plt) && !exclude.contains_key(&f.start))
        .map(|(i, _)| (i, em.label()))
        .collect();
    // Functions are encoded in batches; calls and jumps between them go
    // to these labels.
    let exported = entry_label
        .values()
        .copied()
        .chain(part_entries.values().map(|&(l, _)| l))
        .chain(stubs.iter().map(|&(_, l)| l))
        .collect();
    let mut batches = Batches::new(clones_at, exported, layout.code, layout.control);

    let mut stats = GenStats::default();
    // (original AVMA, instruction index of its clone code, original end)
    // and (original return address, instruction index of the return site)
    // in the batch being emitted.
    let mut table_idx: Vec<(u64, usize, u64)> = Vec::new();
    let mut returns_idx: Vec<(u64, usize)> = Vec::new();
    // fid, orig, label, paths, PLT stub length taken over (0: a function)
    let mut funcs: Vec<(u32, u64, u64, bool, u32)> = Vec::new();
    let mut removed: Vec<(u64, u64)> = Vec::new();
    for (k, &i) in chosen.iter().enumerate() {
        crate::progress::report(Stage::Clones, k, chosen.len());
        if em.out.len() >= BATCH_INSTRUCTIONS {
            batches.flush(&mut em, &mut table_idx, &mut returns_idx)?;
        }
        let f = &plan.functions[i];
        let FunctionStatus::Analyzed(fa) = &f.status else {
            unreachable!()
        };
        let cfg = fa.cfg.as_ref().unwrap();
        let numbering = fa
            .numbering
            .as_ref()
            .filter(|n| n.total_paths() < MAX_CLONE_PATHS);
        let mark = em.out.len();
        let tmark = table_idx.len();
        let rmark = returns_idx.len();
        let label = entry_label[&f.start];
        let loops = cfg.loops();
        let mut fg = FnGen {
            em: &mut em,
            rt: &rt,
            layout,
            fid: layout.fid_base + i as u32,
            cfg,
            insns: &analysis.insns[i],
            live: cfg::liveness(cfg, &analysis.insns[i]),
            numbering,
            loops: &loops,
            edges_of: {
                let mut v = vec![Vec::new(); cfg.blocks.len()];
                for e in &cfg.edges {
                    v[e.from].push(*e);
                }
                v
            },
            entry_label: &entry_label,
            part_entries: &part_entries,
            plt_slots: &plt_slots,
            table: &mut table_idx,
            returns: &mut returns_idx,
            stats: GenStats::default(),
            out_of_line: Vec::new(),
            check_exits: HashMap::new(),
            tails: HashMap::new(),
            refs: rec.refs,
            values: rec.values,
            targets: rec.targets,
            frame_pointer: sets_up_frame_pointer(&analysis.insns[i]),
        };
        let result = fg.function(label);
        let s = fg.stats;
        match result {
            Ok(()) => {
                stats.edge_increments += s.edge_increments;
                stats.checks += s.checks;
                stats.path_records += s.path_records;
                stats.refs += s.refs;
                stats.refs_stack += s.refs_stack;
                stats.refs_unsupported += s.refs_unsupported;
                stats.value_tuples += s.value_tuples;
                stats.target_tuples += s.target_tuples;
                stats.tuples_left_out += s.tuples_left_out;
                stats.instructions += analysis.insns[i].len();
                funcs.push((
                    i as u32,
                    f.start + layout.bias,
                    label,
                    numbering.is_some(),
                    0,
                ));
            }
            Err(Skip(why)) => {
                em.truncate(mark);
                table_idx.truncate(tmark);
                returns_idx.truncate(rmark);
                *skipped.entry(why.into()).or_default() += 1;
                // Calls to it now go to the original.
                if let Some(l) = entry_label.remove(&f.start) {
                    removed.push((f.start, l));
                }
                // So do jumps from its other parts, ending the burst.
                for blk in &cfg.blocks {
                    let start = blk.start;
                    if let Some(&(l, _)) = part_entries.get(&start) {
                        em.bind(l);
                        call_routine(
                            &mut em,
                            rt.end,
                            Arg::Const(END_LEFT_CLONES as u32),
                            None,
                            |_| Ok(()),
                        )?;
                        em.jmp(start + layout.bias)?;
                    }
                }
            }
        }
    }
    crate::progress::report(Stage::Clones, chosen.len(), chosen.len());
    for (i, label) in stubs {
        if em.out.len() >= BATCH_INSTRUCTIONS {
            batches.flush(&mut em, &mut table_idx, &mut returns_idx)?;
        }
        let f = &plan.functions[i];
        let (mark, tmark) = (em.out.len(), table_idx.len());
        em.bind(label);
        let insns = analysis.insns.get(i).map_or(&[][..], Vec::as_slice);
        match transfers::plt_trampoline(&mut em, rt.lookup_fn, insns, layout.bias, &mut table_idx) {
            Ok(len) => {
                stats.plt_trampolines += 1;
                funcs.push((i as u32, f.start + layout.bias, label, false, len as u32));
            }
            Err(Skip(why)) => {
                em.truncate(mark);
                table_idx.truncate(tmark);
                *skipped.entry(why.into()).or_default() += 1;
                // Nothing refers to it but the function table, built from
                // `funcs`: bound to a jump to the stub itself.
                em.bind(label);
                em.jmp(f.start + layout.bias)?;
            }
        }
    }
    // Calls to functions skipped after others referenced their labels go
    // to the original.
    for (start, label) in removed {
        em.bind(label);
        em.jmp(start + layout.bias)?;
    }

    batches.flush(&mut em, &mut table_idx, &mut returns_idx)?;
    batches.finish()?;
    let mut bytes = rt.bytes.clone();
    bytes.resize((clones_at - layout.code) as usize, 0xcc);
    bytes.append(&mut batches.bytes);
    let code_len = bytes.len() as u64;
    let mut table = std::mem::take(&mut batches.table);
    let mut reverse = std::mem::take(&mut batches.reverse);
    let mut ret_table = std::mem::take(&mut batches.returns);
    let entry = |label: u64| {
        batches
            .label(label)
            .ok_or_else(|| GenError::Encode("a cloned function's entry was not encoded".into()))
    };
    reverse.sort_unstable();
    // An instruction recorded twice (a landing pad's entry stub, then its
    // copy: `FnGen::entry_stub`) keeps its first, lower, clone address.
    table.sort_unstable();
    table.dedup_by_key(|e| e.0);
    // Function entries: original start -> clone entry (indirect calls).
    let mut fn_table: Vec<(u64, u64)> = funcs
        .iter()
        .map(|&(_, orig, label, _, _)| Ok((orig, entry(label)?)))
        .collect::<Result<_, GenError>>()?;
    fn_table.sort_unstable();
    fn_table.dedup_by_key(|e| e.0);
    // Return sites: original return address -> the clone's return site.
    ret_table.sort_unstable();
    ret_table.dedup_by_key(|e| e.0);
    let functions = funcs
        .into_iter()
        .map(|(fid, orig, label, paths, plt_len)| {
            Ok(ClonedFunction {
                fid,
                orig,
                clone: entry(label)?,
                paths,
                plt_len,
            })
        })
        .collect::<Result<_, GenError>>()?;
    Ok(CloneImage {
        bytes,
        handler: rt.handler,
        restorer: rt.restorer,
        code_range: (layout.code, layout.code + code_len),
        tables: Tables {
            insns: table,
            functions: fn_table,
            returns: ret_table,
        },
        functions,
        skipped,
        stats,
        reverse: ReverseMap::new(&reverse).map_err(GenError::Encode)?,
        layout: *layout,
        relocs: std::mem::take(&mut batches.relocs),
        clones_offset: clones_at - layout.code,
    })
}

impl CloneImage {
    /// The image moved to `to` (another process's layout of the same
    /// module): its layout-dependent fields patched ([`Relocs`]), the
    /// runtime assembled again, the tables and maps moved. The bytes equal
    /// what [`generate_excluding`] would produce at `to`
    /// (`tests/relocate.rs` checks it on real binaries); an error when
    /// they could not (the image holds a field the move cannot patch, or
    /// the runtime would not have the same size).
    pub fn relocate(mut self, to: &Layout) -> Result<CloneImage, GenError> {
        let from = self.layout;
        let mut bytes = std::mem::take(&mut self.bytes);
        let len = bytes.len() as u64;
        let (mut img, mv) = self.relocate_lazily(to, len)?;
        mv.patch(&mut bytes, 0).map_err(GenError::Relocate)?;
        debug_assert_eq!(mv.from, from);
        img.bytes = bytes;
        Ok(img)
    }

    /// Moves everything but the bytes (which may be absent: `len` of
    /// them, kept elsewhere), and returns how to move those piece by
    /// piece ([`BytesMove`]): python3.11's clones are 22 MB, which a
    /// daemon need not hold to write them into a process.
    pub fn relocate_lazily(
        mut self,
        to: &Layout,
        len: u64,
    ) -> Result<(CloneImage, BytesMove), GenError> {
        let from = self.layout;
        let low = |l: &Layout| l.control < LOW_STATE_LIMIT;
        if low(&from) != low(to) {
            return Err(GenError::Relocate(
                "the control block moved across 2 GiB (the operands change form)".into(),
            ));
        }
        let rt = runtime::assemble(to.control, to.code)?;
        if (to.code + rt.bytes.len() as u64).next_multiple_of(16) - to.code != self.clones_offset {
            return Err(GenError::Relocate(
                "the runtime would differ in size".into(),
            ));
        }
        if let Some(why) = &self.relocs.unrelocatable {
            return Err(GenError::Relocate(why.clone()));
        }
        if (rt.bytes.len() as u64) > len {
            return Err(GenError::Relocate(
                "the image is shorter than its runtime".into(),
            ));
        }
        let mut relocs = self.relocs.clone();
        relocs.sort();
        let mv = BytesMove {
            from,
            to: *to,
            runtime: rt.bytes.clone(),
            relocs,
            len,
        };
        let (db, dc) = (
            to.bias.wrapping_sub(from.bias),
            to.code.wrapping_sub(from.code),
        );
        let pairs = |v: &mut Vec<(u64, u64)>| {
            for e in v.iter_mut() {
                *e = (e.0.wrapping_add(db), e.1.wrapping_add(dc));
            }
        };
        pairs(&mut self.tables.insns);
        pairs(&mut self.tables.functions);
        pairs(&mut self.tables.returns);
        for f in &mut self.functions {
            f.orig = f.orig.wrapping_add(db);
            f.clone = f.clone.wrapping_add(dc);
        }
        self.reverse.relocate(dc, db);
        self.handler = rt.handler;
        self.restorer = rt.restorer;
        self.code_range = (
            self.code_range.0.wrapping_add(dc),
            self.code_range.1.wrapping_add(dc),
        );
        self.layout = *to;
        Ok((self, mv))
    }
}

/// How an image's bytes move to another layout, applied to pieces of
/// them in turn ([`CloneImage::relocate_lazily`]).
pub struct BytesMove {
    from: Layout,
    to: Layout,
    /// The runtime assembled for the new layout: the image's first bytes.
    runtime: Vec<u8>,
    /// Sorted.
    relocs: Relocs,
    len: u64,
}

impl BytesMove {
    /// The image's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where a piece from `start` meant to end at `end` must end so that
    /// no field is cut in two (at or after `end`, at most 7 bytes more;
    /// never past the image).
    pub fn piece_end(&self, start: u64, end: u64) -> u64 {
        let end = end.min(self.len);
        self.relocs
            .field_across(end)
            .filter(|&e| e > start)
            .unwrap_or(end)
            .max(end)
            .min(self.len)
    }

    /// Patches `piece`, the image's bytes from offset `start` as encoded
    /// for the old layout, for the new one. Its ends must not cut a field
    /// ([`Self::piece_end`]).
    pub fn patch(&self, piece: &mut [u8], start: u64) -> Result<(), String> {
        self.relocs.apply_at(piece, start, &self.from, &self.to)?;
        let rt = self.runtime.len() as u64;
        if start < rt {
            let n = (rt - start).min(piece.len() as u64) as usize;
            piece[..n].copy_from_slice(&self.runtime[start as usize..start as usize + n]);
        }
        Ok(())
    }
}

/// Where the clones of one part of a function continue when another part
/// jumps into it ([`cfg::ExitKind::ColdJump`]): block start (SVMA) →
/// (label of the block in the clone, the path register's value there). A
/// part's start, for the parts of a family with several (the path of an
/// entry there starts at 0, after the prologue, which records a call
/// that did not happen), each of its extra entries (a Ball-Larus
/// path start of its own, like a loop header), and any other block start
/// such a jump reaches (`PATH_INVALID`: see below).
fn part_entries(plan: &Plan, chosen: &[usize], em: &mut Emitter) -> HashMap<u64, (u64, u64)> {
    let mut members: HashMap<usize, usize> = HashMap::new();
    for f in &plan.functions {
        *members.entry(f.family).or_default() += 1;
    }
    let cfg_of = |i: usize| match &plan.functions[i].status {
        FunctionStatus::Analyzed(fa) => fa.cfg.as_ref(),
        _ => None,
    };
    let mut out = HashMap::new();
    for &i in chosen {
        let f = &plan.functions[i];
        let FunctionStatus::Analyzed(fa) = &f.status else {
            continue;
        };
        let (Some(cfg), Some(n)) = (fa.cfg.as_ref(), fa.numbering.as_ref()) else {
            continue;
        };
        if n.total_paths() >= MAX_CLONE_PATHS {
            continue;
        }
        if members[&f.family] > 1 {
            out.insert(cfg.blocks[0].start, (em.label(), 0));
        }
        for &b in &cfg.extra_entries {
            if let Some(restart) = n.loop_start_increment(b) {
                out.insert(cfg.blocks[b].start, (em.label(), restart));
            }
        }
    }
    // Targets of jumps from another part that are not extra entries (the
    // part's CFG failed with them as roots: a switch whose table base is
    // loaded before the target, say) but start a block: the clone goes on
    // there with the path invalid until the next path start. Sound as any
    // entry with an unknown state is: the clone runs the same
    // instructions, and its switch dispatch compares the actual target
    // with its cases.
    let targets: std::collections::HashSet<u64> = chosen
        .iter()
        .filter_map(|&i| cfg_of(i))
        .flat_map(|c| c.exits.iter())
        .filter_map(|e| match e.kind {
            cfg::ExitKind::ColdJump { target } => Some(target),
            _ => None,
        })
        .collect();
    for &i in chosen {
        let Some(cfg) = cfg_of(i) else { continue };
        for blk in &cfg.blocks {
            if targets.contains(&blk.start) && !out.contains_key(&blk.start) {
                out.insert(blk.start, (em.label(), PATH_INVALID));
            }
        }
    }
    out
}

/// PLT stub start → its [`PltSlot`]: a call to the stub in a clone loads
/// the slot and goes to the clone of what it holds, in this module or
/// another.
fn plt_slots(plan: &Plan, analysis: &cfg::Analysis) -> HashMap<u64, PltSlot> {
    let mut out = HashMap::new();
    for (i, f) in plan.functions.iter().enumerate() {
        if !matches!(f.status, FunctionStatus::Plt) {
            continue;
        }
        if let Some(insns) = analysis.insns.get(i)
            && let Some(j) = transfers::plt_jump(insns)
        {
            out.insert(
                f.start,
                PltSlot {
                    slot: insns[j].instr.memory_displacement64(),
                    jump: insns[j].addr,
                },
            );
        }
    }
    out
}

/// Shapes the generator does not handle (checked before emitting).
fn precheck(cfg: &Cfg, insns: &[Insn]) -> Result<(), Skip> {
    for jt in &cfg.jump_tables {
        let Some(i) = insns.iter().find(|i| i.addr == jt.jump) else {
            return Err(Skip("jump table jump not found"));
        };
        let ins = &i.instr;
        match ins.op0_kind() {
            OpKind::Register if ins.op0_register() != Register::RSP => {}
            OpKind::Memory
                if ins.memory_base() != Register::RSP && ins.memory_index() != Register::RSP => {}
            _ => return Err(Skip("unusual jump-table jump")),
        }
    }
    Ok(())
}
