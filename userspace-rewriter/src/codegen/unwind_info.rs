//! Unwind information for the clones (`.eh_frame` made with gimli::write).
//!
//! A clone executes the original's instructions with the original's stack
//! layout at every instruction it copies; only inside the snippets between
//! them does `rsp` move (and no snippet calls anything that could unwind).
//! So the CFI row in effect at an original instruction is the row for its
//! copy: each original row `[a, b)` becomes a row starting at the clone of
//! the first instruction at or after `a`. Copies keep their order inside a
//! clone (blocks are emitted in address order, out-of-line stubs after
//! them), so the rows stay sorted. The clones' frames are then unwindable
//! by C++ exceptions, `backtrace()` and debuggers once the table is
//! registered (`__register_frame`).
//!
//! DWARF expressions are restated as they are when they read registers and
//! memory only (OpenSSL's assembly realigns its stack and finds the CFA
//! through a saved `rsp`: `DW_OP_breg7 N; DW_OP_deref; DW_OP_plus_uconst
//! 8`), since the registers and the stack at a copied instruction are the
//! original's. Functions whose CFI uses anything else (the pc, `rip`, an
//! address, a branch inside the expression) cannot be restated this way;
//! [`untranslatable`] lists them so the generator leaves them out.
use std::collections::BTreeSet;

use gimli::write::{
    Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec, Expression,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{CfaRule, Encoding, Format, LittleEndian, Register, RegisterRule, X86_64};

use crate::codegen::CloneImage;

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
    /// `.eh_frame` bytes (CIE, one FDE per clone, zero terminator), with
    /// absolute FDE addresses: position independent.
    pub bytes: Vec<u8>,
    pub fdes: usize,
    /// Clones whose original has no FDE (no unwinding through either).
    without_cfi: usize,
}

/// `.eh_frame` for every clone of `image` (made from the file `data`
/// loaded with `bias`).
pub fn eh_frame(data: &[u8], image: &CloneImage, bias: u64) -> Result<CloneUnwind, String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    let Some(eh) = crate::analysis::cfg::parse_eh_frame(&file) else {
        return Ok(CloneUnwind {
            bytes: vec![0; 4],
            fdes: 0,
            without_cfi: image.functions.len(),
        });
    };
    let table = image.table();
    let mut clones: Vec<(u64, u64, bool)> = image
        .functions
        .iter()
        .map(|f| (f.clone, f.orig, f.plt_stub_len().is_some()))
        .collect();
    clones.sort_unstable();
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
    let mut out = CloneUnwind::default();
    for (k, &(cstart, orig, plt_stub)) in clones.iter().enumerate() {
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
        let Ok(Some((fstart, fend, rows))) = rows(&eh, svma) else {
            out.without_cfi += 1;
            continue;
        };
        // Clone address of the first copied instruction at or after an
        // original address (within this function).
        let lo = table.partition_point(|e| e.0 < fstart.wrapping_add(bias));
        let hi = table.partition_point(|e| e.0 < fend.wrapping_add(bias));
        let insns = &table[lo..hi];
        let clone_of = |svma: u64| -> Option<u64> {
            let a = svma.wrapping_add(bias);
            let j = insns.partition_point(|e| e.0 < a);
            insns.get(j).map(|e| e.1)
        };
        let mut fde = FrameDescriptionEntry::new(Address::Constant(cstart), (cend - cstart) as u32);
        let mut prev: Option<&Row> = None;
        for row in &rows {
            // The first row covers the prologue snippet too.
            let at = if prev.is_none() {
                cstart
            } else {
                match clone_of(row.0) {
                    Some(c) if c >= cstart && c < cend => c,
                    _ => continue,
                }
            };
            let off = (at - cstart) as u32;
            if prev.is_none_or(|p| p.1 != row.1) {
                fde.add_instruction(
                    off,
                    match &row.1 {
                        Cfa::RegisterOffset(r, o) => CallFrameInstruction::Cfa(*r, *o as i32),
                        Cfa::Expression(e) => {
                            CallFrameInstruction::CfaExpression(Expression::raw(e.clone()))
                        }
                    },
                );
            }
            let before: &[(Register, Rule)] = prev.map(|p| p.2.as_slice()).unwrap_or(&[]);
            for (r, rule) in &row.2 {
                if before.iter().any(|(br, bru)| br == r && bru == rule) {
                    continue;
                }
                fde.add_instruction(off, instruction(*r, rule.clone()));
            }
            for (br, _) in before {
                if !row.2.iter().any(|(r, _)| r == br) {
                    // Back to the CIE's rule (the return address) or
                    // untouched.
                    fde.add_instruction(off, CallFrameInstruction::Restore(*br));
                }
            }
            prev = Some(row);
        }
        frames.add_fde(cie_id, fde);
        out.fdes += 1;
    }
    let mut eh_out = EhFrame(EndianVec::new(LittleEndian));
    frames
        .write_eh_frame(&mut eh_out)
        .map_err(|e| e.to_string())?;
    out.bytes = eh_out.0.into_vec();
    out.bytes.extend_from_slice(&[0; 4]);
    Ok(out)
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
