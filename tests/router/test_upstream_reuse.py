#!/usr/bin/env python3
"""Integration tests of the router's reused upstream easy handles (src/serve/proxy.c upstream_transfer,
upstream_method, transfer_release), through real processes.

The router keeps finished transfers' curl easy handles in a pool and sets only each request's own
options on the next one, so a request must never inherit anything from the previous request on the
same handle: method (a GET after a POST must not send the old body; after a HEAD it must get a
body), body, headers (x-request-id, the client's own headers), target. One worker (a recording
http.server upstream) and requests one at a time make every request after the first run on the
same pooled handle (the pool is last in, first out).

Run:  python3 tests/router/test_upstream_reuse.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import hashlib
import http.server
import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import Cleanup, Conn, Router, build_request, closed_port, request  # noqa: E402


class EchoUpstream:
    """A threaded http.server that records each request (method, path, headers, body) and answers
    200 with a JSON echo of it (no body for HEAD, with the Content-Length a GET would get)."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                rec = {"method": self.command, "path": self.path,
                       "headers": [(k.lower(), v) for k, v in self.headers.items()],
                       "body": body.decode("latin-1"),
                       "body_sha": hashlib.sha256(body).hexdigest()}
                with outer.lock:
                    outer.requests.append(rec)
                out = json.dumps({"method": self.command, "path": self.path,
                                  "body_len": len(body)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(out)

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = _answer

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def kill(self):
        self.httpd.shutdown()
        self.httpd.server_close()


TESTS, test = h.registry()

# (method, path, body or None, extra client headers): every method after every other one.
STEPS = [
    ("HEAD", "/v1/models", None, []),
    ("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "one"}]},
     [("X-Client-Only-Once", "a")]),
    ("GET", "/v1/models", None, []),
    ("POST", "/v1/completions", {"model": "m", "prompt": "two two"}, []),
    ("HEAD", "/v1/models", None, []),
    ("GET", "/v1/models?after=head", None, []),
    ("DELETE", "/v1/files/f1", None, []),
    ("PUT", "/v1/files/f2", "put-body-123", []),
    ("GET", "/v1/models", None, []),
    ("PATCH", "/v1/files/f3", "", []),
    ("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "3"}]},
     []),
    ("DELETE", "/v1/files/f4", None, []),
    ("GET", "/v1/models", None, []),
]


def body_bytes(body):
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


def check_step(i, step, resp, seen):
    method, path, body, extra = step
    want = body_bytes(body)
    assert resp.status == 200, (i, method, path, resp.status, resp.body[:200])
    assert resp.complete, (i, method, path)
    assert seen["method"] == method, (i, method, seen["method"])
    assert seen["path"] == path, (i, path, seen["path"])
    assert seen["body_sha"] == hashlib.sha256(want).hexdigest(), (i, method, seen["body"][:80])
    names = [n for n, _ in seen["headers"]]
    # The request id is this request's (one line), the client's headers are this request's only.
    assert names.count("x-request-id") == 1, (i, seen["headers"])
    assert dict(seen["headers"])["x-request-id"] == resp.header("x-request-id"), (i, seen["headers"])
    assert ("x-client-only-once" in names) == bool(extra), (i, method, seen["headers"])
    if method in ("GET", "HEAD", "DELETE") and body is None:
        assert "content-length" not in names or dict(seen["headers"])["content-length"] == "0", (
            i, method, seen["headers"])
        assert "transfer-encoding" not in names, (i, method, seen["headers"])
    if method == "HEAD":
        assert resp.body == b"", (i, resp.body)
    else:
        echo = json.loads(resp.body)
        assert echo == {"method": method, "path": path, "body_len": len(want)}, (i, echo)


@test(timeout=60)
def test_methods_on_one_reused_handle():
    """Every method after every other on the same pooled handle (one client connection, requests
    one at a time, one worker): each arrives with its own method, target, body and headers."""
    with Cleanup() as c:
        up = c.add(EchoUpstream())
        r = c.add(Router([up], "--policy", "round_robin", "--scrape-interval-ms", "0"))
        conn = Conn(r.port, timeout=5.0)
        try:
            for rnd in range(2):
                for i, step in enumerate(STEPS):
                    method, path, body, extra = step
                    before = len(up.requests)
                    conn.send(build_request(method, path, body, extra))
                    resp = conn.read_response(method)
                    assert len(up.requests) == before + 1, (rnd, i, method)
                    check_step(i, step, resp, up.requests[-1])
        finally:
            conn.close()


@test(timeout=60)
def test_reuse_after_failed_attempt():
    """A worker that refuses connections next to a live one: an attempt on it fails, its handle goes
    back to the pool and the retry on the live worker runs on that same handle. Every request still
    arrives with exactly its own method, target, body and headers."""
    with Cleanup() as c:
        live = c.add(EchoUpstream())
        dead = "http://127.0.0.1:%d" % closed_port()
        r = c.add(Router([dead, live], "--policy", "round_robin", "--scrape-interval-ms", "0"))
        for i, step in enumerate(STEPS):
            method, path, body, extra = step
            before = len(live.requests)
            resp = request(r.port, method, path, body, extra)
            assert len(live.requests) == before + 1, (i, method, resp.status)
            check_step(i, step, resp, live.requests[-1])


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
