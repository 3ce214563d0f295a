"""McKenzie's TTCP-VIA: bursts of 1 to 4096 back-to-back messages, VIA
against TCP, and their spread across repetitions."""

import statistics

from experiments.baker import UDP_WHY
from lab import row
from report import Section, us, compare

IDS = ["mckenzie_ttcp"]
TITLE = "Bursts of back-to-back messages (TTCP-VIA), VIA against TCP"

BURSTS = [1, 4, 16, 64, 256, 1024, 4096]
SIZES = [1, 512, 8192]
MODES = [("via-send", "poll", "VIA"), ("tcp", "block", "TCP")]


def run(lab):
    bursts = [1, 64] if lab.quick else BURSTS
    sizes = "1,512" if lab.quick else ",".join(map(str, SIZES))
    trials = ["--trials", "2", "--min-time", "0.003"] if lab.quick else ["--trials", "5", "--min-time", "0.01"]
    data = {}
    for mode, wait, _ in MODES:
        data[mode] = lab.viabench("mckenzie", mode,
                                  ["--mode", mode, "--wait", wait, "--sizes", sizes, "--max-time", "0.5",
                                   "--pattern", ",".join("burst:%d" % n for n in bursts)] + trials,
                                  across=True, trials=False)
    return data


def spread(rep, label, size):
    """(median, min, max) µs per message over the trials."""
    r = row(rep, label, size)
    if not r or not r.get("trial_us"):
        return None
    xs = r["trial_us"]
    return statistics.median(xs), min(xs), max(xs)


def render(data, papers, plots):
    s = Section()
    rows, panels = [], []
    for size in SIZES:
        curves = []
        for mode, wait, name in MODES:
            pts = []
            for n in BURSTS:
                sp = spread(data.get(mode), "%s/burst%d/%s" % (mode, n, wait), size)
                if sp:
                    pts.append((n, sp[0]))
                    rows.append([size, name, n, us(sp[0]), "%s – %s" % (us(sp[1]), us(sp[2])),
                                 us(sp[0] * n)])
            curves.append((name, pts))
        panels.append(("%d-byte messages" % size, curves))
    s.table(["bytes", "stack", "messages per burst", "µs per message (median)", "spread (min – max)",
             "burst round trip (µs)"], rows)
    s.para("`viabench --pattern burst:N`: N messages back to back, then one reply; time per message, median of "
           "the trials with their spread; the burst's round trip is N times that.  VIA polls, TCP blocks in `recv`.")
    s.add(plots.panels("ttcp", "Time per message against burst length (McKenzie's TTCP-VIA)", panels,
                       "messages per burst", "µs per message", logy=True, reference=papers.series("mckenzie_ttcp")))

    def med(mode, n, size):
        wait = dict((m, w) for m, w, _ in MODES)[mode]
        sp = spread(data.get(mode), "%s/burst%d/%s" % (mode, n, wait), size)
        return sp[0] if sp else None

    m = "mckenzie_ttcp"
    v1, t1 = med("via-send", 1, 1), med("tcp", 1, 1)
    s.paper_claim(papers, m, "via_rtt_half_tcp_small",
                  compare(v1, "<=", 0.6 * t1 if t1 else None, "1 B: VIA %s µs, 0.6 × TCP %s µs"),
                  UDP_WHY)
    for size in SIZES:
        s.paper_claim(papers, m, "via_faster_all_sizes",
                      compare(med("via-send", 1, size), "<", med("tcp", 1, size),
                              "%d B: VIA %%s µs, TCP %%s µs" % size),
                      UDP_WHY + "  At 8 KiB the UDP transport also cuts the message into six datagrams "
                      "where TCP passes one 8 KiB segment.")

    def swing(mode):
        vals = [med(mode, n, 1) for n in BURSTS]
        vals = [v for v in vals if v]
        return max(vals) / min(vals) if len(vals) > 1 else None

    s.paper_claim(papers, m, "via_consistent_across_burst",
                  compare(swing("via-send"), "<", swing("tcp"),
                          "1 B, slowest/fastest over burst lengths: VIA %s, TCP %s"),
                  "both stacks pipeline a burst here; VIA's single message pays its full round trip, so its "
                  "per-message time falls as much as TCP's.")
    gap = [(med("tcp", n, 1) or 0) - (med("via-send", n, 1) or 0) if med("tcp", n, 1) and med("via-send", n, 1)
           else None for n in (1, BURSTS[-1])]
    s.paper_claim(papers, m, "gap_shrinks_with_burst",
                  compare(gap[0], ">", gap[1], "1 B, TCP − VIA: single %%s µs, burst of %d %%s µs" % BURSTS[-1]))
    return s
