//! burstyd's binary rewriter.
//!
//! The analysis half computes a deterministic *plan* from an ELF file alone
//! (no process is touched): one module per stage, named for what it
//! produces.
//! - [`elf`]: ELF facts (build ID, PT_LOAD segments, load bias), shared with
//!   the daemon's symbolizer and unwinder.
//! - [`functions`]: function discovery (.symtab, .dynsym, .eh_frame FDEs, PLT,
//!   GCC `.cold` parts).
//! - [`disasm`]: x86-64 decoding (iced-x86) of one function.
//! - [`cfg`]: basic blocks and edges, jump tables, skip reasons.
//! - [`graph`]: dominators, back edges, natural loops on any CFG.
//! - [`paths`]: Ball-Larus path numbering and regeneration.
//! - [`callgraph`]: call graph SCCs, the entry-check set C, k-boring loops.
//! - [`plan`]: all of the above for a whole file, as one serializable plan.
//!
//! The apply half works on a live process:
//! - [`inject`]: the ptrace primitive: stop a process, run syscalls and
//!   calls in it, read/write its memory, find room near its binary and a
//!   free signal, and let it go exactly as it was.
pub mod callgraph;
pub mod cfg;
pub mod clone;
pub mod disasm;
pub mod elf;
pub mod functions;
pub mod graph;
pub mod inject;
pub mod paths;
pub mod plan;
pub mod runtime;
pub mod unwind_info;
