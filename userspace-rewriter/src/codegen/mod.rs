//! The apply half's code generation: instrumented clones and their unwind
//! information.
mod clone;
pub mod unwind_info;

pub use clone::{
    CloneImage, ClonedFunction, GenError, GenStats, Layout, generate, generate_excluding,
};
