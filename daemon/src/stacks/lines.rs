//! Source lines of a set of addresses, from an ELF file's `.debug_line`
//! alone, one line program at a time: what naming exported paths needs
//! (`L12→L14`). A whole DWARF context (`addr2line`) parses every unit's
//! abbreviations and line headers and keeps them: 40 MB for libc's
//! separate debug file, all for a few hundred addresses.
use std::collections::HashMap;

use gimli::{EndianSlice, LittleEndian};
use object::{Object, ObjectSection};

type Reader<'a> = EndianSlice<'a, LittleEndian>;

/// `(file, line)` of each of `addrs` (SVMAs) that a line table row
/// covers, from the ELF file `file` (read as far as needed).
pub(crate) fn lines_in_file(
    file: &std::fs::File,
    addrs: &[u64],
) -> HashMap<u64, (Option<String>, u32)> {
    lines_of(&object::ReadCache::new(file), addrs)
}

/// `(file, line)` of each of `addrs` (SVMAs) that a line table row
/// covers, from the ELF file `data`.
pub(crate) fn lines_of<'d, R: object::ReadRef<'d>>(
    data: R,
    addrs: &[u64],
) -> HashMap<u64, (Option<String>, u32)> {
    let mut out = HashMap::new();
    let mut want: Vec<u64> = addrs.to_vec();
    want.sort_unstable();
    want.dedup();
    if want.is_empty() {
        return out;
    }
    let Ok(file) = object::File::parse(data) else {
        return out;
    };
    let section = |name: &str| {
        file.section_by_name(name)
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or_default()
    };
    let (line, line_str, str_) = (
        section(".debug_line"),
        section(".debug_line_str"),
        section(".debug_str"),
    );
    let debug_line = gimli::DebugLine::new(&line, LittleEndian);
    let debug_line_str = gimli::DebugLineStr::new(&line_str, LittleEndian);
    let debug_str = gimli::DebugStr::new(&str_, LittleEndian);
    let string = |v: gimli::AttributeValue<Reader<'_>>| -> Option<String> {
        let s = match v {
            gimli::AttributeValue::String(s) => s,
            gimli::AttributeValue::DebugLineStrRef(o) => debug_line_str.get_str(o).ok()?,
            gimli::AttributeValue::DebugStrRef(o) => debug_str.get_str(o).ok()?,
            _ => return None,
        };
        Some(s.to_string_lossy().into_owned())
    };
    let mut offset = 0usize;
    while offset < line.len() {
        let Ok(program) = debug_line.program(
            gimli::DebugLineOffset(offset),
            if file.is_64() { 8 } else { 4 },
            None,
            None,
        ) else {
            break;
        };
        let header = program.header();
        let unit_len = header.unit_length() + header.format().initial_length_size() as usize;
        if unit_len == 0 {
            break;
        }
        offset += unit_len;
        let mut rows = program.rows();
        // The row before, within its sequence: it covers up to the next.
        let mut prev: Option<(u64, u64, u32)> = None;
        while let Ok(Some((header, row))) = rows.next_row() {
            if let Some((from, file_index, line)) = prev {
                let to = row.address();
                let lo = want.partition_point(|&a| a < from);
                let hi = want.partition_point(|&a| a < to);
                for &a in &want[lo..hi] {
                    out.entry(a).or_insert_with(|| {
                        let name = header.file(file_index).and_then(|f| string(f.path_name()));
                        (name, line)
                    });
                }
            }
            prev = (!row.end_sequence()).then(|| {
                let line = row.line().map_or(0, |l| l.get()) as u32;
                (row.address(), row.file_index(), line)
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::ObjectSymbol;

    /// The lines of this very test binary's functions, checked against
    /// `addr2line` (the whole-context reader).
    #[test]
    fn lines_agree_with_addr2line() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*exe).unwrap();
        let addrs: Vec<u64> = file
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .map(|s| s.address())
            .take(400)
            .collect();
        assert!(addrs.len() >= 100);
        let ours = lines_in_file(&std::fs::File::open("/proc/self/exe").unwrap(), &addrs);
        assert_eq!(ours, lines_of(&*exe, &addrs));
        let loader = addr2line::Loader::new("/proc/self/exe").unwrap();
        let (mut same, mut with_line) = (0, 0);
        for a in &addrs {
            let theirs = loader.find_location(*a).ok().flatten().and_then(|l| l.line);
            if let Some(line) = theirs {
                with_line += 1;
                let got = ours.get(a).map(|x| x.1);
                assert_eq!(got, Some(line), "address {a:#x}");
                let file = loader.find_location(*a).unwrap().unwrap().file.unwrap();
                let ours_file = ours[a].0.clone().unwrap_or_default();
                assert!(file.ends_with(&ours_file), "{file} vs {ours_file}");
                same += 1;
            }
        }
        assert!(with_line >= 100, "only {with_line} addresses with lines");
        assert_eq!(same, with_line);
    }
}
