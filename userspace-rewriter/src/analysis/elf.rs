//! ELF facts shared by the daemon's unwinder/symbolizer and by the rewriter.
//!
//! You give it the bytes of an ELF file (usually an `mmap` of the whole file,
//! or an image copied out of a process such as the `[vdso]`); it gives back
//! the handful of facts everything else needs:
//!
//! * whether the bytes are a 64-bit little-endian x86-64 ELF ([`is_elf_x86_64`]),
//! * the GNU build ID ([`ElfInfo::build_id`], [`ElfInfo::build_id_hex`]),
//! * the `.gnu_debuglink` name, if any,
//! * the `PT_LOAD` segments ([`LoadSegment`]),
//! * the translation of a file offset into a stated virtual address and the
//!   load bias of a mapping ([`ElfInfo::svma_for_file_offset`], [`ElfInfo::load_bias`]).
//!
//! ## Address spaces
//!
//! Three kinds of numbers describe "where" a byte of code is:
//!
//! * **AVMA** — *actual virtual memory address*: where the byte is in the
//!   address space of a running process (what `rip` and return addresses hold,
//!   what `/proc/PID/maps` lists).
//! * **SVMA** — *stated virtual memory address*: the address the ELF file
//!   states for the byte (`p_vaddr`/`sh_addr`, symbol values, DWARF addresses,
//!   `.eh_frame` ranges). For a non-PIE executable SVMA == AVMA; for PIE
//!   executables and shared libraries the SVMAs start near 0.
//! * **file offset** — where the byte is in the file. `/proc/PID/maps` tells
//!   which file offset each mapping starts at; `PT_LOAD` headers tell which SVMA
//!   each file offset has.
//!
//! The **bias** of a loaded module is `avma - svma`, the same for every byte of
//! one `PT_LOAD` segment (and, with every linker in practice, for the whole
//! module). It is computed from one mapping: `bias = mapping.start -
//! svma_for_file_offset(mapping.offset)`. All arithmetic wraps (a bias can be
//! "negative" for prelinked or oddly linked files).
//!
//! ## Non-goals
//!
//! No symbol tables, DWARF or unwind tables here (the daemon reads those with
//! `addr2line`/`framehop`); no 32-bit ELF; no writing.

use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, Object};

use crate::PAGE_SIZE;

/// `p_flags` bit: segment is executable.
const PF_X: u32 = object::elf::PF_X;

/// Errors from reading ELF facts.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// Reading the file failed.
    #[error("reading ELF file: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes do not start with the ELF magic.
    #[error("not an ELF file")]
    NotElf,
    /// An ELF file of a class we do not read (only ELFCLASS64 is supported).
    #[error("unsupported ELF class {0} (only 64-bit ELF is supported)")]
    UnsupportedClass(u8),
    /// The headers are malformed.
    #[error("malformed ELF: {0}")]
    Malformed(#[from] object::read::Error),
}

/// What kind of ELF object a file is (`e_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfKind {
    /// `ET_EXEC`: a position-dependent executable (bias is 0 once loaded).
    Executable,
    /// `ET_DYN`: a shared library or a PIE executable.
    SharedObject,
    /// `ET_REL`: an object file.
    Relocatable,
    /// `ET_CORE`.
    Core,
    /// Anything else.
    Other(u16),
}

/// One `PT_LOAD` program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    /// `p_offset`: where the segment's bytes start in the file.
    pub file_offset: u64,
    /// `p_filesz`: how many bytes come from the file.
    file_size: u64,
    /// `p_vaddr`: the segment's stated virtual address (SVMA).
    svma: u64,
    /// `p_memsz`: the segment's size in memory (>= `file_size`, the rest is zero-filled).
    mem_size: u64,
    /// `p_flags` ([`PF_R`], [`PF_W`], [`PF_X`]).
    flags: u32,
    /// `p_align`.
    align: u64,
}

impl LoadSegment {
    /// Whether the segment is executable.
    pub fn is_executable(&self) -> bool {
        self.flags & PF_X != 0
    }

    /// The file offset at which the kernel starts mapping this segment
    /// (`p_offset` rounded down to a page).
    pub fn mapped_file_offset(&self) -> u64 {
        self.file_offset & !(PAGE_SIZE - 1)
    }

    /// Whether file offset `offset` is mapped by this segment (including the
    /// part of the first page before `p_offset` that the kernel maps too).
    fn contains_file_offset(&self, offset: u64) -> bool {
        offset >= self.mapped_file_offset()
            && offset < self.file_offset.saturating_add(self.file_size.max(1))
    }

    /// Whether `svma` lies in the segment's memory image.
    fn contains_svma(&self, svma: u64) -> bool {
        svma >= self.svma && svma - self.svma < self.mem_size
    }

    /// The SVMA of file offset `offset`, computed with this segment's
    /// `p_vaddr - p_offset` (wrapping; the caller checks containment).
    fn svma_for_file_offset(&self, offset: u64) -> u64 {
        self.svma
            .wrapping_sub(self.file_offset)
            .wrapping_add(offset)
    }

    /// The file offset of `svma`, if that byte comes from the file.
    pub fn file_offset_for_svma(&self, svma: u64) -> Option<u64> {
        if svma >= self.svma && svma - self.svma < self.file_size {
            self.file_offset.checked_add(svma - self.svma)
        } else {
            None
        }
    }
}

/// The facts about one ELF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_type`.
    pub kind: ElfKind,
    /// `e_machine` (`object::elf::EM_X86_64` is 62).
    pub machine: u16,
    /// `e_entry` (an SVMA).
    pub entry: u64,
    /// The raw GNU build ID (`NT_GNU_BUILD_ID` note), if present.
    pub build_id: Option<Vec<u8>>,
    /// `.gnu_debuglink`: file name of the separate debug file and its CRC32.
    pub debuglink: Option<(String, u32)>,
    /// All `PT_LOAD` segments, in program-header order.
    pub segments: Vec<LoadSegment>,
}

/// Whether `data` starts with the header of a 64-bit little-endian x86-64 ELF file.
pub fn is_elf_x86_64(data: &[u8]) -> bool {
    data.len() >= 20
        && data[..4] == object::elf::ELFMAG
        && data[4] == object::elf::ELFCLASS64
        && data[5] == object::elf::ELFDATA2LSB
        && u16::from_le_bytes([data[18], data[19]]) == object::elf::EM_X86_64
}

/// Whether the file at `path` is a 64-bit little-endian x86-64 ELF file
/// (reads only the first 20 bytes).
#[cfg(test)]
fn is_elf_x86_64_file(path: impl AsRef<std::path::Path>) -> Result<bool, ElfError> {
    use std::io::Read;
    let mut header = [0u8; 20];
    let mut file = std::fs::File::open(path)?;
    let mut filled = 0;
    while filled < header.len() {
        match file.read(&mut header[filled..])? {
            0 => return Ok(false),
            n => filled += n,
        }
    }
    Ok(is_elf_x86_64(&header))
}

/// Lowercase hex of `bytes` (how build IDs are written in paths and pprof).
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

impl ElfInfo {
    /// Parse the ELF header, program headers, build ID and debuglink of
    /// `data`: the bytes, or a file read where needed
    /// ([`object::ReadCache`]).
    pub fn parse<'d, R: object::ReadRef<'d>>(data: R) -> Result<Self, ElfError> {
        let ident = data.read_bytes_at(0, 16).map_err(|()| ElfError::NotElf)?;
        if ident[..4] != object::elf::ELFMAG {
            return Err(ElfError::NotElf);
        }
        if ident[4] != object::elf::ELFCLASS64 {
            return Err(ElfError::UnsupportedClass(ident[4]));
        }
        let file = ElfFile64::<Endianness, R>::parse(data)?;
        let endian = file.endian();
        let header = file.elf_header();
        let kind = match header.e_type(endian) {
            object::elf::ET_EXEC => ElfKind::Executable,
            object::elf::ET_DYN => ElfKind::SharedObject,
            object::elf::ET_REL => ElfKind::Relocatable,
            object::elf::ET_CORE => ElfKind::Core,
            other => ElfKind::Other(other),
        };
        let segments = file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
            .map(|ph| LoadSegment {
                file_offset: ph.p_offset(endian),
                file_size: ph.p_filesz(endian),
                svma: ph.p_vaddr(endian),
                mem_size: ph.p_memsz(endian),
                flags: ph.p_flags(endian),
                align: ph.p_align(endian),
            })
            .collect();
        // A malformed note section should not make the whole file unusable.
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        let debuglink = file
            .gnu_debuglink()
            .ok()
            .flatten()
            .map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc));
        Ok(ElfInfo {
            kind,
            machine: header.e_machine(endian),
            entry: header.e_entry(endian),
            build_id,
            debuglink,
            segments,
        })
    }

    /// Read and parse the file at `path`.
    #[cfg(test)]
    fn from_path(path: impl AsRef<std::path::Path>) -> Result<Self, ElfError> {
        let data = std::fs::read(path)?;
        Self::parse(&data[..])
    }

    /// The build ID as lowercase hex.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id.as_deref().map(to_hex)
    }

    /// Whether this is an x86-64 file.
    #[cfg(test)]
    fn is_x86_64(&self) -> bool {
        self.machine == object::elf::EM_X86_64
    }

    /// The `PT_LOAD` segment that a mapping starting at file offset `offset`
    /// comes from. Prefers a segment whose page-aligned start is exactly
    /// `offset` (how the loader maps segments), then any segment containing
    /// it; among equals, an executable one when `prefer_exec`.
    fn segment_for_file_offset(&self, offset: u64, prefer_exec: bool) -> Option<&LoadSegment> {
        let rank = |s: &LoadSegment| {
            let exact = s.mapped_file_offset() == offset;
            (exact, s.is_executable() == prefer_exec)
        };
        self.segments
            .iter()
            .filter(|s| s.contains_file_offset(offset))
            .max_by_key(|s| rank(s))
    }

    /// The SVMA of file offset `offset` (see the module docs).
    pub fn svma_for_file_offset(&self, offset: u64) -> Option<u64> {
        self.segment_for_file_offset(offset, true)
            .map(|s| s.svma_for_file_offset(offset))
    }

    /// The load bias (`avma - svma`, wrapping) of a mapping that starts at
    /// AVMA `mapping_start` with file offset `mapping_offset`.
    ///
    /// `None` when no `PT_LOAD` segment covers `mapping_offset`.
    pub fn load_bias(&self, mapping_start: u64, mapping_offset: u64) -> Option<u64> {
        self.load_bias_for(mapping_start, mapping_offset, true)
    }

    /// Like [`ElfInfo::load_bias`], choosing among overlapping segments by
    /// whether the mapping is executable.
    pub fn load_bias_for(
        &self,
        mapping_start: u64,
        mapping_offset: u64,
        executable: bool,
    ) -> Option<u64> {
        let seg = self.segment_for_file_offset(mapping_offset, executable)?;
        Some(mapping_start.wrapping_sub(seg.svma_for_file_offset(mapping_offset)))
    }

    /// The segment whose memory image contains `svma`.
    pub fn segment_for_svma(&self, svma: u64) -> Option<&LoadSegment> {
        self.segments.iter().find(|s| s.contains_svma(svma))
    }

    /// The lowest SVMA of any `PT_LOAD` segment (the "base" of the image).
    pub fn base_svma(&self) -> Option<u64> {
        self.segments.iter().map(|s| s.svma).min()
    }
}

/// Every address the file stores as data: the 8-byte words of its data
/// sections and the addends of its absolute dynamic relocations
/// (`R_X86_64_RELATIVE`, ...), unfiltered (most are not addresses).
pub(crate) fn stored_words(file: &object::File) -> Vec<u64> {
    use object::{Object as _, ObjectSection as _, SectionKind};
    let mut out = Vec::new();
    for section in file.sections() {
        if matches!(
            section.kind(),
            SectionKind::Data | SectionKind::ReadOnlyData | SectionKind::ReadOnlyDataWithRel
        ) && let Ok(data) = section.data()
        {
            out.extend(
                data.chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())),
            );
        }
    }
    if let Some(relocs) = file.dynamic_relocations() {
        for (_, r) in relocs {
            if let object::RelocationTarget::Absolute = r.target() {
                out.push(r.addend() as u64);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ls() -> Vec<u8> {
        std::fs::read("/bin/ls").expect("/bin/ls")
    }

    #[test]
    fn detects_x86_64_elf() {
        assert!(is_elf_x86_64(&ls()));
        assert!(is_elf_x86_64_file("/bin/ls").unwrap());
        assert!(!is_elf_x86_64(b"#!/bin/sh\necho hi\n"));
        assert!(!is_elf_x86_64(b"\x7fELF"));
        let tmp = std::env::temp_dir().join(format!("elf-test-{}.txt", std::process::id()));
        std::fs::write(&tmp, b"hi").unwrap();
        assert!(!is_elf_x86_64_file(&tmp).unwrap());
        let _ = std::fs::remove_file(&tmp);
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(ElfInfo::parse(&b""[..]), Err(ElfError::NotElf)));
        assert!(matches!(
            ElfInfo::parse(&b"hello world, not elf"[..]),
            Err(ElfError::NotElf)
        ));
        let mut data = ls();
        data.truncate(70);
        assert!(ElfInfo::parse(&data[..]).is_err());
        let mut data32 = ls();
        data32[4] = object::elf::ELFCLASS32;
        assert!(matches!(
            ElfInfo::parse(&data32[..]),
            Err(ElfError::UnsupportedClass(1))
        ));
        // Random bytes after a valid magic must not panic.
        let mut junk = b"\x7fELF\x02\x01\x01".to_vec();
        junk.extend((0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
        let _ = ElfInfo::parse(&junk[..]);
    }

    #[test]
    fn ls_facts() {
        let data = ls();
        let info = ElfInfo::parse(&data[..]).unwrap();
        assert!(info.is_x86_64());
        assert!(matches!(
            info.kind,
            ElfKind::SharedObject | ElfKind::Executable
        ));
        let id = info
            .build_id_hex()
            .expect("Debian's /bin/ls has a build id");
        assert_eq!(id.len(), 40, "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert!(!info.segments.is_empty());
        let text = info
            .segments
            .iter()
            .find(|s| s.is_executable())
            .expect("an exec segment");
        assert!(
            text.contains_svma(info.entry),
            "entry {:#x} in {text:?}",
            info.entry
        );
        // The exec segment's first mapped page maps to its own SVMA arithmetic.
        let off = text.mapped_file_offset();
        assert_eq!(
            info.svma_for_file_offset(off),
            Some(text.svma.wrapping_sub(text.file_offset).wrapping_add(off))
        );
    }

    /// Compares the bias we compute for each mapping of the test process
    /// itself with the one implied by the dynamic loader (`dl_iterate_phdr`
    /// is not available without libc, so use the maps of a running `sleep`
    /// whose entry point we can check through /proc/PID/auxv).
    #[test]
    fn bias_of_running_process_matches_auxv_entry() {
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Wait until exec finished (maps show /usr/bin/sleep).
        let exe = std::fs::canonicalize("/bin/sleep").unwrap();
        let exe = exe.to_string_lossy().into_owned();
        let parse_entry = |auxv: &[u8]| {
            auxv.chunks_exact(16)
                .map(|c| {
                    (
                        u64::from_le_bytes(c[..8].try_into().unwrap()),
                        u64::from_le_bytes(c[8..].try_into().unwrap()),
                    )
                })
                .find(|&(k, _)| k == 9 /* AT_ENTRY */)
                .map(|(_, v)| v)
        };
        let mut maps = String::new();
        let mut at_entry = None;
        for _ in 0..400 {
            maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            let auxv = std::fs::read(format!("/proc/{pid}/auxv")).unwrap_or_default();
            at_entry = parse_entry(&auxv);
            if maps.contains(&exe) && at_entry.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        let at_entry = at_entry.expect("AT_ENTRY in /proc/PID/auxv");
        let info = ElfInfo::from_path(&exe).unwrap();
        let mut checked = 0;
        for line in maps.lines().filter(|l| l.ends_with(exe.as_str())) {
            let mut f = line.split_whitespace();
            let range = f.next().unwrap();
            let perms = f.next().unwrap();
            let offset = u64::from_str_radix(f.next().unwrap(), 16).unwrap();
            let start = u64::from_str_radix(range.split('-').next().unwrap(), 16).unwrap();
            let bias = info
                .load_bias_for(start, offset, perms.contains('x'))
                .unwrap_or_else(|| panic!("no segment for {line}"));
            assert_eq!(bias, at_entry.wrapping_sub(info.entry), "{line}");
            checked += 1;
        }
        assert!(checked >= 2, "{maps}");
    }

    #[test]
    fn gcc_fixture_non_pie_has_zero_bias() {
        let dir = std::env::temp_dir().join(format!(
            "elf-fixture-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("t.c");
        std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
        let out = dir.join("t");
        let status = std::process::Command::new("gcc")
            .args(["-O1", "-no-pie", "-fno-pie", "-Wl,--build-id=sha1", "-o"])
            .arg(&out)
            .arg(&src)
            .status();
        let Ok(status) = status else {
            eprintln!("gcc not available, skipping");
            return;
        };
        assert!(status.success());
        let info = ElfInfo::from_path(&out).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(info.kind, ElfKind::Executable);
        assert_eq!(info.build_id.as_ref().map(Vec::len), Some(20));
        let text = info.segments.iter().find(|s| s.is_executable()).unwrap();
        // A non-PIE executable is mapped at its stated addresses: bias 0.
        let avma = text.svma - (text.file_offset - text.mapped_file_offset());
        assert_eq!(info.load_bias(avma, text.mapped_file_offset()), Some(0));
        assert_eq!(
            info.load_bias(avma + 0x1000, text.mapped_file_offset()),
            Some(0x1000)
        );
        assert_eq!(text.file_offset_for_svma(text.svma), Some(text.file_offset));
        assert!(info.load_bias(0x1000, 1 << 40).is_none());
    }
}
