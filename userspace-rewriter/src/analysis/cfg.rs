//! Per-function control-flow graphs, jump tables, skip reasons and
//! register/flags liveness.
//!
//! You give it a [`Function`], the linear sweep of its bytes
//! ([`crate::analysis::disasm::decode`]) and a [`CfgContext`] (every function start,
//! the bytes of the file's sections, which functions never return);
//! [`build_cfg`] returns the function's [`Cfg`] — basic blocks, typed edges,
//! exits and recovered jump tables — or the [`SkipReason`] why the function
//! cannot be handled safely. [`liveness`] then gives, for every instruction,
//! the general-purpose registers and flags live before it.
//!
//! This is the analysis Hirzel & Chilimbi's x86 implementation of bursty
//! tracing needs before it can duplicate a procedure into checking and
//! instrumented versions ("Bursty Tracing", section 3): the checks go on
//! procedure entries and loop back-edges (section 4), so a function is only
//! usable when *every* control transfer out of every block is known. A
//! function the analysis cannot prove it handles is skipped, with a reason,
//! never guessed.
//!
//! ## How
//!
//! Control flow is followed recursively from the entry over the linear sweep;
//! only reached instructions form blocks. Blocks end at branches, returns,
//! traps and calls (a call's return point starts a new block, reached by a
//! [`EdgeKind::CallFallThrough`] edge). Calls to functions that never return
//! end their block with an exit instead. Indirect jumps are resolved as GCC
//! switch tables (see [`JumpTable`]) bounded by the `cmp idx, N; ja default`
//! guard; `jmp [rip+GOT]` is an indirect tail call.
//!
//! Noreturn functions: a fixed list of names (`abort`, `exit`,
//! `__stack_chk_fail`, ...; see [`KNOWN_NORETURN`]), matched on symbol and PLT
//! names, plus every function whose exits are all noreturn, found by the
//! fixpoint [`CfgContext::infer_noreturn`].
//!
//! ## Non-goals
//!
//! No C++ exception landing pads (functions with an LSDA are skipped), no
//! computed gotos, no indirect jumps other than the GCC table shapes and GOT
//! tail calls, no resynchronising a linear sweep that data desynchronised
//! (those are skip reasons), no interprocedural liveness (calls are modelled
//! by the SysV ABI).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use iced_x86::{
    ConditionCode, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register, RflagsBits,
};
use object::{Object, ObjectSection};
use serde::Serialize;

use crate::analysis::disasm::{Flow, Insn};
use crate::analysis::functions::{Function, FunctionKind, FunctionSources, FunctionsError};

/// Names of functions that never return (matched without `@plt` and symbol
/// versions).
pub const KNOWN_NORETURN: &[&str] = &[
    "abort",
    "exit",
    "_exit",
    "_Exit",
    "quick_exit",
    "__stack_chk_fail",
    "__stack_chk_fail_local",
    "__assert_fail",
    "__assert_perror_fail",
    "__assert",
    "__cxa_throw",
    "__cxa_rethrow",
    "__cxa_bad_cast",
    "__cxa_bad_typeid",
    "__cxa_throw_bad_array_new_length",
    "__cxa_pure_virtual",
    "_Unwind_Resume",
    "__fortify_fail",
    "__chk_fail",
    "__libc_fatal",
    "__libc_start_main",
    "err",
    "errx",
    "verr",
    "verrx",
    "longjmp",
    "_longjmp",
    "siglongjmp",
    "__longjmp_chk",
    "pthread_exit",
    "thrd_exit",
    "__pthread_unwind",
    "__pthread_unwind_next",
    "_ZSt9terminatev",
];

/// Whether `name` (already without `@plt`/version) is a known noreturn
/// function (also libstdc++'s `std::__throw_*` helpers).
pub fn is_known_noreturn(name: &str) -> bool {
    KNOWN_NORETURN.contains(&name) || name.starts_with("_ZSt") && name.contains("__throw_")
}

/// Why a function was left out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
pub enum SkipReason {
    /// The function's range is not backed by bytes in the file.
    #[error("no bytes in the file for the function's range")]
    NoBytes,
    /// A reached instruction does not decode.
    #[error("invalid instruction at {addr:#x}")]
    InvalidInstruction {
        /// SVMA.
        addr: u64,
    },
    /// A reached instruction has control flow we do not model (far
    /// jump/call, `iret`, `xbegin`...).
    #[error("unsupported control flow at {addr:#x}")]
    UnsupportedInstruction {
        /// SVMA.
        addr: u64,
    },
    /// An indirect jump that is neither a recognised jump table nor a GOT
    /// tail call.
    #[error("unresolved indirect jump at {addr:#x}")]
    UnresolvedIndirectJump {
        /// SVMA of the `jmp`.
        addr: u64,
    },
    /// A jump table target outside the function (and not in its `.cold` part).
    #[error("jump table of {addr:#x} has target {target:#x} outside the function")]
    JumpTableTargetOutside {
        /// SVMA of the `jmp`.
        addr: u64,
        /// The offending target.
        target: u64,
    },
    /// A branch lands inside an instruction of the linear sweep that is not
    /// itself reached: the sweep was desynchronised (data or padding before
    /// it), or the code is deliberately obfuscated.
    #[error("branch at {from:#x} into the middle of an instruction at {target:#x}")]
    JumpIntoInstruction {
        /// SVMA of the branch.
        from: u64,
        /// Its target.
        target: u64,
    },
    /// A branch lands inside an instruction that is also executed:
    /// overlapping instructions.
    #[error("branch at {from:#x} to {target:#x} makes instructions overlap")]
    OverlappingInstructions {
        /// SVMA of the branch.
        from: u64,
        /// Its target.
        target: u64,
    },
    /// A reached instruction refers to an address inside the function (other
    /// than its start): data in code (e.g. a jump table in `.text`) or a
    /// label whose address is taken (computed goto); or undecodable bytes lie
    /// between reached instructions.
    #[error("data in code: {addr:#x} (referenced at {insn:#x})")]
    DataInCode {
        /// SVMA of the referring instruction (or of the bad bytes).
        insn: u64,
        /// The address inside the function.
        addr: u64,
    },
    /// Execution can run past the end of the function's range into bytes
    /// that are not another function's start.
    #[error("execution falls off the end of the function after {addr:#x}")]
    FallsOffEnd {
        /// SVMA of the last instruction.
        addr: u64,
    },
    /// A direct branch to an address outside the function that is neither a
    /// function start nor a part (`.cold`) of the same function.
    #[error("branch at {from:#x} to {target:#x} outside the function")]
    JumpOutsideFunction {
        /// SVMA of the branch.
        from: u64,
        /// Its target.
        target: u64,
    },
    /// The function's FDE has an LSDA: C++ landing pads are reached by the
    /// unwinder, not by control flow, so the CFG would miss them.
    #[error("has exception landing pads (LSDA)")]
    HasLandingPads,
}

/// The kind of an intra-function edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum EdgeKind {
    /// The block ends because the next instruction starts a block.
    FallThrough,
    /// The taken side of a conditional branch.
    Taken,
    /// The not-taken side of a conditional branch.
    NotTaken,
    /// An unconditional direct jump.
    Jump,
    /// One (distinct) target of a jump table.
    JumpTable,
    /// From a call to its return point.
    CallFallThrough,
}

/// A basic block: consecutive reached instructions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Block {
    /// SVMA of the first instruction.
    pub start: u64,
    /// SVMA just past the last instruction.
    pub end: u64,
    /// Indices into the function's instruction slice.
    pub insns: Range<usize>,
}

/// An edge between two blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Edge {
    /// Source block index.
    pub from: usize,
    /// Target block index.
    pub to: usize,
    /// Why control goes there.
    pub kind: EdgeKind,
}

/// How control leaves the function from a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ExitKind {
    /// `ret`.
    Return,
    /// A direct jump (or conditional jump, or fall-through past the end) to
    /// another function's start.
    TailCall {
        /// The callee's start.
        target: u64,
    },
    /// An indirect jump through the GOT (`jmp [rip+slot]`), as in PLT stubs
    /// and `-fno-plt` tail calls.
    IndirectTailCall,
    /// A call that does not return: to a known or inferred noreturn function,
    /// or the last instruction of the function (nothing to return to).
    NoReturnCall {
        /// The callee, when direct.
        target: Option<u64>,
    },
    /// `ud2`, `hlt`, `int3`...
    Trap,
    /// A jump between a function and its `.cold` part (either direction,
    /// to any address of the other part), or, in a stripped binary, into the
    /// middle of an unnamed FDE range (which is what cold parts look like
    /// without symbols). Control continues in code this CFG does not cover.
    ColdJump {
        /// The target in the other part.
        target: u64,
    },
}

/// One way out of the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Exit {
    /// The block it leaves from.
    pub block: usize,
    /// SVMA of the instruction that leaves.
    pub insn: u64,
    /// How.
    pub kind: ExitKind,
}

/// Entry format of a [`JumpTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum JumpTableKind {
    /// `lea rB,[rip+T]; movsxd rX,[rB+idx*4]; add rX,rB; jmp rX`: entries are
    /// signed 32-bit offsets from `T` (GCC with `-fPIC`/`-fpie`).
    PicRelative32,
    /// `jmp [T+idx*8]` or `mov rX,[T+idx*8]; jmp rX`: entries are absolute
    /// 64-bit addresses (GCC without PIC).
    Absolute64,
}

/// A recovered switch jump table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JumpTable {
    /// SVMA of the indirect `jmp`.
    pub jump: u64,
    /// SVMA of the table.
    pub table: u64,
    /// Entry format.
    pub kind: JumpTableKind,
    /// One target per entry (`entries = targets.len()`, bounded by the guard).
    pub targets: Vec<u64>,
}

/// A call site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CallSite {
    /// SVMA of the call instruction.
    pub insn: u64,
    /// Direct target.
    pub target: Option<u64>,
}

/// A function's control-flow graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cfg {
    /// SVMA of the function.
    pub function: u64,
    /// Blocks in address order; block 0 is the entry.
    pub blocks: Vec<Block>,
    /// Edges, grouped by source block, in a fixed order per block (taken
    /// before not-taken; jump-table targets by address). Parallel edges are
    /// merged (a `je` to the next instruction gives one edge).
    pub edges: Vec<Edge>,
    /// Exits, by block.
    pub exits: Vec<Exit>,
    /// Recovered jump tables, by jump address.
    pub jump_tables: Vec<JumpTable>,
    /// Call sites (direct and indirect), by address.
    pub calls: Vec<CallSite>,
}

impl Cfg {
    /// The index of the entry block (always 0).
    pub fn entry(&self) -> usize {
        0
    }

    /// Successor block indices of `block`, in edge order.
    pub fn succs(&self, block: usize) -> impl Iterator<Item = usize> + '_ {
        self.edges
            .iter()
            .filter(move |e| e.from == block)
            .map(|e| e.to)
    }

    /// The block containing SVMA `addr`.
    pub fn block_at(&self, addr: u64) -> Option<usize> {
        let i = self.blocks.partition_point(|b| b.start <= addr);
        (i > 0 && addr < self.blocks[i - 1].end).then(|| i - 1)
    }

    /// The shape of the CFG for [`crate::analysis::graph`]: nodes are block indices,
    /// `succs` in edge order, exits = blocks with an [`Exit`] (deduplicated,
    /// ascending).
    pub fn to_graph(&self) -> crate::analysis::graph::Graph {
        let mut succs = vec![Vec::new(); self.blocks.len()];
        for e in &self.edges {
            succs[e.from].push(e.to);
        }
        let exits: BTreeSet<usize> = self.exits.iter().map(|e| e.block).collect();
        crate::analysis::graph::Graph {
            succs,
            entry: 0,
            exits: exits.into_iter().collect(),
        }
    }
}

/// A loaded section's bytes.
struct SectionBytes<'data> {
    addr: u64,
    bytes: &'data [u8],
}

pub(crate) type Fde<'data> =
    gimli::FrameDescriptionEntry<gimli::EndianSlice<'data, gimli::LittleEndian>, usize>;

/// The parsed `.eh_frame`, to ask the CFA rule at an address.
pub(crate) struct EhFrameInfo<'data> {
    pub(crate) section: gimli::EhFrame<gimli::EndianSlice<'data, gimli::LittleEndian>>,
    pub(crate) bases: gimli::BaseAddresses,
    /// FDEs sorted by start.
    pub(crate) fdes: Vec<Fde<'data>>,
}

/// What [`build_cfg`] needs to know beyond one function.
pub struct CfgContext<'data> {
    sections: Vec<SectionBytes<'data>>,
    eh_frame: Option<EhFrameInfo<'data>>,
    /// `(start, end, family, named)`, sorted by start; `family` is the index
    /// of the function or, for a cold part with a parent, of its parent;
    /// `named` whether a symbol names it.
    ranges: Vec<(u64, u64, usize, bool)>,
    names: BTreeMap<u64, String>,
    noreturn: BTreeSet<u64>,
}

impl<'data> CfgContext<'data> {
    /// Collect section bytes and function starts of `file`; seed the noreturn
    /// set with [`is_known_noreturn`] names (symbols, aliases and PLT stubs).
    pub fn new(file: &object::File<'data>, functions: &[Function]) -> Self {
        let mut sections: Vec<SectionBytes<'data>> = file
            .sections()
            .filter(|s| s.address() != 0 && s.size() > 0)
            .filter_map(|s| {
                let bytes = s.data().ok()?;
                (!bytes.is_empty()).then_some(SectionBytes {
                    addr: s.address(),
                    bytes,
                })
            })
            .collect();
        sections.sort_by_key(|s| s.addr);
        let mut ranges: Vec<(u64, u64, usize, bool)> = functions
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let family = match f.kind {
                    FunctionKind::ColdPart { parent: Some(p) } => p,
                    _ => i,
                };
                let named = f.sources.contains(FunctionSources::SYMTAB)
                    || f.sources.contains(FunctionSources::DYNSYM)
                    || f.kind == FunctionKind::Plt;
                (f.start, f.end(), family, named)
            })
            .collect();
        ranges.sort_by_key(|r| r.0);
        let names = functions
            .iter()
            .map(|f| (f.start, f.name.clone()))
            .collect();
        let noreturn = functions
            .iter()
            .filter(|f| {
                is_known_noreturn(f.base_name())
                    || f.aliases
                        .iter()
                        .any(|a| is_known_noreturn(crate::analysis::functions::base_name(a)))
            })
            .map(|f| f.start)
            .collect();
        CfgContext {
            sections,
            eh_frame: parse_eh_frame(file),
            ranges,
            names,
            noreturn,
        }
    }

    /// Whether, per `.eh_frame`, the canonical frame address at `addr` is
    /// `rsp + 8`: the stack holds nothing but the return address, as at a
    /// tail call. `None` without CFI for `addr`.
    pub fn frame_is_empty_at(&self, addr: u64) -> Option<bool> {
        let eh = self.eh_frame.as_ref()?;
        let i = eh.fdes.partition_point(|f| f.initial_address() <= addr);
        let fde = eh.fdes.get(i.checked_sub(1)?)?;
        if addr >= fde.initial_address().wrapping_add(fde.len()) {
            return None;
        }
        let mut uctx = gimli::UnwindContext::new();
        let row = fde
            .unwind_info_for_address(&eh.section, &eh.bases, &mut uctx, addr)
            .ok()?;
        Some(matches!(
            row.cfa(),
            gimli::CfaRule::RegisterAndOffset { register, offset: 8 } if *register == gimli::X86_64::RSP
        ))
    }

    /// `len` bytes of the file's image at SVMA `addr`, if one section holds
    /// them all.
    pub fn bytes(&self, addr: u64, len: u64) -> Option<&'data [u8]> {
        let i = self.sections.partition_point(|s| s.addr <= addr);
        let s = self.sections.get(i.checked_sub(1)?)?;
        let off = usize::try_from(addr - s.addr).ok()?;
        let end = off.checked_add(usize::try_from(len).ok()?)?;
        s.bytes.get(off..end)
    }

    /// The linear sweep of `f`'s bytes (empty when the file has no bytes for it).
    pub fn decode(&self, f: &Function) -> Vec<Insn> {
        self.bytes(f.start, f.size)
            .map(|b| crate::analysis::disasm::decode(b, f.start))
            .unwrap_or_default()
    }

    /// Whether the function starting at `addr` never returns.
    pub fn is_noreturn(&self, addr: u64) -> bool {
        self.noreturn.contains(&addr)
    }

    /// Starts of all functions known not to return, ascending.
    pub fn noreturn_functions(&self) -> impl Iterator<Item = u64> + '_ {
        self.noreturn.iter().copied()
    }

    /// Mark the function at `addr` as noreturn.
    pub fn add_noreturn(&mut self, addr: u64) {
        self.noreturn.insert(addr);
    }

    /// The name of the function starting at `addr` (`foo@plt` for PLT stubs).
    pub fn name_at(&self, addr: u64) -> Option<&str> {
        self.names.get(&addr).map(String::as_str)
    }

    /// The function range containing `addr`: `(start, end, family, named)`.
    fn containing(&self, addr: u64) -> Option<(u64, u64, usize, bool)> {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        // Ranges may nest or overlap (hand-written assembly); look back a little.
        self.ranges[..i]
            .iter()
            .rev()
            .take(8)
            .find(|r| addr < r.1)
            .copied()
    }

    fn family_of(&self, start: u64) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.0 < start);
        self.ranges.get(i).filter(|r| r.0 == start).map(|r| r.2)
    }

    /// The first function start at or after `addr` reached by skipping only
    /// `nop` padding (at most 32 bytes).
    fn start_after_padding(&self, mut addr: u64) -> Option<u64> {
        let limit = addr + 32;
        while addr <= limit {
            if self.is_function_start(addr) {
                return Some(addr);
            }
            let bytes = self.bytes(addr, 16).or_else(|| self.bytes(addr, 1))?;
            let insn = crate::analysis::disasm::decode_one(bytes, addr)?;
            if insn.instr.mnemonic() != Mnemonic::Nop {
                return None;
            }
            addr = insn.end();
        }
        None
    }

    fn is_function_start(&self, addr: u64) -> bool {
        self.names.contains_key(&addr)
    }

    /// Fixpoint: mark as noreturn every function whose CFG builds and all of
    /// whose exits are noreturn calls, traps or tail calls to noreturn
    /// functions (vacuously: also functions with no exit at all). `insns[i]`
    /// is the linear sweep of `functions[i]`. Returns how many were added.
    pub fn infer_noreturn(&mut self, functions: &[Function], insns: &[Vec<Insn>]) -> usize {
        let mut added = 0;
        loop {
            let mut changed = Vec::new();
            for (f, ins) in functions.iter().zip(insns) {
                if self.noreturn.contains(&f.start) || f.kind == FunctionKind::Plt {
                    continue;
                }
                let Ok(cfg) = build_cfg(f, ins, self) else {
                    continue;
                };
                let never_returns = cfg.exits.iter().all(|e| match e.kind {
                    ExitKind::NoReturnCall { .. } | ExitKind::Trap => true,
                    ExitKind::TailCall { target } => self.noreturn.contains(&target),
                    _ => false,
                });
                if never_returns {
                    changed.push(f.start);
                }
            }
            if changed.is_empty() {
                return added;
            }
            added += changed.len();
            self.noreturn.extend(changed);
        }
    }
}

pub(crate) fn parse_eh_frame<'data>(file: &object::File<'data>) -> Option<EhFrameInfo<'data>> {
    use gimli::UnwindSection as _;
    let sec = file.section_by_name(".eh_frame")?;
    let bytes = sec.data().ok()?;
    let section = gimli::EhFrame::new(bytes, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(sec.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let mut fdes = Vec::new();
    let mut entries = section.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o))
        {
            fdes.push(fde);
        }
    }
    fdes.sort_by_key(|f| f.initial_address());
    Some(EhFrameInfo {
        section,
        bases,
        fdes,
    })
}

/// What holds a jump table's index during the backward guard search.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Idx {
    /// A GPR.
    Reg(usize),
    /// A variable in memory: `[base + index*scale + disp]` (base `RIP`
    /// with `disp` the absolute address for RIP-relative operands).
    Mem(Register, Register, u32, u64),
}

/// How a backward walk reached an instruction from its successor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    FallThrough,
    Taken,
}

/// Working state of [`build_cfg`].
struct Walker<'a, 'data> {
    func: &'a Function,
    insns: &'a [Insn],
    ctx: &'a CfgContext<'data>,
    reached: Vec<bool>,
    leaders: BTreeSet<usize>,
    /// Branch sources of each intra-function target (insn index -> sources).
    branch_preds: BTreeMap<usize, Vec<usize>>,
    /// Exits keyed by instruction index.
    exits: BTreeMap<usize, Vec<ExitKind>>,
    /// Instructions after which the fall-through is dead (noreturn calls).
    noreturn_calls: BTreeSet<usize>,
    tables: BTreeMap<usize, JumpTable>,
    pending: BTreeSet<usize>,
    bad_targets: Vec<(usize, u64)>,
    work: Vec<usize>,
    info: InstructionInfoFactory,
}

/// Build the CFG of `func` from its linear sweep `insns` (see the module docs).
///
/// Returns the [`Cfg`], or the first [`SkipReason`] found (deterministic:
/// the walk order is fixed).
pub fn build_cfg(func: &Function, insns: &[Insn], ctx: &CfgContext) -> Result<Cfg, SkipReason> {
    if func.has_lsda {
        return Err(SkipReason::HasLandingPads);
    }
    if insns.first().map(|i| i.addr) != Some(func.start) {
        return Err(SkipReason::NoBytes);
    }
    let mut w = Walker {
        func,
        insns,
        ctx,
        reached: vec![false; insns.len()],
        leaders: BTreeSet::from([0]),
        branch_preds: BTreeMap::new(),
        exits: BTreeMap::new(),
        noreturn_calls: BTreeSet::new(),
        tables: BTreeMap::new(),
        pending: BTreeSet::new(),
        bad_targets: Vec::new(),
        work: vec![0],
        info: InstructionInfoFactory::new(),
    };
    loop {
        w.drain()?;
        // Resolve pending indirect jumps now that the walk knows more
        // predecessors; each resolution may reach new code.
        let pending: Vec<usize> = w.pending.iter().copied().collect();
        let mut progress = false;
        for j in pending {
            if let Some(table) = w.match_jump_table(j)? {
                w.pending.remove(&j);
                for &t in &table.targets {
                    match w.intra_index(j, t) {
                        Some(Some(ti)) => {
                            w.leaders.insert(ti);
                            w.branch_preds.entry(ti).or_default().push(j);
                            w.work.push(ti);
                        }
                        Some(None) => {}
                        // A case GCC moved to the `.cold` part.
                        None => match w.external(j, t) {
                            Ok(kind @ ExitKind::ColdJump { .. }) => w.add_exit(j, kind),
                            _ => {
                                return Err(SkipReason::JumpTableTargetOutside {
                                    addr: insns[j].addr,
                                    target: t,
                                });
                            }
                        },
                    }
                }
                w.tables.insert(j, table);
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    // What is left may be an indirect tail call through a function pointer.
    let left: Vec<usize> = w.pending.iter().copied().collect();
    for j in left {
        if w.is_indirect_tail_call(j) {
            w.pending.remove(&j);
            w.add_exit(j, ExitKind::IndirectTailCall);
        }
    }
    if let Some(&j) = w.pending.iter().next() {
        return Err(SkipReason::UnresolvedIndirectJump {
            addr: insns[j].addr,
        });
    }
    // Re-check every table with the final predecessor sets: a path found
    // later must not bypass the guard.
    let js: Vec<usize> = w.tables.keys().copied().collect();
    for j in js {
        let again = w.match_jump_table(j)?;
        if again.as_ref() != w.tables.get(&j) {
            return Err(SkipReason::UnresolvedIndirectJump {
                addr: insns[j].addr,
            });
        }
    }
    if let Some(&(from, target)) = w.bad_targets.iter().min_by_key(|(f, _)| *f) {
        let containing = insns.partition_point(|i| i.addr <= target) - 1;
        let from = insns[from].addr;
        return Err(if w.reached[containing] {
            SkipReason::OverlappingInstructions { from, target }
        } else {
            SkipReason::JumpIntoInstruction { from, target }
        });
    }
    w.check_data_in_code()?;
    Ok(w.finish())
}

impl Walker<'_, '_> {
    /// Index of the instruction at intra-function SVMA `t`:
    /// `Some(Some(i))` inside the function at an instruction boundary,
    /// `Some(None)` inside but not at a boundary (recorded as a bad target),
    /// `None` outside the function.
    fn intra_index(&mut self, from: usize, t: u64) -> Option<Option<usize>> {
        if !self.func.contains(t) {
            return None;
        }
        match self.insns.binary_search_by_key(&t, |i| i.addr) {
            Ok(i) => Some(Some(i)),
            Err(_) => {
                self.bad_targets.push((from, t));
                Some(None)
            }
        }
    }

    /// Classify a direct transfer from instruction `from` to `t` outside the
    /// function.
    fn external(&self, from: usize, t: u64) -> Result<ExitKind, SkipReason> {
        let own_family = self.ctx.family_of(self.func.start);
        let containing = self.ctx.containing(t);
        if let Some((_, _, family, _)) = containing
            && own_family == Some(family)
        {
            return Ok(ExitKind::ColdJump { target: t });
        }
        if self.ctx.is_function_start(t) {
            return Ok(ExitKind::TailCall { target: t });
        }
        // Into the middle of an unnamed FDE range: what a `.cold` part looks
        // like once the symbols are stripped.
        if let Some((_, _, _, false)) = containing {
            return Ok(ExitKind::ColdJump { target: t });
        }
        // The other direction: an unnamed FDE range jumping into the middle
        // of a named function is a stripped `.cold` part returning to its
        // parent (GCC -O2 splits, e.g. all over a stripped python3).
        let unnamed = !self.func.sources.contains(FunctionSources::SYMTAB)
            && !self.func.sources.contains(FunctionSources::DYNSYM);
        if unnamed && containing.is_some() {
            return Ok(ExitKind::ColdJump { target: t });
        }
        Err(SkipReason::JumpOutsideFunction {
            from: self.insns[from].addr,
            target: t,
        })
    }

    /// A direct branch from instruction `i` to `t`: a new leader inside the
    /// function (queued for the walk), or an exit classified by
    /// [`Walker::external`].
    fn branch_to(&mut self, i: usize, t: u64) -> Result<(), SkipReason> {
        match self.intra_index(i, t) {
            Some(Some(ti)) => {
                self.leaders.insert(ti);
                self.branch_preds.entry(ti).or_default().push(i);
                self.work.push(ti);
            }
            Some(None) => {}
            None => {
                let kind = self.external(i, t)?;
                self.add_exit(i, kind);
            }
        }
        Ok(())
    }

    fn add_exit(&mut self, i: usize, kind: ExitKind) {
        let v = self.exits.entry(i).or_default();
        if !v.contains(&kind) {
            v.push(kind);
        }
    }

    /// Follow control flow from every work item.
    fn drain(&mut self) -> Result<(), SkipReason> {
        while let Some(mut i) = self.work.pop() {
            loop {
                if self.reached[i] {
                    break;
                }
                self.reached[i] = true;
                let insn = self.insns[i];
                let next = i + 1;
                let next_in_range = next < self.insns.len();
                match insn.flow {
                    Flow::Invalid => {
                        return Err(SkipReason::InvalidInstruction { addr: insn.addr });
                    }
                    Flow::Unsupported => {
                        return Err(SkipReason::UnsupportedInstruction { addr: insn.addr });
                    }
                    Flow::Ret => {
                        self.add_exit(i, ExitKind::Return);
                        break;
                    }
                    Flow::Trap => {
                        self.add_exit(i, ExitKind::Trap);
                        break;
                    }
                    Flow::IndirectJump => {
                        let instr = &insn.instr;
                        if instr.is_ip_rel_memory_operand() {
                            self.add_exit(i, ExitKind::IndirectTailCall);
                        } else {
                            self.pending.insert(i);
                        }
                        break;
                    }
                    Flow::Jump(t) => {
                        self.branch_to(i, t)?;
                        break;
                    }
                    Flow::CondJump(t) => {
                        self.branch_to(i, t)?;
                        if !next_in_range {
                            self.fall_off(i)?;
                            break;
                        }
                        self.leaders.insert(next);
                        i = next;
                    }
                    Flow::Call(_) | Flow::IndirectCall => {
                        let target = insn.flow.target();
                        if target.is_some_and(|t| self.ctx.is_noreturn(t)) || !next_in_range {
                            self.add_exit(i, ExitKind::NoReturnCall { target });
                            self.noreturn_calls.insert(i);
                            break;
                        }
                        self.leaders.insert(next);
                        i = next;
                    }
                    Flow::Next | Flow::Syscall | Flow::Interrupt => {
                        if !next_in_range {
                            self.fall_off(i)?;
                            break;
                        }
                        i = next;
                    }
                }
            }
        }
        Ok(())
    }

    /// Instruction `i` is the last of the range and may fall through.
    fn fall_off(&mut self, i: usize) -> Result<(), SkipReason> {
        if let Some(t) = self.ctx.start_after_padding(self.insns[i].end()) {
            // Hand-written assembly falling into the next function.
            self.add_exit(i, ExitKind::TailCall { target: t });
            Ok(())
        } else {
            Err(SkipReason::FallsOffEnd {
                addr: self.insns[i].addr,
            })
        }
    }

    /// The unique predecessor of instruction `i` on every known path, and
    /// how it gets there.
    fn unique_pred(&self, i: usize) -> Option<(usize, Via)> {
        let mut cands = Vec::new();
        if i > 0
            && self.reached[i - 1]
            && self.insns[i - 1].flow.falls_through()
            && !self.noreturn_calls.contains(&(i - 1))
        {
            cands.push((i - 1, Via::FallThrough));
        }
        if let Some(p) = self.branch_preds.get(&i) {
            for &p in p {
                if self.tables.contains_key(&p) || self.pending.contains(&p) {
                    return None; // reached through a jump table: no single path
                }
                // A conditional branch to the next instruction is both.
                if !cands.iter().any(|&(c, _)| c == p) {
                    cands.push((p, Via::Taken));
                }
            }
        }
        (cands.len() == 1).then(|| cands[0])
    }

    /// Full 64-bit GPRs (as indices 0..16) written by instruction `i`, and
    /// whether it is a call (which clobbers everything caller-saved).
    fn gprs_written(&mut self, i: usize) -> u16 {
        let insn = &self.insns[i];
        if matches!(insn.flow, Flow::Call(_) | Flow::IndirectCall) {
            return CALLER_SAVED;
        }
        let info = self.info.info(&insn.instr);
        let mut mask = 0;
        for r in info.used_registers() {
            if matches!(
                r.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            ) && let Some(n) = gpr_index(r.register())
            {
                mask |= 1 << n;
            }
        }
        mask
    }

    /// Walk back from instruction `from` (exclusive) to the nearest writer of
    /// GPR `reg` on the unique path. Gives up after 64 instructions, at a
    /// merge point, or at the function entry.
    fn find_def(&mut self, reg: usize, from: usize) -> Option<usize> {
        let mut i = from;
        for _ in 0..64 {
            let (p, _) = self.unique_pred(i)?;
            if self.gprs_written(p) & (1 << reg) != 0 {
                return Some(p);
            }
            i = p;
        }
        None
    }

    /// Try to recognise the indirect jump at `j` as a GCC switch table.
    /// `Ok(None)` when the pattern does not (yet) match.
    fn match_jump_table(&mut self, j: usize) -> Result<Option<JumpTable>, SkipReason> {
        let jmp = self.insns[j].instr;
        let (kind, table, index, load_at) = if jmp.op0_kind() == OpKind::Memory {
            // jmp [T + idx*8]
            if jmp.memory_base() != Register::None || jmp.memory_index_scale() != 8 {
                return Ok(None);
            }
            let Some(idx) = gpr_index(jmp.memory_index()) else {
                return Ok(None);
            };
            (
                JumpTableKind::Absolute64,
                jmp.memory_displacement64(),
                idx,
                j,
            )
        } else {
            let Some(r) = gpr_index(jmp.op0_register()) else {
                return Ok(None);
            };
            let Some(d) = self.find_def(r, j) else {
                return Ok(None);
            };
            let def = self.insns[d].instr;
            match def.mnemonic() {
                // mov rX, [T + idx*8]
                Mnemonic::Mov
                    if def.op1_kind() == OpKind::Memory
                        && def.memory_base() == Register::None
                        && def.memory_index_scale() == 8 =>
                {
                    let Some(idx) = gpr_index(def.memory_index()) else {
                        return Ok(None);
                    };
                    (
                        JumpTableKind::Absolute64,
                        def.memory_displacement64(),
                        idx,
                        d,
                    )
                }
                // add rX, rB  (rX = sext(table[idx]), rB = T, either way round)
                Mnemonic::Add
                    if def.op0_kind() == OpKind::Register
                        && def.op1_kind() == OpKind::Register
                        && def.op0_register().is_gpr64()
                        && def.op1_register().is_gpr64() =>
                {
                    let a = gpr_index(def.op0_register()).expect("gpr64");
                    let b = gpr_index(def.op1_register()).expect("gpr64");
                    // One operand is sext(table[idx]), the other the table base.
                    let Some((t, idx, load)) =
                        self.pic_entry(a, b, d).or_else(|| self.pic_entry(b, a, d))
                    else {
                        return Ok(None);
                    };
                    (JumpTableKind::PicRelative32, t, idx, load)
                }
                _ => return Ok(None),
            }
        };
        let Some(entries) = self.find_guard(index, load_at) else {
            return Ok(None);
        };
        let entry_size = match kind {
            JumpTableKind::PicRelative32 => 4,
            JumpTableKind::Absolute64 => 8,
        };
        let Some(bytes) = self.ctx.bytes(table, entries * entry_size) else {
            return Ok(None);
        };
        if self.func.contains(table) {
            return Err(SkipReason::DataInCode {
                insn: self.insns[j].addr,
                addr: table,
            });
        }
        let targets = bytes
            .chunks_exact(entry_size as usize)
            .map(|c| match kind {
                JumpTableKind::PicRelative32 => {
                    let off = i32::from_le_bytes(c.try_into().expect("4 bytes"));
                    table.wrapping_add(off as i64 as u64)
                }
                JumpTableKind::Absolute64 => u64::from_le_bytes(c.try_into().expect("8 bytes")),
            })
            .collect();
        Ok(Some(JumpTable {
            jump: self.insns[j].addr,
            table,
            kind,
            targets,
        }))
    }

    /// The PIC table load feeding `add rX, rY` at `d`, with `x` the loaded
    /// entry and `y` the table base: `(T, index register, where the index is
    /// last used)`. Two shapes:
    /// * GCC -O1 and up: `movsxd x, dword [B + idx*4]` with `B` = `T`;
    /// * GCC -O0: `lea s, [idx*4]; mov eax, dword [B + s*1]; cdqe` (either
    ///   of `B`, `s` may be the base).
    fn pic_entry(&mut self, x: usize, y: usize, d: usize) -> Option<(u64, usize, usize)> {
        let t = self.reaching_rip_lea(y, d)?;
        let dx = self.find_def(x, d)?;
        let ld = self.insns[dx].instr;
        match ld.mnemonic() {
            Mnemonic::Movsxd => {
                if ld.op1_kind() != OpKind::Memory
                    || ld.memory_index_scale() != 4
                    || ld.memory_displacement64() != 0
                    || ld.memory_size().size() != 4
                {
                    return None;
                }
                let base = gpr_index(ld.memory_base())?;
                let idx = gpr_index(ld.memory_index())?;
                // The load's base must hold the same table address.
                (self.reaching_rip_lea(base, dx)? == t).then_some((t, idx, dx))
            }
            Mnemonic::Cdqe if x == 0 => {
                let dm = self.find_def(0, dx)?;
                let mv = self.insns[dm].instr;
                if mv.mnemonic() != Mnemonic::Mov
                    || mv.op0_register() != Register::EAX
                    || mv.op1_kind() != OpKind::Memory
                    || mv.memory_index_scale() != 1
                    || mv.memory_displacement64() != 0
                {
                    return None;
                }
                let r1 = gpr_index(mv.memory_base())?;
                let r2 = gpr_index(mv.memory_index())?;
                for (tb, scaled) in [(r1, r2), (r2, r1)] {
                    if self.reaching_rip_lea(tb, dm) != Some(t) {
                        continue;
                    }
                    let ds = self.find_def(scaled, dm)?;
                    let sc = self.insns[ds].instr;
                    if sc.mnemonic() == Mnemonic::Lea
                        && sc.memory_base() == Register::None
                        && sc.memory_index_scale() == 4
                        && sc.memory_displacement64() == 0
                    {
                        return Some((t, gpr_index(sc.memory_index())?, ds));
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// `T` if instruction `i` is `lea rX, [rip + T]`.
    fn rip_lea(&self, i: usize) -> Option<u64> {
        let ins = self.insns[i].instr;
        (ins.mnemonic() == Mnemonic::Lea && ins.is_ip_rel_memory_operand())
            .then(|| ins.ip_rel_memory_address())
    }

    /// Walk back from `from` (exclusive), tracking the index through register
    /// moves and zero extensions (`mov`, `movzx`) and loads from a
    /// RIP-relative variable, to the unsigned bound check guarding it:
    /// `cmp idx, N` followed by `ja`/`jae` not taken (or `jbe`/`jb` taken).
    /// Every known path must be guarded with the same bound (GCC sometimes
    /// duplicates the guard into two predecessors). Returns the number of
    /// table entries.
    fn find_guard(&mut self, index: usize, from: usize) -> Option<u64> {
        let mut budget = 512usize;
        let mut on_path = BTreeSet::new();
        self.guard_from(from, Idx::Reg(index), None, &mut budget, &mut on_path)
    }

    fn guard_from(
        &mut self,
        i: usize,
        idx: Idx,
        bound: Option<u64>,
        budget: &mut usize,
        on_path: &mut BTreeSet<usize>,
    ) -> Option<u64> {
        let preds = self.all_preds(i);
        if preds.is_empty() || !on_path.insert(i) {
            return None; // entry reached unguarded, or a loop
        }
        let mut result = None;
        for p in preds {
            if self.tables.contains_key(&p) || self.pending.contains(&p) {
                result = None;
                break;
            }
            let via = if p + 1 == i && self.insns[p].flow.falls_through() {
                if self.insns[p].flow.target() == Some(self.insns[i].addr) {
                    result = None; // both edges of a jcc lead here
                    break;
                }
                Via::FallThrough
            } else {
                Via::Taken
            };
            let r = self.guard_step(p, via, idx, bound, budget, on_path);
            if r.is_none() || result.is_some_and(|x| Some(x) != r) {
                result = None;
                break;
            }
            result = r;
        }
        on_path.remove(&i);
        result
    }

    /// One step of [`Walker::find_guard`]: instruction `p`, reached backwards
    /// from its successor through `via`.
    fn guard_step(
        &mut self,
        p: usize,
        via: Via,
        mut idx: Idx,
        mut bound: Option<u64>,
        budget: &mut usize,
        on_path: &mut BTreeSet<usize>,
    ) -> Option<u64> {
        *budget = budget.checked_sub(1)?;
        let ins = self.insns[p].instr;
        if let Some(extra) = bound
            && ins.rflags_modified() != 0
        {
            // The flags setter of the guard.
            if ins.mnemonic() != Mnemonic::Cmp || !is_immediate(ins.op1_kind()) {
                return None;
            }
            let size = match (ins.op0_kind(), idx) {
                (OpKind::Register, Idx::Reg(n)) if gpr_index(ins.op0_register()) == Some(n) => {
                    ins.op0_register().size()
                }
                (OpKind::Memory, Idx::Mem(..)) if mem_operand(&ins) == idx => {
                    ins.memory_size().size()
                }
                _ => return None,
            };
            let n = ins.immediate(1);
            let n = if size >= 8 {
                n
            } else {
                n & ((1u64 << (8 * size)) - 1)
            };
            let entries = n.checked_add(extra)?;
            return (entries > 0 && entries <= 1 << 16).then_some(entries);
        }
        if bound.is_none()
            && let Flow::CondJump(_) = self.insns[p].flow
        {
            bound = match (ins.condition_code(), via) {
                (ConditionCode::a, Via::FallThrough) | (ConditionCode::be, Via::Taken) => Some(1),
                (ConditionCode::ae, Via::FallThrough) | (ConditionCode::b, Via::Taken) => Some(0),
                _ => None,
            };
            return self.guard_from(p, idx, bound, budget, on_path);
        }
        match idx {
            Idx::Reg(n) => {
                if self.gprs_written(p) & (1 << n) != 0 {
                    let dst_ok = ins.op0_kind() == OpKind::Register
                        && gpr_index(ins.op0_register()) == Some(n)
                        && ins.op0_register().size() >= 4;
                    idx = match (ins.mnemonic(), ins.op1_kind()) {
                        // mov r32, r32 / mov r64, r64 / movzx r, r8|r16
                        (Mnemonic::Mov, OpKind::Register)
                            if dst_ok && ins.op0_register().size() == ins.op1_register().size() =>
                        {
                            Idx::Reg(gpr_index(ins.op1_register())?)
                        }
                        (Mnemonic::Movzx, OpKind::Register) if dst_ok => {
                            Idx::Reg(gpr_index(ins.op1_register())?)
                        }
                        // mov r32, [mem] / mov r64, [mem]
                        (Mnemonic::Mov, OpKind::Memory) if dst_ok => mem_operand(&ins),
                        _ => return None,
                    };
                }
            }
            Idx::Mem(base, index, scale, disp) => {
                // The variable must not change between guard and load: no
                // call, no write to its address registers, no store other
                // than to the stack (pushes, spills).
                if matches!(self.insns[p].flow, Flow::Call(_) | Flow::IndirectCall) {
                    return None;
                }
                let written = self.gprs_written(p);
                // `lea index, [r + c]` between guard and load (GCC: `cmp
                // [rax+rdx*4+0x30], 4; lea rcx, [rdx+12]; ja ..; mov ecx,
                // [rax+rcx*4]`): the load's address is then
                // `[base + r*scale + disp + c*scale]`, the guard's operand.
                if let Some(n) = gpr_index(index)
                    && written == 1 << n
                    && ins.mnemonic() == Mnemonic::Lea
                    && ins.op0_kind() == OpKind::Register
                    && ins.op0_register().size() == 8
                    && ins.memory_index() == Register::None
                    && ins.memory_base().size() == 8
                    && gpr_index(ins.memory_base()).is_some_and(|r| r != n)
                    && gpr_index(base) != Some(n)
                {
                    let c = ins.memory_displacement64();
                    let idx = Idx::Mem(
                        base,
                        ins.memory_base(),
                        scale,
                        disp.wrapping_add(c.wrapping_mul(u64::from(scale))),
                    );
                    return self.guard_from(p, idx, bound, budget, on_path);
                }
                if [base, index]
                    .into_iter()
                    .filter_map(gpr_index)
                    .any(|n| written & (1 << n) != 0)
                {
                    return None;
                }
                let info = self.info.info(&ins);
                let writes_global = info.used_memory().iter().any(|m| {
                    matches!(
                        m.access(),
                        OpAccess::Write
                            | OpAccess::CondWrite
                            | OpAccess::ReadWrite
                            | OpAccess::ReadCondWrite
                    ) && m.base() != Register::RSP
                });
                if writes_global {
                    return None;
                }
            }
        }
        self.guard_from(p, idx, bound, budget, on_path)
    }

    /// All known predecessors of instruction `i`.
    fn all_preds(&self, i: usize) -> Vec<usize> {
        let mut v = Vec::new();
        if i > 0
            && self.reached[i - 1]
            && self.insns[i - 1].flow.falls_through()
            && !self.noreturn_calls.contains(&(i - 1))
        {
            v.push(i - 1);
        }
        if let Some(p) = self.branch_preds.get(&i) {
            for &p in p {
                if !v.contains(&p) {
                    v.push(p);
                }
            }
        }
        v
    }

    /// `T` if on every known path to instruction `from` (exclusive) the last
    /// write of GPR `reg` is `lea reg, [rip+T]` with the same `T` (a jump
    /// table base GCC hoisted out of a loop).
    fn reaching_rip_lea(&mut self, reg: usize, from: usize) -> Option<u64> {
        let mut seen = BTreeSet::new();
        let mut stack = self.all_preds(from);
        let mut found = None;
        while let Some(p) = stack.pop() {
            if !seen.insert(p) {
                continue;
            }
            if seen.len() > 4096 {
                return None;
            }
            if self.gprs_written(p) & (1 << reg) != 0 {
                let t = self.rip_lea(p)?;
                if found.is_some_and(|f| f != t) {
                    return None;
                }
                found = Some(t);
                continue;
            }
            if p == 0 {
                return None; // reaches the entry without a definition
            }
            let preds = self.all_preds(p);
            if preds.is_empty() {
                return None;
            }
            stack.extend(preds);
        }
        found
    }

    /// Without CFI: whether the unique path from the entry to instruction `j`
    /// leaves `rsp` where it was at entry (only `push`/`pop` and
    /// `add`/`sub rsp, imm` may touch it).
    fn stack_balanced_from_entry(&mut self, j: usize) -> bool {
        let mut height: i64 = 0;
        let mut i = j;
        for _ in 0..256 {
            if i == 0 {
                return height == 0;
            }
            let Some((p, _)) = self.unique_pred(i) else {
                return false;
            };
            if self.gprs_written(p) & RSP != 0 {
                let ins = self.insns[p].instr;
                let imm_rsp = ins.op0_kind() == OpKind::Register
                    && ins.op0_register() == Register::RSP
                    && is_immediate(ins.op1_kind());
                match ins.mnemonic() {
                    Mnemonic::Push | Mnemonic::Pop => {
                        height += i64::from(ins.stack_pointer_increment());
                    }
                    Mnemonic::Add if imm_rsp => height += ins.immediate(1) as i64,
                    Mnemonic::Sub if imm_rsp => height -= ins.immediate(1) as i64,
                    _ => return false,
                }
            }
            i = p;
        }
        false
    }

    /// An indirect `jmp reg` is taken as an indirect tail call when the frame
    /// is empty at the jump — per the CFI (CFA = rsp+8) or, without CFI, per
    /// [`Walker::stack_balanced_from_entry`] — and the register does not come
    /// from a table-shaped computation.
    fn is_indirect_tail_call(&mut self, j: usize) -> bool {
        let jmp = self.insns[j].instr;
        // `jmp reg`, or `jmp [reg+disp]` without an index register (a
        // function pointer loaded from a struct, vtable or dispatch table,
        // like libglvnd's `jmp *(%r11)` stubs); `jmp [T+idx*8]` is a jump
        // table's shape and stays with the table matcher.
        let reg = match jmp.op0_kind() {
            OpKind::Register => jmp.op0_register(),
            OpKind::Memory
                if jmp.memory_index() == Register::None
                    && jmp.memory_base() != Register::None
                    && jmp.memory_base() != Register::RIP =>
            {
                jmp.memory_base()
            }
            _ => return false,
        };
        let empty = match self.ctx.frame_is_empty_at(self.insns[j].addr) {
            Some(e) => e,
            None => self.stack_balanced_from_entry(j),
        };
        if !empty {
            return false;
        }
        let Some(r) = gpr_index(reg) else {
            return false;
        };
        match self.find_def(r, j) {
            None => true,
            Some(d) => {
                let def = self.insns[d].instr;
                let table_like = matches!(
                    def.mnemonic(),
                    Mnemonic::Add | Mnemonic::Movsxd | Mnemonic::Lea
                ) || (def.op1_kind() == OpKind::Memory
                    && def.memory_index() != Register::None);
                !table_like
            }
        }
    }

    /// Refuse functions whose reached code refers into their own range, or
    /// whose range has undecodable bytes between reached code.
    fn check_data_in_code(&self) -> Result<(), SkipReason> {
        let last_reached = self.reached.iter().rposition(|&r| r).unwrap_or(0);
        for (i, insn) in self.insns.iter().enumerate() {
            if self.reached[i] {
                let ins = &insn.instr;
                if ins.is_ip_rel_memory_operand() {
                    let a = ins.ip_rel_memory_address();
                    if a != self.func.start && self.func.contains(a) {
                        return Err(SkipReason::DataInCode {
                            insn: insn.addr,
                            addr: a,
                        });
                    }
                }
            } else if insn.flow == Flow::Invalid && i < last_reached {
                return Err(SkipReason::DataInCode {
                    insn: insn.addr,
                    addr: insn.addr,
                });
            }
        }
        Ok(())
    }

    /// Cut reached instructions into blocks and connect them.
    fn finish(self) -> Cfg {
        let insns = self.insns;
        let ends_block =
            |i: usize| !matches!(insns[i].flow, Flow::Next | Flow::Syscall | Flow::Interrupt);
        let mut blocks: Vec<Block> = Vec::new();
        let mut block_of = vec![usize::MAX; insns.len()];
        let mut i = 0;
        while i < insns.len() {
            if !self.reached[i] {
                i += 1;
                continue;
            }
            let start = i;
            loop {
                block_of[i] = blocks.len();
                let stop = ends_block(i)
                    || i + 1 >= insns.len()
                    || !self.reached[i + 1]
                    || self.leaders.contains(&(i + 1));
                i += 1;
                if stop {
                    break;
                }
            }
            blocks.push(Block {
                start: insns[start].addr,
                end: insns[i - 1].end(),
                insns: start..i,
            });
        }
        let mut edges = Vec::new();
        let mut exits = Vec::new();
        let mut calls = Vec::new();
        for (b, block) in blocks.iter().enumerate() {
            let last = block.insns.end - 1;
            let insn = insns[last];
            let mut out: Vec<(usize, EdgeKind)> = Vec::new();
            let next_block =
                (last + 1 < insns.len() && self.reached[last + 1]).then(|| block_of[last + 1]);
            for k in block.insns.clone() {
                if matches!(insns[k].flow, Flow::Call(_) | Flow::IndirectCall) {
                    calls.push(CallSite {
                        insn: insns[k].addr,
                        target: insns[k].flow.target(),
                    });
                }
            }
            match insn.flow {
                Flow::Next | Flow::Syscall | Flow::Interrupt => {
                    if let Some(n) = next_block {
                        out.push((n, EdgeKind::FallThrough));
                    }
                }
                Flow::CondJump(t) => {
                    if let Ok(ti) = insns.binary_search_by_key(&t, |x| x.addr)
                        && self.func.contains(t)
                    {
                        out.push((block_of[ti], EdgeKind::Taken));
                    }
                    if let Some(n) = next_block {
                        out.push((n, EdgeKind::NotTaken));
                    }
                }
                Flow::Jump(t) => {
                    if let Ok(ti) = insns.binary_search_by_key(&t, |x| x.addr)
                        && self.func.contains(t)
                    {
                        out.push((block_of[ti], EdgeKind::Jump));
                    }
                }
                Flow::IndirectJump => {
                    if let Some(table) = self.tables.get(&last) {
                        let targets: BTreeSet<u64> = table
                            .targets
                            .iter()
                            .copied()
                            .filter(|&t| self.func.contains(t))
                            .collect();
                        for t in targets {
                            let ti = insns
                                .binary_search_by_key(&t, |x| x.addr)
                                .expect("table targets are instruction boundaries");
                            out.push((block_of[ti], EdgeKind::JumpTable));
                        }
                    }
                }
                Flow::Call(_) | Flow::IndirectCall => {
                    if !self.noreturn_calls.contains(&last)
                        && let Some(n) = next_block
                    {
                        out.push((n, EdgeKind::CallFallThrough));
                    }
                }
                Flow::Ret | Flow::Trap | Flow::Unsupported | Flow::Invalid => {}
            }
            let mut seen = BTreeSet::new();
            for (to, kind) in out {
                if seen.insert(to) {
                    edges.push(Edge { from: b, to, kind });
                }
            }
            if let Some(kinds) = self.exits.get(&last) {
                for &kind in kinds {
                    exits.push(Exit {
                        block: b,
                        insn: insn.addr,
                        kind,
                    });
                }
            }
        }
        Cfg {
            function: self.func.start,
            blocks,
            edges,
            exits,
            jump_tables: self.tables.into_values().collect(),
            calls,
        }
    }
}

// ---------------------------------------------------------------------------
// Liveness

/// The memory operand of `ins` as an [`Idx::Mem`].
fn mem_operand(ins: &iced_x86::Instruction) -> Idx {
    if ins.is_ip_rel_memory_operand() {
        Idx::Mem(
            Register::RIP,
            Register::None,
            0,
            ins.ip_rel_memory_address(),
        )
    } else {
        Idx::Mem(
            ins.memory_base(),
            ins.memory_index(),
            ins.memory_index_scale(),
            ins.memory_displacement64(),
        )
    }
}

fn is_immediate(k: OpKind) -> bool {
    matches!(
        k,
        OpKind::Immediate8
            | OpKind::Immediate8to16
            | OpKind::Immediate16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32
            | OpKind::Immediate32to64
    )
}

/// GPR index (0 = rax ... 15 = r15, iced's order: rax rcx rdx rbx rsp rbp rsi
/// rdi r8..r15) of any-width general-purpose register.
fn gpr_index(r: Register) -> Option<usize> {
    if !r.is_gpr() {
        return None;
    }
    let full = r.full_register();
    full.is_gpr64()
        .then(|| full as usize - Register::RAX as usize)
}

const RAX: u16 = 1 << 0;
const RCX: u16 = 1 << 1;
const RDX: u16 = 1 << 2;
const RBX: u16 = 1 << 3;
const RSP: u16 = 1 << 4;
const RBP: u16 = 1 << 5;
const RSI: u16 = 1 << 6;
const RDI: u16 = 1 << 7;
const R8: u16 = 1 << 8;
const R9: u16 = 1 << 9;
const R10: u16 = 1 << 10;
const R11: u16 = 1 << 11;
const R12: u16 = 1 << 12;
const R13: u16 = 1 << 13;
const R14: u16 = 1 << 14;
const R15: u16 = 1 << 15;

/// SysV argument registers (plus `rax`, the vector-register count of
/// variadic calls).
const ARGS: u16 = RDI | RSI | RDX | RCX | R8 | R9 | RAX;
/// SysV caller-saved GPRs.
const CALLER_SAVED: u16 = RAX | RCX | RDX | RSI | RDI | R8 | R9 | R10 | R11;
/// SysV callee-saved GPRs (and `rsp`).
const CALLEE_SAVED: u16 = RBX | RBP | R12 | R13 | R14 | R15 | RSP;

/// Status flags and DF as bits of [`LiveSet::flags`].
pub mod flag {
    /// Carry.
    pub const CF: u8 = 1 << 0;
    /// Parity.
    pub const PF: u8 = 1 << 1;
    /// Adjust.
    pub const AF: u8 = 1 << 2;
    /// Zero.
    pub const ZF: u8 = 1 << 3;
    /// Sign.
    pub const SF: u8 = 1 << 4;
    /// Overflow.
    pub const OF: u8 = 1 << 5;
    /// Direction.
    pub const DF: u8 = 1 << 6;
    /// The six status flags (what `add`/`sub`/`cmp` write).
    pub const STATUS: u8 = CF | PF | AF | ZF | SF | OF;
    /// All tracked flags.
    pub const ALL: u8 = STATUS | DF;
}

/// Registers and flags live at a point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LiveSet {
    /// Bit `n` = GPR `n` (rax rcx rdx rbx rsp rbp rsi rdi r8..r15).
    pub regs: u16,
    /// [`flag`] bits.
    pub flags: u8,
}

impl LiveSet {
    /// Everything live (the conservative answer).
    pub const ALL: LiveSet = LiveSet {
        regs: u16::MAX,
        flags: flag::ALL,
    };

    /// Whether GPR `reg` (any width) is live.
    pub fn reg_live(&self, reg: Register) -> bool {
        gpr_index(reg).is_some_and(|n| self.regs & (1 << n) != 0)
    }

    /// Whether any of the six status flags is live (instrumentation that
    /// clobbers them must save them here).
    pub fn status_flags_live(&self) -> bool {
        self.flags & flag::STATUS != 0
    }

    fn union(self, o: LiveSet) -> LiveSet {
        LiveSet {
            regs: self.regs | o.regs,
            flags: self.flags | o.flags,
        }
    }
}

fn iced_flags(bits: u32) -> u8 {
    let mut f = 0;
    for (iced, ours) in [
        (RflagsBits::CF, flag::CF),
        (RflagsBits::PF, flag::PF),
        (RflagsBits::AF, flag::AF),
        (RflagsBits::ZF, flag::ZF),
        (RflagsBits::SF, flag::SF),
        (RflagsBits::OF, flag::OF),
        (RflagsBits::DF, flag::DF),
    ] {
        if bits & iced != 0 {
            f |= ours;
        }
    }
    f
}

/// Uses and definitions of one instruction.
#[derive(Clone, Copy, Default)]
struct UseDef {
    use_: LiveSet,
    def: LiveSet,
}

fn use_def(insn: &Insn, factory: &mut InstructionInfoFactory, noreturn_call: bool) -> UseDef {
    let ins = &insn.instr;
    let mut ud = UseDef::default();
    match insn.flow {
        Flow::Call(_) | Flow::IndirectCall => {
            // SysV: arguments (and rsp) used; caller-saved and flags clobbered.
            ud.use_.regs = ARGS | RSP;
            ud.use_.flags = flag::DF;
            if !noreturn_call {
                ud.def.regs = CALLER_SAVED;
                ud.def.flags = flag::STATUS;
            }
        }
        Flow::Syscall => {
            ud.use_.regs = RAX | RDI | RSI | RDX | R10 | R8 | R9 | RSP;
            ud.def.regs = RAX | RCX | R11;
        }
        _ => {}
    }
    let info = factory.info(ins);
    for r in info.used_registers() {
        let Some(n) = gpr_index(r.register()) else {
            continue;
        };
        let bit = 1u16 << n;
        let size = r.register().size();
        match r.access() {
            OpAccess::Read | OpAccess::CondRead => ud.use_.regs |= bit,
            OpAccess::ReadWrite | OpAccess::ReadCondWrite => ud.use_.regs |= bit,
            // A 32/64-bit write defines the whole register; an 8/16-bit
            // write merges into the old value, which is thus used.
            OpAccess::Write if size >= 4 => ud.def.regs |= bit,
            OpAccess::Write | OpAccess::CondWrite => ud.use_.regs |= bit,
            OpAccess::None | OpAccess::NoMemAccess => {}
        }
    }
    for m in info.used_memory() {
        for r in [m.base(), m.index()] {
            if let Some(n) = gpr_index(r) {
                ud.use_.regs |= 1 << n;
            }
        }
    }
    ud.use_.flags |= iced_flags(ins.rflags_read());
    // Shifts and rotates by a count that may be zero leave the flags alone:
    // they do not kill them.
    let count_may_be_zero = matches!(
        ins.mnemonic(),
        Mnemonic::Shl
            | Mnemonic::Sal
            | Mnemonic::Shr
            | Mnemonic::Sar
            | Mnemonic::Rol
            | Mnemonic::Ror
            | Mnemonic::Rcl
            | Mnemonic::Rcr
            | Mnemonic::Shld
            | Mnemonic::Shrd
    ) && (0..ins.op_count()).any(|k| {
        ins.op_kind(k) == OpKind::Register && ins.op_register(k) == Register::CL
            || matches!(ins.op_kind(k), OpKind::Immediate8) && ins.immediate(k) & 0x3f == 0
    });
    if !count_may_be_zero {
        ud.def.flags |= iced_flags(ins.rflags_modified());
    } else {
        ud.use_.flags |= iced_flags(ins.rflags_modified());
    }
    // A def that is also a use stays live (transfer is use | (out - def)).
    ud
}

/// What is live after leaving the function through `kind` (SysV ABI).
fn exit_live(kind: ExitKind) -> LiveSet {
    match kind {
        ExitKind::Return => LiveSet {
            regs: RAX | RDX | CALLEE_SAVED,
            flags: flag::DF,
        },
        ExitKind::TailCall { .. } | ExitKind::IndirectTailCall => LiveSet {
            regs: ARGS | CALLEE_SAVED,
            flags: flag::DF,
        },
        ExitKind::NoReturnCall { .. } => LiveSet::default(),
        ExitKind::Trap | ExitKind::ColdJump { .. } => LiveSet::ALL,
    }
}

/// Register and flags liveness: for each instruction of `insns` (the slice
/// the CFG was built from), the set live *before* it.
///
/// Backward dataflow over the CFG's blocks and edges. Registers are the 16
/// GPRs at full width (a partial write is a read-modify-write); flags are
/// tracked one by one. Calls use the SysV argument registers and clobber the
/// caller-saved ones and the status flags; exits keep `rax`/`rdx` and the
/// callee-saved registers live on return, the argument registers on tail
/// calls, everything at traps and cold-part jumps. Instructions not in any
/// block get [`LiveSet::ALL`].
///
/// The rewriter uses this to put instrumentation where the status flags are
/// dead, so that it need not save them (the "check" of Hirzel & Chilimbi's
/// Figure 3 is a decrement and a conditional branch, which clobbers them).
pub fn liveness(cfg: &Cfg, insns: &[Insn]) -> Vec<LiveSet> {
    let mut factory = InstructionInfoFactory::new();
    let noreturn_insns: BTreeSet<u64> = cfg
        .exits
        .iter()
        .filter(|e| matches!(e.kind, ExitKind::NoReturnCall { .. }))
        .map(|e| e.insn)
        .collect();
    let ud: Vec<UseDef> = insns
        .iter()
        .map(|i| use_def(i, &mut factory, noreturn_insns.contains(&i.addr)))
        .collect();
    let n = cfg.blocks.len();
    let mut succs = vec![Vec::new(); n];
    for e in &cfg.edges {
        succs[e.from].push(e.to);
    }
    let mut exit_out = vec![LiveSet::default(); n];
    for e in &cfg.exits {
        exit_out[e.block] = exit_out[e.block].union(exit_live(e.kind));
    }
    let transfer = |block: &Block, mut live: LiveSet, out: Option<&mut [LiveSet]>| {
        let mut out = out;
        for k in block.insns.clone().rev() {
            let u = ud[k];
            live = LiveSet {
                regs: (live.regs & !u.def.regs) | u.use_.regs,
                flags: (live.flags & !u.def.flags) | u.use_.flags,
            };
            if let Some(o) = out.as_deref_mut() {
                o[k] = live;
            }
        }
        live
    };
    let mut live_in = vec![LiveSet::default(); n];
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..n).rev() {
            let mut out = exit_out[b];
            for &s in &succs[b] {
                out = out.union(live_in[s]);
            }
            let inn = transfer(&cfg.blocks[b], out, None);
            if inn != live_in[b] {
                live_in[b] = inn;
                changed = true;
            }
        }
    }
    let mut result = vec![LiveSet::ALL; insns.len()];
    for (b, block) in cfg.blocks.iter().enumerate() {
        let mut out = exit_out[b];
        for &s in &succs[b] {
            out = out.union(live_in[s]);
        }
        transfer(block, out, Some(&mut result));
    }
    result
}

// ---------------------------------------------------------------------------
// Whole-file driver

/// The analysis of a whole file.
pub struct Analysis {
    /// Every function, as [`crate::analysis::functions::discover`] found them.
    pub functions: Vec<Function>,
    /// The linear sweep of each function.
    pub insns: Vec<Vec<Insn>>,
    /// The CFG of each function, or why it was skipped.
    pub cfgs: Vec<Result<Cfg, SkipReason>>,
    /// Starts of the functions known or inferred not to return.
    pub noreturn: Vec<u64>,
}

impl Analysis {
    /// `(analysable, total)` over the non-PLT functions.
    pub fn coverage(&self) -> (usize, usize) {
        let mut ok = 0;
        let mut total = 0;
        for (f, c) in self.functions.iter().zip(&self.cfgs) {
            if f.kind == FunctionKind::Plt {
                continue;
            }
            total += 1;
            ok += usize::from(c.is_ok());
        }
        (ok, total)
    }

    /// How many functions were skipped for each kind of reason (the variant
    /// name), sorted by name.
    pub fn skip_histogram(&self) -> BTreeMap<String, usize> {
        let mut h = BTreeMap::new();
        for c in self.cfgs.iter().filter_map(|c| c.as_ref().err()) {
            let name = format!("{c:?}");
            let name = name
                .split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_string();
            *h.entry(name).or_insert(0) += 1;
        }
        h
    }

    /// The index of the function named `name` (or with that alias).
    pub fn function(&self, name: &str) -> Option<usize> {
        self.functions
            .iter()
            .position(|f| f.name == name || f.aliases.iter().any(|a| a == name))
    }
}

/// Discover, decode and build the CFG of every function of the ELF file
/// `data`, with noreturn inference.
pub fn analyse(file: &object::File, data: &[u8]) -> Result<Analysis, FunctionsError> {
    let functions = crate::analysis::functions::discover(file, data)?;
    let mut ctx = CfgContext::new(file, &functions);
    let insns: Vec<Vec<Insn>> = functions.iter().map(|f| ctx.decode(f)).collect();
    ctx.infer_noreturn(&functions, &insns);
    let cfgs = functions
        .iter()
        .zip(&insns)
        .map(|(f, i)| build_cfg(f, i, &ctx))
        .collect();
    let noreturn = ctx.noreturn_functions().collect();
    Ok(Analysis {
        functions,
        insns,
        cfgs,
        noreturn,
    })
}
