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

    /// A truncated edge: a back edge, or a retreating edge of an
    /// irreducible region. Every one has a check in the clones.
    ///
    /// The paper's reductions (no checks on back edges of k-boring loops,
    /// entry checks only on the set C) lower the cost of its *checking
    /// code*, which runs all the time. Here the checking code is the
    /// original code and has no checks at all; checks exist only in the
    /// clones, which run only during bursts, so every back edge and entry
    /// gets one and a burst is bounded by `--burst` checks even inside a
    /// long loop without calls.
    fn is_checked_back_edge(&self, b: usize, idx: usize) -> bool {
        // Both sorted.
        self.loops
            .retreating_non_back
            .binary_search(&(b, idx))
            .is_ok()
            || self.loops.back_edges.binary_search(&(b, idx)).is_ok()
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
