//! Ball-Larus path numbering on real compiled code: the C fixture
//! `tests/fixtures/paths.c`, built here with gcc at -O0/-O2/-O3, as a -fPIC
//! shared library, with -fcf-protection=full and without PIE, analysed with
//! [`plan::analyze`].
//!
//! - Every analysable function of every build (crt and libc-less helpers
//!   included) with at most [`REGEN_LIMIT`] paths: every number in `[0, N)`
//!   regenerates to a distinct valid path of the CFG whose increments sum to
//!   the number, and `N` equals an independent count of the DAG paths.
//! - Exact block/loop/path counts of the fixture functions, derived by hand
//!   from `objdump -d -M intel` of the gcc 12 (Debian 12.2.0) builds; the
//!   listings are quoted next to the assertions.
//! - The plan JSON is byte-identical across two analyses of each build.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use userspace_rewriter::analysis::cfg::{Exit, ExitKind};
use userspace_rewriter::analysis::graph::{self, Graph, Loops};
use userspace_rewriter::analysis::paths::{
    PathNumbering, PathsError, RegeneratedPath, number_paths,
};
use userspace_rewriter::analysis::plan::{
    self, FunctionAnalysis, FunctionStatus, Plan, PlanOptions,
};

/// The builds: (name, gcc flags). Output names are prefixed with `paths-`
/// so they cannot clash with other fixtures in the shared build directory.
const VARIANTS: &[(&str, &[&str])] = &[
    ("O0", &["-O0", "-fpie", "-pie"]),
    ("O2", &["-O2", "-fpie", "-pie"]),
    ("O3", &["-O3", "-fpie", "-pie"]),
    ("O2-pic.so", &["-O2", "-fPIC", "-shared", "-DNO_MAIN"]),
    ("O2-cet", &["-O2", "-fpie", "-pie", "-fcf-protection=full"]),
    ("O2-nopie", &["-O2", "-fno-pie", "-no-pie"]),
];

/// Functions with more paths than this are not regenerated exhaustively
/// (they are counted and reported, and [`SAMPLES`] of their numbers are
/// checked).
const REGEN_LIMIT: u64 = 1 << 16;

/// How many numbers, spread over `[0, N)`, are regenerated for a function
/// above [`REGEN_LIMIT`].
const SAMPLES: u64 = 4096;

fn build(name: &str) -> PathBuf {
    let (_, flags) = VARIANTS
        .iter()
        .find(|v| v.0 == name)
        .unwrap_or_else(|| panic!("no variant {name}"));
    common::build("paths.c", &format!("paths-{name}"), flags, false)
}

fn plan_of(name: &str) -> Plan {
    let data = std::fs::read(build(name)).unwrap();
    plan::analyze(&data, &PlanOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .plan
}

/// Graph and loops of an analysed function, recomputed from its CFG the way
/// the plan does it.
fn graph_and_loops(fa: &FunctionAnalysis) -> (Graph, Loops) {
    let cfg = fa.cfg.as_ref().expect("keep_details keeps the CFG");
    let g = cfg.to_graph();
    let l = graph::loops(&g, &graph::dominators(&g));
    (g, l)
}

/// The number of DAG paths (Ball-Larus, back and retreating edges cut),
/// counted independently of [`PathNumbering`]: paths start at the entry or
/// at a target of a cut edge, follow uncut edges, and end at an exit block
/// or by taking a cut edge. Saturates at `u128::MAX`.
fn count_dag_paths(g: &Graph, l: &Loops) -> u128 {
    let live = graph::reachable(g);
    let n = g.len();
    // Paths from v to the end, by iterative post-order over uncut edges.
    let mut count: Vec<Option<u128>> = vec![None; n];
    let mut on_stack = vec![false; n];
    let mut from = |start: usize, count: &mut Vec<Option<u128>>| -> u128 {
        let mut stack = vec![start];
        while let Some(&v) = stack.last() {
            if count[v].is_some() {
                stack.pop();
                continue;
            }
            on_stack[v] = true;
            let pending: Vec<usize> = (0..g.succs[v].len())
                .filter(|&i| !l.is_cut(v, i))
                .map(|i| g.succs[v][i])
                .filter(|&w| count[w].is_none())
                .collect();
            if let Some(&w) = pending.first() {
                assert!(!on_stack[w], "cycle through {w} after cutting");
                stack.push(w);
                continue;
            }
            let mut c: u128 = u128::from(g.is_exit(v));
            for (i, &w) in g.succs[v].iter().enumerate() {
                c = c.saturating_add(if l.is_cut(v, i) { 1 } else { count[w].unwrap() });
            }
            count[v] = Some(c);
            on_stack[v] = false;
            stack.pop();
        }
        count[start].unwrap()
    };
    let mut total = from(g.entry, &mut count);
    let heads: BTreeSet<usize> = l
        .cut_edges()
        .into_iter()
        .filter(|&(v, _)| live[v])
        .map(|(v, i)| g.succs[v][i])
        .collect();
    for h in heads {
        total = total.saturating_add(from(h, &mut count));
    }
    total
}

/// Checks that `p`, the regeneration of `number`, is a path of the DAG of
/// `g` and that its increments sum to `number`.
fn check_path(g: &Graph, l: &Loops, pn: &PathNumbering, number: u64, p: &RegeneratedPath) {
    let ctx = || format!("path {number}: {p:?}");
    assert!(!p.blocks.is_empty(), "{}", ctx());
    assert_eq!(p.edges.len() + 1, p.blocks.len(), "{}", ctx());
    let first = p.blocks[0];
    let last = *p.blocks.last().unwrap();
    let mut sum: u64 = if p.starts_at_loop_header {
        // Target of a cut edge (loop header or irreducible-region entry).
        assert!(
            l.cut_edges().iter().any(|&(v, i)| g.succs[v][i] == first),
            "{}: starts at {first}, not a loop header",
            ctx()
        );
        pn.loop_start_increment(first)
            .unwrap_or_else(|| panic!("{}: no loop start for {first}", ctx()))
    } else {
        assert_eq!(first, g.entry, "{}", ctx());
        0
    };
    for (k, &(v, i)) in p.edges.iter().enumerate() {
        assert_eq!(v, p.blocks[k], "{}", ctx());
        assert!(i < g.succs[v].len(), "{}: ({v}, {i}) not an edge", ctx());
        assert_eq!(g.succs[v][i], p.blocks[k + 1], "{}", ctx());
        assert!(!l.is_cut(v, i), "{}: takes cut edge ({v}, {i})", ctx());
        sum += pn
            .increment(v, i)
            .unwrap_or_else(|| panic!("{}: no increment on ({v}, {i})", ctx()));
    }
    if p.ends_at_back_edge {
        let (v, i) = p.end_edge.unwrap_or_else(|| panic!("{}", ctx()));
        assert_eq!(v, last, "{}", ctx());
        assert!(l.is_cut(v, i), "{}: ({v}, {i}) is not cut", ctx());
        let (end, restart) = pn.back_edge_actions(v, i).unwrap();
        assert_eq!(
            Some(restart),
            pn.loop_start_increment(g.succs[v][i]),
            "{}",
            ctx()
        );
        sum += end;
    } else {
        assert_eq!(p.end_edge, None, "{}", ctx());
        assert!(g.is_exit(last), "{}: {last} is not an exit", ctx());
        sum += pn
            .exit_increment(last)
            .unwrap_or_else(|| panic!("{}: no exit increment at {last}", ctx()));
    }
    assert_eq!(sum, number, "{}: increments sum to {sum}", ctx());
}

/// Per-build statistics of [`every_path_regenerates_in_every_function`].
#[derive(Default, Debug)]
struct Stats {
    functions: usize,
    analysable: usize,
    regenerated_functions: usize,
    regenerated_paths: u64,
    above_limit: Vec<(String, u64)>,
    too_many: Vec<String>,
    max_regenerated: (u64, String),
}

#[test]
fn every_path_regenerates_in_every_function() {
    let mut report = String::new();
    for (name, _) in VARIANTS {
        let plan = plan_of(name);
        let mut st = Stats::default();
        for f in &plan.functions {
            let fa = match &f.status {
                FunctionStatus::Plt => continue,
                FunctionStatus::Skipped { .. } => {
                    st.functions += 1;
                    continue;
                }
                FunctionStatus::Analyzed(fa) => fa,
            };
            st.functions += 1;
            st.analysable += 1;
            let ctx = format!("{name} {} at {:#x}", f.name, f.start);
            let (g, l) = graph_and_loops(fa);
            let expected = count_dag_paths(&g, &l);
            let Some(pn) = fa.numbering.as_ref() else {
                // Only legitimate reason: more than u64::MAX paths.
                assert!(
                    matches!(number_paths(&g, &l), Err(PathsError::TooManyPaths { .. })),
                    "{ctx}: no numbering: {:?}",
                    number_paths(&g, &l)
                );
                assert!(expected > u128::from(u64::MAX), "{ctx}");
                assert_eq!(fa.paths, None, "{ctx}");
                st.too_many.push(f.name.clone());
                continue;
            };
            let n = pn.total_paths();
            assert_eq!(fa.paths, Some(n), "{ctx}");
            assert_eq!(u128::from(n), expected, "{ctx}: N vs independent count");
            assert!(n >= 1, "{ctx}");
            assert!(
                matches!(pn.regenerate(n), Err(PathsError::PathOutOfRange { .. })),
                "{ctx}"
            );
            // Every number up to the limit; above it, SAMPLES numbers spread
            // over [0, N) (first and last included).
            let numbers: Vec<u64> = if n > REGEN_LIMIT {
                st.above_limit.push((f.name.clone(), n));
                let steps = u128::from(SAMPLES - 1);
                (0..SAMPLES)
                    .map(|i| (u128::from(i) * u128::from(n - 1) / steps) as u64)
                    .collect()
            } else {
                (0..n).collect()
            };
            let mut seen = BTreeSet::new();
            for k in numbers {
                let p = pn
                    .regenerate(k)
                    .unwrap_or_else(|e| panic!("{ctx}: regenerate({k}): {e}"));
                check_path(&g, &l, pn, k, &p);
                assert!(seen.insert(p), "{ctx}: path {k} regenerated twice");
            }
            if n > REGEN_LIMIT {
                continue;
            }
            st.regenerated_functions += 1;
            st.regenerated_paths += n;
            if n > st.max_regenerated.0 {
                st.max_regenerated = (n, f.name.clone());
            }
        }
        assert!(st.regenerated_functions >= 12, "{name}: {st:?}");
        report += &format!(
            "{name:10} functions {:3} analysable {:3} regenerated {:3} ({} paths, largest {} in {}), \
             above 2^16 (sampled): {:?}, above u64: {:?}\n",
            st.functions,
            st.analysable,
            st.regenerated_functions,
            st.regenerated_paths,
            st.max_regenerated.0,
            st.max_regenerated.1,
            st.above_limit,
            st.too_many,
        );
    }
    eprint!("{report}");
}

/// Block/loop/path counts and the graph of one function, for failure
/// messages and for deriving the expectations.
fn describe(fa: &FunctionAnalysis) -> String {
    let (g, l) = graph_and_loops(fa);
    format!(
        "blocks {} edges {} loops {} back {:?} retreating {:?} paths {:?}\nsuccs {:?} exits {:?}",
        fa.blocks,
        fa.edges,
        fa.loops.len(),
        l.back_edges,
        l.retreating_non_back,
        fa.paths,
        g.succs,
        g.exits
    )
}

fn analysed<'a>(plan: &'a Plan, name: &str) -> &'a FunctionAnalysis {
    let f = plan
        .functions
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} not found"));
    match &f.status {
        FunctionStatus::Analyzed(fa) => fa,
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn plan_json_is_byte_identical_across_analyses() {
    for (name, _) in VARIANTS {
        let data = std::fs::read(build(name)).unwrap();
        let a = plan::analyze(&data, &PlanOptions::default()).unwrap();
        let b = plan::analyze(&data, &PlanOptions::default()).unwrap();
        let ja = serde_json::to_vec(&a.plan).unwrap();
        let jb = serde_json::to_vec(&b.plan).unwrap();
        assert!(ja == jb, "{name}: plan JSON differs between two analyses");
        // The details are in it: CFGs and numberings.
        let s = String::from_utf8(ja).unwrap();
        assert!(s.contains("\"numbering\":"), "{name}");
        assert!(s.contains("\"pf_loop_if\""), "{name}");
    }
}

/// Expected shape of one fixture function in one family of builds.
struct Expect {
    name: &'static str,
    blocks: usize,
    edges: usize,
    loops: usize,
    /// Back edges (no fixture function is irreducible).
    back_edges: usize,
    paths: u64,
    /// PEP §3.1's four kinds of paths: (entry -> exit, entry -> back edge,
    /// loop header -> exit, loop header -> back edge).
    kinds: (u64, u64, u64, u64),
}

const fn e(
    name: &'static str,
    blocks: usize,
    edges: usize,
    loops: usize,
    back_edges: usize,
    paths: u64,
    kinds: (u64, u64, u64, u64),
) -> Expect {
    Expect {
        name,
        blocks,
        edges,
        loops,
        back_edges,
        paths,
        kinds,
    }
}

/// -O0 (PIE). Every function has the `push rbp; mov rbp,rsp` frame; blocks
/// are split after calls (a call falls through to its return point).
///
/// ```text
/// pf_one_if: 4 blocks, 2 paths (both arms meet again at 1186)
/// 1163: push rbp ... cmp [rbp-0x4],0x0
/// 116e: jle  117c                B0 -> B2 (Taken), B1 (NotTaken)
/// 1170: mov  [sink],0x1
/// 117a: jmp  1186                B1 -> B3
/// 117c: mov  [sink],0x2          B2 -> B3
/// 1186: mov eax,[rbp-0x4] ... ret      B3: exit
///
/// pf_loop_if: the condition is at the bottom (1202) and the entry jumps to
/// it, so it is the loop header; back edge B4 -> B5.
/// 11c2: push rbp ... jmp 1202    B0 -> B5
/// 11d2: ... test eax,eax; je 11ef      B1 -> B3, B2
/// 11dc: ... jmp 11fe             B2 -> B4   (odd: sink += i)
/// 11ef: ...                      B3 -> B4   (even: sink -= i)
/// 11fe: add [rbp-0x4],0x1        B4 -> B5   (back edge, cut)
/// 1202: cmp eax,[rbp-0x14]; jl 11d2    B5 -> B1, B6
/// 120a: mov eax,[sink]; pop rbp; ret   B6: exit
/// NumPaths: B6 = 1, B4 = 1 (its cut edge), B2 = B3 = 1, B1 = 2,
/// B5 = B1 + B6 = 3, B0 = 3; plus the loop start at B5 (3): N = 6.
/// entry->exit: B0 B5 B6; entry->back: B0 B5 B1 {B2|B3} B4;
/// header->exit: B5 B6; header->back: B5 B1 {B2|B3} B4.
///
/// pf_nested: same layout twice; outer header B5 (1254), inner B3 (1248).
/// 1212: ... jmp 1254             B0 -> B5
/// 1225: mov [rbp-0x8],0; jmp 1248      B1 -> B3
/// 122e: ... (inner body)         B2 -> B3   (inner back edge)
/// 1248: cmp; jl 122e             B3 -> B2, B4
/// 1250: add [rbp-0x4],0x1        B4 -> B5   (outer back edge)
/// 1254: cmp; jl 1225             B5 -> B1, B6
/// 125c: ... ret                  B6: exit
/// NumPaths: B2 = B4 = 1, B3 = 2, B1 = 2, B5 = 3, B0 = 3; loop starts
/// B3 (2) and B5 (3): N = 3 + 2 + 3 = 8.
///
/// pf_switch: B0 `cmp [rbp-0x4],0x7; ja 1335`, B1 the `jmp rax` with 8
/// targets, 8 case blocks each `jmp 1336`, B10 = 1335 `nop` (default),
/// B11 = 1336 `mov eax,[sink]; pop rbp; ret`: 12 blocks, 2 + 8 + 8 + 1 = 19
/// edges, 8 + 1 = 9 paths.
///
/// pf_fib: `cmp [rbp-0x14],0x1; jg 1357` (B0), 1350 `cdqe; jmp 1377` (B1),
/// 1357 `call pf_fib` (B2), 1364 `call pf_fib` (B3), 1374 `add rax,rbx`
/// (B4), 1377 `leave; ret` (B5): 6 blocks, 6 edges, 2 paths.
///
/// pf_tail: `call pf_leaf` (B0), `leave; ret` (B1): 2 blocks, 1 path.
///
/// pf_noreturn: `cmp [rbp-0x4],0x2a; jne 13ee` (B0), 13e4 `mov edi,0x3;
/// call pf_die` (B1, exit: pf_die is noreturn), 13ee `... ret` (B2).
///
/// pf_ten_ifs / pf_twenty_ifs: per if, `mov eax,[rbp-0x4]; and eax,bit;
/// test eax,eax; je next` and the store: 2 blocks and 3 edges per if, plus
/// the return block: 21 blocks/30 edges/2^10 paths, 41/60/2^20.
const O0: &[Expect] = &[
    e("pf_straight", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_one_if", 4, 4, 0, 0, 2, (2, 0, 0, 0)),
    e("pf_two_ifs", 5, 6, 0, 0, 4, (4, 0, 0, 0)),
    e("pf_loop_if", 7, 8, 1, 1, 6, (1, 2, 1, 2)),
    e("pf_nested", 7, 8, 2, 2, 8, (1, 2, 1, 4)),
    e("pf_switch", 12, 19, 0, 0, 9, (9, 0, 0, 0)),
    e("pf_fib", 6, 6, 0, 0, 2, (2, 0, 0, 0)),
    e("pf_leaf", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_tail", 2, 1, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_die", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_noreturn", 3, 2, 0, 0, 2, (2, 0, 0, 0)),
    e("pf_ten_ifs", 21, 30, 0, 0, 1 << 10, (1 << 10, 0, 0, 0)),
    e("pf_twenty_ifs", 41, 60, 0, 0, 1 << 20, (1 << 20, 0, 0, 0)),
];

/// -O2 PIE. The same code at -O3 (the pf_ functions' text is identical),
/// with -fcf-protection=full (an `endbr64` first, same blocks) and with
/// -no-pie (absolute `sink` addresses, same blocks).
///
/// ```text
/// pf_straight:  mov edx,[sink]; lea eax,[rdi+rdi*2]; add eax,edx; ret
///
/// pf_one_if: gcc duplicates the return into both arms.
/// 11f0: test edi,edi; jle 1208   B0 -> B2, B1
/// 11f4: mov [sink],0x1; lea; ret B1: exit
/// 1208: mov [sink],0x2; lea; ret B2: exit
///
/// pf_two_ifs:
/// 1220: mov eax,edi; test al,0x1; je 1230   B0 -> B2, B1
/// 1226: mov [sink],0x1                      B1 -> B2
/// 1230: test al,0x2; je 123e                B2 -> B4, B3
/// 1234: mov [sink],0x2                      B3 -> B4
/// 123e: ret                                 B4: exit      2 * 2 = 4 paths
///
/// pf_loop_if: rotated loop, the body is split by the if; both arms close
/// the loop with their own back edge to the header B3 (125f).
/// 1240: test edi,edi; jle 1278   B0 -> B5, B1
/// 1244: xor eax,eax; jmp 125f    B1 -> B3
/// 1250: add edx,eax ... cmp edi,eax; je 1278   B2 -> B5, B3 (back edge)
/// 125f: mov edx,[sink]; test al,0x1; jne 1250  B3 -> B2, B4
/// 1269: sub edx,eax ... cmp edi,eax; jne 125f  B4 -> B3 (back edge), B5
/// 1278: mov eax,[sink]; ret      B5: exit
/// NumPaths: B5 = 1, B2 = B4 = 2 (exit or back edge), B3 = 4, B1 = 4,
/// B0 = 1 + 4 = 5; loop start B3 (4): N = 9.
/// entry->exit: B0 B5, B0 B1 B3 B2 B5, B0 B1 B3 B4 B5 (3);
/// entry->back: B0 B1 B3 {B2|B4} (2); header->exit: B3 {B2|B4} B5 (2);
/// header->back: B3 {B2|B4} (2).
///
/// pf_nested:
/// 1280: test edi,edi; jle 12bb   B0 -> B6, B1
/// 1284: xor r8d,r8d; test esi,esi; jle 12bb    B1 -> B6, B2
/// 128b: nop                      B2 -> B3
/// 1290: xor eax,eax; nop         B3 -> B4   (outer header)
/// 1298: ... cmp esi,eax; jne 1298      B4 -> B4 (self loop), B5
/// 12b2: add r8d,1; cmp; jne 1290       B5 -> B3 (back edge), B6
/// 12bb: mov eax,[sink]; ret      B6: exit
/// NumPaths: B6 = 1, B5 = 2, B4 = B5 + 1 = 3, B3 = B2 = 3, B1 = 4, B0 = 5;
/// loop starts B3 (3) and B4 (3): N = 11.
///
/// pf_switch:
/// 12d0: cmp edi,0x7; ja 12fa     B0 -> B3, B1
/// 12d5: lea rdx,[rip+T] ... jmp rax    B1 -> 8 case blocks
/// 12f0: mov [sink],0xa           B2 -> B3   (case 0 falls into the return)
/// 12fa: mov eax,[sink]; ret      B3: exit   (default and case 0)
/// 1308, 1330, 1350, 1370, 1390, 13b0, 13d0: cases 6, 7, 1, 2, 3, 4, 5,
///       each ending in its own `ret` (B4..B10)
/// 11 blocks, 2 + 8 + 1 = 11 edges, 1 + 8 = 9 paths.
///
/// pf_fib: the second recursive call became a loop (header B2).
/// 13f0: push ...; cmp edi,0x1; jle 1416     B0 -> B5, B1
/// 13fe: mov ebx,edi                         B1 -> B2
/// 1400: lea edi,[rbx-1]; sub ebx,2; call pf_fib   B2 -> B3
/// 140b: add r12,rax; cmp ebx,1; jg 1400     B3 -> B2 (back edge), B4
/// 1413: and ebp,0x1                         B4 -> B5
/// 1416: movsxd rax,ebp ... ret              B5: exit
/// NumPaths: B5 = B4 = 1, B3 = 2, B2 = B1 = 2, B0 = 3; loop start B2 (2):
/// N = 5: entry->exit B0 B5, B0 B1 B2 B3 B4 B5; entry->back B0 B1 B2 B3;
/// header->exit B2 B3 B4 B5; header->back B2 B3.
///
/// pf_tail:      mov esi,0x7; jmp pf_leaf          1 block, exit TailCall
/// pf_die:       sub rsp,8; mov [sink],edi; call exit@plt
/// pf_noreturn:
/// 1460: cmp edi,0x2a; je 146f    B0 -> B2, B1
/// 1465: mov [sink],edi; lea eax,[rdi+1]; ret   B1: exit Return
/// 146f: push rax; mov edi,0x3; call pf_die     B2: exit NoReturnCall
///
/// pf_ten_ifs: per if `test dil,bit; je next; mov [sink],k`: 2 blocks and
/// 3 edges each, plus the return block.
/// ```
const O2: &[Expect] = &[
    e("pf_straight", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_one_if", 3, 2, 0, 0, 2, (2, 0, 0, 0)),
    e("pf_two_ifs", 5, 6, 0, 0, 4, (4, 0, 0, 0)),
    e("pf_loop_if", 6, 9, 1, 2, 9, (3, 2, 2, 2)),
    e("pf_nested", 7, 10, 2, 2, 11, (3, 2, 2, 4)),
    e("pf_switch", 11, 11, 0, 0, 9, (9, 0, 0, 0)),
    e("pf_fib", 6, 7, 1, 1, 5, (2, 1, 1, 1)),
    e("pf_leaf", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_tail", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_die", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_noreturn", 3, 2, 0, 0, 2, (2, 0, 0, 0)),
    e("pf_ten_ifs", 21, 30, 0, 0, 1 << 10, (1 << 10, 0, 0, 0)),
    e("pf_twenty_ifs", 41, 60, 0, 0, 1 << 20, (1 << 20, 0, 0, 0)),
];

/// -O2 -fPIC -shared: `sink` is reached through the GOT (`mov rdx,[rip+GOT]`
/// first), and for the functions whose early exit reads `sink` gcc gives
/// that exit its own GOT load and `ret`: one more block, same paths.
///
/// ```text
/// pf_loop_if:
/// 11a0: test edi,edi; jle 11d0   B0 -> B6, B1
/// 11a4: mov rdx,[GOT]; xor eax,eax; jmp 11bb   B1 -> B3
/// 11b0 .. 11cc: as at -O2 (B2, B3, B4), 11cc `mov eax,[rdx]; ret` (B5)
/// 11d0: mov rdx,[GOT]; mov eax,[rdx]; ret      B6: exit
///
/// pf_nested: likewise, 1220 `mov rcx,[GOT]; mov eax,[rcx]; ret` is the
/// exit of both `jle` (B7): 8 blocks, 10 edges, 11 paths.
///
/// pf_switch: the default (`ja 1311`) is a block of its own that jumps to
/// the shared return (B11 -> B3): 12 blocks, 12 edges, 9 paths.
///
/// pf_tail: mov esi,0x7; jmp pf_leaf@plt (pf_leaf is interposable).
/// ```
const PIC: &[Expect] = &[
    e("pf_straight", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_one_if", 3, 2, 0, 0, 2, (2, 0, 0, 0)),
    e("pf_two_ifs", 5, 6, 0, 0, 4, (4, 0, 0, 0)),
    e("pf_loop_if", 7, 9, 1, 2, 9, (3, 2, 2, 2)),
    e("pf_nested", 8, 10, 2, 2, 11, (3, 2, 2, 4)),
    e("pf_switch", 12, 12, 0, 0, 9, (9, 0, 0, 0)),
    e("pf_fib", 6, 7, 1, 1, 5, (2, 1, 1, 1)),
    e("pf_leaf", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_tail", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_die", 1, 0, 0, 0, 1, (1, 0, 0, 0)),
    e("pf_noreturn", 3, 2, 0, 0, 2, (2, 0, 0, 0)),
    e("pf_ten_ifs", 21, 30, 0, 0, 1 << 10, (1 << 10, 0, 0, 0)),
    e("pf_twenty_ifs", 41, 60, 0, 0, 1 << 20, (1 << 20, 0, 0, 0)),
];

/// PEP §3.1's path kinds of a numbering, counted over all its paths (only
/// called for functions without loops above [`REGEN_LIMIT`]).
fn path_kinds(pn: &PathNumbering) -> (u64, u64, u64, u64) {
    let mut k = (0, 0, 0, 0);
    for n in 0..pn.total_paths() {
        let p = pn.regenerate(n).unwrap();
        match (p.starts_at_loop_header, p.ends_at_back_edge) {
            (false, false) => k.0 += 1,
            (false, true) => k.1 += 1,
            (true, false) => k.2 += 1,
            (true, true) => k.3 += 1,
        }
    }
    k
}

#[test]
fn fixture_functions_have_the_hand_derived_counts() {
    for (name, _) in VARIANTS {
        let table = match *name {
            "O0" => O0,
            "O2-pic.so" => PIC,
            _ => O2,
        };
        let plan = plan_of(name);
        let path = build(name);
        for x in table {
            let fa = analysed(&plan, x.name);
            let f = plan.functions.iter().find(|f| f.name == x.name).unwrap();
            let ctx = || {
                format!(
                    "{name} {}: {}\n{}",
                    x.name,
                    describe(fa),
                    common::objdump(&path, f.start, f.start + f.size)
                )
            };
            assert_eq!(fa.blocks, x.blocks, "blocks of {}", ctx());
            assert_eq!(fa.edges, x.edges, "edges of {}", ctx());
            assert_eq!(fa.loops.len(), x.loops, "loops of {}", ctx());
            assert_eq!(fa.back_edges, x.back_edges, "back edges of {}", ctx());
            assert!(!fa.irreducible, "{}", ctx());
            assert_eq!(fa.paths, Some(x.paths), "paths of {}", ctx());
            let pn = fa.numbering.as_ref().unwrap();
            let kinds = if x.paths <= REGEN_LIMIT {
                path_kinds(pn)
            } else {
                // Loop-free: every path runs from the entry to an exit.
                assert_eq!(fa.back_edges, 0, "{}", ctx());
                (x.paths, 0, 0, 0)
            };
            assert_eq!(kinds, x.kinds, "path kinds of {}", ctx());
        }

        // The noreturn call ends a path of its own, and the tail call is
        // the exit of pf_tail.
        let fa = analysed(&plan, "pf_noreturn");
        let cfg = fa.cfg.as_ref().unwrap();
        // In the shared library the call goes through `pf_die@plt`.
        let die: Vec<u64> = plan
            .functions
            .iter()
            .filter(|f| f.name == "pf_die" || f.name == "pf_die@plt")
            .map(|f| f.start)
            .collect();
        let die_block = cfg
            .exits
            .iter()
            .find(|x| matches!(x.kind, ExitKind::NoReturnCall { target: Some(t) } if die.contains(&t)))
            .unwrap_or_else(|| panic!("{name}: no noreturn exit: {:?}", cfg.exits))
            .block;
        let pn = fa.numbering.as_ref().unwrap();
        let ends: Vec<usize> = (0..pn.total_paths())
            .map(|k| *pn.regenerate(k).unwrap().blocks.last().unwrap())
            .collect();
        assert_eq!(
            ends.iter().filter(|&&b| b == die_block).count(),
            1,
            "{name}"
        );
        if *name != "O0" {
            let cfg = analysed(&plan, "pf_tail").cfg.as_ref().unwrap();
            assert!(
                matches!(
                    cfg.exits[..],
                    [Exit {
                        kind: ExitKind::TailCall { .. },
                        ..
                    }]
                ),
                "{name}: {:?}",
                cfg.exits
            );
        }
    }
}
