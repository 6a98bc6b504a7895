//! Tuple profiles ([`Recording`](super::layout::Recording)): the tuples
//! the clones hand to `rt_tuple` (Sastry, Bodík & Smith's selector; the
//! runtime's compressor and the daemon's profiles do the rest).
//!
//! - A *value tuple* right after each load of an integer register from
//!   memory that is not the stack's (`mov`, `movzx`, `movsx`, `movsxd`
//!   with a general-purpose destination; the stack by the operand, as
//!   memory mode decides it: `rsp`-based, or `rbp`-based under a frame
//!   pointer): ⟨the load's original address, the destination register
//!   after it⟩, a byte or word destination cut to its own bits (the rest
//!   of the register is not the load's). Every such load, not only those
//!   of hot paths: the bursts already sample where the time goes, and a
//!   plan decision would need a profile before the first burst.
//! - A *target tuple* before each indirect call and indirect tail call:
//!   ⟨the instruction's original address, the original target⟩.
//!
//! The snippet is a runtime call in the standard frame
//! ([`call_routine`]), whose pushes leave every register's value as the
//! program had it: `rdx` = the value (or the target, loaded as the
//! original loads it, an `rsp`-based operand moved by the frame), `rax`
//! = the record's first word from a relocated slot (tag, kind, the
//! original address).
use burstyd_common::burst::{REC_TUPLE, TAG_SHIFT, TUPLE_KIND_SHIFT, TUPLE_TARGET, TUPLE_VALUE};
use iced_x86::{Code, Instruction, Mnemonic, OpKind, Register};

use super::emitter::rip;
use super::function::{FnGen, OutOfLine, Skip};
use super::instrument::{Arg, call_routine};
use super::references::frame_operand;

/// Original addresses at or above this do not fit a tuple record's site.
const SITE_LIMIT: u64 = 1 << burstyd_common::burst::TUPLE_COUNT_SHIFT;

/// The destination of a load that makes a value tuple (`None`: not one).
fn loaded_register(ins: &Instruction) -> Option<Register> {
    let load = matches!(
        ins.mnemonic(),
        Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd
    ) && ins.op_count() == 2
        && ins.op0_kind() == OpKind::Register
        && ins.op1_kind() == OpKind::Memory;
    let r = ins.op0_register();
    (load && r.is_gpr()).then_some(r)
}

impl FnGen<'_> {
    /// The value tuple of instruction `k`, right after its copy, when it
    /// is a load that makes one (see the module doc).
    pub(super) fn value_tuple(&mut self, k: usize) -> Result<(), Skip> {
        if !self.values {
            return Ok(());
        }
        let ins = self.insns[k].instr;
        let Some(dst) = loaded_register(&ins) else {
            return Ok(());
        };
        let base = ins.memory_base().full_register();
        let stack = base == Register::RSP || (base == Register::RBP && self.frame_pointer);
        let high = matches!(
            dst,
            Register::AH | Register::BH | Register::CH | Register::DH
        );
        let full = dst.full_register();
        if stack || high || full == Register::RSP {
            self.stats.tuples_left_out += 1;
            return Ok(());
        }
        let Some(slot) = self.tuple_slot(k, TUPLE_VALUE) else {
            return Ok(());
        };
        self.stats.value_tuples += 1;
        let cut = match dst.size() {
            1 => Some(Code::Movzx_r32_rm8),
            2 => Some(Code::Movzx_r32_rm16),
            _ => None,
        };
        Ok(call_routine(
            self.em,
            self.rt.tuple,
            Arg::Preset,
            None,
            |em| {
                if full != Register::RDX {
                    em.e(Instruction::with2(Code::Mov_r64_rm64, Register::RDX, full))?;
                }
                if let Some(code) = cut {
                    let part = if code == Code::Movzx_r32_rm8 {
                        Register::DL
                    } else {
                        Register::DX
                    };
                    em.e(Instruction::with2(code, Register::EDX, part))?;
                }
                em.e(Instruction::with2(
                    Code::Mov_r64_rm64,
                    Register::RAX,
                    rip(slot),
                ))
            },
        )?)
    }

    /// The target tuple of the indirect call, tail call or jump-table
    /// jump `k`, before it (its original target).
    pub(super) fn target_tuple(&mut self, k: usize) -> Result<(), Skip> {
        if !self.targets {
            return Ok(());
        }
        let ins = self.reloc(k);
        let load = match ins.op0_kind() {
            OpKind::Register if ins.op0_register().full_register() != Register::RSP => {
                Instruction::with2(Code::Mov_r64_rm64, Register::RDX, ins.op0_register())
            }
            OpKind::Memory
                if ins.memory_segment() != Register::GS
                    && ins.memory_segment() != Register::FS
                    && ins.memory_base() != Register::ESP =>
            {
                Instruction::with2(Code::Mov_r64_rm64, Register::RDX, frame_operand(&ins))
            }
            _ => {
                self.stats.tuples_left_out += 1;
                return Ok(());
            }
        };
        let Some(slot) = self.tuple_slot(k, TUPLE_TARGET) else {
            return Ok(());
        };
        self.stats.target_tuples += 1;
        Ok(call_routine(
            self.em,
            self.rt.tuple,
            Arg::Preset,
            None,
            |em| {
                em.e(load)?;
                em.e(Instruction::with2(
                    Code::Mov_r64_rm64,
                    Register::RAX,
                    rip(slot),
                ))
            },
        )?)
    }

    /// A slot holding the first word of instruction `k`'s tuple record of
    /// `kind` (count 0: the runtime counts), or `None` (counted) when its
    /// address does not fit the record.
    fn tuple_slot(&mut self, k: usize, kind: u64) -> Option<u64> {
        let pc = self.avma(self.insns[k].addr);
        if pc >= SITE_LIMIT {
            self.stats.tuples_left_out += 1;
            return None;
        }
        let slot = self.em.label();
        self.out_of_line.push((
            slot,
            OutOfLine::Slot(REC_TUPLE << TAG_SHIFT | kind << TUPLE_KIND_SHIFT | pc),
        ));
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn decode(bytes: &[u8]) -> Instruction {
        Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode()
    }

    /// Loads of general-purpose registers make value tuples; stores,
    /// `lea`, arithmetic with a memory source and vector loads do not.
    #[test]
    fn loads_of_integer_registers_are_selected() {
        // mov rax, [rdi+8]
        assert_eq!(
            loaded_register(&decode(&[0x48, 0x8b, 0x47, 0x08])),
            Some(Register::RAX)
        );
        // movzx ecx, byte [rsi]
        assert_eq!(
            loaded_register(&decode(&[0x0f, 0xb6, 0x0e])),
            Some(Register::ECX)
        );
        // movsxd rdx, dword [rdi]
        assert_eq!(
            loaded_register(&decode(&[0x48, 0x63, 0x17])),
            Some(Register::RDX)
        );
        // mov al, [rdi]
        assert_eq!(loaded_register(&decode(&[0x8a, 0x07])), Some(Register::AL));
        // mov [rdi], rax
        assert_eq!(loaded_register(&decode(&[0x48, 0x89, 0x07])), None);
        // lea rax, [rdi+8]
        assert_eq!(loaded_register(&decode(&[0x48, 0x8d, 0x47, 0x08])), None);
        // add rax, [rdi]
        assert_eq!(loaded_register(&decode(&[0x48, 0x03, 0x07])), None);
        // movq xmm0, [rdi]
        assert_eq!(loaded_register(&decode(&[0xf3, 0x0f, 0x7e, 0x07])), None);
        // mov rax, rdi
        assert_eq!(loaded_register(&decode(&[0x48, 0x89, 0xf8])), None);
    }
}
