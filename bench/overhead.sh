#!/usr/bin/env bash
# burstyd overhead benchmark: bzip2 -9 (built from source by
# scripts/realprogs.sh, -O2 -g, no frame pointers) on a fixed generated input,
# untraced vs traced with `burstyd --pid` on the program at default settings, alternately.
#
# Usage (from the workspace root, as root, after `cargo build --release -p burstyd`):
#   bash bench/overhead.sh [--runs N] [--size-mb MB]
# Environment: RUNS (default 5), SIZE_MB (default 48, ~5 s of bzip2 -9 here),
#   BURSTYD_BIN (default target/release/burstyd), KEEP=1 keeps the work dir.
#
# Prints: median wall of bzip2 itself untraced/traced, ratio traced/untraced
# (median, min, max over the pairs), the daemon's CPU while sampling (its
# own per-phase account), start-up and final-profile CPU, and its total CPU
# (user+sys) as % of one core and
# its peak RSS -- measured in a separate attach run (`burstyd --pid P` on a
# bzip2 started by this script, with wait4() rusage of burstyd alone, so the
# profiled program's CPU is not counted) -- and samples per second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-5}"
SIZE_MB="${SIZE_MB:-48}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --size-mb) SIZE_MB="$2"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "overhead.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "overhead.sh: --runs must be a positive integer" >&2; exit 2; }

die() { echo "overhead.sh: error: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "run as root (burstyd loads eBPF programs)"

BURSTYD="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
[[ -x "$BURSTYD" ]] || die "$BURSTYD not found: build it with \`cargo build --release -p burstyd\`"

echo "== preparing" >&2
bash "$ROOT/scripts/realprogs.sh" >&2 || die "scripts/realprogs.sh failed"
BZIP2="$ROOT/target/realprogs/bin/bzip2"
TOOL="$ROOT/target/release/bench_tool"
(cd "$ROOT" && cargo build --release -q -p burstyd-tests --bin bench_tool) >&2 || die "building bench_tool failed"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/burstyd-bench.XXXXXX")"
if [[ "${KEEP:-0}" != 1 ]]; then trap 'rm -rf "$WORK"' EXIT; fi
INPUT="$WORK/input.txt"
"$TOOL" gen-text $((SIZE_MB * 1024 * 1024)) 7 "$INPUT"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
# median / min / max of numbers on stdin
stats() { sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f %.3f %.3f\n", m, v[1], v[NR] }'; }
kv() { tr ' ' '\n' <"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }

# Warm-up (page cache, CPU frequency): one untraced run, not counted.
"$BZIP2" -9 -c "$INPUT" >/dev/null

echo "== $RUNS alternating runs: bzip2 -9 on ${SIZE_MB} MiB, untraced vs \`burstyd --pid\` on it (default settings)" >&2
: >"$WORK/untraced" ; : >"$WORK/traced" ; : >"$WORK/ratios" ; : >"$WORK/sps" ; : >"$WORK/pdur"
for i in $(seq 1 "$RUNS"); do
    # Both sides time bzip2 itself (wait4 in bench_tool), so the ratio is the
    # program's slowdown. The traced side is `burstyd --pid` on bzip2 itself
    # (bench_tool's child), attached as soon as it exists, until it exits:
    # bursts go to bzip2, and the attach's stop counts against it.
    "$TOOL" rusage "$WORK/ru-untraced" -- "$BZIP2" -9 -c "$INPUT" >/dev/null
    u=$(kv "$WORK/ru-untraced" wall_s)
    rm -rf "$WORK/out"
    "$TOOL" rusage "$WORK/ru-traced" -- "$BZIP2" -9 -c "$INPUT" >/dev/null &
    RU_PID=$!
    BZ_PID=
    for _ in $(seq 1 2000); do
        BZ_PID=$(pgrep -P "$RU_PID" || true)
        [ -n "$BZ_PID" ] && break
        sleep 0.001
    done
    [ -n "$BZ_PID" ] || die "bzip2 did not start under bench_tool (run $i)"
    "$BURSTYD" --pid "$BZ_PID" -o "$WORK/out" 2>"$WORK/burstyd-run.log" \
        || { kill "$RU_PID" 2>/dev/null || true; tail -20 "$WORK/burstyd-run.log" >&2; die "burstyd --pid failed (run $i)"; }
    wait "$RU_PID" || die "bzip2 failed under burstyd (run $i)"
    t=$(kv "$WORK/ru-traced" wall_s)
    echo "$u" >>"$WORK/untraced"; echo "$t" >>"$WORK/traced"
    awk -v t="$t" -v u="$u" 'BEGIN { printf "%.4f\n", t / u }' >>"$WORK/ratios"
    st=$("$TOOL" profile-stats "$WORK/out/context.pb.gz") || die "cannot read the profile of run $i"
    n=$(echo "$st" | tr ' ' '\n' | awk -F= '$1 == "samples" { print $2 }')
    awk -v n="$n" -v t="$t" 'BEGIN { printf "%.1f\n", n / t }' >>"$WORK/sps"
    echo "$st" | tr ' ' '\n' | awk -F= '$1 == "duration_s" { print $2 }' >>"$WORK/pdur"
    printf '  run %d: untraced %6.3fs  traced %6.3fs  ratio %.4f  (%s)\n' "$i" "$u" "$t" "$(tail -1 "$WORK/ratios")" "$st" >&2
done
read -r U_MED U_MIN U_MAX < <(stats <"$WORK/untraced")
read -r T_MED T_MIN T_MAX < <(stats <"$WORK/traced")
read -r R_MED R_MIN R_MAX < <(stats <"$WORK/ratios")
read -r S_MED _ _ < <(stats <"$WORK/sps")
read -r PD_MED _ _ < <(stats <"$WORK/pdur")
PD_RATIO=$(awk -v d="$PD_MED" -v u="$U_MED" 'BEGIN { printf "%.3f", d / u }')

# Daemon cost, attach mode: bzip2 runs by itself; burstyd --pid attaches for
# a duration that ends before bzip2 does; wait4() gives burstyd's own rusage.
DUR=$(awk -v u="$U_MED" 'BEGIN { d = int(u) - 1; if (d < 1) d = 1; print d }')
echo "== attach run: burstyd --pid <bzip2> --duration $DUR" >&2
"$BZIP2" -9 -c "$INPUT" >/dev/null &
BZ_PID=$!
sleep 0.1
rm -rf "$WORK/out-pid"
"$TOOL" rusage "$WORK/rusage" -- "$BURSTYD" --pid "$BZ_PID" --duration "$DUR" -o "$WORK/out-pid" \
    2>"$WORK/burstyd-pid.log" || { kill "$BZ_PID" 2>/dev/null || true; tail -20 "$WORK/burstyd-pid.log" >&2; die "burstyd --pid failed"; }
wait "$BZ_PID" || true
D_WALL=$(kv "$WORK/rusage" wall_s); D_USER=$(kv "$WORK/rusage" user_s); D_SYS=$(kv "$WORK/rusage" sys_s)
D_RSS_KB=$(kv "$WORK/rusage" maxrss_kb)
PST=$("$TOOL" profile-stats "$WORK/out-pid/context.pb.gz") || die "cannot read the --pid profile"
P_SAMPLES=$(echo "$PST" | tr ' ' '\n' | awk -F= '$1 == "samples" { print $2 }')

# burstyd's own account of its CPU by phase (summary line "daemon CPU: ...").
STEADY=$(sed -n 's/.*daemon CPU: start-up \([0-9]*\) ms, sampling \([0-9]*\) ms over \([0-9.]*\)s (\([0-9.]*\)% of one core), final profile \([0-9]*\) ms.*/\1 \2 \3 \4 \5/p' "$WORK/burstyd-pid.log")
read -r ST_START ST_SAMP ST_SECS ST_PCT ST_FINAL <<<"${STEADY:-? ? ? ? ?}"
CPU_PCT=$(awk -v u="$D_USER" -v s="$D_SYS" -v w="$D_WALL" 'BEGIN { printf "%.2f", 100 * (u + s) / w }')
CPU_PCT_DUR=$(awk -v u="$D_USER" -v s="$D_SYS" -v d="$DUR" 'BEGIN { printf "%.2f", 100 * (u + s) / d }')
RSS_MB=$(awk -v k="$D_RSS_KB" 'BEGIN { printf "%.1f", k / 1024 }')
SLOW_PCT=$(awk -v r="$R_MED" 'BEGIN { printf "%.2f", 100 * (r - 1) }')
P_SPS=$(awk -v n="$P_SAMPLES" -v d="$DUR" 'BEGIN { printf "%.1f", n / d }')
ok() { awk -v v="$1" -v t="$2" 'BEGIN { print (v <= t) ? "ok" : "OVER" }'; }

cat <<REPORT
burstyd overhead: bzip2 -9 on ${SIZE_MB} MiB generated text, ${RUNS} alternating runs ($(nproc) cores, $(uname -r))
  wall untraced (median)        ${U_MED} s   [min ${U_MIN}, max ${U_MAX}]
  wall traced   (median)        ${T_MED} s   [min ${T_MIN}, max ${T_MAX}]   (burstyd --pid, default settings)
  ratio traced/untraced         ${R_MED}   [min ${R_MIN}, max ${R_MAX}]   slowdown ${SLOW_PCT}%   target <= 1%: $(ok "$SLOW_PCT" 1)
  profiled window (median)      ${PD_MED} s   (profile duration_nanos: sampling start to target exit; /untraced = ${PD_RATIO})
  samples/s (burstyd --pid)     ${S_MED}
  daemon CPU while sampling     ${ST_SAMP} ms over ${ST_SECS} s = ${ST_PCT}% of one core   target <= 1%: $(ok "$ST_PCT" 1)
  daemon CPU one-off            start-up ${ST_START} ms (eBPF load, attach), final profile ${ST_FINAL} ms (symbolization, write)
  daemon CPU (attach, whole run) ${D_USER}+${D_SYS} s over ${D_WALL} s wall = ${CPU_PCT}% of one core (${CPU_PCT_DUR}% of the ${DUR} s window)
  daemon peak RSS (attach)      ${RSS_MB} MB   target <= 100 MB: $(ok "$RSS_MB" 100)
  samples/s (attach)            ${P_SPS}   (${P_SAMPLES} samples in ${DUR} s)
REPORT
