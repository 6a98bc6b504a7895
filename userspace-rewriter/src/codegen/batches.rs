//! [`Batches`]: the clones encoded a batch of functions at a time, so that
//! iced's block encoder (a few hundred bytes of state per instruction) and
//! the instruction list never hold a whole module: for python3.11 with its
//! libraries they held over a gigabyte at once.
//!
//! Each batch is encoded at its final address, right after the previous
//! one. Labels bound and used within a batch are resolved by the block
//! encoder. A branch to a label of another batch (a call or jump to
//! another function's clone, a jump into another part of a function) is
//! the only reference that crosses batches:
//! - to an earlier batch, the label's address is known and put in the
//!   branch before encoding;
//! - to a later batch, the branch is encoded as a `rel32` to a placeholder
//!   1 GiB away (so the encoder keeps the 4-byte form) and patched once
//!   every batch is placed ([`Batches::finish`]).
//!
//! Only the labels a caller declares *exported* may be referenced across
//! batches; anything else is an error, never a guess.

use std::collections::{HashMap, HashSet};

use burstyd_common::burst::CONTROL_BYTES;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Instruction, InstructionBlock, OpKind, Register,
};

use super::emitter::{Emitter, LABEL_BASE, Tag};
use super::layout::GenError;
use super::relocs::{Field, Relocs};

/// A batch is encoded once it holds this many instructions (at the end of
/// a function: a function is never split).
pub(super) const BATCH_INSTRUCTIONS: usize = 1 << 15;

/// Distance of the placeholder target of a forward branch across batches:
/// far enough that the encoder keeps `rel32`, near enough to be in range.
const PLACEHOLDER_DISTANCE: u64 = 1 << 30;

pub(super) struct Batches {
    /// AVMA of the first batch.
    base: u64,
    /// The image's start (the runtime's, before the first batch) and the
    /// control block: what a branch or operand that leaves the batches is
    /// classified by ([`Relocs`]).
    image: u64,
    control: u64,
    /// The layout-dependent fields, as offsets from `image`.
    pub(super) relocs: Relocs,
    /// The code of the batches encoded so far.
    pub(super) bytes: Vec<u8>,
    /// Labels other batches may branch to.
    exported: HashSet<u64>,
    /// Exported label → AVMA, once its batch is encoded.
    labels: HashMap<u64, u64>,
    /// `(offset in bytes just past a rel32, label)` to patch.
    fixups: Vec<(usize, u64)>,
    /// `(original, clone)` of every copied instruction.
    pub(super) table: Vec<(u64, u64)>,
    /// `(clone, original, original end)` of every copied instruction.
    pub(super) reverse: Vec<(u64, u64, u64)>,
    /// `(original return address, clone return site)`.
    pub(super) returns: Vec<(u64, u64)>,
}

impl Batches {
    pub(super) fn new(base: u64, exported: HashSet<u64>, image: u64, control: u64) -> Self {
        Batches {
            base,
            image,
            control,
            relocs: Relocs::default(),
            bytes: Vec::new(),
            exported,
            labels: HashMap::new(),
            fixups: Vec::new(),
            table: Vec::new(),
            reverse: Vec::new(),
            returns: Vec::new(),
        }
    }

    /// Encodes what `em` holds at the next address. `table` (original,
    /// instruction index, original end) and `returns` (original return
    /// address, instruction index) index that batch; they are turned into
    /// addresses and emptied.
    pub(super) fn flush(
        &mut self,
        em: &mut Emitter,
        table: &mut Vec<(u64, usize, u64)>,
        returns: &mut Vec<(u64, usize)>,
    ) -> Result<(), GenError> {
        let (mut insns, alias) = em.take();
        let tags = std::mem::take(&mut em.tags);
        if insns.is_empty() {
            return Ok(());
        }
        let at = self.base + self.bytes.len() as u64;
        let fields = self.fields(&insns, &tags, at);
        let placeholder = at + PLACEHOLDER_DISTANCE;
        // Labels bound in this batch → instruction index.
        let mut bound: HashMap<u64, usize> = HashMap::new();
        for (idx, ins) in insns.iter().enumerate() {
            if ins.ip() >= LABEL_BASE {
                bound.insert(ins.ip(), idx);
            }
        }
        for (&other, first) in &alias {
            if let Some(&idx) = bound.get(first) {
                bound.insert(other, idx);
            }
        }
        let mut forward: Vec<(usize, u64)> = Vec::new();
        for (idx, ins) in insns.iter_mut().enumerate() {
            if ins.op_count() > 0 && matches!(ins.op0_kind(), OpKind::NearBranch64) {
                let t = ins.near_branch64();
                if t >= LABEL_BASE && !bound.contains_key(&t) {
                    match self.labels.get(&t) {
                        Some(&a) => ins.set_near_branch64(a),
                        None if self.exported.contains(&t) => {
                            ins.set_near_branch64(placeholder);
                            forward.push((idx, t));
                        }
                        None => return Err(unbound(t)),
                    }
                }
            }
            if ins.is_ip_rel_memory_operand() {
                let t = ins.memory_displacement64();
                if t >= LABEL_BASE && !bound.contains_key(&t) {
                    // Data slots live with the code that reads them.
                    let a = *self.labels.get(&t).ok_or_else(|| unbound(t))?;
                    ins.set_memory_displacement64(a);
                }
            }
        }
        let enc = BlockEncoder::encode(
            64,
            InstructionBlock::new(&insns, at),
            BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS
                | BlockEncoderOptions::RETURN_CONSTANT_OFFSETS,
        )?;
        let offsets = enc.new_instruction_offsets;
        let start = at - self.image;
        for (idx, field) in fields {
            let (o, co) = (offsets[idx], &enc.constant_offsets[idx]);
            if o == u32::MAX {
                self.relocs.refuse(format!(
                    "the encoder rewrote an instruction with a {field:?} field"
                ));
                continue;
            }
            let o = start + u64::from(o);
            match field {
                Field::OrigQword => self.relocs.push(field, o, 8),
                Field::RelOrig | Field::RelControl | Field::AbsControl if co.has_displacement() => {
                    let (d, n) = (co.displacement_offset(), co.displacement_size());
                    self.relocs.push(field, o + d as u64, n)
                }
                _ if co.has_immediate() => {
                    let (d, n) = (co.immediate_offset(), co.immediate_size());
                    self.relocs.push(field, o + d as u64, n)
                }
                _ => self
                    .relocs
                    .refuse(format!("no constant found for a {field:?} field")),
            }
        }
        let code_len = enc.code_buffer.len();
        let addr = |idx: usize| at + u64::from(offsets[idx]);
        for (&l, &idx) in &bound {
            if self.exported.contains(&l) {
                self.labels.insert(l, addr(idx));
            }
        }
        for (idx, label) in forward {
            let end = offsets.get(idx + 1).map_or(code_len, |&o| o as usize);
            let ok = offsets[idx] != u32::MAX
                && end >= 4
                && end <= code_len
                && rel32_at(&enc.code_buffer, end)
                    == Some(placeholder.wrapping_sub(at + end as u64));
            if !ok {
                return Err(GenError::Encode(format!(
                    "a branch to another batch at instruction {idx} was not encoded as rel32"
                )));
            }
            self.fixups.push((self.bytes.len() + end, label));
        }
        // An instruction the encoder replaced by a sequence of its own has
        // no offset (u32::MAX): it must not be a place to go to.
        let rewritten = |idx: usize| offsets[idx] == u32::MAX;
        if let Some((l, _)) = bound
            .iter()
            .find(|&(l, &idx)| self.exported.contains(l) && rewritten(idx))
        {
            return Err(GenError::Encode(format!(
                "label {:#x} names an instruction the encoder rewrote",
                l - LABEL_BASE
            )));
        }
        for (o, idx, end) in table.drain(..) {
            if !rewritten(idx) {
                self.table.push((o, addr(idx)));
                self.reverse.push((addr(idx), o, end));
            }
        }
        for (o, idx) in returns.drain(..) {
            if rewritten(idx) {
                return Err(GenError::Encode(format!(
                    "the return site of {o:#x} was rewritten by the encoder"
                )));
            }
            self.returns.push((o, addr(idx)));
        }
        self.bytes.extend_from_slice(&enc.code_buffer);
        Ok(())
    }

    /// The layout-dependent fields of a batch at `at`, before its labels
    /// are resolved: `(instruction index, kind)`. A branch or operand
    /// whose target is neither a label nor in the image so far leaves the
    /// image: for the control block or the original code.
    fn fields(&self, insns: &[Instruction], tags: &[(usize, Tag)], at: u64) -> Vec<(usize, Field)> {
        let inside = |t: u64| t >= LABEL_BASE || (self.image..at).contains(&t);
        let control = |t: u64| (self.control..self.control + CONTROL_BYTES as u64).contains(&t);
        let mut out = Vec::new();
        for (idx, ins) in insns.iter().enumerate() {
            if ins.op_count() > 0 && matches!(ins.op0_kind(), OpKind::NearBranch64) {
                if !inside(ins.near_branch64()) {
                    out.push((idx, Field::RelOrig));
                }
            } else if ins.is_ip_rel_memory_operand() {
                let t = ins.memory_displacement64();
                if !inside(t) {
                    out.push((
                        idx,
                        if control(t) {
                            Field::RelControl
                        } else {
                            Field::RelOrig
                        },
                    ));
                }
            } else if (0..ins.op_count()).any(|k| ins.op_kind(k) == OpKind::Memory)
                && ins.memory_base() == Register::None
                && ins.memory_index() == Register::None
                && ins.segment_prefix() == Register::None
                && control(ins.memory_displacement64())
            {
                out.push((idx, Field::AbsControl));
            }
        }
        out.extend(tags.iter().map(|&(idx, t)| {
            (
                idx,
                match t {
                    Tag::Fid => Field::Fid,
                    Tag::OrigQword => Field::OrigQword,
                },
            )
        }));
        out
    }

    /// The address of an exported label already encoded.
    pub(super) fn label(&self, l: u64) -> Option<u64> {
        self.labels.get(&l).copied()
    }

    /// Patches the branches to later batches; every batch must be flushed.
    pub(super) fn finish(&mut self) -> Result<(), GenError> {
        for &(end, label) in &self.fixups {
            let target = *self.labels.get(&label).ok_or_else(|| unbound(label))?;
            let rel = target as i64 - (self.base + end as u64) as i64;
            let rel = i32::try_from(rel).map_err(|_| {
                GenError::Encode(format!("a branch across batches spans {rel} bytes"))
            })?;
            self.bytes[end - 4..end].copy_from_slice(&rel.to_le_bytes());
        }
        self.fixups.clear();
        Ok(())
    }
}

/// The rel32 (sign-extended) ending at `end`, as the unsigned difference.
fn rel32_at(code: &[u8], end: usize) -> Option<u64> {
    let b: [u8; 4] = code.get(end - 4..end)?.try_into().ok()?;
    Some(i32::from_le_bytes(b) as i64 as u64)
}

fn unbound(label: u64) -> GenError {
    GenError::Encode(format!(
        "label {:#x} is referenced across batches but not exported or never bound",
        label - LABEL_BASE
    ))
}

#[cfg(test)]
mod tests {
    use iced_x86::{Code, Decoder, DecoderOptions, FlowControl};

    use super::*;

    /// Three one-function batches: `a` calls `c` (two batches ahead) and
    /// jumps to `b` (the next one), `b` jumps back to `a` and calls
    /// itself, `c` calls `a`. Decoded at their final addresses, every branch
    /// lands on its label, forward ones through the patched rel32.
    #[test]
    fn branches_across_batches_land_on_their_labels() {
        let base = 0x5555_5600_0000;
        let mut em = Emitter::new();
        let (a, b, c, unexported) = (em.label(), em.label(), em.label(), em.label());
        let mut batches = Batches::new(base, [a, b, c].into_iter().collect(), base, 0x10_0000);
        let (mut table, mut returns) = (Vec::new(), Vec::new());
        let nop = || Instruction::with(Code::Nopd);
        let mut starts = Vec::new();
        for (me, body) in [(a, vec![c, b]), (b, vec![a, b]), (c, vec![a])] {
            starts.push(base + batches.bytes.len() as u64);
            em.bind(me);
            em.emit(nop());
            for (k, t) in body.into_iter().enumerate() {
                if k == 0 {
                    em.call(t).unwrap();
                } else {
                    em.jmp(t).unwrap();
                }
            }
            em.e(Instruction::with1(Code::Push_r64, Register::RAX))
                .unwrap();
            batches.flush(&mut em, &mut table, &mut returns).unwrap();
        }
        batches.finish().unwrap();
        for (l, s) in [a, b, c].into_iter().zip(&starts) {
            assert_eq!(batches.label(l), Some(*s));
        }
        let mut targets = Vec::new();
        let mut d = Decoder::with_ip(64, &batches.bytes, base, DecoderOptions::NONE);
        for ins in d.iter() {
            if matches!(
                ins.flow_control(),
                FlowControl::Call | FlowControl::UnconditionalBranch
            ) {
                targets.push(ins.near_branch_target());
            }
        }
        let (sa, sb, sc) = (starts[0], starts[1], starts[2]);
        assert_eq!(targets, vec![sc, sb, sa, sb, sa]);

        // A branch to a label nobody exported is an error, not a guess.
        em.jmp(unexported).unwrap();
        assert!(batches.flush(&mut em, &mut table, &mut returns).is_err());
    }
}
