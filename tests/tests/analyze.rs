//! `burstyd analyze`: the rewriter's plan of a binary, as a person and a
//! program read it, and deterministic to the byte.

use std::process::Command;
use std::time::Duration;

use burstyd_tests::*;

fn analyze(args: &[&str]) -> Finished {
    let f = run_timeout(
        Command::new(burstyd_bin()).arg("analyze").args(args),
        Duration::from_secs(120),
    );
    assert!(
        f.status.success(),
        "burstyd analyze {args:?}:\n{}",
        f.describe()
    );
    f
}

#[test]
fn json_summary_has_the_documented_keys() {
    let exe = fixture("call_chain");
    let f = analyze(&["--json", exe.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&f.stdout).expect("valid JSON");
    for key in [
        "functions_total",
        "functions_analyzable",
        "skipped",
        "blocks",
        "loops",
        "paths_total",
        "checks_all",
        "checks_reduced",
        "analysis_ms",
    ] {
        assert!(v.get(key).is_some(), "key {key} missing: {v}");
    }
    let total = v["functions_total"].as_u64().unwrap();
    let ok = v["functions_analyzable"].as_u64().unwrap();
    // All but crt's deregister_tm_clones/register_tm_clones, whose
    // `jmp *%rax` (a tail call through a pointer that is null in practice)
    // the CFG builder does not resolve and so skips.
    assert!(
        total >= 5 && ok + 2 >= total,
        "call_chain: {ok}/{total} analysable: {v}"
    );
    let skipped = v["skipped"].as_object().unwrap();
    assert!(
        skipped.keys().all(|k| k == "UnresolvedIndirectJump"),
        "unexpected skip reasons: {v}"
    );
    assert!(v["checks_reduced"].as_u64() <= v["checks_all"].as_u64());
    assert!(v["paths_total"].as_u64().unwrap() >= total);
}

#[test]
fn one_function_and_its_cfg_as_graphviz() {
    let exe = fixture("call_chain");
    let f = analyze(&["--function", "main", exe.to_str().unwrap()]);
    let text = f.stdout_str();
    assert!(text.starts_with("main at 0x"), "{text}");
    assert!(text.contains("Ball-Larus paths:"), "{text}");
    let f = analyze(&["--function", "main", "--dot", exe.to_str().unwrap()]);
    let dot = f.stdout_str();
    assert!(dot.starts_with("digraph \"main\" {"), "{dot}");
    assert!(dot.trim_end().ends_with('}'), "{dot}");
    assert!(dot.contains(" -> "), "no edges: {dot}");
    // Every edge names blocks that are declared.
    for line in dot.lines().filter(|l| l.contains(" -> ")) {
        let t: Vec<&str> = line.trim().split(' ').collect();
        for b in [t[0], t[2]] {
            assert!(
                dot.contains(&format!("  {b} [label=")),
                "undeclared {b} in {line}"
            );
        }
    }
}

#[test]
fn plans_are_identical_byte_for_byte() {
    let exe = fixture("libs");
    let scratch = Scratch::new("plan");
    let a = scratch.join("a.json");
    let b = scratch.join("b.json");
    for out in [&a, &b] {
        analyze(&["--plan", out.to_str().unwrap(), exe.to_str().unwrap()]);
    }
    let (a, b) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert!(a.len() > 1000, "plan suspiciously small: {} bytes", a.len());
    assert!(a == b, "two plans of the same file differ");
}

#[test]
fn unknown_function_and_non_elf_are_clear_errors() {
    let exe = fixture("call_chain");
    let f = run_timeout(
        Command::new(burstyd_bin())
            .args(["analyze", "--function", "no_such_fn"])
            .arg(&exe),
        Duration::from_secs(60),
    );
    assert!(!f.status.success());
    assert!(
        f.stderr.contains("no function named `no_such_fn`"),
        "{}",
        f.describe()
    );
    let scratch = Scratch::new("notelf");
    let txt = scratch.join("x.txt");
    std::fs::write(&txt, "hello").unwrap();
    let f = run_timeout(
        Command::new(burstyd_bin()).arg("analyze").arg(&txt),
        Duration::from_secs(60),
    );
    assert!(!f.status.success());
    assert!(f.stderr.contains("not an ELF file"), "{}", f.describe());
}

/// A checking entry that falls through 55 bytes of alignment NOPs into
/// the next function (`padded_fallthrough`: the shape of glibc's
/// `__memmove_chk_avx_unaligned_erms`, where every `__memcpy_chk` of a
/// program built with _FORTIFY_SOURCE goes) is analysed, its fall-through
/// a tail call of the next function, not skipped.
#[test]
fn a_fall_through_past_alignment_padding_is_a_tail_call() {
    let exe = fixture("padded_fallthrough");
    let f = analyze(&["--json", exe.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&f.stdout).expect("valid JSON");
    assert!(
        v["skipped"].get("FallsOffEnd").is_none(),
        "a function was skipped as falling off its end: {}",
        v["skipped"]
    );
    let scratch = Scratch::new("padded-fallthrough");
    let plan = scratch.join("plan.json");
    analyze(&["--plan", plan.to_str().unwrap(), exe.to_str().unwrap()]);
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&plan).unwrap()).expect("valid JSON");
    let function = |name: &str| {
        plan["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in the plan"))
            .clone()
    };
    let next = function("plain_copy")["start"].as_u64().unwrap();
    let exits = &function("chk_copy")["status"]["analyzed"]["cfg"]["exits"];
    assert!(
        exits
            .as_array()
            .is_some_and(|e| e.iter().any(|x| x["kind"]["TailCall"]["target"] == next)),
        "chk_copy should be analysed with a tail call of plain_copy ({next:#x}): {exits}"
    );
}
