//! `rt_exit`: an instrumented function is left (return, tail call, call
//! that does not return).
use burstyd_common::burst::{END_LEFT_CLONES, PATH_END_NORETURN, PATH_INVALID, REC_PATH};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, eax, ecx, qword_ptr, r8, rax, rcx, rdi, rdx, rsi, rsp,
};

use super::asm::{RipRel, field, tag};
use super::{FRAME, NO_PATH};

/// `rt_exit(eax = fid | NO_PATH, ecx = kind)`: PATH record (`w0 = tag |
/// kind << 32 | fid`, `w1 = path`; none with `NO_PATH`); for returns and
/// tail calls (not `PATH_END_NORETURN`), pop the shadow entry of this
/// frame (restoring the caller's path register) and make sure the return
/// goes to a clone. Clobbers rax, rcx, rdx.
///
/// The pop drops the entries of dead deeper frames (rsp below ours) and
/// matches this frame by rsp; without a match the path becomes
/// `PATH_INVALID`. The return address at the program's rsp (`[rsp +
/// FRAME]` at entry): one in `[clone_lo, clone_hi)` needs nothing; an
/// original one is translated in place (`rt_lookup`), or, when it was not
/// rewritten, the burst ends (`rt_end(END_LEFT_CLONES)`).
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
    let mut translate = a.create_label();
    let mut leave = a.create_label();
    let mut done = a.create_label();

    a.set_label(entry)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.lea(r8, qword_ptr(rsp + (FRAME + 24)))?; // the program's rsp
    a.test(eax, NO_PATH)?;
    a.jne(nopath)?;
    a.push(rcx)?;
    a.mov(eax, eax)?;
    a.shl(rcx, 32)?;
    a.or(rax, rcx)?;
    a.mov(rdx, tag(REC_PATH))?;
    a.or(rax, rdx)?;
    a.rip_rm(Code::Mov_r64_rm64, rdx, field!(control, path))?;
    a.call(emit)?;
    a.pop(rcx)?;
    a.set_label(&mut nopath)?;
    a.cmp(ecx, PATH_END_NORETURN as i32)?;
    a.je(done)?;

    // Pop: drop entries of dead deeper frames, match this one by rsp.
    a.rip_rm(Code::Lea_r64_m, rdx, field!(control, shadow))?;
    a.rip_rm(Code::Mov_r64_rm64, rsi, field!(control, depth))?;
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
    a.rip_mr(Code::Mov_rm64_r64, field!(control, path), rax)?;
    a.dec(rsi)?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, depth), rsi)?;
    a.jmp(fix)?;
    a.set_label(&mut pop_dead)?;
    a.dec(rsi)?;
    a.jmp(lp)?;
    a.set_label(&mut nomatch)?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, depth), rsi)?;
    a.mov(rax, PATH_INVALID)?;
    a.rip_mr(Code::Mov_rm64_r64, field!(control, path), rax)?;

    // The return address: a clone address needs nothing; an original one
    // is translated, or the burst ends.
    a.set_label(&mut fix)?;
    a.mov(rax, qword_ptr(r8))?;
    a.rip_rm(Code::Cmp_r64_rm64, rax, field!(control, clone_lo))?;
    a.jb(translate)?;
    a.rip_rm(Code::Cmp_r64_rm64, rax, field!(control, clone_hi))?;
    a.jb(done)?;
    a.set_label(&mut translate)?;
    a.call(lookup)?;
    a.test(rax, rax)?;
    a.je(leave)?;
    a.mov(qword_ptr(r8), rax)?;
    a.jmp(done)?;
    a.set_label(&mut leave)?;
    a.mov(eax, END_LEFT_CLONES as u32)?;
    a.call(end)?;
    a.set_label(&mut done)?;
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.ret()?;
    Ok(())
}
