#!/usr/bin/env python3
"""A fleet serving several models (issue 35) through `kvrouter bench --model-fleet ... --workload
mix:...`:

  - virtual time, the study's model-fleet scenario at a small size (its 16 workers, its mix, a
    few hundred requests) under round_robin, kv_aware, two reference policies and the oracle:
    every request completes on a worker serving its model (no 404), adapter requests only on
    workers listing their adapter, and the level's model_fleet figures agree; kv_aware sends
    adapter requests to a worker running the adapter more often than round robin does; two runs
    give the same requests;
  - real time, the mix through `kvrouter serve` to two `kvrouter sim` workers serving different
    models (--served-model-name): each request names its model as given and lands on the sim
    that serves it;
  - the refusals: --model-fleet without --virtual, with --size-fleet, a malformed fleet or mix.

Run:  python3 tests/bench/vcluster/test_model_fleet.py --kvrouter build/kvrouter [-k NAME]
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import Cleanup, Router, Sim  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "bench", "scripts", "lib"))
from level_json import find  # noqa: E402  (the first value of a key anywhere in a JSON tree)

TESTS, test = h.registry()
SCRATCH = h.Scratch("kvr_model_fleet_test_")

# bench/vcluster/model_fleet.h's KVR_MFLEET_STUDY and study.c's model-fleet mix
FLEET = ("6*model-a;1*model-b:b-sql+b-chat+b-code;1*model-b:b-sql+b-chat+b-math;"
         "1*model-b:b-sql+b-code+b-math;1*model-b:b-chat+b-code+b-math;"
         "2*model-b:b-sql+b-chat+b-code+b-math;4*model-a@dp")
MIX = ("mix:model-a=multiturn@0.6,model-b=documents@0.2,b-sql=hot-prefix@0.05,"
       "b-chat=multiturn@0.05,b-code=documents@0.05,b-math=control@0.05")


def fleet_workers(spec):
    """Worker index -> (base model, set of adapters), in the order the fleet lists them."""
    out = []
    for group in spec.split(";"):
        group = group[:-3] if group.endswith("@dp") else group
        n, rest = group.split("*", 1)
        model, _, adapters = rest.partition(":")
        out += [(model, set(adapters.split("+")) if adapters else set())] * int(n)
    return out


def bench(out, *args, timeout=180):
    return subprocess.run([h.KVROUTER, "bench"] + [str(a) for a in args] + ["--out", out],
                          capture_output=True, text=True, timeout=timeout)


def requests_of(out):
    with open(os.path.join(out, "requests.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def levels_of(out):
    levels = {}
    for path in glob.glob(os.path.join(out, "results", "*.json")):
        with open(path) as f:
            levels[os.path.basename(path)] = json.load(f)
    return levels


POLICIES = "round_robin,kv_aware,dynamo_kv,gie_scorer,oracle"
SMALL = ["--model-fleet", FLEET, "--max-loras", "2", "--workload", MIX, "--multiturn-mode", "session", "--rates",
         "12", "--num-prompts", "300", "--warmup-s", "20", "--min-level-s", "0", "--seed", "5",
         "--quiet"]


@test(timeout=240)
def test_virtual_every_request_on_its_models_worker():
    """The scenario at a small size: all complete, each on a worker serving its model."""
    workers = fleet_workers(FLEET)
    assert len(workers) == 16
    out = [os.path.join(SCRATCH.path, "v%d" % i) for i in range(2)]
    for o in out:
        p = bench(o, "--virtual", "--ab", POLICIES, *SMALL)
        assert p.returncode == 0, (p.stdout, p.stderr)
    reqs = requests_of(out[0])
    assert {r["label"] for r in reqs} == set(POLICIES.split(",")), reqs[:1]
    models = {}
    for r in reqs:
        assert r["ok"] and r["status"] == 200, r
        base, adapters = workers[int(r["worker"])]
        assert r["model"] == base or r["model"] in adapters, (r["model"], r["worker"], base)
        models[r["model"]] = models.get(r["model"], 0) + 1
    assert set(models) == {"model-a", "model-b", "b-sql", "b-chat", "b-code", "b-math"}, models
    # the DP ranks (workers 12-15) take model-a's requests too
    assert any(int(r["worker"]) >= 12 for r in reqs), "no request on the DP endpoint's ranks"
    levels = levels_of(out[0])
    assert len(levels) == len(POLICIES.split(",")), sorted(levels)
    for name, lv in levels.items():
        mf = find(lv, "model_fleet")
        assert mf is not None, name
        assert mf["not_served_404"] == 0, (name, mf)
        assert mf["adapter_none"] == 0, (name, mf)  # listed: at least loaded
        assert mf["adapter_requests"] > 0, (name, mf)
        assert mf["adapter_running"] + mf["adapter_loaded"] == mf["adapter_requests"], mf
    # adapter requests prefer a worker whose batch runs the adapter (the scraped
    # vllm:lora_requests_info): kv_aware more often than round robin, and most of the time
    share = {name.split("_rate")[0]: find(lv, "model_fleet")["adapter_running"] /
             find(lv, "model_fleet")["adapter_requests"] for name, lv in levels.items()}
    assert share["kv_aware"] > share["round_robin"] and share["kv_aware"] >= 0.8, share
    assert reqs == requests_of(out[1])


@test(timeout=120)
def test_real_time_sends_each_model_as_given():
    """Two sims serving model-a and model-b behind kvrouter serve: each request of the mix
    reaches the sim serving the model it names."""
    with Cleanup() as c:
        sims = [c.add(Sim("--served-model-name", m, "--time-scale", 10, fixed=None))
                for m in ("model-a", "model-b")]
        r = c.add(Router(sims, "--scrape-interval-ms", "100", "--worker-header", "true"))
        ids = {w["url"]: str(w["id"]) for w in r.workers()}
        want = {ids[sims[0].url]: "model-a", ids[sims[1].url]: "model-b"}
        out = os.path.join(SCRATCH.path, "real")
        p = bench(out, "--url", "http://127.0.0.1:%d" % r.port, "--time-scale", 10, "--workload",
                  "mix:model-a=documents@1,model-b=control@1", "--rates", "2", "--num-prompts",
                  "16", "--warmup", "0", "--seed", "3", "--quiet")
        assert p.returncode == 0, (p.stdout, p.stderr)
    reqs = requests_of(out)
    assert len(reqs) >= 16, len(reqs)
    seen = set()
    for q in reqs:
        assert q["ok"] and q["status"] == 200, q
        assert want[q["worker"]] == q["model"], (q["worker"], q["model"], want)
        seen.add(q["model"])
    assert seen == {"model-a", "model-b"}, seen


@test(timeout=30)
def test_refusals():
    """One line and exit 2 for what cannot apply."""
    out = os.path.join(SCRATCH.path, "bad")
    cases = [
        (["--url", "http://127.0.0.1:9", "--model-fleet", "1*a", "--rates", "1"],
         "--model-fleet: virtual time only"),
        (["--virtual", "--model-fleet", "2*a", "--size-fleet", "--rates", "1"],
         "--size-fleet: a model fleet (--model-fleet) has a fixed size"),
        (["--virtual", "--model-fleet", "2*a;b", "--rates", "1"],
         "--model-fleet: group 'b' is not N*MODEL"),
        (["--virtual", "--model-fleet", "1*a:b;1*b", "--rates", "1"],
         "'b' is both a base model and an adapter"),
        (["--virtual", "--workload", "mix:a=trace:x@1", "--rates", "1"],
         "kind 'trace:x' is not multiturn"),
        (["--virtual", "--max-loras", "2", "--rates", "1"],
         "--max-loras: applies to a model fleet's LoRA workers (--model-fleet)"),
    ]
    for args, want in cases:
        p = bench(out, *args, "--quiet")
        assert p.returncode == 2, (args, p.returncode, p.stdout, p.stderr)
        assert want in p.stderr, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


if __name__ == "__main__":
    sys.exit(h.run(TESTS, around=SCRATCH.around))
