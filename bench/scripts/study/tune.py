#!/usr/bin/env python3
"""tune.py -- tries kv_aware parameter sets in virtual time against the reference policies.

Experiment study (bench/results/study/): how kv_aware's defaults were chosen (the study's NOTES.md,
"How the defaults were chosen"; the reference was bench/results/study/before/study.json). Writes
OUT/REPORT.md (its first line the command and the commit: bench/scripts/lib/provenance.py) and each
candidate's study under OUT/<i>/; nothing under bench/results/.

For each candidate (a JSON object of kv_aware parameters) it runs
  kvrouter bench study --policies round_robin,kv_aware --seeds N [--scenarios ...] --out OUT/<i> \
      --quiet -- --policy-params 'kv_aware=<candidate>'
and compares kv_aware's mean max SLO-compliant rate per scenario with a reference study's
(a full `kvrouter bench study` run: its study.json gives every reference policy's mean). It prints
and writes OUT/REPORT.md: per candidate, kv_aware's rate and its ratio to round_robin and to the
best reference policy on each scenario, and the worst of those ratios (what the candidate is ranked
by).

usage: bench/scripts/study/tune.py KVROUTER REFERENCE_STUDY_JSON OUT CANDIDATES_JSONL [--seeds N]
       [--scenarios LIST]
The standard library only.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from provenance import first_line  # noqa: E402

REFERENCES = ("gie_scorer", "sglang_cache_aware", "dynamo_kv", "llmd_precise")


def load_refs(path):
    with open(path) as f:
        j = json.load(f)
    refs = {}
    for sc in j["scenarios"]:
        if sc.get("fleet"):  # workers needed (lower is better), not a rate: not what tune ranks
            continue
        m = sc["mean"]
        best = max(REFERENCES, key=lambda p: m.get(p, {}).get("mean", 0))
        refs[sc["name"]] = {"round_robin": m["round_robin"]["mean"], "best": best,
                            "best_rate": m[best]["mean"]}
    return refs


def run(kvr, out, cand, seeds, scenarios):
    os.makedirs(out, exist_ok=True)
    # round_robin first, as in the full study: each policy's search starts at the first label's
    # limit (bench/run/runner.c), so kv_aware alone would search another path
    cmd = [kvr, "bench", "study", "--policies", "round_robin,kv_aware", "--seeds", str(seeds),
           "--out", out, "--quiet"]
    if scenarios:
        cmd += ["--scenarios", scenarios]
    cmd += ["--", "--policy-params", "kv_aware=" + json.dumps(cand, separators=(",", ":"))]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "study.json")) as f:
        j = json.load(f)
    return ({sc["name"]: sc["mean"]["kv_aware"]["mean"] for sc in j["scenarios"]
             if not sc.get("fleet")}, j["seconds"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("reference")
    ap.add_argument("out")
    ap.add_argument("candidates")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--scenarios", default="")
    a = ap.parse_args()
    refs = load_refs(a.reference)
    with open(a.candidates) as f:
        cands = [json.loads(line) for line in f if line.strip()]
    lines = ["| # | parameters | " + " | ".join(refs) + " | worst vs best reference | s |",
             "|---|---|" + "---:|" * (len(refs) + 2)]
    print(lines[0], flush=True)
    for i, c in enumerate(cands):
        rates, secs = run(a.kvrouter, os.path.join(a.out, str(i)), c, a.seeds, a.scenarios)
        cells, worst = [], None
        for name, r in refs.items():
            if name not in rates:
                cells.append("-")
                continue
            x = rates[name]
            rb = x / r["best_rate"] if r["best_rate"] else float("inf")
            rr = x / r["round_robin"] if r["round_robin"] else float("inf")
            worst = rb if worst is None else min(worst, rb)
            cells.append(f"{x:.2f} ({rr:.2f}x rr, {rb:.2f}x {r['best']})")
        line = f"| {i} | `{json.dumps(c)}` | " + " | ".join(cells) + f" | {worst:.3f} | {secs:.0f} |"
        lines.append(line)
        print(line, flush=True)
    with open(os.path.join(a.out, "REPORT.md"), "w") as f:
        f.write("\n".join([first_line(), ""] + lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
