#!/usr/bin/env python3
"""test_bench_vllm.py -- `kvrouter bench` takes `vllm bench serve`'s spellings (issue 34).

The mapping is bench/loadgen/README.md's table ("vllm bench serve's spellings"); the result JSON is
read with vllm's own code in tests/bench/scripts/test_vllm_result_compat.py. Here, through the
command line:

- each vllm spelling gives what kvrouter's own spelling of it gives: two --virtual runs, one per
  spelling, whose level JSONs and requests are equal (but for the date): --request-rate/--rates,
  --num-warmups/--warmup, --label/--labels, --disable-tqdm/--quiet, --backend openai and
  --endpoint /v1/completions/--api completions, --endpoint /v1/chat/completions/--api chat,
  --timed-trace-chunk-hash-size/--trace-block-tokens, --dataset-name sharegpt --dataset-path F/
  --workload sharegpt:F with vllm's defaults spelled out (--num-prompts 1000, --api completions,
  --no-ignore-eos), the timed_trace labels at their default names;
- --dataset-name timed_trace at its own times (--timed-trace-sec-multiplier M) sends each request
  at its timestamp x M from the first, as --workload trace:F --rates R does at the rate R that is
  the trace's own at that pace: the same schedule and requests (the first --num-prompts);
- --request-rate inf: every request due at the level's start;
- --max-concurrency N: never more than N in flight (requests.jsonl), the others wait (the JSON's
  queue_times), the generator's send lag does not count the wait;
- against a real `kvrouter sim`: --host/--port/--endpoint and --base-url reach it as --url does,
  and --backend vllm is the backend the JSON names;
- refused, one line naming the flag, exit 2: a vllm flag with no kvrouter equivalent
  (--temperature, --tokenizer, a random-dataset flag, --no-self-timed), a vllm dataset kvrouter
  does not have, a timed_trace label other than the format's, a setting given in both spellings,
  --request-rate over a timed_trace (vllm ignores it there), --goodput's bad pairs, a result
  file flag without --save-result; an unknown flag is still "unknown option", exit 2.

Usage: python3 tests/router/test_bench_vllm.py --kvrouter PATH/TO/kvrouter [-k NAME] [-v]
"""
import glob
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import Cleanup, Sim  # noqa: E402

TESTS, test = h.registry()
SCRATCH = h.Scratch("kvr_bench_vllm_test_")
HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "bench", "loadgen", "trace_mooncake_3401_3600.jsonl")
SMALL = ["--virtual", "--workers", "2", "--workload", "multiturn", "--multiturn-mode", "session",
         "--num-prompts", "12", "--quiet"]


def bench(*args, timeout=120):
    return subprocess.run([h.KVROUTER, "bench"] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout)


def run(name, *args):
    """A bench that must succeed into SCRATCH/name: (level JSONs by file name, requests)."""
    out = os.path.join(SCRATCH.path, name)
    shutil.rmtree(out, ignore_errors=True)
    p = bench(*(list(args) + ["--out", out]))
    assert p.returncode == 0, "bench %s failed (%d):\n%s" % (args, p.returncode, p.stderr)
    for marker in h.SANITIZER_MARKERS:
        assert marker not in p.stderr, p.stderr
    levels = {os.path.basename(f): json.load(open(f))
              for f in sorted(glob.glob(os.path.join(out, "results", "*.json")))}
    with open(os.path.join(out, "requests.jsonl")) as f:
        reqs = [json.loads(line) for line in f if line.strip()]
    return levels, reqs, p


def same(vllm_args, kvr_args):
    """Runs both spellings; asserts equal level JSONs (the date aside) and requests."""
    a, ra, pa = run("v", *vllm_args)
    b, rb, pb = run("k", *kvr_args)
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for name in a:
        a[name].pop("date")
        b[name].pop("date")
        assert a[name] == b[name], "%s: %s vs %s differ:\n%s\n%s" % (
            name, vllm_args, kvr_args, json.dumps(a[name])[:1500], json.dumps(b[name])[:1500])
    assert ra == rb, (vllm_args, kvr_args)
    outs = [(p.stdout + p.stderr).replace(os.path.join(SCRATCH.path, n), "OUT")
            for p, n in ((pa, "v"), (pb, "k"))]
    assert outs[0] == outs[1], outs
    return a, ra


@test(timeout=240)
def test_spellings_equal_kvrouters():
    pairs = [
        (["--request-rate", "3"], ["--rates", "3"]),
        (["--request-rate", "3", "--num-warmups", "2"], ["--rates", "3", "--warmup", "2"]),
        (["--rates", "3", "--label", "mine"], ["--rates", "3", "--labels", "mine"]),
        (["--rates", "3", "--backend", "openai", "--endpoint", "/v1/completions"],
         ["--rates", "3", "--api", "completions"]),
        (["--rates", "3", "--endpoint", "/v1/chat/completions"], ["--rates", "3", "--api", "chat"]),
        (["--rates", "3", "--backend", "openai-chat", "--ignore-eos"], ["--rates", "3"]),
    ]
    for v, k in pairs:
        same(SMALL + v, SMALL + k)
    # --disable-tqdm is --quiet: the level lines go to stderr without either
    loud = [x for x in SMALL if x != "--quiet"]
    same(loud + ["--rates", "3", "--disable-tqdm"], loud + ["--rates", "3", "--quiet"])


def sharegpt(path):
    data = []
    for i in range(30):
        prompt = " ".join("w%d" % ((i * 7 + j) % 50) for j in range(10 + 13 * (i % 9)))
        reply = " ".join("r%d" % j for j in range(5 + 11 * (i % 5)))
        data.append({"id": i, "conversations": [{"from": "human", "value": prompt},
                                                {"from": "gpt", "value": reply}]})
    with open(path, "w") as f:
        json.dump(data, f)


@test(timeout=240)
def test_datasets_equal_kvrouters():
    data = os.path.join(SCRATCH.path, "sharegpt.json")
    sharegpt(data)
    v = ["--virtual", "--workers", "2", "--quiet", "--dataset-name", "sharegpt",
         "--dataset-path", data, "--request-rate", "4"]
    k = ["--virtual", "--workers", "2", "--quiet", "--workload", "sharegpt:" + data, "--rates",
         "4", "--num-prompts", "1000", "--api", "completions", "--no-ignore-eos"]
    levels, reqs = same(v, k)
    lv = list(levels.values())[0]
    assert lv["num_prompts"] == 1000 and lv["backend"] == "openai", lv["num_prompts"]
    assert all(r["turn"] == 1 for r in reqs), "vllm's ShareGPT sample is single-turn"
    # --sharegpt-output-len and vllm's --output-len for it: every max_tokens
    levels, reqs = same(v + ["--num-prompts", "20", "--sharegpt-output-len", "7", "--ignore-eos"],
                        v + ["--num-prompts", "20", "--output-len", "7", "--ignore-eos"])
    assert {r["output_tokens"] for r in reqs} == {7}, {r["output_tokens"] for r in reqs}
    # timed_trace flags: the chunk size and the labels at the format's names
    tv = ["--virtual", "--workers", "2", "--quiet", "--workload", "trace:" + TRACE,
          "--trace-window", "882:890", "--rates", "2"]
    same(tv + ["--timed-trace-chunk-hash-size", "64", "--timed-trace-label-timestamp",
               "timestamp", "--timed-trace-label-input-length", "input_length",
               "--timed-trace-label-output-length", "output_length",
               "--timed-trace-label-hash-ids", "hash_ids"],
         tv + ["--trace-block-tokens", "64"])


@test(timeout=240)
def test_timed_trace_at_its_own_times():
    m, n = 0.002, 60
    a, ra, _ = run("tt", "--virtual", "--workers", 2, "--quiet", "--dataset-name", "timed_trace",
                   "--dataset-path", TRACE, "--timed-trace-sec-multiplier", m, "--num-prompts",
                   n, "--disable-shuffle", "--no-oversample", "--self-timed")
    (lv,) = a.values()
    with open(TRACE) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    first = recs[:n]
    t0 = first[0]["timestamp"]
    sends = sorted(ra, key=lambda r: r["seq"])
    assert len(sends) == n and lv["num_prompts"] == n and lv["request_rate"] == "inf"
    for r, t in zip(sends, first):  # at its timestamp x M from the first, as vllm's --self-timed
        assert abs(r["target_s"] - (t["timestamp"] - t0) * m) < 1e-6, (r["target_s"], t)
        assert r["prompt_tokens"] == t["input_length"], (r, t)
    assert lv["kvrouter"]["trace"]["block_tokens"] == 16, "vllm's default chunk"
    assert lv["backend"] == "openai" and lv["kvrouter"]["self_timed"] is True
    # kvrouter's spelling: the trace scaled to the rate that is its own at that pace
    rate = lv["kvrouter"]["trace"]["sent_rate"] / (1000 * m)
    b, rb, _ = run("tk", "--virtual", "--workers", 2, "--quiet", "--workload", "trace:" + TRACE,
                   "--trace-block-tokens", 16, "--num-prompts", n, "--api", "completions",
                   "--rates", repr(rate))
    (lk,) = b.values()
    kends = sorted(rb, key=lambda r: r["seq"])
    assert [r["prompt_tokens"] for r in kends] == [r["prompt_tokens"] for r in sends]
    for x, y in zip(sends, kends):
        assert abs(x["target_s"] - y["target_s"]) < 1e-6, (x["target_s"], y["target_s"])
    # the level's rate: the mean of its own sends (kvrouter's: the one it was given)
    own = (n - 1) / sends[-1]["target_s"]
    assert abs(lv["kvrouter"]["rate"] - own) < 1e-6 * own, (lv["kvrouter"]["rate"], own)
    assert abs(lk["kvrouter"]["rate"] - rate) < 1e-9 * rate, (lk["kvrouter"]["rate"], rate)


@test(timeout=240)
def test_rate_inf_and_max_concurrency():
    a, reqs, _ = run("cap", *(SMALL + ["--request-rate", "inf", "--max-concurrency", "3",
                                       "--num-warmups", "0"]))
    (lv,) = a.values()
    assert lv["request_rate"] == "inf" and lv["max_concurrency"] == 3, lv["request_rate"]
    assert all(r["target_s"] >= 0 for r in reqs)
    # every request arrived at the start: queue_times is its send time
    for q, s in zip(lv["queue_times"], lv["start_times"]):
        assert abs(q - s) < 1e-6, (q, s)
    # never more than 3 in flight (a send at the instant another ended is no overlap: at the
    # virtual clock's nanosecond)
    ev = []
    for s, lat in zip(lv["start_times"], lv["latencies"]):
        ev += [(round(s * 1e9), 1), (round((s + lat) * 1e9), -1)]
    cur = peak = 0
    for _, d in sorted(ev):
        cur += d
        peak = max(peak, cur)
    assert peak == 3 == lv["max_concurrent_requests"], (peak, lv["max_concurrent_requests"])
    assert max(lv["queue_times"]) > 1, "the later ones waited for a slot"
    assert lv["kvrouter"]["send_lag_real_ms"]["max"] < 1, "the lag counts the wait"
    assert lv["kvrouter"]["scheduled_rate"] == lv["kvrouter"]["achieved_rate"]


@test(timeout=120)
def test_url_spellings_against_a_sim():
    with Cleanup() as c:
        sim = c.add(Sim())
        base = ["--rates", "20", "--num-prompts", "4", "--workload", "control", "--output-mean",
                "4", "--output-std", "0", "--output-min", "4", "--output-max", "4", "--quiet",
                "--cooldown-s", "0"]
        for spelling, backend in (
                (["--host", "127.0.0.1", "--port", sim.port, "--endpoint", "/v1/completions",
                  "--backend", "vllm"], "vllm"),
                (["--base-url", sim.url + "/", "--endpoint", "/v1/chat/completions"],
                 "openai-chat"),
                (["--url", sim.url, "--api", "completions"], "openai")):
            a, reqs, _ = run("url_" + backend, *(base + spelling))
            (lv,) = a.values()
            assert lv["completed"] == 4 and lv["backend"] == backend, (spelling, lv["backend"])


def refused(args, flag, words=()):
    p = bench(*args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (args, p.returncode, p.stderr)
    assert lines[0].startswith("kvrouter bench: %s" % flag), (args, lines)
    for w in words:
        assert w in lines[0], (args, w, lines[0])


@test(timeout=60)
def test_refusals():
    tt = ["--dataset-name", "timed_trace", "--dataset-path", TRACE]
    cases = [
        (["--temperature", "0"], "--temperature", ["no kvrouter equivalent"]),
        (["--tokenizer", "x"], "--tokenizer", ["no tokenizer"]),
        (["--random-input-len", "128"], "--random-input-len", ["random"]),
        (["--no-self-timed"], "--no-self-timed", []),
        (["--dataset-name", "random"], "--dataset-name", ["'random'"]),
        (["--dataset-path", TRACE], "--dataset-path", ["--dataset-name"]),
        (["--backend", "tgi"], "--backend", ["'tgi'"]),
        (["--endpoint", "/v1/embeddings"], "--endpoint", []),
        (["--backend", "openai-chat", "--endpoint", "/v1/completions"], "--endpoint", []),
        (tt + ["--timed-trace-label-hash-ids", "ids"], "--timed-trace-label-hash-ids", ["'ids'"]),
        (tt + ["--request-rate", "4"], "--request-rate", ["timed_trace"]),
        (tt + ["--rates", "2", "--timed-trace-sec-multiplier", "1"],
         "--timed-trace-sec-multiplier", []),
        (["--timed-trace-chunk-hash-size", "512"], "--timed-trace-chunk-hash-size", ["trace"]),
        (["--request-rate", "4", "--rates", "2"], "--request-rate", ["--rates"]),
        (["--num-warmups", "1", "--warmup", "2"], "--num-warmups", ["--warmup"]),
        (["--request-rate", "fast"], "--request-rate", ["'fast'"]),
        (["--request-rate", "0"], "--request-rate", []),
        (["--goodput", "ttft:1", "speed:2"], "--goodput", ["'speed'"]),
        (["--goodput", "ttft"], "--goodput", ["KEY:VALUE"]),
        (["--percentile-metrics", "ttft,foo"], "--percentile-metrics", ["'foo'"]),
        (["--metric-percentiles", "101"], "--metric-percentiles", []),
        (["--result-dir", "x"], "--result-dir", ["--save-result"]),
        (["--metadata", "novalue"], "--metadata", ["KEY=VALUE"]),
        (["--max-concurrency", "0"], "--max-concurrency", []),
        (["--ready-check-timeout-sec", "30"], "--ready-check-timeout-sec", []),
        (["--sharegpt-output-len", "5"], "--sharegpt-output-len", ["sharegpt"]),
        (["--no-such-flag"], "--no-such-flag", ["unknown option"]),
    ]
    for args, flag, words in cases:
        refused(args + ["--virtual", "--rates", "1"] if "--request-rate" not in args and
                "--rates" not in args and "timed_trace" not in args else args + ["--virtual"],
                flag, words)
    # vllm's nargs flags: their values end at the next option, whatever its spelling
    p = bench("--virtual", "--rates", "1", "--goodput", "ttft:1", "tpot:2", "--no-such-flag")
    assert p.returncode == 2 and "--no-such-flag: unknown option" in p.stderr, p.stderr


if __name__ == "__main__":
    sys.exit(h.run(TESTS, around=SCRATCH.around))
