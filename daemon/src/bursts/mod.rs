//! Bursty tracing of live processes (`--pid`, `run`, the service's
//! targets): inject the instrumented clones, arm them, turn the records
//! their bursts write into path counts, disarm.
//!
//! The stages, lowest first (each file imports only those above it in
//! this list, `scripts/import_cycles.py` checks it):
//! - [`options`], [`stats`]: how bursts run, what they add up to;
//!   [`progress`]: how far the attach thread's work is;
//! - [`modules`]: the modules a process maps (file, bias, range, hash);
//! - [`facts`]: what the exporters know of a module with clones;
//! - [`cache`]: the plan cache (plans and clones, by file content);
//! - [`prepare`]: one module analysed and its clones generated for a
//!   layout, no process touched; [`worker`]: the same in a child process,
//!   into the cache; [`plans`]: cache, worker or in-daemon analysis;
//! - [`tables`], [`ring`]: the lookup tables written into the target and
//!   the memory shared with it; [`linkmap`]: the tables kept true to the
//!   link map as libraries come and go;
//! - [`rooms`]: address-space planning and mapping in the target;
//! - [`attachment`]: a running attachment's controls (arm, disarm,
//!   relink, reap, restore the signal);
//! - [`libraries`]: libraries cloned into a running attachment;
//! - [`attach`]: the ptrace attach that injects the clones (or re-arms);
//!   [`exec_gate`]: `run`'s command held at its entry point;
//! - [`decode`]: raw records → [`decode::BurstEvent`]s, the only code that
//!   knows the record format; [`estimate`]: what each burst's counts are
//!   worth, and the estimates' confidence; [`counts`]: events → path
//!   counts per calling context within a burst, and the raw trace
//!   (`--save-bursts`);
//!   [`contexts`]: the calling contexts of paths; [`place`]: records'
//!   instructions named by module and static address; [`data_refs`]:
//!   memory mode's references per burst, into the process's reference
//!   grammar; [`tuples`]: the tuple profiles (values loaded, indirect
//!   targets) and their error against an exact reference;
//! - [`coverage`]: hot coverage (the share of samples in cloned code);
//! - [`traced`]: what the exporters know of a traced process;
//!   [`tracer`]: one traced process; [`tracers`]: all of them and the
//!   attach thread; [`selection`]: which of the service's processes are
//!   traced; [`parallel`]: a small thread pool for the analyses.
//!
//! The profiles made of the counts are in [`crate::export`].
//!
//! If the daemon dies, the target keeps its handler and regions; without
//! the eBPF program no burst starts, and nothing in the target waits for
//! the daemon (a full ring truncates the burst; in full-trace mode the
//! writer yields a bounded number of times, then drops).
pub(crate) mod attach;
pub(crate) mod attachment;
pub(crate) mod cache;
pub(crate) mod contexts;
pub(crate) mod counts;
pub(crate) mod coverage;
pub(crate) mod data_refs;
pub(crate) mod decode;
pub(crate) mod estimate;
pub(crate) mod exec_gate;
pub(crate) mod facts;
pub(crate) mod fdata_facts;
pub(crate) mod libraries;
pub(crate) mod linkmap;
pub(crate) mod modules;
pub(crate) mod options;
mod parallel;
pub(crate) mod place;
pub(crate) mod plans;
pub(crate) mod prepare;
pub(crate) mod progress;
pub(crate) mod ring;
pub(crate) mod rooms;
pub(crate) mod selection;
pub(crate) mod stats;
pub(crate) mod tables;
pub(crate) mod traced;
pub(crate) mod tracer;
pub(crate) mod tracers;
pub(crate) mod tuples;
pub(crate) mod worker;
