//! Shared helpers for burstyd's end-to-end tests (tests/tests/*.rs).
//!
//! Everything here is real: fixtures are C programs compiled with gcc at test
//! time, burstyd is the built binary, profiles are read both directly
//! ([`pprof`]) and with the reference reader `go tool pprof` ([`gopprof`]).

pub mod accuracy;
pub mod gopprof;
pub mod pprof;
pub mod summary;
pub mod tracer;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use gopprof::{TopRow, TraceSample};
pub use pprof::{Frame, Profile, Sample};
pub use summary::{Summary, read_summary};

/// The workspace root (parent of tests/).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// burstyd's binary: $BURSTYD_BIN, else target/release/burstyd, else
/// target/debug/burstyd.
pub fn burstyd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("BURSTYD_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "BURSTYD_BIN={} does not exist", p.display());
        return p;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    for profile in ["release", "debug"] {
        let p = target.join(profile).join("burstyd");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "burstyd binary not found (looked at $BURSTYD_BIN, {0}/release/burstyd, {0}/debug/burstyd): \
         build it with `cargo build --release -p burstyd`",
        target.display()
    );
}

/// Fails (never skips) when not root: these tests load eBPF programs.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "burstyd's end-to-end tests need root (they load eBPF programs and open perf events); \
         run them as root, e.g. `sudo -E cargo test -p burstyd-tests`"
    );
}

/// A scratch directory under target/burstyd-tests/, removed on drop unless
/// the test panicked (so failing profiles stay around to look at).
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = workspace_root()
            .join("target/burstyd-tests/scratch")
            .join(format!("{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Scratch { path }
    }
    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("(keeping {} for inspection)", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

// ---------------------------------------------------------------------------
// Fixtures

/// Compiles tests/fixtures/NAME.c (gcc) or NAME.cpp (g++) with
/// `-O2 -fomit-frame-pointer -g` (plus the flags on a `// link: ...` line of
/// the source, e.g. `-lm`) once per test binary, and returns the
/// executable's path. The executable is named NAME (so the process's comm is
/// NAME) in a directory keyed by a hash of the source and flags under
/// target/burstyd-tests/fixtures/.
pub fn fixture(name: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let dir = workspace_root().join("tests/fixtures");
    let (src, compiler) = if dir.join(format!("{name}.c")).is_file() {
        (dir.join(format!("{name}.c")), "gcc")
    } else {
        (dir.join(format!("{name}.cpp")), "g++")
    };
    let text =
        std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
    let cflags = ["-O2", "-fomit-frame-pointer", "-g", "-Wall"];
    let mut link: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.trim().strip_prefix("// link:") {
            link.extend(rest.split_whitespace().map(String::from));
        }
    }
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        compiler.hash(&mut h);
        cflags.hash(&mut h);
        link.hash(&mut h);
        h.finish()
    };
    let out_dir = workspace_root()
        .join("target/burstyd-tests/fixtures")
        .join(format!("{name}-{key:016x}"));
    let exe = out_dir.join(name);
    std::fs::create_dir_all(&out_dir).unwrap();
    // Build under a unique temporary name, then rename: test binaries may
    // build the same fixture concurrently.
    let tmp = out_dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let out = Command::new(compiler)
        .args(cflags)
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .args(&link)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler} (apt-get install -y gcc g++): {e}"));
    assert!(
        out.status.success(),
        "{compiler} {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &exe).unwrap();
    built.insert(name.to_string(), exe.clone());
    exe
}

/// Serializes the tests of one test binary that profile (so two burstyd
/// instances and their workloads do not compete for the 2 cores).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The GNU build id of an ELF file as lowercase hex (via `readelf -n`).
pub fn elf_build_id(path: &Path) -> Option<String> {
    let out = Command::new("readelf").arg("-n").arg(path).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        l.trim()
            .strip_prefix("Build ID:")
            .map(|s| s.trim().to_lowercase())
    })
}

/// A function name without GCC's clone/partition suffixes
/// (`handle_compress.isra.0` -> `handle_compress`, `foo.cold` -> `foo`).
pub fn base_name(name: &str) -> &str {
    let mut n = name;
    loop {
        let before = n;
        const CLONES: [&str; 6] = [
            "isra",
            "constprop",
            "part",
            "lto_priv",
            "cold",
            "localalias",
        ];
        if let Some((head, tail)) = n.rsplit_once('.') {
            if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit()) {
                if let Some((h2, kind)) = head.rsplit_once('.')
                    && CLONES.contains(&kind)
                {
                    n = h2;
                }
            } else if ["cold", "localalias"].contains(&tail) {
                n = head;
            }
        }
        if n == before {
            return n;
        }
    }
}

// ---------------------------------------------------------------------------
// Processes

/// Output of a finished command.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Finished {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// stdout and stderr, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "status: {}\n--- stdout (head) ---\n{}\n--- stderr (tail) ---\n{}",
            self.status,
            gopprof::head(&self.stdout_str(), 20),
            tail(&self.stderr, 40)
        )
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs a command to completion with a timeout (killing it and panicking on
/// expiry), capturing stdout and stderr. stdin is /dev/null.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Finished {
    let desc = format!("{cmd:?}");
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {desc}: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
            panic!(
                "timed out after {timeout:?}: {desc}\n--- stderr (tail) ---\n{}",
                tail(&stderr, 40)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    Finished {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned(),
        elapsed,
    }
}

/// A background process killed (SIGKILL) and reaped on drop.
pub struct Background {
    pub child: Child,
}

impl Background {
    pub fn spawn(cmd: &mut Command) -> Background {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        Background { child }
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// Waits until /proc/PID/exe is readable (the exec has happened).
    pub fn wait_exec(&self, exe: &Path) {
        let want = std::fs::canonicalize(exe).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if std::fs::read_link(format!("/proc/{}/exe", self.pid()))
                .ok()
                .as_deref()
                == Some(&want)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("process {} never exec'd {}", self.pid(), exe.display());
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// burstyd

/// Result of one burstyd invocation.
#[derive(Debug)]
pub struct BurstydRun {
    pub finished: Finished,
    pub out_dir: PathBuf,
}

impl BurstydRun {
    pub fn profile_path(&self) -> PathBuf {
        self.out_dir.join("context.pb.gz")
    }
    /// Asserts success and that OUT/context.pb.gz exists.
    pub fn assert_ok(&self) -> &Self {
        assert!(
            self.finished.status.success(),
            "burstyd failed:\n{}",
            self.finished.describe()
        );
        assert!(
            self.profile_path().is_file(),
            "burstyd exited 0 but wrote no {}\n{}",
            self.profile_path().display(),
            self.finished.describe()
        );
        self
    }
    /// Decodes the profile directly (fails the test on error).
    pub fn profile(&self) -> Profile {
        pprof::read_profile(&self.profile_path()).unwrap_or_else(|e| panic!("{e:#}"))
    }
    /// `go tool pprof -traces -sample_index=samples` parsed.
    pub fn traces(&self) -> Vec<TraceSample> {
        gopprof::traces(&self.profile_path(), Some("samples"))
            .unwrap_or_else(|e| panic!("{e:#}"))
            .1
    }
    /// `go tool pprof -top -sample_index=samples` parsed.
    pub fn top(&self) -> Vec<TopRow> {
        gopprof::top(&self.profile_path(), Some("samples"))
            .unwrap_or_else(|e| panic!("{e:#}"))
            .1
    }
}

/// Runs `burstyd ARGS... -o OUT` where OUT is a fresh dir in `scratch`.
/// `args` must not contain `-o`; pass the arguments before `--` in `args`
/// and the program (if any) in `prog`.
pub fn burstyd(scratch: &Scratch, args: &[&str], prog: &[&str], timeout: Duration) -> BurstydRun {
    let out_dir = scratch.join("out");
    let _ = std::fs::remove_dir_all(&out_dir);
    let mut cmd = Command::new(burstyd_bin());
    cmd.args(args).arg("-o").arg(&out_dir);
    if !prog.is_empty() {
        cmd.arg("--").args(prog);
    }
    let finished = run_timeout(&mut cmd, timeout);
    BurstydRun { finished, out_dir }
}

/// `burstyd run -o OUT EXTRA... -- PROG ARGS...`.
pub fn burstyd_run(
    scratch: &Scratch,
    extra: &[&str],
    prog: &[&str],
    timeout: Duration,
) -> BurstydRun {
    let mut args = vec!["run"];
    args.extend_from_slice(extra);
    burstyd(scratch, &args, prog, timeout)
}

/// Runs a program untraced and returns its output (asserting success).
pub fn run_untraced(prog: &[&str], timeout: Duration) -> Finished {
    let f = run_timeout(Command::new(prog[0]).args(&prog[1..]), timeout);
    assert!(
        f.status.success(),
        "untraced {prog:?} failed:\n{}",
        f.describe()
    );
    f
}

/// Whether the host has a hardware PMU: perf_event_open of
/// PERF_TYPE_HARDWARE/PERF_COUNT_HW_CPU_CYCLES on ourselves succeeds.
pub fn host_has_pmu() -> bool {
    // perf_event_attr, PERF_ATTR_SIZE_VER0 (64 bytes) is enough.
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&0u32.to_ne_bytes()); // type = PERF_TYPE_HARDWARE
    attr[4..8].copy_from_slice(&64u32.to_ne_bytes()); // size
    attr[8..16].copy_from_slice(&0u64.to_ne_bytes()); // config = CPU_CYCLES
    // flags: disabled(bit 0) | exclude_kernel(bit 5) | exclude_hv(bit 6)
    attr[40..48].copy_from_slice(&((1u64) | (1 << 5) | (1 << 6)).to_ne_bytes());
    // SAFETY: attr is a valid, fully initialized perf_event_attr of `size` bytes.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            0 as libc::pid_t,
            -1i32,
            -1i32,
            0u64,
        )
    };
    if fd >= 0 {
        // SAFETY: fd was just returned by the kernel.
        unsafe { libc::close(fd as i32) };
        true
    } else {
        false
    }
}

/// A pid that does not exist now.
pub fn unused_pid() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    for p in [999_999u32, max.saturating_sub(1), max.saturating_sub(7)] {
        if p > 0 && !Path::new(&format!("/proc/{p}")).exists() {
            return p;
        }
    }
    panic!("could not find an unused pid");
}

// ---------------------------------------------------------------------------
// Real programs and inputs

/// Paths of the real programs built by scripts/realprogs.sh (runs it; it is
/// instant when they are cached). Panics with the script's output on failure.
pub fn realprogs() -> PathBuf {
    static DONE: OnceLock<PathBuf> = OnceLock::new();
    DONE.get_or_init(|| {
        let script = workspace_root().join("scripts/realprogs.sh");
        let f = run_timeout(
            Command::new("bash").arg(&script).env("CI", "true"),
            Duration::from_secs(900),
        );
        assert!(
            f.status.success(),
            "{} failed:\n{}",
            script.display(),
            f.describe()
        );
        workspace_root().join("target/realprogs/bin")
    })
    .clone()
}

/// A deterministic pseudo-random sequence (xorshift64*) from `state`.
fn xorshift64star(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Writes `size` bytes of deterministic, compressible-but-not-trivial text:
/// lines of words drawn from a fixed vocabulary with a skewed (Zipf-like)
/// distribution, numbers, and punctuation, from a fixed-seed PRNG.
pub fn generate_text(path: &Path, size: usize, seed: u64) {
    use std::io::Write;
    let mut next = xorshift64star(seed ^ 0x9e37_79b9_7f4a_7c15);
    // Vocabulary: 4096 pseudo-words of 2..11 letters.
    let mut vocab: Vec<String> = Vec::with_capacity(4096);
    for _ in 0..4096 {
        let len = 2 + (next() % 10) as usize;
        let w: String = (0..len)
            .map(|_| (b'a' + (next() % 26) as u8) as char)
            .collect();
        vocab.push(w);
    }
    let mut out = Vec::with_capacity(size + 256);
    let mut col = 0usize;
    while out.len() < size {
        let r = next();
        // Skewed index: min of two uniforms, squared-ish.
        let a = (r % 4096) as usize;
        let b = ((r >> 20) % 4096) as usize;
        let c = ((r >> 40) % 4096) as usize;
        let idx = a.min(b).min(c);
        let word: &str = &vocab[idx];
        match (r >> 60) & 0xf {
            0 => out.extend_from_slice(format!("{} ", (next() % 100_000)).as_bytes()),
            1 => out.extend_from_slice(b", "),
            _ => {}
        }
        out.extend_from_slice(word.as_bytes());
        out.push(b' ');
        col += word.len() + 1;
        if col > 72 {
            out.extend_from_slice(if (r >> 56) & 3 == 0 { b".\n" } else { b"\n" });
            col = 0;
        }
    }
    out.truncate(size);
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&out).unwrap();
}

/// Writes about `size` bytes of a deterministic XML catalogue whose DTD
/// declares 32 internal entities and whose character data refers to them
/// (one to five references per record, with character and predefined
/// references beside them): a validating-or-not parser expands each
/// reference, and Xerces-C++ throws and catches one exception per reference
/// that ends inside character data.
pub fn generate_xml(path: &Path, size: usize, seed: u64) {
    use std::fmt::Write as _;
    use std::io::Write as _;
    let mut next = xorshift64star(seed ^ 0x2545_f491_4f6c_dd1d);
    let word = |r: u64| -> String {
        let len = 3 + (r % 7) as usize;
        (0..len)
            .map(|i| (b'a' + ((r >> (5 * i + 3)) % 26) as u8) as char)
            .collect()
    };
    let mut out = String::with_capacity(size + 1024);
    out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE catalog [\n");
    for e in 0..32 {
        let n = 1 + next() % 4;
        let text: Vec<String> = (0..n).map(|_| word(next())).collect();
        writeln!(out, "<!ENTITY e{e} \"{}\">", text.join(" ")).unwrap();
    }
    out.push_str("]>\n<catalog>\n<group>\n");
    let mut id = 0u64;
    while out.len() < size {
        // Groups of 64 items (a parser's cost per node does not grow with
        // its number of siblings then).
        if id > 0 && id.is_multiple_of(64) {
            out.push_str("</group>\n<group>\n");
        }
        let r = next();
        write!(
            out,
            "<item id=\"i{id}\" kind=\"{}\"><name>{} {id}</name><text>",
            word(r),
            word(r >> 17)
        )
        .unwrap();
        for k in 0..1 + next() % 5 {
            let r = next();
            if k > 0 {
                out.push(' ');
            }
            match r % 8 {
                0 => write!(out, "{} &amp; &e{};", word(r >> 8), (r >> 40) % 32).unwrap(),
                1 => write!(out, "&#{}; &e{};", 65 + (r >> 8) % 26, (r >> 40) % 32).unwrap(),
                _ => write!(out, "&e{};", (r >> 40) % 32).unwrap(),
            }
        }
        out.push_str("</text></item>\n");
        id += 1;
    }
    out.push_str("</group>\n</catalog>\n");
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(out.as_bytes()).unwrap();
}

// ---------------------------------------------------------------------------
// Assertion helpers over profiles

/// Count of samples (by value) of the traces matching `pred`.
pub fn count_where(traces: &[TraceSample], pred: impl Fn(&TraceSample) -> bool) -> i64 {
    traces
        .iter()
        .filter(|t| pred(t))
        .map(|t| t.count().max(1))
        .sum()
}

/// Renders the heaviest stacks, for assertion messages.
pub fn describe_traces(traces: &[TraceSample], n: usize) -> String {
    let mut agg: HashMap<(Vec<String>, String), i64> = HashMap::new();
    for t in traces {
        let who = format!(
            "pid={} comm={} thread={}",
            t.label("pid").unwrap_or("?"),
            t.label("comm").unwrap_or("?"),
            t.label("thread").unwrap_or("?")
        );
        *agg.entry((t.frames.clone(), who)).or_default() += t.count().max(1);
    }
    let mut v: Vec<_> = agg.into_iter().collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1));
    let total: i64 = v.iter().map(|x| x.1).sum();
    let mut s = format!(
        "{} samples in {} distinct stacks; heaviest:\n",
        total,
        v.len()
    );
    for ((frames, who), c) in v.into_iter().take(n) {
        s += &format!("  {c:6}  [{who}]  {}\n", frames.join(" <- "));
    }
    s
}

/// Renders the top rows, for assertion messages.
pub fn describe_top(rows: &[TopRow], n: usize) -> String {
    rows.iter()
        .take(n)
        .map(|r| {
            format!(
                "  {:>8} {:6.2}% {:6.2}%  {}\n",
                r.flat, r.flat_pct, r.cum_pct, r.name
            )
        })
        .collect()
}

/// Checks the contract's per-sample labels on a directly decoded profile:
/// string `pid` (decimal), `comm`, `thread`, numeric `tid`; and the sample
/// types `samples/count` and `<event>/count`.
pub fn assert_contract_shape(p: &Profile, event: &str) {
    let types: Vec<String> = p
        .sample_types
        .iter()
        .map(|(t, u)| format!("{t}/{u}"))
        .collect();
    let unit = event_unit(event);
    assert!(
        types.iter().any(|t| t == "samples/count")
            && types.iter().any(|t| *t == format!("{event}/{unit}")),
        "sample types are {types:?}, want samples/count and {event}/{unit}"
    );
    let period = p
        .raw
        .period_type
        .as_ref()
        .map(|v| format!("{}/{}", p.string(v.r#type), p.string(v.unit)));
    assert_eq!(
        period.as_deref(),
        Some(format!("{event}/{unit}").as_str()),
        "period type"
    );
    assert!(!p.samples.is_empty(), "profile has no samples");
    for (i, s) in p.samples.iter().enumerate() {
        let pid = s
            .label("pid")
            .unwrap_or_else(|| panic!("sample {i} has no string label pid: {s:?}"));
        assert!(
            !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()),
            "sample {i}: pid label {pid:?} is not decimal"
        );
        assert!(
            s.label("comm").is_some(),
            "sample {i} has no string label comm: {:?}",
            s.labels
        );
        assert!(
            s.label("thread").is_some(),
            "sample {i} has no string label thread: {:?}",
            s.labels
        );
        assert!(
            s.num_labels.contains_key("tid"),
            "sample {i} has no numeric label tid: {:?}",
            s.num_labels
        );
        assert!(!s.frames.is_empty(), "sample {i} has no locations");
    }
}

/// `path`, a program the suite needs that scripts/setup.sh installs (from
/// the Debian package `package`): a test that needs it fails, naming both,
/// where it is missing, rather than passing without having run.
pub fn installed<'a>(path: &'a str, package: &str) -> &'a str {
    assert!(
        Path::new(path).exists(),
        "{path} is not installed: scripts/setup.sh installs it (apt-get install {package})"
    );
    path
}

/// The unit of `event`'s values in burstyd's profiles: the software
/// clocks' period is a time (nanoseconds), so that `go tool pprof` shows
/// their profiles as time; every other event counts occurrences.
pub fn event_unit(event: &str) -> &'static str {
    match event {
        "cpu-clock" | "task-clock" => "nanoseconds",
        _ => "count",
    }
}

/// For the `threads` fixture: both named threads and their functions appear,
/// attributed to the right thread, with distinct tids.
pub fn assert_two_named_threads(traces: &[TraceSample], p: &Profile) {
    let total = count_where(traces, |_| true);
    for (thread, func) in [
        ("spin-alpha", "spin_alpha_work"),
        ("spin-beta", "spin_beta_work"),
    ] {
        let in_thread = count_where(traces, |t| t.label("thread") == Some(thread));
        let with_func = count_where(traces, |t| t.has(func));
        let both = count_where(traces, |t| t.label("thread") == Some(thread) && t.has(func));
        assert!(
            in_thread as f64 >= 0.2 * total as f64,
            "thread {thread:?} has {in_thread} of {total} samples\n{}",
            describe_traces(traces, 12)
        );
        assert!(
            with_func as f64 >= 0.2 * total as f64,
            "{func} is in {with_func} of {total} samples\n{}",
            describe_traces(traces, 12)
        );
        assert!(
            both as f64 >= 0.95 * with_func as f64,
            "only {both} of the {with_func} samples in {func} are labelled thread={thread:?}\n{}",
            describe_traces(traces, 12)
        );
    }
    // tids: one per thread name, distinct, and not the pid (worker threads).
    let mut tids: std::collections::BTreeMap<String, std::collections::BTreeSet<i64>> =
        Default::default();
    for s in &p.samples {
        if let (Some(th), Some(tid)) = (s.label("thread"), s.num_labels.get("tid")) {
            tids.entry(th.to_string()).or_default().insert(*tid);
        }
    }
    let a = &tids["spin-alpha"];
    let b = &tids["spin-beta"];
    assert_eq!(a.len(), 1, "spin-alpha has tids {a:?}");
    assert_eq!(b.len(), 1, "spin-beta has tids {b:?}");
    assert_ne!(a, b, "both threads have the same tid");
    let pid: i64 = p.samples[0].label("pid").unwrap().parse().unwrap();
    assert!(
        !a.contains(&pid) && !b.contains(&pid),
        "a worker thread's tid equals the pid {pid}: {tids:?}"
    );
}

/// Runs fixture `name` untraced, then under `burstyd run --freq 999`, asserts
/// burstyd succeeded and the program's stdout is the same both ways, and
/// returns the traced run, the untraced one, and the scratch directory
/// (kept alive by the caller).
pub fn profile_fixture(name: &str) -> (BurstydRun, Finished, Scratch) {
    profile_fixture_with(name, &[])
}

/// [`profile_fixture`] with the program's arguments.
pub fn profile_fixture_with(name: &str, args: &[&str]) -> (BurstydRun, Finished, Scratch) {
    let exe = fixture(name);
    let mut prog = vec![exe.to_str().unwrap()];
    prog.extend_from_slice(args);
    let untraced = run_untraced(&prog, Duration::from_secs(60));
    let scratch = Scratch::new(name);
    let run = burstyd_run(
        &scratch,
        &["--freq", "999"],
        &prog,
        Duration::from_secs(180),
    );
    run.assert_ok();
    assert_eq!(
        run.finished.stdout_str(),
        untraced.stdout_str(),
        "{name}: the program's stdout under `burstyd run` differs from its untraced stdout\n{}",
        run.finished.describe()
    );
    (run, untraced, scratch)
}

/// Executions per path-frame name ("classify path 3: L14→L15→L16") in a
/// `paths.pb.gz`.
pub fn path_counts(path: &Path) -> std::collections::BTreeMap<String, i64> {
    let p = pprof::read_profile(path).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(p.sample_types[0], ("executions".into(), "count".into()));
    let mut out = std::collections::BTreeMap::new();
    for s in &p.samples {
        let leaf = s.frames[0].name();
        *out.entry(leaf).or_insert(0) += s.values[0];
    }
    out
}

/// The path counts of a full trace of the `paths_known` fixture run with
/// `n`: its `kernel` function's six body paths run 4, 2, 2, 2, 1 and 1
/// times per 12 iterations, and nothing was lost.
pub fn assert_paths_known_counts(run: &BurstydRun, n: i64) {
    let summary = read_summary(&run.out_dir);
    let line = summary.traced().describe();
    assert_eq!(summary.traced().records_lost(), 0, "{line}");
    let counts = path_counts(&run.out_dir.join("paths.pb.gz"));
    let mut kernel: Vec<i64> = counts
        .iter()
        .filter(|(k, _)| k.starts_with("kernel path "))
        .map(|(_, v)| *v)
        .collect();
    kernel.sort_unstable_by(|a, b| b.cmp(a));
    // The first iteration runs on the path that starts at the function
    // entry instead of the loop header, so one count may be short by one;
    // the path that leaves the loop runs once.
    let unit = n / 12;
    let expect = [4 * unit, 2 * unit, 2 * unit, 2 * unit, unit, unit];
    assert!(kernel.len() >= 6, "{counts:#?}\n{line}");
    for (got, want) in kernel.iter().zip(expect) {
        assert!(
            (got - want).abs() <= 1,
            "kernel paths {kernel:?}, expected {expect:?} (±1)\n{line}"
        );
    }
    let total: i64 = kernel.iter().sum();
    assert!(
        (total - (n + 1)).abs() <= 1,
        "kernel paths add up to {total}, not n + 1 = {}: {kernel:?}",
        n + 1
    );
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn base_name_strips_gcc_suffixes() {
        assert_eq!(base_name("handle_compress.isra.0"), "handle_compress");
        assert_eq!(base_name("msort_with_tmp.part.0"), "msort_with_tmp");
        assert_eq!(base_name("foo.constprop.0.isra.0"), "foo");
        assert_eq!(base_name("foo.cold"), "foo");
        assert_eq!(base_name("main"), "main");
        assert_eq!(
            base_name("std::vector<int>::push_back(int const&)"),
            "std::vector<int>::push_back(int const&)"
        );
        assert_eq!(base_name("a.b.3"), "a.b.3");
    }

    #[test]
    fn traces_parser_handles_inline_and_labels() {
        let sep = "-----------+-------------------------------------------------------";
        let text = [
            "File: x",
            "Type: samples",
            sep,
            "       pid:  12",
            "  a_long_label_key:  v w",
            "       tid:  13",
            "         5   mix_step (inline)",
            "             hot_leaf",
            "             main",
            sep,
            "",
        ]
        .join("\n");
        let text = text.as_str();
        let (header, t) = gopprof::parse_traces(text).unwrap();
        assert_eq!(header, ["File: x", "Type: samples"]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].frames, ["mix_step", "hot_leaf", "main"]);
        assert_eq!(t[0].inline, [true, false, false]);
        assert_eq!(t[0].count(), 5);
        assert_eq!(t[0].label("a_long_label_key"), Some("v w"));
        assert_eq!(t[0].label("tid"), Some("13"));
        assert!(t[0].has_chain(&["hot_leaf", "main"]));
    }

    #[test]
    fn generated_text_is_deterministic_and_compressible() {
        let dir = Scratch::new("gen");
        let (a, b) = (dir.join("a"), dir.join("b"));
        generate_text(&a, 1 << 20, 3);
        generate_text(&b, 1 << 20, 3);
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert_eq!(a.len(), 1 << 20);
        assert_eq!(a, b);
        let distinct: std::collections::HashSet<&[u8]> = a.chunks(64).collect();
        assert!(distinct.len() > 10_000, "not trivially repetitive");
    }
}
