#!/usr/bin/env python3
"""Integration tests of the admin API of `kvrouter serve` (src/serve/admin.c), through real processes.

Covers GET/POST /admin/workers, DELETE /admin/workers/{id} (drain: in-flight requests finish),
GET/PUT /admin/policy, POST /admin/route/explain, POST /admin/reset_prefix_cache (fan-out to real
sims), GET /health and GET /metrics, whose text is checked
by a strict parser of the Prometheus text exposition format (version 0.0.4) written here.

Run:  python3 tests/router/test_admin.py --kvrouter build/kvrouter [-k substring] [-v]
The harness (processes, raw HTTP client, runner) is tests/harness/kvrharness.py.
"""
import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import (FAST, MODEL, AdminToken, Cleanup, Conn, Router, Sim,  # noqa: E402
                        assert_openai_error, build_request, chat_body, closed_port, request,
                        sse_events, token_events, wait_for)

TESTS, test = h.registry()


def admin(r, method, path, body=None):
    return request(r.admin_port, method, path, body)


# ---- a strict parser of the Prometheus text format ------------------------------------------------

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def _parse_value(text, where):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?)", text):
        raise AssertionError("%s: bad sample value %r" % (where, text))
    return float(text)


def _parse_labels(s, i, where):
    """Parses '{a="x",b="y"}' starting at s[i] == '{'; returns (dict, index after '}')."""
    assert s[i] == "{"
    i += 1
    labels = {}
    while True:
        if s[i] == "}":
            return labels, i + 1
        m = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*").match(s, i)
        if not m:
            raise AssertionError("%s: bad label name at %r" % (where, s[i:i + 20]))
        name = m.group(0)
        if name.startswith("__"):
            raise AssertionError("%s: reserved label name %r" % (where, name))
        if name in labels:
            raise AssertionError("%s: duplicate label %r" % (where, name))
        i = m.end()
        if s[i:i + 2] != '="':
            raise AssertionError("%s: expected =\" after label %r" % (where, name))
        i += 2
        val = []
        while True:
            if i >= len(s):
                raise AssertionError("%s: unterminated label value" % where)
            ch = s[i]
            if ch == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    raise AssertionError("%s: bad escape \\%s in label value" % (where, nxt))
                val.append({"\\": "\\", '"': '"', "n": "\n"}[nxt])
                i += 2
                continue
            if ch == '"':
                i += 1
                break
            if ch == "\n":
                raise AssertionError("%s: raw newline in label value" % where)
            val.append(ch)
            i += 1
        labels[name] = "".join(val)
        if s[i] == ",":
            i += 1
        elif s[i] != "}":
            raise AssertionError("%s: expected , or } after label %r" % (where, name))


def _family_of(sample_name, types):
    """The family a sample belongs to: histogram/summary samples carry _bucket/_sum/_count."""
    for suffix in ("_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix):
            base = sample_name[: -len(suffix)]
            if types.get(base) in ("histogram", "summary"):
                return base
    return sample_name


def parse_prometheus(text):
    """Parses text strictly; returns {family: {"type", "help", "samples": [(name, labels, value)]}}.
    Raises AssertionError naming the line for anything outside the 0.0.4 text format, and checks
    the semantic rules: TYPE/HELP once per family and before its samples, a family's samples
    contiguous, no duplicate series, non-negative counters, histogram buckets cumulative with +Inf
    equal to _count."""
    assert text.endswith("\n"), "exposition must end with a newline"
    families = {}
    types = {}
    seen_series = set()
    current = None
    closed = set()  # families whose block has ended (their samples must not reappear)
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = "line %d %r" % (n, line[:80])
        if line == "":
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] in ("HELP", "TYPE"):
                assert len(parts) >= 3, "%s: %s without a metric name" % (where, parts[1])
                name = parts[2]
                assert METRIC_NAME.match(name), "%s: bad metric name" % where
                fam = families.setdefault(name, {"type": None, "help": None, "samples": []})
                assert name not in closed, "%s: %s after the family's samples ended" % (where, parts[1])
                if parts[1] == "TYPE":
                    assert len(parts) == 4 and parts[3] in TYPES, "%s: bad type" % where
                    assert fam["type"] is None, "%s: second TYPE for %s" % (where, name)
                    assert not fam["samples"], "%s: TYPE after samples of %s" % (where, name)
                    fam["type"] = parts[3]
                    types[name] = parts[3]
                else:
                    assert fam["help"] is None, "%s: second HELP for %s" % (where, name)
                    fam["help"] = parts[3] if len(parts) == 4 else ""
                    assert "\n" not in fam["help"]
                if current is not None and current != name:
                    closed.add(current)
                current = name
            continue
        m = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
        assert m, "%s: bad metric name" % where
        name = m.group(0)
        i = m.end()
        labels = {}
        if i < len(line) and line[i] == "{":
            labels, i = _parse_labels(line, i, where)
        rest = line[i:]
        assert rest.startswith(" "), "%s: no space before the value" % where
        fields = rest.split()
        assert 1 <= len(fields) <= 2, "%s: expected value [timestamp]" % where
        value = _parse_value(fields[0], where)
        if len(fields) == 2:
            assert re.fullmatch(r"-?\d+", fields[1]), "%s: bad timestamp" % where
        fam_name = _family_of(name, types)
        fam = families.setdefault(fam_name, {"type": None, "help": None, "samples": []})
        if current != fam_name:
            assert fam_name not in closed, "%s: samples of %s are not contiguous" % (where, fam_name)
            if current is not None:
                closed.add(current)
            current = fam_name
        key = (name, tuple(sorted(labels.items())))
        assert key not in seen_series, "%s: duplicate series" % where
        seen_series.add(key)
        if fam["type"] == "counter":
            assert value >= 0 and not math.isnan(value), "%s: negative counter" % where
        if fam["type"] == "histogram":
            assert name != fam_name, "%s: histogram sample without _bucket/_sum/_count" % where
            if name.endswith("_bucket"):
                assert "le" in labels, "%s: bucket without le" % where
        fam["samples"].append((name, labels, value))
    for fam_name, fam in families.items():
        if fam["type"] == "histogram":
            _check_histogram(fam_name, fam["samples"])
    return families


def _check_histogram(name, samples):
    groups = {}
    for sname, labels, value in samples:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        g = groups.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if sname == name + "_bucket":
            g["buckets"].append((_parse_value(labels["le"], name + " le"), value))
        elif sname == name + "_sum":
            g["sum"] = value
        elif sname == name + "_count":
            g["count"] = value
    for key, g in groups.items():
        where = "histogram %s%r" % (name, dict(key))
        assert g["buckets"], "%s: no buckets" % where
        assert g["count"] is not None and g["sum"] is not None, "%s: _sum or _count missing" % where
        les = [le for le, _ in g["buckets"]]
        assert les == sorted(les) and len(set(les)) == len(les), "%s: le not increasing" % where
        assert les[-1] == math.inf, "%s: no +Inf bucket" % where
        counts = [c for _, c in g["buckets"]]
        assert all(a <= b for a, b in zip(counts, counts[1:])), "%s: buckets not cumulative" % where
        assert counts[-1] == g["count"], "%s: +Inf bucket %g != _count %g" % (where, counts[-1],
                                                                             g["count"])


def metric(families, name, **labels):
    """Value of one series (sum over series whose labels include the given ones)."""
    fam = families.get(re.sub(r"_(bucket|sum|count)$", "", name)) or families.get(name)
    assert fam, "no metric family %s" % name
    vals = [v for n, ls, v in fam["samples"] if n == name and all(ls.get(k) == str(x)
                                                                    for k, x in labels.items())]
    assert vals, "no series %s%r" % (name, labels)
    return sum(vals)


# ---- tests -----------------------------------------------------------------------------------------


@test(timeout=10)
def test_prometheus_parser_rejects_bad_text():
    """The strict parser itself: accepts a valid page and rejects each kind of defect (so the
    metrics test below means something)."""
    good = ("# HELP a_total Things.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\\\\\\n\"} 3\n"
            "# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.3\n"
            "h_count 2\ng 1.5e-3 1700000000000\n")
    fams = parse_prometheus(good)
    assert metric(fams, "a_total", x="1") == 3 and fams["h"]["type"] == "histogram"
    bad = {
        "no final newline": "a 1",
        "bad name": "1a 1\n",
        "unquoted label": "a{x=1} 1\n",
        "bad escape": "a{x=\"\\t\"} 1\n",
        "duplicate label": "a{x=\"1\",x=\"2\"} 1\n",
        "duplicate series": "a 1\na 2\n",
        "bad value": "a one\n",
        "two TYPEs": "# TYPE a gauge\n# TYPE a gauge\na 1\n",
        "TYPE after samples": "a 1\n# TYPE a gauge\n",
        "interleaved families": "a 1\nb 1\na{x=\"1\"} 2\n",
        "negative counter": "# TYPE c counter\nc -1\n",
        "+Inf != count": "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n",
        "non-cumulative buckets": ("# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\n"
                                   "h_sum 1\nh_count 2\n"),
        "no +Inf": "# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_sum 1\nh_count 3\n",
        "unknown type": "# TYPE a weird\na 1\n",
    }
    for label, text in bad.items():
        try:
            parse_prometheus(text)
        except AssertionError:
            continue
        raise AssertionError("parser accepted: %s" % label)


@test(timeout=15)
def test_workers_list_add_and_errors():
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        extra = c.add(Sim())
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin"))
        ws = r.workers()
        assert [w["url"] for w in ws] == [a.url, b.url], ws
        assert len({w["id"] for w in ws}) == 2
        for w in ws:
            assert w["state"] == "up", w
            for key in ("id", "url", "state", "in_flight", "requests_total", "errors_total"):
                assert key in w, (key, w)
        resp = admin(r, "POST", "/admin/workers", {"url": extra.url})
        assert resp.status == 201, (resp, resp.body[:300])
        new = resp.json()
        assert new["url"] == extra.url and new["id"] not in {w["id"] for w in ws}, new
        assert len(r.workers()) == 3
        # The new worker takes traffic (round robin over three).
        served = set()
        for _ in range(6):
            x = request(r.port, "POST", "/v1/chat/completions", chat_body())
            assert x.status == 200
            served.add(x.header("x-kvrouter-worker"))
        assert str(new["id"]) in served, (served, new)
        # Errors.
        assert_openai_error(admin(r, "POST", "/admin/workers", {"url": extra.url}), 400)  # duplicate
        assert_openai_error(admin(r, "POST", "/admin/workers", {"url": "ftp://x"}), 400)
        assert_openai_error(admin(r, "POST", "/admin/workers", {"url": "http://h:1/path"}), 400)
        assert_openai_error(admin(r, "POST", "/admin/workers", {}), 400)
        assert_openai_error(admin(r, "POST", "/admin/workers", b"{nope"), 400)
        assert_openai_error(admin(r, "DELETE", "/admin/workers/999"), 404)
        # Ids are 1-10 digits up to 2^32-1: 2^32 used to wrap to worker 0 (strtoul, then a cast),
        # and signs and blanks were accepted. Nothing is drained by a malformed id.
        for bad in ("abc", "4294967296", "18446744073709551616", "-1", "+1", "%201",
                    "01234567890", "1x"):
            assert_openai_error(admin(r, "DELETE", "/admin/workers/" + bad), 400)
        assert_openai_error(admin(r, "DELETE", "/admin/workers/4294967295"), 404)
        assert all(w["state"] != "draining" for w in r.workers()), r.workers()
        assert_openai_error(admin(r, "GET", "/admin/nothing"), 404)
        r405 = admin(r, "PATCH", "/admin/workers")
        assert_openai_error(r405, 405)
        assert r405.header("allow") == "GET, HEAD, POST", r405.headers
        assert len(r.workers()) == 3


@test(timeout=60)
def test_worker_cap_4096():
    """KVR_MAX_WORKERS (4,096) workers in one router (16 endpoints of 256 data-parallel ranks, none
    listening: the router runs with them DOWN) lists every one, and one more is the 400
    too_many_workers in OpenAI's shape, counted in kvrouter_workers_refused_total; with one
    endpoint drained a 256-rank one fits again (issue 35)."""
    with Cleanup() as c:
        eps = ["http://127.0.0.1:%d,dp_size=256" % (40000 + i) for i in range(16)]
        r = c.add(Router(eps, "--scrape-interval-ms", "0", "--connect-timeout-ms", "200"))
        ws = r.workers()
        assert len(ws) == 4096 and len({w["id"] for w in ws}) == 4096, len(ws)
        err = assert_openai_error(admin(r, "POST", "/admin/workers",
                                        {"url": "http://127.0.0.1:39999"}), 400)
        assert err["code"] == "too_many_workers" and "4096" in err["message"], err
        assert h.prom_value(h.parse_prom_samples(r.metrics_text()),
                            "kvrouter_workers_refused_total") == 1
        first = [w["id"] for w in ws if w["url"] == "http://127.0.0.1:40000"]
        assert len(first) == 256, len(first)
        for wid in first:
            assert admin(r, "DELETE", "/admin/workers/%d" % wid).status in (200, 202)
        wait_for(lambda: len(r.workers()) == 3840, 10, "the drained endpoint's ranks gone")
        resp = admin(r, "POST", "/admin/workers", {"url": "http://127.0.0.1:39999",
                                                   "dp_size": 256})
        assert resp.status == 201, (resp, resp.body[:300])
        assert len(r.workers()) == 4096


@test(timeout=20)
def test_delete_worker_drains_in_flight_stream():
    with Cleanup() as c:
        a = c.add(Sim(fixed=(20, 20)))
        b = c.add(Sim(fixed=(20, 20)))
        r = c.add(Router([a, b], *FAST, "--policy", "round_robin"))
        n = 50  # ~1 s of tokens
        conn = c.add(Conn(r.port, timeout=10))
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=n, stream=True)))
        state = {}

        def on_head(resp):
            wid = resp.header("x-kvrouter-worker")
            state["wid"] = wid
            d = admin(r, "DELETE", "/admin/workers/%s" % wid)
            state["delete"] = (d.status, d.json() if d.status < 300 else d.body)
            ws = {str(w["id"]): w for w in r.workers()}
            state["during"] = ws.get(wid, {}).get("state")
            others = set()
            for _ in range(3):  # new requests avoid the draining worker
                x = request(r.port, "POST", "/v1/chat/completions", chat_body())
                others.add((x.status, x.header("x-kvrouter-worker")))
            state["others"] = others

        resp = conn.read_response("POST", on_head=on_head)
        wid = state["wid"]
        assert state["delete"][0] == 202, state["delete"]
        assert state["delete"][1].get("state") == "draining", state["delete"]
        assert state["during"] == "draining", state
        assert all(s == 200 and w != wid for s, w in state["others"]), state["others"]
        # The in-flight stream finished whole.
        assert resp.status == 200 and resp.complete, resp
        events = sse_events(resp.body)
        assert events[-1] == "[DONE]" and token_events(events) == n, events[-3:]
        # Then the worker is gone.
        wait_for(lambda: wid not in {str(w["id"]) for w in r.workers()}, 2.0,
                 "the drained worker to be removed")
        # Deleting the last worker leaves the router with none: 503.
        last = r.workers()[0]["id"]
        assert admin(r, "DELETE", "/admin/workers/%s" % last).status == 202
        wait_for(lambda: not r.workers(), 2.0, "no workers left")
        assert_openai_error(request(r.port, "POST", "/v1/chat/completions", chat_body()), 503)
        assert request(r.port, "GET", "/health").status == 503
        assert admin(r, "GET", "/health").status == 503


@test(timeout=15)
def test_policy_get_put_and_errors():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        g = admin(r, "GET", "/admin/policy")
        assert g.status == 200, g
        pol = g.json()
        assert pol["policy"] == "kv_aware" and isinstance(pol.get("params"), dict), pol
        names = [p["name"] if isinstance(p, dict) else p for p in pol["available"]]
        assert {"round_robin", "kv_aware"} <= set(names), names
        # Switch.
        p = admin(r, "PUT", "/admin/policy", {"policy": "round_robin"})
        assert p.status == 200 and p.json()["policy"] == "round_robin", (p, p.body[:300])
        assert admin(r, "GET", "/admin/policy").json()["policy"] == "round_robin"
        assert request(r.port, "POST", "/v1/chat/completions", chat_body()).status == 200
        fams = parse_prometheus(r.metrics_text())
        assert metric(fams, "kvrouter_policy_info", policy="round_robin") == 1
        # Retune the active policy's parameters.
        p = admin(r, "PUT", "/admin/policy", {"policy": "kv_aware", "params": {"balance_slack": 7}})
        assert p.status == 200 and p.json()["params"]["balance_slack"] == 7, p.body[:300]
        # Bad name: 400 naming every valid choice.
        e = assert_openai_error(admin(r, "PUT", "/admin/policy", {"policy": "fastest"}), 400)
        for name in names:
            assert name in e["message"], (name, e["message"])
        # Bad params: negative, unknown, wrong type; bad body shapes.
        for body in ({"policy": "kv_aware", "params": {"balance_slack": -1}},
                     {"policy": "kv_aware", "params": {"no_such_param": 1}},
                     {"policy": "kv_aware", "params": {"balance_slack": "big"}},
                     {"policy": "kv_aware", "params": [1]},
                     {"policy": 7},
                     {"policie": "kv_aware"},
                     {}):
            assert_openai_error(admin(r, "PUT", "/admin/policy", body), 400)
        assert_openai_error(admin(r, "PUT", "/admin/policy", b"{oops"), 400)
        e = assert_openai_error(admin(r, "PUT", "/admin/policy",
                                      {"policy": "kv_aware", "params": {"balance_slack": -1}}), 400)
        assert "balance_slack" in e["message"], e
        # A rejected change leaves the policy as it was.
        now = admin(r, "GET", "/admin/policy").json()
        assert now["policy"] == "kv_aware" and now["params"]["balance_slack"] == 7, now


@test(timeout=15)
def test_route_explain_shows_cache_match():
    with Cleanup() as c:
        a = c.add(Sim())
        b = c.add(Sim())
        r = c.add(Router([a, b], *FAST, "--policy", "kv_aware"))
        doc = " ".join("sentence %d about the routing of requests to workers." % i
                       for i in range(60))  # ~3.3 kB: ~50 blocks of 64 chars
        body = chat_body(doc, max_tokens=4)
        x = request(r.port, "POST", "/v1/chat/completions", body)
        assert x.status == 200
        wid = int(x.header("x-kvrouter-worker"))
        e = admin(r, "POST", "/admin/route/explain", body)
        assert e.status == 200, (e, e.body[:300])
        ex = e.json()
        assert ex["policy"] == "kv_aware", ex
        assert ex["choice"]["worker"] == wid, (ex["choice"], wid)
        by_id = {w["id"]: w for w in ex["workers"]}
        assert set(by_id) == {w["id"] for w in r.workers()}, ex["workers"]
        assert by_id[wid]["matched_blocks"] >= ex["blocks"] - 2 > 10, (by_id[wid], ex["blocks"])
        other = [w for i, w in by_id.items() if i != wid]
        assert all(w["matched_blocks"] == 0 for w in other), other
        # Explaining sends nothing: the sims saw exactly the one request.
        total = sum(h.prom_value(s.metrics(), "vllm:request_success_total") for s in (a, b))
        assert total == 1, total
        # Completions bodies, and bad bodies.
        e2 = admin(r, "POST", "/admin/route/explain", {"model": MODEL, "prompt": "short"})
        assert e2.status == 200, e2.body[:300]
        assert e2.json()["choice"]["worker"] in set(by_id), (e2.json()["choice"], set(by_id))
        assert_openai_error(admin(r, "POST", "/admin/route/explain", b"{x"), 400)
        assert_openai_error(admin(r, "POST", "/admin/route/explain", {"model": MODEL}), 400)


@test(timeout=30)
def test_reset_prefix_cache_fans_out_and_clears_index():
    with Cleanup() as c:
        a = c.add(Sim("--time-scale", "10", fixed=None))
        b = c.add(Sim("--time-scale", "10", fixed=None))
        r = c.add(Router([a, b], *FAST, "--policy", "kv_aware"))
        doc = " ".join("line %d of a document the workers cache between requests." % i
                       for i in range(60))
        body = chat_body(doc, max_tokens=4)

        def send():
            x = request(r.port, "POST", "/v1/chat/completions", body)
            assert x.status == 200, (x.status, x.body[:300])
            usage = x.json()["usage"]
            return (int(x.header("x-kvrouter-worker")),
                    usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"])

        wid, cached, _ = send()
        assert cached == 0, cached
        wid2, cached, prompt_tokens = send()
        # The same prompt again, on the same worker: every whole block but the one holding the
        # last prompt token is a hit (16-token blocks, bench/sim/README.md).
        assert wid2 == wid and cached == (prompt_tokens - 1) // 16 * 16, (
            wid, wid2, cached, prompt_tokens)
        by_id = {w["id"]: w for w in r.workers()}
        assert by_id[wid]["index_blocks"] > 10, by_id

        hits_before = sum(h.prom_value(s.metrics(), "vllm:prefix_cache_hits_total") for s in (a, b))
        assert hits_before == cached, (hits_before, cached)
        resp = admin(r, "POST", "/admin/reset_prefix_cache")
        assert resp.status == 200, (resp.status, resp.body[:300])
        j = resp.json()
        assert j["reset"] == 2 and j["failed"] == 0, j
        got = {w["id"]: w for w in j["workers"]}
        assert set(got) == set(by_id), j
        for w in got.values():
            assert w["ok"] is True and w["status"] == 200 and w["error"] is None, w
            assert w["state"] == "up" and w["url"] in (a.url, b.url), w
        assert got[wid]["index_blocks_forgotten"] == by_id[wid]["index_blocks"], (got, by_id)
        assert all(w["index_blocks"] == 0 for w in r.workers()), r.workers()
        # The router's index and the worker's cache both forgot the prompt.
        e = admin(r, "POST", "/admin/route/explain", body).json()
        assert all(w["matched_blocks"] == 0 for w in e["workers"]), e["workers"]
        _, cached, _ = send()
        assert cached == 0, cached
        # Prometheus counters are cumulative: the workers' hit counters did not go back (and the
        # request after the reset, a miss, added nothing).
        hits = sum(h.prom_value(s.metrics(), "vllm:prefix_cache_hits_total") for s in (a, b))
        assert hits == hits_before, (hits, hits_before)

        # A worker that cannot reset (here: nothing listens) is reported, not fatal.
        dead = "http://127.0.0.1:%d" % closed_port()
        add = admin(r, "POST", "/admin/workers", {"url": dead})
        assert add.status == 201, add.body[:300]
        resp = admin(r, "POST", "/admin/reset_prefix_cache")
        assert resp.status == 200, (resp.status, resp.body[:300])
        j = resp.json()
        assert j["reset"] == 2 and j["failed"] == 1, j
        bad = [w for w in j["workers"] if w["url"] == dead]
        assert len(bad) == 1 and bad[0]["ok"] is False and bad[0]["status"] is None, bad
        assert "connect" in bad[0]["error"].lower(), bad
        r405 = admin(r, "GET", "/admin/reset_prefix_cache")
        assert_openai_error(r405, 405)
        assert r405.header("allow") == "POST", r405.headers


@test(timeout=20)
def test_every_policy_serves_and_switches_mid_stream():
    """Each registered policy, switched in at run time, routes real requests; a switch while a
    stream is in flight leaves that stream alone; with every worker down explain chooses none."""
    with Cleanup() as c:
        a = c.add(Sim(fixed=(10, 10)))
        b = c.add(Sim(fixed=(10, 10)))
        r = c.add(Router([a, b], *FAST, "--fail-threshold", "1"))
        names = [p["name"] if isinstance(p, dict) else p
                 for p in admin(r, "GET", "/admin/policy").json()["available"]]
        assert len(names) >= 2, names
        conn = c.add(Conn(r.port, timeout=10))
        conn.send(build_request("POST", "/v1/chat/completions", chat_body(max_tokens=60, stream=True)))
        seen = {}

        def on_head(resp):
            for name in names:  # switch through every policy while the stream runs
                p = admin(r, "PUT", "/admin/policy", {"policy": name})
                assert p.status == 200 and p.json()["policy"] == name, (name, p.body[:200])
                served = set()
                for i in range(4):
                    x = request(r.port, "POST", "/v1/chat/completions",
                                chat_body("policy %s request %d" % (name, i), stream=i % 2 == 1))
                    assert x.status == 200 and x.complete, (name, x)
                    served.add(x.header("x-kvrouter-worker"))
                seen[name] = served

        resp = conn.read_response("POST", on_head=on_head)
        assert set(seen) == set(names), seen
        assert resp.status == 200 and resp.complete, resp
        events = sse_events(resp.body)
        assert events[-1] == "[DONE]" and token_events(events) == 60
        fams = parse_prometheus(r.metrics_text())
        for name in names:
            assert metric(fams, "kvrouter_routing_decisions_by_policy_total", policy=name) >= 4, name
        a.fault("refuse")
        b.fault("refuse")
        wait_for(lambda: all(w["state"] == "down" for w in r.workers()), 3.0, "workers down")
        e = admin(r, "POST", "/admin/route/explain", chat_body("anything"))
        assert e.status == 200 and e.json()["choice"] is None, e.body[:300]


@test(timeout=15)
def test_metrics_strict_prometheus_and_counters():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        resp = admin(r, "GET", "/metrics")
        assert resp.status == 200
        assert resp.header("content-type").startswith("text/plain"), resp.headers
        assert "version=0.0.4" in resp.header("content-type"), resp.headers
        before = parse_prometheus(resp.text())
        for fam_name, fam in before.items():
            assert fam["type"] is not None, "family %s has no TYPE" % fam_name
            assert fam["help"], "family %s has no HELP" % fam_name
        n = 3
        for i in range(n):
            assert request(r.port, "POST", "/v1/chat/completions",
                           chat_body("metrics %d" % i, stream=i % 2 == 0)).status == 200
        assert request(r.port, "POST", "/v1/chat/completions", b"{bad").status == 400
        after = parse_prometheus(r.metrics_text())
        assert metric(after, "kvrouter_requests_total") - metric(before, "kvrouter_requests_total") \
            == n + 1
        assert metric(after, "kvrouter_client_errors_total") == 1
        assert metric(after, "kvrouter_worker_requests_total") == n
        assert metric(after, "kvrouter_request_duration_seconds_count") == n
        assert metric(after, "kvrouter_routing_decision_seconds_count") == n
        assert metric(after, "kvrouter_time_to_first_byte_seconds_count") == n, \
            "time-to-first-byte histogram not observed"


REQUEST_ERROR_REASONS = ("connect", "first_byte_timeout", "idle_timeout", "upstream_5xx",
                         "upstream_protocol",
                         "broken_stream", "no_worker", "overloaded", "client_error",
                         "client_abort")


@test(timeout=20)
def test_metrics_process_build_worker_state_and_error_reasons():
    """The process_* families, kvrouter_build_info, kvrouter_worker_state and
    kvrouter_worker_scrape_age_seconds, and kvrouter_request_errors_total{reason} (every reason
    exported from the start) with kvrouter_retries_exhausted_total. promtool is not installed
    here: parse_prometheus() is the format check (HELP and TYPE per family, no duplicate series)."""
    with Cleanup() as c:
        sim = c.add(Sim())
        dead = "http://127.0.0.1:%d" % closed_port()
        r = c.add(Router([sim, dead], *FAST, "--policy", "round_robin", "--fail-threshold", "100"))
        ids = {w["url"]: str(w["id"]) for w in r.workers()}
        live = ids[sim.url]
        # The sim is scraped every 100 ms: wait for a scrape age to appear.
        wait_for(lambda: "kvrouter_worker_scrape_age_seconds{" in r.metrics_text(), 5,
                 "a scrape of the sim")
        before = parse_prometheus(r.metrics_text())
        for fam_name, fam in before.items():
            assert fam["type"] is not None and fam["help"], "family %s lacks TYPE/HELP" % fam_name
        for reason in REQUEST_ERROR_REASONS:
            assert metric(before, "kvrouter_request_errors_total", reason=reason) == 0, reason
        reasons = {ls["reason"] for _, ls, _ in before["kvrouter_request_errors_total"]["samples"]}
        assert reasons == set(REQUEST_ERROR_REASONS), reasons
        assert metric(before, "kvrouter_retries_exhausted_total") == 0
        # Process collector.
        assert before["process_cpu_seconds_total"]["type"] == "counter"
        assert metric(before, "process_resident_memory_bytes") > 1 << 20
        assert metric(before, "process_open_fds") > 0
        assert metric(before, "process_max_fds") >= metric(before, "process_open_fds")
        start = metric(before, "process_start_time_seconds")
        now = time.time()
        assert now - 120 < start <= now + 1, (start, now)
        # Build info.
        (name, labels, value), = before["kvrouter_build_info"]["samples"]
        assert value == 1 and set(labels) == {"version", "commit"}, labels
        assert re.fullmatch(r"\d+\.\d+\.\d+.*", labels["version"]), labels
        # Worker state: one series per worker and state, 1 for the state it is in.
        for wid in ids.values():
            states = {ls["state"]: v for _, ls, v in before["kvrouter_worker_state"]["samples"]
                      if ls["worker"] == wid}
            assert set(states) == {"up", "down", "draining", "ejected"}, states
            assert sum(states.values()) == 1, states
        assert metric(before, "kvrouter_worker_state", worker=live, state="up") == 1
        age = metric(before, "kvrouter_worker_scrape_age_seconds", worker=live)
        assert 0 <= age < 5, age
        ages = {ls["worker"] for _, ls, _ in before["kvrouter_worker_scrape_age_seconds"]["samples"]}
        assert ids[dead] not in ages, ages  # never scraped: no sample
        # Requests the dead worker refuses are retried on the sim: not errors.
        for _ in range(2):
            assert request(r.port, "POST", "/v1/chat/completions", chat_body()).status == 200
        mid = parse_prometheus(r.metrics_text())
        assert metric(mid, "kvrouter_request_errors_total") == 0
        # With the sim stopped too, every attempt is refused: a 502 counted as connect.
        assert sim.stop() is None
        resp = request(r.port, "POST", "/v1/chat/completions", chat_body())
        assert_openai_error(resp, 502)
        after = parse_prometheus(r.metrics_text())
        assert metric(after, "kvrouter_request_errors_total", reason="connect") == 1
        assert metric(after, "kvrouter_retries_exhausted_total") == 1
        for reason in REQUEST_ERROR_REASONS[1:]:
            assert metric(after, "kvrouter_request_errors_total", reason=reason) == 0, reason
        assert request(r.port, "POST", "/v1/chat/completions", b"{bad").status == 400
        after = parse_prometheus(r.metrics_text())
        assert metric(after, "kvrouter_request_errors_total", reason="client_error") == 1
        assert metric(after, "process_cpu_seconds_total") >= metric(before,
                                                                   "process_cpu_seconds_total")


@test(timeout=20)
def test_prefill_rate_measured_from_a_lone_stream():
    """The router learns a worker's prefill rate from the TTFT of a streamed request that found no
    other prefill pending (src/core/prefill_clock.c), and shows it in /metrics and /admin/workers."""
    with Cleanup() as c:
        sim = c.add(Sim(fixed=(200, 5)))
        r = c.add(Router([sim], *FAST, "--policy", "kv_aware"))
        before = parse_prometheus(r.metrics_text())
        assert metric(before, "kvrouter_worker_prefill_rate_tokens_per_second") == 0
        # ~1,000 estimated prompt tokens (4 characters each), none cached: a rate sample.
        doc = " ".join("word%04d" % i for i in range(450))
        x = request(r.port, "POST", "/v1/chat/completions", chat_body(doc, max_tokens=4,
                                                                       stream=True))
        assert x.status == 200 and token_events(sse_events(x.body)) == 4, x.body[:300]
        after = parse_prometheus(r.metrics_text())
        rate = metric(after, "kvrouter_worker_prefill_rate_tokens_per_second")
        # tokens / TTFT with a 200 ms TTFT: at most ~5,000 tokens/s, less by the transport time.
        assert 2000 < rate <= 5200, rate
        assert metric(after, "kvrouter_worker_queued_prefill_tokens") == 0
        assert metric(after, "kvrouter_worker_prefill_backlog_tokens") == 0
        w = r.workers()[0]
        assert abs(w["prefill_rate_tokens_per_second"] - rate) < 1e-6 * rate, (w, rate)
        assert w["prefill_backlog_tokens"] == 0, w
        # A short request is no sample: the rate stays as it was.
        assert request(r.port, "POST", "/v1/chat/completions",
                       chat_body("short", max_tokens=2, stream=True)).status == 200
        again = metric(parse_prometheus(r.metrics_text()),
                       "kvrouter_worker_prefill_rate_tokens_per_second")
        assert again == rate, (again, rate)


@test(timeout=10)
def test_admin_health_and_public_routes_separate():
    with Cleanup() as c:
        sim = c.add(Sim())
        r = c.add(Router([sim], *FAST))
        assert admin(r, "GET", "/health").status == 200
        # Admin routes are not on the public listener.
        x = request(r.port, "GET", "/admin/workers")
        assert x.status == 404, x
        x = request(r.port, "GET", "/metrics")
        assert x.status == 404, x



def assert_unauthorized(resp):
    """A 401 with WWW-Authenticate: Bearer and the OpenAI-style authentication error body."""
    err = assert_openai_error(resp, 401, "authentication_error")
    assert err["code"] == "invalid_api_key" and err["param"] is None, err
    www = resp.header("www-authenticate")
    assert www is not None and www.split()[0] == "Bearer", resp.headers


@test(timeout=15)
def test_admin_token_guards_changes_and_reads():
    with Cleanup() as c:
        sim = c.add(Sim())
        sim2 = c.add(Sim())
        tok = c.add(AdminToken())
        r = c.add(Router([sim], *FAST, *tok.flags))
        good = tok.headers
        wrong = [("Authorization", "Bearer " + "x" * len(tok.token))]
        prefix = [("Authorization", "Bearer " + tok.token[:-1])]
        longer = [("Authorization", "Bearer " + tok.token + "x")]
        basic = [("Authorization", "Basic " + tok.token)]
        # A policy switch without the token, or with a wrong one, is refused and changes nothing.
        for hdrs in (None, wrong, prefix, longer, basic, [("Authorization", "Bearer")]):
            assert_unauthorized(request(r.admin_port, "PUT", "/admin/policy",
                                        {"policy": "round_robin"}, headers=hdrs))
        g = request(r.admin_port, "GET", "/admin/policy", headers=good)
        assert g.status == 200 and g.json()["policy"] == "kv_aware", (g, g.body[:300])
        # The other changes are guarded too, and change nothing.
        assert_unauthorized(request(r.admin_port, "POST", "/admin/workers", {"url": sim2.url}))
        assert_unauthorized(request(r.admin_port, "DELETE", "/admin/workers/0"))
        assert_unauthorized(request(r.admin_port, "POST", "/admin/reset_prefix_cache", b""))
        assert_unauthorized(request(r.admin_port, "POST", "/admin/route/explain", chat_body()))
        w = request(r.admin_port, "GET", "/admin/workers", headers=good)
        assert w.status == 200, w
        workers = w.json()["workers"]
        assert [x["url"] for x in workers] == [sim.url], workers  # sim2 not added
        assert workers[0]["state"] != "draining", workers  # worker 0 not drained
        # Reads need the token as well (no --admin-open-reads).
        for path in ("/admin/policy", "/admin/workers", "/metrics"):
            assert_unauthorized(request(r.admin_port, "GET", path))
            assert request(r.admin_port, "GET", path, headers=good).status == 200, path
        # Probes stay open.
        assert request(r.admin_port, "GET", "/health").status == 200
        # With the token the switch goes through (the scheme's case does not matter).
        p = request(r.admin_port, "PUT", "/admin/policy", {"policy": "round_robin"},
                    headers=[("Authorization", "bearer " + tok.token)])
        assert p.status == 200 and p.json()["policy"] == "round_robin", (p, p.body[:300])
        g = request(r.admin_port, "GET", "/admin/policy", headers=good)
        assert g.json()["policy"] == "round_robin", g.json()
        a = request(r.admin_port, "POST", "/admin/workers", {"url": sim2.url}, headers=good)
        assert a.status == 201, (a, a.body[:300])
        # The public listener knows nothing of the admin token.
        assert request(r.port, "POST", "/v1/chat/completions", chat_body()).status == 200


@test(timeout=15)
def test_admin_open_reads_keeps_changes_guarded():
    with Cleanup() as c:
        sim = c.add(Sim())
        tok = c.add(AdminToken())
        r = c.add(Router([sim], *FAST, *tok.flags, "--admin-open-reads", "true"))
        for path in ("/admin/policy", "/admin/workers", "/metrics", "/health"):
            assert request(r.admin_port, "GET", path).status == 200, path
        assert request(r.admin_port, "HEAD", "/admin/policy").status == 200
        assert_unauthorized(request(r.admin_port, "PUT", "/admin/policy",
                                    {"policy": "round_robin"}))
        assert request(r.admin_port, "GET", "/admin/policy").json()["policy"] == "kv_aware"
        p = request(r.admin_port, "PUT", "/admin/policy", {"policy": "round_robin"},
                    headers=tok.headers)
        assert p.status == 200 and p.json()["policy"] == "round_robin", (p, p.body[:300])

if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0]))
