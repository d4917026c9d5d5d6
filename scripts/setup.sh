#!/bin/sh
# Installs the Debian packages hone builds and tests with. Safe to re-run:
# does nothing when everything is present. Needs root (or sudo) on a fresh machine.
set -e
pkgs="build-essential pkg-config libpcre2-dev libutf8proc-dev libjansson-dev libxxhash-dev libmicrohttpd-dev python3 python3-numpy curl"
# Node.js runs the SDK end-to-end tests; a machine that already has node and npm
# (from any source) keeps them, since Debian's packages would conflict with another install.
command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
# The ARM kernels are cross-built and tested under emulation (make arm-test)
case "$(uname -m)" in x86_64) pkgs="$pkgs gcc-aarch64-linux-gnu qemu-user" ;; esac
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    echo "setup: installing$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq $missing >/dev/null
fi
# The server's end-to-end tests drive `hone serve` with the official SDKs
# (npm packages pinned in tests/server/package-lock.json).
e2e="$(dirname "$0")/../tests/server"
if [ ! -d "$e2e/node_modules" ] && command -v npm >/dev/null 2>&1; then
    echo "setup: npm ci in tests/server" >&2
    (cd "$e2e" && npm ci --no-audit --no-fund --loglevel=error)
fi
