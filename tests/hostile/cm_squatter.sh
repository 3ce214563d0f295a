#!/bin/sh
# openvia's adversarial suite, the CM port cases (docs/security.md, "The
# network side"): two hosts emulated by network namespaces joined by a veth
# pair (tests/cluster/cluster.sh), made and removed by this script.
#
#   cm_squatter.sh VICTIM HOSTILE
#
# cm-port-squatter: on host h2, a process of uid 65534 tries to bind the CM
#   port before h2's agent starts (the kernel must refuse: EACCES).  Both
#   agents run as root.  A real client on h1 asks for a listener on h2; while
#   its request waits, the uid-65534 process on h2 sends h1's agent forged
#   CM answers to that request (its id read from h1's agent log, as if seen
#   on the wire) and to guessed ids, from an unprivileged port: Accept naming
#   its own socket, Ack, NoMatch, Reject, and a Request.  Then the real
#   listener on h2 starts: the client must connect to it and both must
#   exchange verified data; h1's agent must have counted every forged
#   datagram as refused (cm_refused_source), taken none of them as a
#   request, and nothing may have reached the forger's socket.
# cm-port-not-root: a client of uid 65534 on h1 whose own agent (started on
#   demand, as uid 65534) cannot bind the privileged CM port: a connect
#   request to h2 fails at once with VIP_NOT_REACHABLE, and the library logs
#   why (VIA_LOG=warn) on stderr.
#
# Prints PASS, FAIL or SKIP per case; exits 0 when none failed (skipped
# included: without root or iproute2 both cases are skipped), else 1.
# Environment: STAGE (the staged install, for viad).
set -u

victim=$1
hostile=$2
viad=${STAGE:+$STAGE/bin/}viad
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/../cluster/cluster.sh
cm_port=60

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1; then
    echo "SKIP cm-port-squatter (needs root, iproute2 and setpriv)"
    echo "SKIP cm-port-not-root (needs root, iproute2 and setpriv)"
    exit 0
fi
case $viad in /*) ;; *) viad=$(command -v "$viad") ;; esac

# A run id of its own: namespaces ovc<id>-h1 and -h2.
OVC_RUN=$(( ($$ % 50000) + 100000 ))
export OVC_RUN
work=$(mktemp -d)
chmod 1777 "$work"
cleanup() {
    sh "$cluster" down >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
if ! sh "$cluster" up 2 >"$work/up.log" 2>&1; then
    cat "$work/up.log"
    echo "FAIL cm-port-squatter (cannot make the namespaces)"
    exit 1
fi
h1=$(sh "$cluster" addr 1)
h2=$(sh "$cluster" addr 2)
ns1=$(sh "$cluster" ns 1)
ns2=$(sh "$cluster" ns 2)
socket=openvia-cm-$$
VIA_DEVICE=/dev/via_eth0
export VIA_DEVICE

on() {
    ns=$1
    shift
    ip netns exec "$ns" env VIA_AGENT_SOCKET="$socket" VIA_VIAD="$viad" "$@"
}
# The hostile local user.
other="setpriv --reuid=65534 --regid=65534 --clear-groups --"
# counter NS NAME: a counter of the agent of namespace NS.
counter() {
    on "$1" "$viad" --stats --socket "$socket" | sed -n "s/^$2 //p"
}
# await_log FILE PATTERN: waits up to 10 s for PATTERN in FILE.
await_log() {
    i=0
    while ! grep -q "$2" "$1" 2>/dev/null && [ $i -lt 200 ]; do
        sleep 0.05
        i=$((i + 1))
    done
    grep -q "$2" "$1" 2>/dev/null
}

failed=0
fail() {
    echo "hostile: $*"
    ok=1
}

# ---- cm-port-squatter ---------------------------------------------------
ok=0
# 1. The squatter comes first.
on "$ns2" $other "$hostile" cm-bind $cm_port || fail "the squatter bound the CM port on h2"
# 2. The agents, as root.
on "$ns1" env VIA_LOG=info "$viad" --socket "$socket" --idle-timeout 0 2>"$work/agent1.log" &
on "$ns2" env VIA_LOG=info "$viad" --socket "$socket" --idle-timeout 0 2>"$work/agent2.log" &
await_log "$work/agent1.log" "CM socket bound" || fail "h1's agent did not bind the CM port"
await_log "$work/agent2.log" "CM socket bound" || fail "h2's agent did not bind the CM port"
# 3. The client on h1; its request waits at h2's agent for a listener.
disc=cm-squat-$$
on "$ns1" timeout 60 "$victim" remote-client "$h2" "$disc" 65536 >"$work/client.log" 2>&1 &
client=$!
await_log "$work/agent1.log" "forwarded" || fail "h1's agent never forwarded the request"
id=$(sed -n 's/.*forwarded.* id=\([0-9]*\).*/\1/p' "$work/agent1.log" | head -n 1)
echo "hostile: the client's request on h1 is ${id:-(unknown)}"
# 4. The squatter answers for h2's agent.
on "$ns2" $other timeout 30 "$hostile" cm-forge "$h1" $cm_port "${id:-0}" "$work" 2 ||
    fail "the forger got datagrams back"
# 5. The real listener.
on "$ns2" timeout 60 "$victim" remote-listen "$disc" 65536 >"$work/listener.log" 2>&1
ls=$?
wait $client
cs=$?
cat "$work/client.log" "$work/listener.log"
[ $ls = 0 ] || fail "the real listener failed ($ls)"
[ $cs = 0 ] || fail "the real client failed ($cs)"
forged=$(cat "$work/forged.count" 2>/dev/null)
refused=$(counter "$ns1" cm_refused_source)
received=$(counter "$ns1" cm_requests_received)
echo "hostile: h1's agent refused ${refused:-?} of ${forged:-?} forged datagrams; took ${received:-?} requests"
[ -n "$forged" ] && [ "$forged" -gt 0 ] && [ "${refused:-0}" = "$forged" ] ||
    fail "h1's agent did not refuse every forged datagram"
[ "${received:-x}" = 0 ] || fail "h1's agent took a forged request"
if [ $ok = 0 ]; then echo "PASS cm-port-squatter"; else
    echo "FAIL cm-port-squatter"
    echo "---- h1's agent"; tail -n 20 "$work/agent1.log"
    echo "---- h2's agent"; tail -n 20 "$work/agent2.log"
    failed=$((failed + 1))
fi

# ---- cm-port-not-root -----------------------------------------------------
ok=0
on "$ns1" env VIA_AGENT_SOCKET=openvia-cm-user-$$ VIA_VIAD_IDLE=2 VIA_LOG=warn $other timeout 30 "$victim" remote-unreachable "$h2" "$disc" >"$work/user.log" 2>&1 ||
    fail "the request did not fail at once with VIP_NOT_REACHABLE"
cat "$work/user.log"
grep "cannot bind CM port $cm_port" "$work/user.log" | grep -q "Permission denied" ||
    fail "the library did not say why other hosts are unreachable"
if [ $ok = 0 ]; then echo "PASS cm-port-not-root"; else
    echo "FAIL cm-port-not-root"
    failed=$((failed + 1))
fi

[ $failed = 0 ]
