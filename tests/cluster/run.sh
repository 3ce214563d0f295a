#!/bin/sh
# openvia's multi-host tests, on hosts emulated by network namespaces
# (tests/cluster/cluster.sh).
#
#   run.sh [CASE...]       run the named cases (default: all), in this order:
#
#   names            the name service: h2 from h1 and back, both directions
#   acceptance-1500  tests/c/acceptance.c between two hosts, MTU 1500
#   acceptance-9000  the same at MTU 9000
#   workload         tests/c/workload.c between two hosts: seeded random
#                    transfers on reliable VIs, every completion, byte and
#                    flush checked
#   break-loss       the workload again, every other BREAK dropped on the
#                    way: the end that broke says it again to the peer's
#                    retransmissions, and every check still holds
#   last-word        tests/cluster/lastword.c: a VI whose DISCONNECT was
#                    dropped connects again at once; the old peer hears the
#                    word again within half a second
#   ops-1500         tests/cluster/ops.c: every data operation, MTU 1500
#   ops-9000         the same at MTU 9000
#   deregistered     tests/cluster/gone.c: memory deregistered and unmapped
#                    under posted sends, receives and RDMA reads is neither
#                    read nor written; the descriptors complete as they must
#   alltoall         8 hosts on a bridge started in a shuffled order over
#                    3 s, a reliable VI between every pair
#   start-order      a launcher's two sides in every start order: servers
#                    0, 1, 3 and 7 s late, on hosts with and without an
#                    agent and on the client's own host; clients retrying
#                    on VIP_NO_MATCH with 1 s and 5 s timeouts; both
#                    connection models
#   requester-killed a request whose process is SIGKILLed while its
#                    request is held is never handed to a listener
#   two-agents       a second agent in one namespace cannot bind the CM
#                    port: its clients' requests for other hosts fail at
#                    once with the reason in their log and in viad --stats
#   cm-stats         `viad --stats` shows the connection managers at work
#   peer-killed      a transfer whose peer process is SIGKILLed
#   link-down        a transfer whose peer host loses its link
#   bad-input        garbage, truncated, oversized, wrong-key and replayed
#                    datagrams at a process in the middle of a transfer
#   gso-1500         4 MiB messages both ways, every byte checked, with UDP
#                    segmentation offload and receive coalescing (the
#                    default) and again with VIA_GSO=0, MTU 1500
#   gso-9000         the same at MTU 9000
#   gso-refused      the same where h2's route to h1 has a smaller MTU than
#                    its device, so the kernel refuses GSO buffers: h2's
#                    port falls back to single (fragmented) datagrams
#   payload-crc      4 MiB messages, every byte checked, with the payload
#                    CRC declined by both ends (the connection goes without
#                    it) and by one end only (it keeps it)
#   ethernet         small messages as Ethernet frames both ways, and none
#                    with VIA_ETHERNET=off on one end
#   frame-loss       every frame to h2 dropped (nftables): h1 gives frames
#                    up and the pingpong completes over UDP
#   packet-loss      4 MiB messages, every byte checked, while one in 25
#                    large datagrams to h1 is dropped (nftables): h2 sends
#                    them again, and h1 still takes packets in place; as
#                    sends, then as RDMA writes with immediate data
#
# For each case a cluster comes up, the programs run on their hosts under
# `timeout`, and the cluster goes down again (also on interruption).  Output:
# a PASS, FAIL or SKIP line per case with its time, then
# `cluster-tests: N passed, M failed, K skipped`; the exit status is non-zero
# when a case failed.  Logs: build/cluster/logs/RUN/CASE.log.  Without root
# or iproute2, or where network namespaces cannot be made, every case is
# skipped, visibly.
#
# Environment: STAGE (the staged install, default build/stage), CC,
# OVC_CFLAGS (default: C11, -O2 -g, -Wall -Wextra -Werror), OVC_RUN (the
# cluster run id, default this shell's pid).
set -u

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
stage=${STAGE:-$top/build/stage}
out=$top/build/cluster
cluster=$here/cluster.sh
cc=${CC:-cc}
cflags=${OVC_CFLAGS:--std=c11 -O2 -g -Wall -Wextra -Werror -pthread}

# inject.py (bad-input) needs the crc32c module: python3 from PATH if it
# has it, else the distribution's, where scripts/setup.sh installs it.
python=
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import crc32c' 2>/dev/null; then
        python=$p
        break
    fi
done

OVC_RUN=${OVC_RUN:-$$}
logs=$out/logs/$OVC_RUN
VIA_VIAD=$stage/bin/viad
VIA_DEVICE=/dev/via_eth0
export OVC_RUN VIA_VIAD VIA_DEVICE

ALL_CASES="names ipv6 acceptance-1500 acceptance-9000 workload break-loss last-word ops-1500 ops-9000 deregistered alltoall start-order requester-killed two-agents cm-stats peer-killed link-down bad-input gso-1500 gso-9000 gso-refused payload-crc ethernet frame-loss packet-loss"

# ------------------------------------------------------------------
# Helpers for the cases

cluster() {
    sh "$cluster" "$@"
}

up() {
    cluster up "$@" || return 1
}

# on HOST SECONDS CMD...: run CMD on HOST in the foreground.
on() {
    host=$1 secs=$2
    shift 2
    timeout -k 5 "$secs" sh "$cluster" exec "$host" "$@"
}

# spawn HOST LOG SECONDS CMD...: run CMD on HOST in the background, output
# to LOG; $! is the pid of its `timeout` (the programs print their own pid).
spawn() {
    host=$1 log=$2 secs=$3
    shift 3
    timeout -k 5 "$secs" sh "$cluster" exec "$host" "$@" >"$log" 2>&1 &
}

# pair NAME BASE SECONDS SERVER... -- CLIENT...: SERVER on h1 in the
# background, then CLIENT on h2, each within SECONDS; output in BASE.h1 and
# BASE.h2, shown in the case log.  Both must exit 0.
pair() {
    local name=$1 base=$2 secs=$3 server rc src
    shift 3
    (
        # Keep the words before --: each is rotated to the end, the rest dropped.
        n=$#
        while [ "$n" -gt 0 ]; do
            a=$1
            shift
            n=$((n - 1))
            if [ "$a" = -- ]; then
                shift "$n"
                break
            fi
            set -- "$@" "$a"
        done
        exec timeout -k 5 "$secs" sh "$cluster" exec 1 "$@"
    ) >"$base.h1" 2>&1 &
    server=$!
    while [ "$1" != -- ]; do shift; done
    shift
    on 2 "$secs" "$@" >"$base.h2" 2>&1
    rc=$?
    wait "$server"
    src=$?
    show "$base.h1" "$base.h2"
    expect "$name server on h1" 0 "$src" || return 1
    expect "$name client on h2" 0 "$rc"
}

# wait_for FILE PATTERN SECONDS
wait_for() {
    n=0
    while ! grep -q "$2" "$1" 2>/dev/null; do
        n=$((n + 1))
        [ "$n" -gt $(($3 * 10)) ] && return 1
        sleep 0.1
    done
}

# show LOG...: the programs' output, into the case log.
show() {
    for f in "$@"; do
        echo "---- $(basename "$f")"
        cat "$f"
    done
}

# expect WHAT WANT GOT: an exit status.
expect() {
    if [ "$2" = "$3" ]; then
        return 0
    fi
    echo "$1: exit status $3, expected $2"
    return 1
}

# counter HOST NAME: a counter of the host agent on HOST.
counter() {
    on "$1" 10 "$VIA_VIAD" --stats | awk -v n="$2" '$1 == n { print $2 }'
}

now_ms() {
    echo $(($(date +%s%N) / 1000000))
}

# ------------------------------------------------------------------
# The cases: each returns 0 (pass), 77 (skip) or anything else (fail).

case_names() {
    up 2 || return 1
    a1=$(cluster addr 1)
    a2=$(cluster addr 2)
    on 1 30 "$out/names" h1 "h2=$a2" "h1=$a1" || return 1
    on 2 30 "$out/names" h2 "h1=$a1" "h2=$a2" || return 1
}

# The pingpong example between two hosts named by IPv6 address.
case_ipv6() {
    up 2 || return 1
    a6=$(cluster addr6 1)
    pair "pingpong to $a6" "$logs/$tc" 60 env VIA_LOG=via_provider=info "$out/pingpong" server \
        -- env VIA_LOG=via_provider=info "$out/pingpong" client "$a6" || return 1
    grep -q "round trips" "$logs/$tc.h2" || return 1
    # Peers on one link by IPv6 address exchange Ethernet frames too.
    for h in 1 2; do
        sent=$(frames_field "$logs/$tc.h$h" sent) heard=$(frames_field "$logs/$tc.h$h" heard)
        echo "h$h frames sent=${sent:-?} heard=${heard:-?}"
        [ "${sent:-0}" -gt 1000 ] && [ "${heard:-0}" -gt 1000 ] || return 1
    done
}

# acceptance MTU
case_acceptance() {
    up 2 --mtu "$1" || return 1
    pair acceptance "$logs/$tc" 150 "$out/acceptance" server "$OVC_RUN" -- "$out/acceptance" client "$OVC_RUN" h1
}

# Seeded random transfers between two hosts (tests/c/workload.c).
# Its provider logs say why a connection broke; a failure shows the last
# such lines.
case_workload() {
    up 2 || return 1
    base=$logs/$tc
    pair workload "$base" 300 env VIA_LOG=via_provider=info "$out/workload" server "$OVC_RUN" \
        -- env VIA_LOG=via_provider=info "$out/workload" client "$OVC_RUN" h1 && return 0
    for h in h1 h2; do
        echo "$h: the last connections broken, and warnings:"
        grep -E 'WARN|connection broken|VI broken' "$base.$h" | tail -n 4
    done
    return 1
}

# A lost BREAK (docs/wire.md, "Ending a connection"): nftables rules at
# the ingress of both hosts drop every other datagram of kind BREAK (byte
# 3 of the UDP payload is 6), the first among them.  Sends too long for
# their receive and sends without one break reliable connections in many
# seeds; the peer, which did not hear the first BREAK, retransmits, and
# the end that broke must say it again: the workload's checks hold (what
# the target placed completes at the sender, the refused send with its
# contract status), and the logs show the word said again.
case_break_loss() {
    command -v nft >/dev/null 2>&1 || { echo "no nft (nftables) to drop packets with"; return 77; }
    up 2 || return 1
    for h in 1 2; do
        ingress_drop $h break_loss ip protocol udp @th,88,8 == 6 numgen inc mod 2 == 0 || return 1
    done
    base=$logs/$tc
    pair workload "$base" 300 env VIA_LOG=via_provider=info "$out/workload" server "$OVC_RUN" \
        -- env VIA_LOG=via_provider=info "$out/workload" client "$OVC_RUN" h1 || return 1
    dropped=$(( $(ingress_dropped 1 break_loss) + $(ingress_dropped 2 break_loss) ))
    again=$(cat "$base.h1" "$base.h2" | grep -c 'last word said again')
    echo "BREAKs dropped: $dropped; last words said again: $again"
    [ "$dropped" -gt 0 ] || { echo "the rules dropped no BREAK"; return 1; }
    [ "$again" -gt 0 ] || { echo "no end said its last word again"; return 1; }
}

# A lost DISCONNECT, and the VI that sent it connects again at once
# (tests/cluster/lastword.c): an nftables rule at h2's ingress drops every
# other datagram of kind DISCONNECT (byte 3 of the UDP payload is 7) of the
# data path (not the agents' port 60), the first among them.  The old peer
# on h2 must hear the word again from h1's port within half a second, and
# h1's log shows it said again.  Frames are off: the rule sees UDP only.
case_last_word() {
    command -v nft >/dev/null 2>&1 || { echo "no nft (nftables) to drop packets with"; return 77; }
    up 2 || return 1
    ingress_drop 2 last_word ip protocol udp udp dport != 60 @th,88,8 == 7 numgen inc mod 2 == 0 || return 1
    base=$logs/$tc
    pair lastword "$base" 60 env VIA_ETHERNET=off VIA_LOG=via_provider=info "$out/lastword" server h2 \
        -- env VIA_ETHERNET=off VIA_LOG=via_provider=info "$out/lastword" client h1 || return 1
    dropped=$(ingress_dropped 2 last_word)
    again=$(grep -c 'last word said again' "$base.h1")
    echo "DISCONNECTs dropped: $dropped; last words said again: $again"
    [ "$dropped" -gt 0 ] || { echo "the rule dropped no DISCONNECT"; return 1; }
    [ "$again" -gt 0 ] || { echo "h1 did not say its last word again"; return 1; }
}

# ops MTU
case_ops() {
    up 2 --mtu "$1" || return 1
    pair ops "$logs/$tc" 120 "$out/ops" server h2 -- "$out/ops" client h1
}

# Memory deregistered and unmapped under posted descriptors.
case_deregistered() {
    up 2 || return 1
    pair gone "$logs/$tc" 120 "$out/gone" server h2 -- "$out/gone" client h1
}

# The hosts start in a shuffled order, 0 to 3 s apart from the first.
case_alltoall() {
    n=8
    up "$n" --bridge || return 1
    pids=
    i=1
    for delay in 2.1 0 3 0.4 1.2 2.6 0.8 1.7; do
        spawn "$i" "$logs/$tc.h$i" 120 sh -c "sleep $delay; exec \"\$0\" \"\$@\"" "$out/alltoall" "$i" "$n" 200
        pids="$pids $!"
        i=$((i + 1))
    done
    ok=0
    i=1
    for p in $pids; do
        wait "$p"
        rc=$?
        show "$logs/$tc.h$i"
        expect "alltoall on h$i" 0 "$rc" || ok=1
        i=$((i + 1))
    done
    return "$ok"
}

# start-order: h9 runs every client (the largest address: it forwards
# requests of both models); h1-h4 run servers 0, 1, 3 and 7 s late with no
# agent until then, h5-h8 the same where an agent runs from the start; the
# one-host pairs run on h9 too.  Each host pair: both models, each with
# 1 s and 5 s timeouts.
case_start_order() {
    up 9 --bridge || return 1
    for h in 5 6 7 8; do
        spawn "$h" "$logs/$tc.agent$h" 100 "$VIA_VIAD" --idle-timeout 0
    done
    sleep 0.5
    pids= names=
    run_pair() { # HOST TAG MODEL DELAY TIMEOUT: a server on HOST, its client on h9
        spawn "$1" "$logs/$tc.$2.s" 90 "$out/startorder" server "$3" h9 "$2" "$4" "$5"
        pids="$pids $!" names="$names $2.s"
        peer=h$1
        spawn 9 "$logs/$tc.$2.c" 90 "$out/startorder" client "$3" "$peer" "$2" 0 "$5"
        pids="$pids $!" names="$names $2.c"
    }
    i=0
    for delay in 0 1000 3000 7000; do
        i=$((i + 1))
        for model in cs peer; do
            for t in 1000 5000; do
                run_pair "$i" "x$i.$model.$t" "$model" "$delay" "$t"
                run_pair "$((i + 4))" "a$((i + 4)).$model.$t" "$model" "$delay" "$t"
                run_pair 9 "l$delay.$model.$t" "$model" "$delay" "$t"
            done
        done
    done
    ok=0
    set -- $names
    for p in $pids; do
        wait "$p"
        rc=$?
        show "$logs/$tc.$1"
        expect "startorder $1" 0 "$rc" || ok=1
        shift
    done
    # A client that asked a host with no agent yet, 3 or 7 s before its
    # server came, with a 1 s timeout, was told VIP_NO_MATCH and tried again.
    for tag in x3.cs.1000 x4.cs.1000; do
        tries=$(sed -n 's/^PASS .* tries=\([0-9]*\).*/\1/p' "$logs/$tc.$tag.c")
        echo "$tag client: tries=${tries:-?}"
        [ "${tries:-0}" -ge 2 ] || { echo "$tag: the client should have retried on VIP_NO_MATCH"; ok=1; }
    done
    pu=$(counter 9 cm_port_unreachable) un=$(counter 9 cm_unreachable)
    echo "h9 cm_port_unreachable ${pu:-?} cm_unreachable ${un:-?}"
    [ "${pu:-0}" -gt 0 ] || { echo "h9 heard no port unreachable from the hosts without an agent"; ok=1; }
    [ "${un:-1}" -eq 0 ] || { echo "h9 called a live host unreachable"; ok=1; }
    return "$ok"
}

# requester-killed: h2 asks h1 (an agent runs, nobody listens) with a long
# timeout and is SIGKILLed while its request is held; h1's listener must
# not get it (VIP_TIMEOUT), then connects to a new client.
case_requester_killed() {
    up 2 || return 1
    spawn 1 "$logs/$tc.agent1" 60 "$VIA_VIAD" --idle-timeout 0
    spawn 2 "$logs/$tc.doomed" 60 "$out/startorder" client cs h1 doomed 0 30000
    doomed=$!
    n=0
    until [ "$(counter 1 remote_held)" = 1 ]; do
        n=$((n + 1))
        [ "$n" -gt 100 ] && { echo "h1 never held the request"; return 1; }
        sleep 0.1
    done
    pkill -KILL -f "startorder client cs h1 doomed"
    wait "$doomed"
    n=0
    until [ "$(counter 1 cm_withdrawn_received)" = 1 ]; do
        n=$((n + 1))
        [ "$n" -gt 50 ] && { echo "h1 never heard the withdrawal"; return 1; }
        sleep 0.1
    done
    echo "h1 remote_held $(counter 1 remote_held) after the withdrawal"
    [ "$(counter 1 remote_held)" = 0 ] || return 1
    # A server whose first wait times out (nobody asks), then connects to
    # the new client: it never sees the dead one's request.
    pair startorder "$logs/$tc" 60 "$out/startorder" server cs h2 doomed 0 1000 \
        -- "$out/startorder" client cs h1 doomed 2500 5000 || return 1
    tries=$(sed -n 's/^PASS .* tries=\([0-9]*\).*/\1/p' "$logs/$tc.h1")
    echo "server tries=${tries:-?}"
    [ "${tries:-0}" -ge 2 ] || { echo "the server's first wait should have timed out"; return 1; }
    [ "$(counter 1 remote_listeners_matched)" = 1 ] || { echo "h1 delivered more than one request"; return 1; }
}

# two-agents: h2 has its agent (the CM port's owner) and a second one on
# another socket; a program of the second gets VIP_NOT_REACHABLE at once
# for h1, with the reason in its own log, and the second agent's stats say
# why; the first agent's programs connect.
case_two_agents() {
    up 2 || return 1
    spawn 2 "$logs/$tc.agent2" 60 "$VIA_VIAD" --idle-timeout 0
    sleep 0.5
    spawn 2 "$logs/$tc.second" 60 env VIA_AGENT_SOCKET=openvia-second "$VIA_VIAD" --idle-timeout 0 --socket openvia-second
    sleep 0.5
    start=$(now_ms)
    on 2 30 env VIA_AGENT_SOCKET=openvia-second "$out/startorder" client cs h1 second 0 5000 >"$logs/$tc.client" 2>&1
    rc=$?
    took=$(($(now_ms) - start))
    show "$logs/$tc.client"
    [ "$rc" -ne 0 ] || { echo "a client of the second agent connected to h1"; return 1; }
    grep -q "VIP_NOT_REACHABLE" "$logs/$tc.client" || { echo "expected VIP_NOT_REACHABLE"; return 1; }
    grep -q "cannot bind CM port" "$logs/$tc.client" || { echo "the reason is not in the program's log"; return 1; }
    echo "failed after $took ms"
    [ "$took" -lt 4000 ] || { echo "it should fail at once"; return 1; }
    errno=$(on 2 10 env VIA_AGENT_SOCKET=openvia-second "$VIA_VIAD" --stats --socket openvia-second | awk '$1 == "cm_bind_errno" { print $2 }')
    echo "second agent cm_bind_errno ${errno:-?}"
    [ "${errno:-0}" -ne 0 ] || return 1
    pair startorder "$logs/$tc" 60 "$out/startorder" server cs h2 first 0 5000 \
        -- "$out/startorder" client cs h1 first 0 5000
}

case_cm_stats() {
    up 2 || return 1
    pair stream "$logs/$tc" 60 "$out/stream" server h2 -- "$out/stream" client h1 --seconds 1 || return 1
    ok=0
    for c in 1:cm_requests_received 1:cm_accepts 1:remote_listeners_matched 2:cm_requests_sent 2:cm_accepts; do
        host=${c%%:*} name=${c#*:}
        v=$(counter "$host" "$name")
        echo "h$host $name ${v:-(missing)}"
        if [ -z "$v" ] || [ "$v" -eq 0 ]; then
            echo "h$host: $name should have moved"
            ok=1
        fi
    done
    return "$ok"
}

# fault kill|link: h2 runs the server, h1 the client; both expect the fault.
case_fault() {
    up 2 || return 1
    spawn 2 "$logs/$tc.h2" 120 "$out/stream" server h1 --expect-fault
    victim=$!
    spawn 1 "$logs/$tc.h1" 120 "$out/stream" client h2 --expect-fault
    survivor=$!
    if ! wait_for "$logs/$tc.h1" streaming 30; then
        echo "the transfer did not start"
        kill "$victim" "$survivor" 2>/dev/null
        wait
        show "$logs/$tc.h1" "$logs/$tc.h2"
        return 1
    fi
    sleep 0.3
    t0=$(now_ms)
    if [ "$1" = kill ]; then
        pid=$(sed -n 's/^pid //p' "$logs/$tc.h2")
        echo "SIGKILL to the server on h2 (pid $pid)"
        kill -9 "$pid"
    else
        echo "h2: link down"
        cluster link 2 down
    fi
    wait "$survivor"
    rc=$?
    echo "client on h1 ended $(($(now_ms) - t0)) ms after the fault"
    wait "$victim"
    vrc=$?
    show "$logs/$tc.h1" "$logs/$tc.h2"
    expect "stream client on h1" 0 "$rc" || return 1
    if [ "$1" = kill ]; then
        expect "stream server on h2 (killed)" 137 "$vrc"
    else
        expect "stream server on h2" 0 "$vrc"
    fi
}

case_bad_input() {
    if [ -z "$python" ]; then
        echo "no python3 with the crc32c module (scripts/setup.sh installs python3-crc32c)"
        return 77
    fi
    up 2 || return 1
    # Messages as sends, then as RDMA writes (whose packets after the first
    # the kernel writes straight into the target: garbage must not stay there).
    for extra in "" --rdma; do
        echo "stream ${extra:-(sends)}:"
        base=$logs/$tc${extra:+.rdma}
        # shellcheck disable=SC2086
        spawn 2 "$base.h2" 90 "$out/stream" server h1 $extra
        victim=$!
        # shellcheck disable=SC2086
        spawn 1 "$base.h1" 90 "$out/stream" client h2 --seconds 10 $extra
        client=$!
        irc=1
        if wait_for "$base.h2" streaming 30; then
            pid=$(sed -n 's/^pid //p' "$base.h2")
            on 2 60 "$python" "$here/inject.py" --pid "$pid" --seconds 6 --cm \
                --frames-from "/run/netns/$(cluster ns 1)" >"$base.inject" 2>&1
            irc=$?
        else
            echo "the transfer did not start"
        fi
        wait "$client"
        crc=$?
        wait "$victim"
        vrc=$?
        show "$base.inject" "$base.h2" "$base.h1"
        expect "inject.py on h2" 0 "$irc" || return 1
        expect "stream server on h2" 0 "$vrc" || return 1
        expect "stream client on h1" 0 "$crc" || return 1
    done
    # The agent refused the garbage on its CM port (it came from another
    # port) and still works.
    v=$(counter 2 cm_refused_source)
    echo "h2 cm_refused_source ${v:-(missing)}"
    [ -n "$v" ] && [ "$v" -gt 0 ]
}

# offload_field LOG FIELD: FIELD of the port's offload report (the last
# "network VI ..." line of the provider's log in LOG).
offload_field() {
    grep 'network VI' "$1" | sed -n "s/.*Offload {[^}]*$2: \([a-z0-9]*\).*/\1/p" | tail -n 1
}

# stream_pair BASE ENV [H2_ENV]: 4 MiB messages (every byte checked)
# streamed from h2 to a server on h1 for 2 s, h1 under ENV and h2 under
# H2_ENV (default ENV), each a list of NAME=VALUE words; logs in BASE.h1,
# BASE.h2.
stream_pair() {
    local base=$1 h1env=$2 h2env=${3-$2} extra=${4-}
    # The lists are split into their words on purpose.
    # shellcheck disable=SC2086
    pair stream "$base" 90 env $h1env "$out/stream" server h2 --size 4194304 --batch 4 $extra \
        -- env $h2env "$out/stream" client h1 --size 4194304 --batch 4 --seconds 2 $extra
}

# gso MTU: a stream of 4 MiB messages (every byte checked) with segmentation
# offload on (the default) and with VIA_GSO=0; each side's port must report
# that it sent GSO buffers and received coalesced datagrams, or, off, none.
case_gso() {
    up 2 --mtu "$1" || return 1
    ok=0
    for gso in 1 0; do
        echo "VIA_GSO=$gso:"
        stream_pair "$logs/$tc.gso$gso" "VIA_GSO=$gso VIA_LOG=via_provider=info" || ok=1
        for h in 1 2; do
            log=$logs/$tc.gso$gso.h$h
            g=$(offload_field "$log" gso) r=$(offload_field "$log" gro)
            gb=$(offload_field "$log" gso_buffers) rb=$(offload_field "$log" gro_buffers)
            echo "VIA_GSO=$gso h$h: gso=${g:-?} gro=${r:-?} gso_buffers=${gb:-?} gro_buffers=${rb:-?}"
            p=$(offload_field "$log" in_place)
            echo "VIA_GSO=$gso h$h: packets received in place=${p:-?}"
            if [ $gso = 1 ]; then
                want="true true"
                [ "${gb:-0}" -gt 0 ] && [ "${rb:-0}" -gt 0 ] || { echo "h$h: no GSO buffers sent or no coalesced datagrams received"; ok=1; }
                [ "${p:-0}" -gt 0 ] || { echo "h$h: no large packet received in place"; ok=1; }
            else
                want="false false"
                [ "$gb" = 0 ] && [ "$rb" = 0 ] || { echo "h$h: offload used with VIA_GSO=0"; ok=1; }
                # Without large packets every packet goes through the batch.
                [ "$p" = 0 ] || { echo "h$h: packets in place without large packets"; ok=1; }
            fi
            [ "$g $r" = "$want" ] || { echo "h$h: offload state '$g $r', expected '$want'"; ok=1; }
        done
    done
    return "$ok"
}

# A route MTU below the device's: the kernel refuses h2's GSO buffers
# (EINVAL), h2's port must fall back to single datagrams and say so once.
case_gso_refused() {
    up 2 || return 1
    cluster exec 2 ip route replace "$(cluster addr 1)/32" dev eth0 mtu lock 1200 || return 1
    stream_pair "$logs/$tc" "VIA_LOG=via_provider=info" || return 1
    g1=$(offload_field "$logs/$tc.h1" gso) g2=$(offload_field "$logs/$tc.h2" gso)
    n=$(grep -c 'segmentation offload refused' "$logs/$tc.h2")
    echo "h1 gso=${g1:-?}; h2 gso=${g2:-?}, refusals logged: $n"
    [ "$g1" = true ] && [ "$g2" = false ] && [ "$n" = 1 ]
}

# A connection goes without the CRC-32C over payloads only when both ends
# decline it: a stream of 4 MiB messages (every byte checked) with
# VIA_PAYLOAD_CRC=off on h2, and on h1 too, then not; each process's
# "network VI" line must report what its connection used.
case_payload_crc() {
    up 2 || return 1
    ok=0
    for h1 in off on; do
        base=$logs/$tc.h1-$h1
        stream_pair "$base" "VIA_PAYLOAD_CRC=$h1 VIA_LOG=via_provider=info" \
            "VIA_PAYLOAD_CRC=off VIA_LOG=via_provider=info" || ok=1
        if [ $h1 = off ]; then want=false; else want=true; fi
        for h in 1 2; do
            got=$(grep 'network VI' "$base.h$h" | sed 's/\x1b\[[0-9;]*m//g' |
                sed -n 's/.*payload_crc=\([a-z]*\).*/\1/p' | tail -n 1)
            echo "VIA_PAYLOAD_CRC h1=$h1 h2=off: h$h payload_crc=${got:-?}"
            [ "$got" = "$want" ] || { echo "h$h: expected payload_crc=$want"; ok=1; }
        done
    done
    return "$ok"
}

# ingress_drop HOST TABLE MATCH...: an nftables table TABLE at the ingress
# of HOST's interface that counts and drops what MATCH matches.
ingress_drop() {
    local host=$1 table=$2
    shift 2
    on "$host" 10 nft add table netdev "$table" &&
        on "$host" 10 nft add chain netdev "$table" in "{ type filter hook ingress device eth0 priority 0; }" &&
        on "$host" 10 nft add rule netdev "$table" in "$@" counter drop
}

# ingress_dropped HOST TABLE: how many packets ingress_drop's rule dropped.
ingress_dropped() {
    on "$1" 10 nft list table netdev "$2" | sed -n 's/.*counter packets \([0-9]*\).*/\1/p'
}

# frames_field LOG FIELD: FIELD (sent, heard) of the frames a link sent
# and took as Ethernet frames (the last "network VI ..." line in LOG).
frames_field() {
    grep 'network VI' "$1" | sed 's/\x1b\[[0-9;]*m//g' |
        sed -n "s/.*frames=[A-Za-z]* {[^}]*$2: \([0-9]*\).*/\1/p" | tail -n 1
}

# Packets as Ethernet frames (docs/wire.md): the pingpong example between
# the hosts with VIA_ETHERNET on both ends (the default), then off on h2.
# Each process's "network VI" line reports its link's frames: sent and heard
# on both ends in the first run; none either way in the second, since h2
# neither sends frames nor offers to take them.
case_ethernet() {
    up 2 || return 1
    ok=0
    for h2 in on off; do
        base=$logs/$tc.h2-$h2
        pair pingpong "$base" 60 env VIA_LOG=via_provider=info "$out/pingpong" server \
            -- env VIA_ETHERNET=$h2 VIA_LOG=via_provider=info "$out/pingpong" client h1 || ok=1
        for h in 1 2; do
            sent=$(frames_field "$base.h$h" sent) heard=$(frames_field "$base.h$h" heard)
            echo "VIA_ETHERNET h2=$h2: h$h frames sent=${sent:-?} heard=${heard:-?}"
            if [ $h2 = on ]; then
                [ "${sent:-0}" -gt 1000 ] && [ "${heard:-0}" -gt 1000 ] || { echo "h$h: too few frames"; ok=1; }
            else
                [ "$sent" = 0 ] && [ "$heard" = 0 ] || { echo "h$h: frames with VIA_ETHERNET=off on h2"; ok=1; }
            fi
        done
    done
    return "$ok"
}

# Frames lost on the way (docs/wire.md "Ethernet frames"): an nftables
# rule at the ingress of h2's interface drops every frame of openvia's
# EtherType, so none of h1's frames arrive.  h1's link must give frames up
# after three lost in a row and carry on over UDP: the pingpong completes
# with every reply checked, h1 reports its frames off, h2 heard none, and
# h2's frames to h1, which nothing drops, still arrive.  (h2 gives frames
# up as well: h1 answered them with acknowledgements as frames, which the
# rule dropped, so they were sent again.)
case_frame_loss() {
    command -v nft >/dev/null 2>&1 || { echo "no nft (nftables) to drop frames with"; return 77; }
    up 2 || return 1
    ingress_drop 2 frame_loss ether type 0x88b5 || return 1
    base=$logs/$tc
    pair pingpong "$base" 60 env VIA_LOG=via_provider=info "$out/pingpong" server \
        -- env VIA_LOG=via_provider=info "$out/pingpong" client h1 || return 1
    ok=0
    dropped=$(ingress_dropped 2 frame_loss)
    echo "frames dropped at h2: ${dropped:-?}"
    [ "${dropped:-0}" -ge 3 ] || { echo "h2 dropped fewer than three frames"; ok=1; }
    grep -q 'frames lost in a row' "$base.h1" || { echo "h1 did not give frames up"; ok=1; }
    grep 'network VI' "$base.h1" | sed 's/\x1b\[[0-9;]*m//g' | grep -q 'off: true' ||
        { echo "h1's link does not report its frames off"; ok=1; }
    heard1=$(frames_field "$base.h1" heard) heard2=$(frames_field "$base.h2" heard)
    echo "frames heard: h1 ${heard1:-?}, h2 ${heard2:-?}"
    [ "${heard2:-1}" = 0 ] || { echo "h2 heard frames through the drop rule"; ok=1; }
    [ "${heard1:-0}" -gt 0 ] || { echo "h2's frames did not reach h1"; ok=1; }
    return "$ok"
}

# Large packets lost on the way: an nftables rule at the ingress of h1's
# interface drops one in 25 UDP datagrams longer than 1000 bytes (the
# large packets, each one GSO buffer on the veth pair).  The next packets
# then arrive out of order, after the kernel has put them where the lost
# one belonged (docs/architecture.md, "Receiving in place"); the stream
# must still deliver every byte of every message in order, h2 must have
# sent packets again, the rule must have dropped some, and h1 must still
# have received packets in place.  Twice: messages as sends into posted
# receives, then as RDMA writes with immediate data into the peer's slots.
case_packet_loss() {
    command -v nft >/dev/null 2>&1 || { echo "no nft (nftables) to drop packets with"; return 77; }
    up 2 || return 1
    ingress_drop 1 packet_loss ip protocol udp ip length \> 1000 numgen random mod 25 == 0 || return 1
    ok=0 before=0
    for op in send rdma; do
        extra=""
        [ $op = rdma ] && extra=--rdma
        stream_pair "$logs/$tc.$op" "VIA_LOG=via_provider=info" "VIA_LOG=via_provider=info" "$extra" || return 1
        total=$(ingress_dropped 1 packet_loss)
        dropped=$((${total:-0} - before)) before=${total:-0}
        resent=$(grep 'network VI' "$logs/$tc.$op.h2" | sed -n 's/.*retransmits: \([0-9]*\).*/\1/p' | tail -n 1)
        placed=$(offload_field "$logs/$tc.$op.h1" in_place)
        echo "$op: dropped at h1: $dropped; sent again by h2: ${resent:-?}; received in place at h1: ${placed:-?}"
        [ "$dropped" -gt 0 ] || { echo "$op: the rule dropped nothing"; ok=1; }
        [ "${resent:-0}" -ge "$dropped" ] || { echo "$op: h2 sent fewer packets again than were dropped"; ok=1; }
        [ "${placed:-0}" -gt 0 ] || { echo "$op: h1 received no packet in place"; ok=1; }
    done
    return "$ok"
}

run_one() {
    case $1 in
    names) case_names ;;
    ipv6) case_ipv6 ;;
    acceptance-1500) case_acceptance 1500 ;;
    acceptance-9000) case_acceptance 9000 ;;
    workload) case_workload ;;
    last-word) case_last_word ;;
    break-loss) case_break_loss ;;
    ops-1500) case_ops 1500 ;;
    ops-9000) case_ops 9000 ;;
    deregistered) case_deregistered ;;
    alltoall) case_alltoall ;;
    start-order) case_start_order ;;
    requester-killed) case_requester_killed ;;
    two-agents) case_two_agents ;;
    cm-stats) case_cm_stats ;;
    peer-killed) case_fault kill ;;
    link-down) case_fault link ;;
    bad-input) case_bad_input ;;
    gso-1500) case_gso 1500 ;;
    gso-9000) case_gso 9000 ;;
    gso-refused) case_gso_refused ;;
    payload-crc) case_payload_crc ;;
    ethernet) case_ethernet ;;
    frame-loss) case_frame_loss ;;
    packet-loss) case_packet_loss ;;
    *)
        echo "no case '$1' (cases: $ALL_CASES)"
        return 1
        ;;
    esac
}

# ------------------------------------------------------------------
# Build, then run

build() {
    pc_env="PKG_CONFIG_PATH=$stage/lib/pkgconfig PKG_CONFIG_LIBDIR=$stage/lib/pkgconfig"
    # shellcheck disable=SC2086 # pc_env is two assignments
    vcflags=$(env $pc_env pkg-config --cflags vipl) || return 1
    # shellcheck disable=SC2086
    vlibs=$(env $pc_env pkg-config --libs vipl) || return 1
    # The installed vipl.pc forces no rpath: the programs find the staged library by their own.
    vlibs="$vlibs -Wl,-rpath,$stage/lib"
    for p in ops gone alltoall startorder stream names acceptance workload pingpong lastword; do
        src=$here/$p.c
        [ "$p" = acceptance ] && src=$top/tests/c/acceptance.c
        [ "$p" = workload ] && src=$top/tests/c/workload.c
        [ "$p" = pingpong ] && src=$top/examples/pingpong.c
        echo "CC $p"
        # A new file renamed into place: a concurrent run may be executing the old one.
        # shellcheck disable=SC2086 # flag lists
        $cc $cflags $vcflags -o "$out/$p.new.$$" "$src" $vlibs || return 1
        mv -f "$out/$p.new.$$" "$out/$p" || return 1
    done
    if [ -n "$python" ]; then
        echo "PY inject.py --self-test"
        "$python" "$here/inject.py" --self-test || return 1
    fi
}

# skip_all REASON: every case skipped.
skip_all() {
    for c in $cases; do
        printf 'SKIP %-16s %6d ms (%s)\n' "$c" 0 "$1"
        skipped=$((skipped + 1))
    done
    echo "cluster-tests: 0 passed, 0 failed, $skipped skipped"
    exit 0
}

cases=${*:-$ALL_CASES}
passed=0
failed=0
skipped=0
failures=

probe=$(cluster down 2>&1)
case $probe in
*skipped*)
    echo "$probe"
    skip_all "needs root and iproute2"
    ;;
esac
# Root may still be denied namespaces (a container without CAP_SYS_ADMIN).
if ! probe=$(cluster up 2 2>&1); then
    cluster down >/dev/null 2>&1
    echo "cluster: skipped: cannot make network namespaces here: $(echo "$probe" | tail -n 1)"
    skip_all "no network namespaces"
fi
cluster down >/dev/null 2>&1

mkdir -p "$out" "$logs"
# Logs of runs more than a day old go.
find "$out/logs" -mindepth 1 -maxdepth 1 -type d -mtime +0 -exec rm -rf {} + 2>/dev/null

if [ ! -x "$VIA_VIAD" ]; then
    echo "cluster-tests: no staged install in $stage (make stage)"
    exit 1
fi
if ! build; then
    echo "cluster-tests: build failed"
    exit 1
fi

# The case runs in the background so that a signal is handled at once: the
# case's shell is stopped and the cluster (with whatever runs on it) removed.
casepid=
on_signal() {
    [ -n "$casepid" ] && kill "$casepid" 2>/dev/null
    cluster down >/dev/null 2>&1
    echo "cluster-tests: interrupted"
    exit 130
}
trap 'cluster down >/dev/null 2>&1' EXIT
trap on_signal INT TERM

echo "cluster run $OVC_RUN; logs in $logs"
for tc in $cases; do
    log=$logs/$tc.log
    start=$(now_ms)
    (run_one "$tc") >"$log" 2>&1 &
    casepid=$!
    wait "$casepid"
    rc=$?
    casepid=
    cluster down >>"$log" 2>&1
    ms=$(($(now_ms) - start))
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        printf 'PASS %-16s %6d ms\n' "$tc" "$ms"
    elif [ "$rc" -eq 77 ]; then
        skipped=$((skipped + 1))
        printf 'SKIP %-16s %6d ms (%s)\n' "$tc" "$ms" "$(tail -n 1 "$log")"
    else
        failed=$((failed + 1))
        failures="$failures $tc"
        why="exit status $rc"
        [ "$rc" -eq 124 ] && why="timed out"
        printf 'FAIL %-16s %6d ms (%s)\n' "$tc" "$ms" "$why"
        # Each distinct finding once (both ends of a connection report some).
        grep '^FAIL' "$log" | sed 's/^FAIL \[[^]]*\] //' | awk '!seen[$0]++' >"$log.fails"
        echo "---- $log: $(wc -l <"$log.fails") distinct FAIL lines (the first 12), then its last 10 lines"
        head -n 12 "$log.fails"
        echo "...."
        tail -n 10 "$log"
        echo "----"
    fi
done

echo
if [ "$failed" -ne 0 ]; then
    echo "failed:$failures"
fi
echo "cluster-tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
