//! `rt_unwind`: a jump to another frame (an exception landing, `longjmp`).
use burstyd_common::burst::{END_LEFT_CLONES, PATH_INVALID, REC_UNWIND};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, eax, qword_ptr, r8, rax, rcx, rdi, rdx, rsi, rsp,
};

use super::asm::FRAME;
use super::asm::{
    RipRel, drop_dead_frames, local, owner_gate, shadow_base, start_path_if_measured, tag,
};

/// `rt_unwind(rax = target) -> rax`: the clone of an indirect jump that
/// runs after the stack pointer was loaded from a computed value (the
/// unwinder's `__builtin_eh_return` into a landing pad, `longjmp`): the
/// program's `rsp` is already the target frame's.
///
/// Drops the shadow entries of the frames left (rsp at or below the
/// program's, as `rt_enter` does), makes the path `PATH_INVALID` (the
/// target is no path start unless its clone says so: a landing pad's
/// clone begins with a stub that sets its path start), writes an UNWIND
/// record (`w0 = tag`, `w1` = the shadow depth left) and returns the
/// target's clone from the instruction table (`rt_lookup`, every module);
/// a target that was not rewritten ends the burst (`END_LEFT_CLONES`) and
/// is returned unchanged. A thread that does not own the burst gets the
/// target unchanged and changes nothing. Clobbers rcx, rdx (and rax).
///
/// With `measure`, once the target's clone is found `path_start = rdtsc`
/// (after the record and the lookup): the landing pad's clone sets its
/// path start inline right after, and that path is measured from here.
/// Without, it costs one compare-and-branch more than the plain routine.
pub(super) fn unwind(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
    lookup: CodeLabel,
    end: CodeLabel,
) -> Result<(), IcedError> {
    let mut out = a.create_label();
    let mut left = a.create_label();
    let mut not_owner = a.create_label();

    a.set_label(entry)?;
    owner_gate(a, control, rdx, not_owner)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.mov(rsi, rax)?; // the target
    a.lea(r8, qword_ptr(rsp + (FRAME + 24)))?; // the program's rsp
    shadow_base(a, control, rdx)?;
    a.mov(rcx, rsi)?; // the target, while rsi holds the depth
    a.rip_rm(Code::Mov_r64_rm64, rsi, local!(control, depth))?;
    drop_dead_frames(a)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, depth), rsi)?;
    a.mov(rdx, rsi)?;
    a.mov(rsi, rcx)?;
    a.mov(rax, PATH_INVALID)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path), rax)?;
    a.mov(rax, tag(REC_UNWIND))?;
    a.call(emit)?;
    a.mov(rax, rsi)?;
    a.call(lookup)?;
    a.test(rax, rax)?;
    a.je(left)?;
    a.mov(rsi, rax)?; // the clone
    start_path_if_measured(a, control)?;
    a.mov(rax, rsi)?;
    a.jmp(out)?;
    a.set_label(&mut left)?;
    a.mov(eax, END_LEFT_CLONES as u32)?;
    a.call(end)?;
    a.mov(rax, rsi)?;
    a.set_label(&mut out)?;
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.ret()?;
    a.set_label(&mut not_owner)?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use burstyd_common::burst::{END_LEFT_CLONES, PATH_INVALID, REC_END, REC_UNWIND};

    use super::super::asm::tag;
    use super::super::testing::{
        CLONE_LO, FRAME_CLOBBERS, Harness, Regs, assert_within, end_ticks, tsc,
    };

    /// A landing pad the instruction table translates, and its clone.
    const PAD: u64 = 0x40_3000;
    const CLONE: u64 = CLONE_LO + 0x900;

    fn unwind(h: &mut Harness, target: u64) -> u64 {
        let before = Regs {
            rax: target,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.unwind, before);
        before.assert_preserved(&after, FRAME_CLOBBERS);
        after.rax
    }

    fn setup(entries: impl FnOnce(u64) -> Vec<(u64, u64)>) -> Harness {
        let mut h = Harness::in_burst(entries);
        h.set_table(&[
            (PAD - 0x10, CLONE - 0x10),
            (PAD, CLONE),
            (PAD + 4, CLONE + 8),
        ]);
        h
    }

    /// The frames below the program's rsp (left by the jump) are dropped,
    /// the path is invalid, the UNWIND record gives the depth left, and
    /// the target goes to its clone; the burst goes on.
    #[test]
    fn drops_the_frames_left_and_continues_in_the_clone() {
        let mut h = setup(|p| vec![(p + 0x200, 1), (p + 8, 2), (p, 3), (p - 0x40, 4)]);
        assert_eq!(unwind(&mut h, PAD), CLONE);
        let p = h.prog_rsp();
        let left: Vec<(u64, u64)> = h.loc().shadow[..h.loc().depth as usize]
            .iter()
            .map(|e| (e.rsp, e.path))
            .collect();
        assert_eq!(left, [(p + 0x200, 1), (p + 8, 2)]);
        assert_eq!(h.loc().path, PATH_INVALID);
        assert_eq!(h.ring()[..2], [tag(REC_UNWIND), 2]);
        assert_eq!((h.ctl().heads[0], h.ctl().active, h.ctl().ended), (2, 1, 0));
    }

    /// A target with no clone ends the burst and is returned unchanged.
    #[test]
    fn a_target_without_clone_leaves_the_burst() {
        let mut h = setup(|p| vec![(p + 0x100, 1)]);
        assert_eq!(unwind(&mut h, PAD + 1), PAD + 1);
        assert_eq!(
            h.ring()[..4],
            [
                tag(REC_UNWIND),
                1,
                tag(REC_END) | END_LEFT_CLONES,
                end_ticks(&h, 3)
            ]
        );
        assert_eq!((h.ctl().active, h.ctl().ended), (0, 1));
    }

    /// Another thread gets the original target and changes nothing.
    #[test]
    fn only_the_bursts_thread_is_translated() {
        let mut h = setup(|p| vec![(p - 8, 1)]);
        h.loc_mut().owner = 0;
        assert_eq!(unwind(&mut h, PAD), PAD);
        assert_eq!((h.loc().depth, h.loc().path, h.ctl().heads[0]), (1, 5, 0));
    }

    /// Without `measure`, `path_start` is left alone.
    #[test]
    fn without_measure_nothing_is_timed() {
        let mut h = setup(|p| vec![(p + 0x200, 1), (p - 0x40, 4)]);
        h.loc_mut().path_start = 0x1234;
        assert_eq!(unwind(&mut h, PAD), CLONE);
        assert_eq!(h.loc().path_start, 0x1234);
        assert_eq!((h.ctl().heads[0], h.loc().depth), (2, 1));
    }

    /// With `measure`, the landing pad's path is measured from the jump
    /// (`path_start` = the counter once the clone is found); the rest as
    /// without.
    #[test]
    fn measure_starts_the_landing_pads_path() {
        let mut h = setup(|p| vec![(p + 0x200, 1), (p - 0x40, 4)]);
        h.ctl_mut().measure = 1;
        h.loc_mut().path_start = 0x1234;
        let t0 = tsc();
        assert_eq!(unwind(&mut h, PAD), CLONE);
        let t1 = tsc();
        assert_within(h.loc().path_start, t0, t1, "path_start");
        assert_eq!(h.loc().path, PATH_INVALID);
        assert_eq!(h.ring()[..4], [tag(REC_UNWIND), 1, 0, 0]);
        assert_eq!((h.ctl().heads[0], h.loc().depth), (2, 1));

        // Leaving the clones: the burst ends, nothing to measure.
        let mut h = setup(|p| vec![(p + 0x100, 1)]);
        h.ctl_mut().measure = 1;
        h.loc_mut().path_start = 0x1234;
        assert_eq!(unwind(&mut h, PAD + 1), PAD + 1);
        assert_eq!((h.loc().path_start, h.ctl().ended), (0x1234, 1));
    }
}
