//! Holding a command that the tracer starts itself (`burstyd run`) at its
//! entry point, so that it can be rewritten before it runs any code of its
//! own: [`seize_before_exec`] while it is still waiting to exec,
//! [`run_to_entry`] through the exec and the dynamic loader (which maps
//! the libraries, relocates them, sets up TLS and runs their
//! constructors) to a one-shot breakpoint at `AT_ENTRY`, then
//! [`Tracee::adopt`](super::Tracee::adopt) to inject while it is stopped
//! there.
//!
//! The breakpoint byte is restored before anything else happens and `rip`
//! rewound onto the entry: the program then runs its first instruction as
//! if nothing had stopped it. (The page the byte was written to becomes a
//! private copy of the file's page, identical in content.) Signals that
//! arrive on the way are delivered as they came. Should the tracer die, the
//! kernel detaches it and the program runs on untraced.

use std::ffi::c_void;

use burstyd_common::addr::Pid;

use super::error::{InjectError, Result};
use super::ptrace::{Wait, get_regs, ptrace, resume, set_regs, wait_tid};

/// Seizes `pid`, which has not exec'd yet (it waits on `burstyd run`'s
/// gate), reporting its exec. The calling thread becomes its tracer: the
/// other functions here, and [`Tracee::adopt`](super::Tracee::adopt), must
/// be called from it.
pub fn seize_before_exec(pid: Pid) -> Result<()> {
    // SAFETY: PTRACE_SEIZE takes plain values.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid.raw(),
            std::ptr::null_mut::<c_void>(),
            libc::PTRACE_O_TRACEEXEC as usize as *mut c_void,
        )
    };
    if r == -1 {
        return Err(InjectError::Ptrace {
            call: "PTRACE_SEIZE",
            tid: pid.raw(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Where [`run_to_entry`] left the program.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    /// Stopped (ptrace) at this entry point, nothing of the program run.
    Held(u64),
    /// Released untraced: a static executable (no dynamic loader: at its
    /// entry there is no TLS yet to trace it with).
    Static,
}

/// Lets the seized `pid` exec and run to its executable's entry point
/// (`AT_ENTRY`), and stops it there. Errors if it exits first (the exec
/// failed, a library is missing); on any other error it is released.
pub fn run_to_entry(pid: Pid) -> Result<Entry> {
    let tid = pid.raw();
    // (entry, the original word there) once the breakpoint is set.
    let mut armed: Option<(u64, i64)> = None;
    let result = (|| loop {
        match wait_tid(tid, false)?.expect("blocking wait") {
            Wait::Exited(how) => {
                return Err(InjectError::Exited {
                    pid,
                    how: format!("{how}, before reaching its entry point"),
                });
            }
            Wait::Event if armed.is_none() => {
                // The exec (the one event asked for).
                let (entry, base) = auxv_entry_and_base(pid)?;
                if base == 0 {
                    release(pid);
                    return Ok(Entry::Static);
                }
                let word = ptrace(
                    libc::PTRACE_PEEKDATA,
                    tid,
                    entry as usize,
                    0,
                    "PTRACE_PEEKDATA",
                )?;
                let trap = (word & !0xff) | 0xcc;
                ptrace(
                    libc::PTRACE_POKEDATA,
                    tid,
                    entry as usize,
                    trap as usize,
                    "PTRACE_POKEDATA",
                )?;
                armed = Some((entry, word));
                resume(libc::PTRACE_CONT, tid, 0)?;
            }
            Wait::Signal(libc::SIGTRAP)
                if armed.is_some_and(|(e, _)| get_regs(tid).is_ok_and(|r| r.rip == e + 1)) =>
            {
                let (entry, word) = armed.take().expect("checked");
                ptrace(
                    libc::PTRACE_POKEDATA,
                    tid,
                    entry as usize,
                    word as usize,
                    "PTRACE_POKEDATA",
                )?;
                let mut r = get_regs(tid)?;
                r.rip = entry;
                set_regs(tid, &r)?;
                return Ok(Entry::Held(entry));
            }
            // Someone else's signal on the way: delivered as it came.
            Wait::Signal(sig) => resume(libc::PTRACE_CONT, tid, sig)?,
            Wait::EventStop | Wait::Event | Wait::Syscall => resume(libc::PTRACE_CONT, tid, 0)?,
        }
    })();
    if let Err(e) = &result {
        if let Some((entry, word)) = armed {
            // Still stopped (only an error inside a stop gets here).
            let _ = ptrace(
                libc::PTRACE_POKEDATA,
                tid,
                entry as usize,
                word as usize,
                "PTRACE_POKEDATA",
            );
        }
        if !matches!(e, InjectError::Exited { .. }) {
            release(pid);
        }
    }
    result
}

/// Lets a program held by [`run_to_entry`] go (a no-op once it was
/// released, or adopted and detached).
pub fn release(pid: Pid) {
    // Fails harmlessly when `pid` is not our tracee; a program that died
    // while held is waited for, so that its parent can reap it.
    let _ = super::ptrace::let_go(pid.raw(), 0);
}

/// `AT_ENTRY` and `AT_BASE` (the dynamic loader's base, 0 without one)
/// of `pid`.
fn auxv_entry_and_base(pid: Pid) -> Result<(u64, u64)> {
    let path = format!("/proc/{pid}/auxv");
    let bytes = std::fs::read(&path).map_err(|source| InjectError::Io { what: path, source })?;
    let (mut entry, mut base) = (None, 0);
    for kv in bytes.chunks_exact(16) {
        let k = u64::from_ne_bytes(kv[..8].try_into().expect("8 bytes"));
        let v = u64::from_ne_bytes(kv[8..].try_into().expect("8 bytes"));
        match k {
            libc::AT_ENTRY => entry = Some(v),
            libc::AT_BASE => base = v,
            _ => {}
        }
    }
    let entry = entry.ok_or_else(|| {
        InjectError::InvalidArgument(format!("pid {pid}: no AT_ENTRY in its auxiliary vector"))
    })?;
    Ok((entry, base))
}
