//! [`CfgContext`]: what [`build_cfg`](super::build_cfg) needs to know beyond
//! one function — the bytes of the file's sections (jump tables live in
//! `.rodata`), every function's range and name (is a branch target another
//! function's start, a `.cold` part of the same function, or neither?), the
//! noreturn set, and the parsed `.eh_frame` (is the frame empty at an
//! indirect jump, i.e. is it a tail call?). Shared by all functions of a
//! file, so Hirzel & Chilimbi's per-procedure analysis sees the whole
//! program's layout.

use std::collections::{BTreeMap, BTreeSet};

use iced_x86::Mnemonic;
use object::{Object, ObjectSection};

use super::known_noreturn::is_known_noreturn;
use crate::analysis::disasm::Insn;
use crate::analysis::functions::{Function, FunctionKind, FunctionSources};

/// A loaded section's bytes.
struct SectionBytes<'data> {
    addr: u64,
    bytes: &'data [u8],
}

type Fde<'data> =
    gimli::FrameDescriptionEntry<gimli::EndianSlice<'data, gimli::LittleEndian>, usize>;

/// The parsed `.eh_frame`, to ask the CFA rule at an address.
pub(crate) struct EhFrameInfo<'data> {
    pub(crate) section: gimli::EhFrame<gimli::EndianSlice<'data, gimli::LittleEndian>>,
    pub(crate) bases: gimli::BaseAddresses,
    /// FDEs sorted by start.
    pub(crate) fdes: Vec<Fde<'data>>,
}

/// What `build_cfg` needs to know beyond one function.
pub struct CfgContext<'data> {
    sections: Vec<SectionBytes<'data>>,
    eh_frame: Option<EhFrameInfo<'data>>,
    /// `(start, end, family, named)`, sorted by start; `family` is the index
    /// of the function or, for a cold part with a parent, of its parent;
    /// `named` whether a symbol names it.
    ranges: Vec<(u64, u64, usize, bool)>,
    names: BTreeMap<u64, String>,
    pub(super) noreturn: BTreeSet<u64>,
    /// Addresses in executable sections that the file stores as data:
    /// 8-byte words of data sections and the addends of absolute dynamic
    /// relocations (`R_X86_64_RELATIVE`, ...). Where an indirect jump no
    /// pattern explains may go: a computed `goto *p` reaches only labels
    /// whose address was taken, and a taken label address is one of these
    /// (or a RIP-relative `lea` in the function itself).
    pub(super) code_pointers: BTreeSet<u64>,
    /// `[start, end)` of each executable section.
    exec: Vec<(u64, u64)>,
}

impl<'data> CfgContext<'data> {
    /// Collect section bytes and function starts of `file`; seed the noreturn
    /// set with `is_known_noreturn` names (symbols, aliases and PLT stubs).
    pub fn new(file: &object::File<'data>, functions: &[Function]) -> Self {
        let mut sections: Vec<SectionBytes<'data>> = file
            .sections()
            .filter(|s| s.address() != 0 && s.size() > 0)
            .filter_map(|s| {
                let bytes = s.data().ok()?;
                (!bytes.is_empty()).then_some(SectionBytes {
                    addr: s.address(),
                    bytes,
                })
            })
            .collect();
        sections.sort_by_key(|s| s.addr);
        let exec = file
            .sections()
            .filter(|s| {
                matches!(s.flags(), object::SectionFlags::Elf { sh_flags }
                    if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
            })
            .map(|s| (s.address(), s.address().saturating_add(s.size())))
            .collect();
        let mut ranges: Vec<(u64, u64, usize, bool)> = functions
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let family = match f.kind {
                    FunctionKind::ColdPart { parent: Some(p) } => p,
                    _ => i,
                };
                let named = f.sources.contains(FunctionSources::SYMTAB)
                    || f.sources.contains(FunctionSources::DYNSYM)
                    || f.kind == FunctionKind::Plt;
                (f.start, f.end(), family, named)
            })
            .collect();
        ranges.sort_by_key(|r| r.0);
        let names = functions
            .iter()
            .map(|f| (f.start, f.name.clone()))
            .collect();
        let noreturn = functions
            .iter()
            .filter(|f| {
                is_known_noreturn(f.base_name())
                    || f.aliases
                        .iter()
                        .any(|a| is_known_noreturn(crate::analysis::functions::base_name(a)))
            })
            .map(|f| f.start)
            .collect();
        let code_pointers = code_pointers(file);
        CfgContext {
            sections,
            eh_frame: parse_eh_frame(file),
            ranges,
            names,
            noreturn,
            code_pointers,
            exec,
        }
    }

    /// Whether `addr` is in an executable section.
    pub(super) fn is_code(&self, addr: u64) -> bool {
        self.code_end(addr).is_some()
    }

    /// The end of the executable section holding `addr`.
    pub(super) fn code_end(&self, addr: u64) -> Option<u64> {
        self.exec
            .iter()
            .find(|&&(s, e)| s <= addr && addr < e)
            .map(|&(_, e)| e)
    }

    /// The stored code pointers in `[start, end)`.
    pub(super) fn code_pointers_in(&self, start: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        self.code_pointers.range(start..end).copied()
    }

    /// Whether, per `.eh_frame`, the canonical frame address at `addr` is
    /// `rsp + 8`: the stack holds nothing but the return address, as at a
    /// tail call. `None` without CFI for `addr`.
    pub(crate) fn frame_is_empty_at(&self, addr: u64) -> Option<bool> {
        let eh = self.eh_frame.as_ref()?;
        let i = eh.fdes.partition_point(|f| f.initial_address() <= addr);
        let fde = eh.fdes.get(i.checked_sub(1)?)?;
        if addr >= fde.initial_address().wrapping_add(fde.len()) {
            return None;
        }
        let mut uctx = gimli::UnwindContext::new();
        let row = fde
            .unwind_info_for_address(&eh.section, &eh.bases, &mut uctx, addr)
            .ok()?;
        Some(matches!(
            row.cfa(),
            gimli::CfaRule::RegisterAndOffset { register, offset: 8 } if *register == gimli::X86_64::RSP
        ))
    }

    /// `len` bytes of the file's image at SVMA `addr`, if one section holds
    /// them all.
    pub(crate) fn bytes(&self, addr: u64, len: u64) -> Option<&'data [u8]> {
        let i = self.sections.partition_point(|s| s.addr <= addr);
        let s = self.sections.get(i.checked_sub(1)?)?;
        let off = usize::try_from(addr - s.addr).ok()?;
        let end = off.checked_add(usize::try_from(len).ok()?)?;
        s.bytes.get(off..end)
    }

    /// The bytes of the file's image from SVMA `addr` to the end of its
    /// section.
    pub(super) fn bytes_from(&self, addr: u64) -> Option<&'data [u8]> {
        let i = self.sections.partition_point(|s| s.addr <= addr);
        let s = self.sections.get(i.checked_sub(1)?)?;
        s.bytes.get(usize::try_from(addr - s.addr).ok()?..)
    }

    /// `(start, LSDA address)` of every FDE with a direct LSDA pointer.
    pub(super) fn fde_lsdas(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.eh_frame.iter().flat_map(|eh| {
            eh.fdes.iter().filter_map(|f| match f.lsda()? {
                gimli::Pointer::Direct(a) => Some((f.initial_address(), a)),
                gimli::Pointer::Indirect(_) => None,
            })
        })
    }

    /// The linear sweep of `f`'s bytes (empty when the file has no bytes for it).
    pub fn decode(&self, f: &Function) -> Vec<Insn> {
        self.bytes(f.start, f.size)
            .map(|b| crate::analysis::disasm::decode(b, f.start))
            .unwrap_or_default()
    }

    /// The function range containing `addr`: `(start, end, family, named)`.
    pub(super) fn containing(&self, addr: u64) -> Option<(u64, u64, usize, bool)> {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        // Ranges may nest or overlap (hand-written assembly); look back a little.
        self.ranges[..i]
            .iter()
            .rev()
            .take(8)
            .find(|r| addr < r.1)
            .copied()
    }

    /// Whether `addr` starts a function range no symbol names (an FDE
    /// range of a stripped binary).
    pub(super) fn is_unnamed_start(&self, addr: u64) -> bool {
        self.containing(addr)
            .is_some_and(|(start, _, _, named)| start == addr && !named)
    }

    pub(super) fn family_of(&self, start: u64) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.0 < start);
        self.ranges.get(i).filter(|r| r.0 == start).map(|r| r.2)
    }

    /// The first function start at or after `addr` reached by skipping only
    /// `nop` padding: at most [`MAX_PADDING`] bytes, what aligning the next
    /// function to 64 bytes leaves (glibc's `ENTRY_P2ALIGN (..., 6)`:
    /// `__memmove_chk_avx_unaligned_erms` falls through 55 bytes of NOPs
    /// into `__memmove_avx_unaligned_erms`).
    pub(super) fn start_after_padding(&self, mut addr: u64) -> Option<u64> {
        let limit = addr + MAX_PADDING;
        while addr <= limit {
            if self.is_function_start(addr) {
                return Some(addr);
            }
            let bytes = self.bytes(addr, 16).or_else(|| self.bytes(addr, 1))?;
            let insn = crate::analysis::disasm::decode_one(bytes, addr)?;
            if insn.instr.mnemonic() != Mnemonic::Nop {
                return None;
            }
            addr = insn.end();
        }
        None
    }

    pub(super) fn is_function_start(&self, addr: u64) -> bool {
        self.names.contains_key(&addr)
    }
}

/// Bytes of alignment padding a function may fall through into the next
/// one ([`CfgContext::start_after_padding`]): 64-byte alignment.
const MAX_PADDING: u64 = 63;

pub(crate) fn parse_eh_frame<'data>(file: &object::File<'data>) -> Option<EhFrameInfo<'data>> {
    use gimli::UnwindSection as _;
    let sec = file.section_by_name(".eh_frame")?;
    let bytes = sec.data().ok()?;
    let section = gimli::EhFrame::new(bytes, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(sec.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let mut fdes = Vec::new();
    let mut entries = section.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o))
        {
            fdes.push(fde);
        }
    }
    fdes.sort_by_key(|f| f.initial_address());
    Some(EhFrameInfo {
        section,
        bases,
        fdes,
    })
}

/// See [`CfgContext::code_pointers`].
fn code_pointers(file: &object::File) -> BTreeSet<u64> {
    use object::{Object as _, ObjectSection as _, SectionKind};
    let exec: Vec<(u64, u64)> = file
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .map(|s| (s.address(), s.address().saturating_add(s.size())))
        .collect();
    crate::analysis::elf::stored_words(file)
        .into_iter()
        .filter(|&a| exec.iter().any(|&(lo, hi)| (lo..hi).contains(&a)))
        .collect()
}
