#!/usr/bin/env python3
"""adapter_gate.py -- what kv_aware's LoRA adapter gate is worth (issue 35): the same fleet of
models and adapters in virtual time under round_robin, kv_aware, and kv_aware with the gate off
(`{"adapter_affinity": 0}`: the cost alone decides among the workers serving the request's model).

The fleet and traffic are the study's model-fleet scenario (bench/vcluster/model_fleet.h
KVR_MFLEET_STUDY, bench/vcluster/study.c): 16 workers, 6 serving model-a, 6 serving model-b with
three or four of its four adapters each, and one model-a server of 4 data-parallel ranks; each
model-b worker runs vLLM's --enable-lora --max-loras 2 (the simulated engine: a waiting request
whose adapter would make the batch's adapters more than 2 is skipped until a slot frees, and an
adapter not in a GPU slot costs a copy, from disk if not in the CPU cache either: bench/sim/README.md,
LoRA adapters). Traffic: 60% model-a multi-turn sessions, 20% model-b documents, 5% for each adapter
(hot prefix, multi-turn, documents, no sharing). Per seed, two `kvrouter bench --virtual` runs:

  - search: each label's max SLO-compliant rate (TTFT p99 < 1 s, TPOT p99 < 60 ms; 600 requests
    per level after 20 s of warm-up), from the bench's report;
  - fixed: every label at 12 req/s, the level's TTFT and TPOT and its model_fleet figures (the
    adapter requests by the state the decision saw: running on the chosen worker, loaded, none).

Writes OUT/raw/seed<S>_fixed_<label>.json (the fixed level, per-request arrays dropped,
bench/scripts/lib/level_json.py), OUT/raw/summary.json and OUT/REPORT.md (first line: the command
and commit, bench/scripts/lib/provenance.py). Virtual time: deterministic for a seed, about 25 s
of CPU per seed.

Run: python3 bench/scripts/lora/adapter_gate.py --kvrouter build/kvrouter --out bench/results/lora
     [--seeds 5,6,7]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from level_json import find, slim_level, write_level  # noqa: E402
from provenance import first_line  # noqa: E402

FLEET = ("6*model-a;1*model-b:b-sql+b-chat+b-code;1*model-b:b-sql+b-chat+b-math;"
         "1*model-b:b-sql+b-code+b-math;1*model-b:b-chat+b-code+b-math;"
         "2*model-b:b-sql+b-chat+b-code+b-math;4*model-a@dp")
MIX = ("mix:model-a=multiturn@0.6,model-b=documents@0.2,b-sql=hot-prefix@0.05,"
       "b-chat=multiturn@0.05,b-code=documents@0.05,b-math=control@0.05")
LABELS = ("round_robin", "kv_aware", "kv_aware_no_adapter_gate")
COMMON = ["--ab", "round_robin,kv_aware,kv_aware", "--labels", ",".join(LABELS),
          "--policy-params", 'kv_aware_no_adapter_gate={"adapter_affinity":0}',
          "--model-fleet", FLEET, "--max-loras", "2", "--workload", MIX,
          "--multiturn-mode", "session", "--num-prompts", "600", "--warmup-s", "20",
          "--min-level-s", "0", "--quiet"]
FIXED_RATE = 12


def bench(kvrouter, out, *args):
    cmd = [kvrouter, "bench", "--virtual"] + COMMON + [str(a) for a in args] + ["--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit("bench failed (%d): %s" % (p.returncode, (p.stderr or p.stdout)[-800:]))


def max_rates(report_md):
    """Label -> max SLO-compliant rate from the bench report's capacity table."""
    out, table = {}, False
    with open(report_md) as f:
        for line in f:
            if line.startswith("## "):
                table = line.startswith("## Winner Identification")
            m = re.match(r"\|\s*([a-z_]+)(?:\s+\*\*WINNER\*\*)?\s*\|\D*([0-9.]+)", line)
            if table and m and m.group(1) in LABELS:
                out[m.group(1)] = float(m.group(2))
    missing = [lab for lab in LABELS if lab not in out]
    if missing:
        sys.exit("no max rate for %s in %s" % (missing, report_md))
    return out


def run_seed(kvrouter, seed, raw):
    row = {"seed": seed}
    with tempfile.TemporaryDirectory(prefix="kvr_adapter_gate_") as tmp:
        bench(kvrouter, os.path.join(tmp, "search"), "--search", "--search-start", "4",
              "--seed", seed)
        row["max_rate"] = max_rates(os.path.join(tmp, "search", "report.md"))
        bench(kvrouter, os.path.join(tmp, "fixed"), "--rates", FIXED_RATE, "--seed", seed)
        row["fixed"] = {}
        for lab in LABELS:
            with open(os.path.join(tmp, "fixed", "results", "%s_rate%.2f.json" %
                                   (lab, FIXED_RATE))) as f:
                level = slim_level(json.load(f))
            write_level(os.path.join(raw, "seed%d_fixed_%s.json" % (seed, lab)), level)
            mf = find(level, "model_fleet")
            row["fixed"][lab] = {
                "ttft_p99_ms": find(level, "p99_ttft_ms"), "ttft_mean_ms": find(level, "mean_ttft_ms"),
                "tpot_p99_ms": find(level, "p99_tpot_ms"), "completed": find(level, "completed"),
                "adapter_requests": mf["adapter_requests"], "adapter_running": mf["adapter_running"],
                "adapter_loaded": mf["adapter_loaded"], "adapter_none": mf["adapter_none"]}
    return row


def report(rows, out):
    lines = [first_line(), "", "# kv_aware's LoRA adapter gate, on and off", "",
             "`kvrouter bench --virtual` on the study's model-fleet scenario (16 workers; model-b's "
             "workers list 3-4 of its 4 adapters with --max-loras 2; 20%% of the requests name an "
             "adapter), labels round_robin, kv_aware, and kv_aware with "
             "`{\"adapter_affinity\":0}`. Max rate: the highest SLO-compliant rate of a search "
             "(TTFT p99 < 1 s, TPOT p99 < 60 ms). At %d req/s: TTFT p99 and mean over all requests, "
             "and the adapter requests whose chosen worker was running the adapter (the scraped "
             "vllm:lora_requests_info) or only had it loaded." % FIXED_RATE, "",
             "| seed | label | max rate (req/s) | TTFT p99 at %d (ms) | TTFT mean (ms) | TPOT p99 (ms) "
             "| adapter requests: running / loaded / none |" % FIXED_RATE,
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        for lab in LABELS:
            f = r["fixed"][lab]
            lines.append("| %d | %s | %.2f | %.0f | %.0f | %.1f | %d / %d / %d of %d |" % (
                r["seed"], lab, r["max_rate"][lab], f["ttft_p99_ms"], f["ttft_mean_ms"],
                f["tpot_p99_ms"], f["adapter_running"], f["adapter_loaded"], f["adapter_none"],
                f["adapter_requests"]))
    lines += ["", "Medians over the seeds (range):", "",
              "| label | max rate (req/s) | TTFT p99 at %d (ms) | running share of adapter requests |"
              % FIXED_RATE, "|---|---:|---:|---:|"]
    for lab in LABELS:
        rate = [r["max_rate"][lab] for r in rows]
        p99 = [r["fixed"][lab]["ttft_p99_ms"] for r in rows]
        share = [r["fixed"][lab]["adapter_running"] / r["fixed"][lab]["adapter_requests"]
                 for r in rows]
        lines.append("| %s | %.2f (%.2f-%.2f) | %.0f (%.0f-%.0f) | %.1f%% (%.1f-%.1f%%) |" % (
            lab, statistics.median(rate), min(rate), max(rate), statistics.median(p99), min(p99),
            max(p99), 100 * statistics.median(share), 100 * min(share), 100 * max(share)))
    with open(os.path.join(out, "REPORT.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="5,6,7")
    args = ap.parse_args()
    raw = os.path.join(args.out, "raw")
    os.makedirs(raw, exist_ok=True)
    rows = [run_seed(os.path.abspath(args.kvrouter), int(s), raw) for s in args.seeds.split(",")]
    with open(os.path.join(raw, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    report(rows, args.out)
    print(open(os.path.join(args.out, "REPORT.md")).read())


if __name__ == "__main__":
    main()
