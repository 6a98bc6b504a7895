//! Process table: memory maps of sampled processes and the ELF modules mapped into them.
//!
//! **You give it** process ids (and, per sample, a code address in that process).
//! **It gives back** the executable mapping that contains the address: where it
//! is, which file it comes from, that file's build ID, the load bias, and a
//! shared, parsed [`Module`] (an `mmap` of the file plus the locations of the
//! sections the unwinder and the symbolizer need). The [`super::unwind`] and
//! [`super::symbolize`] modules are its two users.
//!
//! ## Address spaces
//!
//! * **AVMA** (actual virtual memory address): an address in the sampled
//!   process — `rip`, return addresses, the ranges in `/proc/PID/maps`.
//! * **SVMA** (stated virtual memory address): an address as the ELF file states
//!   it — section and segment addresses, symbol values, DWARF and `.eh_frame`
//!   addresses.
//! * **file offset**: a position in the file; `/proc/PID/maps` gives the file
//!   offset each mapping starts at, the `PT_LOAD` headers give the SVMA of each
//!   file offset.
//!
//! `bias = avma - svma` (wrapping) is computed once per mapping
//! ([`userspace_rewriter::analysis::elf::ElfInfo::load_bias_for`]); it is 0 for non-PIE
//! executables. To look an AVMA up in a file, subtract the bias.
//!
//! ## How it works
//!
//! * Snapshots of `/proc/PID/maps` are taken on demand by [`ProcessTable::ensure`]:
//!   again only when a code address is in no executable mapping of the snapshot
//!   (a `dlopen` since, or a library the loader was still mapping) and the last
//!   read is older than [`REFRESH_INTERVAL`].
//! * Module files are opened through `/proc/PID/map_files/START-END` (works for
//!   deleted files and files in other mount namespaces), then
//!   `/proc/PID/root/PATH`, then `PATH`; `[vdso]` is copied out of the process'
//!   memory. Modules are cached by (device, inode) and deduplicated by build ID,
//!   so a library mapped by many processes is opened and parsed once.
//! * Every snapshot has a generation number that changes whenever its set of
//!   executable mappings changes, so the unwinder can cache per-process state.
//!
//! ## Non-goals
//!
//! Anonymous executable memory (JIT code) has no module and is not reported by
//! [`ProcessTable::mapping_for`]; 32-bit processes are not supported; no
//! notification of `mmap` events (polling `/proc/PID/maps` is enough for sampling).

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burstyd_common::addr::{Bias, Pid};
use tracing::debug;
use userspace_rewriter::inject::{self, MapEntry};

use super::clones::CloneFrames;
use super::modules::{Module, open_module};

/// Minimum time between two reads of one process' maps when an address is not covered.
const REFRESH_INTERVAL: Duration = Duration::from_millis(50);

/// Refreshes of a process's maps allowed before [`REFRESH_INTERVAL`] applies.
const FREE_REFRESHES: u32 = 8;

/// How long a file that failed to load is not retried.
const FAILED_RETRY: Duration = Duration::from_secs(10);

/// Largest `[vdso]` image we copy out of a process.
const MAX_VDSO_SIZE: u64 = 1 << 20;

/// Everything we know about one executable mapping of a process.
#[derive(Clone, Debug)]
pub(crate) struct MappingInfo {
    /// First AVMA of the mapping.
    pub(crate) start: u64,
    /// One past the last AVMA.
    pub(crate) limit: u64,
    /// File offset of `start`.
    pub(crate) file_offset: u64,
    /// Path as in `/proc/PID/maps` (`[vdso]` for the vDSO).
    pub(crate) path: String,
    /// Lowercase hex GNU build ID.
    pub(crate) build_id: Option<String>,
    /// `avma - svma` (wrapping).
    pub(crate) bias: Bias,
    /// The loaded file.
    pub(crate) module: Arc<Module>,
}

/// One executable mapping with its module, as kept in a snapshot.
#[derive(Clone, Debug)]
pub(crate) struct ExecMapping {
    /// First AVMA.
    pub(crate) start: u64,
    /// One past the last AVMA.
    pub(crate) end: u64,
    /// File offset of `start`.
    pub(crate) file_offset: u64,
    /// `avma - svma` (wrapping).
    pub(crate) bias: Bias,
    /// Path as in the maps.
    pub(crate) path: Arc<str>,
    /// The module.
    pub(crate) module: Arc<Module>,
}

impl ExecMapping {
    fn info(&self) -> MappingInfo {
        MappingInfo {
            start: self.start,
            limit: self.end,
            file_offset: self.file_offset,
            path: self.path.to_string(),
            build_id: self.module.build_id().map(str::to_owned),
            bias: self.bias,
            module: self.module.clone(),
        }
    }

    fn same_as(&self, other: &ExecMapping) -> bool {
        self.start == other.start
            && self.end == other.end
            && self.bias == other.bias
            && Arc::ptr_eq(&self.module, &other.module)
    }
}

#[derive(Clone)]
struct ProcState {
    /// All mappings, sorted by start.
    maps: Vec<MapEntry>,
    /// Executable mappings with a module, sorted by start.
    exec: Vec<ExecMapping>,
    last_refresh: Instant,
    /// Refreshes so far. A young process maps libraries in quick
    /// succession (exec, ld.so, libc, ...), so its first
    /// [`FREE_REFRESHES`] refreshes are not rate limited.
    refreshes: u32,
    exited: bool,
    generation: u64,
}

impl ProcState {
    /// Whether the snapshot has `addr` in an executable mapping: code
    /// addresses (a pc, a return address) are looked for only there. A
    /// non-executable mapping does not count: the dynamic loader first
    /// reserves a library's whole range read-only, then maps its text
    /// over it, and a snapshot taken in between must not keep the
    /// library's text unknown.
    fn covers_code(&self, addr: u64) -> bool {
        find_sorted(&self.maps, addr, |m| (m.start, m.end)).is_some_and(|m| m.is_exec())
    }

    fn exec_at(&self, addr: u64) -> Option<&ExecMapping> {
        find_sorted(&self.exec, addr, |m| (m.start, m.end))
    }
}

fn find_sorted<T>(v: &[T], addr: u64, range: impl Fn(&T) -> (u64, u64)) -> Option<&T> {
    let i = v.partition_point(|m| range(m).0 <= addr);
    let m = v.get(i.checked_sub(1)?)?;
    (addr < range(m).1).then_some(m)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ModuleKey {
    File { major: u32, minor: u32, inode: u64 },
    BuildId(String),
}

/// Everything burstyd keeps about processes it has sampled. Cheap to query per sample.
pub(crate) struct ProcessTable {
    procs: HashMap<Pid, ProcState>,
    modules: HashMap<ModuleKey, Arc<Module>>,
    failed: HashMap<ModuleKey, Instant>,
    next_generation: u64,
    /// Bursty tracing: the injected clones of a process, unwound with their
    /// own `.eh_frame` and reported as the original addresses.
    clones: HashMap<Pid, Arc<CloneFrames>>,
}

impl Default for ProcessTable {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessTable {
    /// An empty table.
    pub(crate) fn new() -> Self {
        ProcessTable {
            procs: HashMap::new(),
            modules: HashMap::new(),
            failed: HashMap::new(),
            next_generation: 1,
            clones: HashMap::new(),
        }
    }

    /// Registers the clones injected into `pid` (see [`crate::bursts`]).
    pub(crate) fn set_clone_frames(&mut self, pid: Pid, frames: Arc<CloneFrames>) {
        self.clones.insert(pid, frames);
        self.next_generation += 1;
        if let Some(p) = self.procs.get_mut(&pid) {
            p.generation = self.next_generation;
        }
    }

    /// `pid` exec'd: its maps and clones are another program's now (read
    /// again at its next sample).
    pub(crate) fn exec_seen(&mut self, pid: Pid) {
        self.procs.remove(&pid);
        self.clones.remove(&pid);
        self.next_generation += 1;
    }

    /// The clones injected into `pid`, if any.
    pub(crate) fn clone_frames(&self, pid: Pid) -> Option<&Arc<CloneFrames>> {
        self.clones.get(&pid)
    }

    /// Make sure we hold a maps snapshot for `pid` that covers the code
    /// address `addr` (re-read `/proc/PID/maps` at most when `addr` is not
    /// in an executable mapping of the snapshot and the last refresh is
    /// older than [`REFRESH_INTERVAL`], so `dlopen` is seen). Returns false
    /// when the process is gone and nothing is known.
    pub(crate) fn ensure(&mut self, pid: Pid, addr: u64) -> bool {
        if let Some(p) = self.procs.get(&pid)
            && (p.exited
                || p.covers_code(addr)
                || (p.refreshes >= FREE_REFRESHES && p.last_refresh.elapsed() < REFRESH_INTERVAL))
        {
            return true;
        }
        self.refresh(pid)
    }

    /// A process first seen in a sample that also names its parent: if
    /// its own maps cannot be read any more (a short-lived child, gone
    /// before the daemon got to its samples) and it still runs the program
    /// its parent runs (`comm` is the parent's name: it forked without
    /// exec), it is given a copy of the parent's maps — a forked child
    /// shares them until it execs or maps something new.
    pub(crate) fn inherit(&mut self, child: Pid, parent: Pid, comm: &str) {
        if self.procs.contains_key(&child) || parent == child || parent.0 == 0 {
            return;
        }
        if self.refresh(child) {
            return;
        }
        let parent_comm = crate::sys::comm(parent).unwrap_or_default();
        if parent_comm != comm || !(self.procs.contains_key(&parent) || self.refresh(parent)) {
            return;
        }
        let mut state = self.procs[&parent].clone();
        state.exited = true;
        self.procs.insert(child, state);
        if let Some(c) = self.clones.get(&parent).cloned() {
            self.clones.insert(child, c);
        }
        debug!(%child, %parent, "gone before its maps were read: symbolized with its parent's");
    }

    /// Re-read `/proc/PID/maps` now. Returns whether anything is known about `pid`.
    pub(crate) fn refresh(&mut self, pid: Pid) -> bool {
        let now = Instant::now();
        let mut maps = match inject::maps(pid) {
            Ok(m) if !m.is_empty() => m,
            Ok(_) | Err(_) => {
                // Gone (or a kernel thread, which has no maps).
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.exited = true;
                    p.last_refresh = now;
                    return true;
                }
                return false;
            }
        };
        maps.sort_by_key(|m| m.start);
        let mut exec = Vec::new();
        for entry in maps.iter().filter(|m| m.is_exec()) {
            let Some(path) = entry.path.as_deref() else {
                continue;
            };
            if entry.is_pseudo() && path != "[vdso]" {
                continue;
            }
            let Some(module) = self.load_module(pid, entry) else {
                continue;
            };
            let bias = if path == "[vdso]" {
                // The image was copied from `entry.start`, so file offset 0 is there.
                module.elf().load_bias_for(entry.start, 0, true)
            } else {
                module.elf().load_bias_for(entry.start, entry.offset, true)
            };
            let Some(bias) = bias else {
                debug!(
                    %pid,
                    path,
                    offset = entry.offset,
                    "no PT_LOAD segment for mapping"
                );
                continue;
            };
            exec.push(ExecMapping {
                start: entry.start,
                end: entry.end,
                file_offset: entry.offset,
                bias: Bias(bias),
                path: Arc::from(path),
                module,
            });
        }
        let refreshes = self.procs.get(&pid).map_or(0, |p| p.refreshes + 1);
        let generation = match self.procs.get(&pid) {
            Some(old)
                if old.exec.len() == exec.len()
                    && old.exec.iter().zip(&exec).all(|(a, b)| a.same_as(b)) =>
            {
                old.generation
            }
            _ => {
                self.next_generation += 1;
                self.next_generation
            }
        };
        self.procs.insert(
            pid,
            ProcState {
                maps,
                exec,
                last_refresh: now,
                refreshes,
                exited: false,
                generation,
            },
        );
        true
    }

    fn load_module(&mut self, pid: Pid, entry: &MapEntry) -> Option<Arc<Module>> {
        let path = entry.path.as_deref()?;
        if path == "[vdso]" {
            return self.load_vdso(pid, entry);
        }
        let key = ModuleKey::File {
            major: entry.dev_major,
            minor: entry.dev_minor,
            inode: entry.inode,
        };
        if let Some(m) = self.modules.get(&key) {
            return Some(m.clone());
        }
        if self
            .failed
            .get(&key)
            .is_some_and(|t| t.elapsed() < FAILED_RETRY)
        {
            return None;
        }
        match open_module(pid, entry, path) {
            Ok(module) => Some(self.insert_module(key, module)),
            Err(e) => {
                debug!(%pid, path, error = %e, "cannot load module");
                self.failed.insert(key, Instant::now());
                None
            }
        }
    }

    fn load_vdso(&mut self, pid: Pid, entry: &MapEntry) -> Option<Arc<Module>> {
        let len = entry.end.checked_sub(entry.start)?;
        if len == 0 || len > MAX_VDSO_SIZE {
            return None;
        }
        let mem = crate::sys::open_mem(pid, false).ok()?;
        let mut image = vec![0u8; len as usize];
        if let Err(e) = mem.read_exact_at(&mut image, entry.start) {
            debug!(%pid, error = %e, "cannot read [vdso]");
            return None;
        }
        let module = match Module::from_image("[vdso]", image) {
            Ok(m) => m,
            Err(e) => {
                debug!(%pid, error = %e, "cannot parse [vdso]");
                return None;
            }
        };
        let key = ModuleKey::BuildId(format!("vdso:{}", module.build_id().unwrap_or("")));
        if let Some(m) = self.modules.get(&key) {
            return Some(m.clone());
        }
        Some(self.insert_module(key, module))
    }

    fn insert_module(&mut self, key: ModuleKey, module: Module) -> Arc<Module> {
        // Share one module between identical files (same build ID) found
        // under different inodes, e.g. in several containers.
        let id_key = module
            .build_id()
            .map(|id| ModuleKey::BuildId(id.to_owned()));
        if let Some(existing) = id_key.as_ref().and_then(|k| self.modules.get(k)) {
            let existing = existing.clone();
            self.modules.insert(key, existing.clone());
            return existing;
        }
        debug!(path = module.path(), from = %module.opened_from().display(), build_id = ?module.build_id(), "loaded module");
        let module = Arc::new(module);
        if let Some(k) = id_key {
            self.modules.insert(k, module.clone());
        }
        self.modules.insert(key, module.clone());
        module
    }

    /// Forget nothing on exit: snapshots of exited processes stay so late
    /// samples still symbolize; this just stops refreshes.
    pub(crate) fn mark_exited(&mut self, pid: Pid) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.exited = true;
        }
    }

    /// The executable mapping containing `addr` in `pid`, with its module.
    pub(crate) fn mapping_for(&self, pid: Pid, addr: u64) -> Option<MappingInfo> {
        self.exec_mapping(pid, addr).map(ExecMapping::info)
    }

    /// Like [`ProcessTable::mapping_for`] without copying.
    pub(crate) fn exec_mapping(&self, pid: Pid, addr: u64) -> Option<&ExecMapping> {
        self.procs.get(&pid)?.exec_at(addr)
    }

    /// All executable mappings (with modules) of `pid`, sorted by address.
    pub(crate) fn exec_mappings(&self, pid: Pid) -> &[ExecMapping] {
        self.procs.get(&pid).map_or(&[], |p| &p.exec)
    }

    /// Changes whenever the executable mappings of `pid` change; `None` if unknown.
    pub(crate) fn generation(&self, pid: Pid) -> Option<u64> {
        self.procs.get(&pid).map(|p| p.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burstyd_common::addr::Avma;

    impl ProcessTable {
        fn is_exited(&self, pid: Pid) -> bool {
            self.procs.get(&pid).is_some_and(|p| p.exited)
        }

        fn module_count(&self) -> usize {
            let mut v: Vec<_> = self.modules.values().map(Arc::as_ptr).collect();
            v.sort();
            v.dedup();
            v.len()
        }
    }

    #[test]
    fn procs_table_self_mapping_bias_and_sharing() {
        let pid = Pid(std::process::id());
        let mut t = ProcessTable::new();
        let f = procs_table_self_mapping_bias_and_sharing as fn() as usize as u64;
        assert!(t.ensure(pid, f));
        let m = t.mapping_for(pid, f).expect("mapping for own code");
        assert!(m.start <= f && f < m.limit);
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(m.path, exe.to_str().unwrap());
        // The SVMA of our own function must fall in an executable PT_LOAD segment.
        let svma = Avma(f) - m.bias;
        let seg = m.module.elf().segment_for_svma(svma.0).expect("segment");
        assert!(seg.is_executable());
        assert!(m.module.has_unwind_info());
        assert_eq!(m.build_id.as_deref(), m.module.build_id());
        // Second ensure on a covered address keeps the generation.
        let g = t.generation(pid);
        assert!(t.ensure(pid, f));
        assert_eq!(t.generation(pid), g);
        // A forced refresh with unchanged maps keeps the generation and the modules.
        let n = t.module_count();
        assert!(t.refresh(pid));
        assert_eq!(t.generation(pid), g);
        assert_eq!(t.module_count(), n);
        // vdso is loaded from memory.
        if let Some(vdso) = t.exec_mappings(pid).iter().find(|m| &*m.path == "[vdso]") {
            assert!(!vdso.module.elf().segments.is_empty());
        }
        // A child sharing libc: same Arc<Module>.
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let cpid = Pid(child.id());
        std::thread::sleep(Duration::from_millis(100));
        assert!(t.refresh(cpid));
        let libc_of = |t: &ProcessTable, p| {
            t.exec_mappings(p)
                .iter()
                .find(|m| m.path.contains("libc.so"))
                .map(|m| m.module.clone())
        };
        let (a, b) = (libc_of(&t, pid).unwrap(), libc_of(&t, cpid).unwrap());
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        let _ = child.kill();
        let _ = child.wait();
        // Exited: snapshot stays, ensure still answers true.
        assert!(t.refresh(cpid));
        assert!(t.is_exited(cpid));
        assert!(t.ensure(cpid, 0x1234));
    }

    /// A snapshot taken while the loader maps a library has the library's
    /// range reserved read-only: a pc there later is code, and the maps
    /// are read again (before, such a process's libc stayed unknown, and
    /// every stack stopped at main's caller).
    #[test]
    fn code_in_a_mapping_that_was_not_executable_rereads_the_maps() {
        let pid = Pid(std::process::id());
        let mut t = ProcessTable::new();
        let len = 4096;
        // SAFETY: a fresh anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let addr = p as u64 + 16;
        assert!(t.refresh(pid));
        let exec_at = |t: &ProcessTable| {
            let maps = &t.procs[&pid].maps;
            find_sorted(maps, addr, |m| (m.start, m.end)).map(|m| m.is_exec())
        };
        assert_eq!(exec_at(&t), Some(false));
        // SAFETY: the mapping above.
        assert_eq!(
            unsafe { libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC) },
            0
        );
        assert!(t.ensure(pid, addr));
        assert_eq!(exec_at(&t), Some(true));
        // SAFETY: the mapping above, no longer used.
        unsafe { libc::munmap(p, len) };
    }

    #[test]
    fn procs_unknown_pid() {
        let mut t = ProcessTable::new();
        assert!(!t.ensure(Pid(u32::MAX - 1), 0x1000));
        assert!(t.mapping_for(Pid(u32::MAX - 1), 0x1000).is_none());
        t.mark_exited(Pid(u32::MAX - 1));
    }
}
