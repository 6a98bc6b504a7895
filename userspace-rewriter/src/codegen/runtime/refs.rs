//! `rt_ref`: a data reference of memory mode, unless it is into the
//! thread's own stack.
use iced_x86::IcedError;
use iced_x86::code_asm::{CodeAssembler, CodeLabel, rcx, rdx, rsp};

use super::asm::FRAME;

/// Bytes above the program's `rsp` taken for the thread's own stack (the
/// default stack size of glibc's threads and of the main thread's limit).
pub(crate) const STACK_SPAN: u64 = 8 << 20;

/// The red zone below the program's `rsp`, the stack's too.
const RED_ZONE: i64 = 128;

/// `rt_ref(rax = w0, rdx = address)`, from the standard frame: an address
/// from the program's red zone up to [`STACK_SPAN`] above its `rsp` is
/// the thread's own stack and writes nothing; any other is `rt_emit`'s
/// record (a tail call). This catches the stack references that the
/// rewriter cannot tell by their operand (a local's address passed in a
/// register). Clobbers rcx and the flags.
pub(super) fn reference(
    a: &mut CodeAssembler,
    entry: &mut CodeLabel,
    emit: CodeLabel,
) -> Result<(), IcedError> {
    let mut stack = a.create_label();
    a.set_label(entry)?;
    // rcx = address - (program rsp - red zone); program rsp = rsp + FRAME.
    a.mov(rcx, rdx)?;
    a.sub(rcx, rsp)?;
    a.sub(rcx, (FRAME - RED_ZONE) as i32)?;
    a.cmp(rcx, (STACK_SPAN as i64 + RED_ZONE) as i32)?;
    a.jb(stack)?;
    a.jmp(emit)?;
    a.set_label(&mut stack)?;
    a.ret()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Harness, Regs};
    use super::STACK_SPAN;

    /// Calls rt_ref(w0, address), checking that only rcx is clobbered;
    /// returns the words written.
    fn reference(h: &mut Harness, address: u64) -> Vec<u64> {
        h.loc_mut().budget = 10;
        let head = h.ctl().heads[0];
        let before = Regs {
            rax: 0x7000_0000_0040_1000,
            rdx: address,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.reference, before);
        before.assert_preserved(&after, &["rcx"]);
        let written = (h.ctl().heads[0] - head) as usize;
        h.ring()[head as usize..head as usize + written].to_vec()
    }

    /// The thread's own stack (its red zone, up to 8 MiB above rsp) is
    /// left out; below the red zone and beyond the span, and anywhere
    /// else, the record is written.
    #[test]
    fn leaves_out_the_threads_own_stack() {
        let mut h = Harness::new();
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
