//! Function discovery.
//!
//! You give it a parsed ELF file (PIE or non-PIE executable, or shared
//! library; stripped or not) and its bytes ([`discover`]); it returns every
//! function it can find as a [`Function`]: name, SVMA range, which tables
//! vouched for it ([`FunctionSources`]) and its [`FunctionKind`] (normal code,
//! a PLT stub, or the `.cold` part GCC splits off a function).
//!
//! Sources, merged by start address:
//! * `.symtab` and `.dynsym` `STT_FUNC`/`STT_GNU_IFUNC` symbols defined in an
//!   executable section; several names at one address are aliases, the
//!   preferred one (global before weak before local, then the fewest leading
//!   underscores, then the shortest, then alphabetical) becomes
//!   [`Function::name`], the others go to `Function::aliases`;
//! * `.eh_frame` FDEs (parsed directly with gimli, so `.eh_frame_hdr` is not
//!   needed): in a stripped binary they are the only source; a function found
//!   only there is called `sub_<hex start>`; an FDE starting strictly inside a
//!   symbol's range (hand-written assembly with several FDEs) adds nothing;
//! * `.plt`, `.plt.sec` and `.plt.got` stubs, one [`FunctionKind::Plt`]
//!   function per stub, named `name@plt` from the `.rela.plt`/`.rela.dyn`
//!   relocation of the GOT slot the stub jumps through (or, for lazy `.plt`
//!   entries, of the relocation index it pushes).
//!
//! The bursty-tracing rewriter (Hirzel & Chilimbi, section 3) works on the
//! executable alone, after link time; this is where it learns what the
//! procedures are.
//!
//! ## Non-goals
//!
//! No DWARF `.debug_info` (not present in release binaries), no heuristic
//! function-start scanning of unsymbolised, FDE-less code, no demangling.

use std::collections::BTreeMap;

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use object::{
    Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SectionFlags, SectionKind, SymbolKind,
};
use serde::Serialize;

/// Errors of [`discover`].
#[derive(Debug, thiserror::Error)]
pub enum FunctionsError {
    /// Not a 64-bit x86-64 ELF file.
    #[error("not a 64-bit x86-64 ELF file")]
    NotX86_64,
}

/// Which tables vouched for a function (a small bitset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FunctionSources(u8);

impl FunctionSources {
    /// A `.symtab` `STT_FUNC` symbol.
    pub const SYMTAB: FunctionSources = FunctionSources(1);
    /// A `.dynsym` `STT_FUNC` symbol.
    pub const DYNSYM: FunctionSources = FunctionSources(2);
    /// An `.eh_frame` FDE starting at the function's address.
    pub const EH_FRAME: FunctionSources = FunctionSources(4);
    /// A stub of a PLT section.
    pub const PLT: FunctionSources = FunctionSources(8);
    /// `DT_INIT`/`DT_FINI` of the dynamic section (`_init`, `_fini`) or an
    /// entry of `.init_array`/`.fini_array`/`.preinit_array`: often no
    /// FDE, no symbol in a stripped file, and called by the loader and
    /// `__libc_start_main` before `main`.
    pub const DYNAMIC: FunctionSources = FunctionSources(16);
    /// The target of a direct call or tail jump in another function that
    /// lies in no function any table names (`register_tm_clones`,
    /// reached from `frame_dummy`; see `cfg::analyse`).
    pub const CALL_TARGET: FunctionSources = FunctionSources(32);

    /// Each source and its name (in plans and `analyze`).
    pub const NAMES: [(FunctionSources, &'static str); 6] = [
        (Self::SYMTAB, "symtab"),
        (Self::DYNSYM, "dynsym"),
        (Self::EH_FRAME, "eh_frame"),
        (Self::PLT, "plt"),
        (Self::DYNAMIC, "dynamic"),
        (Self::CALL_TARGET, "call_target"),
    ];

    /// Whether every source of `other` is in `self`.
    pub const fn contains(self, other: FunctionSources) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

impl std::ops::BitOr for FunctionSources {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        FunctionSources(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for FunctionSources {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

/// Serialised as the list of source names, e.g. `["symtab","eh_frame"]`.
impl Serialize for FunctionSources {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let names: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(bit, _)| self.contains(*bit))
            .map(|(_, n)| *n)
            .collect();
        let mut seq = s.serialize_seq(Some(names.len()))?;
        for n in names {
            seq.serialize_element(n)?;
        }
        seq.end()
    }
}

/// What kind of code a [`Function`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum FunctionKind {
    /// Ordinary code.
    Normal,
    /// A PLT stub (`.plt`, `.plt.sec`, `.plt.got`).
    Plt,
    /// The cold part GCC's hot/cold splitting moved to `.text.unlikely`
    /// (`foo.cold`); `parent` is the index of `foo` in the list [`discover`]
    /// returns, when found.
    ColdPart {
        /// Index of the parent function.
        parent: Option<usize>,
    },
}

/// One function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Function {
    /// Preferred name (see the module docs), `name@plt` for PLT stubs,
    /// `sub_<hex>` when only an FDE names it.
    pub name: String,
    /// Other symbol names at the same address, sorted.
    pub(crate) aliases: Vec<String>,
    /// SVMA of the first byte.
    pub start: u64,
    /// Size in bytes (from the symbol, else the FDE, else up to the next
    /// function or the end of the section).
    pub size: u64,
    /// Which tables vouched for it.
    pub sources: FunctionSources,
    /// Normal, PLT stub or cold part.
    pub kind: FunctionKind,
    /// Whether its FDE has an LSDA (C++ exception landing pads that are not
    /// reachable through ordinary control flow).
    pub has_lsda: bool,
}

impl Function {
    /// SVMA just past the last byte.
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.size)
    }

    /// Whether `addr` lies in `[start, end)`.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr < self.end()
    }

    /// The name without a `@plt` suffix or an ELF symbol version
    /// (`memcpy@GLIBC_2.2.5`, `memcpy@@GLIBC_2.14`).
    pub(crate) fn base_name(&self) -> &str {
        base_name(&self.name)
    }
}

/// `name` without `@plt` and without a symbol version suffix.
pub(crate) fn base_name(name: &str) -> &str {
    match name.find('@') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    }
}

/// An executable section's address range.
struct ExecSection {
    name: String,
    start: u64,
    end: u64,
}

/// One candidate at one address before merging.
#[derive(Default)]
struct Candidate {
    names: Vec<(u8 /* rank: lower is better */, String)>,
    sym_size: u64,
    dyn_size: u64,
    fde_size: u64,
    sources: FunctionSources,
    plt: bool,
    plt_size: u64,
    has_lsda: bool,
}

/// Find the functions of `file` (whose bytes are `data`).
///
/// Returns them sorted by start address, one per address; see the module
/// docs for sources and naming. Malformed `.eh_frame` data ends FDE discovery
/// at the first bad entry (what came before is kept) rather than failing.
/// `DT_INIT` and `DT_FINI` of the `.dynamic` section (named `_init`,
/// `_fini`), and the entries of `.preinit_array`, `.init_array` and
/// `.fini_array` (unnamed: `frame_dummy` and the like, which a stripped
/// file names nowhere). An array entry a linker left 0 for its dynamic
/// relocation to fill is no address in code, and is dropped by the caller.
fn init_fini(file: &object::File) -> Vec<(u64, Option<&'static str>)> {
    let words = |name: &str| -> Vec<u64> {
        file.section_by_name(name)
            .and_then(|s| s.data().ok())
            .map(|d| {
                d.chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                    .collect()
            })
            .unwrap_or_default()
    };
    let dynamic = words(".dynamic");
    let mut out: Vec<(u64, Option<&'static str>)> = dynamic
        .chunks_exact(2)
        .filter_map(|e| match u32::try_from(e[0]) {
            Ok(object::elf::DT_INIT) => Some((e[1], Some("_init"))),
            Ok(object::elf::DT_FINI) => Some((e[1], Some("_fini"))),
            _ => None,
        })
        .collect();
    for array in [".preinit_array", ".init_array", ".fini_array"] {
        out.extend(words(array).into_iter().map(|a| (a, None)));
    }
    out
}

pub fn discover(file: &object::File, data: &[u8]) -> Result<Vec<Function>, FunctionsError> {
    if !crate::analysis::elf::is_elf_x86_64(data) {
        return Err(FunctionsError::NotX86_64);
    }
    let exec: Vec<ExecSection> = file
        .sections()
        .filter(|s| match s.flags() {
            SectionFlags::Elf { sh_flags } => {
                sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0
                    && sh_flags & u64::from(object::elf::SHF_ALLOC) != 0
            }
            _ => s.kind() == SectionKind::Text,
        })
        .filter(|s| s.size() > 0)
        .map(|s| ExecSection {
            name: s.name().unwrap_or("").to_string(),
            start: s.address(),
            // A corrupt section header may claim an end past 2^64.
            end: s.address().saturating_add(s.size()),
        })
        .collect();
    let in_exec = |addr: u64| exec.iter().find(|s| addr >= s.start && addr < s.end);

    let mut cands: BTreeMap<u64, Candidate> = BTreeMap::new();

    // 1. Symbols.
    let mut add_symbols = |syms: &mut dyn Iterator<Item = object::Symbol<'_, '_>>, dynsym: bool| {
        for sym in syms {
            if sym.kind() != SymbolKind::Text || !sym.is_definition() {
                continue;
            }
            let addr = sym.address();
            let Some(sec) = in_exec(addr) else { continue };
            if sec.name.starts_with(".plt") {
                continue; // PLT stubs are found below
            }
            let Ok(name) = sym.name() else { continue };
            if name.is_empty() {
                continue;
            }
            let rank = if sym.is_weak() {
                1
            } else if sym.is_global() {
                0
            } else {
                2
            };
            let c = cands.entry(addr).or_default();
            if !c.names.iter().any(|(_, n)| n == name) {
                c.names.push((rank, name.to_string()));
            } else if let Some(e) = c.names.iter_mut().find(|(_, n)| n == name) {
                e.0 = e.0.min(rank);
            }
            if dynsym {
                c.sources |= FunctionSources::DYNSYM;
                c.dyn_size = c.dyn_size.max(sym.size());
            } else {
                c.sources |= FunctionSources::SYMTAB;
                c.sym_size = c.sym_size.max(sym.size());
            }
        }
    };
    add_symbols(&mut file.symbols(), false);
    add_symbols(&mut file.dynamic_symbols(), true);

    // 2. FDEs.
    for (start, len, lsda) in eh_frame_ranges(file) {
        if len == 0 || in_exec(start).is_none() {
            continue;
        }
        // An FDE inside a symbol's range adds nothing.
        if !cands.contains_key(&start) {
            let inside = cands.range(..start).next_back().is_some_and(|(&s, c)| {
                let size = c.sym_size.max(c.dyn_size);
                c.sources.0 & (FunctionSources::SYMTAB.0 | FunctionSources::DYNSYM.0) != 0
                    && start < s.saturating_add(size)
            });
            if inside {
                continue;
            }
        }
        let c = cands.entry(start).or_default();
        c.sources |= FunctionSources::EH_FRAME;
        c.fde_size = c.fde_size.max(len);
        c.has_lsda |= lsda;
    }

    // 3. PLT stubs.
    for (start, size, name) in plt_stubs(file) {
        let c = cands.entry(start).or_default();
        c.sources |= FunctionSources::PLT;
        c.plt = true;
        c.plt_size = size;
        if let Some(name) = name {
            c.names.insert(0, (0, name));
        }
    }

    // 4. DT_INIT, DT_FINI and the init and fini arrays.
    for (start, name) in init_fini(file) {
        if in_exec(start).is_none() {
            continue;
        }
        let c = cands.entry(start).or_default();
        c.sources |= FunctionSources::DYNAMIC;
        if let Some(name) = name
            && c.names.is_empty()
        {
            c.names.push((0, name.to_string()));
        }
    }

    // Merge.
    let starts: Vec<u64> = cands.keys().copied().collect();
    let mut out: Vec<Function> = Vec::with_capacity(cands.len());
    for (i, (start, mut c)) in cands.into_iter().enumerate() {
        // Symbols and FDEs were filtered by `in_exec`; PLT stubs come from
        // sections named like PLTs, which a corrupt file may not mark
        // executable: such stubs are not functions.
        let Some(sec) = in_exec(start) else {
            continue;
        };
        let size = if c.plt {
            c.plt_size
        } else if c.sym_size > 0 {
            c.sym_size
        } else if c.fde_size > 0 {
            c.fde_size
        } else if c.dyn_size > 0 {
            c.dyn_size
        } else {
            // Up to the next candidate or the end of the section.
            let next = starts.get(i + 1).copied().unwrap_or(u64::MAX);
            next.min(sec.end).saturating_sub(start)
        };
        if size == 0 {
            continue;
        }
        let (name, aliases) = if c.plt {
            let name = c
                .names
                .first()
                .map(|(_, n)| n.clone())
                .unwrap_or_else(|| format!("{}@{start:#x}", sec.name));
            (name, Vec::new())
        } else if c.names.is_empty() {
            (format!("sub_{start:x}"), Vec::new())
        } else {
            c.names.sort_by(|a, b| {
                let key = |(rank, n): &(u8, String)| {
                    (
                        *rank,
                        n.contains('@'),
                        n.bytes().take_while(|&b| b == b'_').count(),
                        n.len(),
                        n.clone(),
                    )
                };
                key(a).cmp(&key(b))
            });
            let mut names = c.names.into_iter().map(|(_, n)| n);
            let name = names.next().expect("non-empty");
            let mut aliases: Vec<String> = names.collect();
            aliases.sort();
            (name, aliases)
        };
        let kind = if c.plt {
            FunctionKind::Plt
        } else if name.contains(".cold") {
            FunctionKind::ColdPart { parent: None }
        } else {
            FunctionKind::Normal
        };
        out.push(Function {
            name,
            aliases,
            start,
            size,
            sources: c.sources,
            kind,
            has_lsda: c.has_lsda,
        });
    }

    // Link cold parts to their parents (`foo.cold`, `foo.cold.3`,
    // `foo.part.0.cold` -> `foo.part.0`).
    let by_name: BTreeMap<&str, usize> = out
        .iter()
        .enumerate()
        .flat_map(|(i, f)| {
            std::iter::once((f.name.as_str(), i))
                .chain(f.aliases.iter().map(move |a| (a.as_str(), i)))
        })
        .collect();
    let links: Vec<(usize, Option<usize>)> = out
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.kind, FunctionKind::ColdPart { .. }))
        .map(|(i, f)| {
            let parent_name = &f.name[..f.name.find(".cold").expect("cold name")];
            (i, by_name.get(parent_name).copied().filter(|&p| p != i))
        })
        .collect();
    for (i, parent) in links {
        out[i].kind = FunctionKind::ColdPart { parent };
    }
    Ok(out)
}

/// `(start, length, has_lsda)` of every FDE in `.eh_frame`.
fn eh_frame_ranges(file: &object::File) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::new();
    let Some(section) = file.section_by_name(".eh_frame") else {
        return out;
    };
    let Ok(bytes) = section.data() else {
        return out;
    };
    let eh_frame = EhFrame::new(bytes, LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let mut entries = eh_frame.entries(&bases);
    loop {
        match entries.next() {
            Ok(Some(CieOrFde::Fde(partial))) => {
                let Ok(fde) =
                    partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset))
                else {
                    continue;
                };
                out.push((fde.initial_address(), fde.len(), fde.lsda().is_some()));
            }
            Ok(Some(CieOrFde::Cie(_))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Relocations of the dynamic symbol table: GOT slot -> symbol name, and the
/// `.rela.plt` entries in order (for lazy PLT entries' `push N`).
fn dynamic_reloc_names(file: &object::File) -> (BTreeMap<u64, String>, Vec<Option<String>>) {
    let mut by_slot = BTreeMap::new();
    let mut rela_plt = Vec::new();
    let dynsym = file.dynamic_symbol_table();
    let name_of = |sym_index: u64| -> Option<String> {
        let table = dynsym.as_ref()?;
        let sym = table
            .symbol_by_index(object::SymbolIndex(sym_index as usize))
            .ok()?;
        let name = sym.name().ok()?;
        (!name.is_empty()).then(|| name.to_string())
    };
    for name in [".rela.plt", ".rela.dyn"] {
        let Some(sec) = file.section_by_name(name) else {
            continue;
        };
        let Ok(bytes) = sec.data() else { continue };
        for rela in bytes.chunks_exact(24) {
            let offset = u64::from_le_bytes(rela[..8].try_into().expect("8 bytes"));
            let info = u64::from_le_bytes(rela[8..16].try_into().expect("8 bytes"));
            let sym = info >> 32;
            let name_str = if sym != 0 { name_of(sym) } else { None };
            if name == ".rela.plt" {
                rela_plt.push(name_str.clone());
            }
            if let Some(n) = name_str {
                by_slot.entry(offset).or_insert(n);
            }
        }
    }
    (by_slot, rela_plt)
}

/// `(start, size, name)` of every PLT stub.
fn plt_stubs(file: &object::File) -> Vec<(u64, u64, Option<String>)> {
    let (by_slot, rela_plt) = dynamic_reloc_names(file);
    let mut out = Vec::new();
    let has_plt_sec = file.section_by_name(".plt.sec").is_some();
    for sec in file.sections() {
        let Ok(sec_name) = sec.name() else { continue };
        if !matches!(sec_name, ".plt" | ".plt.sec" | ".plt.got") {
            continue;
        }
        let executable = match sec.flags() {
            SectionFlags::Elf { sh_flags } => sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0,
            _ => true,
        };
        if !executable {
            continue;
        }
        let Ok(bytes) = sec.data() else { continue };
        let endbr = bytes.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]);
        let entry = if sec_name == ".plt.got" && !endbr {
            8
        } else {
            16
        };
        for (k, chunk) in bytes.chunks(entry).enumerate() {
            let Some(start) = sec.address().checked_add((k * entry) as u64) else {
                break;
            };
            let insns = crate::analysis::disasm::decode(chunk, start);
            let mut name = None;
            if sec_name == ".plt" && k == 0 {
                name = Some(".plt".to_string()); // PLT0: pushes the link map, jumps to the resolver
            }
            for insn in &insns {
                let i = &insn.instr;
                if name.is_some() {
                    break;
                }
                if insn.flow == crate::analysis::disasm::Flow::IndirectJump
                    && i.is_ip_rel_memory_operand()
                {
                    name = by_slot
                        .get(&i.ip_rel_memory_address())
                        .map(|n| format!("{n}@plt"));
                } else if i.mnemonic() == iced_x86::Mnemonic::Push
                    && matches!(
                        i.op0_kind(),
                        iced_x86::OpKind::Immediate32to64 | iced_x86::OpKind::Immediate8to64
                    )
                {
                    // A lazy entry. With IBT (`.plt.sec` present) calls go
                    // to the `.plt.sec` stub, which gets the plain name.
                    let suffix = if has_plt_sec { "@plt.lazy" } else { "@plt" };
                    name = rela_plt
                        .get(i.immediate(0) as usize)
                        .cloned()
                        .flatten()
                        .map(|n| format!("{n}{suffix}"));
                }
            }
            out.push((start, chunk.len() as u64, name));
        }
    }
    out
}
