#!/usr/bin/env python3
"""admission_report.py -- the table of the admission experiment (bench/results/admission/), from
what bench/scripts/admission/admission_bench.sh leaves in its OUT folder.

Experiment admission: writes OUT/<run>/summary.json (summarize) and MD (render; admission_bench.sh
renders OUT/REPORT.md), its first line the command that made it and the commit
(bench/scripts/lib/provenance.py: admission_bench.sh's own command line when it calls this).

Two steps, both called by admission_bench.sh:

  summarize OUT   per run (OUT/off, OUT/on): the measured requests of OUT/RUN/requests.jsonl (the
                  bench's per-request log, not kept in git) counted into OUT/RUN/summary.json:
                  measured, completed (status 200), answered 503 by the bound, other errors, and
                  TTFT p50/p99 of the completed ones (simulated ms; linear interpolation between
                  closest ranks, numpy's default); and the per-request arrays dropped from the
                  level's OUT/RUN/results/*.json, which git keeps (render reads its aggregates)
  render OUT MD   MD from OUT/stamp, OUT/RUN/summary.json and the level's OUT/RUN/results/*.json
                  (goodput and duration) alone, so a kept folder re-renders without its
                  requests.jsonl

usage: bench/scripts/admission/admission_report.py summarize OUT
       bench/scripts/admission/admission_report.py render OUT MD
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from level_json import slim_file  # noqa: E402
from provenance import first_line  # noqa: E402

RUNS = ("off", "on")


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(out):
    for label in RUNS:
        d = os.path.join(out, label)
        for path in glob.glob(os.path.join(d, "results", "*.json")):
            slim_file(path)
        with open(os.path.join(d, "requests.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        measured = [r for r in recs if not r.get("warmup") and not r.get("cooldown")]
        ok = [r for r in measured if r.get("ok")]
        n503 = sum(1 for r in measured if r.get("status") == 503)
        ttft = [r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]
        s = {"run": label, "measured": len(measured), "completed": len(ok), "status_503": n503,
             "other_errors": len(measured) - len(ok) - n503,
             "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99)}
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump(s, f, indent=1)
            f.write("\n")


def render(out, md):
    with open(os.path.join(out, "stamp")) as f:
        stamp = f.read().strip().splitlines()
    rows = []
    for label in RUNS:
        d = os.path.join(out, label)
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)
        res = glob.glob(os.path.join(d, "results", "*.json"))
        level = {}
        if res:
            with open(res[0]) as f:
                level = json.load(f)
        good = level.get("request_goodput")
        dur = level.get("duration")
        rows.append("| %s | %d | %d | %d | %d | %s | %.0f | %.0f | %s |" % (
            label, s["measured"], s["completed"], s["status_503"], s["other_errors"],
            "%.3f" % good if good is not None else "n/a", s["ttft_ms_p50"], s["ttft_ms_p99"],
            "%.0f" % dur if dur is not None else "n/a"))
    text = first_line() + "\n\n# Admission bound at about 2x capacity\n\n"
    text += ("Rendered from %s/ (its stamp, each run's summary.json and level JSON). One open-loop "
             "level per run, every process restarted between them.\n\n" % out)
    text += "".join("- %s\n" % s for s in stamp)
    text += ("\nGoodput: completed requests within the TTFT p99 1000 ms and TPOT 60 ms SLOs per "
             "simulated second (the bench's request_goodput). TTFT: simulated ms of the admitted, "
             "completed requests (status 200). 503: answered by the admission bound.\n\n")
    text += ("| bound | measured | completed | 503 | other errors | goodput (req/s) | "
             "TTFT p50 (ms) | TTFT p99 (ms) | duration (s) |\n")
    text += "|---|---|---|---|---|---|---|---|---|\n"
    text += "\n".join(rows) + "\n"
    with open(md, "w") as f:
        f.write(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("out")
    r = sub.add_parser("render")
    r.add_argument("out")
    r.add_argument("md")
    args = ap.parse_args()
    if args.step == "summarize":
        summarize(args.out)
    else:
        render(args.out, args.md)


if __name__ == "__main__":
    main()
