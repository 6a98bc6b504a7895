//! ELF modules mapped into sampled processes: the file (or memory image)
//! behind an executable mapping, opened through `/proc/PID/map_files` (works
//! for deleted files and other mount namespaces), then `/proc/PID/root/PATH`,
//! then `PATH`, with the locations of the sections the unwinder and the
//! symbolizer need. Shared between processes by [`super::table::ProcessTable`].
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use burstyd_common::addr::Pid;
use memmap2::Mmap;
use object::{Object, ObjectSection};
use tracing::{debug, warn};
use userspace_rewriter::analysis::elf::{ElfInfo, is_elf_x86_64};
use userspace_rewriter::inject::MapEntry;

/// Errors from loading a module.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ModuleError {
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
pub(crate) enum SectionId {
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
pub(crate) struct Module {
    path: String,
    opened_from: PathBuf,
    /// Kept open so that `/proc/self/fd/N` names this exact file later.
    file: Option<File>,
    data: ModuleData,
    elf: ElfInfo,
    build_id: Option<String>,
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
    pub(crate) fn from_file(
        path: &str,
        opened_from: PathBuf,
        file: File,
    ) -> Result<Module, ModuleError> {
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
        Self::from_data(
            path,
            opened_from,
            Some(file),
            ModuleData::Mapped(mmap),
            meta.ino(),
        )
    }

    /// Parse an in-memory image (e.g. `[vdso]` copied from a process).
    pub(crate) fn from_image(name: &str, image: Vec<u8>) -> Result<Module, ModuleError> {
        Self::from_data(
            name,
            PathBuf::from(name),
            None,
            ModuleData::Owned(image.into_boxed_slice()),
            0,
        )
    }

    /// A module with no contents, standing for code we only know by name
    /// (the kernel, kernel modules). It has no sections and no segments.
    pub(crate) fn placeholder(name: &str, build_id: Option<String>) -> Module {
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
            inode,
            sections,
            has_debug_info,
        })
    }

    /// The path under which the module was first seen (as in `/proc/PID/maps`).
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// Where the file was actually opened from (e.g. `/proc/123/map_files/...`).
    pub(crate) fn opened_from(&self) -> &Path {
        &self.opened_from
    }

    /// The whole file (or image).
    pub(crate) fn data(&self) -> &[u8] {
        self.data.bytes()
    }

    /// ELF facts: segments, build ID, debuglink.
    pub(crate) fn elf(&self) -> &ElfInfo {
        &self.elf
    }

    /// Lowercase hex GNU build ID.
    pub(crate) fn build_id(&self) -> Option<&str> {
        self.build_id.as_deref()
    }

    /// Inode of the file, 0 for images.
    pub(crate) fn inode(&self) -> u64 {
        self.inode
    }

    /// Whether the module itself carries `.debug_info`.
    pub(crate) fn has_debug_info(&self) -> bool {
        self.has_debug_info
    }

    /// Whether the module has `.eh_frame` or `.debug_frame`.
    pub(crate) fn has_unwind_info(&self) -> bool {
        self.section_data(SectionId::EhFrame)
            .is_some_and(|d| !d.is_empty())
            || self
                .section_data(SectionId::DebugFrame)
                .is_some_and(|d| !d.is_empty())
    }

    /// The (uncompressed) contents of a section.
    pub(crate) fn section_data(&self, id: SectionId) -> Option<&[u8]> {
        let s = self.sections[id as usize].as_ref()?;
        match &s.bytes {
            Bytes::InData(r) => self.data.bytes().get(r.clone()),
            Bytes::Owned(b) => Some(b),
        }
    }

    /// The SVMA range of a section.
    pub(crate) fn section_svma(&self, id: SectionId) -> Option<Range<u64>> {
        self.sections[id as usize].as_ref().map(|s| s.svma.clone())
    }

    /// A path that opens exactly this file for as long as the module lives
    /// (`/proc/self/fd/N`), for libraries that want a path.
    pub(crate) fn fd_path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        self.file
            .as_ref()
            .map(|f| PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
    }

    /// A separate debug-info file for this module, if one is installed:
    /// `/usr/lib/debug/.build-id/xx/rest.debug`, then the `.gnu_debuglink`
    /// name next to the file, in `.debug/`, and under `/usr/lib/debug/DIR/`.
    pub(crate) fn debug_file(&self) -> Option<PathBuf> {
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

pub(crate) fn open_module(pid: Pid, entry: &MapEntry, path: &str) -> Result<Module, ModuleError> {
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
                warn!(%pid, path, candidate = %candidate.display(), "file on disk is not the mapped one");
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
