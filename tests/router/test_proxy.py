#!/usr/bin/env python3
"""Integration tests of `kvrouter serve` as a reverse proxy, through real processes.

Every test starts its own `kvrouter sim` workers (simulated vLLM) and `kvrouter serve` router on
127.0.0.1 with ephemeral ports, talks raw HTTP/1.1 over sockets (so framing, pipelining, truncation
and timing are visible), and stops what it started by PID (Cleanup). A test that needs to see the
exact request headers a worker received runs a tiny http.server upstream inside the test instead.

Run:  python3 tests/router/test_proxy.py --kvrouter build/kvrouter [-k substring] [-v]
Prints one line per test and a closing "N passed, M failed"; exits 1 when anything failed.
The harness (processes, raw HTTP client, SSE, runner) is tests/harness/kvrharness.py.
"""
import hashlib
import http.server
import json
import os
import re
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (FAST, MODEL, Cleanup, Conn, Router, Sim, assert_openai_error,  # noqa: E402
                        build_request, chat_body, check_all, closed_port, parse_prom_samples,
                        percentile, prom_value, request, sanitized, sse_event_times, sse_events,
                        token_events, wait_for)

# ---- a recording upstream for header inspection ----------------------------------------------------


class RecordingUpstream:
    """A tiny threaded http.server that records each request's headers and body and answers
    OpenAI-shaped JSON, with a set of hop-by-hop response headers the proxy must not forward, and
    its own X-Request-Id (the router must answer with exactly one, its own).
    GET /v1/status/NNN answers status NNN with no body; GET /metrics answers after metrics_delay
    seconds (a worker whose metrics page is slow)."""

    def __init__(self, metrics_delay=0.0):
        self.requests = []
        self.lock = threading.Lock()
        self.metrics_delay = metrics_delay
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if self.path == "/metrics":
                    time.sleep(outer.metrics_delay)
                    page = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                m = re.match(r"/v1/status/(\d{3})$", self.path)
                if m:
                    with outer.lock:
                        outer.requests.append({"method": self.command, "path": self.path,
                                               "headers": [], "body_len": len(body), "body_sha": ""})
                    self.send_response(int(m.group(1)))
                    self.send_header("X-Status-Test", "1")
                    self.end_headers()
                    return
                with outer.lock:
                    outer.requests.append({"method": self.command, "path": self.path,
                                           "headers": [(k.lower(), v) for k, v in self.headers.items()],
                                           "body_len": len(body),
                                           "body_sha": hashlib.sha256(body).hexdigest(),
                                           "peer": self.client_address[1]})
                out = json.dumps({"id": "cmpl-rec", "object": "chat.completion", "model": MODEL,
                                  "choices": [{"index": 0, "message": {"role": "assistant",
                                                                       "content": "ok"},
                                               "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                            "total_tokens": 4}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.send_header("Connection", "X-Resp-Hop")
                self.send_header("X-Resp-Hop", "must-not-pass")
                self.send_header("Keep-Alive", "timeout=9")
                self.send_header("Proxy-Authenticate", "Basic realm=x")
                self.send_header("Trailer", "X-Checksum")
                self.send_header("Upgrade", "h2c")
                self.send_header("X-Resp-Kept", "yes")
                self.send_header("X-Request-Id", "worker-own-id")
                self.end_headers()
                self.wfile.write(out)

            do_GET = _answer
            do_POST = _answer

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def kill(self):
        self.httpd.shutdown()
        self.httpd.server_close()



TESTS, test = h.registry()

RID = re.compile(r"^[0-9a-f]{32}$")  # a request id the router generated

# ---- the tests ---------------------------------------------------------------------------------------



@test(timeout=20)
def test_streaming_passthrough_timing():
    """The first SSE event reaches the client long before the worker finishes, and events arrive one
    by one as the worker produces them (no buffering until the end)."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(50, 40)))
        r = c.add(Router([sim], *FAST))
        n = 25  # 50 ms + 24 x 40 ms = ~1.0 s of generation
        t0 = time.monotonic()
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(max_tokens=n, stream=True))
        assert resp.status == 200 and resp.complete, resp
        assert resp.header("content-type", ).startswith("text/event-stream"), resp.headers
        events = sse_events(resp.body)
        assert events[-1] == "[DONE]", events[-3:]
        assert token_events(events) == n, (token_events(events), n)
        # When each token event arrived.
        arrivals = [t - t0 for t, _ in sse_event_times(resp)]
        first, last = arrivals[0], arrivals[-1]
        assert first < 0.4, "first event after %.3fs (worker TTFT is 0.05s)" % first
        assert last > 0.8, "stream finished after %.3fs, expected ~1s" % last
        assert last - first > 0.7, "events bunched: first %.3f last %.3f" % (first, last)
        median = percentile([b - a for a, b in zip(arrivals[:n], arrivals[1:n])], 50)
        assert median > 0.02, "median gap between events %.4fs: buffered, not streamed" % median


@test(timeout=20)
def test_labelled_request_and_token_metrics():
    """kvrouter_http_requests_total counts each response by code, route and worker (\"none\" when
    the router answered itself, probes excepted); a stream feeds the time-to-first-token and
    inter-token histograms; usage feeds the prompt and generation token counters."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(60, 20)))
        r = c.add(Router([sim], *FAST))
        body = chat_body(max_tokens=6, stream=True, stream_options={"include_usage": True})
        assert request(r.port, "POST", "/v1/chat/completions", body).status == 200
        assert request(r.port, "POST", "/v1/chat/completions", b"{bad").status == 400
        assert request(r.port, "GET", "/v1/models").status == 200
        assert request(r.port, "GET", "/health").status == 200
        m = h.parse_prom_samples(r.metrics_text())
        v = lambda name, **l: h.prom_value(m, name, **l)  # noqa: E731
        assert v("kvrouter_http_requests_total", code="200", route="chat_completions",
                 worker="0") == 1
        assert v("kvrouter_http_requests_total", code="400", route="chat_completions",
                 worker="none") == 1
        # GET /v1/models is the router's own union of the workers' lists (model: none named)
        assert v("kvrouter_http_requests_total", code="200", route="models", worker="none",
                 model="none") == 1
        assert v("kvrouter_http_requests_total") == 3, "probes are not requests"
        assert v("kvrouter_time_to_first_token_seconds_count") == 1
        ttft = v("kvrouter_time_to_first_token_seconds_sum")
        assert 0.05 <= ttft < 0.5, ttft
        assert v("kvrouter_inter_token_latency_seconds_count") == 5  # 6 tokens, 5 gaps
        itl = v("kvrouter_inter_token_latency_seconds_sum") / 5
        assert 0.01 <= itl < 0.1, itl
        assert v("kvrouter_generation_tokens_total") == 6
        assert v("kvrouter_prompt_tokens_total") > 0


@test(timeout=15)
def test_keepalive_several_requests_one_connection():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        conn = c.add(Conn(r.port))
        steps = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", chat_body()),
                 ("POST", "/v1/chat/completions", chat_body(stream=True)),
                 ("POST", "/v1/completions", {"model": MODEL, "prompt": "Once upon", "max_tokens": 4}),
                 ("GET", "/health", None), ("GET", "/v1/models", None)]
        for method, path, body in steps:
            conn.send(build_request(method, path, body))
            resp = conn.read_response(method)
            assert resp.status == 200 and resp.complete, (path, resp, resp.body[:200])
            assert (resp.header("connection") or "").lower() != "close", (path, resp.headers)
        assert not conn.eof


@test(timeout=15)
def test_pipelining_two_and_three_requests_in_order():
    """Requests written at once on one socket are all answered, in order, even when the first is
    the slowest."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(100, 20)))
        r = c.add(Router([sim], *FAST))
        conn = c.add(Conn(r.port))
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=10, stream=True))
                  + build_request("GET", "/v1/models")
                  + build_request("POST", "/v1/completions",
                                  {"model": MODEL, "prompt": "pipelined", "max_tokens": 3}))
        a = conn.read_response("POST")
        b = conn.read_response("GET")
        d = conn.read_response("POST")
        assert a.status == 200 and a.complete and b"chat.completion.chunk" in a.body, a
        assert token_events(sse_events(a.body)) == 10
        assert b.status == 200 and b.json()["object"] == "list", (b, b.body[:200])
        assert d.status == 200 and d.json()["object"] == "text_completion", (d, d.body[:200])
        # And two identical small requests in one write (the classic pair).
        conn.send(build_request("GET", "/v1/models") * 2)
        for _ in range(2):
            x = conn.read_response("GET")
            assert x.status == 200 and x.complete, x


@test(timeout=20)
def test_one_mib_prompt_passes_through():
    """A 1 MiB prompt reaches the worker byte for byte and is answered."""
    with Cleanup() as c:
        up = c.add(RecordingUpstream())
        sim = c.add(Sim("--max-model-len", "4000000", fixed=(5, 1)))
        r = c.add(Router([up], "--scrape-interval-ms", "0"))
        words = ("lorem ipsum dolor sit amet consectetur adipiscing elit " * 30000)
        prompt = words[: 1 << 20]
        body = json.dumps(chat_body(prompt, max_tokens=4)).encode()
        resp = request(r.port, "POST", "/v1/chat/completions", body, timeout=10)
        assert resp.status == 200, (resp, resp.body[:300])
        rec = up.requests[-1]
        assert rec["body_len"] == len(body), (rec["body_len"], len(body))
        assert rec["body_sha"] == hashlib.sha256(body).hexdigest(), "body altered in transit"
        # And through a real (simulated) worker, streamed.
        r2 = c.add(Router([sim], *FAST))
        resp = request(r2.port, "POST", "/v1/chat/completions",
                       chat_body(prompt, max_tokens=4, stream=True), timeout=15)
        assert resp.status == 200 and resp.complete, (resp, resp.body[:300])
        assert token_events(sse_events(resp.body)) == 4


def _bad(port, raw, status, close=True, timeout=3.0):
    """Sends raw bytes; expects an OpenAI-style error with status and (by default) a close."""
    conn = Conn(port, timeout=timeout)
    try:
        try:
            conn.send(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the router may answer and close before reading everything
        resp = conn.read_response()
        assert_openai_error(resp, status)
        rid = resp.header_all("x-request-id")  # rejected before any handler, still tagged
        assert len(rid) == 1 and RID.match(rid[0]), resp.headers
        if close:
            assert conn.closed_by_peer(2.0), "connection left open after %d" % status
        return resp
    finally:
        conn.close()


@test(timeout=40)
def test_bad_requests_rejected_with_status_and_close():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST, "--max-body-bytes", "2097152"))
        p = r.port
        get = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
        post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        big = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"v" * 1000) for i in range(40))
        many = b"".join(b"X-F-%d: v\r\n" % i for i in range(101))
        ok = b"".join(b"X-F-%d: v\r\n" % i for i in range(99))

        def fields_100_ok():
            # 99 + Host = 100 fields is still fine. /health is answered by the router itself: a
            # proxied request would reach the sim with the router's X-Forwarded-For and curl's
            # Accept added, over the sim's own 100-field limit.
            conn = Conn(p)
            try:
                conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\n" + ok + b"\r\n")
                assert conn.read_response().status == 200
            finally:
                conn.close()

        def body_413_before_reading():
            t0 = time.monotonic()
            _bad(p, post + b"Content-Type: application/json\r\nContent-Length: 3145728\r\n\r\n", 413)
            assert time.monotonic() - t0 < 1.5, "413 only after %.2fs" % (time.monotonic() - t0)

        def upgrade_501():
            resp = _bad(p, get + b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
                        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
                        501)
            assert resp.header("upgrade") is None

        cases = [
            ("garbage request line", lambda: _bad(p, b"GARBAGE\r\n\r\n", 400)),
            ("header line without colon", lambda: _bad(p, get + b"this is not a header\r\n\r\n", 400)),
            ("unsupported HTTP version -> 505",
             lambda: _bad(p, b"GET /v1/models HTTP/9.7\r\nHost: x\r\n\r\n", 505)),
            ("bare LF line ends", lambda: _bad(p, b"GET /v1/models HTTP/1.1\nHost: x\n\n", 400)),
            ("CR inside a header value", lambda: _bad(p, get + b"X-A: a\rb\r\n\r\n", 400)),
            ("space in header name", lambda: _bad(p, get + b"Bad Name: v\r\n\r\n", 400)),
            ("space before colon", lambda: _bad(p, get + b"BadName : v\r\n\r\n", 400)),
            ("request line over 8 KiB -> 414",
             lambda: _bad(p, b"GET /v1/models?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414)),
            ("headers over 32 KiB -> 431", lambda: _bad(p, get + big + b"\r\n", 431)),
            ("101 header fields -> 431", lambda: _bad(p, get + many + b"\r\n", 431)),
            ("100 header fields accepted", fields_100_ok),
            ("body over --max-body-bytes -> 413 before the body", body_413_before_reading),
            ("Transfer-Encoding with Content-Length",
             lambda: _bad(p, post + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"5\r\nhello\r\n0\r\n\r\n", 400)),
            ("two different Content-Length",
             lambda: _bad(p, post + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400)),
            ("negative Content-Length", lambda: _bad(p, post + b"Content-Length: -1\r\n\r\n", 400)),
            ("Upgrade: websocket -> 501", upgrade_501),
            ("CONNECT -> 405",
             lambda: _bad(p, b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n", 405)),
        ]
        check_all(cases)
        assert request(p, "GET", "/v1/models").status == 200, "router not serving after bad input"


@test(timeout=15)
def test_slow_headers_get_408():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST, "--header-timeout-ms", "300"))
        conn = c.add(Conn(r.port))
        t0 = time.monotonic()
        conn.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        resp = conn.read_response()
        dt = time.monotonic() - t0
        assert_openai_error(resp, 408)
        assert 0.25 < dt < 2.0, "408 after %.3fs with a 300 ms header timeout" % dt
        assert conn.closed_by_peer(2.0)
        # A slow body (headers complete, body stalls) is cut too.
        conn2 = c.add(Conn(r.port))
        conn2.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        assert_openai_error(conn2.read_response(), 408)


@test(timeout=15)
def test_openai_validation_errors():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        p = r.port
        cases = [
            ("/v1/chat/completions", b"{not json"),
            ("/v1/chat/completions", b""),
            ("/v1/chat/completions", b"[1,2,3]"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),  # no model
            ("/v1/chat/completions", {"model": MODEL}),  # no messages
            ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}),
            ("/v1/chat/completions", {"model": MODEL, "messages": []}),
            ("/v1/chat/completions", chat_body(max_tokens="ten")),
            ("/v1/completions", {"model": MODEL}),  # no prompt
            ("/v1/completions", {"prompt": "hi"}),  # no model
            ("/v1/completions", {"model": MODEL, "prompt": 42}),
            ("/v1/completions", {"model": MODEL, "prompt": []}),
        ]

        def one(path, body):
            resp = request(p, "POST", path, body)
            err = assert_openai_error(resp, 400, "invalid_request_error")
            assert err["code"] is None or isinstance(err["code"], str), err

        check_all([("%s %s" % (path, json.dumps(body) if not isinstance(body, bytes) else body),
                     lambda path=path, body=body: one(path, body)) for path, body in cases])
        # None of them reached the worker.
        m = sim.metrics()
        assert prom_value(m, "vllm:request_success_total") == 0
        # Wrong methods and unknown routes are errors of the same shape.
        r405 = request(p, "GET", "/v1/chat/completions")
        assert_openai_error(r405, 405)
        assert r405.header("allow") == "POST", r405.headers  # RFC 9110: a 405 names what is allowed
        assert_openai_error(request(p, "GET", "/nope"), 404)
        r405 = request(p, "POST", "/health")
        assert_openai_error(r405, 405)
        assert r405.header("allow") == "GET, HEAD", r405.headers


@test(timeout=15)
def test_no_usable_worker_503_with_retry_after():
    with Cleanup() as c:
        dead = "http://127.0.0.1:%d" % closed_port()
        r = c.add(Router([dead], *FAST, "--fail-threshold", "1", "--retry-after-s", "2"))
        statuses = []
        for _ in range(4):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            statuses.append(resp.status)
            if resp.status == 503:
                assert_openai_error(resp, 503)
                assert resp.header("retry-after") == "2", resp.headers
                break
            assert_openai_error(resp, 502)
        assert statuses[-1] == 503, statuses
        assert request(r.port, "GET", "/health").status == 503


@test(timeout=15)
def test_refusing_worker_retried_once_on_another_then_502():
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin", "--fail-threshold", "100"))
        ids = {w["url"]: str(w["id"]) for w in r.workers()}
        a.fault("refuse")
        for _ in range(4):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            assert resp.status == 200, (resp, resp.body[:200])
            assert resp.header("x-kvrouter-worker") == ids[b.url], resp.headers
        m = parse_prom_samples(r.metrics_text())
        retried = prom_value(m, "kvrouter_worker_retries_total", worker=ids[a.url])
        assert retried >= 1, "no retry recorded on the refusing worker"
        b.fault("refuse")
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
        assert_openai_error(resp, 502)


@test(timeout=15)
def test_silent_worker_first_byte_timeout_504():
    with Cleanup() as c:
        sim = c.add(Sim("--fault", "hang"))
        r = c.add(Router([sim], *FAST, "--first-byte-timeout-ms", "400"))
        for stream in (False, True):
            t0 = time.monotonic()
            try:
                resp = request(r.port, "POST", "/v1/chat/completions", chat_body(stream=stream),
                               timeout=2.5)
            except socket.timeout:
                raise AssertionError("no answer within 2.5 s (stream=%s) with a 400 ms first-byte "
                                     "timeout" % stream)
            dt = time.monotonic() - t0
            assert_openai_error(resp, 504)
            assert RID.match(resp.header("x-request-id") or ""), resp.headers
            assert 0.35 < dt < 2.0, "504 after %.3fs with a 400 ms first-byte timeout" % dt


@test(timeout=30)
def test_hung_worker_first_byte_timeout_retried_elsewhere():
    """A worker that takes requests and never answers (hung): a request that got no byte within the
    first-byte timeout is sent whole to the other worker (nothing of it reached the client; issue
    36), streamed or not, and answered there; a Responses follow-up pinned to the hung worker,
    which stored its previous response, is not (no other worker holds that response): 504."""
    with Cleanup() as c:
        env = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
        a, b = c.add(Sim(env=env)), c.add(Sim(env=env))
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin", "--worker-header", "true",
                         "--first-byte-timeout-ms", "400", "--fail-threshold", "100",
                         "--outlier-consecutive-failures", "0"))
        ids = {w["url"]: str(w["id"]) for w in r.workers()}
        stored = {}
        for i in range(2):  # round robin: one stored response on each worker
            resp = request(r.port, "POST", "/v1/responses",
                           {"model": MODEL, "input": "turn one of session %d" % i,
                            "max_output_tokens": 2})
            assert resp.status == 200, resp.body[:300]
            stored[resp.header("x-kvrouter-worker")] = json.loads(resp.body)["id"]
        assert set(stored) == set(ids.values()), stored
        a.fault("hang")
        for stream in (False, True, False, True):
            t0 = time.monotonic()
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body(stream=stream),
                           timeout=5)
            assert resp.status == 200, (stream, resp.status, resp.body[:300])
            assert resp.header("x-kvrouter-worker") == ids[b.url], resp.headers
            assert time.monotonic() - t0 < 3.0
        m = parse_prom_samples(r.metrics_text())
        retried = prom_value(m, "kvrouter_worker_retries_total", worker=ids[a.url])
        # round robin's turn moves with every decision, a retry's too: a got at least every other
        assert 2 <= retried <= 4, retried
        resp = request(r.port, "POST", "/v1/responses",
                       {"model": MODEL, "input": "turn two", "max_output_tokens": 2,
                        "previous_response_id": stored[ids[a.url]]}, timeout=5)
        assert_openai_error(resp, 504)
        assert resp.header("x-kvrouter-worker") in (None, ids[a.url]), resp.headers
        a.fault("none")


@test(timeout=15)
def test_worker_dies_mid_stream():
    """A stream cut by the worker ends with an SSE error event and a clean end; a non-streaming
    request to a worker that dies gets 502."""
    with Cleanup() as c:
        sim = c.add(Sim("--fault", "disconnect", "--fault-after-tokens", "5"))
        r = c.add(Router([sim], *FAST, "--fail-threshold", "100"))
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(max_tokens=50, stream=True))
        assert resp.status == 200, resp
        assert resp.complete, "stream truncated without a clean end: %r" % resp.body[-200:]
        events = sse_events(resp.body)
        assert token_events(events) == 5, events
        assert events[-1] == "[DONE]", events[-2:]
        err = json.loads(events[-2])
        assert isinstance(err.get("error"), dict) and err["error"].get("message"), err
        assert not any('"finish_reason":"length"' in e for e in events), "looks like success"
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(max_tokens=50))
        assert_openai_error(resp, 502)


@test(timeout=15)
def test_client_disconnect_aborts_upstream():
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(10, 20)))
        r = c.add(Router([sim], *FAST))
        conn = Conn(r.port)
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=3000, stream=True)))
        got = b""
        while len(sse_events(got)) < 3:
            got += conn.read_some(4096)
        running = prom_value(sim.metrics(), "vllm:num_requests_running")
        assert running == 1, running
        conn.close()
        wait_for(lambda: prom_value(sim.metrics(), "vllm:num_requests_running") == 0, 1.0,
                 "the worker to stop generating")
        aborted = prom_value(sim.metrics(), "vllm:request_success_total", finished_reason="abort")
        assert aborted == 1, aborted
        wait_for(lambda: all(w["in_flight"] == 0 for w in r.workers()), 1.0,
                 "the router's in-flight count to drop")


@test(timeout=15)
def test_hop_by_hop_headers_xff_and_authorization():
    with Cleanup() as c:
        up = c.add(RecordingUpstream())
        r = c.add(Router([up], "--scrape-interval-ms", "0"))
        hdrs = [("Connection", "keep-alive, X-Hop-Named"), ("X-Hop-Named", "secret"),
                ("Keep-Alive", "timeout=5"), ("TE", "trailers"), ("Trailer", "X-Checksum"),
                ("Proxy-Authorization", "Basic Zm9vOmJhcg=="), ("Proxy-Foo", "bar"),
                ("Authorization", "Bearer sk-test-123"), ("X-Forwarded-For", "10.1.2.3"),
                ("X-Custom", "kept")]
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(), headers=hdrs)
        assert resp.status == 200, (resp, resp.body[:200])
        got = dict(up.requests[-1]["headers"])
        for hdr in ("x-hop-named", "keep-alive", "te", "trailer", "proxy-authorization", "proxy-foo",
                  "upgrade"):
            assert hdr not in got, "hop-by-hop request header %s forwarded: %r" % (hdr, got)
        assert "x-hop-named" not in (got.get("connection") or "").lower(), got
        assert got.get("authorization") == "Bearer sk-test-123", got
        assert got.get("x-custom") == "kept", got
        assert got.get("x-forwarded-for") == "10.1.2.3, 127.0.0.1", got.get("x-forwarded-for")
        # Without an incoming X-Forwarded-For the router adds the client's address.
        request(r.port, "POST", "/v1/chat/completions", chat_body())
        assert dict(up.requests[-1]["headers"]).get("x-forwarded-for") == "127.0.0.1"
        # Response side: the worker's hop-by-hop headers stay between worker and router.
        names = {n for n, _ in resp.headers}
        for hdr in ("x-resp-hop", "keep-alive", "proxy-authenticate", "trailer", "upgrade"):
            assert hdr not in names, "hop-by-hop response header %s forwarded: %r" % (hdr, resp.headers)
        assert "x-resp-hop" not in (resp.header("connection") or "").lower()
        assert resp.header("x-resp-kept") == "yes", resp.headers


@test(timeout=30)
def test_slow_client_backpressure_bounded_memory():
    """A client that does not read a fast, long stream: the router's RSS stays bounded while the
    worker produces far more than the bound, and the whole stream arrives intact once read."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(0, 0.002)))
        # ASan keeps freed memory in quarantine, which would look like growth; keep it small (1 MiB).
        env = {"ASAN_OPTIONS": (os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=1").lstrip(":")}
        r = c.add(Router([sim], *FAST, env=env))
        warm = request(r.port, "POST", "/v1/chat/completions", chat_body(max_tokens=2000, stream=True),
                       timeout=10)  # warms up allocations; gives the bytes per token
        per_token = len(warm.body) / 2000.0
        base = r.rss_kib()
        n = 100000
        want = 12 << 20  # bytes the worker must push while the client is not reading
        gen0 = prom_value(sim.metrics(), "vllm:generation_tokens_total")
        conn = c.add(Conn(r.port, timeout=10, rcvbuf=4096))
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=n, stream=True)))
        peak = base
        produced = 0
        t_end = time.monotonic() + 6.0
        while time.monotonic() < t_end and produced * per_token < want:  # not reading at all
            peak = max(peak, r.rss_kib())
            time.sleep(0.05)
            produced = prom_value(sim.metrics(), "vllm:generation_tokens_total") - gen0
        assert produced * per_token >= want, (
            "the worker produced only %.1f MiB in 6 s while the client was not reading" %
            (produced * per_token / (1 << 20)))
        for _ in range(5):  # hold a little longer at the bound
            peak = max(peak, r.rss_kib())
            time.sleep(0.05)
        # Then read slowly for a while (into the client's own buffer), then at full speed.
        t_end = time.monotonic() + 0.5
        while time.monotonic() < t_end:
            conn._fill(8192)
            peak = max(peak, r.rss_kib())
            time.sleep(0.01)
        conn.sock.settimeout(20)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)

        got = {"bytes": 0, "next": 1 << 20}

        def on_data(d, t):
            nonlocal peak
            got["bytes"] += len(d)
            if got["bytes"] >= got["next"]:  # sample RSS once per MiB read
                got["next"] += 1 << 20
                peak = max(peak, r.rss_kib())

        resp = conn.read_response("POST", on_data=on_data)
        assert resp.status == 200 and resp.complete, resp
        events = sse_events(resp.body)
        assert events[-1] == "[DONE]" and token_events(events) == n, (token_events(events), n)
        growth = peak - base
        print("    router RSS growth %d KiB (peak %d, base %d)" % (growth, peak, base))
        # The README's bound for one slow stream: 256 KiB waiting for the client socket + one curl
        # buffer (16 KiB) + the SSE line being assembled + up to 1 MiB of answer text for the cache
        # index, about 1.3 MiB (measured: 1,092-1,200 KiB growth). 2 MiB leaves room for the
        # allocator's rounding; a proxy without back-pressure grows by the 12 MiB pushed. Under
        # ASan the 1 MiB quarantine set above and its allocator add to it (measured: ~3,650 KiB;
        # with a 4 MiB quarantine ~7,700 KiB, which once crossed the bound in CI).
        bound_kib = (8 if sanitized() else 2) * 1024
        assert growth < bound_kib, "router RSS grew by %d KiB while the worker pushed %.1f MiB" % (
            growth, produced * per_token / (1 << 20))


@test(timeout=15)
def test_worker_header_health_and_models():
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin", "--fail-threshold", "1"))
        ids = {str(w["id"]) for w in r.workers()}
        seen = set()
        for _ in range(4):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            assert resp.status == 200
            seen.add(resp.header("x-kvrouter-worker"))
        assert seen == ids, (seen, ids)
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(stream=True))
        assert resp.header("x-kvrouter-worker") in ids
        m = request(r.port, "GET", "/v1/models")
        assert m.status == 200 and m.json()["data"][0]["id"] == MODEL, m.body[:200]
        h = request(r.port, "GET", "/health")
        assert h.status == 200, h
        a.fault("refuse")
        b.fault("refuse")
        wait_for(lambda: request(r.port, "GET", "/health").status == 503, 3.0,
                 "/health to turn 503 with every worker down")
        assert_openai_error(request(r.port, "POST", "/v1/chat/completions", chat_body()), 503)
        a.fault("none")
        wait_for(lambda: request(r.port, "GET", "/health").status == 200, 3.0,
                 "/health to recover when a worker is back")


@test(timeout=15)
def test_proxy_environment_variables_ignored():
    # A router whose environment names an HTTP proxy (as pods behind an egress proxy have) still
    # reaches its workers directly: the "proxy" here is a listening socket that must see no
    # connection, while requests, the worker's scrape and /v1/models all work.
    with Cleanup() as c, socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(16)
        trap.settimeout(0.0)
        url = "http://127.0.0.1:%d" % trap.getsockname()[1]
        env = {k: url for k in ("http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                "all_proxy")}
        env.update(no_proxy="", NO_PROXY="")
        a = c.add(Sim())
        r = c.add(Router([a], *FAST, env=env))
        for stream in (False, True):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body(stream=stream))
            assert resp.status == 200, (resp.status, resp.body[:200])
        assert request(r.port, "GET", "/v1/models").status == 200
        wait_for(lambda: r.workers()[0]["scraped"].get("fresh") is True, 3.0,
                 "a scrape of the worker")
        try:
            trap.accept()[0].close()
        except BlockingIOError:
            return
        raise AssertionError("the router connected to the proxy named in its environment")


@test(timeout=15)
def test_access_log_one_line_per_request_without_prompt():
    secret = "TOPSECRET-PROMPT-7f3a9"
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))

        def access_lines():
            return [ln for ln in r.stderr_lines() if re.search(r"\baccess\b", ln)]

        before = len(access_lines())
        reqs = [("POST", "/v1/chat/completions", chat_body(secret + " please", stream=True), 200),
                ("POST", "/v1/chat/completions", chat_body(secret + " again"), 200),
                ("POST", "/v1/completions", {"model": MODEL, "prompt": secret, "max_tokens": 2}, 200),
                ("GET", "/v1/models", None, 200),
                ("POST", "/v1/chat/completions", '{"model": "%s", "messages": [' % secret, 400),
                ("GET", "/nope", None, 404)]
        for method, path, body, status in reqs:
            resp = request(r.port, method, path, body)
            assert resp.status == status, (path, resp)
            # Probes between them write no line (test_probes_not_counted_nor_logged).
            assert request(r.port, "GET", "/health").status == 200
        lines = wait_for(lambda: len(access_lines()) >= before + len(reqs) and access_lines(), 2.0,
                         "one access-log line per request")
        new = lines[before:]
        assert len(new) == len(reqs), "%d access lines for %d requests:\n%s" % (
            len(new), len(reqs), "\n".join(new))
        for (method, path, _, status), line in zip(reqs, new):
            assert path in line and str(status) in line, (path, status, line)
            assert re.search(r" request_id=[0-9a-f]{32}$", line), line
        leaked = [ln for ln in r.stderr_lines() if secret in ln]
        assert not leaked, "prompt text in the router's log: %r" % leaked[:2]


@test(timeout=20)
def test_slow_client_not_cut_by_idle_timeout():
    """A client that stops reading for longer than --idle-timeout-ms while the worker keeps
    producing: the worker is not idle (the router paused it), so the stream must complete intact."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(0, 0.01)))
        r = c.add(Router([sim], *FAST, "--idle-timeout-ms", "500"))
        n = 30000
        conn = c.add(Conn(r.port, timeout=10, rcvbuf=4096))
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=n, stream=True)))
        time.sleep(1.5)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)  # now read fast
        resp = conn.read_response("POST")
        assert resp.status == 200 and resp.complete, resp
        events = sse_events(resp.body)
        assert events[-1] == "[DONE]", events[-1:]
        assert not any(e.startswith('{"error"') for e in events), \
            "stream cut: %s" % [e for e in events if e.startswith('{"error"')][0][:200]
        assert token_events(events) == n, (token_events(events), n)


@test(timeout=20)
def test_idle_timeout_mid_stream_and_steady_stream_not_cut():
    """The idle timeout (--idle-timeout-ms 300) counts from the worker's last data: a worker that
    goes silent after the first token is cut ~300 ms later (an SSE error event, a clean end, outcome
    stream_idle_timeout); a stream whose events come every 100 ms runs 1.5 s, five idle timeouts
    long, and completes. The router re-arms its idle timer lazily (not on every event), so the
    second case is what shows a late re-arm never cuts a live stream."""
    with Cleanup() as c:
        stalled = c.add(Sim("--fault", "slow", "--fault-delay-ms", "3000", fixed=(0, 10)))
        steady = c.add(Sim(fixed=(0, 100)))
        r1 = c.add(Router([stalled], *FAST, "--idle-timeout-ms", "300",
                          "--first-byte-timeout-ms", "5000"))
        t0 = time.monotonic()
        resp = request(r1.port, "POST", "/v1/chat/completions",
                       chat_body(max_tokens=5, stream=True), timeout=10)
        dt = time.monotonic() - t0
        assert resp.status == 200 and resp.complete, resp
        events = sse_events(resp.body)
        assert token_events(events) == 1, events
        err = json.loads(events[-2])
        assert "idle timeout" in err["error"]["message"], err
        assert events[-1] == "[DONE]", events[-1:]
        # bounds: not before the timeout; well before the worker's next token (3 s)
        assert 0.29 < dt < 2.0, "cut after %.3f s with a 300 ms idle timeout" % dt
        r1.wait_line(r"outcome=stream_idle_timeout")

        r2 = c.add(Router([steady], *FAST, "--idle-timeout-ms", "300"))
        t0 = time.monotonic()
        resp = request(r2.port, "POST", "/v1/chat/completions",
                       chat_body(max_tokens=15, stream=True), timeout=10)
        dt = time.monotonic() - t0
        events = sse_events(resp.body)
        assert resp.status == 200 and resp.complete, resp
        assert not any(e.startswith('{"error"') for e in events), events[-3:]
        assert token_events(events) == 15 and events[-1] == "[DONE]", events[-3:]
        assert dt > 1.3, "the stream took %.3f s, not the 1.4 s of 15 tokens 100 ms apart" % dt


@test(timeout=15)
def test_worker_error_status_passes_through():
    """A worker's own error answer (status and body) reaches the client unchanged, not retried."""
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        sim.fault("error", status=503)
        direct = request(sim.port, "POST", "/v1/chat/completions", chat_body())
        via = request(r.port, "POST", "/v1/chat/completions", chat_body())
        assert via.status == direct.status == 503, (via, direct)
        assert via.body == direct.body, (via.body[:200], direct.body[:200])
        assert via.header("x-kvrouter-worker") is not None
        sim.fault("none")
        # A worker-side validation error (context too long) passes through too.
        direct = request(sim.port, "POST", "/v1/chat/completions", chat_body(max_tokens=10 ** 7))
        via = request(r.port, "POST", "/v1/chat/completions", chat_body(max_tokens=10 ** 7))
        assert via.status == direct.status and via.status >= 400, (via, direct)
        assert via.json() == direct.json(), (via.body[:200], direct.body[:200])


@test(timeout=15)
def test_query_string_and_chunked_request_body():
    with Cleanup() as c:
        up = c.add(RecordingUpstream())
        r = c.add(Router([up], "--scrape-interval-ms", "0"))
        body = json.dumps(chat_body("chunked " * 500)).encode()
        parts = [body[:100], body[100:1500], body[1500:]]
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(x), x) for x in parts) + b"0\r\n\r\n"
        conn = c.add(Conn(r.port))
        conn.send(b"POST /v1/chat/completions?api-version=2024-01&x=%2F HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        resp = conn.read_response("POST")
        assert resp.status == 200, (resp, resp.body[:200])
        rec = up.requests[-1]
        assert rec["path"] == "/v1/chat/completions?api-version=2024-01&x=%2F", rec["path"]
        assert rec["body_len"] == len(body) and rec["body_sha"] == hashlib.sha256(body).hexdigest()
        got = dict(rec["headers"])
        assert "transfer-encoding" not in got or got.get("content-length") is None, got


@test(timeout=15)
def test_max_connections_and_keepalive_timeout():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST, "--max-connections", "2", "--keepalive-timeout-ms", "400"))
        a = c.add(Conn(r.port))
        b = c.add(Conn(r.port))
        for x in (a, b):
            x.send(build_request("GET", "/v1/models"))
            resp = x.read_response()
            assert resp.status == 200, resp
        third = c.add(Conn(r.port))
        third.send(build_request("GET", "/v1/models"))
        assert_openai_error(third.read_response(), 503)
        assert third.closed_by_peer(2.0)
        # The idle ones are closed after the keep-alive timeout, which frees the slots.
        t0 = time.monotonic()
        assert a.closed_by_peer(3.0) and b.closed_by_peer(3.0), "idle connections not closed"
        dt = time.monotonic() - t0
        assert dt < 1.5, "idle connection closed after %.2fs with a 400 ms keep-alive timeout" % dt
        wait_for(lambda: request(r.port, "GET", "/v1/models").status == 200, 1.0,
                 "a connection slot to be free again")


@test(timeout=15)
def test_client_disconnect_before_first_byte_aborts_upstream():
    with Cleanup() as c:
        sim = c.add(Sim("--fault", "hang"))
        r = c.add(Router([sim], *FAST))
        for stream in (False, True):
            before = prom_value(sim.metrics(), "vllm:request_success_total", finished_reason="abort")
            conn = Conn(r.port)
            conn.send(build_request("POST", "/v1/chat/completions", chat_body(stream=stream)))
            # Close only once the worker holds the request (a hung one counts as running): a
            # client gone before the router forwarded it leaves the worker nothing to abort, and a
            # loaded machine can take longer than any fixed sleep to forward it.
            wait_for(lambda: prom_value(sim.metrics(), "vllm:num_requests_running") == 1, 5.0,
                     "the worker to hold the request (stream=%s)" % stream)
            conn.close()
            wait_for(lambda: prom_value(sim.metrics(), "vllm:request_success_total",
                                        finished_reason="abort") == before + 1, 1.0,
                     "the worker to see the abort (stream=%s)" % stream)
        wait_for(lambda: all(w["in_flight"] == 0 for w in r.workers()), 1.0, "in_flight 0")


@test(timeout=20)
def test_many_concurrent_streams_complete():
    with Cleanup() as c:
        sims = [c.add(Sim(fixed=(20, 5))) for _ in range(2)]
        r = c.add(Router(sims, *FAST, "--policy", "least_load"))
        n, k = 40, 20
        results = [None] * k

        def one(i):
            try:
                resp = request(r.port, "POST", "/v1/chat/completions",
                               chat_body("client %d says hello" % i, max_tokens=n, stream=True),
                               timeout=10)
                ev = sse_events(resp.body)
                results[i] = (resp.status, resp.complete, token_events(ev), ev[-1] if ev else None,
                              resp.header("x-kvrouter-worker"))
            except Exception as e:  # reported below
                results[i] = repr(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        bad = [x for x in results if not (isinstance(x, tuple) and x[:4] == (200, True, n, "[DONE]"))]
        assert not bad, bad[:3]
        assert len({x[4] for x in results}) == 2, "all streams on one worker with least_load"
        wait_for(lambda: all(w["in_flight"] == 0 for w in r.workers()), 1.0, "in_flight 0")


@test(timeout=15)
def test_connection_semantics_close_head_chunked_limits():
    """Connection: close is honoured; a bad request pipelined after a good one gets the good answer
    first, then 400 and a close; a chunked body over --max-body-bytes is refused with 413; a
    non-streaming answer larger than --response-buffer-bytes still arrives whole; HEAD works where
    GET does (RFC 9110 9.3.2)."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(0, 0)))
        r = c.add(Router([sim], *FAST, "--max-body-bytes", "100000", "--response-buffer-bytes", "1000"))

        def conn_close():
            conn = Conn(r.port)
            try:
                conn.send(build_request("GET", "/v1/models", headers=[("Connection", "close")]))
                resp = conn.read_response()
                assert resp.status == 200 and (resp.header("connection") or "").lower() == "close"
                assert conn.closed_by_peer(1.0), "not closed after Connection: close"
            finally:
                conn.close()

        def pipelined_good_then_bad():
            conn = Conn(r.port)
            try:
                conn.send(build_request("GET", "/v1/models") + b"BROKEN\r\n\r\n")
                assert conn.read_response().status == 200
                assert_openai_error(conn.read_response(), 400)
                assert conn.closed_by_peer(1.0)
            finally:
                conn.close()

        def chunked_over_limit():
            conn = Conn(r.port)
            try:
                conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n")
                try:
                    for _ in range(40):  # 160 KiB in 4 KiB chunks
                        conn.send(b"1000\r\n" + b"a" * 4096 + b"\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                assert_openai_error(conn.read_response(), 413)
            finally:
                conn.close()

        def big_non_streaming():
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body(max_tokens=600))
            assert resp.status == 200 and resp.complete and len(resp.body) > 1000, resp
            assert resp.json()["usage"]["completion_tokens"] == 600

        def head_models():
            direct = request(sim.port, "HEAD", "/v1/models")
            via = request(r.port, "HEAD", "/v1/models")
            assert via.status == direct.status == 200, (via, direct)
            assert via.body == b""
            # The size a GET would return (RFC 9110 9.3.2), as the worker said, not 0.
            n = int(direct.header("content-length"))
            assert n > 0 and via.header_all("content-length") == [str(n)], (
                direct.header("content-length"), via.header_all("content-length"))
            assert n == len(request(r.port, "GET", "/v1/models").body)

        check_all([("Connection: close", conn_close),
                    ("good then malformed, pipelined", pipelined_good_then_bad),
                    ("chunked body over the limit -> 413", chunked_over_limit),
                    ("answer over --response-buffer-bytes", big_non_streaming),
                    ("HEAD /v1/models", head_models)])


@test(timeout=20)
def test_idle_upstream_connection_not_reused_past_max_idle():
    """A pooled worker connection is reused while it is fresh and replaced once it has been idle
    longer than 4 s (vLLM's server closes idle connections after 5 s: writing a request into one
    it is closing fails)."""
    up = RecordingUpstream()
    with Cleanup() as c:
        c.add(up)
        r = c.add(Router([up.url], "--scrape-interval-ms", "0"))

        def ask():
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body(stream=False))
            assert resp.status == 200, resp.status
            return up.requests[-1]["peer"]

        first = ask()
        time.sleep(0.3)
        assert ask() == first, "a fresh idle connection was not reused"
        time.sleep(4.6)
        assert ask() != first, "a connection idle for 4.6 s was reused"


@test(timeout=15)
def test_paths_are_forwarded_verbatim_or_refused():
    """The router either forwards the request-target byte for byte or refuses it: targets that
    curl or a worker could resolve to another path (dot segments, plain or percent-encoded,
    backslashes) are 400, and nothing outside /v1/ reaches a worker."""
    with Cleanup() as c:
        up = c.add(RecordingUpstream())
        r = c.add(Router([up], "--scrape-interval-ms", "0"))
        refused = ["/v1/../metrics", "/v1/./models", "/v1/models/..", "/v1/models/.",
                   "/v1/%2e%2e/metrics", "/v1/%2E./admin", "/v1/.%2e/x", "/v1/models/%2e"]
        not_found = ["//v1/models", "/v1", "/metrics", "/admin/workers", "/v2/models",
                     "http://127.0.0.1:1/v1/models"]
        verbatim = ["/v1/models", "/v1/mo%64els", "/v1/models?x=/../y&z=%2e%2e",
                    "/v1/models;param", "/v1/models/...", "/v1/models/..x", "/v1/embeddings"]

        def expect(target, statuses):
            n0 = len(up.requests)
            conn = Conn(r.port)
            try:
                conn.send(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % target).encode())
                resp = conn.read_response()
            finally:
                conn.close()
            assert resp.status in statuses, "%s -> %d %r" % (target, resp.status, resp.body[:120])
            forwarded = [x["path"] for x in up.requests[n0:]]
            return resp, forwarded

        cases = []
        for t in refused:
            def f(t=t):
                resp, fwd = expect(t, (400,))
                assert_openai_error(resp, 400)
                assert not fwd, "%s forwarded as %r" % (t, fwd)
            cases.append(("refused " + t, f))
        for t in not_found:
            def f(t=t):
                resp, fwd = expect(t, (400, 404))
                assert not fwd, "%s forwarded as %r" % (t, fwd)
            cases.append(("not routed " + t, f))
        for t in verbatim:
            def f(t=t):
                resp, fwd = expect(t, (200,))
                assert fwd == [t], "%s reached the worker as %r" % (t, fwd)
            cases.append(("verbatim " + t, f))
        check_all(cases)


class Blackhole:
    """A loopback port whose accept queue is full: connects to it neither succeed nor get refused
    (the SYNs are dropped), which is how a frozen worker host looks to the router."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.fillers = []
        for _ in range(3):  # fill the accept queue (never accepted)
            f = socket.socket()
            f.setblocking(False)
            try:
                f.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            self.fillers.append(f)
        time.sleep(0.05)

    def kill(self):
        for f in self.fillers + [self.sock]:
            f.close()


@test(timeout=15)
def test_connect_timeout_retried_on_another_worker():
    with Cleanup() as c:
        hole = c.add(Blackhole())
        sim = c.add(Sim())
        r = c.add(Router([hole.url, sim], *FAST, "--policy", "round_robin", "--fail-threshold", "100",
                         "--connect-timeout-ms", "300"))
        ids = {w["url"]: str(w["id"]) for w in r.workers()}
        for _ in range(2):  # one of the two goes to the black hole first
            t0 = time.monotonic()
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            assert resp.status == 200, (resp, resp.body[:200])
            assert resp.header("x-kvrouter-worker") == ids[sim.url]
            assert time.monotonic() - t0 < 2.0
        m = parse_prom_samples(r.metrics_text())
        assert prom_value(m, "kvrouter_worker_retries_total", worker=ids[hole.url]) >= 1


@test(timeout=15)
def test_slow_metrics_page_does_not_mark_worker_down():
    with Cleanup() as c:
        up = c.add(RecordingUpstream(metrics_delay=1.5))
        r = c.add(Router([up], "--scrape-interval-ms", "100", "--fail-threshold", "1"))
        time.sleep(1.0)  # several scrapes are now stuck waiting for the slow page
        for _ in range(3):
            assert request(r.port, "POST", "/v1/chat/completions", chat_body()).status == 200
            time.sleep(0.3)
        states = [w["state"] for w in r.workers()]
        assert states == ["up"], states
        assert request(r.port, "GET", "/health").status == 200


@test(timeout=15)
def test_no_body_statuses_and_client_abort_accounting():
    """A worker's 204/304 pass through without body framing; a client that goes away is logged 499
    and not counted against the worker."""
    with Cleanup() as c:
        up = c.add(RecordingUpstream())
        sim = c.add(Sim(fixed=(10, 20)))
        r = c.add(Router([up], "--scrape-interval-ms", "0"))
        for status in (204, 304):
            conn = c.add(Conn(r.port))
            conn.send(build_request("GET", "/v1/status/%d" % status))
            resp = conn.read_response()
            assert resp.status == status, resp
            assert resp.header("transfer-encoding") is None, resp.headers
            assert resp.header("content-length") in (None, "0"), resp.headers
            # The connection is still in sync: a second request on it works.
            conn.send(build_request("GET", "/v1/models"))
            assert conn.read_response().status == 200
        r2 = c.add(Router([sim], *FAST))
        conn = Conn(r2.port)
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=500, stream=True)))
        got = b""
        while len(sse_events(got)) < 2:
            got += conn.read_some(4096)
        conn.close()
        line = r2.wait_line(r"access: .*outcome=client_closed", timeout=2.0).string
        assert "status=499" in line, line
        wait_for(lambda: r2.workers()[0]["in_flight"] == 0, 1.0, "in_flight 0")
        w = r2.workers()[0]
        assert w["errors_total"] == 0 and w["state"] == "up", w


# ---- liveness, probes, request ids --------------------------------------------------------------


def _access_lines(r):
    return [ln for ln in r.stderr_lines() if re.search(r"\baccess\b", ln)]



@test(timeout=20)
def test_livez_alive_while_health_503():
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        r = c.add(Router([a, b], *FAST, "--fail-threshold", "1"))
        live = request(r.port, "GET", "/livez")
        assert live.status == 200 and live.json() == {"status": "alive"}, live
        assert live.header("content-type") == "application/json", live.headers
        a.fault("refuse")
        b.fault("refuse")
        wait_for(lambda: request(r.port, "GET", "/health").status == 503, 3.0,
                 "/health to turn 503 with every worker down")
        assert request(r.port, "GET", "/health").json()["usable_workers"] == 0
        live = request(r.port, "GET", "/livez")
        assert live.status == 200 and live.json() == {"status": "alive"}, live
        head = request(r.port, "HEAD", "/livez")
        assert head.status == 200 and head.body == b"", head
        assert head.header("content-length") == str(len(live.body)), head.headers
        assert request(r.port, "HEAD", "/health").status == 503
        for method in ("POST", "PUT", "DELETE"):
            bad = request(r.port, method, "/livez", b"" if method != "DELETE" else None)
            assert_openai_error(bad, 405)
            assert bad.header("allow") == "GET, HEAD", bad.headers
        # Every worker process gone: liveness still answers, readiness still refuses.
        assert a.stop() is None and b.stop() is None
        assert request(r.port, "GET", "/livez").status == 200
        assert request(r.port, "GET", "/health").status == 503


@test(timeout=20)
def test_probes_not_counted_nor_logged():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        assert request(r.port, "POST", "/v1/chat/completions", chat_body()).status == 200
        wait_for(lambda: len(_access_lines(r)) >= 1, 2.0, "the first access line")
        before = parse_prom_samples(r.metrics_text())
        lines_before = len(_access_lines(r))
        for _ in range(5):
            assert request(r.port, "GET", "/health").status == 200
            assert request(r.port, "GET", "/livez").status == 200
        assert request(r.port, "HEAD", "/health").status == 200
        assert request(r.port, "HEAD", "/livez").status == 200
        after = parse_prom_samples(r.metrics_text())
        for name in ("kvrouter_requests_total", "kvrouter_request_duration_seconds_count",
                     "kvrouter_time_to_first_byte_seconds_count", "kvrouter_client_errors_total"):
            assert prom_value(after, name) == prom_value(before, name), (
                name, prom_value(before, name), prom_value(after, name))
        assert prom_value(before, "kvrouter_requests_total") == 1
        for path, n in (("/health", 6), ("/livez", 6)):
            got = (prom_value(after, "kvrouter_probe_requests_total", path=path)
                   - prom_value(before, "kvrouter_probe_requests_total", path=path))
            assert got == n, (path, got)
        # The log is written in order: a real request's line comes right after the first ones.
        assert request(r.port, "GET", "/v1/models").status == 200
        lines = wait_for(lambda: len(_access_lines(r)) > lines_before and _access_lines(r), 2.0,
                         "the access line of GET /v1/models")
        new = lines[lines_before:]
        assert len(new) == 1 and "path=/v1/models" in new[0], new
        assert not [ln for ln in r.stderr_lines() if "/health" in ln or "/livez" in ln], \
            [ln for ln in r.stderr_lines() if "/health" in ln or "/livez" in ln]
        # A wrong method on a probe path is an ordinary request: counted and logged.
        assert request(r.port, "POST", "/health", b"").status == 405
        wait_for(lambda: any("path=/health status=405" in ln for ln in _access_lines(r)), 2.0,
                 "the 405's access line")
        assert prom_value(parse_prom_samples(r.metrics_text()), "kvrouter_requests_total") == 3


@test(timeout=20)
def test_request_id_echoed_generated_and_forwarded():
    with Cleanup() as c:
        up = c.add(RecordingUpstream())
        r = c.add(Router([up], "--scrape-interval-ms", "0"))

        def sent_upstream():
            return [v for n, v in up.requests[-1]["headers"] if n == "x-request-id"]

        # The client's id: echoed once (not the worker's own), and sent to the worker in its place.
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(),
                       headers=[("X-Request-Id", "client-req-42")])
        assert resp.status == 200, resp
        assert resp.header_all("x-request-id") == ["client-req-42"], resp.headers
        assert sent_upstream() == ["client-req-42"], up.requests[-1]["headers"]
        line = r.wait_line(r"access: .*request_id=client-req-42$", timeout=2.0).string
        assert "path=/v1/chat/completions status=200" in line, line
        # No id, or one that is not sane: a generated one, unique per request, sent upstream too.
        longest = "a" * 128
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(),
                       headers=[("X-Request-Id", longest)])
        assert resp.header_all("x-request-id") == [longest] and sent_upstream() == [longest]
        ids = []
        for given in (None, None, None, "b" * 129, "has space", "caf\xe9", ""):
            hdrs = [("X-Request-Id", given)] if given is not None else []
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body(), headers=hdrs)
            assert resp.status == 200, resp
            got = resp.header_all("x-request-id")
            assert len(got) == 1 and RID.match(got[0]), (given, resp.headers)
            assert sent_upstream() == got, (given, got, up.requests[-1]["headers"])
            ids.append(got[0])
        assert len(set(ids)) == len(ids), ids
        wait_for(lambda: all(any("request_id=%s" % i in ln for ln in _access_lines(r)) for i in ids),
                 2.0, "every generated id in the access log")
        # A GET passed through (no body) and the probes carry one too.
        m = request(r.port, "GET", "/v1/models", headers=[("X-Request-Id", "m-1")])
        assert m.header_all("x-request-id") == ["m-1"] and sent_upstream() == ["m-1"], m.headers
        for path in ("/health", "/livez"):
            p = request(r.port, "GET", path)
            assert len(p.header_all("x-request-id")) == 1 and RID.match(p.header("x-request-id"))


@test(timeout=20)
def test_request_id_streaming_through_sim():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(stream=True),
                       headers=[("X-Request-Id", "stream-1")])
        assert resp.status == 200 and resp.complete, resp
        assert resp.header_all("x-request-id") == ["stream-1"], resp.headers
        assert token_events(sse_events(resp.body)), resp.body[:200]
        r.wait_line(r"access: .*path=/v1/chat/completions status=200 .*request_id=stream-1$",
                    timeout=2.0)
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(stream=True))
        assert RID.match(resp.header("x-request-id") or ""), resp.headers


@test(timeout=20)
def test_request_id_on_router_errors():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        # 400 (invalid JSON), 404, 405, 400 (unsafe path): echoed, or generated, and logged.
        cases = [("POST", "/v1/chat/completions", b"{bad", 400),
                 ("GET", "/nope", None, 404),
                 ("GET", "/v1/chat/completions", None, 405),
                 ("GET", "/v1/../admin", None, 400)]
        for i, (method, path, body, status) in enumerate(cases):
            rid = "err-%d" % i
            resp = request(r.port, method, path, body, headers=[("X-Request-Id", rid)])
            assert_openai_error(resp, status)
            assert resp.header_all("x-request-id") == [rid], (path, resp.headers)
            r.wait_line(r"access: .*status=%d .*request_id=%s$" % (status, rid), timeout=2.0)
            resp = request(r.port, method, path, body)
            assert RID.match(resp.header("x-request-id") or ""), (path, resp.headers)
        # Rejected by the HTTP layer before any handler (413 from Content-Length): still echoed.
        conn = c.add(Conn(r.port))
        conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: big-1\r\n"
                  b"Content-Length: 99999999\r\n\r\n")
        resp = conn.read_response()
        assert_openai_error(resp, 413)
        assert resp.header_all("x-request-id") == ["big-1"], resp.headers
        r.wait_line(r"access: .*status=413 .*request_id=big-1$", timeout=2.0)
        # 503: no usable worker.
        dead = "http://127.0.0.1:%d" % closed_port()
        r2 = c.add(Router([dead], *FAST, "--fail-threshold", "1"))
        seen = {}
        for i in range(4):
            resp = request(r2.port, "POST", "/v1/chat/completions", chat_body(),
                           headers=[("X-Request-Id", "down-%d" % i)])
            assert resp.header_all("x-request-id") == ["down-%d" % i], resp.headers
            seen[resp.status] = resp
            if resp.status == 503:
                break
        assert 503 in seen, sorted(seen)
        assert_openai_error(seen[503], 503)
        assert seen[503].header("retry-after") == "1", seen[503].headers
        r2.wait_line(r"access: .*status=503 .*outcome=no_worker .*request_id=down-\d$", timeout=2.0)
        resp = request(r2.port, "POST", "/v1/chat/completions", chat_body())
        assert resp.status == 503 and RID.match(resp.header("x-request-id") or ""), resp.headers


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0]))
