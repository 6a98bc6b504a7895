//! Symbolization: code addresses → functions, source files, lines, inline frames.
//!
//! **You give it** a user address of a sampled process (with the
//! [`ProcessTable`] that maps it) or a kernel address. **It gives back** a
//! [`Resolved`]: the mapping the address belongs to and the frames at that
//! address, innermost first (inlined callees first, the containing function
//! last), with demangled Rust (legacy and v0) and C++ names.
//!
//! Sources, best first:
//! 1. DWARF (`.debug_info`/`.debug_line`, inline frames) through `addr2line`,
//!    from the module itself or from a separate debug file found by build ID
//!    (`/usr/lib/debug/.build-id/..`) or `.gnu_debuglink`;
//! 2. the ELF symbol tables `.symtab` and `.dynsym` (nearest preceding function
//!    symbol whose size covers the address);
//! 3. where no symbol covers the address, the function the rewriter's
//!    function discovery finds there (`.eh_frame` FDEs, PLT stubs), named
//!    as the bursts' plans name it: [`function_name`] (`xz!sub_16880`);
//! 4. for `[vdso]` without a matching symbol, the name `[vdso]`.
//!
//! Kernel addresses are resolved with `/proc/kallsyms` (read once; needs root
//! or `kptr_restrict=0`), kernel-module symbols get the module as mapping.
//!
//! ## Address spaces
//!
//! AVMA = address in the process; SVMA = address stated in the ELF file (what
//! DWARF and symbol tables use); `bias = avma - svma` comes from the mapping.
//! A return address points after the call, so for every frame but the leaf we
//! look up `avma - 1 - bias` ([`FrameAddress::lookup_address`]).
//!
//! ## Caching
//!
//! Per module (keyed by build ID, or by path and inode when there is none):
//! the parsed symbol table and the lazily created DWARF context; per (module,
//! SVMA): the resolved frames. Modules only this cache still holds are dropped
//! by [`Symbolizer::prune`].
//!
//! ## Non-goals
//!
//! No debuginfod or network lookups, no symbolization of JIT code, no kernel
//! line numbers (no vmlinux DWARF).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use burstyd_common::addr::{FrameAddress, Pid};
use object::{Object, ObjectSymbol, SymbolKind};
use tracing::{debug, warn};

use crate::stacks::dwarf::Dwarf;
use crate::stacks::dwarf_worker::Answer;
use crate::stacks::kernel_symbols::KernelSymbols;
use crate::stacks::modules::Module;
use crate::stacks::table::{MappingInfo, ProcessTable};

/// One (possibly inlined) function at an address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Frame {
    /// Demangled name; `"??"` only when truly unknown.
    pub(crate) function: String,
    /// Source file, if DWARF says.
    pub(crate) file: Option<String>,
    /// Source line, if DWARF says.
    pub(crate) line: Option<u32>,
}

/// What an address resolved to.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    /// The mapping containing the address.
    pub(crate) mapping: Option<MappingInfo>,
    /// Innermost first: inlined callees first, the containing (outer) function last; empty = unknown.
    pub(crate) frames: Vec<Frame>,
}

/// The name of a frame in the runtime bursty tracing injects (its
/// routines: records, table lookups, the signal handler): the cost of
/// tracing, shown as such. Clone frames are reported as the original
/// instructions before they get here ([`super::clones`]); an address of
/// the injected region still untranslated is the runtime's.
pub(crate) const RUNTIME_FRAME: &str = "[burstyd burst runtime]";

/// [`RUNTIME_FRAME`] for an address in a process's injected region, else
/// unknown.
fn runtime_or_unknown(procs: &ProcessTable, pid: Pid, frame: FrameAddress) -> Resolved {
    let a = frame.address().0;
    let injected = procs
        .clone_frames(pid)
        .is_some_and(|c| c.regions.iter().any(|r| r.range.contains(&a)));
    if !injected {
        return Resolved::unknown();
    }
    Resolved {
        mapping: None,
        frames: vec![Frame {
            function: RUNTIME_FRAME.to_owned(),
            file: None,
            line: None,
        }],
    }
}

impl Resolved {
    pub(crate) fn unknown() -> Self {
        Resolved {
            mapping: None,
            frames: Vec::new(),
        }
    }
}

/// A DWARF file this large is read by a worker process, not the daemon
/// ([`Symbolizer::with_dwarf_workers`]). libc's separate debug file (4 MB,
/// its sections compressed) took 29 MB of the daemon's heap to parse.
/// Smaller files are parsed in the daemon: a worker's start (tens of ms,
/// more on a busy host) would hold up every interval profile of a small
/// program for little memory saved.
const DWARF_WORKER_MIN_BYTES: u64 = 1 << 20;

/// Upper bound on cached addresses per module before the cache is cleared.
const MAX_CACHED_ADDRS: usize = 1 << 17;
/// A symbol of size 0 covers at most this many bytes.
const SIZELESS_SYMBOL_SPAN: u64 = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ModuleId {
    BuildId(String),
    PathInode(String, u64),
}

fn module_id(m: &Module) -> ModuleId {
    match m.build_id() {
        Some(id) => ModuleId::BuildId(id.to_owned()),
        None => ModuleId::PathInode(m.path().to_owned(), m.inode()),
    }
}

/// A function symbol; the name is a range of the module's data.
#[derive(Clone, Copy, Debug)]
struct Sym {
    start: u64,
    size: u64,
    name_off: usize,
    name_len: u32,
    /// Higher is preferred among symbols at the same address.
    rank: u8,
}

/// Function symbols of `.symtab` and `.dynsym`, sorted by address.
struct SymbolTable {
    syms: Vec<Sym>,
}

impl SymbolTable {
    fn build(module: &Module) -> SymbolTable {
        let data = module.data();
        let mut syms = Vec::new();
        if let Ok(obj) = object::File::parse(data) {
            let base = data.as_ptr() as usize;
            let mut add = |s: object::Symbol<'_, '_>, dynamic: bool| {
                if s.kind() != SymbolKind::Text || s.is_undefined() || s.address() == 0 {
                    return;
                }
                let Ok(name) = s.name_bytes() else { return };
                let off = (name.as_ptr() as usize).wrapping_sub(base);
                if name.is_empty() || off.checked_add(name.len()).is_none_or(|e| e > data.len()) {
                    return;
                }
                let rank =
                    u8::from(s.is_global()) * 2 + u8::from(!dynamic) + u8::from(s.size() > 0) * 4;
                syms.push(Sym {
                    start: s.address(),
                    size: s.size(),
                    name_off: off,
                    name_len: name.len().min(u32::MAX as usize) as u32,
                    rank,
                });
            };
            for s in obj.symbols() {
                add(s, false);
            }
            for s in obj.dynamic_symbols() {
                add(s, true);
            }
        }
        // Sort by address, best first among equal addresses, then keep one per address.
        syms.sort_by(|a, b| a.start.cmp(&b.start).then(b.rank.cmp(&a.rank)));
        syms.dedup_by_key(|s| s.start);
        SymbolTable { syms }
    }

    fn lookup<'m>(&self, module: &'m Module, svma: u64) -> Option<&'m [u8]> {
        let i = self.syms.partition_point(|s| s.start <= svma);
        // The nearest preceding symbol, or one a little further back whose
        // size still covers the address (nested/aliased symbols).
        for (k, s) in self.syms[..i].iter().rev().take(8).enumerate() {
            let covers = if s.size > 0 {
                svma - s.start < s.size
            } else {
                k == 0 && svma - s.start < SIZELESS_SYMBOL_SPAN
            };
            if covers {
                return module
                    .data()
                    .get(s.name_off..s.name_off + s.name_len as usize);
            }
        }
        None
    }
}

pub(crate) fn demangle(raw: &str) -> String {
    addr2line::demangle_auto(Cow::Borrowed(raw), None).into_owned()
}

/// The name a function of module `module_path` carries in every output
/// (`context.pb.gz`, `paths.pb.gz`, `hot-paths`), from its raw name as
/// the rewriter's function discovery gives it: demangled, and a function
/// no symbol names (`sub_<hex start>`, its start as `nm` prints
/// addresses: the SVMA) prefixed with its module's file name and `!`, as
/// in `liblzma.so.5.4.1!sub_15ae0`: `sub_15ae0` alone does not say where
/// it is.
pub(crate) fn function_name(module_path: &str, raw: &str) -> String {
    let unnamed = raw
        .strip_prefix("sub_")
        .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if unnamed {
        let file = module_path.rsplit('/').next().unwrap_or(module_path);
        format!("{file}!{raw}")
    } else {
        demangle(raw)
    }
}

/// The functions of `module` as the rewriter's function discovery finds
/// them (start, size, raw name), sorted by start: for addresses no
/// symbol covers.
fn discovered_functions(module: &Module) -> Vec<(u64, u64, String)> {
    let data = module.data();
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let Ok(fns) = userspace_rewriter::analysis::functions::discover(&file, data) else {
        return Vec::new();
    };
    let mut v: Vec<_> = fns.into_iter().map(|f| (f.start, f.size, f.name)).collect();
    v.sort_unstable_by_key(|f| f.0);
    v
}

/// The frames (innermost first) of static addresses `svmas` of the ELF
/// file `module`, outside any process (`burstyd hot-streams`): its symbol
/// table, its separate debug file's, its DWARF, opened here and dropped.
pub(crate) fn resolve_in_module(module: Arc<Module>, svmas: &[u64]) -> HashMap<u64, Vec<Frame>> {
    let mut syms = ModuleSymbols::new(module);
    let out = svmas
        .iter()
        .map(|&a| (a, syms.resolve(a).to_vec()))
        .collect();
    syms.close_dwarf();
    out
}

struct ModuleSymbols {
    module: Arc<Module>,
    symbols: Option<SymbolTable>,
    /// [`discovered_functions`], found at the first address no symbol
    /// covers.
    discovered: Option<Vec<(u64, u64, String)>>,
    /// `None` = not tried yet; `Some(None)` = no DWARF available.
    dwarf: Option<Option<Dwarf>>,
    cache: HashMap<u64, Arc<[Frame]>>,
    /// What a DWARF worker answered for the addresses about to be
    /// resolved ([`Self::ask_worker`]); with a worker, DWARF is never
    /// opened in this process.
    answers: HashMap<u64, Answer>,
    worker: bool,
    /// The worker failed for this module: its symbol table only.
    worker_failed: bool,
}

impl ModuleSymbols {
    fn new(module: Arc<Module>) -> Self {
        ModuleSymbols {
            module,
            symbols: None,
            discovered: None,
            dwarf: None,
            cache: HashMap::new(),
            answers: HashMap::new(),
            worker: false,
            worker_failed: false,
        }
    }

    /// The ELF file with the module's DWARF: itself, or its separate
    /// debug file.
    fn dwarf_path(&self) -> Option<std::path::PathBuf> {
        if self.module.has_debug_info() {
            self.module.fd_path()
        } else {
            self.module.debug_file()
        }
    }

    /// Has a worker process ([`dwarf_worker`](crate::stacks::dwarf_worker))
    /// look up `svmas` (those not resolved before) in the module's DWARF,
    /// for [`Self::resolve`]. A failure is said once; the module is then
    /// resolved from its symbol table.
    fn ask_worker(&mut self, svmas: impl Iterator<Item = u64>) {
        let Some(path) = self.dwarf_path() else {
            return;
        };
        // A small file is parsed here: it costs the daemon little, and a
        // worker's start (tens of ms, more on a busy host) would hold up
        // every profile of a small program.
        self.worker = std::fs::metadata(&path).is_ok_and(|m| m.len() >= DWARF_WORKER_MIN_BYTES);
        if !self.worker || self.worker_failed {
            return;
        }
        let mut want: Vec<u64> = svmas.filter(|a| !self.cache.contains_key(a)).collect();
        want.dedup();
        if want.is_empty() {
            return;
        }
        match crate::stacks::dwarf_worker::answers(&path, &want) {
            Ok((answers, peak)) => {
                debug!(
                    module = self.module.path(),
                    dwarf = %path.display(),
                    addresses = want.len(),
                    worker_peak_mb = peak as f64 / 1e6,
                    "DWARF answered by a worker"
                );
                self.answers = want.into_iter().zip(answers).collect();
            }
            Err(e) => {
                warn!(module = self.module.path(), dwarf = %path.display(), "{e:#}; its addresses are named from its symbol table");
                self.worker_failed = true;
            }
        }
    }

    fn dwarf(&mut self) -> Option<&Dwarf> {
        let path = self.dwarf_path();
        let module = &self.module;
        self.dwarf
            .get_or_insert_with(|| {
                let path = path?;
                match Dwarf::open(&path) {
                    Ok(l) => {
                        debug!(module = module.path(), dwarf = %path.display(), "loaded DWARF");
                        Some(l)
                    }
                    Err(e) => {
                        warn!(module = module.path(), dwarf = %path.display(), error = %e, "cannot load DWARF");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Drops the parsed DWARF (it is opened again for the next address
    /// not in the cache); a module without DWARF stays without.
    fn close_dwarf(&mut self) {
        if matches!(self.dwarf, Some(Some(_))) {
            self.dwarf = None;
        }
    }

    fn symbol_name(&mut self, svma: u64) -> Option<String> {
        let module = &self.module;
        let table = self
            .symbols
            .get_or_insert_with(|| SymbolTable::build(module));
        if let Some(raw) = table.lookup(module, svma) {
            return Some(demangle(&String::from_utf8_lossy(raw)));
        }
        // No symbol: the function discovery's, named as in the plans.
        let found = self
            .discovered
            .get_or_insert_with(|| discovered_functions(module));
        let i = found.partition_point(|f| f.0 <= svma);
        let (start, size, raw) = found.get(i.checked_sub(1)?)?;
        (svma - start < *size).then(|| function_name(module.path(), raw))
    }

    fn resolve(&mut self, svma: u64) -> Arc<[Frame]> {
        if let Some(f) = self.cache.get(&svma) {
            return f.clone();
        }
        let Answer { frames, location } = if self.worker {
            self.answers.remove(&svma).unwrap_or_default()
        } else {
            self.dwarf()
                .map(|d| Answer::of(d, svma))
                .unwrap_or_default()
        };
        let out: Vec<Frame> = if frames.is_empty() {
            let name = self
                .symbol_name(svma)
                .or_else(|| (self.module.path() == "[vdso]").then(|| "[vdso]".to_owned()));
            match (name, location) {
                (Some(function), loc) => {
                    let (file, line) = loc.unwrap_or((None, None));
                    vec![Frame {
                        function,
                        file,
                        line,
                    }]
                }
                (None, Some((file, line))) => vec![Frame {
                    function: "??".to_owned(),
                    file,
                    line,
                }],
                (None, None) => Vec::new(),
            }
        } else {
            let n = frames.len();
            let mut out = Vec::with_capacity(n);
            for (i, (function, file, line)) in frames.into_iter().enumerate() {
                let function = match function {
                    Some(f) => f,
                    // The outer function without a DWARF name: use the symbol table.
                    None if i + 1 == n => self.symbol_name(svma).unwrap_or_else(|| "??".to_owned()),
                    None => "??".to_owned(),
                };
                out.push(Frame {
                    function,
                    file,
                    line,
                });
            }
            out
        };
        let out: Arc<[Frame]> = out.into();
        if self.cache.len() >= MAX_CACHED_ADDRS {
            self.cache.clear();
        }
        self.cache.insert(svma, out.clone());
        out
    }
}

/// Resolves addresses to frames, caching per module and per address.
pub(crate) struct Symbolizer {
    modules: HashMap<ModuleId, ModuleSymbols>,
    /// `None` = not loaded yet.
    kernel: Option<Option<KernelSymbols>>,
    /// DWARF is read by worker processes ([`Symbolizer::with_dwarf_workers`]).
    dwarf_workers: bool,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// An empty symbolizer.
    pub(crate) fn new() -> Self {
        Symbolizer {
            modules: HashMap::new(),
            kernel: None,
            dwarf_workers: false,
        }
    }

    /// The daemon's symbolizer: each module's DWARF is read by a worker
    /// process ([`crate::stacks::dwarf_worker`]), a module at a time, for
    /// the addresses not resolved before; the daemon never holds parsed
    /// DWARF. (Without, as in unit tests, it is opened here.)
    pub(crate) fn with_dwarf_workers() -> Self {
        Symbolizer {
            dwarf_workers: true,
            ..Self::new()
        }
    }

    /// Resolves many user-space frames (of several processes) at once,
    /// a module at a time: each module's DWARF is opened for the frames
    /// not resolved before and closed once they are, so that a profile
    /// holds the parsed DWARF of one module at a time, not of all (for a
    /// C++ program, its own, libstdc++'s and libc's: tens of MB), and a
    /// daemon that runs for weeks holds none between profiles.
    pub(crate) fn resolve_users(
        &mut self,
        procs: &ProcessTable,
        frames: impl IntoIterator<Item = (Pid, FrameAddress)>,
    ) -> HashMap<(Pid, FrameAddress), Resolved> {
        let mut by_module: HashMap<ModuleId, Vec<(Pid, FrameAddress, MappingInfo, u64)>> =
            HashMap::new();
        let mut out = HashMap::new();
        for (pid, frame) in frames {
            if out.contains_key(&(pid, frame)) {
                continue;
            }
            match procs.mapping_for(pid, frame.address().0) {
                Some(mapping) => {
                    let svma = (frame.lookup_address() - mapping.bias).0;
                    by_module
                        .entry(module_id(&mapping.module))
                        .or_default()
                        .push((pid, frame, mapping, svma));
                    // Placeholder until its module's turn.
                    out.insert((pid, frame), Resolved::unknown());
                }
                None => {
                    out.insert((pid, frame), runtime_or_unknown(procs, pid, frame));
                }
            }
        }
        for (_, mut list) in by_module {
            list.sort_unstable_by_key(|e| e.3);
            let module = list[0].2.module.clone();
            let workers = self.dwarf_workers;
            let syms = self.module_symbols(&module);
            if workers {
                syms.ask_worker(list.iter().map(|e| e.3));
            }
            for (pid, frame, mapping, svma) in list {
                let frames = syms.resolve(svma).to_vec();
                out.insert(
                    (pid, frame),
                    Resolved {
                        mapping: Some(mapping),
                        frames,
                    },
                );
            }
            syms.close_dwarf();
            syms.answers = HashMap::new();
        }
        out
    }

    fn module_symbols(&mut self, module: &Arc<Module>) -> &mut ModuleSymbols {
        let id = module_id(module);
        let entry = self
            .modules
            .entry(id)
            .or_insert_with(|| ModuleSymbols::new(module.clone()));
        // Same path and inode but another file (replaced on disk): start over.
        if !Arc::ptr_eq(&entry.module, module) && module.build_id().is_none() {
            *entry = ModuleSymbols::new(module.clone());
        }
        entry
    }

    /// Kernel addresses from `/proc/kallsyms` (loaded once, sorted). The
    /// mapping path is `[kernel.kallsyms]`, or `[module]` for kernel modules.
    pub(crate) fn resolve_kernel(&mut self, addr: u64) -> Resolved {
        let kernel = self.kernel.get_or_insert_with(KernelSymbols::load);
        let Some((name, mapping)) = kernel.as_ref().and_then(|k| k.lookup(addr)) else {
            return Resolved::unknown();
        };
        Resolved {
            mapping: Some(mapping.clone()),
            frames: vec![Frame {
                function: name.to_owned(),
                file: None,
                line: None,
            }],
        }
    }
}

#[cfg(test)]
mod tests;
