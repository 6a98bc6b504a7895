//! Ball-Larus path numbering and regeneration (Ball & Larus, "Efficient Path
//! Profiling", MICRO 1996), as used by PEP (Bond & McKinley, "Continuous Path
//! and Edge Profiling", MICRO 2005, §3.1–§3.4) and summarised by Ammons, Ball
//! & Larus (PLDI 1997, §2).
//!
//! # The DAG
//!
//! Path profiling counts acyclic, intraprocedural paths. Paths begin on
//! function entry and end on function exit; paths also begin and end on loop
//! back edges (PEP §3.1). To enumerate them the CFG is turned into a DAG by
//! *truncating* every back edge `v -> h`: the edge is removed and two *dummy*
//! edges are added, `ENTRY -> h` and `v -> EXIT`. `ENTRY` and `EXIT` are two
//! virtual nodes:
//!
//! - `ENTRY` has one edge to the function's entry block (always first, so its
//!   value is 0: the path register is initialised with `r = 0` on function
//!   entry, PEP §3.1 step 1) and one dummy edge to every block that is the
//!   target of a truncated edge ("loop start" edges). Dummy `ENTRY -> h`
//!   edges are shared by all truncated edges into `h`.
//! - Every exit block (listed in [`Graph::exits`], or without successors) has
//!   one edge to `EXIT`; every truncated edge `(v, i)` gets its own dummy
//!   `v -> EXIT` edge, so a path records *which* back edge ended it.
//!
//! Irreducible regions (PEP and BL96 speak of loops; Ammons et al. note the
//! algorithm handles irreducible CFGs) are cut at the retreating edges that
//! [`crate::analysis::graph::loops`] reports in `retreating_non_back`, exactly like back
//! edges: cutting all retreating edges of a DFS leaves an acyclic graph.
//!
//! Blocks unreachable from the entry are not part of the DAG.
//!
//! # Numbering (PEP Figure 2) and instrumentation
//!
//! Visiting blocks in reverse topological order, `NumPaths(EXIT) = 1` and for
//! every other block `v`, for each DAG edge `e = v -> w` in order,
//! `Val(e) = NumPaths(v)` then `NumPaths(v) += NumPaths(w)`. The sum of the
//! `Val`s along each of the `N = NumPaths(ENTRY)` DAG paths is a unique number
//! in `[0, N)`. Converted back to the CFG (PEP §3.1, Figure 1(e); Ammons et al.
//! §2: "values incorporated into the instrumentation of the backedge"), the
//! instrumentation with path register `r` is:
//!
//! - on function entry: `r = 0`;
//! - on a real DAG edge `(v, i)`: `r += increment(v, i)` (nothing if 0);
//! - where exit block `v` leaves the function: count path
//!   `r + exit_increment(v)`;
//! - on a truncated edge `(v, i)` with `back_edge_actions(v, i) ==
//!   Some((end, restart))`: count path `r + end`, then `r = restart`.
//!
//! PEP (§3.2) *samples* `r` at the counting points instead of always storing
//! it; the numbering is the same.
//!
//! # Smart numbering (PEP §3.4, from PPP)
//!
//! [`number_paths_with_profile`] implements PEP's *smart path numbering*
//! (PEP §3.4, Figure 4, borrowed from Bond & McKinley's Practical Path
//! Profiling): the same algorithm, but each block's out-edges are visited "in
//! decreasing order of execution frequency", so the hottest out-edge of every
//! block gets `Val = 0` and needs no instrumentation. Ties keep the base
//! order, so the result is deterministic. Since the order of a block's
//! successors is immaterial to the correctness of the numbering (Ammons et al.
//! §2), the path numbers are still exactly `[0, N)`. Frequencies of DAG edges
//! are taken from the edge profile as follows: a real edge and the dummy
//! `v -> EXIT` of a truncated edge take that edge's frequency; an exit edge
//! `v -> EXIT` takes the estimate `max(0, inflow(v) - outflow(v))` (the
//! profile does not count function invocations, so for the entry block this
//! under-estimates; that only affects an entry block that is also an exit
//! *and* has successors). `ENTRY`'s own edges keep the function-entry edge
//! first (`r = 0` on entry, as in §3.1) and order the loop-start edges by the
//! summed frequency of the truncated edges into each header; that order has
//! no cost effect, because a truncated edge assigns `r = restart` whatever the
//! value.
//!
//! # Functions with more paths than fit in `u64`
//!
//! When `NumPaths` of any block (hence `N`) exceeds the limit (`u64::MAX` for
//! [`number_paths`] and [`number_paths_with_profile`], or the `max_paths`
//! given to [`number_paths_bounded`]), numbering fails with
//! [`PathsError::TooManyPaths`], naming the block where the limit was crossed.
//! The documented answer is: **the caller skips path profiling for that
//! function** (it counts the skip in the plan's statistics) and still
//! rewrites the function for its other instrumentation (edges, calls, entry
//! and back-edge checks).
//!
//! Why not break the DAG at chosen nodes ("path splitting")? Splitting would
//! be sound (a split node acts like a truncated edge: count `r + end`, then
//! `r = restart`), but it adds a third kind of instrumentation point that the
//! rewriter must place inside blocks, changes what a "path" means for the
//! function (paths no longer begin and end only at entry, exit and back
//! edges, so PEP §3.1's categories no longer hold), and needs a node-choice
//! heuristic whose result must stay deterministic. The case is rare: `N >
//! 2^64` needs, e.g., 64 independent two-way branches in a row inside one
//! acyclic region, and such functions are usually generated code whose
//! individual paths are each executed almost never, so a path profile would
//! be useless anyway (BL96 already switches from an array to a hash table
//! for large `N`). Failing cleanly, with the block that overflowed, keeps the
//! numbering simple and makes the skip visible.
//!
//! # Regeneration (BL96; PEP §3.3)
//!
//! [`PathNumbering::regenerate`] maps a path number back to its blocks with
//! the greedy walk of BL96 used by PEP §3.3: from `ENTRY`, with remainder
//! `R`, take the unique out-edge `e = v -> w` with
//! `Val(e) <= R < Val(e) + NumPaths(w)`, subtract `Val(e)` and continue at
//! `w` until `EXIT`. The same walk on a partial path number identifies a
//! partial path (PEP §3.2).
//!
//! Outputs are deterministic (`Vec`s in documented orders) and
//! serde-serializable.

use serde::{Deserialize, Serialize};

use crate::analysis::graph::{Graph, GraphError, Loops, reachable};

/// Why paths could not be numbered or regenerated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PathsError {
    /// The graph is malformed.
    #[error("invalid graph: {0}")]
    InvalidGraph(#[from] GraphError),
    /// `Loops` names an edge the graph does not have (it was computed for
    /// another graph).
    #[error("cut edge ({from}, {index}) is not an edge of the graph")]
    InvalidCutEdge { from: usize, index: usize },
    /// After removing the cut edges the reachable graph still has a cycle
    /// through `block` (`Loops` was computed for another graph).
    #[error(
        "graph is not acyclic after cutting back and retreating edges (cycle through block {block})"
    )]
    Cyclic { block: usize },
    /// More paths than `max_paths`: `NumPaths(block)` exceeded the limit
    /// (`block == None`: the virtual ENTRY, i.e. the total). The caller skips
    /// path profiling for the function (see the module doc).
    #[error("too many paths: NumPaths({}) exceeds {max_paths}", match block { Some(b) => b.to_string(), None => "ENTRY".to_string() })]
    TooManyPaths {
        block: Option<usize>,
        max_paths: u64,
    },
    /// A path number outside `[0, total)` was given to `regenerate`.
    #[error("path number {path} out of range (function has {total} paths)")]
    PathOutOfRange { path: u64, total: u64 },
}

/// The actions on a truncated edge (back edge, or retreating edge of an
/// irreducible region): count path `r + end_increment`, then
/// `r = restart`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackEdgeAction {
    /// Source block.
    pub from: usize,
    /// Index of the edge in `succs[from]`.
    pub index: usize,
    /// Target block (a loop header or irreducible-region entry).
    pub to: usize,
    /// `Val` of the dummy edge `from -> EXIT`.
    pub end_increment: u64,
    /// `Val` of the dummy edge `ENTRY -> to`: the value the path register
    /// restarts with.
    pub restart: u64,
    /// True for a back edge (target dominates source), false for a
    /// retreating edge of an irreducible region.
    pub is_back_edge: bool,
}

/// A dummy edge `ENTRY -> header`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopStart {
    /// Target of one or more truncated edges.
    pub header: usize,
    /// `Val(ENTRY -> header)`.
    pub increment: u64,
}

/// A Ball-Larus numbering of one function's acyclic paths.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathNumbering {
    entry: usize,
    /// The graph's successor lists (needed to regenerate paths).
    succs: Vec<Vec<usize>>,
    /// `N = NumPaths(ENTRY)`.
    total: u64,
    /// `NumPaths(v)` per block; 0 for unreachable blocks.
    num_paths: Vec<u64>,
    /// `Val` of each real edge `(v, i)`; `None` for truncated edges and edges
    /// out of unreachable blocks.
    increments: Vec<Vec<Option<u64>>>,
    /// `Val(v -> EXIT)` for reachable exit blocks.
    exit_increments: Vec<Option<u64>>,
    /// Truncated edges, sorted by `(from, index)`.
    back_edges: Vec<BackEdgeAction>,
    /// `ENTRY -> header` dummy edges, sorted by header.
    loop_starts: Vec<LoopStart>,
}

/// A path regenerated from its number.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegeneratedPath {
    /// Blocks in execution order (at least one).
    pub blocks: Vec<usize>,
    /// Real edges `(v, i)` taken between consecutive blocks
    /// (`blocks.len() - 1` of them); distinguishes parallel edges.
    pub edges: Vec<(usize, usize)>,
    /// The path starts at a loop header (or irreducible-region entry) after
    /// a truncated edge, rather than at the function entry.
    pub starts_at_loop_header: bool,
    /// The path ends by taking a truncated edge, rather than by leaving the
    /// function from an exit block.
    pub ends_at_back_edge: bool,
    /// The truncated edge `(v, i)` that ends the path, if any.
    pub end_edge: Option<(usize, usize)>,
}

/// One out-edge of a block in the DAG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DagEdge {
    /// `v -> EXIT` of an exit block.
    Exit,
    /// Real edge `(v, i)`.
    Real(usize),
    /// Dummy `v -> EXIT` for truncated edge `(v, i)`.
    End(usize),
}

/// Ball-Larus numbering (PEP §3.1, Figure 2), successors in the base order:
/// exit edge, then real edges in `succs` order, then truncated-edge dummies
/// in `succs` order.
pub fn number_paths(g: &Graph, loops: &Loops) -> Result<PathNumbering, PathsError> {
    number_paths_bounded(g, loops, None, u64::MAX)
}

/// Smart path numbering (PEP §3.4, Figure 4): like [`number_paths`], but
/// every block's DAG out-edges are numbered in decreasing order of
/// `edge_freq(v, i)` (frequency of real edge `(v, i)` in the edge profile),
/// so the hottest out-edge of every block has increment 0. See the module
/// doc for the frequencies of dummy and exit edges.
pub fn number_paths_with_profile(
    g: &Graph,
    loops: &Loops,
    edge_freq: &dyn Fn(usize, usize) -> u64,
) -> Result<PathNumbering, PathsError> {
    number_paths_bounded(g, loops, Some(edge_freq), u64::MAX)
}

/// The general entry point: smart numbering if `edge_freq` is given, and
/// [`PathsError::TooManyPaths`] as soon as `NumPaths` of any block exceeds
/// `max_paths` (e.g. `u32::MAX as u64` for a 32-bit path register or a
/// bounded counter table).
pub fn number_paths_bounded(
    g: &Graph,
    loops: &Loops,
    edge_freq: Option<&dyn Fn(usize, usize) -> u64>,
    max_paths: u64,
) -> Result<PathNumbering, PathsError> {
    g.validate()?;
    let n = g.len();
    let live = reachable(g);

    // Truncated edges, marked per edge; only those out of reachable blocks.
    let mut cut: Vec<Vec<bool>> = g.succs.iter().map(|s| vec![false; s.len()]).collect();
    let mut back_edges: Vec<BackEdgeAction> = Vec::new();
    let mut mark = |list: &[(usize, usize)], is_back_edge: bool| -> Result<(), PathsError> {
        for &(v, i) in list {
            if v >= n || i >= g.succs[v].len() {
                return Err(PathsError::InvalidCutEdge { from: v, index: i });
            }
            if live[v] && !cut[v][i] {
                cut[v][i] = true;
                back_edges.push(BackEdgeAction {
                    from: v,
                    index: i,
                    to: g.succs[v][i],
                    end_increment: 0,
                    restart: 0,
                    is_back_edge,
                });
            }
        }
        Ok(())
    };
    mark(&loops.back_edges, true)?;
    mark(&loops.retreating_non_back, false)?;
    back_edges.sort_by_key(|b| (b.from, b.index));

    let mut headers: Vec<usize> = back_edges.iter().map(|b| b.to).collect();
    headers.sort_unstable();
    headers.dedup();

    // Base order of each block's DAG out-edges.
    let is_exit = {
        let mut e = vec![false; n];
        for &x in &g.exits {
            e[x] = true;
        }
        for (v, s) in g.succs.iter().enumerate() {
            if s.is_empty() {
                e[v] = true;
            }
        }
        e
    };
    let mut dag: Vec<Vec<DagEdge>> = vec![Vec::new(); n];
    for v in (0..n).filter(|&v| live[v]) {
        if is_exit[v] {
            dag[v].push(DagEdge::Exit);
        }
        dag[v].extend(
            (0..g.succs[v].len())
                .filter(|&i| !cut[v][i])
                .map(DagEdge::Real),
        );
        dag[v].extend(
            (0..g.succs[v].len())
                .filter(|&i| cut[v][i])
                .map(DagEdge::End),
        );
    }
    // ENTRY's loop-start edges, in base order (by header).
    let mut start_order: Vec<usize> = headers.clone();

    if let Some(freq) = edge_freq {
        let mut inflow = vec![0u64; n];
        let mut outflow = vec![0u64; n];
        for v in (0..n).filter(|&v| live[v]) {
            for (i, &w) in g.succs[v].iter().enumerate() {
                let f = freq(v, i);
                outflow[v] = outflow[v].saturating_add(f);
                inflow[w] = inflow[w].saturating_add(f);
            }
        }
        for v in (0..n).filter(|&v| live[v]) {
            let f = |e: &DagEdge| match *e {
                DagEdge::Exit => inflow[v].saturating_sub(outflow[v]),
                DagEdge::Real(i) | DagEdge::End(i) => freq(v, i),
            };
            // Stable sort: ties keep the base order.
            dag[v].sort_by_key(|e| std::cmp::Reverse(f(e)));
        }
        let header_freq = |h: usize| -> u64 {
            back_edges
                .iter()
                .filter(|b| b.to == h)
                .fold(0u64, |a, b| a.saturating_add(freq(b.from, b.index)))
        };
        start_order.sort_by_key(|&h| std::cmp::Reverse(header_freq(h)));
    }

    // Topological order of the reachable DAG (Kahn); any order gives the
    // same numbering.
    let mut indeg = vec![0usize; n];
    for v in (0..n).filter(|&v| live[v]) {
        for e in &dag[v] {
            if let DagEdge::Real(i) = *e {
                indeg[g.succs[v][i]] += 1;
            }
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&v| live[v] && indeg[v] == 0).collect();
    let mut topo = Vec::with_capacity(n);
    while let Some(v) = ready.pop() {
        topo.push(v);
        for e in &dag[v] {
            if let DagEdge::Real(i) = *e {
                let w = g.succs[v][i];
                indeg[w] -= 1;
                if indeg[w] == 0 {
                    ready.push(w);
                }
            }
        }
    }
    if topo.len() != live.iter().filter(|&&x| x).count() {
        let block = (0..n).find(|&v| live[v] && indeg[v] > 0).unwrap_or(g.entry);
        return Err(PathsError::Cyclic { block });
    }

    // PEP Figure 2 / Figure 4.
    let mut num_paths = vec![0u64; n];
    let mut increments: Vec<Vec<Option<u64>>> =
        g.succs.iter().map(|s| vec![None; s.len()]).collect();
    let mut exit_increments = vec![None; n];
    let mut end_increment: Vec<Vec<u64>> = g.succs.iter().map(|s| vec![0; s.len()]).collect();
    let too_many = |block: Option<usize>| PathsError::TooManyPaths { block, max_paths };
    for &v in topo.iter().rev() {
        let mut np: u64 = 0;
        for e in &dag[v] {
            let (w_paths, slot): (u64, &mut Option<u64>) = match *e {
                DagEdge::Exit => (1, &mut exit_increments[v]),
                DagEdge::Real(i) => (num_paths[g.succs[v][i]], &mut increments[v][i]),
                DagEdge::End(i) => {
                    end_increment[v][i] = np;
                    np = np
                        .checked_add(1)
                        .filter(|&x| x <= max_paths)
                        .ok_or(too_many(Some(v)))?;
                    continue;
                }
            };
            *slot = Some(np);
            np = np
                .checked_add(w_paths)
                .filter(|&x| x <= max_paths)
                .ok_or(too_many(Some(v)))?;
        }
        num_paths[v] = np;
    }

    // ENTRY: function entry first (Val 0), then loop starts.
    let mut total = num_paths[g.entry];
    let mut loop_starts = Vec::with_capacity(start_order.len());
    for &h in &start_order {
        loop_starts.push(LoopStart {
            header: h,
            increment: total,
        });
        total = total
            .checked_add(num_paths[h])
            .filter(|&x| x <= max_paths)
            .ok_or(too_many(None))?;
    }
    loop_starts.sort_by_key(|s| s.header);
    for b in &mut back_edges {
        b.end_increment = end_increment[b.from][b.index];
        let k = loop_starts
            .binary_search_by_key(&b.to, |s| s.header)
            .expect("every truncated edge's target has a loop start");
        b.restart = loop_starts[k].increment;
    }

    Ok(PathNumbering {
        entry: g.entry,
        succs: g.succs.clone(),
        total,
        num_paths,
        increments,
        exit_increments,
        back_edges,
        loop_starts,
    })
}

impl PathNumbering {
    /// `N`: the number of DAG paths; path numbers are exactly `[0, N)`.
    pub fn total_paths(&self) -> u64 {
        self.total
    }

    /// `NumPaths(v)`: number of DAG paths from block `v` to EXIT (0 for
    /// unreachable blocks).
    pub fn num_paths(&self, v: usize) -> u64 {
        self.num_paths.get(v).copied().unwrap_or(0)
    }

    /// Increment `Val(e)` on real edge `(v, idx)`; `None` if the edge is
    /// truncated (a back edge or irreducible retreating edge: see
    /// [`Self::back_edge_actions`]), out of an unreachable block, or not an
    /// edge.
    pub fn increment(&self, v: usize, idx: usize) -> Option<u64> {
        self.increments.get(v)?.get(idx).copied().flatten()
    }

    /// For a truncated edge `(v, idx)`: `(end_increment, restart)`; at the
    /// edge, count path `r + end_increment`, then set `r = restart`.
    pub fn back_edge_actions(&self, v: usize, idx: usize) -> Option<(u64, u64)> {
        self.back_edge(v, idx).map(|b| (b.end_increment, b.restart))
    }

    /// The full record of truncated edge `(v, idx)`.
    pub fn back_edge(&self, v: usize, idx: usize) -> Option<&BackEdgeAction> {
        self.back_edges
            .binary_search_by_key(&(v, idx), |b| (b.from, b.index))
            .ok()
            .map(|k| &self.back_edges[k])
    }

    /// All truncated edges, sorted by `(from, index)`.
    pub fn back_edges(&self) -> &[BackEdgeAction] {
        &self.back_edges
    }

    /// For a reachable exit block `v`: `Val(v -> EXIT)`; where `v` leaves the
    /// function, count path `r + exit_increment`.
    pub fn exit_increment(&self, v: usize) -> Option<u64> {
        self.exit_increments.get(v).copied().flatten()
    }

    /// `Val(ENTRY -> header)` for a target of truncated edges.
    pub fn loop_start_increment(&self, header: usize) -> Option<u64> {
        self.loop_starts
            .binary_search_by_key(&header, |s| s.header)
            .ok()
            .map(|k| self.loop_starts[k].increment)
    }

    /// `ENTRY -> header` dummy edges, sorted by header.
    pub fn loop_starts(&self) -> &[LoopStart] {
        &self.loop_starts
    }

    /// Number of real edges with a nonzero increment, i.e. the `r += val`
    /// instrumentation points (what smart numbering reduces).
    pub fn nonzero_increments(&self) -> usize {
        self.increments
            .iter()
            .flatten()
            .filter(|x| matches!(x, Some(v) if *v != 0))
            .count()
    }

    /// Regenerates path number `path` (BL96's greedy walk, PEP §3.3).
    pub fn regenerate(&self, path: u64) -> Result<RegeneratedPath, PathsError> {
        if path >= self.total {
            return Err(PathsError::PathOutOfRange {
                path,
                total: self.total,
            });
        }
        let mut r = path;
        // ENTRY's out-edges: [0, NumPaths(entry)) is the function entry.
        let (mut v, starts_at_loop_header) = if r < self.num_paths[self.entry] {
            (self.entry, false)
        } else {
            let s = self
                .loop_starts
                .iter()
                .find(|s| s.increment <= r && r - s.increment < self.num_paths[s.header])
                .expect("numbering partitions [0, N)");
            r -= s.increment;
            (s.header, true)
        };
        let mut out = RegeneratedPath {
            blocks: vec![v],
            edges: Vec::new(),
            starts_at_loop_header,
            ends_at_back_edge: false,
            end_edge: None,
        };
        loop {
            // Invariant: r < NumPaths(v). Find the out-edge whose interval
            // [Val(e), Val(e) + NumPaths(w)) holds r.
            if let Some(x) = self.exit_increments[v]
                && r == x
            {
                return Ok(out);
            }
            if let Some(b) = self
                .back_edges_from(v)
                .iter()
                .find(|b| b.end_increment == r)
            {
                out.ends_at_back_edge = true;
                out.end_edge = Some((b.from, b.index));
                return Ok(out);
            }
            let (i, val) = self.increments[v]
                .iter()
                .enumerate()
                .filter_map(|(i, x)| x.map(|x| (i, x)))
                .find(|&(i, x)| x <= r && r - x < self.num_paths[self.succ_of(v, i)])
                .expect("numbering partitions [0, NumPaths(v))");
            let w = self.succ_of(v, i);
            r -= val;
            out.edges.push((v, i));
            out.blocks.push(w);
            v = w;
        }
    }

    fn back_edges_from(&self, v: usize) -> &[BackEdgeAction] {
        let lo = self.back_edges.partition_point(|b| b.from < v);
        let hi = self.back_edges.partition_point(|b| b.from <= v);
        &self.back_edges[lo..hi]
    }

    /// Target of real edge `(v, i)`.
    fn succ_of(&self, v: usize, i: usize) -> usize {
        self.succs[v][i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::graph::tests::{Rng, graph, random_graph};
    use crate::analysis::graph::{dominators, loops};
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
}
