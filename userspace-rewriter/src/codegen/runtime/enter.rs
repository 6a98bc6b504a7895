//! `rt_enter`: an instrumented function was entered.
use burstyd_common::burst::{REC_ENTER, SHADOW_DEPTH, SHADOW_ENTRY_SHIFT};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, eax, edx, qword_ptr, r8, r8d, rax, rcx, rdi, rdx, rsi, rsp,
};

use super::asm::FRAME;
use super::asm::{
    E_ELAPSED, E_PATH, E_RSP, RipRel, drop_dead_frames, field, if_measure, local, owner_gate,
    rdtsc, shadow_base, tag,
};

/// `rt_enter(eax = fid | flags)`: push (rsp, caller's path), path = 0,
/// ENTER record (`w0 = tag | fid`, the flags stripped; `w1 = 0`). Shadow
/// entries at or below the new frame are dead (frames left by longjmp or
/// unwinding) and are dropped first. With the shadow stack full nothing is
/// pushed and `shadow_overflow` counts it. Nothing for a thread that does
/// not own the burst. Clobbers rax, rcx, rdx.
///
/// With `measure`, the pushed entry also gets `elapsed = rdtsc -
/// path_start` (the caller's path so far), and once the ENTER record is
/// written `path_start = rdtsc` (the callee's first path starts; with the
/// shadow stack full too). Without, the routine is the plain one behind a
/// single compare-and-branch, and executes no `rdtsc`.
///
/// "rsp" is the program's at the snippet, `[rsp + FRAME]` at entry: the
/// address of the activation's return address.
pub(super) fn enter(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
) -> Result<(), IcedError> {
    let mut measured = a.create_label();
    a.set_label(entry)?;
    if_measure(a, control, measured)?;
    body(a, control, emit, false)?;
    a.set_label(&mut measured)?;
    body(a, control, emit, true)
}

/// The routine, with or without the measurement.
fn body(
    a: &mut CodeAssembler,
    control: u64,
    emit: CodeLabel,
    measure: bool,
) -> Result<(), IcedError> {
    let mut store = a.create_label();
    let mut overflow = a.create_label();
    let mut not_owner = a.create_label();

    owner_gate(a, control, rcx, not_owner)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.lea(r8, qword_ptr(rsp + (FRAME + 24)))?; // the program's rsp
    shadow_base(a, control, rdx)?;
    a.rip_rm(Code::Mov_r64_rm64, rsi, local!(control, depth))?;
    drop_dead_frames(a)?;
    a.cmp(rsi, SHADOW_DEPTH as i32)?;
    a.jae(overflow)?;
    a.mov(rdi, rsi)?;
    a.shl(rdi, SHADOW_ENTRY_SHIFT)?;
    a.mov(qword_ptr(rdx + rdi + E_RSP), r8)?;
    a.rip_rm(Code::Mov_r64_rm64, rcx, local!(control, path))?;
    a.mov(qword_ptr(rdx + rdi + E_PATH), rcx)?;
    if measure {
        // The fid in r8 (rdtsc takes rax and rdx), the caller's path so
        // far in the entry.
        a.mov(r8d, eax)?;
        a.mov(rcx, rdx)?;
        rdtsc(a)?;
        a.rip_rm(Code::Sub_r64_rm64, rax, local!(control, path_start))?;
        a.mov(qword_ptr(rcx + rdi + E_ELAPSED), rax)?;
    }
    a.inc(rsi)?;
    a.set_label(&mut store)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, depth), rsi)?;
    a.rip_mi(Code::Mov_rm64_imm32, local!(control, path), 0)?;
    if measure {
        a.mov(eax, r8d)?;
    }
    a.and(eax, 0x7fff_ffff)?;
    a.mov(rdx, tag(REC_ENTER))?;
    a.or(rax, rdx)?;
    a.xor(edx, edx)?;
    a.call(emit)?;
    if measure {
        // The callee's first path starts once its ENTER record is written.
        rdtsc(a)?;
        a.rip_mr(Code::Mov_rm64_r64, local!(control, path_start), rax)?;
    }
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.ret()?;
    a.set_label(&mut overflow)?;
    if measure {
        a.mov(r8d, eax)?;
    }
    a.rip_m(Code::Inc_rm64, field!(control, shadow_overflow))?;
    a.jmp(store)?;
    a.set_label(&mut not_owner)?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use burstyd_common::burst::{REC_ENTER, SHADOW_DEPTH, ShadowEntry};

    use super::super::NO_PATH;
    use super::super::asm::tag;
    use super::super::testing::{FRAME_CLOBBERS, Harness, PAST, Regs, SLACK, assert_within, tsc};

    fn enter(h: &mut Harness, rax: u64) {
        let before = Regs {
            rax,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.enter, before);
        before.assert_preserved(&after, FRAME_CLOBBERS);
    }

    fn shadow(h: &mut Harness, entries: &[(u64, u64)]) {
        for (i, &(rsp, path)) in entries.iter().enumerate() {
            h.loc_mut().shadow[i] = ShadowEntry {
                rsp,
                path,
                ..Default::default()
            };
        }
        h.loc_mut().depth = entries.len() as u64;
    }

    fn entries(h: &Harness) -> Vec<(u64, u64)> {
        h.loc().shadow[..h.loc().depth as usize]
            .iter()
            .map(|e| (e.rsp, e.path))
            .collect()
    }

    /// Pushes (program rsp, caller's path), path = 0, ENTER record with
    /// the fid (NO_PATH and the upper half of rax stripped).
    #[test]
    fn pushes_the_frame_and_writes_enter_record() {
        let mut h = Harness::new();
        let p = h.prog_rsp();
        shadow(&mut h, &[(p + 0x100, 5)]);
        h.loc_mut().path = 77;
        enter(&mut h, 0xffff_ffff_0000_0000 | u64::from(NO_PATH) | 9);
        assert_eq!(entries(&h), [(p + 0x100, 5), (p, 77)]);
        assert_eq!(h.loc().path, 0);
        assert_eq!(h.ring()[..2], [tag(REC_ENTER) | 9, 0]);
        assert_eq!((h.ctl().heads[0], h.ctl().shadow_overflow), (2, 0));
    }

    /// A thread that does not own the burst pushes nothing and writes no
    /// record.
    #[test]
    fn only_the_bursts_thread_enters() {
        let mut h = Harness::new();
        let p = h.prog_rsp();
        shadow(&mut h, &[(p + 0x100, 5)]);
        h.loc_mut().path = 77;
        h.loc_mut().owner = 0;
        enter(&mut h, 9);
        assert_eq!(entries(&h), [(p + 0x100, 5)]);
        assert_eq!((h.loc().path, h.ctl().heads[0]), (77, 0));
    }

    /// Entries at or below the new frame's rsp (frames that were left
    /// without rt_exit: longjmp, unwinding) are dropped before the push.
    #[test]
    fn drops_dead_deeper_entries() {
        let mut h = Harness::new();
        let p = h.prog_rsp();
        shadow(
            &mut h,
            &[
                (p + 0x200, 1),
                (p + 8, 2),
                (p, 3),
                (p - 0x40, 4),
                (p - 0x80, 5),
            ],
        );
        h.loc_mut().path = 6;
        enter(&mut h, 1);
        assert_eq!(entries(&h), [(p + 0x200, 1), (p + 8, 2), (p, 6)]);

        // Every entry dead.
        shadow(&mut h, &[(p, 1), (p - 8, 2)]);
        h.loc_mut().path = 7;
        enter(&mut h, 1);
        assert_eq!(entries(&h), [(p, 7)]);
    }

    /// A full shadow stack pushes nothing and counts `shadow_overflow`;
    /// the path still restarts and the ENTER record is still written.
    #[test]
    fn full_shadow_stack_overflows() {
        let mut h = Harness::new();
        let p = h.prog_rsp();
        let live: Vec<(u64, u64)> = (0..SHADOW_DEPTH as u64)
            .map(|i| (p + 8 * (SHADOW_DEPTH as u64 - i), i))
            .collect();
        shadow(&mut h, &live);
        h.loc_mut().path = 99;
        enter(&mut h, 3);
        assert_eq!(h.loc().depth, SHADOW_DEPTH as u64);
        assert_eq!(entries(&h), live);
        assert_eq!((h.ctl().shadow_overflow, h.loc().path), (1, 0));
        assert_eq!(h.ring()[..2], [tag(REC_ENTER) | 3, 0]);

        // One dead entry on top makes room again.
        h.loc_mut().shadow[SHADOW_DEPTH - 1].rsp = p;
        h.loc_mut().path = 100;
        enter(&mut h, 3);
        assert_eq!(h.loc().depth, SHADOW_DEPTH as u64);
        let top = h.loc().shadow[SHADOW_DEPTH - 1];
        assert_eq!((top.rsp, top.path), (p, 100));
        assert_eq!(h.ctl().shadow_overflow, 1);
    }

    /// The `elapsed` of every entry in the shadow stack's first `n` slots.
    fn elapsed(h: &Harness, n: usize) -> Vec<u64> {
        h.loc().shadow[..n].iter().map(|e| e.elapsed).collect()
    }

    /// Without `measure`: neither the pushed entry's `elapsed` nor
    /// `path_start` is written.
    #[test]
    fn without_measure_nothing_is_timed() {
        let mut h = Harness::new();
        let p = h.prog_rsp();
        shadow(&mut h, &[(p + 0x100, 5)]);
        h.loc_mut().shadow[0].elapsed = 0xe0;
        h.loc_mut().shadow[1].elapsed = 0xe1;
        h.loc_mut().path_start = 0x1234;
        h.loc_mut().path = 77;
        enter(&mut h, 9);
        assert_eq!(entries(&h), [(p + 0x100, 5), (p, 77)]);
        assert_eq!(elapsed(&h, 2), [0xe0, 0xe1]);
        assert_eq!(h.loc().path_start, 0x1234);
        assert_eq!(h.ctl().heads[0], 2);
    }

    /// With `measure`: the pushed entry keeps the ticks the caller's path
    /// had run (`rdtsc - path_start`), and the callee's first path starts
    /// after the ENTER record; the record itself is unchanged and no other
    /// is written.
    #[test]
    fn measure_saves_the_callers_elapsed_and_starts_a_path() {
        let mut h = Harness::new();
        h.ctl_mut().measure = 1;
        let p = h.prog_rsp();
        shadow(&mut h, &[(p + 0x100, 5)]);
        h.loc_mut().shadow[0].elapsed = 0xe0;
        h.loc_mut().path = 77;
        let t0 = tsc();
        h.loc_mut().path_start = t0 - PAST;
        enter(&mut h, 0xffff_ffff_0000_0000 | u64::from(NO_PATH) | 9);
        let t1 = tsc();
        assert_eq!(entries(&h), [(p + 0x100, 5), (p, 77)]);
        assert_eq!(h.loc().shadow[0].elapsed, 0xe0);
        let e = h.loc().shadow[1].elapsed;
        assert_within(e, PAST, PAST + SLACK, "elapsed");
        assert_within(e, PAST, t1 - t0 + PAST, "elapsed");
        assert_within(h.loc().path_start, t0, t1, "path_start");
        assert_eq!(h.loc().path, 0);
        assert_eq!(h.ring()[..4], [tag(REC_ENTER) | 9, 0, 0, 0]);
        assert_eq!(h.ctl().heads[0], 2);
    }

    /// With `measure` and the shadow stack full: nothing pushed, but the
    /// callee's path still starts (and the fid still reaches the record).
    #[test]
    fn measure_with_a_full_shadow_stack_still_starts_the_path() {
        let mut h = Harness::new();
        h.ctl_mut().measure = 1;
        let p = h.prog_rsp();
        let live: Vec<(u64, u64)> = (0..SHADOW_DEPTH as u64)
            .map(|i| (p + 8 * (SHADOW_DEPTH as u64 - i), i))
            .collect();
        shadow(&mut h, &live);
        let t0 = tsc();
        h.loc_mut().path_start = t0 - PAST;
        enter(&mut h, 3);
        let t1 = tsc();
        assert_eq!(entries(&h), live);
        assert!(elapsed(&h, SHADOW_DEPTH).iter().all(|&e| e == 0));
        assert_eq!((h.ctl().shadow_overflow, h.loc().path), (1, 0));
        assert_eq!(h.ring()[..2], [tag(REC_ENTER) | 3, 0]);
        assert_within(h.loc().path_start, t0, t1, "path_start");
    }

    /// With `measure`, a thread that does not own the burst changes
    /// nothing either.
    #[test]
    fn measure_only_for_the_bursts_thread() {
        let mut h = Harness::new();
        h.ctl_mut().measure = 1;
        let p = h.prog_rsp();
        shadow(&mut h, &[(p + 0x100, 5)]);
        h.loc_mut().path = 77;
        h.loc_mut().path_start = 0x1234;
        h.loc_mut().owner = 0;
        enter(&mut h, 9);
        assert_eq!(entries(&h), [(p + 0x100, 5)]);
        assert_eq!(elapsed(&h, 2), [0, 0]);
        assert_eq!(
            (h.loc().path, h.loc().path_start, h.ctl().heads[0]),
            (77, 0x1234, 0)
        );
    }
}
