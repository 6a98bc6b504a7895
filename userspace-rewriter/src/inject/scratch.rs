//! The layout of the scratch page injections use in the target.

/// Offsets in the scratch page.
pub(super) const SCRATCH_LEN: u64 = crate::PAGE_SIZE;
pub(super) const SCR_SIGACTION_NEW: u64 = 0;
pub(super) const SCR_SIGACTION_OLD: u64 = 64;
pub(super) const SCR_SIGINFO: u64 = 128;
pub(super) const SCR_NAME: u64 = 512;
pub(super) const MAX_NAME: usize = 249; // memfd_create's limit, without the NUL
