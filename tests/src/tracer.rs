//! A ptrace tracer that reports every instruction a program executes inside
//! its main executable, as stated virtual addresses (SVMAs) of that file.
//!
//! Used by tests/tests/cfg_soundness.rs to check the rewriter's CFGs against
//! what a real program really does, independently of the analysis (the
//! tracer only knows the ELF load bias and the kernel's single-step trap).
//!
//! ## How
//!
//! The program is started with `PTRACE_TRACEME` and stops at its `execve`.
//! The tracer reads `/proc/PID/maps` for the main executable's executable
//! mapping(s) (the "text": `.init`, `.plt*`, `.text`, `.fini`) and its load
//! bias (`AVMA - SVMA`, PIE). Then:
//!
//! - **Inside the text** every instruction is single-stepped
//!   (`PTRACE_SINGLESTEP` + `waitpid` + `PTRACE_GETREGS`) and reported as
//!   [`Event::Step`] `prev -> cur`.
//! - **Outside the text** (the dynamic loader before the entry point, libc
//!   after a PLT stub's `jmp [GOT]`, libc after `main` returns...) the code
//!   runs at full speed: on the first step that leaves the text
//!   ([`Event::Leave`]) the tracer makes the text non-executable (an
//!   `mprotect(text, PROT_READ)` injected into the tracee: registers set up
//!   for the syscall, `rip` pointed at a `syscall` instruction of the
//!   dynamic loader, one single step, registers restored) and lets the
//!   program run (`PTRACE_CONT`). The first instruction fetched from the
//!   text, by whatever means — a return, a callback from libc (constructors,
//!   `main`, atexit handlers, comparators, signal handlers), an IFUNC
//!   resolver called by the loader — faults; the tracer swallows the
//!   `SIGSEGV` (`rip` is the target, the transfer itself completed), makes
//!   the text executable again, reports [`Event::Enter`] and resumes
//!   single-stepping. Nothing executed in the text is ever missed, and libc
//!   costs nothing per instruction.
//!
//! [`Event::Enter`] says whether outside code returned into the text
//! ([`Via::Return`]: the word just below the stack pointer is the new `rip`,
//! as a `ret` leaves it) or called or jumped into it ([`Via::Call`]).
//!
//! Signals other than the tracer's own `SIGTRAP`s and text-fetch `SIGSEGV`s
//! are passed on to the program; the first instruction in the text after one
//! is delivered is reported as [`Via::Signal`] (a handler entry is not a
//! control transfer of the code). The programs must be single-threaded (a
//! second thread would not be traced and would fault on the text); a clone
//! is reported as an error.
//!
//! `PTRACE_O_EXITKILL` plus a drop guard kill the program if the tracer
//! fails or panics.
//!
//! ## Cost
//!
//! One single step is a trap, two context switches and three syscalls:
//! about 12 us on the 2-core test VM (the floor measured with a minimal C
//! tracer), 13-15 us here. The tracer pins itself and the tracee to one CPU
//! (cross-CPU wake-ups cost more), so keep traced workloads to a few million
//! instructions in the executable. `rep` string instructions trap once per
//! iteration (`rip` stays on the instruction).

use std::ffi::c_void;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// How control came (back) into the main executable from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Via {
    /// Outside code called or jumped into the text.
    Call,
    /// Outside code returned into the text (`[rsp - 8] == rip`).
    Return,
    /// The first instruction after a signal was delivered.
    Signal,
}

/// What the tracer observed, in SVMAs of the main executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// `prev` executed and the next instruction is `cur`, both in the text.
    Step { prev: u64, cur: u64 },
    /// `prev` executed and the next instruction is outside the text.
    Leave { prev: u64 },
    /// The next instruction is `cur`, in the text, after code outside ran.
    Enter { cur: u64, via: Via },
}

/// Receives the events.
pub trait Observer {
    fn event(&mut self, e: Event);
}

/// How the traced program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    Signaled(i32),
}

/// Counters of one traced run.
#[derive(Clone, Debug, Default)]
pub struct TraceStats {
    /// Single steps that ended inside the text.
    pub steps_inside: u64,
    /// Times execution left the text (outside code then ran at full speed).
    pub leaves: u64,
    /// Signals passed on to the program.
    pub signals: u64,
    /// Bias (AVMA - SVMA) of the main executable.
    pub bias: u64,
    /// Wall time of the traced run.
    pub elapsed: Duration,
}

/// Result of [`trace`].
#[derive(Clone, Debug)]
pub struct Traced {
    pub ended: Ended,
    pub stats: TraceStats,
}

/// Kills and reaps the tracee unless it was reaped already.
struct Guard {
    pid: libc::pid_t,
    reaped: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: plain syscalls on our own child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                let mut st = 0;
                libc::waitpid(self.pid, &mut st, libc::__WALL);
            }
        }
    }
}

/// Pins the calling thread to one CPU (the tracee, forked from it,
/// inherits the pin) and restores the thread's mask on drop. Tracer and
/// tracee then hand the CPU to each other at every step instead of waking
/// each other across CPUs (an inter-processor interrupt per step, costly in
/// a VM). Tracers on different threads take different CPUs in turn; one
/// thread keeps its CPU.
struct Pin {
    old: libc::cpu_set_t,
}

impl Pin {
    fn new() -> Option<Pin> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        // SAFETY: cpu_set_t is plain old data; the sched_* calls get valid
        // pointers and sizes and act on the calling thread only.
        unsafe {
            let mut old: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            if libc::sched_getaffinity(0, size, &mut old) != 0 {
                return None;
            }
            let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &old))
                .collect();
            if allowed.is_empty() {
                return None;
            }
            thread_local! {
                static N: usize = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let n = N.with(|n| *n);
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(allowed[n % allowed.len()], &mut one);
            (libc::sched_setaffinity(0, size, &one) == 0).then_some(Pin { old })
        }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: restores the mask read in `new` on the same thread.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.old);
        }
    }
}

/// The kernel's answer to one `waitpid`.
enum Stop {
    Exited(Ended),
    /// Stopped with this signal (`SIGTRAP` for steps and breakpoints).
    Signal(i32),
    /// A ptrace event stop (`status >> 16`).
    PtraceEvent(i32),
}

struct Tracee {
    pid: libc::pid_t,
    guard: Guard,
}

impl Tracee {
    fn wait(&mut self) -> Result<Stop> {
        let stop = wait_raw(self.pid)?;
        if matches!(stop, Stop::Exited(_)) {
            self.guard.reaped = true;
        }
        Ok(stop)
    }

    fn request(&self, req: libc::c_uint, addr: usize, data: usize, what: &str) -> Result<()> {
        // SAFETY: ptrace requests on our stopped tracee; `data` is either a
        // value or points at memory of the right type for `req`.
        let r = unsafe { libc::ptrace(req, self.pid, addr as *mut c_void, data as *mut c_void) };
        if r == -1 {
            return Err(std::io::Error::last_os_error()).with_context(|| what.to_string());
        }
        Ok(())
    }

    fn step(&self, sig: i32) -> Result<()> {
        self.request(
            libc::PTRACE_SINGLESTEP,
            0,
            sig as usize,
            "PTRACE_SINGLESTEP",
        )
    }

    fn cont(&self, sig: i32) -> Result<()> {
        self.request(libc::PTRACE_CONT, 0, sig as usize, "PTRACE_CONT")
    }

    fn regs(&self) -> Result<libc::user_regs_struct> {
        // SAFETY: user_regs_struct is plain old data.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        self.request(
            libc::PTRACE_GETREGS,
            0,
            &mut regs as *mut _ as usize,
            "PTRACE_GETREGS",
        )?;
        Ok(regs)
    }

    fn set_regs(&self, regs: &libc::user_regs_struct) -> Result<()> {
        self.request(
            libc::PTRACE_SETREGS,
            0,
            regs as *const _ as usize,
            "PTRACE_SETREGS",
        )
    }

    fn peek(&self, addr: u64) -> Result<u64> {
        // SAFETY: errno is thread-local; PEEKDATA returns the word, or -1
        // with errno set.
        unsafe {
            *libc::__errno_location() = 0;
            let v = libc::ptrace(
                libc::PTRACE_PEEKDATA,
                self.pid,
                addr as *mut c_void,
                std::ptr::null_mut::<c_void>(),
            );
            if v == -1 && *libc::__errno_location() != 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("PTRACE_PEEKDATA {addr:#x}"));
            }
            Ok(v as u64)
        }
    }

    /// Make the tracee run `syscall(nr, a0, a1, a2)` at `gadget` (the AVMA
    /// of a `syscall` instruction) and return its result; registers are
    /// restored. A signal arriving meanwhile is returned in `pending`.
    fn inject_syscall(
        &mut self,
        gadget: u64,
        nr: i64,
        args: [u64; 3],
        pending: &mut i32,
    ) -> Result<i64> {
        let saved = self.regs()?;
        let mut r = saved;
        r.rax = nr as u64;
        r.orig_rax = u64::MAX;
        r.rdi = args[0];
        r.rsi = args[1];
        r.rdx = args[2];
        r.rip = gadget;
        self.set_regs(&r)?;
        loop {
            self.step(0)?;
            match self.wait()? {
                Stop::Signal(libc::SIGTRAP) => break,
                Stop::Signal(s) => {
                    // Not executed yet: keep the signal for later, retry.
                    *pending = s;
                }
                Stop::Exited(e) => bail!("tracee ended during an injected syscall: {e:?}"),
                Stop::PtraceEvent(ev) => bail!("ptrace event {ev} during an injected syscall"),
            }
        }
        let r = self.regs()?;
        ensure!(
            r.rip == gadget + 2,
            "injected syscall stopped at {:#x}, not after the gadget",
            r.rip
        );
        self.set_regs(&saved)?;
        Ok(r.rax as i64)
    }
}

fn wait_raw(pid: libc::pid_t) -> Result<Stop> {
    let mut st: libc::c_int = 0;
    loop {
        // SAFETY: waitpid on our child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        if r == -1 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("waitpid");
        }
        break;
    }
    if libc::WIFEXITED(st) {
        return Ok(Stop::Exited(Ended::Exited(libc::WEXITSTATUS(st))));
    }
    if libc::WIFSIGNALED(st) {
        return Ok(Stop::Exited(Ended::Signaled(libc::WTERMSIG(st))));
    }
    ensure!(libc::WIFSTOPPED(st), "unexpected wait status {st:#x}");
    if st >> 16 != 0 {
        return Ok(Stop::PtraceEvent(st >> 16));
    }
    Ok(Stop::Signal(libc::WSTOPSIG(st)))
}

/// The process layout the tracer needs, read at the exec stop.
struct Layout {
    /// The executable mappings of the main executable, `[start, end)` AVMAs.
    text: Vec<(u64, u64)>,
    /// AVMA - SVMA of the main executable.
    bias: u64,
    /// AVMA of a `syscall` instruction (`0f 05`) outside the text, in a
    /// mapping that stays for the life of the process (the dynamic loader).
    gadget: u64,
}

fn layout(pid: libc::pid_t, exe: &Path) -> Result<Layout> {
    use std::os::unix::fs::FileExt;
    let data = std::fs::read(exe).with_context(|| format!("reading {}", exe.display()))?;
    let info = userspace_rewriter::analysis::elf::ElfInfo::parse(&data[..])?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut text = Vec::new();
    let mut bias = None;
    let mut gadget = None;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') {
            continue;
        }
        let (s, e) = f[0].split_once('-').context("maps range")?;
        let start = u64::from_str_radix(s, 16)?;
        let end = u64::from_str_radix(e, 16)?;
        let off = u64::from_str_radix(f[2], 16)?;
        if Path::new(f[5]) == exe {
            let b = info
                .load_bias_for(start, off, true)
                .context("no PT_LOAD for the text mapping")?;
            ensure!(bias.is_none_or(|x| x == b), "inconsistent load bias");
            bias = Some(b);
            text.push((start, end));
        } else if gadget.is_none() && f[5].starts_with('/') {
            let mut buf = vec![0u8; (end - start) as usize];
            mem.read_exact_at(&mut buf, start)
                .with_context(|| format!("reading {} in the tracee", f[5]))?;
            gadget = buf
                .windows(2)
                .position(|w| w == [0x0f, 0x05])
                .map(|i| start + i as u64);
        }
    }
    Ok(Layout {
        bias: bias.with_context(|| format!("{} has no executable mapping", exe.display()))?,
        text,
        gadget: gadget.context("no `syscall` instruction outside the executable")?,
    })
}

/// Run `cmd` (whose program is the ELF file `exe`) under the tracer,
/// reporting to `obs` (see the module docs). `cmd`'s stdio is the caller's
/// business. Must be called on the thread that owns the test (ptrace ties
/// the tracee to the thread that spawned it).
pub fn trace(cmd: &mut Command, exe: &Path, obs: &mut dyn Observer) -> Result<Traced> {
    let exe: PathBuf = std::fs::canonicalize(exe)?;
    // SAFETY: PTRACE_TRACEME is async-signal-safe; it only marks this
    // process as traced by its parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(
                libc::PTRACE_TRACEME,
                0,
                std::ptr::null_mut::<c_void>(),
                std::ptr::null_mut::<c_void>(),
            ) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let _pin = Pin::new();
    let child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
    let pid = child.id() as libc::pid_t;
    drop(child); // reaped by `Tracee::wait` or the guard
    let mut t = Tracee {
        pid,
        guard: Guard { pid, reaped: false },
    };
    match t.wait()? {
        Stop::Signal(libc::SIGTRAP) => {}
        Stop::Exited(e) => bail!("{} ended before exec: {e:?}", exe.display()),
        _ => bail!("unexpected first stop"),
    }
    t.request(
        libc::PTRACE_SETOPTIONS,
        0,
        (libc::PTRACE_O_EXITKILL | libc::PTRACE_O_TRACECLONE) as usize,
        "PTRACE_SETOPTIONS",
    )?;
    let lay = layout(pid, &exe)?;
    let bias = lay.bias;
    let inside = |avma: u64| lay.text.iter().any(|&(s, e)| avma >= s && avma < e);
    let mut stats = TraceStats {
        bias,
        ..TraceStats::default()
    };
    // Signal to deliver with the next resume.
    let mut sig = 0;
    let protect = |t: &mut Tracee, prot: i32, sig: &mut i32| -> Result<()> {
        for &(s, e) in &lay.text {
            let r =
                t.inject_syscall(lay.gadget, libc::SYS_mprotect, [s, e - s, prot as u64], sig)?;
            ensure!(
                r == 0,
                "injected mprotect({s:#x}, {:#x}, {prot}) = {r}",
                e - s
            );
        }
        Ok(())
    };
    // Until the entry point, the dynamic loader runs outside the text.
    protect(&mut t, libc::PROT_READ, &mut sig)?;
    // `Some(AVMA)` of the instruction about to be stepped when in the text,
    // `None` when running outside it.
    let mut prev: Option<u64> = None;
    loop {
        let delivered = sig != 0;
        if prev.is_some() {
            t.step(sig)?;
        } else {
            t.cont(sig)?;
        }
        sig = 0;
        let stop = t.wait()?;
        let s = match stop {
            Stop::Exited(e) => {
                stats.elapsed = start.elapsed();
                return Ok(Traced { ended: e, stats });
            }
            Stop::PtraceEvent(ev) => bail!(
                "ptrace event {ev} (a clone?): the tracer handles single-threaded programs only"
            ),
            Stop::Signal(s) => s,
        };
        match (prev, s) {
            (None, libc::SIGSEGV) => {
                let regs = t.regs()?;
                if !inside(regs.rip) {
                    // A real crash outside: deliver it.
                    stats.signals += 1;
                    sig = s;
                    continue;
                }
                protect(&mut t, libc::PROT_READ | libc::PROT_EXEC, &mut sig)?;
                // A `ret` leaves the address it popped just below the stack
                // pointer; a call or jump into the text leaves no such trace.
                let via = if delivered {
                    Via::Signal
                } else if t.peek(regs.rsp.wrapping_sub(8))? == regs.rip {
                    Via::Return
                } else {
                    Via::Call
                };
                stats.steps_inside += 1;
                obs.event(Event::Enter {
                    cur: regs.rip.wrapping_sub(bias),
                    via,
                });
                prev = Some(regs.rip);
            }
            (Some(p), libc::SIGTRAP) => {
                let regs = t.regs()?;
                let rip = regs.rip;
                if inside(rip) {
                    stats.steps_inside += 1;
                    obs.event(if delivered {
                        Event::Enter {
                            cur: rip.wrapping_sub(bias),
                            via: Via::Signal,
                        }
                    } else {
                        Event::Step {
                            prev: p.wrapping_sub(bias),
                            cur: rip.wrapping_sub(bias),
                        }
                    });
                    prev = Some(rip);
                } else {
                    stats.leaves += 1;
                    obs.event(Event::Leave {
                        prev: p.wrapping_sub(bias),
                    });
                    protect(&mut t, libc::PROT_READ, &mut sig)?;
                    prev = None;
                }
            }
            (None, libc::SIGTRAP) => bail!(
                "SIGTRAP outside the text at {:#x} while running at full speed",
                t.regs()?.rip
            ),
            (_, s) => {
                // Signal-delivery-stop: nothing executed; deliver it with the
                // next resume.
                stats.signals += 1;
                sig = s;
            }
        }
    }
}
