//! A complete data reference trace in plain text, as another tool writes
//! it: one reference a line, `<module path> <static vaddr hex> <data
//! address hex>` (hex with or without `0x`), an empty line between
//! independent sequences (threads, processes). Lines starting with `#`
//! are comments. `bench/` turns valgrind lackey's `--trace-mem=yes`
//! output into it.
use std::io::BufRead;

use anyhow::{Context, bail};

use super::references::{Instr, References};

/// Reads a trace into a grammar of references.
pub(crate) fn read(input: impl BufRead, name: &str) -> anyhow::Result<References> {
    let mut refs = References::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("reading {name}"))?;
        let line = line.trim();
        if line.is_empty() {
            refs.end_sequence();
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let at = || format!("{name}:{}", i + 1);
        let mut w = line.split_whitespace();
        let (Some(module), Some(vaddr), Some(addr), None) =
            (w.next(), w.next(), w.next(), w.next())
        else {
            bail!(
                "{}: expected `<module path> <static vaddr hex> <data address hex>`, found `{line}`",
                at()
            );
        };
        let hex = |s: &str| {
            u64::from_str_radix(s.trim_start_matches("0x"), 16)
                .with_context(|| format!("{}: `{s}` is not a hex address", at()))
        };
        let instr = Instr {
            module: refs.module(module),
            vaddr: hex(vaddr)?,
        };
        let addr = hex(addr)?;
        refs.push(instr, addr);
    }
    refs.end_sequence();
    Ok(refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_references_and_sequences() {
        let text = "# a comment\n/bin/a 1000 0x7000\n/bin/a 0x1004 7008\n\n/lib/b.so 20 30\n";
        let refs = read(text.as_bytes(), "t").unwrap();
        assert_eq!(refs.count, 3);
        assert_eq!(
            refs.modules,
            vec!["/bin/a".to_string(), "/lib/b.so".to_string()]
        );
        assert_eq!(
            refs.instrs[1],
            Instr {
                module: 0,
                vaddr: 0x1004
            }
        );
        assert_eq!(refs.terms[2], (2, 0x30));
        // Two sequences: two separators after the references.
        assert_eq!(refs.seq.len(), 5);
    }

    #[test]
    fn a_bad_line_says_where_and_what() {
        let Err(e) = read("/bin/a 1000\n".as_bytes(), "trace.txt") else {
            panic!("accepted")
        };
        assert!(format!("{e:#}").contains("trace.txt:1"), "{e:#}");
        let Err(e) = read("/bin/a 1000 zz\n".as_bytes(), "trace.txt") else {
            panic!("accepted")
        };
        assert!(
            format!("{e:#}").contains("`zz` is not a hex address"),
            "{e:#}"
        );
    }
}
