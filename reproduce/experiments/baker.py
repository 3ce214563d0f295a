"""Baker, Farrell, Ong, Scott: TCP against VIA polling and VIA blocking,
both processes on one CPU or one CPU each, MTU 1500 against 9000 (their
Table 1 and Figures 2-5), between two hosts over the UDP transport."""

from lab import latency, peak, curve
from report import Section, mbps, us, compare, within

IDS = ["baker_table1", "baker_curves"]

UDP_WHY = ("openvia's UDP transport does more per message than the kernel's TCP on this path: a `sendmmsg` per "
           "message and a `recvmmsg` per poll, an 80-byte header with a CRC-32C, and its reliability protocol in user "
           "space (its 4-byte latency is several times the bare UDP floor, docs/performance.md); TCP over a veth pair "
           "takes no NIC interrupt and its small-message path is two system calls per side.")
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
    t1, cv = "baker_table1", "baker_curves"
    for cpu, what in (("same", "one CPU"), ("split", "two CPUs")):
        for label, name in ((poll, "polling"), (block, "blocking")):
            v = get(1500, cpu, label)
            s.paper_claim(papers, t1, "via_latency_below_tcp",
                          compare(get(1500, cpu, tcp), ">=", 1.5 * v if v else None,
                                  "%s, VIA %s: TCP %%s µs, 1.5 × VIA %%s µs" % (what, name)),
                          UDP_WHY)
    s.paper_claim(papers, t1, "uni_poll_equals_block",
                  within(get(1500, "same", poll), get(1500, "same", block), 1.25, "one CPU: polling %s µs, blocking %s µs"),
                  "a poller confined to one CPU yields it at every empty poll (docs/tuning.md), but each yield and "
                  "each `recvmmsg` of the poll is a system call that a sleeping waiter does not make.")
    s.paper_claim(papers, t1, "smp_poll_not_above_block",
                  compare(get(1500, "split", poll), "<=", get(1500, "split", block), "polling %s µs, blocking %s µs"))
    s.paper_claim(papers, t1, "smp_raises_mvia_latency",
                  compare(get(1500, "split", poll), ">", get(1500, "same", poll), "two CPUs %s µs, one CPU %s µs"),
                  "M-VIA's SMP penalty came from kernel spinlocks that disabled interrupts; openvia's data path takes "
                  "no kernel lock, and two CPUs let both sides run at once.")
    s.paper_claim(papers, cv, "via_peak_exceeds_tcp",
                  compare(get(1500, "same", poll, "bw"), ">", get(1500, "same", tcp, "bw"),
                          "one CPU: VIA %s MB/s, TCP %s MB/s"),
                  "TCP hands the veth pair 64 KiB at a time (segmentation offload) while the UDP transport sends one "
                  "datagram per 1392-byte segment: per-packet work bounds the UDP transport.")
    s.paper_claim(papers, cv, "smp_lowers_mvia_peak",
                  compare(get(1500, "split", poll, "bw"), "<", 0.8 * (get(1500, "same", poll, "bw") or 0) or None,
                          "two CPUs %s MB/s, 0.8 × one CPU %s MB/s"),
                  "with a CPU each, sender and receiver work in parallel instead of taking turns.")
    s.paper_claim(papers, cv, "poll_slightly_above_block",
                  within(get(1500, "split", poll, "bw"), get(1500, "split", block, "bw"), 1.1,
                         "peak polling %s MB/s, blocking %s MB/s"),
                  "on two cores, two polling sides keep both CPUs busy, and the kernel's veth delivery and the "
                  "provider's helper thread wait for them; a blocking side leaves its CPU to that work.")
    s.paper_claim(papers, cv, "larger_mtu_raises_peak",
                  compare(get(9000, "split", poll, "bw"), ">", get(1500, "split", poll, "bw"),
                          "VIA: MTU 9000 %s MB/s, MTU 1500 %s MB/s"))
    s.paper_claim(papers, cv, "larger_mtu_raises_peak",
                  compare(get(9000, "split", tcp, "bw"), ">", get(1500, "split", tcp, "bw"),
                          "TCP: MTU 9000 %s MB/s, MTU 1500 %s MB/s"),
                  "TCP's segments already cross the veth pair 64 KiB at a time, so the MTU hardly changes its work.")
    return s
