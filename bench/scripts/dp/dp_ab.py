#!/usr/bin/env python3
"""dp_ab.py -- one `vllm serve --data-parallel-size N` seen by the router as one worker or as N
ranks (issue 35): how much of the prompt do the engines find cached, and how are the requests
spread over the engines?

Each run starts one `kvrouter sim --data-parallel-size N --api-server-count 1` (the simulated
engine, --time-scale 20, 3,000 GPU blocks per engine, 40-token answers on average) and one
`kvrouter serve` (kv_aware) in front of it, given either as `--worker URL` (setup `whole`: the
router sees one worker and vLLM's own balancing picks the engine of each request, the lowest
waiting * 4 + running, blind to the cache) or as `--worker URL,dp_size=N` (setup `ranks`: one
worker per rank, each request sent with X-data-parallel-rank). The workload: 6 * N conversations of
4 turns, every conversation in its own thread, all at once (each turn waits for the previous
answer), a 150-phrase system context of its own, seeded text. Per run: prompt tokens and cached
tokens from the answers' usage (prompt_tokens_details.cached_tokens: the sim runs with
--enable-prompt-tokens-details), the requests each engine finished and its prefix-cache hits from
the sim's engine="R" series. Everything on 127.0.0.1; processes stopped by PID
(tests/harness/kvrharness.py).

Writes OUT/raw/dp<N>_seed<S>_<setup>.json (one run each) and OUT/REPORT.md (first line: the
command and commit, bench/scripts/lib/provenance.py): the runs, then per N the medians and ranges.

Run: python3 bench/scripts/dp/dp_ab.py --kvrouter build/kvrouter --out bench/results/dp
     [--dp 2,4] [--seeds 1,2,3,4,5]
"""
import argparse
import json
import os
import statistics
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import kvrharness as h  # noqa: E402
from provenance import first_line  # noqa: E402

TURNS = 4
PER_ENGINE = 6  # conversations per engine


def chat(port, messages):
    r = h.request(port, "POST", "/v1/chat/completions",
                  {"model": h.MODEL, "messages": messages, "max_tokens": 30}, timeout=60)
    if r.status != 200:
        raise RuntimeError("HTTP %d: %r" % (r.status, r.body[:200]))
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]


def conversation(port, seed, c, out, lock):
    hist = [{"role": "system",
             "content": "You are assistant %d of run %d. " % (c, seed) + "Context %d. " % c * 150}]
    for t in range(TURNS):
        hist.append({"role": "user", "content": "Question %d of %d (%d). " % (t, c, seed) * 20})
        text, usage = chat(port, hist)
        hist.append({"role": "assistant", "content": text})
        with lock:
            out.append(usage)


def engine_series(sim, name, n):
    per = [0.0] * n
    for (metric, labels), v in sim.metrics().items():
        e = dict(labels).get("engine")
        if metric == name and e is not None and int(e) < n:
            per[int(e)] += v
    return [int(x) for x in per]


def run(dp, seed, setup):
    with h.Cleanup() as c:
        s = c.add(h.Sim("--data-parallel-size", dp, "--api-server-count", 1, "--time-scale", 20,
                        "--num-gpu-blocks", 3000, "--output-len-mean", 40, "--seed", seed,
                        fixed=None))
        r = c.add(h.Router([s.url + (",dp_size=%d" % dp if setup == "ranks" else "")],
                           *h.FAST))
        h.wait_for(lambda: all(w["scraped"]["fresh"] for w in r.workers()), 10, "scraped")
        usages, lock = [], threading.Lock()
        threads = [threading.Thread(target=conversation, args=(r.port, seed, k, usages, lock))
                   for k in range(PER_ENGINE * dp)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if len(usages) != PER_ENGINE * dp * TURNS:
            raise RuntimeError("%d of %d requests answered" % (len(usages),
                                                               PER_ENGINE * dp * TURNS))
        prompt = sum(u["prompt_tokens"] for u in usages)
        cached = sum(u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in usages)
        return {"dp_size": dp, "seed": seed, "setup": setup, "requests": len(usages),
                "prompt_tokens": prompt, "cached_tokens": cached,
                "cached_share": cached / prompt if prompt else 0.0,
                "engine_requests": engine_series(s, "vllm:request_success_total", dp),
                "engine_prefix_hits": engine_series(s, "vllm:prefix_cache_hits_total", dp),
                "engine_prefix_queries": engine_series(s, "vllm:prefix_cache_queries_total", dp)}


def report(runs, dps):
    lines = [first_line(), "", "# One data-parallel vLLM server: one worker or one per rank", "",
             "`kvrouter sim --data-parallel-size N --api-server-count 1 --time-scale 20 "
             "--num-gpu-blocks 3000 --output-len-mean 40 --seed S` behind `kvrouter serve` "
             "(kv_aware) as `--worker URL` (whole: vLLM's balancing picks the engine) or "
             "`--worker URL,dp_size=N` (ranks); 6 x N conversations of %d turns at once. "
             "Cached share: cached over prompt tokens in the answers' usage." % TURNS, "",
             "| N | seed | setup | requests | prompt tokens | cached tokens | cached share | "
             "requests per engine | engine prefix hits |",
             "|---|---|---|---|---|---|---|---|---|"]
    for x in runs:
        lines.append("| %d | %d | %s | %d | %d | %d | %.1f%% | %s | %s |" % (
            x["dp_size"], x["seed"], x["setup"], x["requests"], x["prompt_tokens"],
            x["cached_tokens"], 100 * x["cached_share"],
            " / ".join(map(str, x["engine_requests"])),
            " / ".join(map(str, x["engine_prefix_hits"]))))
    lines += ["", "## Summary", "",
              "| N | setup | runs | cached share median | min | max | busiest engine's requests "
              "(median share) |", "|---|---|---|---|---|---|---|"]
    for dp in dps:
        for setup in ("whole", "ranks"):
            xs = [x for x in runs if x["dp_size"] == dp and x["setup"] == setup]
            if not xs:
                continue
            shares = [100 * x["cached_share"] for x in xs]
            busiest = [max(x["engine_requests"]) / max(1, sum(x["engine_requests"])) for x in xs]
            lines.append("| %d | %s | %d | %.1f%% | %.1f%% | %.1f%% | %.1f%% |" % (
                dp, setup, len(xs), statistics.median(shares), min(shares), max(shares),
                100 * statistics.median(busiest)))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dp", default="2,4")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    a = ap.parse_args()
    h.set_kvrouter(a.kvrouter)
    dps = [int(x) for x in a.dp.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    os.makedirs(os.path.join(a.out, "raw"), exist_ok=True)
    runs = []
    for dp in dps:
        for seed in seeds:
            for setup in ("whole", "ranks"):
                x = run(dp, seed, setup)
                runs.append(x)
                with open(os.path.join(a.out, "raw", "dp%d_seed%d_%s.json" % (dp, seed, setup)),
                          "w") as f:
                    json.dump(x, f, separators=(",", ":"))
                    f.write("\n")
                print("dp %d seed %d %-5s cached %.1f%%  requests per engine %s" % (
                    dp, seed, setup, 100 * x["cached_share"], x["engine_requests"]), flush=True)
    text = report(runs, dps)
    with open(os.path.join(a.out, "REPORT.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
