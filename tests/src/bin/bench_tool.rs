//! Helpers for bench/overhead.sh and manual testing:
//!
//!   bench_tool gen-text SIZE_BYTES SEED OUT_PATH
//!       deterministic compressible text (burstyd_tests::generate_text)
//!   bench_tool gen-xml SIZE_BYTES SEED OUT_PATH
//!       a deterministic XML catalogue full of entity references
//!       (burstyd_tests::generate_xml)
//!   bench_tool profile-stats PROFILE.pb.gz
//!       prints `samples=N sample_types=a/b,c/d pids=K duration_s=X`
//!   bench_tool path-accuracy BINARY TRUTH.pb.gz ESTIMATE.pb.gz...
//!       prints `wall=F overlap=F hot_paths=N truth_paths=N estimate_paths=N`:
//!       PEP's Wall weight matching (hot threshold 0.125%) and edge
//!       relative overlap of two paths.pb.gz of BINARY
//!   bench_tool callgrind-accuracy BINARY CALLGRIND_OUT ESTIMATE.pb.gz...
//!       prints `overlap=F branches=N unplaced=N`: edge relative overlap of
//!       the estimates' paths (added up) against callgrind's exact branch
//!       counts of BINARY (`--collect-jumps=yes --dump-instr=yes
//!       --compress-strings=no --compress-pos=no`), an independent truth.
//!       BENCH_VALUE=TYPE reads the estimates' sample type TYPE
//!       (`recorded`: before the estimator's weights) instead of
//!       `executions`
//!   bench_tool function-overlap TRUTH.pb.gz ESTIMATE.pb.gz
//!       prints `overlap=F`: Σ over functions of the smaller of their two
//!       shares of all path executions (TRUTH's `executions`, ESTIMATE's
//!       BENCH_VALUE): 1 when the estimate splits executions among
//!       functions as the truth does, whatever the branches within them
//!   bench_tool function-shares PATHS.pb.gz FUNC...
//!       prints each FUNC's share of the FUNCs' executions (sample type
//!       BENCH_VALUE, default `executions`), one line each: `SHARE FUNC`
//!   bench_tool rusage OUT_FILE -- CMD ARGS...
//!       runs CMD, waits for it with wait4(2) and writes its own rusage
//!       (`wall_s= user_s= sys_s= maxrss_kb= status=`) to OUT_FILE; exits
//!       with CMD's exit code. Measures CMD itself, not its children.
//!   bench_tool lackey-trace [--stack] [--from-entry] LACKEY_LOG
//!       valgrind lackey's `--trace-mem=yes -v -v -v` log into the
//!       plain-text trace `burstyd hot-streams --from-trace` reads, on
//!       standard output; a summary on standard error. Each data
//!       reference (lackey's " L", " S" and " M" lines) is attributed to
//!       the instruction before it ("I" lines), mapped to its module by
//!       the module's loadable segments (`readelf -lW`; the three -v make
//!       valgrind print each module's static and load addresses, from
//!       which its bias comes). References into the main thread's stack
//!       (valgrind's at 0x1ff0000000 and above) are left out, as bursts
//!       leave out the thread's own stack (`--stack` keeps them);
//!       instructions in no module (valgrind's trampolines) are counted
//!       and left out; so are the references of an "I" line that repeats
//!       the one before (the second and later iterations of a `rep`
//!       string operation: burstyd records the first).
//!       `--from-entry`: from the executable's first instruction on (the
//!       dynamic loader's start-up left out, as `burstyd run` traces
//!       from the entry point)
use std::io::{BufRead, Write};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("gen-text") if args.len() == 5 => {
            let size: usize = args[2].parse().expect("SIZE_BYTES");
            let seed: u64 = args[3].parse().expect("SEED");
            burstyd_tests::generate_text(std::path::Path::new(&args[4]), size, seed);
        }
        Some("gen-xml") if args.len() == 5 => {
            let size: usize = args[2].parse().expect("SIZE_BYTES");
            let seed: u64 = args[3].parse().expect("SEED");
            burstyd_tests::generate_xml(std::path::Path::new(&args[4]), size, seed);
        }
        Some("profile-stats") if args.len() == 3 => {
            let p = burstyd_tests::pprof::read_profile(std::path::Path::new(&args[2]))
                .unwrap_or_else(|e| {
                    eprintln!("bench_tool: {e:#}");
                    std::process::exit(1)
                });
            let types: Vec<String> = p
                .sample_types
                .iter()
                .map(|(t, u)| format!("{t}/{u}"))
                .collect();
            let pids: std::collections::BTreeSet<&str> =
                p.samples.iter().filter_map(|s| s.label("pid")).collect();
            println!(
                "samples={} sample_types={} pids={} duration_s={:.3}",
                p.total_samples(),
                types.join(","),
                pids.len(),
                p.raw.duration_nanos as f64 / 1e9
            );
        }
        Some("path-accuracy") if args.len() >= 5 => {
            use burstyd_tests::accuracy::*;
            let bin = std::fs::read(&args[2]).expect("BINARY");
            let read = |p: &str| {
                burstyd_tests::pprof::read_profile(std::path::Path::new(p))
                    .unwrap_or_else(|e| panic!("{p}: {e:#}"))
            };
            let truth = path_counts(&read(&args[3]));
            // Several estimates (runs) add up.
            let mut est = std::collections::HashMap::new();
            for p in &args[4..] {
                for (k, v) in path_counts(&read(p)) {
                    *est.entry(k).or_insert(0) += v;
                }
            }
            let r = Regenerator::new(&bin).expect("analysing BINARY");
            let wall = wall_weight_matching(&truth, &est, |id| r.branches(id), 0.00125);
            let overlap = relative_overlap(&r.edge_profile(&truth), &r.edge_profile(&est));
            let total: f64 = truth
                .iter()
                .map(|(id, &c)| c as f64 * r.branches(id) as f64)
                .sum();
            let hot = truth
                .iter()
                .filter(|(id, c)| **c as f64 * r.branches(id) as f64 > 0.00125 * total)
                .count();
            println!(
                "wall={wall:.4} overlap={overlap:.4} hot_paths={hot} truth_paths={} estimate_paths={}",
                truth.len(),
                est.len()
            );
        }
        Some("callgrind-accuracy") if args.len() >= 5 => {
            use burstyd_tests::accuracy::*;
            let bin = std::fs::read(&args[2]).expect("BINARY");
            let text = std::fs::read_to_string(&args[3]).expect("CALLGRIND_OUT");
            let mut est = std::collections::HashMap::new();
            for p in &args[4..] {
                let prof = burstyd_tests::pprof::read_profile(std::path::Path::new(p))
                    .unwrap_or_else(|e| panic!("{p}: {e:#}"));
                let value = std::env::var("BENCH_VALUE").unwrap_or_else(|_| "executions".into());
                for (k, v) in path_counts_of(&prof, &value) {
                    *est.entry(k).or_insert(0) += v;
                }
            }
            let r = Regenerator::new(&bin).expect("analysing BINARY");
            let name = std::path::Path::new(&args[2])
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let (truth, unplaced) = callgrind_edges(&text, &name, &r);
            let branches: std::collections::HashSet<_> =
                truth.keys().map(|(f, b, _)| (f.clone(), *b)).collect();
            let est_edges = r.edge_profile(&est);
            let overlap = relative_overlap(&truth, &est_edges);
            println!(
                "overlap={overlap:.4} branches={} unplaced={unplaced}",
                branches.len()
            );
            // BENCH_DETAIL=N: the N branches that lose the most (frequency
            // times inaccuracy), on stderr.
            if let Some(n) = std::env::var("BENCH_DETAIL")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
            {
                let per = branch_accuracy(&truth, &est_edges);
                let total: u64 = per.iter().map(|p| p.1).sum();
                let mut loss: Vec<_> = per
                    .iter()
                    .map(|(b, f, a)| (b, *f, *a, *f as f64 * (1.0 - a) / total.max(1) as f64))
                    .collect();
                loss.sort_by(|a, b| b.3.total_cmp(&a.3));
                for (b, f, a, l) in loss.iter().take(n) {
                    eprintln!(
                        "  {:>7.4} lost  {} block {}  freq {f}  accuracy {a:.3}",
                        l, b.0, b.1
                    );
                }
            }
        }
        Some("function-overlap") if args.len() == 4 => {
            let read = |p: &str| {
                burstyd_tests::pprof::read_profile(std::path::Path::new(p))
                    .unwrap_or_else(|e| panic!("{p}: {e:#}"))
            };
            let value = std::env::var("BENCH_VALUE").unwrap_or_else(|_| "executions".into());
            let shares = |c: std::collections::HashMap<burstyd_tests::accuracy::PathId, u64>| {
                let mut f: std::collections::HashMap<String, f64> = Default::default();
                let total: u64 = c.values().sum();
                for ((func, _), n) in c {
                    *f.entry(func).or_default() += n as f64 / total.max(1) as f64;
                }
                f
            };
            let truth = shares(burstyd_tests::accuracy::path_counts(&read(&args[2])));
            let est = shares(burstyd_tests::accuracy::path_counts_of(
                &read(&args[3]),
                &value,
            ));
            let overlap: f64 = truth
                .iter()
                .map(|(f, t)| t.min(est.get(f).copied().unwrap_or(0.0)))
                .sum();
            println!("overlap={overlap:.4}");
        }
        Some("function-shares") if args.len() >= 4 => {
            let prof = burstyd_tests::pprof::read_profile(std::path::Path::new(&args[2]))
                .unwrap_or_else(|e| panic!("{}: {e:#}", args[2]));
            let value = std::env::var("BENCH_VALUE").unwrap_or_else(|_| "executions".into());
            let counts = burstyd_tests::accuracy::path_counts_of(&prof, &value);
            let per: Vec<u64> = args[3..]
                .iter()
                .map(|f| {
                    counts
                        .iter()
                        .filter(|(k, _)| &k.0 == f)
                        .map(|(_, v)| v)
                        .sum()
                })
                .collect();
            let total: u64 = per.iter().sum();
            for (f, n) in args[3..].iter().zip(per) {
                println!("{:.4} {f}", n as f64 / total.max(1) as f64);
            }
        }
        Some("lackey-trace") if args.len() >= 3 => {
            let keep_stack = args[2..].iter().any(|a| a == "--stack");
            let from_entry = args[2..].iter().any(|a| a == "--from-entry");
            let log = args[2..]
                .iter()
                .find(|a| !a.starts_with("--"))
                .expect("LACKEY_LOG");
            lackey_trace(log, keep_stack, from_entry);
        }
        Some("rusage") if args.len() >= 5 && args[3] == "--" => {
            let out = &args[2];
            let start = Instant::now();
            let child = std::process::Command::new(&args[4])
                .args(&args[5..])
                .spawn()
                .unwrap_or_else(|e| {
                    eprintln!("bench_tool: spawning {}: {e}", args[4]);
                    std::process::exit(127)
                });
            let pid = child.id() as libc::pid_t;
            let mut status = 0;
            // SAFETY: all-zero is a valid rusage.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: pid is our child; status and ru are valid for writes.
            let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
            let wall = start.elapsed().as_secs_f64();
            if r != pid {
                eprintln!("bench_tool: wait4: {}", std::io::Error::last_os_error());
                std::process::exit(1);
            }
            std::mem::forget(child);
            let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
            std::fs::write(
                out,
                format!(
                    "wall_s={wall:.3} user_s={:.3} sys_s={:.3} maxrss_kb={} status={code}\n",
                    tv(ru.ru_utime),
                    tv(ru.ru_stime),
                    ru.ru_maxrss
                ),
            )
            .expect("writing OUT_FILE");
            std::process::exit(code);
        }
        _ => {
            eprintln!(
                "usage: bench_tool gen-text SIZE_BYTES SEED OUT | gen-xml SIZE_BYTES SEED OUT | profile-stats PROFILE | path-accuracy BINARY TRUTH ESTIMATE | rusage OUT_FILE -- CMD ARGS..."
            );
            std::process::exit(2);
        }
    }
}

/// Where valgrind puts the main thread's stack: references at or above it
/// are the stack's (left out unless `--stack`).
const LACKEY_STACK: u64 = 0x1f_f000_0000;

/// `lackey-trace`: see the module doc.
fn lackey_trace(log: &str, keep_stack: bool, from_entry: bool) {
    // The executable is the first module valgrind reads.
    let mut started = !from_entry;
    let mut before_entry = 0u64;
    let file = std::fs::File::open(log).unwrap_or_else(|e| {
        eprintln!("bench_tool: {log}: {e}");
        std::process::exit(1)
    });
    let mut input = std::io::BufReader::with_capacity(1 << 20, file);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    // (avma lo, avma hi, bias, module index)
    let mut modules: Vec<(u64, u64, u64, usize)> = Vec::new();
    let mut paths: Vec<String> = Vec::new();
    let mut reading: Option<String> = None;
    let (mut refs, mut skipped_stack, mut unmapped) = (0u64, 0u64, 0u64);
    let mut last: Option<(usize, u64)> = None;
    // The previous `I` line's address, and whether this one repeats it
    // (another iteration of a `rep` string operation).
    let (mut prev_i, mut repeat, mut repeated) = (None::<u64>, false, 0u64);
    let mut hit: Option<(u64, u64, u64, usize)> = None;
    let hex = |s: &[u8]| -> Option<u64> {
        let end = s.iter().position(|&c| c == b',').unwrap_or(s.len());
        u64::from_str_radix(std::str::from_utf8(&s[..end]).ok()?, 16).ok()
    };
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
            break;
        }
        match line.first() {
            Some(b'I') if line.len() > 3 => {
                let Some(addr) = hex(&line[3..]) else {
                    continue;
                };
                // Valgrind runs a `rep` string operation one iteration at
                // a time, each with its own `I` line: the first iteration's
                // references stand for the instruction (as burstyd records
                // it), the repeats' are left out.
                repeat = prev_i == Some(addr);
                prev_i = Some(addr);
                if repeat {
                    continue;
                }
                if let Some(m) = hit.filter(|m| m.0 <= addr && addr < m.1) {
                    last = Some((m.3, addr - m.2));
                    continue;
                }
                hit = modules.iter().copied().find(|m| m.0 <= addr && addr < m.1);
                last = hit.map(|m| (m.3, addr - m.2));
                started |= hit.is_some_and(|m| m.3 == 0);
            }
            Some(b' ') if line.len() > 3 && matches!(line[1], b'L' | b'S' | b'M') => {
                let Some(addr) = hex(&line[3..]) else {
                    continue;
                };
                if repeat {
                    repeated += 1;
                    continue;
                }
                if !started {
                    before_entry += 1;
                    continue;
                }
                if addr >= LACKEY_STACK && !keep_stack {
                    skipped_stack += 1;
                    continue;
                }
                let Some((m, vaddr)) = last else {
                    unmapped += 1;
                    continue;
                };
                writeln!(out, "{} {vaddr:x} {addr:x}", paths[m]).expect("writing the trace");
                refs += 1;
            }
            Some(b'-') => {
                let text = String::from_utf8_lossy(&line);
                let rest = text.split_once("-- ").map_or("", |(_, r)| r).trim();
                if let Some(p) = rest.strip_prefix("Reading syms from ") {
                    reading = p.split_whitespace().next().map(str::to_owned);
                } else if let (Some(path), Some(v)) = (&reading, rest.strip_prefix("svma 0x")) {
                    let mut it = v.split(", avma 0x");
                    let svma = it
                        .next()
                        .and_then(|x| u64::from_str_radix(x.trim(), 16).ok());
                    let avma = it
                        .next()
                        .and_then(|x| u64::from_str_radix(x.trim(), 16).ok());
                    if let (Some(s), Some(a)) = (svma, avma)
                        && !path.starts_with("/usr/libexec/valgrind/")
                    {
                        let bias = a.wrapping_sub(s);
                        paths.push(path.clone());
                        for (lo, hi) in load_segments(path) {
                            modules.push((
                                lo.wrapping_add(bias),
                                hi.wrapping_add(bias),
                                bias,
                                paths.len() - 1,
                            ));
                        }
                    }
                    reading = None;
                }
            }
            _ => {}
        }
    }
    out.flush().expect("writing the trace");
    eprintln!(
        "lackey-trace: {refs} references; {skipped_stack} into the stack left out; {unmapped} by instructions in no module; {before_entry} before the entry point left out; {repeated} of repeated string-operation iterations left out"
    );
}

/// The static address ranges of `path`'s loadable segments (`readelf -lW`).
fn load_segments(path: &str) -> Vec<(u64, u64)> {
    let out = std::process::Command::new("readelf")
        .args(["-lW", path])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.first() != Some(&"LOAD") || f.len() < 6 {
                return None;
            }
            let n = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
            let (v, m) = (n(f[2])?, n(f[5])?);
            Some((v, v + m))
        })
        .collect()
}
