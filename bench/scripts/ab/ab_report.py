#!/usr/bin/env python3
"""ab_report.py -- renders the A/B's report from the raw results bench/scripts/ab/ab.sh keeps.

Experiment ab (bench/results/ab/): writes AB_RESULTS_MD only (the committed one is
bench/results/ab/REPORT.md, rendered from bench/results/ab/raw/main and raw/refs), its first line
the command that made it and the commit (bench/scripts/lib/provenance.py: ab.sh's own command line
when ab.sh calls it).

RAW holds one folder per workload, written by ab.sh when that workload's A/B finished:
  stamp          key=value lines: workload, commit (the repository's HEAD, "+dirty" when tracked
                 files differed), started/finished (UTC), took_s, binary, time_scale, warmup_s,
                 level_s, resolution, start, num_prompts, policies, labels, cores, arch, cmd (the
                 bench command line; demo_cmd in folders of runs made before the ninth session,
                 when ab.sh ran `kvrouter demo`)
  rates          "<label> <rate>" per label: the max SLO-compliant rate the bench printed
  results/*.json the per-level JSON of every level the search ran (one file per label and rate)

Every figure of the report is computed here from those files: the rates and their ratios, the time
scale column (from the stamp), and a check of each printed max rate against the levels (highest
passing rate below the lowest failing one, from each level's kvrouter.slo_pass): a label whose
printed rate disagrees with its levels is marked. A workload folder left from an earlier ab.sh run
keeps that run's stamp. The reading of the figures is hand-written elsewhere
(bench/results/ab/NOTES.md); this script never writes it.

Several RAW folders may be given (ab.sh runs of other policies on the same workloads, e.g.
bench/results/ab/raw/main and bench/results/ab/raw/refs): a workload's row then holds every
policy of every folder, its runs are listed one per folder, and a label that two folders both use
for a workload is an error.

usage: bench/scripts/ab/ab_report.py RAW [RAW ...] AB_RESULTS_MD
"""
import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "harness"))
from kvrharness import read_stamp, write_report  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from provenance import first_line  # noqa: E402

# Bars of kv_aware's max rate over round_robin's, per workload: issue 16's (1.5x multiturn, 2.3x
# documents, 0.98x control), which replaced issue 5's first bars (1.5x documents, 0.95x control).
BARS = {"multiturn": 1.5, "documents": 2.3, "control": 0.98}
MAIN, BASE = "kv_aware", "round_robin"
ORDER = ["round_robin", "kv_aware", "gie_scorer", "sglang_cache_aware"]


class Workload:
    """One workload's folders, one per RAW that has it: name, stamps [stamp], rates {label: rate},
    policy_of {label: policy}, levels [level JSON]."""

    def __init__(self, raws, name):
        self.name = name
        self.stamps, self.rates, self.policy_of, self.levels = [], {}, {}, []
        for raw in raws:
            d = os.path.join(raw, name)
            if not os.path.isfile(os.path.join(d, "stamp")):
                continue
            st = read_stamp(os.path.join(d, "stamp"))
            self.stamps.append(st)
            labels = dict(zip(st["labels"].split(","), st["policies"].split(",")))
            clash = set(labels) & set(self.policy_of)
            if clash:
                sys.exit("ab_report.py: %s: label %s in two raw folders" % (name, ", ".join(clash)))
            self.policy_of.update(labels)
            with open(os.path.join(d, "rates")) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2:
                        self.rates[parts[0]] = float(parts[1])
            for path in sorted(glob.glob(os.path.join(d, "results", "*.json"))):
                with open(path) as f:
                    self.levels.append(json.load(f))
        self.stamp = self.stamps[0]

    def rate_of(self, policy):
        for label, p in self.policy_of.items():
            if p == policy:
                return self.rates.get(label)
        return None

    def label_of(self, policy):
        for label, p in self.policy_of.items():
            if p == policy:
                return label
        return None

    def levels_max_rate(self, label):
        """Highest passing rate below the lowest failing one among label's levels, or None."""
        mine = [(lv["request_rate"], lv["kvrouter"]["slo_pass"]) for lv in self.levels
                if lv.get("label") == label]
        if not mine:
            return None
        failing = [r for r, ok in mine if not ok]
        limit = min(failing) if failing else float("inf")
        passing = [r for r, ok in mine if ok and r < limit]
        return max(passing) if passing else 0.0


def fmt_rate(w, policy):
    r = w.rate_of(policy)
    if r is None:
        return "n/a"
    cell = "%g" % r
    label = w.label_of(policy)
    check = w.levels_max_rate(label)
    if check is None:
        cell += " (no level JSON)"
    elif abs(check - r) > 1e-6:
        cell += " (**levels say %g**)" % check
    return cell


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt_ratio(x):
    return "n/a" if x is None else "%.2fx" % x


def render(raws, md):
    names = sorted({n for raw in raws if os.path.isdir(raw) for n in os.listdir(raw)
                    if os.path.isfile(os.path.join(raw, n, "stamp"))})
    works = [Workload(raws, n) for n in names]
    raw = " ".join(raws)
    policies = [p for p in ORDER if any(p in w.policy_of.values() for w in works)]
    policies += sorted({p for w in works for p in w.policy_of.values()} - set(policies))
    others = [p for p in policies if p != MAIN]
    L = []
    out = L.append
    out(first_line())
    out("")
    out("# Policy A/B on simulated workers")
    out("")
    out("Rendered by bench/scripts/ab/ab_report.py from the workload folders in %s/, which "
        "`bench/scripts/ab/ab.sh` writes (each workload's stamp, the max SLO-compliant rates "
        "the bench printed, and the per-level JSON of every level searched). Each row names "
        "its own run below the table. Hand-written notes, which name the runs they read: "
        "bench/results/ab/NOTES.md (not generated)." % "/, ".join(raws))
    out("")
    if not works:
        out("No workload is recorded in %s/ yet." % raw)
        out("")
    else:
        slos = sorted({(lv["kvrouter"]["slo"]["ttft_p99_ms"], lv["kvrouter"]["slo"]["tpot_p99_ms"])
                       for w in works for lv in w.levels})
        out("Max SLO-compliant rate: the highest passing rate below the lowest failing one, "
            "simulated req/s, where a level passes when the bench's verdict (kvrouter.slo_pass) "
            "says so; SLO targets TTFT p99 / TPOT p99 in the level JSONs: %s. A printed rate the "
            "levels do not reproduce is marked." % "; ".join("%g ms / %g ms" % x for x in slos))
        out("")
        head = ["workload", "time scale"] + policies
        head += ["%s / %s" % (MAIN, p) for p in others]
        head += ["issue 16's bar (%s / %s)" % (MAIN, BASE)]
        out("| " + " | ".join(head) + " |")
        out("|" + "---|" * len(head))
        for w in works:
            main = w.rate_of(MAIN)
            cells = [w.name, w.stamp.get("time_scale", "?")]
            cells += [fmt_rate(w, p) for p in policies]
            cells += [fmt_ratio(ratio(main, w.rate_of(p))) for p in others]
            bar = BARS.get(w.name)
            r = ratio(main, w.rate_of(BASE))
            if bar is None:
                cells.append("none")
            elif r is None:
                cells.append(">= %gx: n/a" % bar)
            else:
                cells.append(">= %gx %s" % (bar, "met" if r >= bar else "**NOT met**"))
            out("| " + " | ".join(cells) + " |")
        out("")
        out("Runs:")
        out("")
        for w in works:
            for s in w.stamps:
                mine = s["labels"].split(",")
                n = sum(1 for lv in w.levels if lv.get("label") in mine)
                out("- %s: commit %s, started %s, took %s s, %s cores (%s), %d levels; `%s`"
                    % (w.name, s.get("commit", "?"), s.get("started", "?"), s.get("took_s", "?"),
                       s.get("cores", "?"), s.get("arch", "?"), n,
                       s.get("cmd", s.get("demo_cmd", "?"))))
        out("")
    write_report(md, L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="+", help="the folders ab.sh keeps the raw results in (AB_RAW)")
    ap.add_argument("md", help="the Markdown file to write")
    args = ap.parse_args()
    render(args.raw, args.md)


if __name__ == "__main__":
    main()
