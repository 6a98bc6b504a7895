#!/usr/bin/env bash
# Speed of the rewriter's analysis (`burstyd analyze`) on a large real
# binary: median wall time over RUNS runs, MB/s and functions/s.
# Target (issue 3): a ~6 MB binary in <= 5 s on a 2-core machine.
# Usage: bash bench/analyze-speed.sh [FILE]   (default: the largest of a few
# 5-8 MB system binaries present here, e.g. /usr/bin/python3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BURSTYD_BIN:-target/release/burstyd}
[ -x "$bin" ] || { echo "build burstyd first: cargo build --release -p burstyd" >&2; exit 1; }
runs=${RUNS:-5}
file=${1:-}
if [ -z "$file" ]; then
    for c in /usr/bin/python3.11 /usr/lib/x86_64-linux-gnu/libSvtAv1Enc.so.1.4.1 \
             /usr/lib/x86_64-linux-gnu/libaom.so.3.6.0 /usr/bin/python3 /usr/lib/x86_64-linux-gnu/libc.so.6; do
        [ -f "$c" ] && { file=$(readlink -f "$c"); break; }
    done
fi
[ -f "$file" ] || { echo "no binary to analyse; pass one" >&2; exit 1; }
size=$(stat -c %s "$file")
times=()
for _ in $(seq "$runs"); do
    s=$(date +%s.%N)
    "$bin" analyze --json "$file" >/tmp/analyze-speed.json
    e=$(date +%s.%N)
    times+=("$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f", e - s }')")
done
med=$(printf '%s\n' "${times[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
funcs=$(python3 -c 'import json; print(json.load(open("/tmp/analyze-speed.json"))["functions_total"])')
awk -v f="$file" -v sz="$size" -v med="$med" -v n="$funcs" -v runs="$runs" -v all="${times[*]}" 'BEGIN {
    printf "burstyd analyze %s (%.1f MB, %d functions), %d runs: %s s\n", f, sz / 1e6, n, runs, all
    printf "  median %.3f s = %.1f MB/s, %.0f functions/s   target <= 5 s: %s\n", med, sz / 1e6 / med, n / med, (med <= 5) ? "ok" : "OVER"
}'
