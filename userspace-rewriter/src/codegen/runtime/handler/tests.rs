//! Tests of [`super`] (`handler.rs`).
use burstyd_common::burst::{END_LEFT_CLONES, END_LEFT_UNSEEN, PATH_INVALID, REC_END, REC_START};

use burstyd_common::burst::{TABLES_GEN_SHIFT, TABLES_HEADER_MASK};

use super::super::asm::tag;
use burstyd_common::burst::{BurstRegs, MAX_SLOTS, TLS_REGS};

use super::super::testing::{
    CLONE_HI, CLONE_LO, Harness, Regs, TEST_PAGE, assert_within, fs0, tsc,
};
use super::{UC_RIP, UC_RSP};

/// The interrupted PC and its clone.
const PC: u64 = 0x40_3000;
const CLONE: u64 = CLONE_LO + 0x300;
const RIP: usize = UC_RIP as usize;
/// Words of the fake ucontext that are checked for stray writes.
const UC_WORDS: usize = 64;

/// What the handler may clobber (rt_sigreturn restores it all), for
/// the record: caller-saved registers except r8.
const CLOBBERS: &[&str] = &["rax", "rcx", "rdx", "rsi", "rdi", "r9", "r10", "r11"];

/// Armed, idle, `PC` rewritten, a ucontext interrupted at `PC`.
fn armed() -> Harness {
    armed_in(Harness::new())
}

fn armed_in(mut h: Harness) -> Harness {
    let c = h.ctl_mut();
    c.armed = 1;
    c.burst_len = 50;
    let mut l = h.loc_mut();
    l.owner = 0; // no burst runs
    l.path = 3;
    l.depth = 2;
    h.set_table(&[(PC - 4, CLONE - 8), (PC, CLONE), (PC + 3, CLONE + 6)]);
    for i in 0..UC_WORDS {
        h.set_uc_word(8 * i, 0xcc00 + i as u64);
    }
    h.set_uc_word(RIP, PC);
    h
}

/// handler(sig, info, ucontext), optionally with another fs base.
fn handle(h: &mut Harness, fs: Option<u64>) {
    let before = Regs {
        rdi: 40,
        rsi: 0x1234_5678,
        rdx: h.ucontext(),
        ..Regs::sentinel()
    };
    let target = h.rt.handler;
    let after = match fs {
        None => h.call(target, before),
        Some(fs) => h.call_fs(target, before, fs),
    };
    before.assert_preserved(&after, CLOBBERS);
}

/// bursts, declined: disarmed, budget, busy, pc.
fn counters(h: &Harness) -> [u64; 5] {
    let c = h.ctl();
    [
        c.bursts,
        c.declined_disarmed,
        c.declined_budget,
        c.declined_busy,
        c.declined_pc,
    ]
}

/// Nothing but the counters changed: no burst, RIP and ucontext intact.
fn assert_declined(h: &Harness, active: u32, counters_want: [u64; 5]) {
    assert_eq!(counters(h), counters_want);
    let c = h.ctl();
    assert_eq!(c.active, active);
    assert_eq!(
        (
            h.loc().owner,
            h.loc().budget,
            h.loc().path,
            h.loc().depth,
            c.heads[0]
        ),
        (0, 0, 3, 2, 0)
    );
    for i in 0..UC_WORDS {
        let want = if 8 * i == RIP { PC } else { 0xcc00 + i as u64 };
        assert_eq!(h.uc_word(8 * i), want, "ucontext word {i}");
    }
}

/// The interrupted PC was rewritten: the ucontext resumes at its clone,
/// the thread owns a fresh burst, START record (gettid, PC). With the
/// control block low (absolute operands, as injected) and high
/// (RIP-relative).
#[test]
fn starts_a_burst_at_a_rewritten_pc() {
    starts_a_burst(armed());
    starts_a_burst(armed_in(Harness::new_high()));
}

fn starts_a_burst(mut h: Harness) {
    handle(&mut h, None);
    assert_eq!(h.uc_word(RIP), CLONE);
    for i in (0..UC_WORDS).filter(|&i| 8 * i != RIP) {
        assert_eq!(h.uc_word(8 * i), 0xcc00 + i as u64, "ucontext word {i}");
    }
    assert_eq!(counters(&h), [1, 0, 0, 0, 0]);
    let c = h.ctl();
    assert_eq!((c.active, h.loc().owner, h.loc().budget), (1, fs0(), 50));
    assert_eq!(
        (h.loc().path, h.loc().depth, c.heads[0]),
        (PATH_INVALID, 0, 2)
    );
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    assert_eq!(h.ring()[..2], [tag(REC_START) | 1 << 40 | tid, PC]);
    assert_eq!(c.slot_tids[0], tid);
}

#[test]
fn disarmed_declines() {
    let mut h = armed();
    h.ctl_mut().armed = 0;
    handle(&mut h, None);
    assert_declined(&h, 0, [0, 1, 0, 0, 0]);
}

/// A child forked from the process reads its private state as zeros
/// (`present` 0): it never starts a burst of its own in the region it
/// shares with its parent.
#[test]
fn a_forked_child_declines() {
    let mut h = armed();
    h.loc_mut().present = 0;
    handle(&mut h, None);
    assert_declined(&h, 0, [0, 1, 0, 0, 0]);
}

/// `--burst 0`: back to the original code, without taking `active`.
#[test]
fn zero_burst_len_declines() {
    let mut h = armed();
    h.ctl_mut().burst_len = 0;
    handle(&mut h, None);
    assert_declined(&h, 0, [0, 0, 1, 0, 0]);
}

/// `max_bursts` bursts run already: declined, `active` kept. A bound
/// above `MAX_SLOTS` counts as `MAX_SLOTS`.
#[test]
fn busy_declines() {
    let mut h = armed();
    h.ctl_mut().active = 4;
    handle(&mut h, None);
    assert_declined(&h, 4, [0, 0, 0, 1, 0]);
    let mut h = armed();
    h.ctl_mut().max_bursts = 100;
    h.ctl_mut().active = MAX_SLOTS as u32;
    handle(&mut h, None);
    assert_declined(&h, MAX_SLOTS as u32, [0, 0, 0, 1, 0]);
}

/// A fake thread: a TCB (self-pointing, with room for the burst
/// registers at `TLS_REGS`) to run the handler with as fs base.
fn fake_thread() -> Box<FakeTcb> {
    let mut tcb = Box::new(FakeTcb([0u64; 128]));
    tcb.0[0] = tcb.0.as_ptr() as u64;
    tcb
}

/// A fake TCB, aligned like `BurstRegs` (64: a `[u64; N]` is only
/// 8-aligned, and a debug build checks the dereference).
#[repr(C, align(64))]
struct FakeTcb([u64; 128]);

impl std::ops::Deref for FakeTcb {
    type Target = [u64; 128];
    fn deref(&self) -> &[u64; 128] {
        &self.0
    }
}

/// The registers in a fake thread's TCB.
fn regs_of(tcb: &[u64; 128]) -> &BurstRegs {
    // SAFETY: TLS_REGS + a BurstRegs lie inside the 1 KiB TCB, aligned.
    unsafe { &*(tcb.as_ptr().byte_add(TLS_REGS as usize) as *const BurstRegs) }
}

/// Several threads run bursts at once, each in a slot of its own (the
/// first free one), up to `max_bursts`; then they are declined. A
/// burst's end frees its slot, which the next burst takes.
#[test]
fn bursts_run_at_once_up_to_the_bound() {
    let mut h = armed();
    h.ctl_mut().max_bursts = 3;
    let threads: Vec<_> = (0..4).map(|_| fake_thread()).collect();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    for (i, t) in threads.iter().enumerate() {
        h.set_uc_word(RIP, PC);
        handle(&mut h, Some(t.as_ptr() as u64));
        let c = h.ctl();
        if i < 3 {
            assert_eq!(h.uc_word(RIP), CLONE, "thread {i}");
            let r = regs_of(t);
            assert_eq!(r.slot, h.slot_addr(i));
            assert_eq!((r.budget, r.path, r.depth), (50, PATH_INVALID, 0));
            assert_eq!(h.slot_owner(i), t.as_ptr() as u64);
            assert_eq!((c.active, c.concurrent_max), (i as u32 + 1, i as u64 + 1));
            // Its START record in its own sub-ring: slot i, i + 1
            // bursts running.
            assert_eq!(c.heads[i], 2);
            let w0 = tag(REC_START) | (i as u64 + 1) << 40 | (i as u64) << 32;
            assert_eq!(h.sub_ring(i)[..2], [w0 | tid, PC]);
        } else {
            assert_eq!(h.uc_word(RIP), PC);
            assert_eq!(regs_of(t).slot, 0);
            assert_eq!((c.active, c.concurrent_max), (3, 3));
            assert_eq!(counters(&h), [3, 0, 0, 1, 0]);
        }
    }
    assert_eq!(h.ctl().slot_tids[..4], [tid, tid, tid, 0]);
    // Thread 1's burst ends: slot 1 is free, thread 3 takes it.
    let end = h.rt.end;
    h.call_fs(
        end,
        Regs {
            rax: END_LEFT_CLONES,
            ..Regs::sentinel()
        },
        threads[1].as_ptr() as u64,
    );
    let c = h.ctl();
    assert_eq!(
        (c.active, c.ended, c.slot_tids[1], c.heads[1]),
        (2, 1, 0, 4)
    );
    assert_eq!(h.slot_owner(1), 0);
    h.set_uc_word(RIP, PC);
    handle(&mut h, Some(threads[3].as_ptr() as u64));
    assert_eq!(h.uc_word(RIP), CLONE);
    assert_eq!(regs_of(&threads[3]).slot, h.slot_addr(1));
    assert_eq!(h.slot_owner(1), threads[3].as_ptr() as u64);
    assert_eq!((h.ctl().active, h.ctl().heads[1]), (3, 6));
    assert_eq!(h.sub_ring(1)[2..4], [tag(REC_END) | END_LEFT_CLONES, 0]);
    // Slot 1, three bursts running.
    assert_eq!(
        h.sub_ring(1)[4..6],
        [tag(REC_START) | 3 << 40 | 1 << 32 | tid, PC]
    );
}

/// A second signal during a burst, while the thread runs in the
/// clones, leaves the running burst alone.
#[test]
fn nested_signal_is_declined() {
    let mut h = armed();
    handle(&mut h, None);
    h.loc_mut().budget = 17;
    for pc in [CLONE_LO, CLONE + 2, CLONE_HI - 1] {
        h.set_uc_word(RIP, pc);
        handle(&mut h, None);
        assert_eq!(h.uc_word(RIP), pc);
    }
    assert_eq!(counters(&h), [1, 0, 0, 3, 0]);
    let c = h.ctl();
    assert_eq!(
        (c.active, h.loc().owner, h.loc().budget, c.heads[0], c.ended),
        (1, fs0(), 17, 2, 0)
    );
}

/// The burst's own thread interrupted in original code (it left the
/// clones without a check: an exception into an original landing pad,
/// a return into code that is not instrumented): that burst ends
/// (END_LEFT_UNSEEN; no record came, so its END has no ticks) and a fresh
/// one starts there, its clock not started (`burst_start` 0). Another thread at
/// the same PC is declined.
#[test]
fn a_stale_burst_of_the_same_thread_is_replaced() {
    let mut h = armed();
    h.ctl_mut().max_bursts = 1;
    handle(&mut h, None);
    h.loc_mut().budget = 17;
    h.loc_mut().depth = 3;
    // Another thread, at the bound: declined.
    let other = fake_thread();
    h.set_uc_word(RIP, PC + 3);
    handle(&mut h, Some(other.as_ptr() as u64));
    assert_eq!(h.uc_word(RIP), PC + 3);
    assert_eq!(counters(&h), [1, 0, 0, 1, 0]);
    // The burst's own thread at an original PC that was not rewritten
    // (nor is any clone there): declined, the burst left alone.
    h.set_uc_word(RIP, PC + 1);
    handle(&mut h, None);
    assert_eq!(h.uc_word(RIP), PC + 1);
    assert_eq!(counters(&h), [1, 0, 0, 2, 0]);
    assert_eq!((h.ctl().ended, h.loc().budget), (0, 17));

    h.set_uc_word(RIP, PC + 3);
    handle(&mut h, None);
    assert_eq!(h.uc_word(RIP), CLONE + 6);
    assert_eq!(counters(&h), [2, 0, 0, 2, 0]);
    let c = h.ctl();
    assert_eq!((c.active, c.ended, c.heads[0]), (1, 1, 6));
    assert_eq!(
        (
            h.loc().owner,
            h.loc().budget,
            h.loc().depth,
            h.loc().burst_start
        ),
        (fs0(), 50, 0, 0)
    );
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    assert_eq!(
        h.ring()[2..6],
        [
            tag(REC_END) | END_LEFT_UNSEEN,
            0,
            tag(REC_START) | 1 << 40 | tid,
            PC + 3
        ]
    );
}

/// The PC is not rewritten: declined, `active` released.
#[test]
fn unknown_pc_declines_and_releases() {
    let mut h = armed();
    h.set_uc_word(RIP, PC + 1);
    handle(&mut h, None);
    h.set_uc_word(RIP, PC);
    assert_declined(&h, 0, [0, 0, 0, 0, 1]);
}

/// No TLS yet: fs base 0 (fs:[0] must not even be read), or fs:[0] not
/// the TCB's own address. A self-pointing TCB is fine and is the owner.
#[test]
fn tls_must_be_set_up() {
    let mut h = armed();
    handle(&mut h, Some(0));
    assert_declined(&h, 0, [0, 0, 0, 0, 1]);

    let mut tcb = Box::new([0u64; 128]);
    tcb[0] = 0x1000;
    let at = tcb.as_ptr() as u64;
    handle(&mut h, Some(at));
    assert_declined(&h, 0, [0, 0, 0, 0, 2]);

    tcb[0] = at;
    handle(&mut h, Some(at));
    assert_eq!(h.uc_word(RIP), CLONE);
    assert_eq!((h.ctl().active, h.loc().owner), (1, at));
    assert_eq!(counters(&h), [1, 0, 0, 0, 2]);
}

/// A sub-ring more than half full (the daemon is behind) declines the
/// burst: the slot and `active` are given back, `declined_behind`
/// counts it, nothing is written. Half full or less starts it. A full
/// trace (`wait_when_full`) never declines so.
#[test]
fn a_sub_ring_more_than_half_full_declines() {
    // 16 words, half of them 8: 10 in use (tails count).
    let mut h = armed();
    h.ctl_mut().heads[0] = 30;
    h.ctl_mut().tails[0] = 20;
    handle(&mut h, None);
    assert_eq!(h.uc_word(RIP), PC);
    let c = h.ctl();
    assert_eq!((c.active, c.bursts, c.declined_behind), (0, 0, 1));
    assert_eq!((c.heads[0], c.lost_records, h.loc().owner), (30, 0, 0));
    assert_eq!(counters(&h), [0, 0, 0, 0, 0]);

    // 8 in use: room, the burst starts.
    h.ctl_mut().tails[0] = 22;
    handle(&mut h, None);
    assert_eq!(h.uc_word(RIP), CLONE);
    let c = h.ctl();
    assert_eq!((c.active, c.bursts, c.declined_behind), (1, 1, 1));
    assert_eq!((c.heads[0], c.lost_records, h.loc().owner), (32, 0, fs0()));

    // A full trace waits at a full ring instead of declining.
    let mut h = armed();
    h.ctl_mut().wait_when_full = 1;
    h.ctl_mut().heads[0] = 12;
    handle(&mut h, None);
    assert_eq!(h.uc_word(RIP), CLONE);
    let c = h.ctl();
    assert_eq!((c.bursts, c.declined_behind, c.heads[0]), (1, 0, 14));
}

/// A stand-in for the loader's code on code page 1: `call hook` at
/// `SITE` (its return site `SITE + 5`), the hook at `HOOK`. Returns
/// (hook, return site).
fn with_loader(h: &mut Harness) -> (u64, u64) {
    const SITE: usize = 0x100;
    const HOOK: usize = 0x800;
    let page = h.code_page(TEST_PAGE);
    let mut code = vec![0x90u8; 0x900];
    let rel = (HOOK as i64 - (SITE as i64 + 5)) as i32;
    code[SITE] = 0xe8;
    code[SITE + 1..SITE + 5].copy_from_slice(&rel.to_le_bytes());
    code[HOOK] = 0xc3;
    h.load(TEST_PAGE, &code);
    let c = h.ctl_mut();
    c.hook = page + HOOK as u64;
    c.hook_lo = page;
    c.hook_hi = page + 4096;
    (page + HOOK as u64, page + SITE as u64 + 5)
}

/// The thread stopped where the uprobe on the hook leaves it: `rip`,
/// with `slot` in the stack word just below `rsp`.
fn at_hook(h: &mut Harness, rip: u64, slot: u64) {
    h.set_uc_word(RIP, rip);
    let rsp = h.prog_rsp();
    h.set_ret_slot(slot);
    h.set_uc_word(UC_RSP as usize, rsp + 8);
}

/// The uprobe on the loader's link-map hook sent the signal: the
/// tables' header becomes 0 and its generation goes up, whether the
/// thread is at the hook or just back from `call hook`; no burst
/// starts, nothing else changes; lookups miss from then on. A burst
/// signal anywhere else in the loader's code (no call before the pc,
/// a call elsewhere, a stale stack slot) is an ordinary one.
#[test]
fn the_link_map_hook_invalidates_the_tables() {
    let mut h = armed();
    let header = h.ctl().tables;
    let (hook, site) = with_loader(&mut h);
    at_hook(&mut h, hook, 0);
    handle(&mut h, None);
    let c = h.ctl();
    assert_eq!(c.tables, 1 << TABLES_GEN_SHIFT);
    assert_eq!((c.link_changes, c.active, h.uc_word(RIP)), (1, 0, hook));
    assert_eq!(counters(&h), [0; 5]);

    // The daemon puts the header back with the new generation.
    h.ctl_mut().tables = (1 << TABLES_GEN_SHIFT) | header;
    at_hook(&mut h, site, site);
    handle(&mut h, None);
    let c = h.ctl();
    assert_eq!(c.tables, 2 << TABLES_GEN_SHIFT);
    assert_eq!((c.link_changes, c.active, h.uc_word(RIP)), (2, 0, site));
    assert_eq!(counters(&h), [0; 5]);
    // Without a header every lookup misses: a burst signal at a
    // rewritten pc is declined.
    h.set_uc_word(RIP, PC);
    handle(&mut h, None);
    assert_eq!(counters(&h), [0, 0, 0, 0, 1]);

    // Not the hook: a pc in the loader's code after something other
    // than `call hook`, or whose stack slot no longer holds it.
    let mut h = armed();
    let header = h.ctl().tables;
    let (_, site) = with_loader(&mut h);
    for (rip, slot) in [(site, site + 1), (site + 1, site + 1), (site - 5, site - 5)] {
        at_hook(&mut h, rip, slot);
        handle(&mut h, None);
        assert_eq!(h.ctl().tables, header, "rip {rip:#x}");
    }
    assert_eq!(h.ctl().link_changes, 0);
    assert_eq!(counters(&h), [0, 0, 0, 0, 3]);
    // No hook (0, 0): never taken.
    let mut h = armed();
    let header = h.ctl().tables;
    at_hook(&mut h, 0, 0);
    handle(&mut h, None);
    assert_eq!((h.ctl().tables, h.ctl().link_changes), (header, 0));
    assert_eq!(header & !TABLES_HEADER_MASK, 0);
}

/// A header with a generation above it is found as without one.
#[test]
fn a_header_with_a_generation_is_used() {
    let mut h = armed();
    let header = h.ctl().tables;
    h.ctl_mut().tables = header | (0xfffe << TABLES_GEN_SHIFT);
    handle(&mut h, None);
    assert_eq!(h.uc_word(RIP), CLONE);
    assert_eq!(counters(&h), [1, 0, 0, 0, 0]);
}

/// `path_start` when a burst starts: untouched without `measure`, the
/// counter with it; a declined signal never touches it.
#[test]
fn measure_starts_the_first_path() {
    let mut h = armed();
    h.loc_mut().path_start = 0x1234;
    handle(&mut h, None);
    assert_eq!((h.ctl().bursts, h.loc().path_start), (1, 0x1234));

    let mut h = armed();
    h.ctl_mut().measure = 1;
    h.loc_mut().path_start = 0x1234;
    let t0 = tsc();
    handle(&mut h, None);
    let t1 = tsc();
    assert_eq!(h.ctl().bursts, 1);
    assert_within(h.loc().path_start, t0, t1, "path_start");
    assert_eq!(h.ctl().heads[0], 2);

    let mut h = armed();
    h.ctl_mut().measure = 1;
    h.ctl_mut().armed = 0;
    h.loc_mut().path_start = 0x1234;
    handle(&mut h, None);
    assert_eq!((h.ctl().bursts, h.loc().path_start), (0, 0x1234));
}

/// Memory mode: one burst in `refs_every` records references (its
/// `refs` register set at the start to `refs_burst`, its budget to
/// `refs_burst_len`, its path records stopping after `burst_len` checks:
/// `paths_until` = the difference, 0 when it is not longer); 0 or 1:
/// every burst. The others record none and have the usual budget, their
/// path records all going out (`paths_until` 0).
#[test]
fn one_burst_in_refs_every_records_references() {
    for (every, len, want) in [
        (0, 77, [1, 1, 1, 1, 1, 1, 1]),
        (1, 77, [1, 1, 1, 1, 1, 1, 1]),
        (3, 77, [1, 0, 0, 1, 0, 0, 1]),
        (3, 40, [1, 0, 0, 1, 0, 0, 1]),
    ] {
        let mut h = armed();
        h.ctl_mut().refs_every = every;
        h.ctl_mut().refs_burst = 900;
        h.ctl_mut().refs_burst_len = len;
        let mut got = Vec::new();
        for _ in 0..want.len() {
            // The thread's earlier burst, if any, is replaced.
            h.loc_mut().refs = 7;
            h.loc_mut().paths_until = 99;
            h.set_uc_word(RIP, PC);
            handle(&mut h, None);
            assert_eq!(h.uc_word(RIP), CLONE, "a burst started");
            let (refs, budget, until) = (h.loc().refs, h.loc().budget, h.loc().paths_until);
            assert_eq!(
                (refs, budget, until),
                if refs == 0 {
                    (0, 50, 0)
                } else {
                    (900, len, len.saturating_sub(50))
                },
                "refs_every {every}"
            );
            got.push(u64::from(refs != 0));
            let head = h.ctl().heads[0];
            h.ctl_mut().tails[0] = head;
        }
        assert_eq!(got, want, "refs_every {every}");
    }
}
