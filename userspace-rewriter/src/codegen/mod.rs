//! Instrumented clones: the *apply* side's code generator.
//!
//! For every function the plan could analyse, this module emits a copy of
//! its instructions, relocated to a region near the binary (iced-x86's
//! block encoder re-encodes branches and RIP-relative operands for the new
//! addresses), with the instrumentation of Hirzel & Chilimbi's *instrumented
//! code* woven in:
//!
//! - **Ball-Larus path register** updates on DAG edges (edge stubs out of
//!   line, so a taken branch and a fall-through each get their own
//!   increment), path records at exits and truncated (back) edges, the
//!   register restarted after a back edge (PEP §3.1-3.3);
//! - **calls and returns**: an `ENTER` record and a shadow-stack push at
//!   every clone entry, the caller's path register restored at the return;
//! - **checks** (the burst budget) at every clone entry, on every
//!   truncated edge (back edges, retreating edges of irreducible regions,
//!   edges cut to bound the paths: each path record there is a check) and
//!   at every return site. A check that fails jumps to the *same*
//!   instruction in the original code: the burst ends there and the thread
//!   runs on at full speed.
//!
//! Direct calls and jumps between cloned functions stay in the clones;
//! calls to anything else (PLT, libraries, indirect) go to the original and
//! come back to the clone's return site. A `ret` (or tail call) whose return
//! address is in original code is an activation older than the burst: the
//! runtime looks the address up and, when it was rewritten, sends the return
//! to the caller's clone, so the burst climbs up the stack instead of
//! escaping into original code; when not, the burst ends.
//!
//! Every snippet preserves all registers and, unless liveness proves them
//! dead, the flags, and skips the 128-byte red zone before pushing. The
//! state shared with the daemon lives in
//! [`burstyd_common::burst::BurstControl`], the burst's own (owner, budget,
//! path register, shadow stack) in the process-private
//! [`burstyd_common::burst::BurstLocal`] a forked child sees zeroed; both
//! are reached RIP-relatively. Only the thread that owns the burst gets
//! past a check or writes a record, so the single set of registers there
//! is never shared.
//!
//! The runtime (signal handler, restorer, record writer, table lookup) is
//! emitted at the start of the region. The handler maps the interrupted PC
//! through a sorted `(original, clone)` table of every rewritten
//! instruction, so a burst can start at any instruction of a cloned
//! function; the path register starts as
//! [`PATH_INVALID`](burstyd_common::burst::PATH_INVALID) (the path's prefix
//! was not seen) and becomes valid at the next path start.
//!
//! ## Files
//!
//! - `emitter.rs`: `Emitter`, an instruction list with
//!   labels for iced's block encoder, and small instruction helpers;
//! - `batches.rs`: `Batches`, the clones encoded a batch of functions at
//!   a time at their final addresses, branches across batches patched;
//! - `layout.rs`: the vocabulary every other file shares: [`Layout`],
//!   [`GenStats`], [`GenError`];
//! - `operand.rs`: how generated code reaches data at an absolute
//!   address (`data_operand`, [`LOW_STATE_LIMIT`]);
//! - `tables.rs`: the runtime's sorted `(original, clone)` [`Tables`],
//!   merged across modules;
//! - `image.rs`: [`generate_excluding`] — which functions get a clone, the
//!   encoding at the target address, the `(original, clone)` tables —
//!   its result [`CloneImage`], and moving it to another layout;
//! - `function.rs`: `FnGen`, one function copied block by block and
//!   relocated, with its out-of-line code;
//! - `transfers.rs`: control transfers in a clone (calls, indirect calls,
//!   returns and other exits, tail calls, switch jumps);
//! - `instrument.rs`: the instrumentation proper (Ball-Larus increments,
//!   path records on truncated edges, Hirzel & Chilimbi's checks);
//! - `references.rs`: memory mode, a `REC_REF` record before each load,
//!   store and read-modify-write ([`Refs`]);
//! - `runtime/`: the runtime placed at the start of the region (record
//!   writer, table lookups, enter/exit/back/end routines, signal handler
//!   and restorer), assembled with iced's `CodeAssembler`, one routine per
//!   file, each unit-tested in the test process;
//! - `stack_heights.rs`: where `rsp` is at every instruction of the
//!   clones and the runtime, relative to an original instruction;
//! - [`unwind_info`]: `.eh_frame` for the clones and the runtime's
//!   routines, with rows inside the snippets from those heights.

// Declared before `local!` below: the runtime has its own `local!`.
mod runtime;

/// The operand "address" of the calling thread's
/// [`BurstRegs`](burstyd_common::burst::BurstRegs) field `f`, in its TCB
/// (`fs:[TLS_REGS + offset]`, see [`TLS_TAG`](operand::TLS_TAG)). `_l` (the `Layout`) is
/// not needed: the registers are per thread, not per region.
macro_rules! local {
    ($_l:expr, $f:ident) => {{
        let _ = &$_l;
        $crate::codegen::operand::TLS_TAG
            + burstyd_common::burst::TLS_REGS as u64
            + core::mem::offset_of!(burstyd_common::burst::BurstRegs, $f) as u64
    }};
}

mod batches;
mod emitter;
mod function;
mod image;
mod instrument;
mod layout;
mod operand;
mod references;
mod relocs;
mod reverse;
mod stack_heights;
mod tables;
mod transfers;
mod tuples;
pub mod unwind_info;

pub use image::{BytesMove, CloneImage, ClonedFunction, generate, generate_excluding};
pub use layout::{GenError, GenStats, Layout, Recording, Refs};
pub use operand::LOW_STATE_LIMIT;
pub use relocs::Relocs;
pub use reverse::ReverseMap;
pub use runtime::NO_PATH;
pub use tables::{Pairs, TableSource, Tables};
