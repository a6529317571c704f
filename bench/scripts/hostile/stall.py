#!/usr/bin/env python3
"""stall.py -- how long hostile request bodies stall kvrouter's event loop, and what they cost in
memory (issue 37, "Hostile bytes"; results in bench/results/hostile/REPORT.md).

Setup (loopback only, ports picked by the kernel): --workers `kvrouter sim` workers with fixed
timing (the engine bypassed: their answers cost the router nothing to wait for) behind one
`kvrouter serve` with its default limits (8 MiB bodies). A prober, a child process of its own (so
that this script's threads never delay it), sends GET /livez on one keep-alive connection to the
router's public listener about every millisecond and records when each answer arrives: the loop
answers /livez whatever the workers, so the longest gap between two answers is the longest time
the loop did nothing else.

Phases, one after the other, each with the router's peak RSS (VmHWM of /proc/PID/status, reset
before the phase by writing 5 to /proc/PID/clear_refs):
  idle        nothing but the prober (the gap the machine itself gives), --idle seconds;
  hostile     issue 37's bodies, each POSTed --repeat times on a fresh connection, waiting for the
              answer: /v1/completions with the most token ids an 8 MiB body holds (4.19 M), a chat
              body with 2.8 M empty arrays in an unknown field, a chat body of 280,000 tiny
              messages;
  accepted    the largest bodies kvr_json_guard's default limits let through (src/proto/
              json_guard.h): 131,071 token ids (the sim's max_model_len is 131,072), 32,768 chat
              messages, one 8 MiB message, 262,000 values and 65,528 keys in unknown members:
              what the loop still pays for a body it accepts;
  senders     100 concurrent connections, each announcing an 8 MiB body and sending all of it but
              the last 64 KiB, held --hold seconds (what the router answered by then is counted),
              then closed (last: the memory it leaves would count in a later phase's peak).
For each body: its size, the answer's status and code, the time to the answer, the longest /livez
gap while it was sent and answered (the worst of the repeats, and their median).

The binary runs from a private copy (a rebuild of the tree during the run cannot swap it). The
report's first line names the command and the commit (bench/scripts/lib/provenance.py); the
copy's own --version is printed under it (the binary may be older than the checkout). Its last
section holds the figures as JSON: --before REPORT.md puts that earlier run's figures beside the
new ones (the lead's after-wiring run: --before bench/results/hostile/REPORT.md before the file is
overwritten).

usage: python3 bench/scripts/hostile/stall.py --kvrouter build/kvrouter
           [--out bench/results/hostile/REPORT.md] [--before OLD_REPORT.md] [--workers 2]
           [--repeat 3] [--idle 3] [--hold 3] [--phases idle,hostile,accepted,senders]
The standard library only.
"""
import argparse
import json
import os
import re
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import kvrharness as h  # noqa: E402
from provenance import first_line  # noqa: E402

MAX_BODY = 8 << 20  # kvrouter serve's default limits.max_body_bytes
FIGURES = "figures (JSON, read by --before)"


# ---- the prober (a child process) ----------------------------------------------------------------


def probe(port):
    """Child: GET /livez every ~1 ms on one connection until stdin closes; prints the answer times
    (time.monotonic(), the system's CLOCK_MONOTONIC) and the non-200 count as JSON."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    req = b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    times, bad, sock, buf = [], 0, None, b""
    nxt = time.monotonic()
    while not stop.is_set():
        if sock is None:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
        try:
            sock.sendall(req)
            status, buf = read_answer(sock, buf)
        except (OSError, EOFError):
            sock.close()
            sock = None
            continue
        t = time.monotonic()
        times.append(t)
        bad += status != 200
        nxt = max(nxt + 0.001, t)
        time.sleep(max(0.0, nxt - time.monotonic()))
    sys.stdout.write(json.dumps({"times": times, "bad": bad}))


def read_answer(sock, buf):
    """One HTTP/1.1 answer with a Content-Length body from sock (buf: bytes already read)."""
    while b"\r\n\r\n" not in buf:
        d = sock.recv(65536)
        if not d:
            raise EOFError
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    n = int(m.group(1)) if m else 0
    while len(rest) < n:
        d = sock.recv(65536)
        if not d:
            raise EOFError
        rest += d
    return status, rest[n:]


# ---- bodies --------------------------------------------------------------------------------------


def fill(prefix, unit, suffix, first=None):
    """prefix, first (or unit), then unit repeated while the body stays within MAX_BODY, suffix."""
    first = unit if first is None else first
    n = (MAX_BODY - len(prefix) - len(first) - len(suffix)) // len(unit)
    return prefix + first + unit * n + suffix


def chat_prefix():
    return b'{"model":"%s","max_tokens":1,"messages":[{"role":"user","content":"hi"}]' % (
        h.MODEL.encode())


def hostile_bodies():
    """(label, path, body) of issue 37's three bodies."""
    ids = fill(b'{"model":"%s","max_tokens":1,"prompt":[' % h.MODEL.encode(), b",1", b"]}", b"1")
    arrays = fill(chat_prefix() + b',"junk":[', b",[]", b"]}", b"[]")
    msg = b'{"role":"user","content":""}'
    msgs = (b'{"model":"%s","max_tokens":1,"messages":[' % h.MODEL.encode() +
            b",".join([msg] * 280000) + b"]}")
    return [("%s token ids (completions)" % count(ids, b","), "/v1/completions", ids),
            ("%s empty arrays in an unknown member (chat)" % count(arrays, b"[]"),
             "/v1/chat/completions", arrays),
            ("280,000 messages (chat)", "/v1/chat/completions", msgs)]


def accepted_bodies():
    """(label, path, body): the largest bodies json_guard's default limits accept."""
    model = h.MODEL.encode()
    ids = b'{"model":"%s","max_tokens":1,"prompt":[%s]}' % (model, b",".join([b"128000"] * 131071))
    msg = b'{"role":"user","content":"hello there"}'
    msgs = b'{"model":"%s","max_tokens":1,"messages":[%s]}' % (model, b",".join([msg] * 32768))
    big = fill(b'{"model":"%s","max_tokens":1,"messages":[{"role":"user","content":"' % model,
               b"abcdefgh", b'"}]}')
    values = chat_prefix() + b',"x":[' + b",".join([b"0"] * 262000) + b"]}"
    keys = chat_prefix() + b',"x":{' + b",".join(
        b'"k%d":0' % i for i in range(65536 - 8)) + b"}}"
    return [("131,071 token ids (completions)", "/v1/completions", ids),
            ("32,768 messages (chat)", "/v1/chat/completions", msgs),
            ("one 8 MiB message (chat)", "/v1/chat/completions", big),
            ("262,000 values in an unknown member (chat)", "/v1/chat/completions", values),
            ("65,528 keys in an unknown member (chat)", "/v1/chat/completions", keys)]


def count(body, unit):
    return "{:,}".format(body.count(unit) + (1 if unit == b"," else 0))


# ---- measuring -----------------------------------------------------------------------------------


class Run:
    """The processes of one measurement and what they recorded."""

    def __init__(self, args):
        self.args = args
        self.cleanup = h.Cleanup()
        self.prober = None
        try:
            sims = [self.cleanup.add(h.Sim(fixed=(5, 1), admin=False))
                    for _ in range(args.workers)]
            self.router = self.cleanup.add(h.Router(sims))
            h.wait_for(lambda: all(w.get("max_model_len") for w in self.router.workers()), 10,
                       "the workers' max_model_len")
            self.prober = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--probe",
                                            str(self.router.port)], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE)
            time.sleep(0.5)  # the prober's first answers
        except BaseException:
            self.finish()
            raise
        self.times, self.bad_probes = [], 0

    def status(self, field):
        with open("/proc/%d/status" % self.router.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return None

    def reset_peak(self):
        """Resets VmHWM to the current RSS; False when the kernel refuses."""
        try:
            with open("/proc/%d/clear_refs" % self.router.pid, "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def finish(self):
        """Stops the prober (keeping its times) and the processes; returns a stop problem or
        None."""
        if self.prober is not None:
            out, _ = self.prober.communicate(b"", timeout=30)
            got = json.loads(out)
            self.times, self.bad_probes = got["times"], got["bad"]
            self.prober = None
        try:
            self.cleanup.__exit__(None, None, None)
        except AssertionError as e:
            return str(e)
        return None

    def gap_ms(self, t0, t1):
        """The longest gap between /livez answers that ends in [t0, t1]."""
        ts, best = self.times, 0.0
        for i in range(1, len(ts)):
            if t0 <= ts[i] <= t1:
                best = max(best, ts[i] - ts[i - 1])
        return best * 1000


def post(port, path, body, timeout=120):
    """POSTs body on a fresh connection: (t_start, t_end, status, code)."""
    t0 = time.monotonic()
    r = h.request(port, "POST", path, body, timeout=timeout)
    t1 = time.monotonic()
    code = ""
    try:
        err = r.json().get("error") or {}
        code = str(err.get("code") or err.get("type") or "")
    except (ValueError, AttributeError):
        pass
    return t0, t1, r.status, code


def phase_bodies(run, bodies, repeat):
    """Each body POSTed repeat times; a row per body (windows measured after the run)."""
    rows = []
    for label, path, body in bodies:
        reset = run.reset_peak()
        posts = []
        for _ in range(repeat):
            time.sleep(0.3)
            posts.append(post(run.router.port, path, body))
        time.sleep(0.3)
        rows.append({"body": label, "path": path, "bytes": len(body), "posts": posts,
                     "peak_kib": run.status("VmHWM"), "peak_reset": reset})
    return rows


def send_most(port, size, keep, errors):
    """One connection announcing a size-byte body and sending all but its last keep bytes."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                "application/json\r\nContent-Length: %d\r\n\r\n" % size).encode()
        s.sendall(head + b"[" + b"0," * ((size - keep) // 2))
        return s
    except OSError as e:
        errors.append(str(e))
        return None


def phase_senders(run, n, hold):
    """n connections each sending most of an 8 MiB body at once, held, then closed."""
    reset = run.reset_peak()
    socks, errors, threads = [None] * n, [], []
    t0 = time.monotonic()

    def one(i):
        socks[i] = send_most(run.router.port, MAX_BODY, 64 << 10, errors)

    for i in range(n):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
    for t in threads:
        t.join()
    t_sent = time.monotonic()
    time.sleep(hold)
    rss_held = run.status("VmRSS")
    answers = early_answers([s for s in socks if s is not None])
    for s in socks:
        if s is not None:
            s.close()
    time.sleep(1.0)
    t1 = time.monotonic()
    return {"body": "%d connections x %d of %d bytes" % (n, MAX_BODY - (64 << 10), MAX_BODY),
            "connections": n, "sent_s": round(t_sent - t0, 3), "window": [t0, t1],
            "rss_held_kib": rss_held, "rss_after_kib": run.status("VmRSS"),
            "peak_kib": run.status("VmHWM"), "peak_reset": reset, "errors": errors[:3],
            "answers": answers}


def early_answers(socks):
    """What the router said to connections whose body is not complete: counts by the status of
    the answer read so far, "closed" (EOF without one) or "none" (nothing yet)."""
    counts = {}
    readable, _, _ = select.select(socks, [], [], 0.2) if socks else ([], [], [])
    for s in socks:
        what = "none"
        if s in readable:
            try:
                d = s.recv(4096)
                m = re.match(rb"HTTP/1\.[01] (\d{3})", d)
                what = m.group(1).decode() if m else ("closed" if not d else "other")
            except OSError:
                what = "reset"
        counts[what] = counts.get(what, 0) + 1
    return counts


def summarize_posts(run, rows):
    for r in rows:
        gaps = [run.gap_ms(t0, t1 + 0.05) for t0, t1, _, _ in r["posts"]]
        r["gap_ms_max"] = round(max(gaps), 1)
        r["gap_ms_median"] = round(statistics.median(gaps), 1)
        r["answer_ms"] = round(statistics.median([(t1 - t0) * 1000 for t0, t1, _, _ in r["posts"]]),
                               1)
        r["status"] = sorted({("%d %s" % (st, code)).strip() for _, _, st, code in r["posts"]})
        del r["posts"]


def measure(args):
    phases = args.phases.split(",")
    run = Run(args)
    fig = {"phases": phases, "workers": args.workers, "repeat": args.repeat}
    try:
        t0 = time.monotonic()
        time.sleep(args.idle)
        fig["idle"] = {"window": [t0 + 0.5, time.monotonic()], "rss_kib": run.status("VmRSS")}
        if "hostile" in phases:
            fig["hostile"] = phase_bodies(run, hostile_bodies(), args.repeat)
        if "accepted" in phases:
            fig["accepted"] = phase_bodies(run, accepted_bodies(), args.repeat)
        if "senders" in phases:  # last: the memory it leaves would count in a later peak
            fig["senders"] = phase_senders(run, 100, args.hold)
    finally:
        fig["router_problem"] = run.finish()
    idle = fig["idle"]
    ts = [t for t in run.times if idle["window"][0] <= t <= idle["window"][1]]
    gaps = sorted((b - a) * 1000 for a, b in zip(ts, ts[1:]))
    idle["gap_ms_max"] = round(gaps[-1], 2) if gaps else None
    idle["gap_ms_p99"] = round(h.percentile(gaps, 99), 2) if gaps else None
    idle["answers_per_s"] = round(len(ts) / (idle["window"][1] - idle["window"][0]), 0)
    del idle["window"]
    for key in ("hostile", "accepted"):
        if key in fig:
            summarize_posts(run, fig[key])
    if "senders" in fig:
        s = fig["senders"]
        s["gap_ms_max"] = round(run.gap_ms(*s["window"]), 1)
        del s["window"]
    fig["probes"] = len(run.times)
    fig["probes_not_200"] = run.bad_probes
    return fig


# ---- the report ----------------------------------------------------------------------------------


def read_figures(path):
    """The figures block of an earlier REPORT.md, or None."""
    with open(path) as f:
        text = f.read()
    m = re.search(r"```json\n(.*?)\n```", text[text.find(FIGURES):], re.S)
    return json.loads(m.group(1)) if m else None


def mib(kib):
    return "-" if kib is None else "{:,.0f}".format(kib / 1024)


def body_table(rows, before):
    old = {r["body"]: r for r in (before or [])}
    lines = ["| body | bytes | answer | answer ms | longest /livez gap ms, max (median) | "
             "router peak RSS MiB |",
             "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        cells = [r["body"], "{:,}".format(r["bytes"]), ", ".join(r["status"]),
                 "%.1f" % r["answer_ms"], "%.1f (%.1f)" % (r["gap_ms_max"], r["gap_ms_median"]),
                 mib(r["peak_kib"])]
        b = old.get(r["body"])
        if b:
            cells[2] += " (before: %s)" % ", ".join(b["status"])
            cells[3] += " (before %.1f)" % b["answer_ms"]
            cells[4] += " (before %.1f)" % b["gap_ms_max"]
            cells[5] += " (before %s)" % mib(b["peak_kib"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def version(kvrouter):
    try:
        return subprocess.run([kvrouter, "--version"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError as e:
        return "unknown (%s)" % e


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def render(args, fig, before):
    b = before or {}
    lines = [first_line(), "", "# Hostile request bodies: event-loop stalls and memory (issue 37)", "",
             "Binary: `%s` (%s). Machine: %d CPUs, %s. %d `kvrouter sim` workers (fixed timing), "
             "one `kvrouter serve` with default limits (8 MiB bodies); a /livez prober on the "
             "router's public listener every ~1 ms, %s answers in all (%s not 200)." % (
                 os.path.relpath(args.kvrouter, ROOT) if args.kvrouter.startswith(ROOT)
                 else args.kvrouter, fig["version"], os.cpu_count(), cpu_model(),
                 fig["workers"], "{:,}".format(fig["probes"]), fig["probes_not_200"]),
             "",
             "The longest gap between two /livez answers is the longest time the loop did "
             "nothing else; it is measured while each body is sent and answered (the worst of %d "
             "posts, median in brackets). Answer: the status and error code (or type) the client "
             "got, from the router or passed on from a sim worker. Peak RSS is the router's "
             "VmHWM, reset before each body's posts." % fig["repeat"], ""]
    idle = fig["idle"]
    lines += ["## Idle", "",
              "Longest gap %s ms, p99 %s ms, %s answers/s; router RSS %s MiB." % (
                  idle["gap_ms_max"], idle["gap_ms_p99"], idle["answers_per_s"],
                  mib(idle["rss_kib"])), ""]
    if "hostile" in fig:
        lines += ["## Issue 37's bodies", ""] + body_table(fig["hostile"], b.get("hostile")) + [""]
    if "accepted" in fig:
        lines += ["## The largest bodies the guard's default limits accept", "",
                  "What the loop still pays for a body that passes (json_guard.h defaults; the "
                  "sim's max_model_len is 131,072).", ""]
        lines += body_table(fig["accepted"], b.get("accepted")) + [""]
    if "senders" in fig:
        s, o = fig["senders"], b.get("senders")
        answers = ", ".join("%s %s" % (n, k) for k, n in sorted(s["answers"].items()))
        lines += ["## Many slow bodies at once", "",
                  "%s, sent in %.1f s, held %s s, then closed: longest /livez gap %.1f ms%s; "
                  "router RSS while held %s MiB, after %s MiB, peak %s MiB%s. Answers before the "
                  "bodies were complete (by status; none: nothing yet): %s." % (
                      s["body"], s["sent_s"], args.hold, s["gap_ms_max"],
                      " (before %.1f)" % o["gap_ms_max"] if o else "", mib(s["rss_held_kib"]),
                      mib(s["rss_after_kib"]), mib(s["peak_kib"]),
                      " (before %s)" % mib(o["peak_kib"]) if o else "", answers), ""]
        if s["errors"]:
            lines += ["Connection errors: %s" % "; ".join(s["errors"]), ""]
    if fig.get("router_problem"):
        lines += ["Router stop: %s" % fig["router_problem"], ""]
    lines += ["## " + FIGURES, "", "```json", json.dumps(fig, sort_keys=True), "```", ""]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--kvrouter", help="the kvrouter binary (sim and serve)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "hostile",
                                                  "REPORT.md"))
    ap.add_argument("--before", help="an earlier REPORT.md whose figures go beside these")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--hold", type=float, default=3.0)
    ap.add_argument("--phases", default="idle,hostile,accepted,senders")
    args = ap.parse_args()
    if args.probe:
        probe(args.probe)
        return 0
    if not args.kvrouter:
        ap.error("--kvrouter is required")
    args.kvrouter = os.path.abspath(args.kvrouter)
    before = read_figures(args.before) if args.before else None
    # A private copy: a rebuild of the tree during the run cannot swap the binary under it.
    tmp = tempfile.mkdtemp(prefix="kvr-stall-")
    try:
        copy = os.path.join(tmp, "kvrouter")
        shutil.copy2(args.kvrouter, copy)
        h.set_kvrouter(copy)
        ver = version(copy)
        fig = measure(args)
        fig["version"] = ver
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    h.write_report(args.out, render(args, fig, before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
