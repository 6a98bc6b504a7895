//! burstyd: a near-zero-overhead profiler for native Linux programs.
//!
//! Pipeline (one module per stage, named for what it produces):
//! - [`events`]: which perf event drives sampling (with the no-PMU fallback).
//! - [`sampler`]: the eBPF perf_event program and its ring buffer → raw samples.
//! - [`procs`]: per-process memory maps and loaded ELF modules.
//! - [`unwind`]: raw samples → user call stacks (CFI unwinding, no frame pointers needed).
//! - [`cct`]: stacks → calling context trees per process, weighted by the event.
//! - [`symbolize`]: addresses → functions, files, lines, inline frames.
//! - [`pprof`]: calling context trees → profile.proto.
//! - [`sys`]: the raw syscalls the daemon makes itself.
//! - [`notify`]: systemd readiness, status and watchdog notifications.
//! - [`analyze`]: `burstyd analyze`, reports on the rewriter's plan of a binary.
pub mod analyze;
pub mod cct;
pub mod cli;
pub mod events;
pub mod export;
pub mod notify;
pub mod pprof;
pub mod procs;
pub mod sampler;
pub mod session;
pub mod symbolize;
pub mod sys;
pub mod unwind;
