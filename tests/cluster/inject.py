#!/usr/bin/env python3
"""Throw bad datagrams at a running openvia process.

    inject.py --pid PID [--seconds S] [--iface eth0] [--cm] [--frames-from NS]
    inject.py --self-test

Run inside the network namespace of the target process (cluster.sh exec).
The target's UDP data port is found with `ss -u -a -n -p`.  The script
watches the packets that arrive for that port on IFACE (an AF_PACKET socket)
to learn real headers - VI ids, keys, sequence numbers - and for S seconds
sends the port, mixed:

  garbage     random bytes, with and without the "VI" magic
  truncated   real packets cut short
  oversized   real packets with bytes appended, a payload_len larger than
              the datagram, datagrams of 65507 bytes
  wrong-key   real DATA packets with another key (or, with the right key,
              another source VI or an unknown target VI), the sequence number
              of the next packets and a random payload; forged DISCONNECT and
              BREAK packets with a wrong key
  replayed    real packets sent again, verbatim, old and recent

With --cm it also sends garbage to the host agent's CM port (60) from an
unprivileged port, which the agent must refuse unread.  With
--frames-from NS (a namespace file such as /run/netns/NAME, of a host on the
target's link) it also sends the same kinds of packets, and frames cut short
or claiming more bytes than they hold, as Ethernet frames (docs/wire.md,
"Ethernet frames") from that namespace's IFACE to the target's port.

Every datagram but the replays fails the checks of docs/wire.md (framing,
checksum, key, VI ids), so none may change what the target receives; the
replays are duplicates, which must be dropped.  The programs on both ends
check their data; this script only reports what it sent.  It exits non-zero
when it could not find the port or saw no traffic to learn from (then it
proved nothing), or when a captured packet's checksum does not match the
CRC-32C computed here (then the forgeries would not be what they claim).

The CRC-32C comes from the crc32c module (Debian and Ubuntu: python3-crc32c,
which scripts/setup.sh installs); the packets are packed with struct, as
docs/wire.md lays them out (a packet library knows nothing of openvia's
format, and the kernel frames the UDP datagrams).  --self-test checks the
CRC on the CRC-32C check value and the iSCSI vectors, and the checksums of
packets that via-wire built, then exits.
"""

import argparse
import os
import random
import re
import socket
import struct
import subprocess
import sys
import time

try:
    from crc32c import crc32c
except ImportError:
    sys.exit("inject: needs the crc32c module for python3 (Debian/Ubuntu: python3-crc32c; scripts/setup.sh)")

HEADER = struct.Struct(">HBBHHIIQIIQIIIIQIIII")  # docs/wire.md, 80 bytes
assert HEADER.size == 80
MAGIC = 0x5649
VERSION = 1
DATA, RDMA_WRITE, ACK, BREAK, DISCONNECT = 1, 2, 5, 6, 7
HEADER_CRC = 16  # flag: the checksum covers the header only
CM_PORT = 60  # via_wire::cm::CM_PORT
MAX_UDP = 65507
ETH_P_ALL = 0x0003


def seal(packet):
    """The packet with its checksum field set: the CRC over the packet, or
    over its header alone with the HEADER_CRC flag, the field taken as zero."""
    p = bytearray(packet)
    p[76:80] = b"\0\0\0\0"
    covered = p[:80] if struct.unpack_from(">H", p, 4)[0] & HEADER_CRC else p
    p[76:80] = struct.pack(">I", crc32c(covered))
    return bytes(p)


def checksum_ok(packet):
    return len(packet) >= 80 and seal(packet) == packet


def fields(packet):
    return list(HEADER.unpack_from(packet))


def build(f, payload):
    """A sealed packet from header fields (a list as HEADER unpacks) and a payload."""
    return seal(HEADER.pack(*f) + payload)


# Indices into the header fields.
F_KIND, F_FLAGS, F_PLEN, F_DST, F_SRC, F_KEY, F_SEQ = 2, 3, 4, 5, 6, 7, 8
F_MSG, F_STATUS = 11, 17
RELIABLE = 8
PACKET_OUTGOING = 4


def find_port(pid, wait):
    """The UDP port that process pid has bound to a wildcard or a non-loopback
    IPv4 address (its data socket; the provider may bind [::] dual-stack)."""
    pattern = re.compile(r"pid=%d," % pid)
    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(["ss", "-u", "-a", "-n", "-p"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            cols = line.split()
            if not pattern.search(line) or len(cols) < 5:
                continue
            host, _, port = cols[3].rpartition(":")
            ipv4 = re.fullmatch(r"\d+\.\d+\.\d+\.\d+", host) and not host.startswith("127.")
            if ipv4 or host in ("*", "0.0.0.0", "[::]", "[::ffff:0.0.0.0]"):
                return int(port)
        if time.monotonic() > deadline:
            sys.exit("inject: process %d has no UDP port on a wildcard or IPv4 address (ss -u -a -n -p)" % pid)
        time.sleep(0.1)


class Sniffer:
    """Datagrams to one UDP port, as seen on an interface."""

    def __init__(self, iface, port):
        self.port = port
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((iface, 0))
        self.sock.setblocking(False)
        self.data = []  # recent DATA / RDMA_WRITE packets
        self.other = []  # recent packets of other kinds
        self.seen = 0
        self.address = None  # where the real packets go
        self.checked = 0
        self.bad_checksum = 0

    def poll(self, budget=32):
        for _ in range(budget):
            try:
                # A GSO buffer (UDP_SEGMENT) passes the tap whole: up to 64 KiB of UDP payload.
                frame, addr = self.sock.recvfrom(1 << 17)
            except BlockingIOError:
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            for payload in segments(self.udp_payload(frame)):
                self.learn(payload)

    def learn(self, payload):
        if len(payload) < 80 or payload[:2] != b"VI":
            return
        self.seen += 1
        # Check the first packets and a sample: a CRC of every one would slow
        # this loop, which must keep up with a stream (GSO buffers of 64 KiB).
        if self.seen <= 64 or self.seen % 32 == 0:
            self.checked += 1
            if not checksum_ok(payload):
                self.bad_checksum += 1
                return
        keep = self.data if payload[3] in (DATA, RDMA_WRITE) else self.other
        keep.append(payload)
        del keep[:-256]

    def udp_payload(self, frame):
        if len(frame) < 42 or frame[12:14] != b"\x08\x00":
            return None
        ihl = (frame[14] & 0x0F) * 4
        if frame[23] != 17 or (struct.unpack(">H", frame[20:22])[0] & 0x3FFF) != 0:
            return None  # not UDP, or a fragment
        udp = 14 + ihl
        dport, length = struct.unpack(">HH", frame[udp + 2:udp + 6])
        if dport != self.port:
            return None
        self.address = socket.inet_ntoa(frame[30:34])
        return frame[udp + 8:udp + length]


def segments(payload):
    """The packets of a UDP payload: one, or, when the sender used UDP
    segmentation offload and the tap saw the buffer before it was cut, the
    packets back to back, each as long as the first (80 + its payload_len)
    but the last."""
    if payload is None:
        return []
    if len(payload) < 80 or payload[:2] != b"VI":
        return [payload]
    size = 80 + struct.unpack(">H", payload[6:8])[0]
    if len(payload) <= size:
        return [payload]
    return [payload[i:i + size] for i in range(0, len(payload), size)]


def garbage(rng):
    n = rng.randrange(0, 2000)
    body = os.urandom(n)
    if rng.random() < 0.5 and n >= 4:
        body = struct.pack(">HBB", MAGIC, VERSION, rng.randrange(0, 12)) + body[4:]
    return [body]


def truncated(rng, real):
    p = rng.choice(real)
    return [p[:rng.randrange(0, 80)], p[:rng.randrange(80, len(p))] if len(p) > 80 else p[:79]]


def oversized(rng, real):
    p = rng.choice(real)
    f = fields(p)
    extra = seal(p + os.urandom(rng.randrange(1, 600)))  # longer than 80 + payload_len
    f2 = list(f)
    f2[F_PLEN] = 0xFFFF  # payload_len beyond the datagram
    claims_more = build(f2, p[80:])
    f3 = list(f)
    f3[F_KEY] ^= rng.getrandbits(64) | 1
    f3[F_PLEN] = MAX_UDP - 80  # a whole UDP datagram of payload, wrong key
    huge = build(f3, os.urandom(MAX_UDP - 80))
    return [extra, claims_more, huge, os.urandom(MAX_UDP)]


def wrong_key(rng, real):
    p = rng.choice(real)
    newest = max(fields(q)[F_SEQ] for q in real)
    out = []
    for change in ("key", "src", "dst"):
        f = fields(p)
        if change == "key":
            f[F_KEY] ^= rng.getrandbits(64) | 1
        elif change == "src":
            f[F_SRC] ^= rng.randrange(1, 1 << 16)
        else:
            f[F_DST] ^= rng.randrange(1, 1 << 16)
        f[F_SEQ] = (newest + rng.randrange(1, 64)) & 0xFFFFFFFF
        out.append(build(f, os.urandom(f[F_PLEN])))
    for kind in (DISCONNECT, BREAK):
        f = fields(p)
        f[F_KIND], f[F_PLEN] = kind, 0
        f[F_FLAGS] &= RELIABLE
        f[F_KEY] ^= rng.getrandbits(64) | 1
        f[F_SEQ] = (newest + 1) & 0xFFFFFFFF
        for i in range(F_MSG, F_STATUS + 1):  # msg .. status: unused by these kinds
            f[i] = 0
        if kind == BREAK:
            f[F_STATUS] = 0xFFFF0001
        out.append(build(f, b""))
    return out


def replayed(rng, sniff):
    pool = sniff.data + sniff.other
    old = [rng.choice(pool) for _ in range(3)]
    recent = sniff.data[-3:]
    return old + recent + recent


ETHERTYPE = 0x88B5
CLONE_NEWNET = 0x40000000


def socket_in(ns_path, iface):
    """An AF_PACKET socket on iface of the network namespace ns_path."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(ns_path, os.O_RDONLY)
    try:
        if libc.setns(there, CLONE_NEWNET) != 0:
            sys.exit("inject: setns %s: %s" % (ns_path, os.strerror(ctypes.get_errno())))
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETHERTYPE))
        sock.bind((iface, 0))
    finally:
        libc.setns(home, CLONE_NEWNET)
        os.close(home)
        os.close(there)
    return sock


def frames(rng, packets, dst, port):
    """packets as Ethernet frames to port at dst; some cut short within the
    frame header, some claiming more packet bytes than they carry."""
    out = []
    for p in packets:
        claimed = len(p) + (rng.randrange(1, 100) if rng.random() < 0.2 else 0)
        f = dst + b"\x02\x00\x00\x00\x00\x01" + struct.pack(">HHH", ETHERTYPE, port, claimed & 0xFFFF) + p
        if rng.random() < 0.1:
            f = f[:rng.randrange(14, 18)]
        if len(f) <= 1514:  # what fits an MTU of 1500
            out.append(f)
    return out


# Packets that via-wire built (via_wire::encode): an RDMA write with the
# 7-byte payload "openvia", a DATA packet with FLAG_HEADER_CRC and 16 bytes
# of 0x5a, and an acknowledgement.
RUST_PACKETS = [
    "56490102000d000701020304050607081122334455667788deadbeef000000118000000000000001"
    "000000030000000000001000cafef00d00007fff000010000000002a00000000000001004e44e9f0"
    "6f70656e766961",
    "56490101001b001001020304050607081122334455667788deadbeef000000118000000000000001"
    "000000030000000000001000cafef00d00007fff000010000000002a00000000000001000a00b811"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a",
    "564901050000000001020304050607081122334455667788deadbeef000000118000000000000001"
    "00000000000000000000000000000000000000000000000000000000000000000000010079384199",
]


def self_test():
    """The CRC and the checksum of a packet as via-wire computes them."""
    vectors = [
        (b"123456789", 0xE3069283),  # the check value of CRC-32C
        (bytes(32), 0x8A9136AA),  # the iSCSI vectors, RFC 3720 B.4
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (b"", 0),
    ]
    for data, want in vectors:
        got = crc32c(data)
        if got != want:
            sys.exit("inject: self-test: CRC-32C of %r is %#010x, not %#010x" % (data[:12], got, want))
    for i, h in enumerate(RUST_PACKETS):
        p = bytes.fromhex(h)
        if not checksum_ok(p):
            sys.exit("inject: self-test: via-wire's packet %d fails this script's checksum" % i)
        bent = bytearray(p)
        bent[76:80] = b"\0\0\0\0"
        if seal(bent) != p:
            sys.exit("inject: self-test: packet %d sealed here differs from via-wire's" % i)
        bent[10] ^= 1  # the header's first byte of dst_vi
        if checksum_ok(bytes(bent)):
            sys.exit("inject: self-test: packet %d with a flipped bit passes" % i)
    print("inject: self-test: %d CRC vectors, %d packets of via-wire: ok" % (len(vectors), len(RUST_PACKETS)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--self-test", action="store_true", help="check the CRC and packet checksums, then exit")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--iface", default="eth0")
    ap.add_argument("--cm", action="store_true", help="also send garbage to the CM port")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--frames-from", metavar="NS", help="also send Ethernet frames from this namespace")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    if args.pid is None:
        ap.error("--pid is required")
    rng = random.Random(args.seed)

    port = find_port(args.pid, 10.0)
    sniff = Sniffer(args.iface, port)
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    counts = {k: 0 for k in ("garbage", "truncated", "oversized", "wrong-key", "replayed", "cm", "frames")}
    framer = socket_in(args.frames_from, args.iface) if args.frames_from else None
    with open("/sys/class/net/%s/address" % args.iface) as f:
        mac = bytes.fromhex(f.read().strip().replace(":", ""))

    def send_frames(packets):
        for f in frames(rng, packets, mac, port):
            try:
                framer.send(f)
                counts["frames"] += 1
            except OSError as e:
                print("inject: frame of %d bytes: %s" % (len(f), e), flush=True)

    def send(kind, datagrams, to=None):
        for d in datagrams:
            try:
                out.sendto(d, to or (host, port))
                counts[kind] += 1
            except OSError as e:
                print("inject: sendto %s (%d bytes): %s" % (kind, len(d), e), flush=True)

    # Learn from real traffic first.
    deadline = time.monotonic() + 5.0
    while len(sniff.data) < 16 and time.monotonic() < deadline:
        sniff.poll()
        time.sleep(0.001)
    if len(sniff.data) < 16:
        sys.exit("inject: saw %d data packets for port %d in 5 s; nothing to learn from" % (len(sniff.data), port))
    host = sniff.address
    print("inject: process %d receives on UDP %s:%d" % (args.pid, host, port), flush=True)

    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        sniff.poll()
        send("garbage", garbage(rng))
        send("truncated", truncated(rng, sniff.data))
        if rng.random() < 0.1:
            send("oversized", oversized(rng, sniff.data))
        send("wrong-key", wrong_key(rng, sniff.data))
        send("replayed", replayed(rng, sniff))
        if framer:
            send_frames(garbage(rng) + truncated(rng, sniff.data) + wrong_key(rng, sniff.data)
                        + replayed(rng, sniff))
        if args.cm:
            send("cm", [os.urandom(rng.randrange(0, 300)),
                        struct.pack(">HBBHI", 0x5643, 1, 1, 40, 0) + os.urandom(40)], (host, CM_PORT))
        time.sleep(0.001)

    print("inject: learned from %d packets (checksums of %d checked, %d bad)"
          % (sniff.seen, sniff.checked, sniff.bad_checksum))
    print("inject: sent " + ", ".join("%s %d" % kv for kv in counts.items()), flush=True)
    if framer and counts["frames"] == 0:
        sys.exit("inject: no frame could be sent")
    if sniff.bad_checksum:
        sys.exit("inject: %d captured packets fail this script's CRC-32C: the forgeries would be wrong"
                 % sniff.bad_checksum)


if __name__ == "__main__":
    main()
