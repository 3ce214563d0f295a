"""Banikazemi, Abali, Herger, Panda: the design alternatives of a VIA
provider.  Doorbells per VI (D1) against one central send queue (D2);
completion queues written by the provider (CQ1) against VipCQDone polling
the work queues (CQ2); small messages copied inline against referenced in
registered memory; where a small message's time goes."""

from lab import latency, curve
from report import Section, both, compare, grows, flat, us, within

IDS = ["banikazemi_doorbells", "banikazemi_cqdone", "banikazemi_inline", "banikazemi_breakdown"]
TITLE = "Design alternatives: doorbells, completion queues, inline sends, the time of a small message"

VIS = [1, 2, 4, 8, 16, 32, 64, 128]
DESIGNS = [("direct", {"VIA_DOORBELL": "direct"}), ("D1", {"VIA_DOORBELL": "d1"}), ("D2", {"VIA_DOORBELL": "d2"}),
           ("CQ2", {"VIA_CQ": "cq2"})]
INLINE = [0, 64, 256, 1024]
# Profiled 4-byte ping-pongs (tag, size, settings, across hosts).
BREAKDOWNS = [("shm-direct", 4, {}, False), ("shm-direct-1k", 1024, {}, False), ("shm-d2", 4, {"VIA_DOORBELL": "d2"}, False),
              ("shm-cq1", 4, {"VIA_CQ": "cq1"}, False), ("shm-cq2", 4, {"VIA_CQ": "cq2"}, False), ("udp", 4, {}, True)]
STAGES = [("post_send_ns", "post_send_calls", "VipPostSend"), ("validate_ns", "post_send_calls", "validate"),
          ("doorbell_ns", "doorbell_rings", "doorbell"), ("transfer_ns", "transfers", "transfer"),
          ("complete_ns", "completions", "complete"), ("receive_ns", "receives", "receive"),
          ("cq_done_ns", "cq_done_calls", "VipCQDone")]


def run(lab):
    data = {"vis": {}, "cq": {}, "inline": {}, "breakdown": {}}
    vis = [1, 16] if lab.quick else VIS
    for design, settings in DESIGNS:
        for n in vis:
            rep = lab.viabench("banikazemi", "vis-%s-%d" % (design, n),
                               ["--mode", "via-send", "--vis", str(n), "--sizes", "4"], settings)
            data["vis"]["%s/%d" % (design, n)] = latency(rep, "via-send/pingpong/poll/vis%d" % n)
    flt = "VipCQDone empty CQ/VIs attached/(1|16)$" if lab.quick else "VipCQDone empty CQ"
    for cq in ("cq1", "cq2"):
        found = lab.criterion("banikazemi", "cqdone-" + cq, flt, {"VIA_CQ": cq})
        data["cq"][cq] = {k.rsplit("/", 1)[-1]: v for k, v in found.items()}
    sizes = ["--sizes", "4,512,1K"] if lab.quick else ["--max-size", "4K"]
    for n in INLINE:
        rep = lab.viabench("banikazemi", "inline-%d" % n, ["--mode", "via-send"] + sizes, {"VIA_INLINE_MAX": str(n)})
        data["inline"][str(n)] = curve(rep, "via-send/pingpong/poll", "one_way_us")
    for tag, size, settings, across in BREAKDOWNS:
        path = lab.profile_path("banikazemi", "breakdown-" + tag)
        settings = dict(settings, VIA_PROFILE=path)
        vis = ["--vis", "1"] if "VIA_CQ" in settings else []
        rep = lab.viabench("banikazemi", "breakdown-" + tag, ["--mode", "via-send", "--sizes", str(size)] + vis,
                           settings, across=across)
        label = "via-send/pingpong/poll" + ("/vis1" if vis else "")
        data["breakdown"][tag] = {"one_way_us": latency(rep, label, size),
                                  "stages": stage_means(lab.profiles(path))}
    return data


def stage_means(profiles):
    """Mean ns per call of each stage, over the NICs that sent messages."""
    sums = {}
    for p in profiles:
        c = p.get("counters", {})
        if not c.get("msgs_sent"):
            continue
        for ns, calls, _ in STAGES:
            t, n = sums.get(ns, (0, 0))
            sums[ns] = (t + c.get(ns, 0), n + c.get(calls, 0))
    return {name: (sums[ns][0] / sums[ns][1] if sums.get(ns, (0, 0))[1] else None) for ns, _, name in STAGES}


def render(data, papers, plots):
    s = Section()
    # Doorbells and CQ designs against the number of VIs.
    lat = {d: [(n, data["vis"].get("%s/%d" % (d, n))) for n in VIS if ("%s/%d" % (d, n)) in data["vis"]]
           for d, _ in DESIGNS}
    ns = sorted({n for pts in lat.values() for n, _ in pts})
    s.table(["active VIs"] + [d for d, _ in DESIGNS],
            [[n] + [us(dict(lat[d]).get(n)) for d, _ in DESIGNS] for n in ns])
    s.para("4-byte one-way latency (µs, polling, shared memory) with N connected VIs on one CQ used in turn "
           "(`viabench --vis N`).  *direct*: `VipPostSend` carries the send out itself; *D1*: a doorbell per VI that "
           "the send engine scans; *D2*: one central send queue; *CQ2*: direct doorbells, `VipCQDone` polls the "
           "work queues (`VIA_DOORBELL`, `VIA_CQ`, docs/tuning.md).")
    s.add(plots.panels("doorbells", "Latency against active VIs (Banikazemi et al., D1/D2)",
                       [("4-byte one-way latency", [(d, [(n, v) for n, v in pts if v]) for d, pts in lat.items()])],
                       "active VIs", "µs", reference=papers.series("banikazemi_doorbells")))
    b = "banikazemi_doorbells"
    d1, d2 = dict(lat["D1"]), dict(lat["D2"])
    g, f = grows(lat["D1"], 1.5, "D1"), flat(lat["D2"], 1.5, "D2")
    s.paper_claim(papers, b, "d1_grows_with_vis_d2_flat", both(g, f),
                  "the send engine's scan of a VI's doorbell is one flag test in the caches of this CPU, a few "
                  "nanoseconds against the microseconds a scan of doorbells across the I/O bus took; what grows with "
                  "the number of VIs here is the memory the VIs' connections occupy, whatever the doorbell.")
    n_max = max((n for n, v in lat["D1"] if v), default=None)
    s.paper_claim(papers, b, "d1_cheaper_with_one_vi",
                  compare(d1.get(1), "<", d2.get(1), "one VI: D1 %s µs, D2 %s µs"),
                  "D2 enters no kernel here: both doorbells are a queue in memory and a flag or futex word.")
    s.paper_claim(papers, b, "d2_wins_with_many_vis",
                  compare(d2.get(n_max), "<", d1.get(n_max), "%s VIs: D2 %%s µs, D1 %%s µs" % n_max),
                  "scanning the doorbells of all VIs costs little next to the rest of a message's path (above).")
    # CQ1 against CQ2.
    cq = data["cq"]
    ks = sorted({int(k) for c in cq.values() for k in c})
    s.table(["work queues on the CQ", "CQ1 (ns)", "CQ2 (ns)"],
            [[k, us(cq.get("cq1", {}).get(str(k))), us(cq.get("cq2", {}).get(str(k)))] for k in ks])
    s.para("`VipCQDone` on an empty CQ with k receive queues attached (criterion, "
           "`cargo bench -p viabench --bench vipl -- 'VipCQDone empty CQ'` under `VIA_CQ=cq1` and `cq2`).  With CQ1 "
           "the cost of a CQ entry is paid by whoever completes a descriptor (the `complete` and `receive` stages "
           "below).")
    cq_pts = {c: [(k, cq.get(c, {}).get(str(k))) for k in ks] for c in ("cq1", "cq2")}
    s.add(plots.panels("cqdone", "VipCQDone against work queues per CQ (Banikazemi et al., Table 3)",
                       [("empty VipCQDone", [(c.upper(), [(k, v) for k, v in pts if v]) for c, pts in cq_pts.items()])],
                       "work queues on the CQ", "ns", reference=papers.series("banikazemi_cqdone")))
    c = "banikazemi_cqdone"
    s.paper_claim(papers, c, "cq2_linear_in_queues", both(grows(cq_pts["cq2"], 8, "CQ2"), flat(cq_pts["cq1"], 2.0, "CQ1")))
    # The whole cost of each design, entry writing included, is in the
    # latency of a message on a CQ: direct doorbells with CQ1 against CQ2.
    cq1_lat, cq2_lat = dict(lat["direct"]), dict(lat["CQ2"])
    few = [n for n in ns if n <= 8 and cq1_lat.get(n) and cq2_lat.get(n)]
    many = max((n for n in ns if cq1_lat.get(n) and cq2_lat.get(n)), default=None)
    s.paper_claim(papers, c, "cq2_cheaper_small_k",
                  compare(max((cq2_lat[n] - cq1_lat[n] for n in few), default=None), "<", 0,
                          "largest CQ2 − CQ1 latency difference up to 8 VIs %s µs, against %s"),
                  "pushing a CQ entry is a store into shared memory that the consumer's cache already holds, not a "
                  "DMA across the I/O bus, so CQ1 costs a few tens of nanoseconds per completion.")
    s.paper_claim(papers, c, "cq1_wins_many_queues",
                  compare(cq2_lat.get(many), ">", cq1_lat.get(many),
                          "%s VIs: CQ2 %%s µs, CQ1 %%s µs (4-byte one-way, table above)" % many))
    # Inline threshold.
    inl = data["inline"]
    s.add(plots.panels("inline", "Latency against size, inline threshold (Banikazemi et al., Figure 10)",
                       [("one-way latency", [("VIA_INLINE_MAX=%s" % n, [tuple(p) for p in inl.get(str(n), [])])
                                             for n in INLINE])],
                       "message size (bytes)", "µs", reference=papers.series("banikazemi_inline")))

    def at(n, size):
        return dict((b, v) for b, v in inl.get(str(n), [])).get(size)

    sizes = sorted({b for pts in inl.values() for b, _ in pts if b <= 1024})
    pick = [b for b in sizes if b in (4, 64, 256, 512, 1024)] or sizes[:5]
    s.table(["bytes"] + ["inline ≤ %d" % n for n in INLINE], [[b] + [us(at(n, b)) for n in INLINE] for b in pick])
    i = "banikazemi_inline"
    s.paper_claim(papers, i, "pio_beats_dma_small",
                  compare(at(1024, 4), "<", at(0, 4), "4 bytes inline %s µs, by reference %s µs"))
    s.paper_claim(papers, i, "dma_beats_pio_larger",
                  compare(at(0, 1024), "<", at(1024, 1024), "1 KiB by reference %s µs, inline %s µs"),
                  "a 1 KiB copy through the ring costs less than the system call of a cross-memory copy, so "
                  "inline sends stay ahead up to the ring slot's size.")
    # Breakdown.
    bd = data["breakdown"]
    rows, groups = [], []
    for tag, what in (("shm-direct", "shared memory, direct"), ("shm-direct-1k", "shared memory, direct, 1 KiB"),
                      ("shm-d2", "shared memory, D2"), ("shm-cq1", "shared memory, on a CQ, CQ1"),
                      ("shm-cq2", "shared memory, on a CQ, CQ2"), ("udp", "UDP transport")):
        b = bd.get(tag, {})
        st = b.get("stages", {})
        rows.append([what, us(b.get("one_way_us"))] + [us(st.get(n) / 1000 if st.get(n) else None)
                                                       for _, _, n in STAGES])
        parts = [(n, (st.get(n) or 0) / 1000) for _, _, n in STAGES if n not in ("VipPostSend",)]
        rest = (b.get("one_way_us") or 0) - (st.get("VipPostSend") or 0) / 1000 - sum(
            v for n, v in parts if n in ("doorbell", "receive"))
        groups.append((what, parts + [("rest of the one-way time", max(rest, 0))]))
    s.table(["path", "one-way (µs)"] + [n + " (µs)" for _, _, n in STAGES], rows)
    s.para("Mean time per call of each stage of the data path, from the provider's own timers "
           "(`VIA_PROFILE`, docs/tuning.md), 4-byte ping-pong unless noted.  `validate`, `doorbell`, `transfer` and `complete` "
           "are parts of `VipPostSend` (the doorbell only with D1/D2); the rest of the one-way time is the peer "
           "noticing the message and the application's own loop.")
    s.add(plots.bars("breakdown", "Where a 4-byte message's time goes (Banikazemi et al., Figure 9)", groups, "µs",
                     stacked_labels=[n for _, _, n in STAGES if n != "VipPostSend"] + ["rest of the one-way time"]))
    k = "banikazemi_breakdown"
    small_ = bd.get("shm-direct", {}).get("stages", {})
    large_ = bd.get("shm-direct-1k", {}).get("stages", {})
    s.paper_claim(papers, k, "host_overhead_size_independent",
                  within(small_.get("VipPostSend"), large_.get("VipPostSend"), 1.5,
                         "VipPostSend at 4 B %s ns, at 1 KiB %s ns"),
                  "small sends are copied inline into the ring, so a 1 KiB send copies 1 KiB more in VipPostSend.")
    s.paper_claim(papers, k, "host_overhead_dominated_by_kernel_and_pio",
                  compare(small_.get("transfer"), ">", small_.get("validate"),
                          "handing the message on (transfer) %s ns, user-space processing (validate) %s ns"))
    one_way = bd.get("shm-direct", {}).get("one_way_us")
    parts = [small_.get("VipPostSend"), small_.get("receive")]
    s.paper_claim(papers, k, "stage_sum_below_latency",
                  compare(sum(parts) / 1000 if all(parts) else None, "<", one_way,
                          "VipPostSend + receive %s µs, one-way %s µs"))
    return s


