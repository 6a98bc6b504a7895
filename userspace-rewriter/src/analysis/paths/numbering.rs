//! Ball-Larus numbering (PEP Figure 2) on the DAG whose back edges and
//! irreducible retreating edges are truncated into dummy edges, and PEP's
//! smart numbering (§3.4, from PPP: out-edges in decreasing order of
//! frequency). See the module docs of [`super`].

use super::types::{BackEdgeAction, LoopStart, PathNumbering, PathsError};
use crate::analysis::graph::{Graph, Loops, reachable};

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

/// [`number_paths`], where a function's DAG has more than `max_paths`
/// paths: each time `NumPaths` of a block `v` would exceed the limit,
/// every out-edge of `v` not yet cut is truncated like a back edge (the
/// path ends at `v` with the edge taken; the successor starts one), and
/// the numbering is retried (when only the sum over all path starts
/// overflows, the out-edges of every path start are cut). `NumPaths(v)` then counts `v`'s out-edges
/// alone, so each retry gets further up the DAG; it ends when the count
/// fits. Returns the numbering and the edges cut this way (path ends that
/// are neither exits nor loop edges). With every edge cut a function still
/// has as many paths as path starts and path ends, so a limit below that
/// fails with [`PathsError::TooManyPaths`].
pub fn number_paths_cutting(
    g: &Graph,
    loops: &Loops,
    max_paths: u64,
) -> Result<(PathNumbering, Vec<(usize, usize)>), PathsError> {
    let mut cut_loops = loops.clone();
    let mut extra: Vec<(usize, usize)> = Vec::new();
    loop {
        match number_paths_bounded(g, &cut_loops, None, max_paths) {
            Ok(n) => return Ok((n, extra)),
            Err(PathsError::TooManyPaths { block, .. }) => {
                let before = extra.len();
                // A block's own count overflowed: cut its out-edges. ENTRY's
                // sum did (each path start below the limit, not all of them
                // together): cut the out-edges of every path start.
                let blocks: Vec<usize> = match block {
                    Some(v) => vec![v],
                    None => {
                        let mut starts: Vec<usize> = cut_loops
                            .back_edges
                            .iter()
                            .chain(&cut_loops.retreating_non_back)
                            .map(|&(v, i)| g.succs[v][i])
                            .chain([g.entry])
                            .chain(g.extra_entries.iter().copied())
                            .collect();
                        starts.sort_unstable();
                        starts.dedup();
                        starts
                    }
                };
                for v in blocks {
                    for e in (0..g.succs[v].len()).map(|i| (v, i)) {
                        if !cut_loops.back_edges.contains(&e)
                            && !cut_loops.retreating_non_back.contains(&e)
                        {
                            cut_loops.retreating_non_back.push(e);
                            extra.push(e);
                        }
                    }
                }
                if extra.len() == before {
                    // Everything out of v is cut already: v's own out-degree
                    // is over the limit.
                    return number_paths_bounded(g, &cut_loops, None, max_paths)
                        .map(|n| (n, extra));
                }
                cut_loops.retreating_non_back.sort_unstable();
            }
            Err(e) => return Err(e),
        }
    }
}

/// Smart path numbering (PEP §3.4, Figure 4): like [`number_paths`], but
/// every block's DAG out-edges are numbered in decreasing order of
/// `edge_freq(v, i)` (frequency of real edge `(v, i)` in the edge profile),
/// so the hottest out-edge of every block has increment 0. See the module
/// doc for the frequencies of dummy and exit edges.
#[cfg(test)]
pub(super) fn number_paths_with_profile(
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
pub(super) fn number_paths_bounded(
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

    // Path starts besides the entry: targets of truncated edges, and the
    // blocks entered from outside the function.
    let mut headers: Vec<usize> = back_edges
        .iter()
        .map(|b| b.to)
        .chain(g.extra_entries.iter().copied().filter(|&x| x != g.entry))
        .collect();
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
