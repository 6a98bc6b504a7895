//! Lookup tables that stay true to the loader's link map: a library
//! unloaded with `dlclose` must never be entered through its clones again,
//! since another library may be mapped at its addresses next.
//!
//! The runtime finds clones through one word of the control block,
//! `tables`: the header of the lookup tables (bits 0..48) and a generation
//! (bits 48..64). Before the loader maps or unmaps a library it calls
//! `_dl_debug_state`; the eBPF uprobe there sends the burst signal to that
//! thread, and the handler sets the header to 0 and bumps the generation
//! before the loader goes on (see `BurstControl::hook`). From then on
//! every lookup misses: no burst starts, and a running one ends at its
//! next indirect transfer. The daemon, seeing the process's count of link
//! changes move (the eBPF `LINK_CHANGES` map), [`relink`]s: it reads the
//! word, reads the maps, masks the table entries of every module no
//! longer mapped from the same file at the same place (so that they miss
//! for good), and puts the header back with `lock cmpxchg` against the
//! word it read first. A change it has not seen bumped the generation
//! meanwhile, so the exchange fails and it tries again at the next drain:
//! tables made before a change are never put in use after it.
//!
//! Masked entries keep their keys (the tables stay sorted): an instruction
//! or return site maps to 0 (a miss: the burst ends), a function entry to
//! itself (the call goes to the original, as for a function not cloned).
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use anyhow::Context as _;
use burstyd_common::addr::Pid;
use burstyd_common::burst::{
    ModuleEntry, TABLES_GEN_SHIFT, TABLES_HEADER_BYTES, TABLES_HEADER_MASK, TablesHeader,
};
use userspace_rewriter::inject::MapEntry;

use super::ring::SharedRegion;

/// The `tables` word of generation `gen` with `header` (0: none).
fn word(generation: u64, header: u64) -> u64 {
    (generation << TABLES_GEN_SHIFT) | (header & TABLES_HEADER_MASK)
}

fn generation(word: u64) -> u64 {
    word >> TABLES_GEN_SHIFT
}

/// The next generation (16 bits, wrapping as the handler's does).
fn next(generation: u64) -> u64 {
    (generation + 1) & ((1 << (64 - TABLES_GEN_SHIFT)) - 1)
}

/// What a [`relink`] found.
#[derive(Debug, Default)]
pub(crate) struct Relinked {
    /// Directory index and `[lo, hi)` of each module found unloaded (its
    /// entries masked now).
    pub(crate) unloaded: Vec<(usize, u64, u64)>,
    /// Libraries mapped now that have no clones (loaded with `dlopen`
    /// since, or not cloned at all): `(path, lowest address, inode)`.
    pub(crate) uncloned: Vec<Loaded>,
    /// The tables are in use again (false: a change came in meanwhile,
    /// or the maps could not be read; try again).
    pub(crate) installed: bool,
}

/// A library found in the maps: its path, lowest mapped address and
/// inode.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Loaded {
    pub(crate) path: String,
    pub(crate) lo: u64,
    pub(crate) ino: u64,
}

/// Makes the tables at `base` agree with `pid`'s maps and puts them in
/// use (see the module doc). Modules of the directory whose mapping is
/// gone are masked in `base` and forgotten in the directory. `exe_path`:
/// the executable's maps path (not a library).
/// `control`: the control block's address in the target (what it masks is
/// written only into the program attached to, never into one it exec'd).
pub(crate) fn relink(
    pid: Pid,
    region: &SharedRegion,
    control: u64,
    base: u64,
    exe_path: &str,
) -> anyhow::Result<Relinked> {
    let tables = region.tables_word();
    // Invalidate first: nothing may use tables older than the maps read
    // below.
    let mut w = tables.load(Ordering::SeqCst);
    if w & TABLES_HEADER_MASK != 0 {
        let invalid = word(next(generation(w)), 0);
        match tables.compare_exchange(w, invalid, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => w = invalid,
            // The handler got there first (its own invalidation).
            Err(now) => w = now,
        }
        if w & TABLES_HEADER_MASK != 0 {
            return Ok(Relinked::default());
        }
    }
    let mem = super::rooms::open_ours(pid, control)?;
    let maps = userspace_rewriter::inject::maps(pid)?;
    let mut out = Relinked::default();
    for (i, e) in region.modules().iter().enumerate() {
        // The executable (first) goes only with the whole image.
        if i == 0 || e.id == 0 || still_mapped(e, &maps) {
            continue;
        }
        mask(&mem, base, e.lo, e.hi)
            .with_context(|| format!("masking the tables of the module at {:#x}", e.lo))?;
        region.forget_module(i);
        out.unloaded.push((i, e.lo, e.hi));
    }
    let live: Vec<ModuleEntry> = region.modules().into_iter().filter(|e| e.id != 0).collect();
    for path in super::modules::library_paths(&maps, exe_path) {
        let Some(first) = maps
            .iter()
            .filter(|m| m.is_path(path))
            .min_by_key(|m| m.start)
        else {
            continue;
        };
        if !live
            .iter()
            .any(|e| e.lo == first.start && e.ino == first.inode)
        {
            out.uncloned.push(Loaded {
                path: path.to_owned(),
                lo: first.start,
                ino: first.inode,
            });
        }
    }
    out.installed = tables
        .compare_exchange(
            w,
            word(generation(w), base),
            Ordering::SeqCst,
            Ordering::SeqCst,
        )
        .is_ok();
    Ok(out)
}

/// Whether the module `e` recorded is still mapped from the same file
/// (inode) at the same lowest address.
fn still_mapped(e: &ModuleEntry, maps: &[MapEntry]) -> bool {
    if e.hi == 0 {
        // Recorded without its place: nothing to compare.
        return true;
    }
    maps.iter().any(|m| m.start == e.lo && m.inode == e.ino)
}

/// Masks, in the tables whose header is at `header` in the target's
/// memory `mem`, every entry whose original address is in `[lo, hi)` (see
/// the module doc). Returns how many.
pub(crate) fn mask(mem: &std::fs::File, header: u64, lo: u64, hi: u64) -> anyhow::Result<usize> {
    let mut h = [0u8; TABLES_HEADER_BYTES];
    mem.read_exact_at(&mut h, header)
        .context("reading the tables' header")?;
    let [insns, functions, returns] = TablesHeader::from_bytes(&h).tables();
    let mut n = 0;
    for ((at, len), to_itself) in [(insns, false), (functions, true), (returns, false)] {
        n += mask_one(mem, at, len, lo, hi, to_itself)?;
    }
    Ok(n)
}

/// Masks the entries of `[lo, hi)` in one sorted table of `len` pairs at
/// `at`: their clone becomes 0, or the original itself.
fn mask_one(
    mem: &std::fs::File,
    at: u64,
    len: u64,
    lo: u64,
    hi: u64,
    to_itself: bool,
) -> anyhow::Result<usize> {
    let key = |i: u64| -> anyhow::Result<u64> {
        let mut b = [0u8; 8];
        mem.read_exact_at(&mut b, at + 16 * i)?;
        Ok(u64::from_ne_bytes(b))
    };
    // The first index whose key is >= x.
    let lower_bound = |x: u64| -> anyhow::Result<u64> {
        let (mut a, mut b) = (0, len);
        while a < b {
            let mid = (a + b) / 2;
            if key(mid)? < x {
                a = mid + 1;
            } else {
                b = mid;
            }
        }
        Ok(a)
    };
    let (first, end) = (lower_bound(lo)?, lower_bound(hi)?);
    if first >= end {
        return Ok(0);
    }
    let mut bytes = vec![0u8; (16 * (end - first)) as usize];
    mem.read_exact_at(&mut bytes, at + 16 * first)?;
    for pair in bytes.chunks_exact_mut(16) {
        let orig: [u8; 8] = pair[..8].try_into().unwrap();
        let clone = if to_itself { orig } else { [0; 8] };
        pair[8..].copy_from_slice(&clone);
    }
    // Only the clone words change, each an aligned 8-byte store; nothing
    // reads them meanwhile (the tables are invalid while this runs).
    mem.write_all_at(&bytes, at + 16 * first)
        .context("writing the masked entries")?;
    Ok((end - first) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Masking in the test process's own memory (through
    /// `/proc/self/mem`, as in a target): entries in the range, and only
    /// those, miss (or map to themselves); keys stay sorted.
    #[test]
    fn masks_exactly_the_range() {
        let insns: Vec<u64> = (0..10u64)
            .flat_map(|i| [0x1000 + 0x10 * i, 0x9000 + i])
            .collect();
        let funcs: Vec<u64> = (0..4u64)
            .flat_map(|i| [0x1000 + 0x40 * i, 0x9100 + i])
            .collect();
        let rets: Vec<u64> = vec![0x0fff, 0x9200, 0x1055, 0x9201, 0x10a0, 0x9202];
        let header: Vec<u64> = vec![
            insns.as_ptr() as u64,
            10,
            funcs.as_ptr() as u64,
            4,
            rets.as_ptr() as u64,
            3,
        ];
        let pid = Pid(std::process::id());
        let mem = crate::sys::open_mem(pid, true).unwrap();
        let n = mask(&mem, header.as_ptr() as u64, 0x1040, 0x10a0).unwrap();
        // SAFETY: the vectors were written through /proc/self/mem; read
        // them again as the compiler cannot know.
        let read = |v: &Vec<u64>| -> Vec<u64> {
            v.iter()
                .map(|x| unsafe { std::ptr::read_volatile(x) })
                .collect()
        };
        let insns = read(&insns);
        let funcs = read(&funcs);
        let rets = read(&rets);
        // 0x1040..0x1090: six instructions, two functions, one return.
        assert_eq!(n, 6 + 2 + 1);
        for i in 0..10u64 {
            let want = if (4..10).contains(&i) { 0 } else { 0x9000 + i };
            assert_eq!(insns[2 * i as usize + 1], want, "insn {i}");
            assert_eq!(insns[2 * i as usize], 0x1000 + 0x10 * i);
        }
        assert_eq!(
            funcs,
            vec![
                0x1000, 0x9100, 0x1040, 0x1040, 0x1080, 0x1080, 0x10c0, 0x9103
            ]
        );
        assert_eq!(rets, vec![0x0fff, 0x9200, 0x1055, 0, 0x10a0, 0x9202]);
        // Read back, the masked entries are gone.
        use userspace_rewriter::codegen::TableSource;
        let t = crate::bursts::tables::FileTables::in_process(pid, header.as_ptr() as u64).unwrap();
        assert_eq!(t.pairs(0).count(), 4);
        assert_eq!(
            t.pairs(1).collect::<Vec<_>>(),
            vec![(0x1000, 0x9100), (0x10c0, 0x9103)]
        );
        assert_eq!(
            t.pairs(2).collect::<Vec<_>>(),
            vec![(0x0fff, 0x9200), (0x10a0, 0x9202)]
        );
        assert_eq!(t.error(), None);
    }

    #[test]
    fn words_carry_the_generation() {
        assert_eq!(generation(word(3, 0x7fff_1234_5000)), 3);
        assert_eq!(
            word(3, 0x7fff_1234_5000) & TABLES_HEADER_MASK,
            0x7fff_1234_5000
        );
        assert_eq!(next(0xffff), 0);
    }
}
