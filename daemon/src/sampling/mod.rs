//! Sampling: which perf event drives it ([`events`]) and the eBPF program
//! that turns its overflows into raw samples in a ring buffer ([`sampler`];
//! it also holds the `TARGETS` filter and the `BURSTS` map that arms bursty
//! tracing).
pub(crate) mod events;
pub(crate) mod sampler;
