//! `rt_exit`: an instrumented function is left (return, tail call, call
//! that does not return).
use burstyd_common::burst::{
    END_LEFT_CLONES, PATH_END_NORETURN, PATH_END_RETURN, PATH_INVALID, REC_PATH,
};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, dword_ptr, eax, ecx, qword_ptr, r8, rax, rcx, rdi, rdx, rsi, rsp,
};

use super::asm::{RipRel, local, owner_gate, tag};
use super::{FRAME, NO_PATH};

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
    let mut nopath = a.create_label();
    let mut lp = a.create_label();
    let mut pop_dead = a.create_label();
    let mut nomatch = a.create_label();
    let mut fix = a.create_label();
    let mut leave = a.create_label();
    let mut done = a.create_label();
    let mut not_owner = a.create_label();

    a.set_label(entry)?;
    owner_gate(a, control, rdx, not_owner)?;
    a.push(rcx)?; // the kind, for after the pop
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.lea(r8, qword_ptr(rsp + (FRAME + 32)))?; // the program's rsp
    a.test(eax, NO_PATH)?;
    a.jne(nopath)?;
    a.push(rcx)?;
    a.mov(eax, eax)?;
    a.shl(rcx, 32)?;
    a.or(rax, rcx)?;
    a.mov(rdx, tag(REC_PATH))?;
    a.or(rax, rdx)?;
    a.rip_rm(Code::Mov_r64_rm64, rdx, local!(control, path))?;
    a.call(emit)?;
    a.pop(rcx)?;
    a.set_label(&mut nopath)?;
    a.cmp(ecx, PATH_END_NORETURN as i32)?;
    a.je(done)?;

    // Pop: drop entries of dead deeper frames, match this one by rsp.
    a.rip_rm(Code::Lea_r64_m, rdx, local!(control, shadow))?;
    a.rip_rm(Code::Mov_r64_rm64, rsi, local!(control, depth))?;
    a.set_label(&mut lp)?;
    a.test(rsi, rsi)?;
    a.je(nomatch)?;
    a.mov(rdi, rsi)?;
    a.shl(rdi, 4)?;
    a.mov(rax, qword_ptr(rdx + rdi - 16))?;
    a.cmp(rax, r8)?;
    a.jb(pop_dead)?;
    a.ja(nomatch)?;
    a.mov(rax, qword_ptr(rdx + rdi - 8))?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path), rax)?;
    a.dec(rsi)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, depth), rsi)?;
    a.jmp(fix)?;
    a.set_label(&mut pop_dead)?;
    a.dec(rsi)?;
    a.jmp(lp)?;
    a.set_label(&mut nomatch)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, depth), rsi)?;
    a.mov(rax, PATH_INVALID)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path), rax)?;

    // A return: its clone return site, or the original and the burst ends.
    a.set_label(&mut fix)?;
    a.cmp(dword_ptr(rsp + 24), PATH_END_RETURN as i32)?;
    a.jne(done)?;
    a.mov(rax, qword_ptr(r8))?;
    a.call(lookup)?;
    a.test(rax, rax)?;
    a.je(leave)?;
    a.mov(qword_ptr(r8 - 8), rax)?;
    a.jmp(done)?;
    a.set_label(&mut leave)?;
    a.mov(rax, qword_ptr(r8))?;
    a.mov(qword_ptr(r8 - 8), rax)?;
    a.mov(eax, END_LEFT_CLONES as u32)?;
    a.call(end)?;
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
        END_LEFT_CLONES, PATH_END_NORETURN, PATH_END_RETURN, PATH_END_TAIL, PATH_INVALID, REC_END,
        REC_PATH,
    };

    use super::super::NO_PATH;
    use super::super::asm::tag;
    use super::super::testing::{CLONE_LO, FRAME_CLOBBERS, Harness, Regs};

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
            assert_eq!((h.ctl().head, h.ctl().active, h.ctl().ended), (2, 1, 0));
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
            assert_eq!((h.ctl().head, h.ctl().active, h.ctl().ended), (0, 1, 0));
        }
    }

    /// NO_PATH: no record, the frame is still popped.
    #[test]
    fn no_path_writes_no_record() {
        let mut h = setup(|p| vec![(p, 22)]);
        exit(&mut h, u64::from(NO_PATH) | 7, PATH_END_RETURN);
        assert_eq!(h.ctl().head, 0);
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
        assert_eq!((h.ctl().head, h.ctl().active), (2, 1));
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
            [tag(REC_PATH) | 7, 5, tag(REC_END) | END_LEFT_CLONES, 0]
        );
        assert_eq!(state(&h, ORIG + 1), (0, 22, ORIG + 1));
        let c = h.ctl();
        assert_eq!((c.active, h.loc().owner, c.ended, c.head), (0, 0, 1, 4));
    }
}
