#!/usr/bin/env python3
"""model_fleet.py -- what the model-fleet study cells say about models and adapters.

Experiment study (bench/results/study/, issue 35's model-fleet scenario): a reading tool for the
folder `kvrouter bench study --scenarios model-fleet --out DIR` wrote; prints two tables, writes
no file.

1. Per policy, pooled over every level of every seed (each level's JSON, results/*.json, key
   model_fleet): requests that reached a worker, vLLM's 404s for a model the worker does not
   serve, adapter requests and the share sent to a worker whose batch was running the adapter
   (as the decision saw it, from the scraped vllm:lora_requests_info).
2. Per policy, at its first failing level of each seed (the cell's report.md, "Its first failing
   load is R RPS"), the requests slower than the TTFT SLO (1 s) or cut short (no first token, or
   failed), warm-up included, and how many of them name an adapter (requests.jsonl's model), with
   the slowest adapter request's TTFT.

usage: bench/scripts/study/model_fleet.py DIR [TTFT_SLO_MS]
The standard library only.
"""
import collections
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from level_json import find  # noqa: E402


def cells(folder):
    return sorted(glob.glob(os.path.join(folder, "model-fleet", "seed*")))


def placement(folder):
    agg = collections.defaultdict(lambda: collections.Counter())
    for cell in cells(folder):
        for path in glob.glob(os.path.join(cell, "results", "*.json")):
            with open(path) as f:
                mf = find(json.load(f), "model_fleet")
            if mf is None:
                continue
            label = os.path.basename(path).split("_rate")[0]
            agg[label].update(mf)
    print("| policy | requests | 404 (model not served) | adapter requests | to a worker running it |")
    print("|---|---:|---:|---:|---:|")
    total = 0
    for label, c in sorted(agg.items()):
        total += c["requests"]
        share = 100.0 * c["adapter_running"] / c["adapter_requests"] if c["adapter_requests"] else 0
        print("| %s | %d | %d | %d | %.1f%% |" % (label, c["requests"], c["not_served_404"],
                                                 c["adapter_requests"], share))
    print("\n%d requests in all\n" % total)


def first_failing(folder, slo_ms):
    slow, adapter, worst = collections.Counter(), collections.Counter(), {}
    pat = re.compile(r"binds first for `(\w+)`\.\*\* Its first failing load is ([\d.]+) RPS")
    for cell in cells(folder):
        with open(os.path.join(cell, "report.md")) as f:
            first = {m.group(1): float(m.group(2)) for m in pat.finditer(f.read())}
        with open(os.path.join(cell, "requests.jsonl")) as f:
            reqs = [json.loads(line) for line in f if line.strip()]
        for label, rate in first.items():
            for r in reqs:
                if r["label"] != label or abs(r["rate"] - rate) >= 0.01:
                    continue
                if not (r["ttft_ms"] > slo_ms or r["ttft_ms"] < 0 or not r["ok"]):
                    continue
                slow[label] += 1
                if r.get("model", "").startswith("b-"):
                    adapter[label] += 1
                    key = (label, os.path.basename(cell))
                    worst[key] = max(worst.get(key, 0), r["ttft_ms"])
    print("| policy | slow or cut at its first failing levels | of which adapter requests | "
          "slowest adapter TTFT per seed, s |")
    print("|---|---:|---:|---|")
    for label in sorted(slow):
        per_seed = ", ".join("%s %.1f" % (seed, ms / 1000) for (lab, seed), ms in sorted(worst.items())
                             if lab == label)
        print("| %s | %d | %d (%.0f%%) | %s |" % (label, slow[label], adapter[label],
                                                  100.0 * adapter[label] / slow[label], per_seed))


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    folder = argv[1]
    slo_ms = float(argv[2]) if len(argv) > 2 else 1000.0
    if not cells(folder):
        print("model_fleet.py: %s holds no model-fleet/seed* cells" % folder, file=sys.stderr)
        return 2
    placement(folder)
    first_failing(folder, slo_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
