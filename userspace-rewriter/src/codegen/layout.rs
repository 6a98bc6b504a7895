//! The generator's shared vocabulary: where an image goes ([`Layout`]),
//! what generating it counts ([`GenStats`]) and how it fails
//! ([`GenError`]). A leaf: it names none of the generator's other files
//! but the runtime's error.

use iced_x86::IcedError;
use serde::Serialize;

use super::runtime::RuntimeError;

/// Where the image goes in the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `AVMA - SVMA` of the executable.
    pub bias: u64,
    /// AVMA of the [`BurstControl`](burstyd_common::burst::BurstControl).
    pub control: u64,
    /// AVMA where [`CloneImage::bytes`](super::CloneImage::bytes) is written.
    pub code: u64,
    /// Added to a function's index in the plan to make the `fid` its
    /// records carry: with several modules traced into one ring, each
    /// module's functions get a range of their own.
    pub fid_base: u32,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct GenStats {
    pub(crate) instructions: usize,
    pub(crate) edge_increments: usize,
    pub(crate) checks: usize,
    pub(crate) path_records: usize,
    /// PLT stubs given a trampoline.
    #[serde(default)]
    pub(crate) plt_trampolines: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("encoding the clones failed: {0}")]
    Encode(String),
    #[error("the plan has no CFGs (computed without keep_details)")]
    NoDetails,
    #[error("the cached clones cannot be moved: {0}")]
    Relocate(String),
}

impl From<RuntimeError> for GenError {
    fn from(e: RuntimeError) -> Self {
        GenError::Encode(e.to_string())
    }
}

impl From<IcedError> for GenError {
    fn from(e: IcedError) -> Self {
        GenError::Encode(e.to_string())
    }
}
