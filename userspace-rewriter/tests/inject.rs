//! `userspace_rewriter::inject` on real processes: the C fixture
//! `tests/fixtures/inject_target.c` (compiled here with `cc -O2`) prints a
//! deterministic stdout; every test attaches to it while it runs (blocked in
//! `nanosleep`, `read`, futex waits, or computing), injects, detaches, and
//! checks the effect *and* that the program printed byte for byte what an
//! untraced run prints. Needs root (ptrace of a non-child works as root
//! whatever `ptrace_scope` says, up to 2).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use userspace_rewriter::analysis::elf::ElfInfo;
use userspace_rewriter::inject::{
    self, InjectError, KernelSigaction, Pid, SA_RESTORER, Tracee, find_gap_near, free_signal,
    shadow_stack_enabled,
};

const SYS_CLOCK_NANOSLEEP: u64 = 230;
const SYS_FUTEX: u64 = 202;
const SYS_READ: u64 = 0;
const ERESTARTSYS: i64 = -512;
const ERESTART_RESTARTBLOCK: i64 = -516;
const SIGRTMAX: i32 = 64;

/// The fixture, compiled once per test process.
fn fixture() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("inject-fixtures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("inject_target");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inject_target.c");
        let st = Command::new("cc")
            .args(["-O2", "-pthread", "-Wall", "-o"])
            .arg(&exe)
            .arg(&src)
            .status()
            .expect("cc (the tests need a C compiler)");
        assert!(st.success(), "cc {} failed", src.display());
        std::fs::canonicalize(exe).unwrap()
    })
}

/// A running fixture: stdout collected in the background.
struct Running {
    child: Child,
    out: Option<JoinHandle<Vec<u8>>>,
    _err: BufReader<ChildStderr>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        let mut child = Command::new(fixture())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut v = Vec::new();
            stdout.read_to_end(&mut v).unwrap();
            v
        });
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n", "fixture {args:?} did not start");
        Running {
            child,
            out: Some(out),
            _err: err,
        }
    }

    fn pid(&self) -> Pid {
        Pid(self.child.id())
    }

    fn write_stdin(&mut self, data: &[u8]) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(data).unwrap();
        stdin.flush().unwrap();
    }

    /// Close stdin, wait for the exit (60 s at most), return stdout.
    fn finish(mut self) -> String {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "fixture did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = String::from_utf8(self.out.take().unwrap().join().unwrap()).unwrap();
        assert!(status.success(), "fixture failed: {status}; stdout:\n{out}");
        out
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stdout of an untraced run with `input` on stdin.
fn reference(args: &[&str], input: &[u8]) -> String {
    let mut child = Command::new(fixture())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn assert_same_output(traced: &str, untraced: &str) {
    assert!(
        traced == untraced,
        "output differs from the untraced run\n--- traced ---\n{traced}\n--- untraced ---\n{untraced}"
    );
}

/// [lo, hi) of the fixture binary's mappings in `pid`.
fn binary_range(pid: Pid) -> (u64, u64) {
    let exe = fixture().to_str().unwrap();
    let m: Vec<_> = inject::maps(pid)
        .unwrap()
        .into_iter()
        .filter(|m| m.is_path(exe))
        .collect();
    assert!(!m.is_empty(), "{exe} not mapped in {pid}");
    (
        m.iter().map(|m| m.start).min().unwrap(),
        m.iter().map(|m| m.end).max().unwrap(),
    )
}

/// AVMA of symbol `name` of the ELF file mapped in `pid` whose path
/// satisfies `which` (symtab, then dynsym; bias from its executable mapping).
fn symbol(pid: Pid, which: impl Fn(&str) -> bool, name: &str) -> u64 {
    use object::{Object, ObjectSymbol};
    let maps = inject::maps(pid).unwrap();
    let m = maps
        .iter()
        .find(|m| m.is_exec() && m.path.as_deref().is_some_and(&which))
        .expect("module not mapped");
    let path = m.path.as_deref().unwrap();
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let svma = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("{name} not in {path}"))
        .address();
    let bias = ElfInfo::parse(&data[..])
        .unwrap()
        .load_bias_for(m.start, m.offset, true)
        .unwrap();
    svma.wrapping_add(bias)
}

fn fixture_symbol(pid: Pid, name: &str) -> u64 {
    let exe = fixture().to_str().unwrap();
    symbol(pid, |p| p == exe, name)
}

fn libc_symbol(pid: Pid, name: &str) -> u64 {
    symbol(pid, |p| p.contains("/libc.so"), name)
}

fn within_rel32(lo: u64, hi: u64, start: u64, end: u64) -> bool {
    hi.max(end) - lo.min(start) <= 1 << 31
}

#[test]
fn attach_inject_and_detach_while_in_nanosleep() {
    let args = ["sleep", "60"];
    let want = reference(&args, b"");
    let run = Running::start(&args);
    let pid = run.pid();
    std::thread::sleep(Duration::from_millis(150));
    assert!(!shadow_stack_enabled(pid));
    // SIGRTMAX is caught, SIGRTMAX-1 blocked: the first free one is 62.
    assert_eq!(free_signal(pid).unwrap(), SIGRTMAX - 2);

    let mut t = Tracee::attach(pid).unwrap();
    assert_eq!(t.pid(), pid);
    assert_eq!(t.threads(), &[pid.raw()]);
    let regs = *t.regs(pid.raw());
    // The main thread spends nearly all its time in nanosleep.
    eprintln!(
        "stopped at rip {:#x}, orig_rax {}, rax {}",
        regs.rip, regs.orig_rax as i64, regs.rax as i64
    );

    assert_eq!(t.syscall(libc::SYS_getpid, &[]).unwrap(), u64::from(pid.0));
    assert_eq!(t.syscall(libc::SYS_gettid, &[]).unwrap(), u64::from(pid.0));
    // Errors come back as errno.
    match t.syscall(libc::SYS_close, &[9999]) {
        Err(InjectError::Syscall { errno, .. }) => assert_eq!(errno, libc::EBADF),
        other => panic!("close(9999): {other:?}"),
    }

    // A region within rel32 reach of the binary.
    let (lo, hi) = binary_range(pid);
    let gap = find_gap_near(pid, lo, hi, 8192, &[]).unwrap();
    let region = t
        .mmap(
            gap,
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
        .unwrap();
    assert_eq!(region, gap);
    let code: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
    t.write_memory(region + 100, &code).unwrap();
    t.mprotect(region, 8192, libc::PROT_READ | libc::PROT_EXEC)
        .unwrap();
    // /proc/PID/mem writes through the missing write permission.
    t.write_memory(region + 4096, b"\x90\xc3").unwrap();
    assert_eq!(t.read_memory(region + 100, code.len()).unwrap(), code);
    assert_eq!(t.read_memory(region + 4096, 2).unwrap(), b"\x90\xc3");
    let m = inject::maps(pid)
        .unwrap()
        .into_iter()
        .find(|m| m.start == region)
        .expect("region not in /proc/PID/maps");
    assert_eq!((m.end, &m.perms), (region + 8192, b"r-xp"));
    assert!(
        within_rel32(lo, hi, m.start, m.end),
        "{m:?} out of reach of [{lo:#x}, {hi:#x})"
    );
    // MAP_FIXED_NOREPLACE: never over an existing mapping.
    match t.mmap(
        region,
        4096,
        libc::PROT_READ,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
        0,
    ) {
        Err(InjectError::Syscall { errno, .. }) => assert_eq!(errno, libc::EEXIST),
        other => panic!("mmap over the region: {other:?}"),
    }

    // The fixture's SIGRTMAX handler, read back.
    let old = t.rt_sigaction(SIGRTMAX, None).unwrap();
    assert_eq!(old.handler, fixture_symbol(pid, "rtmax_handler"));

    // Calls: libc's getpid, a fixture function with six arguments, one that
    // destroys every vector register.
    let getpid = libc_symbol(pid, "getpid");
    assert_eq!(t.call(getpid, &[]).unwrap(), u64::from(pid.0));
    let probe_add = fixture_symbol(pid, "probe_add");
    assert_eq!(t.call(probe_add, &[1, 2, 3, 4, 5, 6]).unwrap(), 91);
    assert_eq!(t.call(fixture_symbol(pid, "clobber_fp"), &[]).unwrap(), 7);
    let calls = t
        .read_memory(fixture_symbol(pid, "probe_calls"), 8)
        .unwrap();
    assert_eq!(u64::from_le_bytes(calls.try_into().unwrap()), 1);

    // Registers are exactly as they were before all this.
    let now = *t.regs(pid.raw());
    assert_eq!(
        (now.rip, now.rax, now.orig_rax, now.rsp),
        (regs.rip, regs.rax, regs.orig_rax, regs.rsp)
    );
    t.munmap(region, 8192).unwrap();
    assert!(
        !inject::maps(pid)
            .unwrap()
            .iter()
            .any(|m| m.start < region + 8192 && region < m.end)
    );
    t.detach().unwrap();
    assert_same_output(&run.finish(), &want);
}

/// 20 attach/detach cycles on one process, each with syscalls and a call:
/// the program's output does not change, and the main thread was caught
/// inside `clock_nanosleep` (-ERESTART_RESTARTBLOCK) most of the time.
#[test]
fn twenty_attach_detach_cycles() {
    let args = ["sleep", "70"];
    let want = reference(&args, b"");
    let run = Running::start(&args);
    let pid = run.pid();
    let mut in_sleep = 0;
    for i in 0..20 {
        std::thread::sleep(Duration::from_millis(25 + (i * 7) % 20));
        let mut t = Tracee::attach(pid).unwrap();
        let r = *t.regs(pid.raw());
        if r.orig_rax == SYS_CLOCK_NANOSLEEP && r.rax as i64 == ERESTART_RESTARTBLOCK {
            in_sleep += 1;
        }
        assert_eq!(t.syscall(libc::SYS_getpid, &[]).unwrap(), u64::from(pid.0));
        let a = t
            .mmap(
                0,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
            .unwrap();
        t.write_memory(a, &[i as u8; 16]).unwrap();
        assert_eq!(t.read_memory(a, 16).unwrap(), vec![i as u8; 16]);
        t.munmap(a, 4096).unwrap();
        let probe_add = fixture_symbol(pid, "probe_add");
        assert_eq!(t.call(probe_add, &[i, 0, 0, 0, 0, 1]).unwrap(), i + 6);
        t.detach().unwrap();
    }
    assert!(
        in_sleep >= 10,
        "only {in_sleep} of 20 attaches caught the thread in clock_nanosleep"
    );
    assert_same_output(&run.finish(), &want);
}

/// The full injection of a signal handler: a region near the binary with
/// the handler and its restorer, a memfd shared with the tracer as the
/// handler's counter, `rt_sigaction` on a free signal. The fixture is
/// blocked in `read(2)` on its stdin throughout; after detach 300 signals
/// run the handler 300 times and the read restarts (SA_RESTART) each time.
#[test]
fn injected_signal_handler_counts_in_shared_memfd() {
    let args = ["pipe"];
    let lines: Vec<String> = (0..40).map(|i| format!("line number {i}")).collect();
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let want = reference(&args, input.as_bytes());
    let mut run = Running::start(&args);
    let pid = run.pid();
    run.write_stdin(format!("{}\n", lines[0]).as_bytes());
    std::thread::sleep(Duration::from_millis(150));

    let sig = free_signal(pid).unwrap();
    assert_eq!(sig, SIGRTMAX - 2);
    let mut t = Tracee::attach(pid).unwrap();
    let r = *t.regs(pid.raw());
    assert_eq!(
        (r.orig_rax, r.rax as i64),
        (SYS_READ, ERESTARTSYS),
        "the fixture should be blocked in read(0)"
    );

    // Shared memory: a memfd mapped MAP_SHARED in the target, opened by us.
    let fd = t
        .memfd_create("burstyd-inject-test", libc::MFD_CLOEXEC)
        .unwrap();
    assert!(fd >= 3);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .unwrap();
    file.set_len(4096).unwrap();
    let shared = t
        .mmap(
            0,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
        .unwrap();
    t.close(fd).unwrap();
    t.write_memory(shared, b"hello from the tracee's side")
        .unwrap();
    let mut seen = [0u8; 28];
    file.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(&seen, b"hello from the tracee's side");
    let counter = shared + 64;

    // The handler and restorer in a region near the binary.
    let (lo, hi) = binary_range(pid);
    let region = t
        .mmap(
            find_gap_near(pid, lo, hi, 4096, &[]).unwrap(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
        .unwrap();
    let mut code = vec![0x48, 0xb8]; // mov rax, counter
    code.extend_from_slice(&counter.to_le_bytes());
    code.extend_from_slice(&[0xf0, 0x48, 0xff, 0x00]); // lock inc qword [rax]
    code.push(0xc3); // ret
    let restorer = region + 32;
    t.write_memory(region, &code).unwrap();
    t.write_memory(restorer, &[0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05]) // mov eax, 15; syscall
        .unwrap();
    t.mprotect(region, 4096, libc::PROT_READ | libc::PROT_EXEC)
        .unwrap();
    assert!(within_rel32(lo, hi, region, region + 4096));
    let act = KernelSigaction {
        handler: region,
        flags: (libc::SA_SIGINFO | libc::SA_RESTART) as u64 | SA_RESTORER,
        restorer,
        mask: 0,
    };
    let old = t.rt_sigaction(sig, Some(&act)).unwrap();
    assert_eq!(old, KernelSigaction::default(), "signal {sig} was in use");
    assert_eq!(t.rt_sigaction(sig, None).unwrap(), act);
    // Signals sent while the process is held stay pending through further
    // injections and are handled after detach.
    for _ in 0..5 {
        // SAFETY: kill has no memory preconditions.
        assert_eq!(unsafe { libc::kill(pid.raw(), sig) }, 0);
    }
    assert_eq!(t.syscall(libc::SYS_getpid, &[]).unwrap(), u64::from(pid.0));
    t.detach().unwrap();
    // Now the signal is caught: no longer free.
    assert_eq!(free_signal(pid).unwrap(), SIGRTMAX - 3);

    let count = || {
        let mut b = [0u8; 8];
        file.read_exact_at(&mut b, 64).unwrap();
        u64::from_le_bytes(b)
    };
    let mut next = 1;
    for i in 0..295 {
        // SAFETY: kill has no memory preconditions.
        assert_eq!(unsafe { libc::kill(pid.raw(), sig) }, 0);
        if i % 10 == 9 {
            run.write_stdin(format!("{}\n", lines[next]).as_bytes());
            next += 1;
        }
        if i % 3 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while count() < 300 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(count(), 300, "the injected handler ran {} times", count());
    for l in &lines[next..] {
        run.write_stdin(format!("{l}\n").as_bytes());
    }
    assert_same_output(&run.finish(), &want);
    assert_eq!(count(), 300);
}

/// Four threads (two in futex waits, two computing) and the main thread in
/// nanosleep: all are stopped, per-thread blocked signals are seen, and ten
/// attach/inject/call/detach cycles leave the output unchanged.
#[test]
fn multithreaded_process() {
    let args = ["threads", "60"];
    let want = reference(&args, b"");
    let run = Running::start(&args);
    let pid = run.pid();
    std::thread::sleep(Duration::from_millis(150));
    // Thread 0 of the fixture blocks SIGRTMAX-2 too.
    assert_eq!(free_signal(pid).unwrap(), SIGRTMAX - 3);
    {
        let mut t = Tracee::attach(pid).unwrap();
        assert_eq!(t.threads().len(), 5, "threads: {:?}", t.threads());
        assert_eq!(t.threads()[0], pid.raw());
        let futex = t
            .threads()
            .iter()
            .filter(|&&tid| t.regs(tid).orig_rax == SYS_FUTEX)
            .count();
        assert!(futex >= 2, "{futex} threads in futex");
        let busy = t
            .threads()
            .iter()
            .filter(|&&tid| t.regs(tid).orig_rax == u64::MAX)
            .count();
        assert!(busy >= 2, "{busy} threads in user mode");
        // A tid is not a process.
        let other = Pid(t.threads()[1] as u32);
        assert!(matches!(
            Tracee::attach(other),
            Err(InjectError::NotAProcess { .. })
        ));
        assert_eq!(t.syscall(libc::SYS_gettid, &[]).unwrap(), u64::from(pid.0));
        let probe_add = fixture_symbol(pid, "probe_add");
        assert_eq!(t.call(probe_add, &[0, 0, 0, 0, 0, 7]).unwrap(), 42);
        t.detach().unwrap();
    }
    for i in 0..10u64 {
        std::thread::sleep(Duration::from_millis(40));
        let mut t = Tracee::attach(pid).unwrap();
        assert!(t.threads().len() >= 3);
        assert_eq!(t.syscall(libc::SYS_getpid, &[]).unwrap(), u64::from(pid.0));
        let probe_add = fixture_symbol(pid, "probe_add");
        assert_eq!(t.call(probe_add, &[i, 0, 0, 0, 0, 0]).unwrap(), i);
        t.detach().unwrap();
    }
    assert_same_output(&run.finish(), &want);
}

/// A thread stopped in the middle of floating-point work (its values live
/// in xmm registers) survives a call of a function that destroys every
/// vector register.
#[test]
fn call_preserves_vector_registers() {
    let args = ["fpbusy"];
    let want = reference(&args, b"");
    let run = Running::start(&args);
    let pid = run.pid();
    let clobber = fixture_symbol(pid, "clobber_fp");
    let mut user_mode = 0;
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(60));
        let mut t = Tracee::attach(pid).unwrap();
        if t.regs(pid.raw()).orig_rax == u64::MAX {
            user_mode += 1;
        }
        assert_eq!(t.call(clobber, &[]).unwrap(), 7);
        t.detach().unwrap();
    }
    assert!(user_mode >= 3, "caught in user mode only {user_mode} times");
    assert_same_output(&run.finish(), &want);
}

/// A call that never returns times out, one that faults is reported; both
/// leave the thread as it was and the program unharmed.
#[test]
fn call_timeout_and_fault() {
    let args = ["sleep", "40"];
    let want = reference(&args, b"");
    let run = Running::start(&args);
    let pid = run.pid();
    std::thread::sleep(Duration::from_millis(100));
    let mut t = Tracee::attach(pid).unwrap();
    let before = *t.regs(pid.raw());
    t.set_call_timeout(Duration::from_millis(300));
    let spin = fixture_symbol(pid, "spin_forever");
    let started = Instant::now();
    match t.call(spin, &[]) {
        Err(InjectError::CallTimeout { func, .. }) => assert_eq!(func, spin),
        other => panic!("spin_forever: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    match t.call(0x10, &[]) {
        Err(InjectError::CallFaulted { signal, rip, .. }) => {
            assert_eq!((signal, rip), (libc::SIGSEGV, 0x10));
        }
        other => panic!("call of 0x10: {other:?}"),
    }
    assert_eq!(t.syscall(libc::SYS_getpid, &[]).unwrap(), u64::from(pid.0));
    let getpid = libc_symbol(pid, "getpid");
    assert_eq!(t.call(getpid, &[]).unwrap(), u64::from(pid.0));
    assert_eq!(t.regs(pid.raw()).rip, before.rip);
    // Dropping without detach lets the process go too.
    drop(t);
    assert_same_output(&run.finish(), &want);
}

#[test]
fn attach_errors() {
    // No such process (above any pid_max).
    assert!(matches!(
        Tracee::attach(Pid(0x3fff_fff0)),
        Err(InjectError::NoSuchProcess(Pid(0x3fff_fff0)))
    ));
    assert!(matches!(
        Tracee::attach(Pid(0)),
        Err(InjectError::NoSuchProcess(Pid(0)))
    ));
    assert!(matches!(
        Tracee::attach(Pid(std::process::id())),
        Err(InjectError::OwnProcess(_))
    ));
    assert!(matches!(
        free_signal(Pid(0x3fff_fff0)),
        Err(InjectError::NoSuchProcess(_))
    ));

    // A zombie.
    let mut z = Command::new("true").spawn().unwrap();
    let zpid = Pid(z.id());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{zpid}/stat"))
        .unwrap()
        .contains(") Z ")
    {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    match Tracee::attach(zpid) {
        Err(e @ InjectError::Zombie(_)) => eprintln!("{e}"),
        other => panic!("attach to a zombie: {:?}", other.err()),
    }
    z.wait().unwrap();

    // A process another tracer holds: the fixture's child, PTRACE_TRACEME'd
    // to the fixture.
    let mut parent = Command::new(fixture())
        .arg("traced")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(parent.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child = Pid(line.trim().parse().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    let tracer = loop {
        let st = std::fs::read_to_string(format!("/proc/{child}/status")).unwrap();
        let tp: i32 = st
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if tp != 0 {
            break tp;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(tracer, parent.id() as i32);
    match Tracee::attach(child) {
        Err(e @ InjectError::AlreadyTraced { .. }) => {
            eprintln!("{e}");
            assert!(
                matches!(e, InjectError::AlreadyTraced { pid, tracer: t } if pid == child && t == tracer)
            );
        }
        other => panic!("attach to a traced process: {:?}", other.err()),
    }
    drop(parent.stdin.take());
    assert!(parent.wait().unwrap().success());
}

/// A signal the thread takes while running an injected call (here a
/// `kill -SEGV`, which the call does not block) is given back at detach with
/// its siginfo: the program dies of it, as it would have untraced.
#[test]
fn signal_taken_during_call_is_redelivered() {
    let mut run = Running::start(&["sleep", "100"]);
    let pid = run.pid();
    std::thread::sleep(Duration::from_millis(100));
    let mut t = Tracee::attach(pid).unwrap();
    t.set_call_timeout(Duration::from_millis(600));
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(pid.raw(), libc::SIGSEGV) }
    });
    let spin = fixture_symbol(pid, "spin_forever");
    assert!(matches!(
        t.call(spin, &[]),
        Err(InjectError::CallTimeout { .. })
    ));
    assert_eq!(killer.join().unwrap(), 0);
    t.detach().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let st = run.child.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGSEGV), "{st}");
}
