//! [`Tracee`]: a process held stopped — every thread seized and
//! interrupted, its registers saved — until [`Tracee::detach`] puts them
//! back and re-delivers the signals taken meanwhile. Running syscalls and
//! calls in it is in `remote.rs`.

use std::ffi::c_void;
use std::fs::File;
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use burstyd_common::addr::Pid;

use super::error::{InjectError, Result};
use super::procfs::{diagnose_eperm, live_tasks, read_proc, status_field};
use super::ptrace::{
    Wait, get_regs, get_siginfo, get_sigmask, ptrace, set_regs, set_sigmask, wait_tid,
};
use super::scratch::{SCR_SIGINFO, SCRATCH_LEN};
use super::seccomp::Filters;
use super::signals::ALL_SIGNALS;

/// A signal taken from a thread that must be given back at detach.
pub(super) struct Pending {
    pub(super) tid: i32,
    pub(super) signo: i32,
    /// The kernel's `siginfo_t` as PTRACE_GETSIGINFO returned it.
    pub(super) info: [u8; 128],
}

pub(super) struct Thread {
    pub(super) tid: i32,
    /// Registers restored at detach.
    pub(super) saved: libc::user_regs_struct,
    /// The thread was in a signal-delivery stop for this signal at attach
    /// and has not been resumed since: `PTRACE_DETACH` passes it on.
    pub(super) attach_signal: Option<Pending>,
    /// Its seccomp filters: every call injected on it must pass them.
    pub(super) seccomp: Filters,
}

/// A stopped process: every thread held in a ptrace stop, registers saved.
///
/// Created by [`Tracee::attach`]; [`Tracee::detach`] (or `Drop`, best
/// effort) restores every thread's registers and lets the process go. Use
/// it only from the thread that attached (see the module docs).
pub struct Tracee {
    pub(super) pid: Pid,
    /// Thread ids, the first thread first.
    pub(super) tids: Vec<i32>,
    pub(super) threads: Vec<Thread>,
    pub(super) mem: File,
    /// Address of a `syscall` instruction.
    pub(super) gadget: Option<u64>,
    /// A page of ours in the target for syscall arguments.
    pub(super) scratch: Option<u64>,
    pub(super) requeue: Vec<Pending>,
    /// A SIGSTOP was taken from the program: stop it again after detach.
    pub(super) stop_after: bool,
    pub(super) call_timeout: Duration,
    pub(super) detached: bool,
    /// ptrace is per tracer thread: not Send, not Sync.
    pub(super) _not_send: PhantomData<*const ()>,
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
    pub fn attach(pid: Pid) -> Result<Tracee> {
        Self::attach_with(pid, false)
    }

    /// Like [`Tracee::attach`], for a process whose main thread this thread
    /// already traces and holds in a ptrace stop (see
    /// [`hold::run_to_entry`](super::hold::run_to_entry)): its other
    /// threads, if any, are seized as by `attach`.
    pub fn adopt(pid: Pid) -> Result<Tracee> {
        // The options `attach` seizes with (the exec report is not wanted).
        ptrace(
            libc::PTRACE_SETOPTIONS,
            pid.raw(),
            0,
            libc::PTRACE_O_TRACESYSGOOD as usize,
            "PTRACE_SETOPTIONS",
        )?;
        Self::attach_with(pid, true)
    }

    fn attach_with(pid: Pid, adopted: bool) -> Result<Tracee> {
        if pid.raw() <= 0 {
            return Err(InjectError::NoSuchProcess(pid));
        }
        // SAFETY: getpid has no preconditions.
        if pid.raw() == unsafe { libc::getpid() } {
            return Err(InjectError::OwnProcess(pid));
        }
        let status = read_proc(pid, "status")?;
        let tgid = status_field(&status, "Tgid").and_then(|v| v.parse::<u32>().ok().map(Pid));
        if let Some(tgid) = tgid
            && tgid != pid
        {
            return Err(InjectError::NotAProcess { pid, tgid });
        }
        if let Some(tracer) = status_field(&status, "TracerPid").and_then(|v| v.parse().ok())
            && tracer != 0
            && !adopted
        {
            return Err(InjectError::AlreadyTraced { pid, tracer });
        }

        let mut threads: Vec<Thread> = Vec::new();
        if adopted {
            threads.push(Thread {
                tid: pid.raw(),
                saved: get_regs(pid.raw())?,
                attach_signal: None,
                seccomp: Filters::default(),
            });
        }
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
        threads.sort_by_key(|t| (t.tid != pid.raw(), t.tid));
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
        for t in &mut threads {
            let mode = read_proc(pid, &format!("task/{}/status", t.tid))
                .ok()
                .and_then(|s| status_field(&s, "Seccomp").and_then(|v| v.parse().ok()))
                .unwrap_or(0);
            match Filters::read(pid, t.tid, mode) {
                Ok(f) => t.seccomp = f,
                Err(e) => {
                    release(&threads);
                    return Err(e);
                }
            }
        }
        for t in &mut threads {
            if t.attach_signal.is_none() && stop_made_it_fail(pid, t.tid, &t.saved, &mem) {
                // Run the call again at detach, as the kernel does for the
                // calls it restarts after a stop.
                t.saved.rax = t.saved.orig_rax;
                t.saved.rip -= 2;
            }
        }
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
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The stopped threads, the first thread (where syscalls and calls run:
    /// the main thread unless it has exited) first.
    pub fn threads(&self) -> &[i32] {
        &self.tids
    }

    /// The saved registers of thread `tid`, as the thread stopped. These are
    /// restored at detach.
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

    /// Whether the seccomp filters of the first thread (where syscalls run)
    /// would let the system call `nr` with `args` through; `Err`
    /// ([`InjectError::SeccompRefuses`]) names the call and what the filter
    /// would do. Every injected call is checked this way anyway; asking up
    /// front keeps a multi-step injection from stopping half done.
    pub fn check_syscall(&mut self, nr: i64, args: &[u64]) -> Result<()> {
        let ip = self.gadget()? + 2;
        self.threads[0].seccomp.check(self.pid, nr, args, ip)
    }

    /// How long [`Tracee::call`] waits for the function to return (5 s by
    /// default).
    pub fn set_call_timeout(&mut self, timeout: Duration) {
        self.call_timeout = timeout;
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
    /// restore every thread's saved registers and `PTRACE_DETACH` every
    /// thread. A thread
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
            note(super::ptrace::let_go(t.tid, sig), &mut first_err);
        }
        if self.stop_after {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(self.pid.raw(), libc::SIGSTOP) };
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
                                u64::from(self.pid.0),
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
                    unsafe { libc::tgkill(self.pid.raw(), tid, p.signo) };
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

    pub(super) fn exited(&self, how: String) -> InjectError {
        InjectError::Exited { pid: self.pid, how }
    }

    /// A thread that is resumed loses the signal of its attach stop: keep it
    /// for re-queueing.
    pub(super) fn take_attach_signal(&mut self, i: usize) {
        if let Some(p) = self.threads[i].attach_signal.take() {
            self.requeue.push(p);
        }
    }

    pub(super) fn take_signal(&mut self, tid: i32, signo: i32, info: [u8; 128]) {
        if signo == libc::SIGSTOP {
            self.stop_after = true;
        } else {
            self.requeue.push(Pending { tid, signo, info });
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
fn seize_all(pid: Pid, threads: &mut Vec<Thread>) -> Result<()> {
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
                    seccomp: Filters::default(),
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
                seccomp: Filters::default(),
            });
        }
    }
}

/// Whether our `PTRACE_INTERRUPT` made the system call thread `tid` was
/// blocked in fail with EINTR. The kernel restarts most calls after a
/// stop (`-ERESTART*`: `read`, `poll`, `nanosleep`, ...), but a few return
/// EINTR instead (`epoll_wait`, `sigtimedwait`, `semop`, `io_getevents`;
/// see signal(7), "Interruption of system calls and library functions by
/// stop signals"): resumed as is, the program would see a failure it did
/// not cause. The EINTR is ours when the thread stopped for our interrupt
/// (not for a signal) and no signal it does not block is pending (else that
/// signal's handler runs first and the EINTR is its own). A rerun call
/// starts its timeout afresh.
fn stop_made_it_fail(pid: Pid, tid: i32, regs: &libc::user_regs_struct, mem: &File) -> bool {
    if regs.orig_rax as i64 <= 0 || regs.rax as i64 != -(libc::EINTR as i64) {
        return false;
    }
    // The instruction before the pc must be the `syscall` that stopped.
    let mut insn = [0u8; 2];
    if mem
        .read_exact_at(&mut insn, regs.rip.wrapping_sub(2))
        .is_err()
        || insn != [0x0f, 0x05]
    {
        return false;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else {
        return false;
    };
    let mask = |key| status_field(&status, key).and_then(|v| u64::from_str_radix(v, 16).ok());
    match (mask("SigPnd"), mask("ShdPnd"), mask("SigBlk")) {
        (Some(pnd), Some(shd), Some(blk)) => (pnd | shd) & !blk == 0,
        _ => false,
    }
}

/// Let stopped threads go after a failed attach.
fn release(threads: &[Thread]) {
    for t in threads {
        let sig = t.attach_signal.as_ref().map_or(0, |p| p.signo);
        let _ = super::ptrace::let_go(t.tid, sig);
    }
}
