#!/bin/sh
# Installs what building and testing openvia needs beyond the Rust and C
# toolchains: pkg-config (to build programs against the installed vipl.pc),
# valgrind (for the memory-checked test run), g++ (the C++ programs of
# tests/cxx) and nft (the cluster's frame-loss case drops frames with it).
# Idempotent.
set -eu
missing=""
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
command -v valgrind >/dev/null 2>&1 || missing="$missing valgrind"
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust) is required" >&2; exit 1; }
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v "${CXX:-g++}" >/dev/null 2>&1 || missing="$missing g++"
command -v nft >/dev/null 2>&1 || missing="$missing nftables"
if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
