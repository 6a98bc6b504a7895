//! Where the stack pointer is at every instruction of the generated code,
//! relative to a point of the original program whose unwind row is known:
//! what the clones' `.eh_frame` needs inside the snippets between copied
//! instructions ([`super::unwind_info`]), and in the runtime's routines.
//!
//! A copied instruction runs with the original's stack, so its height is
//! `(its original address, 0)`; so is every other point where execution
//! enters a clone with the original's registers (a function's entry, a
//! call's return site, where a burst may start). From those roots the
//! analysis follows control flow through the decoded bytes, instruction by
//! instruction: `push`/`pop`/`pushf`/`popf` move the stack by 8, `lea rsp,
//! [rsp + d]` and `add`/`sub rsp, imm` by their amount, a `call` returns
//! with the stack where it was (the routines it reaches are balanced), and
//! branches carry the height to their targets inside the range. Anything
//! else that writes `rsp` (a `mov rsp`, `leave`, `pop rsp`), or two paths
//! that meet with different heights, makes the height unknown from there
//! on -- until the next root. Targets outside the range (the original
//! code, another clone's entry, the runtime) are roots of their own.
use std::collections::HashMap;
use std::ops::Range;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, OpKind, Register,
};

/// The stack at an instruction: `rsp` is `delta` bytes above where it was
/// at the start of the original instruction `anchor` (negative: below), on
/// every path that reaches it; all other registers are as there, or saved
/// by the snippet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Height {
    pub(crate) anchor: u64,
    pub(crate) delta: i64,
}

/// What the analysis knows before one instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Known(Height),
    /// Reached, but `rsp` is not a known offset (see the module's text).
    Unknown,
}

/// The instructions reached from the roots, sorted by address: `(address,
/// length, state before it)`.
pub(crate) type Heights = Vec<(u64, u8, State)>;

/// Follows control flow from `roots` (address, height there) through
/// `code`, which lies at `range.start`; instructions outside `range` are
/// not followed.
pub(crate) fn analyse(code: &[u8], range: Range<u64>, roots: &[(u64, Height)]) -> Heights {
    let root_at: HashMap<u64, Height> = roots.iter().copied().collect();
    // By offset in `code`: the instruction's length and state once reached.
    let mut seen: Vec<Option<(u8, State)>> = vec![None; code.len()];
    let mut work: Vec<(u64, State)> = roots.iter().map(|&(a, h)| (a, State::Known(h))).collect();
    let mut info = InstructionInfoFactory::new();
    while let Some((at, incoming)) = work.pop() {
        if !range.contains(&at) {
            continue;
        }
        let off = (at - range.start) as usize;
        // A root's height is its own, whatever flows into it.
        let state = root_at.get(&at).map_or(incoming, |&h| State::Known(h));
        let state = match seen[off] {
            Some((_, old)) if old == state || old == State::Unknown => continue,
            // Another anchor at the same stack: either row holds.
            Some((_, State::Known(old))) if matches!(state, State::Known(h) if h.delta == old.delta) =>
            {
                continue;
            }
            Some(_) => State::Unknown,
            None => state,
        };
        let i = Decoder::with_ip(64, &code[off..], at, DecoderOptions::NONE).decode();
        if i.is_invalid() {
            continue;
        }
        seen[off] = Some((i.len() as u8, state));
        let after = match state {
            State::Known(h) => match moves(&i, &mut info) {
                Some(by) => State::Known(Height {
                    anchor: h.anchor,
                    delta: h.delta + by,
                }),
                None => State::Unknown,
            },
            State::Unknown => State::Unknown,
        };
        let next = i.next_ip();
        match i.flow_control() {
            FlowControl::Next
            | FlowControl::Call
            | FlowControl::IndirectCall
            | FlowControl::Interrupt
            | FlowControl::XbeginXabortXend => work.push((next, after)),
            FlowControl::ConditionalBranch => {
                work.push((next, after));
                if is_near(&i) {
                    work.push((i.near_branch_target(), after));
                }
            }
            FlowControl::UnconditionalBranch => {
                if is_near(&i) {
                    work.push((i.near_branch_target(), after));
                }
            }
            FlowControl::IndirectBranch | FlowControl::Return | FlowControl::Exception => {}
        }
    }
    seen.into_iter()
        .enumerate()
        .filter_map(|(off, e)| e.map(|(len, s)| (range.start + off as u64, len, s)))
        .collect()
}

fn is_near(i: &Instruction) -> bool {
    matches!(
        i.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    )
}

/// By how much `i` moves `rsp` for the instruction after it (a call: once
/// it returned), or `None` when not by a constant.
fn moves(i: &Instruction, info: &mut InstructionInfoFactory) -> Option<i64> {
    match i.flow_control() {
        FlowControl::Call | FlowControl::IndirectCall => return Some(0),
        _ => {}
    }
    if matches!(i.mnemonic(), Mnemonic::Enter | Mnemonic::Leave) {
        return None;
    }
    let writes_rsp_explicitly = (0..i.op_count()).any(|k| {
        i.op_kind(k) == OpKind::Register && i.op_register(k).full_register() == Register::RSP
    }) && info.info(i).used_registers().iter().any(|u| {
        u.register().full_register() == Register::RSP
            && matches!(
                u.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
    });
    let implicit = i64::from(i.stack_pointer_increment());
    if !writes_rsp_explicitly {
        return Some(implicit);
    }
    // `push rsp` reads it; `pop rsp` loads it.
    if implicit != 0 {
        return (i.mnemonic() == Mnemonic::Push).then_some(implicit);
    }
    match i.code() {
        Code::Lea_r64_m
            if i.op0_register() == Register::RSP
                && i.memory_base() == Register::RSP
                && i.memory_index() == Register::None =>
        {
            Some(i.memory_displacement64() as i64)
        }
        Code::Add_rm64_imm8 | Code::Add_rm64_imm32 if i.op0_register() == Register::RSP => {
            Some(i.immediate(1) as i64)
        }
        Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 if i.op0_register() == Register::RSP => {
            Some(-(i.immediate(1) as i64))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use iced_x86::code_asm::*;

    use super::*;

    const AT: u64 = 0x10_0000;

    fn assemble(f: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>) -> Vec<u8> {
        let mut a = CodeAssembler::new(64).unwrap();
        f(&mut a).unwrap();
        a.assemble(AT).unwrap()
    }

    fn deltas(code: &[u8], roots: &[(u64, Height)]) -> Vec<Option<i64>> {
        analyse(code, AT..AT + code.len() as u64, roots)
            .into_iter()
            .map(|(_, _, s)| match s {
                State::Known(h) => Some(h.delta),
                State::Unknown => None,
            })
            .collect()
    }

    fn root(anchor: u64) -> Height {
        Height { anchor, delta: 0 }
    }

    /// The standard frame around a routine call: every instruction's
    /// height, the call's return balanced, the jump back to the original
    /// not followed.
    #[test]
    fn a_snippet_s_pushes_and_pops_are_followed() {
        let code = assemble(|a| {
            a.lea(rsp, ptr(rsp - 128))?;
            a.pushfq()?;
            a.push(rax)?;
            a.mov(eax, 7)?;
            a.call(0x20_0000u64)?;
            a.pop(rax)?;
            a.popfq()?;
            a.lea(rsp, ptr(rsp + 128))?;
            a.add(rsp, 8)?;
            a.sub(rsp, 24)?;
            a.jmp(0x30_0000u64)
        });
        assert_eq!(
            deltas(&code, &[(AT, root(0x40_1000))]),
            [0, -128, -136, -144, -144, -144, -136, -128, 0, 8, -16]
                .map(Some)
                .to_vec()
        );
    }

    /// Branches carry the height to their targets; paths that meet with
    /// different heights make it unknown until the next root, and writes
    /// of `rsp` by anything but a constant make it unknown.
    #[test]
    fn branches_merges_and_unknown_writes() {
        let code = assemble(|a| {
            let mut other = a.create_label();
            let mut join = a.create_label();
            let mut next_root = a.create_label();
            a.push(rax)?; // 0
            a.je(other)?; // -8
            a.push(rcx)?; // -8
            a.jmp(join)?; // -16
            a.set_label(&mut other)?;
            a.nop()?; // -8
            a.set_label(&mut join)?;
            a.nop()?; // -16 and -8 meet: unknown
            a.nop()?; // unknown
            a.set_label(&mut next_root)?;
            a.mov(rsp, rbp)?; // root: 0
            a.nop()?; // unknown
            a.ret()
        });
        let root2 = Decoder::with_ip(64, &code, AT, DecoderOptions::NONE)
            .iter()
            .find(|i| i.code() == Code::Mov_r64_rm64 || i.code() == Code::Mov_rm64_r64)
            .unwrap()
            .ip();
        assert_eq!(
            deltas(&code, &[(AT, root(1)), (root2, root(2))]),
            [
                Some(0),
                Some(-8),
                Some(-8),
                Some(-16),
                Some(-8),
                None,
                None,
                Some(0),
                None,
                None
            ]
        );
    }
}
