//! The handler and restorer installed for a real signal in the test
//! process: the kernel's signal frame, the ucontext layout (`UC_RIP`) and
//! `rt_sigreturn` through the restorer, end to end.
//!
//! A little "original" function sends itself the signal with `tgkill`; the
//! signal is delivered on the return from that syscall, so the interrupted
//! PC is the instruction after the `syscall`. The "original" returns 1
//! from there; its "clone" (where the table sends a burst) returns 2.
use burstyd_common::burst::{PATH_INVALID, REC_START};
use iced_x86::BlockEncoderOptions;
use iced_x86::code_asm::{CodeAssembler, eax};

use super::asm::tag;
use super::testing::{Harness, Regs, TEST_PAGE, fs0};

const SA_SIGINFO: u64 = 4;
const SA_RESTORER: u64 = 0x0400_0000;

/// The kernel's `struct sigaction` (x86-64).
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

/// `rt_sigaction` itself: glibc's `sigaction` would substitute its own
/// restorer.
fn rt_sigaction(sig: i32, new: &KernelSigaction, old: &mut KernelSigaction) {
    // SAFETY: both pointers are valid kernel sigaction structs of the size
    // passed (8-byte mask).
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            new as *const KernelSigaction,
            old as *mut KernelSigaction,
            8,
        )
    };
    assert_eq!(r, 0, "rt_sigaction");
}

/// `(entry, pc after the syscall, clone)` of the test program at `at`.
fn program(at: u64) -> (Vec<u8>, u64, u64, u64) {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut entry = a.create_label();
    let mut after = a.create_label();
    let mut clone = a.create_label();
    a.set_label(&mut entry).unwrap();
    a.mov(eax, libc::SYS_tgkill as u32).unwrap(); // tgkill(rdi, rsi, rdx)
    a.syscall().unwrap();
    a.set_label(&mut after).unwrap();
    a.mov(eax, 1u32).unwrap();
    a.ret().unwrap();
    a.set_label(&mut clone).unwrap();
    a.mov(eax, 2u32).unwrap();
    a.ret().unwrap();
    let r = a
        .assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .unwrap();
    let addr = |l| r.label_ip(l).unwrap();
    let (e, p, c) = (addr(&entry), addr(&after), addr(&clone));
    (r.inner.code_buffer, e, p, c)
}

/// Runs the test program once: the signal goes to this thread. Returns
/// its rax; every register but rax and the syscall's rcx/r11 must survive
/// the signal (rt_sigreturn restores what the handler clobbered).
fn run(h: &mut Harness, entry: u64, sig: i32) -> u64 {
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let before = Regs {
        rdi: pid as u64,
        rsi: tid as u64,
        rdx: sig as u64,
        ..Regs::sentinel()
    };
    let after = h.call(entry, before);
    before.assert_preserved(&after, &["rax", "rcx", "r11"]);
    after.rax
}

#[test]
fn handler_and_restorer_on_a_real_signal() {
    let sig = libc::SIGRTMAX() - 2;
    let mut h = Harness::new();
    h.loc_mut().owner = 0; // no burst runs
    let (code, entry, pc, clone) = program(h.code_page(TEST_PAGE));
    h.load(TEST_PAGE, &code);
    h.ctl_mut().burst_len = 50;
    let new = KernelSigaction {
        handler: h.rt.handler,
        flags: SA_SIGINFO | SA_RESTORER,
        restorer: h.rt.restorer,
        mask: 0,
    };
    let mut old = KernelSigaction::default();
    rt_sigaction(sig, &new, &mut old);

    // Disarmed: the original goes on.
    let disarmed = run(&mut h, entry, sig);
    // Armed, PC not rewritten: the original goes on.
    h.ctl_mut().armed = 1;
    let not_rewritten = run(&mut h, entry, sig);
    // Armed, PC rewritten: the return from the signal goes to the clone.
    h.set_table(&[(pc, clone)]);
    let burst = run(&mut h, entry, sig);

    let mut ours = KernelSigaction::default();
    rt_sigaction(sig, &old, &mut ours);
    assert_eq!((disarmed, not_rewritten, burst), (1, 1, 2));
    let c = h.ctl();
    assert_eq!((c.declined_disarmed, c.declined_pc, c.bursts), (1, 1, 1));
    assert_eq!(
        (c.active, h.loc().owner, h.loc().budget, h.loc().path),
        (1, fs0(), 50, PATH_INVALID)
    );
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    assert_eq!(h.ring()[..2], [tag(REC_START) | 1 << 40 | tid, pc]);
    assert_eq!(c.heads[0], 2);
}
