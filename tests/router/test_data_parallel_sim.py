#!/usr/bin/env python3
"""test_data_parallel_sim -- data-parallel ranks as workers (issue 35) against `kvrouter sim
--data-parallel-size 2`, the simulated vLLM worker with two engines behind one API server (its
engine="R" metric labels, X-data-parallel-rank, and one KV-event publisher per rank on the
configured port + R with the rank in each batch). Exits 77 (skipped) when this kvrouter's sim has
no --data-parallel-size (a build from before 832da96); tests/router/test_data_parallel.py covers
the router side against a python3 loopback server.

Tests, each with its own sim and router:
  - precise: `--worker URL,dp_size=2,kv_events=tcp://127.0.0.1:P,kv_replay=tcp://127.0.0.1:Q`:
    both ranks' streams run (each rank's worker routed on the precise index), the conversations
    spread over both ranks, each conversation's turns stay on one rank, and the router's predicted
    cached tokens match what the engines report in usage (within 2%); per-rank figures come from
    the engine="R" series;
  - cache-blind against ranks: 12 conversations of 4 turns at once through a router that sees the
    server as one worker (vLLM picks the engine by load, not by cache) and through one that sees
    its ranks: the cached share of prompt tokens each got and the requests per engine, printed (the
    figure src/serve/README.md quotes); the ranks' share must not be lower.

Run: python3 tests/router/test_data_parallel_sim.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import json
import os
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, MODEL, Cleanup, Router, Sim, wait_for  # noqa: E402

TESTS, test = h.registry()


def show(line):
    print("    " + line, flush=True)


def free_ports(n):
    """A base port with n consecutive free ports after it (ZMQ's binds are the sim's)."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return base
    raise AssertionError("no %d consecutive free ports" % n)


def dp_sim(events, replay):
    # "*": the publisher binds (vLLM binds an endpoint with *, ::, ipc:// or inproc://, and
    # connects to any other), rank R on port + R; the router connects to 127.0.0.1.
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
           "endpoint": "tcp://*:%d" % events, "replay_endpoint": "tcp://*:%d" % replay}
    return Sim("--data-parallel-size", 2, "--api-server-count", 1, "--time-scale", 20,
               "--num-gpu-blocks", 3000, "--output-len-mean", 40,
               "--kv-events-config", json.dumps(cfg), fixed=None)


def chat(port, messages, max_tokens=30):
    r = h.request(port, "POST", "/v1/chat/completions",
                  {"model": MODEL, "messages": messages, "max_tokens": max_tokens}, timeout=30)
    assert r.status == 200, (r.status, r.body[:300])
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"], r.header("x-kvrouter-worker")


def conversation(port, c, turns, out, lock):
    hist = [{"role": "system", "content": "You are assistant %d. " % c + "Context %d. " % c * 150}]
    for t in range(turns):
        hist.append({"role": "user", "content": "Question %d of %d. " % (t, c) * 20})
        text, usage, worker = chat(port, hist)
        hist.append({"role": "assistant", "content": text})
        with lock:
            out.append((c, worker, usage))


def conversations(port, n_conv=6, turns=3, concurrent=False):
    """n_conv conversations of `turns` turns: interleaved one request at a time, or each in its
    own thread (all at once); [(conversation, worker, usage)] in completion order."""
    out, lock = [], threading.Lock()
    if not concurrent:
        hist = [[{"role": "system", "content": "You are assistant %d. " % c +
                  "Context %d. " % c * 150}] for c in range(n_conv)]
        for t in range(turns):
            for c in range(n_conv):
                hist[c].append({"role": "user", "content": "Question %d of %d. " % (t, c) * 20})
                text, usage, worker = chat(port, hist[c])
                hist[c].append({"role": "assistant", "content": text})
                out.append((c, worker, usage))
        return out
    threads = [threading.Thread(target=conversation, args=(port, c, turns, out, lock))
               for c in range(n_conv)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(out) == n_conv * turns, len(out)
    return out


def cached_share(results):
    prompt = sum(u["prompt_tokens"] for _, _, u in results)
    cached = sum(u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for _, _, u in results)
    return cached, prompt


def metric(router, name, **labels):
    return h.prom_value(h.parse_prom_samples(router.metrics_text()), name, **labels)


@test(timeout=120)
def test_precise_ranks():
    ev, rp = free_ports(2), free_ports(2)
    with Cleanup() as c:
        s = c.add(dp_sim(ev, rp))
        spec = "%s,dp_size=2,kv_events=tcp://127.0.0.1:%d,kv_replay=tcp://127.0.0.1:%d" % (
            s.url, ev, rp)
        r = c.add(Router([spec], "--tokenize-prefix-coverage", 0, *FAST))
        wait_for(lambda: all((w["kv_events"] or {}).get("index") == "precise"
                             for w in r.workers()), 15, "both ranks precise")
        ws = {str(w["id"]): w for w in r.workers()}
        results = conversations(r.port)
        rank_of = {wid: w["dp_rank"] for wid, w in ws.items()}
        by_conv = {}
        for conv, worker, _ in results:
            by_conv.setdefault(conv, set()).add(rank_of[worker])
        show("conversation -> rank(s): %s" % {k: sorted(v) for k, v in by_conv.items()})
        assert all(len(v) == 1 for v in by_conv.values()), by_conv
        assert {next(iter(v)) for v in by_conv.values()} == {0, 1}, by_conv
        pred = metric(r, "kvrouter_worker_usage_predicted_cached_tokens_total")
        act = metric(r, "kvrouter_worker_usage_cached_tokens_total")
        cached, prompt = cached_share(results)
        show("predicted %d, reported %d cached tokens of %d prompt tokens" % (pred, act, prompt))
        assert act == cached and act > 0, (act, cached)
        assert abs(pred - act) <= 0.02 * act, (pred, act)
        for w in r.workers():
            kv = w["kv_events"]
            assert kv["batches"] > 0 and kv["blocks"] > 0 and kv["rank_dropped"] == 0, kv
            assert w["engines_seen"] == 2 and w["scraped"]["fresh"], w


def engine_requests(sim):
    """Requests each engine finished, from the sim's engine="R" series."""
    out = {}
    for (name, labels), v in sim.metrics().items():
        if name == "vllm:request_success_total":
            e = dict(labels).get("engine")
            out[e] = out.get(e, 0) + v
    return [int(out.get(str(e), 0)) for e in range(2)]


@test(timeout=300)
def test_ranks_against_one_worker():
    """12 conversations of 4 turns at once on one 2-engine server, seen as one worker (vLLM's own
    balancing: the engine with the fewest waiting * 4 + running, blind to the cache) and as two
    ranks (kv_aware over the ranks): cached share of prompt tokens and requests per engine."""
    rows = []
    for label, dp in (("one worker (vLLM picks the engine)", False), ("dp_size=2 ranks", True)):
        with Cleanup() as c:
            s = c.add(Sim("--data-parallel-size", 2, "--api-server-count", 1, "--time-scale", 20,
                          "--num-gpu-blocks", 3000, "--output-len-mean", 40, "--seed", 7,
                          fixed=None))
            r = c.add(Router([s.url + (",dp_size=2" if dp else "")], *FAST))
            wait_for(lambda: all(w["scraped"]["fresh"] for w in r.workers()), 5, "scraped")
            cached, prompt = cached_share(conversations(r.port, n_conv=12, turns=4,
                                                        concurrent=True))
            rows.append((label, cached, prompt, engine_requests(s)))
    show("%-36s %13s %13s %7s  %s" % ("router sees", "cached tokens", "prompt tokens", "share",
                                      "requests per engine"))
    for label, cached, prompt, per in rows:
        show("%-36s %13d %13d %6.1f%%  %s" % (label, cached, prompt, 100.0 * cached / prompt, per))
    assert all(min(per) > 0 for _, _, _, per in rows), rows  # both engines used either way
    assert rows[1][1] >= rows[0][1], rows


def sim_has_dp():
    out = subprocess.run([h._kvrouter(), "sim", "--help"], capture_output=True, text=True)
    return "--data-parallel-size" in out.stdout + out.stderr


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--kvrouter")
    known, _ = ap.parse_known_args()
    if known.kvrouter:
        h.set_kvrouter(known.kvrouter)
        if not sim_has_dp():
            print("SKIP: this kvrouter's sim has no --data-parallel-size")
            sys.exit(77)
    sys.exit(h.run(TESTS, description=__doc__))
