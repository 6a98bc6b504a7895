//! The few raw syscalls the daemon makes itself (aya covers the BPF ones).
//! Each wrapper names the call in its error.
use std::io;

use burstyd_common::addr::Pid;

const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// `perf_event_attr` as far as the probe needs it (`PERF_ATTR_SIZE_VER0`
/// plus the rest zeroed; the kernel accepts any size it knows).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    _reserved2: u16,
}

/// Opens (and closes) a counting perf event of `type_`/`config` on `cpu`
/// for all processes, to learn whether the host supports it. Errors carry
/// the kernel's errno: ENOENT/EOPNOTSUPP/ENODEV mean "no such event here".
pub(crate) fn probe_perf_event(type_: u32, config: u64, cpu: i32) -> io::Result<()> {
    let attr = PerfEventAttr {
        type_,
        size: size_of::<PerfEventAttr>() as u32,
        config,
        // disabled = 1: we only want to know whether it can be opened.
        flags: 1,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid, fully initialised perf_event_attr of the
    // size we state; the kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1 as libc::pid_t,
            cpu,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just opened and own.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

/// Does process `pid` exist? (`kill(pid, 0)`; EPERM still means it exists.)
pub(crate) fn process_exists(pid: Pid) -> bool {
    // SAFETY: signal 0 performs only the existence and permission checks.
    let r = unsafe { libc::kill(pid.raw(), 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Is process `pid` running: there, and neither a zombie nor dead
/// (`/proc/PID/stat` state other than `Z`/`X`)? Unlike
/// [`process_exists`], an exited process its parent has not reaped yet
/// is not running: ptrace cannot attach to it any more, and a configured
/// target in that state has exited.
pub(crate) fn process_running(pid: Pid) -> bool {
    proc_stat(pid).is_some_and(|s| !s.exited())
}

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags: a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

/// What `/proc/PID/stat` says about a process: its name, state and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub(crate) comm: String,
    /// `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub(crate) state: char,
    pub(crate) flags: u64,
}

impl ProcStat {
    /// A zombie or dead: the process has exited.
    pub(crate) fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }

    pub(crate) fn kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

/// `/proc/PID/stat`, or `None` when the process is gone.
pub(crate) fn proc_stat(pid: Pid) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses `pid (comm) state ppid pgrp session tty_nr tpgid flags ...`
/// (comm may hold spaces and parentheses: it ends at the last `)`).
fn parse_stat(s: &str) -> Option<ProcStat> {
    let (head, rest) = s.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4 to 8 (ppid ... tpgid), then 9: flags.
    let flags = fields.nth(5)?.parse().ok()?;
    Some(ProcStat { comm, state, flags })
}

/// CPU time (user + system) this process has used so far, in nanoseconds.
pub(crate) fn self_cpu_ns() -> u64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Peak resident set size of this process in bytes.
pub(crate) fn self_peak_rss() -> u64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as u64 * 1024
}

/// Mounts tracefs at /sys/kernel/tracing if nothing is mounted there yet
/// (tracepoint attachment needs it; systemd hosts usually have it already).
pub(crate) fn ensure_tracefs() -> io::Result<()> {
    if std::path::Path::new("/sys/kernel/tracing/events").exists() {
        return Ok(());
    }
    // SAFETY: all pointers are to NUL-terminated static strings.
    let r = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    tracing::info!("mounted tracefs at /sys/kernel/tracing");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_an_odd_comm() {
        let s = "42 (a) b (c)) S 2 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 3 0 0\n";
        let st = parse_stat(s).unwrap();
        assert_eq!(st.comm, "a) b (c)");
        assert_eq!(st.state, 'S');
        assert_eq!(st.flags, 2129984);
        assert!(st.kernel_thread());
        let z = parse_stat("7 (sh) Z 1 7 7 0 -1 4194316 0").unwrap();
        assert!(z.exited() && !z.kernel_thread());
    }

    #[test]
    fn kthreadd_is_a_kernel_thread_and_we_are_not() {
        let k = proc_stat(Pid(2)).expect("pid 2 (kthreadd)");
        assert!(k.kernel_thread(), "{k:?}");
        let me = proc_stat(Pid(std::process::id())).unwrap();
        assert!(!me.kernel_thread() && !me.exited(), "{me:?}");
    }
}
