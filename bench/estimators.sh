#!/usr/bin/env bash
# How the path profile of bursts converges, and to what: for each program
# at about 100, 300, 1,000 and 3,000 bursts (one run each, the burst rate
# set from the program's traced run time), in one table,
#   - cg: the edge relative overlap against callgrind's exact branch counts
#     (`--collect-jumps=yes`, bench_tool callgrind-accuracy), an
#     independent truth; it weighs each branch's taken/not-taken split by
#     its frequency, so it barely sees a bias in how executions split
#     among functions;
#   - fn: how executions split among functions against the full trace's
#     split (bench_tool function-overlap): this one sees it;
# each for the full trace (every path from the first burst on), the
# executions recorded in default bursts counted alike (`rec`: the
# estimator before issue 32, sample type `recorded`), the estimates
# (`est`: sample type `executions`, each execution weighted by the checks
# its path spans) and the same with bursts weighted by the static cost of
# their paths (`static`: `--weights static`; see ARCHITECTURE.md
# "Estimates from bursts").
# Programs: tests/fixtures/density.c (two loops run equally often, one
# dense in checks and one sparse: a 20x contrast in time per check),
# Lua 5.4 on tests/fixtures/gc_heavy.lua (the garbage collector's loops
# against the interpreter's dispatch) and cpu_bound.lua, gawk 5.2 and
# python3.11 on their cpu_bound scripts (scripts/realprogs.sh builds Lua
# and gawk).
#
# usage: bash bench/estimators.sh [--bursts "100 300 1000 3000"] [--programs "density lua-gc lua gawk python3.11"]
# env: BURSTYD_BIN, KEEP=1 keeps the work directory.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BURSTS="100 300 1000 3000"
PROGRAMS="density lua-gc lua gawk python3.11"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bursts) BURSTS="$2"; shift 2 ;;
        --programs) PROGRAMS="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "estimators.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "estimators.sh: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "run as root (burstyd loads eBPF programs and uses ptrace)"
command -v valgrind >/dev/null || die "valgrind not found (the callgrind ground truth): apt-get install -y valgrind"
BIN="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
TOOL="$ROOT/target/release/bench_tool"
[[ -x "$BIN" && -x "$TOOL" ]] || (cd "$ROOT" && cargo build --release -p burstyd -p burstyd-tests --bin burstyd --bin bench_tool >&2)
WORK="$(mktemp -d /tmp/burstyd-estimators.XXXXXX)"
[[ "${KEEP:-}" == 1 ]] || trap 'rm -rf "$WORK"' EXIT
FX="$ROOT/tests/fixtures"
RP="$ROOT/target/realprogs/bin"

command_for() {
    case "$1" in
        density)
            gcc -O2 -fomit-frame-pointer -g -o "$WORK/density" "$FX/density.c"
            echo "$WORK/density" ;;
        lua-gc) echo "$RP/lua $FX/gc_heavy.lua 15" ;;
        lua) echo "$RP/lua $FX/cpu_bound.lua 300" ;;
        gawk) echo "$RP/gawk -v rounds=300 -f $FX/cpu_bound.awk" ;;
        python3.11) echo "/usr/bin/python3.11 $FX/cpu_bound.py nowait 40" ;;
        *) die "unknown program $1" ;;
    esac
}
bursts_of() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sum(p['metrics'].get('burstyd_traced_bursts_total',0) for p in d['processes']))" "$1/summary.json"; }
cg() { BENCH_VALUE="$3" "$TOOL" callgrind-accuracy "$1" "$2" "$4/paths.pb.gz" | sed 's/ .*//; s/overlap=//'; }
fn() { BENCH_VALUE="$2" "$TOOL" function-overlap "$1/paths.pb.gz" "$3/paths.pb.gz" | sed 's/overlap=//'; }

printf '%-11s %6s %6s | cg %6s %6s %6s %6s | fn %6s %6s %6s\n' program target bursts full rec est static rec est static
for prog in $PROGRAMS; do
    if [[ "$prog" != density && "$prog" != python3.11 && ! -x "$RP/${prog%-gc}" ]]; then
        echo "$prog: not built (bash scripts/realprogs.sh)" >&2; continue
    fi
    read -r -a CMD <<< "$(command_for "$prog")"
    exe="${CMD[0]}"
    valgrind --tool=callgrind --collect-jumps=yes --dump-instr=yes --compress-pos=no --compress-strings=no \
        --callgrind-out-file="$WORK/$prog.cg" "${CMD[@]}" >/dev/null 2>"$WORK/$prog.cg.log" \
        || { tail -5 "$WORK/$prog.cg.log" >&2; die "callgrind failed for $prog"; }
    "$BIN" run --full-trace -o "$WORK/$prog-full" -- "${CMD[@]}" >/dev/null 2>"$WORK/$prog-full.log" \
        || die "full trace of $prog failed: $(tail -3 "$WORK/$prog-full.log")"
    full=$(cg "$exe" "$WORK/$prog.cg" executions "$WORK/$prog-full")
    # The traced run time at the default rate sets the rate for each target.
    t0=$(date +%s.%N)
    "$BIN" run -o "$WORK/$prog-rate" -- "${CMD[@]}" >/dev/null 2>&1
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    for k in $BURSTS; do
        hz=$(awk -v k="$k" -v s="$secs" 'BEGIN { f = int(k / s + 0.5); print (f < 1 ? 1 : f) }')
        out="$WORK/$prog-$k" cost="$WORK/$prog-$k-cost"
        "$BIN" run -F "$hz" -o "$out" -- "${CMD[@]}" >/dev/null 2>"$out.log" || die "$prog at $hz Hz failed: $(tail -3 "$out.log")"
        "$BIN" run -F "$hz" --weights static -o "$cost" -- "${CMD[@]}" >/dev/null 2>"$cost.log" || die "$prog at $hz Hz failed: $(tail -3 "$cost.log")"
        printf '%-11s %6s %6s | cg %6s %6s %6s %6s | fn %6s %6s %6s\n' "$prog" "$k" "$(bursts_of "$out")" "$full" \
            "$(cg "$exe" "$WORK/$prog.cg" recorded "$out")" "$(cg "$exe" "$WORK/$prog.cg" executions "$out")" \
            "$(cg "$exe" "$WORK/$prog.cg" executions "$cost")" \
            "$(fn "$WORK/$prog-full" recorded "$out")" "$(fn "$WORK/$prog-full" executions "$out")" \
            "$(fn "$WORK/$prog-full" executions "$cost")"
    done
done
