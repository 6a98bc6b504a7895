//! [`Emitter`]: the instruction list the clones and the runtime are written
//! into. Labels are placeholder IPs that iced's block encoder resolves when
//! it encodes the whole region at its final address (so every branch to the
//! original code is a rel32, within ±2 GiB of the binary).

use std::collections::HashMap;

use iced_x86::{Code, IcedError, Instruction, MemoryOperand, OpKind, Register};

/// Labels are instruction IPs the block encoder links; this range is
/// non-canonical, so no real address collides with one.
pub(super) const LABEL_BASE: u64 = 0x8000_0000_0000_0000;

/// What an instruction holds that depends on where the module is loaded
/// (besides its branches and RIP-relative operands, which the batch
/// encoder classifies by their targets): the relocation of a cached clone
/// image needs to find it ([`super::relocs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tag {
    /// The first immediate is a `fid` (`fid_base` + index).
    Fid,
    /// A `dq` holding an address of the original code.
    OrigQword,
}

/// An instruction list with labels (several labels may name one point).
pub(super) struct Emitter {
    pub(super) out: Vec<Instruction>,
    /// `(index in out, what)`, in index order.
    pub(super) tags: Vec<(usize, Tag)>,
    next: u64,
    pending: Vec<u64>,
    alias: HashMap<u64, u64>,
}

impl Emitter {
    pub(super) fn new() -> Self {
        Emitter {
            out: Vec::new(),
            tags: Vec::new(),
            next: 0,
            pending: Vec::new(),
            alias: HashMap::new(),
        }
    }

    pub(super) fn label(&mut self) -> u64 {
        self.next += 1;
        LABEL_BASE + self.next
    }

    pub(super) fn bind(&mut self, l: u64) {
        self.pending.push(l);
    }

    pub(super) fn emit(&mut self, mut i: Instruction) {
        match self.pending.first() {
            Some(&first) => {
                i.set_ip(first);
                for &o in &self.pending[1..] {
                    self.alias.insert(o, first);
                }
                self.pending.clear();
            }
            None => i.set_ip(0),
        }
        self.out.push(i);
    }

    pub(super) fn e(&mut self, i: Result<Instruction, IcedError>) -> Result<(), IcedError> {
        self.emit(i?);
        Ok(())
    }

    /// Tags the instruction emitted last.
    pub(super) fn tag_last(&mut self, t: Tag) {
        debug_assert!(!self.out.is_empty());
        self.tags.push((self.out.len() - 1, t));
    }

    /// Drops everything emitted since `mark` (a function that failed).
    pub(super) fn truncate(&mut self, mark: usize) {
        self.out.truncate(mark);
        while self.tags.last().is_some_and(|&(i, _)| i >= mark) {
            self.tags.pop();
        }
        self.pending.clear();
    }

    /// Takes what was emitted so far (a batch to encode), with every label
    /// bound here that named the same point as another replaced by that
    /// one; returns the instructions and those aliases (label → the label
    /// an instruction carries). Labels stay unique across batches. The
    /// tags are taken with them ([`Self::tags`] indexes the batch).
    pub(super) fn take(&mut self) -> (Vec<Instruction>, HashMap<u64, u64>) {
        if !self.pending.is_empty() {
            self.emit(Instruction::with(Code::Zero_bytes));
        }
        let alias = std::mem::take(&mut self.alias);
        let resolve = |t: u64| alias.get(&t).copied().unwrap_or(t);
        let mut out = std::mem::take(&mut self.out);
        for i in &mut out {
            if i.op_count() > 0 && matches!(i.op0_kind(), OpKind::NearBranch64) {
                i.set_near_branch64(resolve(i.near_branch64()));
            }
            if i.is_ip_rel_memory_operand() {
                i.set_memory_displacement64(resolve(i.memory_displacement64()));
            }
        }
        (out, alias)
    }

    // --- small instruction helpers ---

    pub(super) fn lea_rsp(&mut self, d: i64) -> Result<(), IcedError> {
        self.e(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, d),
        ))
    }
    pub(super) fn push(&mut self, r: Register) -> Result<(), IcedError> {
        self.e(Instruction::with1(Code::Push_r64, r))
    }
    pub(super) fn pop(&mut self, r: Register) -> Result<(), IcedError> {
        self.e(Instruction::with1(Code::Pop_r64, r))
    }
    pub(super) fn pushf(&mut self) {
        self.emit(Instruction::with(Code::Pushfq));
    }
    pub(super) fn popf(&mut self) {
        self.emit(Instruction::with(Code::Popfq));
    }
    pub(super) fn jmp(&mut self, target: u64) -> Result<(), IcedError> {
        self.e(Instruction::with_branch(Code::Jmp_rel32_64, target))
    }
    pub(super) fn call(&mut self, target: u64) -> Result<(), IcedError> {
        self.e(Instruction::with_branch(Code::Call_rel32_64, target))
    }
    pub(super) fn jcc(&mut self, code: Code, target: u64) -> Result<(), IcedError> {
        self.e(Instruction::with_branch(code, target))
    }
    /// `mov r64, imm64` (shortest form chosen by the encoder).
    pub(super) fn mov_imm(&mut self, r: Register, v: u64) -> Result<(), IcedError> {
        if v <= u32::MAX as u64 {
            self.e(Instruction::with2(Code::Mov_r32_imm32, r32(r), v as u32))
        } else {
            self.e(Instruction::with2(Code::Mov_r64_imm64, r, v))
        }
    }
    /// `op r64, [abs]` RIP-relative.
    pub(super) fn rm(&mut self, code: Code, r: Register, addr: u64) -> Result<(), IcedError> {
        self.e(Instruction::with2(code, r, rip(addr)))
    }
    /// `op [abs], r64` RIP-relative.
    pub(super) fn mr(&mut self, code: Code, addr: u64, r: Register) -> Result<(), IcedError> {
        self.e(Instruction::with2(code, rip(addr), r))
    }
}

/// The operand for our own data at `addr` (see [`super::operand::data_operand`]).
pub(super) fn rip(addr: u64) -> MemoryOperand {
    super::operand::data_operand(addr)
}

fn r32(r: Register) -> Register {
    r.full_register32()
}
