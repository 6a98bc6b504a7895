//! C++ landing pads: where the unwinder enters a function besides its
//! start, read from the call-site tables of the LSDAs (`.gcc_except_table`)
//! that the FDEs of `.eh_frame` point to.
//!
//! They become roots of their function's CFG (see `build_cfg`), so the
//! clones have their code and a Ball-Larus path starts at each: when the
//! unwinder's final jump (`ExitKind::ContextJump`) is itself cloned, an
//! exception thrown in a burst lands in the landing pad's clone and the
//! burst goes on.
//!
//! The LSDA layout is GCC's (`libstdc++`'s `parse_lsda_header`, BOLT's
//! `BinaryFunction::parseLSDA`): the `@LPStart` encoding and value (the
//! function's start when omitted), the `@TType` encoding and offset, the
//! call-site encoding and table length, then `(start, length, landing
//! pad, action)` per call site; a landing pad offset of 0 means none. An
//! LSDA this reader cannot decode gives no landing pads: they then stay
//! out of the CFG and an exception landing there leaves the burst.

use super::context::CfgContext;

const DW_EH_PE_OMIT: u8 = 0xff;

/// Every landing pad of the file (SVMAs, sorted, distinct).
pub(super) fn landing_pads(ctx: &CfgContext) -> Vec<u64> {
    let mut out = Vec::new();
    for (start, lsda) in ctx.fde_lsdas() {
        if let Some(bytes) = ctx.bytes_from(lsda) {
            out.extend(parse(bytes, lsda, start).unwrap_or_default());
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The landing pads of one LSDA at `addr` (its bytes `b`, to the end of
/// its section), for the FDE whose range starts at `start`.
fn parse(b: &[u8], addr: u64, start: u64) -> Option<Vec<u64>> {
    let mut r = Reader { b, pos: 0, addr };
    let lp_enc = r.u8()?;
    let lp_start = if lp_enc == DW_EH_PE_OMIT {
        start
    } else {
        r.pointer(lp_enc)?
    };
    let ttype_enc = r.u8()?;
    if ttype_enc != DW_EH_PE_OMIT {
        r.uleb()?;
    }
    let cs_enc = r.u8()?;
    let cs_len = r.uleb()?;
    let end = r.pos.checked_add(usize::try_from(cs_len).ok()?)?;
    if end > b.len() {
        return None;
    }
    let mut pads = Vec::new();
    while r.pos < end {
        let _start = r.value(cs_enc)?;
        let _len = r.value(cs_enc)?;
        let lp = r.value(cs_enc)?;
        let _action = r.uleb()?;
        if lp != 0 {
            pads.push(lp_start.checked_add(lp)?);
        }
    }
    (r.pos == end).then_some(pads)
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    /// SVMA of `b[0]` (for `DW_EH_PE_pcrel`).
    addr: u64,
}

impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let v = *self.b.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let v = self.b.get(self.pos..self.pos + N)?.try_into().ok()?;
        self.pos += N;
        Some(v)
    }

    fn uleb(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn sleb(&mut self) -> Option<u64> {
        let mut v = 0i64;
        let mut shift = 0;
        loop {
            let byte = self.u8()?;
            v |= i64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                if shift < 64 && byte & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Some(v as u64);
            }
            if shift >= 64 {
                return None;
            }
        }
    }

    /// A value in the format of `enc`'s low nibble, with no application.
    fn value(&mut self, enc: u8) -> Option<u64> {
        Some(match enc & 0x0f {
            0x00 | 0x04 => u64::from_le_bytes(self.bytes()?),
            0x01 => self.uleb()?,
            0x02 => u64::from(u16::from_le_bytes(self.bytes()?)),
            0x03 => u64::from(u32::from_le_bytes(self.bytes()?)),
            0x09 => self.sleb()?,
            0x0a => i16::from_le_bytes(self.bytes()?) as i64 as u64,
            0x0b => i32::from_le_bytes(self.bytes()?) as i64 as u64,
            0x0c => i64::from_le_bytes(self.bytes()?) as u64,
            _ => return None,
        })
    }

    /// A pointer encoded with `enc`: absolute or PC-relative, never
    /// indirect (that would need the loaded image).
    fn pointer(&mut self, enc: u8) -> Option<u64> {
        let here = self.addr.wrapping_add(self.pos as u64);
        let v = self.value(enc)?;
        match enc & 0xf0 {
            0x00 => Some(v),
            0x10 => Some(here.wrapping_add(v)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    /// GCC's usual LSDA: no @LPStart, a @TType table, uleb128 call sites;
    /// two call sites with landing pads and one without.
    #[test]
    fn reads_the_landing_pads_of_a_call_site_table() {
        let lsda = [
            0xff, // @LPStart omitted: the function's start
            0x9b, 0x0d, // @TType: indirect pcrel sdata4, offset 13
            0x01, 0x09, // call sites: uleb128, 9 bytes
            0x05, 0x0a, 0x40, 0x01, // [5, 15) -> 0x40, action 1
            0x14, 0x05, 0x00, 0x00, // [20, 25) -> none
            0x20, 0x02, 0x50, 0x00, // (one byte too many for the length)
        ];
        assert_eq!(
            parse(&lsda, 0x9000, 0x1000),
            None,
            "length not on a boundary"
        );
        let mut ok = lsda;
        ok[4] = 12;
        assert_eq!(parse(&ok, 0x9000, 0x1000), Some(vec![0x1040, 0x1050]));
        // udata4 call sites, an absolute @LPStart.
        let lsda = [
            0x03, 0x00, 0x20, 0x00, 0x00, // @LPStart = 0x2000 (udata4)
            0xff, // no @TType
            0x03, 0x0d, // udata4 call sites, 13 bytes
            0x01, 0, 0, 0, 0x02, 0, 0, 0, 0x30, 0, 0, 0, 0x00,
        ];
        assert_eq!(parse(&lsda, 0x9000, 0x1000), Some(vec![0x2030]));
        assert_eq!(parse(&lsda[..10], 0x9000, 0x1000), None, "truncated");
    }
}
