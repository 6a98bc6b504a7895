//! `FnGen`: one function's clone. Its blocks are copied in address order
//! (original instructions relocated by iced's encoder, RIP-relative
//! operands keeping their absolute targets); edges that carry a Ball-Larus
//! increment or are truncated get out-of-line stubs; checks' exits and
//! switch cases follow the body. The control transfers are in
//! `transfers.rs`, the instrumentation in `instrument.rs`.

use std::collections::HashMap;

use burstyd_common::burst::*;
use iced_x86::{IcedError, Instruction, OpKind, Register};

use super::emitter::{Emitter, Tag};
use super::layout::{GenStats, Layout};
use super::runtime::{NO_PATH, Runtime};
use crate::analysis::cfg::{self, Cfg, EdgeKind, ExitKind, LiveSet};
use crate::analysis::disasm::Insn;
use crate::analysis::paths::PathNumbering;

/// Why one function was not cloned.
#[derive(Debug)]
pub(super) struct Skip(pub(super) &'static str);

impl From<IcedError> for Skip {
    fn from(_: IcedError) -> Self {
        Skip("instruction cannot be re-encoded")
    }
}

/// A PLT stub's GOT jump (SVMAs).
#[derive(Clone, Copy, Debug)]
pub(super) struct PltSlot {
    /// The GOT slot its `jmp [rip + slot]` goes through.
    pub(super) slot: u64,
    /// That `jmp`'s own address (what memory mode names the slot's load
    /// by: the instruction the original runs).
    pub(super) jump: u64,
}

pub(super) struct FnGen<'a> {
    pub(super) em: &'a mut Emitter,
    pub(super) rt: &'a Runtime,
    pub(super) layout: &'a Layout,
    pub(super) fid: u32,
    pub(super) cfg: &'a Cfg,
    pub(super) insns: &'a [Insn],
    pub(super) live: Vec<LiveSet>,
    pub(super) numbering: Option<&'a PathNumbering>,
    pub(super) loops: &'a crate::analysis::graph::Loops,
    /// Out-edges per block, in edge order (index = `idx`).
    pub(super) edges_of: Vec<Vec<cfg::Edge>>,
    pub(super) entry_label: &'a HashMap<u64, u64>,
    /// Where other parts of the same function continue in this module's
    /// clones: block start (SVMA) → (label, path register there).
    pub(super) part_entries: &'a HashMap<u64, (u64, u64)>,
    /// PLT stub (SVMA) → the GOT slot (SVMA) it jumps through.
    pub(super) plt_slots: &'a HashMap<u64, PltSlot>,
    pub(super) table: &'a mut Vec<(u64, usize, u64)>,
    /// `(original return address, instruction index of the clone's return
    /// site)` of every call that returns.
    pub(super) returns: &'a mut Vec<(u64, usize)>,
    pub(super) stats: GenStats,
    /// Code emitted after the function body: (label, what).
    pub(super) out_of_line: Vec<(u64, OutOfLine)>,
    /// The out-of-line exits of the checks, shared by every check with the
    /// same flags and original address: `(flags, orig)` → (exit, expire).
    pub(super) check_exits: HashMap<(bool, u64), (u64, u64)>,
    /// The shared ends of truncated edges into a block ([`OutOfLine::Tail`]):
    /// `(block, restarts, checked)` → label.
    pub(super) tails: HashMap<(usize, bool, bool), u64>,
    /// Memory mode ([`super::references`]).
    pub(super) refs: super::layout::Refs,
    /// Tuple profiles ([`super::tuples`]): value and target tuples.
    pub(super) values: bool,
    pub(super) targets: bool,
    /// The function sets up a frame pointer: `rbp`-based operands are the
    /// stack's.
    pub(super) frame_pointer: bool,
}

pub(super) enum OutOfLine {
    /// Edge `(from, idx)` code, then a jump to its target block.
    Edge(usize, usize),
    /// A check's exit: restore and jump to the original address.
    CheckExit { flags: bool, orig: u64 },
    /// A check's expiry: end the burst, then `CheckExit`.
    CheckExpire { exit: u64 },
    /// A conditional tail call / jump out of the function.
    Exit { insn: usize, kind: ExitKind },
    /// A jump-table case: restore, then the edge.
    Case { flags: bool, edge: u64 },
    /// Data: one u64.
    Slot(u64),
    /// A division that might fault: restore (flags, rcx), end the burst,
    /// run the original instruction.
    DivisionExit { orig: u64 },
    /// What every truncated edge into block `to` does after recording its
    /// path (which depends on the edge): restart the path register at
    /// `to`'s path start, check, jump to `to`. Shared by those edges --
    /// an interpreter's dispatch has one into each handler from every
    /// dispatch site.
    Tail {
        to: usize,
        restart: Option<u64>,
        check: bool,
    },
}

impl FnGen<'_> {
    pub(super) fn avma(&self, svma: u64) -> u64 {
        svma.wrapping_add(self.layout.bias)
    }

    pub(super) fn record(&mut self, insn: usize) {
        let a = self.avma(self.insns[insn].addr);
        let end = self.avma(self.insns[insn].end());
        self.table.push((a, self.em.out.len(), end));
    }

    /// Flags live before instruction `idx`.
    pub(super) fn flags_live(&self, idx: usize) -> bool {
        self.live.get(idx).is_none_or(|l| l.status_flags_live())
    }

    pub(super) fn block_first(&self, b: usize) -> usize {
        self.cfg.blocks[b].insns.start
    }

    /// Out-edges of `b` as `(idx, edge)`.
    pub(super) fn out_edges(&self, b: usize) -> impl Iterator<Item = (usize, cfg::Edge)> + '_ {
        self.edges_of[b].iter().copied().enumerate()
    }

    pub(super) fn edge_to(&self, b: usize, to: usize) -> Option<usize> {
        self.out_edges(b).find(|(_, e)| e.to == to).map(|(i, _)| i)
    }

    pub(super) fn edge_kind(&self, b: usize, kinds: &[EdgeKind]) -> Option<(usize, cfg::Edge)> {
        self.out_edges(b).find(|(_, e)| kinds.contains(&e.kind))
    }

    pub(super) fn edge_stub(
        &mut self,
        labels: &mut HashMap<(usize, usize), u64>,
        blk: &[u64],
        b: usize,
        idx: usize,
    ) -> u64 {
        if let Some(&l) = labels.get(&(b, idx)) {
            return l;
        }
        let to = self.out_edges(b).nth(idx).unwrap().1.to;
        let l = if self.edge_needs_code(b, idx) {
            let l = self.em.label();
            self.out_of_line.push((l, OutOfLine::Edge(b, idx)));
            l
        } else {
            blk[to]
        };
        labels.insert((b, idx), l);
        l
    }

    pub(super) fn function(&mut self, entry: u64) -> Result<(), Skip> {
        let nb = self.cfg.blocks.len();
        let blk: Vec<u64> = (0..nb).map(|_| self.em.label()).collect();
        let mut stubs: HashMap<(usize, usize), u64> = HashMap::new();

        // Prologue: entry check, then the activation record.
        self.em.bind(entry);
        {
            let first = self.block_first(0);
            let flags = self.flags_live(first);
            let orig = self.avma(self.insns[first].addr);
            self.check(flags, orig)?;
        }
        self.rt_call_fid(self.rt.enter, self.no_path_flag(), None, |_| Ok(()))?;

        for b in 0..nb {
            self.entry_stub(b)?;
            self.em.bind(blk[b]);
            if let Some(&(l, _)) = self.part_entries.get(&self.cfg.blocks[b].start) {
                self.em.bind(l);
            }
            let range = self.cfg.blocks[b].insns.clone();
            let last = range.end - 1;
            for k in range.start..last {
                self.copy(k)?;
            }
            self.terminator(b, last, &blk, &mut stubs)?;
        }
        // Out-of-line code.
        let mut k = 0;
        while k < self.out_of_line.len() {
            let (label, _) = self.out_of_line[k];
            let what = std::mem::replace(&mut self.out_of_line[k].1, OutOfLine::Slot(0));
            self.em.bind(label);
            match what {
                OutOfLine::Edge(b, idx) => {
                    let to = self.out_edges(b).nth(idx).unwrap().1.to;
                    let next = self.edge_code(b, idx)?.unwrap_or(blk[to]);
                    self.em.jmp(next)?;
                }
                OutOfLine::Tail { to, restart, check } => {
                    let first = self.block_first(to);
                    let flags = self.flags_live(first);
                    if let Some(v) = restart {
                        self.set_path(v, flags)?;
                    }
                    if check {
                        let orig = self.avma(self.cfg.blocks[to].start);
                        self.check(flags, orig)?;
                    }
                    self.em.jmp(blk[to])?;
                }
                OutOfLine::CheckExit { flags, orig } => {
                    self.em.pop(Register::RAX)?;
                    if flags {
                        self.em.popf();
                    }
                    self.em.lea_rsp(128)?;
                    self.em.jmp(orig)?;
                }
                OutOfLine::CheckExpire { exit } => {
                    self.em.push(Register::RCX)?;
                    self.em.push(Register::RDX)?;
                    self.em.mov_imm(Register::EAX, END_BUDGET)?;
                    self.em.call(self.rt.end)?;
                    self.em.pop(Register::RDX)?;
                    self.em.pop(Register::RCX)?;
                    self.em.jmp(exit)?;
                }
                OutOfLine::Exit { insn, kind } => {
                    let b = self.cfg.block_at(self.insns[insn].addr).unwrap_or(0);
                    self.exit_code(b, insn, kind, &blk)?;
                }
                OutOfLine::Case { flags, edge } => {
                    if flags {
                        self.em.popf();
                    }
                    self.em.pop(Register::RAX)?;
                    self.em.lea_rsp(128)?;
                    self.em.jmp(edge)?;
                }
                OutOfLine::DivisionExit { orig } => {
                    self.em.pop(Register::RCX)?;
                    self.em.popf();
                    self.em.lea_rsp(128)?;
                    self.rt_call(self.rt.end, END_LEFT_CLONES as u32, None, |_| Ok(()))?;
                    self.em.jmp(orig)?;
                }
                OutOfLine::Slot(v) => {
                    self.em.e(Instruction::with_declare_qword(&[v]))?;
                    self.em.tag_last(Tag::OrigQword);
                }
            }
            k += 1;
        }
        Ok(())
    }

    /// Before an extra entry that nothing in the function reaches (a
    /// landing pad, mostly): the path start the runtime enters when it
    /// looks the block's first instruction up (`rt_unwind` after the
    /// unwinder's jump, the signal handler), since control there came
    /// from outside. It sets the path register to the entry's start value
    /// and records the instruction here, before its copy does: the lookup
    /// table keeps the lower of two clone addresses of one instruction
    /// (see `image.rs`). Other jumps into the part (a `.cold` part's) set
    /// the path themselves and go to the block's label.
    fn entry_stub(&mut self, b: usize) -> Result<(), Skip> {
        if b == 0 || self.cfg.extra_entries.binary_search(&b).is_err() {
            return Ok(());
        }
        let Some(&(_, restart)) = self.part_entries.get(&self.cfg.blocks[b].start) else {
            return Ok(());
        };
        if self.cfg.edges.iter().any(|e| e.to == b) {
            return Ok(());
        }
        let first = self.block_first(b);
        let flags = self.flags_live(first);
        self.record(first);
        self.set_path(restart, flags)
    }

    pub(super) fn no_path_flag(&self) -> u32 {
        if self.numbering.is_some() { 0 } else { NO_PATH }
    }

    /// Copies instruction `k` unchanged (RIP-relative operands keep their
    /// absolute targets; the encoder recomputes the displacement).
    pub(super) fn copy(&mut self, k: usize) -> Result<(), Skip> {
        self.record(k);
        self.reference(k)?;
        if matches!(
            self.insns[k].instr.mnemonic(),
            iced_x86::Mnemonic::Div | iced_x86::Mnemonic::Idiv
        ) {
            self.division_guard(k)?;
        }
        let ins = self.reloc(k);
        self.em.emit(ins);
        self.value_tuple(k)
    }

    /// Instruction `k` with its addresses moved by the bias.
    pub(super) fn reloc(&self, k: usize) -> Instruction {
        let mut ins = self.insns[k].instr;
        if ins.is_ip_rel_memory_operand() {
            ins.set_memory_displacement64(self.avma(ins.memory_displacement64()));
        }
        if ins.op_count() > 0 && matches!(ins.op0_kind(), OpKind::NearBranch64) {
            ins.set_near_branch64(self.avma(ins.near_branch64()));
        }
        ins
    }

    pub(super) fn copy_unrecorded(&mut self, k: usize) -> Result<(), Skip> {
        let ins = self.reloc(k);
        self.em.emit(ins);
        Ok(())
    }
}
