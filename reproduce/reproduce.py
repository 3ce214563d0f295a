"""Runs the experiments of the VIA papers on openvia and writes the report.

    reproduce.py [--quick] [--only NAME,...] [--reuse] [--out DIR] [--report FILE]

--quick    a reduced run of every experiment (the CI smoke run)
--only     experiments to measure (baker, farrell, banikazemi, segment, yoon, mckenzie);
           the others are reported from their earlier results in --out, if any
--reuse    measure nothing: render the report from the raw results in --out
"""

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from lab import Lab  # noqa: E402
from report import Papers, Plots, reference_block  # noqa: E402
from experiments import baker, farrell, banikazemi, segment, yoon, mckenzie  # noqa: E402

EXPERIMENTS = {m.__name__.split(".")[-1]: m for m in (baker, farrell, banikazemi, segment, yoon, mckenzie)}


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%d CPUs (%s), %s %s" % (os.cpu_count() or 0, model, platform.system(), platform.release())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--report", default=os.path.join(HERE, "report.md"))
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(EXPERIMENTS)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        ap.error("unknown experiment %s (known: %s)" % (", ".join(unknown), ", ".join(EXPERIMENTS)))
    root = os.path.dirname(HERE)
    out = os.path.abspath(args.out)
    report_path = os.path.abspath(args.report)
    with open(os.path.join(HERE, "papers.json")) as f:
        papers = Papers(json.load(f))

    def log(text):
        print(text, file=sys.stderr, flush=True)

    lab = Lab(root, out, quick=args.quick, reuse=args.reuse, log=log)
    started = time.time()
    results, notes = {}, {}
    try:
        for name in EXPERIMENTS:
            path = os.path.join(out, name + ".data.json")
            notes_path = os.path.join(out, name + ".notes.json")
            if args.reuse or name not in names:
                results[name] = Lab.load(path)
                notes[name] = Lab.load(notes_path) or []
                continue
            log("== %s: %s" % (name, EXPERIMENTS[name].TITLE))
            before = len(lab.notes)
            results[name] = EXPERIMENTS[name].run(lab)
            notes[name] = lab.notes[before:]
            with open(path, "w") as f:
                json.dump(results[name], f)
            with open(notes_path, "w") as f:
                json.dump(notes[name], f)
    finally:
        lab.close()
    elapsed = time.time() - started
    run_path = os.path.join(out, "run.json")
    if args.reuse:
        run = Lab.load(run_path) or {"minutes": 0, "quick": args.quick}
    else:
        run = {"minutes": elapsed / 60, "quick": args.quick, "measured": names,
               "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))}
        with open(run_path, "w") as f:
            json.dump(run, f)

    plot_dir = os.path.join(os.path.dirname(report_path), "plots")
    plots = Plots(plot_dir, os.path.relpath(plot_dir, os.path.dirname(report_path)))
    summary, body = [], []
    for name, module in EXPERIMENTS.items():
        data = results.get(name)
        body.append("## %s\n" % module.TITLE)
        for eid in module.IDS:
            e = papers.experiment(eid)
            paper = papers.paper(e.get("paper", ""))
            body.append("### %s — %s\n" % (paper.get("short", eid), e.get("source", "")))
            if e.get("question"):
                body.append("*Question:* %s\n" % e["question"])
            if e.get("finding"):
                body.append("*What the paper found:* %s\n" % e["finding"])
            if paper.get("cite"):
                body.append("*Paper:* %s\n" % paper["cite"])
            if paper.get("hardware"):
                body.append("*Their testbed:* %s\n" % paper["hardware"])
            ref = reference_block(papers, eid)
            if ref:
                body.append(ref + "\n")
        body.append("### openvia on this machine\n")
        if data is None:
            body.append("Not measured (no raw results in `%s`).\n" % os.path.relpath(out, root))
            continue
        section = module.render(data, papers, plots)
        body.append(section.markdown() + "\n")
        held = sum(1 for v in section.verdicts if v[1] is True)
        missed = sum(1 for v in section.verdicts if v[1] is False)
        summary.append((module.TITLE, ", ".join(module.IDS), held, missed, len(section.verdicts)))

    lines = ["# The VIA papers, rerun on openvia", ""]
    lines.append("Measured by `reproduce/run%s` from %s, %.0f minutes of measuring; machine: %s.  Hosts for the "
                 "network experiments are two network namespaces joined by a veth pair on this machine; "
                 "shared-memory experiments run two processes on it."
                 % (" --quick" if run["quick"] else "", run.get("started", "an earlier run"),
                    run["minutes"], machine()))
    measured = run.get("measured") or list(EXPERIMENTS)
    if set(measured) != set(EXPERIMENTS):
        lines[-1] = lines[-1].replace("`reproduce/run", "`reproduce/run --only %s" % ",".join(measured), 1)
        lines.append("")
        lines.append("The other experiments are reported from their results of an earlier run in the same "
                     "directory of raw results.")
    lines.append("")
    if run["quick"]:
        lines += ["**A quick run: few sizes, one short trial each.  Its numbers show that every experiment runs, "
                  "not what the machine can do.**", ""]
    lines += ["| experiment | paper's experiments | conclusions that hold | do not hold | undecided | checked |",
              "|---|---|---:|---:|---:|---:|"]
    for title, ids, held, missed, total in summary:
        lines.append("| %s | %s | %d | %d | %d | %d |" % (title, ids, held, missed, total - held - missed, total))
    lines += ["", "*Undecided*: not measured, or two measurements within 5 % of each other where the conclusion "
              "needs one to be smaller.  Each number is the best of the trials of one run; the spread between runs "
              "on this machine is larger for the network transport than for shared memory."]
    lines.append("")
    all_notes = [n for name in EXPERIMENTS for n in notes.get(name, [])]
    if all_notes:
        lines += ["Notes from the run:", ""] + ["- " + n for n in all_notes] + [""]
    lines += body
    lines.append("Raw results: `%s` (viabench JSON, logs, criterion output, profiles)." %
                 os.path.relpath(out, os.path.dirname(report_path)))
    os.makedirs(os.path.dirname(report_path), exist_ok=True)
    with open(report_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    log("wrote %s" % report_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
