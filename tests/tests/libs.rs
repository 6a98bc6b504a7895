//! Scenario 3: hot code in shared libraries (libm, libc) is unwound back
//! into the calling fixture: a libm frame with math_work below it, libc's
//! qsort internals between the fixture's comparator and sort_work, and libc
//! string functions called from copy_work.

use burstyd_tests::*;

fn in_lib(f: &Frame, lib: &str) -> bool {
    // e.g. /usr/lib/x86_64-linux-gnu/libm.so.6
    let base = f.mapping_file.rsplit('/').next().unwrap_or("");
    base.starts_with(&format!("{lib}.so")) || base.starts_with(&format!("{lib}-"))
}

/// Samples (weighted) where, leaf first, frames [0..k) are all in `lib`
/// (k >= 1) and frame k is `caller`. If `leaf` is given, frame 0 must be that
/// function and frames [1..k) in `lib`, k >= 2.
fn lib_then_caller(p: &Profile, lib: &str, leaf: Option<&str>, caller: &str) -> i64 {
    p.samples
        .iter()
        .filter(|s| {
            let f = &s.frames;
            let start = match leaf {
                Some(l) => {
                    if f.first().and_then(|x| x.function.as_deref()) != Some(l) {
                        return false;
                    }
                    1
                }
                None => 0,
            };
            let mut k = start;
            while k < f.len() && in_lib(&f[k], lib) {
                k += 1;
            }
            k > start && k < f.len() && f[k].function.as_deref() == Some(caller)
        })
        .map(|s| p.weight(s))
        .sum()
}

fn describe(p: &Profile, n: usize) -> String {
    let mut v: Vec<String> = p
        .samples
        .iter()
        .take(n)
        .map(|s| {
            s.frames
                .iter()
                .map(|f| {
                    format!(
                        "{}[{}]",
                        f.name(),
                        f.mapping_file.rsplit('/').next().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join(" <- ")
        })
        .collect();
    v.insert(
        0,
        format!(
            "{} samples; mappings {:?}; first stacks:",
            p.total_samples(),
            p.mapping_files()
        ),
    );
    v.join("\n  ")
}

#[test]
fn libm_and_libc_frames_unwind_into_the_caller() {
    require_root();
    let (run, _untraced, _scratch) = profile_fixture("libs");

    let p = run.profile();
    assert_contract_shape(&p, "cpu-clock");
    let total = p.total_samples();
    assert!(
        p.mapping_files()
            .iter()
            .any(|m| m.contains("libm.so") || m.contains("libm-")),
        "no libm mapping: {:?}",
        p.mapping_files()
    );

    // libm: sin/exp/pow (~15% of the run) called from math_work.
    let libm = lib_then_caller(&p, "libm", None, "math_work");
    assert!(
        libm as f64 >= 0.05 * total as f64,
        "only {libm} of {total} samples have libm frames directly above math_work\n{}",
        describe(&p, 25)
    );
    // libc qsort: the fixture's comparator, libc's sort internals, sort_work.
    let qsort = lib_then_caller(&p, "libc", Some("cmp_doubles"), "sort_work");
    assert!(
        qsort as f64 >= 0.10 * total as f64,
        "only {qsort} of {total} samples have cmp_doubles <- libc frames <- sort_work\n{}",
        describe(&p, 25)
    );
    // libc string functions (memcpy/strlen) called from copy_work.
    let strings = lib_then_caller(&p, "libc", None, "copy_work");
    assert!(
        strings as f64 >= 0.05 * total as f64,
        "only {strings} of {total} samples have libc frames directly above copy_work\n{}",
        describe(&p, 25)
    );
    // Library frames are symbolized (names from .dynsym/.symtab or debug files).
    let lib_frames: Vec<&Frame> = p
        .samples
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| in_lib(f, "libm") || in_lib(f, "libc"))
        .collect();
    let named = lib_frames.iter().filter(|f| f.function.is_some()).count();
    assert!(
        named as f64 >= 0.9 * lib_frames.len() as f64,
        "only {named} of {} libc/libm frames have a function name",
        lib_frames.len()
    );
    // libc's frames have its source files and lines from its separate
    // debug file (libc6-dbg, which scripts/setup.sh installs): 4 MB of
    // compressed DWARF, which the daemon has a worker process read.
    installed("/usr/share/doc/libc6-dbg", "libc6-dbg");
    let libc_frames = lib_frames.iter().filter(|f| in_lib(f, "libc")).count();
    let with_source = lib_frames
        .iter()
        .filter(|f| {
            in_lib(f, "libc")
                && f.source_file
                    .as_deref()
                    .is_some_and(|s| s.ends_with(".c") || s.ends_with(".S"))
                && f.line > 0
        })
        .count();
    assert!(
        with_source as f64 >= 0.5 * libc_frames as f64,
        "only {with_source} of {libc_frames} libc frames have a source file and line (from libc6-dbg's DWARF)"
    );

    // The reference reader sees the same stacks, all the way down to main.
    let traces = run.traces();
    assert_eq!(count_where(&traces, |_| true), total);
    for caller in ["math_work", "sort_work", "copy_work"] {
        let n = count_where(&traces, |t| {
            t.frames
                .iter()
                .position(|f| f == caller)
                .is_some_and(|i| i > 0 && t.frames[i + 1..].contains(&"main".to_string()))
        });
        assert!(
            n as f64 >= 0.05 * total as f64,
            "-traces: only {n} samples have a frame above {caller} and main below it\n{}",
            describe_traces(&traces, 15)
        );
    }
}
