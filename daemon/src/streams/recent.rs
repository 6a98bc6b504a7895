//! A process's recent data references, in order and bounded: what the
//! service's interval files and `/debug/pprof/streams?seconds=N` windows
//! analyse, each in a grammar of its own built when it closes. The whole
//! run's grammar ([`References`]) is apart: it stops growing at its bound,
//! while this log keeps the newest references (the oldest go first).
use std::collections::VecDeque;

use super::references::{Instr, References};

/// References held at most (24 bytes each: 12 MiB).
pub(crate) const RECENT_MAX: usize = 1 << 19;

/// Set in an entry's module id: a new sequence (burst) begins with it.
const NEW_SEQUENCE: u32 = 1 << 31;

/// The log. A position counts references since the process's first.
pub(crate) struct RecentRefs {
    log: VecDeque<(Instr, u64)>,
    /// The position of `log[0]`.
    start: u64,
    max: usize,
    /// The next reference begins a sequence.
    at_start: bool,
}

impl RecentRefs {
    pub(crate) fn new(max: usize) -> Self {
        RecentRefs {
            log: VecDeque::new(),
            start: 0,
            max,
            at_start: true,
        }
    }

    /// Appends a reference; `instr.module` is an id of the process's
    /// [`References::modules`] (below 2^31).
    pub(crate) fn push(&mut self, mut instr: Instr, addr: u64) {
        if self.at_start {
            instr.module |= NEW_SEQUENCE;
            self.at_start = false;
        }
        if self.log.len() >= self.max {
            self.log.pop_front();
            self.start += 1;
        }
        self.log.push_back((instr, addr));
    }

    /// The current sequence ends: no stream spans what follows.
    pub(crate) fn end_sequence(&mut self) {
        self.at_start = true;
    }

    /// The position after the newest reference.
    pub(crate) fn position(&self) -> u64 {
        self.start + self.log.len() as u64
    }

    /// Appends the references from position `from` on into `into`, in
    /// their sequences (the first one copied begins a sequence; module ids
    /// translated through `modules`, the process's module paths). Returns
    /// how many of them the log no longer held.
    pub(crate) fn copy_since(&self, from: u64, modules: &[String], into: &mut References) -> u64 {
        let lost = self.start.saturating_sub(from);
        let skip = from.saturating_sub(self.start) as usize;
        let mut ids: Vec<Option<u32>> = vec![None; modules.len()];
        into.end_sequence();
        for &(instr, addr) in self.log.iter().skip(skip) {
            if instr.module & NEW_SEQUENCE != 0 {
                into.end_sequence();
            }
            let m = (instr.module & !NEW_SEQUENCE) as usize;
            let Some(path) = modules.get(m) else {
                continue;
            };
            let module = *ids[m].get_or_insert_with(|| into.module(path));
            into.push(
                Instr {
                    module,
                    vaddr: instr.vaddr,
                },
                addr,
            );
        }
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(vaddr: u64) -> Instr {
        Instr { module: 0, vaddr }
    }

    /// A window gets the references from its position on, in their
    /// sequences, with module ids of its own; beyond the bound the oldest
    /// go, and a window that wanted them is told how many.
    #[test]
    fn windows_copy_their_references_in_sequences() {
        let mut r = RecentRefs::new(4);
        let modules = vec!["/bin/a".to_string()];
        r.push(at(1), 10);
        r.push(at(2), 20);
        r.end_sequence();
        let from = r.position();
        assert_eq!(from, 2);
        r.push(at(3), 30);
        r.end_sequence();
        r.push(at(4), 40);
        let mut w = References::new();
        w.module("/bin/other");
        assert_eq!(r.copy_since(from, &modules, &mut w), 0);
        assert_eq!(w.count, 2);
        // Two sequences: 30 | 40 (and the module is w's second).
        assert_eq!(w.sequences(), 1);
        assert_eq!(w.terms.len(), 2);
        assert_eq!(w.instrs[0].module, 1);
        assert_eq!(w.modules[1], "/bin/a");
        // Two more: the first two references are gone.
        r.push(at(5), 50);
        r.push(at(6), 60);
        assert_eq!(r.position(), 6);
        let mut all = References::new();
        assert_eq!(r.copy_since(0, &modules, &mut all), 2);
        assert_eq!(all.count, 4);
    }
}
