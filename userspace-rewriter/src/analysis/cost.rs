//! A block's cost in the original code, as static analysis can bound it:
//! the longer of its register dependency chain (each instruction's
//! latency, a load's on top, from the block's start with every input
//! ready) and its instructions at four a cycle. No cache misses, no branch
//! mispredictions: a lower bound of what the block takes, and a fair
//! guess where it computes. In quarter cycles (four independent
//! additions cost one cycle, as one addition does).
//!
//! Used to weigh bursts by the original time they cover (see
//! ARCHITECTURE.md, "Estimates from bursts"): what a burst records is
//! timed in the clones, whose instrumentation costs more than the code
//! around it where checks are dense.
use iced_x86::{Instruction, InstructionInfoFactory, Mnemonic, OpAccess, Register};

/// Quarter cycles of one cycle.
const CYCLE: u32 = 4;
/// A load's latency on top of the instruction's (an L1 hit).
const LOAD: u32 = 5;

/// The latency (cycles) of `i`'s result, without a load of its own.
fn latency(i: &Instruction) -> u32 {
    use Mnemonic::*;
    match i.mnemonic() {
        Imul | Mul | Mulx => 3,
        Div | Idiv => 26,
        Popcnt | Lzcnt | Tzcnt | Bsf | Bsr | Pdep | Pext => 3,
        Addss | Addsd | Subss | Subsd | Mulss | Mulsd | Addps | Addpd | Mulps | Mulpd | Vaddss
        | Vaddsd | Vsubss | Vsubsd | Vmulss | Vmulsd | Vaddps | Vaddpd | Vmulps | Vmulpd
        | Vfmadd231sd | Vfmadd231ss | Vfmadd213sd | Vfmadd132sd | Cvtsi2sd | Cvtsi2ss
        | Cvttsd2si | Cvtsd2ss | Cvtss2sd => 4,
        Divss | Vdivss | Divps => 11,
        Divsd | Vdivsd | Divpd => 14,
        Sqrtss | Sqrtsd | Vsqrtsd | Vsqrtss => 18,
        _ => 1,
    }
}

/// Whether an operand access reads the operand (maybe).
pub fn reads(a: OpAccess) -> bool {
    matches!(
        a,
        OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

/// Whether an operand access writes the operand (maybe).
pub fn writes(a: OpAccess) -> bool {
    matches!(
        a,
        OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

/// Where a register's value is tracked: its full register (`eax` is
/// `rax`); flags are one register.
fn slot(r: Register) -> Option<usize> {
    let f = r.full_register();
    (f != Register::None && f != Register::RIP).then_some(f as usize)
}

/// The cost of the instructions of one block, in quarter cycles (at least
/// 1 for a block with any instruction).
pub fn block_cost(insns: &[Instruction], info: &mut InstructionInfoFactory) -> u32 {
    if insns.is_empty() {
        return 0;
    }
    const FLAGS: usize = 0;
    // Ready times (cycles) by register; flags in slot 0 (`Register::None`
    // is never a value's register).
    let mut ready = [0u32; 512];
    let mut chain = 0u32;
    let mut uops = 0u32;
    for i in insns {
        let inf = info.info(i);
        let loads = inf.used_memory().iter().any(|m| reads(m.access()));
        let mut start = 0;
        for u in inf.used_registers() {
            if reads(u.access())
                && let Some(s) = slot(u.register())
            {
                start = start.max(ready[s]);
            }
        }
        // Registers that form the address.
        for m in inf.used_memory() {
            for r in [m.base(), m.index()] {
                if let Some(s) = slot(r) {
                    start = start.max(ready[s]);
                }
            }
        }
        if i.rflags_read() != 0 {
            start = start.max(ready[FLAGS]);
        }
        let done = start + latency(i) + if loads { LOAD } else { 0 };
        for u in inf.used_registers() {
            if writes(u.access())
                && let Some(s) = slot(u.register())
            {
                ready[s] = done;
            }
        }
        if i.rflags_modified() != 0 {
            ready[FLAGS] = done;
        }
        chain = chain.max(done);
        // A load folded into an operation is a second micro-op.
        uops += 1 + u32::from(loads && i.mnemonic() != Mnemonic::Mov);
    }
    (chain * CYCLE).max(uops).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::*;

    fn cost(f: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>) -> u32 {
        let mut a = CodeAssembler::new(64).unwrap();
        f(&mut a).unwrap();
        let insns = a.instructions().to_vec();
        block_cost(&insns, &mut InstructionInfoFactory::new())
    }

    /// A chain of dependent multiply-adds costs its latencies (3 + 1
    /// cycles each); the same instructions on independent registers cost
    /// their number at four a cycle, or the longest chain.
    #[test]
    fn chains_cost_their_latency_and_wide_code_its_width() {
        let chain = cost(|a| {
            for _ in 0..4 {
                a.imul_2(rax, rbx)?;
                a.add(rax, 1)?;
            }
            Ok(())
        });
        assert_eq!(chain, 4 * 4 * CYCLE);
        let wide = cost(|a| {
            for r in [rax, rcx, rdx, rsi, rdi, r8, r9, r10] {
                a.add(r, 1)?;
            }
            Ok(())
        });
        assert_eq!(wide, 8);
        let imuls = cost(|a| {
            for r in [rax, rcx, rdx, rsi] {
                a.imul_2(r, rbx)?;
            }
            Ok(())
        });
        assert_eq!(imuls, 3 * CYCLE);
    }

    /// A load adds its latency to what depends on it, and a chain through
    /// memory operands (pointer chasing) pays it every step; flags carry
    /// a dependency from `cmp` to `adc`.
    #[test]
    fn loads_and_flags_are_on_the_chain() {
        let chase = cost(|a| {
            for _ in 0..3 {
                a.mov(rax, qword_ptr(rax))?;
            }
            Ok(())
        });
        assert_eq!(chase, 3 * (1 + LOAD) * CYCLE);
        let flags = cost(|a| {
            a.cmp(rax, rbx)?;
            a.adc(rcx, 0)?;
            a.adc(rcx, 0)?;
            Ok(())
        });
        assert_eq!(flags, 3 * CYCLE);
        assert_eq!(cost(|a| a.nop()), CYCLE);
    }
}
