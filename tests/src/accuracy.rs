//! Path and edge profile accuracy, as PEP (Bond & McKinley) measures it.
//!
//! - Wall weight matching (PEP §6.3): a path's *flow* is its frequency times
//!   its length in branches. The actual hot paths are those whose flow in
//!   the ground truth exceeds `threshold` (0.125%) of the total flow; the
//!   estimated hot paths are the top |actual| paths of the estimate by
//!   flow. Accuracy = actual flow of (estimated ∩ actual) / actual flow of
//!   actual.
//! - Relative overlap (PEP §6.4): per branch, 1 − the difference between
//!   the actual and estimated bias (for n-way branches, half the L1 distance
//!   of the outcome distributions, which is the same for 2-way branches),
//!   weighted by the branch's actual frequency. A branch the estimate never
//!   saw scores 0.
//!
//! Paths and edges come from `paths.pb.gz` (sample labels `symbol` and
//! `path`) regenerated with the rewriter's plan of the binary.
//!
//! An independent ground truth: [`callgrind_edges`] reads the exact branch
//! counts of valgrind's callgrind (`--collect-jumps=yes --dump-instr=yes`)
//! and names each outcome as the plan's CFG does (the branch's block, the
//! index of the successor edge), so the same [`relative_overlap`] compares
//! an estimate with counts that share none of burstyd's instrumentation,
//! decoding or path regeneration.
use std::collections::{BTreeMap, HashMap};

use userspace_rewriter::analysis::plan::{FunctionStatus, Plan, PlanOptions, analyze};

use crate::pprof::Profile;

/// A path: (function symbol, path number).
pub type PathId = (String, u64);
/// A branch outcome: (function symbol, block, successor index).
pub type EdgeId = (String, usize, usize);

/// Path counts of a `paths.pb.gz`.
pub fn path_counts(p: &Profile) -> HashMap<PathId, u64> {
    path_counts_of(p, "executions")
}

/// [`path_counts`] with the values of sample type `value` (e.g.
/// `recorded`, the executions recorded before the estimator's weights);
/// the first sample type where the profile has no such one.
pub fn path_counts_of(p: &Profile, value: &str) -> HashMap<PathId, u64> {
    let i = p.value_index(value).unwrap_or(0);
    let mut out = HashMap::new();
    for s in &p.samples {
        let (Some(sym), Some(&path)) = (s.label("symbol"), s.num_labels.get("path")) else {
            continue;
        };
        *out.entry((sym.to_string(), path as u64)).or_insert(0) += s.values[i] as u64;
    }
    out
}

/// A path's taken edges `(block, successor index)` and the out-degree of
/// every block of its function.
type PathEdges = (Vec<(usize, usize)>, Vec<usize>);

/// Regenerates paths with the plan of the binary: per path its branch
/// count, and the edge profile.
pub struct Regenerator {
    plan: Plan,
    by_name: HashMap<String, usize>,
    /// `(start, function index)`, sorted.
    by_start: Vec<(u64, usize)>,
}

impl Regenerator {
    pub fn new(binary: &[u8]) -> anyhow::Result<Self> {
        let plan = analyze(binary, &PlanOptions::default())?.plan;
        let by_name = plan
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), i))
            .collect();
        let mut by_start: Vec<(u64, usize)> = plan
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| (f.start, i))
            .collect();
        by_start.sort_unstable();
        Ok(Regenerator {
            plan,
            by_name,
            by_start,
        })
    }

    /// Taken edges `(block, successor index)` of a path (the truncated edge
    /// that ends it included) and, per block, its number of successors.
    fn edges(&self, id: &PathId) -> Option<PathEdges> {
        let f = &self.plan.functions[*self.by_name.get(&id.0)?];
        let FunctionStatus::Analyzed(fa) = &f.status else {
            return None;
        };
        let (cfg, n) = (fa.cfg.as_ref()?, fa.numbering.as_ref()?);
        let p = n.regenerate(id.1).ok()?;
        let mut edges = p.edges.clone();
        edges.extend(p.end_edge);
        let mut outdeg = vec![0; cfg.blocks.len()];
        for e in &cfg.edges {
            outdeg[e.from] += 1;
        }
        Some((edges, outdeg))
    }

    /// The outcome `(function, block, successor index)` of the branch at
    /// SVMA `from` that goes to `to` (the block ending at `from` and its
    /// edge to the block starting at `to`), and the block's number of
    /// successors.
    fn outcome(&self, from: u64, to: u64) -> Option<(EdgeId, usize)> {
        let k = self.by_start.partition_point(|&(s, _)| s <= from);
        let &(_, fi) = self.by_start.get(k.checked_sub(1)?)?;
        let f = &self.plan.functions[fi];
        let FunctionStatus::Analyzed(fa) = &f.status else {
            return None;
        };
        let cfg = fa.cfg.as_ref()?;
        let b = cfg.block_at(from)?;
        let succs: Vec<usize> = cfg.succs(b).collect();
        let i = succs.iter().position(|&t| cfg.blocks[t].start == to)?;
        Some(((f.name.clone(), b, i), succs.len()))
    }

    /// Branches on the path: taken edges out of blocks with two or more
    /// successors.
    pub fn branches(&self, id: &PathId) -> u64 {
        self.edges(id)
            .map(|(edges, outdeg)| edges.iter().filter(|(v, _)| outdeg[*v] >= 2).count() as u64)
            .unwrap_or(0)
    }

    /// The edge profile of a path profile: counts of each outcome of each
    /// branch (blocks with two or more successors).
    pub fn edge_profile(&self, paths: &HashMap<PathId, u64>) -> HashMap<EdgeId, u64> {
        let mut out = HashMap::new();
        for (id, &c) in paths {
            let Some((edges, outdeg)) = self.edges(id) else {
                continue;
            };
            for (v, i) in edges {
                if outdeg[v] >= 2 {
                    *out.entry((id.0.clone(), v, i)).or_insert(0) += c;
                }
            }
        }
        out
    }
}

/// The edge profile of the object `object` (its path as callgrind names
/// it in `ob=` lines) in a callgrind output file written with
/// `--collect-jumps=yes --dump-instr=yes --compress-strings=no
/// --compress-pos=no`: for every branch with two or more successors in the
/// plan's CFGs, the exact count of each outcome. A conditional jump line
/// `jcnd=J/E target` (J jumps of E executions) gives the taken edge J and
/// the other edge E − J; `jump=N target` lines of an indirect jump give
/// each target's count. The jump's own position is the line after it.
/// Also returns how many branch lines it could not place in a CFG (code
/// the plan did not analyse).
pub fn callgrind_edges(text: &str, object: &str, r: &Regenerator) -> (HashMap<EdgeId, u64>, usize) {
    let mut out: HashMap<EdgeId, u64> = HashMap::new();
    let mut unplaced = 0;
    let mut in_object = false;
    // (jumps, executions or None for `jump=`, target) awaiting its source.
    let mut pending: Option<(u64, Option<u64>, u64)> = None;
    let hex = |t: &str| u64::from_str_radix(t.trim_start_matches("0x"), 16).ok();
    for line in text.lines() {
        if let Some(ob) = line.strip_prefix("ob=") {
            in_object = ob == object || ob.ends_with(&format!("/{object}"));
            continue;
        }
        if !in_object {
            pending = None;
            continue;
        }
        if let Some(rest) = line.strip_prefix("jcnd=") {
            let mut it = rest.split_whitespace();
            let counts = it.next().unwrap_or("");
            let target = it.next().and_then(hex);
            let (j, e) = counts.split_once('/').unwrap_or(("", ""));
            pending = match (j.parse().ok(), e.parse().ok(), target) {
                (Some(j), Some(e), Some(t)) => Some((j, Some(e), t)),
                _ => None,
            };
            continue;
        }
        if let Some(rest) = line.strip_prefix("jump=") {
            let mut it = rest.split_whitespace();
            pending = match (
                it.next().and_then(|n| n.parse().ok()),
                it.next().and_then(hex),
            ) {
                (Some(n), Some(t)) => Some((n, None, t)),
                _ => None,
            };
            continue;
        }
        if line.starts_with("0x") {
            if let Some((j, e, target)) = pending.take()
                && let Some(from) = line.split_whitespace().next().and_then(hex)
            {
                match r.outcome(from, target) {
                    // Only branches: blocks with two or more successors.
                    Some(((f, b, i), n)) if n >= 2 => {
                        *out.entry((f.clone(), b, i)).or_insert(0) += j;
                        if let Some(e) = e
                            && n == 2
                        {
                            *out.entry((f, b, 1 - i)).or_insert(0) += e.saturating_sub(j);
                        }
                    }
                    Some(_) => {}
                    None => unplaced += 1,
                }
            }
            continue;
        }
        pending = None;
    }
    (out, unplaced)
}

/// Wall weight matching of `estimate` against `truth`; `flow_of` gives a
/// path's branch count.
pub fn wall_weight_matching(
    truth: &HashMap<PathId, u64>,
    estimate: &HashMap<PathId, u64>,
    branches: impl Fn(&PathId) -> u64,
    threshold: f64,
) -> f64 {
    let flow = |m: &HashMap<PathId, u64>| -> Vec<(PathId, f64)> {
        let mut v: Vec<(PathId, f64)> = m
            .iter()
            .map(|(id, &c)| (id.clone(), c as f64 * branches(id) as f64))
            .filter(|(_, f)| *f > 0.0)
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    };
    let t = flow(truth);
    let total: f64 = t.iter().map(|(_, f)| f).sum();
    if total == 0.0 {
        return 1.0;
    }
    let hot: BTreeMap<&PathId, f64> = t
        .iter()
        .filter(|(_, f)| *f > threshold * total)
        .map(|(id, f)| (id, *f))
        .collect();
    let hot_flow: f64 = hot.values().sum();
    let e = flow(estimate);
    let matched: f64 = e
        .iter()
        .take(hot.len())
        .filter_map(|(id, _)| hot.get(id))
        .sum();
    matched / hot_flow
}

/// Relative overlap of two edge profiles (see the module doc).
pub fn relative_overlap(truth: &HashMap<EdgeId, u64>, estimate: &HashMap<EdgeId, u64>) -> f64 {
    let per_branch = branch_accuracy(truth, estimate);
    let (num, den) = per_branch.iter().fold((0.0, 0.0), |(n, d), (_, f, a)| {
        (n + *f as f64 * a, d + *f as f64)
    });
    if den == 0.0 { 1.0 } else { num / den }
}

/// Per branch of `truth` (function, block): its actual frequency and the
/// estimate's accuracy on it (1 − half the L1 distance of the outcome
/// distributions; 0 when the estimate never saw it), most frequent first.
pub fn branch_accuracy(
    truth: &HashMap<EdgeId, u64>,
    estimate: &HashMap<EdgeId, u64>,
) -> Vec<((String, usize), u64, f64)> {
    type Branch = (String, usize);
    let group = |m: &HashMap<EdgeId, u64>| -> HashMap<Branch, BTreeMap<usize, u64>> {
        let mut g: HashMap<Branch, BTreeMap<usize, u64>> = HashMap::new();
        for ((f, v, i), &c) in m {
            *g.entry((f.clone(), *v)).or_default().entry(*i).or_insert(0) += c;
        }
        g
    };
    let (t, e) = (group(truth), group(estimate));
    let mut out = Vec::new();
    for (b, outcomes) in &t {
        let freq: u64 = outcomes.values().sum();
        if freq == 0 {
            continue;
        }
        let acc = match e.get(b) {
            Some(est) => {
                let efreq: u64 = est.values().sum::<u64>().max(1);
                let mut keys: Vec<usize> = outcomes.keys().chain(est.keys()).copied().collect();
                keys.sort_unstable();
                keys.dedup();
                let l1: f64 = keys
                    .iter()
                    .map(|k| {
                        let p = *outcomes.get(k).unwrap_or(&0) as f64 / freq as f64;
                        let q = *est.get(k).unwrap_or(&0) as f64 / efreq as f64;
                        (p - q).abs()
                    })
                    .sum();
                1.0 - l1 / 2.0
            }
            None => 0.0,
        };
        out.push((b.clone(), freq, acc));
    }
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(f: &str, p: u64) -> PathId {
        (f.to_string(), p)
    }

    #[test]
    fn wall_matching_counts_hot_flow_found() {
        let truth: HashMap<PathId, u64> = [
            (id("f", 0), 900),
            (id("f", 1), 90),
            (id("f", 2), 10),
            (id("g", 0), 1),
        ]
        .into();
        // Same order of the hot paths: perfect.
        let est: HashMap<PathId, u64> = [(id("f", 0), 80), (id("f", 1), 9), (id("f", 2), 2)].into();
        let b = |_: &PathId| 2;
        assert_eq!(wall_weight_matching(&truth, &est, b, 0.00125), 1.0);
        // The estimate misses f/1 and ranks a cold path instead: f/1's flow
        // (90 of the 1000 hot flow) is lost; g/0 is below the threshold.
        let est: HashMap<PathId, u64> = [(id("f", 0), 80), (id("g", 0), 9), (id("f", 2), 2)].into();
        let acc = wall_weight_matching(&truth, &est, b, 0.00125);
        assert!((acc - 910.0 / 1000.0).abs() < 1e-9, "{acc}");
    }

    #[test]
    fn relative_overlap_weights_branch_bias_by_frequency() {
        let e = |v: usize, i: usize| ("f".to_string(), v, i);
        let truth: HashMap<EdgeId, u64> = [(e(0, 0), 75), (e(0, 1), 25), (e(1, 0), 100)].into();
        // Branch 0: bias 0.75 vs 0.5 → 0.75; branch 1 exact → 1.
        let est: HashMap<EdgeId, u64> = [(e(0, 0), 5), (e(0, 1), 5), (e(1, 0), 3)].into();
        let acc = relative_overlap(&truth, &est);
        assert!(
            (acc - (100.0 * 0.75 + 100.0 * 1.0) / 200.0).abs() < 1e-9,
            "{acc}"
        );
        // A branch never seen scores 0.
        let est: HashMap<EdgeId, u64> = [(e(1, 0), 3)].into();
        assert!((relative_overlap(&truth, &est) - 0.5).abs() < 1e-9);
    }
}
