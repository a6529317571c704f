#!/usr/bin/env python3
"""test_models -- models per worker (issue 35) against a real `kvrouter serve` and two `kvrouter sim`
workers serving different models (`--model org/model-a` and `--model model-b`: the sim serves one
name; vLLM's aliases and LoRA adapters are covered by the unit tests, tests/src/core/test_router.c
and tests/src/serve/test_scrape.c).

Walk-through, one router (round_robin, so only the model filter keeps a request off the other
worker) shared by the tests in order:
  - models listed: /admin/workers shows each worker's ids as its GET /v1/models gave them; the
    router's GET /v1/models is the union, each card as its worker gave it;
  - each request lands where it may: chat, completions and streams for model-a on the model-a
    worker only, for model-b on the model-b worker only (x-kvrouter-worker), a Responses request
    naming no model on either (vLLM serves its first name), and route/explain says which workers
    are eligible;
  - an unknown model: vLLM's 404 body, byte for byte the one a worker answers, from the router (no
    worker contacted: the workers' request counters do not move, access-log outcome
    unknown_model), in the Messages API's shape on /v1/messages;
  - the `model` label in /metrics: kvrouter_http_requests_total, the TTFT, ITL and token families,
    kvrouter_model_workers and kvrouter_worker_model_info;
  - a model whose only worker is down: 503 (a known model, no usable worker), not 404; back up,
    its list is read again and its requests land on it.
The lines the walk-through shows are printed (the report of issue 35 quotes them).

Run: python3 tests/router/test_models.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import contextlib
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, Cleanup, Router, Sim, request, wait_for  # noqa: E402

TESTS, test = h.registry()

MODEL_A, MODEL_B, UNKNOWN = "org/model-a", "model-b", "model-c"
STATE = {}


def show(line):
    print("    " + line, flush=True)


@contextlib.contextmanager
def fleet():
    """Two sims (model-a, model-b) and one router in front of them, their lists read."""
    with Cleanup() as c:
        a = c.add(Sim("--model", MODEL_A))
        b = c.add(Sim("--model", MODEL_B))
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin"))
        wait_for(lambda: all(w["models"]["known"] for w in r.workers()), 5,
                 "both workers' GET /v1/models read")
        ids = {w["url"]: w["id"] for w in r.workers()}
        STATE.update(a=a, b=b, r=r, worker={MODEL_A: str(ids[a.url]), MODEL_B: str(ids[b.url])})
        yield
        STATE.clear()


def chat(model, stream=False, content="Hello there, how are you?"):
    return h.chat_body(content, max_tokens=4, stream=stream, model=model,
                       **({"stream_options": {"include_usage": True}} if stream else {}))


def worker_requests(r):
    return {w["id"]: w["requests_total"] for w in r.workers()}


def access_lines(r):
    return [ln for ln in r.stderr_lines() if re.search(r"\baccess\b", ln)]


def _without_created(card):
    out = dict(card, created=None)
    out["permission"] = [dict(p, created=None) for p in card.get("permission", [])]
    return out


@test(timeout=20)
def test_models_listed_and_union():
    r, a, b = STATE["r"], STATE["a"], STATE["b"]
    for w in r.workers():
        m = w["models"]
        assert m["known"] and m["complete"], m
        show("worker %s (%s): models %s" % (w["id"], w["url"], json.dumps(m["ids"])))
    got = {w["url"]: [x["id"] for x in w["models"]["ids"]] for w in r.workers()}
    assert got == {a.url: [MODEL_A], b.url: [MODEL_B]}, got
    union = request(r.port, "GET", "/v1/models")
    assert union.status == 200 and union.header("x-kvrouter-worker") is None, union
    doc = union.json()
    show("GET /v1/models through the router: %s" % json.dumps(doc))
    assert doc["object"] == "list" and [c["id"] for c in doc["data"]] == [MODEL_A, MODEL_B], doc
    for sim, card in ((a, doc["data"][0]), (b, doc["data"][1])):
        own = sim.request("GET", "/v1/models").json()["data"][0]
        # the card as its worker gave it, every field and their order; "created" is the time of
        # each answer (vLLM's is too), so it may have moved on since the router read it
        assert list(card) == list(own), (card, own)
        assert _without_created(card) == _without_created(own), (card, own)
        assert 0 <= own["created"] - card["created"] <= 60, (card, own)


@test(timeout=30)
def test_requests_land_on_their_model():
    r, worker = STATE["r"], STATE["worker"]
    for model in (MODEL_A, MODEL_B, MODEL_A, MODEL_B):
        landed = []
        for stream in (False, True, False):
            resp = request(r.port, "POST", "/v1/chat/completions", chat(model, stream))
            assert resp.status == 200, (model, resp.status, resp.body[:200])
            landed.append(resp.header("x-kvrouter-worker"))
        resp = request(r.port, "POST", "/v1/completions",
                       {"model": model, "prompt": "Once upon a time", "max_tokens": 3})
        assert resp.status == 200, resp.body[:200]
        landed.append(resp.header("x-kvrouter-worker"))
        assert set(landed) == {worker[model]}, (model, landed, worker)
    show("requests for %s landed on worker %s, for %s on worker %s (round_robin; 8 each: 6 chat, "
         "2 of them streamed, 2 completions)"
         % (MODEL_A, worker[MODEL_A], MODEL_B, worker[MODEL_B]))
    landed = []
    for _ in range(4):  # no model: any worker (each answers with its own first name)
        resp = request(r.port, "POST", "/v1/responses", {"input": "hi", "max_output_tokens": 3})
        assert resp.status == 200, (resp.status, resp.body[:200])
        landed.append((resp.header("x-kvrouter-worker"), resp.json()["model"]))
    assert set(landed) == {(worker[MODEL_A], MODEL_A), (worker[MODEL_B], MODEL_B)}, landed
    show("Responses requests naming no model landed on (worker, model answered): %s"
         % sorted(set(landed)))
    x = request(r.admin_port, "POST", "/admin/route/explain", chat(MODEL_B)).json()
    assert x["choice"]["worker"] == int(worker[MODEL_B]) and x["unknown_model"] is False, x
    eligible = {str(w["id"]): (w["serves_model"], w["eligible"], w["models"]) for w in x["workers"]}
    assert eligible[worker[MODEL_A]][:2] == (False, False), eligible
    assert eligible[worker[MODEL_B]][:2] == (True, True), eligible
    show("route/explain %s: choice worker %s; per worker (serves_model, eligible, models): %s"
         % (MODEL_B, x["choice"]["worker"], json.dumps(eligible)))
    x = request(r.admin_port, "POST", "/admin/route/explain", chat(UNKNOWN)).json()
    assert x["unknown_model"] is True and x["choice"] is None and x["model_label"] == "other", x


VLLM_404 = ('{"error":{"message":"The model `%s` does not exist.","type":"NotFoundError",'
            '"param":"model","code":404}}' % UNKNOWN).encode()


@test(timeout=20)
def test_unknown_model_is_vllms_404_from_the_router():
    r, a = STATE["r"], STATE["a"]
    before, lines_before = worker_requests(r), len(access_lines(r))
    cases = [
        ("/v1/chat/completions", chat(UNKNOWN), VLLM_404),
        ("/v1/chat/completions", chat(UNKNOWN, stream=True), VLLM_404),
        ("/v1/completions", {"model": UNKNOWN, "prompt": "hi", "max_tokens": 2}, VLLM_404),
        ("/v1/responses", {"model": UNKNOWN, "input": "hi"}, VLLM_404),
        ("/v1/messages", {"model": UNKNOWN, "max_tokens": 2,
                          "messages": [{"role": "user", "content": "hi"}]},
         ('{"type":"error","error":{"type":"NotFoundError","message":'
          '"The model `%s` does not exist."}}' % UNKNOWN).encode()),
    ]
    for path, body, want in cases:
        resp = request(r.port, "POST", path, body)
        assert resp.status == 404 and resp.body == want, (path, resp.status, resp.body)
        assert resp.header("content-type") == "application/json", resp.headers
        assert resp.header("x-kvrouter-worker") is None, resp.headers
    show("404 body (chat, completions, responses): %s" % VLLM_404.decode())
    show("404 body (/v1/messages): %s" % cases[-1][2].decode())
    assert worker_requests(r) == before, (worker_requests(r), before)  # no worker contacted
    # A worker answers the same bytes for a model it does not serve (kvrouter sim as vLLM).
    for path, body, want in cases:
        own = a.request("POST", path, body)
        assert own.status == 404 and own.body == want, (path, own.status, own.body)
    lines = wait_for(lambda: len(access_lines(r)) >= lines_before + len(cases) and access_lines(r),
                     2.0, "the access-log lines")
    new = lines[lines_before:lines_before + len(cases)]
    for ln in new:
        assert "status=404 worker=- model=other " in ln and "outcome=unknown_model" in ln, ln
        assert UNKNOWN not in ln, ln  # the log shows the label, never the client's name
    show("access log: %s" % new[0].split("access: ", 1)[-1])


@test(timeout=20)
def test_model_label_in_metrics():
    r, worker = STATE["r"], STATE["worker"]
    text = r.metrics_text()
    m = h.parse_prom_samples(text)
    v = lambda name, **l: h.prom_value(m, name, **l)  # noqa: E731
    for model in (MODEL_A, MODEL_B):
        w = worker[model]
        # per model: 6 chat answers (2 streamed, 4 tokens: 3 gaps each) and 2 completions
        assert v("kvrouter_http_requests_total", code="200", route="chat_completions", worker=w,
                 model=model) == 6
        assert v("kvrouter_http_requests_total", code="200", route="completions", worker=w,
                 model=model) == 2
        assert v("kvrouter_time_to_first_token_seconds_count", model=model) == 2
        assert v("kvrouter_inter_token_latency_seconds_count", model=model) == 2 * 3
        assert v("kvrouter_generation_tokens_total", model=model) > 0
        assert v("kvrouter_prompt_tokens_total", model=model) > 0
        assert v("kvrouter_model_workers", model=model) == 1
        assert v("kvrouter_worker_model_info", model=model, worker=w) == 1
    assert v("kvrouter_http_requests_total", code="404", worker="none", model="other") == 5
    assert v("kvrouter_http_requests_total", code="200", route="models", worker="none",
             model="none") >= 1
    assert v("kvrouter_http_requests_total", code="200", route="responses", model="none") == 4
    # tokens of a request naming no model count under the name its worker served it with
    assert ("none",) not in {(dict(ls).get("model"),) for (n, ls) in m
                             if n == "kvrouter_prompt_tokens_total"}
    models = {dict(ls).get("model") for (n, ls) in m if n.startswith("kvrouter_")} - {None}
    assert models <= {MODEL_A, MODEL_B, "other", "none"}, models  # bounded by what workers list
    assert UNKNOWN not in text
    for ln in text.splitlines():
        if re.match(r"kvrouter_(http_requests_total|time_to_first_token_seconds_count|"
                    r"inter_token_latency_seconds_count|prompt_tokens_total|"
                    r"generation_tokens_total|model_workers|worker_model_info)\{", ln):
            show(ln)


@test(timeout=30)
def test_down_model_is_503_then_back():
    r, a, worker = STATE["r"], STATE["a"], STATE["worker"]
    a.fault("refuse")
    wait_for(lambda: {w["id"]: w["state"] for w in r.workers()}[int(worker[MODEL_A])] == "down",
             5, "the model-a worker down")
    resp = request(r.port, "POST", "/v1/chat/completions", chat(MODEL_A))
    err = h.assert_openai_error(resp, 503)
    assert err["code"] == "no_worker_available", err
    m = h.parse_prom_samples(r.metrics_text())
    assert h.prom_value(m, "kvrouter_model_workers", model=MODEL_A) == 0
    show("%s with its worker down: %d %s" % (MODEL_A, resp.status, err["code"]))
    assert request(r.port, "POST", "/v1/chat/completions", chat(MODEL_B)).status == 200
    a.fault("none")
    def back():  # up again (its list then unknown until read) and the list read again
        w = [w for w in r.workers() if w["id"] == int(worker[MODEL_A])][0]
        return w["state"] == "up" and w["models"]["known"]
    wait_for(back, 5, "the model-a worker back up, its list read again")
    for _ in range(3):
        resp = request(r.port, "POST", "/v1/chat/completions", chat(MODEL_A))
        assert resp.status == 200 and resp.header("x-kvrouter-worker") == worker[MODEL_A], resp
    union = request(r.port, "GET", "/v1/models").json()
    assert [c["id"] for c in union["data"]] == [MODEL_A, MODEL_B], union


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__, around=fleet))
