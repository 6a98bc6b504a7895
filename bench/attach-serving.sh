#!/usr/bin/env bash
# Does a burst attach stall the daemon? Attaching to a large executable
# (analysis, clone generation and a ptrace stop: seconds) runs on its own
# thread; meanwhile sampling, interval profiles and HTTP must keep going.
#
# Generates a C program of N small functions (switches in loops, called
# through a table, so every one is analysed and cloned; non-PIE, -O2),
# starts it, runs `burstyd --pid` with one-second interval profiles and an
# HTTP endpoint, polls /healthz every 100 ms, and reports for the attach
# window (from burstyd's start to its "functions rewritten" line): the
# executable's size, the attach's own timings, the interval profiles
# written inside the window with their sample counts, and the /healthz
# answers (count, failures, worst latency).
#
# Usage (workspace root, as root, after `cargo build --release -p burstyd`):
#   bash bench/attach-serving.sh [--functions N]      (default 27000: ~5.5 MB)
# Environment: BURSTYD_BIN, KEEP=1 keeps the work directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N=27000
while [[ $# -gt 0 ]]; do
    case "$1" in
        --functions) N="$2"; shift 2 ;;
        -h|--help) sed -n "2,17p" "$0"; exit 0 ;;
        *) echo "attach-serving.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "attach-serving.sh: error: $*" >&2; exit 1; }
[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "--functions must be a positive integer"
[[ $(id -u) -eq 0 ]] || die "run as root (burstyd loads eBPF programs and uses ptrace)"
BURSTYD="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
[[ -x "$BURSTYD" ]] || die "$BURSTYD not found: build it with \`cargo build --release -p burstyd\`"
command -v gcc >/dev/null || die "gcc not found (scripts/setup.sh installs it)"
command -v curl >/dev/null || die "curl not found"
command -v go >/dev/null || die "go not found (scripts/setup.sh installs golang-go)"

WORK="$(mktemp -d /tmp/attach-serving.XXXXXX)"
PROG_PID=""
DAEMON_PID=""
cleanup() {
    [[ -n "$DAEMON_PID" ]] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
    [[ -n "$PROG_PID" ]] && kill "$PROG_PID" 2>/dev/null
    [[ "${KEEP:-0}" == 1 ]] && echo "kept $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT

echo "== generating and compiling $N functions" >&2
awk -v n="$N" 'BEGIN {
    print "#include <stdio.h>\nvolatile unsigned long sink;"
    for (i = 0; i < n; i++) {
        printf "__attribute__((noinline)) unsigned long f%d(unsigned long x) {\n", i
        printf "    unsigned long r = x;\n    for (int j = 0; j < (int)(x & 7); j++) {\n"
        printf "        switch ((r + %d) %% 5) {\n", i
        printf "        case 0: r = r * 3 + %d; break;\n        case 1: r ^= r >> 3; break;\n", i
        printf "        case 2: r += %d; break;\n        case 3: r = (r << 1) | 1; break;\n", 7 * i
        printf "        default: r -= %d; break;\n        }\n    }\n    return r;\n}\n", i
    }
    printf "unsigned long (*const table[])(unsigned long) = {"
    for (i = 0; i < n; i++) printf "%sf%d", (i ? "," : ""), i
    print "};"
    print "int main(void) {\n    unsigned long x = 1;\n    for (;;) {"
    print "        for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++) x = table[i](x + i);"
    print "        sink = x;\n    }\n}"
}' >"$WORK/big.c"
gcc -O2 -no-pie -o "$WORK/big" "$WORK/big.c" || die "gcc failed"
SIZE=$(stat -c %s "$WORK/big")

"$WORK/big" &
PROG_PID=$!
sleep 0.5
PORT=$((20000 + RANDOM % 20000))
START=$(date +%s.%N)
"$BURSTYD" --pid "$PROG_PID" --duration 20 --interval 1 --http "127.0.0.1:$PORT" \
    -o "$WORK/out" 2>"$WORK/daemon.log" &
DAEMON_PID=$!

# Poll /healthz until the attach is logged (or 60 s).
: >"$WORK/healthz"
for _ in $(seq 600); do
    t0=$(date +%s.%N)
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$PORT/healthz" || true)
    t1=$(date +%s.%N)
    echo "$t0 $code $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) * 1e3 }')" >>"$WORK/healthz"
    grep -q "functions rewritten\|bursty tracing disabled" "$WORK/daemon.log" && break
    sleep 0.1
done
END=$(date +%s.%N)
grep -q "functions rewritten" "$WORK/daemon.log" || { cat "$WORK/daemon.log" >&2; die "the attach did not finish"; }
kill -INT "$DAEMON_PID"; wait "$DAEMON_PID" || true; DAEMON_PID=""

# /healthz answers after the endpoint came up (it is bound before the attach starts).
read -r N_OK N_BAD WORST < <(awk 'BEGIN { up = 0 } $2 == 200 { up = 1 }
    up { if ($2 == 200) ok++; else bad++; if ($3 > w) w = $3 } END { printf "%d %d %.0f\n", ok, bad, w }' "$WORK/healthz")
# Interval profiles whose files were written inside the attach window.
IN_WINDOW=""
for f in "$WORK"/out/context-*.pb.gz; do
    [[ -e "$f" ]] || continue
    mt=$(date -r "$f" +%s.%N)
    if awk -v m="$mt" -v s="$START" -v e="$END" 'BEGIN { exit !(m >= s && m <= e) }'; then
        n=$(go tool pprof -raw "$f" 2>/dev/null | awk '/^Samples:/ { s = 1; next } /^Locations/ { s = 0 } s && /^ *[0-9]+ / { t += $1 } END { print t + 0 }')
        IN_WINDOW+="$n "
    fi
done
WINDOW=$(awk -v s="$START" -v e="$END" 'BEGIN { printf "%.2f", e - s }')
ATTACH=$(sed "s/\x1b\[[0-9;]*m//g" "$WORK/daemon.log" | grep -o "[0-9]* functions rewritten.*" | head -1)

printf 'executable %.1f MB (%d functions); attach window %s s (burstyd start to "functions rewritten")\n' \
    "$(awk -v s="$SIZE" 'BEGIN { print s / 1e6 }')" "$N" "$WINDOW"
printf 'attach: %s\n' "$ATTACH"
printf 'interval profiles written during the attach, samples each: %s\n' "${IN_WINDOW:-none}"
printf '/healthz during the attach: %d answered 200, %d failed, worst %s ms\n' "$N_OK" "$N_BAD" "$WORST"
