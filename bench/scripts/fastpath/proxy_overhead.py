#!/usr/bin/env python3
"""proxy_overhead.py -- what the router adds on loopback, compared with going straight to the worker.

Experiment fastpath (bench/results/fastpath/): prints a Markdown table, its first line the command
and the commit (bench/scripts/lib/provenance.py), and with --json writes the figures to a file;
fastpath.sh keeps both as OUT/raw/proxy_overhead.{md,json}, and bench/results/fastpath/first-token/
holds two runs made by hand (its NOTES.md has the command).

Starts one `kvrouter sim` in fixed-latency mode (--fixed-ttft-ms/--fixed-itl-ms: no engine, so the
worker's own timing is constant) and one `kvrouter serve` in front of it, then runs the same
closed-loop load twice, once against the sim directly and once through the router:

  small non-streaming requests   one chat completion with max_tokens 1, answered at once by the sim
                                 (TTFT 0): requests per second and latency p50/p99, at concurrency 1
                                 (pure added latency) and at --concurrency (throughput)
  streaming requests             max_tokens --tokens with a fixed TTFT and inter-token latency: time
                                 to first token event and the gap between successive events, p50/p99
  first token only               one-token streams from the same sim, one client back to back: the
                                 time to the first event with ~100 samples per 3 s (the row above has
                                 one per stream); the CPU the router (and, with --nginx, nginx)
                                 ran over that cell, per stream, from the run time of its threads
                                 in /proc/PID/task/*/schedstat

Each client is a separate process (no GIL contention) holding one keep-alive connection and
sending the next request as soon as the previous answer is complete. The result is a Markdown table
with a "router - direct" row per scenario. On a 2-core machine the clients, the router and the sim
share the cores, so absolute throughput is a floor, not a ceiling; the differences are what count.

Run:  python3 bench/scripts/fastpath/proxy_overhead.py --kvrouter build/kvrouter [--duration 3] \
          [--concurrency 4]

Percentiles are the harness's percentile() (numpy's default linear interpolation). The process
and raw-HTTP helpers are the integration tests' harness (tests/harness/kvrharness.py).
"""
import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "harness"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import kvrharness as h  # noqa: E402
from provenance import first_line  # noqa: E402

pctl = h.percentile  # the one percentile (numpy's default linear interpolation)


def client_small(port, duration, body, start_at, out):
    """Closed loop of non-streaming requests on one connection until start_at + duration."""
    conn = h.Conn(port, timeout=10)
    req = h.build_request("POST", "/v1/chat/completions", body)
    lat = []
    errors = 0
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + duration
    while time.time() < end:
        t0 = time.perf_counter()
        conn.send(req)
        resp = conn.read_response("POST")
        dt = time.perf_counter() - t0
        if resp.status != 200 or not resp.complete:
            errors += 1
        else:
            lat.append(dt)
    conn.close()
    out.put({"lat": lat, "errors": errors})


def client_stream(port, duration, body, start_at, out):
    """Closed loop of streaming requests; records time to the first event and gaps between events."""
    conn = h.Conn(port, timeout=10)
    req = h.build_request("POST", "/v1/chat/completions", body)
    ttft, gaps = [], []
    errors = done = 0
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + duration
    while time.time() < end:
        state = {"tail": b"", "events": 0, "last": None}
        t0 = time.perf_counter()

        def on_data(d, _t, state=state):
            now = time.perf_counter()
            data = state["tail"] + d
            n = data.count(b"\n\n")
            state["tail"] = data[data.rfind(b"\n\n") + 2:] if n else data
            for _ in range(n):
                if state["events"] == 0:
                    ttft.append(now - t0)
                else:
                    gaps.append(now - state["last"])
                state["last"] = now
                state["events"] += 1

        conn.send(req)
        resp = conn.read_response("POST", on_data=on_data)
        if resp.status != 200 or not resp.complete:
            errors += 1
        else:
            done += 1
    conn.close()
    out.put({"ttft": ttft, "gaps": gaps, "errors": errors, "done": done})


def run_load(target, port, duration, concurrency, body, stream):
    """Runs concurrency client processes against port; returns merged figures."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start_at = time.time() + 0.3
    fn = client_stream if stream else client_small
    procs = [ctx.Process(target=fn, args=(port, duration, body, start_at, q))
             for _ in range(concurrency)]
    for p in procs:
        p.start()
    results = [q.get(timeout=duration + 30) for _ in procs]
    for p in procs:
        p.join(10)
    merged = {"target": target, "concurrency": concurrency, "duration": duration,
              "errors": sum(r["errors"] for r in results)}
    if stream:
        merged["ttft"] = [x for r in results for x in r["ttft"]]
        merged["gaps"] = [x for r in results for x in r["gaps"]]
        merged["done"] = sum(r["done"] for r in results)
    else:
        merged["lat"] = [x for r in results for x in r["lat"]]
    return merged


@contextlib.contextmanager
def nginx_proxy(binary, upstream_port):
    """nginx (1 worker, no master, proxy_buffering off: events pass as they come) on a free
    loopback port in front of 127.0.0.1:upstream_port, started here and stopped by its PID; yields
    (port, pid)."""
    d = tempfile.mkdtemp(prefix="kvr_po_nginx_")
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write("""daemon off; master_process off; worker_processes 1; pid %(d)s/nginx.pid;
error_log %(d)s/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path %(d)s/body; proxy_temp_path %(d)s/proxy; fastcgi_temp_path %(d)s/f;
  uwsgi_temp_path %(d)s/u; scgi_temp_path %(d)s/s;
  keepalive_requests 1000000;
  upstream sim { server 127.0.0.1:%(up)d; keepalive 16; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:%(port)d;
    location / {
      proxy_pass http://sim; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
""" % {"d": d, "up": upstream_port, "port": port})
    proc = subprocess.Popen([binary, "-p", d, "-c", os.path.join(d, "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        h.wait_for(lambda: h.can_connect(port, 0.2), 5.0, "nginx listening")
        run_load("warmup", port, 0.5, 1, h.chat_body("warm up", max_tokens=1, stream=True), True)
        yield port, proc.pid
    finally:
        proc.terminate()  # by PID
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def ms(x):
    return "%.3f" % (x * 1e3) if x == x else "n/a"


def cpu_ns(pid):
    """CPU time the process has run, in ns: the sum of its threads' first /proc/PID/task/TID/schedstat
    field (the scheduler's run time, nanosecond resolution; utime/stime count 10 ms ticks, too
    coarse for a cell of a few hundred one-token streams)."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
            total += int(f.read().split()[0])
    return total


def run_load_cpu(target, port, duration, concurrency, body, stream, pid):
    """run_load, plus the CPU the proxy process pid spent over it ("cpu_ns"); pid None: run_load."""
    if pid is None:
        return run_load(target, port, duration, concurrency, body, stream)
    before = cpu_ns(pid)
    m = run_load(target, port, duration, concurrency, body, stream)
    m["cpu_ns"] = cpu_ns(pid) - before
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    ap.add_argument("--concurrency", type=int, default=4, help="client processes for throughput")
    ap.add_argument("--stream-concurrency", type=int, default=8)
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="sim's fixed TTFT (streaming)")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="sim's fixed inter-token latency")
    ap.add_argument("--tokens", type=int, default=50, help="tokens per streaming request")
    ap.add_argument("--json", help="also write the raw figures here")
    ap.add_argument("--nginx", metavar="PATH",
                    help="also measure the first-token cell through this nginx binary (1 worker, "
                         "proxy_buffering off, upstream keep-alive to the same sim): a reference "
                         "proxy's added time on the same machine")
    args = ap.parse_args()
    h.set_kvrouter(args.kvrouter)

    rows, raw = [], {}
    with h.Cleanup() as c:
        fast = c.add(h.Sim(fixed=(0, 0), log_level="error"))
        timed = c.add(h.Sim(fixed=(args.ttft_ms, args.itl_ms), log_level="error"))
        r_fast = c.add(h.Router([fast], "--access-log", "false"))
        r_timed = c.add(h.Router([timed], "--access-log", "false"))
        small = h.chat_body("What is the capital of France?", max_tokens=1)
        streamb = h.chat_body("Tell me a story about a router.", max_tokens=args.tokens, stream=True)
        firstb = h.chat_body("Tell me a story about a router.", max_tokens=1, stream=True)
        # Warm up both paths (connections, allocations).
        for port in (fast.port, r_fast.port):
            run_load("warmup", port, 0.5, 1, small, False)
        for port in (timed.port, r_timed.port):
            run_load("warmup", port, 0.5, 1, streamb, True)

        for conc in sorted({1, args.concurrency}):
            res = {}
            for target, port in (("direct", fast.port), ("router", r_fast.port)):
                m = run_load(target, port, args.duration, conc, small, False)
                res[target] = m
                rows.append(("small non-streaming", target, conc, len(m["lat"]) / args.duration,
                             pctl(m["lat"], 50), pctl(m["lat"], 99), None, None, m["errors"]))
            d, rt = res["direct"], res["router"]
            rows.append(("small non-streaming", "**router - direct**", conc,
                         "%+.0f%%" % (100.0 * (len(rt["lat"]) / max(1, len(d["lat"])) - 1)),
                         pctl(rt["lat"], 50) - pctl(d["lat"], 50),
                         pctl(rt["lat"], 99) - pctl(d["lat"], 99),
                         None, None, None))
            raw["small_c%d" % conc] = {k: {"n": len(v["lat"]), "p50": pctl(v["lat"], 50),
                                           "p99": pctl(v["lat"], 99), "errors": v["errors"]}
                                       for k, v in res.items()}
        res = {}
        conc = args.stream_concurrency
        for target, port in (("direct", timed.port), ("router", r_timed.port)):
            m = run_load(target, port, args.duration, conc, streamb, True)
            res[target] = m
            rows.append(("streaming %d tok" % args.tokens, target, conc, m["done"] / args.duration,
                         pctl(m["ttft"], 50), pctl(m["ttft"], 99), pctl(m["gaps"], 50),
                         pctl(m["gaps"], 99), m["errors"]))
        d, rt = res["direct"], res["router"]
        rows.append(("streaming %d tok" % args.tokens, "**router - direct**", conc,
                     "%+.0f%%" % (100.0 * (rt["done"] / max(1, d["done"]) - 1)),
                     pctl(rt["ttft"], 50) - pctl(d["ttft"], 50),
                     pctl(rt["ttft"], 99) - pctl(d["ttft"], 99),
                     pctl(rt["gaps"], 50) - pctl(d["gaps"], 50),
                     pctl(rt["gaps"], 99) - pctl(d["gaps"], 99),
                     None))
        raw["stream"] = {k: {"done": v["done"], "ttft_p50": pctl(v["ttft"], 50),
                             "ttft_p99": pctl(v["ttft"], 99), "gap_p50": pctl(v["gaps"], 50),
                             "gap_p99": pctl(v["gaps"], 99), "errors": v["errors"]}
                         for k, v in res.items()}
        # The first token alone: one-token streams, one client, back to back, so a 3 s cell holds
        # ~100 first tokens (a --tokens stream gives one per --tokens x ITL, ~6 in 3 s).
        res = {}
        for target, port, pid in (("direct", timed.port, None),
                                  ("router", r_timed.port, r_timed.pid)):
            m = run_load_cpu(target, port, args.duration, 1, firstb, True, pid)
            res[target] = m
            rows.append(("first token only", target, 1, m["done"] / args.duration,
                         pctl(m["ttft"], 50), pctl(m["ttft"], 99), None, None, m["errors"]))
        d, rt = res["direct"], res["router"]
        rows.append(("first token only", "**router - direct**", 1,
                     "%+.0f%%" % (100.0 * (rt["done"] / max(1, d["done"]) - 1)),
                     pctl(rt["ttft"], 50) - pctl(d["ttft"], 50),
                     pctl(rt["ttft"], 99) - pctl(d["ttft"], 99), None, None, None))
        if args.nginx:
            with nginx_proxy(args.nginx, timed.port) as (nport, npid):
                m = run_load_cpu("nginx", nport, args.duration, 1, firstb, True, npid)
            res["nginx"] = m
            rows.append(("first token only", "nginx", 1, m["done"] / args.duration,
                         pctl(m["ttft"], 50), pctl(m["ttft"], 99), None, None, m["errors"]))
            rows.append(("first token only", "**nginx - direct**", 1,
                         "%+.0f%%" % (100.0 * (m["done"] / max(1, d["done"]) - 1)),
                         pctl(m["ttft"], 50) - pctl(d["ttft"], 50),
                         pctl(m["ttft"], 99) - pctl(d["ttft"], 99), None, None, None))
        raw["first_token"] = {k: {"done": v["done"], "ttft_p50": pctl(v["ttft"], 50),
                                  "ttft_p99": pctl(v["ttft"], 99), "errors": v["errors"]}
                              for k, v in res.items()}
        for k, v in res.items():
            if "cpu_ns" in v and v["done"]:
                raw["first_token"][k]["cpu_us_per_request"] = v["cpu_ns"] / 1e3 / v["done"]

    print(first_line() + "\n")
    print("## Router overhead on loopback (%g s per cell, sim fixed latency; stream: TTFT %g ms, "
          "ITL %g ms, %d tokens)\n" % (args.duration, args.ttft_ms, args.itl_ms, args.tokens))
    print("| scenario | path | clients | req/s | latency or TTFT p50 ms | p99 ms | "
          "event gap p50 ms | gap p99 ms | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for scen, target, conc, rps, p50, p99, g50, g99, err in rows:
        print("| %s | %s | %d | %s | %s | %s | %s | %s | %s |" % (
            scen, target, conc, rps if isinstance(rps, str) else "%.0f" % rps, ms(p50), ms(p99), ms(g50) if g50 is not None else "",
            ms(g99) if g99 is not None else "", "" if err is None else err))
    print("\nlatency = request written -> complete response read (non-streaming); TTFT = request "
          "written -> first SSE event read; gap = time between successive SSE events as read by the "
          "client. cores: %d" % os.cpu_count())
    cpu = ["%s %.1f us" % (k, v["cpu_us_per_request"]) for k, v in raw["first_token"].items()
           if "cpu_us_per_request" in v]
    if cpu:
        print("\nProxy CPU per one-token stream in the first-token cell (its threads' run time from "
              "/proc/PID/task/*/schedstat over the cell, divided by the streams): " + ", ".join(cpu)
              + ".")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
