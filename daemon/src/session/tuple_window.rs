//! A `/debug/pprof/values?seconds=N` (or `targets`) request while it
//! collects, and what it (or an interval) starts from: each process's
//! tuple profiles then ([`TupleMark`]), which the profiles now less
//! ([`delta`]) are its tuples.
use std::collections::HashMap;

use burstyd_common::addr::Pid;

use crate::bursts::decode::TupleKind;
use crate::bursts::tuples::{Summaries, Tuples};

/// A `/debug/pprof/values?seconds=N` (`targets`) request being collected:
/// its kind, and each process's tuple profiles when it opened.
pub(super) struct TupleWindow {
    pub(super) kind: TupleKind,
    pub(super) start: std::time::SystemTime,
    pub(super) end: tokio::time::Instant,
    pub(super) before: HashMap<Pid, TupleMark>,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}

/// A process's tuple profiles at some moment, or what they gained since
/// another ([`delta`]): the sampled profile's sites and the exact
/// copies'.
#[derive(Clone, Default)]
pub(super) struct TupleMark {
    pub(super) sampled: Summaries,
    pub(super) exact: Summaries,
}

impl TupleMark {
    pub(super) fn of(t: &Tuples) -> Self {
        TupleMark {
            sampled: t.sampled.summaries(),
            exact: t.exact.summaries(),
        }
    }

    /// What it gained since `before` (`None`: everything).
    pub(super) fn since(&self, before: Option<&TupleMark>) -> TupleMark {
        match before {
            None => self.clone(),
            Some(b) => TupleMark {
                sampled: delta(&self.sampled, &b.sampled),
                exact: delta(&self.exact, &b.exact),
            },
        }
    }

    pub(super) fn has(&self, kind: TupleKind) -> bool {
        self.sampled
            .keys()
            .chain(self.exact.keys())
            .any(|k| k.kind == kind)
    }
}

/// The sites of `now` less those of `before` (the same profile earlier):
/// each site's occurrences since, exact; each value's, the occurrences it
/// is sure of now less those it was sure of then (a value the site's
/// bounded table took in since, or lost, counts among the other values
/// for what it cannot vouch for). Sites with nothing new are left out.
pub(super) fn delta(now: &Summaries, before: &Summaries) -> Summaries {
    now.iter()
        .filter_map(|(k, s)| {
            let b = before.get(k);
            let total = s.total - b.map_or(0, |b| b.total.min(s.total));
            if total == 0 {
                return None;
            }
            let mut values: Vec<(u64, u64)> = s
                .values
                .iter()
                .map(|&(v, n)| (v, n.saturating_sub(b.map_or(0, |b| b.count_of(v)))))
                .filter(|&(_, n)| n > 0)
                .collect();
            values.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            Some((*k, crate::bursts::tuples::SiteSummary { total, values }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bursts::tuples::{SiteKey, SiteSummary};

    fn site(vaddr: u64) -> SiteKey {
        SiteKey {
            kind: TupleKind::Value,
            module: 0,
            vaddr,
        }
    }

    fn summary(total: u64, values: &[(u64, u64)]) -> SiteSummary {
        SiteSummary {
            total,
            values: values.to_vec(),
        }
    }

    /// An interval's tuples: each site's occurrences since, its values'
    /// gains most frequent first (a value that no longer is among them,
    /// or lost count to the bound, gained nothing); a site new since is
    /// all it has, one with nothing new is left out.
    #[test]
    fn the_tuples_since_a_mark_are_the_profile_now_less_then() {
        let before: Summaries = [
            (site(0x10), summary(100, &[(7, 75), (42, 25)])),
            (site(0x20), summary(10, &[(1, 10)])),
            (site(0x30), summary(50, &[(5, 30), (6, 20)])),
        ]
        .into();
        let now: Summaries = [
            (site(0x10), summary(180, &[(7, 120), (42, 60)])),
            (site(0x20), summary(10, &[(1, 10)])),
            (site(0x30), summary(60, &[(6, 25), (9, 5)])),
            (site(0x40), summary(3, &[(2, 3)])),
        ]
        .into();
        let d = delta(&now, &before);
        assert_eq!(
            d,
            [
                (site(0x10), summary(80, &[(7, 45), (42, 35)])),
                (site(0x30), summary(10, &[(6, 5), (9, 5)])),
                (site(0x40), summary(3, &[(2, 3)])),
            ]
            .into()
        );
        assert_eq!(d[&site(0x30)].other(), 0);
        assert!(delta(&now, &now).is_empty());
    }
}
