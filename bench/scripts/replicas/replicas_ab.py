#!/usr/bin/env python3
"""replicas_ab.py -- the A/B of two router replicas against one: each set-up's max SLO-compliant
request rate on the same workers and workload, in real time.

For each set-up, fresh `kvrouter sim` workers (KV events on ipc:// sockets in a temporary folder,
--time-scale S) and:

  one       one `kvrouter serve`, precise mode (the workers' KV events), policy kv_aware
  synced    two replicas, both precise, each announcing its requests and scrapes to the other
            (--peer ADMIN_URL --peer-sync-listen); the bench alternates requests between them, as
            a Service over the replicas would
  polled    the same two replicas without --peer-sync-listen (each polls the other's
            GET /admin/load every --peer-interval-ms)

then `kvrouter bench --search` (the SLO search of the README) against the router(s), with the
scenario's flags and the level shape of `kvrouter bench study` (100 measured requests after the
scenario's warm-up, levels of at least 60 simulated seconds). The max SLO-compliant rate is the
highest passing rate below the lowest failing one, read from the levels' results JSON.

Experiment replicas (bench/results/replicas/), its max-rate part: writes OUT/REPORT.md (its first
line the command and the commit, from bench/scripts/lib/provenance.py), OUT/replicas_ab.json (the
rows the table is made from) and each set-up's bench output under OUT/<set-up>/ (report.md and
results/*.json kept in git, the latter without its per-request arrays; report.html and
requests.jsonl are not). Committed: OUT = bench/results/replicas/ab.

    python3 bench/scripts/replicas/replicas_ab.py --kvrouter build/kvrouter \
        --out bench/results/replicas/ab

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
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tests", "harness"))
import kvrharness as h  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from level_json import slim_file  # noqa: E402
from provenance import first_line  # noqa: E402
from scenarios import LEVEL, SCENARIOS  # noqa: E402

def start_sims(d, args):
    pairs = [h.kv_event_sim(d, i, "--time-scale", args.time_scale, *args.sim_flag, admin=False)
             for i in range(args.workers)]
    return [s for s, _ in pairs], [spec for _, spec in pairs]


def start_routers(specs, setup, args):
    flags = ["--policy", "kv_aware", "--access-log", "false", "--scrape-interval-ms",
             args.scrape_interval_ms]
    if setup == "one":
        return [h.Router(specs, *flags)]
    pa, pb = h.closed_port(), h.closed_port()
    peer = ["--peer-interval-ms", args.peer_interval_ms]
    if setup == "synced":
        peer += ["--peer-sync-listen", "tcp://127.0.0.1:*"]
    a = h.Router(specs, "--admin-listen", "127.0.0.1:%d" % pa, "--peer",
                 "http://127.0.0.1:%d" % pb, *(flags + peer))
    b = h.Router(specs, "--admin-listen", "127.0.0.1:%d" % pb, "--peer",
                 "http://127.0.0.1:%d" % pa, *(flags + peer))
    return [a, b]


def max_rate(out):
    """(max SLO-compliant rate, found, {rate: level json}) from a bench's results folder."""
    levels = {}
    for f in glob.glob(os.path.join(out, "results", "*.json")):
        with open(f) as fh:
            j = json.load(fh)
        levels[j["request_rate"]] = j
    failing = [r for r, j in levels.items() if not j["kvrouter"]["slo_pass"]]
    limit = min(failing) if failing else float("inf")
    passing = [r for r, j in levels.items() if j["kvrouter"]["slo_pass"] and r < limit]
    return (max(passing) if passing else 0.0), bool(failing), levels


def run(setup, args, d):
    sims, specs = start_sims(d, args)
    routers = []
    try:
        routers = start_routers(specs, setup, args)
        for r in routers:
            h.wait_for(lambda: all((w["kv_events"] or {}).get("index") == "precise"
                                   for w in r.workers()), 30, "precise mode")
        if setup == "synced":
            for r in routers:
                h.wait_for(lambda: h.prom_value(h.parse_prom_samples(r.metrics_text()),
                                                "kvrouter_peer_sync_live") >= 1, 15, "peer sync")
        out = os.path.join(args.out, setup)
        shutil.rmtree(out, ignore_errors=True)
        urls = ",".join("http://127.0.0.1:%d" % r.port for r in routers)
        cmd = [args.kvrouter, "bench", "--url", urls, "--admin",
               "http://127.0.0.1:%d" % routers[0].admin_port, *LEVEL,
               *SCENARIOS[args.workload], "--search", "--search-start", str(args.search_start),
               "--search-resolution", str(args.search_resolution), "--time-scale",
               str(args.time_scale), "--seed", str(args.seed), "--out", out, "--quiet"]
        t0 = time.time()
        print("==", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, timeout=args.timeout_s)
        rate, found, levels = max_rate(out)
        for f in glob.glob(os.path.join(out, "results", "*.json")):
            slim_file(f)
        return {"setup": setup, "routers": len(routers), "max_rate": rate, "found": found,
                "levels": {str(k): {"slo_pass": v["kvrouter"]["slo_pass"],
                                    "p99_ttft_ms": v["p99_ttft_ms"],
                                    "p50_ttft_ms": v["p50_ttft_ms"],
                                    "router_cached": v["kvrouter"].get("router_cached")}
                           for k, v in sorted(levels.items())},
                "seconds": time.time() - t0}
    finally:
        for r in routers:
            r.stop()
        for s in sims:
            s.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--setups", default="one,synced,polled")
    ap.add_argument("--workload", default="multiturn")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--search-start", type=float, default=2)
    ap.add_argument("--search-resolution", type=float, default=0.05)
    ap.add_argument("--peer-interval-ms", type=int, default=200)
    ap.add_argument("--scrape-interval-ms", type=int, default=100)
    ap.add_argument("--timeout-s", type=int, default=3600)
    ap.add_argument("--sim-flag", action="append", default=[],
                    help="an extra flag for every sim (repeat)")
    args = ap.parse_args()
    h.set_kvrouter(args.kvrouter)
    os.makedirs(args.out, exist_ok=True)
    d = tempfile.mkdtemp(prefix="kvr-replicas-ab-")
    rows = []
    t0 = time.time()
    try:
        for setup in args.setups.split(","):
            rows.append(run(setup, args, d))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "levels"}), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    base = next((r for r in rows if r["setup"] == "one"), None)
    lines = [first_line(), "",
             "# Two router replicas against one: max SLO-compliant rate (real time)", "",
             "Set-ups %s, workload %s, time scale %g, %d workers, seed %d, search resolution %g "
             "req/s, --peer-interval-ms %d, --scrape-interval-ms %d; %.0f s. Rates are simulated "
             "req/s." % (
                 args.setups, args.workload, args.time_scale, args.workers, args.seed,
                 args.search_resolution, args.peer_interval_ms, args.scrape_interval_ms,
                 time.time() - t0), "",
             "| set-up | routers | max SLO rate | against one router | levels |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        rate = ("%.3f" % r["max_rate"]) if r["found"] else ("at least %.3f" % r["max_rate"])
        ratio = "%.2fx" % (r["max_rate"] / base["max_rate"]) if base and base["max_rate"] \
            else "-"
        lines.append("| %s | %d | %s | %s | %d |" % (r["setup"], r["routers"], rate, ratio,
                                                   len(r["levels"])))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "REPORT.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "replicas_ab.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
