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
/// `BurstControl::refs_every`); nothing for an address from the
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
    a.set_label(all)?;
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, refs), 0)?;
    a.je(none)?;
    a.jmp(emit)?;
    a.set_label(entry)?;
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, refs), 0)?;
    a.je(none)?;
    // rcx = address - (program rsp - red zone); program rsp = rsp + FRAME.
    a.mov(rcx, rdx)?;
    a.sub(rcx, rsp)?;
    a.sub(rcx, (FRAME - RED_ZONE) as i32)?;
    a.cmp(rcx, (STACK_SPAN as i64 + RED_ZONE) as i32)?;
    a.jb(none)?;
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
        h.loc_mut().refs = 1;
        assert_eq!(
            reference_in(&mut h, rsp + 8, true),
            [0x7000_0000_0040_1000, rsp + 8]
        );
    }

    /// The thread's own stack (its red zone, up to 8 MiB above rsp) is
    /// left out; below the red zone and beyond the span, and anywhere
    /// else, the record is written.
    #[test]
    fn leaves_out_the_threads_own_stack() {
        let mut h = Harness::new();
        h.loc_mut().refs = 1;
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
