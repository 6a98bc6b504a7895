//! The burst signal handler and its `rt_sigreturn` restorer.
use burstyd_common::burst::{
    END_LEFT_UNSEEN, MAX_SLOTS, PATH_INVALID, REC_START, START_RUNNING_SHIFT, START_SLOT_SHIFT,
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
/// slot << 32 and `gettid()`; `w1` = the interrupted PC), `burst_start`
/// = 0 (the burst's clock starts at its next record); then, with
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
    a.mov(eax, END_LEFT_UNSEEN as u32)?;
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
    a.rip_mi(Code::Mov_rm64_imm32, local!(control, paths_until), 0)?;
    // Memory mode: one burst in refs_every records references (the
    // countdown is not locked: threads racing on it only move the
    // spacing).
    let mut refs_on = a.create_label();
    let mut refs_off = a.create_label();
    a.rip_rm(Code::Mov_r64_rm64, rax, field!(control, refs_every))?;
    a.cmp(rax, 1)?;
    a.jbe(refs_on)?;
    a.rip_m(Code::Dec_rm64, field!(control, refs_countdown))?;
    a.jg(refs_off)?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, refs_countdown), rax)?;
    // A burst that records references is longer (its own bounds, in
    // references and checks); without memory mode (`refs_burst` 0)
    // nothing changes.
    let mut refs_set = a.create_label();
    a.set_label(&mut refs_on)?;
    a.rip_rm(Code::Mov_r64_rm64, rax, field!(control, refs_burst))?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, refs), rax)?;
    a.test(rax, rax)?;
    a.je(refs_set)?;
    a.rip_rm(Code::Mov_r64_rm64, rax, field!(control, refs_burst_len))?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, budget), rax)?;
    // Its path records stop after a path-mode burst's checks (see
    // `BurstRegs::paths_until`; none stop when it is no longer).
    a.rip_rm(Code::Sub_r64_rm64, rax, field!(control, burst_len))?;
    a.jbe(refs_set)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, paths_until), rax)?;
    a.jmp(refs_set)?;
    a.set_label(&mut refs_off)?;
    a.rip_mi(Code::Mov_rm64_imm32, local!(control, refs), 0)?;
    a.set_label(&mut refs_set)?;
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
    // The burst's clock starts at its next record (`rt_emit`): the
    // signal's delivery and `rt_sigreturn` are not the program's time.
    a.rip_mi(Code::Mov_rm64_imm32, local!(control, burst_start), 0)?;
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
mod tests;
