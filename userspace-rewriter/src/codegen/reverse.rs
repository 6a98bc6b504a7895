//! The map from clone addresses back to the original instructions, kept by
//! the daemon for as long as a process is traced (a sample taken in a
//! burst is reported as the original instruction). One entry per copied
//! instruction: python3.11 and its libraries copy 1.2 million, so the map
//! stores 32-bit offsets from two bases and the instruction's length, 9
//! bytes an entry where `(clone, original, end)` triples took 24; moving
//! the clones ([`super::CloneImage::relocate`]) moves the bases only.

/// Clone address → original instruction `[start, end)`, sorted by clone
/// address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReverseMap {
    clone_base: u64,
    orig_base: u64,
    clone: Vec<u32>,
    orig: Vec<u32>,
    len: Vec<u8>,
}

impl ReverseMap {
    /// The map of `(clone address, original address, original end)`
    /// triples sorted by clone address; `Err` where one does not fit (a
    /// module or clone region of 4 GiB or more, an instruction of more
    /// than 255 bytes).
    pub fn new(triples: &[(u64, u64, u64)]) -> Result<ReverseMap, String> {
        let clone_base = triples.first().map_or(0, |e| e.0);
        let orig_base = triples.iter().map(|e| e.1).min().unwrap_or(0);
        let mut m = ReverseMap {
            clone_base,
            orig_base,
            clone: Vec::with_capacity(triples.len()),
            orig: Vec::with_capacity(triples.len()),
            len: Vec::with_capacity(triples.len()),
        };
        for &(c, o, end) in triples {
            m.push(c, o, end)?;
        }
        Ok(m)
    }

    /// The map of entries given as offsets (as [`Self::parts`] returns
    /// them), checked for order.
    pub fn from_parts(
        clone_base: u64,
        orig_base: u64,
        clone: Vec<u32>,
        orig: Vec<u32>,
        len: Vec<u8>,
    ) -> Result<ReverseMap, String> {
        if clone.len() != orig.len() || clone.len() != len.len() {
            return Err("the map's columns differ in length".into());
        }
        if !clone.is_sorted() {
            return Err("the map is not sorted by clone address".into());
        }
        Ok(ReverseMap {
            clone_base,
            orig_base,
            clone,
            orig,
            len,
        })
    }

    fn push(&mut self, c: u64, o: u64, end: u64) -> Result<(), String> {
        let off = |x: u64, base: u64, what: &str| {
            x.checked_sub(base)
                .and_then(|d| u32::try_from(d).ok())
                .ok_or_else(|| format!("{what} {x:#x} is not within 4 GiB above {base:#x}"))
        };
        let len = end
            .checked_sub(o)
            .and_then(|l| u8::try_from(l).ok())
            .ok_or_else(|| format!("the instruction at {o:#x} ends at {end:#x}"))?;
        let c = off(c, self.clone_base, "clone address")?;
        if self.clone.last().is_some_and(|&l| l > c) {
            return Err("the map is not sorted by clone address".into());
        }
        self.clone.push(c);
        self.orig.push(off(o, self.orig_base, "original address")?);
        self.len.push(len);
        Ok(())
    }

    /// The original instruction `(start, end)` of the last copied
    /// instruction at or below `clone_pc`.
    pub fn lookup(&self, clone_pc: u64) -> Option<(u64, u64)> {
        let probe = clone_pc.checked_sub(self.clone_base)?;
        let probe = u32::try_from(probe).unwrap_or(u32::MAX);
        let i = self.clone.partition_point(|&c| c <= probe).checked_sub(1)?;
        let o = self.orig_base + u64::from(self.orig[i]);
        Some((o, o + u64::from(self.len[i])))
    }

    /// Moves the clones by `dc` and the originals by `db` (wrapping).
    pub fn relocate(&mut self, dc: u64, db: u64) {
        self.clone_base = self.clone_base.wrapping_add(dc);
        self.orig_base = self.orig_base.wrapping_add(db);
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.clone.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clone.is_empty()
    }

    /// The bases and the columns: clone offsets, original offsets,
    /// lengths.
    pub fn parts(&self) -> (u64, u64, &[u32], &[u32], &[u8]) {
        (
            self.clone_base,
            self.orig_base,
            &self.clone,
            &self.orig,
            &self.len,
        )
    }

    /// Bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.clone.capacity() * 4 + self.orig.capacity() * 4 + self.len.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_moves_agree_with_the_triples() {
        let triples = [
            (0x7000_0000, 0x40_1000, 0x40_1005),
            (0x7000_0005, 0x40_1005, 0x40_1007),
            (0x7000_0010, 0x40_0ff0, 0x40_0ffa),
        ];
        let mut m = ReverseMap::new(&triples).unwrap();
        assert_eq!(m.lookup(0x6fff_ffff), None);
        assert_eq!(m.lookup(0x7000_0000), Some((0x40_1000, 0x40_1005)));
        assert_eq!(m.lookup(0x7000_0004), Some((0x40_1000, 0x40_1005)));
        assert_eq!(m.lookup(0x7000_0006), Some((0x40_1005, 0x40_1007)));
        assert_eq!(m.lookup(0x7000_0100), Some((0x40_0ff0, 0x40_0ffa)));
        m.relocate(0x1000_0000, 0x10_0000);
        assert_eq!(m.lookup(0x8000_0005), Some((0x50_1005, 0x50_1007)));
        let (cb, ob, c, o, l) = m.parts();
        let back = ReverseMap::from_parts(cb, ob, c.to_vec(), o.to_vec(), l.to_vec()).unwrap();
        assert_eq!(back, m);
        // What does not fit is refused, never truncated.
        assert!(ReverseMap::new(&[(0, 0x1000, 0x2000)]).is_err());
        assert!(ReverseMap::new(&[(0, 0, 1), (1 << 33, 0, 1)]).is_err());
        assert!(ReverseMap::new(&[(8, 0, 1), (4, 0, 1)]).is_err());
    }
}
