//! Per-function control-flow graphs, jump tables, skip reasons and
//! register/flags liveness.
//!
//! You give it a [`Function`], the linear sweep of its bytes
//! (`disasm::decode`) and a [`CfgContext`] (every function start,
//! the bytes of the file's sections, which functions never return);
//! `build_cfg` returns the function's [`Cfg`] — basic blocks, typed edges,
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
//! C++ landing pads (read from the LSDAs, `landing_pads.rs`) are roots of
//! the part that holds them, like the targets of `.cold` jumps: the
//! unwinder enters there. Calls in the clones push original return
//! addresses, so the unwinder finds each frame's original FDE and
//! call-site table and computes the original landing pad; when the
//! unwinder itself is cloned, its final jump ([`ExitKind::ContextJump`])
//! looks that address up and continues in the landing pad's clone.
//!
//! Noreturn functions: a fixed list of names (`abort`, `exit`,
//! `__stack_chk_fail`, ...; see `KNOWN_NORETURN`), matched on symbol and PLT
//! names, plus every function whose exits are all noreturn, found by the
//! fixpoint `CfgContext::infer_noreturn`.
//!
//! ## Non-goals
//!
//! No indirect jumps other than
//! the GCC table shapes, dispatch over the code pointers the binary states
//! (computed gotos), GOT tail calls and jumps to another frame
//! ([`ExitKind::ContextJump`]), no resynchronising a linear sweep that data desynchronised
//! (those are skip reasons), no interprocedural liveness (calls are modelled
//! by the SysV ABI).
//!
//! ## Files
//!
//! - `mod.rs`: the CFG's types ([`Cfg`], [`Block`], [`Edge`], [`Exit`],
//!   [`SkipReason`], ...) and the whole-file driver ([`analyse`]);
//! - `context.rs`: [`CfgContext`], what the walk needs beyond one function
//!   (section bytes, function ranges, `.eh_frame`);
//! - `noreturn.rs`: known and inferred noreturn functions;
//! - `build.rs`: `build_cfg`, the recursive walk and the cut into blocks;
//! - `jump_tables.rs`: GCC switch tables and their bound-check guards;
//! - `tail_calls.rs`: how control leaves the function other than by `ret`
//!   (tail calls, `.cold` jumps, indirect tail calls, jumps to another
//!   frame);
//! - `landing_pads.rs`: C++ landing pads from the LSDAs;
//! - `liveness.rs`: register and flags liveness ([`liveness`]).

mod build;
mod context;
mod jump_tables;
mod landing_pads;
mod liveness;
mod noreturn;
mod tail_calls;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use serde::Serialize;

use crate::analysis::disasm::Insn;
use crate::analysis::functions::{Function, FunctionKind, FunctionsError};

use build::build_cfg;
pub use context::CfgContext;
pub(crate) use context::{EhFrameInfo, parse_eh_frame};
pub use liveness::{LiveSet, flag, liveness};
use noreturn::is_known_noreturn;

/// Why a function was left out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize, thiserror::Error)]
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
}

/// The kind of an intra-function edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Block {
    /// SVMA of the first instruction.
    pub start: u64,
    /// SVMA just past the last instruction.
    end: u64,
    /// Indices into the function's instruction slice.
    pub insns: Range<usize>,
}

/// An edge between two blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Edge {
    /// Source block index.
    pub from: usize,
    /// Target block index.
    pub to: usize,
    /// Why control goes there.
    pub kind: EdgeKind,
}

/// How control leaves the function from a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
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
    /// An indirect jump to another frame, after `rsp` was loaded from a
    /// computed value: the unwinder's `__builtin_eh_return` into a landing
    /// pad, `longjmp`. The clone looks the target up among every
    /// rewritten instruction at run time (as the signal handler does when
    /// it starts a burst), or leaves the burst there.
    ContextJump,
}

/// One way out of the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Exit {
    /// The block it leaves from.
    pub block: usize,
    /// SVMA of the instruction that leaves.
    pub insn: u64,
    /// How.
    pub kind: ExitKind,
}

/// Entry format of a [`JumpTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum JumpTableKind {
    /// `lea rB,[rip+T]; movsxd rX,[rB+idx*4]; add rX,rB; jmp rX`: entries are
    /// signed 32-bit offsets from `T` (GCC with `-fPIC`/`-fpie`).
    PicRelative32,
    /// `jmp [T+idx*8]` or `mov rX,[T+idx*8]; jmp rX`: entries are absolute
    /// 64-bit addresses (GCC without PIC).
    Absolute64,
    /// No table the analysis recognises (a computed `goto *p`, or a switch
    /// table of an unknown shape): the targets are every address inside the
    /// function that the file stores as a code pointer or that the function
    /// takes with a RIP-relative `lea`. A jump anywhere else leaves the
    /// clones at run time (the dispatch compares the actual target with
    /// each of these). Path numbering cuts these edges: the jump ends a
    /// path, each target starts one.
    CodePointers,
}

/// A recovered switch jump table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct JumpTable {
    /// SVMA of the indirect `jmp`.
    pub jump: u64,
    /// SVMA of the table.
    table: u64,
    /// Entry format.
    pub kind: JumpTableKind,
    /// One target per entry (`entries = targets.len()`, bounded by the guard).
    pub targets: Vec<u64>,
}

/// A call site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CallSite {
    /// SVMA of the call instruction.
    insn: u64,
    /// Direct target.
    pub target: Option<u64>,
}

/// A function's control-flow graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
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
    /// Blocks (ascending, never 0) entered from outside the function: the
    /// roots given to the walk (see `build_cfg`).
    pub extra_entries: Vec<usize>,
}

impl Cfg {
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

    /// The loops path numbering and the checks are placed by:
    /// [`graph::loops`](crate::analysis::graph::loops), with every edge out
    /// of a [`JumpTableKind::CodePointers`] dispatch added to the cut
    /// edges (`retreating_non_back`): such a jump ends a path and each
    /// target starts one (so an interpreter's dispatch loop has one short
    /// path per handler and successor, not one per sequence of handlers),
    /// and each gets a burst check (the dispatch is the interpreter's loop).
    ///
    /// With extra entries, the loops are those of the graph with a virtual
    /// root before the entry and every extra entry (what dominates a block
    /// must dominate it from each way in); the root has no predecessors,
    /// so none of its edges is cut, and it is dropped.
    pub fn loops(&self) -> crate::analysis::graph::Loops {
        let mut g = self.to_graph();
        if !g.extra_entries.is_empty() {
            let root = g.len();
            let out: Vec<usize> = std::iter::once(g.entry)
                .chain(g.extra_entries.drain(..))
                .collect();
            g.succs.push(out);
            g.entry = root;
        }
        let dom = crate::analysis::graph::dominators(&g);
        let mut loops = crate::analysis::graph::loops(&g, &dom);
        let mut extra = Vec::new();
        for jt in self
            .jump_tables
            .iter()
            .filter(|t| t.kind == JumpTableKind::CodePointers)
        {
            let Some(b) = self.block_at(jt.jump) else {
                continue;
            };
            let n = self.edges.iter().filter(|e| e.from == b).count();
            extra.extend((0..n).map(|i| (b, i)));
        }
        // `back_edges` is sorted; so is `retreating_non_back` after this.
        extra.retain(|e| loops.back_edges.binary_search(e).is_err());
        loops.retreating_non_back.extend(extra);
        loops.retreating_non_back.sort_unstable();
        loops.retreating_non_back.dedup();
        loops
    }

    /// The shape of the CFG for [`graph`](crate::analysis::graph): nodes are
    /// block indices, `succs` in edge order, exits = blocks with an [`Exit`]
    /// (deduplicated, ascending).
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
            extra_entries: self.extra_entries.clone(),
        }
    }
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
    /// The family of each function: the lowest index among the parts of
    /// the same function (a function and its `.cold` parts); its own
    /// index for most.
    pub families: Vec<usize>,
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
    let none = BTreeSet::new();
    // Landing pads are entered from outside (by the unwinder): roots of
    // the part that holds them. A part whose CFG fails with them keeps the
    // CFG it has without (exceptions landing there then leave the clones).
    let pads = landing_pads::landing_pads(&ctx);
    let mut roots: Vec<BTreeSet<u64>> = functions
        .iter()
        .map(|f| {
            if f.kind == FunctionKind::Plt {
                return BTreeSet::new();
            }
            let lo = pads.partition_point(|&p| p <= f.start);
            let hi = pads.partition_point(|&p| p < f.end());
            pads[lo..hi.max(lo)].iter().copied().collect()
        })
        .collect();
    let mut cfgs: Vec<Result<Cfg, SkipReason>> = functions
        .iter()
        .zip(&insns)
        .zip(&mut roots)
        .map(|((f, i), r)| {
            if r.is_empty() {
                return build_cfg(f, i, &ctx, &none);
            }
            build_cfg(f, i, &ctx, r).or_else(|_| {
                r.clear();
                build_cfg(f, i, &ctx, &none)
            })
        })
        .collect();
    let families = connect_parts(&functions, &insns, &ctx, &mut cfgs, roots);
    let noreturn = ctx.noreturn_functions().collect();
    Ok(Analysis {
        functions,
        insns,
        cfgs,
        noreturn,
        families,
    })
}

/// The parts of one function in the compiler's sense (a function and its
/// `.cold` part, named or not) jump into each other's middle
/// ([`ExitKind::ColdJump`]). Rebuilds the CFG of every part that is
/// entered that way with those targets as roots (so the clones can
/// continue there: see `build_cfg`), until no new target appears, and
/// returns each function's family: the lowest index of the parts
/// connected by such jumps (or by a `.cold` name). A part whose CFG fails
/// with its roots keeps the CFG it had without them (its entries from
/// outside then leave the clones, as before). `roots` are each part's
/// roots so far (its landing pads).
fn connect_parts(
    functions: &[Function],
    insns: &[Vec<Insn>],
    ctx: &CfgContext,
    cfgs: &mut [Result<Cfg, SkipReason>],
    mut roots: Vec<BTreeSet<u64>>,
) -> Vec<usize> {
    let n = functions.len();
    let mut ranges: Vec<(u64, u64, usize)> = functions
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind != FunctionKind::Plt)
        .map(|(i, f)| (f.start, f.end(), i))
        .collect();
    ranges.sort_unstable();
    let containing = |a: u64| -> Option<usize> {
        let k = ranges.partition_point(|r| r.0 <= a);
        ranges[..k]
            .iter()
            .rev()
            .take(8)
            .find(|r| a < r.1)
            .map(|r| r.2)
    };
    let mut family: Vec<usize> = (0..n).collect();
    fn find(f: &mut [usize], mut i: usize) -> usize {
        while f[i] != i {
            f[i] = f[f[i]];
            i = f[i];
        }
        i
    }
    fn union(f: &mut [usize], a: usize, b: usize) {
        let (ra, rb) = (find(f, a), find(f, b));
        f[ra.max(rb)] = ra.min(rb);
    }
    for (i, f) in functions.iter().enumerate() {
        if let FunctionKind::ColdPart { parent: Some(p) } = f.kind {
            union(&mut family, i, p);
        }
    }
    // Parts whose roots all lie in code their CFG already reaches (a
    // parent's join points, mostly) gain no new exits from them: they are
    // rebuilt once, at the end, with all their roots; parts with a root in
    // code not reached yet (a cold part's later fragments) at once, since
    // what they reach may jump elsewhere. Bounded all the same.
    let mut stale: BTreeSet<usize> = BTreeSet::new();
    let rebuild = |cfgs: &mut [Result<Cfg, SkipReason>], j: usize, roots: &BTreeSet<u64>| {
        let with = build_cfg(&functions[j], &insns[j], ctx, roots);
        if with.is_ok() || cfgs[j].is_err() {
            cfgs[j] = with;
        }
    };
    for _ in 0..16 {
        let mut wanted: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
        for (i, c) in cfgs.iter().enumerate() {
            let Ok(c) = c else { continue };
            for e in &c.exits {
                let ExitKind::ColdJump { target } = e.kind else {
                    continue;
                };
                let Some(j) = containing(target).filter(|&j| j != i) else {
                    continue;
                };
                union(&mut family, i, j);
                if target != functions[j].start && !roots[j].contains(&target) {
                    wanted.entry(j).or_default().insert(target);
                }
            }
        }
        if wanted.is_empty() {
            break;
        }
        for (j, new) in wanted {
            let reached = cfgs[j]
                .as_ref()
                .is_ok_and(|c| new.iter().all(|&t| c.block_at(t).is_some()));
            roots[j].extend(new);
            if reached {
                stale.insert(j);
            } else {
                rebuild(cfgs, j, &roots[j]);
                stale.remove(&j);
            }
        }
    }
    for j in stale {
        rebuild(cfgs, j, &roots[j]);
    }
    (0..n).map(|i| find(&mut family, i)).collect()
}
