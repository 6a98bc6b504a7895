//! `rt_back`: a path ended at a back edge.
use burstyd_common::burst::{PATH_END_BACK_EDGE, REC_PATH};
use iced_x86::Code;
use iced_x86::IcedError;
use iced_x86::code_asm::{CodeAssembler, CodeLabel, eax, rax, rdx};

use super::asm::{RipRel, local, tag};

/// `rt_back(eax = fid)`: PATH record (`w0 = tag | BACK_EDGE << 32 | fid`,
/// `w1 = path`). The caller then sets the restart value. Clobbers rax,
/// rcx, rdx.
pub(super) fn back(
    a: &mut CodeAssembler,
    control: u64,
    entry: &mut CodeLabel,
    emit: CodeLabel,
) -> Result<(), IcedError> {
    a.set_label(entry)?;
    a.mov(eax, eax)?;
    a.mov(rdx, tag(REC_PATH) | (PATH_END_BACK_EDGE << 32))?;
    a.or(rax, rdx)?;
    a.rip_rm(Code::Mov_r64_rm64, rdx, local!(control, path))?;
    a.call(emit)?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use burstyd_common::burst::{PATH_END_BACK_EDGE, REC_PATH};

    use super::super::asm::tag;
    use super::super::testing::{FRAME_CLOBBERS, Harness, Regs};

    /// PATH record `(tag | BACK_EDGE << 32 | fid, path)`; the fid is eax
    /// (the upper half of rax is ignored); nothing else changes.
    #[test]
    fn writes_back_edge_path_record() {
        let mut h = Harness::new();
        h.loc_mut().path = 0x1234_5678_9abc;
        h.loc_mut().depth = 3;
        h.ctl_mut().head = 2;
        let before = Regs {
            rax: 0xffff_0000_0000_0000 | 42,
            ..Regs::sentinel()
        };
        let after = h.call(h.rt.back, before);
        before.assert_preserved(&after, FRAME_CLOBBERS);
        assert_eq!(
            h.ring()[2..4],
            [
                tag(REC_PATH) | (PATH_END_BACK_EDGE << 32) | 42,
                0x1234_5678_9abc
            ]
        );
        let c = h.ctl();
        assert_eq!(
            (h.loc().path, h.loc().depth, c.head),
            (0x1234_5678_9abc, 3, 4)
        );
    }
}
