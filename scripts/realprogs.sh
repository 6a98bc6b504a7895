#!/usr/bin/env bash
# Fetch and build real programs (bzip2, xz) from their upstream sources, with
# `-O2 -g` (gcc's default -fomit-frame-pointer at -O2: no frame pointers, on
# purpose -- the profiler must unwind them with DWARF CFI).
#
# Sources: the upstream release tarballs as Debian ships them ("orig"
# tarballs), fetched with `apt-get source --download-only` from the Debian
# archive (needs a deb-src entry; added below if missing) and checked against
# pinned SHA-256 sums. Debian's own patches are not applied.
#
# Output: target/realprogs/bin/{bzip2,xz}. Idempotent: a second run with the
# binaries present and the same pins does nothing.
#
# Usage: bash scripts/realprogs.sh          (as root, non-interactive)
set -euo pipefail
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

CFLAGS_REAL="-O2 -g"
STAMP_WANT="bzip2=$BZIP2_VER:$BZIP2_SHA xz=$XZ_VER:$XZ_SHA cflags=$CFLAGS_REAL"

die() { echo "realprogs.sh: error: $*" >&2; exit 1; }
log() { echo "realprogs.sh: $*" >&2; }

if [[ -x "$BIN/bzip2" && -x "$BIN/xz" && -f "$OUT/stamp" && "$(cat "$OUT/stamp")" == "$STAMP_WANT" ]]; then
    log "up to date: $BIN/bzip2 ($BZIP2_VER), $BIN/xz ($XZ_VER)"
    exit 0
fi

for tool in gcc make tar sha256sum; do
    command -v "$tool" >/dev/null || die "'$tool' not found (apt-get install -y build-essential)"
done
command -v xz >/dev/null || die "'xz' not found to unpack the xz tarball (apt-get install -y xz-utils)"

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
    (cd "$tmp" && apt-get source --download-only -qq -o APT::Sandbox::User=root "$pkg" </dev/null) \
        || die "apt-get source --download-only $pkg failed"
    [[ -f "$tmp/$tar" ]] || die "source package $pkg has no $tar (version pin out of date?): $(ls "$tmp")"
    mv "$tmp/$tar" "$DL/$tar"
    rm -rf "$tmp"
    have_tarball "$tar" "$sha" || die "sha256 mismatch for $tar (want $sha)"
    log "verified sha256 of $tar"
}

fetch_sources bzip2 "$BZIP2_TAR" "$BZIP2_SHA"
fetch_sources xz-utils "$XZ_TAR" "$XZ_SHA"

JOBS="$(nproc 2>/dev/null || echo 2)"

# --- bzip2 ------------------------------------------------------------------
log "building bzip2 $BZIP2_VER with CFLAGS='$CFLAGS_REAL'"
rm -rf "$SRC/bzip2-$BZIP2_VER"
tar -C "$SRC" -xzf "$DL/$BZIP2_TAR"
[[ -f "$SRC/bzip2-$BZIP2_VER/bzip2.c" ]] || die "bzip2.c missing from $BZIP2_TAR"
make -C "$SRC/bzip2-$BZIP2_VER" -j"$JOBS" bzip2 \
    CFLAGS="-Wall $CFLAGS_REAL -D_FILE_OFFSET_BITS=64" >"$SRC/bzip2-build.log" 2>&1 \
    || { tail -30 "$SRC/bzip2-build.log" >&2; die "bzip2 build failed (log: $SRC/bzip2-build.log)"; }
install -m 0755 "$SRC/bzip2-$BZIP2_VER/bzip2" "$BIN/bzip2"

# --- xz ---------------------------------------------------------------------
log "building xz $XZ_VER (static liblzma) with CFLAGS='$CFLAGS_REAL'"
rm -rf "$SRC/xz-$XZ_VER"
tar -C "$SRC" -xJf "$DL/$XZ_TAR"
[[ -x "$SRC/xz-$XZ_VER/configure" ]] || die "configure missing from $XZ_TAR"
(
    cd "$SRC/xz-$XZ_VER"
    ./configure CFLAGS="$CFLAGS_REAL" --disable-shared --enable-static \
        --disable-nls --disable-doc --disable-scripts --disable-lzmadec \
        --disable-lzmainfo --disable-xzdec
    make -j"$JOBS"
) >"$SRC/xz-build.log" 2>&1 \
    || { tail -30 "$SRC/xz-build.log" >&2; die "xz build failed (log: $SRC/xz-build.log)"; }
install -m 0755 "$SRC/xz-$XZ_VER/src/xz/xz" "$BIN/xz"

"$BIN/bzip2" --help 2>&1 | head -1 | grep -q "$BZIP2_VER" || die "built bzip2 does not run"
"$BIN/xz" --version | grep -q "$XZ_VER" || die "built xz does not run"
echo "$STAMP_WANT" >"$OUT/stamp"
log "built $BIN/bzip2 ($BZIP2_VER) and $BIN/xz ($XZ_VER)"
