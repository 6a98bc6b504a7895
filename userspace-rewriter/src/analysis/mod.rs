//! The analysis half: a deterministic plan from the ELF file alone.
mod callgraph;
pub mod cfg;
pub mod disasm;
pub mod elf;
pub mod functions;
pub mod graph;
pub mod paths;
pub mod plan;
