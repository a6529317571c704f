#!/usr/bin/env python3
"""replicas.py -- how often two kvrouter replicas agree, what a second replica costs, and how far
the router's cache prediction is from what the workers report, precise against approximate.

Experiment replicas (bench/results/replicas/): with --out writes OUT/REPORT.md (its first line the
command and the commit, from bench/scripts/lib/provenance.py) and OUT/replicas.json (the rows the
table is made from); committed: OUT = bench/results/replicas. Without --out it only prints.

Runs the same multi-turn load (CONV conversations of TURNS turns, a long system prompt per
conversation, CONCURRENCY client threads) against fresh `kvrouter sim` workers (--time-scale,
default 20; 1 is real time, KV events on ipc:// sockets in a temporary folder) in these set-ups:

  one        one router, precise mode (the workers' KV events)
  approx     one router, approximate index only (what it learned from routing)
  replicas   two routers, both precise, each reading the other's load (--peer polls)
  synced     two routers, both precise, each announcing its requests and scrapes to the other as
             they happen (--peer-sync-listen; the polls stay as the fallback)
  blind      two routers, approximate index only, no --peer (each sees only its own traffic)

Requests alternate between the two routers. Before each one is sent to router X, the same body is
given to the other router Y's POST /admin/route/explain (which decides without routing, tokenizing
like the proxy); agreement is the share of requests for which Y would have picked the worker X
then used (compared by worker URL: ids differ between replicas), over all turns and over the later
turns (whose history some worker holds). The noise floor is X's own explanation just before it
decides ("same router 1 ms earlier"): the load moves between the two calls, the more so the higher
the time scale. "Explanations agree" compares Y's and X's explanations, taken one after the other
before the request: the two replicas' views at (nearly) the same moment. Beside it, per set-up: the
prompt tokens the workers served from their cache (usage cached_tokens / prompt_tokens), the
router's predicted-vs-reported cached-token gap, and the request latency (non-streaming, p50/p95,
scaled back by the time scale).

    python3 bench/scripts/replicas/replicas.py --kvrouter build/kvrouter \
        --out bench/results/replicas \
        --setups one,approx,replicas,synced,blind --conversations 48 --time-scale 1 \
        --peer-interval-ms 200

Loopback only; every process is stopped by its PID (tests/harness/kvrharness.py).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tests", "harness"))
import kvrharness as h  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from provenance import first_line  # noqa: E402

SCALE = 20


def start_sims(d, n, blocks, args):
    sims, specs = [], []
    for i in range(n):
        s, spec = h.kv_event_sim(d, i, "--time-scale", args.time_scale, "--num-gpu-blocks", blocks,
                                 "--output-len-mean", 120, admin=False)
        sims.append(s)
        specs.append((s.url, spec))
    return sims, specs


def start_routers(specs, setup, args):
    flags = ["--scrape-interval-ms", args.scrape_interval_ms, "--peer-interval-ms",
             args.peer_interval_ms]
    if setup == "one":
        return [h.Router([p for _, p in specs], *flags)]
    if setup == "approx":
        return [h.Router([u for u, _ in specs], *flags)]
    pa, pb = h.closed_port(), h.closed_port()
    workers = [p if setup in ("replicas", "synced") else u for u, p in specs]
    peer = setup in ("replicas", "synced")
    if setup == "synced":
        flags += ["--peer-sync-listen", "tcp://127.0.0.1:*"]
    a = h.Router(workers, "--admin-listen", "127.0.0.1:%d" % pa, *flags,
                 *(["--peer", "http://127.0.0.1:%d" % pb] if peer else []))
    b = h.Router(workers, "--admin-listen", "127.0.0.1:%d" % pb, *flags,
                 *(["--peer", "http://127.0.0.1:%d" % pa] if peer else []))
    return [a, b]


def worker_urls(router):
    return {w["id"]: w["url"] for w in router.workers()}


def run(setup, args, d):
    sims, specs = start_sims(d, args.workers, args.blocks, args)
    routers = []
    try:
        routers = start_routers(specs, setup, args)
        if setup in ("one", "replicas", "synced"):
            for r in routers:
                h.wait_for(lambda: all((w["kv_events"] or {}).get("index") == "precise"
                                       for w in r.workers()), 15, "precise mode")
        if setup == "synced":
            for r in routers:
                h.wait_for(lambda: h.prom_value(h.parse_prom_samples(r.metrics_text()),
                                                "kvrouter_peer_sync_live") >= 1, 15, "peer sync")
        urls = [worker_urls(r) for r in routers]
        lock = threading.Lock()
        stats = {"n": 0, "agree": 0, "compared": 0, "prompt": 0, "cached": 0, "lat": [],
                 "errors": 0, "warm_agree": 0, "warm_compared": 0, "self_agree": 0,
                 "ex_agree": 0, "ex_compared": 0,
                 "dump": []}
        counter = [0]

        def conversation(c):
            msgs = [{"role": "system",
                     "content": ("Conversation %d. " % c) + ("Background %d. " % c) * 300}]
            for t in range(args.turns):
                msgs.append({"role": "user", "content": "Turn %d question, details %d. " % (t, c)
                             * 15})
                body = {"model": h.MODEL, "messages": msgs, "max_tokens": 60}
                with lock:
                    k = counter[0]
                    counter[0] += 1
                x = k % len(routers)
                y = (x + 1) % len(routers)
                other = None
                if len(routers) == 2:
                    ex = h.request(routers[y].admin_port, "POST", "/admin/route/explain", body,
                                   timeout=30)
                    other = (ex.json().get("choice") or {}).get("url") if ex.status == 200 else None
                    other_ex = ex.json() if ex.status == 200 else None
                # the noise floor: the same router's own explanation just before it decides
                ex = h.request(routers[x].admin_port, "POST", "/admin/route/explain", body,
                               timeout=30)
                own = (ex.json().get("choice") or {}).get("url") if ex.status == 200 else None
                own_ex = ex.json() if ex.status == 200 else None
                t0 = time.time()
                r = h.request(routers[x].port, "POST", "/v1/chat/completions", body, timeout=120)
                lat = (time.time() - t0) * args.time_scale
                if r.status != 200:
                    with lock:
                        stats["errors"] += 1
                    return
                resp = r.json()
                served = urls[x].get(int(r.header("x-kvrouter-worker") or -1))
                u = resp["usage"]
                with lock:
                    stats["n"] += 1
                    stats["prompt"] += u["prompt_tokens"]
                    stats["cached"] += (u.get("prompt_tokens_details") or {}).get(
                        "cached_tokens", 0)
                    stats["lat"].append(lat)
                    stats["self_agree"] += own == served
                    if other is not None and own is not None:
                        stats["ex_compared"] += 1
                        stats["ex_agree"] += other == own
                    if other is not None:
                        stats["compared"] += 1
                        stats["agree"] += other == served
                        if other != served and args.dump:
                            stats["dump"].append({"turn": t, "served": served, "other": other,
                                                  "own": own, "other_ex": other_ex,
                                                  "own_ex": own_ex})
                        if t > 0:  # a later turn: its history is cached somewhere
                            stats["warm_compared"] += 1
                            stats["warm_agree"] += other == served
                msgs.append({"role": "assistant", "content": resp["choices"][0]["message"]
                             ["content"]})

        pending = list(range(args.conversations))
        plock = threading.Lock()

        def client():
            while True:
                with plock:
                    if not pending:
                        return
                    c = pending.pop(0)
                conversation(c)

        ts = [threading.Thread(target=client) for _ in range(args.concurrency)]
        t_start = time.time()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.time() - t_start
        pred = act = 0.0
        for r in routers:
            m = h.parse_prom_samples(r.metrics_text())
            pred += h.prom_value(m, "kvrouter_worker_usage_predicted_cached_tokens_total")
            act += h.prom_value(m, "kvrouter_worker_usage_cached_tokens_total")
        lat = sorted(stats["lat"])
        if args.dump:
            with open("%s.%s.json" % (args.dump, setup), "w") as f:
                json.dump(stats["dump"], f, indent=1)
        return {
            "setup": setup, "routers": len(routers), "requests": stats["n"],
            "errors": stats["errors"],
            "agreement": stats["agree"] / stats["compared"] if stats["compared"] else None,
            "compared": stats["compared"],
            "explain_agreement": stats["ex_agree"] / stats["ex_compared"]
            if stats["ex_compared"] else None,
            "self_agreement": stats["self_agree"] / stats["n"] if stats["n"] else None,
            "warm_agreement": stats["warm_agree"] / stats["warm_compared"]
            if stats["warm_compared"] else None,
            "cached_share": stats["cached"] / stats["prompt"] if stats["prompt"] else 0,
            "prediction_gap": (pred - act) / act if act else None,
            "latency_p50_s": h.percentile(lat, 50) if lat else None,
            "latency_p95_s": h.percentile(lat, 95) if lat else None,
            "wall_s": wall,
        }
    finally:
        for r in routers:
            r.stop()
        for s in sims:
            s.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--out", default=None, help="folder for REPORT.md and replicas.json")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=6000, help="KV blocks per sim")
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--setups", default="one,approx,replicas,synced,blind")
    ap.add_argument("--peer-interval-ms", type=int, default=10)
    ap.add_argument("--time-scale", type=float, default=SCALE,
                    help="the sims' time scale (1 = real time: the few milliseconds between "
                    "the explanations and the request are then what they are in a deployment)")
    ap.add_argument("--scrape-interval-ms", type=int, default=200)
    ap.add_argument("--dump", default=None,
                    help="write each disagreement (both explanations) to DUMP.<setup>.json")
    args = ap.parse_args()
    h.set_kvrouter(args.kvrouter)
    d = tempfile.mkdtemp(prefix="kvr-replicas-")
    rows = []
    try:
        for setup in args.setups.split(","):
            row = run(setup, args, d)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    lines = [first_line(), "", "# Two router replicas: agreement and cost", "",
             "Set-ups %s; %d workers, %d conversations x %d turns, %d clients, time scale %g, "
             "--peer-interval-ms %d, --scrape-interval-ms %d; latencies scaled back." % (
                 args.setups, args.workers, args.conversations, args.turns, args.concurrency,
                 args.time_scale, args.peer_interval_ms, args.scrape_interval_ms), "",
             "| set-up | routers | requests | errors | agreement | agreement, later turns | "
             "explanations agree | same router 1 ms earlier | cached share | prediction gap | "
             "latency p50 | latency p95 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        agree = "%.1f%% of %d" % (100 * r["agreement"], r["compared"]) if r["agreement"] is not None \
            else "n/a"
        gap = "%+.2f%%" % (100 * r["prediction_gap"]) if r["prediction_gap"] is not None else "n/a"
        warm = "%.1f%%" % (100 * r["warm_agreement"]) if r["warm_agreement"] is not None else "n/a"
        selfa = "%.1f%%" % (100 * r["self_agreement"]) if r["self_agreement"] is not None else "n/a"
        exa = "%.1f%%" % (100 * r["explain_agreement"]) if r["explain_agreement"] is not None \
            else "n/a"
        lines.append("| %s | %d | %d | %d | %s | %s | %s | %s | %.1f%% | %s | %.2f s | %.2f s |" % (
            r["setup"], r["routers"], r["requests"], r["errors"], agree, warm, exa, selfa,
            100 * r["cached_share"], gap, r["latency_p50_s"] or 0, r["latency_p95_s"] or 0))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "REPORT.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "replicas.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
