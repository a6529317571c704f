#!/usr/bin/env python3
"""precise_realtime.py -- precise mode against the approximate index in real time, on every study
scenario: the router's predicted-vs-reported cached-token gap and the latency each mode gives at
one fixed load, the real-time confirmation of bench/results/precise/REPORT.md (virtual time).

Experiment precise (bench/results/precise/), its real-time part: writes OUT/REPORT.md (its first
line the command and the commit, from bench/scripts/lib/provenance.py), OUT/precise_rt.json
(precise_rt_flush.json with --flush: the rows the table is made from) and each run's bench output
under OUT/<scenario>-<mode>[+flush]/ (report.md and results/*.json kept in git, the latter without
its per-request arrays; report.html and requests.jsonl are not). Committed: OUT =
bench/results/precise/realtime, and with --flush 5 bench/results/precise/realtime-flush.

For each scenario (the workloads and flags of `kvrouter bench study`, bench/vcluster/study.c) and
each mode, fresh `kvrouter sim` workers (--time-scale S, KV events on ipc:// sockets; the
mixed fleet's last worker with half the KV blocks) and one `kvrouter serve --policy kv_aware`:

  approximate   the workers as plain URLs: the router's own index, learned from routing
  precise       the workers with kv_events/kv_replay: the index the engines' events build

then one `kvrouter bench` level at the scenario's rate (--rate-scale x kv_aware's precise max SLO
rate in virtual time, from the virtual report's table, given below as RATES), with --admin so the
level's results JSON carries the router's predicted and reported cached tokens
(kvrouter.router_cached). With --flush, every FLUSH simulated seconds one worker (in turn) empties
its prefix cache through its POST /reset_prefix_cache without the router being told (the case
built to break the guess).

    python3 bench/scripts/precise/precise_realtime.py --kvrouter build/kvrouter \
        --out bench/results/precise/realtime

Loopback only; every process is stopped by its PID (tests/harness/kvrharness.py).
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tests", "harness"))
import kvrharness as h  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from level_json import slim_file  # noqa: E402
from provenance import first_line  # noqa: E402
from scenarios import FULL_BLOCKS, HALF_BLOCKS, LEVEL, SCENARIOS  # noqa: E402

# kv_aware's max SLO-compliant rate in precise mode, virtual time (bench/results/precise/
# REPORT.md, the `precise` column): the load each scenario runs at, times --rate-scale.
RATES = {"multiturn": 7.76, "documents": 11.84, "control": 2.79, "agentic": 1.00,
         "hot-prefix": 8.41, "bursty": 7.64, "mixed-fleet": 10.76}

def start_sims(d, scenario, args):
    sims, precise, plain = [], [], []
    for i in range(args.workers):
        blocks = HALF_BLOCKS if scenario == "mixed-fleet" and i == args.workers - 1 \
            else FULL_BLOCKS
        s, spec = h.kv_event_sim(d, i, "--time-scale", args.time_scale, "--num-gpu-blocks",
                                 blocks, *args.sim_flag, admin=False)
        sims.append(s)
        precise.append(spec)
        plain.append(s.url)
    return sims, precise, plain


def flusher(sims, every_real_s, stop):
    """Empties one worker's prefix cache every every_real_s, in turn, until stop is set."""
    k = 0
    while not stop.wait(every_real_s):
        s = sims[k % len(sims)]
        h.request(s.port, "POST", "/reset_prefix_cache", None, timeout=10)
        k += 1


def run(scenario, mode, args, d):
    sims, precise, plain = start_sims(d, scenario, args)
    router = None
    stop = threading.Event()
    t = None
    try:
        router = h.Router(precise if mode == "precise" else plain, "--policy", "kv_aware",
                          "--access-log", "false", "--scrape-interval-ms",
                          args.scrape_interval_ms)
        if mode == "precise":
            h.wait_for(lambda: all((w["kv_events"] or {}).get("index") == "precise"
                                   for w in router.workers()), 30, "precise mode")
        if args.flush:
            t = threading.Thread(target=flusher, args=(sims, args.flush / args.time_scale, stop),
                                 daemon=True)
            t.start()
        out = os.path.join(args.out, "%s-%s%s" % (scenario, mode, "+flush" if args.flush else ""))
        shutil.rmtree(out, ignore_errors=True)
        rate = RATES[scenario] * args.rate_scale
        cmd = [args.kvrouter, "bench", "--url", "http://127.0.0.1:%d" % router.port, "--admin",
               "http://127.0.0.1:%d" % router.admin_port, *LEVEL, *SCENARIOS[scenario], "--rates",
               "%.3f" % rate, *(["--num-prompts", str(args.num_prompts)] if args.num_prompts
                                else []), "--time-scale", str(args.time_scale), "--seed",
               str(args.seed), "--no-reset-cache", "--out", out,
               "--quiet"]
        print("==", scenario, mode, " ".join(cmd), flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True, timeout=args.timeout_s)
        files = glob.glob(os.path.join(out, "results", "*.json"))
        assert len(files) == 1, files
        with open(files[0]) as f:
            j = json.load(f)
        slim_file(files[0])
        k = j["kvrouter"]
        return {"scenario": scenario, "mode": mode, "flush": args.flush, "rate": rate,
                "slo_pass": k["slo_pass"], "p50_ttft_ms": j["p50_ttft_ms"],
                "p99_ttft_ms": j["p99_ttft_ms"], "p99_tpot_ms": j["p99_tpot_ms"],
                "goodput": j["request_goodput"], "router_cached": k.get("router_cached"),
                "send_lag_p99_ms": k["send_lag_real_ms"]["p99"], "seconds": time.time() - t0}
    finally:
        stop.set()
        if t:
            t.join(15)
        if router:
            router.stop()
        for s in sims:
            s.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=4)
    ap.add_argument("--rate-scale", type=float, default=0.8)
    ap.add_argument("--num-prompts", type=int, default=None,
                    help="measured requests per run (default: the study's, 100; agentic 300)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--scrape-interval-ms", type=int, default=100)
    ap.add_argument("--flush", type=float, default=0,
                    help="every FLUSH simulated seconds one worker's prefix cache is emptied")
    ap.add_argument("--timeout-s", type=int, default=1800)
    ap.add_argument("--sim-flag", action="append", default=[],
                    help="an extra flag for every sim (repeat)")
    args = ap.parse_args()
    h.set_kvrouter(args.kvrouter)
    os.makedirs(args.out, exist_ok=True)
    d = tempfile.mkdtemp(prefix="kvr-precise-rt-")
    rows = []
    t0 = time.time()
    try:
        for sc in args.scenarios.split(","):
            for mode in ("approximate", "precise"):
                rows.append(run(sc, mode, args, d))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    name = "precise_rt%s" % ("_flush" if args.flush else "")
    lines = [first_line(), "", "# Precise mode against the approximate index (real time)", "",
             "Time scale %g, rate scale %g%s, %d workers, policy kv_aware, %s measured requests "
             "per run after the scenario's warm-up, seed %d; %.0f s. Each scenario at %g x "
             "kv_aware's precise max SLO rate in virtual time (simulated req/s). Gap = (predicted "
             "- reported) / reported cached prompt tokens over the level's requests (warm-up "
             "included)." % (
                 args.time_scale, args.rate_scale, (", a flush every %g simulated s" % args.flush)
                 if args.flush else "", args.workers, args.num_prompts or "100 (agentic 300)",
                 args.seed, time.time() - t0, args.rate_scale), "",
             "| scenario | rate | mode | gap | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p99 (ms) | "
             "goodput (req/s) | SLO | send lag p99 (real ms) |",
             "|---|---:|---|---:|---:|---:|---:|---:|:-:|---:|"]
    for r in rows:
        rc = r["router_cached"] or {}
        gap = "%+.2f%%" % (100 * rc["gap"]) if rc.get("gap") is not None else "-"
        lines.append("| %s | %.2f | %s | %s | %.0f | %.0f | %.1f | %.2f | %s | %.1f |" % (
            r["scenario"], r["rate"], r["mode"], gap, r["p50_ttft_ms"], r["p99_ttft_ms"],
            r["p99_tpot_ms"], r["goodput"], "pass" if r["slo_pass"] else "fail",
            r["send_lag_p99_ms"]))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "REPORT.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
