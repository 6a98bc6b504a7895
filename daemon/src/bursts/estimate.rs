//! What each burst's path counts are worth, and how sure the estimate is.
//!
//! A burst is a window of the thread's execution: it starts at a
//! time-uniform point (a counter overflow) and lasts `--burst` checks.
//! An execution of a path is recorded when a burst started in the window
//! of the checks before it, so its chance of being recorded is the
//! *original* time of that window (`λ·L(e)`): where checks are dense in
//! time the window is short, and the path is under-counted relative to
//! code where they are sparse. Horvitz-Thompson weighs each burst by the
//! inverse of that chance, `1 / L`; every estimate here is a sum over
//! bursts of `weight × count` ([`Estimates::finish`]).
//!
//! What `L` is cannot be read inside a burst: the burst runs the
//! instrumented clones, and their time is not the original's (measured
//! in ARCHITECTURE.md, "Estimates from bursts": a 2-cycle loop takes 20
//! times its original time per check in the clones, a 65-cycle one 1.3
//! times), and nothing else observed measures it. [`Weighting::StaticCost`]
//! takes it from a static model of the code where the burst started;
//! [`Weighting::Uniform`] (the default) counts every burst alike, as the
//! model sees no cache miss.
//!
//! Confidence: bursts are the independent draws, so the variance of a
//! path's share of all executions comes from the burst-to-burst spread of
//! what each burst counted of it (the ratio estimator's linearisation,
//! Cochran 6.3): with `x_b` the burst's weighted count of the path, `X_b`
//! of all paths, `R = Σx/ΣX`, `var R ≈ Σ(x_b − R·X_b)² / (ΣX)²`. Three
//! sums per path and two in all are kept as bursts end, so the interval is
//! there at any time, for any number of bursts.
use rustc_hash::FxHashMap;

/// How a burst is weighted (`--weights`, `[bursts] weights`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Weighting {
    /// Every burst counts alike: right where checks are about as dense in
    /// time everywhere, and where time goes to memory stalls the static
    /// model cannot see (interpreters, collectors; see ARCHITECTURE.md,
    /// "Estimates from bursts").
    #[default]
    Uniform,
    /// By the inverse of the original time between two checks where the
    /// burst started (the exact weight), as the static cost of the paths
    /// there says (each block's steady-state throughput): right for
    /// compute-bound code whose checks are dense in one place and sparse
    /// in another. A burst whose start's cost is not known weighs the
    /// mean of those that are.
    #[value(name = "static")]
    #[serde(rename = "static")]
    StaticCost,
}

/// [`Weighting::StaticCost`]'s scale: a burst whose paths average this many
/// quarter cycles weighs 1 (keeps estimates near the recorded counts).
const COST_SCALE: f64 = 40.0;

/// The sums one path's confidence interval needs (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
struct Moments {
    /// Σ x_b.
    x: f64,
    /// Σ x_b².
    xx: f64,
    /// Σ x_b·X_b.
    x_all: f64,
}

/// The bursts' weights and the sums behind the intervals of one process.
#[derive(Default)]
pub(crate) struct Estimates {
    weighting: Weighting,
    /// Per (fid, path).
    moments: FxHashMap<(u32, u64), Moments>,
    /// Σ X_b and Σ X_b².
    all: f64,
    all_sq: f64,
    /// Bursts that ended with at least one complete path.
    pub(crate) bursts: u64,
    /// Σ of the weights of the bursts weighed by their paths' cost, and
    /// how many (their mean weighs the others).
    weights: f64,
    weighed: u64,
    /// Σ of the bursts' lengths in time-stamp-counter ticks (END records
    /// that carry them: not those ended after the fact), and how many.
    pub(crate) ticks: u64,
    pub(crate) timed: u64,
    /// [`Self::finish`]'s buffer, kept between bursts.
    per: FxHashMap<(u32, u64), f64>,
}

/// A path's share of all executions, with its 95% interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Share {
    pub(crate) share: f64,
    /// Half-width of the 95% interval, as a fraction of `share`.
    pub(crate) relative_ci95: f64,
}

impl Estimates {
    /// The weight of a burst that counted `paths` complete paths (`cost`:
    /// the original code's static cost where it started, when known).
    fn weight(&self, paths: u64, cost: Option<u64>) -> f64 {
        match (self.weighting, cost) {
            (Weighting::Uniform, _) => 1.0,
            (Weighting::StaticCost, Some(c)) if c > 0 && paths > 0 => COST_SCALE / c as f64,
            _ if self.weighed > 0 => self.weights / self.weighed as f64,
            _ => 1.0,
        }
    }

    /// Whether the weights need the paths' static costs (learning them
    /// reads each function's CFG: not for nothing).
    pub(crate) fn uses_costs(&self) -> bool {
        self.weighting != Weighting::Uniform
    }

    /// Weighs bursts with `w` from now on.
    pub(crate) fn set_weighting(&mut self, w: Weighting) {
        self.weighting = w;
    }

    /// A burst ended having counted `paths` complete paths, as
    /// `occurrences`: `(fid, path)` and what its executions stand for
    /// within the burst (their number times their span weight,
    /// [`super::counts::span_weight`]; a path may come more than once);
    /// `ticks` long if known, `cost` the static cost (quarter cycles) of
    /// the original code between two checks where it started, if known
    /// ([`super::counts::PathCounts`]'s `start_cost`). Returns the burst's
    /// weight (an occurrence's estimate is the burst's weight times its
    /// own).
    pub(crate) fn finish(
        &mut self,
        occurrences: &[((u32, u64), f64)],
        paths: u64,
        ticks: Option<u64>,
        cost: Option<u64>,
    ) -> f64 {
        if let Some(t) = ticks {
            self.ticks += t;
            self.timed += 1;
        }
        let w = self.weight(paths, cost);
        if cost.is_some_and(|c| c > 0) && !occurrences.is_empty() {
            self.weights += w;
            self.weighed += 1;
        }
        if occurrences.is_empty() {
            return w;
        }
        // Per (fid, path), in a map kept between bursts (cleared, not
        // built anew).
        let mut per = std::mem::take(&mut self.per);
        per.clear();
        for (k, o) in occurrences {
            *per.entry(*k).or_default() += o;
        }
        let all = w * per.values().sum::<f64>();
        for (&k, &n) in &per {
            let x = w * n;
            let m = self.moments.entry(k).or_default();
            m.x += x;
            m.xx += x * x;
            m.x_all += x * all;
        }
        self.per = per;
        self.all += all;
        self.all_sq += all * all;
        self.bursts += 1;
        w
    }

    /// Path `(fid, path)`'s share of all executions counted in bursts and
    /// its interval; `None` before any burst counted it.
    pub(crate) fn share(&self, fid: u32, path: u64) -> Option<Share> {
        let m = self.moments.get(&(fid, path))?;
        if self.all <= 0.0 || m.x <= 0.0 {
            return None;
        }
        let r = m.x / self.all;
        let var =
            ((m.xx - 2.0 * r * m.x_all + r * r * self.all_sq) / (self.all * self.all)).max(0.0);
        Some(Share {
            share: r,
            relative_ci95: 1.96 * var.sqrt() / r,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path counted alike in every burst has no spread: a zero-width
    /// interval around its exact share.
    #[test]
    fn the_same_share_in_every_burst_is_certain() {
        let mut e = Estimates::default();
        for _ in 0..10 {
            e.finish(
                &[((1, 0), 1.0), ((1, 0), 1.0), ((1, 1), 1.0), ((2, 5), 1.0)],
                4,
                Some(100),
                None,
            );
        }
        let s = e.share(1, 0).unwrap();
        assert!((s.share - 0.5).abs() < 1e-12, "{s:?}");
        assert!(s.relative_ci95 < 1e-6, "{s:?}");
        assert_eq!((e.bursts, e.ticks, e.timed), (10, 1000, 10));
        assert_eq!(e.share(3, 0), None);
    }

    /// Weighted by static cost, a burst that started in cheap code weighs
    /// more than one that started in costly code by their cost ratio, and
    /// a burst whose start's cost is not known weighs the mean so far.
    #[test]
    fn static_cost_weighs_by_the_inverse_cost_at_the_start() {
        let mut e = Estimates::default();
        e.set_weighting(Weighting::StaticCost);
        let cheap = e.finish(&[((1, 0), 1.0); 10], 10, None, Some(8));
        let costly = e.finish(&[((2, 0), 1.0); 10], 10, None, Some(160));
        assert!((cheap / costly - 20.0).abs() < 1e-9, "{cheap} {costly}");
        assert!((cheap - COST_SCALE / 8.0).abs() < 1e-9);
        let unknown = e.finish(&[((3, 0), 1.0); 10], 10, None, None);
        assert!((unknown - (cheap + costly) / 2.0).abs() < 1e-9);
        // Dense and sparse in equal numbers of bursts: shares 20 : 1.
        let d = e.share(1, 0).unwrap().share;
        let s = e.share(2, 0).unwrap().share;
        assert!((d / s - 20.0).abs() < 1e-9);
    }

    /// Bursts that disagree give an interval that shrinks as 1/√bursts,
    /// around the pooled share; for a path in half the bursts (all of
    /// each), the share is 1/2 and the standard error √(1/4n)/… as
    /// binomial sampling of bursts says.
    #[test]
    fn the_interval_is_the_burst_to_burst_spread() {
        let run = |n: usize| {
            let mut e = Estimates::default();
            for i in 0..n {
                let k = if i % 2 == 0 { (1, 0) } else { (2, 0) };
                e.finish(&[(k, 1.0); 10], 10, None, None);
            }
            e.share(1, 0).unwrap()
        };
        let (a, b) = (run(100), run(400));
        assert!((a.share - 0.5).abs() < 1e-12 && (b.share - 0.5).abs() < 1e-12);
        // var R = Σ (x_b - R X_b)² / (ΣX)² = n·(5)²/(10n)² = 1/(4n):
        // half-width 1.96·√(1/4n), relative to 0.5.
        let want = |n: f64| 1.96 * (1.0 / (4.0 * n)).sqrt() / 0.5;
        assert!((a.relative_ci95 - want(100.0)).abs() < 1e-9, "{a:?}");
        assert!((b.relative_ci95 - want(400.0)).abs() < 1e-9, "{b:?}");
        assert!((a.relative_ci95 / b.relative_ci95 - 2.0).abs() < 1e-9);
    }
}
