//! How generated code reaches data at an absolute address: the control
//! block and tables low in the address space, the thread's own burst
//! registers in its TCB, anything else RIP-relatively ([`data_operand`]).

/// A memory operand for the absolute address `addr` of burst state or of
/// the clones' own data: `[disp32]` (absolute, sign-extended) when `addr`
/// lies in the low 2 GiB, else `[rip + (addr - next_ip)]`. Both name the
/// same bytes; the absolute form reaches them from code anywhere in the
/// address space, which is what lets the clones of every module (the
/// executable near 0x55..., libraries near 0x7f...) share one control
/// block mapped low, while RIP-relative operands reach only ±2 GiB.
pub(crate) fn data_operand(addr: u64) -> iced_x86::MemoryOperand {
    use iced_x86::{MemoryOperand, Register};
    if addr >= TLS_TAG {
        // A thread's own burst registers: `fs:[disp32]` (see `TLS_TAG`).
        MemoryOperand::new(
            Register::None,
            Register::None,
            1,
            (addr - TLS_TAG) as i64,
            4,
            false,
            Register::FS,
        )
    } else if addr < LOW_STATE_LIMIT {
        MemoryOperand::new(
            Register::None,
            Register::None,
            1,
            addr as i64,
            4,
            false,
            Register::None,
        )
    } else {
        MemoryOperand::with_base_displ(Register::RIP, addr as i64)
    }
}

/// Addresses below this are reached with absolute `[disp32]` operands
/// (a 32-bit displacement is sign-extended: up to 2 GiB, minus room for
/// the largest field offset).
pub const LOW_STATE_LIMIT: u64 = 0x8000_0000 - 0x1_0000;

/// Marks an "address" that [`data_operand`] turns into `fs:[addr -
/// TLS_TAG]`: the calling thread's own
/// [`BurstRegs`](burstyd_common::burst::BurstRegs) in its TCB. No user
/// address is this high (it is in the kernel's half).
pub(crate) const TLS_TAG: u64 = 0xffff_f000_0000_0000;

#[cfg(test)]
mod tests {
    use iced_x86::{
        BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, Instruction,
        InstructionBlock, Register,
    };

    use super::data_operand;

    /// Encodes `add [addr], 1` at `ip` and decodes it back.
    fn roundtrip(addr: u64, ip: u64) -> Instruction {
        let i = Instruction::with2(Code::Add_rm64_imm8, data_operand(addr), 1).unwrap();
        let enc = BlockEncoder::encode(
            64,
            InstructionBlock::new(&[i], ip),
            BlockEncoderOptions::NONE,
        )
        .unwrap();
        Decoder::with_ip(64, &enc.code_buffer, ip, DecoderOptions::NONE).decode()
    }

    /// Low state is reached absolutely from code anywhere (a library's
    /// clones near 0x7f..., far beyond ±2 GiB of it); state elsewhere
    /// RIP-relatively. Either way the operand names the same address.
    #[test]
    fn low_state_is_absolute_and_reachable_from_anywhere() {
        let low = 0x3fff_a010;
        for ip in [0x40_1000, 0x5555_5555_8000, 0x7f12_3456_7000] {
            let d = roundtrip(low, ip);
            assert_eq!(d.memory_base(), Register::None, "at {ip:#x}");
            assert_eq!(d.memory_displacement64(), low);
        }
        let high = 0x5555_5556_0000;
        let d = roundtrip(high, 0x5555_5555_8000);
        assert_eq!(d.memory_base(), Register::RIP);
        assert_eq!(d.memory_displacement64(), high);
    }
}
