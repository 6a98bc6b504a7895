//! Raw samples → call stacks → calling context trees, and addresses →
//! names. `/proc/PID/maps` lines are the rewriter's
//! [`userspace_rewriter::inject::MapEntry`]. Lowest first:
//! - [`modules`]: the ELF files behind executable mappings;
//! - [`clones`]: bursty tracing's injected code, as the unwinder sees it;
//! - [`table`]: per-process maps snapshots and the shared module cache;
//! - [`unwind`]: register snapshot + stack copy → return addresses (CFI);
//! - [`cct`]: stacks → calling context trees per thread;
//! - [`symbolize`]: addresses → functions, files, lines, inline frames
//!   (a module's DWARF opened by [`dwarf`], in the daemon by a worker
//!   process: [`dwarf_worker`]).
pub(crate) mod cct;
pub(crate) mod clones;
pub(crate) mod dwarf;
pub(crate) mod dwarf_worker;
pub(crate) mod kernel_symbols;
pub(crate) mod lines;
pub(crate) mod modules;
pub(crate) mod symbolize;
pub(crate) mod table;
pub(crate) mod unwind;
