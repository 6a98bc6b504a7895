//! The raw ptrace requests (`PTRACE_GETREGS`, `PTRACE_GETREGSET` with
//! `NT_X86_XSTATE`, `PTRACE_GETSIGMASK`, ...) and `waitpid` decoding that
//! [`Tracee`](super::Tracee) is built on, one small function each.

use std::ffi::c_void;

use super::error::{InjectError, Result};

/// `NT_X86_XSTATE`: the XSAVE area (x87, SSE, AVX, AVX-512, ...).
const NT_X86_XSTATE: usize = 0x202;
/// `NT_PRFPREG`: the FXSAVE area, for CPUs without XSAVE.
const NT_PRFPREG: usize = 2;
const SYSCALL_STOP: i32 = libc::SIGTRAP | 0x80;

/// What one `waitpid` reported for a tracee.
pub(super) enum Wait {
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
pub(super) struct FpState {
    note: usize,
    data: Vec<u8>,
}

pub(super) fn ptrace(
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

/// Detaches thread `tid` (delivering `sig`, 0 for none). A thread that is
/// in no stop because it died under us (SIGKILL during an attach) is
/// waited for instead: a traced thread's exit reaches its real parent
/// only once its tracer has waited for it or detached, so a tracee left
/// unwaited stays a zombie its parent cannot reap. Gives up (the
/// detach's error) on a thread that is alive and running after a second.
pub(super) fn let_go(tid: i32, sig: i32) -> Result<()> {
    let err = match ptrace(libc::PTRACE_DETACH, tid, 0, sig as usize, "PTRACE_DETACH") {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    if !matches!(&err, InjectError::Ptrace { source, .. } if source.raw_os_error() == Some(libc::ESRCH))
    {
        return Err(err);
    }
    for _ in 0..1000 {
        match wait_tid(tid, true) {
            // Reaped as our tracee (or gone already): its parent is told.
            Ok(Some(Wait::Exited(_))) | Err(_) => return Ok(()),
            // It reached a stop meanwhile: detach it from there.
            Ok(Some(_)) => {
                return ptrace(libc::PTRACE_DETACH, tid, 0, sig as usize, "PTRACE_DETACH")
                    .map(drop);
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
    Err(err)
}

pub(super) fn resume(req: libc::c_uint, tid: i32, sig: i32) -> Result<()> {
    let name = if req == libc::PTRACE_SYSCALL {
        "PTRACE_SYSCALL"
    } else {
        "PTRACE_CONT"
    };
    ptrace(req, tid, 0, sig as usize, name).map(drop)
}

pub(super) fn get_regs(tid: i32) -> Result<libc::user_regs_struct> {
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

pub(super) fn set_regs(tid: i32, regs: &libc::user_regs_struct) -> Result<()> {
    ptrace(
        libc::PTRACE_SETREGS,
        tid,
        0,
        regs as *const _ as usize,
        "PTRACE_SETREGS",
    )
    .map(drop)
}

pub(super) fn get_siginfo(tid: i32) -> Result<[u8; 128]> {
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

pub(super) fn get_sigmask(tid: i32) -> Result<u64> {
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

pub(super) fn set_sigmask(tid: i32, mask: u64) -> Result<()> {
    ptrace(
        libc::PTRACE_SETSIGMASK,
        tid,
        8,
        &mask as *const u64 as usize,
        "PTRACE_SETSIGMASK",
    )
    .map(drop)
}

pub(super) fn get_fp(tid: i32) -> Result<FpState> {
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

pub(super) fn set_fp(tid: i32, fp: &FpState) -> Result<()> {
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
pub(super) fn set_args(r: &mut libc::user_regs_struct, args: &[u64]) {
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
pub(super) fn is_fault(sig: i32, info: &[u8; 128]) -> bool {
    let code = i32::from_le_bytes(info[8..12].try_into().unwrap());
    matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP | libc::SIGSYS
    ) && code > 0
}

/// The raw `waitpid` statuses of the last processes (threads) this
/// process's ptrace waits reaped: a tracee that is also our child (the
/// command of `burstyd run`, held at its entry) leaves its exit status
/// here, not to its parent's own `wait`, which then gets `ECHILD`.
static REAPED: std::sync::Mutex<std::collections::VecDeque<(i32, i32)>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());
const REAPED_KEPT: usize = 64;

/// The exit status of `pid` if a ptrace wait here reaped it (see
/// [`REAPED`]), as `waitpid` gave it.
pub fn reaped_status(pid: i32) -> Option<i32> {
    let r = REAPED.lock().unwrap_or_else(|e| e.into_inner());
    r.iter().rev().find(|(p, _)| *p == pid).map(|&(_, st)| st)
}

pub(super) fn wait_tid(tid: i32, nohang: bool) -> Result<Option<Wait>> {
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
    if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
        let mut reaped = REAPED.lock().unwrap_or_else(|e| e.into_inner());
        if reaped.len() == REAPED_KEPT {
            reaped.pop_front();
        }
        reaped.push_back((tid, st));
    }
    Ok(Some(decode_wait(st)))
}

pub(super) fn decode_wait(st: i32) -> Wait {
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
