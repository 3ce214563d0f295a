#!/bin/sh
# Run openvia's C conformance programs and print a summary.
#
#   run.sh BINDIR TEST...
#
# Every program runs under `timeout` with a VIA_AGENT_SOCKET unique to this
# run, so concurrent runs talk to different host agents.  The library starts
# that agent on demand from $STAGE/bin/viad (the staged install); the run
# stops it at the end.
#
# Environment: STAGE, VT_TIMEOUT (seconds, default 120), VT_WRAPPER (a
# command to run each program under, e.g. valgrind), VT_QUICK (smaller
# sizes, passed through to the programs).
set -u

bindir=$1
shift

timeout_s=${VT_TIMEOUT:-120}
wrapper=${VT_WRAPPER:-}
logdir=$bindir/logs
mkdir -p "$logdir"

viad=viad
if [ -n "${STAGE:-}" ]; then
    viad=$STAGE/bin/viad
    VIA_VIAD=$viad
    export VIA_VIAD
fi

VIA_AGENT_SOCKET=openvia-test-$$-$(date +%s%N)
export VIA_AGENT_SOCKET
echo "VIA_AGENT_SOCKET=$VIA_AGENT_SOCKET"
# The agent of this run leaves when the run ends.
trap '"$viad" --stop --socket "$VIA_AGENT_SOCKET" >/dev/null 2>&1 || true' EXIT

passed=0
failed=0
failures=

for t in "$@"; do
    log=$logdir/$t.log
    start=$(date +%s%N)
    # shellcheck disable=SC2086
    timeout -k 5 "$timeout_s" $wrapper "$bindir/$t" >"$log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        printf 'PASS %-12s %6d ms\n' "$t" "$ms"
    else
        failed=$((failed + 1))
        failures="$failures $t"
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            why="timed out after ${timeout_s} s"
        else
            why="exit status $rc"
        fi
        printf 'FAIL %-12s %6d ms (%s)\n' "$t" "$ms" "$why"
        echo "---- $log (last 40 lines)"
        tail -n 40 "$log"
        echo "----"
    fi
done

echo
if [ $failed -ne 0 ]; then
    echo "failed:$failures"
fi
echo "c-tests: $passed passed, $failed failed"
[ $failed -eq 0 ]
