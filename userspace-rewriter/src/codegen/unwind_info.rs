//! Unwind information for the clones (`.eh_frame` made with gimli::write).
//!
//! A clone executes the original's instructions with the original's stack
//! layout at every instruction it copies; only inside the snippets between
//! them does `rsp` move (and no snippet calls anything that could unwind).
//! So the CFI row at a copied instruction is the original's row there, and
//! inside a snippet it is the row of the original instruction the snippet
//! stands for, with a CFA of `rsp + k` moved by how far the snippet has
//! moved `rsp` (`codegen/stack_heights.rs`: `lea rsp, [rsp - 128]` and three
//! pushes make it `rsp + k + 152`). A sample, a signal or a debugger that
//! stops a thread anywhere in the clones unwinds as if it were at that
//! original instruction. The runtime's routines get FDEs of their own (the
//! return address on top at entry, moved by their pushes). The clones'
//! frames are then unwindable by C++ exceptions, `backtrace()`, debuggers
//! and burstyd's own unwinder once the table is registered
//! (`__register_frame`).
//!
//! Where the height is unknown (after the stack is realigned, until the
//! next copy) or cannot move the row (a CFA computed by an expression),
//! the instruction keeps the row before it, as every snippet instruction
//! did before heights were followed.
//!
//! The price is size: a row per instruction that moves `rsp`, about 3
//! bytes each. libcrypto's clones had 751 KB of `.eh_frame` with rows at
//! copies only and have 6.9 MB with them (3.1 million instructions with a
//! row, made in 0.75 s).
//!
//! DWARF expressions are restated as they are when they read registers and
//! memory only (OpenSSL's assembly realigns its stack and finds the CFA
//! through a saved `rsp`: `DW_OP_breg7 N; DW_OP_deref; DW_OP_plus_uconst
//! 8`), since the registers and the stack at a copied instruction are the
//! original's. Functions whose CFI uses anything else (the pc, `rip`, an
//! address, a branch inside the expression) cannot be restated this way;
//! [`untranslatable`] lists them so the generator leaves them out.
//!
//! Only the executable's table is registered in the target, in the
//! attach's one ptrace stop; the libraries' clones are written later
//! without stopping the program, so without a call in it, and stay
//! unregistered. That costs little: calls in the clones push original
//! return addresses, so an exception or a `backtrace()` that starts in
//! ordinary code never meets a clone pc; only an unwinder that starts at a
//! library clone's pc (a signal handler that interrupted a burst in libc,
//! asynchronous cancellation) needs them. burstyd's own unwinder reads the
//! clones' `.eh_frame` directly. A process with landing pads and no
//! reachable `__register_frame` is not traced in bursts.
use std::collections::{BTreeSet, HashMap};

use gimli::write::{
    Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec, Expression,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{CfaRule, Encoding, Format, LittleEndian, Register, RegisterRule, X86_64};

use super::stack_heights::{self, Height, State};
use crate::codegen::CloneImage;
use crate::progress::Stage;

/// Row rules we can restate: CFA = register + offset, or a position
/// independent expression; registers undefined, same value, saved at
/// CFA+n, CFA+n, in another register, or at (or equal to) a position
/// independent expression.
type Row = (u64, Cfa, Vec<(Register, Rule)>);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Cfa {
    RegisterOffset(Register, i64),
    Expression(Vec<u8>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    Undefined,
    SameValue,
    Offset(i64),
    ValOffset(i64),
    Register(Register),
    Expression(Vec<u8>),
    ValExpression(Vec<u8>),
}

/// The bytes of a CFI expression whose value is the same at a copied
/// instruction of a clone as at the original: it reads registers other
/// than `rip` and memory, and computes; nothing else (an address, the
/// pc, a branch or call inside the expression) is accepted.
fn position_independent(
    eh: &crate::analysis::cfg::EhFrameInfo,
    e: &gimli::UnwindExpression<usize>,
) -> Result<Vec<u8>, ()> {
    use gimli::Operation as Op;
    let expr = e.get(&eh.section).map_err(|_| ())?;
    let bytes = expr.0.slice().to_vec();
    let encoding = Encoding {
        address_size: 8,
        format: Format::Dwarf32,
        version: 4,
    };
    let mut input = expr.0;
    while !gimli::Reader::is_empty(&input) {
        let op = Op::parse(&mut input, encoding).map_err(|_| ())?;
        let ok = match op {
            Op::Register { register } | Op::RegisterOffset { register, .. } => {
                register != X86_64::RA
            }
            Op::Deref { space: false, .. }
            | Op::Drop
            | Op::Pick { .. }
            | Op::Swap
            | Op::Rot
            | Op::Abs
            | Op::And
            | Op::Div
            | Op::Minus
            | Op::Mod
            | Op::Mul
            | Op::Neg
            | Op::Not
            | Op::Or
            | Op::Plus
            | Op::PlusConstant { .. }
            | Op::Shl
            | Op::Shr
            | Op::Shra
            | Op::Xor
            | Op::Eq
            | Op::Ge
            | Op::Gt
            | Op::Le
            | Op::Lt
            | Op::Ne
            | Op::UnsignedConstant { .. }
            | Op::SignedConstant { .. }
            | Op::Nop => true,
            _ => false,
        };
        if !ok {
            return Err(());
        }
    }
    Ok(bytes)
}

/// The rows of the FDE covering `svma`, or `Err(())` when a rule is not
/// restatable; `Ok(None)` without an FDE.
fn rows(
    eh: &crate::analysis::cfg::EhFrameInfo,
    svma: u64,
) -> Result<Option<(u64, u64, Vec<Row>)>, ()> {
    let i = eh.fdes.partition_point(|f| f.initial_address() <= svma);
    if i == 0 {
        return Ok(None);
    }
    let fde = &eh.fdes[i - 1];
    if svma >= fde.initial_address() + fde.len() {
        return Ok(None);
    }
    let mut ctx = gimli::UnwindContext::new();
    let mut table = fde.rows(&eh.section, &eh.bases, &mut ctx).map_err(|_| ())?;
    let mut out = Vec::new();
    while let Some(row) = table.next_row().map_err(|_| ())? {
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                Cfa::RegisterOffset(*register, *offset)
            }
            CfaRule::Expression(e) => Cfa::Expression(position_independent(eh, e)?),
        };
        let mut regs = Vec::new();
        for (r, rule) in row.registers() {
            let rule = match rule {
                RegisterRule::Undefined => Rule::Undefined,
                RegisterRule::SameValue => Rule::SameValue,
                RegisterRule::Offset(n) => Rule::Offset(*n),
                RegisterRule::ValOffset(n) => Rule::ValOffset(*n),
                RegisterRule::Register(o) => Rule::Register(*o),
                RegisterRule::Expression(e) => Rule::Expression(position_independent(eh, e)?),
                RegisterRule::ValExpression(e) => Rule::ValExpression(position_independent(eh, e)?),
                _ => return Err(()),
            };
            regs.push((*r, rule));
        }
        regs.sort_by_key(|(r, _)| r.0);
        out.push((row.start_address(), cfa, regs));
    }
    Ok(Some((
        fde.initial_address(),
        fde.initial_address() + fde.len(),
        out,
    )))
}

/// Function starts (SVMAs) whose CFI cannot be restated for a clone.
pub fn untranslatable(data: &[u8], starts: impl IntoIterator<Item = u64>) -> BTreeSet<u64> {
    let Ok(file) = object::File::parse(data) else {
        return BTreeSet::new();
    };
    let Some(eh) = crate::analysis::cfg::parse_eh_frame(&file) else {
        return BTreeSet::new();
    };
    starts
        .into_iter()
        .filter(|&s| rows(&eh, s).is_err())
        .collect()
}

/// What [`eh_frame`] produced.
#[derive(Debug, Default)]
pub struct CloneUnwind {
    /// `.eh_frame` bytes (CIE, one FDE per clone and per run of the
    /// runtime's routines, zero terminator), with absolute FDE addresses:
    /// position independent.
    pub bytes: Vec<u8>,
    pub fdes: usize,
    /// Clones whose original has no FDE (no unwinding through either).
    without_cfi: usize,
    /// Instructions of the clones with a row of their own: copies, and
    /// the snippets' instructions at a known stack height.
    pub rows_known: usize,
    /// Instructions of the clones reached at no known stack height (or
    /// whose row cannot be moved: a CFA computed by an expression), which
    /// keep the row before them.
    pub rows_unknown: usize,
}

/// A row as the clone states it: the CFA rule and the register rules.
type Rules = (Cfa, Vec<(Register, Rule)>);

/// The row of `row` where `rsp` is `delta` bytes above where it was: a
/// CFA of `rsp + k` becomes `rsp + k - delta`; rules relative to the CFA
/// stay. `None` when that cannot be said: a CFA or a register computed by
/// an expression (it may read `rsp`), a register kept in `rsp`, or a
/// negative CFA offset that is not a multiple of 8 (`DW_CFA_def_cfa_sf`
/// factors it by the CIE's -8).
fn moved(row: &Row, delta: i64) -> Option<Rules> {
    if delta == 0 {
        return Some((row.1.clone(), row.2.clone()));
    }
    let cfa = match row.1 {
        Cfa::RegisterOffset(r, k) if r == X86_64::RSP => {
            let k = k - delta;
            if k < 0 && k % 8 != 0 {
                return None;
            }
            Cfa::RegisterOffset(r, k)
        }
        Cfa::RegisterOffset(r, k) => Cfa::RegisterOffset(r, k),
        Cfa::Expression(_) => return None,
    };
    let plain = row.2.iter().all(|(_, rule)| match rule {
        Rule::Expression(_) | Rule::ValExpression(_) => false,
        Rule::Register(r) => *r != X86_64::RSP,
        _ => true,
    });
    plain.then(|| (cfa, row.2.clone()))
}

/// The runtime's routines: every one is entered by a `call` and keeps its
/// frame with pushes and pops, so its row is the CIE's (CFA = `rsp + 8`,
/// the return address below it) moved by its stack height. One FDE per
/// run of instructions reached from the entries (the signal handler and
/// its restorer get none).
fn runtime_fdes(image: &CloneImage, frames: &mut FrameTable, cie: gimli::write::CieId) -> usize {
    let Ok(rt) = super::runtime::assemble(image.layout.control, image.layout.code) else {
        return 0;
    };
    let at = image.layout.code;
    let Some(code) = image.bytes.get(..rt.bytes.len()) else {
        return 0;
    };
    if code != rt.bytes.as_slice() {
        return 0;
    }
    let entry = Height {
        anchor: at,
        delta: 0,
    };
    let roots: Vec<(u64, Height)> = rt.routines().iter().map(|&r| (r, entry)).collect();
    let heights = stack_heights::analyse(code, at..at + code.len() as u64, &roots);
    let mut added = 0;
    let mut k = 0;
    while k < heights.len() {
        // A run: instructions that follow each other.
        let mut j = k + 1;
        while j < heights.len() && heights[j].0 == heights[j - 1].0 + u64::from(heights[j - 1].1) {
            j += 1;
        }
        let (lo, hi) = (heights[k].0, heights[j - 1].0 + u64::from(heights[j - 1].1));
        let mut fde = FrameDescriptionEntry::new(Address::Constant(lo), (hi - lo) as u32);
        let mut prev = Some(8);
        for &(a, _, state) in &heights[k..j] {
            let State::Known(h) = state else { continue };
            let offset = 8 - h.delta;
            if prev != Some(offset) && offset >= 0 {
                fde.add_instruction(
                    (a - lo) as u32,
                    CallFrameInstruction::CfaOffset(offset as i32),
                );
                prev = Some(offset);
            }
        }
        frames.add_fde(cie, fde);
        added += 1;
        k = j;
    }
    added
}

/// `.eh_frame` for every clone of `image` (made from the file `data`
/// loaded with `bias`), and for the runtime's routines.
///
/// At a copied instruction the row is the original's; inside a snippet it
/// is the row of the original instruction the snippet belongs to, moved
/// by how far the snippet has moved `rsp` there
/// (`codegen/stack_heights.rs`): a sample or a signal in a snippet unwinds
/// like one at that instruction.
pub fn eh_frame(data: &[u8], image: &CloneImage, bias: u64) -> Result<CloneUnwind, String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    let Some(eh) = crate::analysis::cfg::parse_eh_frame(&file) else {
        return Ok(CloneUnwind {
            bytes: vec![0; 4],
            fdes: 0,
            without_cfi: image.functions.len(),
            ..Default::default()
        });
    };
    let mut clones: Vec<(u64, u64, bool)> = image
        .functions
        .iter()
        .map(|f| (f.clone, f.orig, f.plt_stub_len().is_some()))
        .collect();
    clones.sort_unstable();
    // Where execution enters the clones with the original's stack: every
    // rewritten instruction, every function entry, every return site.
    let mut roots: Vec<(u64, Height)> = (0..3)
        .flat_map(|k| image.tables.table(k))
        .map(|&(orig, clone)| {
            (
                clone,
                Height {
                    anchor: orig,
                    delta: 0,
                },
            )
        })
        .collect();
    roots.sort_unstable_by_key(|r| r.0);
    let encoding = Encoding {
        address_size: 8,
        format: Format::Dwarf32,
        version: 1,
    };
    let mut cie = CommonInformationEntry::new(encoding, 1, -8, X86_64::RA);
    cie.add_instruction(CallFrameInstruction::Cfa(X86_64::RSP, 8));
    cie.add_instruction(CallFrameInstruction::Offset(X86_64::RA, -8));
    let mut frames = FrameTable::default();
    let cie_id = frames.add_cie(cie);
    let mut out = CloneUnwind {
        fdes: runtime_fdes(image, &mut frames, cie_id),
        ..Default::default()
    };
    for (k, &(cstart, orig, plt_stub)) in clones.iter().enumerate() {
        crate::progress::report(Stage::UnwindInfo, k, clones.len());
        let cend = clones.get(k + 1).map(|c| c.0).unwrap_or(image.code_range.1);
        if plt_stub {
            // A PLT stub's trampoline: the return address is on top where
            // a burst can start (the CIE's row), whatever the stub's own
            // FDE says (a lazy `.plt`'s reads `rip`).
            let fde = FrameDescriptionEntry::new(Address::Constant(cstart), (cend - cstart) as u32);
            frames.add_fde(cie_id, fde);
            out.fdes += 1;
            continue;
        }
        let svma = orig.wrapping_sub(bias);
        let Ok(Some(own)) = rows(&eh, svma) else {
            out.without_cfi += 1;
            continue;
        };
        let code = (cstart.checked_sub(image.layout.code))
            .and_then(|lo| {
                image
                    .bytes
                    .get(lo as usize..(cend - image.layout.code) as usize)
            })
            .ok_or_else(|| format!("the clone at {cstart:#x} is not in the image's bytes"))?;
        let lo = roots.partition_point(|r| r.0 < cstart);
        let hi = roots.partition_point(|r| r.0 < cend);
        let heights = stack_heights::analyse(code, cstart..cend, &roots[lo..hi]);
        // The rows of the FDEs anchors lie in: the function's own, and
        // (rarely) another's.
        let mut others = OtherFdes::new();
        let mut fde = FrameDescriptionEntry::new(Address::Constant(cstart), (cend - cstart) as u32);
        let mut prev: Option<Rules> = None;
        let mut prev_at = None;
        for &(at, _, state) in &heights {
            let State::Known(h) = state else {
                out.rows_unknown += 1;
                continue;
            };
            let Some(at_row) = anchor_row(&eh, &own, &mut others, h.anchor.wrapping_sub(bias))
            else {
                out.rows_unknown += 1;
                continue;
            };
            // Most instructions keep the row before them.
            if prev_at == Some((at_row, h.delta)) {
                out.rows_known += 1;
                continue;
            }
            let fde_rows = match at_row.0 {
                None => &own.2,
                Some(k) => &others[&k].as_ref().expect("found above").2,
            };
            let Some(row) = moved(&fde_rows[at_row.1], h.delta) else {
                out.rows_unknown += 1;
                continue;
            };
            out.rows_known += 1;
            prev_at = Some((at_row, h.delta));
            if prev.as_ref() != Some(&row) {
                add_row(&mut fde, (at - cstart) as u32, prev.as_ref(), &row);
                prev = Some(row);
            }
        }
        frames.add_fde(cie_id, fde);
        out.fdes += 1;
    }
    crate::progress::report(Stage::UnwindInfo, clones.len(), clones.len());
    let mut eh_out = EhFrame(EndianVec::new(LittleEndian));
    frames
        .write_eh_frame(&mut eh_out)
        .map_err(|e| e.to_string())?;
    out.bytes = eh_out.0.into_vec();
    out.bytes.extend_from_slice(&[0; 4]);
    Ok(out)
}

/// The FDEs of the original (start, end, rows) that anchors lie in
/// besides the function's own, by start (`None`: no FDE there).
type OtherFdes = HashMap<u64, Option<(u64, u64, Vec<Row>)>>;

/// Where the row in effect at the original address `a` (SVMA) is: the
/// FDE (`None`: the function's own, `own`; else its key in `others`,
/// read on first use) and the row's index in it.
fn anchor_row(
    eh: &crate::analysis::cfg::EhFrameInfo,
    own: &(u64, u64, Vec<Row>),
    others: &mut OtherFdes,
    a: u64,
) -> Option<(Option<u64>, usize)> {
    let (key, fde) = if (own.0..own.1).contains(&a) {
        (None, own)
    } else {
        let hit = others
            .iter()
            .find(|(_, f)| f.as_ref().is_some_and(|f| (f.0..f.1).contains(&a)))
            .map(|(&s, _)| s);
        let key = match hit {
            Some(s) => s,
            None => {
                let f = rows(eh, a).ok().flatten();
                let s = f.as_ref().map_or(a, |f| f.0);
                others.insert(s, f);
                s
            }
        };
        (Some(key), others[&key].as_ref()?)
    };
    let i = fde.2.partition_point(|r| r.0 <= a).checked_sub(1)?;
    Some((key, i))
}

/// The instructions that change the row `prev` (none: the CIE's) into
/// `row` at `off`.
fn add_row(fde: &mut FrameDescriptionEntry, off: u32, prev: Option<&Rules>, row: &Rules) {
    match (prev.map(|p| &p.0), &row.0) {
        (Some(p), c) if p == c => {}
        (Some(Cfa::RegisterOffset(pr, _)), Cfa::RegisterOffset(r, o)) if pr == r => {
            fde.add_instruction(off, CallFrameInstruction::CfaOffset(*o as i32));
        }
        (_, Cfa::RegisterOffset(r, o)) => {
            fde.add_instruction(off, CallFrameInstruction::Cfa(*r, *o as i32));
        }
        (_, Cfa::Expression(e)) => {
            fde.add_instruction(
                off,
                CallFrameInstruction::CfaExpression(Expression::raw(e.clone())),
            );
        }
    }
    let before: &[(Register, Rule)] = prev.map(|p| p.1.as_slice()).unwrap_or(&[]);
    for (r, rule) in &row.1 {
        if before.iter().any(|(br, bru)| br == r && bru == rule) {
            continue;
        }
        fde.add_instruction(off, instruction(*r, rule.clone()));
    }
    for (br, _) in before {
        if !row.1.iter().any(|(r, _)| r == br) {
            // Back to the CIE's rule (the return address) or untouched.
            fde.add_instruction(off, CallFrameInstruction::Restore(*br));
        }
    }
}

fn instruction(r: Register, rule: Rule) -> CallFrameInstruction {
    match rule {
        Rule::Undefined => CallFrameInstruction::Undefined(r),
        Rule::SameValue => CallFrameInstruction::SameValue(r),
        Rule::Offset(n) => CallFrameInstruction::Offset(r, n as i32),
        Rule::ValOffset(n) => CallFrameInstruction::ValOffset(r, n as i32),
        Rule::Register(o) => CallFrameInstruction::Register(r, o),
        Rule::Expression(e) => CallFrameInstruction::Expression(r, Expression::raw(e)),
        Rule::ValExpression(e) => CallFrameInstruction::ValExpression(r, Expression::raw(e)),
    }
}

/// Moves an [`eh_frame`] made for clones at one address to clones `delta`
/// bytes further: each FDE's start is an absolute 8-byte address at 8
/// bytes into the FDE (read back and checked before it is patched).
pub fn relocate_eh_frame(bytes: &mut [u8], delta: u64) -> Result<(), String> {
    use gimli::UnwindSection;
    let mut starts = Vec::new();
    {
        let eh = gimli::EhFrame::new(bytes, LittleEndian);
        let bases = gimli::BaseAddresses::default();
        let mut entries = eh.entries(&bases);
        while let Some(e) = entries.next().map_err(|e| e.to_string())? {
            if let gimli::CieOrFde::Fde(p) = e {
                let fde = p
                    .parse(gimli::EhFrame::cie_from_offset)
                    .map_err(|e| e.to_string())?;
                let at = fde.offset() + 8;
                let stored = bytes
                    .get(at..at + 8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
                if stored != Some(fde.initial_address()) {
                    return Err(format!(
                        "the FDE at {:#x} holds no absolute start",
                        fde.offset()
                    ));
                }
                starts.push(at);
            }
        }
    }
    for at in starts {
        let f = &mut bytes[at..at + 8];
        let v = u64::from_le_bytes((&*f).try_into().unwrap()).wrapping_add(delta);
        f.copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}
