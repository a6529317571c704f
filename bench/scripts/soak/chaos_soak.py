#!/usr/bin/env python3
"""chaos_soak -- `kvrouter serve` under steady load while its workers fail, for --duration seconds.

What runs (loopback only; every process started here is stopped here, by PID):
  - --workers `kvrouter sim` workers (fixed timing, --num-gpu-blocks small so the router's cache
    index reaches its capacity early and the RSS comparison sees steady state) listed in a config
    file, plus --spares more that the chaos adds and drains;
  - `kvrouter serve --config FILE` (the workers and timeouts live only in the file, so a SIGHUP
    reload controls them);
  - a client pool: --concurrency asyncio clients in one thread, each sending one request after the
    other on a fresh connection (after a 503, 0.25 s later, as an SDK client backs off; 85%
    streaming chat with usage, 15% non-streaming), each with a
    x-request-id, and classifying every answer byte by byte (the load generator `kvrouter bench`
    reports per-request errors, but not the wire-level facts this soak asserts: chunked framing
    ended, last SSE event, error events, token counts).
  - the chaos, on a random schedule (exponential gaps, mean --event-interval-s): SIGKILL a worker
    and restart it on the same port 1-4 s later; hang it (sim fault "hang": requests accepted,
    never answered) or make it refuse connections (fault "refuse") or cut streams (fault
    "disconnect") for 1-5 s; switch the policy (PUT /admin/policy); add a spare worker
    (POST /admin/workers) or drain one (DELETE /admin/workers/ID); rewrite the config file (policy,
    idle timeout, log level, which spare is listed) and SIGHUP the router, now and then with a
    broken file that must change nothing.

Outcomes of a request:
  completed    200; a stream ends with `data: [DONE]` after a finish_reason, no error event, usage
               and token events both equal to max_tokens, chunked framing terminated; a JSON answer
               parses and its usage says max_tokens
  clean_error  a 4xx/5xx with an OpenAI-style error body, or a stream that carries an error event
  bad          anything else: a stream cut without an error event, a 200 with the wrong token count,
               a connection closed or reset without an answer, no complete answer within the
               deadline (first-byte timeout + idle timeout + the longest stream + 5 s)

Asserted (exit 1 and the reasons in the summary when one fails): no bad outcome; no stream ended
with an error event while a healthy worker remained (issue 36; the event's message says why it was
not continued: no other worker, --resume-max, not resumable; a healthy worker is a sim up with no
fault from 1 s before the request began to its end that the router listed, not draining, at every
GET /admin/workers poll of that time; a break inside a tool call's arguments is allowed, and the
soak sends none); the router alive
all along and every reload that should succeed counted as one, every broken one as a failure;
every worker's in-flight count exactly 0 at the end (GET /admin/workers) and every sim idle; router
RSS growth under 5% between the 10th minute and the end (runs under 11 minutes: between 10% of the
run and the end; reported but not asserted on a sanitizer build, whose quarantine holds freed
memory); the router exits 0 at SIGTERM with no sanitizer report in its stderr (run it on
the ASan build to make that check mean something).

Experiment soak (bench/results/soak/): does the router stay correct and flat in memory for an hour
of failures? Writes DIR/chaos_summary.json (every figure), DIR/REPORT.md (rendered from it, its
first line the command and the commit: bench/scripts/lib/provenance.py) and DIR/requests.jsonl (one
line per request: id, kind, outcome, status, detail, t0 and t1 in seconds from the start, seconds;
a per-request log, never committed).
The committed run is bench/results/soak/ (its REPORT.md and chaos_summary.json; DIR was a scratch
folder).

Run:  python3 bench/scripts/soak/chaos_soak.py --kvrouter build/kvrouter --duration 600 --out DIR
"""
import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "harness"))
import kvrharness as h  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from provenance import command, first_line  # noqa: E402

POLICIES = ["round_robin", "least_load", "kv_aware", "gie_scorer", "sglang_cache_aware",
            "dynamo_kv", "llmd_precise"]
FIRST_BYTE_MS = 3000
IDLE_MS = (2000, 4000)  # the reloads pick the idle timeout in this range
TTFT_MS, ITL_MS = 30, 10
MAX_TOKENS = (4, 60)
# A worker counts as healthy for a request when it was up with no fault from this long before the
# request began (the router sees a restarted worker within a scrape, --scrape-interval-ms 100)
HEALTHY_BEFORE_S = 1.0
PREFIXES = ["You are a careful assistant for team %d. Follow the house rules: be brief, cite "
            "sources, never guess. " % i * 6 for i in range(8)]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvrouter", required=True, help="path of the kvrouter binary")
    ap.add_argument("--duration", type=float, default=600, help="seconds of load (default 600)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the schedule and the requests")
    ap.add_argument("--out", required=True, help="folder for the summary and requests.jsonl")
    ap.add_argument("--workers", type=int, default=4, help="workers in the config (default 4)")
    ap.add_argument("--spares", type=int, default=2, help="workers only the chaos adds (default 2)")
    ap.add_argument("--concurrency", type=int, default=12, help="clients (default 12)")
    ap.add_argument("--event-interval-s", type=float, default=3.0,
                    help="mean gap between chaos events (default 3)")
    ap.add_argument("--num-gpu-blocks", type=int, default=256,
                    help="each sim's KV blocks: the router's cache index capacity (default 256)")
    ap.add_argument("-v", dest="verbose", action="store_true", help="echo child process output")
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)  # the report's first line names them
    if a.duration <= 0 or a.workers < 2 or a.spares < 0 or a.concurrency < 1:
        ap.error("need --duration > 0, --workers >= 2, --spares >= 0, --concurrency >= 1")
    return a


def log(msg):
    sys.stderr.write("[chaos %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


# ---- workers ---------------------------------------------------------------------------------------


class Worker:
    """One sim, kept on one port across kills and restarts (the router knows it by URL)."""

    def __init__(self, name, num_gpu_blocks):
        self.name = name
        self.blocks = num_gpu_blocks
        self.port = 0
        self.sim = None
        self.down_until = None  # killed: restart at this time
        self.fault_until = None  # faulted: back to "none" at this time
        # (monotonic time, healthy) at every change: healthy is the process up with no fault
        # (a restart's entry is written once it listens again)
        self.health = []
        self.start()

    def mark(self, healthy):
        self.health.append((time.monotonic(), healthy))

    def healthy_during(self, t0, t1):
        """Whether this sim was up with no fault from t0 to t1 (monotonic times)."""
        before = [ok for t, ok in self.health if t <= t0]
        return bool(before) and before[-1] and all(ok for t, ok in self.health if t0 < t <= t1)

    def start(self):
        for attempt in range(20):
            try:
                self.sim = h.Sim("--listen", "127.0.0.1:%d" % self.port, "--num-gpu-blocks",
                                 self.blocks, fixed=(TTFT_MS, ITL_MS))
                break
            except AssertionError:
                if attempt == 19:
                    raise
                time.sleep(0.25)  # the port is still held; try again
        self.port = self.sim.port
        self.url = self.sim.url
        self.down_until = None
        self.fault_until = None  # a fault lives in the process: a new one has none
        self.mark(True)

    def kill(self, until):
        self.mark(False)  # before the signal: a stream it breaks ends after this time
        self.sim.kill()
        self.down_until = until

    def fault(self, mode, until, **params):
        self.mark(False)
        self.sim.fault(mode, **params)
        self.fault_until = until

    def clear_fault(self):
        if self.sim is not None and self.sim.alive():
            self.sim.fault("none")
        self.fault_until = None
        if self.down_until is None:
            self.mark(True)

    def busy(self):
        m = self.sim.metrics()
        return (h.prom_value(m, "vllm:num_requests_running") +
                h.prom_value(m, "vllm:num_requests_waiting"))


# ---- the client pool -------------------------------------------------------------------------------


def make_request(rng, rid):
    """(body, stream, max_tokens) of one request."""
    max_tokens = rng.randint(*MAX_TOKENS)
    stream = rng.random() < 0.85
    content = rng.choice(PREFIXES) + "Question %d: %s" % (rng.randint(0, 10**6), rid)
    body = {"model": h.MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "ignore_eos": True}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body, stream, max_tokens


async def read_message(reader):
    """(status, body, complete) of one HTTP/1.1 response; complete is False when the connection
    ended before the message's framing did. Raises IncompleteReadError before the head."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    hdrs = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
    body = bytearray()
    try:
        if "chunked" in hdrs.get("transfer-encoding", "").lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    return status, bytes(body), True
                body += (await reader.readexactly(size + 2))[:-2]
        if "content-length" in hdrs:
            body += await reader.readexactly(int(hdrs["content-length"]))
            return status, bytes(body), True
        body += await reader.read()
        return status, bytes(body), True
    except asyncio.IncompleteReadError as e:
        body += e.partial
        return status, bytes(body), False
    except (ConnectionError, OSError):
        return status, bytes(body), False


def is_openai_error(obj):
    return (isinstance(obj, dict) and isinstance(obj.get("error"), dict) and
            isinstance(obj["error"].get("message"), str))


def classify_stream(body, complete, max_tokens):
    events = h.sse_events(body)
    objs = []
    for e in events:
        if e == "[DONE]":
            continue
        try:
            objs.append(json.loads(e))
        except ValueError:
            return "bad", "an SSE event that is not JSON: %r" % e[:80]
    errs = [o["error"]["message"] for o in objs if is_openai_error(o)]
    if errs:
        return "clean_error", "error event: %s" % errs[-1]
    if not complete:
        return "bad", "stream cut without an error event after %d events" % len(events)
    if not events or events[-1] != "[DONE]":
        return "bad", "stream ended without [DONE] or an error event"
    tokens = sum(1 for o in objs for c in o.get("choices") or []
                 if (c.get("delta") or {}).get("content"))
    finish = [c.get("finish_reason") for o in objs for c in o.get("choices") or []
              if c.get("finish_reason")]
    usage = [o["usage"] for o in objs if o.get("usage")]
    if not finish:
        return "bad", "[DONE] without a finish_reason"
    if tokens != max_tokens or not usage or usage[-1].get("completion_tokens") != max_tokens:
        return "bad", "%d token events, usage %s, max_tokens %d" % (tokens, usage[-1:], max_tokens)
    return "completed", ""


def classify(status, body, complete, stream, max_tokens):
    if status >= 400:
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if complete and is_openai_error(obj):
            return "clean_error", "%d %s" % (status, obj["error"].get("code") or "")
        return "bad", "%d without an OpenAI-style error body: %r" % (status, body[:120])
    if status != 200:
        return "bad", "unexpected status %d" % status
    if stream:
        return classify_stream(body, complete, max_tokens)
    try:
        obj = json.loads(body)
    except ValueError:
        return "bad", "200 JSON answer that does not parse (complete=%s)" % complete
    if not complete or (obj.get("usage") or {}).get("completion_tokens") != max_tokens:
        return "bad", "200 JSON answer with usage %s, max_tokens %d" % (obj.get("usage"),
                                                                        max_tokens)
    return "completed", ""


async def one_request(port, rng, rid, deadline_s):
    body, stream, max_tokens = make_request(rng, rid)
    payload = json.dumps(body).encode()
    t0 = time.monotonic()
    rec = {"id": rid, "kind": "stream" if stream else "json", "status": 0, "detail": "", "t0": t0}
    writer = None
    try:
        async def go():
            nonlocal writer
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nx-request-id: %s\r\n"
                         b"Content-Length: %d\r\n\r\n" % (rid.encode(), len(payload)) + payload)
            await writer.drain()
            return await read_message(reader)
        status, data, complete = await asyncio.wait_for(go(), deadline_s)
        rec["status"] = status
        rec["outcome"], rec["detail"] = classify(status, data, complete, stream, max_tokens)
    except asyncio.TimeoutError:
        rec["outcome"], rec["detail"] = "bad", "no complete answer within %.1f s" % deadline_s
    except asyncio.IncompleteReadError:
        rec["outcome"], rec["detail"] = "bad", "connection closed before a response head"
    except (ConnectionError, OSError) as e:
        rec["outcome"], rec["detail"] = "bad", "connection error: %s" % e
    finally:
        if writer is not None:
            writer.close()
    rec["t1"] = time.monotonic()
    rec["seconds"] = round(rec["t1"] - t0, 4)
    return rec


class Load:
    """The client pool on its own thread; results are appended to self.results."""

    def __init__(self, port, concurrency, seed, deadline_s):
        self.port, self.concurrency, self.seed, self.deadline_s = port, concurrency, seed, deadline_s
        self.results = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _client(self, cid):
        rng = random.Random(self.seed * 1000 + cid)
        n = 0
        while not self.stop.is_set():
            rid = "chaos-%d-%d" % (cid, n)
            n += 1
            r = await one_request(self.port, rng, rid, self.deadline_s)
            self.results.append(r)
            if r.get("status") == 503:
                # as an OpenAI SDK client: back off before the next try (the router's Retry-After
                # is 1 s; 0.25 s keeps the soak busy), instead of spinning on 503s while no worker
                # is usable
                await asyncio.sleep(0.25)

    async def _main(self):
        await asyncio.gather(*(self._client(i) for i in range(self.concurrency)))

    def start(self):
        self.thread.start()

    def finish(self):
        """Stops sending; returns once every client's last request ended (bounded by its
        deadline)."""
        self.stop.set()
        self.thread.join(self.deadline_s + 10)
        return not self.thread.is_alive()


# ---- the router and its config ---------------------------------------------------------------------


class Chaos:
    def __init__(self, args, tmp):
        self.args = args
        self.rng = random.Random(args.seed)
        self.counts = {k: 0 for k in ("kills", "restarts", "hangs", "refusals", "disconnects",
                                      "switches", "adds", "drains", "reloads", "bad_reloads")}
        self.workers = [Worker("w%d" % i, args.num_gpu_blocks) for i in range(args.workers)]
        self.spares = [Worker("s%d" % i, args.num_gpu_blocks) for i in range(args.spares)]
        self.listed_spare = None  # the spare the config file lists, if any
        self.policy = "kv_aware"
        self.idle_ms = IDLE_MS[1]
        self.log_level = "info"  # the harness reads the router's "listening" line at info
        self.members = []  # poll_members()
        self.config = os.path.join(tmp, "router.json")
        self.write_config()
        self.router = h.Router([], "--config", self.config, *h.FAST)

    def everyone(self):
        return self.workers + self.spares

    def poll_members(self):
        """Appends (monotonic time, {url: state}) of the router's workers (GET /admin/workers)."""
        t = time.monotonic()
        self.members.append((t, {w["url"]: w["state"] for w in self.router.workers()}))

    def members_during(self, t0, t1):
        """The polls that tell which workers the router had from t0 to t1: the last one before t0
        and every one up to t1."""
        before = [m for m in self.members if m[0] <= t0][-1:]
        return before + [m for m in self.members if t0 < m[0] <= t1]

    def healthy_remained(self, t0, t1):
        """(names of the sims up and unfaulted from HEALTHY_BEFORE_S before t0 to t1 that the
        router listed, not draining, at every poll from t0 to t1; the router's state of each at the
        last poll)."""
        polls = self.members_during(t0, t1)
        if not polls:
            return [], {}
        names = [w.name for w in self.everyone()
                 if w.healthy_during(t0 - HEALTHY_BEFORE_S, t1) and
                 all(w.url in m and m[w.url] != "draining" for _, m in polls)]
        last = polls[-1][1]
        return names, {w.name: last.get(w.url) for w in self.everyone() if w.name in names}

    def write_config(self, broken=False):
        urls = [w.url for w in self.workers]
        if self.listed_spare is not None:
            urls.append(self.listed_spare.url)
        cfg = {"workers": urls, "policy": self.policy,
               "timeouts": {"first_byte_ms": FIRST_BYTE_MS, "idle_ms": self.idle_ms,
                            "connect_ms": 500},
               "health": {"fail_threshold": 2}, "access_log": False,
               "log_level": self.log_level}
        text = json.dumps(cfg, indent=1)
        if broken:
            text = text.replace('"policy"', '"policy" "', 1)  # a JSON syntax error
        tmp = self.config + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.config)

    def admin(self, method, path, body=None):
        return h.request(self.router.admin_port, method, path, body, timeout=10)

    def reloads(self):
        m = h.parse_prom_samples(self.router.metrics_text())
        return (h.prom_value(m, "kvrouter_config_reloads_total", result="success"),
                h.prom_value(m, "kvrouter_config_reloads_total", result="failure"))

    def resumes(self):
        """The router's kvrouter_stream_resumes_total by result (issue 36: streams broken after
        their client got tokens, continued on another worker or not), {} when it has none."""
        m = h.parse_prom_samples(self.router.metrics_text())
        return {dict(labels).get("result"): int(v) for (name, labels), v in m.items()
                if name == "kvrouter_stream_resumes_total"}

    # -- the events --

    def ev_kill(self, now):
        live = [w for w in self.workers if w.down_until is None]
        if len(live) <= 1:
            return
        w = self.rng.choice(live)
        w.kill(now + self.rng.uniform(1, 4))
        self.counts["kills"] += 1
        log("SIGKILL %s (port %d)" % (w.name, w.port))

    def ev_fault(self, now, mode):
        live = [w for w in self.everyone() if w.down_until is None and w.fault_until is None]
        if not live:
            return
        w = self.rng.choice(live)
        params = {"after_tokens": self.rng.randint(0, 20)} if mode == "disconnect" else {}
        w.fault(mode, now + self.rng.uniform(1, 5), **params)
        self.counts[{"hang": "hangs", "refuse": "refusals", "disconnect": "disconnects"}[mode]] += 1
        log("fault %s on %s" % (mode, w.name))

    def ev_switch(self, now):
        name = self.rng.choice(POLICIES)
        r = self.admin("PUT", "/admin/policy", {"policy": name})
        assert r.status == 200, "PUT /admin/policy %s: %d %s" % (name, r.status, r.body[:200])
        self.counts["switches"] += 1
        log("policy -> %s" % name)

    def ev_add(self, now):
        served = {w["url"] for w in self.router.workers() if w["state"] != "draining"}
        cands = [s for s in self.spares if s.url not in served]
        if not cands:
            return
        s = self.rng.choice(cands)
        r = self.admin("POST", "/admin/workers", {"url": s.url})
        assert r.status == 201, "POST /admin/workers: %d %s" % (r.status, r.body[:200])
        self.counts["adds"] += 1
        log("added %s" % s.name)

    def ev_drain(self, now):
        ws = [w for w in self.router.workers() if w["state"] != "draining"]
        if len(ws) <= 2:
            return
        w = self.rng.choice(ws)
        r = self.admin("DELETE", "/admin/workers/%d" % w["id"])
        assert r.status == 202, "DELETE /admin/workers/%d: %d %s" % (w["id"], r.status,
                                                                     r.body[:200])
        self.counts["drains"] += 1
        log("drained worker %d (%s)" % (w["id"], w["url"]))

    def ev_reload(self, now, broken=False):
        before = self.reloads()
        if not broken:
            self.policy = self.rng.choice(POLICIES)
            self.idle_ms = self.rng.randint(*IDLE_MS)
            self.log_level = self.rng.choice(["info", "warn"])
            self.listed_spare = self.rng.choice(self.spares + [None]) if self.spares else None
        self.write_config(broken=broken)
        self.router.signal(signal.SIGHUP)
        want = (before[0], before[1] + 1) if broken else (before[0] + 1, before[1])
        h.wait_for(lambda: self.reloads() == want, 3.0, "reload counted %s" % (want,))
        assert self.router.alive(), "the router died at SIGHUP"
        if broken:
            self.counts["bad_reloads"] += 1
            self.write_config()  # the good file back, for the next reload
        else:
            self.counts["reloads"] += 1
            pol = self.admin("GET", "/admin/policy").json()
            assert pol["policy"] == self.policy, (pol["policy"], self.policy)
        log("SIGHUP (%s)" % ("broken file" if broken else "policy %s, idle %d ms, log %s, spare %s"
                             % (self.policy, self.idle_ms, self.log_level,
                                self.listed_spare and self.listed_spare.name)))

    def restore(self, now):
        """Restarts killed workers and clears faults whose time came."""
        for w in self.everyone():
            if w.down_until is not None and now >= w.down_until:
                w.start()
                self.counts["restarts"] += 1
                log("restarted %s on port %d" % (w.name, w.port))
            if w.fault_until is not None and now >= w.fault_until:
                w.clear_fault()

    def event(self, now):
        kinds = [("kill", 3), ("hang", 2), ("refuse", 2), ("disconnect", 1), ("switch", 2),
                 ("add", 1), ("drain", 1), ("reload", 2), ("bad_reload", 1)]
        kind = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        if kind == "kill":
            self.ev_kill(now)
        elif kind in ("hang", "refuse", "disconnect"):
            self.ev_fault(now, kind)
        elif kind == "switch":
            self.ev_switch(now)
        elif kind == "add":
            self.ev_add(now)
        elif kind == "drain":
            self.ev_drain(now)
        else:
            self.ev_reload(now, broken=kind == "bad_reload")

    def heal(self):
        for w in self.everyone():
            if w.down_until is not None:
                w.start()
                self.counts["restarts"] += 1
            if w.fault_until is not None:
                w.clear_fault()

    def stop_all(self):
        problems = []
        p = self.router.stop(timeout=5)
        if p:
            problems.append("router: %s" % p)
        for w in self.everyone():
            if w.sim is not None:
                p = w.sim.stop()
                if p:
                    problems.append("%s: %s" % (w.name, p))
        return problems


# ---- the run ---------------------------------------------------------------------------------------


def rss_mib(proc):
    return proc.rss_kib() / 1024.0


def run(args):
    h.set_kvrouter(args.kvrouter)
    h.VERBOSE = args.verbose
    os.makedirs(args.out, exist_ok=True)
    failures = []
    tmp = tempfile.mkdtemp(prefix="kvr-chaos-")
    chaos = Chaos(args, tmp)
    deadline_s = (FIRST_BYTE_MS + IDLE_MS[1] + TTFT_MS + ITL_MS * MAX_TOKENS[1]) / 1000.0 + 5
    load = Load(chaos.router.port, args.concurrency, args.seed, deadline_s)
    rss = []
    try:
        t0 = time.monotonic()
        load.start()
        next_event = t0 + chaos.rng.expovariate(1.0 / args.event_interval_s)
        next_rss = next_poll = t0
        while True:
            now = time.monotonic()
            if now - t0 >= args.duration:
                break
            if not chaos.router.alive():
                failures.append("the router exited (status %s) at %.0f s" % (
                    chaos.router.p.poll(), now - t0))
                break
            chaos.restore(now)
            if now >= next_event:
                chaos.event(now)
                next_event = now + chaos.rng.expovariate(1.0 / args.event_interval_s)
            if now >= next_poll:
                chaos.poll_members()
                next_poll = now + 0.25
            if now >= next_rss:
                rss.append((round(now - t0, 1), round(rss_mib(chaos.router), 2)))
                next_rss = now + max(1.0, args.duration / 200.0)
            time.sleep(0.05)
        rss.append((round(time.monotonic() - t0, 1), round(rss_mib(chaos.router), 2)))
        if not load.finish():
            failures.append("clients still running %.0f s after the load stopped" % deadline_s)
        chaos.poll_members()
        chaos.heal()
        try:
            h.wait_for(lambda: all(w["in_flight"] == 0 for w in chaos.router.workers()), 5.0,
                       "every worker's in-flight at 0")
            h.wait_for(lambda: all(w.busy() == 0 for w in chaos.everyone()), 5.0,
                       "every sim idle")
        except AssertionError as e:
            failures.append(str(e))
        final_workers = chaos.router.workers()
        reloads = chaos.reloads()
        chaos.resume_counts = chaos.resumes()
    except Exception as e:
        failures.append("%s: %s" % (type(e).__name__, e))
        load.stop.set()
        final_workers, reloads = [], (None, None)
    finally:
        failures += chaos.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return summarize(args, chaos, load.results, rss, final_workers, reloads, failures, deadline_s,
                     t0)


def rss_growth(rss, duration):
    """(reference point, its MiB, last MiB, growth %): the reference is the sample at 600 s, or at
    10% of the run for runs under 660 s."""
    if len(rss) < 2:
        return None
    at = 600.0 if duration >= 660 else 0.1 * duration
    ref = min(rss, key=lambda p: abs(p[0] - at))
    last = rss[-1]
    return {"ref_s": ref[0], "ref_mib": ref[1], "last_s": last[0], "last_mib": last[1],
            "growth_pct": round(100.0 * (last[1] - ref[1]) / ref[1], 2)}


# What an error event at a stream's end says (src/serve/proxy.c broken_stream(): why the stream
# broke, then why it was not continued), as the kinds of kvrouter_stream_resumes_total.
END_KINDS = [("no other worker could continue the answer", "no_worker"),
             ("--resume-max", "refused"),
             ("not continued: a tool call's arguments were streaming", "tool_call"),
             ("not continued:", "not_resumable")]


def end_kind(detail):
    """The kind of a stream's error event (detail "error event: MESSAGE"), or None."""
    if not detail.startswith("error event: "):
        return None
    return next((k for text, k in END_KINDS if text in detail), "other")


def error_ends(chaos, results, t_base):
    """Every stream that ended with an error event, by kind, split by whether a healthy worker
    (healthy_remained()) existed from the request's start to its end; the ones where one did,
    with the router's state of those workers. A break inside a tool call's arguments is the one
    kind issue 36 allows while a healthy worker remains (the soak sends no tool calls). Requests
    answered with an HTTP error instead (no byte of an answer sent) are split the same way, by
    status and code: reported, not asserted."""
    counts, http, violations = {}, {}, []
    for r in results:
        if r["outcome"] != "clean_error":
            continue
        kind = end_kind(r["detail"])
        names, states = chaos.healthy_remained(r["t0"], r["t1"])
        c = (counts.setdefault(kind, {"healthy_worker_remained": 0, "no_healthy_worker": 0})
             if kind else http.setdefault(r["detail"], {"healthy_worker_remained": 0,
                                                         "no_healthy_worker": 0}))
        c["healthy_worker_remained" if names else "no_healthy_worker"] += 1
        if names and kind is not None and kind != "tool_call":
            violations.append({"id": r["id"], "kind": kind, "detail": r["detail"],
                               "t0_s": round(r["t0"] - t_base, 2),
                               "t1_s": round(r["t1"] - t_base, 2), "healthy": states})
    return counts, http, violations


def pct(results, p):
    return round(h.percentile([r["seconds"] for r in results], p), 3) if results else None


def summarize(args, chaos, results, rss, final_workers, reloads, failures, deadline_s, t_base):
    by = {"completed": 0, "clean_error": 0, "bad": 0}
    for r in results:
        by[r["outcome"]] += 1
    bad = [r for r in results if r["outcome"] == "bad"]
    if bad:
        failures.append("%d bad outcomes, e.g. %s" % (len(bad), bad[:3]))
    inflight = {str(w["id"]): w["in_flight"] for w in final_workers}
    if any(v != 0 for v in inflight.values()):
        failures.append("in-flight not 0 at the end: %s" % inflight)
    growth = rss_growth(rss, args.duration)
    # Under ASan the freed memory sits in its quarantine (256 MiB by default) and shadow memory
    # grows with it: RSS says nothing about leaks there (LeakSanitizer at exit does).
    rss_asserted = not h.sanitized()
    if rss_asserted and (growth is None or growth["growth_pct"] >= 5.0):
        failures.append("router RSS growth %s (limit 5%%)" % growth)
    if reloads[0] is not None and reloads != (chaos.counts["reloads"],
                                              chaos.counts["bad_reloads"]):
        failures.append("router counted reloads %s, the soak sent %d good and %d broken" % (
            reloads, chaos.counts["reloads"], chaos.counts["bad_reloads"]))
    if by["completed"] == 0:
        failures.append("no request completed")
    ends, http_ends, violations = error_ends(chaos, results, t_base)
    if violations:
        failures.append("%d streams ended with an error event while a healthy worker remained, "
                        "e.g. %s" % (len(violations), violations[:3]))
    summary = {
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "kvrouter": args.kvrouter, "duration_s": args.duration, "seed": args.seed,
        "workers": args.workers, "spares": args.spares, "concurrency": args.concurrency,
        "client_deadline_s": deadline_s,
        "request_seconds": {"p50": pct(results, 50), "p99": pct(results, 99),
                            "max": max((r["seconds"] for r in results), default=None)},
        "requests": len(results), "completed": by["completed"], "clean_errors": by["clean_error"],
        "bad_outcomes": by["bad"], "bad_examples": bad[:20],
        "chaos": chaos.counts,
        "router_reloads_counted": {"success": reloads[0], "failure": reloads[1]},
        "stream_resumes": getattr(chaos, "resume_counts", {}),
        "error_event_ends": ends, "error_event_ends_with_healthy_worker": violations[:20],
        "http_error_ends": http_ends,
        "final_in_flight": inflight,
        "rss_mib": rss, "rss_growth": growth, "rss_asserted": rss_asserted,
        "ok": not failures, "failures": failures,
    }
    with open(os.path.join(args.out, "chaos_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(args.out, "requests.jsonl"), "w") as f:
        for r in results:
            rel = dict(r, t0=round(r["t0"] - t_base, 4), t1=round(r.get("t1", r["t0"]) - t_base, 4))
            f.write(json.dumps(rel) + "\n")
    write_markdown(os.path.join(args.out, "REPORT.md"), summary,
                   command(["python3", os.path.abspath(__file__)] + args.argv))
    return summary


def write_markdown(path, s, cmd):
    c = s["chaos"]
    g = s["rss_growth"] or {}
    lines = [
        first_line(cmd), "",
        "# Chaos soak: %s" % ("PASS" if s["ok"] else "FAIL"), "",
        "`%s`" % s["command"], "",
        "%.0f s, %d workers + %d spares, %d clients, seed %d, client deadline %.1f s." % (
            s["duration_s"], s["workers"], s["spares"], s["concurrency"], s["seed"],
            s["client_deadline_s"]), "",
        "| requests | completed | clean errors | bad outcomes |", "|---:|---:|---:|---:|",
        "| %d | %d | %d | %d |" % (s["requests"], s["completed"], s["clean_errors"],
                                  s["bad_outcomes"]), "",
        "Request seconds: p50 %s, p99 %s, max %s (deadline %.1f s)." % (
            s["request_seconds"]["p50"], s["request_seconds"]["p99"], s["request_seconds"]["max"],
            s["client_deadline_s"]), "",
        "| kills | restarts | hangs | refusals | disconnects | switches | adds | drains | reloads "
        "| broken reloads |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |" % (
            c["kills"], c["restarts"], c["hangs"], c["refusals"], c["disconnects"],
            c["switches"], c["adds"], c["drains"], c["reloads"], c["bad_reloads"]), "",
        "Router RSS: %s MiB at %s s, %s MiB at %s s: growth %s%% (%s)." % (
            g.get("ref_mib"), g.get("ref_s"), g.get("last_mib"), g.get("last_s"),
            g.get("growth_pct"), "limit 5%" if s["rss_asserted"] else
            "not asserted: sanitizer build"),
        "RSS samples (s, MiB): %s" % ", ".join("%s: %s" % p for p in s["rss_mib"][::max(
            1, len(s["rss_mib"]) // 12)]), "",
        "Final in-flight per worker: %s" % s["final_in_flight"], "",
        "Streams broken after their client got tokens (kvrouter_stream_resumes_total): %s; a "
        "resumed stream counts as completed only when its token events and usage add up to "
        "max_tokens." % (", ".join("%s %d" % kv for kv in sorted(s["stream_resumes"].items()))
                         or "none"), "",
        "Streams that ended with an error event, by what it says (the client's view), and whether "
        "a healthy worker remained: a sim up with no fault from 1 s before the request's start to "
        "its end, "
        "listed by the router and not draining at every GET /admin/workers poll (4 a second) of "
        "that time. Asserted: none where one remained, but for a break inside a tool call.", "",
        "| error event | healthy worker remained | no healthy worker |", "|---|---:|---:|",
    ] + ["| %s | %d | %d |" % (k, v["healthy_worker_remained"], v["no_healthy_worker"])
         for k, v in sorted(s["error_event_ends"].items())] + (
        [] if s["error_event_ends"] else ["| none | 0 | 0 |"]) + [
        "", "Requests answered with an HTTP error before any byte of an answer (no stream to "
        "continue; reported, not asserted), split the same way:", "",
        "| status | healthy worker remained | no healthy worker |", "|---|---:|---:|",
    ] + ["| %s | %d | %d |" % (k, v["healthy_worker_remained"], v["no_healthy_worker"])
         for k, v in sorted(s["http_error_ends"].items())] + [""]
    if s["failures"]:
        lines += ["## Failures", ""] + ["- %s" % f for f in s["failures"]]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    args = parse_args(argv)
    s = run(args)
    print("chaos soak %s: %d requests, %d completed, %d clean errors, %d bad; %s; streams %s; RSS "
          "growth %s%%"
          % ("PASS" if s["ok"] else "FAIL", s["requests"], s["completed"], s["clean_errors"],
             s["bad_outcomes"], ", ".join("%s %d" % kv for kv in s["chaos"].items()),
             ", ".join("%s %d" % kv for kv in sorted(s["stream_resumes"].items())) or "none",
             (s["rss_growth"] or {}).get("growth_pct")))
    for f in s["failures"]:
        print("  failure: %s" % f)
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
