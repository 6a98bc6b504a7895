//! Hot data streams out of a grammar of references (Chilimbi, PLDI 2001,
//! as Hirzel & Chilimbi use it in section 5.2): a data stream is a rule's
//! expansion; its frequency is its number of non-overlapping occurrences
//! in the trace (the rule's uses, as the start rule derives them), its
//! heat `length × frequency`. Streams of `min_len..=max_len` references
//! that occur at least twice are candidates; the heat threshold is the
//! highest at which the hot streams together account for `coverage` of
//! the references (or every candidate, when they never do). A rule too
//! long to be a stream may still hold one: a run of references written
//! out in its right-hand side occurs as often as the rule, and is a
//! candidate too. A hot stream's occurrences inside a hotter, longer one
//! are that one's, not its own (Chilimbi's "cold uses"): nothing is
//! counted twice. The grammar is locally consistent ([`super::grammar`]):
//! a repeated stretch of references is the same rule wherever it occurs,
//! so a stream's frequency does not depend on where bursts began.
//! Streams with the same access signature (the ordered list of their
//! instructions) are one stream.
use rustc_hash::FxHashMap;

use super::grammar::{RULE_BIT, expand, rules as grammar};
use super::references::References;

/// What counts as a hot stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HotOptions {
    pub(crate) min_len: u64,
    pub(crate) max_len: u64,
    /// The share of the references the hot streams account for together.
    pub(crate) coverage: f64,
}

impl Default for HotOptions {
    fn default() -> Self {
        HotOptions {
            min_len: 10,
            max_len: 40,
            coverage: 0.9,
        }
    }
}

/// One hot data stream (all the rules with its signature).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Stream {
    /// Instruction ids ([`References::instrs`]), in order.
    pub(crate) signature: Vec<u32>,
    /// References its occurrences account for.
    pub(crate) heat: u64,
    /// Its non-overlapping occurrences.
    pub(crate) frequency: u64,
    /// The data addresses of one occurrence.
    pub(crate) example: Vec<u64>,
}

impl Stream {
    pub(crate) fn length(&self) -> usize {
        self.signature.len()
    }
}

/// The hot streams of `refs`, hottest first.
pub(crate) fn hot_streams(refs: &References, opts: &HotOptions) -> Vec<Stream> {
    let rules = grammar(&refs.seq, &refs.term_names());
    // Every rule before its sub-rules: the start rule, then the others
    // from the last made (sub-rules are made first).
    let order: Vec<u32> = std::iter::once(0)
        .chain((1..rules.len() as u32).rev())
        .collect();
    // Expanded length of every rule, sub-rules first.
    let mut length = vec![0u64; rules.len()];
    for &r in order.iter().rev() {
        length[r as usize] = rules[r as usize]
            .iter()
            .map(|&s| match s & RULE_BIT {
                0 => u64::from(refs.is_reference(s)),
                _ => length[(s & !RULE_BIT) as usize],
            })
            .sum();
    }
    let in_range = |l: u64| (opts.min_len..=opts.max_len).contains(&l);
    let candidate = |r: u32| r != 0 && in_range(length[r as usize]);
    // Upper bounds of the heats: the thresholds worth trying.
    let uses = cold_uses(&rules, &order, |_, _| false);
    let mut thresholds: Vec<u64> = order
        .iter()
        .filter(|&&r| candidate(r))
        .map(|&r| length[r as usize] * uses[r as usize])
        .filter(|&h| h > 0)
        .collect();
    thresholds.sort_unstable();
    thresholds.dedup();
    if thresholds.is_empty() {
        return Vec::new();
    }
    // The streams hot at threshold `h`, with their non-overlapping
    // occurrences, and the references they cover.
    let select = |h: u64| {
        // A stream repeats: once is no stream, however long.
        let hot = |r: u32, cold: u64| candidate(r) && cold >= 2 && length[r as usize] * cold >= h;
        let cold = cold_uses(&rules, &order, hot);
        let chosen: Vec<(u32, u64)> = order
            .iter()
            .filter(|&&r| hot(r, cold[r as usize]))
            .map(|&r| (r, cold[r as usize]))
            .collect();
        let covered: u64 = chosen.iter().map(|&(r, c)| length[r as usize] * c).sum();
        (chosen, covered)
    };
    let want = (opts.coverage * refs.count as f64).ceil() as u64;
    // Coverage only grows as the threshold falls (a stream that becomes
    // hot covers at least what it takes from its sub-streams): the highest
    // threshold that reaches it, by bisection; the lowest if none does.
    let (mut lo, mut hi) = (0usize, thresholds.len() - 1);
    if select(thresholds[0]).1 >= want {
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if select(thresholds[mid]).1 >= want {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
    }
    let (chosen, _) = select(thresholds[lo]);
    // The hot streams' references, and their frequencies.
    let hot: Vec<(Vec<u32>, u64)> = chosen
        .into_iter()
        .map(|(r, cold)| {
            let mut terms = Vec::new();
            expand(&rules, r, &mut terms);
            (terms, cold)
        })
        .collect();
    // One stream per signature.
    let mut by_sig: FxHashMap<Vec<u32>, Stream> = FxHashMap::default();
    for (terms, frequency) in hot {
        if frequency == 0 {
            continue;
        }
        let terms: Vec<(u32, u64)> = terms
            .into_iter()
            .filter(|&t| refs.is_reference(t))
            .map(|t| refs.terms[t as usize])
            .collect();
        let signature: Vec<u32> = terms.iter().map(|t| t.0).collect();
        let s = by_sig.entry(signature.clone()).or_insert_with(|| Stream {
            signature,
            heat: 0,
            frequency: 0,
            example: terms.iter().map(|t| t.1).collect(),
        });
        s.heat += terms.len() as u64 * frequency;
        s.frequency += frequency;
    }
    let mut out: Vec<Stream> = by_sig.into_values().collect();
    out.sort_by(|a, b| {
        b.heat
            .cmp(&a.heat)
            .then_with(|| a.signature.cmp(&b.signature))
    });
    out
}

/// How often each rule occurs in the derivation of the start rule outside
/// the occurrences of rules `hot(rule, its uses)` says are hot (those
/// take their sub-rules' occurrences): with `hot` never true, every use.
fn cold_uses(rules: &[Vec<u32>], order: &[u32], hot: impl Fn(u32, u64) -> bool) -> Vec<u64> {
    let mut cold = vec![0u64; rules.len()];
    cold[0] = 1;
    for &r in order {
        let c = cold[r as usize];
        if c == 0 || hot(r, c) {
            continue;
        }
        for &s in &rules[r as usize] {
            if s & RULE_BIT != 0 {
                cold[(s & !RULE_BIT) as usize] += c;
            }
        }
    }
    cold
}

/// What a stream's addresses do, from one occurrence: every instruction
/// touches one address each time (`Constant`), or each instruction's next
/// address is a fixed step from its last, seen at least twice (`Stride`,
/// the steps of the instructions in signature order), or neither
/// (`Irregular`: a pointer chase, a data-dependent order, or too few
/// repeats to tell).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    Constant,
    Stride(Vec<i64>),
    Irregular,
}

pub(crate) fn pattern(stream: &Stream) -> Pattern {
    let mut last: FxHashMap<u32, u64> = FxHashMap::default();
    // Per instruction: its step, and how often it was seen.
    let mut step: FxHashMap<u32, (i64, u32)> = FxHashMap::default();
    let mut order = Vec::new();
    let mut regular = true;
    for (&i, &a) in stream.signature.iter().zip(&stream.example) {
        if let Some(&p) = last.get(&i) {
            let d = a.wrapping_sub(p) as i64;
            match step.get_mut(&i) {
                Some((s, _)) if *s != d => regular = false,
                Some((_, n)) => *n += 1,
                None => {
                    step.insert(i, (d, 1));
                    order.push(i);
                }
            }
        }
        last.insert(i, a);
    }
    let steps: Vec<(i64, u32)> = order.iter().map(|i| step[i]).collect();
    if !regular || steps.is_empty() {
        Pattern::Irregular
    } else if steps.iter().all(|&(s, _)| s == 0) {
        Pattern::Constant
    } else if steps.iter().all(|&(_, n)| n >= 2) {
        // One step of an instruction is no stride yet.
        Pattern::Stride(steps.iter().map(|s| s.0).collect())
    } else {
        Pattern::Irregular
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::references::Instr;

    fn instr(vaddr: u64) -> Instr {
        Instr { module: 0, vaddr }
    }

    /// Two linked lists, walked in fixed orders, and noise between the
    /// walks: a hot one walked 40 times (12 nodes, two loads a node: 24
    /// references), a cold one 4 times (12 nodes, 24), and 2,000 noise
    /// references from one instruction at random addresses. The hot walk
    /// is one stream of 24 with 40 occurrences; the cold one, one of 24
    /// with 4; the heat shares are what was put in.
    #[test]
    fn known_streams_are_found_with_their_shares() {
        let mut refs = References::new();
        refs.module("/bin/fixture");
        let mut x = 12345u64;
        let mut noise = |refs: &mut References, n: usize| {
            for _ in 0..n {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                refs.push(instr(0x3000), 0x10_0000 + (x >> 40) % 100_000 * 8);
            }
        };
        let hot_nodes: Vec<u64> = (0..12)
            .map(|i| 0x5000_0000 + (i * 7919 % 12) * 64)
            .collect();
        let cold_nodes: Vec<u64> = (0..12)
            .map(|i| 0x6000_0000 + (i * 31 % 12) * 4096)
            .collect();
        let walk = |refs: &mut References, nodes: &[u64], base: u64| {
            for &n in nodes {
                refs.push(instr(base), n); // p->value
                refs.push(instr(base + 4), n + 8); // p = p->next
            }
        };
        for round in 0..40 {
            walk(&mut refs, &hot_nodes, 0x1000);
            noise(&mut refs, 45);
            if round % 10 == 0 {
                walk(&mut refs, &cold_nodes, 0x2000);
            }
            noise(&mut refs, 5);
        }
        let total = refs.count;
        assert_eq!(total, 40 * 24 + 4 * 24 + 40 * 50);
        let streams = hot_streams(
            &refs,
            &HotOptions {
                min_len: 10,
                max_len: 40,
                coverage: 0.9,
            },
        );
        let find = |base: u64| {
            streams
                .iter()
                .filter(|s| refs.instrs[s.signature[0] as usize].vaddr & !0xfff == base)
                .map(|s| (s.length(), s.heat, s.frequency))
                .collect::<Vec<_>>()
        };
        // The hot walk: its 960 references as streams of its instructions
        // (one signature of 24, or a few whose lengths add up), all of
        // them covered.
        let hot = find(0x1000);
        let hot_heat: u64 = hot.iter().map(|h| h.1).sum();
        assert!(
            hot_heat as f64 >= 0.95 * 960.0 && hot_heat <= 960,
            "hot walk: {hot:?} of {streams:?}"
        );
        // Within 5 points of share of the truth (960 / 3056 = 31.4%).
        let share = hot_heat as f64 / total as f64;
        assert!((share - 960.0 / total as f64).abs() < 0.05, "{share}");
        // The noise forms no stream (its addresses do not repeat).
        assert!(find(0x3000).is_empty(), "{streams:?}");
        // Every stream's example is a walk: the loads of one node are 8
        // bytes apart, the nodes in no fixed step.
        assert_eq!(pattern(&streams[0]), Pattern::Irregular);
    }

    #[test]
    fn patterns_of_addresses() {
        let s = |sig: Vec<u32>, ex: Vec<u64>| Stream {
            signature: sig,
            heat: 0,
            frequency: 0,
            example: ex,
        };
        assert_eq!(
            pattern(&s(vec![1, 2, 1, 2], vec![8, 16, 8, 16])),
            Pattern::Constant
        );
        assert_eq!(
            pattern(&s(vec![1, 2, 1, 2, 1, 2], vec![0, 100, 8, 104, 16, 108])),
            Pattern::Stride(vec![8, 4])
        );
        assert_eq!(
            pattern(&s(vec![1, 1, 1], vec![0, 64, 8])),
            Pattern::Irregular
        );
        // One step is no stride.
        assert_eq!(
            pattern(&s(vec![1, 2, 1], vec![0, 64, 8])),
            Pattern::Irregular
        );
    }

    /// Bursts start anywhere inside a hot loop of 24 references (24
    /// instructions, as a round of a long code path): 100 of them, each
    /// from a random place through 200 more rounds. The grammar's cuts are
    /// local, so every burst's rounds are parsed alike but for a few at
    /// its ends, whatever came before: the hottest stream is one round,
    /// and its frequency is nearly its number of non-overlapping
    /// occurrences in the references (counted here by a plain scan).
    /// (Sequitur's rules, before, depended on where the bursts it saw
    /// first began: 158 of 2,415 rounds.)
    #[test]
    fn a_loop_cut_by_burst_starts_keeps_its_occurrences() {
        let mut refs = References::new();
        let mut all: Vec<Option<(u64, u64)>> = Vec::new();
        let mut x = 7u64;
        for _ in 0..100 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let start = (x >> 33) % 24;
            for k in start..start + 24 * 200 {
                let r = (0x10 + k % 24 * 4, 0x5000 + k % 24 * 64);
                refs.push(instr(r.0), r.1);
                all.push(Some(r));
            }
            refs.end_sequence();
            all.push(None);
        }
        let streams = hot_streams(&refs, &HotOptions::default());
        let top = &streams[0];
        assert_eq!(top.length(), 24, "{streams:?}");
        let want: Vec<Option<(u64, u64)>> = top
            .signature
            .iter()
            .zip(&top.example)
            .map(|(&i, &a)| Some((refs.instrs[i as usize].vaddr, a)))
            .collect();
        let (mut n, mut i) = (0, 0);
        while i + want.len() <= all.len() {
            if all[i..i + want.len()] == want[..] {
                n += 1;
                i += want.len();
            } else {
                i += 1;
            }
        }
        assert!(
            top.frequency as f64 >= 0.95 * n as f64 && top.frequency <= n,
            "{} of {n}: {streams:?}",
            top.frequency
        );
        let heat: u64 = streams.iter().map(|s| s.heat).sum();
        assert!(
            heat as f64 >= 0.9 * refs.count as f64,
            "{heat} of {}: {streams:?}",
            refs.count
        );
    }

    /// Nothing repeats: no stream, and no failure.
    #[test]
    fn no_repeats_no_streams() {
        let mut refs = References::new();
        for i in 0..1000 {
            refs.push(instr(0x10), i * 8);
        }
        assert!(hot_streams(&refs, &HotOptions::default()).is_empty());
    }

    /// A stream never spans two sequences: the same walk split across
    /// sequences at the same place every time is found up to the split.
    #[test]
    fn streams_stop_at_sequence_ends() {
        let mut refs = References::new();
        for _ in 0..20 {
            for k in 0..30u64 {
                refs.push(instr(0x10 + k), 0x1000 + k * 8);
                if k == 14 {
                    refs.end_sequence();
                }
            }
            refs.end_sequence();
        }
        let streams = hot_streams(&refs, &HotOptions::default());
        assert!(!streams.is_empty());
        for s in &streams {
            let first = refs.instrs[s.signature[0] as usize].vaddr;
            let last = refs.instrs[*s.signature.last().unwrap() as usize].vaddr;
            assert!(
                (first >= 0x10 + 15) || (last <= 0x10 + 14),
                "a stream across the split: {first:#x}..{last:#x}"
            );
        }
    }

    /// A list walked 25 times, each time just before a hot walk (walked
    /// 800 times), with noise before it: the first walk is a stream of its
    /// own, found as often as it occurs, not lost inside a rule of both
    /// walks too long to be a stream.
    #[test]
    fn a_walk_always_followed_by_another_is_a_stream() {
        let mut refs = References::new();
        let mut x = 1u64;
        let walk = |refs: &mut References, base: u64, data: u64| {
            for n in 0..12u64 {
                refs.push(instr(base), data + n * 64);
                refs.push(instr(base + 4), data + n * 64 + 8);
            }
        };
        for r in 0..200 {
            for _ in 0..4 {
                walk(&mut refs, 0x10, 0x5000);
                for _ in 0..64 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    refs.push(instr(0x30), x >> 20);
                }
            }
            if r % 8 == 0 {
                walk(&mut refs, 0x20, 0x9000);
            }
        }
        let streams = hot_streams(&refs, &HotOptions::default());
        let by = |base: u64| {
            streams
                .iter()
                .find(|s| refs.instrs[s.signature[0] as usize].vaddr == base)
                .map(|s| (s.length(), s.frequency, s.heat))
        };
        assert_eq!(by(0x10), Some((24, 800, 800 * 24)), "{streams:?}");
        assert_eq!(by(0x20), Some((24, 25, 25 * 24)), "{streams:?}");
    }
}
