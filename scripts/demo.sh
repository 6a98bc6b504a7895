#!/usr/bin/env bash
# Builds burstyd and the bundled demo program, profiles the demo with
# `burstyd run` (sampling and bursty tracing), and shows the top of the
# calling-context profile and of the path profile with `go tool pprof`,
# and the hot-path report (`burstyd hot-paths`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "[demo] building burstyd (release)" >&2
cargo build --release -p burstyd >&2 2> >(grep -v '^warning: burstyd@' >&2)
out=${OUT:-target/demo}
mkdir -p "$out"
gcc -O2 -g -fomit-frame-pointer -o "$out/demo" demo/demo.c

sudo_=()
[ "$(id -u)" = 0 ] || sudo_=(sudo)
echo "[demo] ${sudo_[*]} target/release/burstyd run --freq 999 -o $out -- $out/demo" >&2
"${sudo_[@]}" target/release/burstyd run --freq 999 -o "$out" -- "$out/demo"

echo
echo "[demo] go tool pprof -top $out/context.pb.gz"
go tool pprof -top -nodecount=15 "$out/context.pb.gz" 2>&1
echo
echo "[demo] hottest calling context (go tool pprof -traces, heaviest sample):"
go tool pprof -traces "$out/context.pb.gz" 2>/dev/null >"$out/traces.txt"
awk '
  /^-----------/ { if (w > best) { best = w; keep = blk } blk = ""; w = 0; first = 1; next }
  /^ +[0-9]+ / && first { w = $1 + 0; first = 0 }
  { blk = blk $0 "\n" }
  END { if (w > best) keep = blk; printf "%s", keep }
' "$out/traces.txt"
if [[ -f "$out/paths.pb.gz" ]]; then
    echo
    echo "[demo] hottest Ball-Larus paths from bursty tracing (go tool pprof -top $out/paths.pb.gz):"
    go tool pprof -top -nodecount=8 -sample_index=executions "$out/paths.pb.gz" 2>&1 | sed -n '/flat%/,$p'
    echo
    echo "[demo] how few paths hold most of the sampled event (target/release/burstyd hot-paths --top 5 $out/paths.pb.gz):"
    target/release/burstyd hot-paths --top 5 "$out/paths.pb.gz"
fi
