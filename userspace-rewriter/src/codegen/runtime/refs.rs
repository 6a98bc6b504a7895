//! `rt_ref`: a data reference of memory mode, unless this burst records
//! none or it is into the thread's own stack; `rt_ref_all`: the same
//! with the stack's (`--refs-stack`).
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{CodeAssembler, CodeLabel, rcx, rdx, rsp};

use super::asm::{FRAME, RipRel, local};

/// Bytes above the program's `rsp` taken for the thread's own stack (the
/// default stack size of glibc's threads and of the main thread's limit).
pub(crate) const STACK_SPAN: u64 = 8 << 20;

/// The red zone below the program's `rsp`, the stack's too.
const RED_ZONE: i64 = 128;

/// `rt_ref(rax = w0, rdx = address)`, from the standard frame: nothing
/// in a burst that records no references (its `refs` register 0, see
/// `BurstControl::refs_every`), which counts down the references it
/// records (at 0 the burst ends at its next check); nothing for an address from the
/// program's red zone up to [`STACK_SPAN`] above its `rsp` (the thread's
/// own stack); any other is `rt_emit`'s record (a tail call). This
/// catches the stack references that the rewriter cannot tell by their
/// operand (a local's address passed in a register). `rt_ref_all`
/// (`all`): the burst's check only. Clobber rcx and the flags.
pub(super) fn reference(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    all: &mut CodeLabel,
    emit: CodeLabel,
) -> Result<(), IcedError> {
    let mut none = a.create_label();
    let mut count = a.create_label();
    a.set_label(all)?;
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, refs), 0)?;
    a.je(none)?;
    a.jmp(count)?;
    a.set_label(entry)?;
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, refs), 0)?;
    a.je(none)?;
    // rcx = address - (program rsp - red zone); program rsp = rsp + FRAME.
    a.mov(rcx, rdx)?;
    a.sub(rcx, rsp)?;
    a.sub(rcx, (FRAME - RED_ZONE) as i32)?;
    a.cmp(rcx, (STACK_SPAN as i64 + RED_ZONE) as i32)?;
    a.jb(none)?;
    // One reference fewer to record; after the last, the next check ends
    // the burst (its budget drops to 1, as at a full ring).
    a.set_label(&mut count)?;
    a.rip_m(Code::Dec_rm64, local!(control, refs))?;
    a.jne(emit)?;
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, budget), 1)?;
    a.jbe(emit)?;
    a.rip_mi(Code::Mov_rm64_imm32, local!(control, budget), 1)?;
    a.jmp(emit)?;
    a.set_label(&mut none)?;
    a.ret()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Harness, Regs};
    use super::STACK_SPAN;

    /// Calls rt_ref(w0, address) (`rt_ref_all` with `all`), checking
    /// that only rcx is clobbered; returns the words written.
    fn reference_in(h: &mut Harness, address: u64, all: bool) -> Vec<u64> {
        h.loc_mut().budget = 10;
        let head = h.ctl().heads[0];
        let before = Regs {
            rax: 0x7000_0000_0040_1000,
            rdx: address,
            ..Regs::sentinel()
        };
        let routine = if all {
            h.rt.reference_all
        } else {
            h.rt.reference
        };
        let after = h.call(routine, before);
        before.assert_preserved(&after, &["rcx"]);
        let written = (h.ctl().heads[0] - head) as usize;
        h.ring()[head as usize..head as usize + written].to_vec()
    }

    fn reference(h: &mut Harness, address: u64) -> Vec<u64> {
        reference_in(h, address, false)
    }

    /// A burst that records no references (its `refs` register 0) writes
    /// none, through either routine; `rt_ref_all` keeps the stack's.
    #[test]
    fn a_burst_without_references_writes_none() {
        let mut h = Harness::new();
        let rsp = h.prog_rsp();
        h.loc_mut().refs = 0;
        assert_eq!(
            reference_in(&mut h, 0x5555_0000_1000, false),
            [] as [u64; 0]
        );
        assert_eq!(reference_in(&mut h, 0x5555_0000_1000, true), [] as [u64; 0]);
        h.loc_mut().refs = 1 << 40;
        assert_eq!(
            reference_in(&mut h, rsp + 8, true),
            [0x7000_0000_0040_1000, rsp + 8]
        );
    }

    /// A burst records `refs_burst` references: each counts down its
    /// `refs` register; the last one still goes out and drops the budget
    /// to 1 (the next check ends the burst), a budget already at 1 or 0
    /// stays; past it nothing is written. The stack's references, left
    /// out, do not count.
    #[test]
    fn the_last_reference_ends_the_burst_at_its_next_check() {
        let mut h = Harness::new();
        let rsp = h.prog_rsp();
        h.loc_mut().refs = 2;
        let a = 0x5555_0000_1000;
        assert_eq!(reference(&mut h, rsp + 8), [] as [u64; 0]);
        assert_eq!(reference(&mut h, a), [0x7000_0000_0040_1000, a]);
        assert_eq!((h.loc().refs, h.loc().budget), (1, 10));
        assert_eq!(reference(&mut h, a + 8), [0x7000_0000_0040_1000, a + 8]);
        assert_eq!((h.loc().refs, h.loc().budget), (0, 1));
        assert_eq!(reference(&mut h, a), [] as [u64; 0]);
        assert_eq!(reference_in(&mut h, a, true), [] as [u64; 0]);
        assert_eq!(h.ctl().truncated, 0, "not a truncation");
        // rt_ref_all counts too; a budget at or below 1 is kept.
        for budget in [0, 1] {
            h.loc_mut().refs = 1;
            let mut l = h.loc_mut();
            l.budget = budget;
            drop(l);
            let head = h.ctl().heads[0];
            let before = super::super::testing::Regs {
                rax: 0x7000_0000_0040_1000,
                rdx: rsp + 8,
                ..super::super::testing::Regs::sentinel()
            };
            h.call(h.rt.reference_all, before);
            assert_eq!(h.ctl().heads[0], head + 2);
            assert_eq!((h.loc().refs, h.loc().budget), (0, budget));
        }
    }

    /// The thread's own stack (its red zone, up to 8 MiB above rsp) is
    /// left out; below the red zone and beyond the span, and anywhere
    /// else, the record is written.
    #[test]
    fn leaves_out_the_threads_own_stack() {
        let mut h = Harness::new();
        h.loc_mut().refs = 1 << 40;
        let rsp = h.prog_rsp();
        for a in [rsp, rsp - 128, rsp + 8, rsp + STACK_SPAN - 1] {
            assert_eq!(
                reference(&mut h, a),
                [] as [u64; 0],
                "{a:#x} (rsp {rsp:#x})"
            );
        }
        for a in [rsp - 129, rsp + STACK_SPAN, 0x5555_0000_1000, 8] {
            assert_eq!(
                reference(&mut h, a),
                [0x7000_0000_0040_1000, a],
                "{a:#x} (rsp {rsp:#x})"
            );
            h.ctl_mut().tails[0] = h.ctl().heads[0];
        }
    }
}
