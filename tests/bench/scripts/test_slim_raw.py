#!/usr/bin/env python3
"""test_slim_raw -- the raw files the calibration and accuracy experiments keep in git, without
the bench's per-request arrays, render the same reports as the full files they come from.

calibrate.py keeps each level's JSON through slim_level() (keep_raw): the per-request arrays
dropped, vLLM 0.14.1's max concurrency (computed from the start times and latencies) kept as a
figure, and a closed-loop level's four columns that seed 003's checks read (input_lens,
output_lens, kvrouter.cached_lens and kvrouter.e2els) kept. The test writes synthetic full levels
(open-loop rates with a burst that makes the 0.14.1 count differ from the exact peak, closed-loop
users with per-request columns), renders `calibrate.py --render-only` from them, keeps them with
keep_raw() and renders again: the two reports are equal, the kept files have no other array.

accuracy_report.py collect keeps level.json without its arrays and part (d)'s requests as ttft.csv
(uncached tokens, TTFT ms; warm-up and failed requests left out); render reads ttft.csv, or the
ttft.jsonl of runs kept before (prompt_tokens, cached_tokens, ttft_ms per line). The test collects
two synthetic time-scale runs, renders them, and renders again from the same runs kept the old
way (full level JSON, ttft.jsonl): equal reports, with the per-bucket TTFT medians computed here.

Run: python3 tests/bench/scripts/test_slim_raw.py (CTest: script.test_slim_raw); exits 1 on a
failure.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "..", "bench", "scripts")
CALIBRATE = os.path.join(SCRIPTS, "calibration", "calibrate.py")
ACCURACY = os.path.join(SCRIPTS, "accuracy", "accuracy_report.py")
sys.path.insert(0, os.path.dirname(CALIBRATE))
sys.path.insert(0, os.path.dirname(ACCURACY))
import accuracy_report  # noqa: E402
import calibrate  # noqa: E402
from kvrharness import percentile  # noqa: E402  (tests/harness, on the path the scripts set)

ARRAYS_TOP = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
              "generated_texts", "errors")
ARRAYS_KVR = ("cached_lens", "e2els", "tpots", "turns")
FAILED = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        FAILED.append(what)


def full_level(n, rate=None, users=None, seed=0):
    """A per-level JSON as the bench writes it: aggregates plus n requests' arrays. The open-loop
    requests start 0.1 s apart and last 0.05 s, so 10 touch the first second: vLLM 0.14.1's count
    is 10 where the exact peak is 1 (the bench's max_concurrent_requests here: 3)."""
    starts = [0.1 * i for i in range(n)]
    d = {"request_rate": "inf" if users else rate, "max_concurrency": users, "completed": n,
         "failed": 0, "total_input_tokens": 1000 * n, "request_throughput": 1.25 + seed,
         "output_throughput": 800.0 + seed, "max_concurrent_requests": 3,
         "p50_ttft_ms": 120.5 + seed, "p90_ttft_ms": 400.0, "p95_ttft_ms": 500.0 + seed,
         "p99_ttft_ms": 900.0 + seed, "p50_tpot_ms": 40.0 + seed, "p90_tpot_ms": 43.0,
         "p95_tpot_ms": 44.0, "p99_tpot_ms": 48.0 + seed,
         "p50_itl_ms": 37.0, "p99_itl_ms": 200.0,
         "input_lens": [5000 + 37 * i for i in range(n)],
         "output_lens": [600 + 13 * i for i in range(n)],
         "ttfts": [0.1] * n, "itls": None, "latencies": [0.05] * n if not users else
         [40.0 + i for i in range(n)], "start_times": starts, "generated_texts": None,
         "errors": [""] * n,
         "kvrouter": {"steady_state": bool(users), "warmup_requests": 2, "cooldown_requests": 1,
                      "send_lag_real_ms": {"p99": 0.5, "max": 1.0},
                      "cached_lens": [4000 + 11 * i for i in range(n)],
                      "e2els": [40000.0 + 500.5 * i for i in range(n)],
                      "tpots": [40.0] * n, "turns": [1 + i % 5 for i in range(n)]}}
    return d


def write_json(path, d):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(d, f)


def stamp(path, **keys):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for k, v in keys.items():
            f.write("%s=%s\n" % (k, v))


def read(path):
    with open(path) as f:
        return f.read()


def render_calibration(raw, md):
    subprocess.run([sys.executable, CALIBRATE, "--render-only", "--raw", raw, "--md", md],
                   check=True, capture_output=True, text=True)
    # past the first line (command and commit), the raw folder named as RAW
    return read(md).split("\n", 1)[1].replace(raw, "RAW")


def test_calibration(d):
    out, full, kept = (os.path.join(d, x) for x in ("out", "full", "kept"))
    parts = {"phase0": [full_level(12, rate=r, seed=i) for i, r in enumerate(calibrate.RATES)],
             "closed": [full_level(30, users=u, seed=i) for i, u in enumerate(calibrate.USERS)]}
    for folder, levels in parts.items():
        st = {"part": folder, "command": "calibrate.py --fake", "commit": "abc1234",
              "started": "T0", "took_s": "7", "time_scale": "10"}
        stamp(os.path.join(full, folder, "stamp"), **st)
        with open(os.path.join(full, folder, "costs.txt"), "w") as f:
            f.write("turn-5 prefill of 7,000 tokens: 450.0 ms\n")
        for lv in levels:
            name = ("bench_c%d.json" % lv["max_concurrency"] if lv["max_concurrency"]
                    else "bench_rate%.2f.json" % lv["request_rate"])
            write_json(os.path.join(full, folder, "results", name), lv)
            write_json(os.path.join(out, folder, "results", name), lv)
        calibrate.keep_raw(os.path.join(out, folder), kept, folder, st,
                           "turn-5 prefill of 7,000 tokens: 450.0 ms\n")
    a = render_calibration(full, os.path.join(d, "full.md"))
    b = render_calibration(kept, os.path.join(d, "kept.md"))
    check(a == b, "calibration: the kept levels render the full levels' report")
    check("| phase0 | 0.50 req/s | max concurrent | 16 | 10 |" in b,
          "calibration: vLLM 0.14.1's max concurrency (10) kept, not the bench's peak (3)")
    check("110 users: " in b and "E2E p50 (s) of turns" in b and "(n=" in b,
          "calibration: the closed-loop checks are measured from the kept columns")
    with open(os.path.join(kept, "phase0", "results", "bench_rate0.50.json")) as f:
        lv = json.load(f)
    check(not any(k in lv for k in ARRAYS_TOP) and not any(k in lv["kvrouter"] for k in ARRAYS_KVR)
          and lv[calibrate.VLLM014_MAX_CONC] == 10 and lv["p99_ttft_ms"] == 900.0,
          "calibration: an open-loop level keeps its figures and no per-request array")
    with open(os.path.join(kept, "closed", "results", "bench_c110.json")) as f:
        lv = json.load(f)
    check(sorted(k for k in ARRAYS_TOP if k in lv) == ["input_lens", "output_lens"]
          and sorted(k for k in ARRAYS_KVR if k in lv["kvrouter"]) == ["cached_lens", "e2els"]
          and len(lv["kvrouter"]["e2els"]) == 30,
          "calibration: a closed-loop level keeps the four columns seed 003's checks read")


def accuracy_src(d, scale, seed):
    """A time-scale run's output folder as accuracy.sh leaves it: stamp, results/, requests.jsonl
    (measured and warm-up requests, one failed)."""
    stamp(os.path.join(d, "stamp"), run="d_scale%d" % scale, part="d", commit="abc1234",
          started="T0", finished="T1", scale=scale, cores=2, arch="x86_64", load="0.1",
          bench_cmd="kvrouter bench --fake --time-scale %d" % scale)
    lv = full_level(40, rate=4.0, seed=seed)
    lv["kvrouter"].update(total_cached_tokens=30000 + seed, send_lag_real_ms={"p99": 0.1,
                          "max": 0.2}, ttft_transport_real_ms={"p50": 1.0, "p99": 2.0})
    write_json(os.path.join(d, "results", "bench_rate4.00.json"), lv)
    with open(os.path.join(d, "requests.jsonl"), "w") as f:
        for i in range(60):
            r = {"ok": i != 7, "warmup": i < 5, "prompt_tokens": 500 + 97 * i,
                 "cached_tokens": 64 * (i % 4), "ttft_ms": 100.25 + 3.5 * i * (1 + seed)}
            f.write(json.dumps(r) + "\n")


def test_accuracy(d):
    kept, old = os.path.join(d, "kept"), os.path.join(d, "old")
    want = {}
    for scale, seed in ((1, 0), (10, 1)):
        src = os.path.join(d, "src%d" % scale)
        accuracy_src(src, scale, seed)
        name = "d_scale%d" % scale
        subprocess.run([sys.executable, ACCURACY, "collect", src, os.path.join(kept, name),
                        "--requests"], check=True)
        # the same run kept the way runs were before: the full level JSON and ttft.jsonl
        os.makedirs(os.path.join(old, name))
        shutil.copyfile(os.path.join(src, "stamp"), os.path.join(old, name, "stamp"))
        shutil.copyfile(os.path.join(src, "results", "bench_rate4.00.json"),
                        os.path.join(old, name, "level.json"))
        with open(os.path.join(src, "requests.jsonl")) as f, \
                open(os.path.join(old, name, "ttft.jsonl"), "w") as out:
            for line in f:
                r = json.loads(line)
                if r["ok"] and not r["warmup"]:
                    out.write(json.dumps({k: r[k] for k in ("prompt_tokens", "cached_tokens",
                                                            "ttft_ms")}) + "\n")
                    want.setdefault(scale, []).append((r["prompt_tokens"] - r["cached_tokens"],
                                                       r["ttft_ms"]))
    rows = accuracy_report.read_ttft(os.path.join(kept, "d_scale1"))
    check(rows == want[1] and len(rows) == 54,
          "accuracy: ttft.csv holds the measured, completed requests' uncached tokens and TTFT")
    check(read(os.path.join(kept, "d_scale1", "ttft.csv")).startswith("uncached_tokens,ttft_ms\n"),
          "accuracy: ttft.csv has its header")
    with open(os.path.join(kept, "d_scale1", "level.json")) as f:
        lv = json.load(f)
    check(not any(k in lv for k in ARRAYS_TOP) and not any(k in lv["kvrouter"] for k in ARRAYS_KVR)
          and lv["p99_ttft_ms"] == 900.0, "accuracy: level.json keeps its figures, no array")
    mds = []
    for raw in (kept, old):
        md = os.path.join(d, os.path.basename(raw) + ".md")
        subprocess.run([sys.executable, ACCURACY, "render", raw, md], check=True,
                       capture_output=True)
        mds.append(read(md).split("\n", 1)[1].replace(raw, "RAW"))
    check(mds[0] == mds[1], "accuracy: the kept run renders the report of the full one")
    # the first bucket (0-199 uncached tokens) is empty here
    for lo, hi in ((200, 1000), (1000, 2000)):
        a = [t for u, t in want[1] if lo <= u < hi]
        b = [t for u, t in want[10] if lo <= u < hi]
        line = "| %d-%d | %d | %d | %.1f | %.1f |" % (lo, hi - 1, len(a), len(b),
                                                     percentile(a, 50), percentile(b, 50))
        check(line in mds[0], "accuracy: bucket %d-%d's TTFT p50 as computed here" % (lo, hi - 1))


def main():
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(os.path.join(d, "cal"))
        test_calibration(os.path.join(d, "cal"))
        os.mkdir(os.path.join(d, "acc"))
        test_accuracy(os.path.join(d, "acc"))
    if FAILED:
        print("%d check(s) failed" % len(FAILED))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
