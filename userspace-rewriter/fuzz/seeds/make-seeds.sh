#!/bin/sh
# Rebuilds the fuzz seed corpus (fuzz/corpus/analyze/seed-*) from tiny.c:
# small libc-less ELF files, so that each run of the analyser is fast.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../corpus/analyze"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small="-nostdlib -Wl,--build-id -Wl,-z,norelro -Wl,-z,noseparate-code -Wl,-z,max-page-size=0x1000"
# Static non-PIE, -O2, with .symtab and .eh_frame.
gcc -O2 -fno-pie -no-pie -static $small -o "$tmp/o2" "$here/tiny.c"
# The same, stripped: functions come from .eh_frame only.
strip -o "$tmp/o2-stripped" "$tmp/o2"
# -O0 static PIE (RIP-relative code, PIC jump table).
gcc -O0 -fpie -static-pie $small -o "$tmp/o0-pie" "$here/tiny.c"
# -O2 -fcf-protection=full (endbr64, notrack jmp).
gcc -O2 -fcf-protection=full -fno-pie -no-pie -static $small -o "$tmp/o2-cet" "$here/tiny.c"
# A shared library (.dynsym, dynamic relocations).
gcc -O2 -fPIC -shared $small -o "$tmp/lib.so" "$here/tiny.c"
# A dynamically linked PIE with crt code and PLT stubs (the path fixture).
gcc -O2 -fpie -pie -Wl,--build-id -o "$tmp/paths-pie" "$here/../../tests/fixtures/paths.c"
for f in o2 o2-stripped o0-pie o2-cet lib.so paths-pie; do
    cp "$tmp/$f" "$out/seed-$f"
done
ls -l "$out"/seed-*
