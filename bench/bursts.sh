#!/usr/bin/env bash
# Bursty tracing benchmark on real programs: the compressors built from
# source (scripts/realprogs.sh: bzip2, xz, gzip, zstd and lzip (C++), -O2
# -g, no frame pointers, linked with --emit-relocs) on deterministic
# generated text; xerces-c's DOMPrint (C++, 7,500 functions, built the
# same way by `realprogs.sh --bench`) parsing and re-serializing a
# generated XML catalogue full of entity references -- it throws and
# catches an exception for each, about 160,000 a second (-e: entity
# reference nodes are kept; expanding them makes its DOM teardown
# quadratic); and three interpreters running a CPU-bound script
# (tests/fixtures/cpu_bound.*): Lua 5.4 (computed gotos, PIE) and gawk
# 5.2 (a switch, non-PIE) built the same way, and Debian's python3.11
# (computed gotos, non-PIE, no relocations: no BOLT step). All measured in
# one run and reported as ratios:
#   - slowdown with `burstyd --pid` attached at default settings (bursts on),
#   - slowdown with the clones injected but bursts disabled (`--burst 0`),
#   - slowdown with sampling only (`--no-bursts`), for reference,
#   - slowdown under `--full-trace` (every path from the first burst on),
#   - the cost of one burst and of one `--burst 0` signal, measured with
#     the event rate amplified (--freq HIFREQ) against sampling alone at the
#     same rate, and the slowdowns they imply at the default rate: on a
#     shared host the run-to-run noise of the direct ratios can exceed the
#     overhead itself,
#   - bursts per second at default settings,
#   - the added cost per burst of measuring each path's time (the
#     time-stamp counter read at every path's start and end): the same
#     amplified runs with `--path-time`, alternated, as the ratio of the
#     two per-burst costs,
#   - the calling contexts of the paths (first default run): the share of
#     paths whose context reaches the thread's root (the burst joined with
#     its stack sample), the context tree's nodes and memory,
#   - path-profile accuracy of the default runs against the full trace:
#     PEP's Wall weight matching (hot threshold 0.125% of flow) and edge
#     relative overlap (bench_tool path-accuracy),
#   - edge relative overlap of the default runs and of the full trace
#     against callgrind's exact branch counts on the same input
#     (`--collect-jumps=yes`; bench_tool callgrind-accuracy), a ground
#     truth that shares none of burstyd's code (the executable's edges):
#     for the `--pid` runs above (bursts from the end of the attach on:
#     seconds into the run for python3.11), and for RUNS default runs and
#     a full trace under `burstyd run`, which holds the program at its
#     entry point until it is cloned (bursts from its start); and the hot
#     coverage of the first `run` default run (share of the executable's
#     samples in clones, and of all modules' samples),
#   - whether every traced run's output equals the untraced output (the
#     --pid runs, the `run` runs and the full traces; byte for byte),
#   - the attach under `run` (analysis, generation, how long the command
#     was held), first with an empty plan cache and then cached (the
#     second run moves the first's clones; the first's modules are
#     analysed by worker processes, whose peak RSS the attach line
#     gives), and the daemon's peak RSS (first, cached and full trace);
#     the --pid runs share a plan cache
#     of their own, so all but the first attach there are cached,
#   - the speed of the binary optimized by llvm-bolt with the edge profile
#     of the default runs (edges.fdata, merged with merge-fdata) relative to
#     the original binary.
# Each program's input is sized so that an untraced run takes about
# --seconds (calibrated on a 2 MiB sample or 20 rounds; interpreters 1.5x,
# python3.11 and xerces 3x: their attach analyses more before the first
# burst). Untraced and traced runs
# alternate; each time is the program's own wall time (wait4 in bench_tool).
# burstyd attaches with --pid right after the program starts, as on a
# production host: its analysis and injection count against the program,
# its final profile writing does not.
#
# Usage (workspace root, as root, after `cargo build --release -p burstyd`):
#   bash bench/bursts.sh [--runs N] [--seconds S] [--programs "bzip2 xz ..."] [--quick]
# --quick: the --pid runs and the per-event costs only (no full trace,
#   callgrind, `run` runs or BOLT).
# Environment: RUNS (5), SECONDS_PER_RUN (3), PROGRAMS (all nine), HIFREQ (4999),
#   BURSTYD_BIN, PYTHON (/usr/bin/python3.11), KEEP=1 keeps the work directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-5}"
SECS="${SECONDS_PER_RUN:-3}"
PROGRAMS="${PROGRAMS:-bzip2 xz gzip zstd lzip xerces lua gawk python3.11}"
PYTHON="${PYTHON:-/usr/bin/python3.11}"
HIFREQ="${HIFREQ:-4999}"
QUICK="${QUICK:-0}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --seconds) SECS="$2"; shift 2 ;;
        --programs) PROGRAMS="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        -h|--help) sed -n "2,50p" "$0"; exit 0 ;;
        *) echo "bursts.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "bursts.sh: error: $*" >&2; exit 1; }
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "--runs must be a positive integer"
[[ "$SECS" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--seconds must be a number"
[[ $(id -u) -eq 0 ]] || die "run as root (burstyd loads eBPF programs and uses ptrace)"
BURSTYD="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
[[ -x "$BURSTYD" ]] || die "$BURSTYD not found: build it with \`cargo build --release -p burstyd\`"
BOLT="$(command -v llvm-bolt-19 || command -v llvm-bolt || true)"
MERGE="$(command -v merge-fdata-19 || command -v merge-fdata || true)"
[[ -n "$BOLT" && -n "$MERGE" ]] || die "llvm-bolt / merge-fdata not found: scripts/setup.sh installs bolt-19"
command -v valgrind >/dev/null || die "valgrind not found (the callgrind ground truth): apt-get install -y valgrind"

echo "== preparing" >&2
bench_progs=""; [[ " $PROGRAMS " == *" xerces "* ]] && bench_progs=--bench
bash "$ROOT/scripts/realprogs.sh" $bench_progs >&2 || die "scripts/realprogs.sh $bench_progs failed"
(cd "$ROOT" && cargo build --release -q -p burstyd-tests --bin bench_tool) >&2 || die "building bench_tool failed"
TOOL="$ROOT/target/release/bench_tool"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/burstyd-bursts.XXXXXX")"
# The plan cache of the --pid runs (not the host's).
export BURSTYD_CACHE_DIR="$WORK/cache"
# (A run whose output differs leaves $WORK/keep: the directory is kept.)
trap '[[ "${KEEP:-0}" == 1 || -e "$WORK/keep" ]] && echo "bursts.sh: kept $WORK" >&2 || rm -rf "$WORK"' EXIT

kv() { tr ' ' '\n' <"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }
kv_of() { echo "$2" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'; }
stats() { sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.4f %.4f %.4f\n", m, v[1], v[NR] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f\n", a / b }'; }
minof() { sort -g "$1" | head -1; }
# untraced PROG-ARGS...: prints the program's wall seconds
untraced() { "$TOOL" rusage "$WORK/ru" -- "$@" >/dev/null; kv "$WORK/ru" wall_s; }
# traced OUT BURSTYD-ARGS -- PROG-ARGS...: prints the program's wall seconds.
# The program is started (and timed by wait4 in bench_tool) first, then
# `burstyd --pid` attaches to it, as on a production host.
traced() {
    local out="$1"; shift
    local args=()
    while [[ "$1" != "--" ]]; do args+=("$1"); shift; done
    shift
    rm -rf "$out"
    "$TOOL" rusage "$WORK/ru" -- "$@" >"$out.stdout" &
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
    same_output "$out.stdout" "--pid ${args[*]}"
    kv "$WORK/ru" wall_s
}
# same_output FILE WHAT: counts the traced run's output as identical to the
# untraced one ($WORK/expected.out) or not (in $WORK/outputs).
same_output() {
    if cmp -s "$1" "$WORK/expected.out"; then
        echo same >>"$WORK/outputs"
    else
        echo differs >>"$WORK/outputs"
        echo "bursts.sh: OUTPUT DIFFERS under burstyd $2 (kept: $1)" >&2
        touch "$WORK/keep"
    fi
}
# run_traced OUT BURSTYD-ARGS -- PROG-ARGS...: the program under `burstyd
# run` (held at its entry point until its clones are in place).
run_traced() {
    local out="$1"; shift
    local args=()
    while [[ "$1" != "--" ]]; do args+=("$1"); shift; done
    shift
    rm -rf "$out"
    "$BURSTYD" run -o "$out" "${args[@]}" -- "$@" >"$out.stdout" 2>"$out.log" \
        || { tail -20 "$out.log" >&2; die "burstyd run ${args[*]} -- $* failed"; }
    same_output "$out.stdout" "run ${args[*]}"
}
bursts_taken() { grep -o 'bursts: [0-9]* taken' "$1" | awk '{ s += $2 } END { print s + 0 }'; }
budget0_signals() { grep -o 'budget 0 [0-9]*' "$1" | awk '{ s += $3 } END { print s + 0 }'; }
median() { stats | awk '{ print $1 }'; }
# One thread each: the comparison is per thread of work.
# command_for PROG SIZE: the command line, for SIZE MiB of generated text
# (the compressors, the input file $WORK/input-SIZE.txt) or XML (xerces,
# $WORK/input-SIZE.xml) or SIZE rounds of the interpreter's CPU-bound
# script (tests/fixtures/cpu_bound.*).
command_for() {
    local bin="$ROOT/target/realprogs/bin/$1" fx="$ROOT/tests/fixtures" in="$WORK/input-$2.txt"
    case "$1" in
        xerces) echo "$ROOT/target/realprogs/bin/DOMPrint -e -v=never -wfile=/dev/stdout $WORK/input-$2.xml" ;;
        bzip2) echo "$bin -9 -c $in" ;;
        xz) echo "$bin -6 -T1 -c $in" ;;
        gzip) echo "$bin -9 -c $in" ;;
        zstd) echo "$bin -q --single-thread --no-asyncio -12 -c $in" ;;
        lzip) echo "$bin -2 -c $in" ;;
        lua) echo "$bin $fx/cpu_bound.lua $2" ;;
        gawk) echo "$bin -v rounds=$2 -f $fx/cpu_bound.awk" ;;
        python3.11) echo "$PYTHON $fx/cpu_bound.py nowait $2" ;;
        *) die "unknown program $1 (known: bzip2 xz gzip zstd lzip xerces lua gawk python3.11)" ;;
    esac
}
is_interpreter() { [[ "$1" == lua || "$1" == gawk || "$1" == python3.11 ]]; }
# Interpreters and xerces run longer: their attach analyses more
# (python3.11: about 2.5 s before the first burst; xerces: 1.4 s, for
# libstdc++ and the unwinder besides the executable), and bursts must
# cover most of the run.
seconds_for() {
    case "$1" in
        python3.11|xerces) awk -v s="$SECS" 'BEGIN { print 3 * s }' ;;
        lua|gawk) awk -v s="$SECS" 'BEGIN { print 1.5 * s }' ;;
        *) echo "$SECS" ;;
    esac
}

# gen_input PROG SIZE: SIZE MiB of the program's generated input.
gen_input() {
    if [[ "$1" == xerces ]]; then
        "$TOOL" gen-xml $(($2 * 1024 * 1024)) 7 "$WORK/input-$2.xml"
    else
        "$TOOL" gen-text $(($2 * 1024 * 1024)) 7 "$WORK/input-$2.txt"
    fi
}

declare -a REPORT
"$TOOL" gen-text $((2 * 1024 * 1024)) 5 "$WORK/input-2.txt"
"$TOOL" gen-xml $((2 * 1024 * 1024)) 5 "$WORK/input-2.xml"
for prog in $PROGRAMS; do
    # Calibrate the size to about seconds_for seconds untraced: from 2 MiB
    # of text, or from 20 rounds of the script.
    base=2; is_interpreter "$prog" && base=20
    read -r -a RUN <<<"$(command_for "$prog" "$base")"
    BIN="${RUN[0]}"
    [[ -x "$BIN" ]] || die "$BIN not found"
    "${RUN[@]}" >/dev/null
    s=$(untraced "${RUN[@]}")
    mb=$(awk -v s="$s" -v t="$(seconds_for "$prog")" -v b="$base" 'BEGIN { m = int(b * t / s + 0.5); if (m < 1) m = 1; if (m > 512 * b) m = 512 * b; print m }')
    is_interpreter "$prog" || gen_input "$prog" "$mb"
    read -r -a RUN <<<"$(command_for "$prog" "$mb")"
    unit="MiB"; is_interpreter "$prog" && unit="rounds"
    "${RUN[@]}" >"$WORK/expected.out"
    : >"$WORK/outputs"

    echo "== $prog: $RUNS alternating runs on $mb $unit: untraced, default, --burst 0, --no-bursts" >&2
    : >"$WORK/r_def"; : >"$WORK/r_off"; : >"$WORK/r_smp"; : >"$WORK/bps"; : >"$WORK/u_all"
    : >"$WORK/t_def"; : >"$WORK/t_off"; : >"$WORK/t_smp"
    ests=(); fdatas=()
    for i in $(seq 1 "$RUNS"); do
        u=$(untraced "${RUN[@]}")
        d=$(traced "$WORK/def$i" -- "${RUN[@]}")
        o=$(traced "$WORK/off" --burst 0 -- "${RUN[@]}")
        n=$(traced "$WORK/smp" --no-bursts -- "${RUN[@]}")
        echo "$u" >>"$WORK/u_all"; echo "$d" >>"$WORK/t_def"; echo "$o" >>"$WORK/t_off"; echo "$n" >>"$WORK/t_smp"
        ratio "$d" "$u" >>"$WORK/r_def"; ratio "$o" "$u" >>"$WORK/r_off"; ratio "$n" "$u" >>"$WORK/r_smp"
        b=$(bursts_taken "$WORK/def$i.log")
        awk -v b="$b" -v t="$d" 'BEGIN { printf "%.1f\n", b / t }' >>"$WORK/bps"
        ests+=("$WORK/def$i/paths.pb.gz"); fdatas+=("$WORK/def$i/edges.fdata")
        printf '  run %d: untraced %.3fs default %.3fs (%s bursts) --burst 0 %.3fs --no-bursts %.3fs\n' "$i" "$u" "$d" "$b" "$o" "$n" >&2
    done
    # The last default-rate --burst 0 run: its log ($WORK/off.log) and its
    # time go together (the loop below reuses $o).
    OFF_LAST=$o
    read -r DEF_MED DEF_MIN DEF_MAX < <(stats <"$WORK/r_def")
    read -r OFF_MED OFF_MIN OFF_MAX < <(stats <"$WORK/r_off")
    read -r SMP_MED _ _ < <(stats <"$WORK/r_smp")
    read -r BPS_MED _ _ < <(stats <"$WORK/bps")
    read -r U_MED _ _ < <(stats <"$WORK/u_all")
    # Ratios of the best runs: the least disturbed run of each kind (noise
    # on a shared host only ever adds time).
    U_MIN=$(minof "$WORK/u_all")
    DEF_BEST=$(ratio "$(minof "$WORK/t_def")" "$U_MIN")
    OFF_BEST=$(ratio "$(minof "$WORK/t_off")" "$U_MIN")
    SMP_BEST=$(ratio "$(minof "$WORK/t_smp")" "$U_MIN")

    echo "== $prog: per-event costs at --freq $HIFREQ: $RUNS alternating runs: --no-bursts, --burst 0, default, --path-time" >&2
    : >"$WORK/c_burst"; : >"$WORK/c_signal"; : >"$WORK/c_ptime"
    for i in $(seq 1 "$RUNS"); do
        n=$(traced "$WORK/hsmp" --no-bursts --freq "$HIFREQ" -- "${RUN[@]}")
        o=$(traced "$WORK/hoff" --burst 0 --freq "$HIFREQ" -- "${RUN[@]}")
        d=$(traced "$WORK/hdef" --freq "$HIFREQ" -- "${RUN[@]}")
        t=$(traced "$WORK/hnot" --path-time --freq "$HIFREQ" -- "${RUN[@]}")
        sg=$(budget0_signals "$WORK/hoff.log"); b=$(bursts_taken "$WORK/hdef.log"); bt=$(bursts_taken "$WORK/hnot.log")
        awk -v d="$d" -v n="$n" -v b="$b" 'BEGIN { printf "%.2f\n", (d - n) / b * 1e6 }' >>"$WORK/c_burst"
        awk -v o="$o" -v n="$n" -v s="$sg" 'BEGIN { printf "%.2f\n", (o - n) / s * 1e6 }' >>"$WORK/c_signal"
        awk -v d="$t" -v n="$n" -v b="$bt" 'BEGIN { printf "%.2f\n", (d - n) / b * 1e6 }' >>"$WORK/c_ptime"
        printf '  run %d: --no-bursts %.3fs  --burst 0 %.3fs (%s signals)  default %.3fs (%s bursts)  --path-time %.3fs (%s bursts)\n' "$i" "$n" "$o" "$sg" "$d" "$b" "$t" "$bt" >&2
    done
    C_BURST=$(median <"$WORK/c_burst"); C_SIGNAL=$(median <"$WORK/c_signal"); C_PTIME=$(median <"$WORK/c_ptime")
    # What measuring the paths' time adds to a burst, and the ratio.
    PATH_TIME=$(awk -v a="$C_PTIME" -v b="$C_BURST" 'BEGIN { printf "burst %.1fus with path time, %.1fus without: %+.1fus, ratio %.3f", a, b, a - b, (b > 0 ? a / b : 0) }')
    # The paths' contexts in the first default run ("path contexts: J of B
    # bursts began with their stack sample; R of P paths in a context up
    # to the thread's root; N context nodes (K KiB)").
    CONTEXTS=$(grep -o 'path contexts: .*KiB)' "$WORK/def1.log" | head -1 | awk '{
        printf "bursts with their stack %d/%d, paths to the root %.1f%% (%d/%d), %d nodes, %d KiB", $3, $5, ($14 > 0 ? 100 * $12 / $14 : 0), $12, $14, $24, substr($27, 2) }' || true)
    # Signals per second at the default rate: bursts plus declined ones.
    SPS=$(awk -v s="$(budget0_signals "$WORK/off.log")" -v t="$OFF_LAST" 'BEGIN { printf "%.1f", s / t }')
    IMPL_DEF=$(awk -v c="$C_BURST" -v r="$BPS_MED" 'BEGIN { printf "%.4f", 1 + c * r / 1e6 }')
    IMPL_OFF=$(awk -v c="$C_SIGNAL" -v r="$SPS" 'BEGIN { printf "%.4f", 1 + c * r / 1e6 }')

    if [[ "$QUICK" == 1 ]]; then
        outputs="$(grep -c '^same$' "$WORK/outputs" || true)/$(wc -l <"$WORK/outputs")"
        REPORT+=("$(printf '%-10s %4d %s %5.2fs | default %.4f %.4f (%.4f-%.4f) | --burst 0 %.4f %.4f (%.4f-%.4f) | --no-bursts %.4f %.4f | bursts/s %.0f | burst %.1fus signal %.1fus: bursts add %.4f, --burst 0 adds %.4f | path time: %s | contexts: %s | output identical %s' \
            "$prog" "$mb" "$unit" "$U_MED" "$DEF_BEST" "$DEF_MED" "$DEF_MIN" "$DEF_MAX" "$OFF_BEST" "$OFF_MED" "$OFF_MIN" "$OFF_MAX" "$SMP_BEST" "$SMP_MED" "$BPS_MED" "$C_BURST" "$C_SIGNAL" "$IMPL_DEF" "$IMPL_OFF" "$PATH_TIME" "${CONTEXTS:-n/a}" "$outputs")")
        continue
    fi

    echo "== $prog: full trace (ground truth) and accuracy of the $RUNS default runs" >&2
    fa=$(traced "$WORK/full" --full-trace -- "${RUN[@]}")
    acc=$("$TOOL" path-accuracy "$BIN" "$WORK/full/paths.pb.gz" "${ests[@]}")

    echo "== $prog: callgrind --collect-jumps=yes on the same input: the independent ground truth (slow: valgrind runs it ~50x slower)" >&2
    valgrind --tool=callgrind --collect-jumps=yes --dump-instr=yes --compress-pos=no --compress-strings=no \
        --callgrind-out-file="$WORK/callgrind.out" "${RUN[@]}" >/dev/null 2>"$WORK/callgrind.log" \
        || { tail -5 "$WORK/callgrind.log" >&2; die "callgrind failed for $prog"; }
    cg_def=$("$TOOL" callgrind-accuracy "$BIN" "$WORK/callgrind.out" "${ests[@]}")
    cg_full=$("$TOOL" callgrind-accuracy "$BIN" "$WORK/callgrind.out" "$WORK/full/paths.pb.gz")

    echo "== $prog: $RUNS default runs and a full trace under \`burstyd run\` (held at its entry point until cloned: traced from its start)" >&2
    rests=()
    for i in $(seq 1 "$RUNS"); do
        # The first two with a plan cache of their own: the first attach
        # analyses and generates, the second moves the cached clones.
        cache=(); [[ $i -le 2 ]] && cache=(--cache-dir "$WORK/cache-run-$prog")
        run_traced "$WORK/rdef$i" "${cache[@]}" -- "${RUN[@]}"
        rests+=("$WORK/rdef$i/paths.pb.gz")
    done
    run_traced "$WORK/rfull" --full-trace -- "${RUN[@]}"
    cg_rdef=$("$TOOL" callgrind-accuracy "$BIN" "$WORK/callgrind.out" "${rests[@]}")
    cg_rfull=$("$TOOL" callgrind-accuracy "$BIN" "$WORK/callgrind.out" "$WORK/rfull/paths.pb.gz")
    cg="callgrind ($(kv_of branches "$cg_def") branches): --pid default $(kv_of overlap "$cg_def") full-trace $(kv_of overlap "$cg_full"), run default $(kv_of overlap "$cg_rdef") full-trace $(kv_of overlap "$cg_rfull")"
    # (Absent when the run ended before the libraries were cloned.)
    hot=$(grep -o 'hot coverage: [0-9.]*%' "$WORK/rdef1.log" | head -1 | sed 's/hot coverage: //' || true)
    hot_all=$(grep -o 'Over all modules: [0-9.]*%' "$WORK/rdef1.log" | head -1 | sed 's/Over all modules: //' || true)
    # The attach under `run` (every module analysed and generated while
    # the command is held) and the daemon's peak RSS, default and full trace.
    attach_of() {
        grep -o 'analysis [0-9]* ms, generation [0-9]* ms[^,]*, the command held at its entry point for [0-9]* ms' "$1" \
            | head -1 | sed 's/the command held at its entry point for/held/; s/ modules from the plan cache//' || true
    }
    attach="first $(attach_of "$WORK/rdef1.log"); cached $(attach_of "$WORK/rdef2.log")"
    rss=$(grep -o 'peak RSS [0-9.]* MB' "$WORK/rdef1.log" | head -1 | sed 's/peak RSS //' || true)
    rss_cached=$(grep -o 'peak RSS [0-9.]* MB' "$WORK/rdef2.log" | head -1 | sed 's/peak RSS //' || true)
    rss_full=$(grep -o 'peak RSS [0-9.]* MB' "$WORK/rfull.log" | head -1 | sed 's/peak RSS //' || true)

    bolted="n/a (no relocations in the binary)"
    stale=""
    # (grep >/dev/null, not grep -q: an early exit could SIGPIPE readelf,
    # which pipefail would count as a failure -- lzip's BOLT step was skipped.)
    if readelf -S "$BIN" | grep '\.rela\.text' >/dev/null; then
        echo "== $prog: llvm-bolt with the default runs' edge profile; $RUNS alternating runs original vs BOLTed" >&2
        "$MERGE" "${fdatas[@]}" >"$WORK/merged.fdata" 2>"$WORK/merge.log" \
            || { cat "$WORK/merge.log" >&2; die "merge-fdata failed for $prog"; }
        # llvm-bolt gives up on some functions with computed gotos (Lua's
        # luaV_execute: "Consider adding this function to --skip-funcs");
        # those are left as they are, and named in the report.
        skips=""
        for _ in 1 2 3 4 5 6 7 8; do
            if "$BOLT" "$BIN" -o "$WORK/$prog.bolt" -data="$WORK/merged.fdata" \
                -reorder-blocks=ext-tsp -reorder-functions=hfsort -split-functions -split-all-cold \
                ${skips:+-skip-funcs="$skips"} >"$WORK/bolt.log" 2>&1; then
                break
            fi
            f=$(grep -o 'in function [^ ]*\. Consider adding this function to --skip-funcs' "$WORK/bolt.log" \
                | head -1 | sed 's/in function \(.*\)\. Consider.*/\1/')
            [[ -n "$f" ]] || { tail -20 "$WORK/bolt.log" >&2; die "llvm-bolt failed for $prog"; }
            skips="${skips:+$skips,}$f"
        done
        [[ -s "$WORK/$prog.bolt" ]] || die "llvm-bolt failed for $prog (skipping $skips)"
        BOLTED=("$WORK/$prog.bolt" "${RUN[@]:1}")
        cmp <("${RUN[@]}") <("${BOLTED[@]}") || die "$prog: the BOLTed binary's output differs"
        : >"$WORK/r_bolt"; : >"$WORK/t_orig"; : >"$WORK/t_bolt"
        for i in $(seq 1 "$RUNS"); do
            u=$(untraced "${RUN[@]}")
            b=$(untraced "${BOLTED[@]}")
            ratio "$b" "$u" >>"$WORK/r_bolt"; echo "$u" >>"$WORK/t_orig"; echo "$b" >>"$WORK/t_bolt"
            printf '  run %d: original %.3fs BOLTed %.3fs\n' "$i" "$u" "$b" >&2
        done
        read -r BOLT_MED _ _ < <(stats <"$WORK/r_bolt")
        BOLT_BEST=$(ratio "$(minof "$WORK/t_bolt")" "$(minof "$WORK/t_orig")")
        stale=$(grep -o '[0-9]* out of [0-9]* functions in the binary ([0-9.]*%) have non-empty execution profile' "$WORK/bolt.log" | head -1 || true)
        bolted=$(printf '%.4f %.4f' "$BOLT_BEST" "$BOLT_MED")
        [[ -n "$skips" ]] && bolted="$bolted (BOLT skipped $skips)"
    fi

    outputs="$(grep -c '^same$' "$WORK/outputs" || true)/$(wc -l <"$WORK/outputs")"
    REPORT+=("$(printf '%-10s %4d %s %5.2fs | default %.4f %.4f (%.4f-%.4f) | --burst 0 %.4f %.4f (%.4f-%.4f) | --no-bursts %.4f %.4f | full-trace %.2fx | bursts/s %.0f | burst %.1fus signal %.1fus: bursts add %.4f, --burst 0 adds %.4f | path time: %s | contexts: %s | %s | %s | hot coverage %s (all modules %s) | output identical %s | attach (run): %s, daemon peak RSS %s (cached %s, full trace %s) | BOLTed %s' \
        "$prog" "$mb" "$unit" "$U_MED" "$DEF_BEST" "$DEF_MED" "$DEF_MIN" "$DEF_MAX" "$OFF_BEST" "$OFF_MED" "$OFF_MIN" "$OFF_MAX" "$SMP_BEST" "$SMP_MED" "$(ratio "$fa" "$U_MED")" "$BPS_MED" "$C_BURST" "$C_SIGNAL" "$IMPL_DEF" "$IMPL_OFF" "$PATH_TIME" "${CONTEXTS:-n/a}" "$acc" "$cg" "$hot" "${hot_all:-n/a}" "$outputs" "${attach:-n/a}" "${rss:-n/a}" "${rss_cached:-n/a}" "${rss_full:-n/a}" "$bolted")")
    [[ -n "$stale" ]] && echo "  bolt: $stale" >&2
done
echo
echo "bursty tracing on $(nproc) CPUs, wall time traced/untraced over $RUNS alternating runs: best run/best run, then the median (min-max) of the per-run ratios;"
echo "per-event costs (median over $RUNS runs at --freq $HIFREQ vs --no-bursts) and the slowdown they imply at the default rate;"
echo "accuracy of the $RUNS default runs together vs a full trace; BOLTed/original wall time (best/best, median):"
for l in "${REPORT[@]}"; do echo "  $l"; done
echo "targets: default <= 1.02, --burst 0 <= 1.005, wall >= 0.95, overlap >= 0.97 (vs full trace), callgrind overlap >= 0.95, hot coverage >= 97%, output identical in every run"
