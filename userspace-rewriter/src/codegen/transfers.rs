//! Control transfers in a clone: each block's terminator, direct calls
//! (to the callee's clone when there is one), indirect calls and tail calls
//! (looked up in the function-entry table at run time), exits (Ball-Larus
//! path record, shadow-stack pop, then the return, tail call or noreturn
//! call) and switch jumps (one comparison per case). Calls push the
//! original return address; every call is followed by a Hirzel & Chilimbi
//! check at the return site, where a return in a burst comes back.

use std::collections::HashMap;

use burstyd_common::burst::*;
use iced_x86::{Code, Instruction, MemoryOperand, OpKind, Register};

use super::emitter::{Emitter, rip};
use super::function::{FnGen, OutOfLine, Skip};
use super::instrument::add_path;
use crate::analysis::cfg::{EdgeKind, ExitKind};
use crate::analysis::disasm::{Flow, Insn};

impl FnGen<'_> {
    /// Where a direct call/jump to SVMA `t` goes: the clone's entry when
    /// `t` starts a cloned function, else the original.
    fn call_target(&self, t: u64) -> u64 {
        self.entry_label
            .get(&t)
            .copied()
            .unwrap_or_else(|| self.avma(t))
    }

    fn exit_at(&self, k: usize) -> Option<ExitKind> {
        let a = self.insns[k].addr;
        self.cfg.exits.iter().find(|e| e.insn == a).map(|e| e.kind)
    }

    /// The exit at instruction `k` that goes to `to` (a conditional jump
    /// whose taken side and fall-through both leave the function has two
    /// exits: glibc's `__memmove_chk_*` jumps to `__chk_fail` or falls
    /// into `__memmove_*`), else one that names no target; `other`: the
    /// one that does not go to `to`.
    fn exit_towards(&self, k: usize, to: u64, other: bool) -> Option<ExitKind> {
        let a = self.insns[k].addr;
        let target = |kind: &ExitKind| match *kind {
            ExitKind::TailCall { target } | ExitKind::ColdJump { target } => Some(target),
            _ => None,
        };
        let mut at = self
            .cfg
            .exits
            .iter()
            .filter(|e| e.insn == a)
            .map(|e| e.kind);
        if other {
            at.find(|kind| target(kind) != Some(to))
        } else {
            let all: Vec<ExitKind> = at.collect();
            all.iter()
                .find(|kind| target(kind) == Some(to))
                .or_else(|| all.iter().find(|kind| target(kind).is_none()))
                .copied()
        }
    }

    pub(super) fn terminator(
        &mut self,
        b: usize,
        last: usize,
        blk: &[u64],
        stubs: &mut HashMap<(usize, usize), u64>,
    ) -> Result<(), Skip> {
        let insn = &self.insns[last];
        let exit = self.exit_at(last);
        match insn.flow {
            Flow::CondJump(t) => {
                self.record(last);
                let internal = self
                    .cfg
                    .block_at(t)
                    .filter(|&tb| self.cfg.blocks[tb].start == t)
                    .and_then(|tb| self.edge_to(b, tb));
                let target = match internal {
                    Some(idx) => self.edge_stub(stubs, blk, b, idx),
                    None => {
                        let kind = self
                            .exit_towards(last, t, false)
                            .ok_or(Skip("branch out of the function without exit"))?;
                        let l = self.em.label();
                        self.out_of_line
                            .push((l, OutOfLine::Exit { insn: last, kind }));
                        l
                    }
                };
                let mut j = insn.instr;
                let code = j.code().as_near_branch();
                if code == j.code() && code.as_short_branch() == code {
                    // `loop*` and `jrcxz` have no near form: the block
                    // encoder would replace one that cannot reach with a
                    // sequence of its own, whose offset it does not return
                    // (the instruction table would point nowhere). Spelled
                    // out instead: the short branch to a near jump.
                    let (taken, over) = (self.em.label(), self.em.label());
                    j.set_near_branch64(taken);
                    self.em.emit(j);
                    self.em.jmp(over).map_err(|_| Skip("encoding loop"))?;
                    self.em.bind(taken);
                    self.em.jmp(target).map_err(|_| Skip("encoding loop"))?;
                    self.em.bind(over);
                } else {
                    j.set_near_branch64(target);
                    j.set_code(code);
                    self.em.emit(j);
                }
                self.continuation(b, last, blk, stubs)
            }
            Flow::Jump(t) => {
                let internal = self
                    .cfg
                    .block_at(t)
                    .filter(|&tb| self.cfg.blocks[tb].start == t)
                    .and_then(|tb| self.edge_to(b, tb));
                match (internal, exit) {
                    (Some(idx), _) => {
                        self.record(last);
                        let l = self.edge_stub(stubs, blk, b, idx);
                        self.em.jmp(l)?;
                        Ok(())
                    }
                    (None, Some(kind)) => {
                        self.record(last);
                        self.exit_code(b, last, kind, blk)
                    }
                    (None, None) => Err(Skip("jump without edge or exit")),
                }
            }
            Flow::IndirectJump => {
                if let Some(jt) = self.cfg.jump_tables.iter().find(|j| j.jump == insn.addr) {
                    self.record(last);
                    // Tuple profiles: the case a switch (an interpreter's
                    // dispatch) goes to.
                    self.target_tuple(last)?;
                    let targets = jt.targets.clone();
                    self.dispatch(b, last, &targets, blk, stubs)
                } else if let Some(kind) = exit {
                    self.record(last);
                    self.exit_code(b, last, kind, blk)
                } else {
                    Err(Skip("indirect jump without table or exit"))
                }
            }
            Flow::Ret => {
                self.record(last);
                self.exit_code(b, last, exit.unwrap_or(ExitKind::Return), blk)
            }
            Flow::Trap => self.copy(last),
            Flow::Call(_) | Flow::IndirectCall => {
                if let Some(kind @ ExitKind::NoReturnCall { .. }) = exit {
                    self.record(last);
                    self.exit_code(b, last, kind, blk)?;
                    // Should the callee return after all, do what the
                    // original would: run the next original instruction.
                    self.em.jmp(self.avma(insn.end()))?;
                    return Ok(());
                }
                self.record(last);
                self.emit_call(last, true)?;
                // Return site: the burst may have ended in the callee.
                let next = last + 1;
                let flags = self.flags_live(next.min(self.insns.len() - 1));
                let orig = self.avma(insn.end());
                self.check(flags, orig)?;
                self.continuation(b, last, blk, stubs)
            }
            Flow::Next | Flow::Syscall | Flow::Interrupt => {
                self.copy(last)?;
                self.continuation(b, last, blk, stubs)
            }
            Flow::Unsupported | Flow::Invalid => Err(Skip("unsupported instruction in a block")),
        }
    }

    /// After a block that may fall through: its fall-through edge, or a
    /// tail call by falling off the end.
    fn continuation(
        &mut self,
        b: usize,
        last: usize,
        blk: &[u64],
        stubs: &mut HashMap<(usize, usize), u64>,
    ) -> Result<(), Skip> {
        if let Some((idx, _)) = self.edge_kind(
            b,
            &[
                EdgeKind::FallThrough,
                EdgeKind::NotTaken,
                EdgeKind::CallFallThrough,
            ],
        ) {
            let l = self.edge_stub(stubs, blk, b, idx);
            // Fall into the next block when that is where it goes.
            if b + 1 < blk.len() && l == blk[b + 1] {
                return Ok(());
            }
            self.em.jmp(l)?;
            return Ok(());
        }
        // A conditional jump whose taken and not-taken sides are one edge.
        if let Flow::CondJump(t) = self.insns[last].flow
            && t == self.insns[last].end()
            && let Some(tb) = self.cfg.block_at(t)
            && let Some(idx) = self.edge_to(b, tb)
        {
            let l = self.edge_stub(stubs, blk, b, idx);
            self.em.jmp(l)?;
            return Ok(());
        }
        // (Of a conditional jump's exits, the one its taken side does not
        // take.)
        let exit = match self.insns[last].flow {
            Flow::CondJump(t) => self.exit_towards(last, t, true),
            _ => self.exit_at(last),
        };
        match exit {
            Some(kind @ ExitKind::TailCall { .. }) if self.insns[last].flow.falls_through() => {
                self.exit_code(b, last, kind, blk)
            }
            _ => {
                // Nothing modelled follows (e.g. a trap or noreturn call
                // before): behave like the original.
                self.em.jmp(self.avma(self.insns[last].end()))?;
                Ok(())
            }
        }
    }

    /// A call: push the *original* return address (so that the program's
    /// stack holds no clone address: `backtrace()`, `dladdr` and the C++
    /// unwinder see the original code), then jump to the callee's clone
    /// (direct calls to a cloned function, indirect calls looked up at run
    /// time) or to the original. A return in a burst comes back to the
    /// return site that follows (see `rt_exit`), which `returns` records
    /// unless the call does not return.
    fn emit_call(&mut self, k: usize, returns: bool) -> Result<(), Skip> {
        let ret = self.avma(self.insns[k].end());
        match self.insns[k].flow {
            Flow::Call(t)
                if !self.entry_label.contains_key(&t) && self.plt_slots.contains_key(&t) =>
            {
                let plt = self.plt_slots[&t];
                self.plt_reference(plt)?;
                let slot = self.avma(plt.slot);
                self.transfer_through(load_slot(slot)?, Some(ret), self.rt.lookup_fn)?;
            }
            Flow::Call(t) => {
                let target = self.call_target(t);
                self.push_return(ret)?;
                self.em.jmp(target)?;
            }
            _ => self.indirect_transfer(k, Some(ret), self.rt.lookup_fn)?,
        }
        if returns {
            self.returns.push((ret, self.em.out.len()));
        }
        Ok(())
    }

    /// `push qword [rip + slot]` with the slot holding `ret`.
    fn push_return(&mut self, ret: u64) -> Result<(), Skip> {
        let slot = self.em.label();
        self.out_of_line.push((slot, OutOfLine::Slot(ret)));
        self.em
            .e(Instruction::with1(Code::Push_rm64, rip(slot)))
            .map_err(Skip::from)
    }

    /// `call reg` / `call [mem]` (`ret` = its original return address) or
    /// `jmp reg` / `jmp [mem]` (an indirect tail call, `ret` = None): the
    /// target is looked up among the cloned functions at run time, so a
    /// burst follows calls through function pointers (and vtables) into
    /// clones; anything else goes to the original. The looked-up target is
    /// kept in the program's red zone below where the return address goes
    /// (`[rsp - 16]` for a call, `[rsp - 8]` for a jump: slots no signal
    /// frame touches, and dead at any call or tail call), and read back by
    /// `jmp [rsp - 8]` once the return address is pushed. Nothing is shared,
    /// so no other thread or forked child can change it in between. The
    /// stack pointer is back in place at the transfer (stack-passed
    /// arguments stay where the callee expects them). `routine` translates
    /// the target: `rt_lookup_fn` for calls and tail calls, `rt_unwind` for
    /// a [`ExitKind::ContextJump`] (`[rsp - 8]` is then the target frame's
    /// red zone, as dead at its landing pad as at any call site there).
    fn indirect_transfer(&mut self, k: usize, ret: Option<u64>, routine: u64) -> Result<(), Skip> {
        // Memory mode: the load of a target from memory is a reference.
        self.reference(k)?;
        // Tuple profiles: a call's (or tail call's) target, not a jump
        // to another frame's landing pad.
        if routine == self.rt.lookup_fn {
            self.target_tuple(k)?;
        }
        let ins = self.reloc(k);
        let operand = match ins.op0_kind() {
            OpKind::Register => {
                let r = ins.op0_register();
                if r == Register::RSP {
                    return Err(Skip("call through rsp"));
                }
                Instruction::with2(Code::Mov_r64_rm64, Register::RAX, r)?
            }
            OpKind::Memory => Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RAX,
                operand_below(&ins, DEPTH).ok_or(Skip("unusual indirect call"))?,
            )?,
            _ => return Err(Skip("unusual indirect call")),
        };
        self.transfer_through(operand, ret, routine)
    }

    /// The transfer of [`Self::indirect_transfer`], given the instruction
    /// that loads its target into rax (run below the saved registers).
    fn transfer_through(
        &mut self,
        operand: Instruction,
        ret: Option<u64>,
        routine: u64,
    ) -> Result<(), Skip> {
        let keep_at = if ret.is_some() { -16 } else { -8 };
        translate_into_red_zone(self.em, operand, keep_at, routine)?;
        if let Some(ret) = ret {
            self.push_return(ret)?;
        }
        jmp_red_zone(self.em)
    }

    /// A `ret` (or `ret n`): `rt_exit` has written where it goes into the
    /// slot below the return address; pop the return address (and `n`
    /// bytes) and jump through that slot.
    fn emit_return(&mut self, k: usize) -> Result<(), Skip> {
        let ins = &self.insns[k].instr;
        let n = if ins.op_count() == 1 {
            i64::from(ins.immediate16())
        } else {
            0
        };
        self.em.lea_rsp(8 + n)?;
        self.em.e(Instruction::with1(
            Code::Jmp_rm64,
            MemoryOperand::with_base_displ(Register::RSP, -16 - n),
        ))?;
        Ok(())
    }

    /// Before a copied `div`/`idiv`: a division that would fault must fault
    /// at its original address, where the program's SIGFPE handler (which
    /// may name the function with `dladdr`, or skip the instruction) expects
    /// it. The guard proves the division cannot fault (divisor not 0, and
    /// the quotient fits: for `div`, the high half of the dividend below
    /// the divisor; for `idiv`, a divisor other than -1 and a dividend that
    /// is the sign extension of its low half); otherwise the burst ends and
    /// the original instruction runs. 8- and 16-bit divisions always go to
    /// the original.
    pub(super) fn division_guard(&mut self, k: usize) -> Result<(), Skip> {
        let ins = self.reloc(k);
        let signed = ins.mnemonic() == iced_x86::Mnemonic::Idiv;
        let orig = self.avma(self.insns[k].addr);
        let leave = self.em.label();
        let size = match ins.op0_kind() {
            OpKind::Register => ins.op0_register().size(),
            OpKind::Memory => ins.memory_size().size(),
            _ => return Err(Skip("unusual division")),
        };
        // Bytes pushed below the program's rsp before the operand is read.
        const DEPTH: i64 = 128 + 8 * 2;
        let em = &mut *self.em;
        em.lea_rsp(-128)?;
        em.pushf();
        em.push(Register::RCX)?;
        if size == 8 || size == 4 {
            let wide = size == 8;
            let (rcx, rax, rdx) = if wide {
                (Register::RCX, Register::RAX, Register::RDX)
            } else {
                (Register::ECX, Register::EAX, Register::EDX)
            };
            let mov = if wide {
                Code::Mov_r64_rm64
            } else {
                Code::Mov_r32_rm32
            };
            let read = match ins.op0_kind() {
                OpKind::Register => Instruction::with2(mov, rcx, ins.op0_register())?,
                _ => Instruction::with2(
                    mov,
                    rcx,
                    operand_below(&ins, DEPTH).ok_or(Skip("unusual division"))?,
                )?,
            };
            em.emit(read);
            let (test, cmp, sar, cmp_imm) = if wide {
                (
                    Code::Test_rm64_r64,
                    Code::Cmp_r64_rm64,
                    Code::Sar_rm64_imm8,
                    Code::Cmp_rm64_imm8,
                )
            } else {
                (
                    Code::Test_rm32_r32,
                    Code::Cmp_r32_rm32,
                    Code::Sar_rm32_imm8,
                    Code::Cmp_rm32_imm8,
                )
            };
            em.e(Instruction::with2(test, rcx, rcx))?;
            em.jcc(Code::Je_rel32_64, leave)?;
            if signed {
                em.e(Instruction::with2(cmp_imm, rcx, -1))?;
                em.jcc(Code::Je_rel32_64, leave)?;
                em.e(Instruction::with2(mov, rcx, rax))?;
                em.e(Instruction::with2(sar, rcx, (size * 8 - 1) as u32))?;
                em.e(Instruction::with2(cmp, rcx, rdx))?;
                em.jcc(Code::Jne_rel32_64, leave)?;
            } else {
                // The high half below the divisor (unsigned), else leave.
                em.e(Instruction::with2(cmp, rdx, rcx))?;
                em.jcc(Code::Jae_rel32_64, leave)?;
            }
        } else {
            em.jmp(leave)?;
        }
        em.pop(Register::RCX)?;
        em.popf();
        em.lea_rsp(128)?;
        self.out_of_line
            .push((leave, OutOfLine::DivisionExit { orig }));
        Ok(())
    }

    /// Leaving the function at instruction `k` (already recorded).
    pub(super) fn exit_code(
        &mut self,
        b: usize,
        k: usize,
        kind: ExitKind,
        _blk: &[u64],
    ) -> Result<(), Skip> {
        let exit_inc = self
            .numbering
            .and_then(|n| n.exit_increment(b))
            .unwrap_or(0);
        let path_kind = match kind {
            ExitKind::Return => PATH_END_RETURN,
            ExitKind::TailCall { .. } | ExitKind::IndirectTailCall => PATH_END_TAIL,
            ExitKind::NoReturnCall { .. } | ExitKind::ColdJump { .. } | ExitKind::ContextJump => {
                PATH_END_NORETURN
            }
            ExitKind::Trap => {
                return self.copy_unrecorded(k);
            }
        };
        let flags = self.no_path_flag();
        self.stats.path_records += 1;
        let l = *self.layout;
        self.rt_call_fid(self.rt.exit, flags, Some(path_kind as u32), |em| {
            if exit_inc != 0 {
                add_path(em, &l, exit_inc)?;
            }
            Ok(())
        })?;
        match kind {
            ExitKind::Return => self.emit_return(k)?,
            ExitKind::IndirectTailCall => self.indirect_transfer(k, None, self.rt.lookup_fn)?,
            // `rt_unwind` drops the frames left and finds the target's
            // clone (a landing pad's stub sets its path start).
            ExitKind::ContextJump => self.indirect_transfer(k, None, self.rt.unwind)?,
            ExitKind::TailCall { target }
                if !self.entry_label.contains_key(&target)
                    && self.plt_slots.contains_key(&target) =>
            {
                let plt = self.plt_slots[&target];
                self.plt_reference(plt)?;
                let slot = self.avma(plt.slot);
                self.transfer_through(load_slot(slot)?, None, self.rt.lookup_fn)?;
            }
            ExitKind::TailCall { target } => {
                let t = self.call_target(target);
                self.em.jmp(t)?;
            }
            ExitKind::NoReturnCall { .. } => self.emit_call(k, false)?,
            ExitKind::ColdJump { target } => {
                if let Some(&(label, restart)) = self.part_entries.get(&target) {
                    // Into the other part's clone, where a path starts (the
                    // frame stays this activation's: no call is recorded).
                    // The check also sends any thread but the burst's to
                    // the original.
                    self.set_path(restart, true)?;
                    self.check(true, self.avma(target))?;
                    self.em.jmp(label)?;
                } else {
                    // Leaving the clones: end the burst, continue in the
                    // original.
                    self.rt_call(self.rt.end, END_LEFT_CLONES as u32, None, |_| Ok(()))?;
                    self.em.jmp(self.avma(target))?;
                }
            }
            ExitKind::Trap => unreachable!(),
        }
        Ok(())
    }

    /// A switch jump: compare the target against each known case (one
    /// comparison per distinct target), take that case's edge; an unknown
    /// target ends the burst and jumps there in the original code.
    fn dispatch(
        &mut self,
        b: usize,
        k: usize,
        targets: &[u64],
        blk: &[u64],
        stubs: &mut HashMap<(usize, usize), u64>,
    ) -> Result<(), Skip> {
        let mut distinct: Vec<u64> = targets.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let flags = self.flags_live(k);
        let ins = self.insns[k].instr;
        let mut cases = Vec::new();
        for &t in &distinct {
            // A case GCC moved to the function's `.cold` part (a ColdJump
            // exit of the table's jump): not a case here, so the search
            // misses it and the burst leaves there, as at any jump to the
            // cold part.
            if self.cfg.block_at(t).is_none()
                && self.cfg.exits.iter().any(|e| {
                    e.insn == self.insns[k].addr && e.kind == ExitKind::ColdJump { target: t }
                })
            {
                continue;
            }
            let tb = self
                .cfg
                .block_at(t)
                .filter(|&tb| self.cfg.blocks[tb].start == t)
                .ok_or(Skip("jump-table target is not a block"))?;
            let idx = self
                .edge_to(b, tb)
                .ok_or(Skip("jump-table target without edge"))?;
            let edge = self.edge_stub(stubs, blk, b, idx);
            let slot = self.em.label();
            let case = self.em.label();
            self.out_of_line.push((slot, OutOfLine::Slot(self.avma(t))));
            self.out_of_line
                .push((case, OutOfLine::Case { flags, edge }));
            cases.push((slot, case));
        }
        let em = &mut *self.em;
        em.lea_rsp(-128)?;
        em.push(Register::RAX)?;
        if flags {
            em.pushf();
        }
        match ins.op0_kind() {
            OpKind::Register => {
                let r = ins.op0_register();
                if r != Register::RAX {
                    em.e(Instruction::with2(Code::Mov_r64_rm64, Register::RAX, r))?;
                }
            }
            OpKind::Memory => {
                let mut m = ins;
                if m.is_ip_rel_memory_operand() {
                    m.set_memory_displacement64(
                        m.memory_displacement64().wrapping_add(self.layout.bias),
                    );
                }
                let op = MemoryOperand::new(
                    m.memory_base(),
                    m.memory_index(),
                    m.memory_index_scale(),
                    m.memory_displacement64() as i64,
                    if m.memory_displacement64() == 0 { 0 } else { 1 },
                    false,
                    m.segment_prefix(),
                );
                em.e(Instruction::with2(Code::Mov_r64_rm64, Register::RAX, op))?;
            }
            _ => return Err(Skip("unusual jump-table jump")),
        }
        // A binary search over the targets (sorted by address): at most
        // about log2(n) + 1 compares for an interpreter's hundreds of
        // labels. Each node compares with its middle target; below goes
        // to the left half (emitted later at its label), above falls
        // through to the right half.
        let miss = em.label();
        let mut work: Vec<(Option<u64>, std::ops::Range<usize>)> = vec![(None, 0..cases.len())];
        while let Some((at, range)) = work.pop() {
            if let Some(l) = at {
                em.bind(l);
            }
            if range.is_empty() {
                em.jmp(miss)?;
                continue;
            }
            let mid = (range.start + range.end) / 2;
            let (slot, case) = cases[mid];
            em.e(Instruction::with2(
                Code::Cmp_r64_rm64,
                Register::RAX,
                rip(slot),
            ))?;
            em.jcc(Code::Je_rel32_64, case)?;
            if range.start < mid {
                let left = em.label();
                em.jcc(Code::Jb_rel32_64, left)?;
                work.push((Some(left), range.start..mid));
            } else {
                em.jcc(Code::Jb_rel32_64, miss)?;
            }
            // Popped next: emitted right here, the fall-through.
            work.push((None, mid + 1..range.end));
        }
        // Unknown target: leave the clones.
        em.bind(miss);
        if flags {
            em.popf();
        }
        em.pop(Register::RAX)?;
        em.lea_rsp(128)?;
        self.rt_call(self.rt.end, END_LEFT_CLONES as u32, None, |_| Ok(()))?;
        let ins = self.reloc(k);
        self.em.emit(ins);
        Ok(())
    }
}

/// The memory operand of `ins` (relocated), as read from inside a snippet
/// that has pushed `depth` bytes below the program's rsp: an rsp-based
/// address moves by `depth`. None for an rsp index (not expressible).
/// Bytes pushed below the program's rsp before an indirect transfer's
/// operand is read.
const DEPTH: i64 = 128 + 8 * 4;

/// `operand` (an instruction loading the target into rax) and `routine`
/// (which translates rax) from the standard frame, the result kept at
/// `[program rsp + keep_at]` (see [`FnGen::indirect_transfer`]). Every
/// register and the flags are as before.
fn translate_into_red_zone(
    em: &mut Emitter,
    operand: Instruction,
    keep_at: i64,
    routine: u64,
) -> Result<(), Skip> {
    em.lea_rsp(-128)?;
    em.pushf();
    em.push(Register::RAX)?;
    em.push(Register::RCX)?;
    em.push(Register::RDX)?;
    em.emit(operand);
    em.call(routine)?;
    em.e(Instruction::with2(
        Code::Mov_rm64_r64,
        MemoryOperand::with_base_displ(Register::RSP, DEPTH + keep_at),
        Register::RAX,
    ))?;
    em.pop(Register::RDX)?;
    em.pop(Register::RCX)?;
    em.pop(Register::RAX)?;
    em.popf();
    em.lea_rsp(128)?;
    Ok(())
}

/// `jmp [rsp - 8]`: to the target [`translate_into_red_zone`] kept there
/// (once the return address, if any, is pushed).
fn jmp_red_zone(em: &mut Emitter) -> Result<(), Skip> {
    em.e(Instruction::with1(
        Code::Jmp_rm64,
        MemoryOperand::with_base_displ(Register::RSP, -8),
    ))?;
    Ok(())
}

/// The GOT jump of a PLT stub (`jmp [rip + slot]`, `bnd jmp` in
/// `.plt.sec`): its index in `insns`.
pub(super) fn plt_jump(insns: &[Insn]) -> Option<usize> {
    insns.iter().position(|x| {
        x.instr.flow_control() == iced_x86::FlowControl::IndirectBranch
            && x.instr.op0_kind() == OpKind::Memory
            && x.instr.memory_base() == Register::RIP
    })
}

/// A PLT stub's trampoline, so that a burst can start where a thread is
/// interrupted in the stub (a hot `memcmp@plt` holds several percent of a
/// C++ program's samples): the stub's GOT slot is read at run time, as the
/// stub reads it, and the thread goes to the clone of what it holds
/// (`rt_lookup_fn`, in this module or another), else to that target
/// itself. A lazily bound slot still holds the stub's own `push N`, which
/// is not cloned: the thread then resolves the symbol in the original code
/// (the loader is not cloned) and the burst goes on there until its
/// thread's next signal, as after any call into code without a clone.
///
/// The stub's instructions up to its GOT jump are recorded in `table`
/// (original AVMA, instruction index, original end): `endbr64` or a
/// `nop` before the jump is copied, the jump itself becomes the
/// trampoline. The stub's other instructions (a lazy stub's `push N; jmp
/// PLT0`, the padding after a jump) are not, so a thread there is never
/// sent into a burst; the length of what is recorded (from the stub's
/// start) is returned. Nothing here moves the stack at the recorded
/// instructions: the return address is on top, as in the stub, and the
/// default CFI row (CFA = rsp + 8) holds there.
pub(super) fn plt_trampoline(
    em: &mut Emitter,
    lookup_fn: u64,
    insns: &[Insn],
    bias: u64,
    table: &mut Vec<(u64, usize, u64)>,
) -> Result<u64, Skip> {
    let j = plt_jump(insns).ok_or(Skip("PLT stub without a GOT jump"))?;
    for x in &insns[..j] {
        table.push((x.addr + bias, em.out.len(), x.end() + bias));
        match x.instr.code() {
            Code::Endbr64 => em.emit(Instruction::with(Code::Endbr64)),
            Code::Nopd
            | Code::Nopw
            | Code::Nopq
            | Code::Nop_rm16
            | Code::Nop_rm32
            | Code::Nop_rm64 => em.emit(Instruction::with(Code::Nopd)),
            _ => return Err(Skip("PLT stub with code before its GOT jump")),
        }
    }
    let jump = &insns[j];
    table.push((jump.addr + bias, em.out.len(), jump.end() + bias));
    let slot = jump.instr.memory_displacement64() + bias;
    translate_into_red_zone(em, load_slot(slot)?, -8, lookup_fn)?;
    jmp_red_zone(em)?;
    Ok(jump.end() - insns[0].addr)
}

/// `mov rax, [slot]`: the target of a call through a PLT stub, read from
/// its GOT slot (AVMA).
fn load_slot(slot: u64) -> Result<Instruction, Skip> {
    Instruction::with2(Code::Mov_r64_rm64, Register::RAX, rip(slot)).map_err(Skip::from)
}

fn operand_below(ins: &Instruction, depth: i64) -> Option<MemoryOperand> {
    if ins.memory_index() == Register::RSP {
        return None;
    }
    let mut d = ins.memory_displacement64() as i64;
    if ins.memory_base() == Register::RSP {
        d += depth;
    }
    Some(MemoryOperand::new(
        ins.memory_base(),
        ins.memory_index(),
        ins.memory_index_scale(),
        d,
        // 1: the encoder picks disp8 or disp32 as needed.
        if ins.memory_base() == Register::RIP {
            8
        } else if d == 0 {
            0
        } else {
            1
        },
        false,
        ins.segment_prefix(),
    ))
}
