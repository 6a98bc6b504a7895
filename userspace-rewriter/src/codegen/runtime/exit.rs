//! `rt_exit`: an instrumented function is left (return, tail call, call
//! that does not return).
use burstyd_common::burst::{
    END_LEFT_CLONES, PATH_END_NORETURN, PATH_END_RETURN, PATH_INVALID, REC_COST, REC_PATH,
    SHADOW_ENTRY_SHIFT,
};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, dword_ptr, eax, ecx, esi, qword_ptr, r8, rax, rcx, rdi, rdx, rsi, rsp,
};

use super::asm::{
    E_ELAPSED, E_PATH, E_RSP, RipRel, SHADOW_ENTRY, if_measure, local, owner_gate, rdtsc,
    shadow_base, tag,
};
use super::asm::{FRAME, NO_PATH};

/// `rt_exit(eax = fid | NO_PATH, ecx = kind)`: PATH record (`w0 = tag |
/// kind << 32 | fid`, `w1 = path`; none with `NO_PATH`); for returns and
/// tail calls (not `PATH_END_NORETURN`), pop the shadow entry of this
/// frame (restoring the caller's path register); for returns, say where
/// the return goes. Clobbers rax, rcx, rdx.
///
/// The pop drops the entries of dead deeper frames (rsp below ours) and
/// matches this frame by rsp; without a match the path becomes
/// `PATH_INVALID`.
///
/// With `measure`: the time-stamp counter is read first, and the PATH
/// record (when there is one) is followed by a COST record (`w0 = tag`,
/// `w1` = that reading - `path_start`). A pop that matches restores the
/// caller's measurement, `path_start = rdtsc - elapsed` (its path goes on
/// as if the callee had taken no time); no match leaves `path_start` alone
/// (the path is `PATH_INVALID` anyway). `PATH_END_NORETURN` sets
/// `path_start = rdtsc` after the records: what follows is a new path (a
/// jump into a `.cold` part's clone sets its path start inline right
/// after) or a call of a function that does not return. Without
/// `measure`, the routine is the plain one behind a single
/// compare-and-branch.
///
/// Where a return goes: calls in the clones push the *original* return
/// address, so the program's stack never holds a clone address. The clone
/// returns with `lea rsp, [rsp + 8 + n]; jmp [rsp - 16 - n]` through the
/// slot below the return address (`[program rsp - 8]`, in the returning
/// frame's dead red zone, which no signal frame touches): `rt_exit` writes
/// there the clone return site of the original return address (the
/// `ret_table` lookup), or, when the caller was not instrumented, the
/// original return address itself and the burst ends
/// (`rt_end(END_LEFT_CLONES)`). A thread that does not own the burst
/// changes nothing but the slot, which gets the original return address:
/// it returns to the original code.
pub(super) fn exit(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
    lookup: CodeLabel,
    end: CodeLabel,
) -> Result<(), IcedError> {
    let mut measured = a.create_label();
    a.set_label(entry)?;
    if_measure(a, control, measured)?;
    body(a, control, emit, lookup, end, false)?;
    a.set_label(&mut measured)?;
    body(a, control, emit, lookup, end, true)
}

/// The routine, with or without the measurement.
fn body(
    a: &mut CodeAssembler,
    control: u64,
    emit: CodeLabel,
    lookup: CodeLabel,
    end: CodeLabel,
    measure: bool,
) -> Result<(), IcedError> {
    let mut nopath = a.create_label();
    let mut lp = a.create_label();
    let mut pop_dead = a.create_label();
    let mut nomatch = a.create_label();
    let mut fix = a.create_label();
    let mut leave = a.create_label();
    let mut noreturn = a.create_label();
    let mut resume = a.create_label();
    let mut done = a.create_label();
    let mut not_owner = a.create_label();

    owner_gate(a, control, rdx, not_owner)?;
    a.push(rcx)?; // the kind, for after the pop
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.lea(r8, qword_ptr(rsp + (FRAME + 32)))?; // the program's rsp
    a.test(eax, NO_PATH)?;
    a.jne(nopath)?;
    if measure {
        // The path's cost in rdi (rdtsc takes rax and rdx; rcx is kept).
        a.mov(esi, eax)?;
        rdtsc(a)?;
        a.rip_rm(Code::Sub_r64_rm64, rax, local!(control, path_start))?;
        a.mov(rdi, rax)?;
        a.mov(eax, esi)?;
    }
    a.push(rcx)?;
    a.mov(eax, eax)?;
    a.shl(rcx, 32)?;
    a.or(rax, rcx)?;
    a.mov(rdx, tag(REC_PATH))?;
    a.or(rax, rdx)?;
    a.rip_rm(Code::Mov_r64_rm64, rdx, local!(control, path))?;
    a.call(emit)?;
    a.pop(rcx)?;
    if measure {
        a.mov(rax, tag(REC_COST))?;
        a.mov(rdx, rdi)?;
        a.call(emit)?;
        a.mov(rcx, qword_ptr(rsp + 24))?; // the kind
    }
    a.set_label(&mut nopath)?;
    a.cmp(ecx, PATH_END_NORETURN as i32)?;
    a.je(if measure { noreturn } else { done })?;

    // Pop: drop entries of dead deeper frames, match this one by rsp.
    shadow_base(a, control, rdx)?;
    a.rip_rm(Code::Mov_r64_rm64, rsi, local!(control, depth))?;
    a.set_label(&mut lp)?;
    a.test(rsi, rsi)?;
    a.je(nomatch)?;
    a.mov(rdi, rsi)?;
    a.shl(rdi, SHADOW_ENTRY_SHIFT)?;
    a.mov(rax, qword_ptr(rdx + rdi + (E_RSP - SHADOW_ENTRY)))?;
    a.cmp(rax, r8)?;
    a.jb(pop_dead)?;
    a.ja(nomatch)?;
    a.mov(rax, qword_ptr(rdx + rdi + (E_PATH - SHADOW_ENTRY)))?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path), rax)?;
    a.dec(rsi)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, depth), rsi)?;
    if measure {
        // The caller's path goes on from where it was at the call, once
        // this routine is done (`resume`): rdi = its elapsed ticks, rsi =
        // 1 (a frame matched; lookup and rt_end keep both).
        a.mov(rdi, qword_ptr(rdx + rdi + (E_ELAPSED - SHADOW_ENTRY)))?;
        a.mov(esi, 1)?;
    }
    a.jmp(fix)?;
    a.set_label(&mut pop_dead)?;
    a.dec(rsi)?;
    a.jmp(lp)?;
    a.set_label(&mut nomatch)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, depth), rsi)?;
    a.mov(rax, PATH_INVALID)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path), rax)?;
    if measure {
        a.xor(esi, esi)?;
    }

    // A return: its clone return site, or the original and the burst ends.
    let after = if measure { resume } else { done };
    a.set_label(&mut fix)?;
    a.cmp(dword_ptr(rsp + 24), PATH_END_RETURN as i32)?;
    a.jne(after)?;
    a.mov(rax, qword_ptr(r8))?;
    a.call(lookup)?;
    a.test(rax, rax)?;
    a.je(leave)?;
    a.mov(qword_ptr(r8 - 8), rax)?;
    a.jmp(after)?;
    a.set_label(&mut leave)?;
    a.mov(rax, qword_ptr(r8))?;
    a.mov(qword_ptr(r8 - 8), rax)?;
    a.mov(eax, END_LEFT_CLONES as u32)?;
    a.call(end)?;
    if measure {
        // The caller's path resumes last: the pop and the return-site
        // lookup are in neither path.
        a.set_label(&mut resume)?;
        a.test(esi, esi)?;
        a.je(done)?;
        rdtsc(a)?;
        a.sub(rax, rdi)?;
        a.rip_mr(Code::Mov_rm64_r64, local!(control, path_start), rax)?;
        a.jmp(done)?;
        // A new path starts after the records.
        a.set_label(&mut noreturn)?;
        rdtsc(a)?;
        a.rip_mr(Code::Mov_rm64_r64, local!(control, path_start), rax)?;
    }
    a.set_label(&mut done)?;
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.pop(rcx)?;
    a.ret()?;
    a.set_label(&mut not_owner)?;
    a.mov(rax, qword_ptr(rsp + FRAME))?;
    a.mov(qword_ptr(rsp + (FRAME - 8)), rax)?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use burstyd_common::burst::{
        END_LEFT_CLONES, PATH_END_NORETURN, PATH_END_RETURN, PATH_END_TAIL, PATH_INVALID, REC_COST,
        REC_END, REC_PATH,
    };

    use super::super::NO_PATH;
    use super::super::asm::tag;
    use super::super::testing::{
        CLONE_LO, FRAME_CLOBBERS, Harness, PAST, Regs, SLACK, assert_within, end_ticks, tsc,
    };

    /// An original return address the table translates, and its clone.
    const ORIG: u64 = 0x40_2000;
    const CLONE: u64 = CLONE_LO + 0x800;

    fn exit(h: &mut Harness, fid: u64, kind: u64) {
        let before = Regs {
            rax: fid,
            rcx: kind,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.exit, before);
        before.assert_preserved(&after, FRAME_CLOBBERS);
    }

    /// What the jump slot holds before `rt_exit` runs.
    const UNTOUCHED: u64 = 0xdead_beef;

    /// A burst with the shadow stack `entries`, path 5, the original
    /// return address `ORIG`, and a return-site table with `ORIG` →
    /// `CLONE`.
    fn setup(entries: impl FnOnce(u64) -> Vec<(u64, u64)>) -> Harness {
        let mut h = Harness::in_burst(entries);
        h.set_ret_slot(ORIG);
        h.set_jump_slot(UNTOUCHED);
        h.set_ret_table(&[
            (ORIG - 0x10, CLONE - 0x10),
            (ORIG, CLONE),
            (ORIG + 4, CLONE + 8),
        ]);
        h
    }

    /// (depth, path, jump slot); the return address itself is never
    /// written (the program's stack holds original addresses only).
    fn state(h: &Harness, ret: u64) -> (u64, u64, u64) {
        assert_eq!(h.ret_slot(), ret, "the return address was written");
        (h.loc().depth, h.loc().path, h.jump_slot())
    }

    /// Return and tail call: PATH record `(tag | kind << 32 | fid, path)`,
    /// the matching entry popped (the caller's path restored); a return
    /// goes to the clone return site of its original return address, a
    /// tail call leaves the slot alone (its callee returns on its own).
    #[test]
    fn return_pops_the_matching_frame() {
        for (kind, slot) in [(PATH_END_RETURN, CLONE), (PATH_END_TAIL, UNTOUCHED)] {
            let mut h = setup(|p| vec![(p + 0x100, 11), (p, 22)]);
            exit(&mut h, 7, kind);
            assert_eq!(h.ring()[..2], [tag(REC_PATH) | (kind << 32) | 7, 5]);
            assert_eq!(state(&h, ORIG), (1, 22, slot));
            assert_eq!((h.ctl().heads[0], h.ctl().active, h.ctl().ended), (2, 1, 0));
        }
    }

    #[test]
    fn drops_dead_deeper_entries() {
        let mut h = setup(|p| vec![(p + 0x100, 11), (p, 22), (p - 0x40, 33), (p - 0x80, 44)]);
        exit(&mut h, 7, PATH_END_RETURN);
        assert_eq!(state(&h, ORIG), (1, 22, CLONE));
    }

    /// No entry for this frame: the dead ones are dropped, live outer ones
    /// kept, and the caller's path is unknown.
    #[test]
    fn no_match_invalidates_the_path() {
        let mut h = setup(|p| vec![(p + 0x100, 11), (p + 8, 22)]);
        exit(&mut h, 7, PATH_END_RETURN);
        assert_eq!(state(&h, ORIG), (2, PATH_INVALID, CLONE));

        let mut h = setup(|p| vec![(p + 0x100, 11), (p - 8, 22)]);
        exit(&mut h, 7, PATH_END_RETURN);
        assert_eq!(state(&h, ORIG), (1, PATH_INVALID, CLONE));

        let mut h = setup(|_| vec![]);
        exit(&mut h, 7, PATH_END_RETURN);
        assert_eq!(state(&h, ORIG), (0, PATH_INVALID, CLONE));
        assert_eq!(h.ring()[..2], [tag(REC_PATH) | 7, 5]);
    }

    /// A thread that does not own the burst changes nothing but the jump
    /// slot, which gets the original return address (it leaves the
    /// clones), with the burst left running.
    #[test]
    fn only_the_bursts_thread_exits() {
        for kind in [PATH_END_RETURN, PATH_END_TAIL] {
            let mut h = setup(|p| vec![(p, 22)]);
            h.loc_mut().owner = 0;
            exit(&mut h, 7, kind);
            assert_eq!(state(&h, ORIG), (1, 5, ORIG));
            assert_eq!((h.ctl().heads[0], h.ctl().active, h.ctl().ended), (0, 1, 0));
        }
    }

    /// NO_PATH: no record, the frame is still popped.
    #[test]
    fn no_path_writes_no_record() {
        let mut h = setup(|p| vec![(p, 22)]);
        exit(&mut h, u64::from(NO_PATH) | 7, PATH_END_RETURN);
        assert_eq!(h.ctl().heads[0], 0);
        assert_eq!(state(&h, ORIG), (0, 22, CLONE));
    }

    /// A call that does not return: the record only; the shadow stack, the
    /// path and the slot are left alone.
    #[test]
    fn noreturn_only_records() {
        let mut h = setup(|p| vec![(p, 22)]);
        exit(&mut h, 7, PATH_END_NORETURN);
        assert_eq!(
            h.ring()[..2],
            [tag(REC_PATH) | (PATH_END_NORETURN << 32) | 7, 5]
        );
        assert_eq!(state(&h, ORIG), (1, 5, UNTOUCHED));
        assert_eq!((h.ctl().heads[0], h.ctl().active), (2, 1));
    }

    /// A return address that is no call's in the clones (the caller was
    /// not instrumented) ends the burst (END_LEFT_CLONES after the PATH
    /// record) and returns to it. Only the return-site table counts: an
    /// address the instruction table knows is not a return site.
    #[test]
    fn untranslatable_return_ends_the_burst() {
        let mut h = setup(|p| vec![(p, 22)]);
        h.set_ret_slot(ORIG + 1);
        h.set_table(&[(ORIG + 1, CLONE + 1)]);
        exit(&mut h, 7, PATH_END_RETURN);
        assert_eq!(
            h.ring()[..4],
            [
                tag(REC_PATH) | 7,
                5,
                tag(REC_END) | END_LEFT_CLONES,
                end_ticks(&h, 3)
            ]
        );
        assert_eq!(state(&h, ORIG + 1), (0, 22, ORIG + 1));
        let c = h.ctl();
        assert_eq!((c.active, h.loc().owner, c.ended, c.heads[0]), (0, 0, 1, 4));
    }

    /// What the caller's path had run at the call, in the measurement
    /// tests (`elapsed` of the entry that is popped).
    const CALLER: u64 = 50_000_000;

    /// [`setup`] with `measure`, `elapsed` = [`CALLER`] in every entry and
    /// `path_start` = `PAST` ticks before the returned counter.
    fn measured(entries: impl FnOnce(u64) -> Vec<(u64, u64)>) -> (Harness, u64) {
        let mut h = setup(entries);
        h.ctl_mut().measure = 1;
        for e in h.loc_mut().shadow.iter_mut() {
            e.elapsed = CALLER;
        }
        let t0 = tsc();
        h.loc_mut().path_start = t0 - PAST;
        (h, t0)
    }

    /// The COST record at ring words `at..at + 2`.
    #[track_caller]
    fn assert_cost(h: &Harness, at: usize, t0: u64, t1: u64) {
        assert_eq!(h.ring()[at], tag(REC_COST));
        assert_within(h.ring()[at + 1], PAST, PAST + SLACK, "cost");
        assert_within(h.ring()[at + 1], PAST, t1 - t0 + PAST, "cost");
    }

    /// Without `measure`: no COST record, `path_start` untouched (also by
    /// the pop).
    #[test]
    fn without_measure_nothing_is_timed() {
        for kind in [PATH_END_RETURN, PATH_END_TAIL, PATH_END_NORETURN] {
            let mut h = setup(|p| vec![(p + 0x100, 11), (p, 22)]);
            h.loc_mut().shadow[1].elapsed = CALLER;
            h.loc_mut().path_start = 0x1234;
            exit(&mut h, 7, kind);
            assert_eq!(h.ring()[..4], [tag(REC_PATH) | (kind << 32) | 7, 5, 0, 0]);
            assert_eq!((h.ctl().heads[0], h.loc().path_start), (2, 0x1234));
        }
    }

    /// With `measure`, return and tail call: PATH then COST record, the
    /// frame popped, and the caller's path goes on as if the callee had
    /// taken no time: `path_start` = now - the entry's `elapsed`.
    #[test]
    fn measure_records_the_cost_and_restores_the_callers_start() {
        for (kind, slot) in [(PATH_END_RETURN, CLONE), (PATH_END_TAIL, UNTOUCHED)] {
            let (mut h, t0) = measured(|p| vec![(p + 0x100, 11), (p, 22)]);
            exit(&mut h, 7, kind);
            let t1 = tsc();
            assert_eq!(h.ring()[..2], [tag(REC_PATH) | (kind << 32) | 7, 5]);
            assert_cost(&h, 2, t0, t1);
            assert_eq!(h.ctl().heads[0], 4);
            assert_eq!(state(&h, ORIG), (1, 22, slot));
            assert_within(h.loc().path_start, t0 - CALLER, t1 - CALLER, "path_start");
        }
    }

    /// With `measure` and `NO_PATH`: no records, the caller's start is
    /// still restored by the pop.
    #[test]
    fn measure_without_path_restores_the_callers_start() {
        let (mut h, t0) = measured(|p| vec![(p, 22)]);
        exit(&mut h, u64::from(NO_PATH) | 7, PATH_END_RETURN);
        let t1 = tsc();
        assert_eq!(h.ctl().heads[0], 0);
        assert_eq!(state(&h, ORIG), (0, 22, CLONE));
        assert_within(h.loc().path_start, t0 - CALLER, t1 - CALLER, "path_start");
    }

    /// With `measure` and no matching entry: the records, the path
    /// invalid, and `path_start` left alone.
    #[test]
    fn measure_without_a_match_leaves_the_start() {
        let (mut h, t0) = measured(|p| vec![(p + 0x100, 11), (p - 8, 22)]);
        exit(&mut h, 7, PATH_END_RETURN);
        let t1 = tsc();
        assert_eq!(h.ring()[..2], [tag(REC_PATH) | 7, 5]);
        assert_cost(&h, 2, t0, t1);
        assert_eq!(state(&h, ORIG), (1, PATH_INVALID, CLONE));
        assert_eq!(h.loc().path_start, t0 - PAST);
    }

    /// With `measure`, a call that does not return: PATH and COST records,
    /// the shadow stack, path and slot alone, and a new path starts
    /// (`path_start` = the counter after the records).
    #[test]
    fn measure_noreturn_records_and_starts_a_path() {
        let (mut h, t0) = measured(|p| vec![(p, 22)]);
        let t_before = tsc();
        exit(&mut h, 7, PATH_END_NORETURN);
        let t1 = tsc();
        assert_eq!(
            h.ring()[..2],
            [tag(REC_PATH) | (PATH_END_NORETURN << 32) | 7, 5]
        );
        assert_cost(&h, 2, t0, t1);
        assert_eq!(state(&h, ORIG), (1, 5, UNTOUCHED));
        assert_within(h.loc().path_start, t_before, t1, "path_start");
    }

    /// With `measure`, a return out of the clones: PATH, COST, then END.
    #[test]
    fn measure_untranslatable_return_costs_then_ends() {
        let (mut h, t0) = measured(|p| vec![(p, 22)]);
        h.set_ret_slot(ORIG + 1);
        exit(&mut h, 7, PATH_END_RETURN);
        let t1 = tsc();
        assert_eq!(h.ring()[..2], [tag(REC_PATH) | 7, 5]);
        assert_cost(&h, 2, t0, t1);
        assert_eq!(
            h.ring()[4..6],
            [tag(REC_END) | END_LEFT_CLONES, end_ticks(&h, 5)]
        );
        assert_eq!(state(&h, ORIG + 1), (0, 22, ORIG + 1));
        assert_eq!((h.ctl().active, h.ctl().ended), (0, 1));
    }

    /// With `measure`, a thread that does not own the burst changes
    /// nothing but the slot.
    #[test]
    fn measure_only_for_the_bursts_thread() {
        let (mut h, t0) = measured(|p| vec![(p, 22)]);
        h.loc_mut().owner = 0;
        exit(&mut h, 7, PATH_END_RETURN);
        assert_eq!(state(&h, ORIG), (1, 5, ORIG));
        assert_eq!((h.ctl().heads[0], h.loc().path_start), (0, t0 - PAST));
    }
}
