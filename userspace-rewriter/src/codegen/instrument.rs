//! The instrumentation proper: Ball-Larus path-register increments on DAG
//! edges, path records and restarts on truncated (back) edges (PEP
//! §3.1-3.3), the burst-budget checks of Hirzel & Chilimbi (entries, back
//! edges, return sites), and the standard frame around runtime calls.

use iced_x86::{Code, IcedError, Instruction, MemoryOperand, Register};

use super::emitter::{Emitter, Tag, rip};
use super::function::{FnGen, OutOfLine, Skip};
use super::layout::Layout;

impl FnGen<'_> {
    /// Whether edge `(b, idx)` needs code (an increment or a truncation).
    pub(super) fn edge_needs_code(&self, b: usize, idx: usize) -> bool {
        if self.is_checked_back_edge(b, idx) {
            return true;
        }
        let Some(n) = self.numbering else {
            return false;
        };
        n.back_edge(b, idx).is_some() || n.increment(b, idx).is_some_and(|v| v != 0)
    }

    /// A truncated edge: a back edge, a retreating edge of an irreducible
    /// region, or an edge the numbering cut to keep a function's paths
    /// under `MAX_PATHS` (`number_paths_cutting`: no cycle needs it, but
    /// a path ends there). Every one has a check in the clones, so every
    /// path record at a truncated edge is a check: a burst of `--burst`
    /// checks holds at most that many of them (bzip2's `sendMTFValues`,
    /// cut after each of its 50 inlined `bsW`, recorded ~40 paths per
    /// check), and the daemon, which counts a burst's checks by its
    /// ENTER and PATH records (`bursts/counts.rs`), counts right.
    ///
    /// The paper's reductions (no checks on back edges of k-boring loops,
    /// entry checks only on the set C) lower the cost of its *checking
    /// code*, which runs all the time. Here the checking code is the
    /// original code and has no checks at all; checks exist only in the
    /// clones, which run only during bursts, so every back edge and entry
    /// gets one and a burst is bounded by `--burst` checks even inside a
    /// long loop without calls.
    fn is_checked_back_edge(&self, b: usize, idx: usize) -> bool {
        // The loops' lists are sorted. The numbering's truncated edges are
        // theirs (out of reachable blocks) and the cut ones.
        self.loops
            .retreating_non_back
            .binary_search(&(b, idx))
            .is_ok()
            || self.loops.back_edges.binary_search(&(b, idx)).is_ok()
            || self
                .numbering
                .is_some_and(|n| n.back_edge(b, idx).is_some())
    }

    /// The code on edge `(b, idx)`: an increment (then the caller jumps to
    /// the target block), or for a truncated edge the path end, then a jump
    /// to the target's shared [`OutOfLine::Tail`] (restart, check), which
    /// is returned.
    pub(super) fn edge_code(&mut self, b: usize, idx: usize) -> Result<Option<u64>, Skip> {
        let e = self.out_edges(b).nth(idx).unwrap().1;
        let first = self.block_first(e.to);
        let flags = self.flags_live(first);
        let check = self.is_checked_back_edge(b, idx);
        let mut restart = None;
        if let Some(n) = self.numbering {
            if let Some(a) = n.back_edge(b, idx) {
                let end_inc = a.end_increment;
                restart = Some(a.restart);
                self.stats.path_records += 1;
                self.path_end(end_inc)?;
            } else if let Some(inc) = n.increment(b, idx).filter(|&v| v != 0) {
                self.stats.edge_increments += 1;
                self.increment(inc, flags)?;
            }
        }
        if restart.is_none() && !check {
            return Ok(None);
        }
        let key = (e.to, restart.is_some(), check);
        if let Some(&l) = self.tails.get(&key) {
            return Ok(Some(l));
        }
        let l = self.em.label();
        self.tails.insert(key, l);
        self.out_of_line.push((
            l,
            OutOfLine::Tail {
                to: e.to,
                restart,
                check,
            },
        ));
        Ok(Some(l))
    }

    /// The record of a path ending at a truncated edge, `end_inc` added
    /// (`rt_back_at` in its own frame, or `rt_back` from the standard one
    /// for an increment beyond imm32).
    fn path_end(&mut self, end_inc: u64) -> Result<(), Skip> {
        if end_inc > i32::MAX as u64 || self.fid > i32::MAX as u32 {
            let l = *self.layout;
            return self.rt_call_fid(self.rt.back, 0, None, |em| add_path(em, &l, end_inc));
        }
        let em = &mut *self.em;
        em.lea_rsp(-128)?;
        em.e(Instruction::with1(Code::Pushq_imm32, end_inc as i32))?;
        em.e(Instruction::with1(Code::Pushq_imm32, self.fid as i32))?;
        em.tag_last(Tag::Fid);
        em.call(self.rt.back_at)?;
        em.lea_rsp(128 + 16)?;
        Ok(())
    }

    /// `path += inc`, preserving flags when live.
    fn increment(&mut self, inc: u64, flags: bool) -> Result<(), Skip> {
        let em = &mut *self.em;
        if !flags && inc <= i32::MAX as u64 {
            em.e(Instruction::with2(
                Code::Add_rm64_imm32,
                rip(local!(self.layout, path)),
                inc as u32 as i32,
            ))?;
            return Ok(());
        }
        em.lea_rsp(-128)?;
        if flags {
            em.pushf();
        }
        add_path(em, self.layout, inc)?;
        if flags {
            em.popf();
        }
        em.lea_rsp(128)?;
        Ok(())
    }

    /// `path = v` (a `mov`, flags untouched).
    pub(super) fn set_path(&mut self, v: u64, _flags: bool) -> Result<(), Skip> {
        let em = &mut *self.em;
        if v <= i32::MAX as u64 {
            em.e(Instruction::with2(
                Code::Mov_rm64_imm32,
                rip(local!(self.layout, path)),
                v as u32 as i32,
            ))?;
        } else {
            em.lea_rsp(-128)?;
            em.push(Register::RAX)?;
            em.mov_imm(Register::RAX, v)?;
            em.mr(Code::Mov_rm64_r64, local!(self.layout, path), Register::RAX)?;
            em.pop(Register::RAX)?;
            em.lea_rsp(128)?;
        }
        Ok(())
    }

    /// A budget check; failing it continues at `orig` in the original code.
    pub(super) fn check(&mut self, flags: bool, orig: u64) -> Result<(), Skip> {
        self.stats.checks += 1;
        let (exit, expire) = match self.check_exits.get(&(flags, orig)) {
            Some(&labels) => labels,
            None => {
                let (exit, expire) = (self.em.label(), self.em.label());
                self.check_exits.insert((flags, orig), (exit, expire));
                self.out_of_line
                    .push((exit, OutOfLine::CheckExit { flags, orig }));
                self.out_of_line
                    .push((expire, OutOfLine::CheckExpire { exit }));
                (exit, expire)
            }
        };
        let l = self.layout;
        let em = &mut *self.em;
        em.lea_rsp(-128)?;
        if flags {
            em.pushf();
        }
        em.push(Register::RAX)?;
        // The thread owns a burst: its TCB's slot (0: none) is owned by its
        // `fs:[0]` (a forked child's private slot reads 0).
        em.rm(Code::Mov_r64_rm64, Register::RAX, local!(l, slot))?;
        em.e(Instruction::with2(
            Code::Test_rm64_r64,
            Register::RAX,
            Register::RAX,
        ))?;
        em.jcc(Code::Je_rel32_64, exit)?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RAX,
            MemoryOperand::with_base_displ(
                Register::RAX,
                core::mem::offset_of!(burstyd_common::burst::BurstSlot, owner) as i64,
            ),
        ))?;
        em.e(Instruction::with2(
            Code::Cmp_r64_rm64,
            Register::RAX,
            MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS),
        ))?;
        em.jcc(Code::Jne_rel32_64, exit)?;
        em.e(Instruction::with2(
            Code::Sub_rm64_imm8,
            rip(local!(l, budget)),
            1,
        ))?;
        em.jcc(Code::Je_rel32_64, expire)?;
        em.pop(Register::RAX)?;
        if flags {
            em.popf();
        }
        em.lea_rsp(128)?;
        Ok(())
    }

    /// A runtime call in the standard frame ([`call_routine`]).
    pub(super) fn rt_call(
        &mut self,
        routine: u64,
        arg: u32,
        arg2: Option<u32>,
        pre: impl FnOnce(&mut Emitter) -> Result<(), IcedError>,
    ) -> Result<(), Skip> {
        Ok(call_routine(self.em, routine, Arg::Const(arg), arg2, pre)?)
    }

    /// [`Self::rt_call`] whose first argument is this function's `fid`
    /// with `flags` or'ed in.
    pub(super) fn rt_call_fid(
        &mut self,
        routine: u64,
        flags: u32,
        arg2: Option<u32>,
        pre: impl FnOnce(&mut Emitter) -> Result<(), IcedError>,
    ) -> Result<(), Skip> {
        let arg = Arg::Fid(self.fid | flags);
        Ok(call_routine(self.em, routine, arg, arg2, pre)?)
    }
}

/// The first argument of a runtime call: a constant, or a `fid` (which a
/// cached image's relocation adjusts).
#[derive(Clone, Copy)]
pub(super) enum Arg {
    Const(u32),
    Fid(u32),
    /// `pre` sets `rax` itself.
    Preset,
}

/// A runtime call in the standard frame: `eax = arg`, `ecx = arg2`; `pre`
/// runs inside the frame (flags and rax, rcx, rdx saved).
pub(super) fn call_routine(
    em: &mut Emitter,
    routine: u64,
    arg: Arg,
    arg2: Option<u32>,
    pre: impl FnOnce(&mut Emitter) -> Result<(), IcedError>,
) -> Result<(), IcedError> {
    em.lea_rsp(-128)?;
    em.pushf();
    em.push(Register::RAX)?;
    em.push(Register::RCX)?;
    em.push(Register::RDX)?;
    pre(em)?;
    match arg {
        Arg::Const(v) => em.mov_imm(Register::RAX, u64::from(v))?,
        Arg::Fid(v) => {
            // Always the imm32 form, whatever the value.
            em.e(Instruction::with2(Code::Mov_r32_imm32, Register::EAX, v))?;
            em.tag_last(Tag::Fid);
        }
        Arg::Preset => {}
    }
    if let Some(a2) = arg2 {
        em.mov_imm(Register::RCX, u64::from(a2))?;
    }
    em.call(routine)?;
    em.pop(Register::RDX)?;
    em.pop(Register::RCX)?;
    em.pop(Register::RAX)?;
    em.popf();
    em.lea_rsp(128)
}

/// `add [path], v` inside a frame where flags may be clobbered and rax is
/// saved (for values that do not fit an imm32, rax is used).
pub(super) fn add_path(em: &mut Emitter, l: &Layout, v: u64) -> Result<(), IcedError> {
    if v <= i32::MAX as u64 {
        em.e(Instruction::with2(
            Code::Add_rm64_imm32,
            rip(local!(l, path)),
            v as u32 as i32,
        ))
    } else {
        em.push(Register::RAX)?;
        em.mov_imm(Register::RAX, v)?;
        em.mr(Code::Add_rm64_r64, local!(l, path), Register::RAX)?;
        em.pop(Register::RAX)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use burstyd_common::burst::{BurstRegs, TLS_REGS};
    use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, OpKind, Register};

    use super::super::{Layout, generate, runtime};
    use crate::analysis::plan::{FunctionStatus, PlanOptions, analyze_with_insns};

    /// bzip2's `sendMTFValues` in small: an outer loop around 64 inlined
    /// copies of a bit writer, each with a small flushing loop. Over 2^62
    /// paths, so the numbering cuts edges (path ends in no loop).
    const SEND: &str = r#"
typedef struct { unsigned char *out; int n; unsigned live, buf; } S;
static inline __attribute__((always_inline)) void w(S *s, int n, unsigned v) {
    while (s->live >= 8) {
        s->out[s->n++] = (unsigned char)(s->buf >> 24);
        s->buf <<= 8;
        s->live -= 8;
    }
    s->buf |= v << (32 - s->live - n);
    s->live += n;
}
#define W(k) w(s, len[sel[i + (k)]], code[sel[i + (k)]]);
#define W4(k) W(k) W(k + 1) W(k + 2) W(k + 3)
#define W16(k) W4(k) W4(k + 4) W4(k + 8) W4(k + 12)
__attribute__((noinline)) void send(S *s, const unsigned char *sel,
                                    const int *len, const unsigned *code, int n) {
    for (int i = 0; i < n; i += 64) {
        W16(0) W16(16) W16(32) W16(48)
    }
}
int main(int argc, char **argv) {
    static unsigned char out[1 << 16], sel[1 << 12];
    static int len[256];
    static unsigned code[256];
    for (int i = 0; i < 256; i++) { len[i] = 1 + (i * argc) % 17; code[i] = i; }
    for (int i = 0; i < (1 << 12); i++) sel[i] = (unsigned char)(i * 7 + argc);
    S s = { out, 0, 0, 0 };
    send(&s, sel, len, code, (1 << 12) - 64);
    return s.n > 0 && argv[0][0] == 0;
}
"#;

    /// `SEND` built with gcc -O2 (`None` without gcc).
    fn send_fixture() -> Option<Vec<u8>> {
        let dir = std::env::temp_dir().join(format!(
            "instrument-fixture-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, out) = (dir.join("send.c"), dir.join("send"));
        std::fs::write(&src, SEND).unwrap();
        let status = std::process::Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&out)
            .arg(&src)
            .status();
        let data = match status {
            Ok(s) if s.success() => Some(std::fs::read(&out).unwrap()),
            Ok(s) => panic!("gcc failed: {s}"),
            Err(_) => None,
        };
        let _ = std::fs::remove_dir_all(&dir);
        data
    }

    /// Whether `i` is a check's budget decrement.
    fn is_budget_decrement(i: &Instruction) -> bool {
        let budget = u64::from(TLS_REGS) + core::mem::offset_of!(BurstRegs, budget) as u64;
        i.code() == Code::Sub_rm64_imm8
            && i.op0_kind() == OpKind::Memory
            && i.memory_segment() == Register::FS
            && i.memory_displacement64() == budget
            && i.immediate8() == 1
    }

    /// Clones every function of `data` and follows every path record at a
    /// truncated edge (a call of `rt_back_at` or `rt_back`) to the cloned
    /// code it goes on to: each must pass a budget check on the way.
    /// Returns (path ends seen, cut edges in the plan).
    fn path_ends_checked(data: &[u8]) -> (usize, usize) {
        let (report, analysis) = analyze_with_insns(data, &PlanOptions::default()).unwrap();
        let plan = &report.plan;
        let cut: usize = plan
            .functions
            .iter()
            .filter_map(|f| match &f.status {
                FunctionStatus::Analyzed(fa) => Some(fa.cut_edges),
                _ => None,
            })
            .sum();
        let bias = if plan.pie { 0x5555_5555_4000 } else { 0 };
        let layout = Layout {
            bias,
            control: bias + 0x4000_0000,
            code: bias + 0x4001_0000,
            fid_base: 0,
        };
        let img = generate(plan, &analysis, &layout).unwrap();
        let rt = runtime::assemble(layout.control, layout.code).unwrap();
        let (lo, hi) = img.code_range;
        let decode = |ip: u64| {
            let off = (ip - layout.code) as usize;
            Decoder::with_ip(64, &img.bytes[off..], ip, DecoderOptions::NONE).decode()
        };
        // The clones of original instructions; every stub is reached
        // from them by direct jumps.
        let cloned: HashSet<u64> = img.table().iter().map(|&(_, c)| c).collect();
        let mut work: Vec<u64> = cloned.iter().copied().collect();
        let mut seen = HashSet::new();
        let mut ends = Vec::new();
        while let Some(mut ip) = work.pop() {
            while (lo..hi).contains(&ip) && seen.insert(ip) {
                let i = decode(ip);
                assert_ne!(i.code(), Code::INVALID, "{ip:#x}");
                match i.flow_control() {
                    FlowControl::Call => {
                        let t = i.near_branch_target();
                        if t == rt.back_at || t == rt.back {
                            ends.push(i.next_ip());
                        }
                    }
                    FlowControl::ConditionalBranch => work.push(i.near_branch_target()),
                    FlowControl::UnconditionalBranch => {
                        work.push(i.near_branch_target());
                        break;
                    }
                    FlowControl::IndirectBranch | FlowControl::Return => break,
                    _ => {}
                }
                ip = i.next_ip();
            }
        }
        let mut unchecked = Vec::new();
        for &end in &ends {
            let mut ip = end;
            let checked = loop {
                if cloned.contains(&ip) || !(lo..hi).contains(&ip) {
                    break false;
                }
                let i = decode(ip);
                if is_budget_decrement(&i) {
                    break true;
                }
                ip = match i.flow_control() {
                    FlowControl::UnconditionalBranch => i.near_branch_target(),
                    FlowControl::Next | FlowControl::ConditionalBranch | FlowControl::Call => {
                        i.next_ip()
                    }
                    _ => break false,
                };
            };
            if !checked {
                unchecked.push(end);
            }
        }
        assert!(
            unchecked.is_empty(),
            "{} of {} path ends at truncated edges pass no budget check, e.g. after {:#x?}",
            unchecked.len(),
            ends.len(),
            &unchecked[..unchecked.len().min(5)]
        );
        (ends.len(), cut)
    }

    /// Every path that ends at a truncated edge ends with a budget check,
    /// the edges the numbering cut too (bzip2's `sendMTFValues` recorded
    /// ~40 paths per check without): a burst of B checks holds at most B
    /// such records.
    #[test]
    fn every_truncated_edge_is_checked() {
        let Some(data) = send_fixture() else {
            eprintln!("gcc not available, skipping");
            return;
        };
        let (ends, cut) = path_ends_checked(&data);
        assert!(cut > 0, "the fixture has no cut edges");
        assert!(ends > cut, "{ends} path ends, {cut} cut edges");
        // Real ones where they are: bzip2 of scripts/realprogs.sh (its
        // BZ2_compressBlock has 150 cut edges), the system's libbz2.
        let realprogs = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/realprogs/bin/bzip2");
        for lib in [
            realprogs,
            "/lib/x86_64-linux-gnu/libbz2.so.1.0",
            "/usr/lib64/libbz2.so.1",
        ] {
            if let Ok(data) = std::fs::read(lib) {
                let (ends, cut) = path_ends_checked(&data);
                eprintln!("{lib}: {ends} path ends, {cut} cut edges");
            }
        }
    }
}
