//! burstyd's binary rewriter: Hirzel & Chilimbi's bursty tracing with
//! Ball-Larus path profiling, for x86-64 ELF programs that are already
//! running.
//!
//! One folder per pipeline stage, each module named for what it produces.
//! In pipeline order:
//!
//! **[`analysis`]** — a deterministic *plan* from the ELF file alone (no
//! process is touched), byte-identical for the same input:
//! - [`analysis::elf`]: ELF facts (build ID, `PT_LOAD` segments, load
//!   bias), shared with the daemon's symbolizer and unwinder;
//! - [`analysis::functions`]: the functions (`.symtab`, `.dynsym`,
//!   `.eh_frame` FDEs, PLT stubs, GCC `.cold` parts);
//! - [`analysis::disasm`]: one function's instructions (iced-x86 linear
//!   sweep), each with its control-flow class;
//! - [`analysis::cfg`]: per function its CFG (blocks, typed edges, exits,
//!   jump tables) or the reason it is skipped, register/flags liveness,
//!   and the whole-file [`analysis::cfg::Analysis`];
//! - [`analysis::graph`]: dominators, back edges, natural loops,
//!   irreducible regions of a CFG;
//! - [`analysis::paths`]: the Ball-Larus path numbering of a CFG and the
//!   regeneration of a path from its number;
//! - `analysis::callgraph` (crate-private): call graph SCCs, Hirzel &
//!   Chilimbi's entry-check set C and k-boring loops;
//! - [`analysis::plan`]: all of the above for a whole file, as one
//!   serializable [`analysis::plan::Plan`].
//!
//! **[`codegen`]** — what gets injected, for a given address:
//! - the instrumented clones and their runtime (signal handler, record
//!   writer, lookups), encoded for the address they will live at:
//!   [`codegen::CloneImage`] from [`codegen::generate_excluding`];
//! - [`codegen::unwind_info`]: `.eh_frame` for the clones, so exceptions
//!   and debuggers unwind through them.
//!
//! **[`inject`]** — the ptrace primitive that applies it to a live
//! process: stop every thread ([`inject::Tracee`]), run syscalls and calls
//! in it, read/write its memory, find room near its binary and a free
//! signal (`/proc`), and let it go exactly as it was.
//!
//! **[`progress`]** — how far the per-function work on a big file is, for
//! a caller that tells a person.
pub mod analysis;
pub mod codegen;
pub mod inject;
pub mod progress;

/// The page size on x86-64 Linux: the kernel maps ELF segments, and
/// `mmap` hands out regions, in pages of this size.
pub const PAGE_SIZE: u64 = 4096;
