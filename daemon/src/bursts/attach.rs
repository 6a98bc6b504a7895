//! Attach: analyse the executable (the plan), stop the process with ptrace,
//! map a memfd (`MAP_SHARED`: the [`BurstControl`] page and the record
//! ring, also mapped by the daemon) and an executable region next to it,
//! both within ±2 GiB of the binary; generate the clones for that address,
//! write them, install the handler on a signal the target does not use,
//! arm, resume. The original code is never written. Everything slow
//! (analysis, generation) happens before the target is stopped; all of it
//! blocks the calling thread, which is why the session runs it on a thread
//! of its own (the attach thread, [`super::tracers`]).
//!
//! A process that already holds a region made for the same executable is
//! re-armed instead ([`rearm`]): its clones are regenerated at their
//! recorded addresses and only the handler is installed.
use std::mem::offset_of;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use burstyd_common::addr::Pid;
use burstyd_common::burst::{
    BurstControl, BurstLocal, CONTROL_BYTES, CONTROL_MAGIC, LOCAL_BYTES, LOCAL_OFFSET, MAX_MODULES,
    MAX_SLOTS,
};
use tracing::{info, warn};
use userspace_rewriter::PAGE_SIZE;
use userspace_rewriter::analysis::plan::Plan;
use userspace_rewriter::codegen::LOW_STATE_LIMIT;
use userspace_rewriter::inject::{self, KernelSigaction, Tracee};

use super::attachment::{
    Attachment, control_tables_base, install_handler, owner_offset, set_run_options,
};
use super::coverage::CodeMap;
use super::facts::ModuleFacts;
use super::libraries::{Pending, cap_modules};
use super::modules::{self};
use super::options::{BurstOptions, Libraries};
use super::plans::{analyse, cached_note};
use super::prepare::{Analysed, Extension, Generated, generate_at, remember};
use super::progress::{self, Phase, Step};
use super::ring::SharedRegion;
use super::rooms::{Rooms, generate, library_rooms, place, place_checks};
use super::tables::Merged;
use crate::stacks::clones::CloneFrames;

/// Record ring sizes (words of 8 bytes), split into `MAX_SLOTS` sub-rings:
/// 2 MiB per slot (with 512 KiB, eight threads bursting on two loaded CPUs
/// lost 411 of 2.4 million records between two drains; memory is touched
/// only in the slots used, `max_bursts` of them); 8 MiB per slot in a
/// full trace, which waits rather than lose.
pub(super) const RING_WORDS: u64 = 1 << 21; // 16 MiB
pub(super) const RING_WORDS_FULL: u64 = 1 << 23; // 64 MiB

pub(super) const MEMFD_NAME: &str = "burstyd-bursts";

/// Whether `pid`'s libc is glibc 2.26 or later, whose thread control
/// block has the 512 unused bytes (`tcbhead_t.__glibc_unused2`, at
/// `fs:0x80`) where the burst runtime keeps each thread's burst registers
/// (see `burstyd_common::burst`). Anything else (musl, whose thread
/// structure is there; a static executable, whose libc we cannot tell
/// apart; glibc 2.25 or older, which saved vector registers there) gets
/// no bursts: writing there would corrupt it. `Err` says why not.
pub(super) fn check_glibc(pid: Pid, maps: &[inject::MapEntry]) -> anyhow::Result<()> {
    let libc = maps
        .iter()
        .filter_map(|m| m.path.as_deref())
        .map(|p| p.strip_suffix(" (deleted)").unwrap_or(p))
        .find(|p| {
            p.rsplit('/').next() == Some("libc.so.6") || {
                let n = p.rsplit('/').next().unwrap_or("");
                n.starts_with("libc-2.") && n.ends_with(".so")
            }
        })
        .map(str::to_owned);
    let Some(libc) = libc else {
        bail!(
            "pid {pid} maps no libc.so.6 (musl, or a static executable): bursts need glibc 2.26 or later, whose thread control block holds each thread's burst state"
        );
    };
    let bytes = std::fs::read(format!("/proc/{pid}/root{libc}"))
        .with_context(|| format!("reading {libc} of pid {pid}"))?;
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(&*bytes).with_context(|| format!("parsing {libc}"))?;
    let dynstr = file
        .section_by_name(".dynstr")
        .and_then(|s| s.data().ok())
        .unwrap_or_default();
    if !dynstr.split(|&b| b == 0).any(|name| name == b"GLIBC_2.26") {
        bail!(
            "pid {pid}: {libc} defines no GLIBC_2.26 version (not glibc, or older than 2.26): bursts need glibc 2.26 or later, whose thread control block holds each thread's burst state"
        );
    }
    Ok(())
}

/// What an attach produced: the attachment, and what the tracer keeps of
/// the analysis (the analyses themselves and the files' bytes are dropped).
pub(crate) struct Attached {
    pub(crate) attachment: Attachment,
    /// `/proc/PID/exe`.
    pub(crate) exe: PathBuf,
    /// The modules with clones, the executable first, in `fid` order.
    pub(crate) modules: Vec<ModuleFacts>,
    /// The clones, for unwinding samples taken during bursts.
    pub(crate) frames: CloneFrames,
    pub(crate) functions_rewritten: usize,
    pub(crate) functions_skipped: usize,
    /// What the hot coverage needs: where the modules and their cloned
    /// functions are.
    pub(crate) code: CodeMap,
}

/// What an attach put into the target.
pub(super) struct Injected {
    pub(super) pid: Pid,
    pub(super) exe: PathBuf,
    /// The executable first.
    pub(super) modules: Vec<Generated>,
    /// Address of the control block in the target.
    pub(super) control: u64,
    pub(super) region: SharedRegion,
    pub(super) signal: i32,
    pub(super) old_action: KernelSigaction,
    pub(super) rec: userspace_rewriter::codegen::Recording,
}

impl Injected {
    pub(super) fn attached(self) -> Attached {
        let Injected {
            pid,
            exe,
            modules,
            control,
            region,
            signal,
            old_action,
            rec,
        } = self;
        let baseline = region.target_counters();
        let base = control_tables_base(&region);
        let exe_range = modules[0].facts.range;
        let Extension {
            modules: facts,
            regions,
            pages,
            cloned,
            functions_rewritten,
            functions_skipped,
            activate: _,
        } = Extension::of(modules);
        let mut code = CodeMap::new(exe_range, cloned).with_libraries(
            facts
                .iter()
                .filter(|m| !m.is_exe)
                .map(|m| (m.name().to_owned(), m.range)),
        );
        code.add_clone_regions(regions.iter().map(|r| (r.range.start, r.range.end)));
        Attached {
            attachment: Attachment {
                pid,
                control_addr: control,
                region,
                signal,
                old_action,
                baseline,
                progress: Default::default(),
                pages,
                base,
                link_seen: 0,
                relink_due: true,
                forgets: 0,
                rec,
            },
            exe,
            modules: facts,
            frames: CloneFrames { regions },
            functions_rewritten,
            functions_skipped,
            code,
        }
    }
}

/// Our pid for `BurstControl::tracer`: as the target's pid namespace
/// sees it, which is ours only if we share it (0 otherwise: the target
/// cannot check on us).
pub(super) fn tracer_as_seen_by(pid: Pid) -> u64 {
    let ns = |p: &str| std::fs::metadata(format!("/proc/{p}/ns/pid")).map(|m| m.ino());
    match (ns("self"), ns(&pid.to_string())) {
        (Ok(a), Ok(b)) if a == b => std::process::id().into(),
        _ => 0,
    }
}

/// The daemon named by a region's `tracer`, if it is another burstyd that
/// is still running.
pub(super) fn live_tracer(tracer: u64) -> Option<u64> {
    let t = u32::try_from(tracer).ok().filter(|&t| t != 0)?;
    if t == std::process::id() || !crate::sys::process_running(Pid(t)) {
        return None;
    }
    let comm = crate::sys::comm(Pid(t))?;
    comm.starts_with("burstyd").then_some(tracer)
}

/// Injects (or re-arms) the clones in `pid`: of its executable and, with
/// `opts.libraries`, of every shared library it has mapped.
/// With `held` the program is this thread's tracee, stopped at its entry
/// point ([`hold_command`]): every module is cloned in this one step (the
/// program waits anyway), and the stop is adopted rather than made.
pub(crate) fn attach(
    pid: Pid,
    opts: &BurstOptions,
    held: bool,
) -> anyhow::Result<(Attached, Option<Then>)> {
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let exe_file = std::fs::File::open(&exe)
        .with_context(|| format!("opening the executable of pid {pid} ({})", exe.display()))?;
    if inject::shadow_stack_enabled(pid) {
        bail!("pid {pid} runs with CET shadow stacks; bursty tracing cannot redirect its returns");
    }
    let t0 = std::time::Instant::now();

    // Where the modules are mapped. An executable removed or replaced on
    // disk since it started is still the mapped one: `/proc/PID/exe` and
    // the maps lines then end in " (deleted)", which the paths compared
    // here lack.
    let maps = inject::maps(pid)?;
    let exe_link = crate::sys::exe_link(pid).unwrap_or_default();
    let exe_link = exe_link.to_string_lossy();
    let exe_path = exe_link.strip_suffix(" (deleted)").unwrap_or(&exe_link);
    let mut analysed = Vec::new();
    let mut fid_base = 0u32;
    // The executable now; its libraries in a second step
    // ([`add_libraries`]), so that a short program is traced from early on.
    // Each module on a thread of its own (held, the libraries too).
    let mut mapped = modules::mapped_modules(
        pid,
        &maps,
        exe_path,
        exe_file,
        held && opts.libraries == Libraries::All,
    )?;
    cap_modules(pid, &mut mapped, 0);
    for m in &mut mapped {
        m.rec = opts.recording();
    }
    // The executable's id: the hash of its bytes.
    let id = mapped[0].hash;
    let names: Vec<(bool, String)> = mapped.iter().map(|m| (m.is_exe, m.path.clone())).collect();
    let work = progress::begin(
        pid,
        exe_path,
        Step::Attach,
        mapped.iter().map(|m| (m.path.clone(), m.len)),
    );
    let analysed_all = super::parallel::map(mapped, |m| {
        let path = m.path.clone();
        progress::in_module(&path, || analyse(m))
    });
    for ((is_exe, path), result) in names.into_iter().zip(analysed_all) {
        match result {
            Ok(mut a) => {
                if !a.take_fids(&mut fid_base) {
                    bail!("too many functions to number");
                }
                analysed.push(a);
            }
            Err(e) if is_exe => return Err(e),
            Err(e) => warn!(%pid, "{path} is not cloned: {e:#}"),
        }
    }
    let analysis_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cached = cached_note(&analysed);

    // An earlier attach's region, if it was made for this file (a memfd's
    // maps line says " (deleted)"; the path here is without it). Its
    // control block is the mapping at offset 0.
    let memfd = format!("/memfd:{MEMFD_NAME}");
    if let Some(m) = maps
        .iter()
        .find(|m| m.offset == 0 && m.path.as_deref().is_some_and(|p| p.starts_with(&memfd)))
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
            work.phase(Phase::Generating);
            let attached = rearm(pid, exe, analysed, m.start, SharedRegion::new(shm), opts)?;
            let entries = {
                let cb = attached.attachment.region.control();
                cb.modules[..(cb.n_modules as usize).min(MAX_MODULES)].to_vec()
            };
            let pending = (opts.libraries != Libraries::None).then(|| Pending {
                control: m.start,
                exe_path: exe_path.to_owned(),
                tables: 0,
                next_fid: 0,
                rearm: Some(entries),
                rooms: Rooms::default(),
                rec: opts.recording(),
            });
            return Ok((attached, pending.map(Then::Libraries)));
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

    check_glibc(pid, &maps)?;
    let ring_words = if opts.full_trace {
        RING_WORDS_FULL
    } else {
        RING_WORDS
    };
    let shm_len = CONTROL_BYTES as u64 + ring_words * 8;

    // Everything that takes time happens before the process is stopped:
    // pick the addresses, generate the clones and their unwind info for
    // them. Only the mappings, the writes and the handler installation
    // stop the target. The control block goes into the low 2 GiB, where
    // the clones of every module reach it with absolute operands; without
    // room there, next to the executable, whose clones alone then reach it.
    let control = match inject::find_low_gap(pid, CONTROL_BYTES as u64, LOW_STATE_LIMIT, &[])? {
        Some(c) => c,
        None => {
            if analysed.len() > 1 {
                warn!(%pid, "no room for the burst state in the low 2 GiB: only the executable is cloned");
                analysed.truncate(1);
            }
            let (lo, hi) = analysed[0].module.range;
            inject::find_gap_near(pid, lo, hi, CONTROL_BYTES as u64, &[])?
        }
    };
    let register_frame = register_frame_fn(pid, &maps, &analysed[0].plan, analysed[0].module.bias);
    let mut reserved = vec![(control, control + CONTROL_BYTES as u64)];
    let mut gens: Vec<Generated> = Vec::new();
    // Gaps first (in turn: each avoids the ones before), then each
    // module's code on a thread of its own; one that outgrew its gap is
    // generated again, in turn, at a gap of its exact size.
    let mut placed = Vec::new();
    for a in analysed {
        let (is_exe, path) = (a.module.is_exe, a.module.path.clone());
        let len = a.room();
        let (lo, hi) = a.module.range;
        match inject::find_gap_near(pid, lo, hi, len, &reserved) {
            Ok(code) => {
                reserved.push((code, code + len));
                placed.push((a, code, len));
            }
            Err(e) if is_exe => return Err(e.into()),
            Err(e) => warn!(%pid, "{path} is not cloned: {e:#}"),
        }
    }
    let names: Vec<(bool, String)> = placed
        .iter()
        .map(|(a, _, _)| (a.module.is_exe, a.module.path.clone()))
        .collect();
    work.phase(Phase::Generating);
    let generated = super::parallel::map(placed, |(a, code, len)| {
        let path = a.module.path.clone();
        progress::in_module(&path, || generate_at(a, control, code, Some(len)))
    });
    for ((is_exe, path), result) in names.into_iter().zip(generated) {
        let result = match result {
            Ok(Err(a)) => {
                progress::in_module(&path, || generate(pid, *a, control, None, &mut reserved))
            }
            Ok(Ok(g)) => Ok(g),
            Err(e) => Err(e),
        };
        progress::done(&path);
        match result {
            Ok(g) => gens.push(g),
            Err(e) if is_exe => return Err(e),
            Err(e) => warn!(%pid, "{path} is not cloned: {e:#}"),
        }
    }
    let tables = Merged::new(gens.iter().map(Generated::tables).collect());
    let tables_len = tables.len_bytes().next_multiple_of(PAGE_SIZE);

    let generation_ms = t0.elapsed().as_secs_f64() * 1e3 - analysis_ms;
    work.phase(Phase::Injecting);
    let mut t = if held {
        Tracee::adopt(pid).context("taking over the held command")?
    } else {
        Tracee::attach(pid).context("stopping the target with ptrace")?
    };
    let stopped = std::time::Instant::now();
    for &tid in t.threads() {
        if t.regs(tid).fs_base == 0 {
            bail!("thread {tid} of pid {pid} has no TLS (fs base 0); cannot trace it in bursts");
        }
    }
    let signal = inject::free_signal(pid)?;
    // Room for the libraries' clones and the tables of all modules, mapped
    // in this stop (untouched pages cost nothing) and filled by the second
    // step through /proc/PID/mem without stopping the program again: a
    // ptrace stop cuts short a `getrandom` or a pipe `read` under way.
    // Sought now, while the address space holds still: the gap below a
    // library is where the program's next mmap goes.
    let rooms = if opts.libraries == Libraries::All && !held {
        let maps = inject::maps(pid)?;
        library_rooms(pid, &maps, exe_path, tables.len_bytes(), &mut reserved)
    } else {
        Rooms::default()
    };
    // Ask the target's seccomp filters about every call below before
    // making the first: a filter that kills on one must not see any.
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let shared = libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | libc::MAP_POPULATE;
    // Over our own fresh mapping, so MAP_FIXED replaces nothing else.
    let local = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    let local_addr = control + LOCAL_OFFSET as u64;
    let ring_bytes = ring_words * 8;
    let calls = vec![
        (libc::SYS_memfd_create, vec![0, libc::MFD_CLOEXEC as u64]),
        (libc::SYS_ftruncate, vec![0, shm_len]),
        (
            libc::SYS_mmap,
            vec![
                control,
                CONTROL_BYTES as u64,
                rw as u64,
                shared as u64,
                0,
                0,
            ],
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
            vec![
                0,
                ring_bytes,
                rw as u64,
                libc::MAP_SHARED as u64,
                0,
                CONTROL_BYTES as u64,
            ],
        ),
        (libc::SYS_close, vec![0]),
        (libc::SYS_rt_sigaction, vec![signal as u64, 0, 0, 8]),
    ];
    for (nr, args) in calls {
        t.check_syscall(nr, &args)?;
    }
    place_checks(&mut t, &gens, tables_len)?;
    rooms.checks(&mut t)?;
    if opts.full_trace {
        // What the runtime itself calls while a full ring waits.
        t.check_syscall(libc::SYS_sched_yield, &[])?;
        t.check_syscall(libc::SYS_kill, &[tracer_as_seen_by(pid), 0])?;
    }
    // Every mapping at an address of our choosing first: anything the
    // kernel places (the tables, the ring, even the page memfd_create's
    // name is passed in) goes where the next mmap would, which may be a
    // gap picked here.
    let mut rooms = rooms;
    rooms.map_fixed(&mut t, pid);
    let (tables_at, exe_eh) = place(&mut t, pid, &gens, &tables, tables_len, register_frame)?;
    let rooms = rooms.map_tables(&mut t)?;
    let fd = t.memfd_create(MEMFD_NAME, libc::MFD_CLOEXEC)?;
    t.syscall(libc::SYS_ftruncate, &[fd as u64, shm_len])?;
    // MAP_FIXED_NOREPLACE: if the program mapped something into the
    // gap since we looked, this fails cleanly and nothing is replaced.
    // Populated: the eBPF program reads `armed`/`active` with
    // bpf_probe_read_user, which cannot fault a page in.
    t.mmap(control, CONTROL_BYTES as u64, rw, shared, fd, 0).context(
        "mapping the burst control block (the address space changed while the clones were generated?)",
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
    // The clones, their unwind info and the lookup tables (fixed
    // addresses first: the kernel's choices below must not take them).
    // The record ring is reached through a pointer in the control block:
    // anywhere the kernel puts it.
    let ring_at = t
        .mmap(
            0,
            ring_bytes,
            rw,
            libc::MAP_SHARED,
            fd,
            CONTROL_BYTES as u64,
        )
        .context("mapping the record ring")?;
    let shm_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .context("opening the burst memfd")?;
    t.close(fd)?;
    // SAFETY: as above.
    let mut region = SharedRegion::new(unsafe { memmap2::MmapMut::map_mut(&shm_file)? });
    {
        let cb = region.control_mut();
        cb.magic = CONTROL_MAGIC;
        // MAX_SLOTS sub-rings, one per burst slot.
        cb.ring_mask = ring_words / MAX_SLOTS as u64 - 1;
        cb.ring_addr = ring_at;
        cb.tables = tables_at;
        cb.tables_base = tables_at;
        cb.clone_lo = gens[0].img.code_range.0;
        cb.clone_hi = gens[0].img.code_range.1;
        cb.handler = gens[0].img.handler;
        cb.restorer = gens[0].img.restorer;
        cb.signal = signal as u64;
        cb.exe_id = id;
        cb.eh_frame = exe_eh;
        cb.made_for = pid.0.into();
        cb.tracer = tracer_as_seen_by(pid);
    }
    region.add_modules(gens.iter().map(Generated::entry));
    let (handler, restorer) = (gens[0].img.handler, gens[0].img.restorer);
    let old_action = install_handler(&mut t, signal, handler, restorer)?;
    set_run_options(&mut region, opts);
    // Held: it goes once the session has armed the eBPF side (the attach
    // thread detaches it then), so that its first instructions can take
    // bursts.
    let still_held = if held {
        Some(t)
    } else {
        t.detach()?;
        None
    };
    let stopped_ms = stopped.elapsed().as_secs_f64() * 1e3;
    let rewritten: usize = gens.iter().map(|g| g.img.cloned_functions()).sum();
    let skipped: usize = gens
        .iter()
        .map(|g| {
            g.img.skipped.values().sum::<usize>()
                + g.facts.plan.summary.skipped.values().sum::<usize>()
        })
        .sum();
    let kib = gens.iter().map(Generated::code_bytes_len).sum::<u64>() / 1024;
    let eh_kib = gens.iter().map(|g| g.eh.1.len() as u64).sum::<u64>() / 1024;
    let names: Vec<&str> = gens.iter().map(|g| g.facts.name()).collect();
    let stop = if held {
        format!(
            "the command held at its entry point for {:.0} ms",
            t0.elapsed().as_secs_f64() * 1e3
        )
    } else {
        format!("target stopped {stopped_ms:.1} ms")
    };
    info!(
        %pid,
        "bursty tracing: {rewritten} functions rewritten ({skipped} skipped) in {} module(s) ({}), {kib} KiB of clones and {eh_kib} KiB of their unwind info, signal {signal}; analysis {analysis_ms:.0} ms, generation {generation_ms:.0} ms{cached}, {stop}",
        gens.len(),
        names.join(", "),
    );
    remember(&mut gens);
    let then = match still_held {
        Some(held) => Some(Then::Release {
            held,
            // A full trace starts at the entry point: the burst signal,
            // pending when the command is let go, is the first thing it
            // takes (the handler starts the burst there if `_start` has
            // a clone; else the first overflow starts it, as in a
            // sampled run).
            start_burst: opts.full_trace.then_some(signal),
        }),
        None => (opts.libraries == Libraries::All).then(|| {
            Then::Libraries(Pending {
                control,
                exe_path: exe_path.to_owned(),
                tables: tables_at,
                next_fid: fid_base,
                rearm: None,
                rooms,
                rec: opts.recording(),
            })
        }),
    };
    Ok((
        Injected {
            pid,
            exe,
            modules: gens,
            control,
            region,
            signal,
            old_action,
            rec: opts.recording(),
        }
        .attached(),
        then,
    ))
}

/// What the attach thread does after the first step of an attach.
pub(crate) enum Then {
    /// The second step: the libraries ([`add_libraries`]).
    Libraries(Pending),
    /// Let the held command go (every module is cloned): detach this
    /// stop once the session has armed bursts for it, after sending it
    /// `start_burst` (the burst signal) if set.
    Release {
        held: Tracee,
        start_burst: Option<i32>,
    },
}

/// Re-arms the clones an earlier attach injected for this very
/// executable: each module it recorded (same file, same load bias) is
/// regenerated at its recorded address, which is a pure function of the
/// plan and the layout; nothing is mapped or written but the handler.
pub(super) fn rearm(
    pid: Pid,
    exe: PathBuf,
    analysed: Vec<Analysed>,
    control: u64,
    mut region: SharedRegion,
    opts: &BurstOptions,
) -> anyhow::Result<Attached> {
    let (handler, restorer, signal, entries) = {
        let cb = region.control_mut();
        let n = (cb.n_modules as usize).min(MAX_MODULES);
        (
            cb.handler,
            cb.restorer,
            cb.signal as i32,
            cb.modules[..n].to_vec(),
        )
    };
    let mut gens = Vec::new();
    for mut a in analysed {
        let Some(e) = entries
            .iter()
            .find(|e| e.id == a.id && e.bias == a.module.bias)
        else {
            continue;
        };
        a.fid_base = e.fid_base as u32;
        gens.push(generate(pid, a, control, Some(e.code), &mut Vec::new())?);
    }
    if !gens.first().is_some_and(|g| g.facts.is_exe) {
        bail!("pid {pid}: the burst region injected earlier has no clones of its executable");
    }
    let mut t = Tracee::attach(pid).context("stopping the target with ptrace")?;
    let current = t.rt_sigaction(signal, None)?;
    if current.handler > 1 && current.handler != handler {
        bail!("pid {pid} now uses signal {signal} itself; cannot re-arm bursts");
    }
    let old_action = install_handler(&mut t, signal, handler, restorer)?;
    // Whatever an interrupted earlier session left.
    for i in 0..MAX_SLOTS {
        t.write_memory(control + owner_offset(i), &0u64.to_ne_bytes())?;
    }
    region.clear_active();
    region.control_mut().tracer = tracer_as_seen_by(pid);
    set_run_options(&mut region, opts);
    t.detach()?;
    info!(
        %pid,
        "bursty tracing: re-armed the clones injected earlier in {} module(s) (signal {signal})",
        gens.len()
    );
    Ok(Injected {
        pid,
        exe,
        modules: gens,
        control,
        region,
        signal,
        old_action,
        rec: opts.recording(),
    }
    .attached())
}

/// `__register_frame` in the target: libgcc_s's export, or a copy linked
/// into the executable (static libgcc_eh).
pub(super) fn register_frame_fn(
    pid: Pid,
    maps: &[inject::MapEntry],
    plan: &Plan,
    bias: u64,
) -> Option<u64> {
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
    let elf = userspace_rewriter::analysis::elf::ElfInfo::parse(&data[..]).ok()?;
    let lbias = elf.load_bias_for(first.start, first.offset, first.is_exec())?;
    let file = object::File::parse(&*data).ok()?;
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("__register_frame") && !s.is_undefined())?;
    Some(sym.address().wrapping_add(lbias))
}
