//! The instrumented clones bursty tracing injects into a process, as the
//! unwinder needs them: a sample taken during a burst has a clone pc (calls
//! in the clones push original return addresses, so only the innermost
//! frames are: the clone's, and a runtime routine's it called).
//! Registered with [`super::table::ProcessTable::set_clone_frames`] by the
//! session once an attach finished; used by [`super::unwind`].
//!
//! It lives here, below both the table and the unwinder, so that neither
//! imports the other for it.
use std::sync::Arc;

use burstyd_common::addr::{Avma, FrameAddress};

/// The instrumented clones injected into a process (bursty tracing), one
/// region per module with clones: a sample taken during a burst has clone
/// addresses in its stack. They are unwound with the clones' own
/// `.eh_frame` (the same bytes registered in the target) and then
/// reported as the original instructions, so a profile never shows the
/// clones.
pub(crate) struct CloneFrames {
    pub(crate) regions: Vec<CloneRegion>,
}

/// One module's clones.
#[derive(Clone)]
pub(crate) struct CloneRegion {
    pub(crate) range: std::ops::Range<u64>,
    /// `.eh_frame` with absolute addresses (SVMA = AVMA), and where it
    /// lies in the target.
    pub(crate) eh_frame: Arc<[u8]>,
    pub(crate) eh_frame_addr: u64,
    /// The original instruction of every copied instruction.
    pub(crate) map: userspace_rewriter::codegen::ReverseMap,
}

impl CloneFrames {
    /// The original frame for a frame in the clones: the original
    /// instruction for the sampled PC, the original return address (after
    /// the original call) for a return address. `None` outside the clones.
    pub(crate) fn translate(&self, frame: FrameAddress) -> Option<FrameAddress> {
        let r = self
            .regions
            .iter()
            .find(|r| r.range.contains(&frame.address().0))?;
        let Avma(probe) = frame.lookup_address();
        let (orig, orig_end) = r.map.lookup(probe)?;
        Some(match frame {
            FrameAddress::InstructionPointer(_) => FrameAddress::InstructionPointer(Avma(orig)),
            FrameAddress::ReturnAddress(_) => FrameAddress::ReturnAddress(Avma(orig_end)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_frames_translate_to_the_original_instruction_or_return_address() {
        // Two copied instructions: a 5-byte call at 0x1000 (originally
        // 0x500..0x505) and the next one at 0x1005 (originally 0x505..0x50a).
        let region = |lo: u64, orig: u64| CloneRegion {
            range: lo..lo + 0x1000,
            eh_frame: Arc::from(&[0u8; 0][..]),
            eh_frame_addr: 0,
            map: userspace_rewriter::codegen::ReverseMap::new(&[
                (lo, orig, orig + 5),
                (lo + 5, orig + 5, orig + 10),
            ])
            .unwrap(),
        };
        // The executable's clones, and a library's far away.
        let c = CloneFrames {
            regions: vec![
                region(0x1000, 0x500),
                region(0x7f00_0000_1000, 0x7f00_1000_0500),
            ],
        };
        let ip = |a| FrameAddress::InstructionPointer(Avma(a));
        let ra = |a| FrameAddress::ReturnAddress(Avma(a));
        // The PC at the second instruction is that instruction.
        assert_eq!(c.translate(ip(0x1005)), Some(ip(0x505)));
        // Returning to 0x1005 means the call at 0x1000 ran: its original
        // return address.
        assert_eq!(c.translate(ra(0x1005)), Some(ra(0x505)));
        assert_eq!(c.translate(ip(0x1002)), Some(ip(0x500)));
        // Outside the clones: not ours.
        assert_eq!(c.translate(ip(0xfff)), None);
        assert_eq!(c.translate(ra(0x2000)), None);
        assert_eq!(
            c.translate(ip(0x7f00_0000_1005)),
            Some(ip(0x7f00_1000_0505))
        );
        assert_eq!(
            c.translate(ra(0x7f00_0000_1005)),
            Some(ra(0x7f00_1000_0505))
        );
    }
}
