//! Sampling: which perf event drives it ([`events`]) and the eBPF program
//! that turns its overflows into raw samples in a ring buffer ([`sampler`];
//! it also holds the `TARGETS` filter and the `BURSTS` map that arms bursty
//! tracing). [`btf`] reads the kernel's task layout, with which the
//! program decides whether a burst signal would go unnoticed.
pub(crate) mod btf;
pub(crate) mod events;
pub(crate) mod sampler;
