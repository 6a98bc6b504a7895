//! Builds the eBPF programs in `../ebpf` for bpfel-unknown-none with
//! aya-build and leaves the object in OUT_DIR, where `src/sampling/sampler.rs` embeds
//! it with `include_bytes_aligned!`.
//!
//! The eBPF crate needs `-Z build-std=core`. We build it with the pinned
//! stable toolchain (rust-toolchain.toml) with RUSTC_BOOTSTRAP=1 set for the
//! nested cargo only, so no nightly toolchain is needed. bpf-linker must be on PATH
//! (`cargo install bpf-linker@0.10.3 --locked`; scripts/setup.sh does it).
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=BURSTYD_EBPF_TOOLCHAIN");
    let toolchain = std::env::var("BURSTYD_EBPF_TOOLCHAIN").unwrap_or_else(|_| "1.95.0".into());
    if which("bpf-linker").is_none() {
        return Err(anyhow!(
            "bpf-linker is not on PATH; install it with `cargo install bpf-linker@0.10.3 --locked` \
             (or run scripts/setup.sh)"
        ));
    }
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    let manifest = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest.join("../ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "burstyd-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
