#!/usr/bin/env python3
"""Hostile request bodies against a real router (issue 37, items 2, 5 and 11): the body guard
(src/proto/json_guard.c) answers before any JSON tree is built, in OpenAI's error shape, and
nothing reaches a worker or the router's index: duplicate keys (the router read the first
`messages`, vLLM the last), raw control characters and trailing data (vLLM's json.loads refuses
both), a prompt of token ids over the workers' context (400 as vLLM answers it), too many messages
or content parts (413), nesting too deep; a prompt holding U+0000 is served but routed by load and
learned from nothing (cJSON's text would stop at the NUL, which vLLM keeps). Each case is then
checked to have left the worker untouched and the index empty.

Run:  python3 tests/router/test_hostile_client.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (FAST, MODEL, Cleanup, Router, Sim, assert_openai_error,  # noqa: E402
                        parse_prom_samples, prom_value, request, wait_for)

TESTS, test = h.registry()


def post(r, body):
    return request(r.port, "POST", "/v1/" + ("chat/completions" if b'"messages"' in body
                                             else "completions"), body, timeout=20)


def index_entries(r):
    m = parse_prom_samples(r.metrics_text())
    return sum(v for (name, labels), v in m.items() if name == "kvrouter_worker_index_blocks")


CASES = [
    # (name, body bytes, status, code)
    ("duplicate messages",
     b'{"model": "%s", "messages": [{"role": "user", "content": "planted prefix"}], '
     b'"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' % MODEL.encode(),
     400, "duplicate_key"),
    ("duplicate model",
     b'{"model": "x", "model": "%s", "prompt": "hi", "max_tokens": 2}' % MODEL.encode(),
     400, "duplicate_key"),
    ("duplicate inside a message",
     b'{"model": "%s", "messages": [{"role": "user", "content": "a", "content": "b"}]}'
     % MODEL.encode(), 400, "duplicate_key"),
    ("raw control character",
     b'{"model": "%s", "prompt": "a\x01b", "max_tokens": 2}' % MODEL.encode(), 400, "invalid_json"),
    ("trailing data",
     b'{"model": "%s", "prompt": "hi", "max_tokens": 2} {"x": 1}' % MODEL.encode(), 400,
     "invalid_json"),
    ("token ids over the context",
     b'{"model": "%s", "max_tokens": 2, "prompt": [%s]}'
     % (MODEL.encode(), b",".join(b"1" for _ in range(140000))), 400, "context_length_exceeded"),
    ("too many messages",
     b'{"model": "%s", "max_tokens": 2, "messages": [%s]}'
     % (MODEL.encode(), b",".join(b'{"role":"user","content":"a"}' for _ in range(40000))),
     413, "too_many_messages"),
    ("nesting too deep",
     b'{"model": "%s", "prompt": "hi", "x": %s1%s}' % (MODEL.encode(), b"[" * 500, b"]" * 500),
     400, "nesting_too_deep"),
]


@test(timeout=60)
def test_guard_refuses_before_any_worker():
    """Every hostile body gets its status and code in OpenAI's shape; the worker sees none of them
    and the router's index learns nothing."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(2, 1)))
        r = c.add(Router([sim], *FAST))
        wait_for(lambda: r.workers()[0].get("max_model_len"), 5, "the worker's max_model_len")
        for name, body, status, code in CASES:
            resp = post(r, body)
            err = assert_openai_error(resp, status)
            assert err["code"] == code, (name, err)
            assert "\n" not in err["message"], (name, err)
        assert index_entries(r) == 0, "a refused body taught the index"
        assert all(w["in_flight"] == 0 for w in r.workers())
        sm = parse_prom_samples(h.request(sim.port, "GET", "/metrics").text())
        assert prom_value(sm, "vllm:request_success_total") in (None, 0.0), "a body reached the worker"
        # A well-formed request still works and teaches the index.
        ok = post(r, json.dumps({"model": MODEL, "max_tokens": 2,
                                 "messages": [{"role": "user", "content": "x" * 400}]}).encode())
        assert ok.status == 200, ok.body[:200]
        wait_for(lambda: index_entries(r) > 0, 5, "the good request's blocks")


@test(timeout=30)
def test_nul_prompt_served_by_load_not_learned():
    """A prompt with \\u0000 is served (vLLM accepts it) but teaches the index nothing: the
    router cannot hash what cJSON cut at the NUL."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(2, 1)))
        r = c.add(Router([sim], *FAST))
        body = json.dumps({"model": MODEL, "max_tokens": 2,
                           "messages": [{"role": "user", "content": "a" * 300 + "\u0000" + "b" * 300}]})
        assert "\\u0000" in body
        resp = post(r, body.encode())
        assert resp.status == 200, resp.body[:200]
        assert index_entries(r) == 0, "the NUL prompt's truncated text was learned"


if __name__ == "__main__":
    h.run(TESTS)
