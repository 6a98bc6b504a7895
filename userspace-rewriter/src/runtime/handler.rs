//! The burst signal handler and its `rt_sigreturn` restorer.
use burstyd_common::burst::{PATH_INVALID, REC_START};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, eax, ecx, edi, qword_ptr, r9, r10, rax, rdx, rsi, rsp,
};

use super::asm::{RipRel, field, tag};

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
/// In order: disarmed → `declined_disarmed`; `burst_len` 0 (`--burst 0`,
/// back to the interrupted original code) → `declined_budget`; `active`
/// already set (`lock cmpxchg` 0 → 1 fails) → `declined_busy`; `fs:[0]`
/// is not the thread's TCB (`arch_prctl(ARCH_GET_FS)`: 0 before libc set up
/// TLS) or the PC is not in the instruction table → `active` = 0,
/// `declined_pc`. Else the PC in the ucontext becomes the clone's, `owner` =
/// `fs:[0]`, `budget` = `burst_len`, `path` = `PATH_INVALID`, `depth` = 0,
/// `bursts` + 1, and a START record (`w0 = tag | gettid()`, `w1` = the
/// interrupted PC).
pub(super) fn handler(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
    lookup: CodeLabel,
) -> Result<(), IcedError> {
    let mut busy = a.create_label();
    let mut disarmed = a.create_label();
    let mut notfound = a.create_label();
    let mut zero = a.create_label();

    a.set_label(entry)?;
    a.rip_mi(Code::Cmp_rm32_imm8, field!(control, armed), 0)?;
    a.je(disarmed)?;
    // Budget zero (`--burst 0`): back to the interrupted original code.
    a.rip_mi(Code::Cmp_rm64_imm8, field!(control, burst_len), 0)?;
    a.je(zero)?;
    a.xor(eax, eax)?;
    a.mov(ecx, 1u32)?;
    a.lock()
        .rip_mr(Code::Cmpxchg_rm32_r32, field!(control, active), ecx)?;
    a.jne(busy)?;
    a.mov(r9, rdx)?; // ucontext
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
    a.rip_mr(Code::Mov_rm64_r64, field!(control, owner), rax)?;
    a.rip_rm(Code::Mov_r64_rm64, rax, field!(control, burst_len))?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, budget), rax)?;
    a.mov(rax, PATH_INVALID)?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, path), rax)?;
    a.rip_mi(Code::Mov_rm64_imm32, field!(control, depth), 0)?;
    a.rip_m(Code::Inc_rm64, field!(control, bursts))?;
    // START record: gettid(), interrupted PC.
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.mov(eax, eax)?;
    a.mov(rdx, tag(REC_START))?;
    a.or(rax, rdx)?;
    a.mov(rdx, r10)?;
    a.call(emit)?;
    a.ret()?;

    a.set_label(&mut notfound)?;
    a.rip_mi(Code::Mov_rm32_imm32, field!(control, active), 0)?;
    a.rip_m(Code::Inc_rm64, field!(control, declined_pc))?;
    a.ret()?;
    a.set_label(&mut busy)?;
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
