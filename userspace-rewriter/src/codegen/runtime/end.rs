//! `rt_end`: the burst is over.
use burstyd_common::burst::REC_END;
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{CodeAssembler, CodeLabel, eax, ecx, edx, qword_ptr, rax, rcx, rdx};

use super::asm::{RipRel, field, local, owner_gate, rdtsc, slot, tag};

/// `rt_end(eax = reason)`: the tuples of the associative table
/// (`rt_tuple_flush`), then the END record (`w0 = tag | reason`, `w1` = the
/// time-stamp-counter ticks since the burst's first record, `rdtsc -
/// burst_start`, or 0 when `burst_start` is 0: no record came),
/// the slot's `slot_tids` entry = 0, its `owner` = 0, `ended` + 1, one
/// running burst fewer in `active` (in that order: `active` frees room for
/// the next burst last). Nothing for a thread that does not own the burst.
/// Clobbers rax, rcx, rdx.
pub(super) fn end(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
    tuple_flush: CodeLabel,
) -> Result<(), IcedError> {
    let mut not_owner = a.create_label();
    a.set_label(entry)?;
    owner_gate(a, control, rdx, not_owner)?;
    // The tuples the associative table holds go out within the burst.
    a.push(rax)?;
    a.call(tuple_flush)?;
    a.pop(rax)?;
    // w1 = the ticks since the burst's first record (0: none came).
    let mut untimed = a.create_label();
    let mut timed = a.create_label();
    a.mov(ecx, eax)?;
    a.rip_rm(Code::Mov_r64_rm64, rdx, local!(control, burst_start))?;
    a.test(rdx, rdx)?;
    a.je(untimed)?;
    rdtsc(a)?;
    a.rip_rm(Code::Sub_r64_rm64, rax, local!(control, burst_start))?;
    a.mov(rdx, rax)?;
    a.jmp(timed)?;
    a.set_label(&mut untimed)?;
    a.xor(edx, edx)?;
    a.set_label(&mut timed)?;
    a.mov(rax, tag(REC_END))?;
    a.or(rax, rcx)?;
    a.call(emit)?;
    // Free the slot: its tid for the eBPF program first, its owner, then
    // the count of running bursts last.
    a.rip_rm(Code::Mov_r64_rm64, rdx, local!(control, slot))?;
    a.mov(rax, qword_ptr(rdx + slot!(index)))?;
    a.rip_rm(Code::Lea_r64_m, rcx, field!(control, slot_tids))?;
    a.mov(qword_ptr(rcx + rax * 8), 0)?;
    a.mov(qword_ptr(rdx + slot!(owner)), 0)?;
    a.lock().rip_m(Code::Inc_rm64, field!(control, ended))?;
    a.lock().rip_m(Code::Dec_rm32, field!(control, active))?;
    a.set_label(&mut not_owner)?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use burstyd_common::burst::{END_BUDGET, END_LEFT_CLONES, REC_END};

    use super::super::asm::tag;
    use super::super::testing::{FRAME_CLOBBERS, Harness, Regs, end_ticks, fs0};

    fn end(h: &mut Harness, rax: u64) {
        let before = Regs {
            rax,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.end, before);
        before.assert_preserved(&after, FRAME_CLOBBERS);
    }

    fn in_burst(h: &mut Harness) {
        let c = h.ctl_mut();
        c.active = 1;
        c.armed = 1;
        c.ended = 5;
        c.heads[0] = 4;
        let mut l = h.loc_mut();
        l.owner = fs0();
        l.budget = 7;
    }

    /// END record with the reason (eax only: the upper half of rax is
    /// ignored), then the burst is over: owner 0, active 0, ended + 1.
    #[test]
    fn writes_end_record_and_frees_the_process() {
        for reason in [END_BUDGET, END_LEFT_CLONES] {
            let mut h = Harness::new();
            in_burst(&mut h);
            end(&mut h, 0xffff_ffff_0000_0000 | reason);
            assert_eq!(h.ring()[4..6], [tag(REC_END) | reason, end_ticks(&h, 5)]);
            let c = h.ctl();
            assert_eq!((h.loc().owner, c.active, c.ended, c.heads[0]), (0, 0, 6, 6));
            assert_eq!((c.armed, h.loc().budget, c.lost_records), (1, 7, 0));
        }
    }

    /// The END record carries the ticks since the burst's first record
    /// (`rdtsc - burst_start`); 0 when no record started the clock.
    #[test]
    fn end_record_carries_the_bursts_length_in_ticks() {
        use super::super::testing::{PAST, assert_within, tsc};
        let mut h = Harness::new();
        in_burst(&mut h);
        let t0 = tsc();
        h.loc_mut().burst_start = t0 - PAST;
        end(&mut h, END_BUDGET);
        let t1 = tsc();
        assert_eq!(h.ring()[4], tag(REC_END) | END_BUDGET);
        assert_within(h.ring()[5], PAST, t1 - t0 + PAST, "ticks");

        let mut h = Harness::new();
        in_burst(&mut h);
        h.loc_mut().burst_start = 0;
        end(&mut h, END_LEFT_CLONES);
        assert_eq!(h.ring()[4..6], [tag(REC_END) | END_LEFT_CLONES, 0]);
    }

    /// Only the burst's thread ends it: for any other, nothing changes.
    #[test]
    fn only_the_bursts_thread_ends_it() {
        let mut h = Harness::new();
        in_burst(&mut h);
        h.loc_mut().owner = fs0() ^ 0x1000;
        end(&mut h, END_BUDGET);
        let c = h.ctl();
        assert_eq!((c.active, c.ended, c.heads[0]), (1, 5, 4));
        assert_eq!(h.loc().owner, fs0() ^ 0x1000);
    }

    /// A full ring loses the END record (and, like any lost record,
    /// truncates the budget), but the burst still ends.
    #[test]
    fn ends_even_when_the_ring_is_full() {
        let mut h = Harness::new();
        in_burst(&mut h);
        h.ctl_mut().heads[0] = 16;
        end(&mut h, END_LEFT_CLONES);
        let c = h.ctl();
        assert_eq!(
            (h.loc().owner, c.active, c.ended, c.heads[0]),
            (0, 0, 6, 16)
        );
        assert_eq!((c.lost_records, h.loc().budget, c.truncated), (1, 1, 1));
    }
}
