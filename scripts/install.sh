#!/usr/bin/env bash
# Installs burstyd as a systemd service:
#   /usr/local/bin/burstyd                 the binary (built here if needed)
#   /etc/systemd/system/burstyd.service    the unit
#   /etc/burstyd/burstyd.toml              the default configuration, only if absent
# then runs `systemctl daemon-reload` when systemd is running. It does not
# enable or start the service; it prints the commands that do.
#
#   sudo bash scripts/install.sh              # build (release) and install
#   sudo bash scripts/install.sh --no-build   # install target/release/burstyd as is
#   DESTDIR=/tmp/root bash scripts/install.sh # stage into a root directory
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
for a in "$@"; do
    case "$a" in
        --no-build) build=0 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $a" >&2; exit 2 ;;
    esac
done
root="${DESTDIR:-}"
if [[ -z "$root" && $(id -u) -ne 0 ]]; then
    echo "install.sh: run as root (or set DESTDIR to stage the files)" >&2
    exit 1
fi

bin=target/release/burstyd
if [[ $build == 1 ]]; then
    bash scripts/setup.sh
    cargo build --release -p burstyd
fi
[[ -x $bin ]] || { echo "install.sh: $bin is missing: build it (cargo build --release -p burstyd)" >&2; exit 1; }

install -D -m 0755 "$bin" "$root/usr/local/bin/burstyd"
echo "installed $root/usr/local/bin/burstyd"
install -D -m 0644 systemd/burstyd.service "$root/etc/systemd/system/burstyd.service"
echo "installed $root/etc/systemd/system/burstyd.service"
if [[ -e "$root/etc/burstyd/burstyd.toml" ]]; then
    echo "kept the existing $root/etc/burstyd/burstyd.toml (the default is systemd/burstyd.toml)"
else
    install -D -m 0644 systemd/burstyd.toml "$root/etc/burstyd/burstyd.toml"
    echo "installed $root/etc/burstyd/burstyd.toml"
fi

if [[ -z "$root" && -d /run/systemd/system ]]; then
    systemctl daemon-reload
    echo "ran systemctl daemon-reload"
    echo "start it with:  systemctl enable --now burstyd"
    echo "after editing /etc/burstyd/burstyd.toml:  systemctl reload burstyd"
else
    echo "systemd is not running here: no daemon-reload; on a systemd host run"
    echo "  systemctl daemon-reload && systemctl enable --now burstyd"
fi
