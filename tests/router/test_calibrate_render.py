#!/usr/bin/env python3
"""test_calibrate_render -- bench/scripts/calibration/calibrate.py's table, rendered from a fake
raw folder.

Owns the checks of calibrate.py's rendering, not its runs: each test writes synthetic per-level
JSON (only the keys the render reads) and stamps into a temporary raw folder, runs
`calibrate.py --render-only --raw DIR --md FILE` as a child process, parses the Markdown table
back into rows keyed by (config, load, figure) and asserts the rows, the error arithmetic, the
within flags, the summary lines and seed 003's checks. No network, no kvrouter: the script is
run with --render-only, and its pure helpers are imported directly.

Run: python3 tests/router/test_calibrate_render.py (CTest: script.test_calibrate_render); prints
one PASS/FAIL line per test and exits 1 when one failed.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "scripts", "calibration", "calibrate.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import calibrate  # noqa: E402

TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def level(path, rate=None, users=None, **keys):
    """Writes one per-level JSON: vllm-style keys plus a "kvrouter" object (keys["kvrouter"])."""
    d = {"request_rate": "inf" if users else rate, "max_concurrency": users}
    d.update(keys)
    d.setdefault("kvrouter", {})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(d, f)


def burst(n):
    """Per-request arrays of n requests that each last 1 ms, all within the first second: vLLM
    0.14.1's max concurrency (1 s buckets) is n, the exact peak 1."""
    return dict(start_times=[0.5 * i / n for i in range(n)], latencies=[0.001] * n,
                errors=[""] * n)


def stamp(folder, part):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "stamp"), "w") as f:
        f.write("part=%s\ncommand=calibrate.py --fake\ncommit=abc1234\nstarted=T0\ntook_s=7\n"
                "sim_cmd=kvrouter sim --time-scale 10\nbench_cmd=kvrouter bench --fake\n"
                "time_scale=10\n" % part)


def render(raw):
    """Runs the script on raw; returns (markdown text, {(config, load, figure): cells})."""
    md = os.path.join(raw, "C.md")
    p = subprocess.run([sys.executable, SCRIPT, "--render-only", "--raw", raw, "--md", md],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = open(md).read()
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| config "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 7, line
        rows[tuple(cells[:3])] = cells[3:]  # seed, sim, error, within
    return text, rows


def fake_raw(raw):
    """phase0 at 0.5 and 3.5 req/s, seqs128 at 4.0, closed at 50-130 users, a costs.txt."""
    p0 = os.path.join(raw, "phase0")
    stamp(p0, "phase0")
    # 0.5 req/s: TTFT p99 +10%, TPOT p99 +25%, output tok/s 0%, max concurrent -25%, TPOT p50
    # 0% of WORKLOAD.md's 25; TTFT p95 +5% of seed 003's 568.
    level(os.path.join(p0, "results", "bench_rate0.50.json"), rate=0.5, p99_ttft_ms=847.0,
          p99_tpot_ms=36.25, output_throughput=252.0, max_concurrent_requests=1,
          p50_tpot_ms=25.0, p95_ttft_ms=596.4, **burst(12))
    # 3.5 req/s against the rerun column (1021 ms, 90 ms): fails the SLO.
    level(os.path.join(p0, "results", "bench_rate3.50.json"), rate=3.5, p99_ttft_ms=1021.0,
          p99_tpot_ms=90.0, output_throughput=1155.0, max_concurrent_requests=1,
          kvrouter={"send_lag_real_ms": {"p99": 7.4}}, **burst(147))
    s128 = os.path.join(raw, "seqs128")
    stamp(s128, "seqs128")
    level(os.path.join(s128, "results", "bench_rate4.00.json"), rate=4.0, p99_ttft_ms=5990.0,
          p99_tpot_ms=85.0, output_throughput=1198.0, max_concurrent_requests=1, **burst(162))
    closed = os.path.join(raw, "closed")
    stamp(closed, "closed")
    # req/s 0.9..1.35 (+8% from 90 to 130 users: saturated); TPOT p50 jumps 1.59x at 110 users.
    for users, rps, tpot in ((50, 0.9, 40), (70, 1.1, 42), (90, 1.25, 44), (110, 1.3, 70),
                             (130, 1.35, 72)):
        kv = {}
        extra = {}
        if users == 110:
            # outputs 600/800/1000 are in 555-1,008: E2E p50 50 s. No cached_lens: not measured.
            extra = dict(input_lens=[5900] * 5, output_lens=[600, 800, 1000, 100, 2000],
                         ttfts=[0.1] * 5)
            kv = {"e2els": [40000, 50000, 60000, 5000, 260000], "tpots": [30, 31, 32, -1, 40],
                  "turns": [1, 2, 3, 4, 5], "steady_state": True, "warmup_requests": 3,
                  "cooldown_requests": 2}
        level(os.path.join(closed, "results", "bench_c%d.json" % users), users=users,
              request_throughput=rps, p50_tpot_ms=tpot, p99_ttft_ms=800.0,
              max_concurrent_requests=users, kvrouter=kv, **extra)
    with open(os.path.join(closed, "costs.txt"), "w") as f:
        f.write("cost model: fixed_ms=22\nturn-5 prefill, 7000 tokens (3800 cached): 612.0 ms\n")


@test
def max_concurrency_as_vllm_0_14():
    """vLLM 0.14.1 counts a request in every second from int(start) to int(end), inclusive, and
    only successful requests: two requests that only touch at 1.0 s count as 2, a failed one not."""
    c = calibrate.max_concurrent_1s
    assert c({"start_times": [0.0, 1.0], "latencies": [1.0, 1.0], "errors": ["", ""]}) == 2
    assert c({"start_times": [0.0, 2.5], "latencies": [1.0, 1.0], "errors": ["", ""]}) == 1
    assert c({"start_times": [0.0, 0.2, 0.4], "latencies": [5, 5, 5],
              "errors": ["", "timeout", ""]}) == 2
    assert c({"start_times": [], "latencies": [], "errors": []}) is None
    assert c({"max_concurrent_requests": 7}) is None


@test
def rows_errors_and_flags():
    with tempfile.TemporaryDirectory() as raw:
        fake_raw(raw)
        text, rows = render(raw)
        # the first line names the command and the commit (bench/scripts/lib/provenance.py)
        first, _, rest = text.partition("\n\n")
        assert re.match(r"Made by `python3 bench/scripts/calibration/calibrate\.py --render-only "
                        r"--raw \S+ --md \S+` at commit ([0-9a-f]+(\+dirty)?|unknown), "
                        r"\d{4}-\d\d-\d\d\.$", first), first
        assert rest.startswith("# Calibration: one simulated worker against the seeds\n"), rest
        assert "abc1234" in text and "kvrouter sim --time-scale 10" in text
        assert "- mem095: not run (no raw files)." in text
        assert "In-sample: phase0 at 0.5-3.0 req/s" in text
        # 3.5 req/s was sent 7.4 ms late at p99 (> 3 ms): named with the part's time scale.
        assert ("- Send lag p99 over 3 real ms (CPU contention: arrivals late by that times the "
                "time scale, in simulated time; read those levels with care): phase0 3.5 req/s: "
                "7.4 ms (x10).") in text, text
        r = rows[("phase0", "0.50 req/s", "TTFT p99 (ms)")]
        assert r == ["770", "847", "+10.0%", "yes"], r
        r = rows[("phase0", "0.50 req/s", "TPOT p99 (ms)")]
        assert r == ["29", "36.2", "+25.0%", "**no**"], r
        assert rows[("phase0", "0.50 req/s", "output tok/s")] == ["252", "252", "+0.0%", "yes"]
        r = rows[("phase0", "0.50 req/s", "max concurrent")]
        assert r == ["16", "12", "-25.0%", "**no**"], r
        r = rows[("phase0", "0.50 req/s", "TPOT p50 (ms) [WORKLOAD.md]")]
        assert r == ["25", "25", "+0.0%", "yes"], r
        # Unmeasured figures keep the seed and show "-".
        assert rows[("phase0", "0.75 req/s", "TTFT p99 (ms)")] == ["646", "-", "-", "-"]
        # 2.00 req/s shows the detailed comparison's ten figures, none twice.
        det = [k for k in rows if k[0] == "phase0" and k[1] == "2.00 req/s"]
        assert len(det) == 10, det
        assert rows[("phase0", "2.00 req/s", "ITL p99 (ms)")][0] == "232"
        # Rates above 3.0 against the rerun column, labelled so.
        r = rows[("phase0 (seed: rerun column)", "3.50 req/s", "TTFT p99 (ms)")]
        assert r == ["1021", "1021", "+0.0%", "yes"], r
        assert ("phase0", "3.50 req/s", "TTFT p99 (ms)") not in rows
        r = rows[("phase1-seqs128", "4.00 req/s", "TTFT p99 (ms)")]
        assert r == ["11980", "5990", "-50.0%", "**no**"], r
        # Every config has 12 rates (11 x 4 figures + 10 detailed) and its max SLO rate row.
        assert len([k for k in rows if k[0] == "phase1-moderate"]) == 11 * 4 + 10 + 1


@test
def max_slo_rate_and_summary():
    with tempfile.TemporaryDirectory() as raw:
        fake_raw(raw)
        text, rows = render(raw)
        # 0.5 passes, 3.5 fails: 0.50 against the seed's 2.00.
        r = rows[("phase0", "all rates", "max SLO-compliant rate (req/s)")]
        assert r == ["2.00", "0.50", "-75.0%", "**no**"], r
        r = rows[("phase0 (seed: rerun column)", "all rates", "max SLO-compliant rate (req/s)")]
        assert r == ["1.50", "0.50", "-66.7%", "**no**"], r
        # phase0 in-sample: |10|, |25|, 0, |25|, 0 -> 3 of 5 within, MAE 12.0%.
        assert ("WORKLOAD.md's TPOT p50 at 0.5 req/s): 3 of 5 figures within 20% (34 of 39 not "
                "measured), MAE 12.0%.") in text, text
        # out-of-sample: rerun 3.5 (0, +0, 0, 0 -> 4 of 4), seqs128 4.0 (-50, 0, 0, 0).
        assert ("(the five configurations, and phase0 at 3.5-5.0 req/s against the rerun column): "
                "7 of 8 figures within 20% (278 of 286 not measured), MAE 6.2%") in text, text
        assert "seqs128 3 of 4 figures within 20% (50 of 54 not measured)" in text
        assert "**not met**; every Phase 1 figure within 20%: **not met**." in text
        assert "steady state true (warm-up 3, cool-down 2)" in text


@test
def seed003_checks():
    with tempfile.TemporaryDirectory() as raw:
        fake_raw(raw)
        text, rows = render(raw)
        checks = {k[2]: v for k, v in rows.items() if k[0] == "seed 003"}
        sat = [v for k, v in checks.items() if k.startswith("req/s at 110 users")][0]
        # 110 / (mean E2E 83 s + think 1 s) by Little's law; 90 and 130 have no E2Es, so their
        # figure is the bench's request_throughput (+8%)
        assert sat[1] == "1.31 req/s; +8% from 90 to 130" and sat[3] == "pass", sat
        cliff = [v for k, v in checks.items() if k.startswith("cliff")][0]
        assert cliff[1].startswith("110 users (TPOT p50 1.6x of 90 users)") and cliff[3] == "pass"
        c = [v for k, v in checks.items() if k.startswith("TTFT p95 (ms) at 0.5")][0]
        assert c == ["568 (7 max concurrent)", "596 (12 max concurrent)", "+5.0%", "pass"], c
        e2e = [v for k, v in checks.items() if k.startswith("E2E p50")][0]
        assert e2e[1] == "50.0 s (n=3)" and e2e[3] == "pass", e2e
        assert checks["ISL p50 under load, within 20%"] == ["5900", "5900", "+0.0%", "pass"]
        assert checks["ISL p95 under load, within 20%"][3] == "**fail**"
        assert checks["cached tokens p50 under load, within 20%"][3] == "not measured"
        f = [v for k, v in checks.items() if k.startswith("turn-5 prefill")][0]
        assert f[1] == "612 ms" and f[3] == "**fail**", f
        # OSL p50 800 (-18.2%) and p95 1,800 (+4.7%) pass; ISL p95 and the prefill fail.
        assert checks["OSL p50 under load, within 20%"] == ["978", "800", "-18.2%", "pass"]
        assert checks["OSL p95 under load, within 20%"] == ["1720", "1800", "+4.7%", "pass"]
        assert "- Seed 003 checks: 7 of 11 passed (2 not measured)." in text, text


@test
def empty_and_older_layout():
    with tempfile.TemporaryDirectory() as raw:
        text, rows = render(raw)
        assert rows[("phase0", "0.50 req/s", "TTFT p99 (ms)")] == ["770", "-", "-", "-"]
        assert all(v[3] == "not measured" for k, v in rows.items() if k[0] == "seed 003")
        assert "**incomplete (not every figure measured)**" in text
        # The phase0-only layout (raw/stamp, raw/results) of earlier runs reads as phase0.
        stamp(raw, "")
        level(os.path.join(raw, "results", "bench_rate0.50.json"), rate=0.5, p99_ttft_ms=770.0)
        text, rows = render(raw)
        assert rows[("phase0", "0.50 req/s", "TTFT p99 (ms)")] == ["770", "770", "+0.0%", "yes"]


@test
def noise_section():
    with tempfile.TemporaryDirectory() as raw:
        text, _ = render(raw)
        assert "Run-to-run noise" not in text  # not run: no section
        os.makedirs(os.path.join(raw, "noise"))
        with open(os.path.join(raw, "noise", "stamp"), "w") as f:
            f.write("part=noise\ncommit=abc1234\nstarted=T1\n")
        summary = {"seeds": ["42", "1", "2"], "configs": ["phase0", "mem095"],
                   "per_seed": {
                       "42": {"in_sample": [30, 39, 12.0], "out_of_sample": [40, 70, 20.0],
                              "max_slo_rate": {"phase0": 2.0, "mem095": 2.5}},
                       "1": {"in_sample": [33, 39, 9.0], "out_of_sample": [50, 70, 15.0],
                             "max_slo_rate": {"phase0": 1.5, "mem095": 2.0}},
                       "2": {"in_sample": [36, 39, 6.0], "out_of_sample": [60, 70, 10.0],
                             "max_slo_rate": {"phase0": 0.0}}},
                   "figures": [
                       # median 700 of 981: -28.6%, listed with its values sorted
                       {"config": "phase0", "load": "1.50 req/s", "figure": "TTFT p99 (ms)",
                        "seed": 981, "in_sample": True, "sims": [900, 650, 700]},
                       # median 30 of 29: +3.4%, within: not listed
                       {"config": "phase0", "load": "0.50 req/s", "figure": "TPOT p99 (ms)",
                        "seed": 29, "sims": [28, 30, 33]},
                       # a level not measured (None) is left out; an even count takes the mean
                       # of the middle two: (150 + 250) / 2 = 200, +33.3% of 150
                       {"config": "phase1-mem095", "load": "5.00 req/s",
                        "figure": "max concurrent", "seed": 150,
                        "sims": [250, 150, None, 260, 100]}]}
        with open(os.path.join(raw, "noise", "summary.json"), "w") as f:
            json.dump(summary, f)
        text, rows = render(raw)
        assert "## Run-to-run noise (virtual time, 3 bench seeds)" in text, text
        assert "42, 1, 2; 42, the bench's default, is the seed of the table above" in text
        assert ("- phase0, in-sample: within 33.0 of 39 on average (30-36), MAE 9.0% on average "
                "(42: 30/39, 12.0%, 1: 33/39, 9.0%, 2: 36/39, 6.0%).") in text, text
        assert "- out-of-sample: within 50.0 of 70 on average (40-60), MAE 15.0% on average" in text
        assert ("- phase0, 1.50 req/s, TTFT p99 (ms): seed 981, sim median 700 (-28.6%); "
                "650 700 900.") in text, text
        assert "0.50 req/s, TPOT p99" not in text.split("## Run-to-run noise")[1]
        assert ("- phase1-mem095, 5.00 req/s, max concurrent: seed 150, sim median 200 (+33.3%); "
                "100 150 250 260.") in text, text
        # Judged once on the medians: in-sample 700 of 981 (28.6% off) and 30 of 29 (3.4%; no
        # "in_sample" key: phase0's own rows are in-sample), out-of-sample 200 of 150 (33.3%).
        assert ("- each figure judged once, on its median over the seeds: in-sample 1 of 2 "
                "within 20%, MAE 16.0%; out-of-sample 0 of 1 within 20%, MAE 33.3%.") in text, text
        # Each configuration's max SLO rate per seed against the report's: 0 when the lowest
        # rate failed; "?" where a seed's summary lacks it, left out of the count.
        assert ("- max SLO-compliant rate (req/s) under each bench seed, in the order above: "
                "phase0 2 1.5 0 (the report's 2, its rerun column's 1.5: 1 of 3 equal); "
                "mem095 2.5 2 ? (the report's 2: 1 of 2 equal).") in text, text
        # A summary written before the per-seed max SLO rate was kept: no such line, no error.
        for v in summary["per_seed"].values():
            v.pop("max_slo_rate")
        with open(os.path.join(raw, "noise", "summary.json"), "w") as f:
            json.dump(summary, f)
        older, _ = render(raw)
        assert "max SLO-compliant rate (req/s) under each bench seed" not in older, older
        assert "- each figure judged once, on its median over the seeds: in-sample 1 of 2" in older
        # The noise lines are bullets: the main table's rows are not overwritten by them.
        assert rows[("phase0", "1.50 req/s", "TTFT p99 (ms)")] == ["981", "-", "-", "-"]


@test
def helpers():
    assert calibrate.gpu_blocks("53.15") == 21770  # the sim's default
    # A max SLO rate: none measured, the lowest rate failed, a rate.
    assert [calibrate.fmt_rate(v) for v in (None, 0.0, 2.5, 2.0)] == ["-", "0", "2.5", "2"]
    assert calibrate.PHASE1["mem095"][1][-1] == "24633"
    assert calibrate.turn5_prefill_ms("x\nturn-5 prefill ~7,000 tokens: 1,234.5 ms (a)\n") == 1234.5
    assert calibrate.turn5_prefill_ms("cold prefill 7000 tokens (alone): 743.1 ms\n") is None
    # The detailed comparison's overlapping rows equal the rate tables' 2.00 rows.
    det = calibrate.seed_table(calibrate.SEED_DETAILED)
    names = {"TTFT p99 (ms)": "TTFT p99 (ms)", "TPOT p99 (ms)": "TPOT p99 (ms)",
             "output tok/s": "Output tok/s", "max concurrent": "Max Concurrent"}
    for text, name, _ in calibrate.RATE_FIGURES:
        for col in calibrate.COLUMNS:
            assert det[names[name]][col] == calibrate.seed_rate(text, col, 2.0), (name, col)


def main():
    failed = 0
    for fn in TESTS:
        t0 = time.monotonic()
        try:
            fn()
            print("PASS %-44s %6.2fs" % (fn.__name__, time.monotonic() - t0), flush=True)
        except Exception as e:
            failed += 1
            print("FAIL %-44s %s: %s" % (fn.__name__, type(e).__name__, e), flush=True)
            traceback.print_exc()
    print("%d passed, %d failed" % (len(TESTS) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
