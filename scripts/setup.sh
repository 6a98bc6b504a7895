#!/usr/bin/env bash
# Installs what building and testing burstyd needs, if it is missing, and
# says what it installs. Safe to run again: it only acts on what is absent.
#   - the Rust toolchain pinned in rust-toolchain.toml, with rust-src
#     (rustup installs it on first use; we trigger that here)
#   - bpf-linker 0.10.3 (links the eBPF programs, uses rustc's own LLVM)
#   - Debian packages: gcc, golang-go (for `go tool pprof`, the reference
#     pprof reader), bolt-19 (llvm-bolt, which the tests feed burstyd's
#     edges.fdata); linux-perf is NOT needed.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*" >&2; }

export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v rustup >/dev/null; then
    say "rustup is missing: install Rust from https://rustup.rs (or your distro) first"
    exit 1
fi
toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1 ||
   ! rustup component list --toolchain "$toolchain" --installed 2>/dev/null | grep -q '^rust-src'; then
    say "installing Rust $toolchain with rust-src, clippy, rustfmt (rustup)"
    rustup toolchain install "$toolchain" --profile minimal -c rust-src -c clippy -c rustfmt >&2
fi

if ! command -v bpf-linker >/dev/null || ! bpf-linker --version 2>/dev/null | grep -q '0\.10\.3'; then
    say "installing bpf-linker 0.10.3 with cargo (about 3 minutes, once)"
    cargo install bpf-linker@0.10.3 --locked >&2
fi

need=()
command -v gcc >/dev/null || need+=(gcc)
command -v g++ >/dev/null || need+=(g++)
# Real programs the tests trace: troff (C++ with landing pads), python3.11.
command -v troff >/dev/null || need+=(groff-base)
command -v python3.11 >/dev/null || need+=(python3.11)
command -v go >/dev/null || need+=(golang-go)
# libc's separate debug file: names for its local functions in profiles.
dpkg -s libc6-dbg >/dev/null 2>&1 || need+=(libc6-dbg)
# llvm-bolt: the test that feeds burstyd's edges.fdata to BOLT.
command -v llvm-bolt-19 >/dev/null || command -v llvm-bolt >/dev/null || need+=(bolt-19)
# valgrind: lackey's complete data reference trace, the hot data streams'
# independent reference (and callgrind for bench/).
command -v valgrind >/dev/null || need+=(valgrind)
for extra in ${BURSTYD_EXTRA_APT:-}; do
    dpkg -s "$extra" >/dev/null 2>&1 || need+=("$extra")
done
if ((${#need[@]})); then
    if [ "$(id -u)" != 0 ]; then
        say "missing packages ${need[*]}; run as root or: sudo apt-get install ${need[*]}"
        exit 1
    fi
    say "installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${need[@]}" >&2
fi
