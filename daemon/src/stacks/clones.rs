//! The instrumented clones bursty tracing injects into a process, as the
//! unwinder needs them: a sample taken during a burst (or a caller still
//! holding a clone return address after it) has clone addresses in its
//! stack. Registered with [`super::table::ProcessTable::set_clone_frames`]
//! by the session once an attach finished; used by [`super::unwind`].
//!
//! It lives here, below both the table and the unwinder, so that neither
//! imports the other for it.
use std::sync::Arc;

/// The instrumented clones injected into a process (bursty tracing): a
/// sample taken during a burst has clone addresses in its stack. They are
/// unwound with the clones' own `.eh_frame` (the same bytes registered in
/// the target) and then reported as the original instructions, so a
/// profile never shows the clones.
pub(crate) struct CloneFrames {
    pub(crate) range: std::ops::Range<u64>,
    /// `.eh_frame` with absolute addresses (SVMA = AVMA), and where it
    /// lies in the target.
    pub(crate) eh_frame: Arc<[u8]>,
    pub(crate) eh_frame_addr: u64,
    /// `(clone address, original address, original end)` of every copied
    /// instruction, sorted by clone address.
    pub(crate) map: Vec<(u64, u64, u64)>,
}

impl CloneFrames {
    /// The original address for a frame address in the clones: the
    /// instruction itself for the sampled PC, the original return address
    /// (after the original call) for a return address.
    pub(crate) fn translate(&self, addr: u64, is_return_address: bool) -> Option<u64> {
        if !self.range.contains(&addr) {
            return None;
        }
        let probe = if is_return_address { addr - 1 } else { addr };
        let i = self.map.partition_point(|e| e.0 <= probe);
        let &(_, orig, orig_end) = self.map.get(i.checked_sub(1)?)?;
        Some(if is_return_address { orig_end } else { orig })
    }
}
