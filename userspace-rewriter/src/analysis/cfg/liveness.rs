//! Register and flags liveness per instruction ([`liveness`]), a backward
//! dataflow over the CFG with calls and exits modelled by the SysV ABI.
//! It lets the clone generator place Hirzel & Chilimbi's checks and the
//! Ball-Larus path-register updates without saving flags that are dead.

use std::collections::BTreeSet;

use iced_x86::{InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register, RflagsBits};
use serde::Serialize;

use super::types::{Block, Cfg, ExitKind};
use crate::analysis::disasm::{Flow, Insn};

/// GPR index (0 = rax ... 15 = r15, iced's order: rax rcx rdx rbx rsp rbp rsi
/// rdi r8..r15) of any-width general-purpose register.
pub(super) fn gpr_index(r: Register) -> Option<usize> {
    if !r.is_gpr() {
        return None;
    }
    let full = r.full_register();
    full.is_gpr64()
        .then(|| full as usize - Register::RAX as usize)
}

const RAX: u16 = 1 << 0;
const RCX: u16 = 1 << 1;
const RDX: u16 = 1 << 2;
const RBX: u16 = 1 << 3;
pub(super) const RSP: u16 = 1 << 4;
const RBP: u16 = 1 << 5;
const RSI: u16 = 1 << 6;
const RDI: u16 = 1 << 7;
const R8: u16 = 1 << 8;
const R9: u16 = 1 << 9;
const R10: u16 = 1 << 10;
const R11: u16 = 1 << 11;
const R12: u16 = 1 << 12;
const R13: u16 = 1 << 13;
const R14: u16 = 1 << 14;
const R15: u16 = 1 << 15;

/// SysV argument registers (plus `rax`, the vector-register count of
/// variadic calls).
const ARGS: u16 = RDI | RSI | RDX | RCX | R8 | R9 | RAX;
/// SysV caller-saved GPRs.
pub(super) const CALLER_SAVED: u16 = RAX | RCX | RDX | RSI | RDI | R8 | R9 | R10 | R11;
/// SysV callee-saved GPRs (and `rsp`).
const CALLEE_SAVED: u16 = RBX | RBP | R12 | R13 | R14 | R15 | RSP;

/// Status flags and DF as bits of [`LiveSet::flags`].
pub mod flag {
    /// Carry.
    pub(crate) const CF: u8 = 1 << 0;
    /// Parity.
    pub(crate) const PF: u8 = 1 << 1;
    /// Adjust.
    pub(crate) const AF: u8 = 1 << 2;
    /// Zero.
    pub const ZF: u8 = 1 << 3;
    /// Sign.
    pub const SF: u8 = 1 << 4;
    /// Overflow.
    pub const OF: u8 = 1 << 5;
    /// Direction.
    pub(crate) const DF: u8 = 1 << 6;
    /// The six status flags (what `add`/`sub`/`cmp` write).
    pub(crate) const STATUS: u8 = CF | PF | AF | ZF | SF | OF;
    /// All tracked flags.
    pub(crate) const ALL: u8 = STATUS | DF;
}

/// Registers and flags live at a point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LiveSet {
    /// Bit `n` = GPR `n` (rax rcx rdx rbx rsp rbp rsi rdi r8..r15).
    pub regs: u16,
    /// [`flag`] bits.
    pub flags: u8,
}

impl LiveSet {
    /// Everything live (the conservative answer).
    const ALL: LiveSet = LiveSet {
        regs: u16::MAX,
        flags: flag::ALL,
    };

    /// Whether any of the six status flags is live (instrumentation that
    /// clobbers them must save them here).
    pub fn status_flags_live(&self) -> bool {
        self.flags & flag::STATUS != 0
    }

    fn union(self, o: LiveSet) -> LiveSet {
        LiveSet {
            regs: self.regs | o.regs,
            flags: self.flags | o.flags,
        }
    }
}

fn iced_flags(bits: u32) -> u8 {
    let mut f = 0;
    for (iced, ours) in [
        (RflagsBits::CF, flag::CF),
        (RflagsBits::PF, flag::PF),
        (RflagsBits::AF, flag::AF),
        (RflagsBits::ZF, flag::ZF),
        (RflagsBits::SF, flag::SF),
        (RflagsBits::OF, flag::OF),
        (RflagsBits::DF, flag::DF),
    ] {
        if bits & iced != 0 {
            f |= ours;
        }
    }
    f
}

/// Uses and definitions of one instruction.
#[derive(Clone, Copy, Default)]
struct UseDef {
    use_: LiveSet,
    def: LiveSet,
}

fn use_def(insn: &Insn, factory: &mut InstructionInfoFactory, noreturn_call: bool) -> UseDef {
    let ins = &insn.instr;
    let mut ud = UseDef::default();
    match insn.flow {
        Flow::Call(_) | Flow::IndirectCall => {
            // SysV: arguments (and rsp) used; caller-saved and flags clobbered.
            ud.use_.regs = ARGS | RSP;
            ud.use_.flags = flag::DF;
            if !noreturn_call {
                ud.def.regs = CALLER_SAVED;
                ud.def.flags = flag::STATUS;
            }
        }
        Flow::Syscall => {
            ud.use_.regs = RAX | RDI | RSI | RDX | R10 | R8 | R9 | RSP;
            ud.def.regs = RAX | RCX | R11;
        }
        _ => {}
    }
    let info = factory.info(ins);
    for r in info.used_registers() {
        let Some(n) = gpr_index(r.register()) else {
            continue;
        };
        let bit = 1u16 << n;
        let size = r.register().size();
        match r.access() {
            OpAccess::Read | OpAccess::CondRead => ud.use_.regs |= bit,
            OpAccess::ReadWrite | OpAccess::ReadCondWrite => ud.use_.regs |= bit,
            // A 32/64-bit write defines the whole register; an 8/16-bit
            // write merges into the old value, which is thus used.
            OpAccess::Write if size >= 4 => ud.def.regs |= bit,
            OpAccess::Write | OpAccess::CondWrite => ud.use_.regs |= bit,
            OpAccess::None | OpAccess::NoMemAccess => {}
        }
    }
    for m in info.used_memory() {
        for r in [m.base(), m.index()] {
            if let Some(n) = gpr_index(r) {
                ud.use_.regs |= 1 << n;
            }
        }
    }
    ud.use_.flags |= iced_flags(ins.rflags_read());
    // Shifts and rotates by a count that may be zero leave the flags alone:
    // they do not kill them.
    let count_may_be_zero = matches!(
        ins.mnemonic(),
        Mnemonic::Shl
            | Mnemonic::Sal
            | Mnemonic::Shr
            | Mnemonic::Sar
            | Mnemonic::Rol
            | Mnemonic::Ror
            | Mnemonic::Rcl
            | Mnemonic::Rcr
            | Mnemonic::Shld
            | Mnemonic::Shrd
    ) && (0..ins.op_count()).any(|k| {
        ins.op_kind(k) == OpKind::Register && ins.op_register(k) == Register::CL
            || matches!(ins.op_kind(k), OpKind::Immediate8) && ins.immediate(k) & 0x3f == 0
    });
    if !count_may_be_zero {
        ud.def.flags |= iced_flags(ins.rflags_modified());
    } else {
        ud.use_.flags |= iced_flags(ins.rflags_modified());
    }
    // A def that is also a use stays live (transfer is use | (out - def)).
    ud
}

/// What is live after leaving the function through `kind` (SysV ABI).
fn exit_live(kind: ExitKind) -> LiveSet {
    match kind {
        ExitKind::Return => LiveSet {
            regs: RAX | RDX | CALLEE_SAVED,
            flags: flag::DF,
        },
        ExitKind::TailCall { .. } | ExitKind::IndirectTailCall => LiveSet {
            regs: ARGS | CALLEE_SAVED,
            flags: flag::DF,
        },
        ExitKind::NoReturnCall { .. } => LiveSet::default(),
        ExitKind::Trap | ExitKind::ColdJump { .. } | ExitKind::ContextJump => LiveSet::ALL,
    }
}

/// Register and flags liveness: for each instruction of `insns` (the slice
/// the CFG was built from), the set live *before* it.
///
/// Backward dataflow over the CFG's blocks and edges. Registers are the 16
/// GPRs at full width (a partial write is a read-modify-write); flags are
/// tracked one by one. Calls use the SysV argument registers and clobber the
/// caller-saved ones and the status flags; exits keep `rax`/`rdx` and the
/// callee-saved registers live on return, the argument registers on tail
/// calls, everything at traps and cold-part jumps. Instructions not in any
/// block get `LiveSet::ALL`.
///
/// The rewriter uses this to put instrumentation where the status flags are
/// dead, so that it need not save them (the "check" of Hirzel & Chilimbi's
/// Figure 3 is a decrement and a conditional branch, which clobbers them).
pub fn liveness(cfg: &Cfg, insns: &[Insn]) -> Vec<LiveSet> {
    let mut factory = InstructionInfoFactory::new();
    let noreturn_insns: BTreeSet<u64> = cfg
        .exits
        .iter()
        .filter(|e| matches!(e.kind, ExitKind::NoReturnCall { .. }))
        .map(|e| e.insn)
        .collect();
    let ud: Vec<UseDef> = insns
        .iter()
        .map(|i| use_def(i, &mut factory, noreturn_insns.contains(&i.addr)))
        .collect();
    let n = cfg.blocks.len();
    let mut succs = vec![Vec::new(); n];
    for e in &cfg.edges {
        succs[e.from].push(e.to);
    }
    let mut exit_out = vec![LiveSet::default(); n];
    for e in &cfg.exits {
        exit_out[e.block] = exit_out[e.block].union(exit_live(e.kind));
    }
    let transfer = |block: &Block, mut live: LiveSet, out: Option<&mut [LiveSet]>| {
        let mut out = out;
        for k in block.insns.clone().rev() {
            let u = ud[k];
            live = LiveSet {
                regs: (live.regs & !u.def.regs) | u.use_.regs,
                flags: (live.flags & !u.def.flags) | u.use_.flags,
            };
            if let Some(o) = out.as_deref_mut() {
                o[k] = live;
            }
        }
        live
    };
    let mut live_in = vec![LiveSet::default(); n];
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..n).rev() {
            let mut out = exit_out[b];
            for &s in &succs[b] {
                out = out.union(live_in[s]);
            }
            let inn = transfer(&cfg.blocks[b], out, None);
            if inn != live_in[b] {
                live_in[b] = inn;
                changed = true;
            }
        }
    }
    let mut result = vec![LiveSet::ALL; insns.len()];
    for (b, block) in cfg.blocks.iter().enumerate() {
        let mut out = exit_out[b];
        for &s in &succs[b] {
            out = out.union(live_in[s]);
        }
        transfer(block, out, Some(&mut result));
    }
    result
}
