#!/bin/sh
# A cluster of emulated hosts for openvia's multi-host tests: each host is a
# network namespace with an interface named eth0, so the VI device
# /dev/via_eth0 and the host agent viad (one per namespace) work in it as on
# a real machine.
#
#   cluster.sh up N [--mtu M] [--bridge]   build hosts h1..hN
#   cluster.sh down                        remove everything of this run
#   cluster.sh exec I CMD [ARG...]         run a command on host I
#   cluster.sh link I down|up              set host I's eth0 down or up
#   cluster.sh ns I                        print host I's namespace name
#   cluster.sh addr I                      print host I's IPv4 address
#   cluster.sh hosts                       print the namespaces of this run
#
# Every run has an id, $OVC_RUN or else the pid of the `up` call (which
# prints `OVC_RUN=<id>`); the commands after `up` need the same OVC_RUN.
# Host I is the namespace ovc<run>-h<I> with eth0 = 10.<x>.0.<I>/24, where
# x = 16 + run mod 200.  Two hosts are joined by one veth pair; more than two
# (or two with --bridge) by veth pairs to a Linux bridge in the namespace
# ovc<run>-sw.  Every host resolves h1..hN and localhost through
# /etc/netns/<ns>/hosts, which `ip netns exec` mounts over /etc/hosts (and
# has no DNS server: /etc/netns/<ns>/resolv.conf points at nothing).
#
# Without root or iproute2 the script prints
# `cluster: skipped: needs root and iproute2` and exits 0; callers check for
# that line.
set -eu

prog=cluster

die() {
    echo "$prog: $*" >&2
    exit 1
}

usage() {
    sed -n '7,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

can_run() {
    [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null 2>&1
}

run_id() {
    case ${OVC_RUN:-} in
    '') echo "$$" ;;
    *[!0-9]*) die "OVC_RUN must be a number, not '$OVC_RUN'" ;;
    *) echo "$OVC_RUN" ;;
    esac
}

run=$(run_id)
prefix=ovc$run
subnet=10.$((16 + run % 200)).0

host_ns() {
    echo "$prefix-h$1"
}

host_addr() {
    echo "$subnet.$1"
}

# The IPv6 address of host I (a unique local prefix per run).
host_addr6() {
    echo "fd77:$((16 + run % 200))::$1"
}

# The namespaces of this run, switch included.
run_namespaces() {
    ip netns list 2>/dev/null | awk -v p="$prefix-" 'index($1, p) == 1 { print $1 }'
}

check_host() {
    case $1 in
    '' | *[!0-9]*) die "bad host number '$1'" ;;
    esac
    ns=$(host_ns "$1")
    [ -e "/run/netns/$ns" ] || die "no host $1 in run $run ($ns)"
}

# Kill what still runs in namespace $1, then remove it.
remove_ns() {
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086 # one pid per word
        kill -9 $pids 2>/dev/null || true
        # Give the kernel a moment to reap them before the namespace goes.
        n=0
        while [ -n "$(ip netns pids "$1" 2>/dev/null || true)" ] && [ $n -lt 50 ]; do
            sleep 0.1
            n=$((n + 1))
        done
    fi
    ip netns del "$1" 2>/dev/null || true
    rm -rf "/etc/netns/$1"
}

cmd_down() {
    for ns in $(run_namespaces); do
        remove_ns "$ns"
    done
    # Host files of namespaces that never came up.
    for d in /etc/netns/"$prefix"-*; do
        [ -e "$d" ] && rm -rf "$d"
    done
    return 0
}

write_hosts() {
    ns=$1
    count=$2
    mkdir -p "/etc/netns/$ns"
    {
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        k=1
        while [ "$k" -le "$count" ]; do
            echo "$(host_addr "$k") h$k"
            k=$((k + 1))
        done
    } >"/etc/netns/$ns/hosts"
    # No DNS: names come from the hosts file alone, and a miss fails at once.
    printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
}

cmd_up() {
    [ $# -ge 1 ] || usage
    count=$1
    shift
    mtu=1500
    bridge=0
    while [ $# -gt 0 ]; do
        case $1 in
        --mtu)
            [ $# -ge 2 ] || die "--mtu needs a value"
            mtu=$2
            shift 2
            ;;
        --bridge)
            bridge=1
            shift
            ;;
        *) die "unknown option '$1'" ;;
        esac
    done
    case $count in '' | *[!0-9]*) die "bad host count '$count'" ;; esac
    case $mtu in '' | *[!0-9]*) die "bad MTU '$mtu'" ;; esac
    [ "$count" -ge 2 ] && [ "$count" -le 200 ] || die "host count must be 2..200"
    [ -z "$(run_namespaces)" ] || die "run $run already has namespaces; '$0 down' first"
    [ "$count" -gt 2 ] && bridge=1

    # A failure half-way leaves nothing behind.
    trap 'cmd_down' EXIT

    i=1
    while [ "$i" -le "$count" ]; do
        ns=$(host_ns "$i")
        write_hosts "$ns" "$count"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        i=$((i + 1))
    done

    if [ "$bridge" -eq 0 ]; then
        ip -n "$(host_ns 1)" link add eth0 type veth peer name eth0 netns "$(host_ns 2)"
    else
        sw=$prefix-sw
        ip netns add "$sw"
        ip -n "$sw" link set lo up
        ip -n "$sw" link add br0 type bridge
        ip -n "$sw" link set br0 mtu "$mtu"
        i=1
        while [ "$i" -le "$count" ]; do
            ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$(host_ns "$i")"
            ip -n "$sw" link set "p$i" mtu "$mtu" master br0 up
            i=$((i + 1))
        done
        ip -n "$sw" link set br0 up
    fi

    i=1
    while [ "$i" -le "$count" ]; do
        ns=$(host_ns "$i")
        ip -n "$ns" link set eth0 mtu "$mtu"
        ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
        ip -n "$ns" addr add "$(host_addr6 "$i")/64" dev eth0 nodad
        ip -n "$ns" link set eth0 up
        i=$((i + 1))
    done

    trap - EXIT
    echo "OVC_RUN=$run"
    echo "$prog: $count hosts up (mtu $mtu, $([ "$bridge" -eq 1 ] && echo bridge || echo veth pair)), h1 = $(host_addr 1)"
}

cmd_exec() {
    [ $# -ge 2 ] || usage
    check_host "$1"
    ns=$(host_ns "$1")
    shift
    exec ip netns exec "$ns" "$@"
}

cmd_link() {
    [ $# -eq 2 ] || usage
    check_host "$1"
    case $2 in
    up | down) ip -n "$(host_ns "$1")" link set eth0 "$2" ;;
    *) usage ;;
    esac
}

[ $# -ge 1 ] || usage
cmd=$1
shift

if ! can_run; then
    echo "$prog: skipped: needs root and iproute2"
    exit 0
fi

case $cmd in
up) cmd_up "$@" ;;
down) cmd_down ;;
exec) cmd_exec "$@" ;;
link) cmd_link "$@" ;;
ns)
    check_host "$1"
    host_ns "$1"
    ;;
addr) host_addr "$1" ;;
addr6) host_addr6 "$1" ;;
hosts) run_namespaces ;;
*) usage ;;
esac
