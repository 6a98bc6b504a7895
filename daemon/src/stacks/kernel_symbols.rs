//! Kernel symbols: `/proc/kallsyms` read once (code symbols only), the
//! kernel's build ID from `/sys/kernel/notes`, and kernel addresses →
//! function names with `[kernel.kallsyms]` or the kernel module as
//! mapping (needs root or `kptr_restrict=0`).
use std::collections::HashMap;
use std::sync::Arc;

use burstyd_common::addr::Bias;
use tracing::{debug, warn};

use crate::stacks::modules::Module;

use crate::stacks::table::MappingInfo;

/// A kernel address farther than this past the last symbol is unknown.
const KERNEL_LAST_SYMBOL_SPAN: u64 = 1 << 20;

#[derive(Clone, Copy)]
struct KSym {
    addr: u64,
    name_off: u32,
    name_len: u32,
    /// Index into `KernelSymbols::mappings`.
    mapping: u32,
    /// Preference among symbols at one address (global before local).
    rank: u8,
}

pub(super) struct KernelSymbols {
    syms: Vec<KSym>,
    names: String,
    /// `[kernel.kallsyms]` first, then one per kernel module.
    mappings: Vec<MappingInfo>,
}

/// Build ID from an ELF notes blob (e.g. `/sys/kernel/notes`).
fn build_id_from_notes(notes: &[u8]) -> Option<String> {
    let mut p = 0usize;
    let word = |p: usize| -> Option<usize> {
        Some(u32::from_le_bytes(notes.get(p..p + 4)?.try_into().ok()?) as usize)
    };
    while p + 12 <= notes.len() {
        let (namesz, descsz, ty) = (word(p)?, word(p + 4)?, word(p + 8)?);
        let name_start = p + 12;
        let desc_start = name_start + namesz.div_ceil(4) * 4;
        let next = desc_start + descsz.div_ceil(4) * 4;
        if ty == 3 && notes.get(name_start..name_start + namesz) == Some(b"GNU\0") {
            return Some(userspace_rewriter::analysis::elf::to_hex(
                notes.get(desc_start..desc_start + descsz)?,
            ));
        }
        p = next;
    }
    None
}

impl KernelSymbols {
    pub(super) fn load() -> Option<KernelSymbols> {
        use std::io::BufRead as _;
        // Line by line: the file is 5 MB of text, of which only the code
        // symbols are kept.
        let text = match std::fs::File::open("/proc/kallsyms") {
            Ok(f) => std::io::BufReader::with_capacity(1 << 16, f),
            Err(e) => {
                warn!(error = %e, "cannot read /proc/kallsyms; kernel frames stay unresolved");
                return None;
            }
        };
        let mut syms = Vec::new();
        let mut names = String::new();
        let mut module_index: HashMap<String, u32> = HashMap::new();
        let mut module_names = vec!["[kernel.kallsyms]".to_owned()];
        for line in text.lines() {
            let Ok(line) = line else {
                warn!("/proc/kallsyms could not be read to its end; kernel frames stay unresolved");
                return None;
            };
            let mut f = line.split_ascii_whitespace();
            let (Some(addr), Some(ty), Some(name)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if !matches!(ty, "t" | "T" | "w" | "W") {
                continue;
            }
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if addr == 0 {
                continue;
            }
            let mapping = match f.next() {
                Some(m) if m.starts_with('[') => {
                    let next = module_names.len() as u32;
                    *module_index.entry(m.to_owned()).or_insert_with(|| {
                        module_names.push(m.to_owned());
                        next
                    })
                }
                _ => 0,
            };
            let rank = match ty {
                "T" => 3,
                "W" => 2,
                "t" => 1,
                _ => 0,
            };
            syms.push(KSym {
                rank,
                addr,
                name_off: names.len() as u32,
                name_len: name.len() as u32,
                mapping,
            });
            names.push_str(name);
        }
        if syms.is_empty() {
            warn!(
                "/proc/kallsyms has no addresses (kptr_restrict?); kernel frames stay unresolved"
            );
            return None;
        }
        // One name per address: the most global one, then the first listed.
        syms.sort_by(|a, b| a.addr.cmp(&b.addr).then(b.rank.cmp(&a.rank)));
        syms.dedup_by_key(|s| s.addr);
        syms.shrink_to_fit();
        names.shrink_to_fit();
        let mut ranges = vec![(u64::MAX, 0u64); module_names.len()];
        for s in &syms {
            let r = &mut ranges[s.mapping as usize];
            r.0 = r.0.min(s.addr);
            r.1 = r.1.max(s.addr);
        }
        let mappings = module_names
            .iter()
            .zip(ranges)
            .map(|(name, (lo, hi))| {
                let build_id = if name == "[kernel.kallsyms]" {
                    std::fs::read("/sys/kernel/notes").ok()
                } else {
                    let m = name.trim_start_matches('[').trim_end_matches(']');
                    std::fs::read(format!("/sys/module/{m}/notes/.note.gnu.build-id")).ok()
                }
                .and_then(|n| build_id_from_notes(&n));
                MappingInfo {
                    start: lo,
                    limit: hi.saturating_add(1),
                    file_offset: 0,
                    path: name.clone(),
                    build_id: build_id.clone(),
                    bias: Bias(0),
                    module: Arc::new(Module::placeholder(name, build_id)),
                }
            })
            .collect();
        debug!(symbols = syms.len(), "loaded /proc/kallsyms");
        Some(KernelSymbols {
            syms,
            names,
            mappings,
        })
    }

    pub(super) fn lookup(&self, addr: u64) -> Option<(&str, &MappingInfo)> {
        let i = self.syms.partition_point(|s| s.addr <= addr);
        let s = self.syms.get(i.checked_sub(1)?)?;
        if i == self.syms.len() && addr - s.addr > KERNEL_LAST_SYMBOL_SPAN {
            return None;
        }
        let name = self
            .names
            .get(s.name_off as usize..(s.name_off + s.name_len) as usize)?;
        Some((name, &self.mappings[s.mapping as usize]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_from_a_gnu_note() {
        assert_eq!(
            build_id_from_notes(&[
                4, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, b'G', b'N', b'U', 0, 0xab, 0xcd, 0, 0
            ]),
            Some("abcd".into())
        );
        assert_eq!(build_id_from_notes(&[]), None);
    }
}
