//! Host-side library target of the eBPF crate. It exists only so that the
//! daemon can list this crate as a build-dependency (cargo then rebuilds the
//! daemon when this crate changes); the programs are in `main.rs`, built for
//! bpfel-unknown-none by `daemon/build.rs`.
#![no_std]
