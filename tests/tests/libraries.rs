//! Bursty tracing of shared libraries: libc's functions get clones of
//! their own (near libc), calls from the executable's clones into libc
//! (through the PLT's GOT slot) and returns back stay inside the burst,
//! and the time a program spends in libc is covered by instrumented code.
use std::path::Path;
use std::time::Duration;

use object::{Object as _, ObjectSegment as _};
use userspace_rewriter::analysis::functions;

use burstyd_tests::pprof::{Profile, read_profile};
use burstyd_tests::*;

/// The traced process's hot coverage over every module (0-100), and its
/// hot coverage figures for messages.
fn process_coverage(run: &BurstydRun) -> (f64, String) {
    let summary = read_summary(&run.out_dir);
    let t = summary.traced();
    (t.all_coverage_pct(), t.hot_coverage())
}

/// Executions of paths through functions of `lib` (the leaf pseudo-frame's
/// mapping), and how many distinct such paths.
fn paths_in(p: &Profile, lib: &str) -> (i64, usize) {
    let mut n = 0;
    let mut distinct = 0;
    for s in &p.samples {
        if s.frames[0]
            .mapping_file
            .rsplit('/')
            .next()
            .is_some_and(|f| f.starts_with(lib))
        {
            n += s.values[0];
            distinct += 1;
        }
    }
    (n, distinct)
}

/// At least 95% of the process's user-mode samples over all modules land
/// in instrumented code.
fn assert_covered(run: &BurstydRun) {
    let (cov, hot) = process_coverage(run);
    assert!(cov >= 95.0, "coverage over all modules {cov}%: {hot}");
}

/// `prog` under `burstyd run` with default bursts (`--save-bursts` too
/// with `save_bursts`), then `full_prog` (the same program on less work: a
/// full trace runs 10-25x slower) with a full trace (both at 999 Hz): each
/// run must print what the program prints untraced, lose no record and
/// write no bad one; `check` gets each run and whether it was the full
/// trace.
fn each_mode(
    name: &str,
    prog: &[&str],
    full_prog: &[&str],
    save_bursts: bool,
    mut check: impl FnMut(&BurstydRun, bool),
) {
    let bursts_args: &[&str] = if save_bursts {
        &["--freq", "999", "--save-bursts"]
    } else {
        &["--freq", "999"]
    };
    for (args, full) in [
        (bursts_args, false),
        (&["--freq", "999", "--full-trace"][..], true),
    ] {
        let prog = if full { full_prog } else { prog };
        let untraced = run_untraced(prog, Duration::from_secs(120));
        let scratch = Scratch::new(name);
        let run = burstyd_run(&scratch, args, prog, Duration::from_secs(300));
        run.assert_ok();
        assert_eq!(
            run.finished.stdout_str(),
            untraced.stdout_str(),
            "output differs ({args:?})\n{}",
            run.finished.describe()
        );
        let summary = read_summary(&run.out_dir);
        let t = summary.traced();
        assert!(
            t.records_lost() == 0 && t.bad_records() == 0,
            "{}",
            t.describe()
        );
        check(&run, full);
    }
}

/// A program whose time is in libc's qsort, strcmp, memcpy, strlen and
/// memchr: with bursts and with a full trace its output is identical,
/// the samples over all modules land in instrumented code (>= 95%), the
/// path profile has paths through libc's own functions, and libc gets a
/// BOLT profile of its own. With `--exe-only` libc is left original: the
/// executable alone is covered, and no library is claimed or profiled.
#[test]
fn time_in_libc_is_traced_in_bursts() {
    require_root();
    let _serial = serial();
    let exe = fixture("libc_heavy");
    let exe_s = exe.to_str().unwrap();
    let prog = [exe_s, "600"];
    each_mode("libraries", &prog, &[exe_s, "150"], false, |run, full| {
        if !full {
            // In a full trace the runtime's own ring writes take samples
            // too; the coverage bound is for the default bursts.
            assert_covered(run);
        }
        let paths = read_profile(&run.out_dir.join("paths.pb.gz")).unwrap();
        let (execs, distinct) = paths_in(&paths, "libc.so");
        assert!(
            execs >= 10_000 && distinct >= 20,
            "paths in libc: {execs} executions of {distinct} paths (full trace: {full})"
        );
        let fdata = std::fs::read_to_string(run.out_dir.join("edges-libc.so.6.fdata"))
            .expect("libc's own BOLT profile");
        assert!(fdata.lines().count() >= 20, "{fdata}");
    });

    let untraced = run_untraced(&prog, Duration::from_secs(60));
    let scratch = Scratch::new("libraries-exe-only");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999", "--exe-only"],
        &prog,
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let summary = read_summary(&run.out_dir);
    let t = summary.traced();
    let (line, exe_cov) = (t.hot_coverage(), t.exe_coverage_pct());
    // The executable's PLT stubs hold 9-12% of its samples on an AVX-512
    // host (the faster libc's strcmp, the larger their share): a burst
    // starts in their trampolines too (87-89% without them).
    assert!(exe_cov >= 95.0, "{exe_cov}%: {line}");
    assert!(
        t.libraries().is_empty(),
        "--exe-only cloned libraries: {line}"
    );
    assert!(!run.out_dir.join("edges-libc.so.6.fdata").exists());
}

/// The bursts of `run` (saved with `--save-bursts`) that started in a PLT
/// stub of the module whose file name contains `module`, found through
/// its mapping in `context.pb.gz`; and how many of them entered a
/// function's clone next (the stub's trampoline followed its GOT jump).
fn starts_in_plt_stubs(run: &BurstydRun, module: &str) -> (usize, usize) {
    let profile = read_profile(&run.profile_path()).unwrap().raw;
    let name = |i: i64| profile.string_table[i as usize].as_str();
    let m = profile
        .mapping
        .iter()
        .find(|m| {
            Path::new(name(m.filename))
                .file_name()
                .is_some_and(|f| f.to_string_lossy().contains(module))
        })
        .unwrap_or_else(|| panic!("no mapping of {module}"));
    let data = std::fs::read(name(m.filename)).unwrap();
    let file = object::File::parse(&*data).unwrap();
    // AVMA - SVMA, from the segment holding the mapping's offset.
    let bias = file
        .segments()
        .find_map(|seg| {
            let (off, size) = seg.file_range();
            (off..off + size)
                .contains(&m.file_offset)
                .then(|| m.memory_start - (seg.address() + (m.file_offset - off)))
        })
        .expect("the mapping's segment");
    let stubs: Vec<(u64, u64)> = functions::discover(&file, &data)
        .unwrap()
        .iter()
        .filter(|f| f.kind == functions::FunctionKind::Plt)
        .map(|f| (f.start + bias, f.start + bias + f.size))
        .collect();
    let text = std::fs::read_to_string(run.out_dir.join("bursts.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (mut started, mut entered) = (0, 0);
    for (k, r) in records.iter().enumerate() {
        let Some(pc) = r.get("pc").and_then(|p| p.as_str()) else {
            continue;
        };
        let pc = u64::from_str_radix(pc.trim_start_matches("0x"), 16).unwrap();
        if stubs.iter().any(|&(lo, hi)| (lo..hi).contains(&pc)) {
            started += 1;
            if records.get(k + 1).is_some_and(|n| n.get("enter").is_some()) {
                entered += 1;
            }
        }
    }
    (started, entered)
}

/// Executions of the paths through the function `name` (the leaf
/// pseudo-frame's function is "NAME path N: ...").
fn paths_through(p: &Profile, name: &str) -> i64 {
    let prefix = format!("{name} path ");
    p.samples
        .iter()
        .filter(|s| {
            s.frames[0]
                .function
                .as_deref()
                .is_some_and(|f| f.starts_with(&prefix))
        })
        .map(|s| s.values[0])
        .sum()
}

/// glibc's formatted output and allocator, once skipped, are traced:
/// `__vfprintf_internal` dispatches its conversions with `goto *(&&base +
/// table[c])` over label-relative tables, and `_int_malloc`/`_int_free`
/// jump over the `lock` prefix of a `cmpxchg` when single-threaded (glibc's
/// `catomic_*`). With default bursts and a full trace the output of a
/// program that formats and allocates is identical, no record is bad, and
/// each of the three functions has paths; with bursts, the samples over
/// all modules land in instrumented code (>= 95%) and none of the three is
/// among the uninstrumented. (The names come from libc's separate debug
/// file, libc6-dbg.)
#[test]
fn printf_and_the_allocator_in_libc_are_traced() {
    require_root();
    let _serial = serial();
    let exe = fixture("printf_heavy");
    let exe_s = exe.to_str().unwrap();
    // About 4 s untraced: libc is cloned about a second after the start.
    let prog = [exe_s, "3000"];
    each_mode("libc-printf", &prog, &[exe_s, "150"], false, |run, full| {
        if !full {
            let (cov, line) = process_coverage(run);
            assert!(cov >= 95.0, "coverage over all modules {cov}%: {line}");
            let missed = read_summary(&run.out_dir).traced().missed();
            for f in ["__vfprintf_internal", "_int_malloc", "_int_free"] {
                assert!(
                    !missed.iter().any(|(m, _)| m == f),
                    "{f} uninstrumented: {line}"
                );
            }
        }
        let paths = read_profile(&run.out_dir.join("paths.pb.gz")).unwrap();
        for (f, min) in [
            ("__vfprintf_internal", 10_000),
            ("_int_malloc", 1_000),
            ("_int_free", 1_000),
        ] {
            let n = paths_through(&paths, f);
            assert!(
                n >= min,
                "{n} executions of paths through {f} (full trace: {full})"
            );
        }
    });
}

/// A C++ program whose time is in libstdc++ (std::map, unordered_map,
/// string, sort, ostringstream, iostream) and that throws and catches an
/// exception every seventh key: libstdc++, libgcc_s (the unwinder) and
/// libc are cloned, the output is identical with default bursts and a
/// full trace, most samples land in instrumented code and libstdc++ has
/// paths and a BOLT profile of its own.
#[test]
fn cpp_containers_and_iostreams_in_libstdcxx_are_traced() {
    require_root();
    let _serial = serial();
    let exe = fixture("containers");
    let exe_s = exe.to_str().unwrap();
    let prog = [exe_s, "200"];
    each_mode("libraries-cpp", &prog, &[exe_s, "20"], true, |run, full| {
        let libs = read_summary(&run.out_dir).traced().libraries();
        assert!(
            ["libstdc++", "libgcc_s"]
                .iter()
                .all(|l| libs.iter().any(|n| n.starts_with(l))),
            "libstdc++ and libgcc_s cloned: {libs:?}"
        );
        if !full {
            // 99.7-100% with the PLT stubs' trampolines; 92.3-93.8%
            // without them on an AVX-512 host (the executable's
            // memcmp@plt 5%, libstdc++'s locale::id::_M_id@plt 2%, ...).
            assert_covered(run);
            // Bursts do start in those stubs, and go on into the clone of
            // what the stub's GOT slot holds.
            for module in ["containers", "libstdc++"] {
                let (started, entered) = starts_in_plt_stubs(run, module);
                assert!(
                    started >= 5 && entered * 10 >= started * 9,
                    "{module}: {started} bursts started in a PLT stub, {entered} of them entered a clone next"
                );
            }
        }
        let paths = read_profile(&run.out_dir.join("paths.pb.gz")).unwrap();
        let (execs, distinct) = paths_in(&paths, "libstdc++");
        assert!(
            execs >= 10_000 && distinct >= 20,
            "paths in libstdc++: {execs} executions of {distinct} paths (full trace: {full})"
        );
        let fdata = std::fs::read_dir(&run.out_dir).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("edges-libstdc++")
        });
        assert!(fdata, "no edges-libstdc++*.fdata");
    });
}

/// A Python script whose time is in zlib (libz, mapped at start) and
/// hashlib (`_hashlib` and libcrypto, loaded with `dlopen` when the
/// script imports hashlib, after `run` cloned everything mapped at the
/// entry point): the libraries loaded later are cloned too, the output is
/// identical with default bursts and a full trace, the samples over all
/// modules land in instrumented code (>= 95%) and libz and libcrypto have
/// paths.
#[test]
fn python_zlib_and_hashlib_loaded_with_dlopen_are_traced() {
    require_root();
    let _serial = serial();
    let script = workspace_root().join("tests/fixtures/zlib_hashlib.py");
    let (python, script) = ("/usr/bin/python3.11", script.to_str().unwrap());
    // 80 rounds (5 s untraced): the script imports hashlib first thing,
    // and with an empty plan cache libcrypto's analysis and generation
    // take 1.5-3 s after its dlopen; on 30 rounds (1.9 s) the program
    // sometimes ended before its clones were in use.
    each_mode(
        "python-zlib-hashlib",
        &[python, script, "80"],
        &[python, script, "10"],
        false,
        |run, full| {
            // Python dlopens libcrypto (hashlib's extension module) after
            // the attach: it has clones only if they were made then.
            let libs = read_summary(&run.out_dir).traced().libraries();
            assert!(
                libs.iter().any(|l| l == "libcrypto.so.3"),
                "libcrypto was not cloned after its dlopen: {libs:?}"
            );
            if !full {
                assert_covered(run);
            }
            let paths = read_profile(&run.out_dir.join("paths.pb.gz")).unwrap();
            for lib in ["libz.so", "libcrypto.so"] {
                let (execs, distinct) = paths_in(&paths, lib);
                assert!(
                    execs >= 1_000 && distinct >= 5,
                    "paths in {lib}: {execs} executions of {distinct} paths (full trace: {full})"
                );
            }
        },
    );
}
