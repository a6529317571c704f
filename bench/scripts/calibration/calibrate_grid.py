#!/usr/bin/env python3
"""calibrate_grid.py -- ranks candidate sim defaults or calibration loads on the noise part.

Experiment calibration (bench/results/calibration/): prints its ranking only (the notes,
bench/results/calibration/NOTES.md, quote it); each candidate's calibrate.py output goes to
DIR/NAME/ (raw/ and REPORT.md), never to bench/results/.

Owns the search over candidates: each line of --candidates names one (NAME ARG...: the args are
calibrate.py's own, e.g. --sim-arg=--cost-weights-ms=22 or --bench-arg=--output-std=300), this
script runs `calibrate.py --parts noise` for each into DIR/NAME/ (raw/ kept, out/ deleted), then
prints one line per candidate read back from DIR/NAME/raw/noise/summary.json alone:

  NAME  in W/N MAE M%  oos W/N MAE M%  medians in W/N oos W/N  slo K/C (A above, B below)

in and oos: the mean over the bench seeds of the figures within 20% and of the MAE (the table's
counts under each seed); medians: each figure judged once on its median over the seeds (what
the calibration report's noise section prints); slo: (configuration, seed) pairs whose max
SLO-compliant rate equals the seed report's, of all pairs, and how many lie above and below it;
then, after the first candidate that ran (put the defaults first), the paired difference against
it in figures within 20% per seed, with its standard error ("vs base: oos +2.9 +- 1.0"). A
candidate ranks above the defaults only when it wins on seeds it was not chosen on: rerun the
best with other --noise-seeds (calibrate.py's default seeds 42 and 1-15;
bench/results/calibration/NOTES.md, 2026-11-29, has a winner over 42,1-7 that lost over 8-15).

usage: bench/scripts/calibration/calibrate_grid.py --candidates FILE --dir DIR
          [--kvrouter build/kvrouter] [--jobs 2] [--noise-seeds 42,1,2] [--summarize-only]
  FILE: "base" alone on a line runs the defaults; '#' starts a comment.
Exit status 0 when every candidate ran and has a summary (a failed one prints its log's last line,
a missing summary with --summarize-only says so; either makes it 1); a bad FILE exits 1 at once.
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import calibrate  # noqa: E402  (the seed tables, PHASE1, median_errors)


NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")  # a folder name below DIR, never a flag


def read_candidates(path):
    """[(name, [args])] from FILE; blank lines and '#' comments skipped. A name is one folder
    below DIR (letters, digits, _ . + -, not starting with . or -, so never .., a path or a
    flag) and unique; anything else exits with the line's number."""
    out, seen = [], set()
    with open(path) as f:
        for n, line in enumerate(f, 1):
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if not NAME.match(words[0]):
                sys.exit("calibrate_grid.py: %s:%d: %r is not a candidate name (letters, digits, "
                         "_ . + -; first a letter, digit or _)" % (path, n, words[0]))
            if words[0] in seen:
                sys.exit("calibrate_grid.py: %s:%d: candidate %s named twice" % (path, n, words[0]))
            seen.add(words[0])
            out.append((words[0], words[1:]))
    return out


def summarize(path):
    """The figures of one noise summary (see the module comment), as a dict."""
    with open(path) as f:
        d = json.load(f)
    seeds = [s for s in d["seeds"] if s in d["per_seed"]]
    if not seeds:
        return None

    def mean(key, i):
        """The mean over the seeds that measured it (an MAE is None when nothing was)."""
        got = [d["per_seed"][s][key][i] for s in seeds if d["per_seed"][s][key][i] is not None]
        return sum(got) / len(got) if got else None

    med = {ins: [sum(1 for e in errs if e <= calibrate.TOLERANCE), len(errs)]
           for ins, errs in calibrate.median_errors(d["figures"]).items()}
    slo = [0, 0, 0, 0]  # equal to the report's, measured, above it, below it (0: none passed)
    for _, got, want in calibrate.slo_rates(d):
        for x in got:
            if x != "?":
                slo[1] += 1
                if x is not None:
                    slo[0 if x == want else 2 if x > want else 3] += 1
    return {"per_seed": {s: (d["per_seed"][s]["in_sample"][0],
                             d["per_seed"][s]["out_of_sample"][0]) for s in seeds},
            "in": mean("in_sample", 0),
            "in_n": max(d["per_seed"][s]["in_sample"][1] for s in seeds),
            "in_mae": mean("in_sample", 2), "oos": mean("out_of_sample", 0),
            "oos_n": max(d["per_seed"][s]["out_of_sample"][1] for s in seeds),
            "oos_mae": mean("out_of_sample", 2),
            "med_in": med[True], "med_oos": med[False], "slo": slo}


def paired(s, ref):
    """Against the reference candidate on the seeds both ran: (mean difference in in-sample
    figures within 20%, its standard error, the same for out-of-sample, seeds), or None when
    fewer than two seeds are shared. The same prompts under both, so the difference is paired."""
    if s is None or ref is None:
        return None
    common = [k for k in s["per_seed"] if k in ref["per_seed"]]
    if len(common) < 2:
        return None
    out = []
    for i in (0, 1):
        diff = [s["per_seed"][k][i] - ref["per_seed"][k][i] for k in common]
        out += [statistics.mean(diff), statistics.stdev(diff) / math.sqrt(len(diff))]
    return out + [len(common)]


def line(name, s, ref_name=None, ref=None):
    """One candidate's line; with a reference, its paired difference appended."""
    text = line_alone(name, s)
    p = paired(s, ref)
    if p:
        text += "  vs %s: in %+.1f +- %.1f, oos %+.1f +- %.1f (%d seeds)" % (
            ref_name, p[0], p[1], p[2], p[3], p[4])
    return text


def line_alone(name, s):
    if s is None:
        return "%s: no bench seed in its summary" % name

    def mae(v):  # None: no seed measured one
        return "   -" if v is None else "%4.1f%%" % v

    return ("%-24s in %4.1f/%d MAE %s  oos %5.1f/%d MAE %s  medians in %d/%d oos %d/%d"
            "  slo %d/%d (%d above, %d below)" % (
                name, s["in"], s["in_n"], mae(s["in_mae"]), s["oos"], s["oos_n"],
                mae(s["oos_mae"]), s["med_in"][0], s["med_in"][1], s["med_oos"][0],
                s["med_oos"][1], *s["slo"]))


def run(args, name, extra):
    """One candidate's noise part into DIR/NAME/; returns (name, error line or None), an error
    of its own (a folder it cannot write) included, so one candidate never stops the others."""
    try:
        return run_one(args, name, extra)
    except OSError as e:
        return name, "%s: %s" % (name, e)


def run_one(args, name, extra):
    d = os.path.join(args.dir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "calibrate.py"),
           "--kvrouter", args.kvrouter, "--parts", "noise", "--out", os.path.join(d, "out"),
           "--raw", os.path.join(d, "raw"), "--md", os.path.join(d, "REPORT.md")]
    if args.noise_seeds:
        cmd += ["--noise-seeds", args.noise_seeds]
    with open(os.path.join(d, "log"), "w") as log:
        log.write(shlex.join(cmd + extra) + "\n")
        log.flush()
        rc = subprocess.call(cmd + extra, stdout=log, stderr=subprocess.STDOUT)
    shutil.rmtree(os.path.join(d, "out"), ignore_errors=True)
    if rc != 0:
        with open(os.path.join(d, "log")) as log:
            last = (log.read().strip().splitlines() or ["(no output)"])[-1]
        return name, "%s: calibrate.py exited with status %d: %s" % (name, rc, last)
    return name, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--kvrouter", default="build/kvrouter")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--noise-seeds", default=None,
                    help="passed to calibrate.py (default: its own, %s)" % calibrate.NOISE_SEEDS)
    ap.add_argument("--summarize-only", action="store_true",
                    help="print the lines from DIR/NAME/raw/ without running anything")
    args = ap.parse_args()
    if args.jobs < 1:
        sys.exit("calibrate_grid.py: --jobs must be >= 1")
    cands = read_candidates(args.candidates)
    failed = {}
    if not args.summarize_only:
        if not os.access(args.kvrouter, os.X_OK):
            sys.exit("calibrate_grid.py: %s is not an executable kvrouter" % args.kvrouter)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
            for name, err in ex.map(lambda c: run(args, c[0], c[1]), cands):
                if err:
                    failed[name] = err
    ref = None  # the first candidate that ran: the others' paired differences are against it
    for name, _ in cands:
        path = os.path.join(args.dir, name, "raw", "noise", "summary.json")
        if name in failed:
            print(failed[name])
        elif not os.path.exists(path):
            failed[name] = True
            print("%s: no %s" % (name, path))
        else:
            s = summarize(path)
            print(line(name, s, *(ref or (None, None))), flush=True)
            if s is not None:
                ref = ref or (name, s)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
