//! Signal vocabulary of the injection: the kernel's `struct sigaction`
//! ([`KernelSigaction`]) and the signal sets blocked while we run code in
//! the target.

/// The kernel's `struct sigaction` on x86-64 (`rt_sigaction(2)`'s view,
/// not glibc's): handler, flags, restorer, a 64-bit mask.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelSigaction {
    /// Handler address, or `SIG_DFL` (0) / `SIG_IGN` (1).
    pub handler: u64,
    /// `SA_*` flags; [`SA_RESTORER`] is required on x86-64 with a handler.
    pub flags: u64,
    /// Where the handler returns to: code doing `rt_sigreturn` (`mov eax,
    /// 15; syscall`).
    pub restorer: u64,
    /// Signals blocked while the handler runs (bit `n - 1` is signal `n`).
    pub mask: u64,
}

/// `SA_RESTORER` (not exported by libc for glibc targets).
pub const SA_RESTORER: u64 = 0x0400_0000;

/// Signals whose delivery is asynchronous: all but SIGKILL/SIGSTOP (not
/// blockable) and the synchronous fault signals (blocking those and then
/// faulting resets the program's handler).
pub(super) const ASYNC_SIGNALS: u64 = !(bit(libc::SIGKILL)
    | bit(libc::SIGSTOP)
    | bit(libc::SIGSEGV)
    | bit(libc::SIGBUS)
    | bit(libc::SIGILL)
    | bit(libc::SIGFPE)
    | bit(libc::SIGTRAP)
    | bit(libc::SIGSYS));
pub(super) const ALL_SIGNALS: u64 = !(bit(libc::SIGKILL) | bit(libc::SIGSTOP));

pub(super) const fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
}
