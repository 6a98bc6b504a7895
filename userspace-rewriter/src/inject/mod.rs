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
//! restarts the syscall (or returns `EINTR`) exactly as after any ptrace
//! interrupt. An injection therefore:
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
//! - A seccomp filter in the target applies to injected syscalls (a filter
//!   that kills on `mmap` would kill the program).
//! - If burstyd dies between two steps of an injection, the kernel detaches
//!   the target with the registers of that moment. [`Tracee`]'s `Drop`
//!   covers errors and panics, not `SIGKILL`.

use std::ffi::c_void;
use std::fs::File;
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// Errors of attaching to and injecting into a process.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("no such process: {0}")]
    NoSuchProcess(i32),
    #[error("{pid} is a thread of process {tgid}, not a process id")]
    NotAProcess { pid: i32, tgid: i32 },
    #[error("process {0} is a zombie (it has exited and waits to be reaped)")]
    Zombie(i32),
    #[error(
        "process {pid} is already traced by process {tracer} (a debugger, strace, or another \
         burstyd); a process can have only one tracer"
    )]
    AlreadyTraced { pid: i32, tracer: i32 },
    #[error("not permitted to ptrace process {pid} (EPERM): {hint}")]
    NotPermitted { pid: i32, hint: String },
    #[error("cannot attach to our own process ({0})")]
    OwnProcess(i32),
    #[error("process {pid} ended while attached: {how}")]
    Exited { pid: i32, how: String },
    #[error("{call} on thread {tid}: {source}")]
    Ptrace {
        call: &'static str,
        tid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("syscall {nr} in process {pid} failed: {}", std::io::Error::from_raw_os_error(*.errno))]
    Syscall { pid: i32, nr: i64, errno: i32 },
    #[error("no `syscall` instruction (0f 05) in any executable mapping of process {0}")]
    NoSyscallInstruction(i32),
    #[error(
        "call of {func:#x} in process {pid} did not return within {timeout:?} (waiting for a \
         lock another, stopped, thread holds?); the thread was put back, but whatever the \
         function did so far stays done"
    )]
    CallTimeout {
        pid: i32,
        func: u64,
        timeout: Duration,
    },
    #[error(
        "call of {func:#x} in process {pid} faulted: signal {signal} at rip {rip:#x} (fault \
         address {addr:#x}); the thread was put back"
    )]
    CallFaulted {
        pid: i32,
        func: u64,
        signal: i32,
        rip: u64,
        addr: u64,
    },
    #[error("{0} arguments given; at most 6 are supported")]
    TooManyArguments(usize),
    #[error("mmap in process {pid} asked for {wanted:#x} and got {got:#x}")]
    MmapMoved { pid: i32, wanted: u64, got: u64 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error(
        "no free gap of {len:#x} bytes within ±2 GiB of every byte of [{lo:#x}, {hi:#x}) in \
         process {pid}"
    )]
    NoGap {
        pid: i32,
        lo: u64,
        hi: u64,
        len: u64,
    },
    #[error(
        "process {0} catches, ignores, blocks or has pending every signal from SIGRTMIN+2 (34) \
         to SIGRTMAX (64)"
    )]
    NoFreeSignal(i32),
    #[error("thread {tid}: unexpected {what}")]
    Unexpected { tid: i32, what: String },
    #[error("cannot parse {what}: {text:?}")]
    Parse { what: String, text: String },
}

type Result<T, E = InjectError> = std::result::Result<T, E>;

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

const PAGE: u64 = 4096;
const RED_ZONE: u64 = 128;
const TWO_GIB: u64 = 1 << 31;
/// User address space top on x86-64 with 4-level paging (and the default
/// for mmap with 5-level paging).
const USER_TOP: u64 = 0x7fff_ffff_f000;
/// `NT_X86_XSTATE`: the XSAVE area (x87, SSE, AVX, AVX-512, ...).
const NT_X86_XSTATE: usize = 0x202;
/// `NT_PRFPREG`: the FXSAVE area, for CPUs without XSAVE.
const NT_PRFPREG: usize = 2;
const SYSCALL_STOP: i32 = libc::SIGTRAP | 0x80;

/// Signals whose delivery is asynchronous: all but SIGKILL/SIGSTOP (not
/// blockable) and the synchronous fault signals (blocking those and then
/// faulting resets the program's handler).
const ASYNC_SIGNALS: u64 = !(bit(libc::SIGKILL)
    | bit(libc::SIGSTOP)
    | bit(libc::SIGSEGV)
    | bit(libc::SIGBUS)
    | bit(libc::SIGILL)
    | bit(libc::SIGFPE)
    | bit(libc::SIGTRAP)
    | bit(libc::SIGSYS));
const ALL_SIGNALS: u64 = !(bit(libc::SIGKILL) | bit(libc::SIGSTOP));

const fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

/// Offsets in the scratch page.
const SCRATCH_LEN: u64 = PAGE;
const SCR_SIGACTION_NEW: u64 = 0;
const SCR_SIGACTION_OLD: u64 = 64;
const SCR_SIGINFO: u64 = 128;
const SCR_NAME: u64 = 512;
const MAX_NAME: usize = 249; // memfd_create's limit, without the NUL

/// A signal taken from a thread that must be given back at detach.
struct Pending {
    tid: i32,
    signo: i32,
    /// The kernel's `siginfo_t` as PTRACE_GETSIGINFO returned it.
    info: [u8; 128],
}

struct Thread {
    tid: i32,
    /// Registers restored at detach.
    saved: libc::user_regs_struct,
    /// The thread was in a signal-delivery stop for this signal at attach
    /// and has not been resumed since: `PTRACE_DETACH` passes it on.
    attach_signal: Option<Pending>,
}

/// What one `waitpid` reported for a tracee.
enum Wait {
    /// The thread (or the whole process) ended.
    Exited(String),
    /// `PTRACE_EVENT_STOP`: after `PTRACE_INTERRUPT`, or a group stop.
    EventStop,
    /// Another ptrace event (none is enabled; handled for robustness).
    Event,
    /// A syscall-entry or syscall-exit stop.
    Syscall,
    /// A signal-delivery stop.
    Signal(i32),
}

/// Saved FPU/vector state of one thread.
struct FpState {
    note: usize,
    data: Vec<u8>,
}

/// A stopped process: every thread held in a ptrace stop, registers saved.
///
/// Created by [`Tracee::attach`]; [`Tracee::detach`] (or `Drop`, best
/// effort) restores every thread's registers and lets the process go. Use
/// it only from the thread that attached (see the module docs).
pub struct Tracee {
    pid: i32,
    /// Thread ids, the first thread first.
    tids: Vec<i32>,
    threads: Vec<Thread>,
    mem: File,
    /// Address of a `syscall` instruction.
    gadget: Option<u64>,
    /// A page of ours in the target for syscall arguments.
    scratch: Option<u64>,
    requeue: Vec<Pending>,
    /// A SIGSTOP was taken from the program: stop it again after detach.
    stop_after: bool,
    call_timeout: Duration,
    detached: bool,
    /// ptrace is per tracer thread: not Send, not Sync.
    _not_send: PhantomData<*const ()>,
}

impl Tracee {
    /// Attach to every thread of process `pid` and stop them.
    ///
    /// `PTRACE_SEIZE` + `PTRACE_INTERRUPT` each thread listed in
    /// `/proc/PID/task` and wait (`waitpid(__WALL)`) for its stop; the list
    /// is re-read until no new thread appears (a thread created meanwhile by
    /// a not yet stopped thread is caught too; once all are stopped none can
    /// be created). Exited (zombie) threads are skipped. Each thread's
    /// registers are saved. On error, the threads already stopped are let
    /// go.
    ///
    /// Errors: [`InjectError::NoSuchProcess`], [`InjectError::Zombie`],
    /// [`InjectError::AlreadyTraced`] (another debugger),
    /// [`InjectError::NotPermitted`] (EPERM: needs `CAP_SYS_PTRACE` or the
    /// same user, and `kernel.yama.ptrace_scope` must allow it),
    /// [`InjectError::OwnProcess`], [`InjectError::NotAProcess`].
    pub fn attach(pid: i32) -> Result<Tracee> {
        if pid <= 0 {
            return Err(InjectError::NoSuchProcess(pid));
        }
        // SAFETY: getpid has no preconditions.
        if pid == unsafe { libc::getpid() } {
            return Err(InjectError::OwnProcess(pid));
        }
        let status = read_proc(pid, "status")?;
        let tgid = status_field(&status, "Tgid").and_then(|v| v.parse::<i32>().ok());
        if let Some(tgid) = tgid
            && tgid != pid
        {
            return Err(InjectError::NotAProcess { pid, tgid });
        }
        if let Some(tracer) = status_field(&status, "TracerPid").and_then(|v| v.parse().ok())
            && tracer != 0
        {
            return Err(InjectError::AlreadyTraced { pid, tracer });
        }

        let mut threads: Vec<Thread> = Vec::new();
        let result = seize_all(pid, &mut threads);
        if let Err(e) = result {
            release(&threads);
            return Err(e);
        }
        if threads.is_empty() {
            return Err(if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                InjectError::Zombie(pid)
            } else {
                InjectError::NoSuchProcess(pid)
            });
        }
        // The main thread first, then by tid.
        threads.sort_by_key(|t| (t.tid != pid, t.tid));
        let mem = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
        {
            Ok(f) => f,
            Err(e) => {
                release(&threads);
                return Err(InjectError::Io {
                    what: format!("opening /proc/{pid}/mem"),
                    source: e,
                });
            }
        };
        Ok(Tracee {
            pid,
            tids: threads.iter().map(|t| t.tid).collect(),
            threads,
            mem,
            gadget: None,
            scratch: None,
            requeue: Vec::new(),
            stop_after: false,
            call_timeout: Duration::from_secs(5),
            detached: false,
            _not_send: PhantomData,
        })
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The stopped threads, the first thread (where syscalls and calls run:
    /// the main thread unless it has exited) first.
    pub fn threads(&self) -> &[i32] {
        &self.tids
    }

    /// The saved registers of thread `tid`: as the thread stopped, or as set
    /// by [`Tracee::set_saved_regs`]. These are restored at detach.
    ///
    /// For a thread stopped inside a blocking syscall, `orig_rax` is the
    /// syscall number and `rax` a negative `-ERESTART*` code (e.g. -516 for
    /// `nanosleep`, -512 for `read`).
    ///
    /// # Panics
    /// If `tid` is not one of [`Tracee::threads`].
    pub fn regs(&self, tid: i32) -> &libc::user_regs_struct {
        &self.threads[self.index(tid)].saved
    }

    /// Set the registers thread `tid` gets back at detach (e.g. a redirected
    /// `rip`). Injections in between do not change them. To leave a thread
    /// stopped in a syscall elsewhere without restarting the syscall, set
    /// `orig_rax` to `u64::MAX` (-1).
    ///
    /// # Panics
    /// If `tid` is not one of [`Tracee::threads`].
    pub fn set_saved_regs(&mut self, tid: i32, regs: libc::user_regs_struct) {
        let i = self.index(tid);
        self.threads[i].saved = regs;
    }

    /// How long [`Tracee::call`] waits for the function to return (5 s by
    /// default).
    pub fn set_call_timeout(&mut self, timeout: Duration) {
        self.call_timeout = timeout;
    }

    /// Execute syscall `nr` with up to six arguments in the first thread and
    /// return its raw result (`rax`); a result in `-4095..=-1` is returned as
    /// [`InjectError::Syscall`] with that errno. The thread's registers are
    /// put back afterwards (see the module docs for why this is exact even
    /// when the thread was blocked in a syscall).
    pub fn syscall(&mut self, nr: i64, args: &[u64]) -> Result<u64> {
        self.inject(0, nr, args)
    }

    /// `mmap(addr, len, prot, flags, fd, off)` in the target. When `addr` is
    /// not 0 and `flags` has neither `MAP_FIXED` nor `MAP_FIXED_NOREPLACE`,
    /// `MAP_FIXED_NOREPLACE` is added (never replaces an existing mapping:
    /// `EEXIST` instead) and a result other than `addr` is an error.
    pub fn mmap(
        &mut self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        fd: i32,
        off: u64,
    ) -> Result<u64> {
        let mut flags = flags;
        if addr != 0 && flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) == 0 {
            flags |= libc::MAP_FIXED_NOREPLACE;
        }
        let got = self.syscall(
            libc::SYS_mmap,
            &[
                addr,
                len,
                prot as u32 as u64,
                flags as u32 as u64,
                fd as i64 as u64,
                off,
            ],
        )?;
        if addr != 0 && got != addr {
            let _ = self.munmap(got, len);
            return Err(InjectError::MmapMoved {
                pid: self.pid,
                wanted: addr,
                got,
            });
        }
        Ok(got)
    }

    /// `munmap(addr, len)` in the target.
    pub fn munmap(&mut self, addr: u64, len: u64) -> Result<()> {
        self.syscall(libc::SYS_munmap, &[addr, len]).map(drop)
    }

    /// `mprotect(addr, len, prot)` in the target.
    pub fn mprotect(&mut self, addr: u64, len: u64, prot: i32) -> Result<()> {
        self.syscall(libc::SYS_mprotect, &[addr, len, prot as u32 as u64])
            .map(drop)
    }

    /// `memfd_create(name, flags)` in the target (e.g. `libc::MFD_CLOEXEC`);
    /// returns the file descriptor *in the target*. The tracer can open it
    /// as `/proc/PID/fd/N`.
    pub fn memfd_create(&mut self, name: &str, flags: u32) -> Result<i32> {
        if name.len() > MAX_NAME || name.contains('\0') {
            return Err(InjectError::InvalidArgument(format!(
                "memfd name {name:?}: at most {MAX_NAME} bytes, no NUL"
            )));
        }
        let scratch = self.scratch()?;
        let mut bytes = name.as_bytes().to_vec();
        bytes.push(0);
        self.write_memory(scratch + SCR_NAME, &bytes)?;
        let fd = self.syscall(
            libc::SYS_memfd_create,
            &[scratch + SCR_NAME, u64::from(flags)],
        )?;
        Ok(fd as i32)
    }

    /// `close(fd)` in the target.
    pub fn close(&mut self, fd: i32) -> Result<()> {
        self.syscall(libc::SYS_close, &[fd as i64 as u64]).map(drop)
    }

    /// `rt_sigaction(sig, new, &old)` in the target: install `new` (or, with
    /// `None`, only query) and return the previous action.
    pub fn rt_sigaction(
        &mut self,
        sig: i32,
        new: Option<&KernelSigaction>,
    ) -> Result<KernelSigaction> {
        let scratch = self.scratch()?;
        let new_ptr = match new {
            Some(act) => {
                self.write_memory(scratch + SCR_SIGACTION_NEW, &sigaction_bytes(act))?;
                scratch + SCR_SIGACTION_NEW
            }
            None => 0,
        };
        self.syscall(
            libc::SYS_rt_sigaction,
            &[sig as u64, new_ptr, scratch + SCR_SIGACTION_OLD, 8],
        )?;
        let b = self.read_memory(scratch + SCR_SIGACTION_OLD, 32)?;
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Ok(KernelSigaction {
            handler: w(0),
            flags: w(1),
            restorer: w(2),
            mask: w(3),
        })
    }

    /// Call the function at `func` in the first thread with up to six
    /// integer arguments (System V ABI) and return its `rax`.
    ///
    /// The call runs on the thread's own stack, 16-byte aligned below the
    /// red zone, with a `syscall` instruction as return address: its
    /// syscall-entry stop (at that address, with the stack pointer just
    /// above the return slot) is the return, where `orig_rax` holds the
    /// function's `rax`; the syscall is then cancelled. The thread runs
    /// with `PTRACE_SYSCALL` (the function's own syscalls stop twice each and
    /// are let through) and with asynchronous signals blocked; the other
    /// threads stay stopped. General, FPU/vector registers and the signal
    /// mask are restored afterwards.
    ///
    /// Errors: [`InjectError::CallTimeout`] after the timeout
    /// ([`Tracee::set_call_timeout`]), [`InjectError::CallFaulted`] if the
    /// function faults. In both cases the thread is put back as it was.
    pub fn call(&mut self, func: u64, args: &[u64]) -> Result<u64> {
        if args.len() > 6 {
            return Err(InjectError::TooManyArguments(args.len()));
        }
        let gadget = self.gadget()?;
        self.take_attach_signal(0);
        let tid = self.tids[0];
        let live = get_regs(tid)?;
        let fp = get_fp(tid)?;
        let old_mask = get_sigmask(tid)?;
        set_sigmask(tid, ASYNC_SIGNALS)?;
        let result = self.call_inner(tid, func, args, gadget, &live);
        let restored = set_regs(tid, &live)
            .and_then(|()| set_fp(tid, &fp))
            .and_then(|()| set_sigmask(tid, old_mask));
        let value = result?;
        restored?;
        Ok(value)
    }

    fn call_inner(
        &mut self,
        tid: i32,
        func: u64,
        args: &[u64],
        gadget: u64,
        live: &libc::user_regs_struct,
    ) -> Result<u64> {
        let slot = (live.rsp.wrapping_sub(RED_ZONE) & !15) - 8;
        self.write_memory(slot, &gadget.to_le_bytes())?;
        let mut r = *live;
        set_args(&mut r, args);
        r.rsp = slot;
        r.rip = func;
        r.rax = 0;
        r.orig_rax = u64::MAX;
        r.eflags &= !(0x100 | 0x400); // TF, DF (the ABI wants DF clear)
        set_regs(tid, &r)?;
        let return_rsp = slot + 8;
        resume(libc::PTRACE_SYSCALL, tid, 0)?;
        let deadline = Instant::now() + self.call_timeout;
        let mut entering = true;
        let mut nap = Duration::from_micros(50);
        loop {
            let Some(w) = wait_tid(tid, true)? else {
                if Instant::now() >= deadline {
                    self.stop_running(tid)?;
                    return Err(InjectError::CallTimeout {
                        pid: self.pid,
                        func,
                        timeout: self.call_timeout,
                    });
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(2));
                continue;
            };
            match w {
                Wait::Syscall => {
                    let r = get_regs(tid)?;
                    if entering && r.rip == gadget + 2 && r.rsp == return_rsp {
                        // The function returned into our `syscall`: its
                        // result is the "syscall number". Cancel it and
                        // bring the thread back into get_signal.
                        let mut s = r;
                        s.orig_rax = u64::MAX;
                        set_regs(tid, &s)?;
                        self.settle(tid)?;
                        return Ok(r.orig_rax);
                    }
                    entering = !entering;
                    resume(libc::PTRACE_SYSCALL, tid, 0)?;
                }
                Wait::Signal(sig) => {
                    let info = get_siginfo(tid)?;
                    if is_fault(sig, &info) {
                        // The thread is in get_signal; the fault is
                        // dropped when the registers are put back.
                        let r = get_regs(tid)?;
                        return Err(InjectError::CallFaulted {
                            pid: self.pid,
                            func,
                            signal: sig,
                            rip: r.rip,
                            addr: u64::from_le_bytes(info[16..24].try_into().unwrap()),
                        });
                    }
                    self.take_signal(tid, sig, info);
                    resume(libc::PTRACE_SYSCALL, tid, 0)?;
                }
                Wait::EventStop | Wait::Event => resume(libc::PTRACE_SYSCALL, tid, 0)?,
                Wait::Exited(how) => return Err(self.exited(how)),
            }
        }
    }

    /// Read `len` bytes of target memory at `addr` (`/proc/PID/mem`: works
    /// on any mapped page, whatever its protection).
    pub fn read_memory(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.mem
            .read_exact_at(&mut buf, addr)
            .map_err(|e| InjectError::Io {
                what: format!("reading {len} bytes at {addr:#x} in process {}", self.pid),
                source: e,
            })?;
        Ok(buf)
    }

    /// Write `data` to target memory at `addr` (`/proc/PID/mem`: works on
    /// read-only and executable private pages too, like a debugger's
    /// breakpoint write).
    pub fn write_memory(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.mem
            .write_all_at(data, addr)
            .map_err(|e| InjectError::Io {
                what: format!(
                    "writing {} bytes at {addr:#x} in process {}",
                    data.len(),
                    self.pid
                ),
                source: e,
            })
    }

    /// Give back any signal taken from the program, unmap our scratch page,
    /// restore every thread's saved registers (as possibly changed by
    /// [`Tracee::set_saved_regs`]) and `PTRACE_DETACH` every thread. A thread
    /// that was in a signal-delivery stop at attach (and was not used since)
    /// gets that signal with the detach. Also done, best effort, on `Drop`.
    pub fn detach(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if self.detached {
            return Ok(());
        }
        self.detached = true;
        let mut first_err: Option<InjectError> = None;
        let note = |r: Result<()>, first_err: &mut Option<InjectError>| {
            if let Err(e) = r
                && first_err.is_none()
            {
                *first_err = Some(e);
            }
        };
        // 1. Re-queue taken signals, each thread with every signal blocked
        //    so that none is taken again; the masks go back after the
        //    scratch page is gone (the last injection).
        let mut masks: Vec<(i32, u64)> = Vec::new();
        if !self.requeue.is_empty() {
            let r = self.requeue_signals(&mut masks);
            note(r, &mut first_err);
        }
        // 2. Our scratch page.
        if let Some(s) = self.scratch.take() {
            let r = self
                .inject(0, libc::SYS_munmap, &[s, SCRATCH_LEN])
                .map(drop);
            note(r, &mut first_err);
        }
        for (tid, mask) in masks {
            note(set_sigmask(tid, mask), &mut first_err);
        }
        // 3. Registers back, detach.
        for t in &self.threads {
            note(set_regs(t.tid, &t.saved), &mut first_err);
            let sig = t.attach_signal.as_ref().map_or(0, |p| p.signo);
            note(
                ptrace(libc::PTRACE_DETACH, t.tid, 0, sig as usize, "PTRACE_DETACH").map(drop),
                &mut first_err,
            );
        }
        if self.stop_after {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(self.pid, libc::SIGSTOP) };
        }
        first_err.map_or(Ok(()), Err)
    }

    fn requeue_signals(&mut self, masks: &mut Vec<(i32, u64)>) -> Result<()> {
        let scratch = self.scratch()?;
        let mut first_err = None;
        while let Some(p) = self.requeue.first() {
            let tid = p.tid;
            let Some(i) = self.tids.iter().position(|&t| t == tid) else {
                self.requeue.remove(0);
                continue;
            };
            if !masks.iter().any(|m| m.0 == tid) {
                masks.push((tid, get_sigmask(tid)?));
                set_sigmask(tid, ALL_SIGNALS)?;
            }
            let mine: Vec<Pending> = {
                let (mine, rest) = std::mem::take(&mut self.requeue)
                    .into_iter()
                    .partition(|p| p.tid == tid);
                self.requeue = rest;
                mine
            };
            for p in mine {
                let r = self
                    .write_memory(scratch + SCR_SIGINFO, &p.info)
                    .and_then(|()| {
                        self.inject(
                            i,
                            libc::SYS_rt_tgsigqueueinfo,
                            &[
                                self.pid as u64,
                                tid as u64,
                                p.signo as u64,
                                scratch + SCR_SIGINFO,
                            ],
                        )
                    });
                if let Err(e) = r {
                    // Fall back to a plain signal (its siginfo then says
                    // it came from us).
                    // SAFETY: tgkill has no memory preconditions.
                    unsafe { libc::tgkill(self.pid, tid, p.signo) };
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn index(&self, tid: i32) -> usize {
        self.tids
            .iter()
            .position(|&t| t == tid)
            .unwrap_or_else(|| panic!("thread {tid} is not a stopped thread of {}", self.pid))
    }

    fn exited(&self, how: String) -> InjectError {
        InjectError::Exited { pid: self.pid, how }
    }

    /// A thread that is resumed loses the signal of its attach stop: keep it
    /// for re-queueing.
    fn take_attach_signal(&mut self, i: usize) {
        if let Some(p) = self.threads[i].attach_signal.take() {
            self.requeue.push(p);
        }
    }

    fn take_signal(&mut self, tid: i32, signo: i32, info: [u8; 128]) {
        if signo == libc::SIGSTOP {
            self.stop_after = true;
        } else {
            self.requeue.push(Pending { tid, signo, info });
        }
    }

    /// The address of a `syscall` instruction in the target (cached;
    /// checked before each use).
    fn gadget(&mut self) -> Result<u64> {
        if let Some(g) = self.gadget
            && self.read_memory(g, 2).is_ok_and(|b| b == [0x0f, 0x05])
        {
            return Ok(g);
        }
        let maps = maps(self.pid)?;
        let mut order: Vec<&Mapping> = maps
            .iter()
            .filter(|m| m.perms.contains('x') && m.path != "[vsyscall]")
            .collect();
        // The vDSO first (always there, never unmapped), then libraries.
        order.sort_by_key(|m| (m.path != "[vdso]", !m.path.starts_with('/')));
        for m in order {
            let len = (m.end - m.start).min(64 << 20) as usize;
            let Ok(bytes) = self.read_memory(m.start, len) else {
                continue;
            };
            if let Some(i) = bytes.windows(2).position(|w| w == [0x0f, 0x05]) {
                self.gadget = Some(m.start + i as u64);
                return Ok(m.start + i as u64);
            }
        }
        Err(InjectError::NoSyscallInstruction(self.pid))
    }

    /// Our page for syscall arguments, mapped on first use.
    fn scratch(&mut self) -> Result<u64> {
        if let Some(s) = self.scratch {
            return Ok(s);
        }
        let s = self.inject(
            0,
            libc::SYS_mmap,
            &[
                0,
                SCRATCH_LEN,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        )?;
        self.scratch = Some(s);
        Ok(s)
    }

    /// Run one syscall on thread `i` (see the module docs).
    fn inject(&mut self, i: usize, nr: i64, args: &[u64]) -> Result<u64> {
        if args.len() > 6 {
            return Err(InjectError::TooManyArguments(args.len()));
        }
        let gadget = self.gadget()?;
        self.take_attach_signal(i);
        let tid = self.tids[i];
        let live = get_regs(tid)?;
        let old_mask = get_sigmask(tid)?;
        set_sigmask(tid, old_mask | ASYNC_SIGNALS)?;
        let mut result = Err(InjectError::Unexpected {
            tid,
            what: "no attempt".into(),
        });
        // A syscall interrupted by a signal (-ERESTART*; ours do not block,
        // but to be safe) is simply run again.
        for _ in 0..16 {
            result = self.run_syscall(tid, gadget, nr, args, &live);
            match result {
                Ok(v) if (-516..=-512).contains(&(v as i64)) => continue,
                _ => break,
            }
        }
        let restored = set_regs(tid, &live).and_then(|()| set_sigmask(tid, old_mask));
        let v = result?;
        restored?;
        if (-4095..0).contains(&(v as i64)) {
            return Err(InjectError::Syscall {
                pid: self.pid,
                nr,
                errno: -(v as i64) as i32,
            });
        }
        Ok(v)
    }

    /// One attempt: registers set, entry stop, exit stop, settle. Returns
    /// `rax` at the exit stop.
    fn run_syscall(
        &mut self,
        tid: i32,
        gadget: u64,
        nr: i64,
        args: &[u64],
        live: &libc::user_regs_struct,
    ) -> Result<u64> {
        let mut r = *live;
        set_args(&mut r, args);
        r.rax = nr as u64;
        r.orig_rax = u64::MAX;
        r.rip = gadget;
        set_regs(tid, &r)?;
        resume(libc::PTRACE_SYSCALL, tid, 0)?;
        let mut entered = false;
        loop {
            match wait_tid(tid, false)?.expect("blocking wait") {
                Wait::Syscall => {
                    let r = get_regs(tid)?;
                    if !entered {
                        if r.rip != gadget + 2 || r.orig_rax != nr as u64 {
                            return Err(InjectError::Unexpected {
                                tid,
                                what: format!(
                                    "syscall entry at {:#x} (nr {}) instead of {:#x} (nr {nr})",
                                    r.rip,
                                    r.orig_rax as i64,
                                    gadget + 2
                                ),
                            });
                        }
                        entered = true;
                        resume(libc::PTRACE_SYSCALL, tid, 0)?;
                    } else {
                        self.settle(tid)?;
                        return Ok(r.rax);
                    }
                }
                Wait::Signal(sig) => {
                    // Before the syscall ran (only SIGSTOP or a signal a
                    // fault forced can get through the mask).
                    let info = get_siginfo(tid)?;
                    if is_fault(sig, &info) {
                        return Err(InjectError::Unexpected {
                            tid,
                            what: format!("signal {sig} while entering an injected syscall"),
                        });
                    }
                    self.take_signal(tid, sig, info);
                    resume(libc::PTRACE_SYSCALL, tid, 0)?;
                }
                Wait::EventStop | Wait::Event => resume(libc::PTRACE_SYSCALL, tid, 0)?,
                Wait::Exited(how) => return Err(self.exited(how)),
            }
        }
    }

    /// From a syscall stop, bring the thread into a stop inside
    /// `get_signal`: `PTRACE_INTERRUPT`, `PTRACE_CONT`, wait.
    fn settle(&mut self, tid: i32) -> Result<()> {
        ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0, "PTRACE_INTERRUPT")?;
        resume(libc::PTRACE_CONT, tid, 0)?;
        loop {
            match wait_tid(tid, false)?.expect("blocking wait") {
                Wait::EventStop => return Ok(()),
                Wait::Signal(sig) => {
                    // Also a stop in get_signal; the interrupt is consumed.
                    let info = get_siginfo(tid)?;
                    self.take_signal(tid, sig, info);
                    return Ok(());
                }
                Wait::Syscall | Wait::Event => resume(libc::PTRACE_CONT, tid, 0)?,
                Wait::Exited(how) => return Err(self.exited(how)),
            }
        }
    }

    /// Stop a running thread (call timeout) in get_signal.
    fn stop_running(&mut self, tid: i32) -> Result<()> {
        ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0, "PTRACE_INTERRUPT")?;
        loop {
            match wait_tid(tid, false)?.expect("blocking wait") {
                Wait::EventStop => return Ok(()),
                Wait::Signal(sig) => {
                    let info = get_siginfo(tid)?;
                    if !is_fault(sig, &info) {
                        self.take_signal(tid, sig, info);
                    }
                    return Ok(());
                }
                Wait::Syscall => {
                    // Cancel a syscall being entered (harmless at exit).
                    let mut r = get_regs(tid)?;
                    r.orig_rax = u64::MAX;
                    set_regs(tid, &r)?;
                    return self.settle(tid);
                }
                Wait::Event => resume(libc::PTRACE_CONT, tid, 0)?,
                Wait::Exited(how) => return Err(self.exited(how)),
            }
        }
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Seize, interrupt and wait for every live thread of `pid`, re-reading the
/// task list until it is stable.
fn seize_all(pid: i32, threads: &mut Vec<Thread>) -> Result<()> {
    let mut gone: Vec<i32> = Vec::new();
    loop {
        let tids = live_tasks(pid)?;
        let new: Vec<i32> = tids
            .into_iter()
            .filter(|t| !gone.contains(t) && !threads.iter().any(|x| x.tid == *t))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        for tid in new {
            // SAFETY: PTRACE_SEIZE takes plain values.
            let r = unsafe {
                libc::ptrace(
                    libc::PTRACE_SEIZE,
                    tid,
                    std::ptr::null_mut::<c_void>(),
                    libc::PTRACE_O_TRACESYSGOOD as usize as *mut c_void,
                )
            };
            if r == -1 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::ESRCH) => {
                        gone.push(tid);
                        continue;
                    }
                    Some(libc::EPERM) => return Err(diagnose_eperm(pid, tid)),
                    _ => {
                        return Err(InjectError::Ptrace {
                            call: "PTRACE_SEIZE",
                            tid,
                            source: e,
                        });
                    }
                }
            }
            if let Err(e) = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0, "PTRACE_INTERRUPT") {
                // Seized but not stopped: it cannot be detached; it dies or
                // stops soon. Wait for it so that release() can detach it.
                let _ = wait_tid(tid, false);
                threads.push(Thread {
                    tid,
                    saved: get_regs(tid).unwrap_or(unsafe { std::mem::zeroed() }),
                    attach_signal: None,
                });
                return Err(e);
            }
            // The first trap of any kind after PTRACE_INTERRUPT is the stop
            // (the kernel clears the pending interrupt on any trap).
            let attach_signal = match wait_tid(tid, false)?.expect("blocking wait") {
                Wait::EventStop | Wait::Event | Wait::Syscall => None,
                Wait::Signal(sig) => Some(Pending {
                    tid,
                    signo: sig,
                    info: get_siginfo(tid)?,
                }),
                Wait::Exited(_) => {
                    gone.push(tid);
                    continue;
                }
            };
            threads.push(Thread {
                tid,
                saved: get_regs(tid)?,
                attach_signal,
            });
        }
    }
}

/// Let stopped threads go after a failed attach.
fn release(threads: &[Thread]) {
    for t in threads {
        let sig = t.attach_signal.as_ref().map_or(0, |p| p.signo);
        let _ = ptrace(libc::PTRACE_DETACH, t.tid, 0, sig as usize, "PTRACE_DETACH");
    }
}

fn diagnose_eperm(pid: i32, tid: i32) -> InjectError {
    let Ok(status) = read_proc(pid, "status") else {
        return InjectError::NoSuchProcess(pid);
    };
    let tstatus = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .unwrap_or_else(|_| status.clone());
    if let Some(tracer) = status_field(&tstatus, "TracerPid").and_then(|v| v.parse::<i32>().ok())
        && tracer != 0
    {
        return InjectError::AlreadyTraced { pid, tracer };
    }
    let state = status_field(&status, "State").unwrap_or_default();
    if state.starts_with('Z') || state.starts_with('X') {
        return InjectError::Zombie(pid);
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "absent (no Yama)".into());
    let uid = status_field(&status, "Uid").unwrap_or_default();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    InjectError::NotPermitted {
        pid,
        hint: format!(
            "ptrace needs CAP_SYS_PTRACE, or the same user as the target (we run as euid \
             {euid}; the target's uids are {uid}) and a dumpable target; \
             kernel.yama.ptrace_scope is {scope} (0: same user may attach, 1: only \
             descendants unless CAP_SYS_PTRACE, 2: only CAP_SYS_PTRACE, 3: nobody)"
        ),
    }
}

/// Thread ids in /proc/PID/task whose state is not zombie/dead.
fn live_tasks(pid: i32) -> Result<Vec<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            InjectError::NoSuchProcess(pid)
        } else {
            InjectError::Io {
                what: format!("reading /proc/{pid}/task"),
                source: e,
            }
        }
    })?;
    let mut tids = Vec::new();
    for entry in dir.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else {
            continue; // exited meanwhile
        };
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if matches!(state, Some('Z' | 'X' | 'x') | None) {
            continue;
        }
        tids.push(tid);
    }
    tids.sort_unstable();
    Ok(tids)
}

fn read_proc(pid: i32, file: &str) -> Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) {
            InjectError::NoSuchProcess(pid)
        } else {
            InjectError::Io {
                what: format!("reading /proc/{pid}/{file}"),
                source: e,
            }
        }
    })
}

/// The value of `Key:` in a /proc status file.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.trim())
    })
}

fn ptrace(
    req: libc::c_uint,
    tid: i32,
    addr: usize,
    data: usize,
    call: &'static str,
) -> Result<i64> {
    // SAFETY: the callers pass plain values, or pointers to live memory of
    // the size the request expects.
    let r = unsafe { libc::ptrace(req, tid, addr as *mut c_void, data as *mut c_void) };
    if r == -1 {
        return Err(InjectError::Ptrace {
            call,
            tid,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(r)
}

fn resume(req: libc::c_uint, tid: i32, sig: i32) -> Result<()> {
    let name = if req == libc::PTRACE_SYSCALL {
        "PTRACE_SYSCALL"
    } else {
        "PTRACE_CONT"
    };
    ptrace(req, tid, 0, sig as usize, name).map(drop)
}

fn get_regs(tid: i32) -> Result<libc::user_regs_struct> {
    // SAFETY: user_regs_struct is plain old data.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    ptrace(
        libc::PTRACE_GETREGS,
        tid,
        0,
        &mut regs as *mut _ as usize,
        "PTRACE_GETREGS",
    )?;
    Ok(regs)
}

fn set_regs(tid: i32, regs: &libc::user_regs_struct) -> Result<()> {
    ptrace(
        libc::PTRACE_SETREGS,
        tid,
        0,
        regs as *const _ as usize,
        "PTRACE_SETREGS",
    )
    .map(drop)
}

fn get_siginfo(tid: i32) -> Result<[u8; 128]> {
    let mut info = [0u8; 128];
    ptrace(
        libc::PTRACE_GETSIGINFO,
        tid,
        0,
        info.as_mut_ptr() as usize,
        "PTRACE_GETSIGINFO",
    )?;
    Ok(info)
}

fn get_sigmask(tid: i32) -> Result<u64> {
    let mut mask = 0u64;
    ptrace(
        libc::PTRACE_GETSIGMASK,
        tid,
        8,
        &mut mask as *mut u64 as usize,
        "PTRACE_GETSIGMASK",
    )?;
    Ok(mask)
}

fn set_sigmask(tid: i32, mask: u64) -> Result<()> {
    ptrace(
        libc::PTRACE_SETSIGMASK,
        tid,
        8,
        &mask as *const u64 as usize,
        "PTRACE_SETSIGMASK",
    )
    .map(drop)
}

fn get_fp(tid: i32) -> Result<FpState> {
    let mut last = None;
    for note in [NT_X86_XSTATE, NT_PRFPREG] {
        let mut data = vec![0u8; 64 << 10];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr() as *mut c_void,
            iov_len: data.len(),
        };
        match ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            note,
            &mut iov as *mut libc::iovec as usize,
            "PTRACE_GETREGSET",
        ) {
            Ok(_) => {
                data.truncate(iov.iov_len);
                return Ok(FpState { note, data });
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried"))
}

fn set_fp(tid: i32, fp: &FpState) -> Result<()> {
    let mut iov = libc::iovec {
        iov_base: fp.data.as_ptr() as *mut c_void,
        iov_len: fp.data.len(),
    };
    ptrace(
        libc::PTRACE_SETREGSET,
        tid,
        fp.note,
        &mut iov as *mut libc::iovec as usize,
        "PTRACE_SETREGSET",
    )
    .map(drop)
}

/// System V integer argument registers (and the kernel's: r10 for the
/// fourth syscall argument; a function call gets rcx too).
fn set_args(r: &mut libc::user_regs_struct, args: &[u64]) {
    let a = |i: usize| args.get(i).copied().unwrap_or(0);
    r.rdi = a(0);
    r.rsi = a(1);
    r.rdx = a(2);
    r.r10 = a(3);
    r.rcx = a(3);
    r.r8 = a(4);
    r.r9 = a(5);
}

/// A synchronous signal the kernel raised for an instruction (not sent by
/// someone: `si_code > 0`).
fn is_fault(sig: i32, info: &[u8; 128]) -> bool {
    let code = i32::from_le_bytes(info[8..12].try_into().unwrap());
    matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP | libc::SIGSYS
    ) && code > 0
}

fn wait_tid(tid: i32, nohang: bool) -> Result<Option<Wait>> {
    let mut st: libc::c_int = 0;
    let flags = libc::__WALL | if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: waitpid with a valid status pointer.
        let r = unsafe { libc::waitpid(tid, &mut st, flags) };
        if r == -1 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if e.raw_os_error() == Some(libc::ECHILD) {
                return Ok(Some(Wait::Exited("the thread is gone".into())));
            }
            return Err(InjectError::Io {
                what: format!("waitpid({tid})"),
                source: e,
            });
        }
        if r == 0 {
            return Ok(None);
        }
        break;
    }
    Ok(Some(decode_wait(st)))
}

fn decode_wait(st: i32) -> Wait {
    if libc::WIFEXITED(st) {
        return Wait::Exited(format!("exited with status {}", libc::WEXITSTATUS(st)));
    }
    if libc::WIFSIGNALED(st) {
        return Wait::Exited(format!("killed by signal {}", libc::WTERMSIG(st)));
    }
    let event = (st >> 16) & 0xff;
    if event == libc::PTRACE_EVENT_STOP {
        return Wait::EventStop;
    }
    if event != 0 {
        return Wait::Event;
    }
    let sig = libc::WSTOPSIG(st);
    if sig == SYSCALL_STOP {
        Wait::Syscall
    } else {
        Wait::Signal(sig)
    }
}

fn sigaction_bytes(a: &KernelSigaction) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, w) in [a.handler, a.flags, a.restorer, a.mask].iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// One line of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp` / `r-xs` ...
    pub perms: String,
    pub offset: u64,
    /// The file path, `[heap]`, `[stack]`, `[vdso]`, ... or empty.
    pub path: String,
}

/// The mappings of process `pid`, in address order.
pub fn maps(pid: i32) -> Result<Vec<Mapping>> {
    parse_maps(&read_proc(pid, "maps")?)
}

fn parse_maps(text: &str) -> Result<Vec<Mapping>> {
    let bad = |l: &str| InjectError::Parse {
        what: "a /proc/PID/maps line".into(),
        text: l.into(),
    };
    let mut out = Vec::new();
    for l in text.lines() {
        let mut f = l.splitn(6, ' ');
        let range = f.next().ok_or_else(|| bad(l))?;
        let perms = f.next().ok_or_else(|| bad(l))?;
        let offset = f.next().ok_or_else(|| bad(l))?;
        let _dev = f.next();
        let _inode = f.next();
        let path = f.next().unwrap_or("").trim_start();
        let (s, e) = range.split_once('-').ok_or_else(|| bad(l))?;
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad(l));
        out.push(Mapping {
            start: hex(s)?,
            end: hex(e)?,
            perms: perms.to_string(),
            offset: hex(offset)?,
            path: path.to_string(),
        });
    }
    Ok(out)
}

/// A page-aligned address where `len` bytes (rounded up to pages) fit in
/// a free gap of process `pid`'s address space such that every byte of the
/// gap is within ±2 GiB (rel32 reach) of every byte of `[lo, hi)` (e.g. the
/// target binary's mapped range), from `/proc/PID/maps`.
///
/// Preference: the closest gap *below* `lo`, then the closest gap above
/// `hi` that leaves the brk heap room to grow. The area right after a
/// binary is where its brk heap lives (`start_brk`, from /proc/PID/stat,
/// randomised up to 32 MiB after the bss): a mapping there would make
/// `brk` fail and malloc fall back to mmap. So above, the gap must start
/// 1 GiB past the heap's current end (then 64 MiB, then right after it, if
/// nothing else fits); below the binary nothing grows. 256 MiB below
/// `[stack]` are kept free for stack growth too.
pub fn find_gap_near(pid: i32, lo: u64, hi: u64, len: u64) -> Result<u64> {
    let maps = maps(pid)?;
    let stat = read_proc(pid, "stat").unwrap_or_default();
    // Fields after "(comm)": state is field 3; start_brk is field 47.
    let start_brk = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(47 - 3))
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&b| b != 0);
    let min_addr = std::fs::read_to_string("/proc/sys/vm/mmap_min_addr")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(65536)
        .max(PAGE);
    gap_near(&maps, start_brk, min_addr, lo, hi, len).ok_or(InjectError::NoGap { pid, lo, hi, len })
}

fn gap_near(
    maps: &[Mapping],
    start_brk: Option<u64>,
    min_addr: u64,
    lo: u64,
    hi: u64,
    len: u64,
) -> Option<u64> {
    if len == 0 || hi <= lo {
        return None;
    }
    let len = len.checked_add(PAGE - 1)? & !(PAGE - 1);
    // Every start g must satisfy max(hi, g+len) - min(lo, g) <= 2 GiB.
    let g_min = hi.saturating_sub(TWO_GIB);
    let g_max = lo.checked_add(TWO_GIB)?.checked_sub(len)?;
    let heap_end = maps
        .iter()
        .filter(|m| m.path == "[heap]")
        .map(|m| m.end)
        .max()
        .into_iter()
        .chain(start_brk)
        .max();
    let mut busy: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.start < USER_TOP)
        .map(|m| {
            if m.path == "[stack]" {
                (m.start.saturating_sub(256 << 20), m.end)
            } else {
                (m.start, m.end)
            }
        })
        .collect();
    let free = |busy: &[(u64, u64)]| -> Vec<(u64, u64)> {
        let mut b = busy.to_vec();
        b.sort_unstable();
        let mut out = Vec::new();
        let mut cur = min_addr;
        for (s, e) in b {
            if s > cur {
                out.push((cur, s));
            }
            cur = cur.max(e);
        }
        if cur < USER_TOP {
            out.push((cur, USER_TOP));
        }
        out
    };
    // Below the binary: the highest fit.
    let below = free(&busy)
        .into_iter()
        .filter_map(|(a, b)| {
            let b = b.min(lo);
            let g = b.checked_sub(len)? & !(PAGE - 1);
            (g >= a.max(g_min) && g <= g_max && g + len <= lo).then_some(g)
        })
        .max();
    if below.is_some() {
        return below;
    }
    for reserve in [1u64 << 30, 64 << 20, 0] {
        if let Some(h) = heap_end {
            busy.push((h, h.saturating_add(reserve)));
        }
        let above = free(&busy)
            .into_iter()
            .filter_map(|(a, b)| {
                let g = (a.max(hi).max(g_min) + PAGE - 1) & !(PAGE - 1);
                (g + len <= b && g <= g_max).then_some(g)
            })
            .min();
        if heap_end.is_some() {
            busy.pop();
        }
        if above.is_some() {
            return above;
        }
    }
    None
}

/// A signal process `pid` does not use: not caught, not ignored, not
/// pending, and not blocked by any thread (`SigCgt`, `SigIgn`, `ShdPnd` of
/// /proc/PID/status; `SigBlk`, `SigPnd` of each /proc/PID/task/*/status),
/// chosen from SIGRTMAX (64) down to SIGRTMIN+2 (34): glibc reserves 32 and
/// 33 for itself.
pub fn free_signal(pid: i32) -> Result<i32> {
    let status = read_proc(pid, "status")?;
    let mut threads = Vec::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("status")) {
                threads.push(s);
            }
        }
    }
    pick_free_signal(&status, &threads)?.ok_or(InjectError::NoFreeSignal(pid))
}

fn pick_free_signal(process: &str, threads: &[String]) -> Result<Option<i32>> {
    let mask = |s: &str, key: &str| -> Result<u64> {
        match status_field(s, key) {
            Some(v) => u64::from_str_radix(v, 16).map_err(|_| InjectError::Parse {
                what: format!("{key} in a /proc status file"),
                text: v.into(),
            }),
            None => Ok(0),
        }
    };
    let mut used = mask(process, "SigCgt")? | mask(process, "SigIgn")? | mask(process, "ShdPnd")?;
    for t in threads {
        used |= mask(t, "SigBlk")? | mask(t, "SigPnd")?;
    }
    Ok((34..=64).rev().find(|&s| used & bit(s) == 0))
}

/// Whether user-space CET shadow stacks are enabled in any thread of `pid`
/// (`x86_Thread_features:` of /proc/PID/status and the threads' status
/// lists `shstk`). A call or signal frame we set up would not match the
/// shadow stack, so the caller must refuse to inject. False when the kernel
/// has no shadow stack support or the process is gone.
pub fn shadow_stack_enabled(pid: i32) -> bool {
    let mut texts = vec![read_proc(pid, "status").unwrap_or_default()];
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten() {
            texts.extend(std::fs::read_to_string(e.path().join("status")));
        }
    }
    texts.iter().any(|t| status_has_shstk(t))
}

fn status_has_shstk(status: &str) -> bool {
    status_field(status, "x86_Thread_features")
        .is_some_and(|v| v.split_whitespace().any(|f| f == "shstk"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            perms: "r--p".into(),
            offset: 0,
            path: path.into(),
        }
    }

    #[test]
    fn gap_prefers_below_then_above_past_the_heap() {
        let bin = [
            m(0x5555_0000_0000, 0x5555_0000_4000, "/bin/x"),
            m(0x5555_0000_4000, 0x5555_0000_8000, "/bin/x"),
        ];
        let g = gap_near(&bin, None, 65536, 0x5555_0000_0000, 0x5555_0000_8000, 100).unwrap();
        assert_eq!(g, 0x5555_0000_0000 - PAGE);
        // Non-PIE at 0x400000 with a mapping filling the space below.
        let maps = [
            m(0x10000, 0x400000, "/low"),
            m(0x400000, 0x500000, "/bin/x"),
            m(0x600000, 0x700000, "[heap]"),
        ];
        // The space between the bss and start_brk is free for us.
        let g = gap_near(&maps, Some(0x600000), 65536, 0x400000, 0x500000, 0x3000).unwrap();
        assert_eq!(g, 0x500000);
        let mut maps = maps.to_vec();
        maps.insert(2, m(0x500000, 0x600000, "/bin/x"));
        let g = gap_near(&maps, Some(0x600000), 65536, 0x400000, 0x600000, 0x3000).unwrap();
        assert_eq!(g, 0x700000 + (1 << 30));
        // Too big for the 1 GiB reserve: 64 MiB.
        let g = gap_near(&maps, Some(0x600000), 65536, 0x400000, 0x600000, 1 << 30).unwrap();
        assert_eq!(g, 0x700000 + (64 << 20));
        // Every byte within 2 GiB: the gap's end bounds it.
        assert!(gap_near(&maps, None, 65536, 0x400000, 0x600000, (2 << 30) - 0x200000).is_none());
        let g = gap_near(&maps, None, 65536, 0x400000, 0x600000, (2 << 30) - 0x600000).unwrap();
        assert!(g + ((2 << 30) - 0x600000) - 0x400000 <= TWO_GIB);
    }

    #[test]
    fn maps_parse() {
        let t = "55d0c0000000-55d0c0001000 r-xp 00001000 fe:00 1234    /usr/bin/x y\n\
                 7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n\
                 7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n";
        let v = parse_maps(t).unwrap();
        assert_eq!(v[0].path, "/usr/bin/x y");
        assert_eq!(v[0].offset, 0x1000);
        assert_eq!(v[1].path, "[stack]");
        assert_eq!(v[2].path, "");
    }

    #[test]
    fn free_signal_and_shstk_parse() {
        let p = "SigQ:\t0/1\nShdPnd:\t0000000000000000\nSigIgn:\t0000000000001000\n\
                 SigCgt:\t8000000000000000\n";
        let t = vec!["SigPnd:\t0000000000000000\nSigBlk:\t4000000000000000\n".to_string()];
        assert_eq!(pick_free_signal(p, &t).unwrap(), Some(62));
        let all = vec!["SigBlk:\tfffffffe00000000\n".to_string()];
        assert_eq!(pick_free_signal(p, &all).unwrap(), None);
        assert!(status_has_shstk(
            "x86_Thread_features:\tshstk wrss\nx86_Thread_features_locked:\t\n"
        ));
        assert!(!status_has_shstk(
            "x86_Thread_features:\t\nx86_Thread_features_locked:\tshstk\n"
        ));
    }
}
