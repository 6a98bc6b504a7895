//! A traced process's data references (memory mode, `--record refs`):
//! each burst's `REF` records, named by module and static address, go
//! into the process's [`References`] when the burst ends, so that no
//! stream spans two bursts. The drain reads one slot's sub-ring at a
//! time, and a burst's records may come in several drains, so each slot's
//! running burst collects its references apart until its END (or the
//! START of the next burst in the slot, when an END was lost). A long
//! burst (a full trace is one burst) goes into the grammar in chunks as
//! it runs; its sequence stays open while no other slot's chunk comes in
//! between (one that does closes it: a stream may be cut there, never
//! joined across bursts).
//!
//! The analysis costs some 0.3 µs a reference (interning, the grammar), and
//! a process in memory mode may write 200,000 a second at the default
//! burst and rate; to stay within its CPU budget the daemon analyses
//! whole bursts at up to [`ANALYSED_PER_SECOND`] references a second (a
//! token bucket, decided at each burst's START) and counts the others as
//! skipped. A burst is taken or skipped whole, by time, not by content,
//! so the streams' shares are those of all bursts in expectation. A full
//! trace (`--full-trace`, ground truth) skips nothing.
//!
//! Recording the references costs the target too (a runtime call each),
//! and the daemon reads every record, so memory mode does not record
//! what it would skip: the handler makes one burst in `refs_every`
//! record references (the others are path-mode bursts), and the daemon
//! sets `refs_every` once a second ([`DataRefs::refs_every`]) so that
//! the references recorded stay at or below [`ANALYSED_PER_SECOND`]. The bucket
//! stays as the bound while the rate adapts.
use std::io::Write as _;
use std::time::Instant;

use burstyd_common::burst::MAX_SLOTS;

use super::decode::{BurstEvent, EndReason};
use super::place::Placer;
use super::traced::Traced;
use crate::streams::recent::{RECENT_MAX, RecentRefs};
use crate::streams::references::{Instr, References};

/// References held per process at most: beyond it, bursts' references
/// are counted but not kept (a reference costs 4 bytes in the sequence,
/// some 30 more while the grammar is built, and its term if new).
pub(crate) const MAX_REFERENCES: u64 = 1 << 21;
/// The same for a full trace (`--full-trace`: ground truth, on a short
/// run).
pub(crate) const MAX_REFERENCES_FULL: u64 = 1 << 24;
/// A running burst's references held apart before a chunk of them goes
/// into the grammar.
const CHUNK: usize = 1 << 13;
/// References analysed a second at most (about 1% of a core), over
/// bursts: see the module doc.
pub(crate) const ANALYSED_PER_SECOND: f64 = 30_000.0;
/// The token bucket's depth: a second's worth, so a quiet spell does not
/// let a flood of bursts through after it.
const BUCKET: f64 = ANALYSED_PER_SECOND;
/// The fewest bursts that record references: one in this many.
const MAX_REFS_EVERY: u64 = 1 << 12;
/// `refs_every` at attach, before any rate is known (the first burst
/// records references all the same).
pub(crate) const FIRST_REFS_EVERY: u64 = 8;

/// The data references of one traced process.
pub(crate) struct DataRefs {
    /// The whole run's, up to its bound.
    pub(crate) refs: References,
    /// The newest, for interval files and HTTP windows.
    pub(crate) recent: RecentRefs,
    /// Per slot: the references of its running burst so far.
    pending: [Vec<(Instr, u64)>; MAX_SLOTS],
    /// References whose instruction lies in no traced function (none
    /// should), and those of bursts that came once [`MAX_REFERENCES`]
    /// were held.
    pub(crate) unplaced: u64,
    pub(crate) dropped: u64,
    /// References read.
    pub(crate) seen: u64,
    /// References of bursts skipped to stay within the analysis rate.
    pub(crate) skipped: u64,
    /// The bound on references held.
    max: u64,
    /// The analysis rate's token bucket (`None`: every burst is
    /// analysed): references it may take now, and when it was refilled.
    bucket: Option<(f64, Instant)>,
    /// Per slot: whether its running burst is analysed.
    taken: [bool; MAX_SLOTS],
    /// The target's `refs_every` now; the bursts started, and the count
    /// when the rate was last looked at, and when; whether it has been
    /// set once; the references a recording burst records at most
    /// (`--refs-burst`).
    every: u64,
    starts: u64,
    window: (u64, Instant),
    set_once: bool,
    refs_burst: u64,
    /// Module ids by the module's first function id (its own in the
    /// process), so that a reference does not hash its module's path.
    module_ids: Vec<(u64, u32)>,
    /// Places each reference's instruction (module id, static address).
    placer: Placer<u32>,
    /// The slot whose burst's sequence is open in the grammar (chunks
    /// pushed, no separator yet).
    open: Option<usize>,
    /// `--save-bursts`: every reference analysed, named, in the plain-text
    /// trace `hot-streams --from-trace` reads.
    save: Option<SavedRefs>,
    /// Per slot: whether its running burst recorded a reference.
    recording: [bool; MAX_SLOTS],
    /// Bursts that recorded references, and the time-stamp-counter ticks
    /// of those whose end said how long they ran (see `REC_END`): the
    /// time the program spent in them.
    pub(crate) bursts: u64,
    pub(crate) ticks: u64,
}

/// The references written out (`references-<pid>.txt`): one a line,
/// `<module path> <static vaddr hex> <data address hex>`, an empty line
/// after each sequence (a burst, or a piece of one that another burst's
/// references cut).
struct SavedRefs {
    out: std::io::BufWriter<std::fs::File>,
    /// Module paths by module id.
    paths: Vec<(u32, String)>,
}

impl DataRefs {
    /// Holding at most `max` references; `rated`: at most
    /// [`ANALYSED_PER_SECOND`] a second are analysed.
    pub(crate) fn new(max: u64, rated: bool) -> Self {
        DataRefs {
            skipped: 0,
            bucket: rated.then(|| (BUCKET, Instant::now())),
            taken: [true; MAX_SLOTS],
            module_ids: Vec::new(),
            placer: Placer::default(),
            every: if rated { FIRST_REFS_EVERY } else { 1 },
            starts: 0,
            window: (0, Instant::now()),
            set_once: false,
            refs_burst: super::options::DEFAULT_REFS_BURST,
            refs: References::new(),
            recent: RecentRefs::new(RECENT_MAX),
            pending: Default::default(),
            unplaced: 0,
            dropped: 0,
            seen: 0,
            max,
            open: None,
            save: None,
            recording: [false; MAX_SLOTS],
            bursts: 0,
            ticks: 0,
        }
    }

    /// Also write every reference analysed to `path` (see [`SavedRefs`]).
    pub(crate) fn save_to(&mut self, path: &std::path::Path) {
        match crate::sys::create_output_file(path) {
            Ok(f) => {
                self.save = Some(SavedRefs {
                    out: std::io::BufWriter::new(f),
                    paths: Vec::new(),
                })
            }
            Err(e) => tracing::warn!("cannot write {}: {e}", path.display()),
        }
    }

    /// Takes one event of slot `slot`'s sub-ring, in order.
    pub(crate) fn add(&mut self, slot: usize, ev: &BurstEvent, traced: &Traced) {
        match *ev {
            BurstEvent::Ref { pc, addr, .. } => {
                self.seen += 1;
                if let Some(r) = self.recording.get_mut(slot) {
                    *r = true;
                }
                if !self.taken.get(slot).copied().unwrap_or(false) {
                    self.skipped += 1;
                    return;
                }
                if let Some((tokens, _)) = &mut self.bucket {
                    *tokens -= 1.0;
                }
                let (module_ids, refs, save) =
                    (&mut self.module_ids, &mut self.refs, &mut self.save);
                let Some((module, vaddr)) = self.placer.place(traced, pc, |m| {
                    let key = u64::from(m.fid_base);
                    match module_ids.iter().find(|(k, _)| *k == key) {
                        Some(&(_, id)) => id,
                        None => {
                            let id = refs.module(&m.path);
                            module_ids.push((key, id));
                            if let Some(save) = save {
                                save.paths.push((id, m.path.clone()));
                            }
                            id
                        }
                    }
                }) else {
                    self.unplaced += 1;
                    return;
                };
                if let Some(p) = self.pending.get_mut(slot) {
                    p.push((Instr { module, vaddr }, addr));
                    if p.len() >= CHUNK {
                        self.push_pending(slot);
                    }
                }
            }
            BurstEvent::Start { .. } => {
                self.end_burst(slot);
                self.ended_recording(slot, None);
                self.starts += 1;
                let take = self.take_burst(Instant::now());
                if let Some(t) = self.taken.get_mut(slot) {
                    *t = take;
                }
            }
            BurstEvent::End { reason, ticks } => {
                self.end_burst(slot);
                // Ticks run past the real end of a burst ended after the
                // fact (as `PathCounts` reads them).
                let known = ticks > 0 && reason != EndReason::LeftUnseen;
                self.ended_recording(slot, known.then_some(ticks));
            }
            _ => {}
        }
    }

    /// Slot `slot`'s burst ended, `ticks` long if known: counted if it
    /// recorded references.
    fn ended_recording(&mut self, slot: usize, ticks: Option<u64>) {
        if let Some(r) = self.recording.get_mut(slot)
            && std::mem::take(r)
        {
            self.bursts += 1;
            self.ticks += ticks.unwrap_or(0);
        }
    }

    /// A recording burst records `n` references at most.
    pub(crate) fn set_refs_burst(&mut self, n: u64) {
        self.refs_burst = n.max(1);
    }

    /// Once a second (the first time after a tenth of one; `None`
    /// otherwise, for a full trace, and while no burst started): the
    /// `refs_every` that keeps the references recorded at or below the
    /// analysis rate, `bursts a second × references a recording burst
    /// records at most / rate`. A bound, not a mean, of what a burst
    /// records: a mean of what recording bursts recorded lags where a
    /// program's phase changes (gawk's first seconds make recording
    /// bursts of some 70 references, the next 32,768: from that mean
    /// `refs_every` had come down to 1, and every burst recorded 32,768
    /// for a second or more, 163,000 references a second over a 25 s
    /// run for a target of 30,000); the references a second themselves,
    /// one or two recording bursts, swung it from 1 to 2,000 and back
    /// (sqlite3: 97,000 a second). The price: where bursts end early
    /// (their checks, the thread leaving the clones), fewer references
    /// than the rate are analysed. It moves when it is off by a quarter
    /// or more: up at once, down 2-fold at most.
    pub(crate) fn refs_every(&mut self, now: Instant) -> Option<u64> {
        if !self.rate_due(now) {
            return None;
        }
        let secs = now.saturating_duration_since(self.window.1).as_secs_f64();
        let starts = self.starts - self.window.0;
        self.window = (self.starts, now);
        if starts == 0 {
            return None;
        }
        self.set_once = true;
        let want = starts as f64 / secs * self.refs_burst as f64 / ANALYSED_PER_SECOND;
        let want = (want.ceil() as u64).clamp((self.every / 2).max(1), MAX_REFS_EVERY);
        let off = want as f64 / self.every as f64;
        if (0.8..=1.25).contains(&off) {
            return None;
        }
        self.every = want;
        Some(want)
    }

    /// Whether [`Self::refs_every`] looks at the rate at `now` (the
    /// bursts started until then must have been counted).
    pub(crate) fn rate_due(&self, now: Instant) -> bool {
        let secs = now.saturating_duration_since(self.window.1).as_secs_f64();
        self.bucket.is_some() && secs >= if self.set_once { 1.0 } else { 0.1 }
    }

    /// Whether a burst starting at `now` is analysed: the bucket, refilled
    /// for the time since, holds a token (a burst may take it below 0).
    fn take_burst(&mut self, now: Instant) -> bool {
        let Some((tokens, last)) = &mut self.bucket else {
            return true;
        };
        let dt = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + dt * ANALYSED_PER_SECOND).min(BUCKET);
        *last = now;
        *tokens > 0.0
    }

    /// Slot `slot`'s burst is over: the rest of its references go into
    /// the grammar, and its sequence ends.
    pub(crate) fn end_burst(&mut self, slot: usize) {
        self.push_pending(slot);
        if self.open == Some(slot) {
            self.end_sequence();
            self.open = None;
        }
    }

    fn end_sequence(&mut self) {
        self.refs.end_sequence();
        self.recent.end_sequence();
        if let Some(save) = &mut self.save {
            let _ = writeln!(save.out);
        }
    }

    /// Slot `slot`'s references so far into the grammar (unless it holds
    /// its bound already) and the recent log, in its open sequence
    /// (another slot's open one ends first).
    fn push_pending(&mut self, slot: usize) {
        let Some(mut p) = self.pending.get_mut(slot).map(std::mem::take) else {
            return;
        };
        if p.is_empty() {
            return;
        }
        if self.open.is_some_and(|o| o != slot) {
            self.end_sequence();
        }
        self.open = Some(slot);
        let keep = self.refs.count + p.len() as u64 <= self.max;
        if !keep {
            self.dropped += p.len() as u64;
        }
        if let Some(save) = &mut self.save {
            for (instr, addr) in &p {
                let path = save
                    .paths
                    .iter()
                    .find(|(id, _)| *id == instr.module)
                    .map_or("?", |(_, p)| p.as_str());
                let _ = writeln!(save.out, "{path} {:x} {addr:x}", instr.vaddr);
            }
        }
        for (instr, addr) in p.drain(..) {
            if keep {
                self.refs.push(instr, addr);
            }
            self.recent.push(instr, addr);
        }
        // The buffer's capacity serves the slot's next chunk.
        self.pending[slot] = p;
    }

    /// Every running burst is over (the detach).
    pub(crate) fn finish(&mut self) {
        for slot in 0..MAX_SLOTS {
            self.end_burst(slot);
        }
        if let Some(save) = &mut self.save {
            let _ = save.out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(d: &mut DataRefs, slot: usize, n: u64, base: u64) {
        let p = &mut d.pending[slot];
        for i in 0..n {
            p.push((
                Instr {
                    module: 0,
                    vaddr: 0x10 + i % 4,
                },
                base + i,
            ));
        }
    }

    /// Bursts are analysed at the rate the bucket allows, whole: one that
    /// comes when the bucket is empty is skipped, and a second later the
    /// bucket has a second's worth again.
    #[test]
    fn bursts_are_taken_at_the_rate() {
        let t0 = Instant::now();
        let mut d = DataRefs::new(1 << 30, true);
        d.bucket = Some((1.0, t0));
        assert!(d.take_burst(t0));
        // The burst took more than the bucket held.
        d.bucket.as_mut().unwrap().0 -= 500.0;
        assert!(!d.take_burst(t0 + std::time::Duration::from_millis(10)));
        let later = t0 + std::time::Duration::from_secs(5);
        assert!(d.take_burst(later));
        assert_eq!(d.bucket.unwrap().0, BUCKET);
        // Unrated: every burst.
        let mut full = DataRefs::new(1 << 30, false);
        full.bucket = None;
        assert!(full.take_burst(t0));
    }

    /// `refs_every` follows the bursts' rate: first after a tenth of a
    /// second, then once a second, at most `refs_burst` references a
    /// recording burst (32,768) times the bursts a second over the rate
    /// (30,000); within a quarter it stays; up at once, down 2-fold at
    /// most, never below 1 nor above the bound; nothing before a burst
    /// started, nor in a full trace.
    #[test]
    fn refs_every_follows_the_rate() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + std::time::Duration::from_millis(n);
        let mut d = DataRefs::new(1 << 30, true);
        assert_eq!(d.every, FIRST_REFS_EVERY);
        d.window = (0, t0);
        assert_eq!(d.refs_every(ms(100)), None, "no burst yet");
        d.starts += 20;
        assert_eq!(d.refs_every(ms(200)), Some(219), "200 a second");
        d.starts += 20;
        assert_eq!(d.refs_every(ms(300)), None, "not a second yet");
        d.starts += 180;
        assert_eq!(d.refs_every(ms(1200)), None, "within a quarter");
        d.starts += 100;
        assert_eq!(d.refs_every(ms(2200)), Some(110), "half the bursts");
        d.starts += 10;
        assert_eq!(d.refs_every(ms(3200)), Some(55), "down 2-fold at most");
        d.starts += 1000;
        assert_eq!(d.refs_every(ms(4200)), Some(1093), "up at once");
        d.starts += 100_000;
        assert_eq!(d.refs_every(ms(5200)), Some(MAX_REFS_EVERY));
        d.every = 2;
        d.set_refs_burst(1000);
        d.starts += 1;
        assert_eq!(d.refs_every(ms(6200)), Some(1), "never below 1");
        let mut full = DataRefs::new(1 << 30, false);
        full.starts = 1000;
        assert_eq!(full.refs_every(ms(9000)), None, "a full trace records all");
    }

    /// A burst's references are one sequence, however many chunks they
    /// come in; a chunk of another slot in between ends it; nothing is
    /// held beyond the bound.
    #[test]
    fn bursts_are_sequences_in_chunks() {
        let mut d = DataRefs::new(100, false);
        push(&mut d, 0, 10, 0);
        d.push_pending(0);
        push(&mut d, 0, 10, 10);
        d.end_burst(0);
        // One sequence of 20, then its separator.
        assert_eq!((d.refs.count, d.refs.sequences()), (20, 1));
        assert_eq!(d.open, None);
        push(&mut d, 1, 5, 100);
        d.push_pending(1);
        push(&mut d, 2, 5, 200);
        d.push_pending(2);
        // Slot 2's chunk ended slot 1's sequence.
        assert_eq!((d.open, d.refs.sequences()), (Some(2), 2));
        d.end_burst(1);
        d.end_burst(2);
        assert_eq!((d.refs.count, d.open, d.refs.sequences()), (30, None, 3));
        // Beyond the bound: counted, not kept; the recent log has them.
        push(&mut d, 3, 80, 300);
        d.end_burst(3);
        assert_eq!((d.refs.count, d.dropped), (30, 80));
        assert_eq!(d.recent.position(), 110);
    }

    /// The time of the bursts that recorded references: their END ticks
    /// (a burst ended after the fact, or with 0 ticks, counts without
    /// them; a burst whose END was lost counts at the next START); a
    /// burst without references is not one of them.
    #[test]
    fn the_time_in_recording_bursts_adds_their_end_ticks() {
        let traced = Traced {
            pid: burstyd_common::addr::Pid(1),
            exe: "/nonexistent".into(),
            modules: Vec::new(),
            code: Default::default(),
            index: Vec::new(),
            generation: 0,
        };
        let mut d = DataRefs::new(1 << 20, false);
        let start = BurstEvent::Start {
            tid: 1,
            pc: 0x1000,
            slot: 0,
            running: 1,
        };
        let r = BurstEvent::Ref {
            pc: 0x1000,
            kind: super::super::decode::RefKind::Load,
            addr: 0x5000,
        };
        let end = |reason, ticks| BurstEvent::End { reason, ticks };
        for (slot, reason, ticks, refs) in [
            (0, EndReason::Budget, 1000, true),
            (1, EndReason::Budget, 7, false),
            (0, EndReason::LeftUnseen, 50_000, true),
            (2, EndReason::LeftClones, 300, true),
        ] {
            d.add(slot, &start, &traced);
            if refs {
                d.add(slot, &r, &traced);
            }
            d.add(slot, &end(reason, ticks), &traced);
        }
        assert_eq!((d.bursts, d.ticks), (3, 1300));
        // No END: counted at the slot's next START, without ticks.
        d.add(3, &start, &traced);
        d.add(3, &r, &traced);
        d.add(3, &start, &traced);
        d.add(3, &end(EndReason::Budget, 20), &traced);
        assert_eq!((d.bursts, d.ticks), (4, 1300));
    }
}
