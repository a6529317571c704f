#!/usr/bin/env python3
"""test_bench_closedloop.py -- `kvrouter bench --concurrency` measures closed-loop levels in steady state.

Runs the bench against `kvrouter sim` in fixed-latency mode on 127.0.0.1 (time scale 20, short
outputs, every level a few real seconds) with the multiturn workload in session mode, and checks from
the per-level JSON and requests.jsonl what steady state promises (bench/loadgen/README.md):

- the measured turn mix is uniform at every user count: its mean turn is (1 + turns) / 2 at 4 and at
  12 users (users start mid-conversation instead of all at turn 1), so mean input tokens agree;
- each user's first request (a cold, synthetic history) is warm-up, never measured, and users start
  at several different turns;
- every measured request completed, and the users kept sending (cool-down, flagged and excluded)
  until they had; the warm-up, cool-down and cancelled counts add up with the records;
- the per-request arrays of the kvrouter object are aligned with vllm's input_lens;
- --warmup-s applies to concurrency levels: nothing sent before it is measured.

Usage: python3 tests/router/test_bench_closedloop.py --kvrouter PATH/TO/kvrouter [-k NAME] [-v]
The harness is tests/harness/kvrharness.py.
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import Sim  # noqa: E402

TESTS, test = h.registry()
SCRATCH = h.Scratch("kvr_bench_closedloop_test_")  # the bench's output while run() runs

SCALE = 20  # sim and bench: a 0.5 s simulated request takes 25 real ms
TTFT_MS, ITL_MS = 100, 2
TURNS = 5
TOKENS = 200  # per answer: each turn's prompt grows by ~200 tokens, so the turn mix shows in inputs


def run_bench(sim, out, *args):
    """Runs a session-mode multiturn bench against sim; returns ({users: level JSON}, requests)."""
    argv = [h.KVROUTER, "bench", "--url", sim.url, "--out", out, "--quiet", "--cooldown-s", 0,
            "--time-scale", SCALE, "--workload", "multiturn", "--multiturn-mode", "session",
            "--turns", TURNS, "--think-s", 0.5, "--output-mean", TOKENS, "--output-std", 0,
            "--output-min", TOKENS, "--output-max", TOKENS]
    p = subprocess.run([str(a) for a in argv + list(args)], capture_output=True, text=True,
                       timeout=50)
    assert p.returncode == 0, "bench failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    levels = {}
    for f in glob.glob(os.path.join(out, "results", "*.json")):
        lv = json.load(open(f))
        levels[lv["max_concurrency"]] = lv
    with open(os.path.join(out, "requests.jsonl")) as f:
        reqs = [json.loads(line) for line in f if line.strip()]
    return levels, reqs


def mean(xs):
    return sum(xs) / len(xs)


def check_level(users, n, lv, recs):
    """The checks every steady-state level passes; returns the mean input tokens measured."""
    k = lv["kvrouter"]
    assert k["steady_state"] is True, k
    # Every measured request completed: none failed, none was cut at the end.
    assert lv["completed"] == n and lv["failed"] == 0, (users, lv["completed"], lv["failed"])
    for key in ("input_lens", "output_lens", "ttfts"):
        assert len(lv[key]) == n, (users, key, len(lv[key]))
    for key in ("cached_lens", "e2els", "tpots", "turns"):
        assert len(k[key]) == n, (users, key, len(k[key]))
    measured = sorted((r for r in recs if not r["warmup"]), key=lambda r: r["seq"])
    assert len(measured) == n and all(r["ok"] and not r["cooldown"] for r in measured), users
    # The arrays are the measured records in send order (seq; the JSONL is in completion order),
    # as vllm keeps its dispatch order.
    assert k["turns"] == [r["turn"] for r in measured], users
    assert lv["input_lens"] == [r["prompt_tokens"] for r in measured], users
    assert k["cached_lens"] == [r["cached_tokens"] for r in measured], users
    for r, e2e, tpot in zip(measured, k["e2els"], k["tpots"]):
        assert abs(e2e - r["e2e_ms"]) < 0.01 and abs(tpot - r["tpot_ms"]) < 0.01, (r, e2e, tpot)
        assert r["output_tokens"] == TOKENS and tpot > 0, r
    # The drift is gone: users are spread over their conversations, so the measured turns are
    # uniform over 1..TURNS whatever the user count.
    want = (1 + TURNS) / 2.0
    assert abs(mean(k["turns"]) - want) <= 0.3, (users, mean(k["turns"]), want)
    # Each user's first request (history never streamed, nothing cached) is warm-up.
    by_user = {}
    for r in sorted(recs, key=lambda r: r["sent_s"]):
        by_user.setdefault(r["user"], []).append(r)
    assert sorted(by_user) == list(range(users)), sorted(by_user)
    firsts = [rs[0] for rs in by_user.values()]
    assert all(f["warmup"] and not f["cooldown"] and f["target_s"] == 0 for f in firsts), firsts
    # Cool-down requests went out after the last measured one, and only those.
    last_measured = max(r["sent_s"] for r in measured)
    cool = [r for r in recs if r["cooldown"]]
    assert all(r["warmup"] and r["sent_s"] >= last_measured for r in cool), cool
    # Counts: warm-up and cool-down sends, the excluded ones still in flight at the end cancelled
    # (not recorded).
    warm = [r for r in recs if r["warmup"] and not r["cooldown"]]
    assert k["warmup_requests"] >= users and k["warmup_requests"] >= len(warm), (k, len(warm))
    assert k["cooldown_requests"] >= len(cool), (k, len(cool))
    sent = k["warmup_requests"] + k["cooldown_requests"] + n
    assert sent - len(recs) == k["cancelled_requests"], (k, len(recs))
    assert k["measured_requests"] == n, k
    return mean(lv["input_lens"]), [f["turn"] for f in firsts]


@test(timeout=60)
def test_concurrency_levels_in_steady_state():
    n = 90  # not a multiple of 12 users x 5 turns: from turn 1 the mix would lean early
    with Sim("--time-scale", SCALE, fixed=(TTFT_MS, ITL_MS)) as sim:
        out = os.path.join(SCRATCH.path, "steady")
        levels, reqs = run_bench(sim, out, "--concurrency", "4,12",
                                 "--num-prompts", n)
    assert sorted(levels) == [4, 12], sorted(levels)
    inputs = {}
    for users in (4, 12):
        recs = [r for r in reqs if r["concurrency"] == users]
        inputs[users], starts = check_level(users, n, levels[users], recs)
        if users == 12:
            # Users observed mid-conversation start at several turns (seeded: always the same).
            assert len(set(starts)) >= 3, starts
    # The same turn mix gives the same prompts at both user counts.
    assert abs(inputs[4] - inputs[12]) <= 0.15 * inputs[12], inputs
    report = open(os.path.join(out, "report.md")).read()
    assert "measured in steady state" in report, report


@test(timeout=60)
def test_warmup_s_applies_to_concurrency():
    # At 4 users a request takes ~0.5-1 simulated s, so the first 3 s are several rounds of warm-up.
    n, warm_s = 30, 3.0
    with Sim("--time-scale", SCALE, fixed=(TTFT_MS, ITL_MS)) as sim:
        levels, reqs = run_bench(sim, os.path.join(SCRATCH.path, "warmup_s"), "--concurrency", 4,
                                 "--num-prompts", n, "--warmup-s", warm_s)
    k = levels[4]["kvrouter"]
    measured = [r for r in reqs if not r["warmup"]]
    assert len(measured) == n and levels[4]["completed"] == n, levels[4]["completed"]
    assert all(r["sent_s"] >= warm_s for r in measured), min(r["sent_s"] for r in measured)
    early = [r for r in reqs if r["sent_s"] < warm_s]
    assert len(early) > 4 and all(r["warmup"] and not r["cooldown"] for r in early), early
    assert k["warmup_requests"] >= len(early), (k, len(early))


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0], around=SCRATCH.around))
