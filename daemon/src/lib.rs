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
//! - [`burst`]: bursty tracing of one process: injected clones, burst
//!   records → path profiles.
//! - [`analyze`]: `burstyd analyze`, reports on the rewriter's plan of a binary.
//! - [`config`]: the configuration file and command-line overrides; [`targets`]
//!   turns its target selectors into pids.
//! - [`http`]: the pprof/metrics HTTP endpoint; [`push`]: pushing profiles to
//!   Pyroscope or Parca; [`metrics`]: the daemon's counters.
pub mod analyze;
pub mod burst;
pub mod cct;
pub mod cli;
pub mod config;
pub mod events;
pub mod export;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod pprof;
pub mod procs;
pub mod push;
pub mod sampler;
pub mod session;
pub mod symbolize;
pub mod sys;
pub mod targets;
pub mod unwind;
