//! The CFG's types: [`Cfg`] and its [`Block`]s, [`Edge`]s, [`Exit`]s,
//! [`JumpTable`]s and [`CallSite`]s, and why a function has none
//! ([`SkipReason`]).

use std::collections::BTreeSet;
use std::ops::Range;

use serde::Serialize;

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
    pub(super) end: u64,
    /// Indices into the function's instruction slice.
    pub insns: Range<usize>,
    /// What it costs in the original code, in quarter cycles
    /// ([`crate::analysis::cost::block_cost`]).
    pub cost: u32,
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
    pub(super) table: u64,
    /// Entry format.
    pub kind: JumpTableKind,
    /// One target per entry (`entries = targets.len()`, bounded by the guard).
    pub targets: Vec<u64>,
}

/// A call site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CallSite {
    /// SVMA of the call instruction.
    pub(super) insn: u64,
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
