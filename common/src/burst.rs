//! Bursty tracing: the memory the injected runtime in a target process
//! shares with the daemon, and the eBPF map entry that arms it.
//!
//! The daemon maps a memfd into the target (`MAP_SHARED`) and into itself:
//! page 0 holds a [`BurstControl`], then come [`LOCAL_BYTES`] the target
//! maps over with private memory of its own (a [`BurstLocal`], see there),
//! then, from [`CONTROL_BYTES`], `ring_words` u64 words of records, split
//! into [`MAX_SLOTS`] equal sub-rings, one per burst slot: several threads
//! of one process may run bursts at once (at most
//! [`BurstControl::max_bursts`]), each in a slot of its own, and only the
//! thread that owns a slot writes that slot's sub-ring (single producer
//! per sub-ring, `heads[slot]`); the daemon consumes (`tails[slot]`). The
//! generated code in the target reaches every field at fixed offsets, so
//! the layout is part of the contract between `userspace-rewriter::clone`
//! and the daemon.
//!
//! Why several slots: a multi-threaded server's busy threads should all
//! get bursts in proportion to their CPU time. With one burst per process,
//! a thread whose overflow fell while another thread's burst ran got none.
//!
//! # Per-thread state in the TCB
//!
//! The clones have no free register, so they cannot index a slot on every
//! path increment or check. Each thread's burst registers ([`BurstRegs`]:
//! the pointer to its slot, budget, path register, shadow depth, path
//! start) live in its own glibc thread control block, at `fs:`[`TLS_REGS`]:
//! glibc's `tcbhead_t` (sysdeps/x86_64/nptl/tls.h) has `__glibc_unused2`,
//! 512 bytes at offset 0x80 that no glibc since 2.26 reads or writes (2.25
//! and older saved vector registers there in `_dl_runtime_resolve`, as
//! `rtld_savespace_sse`; the field is kept only for the size of
//! `tcbhead_t`). An increment stays one instruction (`add qword
//! fs:[0x88], imm32`). This is only sound in a process whose libc is glibc
//! 2.26 or later: the daemon checks that before it injects anything, and a
//! process without it gets no bursts (logged, see `bursts/attach`).
//!
//! The slot itself ([`BurstSlot`]: owner, shadow stack) is in the
//! process-private [`BurstLocal`] (`MADV_WIPEONFORK`): a forked child
//! inherits its parent's TCB, slot pointer included, but reads the slot's
//! `owner` as 0, so it never passes a check nor writes a record.

/// Defines [`BurstControl`] and [`CONTROL_FIELDS`] from one field list, so
/// that the list the `layout` test pins cannot miss a field.
macro_rules! control_block {
    (
        $fields:ident;
        $(#[$sm:meta])*
        pub struct $name:ident {
            $( $(#[$fm:meta])* pub $f:ident : $t:ty ),* $(,)?
        }
    ) => {
        $(#[$sm])*
        #[repr(C, align(64))]
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            $( $(#[$fm])* pub $f: $t ),*
        }

        /// `(name, offset, size)` of every field, in declaration order.
        pub const $fields: &[(&str, usize, usize)] = &[
            $( (stringify!($f), core::mem::offset_of!($name, $f), core::mem::size_of::<$t>()) ),*
        ];
    };
}

/// `BurstControl::magic`: the version of the layout. It changes whenever
/// [`CONTROL_FIELDS`] does; the `layout` test below fails until it has.
pub const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"burstyde");
/// Burst slots per process: bursts that may run at once, at most (the
/// daemon sets [`BurstControl::max_bursts`] at or below it).
pub const MAX_SLOTS: usize = 8;
/// [`BurstControl::max_bursts`] unless the daemon is told otherwise.
pub const DEFAULT_MAX_BURSTS: u64 = 4;
/// Offset of a thread's [`BurstRegs`] from its thread pointer (`fs:0`):
/// glibc's `tcbhead_t.__glibc_unused2` (see the module doc).
pub const TLS_REGS: u32 = 0x80;
/// Bytes of `tcbhead_t.__glibc_unused2` from [`TLS_REGS`].
pub const TLS_REGS_ROOM: usize = 512;
/// Saved path registers (one per instrumented activation in a burst).
pub const SHADOW_DEPTH: usize = 1024;
/// Set in the path register when the path's start was not observed (the
/// burst began mid-path, or the activation is older than the burst).
pub const PATH_INVALID: u64 = 1 << 63;

/// Record tags: bits 60..64 of a record's first word. Every record is
/// two words.
/// A burst started: `w0 = tag | running << START_RUNNING_SHIFT | slot <<
/// START_SLOT_SHIFT | tid`, `w1` = the interrupted pc. `running`: the
/// bursts running in the process right after this one's claim (itself
/// included; 8 bits), `slot`: its slot (8 bits).
pub const REC_START: u64 = 1;
/// See [`REC_START`].
pub const START_SLOT_SHIFT: u32 = 32;
pub const START_RUNNING_SHIFT: u32 = 40;
/// An instrumented function was entered: `w0 = tag | fid`, `w1 = 0`.
pub const REC_ENTER: u64 = 2;
/// A path ended: `w0 = tag | kind << 32 | fid`, `w1 = path register`.
pub const REC_PATH: u64 = 3;
/// The burst ended: `w0 = tag | reason`, `w1` = time-stamp-counter ticks
/// from the burst's first record after its START to its end (0: no record
/// came between them). A burst ended by the signal handler
/// ([`END_LEFT_CLONES`]) was over earlier than that, at a point nobody saw.
pub const REC_END: u64 = 4;
/// A jump moved the thread to another frame further up its stack (an
/// exception landing in a handler, `longjmp`): `w0 = tag`, `w1` = the
/// depth of the runtime's shadow stack once the frames left were dropped.
pub const REC_UNWIND: u64 = 5;
/// The measured cost of the path whose `REC_PATH` record comes right
/// before it (only with [`BurstControl::measure`]): `w0 = tag`, `w1` =
/// time-stamp-counter ticks (`rdtsc`) of the path, exclusive of the
/// functions it called (and, as far as it can, of the runtime's own
/// record writing).
pub const REC_COST: u64 = 6;

/// A data reference in memory mode (`--record refs`): `w0 = tag | kind <<
/// REF_KIND_SHIFT | pc`, `w1` = the effective address. `pc` is the
/// original instruction's address (AVMA; below 2^56), `kind` one of
/// [`REF_LOAD`], [`REF_STORE`], [`REF_RMW`]. Written before the
/// instruction runs (an access that faults was still recorded).
pub const REC_REF: u64 = 7;
/// See [`REC_REF`].
pub const REF_KIND_SHIFT: u32 = 56;
pub const REF_LOAD: u64 = 0;
pub const REF_STORE: u64 = 1;
/// A read-modify-write (`add [m], r`, `lock xadd`, ...).
pub const REF_RMW: u64 = 2;

/// A tuple of the tuple profiles (`--record values,targets`; Sastry,
/// Bodík & Smith's stream compression): `w0 = tag | kind <<
/// TUPLE_KIND_SHIFT | count << TUPLE_COUNT_SHIFT | site`, `w1` = the
/// value. `site` is the original instruction's address (AVMA; below
/// 2^47); `kind` one of [`TUPLE_VALUE`] (⟨load, value loaded⟩, `w1` the
/// destination register after the load) and [`TUPLE_TARGET`] (⟨indirect
/// call or jump, target⟩, `w1` the original target), with
/// [`TUPLE_EXACT`] set on the exact copy made for an evaluation
/// ([`TupleConfig::reference`]). `count`: the compressor's outputs this
/// record stands for (1 to [`TUPLE_COUNT_MAX`], merged by the
/// associative table); each output stands for one tuple with the exact
/// sampler (and on an exact copy), for `rate` tuples with the others.
pub const REC_TUPLE: u64 = 8;
/// See [`REC_TUPLE`].
pub const TUPLE_KIND_SHIFT: u32 = 56;
pub const TUPLE_VALUE: u64 = 0;
pub const TUPLE_TARGET: u64 = 1;
/// Kind bit of an exact copy (see [`TupleConfig::reference`]).
pub const TUPLE_EXACT: u64 = 8;
pub const TUPLE_COUNT_SHIFT: u32 = 47;
pub const TUPLE_COUNT_MAX: u64 = (1 << 9) - 1;
/// Bits of `w0` that hold the site.
pub const TUPLE_SITE_MASK: u64 = (1 << TUPLE_COUNT_SHIFT) - 1;
/// Entries of a slot's associative table (the paper's A_k).
pub const TUPLE_ASSOC: usize = 16;
/// Counters of a slot's stratified sampler at most (the paper's n).
pub const MAX_STRATA: usize = 4096;

/// The tuple compressors ([`TupleConfig::sampler`]).
pub const SAMPLER_EXACT: u64 = 0;
/// R_r: each tuple kept with probability 1/r.
pub const SAMPLER_RANDOM: u64 = 1;
/// H[P_r]_n: a hash of the tuple picks one of n counters; every r-th
/// tuple of a counter is kept.
pub const SAMPLER_STRATIFIED: u64 = 2;

/// How the runtime compresses tuples, in one word
/// ([`BurstControl::tuple_config`], set by the daemon; 0: the exact
/// sampler, no table). The one encoding for the daemon and the runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TupleConfig {
    /// [`SAMPLER_EXACT`], [`SAMPLER_RANDOM`] or [`SAMPLER_STRATIFIED`].
    pub sampler: u64,
    /// Merge identical outputs in the associative table (A_k) before the
    /// ring.
    pub assoc: bool,
    /// Also write every tuple exactly, [`TUPLE_EXACT`] set (an
    /// evaluation's reference, from the same stream).
    pub reference: bool,
    /// Counters of the stratified sampler, a power of two up to
    /// [`MAX_STRATA`].
    pub strata: u64,
    /// The sampling rate r (1 to 65535).
    pub rate: u64,
}

/// [`TupleConfig`]'s bits: the sampler (0..2), the table (2), the exact
/// copies (3), the strata minus one (8..24), the rate (24..40), and the
/// random sampler's threshold `2^24 / rate - 1` (40..64: a tuple is kept
/// when the top 24 bits of its random number are at or below it).
pub const TUPLE_CFG_ASSOC: u64 = 1 << 2;
pub const TUPLE_CFG_REFERENCE: u64 = 1 << 3;
pub const TUPLE_CFG_STRATA_SHIFT: u32 = 8;
pub const TUPLE_CFG_RATE_SHIFT: u32 = 24;
pub const TUPLE_CFG_THRESHOLD_SHIFT: u32 = 40;

impl TupleConfig {
    /// The word the runtime reads (see [`TUPLE_CFG_ASSOC`]); a rate of 0
    /// counts as 1, strata are rounded up to a power of two and bounded
    /// by [`MAX_STRATA`].
    pub fn to_word(&self) -> u64 {
        let rate = self.rate.clamp(1, 0xffff);
        let strata = self.strata.clamp(1, MAX_STRATA as u64).next_power_of_two();
        (self.sampler & 3)
            | if self.assoc { TUPLE_CFG_ASSOC } else { 0 }
            | if self.reference {
                TUPLE_CFG_REFERENCE
            } else {
                0
            }
            | (strata - 1) << TUPLE_CFG_STRATA_SHIFT
            | rate << TUPLE_CFG_RATE_SHIFT
            | ((1 << 24) / rate - 1) << TUPLE_CFG_THRESHOLD_SHIFT
    }

    /// The configuration of a word [`Self::to_word`] made.
    pub fn from_word(w: u64) -> Self {
        TupleConfig {
            sampler: w & 3,
            assoc: w & TUPLE_CFG_ASSOC != 0,
            reference: w & TUPLE_CFG_REFERENCE != 0,
            strata: ((w >> TUPLE_CFG_STRATA_SHIFT) & 0xffff) + 1,
            rate: ((w >> TUPLE_CFG_RATE_SHIFT) & 0xffff).max(1),
        }
    }

    /// The tuples one output of the sampler stands for.
    pub fn weight(&self) -> u64 {
        if self.sampler == SAMPLER_EXACT {
            1
        } else {
            self.rate.max(1)
        }
    }
}

/// `REC_PATH` kinds.
pub const PATH_END_RETURN: u64 = 0;
pub const PATH_END_BACK_EDGE: u64 = 1;
pub const PATH_END_TAIL: u64 = 2;
/// The path ended at a call that does not return, or a jump out of the
/// clones (to a `.cold` part).
pub const PATH_END_NORETURN: u64 = 3;

/// `REC_END` reasons.
pub const END_BUDGET: u64 = 0;
pub const END_LEFT_CLONES: u64 = 1;
/// The thread had left the clones where no check saw it (a return into
/// code without clones from a routine that could not tell, an exception
/// landing in an original handler, `longjmp`); the signal handler ended
/// the burst at the thread's next burst signal, so its END record's ticks
/// run past the burst's real end.
pub const END_LEFT_UNSEEN: u64 = 2;

/// `BurstControl::measure` values.
pub const MEASURE_NONE: u64 = 0;
/// Measure each path with the time-stamp counter (`REC_COST`), read as
/// `lfence; rdtsc` (see the runtime's `asm`). Time, not the
/// sampled hardware event with `rdpmc` as Ammons, Ball & Larus read it:
/// user-mode `rdpmc` works only in a process that has mmapped a perf
/// event of its own (the kernel enables it per mm), which a transparent
/// injection does not do.
pub const MEASURE_TSC: u64 = 1;

/// Mask of the tag bits.
pub const TAG_SHIFT: u32 = 60;

/// One saved activation of the runtime's shadow stack: 32 bytes, so the
/// runtime indexes it with a shift (`shl 5`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ShadowEntry {
    /// `rsp` at the activation's entry (points at its return address).
    pub rsp: u64,
    /// The caller's path register.
    pub path: u64,
    /// With [`BurstControl::measure`]: the time-stamp-counter ticks the
    /// caller's path had run when it made the call (`rdtsc - path_start`
    /// at `rt_enter`); the return restores `path_start = rdtsc - elapsed`,
    /// so that the caller's path cost excludes the callee. Not written
    /// without `measure`.
    pub elapsed: u64,
    pub _pad: u64,
}

/// Bytes of a [`ShadowEntry`] (a power of two).
pub const SHADOW_ENTRY_SHIFT: u32 = 5;
const _: () = assert!(core::mem::size_of::<ShadowEntry>() == 1 << SHADOW_ENTRY_SHIFT);

control_block! {
    CONTROL_FIELDS;
    /// Page 0 of the shared memory. Field order is ABI (see the module doc):
    /// the injected runtime reaches every field at a fixed offset, the eBPF
    /// program reads `armed`/`active`. [`CONTROL_FIELDS`] lists them all and
    /// the `layout` test pins that list to [`CONTROL_MAGIC`].
    pub struct BurstControl {
        pub magic: u64,
        /// Non-zero: the signal handler may start bursts (the daemon clears
        /// it to disarm; running bursts end at their next check).
        pub armed: u32,
        /// Bursts running (the handler adds one with `lock xadd` before it
        /// claims a slot, a burst's end takes it away). The eBPF program
        /// reads it beside `armed` to avoid signalling a process that runs
        /// [`Self::max_bursts`] bursts already.
        pub active: u32,
        /// Bursts that may run at once (set by the daemon, 1 to
        /// [`MAX_SLOTS`]; the handler treats anything above as
        /// [`MAX_SLOTS`]).
        pub max_bursts: u64,
        /// Checks per burst (set by the daemon; `u64::MAX`: full trace).
        pub burst_len: u64,
        /// The highest number of bursts that ran at once (`active` right
        /// after a claim; updated without a lock: a race may lose a
        /// maximum, never invent one).
        pub concurrent_max: u64,
        /// Words of one sub-ring minus one (a power of two minus one); the
        /// ring holds [`MAX_SLOTS`] of them.
        pub ring_mask: u64,
        /// The ring's address in the target (slot `i`'s sub-ring starts
        /// `i * (ring_mask + 1)` words further).
        pub ring_addr: u64,
        /// The [`TablesHeader`] of the runtime's lookup tables (of every
        /// module with clones) in bits 0..48, and a generation in bits
        /// 48..64 ([`TABLES_GEN_SHIFT`]). One word, so that a later attach
        /// of more modules (shared libraries, `dlopen`) swaps all three
        /// tables at once with a single store while the program runs: a
        /// lookup that loaded the old header searches the old tables, which
        /// stay. A header of 0 means no tables: every lookup misses. The
        /// handler sets it so (and bumps the generation) when the loader's
        /// link map is about to change ([`BurstControl::hook_lo`]); the
        /// daemon puts a header back with `lock cmpxchg` against the word it
        /// read before it looked at the maps, so that it never installs
        /// tables made before a change it has not seen.
        pub tables: u64,
        /// Counters kept by the target side.
        pub bursts: u64,
        pub declined_busy: u64,
        pub declined_pc: u64,
        pub declined_disarmed: u64,
        pub lost_records: u64,
        pub shadow_overflow: u64,
        pub truncated: u64,
        pub ended: u64,
        /// `[clone_lo, clone_hi)`: the generated code (return addresses in
        /// it need no translation).
        pub clone_lo: u64,
        pub clone_hi: u64,
        /// Non-zero: a full ring waits (yielding, bounded) for the daemon
        /// instead of truncating the burst (`--full-trace`).
        pub wait_when_full: u64,
        /// The injected signal handler and its restorer (a later attach
        /// reinstalls them without generating code again).
        pub handler: u64,
        pub restorer: u64,
        /// The signal they were installed on.
        pub signal: u64,
        /// The executable's build ID hash (FNV-1a of the bytes) the clones
        /// were generated for.
        pub exe_id: u64,
        /// Address of the clones' `.eh_frame` once registered with the
        /// target's unwinder (`__register_frame`), else 0.
        pub eh_frame: u64,
        /// Signals handled with `burst_len` 0 (`--burst 0`): the handler
        /// returned to the interrupted original code at once.
        pub declined_budget: u64,
        /// The dynamic loader's `_dl_debug_state` (0: none), which it calls
        /// before and after every change of its link map (`dlopen`,
        /// `dlclose`; the debugger's `r_brk`), and `[hook_lo, hook_hi)`,
        /// the loader's code around it. The eBPF program has a uprobe
        /// there that sends the burst signal; the uprobe steps over the
        /// function's `ret`, so the handler finds the thread either at
        /// `hook` or just back from a `call hook` (`e8 rel32` before the
        /// pc, and the pc still in the stack slot below `rsp`). Then it
        /// invalidates `tables` (header 0, generation + 1) and counts
        /// `link_changes`, before the loader maps or unmaps anything.
        pub hook: u64,
        pub hook_lo: u64,
        pub hook_hi: u64,
        /// Times the handler invalidated the tables at the hook.
        pub link_changes: u64,
        /// The header the daemon last wrote (valid or not in `tables`): a
        /// later attach starts from it.
        pub tables_base: u64,
        /// How the runtime measures paths: [`MEASURE_NONE`] (0): not at
        /// all (no `rdtsc`, no `REC_COST` records); [`MEASURE_TSC`] (1):
        /// every `REC_PATH` record is followed by a `REC_COST` record with
        /// the path's time-stamp-counter ticks, exclusive of its callees.
        /// Set by the daemon.
        pub measure: u64,
        /// Signals declined because the free slot's sub-ring was more than
        /// half full: the daemon is behind, and a burst now could fill
        /// it and lose records. Not with `wait_when_full` (a full trace
        /// waits instead).
        pub declined_behind: u64,
        /// Words consumed by the daemon from each slot's sub-ring
        /// (consumer indexes), on their own line.
        pub tails: [u64; MAX_SLOTS],
        /// The pid of the daemon that armed the region, as the target's
        /// pid namespace sees it (0: none, or not visible from there). A
        /// second daemon refuses bursts while it lives; a full ring in a
        /// full trace stops waiting once it has gone (`kill(tracer, 0)`
        /// fails with ESRCH).
        pub tracer: u64,
        /// The pid the region was injected into: a child that inherited it
        /// through fork shares it with its parent and is never armed.
        pub made_for: u64,
        /// The modules (executable, libraries) with clones, in `fid`
        /// order: a later attach re-arms them without mapping anything.
        pub n_modules: u64,
        /// Memory mode: one burst in `refs_every` records data references
        /// (`REC_REF`; 0 or 1: every burst); the others are path-mode
        /// bursts. Set by the daemon, which adjusts it so that the
        /// references recorded stay near what it analyses.
        pub refs_every: u64,
        /// The handler's countdown to the next burst that records
        /// references (threads race on it: the spacing is approximate).
        pub refs_countdown: u64,
        /// Memory mode: the references a burst that records them records
        /// at most (its `refs` register starts here; after the last one
        /// the next check ends the burst). Longer, rarer bursts make the
        /// hot data streams of a sampled trace those of the whole one
        /// (Hirzel & Chilimbi, figure 7): see the daemon's
        /// `DEFAULT_REFS_BURST`. 0: such bursts record none.
        pub refs_burst: u64,
        /// Memory mode: the checks of a burst that records references
        /// (its `budget`; the references bound it first where there are
        /// any).
        pub refs_burst_len: u64,
        /// How the runtime compresses tuples ([`TupleConfig::to_word`]).
        pub tuple_config: u64,
        /// Records written to each slot's sub-ring (in words; producer
        /// indexes).
        pub heads: [u64; MAX_SLOTS],
        /// The thread id (`gettid()`) of each slot's running burst, 0 when
        /// the slot is free. The eBPF program reads them: an overflow of a
        /// thread that runs a burst while its pc is in original code means
        /// it left the clones without passing a check (a return into code
        /// that is not instrumented, an exception that landed in an
        /// original landing pad, `longjmp`); the handler then ends that
        /// burst and starts a new one. Any other overflow of it is
        /// declined (its burst runs).
        pub slot_tids: [u64; MAX_SLOTS],
        pub modules: [ModuleEntry; MAX_MODULES],
    }
}

/// Where the runtime's three sorted tables of `(original, clone)` pairs
/// (16 bytes each) are, and their lengths in pairs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablesHeader {
    /// Every rewritten instruction: where the handler may start a burst.
    pub insns: u64,
    pub insns_len: u64,
    /// `(original start, clone entry)` of the cloned functions: indirect
    /// calls in a burst go to the clone.
    pub functions: u64,
    pub functions_len: u64,
    /// `(original return address, clone return site)` of every call in
    /// the clones: calls push the original return address (what
    /// `backtrace()`, `dladdr` and the C++ unwinder see), and a return in
    /// a burst goes on at the call's clone return site.
    pub returns: u64,
    pub returns_len: u64,
}

/// Bytes of an encoded [`TablesHeader`].
pub const TABLES_HEADER_BYTES: usize = core::mem::size_of::<TablesHeader>();

impl TablesHeader {
    /// The header as the target's memory holds it (six little-endian
    /// words, in field order): the one encoding, for the daemon and the
    /// rewriter alike.
    pub fn to_bytes(&self) -> [u8; TABLES_HEADER_BYTES] {
        let mut b = [0u8; TABLES_HEADER_BYTES];
        for (i, w) in [
            self.insns,
            self.insns_len,
            self.functions,
            self.functions_len,
            self.returns,
            self.returns_len,
        ]
        .into_iter()
        .enumerate()
        {
            b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// The header from the bytes [`Self::to_bytes`] makes.
    pub fn from_bytes(b: &[u8; TABLES_HEADER_BYTES]) -> Self {
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[8 * i..8 * i + 8]);
            u64::from_le_bytes(x)
        };
        TablesHeader {
            insns: w(0),
            insns_len: w(1),
            functions: w(2),
            functions_len: w(3),
            returns: w(4),
            returns_len: w(5),
        }
    }

    /// The three tables as `(address, pairs)`: instructions, functions,
    /// returns.
    pub fn tables(&self) -> [(u64, u64); 3] {
        [
            (self.insns, self.insns_len),
            (self.functions, self.functions_len),
            (self.returns, self.returns_len),
        ]
    }
}

/// Bits 48..64 of [`BurstControl::tables`]: the generation.
pub const TABLES_GEN_SHIFT: u32 = 48;
/// Bits 0..48 of [`BurstControl::tables`]: the header's address.
pub const TABLES_HEADER_MASK: u64 = (1 << TABLES_GEN_SHIFT) - 1;

/// Modules a region can hold clones for.
pub const MAX_MODULES: usize = 64;

/// One module's clones in a region ([`BurstControl::modules`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ModuleEntry {
    /// Content hash of the module's file (FNV-1a of its bytes).
    pub id: u64,
    /// Where its runtime and clones start.
    pub code: u64,
    /// Its functions' `fid`s start here (index in its plan + `fid_base`).
    pub fid_base: u64,
    /// Its load bias when injected (a module mapped elsewhere since is
    /// another mapping).
    pub bias: u64,
    /// `[lo, hi)`: the address range of its mappings, and the inode of
    /// its file. A module no longer mapped there from that inode was
    /// unloaded: its table entries are masked and `id` becomes 0.
    pub lo: u64,
    pub hi: u64,
    pub ino: u64,
}

control_block! {
    LOCAL_FIELDS;
    /// The burst slots, in memory private to the process (`MAP_PRIVATE |
    /// MAP_ANONYMOUS` over the shared region at [`LOCAL_OFFSET`] from the
    /// [`BurstControl`], `MADV_WIPEONFORK`).
    ///
    /// Private, because a child forked in the middle of a burst must not carry
    /// on its parent's burst: it would mix its paths into the parent's shadow
    /// stack and write records into the parent's ring. The child's copy reads
    /// as zeros: `present` 0 (its handler starts no burst) and every slot's
    /// `owner` 0 (no thread passes a check or writes a record, although its
    /// TCB still points at a slot), so it leaves the clones at its next check
    /// having written nothing. The daemon does not map it (it writes a slot's
    /// `owner` through `/proc/PID/mem` to end a burst from outside).
    pub struct BurstLocal {
        /// 1 in the process the region was injected into (written at
        /// injection); 0 in a forked child.
        pub present: u64,
        pub _pad: [u64; 7],
        pub slots: [BurstSlot; MAX_SLOTS],
    }
}

control_block! {
    SLOT_FIELDS;
    /// One running burst's private state ([`BurstLocal::slots`]). The
    /// handler claims a free slot with `lock cmpxchg` on `owner` (0 → the
    /// thread's `fs:[0]`) and the burst's end frees it.
    pub struct BurstSlot {
        /// `fs:[0]` (the thread's TCB address, unique per thread) of the
        /// burst's thread; 0 when the slot is free.
        pub owner: u64,
        /// This slot's index (written by the handler at the claim).
        pub index: u64,
        /// Where this slot's sub-ring starts (written at the claim).
        pub ring: u64,
        /// The address of `BurstControl::heads[index]` (written at the
        /// claim).
        pub head: u64,
        /// The random sampler's xorshift64 state (0: not seeded yet).
        pub rng: u64,
        /// The associative table's next entry to replace (round robin).
        pub assoc_next: u64,
        pub _pad: [u64; 2],
        pub shadow: [ShadowEntry; SHADOW_DEPTH],
        /// The associative table of tuple outputs (the paper's A_k):
        /// `[w0, w1]` as in [`REC_TUPLE`], the count in `w0` (0: the
        /// entry is free). Kept across the slot's bursts, emptied into
        /// the ring when a burst ends.
        pub assoc: [[u64; 2]; TUPLE_ASSOC],
        /// The stratified sampler's counters (the first `strata` of
        /// them), kept across the slot's bursts.
        pub strata: [u16; MAX_STRATA],
    }
}

control_block! {
    REGS_FIELDS;
    /// A thread's burst registers, in its own TCB at `fs:`[`TLS_REGS`]
    /// (see the module doc). Meaningful only while `slot`'s `owner` is
    /// this thread's `fs:[0]`: every routine and check compares that
    /// first.
    pub struct BurstRegs {
        /// The thread's [`BurstSlot`] (0: it never ran a burst).
        pub slot: u64,
        /// Checks left in the current burst.
        pub budget: u64,
        /// The Ball-Larus path register of the innermost activation.
        pub path: u64,
        /// Valid entries in the slot's `shadow`.
        pub depth: u64,
        /// With [`BurstControl::measure`]: the time-stamp counter when the
        /// innermost activation's current path started (for a caller
        /// whose callee returned: `rdtsc - elapsed`, see
        /// [`ShadowEntry::elapsed`]).
        pub path_start: u64,
        /// The time-stamp counter at the burst's first record after its
        /// START (0 until then: the runtime's record writer reads the
        /// counter once, when it finds 0 here). The END record carries
        /// the ticks since ([`REC_END`]): the burst's length in time, from
        /// the first check it passed (the signal's delivery and
        /// `rt_sigreturn` left out), which the daemon weights its counts
        /// by.
        pub burst_start: u64,
        /// Memory mode: the data references this burst still records
        /// (the handler sets it at the START, to
        /// [`BurstControl::refs_burst`] in one burst of
        /// [`BurstControl::refs_every`], else 0; `rt_ref` writes nothing
        /// while 0, and once it reaches 0 the next check ends the burst).
        pub refs: u64,
        /// Memory mode: in a burst that records references, the `budget`
        /// at and below which it is past a path-mode burst's checks
        /// (`refs_burst_len - burst_len`, set by the handler; 0 in any
        /// other burst). From there on only its `REC_REF` records and its
        /// `REC_END` go out: the daemon counts the paths of a burst's
        /// first `burst_len` checks only, and the path records past them
        /// would cost the target their writing and fill the ring the
        /// references need.
        pub paths_until: u64,
    }
}
const _: () = assert!(core::mem::size_of::<BurstRegs>() <= TLS_REGS_ROOM);

/// Where the [`BurstLocal`] lies, from the [`BurstControl`].
pub const LOCAL_OFFSET: usize = 4096;
/// Bytes (whole pages) of the private mapping for the [`BurstLocal`].
pub const LOCAL_BYTES: usize = core::mem::size_of::<BurstLocal>().next_multiple_of(4096);
/// Bytes reserved at the start of the shared memory for [`BurstControl`]
/// and the private [`BurstLocal`] mapped over it (the ring starts here).
pub const CONTROL_BYTES: usize = LOCAL_OFFSET + LOCAL_BYTES;
const _: () = assert!(core::mem::size_of::<BurstControl>() <= LOCAL_OFFSET);
const _: () = assert!(core::mem::size_of::<BurstLocal>() <= LOCAL_BYTES);
const _: () = assert!(LOCAL_BYTES.is_multiple_of(4096));
const _: () = assert!(core::mem::offset_of!(BurstControl, tails) % 64 == 0);

/// The eBPF `BURSTS` map value for one traced process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BurstTarget {
    /// Address of `BurstControl::armed` in the target (`active` and
    /// `max_bursts` follow it; `slot_tids` is at [`SLOT_TIDS_OFFSET`]):
    /// read with `bpf_probe_read_user`.
    pub armed_addr: u64,
    /// The signal the injected handler is installed on.
    pub signal: u32,
    pub _pad: u32,
    /// The injected handler's address: a signal whose disposition is
    /// anything else is never sent.
    pub handler: u64,
}

/// Key of the eBPF `CLONE_PAGES` set: a page of a traced process's
/// original code that holds at least one rewritten instruction (where the
/// handler can start a burst).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClonePage {
    pub pid: u32,
    pub _pad: u32,
    /// Address >> [`CLONE_PAGE_SHIFT`].
    pub page: u64,
}

/// Granule of [`ClonePage`].
pub const CLONE_PAGE_SHIFT: u32 = 12;

/// Offset of `armed` (and `active`, `max_bursts` right after it).
pub const ARMED_OFFSET: usize = core::mem::offset_of!(BurstControl, armed);
/// Offset of `slot_tids`.
pub const SLOT_TIDS_OFFSET: usize = core::mem::offset_of!(BurstControl, slot_tids);

#[cfg(test)]
mod layout {
    use super::*;

    /// The header's encoding is its `repr(C)` layout on x86-64 (what the
    /// runtime reads at fixed offsets), and decoding inverts it.
    #[test]
    fn tables_header_bytes_are_its_memory_layout() {
        let h = TablesHeader {
            insns: 0x1122_3344_5566_7788,
            insns_len: 2,
            functions: 0x7fff_0000_1000,
            functions_len: 3,
            returns: 0x7fff_0000_2000,
            returns_len: 5,
        };
        let b = h.to_bytes();
        // SAFETY: TablesHeader is repr(C) of six u64s, no padding.
        let raw: [u8; TABLES_HEADER_BYTES] = unsafe { core::mem::transmute(h) };
        assert_eq!(b, raw);
        assert_eq!(TablesHeader::from_bytes(&b), h);
        assert_eq!(h.tables(), [(h.insns, 2), (h.functions, 3), (h.returns, 5)]);
    }

    /// The layout `CONTROL_MAGIC` stands for. When this test fails because
    /// `BurstControl` or `BurstLocal` changed, give `CONTROL_MAGIC` a new value (a target
    /// still holding a region of the old layout must be recognised as
    /// foreign) and copy the new field list and magic here.
    const PINNED_MAGIC: u64 = u64::from_le_bytes(*b"burstyde");
    const PINNED_FIELDS: &[(&str, usize, usize)] = &[
        ("magic", 0, 8),
        ("armed", 8, 4),
        ("active", 12, 4),
        ("max_bursts", 16, 8),
        ("burst_len", 24, 8),
        ("concurrent_max", 32, 8),
        ("ring_mask", 40, 8),
        ("ring_addr", 48, 8),
        ("tables", 56, 8),
        ("bursts", 64, 8),
        ("declined_busy", 72, 8),
        ("declined_pc", 80, 8),
        ("declined_disarmed", 88, 8),
        ("lost_records", 96, 8),
        ("shadow_overflow", 104, 8),
        ("truncated", 112, 8),
        ("ended", 120, 8),
        ("clone_lo", 128, 8),
        ("clone_hi", 136, 8),
        ("wait_when_full", 144, 8),
        ("handler", 152, 8),
        ("restorer", 160, 8),
        ("signal", 168, 8),
        ("exe_id", 176, 8),
        ("eh_frame", 184, 8),
        ("declined_budget", 192, 8),
        ("hook", 200, 8),
        ("hook_lo", 208, 8),
        ("hook_hi", 216, 8),
        ("link_changes", 224, 8),
        ("tables_base", 232, 8),
        ("measure", 240, 8),
        ("declined_behind", 248, 8),
        ("tails", 256, 64),
        ("tracer", 320, 8),
        ("made_for", 328, 8),
        ("n_modules", 336, 8),
        ("refs_every", 344, 8),
        ("refs_countdown", 352, 8),
        ("refs_burst", 360, 8),
        ("refs_burst_len", 368, 8),
        ("tuple_config", 376, 8),
        ("heads", 384, 64),
        ("slot_tids", 448, 64),
        ("modules", 512, 3584),
    ];
    const PINNED_LOCAL_FIELDS: &[(&str, usize, usize)] =
        &[("present", 0, 8), ("_pad", 8, 56), ("slots", 64, 330240)];
    const PINNED_SLOT_FIELDS: &[(&str, usize, usize)] = &[
        ("owner", 0, 8),
        ("index", 8, 8),
        ("ring", 16, 8),
        ("head", 24, 8),
        ("rng", 32, 8),
        ("assoc_next", 40, 8),
        ("_pad", 48, 16),
        ("shadow", 64, 32768),
        ("assoc", 32832, 256),
        ("strata", 33088, 8192),
    ];
    const PINNED_REGS_FIELDS: &[(&str, usize, usize)] = &[
        ("slot", 0, 8),
        ("budget", 8, 8),
        ("path", 16, 8),
        ("depth", 24, 8),
        ("path_start", 32, 8),
        ("burst_start", 40, 8),
        ("refs", 48, 8),
        ("paths_until", 56, 8),
    ];

    /// The tuple configuration's word decodes to what made it (strata
    /// rounded up to a power of two, the rate at least 1), and holds the
    /// random sampler's threshold 2^24 / rate - 1.
    #[test]
    fn tuple_config_round_trips_through_its_word() {
        let c = TupleConfig {
            sampler: SAMPLER_STRATIFIED,
            assoc: true,
            reference: false,
            strata: 2048,
            rate: 256,
        };
        let w = c.to_word();
        assert_eq!(TupleConfig::from_word(w), c);
        assert_eq!(w >> TUPLE_CFG_THRESHOLD_SHIFT, 65535);
        assert_eq!((w >> TUPLE_CFG_STRATA_SHIFT) & 0xffff, 2047);
        assert_eq!(c.weight(), 256);
        let odd = TupleConfig {
            sampler: SAMPLER_RANDOM,
            assoc: false,
            reference: true,
            strata: 1000,
            rate: 0,
        };
        let back = TupleConfig::from_word(odd.to_word());
        assert_eq!((back.strata, back.rate, back.reference), (1024, 1, true));
        assert_eq!(odd.to_word() >> TUPLE_CFG_THRESHOLD_SHIFT, (1 << 24) - 1);
        assert_eq!(TupleConfig::default().to_word() & 0xff, 0);
        assert_eq!(TupleConfig::default().weight(), 1);
    }

    #[test]
    fn control_block_layout_is_pinned_to_the_magic() {
        let same_layout = CONTROL_FIELDS == PINNED_FIELDS
            && LOCAL_FIELDS == PINNED_LOCAL_FIELDS
            && SLOT_FIELDS == PINNED_SLOT_FIELDS
            && REGS_FIELDS == PINNED_REGS_FIELDS;
        assert!(
            same_layout || CONTROL_MAGIC != PINNED_MAGIC,
            "BurstControl's or BurstLocal's layout changed but CONTROL_MAGIC did not: give it a \
             new value, then pin the new layout here.\nnow: {CONTROL_FIELDS:?}"
        );
        assert!(
            same_layout && CONTROL_MAGIC == PINNED_MAGIC,
            "pin the new layout and magic in this test: \
             PINNED_MAGIC = {CONTROL_MAGIC:#x}, PINNED_FIELDS = {CONTROL_FIELDS:?}, \
             PINNED_LOCAL_FIELDS = {LOCAL_FIELDS:?}, PINNED_SLOT_FIELDS = {SLOT_FIELDS:?}, \
             PINNED_REGS_FIELDS = {REGS_FIELDS:?}"
        );
    }

    #[test]
    fn the_runtime_and_the_ebpf_program_agree_on_armed_and_active() {
        // The eBPF program reads both words with one 8-byte read at
        // ARMED_OFFSET.
        assert_eq!(
            core::mem::offset_of!(BurstControl, active),
            ARMED_OFFSET + 4
        );
        assert_eq!(core::mem::offset_of!(BurstControl, tails) % 64, 0);
        assert_eq!(
            core::mem::offset_of!(BurstControl, max_bursts),
            ARMED_OFFSET + 8
        );
    }
}
