//! The memory a traced process shares with the daemon (a memfd mapped
//! `MAP_SHARED` by both): page 0 holds the [`BurstControl`] block, then
//! (after the target's private slots) come the ring's words: one sub-ring
//! per burst slot. A slot's burst thread is the only producer of its
//! sub-ring (it advances `heads[slot]`); the daemon consumes
//! (`tails[slot]`). This module reads the
//! raw two-word records and the control words; what a record means is
//! [`super::decode`]'s business.
use std::mem::offset_of;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use burstyd_common::burst::{BurstControl, CONTROL_BYTES, MAX_MODULES, MAX_SLOTS, ModuleEntry};

/// The daemon's mapping of a target's burst region.
pub(crate) struct SharedRegion {
    map: memmap2::MmapMut,
}

/// Target-side counters ([`BurstControl`] words), in this order: bursts,
/// truncated, declined busy, declined PC, lost records, declined budget,
/// declined behind.
pub(crate) type TargetCounters = [u64; 7];

impl SharedRegion {
    /// `map` must span at least the control block (and the ring it
    /// describes, once the control block says where that is).
    pub(crate) fn new(map: memmap2::MmapMut) -> Self {
        SharedRegion { map }
    }

    /// The control block for plain reads and writes: only while the target
    /// is stopped or disarmed, or for fields the target does not write
    /// concurrently (the hot fields go through the atomics below).
    pub(crate) fn control_mut(&mut self) -> &mut BurstControl {
        // SAFETY: the mapping is CONTROL_BYTES + ring, page aligned; the
        // target writes the same words concurrently, which is why the hot
        // fields are only read through atomics (`word`); these plain writes
        // happen while the target is stopped or disarmed.
        unsafe { &mut *(self.map.as_mut_ptr() as *mut BurstControl) }
    }

    /// The control block as it is now (a plain read; see [`Self::control_mut`]).
    pub(crate) fn control(&self) -> &BurstControl {
        // SAFETY: as in `control_mut`.
        unsafe { &*(self.map.as_ptr() as *const BurstControl) }
    }

    /// A u64 field of the control block.
    fn word(&self, field_off: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned u64 field inside the mapping.
        unsafe { &*(self.map.as_ptr().add(field_off) as *const AtomicU64) }
    }

    /// Memory mode: from the next burst on, one in `n` records data
    /// references (see `BurstControl::refs_every`).
    pub(crate) fn set_refs_every(&self, n: u64) {
        self.word(offset_of!(BurstControl, refs_every))
            .store(n, Ordering::Relaxed);
    }

    /// The u32 `active` field.
    fn active_word(&self) -> &AtomicU32 {
        // SAFETY: the 4-aligned u32 `active` field inside the mapping.
        unsafe { &*(self.map.as_ptr().add(offset_of!(BurstControl, active)) as *const AtomicU32) }
    }

    /// The thread id of each slot's running burst (0: the slot is free),
    /// and how many bursts have started so far.
    pub(crate) fn burst_state(&self) -> ([u64; MAX_SLOTS], u64) {
        (
            std::array::from_fn(|i| {
                self.word(offset_of!(BurstControl, slot_tids) + 8 * i)
                    .load(Ordering::Acquire)
            }),
            self.word(offset_of!(BurstControl, bursts))
                .load(Ordering::Relaxed),
        )
    }

    /// The most bursts that ran at once so far.
    pub(crate) fn concurrent_max(&self) -> u64 {
        self.word(offset_of!(BurstControl, concurrent_max))
            .load(Ordering::Relaxed)
    }

    /// Frees slot `slot` for the next burst (after the slot's private
    /// `owner` was cleared: see `Attachment::reap_stuck_bursts`): its tid,
    /// and one running burst fewer (never below 0: the burst's own end may
    /// have got there first).
    pub(crate) fn free_slot(&self, slot: usize) {
        self.word(offset_of!(BurstControl, slot_tids) + 8 * slot)
            .store(0, Ordering::SeqCst);
        let _ = self
            .active_word()
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| a.checked_sub(1));
    }

    /// No burst runs (a re-attach, the target stopped): every slot free.
    pub(crate) fn clear_active(&self) {
        for i in 0..MAX_SLOTS {
            self.word(offset_of!(BurstControl, slot_tids) + 8 * i)
                .store(0, Ordering::SeqCst);
        }
        self.active_word().store(0, Ordering::SeqCst);
    }

    /// The `tables` word: the lookup tables' header and its generation
    /// (see [`super::linkmap`]), which the target's handler changes too.
    pub(crate) fn tables_word(&self) -> &AtomicU64 {
        self.word(offset_of!(BurstControl, tables))
    }

    /// The module directory as it is now.
    pub(crate) fn modules(&self) -> Vec<ModuleEntry> {
        let n = (self
            .word(offset_of!(BurstControl, n_modules))
            .load(Ordering::Acquire) as usize)
            .min(MAX_MODULES);
        self.control().modules[..n].to_vec()
    }

    /// Marks module `i` of the directory unloaded (`id` 0: a re-attach
    /// never re-arms it).
    pub(crate) fn forget_module(&self, i: usize) {
        let at = offset_of!(BurstControl, modules)
            + i * std::mem::size_of::<ModuleEntry>()
            + offset_of!(ModuleEntry, id);
        self.word(at).store(0, Ordering::Release);
    }

    /// Appends modules to the control block's module directory (those
    /// beyond [`MAX_MODULES`] are not recorded: a re-attach will not
    /// re-arm them).
    pub(crate) fn add_modules(&self, entries: impl IntoIterator<Item = ModuleEntry>) {
        let n_off = offset_of!(BurstControl, n_modules);
        let mut n = self.word(n_off).load(Ordering::Acquire) as usize;
        for e in entries {
            if n >= MAX_MODULES {
                break;
            }
            let at = offset_of!(BurstControl, modules) + n * std::mem::size_of::<ModuleEntry>();
            let words = [e.id, e.code, e.fid_base, e.bias, e.lo, e.hi, e.ino];
            const _: () = assert!(std::mem::size_of::<ModuleEntry>() == 7 * 8);
            for (i, w) in words.into_iter().enumerate() {
                self.word(at + 8 * i).store(w, Ordering::Relaxed);
            }
            n += 1;
        }
        self.word(n_off).store(n as u64, Ordering::Release);
    }

    /// The counters the target side keeps.
    pub(crate) fn target_counters(&self) -> TargetCounters {
        [
            offset_of!(BurstControl, bursts),
            offset_of!(BurstControl, truncated),
            offset_of!(BurstControl, declined_busy),
            offset_of!(BurstControl, declined_pc),
            offset_of!(BurstControl, lost_records),
            offset_of!(BurstControl, declined_budget),
            offset_of!(BurstControl, declined_behind),
        ]
        .map(|off| self.word(off).load(Ordering::Relaxed))
    }

    /// Consumes every whole record written to slot `slot`'s sub-ring since
    /// the last call, oldest first, handing each to `f` as `(w0, w1)`.
    /// Returns how many, and the producer index (`heads[slot]`) they were
    /// read up to.
    pub(crate) fn take_records(&self, slot: usize, mut f: impl FnMut(u64, u64)) -> (u64, u64) {
        assert!(slot < MAX_SLOTS);
        let head = self
            .word(offset_of!(BurstControl, heads) + 8 * slot)
            .load(Ordering::Acquire);
        let tail_word = self.word(offset_of!(BurstControl, tails) + 8 * slot);
        let mut tail = tail_word.load(Ordering::Relaxed);
        let mask = self
            .word(offset_of!(BurstControl, ring_mask))
            .load(Ordering::Relaxed);
        // SAFETY: the ring starts right after the control block and the
        // private slots; slot `slot`'s sub-ring `slot * (mask + 1)` words
        // further (the mapping holds MAX_SLOTS of them).
        let ring = unsafe {
            (self.map.as_ptr().add(CONTROL_BYTES) as *const u64).add(slot * (mask as usize + 1))
        };
        let mut n = 0;
        while tail + 2 <= head {
            let i = (tail & mask) as usize;
            // SAFETY: i + 1 <= mask (head and tail are even), in the ring.
            let (w0, w1) = unsafe {
                (
                    std::ptr::read_volatile(ring.add(i)),
                    std::ptr::read_volatile(ring.add(i + 1)),
                )
            };
            f(w0, w1);
            tail += 2;
            n += 1;
        }
        tail_word.store(tail, Ordering::Release);
        (n, head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region like the target's, with sub-rings of `words` words.
    fn region(words: u64) -> SharedRegion {
        let mut map =
            memmap2::MmapMut::map_anon(CONTROL_BYTES + MAX_SLOTS * words as usize * 8).unwrap();
        map.fill(0);
        let mut r = SharedRegion::new(map);
        r.control_mut().ring_mask = words - 1;
        r
    }

    /// What the injected writer does: two words at `heads[slot]` of the
    /// slot's sub-ring, then `heads[slot] += 2`.
    fn produce(r: &mut SharedRegion, slot: usize, w0: u64, w1: u64) {
        let (head, mask) = (r.control().heads[slot], r.control().ring_mask);
        let ring = unsafe {
            (r.map.as_mut_ptr().add(CONTROL_BYTES) as *mut u64).add(slot * (mask as usize + 1))
        };
        unsafe {
            *ring.add((head & mask) as usize) = w0;
            *ring.add(((head + 1) & mask) as usize) = w1;
        }
        r.control_mut().heads[slot] = head + 2;
    }

    /// Each slot's records come out in order across the wrap, and only
    /// from its own sub-ring.
    #[test]
    fn records_come_out_in_order_across_the_wrap() {
        let mut r = region(8);
        let mut got = vec![Vec::new(); MAX_SLOTS];
        for round in 0..5u64 {
            for slot in [0, 3, MAX_SLOTS - 1] {
                for i in 0..3 {
                    let w = slot as u64 * 1000 + round * 10 + i;
                    produce(&mut r, slot, w, !w);
                }
            }
            for (slot, got) in got.iter_mut().enumerate() {
                let (n, head) = r.take_records(slot, |w0, w1| got.push((w0, w1)));
                let used = [0, 3, MAX_SLOTS - 1].contains(&slot);
                let want = if used { (3, (round + 1) * 6) } else { (0, 0) };
                assert_eq!((n, head), want);
                assert_eq!(r.control().tails[slot], head);
            }
        }
        for (slot, got) in got.iter().enumerate() {
            let want: Vec<_> = if [0, 3, MAX_SLOTS - 1].contains(&slot) {
                (0..5u64)
                    .flat_map(|round| (0..3).map(move |i| slot as u64 * 1000 + round * 10 + i))
                    .map(|w| (w, !w))
                    .collect()
            } else {
                Vec::new()
            };
            assert_eq!(got, &want, "slot {slot}");
            assert_eq!(r.take_records(slot, |_, _| panic!("nothing new")).0, 0);
        }
    }

    /// Freeing a slot clears its tid and counts one burst fewer, never
    /// below zero.
    #[test]
    fn freeing_a_slot() {
        let mut r = region(8);
        r.control_mut().slot_tids[2] = 77;
        r.control_mut().active = 1;
        r.free_slot(2);
        assert_eq!((r.control().slot_tids[2], r.control().active), (0, 0));
        r.free_slot(2);
        assert_eq!(r.control().active, 0);
    }
}
