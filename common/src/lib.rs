//! Types shared by the eBPF programs (`burstyd-ebpf`) and the daemon.
//!
//! Every type here is `#[repr(C)]` and plain old data: the kernel side writes
//! it into a BPF map or ring buffer, the user side reads the same bytes. Any
//! change here changes both sides at once, which is the point of the crate.
//! The eBPF target (`bpfel`) and x86-64 lay `#[repr(C)]` structs out alike
//! (little endian, 8-byte `u64` alignment); the `layout` tests here pin the
//! offsets both sides rely on, so a drift fails `cargo test`:
//! `sample_layout` below, and `burst::layout`, which also ties
//! [`burst::BurstControl`]'s layout to [`burst::CONTROL_MAGIC`].
//!
//! - [`addr`]: process ids and the address spaces (AVMA, SVMA, bias, frame
//!   addresses) as types, shared by the daemon and the rewriter.
//! - [`burst`]: the memory a traced process shares with the daemon, and the
//!   record format its injected runtime writes.
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

/// Largest ring buffer, in bytes (power of two, multiple of the page
/// size): the size compiled into the eBPF object. The daemon sizes the
/// ring at load time for about a second of samples at the sampling rate
/// (`Config::wakeup_bytes` follows), between `MIN_RING_BYTES` and this.
/// 32 MiB holds about 1900 samples.
pub const RING_BYTES: u32 = 32 * 1024 * 1024;

/// Smallest ring buffer the daemon sizes (about 240 samples).
pub const MIN_RING_BYTES: u32 = 4 * 1024 * 1024;

/// How often the daemon drains the ring buffer without a wakeup.
pub const DRAIN_INTERVAL_MS: u64 = 100;

/// `Sample::flags`: the sample interrupted user mode.
pub const SAMPLE_USER_MODE: u32 = 1 << 0;
/// `Sample::flags`: `rip`/`rsp`/`rbp` hold valid user registers.
pub const SAMPLE_USER_REGS: u32 = 1 << 1;
/// `Sample::flags`: the full `USER_STACK_BYTES` could not be read; a shorter
/// copy (see `ustack_len`) was taken instead.
pub const SAMPLE_USTACK_SHORT: u32 = 1 << 2;
/// `Sample::flags`: this overflow also sent the thread the burst signal (a
/// process traced in bursts): if the handler starts a burst, its START
/// record names this thread and this sample's `rip`, and this sample's
/// stack is the burst's calling context.
pub const SAMPLE_BURST_SIGNAL: u32 = 1 << 3;

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
    /// The parent process's id (`real_parent->tgid`; 0 if unknown): a
    /// forked child that is gone before its maps are read is symbolized
    /// with its parent's.
    pub ppid: u32,
    pub _pad: u32,
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
    /// Where the overflow program finds a task's signal state.
    pub task: TaskLayout,
    /// The overflow program wakes the daemon only once this many bytes
    /// are waiting (an eighth of the ring); otherwise the daemon drains on
    /// its own timer (`DRAIN_INTERVAL_MS`). One wakeup per sample would
    /// cost the daemon more than the sample itself.
    pub wakeup_bytes: u64,
}

/// Byte offsets into the running kernel's `struct task_struct` and the
/// structs it points to, read from its BTF by the daemon at start-up. The
/// overflow program reads the fields with `bpf_probe_read_kernel` to send a
/// burst signal only where the program cannot observe it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskLayout {
    /// `task_struct.blocked` (a 64-bit `sigset_t`).
    pub blocked: u32,
    /// `task_struct.pending.signal`: signals pending for this thread.
    pub pending: u32,
    /// `task_struct.signal` (pointer to `signal_struct`).
    pub signal: u32,
    /// `signal_struct.shared_pending.signal`: pending for the process.
    pub shared_pending: u32,
    /// `task_struct.sighand` (pointer to `sighand_struct`).
    pub sighand: u32,
    /// `sighand_struct.action` (array of `k_sigaction`, signal 1 first).
    pub action: u32,
    /// `k_sigaction.sa.sa_handler`.
    pub handler: u32,
    /// `sizeof(struct k_sigaction)`.
    pub action_size: u32,
    /// `task_struct.sas_ss_sp` and `.sas_ss_size`: the alternate stack.
    pub sas_ss_sp: u32,
    pub sas_ss_size: u32,
    /// `task_struct.real_parent` (pointer) and `task_struct.tgid`.
    pub real_parent: u32,
    pub tgid: u32,
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
    /// Overflows in a traced process that runs as many bursts as it may
    /// (`BurstControl::max_bursts`), or in a thread whose own burst runs.
    pub const BURST_BUSY: u32 = 5;
    /// `bpf_send_signal_thread` failed.
    pub const BURST_SIGNAL_FAILED: u32 = 6;
    /// Burst signals not sent, by reason (the program would have noticed
    /// the signal, or the handler would have declined it):
    /// the overflow interrupted the kernel (a system call or a fault);
    pub const DECLINED_IN_KERNEL: u32 = 7;
    /// the pc is on no page with rewritten instructions;
    pub const DECLINED_NO_CLONE: u32 = 8;
    /// the thread blocks the burst signal;
    pub const DECLINED_BLOCKED: u32 = 9;
    /// the burst signal is already pending (thread or process);
    pub const DECLINED_PENDING: u32 = 10;
    /// the signal's disposition is no longer the injected handler;
    pub const DECLINED_HANDLER: u32 = 11;
    /// the thread runs on its alternate signal stack;
    pub const DECLINED_ALTSTACK: u32 = 12;
    /// the task's signal state could not be read.
    pub const DECLINED_UNREADABLE: u32 = 13;
    /// The loader of a traced process is about to change its link map
    /// (the uprobe on `_dl_debug_state`): the burst signal was sent, so
    /// the handler invalidates the lookup tables before the loader goes
    /// on;
    pub const LINK_SIGNALLED: u32 = 14;
    /// or it could not be (the signal is blocked, the handler replaced,
    /// the thread on its alternate stack): the daemon invalidates them at
    /// its next drain.
    pub const LINK_UNSIGNALLED: u32 = 15;
    /// Number of counters.
    pub const COUNT: u32 = 16;
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: both are #[repr(C)], contain only integers and byte arrays, and
    // every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::Sample {}
    unsafe impl aya::Pod for super::burst::BurstTarget {}
    unsafe impl aya::Pod for super::burst::ClonePage {}
}

pub mod addr;
pub mod burst;

#[cfg(test)]
mod sample_layout {
    use super::*;
    use core::mem::{offset_of, size_of};

    /// The offsets the eBPF program writes and the daemon reads.
    #[test]
    fn sample_and_config_offsets_are_pinned() {
        let sample = [
            offset_of!(Sample, pid),
            offset_of!(Sample, tid),
            offset_of!(Sample, time_ns),
            offset_of!(Sample, period),
            offset_of!(Sample, cpu),
            offset_of!(Sample, flags),
            offset_of!(Sample, comm),
            offset_of!(Sample, rip),
            offset_of!(Sample, rsp),
            offset_of!(Sample, rbp),
            offset_of!(Sample, kstack_len),
            offset_of!(Sample, ustack_len),
            offset_of!(Sample, ppid),
            offset_of!(Sample, kstack),
            offset_of!(Sample, ustack),
            size_of::<Sample>(),
        ];
        assert_eq!(
            sample,
            [
                0,
                4,
                8,
                16,
                24,
                28,
                32,
                48,
                56,
                64,
                72,
                76,
                80,
                88,
                600,
                600 + USER_STACK_BYTES
            ]
        );
        assert_eq!(size_of::<Config>(), 72);
        assert_eq!(offset_of!(Config, task), 16);
        assert_eq!(offset_of!(Config, wakeup_bytes), 64);
        assert_eq!(size_of::<burst::BurstTarget>(), 24);
        assert_eq!(size_of::<burst::ClonePage>(), 16);
    }
}
