//! How control leaves a function other than by `ret`: direct tail calls,
//! jumps between a function and its `.cold` part, hand-written code falling
//! into the next function, and indirect tail calls (`jmp reg` with an empty
//! frame). These are the [`ExitKind`]s where a Ball-Larus path ends and
//! where the clones of Hirzel & Chilimbi's scheme hand control back.

use iced_x86::{Mnemonic, OpKind, Register};

use super::build::Walker;
use super::jump_tables::is_immediate;
use super::liveness::{RSP, gpr_index};
use super::types::{ExitKind, SkipReason};
use crate::analysis::functions::FunctionSources;

impl Walker<'_, '_> {
    /// Classify a direct transfer from instruction `from` to `t` outside the
    /// function.
    pub(super) fn external(&self, from: usize, t: u64) -> Result<ExitKind, SkipReason> {
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
        // Into code no known function contains (crtstuff's `frame_dummy`,
        // an `.init_array` entry, tail-jumps to `register_tm_clones`, which
        // has neither symbol nor FDE once stripped): a tail call of an
        // unknown function. The clone jumps to the original there, which
        // is what the original does, whatever that code is.
        if containing.is_none() && self.ctx.is_code(t) {
            return Ok(ExitKind::TailCall { target: t });
        }
        Err(SkipReason::JumpOutsideFunction {
            from: self.insns[from].addr,
            target: t,
        })
    }

    /// Instruction `i` is the last of the range and may fall through.
    pub(super) fn fall_off(&mut self, i: usize) -> Result<(), SkipReason> {
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
    pub(super) fn is_indirect_tail_call(&mut self, j: usize) -> bool {
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
                // A PIC table's `add rX, rBase` (register to register),
                // its `movsxd`, a `lea`, or a load with an index. An `add`
                // of a loaded word without an index is a pointer plus an
                // offset (ld.so's `call_destructors`: `mov rax, [rbp]
                // (l_addr); add rax, [rdx + 8] (DT_FINI); ..; jmp rax`).
                let table_like = match def.mnemonic() {
                    Mnemonic::Add => {
                        def.op1_kind() == OpKind::Register
                            || (def.op1_kind() == OpKind::Memory
                                && def.memory_index() != Register::None)
                    }
                    Mnemonic::Movsxd | Mnemonic::Lea => true,
                    _ => def.op1_kind() == OpKind::Memory && def.memory_index() != Register::None,
                };
                !table_like
            }
        }
    }

    /// An indirect jump that moves to another frame: the instructions
    /// before it load `rsp` from a computed value (`mov rsp, reg`, `mov
    /// rsp, [mem]`, `lea rsp, [...]` with an index or a base other than
    /// `rsp`, `add rsp, reg`), followed by at most a few `pop`s and
    /// register moves, all reached by falling through. That is the
    /// unwinder's `__builtin_eh_return` (`mov rsp, rcx; pop rcx; jmp
    /// rcx` into a landing pad) and `longjmp`: no tail call (the frame is
    /// not this function's caller's) and no switch. It becomes an
    /// [`ExitKind::ContextJump`].
    pub(super) fn is_context_jump(&self, j: usize) -> bool {
        let jmp = self.insns[j].instr;
        let operand_ok = match jmp.op0_kind() {
            OpKind::Register => jmp.op0_register() != Register::RSP,
            OpKind::Memory => {
                jmp.memory_base() != Register::RSP && jmp.memory_index() != Register::RSP
            }
            _ => false,
        };
        if !operand_ok {
            return false;
        }
        let only_fall_through =
            |i: usize| !self.branch_preds.contains_key(&i) && !self.roots.contains(&i);
        let mut i = j;
        for _ in 0..6 {
            if !only_fall_through(i) || i == 0 {
                return false;
            }
            i -= 1;
            if !self.reached[i] {
                return false;
            }
            let ins = self.insns[i].instr;
            let to_rsp = ins.op_count() >= 1
                && ins.op0_kind() == OpKind::Register
                && ins.op0_register() == Register::RSP;
            match ins.mnemonic() {
                Mnemonic::Mov if to_rsp => return true,
                Mnemonic::Lea if to_rsp => {
                    return ins.memory_index() != Register::None
                        || ins.memory_base() != Register::RSP;
                }
                Mnemonic::Add if to_rsp => return ins.op1_kind() == OpKind::Register,
                Mnemonic::Pop if ins.op0_register() != Register::RSP => {}
                Mnemonic::Mov
                    if ins.op0_kind() == OpKind::Register
                        && ins.op0_register().full_register() != Register::RSP
                        && (ins.op1_kind() == OpKind::Register
                            || ins.op1_kind() == OpKind::Memory)
                        && ins.memory_base() != Register::RSP
                        && ins.op1_register() != Register::RSP => {}
                _ => return false,
            }
        }
        false
    }
}
