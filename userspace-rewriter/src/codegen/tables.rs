//! The runtime's lookup tables: sorted `(original, clone)` pairs
//! ([`Tables`]), merged across modules and written into the target piece
//! by piece from wherever they are read ([`TableSource`]).

/// The three sorted tables of `(original, clone)` pairs the runtime
/// binary-searches (16 bytes a pair).
#[derive(Clone, Debug, Default)]
pub struct Tables {
    /// Every rewritten instruction: where the handler may start a burst.
    pub insns: Vec<(u64, u64)>,
    /// `(original start, clone entry)` of the cloned functions: indirect
    /// calls and jumps in a burst go to the clone.
    pub functions: Vec<(u64, u64)>,
    /// `(original return address, clone return site)` of every call in the
    /// clones.
    pub returns: Vec<(u64, u64)>,
}

impl Tables {
    /// The tables of several images (modules) as one: their originals lie
    /// in different modules, so sorting the union keeps each lookup one
    /// binary search, whichever module the address is in.
    pub fn merge<'a>(all: impl IntoIterator<Item = &'a Tables>) -> Tables {
        let mut t = Tables::default();
        for x in all {
            t.insns.extend_from_slice(&x.insns);
            t.functions.extend_from_slice(&x.functions);
            t.returns.extend_from_slice(&x.returns);
        }
        for v in [&mut t.insns, &mut t.functions, &mut t.returns] {
            v.sort_unstable();
            v.dedup_by_key(|e| e.0);
        }
        t
    }

    /// The bytes to write at `at`: the
    /// [`TablesHeader`](burstyd_common::burst::TablesHeader) (whose
    /// address goes into `BurstControl::tables`), then the three tables.
    pub fn bytes(&self, at: u64) -> Vec<u8> {
        use burstyd_common::burst::TablesHeader;
        let head = std::mem::size_of::<TablesHeader>() as u64;
        let pairs = |v: &[(u64, u64)]| 16 * v.len() as u64;
        let h = TablesHeader {
            insns: at + head,
            insns_len: self.insns.len() as u64,
            functions: at + head + pairs(&self.insns),
            functions_len: self.functions.len() as u64,
            returns: at + head + pairs(&self.insns) + pairs(&self.functions),
            returns_len: self.returns.len() as u64,
        };
        let mut b = Vec::with_capacity(
            (head + pairs(&self.insns) + pairs(&self.functions) + pairs(&self.returns)) as usize,
        );
        b.extend_from_slice(&h.to_bytes());
        for v in [&self.insns, &self.functions, &self.returns] {
            for &(o, c) in v.iter() {
                b.extend_from_slice(&o.to_le_bytes());
                b.extend_from_slice(&c.to_le_bytes());
            }
        }
        b
    }

    /// Writes the tables of several images merged (as [`Tables::merge`]
    /// and [`Tables::bytes`] would make them) to `at`, handing `out`
    /// pieces of at most `chunk` bytes with their address, without
    /// building either: python3.11's merged tables are 20 MB. Each table
    /// of each part must be sorted (as generated, moved or read back).
    /// Parts need not be in memory ([`TableSource`]); `lens` are their
    /// merged lengths ([`Tables::merged_lens`], counted before), which
    /// the header states. Returns the bytes written: fewer than
    /// [`Tables::lens_bytes`] if a source gave fewer pairs this time (a
    /// read failed, or it changed), and then the tables must not be used.
    pub fn write_merged<E>(
        parts: &[&dyn TableSource],
        lens: [u64; 3],
        at: u64,
        chunk: usize,
        mut out: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<u64, E> {
        use burstyd_common::burst::TablesHeader;
        let head = std::mem::size_of::<TablesHeader>() as u64;
        let starts = [
            at + head,
            at + head + 16 * lens[0],
            at + head + 16 * (lens[0] + lens[1]),
        ];
        let mut buf: Vec<u8> = Vec::with_capacity(chunk.max(64));
        let mut addr = at;
        let mut put = |buf: &mut Vec<u8>, bytes: &[u8], flush: bool| -> Result<(), E> {
            buf.extend_from_slice(bytes);
            if buf.len() + 16 > chunk || flush {
                out(addr, buf)?;
                addr += buf.len() as u64;
                buf.clear();
            }
            Ok(())
        };
        let header = TablesHeader {
            insns: starts[0],
            insns_len: lens[0],
            functions: starts[1],
            functions_len: lens[1],
            returns: starts[2],
            returns_len: lens[2],
        };
        put(&mut buf, &header.to_bytes(), false)?;
        for (k, len) in lens.into_iter().enumerate() {
            // No more than counted (a source may differ the second time).
            for (o, c) in merged(parts, k).take(len as usize) {
                let mut pair = [0u8; 16];
                pair[..8].copy_from_slice(&o.to_le_bytes());
                pair[8..].copy_from_slice(&c.to_le_bytes());
                put(&mut buf, &pair, false)?;
            }
        }
        put(&mut buf, &[], true)?;
        Ok(addr - at)
    }

    /// The lengths of the three tables of `parts` merged.
    pub fn merged_lens(parts: &[&dyn TableSource]) -> [u64; 3] {
        [0, 1, 2].map(|k| merged(parts, k).count() as u64)
    }

    /// Bytes of [`Tables::write_merged`] for tables of these lengths.
    pub fn lens_bytes(lens: [u64; 3]) -> u64 {
        std::mem::size_of::<burstyd_common::burst::TablesHeader>() as u64
            + 16 * lens.iter().sum::<u64>()
    }

    /// Bytes of [`Tables::write_merged`] for `parts`.
    pub fn merged_len_bytes(parts: &[&dyn TableSource]) -> u64 {
        Self::lens_bytes(Self::merged_lens(parts))
    }

    /// Table `k` (0 the instructions, 1 the functions, 2 the returns).
    pub fn table(&self, k: usize) -> &[(u64, u64)] {
        [&self.insns, &self.functions, &self.returns][k]
    }

    /// Bytes of [`Self::bytes`].
    pub fn len_bytes(&self) -> u64 {
        (std::mem::size_of::<burstyd_common::burst::TablesHeader>()
            + 16 * (self.insns.len() + self.functions.len() + self.returns.len())) as u64
    }
}

/// Sorted `(original, clone)` pairs of one table, as a stream.
pub type Pairs<'a> = Box<dyn Iterator<Item = (u64, u64)> + 'a>;

/// Where a module's three sorted tables can be read from: memory
/// ([`Tables`]), or elsewhere (a cache entry, the target process).
pub trait TableSource {
    /// Table `k` (0 the instructions, 1 the functions, 2 the returns),
    /// sorted by original.
    fn pairs(&self, k: usize) -> Pairs<'_>;

    /// Why a stream of [`Self::pairs`] stopped short, if one did (a
    /// source that reads can fail).
    fn error(&self) -> Option<String> {
        None
    }
}

impl TableSource for Tables {
    fn pairs(&self, k: usize) -> Pairs<'_> {
        Box::new(self.table(k).iter().copied())
    }
}

/// Table `k` of `parts` merged into one sorted list, the first (smallest)
/// pair of each original kept ([`Tables::merge`]'s order and dedup).
fn merged<'a>(parts: &[&'a dyn TableSource], k: usize) -> impl Iterator<Item = (u64, u64)> + 'a {
    let mut heads: Vec<std::iter::Peekable<Pairs<'a>>> =
        parts.iter().map(|p| p.pairs(k).peekable()).collect();
    let mut last: Option<u64> = None;
    std::iter::from_fn(move || {
        loop {
            let (i, _) = heads
                .iter_mut()
                .enumerate()
                .filter_map(|(i, l)| l.peek().map(|&e| (i, e)))
                .min_by_key(|&(_, e)| e)?;
            let e = heads[i].next()?;
            if last != Some(e.0) {
                last = Some(e.0);
                return Some(e);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{TableSource, Tables};

    /// `write_merged` writes what `merge` then `bytes` make, in pieces.
    #[test]
    fn merged_tables_written_in_pieces_equal_the_merged_bytes() {
        // A small deterministic generator (no rand dependency).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut parts = Vec::new();
        for p in 0..5u64 {
            let mut list = |n: usize| {
                let mut v: Vec<(u64, u64)> = (0..n)
                    .map(|_| ((p << 40) | (next() % 5000), next() % 1000))
                    .collect();
                // Some originals in two modules (merged keeps the first).
                v.push((7, p));
                v.sort_unstable();
                v.dedup_by_key(|e| e.0);
                v
            };
            parts.push(Tables {
                insns: list(3000),
                functions: list(100),
                returns: list(700),
            });
        }
        parts.push(Tables::default());
        let refs: Vec<&dyn TableSource> = parts.iter().map(|t| t as &dyn TableSource).collect();
        let at = 0x7f00_0000_0000;
        let want = Tables::merge(parts.iter()).bytes(at);
        for chunk in [1, 17, 4096, 1 << 20] {
            let mut got = Vec::new();
            let n =
                Tables::write_merged(&refs, Tables::merged_lens(&refs), at, chunk, |addr, b| {
                    assert_eq!(addr, at + got.len() as u64);
                    assert!(b.len() <= chunk.max(64));
                    got.extend_from_slice(b);
                    Ok::<(), ()>(())
                })
                .unwrap();
            assert_eq!(n, want.len() as u64);
            assert_eq!(got, want, "chunk {chunk}");
        }
        assert_eq!(Tables::merged_len_bytes(&refs), want.len() as u64);
    }
}
