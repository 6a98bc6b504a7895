//! Running code in the target: syscalls through an existing `syscall`
//! instruction and function calls returning into it (see the module docs
//! of [`super`] for why this leaves interrupted syscalls exactly as they
//! were). This is how the clones' region is mapped, the burst signal's
//! handler installed and `__register_frame` called.

use std::time::{Duration, Instant};

use super::error::{InjectError, Result};
use super::procfs::{MapEntry, maps};
use super::ptrace::{
    Wait, get_fp, get_regs, get_siginfo, get_sigmask, is_fault, ptrace, resume, set_args, set_fp,
    set_regs, set_sigmask, wait_tid,
};
use super::scratch::{MAX_NAME, SCR_NAME, SCR_SIGACTION_NEW, SCR_SIGACTION_OLD, SCRATCH_LEN};
use super::signals::{ASYNC_SIGNALS, KernelSigaction};
use super::tracee::Tracee;

const RED_ZONE: u64 = 128;

impl Tracee {
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
    ///
    /// For the tests (`tests/inject.rs`): the daemon maps its region with
    /// its final protection and never changes it.
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

    /// The address of a `syscall` instruction in the target (cached;
    /// checked before each use).
    pub(super) fn gadget(&mut self) -> Result<u64> {
        if let Some(g) = self.gadget
            && self.read_memory(g, 2).is_ok_and(|b| b == [0x0f, 0x05])
        {
            return Ok(g);
        }
        let maps = maps(self.pid)?;
        let mut order: Vec<&MapEntry> = maps
            .iter()
            .filter(|m| m.is_exec() && !m.is_path("[vsyscall]"))
            .collect();
        // The vDSO first (always there, never unmapped), then files
        // (libraries, the executable; a deleted one is still mapped).
        let is_file = |m: &MapEntry| m.path.as_deref().is_some_and(|p| p.starts_with('/'));
        order.sort_by_key(|m| (!m.is_path("[vdso]"), !is_file(m)));
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
    pub(super) fn scratch(&mut self) -> Result<u64> {
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
    pub(super) fn inject(&mut self, i: usize, nr: i64, args: &[u64]) -> Result<u64> {
        if args.len() > 6 {
            return Err(InjectError::TooManyArguments(args.len()));
        }
        let gadget = self.gadget()?;
        // `syscall` leaves the next instruction's address in the filter's
        // view (`instruction_pointer`).
        self.threads[i]
            .seccomp
            .check(self.pid, nr, args, gadget + 2)?;
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

fn sigaction_bytes(a: &KernelSigaction) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, w) in [a.handler, a.flags, a.restorer, a.mask].iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    b
}
