//! Types shared by the eBPF programs (`burstyd-ebpf`) and the daemon.
//!
//! Every type here is `#[repr(C)]` and plain old data: the kernel side writes
//! it into a BPF map or ring buffer, the user side reads the same bytes. Any
//! change here changes both sides at once, which is the point of the crate.
//! The `layout` test in the daemon pins the sizes and offsets the daemon
//! decodes, so a drift fails `cargo test`.
#![no_std]

/// Bytes of user stack copied per sample, starting at the sampled `rsp`.
///
/// The daemon unwinds with the target's CFI (`.eh_frame`) over this copy, so
/// it bounds the depth we can see: 16 KiB holds the frames of ordinary C and
/// Rust programs (perf's default dump is 8 KiB). Larger frames are truncated
/// and the daemon marks such stacks as truncated.
pub const USER_STACK_BYTES: usize = 16 * 1024;

/// Kernel return addresses captured per sample (by `bpf_get_stack`).
pub const MAX_KERNEL_FRAMES: usize = 64;

/// Ring buffer size in bytes (power of two, multiple of the page size).
/// 32 MiB holds about 1900 samples: two seconds of a 2-core host at 997 Hz
/// a core if the daemon stalls.
pub const RING_BYTES: u32 = 32 * 1024 * 1024;

/// The overflow program wakes the daemon only once this many bytes are
/// waiting (an eighth of the ring); otherwise the daemon drains on its own
/// timer (`DRAIN_INTERVAL_MS`). One wakeup per sample would cost the
/// daemon more than the sample itself.
pub const WAKEUP_BYTES: u64 = RING_BYTES as u64 / 8;

/// How often the daemon drains the ring buffer without a wakeup.
pub const DRAIN_INTERVAL_MS: u64 = 100;

/// `Sample::flags`: the sample interrupted user mode.
pub const SAMPLE_USER_MODE: u32 = 1 << 0;
/// `Sample::flags`: `rip`/`rsp`/`rbp` hold valid user registers.
pub const SAMPLE_USER_REGS: u32 = 1 << 1;
/// `Sample::flags`: the full `USER_STACK_BYTES` could not be read; a shorter
/// copy (see `ustack_len`) was taken instead.
pub const SAMPLE_USTACK_SHORT: u32 = 1 << 2;

/// One stack sample, written by the perf_event program into the ring buffer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Sample {
    /// Process id (kernel tgid).
    pub pid: u32,
    /// Thread id (kernel pid).
    pub tid: u32,
    /// `bpf_ktime_get_ns()` at the overflow.
    pub time_ns: u64,
    /// Event count this sample stands for (the perf period at the overflow).
    pub period: u64,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// `SAMPLE_*` flags.
    pub flags: u32,
    /// Thread name (`task->comm`), NUL padded.
    pub comm: [u8; 16],
    /// User instruction pointer.
    pub rip: u64,
    /// User stack pointer: `ustack[0]` is the byte at this address.
    pub rsp: u64,
    /// User frame pointer (a hint only; the daemon unwinds with CFI).
    pub rbp: u64,
    /// Number of valid entries in `kstack`.
    pub kstack_len: u32,
    /// Number of valid bytes in `ustack`.
    pub ustack_len: u32,
    /// Kernel return addresses, innermost first.
    pub kstack: [u64; MAX_KERNEL_FRAMES],
    /// Copy of the user stack from `rsp` upwards.
    pub ustack: [u8; USER_STACK_BYTES],
}

/// Which processes the overflow program records (`Config::filter`).
pub const FILTER_ALL: u32 = 0;
/// Only processes whose tgid is a key of the `TARGETS` map.
pub const FILTER_TARGETS: u32 = 1;

/// Settings the daemon writes into the `CONFIG` array (index 0) before
/// attaching the program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// `FILTER_ALL` or `FILTER_TARGETS`.
    pub filter: u32,
    /// The daemon's own pid: never sampled (we must not profile ourselves
    /// in system-wide mode, the ring buffer reads would feed back).
    pub self_pid: u32,
    /// Non-zero: also capture kernel stacks.
    pub kernel_stacks: u32,
    /// Non-zero: processes forked by a target become targets too
    /// (`burstyd run`, so that `run -- sh -c ...` profiles the real work).
    pub follow_children: u32,
}

/// Indexes into the per-CPU `COUNTERS` array.
pub mod counter {
    /// Overflows seen by the program (after filtering).
    pub const SAMPLES: u32 = 0;
    /// Samples dropped because the ring buffer was full.
    pub const RING_FULL: u32 = 1;
    /// Samples whose user stack could not be read at all.
    pub const USTACK_FAILED: u32 = 2;
    /// Samples from kernel threads (no user context).
    pub const KERNEL_THREAD: u32 = 3;
    /// Burst signals sent (`bpf_send_signal_thread`).
    pub const BURST_SIGNALS: u32 = 4;
    /// Overflows in a traced process while a burst was running there.
    pub const BURST_BUSY: u32 = 5;
    /// `bpf_send_signal_thread` failed.
    pub const BURST_SIGNAL_FAILED: u32 = 6;
    /// Number of counters.
    pub const COUNT: u32 = 7;
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: both are #[repr(C)], contain only integers and byte arrays, and
    // every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::Sample {}
    unsafe impl aya::Pod for super::burst::BurstTarget {}
}

/// Bursty tracing: the memory the injected runtime in a target process
/// shares with the daemon, and the eBPF map entry that arms it.
///
/// The daemon maps a memfd into the target (`MAP_SHARED`) and into itself:
/// page 0 holds a [`BurstControl`], then come `ring_words` u64 words of
/// records. Only the thread that owns the current burst writes records
/// (single producer); the daemon consumes (`tail`). The generated code in
/// the target reaches every field RIP-relatively at fixed offsets, so the
/// layout is part of the contract between `userspace-rewriter::clone` and
/// the daemon.
pub mod burst {
    /// `BurstControl::magic`.
    /// Changes whenever the layout of [`BurstControl`] does.
    pub const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"burstyd2");
    /// Saved path registers (one per instrumented activation in a burst).
    pub const SHADOW_DEPTH: usize = 1024;
    /// Set in the path register when the path's start was not observed (the
    /// burst began mid-path, or the activation is older than the burst).
    pub const PATH_INVALID: u64 = 1 << 63;

    /// Record tags: bits 60..64 of a record's first word. Every record is
    /// two words.
    pub const REC_START: u64 = 1;
    /// An instrumented function was entered: `w0 = tag | fid`, `w1 = 0`.
    pub const REC_ENTER: u64 = 2;
    /// A path ended: `w0 = tag | kind << 32 | fid`, `w1 = path register`.
    pub const REC_PATH: u64 = 3;
    /// The burst ended: `w0 = tag | reason`, `w1 = 0`.
    pub const REC_END: u64 = 4;

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

    /// Mask of the tag bits.
    pub const TAG_SHIFT: u32 = 60;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct ShadowEntry {
        /// `rsp` at the activation's entry (points at its return address).
        pub rsp: u64,
        /// The caller's path register.
        pub path: u64,
    }

    /// Page 0 of the shared memory. Field order is ABI (see the module doc).
    #[repr(C, align(64))]
    #[derive(Clone, Copy, Debug)]
    pub struct BurstControl {
        pub magic: u64,
        /// Non-zero: the signal handler may start bursts (the daemon clears
        /// it to disarm; running bursts end at their next check).
        pub armed: u32,
        /// Non-zero while a burst runs (set by the handler with `lock
        /// cmpxchg`, cleared when the burst ends). The eBPF program reads it
        /// to avoid signalling a busy process.
        pub active: u32,
        /// `fs:[0]` (the thread's TCB address, unique per thread) of the
        /// burst's thread; 0 when no burst runs.
        pub owner: u64,
        /// Checks left in the current burst.
        pub budget: u64,
        /// Checks per burst (set by the daemon; `u64::MAX`: full trace).
        pub burst_len: u64,
        /// The Ball-Larus path register of the innermost activation.
        pub path: u64,
        /// Valid entries in `shadow`.
        pub depth: u64,
        /// Records written (in words; producer index).
        pub head: u64,
        /// `ring_words - 1` (a power of two minus one).
        pub ring_mask: u64,
        /// The ring's address in the target.
        pub ring_addr: u64,
        /// Sorted `(original address, clone address)` pairs of every
        /// rewritten instruction: where the handler may start a burst.
        pub table_addr: u64,
        pub table_len: u64,
        /// Sorted `(original start, clone entry)` pairs of the cloned
        /// functions: indirect calls in a burst go to the clone.
        pub fn_table_addr: u64,
        pub fn_table_len: u64,
        /// Where a clone puts an indirect call's looked-up target (only the
        /// burst's thread runs between two checks).
        pub call_target: u64,
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
        /// Words consumed by the daemon (consumer index), on its own line.
        pub tail: u64,
        pub _pad: [u64; 7],
        pub shadow: [ShadowEntry; SHADOW_DEPTH],
    }

    /// Bytes reserved for [`BurstControl`] at the start of the shared
    /// memory (the ring starts here).
    pub const CONTROL_BYTES: usize = 20 * 1024;
    const _: () = assert!(core::mem::size_of::<BurstControl>() <= CONTROL_BYTES);
    const _: () = assert!(core::mem::offset_of!(BurstControl, tail) % 64 == 0);

    /// The eBPF `BURSTS` map value for one traced process.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct BurstTarget {
        /// Address of `BurstControl::armed` in the target (`active`
        /// follows it): read with `bpf_probe_read_user`.
        pub armed_addr: u64,
        /// The signal the injected handler is installed on.
        pub signal: u32,
        pub _pad: u32,
    }

    /// Offset of `armed` (and `active` right after it).
    pub const ARMED_OFFSET: usize = core::mem::offset_of!(BurstControl, armed);
}
