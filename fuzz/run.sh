#!/bin/sh
# Runs every fuzz target for SECONDS seconds (default 60); exits non-zero
# as soon as one finds a crash.  Needs the nightly toolchain and cargo-fuzz.
set -eu
secs=${1:-60}
cd "$(dirname "$0")"
for target in packet cm session frame control; do
    echo "== fuzz $target for ${secs}s"
    mkdir -p "corpus/$target"
    cargo +nightly fuzz run "$target" "corpus/$target" -- \
        -max_total_time="$secs" -timeout=10 -print_final_stats=1
done
echo "fuzz: all targets ran ${secs}s without a crash"
