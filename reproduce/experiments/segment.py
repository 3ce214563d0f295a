"""Segment size and MTU of the network transport: Banikazemi et al.'s
throughput against packet size and half-bandwidth message size (their
Figures 11 and 13) and Yoon et al.'s segment sizes 1472, 4096, 8192 and
8958 bytes with MTUs to match."""

from lab import latency, peak, curve, half_bandwidth_size
from report import Section, mbps, us, compare, num

IDS = ["banikazemi_segment", "yoon_segment"]
TITLE = "Segment size and MTU of the network transport"

HEADERS = 108  # IPv4 20 + UDP 8 + openvia 80: the MTU that carries a segment whole
SEGMENTS = [512, 1024, 1472, 4096, 8192, 8958]


def mtu_for(seg):
    return max(1500, seg + HEADERS)


def run(lab):
    segs = [1472, 8958] if lab.quick else SEGMENTS
    sizes = ["--sizes", "4,64K"] if lab.quick else ["--max-size", "4M"]
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
    small, large = summary.get(1472, {}), summary.get(8958, {})
    s.claim("larger segments (and MTUs) give higher peak throughput",
            compare(large.get("stream"), ">", small.get("stream"), "8958-byte segments %s MB/s, 1472-byte %s MB/s"))
    s.claim("larger segments do not lower small-message latency",
            compare(large.get("lat"), ">=", 0.9 * small["lat"] if small.get("lat") else None,
                    "4 B at 8958-byte segments %s µs, 0.9 × at 1472 %s µs"))
    s.claim("the half-bandwidth message size grows with the segment size",
            compare(large.get("n_half"), ">", small.get("n_half"), "n½ at 8958 %s bytes, at 1472 %s bytes"),
            "n½ follows the peak: a transport whose peak is limited by per-packet work reaches half of it at sizes "
            "set by that work, not by the segment.")
    return s
