"""Baker, Farrell, Ong, Scott: TCP against VIA polling and VIA blocking,
both processes on one CPU or one CPU each, MTU 1500 against 9000 (their
Table 1 and Figures 2-5), between two hosts over the UDP transport."""

from lab import latency, peak, curve
from report import Section, mbps, us, compare

IDS = ["baker_table1", "baker_curves"]
TITLE = "TCP against VIA polling and blocking, one CPU or two, MTU 1500 and 9000"

CONTENDERS = [("via-send/pingpong/poll", "VIA polling"), ("via-send/pingpong/block", "VIA blocking"),
              ("tcp/pingpong/block", "TCP")]
CONFIGS = [(mtu, cpu, what) for mtu in (1500, 9000)
           for cpu, what in (("split", "one CPU each"), ("same", "both on one CPU"))]


def run(lab):
    sizes = ["--sizes", "4,64K"] if lab.quick else ["--max-size", "1M"]
    data = {}
    for mtu, cpu, _ in CONFIGS:
        tag = "mtu%d-%s" % (mtu, cpu)
        data[tag] = lab.viabench("baker", tag, ["--mode", "via-send,tcp", "--wait", "poll,block", "--cpu", cpu] + sizes,
                                 across=True, mtu=mtu)
    return data


def render(data, papers, plots):
    s = Section()
    rows, panels = [], []
    for mtu, cpu, what in CONFIGS:
        rep = data.get("mtu%d-%s" % (mtu, cpu))
        curves = []
        for label, name in CONTENDERS:
            bw, at = peak(rep, label)
            rows.append([name, what, mtu, us(latency(rep, label)), mbps(bw), at or "–"])
            curves.append((name, [(b, v * 8) for b, v in curve(rep, label)]))
        panels.append(("MTU %d, %s" % (mtu, what), curves))
    s.table(["contender", "CPUs", "MTU", "4 B one-way (µs)", "peak (Mbit/s)", "at bytes"], rows)
    s.para("Mbit/s = 10^6 bits per second, as the paper's Mbps.  TCP is the same ping-pong through the kernel's "
           "stack (TCP_NODELAY, blocking `recv`); VIA polling spins on `VipRecvDone`, VIA blocking sleeps in "
           "`VipRecvWait`.  \"Both on one CPU\" pins client and server to CPU 0, the counterpart of the paper's "
           "uniprocessor nodes: whoever polls takes the CPU its peer needs.")
    s.add(plots.panels("baker", "Throughput against block size (Baker et al., Figures 2-5)", panels,
                       "block size (bytes)", "Mbit/s", reference=papers.series("baker_curves")))

    def get(mtu, cpu, label, what="lat"):
        rep = data.get("mtu%d-%s" % (mtu, cpu))
        return latency(rep, label) if what == "lat" else peak(rep, label)[0]

    poll, block, tcp = (c for c, _ in CONTENDERS)
    s.claim("VIA's small-message latency is below TCP's",
            compare(get(1500, "split", poll), "<", get(1500, "split", tcp), "VIA polling %s µs, TCP %s µs"),
            "the UDP transport's per-message work (a system call per datagram on each side) is of the same order as "
            "TCP's over a veth pair, where no NIC interrupt separates them.")
    s.claim("polling gives lower latency than blocking",
            compare(get(1500, "split", poll), "<", get(1500, "split", block), "polling %s µs, blocking %s µs"),
            "a waiter spins for `VIA_SPIN_US` (50 µs) before it sleeps, so an answer that comes within the window "
            "is seen as quickly as by polling.")
    s.claim("VIA's peak throughput exceeds TCP's",
            compare(get(1500, "split", poll, "bw"), ">", get(1500, "split", tcp, "bw"), "VIA %s MB/s, TCP %s MB/s"),
            "TCP hands the kernel 64 KiB at a time (segmentation offload on the veth pair) while the UDP transport "
            "sends one datagram per MTU-sized segment: per-packet cost dominates.")
    s.claim("jumbo frames (MTU 9000) raise VIA's peak throughput",
            compare(get(9000, "split", poll, "bw"), ">", get(1500, "split", poll, "bw"),
                    "MTU 9000 %s MB/s, MTU 1500 %s MB/s"))
    s.claim("blocking is the better choice when both processes share one CPU",
            compare(get(1500, "same", block), "<", get(1500, "same", poll), "blocking %s µs, polling %s µs"),
            "the provider's polling loop yields nothing to the scheduler, yet the peer still ran often enough.")
    return s
