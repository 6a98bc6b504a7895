//! Scenario 1: a call chain main -> func_a -> func_b -> hot_leaf in a
//! -O2 -fomit-frame-pointer binary must come out whole and in order (leaf
//! first), with the always_inline mix_step as an inline frame, and the
//! program's stdout must be untouched. Also: C++ names come out demangled.

use std::time::Duration;

use burstyd_tests::*;

const CHAIN: [&str; 4] = ["hot_leaf", "func_b", "func_a", "main"];

#[test]
fn call_chain_is_unwound_in_order() {
    require_root();
    let _serial = serial();
    let exe = fixture("call_chain");
    let (run, untraced, _scratch) = profile_fixture("call_chain");

    // Direct decode: contract shape, labels, build id.
    let p = run.profile();
    assert_contract_shape(&p, "cpu-clock");
    let pids: std::collections::BTreeSet<_> =
        p.samples.iter().filter_map(|s| s.label("pid")).collect();
    assert_eq!(
        pids.len(),
        1,
        "`burstyd run` of a single-threaded program gave samples of pids {pids:?}"
    );
    for s in &p.samples {
        assert_eq!(
            s.label("comm"),
            Some("call_chain"),
            "comm label: {:?}",
            s.labels
        );
        assert_eq!(
            s.label("thread"),
            Some("call_chain"),
            "thread label: {:?}",
            s.labels
        );
        assert_eq!(
            s.num_labels.get("tid").map(|t| t.to_string()).as_deref(),
            s.label("pid"),
            "single-threaded program: tid must equal pid"
        );
    }
    let want_id = elf_build_id(&exe).expect("fixture has a build id");
    let exe_canon = std::fs::canonicalize(&exe).unwrap();
    let m = p
        .raw
        .mapping
        .iter()
        .find(|m| {
            Path::new(&p.string(m.filename)) == exe_canon
                || p.string(m.filename).ends_with("/call_chain")
        })
        .unwrap_or_else(|| {
            panic!(
                "no mapping for {}; mappings: {:?}",
                exe.display(),
                p.mapping_files()
            )
        });
    assert_eq!(
        p.string(m.build_id),
        want_id,
        "build id of the fixture's mapping"
    );

    // The reference reader.
    let traces = run.traces();
    let total = count_where(&traces, |_| true);
    assert_eq!(
        total,
        p.total_samples(),
        "go tool pprof and the direct decoder disagree on the sample count"
    );
    // 999 Hz over the program's CPU time; allow for startup and lost samples.
    let expected = 999.0 * untraced.elapsed.as_secs_f64();
    assert!(
        total as f64 >= 0.5 * expected,
        "only {total} samples at --freq 999 for a {:.1}s CPU-bound run (expected ~{expected:.0})\n{}",
        untraced.elapsed.as_secs_f64(),
        describe_traces(&traces, 10)
    );
    let with_leaf = count_where(&traces, |t| t.has("hot_leaf"));
    assert!(
        with_leaf as f64 >= 0.8 * total as f64,
        "hot_leaf is in only {with_leaf} of {total} samples\n{}",
        describe_traces(&traces, 15)
    );
    let with_chain = count_where(&traces, |t| t.has_chain(&CHAIN));
    assert!(
        with_chain as f64 >= 0.9 * with_leaf as f64,
        "only {with_chain} of the {with_leaf} samples with hot_leaf have the chain {CHAIN:?} (leaf first, contiguous)\n{}",
        describe_traces(&traces, 15)
    );
    // Nothing but inline frames of hot_leaf above it.
    let bad_above = count_where(&traces, |t| {
        let i = t.frames.iter().position(|f| f == "hot_leaf");
        i.is_some_and(|i| (0..i).any(|j| !t.inline[j]))
    });
    assert!(
        bad_above as f64 <= 0.02 * with_leaf as f64,
        "{bad_above} samples have non-inline frames above the leaf function hot_leaf\n{}",
        describe_traces(&traces, 15)
    );

    // Inline frames: mix_step is always_inline'd into hot_leaf's loop.
    let with_inline = count_where(&traces, |t| {
        t.has_chain(&["mix_step", "hot_leaf"]) && t.inline[0]
    });
    assert!(
        with_inline as f64 >= 0.5 * with_leaf as f64,
        "only {with_inline} of {with_leaf} hot_leaf samples show the inline frame `mix_step (inline)` \
         above hot_leaf (locations should carry inline frames)\n{}",
        describe_traces(&traces, 10)
    );

    // -top agrees: the leaf work is on top.
    let top = run.top();
    assert!(
        top.first()
            .is_some_and(|r| r.name == "mix_step" || r.name == "hot_leaf"),
        "top of -top is not mix_step/hot_leaf:\n{}",
        describe_top(&top, 10)
    );
    let main_cum = top
        .iter()
        .find(|r| r.name == "main")
        .map(|r| r.cum_pct)
        .unwrap_or(0.0);
    assert!(
        main_cum >= 90.0,
        "main has cum {main_cum}% (< 90%):\n{}",
        describe_top(&top, 15)
    );
}

#[test]
fn cpp_names_are_demangled() {
    require_root();
    let _serial = serial();
    let exe = fixture("demangle");
    let exe_s = exe.to_str().unwrap();
    let untraced = run_untraced(&[exe_s], Duration::from_secs(60));
    let scratch = Scratch::new("demangle");
    let run = burstyd_run(
        &scratch,
        &["--freq", "999"],
        &[exe_s],
        Duration::from_secs(180),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    let traces = run.traces();
    let total = count_where(&traces, |_| true);
    let mangled: Vec<&String> = traces
        .iter()
        .flat_map(|t| &t.frames)
        .filter(|f| f.starts_with("_Z"))
        .collect();
    assert!(
        mangled.is_empty(),
        "mangled names in the profile: {:?}",
        &mangled[..mangled.len().min(5)]
    );
    let spin = count_where(&traces, |t| {
        t.frames
            .iter()
            .any(|f| f.starts_with("burstyd_fx::Worker<unsigned long>::spin"))
            && t.frames.iter().any(|f| f == "main")
    });
    assert!(
        spin as f64 >= 0.8 * total as f64,
        "only {spin} of {total} samples have burstyd_fx::Worker<unsigned long>::spin(...) above main\n{}",
        describe_traces(&traces, 10)
    );
}

use std::path::Path;
