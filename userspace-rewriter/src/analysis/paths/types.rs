//! The numbering's types and accessors: [`PathNumbering`], its truncated
//! edges' actions, [`RegeneratedPath`] and [`PathsError`].

use serde::{Deserialize, Serialize};

use crate::analysis::graph::GraphError;

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
pub(crate) struct BackEdgeAction {
    /// Source block.
    pub(super) from: usize,
    /// Index of the edge in `succs[from]`.
    pub(super) index: usize,
    /// Target block (a loop header or irreducible-region entry).
    pub(super) to: usize,
    /// `Val` of the dummy edge `from -> EXIT`.
    pub(crate) end_increment: u64,
    /// `Val` of the dummy edge `ENTRY -> to`: the value the path register
    /// restarts with.
    pub(crate) restart: u64,
    /// True for a back edge (target dominates source), false for a
    /// retreating edge of an irreducible region.
    pub(super) is_back_edge: bool,
}

/// A dummy edge `ENTRY -> header`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LoopStart {
    /// Target of one or more truncated edges.
    pub(super) header: usize,
    /// `Val(ENTRY -> header)`.
    pub(super) increment: u64,
}

/// A Ball-Larus numbering of one function's acyclic paths.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathNumbering {
    pub(super) entry: usize,
    /// The graph's successor lists (needed to regenerate paths).
    pub(super) succs: Vec<Vec<usize>>,
    /// `N = NumPaths(ENTRY)`.
    pub(super) total: u64,
    /// `NumPaths(v)` per block; 0 for unreachable blocks.
    pub(super) num_paths: Vec<u64>,
    /// `Val` of each real edge `(v, i)`; `None` for truncated edges and edges
    /// out of unreachable blocks.
    pub(super) increments: Vec<Vec<Option<u64>>>,
    /// `Val(v -> EXIT)` for reachable exit blocks.
    pub(super) exit_increments: Vec<Option<u64>>,
    /// Truncated edges, sorted by `(from, index)`.
    pub(super) back_edges: Vec<BackEdgeAction>,
    /// `ENTRY -> header` dummy edges, sorted by header.
    pub(super) loop_starts: Vec<LoopStart>,
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

impl PathNumbering {
    /// `N`: the number of DAG paths; path numbers are exactly `[0, N)`.
    pub fn total_paths(&self) -> u64 {
        self.total
    }

    /// `NumPaths(v)`: number of DAG paths from block `v` to EXIT (0 for
    /// unreachable blocks).
    #[cfg(test)]
    pub(super) fn num_paths(&self, v: usize) -> u64 {
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
    pub(crate) fn back_edge(&self, v: usize, idx: usize) -> Option<&BackEdgeAction> {
        self.back_edges
            .binary_search_by_key(&(v, idx), |b| (b.from, b.index))
            .ok()
            .map(|k| &self.back_edges[k])
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

    /// Number of real edges with a nonzero increment, i.e. the `r += val`
    /// instrumentation points (what smart numbering reduces).
    #[cfg(test)]
    pub(super) fn nonzero_increments(&self) -> usize {
        self.increments
            .iter()
            .flatten()
            .filter(|x| matches!(x, Some(v) if *v != 0))
            .count()
    }
}
