#!/bin/sh
# Installs the Debian packages hone builds and tests with. Safe to re-run:
# does nothing when everything is present. Needs root (or sudo) on a fresh machine.
set -e
pkgs="build-essential pkg-config libpcre2-dev libutf8proc-dev libjansson-dev libxxhash-dev libmicrohttpd-dev python3 python3-numpy nodejs npm curl"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "setup: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq $missing >/dev/null
