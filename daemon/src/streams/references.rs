//! Data references, interned into a sequence for the grammar
//! ([`super::grammar`]): each distinct (instruction, address) pair becomes
//! a terminal, each distinct instruction (module, static address) an id;
//! the end of an independent sequence (a burst; a thread of a complete
//! trace) is a terminal of its own that occurs once, so no rule, and no
//! stream, spans it.
use rustc_hash::FxHashMap;

use super::grammar::{RULE_BIT, mix_all};

/// An instruction that references data: its module (index into
/// [`References::modules`]) and static virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Instr {
    pub(crate) module: u32,
    pub(crate) vaddr: u64,
}

/// The references of a process (or a trace), in order.
#[derive(Default)]
pub(crate) struct References {
    /// Terminals, and separators (ids count down from below `RULE_BIT`).
    pub(crate) seq: Vec<u32>,
    /// Module paths, by index.
    pub(crate) modules: Vec<String>,
    module_ids: FxHashMap<String, u32>,
    /// Instructions, by id.
    pub(crate) instrs: Vec<Instr>,
    instr_ids: FxHashMap<Instr, u32>,
    /// Terminals: (instruction id, data address), by id.
    pub(crate) terms: Vec<(u32, u64)>,
    term_ids: TermIds,
    /// Separators handed out (ids count down from below `RULE_BIT`).
    separators: u32,
    /// References pushed.
    pub(crate) count: u64,
    /// Whether the last terminal pushed was a separator (or none was).
    at_start: bool,
}

impl References {
    pub(crate) fn new() -> Self {
        References {
            at_start: true,
            ..Default::default()
        }
    }

    /// The id of module `path`.
    pub(crate) fn module(&mut self, path: &str) -> u32 {
        if let Some(&m) = self.module_ids.get(path) {
            return m;
        }
        let m = self.modules.len() as u32;
        self.modules.push(path.to_string());
        self.module_ids.insert(path.to_string(), m);
        m
    }

    /// Appends a reference by `instr` to `addr`.
    pub(crate) fn push(&mut self, instr: Instr, addr: u64) {
        let i = match self.instr_ids.get(&instr) {
            Some(&i) => i,
            None => {
                let i = self.instrs.len() as u32;
                self.instrs.push(instr);
                self.instr_ids.insert(instr, i);
                i
            }
        };
        let next = self.terms.len() as u32;
        let t = self.term_ids.get_or_insert(i, addr, next);
        if t == next {
            assert!(
                t < RULE_BIT - 1 - self.separators,
                "too many distinct references"
            );
            self.terms.push((i, addr));
        }
        self.seq.push(t);
        self.count += 1;
        self.at_start = false;
    }

    /// Ends the current sequence: what follows is independent of it.
    pub(crate) fn end_sequence(&mut self) {
        if self.at_start {
            return;
        }
        self.separators += 1;
        let s = RULE_BIT - self.separators;
        assert!((s as usize) > self.terms.len(), "too many sequences");
        self.seq.push(s);
        self.at_start = true;
    }

    /// Sequences ended so far.
    #[cfg(test)]
    pub(crate) fn sequences(&self) -> u32 {
        self.separators
    }

    /// Each terminal's name for the grammar: a hash of its instruction's
    /// module file name and static address (the same in any trace of the
    /// same code; the data address is not in it, as it differs between
    /// runs and tools).
    pub(crate) fn term_names(&self) -> Vec<u64> {
        let modules: Vec<u64> = self
            .modules
            .iter()
            .map(|p| {
                let file = std::path::Path::new(p)
                    .file_name()
                    .map_or(p.as_bytes(), |f| f.as_encoded_bytes());
                mix_all(file.iter().map(|&b| u64::from(b)))
            })
            .collect();
        let instrs: Vec<u64> = self
            .instrs
            .iter()
            .map(|i| {
                let m = modules.get(i.module as usize).copied().unwrap_or(0);
                mix_all([m, i.vaddr].into_iter())
            })
            .collect();
        self.terms
            .iter()
            .map(|&(i, _)| instrs[i as usize])
            .collect()
    }

    /// Whether terminal `t` is a reference (not a separator).
    pub(crate) fn is_reference(&self, t: u32) -> bool {
        (t as usize) < self.terms.len()
    }
}

/// Terminals by (instruction id, data address): open addressing (linear
/// probing, nothing is ever taken out) on 16-byte slots, so that a
/// look-up touches one cache line where a general map touches two (there
/// are about as many terminals as references: the map outgrows the
/// processor's caches).
struct TermIds {
    /// (address, instruction id, terminal); terminal `u32::MAX`: empty.
    slots: Vec<(u64, u32, u32)>,
    len: usize,
}

impl Default for TermIds {
    fn default() -> Self {
        TermIds {
            slots: vec![(0, 0, u32::MAX); 1 << 10],
            len: 0,
        }
    }
}

impl TermIds {
    fn find(&self, i: u32, addr: u64) -> usize {
        let bits = self.slots.len().trailing_zeros();
        let h = (addr ^ u64::from(i).rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mask = self.slots.len() - 1;
        let mut at = (h >> (64 - bits)) as usize;
        loop {
            let (a, j, t) = self.slots[at];
            if t == u32::MAX || (a == addr && j == i) {
                return at;
            }
            at = (at + 1) & mask;
        }
    }

    /// The terminal of `(i, addr)`; a new one is `next`.
    fn get_or_insert(&mut self, i: u32, addr: u64, next: u32) -> u32 {
        let at = self.find(i, addr);
        if self.slots[at].2 != u32::MAX {
            return self.slots[at].2;
        }
        self.slots[at] = (addr, i, next);
        self.len += 1;
        if self.len * 8 >= self.slots.len() * 5 {
            let size = self.slots.len() * 2;
            let old = std::mem::replace(&mut self.slots, vec![(0, 0, u32::MAX); size]);
            for (a, j, t) in old {
                if t != u32::MAX {
                    let at = self.find(j, a);
                    self.slots[at] = (a, j, t);
                }
            }
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// References get the terminals a map would give them (in order of
    /// first appearance), across the index's growth.
    #[test]
    fn terminals_are_numbered_in_order_of_first_appearance() {
        let mut r = References::new();
        let mut want: FxHashMap<(u32, u64), u32> = FxHashMap::default();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let instr = Instr {
                module: (x % 3) as u32,
                vaddr: (x >> 8) % 50,
            };
            let addr = (x >> 20) % 4000 * 8;
            r.push(instr, addr);
            let i = r.instr_ids[&instr];
            let n = want.len() as u32;
            want.entry((i, addr)).or_insert(n);
        }
        assert_eq!(r.terms.len(), want.len());
        for (t, k) in r.terms.iter().enumerate() {
            assert_eq!(want[k], t as u32);
        }
        assert_eq!(r.term_ids.len, want.len());
    }
}
