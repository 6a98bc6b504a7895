//! GCC switch jump tables: an indirect `jmp` whose target is loaded from a
//! table indexed by a register that an unsigned `cmp idx, N; ja default`
//! guard bounds on every known path (see [`JumpTable`], [`JumpTableKind`]).
//! Each table target becomes a [`EdgeKind::JumpTable`](super::EdgeKind)
//! edge, so the switch is an ordinary multi-way branch for the Ball-Larus
//! numbering and for Hirzel & Chilimbi's cloned code.

use std::collections::BTreeSet;

use iced_x86::{ConditionCode, Mnemonic, OpAccess, OpKind, Register};

use super::build::{Via, Walker};
use super::liveness::gpr_index;
use super::types::{JumpTable, JumpTableKind, SkipReason};
use crate::analysis::disasm::Flow;

/// What holds a jump table's index during the backward guard search.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Idx {
    /// A GPR.
    Reg(usize),
    /// A variable in memory: `[base + index*scale + disp]` (base `RIP`
    /// with `disp` the absolute address for RIP-relative operands), and
    /// the size in bytes it was accessed with.
    Mem(Register, Register, u32, u64, u64),
}

impl Idx {
    /// The same variable (whatever the access size).
    fn same_place(self, other: Idx) -> bool {
        match (self, other) {
            (Idx::Mem(b, i, s, d, _), Idx::Mem(b2, i2, s2, d2, _)) => {
                (b, i, s, d) == (b2, i2, s2, d2)
            }
            (a, b) => a == b,
        }
    }
}

impl Walker<'_, '_> {
    /// Try to recognise the indirect jump at `j` as a GCC switch table.
    /// `Ok(None)` when the pattern does not (yet) match.
    pub(super) fn match_jump_table(&mut self, j: usize) -> Result<Option<JumpTable>, SkipReason> {
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
            JumpTableKind::CodePointers => unreachable!("not a matched table shape"),
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
                JumpTableKind::CodePointers => unreachable!("not a matched table shape"),
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
                // The guard compares a copy of the index (sqlite's
                // parser: `mov rax, r12; ..; cmp eax, 0x155; ja ..;
                // movsxd rax, [rdx + r12*4]`): the two must hold the same
                // value where the guard compares.
                (OpKind::Register, Idx::Reg(n))
                    if gpr_index(ins.op0_register()).is_some_and(|r| {
                        r != n && self.same_value(r, n, p, budget, &mut BTreeSet::new())
                    }) =>
                {
                    ins.op0_register().size()
                }
                (OpKind::Memory, Idx::Mem(..)) if mem_operand(&ins).same_place(idx) => {
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
                    // A mask bounds the index as well as a guard does:
                    // `and idx, 2^k - 1` (Duff's device, `switch (n & 7)`);
                    // a 32-bit `and` clears the upper half too.
                    if bound.is_none()
                        && dst_ok
                        && ins.mnemonic() == Mnemonic::And
                        && is_immediate(ins.op1_kind())
                    {
                        let m = ins.immediate(1);
                        return (m < 1 << 16 && (m + 1).is_power_of_two()).then_some(m + 1);
                    }
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
                        // movzx r, byte|word [mem] (Lua's GC: `cmp byte
                        // [rbx+0x65], 8; ja ..; movzx eax, byte [rbx+0x65]`)
                        (Mnemonic::Movzx, OpKind::Memory) if dst_ok => mem_operand(&ins),
                        // mov r32, [mem] / mov r64, [mem]
                        (Mnemonic::Mov, OpKind::Memory) if dst_ok => mem_operand(&ins),
                        _ => return None,
                    };
                }
            }
            Idx::Mem(base, index, scale, disp, size) => {
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
                        size,
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
                // A store beside the variable (same address registers, a
                // byte range that does not overlap it) leaves it alone.
                let beside = |m: &iced_x86::UsedMemory| {
                    let d = if m.base() == Register::RIP {
                        ins.ip_rel_memory_address()
                    } else {
                        m.displacement()
                    };
                    let n = m.memory_size().size() as u64;
                    m.base() == base
                        && m.index() == index
                        && (index == Register::None || m.scale() == scale)
                        && n > 0
                        && (d.wrapping_add(n) <= disp || d >= disp.wrapping_add(size))
                        && disp.checked_add(size).is_some()
                        && d.checked_add(n).is_some()
                };
                let writes_global = info.used_memory().iter().any(|m| {
                    matches!(
                        m.access(),
                        OpAccess::Write
                            | OpAccess::CondWrite
                            | OpAccess::ReadWrite
                            | OpAccess::ReadCondWrite
                    ) && m.base() != Register::RSP
                        && !beside(m)
                });
                if writes_global {
                    return None;
                }
            }
        }
        self.guard_from(p, idx, bound, budget, on_path)
    }

    /// Whether GPRs `a` and `b` hold the same value just before
    /// instruction `i`: on every known path to it, the last write of either
    /// is a register copy of one into the other (`mov a, b` or `mov b, a`,
    /// both 64-bit or both 32-bit). A path around a loop that writes
    /// neither adds nothing (glibc's `_nl_intern_locale_data`: `mov edi,
    /// ebp` before the loop, `cmp ebp, 12; ja; movsxd rcx, [rsi + rdi*4]`
    /// in it).
    fn same_value(
        &mut self,
        a: usize,
        b: usize,
        i: usize,
        budget: &mut usize,
        on_path: &mut BTreeSet<usize>,
    ) -> bool {
        if on_path.contains(&i) {
            // Around a loop that writes neither: the loop's entries decide.
            return true;
        }
        let preds = self.all_preds(i);
        if preds.is_empty() {
            return false; // the entry reached with no copy
        }
        on_path.insert(i);
        let mut all = true;
        for p in preds {
            let Some(left) = budget.checked_sub(1) else {
                all = false;
                break;
            };
            *budget = left;
            let written = self.gprs_written(p);
            let proven = if written & ((1 << a) | (1 << b)) == 0 {
                self.same_value(a, b, p, budget, on_path)
            } else {
                let ins = self.insns[p].instr;
                ins.mnemonic() == Mnemonic::Mov
                    && ins.op0_kind() == OpKind::Register
                    && ins.op1_kind() == OpKind::Register
                    && ins.op0_register().size() == ins.op1_register().size()
                    && ins.op0_register().size() >= 4
                    && {
                        let (d, s) = (gpr_index(ins.op0_register()), gpr_index(ins.op1_register()));
                        (d, s) == (Some(a), Some(b)) || (d, s) == (Some(b), Some(a))
                    }
            };
            if !proven {
                all = false;
                break;
            }
        }
        on_path.remove(&i);
        all
    }

    /// All known predecessors of instruction `i`.
    /// None for an instruction also entered from outside (a root): its
    /// predecessors are not all known, as at the function's start.
    fn all_preds(&self, i: usize) -> Vec<usize> {
        let mut v = Vec::new();
        if self.roots.contains(&i) {
            return v;
        }
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
            // Each instruction is visited once: the walk is bounded by the
            // function's size. (It used to stop after 4096 instructions,
            // which left gawk's 23 KB interpreter loop, whose table base is
            // loaded at its entry, unresolved.)
            if !seen.insert(p) {
                continue;
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
}

/// The memory operand of `ins` as an [`Idx::Mem`].
fn mem_operand(ins: &iced_x86::Instruction) -> Idx {
    if ins.is_ip_rel_memory_operand() {
        Idx::Mem(
            Register::RIP,
            Register::None,
            0,
            ins.ip_rel_memory_address(),
            ins.memory_size().size() as u64,
        )
    } else {
        Idx::Mem(
            ins.memory_base(),
            ins.memory_index(),
            ins.memory_index_scale(),
            ins.memory_displacement64(),
            ins.memory_size().size() as u64,
        )
    }
}

pub(super) fn is_immediate(k: OpKind) -> bool {
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
