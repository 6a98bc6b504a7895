//! The burst signal handler and its `rt_sigreturn` restorer.
use burstyd_common::burst::{
    END_LEFT_CLONES, MAX_SLOTS, PATH_INVALID, REC_START, START_RUNNING_SHIFT, START_SLOT_SHIFT,
    TABLES_GEN_SHIFT,
};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, byte_ptr, dword_ptr, eax, ecx, edi, edx, qword_ptr, r9, r10, rax,
    rcx, rdi, rdx, rsi, rsp,
};

use super::asm::{RipRel, field, local, private, slot, start_path_if_measured, tag};
use super::ring::TAILS_FROM_HEADS;

/// `uc_mcontext.gregs[REG_RIP]`: ucontext (40) + 16 * 8.
pub(super) const UC_RIP: i32 = 40 + 16 * 8;
/// `uc_mcontext.gregs[REG_RSP]`.
pub(super) const UC_RSP: i32 = 40 + 15 * 8;
/// `call rel32`.
const CALL_REL32: i32 = 0xe8;

const SYS_RT_SIGRETURN: u32 = 15;
const SYS_ARCH_PRCTL: u32 = 158;
const ARCH_GET_FS: u32 = 0x1003;
const SYS_GETTID: u32 = 186;

/// The signal handler: `handler(sig, info, ucontext)`. Starts a burst on
/// the interrupted thread when armed, a slot is free, and the interrupted
/// PC was rewritten. Everything it clobbers is restored by `rt_sigreturn`
/// from the ucontext.
///
/// In order: in a forked child (`present` is not 1) →
/// `declined_disarmed`; the signal came from the uprobe on the loader's
/// link-map hook ([`link_hook`]) → the tables are invalidated; disarmed →
/// `declined_disarmed`; `burst_len` 0 (`--burst 0`, back to the
/// interrupted original code) → `declined_budget`; `fs:[0]` is not the
/// thread's TCB (`arch_prctl(ARCH_GET_FS)`: 0 before libc set up TLS; the
/// thread's registers are in its TCB, so nothing below may run without
/// one) → `declined_pc`. The thread runs a burst already (its TCB's slot
/// is owned by its `fs:[0]`): unless the interrupted PC is a rewritten
/// original instruction (in the instruction table; the thread left the
/// clones without passing a check), → `declined_busy`; else that burst is
/// ended (`rt_end(END_LEFT_CLONES)`), freeing its slot. Then `active` + 1
/// (`lock xadd`); if it was `max_bursts` (or [`MAX_SLOTS`]) or more
/// already, it takes the one back and → `declined_busy`. A free slot is claimed with
/// `lock cmpxchg` of its `owner` (0 → `fs:[0]`), the first free one from
/// slot 0 (none: undo, `declined_busy`). Its sub-ring more than half full
/// (unless `wait_when_full`) → the slot and `active` are given back,
/// `declined_behind`: the daemon is behind, and declining here keeps a
/// burst from filling the ring and losing records (half a sub-ring holds
/// about a hundred bursts of the default length, so a burst that starts
/// runs into a full ring only if it alone writes that much). The PC not in the instruction
/// table → the slot and `active` are given back, `declined_pc`. Else the
/// PC in the ucontext becomes the clone's; the slot gets its index, its
/// sub-ring and head address; the thread's registers (in its TCB): `slot`,
/// `budget` = `burst_len`, `path` = `PATH_INVALID`, `depth` = 0; one more
/// in `bursts`, `concurrent_max` raised to `active`, `slot_tids[slot]` =
/// `gettid()`, and a START record (`w0` = the tag, `active` now << 40, the
/// slot << 32 and `gettid()`; `w1` = the interrupted PC); then, with
/// `measure`, `path_start = rdtsc` (the first path is partial anyway, its
/// PATH record carries `PATH_INVALID`; this keeps the value sane).
pub(super) fn handler(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
    lookup: CodeLabel,
    end: CodeLabel,
) -> Result<(), IcedError> {
    let mut claim = a.create_label();
    let mut over = a.create_label();
    let mut declined_busy = a.create_label();
    let mut disarmed = a.create_label();
    let mut notfound = a.create_label();
    let mut no_tcb = a.create_label();
    let mut zero = a.create_label();
    let mut next = a.create_label();
    let mut got = a.create_label();
    let mut bound = a.create_label();
    let mut not_max = a.create_label();
    let mut room = a.create_label();
    let mut behind = a.create_label();

    a.set_label(entry)?;
    // A child forked from the process reads its private `present` as 0
    // (MADV_WIPEONFORK): never armed.
    a.rip_mi(Code::Cmp_rm64_imm8, private!(control, present), 1)?;
    a.jne(disarmed)?;
    link_hook(a, control)?;
    a.rip_mi(Code::Cmp_rm32_imm8, field!(control, armed), 0)?;
    a.je(disarmed)?;
    // Budget zero (`--burst 0`): back to the interrupted original code.
    a.rip_mi(Code::Cmp_rm64_imm8, field!(control, burst_len), 0)?;
    a.je(zero)?;
    a.mov(r9, rdx)?; // ucontext
    // fs:[0] must be the thread's TCB (the x86-64 TLS ABI): not yet so
    // before libc set up TLS, and then no burst may start (nor may the
    // thread's registers in its TCB be read).
    a.lea(rsp, qword_ptr(rsp - 16))?;
    a.mov(eax, SYS_ARCH_PRCTL)?; // arch_prctl(ARCH_GET_FS, rsp)
    a.mov(edi, ARCH_GET_FS)?;
    a.mov(rsi, rsp)?;
    a.syscall()?;
    a.mov(rax, qword_ptr(rsp))?;
    a.lea(rsp, qword_ptr(rsp + 16))?;
    a.test(rax, rax)?;
    a.je(no_tcb)?;
    a.fs0_rm(Code::Cmp_r64_rm64, rax)?;
    a.jne(no_tcb)?;
    // This thread's own burst runs. If the thread is back in original
    // code (it left the clones without passing a check: a return into
    // code that is not instrumented, an exception that landed in an
    // original landing pad, `longjmp`), end it; else decline.
    a.rip_rm(Code::Mov_r64_rm64, rax, local!(control, slot))?;
    a.test(rax, rax)?;
    a.je(claim)?;
    a.mov(rax, qword_ptr(rax + slot!(owner)))?;
    a.fs0_rm(Code::Cmp_r64_rm64, rax)?;
    a.jne(claim)?;
    // Paused in original code: the interrupted PC is a rewritten original
    // instruction (the clones of every module are elsewhere, and the
    // table holds original addresses only).
    a.mov(rax, qword_ptr(r9 + UC_RIP))?;
    a.call(lookup)?;
    a.test(rax, rax)?;
    a.je(declined_busy)?;
    a.mov(eax, END_LEFT_CLONES as u32)?;
    a.call(end)?;

    // Room for one more burst: active + 1, unless it was at the bound.
    a.set_label(&mut claim)?;
    a.mov(eax, 1u32)?;
    a.lock()
        .rip_mr(Code::Xadd_rm32_r32, field!(control, active), eax)?;
    a.rip_rm(Code::Mov_r64_rm64, rcx, field!(control, max_bursts))?;
    a.cmp(rcx, MAX_SLOTS as i32)?;
    a.jbe(bound)?;
    a.mov(ecx, MAX_SLOTS as u32)?;
    a.set_label(&mut bound)?;
    a.cmp(rax, rcx)?;
    a.jae(over)?;
    // A free slot: the first whose owner goes 0 → fs:[0].
    a.rip_rm(Code::Lea_r64_m, rsi, private!(control, slots))?;
    a.xor(edi, edi)?;
    a.fs0_rm(Code::Mov_r64_rm64, rcx)?;
    a.set_label(&mut next)?;
    a.xor(eax, eax)?;
    a.lock().cmpxchg(qword_ptr(rsi + slot!(owner)), rcx)?;
    a.je(got)?;
    a.add(rsi, SLOT_BYTES)?;
    a.inc(edi)?;
    a.cmp(edi, MAX_SLOTS as u32)?;
    a.jb(next)?;
    a.jmp(over)?;

    // rsi = the slot, rdi = its index. Its sub-ring more than half full:
    // the daemon is behind; a burst now could fill it and lose records
    // (a full trace waits at a full ring instead).
    a.set_label(&mut got)?;
    a.rip_mi(Code::Cmp_rm64_imm8, field!(control, wait_when_full), 0)?;
    a.jne(room)?;
    a.rip_rm(Code::Lea_r64_m, rcx, field!(control, heads))?;
    a.mov(rax, qword_ptr(rcx + rdi * 8))?;
    a.sub(rax, qword_ptr(rcx + rdi * 8 + TAILS_FROM_HEADS))?;
    a.rip_rm(Code::Mov_r64_rm64, rcx, field!(control, ring_mask))?;
    a.inc(rcx)?;
    a.shr(rcx, 1)?;
    a.cmp(rax, rcx)?;
    a.ja(behind)?;
    a.set_label(&mut room)?;
    a.mov(r10, qword_ptr(r9 + UC_RIP))?;
    a.mov(rax, r10)?;
    a.call(lookup)?;
    a.test(rax, rax)?;
    a.je(notfound)?;
    a.mov(qword_ptr(r9 + UC_RIP), rax)?;
    a.mov(qword_ptr(rsi + slot!(index)), rdi)?;
    // Its sub-ring: ring_addr + index * (ring_mask + 1) * 8.
    a.rip_rm(Code::Mov_r64_rm64, rax, field!(control, ring_mask))?;
    a.inc(rax)?;
    a.imul_2(rax, rdi)?;
    a.shl(rax, 3)?;
    a.rip_rm(Code::Add_r64_rm64, rax, field!(control, ring_addr))?;
    a.mov(qword_ptr(rsi + slot!(ring)), rax)?;
    a.rip_rm(Code::Lea_r64_m, rax, field!(control, heads))?;
    a.lea(rax, qword_ptr(rax + rdi * 8))?;
    a.mov(qword_ptr(rsi + slot!(head)), rax)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, slot), rsi)?;
    a.rip_rm(Code::Mov_r64_rm64, rax, field!(control, burst_len))?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, budget), rax)?;
    a.mov(rax, PATH_INVALID)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path), rax)?;
    a.rip_mi(Code::Mov_rm64_imm32, local!(control, depth), 0)?;
    a.lock().rip_m(Code::Inc_rm64, field!(control, bursts))?;
    // concurrent_max := max(concurrent_max, active) (no lock: a
    // statistic; a race may lose a maximum, never invent one).
    a.rip_rm(Code::Mov_r32_rm32, eax, field!(control, active))?;
    a.rip_rm(Code::Cmp_r64_rm64, rax, field!(control, concurrent_max))?;
    a.jbe(not_max)?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, concurrent_max), rax)?;
    a.set_label(&mut not_max)?;
    // START record: gettid(), interrupted PC (syscall keeps rdi).
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.mov(eax, eax)?;
    a.rip_rm(Code::Lea_r64_m, rcx, field!(control, slot_tids))?;
    a.mov(qword_ptr(rcx + rdi * 8), rax)?;
    // w0 = tag | running << START_RUNNING_SHIFT | slot << START_SLOT_SHIFT
    // | tid: the bursts running now (this one included) say from the
    // records alone that bursts overlapped.
    a.rip_rm(Code::Mov_r32_rm32, edx, field!(control, active))?;
    a.and(edx, 0xff)?;
    a.shl(rdx, START_RUNNING_SHIFT)?;
    a.or(rax, rdx)?;
    a.mov(rdx, rdi)?;
    a.shl(rdx, START_SLOT_SHIFT)?;
    a.or(rax, rdx)?;
    a.mov(rdx, tag(REC_START))?;
    a.or(rax, rdx)?;
    a.mov(rdx, r10)?;
    a.call(emit)?;
    // The first path (a partial one) starts here.
    start_path_if_measured(a, control)?;
    a.ret()?;

    // Not a rewritten instruction: give the slot back.
    a.set_label(&mut notfound)?;
    a.mov(qword_ptr(rsi + slot!(owner)), 0)?;
    a.lock().rip_m(Code::Dec_rm32, field!(control, active))?;
    a.set_label(&mut no_tcb)?;
    a.lock()
        .rip_m(Code::Inc_rm64, field!(control, declined_pc))?;
    a.ret()?;
    // The daemon is behind: give the slot and the count back.
    a.set_label(&mut behind)?;
    a.mov(qword_ptr(rsi + slot!(owner)), 0)?;
    a.lock().rip_m(Code::Dec_rm32, field!(control, active))?;
    a.lock()
        .rip_m(Code::Inc_rm64, field!(control, declined_behind))?;
    a.ret()?;
    // At the bound, or no free slot: give the count back.
    a.set_label(&mut over)?;
    a.lock().rip_m(Code::Dec_rm32, field!(control, active))?;
    a.set_label(&mut declined_busy)?;
    a.lock()
        .rip_m(Code::Inc_rm64, field!(control, declined_busy))?;
    a.ret()?;
    a.set_label(&mut zero)?;
    a.lock()
        .rip_m(Code::Inc_rm64, field!(control, declined_budget))?;
    a.ret()?;
    a.set_label(&mut disarmed)?;
    a.lock()
        .rip_m(Code::Inc_rm64, field!(control, declined_disarmed))?;
    a.ret()?;
    Ok(())
}

/// Bytes of a [`burstyd_common::burst::BurstSlot`].
const SLOT_BYTES: i32 = core::mem::size_of::<burstyd_common::burst::BurstSlot>() as i32;

/// The loader is about to change its link map (see
/// [`BurstControl::hook`](burstyd_common::burst::BurstControl::hook)): the
/// interrupted pc (ucontext in rdx) is the hook itself, or the return
/// site of a `call hook` the thread just came back from (the uprobe
/// stepped over the hook's `ret`: the pc is in the loader's code, the
/// five bytes before it are `e8 rel32` aimed at the hook, and the stack
/// slot just below `rsp` still holds the pc). Then the tables' header
/// becomes 0 and their generation goes up by one (`lock cmpxchg`, against
/// the daemon's own), `link_changes` counts it, and the handler returns:
/// no lookup finds a clone until the daemon has checked the maps and put
/// a header back. Otherwise falls through. Clobbers rax, rcx, r10, and
/// the flags.
fn link_hook(a: &mut CodeAssembler, control: u64) -> Result<(), IcedError> {
    let mut invalidate = a.create_label();
    let mut retry = a.create_label();
    let mut not_hook = a.create_label();
    // In the loader's code (0, 0: no hook; never true).
    a.mov(r10, qword_ptr(rdx + UC_RIP))?;
    a.rip_rm(Code::Cmp_r64_rm64, r10, field!(control, hook_lo))?;
    a.jb(not_hook)?;
    a.rip_rm(Code::Cmp_r64_rm64, r10, field!(control, hook_hi))?;
    a.jae(not_hook)?;
    a.rip_rm(Code::Cmp_r64_rm64, r10, field!(control, hook))?;
    a.je(invalidate)?;
    // With room for a call before the pc.
    a.lea(rax, qword_ptr(r10 - 5))?;
    a.rip_rm(Code::Cmp_r64_rm64, rax, field!(control, hook_lo))?;
    a.jb(not_hook)?;
    a.cmp(byte_ptr(r10 - 5), CALL_REL32)?;
    a.jne(not_hook)?;
    a.movsxd(rax, dword_ptr(r10 - 4))?;
    a.add(rax, r10)?;
    a.rip_rm(Code::Cmp_r64_rm64, rax, field!(control, hook))?;
    a.jne(not_hook)?;
    a.mov(rax, qword_ptr(rdx + UC_RSP))?;
    a.cmp(qword_ptr(rax - 8), r10)?;
    a.jne(not_hook)?;
    a.set_label(&mut invalidate)?;
    a.rip_rm(Code::Mov_r64_rm64, rax, field!(control, tables))?;
    a.set_label(&mut retry)?;
    a.mov(rcx, rax)?;
    a.shr(rcx, TABLES_GEN_SHIFT)?;
    a.inc(rcx)?;
    a.shl(rcx, TABLES_GEN_SHIFT)?;
    a.lock()
        .rip_mr(Code::Cmpxchg_rm64_r64, field!(control, tables), rcx)?;
    a.jne(retry)?;
    a.lock()
        .rip_m(Code::Inc_rm64, field!(control, link_changes))?;
    a.ret()?;
    a.set_label(&mut not_hook)?;
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

    use burstyd_common::burst::{TABLES_GEN_SHIFT, TABLES_HEADER_MASK};

    use super::super::asm::tag;
    use burstyd_common::burst::{BurstRegs, MAX_SLOTS, TLS_REGS};

    use super::super::testing::{CLONE_HI, CLONE_LO, Harness, Regs, assert_within, fs0, tsc};
    use super::{UC_RIP, UC_RSP};

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
        let mut l = h.loc_mut();
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
                c.heads[0]
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
        assert_eq!(
            (h.loc().path, h.loc().depth, c.heads[0]),
            (PATH_INVALID, 0, 2)
        );
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u64;
        assert_eq!(h.ring()[..2], [tag(REC_START) | 1 << 40 | tid, PC]);
        assert_eq!(c.slot_tids[0], tid);
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

    /// `max_bursts` bursts run already: declined, `active` kept. A bound
    /// above `MAX_SLOTS` counts as `MAX_SLOTS`.
    #[test]
    fn busy_declines() {
        let mut h = armed();
        h.ctl_mut().active = 4;
        handle(&mut h, None);
        assert_declined(&h, 4, [0, 0, 0, 1, 0]);
        let mut h = armed();
        h.ctl_mut().max_bursts = 100;
        h.ctl_mut().active = MAX_SLOTS as u32;
        handle(&mut h, None);
        assert_declined(&h, MAX_SLOTS as u32, [0, 0, 0, 1, 0]);
    }

    /// A fake thread: a TCB (self-pointing, with room for the burst
    /// registers at `TLS_REGS`) to run the handler with as fs base.
    fn fake_thread() -> Box<FakeTcb> {
        let mut tcb = Box::new(FakeTcb([0u64; 128]));
        tcb.0[0] = tcb.0.as_ptr() as u64;
        tcb
    }

    /// A fake TCB, aligned like `BurstRegs` (64: a `[u64; N]` is only
    /// 8-aligned, and a debug build checks the dereference).
    #[repr(C, align(64))]
    struct FakeTcb([u64; 128]);

    impl std::ops::Deref for FakeTcb {
        type Target = [u64; 128];
        fn deref(&self) -> &[u64; 128] {
            &self.0
        }
    }

    /// The registers in a fake thread's TCB.
    fn regs_of(tcb: &[u64; 128]) -> &BurstRegs {
        // SAFETY: TLS_REGS + a BurstRegs lie inside the 1 KiB TCB, aligned.
        unsafe { &*(tcb.as_ptr().byte_add(TLS_REGS as usize) as *const BurstRegs) }
    }

    /// Several threads run bursts at once, each in a slot of its own (the
    /// first free one), up to `max_bursts`; then they are declined. A
    /// burst's end frees its slot, which the next burst takes.
    #[test]
    fn bursts_run_at_once_up_to_the_bound() {
        let mut h = armed();
        h.ctl_mut().max_bursts = 3;
        let threads: Vec<_> = (0..4).map(|_| fake_thread()).collect();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u64;
        for (i, t) in threads.iter().enumerate() {
            h.set_uc_word(RIP, PC);
            handle(&mut h, Some(t.as_ptr() as u64));
            let c = h.ctl();
            if i < 3 {
                assert_eq!(h.uc_word(RIP), CLONE, "thread {i}");
                let r = regs_of(t);
                assert_eq!(r.slot, h.slot_addr(i));
                assert_eq!((r.budget, r.path, r.depth), (50, PATH_INVALID, 0));
                assert_eq!(h.slot_owner(i), t.as_ptr() as u64);
                assert_eq!((c.active, c.concurrent_max), (i as u32 + 1, i as u64 + 1));
                // Its START record in its own sub-ring: slot i, i + 1
                // bursts running.
                assert_eq!(c.heads[i], 2);
                let w0 = tag(REC_START) | (i as u64 + 1) << 40 | (i as u64) << 32;
                assert_eq!(h.sub_ring(i)[..2], [w0 | tid, PC]);
            } else {
                assert_eq!(h.uc_word(RIP), PC);
                assert_eq!(regs_of(t).slot, 0);
                assert_eq!((c.active, c.concurrent_max), (3, 3));
                assert_eq!(counters(&h), [3, 0, 0, 1, 0]);
            }
        }
        assert_eq!(h.ctl().slot_tids[..4], [tid, tid, tid, 0]);
        // Thread 1's burst ends: slot 1 is free, thread 3 takes it.
        let end = h.rt.end;
        h.call_fs(
            end,
            Regs {
                rax: END_LEFT_CLONES,
                ..Regs::sentinel()
            },
            threads[1].as_ptr() as u64,
        );
        let c = h.ctl();
        assert_eq!(
            (c.active, c.ended, c.slot_tids[1], c.heads[1]),
            (2, 1, 0, 4)
        );
        assert_eq!(h.slot_owner(1), 0);
        h.set_uc_word(RIP, PC);
        handle(&mut h, Some(threads[3].as_ptr() as u64));
        assert_eq!(h.uc_word(RIP), CLONE);
        assert_eq!(regs_of(&threads[3]).slot, h.slot_addr(1));
        assert_eq!(h.slot_owner(1), threads[3].as_ptr() as u64);
        assert_eq!((h.ctl().active, h.ctl().heads[1]), (3, 6));
        assert_eq!(h.sub_ring(1)[2..4], [tag(REC_END) | END_LEFT_CLONES, 0]);
        // Slot 1, three bursts running.
        assert_eq!(
            h.sub_ring(1)[4..6],
            [tag(REC_START) | 3 << 40 | 1 << 32 | tid, PC]
        );
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
            (c.active, h.loc().owner, h.loc().budget, c.heads[0], c.ended),
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
        h.ctl_mut().max_bursts = 1;
        handle(&mut h, None);
        h.loc_mut().budget = 17;
        h.loc_mut().depth = 3;
        // Another thread, at the bound: declined.
        let other = fake_thread();
        h.set_uc_word(RIP, PC + 3);
        handle(&mut h, Some(other.as_ptr() as u64));
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
        assert_eq!((c.active, c.ended, c.heads[0]), (1, 1, 6));
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
                tag(REC_START) | 1 << 40 | tid,
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

        let mut tcb = Box::new([0u64; 128]);
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

    /// A sub-ring more than half full (the daemon is behind) declines the
    /// burst: the slot and `active` are given back, `declined_behind`
    /// counts it, nothing is written. Half full or less starts it. A full
    /// trace (`wait_when_full`) never declines so.
    #[test]
    fn a_sub_ring_more_than_half_full_declines() {
        // 16 words, half of them 8: 10 in use (tails count).
        let mut h = armed();
        h.ctl_mut().heads[0] = 30;
        h.ctl_mut().tails[0] = 20;
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), PC);
        let c = h.ctl();
        assert_eq!((c.active, c.bursts, c.declined_behind), (0, 0, 1));
        assert_eq!((c.heads[0], c.lost_records, h.loc().owner), (30, 0, 0));
        assert_eq!(counters(&h), [0, 0, 0, 0, 0]);

        // 8 in use: room, the burst starts.
        h.ctl_mut().tails[0] = 22;
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), CLONE);
        let c = h.ctl();
        assert_eq!((c.active, c.bursts, c.declined_behind), (1, 1, 1));
        assert_eq!((c.heads[0], c.lost_records, h.loc().owner), (32, 0, fs0()));

        // A full trace waits at a full ring instead of declining.
        let mut h = armed();
        h.ctl_mut().wait_when_full = 1;
        h.ctl_mut().heads[0] = 12;
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), CLONE);
        let c = h.ctl();
        assert_eq!((c.bursts, c.declined_behind, c.heads[0]), (1, 0, 14));
    }

    /// A stand-in for the loader's code on code page 1: `call hook` at
    /// `SITE` (its return site `SITE + 5`), the hook at `HOOK`. Returns
    /// (hook, return site).
    fn with_loader(h: &mut Harness) -> (u64, u64) {
        const SITE: usize = 0x100;
        const HOOK: usize = 0x800;
        let page = h.code_page(1);
        let mut code = vec![0x90u8; 0x900];
        let rel = (HOOK as i64 - (SITE as i64 + 5)) as i32;
        code[SITE] = 0xe8;
        code[SITE + 1..SITE + 5].copy_from_slice(&rel.to_le_bytes());
        code[HOOK] = 0xc3;
        h.load(1, &code);
        let c = h.ctl_mut();
        c.hook = page + HOOK as u64;
        c.hook_lo = page;
        c.hook_hi = page + 4096;
        (page + HOOK as u64, page + SITE as u64 + 5)
    }

    /// The thread stopped where the uprobe on the hook leaves it: `rip`,
    /// with `slot` in the stack word just below `rsp`.
    fn at_hook(h: &mut Harness, rip: u64, slot: u64) {
        h.set_uc_word(RIP, rip);
        let rsp = h.prog_rsp();
        h.set_ret_slot(slot);
        h.set_uc_word(UC_RSP as usize, rsp + 8);
    }

    /// The uprobe on the loader's link-map hook sent the signal: the
    /// tables' header becomes 0 and its generation goes up, whether the
    /// thread is at the hook or just back from `call hook`; no burst
    /// starts, nothing else changes; lookups miss from then on. A burst
    /// signal anywhere else in the loader's code (no call before the pc,
    /// a call elsewhere, a stale stack slot) is an ordinary one.
    #[test]
    fn the_link_map_hook_invalidates_the_tables() {
        let mut h = armed();
        let header = h.ctl().tables;
        let (hook, site) = with_loader(&mut h);
        at_hook(&mut h, hook, 0);
        handle(&mut h, None);
        let c = h.ctl();
        assert_eq!(c.tables, 1 << TABLES_GEN_SHIFT);
        assert_eq!((c.link_changes, c.active, h.uc_word(RIP)), (1, 0, hook));
        assert_eq!(counters(&h), [0; 5]);

        // The daemon puts the header back with the new generation.
        h.ctl_mut().tables = (1 << TABLES_GEN_SHIFT) | header;
        at_hook(&mut h, site, site);
        handle(&mut h, None);
        let c = h.ctl();
        assert_eq!(c.tables, 2 << TABLES_GEN_SHIFT);
        assert_eq!((c.link_changes, c.active, h.uc_word(RIP)), (2, 0, site));
        assert_eq!(counters(&h), [0; 5]);
        // Without a header every lookup misses: a burst signal at a
        // rewritten pc is declined.
        h.set_uc_word(RIP, PC);
        handle(&mut h, None);
        assert_eq!(counters(&h), [0, 0, 0, 0, 1]);

        // Not the hook: a pc in the loader's code after something other
        // than `call hook`, or whose stack slot no longer holds it.
        let mut h = armed();
        let header = h.ctl().tables;
        let (_, site) = with_loader(&mut h);
        for (rip, slot) in [(site, site + 1), (site + 1, site + 1), (site - 5, site - 5)] {
            at_hook(&mut h, rip, slot);
            handle(&mut h, None);
            assert_eq!(h.ctl().tables, header, "rip {rip:#x}");
        }
        assert_eq!(h.ctl().link_changes, 0);
        assert_eq!(counters(&h), [0, 0, 0, 0, 3]);
        // No hook (0, 0): never taken.
        let mut h = armed();
        let header = h.ctl().tables;
        at_hook(&mut h, 0, 0);
        handle(&mut h, None);
        assert_eq!((h.ctl().tables, h.ctl().link_changes), (header, 0));
        assert_eq!(header & !TABLES_HEADER_MASK, 0);
    }

    /// A header with a generation above it is found as without one.
    #[test]
    fn a_header_with_a_generation_is_used() {
        let mut h = armed();
        let header = h.ctl().tables;
        h.ctl_mut().tables = header | (0xfffe << TABLES_GEN_SHIFT);
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), CLONE);
        assert_eq!(counters(&h), [1, 0, 0, 0, 0]);
    }

    /// `path_start` when a burst starts: untouched without `measure`, the
    /// counter with it; a declined signal never touches it.
    #[test]
    fn measure_starts_the_first_path() {
        let mut h = armed();
        h.loc_mut().path_start = 0x1234;
        handle(&mut h, None);
        assert_eq!((h.ctl().bursts, h.loc().path_start), (1, 0x1234));

        let mut h = armed();
        h.ctl_mut().measure = 1;
        h.loc_mut().path_start = 0x1234;
        let t0 = tsc();
        handle(&mut h, None);
        let t1 = tsc();
        assert_eq!(h.ctl().bursts, 1);
        assert_within(h.loc().path_start, t0, t1, "path_start");
        assert_eq!(h.ctl().heads[0], 2);

        let mut h = armed();
        h.ctl_mut().measure = 1;
        h.ctl_mut().armed = 0;
        h.loc_mut().path_start = 0x1234;
        handle(&mut h, None);
        assert_eq!((h.ctl().bursts, h.loc().path_start), (0, 0x1234));
    }
}
