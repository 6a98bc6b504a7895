#!/usr/bin/env bash
# Runs burstyd's whole test suite: formatting, clippy, unit tests and the
# integration tests (real kernel, real eBPF, real programs; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
quiet() { grep -v '^warning: burstyd@' >&2 || true; }

echo "[test] import cycles (scripts/import_cycles.py, and its self-test)" >&2
python3 scripts/import_cycles.py --self-test
python3 scripts/import_cycles.py
echo "[test] cargo fmt --check" >&2
cargo fmt --all -- --check
echo "[test] cargo build --release -p burstyd" >&2
cargo build --release -p burstyd 2> >(quiet)
echo "[test] cargo clippy" >&2
cargo clippy --workspace --exclude burstyd-ebpf --all-targets -- -D warnings 2> >(quiet)
echo "[test] cargo test" >&2
# default-members: every crate but the eBPF one, which only builds for BPF.
# --no-fail-fast: one failing test binary must not hide the results of the
# others.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# One plan cache for the whole suite, as on a host: the first test to
# trace a file analyses it, the others move its cached clones.
export BURSTYD_CACHE_DIR="$PWD/target/burstyd-tests/plan-cache"
BURSTYD_BIN="$PWD/target/release/burstyd" cargo test --no-fail-fast 2> >(quiet) | tee "$log" || status=$?
# One closing line for the whole suite (cargo prints one per test binary,
# the last of which is often an empty doc-test run).
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "all tests: %d passed, %d failed, %d ignored\n", p, f, i }' "$log" >&2
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"

