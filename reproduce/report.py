"""The pieces a report section is made of: tables, plots, the paper's
published numbers, and conclusions checked against the measurements."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


# ---------------------------------------------------------------- numbers


def num(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def us(x):
    return num(x, "{:.2f}")


def mbps(mb_per_s):
    """10^6 bytes/s as 10^6 bits/s."""
    return num(None if mb_per_s is None else mb_per_s * 8, "{:.0f}")


# Two measurements closer than this (relative to the larger) do not decide
# a strict comparison: the spread between runs on a shared machine is larger.
MARGIN = 0.05


def compare(a, op, b, evidence):
    """(holds, evidence): whether `a op b`, with both values written into
    `evidence` (two `%s`); holds is None when either was not measured, or
    when `<` or `>` is asked of values within `MARGIN` of each other."""
    text = evidence % (num(a, "{:.3g}"), num(b, "{:.3g}"))
    if a is None or b is None:
        return None, text + " (not measured)"
    if op in ("<", ">") and abs(a - b) <= MARGIN * max(abs(a), abs(b)):
        return None, text + " (within %d %%: too close to call)" % round(MARGIN * 100)
    holds = {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
    return holds, text


def grows(points, factor, evidence):
    """(holds, evidence): whether the last y is at least `factor` times the
    first; `points` are (x, y) sorted by x."""
    pts = [(x, y) for x, y in points if y is not None]
    if len(pts) < 2:
        return None, evidence + " (not measured)"
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    r = y1 / y0 if y0 else float("inf")
    return r >= factor, "%s: %.3g at %s, %.3g at %s (%.2f×)" % (evidence, y0, x0, y1, x1, r)


def both(a, b):
    """Two verdicts that must both hold."""
    holds = None if a[0] is None or b[0] is None else a[0] and b[0]
    return holds, a[1] + "; " + b[1]


def within(a, b, factor, evidence):
    """(holds, evidence): whether a and b differ by less than `factor`."""
    text = evidence % (num(a, "{:.3g}"), num(b, "{:.3g}"))
    if not a or not b:
        return None, text + " (not measured)"
    r = max(a, b) / min(a, b)
    return r < factor, "%s (%.2f×)" % (text, r)


def flat(points, factor, evidence):
    """(holds, evidence): whether the largest y is below `factor` times the
    smallest."""
    ys = [y for _, y in points if y is not None]
    if len(ys) < 2:
        return None, evidence + " (not measured)"
    r = max(ys) / min(ys) if min(ys) else float("inf")
    return r < factor, "%s: from %.3g to %.3g (%.2f×)" % (evidence, min(ys), max(ys), r)


# ---------------------------------------------------------------- papers


class Papers:
    """The published numbers and findings (`papers.json`)."""

    def __init__(self, data):
        self.data = data

    def experiment(self, eid):
        return self.data.get("experiments", {}).get(eid, {})

    def paper(self, key):
        return self.data.get("papers", {}).get(key, {})

    def claim(self, eid, cid):
        for c in self.experiment(eid).get("claims", []):
            if c.get("id") == cid:
                return c.get("text")
        return None

    def series(self, eid):
        return self.experiment(eid).get("series", [])


# ---------------------------------------------------------------- sections


class Section:
    """Markdown for one experiment, and its checked conclusions."""

    def __init__(self):
        self.parts = []
        self.verdicts = []

    def para(self, text):
        self.parts.append(text)

    def table(self, headers, rows):
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
        self.parts.append("\n".join(lines))

    def add(self, markdown):
        if markdown:
            self.parts.append(markdown)

    def claim(self, text, verdict, why_not=""):
        """A conclusion of the paper, checked; `why_not` explains a
        conclusion that does not hold here."""
        holds, evidence = verdict
        self.verdicts.append((text, holds, evidence, why_not if holds is False else ""))

    def paper_claim(self, papers, eid, cid, verdict, why_not=""):
        """A conclusion the paper states (`papers.json`), checked."""
        text = papers.claim(eid, cid) or cid
        self.claim(text, verdict, why_not)

    def markdown(self):
        out = list(self.parts)
        if self.verdicts:
            lines = ["| the paper's conclusion | on this machine | measured |", "|---|---|---|"]
            for text, holds, evidence, _ in self.verdicts:
                mark = {True: "holds", False: "**does not hold**", None: "undecided"}[holds]
                lines.append("| %s | %s | %s |" % (text, mark, evidence))
            out.append("\n".join(lines))
            whys = []
            for t, _, _, w in self.verdicts:
                line = "- *%s* does not hold here: %s" % (t, w)
                if w and line not in whys:
                    whys.append(line)
            if whys:
                out.append("Why:\n\n" + "\n".join(whys))
        return "\n\n".join(out)


def reference_block(papers, eid):
    """The paper's published numbers for an experiment, as markdown."""
    e = papers.experiment(eid)
    if not e:
        return ""
    parts = []
    values = e.get("values", [])
    if values:
        lines = ["| published (%s) | value |" % e.get("source", "the paper"), "|---|---:|"]
        for v in values:
            lines.append("| %s | %s %s |" % (v["name"], v["value"], v.get("unit", "")))
        parts.append("\n".join(lines))
    for sr in e.get("series", []):
        pts = ", ".join("%s: %s" % (x, y) for x, y in sr.get("points", []))
        parts.append("*%s* (%s; %s against %s): %s" % (sr["label"], sr.get("source", ""), sr.get("y", ""),
                                                        sr.get("x", ""), pts))
    if e.get("note"):
        parts.append("*About the published data:* " + e["note"])
    return "\n\n".join(parts)


# ---------------------------------------------------------------- plots


class Plots:
    """SVG plots under `directory`, linked from the report by `prefix/name`."""

    def __init__(self, directory, prefix):
        self.directory, self.prefix = directory, prefix
        os.makedirs(directory, exist_ok=True)

    def _save(self, fig, name, caption):
        path = os.path.join(self.directory, name + ".svg")
        fig.savefig(path, bbox_inches="tight", metadata={"Date": None})
        plt.close(fig)
        return "![%s](%s/%s.svg)" % (caption, self.prefix, name)

    def panels(self, name, title, panels, xlabel, ylabel, logx=True, logy=False, reference=None, ref_ylabel=None):
        """One subplot per (title, [(label, [(x, y)])]); with `reference`
        (the paper's series), one more subplot of the published curves."""
        panels = [p for p in panels if any(pts for _, pts in p[1])]
        extra = 1 if reference else 0
        n = len(panels) + extra
        if n == 0:
            return ""
        cols = min(n, 3)
        rows = (n + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
        flat_axes = [a for r in axes for a in r]
        for ax, (ptitle, curves) in zip(flat_axes, panels):
            for label, pts in curves:
                if pts:
                    xs, ys = zip(*sorted(pts))
                    ax.plot(xs, ys, marker=".", markersize=3, label=label)
            self._axes(ax, ptitle, xlabel, ylabel, logx, logy)
        if reference:
            ax = flat_axes[len(panels)]
            for sr in reference:
                if sr.get("points"):
                    xs, ys = zip(*sorted(sr["points"]))
                    ax.plot(xs, ys, marker="o", markersize=3, linestyle="--", label=sr["label"])
            self._axes(ax, "published", reference[0].get("x", xlabel), ref_ylabel or reference[0].get("y", ""),
                       logx, logy)
        for ax in flat_axes[n:]:
            ax.set_visible(False)
        fig.suptitle(title)
        fig.tight_layout()
        return self._save(fig, name, title)

    def bars(self, name, title, groups, ylabel, stacked_labels=None):
        """Grouped bars: groups = [(group label, [(bar label, value)])], or
        with `stacked_labels`, one stacked bar per group of those parts."""
        if not groups:
            return ""
        fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(groups) + 2), 3.8))
        if stacked_labels:
            bottoms = [0.0] * len(groups)
            for part in stacked_labels:
                vals = [dict(g[1]).get(part, 0) or 0 for g in groups]
                ax.bar(range(len(groups)), vals, bottom=bottoms, label=part)
                bottoms = [b + v for b, v in zip(bottoms, vals)]
        else:
            labels = []
            for _, bars in groups:
                for lab, _ in bars:
                    if lab not in labels:
                        labels.append(lab)
            width = 0.8 / max(1, len(labels))
            for i, lab in enumerate(labels):
                vals = [dict(g[1]).get(lab) or 0 for g in groups]
                ax.bar([k + i * width - 0.4 + width / 2 for k in range(len(groups))], vals, width, label=lab)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([g[0] for g in groups], rotation=15, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        return self._save(fig, name, title)

    @staticmethod
    def _axes(ax, title, xlabel, ylabel, logx, logy):
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
