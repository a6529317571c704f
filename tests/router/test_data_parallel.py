#!/usr/bin/env python3
"""test_data_parallel -- data-parallel ranks as workers (issue 35) against a real `kvrouter serve`
in front of one loopback server that answers as `vllm serve --data-parallel-size 2
--api-server-count 1` does (a small python3 http.server, DpServer below: the wire facts it follows
are vLLM's, /work/shared/VLLM-APIS.md section 6):
  - X-data-parallel-rank: R pins a chat, completions or messages request to engine R (vLLM's
    _get_data_parallel_rank, vllm/entrypoints/openai/engine/serving.py); a rank outside [0, n) is
    refused (vLLM raises ValueError "data_parallel_rank N is out of range [0, n)."; its HTTP status
    is not confirmed: 400 here); without the header the engine with the lowest
    waiting * 4 + running runs it (vllm/v1/engine/core_client.py). /v1/responses ignores it.
  - GET /metrics: every per-engine series labelled engine="R" and model_name
    (vllm/v1/metrics/loggers.py), running the requests in flight on R, KV usage a fixed figure per
    engine, cache_config_info once per engine;
  - GET /v1/models: one base card.
The server records each request (path, the X-data-parallel-rank it carried, the engine that ran it,
x-request-id) and counts its /metrics and /v1/models GETs.

Tests, one router (`--worker URL,dp_size=2`, kv_aware) shared in order:
  - the two ranks are two workers of one URL (dp_rank 0 and 1, keys URL#dp=R), each with its own
    engine's scraped figures, from one scrape of the URL per interval (not one per rank);
  - distinct prompts spread over both ranks, every proxied request carries X-data-parallel-rank of
    the worker the router chose (x-kvrouter-worker), and a repeated prompt goes back to the rank
    that holds its prefix (prefix affinity per rank); printed as a table;
  - completions and messages carry the header too; a client's own X-data-parallel-rank is replaced;
    /v1/responses carries it but the server (as vLLM) picks the engine itself: recorded as such;
  - route/explain and the access log show the rank; kvrouter_worker_data_parallel_rank per worker;
  - POST /admin/workers with dp_size adds one worker per rank, a second time 400;
  - POST /admin/reset_prefix_cache: one POST for the server, both ranks' index entries forgotten;
  - the same server given without dp_size: one worker, engines_seen 2 with a hint, one warning.

Run: python3 tests/router/test_data_parallel.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import contextlib
import http.server
import json
import os
import re
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, MODEL, Cleanup, Router, request, wait_for  # noqa: E402

TESTS, test = h.registry()
STATE = {}
# Each engine's figures beside its requests in flight: running (which kv_aware does not weigh) and
# the GPU blocks differ per engine, so each rank's scraped figures show whose they are; the KV usage
# is the same, so a cold cache spreads distinct prompts over both.
RUNNING_BASE = {0: 3, 1: 5}
KV_USAGE = 0.25


def show(line):
    print("    " + line, flush=True)


class DpServer:
    """One API server in front of n engines, as vLLM's is for the router (see the module doc)."""

    def __init__(self, n=2):
        self.n = n
        self.lock = threading.Lock()
        self.requests = []            # {path, header, engine, rid}
        self.running = [0] * n        # in flight per engine
        self.metrics_gets = 0
        self.models_gets = 0
        self.resets = 0               # POST /reset_prefix_cache (every engine at once, as vLLM)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, body, ctype="application/json"):
                out = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                if self.path == "/metrics":
                    with outer.lock:
                        outer.metrics_gets += 1
                        page = outer.page()
                    self._send(200, page.encode(), "text/plain; version=0.0.4")
                elif self.path == "/v1/models":
                    with outer.lock:
                        outer.models_gets += 1
                    self._send(200, {"object": "list", "data": [
                        {"id": MODEL, "object": "model", "created": 1, "owned_by": "vllm",
                         "root": MODEL, "parent": None, "max_model_len": 8192,
                         "permission": []}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                if self.path.startswith("/reset_prefix_cache"):
                    with outer.lock:
                        outer.resets += 1
                    self._send(200, b"", "text/plain")
                    return
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                hdr = self.headers.get("X-data-parallel-rank")  # case-insensitive, as Starlette
                reads = self.path in ("/v1/chat/completions", "/v1/completions", "/v1/messages")
                engine = None
                if reads and hdr is not None:
                    try:
                        engine = int(hdr)
                    except ValueError:
                        engine = None  # vLLM ignores a non-integer value
                    if engine is not None and not 0 <= engine < outer.n:
                        self._send(400, {"error": {
                            "message": "data_parallel_rank %d is out of range [0, %d)."
                                       % (engine, outer.n),
                            "type": "BadRequestError", "param": None, "code": 400}})
                        return
                with outer.lock:
                    if engine is None:  # vLLM's choice: the lowest waiting * 4 + running
                        engine = min(range(outer.n), key=lambda e: (outer.running[e], e))
                    outer.running[engine] += 1
                    outer.requests.append({"path": self.path, "header": hdr, "engine": engine,
                                           "rid": self.headers.get("x-request-id"),
                                           "body": body})
                try:
                    self._send(200, outer.answer(self.path))
                finally:
                    with outer.lock:
                        outer.running[engine] -= 1

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def page(self):
        lines = []
        for name, typ in (("vllm:num_requests_running", "gauge"),
                          ("vllm:num_requests_waiting", "gauge"),
                          ("vllm:kv_cache_usage_perc", "gauge")):
            lines += ["# HELP %s x" % name, "# TYPE %s %s" % (name, typ)]
            for e in range(self.n):
                v = {"vllm:num_requests_running": RUNNING_BASE[e] + self.running[e],
                     "vllm:num_requests_waiting": 0,
                     "vllm:kv_cache_usage_perc": KV_USAGE}[name]
                lines.append('%s{engine="%d",model_name="%s"} %s' % (name, e, MODEL, float(v)))
        lines += ["# HELP vllm:cache_config_info x", "# TYPE vllm:cache_config_info gauge"]
        for e in range(self.n):
            lines.append('vllm:cache_config_info{block_size="16",engine="%d",num_gpu_blocks='
                         '"%d"} 1.0' % (e, 1000 + e))
        return "\n".join(lines) + "\n"

    @staticmethod
    def answer(path):
        usage = {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}
        if path == "/v1/messages":
            return {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
                    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                    "usage": {"input_tokens": 40, "output_tokens": 1}}
        if path == "/v1/responses":
            return {"id": "resp_0123456789abcdef", "object": "response", "status": "completed",
                    "model": MODEL, "output": [{"type": "message", "id": "msg_1",
                                                "role": "assistant", "status": "completed",
                                                "content": [{"type": "output_text",
                                                             "text": "ok", "annotations": []}]}],
                    "usage": {"input_tokens": 40, "output_tokens": 1, "total_tokens": 41,
                              "input_tokens_details": {"cached_tokens": 0}}}
        if path == "/v1/completions":
            return {"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                    "usage": usage}
        return {"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                             "finish_reason": "stop"}], "usage": usage}

    def by_rid(self, rid):
        with self.lock:
            got = [q for q in self.requests if q["rid"] == rid]
        assert len(got) == 1, (rid, got)
        return got[0]

    def kill(self):  # Cleanup protocol
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def fleet():
    """The DP server and one router with --worker URL,dp_size=2, both ranks scraped."""
    with Cleanup() as c:
        s = c.add(DpServer(2))
        r = c.add(Router(["%s,dp_size=2" % s.url], *FAST))
        wait_for(lambda: all(w.get("scraped", {}).get("fresh") for w in r.workers()), 5,
                 "both ranks scraped")
        STATE.update(s=s, r=r, rank={w["id"]: w["dp_rank"] for w in r.workers()})
        yield
        STATE.clear()


def send(path, body, rid, headers=()):
    r = STATE["r"]
    resp = request(r.port, "POST", path, body, headers=[("x-request-id", rid)] + list(headers))
    assert resp.status == 200, (path, resp.status, resp.body[:300])
    return resp


def worker_rank(resp):
    return STATE["rank"][int(resp.header("x-kvrouter-worker"))]


def document(i):
    return ("Document %d. " % i) + " ".join("w%d-%d" % (i, k) for k in range(120))


@test(timeout=20)
def test_ranks_are_workers():
    s, r = STATE["s"], STATE["r"]
    ws = r.workers()
    assert len(ws) == 2, ws
    assert [w["url"] for w in ws] == [s.url, s.url], ws
    assert sorted((w["dp_rank"], w["dp_size"], w["key"]) for w in ws) == [
        (0, 2, s.url + "#dp=0"), (1, 2, s.url + "#dp=1")], ws
    for w in ws:  # each rank its engine's series of the one page
        sc = w["scraped"]
        assert sc["num_requests_running"] == RUNNING_BASE[w["dp_rank"]], (w["dp_rank"], sc)
        assert sc["num_gpu_blocks"] == 1000 + w["dp_rank"], (w["dp_rank"], sc)
        assert w["engines_seen"] == 2, w
        assert "engines_hint" not in w, w
        show("worker %d: %s rank %d of %d, scraped running %d, GPU blocks %d" % (
            w["id"], w["url"], w["dp_rank"], w["dp_size"], sc["num_requests_running"],
            sc["num_gpu_blocks"]))
    # One scrape per URL: over ~1 s of 100 ms intervals, one GET per interval, not one per rank.
    with s.lock:
        g0, m0 = s.metrics_gets, s.models_gets
    h.time.sleep(1.0)
    with s.lock:
        g1, m1 = s.metrics_gets, s.models_gets
    show("GET /metrics in 1.0 s: %d (2 ranks, --scrape-interval-ms 100); GET /v1/models so far: %d"
         % (g1 - g0, m1))
    assert 5 <= g1 - g0 <= 13, (g0, g1)
    assert m1 == 1, m1  # one list for both ranks (the next is due after 30 s)
    samples = h.parse_prom_samples(r.metrics_text())
    for w in ws:
        assert h.prom_value(samples, "kvrouter_worker_data_parallel_rank",
                            worker=str(w["id"])) == w["dp_rank"]


@test(timeout=30)
def test_spread_header_and_affinity():
    s = STATE["s"]
    first = {}
    rows = []
    for i in range(16):  # distinct documents: a cold cache spreads them (all on one: p = 2^-15)
        resp = send("/v1/chat/completions", h.chat_body(document(i), max_tokens=1), "dp-a%d" % i)
        rank = worker_rank(resp)
        rec = s.by_rid("dp-a%d" % i)
        assert rec["header"] == str(rank) and rec["engine"] == rank, (rank, rec["header"])
        first[i] = rank
    for i in range(16):  # the same document, a second question: back to the rank holding it
        body = h.chat_body(document(i) + " And a follow-up question?", max_tokens=1)
        resp = send("/v1/chat/completions", body, "dp-b%d" % i)
        rank = worker_rank(resp)
        rec = s.by_rid("dp-b%d" % i)
        assert rec["header"] == str(rank) and rec["engine"] == rank, (rank, rec)
        rows.append((i, first[i], rank))
    show("document  first rank  repeat rank  (X-data-parallel-rank as the server received it)")
    for i, a, b in rows:
        show("%8d  %10d  %11d" % (i, a, b))
    used = set(first.values())
    assert used == {0, 1}, first  # spread over both ranks
    assert all(a == b for _, a, b in rows), rows  # prefix affinity per rank


@test(timeout=20)
def test_other_routes_and_client_header():
    s = STATE["s"]
    resp = send("/v1/completions", {"model": MODEL, "prompt": document(20), "max_tokens": 1},
                "dp-c1")
    assert s.by_rid("dp-c1")["header"] == str(worker_rank(resp))
    resp = send("/v1/messages", {"model": MODEL, "max_tokens": 1,
                                 "messages": [{"role": "user", "content": document(21)}]},
                "dp-m1")
    assert s.by_rid("dp-m1")["header"] == str(worker_rank(resp))
    # A client's own rank header is replaced by the router's choice.
    resp = send("/v1/chat/completions", h.chat_body(document(22), max_tokens=1), "dp-x1",
                headers=[("X-Data-Parallel-Rank", "7")])
    rec = s.by_rid("dp-x1")
    assert rec["header"] == str(worker_rank(resp)), rec
    # /v1/responses: the router picks a rank and sends the header; vLLM does not read it there.
    resp = send("/v1/responses", {"model": MODEL, "input": document(23), "max_output_tokens": 1},
                "dp-r1")
    rec = s.by_rid("dp-r1")
    assert rec["header"] == str(worker_rank(resp)), rec
    show("responses: router chose rank %s, header sent %s, the server ran it on engine %d "
         "(its own choice)" % (worker_rank(resp), rec["header"], rec["engine"]))


@test(timeout=20)
def test_explain_log_and_admin():
    s, r = STATE["s"], STATE["r"]
    x = request(r.admin_port, "POST", "/admin/route/explain",
                h.chat_body(document(3), max_tokens=1))
    assert x.status == 200, x.body[:300]
    e = x.json()
    assert e["choice"]["dp_rank"] in (0, 1), e["choice"]
    assert sorted(w["dp_rank"] for w in e["workers"]) == [0, 1], e["workers"]
    show("route/explain choice: worker %d rank %d" % (e["choice"]["worker"],
                                                     e["choice"]["dp_rank"]))
    lines = [ln for ln in r.stderr_lines() if " access: " in ln and "request_id=dp-a" in ln]
    assert len(lines) == 16, lines
    for ln in lines:
        m = re.search(r" worker=(\d+) .*dp_rank=(\d) ", ln)
        assert m and STATE["rank"][int(m.group(1))] == int(m.group(2)), ln
    show(lines[0].split(" access: ")[1])
    # POST /admin/workers with dp_size: one worker per rank; the same URL again is refused.
    other = DpServer(3)
    try:
        a = request(r.admin_port, "POST", "/admin/workers", {"url": other.url, "dp_size": 3})
        assert a.status == 201, a.body[:300]
        added = a.json()["workers"]
        assert [w["dp_rank"] for w in added] == [0, 1, 2], added
        again = request(r.admin_port, "POST", "/admin/workers", {"url": other.url})
        h.assert_openai_error(again, 400, "invalid_request_error")
        assert "already configured" in again.json()["error"]["message"], again.body
        bad = request(r.admin_port, "POST", "/admin/workers", {"url": other.url, "dp_size": 0})
        h.assert_openai_error(bad, 400, "invalid_request_error")
        for w in added:
            assert request(r.admin_port, "DELETE", "/admin/workers/%d" % w["id"]).status == 202
    finally:
        other.kill()


@test(timeout=20)
def test_reset_once_per_server():
    s, r = STATE["s"], STATE["r"]
    before = {w["id"]: w["index_blocks"] for w in r.workers()}
    assert all(v > 0 for v in before.values()), before  # both ranks learnt documents above
    x = request(r.admin_port, "POST", "/admin/reset_prefix_cache")
    assert x.status == 200, x.body[:300]
    rows = x.json()["workers"]
    assert len(rows) == 2 and all(w["ok"] for w in rows), rows
    assert s.resets == 1, s.resets  # one POST for the server's two ranks
    assert all(w["index_blocks_forgotten"] == before[w["id"]] for w in rows), (rows, before)
    assert all(w["index_blocks"] == 0 for w in r.workers())
    show("reset: %d POST /reset_prefix_cache for 2 ranks; forgotten %s" % (
        s.resets, [w["index_blocks_forgotten"] for w in rows]))


@test(timeout=20)
def test_whole_server_shows_engines():
    s = STATE["s"]
    with Cleanup() as c:
        r = c.add(Router([s.url], *FAST))
        wait_for(lambda: r.workers()[0].get("engines_seen") == 2, 5, "engines seen")
        w = r.workers()[0]
        assert w["dp_rank"] is None and w["dp_size"] is None, w
        assert "dp_size=2" in w["engines_hint"], w
        h.time.sleep(0.3)  # a few more scrapes: still one warning
        warn = [ln for ln in r.stderr_lines() if "engines (data-parallel ranks) served as one" in ln]
        assert len(warn) == 1, warn
        show(warn[0])
        # A whole server's requests carry no rank header: vLLM picks the engine.
        resp = request(r.port, "POST", "/v1/chat/completions",
                       h.chat_body(document(30), max_tokens=1),
                       headers=[("x-request-id", "dp-w1")])
        assert resp.status == 200
        assert s.by_rid("dp-w1")["header"] is None


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__, around=fleet))
