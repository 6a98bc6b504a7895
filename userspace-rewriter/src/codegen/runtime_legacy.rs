//! The runtime at the start of the region, as written today instruction by
//! instruction with the [`Emitter`]: the record writer (`rt_emit`), the two
//! binary-search lookups, the `rt_enter`/`rt_exit`/`rt_back`/`rt_end`
//! routines behind Ball-Larus path records and the shadow stack, and the
//! signal handler that starts a burst (Hirzel & Chilimbi's switch from
//! checking to instrumented code) with its `rt_sigreturn` restorer.
//!
//! Kept in one file (with [`add_path`] and `tag`) so it can be replaced
//! in one piece.

use burstyd_common::burst::*;
use iced_x86::{Code, IcedError, Instruction, MemoryOperand, Register};

use super::emitter::{Emitter, mem, rip};
use super::image::Layout;

/// Bytes between `rsp` inside a runtime routine (before it pushes anything)
/// and the program's `rsp` at the snippet: return address, rdx, rcx, rax,
/// flags, red zone.
const FRAME: i64 = 8 + 24 + 8 + 128;

/// `rt_exit` argument flag: the function has no valid path numbering.
pub(super) const NO_PATH: u32 = 0x8000_0000;

/// The runtime routines' labels.
pub(super) struct Runtime {
    pub(super) emit: u64,
    pub(super) lookup: u64,
    pub(super) lookup_fn: u64,
    pub(super) enter: u64,
    pub(super) exit: u64,
    pub(super) back: u64,
    pub(super) end: u64,
    pub(super) handler: u64,
    pub(super) restorer: u64,
}

/// `add [path], v` inside a frame where flags may be clobbered and rax is
/// saved (for values that do not fit an imm32, rax is used).
pub(super) fn add_path(em: &mut Emitter, l: &Layout, v: u64) -> Result<(), IcedError> {
    if v <= i32::MAX as u64 {
        em.e(Instruction::with2(
            Code::Add_rm64_imm32,
            rip(field!(l, path)),
            v as u32 as i32,
        ))
    } else {
        em.push(Register::RAX)?;
        em.mov_imm(Register::RAX, v)?;
        em.mr(Code::Add_rm64_r64, field!(l, path), Register::RAX)?;
        em.pop(Register::RAX)
    }
}

/// A binary search over a sorted `(original, clone)` table whose address
/// and length are the control-block words at `addr_field`/`len_field`:
/// `rax` = original → `rax` = clone, or 0 (or the original when
/// `keep_if_missing`). Clobbers rcx, rdx.
fn emit_lookup(
    em: &mut Emitter,
    entry: u64,
    addr_field: u64,
    len_field: u64,
    keep_if_missing: bool,
) -> Result<(), IcedError> {
    use Register::*;
    let (lp, right, found, none, out) =
        (em.label(), em.label(), em.label(), em.label(), em.label());
    em.bind(entry);
    em.push(RSI)?;
    em.push(RDI)?;
    em.push(R8)?;
    em.e(Instruction::with2(Code::Mov_r64_rm64, R8, RAX))?;
    em.rm(Code::Mov_r64_rm64, RSI, addr_field)?;
    em.e(Instruction::with2(Code::Xor_r32_rm32, ECX, ECX))?; // lo
    em.rm(Code::Mov_r64_rm64, RDX, len_field)?; // hi
    em.bind(lp);
    em.e(Instruction::with2(Code::Cmp_r64_rm64, RCX, RDX))?;
    em.jcc(Code::Jae_rel32_64, none)?;
    em.e(Instruction::with2(
        Code::Lea_r64_m,
        RAX,
        mem(RCX, RDX, 1, 0),
    ))?;
    em.e(Instruction::with2(Code::Shr_rm64_1, RAX, 1))?;
    em.e(Instruction::with2(Code::Mov_r64_rm64, RDI, RAX))?;
    em.e(Instruction::with2(Code::Shl_rm64_imm8, RDI, 4))?;
    em.e(Instruction::with2(
        Code::Cmp_rm64_r64,
        mem(RSI, RDI, 1, 0),
        R8,
    ))?;
    em.jcc(Code::Je_rel32_64, found)?;
    em.jcc(Code::Jb_rel32_64, right)?;
    em.e(Instruction::with2(Code::Mov_r64_rm64, RDX, RAX))?;
    em.jmp(lp)?;
    em.bind(right);
    em.e(Instruction::with2(
        Code::Lea_r64_m,
        RCX,
        mem(RAX, Register::None, 1, 1),
    ))?;
    em.jmp(lp)?;
    em.bind(found);
    em.e(Instruction::with2(
        Code::Mov_r64_rm64,
        RAX,
        mem(RSI, RDI, 1, 8),
    ))?;
    em.jmp(out)?;
    em.bind(none);
    if keep_if_missing {
        em.e(Instruction::with2(Code::Mov_r64_rm64, RAX, R8))?;
    } else {
        em.e(Instruction::with2(Code::Xor_r32_rm32, EAX, EAX))?;
    }
    em.bind(out);
    em.pop(R8)?;
    em.pop(RDI)?;
    em.pop(RSI)?;
    em.ret();
    Ok(())
}

fn tag(t: u64) -> u64 {
    t << TAG_SHIFT
}

/// The runtime: record writer, table lookup, enter/exit/back-edge/end
/// routines, the signal handler and its restorer.
pub(super) fn emit_runtime(em: &mut Emitter, l: &Layout) -> Result<Runtime, IcedError> {
    use Register::*;
    let rt = Runtime {
        emit: em.label(),
        lookup: em.label(),
        lookup_fn: em.label(),
        enter: em.label(),
        exit: em.label(),
        back: em.label(),
        end: em.label(),
        handler: em.label(),
        restorer: em.label(),
    };
    let shadow = field!(l, shadow);

    // rt_emit(rax = w0, rdx = w1); clobbers rcx. A full ring truncates the
    // burst (its budget drops to 1) and counts the record as lost, unless
    // `wait_when_full` (full trace), which yields (bounded) for the daemon.
    {
        let (full, retry, wait, lost, done) =
            (em.label(), em.label(), em.label(), em.label(), em.label());
        em.bind(rt.emit);
        em.push(RSI)?;
        em.push(RDI)?;
        em.push(R8)?;
        em.mov_imm(R8, 1 << 22)?; // yields before giving up
        em.bind(retry);
        em.rm(Code::Mov_r64_rm64, RCX, field!(l, head))?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RSI, RCX))?;
        em.rm(Code::Sub_r64_rm64, RSI, field!(l, tail))?;
        em.e(Instruction::with2(Code::Add_rm64_imm8, RSI, 1))?;
        em.rm(Code::Mov_r64_rm64, RDI, field!(l, ring_mask))?;
        em.e(Instruction::with2(Code::Cmp_r64_rm64, RSI, RDI))?;
        em.jcc(Code::Ja_rel32_64, full)?;
        em.e(Instruction::with2(Code::And_r64_rm64, RDI, RCX))?;
        em.rm(Code::Mov_r64_rm64, RSI, field!(l, ring_addr))?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            mem(RSI, RDI, 8, 0),
            RAX,
        ))?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            mem(RSI, RDI, 8, 8),
            RDX,
        ))?;
        em.e(Instruction::with2(Code::Add_rm64_imm8, RCX, 2))?;
        em.mr(Code::Mov_rm64_r64, field!(l, head), RCX)?;
        em.bind(done);
        em.pop(R8)?;
        em.pop(RDI)?;
        em.pop(RSI)?;
        em.ret();
        em.bind(full);
        em.e(Instruction::with2(
            Code::Cmp_rm64_imm8,
            rip(field!(l, wait_when_full)),
            0,
        ))?;
        em.jcc(Code::Je_rel32_64, lost)?;
        em.e(Instruction::with2(Code::Sub_rm64_imm8, R8, 1))?;
        em.jcc(Code::Je_rel32_64, lost)?;
        em.bind(wait);
        // sched_yield(); rcx/r11 are clobbered by syscall: save rax, rdx, r11.
        em.push(RAX)?;
        em.push(RDX)?;
        em.push(R11)?;
        em.mov_imm(RAX, 24)?;
        em.emit(Instruction::with(Code::Syscall));
        em.pop(R11)?;
        em.pop(RDX)?;
        em.pop(RAX)?;
        em.jmp(retry)?;
        em.bind(lost);
        em.inc(field!(l, lost_records))?;
        em.e(Instruction::with2(
            Code::Cmp_rm64_imm8,
            rip(field!(l, budget)),
            1,
        ))?;
        em.jcc(Code::Jbe_rel32_64, done)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_imm32,
            rip(field!(l, budget)),
            1,
        ))?;
        em.inc(field!(l, truncated))?;
        em.jmp(done)?;
    }

    // rt_lookup(rax = original address) -> rax = clone address or 0, over
    // every rewritten instruction; rt_lookup_fn: over function entries
    // (original start -> clone entry), returning rax unchanged when not
    // found (an indirect call to code that was not cloned).
    emit_lookup(
        em,
        rt.lookup,
        field!(l, table_addr),
        field!(l, table_len),
        false,
    )?;
    emit_lookup(
        em,
        rt.lookup_fn,
        field!(l, fn_table_addr),
        field!(l, fn_table_len),
        true,
    )?;

    // rt_end(eax = reason): END record, the burst is over.
    {
        em.bind(rt.end);
        em.e(Instruction::with2(Code::Mov_r32_rm32, EAX, EAX))?;
        em.mov_imm(RDX, tag(REC_END))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.e(Instruction::with2(Code::Xor_r32_rm32, EDX, EDX))?;
        em.call(rt.emit)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_imm32,
            rip(field!(l, owner)),
            0,
        ))?;
        em.inc(field!(l, ended))?;
        em.e(Instruction::with2(
            Code::Mov_rm32_imm32,
            rip(field!(l, active)),
            0u32,
        ))?;
        em.ret();
    }

    // rt_enter(eax = fid | flags): push (rsp, caller's path), path = 0,
    // ENTER record. Shadow entries at or below the new frame are dead
    // (frames left by longjmp or unwinding) and are dropped first.
    {
        let (lp, push, store, overflow) = (em.label(), em.label(), em.label(), em.label());
        em.bind(rt.enter);
        em.push(RSI)?;
        em.push(RDI)?;
        em.push(R8)?;
        em.e(Instruction::with2(
            Code::Lea_r64_m,
            R8,
            MemoryOperand::with_base_displ(RSP, FRAME + 24),
        ))?;
        em.e(Instruction::with2(Code::Lea_r64_m, RDX, rip(shadow)))?;
        em.rm(Code::Mov_r64_rm64, RSI, field!(l, depth))?;
        em.bind(lp);
        em.e(Instruction::with2(Code::Test_rm64_r64, RSI, RSI))?;
        em.jcc(Code::Je_rel32_64, push)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RDI, RSI))?;
        em.e(Instruction::with2(Code::Shl_rm64_imm8, RDI, 4))?;
        em.e(Instruction::with2(
            Code::Cmp_rm64_r64,
            mem(RDX, RDI, 1, -16),
            R8,
        ))?;
        em.jcc(Code::Ja_rel32_64, push)?;
        em.e(Instruction::with1(Code::Dec_rm64, RSI))?;
        em.jmp(lp)?;
        em.bind(push);
        em.e(Instruction::with2(
            Code::Cmp_rm64_imm32,
            RSI,
            SHADOW_DEPTH as i32,
        ))?;
        em.jcc(Code::Jae_rel32_64, overflow)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RDI, RSI))?;
        em.e(Instruction::with2(Code::Shl_rm64_imm8, RDI, 4))?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            mem(RDX, RDI, 1, 0),
            R8,
        ))?;
        em.rm(Code::Mov_r64_rm64, RCX, field!(l, path))?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            mem(RDX, RDI, 1, 8),
            RCX,
        ))?;
        em.e(Instruction::with1(Code::Inc_rm64, RSI))?;
        em.bind(store);
        em.mr(Code::Mov_rm64_r64, field!(l, depth), RSI)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_imm32,
            rip(field!(l, path)),
            0,
        ))?;
        em.e(Instruction::with2(Code::And_rm32_imm32, EAX, 0x7fff_ffff))?;
        em.mov_imm(RDX, tag(REC_ENTER))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.e(Instruction::with2(Code::Xor_r32_rm32, EDX, EDX))?;
        em.call(rt.emit)?;
        em.pop(R8)?;
        em.pop(RDI)?;
        em.pop(RSI)?;
        em.ret();
        em.bind(overflow);
        em.inc(field!(l, shadow_overflow))?;
        em.jmp(store)?;
    }

    // rt_back(eax = fid): PATH record (back edge). The caller then sets the
    // restart value.
    {
        em.bind(rt.back);
        em.e(Instruction::with2(Code::Mov_r32_rm32, EAX, EAX))?;
        em.mov_imm(RDX, tag(REC_PATH) | (PATH_END_BACK_EDGE << 32))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.rm(Code::Mov_r64_rm64, RDX, field!(l, path))?;
        em.call(rt.emit)?;
        em.ret();
    }

    // rt_exit(eax = fid | NO_PATH, ecx = kind): PATH record; for returns
    // and tail calls, pop the shadow entry of this frame (restoring the
    // caller's path register) and make sure the return goes to a clone.
    {
        let (nopath, lp, pop_dead, nomatch, fix, lookup, leave, done) = (
            em.label(),
            em.label(),
            em.label(),
            em.label(),
            em.label(),
            em.label(),
            em.label(),
            em.label(),
        );
        em.bind(rt.exit);
        em.push(RSI)?;
        em.push(RDI)?;
        em.push(R8)?;
        em.e(Instruction::with2(
            Code::Lea_r64_m,
            R8,
            MemoryOperand::with_base_displ(RSP, FRAME + 24),
        ))?;
        em.e(Instruction::with2(Code::Test_rm32_imm32, EAX, NO_PATH))?;
        em.jcc(Code::Jne_rel32_64, nopath)?;
        em.push(RCX)?;
        em.e(Instruction::with2(Code::Mov_r32_rm32, EAX, EAX))?;
        em.e(Instruction::with2(Code::Shl_rm64_imm8, RCX, 32))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RCX))?;
        em.mov_imm(RDX, tag(REC_PATH))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.rm(Code::Mov_r64_rm64, RDX, field!(l, path))?;
        em.call(rt.emit)?;
        em.pop(RCX)?;
        em.bind(nopath);
        em.e(Instruction::with2(
            Code::Cmp_rm32_imm8,
            ECX,
            PATH_END_NORETURN as i32,
        ))?;
        em.jcc(Code::Je_rel32_64, done)?;
        // Pop: drop entries of dead deeper frames, match this one by rsp.
        em.e(Instruction::with2(Code::Lea_r64_m, RDX, rip(shadow)))?;
        em.rm(Code::Mov_r64_rm64, RSI, field!(l, depth))?;
        em.bind(lp);
        em.e(Instruction::with2(Code::Test_rm64_r64, RSI, RSI))?;
        em.jcc(Code::Je_rel32_64, nomatch)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RDI, RSI))?;
        em.e(Instruction::with2(Code::Shl_rm64_imm8, RDI, 4))?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            mem(RDX, RDI, 1, -16),
        ))?;
        em.e(Instruction::with2(Code::Cmp_r64_rm64, RAX, R8))?;
        em.jcc(Code::Jb_rel32_64, pop_dead)?;
        em.jcc(Code::Ja_rel32_64, nomatch)?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            mem(RDX, RDI, 1, -8),
        ))?;
        em.mr(Code::Mov_rm64_r64, field!(l, path), RAX)?;
        em.e(Instruction::with1(Code::Dec_rm64, RSI))?;
        em.mr(Code::Mov_rm64_r64, field!(l, depth), RSI)?;
        em.jmp(fix)?;
        em.bind(pop_dead);
        em.e(Instruction::with1(Code::Dec_rm64, RSI))?;
        em.jmp(lp)?;
        em.bind(nomatch);
        em.mr(Code::Mov_rm64_r64, field!(l, depth), RSI)?;
        em.mov_imm(RAX, PATH_INVALID)?;
        em.mr(Code::Mov_rm64_r64, field!(l, path), RAX)?;
        // The return address: a clone address needs nothing; an original
        // one is translated, or the burst ends.
        em.bind(fix);
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            MemoryOperand::with_base(R8),
        ))?;
        em.rm(Code::Cmp_r64_rm64, RAX, field!(l, clone_lo))?;
        em.jcc(Code::Jb_rel32_64, lookup)?;
        em.rm(Code::Cmp_r64_rm64, RAX, field!(l, clone_hi))?;
        em.jcc(Code::Jb_rel32_64, done)?;
        em.bind(lookup);
        em.call(rt.lookup)?;
        em.e(Instruction::with2(Code::Test_rm64_r64, RAX, RAX))?;
        em.jcc(Code::Je_rel32_64, leave)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            MemoryOperand::with_base(R8),
            RAX,
        ))?;
        em.jmp(done)?;
        em.bind(leave);
        em.mov_imm(RAX, END_LEFT_CLONES)?;
        em.call(rt.end)?;
        em.bind(done);
        em.pop(R8)?;
        em.pop(RDI)?;
        em.pop(RSI)?;
        em.ret();
    }

    // The signal handler: handler(sig, info, ucontext). Starts a burst when
    // armed, idle, and the interrupted PC was rewritten. Everything it
    // clobbers is restored by rt_sigreturn from the ucontext.
    {
        let (busy, disarmed, notfound, zero) = (em.label(), em.label(), em.label(), em.label());
        // uc_mcontext.gregs[REG_RIP]: ucontext (40) + 16 * 8.
        const UC_RIP: i64 = 40 + 16 * 8;
        em.bind(rt.handler);
        em.e(Instruction::with2(
            Code::Cmp_rm32_imm8,
            rip(field!(l, armed)),
            0,
        ))?;
        em.jcc(Code::Je_rel32_64, disarmed)?;
        // Budget zero (`--burst 0`): back to the interrupted original code.
        em.e(Instruction::with2(
            Code::Cmp_rm64_imm8,
            rip(field!(l, burst_len)),
            0,
        ))?;
        em.jcc(Code::Je_rel32_64, zero)?;
        em.e(Instruction::with2(Code::Xor_r32_rm32, EAX, EAX))?;
        em.mov_imm(RCX, 1)?;
        em.e(
            Instruction::with2(Code::Cmpxchg_rm32_r32, rip(field!(l, active)), ECX).map(|mut i| {
                i.set_has_lock_prefix(true);
                i
            }),
        )?;
        em.jcc(Code::Jne_rel32_64, busy)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, R9, RDX))?; // ucontext
        // fs:[0] must be the thread's TCB (the x86-64 TLS ABI): not yet so
        // before libc set up TLS, and then no burst may start.
        em.lea_rsp(-16)?;
        em.mov_imm(RAX, 158)?; // arch_prctl(ARCH_GET_FS, rsp)
        em.mov_imm(RDI, 0x1003)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RSI, RSP))?;
        em.emit(Instruction::with(Code::Syscall));
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            MemoryOperand::with_base(RSP),
        ))?;
        em.lea_rsp(16)?;
        em.e(Instruction::with2(Code::Test_rm64_r64, RAX, RAX))?;
        em.jcc(Code::Je_rel32_64, notfound)?;
        em.e(Instruction::with2(
            Code::Cmp_r64_rm64,
            RAX,
            MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS),
        ))?;
        em.jcc(Code::Jne_rel32_64, notfound)?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            R10,
            MemoryOperand::with_base_displ(R9, UC_RIP),
        ))?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RAX, R10))?;
        em.call(rt.lookup)?;
        em.e(Instruction::with2(Code::Test_rm64_r64, RAX, RAX))?;
        em.jcc(Code::Je_rel32_64, notfound)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            MemoryOperand::with_base_displ(R9, UC_RIP),
            RAX,
        ))?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS),
        ))?;
        em.mr(Code::Mov_rm64_r64, field!(l, owner), RAX)?;
        em.rm(Code::Mov_r64_rm64, RAX, field!(l, burst_len))?;
        em.mr(Code::Mov_rm64_r64, field!(l, budget), RAX)?;
        em.mov_imm(RAX, PATH_INVALID)?;
        em.mr(Code::Mov_rm64_r64, field!(l, path), RAX)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_imm32,
            rip(field!(l, depth)),
            0,
        ))?;
        em.inc(field!(l, bursts))?;
        // START record: gettid(), interrupted PC.
        em.mov_imm(RAX, 186)?;
        em.emit(Instruction::with(Code::Syscall));
        em.e(Instruction::with2(Code::Mov_r32_rm32, EAX, EAX))?;
        em.mov_imm(RDX, tag(REC_START))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RDX, R10))?;
        em.call(rt.emit)?;
        em.ret();
        em.bind(notfound);
        em.e(Instruction::with2(
            Code::Mov_rm32_imm32,
            rip(field!(l, active)),
            0u32,
        ))?;
        em.inc(field!(l, declined_pc))?;
        em.ret();
        em.bind(busy);
        em.inc(field!(l, declined_busy))?;
        em.ret();
        em.bind(zero);
        em.inc(field!(l, declined_budget))?;
        em.ret();
        em.bind(disarmed);
        em.inc(field!(l, declined_disarmed))?;
        em.ret();

        em.bind(rt.restorer);
        em.mov_imm(RAX, 15)?;
        em.emit(Instruction::with(Code::Syscall));
        em.emit(Instruction::with(Code::Int3));
    }
    Ok(rt)
}
