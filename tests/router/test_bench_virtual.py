#!/usr/bin/env python3
"""test_bench_virtual.py -- `kvrouter bench --virtual` runs the A/B in one process on a virtual clock.

No server is started: the bench runs simulated engines behind the router core on a discrete-event
clock (bench/vcluster/). The checks, end to end through the command line:

- an A/B (round_robin, kv_aware) on the multiturn workload in session mode exits 0 in seconds,
  without --url or --admin; the report's title ends with "(virtual time)" and carries the Clock
  line describing the cluster; every level's JSON says "virtual": true; kv_aware finds later
  turns' prefixes cached, round_robin spreads requests over every worker;
- determinism: the same command twice gives the same summary lines and the same per-request
  latencies, workers and cached tokens in requests.jsonl;
- the oracle is a valid --ab name in virtual time;
- a mixed fleet (--worker-blocks, one value per worker) shows in the Clock line; with a count
  other than --workers it exits 2 with one line naming --worker-blocks;
- usage: --ab without --admin is refused only without --virtual; an unknown policy exits non-zero
  with a one-line error naming it;
- --preset (bench/sim/sim_preset.h, the engine's flag shared with `kvrouter sim`): the virtual
  workers take the preset's cache and cost terms (Llama-3.1-8B on an H100 decodes faster than the
  default 70B on an H200; the Clock line shows its blocks, the report's command the flag); an
  unknown name, or the pair that does not fit on one GPU, exits 2 with one line, for the bench and
  for `kvrouter sim` alike; a sim started with a preset serves its max_model_len and reports its
  cache (blocks, cache_dtype "auto" for BF16) in vllm:cache_config_info;
- --size-fleet (bench/vcluster/fleet.h) on the 200-line Mooncake slice at its own rate: per policy
  the smallest passing fleet, the fleet below it failing, as fleet.json, the report's sentence and
  tables and stdout say; every fleet's level JSON; the same answer twice; --rates R sizes at R;
  virtual time only, and its other refusals, one line each, exit 2; --help says so;
- `kvrouter bench study --scenarios trace,trace-fleet --trace SLICE`: the rate table's trace row
  and the fleet table, each cell's command in STUDY.md; a trace that cannot be read is one line.

Usage: python3 tests/router/test_bench_virtual.py --kvrouter PATH/TO/kvrouter [-k NAME] [-v]
The harness is tests/harness/kvrharness.py.
"""
import glob
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402

TESTS, test = h.registry()
SCRATCH = h.Scratch("kvr_bench_virtual_test_")  # the bench's output while run() runs

AB = ["--virtual", "--ab", "round_robin,kv_aware", "--workload", "multiturn",
      "--multiturn-mode", "session", "--rates", "2", "--num-prompts", "60", "--quiet"]

# requests.jsonl fields that must not change between two runs of the same command.
HERE = os.path.dirname(os.path.abspath(__file__))
SLICE = os.path.join(HERE, "..", "bench", "loadgen", "trace_mooncake_3401_3600.jsonl")
FLEET = ["--virtual", "--workload", "trace:" + SLICE, "--preset", "llama-3.1-8b-h100",
         "--slo-ttft-ms", 10000, "--slo-tpot-ms", 100, "--quiet"]

SAME = ("label", "rate", "conversation", "turn", "warmup", "ok", "status", "target_s", "sent_s",
        "ttft_ms", "tpot_ms", "e2e_ms", "itl_count", "itl_mean_ms", "itl_max_ms", "output_tokens",
        "prompt_tokens", "cached_tokens", "worker")


def bench(*args, timeout=30):
    """Runs `kvrouter bench ARGS`; returns the CompletedProcess (text) and its real duration."""
    t0 = time.monotonic()
    p = subprocess.run([h.KVROUTER, "bench"] + [str(a) for a in args], capture_output=True,
                       text=True, timeout=timeout)
    return p, time.monotonic() - t0


def bench_ok(out, *args):
    """Runs a bench that must succeed into out; returns (stdout, report.md, levels, requests)."""
    p, dt = bench(*(list(args) + ["--out", out]))
    assert p.returncode == 0, "bench failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    assert h.sanitized() or dt < 10, "a virtual run of 120 requests took %.1f s" % dt
    for marker in h.SANITIZER_MARKERS:
        assert marker not in p.stderr, p.stderr
    report = open(os.path.join(out, "report.md")).read()
    levels = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, "results", "*.json")))]
    with open(os.path.join(out, "requests.jsonl")) as f:
        reqs = [json.loads(line) for line in f if line.strip()]
    return p.stdout, report, levels, reqs


def summary_lines(stdout):
    """The summary's lines (the report path differs between runs)."""
    return [line for line in stdout.splitlines() if not line.startswith("Report: ")]


def one_error_line(p, *needles):
    """p failed with exactly one stderr line containing every needle; returns the line."""
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@test(timeout=40)
def test_ab_report_and_determinism():
    runs = []
    for i in range(2):
        runs.append(bench_ok(os.path.join(SCRATCH.path, "ab%d" % i), *AB))
    stdout, report, levels, reqs = runs[0]
    # The report is marked and describes the cluster.
    title = report.splitlines()[0]
    assert title.startswith("# ") and title.endswith("(virtual time)"), title
    clock = [line for line in report.splitlines() if line.startswith("Clock: virtual time")]
    assert len(clock) == 1, report[:2000]
    assert "4 workers" in clock[0] and "discrete-event clock" in clock[0], clock[0]
    assert "seed 42" in clock[0], clock[0]
    # Both labels, one level each, every level virtual.
    assert len(levels) == 2, [lv.get("label") for lv in levels]
    for lv in levels:
        assert lv["kvrouter"]["virtual"] is True, lv["kvrouter"]
        assert lv["completed"] >= 60 and lv["failed"] == 0, (lv["completed"], lv["failed"])
    assert "Max SLO-compliant rate" in stdout, stdout
    # What each policy does with a multiturn session.
    by_label = {}
    for r in reqs:
        by_label.setdefault(r["label"], []).append(r)
    assert sorted(by_label) == ["phase0", "phase3"], sorted(by_label)
    rr, kv = by_label["phase0"], by_label["phase3"]
    assert all(r["ok"] for r in rr + kv), [r for r in rr + kv if not r["ok"]][:3]
    assert {r["worker"] for r in rr} == {"0", "1", "2", "3"}, {r["worker"] for r in rr}
    later = [r for r in kv if r["turn"] > 1]
    assert later and all(r["cached_tokens"] > 0 for r in later), \
        [r for r in later if r["cached_tokens"] == 0][:3]
    hit = sum(r["cached_tokens"] for r in kv) / sum(r["prompt_tokens"] for r in kv)
    hit_rr = sum(r["cached_tokens"] for r in rr) / sum(r["prompt_tokens"] for r in rr)
    assert hit > hit_rr, (hit, hit_rr)
    # Determinism end to end: the same summary and the same requests.
    stdout2, report2, levels2, reqs2 = runs[1]
    assert summary_lines(stdout) == summary_lines(stdout2), (stdout, stdout2)
    assert len(reqs) == len(reqs2), (len(reqs), len(reqs2))
    for a, b in zip(reqs, reqs2):
        for k in SAME:
            assert a[k] == b[k], (k, a, b)
    for a, b in zip(levels, levels2):
        for k in ("completed", "p99_ttft_ms", "p99_tpot_ms", "total_input_tokens"):
            assert a[k] == b[k], (k, a[k], b[k])


@test(timeout=30)
def test_oracle_in_ab():
    out = os.path.join(SCRATCH.path, "oracle")
    stdout, report, levels, reqs = bench_ok(
        out, "--virtual", "--ab", "kv_aware,oracle", "--workload", "multiturn",
        "--multiturn-mode", "session", "--rates", "2", "--num-prompts", "30", "--quiet")
    assert "| oracle |" in report, report[:1500]
    assert len(levels) == 2 and all(lv["failed"] == 0 for lv in levels), levels
    assert {r["label"] for r in reqs} == {"phase0", "phase3"}
    assert all(r["ok"] for r in reqs), [r for r in reqs if not r["ok"]][:3]


@test(timeout=40)
def test_keep_cluster_and_arrival_seed():
    """--keep-cluster: the second level finds the first level's prefixes cached (by default it
    starts on a fresh cluster); --arrival-seed: the measured sends follow vllm bench serve's
    schedule whatever --seed, the last at num_prompts / rate."""
    load = ["--virtual", "--workers", 1, "--workload", "multiturn", "--multiturn-mode", "replay",
            "--replay-order", "sample", "--replay-dataset", 5, "--rates", "0.5,0.6",
            "--num-prompts", 20, "--warmup", 0, "--quiet"]

    def cached(reqs, rate):
        return sum(r["cached_tokens"] for r in reqs if r["rate"] == rate)

    runs = {}
    for name, extra in (("fresh", []), ("kept", ["--keep-cluster"]),
                        ("arr1", ["--arrival-seed", 0, "--seed", 1]),
                        ("arr2", ["--arrival-seed", 0, "--seed", 2])):
        runs[name] = bench_ok(os.path.join(SCRATCH.path, "keep-" + name), *(load + extra))[3]
    fresh, kept = runs["fresh"], runs["kept"]
    first = [{k: r[k] for k in SAME} for r in fresh if r["rate"] == 0.5]
    assert first == [{k: r[k] for k in SAME} for r in kept if r["rate"] == 0.5]
    assert cached(kept, 0.6) > cached(fresh, 0.6), (cached(kept, 0.6), cached(fresh, 0.6))
    sends = {}
    for name in ("arr1", "arr2"):
        sends[name] = sorted(r["target_s"] for r in runs[name] if r["rate"] == 0.5)
        assert len(sends[name]) == 20 and abs(sends[name][-1] - 40.0) < 1e-6, sends[name]
    assert sends["arr1"] == sends["arr2"], sends
    assert sends["arr1"] != sorted(r["target_s"] for r in fresh if r["rate"] == 0.5)


@test(timeout=30)
def test_usage_errors():
    out = os.path.join(SCRATCH.path, "errors")
    # --worker-blocks: one value per worker.
    p, _ = bench("--virtual", "--workers", 4, "--worker-blocks", "1,2", "--rates", 2,
                 "--num-prompts", 10, "--out", out, "--quiet")
    assert p.returncode == 2, (p.returncode, p.stderr)
    one_error_line(p, "--worker-blocks", "2 values for 4 workers")
    assert not os.path.exists(os.path.join(out, "report.md"))
    # --ab needs --admin, unless --virtual.
    p, _ = bench("--ab", "kv_aware,round_robin", "--rates", 2, "--num-prompts", 10, "--out", out,
                 "--quiet")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "--ab: needs --admin" in p.stderr, p.stderr
    p, _ = bench("--virtual", "--ab", "kv_aware,round_robin", "--rates", 2, "--num-prompts", 10,
                 "--out", out, "--quiet")
    assert p.returncode == 0, (p.returncode, p.stderr)
    # A mixed fleet, one value per worker, is described in the report's Clock line.
    _, report, _, reqs = bench_ok(os.path.join(SCRATCH.path, "mixed"), "--virtual", "--workers", 4,
                                  "--worker-blocks", "4000,4000,8000,9000", "--rates", 2,
                                  "--num-prompts", 10, "--quiet")
    assert "(KV blocks 4000/4000/8000/9000)" in report, report[:2000]
    assert reqs and all(r["ok"] for r in reqs), reqs[:3]
    # An unknown policy: non-zero, one line naming it and the valid ones.
    p, _ = bench("--virtual", "--ab", "no_such_policy", "--rates", 2, "--num-prompts", 10,
                 "--out", os.path.join(SCRATCH.path, "bad"), "--quiet")
    assert p.returncode != 0, (p.returncode, p.stdout, p.stderr)
    one_error_line(p, "no_such_policy", "kv_aware", "round_robin")



@test(timeout=40)
def test_preset():
    load = ["--virtual", "--workers", 1, "--workload", "multiturn", "--multiturn-mode", "session",
            "--rates", 2, "--num-prompts", 20, "--quiet"]
    _, report, levels, reqs = bench_ok(os.path.join(SCRATCH.path, "preset-8b"),
                                       *(load + ["--preset", "llama-3.1-8b-h100"]))
    assert "(KV blocks 26674)" in report, report[:2000]  # 0.9 x 80 GB - 16.06 GB of weights
    assert "--preset llama-3.1-8b-h100" in report, report[-3000:]
    assert reqs and all(r["ok"] for r in reqs), [r for r in reqs if not r["ok"]][:3]
    _, report70, levels70, _ = bench_ok(os.path.join(SCRATCH.path, "preset-default"), *load)
    assert "(KV blocks 21770)" in report70, report70[:2000]
    # 6.1 ms of weights and 63 ns per context token against 20 ms and 55 ns: faster decode.
    tpot8, tpot70 = levels[0]["median_tpot_ms"], levels70[0]["median_tpot_ms"]
    assert tpot8 < 0.6 * tpot70, (tpot8, tpot70)
    # An explicit flag still wins over the preset, wherever it stands.
    _, report, _, _ = bench_ok(os.path.join(SCRATCH.path, "preset-blocks"),
                               *(load + ["--num-gpu-blocks", 5000, "--preset", "qwen3-32b-h100"]))
    assert "(KV blocks 5000)" in report, report[:2000]
    # Errors: one line, exit 2, no report; the same from `kvrouter sim`.
    out = os.path.join(SCRATCH.path, "preset-bad")
    names = ("llama-3.3-70b-fp8-h200", "llama-3.1-8b-h100", "qwen3-32b-h100",
             "llama-3.1-70b-a100-80gb")
    p, _ = bench(*(load + ["--preset", "llama-3.1-8b", "--out", out]))
    assert p.returncode == 2, (p.returncode, p.stderr)
    one_error_line(p, "kvrouter bench: --preset: 'llama-3.1-8b' is not one of", *names)
    p, _ = bench(*(load + ["--preset", "llama-3.1-70b-a100-80gb", "--out", out]))
    assert p.returncode == 2, (p.returncode, p.stderr)
    one_error_line(p, "--preset: llama-3.1-70b-a100-80gb: weights 141 GB > 80 GB")
    assert not os.path.exists(os.path.join(out, "report.md"))
    for args, needles in ((["--preset", "nope"], ("kvrouter sim: --preset: 'nope'",) + names),
                          (["--preset", "llama-3.1-70b-a100-80gb", "--print-costs"],
                           ("weights 141 GB > 80 GB", "tensor parallelism 1"))):
        p = subprocess.run([h.KVROUTER, "sim"] + args, capture_output=True, text=True, timeout=10)
        assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
        one_error_line(p, *needles)
    p = subprocess.run([h.KVROUTER, "sim", "--preset", "qwen3-32b-h100", "--print-costs"],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("cost model: weights_ms=26 dense_tok_us=100 step_ms=1 "
                               "per_seq_ms=0.03 decode_ctx_ns=126 attn_pair_ns=4\n"), p.stdout
    assert "kv cache: 1544 blocks x 16 tokens = 24704 tokens\n" in p.stdout, p.stdout
    # A real sim on the preset: its cache and length, its KV dtype in vLLM's cache_config_info.
    sim = h.Sim("--preset", "qwen3-32b-h100", fixed=None)
    try:
        r = sim.request("GET", "/v1/models")
        assert r.status == 200 and r.json()["data"][0]["max_model_len"] == 24704, r.body[:300]
        info = [line for line in sim.request("GET", "/metrics").text().splitlines()
                if line.startswith("vllm:cache_config_info{")]
        assert len(info) == 1 and 'cache_dtype="auto"' in info[0], info
        assert 'num_gpu_blocks="1544"' in info[0], info
    finally:
        sim.stop()



def fleet_ok(out, *args):
    """Runs a --size-fleet bench into out; returns (stdout, report.md, fleet.json, level JSONs)."""
    p, _ = bench(*(list(args) + ["--out", out]), timeout=100)
    assert p.returncode == 0, "bench failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    report = open(os.path.join(out, "report.md")).read()
    fleet = json.load(open(os.path.join(out, "fleet.json")))
    levels = {os.path.basename(f): json.load(open(f))
              for f in glob.glob(os.path.join(out, "results", "*.json"))}
    return p.stdout, report, fleet, levels


@test(timeout=300)
def test_size_fleet():
    ab = ["--ab", "round_robin,kv_aware", "--labels", "round_robin,kv_aware"]
    stdout, report, fleet, levels = fleet_ok(os.path.join(SCRATCH.path, "fleet"),
                                             *(FLEET + ab + ["--size-fleet"]))
    assert fleet["virtual"] and fleet["trace_rate"] and fleet["start"] == 4, fleet
    assert abs(fleet["rate"] - 199 / 47.156) < 0.01, fleet["rate"]  # the slice's own rate
    need = {}
    for pol in fleet["policies"]:
        tried = {lv["workers"]: lv for lv in pol["levels"]}
        passing = sorted(w for w, lv in tried.items() if lv["pass"])
        assert passing and pol["workers"] == passing[0] and pol["exact"], pol
        n = pol["workers"]
        assert n == 1 or (n - 1 in tried and not tried[n - 1]["pass"]), pol  # the answer is tight
        for w, lv in tried.items():
            assert lv["pass"] == (lv["failing"] == ""), lv
            one = levels["%s_w%d.json" % (pol["label"], w)]
            assert one["kvrouter"]["virtual"] and one["completed"] == lv["completed"], one
            assert one["kvrouter"]["engine_metrics_workers"] == w, one["kvrouter"]
        need[pol["label"]] = n
    assert need["kv_aware"] < need["round_robin"], need
    line = "kv_aware serves this traffic on %d workers where round_robin needs %d" % (
        need["kv_aware"], need["round_robin"])
    assert line in stdout.splitlines(), stdout
    assert "**%s.**" % line in report, report[:1500]
    assert report.startswith("# kvrouter fleet sizing (virtual time)\n"), report[:200]
    for label in ("round_robin", "kv_aware"):
        assert "## %s\n" % label in report, report
        assert "%s: %d workers" % (label, need[label]) in stdout, stdout
    assert "FAIL: TPOT" in report, report
    # Deterministic: the same answers and levels.
    _, _, again, _ = fleet_ok(os.path.join(SCRATCH.path, "fleet2"),
                              *(FLEET + ab + ["--size-fleet"]))
    assert again == fleet, (again, fleet)
    # A given rate: sized at it; a lighter load needs no more workers.
    _, _, light, _ = fleet_ok(os.path.join(SCRATCH.path, "fleet3"),
                              *(FLEET + ["--ab", "kv_aware", "--size-fleet", "--rates", 1,
                                         "--workers", 2]))
    assert light["rate"] == 1 and not light["trace_rate"] and light["start"] == 2, light
    assert 1 <= light["policies"][0]["workers"] <= need["kv_aware"], light


@test(timeout=30)
def test_size_fleet_refusals():
    out = os.path.join(SCRATCH.path, "fleet-bad")
    for args, needle in (
            (["--size-fleet", "--url", "http://127.0.0.1:1", "--workload", "trace:" + SLICE],
             "kvrouter bench: --size-fleet: virtual time only (add --virtual)"),
            (FLEET + ["--size-fleet", "--search"], "--size-fleet: it searches worker counts"),
            (["--virtual", "--size-fleet", "--workload", "documents"],
             "--size-fleet: give --rates R (a trace workload runs at its own rate by default)"),
            (FLEET + ["--size-fleet", "--rates", "1,2"], "--size-fleet: takes one rate"),
            (FLEET + ["--size-fleet", "--worker-blocks", "1000,1000,1000,1000"],
             "--size-fleet: a mixed fleet"),
            (FLEET + ["--size-fleet", "--workers", 8, "--size-fleet-max", 4],
             "--size-fleet-max: must be at least --workers")):
        p, _ = bench(*(args + ["--out", out]))
        assert p.returncode == 2, (args, p.returncode, p.stdout, p.stderr)
        one_error_line(p, needle)
    assert not os.path.exists(os.path.join(out, "report.md"))
    p, _ = bench("--help")
    assert p.returncode == 0, p.stderr
    help_text = " ".join(p.stdout.split())
    assert "--size-fleet" in help_text and "virtual time only" in help_text, p.stdout
    assert "--size-fleet-max" in help_text, p.stdout


@test(timeout=240)
def test_study_trace_scenarios():
    out = os.path.join(SCRATCH.path, "study")
    p = subprocess.run([h.KVROUTER, "bench", "study", "--scenarios", "trace,trace-fleet",
                        "--policies", "round_robin,kv_aware", "--seeds", "1", "--trace", SLICE,
                        "--trace-window", "880:910", "--quiet", "--out", out],
                       capture_output=True, text=True, timeout=230)
    assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr)
    study = open(os.path.join(out, "STUDY.md")).read()
    rows = [line for line in study.splitlines() if line.startswith("| trace")]
    assert len(rows) == 2 and rows[0].startswith("| trace |"), rows
    assert rows[1].startswith("| trace-fleet |"), rows
    assert "## Fleet sizing" in study and "round_robin / kv_aware" in study, study
    assert "--size-fleet" in study and "--trace-window 880:910" in study, study
    js = json.load(open(os.path.join(out, "study.json")))
    fleet = [s for s in js["scenarios"] if s.get("fleet")]
    assert len(fleet) == 1 and fleet[0]["name"] == "trace-fleet", js["scenarios"]
    got = fleet[0]["cells"][0]["workers"]
    one = json.load(open(os.path.join(out, "trace-fleet", "seed42", "fleet.json")))
    assert {q["label"]: q["workers"] for q in one["policies"]} == \
        {k: v["workers"] for k, v in got.items()}, (one, got)
    assert "%d [" % got["kv_aware"]["workers"] not in rows[1]  # one seed: no spread shown
    # A trace that cannot be read: one line, exit 2.
    p = subprocess.run([h.KVROUTER, "bench", "study", "--scenarios", "trace", "--trace",
                        os.path.join(out, "nope.jsonl"), "--out", out], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 2, (p.returncode, p.stderr)
    one_error_line(p, "--trace: cannot read", "nope.jsonl")


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0], around=SCRATCH.around))
