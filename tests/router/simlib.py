"""simlib -- start and stop `kvrouter sim` processes for tests and benchmarks (loopback only).

Usage:

    from simlib import start_sim
    sim = start_sim("/path/to/kvrouter", "--time-scale", "10")   # listens on 127.0.0.1:<free port>
    print(sim.port, sim.url)                                    # 43512 http://127.0.0.1:43512
    status, headers, body = sim.request("GET", "/health")
    events = sim.stream_chat([{"role": "user", "content": "hi"}], max_tokens=8)
    sim.stop()                                                  # SIGTERM by PID, returns exit status

start_sim() passes `--listen 127.0.0.1:0` unless the arguments contain --listen, reads the port
from the `sim listening on HOST:PORT` line the process prints on stderr, then waits until
GET /health answers 200. The process's stderr is collected in Proc.stderr_lines (a thread drains
it so the pipe never fills). Processes are killed by PID only; Proc is also a context manager whose
exit stops the process and raises if it exited non-zero (crash or sanitizer report).
"""

import asyncio
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time

__all__ = ["Proc", "start_sim", "sse_events", "astream"]

_LISTEN_RE = re.compile(r"sim listening on (\S+):(\d+)")


class Proc:
    """A running `kvrouter sim`: .popen, .pid, .host, .port, .url, .stderr_lines."""

    def __init__(self, popen, host, port):
        self.popen = popen
        self.pid = popen.pid
        self.host = host
        self.port = port
        self.url = "http://%s:%d" % (host, port)
        self.stderr_lines = []

    def request(self, method, path, body=None, headers=None, timeout=10):
        """One HTTP request on a fresh connection; returns (status, headers dict, body bytes).
        body may be bytes, str, or a JSON-serialisable object."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            hdrs = {"Content-Type": "application/json"} if body is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def post_json(self, path, obj, timeout=30):
        """POST obj as JSON; returns (status, parsed JSON body or None)."""
        status, _, data = self.request("POST", path, obj, timeout=timeout)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, None

    def stream_chat(self, messages, timeout=60, **fields):
        """Streams a chat completion; returns sse_events() of the response."""
        body = dict(fields, messages=messages, stream=True)
        return sse_events(self, "/v1/chat/completions", body, timeout=timeout)

    def metrics(self):
        """GET /metrics parsed into {sample name with labels: value} (no validation)."""
        _, _, data = self.request("GET", "/metrics")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def metric(self, name):
        """The value of the first sample of a family, labels ignored (e.g. vllm:num_requests_running)."""
        for key, value in self.metrics().items():
            if key == name or key.startswith(name + "{"):
                return value
        raise KeyError(name)

    def set_fault(self, mode, **params):
        """POST /sim/fault {"mode": mode, **params}; returns the server's view of the fault."""
        status, obj = self.post_json("/sim/fault", dict(params, mode=mode))
        if status != 200:
            raise RuntimeError("set_fault(%s): HTTP %d %r" % (mode, status, obj))
        return obj

    def stop(self, timeout=10):
        """SIGTERM, wait; SIGKILL if it does not exit in time. Returns the exit status."""
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait()
        return self.popen.returncode

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        """Stops the process; raises RuntimeError if it exited non-zero (a crash, or a sanitizer
        report at exit) unless an exception is already propagating."""
        rc = self.stop()
        if rc != 0 and exc_type is None:
            raise RuntimeError("kvrouter sim exited with %r:\n%s" % (rc, "\n".join(self.stderr_lines)))


def start_sim(kvrouter, *args, timeout=10):
    """Starts `kvrouter sim *args` on 127.0.0.1 with a free port; returns a Proc once /health is OK.
    Raises RuntimeError (after killing the process) if it exits or does not come up in time."""
    argv = [kvrouter, "sim"] + [str(a) for a in args]
    if "--listen" not in argv and not any(a.startswith("--listen=") for a in argv):
        argv += ["--listen", "127.0.0.1:0"]
    popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    lines = []
    found = threading.Event()
    where = {}

    def drain():
        for line in popen.stderr:
            lines.append(line.rstrip("\n"))
            m = _LISTEN_RE.search(line)
            if m and not found.is_set():
                where["host"], where["port"] = m.group(1), int(m.group(2))
                found.set()
        found.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + timeout
    if not found.wait(timeout) or "port" not in where:
        if popen.poll() is None:
            os.kill(popen.pid, signal.SIGKILL)
        popen.wait()
        raise RuntimeError("kvrouter sim did not start: %s" % "\n".join(lines))
    proc = Proc(popen, where["host"], where["port"])
    proc.stderr_lines = lines
    while time.monotonic() < deadline:
        try:
            if proc.request("GET", "/health", timeout=1)[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.02)
    proc.stop()
    raise RuntimeError("kvrouter sim did not answer /health: %s" % "\n".join(lines))


def sse_events(proc, path, body, timeout=60):
    """POSTs body and reads the SSE response. Returns a dict:
    status, headers, raw (all body bytes), events (list of (monotonic time, data string)),
    t0 (send time), done (saw [DONE]), truncated (connection ended without a clean end)."""
    conn = http.client.HTTPConnection(proc.host, proc.port, timeout=timeout)
    out = {"events": [], "raw": b"", "done": False, "truncated": False}
    try:
        out["t0"] = time.monotonic()
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        out["headers"] = {k.lower(): v for k, v in resp.getheaders()}
        buf = b""
        while True:
            try:
                chunk = resp.read1(65536)
            except (http.client.IncompleteRead, ConnectionError):
                out["truncated"] = True
                break
            if not chunk:
                break
            now = time.monotonic()
            out["raw"] += chunk
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                data = event.decode()
                if data.startswith("data: "):
                    data = data[6:]
                out["events"].append((now, data))
                if data == "[DONE]":
                    out["done"] = True
    finally:
        conn.close()
    return out


async def astream(host, port, path, body, timeout=120):
    """asyncio client for many concurrent streams from one thread (precise timestamps, low
    overhead). POSTs body (stream=True expected) and returns a dict: t0 (send time), times
    (monotonic arrival time of each SSE event that carries a token, i.e. every data event before
    the usage chunk and [DONE]), status, done (saw [DONE]), nbytes."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    payload = json.dumps(body).encode()
    out = {"times": [], "done": False, "nbytes": 0, "status": 0}
    try:
        out["t0"] = time.monotonic()
        writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (path.encode(), host.encode(), len(payload))
                     + payload)
        buf = b""
        head_done = False
        seen = 0
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), timeout)
            if not chunk:
                break
            now = time.monotonic()
            buf += chunk
            out["nbytes"] += len(chunk)
            if not head_done:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    continue
                out["status"] = int(buf.split(b" ", 2)[1])
                buf = buf[end + 4:]
                head_done = True
            # count complete token events; keep the unfinished tail for the next read
            events = buf.split(b"\n\n")
            buf = events.pop()
            for ev in events:
                i = ev.find(b"data: ")
                if i < 0:
                    continue
                data = ev[i + 6:]
                if data == b"[DONE]":
                    out["done"] = True
                elif b'"choices":[]' not in data:
                    out["times"].append(now)
                seen += 1
            if out["done"]:
                break
    finally:
        writer.close()
    return out
