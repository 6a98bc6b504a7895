//! burstyd's binary rewriter.
pub mod analysis;
pub mod codegen;
pub mod inject;
