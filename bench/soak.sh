#!/usr/bin/env bash
# Soak benchmark: burstyd running as the systemd service runs it, tracing a
# real Debian server (redis-server) under load on loopback for minutes.
#
# burstyd runs as burstyd.service would run it: `burstyd --config FILE`
# (no --pid), the capability bounding set of the unit (setpriv, read from
# systemd/burstyd.service's CapabilityBoundingSet=; no new
# privileges), sd_notify to a socket of ours (READY=1, WATCHDOG=1 with
# WATCHDOG_USEC=30 s as WatchdogSec=30s), the service's plan cache
# (/var/cache/burstyd), and a config file with 30 s interval profiles, an
# HTTP endpoint, [bursts] (500-check bursts) and one [[target]] selecting
# /usr/bin/redis-server by its executable path (a symlink: the process
# shows /usr/bin/redis-check-rdb, which burstyd resolves). It waits for
# the attach (the executable, then the libraries: up to 60 s) before the
# load starts.
#
# Two redis servers run pinned to CPU 1 (taskset): the traced one is
# /usr/bin/redis-server; the untraced one is a byte-identical copy of it
# under the work directory, which no [[target]] selects (it only passes
# through the eBPF program's target filter). The daemon runs the whole
# time (a soak); the load alternates between the servers in phases
# (untraced, traced, traced, untraced, ...): redis-benchmark pinned to
# CPU 0 (SET and GET, 50 clients, pipeline 4, 64-byte values over 100,000
# keys), so the server's core is saturated and CPU 0 is shared by the load
# generator, the checker and the daemon. Alongside, a checker client
# (bench/soak/checker.py, RESP over a socket) writes known values to both
# servers and reads them back, verifying every reply (SET/GET, older keys,
# an INCR counter; 200 rounds/s per server).
#
# Reports: throughput traced/untraced per pair of phases (median, range);
# load generator errors and the checker's verdict; the daemon's CPU (% of
# one core, from /proc/PID/stat) in traced and untraced phases and as a
# curve over time with its RSS (/proc/PID/status) every --sample seconds,
# with a flatness verdict (RSS at the end against one minute into the
# load, and its slope); the
# /metrics counters (samples, ring drops, burst signals and why some were
# not sent); the daemon's exit lines (bursts taken/declined, records lost,
# hot coverage, its CPU summary); READY=1, the watchdog's largest gap and
# how long a SIGTERM stop took. Bounds, PASS/FAIL each: throughput ratio
# >= 0.98, 0 load errors and 0 checker mismatches, daemon CPU <= 1% of a
# core in traced phases, peak RSS <= 100 MB and flat, 0 records lost, 0
# samples lost to the ring, bursts taken > 0, watchdog gap < 30 s, stop
# < 30 s. Exits 1 if a bound fails.
#
# Usage (workspace root, as root, after `cargo build --release -p burstyd`):
#   bash bench/soak.sh [--minutes N] [--phase SECS] [--sample SECS] [--quick]
#                      [--no-bursts] [--clients C] [--pipeline P] [--rate R]
#                      [--no-bg-thread] [--no-unit-caps]
# --minutes N: minutes of traced load (default 10; as many untraced: the
#   run takes about 2N + 2 minutes); --phase: seconds per phase (30);
#   --sample: seconds between CPU/RSS samples (30); --quick: --minutes 2
#   --phase 20 --sample 10; --no-bursts: sampling only (`[bursts]
#   enabled = false`); --no-unit-caps: every capability instead of the
#   unit's bounding set; --clients/--pipeline:
#   redis-benchmark -c/-P (50, 4); --rate: checker rounds per second per
#   server (200); --no-bg-thread: both servers run with
#   `--jemalloc-bg-thread no` (by default Debian's settings: jemalloc's
#   background thread, which blocks every signal and so never gets a burst;
#   burstyd once refused such a process, finding no free signal).
# Environment: BURSTYD_BIN (default target/release/burstyd; copied to the
#   work directory), KEEP=1 keeps the work directory. Installs redis-server
#   and redis-tools with apt-get if missing (and says so).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UNIT_CAPS=1; MINUTES=10; PHASE=30; SAMPLE=30; BURSTS=1; CLIENTS=50; PIPELINE=4; RATE=200; REDIS_DEFAULTS=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --minutes) MINUTES="$2"; shift 2 ;;
        --phase) PHASE="$2"; shift 2 ;;
        --sample) SAMPLE="$2"; shift 2 ;;
        --quick) MINUTES=2; PHASE=20; SAMPLE=10; shift ;;
        --no-bursts) BURSTS=0; shift ;;
        --clients) CLIENTS="$2"; shift 2 ;;
        --pipeline) PIPELINE="$2"; shift 2 ;;
        --rate) RATE="$2"; shift 2 ;;
        --redis-defaults) REDIS_DEFAULTS=1; shift ;;
        --no-bg-thread) REDIS_DEFAULTS=0; shift ;;
        --no-unit-caps) UNIT_CAPS=0; shift ;;
        -h|--help) sed -n "2,63p" "$0"; exit 0 ;;
        *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "soak.sh: error: $*" >&2; exit 1; }
[[ "$MINUTES" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--minutes must be a number"
for v in PHASE SAMPLE CLIENTS PIPELINE; do [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--${v,,} must be a positive integer"; done
[[ "$RATE" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--rate must be a number"
[[ $(id -u) -eq 0 ]] || die "run as root (burstyd loads eBPF programs and uses ptrace)"
[[ $(nproc) -ge 2 ]] || die "needs 2 CPUs (the server on CPU 1, the load generator on CPU 0)"
BURSTYD_SRC="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
[[ -x "$BURSTYD_SRC" ]] || die "$BURSTYD_SRC not found: build it with \`cargo build --release -p burstyd\`"
for c in curl python3 setpriv taskset; do command -v "$c" >/dev/null || die "$c not found"; done
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
    echo "== installing redis-server and redis-tools (apt-get): the server under test and its load generator" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools >&2 \
        || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools >&2; } \
        || die "apt-get install redis-server redis-tools failed"
fi
# Debian starts the packaged redis on 6379 where an init system allows:
# it is not ours, and the exe selector would pick it up too.
pgrep -x redis-server >/dev/null && die "a redis-server is already running (pid $(pgrep -x redis-server | tr '\n' ' ')): the [[target]] would select it too; stop it first"
REDIS_EXE=/usr/bin/redis-server
REDIS_REAL="$(readlink -f "$REDIS_EXE")"

PHASES=$(awk -v m="$MINUTES" -v p="$PHASE" 'BEGIN { n = int((m * 60 + p - 1) / p); print (n < 1) ? 1 : n }')
TCK=$(getconf CLK_TCK)
WORK="$(mktemp -d /tmp/burstyd-soak.XXXXXX)"
DAEMON_PID=""; NOTIFY_PID=""; CHECK_PID=""; SAMPLER_PID=""; RT_PID=""; RU_PID=""
cleanup() {
    for p in "$SAMPLER_PID" "$CHECK_PID"; do [[ -n "$p" ]] && kill "$p" 2>/dev/null; done
    [[ -n "$DAEMON_PID" ]] && kill -TERM "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
    for p in "$RT_PID" "$RU_PID" "$NOTIFY_PID"; do [[ -n "$p" ]] && kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    [[ "${KEEP:-0}" == 1 ]] && echo "soak.sh: kept $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT

now() { date +%s.%N; }
stats() { sort -g | awk '{ v[NR] = $1 } END { if (!NR) { print "n/a n/a n/a"; exit } m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.4f %.4f %.4f\n", m, v[1], v[NR] }'; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }   # utime + stime (the comm has no spaces here)
cticks() { awk '{ print $16 + $17 }' "/proc/$1/stat" 2>/dev/null || echo 0; }  # waited-for children (attach workers)
rss_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
metric() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
strip() { sed 's/\x1b\[[0-9;]*m//g' "$1"; }
# bound TEXT VALUE OK(1/0): one PASS/FAIL line (not in a subshell: it sets FAILED).
bound() { local r=PASS; [[ "$3" == 1 ]] || { r=FAIL; FAILED=1; }; printf '  %-52s %-22s %s\n' "$1" "$2" "$r"; }
yes_if() { if eval "$1"; then echo 1; else echo 0; fi; }
FAILED=0

# ---- the servers ---------------------------------------------------------
PORT_T=$((20000 + RANDOM % 10000)); PORT_U=$((PORT_T + 1)); HTTP_PORT=$((PORT_T + 2))
mkdir -p "$WORK/untraced" "$WORK/data"
cp "$REDIS_REAL" "$WORK/untraced/redis-server"
REDIS_ARGS=(--bind 127.0.0.1 --save "" --appendonly no --daemonize no --loglevel warning --dir "$WORK/data")
[[ "$REDIS_DEFAULTS" == 1 ]] || REDIS_ARGS+=(--jemalloc-bg-thread no)
echo "== servers on CPU 1: traced $REDIS_EXE (-> $REDIS_REAL) on :$PORT_T, untraced copy $WORK/untraced/redis-server on :$PORT_U" >&2
taskset -c 1 "$REDIS_EXE" --port "$PORT_T" "${REDIS_ARGS[@]}" >"$WORK/redis-traced.log" 2>&1 &
RT_PID=$!
taskset -c 1 "$WORK/untraced/redis-server" --port "$PORT_U" "${REDIS_ARGS[@]}" >"$WORK/redis-untraced.log" 2>&1 &
RU_PID=$!
for port in "$PORT_T" "$PORT_U"; do
    for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG || { cat "$WORK"/redis-*.log >&2; die "redis on :$port did not start"; }
done

# ---- the daemon, as the service runs it ----------------------------------
BURSTYD="$WORK/burstyd"
cp "$BURSTYD_SRC" "$BURSTYD"
BIN_SHA=$(sha256sum "$BURSTYD_SRC" | cut -c1-12)
BIN_TIME=$(date -u -r "$BURSTYD_SRC" +%FT%TZ)
# The commit the binary was built from is not known here: this checkout's
# HEAD is printed (BURSTYD_COMMIT overrides it).
BIN_COMMIT="${BURSTYD_COMMIT:-$(git -C "$ROOT" log -1 --format='%h %cI' 2>/dev/null || echo "?")}"
CONFIG="$WORK/burstyd.toml"
{
    echo "[output]"
    echo "dir = \"$WORK/out\""
    echo "interval = \"30s\""
    echo "[http]"
    echo "listen = \"127.0.0.1:$HTTP_PORT\""
    echo "[bursts]"
    if [[ "$BURSTS" == 1 ]]; then
        echo "enabled = true"
        echo "burst = 500"
        echo "max_traced = 8"
        echo "path_time = false"
    else
        echo "enabled = false"
    fi
    echo "[[target]]"
    echo "exe = \"$REDIS_EXE\""
    [[ "$BURSTS" == 1 ]] && echo "bursts = true"
    true
} >"$CONFIG"
python3 "$ROOT/bench/soak/notify.py" "$WORK/notify.sock" "$WORK/notify.log" &
NOTIFY_PID=$!
for _ in $(seq 50); do [[ -S "$WORK/notify.sock" ]] && break; sleep 0.1; done
# The unit's own bounding set (systemd/burstyd.service), as setpriv spells it.
CAPS=-all$(sed -n 's/^CapabilityBoundingSet=//p' "$ROOT/systemd/burstyd.service" \
    | tr ' ' '\n' | sed -n 's/^CAP_\(.*\)/,+\L\1/p' | tr -d '\n')
[[ "$UNIT_CAPS" == 1 ]] || CAPS=+all
echo "== burstyd --config $CONFIG (bursts: $([[ $BURSTS == 1 ]] && echo on || echo off); $([[ $UNIT_CAPS == 1 ]] && echo "the unit's capability bounding set" || echo "every capability"); sd_notify, WATCHDOG_USEC=30s)" >&2
D_START=$(now)
NOTIFY_SOCKET="$WORK/notify.sock" WATCHDOG_USEC=30000000 \
    sh -c 'export WATCHDOG_PID=$$; exec setpriv --no-new-privs --bounding-set="$0" "$1" --config "$2"' \
    "$CAPS" "$BURSTYD" "$CONFIG" >"$WORK/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 300); do
    grep -q READY=1 "$WORK/notify.log" 2>/dev/null && break
    kill -0 "$DAEMON_PID" 2>/dev/null || { strip "$WORK/daemon.log" >&2; die "burstyd exited at start"; }
    sleep 0.1
done
grep -q READY=1 "$WORK/notify.log" || { strip "$WORK/daemon.log" >&2; die "no READY=1 within 30 s"; }
READY_S=$(awk -v s="$D_START" '$2 == "READY=1" { printf "%.2f", $1 - s; exit }' "$WORK/notify.log")
echo "   READY=1 after ${READY_S} s" >&2
echo phase:idle >"$WORK/phase"

# CPU / RSS curve, every $SAMPLE s: t, daemon ticks, children's ticks,
# VmRSS, VmHWM (kB), the phase running.
sampler() {
    while kill -0 "$DAEMON_PID" 2>/dev/null; do
        printf '%s %s %s %s %s %s\n' "$(now)" "$(ticks "$DAEMON_PID")" "$(cticks "$DAEMON_PID")" \
            "$(rss_kb "$DAEMON_PID" VmRSS)" "$(rss_kb "$DAEMON_PID" VmHWM)" "$(cut -d: -f2 "$WORK/phase")" >>"$WORK/curve"
        sleep "$SAMPLE"
    done
}
: >"$WORK/curve"
sampler &
SAMPLER_PID=$!

ATTACH="n/a (--no-bursts)"; LIBS="n/a"
# The libraries' lines (or their failure): the service clones a library
# once it holds 1% of the process's samples (`libraries = "hot"`), so
# under load; at the default log level nothing is logged when no library
# can be opened.
LIBS_RE="bursty tracing: [0-9]* functions of [0-9]* librar\|bursty tracing: [0-9]* functions of librar\|bursty tracing: [0-9]* functions of a librar\|shared libraries not cloned"
if [[ "$BURSTS" == 1 ]]; then
    echo "== waiting for the attach (the executable, up to 180 s; its hot libraries follow under load)" >&2
    for _ in $(seq 1800); do
        strip "$WORK/daemon.log" | grep -q "functions rewritten\|re-armed the clones\|cannot trace .* in bursts" && break
        sleep 0.1
    done
    ATTACH=$(strip "$WORK/daemon.log" | grep -o "bursty tracing: [0-9]* functions rewritten.*\|bursty tracing: re-armed.*\|cannot trace .* in bursts.*" | head -1 || true)
    echo "   ${ATTACH:-no attach logged}" >&2
fi
ATTACH_DONE_S=$(awk -v s="$D_START" -v n="$(now)" 'BEGIN { printf "%.1f", n - s }')

# ---- the checker and the load ----------------------------------------------
taskset -c 0 python3 "$ROOT/bench/soak/checker.py" --rate "$RATE" --out "$WORK/checker.out" \
    "127.0.0.1:$PORT_T" "127.0.0.1:$PORT_U" 2>"$WORK/checker.err" &
CHECK_PID=$!

# bench PORT N: one redis-benchmark run (SET then GET, N each); prints the
# combined requests/s; load errors go to $WORK/errors.
bench() {
    local out="$WORK/bench.out" rc=0
    taskset -c 0 redis-benchmark -h 127.0.0.1 -p "$1" -c "$CLIENTS" -P "$PIPELINE" -n "$2" -r 100000 -d 64 \
        -t set,get --csv >"$out" 2>&1 || rc=$?
    local errs
    errs=$(grep -ci 'error' "$out" || true)
    if [[ "$rc" != 0 || "$errs" != 0 ]]; then
        echo "phase on :$1: exit $rc, $errs error lines: $(grep -i error "$out" | head -3 | tr '\n' ' ')" >>"$WORK/errors"
    fi
    awk -F'"' '$2 == "SET" { s = $4 } $2 == "GET" { g = $4 } END { if (s > 0 && g > 0) printf "%.1f\n", 2 / (1 / s + 1 / g); else print 0 }' "$out"
}
: >"$WORK/errors"
echo "== calibrating: redis-benchmark -c $CLIENTS -P $PIPELINE on the untraced server" >&2
bench "$PORT_T" 200000 >/dev/null   # the same keys in both servers
CAL=$(bench "$PORT_U" 200000)
awk -v c="$CAL" 'BEGIN { exit !(c > 0) }' || die "calibration failed: $(cat "$WORK/bench.out")"
N=$(awk -v c="$CAL" -v p="$PHASE" 'BEGIN { printf "%d", c * p / 2 }')
echo "   ${CAL} requests/s: $N SETs + $N GETs per phase (~${PHASE} s)" >&2

# phase LABEL PORT SERVER_PID: one phase; appends "label thr server_cpu% daemon_cpu% secs" to $WORK/phases.
phase() {
    echo "phase:$1" >"$WORK/phase"
    local t0 s0 d0 t1 s1 d1 thr
    t0=$(now); s0=$(ticks "$3"); d0=$(ticks "$DAEMON_PID")
    thr=$(bench "$2" "$N")
    t1=$(now); s1=$(ticks "$3"); d1=$(ticks "$DAEMON_PID")
    echo phase:idle >"$WORK/phase"
    awk -v l="$1" -v thr="$thr" -v t0="$t0" -v t1="$t1" -v s="$((s1 - s0))" -v d="$((d1 - d0))" -v k="$TCK" \
        'BEGIN { w = t1 - t0; printf "%s %s %.1f %.3f %.1f\n", l, thr, 100 * s / k / w, 100 * d / k / w, w }' >>"$WORK/phases"
    tail -1 "$WORK/phases"
}
: >"$WORK/phases"; : >"$WORK/ratios"
LOAD_START=$(now)
echo "== $PHASES pairs of ${PHASE}-second phases (untraced/traced alternating, ABBA order); redis-benchmark on CPU 0, servers on CPU 1" >&2
for i in $(seq 1 "$PHASES"); do
    if (( i % 2 )); then
        read -r _ u su du wu < <(phase U "$PORT_U" "$RU_PID")
        read -r _ t st dt wt < <(phase T "$PORT_T" "$RT_PID")
    else
        read -r _ t st dt wt < <(phase T "$PORT_T" "$RT_PID")
        read -r _ u su du wu < <(phase U "$PORT_U" "$RU_PID")
    fi
    r=$(awk -v t="$t" -v u="$u" 'BEGIN { printf "%.4f", (u > 0) ? t / u : 0 }')
    echo "$r" >>"$WORK/ratios"
    printf '  pair %2d: untraced %9.0f req/s (server %5.1f%% CPU)  traced %9.0f req/s (server %5.1f%% CPU)  ratio %s  daemon CPU %.2f%% / %.2f%%  RSS %s MB\n' \
        "$i" "$u" "$su" "$t" "$st" "$r" "$du" "$dt" "$(awk -v k="$(rss_kb "$DAEMON_PID" VmRSS)" 'BEGIN { printf "%.1f", k / 1024 }')" >&2
    kill -0 "$DAEMON_PID" 2>/dev/null || { strip "$WORK/daemon.log" | tail -20 >&2; die "burstyd died during the soak"; }
done
LOAD_END=$(now)

# ---- the end: checker, last scrape, SIGTERM ------------------------------
kill -TERM "$CHECK_PID"; wait "$CHECK_PID" || true; CHECK_PID=""
curl -s -m 10 "http://127.0.0.1:$HTTP_PORT/metrics" >"$WORK/metrics" || true
PATHS_CODE=$(curl -s -m 30 -o "$WORK/paths-http.pb.gz" -w '%{http_code}' "http://127.0.0.1:$HTTP_PORT/debug/pprof/paths" || echo fail)
PATHS_SIZE=$(stat -c %s "$WORK/paths-http.pb.gz" 2>/dev/null || echo 0)
# A last curve point, then stop as systemd would (SIGTERM, TimeoutStopSec=30s).
printf '%s %s %s %s %s %s\n' "$(now)" "$(ticks "$DAEMON_PID")" "$(cticks "$DAEMON_PID")" \
    "$(rss_kb "$DAEMON_PID" VmRSS)" "$(rss_kb "$DAEMON_PID" VmHWM)" end >>"$WORK/curve"
kill "$SAMPLER_PID" 2>/dev/null || true; wait "$SAMPLER_PID" 2>/dev/null || true; SAMPLER_PID=""
STOP_T0=$(now)
kill -TERM "$DAEMON_PID"
D_RC=0; wait "$DAEMON_PID" || D_RC=$?
STOP_S=$(awk -v a="$STOP_T0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
DAEMON_PID=""
LOG="$WORK/daemon.clean.log"; strip "$WORK/daemon.log" >"$LOG"

# ---- report --------------------------------------------------------------
read -r R_MED R_MIN R_MAX < <(stats <"$WORK/ratios")
# stats with another format: fstats FMT
fstats() { stats | awk -v f="$1" '{ if ($1 == "n/a") print; else printf f " " f " " f "\n", $1, $2, $3 }'; }
read -r TU_MED TU_MIN TU_MAX < <(awk '$1 == "U" { print $2 }' "$WORK/phases" | fstats %.0f)
read -r TT_MED TT_MIN TT_MAX < <(awk '$1 == "T" { print $2 }' "$WORK/phases" | fstats %.0f)
read -r SU_MED _ _ < <(awk '$1 == "U" { print $3 }' "$WORK/phases" | fstats %.1f)
read -r ST_MED _ _ < <(awk '$1 == "T" { print $3 }' "$WORK/phases" | fstats %.1f)
read -r DU_MED DU_MIN DU_MAX < <(awk '$1 == "U" { print $4 }' "$WORK/phases" | fstats %.2f)
read -r DT_MED DT_MIN DT_MAX < <(awk '$1 == "T" { print $4 }' "$WORK/phases" | fstats %.2f)
# Daemon CPU over all traced phases together (ticks / wall).
DT_ALL=$(awk '$1 == "T" { c += $4 * $5; w += $5 } END { printf "%.2f", w ? c / w : 0 }' "$WORK/phases")
TRACED_MIN=$(awk '$1 == "T" { w += $5 } END { printf "%.1f", w / 60 }' "$WORK/phases")
# And over the whole load window (traced and untraced phases: the server
# under load half of the time; interval profiles land in either).
D_ALL=$(awk '{ c += $4 * $5; w += $5 } END { printf "%.2f", w ? c / w : 0 }' "$WORK/phases")
LOAD_ERRORS=$(wc -l <"$WORK/errors")
read -r CK_OPS CK_VALS CK_MIS CK_ERR < <(awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] += kv[2] } }
    END { printf "%d %d %d %d\n", v["ops"], v["checked_values"], v["mismatches"], v["errors"] }' "$WORK/checker.out" 2>/dev/null || echo "0 0 0 0")
CK_FIRST=$(grep -o 'first_error=[^ ]*' "$WORK/checker.out" 2>/dev/null | grep -v 'first_error=-' | head -1 || true)

# The curve: CPU % of one core over each sample interval, RSS.
CURVE=$(awk -v s="$D_START" -v k="$TCK" '
    NR > 1 { printf "  %7.0f s  %6.2f%%  %7.1f MB  %7.1f MB  %5.1f s  %s\n", $1 - s, 100 * ($2 - t) / k / ($1 - p), $4 / 1024, $5 / 1024, ($3) / k, $6 }
    { p = $1; t = $2 }' "$WORK/curve")
# RSS one minute into the load (the first sample at least 60 s after it
# began; half-way through a shorter load) and at the end.
REF_S=$(awk -v a="$LOAD_START" -v b="$LOAD_END" 'BEGIN { h = (b - a) / 2; printf "%.0f", (h < 60) ? h : 60 }')
RSS_1M=$(awk -v s="$LOAD_START" -v r="$REF_S" '$1 - s >= r { printf "%.1f", $4 / 1024; exit }' "$WORK/curve")
[[ -n "$RSS_1M" ]] || RSS_1M=$(awk 'NR == 2 { printf "%.1f", $4 / 1024 }' "$WORK/curve")
RSS_END=$(awk 'END { printf "%.1f", $4 / 1024 }' "$WORK/curve")
RSS_MAX=$(awk '{ if ($4 > m) m = $4 } END { printf "%.1f", m / 1024 }' "$WORK/curve")
HWM=$(awk 'END { printf "%.1f", $5 / 1024 }' "$WORK/curve")
RSS_GROWTH=$(awk -v a="$RSS_1M" -v b="$RSS_END" 'BEGIN { printf "%+.1f MB (%+.1f%%)", b - a, (a > 0) ? 100 * (b - a) / a : 0 }')
RSS_FLAT=$(awk -v a="$RSS_1M" -v b="$RSS_END" 'BEGIN { lim = (a * 0.05 > 2) ? a * 0.05 : 2; print (b - a <= lim) ? 1 : 0 }')
# Steady-state slope: least squares over the samples from one minute on (MB per hour).
SLOPE=$(awk -v s="$LOAD_START" -v r="$REF_S" '$1 - s >= r { x = ($1 - s) / 3600; y = $4 / 1024; n++; sx += x; sy += y; sxx += x * x; sxy += x * y }
    END { d = n * sxx - sx * sx; if (n > 2 && d > 0) printf "%+.1f MB/h over %d samples", (n * sxy - sx * sy) / d, n; else print "n/a (too few samples)" }' "$WORK/curve")

M="$WORK/metrics"
SAMPLES=$(metric "$M" burstyd_samples_total); RING_DROPS=$(metric "$M" burstyd_ring_drops_total)
TRUNC=$(metric "$M" burstyd_truncated_stacks_total); PROFILES=$(metric "$M" burstyd_profiles_written_total)
SIGNALS=$(metric "$M" burstyd_burst_signals_total)
M_TAKEN=$(metric "$M" burstyd_bursts_taken_total); M_DECL=$(metric "$M" burstyd_bursts_declined_total); M_TRUNC=$(metric "$M" burstyd_bursts_truncated_total)
M_CPU=$(metric "$M" process_cpu_seconds_total); M_RSS=$(awk '$1 == "process_resident_memory_bytes" { printf "%.1f", $2 / 1048576 }' "$M")
M_REWRITTEN=$(metric "$M" burstyd_functions_rewritten_total)
NOT_SENT=$(awk -F'[{}" ]+' '/^burstyd_burst_signals_declined_total\{/ { printf "%s%s %s", sep, $3, $4; sep = ", " }' "$M")

BURSTS_LINE=$(grep -o 'bursts: [0-9]* taken.*' "$LOG" | head -1 || true)
B_TAKEN=$(echo "$BURSTS_LINE" | sed -n 's/^bursts: \([0-9]*\) taken.*/\1/p')
B_LOST=$(echo "$BURSTS_LINE" | sed -n 's/.*records lost: \([0-9]*\).*/\1/p')
B_BAD=$(echo "$BURSTS_LINE" | sed -n 's/.*bad records: \([0-9]*\).*/\1/p')
CONTEXTS_LINE=$(grep -o 'path contexts: .*' "$LOG" | head -1 | sed 's/ pid=[0-9]*$//' || true)
HOT_LINE=$(grep -o 'hot coverage: .*' "$LOG" | head -1 | sed 's/ pid=[0-9]*$//' | cut -c1-400 || true)
CPU_LINE=$(grep -o 'daemon CPU: .*' "$LOG" | head -1 || true)
WARNS=$(grep -c ' WARN \| ERROR ' "$LOG" || true)
WARN_LINES=$(grep ' WARN \| ERROR ' "$LOG" | grep -v 'falling back to cpu-clock' | sed 's/^[^ ]* *//' | sort | uniq -c | sort -rn | head -8 | cut -c1-300 || true)
# Watchdog: the largest gap between WATCHDOG=1 pings (and from the last to STOPPING=1).
WD=$(awk '$2 == "WATCHDOG=1" || $2 == "STOPPING=1" { if (p) { g = $1 - p; if (g > m) m = g } p = $1; n += ($2 == "WATCHDOG=1") } END { printf "%d %.1f", n, m }' "$WORK/notify.log")
read -r WD_N WD_GAP <<<"$WD"
STOPPING=$(grep -c 'STOPPING=1' "$WORK/notify.log" || true)
INTERVALS=$(find "$WORK/out" -maxdepth 1 -name 'context-*.pb.gz' | wc -l)
ELAPSED_MIN=$(awk -v a="$D_START" -v b="$STOP_T0" 'BEGIN { printf "%.1f", (b - a) / 60 }')

echo
echo "burstyd soak: redis-server $(redis-server --version | grep -o 'v=[^ ]*' | cut -c3-) under redis-benchmark on loopback, $(nproc) CPUs, $(uname -r), $(date -u +%FT%TZ)"
echo "  burstyd: $BURSTYD_SRC (sha256 $BIN_SHA, file time $BIN_TIME; checkout $BIN_COMMIT), --config, bursts $([[ $BURSTS == 1 ]] && echo 'on (500 checks)' || echo off), the file's default event and rate, $([[ $UNIT_CAPS == 1 ]] && echo "the unit's capability bounding set" || echo "every capability (--no-unit-caps)")"
echo "  load: redis-benchmark -c $CLIENTS -P $PIPELINE -d 64 -r 100000 -t set,get on CPU 0; servers on CPU 1$([[ $REDIS_DEFAULTS == 1 ]] || echo ' (--jemalloc-bg-thread no)'); checker $RATE rounds/s per server"
echo "  $PHASES pairs of ~${PHASE} s phases: ${TRACED_MIN} min of traced load; daemon up ${ELAPSED_MIN} min; READY=1 after ${READY_S} s; attach settled ${ATTACH_DONE_S} s after start"
echo "  attach: ${ATTACH:-none logged}"
if [[ "$BURSTS" == 1 ]]; then
    grep -o "[^ ]* holds [0-9.]*% of the process's samples" "$LOG" | sed 's/^/  hot library: /' || true
    LIBS_N=0
    while IFS= read -r l; do
        LIBS_N=$((LIBS_N + 1))
        TS=$(awk '{ print $1 }' <<<"$l")
        AT=$(awk -v a="$D_START" -v b="$(date -u -d "$TS" +%s.%N)" 'BEGIN { printf "%.1f s after the start: ", b - a }')
        echo "  libraries: $AT$(grep -o "\\($LIBS_RE\\).*" <<<"$l" | cut -c1-300)"
    done < <(grep "$LIBS_RE" "$LOG" || true)
    [[ "$LIBS_N" -gt 0 ]] || echo "  libraries: NOT cloned during the run (no line logged; under the unit capability set /proc/PID/map_files cannot be opened, which only -v shows)"
fi
echo
echo "throughput (requests/s, SET and GET combined):"
echo "  untraced  median ${TU_MED}  [${TU_MIN} .. ${TU_MAX}]   server CPU median ${SU_MED}%"
echo "  traced    median ${TT_MED}  [${TT_MIN} .. ${TT_MAX}]   server CPU median ${ST_MED}%"
echo "  traced/untraced per pair: median ${R_MED}  [${R_MIN} .. ${R_MAX}]   ($(tr '\n' ' ' <"$WORK/ratios"))"
echo "correctness:"
echo "  load generator errors: ${LOAD_ERRORS}$([[ $LOAD_ERRORS != 0 ]] && echo " ($(head -2 "$WORK/errors" | tr '\n' ' '))")"
echo "  checker: ${CK_VALS} values read back and verified, ${CK_OPS} replies checked, ${CK_MIS} mismatches, ${CK_ERR} errors ${CK_FIRST}"
echo "daemon CPU (% of one core; /proc/PID/stat utime+stime over each phase):"
echo "  traced phases    median ${DT_MED}%  [${DT_MIN} .. ${DT_MAX}]   all traced phases together ${DT_ALL}%"
echo "  untraced phases  median ${DU_MED}%  [${DU_MIN} .. ${DU_MAX}]   whole load window ${D_ALL}% (the 30 s interval profiles fall in either kind of phase)"
echo "  own summary at exit: ${CPU_LINE:-n/a}"
echo "daemon CPU and RSS over time (every ${SAMPLE} s; CPU over the interval before; children = attach workers' CPU, cumulative):"
echo "     time     CPU        RSS      peak    children  phase at sample"
echo "$CURVE"
echo "  RSS ${REF_S} s into the load ${RSS_1M} MB, at the end ${RSS_END} MB: ${RSS_GROWTH}; slope ${SLOPE}; max ${RSS_MAX} MB, VmHWM ${HWM} MB"
echo "/metrics at the end: samples ${SAMPLES:-?}, ring drops ${RING_DROPS:-?}, truncated stacks ${TRUNC:-?}, profiles written ${PROFILES:-?} (${INTERVALS} interval files), functions rewritten ${M_REWRITTEN:-?}"
echo "  burst signals sent ${SIGNALS:-?}; not sent: ${NOT_SENT:-?}"
echo "  bursts taken ${M_TAKEN:-?}, declined ${M_DECL:-?}, truncated ${M_TRUNC:-?} (the processes traced now and those released)"
echo "  process_cpu_seconds_total ${M_CPU:-?}, process_resident_memory_bytes ${M_RSS:-?} MB; /debug/pprof/paths: HTTP ${PATHS_CODE} (${PATHS_SIZE} bytes)"
echo "daemon exit (SIGTERM): status ${D_RC} after ${STOP_S} s; ${WD_N} watchdog pings, largest gap ${WD_GAP} s; STOPPING=1 sent: $([[ $STOPPING -gt 0 ]] && echo yes || echo no)"
echo "  ${BURSTS_LINE:-no bursts line}"
[[ -n "$CONTEXTS_LINE" ]] && echo "  $CONTEXTS_LINE"
[[ -n "$HOT_LINE" ]] && echo "  $HOT_LINE"
echo "  warnings/errors logged: ${WARNS}"
[[ -n "$WARN_LINES" ]] && echo "$WARN_LINES" | sed 's/^/    /'
echo
echo "bounds:"
bound "throughput traced/untraced, median >= 0.98" "$R_MED" "$(awk -v r="$R_MED" 'BEGIN { print (r >= 0.98) ? 1 : 0 }')"
bound "load generator errors = 0" "$LOAD_ERRORS" "$(yes_if '[[ $LOAD_ERRORS == 0 ]]')"
bound "checker: values verified > 0, 0 mismatches, 0 errors" "$CK_VALS/$CK_MIS/$CK_ERR" "$(yes_if '[[ $CK_MIS == 0 && $CK_ERR == 0 && $CK_VALS -gt 0 ]]')"
bound "daemon CPU in traced phases <= 1% of a core" "${DT_ALL}%" "$(awk -v c="$DT_ALL" 'BEGIN { print (c <= 1.0) ? 1 : 0 }')"
bound "daemon peak RSS (VmHWM) <= 100 MB" "$HWM MB" "$(awk -v m="$HWM" 'BEGIN { print (m <= 100) ? 1 : 0 }')"
bound "RSS flat: end - 1 min into load <= max(2 MB, 5%)" "${RSS_GROWTH% (*}" "$RSS_FLAT"
bound "samples lost to the ring = 0" "${RING_DROPS:-?}" "$(yes_if '[[ ${RING_DROPS:-x} == 0 ]]')"
if [[ "$BURSTS" == 1 ]]; then
    bound "traced in bursts: bursts taken > 0" "${B_TAKEN:-none}" "$(yes_if '[[ ${B_TAKEN:-0} -gt 0 ]]')"
    bound "records lost = 0, bad records = 0" "${B_LOST:-?}/${B_BAD:-?}" "$(yes_if '[[ ${B_LOST:-x} == 0 && ${B_BAD:-x} == 0 ]]')"
fi
bound "READY=1, watchdog gap < 30 s (WatchdogSec=30s)" "$WD_GAP s" "$(awk -v g="$WD_GAP" -v n="$WD_N" 'BEGIN { print (n > 0 && g < 30) ? 1 : 0 }')"
bound "SIGTERM stop < 30 s (TimeoutStopSec=30s), status 0" "$STOP_S s, $D_RC" "$(awk -v s="$STOP_S" -v rc="$D_RC" 'BEGIN { print (s < 30 && rc == 0) ? 1 : 0 }')"
if [[ "$FAILED" == 1 ]]; then
    echo "soak: FAIL"
    KEEP=1
    exit 1
fi
echo "soak: PASS"
