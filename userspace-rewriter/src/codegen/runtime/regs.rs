//! Calling a runtime routine with every general register set, and reading
//! every register back: the register contract is checked, not assumed.
use std::mem::offset_of;

/// Every general register but rsp and r15 (the trampoline's).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Regs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
}

const _: () = assert!(size_of::<Regs>() == 14 * 8 && offset_of!(Regs, r14) == 104);

impl Regs {
    /// Distinct recognisable values in every register.
    pub(super) fn sentinel() -> Regs {
        let v = |i: u64| 0x5e17_0000_0000_0000 | (i << 32) | (0xdead_0000 + i);
        Regs {
            rax: v(0),
            rbx: v(1),
            rcx: v(2),
            rdx: v(3),
            rsi: v(4),
            rdi: v(5),
            rbp: v(6),
            r8: v(7),
            r9: v(8),
            r10: v(9),
            r11: v(10),
            r12: v(11),
            r13: v(12),
            r14: v(13),
        }
    }

    fn named(&self) -> [(&'static str, u64); 14] {
        [
            ("rax", self.rax),
            ("rbx", self.rbx),
            ("rcx", self.rcx),
            ("rdx", self.rdx),
            ("rsi", self.rsi),
            ("rdi", self.rdi),
            ("rbp", self.rbp),
            ("r8", self.r8),
            ("r9", self.r9),
            ("r10", self.r10),
            ("r11", self.r11),
            ("r12", self.r12),
            ("r13", self.r13),
            ("r14", self.r14),
        ]
    }

    /// Panics unless every register outside `clobbered` kept its value.
    pub(super) fn assert_preserved(&self, after: &Regs, clobbered: &[&str]) {
        for ((name, b), (_, a)) in self.named().into_iter().zip(after.named()) {
            if !clobbered.contains(&name) {
                assert_eq!(a, b, "{name} not preserved: {b:#x} -> {a:#x}");
            }
        }
    }
}

/// What a clone's standard frame lets a routine clobber.
pub(super) const FRAME_CLOBBERS: &[&str] = &["rax", "rcx", "rdx"];

/// The trampoline's argument.
#[repr(C)]
struct Call {
    regs: Regs,
    target: u64,
    stack: u64,
    host_rsp: u64,
    /// Non-zero: run the routine with the fs base set to `fs`.
    switch_fs: u64,
    fs: u64,
    saved_fs: u64,
}

/// Loads `call.regs`, switches to `call.stack`, calls `call.target`, stores
/// the registers back and switches back (and the fs base, if asked).
///
/// # Safety
///
/// `call` points to a valid [`Call`]; see [`call`] for `target`.
#[unsafe(naked)]
unsafe extern "sysv64" fn trampoline(call: *mut Call) {
    core::arch::naked_asm!(
        "push rbx",
        "push rbp",
        "push r12",
        "push r13",
        "push r14",
        "push r15",
        "mov r15, rdi",
        "mov [r15 + {host_rsp}], rsp",
        "cmp qword ptr [r15 + {switch_fs}], 0",
        "je 2f",
        "mov eax, 158", // arch_prctl(ARCH_GET_FS, &saved_fs)
        "mov edi, 0x1003",
        "lea rsi, [r15 + {saved_fs}]",
        "syscall",
        "mov eax, 158", // arch_prctl(ARCH_SET_FS, fs)
        "mov edi, 0x1002",
        "mov rsi, [r15 + {fs}]",
        "syscall",
        "2:",
        "mov rax, [r15]",
        "mov rbx, [r15 + 8]",
        "mov rcx, [r15 + 16]",
        "mov rdx, [r15 + 24]",
        "mov rsi, [r15 + 32]",
        "mov rdi, [r15 + 40]",
        "mov rbp, [r15 + 48]",
        "mov r8, [r15 + 56]",
        "mov r9, [r15 + 64]",
        "mov r10, [r15 + 72]",
        "mov r11, [r15 + 80]",
        "mov r12, [r15 + 88]",
        "mov r13, [r15 + 96]",
        "mov r14, [r15 + 104]",
        "mov rsp, [r15 + {stack}]",
        "call qword ptr [r15 + {target}]",
        "mov [r15], rax",
        "mov [r15 + 8], rbx",
        "mov [r15 + 16], rcx",
        "mov [r15 + 24], rdx",
        "mov [r15 + 32], rsi",
        "mov [r15 + 40], rdi",
        "mov [r15 + 48], rbp",
        "mov [r15 + 56], r8",
        "mov [r15 + 64], r9",
        "mov [r15 + 72], r10",
        "mov [r15 + 80], r11",
        "mov [r15 + 88], r12",
        "mov [r15 + 96], r13",
        "mov [r15 + 104], r14",
        "mov rsp, [r15 + {host_rsp}]",
        "cmp qword ptr [r15 + {switch_fs}], 0",
        "je 3f",
        "mov eax, 158", // arch_prctl(ARCH_SET_FS, saved_fs)
        "mov edi, 0x1002",
        "mov rsi, [r15 + {saved_fs}]",
        "syscall",
        "3:",
        "pop r15",
        "pop r14",
        "pop r13",
        "pop r12",
        "pop rbp",
        "pop rbx",
        "ret",
        host_rsp = const offset_of!(Call, host_rsp),
        switch_fs = const offset_of!(Call, switch_fs),
        saved_fs = const offset_of!(Call, saved_fs),
        fs = const offset_of!(Call, fs),
        stack = const offset_of!(Call, stack),
        target = const offset_of!(Call, target),
    )
}

/// The thread's `fs:[0]` (its TCB self-pointer).
pub(super) fn fs0() -> u64 {
    let v: u64;
    // SAFETY: fs:[0] is the TCB self-pointer glibc sets up for every
    // thread; reading it has no side effects.
    unsafe { core::arch::asm!("mov {}, fs:[0]", out(reg) v, options(nostack, readonly)) };
    v
}

/// Calls `target` with `regs`, `rsp` = `stack` at the `call`, and the fs
/// base set to `fs` meanwhile if given; returns the registers after.
///
/// # Safety
///
/// `target` must be code that returns, touching no memory but the stack
/// below `stack` and memory the caller lets it write.
pub(super) unsafe fn call(target: u64, regs: Regs, stack: u64, fs: Option<u64>) -> Regs {
    let mut call = Call {
        regs,
        target,
        stack,
        host_rsp: 0,
        switch_fs: fs.is_some() as u64,
        fs: fs.unwrap_or(0),
        saved_fs: 0,
    };
    // SAFETY: the caller's contract for `target`; the trampoline saves and
    // restores every callee-saved register, rsp, and the fs base, and runs
    // no Rust code while fs is switched.
    unsafe { trampoline(&mut call) };
    call.regs
}
