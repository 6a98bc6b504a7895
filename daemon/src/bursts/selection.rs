//! Which of the service's configured targets are traced in bursts: the
//! processes the scanner wants traced ([`crate::service::targets::Scanner::bursty`]),
//! at most `max_traced` at a time (the others are sampled only), each
//! attached once, released when it exits or stops being wanted, and an
//! executable whose attach failed retried with backoff, its failure
//! logged once.
//!
//! Pure bookkeeping, no I/O but the clock passed in: the session asks
//! [`Selection::plan`] once a second (after the rescan) and reports
//! every attach's outcome.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use burstyd_common::addr::Pid;

/// The first retry of an executable whose attach failed; doubled at
/// each further failure up to [`MAX_BACKOFF`].
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_secs(10);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(600);

/// Where a selected process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Sent to the attach thread.
    Attaching,
    /// Attached and armed.
    Traced,
    /// Released while its attach was under way: detach it as soon as the
    /// attach reports.
    Cancelled,
}

/// An executable's failed attaches.
#[derive(Debug, Clone)]
struct Backoff {
    failures: u32,
    retry_at: Instant,
    reason: String,
}

/// What to do now.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Attach to these (in this order).
    pub(crate) attach: Vec<Pid>,
    /// Stop tracing these (exited, no longer selected, or bursts turned
    /// off for them): disarm and detach.
    pub(crate) release: Vec<Pid>,
}

/// What an attach's failure deserves in the log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Report {
    /// The first failure of this executable (or a new reason): a warning
    /// with the reason and when it is retried.
    Warn { retry_in: Duration },
    /// Known already: debug level only.
    Quiet,
}

/// The bookkeeping.
#[derive(Debug)]
pub(crate) struct Selection {
    max: usize,
    processes: BTreeMap<Pid, (State, Option<PathBuf>)>,
    failed: HashMap<PathBuf, Backoff>,
    /// Pids already told they are sampled only (once each).
    told_full: BTreeSet<Pid>,
}

impl Selection {
    pub(crate) fn new(max: usize) -> Self {
        Selection {
            max: max.max(1),
            processes: BTreeMap::new(),
            failed: HashMap::new(),
            told_full: BTreeSet::new(),
        }
    }

    /// A reload's `max_traced` (processes traced beyond it stay until they
    /// exit).
    pub(crate) fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
    }

    #[cfg(test)]
    pub(crate) fn state(&self, pid: Pid) -> Option<State> {
        self.processes.get(&pid).map(|p| p.0)
    }

    /// Processes attached or being attached.
    pub(crate) fn traced(&self) -> impl Iterator<Item = Pid> + '_ {
        self.processes
            .iter()
            .filter(|(_, (s, _))| *s != State::Cancelled)
            .map(|(&p, _)| p)
    }

    /// `wanted`: the pids the configuration selects for bursts now;
    /// `exe(pid)`: its executable (`/proc/PID/exe`, the backoff's key).
    /// Returns the pids to release (traced, not wanted) and those to
    /// attach (wanted, not traced, not backing off, within the bound; in
    /// pid order). Also returns, once per pid, those left sampled only
    /// because the bound is reached (`full`).
    pub(crate) fn plan(
        &mut self,
        wanted: &BTreeSet<Pid>,
        mut exe: impl FnMut(Pid) -> Option<PathBuf>,
        now: Instant,
        full: &mut Vec<Pid>,
    ) -> Plan {
        let mut plan = Plan::default();
        for (&pid, (state, _)) in self.processes.iter_mut() {
            if wanted.contains(&pid) || *state == State::Cancelled {
                continue;
            }
            plan.release.push(pid);
            // An attach under way reports later: then it is detached.
            if *state == State::Attaching {
                *state = State::Cancelled;
            }
        }
        let released = &plan.release;
        self.processes
            .retain(|pid, (s, _)| *s != State::Traced || !released.contains(pid));
        self.told_full.retain(|p| wanted.contains(p));
        let mut busy = self.traced().count();
        for &pid in wanted {
            if self.processes.contains_key(&pid) {
                continue;
            }
            let path = exe(pid);
            if let Some(b) = path.as_ref().and_then(|p| self.failed.get(p))
                && now < b.retry_at
            {
                continue;
            }
            if busy >= self.max {
                if self.told_full.insert(pid) {
                    full.push(pid);
                }
                continue;
            }
            busy += 1;
            self.told_full.remove(&pid);
            self.processes.insert(pid, (State::Attaching, path));
            plan.attach.push(pid);
        }
        plan
    }

    /// `pid` exec'd: whatever it was (traced, being attached), it is
    /// forgotten, and the next plan attaches to its new program if the
    /// configuration wants it (an attach under way that reports later is
    /// detached, as one released).
    pub(crate) fn exec_seen(&mut self, pid: Pid) {
        self.processes.remove(&pid);
        self.told_full.remove(&pid);
    }

    /// `pid`'s attach succeeded. Returns false when it was released
    /// meanwhile (cancelled, or unknown): the caller detaches it at once.
    pub(crate) fn attached(&mut self, pid: Pid) -> bool {
        match self.processes.get_mut(&pid) {
            Some((s @ State::Attaching, exe)) => {
                *s = State::Traced;
                if let Some(e) = exe {
                    self.failed.remove(e);
                }
                true
            }
            Some((State::Cancelled, _)) => {
                self.processes.remove(&pid);
                false
            }
            _ => false,
        }
    }

    /// `pid`'s attach failed with `reason`: its executable backs off
    /// (every process of it is sampled only until the retry). Returns
    /// how to log it.
    pub(crate) fn failed(&mut self, pid: Pid, reason: &str, now: Instant) -> Report {
        let Some((_, exe)) = self.processes.remove(&pid) else {
            return Report::Quiet;
        };
        // Without its executable (it exited): nothing to back off.
        let Some(exe) = exe else {
            return Report::Quiet;
        };
        let b = self.failed.entry(exe).or_insert(Backoff {
            failures: 0,
            retry_at: now,
            reason: String::new(),
        });
        b.failures += 1;
        let delay = FIRST_BACKOFF
            .saturating_mul(1 << (b.failures - 1).min(16))
            .min(MAX_BACKOFF);
        b.retry_at = now + delay;
        let new_reason = b.reason != reason;
        b.reason = reason.to_owned();
        if b.failures == 1 || new_reason {
            Report::Warn { retry_in: delay }
        } else {
            Report::Quiet
        }
    }

    /// How many executables are backing off after a failed attach.
    pub(crate) fn backing_off(&self) -> usize {
        self.failed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(p: &[u32]) -> BTreeSet<Pid> {
        p.iter().map(|&p| Pid(p)).collect()
    }

    fn exe(pid: Pid) -> Option<PathBuf> {
        // Two programs: even pids run /a, odd ones /b.
        Some(PathBuf::from(if pid.0.is_multiple_of(2) {
            "/a"
        } else {
            "/b"
        }))
    }

    #[test]
    fn attaches_within_the_bound_and_releases_what_goes() {
        let t0 = Instant::now();
        let mut s = Selection::new(2);
        let mut full = Vec::new();
        let p = s.plan(&set(&[10, 11, 12]), exe, t0, &mut full);
        assert_eq!(p.attach, [Pid(10), Pid(11)]);
        assert!(p.release.is_empty());
        assert_eq!(full, [Pid(12)]);
        // Told once.
        full.clear();
        let p = s.plan(&set(&[10, 11, 12]), exe, t0, &mut full);
        assert_eq!(p, Plan::default());
        assert!(full.is_empty());
        assert!(s.attached(Pid(10)));
        // 11 exits while attaching: released (cancelled); its late attach
        // must be detached, and 12 takes its place.
        let p = s.plan(&set(&[10, 12]), exe, t0, &mut full);
        assert_eq!(p.release, [Pid(11)]);
        assert_eq!(s.state(Pid(11)), Some(State::Cancelled));
        assert_eq!(p.attach, [Pid(12)]);
        assert!(!s.attached(Pid(11)));
        assert_eq!(s.state(Pid(11)), None);
        // 10 no longer selected: released, forgotten.
        let p = s.plan(&set(&[12]), exe, t0, &mut full);
        assert_eq!(p.release, [Pid(10)]);
        assert_eq!(s.state(Pid(10)), None);
        assert_eq!(s.traced().collect::<Vec<_>>(), [Pid(12)]);
    }

    #[test]
    fn a_failing_executable_backs_off_and_is_reported_once() {
        let t0 = Instant::now();
        let mut s = Selection::new(8);
        let mut full = Vec::new();
        assert_eq!(s.plan(&set(&[2]), exe, t0, &mut full).attach, [Pid(2)]);
        assert_eq!(
            s.failed(Pid(2), "no room", t0),
            Report::Warn {
                retry_in: FIRST_BACKOFF
            }
        );
        // Neither the same pid nor another process of /a before the
        // retry; /b is not held back.
        let p = s.plan(
            &set(&[2, 4, 5]),
            exe,
            t0 + Duration::from_secs(1),
            &mut full,
        );
        assert_eq!(p.attach, [Pid(5)]);
        let t1 = t0 + FIRST_BACKOFF;
        let p = s.plan(&set(&[2, 4, 5]), exe, t1, &mut full);
        assert_eq!(p.attach, [Pid(2), Pid(4)]);
        // The same reason again: quiet, and twice as long.
        assert_eq!(s.failed(Pid(2), "no room", t1), Report::Quiet);
        assert_eq!(s.failed(Pid(4), "no room", t1), Report::Quiet);
        let p = s.plan(&set(&[2, 4, 5]), exe, t1 + FIRST_BACKOFF * 3, &mut full);
        assert!(p.attach.is_empty(), "{p:?}");
        let t2 = t1 + FIRST_BACKOFF * 4;
        let p = s.plan(&set(&[2, 4, 5]), exe, t2, &mut full);
        assert_eq!(p.attach, [Pid(2), Pid(4)]);
        // A new reason is worth a warning; success clears the backoff.
        assert!(matches!(s.failed(Pid(2), "other", t2), Report::Warn { .. }));
        assert!(s.attached(Pid(4)));
        assert_eq!(s.backing_off(), 0);
        // Never beyond the cap.
        let mut s = Selection::new(1);
        let mut t = t0;
        let mut last = Duration::ZERO;
        for _ in 0..30 {
            let p = s.plan(&set(&[2]), exe, t, &mut full);
            assert_eq!(p.attach, [Pid(2)]);
            s.failed(Pid(2), "x", t);
            last = s.failed.get(&PathBuf::from("/a")).unwrap().retry_at - t;
            t += last;
        }
        assert_eq!(last, MAX_BACKOFF);
    }
}
