//! The tuple profiles of one traced process (`--record values,targets`;
//! Sastry, Bodík & Smith, "Rapid Profiling via Stratified Sampling"):
//! the clones make a tuple ⟨load, value loaded⟩ (the value profile) or
//! ⟨indirect call or jump, target⟩ (the call-target profile) at each such
//! instruction in a burst, and the injected runtime's compressor (exact,
//! random R_r or stratified H[P_r]_n, then the associative table A_k that
//! merges identical outputs) writes what it keeps as `TUPLE` records. A
//! record stands for `count × weight` occurrences of its tuple: `count`
//! outputs merged, each standing for `weight` tuples (the sampling rate,
//! 1 with the exact sampler). With `TupleConfig::reference` the runtime
//! also writes every tuple once, flagged exact: the ideal profile of the
//! same stream, which [`profile_error`] measures the sampled one against
//! (the paper's section 5.3.1).
//!
//! With exact copies, [`Convergence`] follows how the sampled profile
//! converges to them as tuples arrive (the paper's error against tuples
//! delivered).
//!
//! A site is named as a data reference is (module and static address,
//! [`super::place`]), so that it means the same in every process and
//! every run. Memory is bounded: each site keeps [`MAX_VALUES`] distinct
//! values, chosen by space-saving (Metwally, Agrawal & El Abbadi: a new
//! value, with the site's table full, takes the place of the least
//! counted one and inherits its count as an error bound), so that every
//! value with more than `1 / MAX_VALUES` of its site's occurrences is
//! held whatever came first (a load that sees a thousand distinct
//! pointers before its invariant one still reports it). A value's count
//! is reported as the occurrences it is sure of (its count less that
//! error); the rest of the site's occurrences, which are exact, are its
//! "other values". At most [`MAX_SITES`] sites are held, and
//! [`MAX_ENTRIES`] values over all sites; a record of a site beyond them
//! is counted as dropped.
use std::collections::{BTreeMap, HashMap};

use burstyd_common::burst::TupleConfig;

use super::decode::{BurstEvent, TupleKind};
use super::place::Placer;
use super::traced::Traced;

/// Distinct values a site keeps at most (each 24 bytes). The paper's
/// error metric looks at values that hold 10% of their site or more:
/// space-saving with 32 counters holds every value above 3.1%.
pub(crate) const MAX_VALUES: usize = 32;
/// Sites a profile keeps at most.
pub(crate) const MAX_SITES: usize = 1 << 16;
/// Values a profile keeps over all its sites at most (12 MiB): once
/// reached, a site's table stays at the values it has (space-saving
/// within them).
pub(crate) const MAX_ENTRIES: usize = 1 << 19;

/// A site of a tuple profile: an instruction, named by its module (the
/// module's first `fid` in the process; any key unique to the module
/// where a profile is read back from a file) and static address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SiteKey {
    pub(crate) kind: TupleKind,
    pub(crate) module: u32,
    pub(crate) vaddr: u64,
}

/// One value of a site's space-saving table: its count, and the count
/// it inherited when it took another value's place (at most what it
/// overstates).
#[derive(Clone, Copy, Debug)]
struct Counter {
    value: u64,
    count: u64,
    err: u64,
}

/// A site's occurrences (exact) and its values' table.
#[derive(Clone, Debug, Default)]
struct Site {
    total: u64,
    counters: Vec<Counter>,
}

/// One stream's tuples (the sampled one, or the exact copies), per site.
#[derive(Default)]
pub(crate) struct TupleProfile {
    sites: HashMap<SiteKey, Site>,
    /// Values held over all sites.
    entries: usize,
    /// Records of sites beyond [`MAX_SITES`] or [`MAX_ENTRIES`].
    pub(crate) dropped: u64,
}

impl TupleProfile {
    /// Adds `n` occurrences of `value` at `site`; false when the site
    /// cannot be held (the record is counted as dropped).
    pub(crate) fn add(&mut self, site: SiteKey, value: u64, n: u64) -> bool {
        let full = self.sites.len() >= MAX_SITES || self.entries >= MAX_ENTRIES;
        let s = match self.sites.get_mut(&site) {
            Some(s) => s,
            None if full => {
                self.dropped += 1;
                return false;
            }
            None => self.sites.entry(site).or_default(),
        };
        s.total += n;
        if let Some(c) = s.counters.iter_mut().find(|c| c.value == value) {
            c.count += n;
        } else if s.counters.len() < MAX_VALUES && self.entries < MAX_ENTRIES {
            s.counters.push(Counter {
                value,
                count: n,
                err: 0,
            });
            self.entries += 1;
        } else if let Some(c) = s.counters.iter_mut().min_by_key(|c| c.count) {
            *c = Counter {
                value,
                count: c.count + n,
                err: c.count,
            };
        }
        true
    }

    /// No tuple was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }

    /// Some tuple of `kind` was added.
    pub(crate) fn has(&self, kind: TupleKind) -> bool {
        self.sites.keys().any(|k| k.kind == kind)
    }

    /// Each site's occurrences and the values it is sure of.
    pub(crate) fn summaries(&self) -> Summaries {
        self.sites
            .iter()
            .map(|(k, s)| {
                let mut values: Vec<(u64, u64)> = s
                    .counters
                    .iter()
                    .map(|c| (c.value, c.count - c.err))
                    .filter(|&(_, n)| n > 0)
                    .collect();
                values.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                (
                    *k,
                    SiteSummary {
                        total: s.total,
                        values,
                    },
                )
            })
            .collect()
    }
}

/// What a profile says of one site.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SiteSummary {
    /// Its occurrences (estimated from a sampled stream).
    pub(crate) total: u64,
    /// Its values and their occurrences, most frequent first (ties by
    /// value); the rest of `total` are other values.
    pub(crate) values: Vec<(u64, u64)>,
}

impl SiteSummary {
    /// The occurrences of values not listed.
    pub(crate) fn other(&self) -> u64 {
        self.total
            .saturating_sub(self.values.iter().map(|v| v.1).sum::<u64>())
    }

    /// `n` occurrences as a share of the site's (0 for a site never
    /// seen).
    pub(crate) fn share(&self, n: u64) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            n as f64 / self.total as f64
        }
    }

    /// The share of its most frequent value: how invariant the site is
    /// (1 for a load that always loads the same value).
    pub(crate) fn invariance(&self) -> f64 {
        self.share(self.values.first().map_or(0, |v| v.1))
    }

    /// The occurrences of `value` (0 when not listed).
    pub(crate) fn count_of(&self, value: u64) -> u64 {
        self.values.iter().find(|v| v.0 == value).map_or(0, |v| v.1)
    }
}

/// A tuple profile's sites, in order.
pub(crate) type Summaries = BTreeMap<SiteKey, SiteSummary>;

/// The tuple profiles of one traced process.
pub(crate) struct Tuples {
    /// The compressor's outputs, each standing for its count × weight.
    pub(crate) sampled: TupleProfile,
    /// The exact copies (an evaluation's reference), each one tuple.
    pub(crate) exact: TupleProfile,
    /// Tuple records read.
    pub(crate) records: u64,
    /// Records whose site lies in no traced function (none should), and
    /// those of a kind this daemon does not know.
    pub(crate) unplaced: u64,
    pub(crate) unknown: u64,
    /// The sampler's outputs read (each standing for `weight` tuples),
    /// the records that carried them, and the exact copies read.
    pub(crate) delivered: u64,
    pub(crate) messages: u64,
    pub(crate) exact_tuples: u64,
    /// The sampled profile's error against the exact copies as they came.
    pub(crate) convergence: Convergence,
    /// The tuples one output of the sampler stands for.
    weight: u64,
    placer: Placer<u32>,
}

impl Tuples {
    /// The profiles of a process whose runtime compresses as `config`
    /// says.
    pub(crate) fn new(config: &TupleConfig) -> Self {
        Tuples {
            sampled: TupleProfile::default(),
            exact: TupleProfile::default(),
            records: 0,
            unplaced: 0,
            unknown: 0,
            delivered: 0,
            messages: 0,
            exact_tuples: 0,
            convergence: Convergence::default(),
            weight: config.weight(),
            placer: Placer::default(),
        }
    }

    /// The compressor changed (a reload): records from now on are
    /// weighted by its rate.
    pub(crate) fn set_config(&mut self, config: &TupleConfig) {
        self.weight = config.weight();
    }

    /// Takes one event of the ring (only tuples matter).
    pub(crate) fn add(&mut self, ev: &BurstEvent, traced: &Traced) {
        let BurstEvent::Tuple {
            kind,
            site,
            value,
            count,
            exact,
        } = *ev
        else {
            return;
        };
        self.records += 1;
        if let TupleKind::Other(_) = kind {
            self.unknown += 1;
            return;
        }
        let Some((module, vaddr)) = self.placer.place(traced, site, |m| m.fid_base) else {
            self.unplaced += 1;
            return;
        };
        let key = SiteKey {
            kind,
            module,
            vaddr,
        };
        if exact {
            self.exact.add(key, value, u64::from(count));
            self.exact_tuples += u64::from(count);
        } else {
            self.sampled.add(key, value, u64::from(count) * self.weight);
            self.delivered += u64::from(count);
            self.messages += 1;
            self.after_sampled();
        }
    }

    /// A checkpoint of [`Convergence`] when the sampler's outputs reach
    /// the next one (only with exact copies to measure against).
    fn after_sampled(&mut self) {
        let next = self.convergence.next.max(Convergence::FIRST);
        if self.delivered >= next && self.exact_tuples > 0 {
            self.convergence.next = next.saturating_mul(2);
            self.checkpoint();
        }
    }

    /// The checkpoints of [`Convergence`], with one for now unless the
    /// last one is (none without exact copies).
    pub(crate) fn convergence(&self) -> Vec<Point> {
        let mut points = self.convergence.points.clone();
        if self.exact_tuples > 0 && points.last().map(|p| p.delivered) != Some(self.delivered) {
            points.push(self.point());
        }
        points
    }

    fn checkpoint(&mut self) {
        let p = self.point();
        self.convergence.points.push(p);
    }

    /// The sampled profile against the exact copies now.
    fn point(&self) -> Point {
        let (sampled, exact) = (self.sampled.summaries(), self.exact.summaries());
        let opts = ErrorOptions::default();
        Point {
            delivered: self.delivered,
            messages: self.messages,
            exact: self.exact_tuples,
            values: profile_error(&sampled, &exact, TupleKind::Value, &opts),
            targets: profile_error(&sampled, &exact, TupleKind::Target, &opts),
        }
    }

    /// Records read but in neither profile.
    pub(crate) fn dropped(&self) -> u64 {
        self.unplaced + self.unknown + self.sampled.dropped + self.exact.dropped
    }
}

/// How a sampled profile converges to its exact copies as tuples arrive
/// (`--sampler-reference`; the paper's figures of error against tuples
/// delivered): each time the sampler's outputs read so far double (from
/// [`Convergence::FIRST`]), and once at the end, the error of the
/// sampled profile so far against the exact copies so far.
#[derive(Debug, Default)]
pub(crate) struct Convergence {
    pub(crate) points: Vec<Point>,
    next: u64,
}

impl Convergence {
    /// The first checkpoint: outputs of the sampler read.
    pub(crate) const FIRST: u64 = 256;
}

/// One checkpoint of [`Convergence`].
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub(crate) struct Point {
    /// The sampler's outputs read (each standing for the sampling rate's
    /// tuples), and the records that carried them (fewer: the merging
    /// table's counts).
    pub(crate) delivered: u64,
    pub(crate) messages: u64,
    /// Exact copies read: the tuples the outputs stand for.
    pub(crate) exact: u64,
    pub(crate) values: ProfileError,
    pub(crate) targets: ProfileError,
}

/// Which tuples the error looks at (the paper's section 5.3.1: those a
/// value-reuse optimiser would use).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ErrorOptions {
    /// A site's executions in the reference, at least.
    pub(crate) min_exec: u64,
    /// A tuple's share of its site's executions, at least ("sufficiently
    /// invariant").
    pub(crate) min_share: f64,
    /// The share of a site's executions its sufficiently invariant tuples
    /// must hold together.
    pub(crate) min_covered: f64,
}

impl Default for ErrorOptions {
    /// The paper's: 1000 executions, 10%, 40%.
    fn default() -> Self {
        ErrorOptions {
            min_exec: 1000,
            min_share: 0.10,
            min_covered: 0.40,
        }
    }
}

/// A profile's error against its reference.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub(crate) struct ProfileError {
    /// Sites and tuples selected (see [`ErrorOptions`]).
    pub(crate) sites: usize,
    pub(crate) tuples: usize,
    /// The paper's error: the mean of `|I_ref(v) − I_prof(v)|` over the
    /// selected tuples, weighted by their executions in the reference
    /// (`I(v)`: the tuple's share of its site's executions; 0 where the
    /// profile has no such tuple or site). `None` when nothing was
    /// selected.
    pub(crate) error: Option<f64>,
    /// Sites with `min_exec` executions in the reference, and the same
    /// mean over all their tuples in the reference.
    pub(crate) total_sites: usize,
    pub(crate) total_error: Option<f64>,
}

/// The error of `profile` against `reference` (the exact profile of the
/// same stream) for the tuples of `kind` (section 5.3.1 of the paper;
/// see [`ProfileError`]).
pub(crate) fn profile_error(
    profile: &Summaries,
    reference: &Summaries,
    kind: TupleKind,
    opts: &ErrorOptions,
) -> ProfileError {
    let mut out = ProfileError::default();
    let empty = SiteSummary::default();
    // (Σ f(v)·e(v), Σ f(v)) over the selected tuples, and over all.
    let (mut sel, mut all) = ((0.0, 0.0), (0.0, 0.0));
    for (k, r) in reference.range(
        SiteKey {
            kind,
            module: 0,
            vaddr: 0,
        }..,
    ) {
        if k.kind != kind {
            break;
        }
        if r.total < opts.min_exec {
            continue;
        }
        let p = profile.get(k).unwrap_or(&empty);
        out.total_sites += 1;
        let invariant: Vec<(u64, u64)> = r
            .values
            .iter()
            .copied()
            .filter(|&(_, n)| r.share(n) >= opts.min_share)
            .collect();
        let covered = r.share(invariant.iter().map(|v| v.1).sum());
        let selected = covered >= opts.min_covered;
        if selected {
            out.sites += 1;
            out.tuples += invariant.len();
        }
        for &(v, n) in &r.values {
            let e = (r.share(n) - p.share(p.count_of(v))).abs();
            let f = n as f64;
            all.0 += f * e;
            all.1 += f;
            if selected && r.share(n) >= opts.min_share {
                sel.0 += f * e;
                sel.1 += f;
            }
        }
    }
    let mean = |(s, f): (f64, f64)| (f > 0.0).then(|| s / f);
    out.error = mean(sel);
    out.total_error = mean(all);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(vaddr: u64) -> SiteKey {
        SiteKey {
            kind: TupleKind::Value,
            module: 0,
            vaddr,
        }
    }

    /// A site's values add up; its share, invariance and other values
    /// follow from its total.
    #[test]
    fn a_site_sums_its_values() {
        let mut p = TupleProfile::default();
        for (v, n) in [(7, 30), (9, 10), (7, 30), (1, 20)] {
            assert!(p.add(key(0x10), v, n));
        }
        let s = &p.summaries()[&key(0x10)];
        assert_eq!(s.total, 90);
        assert_eq!(s.values, [(7, 60), (1, 20), (9, 10)]);
        assert_eq!(s.other(), 0);
        assert_eq!(s.invariance(), 60.0 / 90.0);
        assert_eq!(SiteSummary::default().invariance(), 0.0);
    }

    /// A site with more values than it keeps: a frequent value that comes
    /// after the table filled is still held (space-saving), with the
    /// occurrences it is sure of; the rest are "other values", and the
    /// total stays exact.
    #[test]
    fn a_frequent_value_after_many_rare_ones_is_kept() {
        let mut p = TupleProfile::default();
        for v in 0..(MAX_VALUES as u64 * 4) {
            p.add(key(0x10), 1000 + v, 1);
        }
        for _ in 0..500 {
            p.add(key(0x10), 42, 1);
        }
        let s = &p.summaries()[&key(0x10)];
        assert_eq!(s.total, MAX_VALUES as u64 * 4 + 500);
        assert_eq!(s.values[0].0, 42);
        // It took the place of a value counted at most a few times.
        assert!((497..=500).contains(&s.values[0].1), "{:?}", s.values[0]);
        assert!(s.values.len() <= MAX_VALUES);
        assert_eq!(
            s.other() + s.values.iter().map(|v| v.1).sum::<u64>(),
            s.total
        );
        assert!(s.other() >= MAX_VALUES as u64 * 3);
        assert_eq!(p.entries, MAX_VALUES);
    }

    /// Beyond the bound on sites, a new site's records are dropped and
    /// counted; the sites held go on counting.
    #[test]
    fn sites_beyond_the_bound_are_dropped() {
        let mut p = TupleProfile::default();
        for a in 0..MAX_SITES as u64 {
            assert!(p.add(key(a), 1, 1));
        }
        assert!(!p.add(key(u64::MAX), 1, 1));
        assert!(p.add(key(5), 1, 2));
        assert_eq!(p.dropped, 1);
        let s = p.summaries();
        assert_eq!(s.len(), MAX_SITES);
        assert_eq!(s[&key(5)].total, 3);
    }

    /// Records from the ring: the site placed in its module (static
    /// address), the sampled ones weighted by the rate, the exact copies
    /// one each apart; unknown kinds and sites outside the traced
    /// functions counted, not kept; other events ignored.
    #[test]
    fn records_are_weighted_and_placed() {
        let traced = super::super::traced::test_traced(&[
            ("/bin/prog", 0x5555_0000_0000, 0, &[("f", 0x1000, 0x100)]),
            (
                "/lib/libc.so.6",
                0x7f00_0000_0000,
                10,
                &[("g", 0x2000, 0x40)],
            ),
        ]);
        let config = TupleConfig {
            sampler: burstyd_common::burst::SAMPLER_STRATIFIED,
            rate: 64,
            strata: 2048,
            ..Default::default()
        };
        let mut t = Tuples::new(&config);
        let tuple = |kind, site, value, count, exact| BurstEvent::Tuple {
            kind,
            site,
            value,
            count,
            exact,
        };
        for ev in [
            tuple(TupleKind::Value, 0x5555_0000_1010, 5, 3, false),
            tuple(TupleKind::Value, 0x5555_0000_1010, 5, 100, true),
            tuple(
                TupleKind::Target,
                0x7f00_0000_2008,
                0x5555_0000_1000,
                1,
                false,
            ),
            tuple(TupleKind::Other(3), 0x5555_0000_1010, 5, 1, false),
            tuple(TupleKind::Value, 0x5555_0000_2000, 5, 1, false),
            BurstEvent::Enter { fid: 0 },
        ] {
            t.add(&ev, &traced);
        }
        assert_eq!(
            (t.records, t.unknown, t.unplaced, t.dropped()),
            (5, 1, 1, 2)
        );
        let sampled = t.sampled.summaries();
        assert_eq!(sampled[&key(0x1010)].values, [(5, 3 * 64)]);
        let target = SiteKey {
            kind: TupleKind::Target,
            module: 10,
            vaddr: 0x2008,
        };
        assert_eq!(sampled[&target].total, 64);
        assert_eq!(t.exact.summaries()[&key(0x1010)].values, [(5, 100)]);
        assert!(t.sampled.has(TupleKind::Target) && !t.exact.has(TupleKind::Target));
        assert!(t.exact.has(TupleKind::Value) && !t.exact.is_empty());
        // A reload to the exact sampler: one tuple an output from now on.
        t.set_config(&TupleConfig::default());
        t.add(
            &tuple(TupleKind::Value, 0x5555_0000_1010, 5, 2, false),
            &traced,
        );
        assert_eq!(t.sampled.summaries()[&key(0x1010)].total, 3 * 64 + 2);
    }

    /// The convergence checkpoints: none without exact copies; with
    /// them, each time the outputs double from 256 (the records' counts,
    /// not the records), then one for the end. A site of 4,000 exact
    /// executions, two values 3:1; the sampler (rate 4) delivers value
    /// 1 only until the 256th output (its share 1 against 0.75, value
    /// 2's 0 against 0.25: error 0.25), then both in proportion (none).
    #[test]
    fn the_error_is_followed_as_outputs_double() {
        let traced = super::super::traced::test_traced(&[(
            "/bin/prog",
            0x5555_0000_0000,
            0,
            &[("f", 0x1000, 0x100)],
        )]);
        let config = TupleConfig {
            sampler: burstyd_common::burst::SAMPLER_RANDOM,
            rate: 4,
            ..Default::default()
        };
        let mut t = Tuples::new(&config);
        let tuple = |value, count, exact| BurstEvent::Tuple {
            kind: TupleKind::Value,
            site: 0x5555_0000_1010,
            value,
            count,
            exact,
        };
        // No exact copies yet: nothing to measure against.
        t.add(&tuple(1, 300, false), &traced);
        assert!(t.convergence().is_empty());
        t.add(&tuple(1, 3000, true), &traced);
        t.add(&tuple(2, 1000, true), &traced);
        // 301 outputs: the first checkpoint (value 1 only).
        t.add(&tuple(1, 1, false), &traced);
        let first = t.convergence.points.clone();
        assert_eq!(first.len(), 1);
        assert_eq!(
            (first[0].delivered, first[0].messages, first[0].exact),
            (301, 2, 4000)
        );
        let e = first[0].values.error.unwrap();
        assert!(
            (e - (3000.0 * 0.25 + 1000.0 * 0.25) / 4000.0).abs() < 1e-9,
            "{e}"
        );
        assert_eq!(first[0].targets.error, None);
        // Outputs in proportion until 1200 (value 1: 301 + 599 = 900, 2: 300):
        // the checkpoint at 512 is on the way, the end one at 1200 exact.
        t.add(&tuple(2, 300, false), &traced);
        t.add(&tuple(1, 599, false), &traced);
        let points = t.convergence();
        let delivered: Vec<u64> = points.iter().map(|p| p.delivered).collect();
        assert_eq!(delivered, [301, 601, 1200]);
        assert!(points[2].values.error.unwrap() < 1e-9, "{points:?}");
        // Short of the next (2048): the end's point is made on demand.
        t.add(&tuple(1, 3, false), &traced);
        assert_eq!(t.convergence.points.len(), 3);
        let points = t.convergence();
        assert_eq!(points.last().map(|p| p.delivered), Some(1203));
    }

    /// A site made by hand: its values and its other values' count.
    type Made<'a> = (SiteKey, &'a [(u64, u64)], u64);

    fn summaries(sites: &[Made]) -> Summaries {
        sites
            .iter()
            .map(|&(k, values, other)| {
                (
                    k,
                    SiteSummary {
                        total: values.iter().map(|v| v.1).sum::<u64>() + other,
                        values: values.to_vec(),
                    },
                )
            })
            .collect()
    }

    /// The paper's error, by construction. The reference has four sites:
    /// A (2000 executions: value 1 holds 60%, value 2 30%, value 3 10%,
    /// all sufficiently invariant), B (1000: 20% one value, 80% spread
    /// below 10%: not 40% covered, not selected), C (999 executions: below
    /// `min_exec`) and a target site (another kind). The profile says A's
    /// values are 50%, 30%, 20%, misses B's and C's invariant value.
    /// Selected: A's three tuples, e = (1200·0.1 + 600·0 + 200·0.1) /
    /// 2000 = 0.07. Over all tuples of A and B (C below `min_exec`): A's
    /// sum 140 plus B's 200·0.2 = 40, over 2200 (B's "other" are no
    /// tuples): 180 / 2200.
    #[test]
    fn the_error_follows_the_paper() {
        let (a, b, c) = (key(0xa), key(0xb), key(0xc));
        let t = SiteKey {
            kind: TupleKind::Target,
            ..a
        };
        let reference = summaries(&[
            (a, &[(1, 1200), (2, 600), (3, 200)], 0),
            (b, &[(9, 200)], 800),
            (c, &[(4, 999)], 0),
            (t, &[(0x1000, 5000)], 0),
        ]);
        let profile = summaries(&[
            (a, &[(1, 500), (2, 300), (3, 200)], 0),
            (b, &[(8, 10)], 0),
            (t, &[(0x2000, 5000)], 0),
        ]);
        let e = profile_error(
            &profile,
            &reference,
            TupleKind::Value,
            &ErrorOptions::default(),
        );
        assert_eq!((e.sites, e.tuples, e.total_sites), (1, 3, 2));
        assert!((e.error.unwrap() - 0.07).abs() < 1e-12, "{e:?}");
        assert!(
            (e.total_error.unwrap() - 180.0 / 2200.0).abs() < 1e-12,
            "{e:?}"
        );
        // A profile equal to its reference has no error.
        let same = profile_error(
            &reference,
            &reference,
            TupleKind::Value,
            &Default::default(),
        );
        assert_eq!((same.error, same.total_error), (Some(0.0), Some(0.0)));
        // The targets: one site, its one tuple missed entirely.
        let targets = profile_error(&profile, &reference, TupleKind::Target, &Default::default());
        assert_eq!((targets.sites, targets.error), (1, Some(1.0)));
        // Nothing above min_exec: no error to speak of.
        let strict = ErrorOptions {
            min_exec: 1 << 40,
            ..Default::default()
        };
        let none = profile_error(&profile, &reference, TupleKind::Value, &strict);
        assert_eq!((none.sites, none.error, none.total_error), (0, None, None));
    }
}
