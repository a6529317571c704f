#!/usr/bin/env python3
"""Two `kvrouter serve` replicas in front of the same `kvrouter sim` workers, each reading the
other's load (--peer ADMIN_URL, GET /admin/load), on 127.0.0.1.

Checked: a replica's own load (GET /admin/load) lists its in-flight requests per worker URL and
never its peers'; streams in flight through replica A show up as peer load in replica B's worker
view, metrics and route/explain snapshots, so B sends a new request to the worker A left idle;
with the admin token the polls carry it (a peer with another token is counted as an error);
a peer that stops is marked down and its figures age out; route/explain tokenizes like the proxy
and shows the precise index when a worker publishes KV events; --peer validation. With
--peer-sync-listen the replicas announce each request as it happens: B sees A's streams start and
end within a fraction of the poll interval, and drops A's announced load when A goes silent.
With --reuse-port two replicas share one public port and both serve it.

    python3 tests/router/test_replicas.py --kvrouter build/kvrouter [-k NAME] [-v]
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import MODEL, Router, Sim, wait_for  # noqa: E402

TESTS, test = h.registry()


def metric(router, name, **labels):
    return h.prom_value(h.parse_prom_samples(router.metrics_text()), name, **labels)


def admin(router, method, path, body=None, token=None):
    hdr = [("Authorization", "Bearer " + token)] if token else None
    return h.request(router.admin_port, method, path, body, headers=hdr, timeout=10)


def long_streams(port, n, tokens=200):
    """n streaming requests held open (the sims answer slowly); returns the threads."""
    def one(i):
        h.request(port, "POST", "/v1/chat/completions",
                  h.chat_body("stream %d " % i * 30, max_tokens=tokens, stream=True), timeout=60)
    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    return ts


def pair(sims, *flags, token_files=(None, None)):
    """Replicas A and B on chosen admin ports, each the other's peer."""
    pa, pb = h.closed_port(), h.closed_port()
    common = ["--policy", "least_load", "--peer-interval-ms", 50, "--peer-stale-ms", 400] + list(
        flags) + h.FAST
    ta = ["--admin-token-file", token_files[0]] if token_files[0] else []
    tb = ["--admin-token-file", token_files[1]] if token_files[1] else []
    a = Router(sims, "--admin-listen", "127.0.0.1:%d" % pa, "--peer", "http://127.0.0.1:%d" % pb,
               *(common + ta))
    b = Router(sims, "--admin-listen", "127.0.0.1:%d" % pb, "--peer", "http://127.0.0.1:%d" % pa,
               *(common + tb))
    return a, b


@test(timeout=90)
def peer_load_shared_and_used():
    with h.Cleanup() as c:
        s0 = c.add(Sim(fixed=(20, 40)))
        s1 = c.add(Sim(fixed=(20, 40)))
        a, b = pair([s0, s1])
        c.add(a)
        c.add(b)
        # 4 streams on A, all on worker 0: drain worker 1 on A for the duration
        r = admin(a, "DELETE", "/admin/workers/1")
        assert r.status == 202, r.status
        ts = long_streams(a.port, 4)
        wait_for(lambda: {w["url"]: w["in_flight"] for w in
                          admin(a, "GET", "/admin/load").json()["workers"]}.get(s0.url) == 4,
                 5, "A's own load on worker 0")
        wait_for(lambda: [w["peer_in_flight"] for w in b.workers()] == [4, 0], 5,
                 "B sees A's streams as peer load")
        assert [w["in_flight"] for w in b.workers()] == [0, 0]
        assert metric(b, "kvrouter_worker_peer_inflight_requests", worker="0") == 4
        assert metric(b, "kvrouter_peer_up") == 1
        assert metric(b, "kvrouter_peer_polls_total", result="ok") > 0
        # B's own load view has none of A's requests in it (no double counting between peers)
        load_b = admin(b, "GET", "/admin/load").json()["workers"]
        assert all(w["in_flight"] == 0 for w in load_b), load_b
        # each row carries the replica's last scrape of the worker (peers adopt the freshest)
        assert all(w["scraped"]["age_ms"] >= 0 and "num_requests_waiting" in w["scraped"]
                   for w in load_b), load_b
        # B's decision sees the cluster: least_load picks the idle worker 1
        ex = admin(b, "POST", "/admin/route/explain", h.chat_body("new " * 20)).json()
        assert ex["choice"]["url"] == s1.url, ex
        assert [w["in_flight"] for w in ex["workers"]] == [4, 0], ex["workers"]
        for t in ts:
            t.join(30)
        wait_for(lambda: [w["peer_in_flight"] for w in b.workers()] == [0, 0], 5, "streams done")
        # A stops: B marks it down, its figures age out
        a.stop()
        wait_for(lambda: metric(b, "kvrouter_peer_up") == 0, 5, "peer down")
        assert metric(b, "kvrouter_peer_polls_total", result="error") > 0


@test(timeout=60)
def peers_with_admin_tokens():
    with h.Cleanup() as c:
        s0 = c.add(Sim(fixed=(20, 5)))
        good = c.add(h.AdminToken())
        other = c.add(h.AdminToken("another-token-of-32-characters-x"))
        a, b = pair([s0], token_files=(good.path, good.path))
        c.add(a)
        c.add(b)
        wait_for(lambda: metric_auth(b, good.token, "kvrouter_peer_polls_total", result="ok") > 2,
                 5, "polls with the shared token")
        a2, b2 = pair([s0], token_files=(good.path, other.path))
        c.add(a2)
        c.add(b2)
        wait_for(lambda: metric_auth(b2, other.token, "kvrouter_peer_polls_total",
                                     result="error") > 2, 5, "wrong token counted as an error")
        assert metric_auth(b2, other.token, "kvrouter_peer_up") == 0


def metric_auth(router, token, name, **labels):
    r = admin(router, "GET", "/metrics", token=token)
    assert r.status == 200, r.status
    return h.prom_value(h.parse_prom_samples(r.text()), name, **labels)


@test(timeout=60)
def explain_uses_precise_index():
    with h.Cleanup() as c:
        d = tempfile.mkdtemp(prefix="kvr-replicas-")
        c.add(_Rm(d))
        ev, rp = "ipc://%s/ev" % d, "ipc://%s/rp" % d
        s0 = c.add(Sim("--time-scale", 20, "--kv-events-config", json.dumps(
            {"enable_kv_cache_events": True, "endpoint": ev, "replay_endpoint": rp}), fixed=None))
        s1 = c.add(Sim(fixed=None))
        r = c.add(Router(["%s,kv_events=%s,kv_replay=%s" % (s0.url, ev, rp), s1.url], *h.FAST))
        wait_for(lambda: r.workers()[0]["kv_events"]["index"] == "precise", 10, "precise")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "shared doc " * 200}],
                "max_tokens": 4}
        assert h.request(s0.port, "POST", "/v1/chat/completions", body, timeout=20).status == 200
        wait_for(lambda: r.workers()[0]["kv_events"]["blocks"] > 0, 5, "events applied")
        ex = admin(r, "POST", "/admin/route/explain", body).json()
        assert ex["tokenized"] and ex["prompt_tokens"] > 0, ex
        w0, w1 = ex["workers"]
        assert w0["index"] == "precise" and w1["index"] == "approximate", ex["workers"]
        assert w0["predicted_cached_tokens"] >= ex["prompt_tokens"] - 16, (w0, ex["prompt_tokens"])
        assert w1["matched_blocks"] == 0


class _Rm:
    def __init__(self, path):
        self.path = path

    def kill(self):
        shutil.rmtree(self.path, ignore_errors=True)

    def stop(self):
        self.kill()


@test(timeout=60)
def own_address_in_the_peer_list_is_ignored():
    """One peer list for every replica (a StatefulSet's): a replica reading its own /admin/load
    (same instance id) ignores it instead of counting its requests twice."""
    with h.Cleanup() as c:
        s0 = c.add(Sim(fixed=(20, 40)))
        pa = h.closed_port()
        a = c.add(Router([s0], "--admin-listen", "127.0.0.1:%d" % pa, "--peer",
                         "http://127.0.0.1:%d" % pa, "--peer-interval-ms", 50, *h.FAST))
        ts = long_streams(a.port, 3)
        wait_for(lambda: a.workers()[0]["in_flight"] == 3, 5, "streams in flight")
        wait_for(lambda: metric(a, "kvrouter_peer_polls_total", result="self") > 2, 5, "self polls")
        assert a.workers()[0]["peer_in_flight"] == 0, a.workers()
        assert metric(a, "kvrouter_peer_polls_total", result="ok") == 0
        for t in ts:
            t.join(30)


@test(timeout=90)
def synced_load_is_immediate():
    with h.Cleanup() as c:
        s0 = c.add(Sim(fixed=(20, 40)))
        s1 = c.add(Sim(fixed=(20, 40)))
        # polls every 1.5 s: what B sees sooner than that came through the sync socket
        a, b = pair([s0, s1], "--peer-sync-listen", "tcp://127.0.0.1:*",
                    "--peer-interval-ms", 1500, "--peer-stale-ms", 4000)
        c.add(a)
        c.add(b)
        assert admin(a, "GET", "/admin/load").json()["sync_port"] > 0
        wait_for(lambda: metric(a, "kvrouter_peer_sync_live") == 1 and
                 metric(b, "kvrouter_peer_sync_live") == 1, 10, "sync live both ways")
        r = admin(a, "DELETE", "/admin/workers/1")
        assert r.status == 202, r.status
        t0 = time.time()
        ts = long_streams(a.port, 4)
        wait_for(lambda: [w["peer_in_flight"] for w in b.workers()] == [4, 0], 5,
                 "B sees A's streams")
        seen = time.time() - t0
        assert seen < 1.0, "B saw A's streams after %.2f s: the polls, not the sync" % seen
        ex = admin(b, "POST", "/admin/route/explain", h.chat_body("new " * 20)).json()
        assert [w["in_flight"] for w in ex["workers"]] == [4, 0], ex["workers"]
        for t in ts:
            t.join(30)
        wait_for(lambda: [w["peer_in_flight"] for w in b.workers()] == [0, 0], 1.0,
                 "B sees them end")
        assert metric(b, "kvrouter_peer_sync_messages_total") > 8
        assert metric(b, "kvrouter_peer_sync_gaps_total") == 0
        assert metric(a, "kvrouter_peer_sync_published_total") > 8
        # A's own load never holds B's, nor B's A's
        assert all(w["in_flight"] == 0 for w in admin(b, "GET", "/admin/load").json()["workers"])
        # A goes: B drops its announced load after --peer-stale-ms
        ts = long_streams(a.port, 2)
        wait_for(lambda: b.workers()[0]["peer_in_flight"] == 2, 5, "B sees 2 more")
        a.stop()
        wait_for(lambda: metric(b, "kvrouter_peer_sync_live") == 0, 8, "sync dropped")
        assert b.workers()[0]["peer_in_flight"] == 0, b.workers()


@test(timeout=60)
def bench_alternates_between_replicas():
    """`kvrouter bench --url A,B` (the replica A/B's load) sends every other request to each
    endpoint, and the level's router_cached figures come from --admin's router."""
    with h.Cleanup() as c:
        s0 = c.add(Sim(fixed=(5, 5)))
        a, b = pair([s0])
        c.add(a)
        c.add(b)
        out = tempfile.mkdtemp(prefix="kvr_rep_bench_")
        try:
            p = subprocess.run(
                [h._kvrouter(), "bench", "--url", "http://127.0.0.1:%d,http://127.0.0.1:%d" % (
                    a.port, b.port), "--admin", "http://127.0.0.1:%d" % a.admin_port,
                 "--workload", "control", "--rates", "20", "--num-prompts", "20", "--warmup",
                 "0", "--cooldown-s", "0", "--output-mean", "8", "--output-min", "4",
                 "--output-max", "16", "--out", out, "--quiet"],
                capture_output=True, text=True, timeout=50)
            assert p.returncode == 0, p.stderr
            # (the model list, GET /v1/models, goes to the first endpoint only)
            na = metric(a, "kvrouter_http_requests_total", route="chat_completions")
            nb = metric(b, "kvrouter_http_requests_total", route="chat_completions")
            assert na == nb == 10, (na, nb)
            level = json.load(open(glob.glob(os.path.join(out, "results", "*.json"))[0]))
            rc = level["kvrouter"]["router_cached"]
            assert rc is not None and rc["reported_tokens"] >= 0, rc
        finally:
            shutil.rmtree(out, ignore_errors=True)
        for bad in ["http://127.0.0.1:1,ftp://x", "http://127.0.0.1:1,"]:
            p = subprocess.run([h._kvrouter(), "bench", "--url", bad, "--model", "m", "--rates",
                                "1"], capture_output=True, text=True, timeout=10)
            assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1, p.stderr


@test(timeout=60)
def reuse_port_shares_one_port():
    """--reuse-port: two replicas listen on the same public port (each on its own admin port),
    synced; the kernel spreads new connections over both, every request is answered, and each
    replica's counters hold only its own. Without the flag the second one cannot listen, with one
    line that says why and a non-zero exit."""
    with h.Cleanup() as c:
        s0 = c.add(Sim(fixed=(2, 2)))
        port = h.closed_port()
        listen = "127.0.0.1:%d" % port
        pa, pb = h.closed_port(), h.closed_port()
        common = ["--reuse-port", "true", "--peer-sync-listen", "tcp://127.0.0.1:*",
                  "--peer-interval-ms", 200] + h.FAST
        a = c.add(Router([s0], "--listen", listen, "--admin-listen", "127.0.0.1:%d" % pa,
                         "--peer", "http://127.0.0.1:%d" % pb, *common))
        b = c.add(Router([s0], "--listen", listen, "--admin-listen", "127.0.0.1:%d" % pb,
                         "--peer", "http://127.0.0.1:%d" % pa, *common))
        assert a.port == b.port == port, (a.port, b.port)
        wait_for(lambda: metric(a, "kvrouter_peer_sync_live") == 1 and
                 metric(b, "kvrouter_peer_sync_live") == 1, 10, "sync live both ways")
        n = 60
        for i in range(n):  # one connection each: the kernel picks a listener per connection
            r = h.request(port, "POST", "/v1/chat/completions",
                          h.chat_body("reuse %d" % i, max_tokens=4), timeout=10)
            assert r.status == 200, (r.status, r.body[:200])
        na = metric(a, "kvrouter_http_requests_total", route="chat_completions")
        nb = metric(b, "kvrouter_http_requests_total", route="chat_completions")
        assert na + nb == n and na > 0 and nb > 0, (na, nb)
        # the one without the flag is refused the port while the two hold it
        p = subprocess.run([h._kvrouter(), "serve", "--worker", s0.url, "--listen", listen,
                            "--admin-listen", "127.0.0.1:0"], capture_output=True, text=True,
                           timeout=10)
        lines = p.stderr.strip().splitlines()
        assert p.returncode != 0 and any("cannot listen on " + listen in ln for ln in lines), \
            p.stderr


@test(timeout=30)
def peer_sync_listen_errors():
    for bad in ["bogus", "tcp://256.1.1.1:5"]:
        p = subprocess.run([h._kvrouter(), "serve", "--worker", "http://127.0.0.1:1",
                            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                            "--peer-sync-listen", bad], capture_output=True, text=True, timeout=10)
        lines = p.stderr.strip().splitlines()
        assert p.returncode != 0 and any("peer sync" in ln for ln in lines), (bad, p.stderr)


@test(timeout=30)
def peer_flag_errors():
    for bad, want in [("ftp://x:1", "http://"), ("http://x:99999", "port")]:
        p = subprocess.run([h._kvrouter(), "serve", "--worker", "http://127.0.0.1:1", "--peer", bad],
                           capture_output=True, text=True, timeout=10)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and "--peer" in lines[0], (bad, p.stderr)


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
