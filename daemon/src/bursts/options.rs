//! How bursts run: the options of an attach (the command line's, or the
//! configuration's), and the defaults and thresholds they rest on.
use std::path::PathBuf;

/// How bursts run.
#[derive(Clone, Debug)]
pub(crate) struct BurstOptions {
    /// Checks per burst (`--burst`).
    pub(crate) burst_len: u64,
    /// Every event, from the first burst on, for ground truth.
    pub(crate) full_trace: bool,
    /// Measure each path's time with the time-stamp counter.
    pub(crate) measure: bool,
    /// Bursts that may run at once in a process, on as many threads (1
    /// to `MAX_SLOTS`).
    pub(crate) max_bursts: u64,
    /// Which shared libraries are cloned besides the executable.
    pub(crate) libraries: Libraries,
    /// Write raw burst traces here (`--save-bursts`).
    pub(crate) save_bursts: Option<PathBuf>,
    /// How each burst's counts are weighted into the estimates
    /// (`--weights`).
    pub(crate) weights: super::estimate::Weighting,
    /// Memory mode: which data references the clones record (`--record
    /// refs`, `--refs-stack`).
    pub(crate) refs: userspace_rewriter::codegen::Refs,
    /// Memory mode: the references one burst records (`--refs-burst`).
    pub(crate) refs_burst: u64,
    /// Tuple profiles: the clones make value tuples, target tuples
    /// (`--record values,targets`).
    pub(crate) values: bool,
    pub(crate) targets: bool,
    /// How the runtime compresses the tuples of the tuple profiles
    /// (`--sampler`, `--sample-rate`, `--strata`): each output of the
    /// sampler stands for `tuple_config.weight()` tuples.
    pub(crate) tuple_config: burstyd_common::burst::TupleConfig,
}

impl BurstOptions {
    /// What the clones record besides paths (a generation option).
    pub(crate) fn recording(&self) -> userspace_rewriter::codegen::Recording {
        userspace_rewriter::codegen::Recording {
            refs: self.refs,
            values: self.values,
            targets: self.targets,
        }
    }
}

/// What bursts record besides paths, calls and returns (`--record`,
/// `[bursts] record`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Record {
    /// Every load, store and read-modify-write of heap and global data
    /// (the stack's too with `--refs-stack`): hot data streams.
    Refs,
    /// Every load of an integer register from heap or global data, with
    /// the value loaded: the value profile (`values.pb.gz`).
    Values,
    /// Every indirect call and tail call, with its target: the
    /// call-target profile (`targets.pb.gz`, BOLT's call records).
    Targets,
}

/// How the target compresses tuples (`--sampler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Sampler {
    /// Every tuple (the reference).
    Exact,
    /// R_r: each kept with probability 1/r.
    Random,
    /// H[P_r]_n: hashed into n substreams, every r-th of each kept.
    Stratified,
}

/// The name of a compressor's sampler (`TupleConfig::sampler`), as
/// `--sampler` spells it.
pub(crate) fn sampler_name(sampler: u64) -> &'static str {
    use burstyd_common::burst::{SAMPLER_RANDOM, SAMPLER_STRATIFIED};
    match sampler {
        SAMPLER_RANDOM => "random",
        SAMPLER_STRATIFIED => "stratified",
        _ => "exact",
    }
}

/// `--sample-rate` unless given.
pub(crate) const DEFAULT_SAMPLE_RATE: u64 = 16;
/// `--strata` unless given.
pub(crate) const DEFAULT_STRATA: u64 = 2048;

/// The compressor's configuration `sampler`, `rate` and `strata` ask
/// for (by default stratified at rate 16 in 2048 strata: at the same
/// rate its error on the hot values is 1.7-3.3 times lower than
/// random's on four real programs, and it sends a sixteenth of exact's
/// records; `bench/tuples.sh`), the associative table always on
/// (lossless); with `reference` every tuple written exactly too (an
/// evaluation's reference).
pub(crate) fn tuple_config(
    sampler: Option<Sampler>,
    rate: Option<u64>,
    strata: Option<u64>,
    reference: bool,
) -> burstyd_common::burst::TupleConfig {
    use burstyd_common::burst::{SAMPLER_EXACT, SAMPLER_RANDOM, SAMPLER_STRATIFIED, TupleConfig};
    TupleConfig {
        sampler: match sampler.unwrap_or(Sampler::Stratified) {
            Sampler::Exact => SAMPLER_EXACT,
            Sampler::Random => SAMPLER_RANDOM,
            Sampler::Stratified => SAMPLER_STRATIFIED,
        },
        assoc: true,
        reference,
        strata: strata.unwrap_or(DEFAULT_STRATA),
        rate: rate.unwrap_or(DEFAULT_SAMPLE_RATE),
    }
}

/// The memory mode `record` and `refs_stack` ask for.
pub(crate) fn refs_mode(record: &[Record], refs_stack: bool) -> userspace_rewriter::codegen::Refs {
    use userspace_rewriter::codegen::Refs;
    match (record.contains(&Record::Refs), refs_stack) {
        (false, _) => Refs::Off,
        (true, false) => Refs::Data,
        (true, true) => Refs::All,
    }
}

/// Which of a traced process's shared libraries get clones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Libraries {
    /// The executable only (`--exe-only`, `libraries = false`).
    None,
    /// Those where the process spends its time: a library is cloned once
    /// it holds [`HOT_LIBRARY_SHARE`] of the process's user-mode samples
    /// (the service's default). A long-running server maps many
    /// libraries it hardly runs (redis: 17, of which libc holds nearly
    /// all the library time); their plans, maps and clones cost the
    /// daemon about 3 MB each and cover no samples.
    Hot,
    /// All of them at attach, and those loaded later (`--pid`, `run`:
    /// a command held at its entry point is covered from its first
    /// instruction).
    All,
}

/// The share of a process's user-mode samples (event weight) a library
/// must hold to be cloned under [`Libraries::Hot`].
pub(crate) const HOT_LIBRARY_SHARE: f64 = 0.01;

/// Records one drain of a process's rings must find for the next drain to
/// come after [`BUSY_DRAIN_AGAIN`] rather than the usual interval: long
/// bursts (`--burst 100000`) or many threads write half a sub-ring within
/// the 100 ms between drains, and the handler declines bursts meanwhile
/// ("daemon behind"). 16384 records is a quarter of half a sub-ring: at
/// that rate, the next interval's records and a memory-mode burst's
/// ([`DEFAULT_REFS_BURST`]) stay below half.
pub(crate) const BUSY_DRAIN_RECORDS: u64 = 16384;

/// How soon rings that held many records are drained again.
pub(crate) const BUSY_DRAIN_AGAIN: std::time::Duration = std::time::Duration::from_millis(5);

/// Memory mode: the references one burst records by default. Hot data
/// streams are rule expansions of a grammar, and Sequitur's grammar of
/// many short bursts cut the same stream at many places (each burst
/// starts inside one): the shares of its streams were not those of the
/// whole trace (the grammar is locally consistent now, and the ends of
/// bursts still cut streams). Samples of sqlite3's complete trace (2.2 million
/// references, 2026-11-29) overlapped it (equation 5) 0.26 in 800
/// bursts of 2,000 references, 0.43 in 160 of 10,000, 0.64 in 32 of
/// 50,000; xz's 0.66, 0.67, 0.77. The same references a second (the
/// daemon's analysis rate) in fewer, longer bursts: the handler takes
/// one burst in `refs_every` of this length. A burst's half of its
/// sub-ring (64 Ki records) bounds it.
pub(crate) const DEFAULT_REFS_BURST: u64 = 1 << 15;

/// A burst that records references has at most this many times the
/// checks of a path-mode burst (its references bound it first where it
/// makes any).
pub(crate) const REFS_BURST_CHECKS: u64 = 100;

/// Default checks per burst. A path is counted only when its burst saw
/// it start, so a path that spans calls into long-running callees needs
/// a burst longer than the callees: xerces-c's parser's edge profile
/// reached 0.940 relative overlap against callgrind with 200 checks, 0.974
/// with 500, 0.980 with 1000 (eight `run`s of a 3 MiB input each,
/// 2026-11-26). A burst's checks cost less than its signal (36 µs a burst
/// at 200 checks, 27 µs of it the signal, for xerces; xz's checks are the
/// densest: 19 µs of 42), so 500 keeps bursts within the 2% target.
pub(crate) const DEFAULT_BURST: u64 = 500;
