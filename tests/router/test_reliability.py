#!/usr/bin/env python3
"""Integration tests of the router's reliability rules (issue 18), through real processes.

What the cache index learns (only from 2xx answers, at most the worker's max_model_len read from
GET /v1/models), outlier ejection (consecutive 5xx, first-byte timeouts and connect failures eject a
worker for an exponential backoff, a half-open trial restores it, the last usable worker is never
ejected), the retry budget, and the optional admission queue (bounded FIFO, 503 + Retry-After when
full or when the wait expires, clean removal of a client that leaves while queued).

Every test starts its own `kvrouter sim` workers (with fault injection through their admin
listener) or a tiny in-test upstream, and `kvrouter serve`, on 127.0.0.1 with ephemeral ports, and
stops them by PID (Cleanup).

Run:  python3 tests/router/test_reliability.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import http.server
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (FAST, MODEL, Cleanup, Conn, Router, Sim, assert_openai_error,  # noqa: E402
                        build_request, chat_body, parse_prom_samples, prom_value, request,
                        wait_for)

TESTS, test = h.registry()


def worker_view(r, url):
    """The admin view of the worker whose url is url."""
    for w in r.workers():
        if w["url"] == url:
            return w
    raise AssertionError("no worker %s in %r" % (url, r.workers()))


def metrics(r):
    return parse_prom_samples(r.metrics_text())


class ModelsUpstream:
    """A threaded http.server standing in for a vLLM worker whose model has a small context:
    GET /v1/models lists one model with max_model_len, GET /metrics gives one load series, and
    every POST is answered 200 with a chat completion (it accepts any prompt, so the router's cap
    is what bounds what is learned)."""

    def __init__(self, max_model_len):
        outer = self
        self.posts = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, ctype, body):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    doc = {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                       "max_model_len": max_model_len}]}
                    self._send(200, "application/json", json.dumps(doc).encode())
                elif self.path == "/metrics":
                    self._send(200, "text/plain", b"vllm:num_requests_running 0\n")
                else:
                    self._send(404, "application/json", b'{"detail":"Not Found"}')

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                outer.posts += 1
                doc = {"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                       "choices": [{"index": 0, "finish_reason": "length",
                                    "message": {"role": "assistant", "content": "ok ok ok"}}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}
                self._send(200, "application/json", json.dumps(doc).encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def kill(self):  # Cleanup protocol
        self.server.shutdown()
        self.server.server_close()

    def stop(self):
        self.kill()
        return None


# ---- what the cache index learns -------------------------------------------------------------------


@test(timeout=30)
def test_rejected_and_unknown_model_leave_no_residue():
    """A prompt the worker rejects (400: longer than its context) and a request for a model it does
    not serve (404) pass through unchanged and leave the worker's index and in-flight count exactly
    as before; an accepted request is learned (the control)."""
    with Cleanup() as c:
        sim = c.add(Sim("--max-model-len", "4096"))
        r = c.add(Router([sim], *FAST))
        wait_for(lambda: worker_view(r, sim.url)["max_model_len"] == 4096, 5,
                 "max_model_len read from GET /v1/models")
        w = worker_view(r, sim.url)
        assert w["index_blocks"] == 0 and w["learn_cap_blocks"] == 4096 * 4 // 64, w
        for stream in (False, True):
            long_prompt = "The quick brown fox %d jumps. " % stream * 20000  # ~600 KB, ~150k tokens
            resp = request(r.port, "POST", "/v1/chat/completions",
                           chat_body(long_prompt, stream=stream), timeout=10)
            assert_openai_error(resp, 400)
            w = worker_view(r, sim.url)
            assert w["index_blocks"] == 0, "a rejected prompt was learned: %r" % w
            assert w["in_flight"] == 0 and w["queued_prefill_tokens"] == 0, w
            assert w["active_tokens"] == 0, w
        body = chat_body("A question for a model this worker does not serve, long enough. " * 20)
        body["model"] = "no-such-model"
        resp = request(r.port, "POST", "/v1/chat/completions", body)
        assert_openai_error(resp, 404)
        w = worker_view(r, sim.url)
        assert w["index_blocks"] == 0 and w["in_flight"] == 0, w
        # The worker is healthy: a 4xx is the client's, not an outlier failure.
        assert w["state"] == "up" and w["outlier"]["consecutive_errors"] == 0, w
        resp = request(r.port, "POST", "/v1/chat/completions",
                       chat_body("An accepted prompt that the worker now holds. " * 20))
        assert resp.status == 200, resp.body[:200]
        w = worker_view(r, sim.url)
        assert w["index_blocks"] > 0 and w["in_flight"] == 0, w


@test(timeout=30)
def test_learning_capped_at_max_model_len():
    """A worker that accepts a prompt far longer than its context (by the router's estimate) is
    credited with at most max_model_len tokens' worth of blocks (256 tokens * 4 / 64 = 16)."""
    with Cleanup() as c:
        up = c.add(ModelsUpstream(256))
        r = c.add(Router([up.url], *FAST))
        wait_for(lambda: worker_view(r, up.url)["max_model_len"] == 256, 5, "max_model_len")
        m = metrics(r)
        assert prom_value(m, "kvrouter_worker_max_model_len_tokens") == 256
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body("x" * 1000 + "y" * 99000),
                       timeout=10)
        assert resp.status == 200, resp.body[:200]
        w = worker_view(r, up.url)
        assert w["index_blocks"] == 16, w
        assert w["learn_cap_blocks"] == 16, w


# ---- outlier ejection ------------------------------------------------------------------------------


@test(timeout=40)
def test_5xx_worker_ejected_backoff_and_half_open_trial():
    """Three 500s in a row eject the worker (admin state, kvrouter_worker_state, the ejection
    counter); while ejected it gets nothing; when its time is up one trial goes: a failed trial
    ejects it for twice as long, a successful one restores it."""
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin",
                         "--outlier-consecutive-failures", "3", "--outlier-base-ejection-ms", "1500",
                         "--outlier-max-ejection-ms", "10000"))
        ids = {w["url"]: str(w["id"]) for w in r.workers()}
        a.fault("error", status=500)
        statuses = []
        for _ in range(6):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            statuses.append((resp.header("x-kvrouter-worker"), resp.status))
        assert statuses.count((ids[a.url], 500)) == 3, statuses
        wa = worker_view(r, a.url)
        assert wa["state"] == "ejected", wa
        assert wa["outlier"]["ejections_total"] == 1, wa
        assert 0 < wa["outlier"]["ejection_remaining_ms"] <= 1500, wa
        m = metrics(r)
        assert prom_value(m, "kvrouter_worker_state", worker=ids[a.url], state="ejected") == 1
        assert prom_value(m, "kvrouter_worker_state", worker=ids[a.url], state="up") == 0
        assert prom_value(m, "kvrouter_worker_ejections_total", worker=ids[a.url]) == 1
        # Ejected: everything goes to b.
        for _ in range(4):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            assert resp.status == 200 and resp.header("x-kvrouter-worker") == ids[b.url]
        # Half-open with the fault still on: the one trial fails, ejected again for 3 s.
        wait_for(lambda: worker_view(r, a.url)["outlier"]["half_open"], 3, "half-open")
        seen = []
        for _ in range(3):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            seen.append((resp.header("x-kvrouter-worker"), resp.status))
        assert seen.count((ids[a.url], 500)) == 1, seen
        wa = worker_view(r, a.url)
        assert wa["state"] == "ejected" and wa["outlier"]["ejections_total"] == 2, wa
        assert 1500 < wa["outlier"]["ejection_remaining_ms"] <= 3000, wa
        # Healed: the next trial succeeds and restores it.
        a.fault("none")
        wait_for(lambda: worker_view(r, a.url)["outlier"]["half_open"], 4, "half-open again")
        seen = []
        for _ in range(4):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            assert resp.status == 200, resp.body[:200]
            seen.append(resp.header("x-kvrouter-worker"))
        assert ids[a.url] in seen, seen
        assert worker_view(r, a.url)["state"] == "up"


@test(timeout=30)
def test_timeouts_and_connect_failures_eject():
    """First-byte timeouts (a hung worker) and connect failures (a refusing one) count as outlier
    failures too; a refused attempt is still retried on the other worker."""
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        flags = [*FAST, "--policy", "round_robin", "--outlier-consecutive-failures", "2",
                 "--first-byte-timeout-ms", "300", "--fail-threshold", "100"]
        r = c.add(Router([a, b], *flags))
        a.fault("hang")
        for _ in range(4):
            request(r.port, "POST", "/v1/chat/completions", chat_body(), timeout=3)
        assert worker_view(r, a.url)["state"] == "ejected", worker_view(r, a.url)
        a.fault("none")
        r2 = c.add(Router([a, b], *flags))
        a.fault("refuse")
        for _ in range(4):
            resp = request(r2.port, "POST", "/v1/chat/completions", chat_body())
            assert resp.status == 200, resp.body[:200]  # retried on b
        assert worker_view(r2, a.url)["state"] == "ejected", worker_view(r2, a.url)
        a.fault("none")


@test(timeout=30)
def test_last_usable_worker_never_ejected():
    """A lone worker answering 500 keeps getting requests (the 500s reach the client) instead of
    leaving no worker at all; every refused ejection is counted."""
    with Cleanup() as c:
        a = c.add(Sim())
        r = c.add(Router([a], *FAST, "--outlier-consecutive-failures", "2",
                         "--outlier-max-ejection-percent", "100"))
        a.fault("error", status=503)
        for _ in range(5):
            resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
            assert resp.status == 503, resp.status
        w = worker_view(r, a.url)
        assert w["state"] == "up", w
        assert prom_value(metrics(r), "kvrouter_ejections_refused_total") >= 1
        assert request(r.port, "GET", "/health").status == 200
        a.fault("none")


# ---- retry budget -----------------------------------------------------------------------------------


@test(timeout=30)
def test_retry_budget_spent_error_goes_to_client():
    """With no retry budget a connect failure is not retried: the client gets the 502 and the
    refusal is counted; with the default budget the same failure is retried."""
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin", "--fail-threshold", "100",
                         "--outlier-consecutive-failures", "0", "--retry-budget-percent", "0",
                         "--retry-min-concurrency", "0"))
        a.fault("refuse")
        statuses = [request(r.port, "POST", "/v1/chat/completions", chat_body()).status
                    for _ in range(4)]
        assert statuses.count(502) == 2 and statuses.count(200) == 2, statuses
        m = metrics(r)
        assert prom_value(m, "kvrouter_retry_budget_refused_total") == 2
        r2 = c.add(Router([a, b], *FAST, "--policy", "round_robin", "--fail-threshold", "100"))
        statuses = [request(r2.port, "POST", "/v1/chat/completions", chat_body()).status
                    for _ in range(4)]
        assert statuses == [200] * 4, statuses
        assert prom_value(metrics(r2), "kvrouter_retry_budget_refused_total") == 0
        a.fault("none")


# ---- admission bound --------------------------------------------------------------------------------


def concurrently(fns):
    """Runs each fn in a thread, started 50 ms apart (a fixed arrival order); returns results."""
    out = [None] * len(fns)

    def run(i):
        try:
            out[i] = fns[i]()
        except Exception as e:  # surfaced to the caller
            out[i] = e

    threads = []
    for i in range(len(fns)):
        t = threading.Thread(target=run, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    for t in threads:
        t.join(20)
    return out


def post(port, timeout=10):
    """A function that sends one chat completion and returns the Response with t_done set (when the
    whole answer had arrived)."""
    def send():
        resp = request(port, "POST", "/v1/chat/completions", chat_body(), timeout=timeout)
        resp.t_done = time.monotonic()
        return resp
    return send


@test(timeout=40)
def test_admission_queue_full_and_wait_expired():
    """One request in flight per worker: the second waits and is served after the first, the
    third finds the one-place queue full (503, Retry-After, OpenAI error). With a short wait a
    queued request gets 503 when its wait expires. Off by default: nothing is queued."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(600, 5)))
        r = c.add(Router([sim], *FAST, "--admission-max-inflight", "1", "--admission-queue-limit",
                         "1", "--admission-max-wait-ms", "5000", "--retry-after-s", "3"))
        first, second, third = concurrently([post(r.port), post(r.port), post(r.port)])
        assert first.status == 200 and second.status == 200, (first, second)
        err = assert_openai_error(third, 503)
        assert err["code"] == "server_overloaded" and err["type"] == "service_unavailable", err
        assert third.header("retry-after") == "3", third.headers
        assert second.t_done - first.t_done > 0.4, "the queued request did not wait its turn"
        m = metrics(r)
        assert prom_value(m, "kvrouter_admission_queued_total") == 1
        assert prom_value(m, "kvrouter_admission_rejected_total", reason="queue_full") == 1
        assert prom_value(m, "kvrouter_admission_queue_depth") == 0
        assert prom_value(m, "kvrouter_request_errors_total", reason="overloaded") == 1
        r2 = c.add(Router([sim], *FAST, "--admission-max-inflight", "1",
                          "--admission-max-wait-ms", "200"))
        t0 = time.monotonic()
        first, second = concurrently([post(r2.port), post(r2.port)])
        assert first.status == 200, first
        assert_openai_error(second, 503)
        assert second.t_done - t0 < 0.6, "the wait did not expire after 200 ms"
        m = metrics(r2)
        assert prom_value(m, "kvrouter_admission_rejected_total", reason="timeout") == 1
        r3 = c.add(Router([sim], *FAST))
        results = concurrently([post(r3.port) for _ in range(3)])
        assert [x.status for x in results] == [200] * 3, results
        assert prom_value(metrics(r3), "kvrouter_admission_queued_total") == 0


@test(timeout=30)
def test_admission_queue_per_model():
    """The admission queue is first come, first served among requests that compete for the same
    workers, and no more (issue 35): with model-a's one worker at the bound and a second model-a
    request queued, a model-b request goes to its idle worker at once instead of waiting behind
    them; the queued model-a request still goes when the first one ends."""
    with Cleanup() as c:
        a = c.add(Sim("--model", "model-a", fixed=(800, 5)))
        b = c.add(Sim("--model", "model-b", fixed=(20, 5)))
        r = c.add(Router([a, b], *FAST, "--admission-max-inflight", "1",
                         "--admission-max-wait-ms", "5000"))
        wait_for(lambda: all(w["models"]["known"] for w in r.workers()), 5, "models read")

        def send(model):
            def go():
                resp = request(r.port, "POST", "/v1/chat/completions",
                               chat_body(model=model), timeout=10)
                resp.t_done = time.monotonic()
                return resp
            return go
        t0 = time.monotonic()
        a1, a2, b1 = concurrently([send("model-a"), send("model-a"), send("model-b")])
        assert [x.status for x in (a1, a2, b1)] == [200] * 3, (a1, a2, b1)
        assert b1.t_done - t0 < 0.6, "model-b waited %.2f s behind model-a's queue" % (
            b1.t_done - t0)
        assert a2.t_done - a1.t_done > 0.6, "the queued model-a request did not wait its turn"
        m = metrics(r)
        assert prom_value(m, "kvrouter_admission_queued_total") == 1  # a2 only


@test(timeout=30)
def test_body_buffer_budget():
    """Bodies still arriving share one budget (--max-body-buffer-bytes, issue 37: 100 connections
    each sending most of an 8 MiB body held 799 MiB): a request whose declared body would go over
    it gets 503 + Retry-After in OpenAI's shape and its connection closes; once the first body is
    no longer held, the same request is taken."""
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST, "--max-body-buffer-bytes", "1500000"))
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 700000\r\n\r\n")
        a = c.add(Conn(r.port))
        a.send(head + b"{")  # 700,000 bytes declared, 1 MiB reserved, one arrived
        time.sleep(0.2)
        b = c.add(Conn(r.port))
        b.send(head + b"{")
        resp = b.read_response("POST")
        err = assert_openai_error(resp, 503)
        assert err["code"] == "server_busy", err
        assert resp.header("retry-after") == "1", resp.headers
        a.close()  # the held body goes with its connection
        time.sleep(0.2)
        body = json.dumps(chat_body()).encode()
        body += b" " * (700000 - len(body))
        d = c.add(Conn(r.port))
        d.send(head + body)
        resp = d.read_response("POST")
        assert resp.status == 200, (resp.status, resp.body[:200])
        # Small requests never touch the budget's edge.
        assert request(r.port, "POST", "/v1/chat/completions", chat_body()).status == 200


@test(timeout=30)
def test_connection_limit_counted_and_fd_limit_warned():
    """Past --max-connections a new client gets 503 and the refusal is counted
    (kvrouter_connections_refused_total{reason="limit"}) and logged once per episode, not once per
    connection (issue 37: EMFILE reset clients with no log line or metric). A router whose
    open-file limit cannot hold max_connections says so at start."""
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST, "--max-connections", "2"))
        held = [c.add(Conn(r.port)) for _ in range(2)]
        time.sleep(0.2)
        for _ in range(3):
            extra = c.add(Conn(r.port))
            resp = extra.read_response("GET")
            err = assert_openai_error(resp, 503)
            assert err["code"] == "too_many_connections", err
        for x in held:
            x.close()
        m = metrics(r)
        assert prom_value(m, "kvrouter_connections_refused_total", reason="limit") == 3, m
        assert prom_value(m, "kvrouter_connections_refused_total", reason="accept") == 0, m
        lines = [x for x in r.stderr_lines() if "refusing new connections" in x]
        assert len(lines) == 1, lines
    import resource

    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    p = subprocess.Popen([h._kvrouter(), "serve", "--listen", "127.0.0.1:0", "--admin-listen",
                          "127.0.0.1:0", "--worker", "http://127.0.0.1:9"], preexec_fn=low_fd_limit,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, err = time.monotonic() + 5, ""
        while time.monotonic() < deadline and "open-file limit" not in err:
            err += p.stderr.readline()
        assert "open-file limit (256) is below max_connections (4096)" in err, err
    finally:
        p.kill()
        p.wait()


@test(timeout=30)
def test_admission_client_leaves_while_queued():
    """A client that disconnects while its request waits leaves the queue at once (depth back to
    0, never sent to the worker), and the requests behind it are still served in order."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(800, 5)))
        r = c.add(Router([sim], *FAST, "--admission-max-inflight", "1",
                         "--admission-max-wait-ms", "10000"))
        holder = threading.Thread(target=post(r.port))
        holder.start()
        time.sleep(0.1)
        gone = Conn(r.port)
        gone.send(build_request("POST", "/v1/chat/completions", chat_body()))
        wait_for(lambda: prom_value(metrics(r), "kvrouter_admission_queue_depth") == 1, 2,
                 "the request queued")
        gone.close()
        wait_for(lambda: prom_value(metrics(r), "kvrouter_admission_queue_depth") == 0, 2,
                 "the abandoned request left the queue")
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(), timeout=10)
        assert resp.status == 200, resp
        holder.join(10)
        m = metrics(r)
        assert prom_value(m, "kvrouter_admission_queued_total") == 2
        assert prom_value(m, "kvrouter_client_aborts_total") == 1
        assert prom_value(m, "kvrouter_worker_requests_total") == 2  # the abandoned one never went
        assert worker_view(r, sim.url)["in_flight"] == 0


# ---- flags ---------------------------------------------------------------------------------------


@test(timeout=20)
def test_flags_in_help_and_bad_values_refused():
    """serve --help lists every new flag with its default; a bad value stops the start with exit 2
    and one line naming the flag."""
    kvr = h._kvrouter()
    out = subprocess.run([kvr, "serve", "--help"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    for flag in ("--outlier-consecutive-failures", "--outlier-base-ejection-ms",
                 "--outlier-max-ejection-ms", "--outlier-max-ejection-percent",
                 "--retry-budget-percent", "--retry-min-concurrency", "--admission-max-inflight",
                 "--admission-queue-limit", "--admission-max-wait-ms"):
        assert flag in out.stdout, "%s not in serve --help" % flag
    for args, word in ((["--outlier-max-ejection-percent", "150"], "--outlier-max-ejection-percent"),
                       (["--admission-max-wait-ms", "0"], "--admission-max-wait-ms"),
                       (["--outlier-base-ejection-ms", "5000", "--outlier-max-ejection-ms", "10"],
                        "--outlier-max-ejection-ms")):
        res = subprocess.run([kvr, "serve", "--worker", "http://127.0.0.1:1", *args],
                             capture_output=True, text=True, timeout=10)
        assert res.returncode == 2, (args, res.returncode, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and word in lines[0], (args, res.stderr)


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0]))
