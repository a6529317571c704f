#!/usr/bin/env python3
"""test_lora -- LoRA adapters routed to where they are loaded (issue 35), against a real `kvrouter
serve` in front of loopback vLLM-shaped workers.

The workers are small python3 HTTP servers (LoraWorker below) speaking the part of vLLM's API that
LoRA touches, each answer as vLLM writes it (/work/shared/VLLM-APIS.md section 4):
  - GET /v1/models: one base card (id the served name, root the model path, parent null,
    max_model_len set), then one card per adapter (id its name, root its path, parent its base,
    max_model_len null) -- vllm/entrypoints/openai/models/serving.py show_available_models;
  - GET /metrics: the load gauges and vllm:lora_requests_info{max_lora, running_lora_adapters,
    waiting_lora_adapters} whose value is the time of its last update; every label combination it
    ever had stays on the page, as prometheus_client keeps them (vllm/v1/metrics/loggers.py);
  - POST /v1/load_lora_adapter {"lora_name", "lora_path"}: 200 "Success: LoRA adapter 'N' added
    successfully.", 400 InvalidUserInput "The lora adapter 'N' has already been loaded. ...",
    404 NotFoundError when the files are missing (models/serving.py load_lora_adapter); FastAPI's
    404 {"detail": "Not Found"} when the server runs without VLLM_ALLOW_RUNTIME_LORA_UPDATING
    (serve/lora/api_router.py registers the route only then);
  - POST /v1/chat/completions: vLLM's 404 for a model it does not list, else a completion.
tests/router/test_lora_sim.py runs the main cases against `kvrouter sim` with LoRA on; these
stand-ins also give the answers a sim does not give on cue (a load racing the list, a 500, a stream
breaking mid-answer).

Cases:
  - a listed adapter lands only where listed (round_robin: only eligibility keeps it off the other
    worker), base-model requests go anywhere;
  - kv_aware prefers the worker where the adapter is running (its /metrics) over one where it is
    merely loaded, until the bounded load moves the next request away;
  - a runtime adapter (--lora-adapter NAME=PATH) no worker lists: the first request makes the
    router load it on the worker it chose (one POST, however many requests wait), then it is
    routed there; with a base named, only that base's workers are eligible;
  - a worker answering "already loaded" counts as loaded; a client leaving during the load;
  - load failures (missing files, runtime updating off) are a 502 in the API's shape naming the
    adapter and the worker's answer; the metrics count attempts and results.

Run: python3 tests/router/test_lora.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import concurrent.futures
import http.server
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, Cleanup, Router, request, wait_for  # noqa: E402

TESTS, test = h.registry()

BASE = "meta-llama/Llama-3.1-8B"


class LoraWorker:
    """A loopback vLLM-shaped worker serving BASE (or base) with LoRA on. adapters: {name: path}
    listed from the start; running: adapter names its /metrics reports in the batch; runtime: the
    load endpoint exists (VLLM_ALLOW_RUNTIME_LORA_UPDATING); load_delay: seconds a load takes;
    missing: paths whose load fails as vLLM's 404 NotFoundError; hidden: adapters loaded but not
    listed yet (a load that landed after the router's last GET /v1/models). Records every load
    POST (loads) and every completion's model (served)."""

    def __init__(self, base=BASE, adapters=None, running=(), runtime=True, load_delay=0.0,
                 missing=(), hidden=(), hold=0.0, broken=(), break_streams=0):
        self.base = base
        self.adapters = dict(adapters or {})
        self.hidden = set(hidden)
        self.running = list(running)
        self.runtime = runtime
        self.load_delay = load_delay
        self.missing = set(missing)
        self.broken = set(broken)  # paths the engine fails to load: vLLM's 500
        self.break_streams = break_streams  # the first N streamed answers lose the connection
        self.hold = hold  # seconds a completion whose prompt says "hold" takes
        self.loads, self.served = [], []
        self.lock = threading.Lock()
        self.series = []  # (running, waiting, updated) label sets ever written
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send(self, status, obj, ctype="application/json"):
                out = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                if self.path == "/v1/models":
                    self.send(200, outer.model_list())
                elif self.path == "/metrics":
                    self.send(200, outer.metrics_page().encode(), "text/plain; version=0.0.4")
                else:
                    self.send(404, {"detail": "Not Found"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if self.path == "/v1/load_lora_adapter" and outer.runtime:
                    status, answer = outer.load(body)
                    if isinstance(answer, str):
                        self.send(status, answer.encode(), "text/plain")
                    else:
                        self.send(status, answer)
                elif self.path == "/v1/chat/completions" and body.get("stream"):
                    outer.stream(self, body)
                elif self.path == "/v1/chat/completions":
                    self.send(*outer.complete(body))
                else:
                    self.send(404, {"detail": "Not Found"})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def kill(self):  # Cleanup protocol
        self.httpd.shutdown()
        self.httpd.server_close()

    def model_list(self):
        """vLLM's ModelList: the base card, then the adapters' (models/serving.py)."""
        cards = [{"id": self.base, "object": "model", "created": 1, "owned_by": "vllm",
                  "root": "/models/" + self.base, "parent": None, "max_model_len": 4096,
                  "permission": []}]
        with self.lock:
            for name, path in self.adapters.items():
                if name not in self.hidden:
                    cards.append({"id": name, "object": "model", "created": 1, "owned_by": "vllm",
                                  "root": path, "parent": self.base, "max_model_len": None,
                                  "permission": []})
        return {"object": "list", "data": cards}

    def metrics_page(self):
        """The load gauges and every vllm:lora_requests_info series written so far: a new label
        set is a new series, the old ones stay (the newest has the largest value)."""
        with self.lock:
            labels = (",".join(self.running), "")
            if not self.series or self.series[-1][:2] != labels:
                self.series.append(labels + (time.time(),))
            lines = ["vllm:num_requests_running %d" % len(self.running),
                     "vllm:num_requests_waiting 0", "vllm:kv_cache_usage_perc 0.0",
                     "# HELP vllm:lora_requests_info Running stats on lora requests.",
                     "# TYPE vllm:lora_requests_info gauge"]
            for run, wait, at in self.series:
                lines.append('vllm:lora_requests_info{max_lora="2",running_lora_adapters="%s",'
                             'waiting_lora_adapters="%s"} %.3f' % (run, wait, at))
        return "\n".join(lines) + "\n"

    def load(self, body):
        """POST /v1/load_lora_adapter as models/serving.py answers it."""
        name, path = body.get("lora_name"), body.get("lora_path")
        with self.lock:
            self.loads.append((name, path))
        time.sleep(self.load_delay)
        if not name or not path:
            return 400, {"error": {"message": "Both 'lora_name' and 'lora_path' must be provided.",
                                   "type": "InvalidUserInput", "param": None, "code": 400}}
        with self.lock:
            if name in self.adapters:
                return 400, {"error": {"message": "The lora adapter '%s' has already been loaded. "
                                       "If you want to load the adapter in place, set "
                                       "'load_inplace' to True." % name,
                                       "type": "InvalidUserInput", "param": None, "code": 400}}
            if path in self.missing:
                return 404, {"error": {"message": "Loading lora %s failed: No adapter found for %s"
                                       % (name, path), "type": "NotFoundError", "param": None,
                                       "code": 404}}
            if path in self.broken:
                return 500, {"error": {"message": "LoRA rank 64 is greater than max_lora_rank 16.",
                                       "type": "InternalServerError", "param": None, "code": 500}}
            self.adapters[name] = path
        return 200, "Success: LoRA adapter '%s' added successfully." % name

    def stream(self, handler, body):
        """A streamed chat answer as vLLM writes it (role chunk, a token per chunk, the finish
        chunk, [DONE]), chunked; a breaking one loses its connection after three tokens."""
        model = body.get("model")
        status, answer = self.complete(dict(body, messages=[]))
        if status != 200:
            handler.send(status, answer)
            return
        with self.lock:
            breaking = self.break_streams > 0
            self.break_streams -= breaking
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def chunk(delta, finish=None):
            o = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
                 "model": model, "choices": [{"index": 0, "delta": delta,
                                              "finish_reason": finish}]}
            data = ("data: " + json.dumps(o) + "\n\n").encode()
            handler.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
            handler.wfile.flush()
        chunk({"role": "assistant", "content": ""})
        words = ("one ", "two ", "three ") if breaking else ("four ", "five")
        for w in words:
            chunk({"content": w})
        if breaking:
            time.sleep(0.05)  # the tokens reach the router before the connection goes
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        chunk({"content": ""}, "stop")
        done = b"data: [DONE]\n\n"
        handler.wfile.write(b"%x\r\n" % len(done) + done + b"\r\n0\r\n\r\n")

    def complete(self, body):
        model = body.get("model")
        with self.lock:
            known = model == self.base or model in self.adapters  # hidden ones too: loaded
            if known:
                self.served.append(model)
        if not known:
            return 404, {"error": {"message": "The model `%s` does not exist." % model,
                                   "type": "NotFoundError", "param": "model", "code": 404}}
        text = json.dumps(body.get("messages", ""))
        if "hold" in text:
            time.sleep(self.hold)
        return 200, {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


def chat(r, model, content="Hello there, how are you?", path="/v1/chat/completions"):
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    return request(r.port, "POST", path, body, timeout=10)


def worker_of(resp):
    return resp.header("x-kvrouter-worker")


def ids_by_url(r):
    return {w["url"]: str(w["id"]) for w in r.workers()}


def wait_lists(r, n=None):
    wait_for(lambda: all(w["models"]["known"] for w in r.workers()), 5, "the workers' lists read")


def metric(r, name, **labels):
    return h.prom_value(h.parse_prom_samples(r.metrics_text()), name, **labels)


def show(line):
    print("    " + line, flush=True)


@test(timeout=30)
def test_listed_adapter_only_where_listed():
    """An adapter one worker lists goes only there, even under round_robin; the base goes to both;
    /admin/workers shows the adapter card's parent and the worker's lora_requests_info."""
    with Cleanup() as c:
        a = c.add(LoraWorker(adapters={"sql-lora": "/adapters/sql"}, running=["sql-lora"]))
        b = c.add(LoraWorker())
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin"))
        wait_lists(r)
        ids = ids_by_url(r)
        wait_for(lambda: any(w["models"]["lora"]["running"] for w in r.workers()), 5,
                 "lora_requests_info scraped")
        got = [worker_of(chat(r, "sql-lora")) for _ in range(6)]
        assert set(got) == {ids[a.url]}, got
        base = [worker_of(chat(r, BASE)) for _ in range(4)]
        assert set(base) == {ids[a.url], ids[b.url]}, base
        wa = [w for w in r.workers() if w["url"] == a.url][0]["models"]
        card = [m for m in wa["ids"] if m["id"] == "sql-lora"][0]
        assert card["parent"] == BASE and card["root"] == "/adapters/sql", card
        assert wa["lora"]["running"] == ["sql-lora"] and wa["lora"]["max_lora"] == 2, wa["lora"]
        ex = request(r.admin_port, "POST", "/admin/route/explain",
                     {"model": "sql-lora", "messages": [{"role": "user", "content": "x"}]}).json()
        states = {str(w["id"]): (w["serves_model"], w["adapter"]) for w in ex["workers"]}
        assert states == {ids[a.url]: (True, "running"), ids[b.url]: (False, "none")}, states
        show("sql-lora x6 -> workers %s; base x4 -> %s" % (sorted(set(got)), sorted(set(base))))


@test(timeout=40)
def test_running_adapter_preferred_while_load_allows():
    """Both workers list the adapter, one runs it: kv_aware sends it there, until the bounded load
    (balance_slack 1 here) caps that worker; then the next request goes to the other one."""
    with Cleanup() as c:
        ad = {"chat-lora": "/adapters/chat"}
        a = c.add(LoraWorker(adapters=ad, hold=3.0))
        b = c.add(LoraWorker(adapters=ad, running=["chat-lora"], hold=3.0))
        r = c.add(Router([a, b], *FAST, "--policy", "kv_aware", "--policy-params",
                         '{"balance_slack": 1}'))
        wait_lists(r)
        ids = ids_by_url(r)
        wait_for(lambda: any(w["models"]["lora"]["running"] for w in r.workers()), 5,
                 "lora_requests_info scraped")
        seq = [worker_of(chat(r, "chat-lora", "request %d" % i)) for i in range(5)]
        assert set(seq) == {ids[b.url]}, ("idle: every request to the running worker", seq)
        # Two held requests on b; the third finds b at the bound and goes to a.
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            held = []
            for i in range(2):
                held.append(pool.submit(chat, r, "chat-lora", "hold %d" % i))
                wait_for(lambda: sum(w["in_flight"] for w in r.workers()) == i + 1, 3,
                         "held request %d in flight" % i)
            third = worker_of(chat(r, "chat-lora", "the third"))
            held_on = [worker_of(f.result()) for f in held]
        assert held_on == [ids[b.url]] * 2, held_on
        assert third == ids[a.url], ("b capped: the loaded worker takes it", third)
        show("idle: 5/5 on the running worker; 2 held there, the next -> the loaded worker")


@test(timeout=30)
def test_runtime_adapter_one_load_then_routed_there():
    """--lora-adapter NAME=PATH that no worker lists: concurrent first requests make exactly one
    POST /v1/load_lora_adapter on the chosen worker and all succeed there; later requests go
    there without another load."""
    with Cleanup() as c:
        a = c.add(LoraWorker(load_delay=0.5))
        b = c.add(LoraWorker(load_delay=0.5))
        r = c.add(Router([a, b], *FAST, "--policy", "kv_aware",
                         "--lora-adapter", "dyn-lora=/adapters/dyn"))
        wait_lists(r)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = list(pool.map(lambda i: chat(r, "dyn-lora", "first %d" % i), range(4)))
        assert [x.status for x in first] == [200] * 4, [(x.status, x.body[:200]) for x in first]
        loads = a.loads + b.loads
        assert loads == [("dyn-lora", "/adapters/dyn")], loads
        loader = a if a.loads else b
        ids = ids_by_url(r)
        assert {worker_of(x) for x in first} == {ids[loader.url]}
        later = [worker_of(chat(r, "dyn-lora", "later %d" % i)) for i in range(5)]
        assert set(later) == {ids[loader.url]}, later
        assert len(a.loads) + len(b.loads) == 1
        assert metric(r, "kvrouter_lora_load_attempts_total") == 1
        assert metric(r, "kvrouter_lora_loads_total", result="loaded") == 1
        card = [m for w in r.workers() if w["url"] == loader.url for m in w["models"]["ids"]
                if m["id"] == "dyn-lora"]
        assert card and card[0]["parent"] == BASE and card[0]["root"] == "/adapters/dyn", card
        show("4 concurrent + 5 later requests, 1 load, all on worker %s" % ids[loader.url])


@test(timeout=40)
def test_continuation_loads_the_adapter():
    """A stream of a runtime adapter broken mid-answer is continued on another worker of its base,
    which first loads the adapter: one stream for the client (3 + 2 tokens, [DONE]); when that
    load fails, the client's stream ends with vLLM's error event naming the adapter."""
    spec = json.dumps({"name": "dyn", "path": "/adapters/dyn", "base_model_name": BASE})
    body = {"model": "dyn", "stream": True, "max_tokens": 10,
            "messages": [{"role": "user", "content": "count"}]}
    for fails in (False, True):
        with Cleanup() as c:
            a = c.add(LoraWorker(adapters={"dyn": "/adapters/dyn"}, break_streams=1))
            b = c.add(LoraWorker(missing={"/adapters/dyn"} if fails else ()))
            r = c.add(Router([a, b], *FAST, "--policy", "kv_aware", "--lora-adapter", spec))
            wait_lists(r)
            resp = request(r.port, "POST", "/v1/chat/completions", body, timeout=10)
            events = h.sse_events(resp.body)
            assert resp.status == 200 and events[-1] == "[DONE]", (resp.status, events[-3:])
            assert b.loads == [("dyn", "/adapters/dyn")], b.loads
            errors = [e for e in events if e != "[DONE]" and "error" in json.loads(e)]
            if fails:
                assert h.token_events(events) == 3, events
                assert len(errors) == 1 and "No adapter found" in errors[0], errors
                assert metric(r, "kvrouter_lora_loads_total", result="failed") == 1
                show("continuation's load failed: 3 tokens, then %s" % errors[0][:110])
            else:
                assert h.token_events(events) == 5 and not errors, events
                assert b.served == ["dyn"], b.served
                assert metric(r, "kvrouter_stream_resumes_total", result="resumed") == 1
                show("continued on the other worker after its load: 5 tokens, one stream")


@test(timeout=30)
def test_client_leaves_during_load():
    """A client that goes away while its adapter loads: the load goes on and is kept (the next
    request needs none), nothing is left in flight, and the router stays clean."""
    with Cleanup() as c:
        a = c.add(LoraWorker(load_delay=1.0))
        r = c.add(Router([a], *FAST, "--lora-adapter", "slow=/adapters/slow"))
        wait_lists(r)
        body = {"model": "slow", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
        conn = h.Conn(r.port, timeout=5)
        conn.send(h.build_request("POST", "/v1/chat/completions", body))
        wait_for(lambda: a.loads, 3, "the load started")
        conn.close()
        wait_for(lambda: metric(r, "kvrouter_client_aborts_total") == 1, 3, "the abort counted")
        assert sum(w["in_flight"] for w in r.workers()) == 0
        wait_for(lambda: metric(r, "kvrouter_lora_loads_total", result="loaded") == 1, 5,
                 "the load finished")
        again = chat(r, "slow")
        assert again.status == 200, (again.status, again.body[:200])
        assert a.loads == [("slow", "/adapters/slow")] and a.served == ["slow"], (a.loads, a.served)
        show("client gone mid-load: load kept, next request served without another")


@test(timeout=30)
def test_runtime_adapter_base_and_already_loaded():
    """A runtime adapter with base_model_name goes only to that base's workers; a worker answering
    "already loaded" (it loaded it after the router's last list) counts as loaded."""
    with Cleanup() as c:
        a = c.add(LoraWorker(base="base-a", adapters={"twin": "/adapters/twin"}, hidden=["twin"]))
        b = c.add(LoraWorker(base="base-b"))
        spec = json.dumps({"name": "twin", "path": "/adapters/twin", "base_model_name": "base-a"})
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin", "--lora-adapter", spec))
        wait_lists(r)
        ids = ids_by_url(r)
        got = [chat(r, "twin", "q %d" % i) for i in range(3)]
        assert [x.status for x in got] == [200] * 3, [(x.status, x.body[:200]) for x in got]
        assert {worker_of(x) for x in got} == {ids[a.url]}
        assert a.loads == [("twin", "/adapters/twin")] and b.loads == [], (a.loads, b.loads)
        assert metric(r, "kvrouter_lora_loads_total", result="already_loaded") == 1
        show("twin (base-a) x3 -> worker %s, one load answered 'already loaded'" % ids[a.url])


@test(timeout=30)
def test_load_failure_is_a_clean_error():
    """A load the worker refuses (files missing: vLLM's 404; the engine fails: its 500) or cannot
    take (runtime updating off: no such route) is a 502 in the API's shape naming the adapter and the worker's answer; the
    metrics count them as failed, and no completion reaches the worker."""
    with Cleanup() as c:
        a = c.add(LoraWorker(missing={"/adapters/gone"}, broken={"/adapters/big"}))
        b = c.add(LoraWorker(base="other", runtime=False))
        spec = json.dumps({"name": "off", "path": "/adapters/off", "base_model_name": "other"})
        gone_spec = json.dumps({"name": "gone", "path": "/adapters/gone", "base_model_name": BASE})
        r = c.add(Router([a, b], *FAST, "--lora-adapter", gone_spec,
                         "--lora-adapter", json.dumps({"name": "big", "path": "/adapters/big",
                                                       "base_model_name": BASE}),
                         "--lora-adapter", spec, "--policy", "round_robin"))
        wait_lists(r)
        gone = [chat(r, "gone") for _ in range(2)]
        errs = [h.assert_openai_error(x, 502) for x in gone]
        assert all(e["code"] == "lora_load_failed" for e in errs), errs
        msg = errs[0]["message"]
        assert "gone" in msg and "No adapter found for /adapters/gone" in msg and "HTTP 404" in msg, msg
        off = chat(r, "off")
        err = h.assert_openai_error(off, 502)
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in err["message"], err
        anth = request(r.port, "POST", "/v1/messages",
                       {"model": "gone", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert anth.status == 502, anth.status
        body = anth.json()
        assert body["type"] == "error" and body["error"]["type"] == "api_error", body
        assert "No adapter found" in body["error"]["message"], body
        big = h.assert_openai_error(chat(r, "big"), 502)
        assert "HTTP 500" in big["message"] and "max_lora_rank" in big["message"], big
        assert a.served == [] and b.served == [], (a.served, b.served)
        assert metric(r, "kvrouter_lora_loads_total", result="failed") == 5
        assert metric(r, "kvrouter_lora_load_attempts_total") == 5
        show("missing files: 502 %r" % msg[:120])
        show("runtime updating off: 502 %r" % err["message"][:120])


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
