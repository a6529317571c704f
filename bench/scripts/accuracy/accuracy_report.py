#!/usr/bin/env python3
"""accuracy_report.py -- keeps the raw results of bench/scripts/accuracy/accuracy.sh and renders its
report.

Experiment accuracy (bench/results/accuracy/): collect writes DEST
(bench/results/accuracy/raw/<run>/ when accuracy.sh runs with its defaults), render writes MD
(bench/results/accuracy/REPORT.md), its first line the command that made it and the commit
(bench/scripts/lib/provenance.py: accuracy.sh's own command line when accuracy.sh calls it).

Two steps, both called by accuracy.sh:

  collect SRC DEST [--requests]   copies what one run left in SRC (a `kvrouter bench` or
                                  `kvrouter demo` output folder plus the stamp and cpu files
                                  accuracy.sh writes there) into DEST, the small raw files kept in
                                  git: stamp, level.json (the one per-level JSON without its
                                  per-request arrays: render reads its aggregates only), cpu when
                                  present, and with --requests ttft.csv (per measured, completed
                                  request: uncached prompt tokens, i.e. prompt tokens less usage
                                  cached_tokens, and TTFT ms; the two columns part (d)'s
                                  per-bucket medians are computed from).
  render RAW MD                   writes MD from the run folders in RAW only (a, b, c_after_N,
                                  c_before_N, d_scale1, d_scaleS): every figure is computed here
                                  from those files, and every section names the stamp (commit,
                                  start, command lines, load average) of each run it reads, so a
                                  part reused from an earlier invocation shows that run's stamp.

A stamp is key=value lines written by accuracy.sh when the run started: run, part, commit (the
repository's HEAD, "+dirty" when tracked files differed), started/finished (UTC), binary, the
configured figures (ttft_ms, itl_ms, tokens, rate, prompts, scale, ...), sim and bench or demo
command lines, cores, arch and load (the 1-minute, 5-minute and 15-minute load averages at the
start). Percentiles computed here (the TTFT per bucket of uncached tokens) are the harness's
percentile(), numpy's default linear interpolation, as the bench's own.

usage: bench/scripts/accuracy/accuracy_report.py collect SRC DEST [--requests]
       bench/scripts/accuracy/accuracy_report.py render RAW MD
"""
import argparse
import csv
import glob
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "harness"))
from kvrharness import percentile, read_stamp, write_report  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from level_json import slim_level, write_level  # noqa: E402
from provenance import first_line  # noqa: E402

# The bars each part is held to (the load generator's accuracy targets).
BAR_FIXED_PCT = 5.0       # (a), (b): TTFT and TPOT mean and p50 within 5% of the configured values
BAR_LAG_P99_MS = 1.0      # (c): send lag p99 below 1 real ms
BAR_TIME_SCALE_PCT = 10.0  # (d): every figure at the fast scale within 10% of scale 1
# (d): buckets of uncached prompt tokens for the per-bucket TTFT medians
BUCKETS = [(0, 200), (200, 1000), (1000, 2000), (2000, None)]


# ---- collect -------------------------------------------------------------------------------------

TTFT_CSV_HEADER = ["uncached_tokens", "ttft_ms"]


def write_ttft_csv(path, rows):
    """ttft.csv: a header, then "uncached tokens,TTFT ms" per request (the TTFT as read)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(TTFT_CSV_HEADER)
        for uncached, ttft in rows:
            w.writerow([uncached, repr(ttft)])


def read_ttft(d):
    """[(uncached tokens, TTFT ms)] of a run folder: ttft.csv, or the ttft.jsonl of runs kept
    before 2026-11-29 (prompt_tokens, cached_tokens, ttft_ms per line); None when neither."""
    if os.path.exists(os.path.join(d, "ttft.csv")):
        with open(os.path.join(d, "ttft.csv"), newline="") as f:
            rows = list(csv.reader(f))
        if rows[:1] != [TTFT_CSV_HEADER]:
            sys.exit("accuracy_report.py: %s/ttft.csv: header is not %s"
                     % (d, ",".join(TTFT_CSV_HEADER)))
        return [(int(u), float(t)) for u, t in rows[1:]]
    if os.path.exists(os.path.join(d, "ttft.jsonl")):
        with open(os.path.join(d, "ttft.jsonl")) as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
        return [(r["prompt_tokens"] - r["cached_tokens"], r["ttft_ms"]) for r in rows]
    return None


def collect(src, dest, requests):
    levels = sorted(glob.glob(os.path.join(src, "results", "*.json")))
    if len(levels) != 1:
        sys.exit("accuracy_report.py: expected one level JSON in %s/results, found %d"
                 % (src, len(levels)))
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    with open(levels[0]) as f:
        level = slim_level(json.load(f))
    write_level(os.path.join(dest, "level.json"), level)
    for name in ("stamp", "cpu"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dest, name))
    if requests:
        rows = []
        with open(os.path.join(src, "requests.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                if r.get("ok") and not r.get("warmup"):
                    rows.append((r["prompt_tokens"] - r.get("cached_tokens", 0), r["ttft_ms"]))
        write_ttft_csv(os.path.join(dest, "ttft.csv"), rows)


# ---- render --------------------------------------------------------------------------------------


class Run:
    """One run folder of RAW: name, stamp (dict), level (dict), cpu ((user, sys, wall) or None),
    ttft ([(uncached tokens, TTFT ms)] or None)."""

    def __init__(self, raw, name):
        d = os.path.join(raw, name)
        self.name = name
        self.stamp = read_stamp(os.path.join(d, "stamp"))
        with open(os.path.join(d, "level.json")) as f:
            self.level = json.load(f)
        self.cpu = None
        if os.path.exists(os.path.join(d, "cpu")):
            with open(os.path.join(d, "cpu")) as f:
                u, s, w = (float(x) for x in f.read().split())
            self.cpu = (u, s, w)
        self.ttft = read_ttft(d)

    def num(self, key):
        return float(self.stamp[key])

    def describe(self):
        """The stamp as one Markdown bullet."""
        s = self.stamp
        cmds = "; ".join("`%s`" % s[k] for k in ("sim_cmd", "bench_cmd", "demo_cmd") if s.get(k))
        return ("- run `%s`: commit %s, started %s, finished %s, %s cores (%s), load average "
                "at the start %s; %s" % (self.name, s.get("commit", "?"), s.get("started", "?"),
                                         s.get("finished", "?"), s.get("cores", "?"),
                                         s.get("arch", "?"), s.get("load", "?"), cmds))


def pct_diff(x, ref):
    return 100.0 * (x - ref) / ref


def render_fixed(runs, w):
    w("## (a), (b) Fixed latencies (bar: TTFT and TPOT mean and p50 within %g%% of the configured "
      "values)" % BAR_FIXED_PCT)
    w("")
    for r in runs:
        w(r.describe())
    w("")
    w("Figures in simulated ms. Prompt tokens: the mean over the measured requests.")
    w("")
    w("| run | time scale | requests | prompt tokens | configured TTFT / TPOT | TTFT mean | "
      "TTFT p50 | TTFT p99 | TTFT error (mean / p50) | TPOT mean | TPOT p50 | TPOT p99 | "
      "TPOT error (mean / p50) | failed | within %g%% |" % BAR_FIXED_PCT)
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        j = r.level
        ttft, itl = r.num("ttft_ms"), r.num("itl_ms")
        te = (pct_diff(j["mean_ttft_ms"], ttft), pct_diff(j["p50_ttft_ms"], ttft))
        pe = (pct_diff(j["mean_tpot_ms"], itl), pct_diff(j["p50_tpot_ms"], itl))
        ok = all(abs(x) <= BAR_FIXED_PCT for x in te + pe) and j["failed"] == 0
        w("| (%s) | %g | %d | %.0f | %g / %g | %.1f | %.1f | %.1f | %+.1f%% / %+.1f%% | %.2f | "
          "%.2f | %.2f | %+.1f%% / %+.1f%% | %d | %s |"
          % (r.name, r.num("scale"), j["completed"],
             j["total_input_tokens"] / max(1, j["completed"]), ttft, itl, j["mean_ttft_ms"],
             j["p50_ttft_ms"], j["p99_ttft_ms"], te[0], te[1], j["mean_tpot_ms"],
             j["p50_tpot_ms"], j["p99_tpot_ms"], pe[0], pe[1], j["failed"],
             "yes" if ok else "**no**"))
    w("")


def render_streams(runs, w):
    w("## (c) Many concurrent streams (bar: send lag p99 < %g real ms)" % BAR_LAG_P99_MS)
    w("")
    for r in runs:
        w(r.describe())
    w("")
    r0 = runs[0]
    life = r0.num("ttft_ms") + (r0.num("tokens") - 1) * r0.num("itl_ms")
    w("Each stream lasts %g + (%g - 1) x %g = %g ms, so at %g req/s about %.0f are open at once "
      "(configured; \"peak streams\" is what the bench measured). Send lag in real ms; TTFT "
      "and TPOT in ms at time scale 1. Bench CPU = user + system seconds of the bench process, "
      "from bash's `time`." % (r0.num("ttft_ms"), r0.num("tokens"), r0.num("itl_ms"), life,
                               r0.num("rate"), r0.num("rate") * life / 1000.0))
    w("")
    w("| binary | round | requests | peak streams | send lag p50 | p95 | p99 | max | p99 < %g ms "
      "| TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | bench CPU (user + sys) / wall |"
      % BAR_LAG_P99_MS)
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        j = r.level
        lag = j["kvrouter"]["send_lag_real_ms"]
        c = r.cpu
        w("| %s | %s | %d | %d | %.3f | %.3f | %.3f | %.3f | %s | %.1f | %.1f | %.2f | %.2f | %s |"
          % (r.stamp.get("binary_name", r.stamp.get("binary", "?")), r.stamp.get("round", "?"),
             j["completed"], j["max_concurrent_requests"], lag["p50"], lag["p95"], lag["p99"],
             lag["max"], "yes" if lag["p99"] < BAR_LAG_P99_MS else "**no**", j["p50_ttft_ms"],
             j["p99_ttft_ms"], j["p50_tpot_ms"], j["p99_tpot_ms"],
             "%.1f s (%.1f + %.1f) / %.0f s" % (c[0] + c[1], c[0], c[1], c[2]) if c else "?"))
    w("")


def render_time_scale(slow, fast, w):
    s = fast.stamp.get("scale", "?")
    w("## (d) Time-scale agreement (bar: within %g%%)" % BAR_TIME_SCALE_PCT)
    w("")
    w(slow.describe())
    w(fast.describe())
    w("")
    w("The same seed at both scales. Figures in simulated time unless marked real.")
    w("")
    j1, jn = slow.level, fast.level

    def cached(j):
        return j["kvrouter"]["total_cached_tokens"] / max(1, j["total_input_tokens"])

    rows = [("TTFT p50 (ms)", "p50_ttft_ms"), ("TTFT p90 (ms)", "p90_ttft_ms"),
            ("TTFT p99 (ms)", "p99_ttft_ms"), ("TPOT p50 (ms)", "p50_tpot_ms"),
            ("TPOT p90 (ms)", "p90_tpot_ms"), ("TPOT p99 (ms)", "p99_tpot_ms"),
            ("output tok/s", "output_throughput"),
            ("request throughput (req/s)", "request_throughput")]
    w("| metric | scale 1 | scale %s | difference | within %g%% |" % (s, BAR_TIME_SCALE_PCT))
    w("|---|---|---|---|---|")
    diffs = []
    for name, key in rows:
        a, b = j1[key], jn[key]
        d = pct_diff(b, a)
        diffs.append((abs(d), name))
        w("| %s | %.2f | %.2f | %+.1f%% | %s |"
          % (name, a, b, d, "yes" if abs(d) <= BAR_TIME_SCALE_PCT else "**no**"))
    a, b = cached(j1), cached(jn)
    d = pct_diff(b, a)
    diffs.append((abs(d), "cached fraction"))
    w("| mean cached fraction of prompt tokens | %.3f | %.3f | %+.1f%% | %s |"
      % (a, b, d, "yes" if abs(d) <= BAR_TIME_SCALE_PCT else "**no**"))
    w("| completed / failed | %d / %d | %d / %d | | |"
      % (j1["completed"], j1["failed"], jn["completed"], jn["failed"]))
    l1, ln = j1["kvrouter"]["send_lag_real_ms"], jn["kvrouter"]["send_lag_real_ms"]
    w("| send lag p99 / max (real ms) | %.3f / %.3f | %.3f / %.3f | | |"
      % (l1["p99"], l1["max"], ln["p99"], ln["max"]))
    t1, tn = j1["kvrouter"]["ttft_transport_real_ms"], jn["kvrouter"]["ttft_transport_real_ms"]
    w("| TTFT outside the engine p50 / p99 (real ms) | %.2f / %.2f | %.2f / %.2f | | |"
      % (t1["p50"], t1["p99"], tn["p50"], tn["p99"]))
    w("")
    worst = max(diffs)
    outside = [n for d, n in diffs if d > BAR_TIME_SCALE_PCT]
    w("Largest difference: %s, %.1f%%; %s." % (
        worst[1], worst[0], "every figure within %g%%" % BAR_TIME_SCALE_PCT if not outside
        else "outside %g%%: %s" % (BAR_TIME_SCALE_PCT, ", ".join(outside))))
    w("")
    if slow.ttft is None or fast.ttft is None:
        return
    w("TTFT p50 by the request's uncached prompt tokens (prompt_tokens - usage cached_tokens), "
      "measured completed requests:")
    w("")
    w("| uncached tokens | requests, scale 1 | requests, scale %s | TTFT p50, scale 1 (ms) | "
      "TTFT p50, scale %s (ms) | difference |" % (s, s))
    w("|---|---|---|---|---|---|")
    for lo, hi in BUCKETS:
        a = [t for u, t in slow.ttft if u >= lo and (hi is None or u < hi)]
        b = [t for u, t in fast.ttft if u >= lo and (hi is None or u < hi)]
        label = "%d-%d" % (lo, hi - 1) if hi is not None else "%d or more" % lo
        if a and b:
            pa, pb = percentile(a, 50), percentile(b, 50)
            w("| %s | %d | %d | %.1f | %.1f | %+.1f%% |" % (label, len(a), len(b), pa, pb,
                                                          pct_diff(pb, pa)))
        else:
            w("| %s | %d | %d | | | |" % (label, len(a), len(b)))
    w("")


def render(raw, md):
    names = sorted(n for n in os.listdir(raw) if os.path.isdir(os.path.join(raw, n))) \
        if os.path.isdir(raw) else []
    runs = {n: Run(raw, n) for n in names}
    L = []
    w = L.append
    w(first_line())
    w("")
    w("# Load generator accuracy and time scale")
    w("")
    w("Rendered by bench/scripts/accuracy/accuracy_report.py from the run folders in %s/ (each "
      "run's stamp, per-level JSON and CPU times), which `bench/scripts/accuracy/accuracy.sh` "
      "writes; a section shows the stamp of every run it reads. Definitions of TTFT, TPOT and "
      "send lag: bench/loadgen/README.md. Hand-written notes, which name the runs they read: "
      "bench/results/accuracy/NOTES.md (not generated)." % raw)
    w("")
    fixed = [runs[n] for n in ("a", "b") if n in runs]
    streams = [runs[n] for n in names if n.startswith("c_after_")] + \
        [runs[n] for n in names if n.startswith("c_before_")]
    scaled = sorted((r for n, r in runs.items() if n.startswith("d_scale")),
                    key=lambda r: r.num("scale"))
    if not (fixed or streams or scaled):
        w("No run is recorded in %s/ yet." % raw)
        w("")
    if fixed:
        render_fixed(fixed, w)
    if streams:
        render_streams(streams, w)
    if len(scaled) >= 2:
        render_time_scale(scaled[0], scaled[-1], w)
    elif scaled:
        w("## (d) Time-scale agreement")
        w("")
        w(scaled[0].describe())
        w("")
        w("Only one time scale is recorded; the comparison needs both.")
        w("")
    write_report(md, L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="copy one run's small raw files into the raw folder")
    c.add_argument("src")
    c.add_argument("dest")
    c.add_argument("--requests", action="store_true", help="also keep per-request TTFTs")
    r = sub.add_parser("render", help="write the Markdown report from the raw folder")
    r.add_argument("raw")
    r.add_argument("md")
    args = ap.parse_args()
    if args.cmd == "collect":
        collect(args.src, args.dest, args.requests)
    else:
        render(args.raw, args.md)


if __name__ == "__main__":
    main()
