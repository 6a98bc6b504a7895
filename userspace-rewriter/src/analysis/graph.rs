//! Generic directed-graph algorithms over a CFG-like [`Graph`]: reachability,
//! reverse postorder, dominators, back edges, natural loops and the
//! retreating edges of irreducible regions.
//!
//! These are the inputs of Ball-Larus path numbering ([`paths`](super::paths)):
//! Ball & Larus ("Efficient Path Profiling", MICRO 1996; summarised in
//! Bond & McKinley, "Continuous Path and Edge Profiling" (PEP), §3.1, and in
//! Ammons, Ball & Larus, PLDI 1997, §2) turn a CFG into a DAG by *truncating*
//! every loop back edge. The Ammons/Ball/Larus summary states the algorithm
//! handles "reducible and irreducible CFGs": a cycle always contains a
//! *retreating* edge of a depth-first search from the entry, so cutting all
//! retreating edges leaves an acyclic graph. For reducible graphs the
//! retreating edges are exactly the back edges (edges whose target dominates
//! their source); irreducible regions (cycles with two or more entries)
//! additionally have retreating edges whose target does not dominate their
//! source. [`loops`] reports both kinds separately.
//!
//! Everything here is deterministic: depth-first searches visit successors in
//! `succs[v]` order, results are `Vec`s in documented orders, and no hash
//! iteration order leaks into any output.
//!
//! Blocks that are not reachable from [`Graph::entry`] have no immediate
//! dominator, are not in any loop, and never take part in back or retreating
//! edges.

use serde::{Deserialize, Serialize};

/// A control-flow graph reduced to its shape.
///
/// Nodes are `0..succs.len()`. `succs[v]` lists v's out-edges in a fixed
/// order; an edge is identified by `(v, i)`, the index `i` into `succs[v]`
/// (so parallel edges `v -> w` are distinct edges).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Graph {
    /// Out-edges of each node, in a fixed order.
    pub succs: Vec<Vec<usize>>,
    /// The function's entry block.
    pub entry: usize,
    /// Blocks that leave the function (ret, tail call, noreturn call, ...).
    /// A block listed here may also have successors (e.g. a conditional tail
    /// call); [`paths`](super::paths) gives it a virtual edge to EXIT in addition to
    /// its real edges. Blocks without successors are treated as exits whether
    /// or not they are listed.
    pub exits: Vec<usize>,
    /// Blocks entered from outside the function other than at `entry`
    /// (where a function's `.cold` part jumps back into it, or where the
    /// function jumps into the middle of its `.cold` part). Each starts
    /// paths: [`paths`](super::paths) gives it a dummy edge from ENTRY,
    /// like a loop header.
    #[serde(default)]
    pub extra_entries: Vec<usize>,
}

/// A malformed [`Graph`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum GraphError {
    /// The graph has no nodes.
    #[error("graph has no nodes")]
    Empty,
    /// `entry` is not a node.
    #[error("entry {entry} is not a node (graph has {nodes} nodes)")]
    BadEntry { entry: usize, nodes: usize },
    /// An edge or an exit names a node that does not exist.
    #[error("node {node} referenced from {context} does not exist (graph has {nodes} nodes)")]
    BadNode {
        node: usize,
        context: String,
        nodes: usize,
    },
}

impl Graph {
    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.succs.len()
    }

    /// True if the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.succs.is_empty()
    }

    /// Checks that `entry`, every edge target and every exit are nodes.
    /// The algorithms in this module and in [`paths`](super::paths) assume a
    /// valid graph ([`paths`](super::paths) calls this and reports the error).
    pub(crate) fn validate(&self) -> Result<(), GraphError> {
        let n = self.len();
        if n == 0 {
            return Err(GraphError::Empty);
        }
        if self.entry >= n {
            return Err(GraphError::BadEntry {
                entry: self.entry,
                nodes: n,
            });
        }
        for (v, ss) in self.succs.iter().enumerate() {
            for (i, &w) in ss.iter().enumerate() {
                if w >= n {
                    return Err(GraphError::BadNode {
                        node: w,
                        context: format!("edge ({v}, {i})"),
                        nodes: n,
                    });
                }
            }
        }
        for (what, list) in [
            ("exits", &self.exits),
            ("extra entries", &self.extra_entries),
        ] {
            if let Some(&x) = list.iter().find(|&&x| x >= n) {
                return Err(GraphError::BadNode {
                    node: x,
                    context: what.to_string(),
                    nodes: n,
                });
            }
        }
        Ok(())
    }

    /// Predecessor lists: `preds[w]` holds `(v, i)` for every edge
    /// `succs[v][i] == w`, in increasing `(v, i)` order.
    fn predecessors(&self) -> Vec<Vec<(usize, usize)>> {
        let mut preds = vec![Vec::new(); self.len()];
        for (v, ss) in self.succs.iter().enumerate() {
            for (i, &w) in ss.iter().enumerate() {
                preds[w].push((v, i));
            }
        }
        preds
    }

    /// Whether `v` is an exit block: listed in `exits`, or without successors.
    pub fn is_exit(&self, v: usize) -> bool {
        self.succs[v].is_empty() || self.exits.contains(&v)
    }
}

/// Result of one depth-first search from the entry, visiting successors in
/// `succs` order.
struct Dfs {
    /// Reachable nodes in reverse postorder.
    rpo: Vec<usize>,
    /// Edges `(v, i)` whose target is on the DFS stack when the edge is
    /// examined (retreating edges, including self loops), in increasing
    /// `(v, i)` order.
    retreating: Vec<(usize, usize)>,
}

/// Iterative DFS (no recursion: CFGs of large functions are deep).
fn dfs(g: &Graph) -> Dfs {
    let n = g.len();
    // 0 = unvisited, 1 = on stack, 2 = finished
    let mut state = vec![0u8; n];
    let mut post = Vec::with_capacity(n);
    let mut retreating = Vec::new();
    let mut stack: Vec<(usize, usize)> = vec![(g.entry, 0)];
    state[g.entry] = 1;
    while let Some(top) = stack.last_mut() {
        let (v, i) = *top;
        if i < g.succs[v].len() {
            top.1 += 1;
            let w = g.succs[v][i];
            match state[w] {
                0 => {
                    state[w] = 1;
                    stack.push((w, 0));
                }
                1 => retreating.push((v, i)),
                _ => {}
            }
        } else {
            state[v] = 2;
            post.push(v);
            stack.pop();
        }
    }
    post.reverse();
    retreating.sort_unstable();
    Dfs {
        rpo: post,
        retreating,
    }
}

/// Nodes reachable from the entry or an extra entry.
pub fn reachable(g: &Graph) -> Vec<bool> {
    let mut seen = vec![false; g.len()];
    let mut stack = vec![g.entry];
    seen[g.entry] = true;
    for &x in &g.extra_entries {
        if !seen[x] {
            seen[x] = true;
            stack.push(x);
        }
    }
    while let Some(v) = stack.pop() {
        for &w in &g.succs[v] {
            if !seen[w] {
                seen[w] = true;
                stack.push(w);
            }
        }
    }
    seen
}

/// Reachable nodes in reverse postorder of a DFS from the entry that visits
/// successors in `succs` order (the entry comes first).
#[cfg(test)]
fn reverse_postorder(g: &Graph) -> Vec<usize> {
    dfs(g).rpo
}

/// The dominator tree, computed with the iterative algorithm of Cooper,
/// Harvey & Kennedy ("A Simple, Fast Dominance Algorithm", 2001).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dominators {
    entry: usize,
    /// Immediate dominator; `None` for the entry and for unreachable nodes.
    idom: Vec<Option<usize>>,
    /// Position in reverse postorder; `usize::MAX` for unreachable nodes.
    rpo_index: Vec<usize>,
    /// Reachable nodes in reverse postorder.
    rpo: Vec<usize>,
}

impl Dominators {
    /// Immediate dominator of `v`; `None` for the entry and for nodes not
    /// reachable from the entry.
    #[cfg(test)]
    fn idom(&self, v: usize) -> Option<usize> {
        self.idom[v]
    }

    /// Whether `v` is reachable from the entry.
    fn is_reachable(&self, v: usize) -> bool {
        self.rpo_index[v] != usize::MAX
    }

    /// Whether `a` dominates `b` (reflexive: every reachable node dominates
    /// itself). False whenever `b` is unreachable.
    fn dominates(&self, a: usize, b: usize) -> bool {
        if !self.is_reachable(a) || !self.is_reachable(b) {
            return false;
        }
        let mut x = b;
        loop {
            if x == a {
                return true;
            }
            // A dominator precedes its dominatees in reverse postorder.
            if self.rpo_index[x] < self.rpo_index[a] {
                return false;
            }
            match self.idom[x] {
                Some(p) => x = p,
                None => return false,
            }
        }
    }
}

/// Computes dominators (Cooper–Harvey–Kennedy). Panics on an invalid graph
/// (see `Graph::validate`).
pub fn dominators(g: &Graph) -> Dominators {
    let n = g.len();
    let rpo = dfs(g).rpo;
    let mut rpo_index = vec![usize::MAX; n];
    for (k, &v) in rpo.iter().enumerate() {
        rpo_index[v] = k;
    }
    let preds = g.predecessors();
    // doms[v] holds the rpo index of the current idom candidate.
    const UNDEF: usize = usize::MAX;
    let mut doms = vec![UNDEF; rpo.len()];
    doms[0] = 0;
    let intersect = |doms: &[usize], mut a: usize, mut b: usize| {
        while a != b {
            while a > b {
                a = doms[a];
            }
            while b > a {
                b = doms[b];
            }
        }
        a
    };
    let mut changed = true;
    while changed {
        changed = false;
        for k in 1..rpo.len() {
            let v = rpo[k];
            let mut new_idom = UNDEF;
            for &(p, _) in &preds[v] {
                let pk = rpo_index[p];
                if pk == usize::MAX || doms[pk] == UNDEF {
                    continue;
                }
                new_idom = if new_idom == UNDEF {
                    pk
                } else {
                    intersect(&doms, pk, new_idom)
                };
            }
            if doms[k] != new_idom {
                doms[k] = new_idom;
                changed = true;
            }
        }
    }
    let mut idom = vec![None; n];
    for k in 1..rpo.len() {
        idom[rpo[k]] = Some(rpo[doms[k]]);
    }
    Dominators {
        entry: g.entry,
        idom,
        rpo_index,
        rpo,
    }
}

/// A natural loop: all back edges into one header, merged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Loop {
    /// The loop header (target of the back edges; dominates the body).
    pub(crate) header: usize,
    /// Blocks of the loop, header included, sorted. Includes the blocks of
    /// nested loops.
    pub(crate) body: Vec<usize>,
    /// The back edges `(v, i)` into `header`, sorted.
    pub(crate) back_edges: Vec<(usize, usize)>,
    /// Index (into [`Loops::loops`]) of the innermost enclosing loop.
    parent: Option<usize>,
}

/// Loop structure of a graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loops {
    /// All back edges `(v, i)`: edges whose target dominates their source
    /// (self loops included), sorted.
    pub back_edges: Vec<(usize, usize)>,
    /// Retreating edges of the DFS from the entry whose target does *not*
    /// dominate their source: the edges that close cycles of irreducible
    /// regions (cycles with more than one entry), sorted. Which edge of an
    /// irreducible cycle is reported depends on the DFS, which visits
    /// successors in `succs` order, so the choice is deterministic.
    pub retreating_non_back: Vec<(usize, usize)>,
    /// Natural loops, one per header, ordered by the header's position in
    /// reverse postorder (so an enclosing loop comes before the loops nested
    /// in it).
    pub(crate) loops: Vec<Loop>,
    /// True iff `retreating_non_back` is non-empty, i.e. the reachable part
    /// of the graph is irreducible.
    pub(crate) irreducible: bool,
}

impl Loops {
    /// The edges path numbering cuts to make the graph acyclic: back edges
    /// and retreating edges of irreducible regions, sorted.
    pub fn cut_edges(&self) -> Vec<(usize, usize)> {
        let mut all: Vec<(usize, usize)> = self
            .back_edges
            .iter()
            .chain(&self.retreating_non_back)
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Whether edge `(v, i)` is a back edge or a retreating edge.
    pub fn is_cut(&self, v: usize, i: usize) -> bool {
        self.back_edges.binary_search(&(v, i)).is_ok()
            || self.retreating_non_back.binary_search(&(v, i)).is_ok()
    }

    /// Index of the innermost loop containing block `v`, if any.
    #[cfg(test)]
    fn innermost_loop_of(&self, v: usize) -> Option<usize> {
        self.loops
            .iter()
            .enumerate()
            .filter(|(_, l)| l.body.binary_search(&v).is_ok())
            .min_by_key(|(k, l)| (l.body.len(), *k))
            .map(|(k, _)| k)
    }
}

/// Finds back edges, natural loops and irreducible retreating edges.
///
/// A back edge is an edge `v -> h` where `h` dominates `v`; the natural loop
/// of header `h` is `h` plus every block that reaches the source of one of
/// its back edges without passing through `h`. Loops sharing a header are
/// merged. Any cycle not closed by a back edge belongs to an irreducible
/// region; the retreating edges of the DFS whose target does not dominate
/// their source are reported in [`Loops::retreating_non_back`].
pub fn loops(g: &Graph, dom: &Dominators) -> Loops {
    let d = dfs(g);
    let preds = g.predecessors();
    let mut back_edges = Vec::new();
    let mut retreating_non_back = Vec::new();
    // Every back edge is a retreating edge of every DFS (a dominator is a DFS
    // ancestor), so classifying the retreating edges finds all of them.
    for &(v, i) in &d.retreating {
        let h = g.succs[v][i];
        if dom.dominates(h, v) {
            back_edges.push((v, i));
        } else {
            retreating_non_back.push((v, i));
        }
    }
    // Group back edges by header, headers in reverse postorder.
    let mut headers: Vec<usize> = back_edges.iter().map(|&(v, i)| g.succs[v][i]).collect();
    headers.sort_unstable_by_key(|&h| dom.rpo_index[h]);
    headers.dedup();
    let mut result: Vec<Loop> = Vec::with_capacity(headers.len());
    let mut in_body = vec![false; g.len()];
    for &h in &headers {
        let bes: Vec<(usize, usize)> = back_edges
            .iter()
            .copied()
            .filter(|&(v, i)| g.succs[v][i] == h)
            .collect();
        let mut body = vec![h];
        in_body[h] = true;
        let mut work: Vec<usize> = Vec::new();
        for &(v, _) in &bes {
            if !in_body[v] {
                in_body[v] = true;
                body.push(v);
                work.push(v);
            }
        }
        while let Some(x) = work.pop() {
            for &(p, _) in &preds[x] {
                if !in_body[p] && dom.is_reachable(p) {
                    in_body[p] = true;
                    body.push(p);
                    work.push(p);
                }
            }
        }
        for &x in &body {
            in_body[x] = false;
        }
        body.sort_unstable();
        result.push(Loop {
            header: h,
            body,
            back_edges: bes,
            parent: None,
        });
    }
    // Parent: the smallest other loop whose body contains this loop's body.
    for k in 0..result.len() {
        let mut best: Option<usize> = None;
        for j in 0..result.len() {
            if j == k || result[j].body.len() <= result[k].body.len() {
                continue;
            }
            let contains = result[k]
                .body
                .iter()
                .all(|x| result[j].body.binary_search(x).is_ok());
            if contains && best.is_none_or(|b| result[j].body.len() < result[b].body.len()) {
                best = Some(j);
            }
        }
        result[k].parent = best;
    }
    let irreducible = !retreating_non_back.is_empty();
    Loops {
        back_edges,
        retreating_non_back,
        loops: result,
        irreducible,
    }
}

#[cfg(test)]
pub(crate) mod tests;
