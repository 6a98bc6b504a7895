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
    /// Memory mode ([`Refs`]): loads, stores and read-modify-writes that
    /// record a `REC_REF` before they run.
    #[serde(default)]
    pub refs: usize,
    /// Memory operands left out as the stack's (see [`Refs::Data`]).
    #[serde(default)]
    pub refs_stack: usize,
    /// Memory operands not recorded because their address cannot be
    /// computed with one `lea` in the clone: `fs`/`gs`-relative (thread
    /// locals), vector-indexed (gathers, scatters); and the string
    /// operations' implicit operands (`movs`, `stos`, ...).
    #[serde(default)]
    pub refs_unsupported: usize,
    /// Tuple profiles ([`Recording`]): loads that make a value tuple,
    /// indirect calls and tail calls that make a target tuple, and those
    /// left out (a stack load; a high-byte destination; an address that
    /// does not fit the record).
    #[serde(default)]
    pub value_tuples: usize,
    #[serde(default)]
    pub target_tuples: usize,
    #[serde(default)]
    pub tuples_left_out: usize,
}

/// Which data references the clones record (`--record refs`; the
/// memory mode of Hirzel & Chilimbi's bursts). A generation option: clones
/// made without it have no trace of it, so path mode costs what it did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Refs {
    /// None (path mode).
    #[default]
    Off,
    /// Heap and global data: every explicit memory operand but the
    /// stack's, decided twice. The rewriter, by the operand: one based on
    /// `rsp`, or on `rbp` in a function whose prologue sets up a frame
    /// pointer (`mov rbp, rsp`), is the stack's and gets no code. The
    /// runtime (`rt_ref`), by the address: one from the red zone below
    /// the thread's `rsp` up to 8 MiB above it is the stack's (a local
    /// whose address went into another register). `push`, `pop`, `call`
    /// and `ret` are never recorded.
    Data,
    /// Every explicit memory operand, the stack's too (`--refs-stack`).
    All,
}

/// What the clones record besides paths, calls and returns: a generation
/// option (clones made without a kind of record have no trace of it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Recording {
    /// Memory mode's data references.
    pub refs: Refs,
    /// Value tuples: after each load of an integer register from memory
    /// that is not the stack's (`mov`, `movzx`, `movsx`, `movsxd`), the
    /// tuple ⟨the load's address, the value loaded⟩ goes to `rt_tuple`.
    pub values: bool,
    /// Target tuples: before each indirect call and indirect tail call,
    /// ⟨the instruction's address, the original target⟩.
    pub targets: bool,
}

impl Recording {
    /// What the plan cache key adds for clones made with it.
    pub fn key_suffix(self) -> String {
        let mut s = self.refs.key_suffix().to_string();
        if self.values {
            s.push_str("-values");
        }
        if self.targets {
            s.push_str("-targets");
        }
        s
    }
}

impl Refs {
    /// What the plan cache key adds for clones made with it.
    pub fn key_suffix(self) -> &'static str {
        match self {
            Refs::Off => "",
            Refs::Data => "-refs",
            Refs::All => "-refs-stack",
        }
    }
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
