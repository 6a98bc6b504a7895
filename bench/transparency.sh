#!/usr/bin/env bash
# Can a traced program tell? Runs bench/src/syscall_stress.c (big reads and
# writes, pipes to a slow reader, getrandom, poll, epoll, a timerfd, a
# signal handler, nanosleep, a blocked signal drained with sigtimedwait,
# forks) untraced, then under `burstyd run --freq 2000` with bursts, for
# about the same number of seconds each, and compares the two logs of every
# system call's result line by line. Reports the mismatches (must be 0),
# the bursts taken and the burst signals not sent, by reason.
#
# With --attach-stress N, a third run: the program untraced while
# `burstyd --pid` attaches to it and detaches (--duration 0.5, bursts at
# --freq) N times one after the other (issue 35: an attach's ptrace stop
# must never cut a system call short); its log is compared the same way,
# and the table gives the attaches made and those that failed.
#
# Usage (workspace root, as root, after `cargo build --release -p burstyd`):
#   bash bench/transparency.sh [--seconds S] [--freq HZ] [--attach-stress N]
#   (default 300, 2000, none)
# Environment: BURSTYD_BIN, KEEP=1 keeps the work directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_WANTED=300
FREQ=2000
ATTACH_STRESS=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seconds) SECONDS_WANTED="$2"; shift 2 ;;
        --freq) FREQ="$2"; shift 2 ;;
        --attach-stress) ATTACH_STRESS="$2"; shift 2 ;;
        -h|--help) sed -n "2,19p" "$0"; exit 0 ;;
        *) echo "transparency.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
die() { echo "transparency.sh: error: $*" >&2; exit 1; }
[[ "$SECONDS_WANTED" =~ ^[1-9][0-9]*$ ]] || die "--seconds must be a positive integer"
[[ "$FREQ" =~ ^[1-9][0-9]*$ ]] || die "--freq must be a positive integer"
[[ "$ATTACH_STRESS" =~ ^[0-9]+$ ]] || die "--attach-stress must be a count"
[[ $(id -u) -eq 0 ]] || die "run as root (burstyd loads eBPF programs and uses ptrace)"
BURSTYD="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
[[ -x "$BURSTYD" ]] || die "$BURSTYD not found: build it with \`cargo build --release -p burstyd\`"
command -v gcc >/dev/null || die "gcc not found (scripts/setup.sh installs it)"

WORK="$(mktemp -d /tmp/transparency.XXXXXX)"
cleanup() { [[ "${KEEP:-0}" == 1 ]] && echo "kept $WORK" >&2 || rm -rf "$WORK"; }
trap cleanup EXIT
PROG="$WORK/syscall_stress"
gcc -O2 -g -Wall -o "$PROG" "$ROOT/bench/src/syscall_stress.c"

# Size the run: 200 iterations untraced, scaled to the wanted seconds.
start=$(date +%s.%N)
"$PROG" 200 "$WORK/calibrate.log" >/dev/null
per=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { print (e - s) / 200 }')
ITER=$(awk -v p="$per" -v s="$SECONDS_WANTED" 'BEGIN { n = int(s / p); print (n < 200 ? 200 : n) }')
echo "== $ITER iterations (~${SECONDS_WANTED}s untraced)" >&2

t0=$(date +%s.%N)
"$PROG" "$ITER" "$WORK/untraced.log" >"$WORK/untraced.out"
t1=$(date +%s.%N)
echo "== untraced: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')s; now traced at --freq $FREQ" >&2
status=0
"$BURSTYD" run --freq "$FREQ" -o "$WORK/out" -- "$PROG" "$ITER" "$WORK/traced.log" \
    >"$WORK/traced.out" 2>"$WORK/burstyd.log" || status=$?
t2=$(date +%s.%N)
[[ $status -eq 0 ]] || { tail -20 "$WORK/burstyd.log" >&2; die "the traced run exited $status"; }

lines=$(wc -l <"$WORK/untraced.log")
mismatches=$( (diff "$WORK/untraced.log" "$WORK/traced.log" || true) | grep -c '^[<>]' || true)
summary=$(grep -o 'bursts: [0-9]* taken' "$WORK/burstyd.log" | head -1 || true)
signals=$(grep -o '[0-9]* signals sent' "$WORK/burstyd.log" | head -1 || true)
declines=$(grep -o 'signals not sent: [^;]*' "$WORK/burstyd.log" | head -1 || true)
queued=$(grep -c 'sigtimedwait -1 Resource temporarily unavailable' "$WORK/traced.log" || true)
sigtw=$(grep -c ' sigtimedwait ' "$WORK/traced.log" || true)
echo
echo "syscall stress, $ITER iterations: untraced $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')s, traced (--freq $FREQ, bursts) $(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%.1f", b - a }')s"
echo "system call results logged: $lines; lines that differ traced vs untraced: $mismatches"
echo "blocked-signal drains that found nothing queued: $queued of $sigtw"
echo "$summary; $signals; $declines"
if [[ $mismatches -ne 0 ]]; then
    diff "$WORK/untraced.log" "$WORK/traced.log" | head -20
    status=1
fi
if [[ $ATTACH_STRESS -gt 0 ]]; then
    echo "== untraced, while burstyd --pid attaches and detaches up to $ATTACH_STRESS times" >&2
    "$PROG" "$ITER" "$WORK/stressed.log" >"$WORK/stressed.out" &
    P=$!
    sleep 0.2
    made=0 failed=0
    while kill -0 "$P" 2>/dev/null && [[ $made -lt $ATTACH_STRESS ]]; do
        # The program may end during an attach: that is not a failure.
        "$BURSTYD" --pid "$P" --freq "$FREQ" --duration 0.5 -o "$WORK/attach" \
            >/dev/null 2>>"$WORK/attach.log" || { kill -0 "$P" 2>/dev/null && failed=$((failed + 1)); }
        made=$((made + 1))
    done
    wait "$P" || die "the stressed program failed"
    stressed=$( (diff "$WORK/untraced.log" "$WORK/stressed.log" || true) | grep -c '^[<>]' || true)
    echo "attach/detach stress: $made attaches ($failed failed) while the program ran; lines that differ from untraced: $stressed"
    if [[ $stressed -ne 0 ]]; then
        diff "$WORK/untraced.log" "$WORK/stressed.log" | head -20
        status=1
    fi
fi
exit "$status"
