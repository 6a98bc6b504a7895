//! Regeneration: a Ball-Larus path number back to its blocks, with BL96's
//! greedy walk as used by PEP §3.3 (see the module docs of [`super`]).

use super::types::{BackEdgeAction, PathNumbering, PathsError, RegeneratedPath};

impl PathNumbering {
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
