#!/usr/bin/env python3
"""test_bench_accuracy.py -- `kvrouter bench` measures known latencies correctly (real processes).

Against `kvrouter sim` in fixed-latency mode on 127.0.0.1 at low load, the bench's TTFT and TPOT
medians are within 5% of the configured values, every request streams the asked number of tokens,
and the per-request records agree with the level's figures, for chat and completions. At a time
scale only the simulator's engine share of TTFT is stretched (the transport the simulator does not
speed up is counted at 1x, and reported), for failed requests too. In session mode the answers the
bench streamed are resent in the next turn (the streamed text is kept). A search ends a level as
soon as its TTFT p99 has certainly failed, and only then. No speed is asserted: bench/scripts/accuracy.sh
measures that (bench/results/ACCURACY.md).

Usage: python3 test_bench_accuracy.py --kvrouter PATH/TO/kvrouter
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from simlib import start_sim  # noqa: E402


def run_bench(kvrouter, sim, out, *args):
    argv = [kvrouter, "bench", "--url", sim.url, "--out", out, "--quiet", "--cooldown-s", "0"]
    argv += [str(a) for a in args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "bench failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    levels = sorted(glob.glob(os.path.join(out, "results", "*.json")))
    assert len(levels) == 1, levels
    level = json.load(open(levels[0]))
    with open(os.path.join(out, "requests.jsonl")) as f:
        reqs = [json.loads(line) for line in f if line.strip()]
    return level, reqs


def within(x, ref, frac):
    return abs(x - ref) <= frac * ref


def check_fixed(kvrouter, tmp, api):
    ttft, itl, tokens, n = 200, 20, 30, 20
    with start_sim(kvrouter, "--fixed-ttft-ms", ttft, "--fixed-itl-ms", itl, "--log-level",
                   "warn") as sim:
        level, reqs = run_bench(kvrouter, sim, os.path.join(tmp, "fixed_" + api), "--api", api,
                                "--rates", 5, "--num-prompts", n, "--output-mean", tokens,
                                "--output-std", 0, "--output-min", tokens, "--output-max", tokens)
    assert level["completed"] == n and level["failed"] == 0, level
    assert level["total_output_tokens"] == n * tokens, level["total_output_tokens"]
    assert within(level["p50_ttft_ms"], ttft, 0.05), "TTFT p50 %.1f ms vs %d" % (
        level["p50_ttft_ms"], ttft)
    assert within(level["p50_tpot_ms"], itl, 0.05), "TPOT p50 %.2f ms vs %d" % (
        level["p50_tpot_ms"], itl)
    assert within(level["p50_itl_ms"], itl, 0.05), "ITL p50 %.2f ms vs %d" % (
        level["p50_itl_ms"], itl)
    # TTFT is never below the configured latency: the clock starts before the request leaves.
    assert min(level["ttfts"]) >= ttft / 1000.0 * 0.99, min(level["ttfts"])
    measured = [r for r in reqs if not r.get("warmup")]
    assert len(measured) == n
    for r in measured:
        # Every token chunk was recognised (chunks) and agrees with usage.completion_tokens.
        assert r["output_tokens"] == tokens and r["chunks"] == tokens, r
        assert r["usage"] and r["itl_count"] == tokens - 1, r
        # TPOT = (E2E - TTFT) / (tokens - 1), the vllm bench serve definition.
        assert abs(r["tpot_ms"] - (r["e2e_ms"] - r["ttft_ms"]) / (tokens - 1)) < 0.01, r  # printed to 3 decimals
    lag = level["kvrouter"]["send_lag_real_ms"]
    assert lag["n"] == n and lag["p50"] >= 0, lag


def test_fixed_latency_chat(kvrouter, tmp):
    check_fixed(kvrouter, tmp, "chat")


def test_fixed_latency_completions(kvrouter, tmp):
    check_fixed(kvrouter, tmp, "completions")


def test_time_scale_stretches_engine_time_only(kvrouter, tmp):
    # At scale 10 the sim waits 40 real ms for a 400 simulated ms TTFT; the bench's real TTFT also
    # holds the upload, parsing and loopback (a fraction of a ms each, stretched 10x if counted as
    # simulated time). The first chunk says how long the engine took, so TTFT = transport (1x) +
    # engine x 10, and the engine share is the configured 400 ms (medians, within 5%: the sim's
    # timer jitters on a busy or sanitized build, and each real ms of it is 10 simulated ms).
    ttft, itl, tokens, n, scale = 400, 50, 10, 20, 10
    with start_sim(kvrouter, "--fixed-ttft-ms", ttft, "--fixed-itl-ms", itl, "--time-scale",
                   scale, "--log-level", "warn") as sim:
        level, reqs = run_bench(kvrouter, sim, os.path.join(tmp, "scaled"), "--time-scale", scale,
                                "--rates", 2, "--num-prompts", n, "--output-mean", tokens,
                                "--output-std", 0, "--output-min", tokens, "--output-max", tokens)
    assert level["completed"] == n and level["failed"] == 0, level
    measured = [r for r in reqs if not r.get("warmup")]
    engines = []
    for r in measured:
        assert 0 <= r["transport_ms"] < r["ttft_ms"], r
        engines.append(r["ttft_ms"] - r["transport_ms"])
        assert abs(r["tpot_ms"] - (r["e2e_ms"] - r["ttft_ms"]) / (tokens - 1)) < 0.01, r
    engines.sort()
    assert within(engines[len(engines) // 2], ttft, 0.05), engines
    tr = level["kvrouter"]["ttft_transport_real_ms"]
    assert tr["n"] == n and tr["p50"] > 0, tr
    assert within(level["p50_ttft_ms"], ttft, 0.05), level["p50_ttft_ms"]


def test_failed_requests_convert_time_like_completed(kvrouter, tmp):
    # The sim cuts every stream after 3 tokens: each request fails after its first token, and its
    # record must still split TTFT into transport (1x) + engine x scale, as a completed one does.
    ttft, itl, n, scale = 400, 50, 10, 10
    with start_sim(kvrouter, "--fixed-ttft-ms", ttft, "--fixed-itl-ms", itl, "--time-scale",
                   scale, "--fault", "disconnect", "--fault-after-tokens", 3, "--log-level",
                   "warn") as sim:
        out = os.path.join(tmp, "failed")
        argv = [kvrouter, "bench", "--url", sim.url, "--out", out, "--quiet", "--cooldown-s", 0,
                "--time-scale", scale, "--rates", 2, "--num-prompts", n, "--output-mean", 10,
                "--output-std", 0, "--output-min", 10, "--output-max", 10]
        p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)
    assert os.path.exists(os.path.join(out, "requests.jsonl")), p.stderr
    with open(os.path.join(out, "requests.jsonl")) as f:
        reqs = [json.loads(line) for line in f if line.strip()]
    measured = [r for r in reqs if not r.get("warmup")]
    assert len(measured) == n and not any(r["ok"] for r in measured), measured
    engines = []
    for r in measured:
        assert r["error"] and 0 <= r["transport_ms"] < r["ttft_ms"] <= r["e2e_ms"], r
        engines.append(r["ttft_ms"] - r["transport_ms"])
    engines.sort()
    assert within(engines[len(engines) // 2], ttft, 0.05), engines


def search_levels(kvrouter, sim, out, *args):
    argv = [kvrouter, "bench", "--url", sim.url, "--out", out, "--quiet", "--cooldown-s", "0",
            "--time-scale", 20, "--search", "--search-start", 0.4, "--search-resolution", 0.2,
            "--num-prompts", 50, "--output-mean", 4, "--output-std", 0, "--output-min", 4,
            "--output-max", 4]
    p = subprocess.run([str(a) for a in argv + list(args)], capture_output=True, text=True,
                       timeout=90)
    assert p.returncode == 0, "bench failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    levels = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, "results", "*.json")))]
    return sorted(levels, key=lambda lv: lv["request_rate"]), open(os.path.join(out, "report.md")).read()


def test_search_stops_level_once_ttft_p99_failed(kvrouter, tmp):
    # TTFT 1500 simulated ms against the 1000 ms SLO: every level fails (0.4, then 0.2 req/s). Of
    # 50 measured requests, p99 = s[48] + ...: two at or over the SLO decide it, and the level ends
    # there with nothing more sent.
    with start_sim(kvrouter, "--fixed-ttft-ms", 1500, "--fixed-itl-ms", 20, "--time-scale", 20,
                   "--log-level", "warn") as sim:
        levels, report = search_levels(kvrouter, sim, os.path.join(tmp, "stop"))
        full, _ = search_levels(kvrouter, sim, os.path.join(tmp, "nostop"), "--no-early-stop")
    assert [lv["request_rate"] for lv in levels] == [0.2, 0.4], levels
    for lv in levels:
        k = lv["kvrouter"]
        assert k["stopped_early"] and k["ttft_over_slo_when_stopped"] == 2, k
        assert lv["completed"] < 50 and lv["failed"] == 0, lv
        assert not k["slo_pass"] and "ttft" in k["slo_failing"].lower(), k
    assert "FAIL (TTFT) (stopped early)" in report and '"Stopped early"' in report, report
    for lv in full:
        assert not lv["kvrouter"]["stopped_early"] and lv["completed"] == 50, lv
        assert not lv["kvrouter"]["slo_pass"], lv["kvrouter"]
    # A level whose p99 passes is never cut: TTFT 200 ms passes at 0.4 and at the 0.8 cap.
    with start_sim(kvrouter, "--fixed-ttft-ms", 200, "--fixed-itl-ms", 20, "--time-scale", 20,
                   "--log-level", "warn") as sim:
        ok, _ = search_levels(kvrouter, sim, os.path.join(tmp, "pass"), "--search-max", 0.8)
    assert [lv["request_rate"] for lv in ok] == [0.4, 0.8], ok
    for lv in ok:
        assert not lv["kvrouter"]["stopped_early"] and lv["completed"] == 50, lv
        assert lv["kvrouter"]["slo_pass"], lv["kvrouter"]


def test_session_answers_resent(kvrouter, tmp):
    tokens = 40
    with start_sim(kvrouter, "--fixed-ttft-ms", 10, "--fixed-itl-ms", 2, "--log-level",
                   "warn") as sim:
        _, reqs = run_bench(kvrouter, sim, os.path.join(tmp, "session"), "--multiturn-mode",
                            "session", "--turns", 2, "--think-s", 0.05, "--rates", 8,
                            "--num-prompts", 12, "--output-mean", tokens, "--output-std", 0,
                            "--output-min", tokens, "--output-max", tokens)
    by_conv = {}
    for r in reqs:
        assert r["ok"], r
        by_conv.setdefault(r["conversation"], {})[r["turn"]] = r
    pairs = [c for c in by_conv.values() if 1 in c and 2 in c]
    assert pairs, by_conv
    for c in pairs:
        # Turn 2 carries turn 1's prompt, the streamed answer (~1 prompt token per answer token
        # at the sim's 4 characters per token) and a short follow-up.
        grew = c[2]["prompt_tokens"] - c[1]["prompt_tokens"]
        assert grew >= 0.5 * c[1]["output_tokens"], (c[1], c[2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrouter", required=True)
    args = ap.parse_args()
    kvrouter = os.path.abspath(args.kvrouter)
    tmp = tempfile.mkdtemp(prefix="kvr_bench_acc_test_")
    try:
        for t in (test_fixed_latency_chat, test_fixed_latency_completions,
                  test_time_scale_stretches_engine_time_only,
                  test_failed_requests_convert_time_like_completed,
                  test_search_stops_level_once_ttft_p99_failed, test_session_answers_resent):
            t(kvrouter, tmp)
            print("ok", t.__name__)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
