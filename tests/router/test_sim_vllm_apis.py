#!/usr/bin/env python3
"""API tests of `kvrouter sim` beyond chat and completions, over loopback with raw HTTP (issue
36): the Responses API (non-streamed and streamed shapes, the event order and sequence numbers,
errors in vLLM's words, the VLLM_ENABLE_RESPONSES_API_STORE switch, previous_response_id chains of
3 turns, GET and cancel, background runs), the Anthropic Messages API (reply, stream events, usage
with and without prompt tokens details, errors in both of vLLM's shapes, count_tokens), one
conversation giving the same prompt and cache hits through all three APIs, chat continuation
(continue_final_message: the continued answer is the rest of the uncut one) and echo, and
cache_salt (cached tokens with and without a matching salt).

    python3 tests/router/test_sim_vllm_apis.py --kvrouter build/kvrouter [-k NAME] [-v]

Two sims are shared: STORE runs with VLLM_ENABLE_RESPONSES_API_STORE=1 and
--enable-prompt-tokens-details, PLAIN with vLLM's defaults (no store, no details). Both run the
simulated engine at time scale 10 with natural answers of ~12 tokens, and no re-tokenization
drift (so a resent answer hits every block it filled). The harness is
tests/harness/kvrharness.py.
"""

import contextlib
import functools
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import MODEL, Sim, wait_for  # noqa: E402

TESTS, test = h.registry()
SIMS = {}
STORE_ENV = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
FLAGS = ("--time-scale", 10, "--num-gpu-blocks", 2048, "--output-len-mean", 12, "--retok-drift", 0)
RESP_ID = re.compile(r"resp_[0-9a-f]{16}$")
MSG_ID = re.compile(r"msg_[0-9a-f]{16}$")
# ResponsesResponse's fields, in order (vllm/entrypoints/openai/responses/protocol.py)
RESPONSE_KEYS = ["id", "created_at", "incomplete_details", "instructions", "metadata", "model",
                 "object", "output", "parallel_tool_calls", "temperature", "tool_choice", "tools",
                 "top_p", "background", "max_output_tokens", "max_tool_calls",
                 "previous_response_id", "prompt", "reasoning", "service_tier", "status", "text",
                 "top_logprobs", "truncation", "usage", "user", "input_messages",
                 "output_messages"]
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added"]
TEXT_END = ["response.output_text.done", "response.content_part.done",
            "response.output_item.done", "response.completed"]


@contextlib.contextmanager
def shared_sims():
    env_store = dict(STORE_ENV)
    with Sim(*FLAGS, fixed=None, env=env_store) as store, \
            Sim(*FLAGS, fixed=None, details=False,
                env={"VLLM_ENABLE_RESPONSES_API_STORE": "0"}) as plain:
        SIMS["store"], SIMS["plain"] = store, plain
        try:
            yield
        finally:
            SIMS.clear()


def on_sims(timeout=30):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper():
            fn(SIMS["store"], SIMS["plain"])
        return test(timeout)(wrapper)
    return deco


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def post(sim, path, body, headers=None):
    """POST body to sim; returns (status, parsed JSON or None, Response)."""
    r = sim.request("POST", path, body, headers=headers, timeout=30)
    try:
        return r.status, r.json(), r
    except ValueError:
        return r.status, None, r


def get(sim, path):
    r = sim.request("GET", path, timeout=30)
    return r.status, r.json()


def events(resp):
    """[(event name, parsed data)] of an SSE body of `event:` / `data:` blocks."""
    out = []
    for block in resp.text().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        check(len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "),
              "not an event block: %r" % block)
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def chat(sim, messages, **fields):
    st, c, r = post(sim, "/v1/chat/completions", dict(fields, model=MODEL, messages=messages))
    check(st == 200, (st, r.body[:300]))
    return c


def answer_text(obj):
    """The text of a Responses object's output message."""
    items = [i for i in obj["output"] if i["type"] == "message"]
    check(len(items) == 1, obj["output"])
    return "".join(p["text"] for p in items[0]["content"])


def vllm_error(r, status, etype, param):
    """r's body is vLLM's OpenAI-shaped error {"error":{message,type,param,code}}."""
    check(r.status == status, (r.status, r.body[:400]))
    obj = r.json()
    check(set(obj) == {"error"} and set(obj["error"]) == {"message", "type", "param", "code"},
          obj)
    e = obj["error"]
    check(e["type"] == etype and e["param"] == param and e["code"] == status, e)
    return e["message"]


# ---- the Responses API ----------------------------------------------------------------------


@on_sims()
def responses_nonstreamed(store, plain):
    """The response object: ResponsesResponse's fields in order, ids as vLLM makes them, the
    prompt as chat renders instructions + input (same prompt, same answer), usage with cached
    tokens even without --enable-prompt-tokens-details, request_id as the id, prompt_cache_key
    accepted and ignored."""
    body = {"model": MODEL, "input": "Name one river of Europe.", "instructions": "Be brief.",
            "prompt_cache_key": "anything", "max_output_tokens": 40}
    st, o, r = post(plain, "/v1/responses", body)
    check(st == 200 and r.header("content-type").startswith("application/json"), (st, r.body))
    check(list(o) == RESPONSE_KEYS, list(o))
    check(RESP_ID.match(o["id"]) and o["object"] == "response" and o["model"] == MODEL, o)
    check(o["status"] == "completed" and o["incomplete_details"] is None, o)
    check(o["instructions"] == "Be brief." and o["background"] is False, o)
    item = o["output"][0]
    check(MSG_ID.match(item["id"]) and item["role"] == "assistant" and
          item["status"] == "completed" and item["type"] == "message", item)
    check(item["content"][0]["type"] == "output_text" and
          item["content"][0]["annotations"] == [], item)
    u = o["usage"]
    check(set(u) == {"input_tokens", "input_tokens_details", "output_tokens",
                     "output_tokens_details", "total_tokens"}, u)
    check(u["input_tokens_details"]["cached_tokens"] == 0, u)  # filled without details
    check(u["total_tokens"] == u["input_tokens"] + u["output_tokens"], u)
    c = chat(plain, [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Name one river of Europe."}], max_tokens=40)
    check(c["usage"]["prompt_tokens"] == u["input_tokens"], (c["usage"], u))
    check("prompt_tokens_details" not in c["usage"], c["usage"])  # plain: vLLM's default
    check(c["choices"][0]["message"]["content"] == answer_text(o), (c, o))
    check(o["max_output_tokens"] == 40, o)
    # the same again: every full block of the prompt was cached
    st, o2, _ = post(plain, "/v1/responses", body)
    check(o2["usage"]["input_tokens_details"]["cached_tokens"] > 0, o2["usage"])
    check(o2["id"] != o["id"], (o["id"], o2["id"]))
    # request_id (vLLM's extra) becomes the id; max_output_tokens stops it: incomplete
    st, o3, _ = post(plain, "/v1/responses", {"input": "x", "request_id": "resp_mine",
                                              "max_output_tokens": 2, "ignore_eos": True})
    check(st == 200 and o3["id"] == "resp_mine", o3)
    check(o3["status"] == "incomplete" and
          o3["incomplete_details"] == {"reason": "max_output_tokens"}, o3)
    check(o3["usage"]["output_tokens"] == 2 and len(answer_text(o3)) == 8, o3)


@on_sims()
def responses_streamed(store, plain):
    """The stream: event: <type> / data: <json> blocks in section 1's order, sequence numbers from
    0, no [DONE], usage only in response.completed; its text is the non-streamed answer."""
    body = {"input": "Tell me about the great rivers of Europe, streamed please.",
            "max_output_tokens": 6, "ignore_eos": True}
    st, full, _ = post(plain, "/v1/responses", body)
    r = plain.request("POST", "/v1/responses", dict(body, stream=True), timeout=30)
    check(r.status == 200 and r.header("content-type").startswith("text/event-stream"),
          (r.status, r.headers))
    check(b"[DONE]" not in r.body, r.body[-200:])
    evs = events(r)
    names = [n for n, _ in evs]
    check(names == TEXT_EVENTS + ["response.output_text.delta"] * 6 + TEXT_END, names)
    for i, (n, d) in enumerate(evs):
        check(d["type"] == n and d["sequence_number"] == i, (i, n, d))
    created, done = evs[0][1]["response"], evs[-1][1]["response"]
    check(created["status"] == "in_progress" and created["usage"] is None and
          created["output"] == [], created)
    check(list(done) == RESPONSE_KEYS and done["id"] == created["id"], done)
    check(done["status"] == "incomplete" and done["usage"]["output_tokens"] == 6, done)
    check(done["usage"]["input_tokens_details"]["cached_tokens"] > 0, done["usage"])
    for n, d in evs[:-1]:
        check("usage" not in json.dumps(d) or d.get("response", {}).get("usage") is None, (n, d))
    deltas = "".join(d["delta"] for n, d in evs if n == "response.output_text.delta")
    item_id = evs[2][1]["item"]["id"]
    check(all(d.get("item_id", item_id) == item_id for _, d in evs[3:-1]), evs)
    check(evs[2][1]["item"]["status"] == "in_progress" and evs[2][1]["item"]["content"] == [], evs)
    check(evs[3][1]["part"] == {"annotations": [], "text": "", "type": "output_text",
                                "logprobs": []}, evs[3])
    check(evs[-4][1]["text"] == deltas and evs[-3][1]["part"]["text"] == deltas, evs[-4:])
    check(deltas == answer_text(full) == answer_text(done), (deltas, full))


@on_sims()
def responses_errors(store, plain):
    """Errors in vLLM's shape and words: what pydantic refuses (400 "Bad Request"), an unknown
    model, background without the store, an unknown previous_response_id (exactly section 1's
    body), GET and cancel of an unknown id, another Content-Type; with the store off, store:true is
    silently false and every previous_response_id is unknown."""
    r = plain.request("POST", "/v1/responses", {"input": "x", "prompt": {"id": "pmpt_1"}})
    check("prompt template is not supported" in vllm_error(r, 400, "Bad Request", "prompt"), r.body)
    r = plain.request("POST", "/v1/responses", {"model": MODEL})
    check("Field required" in vllm_error(r, 400, "Bad Request", "body.input"), r.body)
    r = plain.request("POST", "/v1/responses", {"input": "x", "cache_salt": ""})
    check("cache_salt" in vllm_error(r, 400, "Bad Request", "cache_salt"), r.body)
    r = plain.request("POST", "/v1/responses", {"input": "x", "background": True, "store": False})
    check("background can only be used when `store` is true" in
          vllm_error(r, 400, "Bad Request", None), r.body)
    r = plain.request("POST", "/v1/responses", {"input": "x", "model": "gpt-9"})
    check(vllm_error(r, 404, "NotFoundError", "model") == "The model `gpt-9` does not exist.",
          r.body)
    r = plain.request("POST", "/v1/responses", {"input": "x", "background": True})
    msg = vllm_error(r, 400, "invalid_request_error", "background")
    check("VLLM_ENABLE_RESPONSES_API_STORE=1" in msg, msg)
    r = plain.request("POST", "/v1/responses", {"input": "x", "previous_response_id": "resp_nope"})
    check(r.status == 404 and r.json() == {"error": {
        "message": "Response with id 'resp_nope' not found.", "type": "invalid_request_error",
        "param": "response_id", "code": 404}}, r.body)
    # store off: the response (store defaults to true) is not stored
    st, o, _ = post(plain, "/v1/responses", {"input": "remember me", "max_output_tokens": 2})
    check(st == 200, o)
    r = plain.request("POST", "/v1/responses", {"input": "x", "previous_response_id": o["id"]})
    vllm_error(r, 404, "invalid_request_error", "response_id")
    st, e = get(plain, "/v1/responses/" + o["id"])
    check(st == 404 and e["error"]["message"] == "Response with id '%s' not found." % o["id"], e)
    r = plain.request("POST", "/v1/responses/%s/cancel" % o["id"], {})
    vllm_error(r, 404, "invalid_request_error", "response_id")
    r = plain.request("POST", "/v1/responses", b'{"input":"x"}',
                      headers=[("Content-Type", "text/plain")])
    check("Only 'application/json' is allowed" in vllm_error(r, 400, "Bad Request", None), r.body)
    r = plain.request("DELETE", "/v1/responses/" + o["id"])
    check(r.status == 405 and r.header("allow") == "GET", (r.status, r.headers))
    r = plain.request("GET", "/v1/responses/x/input_items")
    check(r.status == 404 and r.json() == {"detail": "Not Found"}, r.body)


@on_sims(timeout=60)
def responses_store_chain(store, plain):
    """With VLLM_ENABLE_RESPONSES_API_STORE=1: a 3-turn chain through previous_response_id.
    Instructions are not carried over (system messages leave the stored history), each turn's
    prompt is instructions + the previous prompt's messages + the previous output + the new input,
    so turn 3 is exactly the chat prompt of the whole conversation (same ids, same answer) and
    hits the blocks turn 2 cached. GET returns the stored object; a finished response cannot be
    cancelled; store:false is not stored; a streamed response is stored too."""
    turns = ["Chain turn one: plan a trip.", "Chain turn two: by train.", "Chain turn three: when?"]
    ids, objs = [], []
    for i, text in enumerate(turns):
        body = {"input": text, "max_output_tokens": 30}
        if i == 0:
            body["instructions"] = "You are a travel agent."
        else:
            body["previous_response_id"] = ids[-1]
        st, o, r = post(store, "/v1/responses", body)
        check(st == 200 and o["status"] in ("completed", "incomplete"), (st, r.body[:300]))
        check(o["previous_response_id"] == (ids[-1] if ids else None), o)
        ids.append(o["id"])
        objs.append(o)
    # turn 3's prompt: no system message (turn 1's instructions are not carried over)
    history = [{"role": "user", "content": turns[0]},
               {"role": "assistant", "content": answer_text(objs[0])},
               {"role": "user", "content": turns[1]},
               {"role": "assistant", "content": answer_text(objs[1])},
               {"role": "user", "content": turns[2]}]
    u3 = objs[2]["usage"]
    c = chat(store, history, max_tokens=30)
    check(c["usage"]["prompt_tokens"] == u3["input_tokens"], (c["usage"], u3))
    check(c["choices"][0]["message"]["content"] == answer_text(objs[2]), (c, objs[2]))
    # turn 3 found turn 2's prompt and answer in the cache (whole blocks)
    turn2_len = objs[1]["usage"]["input_tokens"] + objs[1]["usage"]["output_tokens"]
    check(u3["input_tokens_details"]["cached_tokens"] >= (turn2_len - 1) // 16 * 16 - 16 and
          u3["input_tokens_details"]["cached_tokens"] > objs[1]["usage"]["input_tokens_details"]
          ["cached_tokens"], (u3, objs[1]["usage"]))
    # GET: the stored object as it was answered
    for o in objs:
        st, g = get(store, "/v1/responses/" + o["id"])
        check(st == 200 and g == o, (st, g, o))
        r = store.request("POST", "/v1/responses/%s/cancel" % o["id"], {})
        check(vllm_error(r, 400, "invalid_request_error", "response_id") ==
              "Cannot cancel a synchronous response.", r.body)
    # store:false is not stored; a streamed response is
    st, o, _ = post(store, "/v1/responses", {"input": "unstored", "store": False,
                                             "max_output_tokens": 2})
    check(get(store, "/v1/responses/" + o["id"])[0] == 404, o["id"])
    r = store.request("POST", "/v1/responses", {
        "input": "Streamed and stored, with words enough to fill a block or two of tokens.",
        "stream": True, "max_output_tokens": 3, "ignore_eos": True})
    done = events(r)[-1][1]["response"]
    st, g = get(store, "/v1/responses/" + done["id"])
    check(st == 200 and g == done, (g, done))
    # a continuation of a stored turn from the streamed one works too
    st, o, _ = post(store, "/v1/responses", {"input": "and then?", "previous_response_id":
                                             done["id"], "max_output_tokens": 2})
    check(st == 200 and o["usage"]["input_tokens_details"]["cached_tokens"] > 0, o)


@on_sims(timeout=60)
def responses_background(store, plain):
    """background:true (store on): answered at once as "queued", run without a client into the
    store (GET sees it completed); a running one can be cancelled (its engine request aborted,
    GET says cancelled afterwards), a finished one cannot."""
    st, q, _ = post(store, "/v1/responses", {"input": "Background job.", "background": True,
                                             "max_output_tokens": 4, "ignore_eos": True})
    check(st == 200 and q["status"] == "queued" and q["background"] is True and
          q["output"] == [] and q["usage"] is None, q)

    def finished():
        st, g = get(store, "/v1/responses/" + q["id"])
        return g if g["status"] != "queued" else None
    g = wait_for(finished, 10, "background response finished")
    check(g["status"] == "incomplete" and len(answer_text(g)) == 16 and
          g["usage"]["output_tokens"] == 4, g)
    aborted = store.metric("vllm:request_success_total", finished_reason="abort")
    st, q, _ = post(store, "/v1/responses", {"input": "Long background job.", "background": True,
                                             "max_output_tokens": 5000, "ignore_eos": True})
    st, c, _ = post(store, "/v1/responses/%s/cancel" % q["id"], {})
    check(st == 200 and c["status"] == "cancelled" and c["id"] == q["id"], c)
    wait_for(lambda: store.metric("vllm:request_success_total", finished_reason="abort")
             > aborted, 10, "the cancelled run aborted")
    time.sleep(0.2)
    check(get(store, "/v1/responses/" + q["id"])[1]["status"] == "cancelled", q["id"])
    r = store.request("POST", "/v1/responses/%s/cancel" % q["id"], {})
    vllm_error(r, 400, "invalid_request_error", "response_id")


@on_sims(timeout=60)
def responses_background_stream(store, plain):
    """background + stream (store on): the POST reads the run's events from the first (the text
    event order, sequence numbers from 0); GET ?stream=true&starting_after=N replays them after
    event N (and follows a run still going to its end); a cancelled run ends its readers; GET of a
    response without events is vLLM's "Unknown response_id"."""
    body = {"input": "Background stream job.", "background": True, "stream": True,
            "max_output_tokens": 3, "ignore_eos": True}
    r = store.request("POST", "/v1/responses", body, timeout=30)
    check(r.status == 200 and r.header("content-type").startswith("text/event-stream"), r)
    evs = events(r)
    names = [n for n, _ in evs]
    check(names == TEXT_EVENTS + ["response.output_text.delta"] * 3 + TEXT_END, names)
    check([d["sequence_number"] for _, d in evs] == list(range(len(evs))), evs)
    check(evs[0][1]["response"]["status"] == "in_progress" and
          evs[0][1]["response"]["background"] is True, evs[0])
    done = evs[-1][1]["response"]
    rid = done["id"]
    check(get(store, "/v1/responses/" + rid) == (200, done), rid)
    again = store.request("GET", "/v1/responses/%s?stream=true&starting_after=6" % rid, timeout=30)
    check(again.status == 200 and again.complete and events(again) == evs[7:], again.text()[:300])
    # a long run: a reader that joins late gets the backlog, then the rest; cancel ends it
    conn = h.Conn(store.port, timeout=30)
    conn.send(h.build_request("POST", "/v1/responses", dict(body, max_output_tokens=400)))
    head = h.Response()
    conn.read_head(head)
    seen = b""
    while b'"sequence_number":0' not in seen:
        seen += conn.read_some(65536)
    check(b"event: response.created\n" in seen, seen[:200])
    rid = re.search(rb'"id":"(resp_[0-9a-f]{16})"', seen).group(1).decode()
    time.sleep(0.3)
    st, c, _ = post(store, "/v1/responses/%s/cancel" % rid, {})
    check(st == 200 and c["status"] == "cancelled", c)
    conn.close()
    late = store.request("GET", "/v1/responses/%s?stream=1" % rid, timeout=10)
    check(late.status == 200 and late.complete, late)
    check([n for n, _ in events(late)][:2] == ["response.created", "response.in_progress"], late)
    check("response.completed" not in late.text(), late.text()[-300:])
    # a response that has no events (not a background stream)
    st, o, _ = post(store, "/v1/responses", {"input": "no events", "max_output_tokens": 1})
    r = store.request("GET", "/v1/responses/%s?stream=true" % o["id"])
    check("Unknown response_id" in vllm_error(r, 400, "BadRequestError", "response_id"), r.body)


# ---- the Anthropic Messages API -------------------------------------------------------------


ANTHROPIC_ERROR = re.compile(r'^\{"type":"error","error":\{"type":"[A-Za-z_]+","message":".*"\}\}$')


@on_sims()
def messages_reply_and_stream(store, plain):
    """POST /v1/messages served as chat: the reply's shape (null fields left out), stop_reason
    mapping, usage (cache fields only with --enable-prompt-tokens-details: input_tokens = prompt -
    cached), the stream's events (message_start with the whole prompt, one text block, no ping,
    message_delta with the final usage, message_stop), system blocks joined with no separator and
    the billing header dropped (the same prompt as chat's)."""
    body = {"model": MODEL, "max_tokens": 40,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2; x=1"},
                       {"type": "text", "text": "You answer "},
                       {"type": "text", "text": "briefly."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Which sea?"}]}]}
    msgs = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Which sea?"}]
    for sim, details in ((plain, False), (store, True)):
        c = chat(sim, msgs, max_tokens=40)
        st, m, r = post(sim, "/v1/messages", body)
        check(st == 200 and r.header("content-type").startswith("application/json"), r.body)
        check(list(m) == ["id", "type", "role", "content", "model", "stop_reason", "usage"], m)
        check(m["id"].startswith("chatcmpl-") and m["type"] == "message" and
              m["role"] == "assistant" and m["model"] == MODEL, m)
        check(m["content"] == [{"type": "text", "text": c["choices"][0]["message"]["content"]}],
              (m, c))
        want_stop = {"stop": "end_turn", "length": "max_tokens"}[c["choices"][0]["finish_reason"]]
        check(m["stop_reason"] == want_stop, m)
        u = m["usage"]
        prompt = c["usage"]["prompt_tokens"]
        if details:
            cached = u["cache_read_input_tokens"]
            check(cached > 0 and u["input_tokens"] == prompt - cached and
                  u["cache_creation_input_tokens"] == 0, (u, prompt))
        else:
            check(u == {"input_tokens": prompt, "output_tokens": c["usage"]["completion_tokens"]},
                  (u, c["usage"]))
        # streamed
        r = sim.request("POST", "/v1/messages", dict(body, stream=True, max_tokens=3), timeout=30)
        check(r.status == 200 and r.header("content-type").startswith("text/event-stream"), r)
        evs = events(r)
        names = [n for n, _ in evs]
        check(names == ["message_start", "content_block_start"] + ["content_block_delta"] * 3 +
              ["content_block_stop", "message_delta", "message_stop"], names)
        check(all(d["type"] == n for n, d in evs), evs)
        start = evs[0][1]["message"]
        check(start["content"] == [] and start["stop_reason"] is None and
              start["type"] == "message" and start["role"] == "assistant" and
              start["usage"] == {"input_tokens": prompt, "output_tokens": 0}, start)
        check(evs[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}, evs[1])
        text = "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta")
        check(text == c["choices"][0]["message"]["content"][:12], (text, c))
        delta = evs[-2][1]
        check(delta["delta"] == {"stop_reason": "max_tokens"}, delta)
        check(delta["usage"]["output_tokens"] == 3, delta)
        check(("cache_read_input_tokens" in delta["usage"]) == details, delta)
        check(evs[-1][1] == {"type": "message_stop"}, evs[-1])


@on_sims()
def messages_errors_and_count(store, plain):
    """Body validation in the OpenAI shape (400 "Bad Request", as vLLM, no special case for the
    route), everything after it in the Anthropic shape (an unknown model: 404 NotFoundError, a
    prompt over max_model_len: 400 BadRequestError), count_tokens = the rendered prompt's length
    (what /tokenize counts), cache_salt ignored (not a field of the Messages request)."""
    r = plain.request("POST", "/v1/messages", {"model": MODEL,
                                               "messages": [{"role": "user", "content": "x"}]})
    check("Field required" in vllm_error(r, 400, "Bad Request", "body.max_tokens"), r.body)
    r = plain.request("POST", "/v1/messages", {"model": MODEL, "max_tokens": 0, "messages": []})
    check("max_tokens must be positive" in vllm_error(r, 400, "Bad Request", "body.max_tokens"),
          r.body)
    r = plain.request("POST", "/v1/messages", {"model": "", "max_tokens": 3, "messages": []})
    vllm_error(r, 400, "Bad Request", "body.model")
    r = plain.request("POST", "/v1/messages", {"model": "claude-9", "max_tokens": 3,
                                               "messages": [{"role": "user", "content": "x"}]})
    check(r.status == 404 and ANTHROPIC_ERROR.match(r.text()), r.body)
    check(r.json() == {"type": "error", "error": {
        "type": "NotFoundError", "message": "The model `claude-9` does not exist."}}, r.body)
    r = plain.request("POST", "/v1/messages", {"model": MODEL, "max_tokens": 10 ** 6,
                                               "messages": [{"role": "user", "content": "x"}]})
    check(r.status == 400 and r.json()["error"]["type"] == "BadRequestError" and
          "maximum context length" in r.json()["error"]["message"], r.body)
    msgs = [{"role": "user", "content": "Count me, please."}]
    st, n, _ = post(plain, "/v1/messages/count_tokens", {"model": MODEL, "system": "Sys.",
                                                          "messages": msgs})
    st2, tok, _ = post(plain, "/tokenize", {"model": MODEL, "messages": [
        {"role": "system", "content": "Sys."}] + msgs})
    check(st == 200 and n == {"input_tokens": tok["count"],
                              "context_management": {"original_input_tokens": tok["count"]}},
          (n, tok))
    r = plain.request("POST", "/v1/messages/count_tokens", {"model": "x", "messages": msgs})
    check(r.status == 404 and r.json()["type"] == "error", r.body)
    # cache_salt is dropped (pydantic ignores unknown keys): it shares the unsalted blocks
    doc = [{"role": "user", "content": "Unsalted Messages document. " * 8}]
    chat(store, doc, max_tokens=2)
    st, m, _ = post(store, "/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": doc,
                                            "cache_salt": "ignored"})
    check(m["usage"]["cache_read_input_tokens"] > 0, m["usage"])


# ---- one conversation, three APIs ----------------------------------------------------------


@on_sims(timeout=60)
def same_prompt_across_apis(store, plain):
    """Turn 1 through chat; turn 2 sent as chat, as Responses input items and as Messages: the
    same prompt ids (same length, same answer) and each finds turn 1's prompt and answer cached,
    so a KV-aware router can send a conversation to one worker whatever API it comes in."""
    sys_text, q1, q2 = "You are a geographer.", "Where is the Danube?", "And the Rhine?"
    c1 = chat(store, [{"role": "system", "content": sys_text},
                      {"role": "user", "content": q1}], max_tokens=24, ignore_eos=True)
    a1 = c1["choices"][0]["message"]["content"]
    turn1 = c1["usage"]["prompt_tokens"] + c1["usage"]["completion_tokens"]
    convo = [{"role": "system", "content": sys_text}, {"role": "user", "content": q1},
             {"role": "assistant", "content": a1}, {"role": "user", "content": q2}]
    c2 = chat(store, convo, max_tokens=5, ignore_eos=True)
    st, r2, _ = post(store, "/v1/responses", {
        "instructions": sys_text, "max_output_tokens": 5, "ignore_eos": True, "store": False,
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": q1}]},
                  {"type": "message", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": a1, "annotations": []}]},
                  {"role": "user", "content": q2}]})
    st, m2, _ = post(store, "/v1/messages", {
        "model": MODEL, "max_tokens": 5, "system": sys_text,
        "messages": [{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                     {"role": "user", "content": [{"type": "text", "text": q2}]}]})
    prompt = c2["usage"]["prompt_tokens"]
    check(r2["usage"]["input_tokens"] == prompt, (r2["usage"], prompt))
    check(m2["usage"]["input_tokens"] + m2["usage"]["cache_read_input_tokens"] == prompt,
          (m2["usage"], prompt))
    text = c2["choices"][0]["message"]["content"]
    check(answer_text(r2) == text and m2["content"][0]["text"] == text, (r2, m2, text))
    want = (turn1 - 1) // 16 * 16  # turn 1's blocks, its last (never computed) token excluded
    for got in (c2["usage"]["prompt_tokens_details"]["cached_tokens"],
                r2["usage"]["input_tokens_details"]["cached_tokens"],
                m2["usage"]["cache_read_input_tokens"]):
        check(got >= want, (got, want))


# ---- continuation and echo -------------------------------------------------------------------


def continue_chat(sim, messages, partial, **fields):
    return chat(sim, messages + [{"role": "assistant", "content": partial}],
                continue_final_message=True, add_generation_prompt=False, **fields)


@on_sims(timeout=60)
def continuation_is_deterministic(store, plain):
    """An answer cut after k tokens and continued with continue_final_message (and
    add_generation_prompt false) gives exactly the uncut answer's remaining tokens and stops where
    it stopped, streamed or not, for a natural stop and a max_tokens stop; the reply is only the
    continuation, and its prompt hits the uncut request's blocks. vLLM's two refusals; echo gives
    partial + continuation."""
    msgs = [{"role": "user", "content": "Continue this story about a lighthouse keeper."}]
    full = chat(store, msgs, max_tokens=60)
    text, fin = full["choices"][0]["message"]["content"], full["choices"][0]["finish_reason"]
    n = full["usage"]["completion_tokens"]
    check(fin == "stop" and n >= 3 and len(text) == 4 * n, full)
    for k in sorted({1, n // 2, n - 1}):
        c = continue_chat(store, msgs, text[:4 * k], max_tokens=60)
        check(c["choices"][0]["message"]["content"] == text[4 * k:] and
              c["choices"][0]["finish_reason"] == "stop", (k, c, text))
        check(c["usage"]["prompt_tokens"] == full["usage"]["prompt_tokens"] + k, c["usage"])
        check(c["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, c["usage"])
    # streamed
    k = n // 2
    r = store.request("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": msgs + [{"role": "assistant", "content": text[:4 * k]}],
        "continue_final_message": True, "add_generation_prompt": False, "stream": True,
        "max_tokens": 60}, timeout=30)
    datas = [json.loads(d) for d in h.sse_events(r.body) if d != "[DONE]"]
    check("".join(d["choices"][0]["delta"]["content"] for d in datas) == text[4 * k:], datas)
    # a max_tokens stop: the uncut answer of 9 tokens, cut after 4, asked for the other 5
    uncut = chat(store, msgs, max_tokens=9, ignore_eos=True)["choices"][0]["message"]["content"]
    rest = continue_chat(store, msgs, uncut[:16], max_tokens=5, ignore_eos=True)
    check(rest["choices"][0]["message"]["content"] == uncut[16:] and
          rest["choices"][0]["finish_reason"] == "length", (rest, uncut))
    # echo: the partial, then the continuation (and, as vLLM's echo, no prefix-cache read)
    e = continue_chat(store, msgs, text[:8], max_tokens=60, echo=True)
    check(e["choices"][0]["message"]["content"] == text, (e, text))
    check(e["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, e["usage"])
    # Responses continues a partial assistant message by itself (status incomplete)
    st, o, _ = post(store, "/v1/responses", {"max_output_tokens": 60, "store": False, "input": [
        {"role": "user", "content": msgs[0]["content"]},
        {"type": "message", "role": "assistant", "status": "incomplete",
         "content": [{"type": "output_text", "text": text[:8]}]}]})
    check(st == 200 and answer_text(o) == text[8:], (o, text))
    # both true: the request model's validator; continue with the default add_generation_prompt:
    # transformers' refusal
    r = store.request("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": msgs, "continue_final_message": True,
        "add_generation_prompt": True})
    check("Cannot set both `continue_final_message` and `add_generation_prompt` to True." in
          vllm_error(r, 400, "Bad Request", None), r.body)
    r = store.request("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": msgs, "continue_final_message": True})
    check(vllm_error(r, 400, "BadRequestError", None).startswith(
        "continue_final_message and add_generation_prompt are not compatible."), r.body)
    # /tokenize renders the continuation as the request does
    st, tok, _ = post(store, "/tokenize", {"model": MODEL, "messages": msgs + [
        {"role": "assistant", "content": text[:8]}], "continue_final_message": True,
        "add_generation_prompt": False})
    check(st == 200 and tok["count"] == full["usage"]["prompt_tokens"] + 2, tok)


@on_sims()
def completions_echo(store, plain):
    """Completions echo: the text prompt comes back before the answer (non-streamed: in the text;
    streamed: with the first token's text)."""
    prompt = "Echo this prompt back "
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "ignore_eos": True}
    st, plain_c, _ = post(store, "/v1/completions", body)
    st, echoed, _ = post(store, "/v1/completions", dict(body, echo=True))
    check(echoed["choices"][0]["text"] == prompt + plain_c["choices"][0]["text"], echoed)
    r = store.request("POST", "/v1/completions", dict(body, echo=True, stream=True), timeout=30)
    texts = [json.loads(d)["choices"][0]["text"] for d in h.sse_events(r.body) if d != "[DONE]"]
    check(len(texts) == 3 and texts[0] == prompt + plain_c["choices"][0]["text"][:4], texts)


# ---- cache_salt --------------------------------------------------------------------------------


@on_sims(timeout=60)
def cache_salt_isolates(store, plain):
    """cache_salt (chat, completions, responses): a salted request shares prefix-cache blocks only
    with requests of the same salt, on every API that takes one (the same salt shares across
    them); unsalted requests share only unsalted blocks; vllm:prefix_cache_hits counts the hits."""
    doc = "A salted shared document about lighthouses and their keepers. " * 6
    msgs = [{"role": "user", "content": doc}]

    def cached(salt=None, api="chat"):
        extra = {"cache_salt": salt} if salt is not None else {}
        if api == "chat":
            c = chat(store, msgs, max_tokens=2, **extra)
            return c["usage"]["prompt_tokens_details"]["cached_tokens"]
        if api == "responses":
            st, o, _ = post(store, "/v1/responses", dict(extra, input=doc, max_output_tokens=2,
                                                         store=False))
            return o["usage"]["input_tokens_details"]["cached_tokens"]
        st, o, _ = post(store, "/v1/completions", dict(extra, model=MODEL, prompt=doc,
                                                       max_tokens=2))
        return o["usage"]["prompt_tokens_details"]["cached_tokens"]

    hits0 = store.metric("vllm:prefix_cache_hits_total")
    check(cached("tenant-a") == 0, "first salted request")
    a = cached("tenant-a")
    check(a > 0, "same salt, same prompt: a hit")
    check(cached("tenant-a", "responses") == a, "the same salt through Responses")
    check(cached("tenant-b") == 0, "another salt")
    check(cached() == 0, "no salt: the salted blocks are not shared")
    check(cached() == a, "no salt twice")
    check(cached("tenant-b") == a, "tenant-b's own blocks")
    check(cached("tenant-c", "completions") == 0 and cached("tenant-c", "completions") > 0,
          "completions")
    check(store.metric("vllm:prefix_cache_hits_total") > hits0, "hits counted")
    r = store.request("POST", "/v1/completions", {"model": MODEL, "prompt": "x",
                                                  "cache_salt": 5})
    check("must be a non-empty string" in vllm_error(r, 400, "Bad Request", "cache_salt"), r.body)


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0], around=shared_sims))
