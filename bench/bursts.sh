#!/usr/bin/env bash
# Bursty tracing benchmark on real programs built from source
# (scripts/realprogs.sh: bzip2 1.0.8 and xz 5.4.1, -O2 -g, no frame
# pointers), on deterministic generated text, all measured in one run and
# reported as ratios:
#   - slowdown with `burstyd --pid` attached at default settings (bursts on),
#   - slowdown with the clones injected but bursts disabled (`--burst 0`),
#   - slowdown under `--full-trace` (every path from the first burst on),
#   - bursts per second at default settings,
#   - path-profile accuracy of the default runs against the full trace:
#     PEP's Wall weight matching (hot threshold 0.125% of flow) and edge
#     relative overlap (bench_tool path-accuracy).
# Untraced and traced runs alternate; each time is the program's own wall
# time (wait4 in bench_tool). burstyd attaches with --pid right after the
# program starts (its analysis and injection count against the program;
# its final profile does not).
#
# Usage (workspace root, as root, after `cargo build --release -p burstyd`):
#   bash bench/bursts.sh [--runs N] [--size-mb MB] [--accuracy-mb MB]
# Environment: RUNS (5), SIZE_MB (16: timing input), ACC_MB (4: accuracy and
#   full-trace input), BURSTYD_BIN, KEEP=1 keeps the work directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-5}"
SIZE_MB="${SIZE_MB:-16}"
ACC_MB="${ACC_MB:-4}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --size-mb) SIZE_MB="$2"; shift 2 ;;
        --accuracy-mb) ACC_MB="$2"; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "bursts.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "bursts.sh: error: $*" >&2; exit 1; }
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "--runs must be a positive integer"
[[ $(id -u) -eq 0 ]] || die "run as root (burstyd loads eBPF programs and uses ptrace)"
BURSTYD="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
[[ -x "$BURSTYD" ]] || die "$BURSTYD not found: build it with \`cargo build --release -p burstyd\`"

echo "== preparing" >&2
bash "$ROOT/scripts/realprogs.sh" >&2 || die "scripts/realprogs.sh failed"
(cd "$ROOT" && cargo build --release -q -p burstyd-tests --bin bench_tool) >&2 || die "building bench_tool failed"
TOOL="$ROOT/target/release/bench_tool"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/burstyd-bursts.XXXXXX")"
if [[ "${KEEP:-0}" != 1 ]]; then trap 'rm -rf "$WORK"' EXIT; fi
"$TOOL" gen-text $((SIZE_MB * 1024 * 1024)) 7 "$WORK/input.txt"
"$TOOL" gen-text $((ACC_MB * 1024 * 1024)) 11 "$WORK/acc.txt"

kv() { tr ' ' '\n' <"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }
stats() { sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.4f %.4f %.4f\n", m, v[1], v[NR] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f\n", a / b }'; }
# timed PROG-ARGS... (untraced): prints wall seconds
untraced() { "$TOOL" rusage "$WORK/ru" -- "$@" >/dev/null; kv "$WORK/ru" wall_s; }
# traced OUT BURSTYD-ARGS -- PROG-ARGS...: prints the program's wall seconds.
# The program is started (and timed by wait4 in bench_tool) first, then
# `burstyd --pid` attaches to it, as on a production host; the analysis and
# injection happen while it runs and count against it.
traced() {
    local out="$1"; shift
    local args=()
    while [[ "$1" != "--" ]]; do args+=("$1"); shift; done
    shift
    rm -rf "$out"
    "$TOOL" rusage "$WORK/ru" -- "$@" >/dev/null &
    local tool=$!
    local pid=""
    for _ in $(seq 1 2000); do
        pid=$(pgrep -P "$tool" | head -1 || true)
        [[ -n "$pid" ]] && break
        sleep 0.001
    done
    [[ -n "$pid" ]] || die "could not find the program's pid"
    "$BURSTYD" --pid "$pid" -o "$out" "${args[@]}" >/dev/null 2>"$out.log" &
    local daemon=$!
    wait "$tool" || die "$* failed under burstyd ${args[*]}"
    wait "$daemon" || { tail -20 "$out.log" >&2; die "burstyd --pid ${args[*]} failed"; }
    kv "$WORK/ru" wall_s
}
bursts_taken() { grep -o 'bursts: [0-9]* taken' "$1" | awk '{ s += $2 } END { print s + 0 }'; }

declare -a REPORT
for prog in bzip2 xz; do
    BIN="$ROOT/target/realprogs/bin/$prog"
    case "$prog" in
        bzip2) CMD=("$BIN" -9 -c) ;;
        xz) CMD=("$BIN" -6 -T1 -c) ;;
    esac
    echo "== $prog: $RUNS alternating runs on ${SIZE_MB} MiB: untraced, default, --burst 0" >&2
    "${CMD[@]}" "$WORK/input.txt" >/dev/null
    : >"$WORK/r_def"; : >"$WORK/r_off"; : >"$WORK/bps"
    for i in $(seq 1 "$RUNS"); do
        u=$(untraced "${CMD[@]}" "$WORK/input.txt")
        d=$(traced "$WORK/def" -- "${CMD[@]}" "$WORK/input.txt")
        o=$(traced "$WORK/off" --burst 0 -- "${CMD[@]}" "$WORK/input.txt")
        ratio "$d" "$u" >>"$WORK/r_def"; ratio "$o" "$u" >>"$WORK/r_off"
        b=$(bursts_taken "$WORK/def.log")
        awk -v b="$b" -v t="$d" 'BEGIN { printf "%.1f\n", b / t }' >>"$WORK/bps"
        printf '  run %d: untraced %.3fs default %.3fs (%s bursts) --burst 0 %.3fs\n' "$i" "$u" "$d" "$b" "$o" >&2
    done
    read -r DEF_MED DEF_MIN DEF_MAX < <(stats <"$WORK/r_def")
    read -r OFF_MED OFF_MIN OFF_MAX < <(stats <"$WORK/r_off")
    read -r BPS_MED _ _ < <(stats <"$WORK/bps")

    echo "== $prog: accuracy on ${ACC_MB} MiB: full trace vs $RUNS default runs" >&2
    ua=$(untraced "${CMD[@]}" "$WORK/acc.txt")
    fa=$(traced "$WORK/full" --full-trace -- "${CMD[@]}" "$WORK/acc.txt")
    ests=()
    for i in $(seq 1 "$RUNS"); do
        traced "$WORK/est$i" -- "${CMD[@]}" "$WORK/acc.txt" >/dev/null
        ests+=("$WORK/est$i/paths.pb.gz")
    done
    acc=$("$TOOL" path-accuracy "$BIN" "$WORK/full/paths.pb.gz" "${ests[@]}")
    REPORT+=("$(printf '%-6s default %.4f (min %.4f max %.4f)  --burst 0 %.4f (min %.4f max %.4f)  full-trace %.2fx  bursts/s %.0f  %s' \
        "$prog" "$DEF_MED" "$DEF_MIN" "$DEF_MAX" "$OFF_MED" "$OFF_MIN" "$OFF_MAX" "$(ratio "$fa" "$ua")" "$BPS_MED" "$acc")")
done
echo
echo "bursty tracing, wall time traced/untraced (median over $RUNS alternating runs); accuracy of $RUNS default runs vs a full trace:"
for l in "${REPORT[@]}"; do echo "  $l"; done
echo "targets: default <= 1.02, --burst 0 <= 1.005, wall >= 0.95, overlap >= 0.97"
