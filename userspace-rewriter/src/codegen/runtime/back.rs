//! `rt_back`: a path ended at a back edge.
use burstyd_common::burst::{PATH_END_BACK_EDGE, REC_COST, REC_PATH};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, dword_ptr, eax, ecx, qword_ptr, rax, rcx, rdx, rsp,
};

use super::asm::{RipRel, if_measure, local, owner_gate, rdtsc, tag};

/// `rt_back(eax = fid)`: PATH record (`w0 = tag | BACK_EDGE << 32 | fid`,
/// `w1 = path`). The caller then sets the restart value. Clobbers rax,
/// rcx, rdx.
///
/// With `measure` (for the burst's thread only): the time-stamp counter is
/// read first, the PATH record is followed by a COST record (`w0 = tag`,
/// `w1` = that reading - `path_start`), and then `path_start` = the counter
/// read again (the next path, which the caller's restart value starts,
/// begins after the records were written). Without, the routine is the
/// plain one behind a single compare-and-branch.
pub(super) fn back(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
) -> Result<(), IcedError> {
    let mut measured = a.create_label();
    let mut not_owner = a.create_label();
    a.set_label(entry)?;
    if_measure(a, control, measured)?;
    a.mov(eax, eax)?;
    a.mov(rdx, tag(REC_PATH) | (PATH_END_BACK_EDGE << 32))?;
    a.or(rax, rdx)?;
    a.rip_rm(Code::Mov_r64_rm64, rdx, local!(control, path))?;
    a.call(emit)?;
    a.ret()?;

    a.set_label(&mut measured)?;
    owner_gate(a, control, rcx, not_owner)?;
    a.mov(ecx, eax)?; // the fid
    rdtsc(a)?;
    a.rip_rm(Code::Sub_r64_rm64, rax, local!(control, path_start))?;
    a.push(rax)?; // the path's cost
    a.mov(eax, ecx)?;
    a.mov(rdx, tag(REC_PATH) | (PATH_END_BACK_EDGE << 32))?;
    a.or(rax, rdx)?;
    a.rip_rm(Code::Mov_r64_rm64, rdx, local!(control, path))?;
    a.call(emit)?;
    a.pop(rdx)?;
    a.mov(rax, tag(REC_COST))?;
    a.call(emit)?;
    rdtsc(a)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path_start), rax)?;
    a.set_label(&mut not_owner)?;
    a.ret()?;
    Ok(())
}

/// `rt_back_at([rsp + 8] = fid, [rsp + 16] = end increment)`: the whole
/// end of a path at a truncated edge, `path += end increment` then
/// [`back`]'s record, in a frame of its own: it preserves every register
/// and the flags. A clone calls it with
///
/// ```text
/// lea rsp, [rsp - 128] ; push end_increment ; push fid ; call rt_back_at
/// lea rsp, [rsp + 144]
/// ```
///
/// (5 instructions, where the standard frame takes 13 at each of the
/// thousands of truncated edges of an interpreter's dispatch). With
/// `measure`, `rt_back`'s COST record and new `path_start` too (the
/// registers `rdtsc` writes are among those it saves).
pub(super) fn back_at(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    back: CodeLabel,
) -> Result<(), IcedError> {
    a.set_label(entry)?;
    a.pushfq()?;
    a.push(rax)?;
    a.push(rcx)?;
    a.push(rdx)?;
    // Above the four saved words: the return address, fid, increment.
    a.mov(rax, qword_ptr(rsp + 48))?;
    a.rip_mr(Code::Add_rm64_r64, local!(control, path), rax)?;
    a.mov(eax, dword_ptr(rsp + 40))?;
    a.call(back)?;
    a.pop(rdx)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    a.popfq()?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use burstyd_common::burst::{PATH_END_BACK_EDGE, REC_COST, REC_PATH};

    use super::super::asm::tag;
    use super::super::testing::{
        FRAME_CLOBBERS, Harness, PAST, Regs, SLACK, assert_within, fs0, tsc,
    };

    fn back(h: &mut Harness, fid: u64) {
        let before = Regs {
            rax: fid,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.back, before);
        before.assert_preserved(&after, FRAME_CLOBBERS);
    }

    /// Without `measure`: the PATH record only, `path_start` untouched.
    #[test]
    fn without_measure_no_cost_record() {
        let mut h = Harness::new();
        h.loc_mut().path = 9;
        h.loc_mut().path_start = 0x1234;
        back(&mut h, 42);
        assert_eq!(
            h.ring()[..4],
            [tag(REC_PATH) | (PATH_END_BACK_EDGE << 32) | 42, 9, 0, 0]
        );
        assert_eq!((h.ctl().heads[0], h.loc().path_start), (2, 0x1234));
    }

    /// With `measure`: the PATH record, then the COST record with the
    /// ticks since `path_start`; then the next path starts (`path_start`
    /// = the counter after the records).
    #[test]
    fn measure_writes_the_cost_after_the_path_record() {
        let mut h = Harness::new();
        h.ctl_mut().measure = 1;
        h.ctl_mut().heads[0] = 2;
        h.loc_mut().path = 9;
        let t0 = tsc();
        h.loc_mut().path_start = t0 - PAST;
        back(&mut h, 42);
        let t1 = tsc();
        assert_eq!(
            h.ring()[2..5],
            [
                tag(REC_PATH) | (PATH_END_BACK_EDGE << 32) | 42,
                9,
                tag(REC_COST)
            ]
        );
        assert_within(h.ring()[5], PAST, PAST + SLACK, "cost");
        assert_within(h.ring()[5], PAST, t1 - t0 + PAST, "cost");
        assert_within(h.loc().path_start, t0, t1, "path_start");
        assert_eq!((h.ctl().heads[0], h.loc().path), (6, 9));
    }

    /// With `measure`, a thread that does not own the burst changes
    /// nothing.
    #[test]
    fn measure_only_for_the_bursts_thread() {
        let mut h = Harness::new();
        h.ctl_mut().measure = 1;
        h.loc_mut().owner = fs0() ^ 0x1000;
        h.loc_mut().path_start = 0x1234;
        back(&mut h, 42);
        assert_eq!((h.ctl().heads[0], h.loc().path_start), (0, 0x1234));
        assert_eq!(h.ring()[..2], [0, 0]);
    }

    /// PATH record `(tag | BACK_EDGE << 32 | fid, path)`; the fid is eax
    /// (the upper half of rax is ignored); nothing else changes.
    #[test]
    fn writes_back_edge_path_record() {
        let mut h = Harness::new();
        h.loc_mut().path = 0x1234_5678_9abc;
        h.loc_mut().depth = 3;
        h.ctl_mut().heads[0] = 2;
        let before = Regs {
            rax: 0xffff_0000_0000_0000 | 42,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.back, before);
        before.assert_preserved(&after, FRAME_CLOBBERS);
        assert_eq!(
            h.ring()[2..4],
            [
                tag(REC_PATH) | (PATH_END_BACK_EDGE << 32) | 42,
                0x1234_5678_9abc
            ]
        );
        let c = h.ctl();
        assert_eq!(
            (h.loc().path, h.loc().depth, c.heads[0]),
            (0x1234_5678_9abc, 3, 4)
        );
    }
}

#[cfg(test)]
mod back_at_tests {
    use burstyd_common::burst::{PATH_END_BACK_EDGE, REC_COST, REC_PATH};
    use iced_x86::code_asm::{CodeAssembler, bl, qword_ptr, rsp};

    use super::super::asm::tag;
    use super::super::testing::{Harness, PAST, Regs, SLACK, TEST_PAGE, assert_within, tsc};

    /// The clone's call sequence for `rt_back_at`, with the carry flag set
    /// (or clear) before it and read into `bl` after.
    fn site(at: u64, target: u64, carry: bool, fid: i32, inc: i32) -> Vec<u8> {
        let mut a = CodeAssembler::new(64).unwrap();
        if carry {
            a.stc().unwrap();
        } else {
            a.clc().unwrap();
        }
        a.lea(rsp, qword_ptr(rsp - 128)).unwrap();
        a.push(inc).unwrap();
        a.push(fid).unwrap();
        a.call(target).unwrap();
        a.lea(rsp, qword_ptr(rsp + 144)).unwrap();
        a.setc(bl).unwrap();
        a.ret().unwrap();
        a.assemble(at).unwrap()
    }

    /// `path += increment`, then the PATH record of `rt_back`; every
    /// register and the flags as they were (the carry either way).
    #[test]
    fn adds_the_increment_records_and_preserves_everything() {
        let mut h = Harness::new();
        h.loc_mut().path = 1000;
        h.ctl_mut().heads[0] = 0;
        for (k, carry) in [true, false].into_iter().enumerate() {
            let code = site(h.code_page(TEST_PAGE), h.rt.back_at, carry, 42, 7);
            h.load(TEST_PAGE, &code);
            let before = Regs::sentinel();
            let after = h.call(h.code_page(TEST_PAGE), before);
            before.assert_preserved(&after, &["rbx"]);
            assert_eq!(after.rbx & !0xff, before.rbx & !0xff);
            assert_eq!(after.rbx & 0xff, carry as u64, "carry flag not preserved");
            let path = 1000 + 7 * (k as u64 + 1);
            assert_eq!(h.loc().path, path);
            assert_eq!(
                h.ring()[2 * k..2 * k + 2],
                [tag(REC_PATH) | (PATH_END_BACK_EDGE << 32) | 42, path]
            );
            assert_eq!(h.ctl().heads[0], 2 * (k as u64 + 1));
        }
    }

    /// With `measure`: `rt_back`'s PATH and COST records and the new
    /// `path_start`, still every register and the flags preserved
    /// (`rdtsc` writes rax and rdx).
    #[test]
    fn with_measure_records_the_cost_and_preserves_everything() {
        let mut h = Harness::new();
        h.ctl_mut().measure = 1;
        h.loc_mut().path = 1000;
        for (k, carry) in [true, false].into_iter().enumerate() {
            let code = site(h.code_page(TEST_PAGE), h.rt.back_at, carry, 42, 7);
            h.load(TEST_PAGE, &code);
            let t0 = tsc();
            h.loc_mut().path_start = t0 - PAST;
            let before = Regs::sentinel();
            let after = h.call(h.code_page(TEST_PAGE), before);
            let t1 = tsc();
            before.assert_preserved(&after, &["rbx"]);
            assert_eq!(after.rbx & !0xff, before.rbx & !0xff);
            assert_eq!(after.rbx & 0xff, carry as u64, "carry flag not preserved");
            let path = 1000 + 7 * (k as u64 + 1);
            let r = &h.ring()[4 * k..4 * k + 4];
            assert_eq!(
                r[..3],
                [
                    tag(REC_PATH) | (PATH_END_BACK_EDGE << 32) | 42,
                    path,
                    tag(REC_COST)
                ]
            );
            assert_within(r[3], PAST, PAST + SLACK, "cost");
            assert_within(h.loc().path_start, t0, t1, "path_start");
            assert_eq!(h.ctl().heads[0], 4 * (k as u64 + 1));
        }
    }
}
