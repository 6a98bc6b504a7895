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
//! - Every exit block (listed in
//!   [`Graph::exits`](crate::analysis::graph::Graph::exits), or without
//!   successors) has one edge to `EXIT`; every truncated edge `(v, i)` gets
//!   its own dummy `v -> EXIT` edge, so a path records *which* back edge
//!   ended it.
//!
//! Irreducible regions (PEP and BL96 speak of loops; Ammons et al. note the
//! algorithm handles irreducible CFGs) are cut at the retreating edges that
//! [`graph::loops`](crate::analysis::graph::loops) reports in
//! `retreating_non_back`, exactly like back edges: cutting all retreating
//! edges of a DFS leaves an acyclic graph.
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
//! `number_paths_with_profile` implements PEP's *smart path numbering*
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
//! [`number_paths`] and `number_paths_with_profile`, or the `max_paths`
//! given to `number_paths_bounded`), numbering fails with
//! [`PathsError::TooManyPaths`], naming the block where the limit was crossed.
//! The documented answer is: **the caller skips path profiling for that
//! function** (it counts the skip in the plan's statistics) and still
//! rewrites the function for its other instrumentation (edges, calls, entry
//! and back-edge checks).
//!
//! The rewriter does not stop there: [`number_paths_cutting`] breaks the
//! DAG at the blocks where the count overflows ("path splitting", as PEP
//! cuts paths at more points than BL96): every out-edge of such a block is
//! truncated exactly like a back edge (count `r + end`, then `r =
//! restart`), so no new kind of instrumentation is needed, the numbering
//! and regeneration are unchanged, and every cloned function has path
//! numbers. A path of such a function may then also end at a cut edge
//! (recorded like a back edge, and given a burst check like one by the
//! clones: no cycle needs it, but every path record is then a check, so a
//! burst's records stay bounded by its budget); which blocks are cut is
//! deterministic (the first overflowing block in the fixed reverse
//! topological order, repeatedly).
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
//!
//! # Files
//!
//! - `types.rs`: the numbering's types and accessors (this file only
//!   re-exports);
//! - `numbering.rs`: Ball-Larus numbering on the truncated DAG, and PEP's
//!   smart (profile-guided) order ([`number_paths`],
//!   `number_paths_with_profile` (for now only the unit tests feed it a
//!   profile), `number_paths_bounded`);
//! - `regenerate.rs`: path number → blocks ([`PathNumbering::regenerate`]).

mod numbering;
mod regenerate;
#[cfg(test)]
mod tests;
mod types;

pub use numbering::{number_paths, number_paths_cutting};
#[cfg(test)]
use numbering::{number_paths_bounded, number_paths_with_profile};
pub use types::{PathNumbering, PathsError, RegeneratedPath};
