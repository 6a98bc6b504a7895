//! `rt_emit`: the record writer.
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, eax, esi, qword_ptr, r8, r8d, r9, r11, rax, rcx, rdi, rdx, rsi,
};

use burstyd_common::burst::{REC_END, REC_REF, TAG_SHIFT};

use super::asm::{RipRel, field, local, owner_gate, rdtsc, slot};

/// Bytes from `heads[i]` to `tails[i]` in the control block.
pub(super) const TAILS_FROM_HEADS: i32 =
    core::mem::offset_of!(burstyd_common::burst::BurstControl, tails) as i32
        - core::mem::offset_of!(burstyd_common::burst::BurstControl, heads) as i32;

/// Yields before a full ring with `wait_when_full` gives up.
pub(super) const YIELDS: u32 = 1 << 22;

/// `sched_yield`.
const SYS_SCHED_YIELD: u32 = 24;
/// `kill`.
const SYS_KILL: u32 = 62;
/// Yields between two checks that the daemon (`tracer`) is alive.
const CHECK_TRACER_EVERY: u32 = 1 << 10;

/// `rt_emit(rax = w0, rdx = w1)`; clobbers rcx. In a burst that records
/// references, past its path checks (`budget <= paths_until`, see
/// `BurstRegs::paths_until`), only `REC_REF` and `REC_END` records are
/// written, the others dropped (not lost). The first record of a
/// burst after its START (the thread's `burst_start` is 0) starts the
/// burst's clock: `burst_start = rdtsc`. Only a burst's thread
/// writes ([`owner_gate`]), into its slot's sub-ring (single producer:
/// `heads[slot]`, the slot's `head`); for any other the call does nothing. A full ring truncates the
/// burst (its budget drops to 1) and counts the record as lost, unless
/// `wait_when_full` (full trace), which yields (bounded) for the daemon —
/// as long as it lives: every [`CHECK_TRACER_EVERY`] yields (the first
/// time at once) `kill(tracer, 0)`; ESRCH means nobody will ever consume,
/// and `wait_when_full` is cleared so that later full rings lose at once.
///
/// The ring holds `ring_mask + 1` words (a power of two) and `head` is
/// always even, so a record never straddles the end: it goes to
/// `ring[head & mask]` and `ring[(head & mask) + 1]`.
pub(super) fn emit(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
) -> Result<(), IcedError> {
    let mut full = a.create_label();
    let mut retry = a.create_label();
    let mut lost = a.create_label();
    let mut done = a.create_label();
    let mut not_owner = a.create_label();

    a.set_label(entry)?;
    owner_gate(a, control, rcx, not_owner)?;
    // Memory mode: a burst that records references is past its path
    // checks (`budget <= paths_until`): only references and the END go
    // out (one comparison in any other burst).
    let mut kept = a.create_label();
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, paths_until), 0)?;
    a.je(kept)?;
    a.rip_rm(Code::Mov_r64_rm64, rcx, local!(control, budget))?;
    a.rip_rm(Code::Cmp_r64_rm64, rcx, local!(control, paths_until))?;
    a.ja(kept)?;
    a.mov(rcx, rax)?;
    a.shr(rcx, TAG_SHIFT)?;
    a.cmp(rcx, REC_REF as i32)?;
    a.je(kept)?;
    a.cmp(rcx, REC_END as i32)?;
    a.jne(not_owner)?;
    a.set_label(&mut kept)?;
    // The burst's first record after its START: its clock starts now.
    let mut timed = a.create_label();
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, burst_start), 0)?;
    a.jne(timed)?;
    a.push(rax)?;
    a.push(rdx)?;
    rdtsc(a)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, burst_start), rax)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    a.set_label(&mut timed)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.push(r9)?;
    a.mov(r8d, YIELDS)?; // yields before giving up
    // r9 = this thread's slot (its sub-ring and the address of its head).
    a.rip_rm(Code::Mov_r64_rm64, r9, local!(control, slot))?;
    a.set_label(&mut retry)?;
    // Room for two words: head - tail + 2 <= mask + 1.
    a.mov(rsi, qword_ptr(r9 + slot!(head)))?;
    a.mov(rcx, qword_ptr(rsi))?;
    a.mov(rdi, rcx)?;
    a.sub(rdi, qword_ptr(rsi + TAILS_FROM_HEADS))?;
    a.add(rdi, 1)?;
    a.rip_rm(Code::Cmp_r64_rm64, rdi, field!(control, ring_mask))?;
    a.ja(full)?;
    a.rip_rm(Code::Mov_r64_rm64, rdi, field!(control, ring_mask))?;
    a.and(rdi, rcx)?;
    a.mov(rsi, qword_ptr(r9 + slot!(ring)))?;
    a.mov(qword_ptr(rsi + rdi * 8), rax)?;
    a.mov(qword_ptr(rsi + rdi * 8 + 8), rdx)?;
    a.add(rcx, 2)?;
    a.mov(rsi, qword_ptr(r9 + slot!(head)))?;
    a.mov(qword_ptr(rsi), rcx)?;
    a.set_label(&mut done)?;
    a.pop(r9)?;
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.ret()?;

    a.set_label(&mut full)?;
    a.rip_mi(Code::Cmp_rm64_imm8, field!(control, wait_when_full), 0)?;
    a.je(lost)?;
    // rcx/r11 are clobbered by syscall: save rax, rdx, r11.
    a.push(rax)?;
    a.push(rdx)?;
    a.push(r11)?;
    let mut yield_ = a.create_label();
    a.test(r8d, CHECK_TRACER_EVERY - 1)?;
    a.jne(yield_)?;
    a.rip_rm(Code::Mov_r64_rm64, rdi, field!(control, tracer))?;
    a.test(rdi, rdi)?;
    a.je(yield_)?;
    a.mov(eax, SYS_KILL)?;
    a.xor(esi, esi)?;
    a.syscall()?;
    a.cmp(rax, -libc::ESRCH)?;
    a.jne(yield_)?;
    // The daemon is gone: stop waiting, now and from now on.
    a.rip_mi(Code::Mov_rm64_imm32, field!(control, wait_when_full), 0)?;
    a.pop(r11)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    a.jmp(lost)?;
    a.set_label(&mut yield_)?;
    a.mov(eax, SYS_SCHED_YIELD)?;
    a.syscall()?;
    a.pop(r11)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    a.sub(r8, 1)?;
    a.je(lost)?;
    a.jmp(retry)?;

    a.set_label(&mut lost)?;
    a.lock()
        .rip_m(Code::Inc_rm64, field!(control, lost_records))?;
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, budget), 1)?;
    a.jbe(done)?;
    a.rip_mi(Code::Mov_rm64_imm32, local!(control, budget), 1)?;
    a.lock().rip_m(Code::Inc_rm64, field!(control, truncated))?;
    a.jmp(done)?;
    a.set_label(&mut not_owner)?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::super::testing::{Harness, RING_WORDS, Regs, fs0};

    /// rt_emit(w0, w1), checking that only rcx is clobbered.
    fn emit(h: &mut Harness, w0: u64, w1: u64) {
        let before = Regs {
            rax: w0,
            rdx: w1,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.emit, before);
        before.assert_preserved(&after, &["rcx"]);
    }

    #[test]
    fn writes_two_words_at_head() {
        let mut h = Harness::new();
        h.loc_mut().budget = 10;
        h.ctl_mut().heads[0] = 6;
        h.ctl_mut().tails[0] = 4;
        emit(&mut h, 0x1111, 0x2222);
        let mut want = [0u64; RING_WORDS];
        want[6] = 0x1111;
        want[7] = 0x2222;
        assert_eq!(h.ring(), want);
        let c = h.ctl();
        assert_eq!((c.heads[0], c.tails[0]), (8, 4));
        assert_eq!((c.lost_records, c.truncated, h.loc().budget), (0, 0, 10));
    }

    /// Memory mode: a burst past its path checks (`budget <=
    /// paths_until`) writes its references and its END only; before
    /// that, and in a burst with `paths_until` 0, every record goes out.
    #[test]
    fn a_references_burst_past_its_path_checks_writes_references_only() {
        use burstyd_common::burst::*;
        let w0 = |t: u64| t << TAG_SHIFT | 5;
        let all = [REC_ENTER, REC_PATH, REC_COST, REC_UNWIND, REC_REF, REC_END];
        let written = |until: u64, budget: u64| {
            let mut h = Harness::new();
            h.loc_mut().paths_until = until;
            h.loc_mut().budget = budget;
            all.iter()
                .filter(|&&t| {
                    let head = h.ctl().heads[0];
                    emit(&mut h, w0(t), 0x2222);
                    h.ctl().heads[0] != head
                })
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(written(0, 10), all);
        assert_eq!(written(0, 1), all);
        assert_eq!(written(100, 101), all);
        assert_eq!(written(100, 100), [REC_REF, REC_END]);
        assert_eq!(written(100, 1), [REC_REF, REC_END]);
    }

    /// The first record of a burst (`burst_start` 0) starts its clock:
    /// `burst_start` = the time-stamp counter then; later records leave
    /// it alone (only rcx clobbered either way).
    #[test]
    fn the_first_record_starts_the_bursts_clock() {
        use super::super::testing::{assert_within, tsc};
        let mut h = Harness::new();
        h.loc_mut().budget = 10;
        h.loc_mut().burst_start = 0;
        let t0 = tsc();
        emit(&mut h, 0x1111, 0x2222);
        let t1 = tsc();
        let started = h.loc().burst_start;
        assert_within(started, t0, t1, "burst_start");
        emit(&mut h, 0x3333, 0x4444);
        assert_eq!(h.loc().burst_start, started);
        assert_eq!(h.ring()[..4], [0x1111, 0x2222, 0x3333, 0x4444]);
    }

    /// A thread that does not own the burst (a forked child's, whose
    /// private `owner` reads 0, or another thread) writes nothing.
    #[test]
    fn only_the_bursts_thread_writes() {
        for owner in [0, fs0() ^ 0x1000] {
            let mut h = Harness::new();
            h.loc_mut().owner = owner;
            h.loc_mut().budget = 10;
            h.ctl_mut().heads[0] = 6;
            emit(&mut h, 0x1111, 0x2222);
            assert_eq!(h.ring(), [0u64; RING_WORDS]);
            let c = h.ctl();
            assert_eq!((c.heads[0], c.lost_records, c.truncated), (6, 0, 0));
        }
    }

    /// 40 records through a 16-word ring, the consumer freeing a record only
    /// when the next one would not fit: every record lands at `head & mask`
    /// and the ring runs exactly full.
    #[test]
    fn wraps_around() {
        let mut h = Harness::new();
        h.loc_mut().budget = 1000;
        let mask = RING_WORDS as u64 - 1;
        for i in 0..40u64 {
            let (head, tail) = (h.ctl().heads[0], h.ctl().tails[0]);
            assert_eq!(head, 2 * i);
            if head - tail + 2 > RING_WORDS as u64 {
                // The daemon consumes the oldest record.
                let at = (tail & mask) as usize;
                assert_eq!(h.ring()[at..at + 2], [0xa000 + tail / 2, 0xb000 + tail / 2]);
                h.ctl_mut().tails[0] = tail + 2;
            }
            emit(&mut h, 0xa000 + i, 0xb000 + i);
            let at = (head & mask) as usize;
            assert_eq!(h.ring()[at..at + 2], [0xa000 + i, 0xb000 + i], "record {i}");
            assert_eq!(h.ctl().heads[0], head + 2);
        }
        assert_eq!(h.ctl().heads[0] - h.ctl().tails[0], RING_WORDS as u64);
        assert_eq!((h.ctl().lost_records, h.ctl().truncated), (0, 0));
    }

    /// Without `wait_when_full` a full ring loses the record, and truncates
    /// the burst once: budget 1, `truncated` + 1; a budget already at 1 (or
    /// 0) is left alone.
    #[test]
    fn full_ring_truncates_once() {
        let mut h = Harness::new();
        for (i, w) in h.ring_mut().iter_mut().enumerate() {
            *w = 0x100 + i as u64;
        }
        let ring: Vec<u64> = h.ring().to_vec();
        h.ctl_mut().heads[0] = 36;
        h.ctl_mut().tails[0] = 20;
        h.loc_mut().budget = 1000;
        emit(&mut h, 1, 2);
        let c = h.ctl();
        assert_eq!((c.lost_records, h.loc().budget, c.truncated), (1, 1, 1));
        emit(&mut h, 3, 4);
        let c = h.ctl();
        assert_eq!((c.lost_records, h.loc().budget, c.truncated), (2, 1, 1));
        h.loc_mut().budget = 0;
        emit(&mut h, 5, 6);
        let c = h.ctl();
        assert_eq!((c.lost_records, h.loc().budget, c.truncated), (3, 0, 1));
        assert_eq!((c.heads[0], c.tails[0]), (36, 20));
        assert_eq!(h.ring(), ring);

        // One record of room is not full.
        h.ctl_mut().tails[0] = 22;
        emit(&mut h, 7, 8);
        assert_eq!(h.ring()[4..6], [7, 8]);
        assert_eq!((h.ctl().heads[0], h.ctl().lost_records), (38, 3));
    }

    /// With `wait_when_full` a full ring yields until the daemon consumes.
    #[test]
    fn full_ring_waits_for_the_consumer() {
        let mut h = Harness::new();
        h.ctl_mut().wait_when_full = 1;
        h.loc_mut().budget = 1000;
        h.ctl_mut().heads[0] = 16;
        let tail = &raw mut h.ctl_mut().tails[0] as usize;
        let start = Instant::now();
        let daemon = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: `tail` is the control block's aligned u64 field; the
            // harness outlives this thread (joined below); the runtime
            // only reads it.
            unsafe { AtomicU64::from_ptr(tail as *mut u64) }.store(2, Ordering::Release);
        });
        emit(&mut h, 0x77, 0x88);
        assert!(start.elapsed() >= Duration::from_millis(40));
        daemon.join().unwrap();
        assert_eq!(h.ring()[0..2], [0x77, 0x88]);
        let c = h.ctl();
        assert_eq!(
            (c.heads[0], c.lost_records, c.truncated, h.loc().budget),
            (18, 0, 0, 1000)
        );
    }

    /// With `wait_when_full` and a daemon that is gone (`tracer` names no
    /// process), a full ring loses the record at once and stops waiting
    /// for good; a live tracer is waited for (the test above has none).
    #[test]
    fn a_dead_consumer_is_not_waited_for() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let mut h = Harness::new();
        h.ctl_mut().wait_when_full = 1;
        h.loc_mut().budget = 1000;
        h.ctl_mut().heads[0] = 16;
        h.ctl_mut().tracer = dead.into();
        let start = Instant::now();
        emit(&mut h, 1, 2);
        assert!(start.elapsed() < Duration::from_millis(100));
        let c = h.ctl();
        assert_eq!(
            (
                c.heads[0],
                c.lost_records,
                c.truncated,
                h.loc().budget,
                c.wait_when_full
            ),
            (16, 1, 1, 1, 0)
        );

        // A live one (ourselves) is waited for.
        let mut h = Harness::new();
        h.ctl_mut().wait_when_full = 1;
        h.loc_mut().budget = 1000;
        h.ctl_mut().heads[0] = 16;
        h.ctl_mut().tracer = std::process::id().into();
        let tail = &raw mut h.ctl_mut().tails[0] as usize;
        let daemon = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: as in `full_ring_waits_for_the_consumer`.
            unsafe { AtomicU64::from_ptr(tail as *mut u64) }.store(2, Ordering::Release);
        });
        emit(&mut h, 0x77, 0x88);
        daemon.join().unwrap();
        assert_eq!((h.ctl().heads[0], h.ctl().lost_records), (18, 0));
    }

    /// A full ring that stays full: after the yield bound the record is
    /// lost as without `wait_when_full`. 2^22 `sched_yield`s (about a
    /// second on an idle machine, much more on a loaded one).
    #[test]
    #[ignore = "2^22 sched_yield calls"]
    fn full_ring_wait_is_bounded() {
        let mut h = Harness::new();
        h.ctl_mut().wait_when_full = 1;
        h.loc_mut().budget = u64::MAX;
        h.ctl_mut().heads[0] = 16;
        let start = Instant::now();
        emit(&mut h, 1, 2);
        eprintln!("gave up after {:?}", start.elapsed());
        let c = h.ctl();
        assert_eq!(
            (c.heads[0], c.lost_records, c.truncated, h.loc().budget),
            (16, 1, 1, 1)
        );
    }
}
