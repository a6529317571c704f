#!/usr/bin/env python3
"""Integration tests: kvrouter in front of vLLM's defaults, through real processes.

A default vLLM sends usage in non-streamed answers and in streams that ask for it
(stream_options.include_usage), and usage.prompt_tokens_details only when started with
--enable-prompt-tokens-details. The sim follows those defaults and flags; the router takes its
actual cached tokens and token counts from the workers' scraped vLLM counters
(vllm:prefix_cache_hits_total, vllm:prompt_tokens_total, vllm:generation_tokens_total) until
their answers show the figures in usage (src/core/router.c, "Actual cached tokens and token counts").

- sim_usage_flags: without the flags, no prompt_tokens_details and no usage chunk in a stream
  that did not ask (continuous_usage_stats alone gives none either); with --enable-prompt-tokens-details the details are there (cached_tokens 0 on a
  cold cache, the cached prefix after); with --enable-force-include-usage every stream ends with
  usage.
- scrape_fills_figures: sims without the flag, streams without include_usage (4 at a time): the
  router's actual
  cached, prompt and generated tokens per worker (in /metrics and GET /admin/workers) equal the
  sims' own vLLM counters exactly, sources "scrape"; the actual cached fraction is the hits over
  the queries of the same scrapes.
- usage_without_double_count: sims with the flag, answers with usage (4 at a time), scraped every
  100 ms while they run: the sources move to "usage"; the cached, prompt and generated tokens equal the sims'
  counters and the sums of the answers' usage exactly (a scraped page waits until the requests open
  when it came have ended, and is dropped when one of them moves the source to usage: nothing
  is counted twice, nothing missed).
- worker_restart: a sim restarted on the same port starts its counters from 0: the router counts
  from the new values (a reset), no negative step, and its total is the old worker's plus the new
  one's.

Run:  python3 tests/router/test_vllm_defaults.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import concurrent.futures
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (FAST, MODEL, Cleanup, Router, Sim, parse_prom_samples,  # noqa: E402
                        prom_value, request, sse_events, wait_for)

TESTS, test = h.registry()

# The simulated engine (not the fixed-latency mode, which has no prefix cache), 20x real time.
ENGINE = ("--time-scale", "20", "--num-gpu-blocks", "4096")
DOC = " ".join("Paragraph %d of a shared document the workers keep in their prefix cache." % i
               for i in range(40))


def chat(port, content, stream, include_usage=False, max_tokens=6):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "ignore_eos": True}
    if stream:
        body["stream"] = True
        if include_usage:
            body["stream_options"] = {"include_usage": True}
    r = request(port, "POST", "/v1/chat/completions", body, timeout=30.0)
    assert r.status == 200, (r.status, r.body[:300])
    if not stream:
        return r, r.json().get("usage")
    usage = [json.loads(e)["usage"] for e in sse_events(r.body)
             if e != "[DONE]" and json.loads(e).get("usage")]
    assert len(usage) <= 1, usage
    return r, (usage[0] if usage else None)


def sim_counters(sim):
    m = sim.metrics()
    return {k: prom_value(m, "vllm:" + k) for k in
            ("prefix_cache_hits_total", "prefix_cache_queries_total", "prompt_tokens_total",
             "generation_tokens_total")}


def router_worker_figures(r, wid):
    """The router's actual figures of worker wid, from /metrics."""
    m = parse_prom_samples(r.metrics_text())
    f = {k: prom_value(m, "kvrouter_worker_actual_%s_tokens_total" % k, worker=str(wid))
         for k in ("cached", "prompt", "generation")}
    f["cached_source"] = [s for s in ("usage", "scrape") if prom_value(
        m, "kvrouter_worker_cached_tokens_source", worker=str(wid), source=s) == 1]
    f["tokens_source"] = [s for s in ("usage", "scrape") if prom_value(
        m, "kvrouter_worker_token_counts_source", worker=str(wid), source=s) == 1]
    return f


def worker_ids(r, sims):
    by_url = {w["url"]: w["id"] for w in r.workers()}
    return [by_url[s.url] for s in sims]


def wait_counters_seen(r):
    """Until the router has a page with counters of every worker (its baseline): traffic from then
    on is all counted."""
    wait_for(lambda: all(w.get("vllm_counters") is not None for w in r.workers()), 10,
             "a first scrape of every worker's counters")


def traffic(r, stream, include_usage, parallel=1):
    """Requests that share a document (prefix hits) and some that do not, `parallel` at a time
    (answers of 6 to 40 tokens, so scrapes land while requests are open)."""
    contents = []
    for i in range(6):
        contents.append((DOC + " Question %d: what does paragraph %d say?" % (i, i), 6 + 6 * i))
        contents.append(("Unrelated question number %d, answer briefly." % i, 40 - 6 * i))

    def one(c):
        return chat(r.port, c[0], stream, include_usage, max_tokens=c[1])[1]
    with concurrent.futures.ThreadPoolExecutor(parallel) as ex:
        return list(ex.map(one, contents))


@test(timeout=60)
def sim_usage_flags():
    with Cleanup() as c:
        plain = c.add(Sim(*ENGINE, fixed=None, details=False))
        full = c.add(Sim(*ENGINE, "--enable-force-include-usage", fixed=None, details=True))
        _, u = chat(plain.port, DOC, stream=False)
        assert u and "prompt_tokens_details" not in u and u["prompt_tokens"] > 0, u
        r, u = chat(plain.port, DOC, stream=True)
        assert u is None, "usage chunk in a stream that did not ask: %r" % r.body[-300:]
        _, u = chat(plain.port, DOC, stream=True, include_usage=True)
        assert u and "prompt_tokens_details" not in u, u
        # Per-chunk usage needs include_usage too (vLLM's should_include_usage()).
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "stream": True,
                "stream_options": {"continuous_usage_stats": True}}
        r = request(plain.port, "POST", "/v1/completions", body)
        assert r.status == 200 and b'"usage"' not in r.body, r.body[-300:]
        # With the flags: details on a cold cache (0), then the cached prefix; usage in every
        # stream.
        _, u = chat(full.port, DOC, stream=False)
        assert u["prompt_tokens_details"] == {"cached_tokens": 0}, u
        _, u = chat(full.port, DOC, stream=True)
        assert u is not None, "--enable-force-include-usage: no usage chunk"
        cached = u["prompt_tokens_details"]["cached_tokens"]
        assert cached == (u["prompt_tokens"] - 1) // 16 * 16, u


@test(timeout=90)
def scrape_fills_figures():
    with Cleanup() as c:
        sims = [c.add(Sim(*ENGINE, fixed=None, details=False)) for _ in range(2)]
        r = c.add(Router(sims, *FAST, "--policy", "kv_aware"))
        wait_counters_seen(r)
        usages = traffic(r, stream=True, include_usage=False, parallel=4)
        assert not any(usages), "a default vLLM stream carried usage: %r" % usages
        ids = worker_ids(r, sims)
        want = [sim_counters(s) for s in sims]
        assert sum(w["prefix_cache_hits_total"] for w in want) > 0, want

        def settled():
            figs = [router_worker_figures(r, i) for i in ids]
            ok = all(f["cached"] == w["prefix_cache_hits_total"] and
                     f["prompt"] == w["prompt_tokens_total"] and
                     f["generation"] == w["generation_tokens_total"]
                     for f, w in zip(figs, want))
            return figs if ok else None
        figs = wait_for(settled, 10, "router figures equal to the sims' counters")
        for f in figs:
            assert f["cached_source"] == ["scrape"] and f["tokens_source"] == ["scrape"], f
        m = parse_prom_samples(r.metrics_text())
        assert prom_value(m, "kvrouter_prompt_tokens_total") == \
            sum(w["prompt_tokens_total"] for w in want), "router-wide prompt tokens"
        assert prom_value(m, "kvrouter_generation_tokens_total") == \
            sum(w["generation_tokens_total"] for w in want), "router-wide generated tokens"
        by_id = {w["id"]: w for w in r.workers()}
        for wid, w in zip(ids, want):
            a = by_id[wid]
            assert a["cached_tokens"]["source"] == "scrape", a["cached_tokens"]
            assert a["cached_tokens"]["actual"] == w["prefix_cache_hits_total"], a
            assert a["token_counts"]["source"] == "scrape", a["token_counts"]
            assert a["token_counts"]["prompt"] == w["prompt_tokens_total"], a
            assert a["token_counts"]["answers_without_usage"] > 0, a
            v = a["vllm_counters"]
            assert v["prefix_cache_hits"] == w["prefix_cache_hits_total"], (v, w)
            assert v["prefix_cache_queries"] == w["prefix_cache_queries_total"], (v, w)
            # The comparison over the same scrapes: the actual share is hits over queries.
            assert a["cached_tokens"]["fraction_window"] == "scrapes", a["cached_tokens"]
            if w["prefix_cache_queries_total"]:
                share = w["prefix_cache_hits_total"] / w["prefix_cache_queries_total"]
                assert abs(a["cached_tokens"]["actual_fraction"] - share) < 1e-9, (a, w)
            assert v["window_prompt_tokens_estimate"] > 0, v
        assert sum(by_id[i]["cached_tokens"]["predicted_fraction"] for i in ids) > 0, by_id


@test(timeout=90)
def usage_without_double_count():
    with Cleanup() as c:
        sims = [c.add(Sim(*ENGINE, fixed=None, details=True)) for _ in range(2)]
        r = c.add(Router(sims, *FAST, "--policy", "kv_aware"))
        wait_counters_seen(r)
        usages = traffic(r, stream=False, include_usage=False, parallel=4)
        usages += traffic(r, stream=True, include_usage=True, parallel=4)
        assert all(u and "prompt_tokens_details" in u for u in usages), usages
        ids = worker_ids(r, sims)
        # Let a few more scrapes pass: in usage mode they must add nothing.
        scrapes = [sim_counters(s) for s in sims]
        wait_for(lambda: all(w["scraped"].get("age_ms", 1e9) < 100 for w in r.workers()), 5,
                 "a fresh scrape")
        time.sleep(0.4)
        want = [sim_counters(s) for s in sims]
        assert want == scrapes, "the sims counted more after the traffic: %r %r" % (want, scrapes)
        figs = [router_worker_figures(r, i) for i in ids]
        answers_cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
        assert answers_cached > 0, usages
        assert sum(f["cached"] for f in figs) == answers_cached, (figs, answers_cached)
        by_id = {w["id"]: w for w in r.workers()}
        assert sum(f["prompt"] for f in figs) == sum(u["prompt_tokens"] for u in usages), figs
        for wid, f, w in zip(ids, figs, want):
            assert f["cached_source"] == ["usage"] and f["tokens_source"] == ["usage"], f
            # Exactly the sims' counters: the scraped pages that came while the first answer was
            # in flight were dropped at the switch, that answer counted whole from its usage.
            assert f["cached"] == w["prefix_cache_hits_total"], (f, w)
            assert f["prompt"] == w["prompt_tokens_total"], (f, w)
            assert f["generation"] == w["generation_tokens_total"], (f, w)
            a = by_id[wid]["cached_tokens"]
            assert a["source"] == "usage" and a["fraction_window"] == "usage", a
        print("    usage mode: router prompt/generation %s, sims %s" % (
            [(f["prompt"], f["generation"]) for f in figs],
            [(w["prompt_tokens_total"], w["generation_tokens_total"]) for w in want]))


@test(timeout=90)
def worker_restart():
    with Cleanup() as c:
        first = c.add(Sim(*ENGINE, fixed=None, details=False))
        port = first.port
        r = c.add(Router([first], *FAST))
        wait_counters_seen(r)
        traffic(r, stream=True, include_usage=False)
        before = sim_counters(first)
        wid = worker_ids(r, [first])[0]
        # Every token of the first worker scraped before it goes (a page it never served is lost).
        wait_for(lambda: (lambda f: f["prompt"] == before["prompt_tokens_total"] and
                          f["generation"] == before["generation_tokens_total"] and
                          f["cached"] == before["prefix_cache_hits_total"])(
                              router_worker_figures(r, wid)), 10, "the first worker's tokens")
        assert first.stop() is None
        second = c.add(Sim(*ENGINE, "--listen", "127.0.0.1:%d" % port, fixed=None,
                           details=False, admin=False))
        # A few requests to the new worker: fewer tokens than the old one counted, so its
        # counters are below the router's last values (a reset).
        wait_for(lambda: r.workers()[0]["state"] == "up", 10, "worker up again")
        for i in range(2):
            chat(r.port, "After the restart, question %d." % i, stream=True)
        after = sim_counters(second)
        assert after["prompt_tokens_total"] < before["prompt_tokens_total"], (after, before)

        def counted():
            w = r.workers()[0]
            t = w["token_counts"]
            return w if w["vllm_counters"]["resets"] >= 1 and \
                t["prompt"] == before["prompt_tokens_total"] + after["prompt_tokens_total"] and \
                t["generation"] == before["generation_tokens_total"] + \
                after["generation_tokens_total"] else None
        try:
            w = wait_for(counted, 10, "the restarted worker's tokens added from its new values")
        except AssertionError as e:
            raise AssertionError("%s: router %r, before %r, after %r" % (
                e, r.workers()[0]["token_counts"], before, after))
        assert w["cached_tokens"]["actual"] == \
            before["prefix_cache_hits_total"] + after["prefix_cache_hits_total"], (w, after)
        m = parse_prom_samples(r.metrics_text())
        assert prom_value(m, "kvrouter_worker_vllm_resets_total", worker=str(wid)) >= 1


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
