//! What every routine needs besides [`CodeAssembler`]'s own methods:
//! control-block fields reached RIP-relatively at absolute addresses, and
//! the thread pointer `fs:[0]`.
//!
//! `CodeAssembler` builds RIP-relative operands only to its own labels, so
//! these helpers add raw [`Instruction`]s whose memory operand has base RIP
//! and `memory_displacement64` = the absolute target (iced-x86's
//! convention; the block encoder turns it into a rel32 displacement from
//! wherever the instruction lands and fails when that is out of ±2 GiB).
//! A pending label and a pending `lock()` prefix apply to them as to any
//! other instruction.
use burstyd_common::burst::{SHADOW_ENTRY_SHIFT, ShadowEntry};
use iced_x86::code_asm::{CodeAssembler, CodeLabel, rax, rdx};
use iced_x86::{Code, IcedError, Instruction, MemoryOperand, Register};

/// Bytes between `rsp` inside a runtime routine (before it pushes anything)
/// and the program's `rsp` at the snippet: return address, rdx, rcx, rax,
/// flags, red zone.
pub const FRAME: i64 = 8 + 24 + 8 + 128;

/// `rt_exit` argument flag: the function has no valid path numbering.
pub const NO_PATH: u32 = 0x8000_0000;

/// The absolute address of a [`burstyd_common::burst::BurstControl`] field,
/// given the control block's address.
macro_rules! field {
    ($control:expr, $f:ident) => {
        $control + core::mem::offset_of!(burstyd_common::burst::BurstControl, $f) as u64
    };
}
pub(super) use field;

/// The operand "address" of the calling thread's
/// [`burstyd_common::burst::BurstRegs`] field `f` (in its TCB,
/// `fs:[TLS_REGS + offset]`; see [`crate::codegen::operand::TLS_TAG`]). The control
/// block's address is not needed (the registers are per thread).
macro_rules! local {
    ($_control:expr, $f:ident) => {{
        let _ = &$_control;
        $crate::codegen::operand::TLS_TAG
            + burstyd_common::burst::TLS_REGS as u64
            + core::mem::offset_of!(burstyd_common::burst::BurstRegs, $f) as u64
    }};
}
pub(super) use local;

/// The absolute address of the private [`burstyd_common::burst::BurstLocal`]
/// field `f`, given the control block's address.
macro_rules! private {
    ($control:expr, $f:ident) => {
        $control
            + burstyd_common::burst::LOCAL_OFFSET as u64
            + core::mem::offset_of!(burstyd_common::burst::BurstLocal, $f) as u64
    };
}
pub(super) use private;

/// Offset of a [`burstyd_common::burst::BurstSlot`] field from the slot.
macro_rules! slot {
    ($f:ident) => {
        core::mem::offset_of!(burstyd_common::burst::BurstSlot, $f) as i32
    };
}
pub(super) use slot;

/// `[rip + (addr - next_ip)]`, or `[addr]` for a control block mapped in
/// the low 2 GiB (see [`crate::codegen::operand::data_operand`]).
fn rip(addr: u64) -> MemoryOperand {
    crate::codegen::operand::data_operand(addr)
}

/// `fs:[0]` with a 32-bit zero displacement: the thread's TCB self-pointer
/// (x86-64 TLS ABI). Spelled out because `CodeAssembler::mov(rax, ..)`
/// would pick the 64-bit `moffs` form for a displacement-only operand.
fn fs0() -> MemoryOperand {
    MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS)
}

/// Instructions with a RIP-relative operand to an absolute address.
pub(super) trait RipRel {
    /// `code reg, [addr]` (also `lea reg, [addr]`).
    fn rip_rm(&mut self, code: Code, reg: impl Into<Register>, addr: u64) -> Result<(), IcedError>;
    /// `code [addr], reg`.
    fn rip_mr(&mut self, code: Code, addr: u64, reg: impl Into<Register>) -> Result<(), IcedError>;
    /// `code [addr], imm` (imm8/imm32 forms, sign-extended as the code says).
    fn rip_mi(&mut self, code: Code, addr: u64, imm: i32) -> Result<(), IcedError>;
    /// `code [addr]` (`inc`, `dec`).
    fn rip_m(&mut self, code: Code, addr: u64) -> Result<(), IcedError>;
    /// `code reg, fs:[0]`.
    fn fs0_rm(&mut self, code: Code, reg: impl Into<Register>) -> Result<(), IcedError>;
}

impl RipRel for CodeAssembler {
    fn rip_rm(&mut self, code: Code, reg: impl Into<Register>, addr: u64) -> Result<(), IcedError> {
        self.add_instruction(Instruction::with2(code, reg.into(), rip(addr))?)
    }
    fn rip_mr(&mut self, code: Code, addr: u64, reg: impl Into<Register>) -> Result<(), IcedError> {
        self.add_instruction(Instruction::with2(code, rip(addr), reg.into())?)
    }
    fn rip_mi(&mut self, code: Code, addr: u64, imm: i32) -> Result<(), IcedError> {
        self.add_instruction(Instruction::with2(code, rip(addr), imm)?)
    }
    fn rip_m(&mut self, code: Code, addr: u64) -> Result<(), IcedError> {
        self.add_instruction(Instruction::with1(code, rip(addr))?)
    }
    fn fs0_rm(&mut self, code: Code, reg: impl Into<Register>) -> Result<(), IcedError> {
        self.add_instruction(Instruction::with2(code, reg.into(), fs0())?)
    }
}

/// A record's first word's tag bits.
pub(super) const fn tag(t: u64) -> u64 {
    t << burstyd_common::burst::TAG_SHIFT
}

/// Bytes of a shadow entry; entry `i` is at `shadow + (i << SHADOW_ENTRY_SHIFT)`.
pub(super) const SHADOW_ENTRY: i32 = 1 << SHADOW_ENTRY_SHIFT;
/// Offsets in a shadow entry, to address the entry below `depth`
/// (`[shadow + (depth << SHADOW_ENTRY_SHIFT) - SHADOW_ENTRY + E_*]`).
pub(super) const E_RSP: i32 = core::mem::offset_of!(ShadowEntry, rsp) as i32;
pub(super) const E_PATH: i32 = core::mem::offset_of!(ShadowEntry, path) as i32;
pub(super) const E_ELAPSED: i32 = core::mem::offset_of!(ShadowEntry, elapsed) as i32;

/// `rax` = the time-stamp counter (`lfence; rdtsc; shl rdx, 32; or rax,
/// rdx`). Clobbers rdx (and the flags). `rdtsc` alone does not wait for
/// the instructions before it: the dependent loads of a cache-missing path
/// would still be in flight when its end is read (a path of eight misses
/// measured at a tenth of its time). `lfence` lets it execute only once
/// every instruction before has completed.
pub(super) fn rdtsc(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.lfence()?;
    a.rdtsc()?;
    a.shl(rdx, 32)?;
    a.or(rax, rdx)
}

/// Jumps to `measured` when the control block's `measure` is not 0 (the
/// one compare-and-branch a routine costs without measurement); clobbers
/// the flags.
pub(super) fn if_measure(
    a: &mut CodeAssembler,
    control: u64,
    measured: CodeLabel,
) -> Result<(), IcedError> {
    a.rip_mi(Code::Cmp_rm64_imm8, field!(control, measure), 0)?;
    a.jne(measured)
}

/// Unless the control block's `measure` is 0: `path_start` = the
/// time-stamp counter. Clobbers rax, rdx and the flags.
pub(super) fn start_path_if_measured(a: &mut CodeAssembler, control: u64) -> Result<(), IcedError> {
    let mut skip = a.create_label();
    a.rip_mi(Code::Cmp_rm64_imm8, field!(control, measure), 0)?;
    a.je(skip)?;
    rdtsc(a)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path_start), rax)?;
    a.set_label(&mut skip)
}

/// Jumps to `not_owner` unless the calling thread owns a running burst:
/// its TCB's slot pointer is set and that slot's private `owner` is its
/// `fs:[0]`; clobbers `scratch` and the flags. Every routine that writes
/// records or burst state starts with it: a thread that is not the
/// burst's (one still in a clone after its burst was ended from outside,
/// or any thread of a child forked in the middle of a burst, whose private
/// slot reads 0) must change nothing.
pub(super) fn owner_gate(
    a: &mut CodeAssembler,
    control: u64,
    scratch: iced_x86::code_asm::AsmRegister64,
    not_owner: CodeLabel,
) -> Result<(), IcedError> {
    a.rip_rm(Code::Mov_r64_rm64, scratch, local!(control, slot))?;
    a.test(scratch, scratch)?;
    a.je(not_owner)?;
    a.mov(
        scratch,
        iced_x86::code_asm::qword_ptr(scratch + slot!(owner)),
    )?;
    a.fs0_rm(Code::Cmp_r64_rm64, scratch)?;
    a.jne(not_owner)
}

/// `reg` = the calling thread's slot's shadow stack (after
/// [`owner_gate`]).
pub(super) fn shadow_base(
    a: &mut CodeAssembler,
    control: u64,
    reg: iced_x86::code_asm::AsmRegister64,
) -> Result<(), IcedError> {
    a.rip_rm(Code::Mov_r64_rm64, reg, local!(control, slot))?;
    a.add(reg, slot!(shadow))
}

/// Drops the shadow entries of frames the program left without `rt_exit`
/// (longjmp, unwinding): those whose rsp is at or below `r8` (the
/// program's rsp). In: `rdx` = the shadow stack, `rsi` = its depth; out:
/// `rsi` = the depth left (not stored). Clobbers `rdi` and the flags.
pub(super) fn drop_dead_frames(a: &mut CodeAssembler) -> Result<(), IcedError> {
    use iced_x86::code_asm::{qword_ptr, r8, rdi, rdx, rsi};
    let mut lp = a.create_label();
    let mut done = a.create_label();
    a.set_label(&mut lp)?;
    a.test(rsi, rsi)?;
    a.je(done)?;
    a.mov(rdi, rsi)?;
    a.shl(rdi, SHADOW_ENTRY_SHIFT)?;
    a.cmp(qword_ptr(rdx + rdi - SHADOW_ENTRY), r8)?;
    a.ja(done)?;
    a.dec(rsi)?;
    a.jmp(lp)?;
    a.set_label(&mut done)?;
    Ok(())
}
