//! [`Relocs`]: where a clone image's bytes depend on its [`Layout`], so
//! that an image generated once (and cached) can be moved to another
//! process's layout without analysing or generating again.
//!
//! A clone image depends on four numbers: where its code goes (`code`),
//! where the module's original code is (`bias`), where the control block
//! is (`control`) and the module's first `fid` (`fid_base`). Inside the
//! clones everything else is relative: branches between clones and calls
//! into the runtime are `rel32`s within the image, the `.eh_frame` FDEs
//! hold absolute clone addresses (patched separately). What depends on the
//! layout is found as the batches are encoded, from each instruction's
//! targets and the emitter's tags, with the byte offsets iced reports:
//! - `rel32` (branches, RIP-relative operands) to the original code;
//! - `rel32` to the control block (a control block above 2 GiB);
//! - `[disp32]` absolute operands in the control block (one mapped low);
//! - `dq` slots holding original addresses (return addresses, jump-table
//!   targets);
//! - `imm32` `fid`s.
//!
//! Moving the image adds the change of each number to each field and
//! checks that it still fits; the runtime in front of the clones is
//! assembled again for the new layout. Anything the encoder rewrote on its
//! own (a branch out of reach) leaves the image unrelocatable: it is then
//! generated again, never patched by guess.

use super::layout::Layout;
use super::runtime::NO_PATH;

/// The kinds of layout-dependent fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Field {
    /// `rel32` to the original code: moves by `Δbias − Δcode`.
    RelOrig,
    /// `rel32` to the control block: `Δcontrol − Δcode`.
    RelControl,
    /// Absolute `disp32` in the control block: `Δcontrol`.
    AbsControl,
    /// `dq` of an original address: `Δbias`.
    OrigQword,
    /// `imm32` `fid`: `Δfid_base`.
    Fid,
}

/// The layout-dependent fields of an image: offsets from the image's
/// start (its `code` address), by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Relocs {
    pub rel_orig: Vec<u32>,
    pub rel_control: Vec<u32>,
    pub abs_control: Vec<u32>,
    pub orig_qwords: Vec<u32>,
    pub fids: Vec<u32>,
    /// Why the image cannot be moved, if it cannot.
    pub unrelocatable: Option<String>,
}

impl Relocs {
    /// Records a field of `size` bytes at `offset`.
    pub(super) fn push(&mut self, field: Field, offset: u64, size: usize) {
        let want = if field == Field::OrigQword { 8 } else { 4 };
        if size != want {
            self.refuse(format!(
                "a {field:?} field at {offset:#x} has {size} bytes, not {want}"
            ));
            return;
        }
        let Ok(offset) = u32::try_from(offset) else {
            self.refuse(format!("a field lies {offset:#x} bytes into the image"));
            return;
        };
        match field {
            Field::RelOrig => &mut self.rel_orig,
            Field::RelControl => &mut self.rel_control,
            Field::AbsControl => &mut self.abs_control,
            Field::OrigQword => &mut self.orig_qwords,
            Field::Fid => &mut self.fids,
        }
        .push(offset);
    }

    pub(super) fn refuse(&mut self, why: String) {
        self.unrelocatable.get_or_insert(why);
    }

    /// Fields in all.
    pub fn len(&self) -> usize {
        self.rel_orig.len()
            + self.rel_control.len()
            + self.abs_control.len()
            + self.orig_qwords.len()
            + self.fids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sorts each kind's offsets (as pieces are patched in order).
    pub(super) fn sort(&mut self) {
        for v in [
            &mut self.rel_orig,
            &mut self.rel_control,
            &mut self.abs_control,
            &mut self.orig_qwords,
            &mut self.fids,
        ] {
            v.sort_unstable();
        }
    }

    /// The end of a field that starts before `at` and ends after it, if
    /// one does (the lists sorted).
    pub(super) fn field_across(&self, at: u64) -> Option<u64> {
        [
            (&self.rel_orig, 4),
            (&self.rel_control, 4),
            (&self.abs_control, 4),
            (&self.fids, 4),
            (&self.orig_qwords, 8),
        ]
        .into_iter()
        .filter_map(|(v, size)| {
            let i = v.partition_point(|&o| u64::from(o) < at);
            let o = u64::from(*v.get(i.checked_sub(1)?)?);
            (o + size > at).then_some(o + size)
        })
        .max()
    }

    /// Patches `bytes`, the image's bytes from offset `base` (encoded for
    /// `from`), for `to`: the fields that start among them, which must
    /// end among them too. The lists must be sorted.
    pub(super) fn apply_at(
        &self,
        bytes: &mut [u8],
        base: u64,
        from: &Layout,
        to: &Layout,
    ) -> Result<(), String> {
        if let Some(why) = &self.unrelocatable {
            return Err(why.clone());
        }
        let end = base + bytes.len() as u64;
        let within = |v: &'_ [u32]| -> Vec<u32> {
            let lo = v.partition_point(|&o| u64::from(o) < base);
            let hi = v.partition_point(|&o| u64::from(o) < end);
            v[lo..hi].iter().map(|&o| o - base as u32).collect()
        };
        let part = Relocs {
            rel_orig: within(&self.rel_orig),
            rel_control: within(&self.rel_control),
            abs_control: within(&self.abs_control),
            orig_qwords: within(&self.orig_qwords),
            fids: within(&self.fids),
            unrelocatable: None,
        };
        part.apply(bytes, from, to)
            .map_err(|e| format!("{e} (in the piece at {base:#x})"))
    }

    /// Patches `bytes` (an image encoded for `from`) for `to`.
    pub(super) fn apply(&self, bytes: &mut [u8], from: &Layout, to: &Layout) -> Result<(), String> {
        if let Some(why) = &self.unrelocatable {
            return Err(why.clone());
        }
        let d = |a: u64, b: u64| b.wrapping_sub(a) as i64;
        let (dcode, dbias, dcontrol) = (
            d(from.code, to.code),
            d(from.bias, to.bias),
            d(from.control, to.control),
        );
        let dfid = i64::from(to.fid_base) - i64::from(from.fid_base);
        let add32 = |bytes: &mut [u8], at: &[u32], delta: i64, what: &str| -> Result<(), String> {
            if delta == 0 {
                return Ok(());
            }
            for &o in at {
                let o = o as usize;
                let f = bytes
                    .get_mut(o..o + 4)
                    .ok_or_else(|| format!("a {what} field at {o:#x} lies past the image"))?;
                let v = i64::from(i32::from_le_bytes(f.try_into().unwrap())) + delta;
                let v = i32::try_from(v)
                    .map_err(|_| format!("a {what} field at {o:#x} would not fit: {v:#x}"))?;
                f.copy_from_slice(&v.to_le_bytes());
            }
            Ok(())
        };
        add32(
            bytes,
            &self.rel_orig,
            dbias - dcode,
            "rel32 to the original",
        )?;
        add32(
            bytes,
            &self.rel_control,
            dcontrol - dcode,
            "rel32 to the control block",
        )?;
        add32(
            bytes,
            &self.abs_control,
            dcontrol,
            "disp32 in the control block",
        )?;
        if dfid != 0 {
            for &o in &self.fids {
                let o = o as usize;
                let f = bytes
                    .get_mut(o..o + 4)
                    .ok_or_else(|| format!("a fid at {o:#x} lies past the image"))?;
                // The `fid`, and the no-path flag above it.
                let v = u32::from_le_bytes(f.try_into().unwrap());
                let fid = u32::try_from(i64::from(v & !NO_PATH) + dfid)
                    .ok()
                    .filter(|&n| n < NO_PATH)
                    .ok_or_else(|| format!("a fid at {o:#x} would not fit"))?;
                f.copy_from_slice(&(fid | (v & NO_PATH)).to_le_bytes());
            }
        }
        if dbias != 0 {
            for &o in &self.orig_qwords {
                let o = o as usize;
                let f = bytes
                    .get_mut(o..o + 8)
                    .ok_or_else(|| format!("a slot at {o:#x} lies past the image"))?;
                let v = u64::from_le_bytes(f.try_into().unwrap()).wrapping_add(dbias as u64);
                f.copy_from_slice(&v.to_le_bytes());
            }
        }
        Ok(())
    }
}
