#!/usr/bin/env python3
"""sim_cpu_bench.py -- CPU cost of `kvrouter sim` serving many concurrent streams at --time-scale 1.

Experiment sim-cpu: how much CPU does one simulated worker need per stream? Prints its figures and
writes no file (bench/sim/README.md quotes them; no bench/results/ folder).

Starts one sim on 127.0.0.1 (free port), opens N streamed chat completions at once from one asyncio
loop (distinct ~300-token prompts, max_tokens=T, ignore_eos), waits for all of them to finish, and
reads the sim's utime+stime from /proc/PID/stat before and after. Prints the sim's CPU use as a
fraction of one core over the run, the tokens and bytes delivered, the client's own CPU, and the
TPOT p50 (the harness's percentile(), numpy's default linear interpolation).

    python3 bench/scripts/sim-cpu/sim_cpu_bench.py --kvrouter build-rel/kvrouter [--streams 500] \
        [--tokens 250]

The sim is stopped by PID at the end (tests/harness/kvrharness.py's Sim). Build with
-DCMAKE_BUILD_TYPE=Release for meaningful figures.
"""

import argparse
import asyncio
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tests", "harness"))
import kvrharness as h  # noqa: E402


async def run(sim, streams, tokens):
    async def one(i):
        prompt = "stream %d asks about prefix caching and routing. " % i * 25
        return await h.astream(sim.port, "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": prompt}],
                                "max_tokens": tokens, "ignore_eos": True, "stream": True},
                               timeout=600)
    return await asyncio.gather(*(one(i) for i in range(streams)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=250)
    ap.add_argument("--time-scale", default="1")
    args = ap.parse_args()
    # 500 client sockets + the sim's: make sure this process may open them
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.streams)), hard))
    h.set_kvrouter(args.kvrouter)
    with h.Sim("--time-scale", args.time_scale, fixed=None) as sim:
        c0 = sim.cpu_seconds()
        me0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        results = asyncio.run(run(sim, args.streams, args.tokens))
        wall = time.monotonic() - t0
        c1 = sim.cpu_seconds()
        me1 = resource.getrusage(resource.RUSAGE_SELF)
        peak = sim.metric("vllm:generation_tokens_total")
    ok = sum(1 for r in results if r["done"] and len(r["times"]) == args.tokens)
    tokens = sum(len(r["times"]) for r in results)
    nbytes = sum(r["nbytes"] for r in results)
    tpot = [(r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) for r in results
            if len(r["times"]) > 1]
    sim_cpu = c1 - c0
    client_cpu = (me1.ru_utime + me1.ru_stime) - (me0.ru_utime + me0.ru_stime)
    print("streams: %d concurrent, %d completed with %d tokens each" % (args.streams, ok,
                                                                      args.tokens))
    print("wall: %.1f s; tokens delivered: %d (%.0f/s); bytes: %.1f MB; engine tokens %d" % (
        wall, tokens, tokens / wall, nbytes / 1e6, peak))
    print("TPOT p50 %.1f ms (one engine step with %d sequences)" % (
        h.percentile(tpot, 50) * 1e3, args.streams))
    print("sim CPU: %.2f s = %.1f%% of one core (utime+stime from /proc/%d/stat)" % (
        sim_cpu, 100 * sim_cpu / wall, sim.pid))
    print("client CPU: %.2f s = %.1f%% of one core" % (client_cpu, 100 * client_cpu / wall))
    return 0 if ok == args.streams else 1


if __name__ == "__main__":
    sys.exit(main())
