//! The analysis half: a deterministic plan from the ELF file alone, one
//! module per stage (see the crate docs for the map): [`elf`] →
//! [`functions`] → [`disasm`] → [`cfg`](mod@cfg) → [`graph`] → [`paths`] and
//! `callgraph` → [`plan`].
mod callgraph;
pub mod cfg;
pub mod cost;
pub mod disasm;
pub mod elf;
pub mod functions;
pub mod graph;
pub mod paths;
pub mod plan;
