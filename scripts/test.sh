#!/usr/bin/env bash
# Runs burstyd's whole test suite: formatting, clippy, unit tests and the
# integration tests (real kernel, real eBPF, real programs; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
quiet() { grep -v '^warning: burstyd@' >&2 || true; }

echo "[test] cargo fmt --check" >&2
cargo fmt --all -- --check
echo "[test] cargo build --release -p burstyd" >&2
cargo build --release -p burstyd 2> >(quiet)
echo "[test] cargo clippy" >&2
cargo clippy --workspace --exclude burstyd-ebpf --all-targets -- -D warnings 2> >(quiet)
echo "[test] cargo test" >&2
BURSTYD_BIN="$PWD/target/release/burstyd" cargo test --workspace 2> >(quiet)
