//! Lookup tables read where they lie, a piece at a time: in a plan cache
//! entry, or in the target's memory.
//!
//! The tables hold a pair of words for every rewritten instruction:
//! python3.11's with its libraries take 19 MB. A cached module's tables
//! used to be read whole at load, and a second attach step (libraries at
//! the first stop, a `dlopen`ed library) read the process's current
//! tables back whole, to merge them with the new ones. A
//! [`FileTables`] instead streams them from the file (a cache entry, or
//! `/proc/PID/mem`) each time [`Tables::write_merged`] asks, through a
//! 64 KiB buffer; the merge reads each table twice (once to count it).
//!
//! A source that cannot read (an I/O error) or finds a table out of order
//! (a damaged entry; a process that wrote over its tables) stops its
//! stream and says why in [`TableSource::error`]: the tables it fed are
//! then short, and the caller does not put them in use.
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use burstyd_common::addr::Pid;
use burstyd_common::burst::{TABLES_HEADER_BYTES, TablesHeader};
use userspace_rewriter::codegen::{Pairs, TableSource, Tables};

/// The lookup tables of several modules, to be merged into one set:
/// counted once (before a stop, to size the mapping), written once.
pub(crate) struct Merged<'a> {
    parts: Vec<&'a dyn TableSource>,
    lens: [u64; 3],
}

/// The merged tables are written in pieces of this many bytes.
const CHUNK: usize = 1 << 20;

impl<'a> Merged<'a> {
    pub(crate) fn new(parts: Vec<&'a dyn TableSource>) -> Merged<'a> {
        let lens = Tables::merged_lens(&parts);
        Merged { parts, lens }
    }

    /// The bytes they take.
    pub(crate) fn len_bytes(&self) -> u64 {
        Tables::lens_bytes(self.lens)
    }

    /// Writes them merged at `at` through `write`, in pieces. Fails if a
    /// source stopped short or gave fewer pairs than when counted (a
    /// process's tables masked meanwhile): the tables would be
    /// incomplete, and must not be put in use.
    pub(crate) fn write(
        &self,
        at: u64,
        write: impl FnMut(u64, &[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let n = Tables::write_merged(&self.parts, self.lens, at, CHUNK, write)?;
        if let Some(e) = self.parts.iter().find_map(|t| t.error()) {
            anyhow::bail!("the lookup tables could not be read: {e}");
        }
        if n != self.len_bytes() {
            anyhow::bail!(
                "the lookup tables changed while they were merged ({n} bytes written of {})",
                self.len_bytes()
            );
        }
        Ok(())
    }
}

/// The three tables of one module (or of a whole process), in a file.
#[derive(Debug)]
pub(crate) struct FileTables {
    file: Arc<std::fs::File>,
    /// Each table's byte offset and number of pairs.
    tables: [(u64, u64); 3],
    /// Added to originals and clones as they are read (a cached module
    /// moved to where it is now mapped).
    shift: (u64, u64),
    /// Leaves out entries [`super::linkmap::mask`] cleared (clone 0, or
    /// the original itself): in a process's tables, not in an entry's.
    unmasked_only: bool,
    /// The first read that failed, or the first pair out of order.
    error: Mutex<Option<String>>,
}

impl FileTables {
    /// Tables stored in `file` (a plan cache entry) at the given byte
    /// offsets, with the given numbers of pairs.
    pub(crate) fn in_file(file: Arc<std::fs::File>, tables: [(u64, u64); 3]) -> FileTables {
        FileTables {
            file,
            tables,
            shift: (0, 0),
            unmasked_only: false,
            error: Mutex::new(None),
        }
    }

    /// The tables `pid` uses now, whose header is at `header`; the
    /// entries masked for unloaded libraries are left out.
    pub(crate) fn in_process(pid: Pid, header: u64) -> anyhow::Result<FileTables> {
        let mem = crate::sys::open_mem(pid, false).context("opening the target's memory")?;
        let mut h = [0u8; TABLES_HEADER_BYTES];
        mem.read_exact_at(&mut h, header)
            .context("reading the tables' header")?;
        Ok(FileTables {
            file: Arc::new(mem),
            tables: TablesHeader::from_bytes(&h).tables(),
            shift: (0, 0),
            unmasked_only: true,
            error: Mutex::new(None),
        })
    }

    /// The same tables with `orig` added to every original and `clone` to
    /// every clone (wrapping, as [`CloneImage::relocate_lazily`] moves
    /// them).
    ///
    /// [`CloneImage::relocate_lazily`]: userspace_rewriter::codegen::CloneImage::relocate_lazily
    pub(crate) fn moved(mut self, orig: u64, clone: u64) -> FileTables {
        self.shift = (
            self.shift.0.wrapping_add(orig),
            self.shift.1.wrapping_add(clone),
        );
        self
    }

    fn fail(&self, why: String) {
        let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        e.get_or_insert(why);
    }
}

/// Pairs read in pieces of this many bytes.
const BUFFER: usize = 64 << 10;

impl TableSource for FileTables {
    fn pairs(&self, k: usize) -> Pairs<'_> {
        let (mut at, mut left) = self.tables[k];
        let mut buf: Vec<u8> = Vec::new();
        let mut pos = 0;
        let mut last: Option<u64> = None;
        Box::new(std::iter::from_fn(move || {
            loop {
                if pos == buf.len() {
                    if left == 0 {
                        return None;
                    }
                    let n = left.min((BUFFER / 16) as u64);
                    buf.resize(16 * n as usize, 0);
                    if let Err(e) = self.file.read_exact_at(&mut buf, at) {
                        self.fail(format!("reading {} bytes at {at:#x}: {e}", buf.len()));
                        left = 0;
                        buf.clear();
                        pos = 0;
                        return None;
                    }
                    at += 16 * n;
                    left -= n;
                    pos = 0;
                }
                let p = &buf[pos..pos + 16];
                pos += 16;
                let orig = u64::from_le_bytes(p[..8].try_into().unwrap());
                let clone = u64::from_le_bytes(p[8..].try_into().unwrap());
                if self.unmasked_only && (clone == 0 || clone == orig) {
                    continue;
                }
                let e = (
                    orig.wrapping_add(self.shift.0),
                    clone.wrapping_add(self.shift.1),
                );
                if last.is_some_and(|l| e.0 < l) {
                    self.fail(format!("table {k} is not sorted at {:#x}", e.0));
                    left = 0;
                    pos = buf.len();
                    return None;
                }
                last = Some(e.0);
                return Some(e);
            }
        }))
    }

    fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use userspace_rewriter::codegen::Tables;

    fn tables() -> Tables {
        Tables {
            insns: (0..20_000u64)
                .map(|i| (0x1000 + 4 * i, 0x9_0000 + 8 * i))
                .collect(),
            functions: vec![(0x1000, 0x9_0000), (0x2000, 0x9_4000)],
            returns: vec![(0x1005, 0x9_0011)],
        }
    }

    fn pairs(t: &dyn TableSource, k: usize) -> Vec<(u64, u64)> {
        t.pairs(k).collect()
    }

    /// The tables written as a cache entry stores them read back, moved,
    /// across several buffers; a damaged or short file says so.
    #[test]
    fn tables_in_a_file_read_back_moved() {
        let t = tables();
        let mut bytes = vec![0u8; 5];
        let mut at = [(0, 0); 3];
        for (k, at) in at.iter_mut().enumerate() {
            *at = (bytes.len() as u64, t.table(k).len() as u64);
            for &(o, c) in t.table(k) {
                bytes.extend_from_slice(&o.to_le_bytes());
                bytes.extend_from_slice(&c.to_le_bytes());
            }
        }
        let path = std::env::temp_dir().join(format!("burstyd-tables-{}", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let file = Arc::new(std::fs::File::open(&path).unwrap());
        let f = FileTables::in_file(file.clone(), at).moved(0x100, 0x10);
        for k in 0..3 {
            let want: Vec<_> = t
                .table(k)
                .iter()
                .map(|&(o, c)| (o + 0x100, c + 0x10))
                .collect();
            assert_eq!(pairs(&f, k), want, "table {k}");
        }
        assert_eq!(f.error(), None);
        // Merged with itself (unmoved): as the tables in memory.
        let same = FileTables::in_file(file.clone(), at);
        let parts: [&dyn TableSource; 2] = [&same, &t];
        assert_eq!(
            Tables::merged_len_bytes(&parts),
            Tables::merge([&t]).len_bytes()
        );
        // Out of order: the stream stops and says so.
        let mut bad = bytes.clone();
        let i = at[0].0 as usize + 16 * 10_000;
        bad[i..i + 8].copy_from_slice(&1u64.to_le_bytes());
        std::fs::write(&path, &bad).unwrap();
        let f = FileTables::in_file(Arc::new(std::fs::File::open(&path).unwrap()), at);
        assert_eq!(pairs(&f, 0).len(), 10_000);
        assert!(f.error().unwrap().contains("not sorted"), "{:?}", f.error());
        // Short: the same.
        std::fs::write(&path, &bytes[..bytes.len() - 20]).unwrap();
        let f = FileTables::in_file(Arc::new(std::fs::File::open(&path).unwrap()), at);
        assert!(pairs(&f, 0).len() == t.insns.len());
        assert!(pairs(&f, 1).len() < t.functions.len());
        assert!(f.error().unwrap().contains("reading"), "{:?}", f.error());
        std::fs::remove_file(&path).unwrap();
    }

    /// A source that gives one pair fewer each time after the first
    /// three (the count): a process's tables masked meanwhile.
    struct Shrinking(std::cell::Cell<usize>, Tables);

    impl TableSource for Shrinking {
        fn pairs(&self, k: usize) -> Pairs<'_> {
            let n = self.0.get();
            self.0.set(n + 1);
            let t = self.1.table(k);
            let keep = if n < 3 { t.len() } else { t.len() - 1 };
            Box::new(t.iter().copied().take(keep))
        }
    }

    /// Merged tables are written as counted, or not at all.
    #[test]
    fn merged_tables_are_written_whole_or_refused() {
        let t = tables();
        let at = 0x7f00_0000_0000;
        let write = |m: &Merged<'_>| {
            let mut got = Vec::new();
            m.write(at, |a, b| {
                assert_eq!(a, at + got.len() as u64);
                got.extend_from_slice(b);
                Ok(())
            })
            .map(|()| got)
        };
        let m = Merged::new(vec![&t]);
        assert_eq!(write(&m).unwrap(), Tables::merge([&t]).bytes(at));
        let s = Shrinking(Default::default(), t.clone());
        let m = Merged::new(vec![&s]);
        let e = write(&m).map(|b| b.len()).unwrap_err().to_string();
        assert!(e.contains("changed while they were merged"), "{e}");
    }
}
