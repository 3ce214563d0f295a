"""McKenzie's TTCP-VIA: bursts of 1 to 4096 back-to-back messages, VIA
against TCP, and their spread across repetitions."""

import statistics

from lab import test
from report import Section, us, compare

IDS = ["mckenzie_ttcp"]
TITLE = "Bursts of back-to-back messages (TTCP-VIA), VIA against TCP"

BURSTS = [1, 4, 16, 64, 256, 1024, 4096]
SIZES = [4, 256, 4096, 32768]
MODES = [("via-send", "poll", "VIA"), ("tcp", "block", "TCP")]


def run(lab):
    bursts = [1, 64] if lab.quick else BURSTS
    sizes = "4,1K" if lab.quick else ",".join(map(str, SIZES))
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
    t = test(rep, label)
    if not t:
        return None
    for r in t["rows"]:
        if r["bytes"] == size and r.get("trial_us"):
            xs = r["trial_us"]
            return statistics.median(xs), min(xs), max(xs)
    return None


def render(data, papers, plots):
    s = Section()
    rows, panels = [], []
    for size in SIZES:
        curves = []
        for mode, wait, name in MODES:
            pts = []
            for n in BURSTS:
                sp = spread(data.get(mode), "%s/burst:%d/%s" % (mode, n, wait), size)
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
        sp = spread(data.get(mode), "%s/burst:%d/%s" % (mode, n, wait), size)
        return sp[0] if sp else None

    s.claim("VIA's time per message is below TCP's for small messages",
            compare(med("via-send", 1, 4), "<", med("tcp", 1, 4), "4 B single messages: VIA %s µs, TCP %s µs"))
    s.claim("bursts lower the time per message (the pipeline fills)",
            compare(med("via-send", 64, 4), "<", med("via-send", 1, 4), "VIA 4 B: burst of 64 %s µs, single %s µs"))
    s.claim("VIA keeps its lead over TCP in long bursts",
            compare(med("via-send", 1024, 4096), "<", med("tcp", 1024, 4096),
                    "4 KiB bursts of 1024: VIA %s µs, TCP %s µs"),
            "in long bursts TCP coalesces many small writes into large segments and the kernel copies them in bulk, "
            "while the UDP transport sends a datagram per message.")
    return s
