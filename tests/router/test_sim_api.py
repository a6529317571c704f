#!/usr/bin/env python3
"""API tests of `kvrouter sim` over loopback: vLLM's SSE shape byte for byte, usage and cached
tokens across turns, POST /reset_prefix_cache, /metrics as valid Prometheus text with vLLM's names,
vLLM-style errors, aborts on client disconnect, every fault mode, fixed-latency mode, CLI errors and
clean shutdown, and the time-scale check (the same small open-loop run at scale 1 and scale 10 gives
the same latency distribution within 10% once scaled back).

    python3 tests/router/test_sim_api.py --kvrouter build/kvrouter [-k NAME] [-v]

Most tests share one sim (time scale 10, 2,048 KV blocks, natural answers of ~20 tokens); the
ones that need their own flags start their own. The harness is tests/harness/kvrharness.py.
"""

import asyncio
import contextlib
import functools
import glob
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (MODEL, Sim, astream, can_connect, connection_refused,  # noqa: E402
                        percentile, sse_event_times, sse_events, wait_for)

TESTS, test = h.registry()
_SHARED = None  # the shared sim while run() runs


@contextlib.contextmanager
def shared_sim():
    global _SHARED
    with Sim("--time-scale", 10, "--num-gpu-blocks", 2048, "--output-len-mean", 20,
             fixed=None) as sim:
        _SHARED = sim
        try:
            yield sim
        finally:
            _SHARED = None


def on_shared(timeout=30):
    """A test of the shared sim: fn(sim); the sim's fault mode is reset afterwards."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper():
            try:
                fn(_SHARED)
            finally:
                try:
                    _SHARED.fault("none")
                except Exception:  # reported by the test's own failure
                    pass
        return test(timeout)(wrapper)
    return deco


def stream_chat(sim, messages, path="/v1/chat/completions", **fields):
    """Streams a chat completion from sim; returns the Response (body, chunk arrival times)."""
    return sim.request("POST", path, dict(fields, messages=messages, stream=True), timeout=60)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


# ---- the tokenizer, as documented in bench/sim/README.md ----

def render_chat(messages):
    out = ""
    for m in messages:
        out += header(m["role"], len(out))
        out += m["content"] + "\n"
        out += " " * ((-len(out)) % 4)
    return out + header("assistant", len(out))


def header(role, at):
    h = "<|%s|>" % role
    while (at + len(h) + 1) % 4:
        h += " "
    return h + "\n"


def prompt_tokens(messages):
    return 1 + (len(render_chat(messages).encode()) + 3) // 4  # BOS + 4-byte chunks


# ---- stream shape ----

def expected_chat_stream(cid, created, engine_us, words, finish, usage):
    head = '{"id":"%s","object":"chat.completion.chunk","created":%d,"model":"%s",' % (
        cid, created, MODEL)
    out = ""
    for i, w in enumerate(words):
        delta = ('{"role":"assistant","content":%s}' if i == 0 else '{"content":%s}') % json.dumps(w)
        last = i == len(words) - 1
        tail = ('"%s","stop_reason":null' % finish) if last else "null"
        # the one key vLLM does not send: the engine's share of the TTFT, first chunk only
        extra = '"kvr_sim_engine_us":%d,' % engine_us if i == 0 else ""
        out += 'data: %s%s"choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}\n\n' % (
            head, extra, delta, tail)
    if usage is not None:
        out += 'data: %s"choices":[],"usage":%s}\n\n' % (head, json.dumps(usage, separators=(",", ":")))
    return (out + "data: [DONE]\n\n").encode()


@on_shared()
def stream_shape_and_usage(sim):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three prime numbers, please."}]
    body = {"model": MODEL, "messages": msgs, "max_tokens": 6, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    r = stream_chat(sim, **body)
    check(r.status == 200, "status %r" % r.status)
    check(r.header("content-type").startswith("text/event-stream"), r.headers)
    first = json.loads(sse_events(r.body)[0])
    # the non-streamed answer to the same prompt is the same text (seeded by the prompt)
    status, full = sim.post_json("/v1/chat/completions", dict(body, stream=False,
                                                              stream_options=None))
    check(status == 200, full)
    text = full["choices"][0]["message"]["content"]
    words = [text[i:i + 4] for i in range(0, len(text), 4)]
    check(len(words) == 6 and all(re.fullmatch("[a-z]{3} ", w) for w in words), text)
    ptoks = prompt_tokens(msgs)
    usage = {"prompt_tokens": ptoks, "total_tokens": ptoks + 6, "completion_tokens": 6,
             "prompt_tokens_details": {"cached_tokens": 0}}
    # The engine's wall-clock share of the TTFT: at least one engine step (its fixed cost alone is
    # 22 simulated ms, 2,200 real us at this sim's time scale 10) and at most the whole TTFT the
    # client saw (request written -> first event read).
    engine_us = first["kvr_sim_engine_us"]
    client_ttft_us = (sse_event_times(r)[0][0] - r.t_sent) * 1e6
    check(isinstance(engine_us, int) and 2200 <= engine_us <= client_ttft_us,
          (engine_us, client_ttft_us))
    expect = expected_chat_stream(first["id"], first["created"], engine_us, words, "length", usage)
    check(r.body == expect, "stream differs:\n%s\n---- expected ----\n%s" % (
        r.body.decode(), expect.decode()))
    check(full["usage"]["prompt_tokens"] == ptoks, full["usage"])
    check(full["choices"][0]["finish_reason"] == "length", full)
    # no usage chunk unless asked; role still rides with the first token
    r2 = stream_chat(sim, msgs, max_tokens=2, ignore_eos=True)
    datas = sse_events(r2.body)
    check(len(datas) == 3 and datas[-1] == "[DONE]", datas)
    check(json.loads(datas[0])["choices"][0]["delta"]["role"] == "assistant", datas[0])
    check("usage" not in datas[1], datas[1])


@on_shared()
def completions_endpoint(sim):
    r = sim.request("POST", "/v1/completions", {"model": MODEL, "prompt": "Once upon a time",
                                                 "max_tokens": 3, "stream": True,
                                                 "stream_options": {"include_usage": True,
                                                                    "continuous_usage_stats": True}})
    events = sse_events(r.body)
    datas = [json.loads(d) for d in events[:-1]]
    check(events[-1] == "[DONE]", events[-1])
    check([d["object"] for d in datas] == ["text_completion"] * 4, datas)
    check([d["choices"][0]["finish_reason"] for d in datas[:3]] == [None, None, "length"], datas)
    check(datas[1]["usage"]["completion_tokens"] == 2, datas[1])  # continuous usage
    check(datas[3]["usage"]["prompt_tokens"] == 1 + 4, datas[3])  # BOS + 16 bytes
    # default max_tokens of /v1/completions is 16, as in vLLM; token-id prompts are accepted
    status, full = sim.post_json("/v1/completions", {"prompt": [1, 2, 3], "ignore_eos": True})
    check(status == 200 and full["usage"]["completion_tokens"] == 16, full)
    check(full["usage"]["prompt_tokens"] == 3, full)


@on_shared()
def models_and_health(sim):
    r = sim.request("GET", "/v1/models")
    obj = r.json()
    check(r.status == 200 and obj["data"][0]["id"] == MODEL, obj)
    # the shared sim has 2048 blocks: max_model_len shrinks from 131072 to what the cache holds
    check(obj["data"][0]["max_model_len"] == 2048 * 16, obj)
    check(sim.request("GET", "/health").status == 200, "health")


@on_shared()
def followup_hits_previous_turn(sim):
    doc = ("Routing requests by prefix affinity keeps the KV cache warm across turns. " * 20)
    msgs = [{"role": "user", "content": doc}]
    status, t1 = sim.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 40,
                                                        "ignore_eos": True})
    check(status == 200, t1)
    n1 = t1["usage"]["prompt_tokens"] + t1["usage"]["completion_tokens"]
    msgs2 = msgs + [{"role": "assistant", "content": t1["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "Can you elaborate further on that?"}]
    status, t2 = sim.post_json("/v1/chat/completions", {"messages": msgs2, "max_tokens": 4})
    check(status == 200, t2)
    # every full block of turn 1's prompt + answer whose KV was computed (all but the last token)
    cached = t2["usage"]["prompt_tokens_details"]["cached_tokens"]
    check(cached == (n1 - 1) // 16 * 16, (cached, n1))
    check(t2["usage"]["prompt_tokens"] == prompt_tokens(msgs2), t2["usage"])
    # the same request again hits all but its last (partial) block
    status, t3 = sim.post_json("/v1/chat/completions", {"messages": msgs2, "max_tokens": 4})
    p = t3["usage"]["prompt_tokens"]
    check(t3["usage"]["prompt_tokens_details"]["cached_tokens"] == (p - 1) // 16 * 16, t3["usage"])
    check(t3["choices"][0]["message"]["content"] == t2["choices"][0]["message"]["content"],
          "a repeated request must produce the same answer")


@on_shared()
def reset_prefix_cache(sim):
    def cached(msgs):
        status, r = sim.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
        check(status == 200, r)
        return r["usage"]["prompt_tokens_details"]["cached_tokens"]

    msgs = [{"role": "user", "content": "Reset me, then ask again. " * 40}]
    cached(msgs)
    check(cached(msgs) > 0, "the repeated prompt hits before the reset")
    hits = sim.metric("vllm:prefix_cache_hits_total")
    queries = sim.metric("vllm:prefix_cache_queries_total")
    # vLLM's path and answer: POST, 200, empty body
    r = sim.request("POST", "/reset_prefix_cache")
    check(r.status == 200 and r.body == b"", (r.status, r.body))
    check(cached(msgs) == 0, "the same prompt misses after the reset")
    check(cached(msgs) > 0, "and is cached again afterwards")
    # cumulative counters are not reset (Prometheus counters only go up)
    check(sim.metric("vllm:prefix_cache_hits_total") > hits, "hits counter kept")
    check(sim.metric("vllm:prefix_cache_queries_total") > queries, "queries counter kept")
    # a running request's blocks keep their hashes: the same prompt still hits while it runs
    s, _ = open_stream(sim, 30000, 2)
    try:
        r = sim.request("POST", "/reset_prefix_cache")
        check(r.status == 200, r.status)
        check(cached([{"role": "user", "content": "long " * 100}]) > 0,
              "blocks of a running request survive the reset")
    finally:
        s.close()
    wait_for(lambda: sim.metric("vllm:num_requests_running") == 0, 5.0, "abort")
    r = sim.request("GET", "/reset_prefix_cache")
    check(r.status == 405 and r.header("allow") == "POST", (r.status, r.headers))
    check(r.json() == {"detail": "Method Not Allowed"}, r.body)  # FastAPI's body, as vLLM answers
    r = sim.request("POST", "/reset_prefix_cache?reset_running_requests=true")
    check(r.status == 501 and b"reset_running_requests" in r.body, (r.status, r.body))


@on_shared()
def eos_min_tokens_ignore_eos(sim):
    # this sim runs with --output-len-mean 20: natural answers are 10..30 tokens
    msgs = [{"role": "user", "content": "Tell me a story."}]
    _, a = sim.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 200})
    n = a["usage"]["completion_tokens"]
    check(10 <= n <= 30 and a["choices"][0]["finish_reason"] == "stop", a["usage"])
    _, b = sim.post_json("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 200,
                                                  "ignore_eos": True})
    check(b["usage"]["completion_tokens"] == 200 and b["choices"][0]["finish_reason"] == "length",
          b["usage"])
    _, c = sim.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 200,
                                                  "min_tokens": 150})
    check(c["usage"]["completion_tokens"] == 150, c["usage"])
    _, d = sim.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 5})
    check(d["usage"]["completion_tokens"] == 5 and d["choices"][0]["finish_reason"] == "length", d)


@on_shared()
def errors_like_vllm(sim):
    def err(status, path, body, needle):
        r = sim.request("POST", path, body)
        check(r.status == status, (r.status, r.body))
        obj = r.json()
        check(needle in obj["error"]["message"], obj)
        return obj

    err(400, "/v1/chat/completions", b"{not json", "JSON")
    err(400, "/v1/chat/completions", {"model": MODEL}, "messages")
    o = err(404, "/v1/chat/completions", {"model": "gpt-9", "messages": [{"role": "user",
                                                                        "content": "x"}]},
            "does not exist")
    check(o["error"]["type"] == "NotFoundError", o)
    err(400, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                      "max_tokens": 0}, "at least 1")
    err(400, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                      "max_tokens": 131072}, "maximum context length")
    err(400, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                      "stream_options": {"include_usage": True}}, "stream=True")
    err(400, "/v1/completions", {"prompt": {"a": 1}}, "prompt")
    r = sim.request("GET", "/v1/chat/completions")
    check(r.status == 405 and r.header("allow") == "POST", (r.status, r.headers))
    r = sim.request("GET", "/nope")
    check(r.status == 404 and r.json() == {"detail": "Not Found"}, (r.status, r.body))


PROM_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\})? '
    r'([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))$')


def parse_prometheus(text):
    """Validates the text exposition format 0.0.4 strictly; returns {family: [(name, labels, v)]}."""
    check(text.endswith("\n"), "exposition must end with a newline")
    families, types = {}, {}
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            check(typ in ("counter", "gauge", "histogram", "summary", "untyped"), line)
            check(name not in types, "duplicate TYPE " + name)
            types[name] = typ
            families[name] = []
            continue
        m = PROM_SAMPLE.match(line)
        check(m is not None, "bad sample line: %r" % line)
        name, labels = m.group(1), dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                                    m.group(3) or ""))
        fam = next((f for f in (name, re.sub(r"_(bucket|sum|count)$", "", name)) if f in types),
                   None)
        check(fam is not None, "sample without TYPE: " + line)
        if types[fam] == "counter":
            check(name == fam and name.endswith("_total"), line)
        families[fam].append((name, labels, float(m.group(4).replace("Inf", "inf"))))
    for fam, typ in types.items():
        if typ != "histogram":
            continue
        buckets = [(s[1]["le"], s[2]) for s in families[fam] if s[0] == fam + "_bucket"]
        check(buckets and buckets[-1][0] == "+Inf", fam)
        les = [float(le.replace("+Inf", "inf")) for le, _ in buckets]
        check(les == sorted(les), fam + " le order")
        counts = [c for _, c in buckets]
        check(counts == sorted(counts), fam + " buckets not cumulative")
        total = [s[2] for s in families[fam] if s[0] == fam + "_count"]
        check(total == [counts[-1]], fam + " _count != +Inf bucket")
    return families


@on_shared()
def metrics_prometheus(sim):
    before = parse_prometheus(sim.request("GET", "/metrics").text())
    status, answer = sim.post_json("/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "m" * 200}],
                                    "max_tokens": 3})
    check(status == 200 and answer["usage"]["completion_tokens"] == 3, answer)
    r = sim.request("GET", "/metrics")
    check(r.header("content-type").startswith("text/plain"), r.headers)
    fams = parse_prometheus(r.text())
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:cache_config_info", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds"]:
        check(name in fams and fams[name], "missing " + name)
    running = fams["vllm:num_requests_running"][0][1]
    check(running == {"engine": "0", "model_name": MODEL}, running)
    info = fams["vllm:cache_config_info"][0][1]
    check(info["block_size"] == "16" and info["num_gpu_blocks"] == "2048", info)
    # the counters grew by exactly this request's usage (nothing else ran on the sim meanwhile)
    for name, key in (("vllm:generation_tokens_total", "completion_tokens"),
                      ("vllm:prompt_tokens_total", "prompt_tokens")):
        grew = fams[name][0][2] - before[name][0][2]
        check(grew == answer["usage"][key], (name, grew, answer["usage"]))


def open_stream(sim, max_tokens, read_events):
    """Starts a streamed chat on a raw socket and reads read_events SSE events; returns the socket."""
    s = socket.create_connection((sim.host, sim.port), timeout=10)
    body = json.dumps({"messages": [{"role": "user", "content": "long " * 100}],
                       "max_tokens": max_tokens, "ignore_eos": True, "stream": True}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while got.count(b"data: ") < read_events:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return s, got


@on_shared()
def client_disconnect_aborts(sim):
    aborted0 = sim.metric("vllm:request_success_total", finished_reason="abort")
    socks = [open_stream(sim, 30000, 2)[0] for _ in range(3)]
    check(sim.metric("vllm:num_requests_running") == 3, "3 running")
    check(sim.metric("vllm:kv_cache_usage_perc") > 0, "blocks in use")
    for s in socks:
        s.close()
    wait_for(lambda: sim.metric("vllm:num_requests_running") == 0, 5.0, "aborts")
    check(sim.metric("vllm:kv_cache_usage_perc") == 0, "blocks freed")
    aborted = sim.metric("vllm:request_success_total", finished_reason="abort")
    check(aborted == aborted0 + 3, (aborted0, aborted))


@on_shared()
def fault_error(sim):
    check(sim.fault("error", status=503)["mode"] == "error", "set")
    st, obj = sim.post_json("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    check(st == 503 and "error" in obj, (st, obj))
    sim.fault("error", rate=0.0)
    st, obj = sim.post_json("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                     "max_tokens": 2})
    check(st == 200, (st, obj))
    r = sim.request("POST", "/sim/fault", {"mode": "explode"})
    check(r.status == 400, r.body)
    sim.fault("none")
    r = sim.request("GET", "/sim/fault")
    check(r.json()["mode"] == "none", r.body)


@on_shared()
def fault_hang(sim):
    sim.fault("hang")
    s, got = open_stream(sim, 10, 0)
    s.settimeout(0.5)
    head = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            head += chunk
    except socket.timeout:
        pass
    # http_server sends a streamed response's head with its first body bytes, so a hung stream
    # shows nothing at all (or at most the head)
    check((head == b"" or head.startswith(b"HTTP/1.1 200")) and b"data:" not in head, head)
    check(sim.metric("vllm:num_requests_running") == 1, "a hung request counts as running")
    s.close()
    wait_for(lambda: sim.metric("vllm:num_requests_running") == 0, 5.0, "hung request freed")
    sim.fault("none")


@on_shared()
def fault_disconnect(sim):
    sim.fault("disconnect", after_tokens=3)
    r = stream_chat(sim, [{"role": "user", "content": "x"}], max_tokens=20, ignore_eos=True)
    events = sse_events(r.body)
    check(not r.complete and "[DONE]" not in events, (r, events))
    check(len(events) == 3, events)
    sim.fault("none")
    wait_for(lambda: sim.metric("vllm:num_requests_running") == 0, 5.0, "engine freed")


@on_shared()
def fault_slow(sim):
    # the shared sim runs at --time-scale 10: 200 simulated ms per token = 20 ms real
    delay_ms, scale, tokens = 200, 10, 6
    msgs = [{"role": "user", "content": "x"}]
    sim.fault("slow", delay_ms=delay_ms)
    slow = stream_chat(sim, msgs, max_tokens=tokens, ignore_eos=True)
    sim.fault("none")

    # Every engine step (the prefill that makes token 1, then one decode per token) lasts at least
    # the delay, and the first starts after the request arrived, so token 6 comes no sooner than
    # 6 delays after the send: a floor, never a race, since the sim's timers never fire early. A
    # stall only adds. Counted from the send, not from token 1: the sim keeps an absolute schedule,
    # so tokens after a late first one catch up. Without the delay the 6 tokens take ~13 ms.
    times = sse_event_times(slow)
    span = times[tokens - 1][0] - slow.t_sent
    check(span >= tokens * delay_ms / scale / 1000.0, "token %d %.1f ms after the send" % (
        tokens, span * 1000))


@on_shared()
def fault_refuse(sim):
    sim.fault("refuse", duration_ms=300)
    check(connection_refused(sim.port), "connection should be refused")
    wait_for(lambda: can_connect(sim.port), 3, "listening again")
    r = sim.request("GET", "/sim/fault")
    check(r.json()["mode"] == "none" and r.json()["listening"], r.body)


@test(timeout=20)
def fault_refuse_admin_port():
    with Sim(fixed=None) as sim:
        check(sim.admin_port != sim.port, (sim.admin_port, sim.port))
        sim.fault("refuse")  # no duration: refuses until reset through the admin listener
        wait_for(lambda: connection_refused(sim.port), 2, "refusing")
        check(can_connect(sim.admin_port), "the admin listener refuses too")
        sim.fault("none")  # through the admin listener
        wait_for(lambda: can_connect(sim.port), 2, "listening again")


@test(timeout=20)
def tokenize():
    """POST /tokenize as vLLM serves it: the ids a completion with the same prompt is served with
    (count = usage.prompt_tokens), chat with or without the generation prompt, text with or without
    BOS, max_model_len, and vLLM's errors."""
    with Sim("--max-model-len", 4096, fixed=None) as sim:
        msgs = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name three rivers of Europe, please."}]
        st, tok = sim.post_json("/tokenize", {"model": MODEL, "messages": msgs})
        check(st == 200, (st, tok))
        check(set(tok) == {"count", "max_model_len", "tokens", "token_strs"}, tok)
        check(tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 4096, tok)
        check(tok["tokens"][0] == 128000 and tok["token_strs"] is None, tok)
        st, done = sim.post_json("/v1/chat/completions", {"model": MODEL, "messages": msgs,
                                                          "max_tokens": 2})
        check(st == 200 and done["usage"]["prompt_tokens"] == tok["count"], (done, tok["count"]))
        st, nogen = sim.post_json("/tokenize", {"messages": msgs, "add_generation_prompt": False})
        check(st == 200 and nogen["tokens"] == tok["tokens"][:nogen["count"]], nogen)
        check(nogen["count"] < tok["count"], (nogen["count"], tok["count"]))
        st, text = sim.post_json("/tokenize", {"prompt": "Once upon a time"})
        check(st == 200 and text["tokens"][0] == 128000, text)
        st, done = sim.post_json("/v1/completions", {"model": MODEL, "prompt": "Once upon a time",
                                                     "max_tokens": 1})
        check(done["usage"]["prompt_tokens"] == text["count"], (done, text))
        st, raw = sim.post_json("/tokenize", {"prompt": "Once upon a time",
                                              "add_special_tokens": False})
        check(st == 200 and raw["tokens"] == text["tokens"][1:], raw)
        for body, want in [({"model": "other", "prompt": "x"}, 404), ({"messages": []}, 400),
                           ({"prompt": "x", "add_special_tokens": "no"}, 400), ({}, 400)]:
            st, err = sim.post_json("/tokenize", body)
            check(st == want and isinstance(err, dict) and "error" in err, (body, st, err))
        r = sim.request("POST", "/tokenize", b"{not json")
        check(r.status == 400, r.status)


def fixed_latency_medians(sim, n=5):
    """Median real TTFT and mean ITL (s) over n streams of 11 tokens, after one warm-up stream
    (the first request to a fresh sim also pays for its first connection and page faults)."""
    ttfts, itls = [], []
    for i in range(n + 1):
        r = stream_chat(sim, [{"role": "user", "content": "x"}], max_tokens=11, ignore_eos=True)
        times = [t for t, d in sse_event_times(r) if d != "[DONE]"]
        check(len(times) == 11, times)
        if i > 0:
            ttfts.append(times[0] - r.t_sent)
            itls.append((times[-1] - times[0]) / 10)
    return percentile(ttfts, 50), percentile(itls, 50), ttfts, itls


@test(timeout=30)
def fixed_latency():
    # The configured figures, exact to the timer's ~1 ms: medians of 5 streams, so one stream a
    # loaded machine stalls cannot decide it. +-15 ms on TTFT and +-2 ms on ITL still fail a wrong
    # figure (TTFT off by 50 ms, ITL by 10% or more) and a time-scale error (10x off).
    with Sim(fixed=(150, 20)) as sim:
        ttft, itl, ttfts, itls = fixed_latency_medians(sim)
        check(abs(ttft - 0.150) < 0.015, "ttft median %.4f of %r" % (ttft, ttfts))
        check(abs(itl - 0.020) < 0.002, "itl median %.4f of %r" % (itl, itls))
    # At scale 10, 1000 and 200 simulated ms are 100 and 20 real ms.
    with Sim("--time-scale", 10, fixed=(1000, 200)) as sim:
        ttft, itl, ttfts, itls = fixed_latency_medians(sim)
        check(abs(ttft - 0.100) < 0.015, "scaled ttft median %.4f of %r" % (ttft, ttfts))
        check(abs(itl - 0.020) < 0.002, "scaled itl median %.4f of %r" % (itl, itls))


@test(timeout=30)
def cli_errors_and_shutdown():
    for args, needle in [(["--bogus"], "--bogus"), (["--time-scale", "0"], "--time-scale"),
                         (["--num-gpu-blocks", "x"], "--num-gpu-blocks"),
                         (["--block-size", "0"], "--block-size"),
                         (["--fixed-ttft-ms", "5"], "--fixed-itl-ms"),
                         (["--fault", "melt"], "--fault")]:
        p = subprocess.run([h.KVROUTER, "sim"] + args, capture_output=True, text=True, timeout=10)
        check(p.returncode != 0, args)
        lines = p.stderr.strip().splitlines()
        check(len(lines) == 1 and needle in lines[0], (args, p.stderr))
    p = subprocess.run([h.KVROUTER, "sim", "--help"], capture_output=True, text=True, timeout=10)
    check(p.returncode == 0 and "--cost-weights-ms" in p.stdout, p.stdout)
    sim = Sim(fixed=None)
    try:
        s, _ = open_stream(sim, 100000, 1)  # a stream in flight does not block shutdown
        problem = sim.stop()
        check(problem is None, "sim shutdown with a stream in flight: %s" % problem)
        s.close()
    finally:
        sim.kill()


@test(timeout=60)
def bench_reset_cache_and_preemptions():
    """`kvrouter bench --reset-cache` against one worker resets it through URL/reset_prefix_cache,
    and the level JSON carries the worker's preemptions over the level and its KV peak. The load
    preempts: 16 concurrent requests of ~60 prompt and 200 output tokens each need ~16 x 17 KV
    blocks and the sim has 100, so running requests run out of blocks while decoding."""
    with tempfile.TemporaryDirectory() as out, \
            Sim("--time-scale", 10, "--num-gpu-blocks", 100, fixed=None) as sim:
        conv = os.path.join(out, "conversations.jsonl")
        with open(conv, "w") as f:
            for i in range(16):
                f.write(json.dumps({"prefix": "conversation %d is about topic %d. " % (i, 7 * i) * 4,
                                    "turns": [{"user": "Go on, number %d." % i,
                                               "max_tokens": 200}]}) + "\n")
        argv = [h.KVROUTER, "bench", "--url", sim.url, "--reset-cache", "--workload",
                "file:" + conv, "--rates", "50", "--num-prompts", "16", "--warmup", "0",
                "--time-scale", "10", "--output-mean", "200", "--output-std", "0",
                "--output-min", "200", "--output-max", "200", "--cooldown-s", "0",
                "--out", os.path.join(out, "bench")]
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=40)
        check(p.returncode == 0, p.stderr[-2000:])
        want = "prefix cache reset: worker reset (POST %s/reset_prefix_cache: HTTP 200)" % sim.url
        check(want in p.stderr, p.stderr[-2000:])
        files = glob.glob(os.path.join(out, "bench", "results", "*.json"))
        check(len(files) == 1, files)
        with open(files[0]) as f:
            level = json.load(f)
        k = level["kvrouter"]
        check(level["completed"] == 16 and level["failed"] == 0, (level["completed"],
                                                                 level["failed"]))
        check(k["prefix_cache_reset"].startswith("worker reset"), k["prefix_cache_reset"])
        check(k["engine_metrics_workers"] == 1, k)
        # the sim was fresh and there was no warm-up: every preemption it counted happened during
        # the one level, and there were some
        sim_preemptions = sim.metric("vllm:num_preemptions_total")
        check(sim_preemptions > 0, "the load did not preempt: %r" % sim_preemptions)
        check(k["preemptions"] == sim_preemptions, (k["preemptions"], sim_preemptions))
        # preemption needs a full cache; the monitor samples /metrics, so it may miss the very top
        check(0.5 < k["kv_cache_usage_peak"] <= 1, k["kv_cache_usage_peak"])
        with open(os.path.join(out, "bench", "report.md")) as f:
            md = f.read()
        check("| Prefix Cache Reset | before each run: POST /reset_prefix_cache" in md, md[:3000])
        # the report's table of the figure: "## Results ... Preemptions (KV cache full)", then
        # "| Rate | bench |", the rule and one row per level
        section = md.split("Preemptions (KV cache full)\n", 1)[1].split("\n## ", 1)[0]
        rows = [ln for ln in section.splitlines() if re.match(r"\| [0-9.]+ \|", ln)]
        check(rows == ["| 50.00 | %d |" % sim_preemptions], (rows, sim_preemptions))


def run_open_loop(sim, scale, n=12, gap_ms=400.0, out=30):
    """Sends n streamed requests at fixed simulated offsets from one asyncio loop; returns
    per-request TTFT and TPOT and all ITLs, measured on the client's clock and multiplied by scale
    (simulated seconds)."""
    # cold ~3,800-token prompts: TTFTs of ~250 simulated ms, well above the jitter of millisecond
    # timers and of the client (each ~0.5 ms real, i.e. ~5 simulated ms at scale 10)
    docs = [("doc%d word " % i) * 1400 for i in range(n)]

    async def run():
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05

        async def one(i):
            await asyncio.sleep(max(0.0, start + i * gap_ms / 1000 / scale - loop.time()))
            return await astream(sim.port, "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": docs[i]}],
                                  "max_tokens": out, "ignore_eos": True, "stream": True})
        return await asyncio.gather(*(one(i) for i in range(n)))

    ttft, tpot, itl = [], [], []
    for r in asyncio.run(run()):
        times = r["times"]
        check(len(times) == out, "short stream")
        ttft.append((times[0] - r["t0"]) * scale)
        tpot.append((times[-1] - times[0]) / (len(times) - 1) * scale)
        itl += [(b - a) * scale for a, b in zip(times, times[1:])]
    return ttft, tpot, itl


def time_scale_figures():
    """Runs the open-loop check at time scales 1 and 10; returns {scale: {figure: seconds}}."""
    figures = {}
    for scale in (1, 10):
        with Sim("--time-scale", scale, fixed=None) as sim:
            ttft, tpot, itl = run_open_loop(sim, scale)
            figures[scale] = {"ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
                              "ttft_mean": sum(ttft) / len(ttft),
                              "tpot_p50": percentile(tpot, 50), "tpot_p90": percentile(tpot, 90),
                              "itl_p50": percentile(itl, 50), "itl_p90": percentile(itl, 90),
                              "itl_mean": sum(itl) / len(itl), "e2e_mean": sum(
                                  a + b * 29 for a, b in zip(ttft, tpot)) / len(ttft)}
    print("    time-scale check (simulated ms; 12 streams 400 ms apart, cold 3.8k-token prompts, "
          "30 tokens):")
    for k in figures[1]:
        a, b = figures[1][k] * 1e3, figures[10][k] * 1e3
        print("      %-9s scale1 %7.1f  scale10 %7.1f  diff %+5.1f%%" % (k, a, b, 100 * (b - a) / a))
    return figures


def time_scale_mismatches(figures):
    """The figures that differ by 10% or more between the two scales. Individual token gaps are
    ~2.3 ms of real time at scale 10, so the OS's wake-up jitter (~0.2 ms) moves single ITLs by
    ~10%: itl_p90 is printed, not compared."""
    out = []
    for k in figures[1]:
        a, b = figures[1][k], figures[10][k]
        if k != "itl_p90" and abs(b - a) / a >= 0.10:
            out.append("%s differs by more than 10%%: %.4f vs %.4f" % (k, a, b))
    return out


@test(timeout=120)
def time_scale_matches():
    # Every real-time stall of the sim or the client during the scale-10 run counts ten times in
    # simulated time: one 10 ms stall of a shared CI machine moved ttft_p90 (the second-slowest of
    # 12 requests) by 10.8%. A failed comparison is run once more and the test fails only if both
    # fail: a wrong time scale (a factor, a rounded timer) fails every run, a stall does not repeat.
    misses = time_scale_mismatches(time_scale_figures())
    if misses:
        print("    first comparison missed (%s); running it once more" % "; ".join(misses))
        misses = time_scale_mismatches(time_scale_figures())
    check(not misses, "; ".join(misses))

if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0], around=shared_sim))
