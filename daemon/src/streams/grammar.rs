//! A locally consistent grammar of a reference sequence: edit-sensitive
//! parsing (Cormode & Muthukrishnan, "The string edit distance matching
//! problem with moves", TALG 2007; the grammar compressions of Sakamoto
//! et al. build on it). Level by level, the sequence is cut into blocks
//! of two to four symbols (a few more at the start of a stretch), each
//! distinct block a rule, and the blocks are the next level's symbols,
//! until every sequence is one symbol. It is linear in time and space,
//! like Sequitur (Nevill-Manning & Witten, JAIR 1997), whose grammar
//! Chilimbi's hot data streams came from, and hierarchical like it.
//!
//! Why not Sequitur: Sequitur's rules depend on the order digrams were
//! first seen, so the same repeated stretch of references is cut in
//! different places in different traces, and even in one trace (a burst
//! that starts inside a round of a loop makes a variant rule, and the
//! round's occurrences split among the variants). Streams are compared
//! by their access signature, so a profile from bursts then shares few
//! streams with a complete trace's (overlap 0.38 on sqlite3). Here the
//! cuts are *local*: whether a block starts at a position depends only on
//! the symbols within a few places of it (`O(log* n)` to its left, two
//! to its right, at each level), so a stretch that repeats is parsed the
//! same way wherever it occurs, except within a few symbols of its ends.
//!
//! The cuts. Each level's symbol has a *name*, a 64-bit hash of its
//! content that does not depend on the trace: an instruction's module
//! file name and static address for a reference (data addresses differ
//! from run to run, and between our trace and another tool's), the
//! hash of its children's names for a block. A stretch of equal names
//! (a loop on one instruction) is cut into pairs (a triple last when it
//! is odd); a run of a period of two to four names, into whole periods
//! starting at the period's least name. Elsewhere adjacent names differ, and
//! deterministic coin tossing (Cole & Vishkin) turns them into labels
//! below 6, then 3, that still differ from their neighbours: a label is
//! twice the lowest bit at which a name differs from its left
//! neighbour's, plus that bit of the name, repeated four times. A block
//! starts at each label that is a local maximum (2 to 4 positions
//! apart), and at each stretch's start; a block of one is joined to the
//! block before it.
//!
//! Terminals are `u32` ids below the number of names given; symbols from
//! there up to [`RULE_BIT`] are separators (the end of an independent
//! sequence: a burst, a thread), never inside a block. Rules are
//! `RULE_BIT | id`; rule 0 is the start rule, the top level of every
//! sequence with the separators between them.

use rustc_hash::FxHashMap;

/// Symbols at or above this are rules (`RULE_BIT | rule`).
pub(crate) const RULE_BIT: u32 = 1 << 31;

/// Levels at most: blocks are at least two symbols (a stretch of one
/// between two runs aside), so 40 levels reach any length.
const MAX_LEVELS: usize = 40;

/// The longest period of a run cut into whole periods (see
/// [`block_starts`]).
const MAX_PERIOD: usize = 4;

/// The grammar of `seq`: each rule's right-hand side, by rule id, the
/// start rule (0) first; a rule's sub-rules have lower ids than it (the
/// start rule's aside). `names[t]`: terminal `t`'s name (see the module's
/// documentation); symbols of `seq` at or above `names.len()` are
/// separators.
pub(crate) fn rules(seq: &[u32], names: &[u64]) -> Vec<Vec<u32>> {
    let mut rules = Rules::default();
    rules.rhs.push(Vec::new());
    let mut top = Vec::with_capacity(seq.len() / 4);
    let mut start = 0;
    while start < seq.len() {
        let end = seq[start..]
            .iter()
            .position(|&s| s as usize >= names.len())
            .map_or(seq.len(), |p| start + p);
        if end > start {
            let names: Vec<u64> = seq[start..end].iter().map(|&t| names[t as usize]).collect();
            top.extend(rules.parse(seq[start..end].to_vec(), names));
        }
        if end < seq.len() {
            top.push(seq[end]);
        }
        start = end + 1;
    }
    rules.rhs[0] = top;
    rules.rhs
}

#[derive(Default)]
struct Rules {
    /// Right-hand sides, by rule id.
    rhs: Vec<Vec<u32>>,
    /// Content hash of a right-hand side → the rules with it (collisions
    /// chain through `next`).
    index: FxHashMap<u64, u32>,
    next: Vec<u32>,
}

impl Rules {
    /// The rule whose right-hand side is `body` (made if new).
    fn rule(&mut self, body: &[u32]) -> u32 {
        let key = mix_all(body.iter().map(|&s| u64::from(s)));
        let mut r = self.index.get(&key).copied();
        while let Some(id) = r {
            if self.rhs[id as usize] == body {
                return id;
            }
            r = Some(self.next[id as usize]).filter(|&n| n != 0);
        }
        let id = self.rhs.len() as u32;
        self.rhs.push(body.to_vec());
        self.next.resize(self.rhs.len(), 0);
        if let Some(first) = self.index.insert(key, id) {
            self.next[id as usize] = first;
        }
        id
    }

    /// One independent sequence, level by level up to its top: the
    /// top-level symbols (one, unless the level cap is reached).
    fn parse(&mut self, mut syms: Vec<u32>, mut names: Vec<u64>) -> Vec<u32> {
        let mut starts = Vec::new();
        for _ in 0..MAX_LEVELS {
            if syms.len() < 2 {
                break;
            }
            starts.clear();
            block_starts(&names, &mut starts);
            starts.push(syms.len());
            let (mut up, mut up_names) = (Vec::new(), Vec::new());
            for w in starts.windows(2) {
                let (a, b) = (w[0], w[1]);
                if b - a == 1 {
                    up.push(syms[a]);
                    up_names.push(names[a]);
                } else {
                    up.push(RULE_BIT | self.rule(&syms[a..b]));
                    up_names.push(mix_all(names[a..b].iter().copied()));
                }
            }
            if up.len() == syms.len() {
                break;
            }
            syms = up;
            names = up_names;
        }
        syms
    }
}

/// Where the blocks of one level start (ascending, the first at 0), from
/// the names of its symbols.
fn block_starts(names: &[u64], out: &mut Vec<usize>) {
    let n = names.len();
    let mut labels: Vec<u64> = Vec::new();
    let mut i = 0;
    while i < n {
        // A run of one name: pairs, a triple last if it is odd. A run of
        // a short period (a loop of two to four references, a list walked
        // by two loads a node, or a longer loop's round at a higher
        // level): blocks of one period, the remainder joined to the last,
        // each starting at the period's least name, whatever the run
        // started with (a burst may start anywhere in a round), the
        // symbols before that a block of their own.
        if let Some((p, j)) = periodic_run(names, i) {
            let b = if p == 1 { 2 } else { p };
            let o = (0..p).min_by_key(|&k| names[i + k]).unwrap_or(0);
            if o > 0 {
                out.push(i);
            }
            let from = i + o;
            out.extend((0..((j - from) / b).max(1)).map(|k| from + k * b));
            i = j;
            continue;
        }
        // A stretch where neighbours differ, up to the next run.
        let mut e = i + 1;
        while e < n && periodic_run(names, e).is_none() {
            e += 1;
        }
        labels.clear();
        labels.extend_from_slice(&names[i..e]);
        let valid = coin_toss(&mut labels);
        let first = out.len();
        out.push(i);
        for t in valid..labels.len() {
            let left = (t > valid).then(|| labels[t - 1]);
            let right = labels.get(t + 1).copied();
            if left.is_none_or(|l| labels[t] > l) && right.is_none_or(|r| labels[t] > r) {
                out.push(i + t);
            }
        }
        // No block of one: a start too close to the last is dropped, and
        // the stretch's last block joins the one before when it is one.
        let mut kept = first;
        for k in first..out.len() {
            if k == first || out[k] - out[kept - 1] >= 2 {
                out[kept] = out[k];
                kept += 1;
            }
        }
        out.truncate(kept);
        if kept - first > 1 && e - out[kept - 1] < 2 {
            out.pop();
        }
        i = e;
    }
}

/// The periodic run starting at `i`, if any: its period (the shortest
/// of 1 to [`MAX_PERIOD`] that repeats at least twice from `i`) and
/// where it ends (the first position that breaks the period).
fn periodic_run(names: &[u64], i: usize) -> Option<(usize, usize)> {
    let n = names.len();
    let p =
        (1..=MAX_PERIOD).find(|&p| i + 2 * p <= n && names[i..i + p] == names[i + p..i + 2 * p])?;
    let mut j = i + 2 * p;
    while j < n && names[j] == names[j - p] {
        j += 1;
    }
    Some((p, j))
}

/// Deterministic coin tossing over `labels` (neighbours differ): each
/// label from position `valid` on becomes one below 3 that still differs
/// from its neighbours. Returns `valid` (the first positions have no
/// left neighbour to toss against, one more each round).
fn coin_toss(labels: &mut [u64]) -> usize {
    let mut valid = 1;
    for round in 0..4 {
        if labels.len() <= valid || (round > 0 && labels[valid..].iter().all(|&l| l < 6)) {
            break;
        }
        for t in (valid..labels.len()).rev() {
            let d = labels[t] ^ labels[t - 1];
            let low = if d == 0 { 0 } else { d.trailing_zeros() };
            labels[t] = 2 * u64::from(low) + ((labels[t] >> low) & 1);
        }
        valid += 1;
    }
    // 3, 4, 5 → the least of 0, 1, 2 that neither neighbour has.
    for c in 3..6 {
        for t in valid..labels.len() {
            if labels[t] == c {
                let left = (t > valid).then(|| labels[t - 1]);
                let right = labels.get(t + 1).copied();
                labels[t] = (0..3)
                    .find(|&x| Some(x) != left && Some(x) != right)
                    .unwrap_or(0);
            }
        }
    }
    valid
}

/// A 64-bit hash of a sequence of words (stable across runs and hosts).
pub(crate) fn mix_all(words: impl Iterator<Item = u64>) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for w in words {
        x = (x ^ w).wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 29;
    }
    x
}

/// Appends the terminals rule `r` derives (from [`rules`], by rule) to
/// `out`.
pub(crate) fn expand(rules: &[Vec<u32>], r: u32, out: &mut Vec<u32>) {
    for &s in &rules[r as usize] {
        if s & RULE_BIT != 0 {
            expand(rules, s & !RULE_BIT, out);
        } else {
            out.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// References of one instruction, none repeated: every rule is used
    /// once (nothing repeats, however alike the names), and the start
    /// rule derives the sequence.
    #[test]
    fn nothing_repeated_no_rule_used_twice() {
        let seq: Vec<u32> = (0..200).collect();
        let names = vec![7u64; 200];
        let r = rules(&seq, &names);
        let mut uses: FxHashMap<u32, u32> = FxHashMap::default();
        for rhs in &r {
            for &s in rhs {
                if s & RULE_BIT != 0 {
                    *uses.entry(s & !RULE_BIT).or_default() += 1;
                }
            }
        }
        let mut out = Vec::new();
        expand(&r, 0, &mut out);
        assert_eq!(out, seq);
        assert!(uses.values().all(|&u| u == 1), "{r:?}");
    }
}
