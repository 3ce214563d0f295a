#!/bin/sh
# openvia's adversarial suite: each case pairs a victim (victim.c, a VIA
# program against the installed vipl.h) with a hostile peer (via-hostile)
# and, where the attack aims at a third process, a bystander, and asserts
# the invariant of docs/security.md that the attack tests.
#
#   run.sh VICTIM HOSTILE
#
# As root, the attacker and the bystander run as uid 65534 (setpriv), as a
# hostile local user would; otherwise as the caller.  The host agent of the
# run is started first, as the caller, on a socket name unique to the run.
# The CM port cases make two hosts of network namespaces (cm_squatter.sh).
# Environment: STAGE (the staged install, for viad).
set -u

victim=$1
hostile=$2
viad=${STAGE:+$STAGE/bin/}viad

VIA_AGENT_SOCKET=openvia-hostile-$$-$(date +%s%N)
export VIA_AGENT_SOCKET
"$viad" --daemon --socket "$VIA_AGENT_SOCKET" || { echo "hostile: cannot start $viad"; exit 1; }
work=$(mktemp -d)
chmod 1777 "$work"
trap '"$viad" --stop --socket "$VIA_AGENT_SOCKET" >/dev/null 2>&1; rm -rf "$work"' EXIT

if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
    as_other() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
    echo "hostile: the attacker runs as uid 65534"
else
    as_other() { "$@"; }
    echo "hostile: the attacker runs as $(id -un) (not root: no other user to be)"
fi

passed=0
failed=0
failures=

# result NAME STATUS...: the case passed if every status is 0.
result() {
    name=$1
    shift
    for st in "$@"; do
        if [ "$st" != 0 ]; then
            echo "FAIL $name (statuses: $*)"
            failed=$((failed + 1))
            failures="$failures $name"
            return
        fi
    done
    echo "PASS $name"
    passed=$((passed + 1))
}

# Waits until file $1 exists, up to 10 s.
await() {
    i=0
    while [ ! -e "$1" ] && [ $i -lt 200 ]; do
        sleep 0.05
        i=$((i + 1))
    done
}

# 1. A peer claims to be a bystander so that the victim's cross-memory
#    copy lands in the bystander: the kernel refuses the claim, the copy
#    targets the peer itself, the bystander's memory is unchanged.
addr=0x7e5500000000
disc=forge-pid-$$
as_other timeout 60 "$hostile" bystander "$work" $addr &
bystander=$!
await "$work/bystander.pid"
timeout 60 "$victim" send $disc 16384 &
v=$!
sleep 0.3
as_other timeout 60 "$hostile" forge-pid $disc "$work" $addr 16384
h=$?
wait $v
vs=$?
touch "$work/done"
wait $bystander
result confused-deputy $h $vs $?

# duel NAME "VICTIM ARGS" "HOSTILE ARGS": the victim in the background,
# then the attacker as the other user; the case passed if both exit 0.
duel() {
    timeout 60 "$victim" $2 &
    dv=$!
    sleep 0.3
    as_other timeout 60 "$hostile" $3
    dh=$?
    wait $dv
    result "$1" $dh $?
}

# 2. A peer tries to write the victim's registry table.
duel registry-table-read-only "table table-$$" "table-write table-$$"

# 3. A peer breaks the connection with a code not in the specification.
duel peer-error-code "break break-$$" "break-code break-$$"

# 4. A peer's RDMA writes through the ring, none checked by the peer: the
#    victim lands the allowed one, refuses the rest, breaks on a bad slot.
duel rdma-write-through-the-ring "rdma rdma-$$ $work" "rdma-write rdma-$$ $work"

# 5. A peer's RDMA read requests through the ring, none checked by the
#    peer: the victim answers the allowed one with its bytes, refuses the
#    rest without a byte, and breaks the connection over an answer to a
#    read it never received.
duel rdma-read-through-the-ring "rdma-read rdma-read-$$ $work" "rdma-read rdma-read-$$ $work"

# 6. A peer of another user forges, stalls and floods entries of the
#    victim's CQ in its lane, while an honest peer's messages go through
#    the same CQ: every one arrives, none waits, the hostile connection
#    (only it) breaks.
disc=cq-$$
timeout 60 "$victim" cq $disc "$work" 200 &
v=$!
sleep 0.3
as_other timeout 60 "$hostile" cq-lanes $disc "$work" &
h=$!
sleep 0.3
timeout 60 "$victim" sender $disc "$work" 200
s=$?
wait $h
hs=$?
wait $v
result cq-lanes $hs $s $?

# 7. A client that never completes its handshake does not keep a
#    listener (waiting with VIP_INFINITE) from the next, honest client.
disc=silent-$$
timeout 15 "$victim" listen $disc &
v=$!
sleep 0.3
as_other timeout 60 "$hostile" silent $disc 20 &
h=$!
sleep 0.5
timeout 30 "$victim" client $disc
c=$?
wait $v
vs=$?
kill $h 2>/dev/null
wait $h 2>/dev/null
result handshake-deadline $vs $c

# 8. A client asks for a 256 MiB connection segment: refused before the
#    listener maps anything, and the listener serves the next client.
disc=big-$$
timeout 30 "$victim" listen $disc &
v=$!
sleep 0.3
as_other timeout 60 "$hostile" big-segment $disc
h=$?
timeout 30 "$victim" client $disc
c=$?
wait $v
result segment-size $h $c $?

# 9. Another user poses as the host agent on the name a VIA program uses:
#    the program sends it nothing and uses an agent of its own user.
if [ "$(id -u)" = 0 ]; then
    name=openvia-impostor-$$
    as_other timeout 60 "$hostile" impostor $name "$work" 4 &
    h=$!
    await "$work/impostor.ready"
    VIA_AGENT_SOCKET=$name VIA_VIAD=$viad timeout 30 "$victim" open
    v=$?
    wait $h
    hs=$?
    echo "hostile: the impostor got $(cat "$work/impostor.got" 2>/dev/null)"
    "$viad" --stop --socket "$name.0" >/dev/null 2>&1
    result agent-impostor $v $hs
else
    echo "SKIP agent-impostor (needs root: another user to be)"
fi

# 10. Another user asks the agent to stop: refused, the agent serves on.
if [ "$(id -u)" = 0 ]; then
    as_other "$viad" --stop --socket "$VIA_AGENT_SOCKET" >/dev/null 2>&1
    s=$?
    # Still there: --stats starts no agent.
    "$viad" --stats --socket "$VIA_AGENT_SOCKET" >/dev/null 2>&1
    v=$?
    [ $s != 0 ] && s=0 || s=1
    result stop-by-another-user $s $v
else
    echo "SKIP stop-by-another-user (needs root: another user to be)"
fi

# 11. The CM port: a local user binds it first, or answers for the agent
#     from another port (two hosts in network namespaces: cm_squatter.sh).
sh "$(dirname "$0")/cm_squatter.sh" "$victim" "$hostile" >"$work/cm.log" 2>&1
cat "$work/cm.log"
for name in $(sed -n 's/^PASS \([^ ]*\).*/\1/p' "$work/cm.log"); do
    passed=$((passed + 1))
done
for name in $(sed -n 's/^FAIL \([^ ]*\).*/\1/p' "$work/cm.log"); do
    failed=$((failed + 1))
    failures="$failures $name"
done

echo "hostile: $passed passed, $failed failed"
[ $failed = 0 ] || { echo "failed:$failures"; exit 1; }
