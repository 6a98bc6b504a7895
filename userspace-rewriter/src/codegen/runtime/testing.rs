//! Test harness: the runtime running in the test process itself.
//!
//! One anonymous mapping holds, like the daemon's memfd in a target, a
//! [`BurstControl`] and a small ring, plus the lookup tables, a fake
//! ucontext, a stack for the routines and the code pages (mapped
//! `PROT_READ | PROT_EXEC` once loaded). [`Harness::call`] calls a routine
//! through a naked trampoline ([`regs`]) that loads every general register
//! from a [`Regs`], switches `rsp` to the harness stack so that the routine
//! sees the clone's standard frame ([`FRAME`] bytes) above it, calls, and
//! stores every register back.
use burstyd_common::burst::{
    BurstControl, BurstLocal, BurstRegs, CONTROL_BYTES, CONTROL_MAGIC, LOCAL_OFFSET, SHADOW_DEPTH,
    ShadowEntry, TLS_REGS,
};

use super::asm::FRAME;
use super::regs;
pub(super) use super::regs::{FRAME_CLOBBERS, Regs, fs0};
use super::{Runtime, assemble};

/// Words in the test ring (it wraps after 8 records).
pub(super) const RING_WORDS: usize = 16;
/// Pairs each lookup table holds at most.
pub(super) const TABLE_PAIRS: usize = 256;
/// A fake clone range (`clone_lo`, `clone_hi`); nothing runs there.
pub(super) const CLONE_LO: u64 = 0x5555_0000_0000;
pub(super) const CLONE_HI: u64 = CLONE_LO + 0x10_0000;

const PAGE: usize = crate::PAGE_SIZE as usize;
const RING: usize = CONTROL_BYTES;
const TABLE: usize = CONTROL_BYTES + 4 * 1024;
const FN_TABLE: usize = TABLE + TABLE_PAIRS * 16;
const RET_TABLE: usize = FN_TABLE + TABLE_PAIRS * 16;
/// The `TablesHeader`, after the ring (whose [`MAX_SLOTS`] sub-rings of
/// [`RING_WORDS`] take 1 KiB).
const HEADER: usize = RING + 2048;
const _: () = assert!(RING + burstyd_common::burst::MAX_SLOTS * RING_WORDS * 8 <= HEADER);
const _: () =
    assert!(HEADER + core::mem::size_of::<burstyd_common::burst::TablesHeader>() <= TABLE);
const UCONTEXT: usize = RET_TABLE + TABLE_PAIRS * 16;
const STACK: usize = UCONTEXT + PAGE;
const STACK_END: usize = STACK + 64 * 1024;
/// Code pages: the runtime's first ([`RUNTIME_PAGES`]), then one for a
/// test's own code ([`TEST_PAGE`]).
const CODE: usize = STACK_END;
const RUNTIME_PAGES: usize = 2;
pub(super) const TEST_PAGE: usize = RUNTIME_PAGES;
const CODE_PAGES: usize = RUNTIME_PAGES + 1;
const LEN: usize = CODE + CODE_PAGES * PAGE;
/// The program's rsp at the snippet (the return address slot): a page
/// below the end of the stack, so the routines' own pushes and a signal
/// frame fit below it.
const PROG_RSP: usize = STACK_END - PAGE;

const _: () = assert!(STACK.is_multiple_of(PAGE) && CODE.is_multiple_of(PAGE));

/// The time-stamp counter, as the runtime reads it.
pub(super) fn tsc() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86-64 (user mode may read
    // it unless the kernel forbids, and the runtime needs it too).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Ticks a path of the measurement tests has run before the routine is
/// called (`path_start = tsc() - PAST`), and the slack allowed beyond it
/// (a preempted test thread, a slow machine).
pub(super) const PAST: u64 = 1_000_000;
pub(super) const SLACK: u64 = 1_000_000_000;

/// The ticks of the END record whose second word is `ring[at]`: from the
/// harness's making (or a test's own `burst_start`) to the END, so more
/// than 0 and less than [`SLACK`].
#[track_caller]
pub(super) fn end_ticks(h: &Harness, at: usize) -> u64 {
    let t = h.ring()[at];
    assert_within(t, 1, SLACK, "END ticks");
    t
}

/// Asserts `v` in `lo..=hi`.
#[track_caller]
pub(super) fn assert_within(v: u64, lo: u64, hi: u64, what: &str) {
    assert!(
        (lo..=hi).contains(&v),
        "{what}: {v} not in {lo}..={hi} (lo + {}, hi - {})",
        v.wrapping_sub(lo) as i64,
        hi.wrapping_sub(v) as i64
    );
}

/// One mapping with a control block, a ring, tables, a stack and the
/// runtime loaded.
pub(super) struct Harness {
    base: *mut u8,
    pub rt: Runtime,
}

impl Harness {
    /// The control block in the low 2 GiB, as the daemon maps it: the
    /// runtime reaches it with absolute operands (each harness of the
    /// tests running in parallel at an address of its own).
    pub(super) fn new() -> Harness {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let want = 0x2000_0000 + n * (LEN as u64).next_multiple_of(1 << 20);
            assert!(want + (LEN as u64) < crate::codegen::LOW_STATE_LIMIT);
            if let Some(h) = Self::mapped(want as *mut libc::c_void, libc::MAP_FIXED_NOREPLACE) {
                return h;
            }
        }
    }

    /// A burst this thread owns, with the shadow stack `entries` (made
    /// from the program's rsp at the snippet), path 5 and budget 50.
    pub(super) fn in_burst(entries: impl FnOnce(u64) -> Vec<(u64, u64)>) -> Harness {
        let mut h = Harness::new();
        let entries = entries(h.prog_rsp());
        h.ctl_mut().active = 1;
        let mut l = h.loc_mut();
        for (i, &(rsp, path)) in entries.iter().enumerate() {
            l.shadow[i] = burstyd_common::burst::ShadowEntry {
                rsp,
                path,
                ..Default::default()
            };
        }
        l.depth = entries.len() as u64;
        l.path = 5;
        l.owner = fs0();
        l.budget = 50;
        drop(l);
        h
    }

    /// The control block wherever the kernel puts it (high): the runtime
    /// reaches it RIP-relatively.
    pub(super) fn new_high() -> Harness {
        let h = Self::mapped(std::ptr::null_mut(), 0).expect("mmap failed");
        assert!(h.base as u64 >= crate::codegen::LOW_STATE_LIMIT);
        h
    }

    fn mapped(want: *mut libc::c_void, flags: i32) -> Option<Harness> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched (MAP_FIXED_NOREPLACE fails rather than replace).
        let base = unsafe {
            libc::mmap(
                want,
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base as *mut u8;
        let control = base as u64;
        let rt = assemble(control, control + CODE as u64).expect("assemble");
        let mut h = Harness { base, rt };
        let c = h.ctl_mut();
        c.magic = CONTROL_MAGIC;
        c.ring_mask = RING_WORDS as u64 - 1;
        c.ring_addr = control + RING as u64;
        c.tables = control + HEADER as u64;
        *h.header_mut() = burstyd_common::burst::TablesHeader {
            insns: control + TABLE as u64,
            functions: control + FN_TABLE as u64,
            returns: control + RET_TABLE as u64,
            ..Default::default()
        };
        let c = h.ctl_mut();
        c.clone_lo = CLONE_LO;
        c.clone_hi = CLONE_HI;
        c.max_bursts = burstyd_common::burst::DEFAULT_MAX_BURSTS;
        // The test thread owns a burst in slot 0 unless a test says
        // otherwise (its TCB's registers: fresh, slot 0).
        let slot0 = h.at(LOCAL_OFFSET + core::mem::offset_of!(BurstLocal, slots));
        // SAFETY: the private part lies inside the mapping.
        unsafe {
            let p = &mut *(h.base.add(LOCAL_OFFSET) as *mut BurstLocal);
            p.present = 1;
            p.slots[0].index = 0;
            p.slots[0].ring = control + RING as u64;
            p.slots[0].head = control + core::mem::offset_of!(BurstControl, heads) as u64;
        }
        // SAFETY: the test thread's own TCB (`tcbhead_t.__glibc_unused2`
        // of glibc >= 2.26, which the runtime owns).
        unsafe {
            *tls_regs() = BurstRegs {
                slot: 0,
                budget: 0,
                path: 0,
                depth: 0,
                path_start: 0,
                // A burst whose clock started as the harness was made
                // (the tests of the clock set 0: not started).
                burst_start: tsc(),
                // A burst that records references (memory mode), with
                // many left to record.
                refs: 1 << 40,
                paths_until: 0,
            }
        };
        let mut l = h.loc_mut();
        l.owner = fs0();
        l.slot = slot0;
        drop(l);
        let bytes = h.rt.bytes.clone();
        assert!(
            bytes.len() <= RUNTIME_PAGES * PAGE,
            "the runtime outgrew the harness"
        );
        h.load(0, &bytes);
        Some(h)
    }

    /// The address of byte `off` of the mapping.
    fn at(&self, off: usize) -> u64 {
        self.base as u64 + off as u64
    }

    pub(super) fn ctl(&self) -> &BurstControl {
        // SAFETY: the mapping starts with CONTROL_BYTES (>= the size of a
        // BurstControl) of page-aligned, zero-initialised memory, valid for
        // any bit pattern; no routine runs while the borrow lives (calls
        // take `&mut self`).
        unsafe { &*(self.base as *const BurstControl) }
    }

    pub(super) fn ctl_mut(&mut self) -> &mut BurstControl {
        // SAFETY: as in `ctl`; `&mut self` makes the borrow unique.
        unsafe { &mut *(self.base as *mut BurstControl) }
    }

    /// The process-private burst state (here in the same mapping).
    fn private(&self) -> *mut BurstLocal {
        // SAFETY: LOCAL_OFFSET + the size of a BurstLocal is within
        // CONTROL_BYTES, page aligned.
        unsafe { self.base.add(LOCAL_OFFSET) as *mut BurstLocal }
    }

    /// The test thread's burst state, gathered: its registers (in its
    /// TCB), slot 0's owner and shadow stack and `present` (a copy).
    pub(super) fn loc(&self) -> Loc {
        // SAFETY: the private part is inside the mapping, the registers in
        // this thread's TCB; no routine runs meanwhile.
        let (p, r) = unsafe { (&*self.private(), *tls_regs()) };
        Loc {
            present: p.present,
            owner: p.slots[0].owner,
            shadow: p.slots[0].shadow,
            slot: r.slot,
            budget: r.budget,
            path: r.path,
            depth: r.depth,
            path_start: r.path_start,
            burst_start: r.burst_start,
            refs: r.refs,
            paths_until: r.paths_until,
        }
    }

    /// [`Harness::loc`] to change: written back when dropped (drop it
    /// before calling a routine).
    pub(super) fn loc_mut(&mut self) -> LocMut {
        LocMut {
            v: self.loc(),
            private: self.private(),
        }
    }

    /// The address of slot `i`.
    pub(super) fn slot_addr(&self, i: usize) -> u64 {
        self.at(LOCAL_OFFSET + core::mem::offset_of!(BurstLocal, slots))
            + (i * core::mem::size_of::<burstyd_common::burst::BurstSlot>()) as u64
    }

    /// Slot `i`'s owner.
    pub(super) fn slot_owner(&self, i: usize) -> u64 {
        // SAFETY: the private part lies inside the mapping.
        unsafe { (*self.private()).slots[i].owner }
    }

    /// Slot `i`'s sub-ring.
    pub(super) fn sub_ring(&self, i: usize) -> &[u64] {
        // SAFETY: MAX_SLOTS sub-rings of RING_WORDS words from RING lie
        // inside the mapping (checked at compile time).
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(RING + i * RING_WORDS * 8) as *const u64,
                RING_WORDS,
            )
        }
    }

    /// Slot 0's sub-ring.
    pub(super) fn ring(&self) -> &[u64] {
        // SAFETY: RING_WORDS words at RING lie inside the mapping (checked
        // at compile time), aligned, and nothing else borrows them.
        unsafe { std::slice::from_raw_parts(self.base.add(RING) as *const u64, RING_WORDS) }
    }

    pub(super) fn ring_mut(&mut self) -> &mut [u64] {
        // SAFETY: as in `ring`; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(RING) as *mut u64, RING_WORDS) }
    }

    fn write_table(&mut self, off: usize, pairs: &[(u64, u64)]) {
        assert!(pairs.len() <= TABLE_PAIRS);
        for (i, &(o, c)) in pairs.iter().enumerate() {
            // SAFETY: pair i < TABLE_PAIRS lies inside the table's area.
            unsafe {
                let p = self.base.add(off + 16 * i) as *mut u64;
                p.write(o);
                p.add(1).write(c);
            }
        }
    }

    /// The `TablesHeader` `tables` points to.
    pub(super) fn header_mut(&mut self) -> &mut burstyd_common::burst::TablesHeader {
        // SAFETY: HEADER is inside the zero-initialised control page,
        // 8-aligned, and past the BurstControl (asserted above); `&mut
        // self` makes the borrow unique.
        unsafe { &mut *(self.base.add(HEADER) as *mut burstyd_common::burst::TablesHeader) }
    }

    /// The instruction table (`insns` of the header).
    pub(super) fn set_table(&mut self, pairs: &[(u64, u64)]) {
        self.write_table(TABLE, pairs);
        self.header_mut().insns_len = pairs.len() as u64;
    }

    /// The function-entry table (`functions`).
    pub(super) fn set_fn_table(&mut self, pairs: &[(u64, u64)]) {
        self.write_table(FN_TABLE, pairs);
        self.header_mut().functions_len = pairs.len() as u64;
    }

    /// The return-site table (`returns`).
    pub(super) fn set_ret_table(&mut self, pairs: &[(u64, u64)]) {
        self.write_table(RET_TABLE, pairs);
        self.header_mut().returns_len = pairs.len() as u64;
    }

    /// The word below the return address (`[program rsp - 8]`), where
    /// `rt_exit` says where a return goes.
    pub(super) fn jump_slot(&self) -> u64 {
        // SAFETY: PROG_RSP - 8 is an aligned word inside the stack area.
        unsafe { (self.base.add(PROG_RSP - 8) as *const u64).read() }
    }

    pub(super) fn set_jump_slot(&mut self, v: u64) {
        // SAFETY: as in `jump_slot`.
        unsafe { (self.base.add(PROG_RSP - 8) as *mut u64).write(v) }
    }

    /// The program's rsp at the snippet (`[rsp + FRAME]` in a routine).
    pub(super) fn prog_rsp(&self) -> u64 {
        self.at(PROG_RSP)
    }

    /// The word at the program's rsp: the activation's return address.
    pub(super) fn ret_slot(&self) -> u64 {
        // SAFETY: PROG_RSP is an aligned word inside the stack area.
        unsafe { (self.base.add(PROG_RSP) as *const u64).read() }
    }

    pub(super) fn set_ret_slot(&mut self, v: u64) {
        // SAFETY: as in `ret_slot`.
        unsafe { (self.base.add(PROG_RSP) as *mut u64).write(v) }
    }

    /// A zeroed page standing for the handler's `ucontext_t`.
    pub(super) fn ucontext(&self) -> u64 {
        self.at(UCONTEXT)
    }

    /// The word at `off` in the fake ucontext.
    pub(super) fn uc_word(&self, off: usize) -> u64 {
        assert!(off + 8 <= PAGE);
        // SAFETY: inside the ucontext page, 8-aligned for the offsets used.
        unsafe { (self.base.add(UCONTEXT + off) as *const u64).read_unaligned() }
    }

    pub(super) fn set_uc_word(&mut self, off: usize, v: u64) {
        assert!(off + 8 <= PAGE);
        // SAFETY: as in `uc_word`.
        unsafe { (self.base.add(UCONTEXT + off) as *mut u64).write_unaligned(v) }
    }

    /// The address of code page `page`.
    pub(super) fn code_page(&self, page: usize) -> u64 {
        self.at(CODE + page * PAGE)
    }

    /// Copies `bytes` into the code pages from `page` on and makes them
    /// `PROT_READ | PROT_EXEC`.
    pub(super) fn load(&mut self, page: usize, bytes: &[u8]) {
        let len = bytes.len().next_multiple_of(PAGE).max(PAGE);
        assert!(page * PAGE + len <= CODE_PAGES * PAGE, "code too large");
        // SAFETY: the pages lie inside the mapping; they are made writable
        // before the copy and no code runs from them meanwhile.
        unsafe {
            let p = self.base.add(CODE + page * PAGE);
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            assert_eq!(libc::mprotect(p as *mut libc::c_void, len, rw), 0);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
            let rx = libc::PROT_READ | libc::PROT_EXEC;
            assert_eq!(libc::mprotect(p as *mut libc::c_void, len, rx), 0);
        }
    }

    /// Calls `target` with `regs` from a clone's standard frame: the
    /// program's rsp is [`Harness::prog_rsp`].
    pub(super) fn call(&mut self, target: u64, regs: Regs) -> Regs {
        self.call_inner(target, regs, None)
    }

    /// [`Harness::call`] with the fs base set to `fs` meanwhile.
    pub(super) fn call_fs(&mut self, target: u64, regs: Regs, fs: u64) -> Regs {
        self.call_inner(target, regs, Some(fs))
    }

    fn call_inner(&mut self, target: u64, regs: Regs, fs: Option<u64>) -> Regs {
        let code = self.code_page(0)..self.code_page(CODE_PAGES);
        assert!(code.contains(&target), "{target:#x} is not harness code");
        // After `call` pushes the return address, rsp + FRAME is the
        // program's rsp.
        let stack = self.prog_rsp() - FRAME as u64 + 8;
        // SAFETY: `target` is code loaded into this harness (checked above):
        // the runtime, or a test's code, which use only the stack below
        // `stack` (inside the harness stack, 60 KiB deep) and the mapping.
        unsafe { regs::call(target, regs, stack, fs) }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no borrow of it
        // outlives `self`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, LEN) };
    }
}

/// The calling thread's [`BurstRegs`] in its TCB (`fs:[TLS_REGS]`).
pub(super) fn tls_regs() -> *mut BurstRegs {
    (fs0() + TLS_REGS as u64) as *mut BurstRegs
}

/// See [`Harness::loc`].
#[derive(Clone, Copy)]
pub(super) struct Loc {
    pub present: u64,
    pub owner: u64,
    pub shadow: [ShadowEntry; SHADOW_DEPTH],
    pub slot: u64,
    pub budget: u64,
    pub path: u64,
    pub depth: u64,
    pub path_start: u64,
    pub burst_start: u64,
    pub refs: u64,
    pub paths_until: u64,
}

/// See [`Harness::loc_mut`].
pub(super) struct LocMut {
    v: Loc,
    private: *mut BurstLocal,
}

impl std::ops::Deref for LocMut {
    type Target = Loc;
    fn deref(&self) -> &Loc {
        &self.v
    }
}

impl std::ops::DerefMut for LocMut {
    fn deref_mut(&mut self) -> &mut Loc {
        &mut self.v
    }
}

impl Drop for LocMut {
    fn drop(&mut self) {
        let v = &self.v;
        // SAFETY: the harness's private part (still mapped: tests drop
        // these before their harness) and this thread's TCB.
        unsafe {
            let p = &mut *self.private;
            p.present = v.present;
            p.slots[0].owner = v.owner;
            p.slots[0].shadow = v.shadow;
            *tls_regs() = BurstRegs {
                slot: v.slot,
                budget: v.budget,
                path: v.path,
                depth: v.depth,
                path_start: v.path_start,
                burst_start: v.burst_start,
                refs: v.refs,
                paths_until: v.paths_until,
            };
        }
    }
}
