//! Shared libraries' clones added to a running attachment: the second
//! step of an attach ([`add_libraries`], into rooms mapped in the first
//! stop) and libraries loaded since the attach ([`add_loaded`], `dlopen`),
//! both without stopping the program but for a short mapping stop.
use std::sync::atomic::Ordering;

use anyhow::{Context as _, bail};
use burstyd_common::addr::Pid;
use burstyd_common::burst::{MAX_MODULES, ModuleEntry};
use tracing::{info, warn};
use userspace_rewriter::PAGE_SIZE;
use userspace_rewriter::codegen::TableSource;
use userspace_rewriter::inject::{self, Tracee};

use super::modules::{self, Module};
use super::tables::{FileTables, Merged};

use super::plans::{analyse, from_cache_note};
use super::prepare::{Extension, Generated, remember};
use super::progress::{self, Phase, Step};
use super::rooms::{
    self, CODE_FLAGS, RX, Rooms, TABLE_FLAGS, generate, place_checks, write_unused,
};

/// What the second step of an attach ([`add_libraries`]) needs from the
/// first.
pub(crate) struct Pending {
    /// The control block.
    pub(super) control: u64,
    /// The executable's maps path (not a library).
    pub(super) exe_path: String,
    /// The header of the lookup tables in the target now (the first
    /// step's).
    pub(super) tables: u64,
    /// The first `fid` the libraries may use.
    pub(super) next_fid: u32,
    /// Modules an earlier attach injected (a re-arm): regenerated at
    /// their addresses, nothing mapped.
    pub(super) rearm: Option<Vec<ModuleEntry>>,
    /// Where the libraries' clones and the merged tables go.
    pub(super) rooms: Rooms,
    /// What the clones record besides paths.
    pub(super) rec: userspace_rewriter::codegen::Recording,
}

/// The second step of an attach: every shared library mapped in `pid`
/// (but the dynamic loader) is analysed and cloned near itself with
/// `fid`s after the executable's; a short ptrace stop maps and writes the
/// clones and the merged lookup tables, then one store into the control
/// block (`tables`) puts them in use while the program runs (a lookup
/// under way finishes on the old tables, which stay mapped). From then
/// on calls from a burst into a library, and returns from it, stay in the
/// burst. `None` when there is nothing to add.
/// Gives up (`None`) once `cancel` is set: the session is ending.
pub(crate) fn add_libraries(
    pid: Pid,
    pending: Pending,
    cancel: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Option<Extension>> {
    let cancelled = || cancel.load(Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    // Every write of this step goes to the program attached to, even if
    // the process execs meanwhile.
    let mem = rooms::open_ours(pid, pending.control)?;
    let maps = inject::maps(pid)?;
    let mut all = modules::mapped_libraries(pid, &maps, &pending.exe_path);
    for m in &mut all {
        m.rec = pending.rec;
    }
    cap_modules(pid, &mut all, 1);
    if all.is_empty() {
        return Ok(None);
    }
    let work = progress::begin(
        pid,
        &pending.exe_path,
        Step::Libraries,
        all.iter().map(|m| (m.path.clone(), m.len)),
    );
    let mut fid_base = pending.next_fid;
    let mut gens = Vec::new();
    let mut from_cache = 0;
    for module in all {
        if cancelled() {
            return Ok(None);
        }
        let path = module.path.clone();
        let _done = Done(&path);
        let a = match progress::in_module(&path, || analyse(module)) {
            Ok(mut a) => {
                if !a.take_fids(&mut fid_base) {
                    warn!(%pid, "{path} is not cloned: too many functions to number");
                    continue;
                }
                a
            }
            Err(e) => {
                warn!(%pid, "{path} is not cloned: {e:#}");
                continue;
            }
        };
        if cancelled() {
            return Ok(None);
        }
        from_cache += usize::from(a.cached_before());
        if let Some(entries) = &pending.rearm {
            // Re-armed: what an earlier attach wrote is in place.
            let Some(e) = entries
                .iter()
                .find(|e| e.id == a.id && e.bias == a.module.bias)
            else {
                continue;
            };
            let mut a = a;
            a.fid_base = e.fid_base as u32;
            match progress::in_module(&path, || {
                generate(pid, a, pending.control, Some(e.code), &mut Vec::new())
            }) {
                Ok(g) => gens.push(g),
                Err(e) => warn!(%pid, "{path} is not re-armed: {e:#}"),
            }
            continue;
        }
        let Some(&(_, _, at, len)) = pending
            .rooms
            .libraries
            .iter()
            .find(|r| r.0 == a.module.path && r.1 == a.module.range.0)
        else {
            continue; // mapped after the first step
        };
        match progress::in_module(&path, || {
            generate(pid, a, pending.control, Some(at), &mut Vec::new())
        }) {
            Ok(g) if g.code_len <= len => gens.push(g),
            Ok(g) => {
                warn!(%pid, "{path} is not cloned: its clones need {} bytes, {len} were set aside", g.code_len)
            }
            Err(e) => warn!(%pid, "{path} is not cloned: {e:#}"),
        }
    }
    if gens.is_empty() || cancelled() {
        return Ok(None);
    }
    let prepared_ms = t0.elapsed().as_secs_f64() * 1e3;
    work.phase(Phase::Injecting);
    let mut activate = None;
    if pending.rearm.is_none() {
        let current = FileTables::in_process(pid, pending.tables)?;
        let tables = Merged::new(
            std::iter::once(&current as &dyn TableSource)
                .chain(gens.iter().map(Generated::tables))
                .collect(),
        );
        let (tables_at, room) = pending.rooms.tables;
        let need = tables.len_bytes();
        if need > room {
            bail!("the lookup tables need {need} bytes, {room} were set aside");
        }
        write_unused(pid, &mem, &gens, &tables, tables_at)?;
        activate = Some((tables_at, gens.iter().map(Generated::entry).collect()));
    }
    remember(&mut gens);
    let names: Vec<&str> = gens.iter().map(|g| g.facts.name()).collect();
    let n = gens.len();
    let names = names.join(", ");
    let mut ext = Extension::of(gens);
    ext.activate = activate;
    info!(
        %pid,
        "bursty tracing: {} functions of {n} librar{} ({names}) rewritten ({} skipped); analysis and generation {prepared_ms:.0} ms{}, added without stopping the program",
        ext.functions_rewritten,
        if n == 1 { "y" } else { "ies" },
        ext.functions_skipped,
        from_cache_note(from_cache),
    );
    Ok(Some(ext))
}

/// Leaves out the modules beyond what the control block's directory can
/// record after `before` others (a relink checks only what it records:
/// an unloaded module it did not record would keep its table entries).
pub(super) fn cap_modules(pid: Pid, modules: &mut Vec<Module>, before: usize) {
    let room = MAX_MODULES.saturating_sub(before);
    if modules.len() > room {
        for m in &modules[room..] {
            warn!(%pid, "{} is not cloned: the module directory is full ({MAX_MODULES} modules)", m.path);
        }
        modules.truncate(room);
    }
}

/// Libraries mapped after the attach (`dlopen`), to be cloned and added
/// ([`add_loaded`]).
#[derive(Debug)]
pub(crate) struct LoadRequest {
    pub(crate) pid: Pid,
    pub(super) control: u64,
    pub(super) exe_path: String,
    /// The first `fid` they may use.
    pub(super) next_fid: u32,
    /// The tables in the target now, to merge theirs with.
    pub(super) base: u64,
    /// [`Attachment::forgets`] when asked: if it moved by the time the
    /// clones are ready, the tables merged here are stale.
    pub(crate) forgets: u64,
    pub(crate) libraries: Vec<super::linkmap::Loaded>,
    /// What the clones record besides paths.
    pub(super) rec: userspace_rewriter::codegen::Recording,
}

/// Clones libraries mapped since the attach (`dlopen`): each is analysed
/// and generated for a gap near it while the program runs, then a short
/// ptrace stop maps room for their clones and for the lookup tables of
/// every module (the target's current ones, masked entries left out, with
/// theirs), which are written through `/proc/PID/mem` once it runs again,
/// as the second step of an attach does. The session puts them in use
/// ([`Attachment::activate`]). `None` when none could be cloned.
pub(crate) fn add_loaded(req: &LoadRequest) -> anyhow::Result<Option<Extension>> {
    let pid = req.pid;
    let t0 = std::time::Instant::now();
    let maps = inject::maps(pid)?;
    let mut fid_base = req.next_fid;
    let mut gens = Vec::new();
    let mut reserved = Vec::new();
    let mut from_cache = 0;
    let loaded: Vec<Module> = modules::mapped_libraries(pid, &maps, &req.exe_path)
        .into_iter()
        .filter(|m| {
            req.libraries
                .iter()
                .any(|l| l.path == m.path && l.lo == m.range.0 && l.ino == m.ino)
        })
        .collect();
    let work = progress::begin(
        pid,
        &req.exe_path,
        Step::Loaded,
        loaded.iter().map(|m| (m.path.clone(), m.len)),
    );
    for mut module in loaded {
        module.rec = req.rec;
        let path = module.path.clone();
        let _done = Done(&path);
        let mut a = match progress::in_module(&path, || analyse(module)) {
            Ok(a) => a,
            Err(e) => {
                warn!(%pid, "{path} (loaded since the attach) is not cloned: {e:#}");
                continue;
            }
        };
        if !a.take_fids(&mut fid_base) {
            warn!(%pid, "{path} is not cloned: too many functions to number");
            continue;
        }
        from_cache += usize::from(a.cached_before());
        match progress::in_module(&path, || generate(pid, a, req.control, None, &mut reserved)) {
            Ok(g) => gens.push(g),
            Err(e) => warn!(%pid, "{path} (loaded since the attach) is not cloned: {e:#}"),
        }
    }
    if gens.is_empty() {
        return Ok(None);
    }
    let current = FileTables::in_process(pid, req.base)?;
    let tables = Merged::new(
        std::iter::once(&current as &dyn TableSource)
            .chain(gens.iter().map(Generated::tables))
            .collect(),
    );
    let tables_len = tables.len_bytes().next_multiple_of(PAGE_SIZE);
    let prepared_ms = t0.elapsed().as_secs_f64() * 1e3;
    work.phase(Phase::Injecting);
    // The stop only maps (a ptrace stop can cut a system call under way
    // short: as short as it can be); the bytes go in after it.
    let mut t = Tracee::attach(pid).context("stopping the target with ptrace")?;
    let stopped = std::time::Instant::now();
    // Stopped, it cannot exec: the program stopped is checked, and every
    // write of this step goes to it.
    let mem = match rooms::open_ours(pid, req.control) {
        Ok(m) => m,
        Err(e) => {
            t.detach()?;
            return Err(e);
        }
    };
    place_checks(&mut t, &gens, tables_len)?;
    for g in &gens {
        t.mmap(g.code, g.code_len, RX, CODE_FLAGS, -1, 0)
            .with_context(|| format!("mapping the clone code of {}", g.facts.path))?;
    }
    let tables_at = t
        .mmap(0, tables_len, libc::PROT_READ, TABLE_FLAGS, -1, 0)
        .context("mapping the lookup tables")?;
    t.detach()?;
    let stopped_ms = stopped.elapsed().as_secs_f64() * 1e3;
    write_unused(pid, &mem, &gens, &tables, tables_at)?;
    remember(&mut gens);
    let entries = gens.iter().map(Generated::entry).collect();
    let names: Vec<String> = gens.iter().map(|g| g.facts.name().to_owned()).collect();
    let mut ext = Extension::of(gens);
    ext.activate = Some((tables_at, entries));
    info!(
        %pid,
        "bursty tracing: {} functions of {} ({}) loaded since the attach rewritten ({} skipped); analysis and generation {prepared_ms:.0} ms{}, target stopped {stopped_ms:.1} ms",
        ext.functions_rewritten,
        if names.len() == 1 { "a library" } else { "libraries" },
        names.join(", "),
        ext.functions_skipped,
        from_cache_note(from_cache),
    );
    Ok(Some(ext))
}

/// Marks a module done for [`progress`] when dropped (however its
/// preparation ended: the work goes on to the next).
struct Done<'a>(&'a str);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        progress::done(self.0);
    }
}
