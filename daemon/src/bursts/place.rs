//! An instruction's address in a traced process (an AVMA, as records
//! carry it) → its module and static address (SVMA), the name that stays
//! the same from one run, one process and one load address to the next.
//! Memory mode's references ([`super::data_refs`]) and the tuple
//! profiles' sites ([`super::tuples`]) are placed so. A burst's records
//! come from few functions, so the last function's addresses are kept:
//! most records need no look-up in the process's function index.
use super::traced::{Traced, TracedModule};

/// Places instructions of one traced process; `K` is what its user calls
/// a module (computed once per function looked up, not per record).
pub(crate) struct Placer<K> {
    /// The function of the last instruction placed: the addresses that
    /// are in it (`lo..hi`), its module's key and bias, and the generation
    /// of the process's function index that told (what was learnt of an
    /// index is stale once it is rebuilt).
    last: Option<Span<K>>,
    /// The functions of instructions placed lately, direct-mapped by the
    /// instruction's 32-byte line of code, as `last` (a memory-mode burst
    /// references data from a few loops, in more functions than one).
    recent: Vec<Option<Span<K>>>,
}

/// Addresses `lo..hi` of one function, its module's key and bias, and
/// the generation of the function index that told: `(lo, hi, key, bias,
/// generation)`.
type Span<K> = (u64, u64, K, u64, u64);

/// Entries of [`Placer::recent`] (a power of two).
const RECENT: usize = 256;

impl<K> Default for Placer<K> {
    fn default() -> Self {
        Placer {
            last: None,
            recent: Vec::new(),
        }
    }
}

impl<K: Copy> Placer<K> {
    /// The module key and static address of the instruction at `pc`;
    /// `key` names a module the first time one of its functions is looked
    /// up. `None`: no traced function holds `pc`.
    pub(crate) fn place(
        &mut self,
        traced: &Traced,
        pc: u64,
        key: impl FnOnce(&TracedModule) -> K,
    ) -> Option<(K, u64)> {
        let known = |e: &Option<Span<K>>| match *e {
            Some((lo, hi, module, bias, generation))
                if (lo..hi).contains(&pc) && generation == traced.generation =>
            {
                Some((module, bias))
            }
            _ => None,
        };
        if let Some((module, bias)) = known(&self.last) {
            return Some((module, pc.wrapping_sub(bias)));
        }
        if self.recent.is_empty() {
            self.recent = vec![None; RECENT];
        }
        let h = ((pc >> 5).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - RECENT.trailing_zeros()))
            as usize;
        let (module, bias) = match known(&self.recent[h]) {
            Some(found) => {
                self.last = self.recent[h];
                found
            }
            None => {
                let (fid, lo, hi) = traced.fid_span_at(pc)?;
                let (m, _) = traced.function(fid)?;
                let module = key(m);
                self.last = Some((lo, hi, module, m.bias, traced.generation));
                self.recent[h] = self.last;
                (module, m.bias)
            }
        };
        Some((module, pc.wrapping_sub(bias)))
    }
}
