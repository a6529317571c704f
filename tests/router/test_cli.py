#!/usr/bin/env python3
"""Integration tests of the `kvrouter serve` command line (src/core/config.c, router/serve.c).

--help, bad flags and values (non-zero exit, one line naming the flag), --config JSON files (settings
applied, flags override the file, a bad key named with its path), shutdown on SIGTERM/SIGINT (exit
0, in-flight streams allowed to finish, aborted after --shutdown-grace-ms), and --log-format json
(every stderr line one JSON object with a millisecond timestamp). Also `kvrouter bench`'s workload
flags (router/bench.c): --replay-order, --replay-dataset, --answer-mean/--answer-std listed by --help,
bad values rejected before any request is sent; the model looked up and the policy switched
through the bench's side channel (bench/loadgen/monitor.c), their failures one line and exit 1. And
`kvrouter sim --help`: its defaults are the live ones (router/sim.c). Every subcommand (serve, sim,
bench, bench routing, demo) parses through the one option engine (src/base/cli.c): -h, --help and
--version work on each, and a bad flag on each is one line "kvrouter CMD: --flag: what is wrong" and
exit status 2.

Run:  python3 tests/router/test_cli.py --kvrouter build/kvrouter [-k substring] [-v]
The harness (processes, raw HTTP client, runner) is tests/harness/kvrharness.py.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (FAST, AdminToken, Cleanup, Conn, Router, Sim,  # noqa: E402
                        build_request, chat_body, request, sse_events, token_events)

TESTS, test = h.registry()


def serve(*args, timeout=5):
    """Runs `kvrouter serve ARGS` to completion; returns (exit code, stdout, stderr)."""
    p = subprocess.run([h.KVROUTER, "serve"] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def one_line_error(rc, err, *must_name):
    """A rejected command line: non-zero exit, exactly one line on stderr naming each of must_name."""
    assert rc != 0, "exit 0 for a bad command line"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, "expected one line on stderr, got %d:\n%s" % (len(lines), err)
    for word in must_name:
        assert word in lines[0], "%r not named in %r" % (word, lines[0])
    return lines[0]


W = "http://127.0.0.1:9"  # a syntactically valid worker for command lines that never start


@test(timeout=10)
def test_help_lists_flags():
    rc, out, err = serve("--help")
    assert rc == 0, (rc, err)
    for flag in ("--worker", "--config", "--listen", "--admin-listen", "--policy", "--policy-params",
                 "--first-byte-timeout-ms", "--header-timeout-ms", "--max-body-bytes",
                 "--max-url-bytes", "--max-header-bytes", "--max-header-fields", "--access-log",
                 "--log-level", "--log-format", "--shutdown-grace-ms"):
        assert flag in out, "%s not in --help" % flag
    assert "round_robin" in out and "kv_aware" in out, "policies not listed"
    rc2, out2, _ = serve("-h")
    assert rc2 == 0 and out2 == out
    # --help wins wherever it stands, even next to a bad flag.
    rc3, out3, _ = serve("--bogus", "--help")
    assert rc3 == 0 and out3 == out, rc3


@test(timeout=20)
def test_bad_flags_and_values_named():
    cases = [
        (("--bogus", "--worker", W), ["--bogus"]),
        (("--worker", W, "--max-body-bytes", "lots"), ["--max-body-bytes", "lots"]),
        (("--worker", W, "--max-body-bytes", "-5"), ["--max-body-bytes"]),
        (("--worker", W, "--max-body-bytes", "0"), ["--max-body-bytes"]),
        (("--worker", W, "--policy", "fastest"), ["--policy", "fastest"]),
        (("--worker", W, "--listen", "nowhere"), ["--listen", "nowhere"]),
        (("--worker", W, "--access-log", "maybe"), ["--access-log", "maybe"]),
        (("--worker", W, "--log-level", "loud"), ["--log-level", "loud"]),
        (("--worker", W, "--log-format", "xml"), ["--log-format", "xml"]),
        (("--worker", W, "--shutdown-grace-ms", "3600001"), ["--shutdown-grace-ms", "3600001"]),
        (("--worker", W, "--shutdown-grace-ms", "-1"), ["--shutdown-grace-ms"]),
        (("--worker", W, "--first-byte-timeout-ms", "0"), ["first"]),
        (("--worker", "ftp://127.0.0.1:9"), ["--worker", "ftp://127.0.0.1:9"]),
        (("--worker", W, "--policy-params", "[1]"), ["--policy-params"]),
        (("--worker", W, "--policy", "kv_aware", "--policy-params", '{"balance_slack": -1}'),
         ["balance_slack"]),
        (("--worker", W, "--header-timeout-ms"), ["--header-timeout-ms"]),
        (("--worker", W, "stray"), ["stray"]),
        ((), ["worker"]),
        (("--worker", W, "--worker", W + "/"), ["127.0.0.1:9"]),  # the same worker twice
        (("--config", "/nonexistent/kvr.json", "--worker", W), ["/nonexistent/kvr.json"]),
    ]
    failed = []
    for args, names in cases:
        try:
            rc, out, err = serve(*args, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0") \
                if "--listen" not in args else serve(*args, "--admin-listen", "127.0.0.1:0")
            one_line_error(rc, err, *names)
        except (AssertionError, subprocess.TimeoutExpired) as e:
            failed.append("%s: %s" % (" ".join(args), str(e)[:200]))
    assert not failed, "%d of %d cases failed:\n      %s" % (len(failed), len(cases),
                                                           "\n      ".join(failed))


def write_config(obj):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    f.write(obj if isinstance(obj, str) else json.dumps(obj))
    f.close()
    return f.name


@test(timeout=15)
def test_config_file_applies_and_flags_override():
    with Cleanup() as c:
        sim = c.add(Sim())
        path = write_config({"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                             "workers": [sim.url], "policy": "round_robin",
                             "limits": {"max_body_bytes": 1000},
                             "timeouts": {"first_byte_ms": 5000},
                             "policy_params": {}, "worker_header": False})
        try:
            r = c.add(Router([], "--config", path))
            pol = request(r.admin_port, "GET", "/admin/policy").json()
            assert pol["policy"] == "round_robin", pol
            assert [w["url"] for w in r.workers()] == [sim.url]
            ok = request(r.port, "POST", "/v1/chat/completions", chat_body())
            assert ok.status == 200 and ok.header("x-kvrouter-worker") is None, ok.headers
            big = request(r.port, "POST", "/v1/chat/completions", chat_body("x" * 2000))
            assert big.status == 413, big
            # A flag beats the file.
            r2 = c.add(Router([], "--config", path, "--policy", "least_load",
                              "--max-body-bytes", "100000"))
            assert request(r2.admin_port, "GET", "/admin/policy").json()["policy"] == "least_load"
            assert request(r2.port, "POST", "/v1/chat/completions",
                           chat_body("x" * 2000)).status == 200
        finally:
            os.unlink(path)


@test(timeout=15)
def test_config_file_errors_named():
    cases = [
        ({"workers": [W], "limits": {"max_body_bytez": 5}}, ["limits.max_body_bytez"]),
        ({"workers": [W], "polcy": "kv_aware"}, ["polcy"]),
        ({"workers": [W], "limits": {"max_body_bytes": "big"}}, ["limits.max_body_bytes"]),
        ({"workers": [W], "limits": {"max_body_bytes": -1}}, ["limits.max_body_bytes"]),
        ({"workers": [W], "timeouts": {"first_byte_ms": 1.5}}, ["timeouts.first_byte_ms"]),
        ({"workers": "http://127.0.0.1:9"}, ["workers"]),
        ({"workers": [W, 7]}, ["workers[1]"]),
        ({"workers": [W], "policy": "fastest"}, ["fastest"]),
        ({"workers": [W], "policy_params": [1]}, ["policy_params"]),
        ('{"workers": [', []),
        ("[]", []),
    ]
    failed = []
    for obj, names in cases:
        path = write_config(obj)
        try:
            rc, out, err = serve("--config", path, "--listen", "127.0.0.1:0",
                                 "--admin-listen", "127.0.0.1:0")
            line = one_line_error(rc, err, *names)
            if not names:
                assert path in line or "config" in line, line
        except (AssertionError, subprocess.TimeoutExpired) as e:
            failed.append("%s: %s" % (json.dumps(obj) if not isinstance(obj, str) else obj,
                                      str(e)[:200]))
        finally:
            os.unlink(path)
    assert not failed, "%d of %d cases failed:\n      %s" % (len(failed), len(cases),
                                                           "\n      ".join(failed))


@test(timeout=15)
def test_config_json_syntax_error_has_line_and_column():
    path = write_config('{\n  "workers": [\n    "http://127.0.0.1:9",\n  ]\n}\n')
    try:
        rc, out, err = serve("--config", path, "--listen", "127.0.0.1:0",
                             "--admin-listen", "127.0.0.1:0")
        assert rc == 2, (rc, err)
        line = one_line_error(rc, err, path, "line 4, column 3", "invalid JSON")
        assert "not a JSON object" not in line, line
    finally:
        os.unlink(path)


@test(timeout=20)
def test_bad_worker_urls_refused_at_start():
    cases = [
        ("http://127.0.0.1:abc", "port"),
        ("http://127.0.0.1:99999", "port"),
        ("http://127.0.0.1:0", "port"),
        ("http://127.0.0.1:", "port"),
        ("http://:9001", "host"),
        ("http://user:pw@127.0.0.1:9001", "user"),
        ("http://127.0.0.1:9001?x=1", "query"),
        ("http://127.0.0.1:9001#top", "fragment"),
        ("http://127.0.0.1:9001/v1", "path"),
        ("ftp://127.0.0.1:9001", "https://"),
    ]
    failed = []
    for url, word in cases:
        try:
            rc, out, err = serve("--worker", url, "--listen", "127.0.0.1:0",
                                 "--admin-listen", "127.0.0.1:0")
            assert rc == 2, "exit %d" % rc
            one_line_error(rc, err, "--worker", url, word)
        except (AssertionError, subprocess.TimeoutExpired) as e:
            failed.append("%s: %s" % (url, str(e)[:200]))
    assert not failed, "%d of %d cases failed:\n      %s" % (len(failed), len(cases),
                                                           "\n      ".join(failed))


@test(timeout=30)
def test_worker_list_over_the_cap_refused_at_start():
    """More than KVR_MAX_WORKERS (4,096) workers, data-parallel ranks counted, is one line and exit
    2 (17 endpoints of 256 ranks: 4,352), whether from --worker flags or the config file."""
    eps = ["http://127.0.0.1:%d,dp_size=256" % (40000 + i) for i in range(17)]
    args = []
    for e in eps:
        args += ["--worker", e]
    rc, out, err = serve(*args, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
    assert rc == 2, (rc, err[-300:])
    one_line_error(rc, err, "too many workers", "4096")
    path = os.path.join(tempfile.mkdtemp(), "fleet.json")
    with open(path, "w") as f:
        json.dump({"workers": [{"url": e.split(",")[0], "dp_size": 256} for e in eps]}, f)
    rc, out, err = serve("--config", path, "--listen", "127.0.0.1:0",
                         "--admin-listen", "127.0.0.1:0")
    assert rc == 2, (rc, err[-300:])
    one_line_error(rc, err, "too many workers", "4096")


@test(timeout=15)
def test_https_worker_accepted_at_start():
    with Cleanup() as c:
        # Nothing listens there: the URL only has to be valid for the router to start.
        r = c.add(Router(["https://127.0.0.1:9/"], *FAST))
        assert [w["url"] for w in r.workers()] == ["https://127.0.0.1:9"], r.workers()
        # An unreadable --worker-ca-file stops the start with one line.
        rc, out, err = serve("--worker", "https://127.0.0.1:9", "--listen", "127.0.0.1:0",
                             "--admin-listen", "127.0.0.1:0", "--worker-ca-file", "/nonexistent.pem")
        assert rc == 2, (rc, err)
        one_line_error(rc, err, "--worker-ca-file", "/nonexistent.pem")


class _TLSModels(threading.Thread):
    """A minimal https:// worker on an ephemeral port: GET /v1/models answers one model."""

    def __init__(self, cert, key):
        import http.server
        import ssl

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                body = json.dumps({"object": "list", "data": [{"id": "tls-model",
                                                               "object": "model"}]}).encode()
                self.send_response(200 if self.path.startswith("/v1/models") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(daemon=True)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = "https://127.0.0.1:%d" % self.httpd.server_address[1]
        self.start()

    def run(self):
        self.httpd.serve_forever(poll_interval=0.05)

    def kill(self):  # Cleanup protocol
        self.httpd.shutdown()
        self.httpd.server_close()


@test(timeout=20)
def test_https_worker_verified_with_ca_file():
    import shutil
    if shutil.which("openssl") is None:
        print("    (skipped: no openssl to make a certificate)")
        return
    d = tempfile.mkdtemp(prefix="kvr-tls-")
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=30)
        with Cleanup() as c:
            tls = c.add(_TLSModels(cert, key))
            # Verified against the given CA: the answer comes through.
            r = c.add(Router([tls.url], *FAST, "--worker-ca-file", cert))
            ok = request(r.port, "GET", "/v1/models")
            assert ok.status == 200 and ok.json()["data"][0]["id"] == "tls-model", ok
            # Against the system's CAs the self-signed certificate is refused: a 502, not a leak.
            r2 = c.add(Router([tls.url], *FAST))
            bad = request(r2.port, "GET", "/v1/models")
            assert bad.status == 502, bad
    finally:
        shutil.rmtree(d, ignore_errors=True)


@test(timeout=20)
def test_bad_admin_token_file_refused_at_start():
    with Cleanup() as c:
        empty = c.add(AdminToken(content=""))
        blank = c.add(AdminToken(content="  \n\n"))
        short = c.add(AdminToken(token="tooshort"))
        cases = [
            (empty.path, ["empty"]),
            (blank.path, ["empty"]),
            (short.path, ["shorter than 16"]),
            ("/nonexistent/admin-token", ["cannot open"]),
        ]
        failed = []
        for path, words in cases:
            try:
                rc, out, err = serve("--worker", W, "--listen", "127.0.0.1:0",
                                     "--admin-listen", "127.0.0.1:0", "--admin-token-file", path)
                assert rc == 2, "exit %d" % rc
                one_line_error(rc, err, "--admin-token-file", path, *words)
            except (AssertionError, subprocess.TimeoutExpired) as e:
                failed.append("%s: %s" % (path, str(e)[:200]))
        # The same through the config file's admin_token_file key.
        cfg = write_config({"workers": [W], "listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                            "admin_token_file": short.path})
        try:
            rc, out, err = serve("--config", cfg)
            one_line_error(rc, err, "--admin-token-file", short.path)
        except AssertionError as e:
            failed.append("config file: %s" % str(e)[:200])
        finally:
            os.unlink(cfg)
        assert not failed, "\n      ".join(failed)


@test(timeout=15)
def test_open_admin_off_loopback_warns_once():
    with Cleanup() as c:
        sim = c.add(Sim())
        wide = c.add(Router([sim], *FAST, "--admin-listen", "0.0.0.0:0"))
        warn = [ln for ln in wide.stderr_lines() if "unauthenticated" in ln]
        assert len(warn) == 1 and "--admin-token-file" in warn[0], wide.stderr_text()
        tok = c.add(AdminToken())
        guarded = c.add(Router([sim], *FAST, "--admin-listen", "0.0.0.0:0", *tok.flags))
        assert not [ln for ln in guarded.stderr_lines() if "unauthenticated" in ln]
        local = c.add(Router([sim], *FAST))
        assert not [ln for ln in local.stderr_lines() if "unauthenticated" in ln]


@test(timeout=20)
def test_sigterm_exits_zero_after_in_flight_stream():
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(20, 20)))
        r = c.add(Router([sim], *FAST))
        assert request(r.port, "GET", "/v1/models").status == 200
        # Idle router: SIGTERM -> exit 0 promptly.
        r.signal(signal.SIGTERM)
        rc = r.wait(5)
        assert rc == 0, "exit %r after SIGTERM; stderr tail: %s" % (rc, r.stderr_lines()[-5:])
        # Busy router: a stream in flight finishes, then the process exits 0. While it is in flight
        # (router/serve.c: "both listeners stop accepting and idle connections close") a new
        # connection to either listener is refused, and an idle keep-alive connection is closed
        # without an answer.
        r2 = c.add(Router([sim], *FAST))
        idle = c.add(Conn(r2.port, timeout=5))
        idle.send(build_request("GET", "/v1/models"))
        assert idle.read_response().status == 200
        conn = c.add(Conn(r2.port, timeout=10))
        n = 50  # ~1 s of tokens
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=n, stream=True)))
        seen = {}

        def on_head(resp):
            r2.signal(signal.SIGTERM)
            t_sig = time.monotonic()
            # The signal is handled on the loop: poll (bounded) until the public port refuses.
            while not h.connection_refused(r2.port):
                if time.monotonic() - t_sig > 2.0:
                    return
                time.sleep(0.01)
            seen["refused_after_s"] = time.monotonic() - t_sig
            seen["running"] = sim.metric("vllm:num_requests_running")
            seen["admin_refused"] = h.connection_refused(r2.admin_port)
            seen["idle_closed"] = idle.closed_by_peer(1.0)

        resp = conn.read_response("POST", on_head=on_head)
        assert "refused_after_s" in seen, "a new connection was still accepted 2 s after SIGTERM"
        assert seen["running"] == 1, "the stream was no longer in flight when new connections " \
            "were refused (%.3f s after SIGTERM): %r" % (seen["refused_after_s"], seen)
        assert seen["admin_refused"], "the admin listener still accepts connections: %r" % seen
        assert seen["idle_closed"], "an idle connection was not closed (or got an answer): %r" % seen
        assert resp.status == 200 and resp.complete, resp
        events = sse_events(resp.body)
        assert events[-1] == "[DONE]" and token_events(events) == n, events[-2:]
        conn.close()
        rc = r2.wait(5)
        assert rc == 0, "exit %r after SIGTERM with a stream in flight" % rc
        # SIGINT behaves the same.
        r3 = c.add(Router([sim], *FAST))
        r3.signal(signal.SIGINT)
        rc = r3.wait(5)
        assert rc == 0, "exit %r after SIGINT; stderr tail:\n%s" % (rc, "\n".join(
            ln for ln in r3.stderr_lines() if "ERROR" in ln or "SUMMARY" in ln or " #" in ln)[:1500])


TS_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@test(timeout=20)
def test_log_format_json_lines():
    """--log-format json: every stderr line is one JSON object (ts with milliseconds, level,
    component, msg), the access log included; the default text lines carry the same timestamp."""
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST, "--log-format", "json"))
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
        assert resp.status == 200, resp
        r.wait_line(r'"component":"access"', timeout=5)
        r.signal(signal.SIGTERM)
        rc = r.wait(5)
        assert rc == 0, "exit %r after SIGTERM; stderr tail: %s" % (rc, r.stderr_lines()[-5:])
        lines = [ln for ln in r.stderr_lines() if ln.strip()]
        assert len(lines) >= 3, lines
        objs = []
        for ln in lines:
            try:
                o = json.loads(ln)
            except ValueError as e:
                raise AssertionError("not a JSON line (%s): %r" % (e, ln))
            assert isinstance(o, dict) and set(o) == {"ts", "level", "component", "msg"}, o
            assert TS_MS.match(o["ts"]), "ts without milliseconds: %r" % o["ts"]
            assert o["level"] in ("debug", "info", "warn", "error"), o
            objs.append(o)
        comps = {o["component"] for o in objs}
        assert {"serve", "access"} <= comps, comps
        assert any("listening on" in o["msg"] for o in objs if o["component"] == "serve"), objs[:5]
        assert any("shutting down" in o["msg"] for o in objs), objs[-3:]
        # Text (the default): "TIME LEVEL COMPONENT: MSG" with the same millisecond timestamp.
        r2 = c.add(Router([sim], *FAST))
        first = r2.stderr_lines()[0]
        ts, level, rest = first.split(" ", 2)
        assert TS_MS.match(ts), "text timestamp without milliseconds: %r" % first
        assert level in ("debug", "info", "warn", "error") and ": " in rest, first
    # A bad value: exit 2, one line naming the flag.
    for args in (("--log-format", "yaml"), ("--shutdown-grace-ms", "99999999")):
        rc, out, err = serve("--worker", W, "--listen", "127.0.0.1:0", "--admin-listen",
                             "127.0.0.1:0", *args)
        assert rc == 2, (args, rc, err)
        one_line_error(rc, err, args[0], args[1])


@test(timeout=20)
def test_shutdown_grace_aborts_after_the_grace():
    """--shutdown-grace-ms 300: a stream of ~3 s still in flight at SIGTERM is aborted after about
    0.3 s (not the default 10 s), and the router still exits 0."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(20, 20)))
        r = c.add(Router([sim], *FAST, "--shutdown-grace-ms", "300"))
        conn = c.add(Conn(r.port, timeout=10))
        n = 150  # ~3 s of tokens
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=n, stream=True)))
        t = {}

        def on_head(resp):
            r.signal(signal.SIGTERM)
            t["sig"] = time.monotonic()

        resp = conn.read_response("POST", on_head=on_head)
        cut_after = time.monotonic() - t["sig"]
        assert resp.status == 200, resp
        events = sse_events(resp.body)
        # The stream ends early with the proxy's error event (src/serve/proxy.c broken_stream()).
        assert token_events(events) < n, "the stream finished despite a 300 ms grace"
        assert "shutting down" in resp.body.decode(errors="replace"), events[-2:]
        assert cut_after < 2.5, "stream cut %.2f s after SIGTERM (grace 300 ms)" % cut_after
        conn.close()  # else the router's lingering close waits up to 2 s for our EOF
        rc = r.wait(5)
        assert rc == 0, "exit %r after the grace; stderr tail: %s" % (rc, r.stderr_lines()[-5:])
        assert any("aborting" in ln for ln in r.stderr_lines()), r.stderr_lines()[-5:]


def bench(*args, timeout=5):
    """Runs `kvrouter bench ARGS` to completion; returns (exit code, stdout, stderr)."""
    p = subprocess.run([h.KVROUTER, "bench"] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


NOWHERE = "http://127.0.0.1:1"  # nothing listens: a bench that got past its command line would fail


@test(timeout=10)
def test_bench_help_lists_workload_flags():
    rc, out, err = bench("--help")
    assert rc == 0, (rc, err)
    for flag in ("--replay-order", "--replay-dataset", "--answer-mean", "--answer-std",
                 "--replay-width", "--multiturn-mode"):
        assert flag in out, "%s not in bench --help" % flag
    line = next(ln for ln in out.splitlines() if "--replay-order" in ln)
    assert "blocks" in line and "sample" in line, line


@test(timeout=20)
def test_bench_bad_workload_values_named():
    cases = [
        (("--replay-order", "bogus"), ["--replay-order", "bogus"]),
        (("--replay-order", "Sample"), ["--replay-order", "Sample"]),
        (("--replay-order=",), ["--replay-order"]),
        (("--replay-order",), ["--replay-order"]),
        (("--replay-dataset", "-1"), ["--replay-dataset", "-1"]),
        (("--replay-dataset", "1.5"), ["--replay-dataset", "1.5"]),
        (("--replay-dataset", "ten"), ["--replay-dataset", "ten"]),
        (("--replay-dataset", "1000001"), ["--replay-dataset"]),
        (("--answer-mean", "x"), ["--answer-mean", "x"]),
        (("--answer-mean", "-1"), ["--answer-mean", "-1"]),
        (("--answer-mean", "inf"), ["--answer-mean"]),
        (("--answer-mean", "nan"), ["--answer-mean"]),
        (("--answer-std", "-0.5"), ["--answer-std", "-0.5"]),
        (("--answer-std", ""), ["--answer-std"]),
    ]
    failed = []
    for args, names in cases:
        try:
            t0 = time.monotonic()
            rc, out, err = bench("--url", NOWHERE, *args)
            one_line_error(rc, err, *names)
            # Rejected while parsing: nothing was run (no progress, no report) and no time spent.
            assert out == "", "stdout %r" % out[:200]
            assert time.monotonic() - t0 < 3, "took %.1f s" % (time.monotonic() - t0)
        except (AssertionError, subprocess.TimeoutExpired) as e:
            failed.append("%s: %s" % (" ".join(args), str(e)[:200]))
    # Good values pass the parser: the one error is then the (deliberately) bad --rates after them.
    good = [("--replay-order", "sample"), ("--replay-order=blocks",), ("--replay-dataset", "0"),
            ("--replay-dataset", "1000000"), ("--answer-mean", "0"), ("--answer-mean", "350.5"),
            ("--answer-std", "0"), ("--answer-std=120",)]
    for args in good:
        try:
            rc, out, err = bench("--url", NOWHERE, *args, "--rates", "x")
            line = one_line_error(rc, err, "--rates")
            flag = args[0].split("=")[0]
            assert flag not in line, "good value rejected: %r" % line
        except (AssertionError, subprocess.TimeoutExpired) as e:
            failed.append("%s: %s" % (" ".join(args), str(e)[:200]))
    assert not failed, "%d of %d cases failed:\n      %s" % (len(failed), len(cases) + len(good),
                                                           "\n      ".join(failed))


@test(timeout=40)
def test_bench_model_lookup_and_policy_switch():
    with tempfile.TemporaryDirectory() as out, Cleanup() as c:
        # No server: the model lookup fails with one line naming the URL it asked, no report.
        rc, _, err = bench("--url", NOWHERE + "/v1/chat/completions", "--rates", "1",
                           "--num-prompts", "1", "--quiet", "--out", out)
        line = one_line_error(rc, err, "no --model given", NOWHERE + "/v1/models")
        assert rc == 1, (rc, line)
        assert os.listdir(out) == [], os.listdir(out)

        sim = c.add(Sim())
        r = c.add(Router([sim]))
        url = "http://127.0.0.1:%d/v1/chat/completions" % r.port
        admin = "http://127.0.0.1:%d/" % r.admin_port  # trailing slash: trimmed
        # An unknown policy: the router's 400 reaches the user, nothing is measured.
        rc, _, err = bench("--url", url, "--admin", admin, "--ab", "nope,round_robin",
                           "--rates", "2", "--num-prompts", "2", "--warmup", "0",
                           "--quiet", "--out", out, timeout=20)
        line = one_line_error(rc, err, "switching policy to nope", "/admin/policy", "HTTP 400")
        assert rc == 1, (rc, line)
        # Good policies: the model comes from GET /v1/models, each run switched the router.
        rc, _, err = bench("--url", url, "--admin", admin, "--ab", "least_load,round_robin",
                           "--rates", "2", "--num-prompts", "2", "--warmup", "0",
                           "--cooldown-s", "0", "--output-mean", "20", "--output-std", "0",
                           "--quiet", "--out", out, timeout=20)
        assert rc == 0, (rc, err[-800:])
        models = request(sim.port, "GET", "/v1/models").json()["data"][0]["id"]
        with open(os.path.join(out, "requests.jsonl")) as f:
            reqs = [json.loads(ln) for ln in f if ln.strip()]
        assert len(reqs) == 4 and all(q.get("ok") for q in reqs), reqs[:2]
        pol = request(r.admin_port, "GET", "/admin/policy").json()["policy"]
        assert pol == "round_robin", pol
        results = [f for f in os.listdir(os.path.join(out, "results")) if f.endswith(".json")]
        assert len(results) == 2, results
        found = set()
        for name in results:
            with open(os.path.join(out, "results", name)) as f:
                doc = json.load(f)
            found.add(doc.get("model_id"))
        assert found == {models}, (found, models)


@test(timeout=10)
def test_sim_help_defaults_are_the_live_defaults():
    """`kvrouter sim --help` derives each "(default X)" from the option structures, so it agrees
    with what the sim runs (its --print-costs line), and flags given before --help do not leak in."""
    def run(*args):
        p = subprocess.run([h.KVROUTER, "sim"] + list(args), stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=5)
        assert p.returncode == 0, (args, p.returncode, p.stderr[-300:])
        return p.stdout.decode()
    costs = run("--print-costs").splitlines()
    # "cost model: weights_ms=21.5 ...", "frontend: req_ms=2 ...; retok_drift=0.001",
    # then "kv cache: 21770 blocks x 16 tokens = ..."
    live = dict(kv.split("=") for kv in costs[0].split(": ", 1)[1].split())
    live.update(kv.rstrip(";").split("=") for kv in costs[1].split(": ", 1)[1].split()
                if "=" in kv)
    out = run("--cost-dense-tok-us", "5", "--cost-weights-ms=1", "--frontend-req-ms=9", "--help")
    lines = out.splitlines()
    for flag, key in (("cost-weights-ms", "weights_ms"), ("cost-dense-tok-us", "dense_tok_us"),
                      ("cost-step-ms", "step_ms"), ("cost-per-seq-ms", "per_seq_ms"),
                      ("cost-decode-ctx-ns", "decode_ctx_ns"), ("cost-attn-pair-ns", "attn_pair_ns"),
                      ("frontend-req-ms", "req_ms"), ("frontend-prompt-tok-us", "prompt_tok_us"),
                      ("frontend-stream-tok-us", "stream_tok_us"), ("retok-drift", "retok_drift")):
        i = next(k for k, ln in enumerate(lines) if ln.strip().startswith("--" + flag + " "))
        assert lines[i + 1].endswith("(default %s)" % live[key]), (flag, lines[i + 1], live)
    blocks = costs[2].split()[2]
    assert "(default %s)" % blocks in out, (blocks, out[:400])
    # Off and unset options show no default.
    i = next(k for k, ln in enumerate(lines) if ln.strip().startswith("--fixed-ttft-ms "))
    assert "(default" not in lines[i + 1], lines[i + 1]


SUBCOMMANDS = [["serve"], ["sim"], ["bench"], ["bench", "routing"], ["demo"]]


def run_cmd(words, *args, timeout=10):
    """Runs `kvrouter WORDS ARGS` to completion; returns (exit code, stdout, stderr)."""
    p = subprocess.run([h.KVROUTER] + words + [str(a) for a in args], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


@test(timeout=30)
def test_help_and_version_on_every_subcommand():
    _, version, _ = run_cmd(["--version"])
    assert re.fullmatch(r"kvrouter \d+\.\d+\.\d+ \(commit ([0-9a-f]{4,40}|unknown)\)\n", version), version
    for words in SUBCOMMANDS:
        name = " ".join(words)
        rc, out, err = run_cmd(words, "--help")
        assert rc == 0 and err == "", (name, rc, err)
        assert out.startswith("usage: kvrouter %s " % name), (name, out[:200])
        assert "  -h, --help\n" in out and "  --version\n" in out, (name, out[-300:])
        rc2, out2, _ = run_cmd(words, "-h")
        assert rc2 == 0 and out2 == out, name
        rc3, out3, err3 = run_cmd(words, "--version")
        assert rc3 == 0 and out3 == version and err3 == "", (name, rc3, out3, err3)
        # Both win wherever they stand, even after a bad flag.
        rc4, out4, _ = run_cmd(words, "--bogus", "--help")
        assert rc4 == 0 and out4 == out, (name, rc4)
        rc5, out5, _ = run_cmd(words, "--bogus", "--version")
        assert rc5 == 0 and out5 == version, (name, rc5)


@test(timeout=30)
def test_bad_flag_one_wording_on_every_subcommand():
    bad_value = {"serve": ("--max-body-bytes", "lots"), "sim": ("--time-scale", "0"),
                 "bench": ("--num-prompts", "0"), "bench routing": ("--workers", "0"),
                 "demo": ("--workers", "17")}
    failed = []
    for words in SUBCOMMANDS:
        name = " ".join(words)
        flag, value = bad_value[name]
        cases = [
            (("--bogus",), "kvrouter %s: --bogus: unknown option (see kvrouter %s --help)"
             % (name, name)),
            (("--bogus=1",), "kvrouter %s: --bogus: unknown option (see kvrouter %s --help)"
             % (name, name)),
            (("stray",), "kvrouter %s: 'stray': unexpected argument (see kvrouter %s --help)"
             % (name, name)),
            ((flag,), "kvrouter %s: %s: missing value" % (name, flag)),
            ((flag, value), "kvrouter %s: %s: '%s' " % (name, flag, value)),
            (("%s=%s" % (flag, value),), "kvrouter %s: %s: '%s' " % (name, flag, value)),
        ]
        for args, want in cases:
            try:
                rc, out, err = run_cmd(words, *args)
                line = one_line_error(rc, err)
                assert rc == 2, "exit %d" % rc
                assert line.startswith(want), "%r does not start with %r" % (line, want)
                assert out == "", "stdout %r" % out[:200]
            except (AssertionError, subprocess.TimeoutExpired) as e:
                failed.append("%s %s: %s" % (name, " ".join(args), str(e)[:300]))
    assert not failed, "%d cases failed:\n      %s" % (len(failed), "\n      ".join(failed))


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0]))
