//! Bursty tracing of one live process (`--pid`, `run`): inject the
//! instrumented clones, arm them, drain burst records, build path profiles,
//! disarm.
//!
//! Attach: analyse the executable (the plan), stop the process with ptrace,
//! map a memfd (`MAP_SHARED`: the [`BurstControl`] page and the record
//! ring, also mapped by the daemon) and an executable region next to it,
//! both within ±2 GiB of the binary; generate the clones for that address,
//! write them, install the handler on a signal the target does not use,
//! arm, resume. The original code is never written. The eBPF overflow
//! program then signals a thread whenever its process is armed and idle
//! (`BURSTS` map).
//!
//! Detach: disarm (no new bursts; a running one ends at its next check),
//! drop the `BURSTS` entry, then under ptrace set the signal to `SIG_IGN`
//! (discarding a signal still pending) and back to its old disposition.
//! The regions stay mapped: threads may still hold return addresses into
//! clones, which lead back to the original code at the next check. A later
//! attach finds the memfd in `/proc/PID/maps` and reuses it.
//!
//! If the daemon dies, the target keeps its handler and regions; without
//! the eBPF program no burst starts, and nothing in the target waits for
//! the daemon (a full ring truncates the burst; in full-trace mode the
//! writer yields a bounded number of times, then drops).
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, bail};
use burstyd_common::burst::*;
use tracing::{debug, info, warn};
use userspace_rewriter::clone::{self, Layout};
use userspace_rewriter::inject::{self, KernelSigaction, SA_RESTORER, Tracee};
use userspace_rewriter::plan::{self, FunctionStatus, Plan, PlanOptions};
use userspace_rewriter::unwind_info;

use crate::export::pprof::{LineKey, MappingKey, ProfileBuilder, encode_gzip};

/// How bursts run.
#[derive(Clone, Debug)]
pub(crate) struct BurstOptions {
    /// Checks per burst (`--burst`).
    pub(crate) burst_len: u64,
    /// Every event, from the first burst on, for ground truth.
    pub(crate) full_trace: bool,
    /// Write raw burst traces here (`--save-bursts`).
    pub(crate) save_bursts: Option<PathBuf>,
}

/// Default checks per burst.
pub(crate) const DEFAULT_BURST: u64 = 200;

/// Record ring sizes (words of 8 bytes).
const RING_WORDS: u64 = 1 << 19; // 4 MiB
const RING_WORDS_FULL: u64 = 1 << 23; // 64 MiB

const MEMFD_NAME: &str = "burstyd-bursts";

/// Totals reported at the end.
#[derive(Clone, Debug, Default)]
pub(crate) struct BurstStats {
    pub(crate) functions_rewritten: usize,
    pub(crate) functions_skipped: usize,
    pub(crate) bursts: u64,
    pub(crate) bursts_truncated: u64,
    pub(crate) declined_busy: u64,
    pub(crate) declined_pc: u64,
    /// Signals handled with `--burst 0` (straight back to the original).
    pub(crate) declined_budget: u64,
    pub(crate) records: u64,
    pub(crate) records_lost: u64,
    pub(crate) paths: u64,
    pub(crate) partial_paths: u64,
    pub(crate) bad_records: u64,
    /// Bursts ended by the daemon: their thread left the clones without a
    /// check (an exception or longjmp into original code).
    pub(crate) reaped: u64,
}

/// Calling contexts inside bursts, interned as a tree of `(parent, fid)`
/// nodes (node 0: no caller seen in the burst), so that counting a path
/// allocates nothing.
#[derive(Default)]
struct Contexts {
    nodes: Vec<(u32, u32)>,
    index: HashMap<(u32, u32), u32>,
}

impl Contexts {
    /// The node for `fid` entered from context `parent`.
    fn child(&mut self, parent: u32, fid: u32) -> u32 {
        if self.nodes.is_empty() {
            self.nodes.push((0, u32::MAX));
        }
        let next = self.nodes.len() as u32;
        let node = *self.index.entry((parent, fid)).or_insert(next);
        if node == next {
            self.nodes.push((parent, fid));
        }
        node
    }

    /// The functions of a context, outermost first.
    fn fids(&self, mut node: u32) -> Vec<u32> {
        let mut out = Vec::new();
        while node != 0 {
            let (parent, fid) = self.nodes[node as usize];
            out.push(fid);
            node = parent;
        }
        out.reverse();
        out
    }
}

/// What an attach put into the target, for [`BurstTracer::new`].
struct Injected {
    pid: u32,
    exe: PathBuf,
    plan: Plan,
    bias: u64,
    /// Address of the control block in the target.
    control: u64,
    shm: memmap2::MmapMut,
    img: clone::CloneImage,
    /// The clones' `.eh_frame`: address in the target and bytes.
    eh: (u64, Vec<u8>),
    signal: i32,
    old_action: KernelSigaction,
    /// `llvm-bolt`'s names of the functions, by start address.
    bolt_names: HashMap<u64, String>,
}

/// One process being traced in bursts.
pub(crate) struct BurstTracer {
    pid: u32,
    exe: PathBuf,
    plan: Plan,
    bias: u64,
    control_addr: u64,
    shm: memmap2::MmapMut,
    signal: i32,
    old_action: KernelSigaction,
    /// (context node, fid, path) -> executions.
    counts: HashMap<(u32, u32, u64), u64>,
    /// Calling contexts seen inside bursts.
    contexts: Contexts,
    /// The current burst's stack of entered functions: (fid, its context
    /// node, i.e. the context including it).
    stack: Vec<(u32, u32)>,
    stats: BurstStats,
    save: Option<std::io::BufWriter<std::fs::File>>,
    burst_tid: u32,
    /// (head, bursts) at the previous drain and how many drains saw the
    /// same running burst make no progress.
    last_progress: (u64, u64),
    idle_drains: u32,
    /// Target-side counters at attach (an earlier session's are in them).
    baseline: [u64; 6],
    /// `llvm-bolt`'s names of the functions (local ones as `name/N`), by
    /// start address (SVMA), for `edges.fdata`.
    bolt_names: HashMap<u64, String>,
    /// Per function with paths: the address (SVMA) of each block's last
    /// instruction (its branch), for `edges.fdata`.
    last_insn: HashMap<u32, Vec<u64>>,
    /// The clones, for unwinding samples taken during bursts.
    frames: std::sync::Arc<crate::stacks::clones::CloneFrames>,
    /// DWARF lines of the executable, opened while the process lives.
    lines: Option<addr2line::Loader>,
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

impl BurstTracer {
    /// Injects (or re-arms) the clones in `pid`.
    pub(crate) fn attach(pid: u32, opts: &BurstOptions) -> anyhow::Result<Self> {
        let exe = PathBuf::from(format!("/proc/{pid}/exe"));
        let data = std::fs::read(&exe)
            .with_context(|| format!("reading the executable of pid {pid} ({})", exe.display()))?;
        if inject::shadow_stack_enabled(pid as i32) {
            bail!(
                "pid {pid} runs with CET shadow stacks; bursty tracing cannot redirect its returns"
            );
        }
        let t0 = std::time::Instant::now();
        let (report, analysis) = plan::analyze_with_insns(&data, &PlanOptions::default())
            .with_context(|| format!("analysing {}", exe.display()))?;
        let plan = report.plan;
        let id = exe_id(&data);
        let analysis_ms = t0.elapsed().as_secs_f64() * 1e3;

        // Where the executable is mapped.
        let maps = inject::maps(pid as i32)?;
        let exe_path = std::fs::read_link(&exe).unwrap_or_default();
        let exe_path = exe_path.to_string_lossy().replace(" (deleted)", "");
        let own: Vec<_> = maps.iter().filter(|m| m.path == exe_path).collect();
        let (Some(lo), Some(hi)) = (
            own.iter().map(|m| m.start).min(),
            own.iter().map(|m| m.end).max(),
        ) else {
            bail!("pid {pid}: {exe_path} is not in /proc/{pid}/maps");
        };
        let elf = userspace_rewriter::elf::ElfInfo::parse(&data)?;
        let first = own.iter().min_by_key(|m| m.offset).unwrap();
        let bias = elf
            .load_bias_for(first.start, first.offset, first.perms.contains('x'))
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
        // An earlier attach's region, if it was made for this file.
        if let Some(m) = maps
            .iter()
            .find(|m| m.path.starts_with(&format!("/memfd:{MEMFD_NAME}")))
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
                return Self::rearm(
                    pid, exe, plan, bias, m.start, shm, opts, &analysis, &exclude, &data,
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
            let base = inject::find_gap_near(pid as i32, lo, hi, shm_len + code_len)?;
            let layout = Layout {
                bias,
                control: base,
                code: base + shm_len,
            };
            let img = clone::generate_excluding(&plan, &analysis, &layout, &exclude)?;
            let eh = unwind_info::eh_frame(&data, &img, bias).map_err(anyhow::Error::msg)?;
            let need =
                (((img.bytes.len() as u64 + 15) & !15) + eh.bytes.len() as u64 + 0xfff) & !0xfff;
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
        let mut t = Tracee::attach(pid as i32).context("stopping the target with ptrace")?;
        let stopped = std::time::Instant::now();
        for &tid in t.threads() {
            if t.regs(tid).fs_base == 0 {
                bail!(
                    "thread {tid} of pid {pid} has no TLS (fs base 0); cannot trace it in bursts"
                );
            }
        }
        let signal = inject::free_signal(pid as i32)?;
        let fd = t.memfd_create(MEMFD_NAME, libc::MFD_CLOEXEC)?;
        t.syscall(libc::SYS_ftruncate, &[fd as u64, shm_len])?;
        // MAP_FIXED_NOREPLACE: if the program mapped something into the
        // gap since we looked, this fails cleanly and nothing is replaced.
        t.mmap(
            base,
            shm_len,
            libc::PROT_READ | libc::PROT_WRITE,
            // Populated: the eBPF program reads `armed`/`active` with
            // bpf_probe_read_user, which cannot fault a page in.
            libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | libc::MAP_POPULATE,
            fd,
            0,
        )
        .context(
            "mapping the burst region (the address space changed while the clones were generated?)",
        )?;
        t.mmap(
            code,
            code_len,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
        .context("mapping the clone code")?;
        let shm_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/fd/{fd}"))
            .context("opening the burst memfd")?;
        t.close(fd)?;
        // SAFETY: as above.
        let mut shm = unsafe { memmap2::MmapMut::map_mut(&shm_file)? };
        t.write_memory(code, &img.bytes)?;
        t.write_memory(eh_addr, &eh.bytes)?;
        // Register the clones' unwind info with the target's unwinder, so
        // that exceptions and backtraces pass through clone frames.
        let registered = match register_frame {
            Some(f) => match t.call(f, &[eh_addr]) {
                Ok(_) => true,
                Err(e) => {
                    warn!(pid, "registering the clones' unwind info failed: {e}");
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
        debug!(pid, fdes = eh.fdes, registered, "clone unwind info");
        {
            let cb = control_mut(&mut shm);
            cb.magic = CONTROL_MAGIC;
            cb.ring_mask = ring_words - 1;
            cb.ring_addr = base + CONTROL_BYTES as u64;
            cb.table_addr = img.table_addr;
            cb.table_len = img.table_len;
            cb.fn_table_addr = img.fn_table_addr;
            cb.fn_table_len = img.fn_table_len;
            cb.clone_lo = img.code_range.0;
            cb.clone_hi = img.code_range.1;
            cb.handler = img.handler;
            cb.restorer = img.restorer;
            cb.signal = signal as u64;
            cb.exe_id = id;
            cb.eh_frame = if registered { eh_addr } else { 0 };
        }
        let old_action = install_handler(&mut t, signal, img.handler, img.restorer)?;
        set_run_options(&mut shm, opts);
        t.detach()?;
        let stopped_ms = stopped.elapsed().as_secs_f64() * 1e3;
        info!(
            pid,
            "bursty tracing: {} functions rewritten ({} skipped), {} KiB of clones at {code:#x}, signal {signal}; analysis {analysis_ms:.0} ms, generation {generation_ms:.0} ms, target stopped {stopped_ms:.1} ms",
            img.functions.len(),
            img.skipped.values().sum::<usize>() + plan.summary.skipped.values().sum::<usize>(),
            img.bytes.len() / 1024
        );
        Ok(Self::new(
            Injected {
                pid,
                exe,
                plan,
                bias,
                control: base,
                shm,
                img,
                eh: (eh_addr, eh.bytes),
                signal,
                old_action,
                bolt_names: bolt_names(&data),
            },
            opts,
            &analysis,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn rearm(
        pid: u32,
        exe: PathBuf,
        plan: Plan,
        bias: u64,
        base: u64,
        mut shm: memmap2::MmapMut,
        opts: &BurstOptions,
        analysis: &userspace_rewriter::cfg::Analysis,
        exclude: &std::collections::BTreeSet<u64>,
        data: &[u8],
    ) -> anyhow::Result<Self> {
        let (handler, restorer, signal, code) = {
            let cb = control_mut(&mut shm);
            (cb.handler, cb.restorer, cb.signal as i32, cb.clone_lo)
        };
        // The function table is a pure function of the plan and the layout.
        let img = clone::generate_excluding(
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
        let mut t = Tracee::attach(pid as i32).context("stopping the target with ptrace")?;
        let current = t.rt_sigaction(signal, None)?;
        if current.handler > 1 && current.handler != handler {
            bail!("pid {pid} now uses signal {signal} itself; cannot re-arm bursts");
        }
        let old_action = install_handler(&mut t, signal, handler, restorer)?;
        {
            let cb = control_mut(&mut shm);
            // Whatever an interrupted earlier session left.
            cb.owner = 0;
            cb.active = 0;
        }
        set_run_options(&mut shm, opts);
        t.detach()?;
        info!(
            pid,
            "bursty tracing: re-armed the clones injected earlier (signal {signal})"
        );
        Ok(Self::new(
            Injected {
                pid,
                exe,
                plan,
                bias,
                control: base,
                shm,
                img,
                eh: (eh_addr, eh.bytes),
                signal,
                old_action,
                bolt_names: bolt_names(data),
            },
            opts,
            analysis,
        ))
    }

    fn new(
        inj: Injected,
        opts: &BurstOptions,
        analysis: &userspace_rewriter::cfg::Analysis,
    ) -> Self {
        let Injected {
            pid,
            exe,
            plan,
            bias,
            control: control_addr,
            shm,
            img,
            eh,
            signal,
            old_action,
            bolt_names,
        } = inj;
        let img = &img;
        let skipped: usize = img.skipped.values().sum();
        let last_insn = last_insns(&plan, analysis);
        let functions = &img.functions;
        let save = opts.save_bursts.as_ref().and_then(|p| {
            if let Some(dir) = p.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            std::fs::File::create(p)
                .map_err(|e| warn!("cannot write {}: {e}", p.display()))
                .ok()
                .map(std::io::BufWriter::new)
        });
        let stats = BurstStats {
            functions_rewritten: functions.len(),
            functions_skipped: skipped + plan.summary.skipped.values().sum::<usize>(),
            ..Default::default()
        };
        let mut t = BurstTracer {
            pid,
            exe: exe.clone(),
            plan,
            bias,
            control_addr,
            shm,
            signal,
            old_action,
            counts: HashMap::new(),
            contexts: Contexts::default(),
            stack: Vec::new(),
            stats,
            save,
            burst_tid: 0,
            bolt_names,
            last_insn,
            frames: std::sync::Arc::new(crate::stacks::clones::CloneFrames {
                range: img.code_range.0..img.code_range.1,
                eh_frame: eh.1.into(),
                eh_frame_addr: eh.0,
                map: img.reverse.clone(),
            }),
            last_progress: (0, 0),
            idle_drains: 0,
            baseline: [0; 6],
            lines: addr2line::Loader::new(&exe).ok(),
        };
        t.baseline = t.target_counters();
        t
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The clones, for the unwinder.
    pub(crate) fn clone_frames(&self) -> std::sync::Arc<crate::stacks::clones::CloneFrames> {
        self.frames.clone()
    }

    /// The eBPF `BURSTS` map entry.
    pub(crate) fn target(&self) -> BurstTarget {
        BurstTarget {
            armed_addr: self.control_addr + ARMED_OFFSET as u64,
            signal: self.signal as u32,
            _pad: 0,
        }
    }

    fn word(&self, field_off: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned u64 field inside the mapping.
        unsafe { &*(self.shm.as_ptr().add(field_off) as *const AtomicU64) }
    }

    /// Consumes every record the target wrote. Returns how many.
    pub(crate) fn drain(&mut self) -> u64 {
        let head = self
            .word(core::mem::offset_of!(BurstControl, head))
            .load(Ordering::Acquire);
        let tail_off = core::mem::offset_of!(BurstControl, tail);
        let mut tail = self.word(tail_off).load(Ordering::Relaxed);
        let mask = self
            .word(core::mem::offset_of!(BurstControl, ring_mask))
            .load(Ordering::Relaxed);
        let ring = unsafe { self.shm.as_ptr().add(CONTROL_BYTES) as *const u64 };
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
            self.record(w0, w1);
            tail += 2;
            n += 1;
        }
        self.word(tail_off).store(tail, Ordering::Release);
        self.stats.records += n;
        self.reap_stuck_burst(head);
        n
    }

    /// A burst whose thread left the clones without passing a check (an
    /// exception or `longjmp` into original code) stays "active" and would
    /// block every later burst. A running burst writes records all the
    /// time (at least at every back edge and return); one that wrote
    /// nothing across two drains is ended here. Its thread, should it
    /// return into a clone later, fails that return site's check (the owner
    /// is cleared first) and goes back to the original code.
    fn reap_stuck_burst(&mut self, head: u64) {
        use core::mem::offset_of;
        let active = {
            // SAFETY: the u32 `active` field inside the mapping.
            let p = unsafe { self.shm.as_ptr().add(offset_of!(BurstControl, active)) };
            unsafe { &*(p as *const std::sync::atomic::AtomicU32) }.load(Ordering::Acquire)
        };
        let bursts = self
            .word(offset_of!(BurstControl, bursts))
            .load(Ordering::Relaxed);
        if active == 0 || (head, bursts) != self.last_progress {
            self.last_progress = (head, bursts);
            self.idle_drains = 0;
            return;
        }
        self.idle_drains += 1;
        if self.idle_drains < 2 {
            return;
        }
        self.word(offset_of!(BurstControl, owner))
            .store(0, Ordering::SeqCst);
        // SAFETY: as above.
        let p = unsafe { self.shm.as_ptr().add(offset_of!(BurstControl, active)) };
        unsafe { &*(p as *const std::sync::atomic::AtomicU32) }.store(0, Ordering::SeqCst);
        self.stats.reaped += 1;
        self.stack.clear();
        self.idle_drains = 0;
    }

    fn record(&mut self, w0: u64, w1: u64) {
        let tag = w0 >> TAG_SHIFT;
        match tag {
            REC_START => {
                self.stack.clear();
                self.burst_tid = w0 as u32;
                self.save_line(format_args!(
                    "{{\"burst\":\"start\",\"tid\":{},\"pc\":\"{:#x}\"}}",
                    w0 as u32, w1
                ));
            }
            REC_ENTER => {
                let fid = w0 as u32;
                if self.stack.len() < 64 {
                    let parent = self.stack.last().map_or(0, |e| e.1);
                    let node = self.contexts.child(parent, fid);
                    self.stack.push((fid, node));
                }
                self.save_line(format_args!("{{\"enter\":{fid}}}"));
            }
            REC_PATH => {
                let fid = w0 as u32;
                let kind = (w0 >> 32) & 0xf;
                if w1 & PATH_INVALID != 0 {
                    self.stats.partial_paths += 1;
                } else if self.valid_path(fid, w1) {
                    self.stats.paths += 1;
                    // Context: the entered functions below this one.
                    let n = self.stack.len();
                    let ctx = match self.stack.last() {
                        Some(&(top, _)) if top == fid => {
                            n.checked_sub(2).map_or(0, |i| self.stack[i].1)
                        }
                        Some(&(_, node)) => node,
                        None => 0,
                    };
                    *self.counts.entry((ctx, fid, w1)).or_insert(0) += 1;
                } else {
                    self.stats.bad_records += 1;
                }
                self.save_line(format_args!(
                    "{{\"path\":{w1},\"fid\":{fid},\"kind\":{kind}}}"
                ));
                if (kind == PATH_END_RETURN || kind == PATH_END_TAIL)
                    && self.stack.last().map(|e| e.0) == Some(fid)
                {
                    self.stack.pop();
                }
            }
            REC_END => {
                self.stack.clear();
                self.save_line(format_args!(
                    "{{\"burst\":\"end\",\"reason\":{}}}",
                    w0 & 0xff
                ));
            }
            _ => self.stats.bad_records += 1,
        }
    }

    fn valid_path(&self, fid: u32, path: u64) -> bool {
        self.numbering(fid).is_some_and(|n| path < n.total_paths())
    }

    fn numbering(&self, fid: u32) -> Option<&userspace_rewriter::paths::PathNumbering> {
        match &self.plan.functions.get(fid as usize)?.status {
            FunctionStatus::Analyzed(fa) => fa.numbering.as_ref(),
            _ => None,
        }
    }

    fn save_line(&mut self, line: std::fmt::Arguments) {
        if let Some(w) = &mut self.save {
            let _ = writeln!(w, "{line}");
        }
    }

    fn target_counters(&self) -> [u64; 6] {
        use core::mem::offset_of;
        [
            offset_of!(BurstControl, bursts),
            offset_of!(BurstControl, truncated),
            offset_of!(BurstControl, declined_busy),
            offset_of!(BurstControl, declined_pc),
            offset_of!(BurstControl, lost_records),
            offset_of!(BurstControl, declined_budget),
        ]
        .map(|off| self.word(off).load(Ordering::Relaxed))
    }

    /// Counters from the target side (this session's), folded into the
    /// stats.
    pub(crate) fn stats(&self) -> BurstStats {
        let now = self.target_counters();
        let d = |i: usize| now[i].wrapping_sub(self.baseline[i]);
        let mut s = self.stats.clone();
        s.bursts = d(0);
        s.bursts_truncated = d(1);
        s.declined_busy = d(2);
        s.declined_pc = d(3);
        s.records_lost = d(4);
        s.declined_budget = d(5);
        s
    }

    /// No new bursts; a running one ends at its next check.
    pub(crate) fn disarm(&mut self) {
        let cb = control_mut(&mut self.shm);
        cb.armed = 0;
        cb.owner = 0;
    }

    /// Stops bursts and restores the signal disposition.
    pub(crate) fn detach(mut self) -> anyhow::Result<BurstStats> {
        self.disarm();
        // Let a signal already in flight arrive and be declined.
        std::thread::sleep(std::time::Duration::from_millis(20));
        self.drain();
        let stats = self.stats();
        if let Some(w) = &mut self.save {
            let _ = w.flush();
        }
        match Tracee::attach(self.pid as i32) {
            Ok(mut t) => {
                // Only our own handler is replaced: a process that exec'd
                // since (same pid, new image) has its own dispositions.
                let ours = control_mut(&mut self.shm).handler;
                let current = t.rt_sigaction(self.signal, None)?;
                if current.handler != ours {
                    debug!(
                        pid = self.pid,
                        "signal {} no longer ours; left alone", self.signal
                    );
                    t.detach()?;
                    return Ok(stats);
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
        Ok(stats)
    }

    /// `edges.fdata`: the edge profile derived from the paths, in BOLT's
    /// branch-profile format (`1 FUNC FROM 1 FUNC TO MISPREDS COUNT`,
    /// offsets in hex from the function start), for `llvm-bolt -data=`.
    /// FROM is the last byte of the source block (inside its branch), TO the
    /// target block's start; call fall-throughs are not branches for BOLT
    /// and are left out.
    pub(crate) fn fdata(&self) -> String {
        use userspace_rewriter::cfg::EdgeKind;
        let mut edges: std::collections::BTreeMap<(u32, u64, u64), u64> = Default::default();
        for ((_, fid, path), n) in &self.counts {
            let f = &self.plan.functions[*fid as usize];
            let FunctionStatus::Analyzed(fa) = &f.status else {
                continue;
            };
            let (Some(cfg), Some(num)) = (fa.cfg.as_ref(), fa.numbering.as_ref()) else {
                continue;
            };
            let Ok(p) = num.regenerate(*path) else {
                continue;
            };
            for (v, idx) in p.edges.iter().copied().chain(p.end_edge) {
                let Some(e) = cfg.edges.iter().filter(|e| e.from == v).nth(idx) else {
                    continue;
                };
                // BOLT counts branches: a block that merely falls into the
                // next one (or returns from a call) has none.
                if matches!(e.kind, EdgeKind::CallFallThrough | EdgeKind::FallThrough) {
                    continue;
                }
                let Some(&last) = self.last_insn.get(fid).and_then(|l| l.get(v)) else {
                    continue;
                };
                let from = last - f.start;
                let to = cfg.blocks[e.to].start - f.start;
                *edges.entry((*fid, from, to)).or_insert(0) += n;
            }
        }
        let mut out = String::new();
        for ((fid, from, to), n) in edges {
            let f = &self.plan.functions[fid as usize];
            let name = self.bolt_names.get(&f.start).unwrap_or(&f.name);
            out.push_str(&format!("1 {name} {from:x} 1 {name} {to:x} 0 {n}\n"));
        }
        out
    }

    /// Executions per (fid, path), over all contexts.
    fn executions(&self) -> HashMap<(u32, u64), u64> {
        let mut execs: HashMap<(u32, u64), u64> = HashMap::new();
        for ((_, fid, path), n) in &self.counts {
            *execs.entry((*fid, *path)).or_insert(0) += n;
        }
        execs
    }

    /// The sampled event attributed to paths: every stack sample's weight
    /// at a PC in block `b` of a traced function is split among the paths
    /// through `b` in proportion to their executions (the estimator of
    /// the event each path incurs, given the block-level samples).
    fn path_events(&self, leaf_weights: &HashMap<u64, u64>) -> HashMap<(u32, u64), f64> {
        // Executions per (fid, path), and the paths through each block.
        let execs = self.executions();
        let mut through: HashMap<(u32, usize), Vec<(u64, u64)>> = HashMap::new();
        for (&(fid, path), &n) in &execs {
            let Some(p) = self
                .numbering(fid)
                .and_then(|num| num.regenerate(path).ok())
            else {
                continue;
            };
            let mut blocks = p.blocks.clone();
            blocks.sort_unstable();
            blocks.dedup();
            for blk in blocks {
                through.entry((fid, blk)).or_default().push((path, n));
            }
        }
        let starts: Vec<(u64, u64, u32)> = {
            let mut v: Vec<_> = self
                .plan
                .functions
                .iter()
                .enumerate()
                .filter(|(_, f)| matches!(f.status, FunctionStatus::Analyzed(_)))
                .map(|(i, f)| (f.start, f.start + f.size, i as u32))
                .collect();
            v.sort_unstable();
            v
        };
        let mut out: HashMap<(u32, u64), f64> = HashMap::new();
        for (&pc, &w) in leaf_weights {
            let svma = pc.wrapping_sub(self.bias);
            let i = starts.partition_point(|s| s.0 <= svma);
            let Some(&(_, end, fid)) = i.checked_sub(1).and_then(|i| starts.get(i)) else {
                continue;
            };
            if svma >= end {
                continue;
            }
            let FunctionStatus::Analyzed(fa) = &self.plan.functions[fid as usize].status else {
                continue;
            };
            let Some(blk) = fa.cfg.as_ref().and_then(|c| c.block_at(svma)) else {
                continue;
            };
            let Some(paths) = through.get(&(fid, blk)) else {
                continue;
            };
            let total: u64 = paths.iter().map(|p| p.1).sum();
            for &(path, n) in paths {
                *out.entry((fid, path)).or_insert(0.0) += w as f64 * n as f64 / total as f64;
            }
        }
        out
    }

    /// `paths.pb.gz`: one sample per (context, function, path).
    /// Adds this process's paths to `paths.pb.gz` (see [`paths_builder`]).
    pub(crate) fn add_paths(&self, b: &mut ProfileBuilder, leaf_weights: &HashMap<u64, u64>) {
        let events = self.path_events(leaf_weights);
        let execs = self.executions();
        let line_of = |svma: u64| -> (Option<String>, u32) {
            self.lines
                .as_ref()
                .and_then(|l| l.find_location(svma).ok().flatten())
                .map(|loc| (loc.file.map(str::to_owned), loc.line.unwrap_or(0)))
                .unwrap_or((None, 0))
        };
        let exe_name = std::fs::read_link(&self.exe)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mapping = b.mapping(
            &MappingKey {
                start: 0,
                limit: u64::MAX,
                file_offset: 0,
                filename: exe_name,
                build_id: self.plan.build_id.clone().unwrap_or_default(),
            },
            true,
        );
        let mut func_loc: HashMap<u32, u64> = HashMap::new();
        let mut entries: Vec<_> = self.counts.iter().collect();
        entries.sort();
        for ((ctx, fid, path), n) in entries {
            let f = &self.plan.functions[*fid as usize];
            let Some(numbering) = self.numbering(*fid) else {
                continue;
            };
            let FunctionStatus::Analyzed(fa) = &f.status else {
                continue;
            };
            let Some(cfg) = fa.cfg.as_ref() else { continue };
            let Ok(p) = numbering.regenerate(*path) else {
                continue;
            };
            let mut lines = Vec::new();
            let mut file = None;
            for &blk in &p.blocks {
                let (fl, line) = line_of(cfg.blocks[blk].start);
                file = file.or(fl);
                lines.push(format!("L{line}"));
            }
            let (ffile, fline) = line_of(f.start);
            let fname = crate::stacks::symbolize::demangle(&f.name);
            let name = format!("{fname} path {path}: {}", lines.join("→"));
            let leaf = b.location(
                mapping,
                f.start.wrapping_add(self.bias) ^ (*path << 1),
                &[
                    LineKey {
                        function: name,
                        file: file.clone().or(ffile.clone()).unwrap_or_default(),
                        line: 0,
                    },
                    LineKey {
                        function: fname,
                        file: ffile.unwrap_or_default(),
                        line: i64::from(fline),
                    },
                ],
            );
            let mut locs = vec![leaf];
            for c in self.contexts.fids(*ctx).iter().rev() {
                let id = *func_loc.entry(*c).or_insert_with(|| {
                    let cf = &self.plan.functions[*c as usize];
                    let (cfile, cline) = line_of(cf.start);
                    b.location(
                        mapping,
                        cf.start.wrapping_add(self.bias),
                        &[LineKey {
                            function: crate::stacks::symbolize::demangle(&cf.name),
                            file: cfile.unwrap_or_default(),
                            line: i64::from(cline),
                        }],
                    )
                });
                locs.push(id);
            }
            // This context's share of the path's event.
            let ev = events.get(&(*fid, *path)).copied().unwrap_or(0.0) * *n as f64
                / execs[&(*fid, *path)].max(1) as f64;
            b.sample(
                locs,
                vec![*n as i64, ev.round() as i64],
                &[("symbol", f.name.as_str())],
                &[("pid", i64::from(self.pid)), ("path", *path as i64)],
            );
        }
    }
}

/// The builder of `paths.pb.gz`, which every traced process adds to.
fn paths_builder(event: &str) -> ProfileBuilder {
    let mut b = ProfileBuilder::new(
        &[("executions", "count"), (event, "count")],
        (event, "count"),
        1,
    );
    b.add_comment("Ball-Larus paths from bursty tracing: leaf frame = the path (its blocks' source lines), then the function, then the functions entered before it within the burst");
    b.add_comment(&format!("{event}/count: the sampled {event} of each block split among the paths through it by their executions"));
    b
}

fn control_mut(shm: &mut memmap2::MmapMut) -> &mut BurstControl {
    // SAFETY: the mapping is CONTROL_BYTES + ring, page aligned; the target
    // writes the same words concurrently, which is why the hot fields are
    // only read through atomics (`word`); these plain writes happen while
    // the target is stopped or disarmed.
    unsafe { &mut *(shm.as_mut_ptr() as *mut BurstControl) }
}

fn set_run_options(shm: &mut memmap2::MmapMut, opts: &BurstOptions) {
    let cb = control_mut(shm);
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
        flags: (libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK) as u64 | SA_RESTORER,
        restorer,
        // Block everything while it runs (it is short).
        mask: !0,
    };
    Ok(t.rt_sigaction(signal, Some(&act))?)
}

/// The bursty-tracing side of a session: one tracer per target.
pub(crate) struct Bursts {
    tracers: Vec<BurstTracer>,
    full_trace: bool,
}

impl Bursts {
    /// Attaches to each target (waiting for `run`'s command to have
    /// exec'd). A target that cannot be traced in bursts is still sampled;
    /// the reason is logged.
    pub(crate) fn start(
        opts: Option<&BurstOptions>,
        pids: &[u32],
        sampler: &mut crate::sampling::sampler::Sampler,
    ) -> Self {
        let mut tracers = Vec::new();
        let Some(opts) = opts else {
            return Bursts {
                tracers,
                full_trace: false,
            };
        };
        for &pid in pids {
            wait_for_exec(pid);
            match BurstTracer::attach(pid, opts) {
                Ok(t) => {
                    // Also with --burst 0: every overflow still reaches the
                    // handler, which returns to the original code at once
                    // (what being attached costs without bursts).
                    if let Err(e) = sampler.set_burst_target(pid, Some(t.target())) {
                        warn!(pid, "cannot arm bursts: {e}");
                    }
                    let s = t.stats();
                    crate::service::metrics::METRICS
                        .functions_rewritten
                        .add(s.functions_rewritten as u64);
                    crate::service::metrics::METRICS
                        .functions_skipped
                        .add(s.functions_skipped as u64);
                    tracers.push(t);
                }
                Err(e) => warn!(pid, "bursty tracing disabled for this process: {e:#}"),
            }
        }
        Bursts {
            tracers,
            full_trace: opts.full_trace,
        }
    }

    pub(crate) fn active(&self) -> bool {
        !self.tracers.is_empty()
    }

    /// The processes traced in bursts.
    pub(crate) fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.tracers.iter().map(|t| t.pid())
    }

    /// Lets the unwinder see through the clones of every traced process.
    pub(crate) fn register_clone_frames(&self, procs: &mut crate::stacks::table::ProcessTable) {
        for t in &self.tracers {
            procs.set_clone_frames(t.pid(), t.clone_frames());
        }
    }

    /// How often to drain the record rings: a full trace fills them fast.
    pub(crate) fn drain_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(if self.full_trace { 5 } else { 50 })
    }

    pub(crate) fn drain(&mut self) {
        for t in &mut self.tracers {
            t.drain();
        }
    }

    /// Disarms, drains, detaches; writes `paths.pb.gz` and logs the summary.
    pub(crate) fn finish(
        &mut self,
        sampler: &mut crate::sampling::sampler::Sampler,
        output: &Path,
        event: &str,
        counters: &crate::sampling::sampler::KernelCounters,
        leaf_weights: &HashMap<u32, HashMap<u64, u64>>,
    ) {
        if self.tracers.is_empty() {
            return;
        }
        let mut paths = paths_builder(event);
        let mut fdatas = Vec::new();
        for mut t in self.tracers.drain(..) {
            let pid = t.pid();
            let _ = sampler.set_burst_target(pid, None);
            // Everything the target wrote counts (it may have exited with
            // the ring full: drain until empty).
            t.disarm();
            while t.drain() > 0 {}
            let empty = HashMap::new();
            t.add_paths(&mut paths, leaf_weights.get(&pid).unwrap_or(&empty));
            fdatas.push((pid, t.fdata()));
            let stats = match t.detach() {
                Ok(s) => s,
                Err(e) => {
                    warn!(pid, "detaching: {e:#}");
                    continue;
                }
            };
            crate::service::metrics::METRICS
                .bursts_taken
                .add(stats.bursts);
            crate::service::metrics::METRICS
                .bursts_truncated
                .add(stats.bursts_truncated);
            crate::service::metrics::METRICS
                .bursts_declined
                .add(stats.declined_busy + stats.declined_pc + stats.declined_budget);
            info!(
                pid,
                "bursts: {} taken, {} truncated, {} declined (busy {}, PC not rewritten {}, budget 0 {}), {} reaped; {} signals sent, {} overflows during a burst; functions rewritten {}, skipped {}; {} paths recorded ({} partial), records lost: {}",
                stats.bursts,
                stats.bursts_truncated,
                stats.declined_busy + stats.declined_pc + stats.declined_budget,
                stats.declined_busy,
                stats.declined_pc,
                stats.declined_budget,
                stats.reaped,
                counters.burst_signals,
                counters.burst_busy,
                stats.functions_rewritten,
                stats.functions_skipped,
                stats.paths,
                stats.partial_paths,
                stats.records_lost
            );
        }
        let _ = std::fs::create_dir_all(output);
        // edges.fdata is for one binary: the first process's; with several
        // processes each also gets edges-<pid>.fdata.
        let several = fdatas.len() > 1;
        for (i, (pid, fdata)) in fdatas.iter().enumerate() {
            let mut names = Vec::new();
            if i == 0 {
                names.push("edges.fdata".to_string());
            }
            if several {
                names.push(format!("edges-{pid}.fdata"));
            }
            for name in names {
                if let Err(e) = crate::export::write_atomic(output, &name, fdata.as_bytes()) {
                    warn!("writing {}: {e}", output.join(name).display());
                }
            }
        }
        let path = output.join("paths.pb.gz");
        match encode_gzip(&paths.finish()).map_err(anyhow::Error::from) {
            Ok(p) => match crate::export::write_atomic(output, "paths.pb.gz", &p) {
                Ok(_) => {
                    info!("wrote {}", path.display());
                    crate::service::http::set_paths_profile(p);
                }
                Err(e) => warn!("writing {}: {e}", path.display()),
            },
            Err(e) => warn!("path profile: {e:#}"),
        }
    }
}

/// Whether the program throws C++ exceptions (or otherwise unwinds with
/// libgcc): landing pads, or imports of the throwing/unwinding entry points.
fn uses_exceptions(data: &[u8], analysis: &userspace_rewriter::cfg::Analysis) -> bool {
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
fn register_frame_fn(pid: u32, maps: &[inject::Mapping], plan: &Plan, bias: u64) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    if let Some(f) = plan.functions.iter().find(|f| f.name == "__register_frame") {
        return Some(f.start.wrapping_add(bias));
    }
    let lib: Vec<&inject::Mapping> = maps
        .iter()
        .filter(|m| {
            Path::new(&m.path)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libgcc_s.so"))
        })
        .collect();
    let first = lib.iter().min_by_key(|m| m.offset)?;
    let data = std::fs::read(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        first.start, first.end
    ))
    .ok()?;
    let elf = userspace_rewriter::elf::ElfInfo::parse(&data).ok()?;
    let lbias = elf.load_bias_for(first.start, first.offset, first.perms.contains('x'))?;
    let file = object::File::parse(&*data).ok()?;
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("__register_frame") && !s.is_undefined())?;
    Some(sym.address().wrapping_add(lbias))
}

/// The names `llvm-bolt` gives the functions of an executable, by address,
/// where they differ from the symbol's: BOLT renames every local symbol
/// `name/N`, N counting the local symbols of that name in its order (by
/// address; at one address functions first, section symbols last; see
/// `RewriteInstance::discoverFileObjects`), and its profile reader looks
/// functions up by those names.
fn bolt_names(data: &[u8]) -> HashMap<u64, String> {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind, SymbolSection};
    let mut out = HashMap::new();
    let Ok(file) = object::File::parse(data) else {
        return out;
    };
    let in_memory = |s: &object::Symbol| match s.section() {
        SymbolSection::Absolute => true,
        SymbolSection::Section(i) => file.section_by_index(i).is_ok_and(|sec| {
            matches!(sec.flags(), object::SectionFlags::Elf { sh_flags }
                if sh_flags & u64::from(object::elf::SHF_ALLOC) != 0)
        }),
        _ => false,
    };
    let mut syms: Vec<_> = file
        .symbols()
        .filter(|s| s.kind() != SymbolKind::File && !s.is_undefined() && s.address() != 0)
        .filter(|s| in_memory(s))
        .collect();
    let rank = |k: SymbolKind| match k {
        SymbolKind::Text => 0,
        SymbolKind::Section => 2,
        _ => 1,
    };
    syms.sort_by_key(|s| (s.address(), rank(s.kind())));
    let mut seen: HashMap<String, u32> = HashMap::new();
    for s in syms {
        if s.is_global() {
            continue;
        }
        let name = match s.kind() {
            SymbolKind::Section => s
                .section_index()
                .and_then(|i| file.section_by_index(i).ok())
                .and_then(|sec| sec.name().ok().map(str::to_owned)),
            _ => s.name().ok().map(str::to_owned),
        };
        let Some(mut name) = name.filter(|n| !n.is_empty()) else {
            continue;
        };
        if name.starts_with(".L") {
            name.insert_str(0, "PG");
        }
        let n = seen.entry(name.clone()).or_insert(0);
        *n += 1;
        if s.kind() == SymbolKind::Text {
            out.insert(s.address(), format!("{name}/{n}"));
        }
    }
    out
}

/// `burstyd run` releases its command just before the session starts; the
/// exec replaces the gate (burstyd itself) within milliseconds.
fn wait_for_exec(pid: u32) {
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

/// Per analysed function with a path numbering: the SVMA of each block's
/// last instruction.
fn last_insns(plan: &Plan, analysis: &userspace_rewriter::cfg::Analysis) -> HashMap<u32, Vec<u64>> {
    plan.functions
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let FunctionStatus::Analyzed(fa) = &f.status else {
                return None;
            };
            let cfg = fa.cfg.as_ref()?;
            fa.numbering.as_ref()?;
            let insns = &analysis.insns[i];
            let last = cfg
                .blocks
                .iter()
                .map(|b| insns.get(b.insns.end.checked_sub(1)?).map(|x| x.addr))
                .collect::<Option<Vec<u64>>>()?;
            Some((i as u32, last))
        })
        .collect()
}
