//! A block's cost in the original code, as static analysis can bound it:
//! its steady-state throughput (see [`block_cost`]), the longer of its
//! longest loop-carried dependency chain and its instructions at four a
//! cycle. No cache misses, no branch mispredictions: a lower bound of what
//! the block takes, and a fair guess where it computes. In quarter cycles
//! (four independent additions cost one cycle, as one addition does).
//!
//! Used to weigh bursts by the original time they cover (see
//! ARCHITECTURE.md, "Estimates from bursts"): what a burst records is
//! timed in the clones, whose instrumentation costs more than the code
//! around it where checks are dense.

use iced_x86::{
    Instruction, InstructionInfo, InstructionInfoFactory, Mnemonic, OpAccess, Register,
};

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
/// 1 for a block with any instruction): its steady-state throughput, as
/// block throughput is defined by BHive, uiCA and llvm-mca (the block run
/// back to back): the longer of its longest loop-carried dependency (a
/// register's value at the block's start to the same register's at its
/// end, each instruction's latency and a load's on top) and its
/// instructions at four a cycle. A chain that does not come back to its
/// own register overlaps with the next block's work and is not counted:
/// a loop of `x = f(x)` costs `f`'s latency, a loop of independent work
/// its width.
pub fn block_cost(insns: &[Instruction], info: &mut InstructionInfoFactory) -> u32 {
    if insns.is_empty() {
        return 0;
    }
    let ops: Vec<Op> = insns
        .iter()
        .map(|i| {
            let inf = info.info(i);
            let loads = inf.used_memory().iter().any(|m| reads(m.access()));
            let mut srcs: Vec<u16> = sources(inf).map(|s| s as u16).collect();
            if i.rflags_read() != 0 {
                srcs.push(FLAGS as u16);
            }
            let mut dsts: Vec<u16> = destinations(inf).map(|s| s as u16).collect();
            if i.rflags_modified() != 0 {
                dsts.push(FLAGS as u16);
            }
            Op {
                latency: latency(i) + if loads { LOAD } else { 0 },
                uops: 1 + u32::from(loads && i.mnemonic() != Mnemonic::Mov),
                srcs,
                dsts,
            }
        })
        .collect();
    let uops: u32 = ops.iter().map(|o| o.uops).sum();
    // The registers the block reads before it writes them: its inputs
    // (not the flags: no loop carries a flag from one run to the next).
    let mut written = [false; SLOTS];
    let mut inputs: Vec<u16> = Vec::new();
    for o in &ops {
        for &s in &o.srcs {
            if usize::from(s) != FLAGS && !written[usize::from(s)] && !inputs.contains(&s) {
                inputs.push(s);
            }
        }
        for &s in &o.dsts {
            written[usize::from(s)] = true;
        }
    }
    let recurrence = inputs
        .iter()
        .filter(|&&s| written[usize::from(s)])
        .map(|&s| chain_from(&ops, s))
        .max()
        .unwrap_or(0);
    (recurrence * CYCLE).max(uops).max(1)
}

/// One instruction, as the chains see it.
struct Op {
    /// Cycles to its result, a load's included.
    latency: u32,
    uops: u32,
    /// The slots its result depends on (read registers, address
    /// registers, flags read) and those it writes.
    srcs: Vec<u16>,
    dsts: Vec<u16>,
}

/// Register slots: every full register's number, and the flags at 0.
const SLOTS: usize = 512;
const FLAGS: usize = 0;

/// The registers an instruction's result depends on (read registers,
/// address registers).
fn sources(inf: &InstructionInfo) -> impl Iterator<Item = usize> + '_ {
    let regs = inf
        .used_registers()
        .iter()
        .filter(|u| reads(u.access()))
        .filter_map(|u| slot(u.register()));
    let addrs = inf
        .used_memory()
        .iter()
        .flat_map(|m| [m.base(), m.index()])
        .filter_map(slot);
    regs.chain(addrs)
}

/// The slots an instruction writes.
fn destinations(inf: &InstructionInfo) -> impl Iterator<Item = usize> + '_ {
    inf.used_registers()
        .iter()
        .filter(|u| writes(u.access()))
        .filter_map(|u| slot(u.register()))
}

/// The latency (cycles) from slot `s`'s value at the block's start to its
/// value at the block's end, along the longest dependency chain (0 when
/// the end value does not depend on the start value).
fn chain_from(ops: &[Op], s: u16) -> u32 {
    // `None`: the slot's value does not depend on `s`'s input.
    let mut ready: [Option<u32>; SLOTS] = [None; SLOTS];
    ready[usize::from(s)] = Some(0);
    for o in ops {
        let start = o.srcs.iter().filter_map(|&r| ready[usize::from(r)]).max();
        let done = start.map(|t| t + o.latency);
        for &d in &o.dsts {
            ready[usize::from(d)] = done;
        }
    }
    ready[usize::from(s)].unwrap_or(0)
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
        assert_eq!(flags, 2 * CYCLE, "the compare is not on rcx's chain");
        assert_eq!(cost(|a| a.nop()), 1);
    }

    /// A chain that does not come back to the register it started from
    /// overlaps with the next run of the block: only the width counts.
    /// density.c's dense loop (`x = (x ^ i) + (x >> 7)`, `i += 1`) is
    /// two cycles a run, its carried chain, not the three of its longest
    /// chain from the block's start.
    #[test]
    fn only_loop_carried_chains_count() {
        let open = cost(|a| {
            a.mov(rcx, rax)?;
            a.imul_2(rcx, rcx)?;
            a.imul_2(rcx, rcx)?;
            a.mov(qword_ptr(rdi), rcx)
        });
        assert_eq!(open, 4);
        let dense = cost(|a| {
            a.mov(rcx, rdx)?;
            a.add(rdx, 1)?;
            a.xor(rcx, rax)?;
            a.shr(rax, 7)?;
            a.add(rax, rcx)?;
            a.cmp(rsi, rdx)?;
            a.jne(0x1000)
        });
        assert_eq!(dense, 2 * CYCLE);
    }
}
