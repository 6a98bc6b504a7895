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
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next())
                .map(|state| state != "Z" && state != "X")
        })
        .unwrap_or(false)
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
