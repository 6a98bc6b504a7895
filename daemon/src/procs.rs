//! Process table: memory maps of sampled processes and the ELF modules mapped into them.
//!
//! **You give it** process ids (and, per sample, a code address in that process).
//! **It gives back** the executable mapping that contains the address: where it
//! is, which file it comes from, that file's build ID, the load bias, and a
//! shared, parsed [`Module`] (an `mmap` of the file plus the locations of the
//! sections the unwinder and the symbolizer need). The [`crate::unwind`] and
//! [`crate::symbolize`] modules are its two users.
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
//!   again only when an address is not covered by the snapshot (a `dlopen` since)
//!   and the last read is older than [`REFRESH_INTERVAL`].
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
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::Mmap;
use object::{Object, ObjectSection};
use tracing::{debug, warn};
use userspace_rewriter::analysis::elf::{ElfInfo, is_elf_x86_64};

/// Minimum time between two reads of one process' maps when an address is not covered.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(50);

/// Refreshes of a process's maps allowed before [`REFRESH_INTERVAL`] applies.
pub const FREE_REFRESHES: u32 = 8;

/// How long a file that failed to load is not retried.
const FAILED_RETRY: Duration = Duration::from_secs(10);

/// Largest `[vdso]` image we copy out of a process.
const MAX_VDSO_SIZE: u64 = 1 << 20;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// First address (AVMA) of the mapping.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset the mapping starts at.
    pub offset: u64,
    /// Device major number of the file (hex in maps).
    pub dev_major: u32,
    /// Device minor number.
    pub dev_minor: u32,
    /// Inode of the file, 0 for anonymous mappings.
    pub inode: u64,
    /// `rwxp`/`rwxs` characters as printed, e.g. `*b"r-xp"`.
    pub perms: [u8; 4],
    /// The path or pseudo-path (`[heap]`, `[stack]`, `[vdso]`, ...), without a
    /// ` (deleted)` suffix; `None` for anonymous mappings.
    pub path: Option<String>,
    /// Whether the kernel marked the file ` (deleted)`.
    pub deleted: bool,
}

impl MapEntry {
    /// Whether the mapping is executable.
    pub fn is_exec(&self) -> bool {
        self.perms[2] == b'x'
    }

    /// Whether `addr` lies inside the mapping.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// Whether the path is a kernel pseudo-path like `[heap]` or `[vdso]`.
    pub fn is_pseudo(&self) -> bool {
        self.path.as_deref().is_some_and(|p| p.starts_with('['))
    }

    /// Parse one line of `/proc/PID/maps`. `None` for malformed lines.
    pub fn parse(line: &str) -> Option<MapEntry> {
        // start-end perms offset major:minor inode [path]
        let mut rest = line;
        let mut field = || {
            let s = rest.trim_start_matches(' ');
            let end = s.find(' ').unwrap_or(s.len());
            let (f, r) = s.split_at(end);
            rest = r;
            if f.is_empty() { None } else { Some(f) }
        };
        let range = field()?;
        let perms = field()?;
        let offset = field()?;
        let dev = field()?;
        let inode = field()?;
        let (start, end) = range.split_once('-')?;
        let (major, minor) = dev.split_once(':')?;
        let perms: [u8; 4] = perms.as_bytes().try_into().ok()?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        if end < start {
            return None;
        }
        let path = rest.trim_start_matches(' ');
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (path, false),
        };
        Some(MapEntry {
            start,
            end,
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev_major: u32::from_str_radix(major, 16).ok()?,
            dev_minor: u32::from_str_radix(minor, 16).ok()?,
            inode: inode.parse().ok()?,
            perms,
            path: (!path.is_empty()).then(|| path.to_owned()),
            deleted,
        })
    }
}

/// Parse the text of a `/proc/PID/maps` file, skipping malformed lines.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines().filter_map(MapEntry::parse).collect()
}

/// Read and parse `/proc/PID/maps`.
pub fn read_maps(pid: u32) -> std::io::Result<Vec<MapEntry>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_maps(&text))
}

/// Errors from loading a module.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// No way to open the file worked.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The path from the maps.
        path: String,
        /// The last error.
        source: std::io::Error,
    },
    /// `mmap` or read failed.
    #[error("cannot map {path}: {source}")]
    Map {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Not an x86-64 ELF file.
    #[error("{0} is not an x86-64 ELF file")]
    NotElf(String),
    /// The ELF headers could not be read.
    #[error("{path}: {source}")]
    Elf {
        /// The path.
        path: String,
        /// The error.
        source: userspace_rewriter::analysis::elf::ElfError,
    },
}

/// Sections of a module that the unwinder and symbolizer use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SectionId {
    /// `.text`.
    Text,
    /// `.eh_frame`.
    EhFrame,
    /// `.eh_frame_hdr`.
    EhFrameHdr,
    /// `.debug_frame`.
    DebugFrame,
    /// `.got`.
    Got,
}

impl SectionId {
    const ALL: [SectionId; 5] = [
        SectionId::Text,
        SectionId::EhFrame,
        SectionId::EhFrameHdr,
        SectionId::DebugFrame,
        SectionId::Got,
    ];

    fn name(self) -> &'static str {
        match self {
            SectionId::Text => ".text",
            SectionId::EhFrame => ".eh_frame",
            SectionId::EhFrameHdr => ".eh_frame_hdr",
            SectionId::DebugFrame => ".debug_frame",
            SectionId::Got => ".got",
        }
    }
}

#[derive(Debug)]
enum Bytes {
    /// A range of the module's data.
    InData(Range<usize>),
    /// Decompressed contents.
    Owned(Box<[u8]>),
}

#[derive(Debug)]
struct SectionInfo {
    svma: Range<u64>,
    bytes: Bytes,
}

enum ModuleData {
    Mapped(Mmap),
    Owned(Box<[u8]>),
}

impl ModuleData {
    fn bytes(&self) -> &[u8] {
        match self {
            ModuleData::Mapped(m) => m,
            ModuleData::Owned(b) => b,
        }
    }
}

/// A loaded ELF file (or a memory image such as `[vdso]`), shared between
/// processes and between the unwinder and the symbolizer.
pub struct Module {
    path: String,
    opened_from: PathBuf,
    /// Kept open so that `/proc/self/fd/N` names this exact file later.
    file: Option<File>,
    data: ModuleData,
    elf: ElfInfo,
    build_id: Option<String>,
    dev: (u32, u32),
    inode: u64,
    sections: [Option<SectionInfo>; 5],
    has_debug_info: bool,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("path", &self.path)
            .field("opened_from", &self.opened_from)
            .field("build_id", &self.build_id)
            .field("len", &self.data.bytes().len())
            .field("inode", &self.inode)
            .finish_non_exhaustive()
    }
}

impl Module {
    /// Map and parse the ELF file `file` (opened from `opened_from`) that a
    /// process has mapped as `path`.
    pub fn from_file(path: &str, opened_from: PathBuf, file: File) -> Result<Module, ModuleError> {
        let meta = file.metadata().map_err(|source| ModuleError::Map {
            path: path.to_owned(),
            source,
        })?;
        // SAFETY: the file is mapped read-only and private. If another process
        // truncates it underneath us, accesses can fault, which every
        // profiler/debugger reading mapped binaries accepts.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| ModuleError::Map {
            path: path.to_owned(),
            source,
        })?;
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        Self::from_data(
            path,
            opened_from,
            Some(file),
            ModuleData::Mapped(mmap),
            dev,
            meta.ino(),
        )
    }

    /// Parse an in-memory image (e.g. `[vdso]` copied from a process).
    pub fn from_image(name: &str, image: Vec<u8>) -> Result<Module, ModuleError> {
        Self::from_data(
            name,
            PathBuf::from(name),
            None,
            ModuleData::Owned(image.into_boxed_slice()),
            (0, 0),
            0,
        )
    }

    /// A module with no contents, standing for code we only know by name
    /// (the kernel, kernel modules). It has no sections and no segments.
    pub fn placeholder(name: &str, build_id: Option<String>) -> Module {
        Module {
            path: name.to_owned(),
            opened_from: PathBuf::from(name),
            file: None,
            data: ModuleData::Owned(Box::new([])),
            elf: ElfInfo {
                kind: userspace_rewriter::analysis::elf::ElfKind::Other(0),
                machine: object::elf::EM_X86_64,
                entry: 0,
                build_id: None,
                debuglink: None,
                segments: Vec::new(),
            },
            build_id,
            dev: (0, 0),
            inode: 0,
            sections: Default::default(),
            has_debug_info: false,
        }
    }

    fn from_data(
        path: &str,
        opened_from: PathBuf,
        file: Option<File>,
        data: ModuleData,
        dev: (u32, u32),
        inode: u64,
    ) -> Result<Module, ModuleError> {
        let bytes = data.bytes();
        if !is_elf_x86_64(bytes) {
            return Err(ModuleError::NotElf(path.to_owned()));
        }
        let elf = ElfInfo::parse(bytes).map_err(|source| ModuleError::Elf {
            path: path.to_owned(),
            source,
        })?;
        let build_id = elf.build_id_hex();
        let mut sections: [Option<SectionInfo>; 5] = Default::default();
        let mut has_debug_info = false;
        match object::File::parse(bytes) {
            Ok(obj) => {
                for (slot, id) in sections.iter_mut().zip(SectionId::ALL) {
                    *slot = obj
                        .section_by_name(id.name())
                        .and_then(|s| section_info(&s, bytes));
                }
                has_debug_info = obj
                    .section_by_name(".debug_info")
                    .is_some_and(|s| s.size() > 0);
            }
            Err(e) => debug!(path, error = %e, "cannot read section headers"),
        }
        Ok(Module {
            path: path.to_owned(),
            opened_from,
            file,
            data,
            elf,
            build_id,
            dev,
            inode,
            sections,
            has_debug_info,
        })
    }

    /// The path under which the module was first seen (as in `/proc/PID/maps`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Where the file was actually opened from (e.g. `/proc/123/map_files/...`).
    pub fn opened_from(&self) -> &Path {
        &self.opened_from
    }

    /// The whole file (or image).
    pub fn data(&self) -> &[u8] {
        self.data.bytes()
    }

    /// ELF facts: segments, build ID, debuglink.
    pub fn elf(&self) -> &ElfInfo {
        &self.elf
    }

    /// Lowercase hex GNU build ID.
    pub fn build_id(&self) -> Option<&str> {
        self.build_id.as_deref()
    }

    /// Device (major, minor) of the file as `fstat` reports it, (0, 0) for images.
    pub fn dev(&self) -> (u32, u32) {
        self.dev
    }

    /// Inode of the file, 0 for images.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Whether the module itself carries `.debug_info`.
    pub fn has_debug_info(&self) -> bool {
        self.has_debug_info
    }

    /// Whether the module has `.eh_frame` or `.debug_frame`.
    pub fn has_unwind_info(&self) -> bool {
        self.section_data(SectionId::EhFrame)
            .is_some_and(|d| !d.is_empty())
            || self
                .section_data(SectionId::DebugFrame)
                .is_some_and(|d| !d.is_empty())
    }

    /// The (uncompressed) contents of a section.
    pub fn section_data(&self, id: SectionId) -> Option<&[u8]> {
        let s = self.sections[id as usize].as_ref()?;
        match &s.bytes {
            Bytes::InData(r) => self.data.bytes().get(r.clone()),
            Bytes::Owned(b) => Some(b),
        }
    }

    /// The SVMA range of a section.
    pub fn section_svma(&self, id: SectionId) -> Option<Range<u64>> {
        self.sections[id as usize].as_ref().map(|s| s.svma.clone())
    }

    /// A path that opens exactly this file for as long as the module lives
    /// (`/proc/self/fd/N`), for libraries that want a path.
    pub fn fd_path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        self.file
            .as_ref()
            .map(|f| PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
    }

    /// A separate debug-info file for this module, if one is installed:
    /// `/usr/lib/debug/.build-id/xx/rest.debug`, then the `.gnu_debuglink`
    /// name next to the file, in `.debug/`, and under `/usr/lib/debug/DIR/`.
    pub fn debug_file(&self) -> Option<PathBuf> {
        if let Some(id) = &self.build_id
            && id.len() > 2
        {
            let p = PathBuf::from(format!(
                "/usr/lib/debug/.build-id/{}/{}.debug",
                &id[..2],
                &id[2..]
            ));
            if p.is_file() {
                return Some(p);
            }
        }
        let (name, _crc) = self.elf.debuglink.as_ref()?;
        let dir = Path::new(&self.path).parent()?;
        let candidates = [
            dir.join(name),
            dir.join(".debug").join(name),
            Path::new("/usr/lib/debug")
                .join(dir.strip_prefix("/").unwrap_or(dir))
                .join(name),
        ];
        candidates
            .into_iter()
            .find(|p| p.is_file() && p.as_path() != Path::new(&self.path))
    }
}

fn section_info(s: &object::Section<'_, '_>, data: &[u8]) -> Option<SectionInfo> {
    let svma = s.address()..s.address().checked_add(s.size())?;
    let compressed = s.compressed_file_range().ok()?;
    let bytes = if compressed.format == object::CompressionFormat::None {
        let (off, len) = s.file_range()?;
        let start = usize::try_from(off).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        if end > data.len() {
            return None;
        }
        Bytes::InData(start..end)
    } else {
        Bytes::Owned(s.uncompressed_data().ok()?.into_owned().into_boxed_slice())
    };
    Some(SectionInfo { svma, bytes })
}

/// Everything we know about one executable mapping of a process.
#[derive(Clone, Debug)]
pub struct MappingInfo {
    /// First AVMA of the mapping.
    pub start: u64,
    /// One past the last AVMA.
    pub limit: u64,
    /// File offset of `start`.
    pub file_offset: u64,
    /// Path as in `/proc/PID/maps` (`[vdso]` for the vDSO).
    pub path: String,
    /// Lowercase hex GNU build ID.
    pub build_id: Option<String>,
    /// `avma - svma` (wrapping).
    pub bias: u64,
    /// The loaded file.
    pub module: Arc<Module>,
}

/// One executable mapping with its module, as kept in a snapshot.
#[derive(Clone, Debug)]
pub struct ExecMapping {
    /// First AVMA.
    pub start: u64,
    /// One past the last AVMA.
    pub end: u64,
    /// File offset of `start`.
    pub file_offset: u64,
    /// `avma - svma` (wrapping).
    pub bias: u64,
    /// Path as in the maps.
    pub path: Arc<str>,
    /// The module.
    pub module: Arc<Module>,
}

impl ExecMapping {
    fn info(&self) -> MappingInfo {
        MappingInfo {
            start: self.start,
            limit: self.end,
            file_offset: self.file_offset,
            path: self.path.to_string(),
            build_id: self.module.build_id.clone(),
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
    fn covers(&self, addr: u64) -> bool {
        find_sorted(&self.maps, addr, |m| (m.start, m.end)).is_some()
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
pub struct ProcessTable {
    procs: HashMap<u32, ProcState>,
    modules: HashMap<ModuleKey, Arc<Module>>,
    failed: HashMap<ModuleKey, Instant>,
    next_generation: u64,
    /// Bursty tracing: the injected clones of a process, unwound with their
    /// own `.eh_frame` and reported as the original addresses.
    clones: HashMap<u32, Arc<crate::unwind::CloneFrames>>,
}

impl Default for ProcessTable {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessTable {
    /// An empty table.
    pub fn new() -> Self {
        ProcessTable {
            procs: HashMap::new(),
            modules: HashMap::new(),
            failed: HashMap::new(),
            next_generation: 1,
            clones: HashMap::new(),
        }
    }

    /// Registers the clones injected into `pid` (see [`crate::burst`]).
    pub fn set_clone_frames(&mut self, pid: u32, frames: Arc<crate::unwind::CloneFrames>) {
        self.clones.insert(pid, frames);
        self.next_generation += 1;
        if let Some(p) = self.procs.get_mut(&pid) {
            p.generation = self.next_generation;
        }
    }

    /// The clones injected into `pid`, if any.
    pub fn clone_frames(&self, pid: u32) -> Option<&Arc<crate::unwind::CloneFrames>> {
        self.clones.get(&pid)
    }

    /// Make sure we hold a maps snapshot for `pid` that covers `addr` (re-read
    /// `/proc/PID/maps` at most when `addr` is not covered by the snapshot and
    /// the last refresh is older than [`REFRESH_INTERVAL`], so `dlopen` is seen).
    /// Returns false when the process is gone and nothing is known.
    pub fn ensure(&mut self, pid: u32, addr: u64) -> bool {
        if let Some(p) = self.procs.get(&pid)
            && (p.exited
                || p.covers(addr)
                || (p.refreshes >= FREE_REFRESHES && p.last_refresh.elapsed() < REFRESH_INTERVAL))
        {
            return true;
        }
        self.refresh(pid)
    }

    /// Re-read `/proc/PID/maps` now. Returns whether anything is known about `pid`.
    pub fn refresh(&mut self, pid: u32) -> bool {
        let now = Instant::now();
        let mut maps = match read_maps(pid) {
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
                module.elf.load_bias_for(entry.start, 0, true)
            } else {
                module.elf.load_bias_for(entry.start, entry.offset, true)
            };
            let Some(bias) = bias else {
                debug!(
                    pid,
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
                bias,
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

    fn load_module(&mut self, pid: u32, entry: &MapEntry) -> Option<Arc<Module>> {
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
                debug!(pid, path, error = %e, "cannot load module");
                self.failed.insert(key, Instant::now());
                None
            }
        }
    }

    fn load_vdso(&mut self, pid: u32, entry: &MapEntry) -> Option<Arc<Module>> {
        let len = entry.end.checked_sub(entry.start)?;
        if len == 0 || len > MAX_VDSO_SIZE {
            return None;
        }
        let mem = File::open(format!("/proc/{pid}/mem")).ok()?;
        let mut image = vec![0u8; len as usize];
        if let Err(e) = mem.read_exact_at(&mut image, entry.start) {
            debug!(pid, error = %e, "cannot read [vdso]");
            return None;
        }
        let module = match Module::from_image("[vdso]", image) {
            Ok(m) => m,
            Err(e) => {
                debug!(pid, error = %e, "cannot parse [vdso]");
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
        let id_key = module.build_id.clone().map(ModuleKey::BuildId);
        if let Some(existing) = id_key.as_ref().and_then(|k| self.modules.get(k)) {
            let existing = existing.clone();
            self.modules.insert(key, existing.clone());
            return existing;
        }
        debug!(path = module.path(), from = %module.opened_from.display(), build_id = ?module.build_id, "loaded module");
        let module = Arc::new(module);
        if let Some(k) = id_key {
            self.modules.insert(k, module.clone());
        }
        self.modules.insert(key, module.clone());
        module
    }

    /// Forget nothing on exit: snapshots of exited processes stay so late
    /// samples still symbolize; this just stops refreshes.
    pub fn mark_exited(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.exited = true;
        }
    }

    /// Drop snapshots of processes for which `keep` returns false, and the
    /// modules no one else holds any more.
    pub fn prune(&mut self, keep: impl Fn(u32) -> bool) {
        self.procs.retain(|&pid, _| keep(pid));
        // Each module is held by its key(s) here; drop those that only we hold.
        let mut holders: HashMap<*const Module, usize> = HashMap::new();
        for m in self.modules.values() {
            *holders.entry(Arc::as_ptr(m)).or_default() += 1;
        }
        self.modules
            .retain(|_, m| Arc::strong_count(m) > holders[&Arc::as_ptr(m)]);
        self.failed.retain(|_, t| t.elapsed() < FAILED_RETRY);
    }

    /// The executable mapping containing `addr` in `pid`, with its module.
    pub fn mapping_for(&self, pid: u32, addr: u64) -> Option<MappingInfo> {
        self.exec_mapping(pid, addr).map(ExecMapping::info)
    }

    /// Like [`ProcessTable::mapping_for`] without copying.
    pub fn exec_mapping(&self, pid: u32, addr: u64) -> Option<&ExecMapping> {
        self.procs.get(&pid)?.exec_at(addr)
    }

    /// All executable mappings (with modules) of `pid`, sorted by address.
    pub fn exec_mappings(&self, pid: u32) -> &[ExecMapping] {
        self.procs.get(&pid).map_or(&[], |p| &p.exec)
    }

    /// All mappings of the last snapshot of `pid`, sorted by address.
    pub fn maps(&self, pid: u32) -> Option<&[MapEntry]> {
        self.procs.get(&pid).map(|p| p.maps.as_slice())
    }

    /// Changes whenever the executable mappings of `pid` change; `None` if unknown.
    pub fn generation(&self, pid: u32) -> Option<u64> {
        self.procs.get(&pid).map(|p| p.generation)
    }

    /// Whether `pid` is known and marked exited.
    pub fn is_exited(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.exited)
    }

    /// Process ids with a snapshot.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs.keys().copied()
    }

    /// Number of distinct modules loaded.
    pub fn module_count(&self) -> usize {
        let mut v: Vec<_> = self.modules.values().map(Arc::as_ptr).collect();
        v.sort();
        v.dedup();
        v.len()
    }
}

fn open_module(pid: u32, entry: &MapEntry, path: &str) -> Result<Module, ModuleError> {
    let map_files = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        entry.start, entry.end
    ));
    let mut last_err = None;
    let mut candidates = vec![(map_files, true)];
    if path.starts_with('/') {
        candidates.push((PathBuf::from(format!("/proc/{pid}/root{path}")), false));
        candidates.push((PathBuf::from(path), false));
    }
    for (candidate, exact) in candidates {
        let file = match File::open(&candidate) {
            Ok(f) => f,
            Err(e) => {
                last_err = Some(e);
                continue;
            }
        };
        if !exact && let Ok(meta) = file.metadata() {
            // Only reject a file that is certainly another one: same device, other inode.
            let same_dev = libc::major(meta.dev()) == entry.dev_major
                && libc::minor(meta.dev()) == entry.dev_minor;
            if same_dev && meta.ino() != entry.inode {
                warn!(pid, path, candidate = %candidate.display(), "file on disk is not the mapped one");
                last_err = Some(std::io::Error::other("inode mismatch"));
                continue;
            }
        }
        return Module::from_file(path, candidate, file);
    }
    Err(ModuleError::Open {
        path: path.to_owned(),
        source: last_err.unwrap_or_else(|| std::io::Error::other("no candidate path")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procs_parse_maps_lines() {
        let text = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fe:00 247774                     /usr/bin/sleep
7ffd1c1d2000-7ffd1c1f3000 rw-p 00000000 00:00 0                          [stack]
7f0000000000-7f0000001000 r-xp 00001000 08:11 42                         /tmp/a b (deleted)
7f0000002000-7f0000003000 rw-p 00000000 00:00 0
garbage line
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].start, 0x55d0c0a00000);
        assert_eq!(m[0].perms, *b"r--p");
        assert_eq!(m[0].dev_major, 0xfe);
        assert_eq!(m[0].inode, 247774);
        assert_eq!(m[0].path.as_deref(), Some("/usr/bin/sleep"));
        assert_eq!(m[1].path.as_deref(), Some("[stack]"));
        assert!(m[1].is_pseudo());
        assert_eq!(m[2].path.as_deref(), Some("/tmp/a b"));
        assert!(m[2].deleted && m[2].is_exec());
        assert_eq!(
            (m[2].dev_major, m[2].dev_minor, m[2].offset),
            (8, 0x11, 0x1000)
        );
        assert_eq!(m[3].path, None);
        assert!(m[4].is_exec());
        assert!(MapEntry::parse("").is_none());
        assert!(MapEntry::parse("1-0 r-xp 0 0:0 0").is_none());
    }

    #[test]
    fn procs_read_maps_self_finds_exe_and_libc() {
        let maps = read_maps(std::process::id()).unwrap();
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        let exe = exe.to_str().unwrap();
        assert!(
            maps.iter()
                .any(|m| m.is_exec() && m.path.as_deref() == Some(exe)),
            "no executable mapping of {exe}"
        );
        assert!(
            maps.iter()
                .any(|m| m.is_exec() && m.path.as_deref().is_some_and(|p| p.contains("libc.so"))),
            "no libc"
        );
    }

    #[test]
    fn procs_table_self_mapping_bias_and_sharing() {
        let pid = std::process::id();
        let mut t = ProcessTable::new();
        let f = procs_table_self_mapping_bias_and_sharing as fn() as usize as u64;
        assert!(t.ensure(pid, f));
        let m = t.mapping_for(pid, f).expect("mapping for own code");
        assert!(m.start <= f && f < m.limit);
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(m.path, exe.to_str().unwrap());
        // The SVMA of our own function must fall in an executable PT_LOAD segment.
        let svma = f.wrapping_sub(m.bias);
        let seg = m.module.elf().segment_for_svma(svma).expect("segment");
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
        let cpid = child.id();
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
        t.prune(|p| p == pid);
        assert!(t.generation(cpid).is_none());
        assert!(!t.ensure(cpid, 0x1234));
        assert!(t.mapping_for(pid, f).is_some());
    }

    #[test]
    fn procs_unknown_pid() {
        let mut t = ProcessTable::new();
        assert!(!t.ensure(u32::MAX - 1, 0x1000));
        assert!(t.mapping_for(u32::MAX - 1, 0x1000).is_none());
        t.mark_exited(u32::MAX - 1);
    }
}
