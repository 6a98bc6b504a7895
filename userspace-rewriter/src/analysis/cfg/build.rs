//! [`build_cfg`]: control flow followed recursively from the entry over the
//! linear sweep, cut into basic blocks and typed edges (see the module docs
//! of [`super`]). This is the CFG on which Hirzel & Chilimbi's checks are
//! placed (procedure entries, loop back edges) and Ball-Larus paths are
//! numbered; anything the walk cannot prove it handles is a [`SkipReason`].
//!
//! The [`Walker`] is shared with `jump_tables.rs` (indirect jumps resolved
//! as switch tables) and `tail_calls.rs` (transfers out of the function),
//! which add their own `impl Walker` blocks.

use std::collections::{BTreeMap, BTreeSet};

use iced_x86::InstructionInfoFactory;

use super::context::CfgContext;
use super::liveness::{CALLER_SAVED, gpr_index};
use super::types::{
    Block, CallSite, Cfg, Edge, EdgeKind, Exit, ExitKind, JumpTable, JumpTableKind, SkipReason,
};
use crate::analysis::disasm::{Flow, Insn};
use crate::analysis::functions::Function;

/// How a backward walk reached an instruction from its successor.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    FallThrough,
    Taken,
}

/// Working state of [`build_cfg`].
pub(super) struct Walker<'a, 'data> {
    pub(super) func: &'a Function,
    pub(super) insns: &'a [Insn],
    pub(super) ctx: &'a CfgContext<'data>,
    pub(super) reached: Vec<bool>,
    pub(super) leaders: BTreeSet<usize>,
    /// Branch sources of each intra-function target (insn index -> sources).
    pub(super) branch_preds: BTreeMap<usize, Vec<usize>>,
    /// Exits keyed by instruction index.
    pub(super) exits: BTreeMap<usize, Vec<ExitKind>>,
    /// Instructions after which the fall-through is dead (noreturn calls).
    pub(super) noreturn_calls: BTreeSet<usize>,
    pub(super) tables: BTreeMap<usize, JumpTable>,
    pub(super) pending: BTreeSet<usize>,
    pub(super) bad_targets: Vec<(usize, u64)>,
    pub(super) work: Vec<usize>,
    pub(super) info: InstructionInfoFactory,
    /// Instructions entered from outside the function besides its start
    /// (see [`build_cfg`]): they have predecessors the walk cannot see.
    pub(super) roots: BTreeSet<usize>,
}

/// Build the CFG of `func` from its linear sweep `insns` (see the module docs).
///
/// Returns the [`Cfg`], or the first [`SkipReason`] found (deterministic:
/// the walk order is fixed).
///
/// `roots` are addresses where control enters from outside besides the
/// start: where the function's `.cold` part jumps back into it, or where
/// the function jumps into the middle of its `.cold` part (one part of a
/// family, see [`super::analyse`]). The walk starts there too; what it
/// reaches only from them is part of the CFG, and they are its
/// [`Cfg::extra_entries`]. Any other predecessor may precede them, so the
/// backward walks (switch guards, table bases) stop there as at the start.
/// A root that is not an instruction boundary of the linear sweep is
/// ignored.
pub(crate) fn build_cfg(
    func: &Function,
    insns: &[Insn],
    ctx: &CfgContext,
    roots: &BTreeSet<u64>,
) -> Result<Cfg, SkipReason> {
    if insns.first().map(|i| i.addr) != Some(func.start) {
        return Err(SkipReason::NoBytes);
    }
    let roots: BTreeSet<usize> = roots
        .iter()
        .filter_map(|&a| insns.binary_search_by_key(&a, |i| i.addr).ok())
        .filter(|&i| i != 0)
        .collect();
    let mut w = Walker {
        func,
        insns,
        ctx,
        reached: vec![false; insns.len()],
        leaders: roots.iter().copied().chain([0]).collect(),
        branch_preds: BTreeMap::new(),
        exits: BTreeMap::new(),
        noreturn_calls: BTreeSet::new(),
        tables: BTreeMap::new(),
        pending: BTreeSet::new(),
        bad_targets: Vec::new(),
        work: roots.iter().copied().chain([0]).collect(),
        info: InstructionInfoFactory::new(),
        roots,
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
                        // A case GCC moved to the `.cold` part. Stripped,
                        // a cold part that starts with the case is an FDE
                        // range of its own, so the target looks like a
                        // function start; a switch's case is never
                        // another function, so it is that part.
                        None => match w.external(j, t) {
                            Ok(kind @ ExitKind::ColdJump { .. }) => w.add_exit(j, kind),
                            Ok(ExitKind::TailCall { target }) if w.ctx.is_unnamed_start(target) => {
                                w.add_exit(j, ExitKind::ColdJump { target })
                            }
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
    // Unexplained jumps in a function whose label addresses are stored or
    // taken (computed gotos): dispatch over those. This comes before the
    // tail-call test, which a frameless interpreter loop would pass (its
    // jumps leave an empty frame); a jump that really is a tail call does
    // reach none of the labels, and leaves the clones at run time.
    w.dispatch_over_code_pointers()?;
    // What is left may be an indirect tail call through a function pointer.
    let left: Vec<usize> = w.pending.iter().copied().collect();
    for j in left {
        if w.is_indirect_tail_call(j) {
            w.pending.remove(&j);
            w.add_exit(j, ExitKind::IndirectTailCall);
        } else if w.is_context_jump(j) {
            w.pending.remove(&j);
            w.add_exit(j, ExitKind::ContextJump);
        }
    }
    if let Some(&j) = w.pending.iter().next() {
        return Err(SkipReason::UnresolvedIndirectJump {
            addr: insns[j].addr,
        });
    }
    // Re-check every table with the final predecessor sets: a path found
    // later must not bypass the guard.
    let js: Vec<usize> = w
        .tables
        .iter()
        .filter(|(_, t)| t.kind != JumpTableKind::CodePointers)
        .map(|(&j, _)| j)
        .collect();
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
    /// Gives every pending indirect jump the function's code pointers as
    /// targets ([`JumpTableKind::CodePointers`]), walks what they reach, and
    /// repeats for jumps found there (after trying them as switch tables)
    /// and for labels taken in code reached only then, until nothing new is
    /// found. Targets that are not instruction boundaries are dropped (a
    /// stored address is not necessarily a jump target). Without any
    /// candidate the jumps stay pending.
    ///
    /// The candidates need not be exact: at run time the clone's dispatch
    /// compares the actual target with them, and one that is not among
    /// them leaves the burst at the original target. A candidate that is
    /// no real target only starts a block.
    fn dispatch_over_code_pointers(&mut self) -> Result<(), SkipReason> {
        let mut known: BTreeSet<u64> = BTreeSet::new();
        let mut dispatches: BTreeSet<usize> = BTreeSet::new();
        loop {
            let targets = self.code_pointer_targets();
            let new: Vec<(u64, usize)> = targets
                .iter()
                .filter(|(t, _)| !known.contains(t))
                .copied()
                .collect();
            let pending: Vec<usize> = std::mem::take(&mut self.pending).into_iter().collect();
            if targets.is_empty() || (new.is_empty() && pending.is_empty()) {
                self.pending.extend(pending);
                return Ok(());
            }
            dispatches.extend(pending.iter().copied());
            known.extend(targets.iter().map(|&(t, _)| t));
            for &j in &dispatches {
                self.tables.insert(
                    j,
                    JumpTable {
                        jump: self.insns[j].addr,
                        table: 0,
                        kind: JumpTableKind::CodePointers,
                        targets: targets.iter().map(|&(t, _)| t).collect(),
                    },
                );
                let fresh = if pending.contains(&j) { &targets } else { &new };
                for &(_, ti) in fresh {
                    self.leaders.insert(ti);
                    self.branch_preds.entry(ti).or_default().push(j);
                    self.work.push(ti);
                }
            }
            self.drain()?;
            // Jumps reached only now: switch tables, or more of the same.
            let left: Vec<usize> = self.pending.iter().copied().collect();
            for j in left {
                if let Some(table) = self.match_jump_table(j)?
                    && table.targets.iter().all(|&t| self.func.contains(t))
                {
                    self.pending.remove(&j);
                    for &t in &table.targets {
                        if let Some(Some(ti)) = self.intra_index(j, t) {
                            self.leaders.insert(ti);
                            self.branch_preds.entry(ti).or_default().push(j);
                            self.work.push(ti);
                        }
                    }
                    self.tables.insert(j, table);
                }
            }
            self.drain()?;
        }
    }

    /// Where a computed `goto` of this function may go, as `(address,
    /// instruction index)`: the addresses inside it that the file stores
    /// as data, the labels whose address reached code takes with a
    /// RIP-relative `lea`, and label-relative tables: `goto *(&&base +
    /// table[i])` (glibc's `vfprintf` and `vfscanf`), where reached code
    /// takes the address of a label `base` and of a table outside any
    /// function, whose 32-bit entries are read from its start while `base`
    /// plus the entry is an instruction of the function (at most 1024).
    /// Not the function's own start: that is a function pointer (a jump
    /// there is a tail call to itself, e.g. through a table of methods).
    fn code_pointer_targets(&self) -> Vec<(u64, usize)> {
        let mut targets: BTreeSet<u64> = self
            .ctx
            .code_pointers_in(self.func.start, self.func.end())
            .collect();
        let mut labels = BTreeSet::new();
        let mut tables = BTreeSet::new();
        for (i, insn) in self.insns.iter().enumerate() {
            let ins = &insn.instr;
            if self.reached[i]
                && ins.mnemonic() == iced_x86::Mnemonic::Lea
                && ins.is_ip_rel_memory_operand()
            {
                let a = ins.ip_rel_memory_address();
                if self.func.contains(a) {
                    labels.insert(a);
                } else if self.ctx.containing(a).is_none() {
                    tables.insert(a);
                }
            }
        }
        let boundary = |t: u64| {
            self.func.contains(t) && self.insns.binary_search_by_key(&t, |i| i.addr).is_ok()
        };
        for &base in &labels {
            targets.insert(base);
            for &table in &tables {
                for k in 0..1024u64 {
                    let Some(b) = self.ctx.bytes(table + 4 * k, 4) else {
                        break;
                    };
                    let off = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    let t = base.wrapping_add(off as i64 as u64);
                    if !boundary(t) {
                        break;
                    }
                    targets.insert(t);
                }
            }
        }
        targets.remove(&self.func.start);
        targets
            .into_iter()
            .filter_map(|t| {
                self.insns
                    .binary_search_by_key(&t, |i| i.addr)
                    .ok()
                    .map(|i| (t, i))
            })
            .collect()
    }

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

    pub(super) fn add_exit(&mut self, i: usize, kind: ExitKind) {
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

    /// The unique predecessor of instruction `i` on every known path, and
    /// how it gets there.
    pub(super) fn unique_pred(&self, i: usize) -> Option<(usize, Via)> {
        if self.roots.contains(&i) {
            return None; // also entered from outside
        }
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
    pub(super) fn gprs_written(&mut self, i: usize) -> u16 {
        let insn = &self.insns[i];
        if matches!(insn.flow, Flow::Call(_) | Flow::IndirectCall) {
            return CALLER_SAVED;
        }
        let info = self.info.info(&insn.instr);
        let mut mask = 0;
        for r in info.used_registers() {
            if crate::analysis::cost::writes(r.access())
                && let Some(n) = gpr_index(r.register())
            {
                mask |= 1 << n;
            }
        }
        mask
    }

    /// Walk back from instruction `from` (exclusive) to the nearest writer of
    /// GPR `reg` on the unique path. Gives up after 64 instructions, at a
    /// merge point, or at the function entry.
    pub(super) fn find_def(&mut self, reg: usize, from: usize) -> Option<usize> {
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

    /// Refuse functions whose reached code refers into their own range, or
    /// whose range has undecodable bytes between reached code.
    fn check_data_in_code(&self) -> Result<(), SkipReason> {
        let last_reached = self.reached.iter().rposition(|&r| r).unwrap_or(0);
        for (i, insn) in self.insns.iter().enumerate() {
            if self.reached[i] {
                let ins = &insn.instr;
                if ins.is_ip_rel_memory_operand() {
                    let a = ins.ip_rel_memory_address();
                    // A label's address (`lea`, no access): the base of a
                    // computed goto, reached code and dispatched over.
                    let label = ins.mnemonic() == iced_x86::Mnemonic::Lea
                        && self
                            .insns
                            .binary_search_by_key(&a, |i| i.addr)
                            .is_ok_and(|k| self.reached[k]);
                    if a != self.func.start && self.func.contains(a) && !label {
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
    fn finish(mut self) -> Cfg {
        let insns = std::mem::take(&mut self.insns);
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
            let instrs: Vec<_> = insns[start..i].iter().map(|x| x.instr).collect();
            blocks.push(Block {
                start: insns[start].addr,
                end: insns[i - 1].end(),
                insns: start..i,
                cost: crate::analysis::cost::block_cost(&instrs, &mut self.info),
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
        let mut extra_entries: Vec<usize> = self
            .roots
            .iter()
            .map(|&i| block_of[i])
            .filter(|&b| b != 0)
            .collect();
        extra_entries.dedup();
        Cfg {
            function: self.func.start,
            blocks,
            edges,
            exits,
            jump_tables: self.tables.into_values().collect(),
            calls,
            extra_entries,
        }
    }
}
