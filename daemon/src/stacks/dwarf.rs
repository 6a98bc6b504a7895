//! A module's DWARF, opened for [`addr2line`] lookups.
//!
//! **You give it** the path of an ELF file with DWARF (the module itself or
//! its separate debug file). **It gives back** a [`Dwarf`] that answers
//! `find_frames` and `find_location` for an SVMA.
//!
//! [`addr2line::Loader`] builds a relocation map for every debug section
//! that has relocations. In a relocatable object those are needed; in a
//! linked executable or shared object they are already applied, and they
//! are only there because it was linked with `--emit-relocs` (which BOLT
//! needs, so our users' binaries have it). The map of such a file is large:
//! xerces-c's `DOMPrint` (42 MB) has 700,000 relocations in
//! `.rela.debug_info` alone, and the map of them took tens of MB of the
//! daemon's heap for the final profile. A linked file's DWARF is therefore
//! read straight from its memory map ([`Linked`]); everything else
//! (relocatable objects, split DWARF through `.dwp` files) still goes
//! through the loader.

use std::borrow::Cow;
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::Path;
use std::sync::Arc;

use object::{Object, ObjectKind, ObjectSection};

/// Section bytes: a range of the file's memory map, or an owned copy of a
/// compressed section, inflated.
#[derive(Debug, Clone)]
enum Bytes {
    Mapped(Arc<memmap2::Mmap>, Range<usize>),
    Owned(Arc<[u8]>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map, range) => &map[range.clone()],
            Bytes::Owned(b) => b,
        }
    }
}

// SAFETY: both variants point into a heap or mapped allocation held by an
// `Arc`, which neither moves when the `Bytes` moves nor when it is cloned.
unsafe impl gimli::StableDeref for Bytes {}
// SAFETY: as above; a clone shares the same `Arc` and range.
unsafe impl gimli::CloneStableDeref for Bytes {}

type Reader = gimli::EndianReader<gimli::RunTimeEndian, Bytes>;

/// One frame at an address: function name (demangled), file, line.
pub(crate) type FoundFrame = (Option<String>, Option<String>, Option<u32>);

/// A module's DWARF.
pub(crate) struct Dwarf(Inner);

enum Inner {
    Linked(Box<addr2line::Context<Reader>>),
    Loader(Box<addr2line::Loader>),
}

impl Dwarf {
    /// Opens the DWARF of the ELF file at `path`.
    pub(crate) fn open(path: &Path) -> Result<Dwarf, String> {
        let file = File::open(path).map_err(|e| e.to_string())?;
        // SAFETY: the file is read-only to us; like addr2line's loader we
        // accept that a file truncated under us may fault.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?);
        let object = object::File::parse(&**map).map_err(|e| e.to_string())?;
        if object.kind() == ObjectKind::Relocatable || !has_debug_relocations(&object) {
            drop(object);
            return addr2line::Loader::new(path)
                .map(|l| Dwarf(Inner::Loader(Box::new(l))))
                .map_err(|e| e.to_string());
        }
        let endian = if object.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let base = map.as_ptr() as usize;
        let mut dwarf = gimli::Dwarf::load(|id| -> Result<Reader, String> {
            let bytes = match object.section_by_name(id.name()) {
                None => Bytes::Owned(Arc::from(&[][..])),
                Some(s) => match s.uncompressed_data().map_err(|e| e.to_string())? {
                    Cow::Borrowed(b) => {
                        let start = b.as_ptr() as usize - base;
                        Bytes::Mapped(map.clone(), start..start + b.len())
                    }
                    Cow::Owned(v) => Bytes::Owned(v.into()),
                },
            };
            Ok(gimli::EndianReader::new(bytes, endian))
        })?;
        dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
        let ctx = addr2line::Context::from_dwarf(dwarf).map_err(|e| e.to_string())?;
        Ok(Dwarf(Inner::Linked(Box::new(ctx))))
    }

    /// The frames at `svma`, innermost (inlined callee) first.
    pub(crate) fn find_frames(&self, svma: u64) -> Result<Vec<FoundFrame>, String> {
        match &self.0 {
            Inner::Linked(ctx) => collect(ctx.find_frames(svma).skip_all_loads()),
            Inner::Loader(l) => collect(l.find_frames(svma).map_err(|e| e.to_string())),
        }
    }

    /// The file and line at `svma`.
    pub(crate) fn find_location(&self, svma: u64) -> Option<(Option<String>, Option<u32>)> {
        let loc = match &self.0 {
            Inner::Linked(ctx) => ctx.find_location(svma).ok()??,
            Inner::Loader(l) => l.find_location(svma).ok()??,
        };
        Some((loc.file.map(str::to_owned), loc.line))
    }
}

/// Whether any debug section of `object` has relocations (a linked file
/// made with `--emit-relocs`).
fn has_debug_relocations(object: &object::File) -> bool {
    object.sections().any(|s| {
        s.name().is_ok_and(|n| n.starts_with(".debug_")) && s.relocations().next().is_some()
    })
}

fn collect<R: gimli::Reader, E: std::fmt::Display>(
    iter: Result<addr2line::FrameIter<'_, R>, E>,
) -> Result<Vec<FoundFrame>, String> {
    let mut iter = iter.map_err(|e| e.to_string())?;
    let mut frames = Vec::new();
    loop {
        match iter.next() {
            Ok(Some(f)) => {
                let function = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok())
                    .map(Cow::into_owned);
                let (file, line) = f
                    .location
                    .map(|l| (l.file.map(str::to_owned), l.line))
                    .unwrap_or((None, None));
                frames.push((function, file, line));
            }
            Ok(None) => return Ok(frames),
            // What was found before the error still holds.
            Err(e) if !frames.is_empty() => {
                tracing::debug!(error = %e, "DWARF frame lookup stopped");
                return Ok(frames);
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::unwind::tests::{build_c, scratch_dir};
    use object::ObjectSymbol as _;

    const INLINED_C: &str = r#"
static inline __attribute__((always_inline)) int sq(int x) { return x * x + 1; }
__attribute__((noinline)) int f(int x) {
    int s = 0;
    for (int i = 0; i < x; i++) s += sq(i);
    return s;
}
int main(int c, char **v) { (void)v; return f(c * 100) & 1; }
"#;

    /// A file linked with `--emit-relocs` is read without relocation
    /// maps, and every address of its code resolves as addr2line's own
    /// loader resolves it (functions, inline frames, files, lines).
    #[test]
    fn a_linked_file_resolves_as_the_loader_resolves_it() {
        let dir = scratch_dir("dwarf");
        let exe = build_c(
            &dir,
            "inlined",
            INLINED_C,
            &["-O2", "-g", "-Wl,--emit-relocs"],
        );
        let ours = Dwarf::open(&exe).unwrap();
        assert!(
            matches!(ours.0, Inner::Linked(_)),
            "not read as a linked file"
        );
        let loader = Dwarf(Inner::Loader(Box::new(
            addr2line::Loader::new(&exe).unwrap(),
        )));
        let data = std::fs::read(&exe).unwrap();
        let obj = object::File::parse(&*data).unwrap();
        let text = obj.section_by_name(".text").unwrap();
        let mut inlined = 0;
        for svma in text.address()..text.address() + text.size() {
            let (a, b) = (ours.find_frames(svma), loader.find_frames(svma));
            assert_eq!(a, b, "at {svma:#x}");
            inlined += usize::from(a.as_ref().is_ok_and(|f| f.len() > 1));
            assert_eq!(ours.find_location(svma), loader.find_location(svma));
        }
        assert!(inlined > 0, "no inline frame seen");
        let names: Vec<String> = ours
            .find_frames(
                obj.symbols()
                    .find(|s| s.name() == Ok("f"))
                    .map(|s| s.address())
                    .unwrap(),
            )
            .unwrap()
            .into_iter()
            .filter_map(|f| f.0)
            .collect();
        assert_eq!(names.last().map(String::as_str), Some("f"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
