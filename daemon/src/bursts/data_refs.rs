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
use burstyd_common::burst::MAX_SLOTS;

use super::decode::BurstEvent;
use super::traced::Traced;
use crate::streams::recent::{RECENT_MAX, RecentRefs};
use crate::streams::references::{Instr, References};

/// References held per process at most: beyond it, bursts' references
/// are counted but not kept (Sequitur's grammar costs some 50 bytes a
/// reference; 2^21 keep the daemon's share of it near 100 MB).
pub(crate) const MAX_REFERENCES: u64 = 1 << 21;
/// The same for a full trace (`--full-trace`: ground truth, on a short
/// run).
pub(crate) const MAX_REFERENCES_FULL: u64 = 1 << 24;
/// A running burst's references held apart before a chunk of them goes
/// into the grammar.
const CHUNK: usize = 1 << 16;

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
    /// The bound on references held.
    max: u64,
    /// The slot whose burst's sequence is open in the grammar (chunks
    /// pushed, no separator yet).
    open: Option<usize>,
}

impl DataRefs {
    /// Holding at most `max` references.
    pub(crate) fn new(max: u64) -> Self {
        DataRefs {
            refs: References::new(),
            recent: RecentRefs::new(RECENT_MAX),
            pending: Default::default(),
            unplaced: 0,
            dropped: 0,
            seen: 0,
            max,
            open: None,
        }
    }

    /// Takes one event of slot `slot`'s sub-ring, in order.
    pub(crate) fn add(&mut self, slot: usize, ev: &BurstEvent, traced: &Traced) {
        match *ev {
            BurstEvent::Ref { pc, addr, .. } => {
                self.seen += 1;
                let Some((m, _)) = traced.fid_at(pc).and_then(|f| traced.function(f)) else {
                    self.unplaced += 1;
                    return;
                };
                let module = self.refs.module(&m.path);
                let vaddr = pc.wrapping_sub(m.bias);
                if let Some(p) = self.pending.get_mut(slot) {
                    p.push((Instr { module, vaddr }, addr));
                    if p.len() >= CHUNK {
                        self.push_pending(slot);
                    }
                }
            }
            BurstEvent::Start { .. } | BurstEvent::End { .. } => self.end_burst(slot),
            _ => {}
        }
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

    /// A burst's references are one sequence, however many chunks they
    /// come in; a chunk of another slot in between ends it; nothing is
    /// held beyond the bound.
    #[test]
    fn bursts_are_sequences_in_chunks() {
        let mut d = DataRefs::new(100);
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
}
