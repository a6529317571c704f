#!/usr/bin/env python3
"""calibrate.py -- one simulated worker under the seed's Phase 0 load, side by side with the seed.

Owns the calibration of `kvrouter sim` against the phase0 column of the team's tuning report
(shared/seeds/002_03f57bbc2fe6bc6c.txt, copied below as SEED so the table needs no other file).

Flow: start one `kvrouter sim` on 127.0.0.1 (a free port, --time-scale N), run `kvrouter bench`
against it with the seed's load shape (300 prompts per rate drawn from one fixed dataset of 100
5-turn `multiturn` conversations, 500 prompts, the same dataset at every rate as `vllm bench serve`
replays one file; Poisson arrivals, rates 0.5-3.0 req/s, ~500 output tokens per request, the
history carrying dataset answers of normal(1000, 700) tokens so prompts average ~5.8k tokens), stop
the sim by its PID, then read the bench's per-level results JSON and write a Markdown table: for
each rate the seed's TTFT p99, TPOT p99, output tok/s and max concurrent next to the simulator's,
the difference in percent, whether it is within the tolerance (20%), and the max SLO-compliant
rate of both.

usage: bench/scripts/calibrate.py [--kvrouter build/kvrouter] [--out DIR] [--md bench/results/CALIBRATION.md]
                          [--time-scale 10] [--sim-arg=--cost-fixed-ms=22 ...] [--bench-arg=...]
Exit status 0 when the run completed (the table says whether every figure is within tolerance).
"""
import argparse
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time

# phase0 column of shared/seeds/002_03f57bbc2fe6bc6c.txt: rate -> (TTFT p99 ms, TPOT p99 ms,
# output tok/s, max concurrent)
SEED = {
    0.50: (770, 29, 252, 16),
    0.75: (646, 34, 371, 20),
    1.00: (703, 41, 485, 30),
    1.25: (801, 42, 594, 35),
    1.50: (981, 43, 695, 41),
    2.00: (953, 49, 867, 59),
    2.50: (978, 67, 1008, 89),
    3.00: (1020, 75, 1110, 112),
}
SEED_MAX_RATE = 2.0
SLO_TTFT_MS, SLO_TPOT_MS = 1000.0, 60.0
TOLERANCE = 0.20

# The seed's load shape, as `kvrouter bench` options.
BENCH_ARGS = [
    "--workload", "multiturn", "--multiturn-mode", "replay", "--replay-order", "sample",
    "--replay-dataset", "100", "--answer-mean", "1000", "--answer-std", "700",
    "--output-mean", "500", "--output-std", "150", "--output-min", "64", "--output-max", "2048",
    "--num-prompts", "300", "--warmup", "10", "--burstiness", "1", "--cooldown-s", "5",
]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("kvrouter sim exited with status %d" % proc.returncode)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("kvrouter sim did not listen on port %d within %.0f s" % (port, timeout_s))


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def load_levels(results_dir):
    levels = {}
    for name in os.listdir(results_dir):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(results_dir, name)) as f:
            d = json.load(f)
        levels[round(float(d["request_rate"]), 2)] = d
    return levels


def pct_diff(sim, seed):
    return 100.0 * (sim - seed) / seed


def max_slo_rate(rows):
    """Highest passing rate below the lowest failing one (the report's rule)."""
    best = 0.0
    for rate, ttft, tpot in sorted(rows):
        if ttft < SLO_TTFT_MS and tpot < SLO_TPOT_MS:
            best = rate
        else:
            break
    return best


def render(levels, args, cmd, elapsed_s):
    out = []
    w = out.append
    w("# Calibration: one simulated worker vs the seed's Phase 0\n")
    w("Produced by `%s` on %s (%s, %d cores), %.0f s.\n" %
      (" ".join(cmd), datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
       platform.machine(), os.cpu_count() or 0, elapsed_s))
    w("Target: the phase0 column of the team's tuning report (shared/seeds/002_03f57bbc2fe6bc6c.txt: "
      "Llama-3.3-70B FP8 on one H200, vLLM 0.14.1 defaults, `vllm bench serve`, 300 prompts per rate "
      "from a custom multi-turn dataset, ~5,806 input tokens on average, Poisson). Load here: one "
      "`kvrouter sim` with its default cost model at time scale %g, driven by `kvrouter bench %s` "
      "(figures in simulated time). Tolerance: within %d%% of the seed.\n" %
      (args.time_scale, " ".join(BENCH_ARGS + args.bench_arg), int(TOLERANCE * 100)))
    w("| rate | TTFT p99 seed | sim | diff | TPOT p99 seed | sim | diff | out tok/s seed | sim | diff "
      "| max conc seed | sim | diff | avg input tok |")
    w("|---:" * 14 + "|")
    within = total = 0
    rows = []
    for rate in sorted(SEED):
        s = SEED[rate]
        d = levels.get(rate)
        if d is None:
            w("| %.2f | %d | - | - | %d | - | - | %d | - | - | %d | - | - | - |" % (rate, *s))
            continue
        sim = (d["p99_ttft_ms"], d["p99_tpot_ms"], d["output_throughput"],
               d["max_concurrent_requests"])
        rows.append((rate, sim[0], sim[1]))
        cells = []
        for a, b in zip(s, sim):
            diff = pct_diff(b, a)
            ok = abs(diff) <= TOLERANCE * 100
            within += ok
            total += 1
            cells.append("%s | %s | %+.0f%%%s" % (a, ("%.0f" % b if b >= 100 else "%.1f" % b), diff,
                                                 "" if ok else " **x**"))
        avg_in = d["total_input_tokens"] / max(d["completed"], 1)
        w("| %.2f | %s | %.0f |" % (rate, " | ".join(cells), avg_in))
    sim_max = max_slo_rate(rows)
    w("")
    w("%d of %d figures within %d%% (**x** marks the others). Max SLO-compliant rate (TTFT p99 < "
      "%.0f ms and TPOT p99 < %.0f ms): seed %.2f req/s (its rerun 1.50), simulator %.2f req/s.\n" %
      (within, total, int(TOLERANCE * 100), SLO_TTFT_MS, SLO_TPOT_MS, SEED_MAX_RATE, sim_max))
    return "\n".join(out), within, total, sim_max


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvrouter", default="build/kvrouter")
    ap.add_argument("--out", default="results/calibration")
    ap.add_argument("--md", default="bench/results/CALIBRATION.md")
    ap.add_argument("--time-scale", type=float, default=10)
    ap.add_argument("--rates", default=",".join("%g" % r for r in sorted(SEED)))
    ap.add_argument("--sim-arg", action="append", default=[])
    ap.add_argument("--bench-arg", action="append", default=[])
    args = ap.parse_args()
    if not os.access(args.kvrouter, os.X_OK):
        sys.exit("calibrate.py: %s is not an executable (build first)" % args.kvrouter)

    port = free_port()
    sim_cmd = [args.kvrouter, "sim", "--listen", "127.0.0.1:%d" % port, "--time-scale",
               "%g" % args.time_scale, "--log-level", "warn"] + args.sim_arg
    bench_cmd = [args.kvrouter, "bench", "--url", "http://127.0.0.1:%d" % port, "--time-scale",
                 "%g" % args.time_scale, "--rates", args.rates, "--out", args.out,
                 "--title", "Calibration: one kvrouter sim under the seed's Phase 0 load"]
    bench_cmd += BENCH_ARGS + args.bench_arg
    t0 = time.monotonic()
    sim = subprocess.Popen(sim_cmd)
    try:
        wait_listening(port, sim)
        rc = subprocess.call(bench_cmd)
    finally:
        stop(sim)
    if rc != 0:
        sys.exit("calibrate.py: kvrouter bench exited with status %d" % rc)
    levels = load_levels(os.path.join(args.out, "results"))
    cmd = ["bench/scripts/calibrate.py"] + sys.argv[1:]
    md, within, total, sim_max = render(levels, args, cmd, time.monotonic() - t0)
    with open(args.md, "w") as f:
        f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
