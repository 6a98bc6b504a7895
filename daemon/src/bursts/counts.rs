//! The consumers of [`BurstEvent`]s: path counts per calling context
//! within a burst ([`PathCounts`]), and the raw trace (`--save-bursts`,
//! [`TraceFile`]).
use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;

use tracing::warn;

use super::contexts::{Contexts, FrameKey, ROOT, UNKNOWN};
use super::decode::{BurstEvent, EndReason};
use super::estimate::{Estimates, Share};
use burstyd_common::burst::MAX_SLOTS;

/// Deepest chain of entered functions a burst's context records; deeper
/// entries count in the context at this depth.
const MAX_CONTEXT_DEPTH: usize = 64;

/// Most (context, function, path) entries kept: a new one beyond counts
/// as dropped.
pub(crate) const MAX_ENTRIES: usize = 1 << 19;

/// What one (context, function, path) counted.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Tally {
    /// Complete executions recorded.
    pub(crate) executions: u64,
    /// The executions they stand for: each burst's count times its
    /// weight ([`super::estimate`]), added when the burst ends (a full
    /// trace: as recorded, weight 1).
    pub(crate) estimate: f64,
    /// Measured cost (time-stamp counter ticks) summed over the
    /// executions that have one.
    pub(crate) cost: u64,
    /// Executions with a measured cost.
    pub(crate) measured: u64,
}

/// A counted entry: (thread id, context node, fid, path).
pub(crate) type Key = (u32, u32, u32, u64);
/// Tallies by key (the Fx hash: a burst's records look one up each).
pub(crate) type Tallies = rustc_hash::FxHashMap<Key, Tally>;

/// Path counts the exporters read: all of a process's, or one
/// interval's, on its calling context tree.
pub(crate) struct PathView<'a> {
    entries: std::borrow::Cow<'a, Tallies>,
    contexts: &'a Contexts,
    names: &'a HashMap<u32, String>,
    estimates: &'a Estimates,
    /// See [`PathCounts::min_cost`] (the process's, over all intervals).
    pub(crate) min_cost: Option<u64>,
}

impl PathView<'_> {
    /// `((thread, context, fid, path), tally)` in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Key, &Tally)> {
        self.entries.iter()
    }

    /// The calling contexts the counts refer to.
    pub(crate) fn contexts(&self) -> &Contexts {
        self.contexts
    }

    /// Thread `tid`'s name, if known.
    pub(crate) fn thread_name(&self, tid: u32) -> Option<&str> {
        self.names.get(&tid).map(String::as_str)
    }

    /// Path `(fid, path)`'s share of the process's executions and its
    /// confidence, over every burst so far (`None` in a full trace).
    pub(crate) fn share(&self, fid: u32, path: u64) -> Option<Share> {
        self.estimates.share(fid, path)
    }
}

/// `now - before`, entry by entry (what was counted between two
/// [`PathCounts::snapshot`]s); entries that did not move are left out.
pub(crate) fn delta(now: &Tallies, before: &Tallies) -> Tallies {
    now.iter()
        .filter_map(|(k, t)| {
            let b = before.get(k).copied().unwrap_or_default();
            (t.executions > b.executions || t.estimate > b.estimate).then(|| {
                (
                    *k,
                    Tally {
                        executions: t.executions - b.executions,
                        estimate: (t.estimate - b.estimate).max(0.0),
                        cost: t.cost.saturating_sub(b.cost),
                        measured: t.measured.saturating_sub(b.measured),
                    },
                )
            })
        })
        .collect()
}

fn add_tally(into: &mut Tally, t: &Tally) {
    into.executions += t.executions;
    into.estimate += t.estimate;
    into.cost += t.cost;
    into.measured += t.measured;
}

/// Where the last path counted went, for the COST record after it.
#[derive(Clone, Copy, Debug)]
enum Last {
    /// Into the tallies at once (a full trace).
    Counted(Key),
    /// Into the running burst's `pending`, at this index.
    Pending(usize),
}

/// A run of executions of one path in a running burst.
#[derive(Clone, Copy, Debug)]
struct Pending {
    key: Key,
    /// The path's span (see [`span_weight`]; `None`: not known).
    span: Option<u32>,
    /// Executions in the run.
    n: u32,
    /// Of which not in the tallies yet (an interval's end or a view
    /// takes them before the burst ends: [`PathCounts::flush_running`]),
    /// with their measured cost, and how many had one.
    uncounted: u32,
    cost: u64,
    measured: u32,
}

impl Pending {
    /// What the run adds to the tallies before its burst's weight.
    fn uncounted(&self) -> Tally {
        Tally {
            executions: u64::from(self.uncounted),
            estimate: 0.0,
            cost: self.cost,
            measured: u64::from(self.measured),
        }
    }
}

/// One burst slot's running burst, as its records tell it.
#[derive(Clone, Debug, Default)]
struct BurstState {
    /// Its thread (from its START record; 0 before one was seen).
    tid: u32,
    /// The burst's stack: the frames of its stack sample (outermost first,
    /// down to the function it started in), then the functions entered in
    /// it; each with its context node (the context including it).
    stack: Vec<(u32, u32)>,
    /// How many entries at the bottom of `stack` came from the stack
    /// sample (the rest from ENTER records, as the runtime's shadow stack).
    base: usize,
    /// The node above `stack[0]`: [`ROOT`] when the stack sample reached
    /// the thread's root, else [`UNKNOWN`].
    bottom: u32,
    /// The last path counted, for the COST record that may follow it.
    last: Option<Last>,
    /// The complete paths the running burst counted, in order, with
    /// their spans (see [`span_weight`]; `None`: not known), runs of the
    /// same (a loop going round) as one entry with their number: counted
    /// and weighted when it ends, one look-up in the tallies per run
    /// (not per record).
    pending: Vec<Pending>,
    /// Checks the burst passed so far: its ENTER and PATH records (every
    /// check is an entry, a back edge or the return site after a callee's
    /// path; a tail call's is the callee's entry).
    checks: u32,
    /// For each activation entered in the burst (as the runtime's shadow
    /// stack): where its current path started (its index in `checks`;
    /// `None` after an unwind landed in it).
    starts: Vec<Option<u32>>,
    /// The same for the activation below them (the one the burst began
    /// in, or one it returned to): known from its first back edge on.
    floor: Option<u32>,
}

impl BurstState {
    /// A new burst on `tid` (or none: its stack is gone).
    fn reset(&mut self, tid: u32) {
        self.tid = tid;
        self.stack.clear();
        self.base = 0;
        self.bottom = UNKNOWN;
        self.checks = 0;
        self.starts.clear();
        self.floor = None;
    }

    /// Where the innermost activation's current path started.
    fn path_start(&mut self) -> &mut Option<u32> {
        match self.starts.last_mut() {
            Some(s) => s,
            None => &mut self.floor,
        }
    }
}

/// How many of a burst's first complete paths may stand for its start
/// segment ([`PathCounts::start_cost`]).
const START_PATHS: usize = 8;

/// What one recorded execution of a path that spanned `span` checks (from
/// the check before its first block to the one that ended it, its callees'
/// included) stands for in a burst of `checks` checks. A burst starting at
/// any of the `checks - span` checks that leave the whole path inside it
/// records it: longer paths are caught by fewer bursts, and a path longer
/// than a burst by none. Weighing each by `checks / (checks - span)` undoes
/// that (in checks; the bursts' start in time is the estimator's other
/// half, see [`super::estimate`]).
pub(crate) fn span_weight(span: Option<u32>, checks: u32) -> f64 {
    match span {
        Some(s) if s < checks => f64::from(checks) / f64::from(checks - s),
        _ => 1.0,
    }
}

/// Executions of each Ball-Larus path per thread and calling context
/// within bursts. Counted per interval ([`Self::take_interval`] folds an
/// interval's into the totals).
#[derive(Default)]
pub(crate) struct PathCounts {
    /// Per fid: its number of paths; `None` where the function has no
    /// path numbering. Paths at or beyond it are bad.
    total_paths: Vec<Option<u64>>,
    /// Per fid: the fid of its family (the parts of one function in the
    /// compiler's sense share one); `u32::MAX` where no module has it.
    family: Vec<u32>,
    /// (thread id, context node, fid, path) → what was counted since
    /// the last [`Self::take_interval`].
    counts: Tallies,
    /// What earlier intervals counted.
    total: Tallies,
    /// The calling context tree the counts hang on.
    contexts: Contexts,
    /// Each burst slot's running burst (the records of one slot come in
    /// order from its own sub-ring; several slots' bursts run at once).
    bursts: [BurstState; MAX_SLOTS],
    /// The slot whose records [`Self::add`] and [`Self::begin`] take now
    /// ([`Self::select`]).
    cur: usize,
    /// Thread names by id (`/proc/PID/task/TID/comm` when its first burst
    /// was seen), for the `thread` label of the path profile.
    names: HashMap<u32, String>,
    /// Complete paths counted.
    pub(crate) paths: u64,
    /// Of which counted in a context that reaches the thread's root.
    pub(crate) rooted_paths: u64,
    /// Bursts that began with their stack sample, and without.
    pub(crate) joined: u64,
    pub(crate) unjoined: u64,
    /// New (context, function, path) entries dropped: [`MAX_ENTRIES`].
    pub(crate) dropped: u64,
    /// The cheapest path execution measured (time-stamp counter ticks):
    /// the instrumentation's own cost of a path, plus the cheapest path's.
    pub(crate) min_cost: Option<u64>,
    /// Paths whose start the burst did not see (not counted).
    pub(crate) partial_paths: u64,
    /// Records that made no sense: unknown tags, path numbers out of range.
    pub(crate) bad_records: u64,
    /// The bursts' weights and the estimates' confidence.
    pub(crate) estimates: Estimates,
    /// A full trace: every execution is recorded, each counts 1 at once.
    exact: bool,
    /// Each path's cost in the original code (quarter cycles;
    /// [`super::traced::Traced::path_cost`]), learnt as paths are first
    /// seen; `None`: not known.
    costs: rustc_hash::FxHashMap<(u32, u64), Option<u64>>,
    /// The checks of a burst whose paths are counted (`None`: all): a
    /// memory-mode burst that records references runs many times a
    /// path-mode burst's checks ([`super::options::REFS_BURST_CHECKS`]),
    /// and its paths past the path-mode length are left out, so that it
    /// counts as a path-mode burst does ([`Self::count_checks`]). The
    /// runtime writes no path records past them (the burst's
    /// `paths_until`), so this bound only guards against a runtime that
    /// does.
    path_checks: Option<u32>,
    /// [`Self::finish`]'s buffer, kept between bursts.
    occurrences: Vec<((u32, u64), f64)>,
}

impl PathCounts {
    /// Functions `fid_base..` of a module, with their numbers of paths and
    /// families.
    pub(crate) fn add_functions(
        &mut self,
        fid_base: u32,
        facts: impl IntoIterator<Item = (Option<u64>, u32)>,
    ) {
        let base = fid_base as usize;
        self.total_paths.resize(base, None);
        self.family.resize(base, u32::MAX);
        for (paths, family) in facts {
            self.total_paths.push(paths);
            self.family.push(family);
        }
    }

    /// Counts for one module whose function `i` has `total_paths[i]` paths
    /// and is its own family.
    #[cfg(test)]
    pub(crate) fn new(total_paths: Vec<Option<u64>>) -> Self {
        let mut c = PathCounts::default();
        c.add_functions(0, total_paths.into_iter().zip(0..));
        c
    }

    /// Whether `a` and `b` are parts of one function (a function and its
    /// `.cold` part run in one frame: the part returns from it).
    fn same_function(&self, a: u32, b: u32) -> bool {
        a == b || {
            let f = |x: u32| self.family.get(x as usize).copied();
            f(a).is_some() && f(a) == f(b)
        }
    }

    /// A burst began: its calling context is `base` (the frames of its
    /// stack sample, outermost first, down to the function it began in;
    /// `rooted`: unwound to the thread's root), or unknown (`None`: the
    /// sample was dropped, or the stack could not be read).
    pub(crate) fn begin(&mut self, base: Option<(&[FrameKey], bool)>) {
        let b = &mut self.bursts[self.cur];
        let tid = b.tid;
        b.reset(tid);
        let Some((frames, rooted)) = base else {
            self.unjoined += 1;
            return;
        };
        self.joined += 1;
        let b = &mut self.bursts[self.cur];
        b.bottom = if rooted { ROOT } else { UNKNOWN };
        let mut node = b.bottom;
        for &k in frames {
            let frame = self.contexts.frame(k);
            node = self.contexts.child(node, frame);
            b.stack.push((frame, node));
        }
        b.base = b.stack.len();
    }

    /// The records that follow are slot `slot`'s (its sub-ring's, in
    /// order).
    pub(crate) fn select(&mut self, slot: usize) {
        assert!(slot < MAX_SLOTS);
        self.cur = slot;
    }

    /// Thread `tid` is called `name` (the path profile's `thread` label).
    pub(crate) fn name_thread(&mut self, tid: u32, name: String) {
        self.names.insert(tid, name);
    }

    /// Whether thread `tid` has a name already.
    pub(crate) fn has_name(&self, tid: u32) -> bool {
        self.names.contains_key(&tid)
    }

    /// Takes one event of the ring, in order (a START's context comes
    /// with [`Self::begin`], right after).
    pub(crate) fn add(&mut self, ev: &BurstEvent) {
        let cur = self.cur;
        let last = self.bursts[cur].last.take();
        match *ev {
            BurstEvent::Start { tid, .. } => {
                // A burst whose END was lost ends here.
                self.finish(cur, None);
                self.bursts[cur].reset(tid);
            }
            BurstEvent::End { reason, ticks } => {
                // Ticks run past the real end of a burst ended after the
                // fact.
                let known = ticks > 0 && reason != EndReason::LeftUnseen;
                self.finish(cur, known.then_some(ticks));
                let tid = self.bursts[cur].tid;
                self.bursts[cur].reset(tid);
            }
            BurstEvent::Enter { fid } => {
                let b = &mut self.bursts[cur];
                b.starts.push(Some(b.checks));
                b.checks += 1;
                let past = self.past_counted(cur);
                let b = &mut self.bursts[cur];
                if b.stack.len() - b.base < MAX_CONTEXT_DEPTH {
                    // (No context is needed where no path counts.)
                    let node = if past {
                        UNKNOWN
                    } else {
                        let parent = b.stack.last().map_or(b.bottom, |e| e.1);
                        self.contexts.child(parent, fid)
                    };
                    b.stack.push((fid, node));
                }
            }
            BurstEvent::Path {
                fid,
                end,
                path,
                partial,
            } => {
                let here = {
                    let b = &mut self.bursts[cur];
                    let here = b.checks;
                    b.checks += 1;
                    here
                };
                let span = self.bursts[cur].path_start().map(|s| here - s);
                {
                    // The activation's next path starts here, or it is
                    // over (its caller's path goes on).
                    let b = &mut self.bursts[cur];
                    if end.leaves_function() {
                        if b.starts.pop().is_none() {
                            b.floor = None;
                        }
                    } else {
                        *b.path_start() = Some(here);
                    }
                }
                if partial {
                    self.partial_paths += 1;
                } else if self.past_counted(cur) {
                    // Left out (see `path_checks`).
                } else if self.valid_path(fid, path) {
                    self.paths += 1;
                    let b = &self.bursts[cur];
                    // Context: the frames below this function's.
                    let n = b.stack.len();
                    // (A `.cold` part's paths keep its parent in their
                    // context: they show under it.)
                    let ctx = match b.stack.last() {
                        Some(&(top, _)) if top == fid => {
                            n.checked_sub(2).map_or(b.bottom, |i| b.stack[i].1)
                        }
                        Some(&(_, node)) => node,
                        None => b.bottom,
                    };
                    if b.bottom == ROOT {
                        self.rooted_paths += 1;
                    }
                    let key = (b.tid, ctx, fid, path);
                    // (Look-ups only once the bound is reached.)
                    let full = self.counts.len() + self.total.len() >= MAX_ENTRIES
                        && !self.counts.contains_key(&key)
                        && !self.total.contains_key(&key);
                    if full {
                        self.dropped += 1;
                    } else if self.exact {
                        let t = self.counts.entry(key).or_default();
                        t.executions += 1;
                        t.estimate += 1.0;
                        self.bursts[cur].last = Some(Last::Counted(key));
                    } else {
                        let b = &mut self.bursts[cur];
                        match b.pending.last_mut() {
                            Some(p) if p.key == key && p.span == span => {
                                p.n += 1;
                                p.uncounted += 1;
                            }
                            _ => b.pending.push(Pending {
                                key,
                                span,
                                n: 1,
                                uncounted: 1,
                                cost: 0,
                                measured: 0,
                            }),
                        }
                        b.last = Some(Last::Pending(b.pending.len() - 1));
                    }
                } else {
                    self.bad_records += 1;
                }
                if end.leaves_function()
                    && self.bursts[cur]
                        .stack
                        .last()
                        .is_some_and(|e| self.same_function(e.0, fid))
                {
                    let b = &mut self.bursts[cur];
                    b.stack.pop();
                    // The burst returned above the frame it began in: the
                    // context left is still true.
                    b.base = b.base.min(b.stack.len());
                }
            }
            BurstEvent::Cost { ticks } => {
                let counted = match last {
                    Some(Last::Counted(k)) => self.counts.get_mut(&k).map(|t| {
                        t.cost += ticks;
                        t.measured += 1;
                    }),
                    Some(Last::Pending(i)) => self.bursts[cur].pending.get_mut(i).map(|p| {
                        p.cost += ticks;
                        p.measured += 1;
                    }),
                    None => None,
                };
                if counted.is_some() {
                    self.min_cost = Some(self.min_cost.map_or(ticks, |m| m.min(ticks)));
                }
            }
            // The runtime's shadow stack and the entered part of this one
            // grow and shrink together (one entry per ENTER, popped at
            // returns and tail calls), so its depth is how many entered
            // entries stay.
            BurstEvent::Unwind { depth } => {
                let keep = usize::try_from(depth).unwrap_or(usize::MAX);
                let b = &mut self.bursts[cur];
                b.stack.truncate(b.base.saturating_add(keep));
                // The frame it landed in goes on with a path whose start
                // the runtime did not see.
                b.starts.truncate(keep);
                *b.path_start() = None;
            }
            BurstEvent::Malformed { .. } => self.bad_records += 1,
            // Data references are the streams' (`super::data_refs`),
            // tuples the tuple profiles' (`super::tuples`).
            BurstEvent::Ref { .. } | BurstEvent::Tuple { .. } => {}
        }
    }

    /// Slot `slot`'s running burst was ended by the daemon (its thread had
    /// left the clones without a check): its stack is gone.
    pub(crate) fn burst_reaped(&mut self, slot: usize) {
        self.finish(slot, None);
        let tid = self.bursts[slot].tid;
        self.bursts[slot].reset(tid);
    }

    /// Slot `slot`'s burst is over (`ticks` long, when known): what it
    /// counted gets its weight.
    fn finish(&mut self, slot: usize, ticks: Option<u64>) {
        let mut pending = std::mem::take(&mut self.bursts[slot].pending);
        if pending.is_empty() && ticks.is_none() {
            self.bursts[slot].pending = pending;
            return;
        }
        // (Its length as far as paths counted.)
        let checks = self.bursts[slot]
            .checks
            .min(self.path_checks.unwrap_or(u32::MAX));
        let mut occurrences = std::mem::take(&mut self.occurrences);
        occurrences.clear();
        occurrences.extend(pending.iter().map(|p| {
            (
                (p.key.2, p.key.3),
                f64::from(p.n) * span_weight(p.span, checks),
            )
        }));
        let paths: u64 = pending.iter().map(|p| u64::from(p.n)).sum();
        // The original time per check where the burst started (see
        // `start_cost`), for the static weights.
        let cost = if self.estimates.uses_costs() {
            self.start_cost(&pending)
        } else {
            None
        };
        let w = self.estimates.finish(&occurrences, paths, ticks, cost);
        // One look-up per run (a loop going round is one).
        for (p, (_, o)) in pending.iter().zip(&occurrences) {
            let t = Tally {
                estimate: w * o,
                ..p.uncounted()
            };
            add_tally(self.counts.entry(p.key).or_default(), &t);
        }
        // The buffers are kept for the next burst.
        self.occurrences = occurrences;
        pending.clear();
        self.bursts[slot].pending = pending;
    }

    /// The static cost (quarter cycles) of the original code between two
    /// checks where a burst started: the exact weight of a burst is the
    /// inverse of its start segment's original time (ARCHITECTURE.md,
    /// "Estimates from bursts"), not of its whole window's, which would
    /// overweigh a burst that starts in slow code and runs into fast code
    /// (and the reverse). The start segment itself is partial in the
    /// records; the first complete path that spans one check (no call) among
    /// the burst's first [`START_PATHS`] stands for it (in a loop, the next
    /// round of the same); failing that, the mean cost per path of the whole
    /// burst. `None` while a needed path's cost is not known.
    fn start_cost(&self, pending: &[Pending]) -> Option<u64> {
        let cost = |k: &Key| self.costs.get(&(k.2, k.3)).copied().flatten();
        if let Some(p) = pending.iter().take(START_PATHS).find(|p| p.span == Some(1)) {
            return cost(&p.key);
        }
        let mut sum = 0;
        let mut paths = 0;
        for p in pending {
            sum += cost(&p.key)? * u64::from(p.n);
            paths += u64::from(p.n);
        }
        (paths > 0).then(|| sum.div_ceil(paths))
    }

    /// Every slot's running burst ends (the process is gone or detached).
    pub(crate) fn finish_running(&mut self) {
        for slot in 0..MAX_SLOTS {
            self.finish(slot, None);
        }
    }

    /// Whether path `(fid, path)`'s cost is still to be learnt.
    pub(crate) fn needs_cost(&self, fid: u32, path: u64) -> bool {
        !self.exact && self.estimates.uses_costs() && !self.costs.contains_key(&(fid, path))
    }

    /// Path `(fid, path)` costs `cost` in the original code.
    pub(crate) fn set_cost(&mut self, fid: u32, path: u64, cost: Option<u64>) {
        self.costs.insert((fid, path), cost);
    }

    /// Paths are counted in a burst's first `checks` checks only (see
    /// `path_checks`).
    pub(crate) fn count_checks(&mut self, checks: u64) {
        self.path_checks = Some(u32::try_from(checks).unwrap_or(u32::MAX));
    }

    /// Whether slot `cur`'s burst is past the checks whose paths count.
    fn past_counted(&self, cur: usize) -> bool {
        !self.exact
            && self
                .path_checks
                .is_some_and(|c| self.bursts[cur].checks > c)
    }

    /// Every burst records every execution (a full trace): counts are
    /// exact as they come, not weighted per burst.
    pub(crate) fn set_exact(&mut self) {
        self.exact = true;
    }

    fn valid_path(&self, fid: u32, path: u64) -> bool {
        self.total_paths
            .get(fid as usize)
            .copied()
            .flatten()
            .is_some_and(|n| path < n)
    }

    /// `((thread id, context, fid, path), tally)` in no particular order.
    /// Everything counted so far: the totals and this interval's.
    pub(crate) fn all(&self) -> PathView<'_> {
        let running = self.bursts.iter().any(|b| !b.pending.is_empty());
        let entries = if self.counts.is_empty() && !running {
            std::borrow::Cow::Borrowed(&self.total)
        } else {
            std::borrow::Cow::Owned(self.snapshot())
        };
        PathView {
            entries,
            contexts: &self.contexts,
            names: &self.names,
            estimates: &self.estimates,
            min_cost: self.min_cost,
        }
    }

    /// `entries` (an interval's, a window's) on this process's contexts.
    pub(crate) fn view(&self, entries: Tallies) -> PathView<'_> {
        PathView {
            entries: std::borrow::Cow::Owned(entries),
            contexts: &self.contexts,
            names: &self.names,
            estimates: &self.estimates,
            min_cost: self.min_cost,
        }
    }

    /// What was counted since the last call, which the totals now hold.
    pub(crate) fn take_interval(&mut self) -> Tallies {
        self.flush_running();
        let iv = std::mem::take(&mut self.counts);
        for (k, t) in &iv {
            add_tally(self.total.entry(*k).or_default(), t);
        }
        iv
    }

    /// Everything counted so far, as a copy (for [`delta`]).
    pub(crate) fn snapshot(&self) -> Tallies {
        let mut all = self.total.clone();
        for (k, t) in &self.counts {
            add_tally(all.entry(*k).or_default(), t);
        }
        for p in self.bursts.iter().flat_map(|b| &b.pending) {
            if p.uncounted > 0 || p.measured > 0 {
                add_tally(all.entry(p.key).or_default(), &p.uncounted());
            }
        }
        all
    }

    /// The running bursts' executions so far go into this interval's
    /// tallies (their weights come when they end).
    fn flush_running(&mut self) {
        for b in &mut self.bursts {
            for p in &mut b.pending {
                if p.uncounted > 0 || p.measured > 0 {
                    add_tally(self.counts.entry(p.key).or_default(), &p.uncounted());
                    p.uncounted = 0;
                    p.cost = 0;
                    p.measured = 0;
                }
            }
        }
    }

    /// The calling contexts the counts refer to.
    pub(crate) fn contexts(&self) -> &Contexts {
        &self.contexts
    }
}

/// `--save-bursts`: every event as a JSON line, as it arrives.
pub(crate) struct TraceFile(std::io::BufWriter<std::fs::File>);

impl TraceFile {
    /// Creates `path` (and its directory); `None`, with a warning, if it
    /// cannot.
    pub(crate) fn create(path: &Path) -> Option<Self> {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        crate::sys::create_output_file(path)
            .map_err(|e| warn!("cannot write {}: {e}", path.display()))
            .ok()
            .map(|f| TraceFile(std::io::BufWriter::new(f)))
    }

    /// Records one event (malformed records are left out).
    pub(crate) fn add(&mut self, ev: &BurstEvent) {
        if !matches!(ev, BurstEvent::Malformed { .. }) {
            let _ = writeln!(self.0, "{ev}");
        }
    }

    pub(crate) fn flush(&mut self) {
        let _ = self.0.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::{EndReason, PathEnd};
    use super::*;

    fn path(fid: u32, end: PathEnd, path: u64) -> BurstEvent {
        BurstEvent::Path {
            fid,
            end,
            path,
            partial: false,
        }
    }

    /// (context, fid, path, executions) over every thread.
    fn counted(c: &PathCounts) -> Vec<(Vec<u32>, u32, u64, u64)> {
        let mut m: std::collections::BTreeMap<(Vec<u32>, u32, u64), u64> = Default::default();
        for (&(_, ctx, fid, p), n) in c.all().iter() {
            *m.entry((c.contexts().fids(ctx), fid, p)).or_default() += n.executions;
        }
        m.into_iter().map(|((c, f, p), n)| (c, f, p, n)).collect()
    }

    #[test]
    fn paths_count_in_the_context_of_the_functions_entered_before() {
        // f0 has 4 paths, f1 has 2, f2 none.
        let mut c = PathCounts::new(vec![Some(4), Some(2), None]);
        for ev in [
            BurstEvent::Start {
                tid: 1,
                pc: 0,
                slot: 0,
                running: 1,
            },
            BurstEvent::Enter { fid: 0 },
            path(0, PathEnd::BackEdge, 3),
            BurstEvent::Enter { fid: 1 },
            path(1, PathEnd::Return, 1),
            path(0, PathEnd::BackEdge, 3),
            path(0, PathEnd::Return, 2),
            // After f0 returned: no context.
            path(1, PathEnd::BackEdge, 0),
            BurstEvent::End {
                reason: EndReason::Budget,
                ticks: 1000,
            },
        ] {
            c.add(&ev);
        }
        assert_eq!(
            counted(&c),
            [
                (vec![], 0, 2, 1),
                (vec![], 0, 3, 2),
                (vec![], 1, 0, 1),
                (vec![0], 1, 1, 1),
            ]
        );
        assert_eq!((c.paths, c.partial_paths, c.bad_records), (5, 0, 0));
    }

    #[test]
    fn a_cold_part_returns_from_its_parents_frame() {
        // f0 calls f1, whose part f2 (its `.cold` part) returns: f1's
        // activation ends there, and f0's next call of f1 is in f0's
        // context again. f2's path shows under f1.
        let mut c = PathCounts::default();
        c.add_functions(0, [(Some(2), 0), (Some(2), 1), (Some(2), 1)]);
        for ev in [
            BurstEvent::Enter { fid: 0 },
            BurstEvent::Enter { fid: 1 },
            path(1, PathEnd::NoReturn, 0), // the jump into f2
            path(2, PathEnd::Return, 1),
            BurstEvent::Enter { fid: 1 },
            path(1, PathEnd::Return, 1),
            path(0, PathEnd::Return, 1),
        ] {
            c.add(&ev);
        }
        assert_eq!(
            counted(&c),
            [
                (vec![], 0, 1, 1),
                (vec![0], 1, 0, 1),
                (vec![0], 1, 1, 1),
                (vec![0, 1], 2, 1, 1),
            ]
        );
    }

    #[test]
    fn an_exception_landing_up_the_stack_ends_the_activations_below() {
        // f0 → f1 → f2 throws; the handler is in f0 (shadow depth 1 left):
        // f0's next path and its call of f1 are in f0's context again.
        let mut c = PathCounts::new(vec![Some(2), Some(2), Some(2)]);
        for ev in [
            BurstEvent::Enter { fid: 0 },
            BurstEvent::Enter { fid: 1 },
            BurstEvent::Enter { fid: 2 },
            path(2, PathEnd::NoReturn, 0),
            BurstEvent::Unwind { depth: 1 },
            BurstEvent::Enter { fid: 1 },
            path(1, PathEnd::Return, 1),
            path(0, PathEnd::Return, 1),
        ] {
            c.add(&ev);
        }
        assert_eq!(
            counted(&c),
            [(vec![], 0, 1, 1), (vec![0], 1, 1, 1), (vec![0, 1], 2, 0, 1),]
        );
    }

    /// A burst that began with its stack sample: main → a → f (it began
    /// in f). f's paths are in the context main → a; g entered from f is
    /// under main → a → f; after f returned, a's paths are under main;
    /// every context reaches the root. An unwind keeps the sampled frames.
    #[test]
    fn a_burst_with_its_stack_sample_has_the_full_context() {
        // fids: 0 main, 1 a, 2 f, 3 g.
        let mut c = PathCounts::new(vec![Some(2), Some(2), Some(2), Some(2)]);
        let base = [
            FrameKey::Function(0),
            FrameKey::Function(1),
            FrameKey::Function(2),
        ];
        c.add(&BurstEvent::Start {
            tid: 1,
            pc: 0,
            slot: 0,
            running: 1,
        });
        c.begin(Some((&base, true)));
        for ev in [
            path(2, PathEnd::BackEdge, 0),
            BurstEvent::Enter { fid: 3 },
            path(3, PathEnd::Return, 1),
            path(2, PathEnd::Return, 1),
            path(1, PathEnd::BackEdge, 1),
        ] {
            c.add(&ev);
        }
        assert_eq!(
            counted(&c),
            [
                (vec![0], 1, 1, 1),
                (vec![0, 1], 2, 0, 1),
                (vec![0, 1], 2, 1, 1),
                (vec![0, 1, 2], 3, 1, 1),
            ]
        );
        assert_eq!(
            (c.paths, c.rooted_paths, c.joined, c.unjoined),
            (4, 4, 1, 0)
        );
        // Every context hangs under the root.
        for (&(_, ctx, _, _), _) in c.all().iter() {
            assert!(c.contexts().frames(ctx).1);
        }

        // Another burst, in a, without its sample: a's context is unknown;
        // an exception back into a (depth 0) keeps nothing entered.
        c.add(&BurstEvent::Start {
            tid: 1,
            pc: 0,
            slot: 0,
            running: 1,
        });
        c.begin(None);
        c.add(&BurstEvent::Enter { fid: 2 });
        c.add(&BurstEvent::Unwind { depth: 0 });
        c.add(&path(1, PathEnd::Return, 0));
        let (_, ctx, _, _) = *c.all().iter().find(|e| e.0.2 == 1 && e.0.3 == 0).unwrap().0;
        assert_eq!(c.contexts().frames(ctx), (vec![], false));
        assert_eq!((c.rooted_paths, c.joined, c.unjoined), (4, 1, 1));

        // With a sample again: an unwind to depth 0 keeps main → a.
        c.add(&BurstEvent::Start {
            tid: 1,
            pc: 0,
            slot: 0,
            running: 1,
        });
        c.begin(Some((&base[..2], true)));
        c.add(&BurstEvent::Enter { fid: 2 });
        c.add(&BurstEvent::Enter { fid: 3 });
        c.add(&BurstEvent::Unwind { depth: 0 });
        c.add(&BurstEvent::Enter { fid: 3 });
        c.add(&path(3, PathEnd::Return, 0));
        assert!(counted(&c).contains(&(vec![0, 1], 3, 0, 1)));
    }

    /// A COST record adds to the path counted just before it, and to
    /// nothing else (not after a partial path, not twice).
    #[test]
    fn costs_go_to_the_path_recorded_before() {
        let mut c = PathCounts::new(vec![Some(4)]);
        c.add(&path(0, PathEnd::BackEdge, 1));
        c.add(&BurstEvent::Cost { ticks: 100 });
        c.add(&BurstEvent::Cost { ticks: 7 });
        c.add(&path(0, PathEnd::BackEdge, 1));
        c.add(&BurstEvent::Cost { ticks: 50 });
        c.add(&BurstEvent::Path {
            fid: 0,
            end: PathEnd::BackEdge,
            path: 2,
            partial: true,
        });
        c.add(&BurstEvent::Cost { ticks: 1000 });
        c.add(&path(0, PathEnd::BackEdge, 3));
        let t: Vec<_> = {
            let mut v: Vec<_> = c.all().iter().map(|(k, t)| (k.3, *t)).collect();
            v.sort_by_key(|e| e.0);
            v
        };
        assert_eq!(c.min_cost, Some(50));
        assert_eq!(
            t,
            [
                (
                    1,
                    Tally {
                        executions: 2,
                        estimate: 0.0,
                        cost: 150,
                        measured: 2
                    }
                ),
                (
                    3,
                    Tally {
                        executions: 1,
                        estimate: 0.0,
                        cost: 0,
                        measured: 0
                    }
                ),
            ]
        );
    }

    fn start(tid: u32) -> BurstEvent {
        BurstEvent::Start {
            tid,
            pc: 0,
            slot: 0,
            running: 1,
        }
    }

    fn end(reason: EndReason, ticks: u64) -> BurstEvent {
        BurstEvent::End { reason, ticks }
    }

    /// (path, executions, estimate) over every thread and context.
    fn estimated(c: &PathCounts) -> Vec<(u64, u64, f64)> {
        let mut m: std::collections::BTreeMap<u64, (u64, f64)> = Default::default();
        for (k, t) in c.all().iter() {
            let e = m.entry(k.3).or_default();
            e.0 += t.executions;
            e.1 += t.estimate;
        }
        m.into_iter().map(|(p, (n, e))| (p, n, e)).collect()
    }

    /// A burst's paths count as recorded at once, and as estimated (times
    /// the burst's weight) when it ends: by its END, by the next START of
    /// its slot (its END was lost), or when the daemon reaps it. The
    /// burst-level sums give each path's share; the END's ticks its length
    /// (not those of a burst ended after the fact).
    #[test]
    fn a_bursts_paths_are_weighted_when_it_ends() {
        let mut c = PathCounts::new(vec![Some(4)]);
        c.add(&start(1));
        c.add(&path(0, PathEnd::BackEdge, 1));
        c.add(&path(0, PathEnd::BackEdge, 1));
        assert_eq!(estimated(&c), [(1, 2, 0.0)]);
        c.add(&path(0, PathEnd::BackEdge, 2));
        c.add(&end(EndReason::Budget, 700));
        // Three checks: the first path's span is not known (1), the
        // others span one check (3/2 each).
        assert_eq!(estimated(&c), [(1, 2, 2.5), (2, 1, 1.5)]);
        // Its END lost: the next START ends it.
        c.add(&start(1));
        c.add(&path(0, PathEnd::BackEdge, 2));
        c.add(&start(1));
        assert_eq!(estimated(&c), [(1, 2, 2.5), (2, 2, 2.5)]);
        // Ended after the fact: its ticks say nothing.
        c.add(&path(0, PathEnd::BackEdge, 3));
        c.add(&end(EndReason::LeftUnseen, 99_999));
        c.add(&start(1));
        c.add(&path(0, PathEnd::BackEdge, 3));
        c.burst_reaped(0);
        assert_eq!(estimated(&c), [(1, 2, 2.5), (2, 2, 2.5), (3, 2, 2.0)]);
        assert_eq!(
            (c.estimates.bursts, c.estimates.ticks, c.estimates.timed),
            (4, 700, 1)
        );
        let s = c.estimates.share(0, 1).unwrap();
        assert!((s.share - 2.5 / 7.0).abs() < 1e-12, "{s:?}");
        assert!(s.relative_ci95 > 0.0);
    }

    /// A path that spans more checks is caught whole by fewer bursts, and
    /// counts for more: f0's loop path (span 1) then its path around a
    /// call of f1 (whose ENTER and return are two more checks: span 3),
    /// in a burst of 6 checks. f1's own path (from its entry, span 1) and
    /// the first paths (partial) as usual.
    #[test]
    fn paths_spanning_more_checks_weigh_more() {
        let mut c = PathCounts::new(vec![Some(4), Some(2)]);
        for ev in [
            start(1),
            // The path the burst began in: partial; the next starts here.
            BurstEvent::Path {
                fid: 0,
                end: PathEnd::BackEdge,
                path: 0,
                partial: true,
            },
            path(0, PathEnd::BackEdge, 1),
            BurstEvent::Enter { fid: 1 },
            path(1, PathEnd::Return, 1),
            path(0, PathEnd::BackEdge, 2),
            // The burst's sixth check: an entry.
            BurstEvent::Enter { fid: 1 },
            end(EndReason::Budget, 100),
        ] {
            c.add(&ev);
        }
        assert_eq!(span_weight(Some(1), 6), 6.0 / 5.0);
        assert_eq!(span_weight(Some(3), 6), 2.0);
        assert_eq!(span_weight(Some(6), 6), 1.0);
        assert_eq!(span_weight(None, 6), 1.0);
        assert_eq!(estimated(&c), [(1, 2, 6.0 / 5.0 + 6.0 / 5.0), (2, 1, 2.0)]);
    }

    /// An interval that ends during a burst: the burst's weight goes to
    /// the interval it ends in, and the intervals still add up.
    #[test]
    fn a_burst_across_intervals_is_weighted_in_the_second() {
        let mut c = PathCounts::new(vec![Some(4)]);
        c.add(&start(1));
        c.add(&path(0, PathEnd::BackEdge, 1));
        let first = c.take_interval();
        c.add(&path(0, PathEnd::BackEdge, 1));
        c.add(&end(EndReason::Budget, 10));
        let second = c.take_interval();
        let sum = |m: &Tallies| {
            m.values()
                .fold((0, 0.0), |a, t| (a.0 + t.executions, a.1 + t.estimate))
        };
        // The second path spans one check of the burst's two: 2.
        assert_eq!((sum(&first), sum(&second)), ((1, 0.0), (1, 3.0)));
        assert_eq!(estimated(&c), [(1, 2, 3.0)]);
    }

    /// With paths counted in a burst's first 4 checks, a long burst (a
    /// memory-mode one) counts those of its first 4 checks, as a
    /// path-mode burst of 4 would, weighted as one: the 4th check's path
    /// counts, the 5th's and later do not, nor in a context; a burst of
    /// exactly 4 checks counts all its paths.
    #[test]
    fn a_long_burst_counts_the_paths_of_a_path_mode_burst() {
        let mut c = PathCounts::new(vec![Some(4), Some(2)]);
        c.count_checks(4);
        let nodes = c.contexts().len();
        c.add(&start(1));
        for p in [0, 1, 2, 3] {
            c.add(&path(0, PathEnd::BackEdge, p));
        }
        c.add(&BurstEvent::Enter { fid: 1 });
        c.add(&path(1, PathEnd::Return, 1));
        c.add(&path(0, PathEnd::BackEdge, 3));
        c.add(&end(EndReason::Budget, 100));
        // Spans unknown for the first, one check for the others: 4/3.
        let w = 4.0 / 3.0;
        assert_eq!(
            estimated(&c),
            [(0, 1, 1.0), (1, 1, w), (2, 1, w), (3, 1, w)]
        );
        assert_eq!(c.paths, 4);
        assert_eq!(
            c.contexts().len(),
            nodes,
            "no context entered past the checks"
        );
    }

    /// A full trace counts every execution as it comes (its one burst
    /// never ends).
    #[test]
    fn a_full_trace_is_exact_at_once() {
        let mut c = PathCounts::new(vec![Some(4)]);
        c.set_exact();
        c.add(&start(1));
        c.add(&path(0, PathEnd::BackEdge, 1));
        c.add(&path(0, PathEnd::BackEdge, 1));
        assert_eq!(estimated(&c), [(1, 2, 2.0)]);
        assert_eq!(c.estimates.bursts, 0);
    }

    /// Intervals partition the counts: each interval holds what was
    /// counted since the one before, and all of them add up to the total;
    /// a window is the difference of two snapshots.
    #[test]
    fn intervals_add_up_to_the_total() {
        let mut c = PathCounts::new(vec![Some(4)]);
        let execs = |m: &Tallies, p: u64| {
            m.iter()
                .filter(|(k, _)| k.3 == p)
                .map(|(_, t)| t.executions)
                .sum::<u64>()
        };
        c.add(&path(0, PathEnd::BackEdge, 1));
        c.add(&path(0, PathEnd::BackEdge, 1));
        let before = c.snapshot();
        let first = c.take_interval();
        assert_eq!(execs(&first, 1), 2);
        c.add(&path(0, PathEnd::BackEdge, 1));
        c.add(&path(0, PathEnd::BackEdge, 2));
        assert_eq!(counted(&c).iter().map(|e| e.3).sum::<u64>(), 4);
        let window = delta(&c.snapshot(), &before);
        assert_eq!((execs(&window, 1), execs(&window, 2)), (1, 1));
        let second = c.take_interval();
        assert_eq!((execs(&second, 1), execs(&second, 2)), (1, 1));
        assert!(c.take_interval().is_empty());
        let all = c.all();
        let total: u64 = all.iter().map(|(_, t)| t.executions).sum();
        assert_eq!(total, 4);
    }

    #[test]
    fn bad_and_partial_paths_are_not_counted() {
        let mut c = PathCounts::new(vec![Some(4), None]);
        c.add(&path(0, PathEnd::Return, 4)); // out of range
        c.add(&path(1, PathEnd::Return, 0)); // no numbering
        c.add(&path(7, PathEnd::Return, 0)); // no such function
        c.add(&BurstEvent::Path {
            fid: 0,
            end: PathEnd::Return,
            path: 1,
            partial: true,
        });
        c.add(&BurstEvent::Malformed { w0: 0, w1: 0 });
        assert!(counted(&c).is_empty());
        assert_eq!((c.paths, c.partial_paths, c.bad_records), (0, 1, 4));
    }

    #[test]
    fn a_new_burst_or_a_reaped_one_starts_without_context() {
        let mut c = PathCounts::new(vec![Some(1), Some(1)]);
        c.add(&BurstEvent::Enter { fid: 0 });
        c.add(&BurstEvent::Enter { fid: 1 });
        c.burst_reaped(0);
        c.add(&path(1, PathEnd::Return, 0));
        c.add(&BurstEvent::Enter { fid: 0 });
        c.add(&BurstEvent::Enter { fid: 1 });
        c.add(&BurstEvent::Start {
            tid: 2,
            pc: 0,
            slot: 0,
            running: 1,
        });
        c.add(&path(1, PathEnd::Return, 0));
        assert_eq!(counted(&c), [(vec![], 1, 0, 2)]);
    }

    /// Two slots' bursts interleaved across drains (each slot's records
    /// in order): each keeps its own stack and thread.
    #[test]
    fn slots_keep_their_own_bursts() {
        // fids: 0 main, 1 a, 2 f.
        let mut c = PathCounts::new(vec![Some(2), Some(2), Some(2)]);
        let start = |tid, slot| BurstEvent::Start {
            tid,
            pc: 0,
            slot,
            running: 2,
        };
        c.select(0);
        c.add(&start(10, 0));
        c.add(&BurstEvent::Enter { fid: 1 });
        c.select(1);
        c.add(&start(20, 1));
        c.add(&BurstEvent::Enter { fid: 2 });
        c.add(&BurstEvent::Enter { fid: 0 });
        c.select(0);
        c.add(&BurstEvent::Enter { fid: 2 });
        c.add(&path(2, PathEnd::Return, 1));
        c.select(1);
        c.add(&path(0, PathEnd::Return, 0));
        c.burst_reaped(0);
        c.select(0);
        c.add(&path(1, PathEnd::Return, 1));
        let mut got: Vec<_> = c
            .all()
            .iter()
            .map(|(&(tid, ctx, fid, p), n)| (tid, c.contexts().fids(ctx), fid, p, n.executions))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                (10, vec![], 1, 1, 1),
                (10, vec![1], 2, 1, 1),
                (20, vec![2], 0, 0, 1),
            ]
        );
    }
}
