#!/usr/bin/env bash
# Tuple profiles by stratified sampling (issue 34; Sastry, Bodik & Smith,
# "Rapid Profiling via Stratified Sampling"): the error of each sampler's
# value and call-target profiles against the exact profile of the same
# run, as a function of the tuples delivered, and each sampler's overhead.
# Programs (one workload each, some 10 s of CPU natively; SCALE multiplies
# it): gawk 5.2 on bench/words.awk over generated text (an interpreter: its
# `switch` dispatch gives jump-table target tuples), xerces-c's DOMPrint
# on a generated XML catalogue (C++, virtual calls), xz -3 -T1 on
# generated text (the realprogs build: liblzma in the executable) and
# sqlite3 on a script of inserts, a group-by and a join (in memory).
# 1. Convergence: for each sampler (random, stratified) and --rates R, one
#    run of `burstyd --pid PID --record values,targets --sampler S
#    --sample-rate R --sampler-reference` (attached at the program's start,
#    ending at its exit); from OUT/tuple-convergence.json (checkpoints each
#    time the sampler's outputs double, and the end) the table gives the
#    last checkpoint's error, hot (the paper's ERR: sites >= 1000
#    executions, tuples >= 10% of their site, sites >= 40% covered) and
#    total (frequency-weighted, all tuples of sites >= 1000 executions),
#    for values and targets; delivered (sampler outputs), messages (ring
#    records after the 16-entry merging table), exact (exact tuples),
#    dropped and lost (burstyd_traced_tuples_dropped_total and
#    burstyd_traced_records_lost_total: tuples and records the daemon
#    left out or the ring lost); and
#    "3%" / "1%": the smallest `delivered` from which every later
#    checkpoint of the run has hot error < 0.03 (0.01), "never" if none
#    (a checkpoint with nothing selected yet counts as not under). A
#    second table gives the ratio random / stratified of those delivered
#    counts (the paper: stratified needs >= 2x fewer). Checkpoints are at
#    powers of two of `delivered`, so the ratios move in steps of 2x.
# 2. Overhead: --runs rounds of pairs, each a traced run and an untraced
#    one at the same time, one on each CPU (the host's noise moves whole
#    runs by up to 50% when other machines load it; two runs at once see
#    the same noise): `--record values,targets --sampler S` for S in
#    exact, random and stratified (burstyd's default) at the default rate
#    (16, 2048 strata), no --sampler-reference; bursts in path mode alone
#    (no --record: what tuples add to); and `--no-bursts` (sampling
#    alone). Each time is the program's own CPU time (user +
#    sys, bench_tool rusage); the ratio is the median of the pairs'
#    traced / untraced, with their range. in-b%: the program's time in
#    bursts (burstyd_traced_burst_seconds_total, median) as a share of its
#    untraced CPU time -- an upper bound of the tracing cost.
#    Amplified: as those ratios can still drown in noise, the cost of one
#    sample and of one burst of the default configuration (`--record
#    values,targets`, stratified, rate 16) are measured at --freq HIFREQ
#    (1990: ten times the default rate), where they stand well above the
#    noise, on a quarter of the workload, in --runs rounds of two pairs:
#    sampling alone (--no-bursts) beside untraced, and the default
#    configuration beside untraced: a sample costs (sampling / its
#    untraced - 1) x untraced / samples, a burst (default / its untraced
#    - sampling / its untraced) x untraced / bursts (medians; a cost the
#    noise made negative counts as 0). The overhead they imply at the default rate is
#    those costs times the samples and bursts of the default-rate
#    stratified runs above, over their untraced CPU time: the figure the
#    issue's 1.5% is checked against.
# Before them, one traced run of half the workload per program fills the
# plan cache (not measured): every measured run attaches from the cache.
# 3. Every traced run's output (standard output) is compared with the
#    untraced one's (sha256); a difference is reported (and keeps WORK).
# The tables (markdown) are printed at the end and written to
# WORK/tuples.md; progress and per-run lines go to standard error.
#
# usage: bash bench/tuples.sh [--programs "gawk xerces xz sqlite3"] [--runs 3] [--rates "4 16 64"]
# env: BURSTYD_BIN (target/release/burstyd), TOOL (target/release/bench_tool),
#   REALPROGS (target/realprogs/bin: gawk, xz, DOMPrint; scripts/realprogs.sh
#   --bench builds them), SCALE (1: workload multiplier), TIMEOUT (600 s per
#   run), HIFREQ (1990: the amplified rate), KEEP=1 keeps the work directory.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PROGRAMS="gawk xerces xz sqlite3"
RUNS=3
RATES="4 16 64"
SCALE="${SCALE:-1}"
TIMEOUT="${TIMEOUT:-600}"
# The amplified event rate (ten times the default 199 Hz).
HIFREQ="${HIFREQ:-1990}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --programs) PROGRAMS="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --rates) RATES="$2"; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "tuples.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "tuples.sh: $*" >&2; exit 1; }
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "--runs must be a positive integer"
[[ $(id -u) -eq 0 ]] || die "run as root (burstyd loads eBPF programs and uses ptrace)"
BIN="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
TOOL="${TOOL:-$ROOT/target/release/bench_tool}"
[[ -x "$BIN" && -x "$TOOL" ]] || (cd "$ROOT" && cargo build --release -p burstyd -p burstyd-tests --bin burstyd --bin bench_tool >&2)
RP="${REALPROGS:-$ROOT/target/realprogs/bin}"
WORK="$(mktemp -d /tmp/burstyd-tuples.XXXXXX)"
# The plan cache of these runs (not the host's).
export BURSTYD_CACHE_DIR="$WORK/cache"
# `killtree PID`: PID's descendants (our own runs), deepest first.
killtree() { local c; for c in $(pgrep -P "$1" || true); do killtree "$c"; kill "$c" 2>/dev/null || true; done; }
cleanup() {
    killtree $$
    if [[ "${KEEP:-}" == 1 || -e "$WORK/keep" ]]; then echo "tuples.sh: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# As the other benches: every symbol bound at start (a burst pauses at
# the first call through a lazily bound PLT slot).
export LD_BIND_NOW=1
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

# `repeat K WORD`: WORD, K times.
repeat() { local i; for ((i = 0; i < $1; i++)); do printf '%s ' "$2"; done; }
# `command_for PROG`: the workload's command line (about 10 s of CPU
# natively on this host, times SCALE), its inputs made in WORK.
command_for() {
    local k
    case "$1" in
        gawk)
            k=$(awk -v s="$SCALE" 'BEGIN { print int(800 * s + 0.5) }')
            [[ -f "$WORK/words.txt" ]] || "$TOOL" gen-text 100000 1 "$WORK/words.txt"
            echo "$RP/gawk -f $ROOT/bench/words.awk $(repeat "$k" "$WORK/words.txt")" ;;
        xz)
            k=$(awk -v s="$SCALE" 'BEGIN { print int(600 * s + 0.5) }')
            [[ -f "$WORK/xz.in" ]] || "$TOOL" gen-text 100000 2 "$WORK/xz.in"
            echo "$RP/xz -3 -c -T1 $(repeat "$k" "$WORK/xz.in")" ;;
        sqlite3)
            k=$(awk -v s="$SCALE" 'BEGIN { print int(2400 * s + 0.5) }')
            [[ -f "$WORK/q.sql" ]] || {
                echo "create table t(k integer primary key, v text, n integer);"
                echo "create index tn on t(n);"
                echo "with recursive c(i) as (select 1 union all select i + 1 from c where i < 2000)"
                echo "  insert into t select i, printf('%08x%08x', i * 2654435761 % 4294967296, i * 40503 % 65536), (i * 7919) % 1000 from c;"
                echo "select n, count(*), max(v) from t group by n order by 2 desc limit 3;"
                echo "select count(*) from t a join t b on a.n = b.n where a.k < 300;"
                echo "drop table t;"
            } > "$WORK/q.sql"
            [[ -f "$WORK/q.$k.sql" ]] || for ((i = 0; i < k; i++)); do cat "$WORK/q.sql"; done > "$WORK/q.$k.sql"
            echo "/usr/bin/sqlite3 :memory: -init $WORK/q.$k.sql .quit" ;;
        xerces)
            # -e: entity reference nodes kept (expanding them makes the
            # DOM's teardown quadratic); the serialization on stdout.
            k=$(awk -v s="$SCALE" 'BEGIN { print int(450 * s + 0.5) }')
            [[ -f "$WORK/cat.$k.xml" ]] || "$TOOL" gen-xml $((k * 64 * 1024)) 7 "$WORK/cat.$k.xml"
            echo "$RP/DOMPrint -e -v=never $WORK/cat.$k.xml" ;;
        *) die "unknown program $1 (known: gawk xerces xz sqlite3)" ;;
    esac
}
kv() { tr ' ' '\n' <"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }
# The program's CPU time (user + system) from rusage file $1.
cpu_s() { awk -v u="$(kv "$1" user_s)" -v s="$(kv "$1" sys_s)" 'BEGIN { print u + s }'; }
# `check_output FILE WHAT`: FILE's hash against the first untraced run's
# (the later untraced runs' too: a program whose output varies by itself);
# FILE removed.
check_output() {
    local h
    h=$(sha256sum "$1" | cut -d' ' -f1); rm -f "$1"
    if [[ "$h" == "$(cat "$WORK/$prog.sha")" ]]; then
        [[ "$2" == untraced ]] || echo "$prog same" >> "$WORK/outputs"
    else
        echo "$prog differs $2" >> "$WORK/outputs"
        log "$prog: OUTPUT DIFFERS from untraced under burstyd $2"
        touch "$WORK/keep"
    fi
}
# `untraced`: the program's CPU seconds (and its output's hash the first time).
untraced() {
    local ru="$WORK/ru.$BASHPID"
    timeout -s KILL "$TIMEOUT" "$TOOL" rusage "$ru" -- "${CMD[@]}" > "$WORK/$prog.out" 2>/dev/null || die "$prog failed untraced"
    [[ -f "$WORK/$prog.sha" ]] || sha256sum "$WORK/$prog.out" | cut -d' ' -f1 > "$WORK/$prog.sha"
    check_output "$WORK/$prog.out" untraced
    cpu_s "$ru"; rm -f "$ru"
}
# `attached OUT BURSTYD-ARGS...`: the program's CPU seconds with `burstyd
# --pid BURSTYD-ARGS -o OUT` attached from its start to its end (the
# daemon's log in OUT.log).
attached() {
    local out="$1" ru="$WORK/ru.$BASHPID" t b pid="" d
    shift
    rm -rf "$out"
    timeout -s KILL "$TIMEOUT" "$TOOL" rusage "$ru" -- "${CMD[@]}" > "$out.stdout" 2>/dev/null &
    t=$!
    for _ in $(seq 3000); do
        b=$(pgrep -P "$t" | head -1 || true)
        [[ -n "$b" ]] && pid=$(pgrep -P "$b" | head -1 || true)
        [[ -n "$pid" ]] && break
        sleep 0.001
    done
    [[ -n "$pid" ]] || die "$prog did not start under bench_tool"
    timeout -s KILL "$TIMEOUT" "$BIN" --pid "$pid" "$@" -o "$out" >/dev/null 2>"$out.log" &
    d=$!
    wait "$t" || log "$prog: exited with $? under burstyd $* (see $out.log)"
    wait "$d" || log "$prog: burstyd $* exited with $? ($(tail -2 "$out.log" | tr '\n' ' '))"
    if [[ -n "${WARMUP:-}" ]]; then rm -f "$out.stdout"; else check_output "$out.stdout" "$*"; fi
    cpu_s "$ru"; rm -f "$ru"
}
# `paired OUT BURSTYD-ARGS...`: `attached` and an untraced run at the
# same time, one on each CPU: the host's noise (whole runs slower by up
# to 50% here, as other machines share it) hits both alike, where it
# drowns the overhead between runs made one after the other.
# "traced untraced" CPU seconds.
paired() {
    local f="$WORK/pair.$BASHPID" u t
    ( untraced > "$f" ) &
    u=$!
    t=$(attached "$@")
    wait "$u" || die "$prog failed untraced"
    echo "$t $(cat "$f")"; rm -f "$f"
}
metric() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sum(p['metrics'].get(sys.argv[2],0) for p in d['processes']))" "$1/summary.json" "$2" 2>/dev/null || echo 0; }
# A metric of the whole run (not per process): burstyd_samples_total.
run_metric() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['metrics'].get(sys.argv[2], 0))" "$1/summary.json" "$2" 2>/dev/null || echo 0; }
# `stats`: median min max of numbers on standard input.
stats() { sort -g | awk '{ v[NR] = $1 } END { if (!NR) { print "- - -"; exit } m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[1], v[NR] }'; }
# `convergence OUT`: one line of the run's figures from tuple-convergence.json:
# delivered messages exact v-hot v-total t-hot t-total v3% v1% t3% t1% points
convergence() {
    python3 - "$1/tuple-convergence.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception:
    print("- - - - - - - never never never never 0"); sys.exit()
procs = [p for p in d.get("processes", []) if p.get("points")]
if not procs:
    print("- - - - - - - never never never never 0"); sys.exit()
pts = max(procs, key=lambda p: p["points"][-1]["delivered"])["points"]
last = pts[-1]
def f(x):
    return "-" if x is None else f"{x:.4f}"
def stays(kind, limit):
    # The smallest `delivered` from which every later checkpoint is under
    # (with the exact tuples seen by then: delivered:exact).
    at = None
    for p in reversed(pts):
        e = p[kind]["error"]
        if e is None or e >= limit:
            break
        at = p
    return "never" if at is None else f'{at["delivered"]}:{at["exact"]}'
print(last["delivered"], last["messages"], last["exact"],
      f(last["values"]["error"]), f(last["values"]["total_error"]),
      f(last["targets"]["error"]), f(last["targets"]["total_error"]),
      stays("values", 0.03), stays("values", 0.01), stays("targets", 0.03), stays("targets", 0.01), len(pts))
PY
}
# The error curve of a run, for the record (delivered:hot-values/hot-targets).
curve() {
    python3 - "$1/tuple-convergence.json" <<'PY' 2>/dev/null || true
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["processes"]:
    f = lambda x: "-" if x is None else f"{x:.3f}"
    print(" ".join(f'{q["delivered"]}:{f(q["values"]["error"])}/{f(q["targets"]["error"])}' for q in p["points"]))
PY
}
ratio_of() {
    if [[ "$1" =~ ^[0-9]+$ && "$2" =~ ^[0-9]+$ ]]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
    elif [[ "$1" == never && "$2" =~ ^[0-9]+$ ]]; then echo ">$(awk -v a="$3" -v b="$2" 'BEGIN { printf "%.2f", a / b }')"
    else echo "-"; fi
}

CONV="$WORK/convergence.md" RATIO="$WORK/ratios.md" OVER="$WORK/overhead.md"
{
    echo "| program | sampler | rate | delivered | messages | exact | dropped | lost | values hot | values total | targets hot | targets total | values 3% at | values 1% at | targets 3% at | targets 1% at |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} > "$CONV"
{
    echo "| program | rate | values 3%: random / stratified | ratio | by exact | values 1% | ratio | by exact | targets 3% | ratio | by exact | targets 1% | ratio | by exact |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} > "$RATIO"
{
    echo "| program | untraced CPU s (med, range) | exact | random | stratified | paths | no-bursts | in-b% exact / random / stratified / paths | µs/sample | µs/burst | samples, bursts | amplified | outputs |"
    echo "|---|---|---|---|---|---|---|---|---:|---:|---|---:|---|"
} > "$OVER"
START=$(date -u '+%Y-%m-%d %H:%M UTC')
for prog in $PROGRAMS; do
    case "$prog" in
        gawk) exe="$RP/gawk" ;; xz) exe="$RP/xz" ;; xerces) exe="$RP/DOMPrint" ;; sqlite3) exe=/usr/bin/sqlite3 ;;
        *) die "unknown program $prog (known: gawk xerces xz sqlite3)" ;;
    esac
    [[ -x "$exe" ]] || { log "$prog: $exe not built (bash scripts/realprogs.sh --bench)"; continue; }
    t_prog=$(date +%s)
    read -r -a CMD <<< "$(command_for "$prog")"
    base=$(untraced)
    log "$prog: untraced ${base} s CPU"
    # Warm the plan cache: the first attach to a binary analyses it and
    # its libraries while the program runs (the libraries' clones came
    # only after most of xz's first traced run: 10x fewer paths and exact
    # tuples than the runs after it: with an empty cache libc's analysis
    # outlasted a 9 s run). Half the workload (at least SCALE 0.5: a
    # shorter run may end before the cache is filled), not measured.
    read -r -a WCMD <<< "$(SCALE=$(awk -v s="$SCALE" 'BEGIN { print (s / 2 < 0.5 ? 0.5 : s / 2) }') command_for "$prog")"
    c=$(CMD=("${WCMD[@]}"); WARMUP=1 attached "$WORK/$prog-warmup" --record values,targets)
    log "$prog: warm-up run ($c s CPU): $(metric "$WORK/$prog-warmup" burstyd_traced_functions_rewritten) functions rewritten"
    # 1. Convergence, one run per sampler and rate.
    for rate in $RATES; do
        for s in random stratified; do
            out="$WORK/$prog-$s-$rate"
            c=$(attached "$out" --record values,targets --sampler "$s" --sample-rate "$rate" --sampler-reference)
            read -r del msg ex vh vt th tt v3 v1 t3 t1 np <<< "$(convergence "$out")"
            log "$prog $s r=$rate: CPU $c s, delivered $del, points $np; hot error values/targets by delivered: $(curve "$out")"
            echo "$prog $rate $s $v3 $v1 $t3 $t1 $del $ex" >> "$WORK/stays"
            echo "| $prog | $s | $rate | $del | $msg | $ex | $(metric "$out" burstyd_traced_tuples_dropped_total) | $(metric "$out" burstyd_traced_records_lost_total) | $vh | $vt | $th | $tt | ${v3%:*} | ${v1%:*} | ${t3%:*} | ${t1%:*} |" >> "$CONV"
            # Keep the profiles' report, drop the rest (disk).
            "$BIN" values "$out" --json > "$out.values.json" 2>/dev/null || true
            "$BIN" values "$out" --targets --json > "$out.targets.json" 2>/dev/null || true
            find "$out" -name '*.pb.gz' -delete 2>/dev/null || true
        done
        read -r _ _ _ rv3 rv1 rt3 rt1 rdel rex <<< "$(grep "^$prog $rate random " "$WORK/stays")"
        read -r _ _ _ sv3 sv1 st3 st1 sdel sex <<< "$(grep "^$prog $rate stratified " "$WORK/stays")"
        row="| $prog | $rate"
        for pair in "$rv3 $sv3" "$rv1 $sv1" "$rt3 $st3" "$rt1 $st1"; do
            read -r a b <<< "$pair"
            row+=" | ${a%:*} / ${b%:*} | $(ratio_of "${a%:*}" "${b%:*}" "$rdel") | $(ratio_of "${a#*:}" "${b#*:}" "$rex")"
        done
        echo "$row |" >> "$RATIO"
    done
    # 2. Overhead: rounds of pairs, each traced run beside an untraced one
    # (see `paired`).
    declare -A T=() R=() IB=()
    for r in $(seq "$RUNS"); do
        for s in exact random stratified paths nobursts; do
            out="$WORK/$prog-ov-$s"
            case $s in
                nobursts) set -- --no-bursts ;;
                paths) set -- ;;
                *) set -- --record values,targets --sampler "$s" ;;
            esac
            read -r t u <<< "$(paired "$out" "$@")"
            T[untraced]+="$u "
            R[$s]+="$(awk -v t="$t" -v u="$u" 'BEGIN { print t / u }') "
            IB[$s]+="$(metric "$out" burstyd_traced_burst_seconds_total) "
        done
        log "$prog overhead round $r: traced / untraced beside it, exact/random/stratified/paths/no-bursts: $(for k in exact random stratified paths nobursts; do echo -n "$(echo ${R[$k]} | awk '{ print $NF }') "; done)"
    done
    read -r um umin umax <<< "$(echo "${T[untraced]}" | tr ' ' '\n' | grep . | stats)"
    # `ov KIND`: the median of the pairs' ratios, and their range.
    ov() { echo "${R[$1]}" | tr ' ' '\n' | grep . | stats | awk '{ printf "%.3f [%.3f-%.3f]", $1, $2, $3 }'; }
    # Amplified (see the header): the per-sample and per-burst costs at
    # HIFREQ on a quarter of the workload, from pairs, and the overhead
    # they imply at the default rate.
    read -r -a ACMD <<< "$(SCALE=$(awk -v s="$SCALE" 'BEGIN { print s / 4 }') command_for "$prog")"
    cs=() cb=()
    hs="$WORK/$prog-hi-smp" hd="$WORK/$prog-hi-def"
    for r in $(seq "$RUNS"); do
        # (prog.q: the quarter workload's output has its own hash.)
        read -r n u1 <<< "$(CMD=("${ACMD[@]}"); prog="$prog.q"; paired "$hs" --no-bursts --freq "$HIFREQ")"
        read -r m u2 <<< "$(CMD=("${ACMD[@]}"); prog="$prog.q"; paired "$hd" --record values,targets --freq "$HIFREQ")"
        # Each traced run as a ratio to the untraced one beside it, in
        # seconds of the untraced pair's mean.
        cs+=("$(awk -v n="$n" -v u1="$u1" -v u2="$u2" -v k="$(run_metric "$hs" burstyd_samples_total)" 'BEGIN { printf "%.2f", k ? (n / u1 - 1) * (u1 + u2) / 2 / k * 1e6 : 0 }')")
        cb+=("$(awk -v n="$n" -v m="$m" -v u1="$u1" -v u2="$u2" -v k="$(metric "$hd" burstyd_traced_bursts_total)" 'BEGIN { printf "%.2f", k ? (m / u2 - n / u1) * (u1 + u2) / 2 / k * 1e6 : 0 }')")
        log "$prog amplified round $r (--freq $HIFREQ): sampling $n beside $u1, default $m beside $u2 CPU s; µs per sample ${cs[-1]}, per burst ${cb[-1]}"
    done
    c_smp=$(printf '%s\n' "${cs[@]}" | stats | awk '{ print $1 }')
    c_bur=$(printf '%s\n' "${cb[@]}" | stats | awk '{ print $1 }')
    d_smp=$(run_metric "$WORK/$prog-ov-stratified" burstyd_samples_total)
    d_bur=$(metric "$WORK/$prog-ov-stratified" burstyd_traced_bursts_total)
    implied=$(awk -v cs="$c_smp" -v cb="$c_bur" -v s="$d_smp" -v b="$d_bur" -v t="$um" \
        'BEGIN { printf "%.4f", 1 + ((cs > 0 ? cs : 0) * s / 1e6 + (cb > 0 ? cb : 0) * b / 1e6) / t }')
    log "$prog amplified: $c_smp µs per sample, $c_bur µs per burst; $d_smp samples and $d_bur bursts at the default rate: overhead $implied"
    inb() { echo "${IB[$1]}" | tr ' ' '\n' | grep . | stats | awk -v u="$um" '{ printf "%.2f", 100 * $1 / u }'; }
    outs="$(grep -c "^$prog\(\.q\)\? same" "$WORK/outputs" || true) same, $(grep -c "^$prog\(\.q\)\? differs" "$WORK/outputs" || true) differ"
    printf '| %s | %.2f [%.2f-%.2f] | %s | %s | %s | %s | %s | %s / %s / %s / %s | %s | %s | %s, %s | %s | %s |\n' "$prog" "$um" "$umin" "$umax" \
        "$(ov exact)" "$(ov random)" "$(ov stratified)" "$(ov paths)" "$(ov nobursts)" "$(inb exact)" "$(inb random)" "$(inb stratified)" "$(inb paths)" \
        "$c_smp" "$c_bur" "$d_smp" "$d_bur" "$implied" "$outs" >> "$OVER"
    unset T R IB
    rm -f "$WORK"/*.out
    log "$prog: done in $(( $(date +%s) - t_prog )) s"
done

{
    echo "bench/tuples.sh --programs \"$PROGRAMS\" --runs $RUNS --rates \"$RATES\" (SCALE=$SCALE; started $START)"
    echo
    echo "Convergence (one run per row, --sampler-reference): the last checkpoint's error (hot: the paper's ERR; total: frequency-weighted), and the smallest \`delivered\` from which the hot error stays under 3% / 1%"
    echo
    cat "$CONV"
    echo
    echo "Tuples delivered until the hot error stays under 3% / 1%: random / stratified; ratio: random / stratified (> 1: stratified needed fewer; \">x\": random never did, in x times what stratified needed); by exact: the same ratio in exact tuples seen by then (the paper's profiling events: a stratified sampler holds up to rate x strata tuples undelivered in its counters)"
    echo
    cat "$RATIO"
    echo
    echo "Overhead: the program's CPU time (user + sys) traced / untraced, median of $RUNS pairs, each traced run beside an untraced one at the same time [range of the pairs' ratios]; --record values,targets at the default rate (16); in-b%: time in bursts / untraced CPU; µs/sample, µs/burst: the default configuration's costs measured at --freq $HIFREQ on a quarter of the workload (medians of $RUNS rounds); samples, bursts: those of the last default-rate stratified run; amplified: the overhead they imply, 1 + (µs/sample x samples + µs/burst x bursts) / untraced CPU"
    echo
    cat "$OVER"
    echo
} > "$WORK/tuples.md"
cat "$WORK/tuples.md"
