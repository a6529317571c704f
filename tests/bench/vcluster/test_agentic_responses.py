#!/usr/bin/env python3
"""Agentic Responses API sessions (issue 36) through `kvrouter bench --workload agentic --api
responses`: each turn sends only its new message and names the previous answer's id
(previous_response_id, store true); the history is the worker's response store.

  - virtual time, a few sessions under round_robin, kv_aware and the oracle: every request
    completes, every follow-up runs on the worker of its conversation's first turn and finds the
    previous prompt in that worker's cache; two runs give the same requests;
  - virtual time without the router's pinning (--no-response-affinity): follow-ups reach workers
    that never stored the response, vLLM's 404s, and the level fails;
  - real time, the same sessions through `kvrouter serve` to two `kvrouter sim` workers with
    VLLM_ENABLE_RESPONSES_API_STORE=1: no failure, the same pinning and reuse, and the same
    prompt of every turn (in the engine's tokens) as virtual time renders it: the virtual
    cluster's store and rendering are the sim's;
  - the refusals: --no-response-affinity without --virtual or --api responses, --api responses
    with multiturn's replay.

Run:  python3 tests/bench/vcluster/test_agentic_responses.py --kvrouter build/kvrouter [-k NAME]
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import Cleanup, Router, Sim  # noqa: E402

TESTS, test = h.registry()
SCRATCH = h.Scratch("kvr_agentic_responses_test_")

# A few short sessions: 3-5 turns of 250-1250-token tool outputs after a 3,500-4,000-token
# system prompt, 12 measured requests.
WORKLOAD = ["--workload", "agentic", "--api", "responses", "--agentic-turns-min", "3",
            "--agentic-turns-max", "5", "--tool-min-tokens", "250", "--tool-max-tokens", "1250",
            "--agentic-max-context", "12700", "--rates", "1", "--num-prompts", "12", "--warmup",
            "0", "--seed", "7", "--quiet"]
BLOCK = 16  # the sim's KV block size in tokens


def bench(out, *args, timeout=120):
    p = subprocess.run([h.KVROUTER, "bench"] + [str(a) for a in args] + ["--out", out],
                       capture_output=True, text=True, timeout=timeout)
    return p


def requests_of(out):
    with open(os.path.join(out, "requests.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def by_conversation(reqs):
    convs = {}
    for r in reqs:
        convs.setdefault((r["label"], r["conversation"]), {})[r["turn"]] = r
    return convs


def assert_chained(reqs):
    """Every request completed; every follow-up on its first turn's worker, its prompt longer
    than the previous one and all of the previous prompt but its last partial block cached."""
    assert reqs, "no requests"
    follow = 0
    for (label, conv), turns in by_conversation(reqs).items():
        for t, r in sorted(turns.items()):
            assert r["ok"] and r["status"] == 200, (label, conv, t, r)
            if t == 1:
                continue
            prev, first = turns[t - 1], turns[1]
            assert r["worker"] == first["worker"], (label, conv, t, r["worker"], first["worker"])
            assert r["prompt_tokens"] > prev["prompt_tokens"] + prev["output_tokens"], (r, prev)
            assert r["cached_tokens"] + BLOCK > prev["prompt_tokens"], (label, conv, t, r, prev)
            follow += 1
    assert follow >= 5, follow


@test(timeout=60)
def test_virtual_pinned_chains():
    """round_robin, kv_aware and the oracle: pinned chains reusing their worker's cache; the
    same command twice gives the same requests."""
    out = [os.path.join(SCRATCH.path, "v%d" % i) for i in range(2)]
    for o in out:
        p = bench(o, "--virtual", "--ab", "round_robin,kv_aware,oracle", *WORKLOAD)
        assert p.returncode == 0, (p.stdout, p.stderr)
    reqs = requests_of(out[0])
    assert {r["label"] for r in reqs} == {"round_robin", "kv_aware", "oracle"}, reqs[:1]
    assert_chained(reqs)
    assert reqs == requests_of(out[1])


@test(timeout=60)
def test_virtual_without_pinning_fails():
    """--no-response-affinity: follow-ups on workers without the response are vLLM's 404s,
    failed requests, and the level fails whatever its latencies."""
    out = os.path.join(SCRATCH.path, "noaff")
    p = bench(out, "--virtual", "--ab", "round_robin,kv_aware", "--no-response-affinity",
              *WORKLOAD)
    assert p.returncode == 0, (p.stdout, p.stderr)
    reqs = requests_of(out)
    missing = [r for r in reqs if r["status"] == 404]
    assert len(missing) >= 3, reqs
    assert all(r["turn"] > 1 and not r["ok"] for r in missing), missing
    assert "0.00 RPS" in p.stdout, p.stdout
    report = open(os.path.join(out, "report.md")).read()
    assert "FAIL" in report


@test(timeout=120)
def test_real_time_matches_virtual():
    """Through the router to two sims storing responses (time scale 10): no failure, pinned
    chains, and every turn's prompt the engine's same number of tokens as in virtual time."""
    env = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    with Cleanup() as c:
        sims = [c.add(Sim("--time-scale", 10, "--seed", i, fixed=None, env=env))
                for i in range(2)]
        r = c.add(Router(sims, "--scrape-interval-ms", "100", "--worker-header", "true"))
        real = os.path.join(SCRATCH.path, "real")
        p = bench(real, "--url", "http://127.0.0.1:%d" % r.port, "--time-scale", 10, *WORKLOAD)
        assert p.returncode == 0, (p.stdout, p.stderr)
    virt = os.path.join(SCRATCH.path, "virt")
    p = bench(virt, "--virtual", "--workers", 2, *WORKLOAD)
    assert p.returncode == 0, (p.stdout, p.stderr)
    rreqs, vreqs = requests_of(real), requests_of(virt)
    assert_chained(rreqs)
    assert_chained(vreqs)
    rt = {(x["conversation"], x["turn"]): x["prompt_tokens"] for x in rreqs}
    vt = {(x["conversation"], x["turn"]): x["prompt_tokens"] for x in vreqs}
    assert rt == vt, (rt, vt)


@test(timeout=30)
def test_refusals():
    """One line and exit 2 for the flags that cannot apply."""
    out = os.path.join(SCRATCH.path, "bad")
    cases = [
        (["--virtual", "--no-response-affinity", "--workload", "agentic", "--rates", "1"],
         "--no-response-affinity: virtual time with --api responses only"),
        (["--url", "http://127.0.0.1:9", "--no-response-affinity", "--workload", "agentic",
          "--api", "responses", "--rates", "1"],
         "--no-response-affinity: virtual time with --api responses only"),
        (["--virtual", "--api", "responses", "--rates", "1"], "--multiturn-mode session"),
    ]
    for args, want in cases:
        p = bench(out, *args, "--quiet")
        assert p.returncode == 2, (args, p.returncode, p.stdout, p.stderr)
        assert want in p.stderr, (args, p.stderr)


if __name__ == "__main__":
    sys.exit(h.run(TESTS, around=SCRATCH.around))
