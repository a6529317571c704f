#!/usr/bin/env python3
"""test_fastpath_report -- bench/scripts/fastpath/fastpath_report.py's tables, on a synthetic kept
run.

Writes the raw files fastpath.sh keeps (meta.json, cells.jsonl with two rounds, access_log.jsonl)
with figures chosen here, renders the report with the script as a child process, and checks the
rendered numbers against the arithmetic done here: each cell's best round (most requests per
second) is the one shown, the throughput and equal-CPU ratios, CPU per request, and the access-log
section (kvrouter against nginx with their logs on, what a line costs each: CPU per request with
the log minus without, and the lines written against the responses counted), and the first-token
section from proxy_overhead.py's JSON (added times, each proxy's CPU per one-token stream when the
run recorded it), and the first line (the run's command and commit from meta.json). Also
bench/scripts/fastpath/fastpath_allocs.py on a synthetic `perf script` text: allocation calls
attributed past libc and kvr_x* wrappers to their library, the router's frames recognised by being
the executable's whatever its file is called. A run without the access-log targets (the --cores N
table) has no such section; a folder without meta.json exits 1 with one line.

Run: python3 tests/bench/scripts/test_fastpath_report.py (CTest: script.test_fastpath_report);
exits 1 on a failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "bench", "scripts", "fastpath", "fastpath_report.py")
ALLOCS = os.path.join(HERE, "..", "..", "..", "bench", "scripts", "fastpath", "fastpath_allocs.py")

# `perf script -F event,ip,sym,dso` of three allocation calls: two from the router (an executable
# copied to /tmp/kvr_fp10, one of them through kvr_xmalloc), one from libcurl.
PERF_SCRIPT = """probe_libc:malloc:
\t7f0000000001 malloc+0x0 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t55000000a001 kvr_xmalloc+0x10 (/tmp/kvr_fp10)
\t55000000a002 on_header_field+0x22 (/tmp/kvr_fp10)
\t55000000a003 llhttp__internal_execute+0x99 (/tmp/kvr_fp10)

probe_libc:realloc:
\t7f0000000002 realloc+0x0 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t55000000a004 on_header_field+0x40 (/tmp/kvr_fp10)

probe_libc:calloc:
\t7f0000000003 calloc+0x0 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t7f0000100000 [unknown] (/usr/lib/x86_64-linux-gnu/libcurl.so.4.8.0)
\t55000000a005 kvr_curlm_add+0x5 (/tmp/kvr_fp10)

"""
HZ = 100

META = {"command": "bash bench/scripts/fastpath/fastpath.sh --rounds 2",
        "date": "2026-11-25 07:00 UTC", "commit": "abc1234", "nproc": 2, "cpu": "test cpu",
        "kernel": "6.1", "loadavg_at_end": ["0.1", "0.2", "0.3"],
        "kvrouter": "kvrouter 0.1.0 (commit abc1234)", "nginx": "nginx/1.22", "haproxy": "HAProxy 2.6", "wrk": "wrk 4.1.0", "duration_s": 10, "rounds": 2,
        "backend_cpu": 0, "cores": 1, "sse": {"streams": 100, "events": 2000}}


def cell(row, target, rnd, requests, ticks, secs=10.0, p99_us=1000, p50_us=500):
    return {"row": row, "target": target, "round": rnd, "conns": 64, "cpu_ticks": ticks,
            "tick_hz": HZ, "wrk": {"requests": requests, "duration_us": secs * 1e6,
                                   "p99_us": p99_us, "p50_us": p50_us, "connect": 0, "read": 0,
                                   "write": 0, "status": 0, "timeout": 0}}


def render(cells, logs=None, meta=META, overhead=None):
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "raw")
        os.mkdir(raw)
        with open(os.path.join(raw, "meta.json"), "w") as f:
            json.dump(meta, f)
        with open(os.path.join(raw, "cells.jsonl"), "w") as f:
            f.writelines(json.dumps(c) + "\n" for c in cells)
        if logs is not None:
            with open(os.path.join(raw, "access_log.jsonl"), "w") as f:
                f.writelines(json.dumps(x) + "\n" for x in logs)
        if overhead is not None:
            with open(os.path.join(raw, "proxy_overhead.json"), "w") as f:
                json.dump(overhead, f)
        out = os.path.join(d, "REPORT.md")
        p = subprocess.run([sys.executable, SCRIPT, raw, out], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return open(out).read()


def section(md, title):
    m = re.search(r"^## %s\n(.*?)(?=^## |\Z)" % re.escape(title), md, re.M | re.S)
    assert m, "no section %r in:\n%s" % (title, md)
    return m.group(1)


def row_cells(text, label):
    for line in text.splitlines():
        if line.startswith("| %s |" % label):
            return [c.strip() for c in line.strip().strip("|").split("|")]
    raise AssertionError("no row %r in:\n%s" % (label, text))


def main():
    # Small POST: nginx 15 us and kvrouter 30 us per request without logs; with logs nginx
    # 17 us, kvrouter 33 us. CPU ticks = us per request x requests x HZ / 1e6.
    def ticks(us, n):
        return round(us * n * HZ / 1e6)

    cells = [
        cell("small", "direct", 1, 700000, 0),
        cell("small", "nginx", 1, 600000, ticks(15, 600000)),
        cell("small", "nginx", 2, 500000, ticks(20, 500000)),  # worse round: not shown
        cell("small", "haproxy", 1, 620000, ticks(15.5, 620000)),
        cell("small", "kvrouter", 1, 300000, ticks(30, 300000)),
        cell("small", "kvrouter", 2, 330000, ticks(30, 330000)),  # best round
        cell("small", "nginx_log", 1, 520000, ticks(17, 520000)),
        cell("small", "kvrouter_log", 1, 290000, ticks(33, 290000)),
    ]
    logs = [{"target": "nginx_log", "lines": 520010, "responses": 520005},
            {"target": "kvrouter_log", "lines": 290020, "responses": 290003}]
    md = render(cells, logs)
    # the first line names the run's command and commit, from meta.json
    assert md.startswith("Made by `bash bench/scripts/fastpath/fastpath.sh --rounds 2` at commit "
                         "abc1234, 2026-11-25.\n\n# The fast path"), md[:200]

    thr = row_cells(section(md, "Throughput (requests per second)"), "POST small chat body")
    assert thr[3] == "60,000/s", thr  # nginx's best round
    assert thr[5] == "33,000/s", thr  # kvrouter's best round
    assert thr[6] == "%.2f" % (33000 / 60000), thr
    assert thr[7] == "%.2f" % (33000 / 62000), thr

    cpu = row_cells(section(md, "Proxy CPU per request"), "POST small chat body")
    assert cpu[1:4] == ["15.0 us", "15.5 us", "30.0 us"], cpu
    assert cpu[4] == "%.2f" % (ticks(30, 330000) / HZ / 10.0), cpu  # cores busy
    assert cpu[5] == "0.50" and cpu[6] == "%.2f" % (15.5 / 30), cpu

    acc = section(md, "With the access log on")
    r = row_cells(acc, "POST small chat body")
    assert r[1] == "52,000/s" and r[2] == "29,000/s", r
    assert r[3] == "%.2f" % (29000 / 52000), r
    assert r[4] == "17.0 us" and r[5] == "33.0 us", r
    assert r[6] == "+2.0 us" and r[7] == "+3.0 us", r  # log on minus log off
    assert "nginx (access log on) 520,010 lines for 520,005 responses" in acc, acc
    assert "kvrouter (access log on) 290,020 lines for 290,003 responses" in acc, acc
    # Rows without the log targets are not in that section.
    assert "GET /v1/models" not in acc

    # The first-token section from proxy_overhead.py's JSON: added times are p50 minus direct's
    # p50, and each proxy's CPU per one-token stream is shown as recorded.
    overhead = {"first_token": {
        "direct": {"done": 140, "ttft_p50": 0.0205, "ttft_p99": 0.021, "errors": 0},
        "router": {"done": 138, "ttft_p50": 0.0208, "ttft_p99": 0.0215, "errors": 0,
                   "cpu_us_per_request": 61.25},
        "nginx": {"done": 139, "ttft_p50": 0.0207, "ttft_p99": 0.0212, "errors": 0,
                  "cpu_us_per_request": 22.5}},
        "small_c1": {"direct": {"n": 100, "p50": 0.00013, "p99": 0.0002, "errors": 0},
                     "router": {"n": 90, "p50": 0.00024, "p99": 0.0004, "errors": 0}}}
    ft = section(render(cells, logs, overhead=overhead),
                 "Time added to the first token (bench/scripts/fastpath/proxy_overhead.py)")
    assert row_cells(ft, "TTFT added p50 (streaming, sim TTFT 20 ms, 1 client, 138 first tokens)") \
        [1] == "300 us", ft
    assert row_cells(ft, "the same through nginx (1 worker, proxy_buffering off), for reference") \
        [1] == "200 us", ft
    assert row_cells(ft, "latency added p50 (small non-streaming, 1 client)")[1] == "110 us", ft
    assert row_cells(ft, "kvrouter CPU per one-token stream in the first-token cell (run time of "
                     "its threads, schedstat)")[1] == "61.2 us", ft
    assert row_cells(ft, "nginx CPU per one-token stream in the first-token cell (run time of "
                     "its threads, schedstat)")[1] == "22.5 us", ft
    # A run from before the CPU figures were recorded renders without those rows.
    del overhead["first_token"]["router"]["cpu_us_per_request"]
    del overhead["first_token"]["nginx"]["cpu_us_per_request"]
    ft = section(render(cells, logs, overhead=overhead),
                 "Time added to the first token (bench/scripts/fastpath/proxy_overhead.py)")
    assert "CPU per one-token stream" not in ft, ft

    # The --cores N table: no access-log targets, no section.
    md2 = render([c for c in cells if not c["target"].endswith("_log")],
                 meta=dict(META, cores=2))
    assert "## With the access log on" not in md2, md2

    # fastpath_allocs.py: the executable's frames are kvrouter's whatever its file is called.
    p = subprocess.run([sys.executable, ALLOCS, "2"], input=PERF_SCRIPT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    libs = dict((r[0], r[2]) for r in (
        [c.strip() for c in line.strip("|").split("|")] for line in p.stdout.splitlines()
        if line.startswith("| kvrouter |") or line.startswith("| libcurl |")))
    assert libs == {"kvrouter": "66.7%", "libcurl": "33.3%"}, p.stdout
    assert "| `on_header_field` (kvrouter) | on_header_field <- llhttp__internal_execute | 0.5 | " \
        "33.3% |" in p.stdout, p.stdout
    assert "| `[unknown]` (libcurl) | kvr_curlm_add | 0.5 | 33.3% |" in p.stdout, p.stdout
    assert p.stdout.startswith("3 allocation calls"), p.stdout

    # No meta.json: one line, exit 1.
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([sys.executable, SCRIPT, d, os.path.join(d, "x.md")],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "meta.json" in p.stderr, (p.returncode, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    print("test_fastpath_report: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
