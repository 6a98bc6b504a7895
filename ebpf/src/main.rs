//! burstyd's kernel side.
//!
//! `on_overflow` is a perf_event program attached to one sampling event per
//! CPU (a PMU counter, or cpu-clock where the host has no PMU). On every
//! counter overflow it records, for the interrupted task, what the daemon
//! needs to build a calling context without frame pointers: the user
//! registers (`rip`, `rsp`, `rbp`), a copy of the user stack from `rsp`
//! upwards, and the kernel stack. The daemon unwinds the copy with the
//! target's CFI (`.eh_frame`) in user space.
//!
//! Samples go into one ring buffer. A full ring buffer drops the sample and
//! counts it (`counter::RING_FULL`); it never blocks or retries.
//!
//! For a process armed in `BURSTS`, `on_overflow` also starts bursts: it
//! sends the burst signal to the overflowing thread
//! ([`bpf_send_signal_thread`]), and the handler injected into the target
//! moves the thread into its clones. A signal, because nothing else can
//! redirect a thread from here: `bpf_probe_write_user` is refused under
//! kernel lockdown (no flag can be flipped in the target's memory), and
//! uprobe programs cannot write `pt_regs`. The decision whether a signal
//! would go unnoticed is made here, because only here are the interrupted
//! mode, the thread's signal state and its disposition all visible
//! before anything is sent ([`start_burst`]).
//!
//! Three more programs: `on_newtask` makes the processes a target forks
//! targets too (so `burstyd run -- sh -c ...` profiles the real work),
//! `on_exec` tells the daemon which targets and traced processes exec'd
//! (their clones are gone; the new program is attached to afresh), and
//! `on_link_change` watches the loader's link map of processes traced in
//! bursts.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, pt_regs},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_task, bpf_get_current_task_btf, bpf_get_smp_processor_id,
            bpf_get_stack, bpf_probe_read_user, bpf_send_signal_thread, bpf_task_pt_regs,
        },
    },
    macros::{map, perf_event, tracepoint, uprobe},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{PerfEventContext, ProbeContext, TracePointContext},
};
use aya_log_ebpf::warn;
use burstyd_common::{
    Config, FILTER_TARGETS, MAX_KERNEL_FRAMES, RING_BYTES, SAMPLE_BURST_SIGNAL, SAMPLE_USER_MODE,
    SAMPLE_USER_REGS, SAMPLE_USTACK_SHORT, Sample, TaskLayout, USER_STACK_BYTES,
    burst::{
        ARMED_OFFSET, BurstTarget, CLONE_PAGE_SHIFT, CONTROL_MAGIC, ClonePage, MAX_SLOTS,
        SLOT_TIDS_OFFSET,
    },
    counter,
};

#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// tgid -> 1 for the processes we record when `Config::filter` is
/// `FILTER_TARGETS`.
#[map]
static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

/// tgid -> where its injected burst runtime lives and which signal starts
/// a burst (bursty tracing, `--pid`/`run` with the rewriter).
#[map]
static BURSTS: HashMap<u32, BurstTarget> = HashMap::with_max_entries(1024, 0);

/// Pages of traced processes' original code that hold rewritten
/// instructions ([`ClonePage`]): a pc elsewhere gets no burst signal.
#[map]
static CLONE_PAGES: HashMap<ClonePage, u8> = HashMap::with_max_entries(65536, 0);

/// tgid -> how many times its loader announced a change of its link map
/// (`dlopen`, `dlclose`) since the daemon began to watch it (and put the
/// entry here): the daemon checks the maps of a process whose count moved.
#[map]
static LINK_CHANGES: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);

/// tgid -> how many times it exec'd since the daemon last looked (and
/// took the entry out): targets (`FILTER_TARGETS`) and processes traced
/// in bursts. A full map loses the notice, never the exec.
#[map]
static EXECS: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Offset of `sample_period` in `struct bpf_perf_event_data` (after the
/// 168-byte x86-64 `pt_regs`). Part of the UAPI.
const SAMPLE_PERIOD_OFFSET: usize = core::mem::size_of::<pt_regs>();

#[perf_event]
pub fn on_overflow(ctx: PerfEventContext) -> u32 {
    match try_on_overflow(&ctx) {
        Ok(ret) | Err(ret) => ret,
    }
}

/// `clone(2)` flag: the new task is a thread of the caller's process.
const CLONE_THREAD: u64 = 0x0001_0000;
/// Offsets in the `task:task_newtask` tracepoint record (see its `format`).
const NEWTASK_PID_OFFSET: usize = 8;
const NEWTASK_CLONE_FLAGS_OFFSET: usize = 32;

/// `task:task_newtask`: when a target forks a new process (not a thread),
/// the child becomes a target too. Runs in the parent's context.
#[tracepoint]
pub fn on_newtask(ctx: TracePointContext) -> u32 {
    let config = CONFIG.get(0).copied().unwrap_or_default();
    if config.filter != FILTER_TARGETS || config.follow_children == 0 {
        return 0;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if unsafe { TARGETS.get(&parent) }.is_none() {
        return 0;
    }
    // SAFETY: reads within the tracepoint record, offsets from its format.
    let flags: u64 = unsafe { ctx.read_at(NEWTASK_CLONE_FLAGS_OFFSET) }.unwrap_or(CLONE_THREAD);
    if flags & CLONE_THREAD != 0 {
        return 0;
    }
    let child: i32 = unsafe { ctx.read_at(NEWTASK_PID_OFFSET) }.unwrap_or(0);
    if child > 0 {
        let _ = TARGETS.insert(&(child as u32), &1, 0);
    }
    0
}

/// `sched:sched_process_exec`: a target or a process traced in bursts
/// exec'd. Its injected runtime is gone with its old image, so it is
/// disarmed here at once (no burst signal reaches the new program), and
/// counted in `EXECS` for the daemon, which attaches to the new program.
/// Runs in the exec'ing task, its tgid already the process's.
#[tracepoint]
pub fn on_exec(_ctx: TracePointContext) -> u32 {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let config = CONFIG.get(0).copied().unwrap_or_default();
    // SAFETY: lookups; the values are not kept.
    let traced = unsafe { BURSTS.get(&pid) }.is_some();
    let target = config.filter == FILTER_TARGETS && unsafe { TARGETS.get(&pid) }.is_some();
    if !traced && !target {
        return 0;
    }
    if traced {
        let _ = BURSTS.remove(&pid);
    }
    // SAFETY: as above.
    let n = unsafe { EXECS.get(&pid) }.copied().unwrap_or(0);
    let _ = EXECS.insert(&pid, &(n + 1), 0);
    0
}

/// The hardware picked this moment: signal the overflowing thread, whose
/// injected handler moves it into the instrumented clones, but only when
/// the program cannot tell. Each check that fails is a counted decline,
/// never a signal:
/// - the overflow interrupted **user mode**: a signal that arrives in a
///   system call makes it return short or fail with EINTR;
/// - the pc is on a page with rewritten instructions (elsewhere the
///   handler would only decline);
/// - the process is armed and fewer than its bound of bursts
///   (`max_bursts`, at most `MAX_SLOTS`) run in it and none is this
///   thread's, or this thread's burst runs and it is back in original code
///   (read from the control block in its own memory; the magic word must
///   be there too: a process that exec'd keeps its pid but not our region);
///   otherwise `BURST_BUSY` counts it;
/// - the thread does not block the signal and it is not already pending
///   (for the thread or the process): a blocked signal stays queued, and
///   the program would receive it from `sigtimedwait` or after an exec;
/// - the disposition is still the injected handler (a program that reset
///   its handlers, or took the signal for itself, must never get ours);
/// - the thread is not on its alternate signal stack (which may be too
///   small for the signal frame; the handler is installed without
///   `SA_ONSTACK`, so it runs on whatever stack the thread is on).
#[inline(always)]
fn start_burst(
    ctx: &PerfEventContext,
    pid: u32,
    tid: u32,
    t: &BurstTarget,
    layout: &TaskLayout,
) -> bool {
    let regs = ctx.as_ptr() as *const pt_regs;
    // SAFETY: the perf_event context points at the interrupted registers.
    let (cs, rip, rsp) = unsafe { ((*regs).cs, (*regs).rip, (*regs).rsp) };
    if cs & 3 != 3 {
        bump(counter::DECLINED_IN_KERNEL);
        return false;
    }
    let page = ClonePage {
        pid,
        _pad: 0,
        page: rip >> CLONE_PAGE_SHIFT,
    };
    // SAFETY: a lookup; the value is not kept.
    if unsafe { CLONE_PAGES.get(&page) }.is_none() {
        bump(counter::DECLINED_NO_CLONE);
        return false;
    }
    let control = t.armed_addr.wrapping_sub(ARMED_OFFSET as u64);
    let mut words = [0u64; 3];
    // SAFETY: reads 24 bytes of the current process's memory into a local.
    let r = unsafe {
        bpf_probe_read_user(
            words.as_mut_ptr() as *mut core::ffi::c_void,
            24,
            control as *const core::ffi::c_void,
        )
    };
    let (magic, armed, active) = (words[0], words[1] as u32, (words[1] >> 32) as u32);
    if r != 0 || magic != CONTROL_MAGIC || armed == 0 {
        bump(counter::BURST_BUSY);
        return false;
    }
    let mut tids = [0u64; MAX_SLOTS];
    // SAFETY: reads the `slot_tids` array of the same control block.
    let r = unsafe {
        bpf_probe_read_user(
            tids.as_mut_ptr() as *mut core::ffi::c_void,
            (MAX_SLOTS * 8) as u32,
            (control + SLOT_TIDS_OFFSET as u64) as *const core::ffi::c_void,
        )
    };
    if r != 0 {
        bump(counter::BURST_BUSY);
        return false;
    }
    // This thread runs a burst and overflows here, in original code: it
    // left the clones without passing a check (see `slot_tids`); the
    // handler ends that burst and starts a new one. Any other thread
    // needs room under the bound (`max_bursts`, at most MAX_SLOTS).
    let mut own = false;
    for &x in tids.iter() {
        own |= x == tid as u64;
    }
    let bound = if words[2] < MAX_SLOTS as u64 {
        words[2]
    } else {
        MAX_SLOTS as u64
    };
    if !own && active as u64 >= bound {
        bump(counter::BURST_BUSY);
        return false;
    }
    if let Err(reason) = signal_state_allows(t, layout, rsp) {
        bump(reason);
        return false;
    }
    // SAFETY: plain helper call.
    if unsafe { bpf_send_signal_thread(t.signal) } == 0 {
        bump(counter::BURST_SIGNALS);
        true
    } else {
        bump(counter::BURST_SIGNAL_FAILED);
        false
    }
}

/// A uprobe on the dynamic loader's `_dl_debug_state` in each process
/// traced in bursts (the daemon attaches it per process): the loader calls
/// it before it maps or unmaps a library and again once its link map is
/// consistent. The lookup tables of the clones must not outlive a
/// library: another one could be mapped at its addresses. So the burst
/// signal goes to this very thread, whose handler finds it just back from
/// the hook and invalidates the tables before the loader goes on (see
/// `BurstControl::hook`); the daemon, seeing the count move, checks the
/// maps and puts the tables back. The signal is sent only where the
/// program cannot tell (as in [`start_burst`]); where it cannot be, the
/// daemon invalidates the tables itself at its next drain.
#[uprobe]
pub fn on_link_change(ctx: ProbeContext) -> u32 {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // Watched processes have an entry (the daemon puts it there).
    let Some(n) = LINK_CHANGES.get_ptr_mut(&pid) else {
        return 0;
    };
    // SAFETY: the map's value. Two threads of the process racing here
    // may count one change: the daemon only needs the value to move.
    unsafe { *n += 1 };
    // SAFETY: a lookup; the value is copied.
    let Some(t) = (unsafe { BURSTS.get(&pid) }).copied() else {
        // Not armed (yet): no handler may be there to take the signal.
        bump(counter::LINK_UNSIGNALLED);
        return 0;
    };
    let config = CONFIG.get(0).copied().unwrap_or_default();
    let regs = ctx.as_ptr() as *const pt_regs;
    // SAFETY: a uprobe's context is the user registers.
    let rsp = unsafe { (*regs).rsp };
    if signal_state_allows(&t, &config.task, rsp).is_err() {
        bump(counter::LINK_UNSIGNALLED);
        return 0;
    }
    // SAFETY: plain helper call.
    if unsafe { bpf_send_signal_thread(t.signal) } == 0 {
        bump(counter::LINK_SIGNALLED);
    } else {
        bump(counter::LINK_UNSIGNALLED);
    }
    0
}

/// The current task's parent process id (0 if the layout is unknown).
#[inline(always)]
fn parent_tgid(l: &TaskLayout) -> u32 {
    if l.action_size == 0 {
        return 0;
    }
    // SAFETY: plain helper call; the address is only used for checked reads.
    let task = unsafe { bpf_get_current_task() };
    let Ok(parent) = kernel_word(task, l.real_parent as u64) else {
        return 0;
    };
    // SAFETY: a checked read of kernel memory into a local.
    unsafe { bpf_probe_read_kernel(parent.wrapping_add(l.tgid as u64) as *const u32) }.unwrap_or(0)
}

/// Reads a kernel word at `base + off`.
#[inline(always)]
fn kernel_word(base: u64, off: u64) -> Result<u64, u32> {
    // SAFETY: a checked read of kernel memory into a local.
    unsafe { bpf_probe_read_kernel((base.wrapping_add(off)) as *const u64) }
        .map_err(|_| counter::DECLINED_UNREADABLE)
}

/// The current thread's signal state permits a burst signal (see
/// [`start_burst`]); `Err` is the decline counter.
#[inline(always)]
fn signal_state_allows(t: &BurstTarget, l: &TaskLayout, rsp: u64) -> Result<(), u32> {
    if l.action_size == 0 {
        // The daemon could not read the kernel's task layout.
        return Err(counter::DECLINED_UNREADABLE);
    }
    // SAFETY: plain helper call; the address is only used for checked reads.
    let task = unsafe { bpf_get_current_task() };
    let sig = (t.signal.wrapping_sub(1) & 63) as u64;
    let bit = 1u64 << sig;
    if kernel_word(task, l.blocked as u64)? & bit != 0 {
        return Err(counter::DECLINED_BLOCKED);
    }
    let pending = kernel_word(task, l.pending as u64)?;
    let signal = kernel_word(task, l.signal as u64)?;
    let shared = kernel_word(signal, l.shared_pending as u64)?;
    if (pending | shared) & bit != 0 {
        return Err(counter::DECLINED_PENDING);
    }
    let sighand = kernel_word(task, l.sighand as u64)?;
    let action = l.action as u64 + sig * l.action_size as u64 + l.handler as u64;
    if kernel_word(sighand, action)? != t.handler {
        return Err(counter::DECLINED_HANDLER);
    }
    // The kernel's `on_sig_stack()` for a downward-growing stack.
    let ss_sp = kernel_word(task, l.sas_ss_sp as u64)?;
    let ss_size = kernel_word(task, l.sas_ss_size as u64)?;
    if ss_size != 0 && rsp > ss_sp && rsp - ss_sp <= ss_size {
        return Err(counter::DECLINED_ALTSTACK);
    }
    Ok(())
}

#[inline(always)]
fn bump(index: u32) -> u64 {
    match COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, only this CPU's program touches it, and
        // perf_event programs do not nest on one CPU.
        Some(p) => unsafe {
            *p += 1;
            *p
        },
        None => 0,
    }
}

fn try_on_overflow(ctx: &PerfEventContext) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if pid == 0 {
        // The idle task.
        return Ok(0);
    }
    let config = CONFIG.get(0).copied().unwrap_or_default();
    if pid == config.self_pid {
        return Ok(0);
    }
    if config.filter == FILTER_TARGETS && unsafe { TARGETS.get(&pid) }.is_none() {
        return Ok(0);
    }
    bump(counter::SAMPLES);
    // The signal goes first: the handler runs only once this program
    // has returned, so the sample below is in the ring before the burst's
    // START record is in the target's.
    let signalled = match unsafe { BURSTS.get(&pid) } {
        Some(t) => start_burst(ctx, pid, tid, t, &config.task),
        None => false,
    };

    let Some(mut entry) = SAMPLES.reserve::<Sample>(0) else {
        let dropped = bump(counter::RING_FULL);
        if dropped.is_power_of_two() {
            warn!(
                ctx,
                "ring buffer full: {} samples dropped on this CPU", dropped
            );
        }
        return Ok(0);
    };
    let s: *mut Sample = entry.as_mut_ptr();
    // SAFETY: `s` points at a ring buffer reservation of size_of::<Sample>()
    // bytes that we own until submit; we only write within it.
    unsafe {
        (*s).pid = pid;
        (*s).tid = tid;
        (*s).time_ns = bpf_ktime_get_ns();
        let data = ctx.as_ptr() as *const u8;
        (*s).period = *(data.add(SAMPLE_PERIOD_OFFSET) as *const u64);
        (*s).cpu = bpf_get_smp_processor_id();
        (*s).comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
        (*s).flags = if signalled { SAMPLE_BURST_SIGNAL } else { 0 };
        (*s).rip = 0;
        (*s).rsp = 0;
        (*s).rbp = 0;
        (*s).kstack_len = 0;
        (*s).ustack_len = 0;
        (*s).ppid = parent_tgid(&config.task);
        (*s)._pad = 0;

        let regs = ctx.as_ptr() as *const pt_regs;
        let in_user = ((*regs).cs & 3) == 3;
        if in_user {
            (*s).flags |= SAMPLE_USER_MODE | SAMPLE_USER_REGS;
            (*s).rip = (*regs).rip;
            (*s).rsp = (*regs).rsp;
            (*s).rbp = (*regs).rbp;
        } else {
            if config.kernel_stacks != 0 {
                let n = bpf_get_stack(
                    ctx.as_ptr(),
                    (*s).kstack.as_mut_ptr() as *mut _,
                    (MAX_KERNEL_FRAMES * 8) as u32,
                    0,
                );
                if n > 0 {
                    (*s).kstack_len = (n as u32) / 8;
                }
            }
            // The user registers saved at kernel entry. Kernel threads have
            // none worth reading (their saved cs is not a user segment).
            let task = bpf_get_current_task_btf();
            let uregs = bpf_task_pt_regs(task) as *const pt_regs;
            if let Ok(u) = bpf_probe_read_kernel(uregs) {
                if (u.cs & 3) == 3 {
                    (*s).flags |= SAMPLE_USER_REGS;
                    (*s).rip = u.rip;
                    (*s).rsp = u.rsp;
                    (*s).rbp = u.rbp;
                }
            }
        }

        if (*s).flags & SAMPLE_USER_REGS == 0 {
            bump(counter::KERNEL_THREAD);
        } else {
            copy_user_stack(s);
        }
    }
    // Batch wakeups: the daemon drains on a timer, and is woken early only
    // when the ring fills up.
    let wakeup = if SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= config.wakeup_bytes {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    entry.submit(wakeup as u64);
    Ok(0)
}

/// Copies the user stack from `rsp` upwards. A thread's stack may end less
/// than `USER_STACK_BYTES` above `rsp` (the page above its top is
/// unmapped), so shorter copies are tried before giving up.
#[inline(always)]
unsafe fn copy_user_stack(s: *mut Sample) {
    unsafe {
        let rsp = (*s).rsp;
        let dst = (*s).ustack.as_mut_ptr() as *mut core::ffi::c_void;
        let src = rsp as *const core::ffi::c_void;
        if bpf_probe_read_user(dst, USER_STACK_BYTES as u32, src) == 0 {
            (*s).ustack_len = USER_STACK_BYTES as u32;
            return;
        }
        (*s).flags |= SAMPLE_USTACK_SHORT;
        // Read up to the end of rsp's page, then whole pages, stopping at the
        // first page that cannot be read.
        let head = 4096 - (rsp & 4095) as u32; // 1..=4096
        let mut done: u32 = 0;
        if head < 4096 {
            let n = head & 4095;
            if bpf_probe_read_user(dst, n, src) != 0 {
                bump(counter::USTACK_FAILED);
                return;
            }
            done = n;
        }
        // Bounded loop: at most USER_STACK_BYTES / 4096 pages.
        for _ in 0..(USER_STACK_BYTES / 4096) {
            if done > (USER_STACK_BYTES - 4096) as u32 {
                break;
            }
            let d = (*s).ustack.as_mut_ptr().add(done as usize) as *mut core::ffi::c_void;
            if bpf_probe_read_user(d, 4096, (rsp + done as u64) as *const _) != 0 {
                break;
            }
            done += 4096;
        }
        if done == 0 {
            bump(counter::USTACK_FAILED);
        }
        (*s).ustack_len = done;
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
