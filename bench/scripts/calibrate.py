#!/usr/bin/env python3
"""calibrate.py -- one simulated worker under the seed's Phase 0 load, side by side with the seed.

Owns the calibration of `kvrouter sim` against the phase0 column of the team's tuning report
(shared/seeds/002_03f57bbc2fe6bc6c.txt, copied below as SEED so the table needs no other file).

Flow: start one `kvrouter sim` on 127.0.0.1 (a free port, --time-scale N; the harness's Sim,
stopped by its PID), run `kvrouter bench` against it with the seed's load shape (300 prompts per
rate drawn from one fixed dataset of 100 5-turn `multiturn` conversations, 500 prompts, the same
dataset at every rate as `vllm bench serve` replays one file; Poisson arrivals, rates 0.5-3.0
req/s, ~500 output tokens per request, the history carrying dataset answers of normal(1000, 700)
tokens so prompts average ~5.8k tokens), stop the sim, keep the raw results, then write a Markdown
table from them: for each rate the seed's TTFT p99, TPOT p99, output tok/s and max concurrent next
to the simulator's, the difference in percent, whether it is within the tolerance (20%), and the
max SLO-compliant rate of both.

Where the results go:
  --out DIR   the bench's full output (report, requests.jsonl); not kept in git
  --raw DIR   the small raw files kept in git (default bench/results/calibration): stamp
              (commit, "+dirty" when tracked files differed, start, duration, the sim and bench
              command lines, time scale) and results/*.json (the bench's per-level JSON);
              replaced by each completed run
  --md FILE   rendered from --raw only (default bench/results/CALIBRATION.md); --render-only
              re-renders it without running anything. The hand-written reading lives in
              bench/results/CALIBRATION-notes.md, which this script never writes.

usage: bench/scripts/calibrate.py [--kvrouter build/kvrouter] [--out DIR] [--raw DIR] [--md FILE]
                          [--time-scale 10] [--rates 0.5,1] [--sim-arg=--cost-fixed-ms=22 ...]
                          [--bench-arg=...] [--render-only]
A quick check into scratch folders (a minute): --rates 0.5 --time-scale 20
  --bench-arg=--num-prompts=20 --bench-arg=--warmup=0 --out /tmp/cal/out --raw /tmp/cal/raw
  --md /tmp/cal/CALIBRATION.md
Exit status 0 when the run completed (the table says whether every figure is within tolerance).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "harness"))
import kvrharness as h  # noqa: E402

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
SEED_RERUN_MAX_RATE = 1.5  # the seed report's rerun of phase0
SEED_SOURCE = ("the phase0 column of the team's tuning report "
               "(shared/seeds/002_03f57bbc2fe6bc6c.txt: Llama-3.3-70B FP8 on one H200, vLLM 0.14.1 defaults, `vllm bench serve`, 300 "
               "prompts per rate from a custom multi-turn dataset, ~5,806 input tokens on average, "
               "Poisson)")
SLO_TTFT_MS, SLO_TPOT_MS = 1000.0, 60.0
TOLERANCE = 0.20

# The seed's load shape, as `kvrouter bench` options.
BENCH_ARGS = [
    "--workload", "multiturn", "--multiturn-mode", "replay", "--replay-order", "sample",
    "--replay-dataset", "100", "--answer-mean", "1000", "--answer-std", "700",
    "--output-mean", "500", "--output-std", "150", "--output-min", "64", "--output-max", "2048",
    "--num-prompts", "300", "--warmup", "10", "--burstiness", "1", "--cooldown-s", "5",
]


def commit():
    """The repository's HEAD, "+dirty" when tracked files differ from it; "unknown" outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def read_stamp(raw):
    return h.read_stamp(os.path.join(raw, "stamp"))


def keep_raw(out, raw, stamp):
    """Replaces raw's contents with the run's per-level JSON and its stamp."""
    if os.path.isdir(raw):
        shutil.rmtree(raw)
    os.makedirs(os.path.join(raw, "results"))
    for name in os.listdir(os.path.join(out, "results")):
        if name.endswith(".json"):
            shutil.copyfile(os.path.join(out, "results", name), os.path.join(raw, "results", name))
    with open(os.path.join(raw, "stamp"), "w") as f:
        for k, v in stamp.items():
            f.write("%s=%s\n" % (k, v))


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


def render(raw, md):
    """Writes md from raw (stamp and results/*.json) alone; returns the text."""
    out = []
    w = out.append
    w("# Fit: one simulated worker vs the seed's Phase 0\n")
    w("Generated by `bench/scripts/calibrate.py` from the raw results in %s/ (the per-level JSON "
      "and the stamp of the run). Hand-written notes, which name the runs they read: "
      "bench/results/CALIBRATION-notes.md (not generated).\n" % raw)
    if not os.path.exists(os.path.join(raw, "stamp")):
        w("No run is recorded in %s/ yet.\n" % raw)
        text = "\n".join(out)
        with open(md, "w") as f:
            f.write(text + "\n")
        return text
    stamp = read_stamp(raw)
    levels = load_levels(os.path.join(raw, "results"))
    w("Run: `%s` at commit %s, started %s, took %s s, %s cores (%s). The sim: `%s`; the bench: "
      "`%s` (figures in simulated time).\n" %
      (stamp.get("command", "?"), stamp.get("commit", "?"), stamp.get("started", "?"),
       stamp.get("took_s", "?"), stamp.get("cores", "?"), stamp.get("arch", "?"),
       stamp.get("sim_cmd", "?"), stamp.get("bench_cmd", "?")))
    w("Reference (calibrate.py's SEED table): %s. Tolerance: within %d%% of the seed.\n" %
      (SEED_SOURCE, int(TOLERANCE * 100)))
    w("In-sample: the simulator's cost terms and this load's dataset size were chosen so that "
      "these figures fall within the tolerance (bench/results/CALIBRATION-notes.md names the runs "
      "that chose them), so the table shows how well the model fits the one table it was fitted "
      "to, not how well it predicts data it has not seen.\n")
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
    w("%d of %d figures within %d%% (**x** marks the others; rates the run did not measure show "
      "-). Max SLO-compliant rate (TTFT p99 < %.0f ms and TPOT p99 < %.0f ms, over the rates "
      "measured): seed %.2f req/s (its rerun %.2f), simulator %.2f req/s.\n" %
      (within, total, int(TOLERANCE * 100), SLO_TTFT_MS, SLO_TPOT_MS, SEED_MAX_RATE,
       SEED_RERUN_MAX_RATE, sim_max))
    text = "\n".join(out)
    with open(md, "w") as f:
        f.write(text + "\n")
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvrouter", default="build/kvrouter")
    ap.add_argument("--out", default="results/calibration")
    ap.add_argument("--raw", default="bench/results/calibration")
    ap.add_argument("--md", default="bench/results/CALIBRATION.md")
    ap.add_argument("--time-scale", type=float, default=10)
    ap.add_argument("--rates", default=",".join("%g" % r for r in sorted(SEED)))
    ap.add_argument("--sim-arg", action="append", default=[])
    ap.add_argument("--bench-arg", action="append", default=[])
    ap.add_argument("--render-only", action="store_true",
                    help="only write --md from --raw (no run)")
    args = ap.parse_args()
    if args.render_only:
        print(render(args.raw, args.md))
        return
    try:
        h.set_kvrouter(args.kvrouter)
    except ValueError:
        sys.exit("calibrate.py: %s is not an executable (build first)" % args.kvrouter)

    sim_args = ["--time-scale", "%g" % args.time_scale] + args.sim_arg
    bench_args = ["--time-scale", "%g" % args.time_scale, "--rates", args.rates,
                  "--title", "Calibration: one kvrouter sim under the seed's Phase 0 load"]
    bench_args += BENCH_ARGS + args.bench_arg
    stamp = {"command": shlex.join(["bench/scripts/calibrate.py"] + sys.argv[1:]),
             "commit": commit(),
             "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "cores": os.cpu_count() or 0, "arch": platform.machine(),
             "time_scale": "%g" % args.time_scale,
             "sim_cmd": shlex.join(["kvrouter", "sim"] + sim_args),
             "bench_cmd": shlex.join(["kvrouter", "bench", "--url", "URL"] + bench_args)}
    t0 = time.monotonic()
    with h.Sim(*sim_args, fixed=None, admin=False) as sim:
        rc = subprocess.call([h.KVROUTER, "bench", "--url", sim.url, "--out", args.out]
                             + bench_args)
    if rc != 0:
        sys.exit("calibrate.py: kvrouter bench exited with status %d" % rc)
    stamp["took_s"] = "%.0f" % (time.monotonic() - t0)
    keep_raw(args.out, args.raw, stamp)
    print(render(args.raw, args.md))


if __name__ == "__main__":
    main()
