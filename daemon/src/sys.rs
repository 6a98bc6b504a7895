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

/// The name of process `pid` (`/proc/PID/comm`, without its newline);
/// `None` once it is gone.
pub(crate) fn comm(pid: Pid) -> Option<String> {
    read_comm(&format!("/proc/{pid}/comm"))
}

/// The name of thread `tid` of process `pid` (`/proc/PID/task/TID/comm`);
/// `None` once it is gone.
pub(crate) fn thread_comm(pid: Pid, tid: u32) -> Option<String> {
    read_comm(&format!("/proc/{pid}/task/{tid}/comm"))
}

/// Process `pid`'s memory (`/proc/PID/mem`), for reading, and with
/// `write` for writing too.
pub(crate) fn open_mem(pid: Pid, write: bool) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(format!("/proc/{pid}/mem"))
}

/// The mode of every file burstyd writes for people to read (profiles,
/// `summary.json`, `bursts.jsonl`, the push spool): its owner reads and
/// writes, its group reads, nobody else (never 0644: a profile shows
/// every sampled process's code and threads). The process's umask takes
/// more away: the service's `UMask=0077` leaves 0600.
pub(crate) const OUTPUT_MODE: u32 = 0o640;

/// Creates `path` for writing with [`OUTPUT_MODE`] (less the umask); a
/// file already there is removed first, so that the new one takes the
/// mode.
pub(crate) fn create_output_file(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(OUTPUT_MODE)
        .open(path)
}

/// Where `/proc/PID/exe` points, as the kernel says it (a file removed
/// since ends in " (deleted)").
pub(crate) fn exe_link(pid: Pid) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe"))
}

fn read_comm(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|c| c.trim_end_matches('\n').to_owned())
}

/// Gives the heap's free pages back to the kernel (`malloc_trim(0)`, every
/// arena): an attach frees hundreds of megabytes of analysis and
/// generation at once, which glibc would otherwise keep mapped (RSS).
pub(crate) fn return_free_memory() {
    // SAFETY: malloc_trim only releases free memory of the allocator's own
    // arenas; it touches no live allocation.
    unsafe { libc::malloc_trim(0) };
}

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags: a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;
/// `PF_EXITING`: the process is exiting.
const PF_EXITING: u64 = 0x0000_0004;

/// What `/proc/PID/stat` says about a process: its name, state and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub(crate) comm: String,
    /// `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub(crate) state: char,
    pub(crate) flags: u64,
}

impl ProcStat {
    /// A zombie or dead, or on its way there (`PF_EXITING`: its memory
    /// and executable may be gone already): the process has exited.
    pub(crate) fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X') || self.flags & PF_EXITING != 0
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

/// The signals a session handles itself: SIGINT/SIGTERM (stop, or in
/// `run` passed on to the command), SIGHUP (reload, or passed on).
pub(crate) const SESSION_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn session_sigset() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SESSION_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks [`SESSION_SIGNALS`] in the calling thread and every thread it
/// starts from now on; they stay pending until a [`SignalFd`] reads them.
/// Call it before any other thread exists. Children inherit the mask,
/// through exec too: see [`original_sigmask`].
pub(crate) fn block_session_signals() -> io::Result<()> {
    let set = session_sigset();
    // SAFETY: a zeroed sigset_t is valid; pthread_sigmask overwrites it.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is initialised, `old` is ours to write.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    let _ = ORIGINAL_MASK.set(Mask(old));
    Ok(())
}

/// The signal mask burstyd started with (before
/// [`block_session_signals`]), for `run`'s command: a blocked mask
/// survives exec, and std's `Command` keeps it.
pub(crate) fn original_sigmask() -> libc::sigset_t {
    match ORIGINAL_MASK.get() {
        Some(m) => m.0,
        // SAFETY: sigemptyset initialises a sigset_t we own.
        None => unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            set
        },
    }
}

/// Sets the calling thread's signal mask to `set`; async-signal-safe (for
/// a forked child before exec).
pub(crate) fn set_sigmask(set: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: `set` is an initialised sigset_t; no old mask is asked for.
    if unsafe { libc::sigprocmask(libc::SIG_SETMASK, set, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

struct Mask(libc::sigset_t);
// SAFETY: a sigset_t is plain data, only read once stored.
unsafe impl Sync for Mask {}
unsafe impl Send for Mask {}
static ORIGINAL_MASK: std::sync::OnceLock<Mask> = std::sync::OnceLock::new();

/// One signal read from a [`SignalFd`], with who sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SigInfo {
    pub(crate) signo: libc::c_int,
    /// `si_code`: `SI_USER` from kill(2), `SI_KERNEL` from the kernel
    /// (a terminal's ^C or hangup goes to its whole foreground group).
    pub(crate) code: i32,
    /// The sender, for `SI_USER`.
    pub(crate) pid: u32,
}

/// A non-blocking signalfd for the (blocked) [`SESSION_SIGNALS`].
pub(crate) struct SignalFd(std::os::fd::OwnedFd);

impl SignalFd {
    pub(crate) fn new() -> io::Result<Self> {
        let set = session_sigset();
        // SAFETY: -1 asks for a new descriptor; `set` is initialised.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: signalfd just returned this descriptor; we own it.
        Ok(SignalFd(unsafe {
            <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
        }))
    }

    /// The next pending signal; `WouldBlock` when there is none.
    pub(crate) fn read(&self) -> io::Result<SigInfo> {
        use std::os::fd::AsRawFd;
        // SAFETY: signalfd_siginfo is plain data; all zeroes is valid.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = size_of::<libc::signalfd_siginfo>();
        // SAFETY: reading at most `size` bytes into `info`.
        let n = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                &mut info as *mut _ as *mut libc::c_void,
                size,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != size {
            return Err(io::Error::other(format!(
                "signalfd: short read ({n} bytes)"
            )));
        }
        Ok(SigInfo {
            signo: info.ssi_signo as libc::c_int,
            code: info.ssi_code,
            pid: info.ssi_pid,
        })
    }
}

impl std::os::fd::AsRawFd for SignalFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// The process group of `pid` (`getpgid`; 0 is ours).
pub(crate) fn process_group(pid: u32) -> io::Result<u32> {
    // SAFETY: getpgid only reads.
    let g = unsafe { libc::getpgid(pid as libc::pid_t) };
    if g < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(g as u32)
}

/// Sends `signo` to `pid` (kill(2)).
pub(crate) fn send_signal(pid: u32, signo: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid as libc::pid_t, signo) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A signal's name (`SIGTERM`), or its number.
pub(crate) fn signal_name(signo: libc::c_int) -> String {
    match signo {
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGUSR2 => "SIGUSR2".into(),
        n => format!("signal {n}"),
    }
}

/// The time-stamp counter's rate in Hz, measured against the monotonic
/// clock over 20 ms (the host's TSC is constant: `constant_tsc`).
pub(crate) fn tsc_hz() -> f64 {
    // Once: the rate is invariant, and the loop should not sleep at every
    // interval profile.
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        // SAFETY: `rdtsc` has no preconditions on x86-64.
        let tsc = || unsafe { core::arch::x86_64::_rdtsc() };
        let (t0, c0) = (std::time::Instant::now(), tsc());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (c1, t1) = (tsc(), std::time::Instant::now());
        c1.wrapping_sub(c0) as f64 / (t1 - t0).as_secs_f64()
    })
}

/// Feeds `input` to a worker child's standard input (if piped) while
/// reading its standard output and error to their ends (either pipe may
/// fill), then waits for it. Returns its status, output and error.
pub(crate) fn collect_child(
    child: &mut std::process::Child,
    input: Vec<u8>,
) -> std::io::Result<(std::process::ExitStatus, Vec<u8>, String)> {
    use std::io::{Read as _, Write as _};
    let (out, err) = std::thread::scope(|s| {
        let mut stdin = child.stdin.take();
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        s.spawn(move || {
            if let Some(i) = stdin.as_mut() {
                let _ = i.write_all(&input);
            }
        });
        let err = s.spawn(move || {
            let mut e = String::new();
            if let Some(x) = stderr.as_mut() {
                let _ = x.read_to_string(&mut e);
            }
            e
        });
        let mut o = Vec::new();
        if let Some(x) = stdout.as_mut() {
            let _ = x.read_to_end(&mut o);
        }
        (o, err.join().unwrap_or_default())
    });
    Ok((child.wait()?, out, err))
}

/// Writes a subcommand's report to standard output. A reader that stopped
/// reading (`| head -1`) ends it normally: the rest is dropped, no error
/// (`print!` would panic there).
pub(crate) fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
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

    #[test]
    fn comm_is_the_name_without_its_newline() {
        let me = Pid(std::process::id());
        let name = comm(me).expect("our own comm");
        assert!(!name.is_empty() && !name.contains('\n'), "{name:?}");
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let thread = thread_comm(me, tid).expect("our own thread's comm");
        assert!(!thread.is_empty() && !thread.ends_with('\n'), "{thread:?}");
        // Above the kernel's largest pid_max (2^22): no such process.
        assert_eq!(comm(Pid(1 << 23)), None);
        assert_eq!(thread_comm(me, 1 << 23), None);
    }
}
