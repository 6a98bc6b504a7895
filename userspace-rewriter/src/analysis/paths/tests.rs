//! Unit tests of the Ball-Larus numbering: the classic example of Ball &
//! Larus, loop truncation, PEP's smart numbering, the bijection between
//! numbers and DAG paths on fixed and random graphs, too many paths.

use super::*;
use crate::analysis::graph::tests::{Rng, graph, random_graph};
use crate::analysis::graph::{Graph, Loops, dominators, loops, reachable};
use std::collections::BTreeSet;

fn number(g: &Graph) -> (Loops, PathNumbering) {
    let l = loops(g, &dominators(g));
    let p = number_paths(g, &l).unwrap();
    (l, p)
}

/// All DAG paths, enumerated directly from the graph and its cut edges,
/// independently of the numbering. `None` if there are more than `cap`.
fn enumerate_dag_paths(g: &Graph, l: &Loops, cap: usize) -> Option<BTreeSet<RegeneratedPath>> {
    let live = reachable(g);
    let cut: Vec<(usize, usize)> = l
        .cut_edges()
        .into_iter()
        .filter(|&(v, _)| live[v])
        .collect();
    let mut starts = vec![(g.entry, false)];
    let mut heads: Vec<usize> = cut.iter().map(|&(v, i)| g.succs[v][i]).collect();
    heads.sort_unstable();
    heads.dedup();
    starts.extend(heads.into_iter().map(|h| (h, true)));
    let mut out = BTreeSet::new();
    fn walk(
        g: &Graph,
        cut: &[(usize, usize)],
        p: &mut RegeneratedPath,
        out: &mut BTreeSet<RegeneratedPath>,
        cap: usize,
    ) -> bool {
        if out.len() > cap {
            return false;
        }
        let v = *p.blocks.last().unwrap();
        if g.succs[v].is_empty() || g.exits.contains(&v) {
            assert!(out.insert(p.clone()));
        }
        for i in 0..g.succs[v].len() {
            if cut.contains(&(v, i)) {
                let mut q = p.clone();
                q.ends_at_back_edge = true;
                q.end_edge = Some((v, i));
                assert!(out.insert(q));
            } else {
                p.blocks.push(g.succs[v][i]);
                p.edges.push((v, i));
                let ok = walk(g, cut, p, out, cap);
                p.blocks.pop();
                p.edges.pop();
                if !ok {
                    return false;
                }
            }
        }
        true
    }
    for (s, at_header) in starts {
        let mut p = RegeneratedPath {
            blocks: vec![s],
            edges: vec![],
            starts_at_loop_header: at_header,
            ends_at_back_edge: false,
            end_edge: None,
        };
        if !walk(g, &cut, &mut p, &mut out, cap) {
            return None;
        }
    }
    Some(out)
}

/// Sum of the increments the instrumentation adds along `p`.
fn path_sum(pn: &PathNumbering, p: &RegeneratedPath) -> u64 {
    let mut r = if p.starts_at_loop_header {
        pn.loop_start_increment(p.blocks[0]).unwrap()
    } else {
        0
    };
    for &(v, i) in &p.edges {
        r += pn.increment(v, i).unwrap();
    }
    match p.end_edge {
        Some((v, i)) => r + pn.back_edge_actions(v, i).unwrap().0,
        None => r + pn.exit_increment(*p.blocks.last().unwrap()).unwrap(),
    }
}

/// The bijection property: every number in [0, N) regenerates to a valid,
/// distinct DAG path whose increments sum to the number, and (when small
/// enough to enumerate) the regenerated paths are exactly the DAG paths.
/// Returns whether the brute-force comparison ran (the DAG was small
/// enough to enumerate).
fn check_bijection(g: &Graph, l: &Loops, pn: &PathNumbering) -> bool {
    let n = pn.total_paths();
    assert!(n >= 1);
    let live = reachable(g);
    let mut seen = BTreeSet::new();
    let limit = n.min(20_000);
    for k in 0..limit {
        let p = pn.regenerate(k).unwrap();
        // Valid: consecutive blocks joined by the listed, uncut edges.
        assert_eq!(p.edges.len() + 1, p.blocks.len());
        for (j, &(v, i)) in p.edges.iter().enumerate() {
            assert_eq!(p.blocks[j], v);
            assert_eq!(g.succs[v][i], p.blocks[j + 1]);
            assert!(!l.is_cut(v, i));
        }
        assert!(p.blocks.iter().all(|&b| live[b]));
        if p.starts_at_loop_header {
            let h = p.blocks[0];
            assert!(l.cut_edges().iter().any(|&(v, i)| g.succs[v][i] == h));
        } else {
            assert_eq!(p.blocks[0], g.entry);
        }
        let last = *p.blocks.last().unwrap();
        match p.end_edge {
            Some((v, i)) => {
                assert!(p.ends_at_back_edge);
                assert_eq!(v, last);
                assert!(l.is_cut(v, i));
            }
            None => {
                assert!(!p.ends_at_back_edge);
                assert!(g.is_exit(last));
            }
        }
        assert_eq!(path_sum(pn, &p), k, "{g:?} path {p:?}");
        assert!(seen.insert(p), "duplicate path for {k}");
    }
    assert_eq!(
        pn.regenerate(n),
        Err(PathsError::PathOutOfRange { path: n, total: n })
    );
    if let Some(all) = enumerate_dag_paths(g, l, 20_000) {
        assert_eq!(all.len() as u64, n, "{g:?}");
        assert_eq!(all, seen);
        true
    } else {
        false
    }
}

/// Ball & Larus 1996, Figure 1 (also Ammons, Ball & Larus 1997, Figure 1):
/// A -> {C, B}, B -> {C, D}, C -> D, D -> {F, E}, E -> F; six paths with
/// encodings ACDF 0, ACDEF 1, ABCDF 2, ABCDEF 3, ABDF 4, ABDEF 5.
fn ball_larus_figure() -> Graph {
    const A: usize = 0;
    const B: usize = 1;
    const C: usize = 2;
    const D: usize = 3;
    const E: usize = 4;
    const F: usize = 5;
    let mut g = graph(&[&[C, B], &[C, D], &[D], &[F, E], &[F], &[]], &[F]);
    g.entry = A;
    g
}

#[test]
fn paths_ball_larus_classic_example() {
    let g = ball_larus_figure();
    let (l, pn) = number(&g);
    assert_eq!(pn.total_paths(), 6);
    // NumPaths: A 6, B 4, C 2, D 2, E 1, F 1.
    let np: Vec<u64> = (0..6).map(|v| pn.num_paths(v)).collect();
    assert_eq!(np, vec![6, 4, 2, 2, 1, 1]);
    // Val: A->C 0, A->B 2, B->C 0, B->D 2, C->D 0, D->F 0, D->E 1, E->F 0.
    assert_eq!(pn.increment(0, 0), Some(0));
    assert_eq!(pn.increment(0, 1), Some(2));
    assert_eq!(pn.increment(1, 0), Some(0));
    assert_eq!(pn.increment(1, 1), Some(2));
    assert_eq!(pn.increment(2, 0), Some(0));
    assert_eq!(pn.increment(3, 0), Some(0));
    assert_eq!(pn.increment(3, 1), Some(1));
    assert_eq!(pn.increment(4, 0), Some(0));
    assert_eq!(pn.exit_increment(5), Some(0));
    assert_eq!(pn.nonzero_increments(), 3);
    let expect: [&[usize]; 6] = [
        &[0, 2, 3, 5],
        &[0, 2, 3, 4, 5],
        &[0, 1, 2, 3, 5],
        &[0, 1, 2, 3, 4, 5],
        &[0, 1, 3, 5],
        &[0, 1, 3, 4, 5],
    ];
    for (k, blocks) in expect.iter().enumerate() {
        let p = pn.regenerate(k as u64).unwrap();
        assert_eq!(p.blocks, blocks.to_vec());
        assert!(!p.starts_at_loop_header && !p.ends_at_back_edge);
    }
    assert!(check_bijection(&g, &l, &pn));
}

/// A loop around a diamond: 0 -> 1 (header) -> {2, 3} -> 4 -> {1, 5};
/// truncating 4 -> 1 adds ENTRY -> 1 and 4 -> EXIT, giving N = 8
/// (PEP §3.1, the shape of Figure 1).
#[test]
fn paths_loop_truncation() {
    let g = graph(&[&[1], &[2, 3], &[4], &[4], &[1, 5], &[]], &[5]);
    let (l, pn) = number(&g);
    assert_eq!(l.back_edges, vec![(4, 0)]);
    assert_eq!(pn.total_paths(), 8);
    let np: Vec<u64> = (0..6).map(|v| pn.num_paths(v)).collect();
    assert_eq!(np, vec![4, 4, 2, 2, 2, 1]);
    assert_eq!(pn.increment(1, 0), Some(0));
    assert_eq!(pn.increment(1, 1), Some(2));
    assert_eq!(pn.increment(4, 0), None);
    assert_eq!(pn.increment(4, 1), Some(0));
    // Count r + 1 at the back edge, then restart with r = 4.
    assert_eq!(pn.back_edge_actions(4, 0), Some((1, 4)));
    assert_eq!(pn.back_edge_actions(4, 1), None);
    assert_eq!(pn.loop_start_increment(1), Some(4));
    let p = pn.regenerate(3).unwrap();
    assert_eq!(p.blocks, vec![0, 1, 3, 4]);
    assert!(!p.starts_at_loop_header && p.ends_at_back_edge);
    assert_eq!(p.end_edge, Some((4, 0)));
    let p = pn.regenerate(6).unwrap();
    assert_eq!(p.blocks, vec![1, 3, 4, 5]);
    assert!(p.starts_at_loop_header && !p.ends_at_back_edge);
    assert!(check_bijection(&g, &l, &pn));
}

fn test_graphs() -> Vec<Graph> {
    vec![
        // straight line
        graph(&[&[1], &[2], &[3], &[]], &[3]),
        // diamond
        graph(&[&[1, 2], &[3], &[3], &[]], &[3]),
        // nested loops
        graph(&[&[1], &[2], &[3], &[2, 4], &[1, 5], &[]], &[5]),
        // loop with two back edges
        graph(&[&[1], &[2, 3], &[1, 4], &[1, 4], &[]], &[4]),
        // self loop
        graph(&[&[1], &[1, 2], &[]], &[2]),
        // irreducible: two entries into {1, 2}
        graph(&[&[1, 2], &[2, 3], &[1], &[]], &[3]),
        // irreducible region inside a loop, plus an unreachable block
        graph(&[&[1], &[2, 3], &[3], &[2, 4], &[1, 5], &[], &[1]], &[5]),
        // entry is a loop header; parallel edges; exit with successors
        // (conditional tail call in block 1)
        graph(&[&[1, 1], &[0, 2], &[]], &[1, 2]),
        // infinite loop without exits
        graph(&[&[1], &[2], &[1]], &[]),
        // single block
        graph(&[&[]], &[]),
        ball_larus_figure(),
    ]
}

#[test]
fn paths_bijection_on_test_graphs() {
    for g in test_graphs() {
        let (l, pn) = number(&g);
        assert!(check_bijection(&g, &l, &pn));
    }
}

#[test]
fn paths_bijection_on_random_graphs() {
    let mut rng = Rng(0x50_4154_4853);
    let mut with_loops = 0;
    let mut irreducible = 0;
    let mut max_total = 0;
    for _ in 0..500 {
        let g = random_graph(&mut rng, 10);
        let (l, pn) = number(&g);
        with_loops += usize::from(!l.back_edges.is_empty());
        irreducible += usize::from(l.irreducible);
        assert!(check_bijection(&g, &l, &pn));
        max_total = max_total.max(pn.total_paths());
        // Smart numbering with a random profile: same property.
        let freqs: Vec<Vec<u64>> = g
            .succs
            .iter()
            .map(|s| s.iter().map(|_| rng.below(100)).collect())
            .collect();
        let f = |v: usize, i: usize| freqs[v][i];
        let sp = number_paths_with_profile(&g, &l, &f).unwrap();
        assert_eq!(sp.total_paths(), pn.total_paths());
        assert!(check_bijection(&g, &l, &sp));
        check_hottest_is_zero(&g, &l, &sp, &f);
    }
    assert!(with_loops > 100, "{with_loops}");
    assert!(irreducible > 20, "{irreducible}");
    assert!(max_total > 50, "{max_total}");
}

/// PEP Figure 4: at every reachable block, an out-edge of maximal
/// frequency has Val 0 (exit blocks aside: their exit edge's frequency is
/// an estimate).
fn check_hottest_is_zero(
    g: &Graph,
    l: &Loops,
    pn: &PathNumbering,
    f: &dyn Fn(usize, usize) -> u64,
) {
    let live = reachable(g);
    for v in (0..g.len()).filter(|&v| live[v] && !g.is_exit(v)) {
        let max = (0..g.succs[v].len()).map(|i| f(v, i)).max().unwrap();
        let val = |i: usize| {
            if l.is_cut(v, i) {
                pn.back_edge_actions(v, i).unwrap().0
            } else {
                pn.increment(v, i).unwrap()
            }
        };
        assert!(
            (0..g.succs[v].len()).any(|i| f(v, i) == max && val(i) == 0),
            "{g:?} block {v}"
        );
    }
}

#[test]
fn paths_smart_numbering_profiled_example() {
    // The loop around a diamond; profile: the loop runs 99 times per
    // call, mostly through 3 (the second successor of 1).
    let g = graph(&[&[1], &[2, 3], &[4], &[4], &[1, 5], &[]], &[5]);
    let l = loops(&g, &dominators(&g));
    let freq = |v: usize, i: usize| -> u64 {
        match (v, i) {
            (0, 0) => 1,
            (1, 0) => 10, // 1 -> 2 cold
            (1, 1) => 90, // 1 -> 3 hot
            (2, 0) => 10,
            (3, 0) => 90,
            (4, 0) => 99, // back edge hot
            (4, 1) => 1,  // loop exit cold
            _ => 0,
        }
    };
    let base = number_paths(&g, &l).unwrap();
    let smart = number_paths_with_profile(&g, &l, &freq).unwrap();
    assert_eq!(smart.total_paths(), base.total_paths());
    // Base numbering puts increments on the hot 1 -> 3 edge and the
    // back edge's path end; smart numbering moves them to cold edges.
    assert_eq!(base.increment(1, 1), Some(2));
    assert_eq!(base.back_edge_actions(4, 0), Some((1, 4)));
    assert_eq!(smart.increment(1, 1), Some(0));
    assert_eq!(smart.increment(1, 0), Some(2));
    assert_eq!(smart.increment(3, 0), Some(0));
    assert_eq!(smart.back_edge_actions(4, 0), Some((0, 4)));
    assert_eq!(smart.increment(4, 1), Some(1));
    // The dynamic number of `r += val` executions drops from 90 to 11.
    let dyn_cost = |pn: &PathNumbering| -> u64 {
        (0..g.len())
            .flat_map(|v| (0..g.succs[v].len()).map(move |i| (v, i)))
            .filter(|&(v, i)| pn.increment(v, i).is_some_and(|x| x != 0))
            .map(|(v, i)| freq(v, i))
            .sum()
    };
    assert_eq!(dyn_cost(&base), 90);
    assert_eq!(dyn_cost(&smart), 11);
    assert!(check_bijection(&g, &l, &smart));
    check_hottest_is_zero(&g, &l, &smart, &freq);
}

/// `k` diamonds in a row: 3k + 1 blocks, 2^k paths.
fn diamond_chain(k: usize) -> Graph {
    let mut succs = Vec::new();
    for d in 0..k {
        let top = 3 * d;
        succs.push(vec![top + 1, top + 2]);
        succs.push(vec![top + 3]);
        succs.push(vec![top + 3]);
    }
    succs.push(vec![]);
    Graph {
        succs,
        entry: 0,
        exits: vec![3 * k],
        extra_entries: Vec::new(),
    }
}

#[test]
fn paths_too_many_paths() {
    // 2^70 paths: numbering fails; the caller skips path profiling for
    // the function (module doc). The limit is crossed at the top of the
    // 64th diamond from the exit, block 3 * (70 - 64) = 18.
    let g = diamond_chain(70);
    let l = loops(&g, &dominators(&g));
    let e = number_paths(&g, &l).unwrap_err();
    assert_eq!(
        e,
        PathsError::TooManyPaths {
            block: Some(18),
            max_paths: u64::MAX
        }
    );
    assert!(e.to_string().contains("too many paths"));
    let f = |_: usize, _: usize| 1;
    assert!(matches!(
        number_paths_with_profile(&g, &l, &f),
        Err(PathsError::TooManyPaths { .. })
    ));
    // 2^64 = u64::MAX + 1 also overflows; 2^63 fits.
    let g64 = diamond_chain(64);
    assert!(matches!(
        number_paths(&g64, &loops(&g64, &dominators(&g64))),
        Err(PathsError::TooManyPaths { block: Some(0), .. })
    ));
    let g63 = diamond_chain(63);
    let pn = number_paths(&g63, &loops(&g63, &dominators(&g63))).unwrap();
    assert_eq!(pn.total_paths(), 1 << 63);
    let last = pn.regenerate((1 << 63) - 1).unwrap();
    assert_eq!(last.blocks.len(), 2 * 63 + 1);
    assert_eq!(path_sum(&pn, &last), (1 << 63) - 1);
    // A smaller limit (e.g. a bounded counter table): 2^10 > 1000.
    let g10 = diamond_chain(10);
    let l10 = loops(&g10, &dominators(&g10));
    assert!(matches!(
        number_paths_bounded(&g10, &l10, None, 1000),
        Err(PathsError::TooManyPaths {
            max_paths: 1000,
            ..
        })
    ));
    assert_eq!(
        number_paths_bounded(&g10, &l10, None, 1024)
            .unwrap()
            .total_paths(),
        1024
    );
    // The limit also applies to the total at ENTRY: a loop whose body
    // has 600 paths gives 600 + 600 = 1200 paths (entry, loop start).
    let mut lg = diamond_chain(0);
    lg.succs = vec![vec![1]];
    lg.succs.extend(
        diamond_chain(9)
            .succs
            .into_iter()
            .map(|s| s.into_iter().map(|x| x + 1).collect()),
    );
    let last = lg.succs.len() - 1;
    lg.succs[last] = vec![1, last + 1];
    lg.succs.push(vec![]);
    lg.exits = vec![last + 1];
    let ll = loops(&lg, &dominators(&lg));
    // NumPaths(1) = 2 * 512 (exit or back edge at the end), total 2048.
    assert_eq!(number_paths(&lg, &ll).unwrap().total_paths(), 2048);
    assert_eq!(
        number_paths_bounded(&lg, &ll, None, 2000),
        Err(PathsError::TooManyPaths {
            block: None,
            max_paths: 2000
        })
    );
}

#[test]
fn paths_errors_on_mismatched_loops() {
    let g = graph(&[&[1], &[0, 2], &[]], &[2]);
    let empty = Loops {
        back_edges: vec![],
        retreating_non_back: vec![],
        loops: vec![],
        irreducible: false,
    };
    assert!(matches!(
        number_paths(&g, &empty),
        Err(PathsError::Cyclic { .. })
    ));
    let bogus = Loops {
        back_edges: vec![(1, 5)],
        ..empty
    };
    assert_eq!(
        number_paths(&g, &bogus),
        Err(PathsError::InvalidCutEdge { from: 1, index: 5 })
    );
    let bad = graph(&[&[7]], &[]);
    assert!(matches!(
        number_paths(
            &bad,
            &loops(&graph(&[&[]], &[]), &dominators(&graph(&[&[]], &[])))
        ),
        Err(PathsError::InvalidGraph(_))
    ));
}

#[test]
fn paths_serialization_is_deterministic() {
    for g in test_graphs() {
        let (l, pn) = number(&g);
        let a = serde_json::to_string(&pn).unwrap();
        let (_, pn2) = number(&g.clone());
        let b = serde_json::to_string(&pn2).unwrap();
        assert_eq!(a, b);
        let back: PathNumbering = serde_json::from_str(&a).unwrap();
        assert_eq!(back, pn);
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            serde_json::to_string(&number(&g).0).unwrap()
        );
    }
}

/// Too many paths, cut into regions: 70 diamonds in a row (2^70 paths)
/// get numbers under 2^62 with a few cut edges; under small limits (so the
/// paths can be enumerated) the numbering is still a bijection between
/// `[0, N)` and the paths of the graph with those edges cut.
#[test]
fn too_many_paths_are_cut_into_regions() {
    let g = diamond_chain(70);
    let l = loops(&g, &dominators(&g));
    let (pn, cut) = number_paths_cutting(&g, &l, 1 << 62).unwrap();
    // A handful of the 280 edges.
    assert!(!cut.is_empty() && cut.len() < 20, "{cut:?}");
    assert!(pn.total_paths() <= 1 << 62);
    // Nothing to cut: the same numbering as number_paths.
    let small = diamond_chain(8);
    let ls = loops(&small, &dominators(&small));
    let (ps, none) = number_paths_cutting(&small, &ls, 1 << 62).unwrap();
    assert!(none.is_empty());
    assert_eq!(ps, number_paths(&small, &ls).unwrap());
    for max in [1000, 300] {
        let (pn, cut) = number_paths_cutting(&g, &l, max).unwrap();
        assert!(pn.total_paths() <= max);
        let mut cl = l.clone();
        cl.retreating_non_back.extend(&cut);
        cl.retreating_non_back.sort_unstable();
        let all = enumerate_dag_paths(&g, &cl, 1_000_000).unwrap();
        assert_eq!(all.len() as u64, pn.total_paths(), "max {max}");
        let regenerated: BTreeSet<RegeneratedPath> = (0..pn.total_paths())
            .map(|n| pn.regenerate(n).unwrap())
            .collect();
        assert_eq!(regenerated, all, "max {max}");
    }
}

/// Blocks entered from outside (a `.cold` part jumping back) start paths
/// of their own, like loop headers: 0 -> {1, 2}, 1 -> 3, 2 -> 3, 4 -> 3
/// with 4 entered only from outside and 2 from both. Paths from 0: two;
/// from 2: one; from 4: one.
#[test]
fn extra_entries_start_paths() {
    let mut g = graph(&[&[1, 2], &[3], &[3], &[], &[3]], &[3]);
    g.extra_entries = vec![2, 4];
    let (_, pn) = number(&g);
    assert_eq!(pn.total_paths(), 4);
    let mut seen = Vec::new();
    for &x in &[2usize, 4] {
        let r = pn
            .loop_start_increment(x)
            .expect("an extra entry starts paths");
        let p = pn.regenerate(r).unwrap();
        assert_eq!(p.blocks, vec![x, 3]);
        seen.push(r);
    }
    seen.extend((0..pn.total_paths()).filter(|&r| pn.regenerate(r).unwrap().blocks[0] == 0));
    seen.sort_unstable();
    assert_eq!(seen, vec![0, 1, 2, 3], "every number is one path");
}
