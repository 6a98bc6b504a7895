//! `rt_lookup` and `rt_lookup_fn`: binary search over a sorted table of
//! `(original, clone)` pairs (16 bytes each).
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{
    CodeAssembler, CodeLabel, eax, ecx, edx, qword_ptr, r8, rax, rcx, rdi, rdx, rsi, rsp,
};

use burstyd_common::burst::TABLES_GEN_SHIFT;

use super::asm::RipRel;

/// A binary search over the sorted `(original, clone)` table whose address
/// and length (in pairs) are the words at `addr_off`/`len_off` of the
/// [`TablesHeader`](burstyd_common::burst::TablesHeader) the control-block
/// word at `tables_field` points to (its low 48 bits; the generation above
/// them is dropped; read once: a header swapped in meanwhile is used by
/// the next lookup): `rax` = original → `rax` = clone, or 0 when it is not
/// in the table (also without a header). Clobbers rcx, rdx.
pub(super) fn lookup(
    a: &mut CodeAssembler,
    entry: &mut CodeLabel,
    tables_field: u64,
    (addr_off, len_off): (usize, usize),
) -> Result<(), IcedError> {
    let mut lp = a.create_label();
    let mut right = a.create_label();
    let mut found = a.create_label();
    let mut none = a.create_label();
    let mut out = a.create_label();

    a.set_label(entry)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.mov(r8, rax)?; // the key
    a.xor(ecx, ecx)?; // lo
    a.xor(edx, edx)?; // hi (no header: no pairs)
    a.rip_rm(Code::Mov_r64_rm64, rsi, tables_field)?;
    // Drop the generation (bits 48..64); a header of 0: no tables.
    a.shl(rsi, 64 - TABLES_GEN_SHIFT)?;
    a.je(none)?;
    a.shr(rsi, 64 - TABLES_GEN_SHIFT)?;
    a.mov(rdx, qword_ptr(rsi + len_off as i32))?;
    a.mov(rsi, qword_ptr(rsi + addr_off as i32))?;
    a.set_label(&mut lp)?;
    a.cmp(rcx, rdx)?;
    a.jae(none)?;
    a.lea(rax, qword_ptr(rcx + rdx))?;
    a.shr(rax, 1)?; // mid
    a.mov(rdi, rax)?;
    a.shl(rdi, 4)?;
    a.cmp(qword_ptr(rsi + rdi), r8)?;
    a.je(found)?;
    a.jb(right)?;
    a.mov(rdx, rax)?; // hi = mid
    a.jmp(lp)?;
    a.set_label(&mut right)?;
    a.lea(rcx, qword_ptr(rax + 1))?; // lo = mid + 1
    a.jmp(lp)?;
    a.set_label(&mut found)?;
    a.mov(rax, qword_ptr(rsi + rdi + 8))?;
    a.jmp(out)?;
    a.set_label(&mut none)?;
    a.xor(eax, eax)?;
    a.set_label(&mut out)?;
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.ret()?;
    Ok(())
}

/// `rt_lookup_fn(rax = original target of a call or jump) -> rax`: the
/// clone of the function starting there (`function_entry`, the
/// function-entry table); else, for a target inside a clone (an entry
/// point in the middle of a function: glibc's `__memmove_avx_unaligned_erms`
/// inside the FDE range of its `__mempcpy` sibling, which the IFUNC
/// resolver hands out), the clone of that instruction (`instruction`, the
/// table the signal handler starts bursts with), entered as a burst
/// starts: the path so far is not this function's, so the burst's thread
/// gets `path = PATH_INVALID` (its callee's path is partial, and its own
/// is once the callee returns: its shadow entry never matches); else the
/// original, unchanged. Clobbers rcx, rdx.
pub(super) fn lookup_fn(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    function_entry: CodeLabel,
    instruction: CodeLabel,
) -> Result<(), IcedError> {
    use super::asm::{local, owner_gate};
    let mut hit = a.create_label();
    let mut keep = a.create_label();
    a.set_label(entry)?;
    a.push(rax)?; // the original
    a.call(function_entry)?;
    a.test(rax, rax)?;
    a.jne(hit)?;
    a.mov(rax, qword_ptr(rsp))?;
    a.call(instruction)?;
    a.test(rax, rax)?;
    a.je(keep)?;
    owner_gate(a, control, rcx, hit)?;
    a.mov(rcx, burstyd_common::burst::PATH_INVALID)?;
    a.rip_mr(Code::Mov_rm64_r64, local!(control, path), rcx)?;
    a.jmp(hit)?;
    a.set_label(&mut keep)?;
    a.mov(rax, qword_ptr(rsp))?;
    a.set_label(&mut hit)?;
    a.lea(rsp, qword_ptr(rsp + 8))?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{CLONE_LO, Harness, Regs};

    /// Calls a lookup routine, checking that only rax, rcx, rdx change.
    fn call(h: &mut Harness, routine: u64, key: u64) -> u64 {
        let before = Regs {
            rax: key,
            ..Regs::sentinel()
        };
        let after = h.call(routine, before);
        before.assert_preserved(&after, &["rax", "rcx", "rdx"]);
        after.rax
    }

    fn lookup(h: &mut Harness, key: u64) -> u64 {
        let r = h.rt.lookup;
        call(h, r, key)
    }

    fn lookup_fn(h: &mut Harness, key: u64) -> u64 {
        let r = h.rt.lookup_fn;
        call(h, r, key)
    }

    fn table(n: u64) -> Vec<(u64, u64)> {
        (0..n)
            .map(|i| (0x40_1000 + 0x10 * i, CLONE_LO + 0x100 * i + 7))
            .collect()
    }

    /// Keys that are in no table built by [`table`].
    fn misses(n: u64) -> Vec<u64> {
        let mut v = vec![0, 1, 0x40_0fff, 0x40_1000 + 0x10 * n, u64::MAX];
        v.extend((0..n).map(|i| 0x40_1001 + 0x10 * i));
        v.extend((0..n).map(|i| 0x40_0fff + 0x10 * i));
        v
    }

    /// Every entry of tables of 0..=33 pairs is found (first, last and every
    /// probe path of the search); every key between, below or above them
    /// is a miss (0).
    #[test]
    fn instruction_table_hits_and_misses() {
        let mut h = Harness::new();
        for n in 0..=33 {
            let t = table(n);
            h.set_table(&t);
            for &(o, c) in &t {
                assert_eq!(lookup(&mut h, o), c, "n = {n}, key {o:#x}");
            }
            for k in misses(n) {
                assert_eq!(lookup(&mut h, k), 0, "n = {n}, key {k:#x}");
            }
        }
    }

    #[test]
    fn empty_table_misses() {
        let mut h = Harness::new();
        h.set_table(&[]);
        for k in [0, 0x40_1000, u64::MAX] {
            assert_eq!(lookup(&mut h, k), 0);
        }
        h.set_fn_table(&[]);
        assert_eq!(lookup_fn(&mut h, 0x40_1000), 0x40_1000);
    }

    /// Addresses compare unsigned (a signed `jl` would misorder these).
    #[test]
    fn keys_compare_unsigned() {
        let mut h = Harness::new();
        let t = [
            (1, 11),
            (0x7fff_ffff_ffff_ffff, 12),
            (0x8000_0000_0000_0000, 13),
            (0xffff_ffff_ffff_fffe, 14),
        ];
        h.set_table(&t);
        for (o, c) in t {
            assert_eq!(lookup(&mut h, o), c);
        }
        assert_eq!(lookup(&mut h, u64::MAX), 0);
        assert_eq!(lookup(&mut h, 0x8000_0000_0000_0001), 0);
    }

    /// `rt_lookup_fn` searches the function-entry table and returns the
    /// original on a miss; the two routines never read each other's table.
    #[test]
    fn function_table_keeps_the_original_on_a_miss() {
        let mut h = Harness::new();
        for n in [1, 2, 7, 16] {
            let t = table(n);
            h.set_fn_table(&t);
            h.set_table(&[]);
            for &(o, c) in &t {
                assert_eq!(lookup_fn(&mut h, o), c);
                assert_eq!(lookup(&mut h, o), 0);
            }
            for k in misses(n) {
                assert_eq!(lookup_fn(&mut h, k), k);
            }
        }
    }

    /// A target that starts no function but is a rewritten instruction
    /// (an entry point inside a function) enters that instruction's clone,
    /// the path so far made invalid for the burst's thread; anything else
    /// keeps the original; a function entry wins over an instruction.
    #[test]
    fn function_lookup_enters_a_rewritten_instruction() {
        use burstyd_common::burst::PATH_INVALID;
        let mut h = Harness::new();
        h.set_fn_table(&[(0x40_1000, CLONE_LO + 0x900)]);
        h.set_table(&table(4));
        h.loc_mut().path = 5;
        assert_eq!(lookup_fn(&mut h, 0x40_1000), CLONE_LO + 0x900);
        assert_eq!(h.loc().path, 5);
        assert_eq!(lookup_fn(&mut h, 0x40_1010), CLONE_LO + 0x100 + 7);
        assert_eq!(h.loc().path, PATH_INVALID);
        h.loc_mut().path = 5;
        for k in misses(4) {
            assert_eq!(lookup_fn(&mut h, k), k);
        }
        assert_eq!(h.loc().path, 5);
        // Not the burst's thread: the clone, its registers untouched.
        h.loc_mut().owner = 0;
        assert_eq!(lookup_fn(&mut h, 0x40_1020), CLONE_LO + 0x200 + 7);
        assert_eq!(h.loc().path, 5);
    }
}
