//! Call graph analysis for check placement in the extended Arnold-Ryder
//! framework (Hirzel & Chilimbi, "Bursty Tracing: A Framework for
//! Low-Overhead Temporal Profiling", FDDO 2001, §4).
//!
//! The framework has checks "at all procedure entries and loop back-edges to
//! insure that the program can never loop or recurse for an unbounded amount
//! of time without executing a check" (§4). This module removes the
//! redundant ones:
//!
//! - **Entry checks (§4.1).** On the static call graph `G = (N, E)` (an edge
//!   `(f, g)` iff `f` contains a direct call to `g`) we want a set
//!   `C ⊆ N` such that every cycle contains a member of `C`; the minimum set
//!   is NP-hard (a feedback vertex set), so the paper approximates it with
//!   equation 3, implemented by [`entry_check_set`]:
//!
//!   ```text
//!   C = { f ∈ N | ¬is_leaf(f) ∧ (is_root(f) ∨ addr_taken(f) ∨ recursion_from_below(f)) }
//!   ```
//!
//! - **Back-edge checks (§4.2).** *k-boring loops*, "loops with no calls and
//!   at most k profiling events of interest", get neither instrumentation
//!   nor a back-edge check: [`is_k_boring`], [`k_boring_loops`],
//!   [`loop_summaries`].
//!
//! All results are deterministic: nodes are function indices `0..n`,
//! callee lists are kept sorted, and SCCs come in a documented order.

use serde::{Deserialize, Serialize};

use crate::analysis::graph::Loops;

/// The static call graph of one binary: nodes are function indices `0..n`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CallGraph {
    /// Direct callees of each function, sorted and without duplicates.
    callees: Vec<Vec<usize>>,
    /// The function's address is taken (it may be called indirectly).
    address_taken: Vec<bool>,
    /// The function is called from the outside world (program entry point,
    /// exported/dynsym functions, constructors, ...).
    roots: Vec<bool>,
    /// The function contains calls the graph cannot name: indirect calls, or
    /// calls into other objects (PLT). Such a function is not a leaf.
    unknown_calls: Vec<bool>,
}

impl CallGraph {
    /// A graph of `n` functions and no edges.
    pub(crate) fn new(n: usize) -> Self {
        CallGraph {
            callees: vec![Vec::new(); n],
            address_taken: vec![false; n],
            roots: vec![false; n],
            unknown_calls: vec![false; n],
        }
    }

    /// Number of functions.
    fn len(&self) -> usize {
        self.callees.len()
    }

    /// Records a direct call `caller -> callee` (idempotent). Panics if
    /// either index is out of range.
    pub(crate) fn add_call(&mut self, caller: usize, callee: usize) {
        assert!(callee < self.len(), "callee {callee} out of range");
        let list = &mut self.callees[caller];
        if let Err(pos) = list.binary_search(&callee) {
            list.insert(pos, callee);
        }
    }

    /// Marks `f` as address-taken (may be the target of an indirect call).
    pub(crate) fn set_address_taken(&mut self, f: usize) {
        self.address_taken[f] = true;
    }

    /// Marks `f` as a root (called from the outside world).
    pub(crate) fn set_root(&mut self, f: usize) {
        self.roots[f] = true;
    }

    /// Marks `f` as making calls the graph cannot name (indirect calls,
    /// calls through the PLT). This makes `f` a non-leaf; cycles through
    /// such calls pass through an address-taken procedure (or leave the
    /// binary), which §4.1 already covers.
    pub(crate) fn set_unknown_calls(&mut self, f: usize) {
        self.unknown_calls[f] = true;
    }

    /// Direct callees of `f`, sorted.
    #[cfg(test)]
    fn callees(&self, f: usize) -> &[usize] {
        &self.callees[f]
    }

    /// §4.1 "a procedure that calls nothing": no direct callees and no
    /// unknown calls.
    fn is_leaf(&self, f: usize) -> bool {
        self.callees[f].is_empty() && !self.unknown_calls[f]
    }
}

/// Strongly connected components (Tarjan's algorithm, iterative).
///
/// Deterministic order: the search starts from functions `0, 1, ..` and
/// visits callees in increasing order; components are returned in the order
/// Tarjan completes them, which is a reverse topological order of the
/// condensation (a component comes before every component that calls into
/// it: callees first). Members of each component are sorted.
fn sccs(cg: &CallGraph) -> Vec<Vec<usize>> {
    let n = cg.len();
    const UNSEEN: usize = usize::MAX;
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0usize; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<usize> = Vec::new();
    let mut next = 0usize;
    let mut out: Vec<Vec<usize>> = Vec::new();
    for s in 0..n {
        if index[s] != UNSEEN {
            continue;
        }
        let mut call: Vec<(usize, usize)> = vec![(s, 0)];
        index[s] = next;
        low[s] = next;
        next += 1;
        stack.push(s);
        on_stack[s] = true;
        while let Some(top) = call.last_mut() {
            let (v, i) = *top;
            if i < cg.callees[v].len() {
                top.1 += 1;
                let w = cg.callees[v][i];
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    call.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
            } else {
                call.pop();
                if let Some(&(p, _)) = call.last() {
                    low[p] = low[p].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut comp = Vec::new();
                    loop {
                        let x = stack.pop().expect("v is on the stack");
                        on_stack[x] = false;
                        comp.push(x);
                        if x == v {
                            break;
                        }
                    }
                    comp.sort_unstable();
                    out.push(comp);
                }
            }
        }
    }
    out
}

/// §4.1: "The distance of a procedure f from the roots is the minimum length
/// of the shortest path from a root to f" (breadth-first search over direct
/// calls from all roots). `None` (infinite) for functions no root reaches by
/// direct calls.
fn root_distances(cg: &CallGraph) -> Vec<Option<usize>> {
    let mut dist = vec![None; cg.len()];
    let mut queue = std::collections::VecDeque::new();
    for (f, d) in dist.iter_mut().enumerate() {
        if cg.roots[f] {
            *d = Some(0);
            queue.push_back(f);
        }
    }
    while let Some(f) = queue.pop_front() {
        let d = dist[f].expect("queued functions have a distance");
        for &g in &cg.callees[f] {
            if dist[g].is_none() {
                dist[g] = Some(d + 1);
                queue.push_back(g);
            }
        }
    }
    dist
}

/// The terms of equation 3 for one function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct EntryCheckTerms {
    /// `is_leaf(f)`: calls nothing, so it cannot be on a recursive cycle.
    leaf: bool,
    /// `is_root(f)`: called from the outside world; the check makes sure
    /// execution starts "off in the right version of the code".
    root: bool,
    /// `addr_taken(f)`: "may be part of recursion with indirect calls",
    /// which the direct-call graph does not show.
    addr_taken: bool,
    /// `recursion_from_below(f)`: called by a procedure in the same SCC that
    /// is at least as far away from the roots.
    recursion_from_below: bool,
}

impl EntryCheckTerms {
    /// Equation 3: `¬leaf ∧ (root ∨ addr_taken ∨ recursion_from_below)`.
    fn in_c(&self) -> bool {
        !self.leaf && (self.root || self.addr_taken || self.recursion_from_below)
    }
}

/// `recursion_from_below(f)` for every function (§4.1): "A procedure f has
/// recursion from below iff it is called by a procedure g in the same
/// strongly connected component as f that is at least as far away from the
/// roots" (`dist(g) >= dist(f)`; `g == f` counts, so direct self-recursion
/// qualifies). Functions no root reaches have infinite distance, and
/// `∞ >= ∞`, so in an SCC unreachable from the roots every member called from
/// inside the SCC has recursion from below: conservative, and still
/// guaranteeing a check on every cycle.
///
/// Why every cycle gets a check: along a cycle `f1 -> f2 -> ... -> f1`
/// (all in one SCC) the distances cannot strictly increase at every step, so
/// some call `g -> f` on the cycle has `dist(g) >= dist(f)`, and that `f`
/// (not a leaf: it is on a cycle) is in `C`. Ties are broken so that checks
/// sit "as far up in the call-stack as possible" (near the roots).
fn recursion_from_below(cg: &CallGraph) -> Vec<bool> {
    let n = cg.len();
    let mut comp = vec![0usize; n];
    for (k, c) in sccs(cg).iter().enumerate() {
        for &f in c {
            comp[f] = k;
        }
    }
    let dist = root_distances(cg);
    // None = infinity: compare with infinity as the largest value.
    let far = |d: Option<usize>| d.unwrap_or(usize::MAX);
    let mut out = vec![false; n];
    for g in 0..n {
        for &f in &cg.callees[g] {
            if comp[f] == comp[g] && far(dist[g]) >= far(dist[f]) {
                out[f] = true;
            }
        }
    }
    out
}

/// The terms of equation 3 for every function (for the plan's explanation
/// of each entry-check decision).
fn entry_check_terms(cg: &CallGraph) -> Vec<EntryCheckTerms> {
    let rfb = recursion_from_below(cg);
    (0..cg.len())
        .map(|f| EntryCheckTerms {
            leaf: cg.is_leaf(f),
            root: cg.roots[f],
            addr_taken: cg.address_taken[f],
            recursion_from_below: rfb[f],
        })
        .collect()
}

/// The set `C` of procedures that keep an entry check (Hirzel & Chilimbi
/// §4.1, equation 3):
///
/// `C = { f | ¬is_leaf(f) ∧ (is_root(f) ∨ addr_taken(f) ∨ recursion_from_below(f)) }`
///
/// - `¬is_leaf(f)`: "You never need a check on entry to a leaf procedure (a
///   procedure that calls nothing), since it cannot be part of a recursive
///   cycle." A function with unknown (indirect/PLT) calls is not a leaf.
/// - `is_root(f)`: a check on entry to every root "to make sure we start off
///   in the right version of the code".
/// - `addr_taken(f)`: "it may be part of recursion with indirect calls".
/// - `recursion_from_below(f)`: see [`recursion_from_below`]; this term
///   guarantees that no cycle of direct calls is without a check.
///
/// Returns membership per function.
pub(crate) fn entry_check_set(cg: &CallGraph) -> Vec<bool> {
    entry_check_terms(cg).iter().map(|t| t.in_c()).collect()
}

/// What §4.2 needs to know about one natural loop: counts over the whole
/// loop body (`Loop::body`, which includes nested loops).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LoopSummary {
    /// Some block of the body contains a call (direct, indirect or PLT).
    pub(crate) has_call: bool,
    /// Number of profiling events of interest in the body (e.g. memory
    /// references, for hot data stream profiling), counted statically.
    pub(crate) events: u64,
}

/// §4.2: "We define k-boring loops as loops with no calls and at most k
/// profiling events of interest. We do not instrument either version of the
/// code of a k-boring loop, and we do not put a check on its back-edge."
///
/// Because a summary counts a loop's whole body, nested loops included, an
/// enclosing loop of a loop that is not k-boring is not k-boring either.
/// Only natural loops are candidates: the retreating edges of irreducible
/// regions ([`Loops::retreating_non_back`]) keep their checks.
fn is_k_boring(summary: &LoopSummary, k: u64) -> bool {
    !summary.has_call && summary.events <= k
}

/// [`is_k_boring`] for every loop.
pub(crate) fn k_boring_loops(loops: &[LoopSummary], k: u64) -> Vec<bool> {
    loops.iter().map(|s| is_k_boring(s, k)).collect()
}

/// Summaries of every loop of `loops` (same order as `loops.loops`) from
/// per-block facts: whether block `b` contains a call, and how many events of
/// interest it has.
pub(crate) fn loop_summaries(
    loops: &Loops,
    block_has_call: &dyn Fn(usize) -> bool,
    block_events: &dyn Fn(usize) -> u64,
) -> Vec<LoopSummary> {
    loops
        .loops
        .iter()
        .map(|l| LoopSummary {
            has_call: l.body.iter().any(|&b| block_has_call(b)),
            events: l
                .body
                .iter()
                .fold(0u64, |a, &b| a.saturating_add(block_events(b))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::graph::tests::{Rng, graph};
    use crate::analysis::graph::{dominators, loops};

    fn cg(n: usize, calls: &[(usize, usize)], roots: &[usize]) -> CallGraph {
        let mut g = CallGraph::new(n);
        for &(a, b) in calls {
            g.add_call(a, b);
        }
        for &r in roots {
            g.set_root(r);
        }
        g
    }

    fn members(set: &[bool]) -> Vec<usize> {
        (0..set.len()).filter(|&f| set[f]).collect()
    }

    #[test]
    fn callgraph_sccs_mutual_recursion() {
        // main(0) -> a(1); a <-> b(2) (mutual recursion); b -> c(3);
        // c -> c (self recursion); d(4) is isolated. a -> b is added twice
        // to check that add_call is idempotent.
        let g = cg(5, &[(0, 1), (1, 2), (2, 1), (2, 3), (3, 3), (1, 2)], &[0]);
        assert_eq!(g.callees(1), &[2]);
        // Callees first: {c}, then {a, b}, then {main}; then {d}.
        assert_eq!(sccs(&g), vec![vec![3], vec![1, 2], vec![0], vec![4]]);
    }

    #[test]
    fn callgraph_sccs_order_and_membership_random() {
        let mut rng = Rng(0x4341_4c4c);
        for _ in 0..200 {
            let n = 1 + rng.below(12) as usize;
            let mut g = CallGraph::new(n);
            for _ in 0..rng.below(3 * n as u64) {
                g.add_call(rng.below(n as u64) as usize, rng.below(n as u64) as usize);
            }
            let comps = sccs(&g);
            // reach[a][b]: b reachable from a (reflexive).
            let mut reach = vec![vec![false; n]; n];
            for (a, row) in reach.iter_mut().enumerate() {
                let mut st = vec![a];
                row[a] = true;
                while let Some(x) = st.pop() {
                    for &y in g.callees(x) {
                        if !row[y] {
                            row[y] = true;
                            st.push(y);
                        }
                    }
                }
            }
            let mut pos = vec![usize::MAX; n];
            for (k, c) in comps.iter().enumerate() {
                assert!(c.windows(2).all(|w| w[0] < w[1]));
                for &f in c {
                    assert_eq!(pos[f], usize::MAX, "in two components");
                    pos[f] = k;
                }
            }
            for a in 0..n {
                for b in 0..n {
                    assert_eq!(pos[a] == pos[b], reach[a][b] && reach[b][a]);
                }
                for &b in g.callees(a) {
                    assert!(pos[b] <= pos[a], "callee component first");
                }
            }
            // C breaks every cycle: the graph induced by N \ C is acyclic.
            for r in 0..n {
                if rng.below(3) == 0 {
                    g.set_root(r);
                }
                if rng.below(6) == 0 {
                    g.set_address_taken(r);
                }
            }
            let c = entry_check_set(&g);
            let mut sub = CallGraph::new(n);
            for a in (0..n).filter(|&a| !c[a]) {
                for &b in g.callees(a) {
                    if !c[b] {
                        sub.add_call(a, b);
                    }
                }
            }
            for comp in sccs(&sub) {
                assert_eq!(comp.len(), 1);
                assert!(!sub.callees(comp[0]).contains(&comp[0]));
            }
        }
    }

    /// Figure 5 of the paper, as its text describes it (the drawing itself
    /// is not in our copy; edges chosen to match every stated fact): the only
    /// root is main, the only leaf is delete_digram, the only non-trivial SCC
    /// is {check, match, substitute}, and substitute, further from main than
    /// check, calls check. The paper's answer is C = {main, check}.
    #[test]
    fn callgraph_entry_checks_paper_figure_5() {
        const MAIN: usize = 0;
        const CHECK: usize = 1;
        const MATCH: usize = 2;
        const SUBSTITUTE: usize = 3;
        const DELETE_DIGRAM: usize = 4;
        let g = cg(
            5,
            &[
                (MAIN, CHECK),
                (MAIN, DELETE_DIGRAM),
                (CHECK, MATCH),
                (MATCH, SUBSTITUTE),
                (SUBSTITUTE, CHECK),
                (SUBSTITUTE, DELETE_DIGRAM),
            ],
            &[MAIN],
        );
        // BFS from main: check 1, delete_digram 1, match 2, substitute 3.
        assert_eq!(
            root_distances(&g),
            vec![Some(0), Some(1), Some(2), Some(3), Some(1)]
        );
        assert_eq!(
            sccs(&g),
            vec![
                vec![DELETE_DIGRAM],
                vec![CHECK, MATCH, SUBSTITUTE],
                vec![MAIN]
            ]
        );
        // In-SCC calls: check -> match (1 >= 2? no), match -> substitute
        // (2 >= 3? no), substitute -> check (3 >= 1: yes). Only check has
        // recursion from below.
        assert_eq!(members(&recursion_from_below(&g)), vec![CHECK]);
        // main: non-leaf root. check: non-leaf with recursion from below.
        // delete_digram: leaf. match, substitute: none of the terms.
        assert_eq!(members(&entry_check_set(&g)), vec![MAIN, CHECK]);
    }

    #[test]
    fn callgraph_entry_checks_worked_examples() {
        // Self recursion: main(0) -> fact(1) -> fact. fact is called by
        // itself, in its own SCC, and dist(fact) >= dist(fact): recursion
        // from below. C = {main, fact}.
        let g = cg(2, &[(0, 1), (1, 1)], &[0]);
        assert_eq!(members(&entry_check_set(&g)), vec![0, 1]);

        // A root that is a leaf needs no check (¬is_leaf fails); nor does
        // an address-taken leaf. An address-taken non-leaf, not recursive,
        // keeps one (it may be on an indirect recursive cycle).
        // 0: root leaf; 1: address-taken leaf; 2: address-taken, calls 1.
        let mut g = cg(3, &[(2, 1)], &[0]);
        g.set_address_taken(1);
        g.set_address_taken(2);
        assert_eq!(members(&entry_check_set(&g)), vec![2]);
        let t = entry_check_terms(&g);
        assert!(t[0].leaf && t[0].root && !t[0].in_c());
        assert!(t[2].addr_taken && !t[2].recursion_from_below && t[2].in_c());

        // Mutual recursion at equal distance: main(0) -> a(1), main -> b(2),
        // a <-> b. dist(a) = dist(b) = 1, each calls the other: both have
        // recursion from below ("at least as far away" includes ties).
        let g = cg(3, &[(0, 1), (0, 2), (1, 2), (2, 1)], &[0]);
        assert_eq!(members(&entry_check_set(&g)), vec![0, 1, 2]);

        // Cycle a(1) -> b(2) -> c(3) -> a entered at a: dist a 1, b 2, c 3.
        // Only c -> a goes "up" (3 >= 1): C = {main, a}, one check per
        // iteration of the recursion, as high in the call stack as possible.
        let mut g = cg(4, &[(0, 1), (1, 2), (2, 3), (3, 1)], &[0]);
        assert_eq!(members(&entry_check_set(&g)), vec![0, 1]);
        // A shortcut main -> c makes dist(c) = 1: now b -> c (2 >= 1) also
        // goes up, and c -> a (1 >= 1) still does. C = {main, a, c}.
        g.add_call(0, 3);
        assert_eq!(root_distances(&g), vec![Some(0), Some(1), Some(2), Some(1)]);
        assert_eq!(members(&entry_check_set(&g)), vec![0, 1, 3]);

        // A cycle no root reaches (dist = ∞ for both, ∞ >= ∞): both members
        // keep checks; conservative but every cycle is covered.
        let g = cg(3, &[(1, 2), (2, 1)], &[0]);
        assert_eq!(root_distances(&g), vec![Some(0), None, None]);
        assert_eq!(members(&entry_check_set(&g)), vec![1, 2]);

        // A root whose only call is indirect is not a leaf.
        let mut g = cg(1, &[], &[0]);
        assert_eq!(members(&entry_check_set(&g)), Vec::<usize>::new());
        g.set_unknown_calls(0);
        assert_eq!(members(&entry_check_set(&g)), vec![0]);
    }

    #[test]
    fn callgraph_k_boring_loops() {
        // Nested loops: outer header 1 (body 1..=4), inner header 2 (body 2, 3).
        let g = graph(&[&[1], &[2], &[3], &[2, 4], &[1, 5], &[]], &[5]);
        let l = loops(&g, &dominators(&g));
        // Events: block 2 has 2, block 3 has 1, block 4 has 3. Block 4 calls.
        let events = |b: usize| [0, 0, 2, 1, 3, 0][b];
        let s = loop_summaries(&l, &|b| b == 4, &events);
        assert_eq!(
            s,
            vec![
                LoopSummary {
                    has_call: true,
                    events: 6
                },
                LoopSummary {
                    has_call: false,
                    events: 3
                },
            ]
        );
        // k = 4 (the paper's preferred L4): inner loop is 4-boring (no call,
        // 3 events), outer is not (it calls).
        assert_eq!(k_boring_loops(&s, 4), vec![false, true]);
        // k = 2: the inner loop has too many events.
        assert_eq!(k_boring_loops(&s, 2), vec![false, false]);
        // Without the call, the outer loop's 6 events exceed 4 but not 10.
        let s = loop_summaries(&l, &|_| false, &events);
        assert_eq!(k_boring_loops(&s, 4), vec![false, true]);
        assert_eq!(k_boring_loops(&s, 10), vec![true, true]);
        assert!(is_k_boring(&LoopSummary::default(), 0));
    }

    #[test]
    fn callgraph_serializes_deterministically() {
        let g = cg(3, &[(0, 2), (0, 1), (1, 0)], &[0]);
        let a = serde_json::to_string(&g).unwrap();
        let h = cg(3, &[(1, 0), (0, 1), (0, 2)], &[0]);
        assert_eq!(a, serde_json::to_string(&h).unwrap());
        assert_eq!(serde_json::from_str::<CallGraph>(&a).unwrap(), g);
    }
}
