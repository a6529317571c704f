#!/usr/bin/env python3
"""`kvrouter serve` at SIGHUP (config reload) and under chaos, through real processes.

Reload tests: the router starts with --config FILE (workers, policy, timeouts only in the file);
the test rewrites the file and sends SIGHUP to the router's PID, then reads GET /admin/workers,
GET /admin/policy and /metrics: the new policy and worker list are in force (a removed worker
drains while its stream finishes), a setting that needs a restart is logged and left as it was,
traffic keeps flowing, and kvrouter_config_reloads_total counts each result. A broken file (bad
JSON, an unknown policy, a bad policy parameter, a bad worker URL) changes nothing, logs one error
line with the parser's position, and the router stays alive; a router started without --config
logs that there is nothing to reload and stays alive.

Chaos test: bench/scripts/soak/chaos_soak.py for --chaos-duration seconds (default 75): kills, hangs,
refusals, cut streams, policy switches, worker adds and drains, good and broken reloads under
load; it must pass (no bad outcome, no stream ending with an error event while a healthy worker
remained, in-flight 0 at the end, RSS growth < 5%, clean exit).

Run:  python3 tests/router/test_chaos.py --kvrouter build/kvrouter [--chaos-duration S]
      [-k substring] [-v]
"""
import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "scripts", "soak"))
import kvrharness as h  # noqa: E402
from kvrharness import Cleanup, Router, Sim, chat_body, request, sse_events, wait_for  # noqa: E402

TESTS, test = h.registry()
SCRATCH = h.Scratch("kvr-test-chaos-")
OPTS = argparse.Namespace(chaos_duration=75.0)


def write(path, obj_or_text):
    text = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def reloads(r):
    m = h.parse_prom_samples(r.metrics_text())
    return (h.prom_value(m, "kvrouter_config_reloads_total", result="success"),
            h.prom_value(m, "kvrouter_config_reloads_total", result="failure"))


def hup(r, want):
    """SIGHUP by PID, then waits until the reload counters read want (success, failure)."""
    r.signal(signal.SIGHUP)
    wait_for(lambda: reloads(r) == want, 3.0, "reloads counted as %s" % (want,))
    assert r.alive(), "the router exited at SIGHUP (status %s)" % r.p.poll()


def policy(r):
    """The policy in force and its parameters (not the decision counts, which move with traffic)."""
    resp = request(r.admin_port, "GET", "/admin/policy")
    assert resp.status == 200, resp
    j = resp.json()
    return {"policy": j["policy"], "params": j["params"]}


def served(r):
    return sorted(w["url"] for w in r.workers() if w["state"] != "draining")


def flows(r, n=4):
    """n streamed requests complete through the router; returns the workers that served them."""
    seen = set()
    for _ in range(n):
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body(max_tokens=4, stream=True),
                       timeout=10)
        assert resp.status == 200 and sse_events(resp.body)[-1] == "[DONE]", resp
        seen.add(resp.header("x-kvrouter-worker"))
    return seen


@test(timeout=40)
def test_reload_applies_policy_workers_and_timeouts():
    cfg = os.path.join(SCRATCH.path, "reload.json")
    with Cleanup() as c:
        a, b, d = (c.add(Sim(fixed=(20, 5))) for _ in range(3))
        write(cfg, {"workers": [a.url, b.url], "policy": "round_robin",
                    "timeouts": {"idle_ms": 60000}})
        r = c.add(Router([], "--config", cfg, *h.FAST))
        assert served(r) == sorted([a.url, b.url])
        assert reloads(r) == (0, 0)
        flows(r)
        # A long stream on b is in flight while b leaves the list: it must finish normally.
        slow = {}

        def long_stream():
            slow["resp"] = request(r.port, "POST", "/v1/chat/completions",
                                   chat_body(max_tokens=150, stream=True), timeout=20)
        ids = {w["url"]: w["id"] for w in r.workers()}
        t = threading.Thread(target=long_stream)
        t.start()
        wait_for(lambda: sum(w["in_flight"] for w in r.workers()) == 1, 2.0, "the long stream")
        busy = [w for w in r.workers() if w["in_flight"] == 1][0]
        keep = a if busy["url"] == b.url else b
        gone = b if keep is a else a
        write(cfg, {"workers": [keep.url, d.url], "policy": "kv_aware",
                    "policy_params": {"balance_slack": 3}, "timeouts": {"idle_ms": 5000},
                    "log_level": "info", "cache": {"block_chars": 128}})
        hup(r, (1, 0))
        assert served(r) == sorted([keep.url, d.url]), r.workers()
        draining = [w for w in r.workers() if w["url"] == gone.url]
        assert draining and draining[0]["state"] == "draining", r.workers()
        p = policy(r)
        assert p["policy"] == "kv_aware" and p["params"]["balance_slack"] == 3, p
        r.wait_line(r"reload: timeouts.idle_ms: 60000 -> 5000")
        r.wait_line(r"reload: cache.block_chars: 64 -> 128 needs restart, left at 64")
        t.join(20)
        resp = slow["resp"]
        assert resp.status == 200 and sse_events(resp.body)[-1] == "[DONE]", resp
        assert h.token_events(sse_events(resp.body)) == 150
        # The drained worker is gone once its stream ended; the kept one keeps its id.
        wait_for(lambda: gone.url not in [w["url"] for w in r.workers()], 2.0, "drained worker freed")
        assert {w["url"]: w["id"] for w in r.workers()}[keep.url] == ids[keep.url]
        assert flows(r, 6) <= {str(w["id"]) for w in r.workers()}
        # The same file again changes nothing (the policy keeps its state).
        n_policy = len([ln for ln in r.stderr_lines() if "policy is now" in ln])
        hup(r, (2, 0))
        assert len([ln for ln in r.stderr_lines() if "policy is now" in ln]) == n_policy
        r.wait_line(r"config reloaded: 0 changes applied, 1 need a restart")


@test(timeout=30)
def test_bad_config_changes_nothing_and_router_survives():
    cfg = os.path.join(SCRATCH.path, "bad.json")
    with Cleanup() as c:
        a, b = c.add(Sim(fixed=(20, 5))), c.add(Sim(fixed=(20, 5)))
        good = {"workers": [a.url], "policy": "least_load"}
        write(cfg, good)
        r = c.add(Router([], "--config", cfg, *h.FAST))
        before = (served(r), policy(r))
        cases = [
            ('{"workers": ["%s"], "policy": "kv_aware",\n  "seed": 1,, }' % b.url,
             r"config reload failed, nothing changed: .*bad\.json: line 2, column \d+: invalid JSON"),
            ({"workers": [b.url], "policy": "no_such_policy"},
             r"config reload failed, nothing changed: .*unknown policy 'no_such_policy'"),
            ({"workers": [b.url], "policy": "kv_aware", "policy_params": {"bogus": 1}},
             r"config reload failed, nothing changed: policy_params of kv_aware: params\.bogus"),
            ({"workers": ["ftp://127.0.0.1:1"], "policy": "kv_aware"},
             r"config reload failed, nothing changed: .*ftp://127\.0\.0\.1:1"),
        ]
        for i, (content, rx) in enumerate(cases):
            start = len(r.stderr_lines())
            write(cfg, content)
            hup(r, (0, i + 1))
            line = r.wait_line(rx, start=start).string
            errors = [ln for ln in r.stderr_lines()[start:] if " error " in ln]
            assert errors == [line], errors
            assert (served(r), policy(r)) == before, (served(r), policy(r))
            assert flows(r, 2) == {str(r.workers()[0]["id"])}
        os.unlink(cfg)  # an unreadable file fails the same way
        hup(r, (0, len(cases) + 1))
        write(cfg, good)
        hup(r, (1, len(cases) + 1))
        assert (served(r), policy(r)) == before


@test(timeout=20)
def test_hup_without_config_is_logged_and_harmless():
    with Cleanup() as c:
        a = c.add(Sim(fixed=(20, 5)))
        r = c.add(Router([a], *h.FAST))
        for _ in range(3):
            r.signal(signal.SIGHUP)
        r.wait_line(r"SIGHUP: no --config file was given, nothing to reload")
        time.sleep(0.2)
        assert r.alive() and reloads(r) == (0, 0)
        assert flows(r, 2)


@test(timeout=300)
def test_chaos_soak_short():
    import chaos_soak
    out = os.path.join(SCRATCH.path, "chaos")
    argv = ["--kvrouter", h._kvrouter(), "--duration", str(OPTS.chaos_duration), "--out", out,
            "--seed", "7", "--event-interval-s", "2"]
    rc = chaos_soak.main(argv)
    with open(os.path.join(out, "chaos_summary.json")) as f:
        s = json.load(f)
    assert rc == 0 and s["ok"], s["failures"]
    assert s["requests"] == s["completed"] + s["clean_errors"] and s["bad_outcomes"] == 0, s
    ch = s["chaos"]
    assert ch["kills"] >= 1 and ch["reloads"] + ch["bad_reloads"] >= 1, ch
    assert s["completed"] > s["clean_errors"], s


if __name__ == "__main__":
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--chaos-duration", type=float, default=OPTS.chaos_duration)
    OPTS, rest = ap.parse_known_args()
    sys.exit(h.run(TESTS, rest, description=__doc__, around=SCRATCH.around))
