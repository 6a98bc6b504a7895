#!/usr/bin/env python3
"""The overlap of two hot data stream profiles (Hirzel & Chilimbi,
equation 5): each profile's stream heats normalised to sum to 1, streams
matched by access signature (their instructions in order, each as module
file name + static address), overlap = the sum over streams in both of
the smaller normalised heat. 1.0: the same streams in the same
proportions; 0.0: no stream in common.

usage: stream_overlap.py A.json B.json   (burstyd hot-streams --json, or
a run's hot-streams.json)
"""
import json
import os
import sys


def heats(path):
    with open(path) as f:
        d = json.load(f)
    out = {}
    for s in d["streams"]:
        key = tuple((os.path.basename(x["module"]), x["address"]) for x in s["signature"])
        out[key] = out.get(key, 0.0) + s["heat"]
    total = sum(out.values())
    return {k: v / total for k, v in out.items()} if total > 0 else {}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip())
    a, b = heats(sys.argv[1]), heats(sys.argv[2])
    print(f"{sum(min(v, b[k]) for k, v in a.items() if k in b):.3f}")


if __name__ == "__main__":
    main()
