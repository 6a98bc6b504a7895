//! A traced process's data references (memory mode, `--record refs`):
//! each burst's `REF` records, named by module and static address, go
//! into the process's [`References`] when the burst ends, so that no
//! stream spans two bursts. The drain reads one slot's sub-ring at a
//! time, and a burst's records may come in several drains, so each slot's
//! running burst collects its references apart until its END (or the
//! START of the next burst in the slot, when an END was lost).
use burstyd_common::burst::MAX_SLOTS;

use super::decode::BurstEvent;
use super::traced::Traced;
use crate::streams::references::{Instr, References};

/// References held per process at most: beyond it, bursts' references
/// are counted but not kept (Sequitur's grammar costs some 50 bytes a
/// reference; 2^21 keep the daemon's share of it near 100 MB).
pub(crate) const MAX_REFERENCES: u64 = 1 << 21;

/// The data references of one traced process.
pub(crate) struct DataRefs {
    pub(crate) refs: References,
    /// Per slot: the references of its running burst so far.
    pending: [Vec<(Instr, u64)>; MAX_SLOTS],
    /// References whose instruction lies in no traced function (none
    /// should), and those of bursts that came once [`MAX_REFERENCES`]
    /// were held.
    pub(crate) unplaced: u64,
    pub(crate) dropped: u64,
    /// References read.
    pub(crate) seen: u64,
}

impl Default for DataRefs {
    fn default() -> Self {
        DataRefs {
            refs: References::new(),
            pending: Default::default(),
            unplaced: 0,
            dropped: 0,
            seen: 0,
        }
    }
}

impl DataRefs {
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
                }
            }
            BurstEvent::Start { .. } | BurstEvent::End { .. } => self.end_burst(slot),
            _ => {}
        }
    }

    /// Slot `slot`'s burst is over: its references go into the grammar,
    /// as one sequence.
    pub(crate) fn end_burst(&mut self, slot: usize) {
        let Some(p) = self.pending.get_mut(slot) else {
            return;
        };
        if p.is_empty() {
            return;
        }
        if self.refs.count + p.len() as u64 > MAX_REFERENCES {
            self.dropped += p.len() as u64;
            p.clear();
            return;
        }
        for (instr, addr) in p.drain(..) {
            self.refs.push(instr, addr);
        }
        self.refs.end_sequence();
    }

    /// Every running burst is over (the detach).
    pub(crate) fn finish(&mut self) {
        for slot in 0..MAX_SLOTS {
            self.end_burst(slot);
        }
    }
}
