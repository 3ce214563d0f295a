"""Farrell, Ong, Scott: how TCP's socket buffers and the MTU decide its
throughput, against VIA, and M-VIA's 32 KiB limit per transfer."""

from lab import peak, curve
from report import Section, mbps, compare

IDS = ["farrell_tcp_tuning"]
TITLE = "TCP socket buffers and MTU against VIA"

BUFFERS = [None, 16 << 10, 64 << 10, 256 << 10, 4 << 20]


def name(buf):
    return "default" if buf is None else ("%d KiB" % (buf >> 10) if buf < 1 << 20 else "%d MiB" % (buf >> 20))


def run(lab):
    sizes = ["--sizes", "64K,1M"] if lab.quick else ["--sizes", "64,1K,8K,32K,64K,128K,256K,512K,1M,2M,4M"]
    buffers = [None, 64 << 10] if lab.quick else BUFFERS
    data = {}
    for mtu in (1500, 9000):
        for buf in buffers:
            args = ["--mode", "tcp", "--wait", "block"] + sizes + (["--sockbuf", str(buf)] if buf else [])
            data["mtu%d-tcp-%s" % (mtu, name(buf))] = lab.viabench("farrell", "mtu%d-tcp-%s" % (mtu, buf or 0), args,
                                                                  across=True, mtu=mtu)
        for desc in ("32K", "1M"):
            args = ["--mode", "via-send", "--wait", "poll", "--desc-size", desc] + sizes
            data["mtu%d-via-%s" % (mtu, desc)] = lab.viabench("farrell", "mtu%d-via-%s" % (mtu, desc), args,
                                                             across=True, mtu=mtu)
    return data


def render(data, papers, plots):
    s = Section()
    rows, panels = [], []
    for mtu in (1500, 9000):
        curves = []
        for buf in BUFFERS:
            rep = data.get("mtu%d-tcp-%s" % (mtu, name(buf)))
            if rep is None:
                continue
            bw, at = peak(rep, "tcp/pingpong/block")
            rows.append(["TCP, socket buffers %s" % name(buf), mtu, mbps(bw), at or "–"])
            curves.append(("TCP %s" % name(buf), [(b, v * 8) for b, v in curve(rep, "tcp/pingpong/block")]))
        for desc in ("32K", "1M"):
            rep = data.get("mtu%d-via-%s" % (mtu, desc))
            bw, at = peak(rep, "via-send/pingpong/poll")
            rows.append(["VIA, %s per descriptor" % desc, mtu, mbps(bw), at or "–"])
            curves.append(("VIA %s descriptors" % desc, [(b, v * 8) for b, v in curve(rep, "via-send/pingpong/poll")]))
        panels.append(("MTU %d" % mtu, curves))
    s.table(["contender", "MTU", "peak (Mbit/s)", "at bytes"], rows)
    s.para("TCP's socket buffers are set on both ends with `viabench --sockbuf` (SO_SNDBUF/SO_RCVBUF, forced past "
           "`net.core.*mem_max`); *default* is Linux's autotuning.  VIA with 32 KiB per descriptor splits every block "
           "into 32 KiB receives, as M-VIA's transfer limit forced NetPIPE-VIA to.")
    s.add(plots.panels("farrell", "Ping-pong throughput: TCP socket buffers and VIA (Farrell et al.)", panels,
                       "block size (bytes)", "Mbit/s", reference=papers.series("farrell_tcp_tuning")))

    def pk(mtu, key, label):
        return peak(data.get("mtu%d-%s" % (mtu, key)), label)[0]

    t = "tcp/pingpong/block"
    v = "via-send/pingpong/poll"
    f = "farrell_tcp_tuning"
    s.paper_claim(papers, f, "larger_mtu_doubles_tcp",
                  compare(pk(9000, "tcp-default", t), ">=", 2 * (pk(1500, "tcp-default", t) or 0) or None,
                          "TCP at MTU 9000 %s MB/s, 2 × at MTU 1500 %s MB/s"),
                  "TCP's segments cross the veth pair 64 KiB at a time whatever the MTU (segmentation offload), so "
                  "the MTU no longer sets how many packets TCP's stack handles.")
    s.paper_claim(papers, f, "bigger_socket_buffer_helps_tcp",
                  compare(pk(1500, "tcp-256 KiB", t), ">", pk(1500, "tcp-64 KiB", t), "256 KiB %s MB/s, 64 KiB %s MB/s"),
                  "a ping-pong has one block in flight at a time and the veth pair's round trip is microseconds, so a "
                  "64 KiB window already covers the bandwidth-delay product.")
    s.paper_claim(papers, f, "mvia_beats_tuned_tcp_mtu1500",
                  compare(pk(1500, "via-32K", v), ">", pk(1500, "tcp-256 KiB", t),
                          "VIA (32 KiB descriptors) %s MB/s, TCP (256 KiB buffers) %s MB/s"),
                  "TCP hands the veth pair 64 KiB at a time while the UDP transport sends one datagram per "
                  "1392-byte segment: per-packet work bounds the UDP transport.")
    s.claim("(openvia) splitting blocks into 32 KiB descriptors, as M-VIA's limit forced, costs throughput",
            compare(pk(1500, "via-32K", v), "<", pk(1500, "via-1M", v), "32 KiB %s MB/s, 1 MiB %s MB/s"),
            "a receive completion per 32 KiB is small next to moving the 32 KiB themselves.")
    return s
