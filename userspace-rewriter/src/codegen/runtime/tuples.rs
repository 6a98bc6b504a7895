//! `rt_tuple` and `rt_tuple_flush`: the tuple compressors of the tuple
//! profiles (Sastry, Bodík & Smith, "Rapid Profiling via Stratified
//! Sampling"), in the target.
//!
//! The clones make a tuple ⟨site, value⟩ at every selected load (the value
//! loaded) and indirect call or jump (the original target), and hand it to
//! `rt_tuple`, which compresses the stream as the control block's
//! [`TupleConfig`](burstyd_common::burst::TupleConfig) says before
//! anything reaches the ring:
//!
//! - the exact sampler passes every tuple on (the reference);
//! - the random sampler R_r keeps each with probability 1/r (a xorshift64
//!   generator per slot, its top 24 bits against `2^24 / r - 1`);
//! - the stratified sampler H[P_r]_n hashes the tuple to one of n counters
//!   of the slot; the counter that reaches r is reset and the tuple goes on
//!   (standing for r tuples): each substream is sampled periodically, and
//!   a substream that holds few distinct tuples is counted almost exactly.
//!
//! What the sampler keeps goes through the associative table A_k (k =
//! [`TUPLE_ASSOC`], when the configuration asks for it), which merges
//! identical outputs into one record with their count: a hit adds one, a
//! full count ([`TUPLE_COUNT_MAX`]) goes out, a miss replaces the oldest
//! entry (first in, first out), which goes out. The table and the
//! counters are the slot's (private, wiped in a forked child), kept across
//! its bursts; `rt_end` calls `rt_tuple_flush` before the END record, so
//! that a burst's outputs reach the ring within it. (A burst the daemon
//! ends from outside leaves its table to the slot's next burst.)
//!
//! With `TupleConfig::reference` every tuple also goes out exactly, with
//! [`TUPLE_EXACT`] set, before the sampler sees it: an evaluation compares
//! the sampled profile with the exact one of the same stream.
use burstyd_common::burst::{
    SAMPLER_RANDOM, SAMPLER_STRATIFIED, TUPLE_ASSOC, TUPLE_CFG_ASSOC, TUPLE_CFG_RATE_SHIFT,
    TUPLE_CFG_REFERENCE, TUPLE_CFG_STRATA_SHIFT, TUPLE_CFG_THRESHOLD_SHIFT, TUPLE_COUNT_MAX,
    TUPLE_COUNT_SHIFT, TUPLE_EXACT, TUPLE_KIND_SHIFT,
};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, ecx, edi, qword_ptr, r8, r8d, r8w, rax, rcx, rdi, rdx, rsi, word_ptr,
};

use super::asm::{RipRel, field, local, owner_gate, rdtsc, slot};

/// The multiplier of the strata hash (2^64 / φ, odd).
const HASH_K: u64 = 0x9e37_79b9_7f4a_7c15;

/// One output in `w0`'s count bits.
const ONE: u64 = 1 << TUPLE_COUNT_SHIFT;

/// `rt_tuple(rax = w0, rdx = w1)`, from the standard frame: `w0` is the
/// record's first word without its count (`tag | kind << 56 | site`),
/// `w1` the value. Compresses as the module doc says; nothing for a thread
/// that does not own its slot's burst. Clobbers rax, rcx, rdx and the
/// flags.
pub(super) fn tuple(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
) -> Result<(), IcedError> {
    let mut not_owner = a.create_label();
    let mut done = a.create_label();
    let mut deliver = a.create_label();
    let mut random = a.create_label();
    let mut stratified = a.create_label();
    let mut copied = a.create_label();
    let cfg = field!(control, tuple_config);

    a.set_label(entry)?;
    owner_gate(a, control, rcx, not_owner)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    // rsi = the slot, rdi = the configuration.
    a.rip_rm(Code::Mov_r64_rm64, rsi, local!(control, slot))?;
    a.rip_rm(Code::Mov_r64_rm64, rdi, cfg)?;
    // The exact copy first (an evaluation's reference).
    a.test(edi, TUPLE_CFG_REFERENCE as u32)?;
    a.je(copied)?;
    a.push(rax)?;
    a.mov(rcx, TUPLE_EXACT << TUPLE_KIND_SHIFT | ONE)?;
    a.or(rax, rcx)?;
    a.call(emit)?;
    a.pop(rax)?;
    a.set_label(&mut copied)?;
    a.mov(ecx, edi)?;
    a.and(ecx, 3)?;
    a.cmp(ecx, SAMPLER_RANDOM as u32)?;
    a.je(random)?;
    a.cmp(ecx, SAMPLER_STRATIFIED as u32)?;
    a.je(stratified)?;
    a.jmp(deliver)?;

    // R_r: x = xorshift64(x); kept when x's top 24 bits <= the threshold.
    a.set_label(&mut random)?;
    let mut seeded = a.create_label();
    a.mov(rcx, qword_ptr(rsi + slot!(rng)))?;
    a.test(rcx, rcx)?;
    a.jne(seeded)?;
    a.push(rax)?;
    a.push(rdx)?;
    rdtsc(a)?;
    a.mov(rcx, rax)?;
    a.or(rcx, 1)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    a.set_label(&mut seeded)?;
    for (left, by) in [(true, 13), (false, 7), (true, 17)] {
        a.mov(r8, rcx)?;
        if left {
            a.shl(r8, by)?;
        } else {
            a.shr(r8, by)?;
        }
        a.xor(rcx, r8)?;
    }
    a.mov(qword_ptr(rsi + slot!(rng)), rcx)?;
    a.shr(rcx, 40)?;
    a.shr(rdi, TUPLE_CFG_THRESHOLD_SHIFT)?;
    a.cmp(rcx, rdi)?;
    a.ja(done)?;
    a.jmp(deliver)?;

    // H[P_r]_n: counter (((w1 * K) ^ w0) * K) >> 32 & (n - 1) of the slot;
    // at r it is reset and the tuple goes on.
    a.set_label(&mut stratified)?;
    let mut counted = a.create_label();
    a.mov(r8, HASH_K)?;
    a.mov(rcx, rdx)?;
    a.imul_2(rcx, r8)?;
    a.xor(rcx, rax)?;
    a.imul_2(rcx, r8)?;
    a.shr(rcx, 32)?;
    a.mov(r8, rdi)?;
    a.shr(r8, TUPLE_CFG_STRATA_SHIFT)?;
    a.and(r8d, 0xffff)?;
    a.and(rcx, r8)?;
    a.lea(rcx, qword_ptr(rsi + rcx * 2 + slot!(strata)))?;
    a.movzx(r8d, word_ptr(rcx))?;
    a.add(r8d, 1)?;
    a.shr(rdi, TUPLE_CFG_RATE_SHIFT)?;
    a.and(edi, 0xffff)?;
    a.cmp(r8d, edi)?;
    a.jb(counted)?;
    a.mov(word_ptr(rcx), 0)?;
    a.jmp(deliver)?;
    a.set_label(&mut counted)?;
    a.mov(word_ptr(rcx), r8w)?;
    a.jmp(done)?;

    // What the sampler kept: straight to the ring, or into the table.
    a.set_label(&mut deliver)?;
    let mut table = a.create_label();
    a.rip_mi(Code::Test_rm64_imm32, cfg, TUPLE_CFG_ASSOC as i32)?;
    a.jne(table)?;
    a.mov(rcx, ONE)?;
    a.or(rax, rcx)?;
    a.call(emit)?;
    a.jmp(done)?;

    // A_k: rdi walks the entries, r8 is their end.
    a.set_label(&mut table)?;
    let mut search = a.create_label();
    let mut next = a.create_label();
    let mut store = a.create_label();
    a.lea(rdi, qword_ptr(rsi + slot!(assoc)))?;
    a.lea(r8, qword_ptr(rdi + (TUPLE_ASSOC * 16) as i32))?;
    a.set_label(&mut search)?;
    // Same tag, kind and site (the count bits aside), and same value.
    a.mov(rcx, qword_ptr(rdi))?;
    a.xor(rcx, rax)?;
    a.shl(rcx, 64 - TUPLE_COUNT_SHIFT)?;
    a.jne(next)?;
    a.mov(rcx, qword_ptr(rdi))?;
    a.xor(rcx, rax)?;
    a.shr(rcx, TUPLE_KIND_SHIFT)?;
    a.jne(next)?;
    a.cmp(qword_ptr(rdi + 8), rdx)?;
    a.jne(next)?;
    // A hit (a free entry's word is 0: no tag, never equal): one more;
    // a full count goes out and frees the entry.
    a.mov(rcx, ONE)?;
    a.add(qword_ptr(rdi), rcx)?;
    a.mov(rcx, qword_ptr(rdi))?;
    a.shr(rcx, TUPLE_COUNT_SHIFT)?;
    a.and(ecx, TUPLE_COUNT_MAX as u32)?;
    a.cmp(ecx, TUPLE_COUNT_MAX as u32)?;
    a.jb(done)?;
    a.mov(rax, qword_ptr(rdi))?;
    a.mov(rdx, qword_ptr(rdi + 8))?;
    a.mov(qword_ptr(rdi), 0)?;
    a.call(emit)?;
    a.jmp(done)?;
    a.set_label(&mut next)?;
    a.add(rdi, 16)?;
    a.cmp(rdi, r8)?;
    a.jb(search)?;
    // A miss: the oldest entry makes room (out first if it is in use).
    a.mov(rcx, qword_ptr(rsi + slot!(assoc_next)))?;
    a.lea(r8, qword_ptr(rcx + 1))?;
    a.and(r8, (TUPLE_ASSOC - 1) as i32)?;
    a.mov(qword_ptr(rsi + slot!(assoc_next)), r8)?;
    a.shl(rcx, 4)?;
    a.lea(rdi, qword_ptr(rsi + rcx + slot!(assoc)))?;
    a.cmp(qword_ptr(rdi), 0)?;
    a.je(store)?;
    a.push(rax)?;
    a.push(rdx)?;
    a.mov(rax, qword_ptr(rdi))?;
    a.mov(rdx, qword_ptr(rdi + 8))?;
    a.call(emit)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    a.set_label(&mut store)?;
    a.mov(rcx, ONE)?;
    a.or(rax, rcx)?;
    a.mov(qword_ptr(rdi), rax)?;
    a.mov(qword_ptr(rdi + 8), rdx)?;

    a.set_label(&mut done)?;
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.set_label(&mut not_owner)?;
    a.ret()
}

/// `rt_tuple_flush()`: every entry of the calling thread's associative
/// table goes out (in table order) and is freed; nothing for a thread that
/// does not own its slot's burst. Called by `rt_end` before the END
/// record. Clobbers rax, rcx, rdx and the flags.
pub(super) fn flush(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
) -> Result<(), IcedError> {
    let mut not_owner = a.create_label();
    let mut each = a.create_label();
    let mut free = a.create_label();
    a.set_label(entry)?;
    owner_gate(a, control, rcx, not_owner)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.rip_rm(Code::Mov_r64_rm64, rsi, local!(control, slot))?;
    a.lea(rdi, qword_ptr(rsi + slot!(assoc)))?;
    a.lea(rsi, qword_ptr(rdi + (TUPLE_ASSOC * 16) as i32))?;
    a.set_label(&mut each)?;
    a.mov(rax, qword_ptr(rdi))?;
    a.test(rax, rax)?;
    a.je(free)?;
    a.mov(rdx, qword_ptr(rdi + 8))?;
    a.mov(qword_ptr(rdi), 0)?;
    a.call(emit)?;
    a.set_label(&mut free)?;
    a.add(rdi, 16)?;
    a.cmp(rdi, rsi)?;
    a.jb(each)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.set_label(&mut not_owner)?;
    a.ret()
}

/// The configuration word's compile-time check: the fields the routine
/// reads with 32-bit operations lie where it reads them.
const _: () = {
    assert!(TUPLE_CFG_REFERENCE < 1 << 31 && TUPLE_CFG_ASSOC < 1 << 31);
    assert!(TUPLE_CFG_RATE_SHIFT + 16 <= TUPLE_CFG_THRESHOLD_SHIFT);
    assert!(TUPLE_ASSOC.is_power_of_two());
};

#[cfg(test)]
mod tests {
    use burstyd_common::burst::{
        REC_END, REC_TUPLE, SAMPLER_RANDOM, SAMPLER_STRATIFIED, TUPLE_COUNT_MAX, TUPLE_COUNT_SHIFT,
        TUPLE_EXACT, TUPLE_KIND_SHIFT, TUPLE_TARGET, TUPLE_VALUE, TupleConfig,
    };

    use super::super::asm::tag;
    use super::super::testing::{FRAME_CLOBBERS, Harness, Regs, fs0};
    use super::ONE;

    /// `w0` of a tuple of `kind` at `site`, without its count.
    fn w0(kind: u64, site: u64) -> u64 {
        tag(REC_TUPLE) | kind << TUPLE_KIND_SHIFT | site
    }

    /// A harness whose thread owns a burst, with the compressor `cfg`.
    fn harness(cfg: TupleConfig) -> Harness {
        let mut h = Harness::new();
        h.ctl_mut().tuple_config = cfg.to_word();
        let mut l = h.loc_mut();
        l.owner = fs0();
        l.budget = 1000;
        drop(l);
        h
    }

    /// The words the routine at `at` writes for `(w0, w1)`, consumed (the
    /// test ring holds 8 records); checks that it clobbers no more than
    /// the standard frame allows.
    fn call(h: &mut Harness, at: u64, w0: u64, w1: u64) -> Vec<u64> {
        let head = h.ctl().heads[0];
        let before = Regs {
            rax: w0,
            rdx: w1,
            ..Regs::sentinel()
        };
        let after = h.call(at, before);
        before.assert_preserved(&after, FRAME_CLOBBERS);
        let written = (h.ctl().heads[0] - head) as usize;
        assert!(written <= 16, "the test ring wrapped");
        let ring = h.ring();
        let out = (0..written)
            .map(|i| ring[(head as usize + i) % 16])
            .collect();
        let c = h.ctl_mut();
        c.tails[0] = c.heads[0];
        out
    }

    fn tuple(h: &mut Harness, w0: u64, w1: u64) -> Vec<u64> {
        let at = h.rt.tuple;
        call(h, at, w0, w1)
    }

    fn flush(h: &mut Harness) -> Vec<u64> {
        let at = h.rt.tuple_flush;
        call(h, at, 0, 0)
    }

    /// `(w0 without its count, w1, count)` of the records in `words`.
    fn records(words: &[u64]) -> Vec<(u64, u64, u64)> {
        let mask = TUPLE_COUNT_MAX << TUPLE_COUNT_SHIFT;
        words
            .chunks(2)
            .map(|r| (r[0] & !mask, r[1], (r[0] & mask) >> TUPLE_COUNT_SHIFT))
            .collect()
    }

    /// The exact sampler without a table writes every tuple, count 1, as
    /// it came; a thread that does not own the burst writes nothing.
    #[test]
    fn exact_writes_every_tuple() {
        let mut h = harness(TupleConfig::default());
        let a = w0(TUPLE_VALUE, 0x40_1000);
        let b = w0(TUPLE_TARGET, 0x7f00_0040_2000);
        assert_eq!(tuple(&mut h, a, 7), [a | ONE, 7]);
        assert_eq!(tuple(&mut h, a, 7), [a | ONE, 7]);
        assert_eq!(tuple(&mut h, b, 0x40_3000), [b | ONE, 0x40_3000]);
        h.loc_mut().owner = 0;
        assert_eq!(tuple(&mut h, a, 7), [] as [u64; 0]);
        h.loc_mut().owner = fs0();
        assert_eq!(flush(&mut h), [] as [u64; 0], "no table");
    }

    /// With the table, identical outputs merge until the burst's end
    /// (the flush writes each entry once, with its count, and frees it);
    /// the seventeenth distinct tuple pushes the oldest out; a count that
    /// reaches the maximum goes out at once.
    #[test]
    fn the_table_merges_identical_outputs() {
        let mut h = harness(TupleConfig {
            assoc: true,
            ..Default::default()
        });
        let a = w0(TUPLE_VALUE, 0x40_1000);
        let b = w0(TUPLE_TARGET, 0x40_1000);
        for _ in 0..10 {
            assert_eq!(tuple(&mut h, a, 7), [] as [u64; 0]);
        }
        // Another kind at the same site, another value: other entries.
        assert_eq!(tuple(&mut h, b, 7), [] as [u64; 0]);
        assert_eq!(tuple(&mut h, a, 8), [] as [u64; 0]);
        assert_eq!(records(&flush(&mut h)), [(a, 7, 10), (b, 7, 1), (a, 8, 1)]);
        assert_eq!(flush(&mut h), [] as [u64; 0], "freed");
        // 16 distinct tuples fill the table; the 17th evicts the oldest.
        for v in 0..16 {
            assert_eq!(tuple(&mut h, a, 100 + v), [] as [u64; 0]);
        }
        assert_eq!(tuple(&mut h, a, 100), [] as [u64; 0], "a hit");
        assert_eq!(records(&tuple(&mut h, a, 999)), [(a, 100, 2)]);
        assert_eq!(records(&tuple(&mut h, a, 998)), [(a, 101, 1)]);
        // 16 entries go out: 8 fill the test ring, 8 are lost.
        let lost = h.ctl().lost_records;
        assert_eq!(records(&flush(&mut h)).len(), 8);
        assert_eq!(h.ctl().lost_records - lost, 8);
        h.loc_mut().budget = 1000;
        // A full count goes out and frees its entry.
        for _ in 0..TUPLE_COUNT_MAX - 1 {
            assert_eq!(tuple(&mut h, a, 5), [] as [u64; 0]);
        }
        assert_eq!(records(&tuple(&mut h, a, 5)), [(a, 5, TUPLE_COUNT_MAX)]);
        assert_eq!(flush(&mut h), [] as [u64; 0]);
    }

    /// H[P_r]_n: every r-th tuple of a stratum goes out, the counters
    /// carrying over from one burst to the next; with one counter (n
    /// of 1) it is the periodic sampler P_r over the whole stream. Each
    /// tuple's outputs times r are its count to within r - 1 when it has
    /// a stratum of its own.
    #[test]
    fn stratified_keeps_every_rth_tuple_of_each_stratum() {
        let cfg = |strata| TupleConfig {
            sampler: SAMPLER_STRATIFIED,
            strata,
            rate: 4,
            ..Default::default()
        };
        let a = w0(TUPLE_VALUE, 0x40_1000);
        let mut h = harness(cfg(1));
        let mut out = Vec::new();
        for i in 0..40u64 {
            out.extend(records(&tuple(&mut h, a, i % 3)));
        }
        // The 4th, 8th, ... of the stream: values 3, 7, ... mod 3.
        let want: Vec<_> = (1..=10).map(|k| (a, (4 * k - 1) % 3, 1)).collect();
        assert_eq!(out, want);

        // 4096 strata: two tuples in strata of their own (the hash says
        // so), 40 and 24 times, interleaved: 10 and 6 outputs.
        let stratum = |v: u64| {
            let k = super::HASH_K;
            ((v.wrapping_mul(k) ^ a).wrapping_mul(k) >> 32) & 4095
        };
        assert_ne!(stratum(0x1000), stratum(0x1001));
        let mut h = harness(cfg(4096));
        let stream = (0..64u64).map(|i| 0x1000 + u64::from(i % 8 < 3 && i < 61));
        let mut outputs = [0; 2];
        let mut seen = [0; 2];
        for v in stream {
            seen[(v - 0x1000) as usize] += 1;
            for (_, value, count) in records(&tuple(&mut h, a, v)) {
                outputs[(value - 0x1000) as usize] += count;
            }
        }
        assert_eq!(seen, [40, 24]);
        assert_eq!(outputs, [10, 6]);
    }

    /// R_r keeps each tuple with probability 1/r: 8,000 tuples at r = 8
    /// give 1,000 outputs on average (binomial, standard deviation 30);
    /// at r = 1 every tuple goes out.
    #[test]
    fn random_keeps_one_in_r_on_average() {
        let a = w0(TUPLE_VALUE, 0x40_1000);
        let mut h = harness(TupleConfig {
            sampler: SAMPLER_RANDOM,
            rate: 8,
            ..Default::default()
        });
        let kept: usize = (0..8000).map(|i| records(&tuple(&mut h, a, i)).len()).sum();
        assert!((850..=1150).contains(&kept), "{kept} kept of 8000");
        let mut h = harness(TupleConfig {
            sampler: SAMPLER_RANDOM,
            rate: 1,
            ..Default::default()
        });
        let kept: usize = (0..100).map(|i| records(&tuple(&mut h, a, i)).len()).sum();
        assert_eq!(kept, 100);
    }

    /// With exact copies, every tuple goes out first exactly (kind bit
    /// `TUPLE_EXACT`, count 1), then as the sampler and table make it.
    #[test]
    fn exact_copies_come_first() {
        let mut h = harness(TupleConfig {
            sampler: SAMPLER_STRATIFIED,
            strata: 1,
            rate: 2,
            assoc: false,
            reference: true,
        });
        let a = w0(TUPLE_TARGET, 0x40_1000);
        let copy = a | TUPLE_EXACT << TUPLE_KIND_SHIFT;
        assert_eq!(records(&tuple(&mut h, a, 9)), [(copy, 9, 1)]);
        assert_eq!(records(&tuple(&mut h, a, 9)), [(copy, 9, 1), (a, 9, 1)]);
    }

    /// `rt_end` empties the table before its END record.
    #[test]
    fn the_bursts_end_flushes_the_table() {
        let mut h = harness(TupleConfig {
            assoc: true,
            ..Default::default()
        });
        h.ctl_mut().active = 1;
        let a = w0(TUPLE_VALUE, 0x40_1000);
        tuple(&mut h, a, 1);
        tuple(&mut h, a, 1);
        tuple(&mut h, a, 2);
        let at = h.rt.end;
        let words = call(&mut h, at, 0, 0);
        assert_eq!(records(&words[..4]), [(a, 1, 2), (a, 2, 1)]);
        assert_eq!(words[4] >> 60, REC_END);
        assert_eq!(h.loc().owner, 0);
    }
}
