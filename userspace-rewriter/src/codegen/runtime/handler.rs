//! The burst signal handler and its `rt_sigreturn` restorer.
use burstyd_common::burst::{END_LEFT_CLONES, PATH_INVALID, REC_START};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, eax, ecx, edi, qword_ptr, r9, r10, rax, rdx, rsi, rsp,
};

use super::asm::{RipRel, field, local, tag};

/// `uc_mcontext.gregs[REG_RIP]`: ucontext (40) + 16 * 8.
pub(super) const UC_RIP: i32 = 40 + 16 * 8;

const SYS_RT_SIGRETURN: u32 = 15;
const SYS_ARCH_PRCTL: u32 = 158;
const ARCH_GET_FS: u32 = 0x1003;
const SYS_GETTID: u32 = 186;

/// The signal handler: `handler(sig, info, ucontext)`. Starts a burst when
/// armed, idle, and the interrupted PC was rewritten. Everything it
/// clobbers is restored by `rt_sigreturn` from the ucontext.
///
/// In order: disarmed, or in a forked child (`present` is not 1) →
/// `declined_disarmed`; `burst_len` 0 (`--burst 0`,
/// back to the interrupted original code) → `declined_budget`; `active`
/// already set (`lock cmpxchg` 0 → 1 fails) → `declined_busy`, unless the
/// running burst is this thread's (`owner` = `fs:[0]`) and the interrupted
/// PC is a rewritten original instruction (in the instruction table): that burst is ended (`rt_end(END_LEFT_CLONES)`)
/// and the claim tried again; `fs:[0]`
/// is not the thread's TCB (`arch_prctl(ARCH_GET_FS)`: 0 before libc set up
/// TLS) or the PC is not in the instruction table → `active` = 0,
/// `declined_pc`. Else the PC in the ucontext becomes the clone's, `owner` =
/// `fs:[0]`, `budget` = `burst_len`, `path` = `PATH_INVALID`, `depth` = 0,
/// `bursts` + 1, `owner_tid` = `gettid()`, and a START record (`w0 = tag | gettid()`, `w1` = the
/// interrupted PC).
pub(super) fn handler(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
    lookup: CodeLabel,
    end: CodeLabel,
) -> Result<(), IcedError> {
    let mut claim = a.create_label();
    let mut busy = a.create_label();
    let mut declined_busy = a.create_label();
    let mut disarmed = a.create_label();
    let mut notfound = a.create_label();
    let mut zero = a.create_label();

    a.set_label(entry)?;
    // A child forked from the process reads its private `present` as 0
    // (MADV_WIPEONFORK): never armed.
    a.rip_mi(Code::Cmp_rm64_imm8, local!(control, present), 1)?;
    a.jne(disarmed)?;
    a.rip_mi(Code::Cmp_rm32_imm8, field!(control, armed), 0)?;
    a.je(disarmed)?;
    // Budget zero (`--burst 0`): back to the interrupted original code.
    a.rip_mi(Code::Cmp_rm64_imm8, field!(control, burst_len), 0)?;
    a.je(zero)?;
    a.mov(r9, rdx)?; // ucontext
    a.set_label(&mut claim)?;
    a.xor(eax, eax)?;
    a.mov(ecx, 1u32)?;
    a.lock()
        .rip_mr(Code::Cmpxchg_rm32_r32, field!(control, active), ecx)?;
    a.jne(busy)?;
    // fs:[0] must be the thread's TCB (the x86-64 TLS ABI): not yet so
    // before libc set up TLS, and then no burst may start.
    a.lea(rsp, qword_ptr(rsp - 16))?;
    a.mov(eax, SYS_ARCH_PRCTL)?; // arch_prctl(ARCH_GET_FS, rsp)
    a.mov(edi, ARCH_GET_FS)?;
    a.mov(rsi, rsp)?;
    a.syscall()?;
    a.mov(rax, qword_ptr(rsp))?;
    a.lea(rsp, qword_ptr(rsp + 16))?;
    a.test(rax, rax)?;
    a.je(notfound)?;
    a.fs0_rm(Code::Cmp_r64_rm64, rax)?;
    a.jne(notfound)?;
    a.mov(r10, qword_ptr(r9 + UC_RIP))?;
    a.mov(rax, r10)?;
    a.call(lookup)?;
    a.test(rax, rax)?;
    a.je(notfound)?;
    a.mov(qword_ptr(r9 + UC_RIP), rax)?;
    a.fs0_rm(Code::Mov_r64_rm64, rax)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, owner), rax)?;
    a.rip_rm(Code::Mov_r64_rm64, rax, field!(control, burst_len))?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, budget), rax)?;
    a.mov(rax, PATH_INVALID)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path), rax)?;
    a.rip_mi(Code::Mov_rm64_imm32, local!(control, depth), 0)?;
    a.rip_m(Code::Inc_rm64, field!(control, bursts))?;
    // START record: gettid(), interrupted PC.
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.mov(eax, eax)?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, owner_tid), rax)?;
    a.mov(rdx, tag(REC_START))?;
    a.or(rax, rdx)?;
    a.mov(rdx, r10)?;
    a.call(emit)?;
    a.ret()?;

    a.set_label(&mut notfound)?;
    a.rip_mi(Code::Mov_rm32_imm32, field!(control, active), 0)?;
    a.rip_m(Code::Inc_rm64, field!(control, declined_pc))?;
    a.ret()?;
    // Busy. The burst is this thread's own and the thread is back in
    // original code (it left the clones without passing a check: a return
    // into code that is not instrumented, an exception that landed in an
    // original landing pad, `longjmp`): end that burst, then claim anew.
    a.set_label(&mut busy)?;
    a.fs0_rm(Code::Mov_r64_rm64, rax)?;
    a.test(rax, rax)?;
    a.je(declined_busy)?;
    a.rip_rm(Code::Cmp_r64_rm64, rax, local!(control, owner))?;
    a.jne(declined_busy)?;
    // Paused in original code: the interrupted PC is a rewritten original
    // instruction (the clones of every module are elsewhere, and the
    // table holds original addresses only).
    a.mov(rax, qword_ptr(r9 + UC_RIP))?;
    a.call(lookup)?;
    a.test(rax, rax)?;
    a.je(declined_busy)?;
    a.mov(eax, END_LEFT_CLONES as u32)?;
    a.call(end)?;
    a.jmp(claim)?;
    a.set_label(&mut declined_busy)?;
    a.rip_m(Code::Inc_rm64, field!(control, declined_busy))?;
    a.ret()?;
    a.set_label(&mut zero)?;
    a.rip_m(Code::Inc_rm64, field!(control, declined_budget))?;
    a.ret()?;
    a.set_label(&mut disarmed)?;
    a.rip_m(Code::Inc_rm64, field!(control, declined_disarmed))?;
    a.ret()?;
    Ok(())
}

/// The restorer (`SA_RESTORER`): `rt_sigreturn`, which does not return;
/// `int3` if it ever does.
pub(super) fn restorer(a: &mut CodeAssembler, entry: &mut CodeLabel) -> Result<(), IcedError> {
    a.set_label(entry)?;
    a.mov(eax, SYS_RT_SIGRETURN)?;
    a.syscall()?;
    a.int3()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use burstyd_common::burst::{END_LEFT_CLONES, PATH_INVALID, REC_END, REC_START};

    use super::super::asm::tag;
    use super::super::testing::{CLONE_HI, CLONE_LO, Harness, Regs, fs0};
    use super::UC_RIP;

    /// The interrupted PC and its clone.
    const PC: u64 = 0x40_3000;
    const CLONE: u64 = CLONE_LO + 0x300;
    const RIP: usize = UC_RIP as usize;
    /// Words of the fake ucontext that are checked for stray writes.
    const UC_WORDS: usize = 64;

    /// What the handler may clobber (rt_sigreturn restores it all), for
    /// the record: caller-saved registers except r8.
    const CLOBBERS: &[&str] = &["rax", "rcx", "rdx", "rsi", "rdi", "r9", "r10", "r11"];

    /// Armed, idle, `PC` rewritten, a ucontext interrupted at `PC`.
    fn armed() -> Harness {
        armed_in(Harness::new())
    }

    fn armed_in(mut h: Harness) -> Harness {
        let c = h.ctl_mut();
        c.armed = 1;
        c.burst_len = 50;
        let l = h.loc_mut();
        l.owner = 0; // no burst runs
        l.path = 3;
        l.depth = 2;
        h.set_table(&[(PC - 4, CLONE - 8), (PC, CLONE), (PC + 3, CLONE + 6)]);
        for i in 0..UC_WORDS {
            h.set_uc_word(8 * i, 0xcc00 + i as u64);
        }
        h.set_uc_word(RIP, PC);
        h
    }

    /// handler(sig, info, ucontext), optionally with another fs base.
    fn handle(h: &mut Harness, fs: Option<u64>) {
        let before = Regs {
            rdi: 40,
            rsi: 0x1234_5678,
            rdx: h.ucontext(),
            ..Regs::sentinel()
        };
        let target = h.rt.handler;
        let after = match fs {
            None => h.call(target, before),
            Some(fs) => h.call_fs(target, before, fs),
        };
        before.assert_preserved(&after, CLOBBERS);
    }

    /// bursts, declined: disarmed, budget, busy, pc.
    fn counters(h: &Harness) -> [u64; 5] {
        let c = h.ctl();
        [
            c.bursts,
            c.declined_disarmed,
            c.declined_budget,
            c.declined_busy,
            c.declined_pc,
        ]
    }

    /// Nothing but the counters changed: no burst, RIP and ucontext intact.
    fn assert_declined(h: &Harness, active: u32, counters_want: [u64; 5]) {
        assert_eq!(counters(h), counters_want);
        let c = h.ctl();
        assert_eq!(c.active, active);
        assert_eq!(
            (
                h.loc().owner,
                h.loc().budget,
                h.loc().path,
                h.loc().depth,
                c.head
            ),
            (0, 0, 3, 2, 0)
        );
        for i in 0..UC_WORDS {
            let want = if 8 * i == RIP { PC } else { 0xcc00 + i as u64 };
            assert_eq!(h.uc_word(8 * i), want, "ucontext word {i}");
        }
    }

    /// The interrupted PC was rewritten: the ucontext resumes at its clone,
    /// the thread owns a fresh burst, START record (gettid, PC). With the
    /// control block low (absolute operands, as injected) and high
    /// (RIP-relative).
    #[test]
    fn starts_a_burst_at_a_rewritten_pc() {
        starts_a_burst(armed());
        starts_a_burst(armed_in(Harness::new_high()));
    }

    fn starts_a_burst(mut h: Harness) {
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), CLONE);
        for i in (0..UC_WORDS).filter(|&i| 8 * i != RIP) {
            assert_eq!(h.uc_word(8 * i), 0xcc00 + i as u64, "ucontext word {i}");
        }
        assert_eq!(counters(&h), [1, 0, 0, 0, 0]);
        let c = h.ctl();
        assert_eq!((c.active, h.loc().owner, h.loc().budget), (1, fs0(), 50));
        assert_eq!((h.loc().path, h.loc().depth, c.head), (PATH_INVALID, 0, 2));
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u64;
        assert_eq!(h.ring()[..2], [tag(REC_START) | tid, PC]);
        assert_eq!(c.owner_tid, tid);
    }

    #[test]
    fn disarmed_declines() {
        let mut h = armed();
        h.ctl_mut().armed = 0;
        handle(&mut h, None);
        assert_declined(&h, 0, [0, 1, 0, 0, 0]);
    }

    /// A child forked from the process reads its private state as zeros
    /// (`present` 0): it never starts a burst of its own in the region it
    /// shares with its parent.
    #[test]
    fn a_forked_child_declines() {
        let mut h = armed();
        h.loc_mut().present = 0;
        handle(&mut h, None);
        assert_declined(&h, 0, [0, 1, 0, 0, 0]);
    }

    /// `--burst 0`: back to the original code, without taking `active`.
    #[test]
    fn zero_burst_len_declines() {
        let mut h = armed();
        h.ctl_mut().burst_len = 0;
        handle(&mut h, None);
        assert_declined(&h, 0, [0, 0, 1, 0, 0]);
    }

    /// Another burst is running (`active` set): declined, `active` kept.
    #[test]
    fn busy_declines() {
        let mut h = armed();
        h.ctl_mut().active = 1;
        handle(&mut h, None);
        assert_declined(&h, 1, [0, 0, 0, 1, 0]);
    }

    /// A second signal during a burst, while the thread runs in the
    /// clones, leaves the running burst alone.
    #[test]
    fn nested_signal_is_declined() {
        let mut h = armed();
        handle(&mut h, None);
        h.loc_mut().budget = 17;
        for pc in [CLONE_LO, CLONE + 2, CLONE_HI - 1] {
            h.set_uc_word(RIP, pc);
            handle(&mut h, None);
            assert_eq!(h.uc_word(RIP), pc);
        }
        assert_eq!(counters(&h), [1, 0, 0, 3, 0]);
        let c = h.ctl();
        assert_eq!(
            (c.active, h.loc().owner, h.loc().budget, c.head, c.ended),
            (1, fs0(), 17, 2, 0)
        );
    }

    /// The burst's own thread interrupted in original code (it left the
    /// clones without a check: an exception into an original landing pad,
    /// a return into code that is not instrumented): that burst ends
    /// (END_LEFT_CLONES) and a fresh one starts there. Another thread at
    /// the same PC is declined.
    #[test]
    fn a_stale_burst_of_the_same_thread_is_replaced() {
        let mut h = armed();
        handle(&mut h, None);
        h.loc_mut().budget = 17;
        h.loc_mut().depth = 3;
        h.set_uc_word(RIP, PC + 3);
        handle(&mut h, Some(fs0() + 64));
        assert_eq!(h.uc_word(RIP), PC + 3);
        assert_eq!(counters(&h), [1, 0, 0, 1, 0]);
        // The burst's own thread at an original PC that was not rewritten
        // (nor is any clone there): declined, the burst left alone.
        h.set_uc_word(RIP, PC + 1);
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), PC + 1);
        assert_eq!(counters(&h), [1, 0, 0, 2, 0]);
        assert_eq!((h.ctl().ended, h.loc().budget), (0, 17));

        h.set_uc_word(RIP, PC + 3);
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), CLONE + 6);
        assert_eq!(counters(&h), [2, 0, 0, 2, 0]);
        let c = h.ctl();
        assert_eq!((c.active, c.ended, c.head), (1, 1, 6));
        assert_eq!(
            (h.loc().owner, h.loc().budget, h.loc().depth),
            (fs0(), 50, 0)
        );
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u64;
        assert_eq!(
            h.ring()[2..6],
            [
                tag(REC_END) | END_LEFT_CLONES,
                0,
                tag(REC_START) | tid,
                PC + 3
            ]
        );
    }

    /// The PC is not rewritten: declined, `active` released.
    #[test]
    fn unknown_pc_declines_and_releases() {
        let mut h = armed();
        h.set_uc_word(RIP, PC + 1);
        handle(&mut h, None);
        h.set_uc_word(RIP, PC);
        assert_declined(&h, 0, [0, 0, 0, 0, 1]);
    }

    /// No TLS yet: fs base 0 (fs:[0] must not even be read), or fs:[0] not
    /// the TCB's own address. A self-pointing TCB is fine and is the owner.
    #[test]
    fn tls_must_be_set_up() {
        let mut h = armed();
        handle(&mut h, Some(0));
        assert_declined(&h, 0, [0, 0, 0, 0, 1]);

        let mut tcb = Box::new([0u64; 8]);
        tcb[0] = 0x1000;
        let at = tcb.as_ptr() as u64;
        handle(&mut h, Some(at));
        assert_declined(&h, 0, [0, 0, 0, 0, 2]);

        tcb[0] = at;
        handle(&mut h, Some(at));
        assert_eq!(h.uc_word(RIP), CLONE);
        assert_eq!((h.ctl().active, h.loc().owner), (1, at));
        assert_eq!(counters(&h), [1, 0, 0, 0, 2]);
    }

    /// A full ring loses the START record and truncates the new burst to
    /// one check, but the burst starts.
    #[test]
    fn full_ring_loses_the_start_record() {
        let mut h = armed();
        h.ctl_mut().head = 16;
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), CLONE);
        let c = h.ctl();
        assert_eq!((c.active, c.bursts, c.head), (1, 1, 16));
        assert_eq!((c.lost_records, h.loc().budget, c.truncated), (1, 1, 1));
    }
}
