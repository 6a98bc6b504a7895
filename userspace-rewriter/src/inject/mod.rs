//! Injecting into a live process with ptrace: the *apply* side's
//! primitive. It runs syscalls and calls functions in the target, reads
//! and writes its memory, and leaves the program exactly as it found it.
//! The program's own code is never modified.
//!
//! A typical injection (the caller's job, built on this module):
//! [`shadow_stack_enabled`] (refuse if so) → [`Tracee::attach`] →
//! [`find_gap_near`] the binary → [`Tracee::mmap`] a region there →
//! [`Tracee::write_memory`] the instrumented code → [`Tracee::mprotect`] it
//! to RX → [`free_signal`] + [`Tracee::rt_sigaction`] a handler →
//! [`Tracee::call`] libgcc's `__register_frame` → [`Tracee::detach`].
//!
//! ## Threads and the tracer
//!
//! ptrace ties a tracee to the *thread* that attached: every method must be
//! called from the thread that called [`Tracee::attach`] (calls from another
//! thread fail with `ESRCH`). [`Tracee`] is therefore neither `Send` nor
//! `Sync`. While a [`Tracee`] exists, every thread of the target is stopped;
//! syscalls and calls run on the *first thread* (the main thread unless it
//! has exited) while the others stay stopped.
//!
//! ## How a syscall is injected
//!
//! After attach each thread sits in a ptrace stop inside the kernel's signal
//! delivery path (`get_signal`), even when it was blocked in a syscall:
//! `PTRACE_INTERRUPT` made the syscall return `-ERESTARTSYS`,
//! `-ERESTART_RESTARTBLOCK`, ... and the saved `rax`/`orig_rax` still say
//! so. When the thread leaves that stop with those registers, the kernel
//! restarts the syscall exactly as after any ptrace interrupt. The few
//! calls the kernel does not restart after a stop (`epoll_wait`,
//! `sigtimedwait`, `semop`, `io_getevents`) return `EINTR` there instead;
//! attach rewinds those threads (`rax = orig_rax`, `rip -= 2`) so that the
//! call runs again, unless the thread has a signal of its own pending, so
//! the program never sees a failure that only our stop caused (the call's
//! timeout starts afresh). An injection therefore:
//!
//! 1. blocks every asynchronous signal (`PTRACE_SETSIGMASK`, restored after)
//!    so no signal is taken from the program meanwhile;
//! 2. sets the syscall's registers, `rip` at a `syscall` instruction (bytes
//!    `0f 05`) found in an executable mapping (the vDSO first, then any
//!    file mapping; cached) and `orig_rax = -1`, so the kernel does not
//!    "restart" the interrupted syscall into ours;
//! 3. resumes with `PTRACE_SYSCALL` to the syscall-entry stop, then to the
//!    syscall-exit stop, where `rax` is the result;
//! 4. `PTRACE_INTERRUPT` + `PTRACE_CONT`: the thread stops again inside
//!    `get_signal` (a `PTRACE_EVENT_STOP`), and
//! 5. gets its registers back there, so that the restart logic that runs
//!    after `get_signal` sees the program's own `rax`/`orig_rax`/`rip`.
//!
//! No single step is used: a single-step `SIGTRAP` is a forced signal, and
//! forcing a signal the program ignores or blocks resets its handler to
//! `SIG_DFL` (kernel `force_sig_info_to_task`).
//!
//! Step 5 is what makes an interrupted `nanosleep`, `read` or `futex` behave
//! exactly as before: the restart logic runs only after `get_signal`, and a
//! thread leaving a syscall-exit stop goes through `get_signal` only if a
//! signal wake-up is pending (`PTRACE_DETACH` happens to send one on 6.x;
//! settling into `get_signal` first does not depend on that). `orig_rax =
//! -1` in step 2 keeps the restart logic from touching our registers when the
//! thread leaves its attach stop.
//!
//! ## Signals
//!
//! Signals that arrive while the process is held stay pending (stopped
//! threads do not dequeue them; injections block them). A thread that was
//! already in a signal-delivery stop at attach keeps that signal and gets it
//! at detach (`PTRACE_DETACH` with the signal), unless we ran code on it: then
//! the signal (with its `siginfo`) is re-queued to that thread at detach with
//! `rt_tgsigqueueinfo` run *by that thread* (the kernel lets a thread queue
//! any `siginfo` to itself). The same happens to an asynchronous signal taken
//! during [`Tracee::call`] (e.g. a `kill -SEGV`) and a `SIGSTOP` (which cannot
//! be blocked) makes us stop the process again after detach.
//!
//! ## Caveats
//!
//! - [`Tracee::call`] runs the function with the other threads stopped: if
//!   it needs a lock another thread holds (malloc's arena lock, libgcc's
//!   object mutex, the dynamic loader's lock) it waits until the timeout
//!   (default 5 s, [`Tracee::set_call_timeout`]), and then the thread is put
//!   back but the function's partial effects remain.
//! - [`Tracee::call`] saves and restores the thread's general, FPU/SSE/AVX
//!   (`NT_X86_XSTATE`) registers and signal mask, but not memory: a function
//!   that changes `errno` (TLS) changes the interrupted code's `errno`.
//!   `__register_frame`/`__deregister_frame` do not set `errno`.
//! - A seccomp filter in the target applies to injected syscalls: attach
//!   reads each thread's filters (`PTRACE_SECCOMP_GET_FILTER`) and every
//!   injection first runs them on its exact call (`seccomp.rs`); a call they
//!   would not allow is not made ([`InjectError::SeccompRefuses`], naming
//!   the call). [`Tracee::check_syscall`] asks the same question up front.
//! - If burstyd dies between two steps of an injection, the kernel detaches
//!   the target with the registers of that moment. [`Tracee`]'s `Drop`
//!   covers errors and panics, not `SIGKILL`.
//!
//! ## Files
//!
//! - `ptrace.rs`: the raw ptrace and `waitpid` calls (registers, FPU/vector
//!   state, signal masks, siginfo, stops);
//! - `tracee.rs`: [`Tracee`] — seize and interrupt every thread, saved
//!   registers, memory through `/proc/PID/mem`, detach;
//! - `remote.rs`: syscalls and function calls run in the target
//!   ([`Tracee::syscall`], [`Tracee::mmap`], [`Tracee::call`], ...);
//! - `seccomp.rs`: the target's seccomp filters, run on our calls by a
//!   classic-BPF interpreter before we make them;
//! - `procfs.rs`: `/proc` queries ([`maps`] and its [`MapEntry`] lines,
//!   [`find_gap_near`], [`free_signal`], [`shadow_stack_enabled`], live
//!   threads, EPERM diagnosis);
//! - `error.rs`: [`InjectError`];
//! - `signals.rs`: [`KernelSigaction`] and the signal sets an injection
//!   blocks; `scratch.rs`: the scratch page's layout. These three are
//!   leaves the others import; this file only re-exports.

mod error;
pub mod hold;
mod procfs;
mod ptrace;
mod remote;
mod scratch;
mod seccomp;
mod signals;
mod tracee;

pub use burstyd_common::addr::Pid;
pub use error::InjectError;
pub use procfs::{
    MapEntry, find_gap_near, find_low_gap, free_signal, maps, parse_maps, shadow_stack_enabled,
};
pub use ptrace::reaped_status;
pub use signals::{KernelSigaction, SA_RESTORER};
pub use tracee::Tracee;
