#!/usr/bin/env python3
"""Precise mode end to end: `kvrouter serve` reading real `kvrouter sim` workers' KV events (ZMQ
over ipc:// sockets in a temporary folder, loopback only) and tokenizing prompts with their POST
/tokenize.

Checked: every worker reaches precise mode (first-contact replay of an engine with no history);
on multi-turn conversations the router's predicted cached tokens equal what the workers report
(usage.prompt_tokens_details.cached_tokens) within 2%, in both event encodings; a prefix-cache
reset on a worker empties its precise index; a restarted engine (sequence back to 0) is detected
and its index rebuilt; a stream without replay that joins late is routed approximately until the
refill period ends; a worker whose endpoint has no publisher stays approximate and is still
served; the tokenize cache answers a repeated prompt; bad endpoints are one-line errors.

    python3 tests/router/test_precise.py --kvrouter build/kvrouter [-k NAME] [-v]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import MODEL, Router, Sim, wait_for  # noqa: E402

TESTS, test = h.registry()


class Dir:
    """A temporary folder for the ipc:// sockets, removed at the end."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="kvr-precise-")

    def ep(self, name):
        return "ipc://" + os.path.join(self.path, name)

    def kill(self):  # Cleanup protocol
        shutil.rmtree(self.path, ignore_errors=True)

    def stop(self):
        self.kill()


def sim_with_events(d, name, *flags, replay=True, encoding="map"):
    cfg = {"enable_kv_cache_events": True, "endpoint": d.ep(name + ".ev")}
    if replay:
        cfg["replay_endpoint"] = d.ep(name + ".rp")
    return Sim("--time-scale", 20, "--num-gpu-blocks", 3000, "--output-len-mean", 40,
               "--kv-events-config", json.dumps(cfg), "--kv-events-encoding", encoding, *flags,
               fixed=None)


def spec(d, sim, name, replay=True):
    s = "%s,kv_events=%s" % (sim.url, d.ep(name + ".ev"))
    return s + (",kv_replay=%s" % d.ep(name + ".rp") if replay else "")


def kv_view(router):
    return {w["id"]: w["kv_events"] for w in router.workers()}


def wait_mode(router, wid, index, timeout=10):
    wait_for(lambda: (kv_view(router)[wid] or {}).get("index") == index, timeout,
             "worker %d routed on the %s index" % (wid, index))


def metric(router, name, **labels):
    return h.prom_value(h.parse_prom_samples(router.metrics_text()), name, **labels)


def chat(port, messages, max_tokens=30):
    r = h.request(port, "POST", "/v1/chat/completions",
                  {"model": MODEL, "messages": messages, "max_tokens": max_tokens}, timeout=30)
    assert r.status == 200, (r.status, r.body[:300])
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]


def conversations(port, n_conv=4, turns=3, seed=0):
    """n_conv conversations of `turns` turns each, interleaved; returns the usages."""
    hist = [[{"role": "system", "content": "You are assistant %d. " % c + "Context. " * 150}]
            for c in range(n_conv)]
    usages = []
    for t in range(turns):
        for c in range(n_conv):
            hist[c].append({"role": "user", "content": "Question %d of %d. " % (t, seed) * 20})
            text, usage = chat(port, hist[c])
            hist[c].append({"role": "assistant", "content": text})
            usages.append(usage)
    return usages


def gap(router):
    pred = metric(router, "kvrouter_worker_usage_predicted_cached_tokens_total")
    act = metric(router, "kvrouter_worker_usage_cached_tokens_total")
    return pred, act


@test(timeout=120)
def precise_predictions_match_both_encodings():
    with h.Cleanup() as c:
        d = c.add(Dir())
        s0 = c.add(sim_with_events(d, "w0", encoding="map"))
        s1 = c.add(sim_with_events(d, "w1", encoding="array"))
        # every prompt tokenized whole (the prefix store trades exactness for calls: below)
        r = c.add(Router([spec(d, s0, "w0"), spec(d, s1, "w1")], "--tokenize-prefix-coverage", 0,
                         *h.FAST))
        for wid in (0, 1):
            wait_mode(r, wid, "precise")
        usages = conversations(r.port)
        cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
        pred, act = gap(r)
        assert act == cached and act > 0, (act, cached)
        print("    predicted %d, reported %d cached tokens over %d requests" % (pred, act,
                                                                               len(usages)))
        assert abs(pred - act) <= 0.02 * act, "predicted %d vs actual %d cached tokens" % (pred,
                                                                                         act)
        assert metric(r, "kvrouter_routing_index_decisions_total", index="precise") >= len(usages)
        assert metric(r, "kvrouter_tokenize_requests_total", result="called") >= len(usages)
        for wid in (0, 1):
            kv = kv_view(r)[wid]
            assert kv["batches"] > 0 and kv["blocks"] > 0 and kv["block_size"] == 16, kv
        assert metric(r, "kvrouter_kv_events_skipped_total") == 0
        # the same prompt again is answered from the tokenize cache
        before = metric(r, "kvrouter_tokenize_requests_total", result="cached")
        chat(r.port, [{"role": "user", "content": "repeat me " * 50}])
        chat(r.port, [{"role": "user", "content": "repeat me " * 50}])
        assert metric(r, "kvrouter_tokenize_requests_total", result="cached") == before + 1


@test(timeout=120)
def precise_salted_requests_match_their_own_blocks():
    """vLLM keys a request's first block with its cache_salt and its events carry the salt in
    extra_keys: the router's token chain mixes the same salt in, so a salted prompt sent again is
    predicted cached exactly as the engine reports it, and the same prompt under another salt is
    predicted (and is) uncached (issue 35)."""
    with h.Cleanup() as c:
        d = c.add(Dir())
        s0 = c.add(sim_with_events(d, "w0", encoding="map"))
        r = c.add(Router([spec(d, s0, "w0")], "--tokenize-prefix-coverage", 0, *h.FAST))
        wait_mode(r, 0, "precise")
        msgs = [{"role": "user", "content": "Salted context. " * 120}]

        def send(salt):
            resp = h.request(r.port, "POST", "/v1/chat/completions",
                             {"model": MODEL, "messages": msgs, "max_tokens": 8,
                              "cache_salt": salt}, timeout=30)
            assert resp.status == 200, (resp.status, resp.body[:300])
            return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert send("tenant-a") == 0
        wait_for(lambda: kv_view(r)[0]["blocks"] > 0, 5, "the first answer's blocks stored")
        p0, _ = gap(r)
        again = send("tenant-a")
        p1, _ = gap(r)
        assert again > 0 and p1 - p0 == again, (again, p1 - p0)
        other = send("tenant-b")
        p2, _ = gap(r)
        assert other == 0 and p2 - p1 == 0, (other, p2 - p1)


@test(timeout=120)
def prefix_store_stands_for_the_next_turn():
    """With --tokenize-prefix-coverage, a conversation's next turn is not tokenized again when its
    earlier messages (tokenized before) hold enough of it: their ids stand for it, the turn goes
    to the worker holding the conversation, and the prediction counts only the blocks those ids
    fill (the previous answer and the new question are not in them)."""
    with h.Cleanup() as c:
        d = c.add(Dir())
        s0 = c.add(sim_with_events(d, "w0"))
        s1 = c.add(sim_with_events(d, "w1"))
        r = c.add(Router([spec(d, s0, "w0"), spec(d, s1, "w1")], "--tokenize-prefix-coverage",
                         0.6, *h.FAST))
        for wid in (0, 1):
            wait_mode(r, wid, "precise")
        usages = conversations(r.port, n_conv=4, turns=4)
        called = metric(r, "kvrouter_tokenize_requests_total", result="called")
        prefix = metric(r, "kvrouter_tokenize_requests_total", result="prefix")
        pred, act = gap(r)
        print("    %d requests: %d tokenized, %d from an earlier turn; predicted %d, reported %d "
              "cached tokens (%+.1f%%)" % (len(usages), called, prefix, pred, act,
                                          100.0 * (pred - act) / act))
        # turn 1 of each conversation is tokenized; at least the later turns whose earlier
        # messages hold 60% of the characters come from the store
        assert called >= 4 and prefix >= 4 and called + prefix == len(usages), (called, prefix)
        # the prefix ids find the conversation's blocks: most of what the engines reuse is seen
        assert 0.7 * act <= pred <= act, (pred, act)
        ex = h.request(r.admin_port, "POST", "/admin/route/explain",
                       {"model": MODEL, "messages": [{"role": "user", "content": "x " * 40}]},
                       timeout=10).json()
        assert ex["tokenized"] and ex["tokenized_prefix"] is False, ex


@test(timeout=120)
def reset_restart_and_late_join():
    with h.Cleanup() as c:
        d = c.add(Dir())
        s0 = c.add(sim_with_events(d, "w0"))
        s1 = c.add(sim_with_events(d, "w1", replay=False))
        # w1 publishes before the router exists, and has no replay: the router joins late
        chat(s1.port, [{"role": "user", "content": "early bird " * 80}])
        r = c.add(Router([spec(d, s0, "w0"), spec(d, s1, "w1", replay=False)],
                         "--kv-events-refill-ms", 1500, *h.FAST))
        wait_mode(r, 0, "precise")
        assert kv_view(r)[1]["index"] == "approximate"
        chat(s1.port, [{"role": "user", "content": "second " * 80}])  # a batch with seq > 0
        wait_for(lambda: kv_view(r)[1]["mode"] == "no_history", 5, "late join seen")
        wait_mode(r, 1, "precise", timeout=5)  # after the refill period

        # a prefix-cache reset on w0 empties its precise index (the clear rides the next step)
        chat(s0.port, [{"role": "user", "content": "fill w0 " * 120}], max_tokens=4)
        wait_for(lambda: kv_view(r)[0]["blocks"] > 0, 5, "w0 holds blocks")
        assert s0.request("POST", "/reset_prefix_cache").status == 200
        _, u = chat(s0.port, [{"role": "user", "content": "tiny"}], max_tokens=2)
        wait_for(lambda: kv_view(r)[0]["blocks"] <= (u["prompt_tokens"] + 2) // 16, 5,
                 "w0's index emptied by AllBlocksCleared")

        # the engine behind w0 restarts on the same port and sockets: sequence back to 0
        port = s0.port
        s0.stop()
        s0b = c.add(sim_with_events(d, "w0", "--listen", "127.0.0.1:%d" % port))
        # (the router's socket reconnects on its own; batches sent before that are not seen)
        def restarted():
            chat(s0b.port, [{"role": "user", "content": "after restart %f " % time.time() * 40}],
                 max_tokens=3)
            return metric(r, "kvrouter_kv_events_publisher_restarts_total", worker="0") >= 1
        wait_for(restarted, 10, "restart detected", interval=0.3)
        wait_mode(r, 0, "precise")


@test(timeout=60)
def no_publisher_stays_approximate():
    with h.Cleanup() as c:
        d = c.add(Dir())
        s0 = c.add(Sim(fixed=None))
        r = c.add(Router(["%s,kv_events=%s,kv_replay=%s" % (s0.url, d.ep("none.ev"),
                                                             d.ep("none.rp"))], *h.FAST))
        time.sleep(1.0)
        kv = kv_view(r)[0]
        assert kv["index"] == "approximate" and kv["mode"] == "waiting", kv
        text, _ = chat(r.port, [{"role": "user", "content": "hello there " * 20}], max_tokens=3)
        assert text
        assert metric(r, "kvrouter_routing_index_decisions_total", index="approximate") >= 1
        assert metric(r, "kvrouter_worker_kv_index_mode", worker="0", mode="waiting") == 1


@test(timeout=30)
def config_forms_and_errors():
    for bad, want in [("http://127.0.0.1:1,kv_events=tcp://*:5557", "want tcp://HOST:PORT"),
                      ("http://127.0.0.1:1,kv_events=tcp://h:0", "want tcp://HOST:PORT"),
                      ("http://127.0.0.1:1,kv_replay=tcp://h:5", "kv_replay needs kv_events"),
                      ("http://127.0.0.1:1,bogus=1", "unknown or repeated option")]:
        p = subprocess.run([h._kvrouter(), "serve", "--worker", bad], capture_output=True,
                           text=True, timeout=10)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and want in lines[0], (bad, p.stderr)
    with h.Cleanup() as c:
        d = c.add(Dir())
        path = os.path.join(d.path, "cfg.json")
        with open(path, "w") as f:
            json.dump({"workers": [{"url": "http://127.0.0.1:9", "kv_events": d.ep("a"),
                                    "kv_replay": d.ep("b")}, "http://127.0.0.1:10"]}, f)
        r = c.add(Router([], "--config", path, *h.FAST))
        view = kv_view(r)
        assert view[0]["endpoint"] == d.ep("a") and view[0]["replay_endpoint"] == d.ep("b"), view
        assert view[1] is None, view
        with open(path, "w") as f:
            json.dump({"workers": [{"url": "http://127.0.0.1:9", "kv_event": "x"}]}, f)
        p = subprocess.run([h._kvrouter(), "serve", "--config", path], capture_output=True,
                           text=True, timeout=10)
        assert p.returncode == 2 and 'unknown key "kv_event"' in p.stderr, p.stderr


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
