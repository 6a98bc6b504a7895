//! Memory mode ([`Refs`]): before each load, store and read-modify-write
//! of a clone, a `REC_REF` record with the original instruction's address
//! and the effective address it is about to touch (the data reference
//! traces of Hirzel & Chilimbi's bursts, from which hot data streams are
//! found).
//!
//! The snippet is a runtime call in the standard frame
//! ([`call_routine`]): inside it `lea rdx, [operand]` computes the address
//! with the program's registers (the frame saved rax, rcx and rdx without
//! changing them; an `rsp`-based operand is moved by the frame's 160
//! bytes, a RIP-relative one names its original absolute target), `rax`
//! is loaded from a slot holding the record's first word (tag, kind and
//! the instruction's address: a `dq` of an original address, which a moved
//! image relocates), and `rt_ref` writes the record unless the address is
//! in the thread's own stack (`rt_emit` with `--refs-stack`). Only the burst's
//! thread writes ([`rt_emit`'s owner gate](super::runtime)); a full ring
//! truncates the burst and never blocks.
use burstyd_common::burst::{REC_REF, REF_KIND_SHIFT, REF_LOAD, REF_RMW, REF_STORE, TAG_SHIFT};
use iced_x86::{
    Code, Instruction, InstructionInfoFactory, MemoryOperand, Mnemonic, OpAccess, OpKind, Register,
};

use super::emitter::rip;
use super::function::{FnGen, OutOfLine, PltSlot, Skip};
use super::instrument::{Arg, call_routine};
use super::layout::Refs;
use crate::analysis::disasm::Insn;

/// Bytes the standard frame moves `rsp` by before the routine's `call`:
/// the red zone and four pushes (flags, rax, rcx, rdx).
const FRAME_BYTES: i64 = 128 + 4 * 8;

/// Whether the function's prologue sets up a frame pointer (`mov rbp,
/// rsp` among its first instructions): then `rbp`-based operands are the
/// stack's. Elsewhere `rbp` is a register like any other.
pub(super) fn sets_up_frame_pointer(insns: &[Insn]) -> bool {
    insns.iter().take(8).any(|i| {
        let ins = &i.instr;
        matches!(ins.code(), Code::Mov_r64_rm64 | Code::Mov_rm64_r64)
            && ins.op0_kind() == OpKind::Register
            && ins.op1_kind() == OpKind::Register
            && ins.op0_register() == Register::RBP
            && ins.op1_register() == Register::RSP
    })
}

/// What instruction `ins` does to its explicit memory operand: its
/// operand index and the `REF_*` kind; `None` when it has none or does
/// not access it (`lea`, `nop`, prefetches).
fn access(ins: &Instruction) -> Option<(u32, u64)> {
    let op = (0..ins.op_count()).find(|&i| ins.op_kind(i) == OpKind::Memory)?;
    if matches!(ins.mnemonic(), Mnemonic::Lea | Mnemonic::Nop) {
        return None;
    }
    let mut factory = InstructionInfoFactory::new();
    let kind = match factory.info(ins).op_access(op) {
        OpAccess::Read | OpAccess::CondRead => REF_LOAD,
        OpAccess::Write | OpAccess::CondWrite => REF_STORE,
        OpAccess::ReadWrite | OpAccess::ReadCondWrite => REF_RMW,
        _ => return None,
    };
    Some((op, kind))
}

/// Whether `ins` has an implicit memory operand that is not the stack's
/// (the string operations).
fn string_operation(ins: &Instruction) -> bool {
    (0..ins.op_count()).any(|i| {
        matches!(
            ins.op_kind(i),
            OpKind::MemorySegSI
                | OpKind::MemorySegESI
                | OpKind::MemorySegRSI
                | OpKind::MemorySegDI
                | OpKind::MemorySegEDI
                | OpKind::MemorySegRDI
                | OpKind::MemoryESDI
                | OpKind::MemoryESEDI
                | OpKind::MemoryESRDI
        )
    })
}

/// The memory operand of `ins` (moved by the bias) as the standard frame
/// sees it: a RIP-relative one names its original absolute target, an
/// `rsp`-based one is moved by the frame's bytes; the segment is left
/// to the caller.
pub(super) fn frame_operand(ins: &Instruction) -> MemoryOperand {
    let base = ins.memory_base();
    if ins.is_ip_rel_memory_operand() {
        return MemoryOperand::with_base_displ(Register::RIP, ins.memory_displacement64() as i64);
    }
    let mut displ = ins.memory_displacement64() as i64;
    if base.full_register() == Register::RSP {
        displ += FRAME_BYTES;
    }
    MemoryOperand::with_base_index_scale_displ_size(
        base,
        ins.memory_index(),
        ins.memory_index_scale(),
        displ,
        // The original's size (a displ8 widens itself when the frame's
        // adjustment does not fit it); an absolute operand (`fs:[0x28]`)
        // is a disp32.
        if base == Register::None && ins.memory_index() == Register::None {
            4
        } else if displ == 0 {
            0
        } else {
            ins.memory_displ_size().max(1)
        },
    )
}

impl FnGen<'_> {
    /// In memory mode, the `REC_REF` record of instruction `k`'s data
    /// reference, emitted right before the instruction's copy (counted in
    /// the stats when left out).
    pub(super) fn reference(&mut self, k: usize) -> Result<(), Skip> {
        if self.refs == Refs::Off {
            return Ok(());
        }
        let ins = self.reloc(k);
        let Some((_, kind)) = access(&ins) else {
            if string_operation(&ins) {
                return self.string_references(k, &ins);
            }
            return Ok(());
        };
        let base = ins.memory_base();
        // fs-relative: thread-local data (the stack protector's canary,
        // `errno`, the thread's own TCB fields); its address is the
        // thread pointer, `fs:[0]` by the x86-64 TLS ABI, plus the
        // operand. gs is not used by user space on x86-64 Linux.
        let fs = ins.memory_segment() == Register::FS;
        if ins.memory_segment() == Register::GS || ins.is_vsib() || base == Register::ESP {
            self.stats.refs_unsupported += 1;
            return Ok(());
        }
        let stack = base == Register::RSP || (base == Register::RBP && self.frame_pointer);
        if stack && self.refs != Refs::All {
            self.stats.refs_stack += 1;
            return Ok(());
        }
        self.emit_reference(self.insns[k].addr, kind, frame_operand(&ins), fs)
    }

    /// A string operation's references: one per memory operand, at the
    /// address its first iteration touches (`[rsi]` read, then `[rdi]`
    /// read or written), none when a `rep` runs no iteration (`rcx` 0).
    /// Complete traces list every iteration; the bench's lackey
    /// conversion keeps the first of each execution the same way.
    fn string_references(&mut self, k: usize, ins: &Instruction) -> Result<(), Skip> {
        use Mnemonic::*;
        let (rsi, rdi) = match ins.mnemonic() {
            Movsb | Movsw | Movsd | Movsq => (Some(REF_LOAD), Some(REF_STORE)),
            Stosb | Stosw | Stosd | Stosq => (None, Some(REF_STORE)),
            Lodsb | Lodsw | Lodsd | Lodsq => (Some(REF_LOAD), None),
            Scasb | Scasw | Scasd | Scasq => (None, Some(REF_LOAD)),
            Cmpsb | Cmpsw | Cmpsd | Cmpsq => (Some(REF_LOAD), Some(REF_LOAD)),
            _ => {
                self.stats.refs_unsupported += 1;
                return Ok(());
            }
        };
        // 64-bit addressing only (an `addr32` prefix uses esi/edi/ecx).
        if ins.memory_size().size() == 0
            || (0..ins.op_count()).any(|i| {
                matches!(
                    ins.op_kind(i),
                    OpKind::MemorySegESI | OpKind::MemorySegEDI | OpKind::MemoryESEDI
                )
            })
        {
            self.stats.refs_unsupported += 1;
            return Ok(());
        }
        let rep = ins.has_rep_prefix() || ins.has_repe_prefix() || ins.has_repne_prefix();
        // With `rep`: past the references when `rcx` is 0 (`jrcxz`
        // reaches only a byte away: over a near jump).
        let done = if rep {
            let (skip, run, done) = (self.em.label(), self.em.label(), self.em.label());
            self.em.jcc(Code::Jrcxz_rel8_64, skip)?;
            self.em.jmp(run)?;
            self.em.bind(skip);
            self.em.jmp(done)?;
            self.em.bind(run);
            Some(done)
        } else {
            None
        };
        let addr = self.insns[k].addr;
        for (reg, kind) in [(Register::RSI, rsi), (Register::RDI, rdi)] {
            if let Some(kind) = kind {
                self.emit_reference(addr, kind, MemoryOperand::with_base(reg), false)?;
            }
        }
        if let Some(done) = done {
            self.em.bind(done);
        }
        Ok(())
    }

    /// In memory mode, the load of a PLT stub's GOT slot that a call
    /// through the stub makes in the original (`jmp [rip + slot]` at
    /// `plt.jump`): the clone reads the slot itself, so the reference is
    /// recorded here, named by the stub's jump.
    pub(super) fn plt_reference(&mut self, plt: PltSlot) -> Result<(), Skip> {
        if self.refs == Refs::Off {
            return Ok(());
        }
        let slot = self.avma(plt.slot);
        self.emit_reference(
            plt.jump,
            REF_LOAD,
            MemoryOperand::with_base_displ(Register::RIP, slot as i64),
            false,
        )
    }

    /// The snippet recording a reference of `kind` by the original
    /// instruction at SVMA `addr` to `operand` (as computed inside the
    /// standard frame), plus the thread pointer with `fs`.
    fn emit_reference(
        &mut self,
        addr: u64,
        kind: u64,
        operand: MemoryOperand,
        fs: bool,
    ) -> Result<(), Skip> {
        let pc = self.avma(addr);
        if pc >> REF_KIND_SHIFT != 0 {
            self.stats.refs_unsupported += 1;
            return Ok(());
        }
        let slot = self.em.label();
        self.out_of_line.push((
            slot,
            OutOfLine::Slot(REC_REF << TAG_SHIFT | kind << REF_KIND_SHIFT | pc),
        ));
        self.stats.refs += 1;
        // `rt_ref` leaves out what is the thread's stack by its address;
        // with the stack's references wanted, `rt_ref_all` records them
        // all. Both write nothing in a burst that records no references.
        let routine = match self.refs {
            Refs::All => self.rt.reference_all,
            _ => self.rt.reference,
        };
        Ok(call_routine(self.em, routine, Arg::Preset, None, |em| {
            em.e(Instruction::with2(Code::Lea_r64_m, Register::RDX, operand))?;
            if fs {
                em.e(Instruction::with2(
                    Code::Add_r64_rm64,
                    Register::RDX,
                    MemoryOperand::new(
                        Register::None,
                        Register::None,
                        1,
                        0,
                        4,
                        false,
                        Register::FS,
                    ),
                ))?;
            }
            em.e(Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RAX,
                rip(slot),
            ))
        })?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn decode(bytes: &[u8]) -> Instruction {
        Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode()
    }

    /// Loads, stores and read-modify-writes are told apart; `lea`, `nop`
    /// and prefetches touch no data.
    #[test]
    fn accesses_by_kind() {
        // mov rax, [rdi+8]
        assert_eq!(
            access(&decode(&[0x48, 0x8b, 0x47, 0x08])),
            Some((1, REF_LOAD))
        );
        // mov [rdi], rax
        assert_eq!(access(&decode(&[0x48, 0x89, 0x07])), Some((0, REF_STORE)));
        // add [rdi], eax
        assert_eq!(access(&decode(&[0x01, 0x07])), Some((0, REF_RMW)));
        // cmp qword [rdi], 0: a load
        assert_eq!(
            access(&decode(&[0x48, 0x83, 0x3f, 0x00])),
            Some((0, REF_LOAD))
        );
        // lea rax, [rdi+8]
        assert_eq!(access(&decode(&[0x48, 0x8d, 0x47, 0x08])), None);
        // nop dword [rax+rax]
        assert_eq!(access(&decode(&[0x0f, 0x1f, 0x44, 0x00, 0x00])), None);
        // prefetcht0 [rdi]
        assert_eq!(access(&decode(&[0x0f, 0x18, 0x0f])), None);
        // rep movsb: implicit operands only
        let movs = decode(&[0xf3, 0xa4]);
        assert_eq!(access(&movs), None);
        assert!(string_operation(&movs));
    }
}
