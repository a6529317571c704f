#!/usr/bin/env python3
"""test_lora_sim -- LoRA adapters routed to where they are loaded (issue 35), against a real
`kvrouter serve` in front of real `kvrouter sim` workers with LoRA on (`--enable-lora
--lora-modules`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`: bench/sim/README.md, LoRA adapters), the
simulated engine running (so `vllm:lora_requests_info` reports the adapters in its batch).
tests/router/test_lora.py covers the same with loopback stand-ins, plus the answers a sim does not
give on cue (a load racing the list, a stream breaking mid-answer).

Cases:
  - a listed adapter lands only on the sims listing it (round_robin and kv_aware), the router's
    /admin/workers shows the cards' parent and each sim's lora_requests_info;
  - kv_aware sends an adapter's requests to the sim whose batch runs it (a long stream another
    client holds there, straight to the sim) rather than to the sim that merely lists it;
  - a --lora-adapter no sim lists: concurrent first requests make exactly one POST
    /v1/load_lora_adapter (the sim then lists the adapter), every later request goes there; a sim
    with two data-parallel ranks (two router workers of one URL) loads it once for both;
  - load failures from the sim's own answers: files missing (404 NotFoundError), runtime updating
    off (FastAPI's 404): a 502 lora_load_failed naming the adapter and the answer.

Run: python3 tests/router/test_lora_sim.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import concurrent.futures
import json
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, Cleanup, Router, Sim, request, wait_for  # noqa: E402

TESTS, test = h.registry()

BASE = "base"
RUNTIME = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="1")


def adapter(folder, name, rank=8):
    """A PEFT adapter folder as the sim reads it (adapter_config.json with its rank)."""
    path = os.path.join(folder, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"r": rank, "lora_alpha": 16, "peft_type": "LORA"}, f)
    return path


def lora_sim(*flags, served=BASE, runtime=True):
    """A sim serving `served` with LoRA on and its engine running (fixed=None)."""
    return Sim("--served-model-name", served, "--enable-lora", "--max-loras", "2", *flags,
               fixed=None, env=RUNTIME if runtime else None)


def chat(r, model, content="Hello there, how are you?", max_tokens=4):
    body = {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}]}
    return request(r.port, "POST", "/v1/chat/completions", body, timeout=30)


def worker_ids(r):
    return {w["url"]: str(w["id"]) for w in r.workers()}


def wait_lists(r):
    wait_for(lambda: all(w["models"]["known"] for w in r.workers()), 5, "the sims' lists read")


def metric(r, name, **labels):
    return h.prom_value(h.parse_prom_samples(r.metrics_text()), name, **labels)


def listed(sim):
    return [c["id"] for c in sim.request("GET", "/v1/models").json()["data"]]


class Closing:
    """Cleanup's protocol for a client connection: kill() closes it (the sim aborts its stream)."""

    def __init__(self, conn):
        self.conn = conn

    def kill(self):
        self.conn.close()


def show(line):
    print("    " + line, flush=True)


@test(timeout=60)
def test_listed_adapter_only_on_its_sims():
    with tempfile.TemporaryDirectory() as d, Cleanup() as c:
        sql = adapter(d, "sql")
        a = c.add(lora_sim("--lora-modules", "sql-lora=" + sql))
        b = c.add(lora_sim())
        for policy in ("round_robin", "kv_aware"):
            with Cleanup() as c2:
                r = c2.add(Router([a, b], *FAST, "--policy", policy))
                one_policy(r, a, sql, policy)


def one_policy(r, a, sql, policy):
    """Six sql-lora requests through r all land on a, the only sim listing it."""
    wait_lists(r)
    ids = worker_ids(r)
    got = [chat(r, "sql-lora", "question %d" % i) for i in range(6)]
    assert [x.status for x in got] == [200] * 6, [(x.status, x.body[:200]) for x in got]
    assert {x.header("x-kvrouter-worker") for x in got} == {ids[a.url]}, policy
    assert all(x.json()["model"] == "sql-lora" for x in got)
    wa = [w for w in r.workers() if w["url"] == a.url][0]["models"]
    card = [m for m in wa["ids"] if m["id"] == "sql-lora"][0]
    assert card["parent"] == BASE and card["root"] == sql, card
    wait_for(lambda: [w for w in r.workers() if w["url"] == a.url][0]["models"]["lora"]
             ["max_lora"] == 2, 5, "lora_requests_info scraped")
    show("%s: sql-lora x6 -> worker %s only" % (policy, ids[a.url]))


@test(timeout=90)
def test_running_adapter_preferred():
    """Both sims list the adapter; another client holds a long stream of it on b, straight to the
    sim: b's lora_requests_info runs it, and kv_aware sends the adapter's requests to b."""
    with tempfile.TemporaryDirectory() as d, Cleanup() as c:
        chat_lora = adapter(d, "chat")
        a = c.add(lora_sim("--lora-modules", "chat-lora=" + chat_lora))
        b = c.add(lora_sim("--lora-modules", "chat-lora=" + chat_lora))
        r = c.add(Router([a, b], *FAST, "--policy", "kv_aware"))
        wait_lists(r)
        ids = worker_ids(r)
        conn = h.Conn(b.port, timeout=60)
        c.add(Closing(conn))
        conn.send(h.build_request("POST", "/v1/chat/completions", {
            "model": "chat-lora", "stream": True, "max_tokens": 4000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "tell a very long story"}]}))

        def running_on_b():
            w = [w for w in r.workers() if w["url"] == b.url][0]
            return "chat-lora" in (w["models"]["lora"]["running"] or [])
        wait_for(running_on_b, 10, "b's batch runs chat-lora (scraped)")
        got = [chat(r, "chat-lora", "short question %d" % i).header("x-kvrouter-worker")
               for i in range(6)]
        assert got == [ids[b.url]] * 6, got
        ex = request(r.admin_port, "POST", "/admin/route/explain",
                     {"model": "chat-lora", "messages": [{"role": "user", "content": "x"}]}).json()
        states = {str(w["id"]): w["adapter"] for w in ex["workers"]}
        assert states == {ids[a.url]: "loaded", ids[b.url]: "running"}, states
        show("chat-lora running on %s (a stream held straight to it): 6/6 requests there"
             % ids[b.url])


@test(timeout=60)
def test_runtime_adapter_one_load():
    with tempfile.TemporaryDirectory() as d, Cleanup() as c:
        dyn = adapter(d, "dyn")
        a, b = c.add(lora_sim()), c.add(lora_sim())
        r = c.add(Router([a, b], *FAST, "--policy", "kv_aware", "--lora-adapter", "dyn-lora=" + dyn))
        wait_lists(r)
        ids = worker_ids(r)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = list(pool.map(lambda i: chat(r, "dyn-lora", "first %d" % i), range(4)))
        assert [x.status for x in first] == [200] * 4, [(x.status, x.body[:200]) for x in first]
        holders = [s for s in (a, b) if "dyn-lora" in listed(s)]
        assert len(holders) == 1, [listed(s) for s in (a, b)]
        where = ids[holders[0].url]
        assert {x.header("x-kvrouter-worker") for x in first} == {where}
        later = [chat(r, "dyn-lora", "later %d" % i).header("x-kvrouter-worker") for i in range(4)]
        assert later == [where] * 4, later
        assert metric(r, "kvrouter_lora_load_attempts_total") == 1
        assert metric(r, "kvrouter_lora_loads_total", result="loaded") == 1
        show("4 concurrent + 4 later requests for dyn-lora: 1 load (sim %s lists it), all there"
             % where)


@test(timeout=60)
def test_runtime_adapter_one_load_per_server():
    """A sim with two data-parallel ranks is two router workers of one URL (dp_size=2): the
    adapter is loaded once for both, and requests on either rank need no other load."""
    with tempfile.TemporaryDirectory() as d, Cleanup() as c:
        dyn = adapter(d, "dyn")
        s = c.add(lora_sim("--data-parallel-size", "2"))
        r = c.add(Router(["%s,dp_size=2" % s.url], *FAST, "--policy", "kv_aware",
                         "--lora-adapter", "dyn-lora=" + dyn))
        wait_lists(r)
        assert len(r.workers()) == 2
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            got = list(pool.map(lambda i: chat(r, "dyn-lora", "q %d" % i, max_tokens=16),
                                range(12)))
        assert [x.status for x in got] == [200] * 12, [(x.status, x.body[:200]) for x in got]
        ranks = {x.header("x-kvrouter-worker") for x in got}
        assert metric(r, "kvrouter_lora_load_attempts_total") == 1
        assert listed(s).count("dyn-lora") == 1
        for w in r.workers():
            assert "dyn-lora" in [m["id"] for m in w["models"]["ids"]], w["models"]
        show("sim -dp 2 as 2 workers: 12 requests (workers %s), 1 load" % sorted(ranks))


@test(timeout=60)
def test_load_failures_from_the_sim():
    with tempfile.TemporaryDirectory() as d, Cleanup() as c:
        dyn = adapter(d, "dyn")
        missing = os.path.join(d, "missing")
        a = c.add(lora_sim())
        b = c.add(lora_sim(served="other", runtime=False))
        off = json.dumps({"name": "off-lora", "path": dyn, "base_model_name": "other"})
        gone = json.dumps({"name": "gone-lora", "path": missing, "base_model_name": BASE})
        r = c.add(Router([a, b], *FAST, "--lora-adapter", gone, "--lora-adapter", off))
        wait_lists(r)
        err = h.assert_openai_error(chat(r, "gone-lora"), 502)
        assert err["code"] == "lora_load_failed", err
        assert "HTTP 404" in err["message"] and \
            "No adapter found for %s" % missing in err["message"], err
        err2 = h.assert_openai_error(chat(r, "off-lora"), 502)
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in err2["message"], err2
        assert metric(r, "kvrouter_lora_loads_total", result="failed") == 2
        assert "gone-lora" not in listed(a) and "off-lora" not in listed(b)
        show("missing files: %s" % err["message"][:110])
        show("runtime updating off: %s" % err2["message"][:110])


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
