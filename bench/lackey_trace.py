#!/usr/bin/env python3
"""Turns valgrind lackey's data reference trace into the plain-text trace
`burstyd hot-streams --from-trace` reads: one reference a line,
`<module path> <static vaddr hex> <data address hex>`.

Run the program as
    valgrind --tool=lackey --trace-mem=yes -v -v -v --log-file=LOG PROG ARGS
(the three -v make valgrind print, after each "Reading syms from PATH",
the text's static and load addresses, "svma 0x..., avma 0x...", from which
each module's load bias comes), then
    python3 bench/lackey_trace.py LOG > trace.txt

Each data reference (lackey's " L", " S" and " M" lines) is attributed to
the instruction before it ("I" lines), mapped to its module by the
module's loadable segments (readelf -lW). References into the main
thread's stack (valgrind puts it at 0x1ff0000000 and above) are left out,
as burstyd's bursts leave out references into the thread's own stack;
--stack keeps them. Instructions outside every module (valgrind's own
trampolines) are counted and left out. A summary goes to standard error.
"""
import re
import subprocess
import sys

STACK = 0x1FF0000000


def segments(path):
    """(lo, hi) static address ranges of the loadable segments."""
    out = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True).stdout
    segs = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            vaddr, memsz = int(f[2], 16), int(f[5], 16)
            segs.append((vaddr, vaddr + memsz))
    return segs


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    keep_stack = "--stack" in sys.argv
    if len(args) != 1:
        sys.exit("usage: lackey_trace.py [--stack] LACKEY_LOG > trace.txt")
    modules = []  # (avma lo, avma hi, bias, path)
    reading = None
    refs = skipped_stack = unmapped = 0
    last = None  # (path, static vaddr) of the current instruction
    hit = None  # the module of the last instruction
    out = sys.stdout
    syms = re.compile(r"^--\d+-- Reading syms from (\S+)")
    svma = re.compile(r"^--\d+--\s+svma 0x([0-9a-f]+), avma 0x([0-9a-f]+)")
    with open(args[0], errors="replace") as log:
        for line in log:
            c = line[0]
            if c == "I":
                addr = int(line[3:line.index(",")], 16)
                # Most instructions are in the module of the one before.
                if hit is not None and hit[0] <= addr < hit[1]:
                    last = (hit[3], addr - hit[2])
                    continue
                last = hit = None
                for m in modules:
                    if m[0] <= addr < m[1]:
                        hit = m
                        last = (m[3], addr - m[2])
                        break
                continue
            if c == " " and line[1] in "LSM":
                addr = int(line[3:line.index(",")], 16)
                if addr >= STACK and not keep_stack:
                    skipped_stack += 1
                    continue
                if last is None:
                    unmapped += 1
                    continue
                out.write(f"{last[0]} {last[1]:x} {addr:x}\n")
                refs += 1
                continue
            if c == "-":
                m = syms.match(line)
                if m:
                    reading = m.group(1)
                    continue
                m = svma.match(line)
                if m and reading:
                    bias = int(m.group(2), 16) - int(m.group(1), 16)
                    if not reading.startswith("/usr/libexec/valgrind/"):
                        for lo, hi in segments(reading):
                            modules.append((lo + bias, hi + bias, bias, reading))
                    reading = None
    print(
        f"lackey_trace: {refs} references; {skipped_stack} into the stack left out; "
        f"{unmapped} by instructions in no module",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
