"""Segment size and MTU of the network transport: Banikazemi et al.'s
throughput against packet size and half-bandwidth message size (their
Figures 11 and 13) and Yoon et al.'s segment sizes 1472, 4096, 8192 and
8958 bytes with MTUs to match."""

from lab import latency, peak, curve, half_bandwidth_size
from report import Section, mbps, us, compare, num, both

IDS = ["banikazemi_segment", "yoon_segment"]
TITLE = "Segment size and MTU of the network transport"

HEADERS = 108  # IPv4 20 + UDP 8 + openvia 80: the MTU that carries a segment whole
SEGMENTS = [512, 1000, 1024, 1472, 4096, 8192, 8958]


def mtu_for(seg):
    return max(1500, seg + HEADERS)


def run(lab):
    segs = [1024, 1472, 4096, 8958] if lab.quick else SEGMENTS
    sizes = ["--sizes", "4,16K,1M"] if lab.quick else ["--max-size", "4M"]
    data = {}
    for seg in segs:
        data[str(seg)] = lab.viabench("segment", "seg%d" % seg,
                                      ["--mode", "via-send", "--pattern", "pingpong,stream", "--segment", str(seg)]
                                      + sizes, across=True, mtu=mtu_for(seg))
    return data


def render(data, papers, plots):
    s = Section()
    rows, pp, st = [], [], []
    summary = {}
    for seg in SEGMENTS:
        rep = data.get(str(seg))
        if rep is None:
            continue
        ping = curve(rep, "via-send/pingpong/poll")
        stream = curve(rep, "via-send/stream/poll")
        pk, at = peak(rep, "via-send/pingpong/poll")
        spk, _ = peak(rep, "via-send/stream/poll")
        n_half = half_bandwidth_size(ping)
        summary[seg] = dict(lat=latency(rep, "via-send/pingpong/poll"), peak=pk, stream=spk, n_half=n_half)
        rows.append([seg, mtu_for(seg), us(summary[seg]["lat"]), mbps(pk), at or "–", mbps(spk),
                     num(n_half, "{:.0f}")])
        pp.append(("segment %d" % seg, [(b, v * 8) for b, v in ping]))
        st.append(("segment %d" % seg, [(b, v * 8) for b, v in stream]))
    s.table(["segment (bytes)", "MTU", "4 B one-way (µs)", "ping-pong peak (Mbit/s)", "at bytes",
             "stream peak (Mbit/s)", "n½ (bytes)"], rows)
    s.para("`viabench --segment` sets `VIA_SEGMENT_SIZE` on both hosts; the veth MTU is the segment plus the "
           "108 bytes of IPv4, UDP and openvia headers (at least 1500), so no segment is fragmented.  n½ is the "
           "block size at which ping-pong throughput reaches half its peak.")
    ref = papers.series("banikazemi_segment") + papers.series("yoon_segment")
    s.add(plots.panels("segment", "Throughput against block size per segment size (Banikazemi Fig. 11/13, Yoon)",
                       [("ping-pong", pp), ("stream", st)], "block size (bytes)", "Mbit/s", reference=ref))
    def ping_at(seg, size):
        for b, v in curve(data.get(str(seg)), "via-send/pingpong/poll"):
            if b == size:
                return v
        return None

    def stream(seg):
        return summary.get(seg, {}).get("stream")

    b, y = "banikazemi_segment", "yoon_segment"
    default = summary.get(1472, {})
    s.paper_claim(papers, b, "n_half_under_1k",
                  compare(default.get("n_half"), "<", 1024, "n½ with 1472-byte segments %s bytes, limit %s"),
                  "openvia's 4-byte one-way time is several microseconds, the time of several kilobytes at its "
                  "peak rate, so half the peak needs blocks of that size.")
    s.paper_claim(papers, b, "segment_size_saturates",
                  compare(stream(8958), "<=", 1.1 * stream(1024) if stream(1024) else None,
                          "stream peak at 8958-byte segments %s MB/s, 1.1 × at 1024 %s MB/s"),
                  "each segment costs a datagram, a system call share, a checksum and a session step; the fewer the "
                  "segments, the less work per byte, and nothing on a veth pair (no FIFO of a few packets) stops "
                  "larger ones.")
    s.paper_claim(papers, b, "page_aligned_segment_better",
                  compare(stream(1024), ">", stream(1000), "1024-byte segments %s MB/s, 1000-byte %s MB/s"),
                  "the UDP transport copies segments with the CPU; no DMA engine splits a segment at a page "
                  "boundary.")
    four = stream(4096)
    others = [stream(x) for x in (1472, 8192, 8958) if stream(x) is not None]
    s.paper_claim(papers, y, "page_segment_best",
                  compare(four, ">=", max(others) if others else None,
                          "4096-byte segments %s MB/s, best of 1472/8192/8958 %s MB/s"),
                  "openvia cuts segments from registered memory by address, not page by page, so a segment larger "
                  "than a page costs no extra setup; larger segments mean fewer datagrams.")
    s.paper_claim(papers, y, "larger_mtu_not_always_better",
                  compare(ping_at(8192, 16387) or ping_at(8192, 16384), "<", ping_at(4096, 16387) or ping_at(4096, 16384),
                          "16 KiB ping-pong at 8192-byte segments %s MB/s, at 4096 %s MB/s"),
                  "as above: no per-page splitting.")
    s.paper_claim(papers, y, "jumbo_vs_standard_crossover",
                  both(compare(ping_at(8958, 16384), "<", ping_at(1472, 16384), "16 KiB: 8958 %s MB/s, 1472 %s MB/s"),
                       compare(ping_at(8958, 1 << 20), ">", ping_at(1472, 1 << 20), "1 MiB: 8958 %s MB/s, 1472 %s MB/s")),
                  "fewer, larger datagrams are cheaper at every size here: the crossover M-VIA saw came from its "
                  "page-by-page segmentation and receive interrupts.")
    return s
