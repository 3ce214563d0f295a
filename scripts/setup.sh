#!/bin/sh
# Installs what building and testing openvia needs beyond the Rust and C
# toolchains: pkg-config (to build programs against the installed vipl.pc),
# valgrind (for the memory-checked test run), g++ (the C++ programs of
# tests/cxx), nft (the cluster's frame-loss case drops frames with it),
# matplotlib (reproduce/run's plots) and crc32c (the CRC-32C of the
# cluster's inject.py), from the distribution with apt-get.
# Idempotent, and silent when everything is there.
set -eu
missing=""
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
command -v valgrind >/dev/null 2>&1 || missing="$missing valgrind"
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust) is required" >&2; exit 1; }
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v "${CXX:-g++}" >/dev/null 2>&1 || missing="$missing g++"
command -v nft >/dev/null 2>&1 || missing="$missing nftables"
# reproduce/run uses python3 from PATH, or the distribution's
# /usr/bin/python3, whichever imports matplotlib.
python3 -c 'import matplotlib' >/dev/null 2>&1 \
    || { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1; } \
    || missing="$missing python3-matplotlib"
# tests/cluster/run.sh runs inject.py the same way, with crc32c.
python3 -c 'import crc32c' >/dev/null 2>&1 \
    || { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import crc32c' >/dev/null 2>&1; } \
    || missing="$missing python3-crc32c"
if [ -n "$missing" ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "setup: no apt-get here; install these with the system's package manager:$missing" >&2
        case $missing in *python3-matplotlib*)
            echo "setup: (matplotlib may come from pip instead: python3 -m pip install matplotlib)" >&2 ;;
        esac
        case $missing in *python3-crc32c*)
            echo "setup: (crc32c may come from pip instead: python3 -m pip install crc32c)" >&2 ;;
        esac
        exit 1
    fi
    echo "setup: installing$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
