#!/usr/bin/env python3
"""Session affinity (issue 36): OpenAI's `prompt_cache_key` and a configured session header are
routing hints. A request naming a key prefers the worker the key last went to (the policy weighs it
as a worker holding the whole prompt, so load can still move the session), keys are scoped by
model, bounded in number, and counted on /metrics.

Run:  python3 tests/router/test_session.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (FAST, MODEL, Cleanup, Router, Sim, parse_prom_samples,  # noqa: E402
                        prom_value, request)

TESTS, test = h.registry()


def ask(r, text, key=None, headers=None):
    body = {"model": MODEL, "max_tokens": 2, "ignore_eos": True,
            "messages": [{"role": "user", "content": text}]}
    if key is not None:
        body["prompt_cache_key"] = key
    resp = request(r.port, "POST", "/v1/chat/completions", body, headers=headers)
    assert resp.status == 200, (resp.status, resp.body[:200])
    return resp.header("x-kvrouter-worker")


def prompts(n, tag):
    # Unrelated prompts (no shared prefix): only the key can keep them together.
    return ["%s %d: %s" % (tag, i, "lorem ipsum " * (20 + 7 * i)) for i in range(n)]


@test(timeout=40)
def test_prompt_cache_key_keeps_a_session_together():
    """Eight unrelated prompts with one prompt_cache_key land on one worker; without a key the
    same kind of prompts spread over both workers; the lookups are counted."""
    with Cleanup() as c:
        sims = [c.add(Sim(fixed=(2, 1))), c.add(Sim(fixed=(2, 1)))]
        r = c.add(Router(sims, *FAST, "--worker-header", "true"))
        keyed = {ask(r, p, key="session-42") for p in prompts(8, "keyed")}
        assert len(keyed) == 1, keyed
        free = {ask(r, p) for p in prompts(8, "free")}
        assert len(free) == 2, "prompts without a key all went to %s" % free
        m = parse_prom_samples(r.metrics_text())
        assert prom_value(m, "kvrouter_session_lookups_total", result="hit") == 7, m
        assert prom_value(m, "kvrouter_session_lookups_total", result="unknown") == 1
        assert prom_value(m, "kvrouter_session_keys") == 1


@test(timeout=40)
def test_session_header_and_model_scope():
    """--session-header names the key; two sessions are two keys; a bad prompt_cache_key type is
    a 400 in OpenAI's shape."""
    with Cleanup() as c:
        sims = [c.add(Sim(fixed=(2, 1))), c.add(Sim(fixed=(2, 1)))]
        r = c.add(Router(sims, *FAST, "--worker-header", "true", "--session-header",
                         "x-session-id"))
        a = {ask(r, p, headers=[("X-Session-Id", "alpha")]) for p in prompts(6, "a")}
        b = {ask(r, p, headers=[("X-Session-Id", "beta")]) for p in prompts(6, "b")}
        assert len(a) == 1 and len(b) == 1, (a, b)
        m = parse_prom_samples(r.metrics_text())
        assert prom_value(m, "kvrouter_session_keys") == 2
        bad = request(r.port, "POST", "/v1/chat/completions",
                      {"model": MODEL, "prompt_cache_key": 7,
                       "messages": [{"role": "user", "content": "x"}]})
        err = h.assert_openai_error(bad, 400)
        assert err["param"] == "prompt_cache_key" or "prompt_cache_key" in err["message"], err


if __name__ == "__main__":
    h.run(TESTS)
