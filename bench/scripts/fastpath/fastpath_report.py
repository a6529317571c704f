#!/usr/bin/env python3
"""fastpath_report.py -- renders the fast-path report from the raw files fastpath.sh wrote.

Experiment fastpath (bench/results/fastpath/): writes OUT.md only (fastpath.sh: OUT/REPORT.md, i.e.
bench/results/fastpath/REPORT.md and bench/results/fastpath/2cores/REPORT.md). Its first line names
the run's command and commit from RAW/meta.json (what made the figures; a re-render keeps them).

Reads RAW/meta.json (command, date, machine, versions), RAW/cells.jsonl (one wrk cell per line: row,
target, connections, the proxy's CPU ticks over the cell and wrk's FASTPATH_RESULT), RAW/sse.jsonl
(fastpath_sse.py's results), RAW/bench_routing.md (`kvrouter bench routing`'s table) and
RAW/proxy_overhead.json and RAW/access_log.jsonl (lines each access-logging target wrote against the
responses wrk counted), and writes the Markdown: throughput with the kvrouter/nginx and
kvrouter/HAProxy ratios, p99 latency, proxy CPU per request, the same with the access log on (what a
log line costs each), streaming cost, routing cost, and the issue's targets each with its measured
value. Nothing is computed that the raw files do not hold, so
`fastpath_report.py RAW OUT.md` re-renders a kept run (e.g. `python3
bench/scripts/fastpath/fastpath_report.py bench/results/fastpath/raw
bench/results/fastpath/REPORT.md`).

usage: bench/scripts/fastpath/fastpath_report.py RAW_DIR OUT.md
"""
import json
import os
import re
import sys

ROWS = [("get", "GET /v1/models"), ("small", "POST small chat body"),
        ("p64", "POST 64 KiB prompt"), ("p400", "POST 400 KiB prompt")]
TARGETS = ["direct", "nginx", "haproxy", "kvrouter"]
NAMES = {"direct": "direct", "nginx": "nginx", "haproxy": "HAProxy", "kvrouter": "kvrouter",
         "nginx_log": "nginx (access log on)", "kvrouter_log": "kvrouter (access log on)"}


def load_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rps(cell):
    w = cell["wrk"]
    return w["requests"] / (w["duration_us"] / 1e6)


def routing_figures(path):
    """warm/cold decision p99, insert p50 (us) and bytes per entry from bench routing's Markdown."""
    if not os.path.exists(path):
        return {}
    text = open(path).read()
    out = {}
    for key, label, col in (("warm_p99", "warm: decision", 3), ("cold_p99", "cold: decision", 3),
                            ("insert_p50", "index insert", 2)):
        m = re.search(r"^\| %s[^|]*\|([^\n]*)$" % re.escape(label), text, re.M)
        if m:
            out[key] = float(m.group(1).split("|")[col - 1].strip())
    m = re.search(r"= ([0-9.]+) bytes per (?:\(block, worker\) )?entry", text)
    if m:
        out["bytes_per_entry"] = float(m.group(1))
    m = re.search(r"^Prompt: (.*)$", text, re.M)
    out["setup"] = m.group(1) if m else ""
    m = re.search(r"policy (\w+)", text)
    out["policy"] = m.group(1) if m else "?"
    return out


def overhead_figures(path):
    """Router minus direct p50 (us): streaming TTFT and small non-streaming latency at 1 client."""
    if not os.path.exists(path):
        return {}
    raw = json.load(open(path))
    out = {}
    # The first-token cell (one-token streams, ~100 samples) when the run has it, else the
    # streaming cell's first tokens (one per stream).
    s = raw.get("first_token") or raw.get("stream")
    if s:
        out["ttft_added_p50_us"] = (s["router"]["ttft_p50"] - s["direct"]["ttft_p50"]) * 1e6
        out["ttft_samples"] = s["router"].get("done")
        if "nginx" in s:
            out["nginx_ttft_added_p50_us"] = (s["nginx"]["ttft_p50"] - s["direct"]["ttft_p50"]) * 1e6
        # Proxy CPU per one-token stream (runs since the eleventh session record it).
        for who in ("router", "nginx"):
            if "cpu_us_per_request" in s.get(who, {}):
                out[who + "_cpu_us"] = s[who]["cpu_us_per_request"]
    if "small_c1" in raw:
        s = raw["small_c1"]
        out["small_added_p50_us"] = (s["router"]["p50"] - s["direct"]["p50"]) * 1e6
    return out


def fmt_int(x):
    return "{:,.0f}".format(x)


def throughput_table(cells):
    lines = ["| request | conns | direct | nginx | HAProxy | kvrouter | kvrouter / nginx | "
             "kvrouter / HAProxy |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row, label in ROWS:
        c = cells.get(row, {})
        if not c:
            continue
        vals = {t: rps(c[t]) for t in TARGETS if t in c}
        conns = next(iter(c.values()))["conns"]
        ratio = lambda a, b: "%.2f" % (vals[a] / vals[b]) if a in vals and vals.get(b) else "n/a"
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
            label, conns, *("%s/s" % fmt_int(vals[t]) if t in vals else "n/a" for t in TARGETS),
            ratio("kvrouter", "nginx"), ratio("kvrouter", "haproxy")))
    return lines


def latency_table(cells):
    lines = ["| request | direct p99 | nginx p99 | HAProxy p99 | kvrouter p99 | kvrouter p50 | "
             "nginx p50 | HAProxy p50 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    ms = lambda c, k: "%.2f ms" % (c["wrk"][k] / 1e3) if c else "n/a"
    for row, label in ROWS:
        c = cells.get(row, {})
        if not c:
            continue
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            label, *(ms(c.get(t), "p99_us") for t in TARGETS),
            ms(c.get("kvrouter"), "p50_us"), ms(c.get("nginx"), "p50_us"),
            ms(c.get("haproxy"), "p50_us")))
    return lines


def cpu_per_request(cell):
    """The proxy's CPU seconds per request over the cell, or None."""
    if cell is None or not cell["wrk"]["requests"] or not cell["cpu_ticks"]:
        return None
    return cell["cpu_ticks"] / cell["tick_hz"] / cell["wrk"]["requests"]


def cpu_ratio(cells, row, other):
    """kvrouter / other at equal CPU: other's CPU per request over kvrouter's (the throughput ratio
    when both saturate one core, whatever else ran on the machine)."""
    c = cells.get(row, {})
    k, o = cpu_per_request(c.get("kvrouter")), cpu_per_request(c.get(other))
    return o / k if k and o else None


def cpu_table(cells):
    lines = ["| request | nginx | HAProxy | kvrouter | kvrouter cores busy | kvrouter / nginx at "
             "equal CPU | kvrouter / HAProxy at equal CPU |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row, label in ROWS:
        c = cells.get(row, {})
        if not c:
            continue
        def us(t):
            v = cpu_per_request(c.get(t))
            return "%.1f us" % (v * 1e6) if v else "n/a"
        k = c.get("kvrouter")
        busy = "%.2f" % (k["cpu_ticks"] / k["tick_hz"] / (k["wrk"]["duration_us"] / 1e6)) if k else "n/a"
        r = lambda o: "%.2f" % cpu_ratio(cells, row, o) if cpu_ratio(cells, row, o) else "n/a"
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            label, us("nginx"), us("haproxy"), us("kvrouter"), busy, r("nginx"), r("haproxy")))
    return lines


def access_log_table(cells, logs):
    """nginx and kvrouter with their access log on, against the same without it."""
    lines = ["| request | nginx, log on | kvrouter, log on | kvrouter / nginx | CPU per request: "
             "nginx, log on | kvrouter, log on | a line costs nginx | a line costs kvrouter |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row, label in ROWS:
        c = cells.get(row, {})
        if "nginx_log" not in c or "kvrouter_log" not in c:
            continue
        cpu = {t: cpu_per_request(c.get(t)) for t in ("nginx", "kvrouter", "nginx_log", "kvrouter_log")}
        us = lambda v: "%.1f us" % (v * 1e6) if v else "n/a"
        cost = lambda t: ("%+.1f us" % ((cpu[t + "_log"] - cpu[t]) * 1e6)
                          if cpu[t] and cpu[t + "_log"] else "n/a")
        lines.append("| %s | %s/s | %s/s | %.2f | %s | %s | %s | %s |" % (
            label, fmt_int(rps(c["nginx_log"])), fmt_int(rps(c["kvrouter_log"])),
            rps(c["kvrouter_log"]) / rps(c["nginx_log"]), us(cpu["nginx_log"]),
            us(cpu["kvrouter_log"]), cost("nginx"), cost("kvrouter")))
    if logs:
        lines += ["", "Lines written against responses wrk counted (every cell, warm-up and check "
                  "included; in-flight requests at a cell's end are logged too): " +
                  "; ".join("%s %s lines for %s responses" % (
                      NAMES.get(l["target"], l["target"]), fmt_int(l["lines"]),
                      fmt_int(l["responses"])) for l in logs) + "."]
    return lines


def targets_table(cells, sse, routing, overhead):
    def ratio(row, other):
        c = cells.get(row, {})
        if "kvrouter" in c and other in c:
            return rps(c["kvrouter"]) / rps(c[other])
        return None

    small = cells.get("small", {})
    p99k = small.get("kvrouter", {}).get("wrk", {}).get("p99_us")
    p99n = small.get("nginx", {}).get("wrk", {}).get("p99_us")
    paced = next((s for s in sse if s.get("itl_ms", 0) > 0), None)
    at_cpu = lambda row, o: cpu_ratio(cells, row, o)
    rows = [
        ("kvrouter / nginx, GET /v1/models", ratio("get", "nginx"), ">= 1.00", lambda v: v >= 1,
         "%.2f"),
        ("same at equal CPU", at_cpu("get", "nginx"), ">= 1.00", lambda v: v >= 1, "%.2f"),
        ("kvrouter / nginx, POST small", ratio("small", "nginx"), ">= 1.00", lambda v: v >= 1, "%.2f"),
        ("same at equal CPU", at_cpu("small", "nginx"), ">= 1.00", lambda v: v >= 1, "%.2f"),
        ("kvrouter / HAProxy, POST 64 KiB", ratio("p64", "haproxy"), ">= 1.00", lambda v: v >= 1,
         "%.2f"),
        ("same at equal CPU", at_cpu("p64", "haproxy"), ">= 1.00", lambda v: v >= 1, "%.2f"),
        ("kvrouter / HAProxy, POST 400 KiB", ratio("p400", "haproxy"), ">= 1.00", lambda v: v >= 1,
         "%.2f"),
        ("same at equal CPU", at_cpu("p400", "haproxy"), ">= 1.00", lambda v: v >= 1, "%.2f"),
        ("small-POST p99, kvrouter - nginx", (p99k - p99n) / 1e3 if p99k and p99n else None,
         "<= 0 ms", lambda v: v <= 0, "%+.2f ms"),
        ("routing decision p99, cold caches", routing.get("cold_p99"), "< 100 us",
         lambda v: v < 100, "%.1f us"),
        ("index bytes per (block, worker) entry", routing.get("bytes_per_entry"), "<= 40",
         lambda v: v <= 40, "%.1f"),
        ("time added to the first token, p50", overhead.get("ttft_added_p50_us"), "< 100 us",
         lambda v: v < 100, "%.0f us"),
        ("SSE events per router CPU-second (paced)", paced and paced.get("events_per_cpu_s"),
         ">= 300,000", lambda v: v >= 300000, "%s"),
    ]
    lines = ["| target | measured | goal | met |", "|---|---:|---:|:---:|"]
    for name, val, goal, ok, f in rows:
        if val is None and not (sse or routing or overhead):
            continue  # a --cores run: the wrk table only
        if val is None:
            lines.append("| %s | n/a | %s | n/a |" % (name, goal))
            continue
        shown = fmt_int(val) if f == "%s" else f % val
        lines.append("| %s | %s | %s | %s |" % (name, shown, goal, "yes" if ok(val) else "**no**"))
    return lines


def sse_table(sse):
    lines = ["| mode | streams x events | router CPU | wall | SSE events per router CPU-second |",
             "|---|---:|---:|---:|---:|"]
    for s in sse:
        mode = ("paced, ITL %g ms (one event per write)" % s["itl_ms"] if s["itl_ms"] > 0
                else "unpaced, ITL 0 (reads coalesce)")
        lines.append("| %s | %d x %d | %.2f s | %.2f s | %s |" % (
            mode, s["streams"], s["events_per_stream"], s["router_cpu_s"], s["wall_s"],
            fmt_int(s["events_per_cpu_s"]) if s["events_per_cpu_s"] else "n/a"))
    return lines


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: fastpath_report.py RAW_DIR OUT.md")
    raw, out_path = sys.argv[1], sys.argv[2]
    meta_path = os.path.join(raw, "meta.json")
    if not os.path.exists(meta_path):
        sys.exit("fastpath_report.py: %s: missing (run bench/scripts/fastpath/fastpath.sh)"
                 % meta_path)
    meta = json.load(open(meta_path))
    cells = {}  # the best round of each (row, target): most requests per second
    for c in load_jsonl(os.path.join(raw, "cells.jsonl")):
        best = cells.setdefault(c["row"], {}).get(c["target"])
        if best is None or rps(c) > rps(best):
            cells[c["row"]][c["target"]] = c
    if not cells:
        sys.exit("fastpath_report.py: %s/cells.jsonl: no cells" % raw)
    sse = load_jsonl(os.path.join(raw, "sse.jsonl"))
    routing = routing_figures(os.path.join(raw, "bench_routing.md"))
    overhead = overhead_figures(os.path.join(raw, "proxy_overhead.json"))

    md = ["Made by `%s` at commit %s, %s." % (meta["command"], meta["commit"],
                                              meta["date"].split()[0]), "",
          "# The fast path: kvrouter, nginx and HAProxy in one run (issue 20)", ""]
    if meta.get("note"):
        md += ["**%s**" % meta["note"], ""]
    cores = meta.get("cores", 1)
    rounds = ("one round" if meta.get("rounds", 1) == 1 else
              "%d rounds, each cell's best round shown (every round in raw/cells.jsonl)"
              % meta["rounds"])
    if cores == 1:
        setup = ("`wrk -t1` pinned to core 0, each proxy pinned to core 1 (nginx 1 worker with "
                 "upstream keepalive 64 and in-memory request bodies; HAProxy nbthread 1, "
                 "http-reuse always; kvrouter `serve --policy round_robin --access-log false "
                 "--scrape-interval-ms 0`), static nginx backend (1 worker, two ports) on core %d"
                 % meta["backend_cpu"])
    else:
        setup = ("%d cores, nothing pinned: `wrk -t%d`, the static nginx backend (%d workers, two "
                 "ports) and the proxy under test share cores 0-%d; nginx %d workers with upstream "
                 "keepalive 64 and in-memory request bodies; HAProxy nbthread %d, http-reuse "
                 "always; kvrouter: %d replicas of `serve --policy round_robin --access-log false "
                 "--scrape-interval-ms 0` on one port (`--reuse-port true`), each the others' "
                 "`--peer` with `--peer-sync-listen`; a proxy's CPU is the sum of its processes'"
                 % (cores, cores, cores, cores - 1, cores, cores, cores))
    md += ["- command: `%s`" % meta["command"],
           "- date: %s; commit %s; %s" % (meta["date"], meta["commit"], meta["kvrouter"]),
           "- machine: nproc %d, %s, kernel %s; load average at the end %s" % (
               meta["nproc"], meta["cpu"], meta["kernel"], " ".join(meta["loadavg_at_end"])),
           "- versions: %s; %s; %s" % (meta["nginx"], meta["haproxy"], meta["wrk"]),
           "- setup: %s; %d s per cell after a 1 s warm-up; %s; every cell ended with 0 socket "
           "errors and 0 responses >= 400 (the script fails otherwise); raw wrk output in `raw/`."
           % (setup, meta["duration_s"], rounds), ""]
    md += ["## Throughput (requests per second)", ""] + throughput_table(cells) + [""]
    md += ["## Latency", ""] + latency_table(cells) + [""]
    md += ["## Proxy CPU per request", "",
           "CPU time (utime + stime from /proc, nginx's master and workers, every kvrouter "
           "replica) over the cell divided by its requests; \"cores busy\" is kvrouter's CPU "
           "over the cell's wall time (near 1.00 on one core: kvrouter was the bottleneck there).",
           ""] + cpu_table(cells) + [""]
    if any("kvrouter_log" in c for c in cells.values()):
        md += ["## With the access log on", "",
               "The same cells through a second nginx and a second kvrouter with their access log "
               "on, one line per request to a file: nginx's default (`access_log PATH;`, combined "
               "format, one write(2) per request), kvrouter `--access-log true` with stderr to a "
               "file (logfmt lines, written once per loop iteration). \"A line costs\" is the "
               "CPU per request with the log on minus without it, from the table above (best "
               "rounds of each, so noise of a few us either way). HAProxy logs only to syslog and "
               "has no cell here.", ""] + access_log_table(
                   cells, load_jsonl(os.path.join(raw, "access_log.jsonl"))) + [""]
    if sse:
        md += ["## Streaming cost", "",
               "`kvrouter sim --fixed-ttft-ms 0 --fixed-itl-ms ITL` behind `kvrouter serve` "
               "(round_robin, no access log, no scrape); bench/scripts/fastpath/fastpath_sse.py "
               "reads every stream to `[DONE]` and the router's utime + stime before and after.",
               ""]
        md += sse_table(sse) + [""]
    if routing:
        md += ["## Routing cost (`kvrouter bench routing`, policy %s)" % routing["policy"], "",
               routing["setup"], "",
               "| decision p99 warm | decision p99 cold | index insert p50 | bytes per entry |",
               "|---:|---:|---:|---:|",
               "| %s us | %s us | %s us | %s |" % (routing.get("warm_p99", "n/a"),
                                                  routing.get("cold_p99", "n/a"),
                                                  routing.get("insert_p50", "n/a"),
                                                  routing.get("bytes_per_entry", "n/a")), ""]
    if overhead:
        md += ["## Time added to the first token (bench/scripts/fastpath/proxy_overhead.py)", "",
               "| figure | value |", "|---|---:|"]
        if "ttft_added_p50_us" in overhead:
            md.append("| TTFT added p50 (streaming, sim TTFT 20 ms, 1 client, %s first tokens) | "
                      "%.0f us |" % (overhead.get("ttft_samples", "?"),
                                     overhead["ttft_added_p50_us"]))
        if "nginx_ttft_added_p50_us" in overhead:
            md.append("| the same through nginx (1 worker, proxy_buffering off), for reference | "
                      "%.0f us |" % overhead["nginx_ttft_added_p50_us"])
        if "small_added_p50_us" in overhead:
            md.append("| latency added p50 (small non-streaming, 1 client) | %.0f us |"
                      % overhead["small_added_p50_us"])
        for who, label in (("router", "kvrouter"), ("nginx", "nginx")):
            if who + "_cpu_us" in overhead:
                md.append("| %s CPU per one-token stream in the first-token cell (run time of its "
                          "threads, schedstat) | %.1f us |" % (label, overhead[who + "_cpu_us"]))
        md += ["", "Full table: `raw/proxy_overhead.md`.", ""]
    for row in ("small", "p64"):
        syscalls = os.path.join(raw, "syscalls_%s.txt" % row)
        if os.path.exists(syscalls):  # --perf runs only
            lines = open(syscalls).read().splitlines()
            if row == "small":
                md += ["## System calls per request (`--perf`)", ""]
            md += [lines[0], ""] + lines[1:] + [""]
    counts = os.path.join(raw, "allocs_small.txt")
    if os.path.exists(counts):
        md += ["## Allocation calls per request (`--perf`)", "",
               "libc's malloc, calloc, realloc and free under uprobes, counted by `perf stat -p` "
               "over a small-POST cell (`raw/allocs_small.txt`: every call counted, not sampled; "
               "wrk is slower under the probes):", ""]
        md += ["- " + line.strip() for line in open(counts).read().splitlines() if line.strip()]
        sites = os.path.join(raw, "alloc_sites_small.md")
        if os.path.exists(sites):
            lib = re.findall(r"^\| (\S+) \| [0-9.]+ \| ([0-9.]+%) \|$", open(sites).read(), re.M)
            md += ["", "Whose they are (a 1-s cell recorded with call chains, "
                   "`raw/alloc_sites_small.md`; shares of the calls recorded): " +
                   ", ".join("%s %s" % x for x in lib) + "; the analysis is in NOTES.md."]
        md += [""]
    md += ["## Targets of issue 20", "",
           "The throughput ratios are the issue's definition; \"at equal CPU\" is the ratio of CPU "
           "per request (section above), which another process sharing the core disturbs less.",
           ""] + targets_table(cells, sse, routing, overhead) + [""]
    with open(out_path, "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
