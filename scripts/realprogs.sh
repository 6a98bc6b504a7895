#!/usr/bin/env bash
# Fetch and build real programs from their upstream sources, with `-O2 -g`
# (gcc's default -fomit-frame-pointer at -O2: no frame pointers, on purpose --
# the profiler must unwind them with DWARF CFI):
#   bzip2 1.0.8, xz 5.4.1 (static liblzma), gzip 1.12, zstd 1.5.4 (CLI on its
#   own static lib, built with threads: even `-T1` runs a worker and two async
#   I/O threads; `--single-thread --no-asyncio` runs in one thread) -- all C --
#   and lzip 1.23, the C++ one; and two interpreters: Lua 5.4.4, whose loop
#   dispatches with computed gotos (PIE), and gawk 5.2.1, whose loop is a
#   switch over a jump table (non-PIE).
# With --bench, also xerces-c 3.2.4's DOMPrint sample: a 7,500-function C++
# program (the static Xerces-C++ XML parser) that throws and catches an
# exception in normal operation -- one per entity reference in character
# data (ReaderMgr's EndOfEntityException) -- for bench/bursts.sh only (its
# build adds a minute; the tests do not need it).
# All are linked with `-Wl,--emit-relocs`: the relocations stay in the
# executable (.rela.text etc.), which llvm-bolt needs to rewrite (optimize) it.
#
# Sources: the upstream release tarballs as Debian ships them ("orig"
# tarballs), fetched with `apt-get source --download-only` from the Debian
# archive (needs a deb-src entry; added below if missing) and checked against
# pinned SHA-256 sums. Debian's own patches are not applied.
#
# Output: target/realprogs/bin/{bzip2,xz,gzip,zstd,lzip,lua,gawk}, with --bench
# also DOMPrint (build logs:
# target/realprogs/src/*-build.log). Idempotent: a second run with the
# binaries present and the same pins and flags does nothing.
#
# Usage: bash scripts/realprogs.sh [--bench]     (as root, non-interactive)
set -euo pipefail
BENCH=0
case "${1:-}" in
    "") ;;
    --bench) BENCH=1 ;;
    *) echo "usage: bash scripts/realprogs.sh [--bench]" >&2; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/realprogs"
BIN="$OUT/bin"
SRC="$OUT/src"
DL="$OUT/download"

# Pinned upstream versions (tarball name as in the Debian archive, sha256).
BZIP2_VER=1.0.8
BZIP2_TAR=bzip2_1.0.8.orig.tar.gz
BZIP2_SHA=ab5a03176ee106d3f0fa90e381da478ddae405918153cca248e682cd0c4a2269
XZ_VER=5.4.1
XZ_TAR=xz-utils_5.4.1.orig.tar.xz
XZ_SHA=5d9827aa1875b21c288f78864bb26d2650b436ea8d2cad364e4921eb6266a5a5
GZIP_VER=1.12
GZIP_TAR=gzip_1.12.orig.tar.xz
GZIP_SHA=ce5e03e519f637e1f814011ace35c4f87b33c0bbabeec35baf5fbd3479e91956
# Debian's source package is "libzstd"; its orig tarball is repacked (+dfsg2:
# Windows/CI build files removed, nothing the CLI uses) and unpacks to
# zstd-1.5.4/.
ZSTD_VER=1.5.4
ZSTD_TAR=libzstd_1.5.4+dfsg2.orig.tar.xz
ZSTD_SHA=8cf4bbb65e77ec348d052c8d6230eba66d435bddf64c8b5be2fcb16880c19953
LZIP_VER=1.23
LZIP_TAR=lzip_1.23.orig.tar.xz
LZIP_SHA=d269d8e204579cb7047d6187bce741acb484a27e24cf24f20cf017c48574147c

LUA_VER=5.4.4
LUA_TAR=lua5.4_5.4.4.orig.tar.gz
LUA_SHA=164c7849653b80ae67bec4b7473b884bf5cc8d2dca05653475ec2ed27b9ebf61
GAWK_VER=5.2.1
GAWK_TAR=gawk_5.2.1.orig.tar.xz
GAWK_SHA=2337a0283b180ec1b9c727973a34781c6478b3ae9bcbdcca0a4dc49861d75a65
# Bench only (--bench). Debian repacks it (+debian: no bundled third-party
# files); it unpacks to xerces-c-3.2.4/.
XERCES_VER=3.2.4
XERCES_TAR=xerces-c_3.2.4+debian.orig.tar.xz
XERCES_SHA=cf5b5d5fda86061a49bd5f58ef778aa9d7caba30c6b152a5d57c5ff545f50f2c

CFLAGS_REAL="-O2 -g"      # also CXXFLAGS for lzip
LDFLAGS_REAL="-Wl,--emit-relocs"
PROGS=(bzip2 xz gzip zstd lzip lua gawk)
STAMP_WANT="bzip2=$BZIP2_VER:$BZIP2_SHA xz=$XZ_VER:$XZ_SHA gzip=$GZIP_VER:$GZIP_SHA"
STAMP_WANT+=" zstd=$ZSTD_VER:$ZSTD_SHA lzip=$LZIP_VER:$LZIP_SHA lua=$LUA_VER:$LUA_SHA gawk=$GAWK_VER:$GAWK_SHA"
STAMP_WANT+=" cflags=$CFLAGS_REAL ldflags=$LDFLAGS_REAL"
BUILT_MSG="$BIN/{bzip2 $BZIP2_VER, xz $XZ_VER, gzip $GZIP_VER, zstd $ZSTD_VER, lzip $LZIP_VER, lua $LUA_VER, gawk $GAWK_VER}"
BENCH_STAMP_WANT="xerces=$XERCES_VER:$XERCES_SHA cflags=$CFLAGS_REAL ldflags=$LDFLAGS_REAL"

die() { echo "realprogs.sh: error: $*" >&2; exit 1; }
log() { echo "realprogs.sh: $*" >&2; }

up_to_date() {
    local p
    for p in "${PROGS[@]}"; do
        [[ -x "$BIN/$p" ]] || return 1
    done
    [[ -f "$OUT/stamp" && "$(cat "$OUT/stamp")" == "$STAMP_WANT" ]]
}
bench_up_to_date() {
    [[ -x "$BIN/DOMPrint" && -f "$OUT/stamp-bench" && "$(cat "$OUT/stamp-bench")" == "$BENCH_STAMP_WANT" ]]
}

for tool in gcc g++ make tar sha256sum readelf; do
    command -v "$tool" >/dev/null || die "'$tool' not found (apt-get install -y build-essential)"
done
command -v xz >/dev/null || die "'xz' not found to unpack the .tar.xz tarballs (apt-get install -y xz-utils)"

mkdir -p "$BIN" "$SRC" "$DL"

have_tarball() { # name sha
    [[ -f "$DL/$1" ]] && echo "$2  $DL/$1" | sha256sum -c --status
}

fetch_sources() { # debian-source-package tarball sha
    local pkg="$1" tar="$2" sha="$3"
    if have_tarball "$tar" "$sha"; then
        log "cached: $tar"
        return
    fi
    command -v apt-get >/dev/null || die "apt-get not found: this script needs Debian's archive for sources"
    if [[ -z "$(apt-cache showsrc "$pkg" 2>/dev/null | head -1)" ]]; then
        local srcfile=/etc/apt/sources.list.d/burstyd-src.sources
        if [[ ! -f "$srcfile" ]]; then
            local base=/etc/apt/sources.list.d/debian.sources
            [[ -f "$base" ]] || die "no deb-src entry for '$pkg' and no $base to derive one from"
            [[ $(id -u) -eq 0 ]] || die "adding a deb-src entry needs root"
            log "installing $srcfile (deb-src twin of $base)"
            sed -e 's/^Types:.*/Types: deb-src/' "$base" >"$srcfile"
        fi
        log "apt-get update (for deb-src indexes)"
        apt-get update -qq || die "apt-get update failed"
        [[ -n "$(apt-cache showsrc "$pkg" 2>/dev/null | head -1)" ]] \
            || die "apt-cache showsrc $pkg finds nothing even after adding deb-src"
    fi
    log "downloading Debian source package '$pkg' (only $tar is used)"
    local tmp
    tmp="$(mktemp -d "$DL/apt.XXXXXX")"
    # apt checks each file's hash against the signed Sources index.
    # The newest source version first; then the older ones the indexes
    # list (a security update's source can be missing from the mirror
    # while its orig tarball, the one we use, is that of the release).
    local got="" v
    for v in "" $(apt-cache showsrc "$pkg" 2>/dev/null | awk '/^Version:/ { print $2 }'); do
        if (cd "$tmp" && apt-get source --download-only -qq -o APT::Sandbox::User=root "$pkg${v:+=$v}" </dev/null) \
            && [[ -f "$tmp/$tar" ]]; then
            got=1
            break
        fi
        log "apt-get source $pkg${v:+=$v} failed or has no $tar; trying an older version"
    done
    [[ -n "$got" ]] || die "apt-get source --download-only $pkg failed (every version the indexes list)"
    [[ -f "$tmp/$tar" ]] || die "source package $pkg has no $tar (version pin out of date?): $(ls "$tmp")"
    mv "$tmp/$tar" "$DL/$tar"
    rm -rf "$tmp"
    have_tarball "$tar" "$sha" || die "sha256 mismatch for $tar (want $sha)"
    log "verified sha256 of $tar"
}

# Unpacks a downloaded tarball afresh into $SRC and prints the directory it
# made: the tarball's single top-level directory, whatever it is called (the
# Debian orig tarball name does not always say, e.g. libzstd_*+dfsg2 -> zstd-*).
unpack() { # tarball
    local top
    top="$(tar -tf "$DL/$1" | sed -n '1{s,^\./,,;s,/.*,,;p}')" \
        || die "cannot list $1"
    [[ -n "$top" && "$top" != . && "$top" != .. ]] || die "$1 has no top-level directory"
    rm -rf "${SRC:?}/$top"
    tar -C "$SRC" -xf "$DL/$1" || die "cannot unpack $1"
    [[ -d "$SRC/$top" ]] || die "$1 did not unpack to $top/"
    echo "$SRC/$top"
}

# Runs a build step (a command or function) with its output in
# $SRC/NAME-build.log; on failure shows the log's tail and stops. (set -e does
# not apply inside it: chain a function's steps with &&.)
build_logged() { # name function args...
    local name="$1"
    shift
    "$@" >"$SRC/$name-build.log" 2>&1 \
        || { tail -30 "$SRC/$name-build.log" >&2; die "$name build failed (log: $SRC/$name-build.log)"; }
}

# --- xerces-c (C++, --bench only) ---------------------------------------------
# The library static (no libxerces-c.so), no network access (no libcurl), the
# iconv transcoder of glibc (no ICU), messages compiled in; then its DOMPrint
# sample linked against it.
build_bench() {
    if bench_up_to_date; then
        log "up to date: $BIN/DOMPrint (xerces-c $XERCES_VER)"
        return
    fi
    rm -f "$OUT/stamp-bench"
    fetch_sources xerces-c "$XERCES_TAR" "$XERCES_SHA"
    log "building xerces-c $XERCES_VER (C++, static) and its DOMPrint sample with CXXFLAGS='$CFLAGS_REAL' LDFLAGS='$LDFLAGS_REAL' (about a minute)"
    D="$(unpack "$XERCES_TAR")"
    [[ -f "$D/samples/src/DOMPrint/DOMPrint.cpp" ]] || die "DOMPrint.cpp missing from $XERCES_TAR"
    build_xerces() {
        cd "$D" &&
            ./configure -q CFLAGS="$CFLAGS_REAL" CXXFLAGS="$CFLAGS_REAL" LDFLAGS="$LDFLAGS_REAL" \
                --disable-shared --enable-static --disable-network \
                --enable-transcoder-iconv --enable-msgloader-inmemory &&
            make -j"$JOBS" -C src &&
            make -j"$JOBS" -C samples DOMPrint
    }
    (build_logged xerces build_xerces)
    install -m 0755 "$D/samples/DOMPrint" "$BIN/DOMPrint"
    { "$BIN/DOMPrint" 2>&1 || true; } | grep "DOMPrint \[options\]" >/dev/null || die "built DOMPrint does not run"
    readelf -S "$BIN/DOMPrint" | grep '\.rela\.text' >/dev/null \
        || die "$BIN/DOMPrint has no .rela.text: not linked with $LDFLAGS_REAL?"
    echo "$BENCH_STAMP_WANT" >"$OUT/stamp-bench"
    log "built $BIN/DOMPrint (xerces-c $XERCES_VER)"
}

JOBS="$(nproc 2>/dev/null || echo 2)"
if up_to_date; then
    log "up to date: $BUILT_MSG"
    if ((BENCH)); then build_bench; fi
    exit 0
fi
rm -f "$OUT/stamp"

fetch_sources bzip2 "$BZIP2_TAR" "$BZIP2_SHA"
fetch_sources xz-utils "$XZ_TAR" "$XZ_SHA"
fetch_sources gzip "$GZIP_TAR" "$GZIP_SHA"
fetch_sources libzstd "$ZSTD_TAR" "$ZSTD_SHA"
fetch_sources lzip "$LZIP_TAR" "$LZIP_SHA"
fetch_sources lua5.4 "$LUA_TAR" "$LUA_SHA"
fetch_sources gawk "$GAWK_TAR" "$GAWK_SHA"

# --- bzip2 ------------------------------------------------------------------
log "building bzip2 $BZIP2_VER with CFLAGS='$CFLAGS_REAL' LDFLAGS='$LDFLAGS_REAL'"
D="$(unpack "$BZIP2_TAR")"
[[ -f "$D/bzip2.c" ]] || die "bzip2.c missing from $BZIP2_TAR"
# Plain Makefile: its link line is `$(CC) $(CFLAGS) $(LDFLAGS) -o bzip2 ...`.
build_logged bzip2 make -C "$D" -j"$JOBS" bzip2 \
    CFLAGS="-Wall $CFLAGS_REAL -D_FILE_OFFSET_BITS=64" LDFLAGS="$LDFLAGS_REAL"
install -m 0755 "$D/bzip2" "$BIN/bzip2"

# --- xz ---------------------------------------------------------------------
log "building xz $XZ_VER (static liblzma) with CFLAGS='$CFLAGS_REAL' LDFLAGS='$LDFLAGS_REAL'"
D="$(unpack "$XZ_TAR")"
[[ -x "$D/configure" ]] || die "configure missing from $XZ_TAR"
build_xz() {
    cd "$D" &&
        ./configure CFLAGS="$CFLAGS_REAL" LDFLAGS="$LDFLAGS_REAL" --disable-shared --enable-static \
            --disable-nls --disable-doc --disable-scripts --disable-lzmadec \
            --disable-lzmainfo --disable-xzdec &&
        make -j"$JOBS"
}
(build_logged xz build_xz)
install -m 0755 "$D/src/xz/xz" "$BIN/xz"

# --- gzip -------------------------------------------------------------------
log "building gzip $GZIP_VER with CFLAGS='$CFLAGS_REAL' LDFLAGS='$LDFLAGS_REAL'"
D="$(unpack "$GZIP_TAR")"
[[ -x "$D/configure" ]] || die "configure missing from $GZIP_TAR"
build_gzip() {
    cd "$D" &&
        ./configure CFLAGS="$CFLAGS_REAL" LDFLAGS="$LDFLAGS_REAL" --disable-nls &&
        make -j"$JOBS"
}
(build_logged gzip build_gzip)
install -m 0755 "$D/gzip" "$BIN/gzip"

# --- zstd -------------------------------------------------------------------
# The CLI with the library sources compiled in (no libzstd.so). CFLAGS and
# LDFLAGS go in through the environment, not the make command line: the
# Makefiles then use them instead of their default -O3 and still append their
# own flags (warnings, -Wa,--noexecstack, -pthread). zlib/lzma/lz4 support is
# off so the binary does not depend on what -dev packages happen to be
# installed. V=1 puts the compile commands in the log. Upstream's x86-64
# assembly (huf_decompress_amd64.S) is kept; it has no CFI (its two Huffman
# decoding loops, used only when decompressing, have no .eh_frame entry).
log "building zstd $ZSTD_VER (CLI, static lib) with CFLAGS='$CFLAGS_REAL' LDFLAGS='$LDFLAGS_REAL'"
D="$(unpack "$ZSTD_TAR")"
[[ -f "$D/programs/zstdcli.c" ]] || die "programs/zstdcli.c missing from $ZSTD_TAR"
build_logged zstd env CFLAGS="$CFLAGS_REAL" LDFLAGS="$LDFLAGS_REAL" \
    make -C "$D/programs" -j"$JOBS" zstd-release HAVE_ZLIB=0 HAVE_LZMA=0 HAVE_LZ4=0 \
    V=1
install -m 0755 "$D/programs/zstd" "$BIN/zstd"

# --- lzip (C++) -------------------------------------------------------------
log "building lzip $LZIP_VER (C++) with CXXFLAGS='$CFLAGS_REAL' LDFLAGS='$LDFLAGS_REAL'"
D="$(unpack "$LZIP_TAR")"
[[ -x "$D/configure" ]] || die "configure missing from $LZIP_TAR"
build_lzip() {
    cd "$D" &&
        ./configure CXX=g++ CXXFLAGS="$CFLAGS_REAL" LDFLAGS="$LDFLAGS_REAL" &&
        make -j"$JOBS"
}
(build_logged lzip build_lzip)
install -m 0755 "$D/lzip" "$BIN/lzip"

# --- Lua (interpreter, computed-goto dispatch) --------------------------------
log "building lua $LUA_VER with MYCFLAGS='-g' (its own -O2) MYLDFLAGS='$LDFLAGS_REAL'"
D="$(unpack "$LUA_TAR")"
[[ -f "$D/src/lvm.c" ]] || die "src/lvm.c missing from $LUA_TAR"
# `posix`: no readline, no dlopen. Its Makefile compiles with -O2.
build_logged lua make -C "$D/src" -j"$JOBS" posix MYCFLAGS="-g" MYLDFLAGS="$LDFLAGS_REAL"
install -m 0755 "$D/src/lua" "$BIN/lua"

# --- gawk (interpreter, switch dispatch) -------------------------------------
log "building gawk $GAWK_VER with CFLAGS='$CFLAGS_REAL' LDFLAGS='$LDFLAGS_REAL'"
D="$(unpack "$GAWK_TAR")"
[[ -f "$D/interpret.h" ]] || die "interpret.h missing from $GAWK_TAR"
build_gawk() {
    cd "$D" &&
        ./configure -q CFLAGS="$CFLAGS_REAL" LDFLAGS="$LDFLAGS_REAL" \
            --disable-nls --disable-mpfr --without-readline &&
        make -j"$JOBS" -C support &&
        make -j"$JOBS" gawk
}
(build_logged gawk build_gawk)
install -m 0755 "$D/gawk" "$BIN/gawk"

# (grep >/dev/null, not grep -q: an early exit could SIGPIPE the writer, which
# pipefail would count as a failure.)
"$BIN/bzip2" --help 2>&1 | grep "$BZIP2_VER" >/dev/null || die "built bzip2 does not run"
"$BIN/xz" --version | grep "$XZ_VER" >/dev/null || die "built xz does not run"
"$BIN/gzip" --version | grep "^gzip $GZIP_VER" >/dev/null || die "built gzip does not run"
"$BIN/zstd" --version | grep "v$ZSTD_VER" >/dev/null || die "built zstd does not run"
"$BIN/lzip" --version | grep "^lzip $LZIP_VER" >/dev/null || die "built lzip does not run"
"$BIN/lua" -v | grep "^Lua $LUA_VER" >/dev/null || die "built lua does not run"
"$BIN/gawk" --version | grep "^GNU Awk $GAWK_VER" >/dev/null || die "built gawk does not run"
for p in "${PROGS[@]}"; do
    readelf -S "$BIN/$p" | grep '\.rela\.text' >/dev/null \
        || die "$BIN/$p has no .rela.text: not linked with $LDFLAGS_REAL?"
done
echo "$STAMP_WANT" >"$OUT/stamp"
log "built $BUILT_MSG"
if ((BENCH)); then build_bench; fi
