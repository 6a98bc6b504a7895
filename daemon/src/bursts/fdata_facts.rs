//! What BOLT's edge profile (`edges.fdata`, [`crate::export::fdata`])
//! needs from a module's file and analysis, taken when its clones are
//! generated (the bytes and the analysis are not kept) and stored in its
//! plan cache entry.
use std::collections::HashMap;

use userspace_rewriter::analysis::plan::{FunctionStatus, Plan};

/// What `edges.fdata` needs from the executable and its analysis, taken at
/// attach (the file's bytes and the analysis are not kept).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct FdataFacts {
    /// `llvm-bolt`'s names of the functions (local ones as `name/N`), by
    /// start address (SVMA).
    pub(crate) bolt_names: HashMap<u64, String>,
    /// Per function with paths: the address (SVMA) of each block's last
    /// instruction (its branch).
    pub(crate) last_insn: HashMap<u32, Vec<u64>>,
}

impl FdataFacts {
    pub(crate) fn new(
        data: &[u8],
        plan: &Plan,
        analysis: &userspace_rewriter::analysis::cfg::Analysis,
    ) -> Self {
        FdataFacts {
            bolt_names: bolt_names(data),
            last_insn: last_insns(plan, analysis),
        }
    }
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

/// Per analysed function with a path numbering: the SVMA of each block's
/// last instruction.
fn last_insns(
    plan: &Plan,
    analysis: &userspace_rewriter::analysis::cfg::Analysis,
) -> HashMap<u32, Vec<u64>> {
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
