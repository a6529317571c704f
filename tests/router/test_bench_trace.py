#!/usr/bin/env python3
"""test_bench_trace.py -- `kvrouter bench --workload trace:FILE` (issue 34, replay), end to end.

The fixture is a 200-line slice of ../shared/traces/mooncake_synthetic_trace.jsonl (its lines
3,401-3,600: 47 s, 4.2 req/s, 32% of its blocks seen earlier within the slice, inputs up to 66,758
tokens), copied to tests/bench/loadgen/trace_mooncake_3401_3600.jsonl. Every figure the tests
compare the bench's against is computed here, independently, from the file.

- reader errors: a malformed line, a missing field, a negative length: exit 2, one stderr line
  naming FILE:LINE; the flags a trace rules out (--concurrency, --burstiness), a bad
  --trace-window and a too small --trace-block-tokens: exit 2, one line;
- --virtual A/B on the slice: every request sent once per label, prompt tokens = the trace's
  input_length, output tokens = its output_length; the report's Trace section states the file's
  requests, span, mean rate, lengths and infinite-cache hit rate as computed here, and each run's
  cached share beside it; kv_aware caches more than round_robin;
- one worker whose cache never evicts, at a rate where requests never overlap: its cached share is
  the infinite cache's (the synthesis shares exactly what the ids share);
- rate scaling and window: each request's scheduled send time is its trace arrival (from the
  window's first) times (sent mean rate / level rate);
- the workers' context: requests whose input + output exceed --max-model-len are counted in the
  report and the JSON, never sent, never failures;
- real time against a sim (no router): the context read from GET /v1/models, lengths honoured;
- the capture round trip: traffic through a real router with --trace-out, replayed through the
  virtual cluster: prompt tokens equal request by request, and the block-sharing statistics (the
  infinite-cache hit rate, the shared-prefix length of every request) agree within the capture's
  block quantisation, the replay never sharing more (see test_capture_round_trip).

Usage: python3 tests/router/test_bench_trace.py --kvrouter PATH/TO/kvrouter [-k NAME] [-v]
"""
import glob
import json
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, MODEL, Cleanup, Router, Sim, request  # noqa: E402

TESTS, test = h.registry()
SCRATCH = h.Scratch("kvr_bench_trace_test_")
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "bench", "loadgen", "trace_mooncake_3401_3600.jsonl")


# ---- the trace's figures, computed here ----------------------------------------------------------

def load_trace(path):
    """The file's requests in arrival order (ties by line), as dicts."""
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return sorted(recs, key=lambda r: r["timestamp"])  # sorted() is stable


def infinite(recs, block=512):
    """Per request, the input tokens of its leading blocks whose whole prefix an earlier request
    carried (one cache that never evicts); and the block counts (seen, all)."""
    seen, per, bseen, blocks = set(), [], 0, 0
    for r in recs:
        ids, k = r["hash_ids"], 0
        while k < len(ids) and tuple(ids[:k + 1]) in seen:
            k += 1
        for j in range(len(ids)):
            seen.add(tuple(ids[:j + 1]))
        per.append(min(k * block, r["input_length"]))
        bseen += k
        blocks += len(ids)
    return per, bseen, blocks


def bench(*args, timeout=120):
    return subprocess.run([h.KVROUTER, "bench"] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout)


def bench_ok(out, *args, timeout=120):
    """A bench that must succeed into out: (report.md, level JSONs by label, requests by label)."""
    p = bench(*(list(args) + ["--out", out, "--quiet"]), timeout=timeout)
    assert p.returncode == 0, "bench failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    for marker in h.SANITIZER_MARKERS:
        assert marker not in p.stderr, p.stderr
    report = open(os.path.join(out, "report.md")).read()
    levels = {}
    for f in sorted(glob.glob(os.path.join(out, "results", "*.json"))):
        lv = json.load(open(f))
        levels.setdefault(os.path.basename(f).split("_rate")[0], []).append(lv)
    reqs = {}
    with open(os.path.join(out, "requests.jsonl")) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                reqs.setdefault(r["label"], []).append(r)
    for rs in reqs.values():
        rs.sort(key=lambda r: (r["rate"], r["conversation"]))
    return report, levels, reqs


def one_error_line(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def cached_share(rs):
    return sum(r["cached_tokens"] for r in rs) / sum(r["prompt_tokens"] for r in rs)


def write(name, text):
    path = os.path.join(SCRATCH.path, name)
    with open(path, "w") as f:
        f.write(text)
    return path


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'


# ---- tests ------------------------------------------------------------------------------------

@test(timeout=30)
def test_reader_errors_exit_2():
    cases = [
        (GOOD + "\n" + GOOD + '{"timestamp": 5, "input_length": 3\n', ":4: not a JSON object"),
        (GOOD + '{"timestamp": 5, "input_length": 3, "output_length": 1}\n',
         ":2: missing field 'hash_ids'"),
        ('{"timestamp": 5, "input_length": 30, "output_length": -1, "hash_ids": []}\n',
         ":1: 'output_length' must be a non-negative integer"),
        ('{"input_length": 30, "output_length": 1, "hash_ids": []}\n',
         ":1: missing field 'timestamp'"),
    ]
    for i, (text, why) in enumerate(cases):
        path = write("bad%d.jsonl" % i, text)
        p = bench("--virtual", "--workload", "trace:" + path, "--rates", "1", "--quiet",
                  "--out", os.path.join(SCRATCH.path, "bad"))
        one_error_line(p, path + why)
    trace = "trace:" + FIXTURE
    for args, needle in [
            (["--concurrency", "4"], "--concurrency"),
            (["--rates", "1", "--burstiness", "2"], "--burstiness"),
            (["--rates", "1", "--trace-window", "30:20"], "--trace-window"),
            (["--rates", "1", "--trace-window", "5000:"], "no request arrives in --trace-window"),
            (["--rates", "1", "--trace-block-tokens", "8"], "--trace-block-tokens"),
            (["--rates", "1", "--max-model-len", "50"], "none of the 200 requests fits")]:
        p = bench("--virtual", "--workload", trace, "--quiet", "--out",
                  os.path.join(SCRATCH.path, "bad"), *args)
        one_error_line(p, needle)


@test(timeout=120)
def test_virtual_ab_on_the_slice():
    recs = load_trace(FIXTURE)
    per, bseen, blocks = infinite(recs)
    out = os.path.join(SCRATCH.path, "ab")
    report, levels, reqs = bench_ok(out, "--virtual", "--workload", "trace:" + FIXTURE, "--ab",
                                    "round_robin,kv_aware", "--rates", "4")
    assert sorted(reqs) == ["phase0", "phase3"], sorted(reqs)
    for label, rs in reqs.items():
        assert len(rs) == len(recs), (label, len(rs))
        for r, t in zip(rs, recs):
            assert r["ok"], r
            assert r["prompt_tokens"] == t["input_length"], (r, t)
            assert r["output_tokens"] == max(1, t["output_length"]), (r, t)
    rr, kv = cached_share(reqs["phase0"]), cached_share(reqs["phase3"])
    assert kv > rr, (kv, rr)
    # The report's trace section: the file's own figures, as computed here.
    m = re.search(r"^## Trace\n", report, re.M)
    assert m, report[:3000]
    sec = report[m.end():report.index("\n## ", m.end())]
    span = (recs[-1]["timestamp"] - recs[0]["timestamp"]) / 1000
    assert "| Requests | 200 over %s s: mean rate %.2f req/s |" % (
        format(round(span), ","), 199 / span) in sec, sec
    assert "%.1f%% of blocks seen earlier in the trace (%.1f%% of input tokens)" % (
        100 * bseen / blocks, 100 * sum(per) / sum(r["input_length"] for r in recs)) in sec, sec
    mean_in = sum(r["input_length"] for r in recs) / len(recs)
    assert "| Input tokens per request | mean %s," % format(round(mean_in), ",") in sec, sec
    assert "max %s |" % format(max(r["input_length"] for r in recs), ",") in sec, sec
    # Each run's cached share beside the infinite cache's.
    ideal = 100 * sum(per) / sum(r["input_length"] for r in recs)
    assert "Share of the infinite cache's %.1f%%" % ideal in sec, sec
    assert re.search(r"\| phase0 \(round_robin\) \| 4\.00 \| %.1f%% \|" % (100 * rr), sec), sec
    assert re.search(r"\| phase3 \(kv_aware\) \| 4\.00 \| %.1f%% \|" % (100 * kv), sec), sec
    # The workload parameters say what a rate and a level are.
    assert "the trace's 200 requests that fit the workers' context" in report
    assert "the trace's own arrival times, scaled to each rate" in report
    # Each level's JSON carries the trace's figures and its own cached share.
    for label in ("phase0", "phase3"):
        t = levels[label][0]["kvrouter"]["trace"]
        assert t["requests"] == 200 and t["sent"] == 200 and t["over_context"] == 0, t
        assert abs(t["infinite_cache_block_share"] - bseen / blocks) < 1e-9, t
        assert abs(t["cached_token_share"] - cached_share(reqs[label])) < 1e-9, t


@test(timeout=60)
def test_one_infinite_worker_caches_what_the_ids_share():
    """One worker whose cache holds everything, requests 20 simulated seconds apart on average:
    the cached share is the infinite cache's, request by request within a block (vLLM computes
    at least the last token of a prompt, so a prompt seen whole is cached one block short)."""
    recs = load_trace(FIXTURE)
    per, _, _ = infinite(recs)
    out = os.path.join(SCRATCH.path, "inf")
    report, levels, reqs = bench_ok(out, "--virtual", "--workload", "trace:" + FIXTURE, "--rates",
                                    "0.05", "--workers", "1", "--num-gpu-blocks", "400000")
    rs = reqs["bench"]
    assert len(rs) == 200
    for r, want in zip(rs, per):
        assert want - 16 <= r["cached_tokens"] <= want, (r["cached_tokens"], want, r)
    ideal = sum(per) / sum(r["input_length"] for r in recs)
    assert abs(cached_share(rs) - ideal) < 0.002, (cached_share(rs), ideal)


@test(timeout=60)
def test_rate_scaling_and_window():
    recs = [r for r in load_trace(FIXTURE) if 890000 <= r["timestamp"] < 910000]
    span = (recs[-1]["timestamp"] - recs[0]["timestamp"]) / 1000
    sent_rate = (len(recs) - 1) / span
    out = os.path.join(SCRATCH.path, "win")
    report, levels, reqs = bench_ok(out, "--virtual", "--workload", "trace:" + FIXTURE,
                                    "--trace-window", "890:910", "--rates", "2,8")
    rs = reqs["bench"]
    for rate in (2, 8):
        lv = [r for r in rs if r["rate"] == rate]
        assert len(lv) == len(recs), (rate, len(lv), len(recs))
        f = sent_rate / rate
        for r, t in zip(lv, recs):
            want = (t["timestamp"] - recs[0]["timestamp"]) / 1000 * f
            assert abs(r["target_s"] - want) < 2e-6, (rate, r["target_s"], want)
            assert r["prompt_tokens"] == t["input_length"], (r, t)
        # The level's scheduled rate is the level's rate.
        js = [x for x in levels["bench"] if x["request_rate"] == rate][0]
        assert abs(js["kvrouter"]["scheduled_rate"] - rate) < 1e-6 * rate, js["kvrouter"]
    assert "| Window | requests arriving in [890, 910) s |" in report, report[:3000]


@test(timeout=60)
def test_requests_over_the_context_are_counted_not_sent():
    recs = load_trace(FIXTURE)
    ctx = 32768
    over = [r for r in recs if r["input_length"] + max(1, r["output_length"]) > ctx]
    assert over, "the fixture has requests over 32,768 tokens"
    out = os.path.join(SCRATCH.path, "ctx")
    report, levels, reqs = bench_ok(out, "--virtual", "--workload", "trace:" + FIXTURE, "--rates",
                                    "4", "--max-model-len", ctx)
    rs = reqs["bench"]
    assert len(rs) == 200 - len(over) and all(r["ok"] for r in rs), len(rs)
    t = levels["bench"][0]["kvrouter"]["trace"]
    assert t["over_context"] == len(over) and t["max_context"] == ctx, t
    assert levels["bench"][0]["failed"] == 0
    assert "| Longer than the workers' context | %d requests (input + output over 32,768 " \
           "tokens): counted here, not sent |" % len(over) in report, report[:3000]


@test(timeout=90)
def test_real_time_against_a_sim():
    """No router, no virtual clock: a sim at 20x, its context (max_model_len 32768) read from
    GET /v1/models."""
    recs = [r for r in load_trace(FIXTURE) if 882000 <= r["timestamp"] < 892000]
    fits = [r for r in recs if r["input_length"] + max(1, r["output_length"]) <= 32768]
    assert len(fits) < len(recs), "the window holds a request over the context"
    with Cleanup() as c:
        sim = c.add(Sim("--time-scale", "20", "--max-model-len", "32768", fixed=None))
        out = os.path.join(SCRATCH.path, "real")
        report, levels, reqs = bench_ok(out, "--url", sim.url, "--workload", "trace:" + FIXTURE,
                                        "--trace-window", "882:892", "--rates", "4",
                                        "--time-scale", "20", "--cooldown-s", "0")
    rs = reqs["bench"]
    assert len(rs) == len(fits), (len(rs), len(fits))
    for r, t in zip(rs, fits):
        assert r["ok"] and r["prompt_tokens"] == t["input_length"], (r, t)
        assert r["output_tokens"] == max(1, t["output_length"]), (r, t)
    assert "%d requests (input + output over 32,768 tokens)" % (len(recs) - len(fits)) in report


# ---- the capture round trip -----------------------------------------------------------------------

WORDS = ("cache router prefix block worker token model request policy latency queue batch "
         "decode prefill memory engine stream answer question document section table figure "
         "the of and to in is for on with as by at from that this it be are was").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def original_traffic(port, n=40, seed=7):
    """n chat requests, one after another, over a few shared documents (system prompts), their
    follow-ups (the whole history resent) and unrelated prompts; returns each one's usage
    (prompt_tokens, cached_tokens) in send order."""
    rng = random.Random(seed)
    docs = ["Document %d. " % i + words(rng, rng.randint(300, 1500)) for i in range(5)]
    open_convs, usage = [], []
    for _ in range(n):
        x = rng.random()
        if x < 0.35 and open_convs:
            msgs = open_convs.pop(rng.randrange(len(open_convs)))
            msgs = msgs + [{"role": "user", "content": "And " + words(rng, rng.randint(5, 60))}]
        elif x < 0.85:
            msgs = [{"role": "system", "content": rng.choice(docs)},
                    {"role": "user", "content": "Question: " + words(rng, rng.randint(5, 40))}]
        else:
            msgs = [{"role": "user", "content": "Unrelated " + words(rng, rng.randint(50, 600))}]
        body = {"model": MODEL, "messages": msgs, "max_tokens": 4, "ignore_eos": True}
        resp = request(port, "POST", "/v1/chat/completions", body, timeout=30)
        assert resp.status == 200, (resp.status, resp.body[:300])
        j = resp.json()
        u = j["usage"]
        usage.append((u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]))
        answer = j["choices"][0]["message"]["content"]
        open_convs.append(msgs + [{"role": "assistant", "content": answer}])
    return usage


@test(timeout=120)
def test_capture_round_trip():
    """Traffic through a real router (one sim whose cache never evicts, requests one after another,
    so each request's cached tokens are the longest prefix it shares with an earlier one, in the
    engine's 16-token blocks) is captured with --trace-out at 64-token blocks and replayed through
    the virtual cluster (one worker, a cache that never evicts, requests far apart).

    The replay's prompts have the original lengths exactly (the capture takes them from the
    worker's usage). Its sharing is the original's cut down to the capture's blocks, never more:
    the capture names a 64-token block shared only when all four of its router blocks (64 bytes of
    the router's canonical text) agree, and the canonical text writes each message's header in
    fewer bytes than the engine's chat template takes tokens x 4, so the capture's cut falls at or
    before the engine's. Less by at most one capture block (64 tokens: a shared block the original
    shared only in part) plus what the template difference moves the cut (a few tokens here: under
    one more 16-token engine block). Hence per request 0 <= original - replay <= 80 tokens (seeds
    7, 8, 9 gave differences of 0, 16, 32, 48 and 64), the hit rates within 80 tokens per request
    of each other, and the shared-prefix lengths' distributions the same within one 64-token
    bin."""
    cap = os.path.join(SCRATCH.path, "captured.jsonl")
    with Cleanup() as c:
        sim = c.add(Sim("--time-scale", "20", fixed=None))
        r = c.add(Router([sim], *FAST, "--trace-out", cap, "--trace-block-tokens", "64"))
        orig = original_traffic(r.port)
        r.stop()
    lines = load_trace(cap)
    assert len(lines) == len(orig), (len(lines), len(orig))
    assert [ln["input_length"] for ln in lines] == [p for p, _ in orig]
    out = os.path.join(SCRATCH.path, "replay")
    report, levels, reqs = bench_ok(out, "--virtual", "--workload", "trace:" + cap,
                                    "--trace-block-tokens", "64", "--rates", "0.05", "--workers",
                                    "1")
    rep = reqs["bench"]
    assert [x["prompt_tokens"] for x in rep] == [p for p, _ in orig]
    o_c = [c for _, c in orig]
    r_c = [x["cached_tokens"] for x in rep]
    for i, (a, b) in enumerate(zip(o_c, r_c)):
        assert 0 <= a - b <= 80, (i, a, b, o_c, r_c)
    tokens = sum(p for p, _ in orig)
    o_hit, r_hit = sum(o_c) / tokens, sum(r_c) / tokens
    assert abs(o_hit - r_hit) <= 80 * len(orig) / tokens, (o_hit, r_hit)
    # The distribution of shared-prefix lengths, in 64-token bins: the same up to one bin.
    o_bins, r_bins = sorted(a // 64 for a in o_c), sorted(b // 64 for b in r_c)
    assert all(abs(a - b) <= 1 for a, b in zip(o_bins, r_bins)), (o_bins, r_bins)
    # The capture's own figure (trace blocks seen earlier) is the replay's ceiling.
    t = levels["bench"][0]["kvrouter"]["trace"]
    assert r_hit <= t["infinite_cache_token_share"] + 1e-9, (r_hit, t)
    print("  original %.1f%%, capture %.1f%%, replay %.1f%% of %d prompt tokens cached" % (
        100 * o_hit, 100 * t["infinite_cache_token_share"], 100 * r_hit, tokens))


if __name__ == "__main__":
    sys.exit(h.run(TESTS, around=SCRATCH.around))
