//! The ptrace side of bursty tracing: attach (inject the clones, or re-arm
//! an earlier injection), the handler's installation, stuck-burst reaping
//! and detach.
//!
//! Attach: analyse the executable (the plan), stop the process with ptrace,
//! map a memfd (`MAP_SHARED`: the [`BurstControl`] page and the record
//! ring, also mapped by the daemon) and an executable region next to it,
//! both within ±2 GiB of the binary; generate the clones for that address,
//! write them, install the handler on a signal the target does not use,
//! arm, resume. The original code is never written. Everything slow
//! (analysis, generation) happens before the target is stopped; all of it
//! blocks the calling thread, which is why the session runs it on a thread
//! of its own ([`super::Bursts::start`]).
//!
//! Detach: disarm (no new bursts; a running one ends at its next check),
//! then under ptrace set the signal to `SIG_IGN` (discarding a signal still
//! pending) and back to its old disposition. The regions stay mapped:
//! threads may still hold return addresses into clones, which lead back to
//! the original code at the next check. A later attach finds the memfd in
//! `/proc/PID/maps` and reuses it.
use std::mem::offset_of;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::{Context as _, bail};
use burstyd_common::addr::Pid;
use burstyd_common::burst::{
    ARMED_OFFSET, BurstControl, BurstLocal, BurstTarget, CLONE_PAGE_SHIFT, CONTROL_BYTES,
    CONTROL_MAGIC, LOCAL_BYTES, LOCAL_OFFSET,
};
use tracing::{debug, info, warn};
use userspace_rewriter::analysis::plan::{self, FunctionStatus, Plan, PlanOptions};
use userspace_rewriter::codegen::unwind_info;
use userspace_rewriter::codegen::{self, Layout};
use userspace_rewriter::inject::{self, KernelSigaction, SA_RESTORER, Tracee};

use super::BurstOptions;
use super::coverage::CodeMap;
use super::ring::{SharedRegion, TargetCounters};
use crate::export::fdata::FdataFacts;
use crate::stacks::clones::CloneFrames;

/// Record ring sizes (words of 8 bytes).
const RING_WORDS: u64 = 1 << 19; // 4 MiB
const RING_WORDS_FULL: u64 = 1 << 23; // 64 MiB

const MEMFD_NAME: &str = "burstyd-bursts";

/// `BurstLocal::owner`, from the control block.
const OWNER_OFFSET: u64 = (LOCAL_OFFSET + offset_of!(BurstLocal, owner)) as u64;

/// A target with the clones injected and the handler installed: what
/// the session needs to arm, reap and detach it.
pub(crate) struct Attachment {
    pid: Pid,
    /// Address of the control block in the target.
    control_addr: u64,
    region: SharedRegion,
    signal: i32,
    old_action: KernelSigaction,
    /// Target-side counters at attach (an earlier session's are in them).
    baseline: TargetCounters,
    /// (head, bursts) at the previous drain and how many drains saw the
    /// same running burst make no progress.
    last_progress: (u64, u64),
    idle_drains: u32,
    /// Pages (address >> `CLONE_PAGE_SHIFT`) of original code with a
    /// rewritten instruction: the eBPF program signals only there.
    pages: Vec<u64>,
}

/// What an attach produced: the attachment, and what the tracer keeps of
/// the analysis (the analysis itself and the file's bytes are dropped).
pub(crate) struct Attached {
    pub(crate) attachment: Attachment,
    /// `/proc/PID/exe`.
    pub(crate) exe: PathBuf,
    pub(crate) plan: Plan,
    /// Load bias of the executable (AVMA − SVMA).
    pub(crate) bias: u64,
    /// The clones, for unwinding samples taken during bursts.
    pub(crate) frames: CloneFrames,
    /// What `edges.fdata` needs from the file and the analysis.
    pub(crate) fdata: FdataFacts,
    pub(crate) functions_rewritten: usize,
    pub(crate) functions_skipped: usize,
    /// What the hot coverage needs: where the executable and its cloned
    /// functions are.
    pub(crate) code: CodeMap,
}

/// What an attach put into the target.
struct Injected {
    pid: Pid,
    exe: PathBuf,
    plan: Plan,
    bias: u64,
    /// `[lo, hi)`: the executable's mappings (AVMAs).
    exe_range: (u64, u64),
    /// Address of the control block in the target.
    control: u64,
    region: SharedRegion,
    img: codegen::CloneImage,
    /// The clones' `.eh_frame`: address in the target and bytes.
    eh: (u64, Vec<u8>),
    signal: i32,
    old_action: KernelSigaction,
}

impl Injected {
    fn attached(
        self,
        data: &[u8],
        analysis: &userspace_rewriter::analysis::cfg::Analysis,
    ) -> Attached {
        let Injected {
            pid,
            exe,
            plan,
            bias,
            exe_range,
            control,
            region,
            img,
            eh,
            signal,
            old_action,
        } = self;
        let functions_skipped =
            img.skipped.values().sum::<usize>() + plan.summary.skipped.values().sum::<usize>();
        let fdata = FdataFacts::new(data, &plan, analysis);
        let baseline = region.target_counters();
        let mut pages: Vec<u64> = img
            .table()
            .iter()
            .map(|&(orig, _)| orig >> CLONE_PAGE_SHIFT)
            .collect();
        pages.dedup();
        let code = CodeMap::new(
            exe_range,
            img.functions
                .iter()
                .map(|f| (f.orig(), f.orig() + plan.functions[f.fid() as usize].size)),
        );
        Attached {
            attachment: Attachment {
                pid,
                control_addr: control,
                region,
                signal,
                old_action,
                baseline,
                last_progress: (0, 0),
                idle_drains: 0,
                pages,
            },
            exe,
            plan,
            bias,
            frames: CloneFrames {
                range: img.code_range.0..img.code_range.1,
                eh_frame: eh.1.into(),
                eh_frame_addr: eh.0,
                map: img.reverse,
            },
            fdata,
            functions_rewritten: img.functions.len(),
            functions_skipped,
            code,
        }
    }
}

/// Our pid for `BurstControl::tracer`: as the target's pid namespace
/// sees it, which is ours only if we share it (0 otherwise: the target
/// cannot check on us).
fn tracer_as_seen_by(pid: Pid) -> u64 {
    let ns = |p: &str| std::fs::metadata(format!("/proc/{p}/ns/pid")).map(|m| m.ino());
    match (ns("self"), ns(&pid.to_string())) {
        (Ok(a), Ok(b)) if a == b => std::process::id().into(),
        _ => 0,
    }
}

/// The daemon named by a region's `tracer`, if it is another burstyd that
/// is still running.
fn live_tracer(tracer: u64) -> Option<u64> {
    let t = u32::try_from(tracer).ok().filter(|&t| t != 0)?;
    if t == std::process::id() || !crate::sys::process_running(Pid(t)) {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{t}/comm")).ok()?;
    comm.starts_with("burstyd").then_some(tracer)
}

/// A fast content hash of the executable (FNV-1a), to tell whether an
/// injected region was made for this very file.
fn exe_id(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Injects (or re-arms) the clones in `pid`.
pub(crate) fn attach(pid: Pid, opts: &BurstOptions) -> anyhow::Result<Attached> {
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let data = std::fs::read(&exe)
        .with_context(|| format!("reading the executable of pid {pid} ({})", exe.display()))?;
    if inject::shadow_stack_enabled(pid) {
        bail!("pid {pid} runs with CET shadow stacks; bursty tracing cannot redirect its returns");
    }
    let t0 = std::time::Instant::now();
    let (report, analysis) = plan::analyze_with_insns(&data, &PlanOptions::default())
        .with_context(|| format!("analysing {}", exe.display()))?;
    let plan = report.plan;
    let id = exe_id(&data);
    let analysis_ms = t0.elapsed().as_secs_f64() * 1e3;

    // Where the executable is mapped. One removed or replaced on disk since
    // it started is still the mapped one: `/proc/PID/exe` and the maps
    // lines then end in " (deleted)", which the paths compared here lack.
    let maps = inject::maps(pid)?;
    let exe_link = std::fs::read_link(&exe).unwrap_or_default();
    let exe_link = exe_link.to_string_lossy();
    let exe_path = exe_link.strip_suffix(" (deleted)").unwrap_or(&exe_link);
    let own: Vec<_> = maps.iter().filter(|m| m.is_path(exe_path)).collect();
    let (Some(lo), Some(hi)) = (
        own.iter().map(|m| m.start).min(),
        own.iter().map(|m| m.end).max(),
    ) else {
        bail!("pid {pid}: {exe_path} is not in /proc/{pid}/maps");
    };
    let exe_range = (lo, hi);
    let elf = userspace_rewriter::analysis::elf::ElfInfo::parse(&data)?;
    let first = own.iter().min_by_key(|m| m.offset).unwrap();
    let bias = elf
        .load_bias_for(first.start, first.offset, first.is_exec())
        .context("no PT_LOAD segment for the executable's first mapping")?;

    let ring_words = if opts.full_trace {
        RING_WORDS_FULL
    } else {
        RING_WORDS
    };
    let shm_len = CONTROL_BYTES as u64 + ring_words * 8;

    // Functions whose unwind info cannot be restated are not cloned:
    // C++ exceptions and backtraces must unwind through every clone.
    let exclude = unwind_info::untranslatable(
        &data,
        plan.functions.iter().filter_map(|f| match f.status {
            FunctionStatus::Analyzed(_) => Some(f.start),
            _ => None,
        }),
    );
    // An earlier attach's region, if it was made for this file (a memfd's
    // maps line says " (deleted)"; the path here is without it).
    let memfd = format!("/memfd:{MEMFD_NAME}");
    if let Some(m) = maps
        .iter()
        .find(|m| m.path.as_deref().is_some_and(|p| p.starts_with(&memfd)))
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
            .context("opening the existing burst region")?;
        // SAFETY: shared memory with the target; we only access it
        // through volatile/atomic reads and writes of plain integers.
        let shm = unsafe { memmap2::MmapMut::map_mut(&f)? };
        let cb = shm.as_ptr() as *const BurstControl;
        // SAFETY: the mapping is at least a page, BurstControl fits.
        let (magic, old_id) = unsafe { ((*cb).magic, (*cb).exe_id) };
        if magic == CONTROL_MAGIC && old_id == id {
            // SAFETY: as above.
            let (made_for, tracer) = unsafe { ((*cb).made_for, (*cb).tracer) };
            if made_for != u64::from(pid.0) {
                bail!(
                    "pid {pid} inherited its burst region through fork from pid {made_for}, which it still shares with it; tracing it in bursts would mix the two"
                );
            }
            if let Some(other) = live_tracer(tracer) {
                bail!(
                    "pid {pid} is already traced in bursts by another burstyd (pid {other}); one tracer per process"
                );
            }
            return rearm(
                pid,
                exe,
                plan,
                (bias, (lo, hi)),
                m.start,
                SharedRegion::new(shm),
                opts,
                &analysis,
                &exclude,
                &data,
            );
        }
        if magic != CONTROL_MAGIC {
            bail!(
                "pid {pid} already holds a burst region made by another version of burstyd; restart it to trace it again"
            );
        }
        bail!(
            "pid {pid} already holds a burst region for another executable (from an earlier burstyd); restart it to trace it again"
        );
    }

    // Everything that takes time happens before the process is stopped:
    // pick the address, generate the clones and their unwind info for
    // it. Only the mapping, the writes and the handler installation
    // stop the target. The gap is sized for a generous bound on the
    // code (clones plus address tables run at 6-10x the original
    // bytes); in the rare case the code outgrows it, a second
    // generation at a gap of the exact size follows.
    let exceptions = uses_exceptions(&data, &analysis);
    let register_frame = register_frame_fn(pid, &maps, &plan, bias);
    let original: u64 = plan
        .functions
        .iter()
        .filter(|f| matches!(f.status, FunctionStatus::Analyzed(_)))
        .map(|f| f.size)
        .sum();
    let mut code_len = (32 * original + (2 << 20)).min(256 << 20);
    let (img, eh, base) = loop {
        let base = inject::find_gap_near(pid, lo, hi, shm_len + code_len)?;
        let layout = Layout {
            bias,
            control: base,
            code: base + shm_len,
        };
        let img = codegen::generate_excluding(&plan, &analysis, &layout, &exclude)?;
        let eh = unwind_info::eh_frame(&data, &img, bias).map_err(anyhow::Error::msg)?;
        let need = (((img.bytes.len() as u64 + 15) & !15) + eh.bytes.len() as u64 + 0xfff) & !0xfff;
        if need <= code_len {
            code_len = need;
            break (img, eh, base);
        }
        if need > 1 << 31 {
            bail!("the clones would take {need} bytes: too large to map near the binary");
        }
        code_len = need;
    };
    let code = base + shm_len;
    let eh_addr = code + ((img.bytes.len() as u64 + 15) & !15);

    let generation_ms = t0.elapsed().as_secs_f64() * 1e3 - analysis_ms;
    let mut t = Tracee::attach(pid).context("stopping the target with ptrace")?;
    let stopped = std::time::Instant::now();
    for &tid in t.threads() {
        if t.regs(tid).fs_base == 0 {
            bail!("thread {tid} of pid {pid} has no TLS (fs base 0); cannot trace it in bursts");
        }
    }
    let signal = inject::free_signal(pid)?;
    // Ask the target's seccomp filters about every call below before
    // making the first: a filter that kills on one must not see any.
    let (rw, rx) = (
        libc::PROT_READ | libc::PROT_WRITE,
        libc::PROT_READ | libc::PROT_EXEC,
    );
    let shared = libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | libc::MAP_POPULATE;
    let private = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    // Over our own fresh mapping, so MAP_FIXED replaces nothing else.
    let local = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    let local_addr = base + LOCAL_OFFSET as u64;
    for (nr, args) in [
        (libc::SYS_memfd_create, vec![0, libc::MFD_CLOEXEC as u64]),
        (libc::SYS_ftruncate, vec![0, shm_len]),
        (
            libc::SYS_mmap,
            vec![base, shm_len, rw as u64, shared as u64, 0, 0],
        ),
        (
            libc::SYS_mmap,
            vec![
                local_addr,
                LOCAL_BYTES as u64,
                rw as u64,
                local as u64,
                u64::MAX,
                0,
            ],
        ),
        (
            libc::SYS_madvise,
            vec![local_addr, LOCAL_BYTES as u64, libc::MADV_WIPEONFORK as u64],
        ),
        (
            libc::SYS_mmap,
            vec![code, code_len, rx as u64, private as u64, u64::MAX, 0],
        ),
        (libc::SYS_close, vec![0]),
        (libc::SYS_rt_sigaction, vec![signal as u64, 0, 0, 8]),
    ] {
        t.check_syscall(nr, &args)?;
    }
    if opts.full_trace {
        // What the runtime itself calls while a full ring waits.
        t.check_syscall(libc::SYS_sched_yield, &[])?;
        t.check_syscall(libc::SYS_kill, &[tracer_as_seen_by(pid), 0])?;
    }
    let fd = t.memfd_create(MEMFD_NAME, libc::MFD_CLOEXEC)?;
    t.syscall(libc::SYS_ftruncate, &[fd as u64, shm_len])?;
    // MAP_FIXED_NOREPLACE: if the program mapped something into the
    // gap since we looked, this fails cleanly and nothing is replaced.
    // Populated: the eBPF program reads `armed`/`active` with
    // bpf_probe_read_user, which cannot fault a page in.
    t.mmap(base, shm_len, rw, shared, fd, 0).context(
        "mapping the burst region (the address space changed while the clones were generated?)",
    )?;
    // The burst's own state is private to the process and reads as
    // zeros in a forked child (see `BurstLocal`).
    t.mmap(local_addr, LOCAL_BYTES as u64, rw, local, -1, 0)
        .context("mapping the private burst state")?;
    t.syscall(
        libc::SYS_madvise,
        &[local_addr, LOCAL_BYTES as u64, libc::MADV_WIPEONFORK as u64],
    )
    .context("madvise(MADV_WIPEONFORK) on the private burst state")?;
    t.write_memory(
        local_addr + offset_of!(BurstLocal, present) as u64,
        &1u64.to_ne_bytes(),
    )?;
    t.mmap(code, code_len, rx, private, -1, 0)
        .context("mapping the clone code")?;
    let shm_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .context("opening the burst memfd")?;
    t.close(fd)?;
    // SAFETY: as above.
    let mut region = SharedRegion::new(unsafe { memmap2::MmapMut::map_mut(&shm_file)? });
    t.write_memory(code, &img.bytes)?;
    t.write_memory(eh_addr, &eh.bytes)?;
    // Register the clones' unwind info with the target's unwinder, so
    // that exceptions and backtraces pass through clone frames.
    let registered = match register_frame {
        Some(f) => match t.call(f, &[eh_addr]) {
            Ok(_) => true,
            Err(e) => {
                warn!(%pid, "registering the clones' unwind info failed: {e}");
                false
            }
        },
        None => false,
    };
    if exceptions && !registered {
        bail!(
            "pid {pid} uses C++ exceptions but its unwinder (__register_frame in libgcc_s) could not take the clones' unwind info; not tracing it in bursts"
        );
    }
    debug!(%pid, fdes = eh.fdes, registered, "clone unwind info");
    {
        let cb = region.control_mut();
        cb.magic = CONTROL_MAGIC;
        cb.ring_mask = ring_words - 1;
        cb.ring_addr = base + CONTROL_BYTES as u64;
        cb.table_addr = img.table_addr;
        cb.table_len = img.table_len;
        cb.fn_table_addr = img.fn_table_addr;
        cb.fn_table_len = img.fn_table_len;
        cb.ret_table_addr = img.ret_table_addr;
        cb.ret_table_len = img.ret_table_len;
        cb.clone_lo = img.code_range.0;
        cb.clone_hi = img.code_range.1;
        cb.handler = img.handler;
        cb.restorer = img.restorer;
        cb.signal = signal as u64;
        cb.exe_id = id;
        cb.eh_frame = if registered { eh_addr } else { 0 };
        cb.made_for = pid.0.into();
        cb.tracer = tracer_as_seen_by(pid);
    }
    let old_action = install_handler(&mut t, signal, img.handler, img.restorer)?;
    set_run_options(&mut region, opts);
    t.detach()?;
    let stopped_ms = stopped.elapsed().as_secs_f64() * 1e3;
    info!(
        %pid,
        "bursty tracing: {} functions rewritten ({} skipped), {} KiB of clones at {code:#x}, signal {signal}; analysis {analysis_ms:.0} ms, generation {generation_ms:.0} ms, target stopped {stopped_ms:.1} ms",
        img.functions.len(),
        img.skipped.values().sum::<usize>() + plan.summary.skipped.values().sum::<usize>(),
        img.bytes.len() / 1024
    );
    Ok(Injected {
        pid,
        exe,
        plan,
        bias,
        exe_range,
        control: base,
        region,
        img,
        eh: (eh_addr, eh.bytes),
        signal,
        old_action,
    }
    .attached(&data, &analysis))
}

/// Re-arms the clones an earlier attach injected for this very file.
#[allow(clippy::too_many_arguments)]
fn rearm(
    pid: Pid,
    exe: PathBuf,
    plan: Plan,
    (bias, exe_range): (u64, (u64, u64)),
    base: u64,
    mut region: SharedRegion,
    opts: &BurstOptions,
    analysis: &userspace_rewriter::analysis::cfg::Analysis,
    exclude: &std::collections::BTreeSet<u64>,
    data: &[u8],
) -> anyhow::Result<Attached> {
    let (handler, restorer, signal, code) = {
        let cb = region.control_mut();
        (cb.handler, cb.restorer, cb.signal as i32, cb.clone_lo)
    };
    // The function table is a pure function of the plan and the layout.
    let img = codegen::generate_excluding(
        &plan,
        analysis,
        &Layout {
            bias,
            control: base,
            code,
        },
        exclude,
    )?;
    let eh = unwind_info::eh_frame(data, &img, bias).map_err(anyhow::Error::msg)?;
    let eh_addr = code + ((img.bytes.len() as u64 + 15) & !15);
    let mut t = Tracee::attach(pid).context("stopping the target with ptrace")?;
    let current = t.rt_sigaction(signal, None)?;
    if current.handler > 1 && current.handler != handler {
        bail!("pid {pid} now uses signal {signal} itself; cannot re-arm bursts");
    }
    let old_action = install_handler(&mut t, signal, handler, restorer)?;
    // Whatever an interrupted earlier session left.
    t.write_memory(base + OWNER_OFFSET, &0u64.to_ne_bytes())?;
    {
        let cb = region.control_mut();
        cb.active = 0;
        cb.tracer = tracer_as_seen_by(pid);
    }
    set_run_options(&mut region, opts);
    t.detach()?;
    info!(
        %pid,
        "bursty tracing: re-armed the clones injected earlier (signal {signal})"
    );
    Ok(Injected {
        pid,
        exe,
        plan,
        bias,
        exe_range,
        control: base,
        region,
        img,
        eh: (eh_addr, eh.bytes),
        signal,
        old_action,
    }
    .attached(data, analysis))
}

impl Attachment {
    /// The eBPF `BURSTS` map entry.
    pub(crate) fn target(&self) -> BurstTarget {
        BurstTarget {
            armed_addr: self.control_addr + ARMED_OFFSET as u64,
            signal: self.signal as u32,
            _pad: 0,
            handler: self.region.control().handler,
        }
    }

    /// The pages of original code where a burst can start.
    pub(crate) fn pages(&self) -> &[u64] {
        &self.pages
    }

    /// The memory shared with the target (control block and record ring).
    pub(crate) fn region(&self) -> &SharedRegion {
        &self.region
    }

    /// The target-side counters since this attach.
    pub(crate) fn counters_since_attach(&self) -> TargetCounters {
        let now = self.region.target_counters();
        std::array::from_fn(|i| now[i].wrapping_sub(self.baseline[i]))
    }

    /// Clears `tracer`: the region is free for another burstyd.
    pub(crate) fn release(&mut self) {
        self.region.control_mut().tracer = 0;
    }

    /// No new bursts; a running one ends at its next check.
    pub(crate) fn disarm(&mut self) {
        self.region.control_mut().armed = 0;
        self.clear_owner();
    }

    /// Clears the private `owner` of the running burst (through
    /// `/proc/PID/mem`: the daemon does not map the target's private
    /// state), so that its thread fails its next check. Best effort: a
    /// process that is gone has no burst to end.
    fn clear_owner(&self) {
        use std::os::unix::fs::FileExt;
        let r = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", self.pid))
            .and_then(|f| f.write_all_at(&0u64.to_ne_bytes(), self.control_addr + OWNER_OFFSET));
        if let Err(e) = r {
            debug!(pid = %self.pid, "clearing the burst owner: {e}");
        }
    }

    /// A burst whose thread left the clones without passing a check (an
    /// exception or `longjmp` into original code) stays "active" and would
    /// block every later burst. A running burst writes records all the
    /// time (at least at every back edge and return); one that wrote
    /// nothing across two drains (the ring's `head` did not move) is ended
    /// here, and true returned. Its thread, should it return into a clone
    /// later, fails that return site's check (the owner is cleared first)
    /// and goes back to the original code.
    pub(crate) fn reap_stuck_burst(&mut self, head: u64) -> bool {
        let (active, bursts) = self.region.burst_state();
        if !active || (head, bursts) != self.last_progress {
            self.last_progress = (head, bursts);
            self.idle_drains = 0;
            return false;
        }
        self.idle_drains += 1;
        if self.idle_drains < 2 {
            return false;
        }
        // The owner first (a return into a clone then fails its check),
        // then `active`.
        self.clear_owner();
        self.region.clear_active();
        self.idle_drains = 0;
        true
    }

    /// Under ptrace, puts back the target's own disposition of our signal
    /// (through `SIG_IGN`, which discards an instance still pending) —
    /// only if our handler is still installed: a process that exec'd since
    /// (same pid, new image) has its own dispositions. A process that is
    /// gone (or a zombie) needs nothing.
    pub(crate) fn restore_signal(&mut self) -> anyhow::Result<()> {
        match Tracee::attach(self.pid) {
            Ok(mut t) => {
                let ours = self.region.control().handler;
                let current = t.rt_sigaction(self.signal, None)?;
                if current.handler != ours {
                    debug!(
                        pid = %self.pid,
                        "signal {} no longer ours; left alone", self.signal
                    );
                    t.detach()?;
                    return Ok(());
                }
                // SIG_IGN discards an instance still pending; then the old one.
                let ign = KernelSigaction {
                    handler: 1,
                    ..Default::default()
                };
                t.rt_sigaction(self.signal, Some(&ign))?;
                t.rt_sigaction(self.signal, Some(&self.old_action))?;
                t.detach()?;
            }
            Err(e) if !crate::sys::process_running(self.pid) => {
                debug!("pid {} exited before detach: {e}", self.pid);
            }
            Err(e) => return Err(e).context("restoring the target's signal disposition"),
        }
        Ok(())
    }
}

fn set_run_options(region: &mut SharedRegion, opts: &BurstOptions) {
    let cb = region.control_mut();
    cb.burst_len = if opts.full_trace {
        u64::MAX
    } else {
        // 0: the handler returns to the original code at once.
        opts.burst_len
    };
    cb.wait_when_full = u64::from(opts.full_trace);
    std::sync::atomic::fence(Ordering::SeqCst);
    cb.armed = 1;
}

fn install_handler(
    t: &mut Tracee,
    signal: i32,
    handler: u64,
    restorer: u64,
) -> anyhow::Result<KernelSigaction> {
    let act = KernelSigaction {
        handler,
        // No SA_ONSTACK: a program's alternate stack may be too small for
        // the signal frame (MINSIGSTKSZ is 2 KiB, the x86-64 frame with
        // AVX-512 state is larger). The eBPF program sends no signal to a
        // thread already on its alternate stack.
        flags: (libc::SA_SIGINFO | libc::SA_RESTART) as u64 | SA_RESTORER,
        restorer,
        // Block everything while it runs (it is short).
        mask: !0,
    };
    Ok(t.rt_sigaction(signal, Some(&act))?)
}

/// Whether the program throws C++ exceptions (or otherwise unwinds with
/// libgcc): landing pads, or imports of the throwing/unwinding entry points.
fn uses_exceptions(data: &[u8], analysis: &userspace_rewriter::analysis::cfg::Analysis) -> bool {
    use object::{Object, ObjectSymbol};
    if analysis.functions.iter().any(|f| f.has_lsda) {
        return true;
    }
    let Ok(file) = object::File::parse(data) else {
        return true;
    };
    file.dynamic_symbols().any(|s| {
        s.is_undefined()
            && matches!(
                s.name(),
                Ok("__cxa_throw"
                    | "__cxa_rethrow"
                    | "_Unwind_RaiseException"
                    | "_Unwind_Resume"
                    | "_Unwind_ForcedUnwind")
            )
    })
}

/// `__register_frame` in the target: libgcc_s's export, or a copy linked
/// into the executable (static libgcc_eh).
fn register_frame_fn(pid: Pid, maps: &[inject::MapEntry], plan: &Plan, bias: u64) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    if let Some(f) = plan.functions.iter().find(|f| f.name == "__register_frame") {
        return Some(f.start.wrapping_add(bias));
    }
    // By file name: a libgcc_s replaced on disk (its maps line says
    // " (deleted)") is still the one mapped, and read through map_files.
    let lib: Vec<&inject::MapEntry> = maps
        .iter()
        .filter(|m| {
            m.path
                .as_deref()
                .and_then(|p| Path::new(p).file_name())
                .is_some_and(|n| n.to_string_lossy().starts_with("libgcc_s.so"))
        })
        .collect();
    let first = lib.iter().min_by_key(|m| m.offset)?;
    let data = std::fs::read(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        first.start, first.end
    ))
    .ok()?;
    let elf = userspace_rewriter::analysis::elf::ElfInfo::parse(&data).ok()?;
    let lbias = elf.load_bias_for(first.start, first.offset, first.is_exec())?;
    let file = object::File::parse(&*data).ok()?;
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("__register_frame") && !s.is_undefined())?;
    Some(sym.address().wrapping_add(lbias))
}

/// `burstyd run` releases its command just before the session starts; the
/// exec replaces the gate (burstyd itself) within milliseconds.
pub(crate) fn wait_for_exec(pid: Pid) {
    let me = std::fs::read_link("/proc/self/exe").ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(p) if Some(&p) != me.as_ref() => {
                // Let the dynamic loader map the libraries and set up TLS.
                std::thread::sleep(std::time::Duration::from_millis(5));
                return;
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            Err(_) => return,
        }
    }
}
