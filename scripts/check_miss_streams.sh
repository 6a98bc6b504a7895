#!/usr/bin/env bash
# On a host with a hardware PMU: do bursts started by cache-miss overflows
# (--event cache-misses --record refs) find the streams that miss?
# Runs tests/fixtures/streams.c (a hot list walked often, cache-resident;
# random loads from an 8 MiB array between walks, which miss) under
# burstyd twice, started by cpu-clock and by cache-misses, and says which
# event each run used (summary.json) and what share of the traced
# references each run's hottest stream and the noise loads hold. With
# cache-miss starts, bursts begin at the misses: expect the noise's share
# of references to rise against the cpu-clock run. Without a PMU it says
# so (burstyd falls back to cpu-clock) and exits 0.
# usage: bash scripts/check_miss_streams.sh   (root; BURSTYD_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BURSTYD_BIN:-$ROOT/target/release/burstyd}"
[[ -x "$BIN" ]] || (cd "$ROOT" && cargo build --release -p burstyd >&2)
WORK="$(mktemp -d /tmp/burstyd-miss-streams.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -g -o "$WORK/streams" "$ROOT/tests/fixtures/streams.c"
for ev in cpu-clock cache-misses; do
    "$BIN" run --event "$ev" --record refs -o "$WORK/$ev" -- "$WORK/streams" 2000000 >/dev/null 2>"$WORK/$ev.log" \
        || { tail -3 "$WORK/$ev.log" >&2; exit 1; }
    python3 - "$WORK/$ev" "$ev" <<'PY'
import json, sys
out, asked = sys.argv[1], sys.argv[2]
used = json.load(open(f"{out}/summary.json"))["event"]
r = json.load(open(f"{out}/hot-streams.json"))
top = r["streams"][0] if r["streams"] else None
hot = sum(s["heat"] for s in r["streams"])
print(f"{asked}: sampled {used}; {r['references']} references traced; "
      f"hottest stream {top['heat'] * 100 if top else 0:.1f}% "
      f"({top['signature'][0].get('function') if top else '-'}); "
      f"outside every hot stream (the missing noise loads) {100 * (1 - hot):.1f}%")
if asked != used:
    print(f"  no PMU here: {asked} fell back to {used}; run this on a host with one")
PY
done
