#!/usr/bin/env python3
"""Integration tests of worker discovery from a DNS name (`kvrouter serve --discover`,
src/serve/discovery.c), through real processes on loopback.

Covers: `localhost` discovered (127.0.0.1, and ::1 when /etc/hosts maps localhost to it too; else
that part is skipped with the reason printed) with requests reaching each discovered sim; an IPv6
address ([::1]) as a worker with its derived KV-event endpoints; a discovered sim's KV events read
from the endpoints derived from its address (precise mode); static --worker entries beside
discovered ones; a name that cannot resolve (a 64-octet label, refused by the resolver itself, so
no DNS packet leaves the machine): the router starts with no worker, /health 503, one warning line,
the error counter grows; a changed answer (a reload pointing the name elsewhere) draining the gone
worker; SIGHUP adding and removing the discovery (the removed worker drains: its
stream in flight finishes whole, then it is gone); bad --discover flags (one line, exit 2).

Removal of an address from a live DNS answer is covered by the unit test of the diff
(tests/src/serve/test_discovery.c): changing what a name resolves to needs root-owned files here.

Run:  python3 tests/router/test_discovery.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (FAST, Cleanup, Conn, Proc, Router, Sim, assert_openai_error,  # noqa: E402
                        build_request, chat_body, parse_prom_samples, prom_value, request,
                        sse_events, token_events, wait_for)

TESTS, test = h.registry()

# A name no resolver can answer, refused before any query is sent (RFC 1035: labels <= 63 octets).
UNRESOLVABLE = "a" * 64 + ".invalid"


class Sim6(Proc):
    """`kvrouter sim` on [::1]:port (the harness's Sim listens on 127.0.0.1 only)."""

    def __init__(self, port=0, fixed=(20, 5)):
        argv = [h._kvrouter(), "sim", "--listen", "[::1]:%d" % port, "--log-level", "warn",
                "--fixed-ttft-ms", str(fixed[0]), "--fixed-itl-ms", str(fixed[1])]
        super().__init__(argv, "sim6")
        try:
            m = self.wait_line(r"sim listening on \[::1\]:(\d+)", timeout=10.0)
        except BaseException:
            self.kill()
            raise
        self.port = int(m.group(1))
        self.url = "http://[::1]:%d" % self.port


def localhost_families():
    """The address families `localhost` resolves to here (the router's getaddrinfo sees the same)."""
    return {ai[0] for ai in socket.getaddrinfo("localhost", 80, 0, socket.SOCK_STREAM)}


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def metrics(r):
    return parse_prom_samples(r.metrics_text())


def served_by(r, n):
    """Sends n requests; returns {worker id: count} from x-kvrouter-worker."""
    seen = {}
    for _ in range(n):
        x = request(r.port, "POST", "/v1/chat/completions", chat_body())
        assert x.status == 200, (x.status, x.body[:200])
        wid = x.header("x-kvrouter-worker")
        seen[wid] = seen.get(wid, 0) + 1
    return seen


@test(timeout=40)
def test_discover_localhost_finds_each_address():
    fams = localhost_families()
    with Cleanup() as c:
        sim4 = c.add(Sim())
        want = {"http://127.0.0.1:%d" % sim4.port}
        if socket.AF_INET6 in fams and ipv6_loopback():
            sim6 = c.add(Sim6(port=sim4.port))
            want.add(sim6.url)
        else:
            print("  skip (part): localhost does not resolve to ::1 here (/etc/hosts maps it to %s"
                  " only): one worker expected, the IPv6 case is test_discover_ipv6_address"
                  % ", ".join(sorted(socket.AddressFamily(f).name for f in fams)))
        r = c.add(Router([], *FAST, "--discover", "http://localhost:%d" % sim4.port,
                         "--discover-interval-ms", "200", "--policy", "round_robin"))
        wait_for(lambda: {w["url"] for w in r.workers()} == want, 5.0,
                 "the discovered workers %s" % sorted(want))
        assert all(w["state"] == "up" for w in r.workers()), r.workers()
        m = metrics(r)
        assert prom_value(m, "kvrouter_discovery_workers") == len(want), m
        assert prom_value(m, "kvrouter_discovery_resolutions_total", result="ok") >= 1
        assert prom_value(m, "kvrouter_discovery_resolutions_total", result="error") == 0
        seen = served_by(r, 4 * len(want))
        assert len(seen) == len(want), seen  # every discovered worker served requests
        # Re-resolved every 200 ms, the same answer changes nothing.
        ok = prom_value(metrics(r), "kvrouter_discovery_resolutions_total", result="ok")
        wait_for(lambda: prom_value(metrics(r), "kvrouter_discovery_resolutions_total",
                                    result="ok") >= ok + 2, 3.0, "two more resolutions")
        assert {w["url"] for w in r.workers()} == want
        assert "discovery: localhost: resolved to" in r.stderr_text()


@test(timeout=40)
def test_discover_ipv6_address():
    if not ipv6_loopback():
        print("  skip: no IPv6 loopback (::1) on this machine")
        return
    with Cleanup() as c:
        sim = c.add(Sim6())
        r = c.add(Router([], *FAST, "--discover", "http://[::1]:%d" % sim.port,
                         "--discover-interval-ms", "200", "--discover-kv-events-port", "45557",
                         "--discover-kv-replay-port", "45558"))
        wait_for(lambda: len(r.workers()) == 1, 5.0, "the discovered IPv6 worker")
        w = r.workers()[0]
        assert w["url"] == sim.url, w
        assert w["kv_events"]["endpoint"] == "tcp://[::1]:45557", w["kv_events"]
        assert w["kv_events"]["replay_endpoint"] == "tcp://[::1]:45558", w["kv_events"]
        x = request(r.port, "POST", "/v1/chat/completions", chat_body())
        assert x.status == 200 and x.header("x-kvrouter-worker") == str(w["id"]), x


def free_tcp_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@test(timeout=40)
def test_discovered_worker_reads_derived_kv_events():
    """Precise mode through discovery: the sim publishes KV events on tcp://127.0.0.1:N (+ replay
    on another free port); the router derives both endpoints from the discovered address, connects
    and routes the worker on its precise index."""
    ev, rp = free_tcp_port(), free_tcp_port()
    with Cleanup() as c:
        cfg = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:%d" % ev,
               "replay_endpoint": "tcp://127.0.0.1:%d" % rp}
        sim = c.add(Sim("--time-scale", 20, "--kv-events-config", json.dumps(cfg), fixed=None))
        r = c.add(Router([], *FAST, "--discover", "http://127.0.0.1:%d" % sim.port,
                         "--discover-interval-ms", "200", "--discover-kv-events-port", ev,
                         "--discover-kv-replay-port", rp))
        wait_for(lambda: len(r.workers()) == 1, 5.0, "the discovered worker")
        kv = r.workers()[0]["kv_events"]
        assert kv["endpoint"] == "tcp://127.0.0.1:%d" % ev, kv
        assert kv["replay_endpoint"] == "tcp://127.0.0.1:%d" % rp, kv

        def batch_after_request():  # the subscription may join after the first request's events
            x = request(r.port, "POST", "/v1/chat/completions", chat_body("Hello " * 100))
            assert x.status == 200, x
            return r.workers()[0]["kv_events"]["batches"] >= 1

        wait_for(batch_after_request, 10.0, "an event batch of the discovered worker applied",
                 interval=0.2)
        kv = r.workers()[0]["kv_events"]
        assert kv["index"] == "precise" and kv["blocks"] > 0, kv


@test(timeout=40)
def test_static_and_discovered_workers_coexist():
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        r = c.add(Router([a], *FAST, "--discover", "http://127.0.0.1:%d" % b.port,
                         "--discover-interval-ms", "200", "--policy", "round_robin"))
        wait_for(lambda: len(r.workers()) == 2, 5.0, "the static and the discovered worker")
        assert {w["url"] for w in r.workers()} == {a.url, b.url}
        assert prom_value(metrics(r), "kvrouter_discovery_workers") == 1
        assert len(served_by(r, 4)) == 2


@test(timeout=40)
def test_discovery_of_a_static_worker_adds_no_duplicate():
    with Cleanup() as c:
        a = c.add(Sim())
        r = c.add(Router([a], *FAST, "--discover", "http://127.0.0.1:%d" % a.port,
                         "--discover-interval-ms", "100"))
        wait_for(lambda: prom_value(metrics(r), "kvrouter_discovery_workers") == 1, 5.0,
                 "the address discovered")
        assert [w["url"] for w in r.workers()] == [a.url]


@test(timeout=40)
def test_unresolvable_name_starts_unready_and_counts_errors():
    with Cleanup() as c:
        r = c.add(Router([], *FAST, "--discover", "http://%s:8000" % UNRESOLVABLE,
                         "--discover-interval-ms", "100"))
        r.wait_line(r"warn discovery: a+\.invalid: DNS resolution failed: .*; keeping the 0 "
                    r"discovered workers", timeout=5.0)
        wait_for(lambda: prom_value(metrics(r), "kvrouter_discovery_resolutions_total",
                                    result="error") >= 3, 5.0, "three failed resolutions")
        m = metrics(r)
        assert prom_value(m, "kvrouter_discovery_workers") == 0
        assert prom_value(m, "kvrouter_discovery_resolutions_total", result="ok") == 0
        assert r.workers() == []
        hz = request(r.admin_port, "GET", "/health")
        assert hz.status == 503, (hz.status, hz.body)
        assert_openai_error(request(r.port, "POST", "/v1/chat/completions", chat_body()), 503)
        # One line per episode, not one per failed round.
        lines = [l for l in r.stderr_lines() if "DNS resolution failed" in l]
        assert len(lines) == 1, lines


def write_config(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


@test(timeout=60)
def test_reload_adds_then_removes_discovery_draining():
    with Cleanup() as c, tempfile.TemporaryDirectory() as tmp:
        a = c.add(Sim(fixed=(20, 20)))
        b = c.add(Sim(fixed=(20, 20)))
        cfg = os.path.join(tmp, "kvrouter.json")
        write_config(cfg, {"workers": [a.url]})
        r = c.add(Router([], *FAST, "--config", cfg))
        assert [w["url"] for w in r.workers()] == [a.url]
        # SIGHUP with a discovery section: b's address appears, a stays.
        write_config(cfg, {"discovery": {"url": "http://127.0.0.1:%d" % b.port,
                                         "interval_ms": 100}})
        r.signal(signal.SIGHUP)
        wait_for(lambda: {w["url"] for w in r.workers()} == {b.url}, 5.0,
                 "a drained (no longer listed) and b discovered")
        bid = str(r.workers()[0]["id"])
        # A stream in flight on b, then a reload that removes the discovery: b drains.
        n = 50  # ~1 s of tokens
        conn = c.add(Conn(r.port, timeout=10))
        conn.send(build_request("POST", "/v1/chat/completions",
                                chat_body(max_tokens=n, stream=True)))
        state = {}

        def on_head(resp):
            state["wid"] = resp.header("x-kvrouter-worker")
            write_config(cfg, {"workers": [a.url]})
            r.signal(signal.SIGHUP)
            r.wait_line(r"discovery: discovery removed: draining the 1 discovered workers", 5.0)
            state["during"] = {str(w["id"]): w["state"] for w in r.workers()}

        resp = conn.read_response("POST", on_head=on_head)
        assert state["wid"] == bid, state
        assert state["during"].get(bid) == "draining", state
        assert resp.status == 200 and resp.complete, resp
        events = sse_events(resp.body)
        assert events[-1] == "[DONE]" and token_events(events) == n, events[-3:]
        wait_for(lambda: [w["url"] for w in r.workers()] == [a.url], 3.0,
                 "b removed after its stream, a back")
        assert prom_value(metrics(r), "kvrouter_discovery_workers") == 0
        x = request(r.port, "POST", "/v1/chat/completions", chat_body())
        assert x.status == 200 and x.header("x-kvrouter-worker") != bid


@test(timeout=40)
def test_answer_change_drains_gone_worker():
    """A reload points the discovery at another address: once it answers, the worker of the old
    address is drained and removed and the new one serves; never a moment with no worker."""
    with Cleanup() as c, tempfile.TemporaryDirectory() as tmp:
        a = c.add(Sim())
        b = c.add(Sim())
        cfg = os.path.join(tmp, "kvrouter.json")
        write_config(cfg, {"discovery": {"url": a.url, "interval_ms": 100}})
        r = c.add(Router([], *FAST, "--config", cfg))
        wait_for(lambda: [w["url"] for w in r.workers()] == [a.url], 5.0, "a discovered")
        write_config(cfg, {"discovery": {"url": b.url, "interval_ms": 100}})
        r.signal(signal.SIGHUP)
        wait_for(lambda: [w["url"] for w in r.workers()] == [b.url], 5.0, "a replaced by b")
        r.wait_line(r"discovery: %s is gone from 127\.0\.0\.1: draining worker 0" % re.escape(a.url))
        assert prom_value(metrics(r), "kvrouter_discovery_workers") == 1
        assert served_by(r, 2) == {str(r.workers()[0]["id"]): 2}


@test(timeout=30)
def test_bad_discover_flags_are_one_line_errors():
    cases = [
        (["--discover", "ftp://workers:8000"], "must start with http:// or https://"),
        (["--discover", "http://workers"], "needs a port"),
        (["--discover", "http://workers:99999"], "port must be a number in 1..65535"),
        (["--discover", "http://workers:8000/v1"], "no path"),
        (["--discover", "http://workers:8000", "--discover-interval-ms", "-5"],
         "--discover-interval-ms"),
        (["--discover", "http://workers:8000", "--discover-interval-ms", "soon"],
         "--discover-interval-ms"),
        (["--discover", "http://workers:8000", "--discover-kv-events-port", "0"],
         "--discover-kv-events-port"),
        (["--discover", "http://workers:8000", "--discover-kv-replay-port", "5558"],
         "needs --discover-kv-events-port"),
        ([], "give at least one --worker URL or --discover URL"),
    ]
    for args, want in cases:
        p = subprocess.run([h._kvrouter(), "serve", "--listen", "127.0.0.1:0", "--admin-listen",
                            "127.0.0.1:0"] + args, capture_output=True, text=True, timeout=10)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2, (args, p.returncode, p.stderr)
        assert len(lines) == 1 and lines[0].startswith("kvrouter serve: "), (args, p.stderr)
        assert want in lines[0], (args, lines[0])


@test(timeout=20)
def test_help_documents_discovery():
    p = subprocess.run([h._kvrouter(), "serve", "--help"], capture_output=True, text=True,
                       timeout=10)
    assert p.returncode == 0
    for flag, key in (("--discover URL", "discovery.url"),
                      ("--discover-interval-ms MS", "discovery.interval_ms"),
                      ("--discover-kv-events-port PORT", "discovery.kv_events_port"),
                      ("--discover-kv-replay-port PORT", "discovery.kv_replay_port")):
        assert flag in p.stdout and key in p.stdout, (flag, key)


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
