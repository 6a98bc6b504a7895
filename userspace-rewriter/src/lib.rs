//! burstyd's binary rewriter.
//!
//! Today this crate holds the ELF reading that the daemon's symbolizer and
//! unwinder share ([`elf`]); the analysis (CFGs, loops, Ball-Larus paths)
//! and the clone generator build on it.
pub mod elf;
