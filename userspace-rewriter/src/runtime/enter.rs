//! `rt_enter`: an instrumented function was entered.
use burstyd_common::burst::{REC_ENTER, SHADOW_DEPTH};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, eax, edx, qword_ptr, r8, rax, rcx, rdi, rdx, rsi, rsp,
};

use super::FRAME;
use super::asm::{RipRel, field, tag};

/// `rt_enter(eax = fid | flags)`: push (rsp, caller's path), path = 0,
/// ENTER record (`w0 = tag | fid`, the flags stripped; `w1 = 0`). Shadow
/// entries at or below the new frame are dead (frames left by longjmp or
/// unwinding) and are dropped first. With the shadow stack full nothing is
/// pushed and `shadow_overflow` counts it. Clobbers rax, rcx, rdx.
///
/// "rsp" is the program's at the snippet, `[rsp + FRAME]` at entry: the
/// address of the activation's return address.
pub(super) fn enter(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
) -> Result<(), IcedError> {
    let mut lp = a.create_label();
    let mut push = a.create_label();
    let mut store = a.create_label();
    let mut overflow = a.create_label();

    a.set_label(entry)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.lea(r8, qword_ptr(rsp + (FRAME + 24)))?; // the program's rsp
    a.rip_rm(Code::Lea_r64_m, rdx, field!(control, shadow))?;
    a.rip_rm(Code::Mov_r64_rm64, rsi, field!(control, depth))?;
    // Drop entries whose rsp is at or below ours.
    a.set_label(&mut lp)?;
    a.test(rsi, rsi)?;
    a.je(push)?;
    a.mov(rdi, rsi)?;
    a.shl(rdi, 4)?;
    a.cmp(qword_ptr(rdx + rdi - 16), r8)?;
    a.ja(push)?;
    a.dec(rsi)?;
    a.jmp(lp)?;
    a.set_label(&mut push)?;
    a.cmp(rsi, SHADOW_DEPTH as i32)?;
    a.jae(overflow)?;
    a.mov(rdi, rsi)?;
    a.shl(rdi, 4)?;
    a.mov(qword_ptr(rdx + rdi), r8)?;
    a.rip_rm(Code::Mov_r64_rm64, rcx, field!(control, path))?;
    a.mov(qword_ptr(rdx + rdi + 8), rcx)?;
    a.inc(rsi)?;
    a.set_label(&mut store)?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, depth), rsi)?;
    a.rip_mi(Code::Mov_rm64_imm32, field!(control, path), 0)?;
    a.and(eax, 0x7fff_ffff)?;
    a.mov(rdx, tag(REC_ENTER))?;
    a.or(rax, rdx)?;
    a.xor(edx, edx)?;
    a.call(emit)?;
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.ret()?;
    a.set_label(&mut overflow)?;
    a.rip_m(Code::Inc_rm64, field!(control, shadow_overflow))?;
    a.jmp(store)?;
    Ok(())
}
