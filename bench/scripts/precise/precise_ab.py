#!/usr/bin/env python3
"""precise_ab.py -- precise mode (the engines' KV events) against the approximate index, in virtual
time, on every study scenario, with and without a cache that is flushed behind the router's back.

Runs `kvrouter bench study` four times with the same scenarios, policies and seeds: as is
(approximate), with `-- --kv-events` (precise), and both with `--flush-every-s S` (every S simulated
seconds one worker's prefix cache is emptied without the router being told: the case built to break
the guess). Writes OUT/REPORT.md (its first line the command and the commit, from
bench/scripts/lib/provenance.py; then each policy's mean max SLO-compliant rate per scenario and
set-up, and precise / approximate, then the router's predicted-vs-reported cached-token gap at each
policy's max SLO-compliant level) and keeps each study's STUDY.md and study.json under
OUT/<set-up>/ (the per-cell folders are deleted).

Experiment precise (bench/results/precise/): does routing on the engines' KV events (precise mode)
beat the router's own index? This script is its virtual-time part, OUT = bench/results/precise.

    python3 bench/scripts/precise/precise_ab.py --kvrouter build/kvrouter \
        --out bench/results/precise
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from provenance import first_line  # noqa: E402

SETUPS = [("approximate", []), ("precise", ["--kv-events"]),
          ("approximate+flush", ["--flush-every-s", None]),
          ("precise+flush", ["--kv-events", "--flush-every-s", None])]


def cell_gaps(out):
    """{(scenario, policy): [gap per seed]}: the router's predicted-vs-reported cached-token gap
    ((predicted - reported) / reported, from each level's kvrouter.router_cached) at the policy's
    max SLO-compliant level (its highest passing rate; its lowest level when none passed)."""
    found = {}
    for sc in sorted(os.listdir(out)):
        if not os.path.isdir(os.path.join(out, sc)):
            continue
        for cell in glob.glob(os.path.join(out, sc, "seed*", "results")):
            levels = {}
            for f in glob.glob(os.path.join(cell, "*.json")):
                with open(f) as fh:
                    j = json.load(fh)
                k = j.get("kvrouter") or {}
                rc = k.get("router_cached") or {}
                levels.setdefault(j.get("label"), []).append(
                    (j["request_rate"], bool(k.get("slo_pass")), rc.get("gap")))
            for pol, lv in levels.items():
                lv.sort()
                passing = [x for x in lv if x[1]]
                pick = passing[-1] if passing else lv[0]
                if pick[2] is not None:
                    found.setdefault((sc, pol), []).append(pick[2])
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", default="round_robin,kv_aware,llmd_precise")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--flush-every-s", default="5")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results, gaps = {}, {}
    t0 = time.time()
    for name, extra in SETUPS:
        extra = [args.flush_every_s if x is None else x for x in extra]
        out = os.path.join(args.out, name)
        cmd = [args.kvrouter, "bench", "study", "--policies", args.policies, "--seeds",
               str(args.seeds), "--quiet", "--out", out] + (["--"] + extra if extra else [])
        print("==", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        with open(os.path.join(out, "study.json")) as f:
            results[name] = json.load(f)
        gaps[name] = cell_gaps(out)
        # the per-cell folders are large; keep the tables
        for sc in os.listdir(out):
            p = os.path.join(out, sc)
            if os.path.isdir(p):
                subprocess.run(["rm", "-rf", p], check=True)
    policies = args.policies.split(",")

    def mean(study, scenario, policy):
        for sc in study["scenarios"]:
            if sc["name"] == scenario:
                v = [c["max_rate"][policy]["rate"] for c in sc["cells"] if c["status"] == 0]
                return sum(v) / len(v) if v else None
        return None

    scenarios = [sc["name"] for sc in results["approximate"]["scenarios"]]
    lines = [first_line(), "", "# Precise mode against the approximate index (virtual time)", "",
             "%d seed(s) per scenario, search resolution 0.05 req/s, %.0f s. Max SLO-compliant "
             "rate (req/s), mean over the seeds. *precise*: the engines publish vLLM KV events "
             "the router reads and prompts are tokenized at the router (1 ms); *flush*: every "
             "%s simulated seconds one worker's prefix cache is emptied without the router being "
             "told." % (args.seeds, time.time() - t0,
                                                  args.flush_every_s), "",
             "| scenario | policy | approximate | precise | precise / approximate | "
             "approximate + flush | precise + flush | precise / approximate (flush) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for sc in scenarios:
        for pol in policies:
            if pol == "round_robin":
                continue  # routes without an index: the same in both modes
            a, p = mean(results["approximate"], sc, pol), mean(results["precise"], sc, pol)
            af, pf = mean(results["approximate+flush"], sc, pol), mean(results["precise+flush"],
                                                                       sc, pol)

            def ratio(x, y):
                return "%.2fx" % (y / x) if x and y else "-"

            def num(x):
                return "%.2f" % x if x is not None else "-"
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                sc, pol, num(a), num(p), ratio(a, p), num(af), num(pf), ratio(af, pf)))
    lines += ["", "The router's predicted against the workers' reported cached prompt tokens, "
              "(predicted - reported) / reported over the requests of the policy's max "
              "SLO-compliant level (its `kvrouter.router_cached` in the level's results JSON), "
              "mean over the seeds:", "",
              "| scenario | policy | approximate | precise | approximate + flush | "
              "precise + flush |", "|---|---|---:|---:|---:|---:|"]
    for sc in scenarios:
        for pol in policies:
            if pol == "round_robin":
                continue

            def gap(setup):
                v = gaps.get(setup, {}).get((sc, pol))
                return "%+.2f%%" % (100 * sum(v) / len(v)) if v else "-"
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                sc, pol, gap("approximate"), gap("precise"), gap("approximate+flush"),
                gap("precise+flush")))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "REPORT.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
