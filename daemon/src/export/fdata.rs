//! `edges.fdata`: the edge profile the path counts of bursty tracing imply,
//! in BOLT's branch-profile format, for `llvm-bolt -data=`.
use std::collections::{BTreeMap, HashMap};

use crate::bursts::counts::PathView;
use crate::bursts::facts::{ModuleFacts, PathFacts};

/// `edges.fdata`: the edge profile derived from the paths, in BOLT's
/// branch-profile format (`1 FUNC FROM 1 FUNC TO MISPREDS COUNT`,
/// offsets in hex from the function start), for `llvm-bolt -data=`.
/// FROM is the last byte of the source block (inside its branch), TO the
/// target block's start; call fall-throughs are not branches for BOLT
/// and are left out.
///
/// `counts` may hold several modules' functions: those of module `m` are
/// its `fid_base + index`.
pub(crate) fn fdata(m: &ModuleFacts, counts: &PathView<'_>) -> Fdata {
    use userspace_rewriter::analysis::cfg::EdgeKind;
    let (plan, facts, fid_base) = (&m.plan, &m.fdata, m.fid_base);
    let local = |gfid: u32| {
        gfid.checked_sub(fid_base)
            .filter(|&f| (f as usize) < plan.functions.len())
    };
    let mut details: HashMap<u32, Option<PathFacts<'_>>> = HashMap::new();
    let mut edges: std::collections::BTreeMap<(u32, u64, u64), f64> = Default::default();
    for ((_, _, gfid, path), n) in counts.iter() {
        let Some(fid) = local(*gfid) else {
            continue;
        };
        let f = &plan.functions[fid as usize];
        let Some(PathFacts { cfg, numbering }) = details
            .entry(fid)
            .or_insert_with(|| m.path_details(fid as usize))
        else {
            continue;
        };
        let Ok(p) = numbering.regenerate(*path) else {
            continue;
        };
        for (v, idx) in p.edges.iter().copied().chain(p.end_edge) {
            let Some(e) = cfg.edges.iter().filter(|e| e.from == v).nth(idx) else {
                continue;
            };
            // BOLT counts branches: a block that merely falls into the
            // next one (or returns from a call) has none.
            if matches!(e.kind, EdgeKind::CallFallThrough | EdgeKind::FallThrough) {
                continue;
            }
            let Some(&last) = facts.last_insn.get(&fid).and_then(|l| l.get(v)) else {
                continue;
            };
            let from = last - f.start;
            let to = cfg.blocks[e.to].start - f.start;
            *edges.entry((fid, from, to)).or_insert(0.0) += n.estimate;
        }
    }
    let mut out = Fdata::default();
    for ((fid, from, to), n) in edges {
        let n = n.round() as u64;
        if n == 0 {
            continue;
        }
        let f = &plan.functions[fid as usize];
        let name = facts.bolt_names.get(&f.start).unwrap_or(&f.name);
        out.branches.insert((name.clone(), from, to), n);
    }
    out
}

/// One module's edge profile for BOLT: count per branch `(function, from
/// offset, to offset)` within a function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fdata {
    branches: BTreeMap<(String, u64, u64), u64>,
}

impl Fdata {
    pub(crate) fn is_empty(&self) -> bool {
        self.branches.is_empty()
    }

    /// Adds `other`'s counts (the same binary in several processes).
    pub(crate) fn merge(&mut self, other: &Fdata) {
        for (b, n) in &other.branches {
            *self.branches.entry(b.clone()).or_insert(0) += n;
        }
    }

    /// The profile in BOLT's format, one branch a line:
    /// `1 FUNC FROM 1 FUNC TO MISPREDS COUNT` (offsets in hex).
    pub(crate) fn text(&self) -> String {
        self.branches
            .iter()
            .map(|((name, from, to), n)| format!("1 {name} {from:x} 1 {name} {to:x} 0 {n}\n"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_profiles_add_counts_per_branch_and_print_in_bolt_format() {
        let one = |name: &str, from, to, n| Fdata {
            branches: [((name.to_owned(), from, to), n)].into_iter().collect(),
        };
        let mut a = one("main", 0x10, 0x20, 3);
        a.merge(&one("main", 0x10, 0x20, 4));
        a.merge(&one("f/1", 0x3, 0x0, 1));
        assert_eq!(a.text(), "1 f/1 3 1 f/1 0 0 1\n1 main 10 1 main 20 0 7\n");
        assert!(!a.is_empty() && Fdata::default().is_empty());
    }
}
