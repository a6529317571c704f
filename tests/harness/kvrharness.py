"""kvrharness -- the one harness of kvrouter's integration tests and bench scripts (loopback only).

Processes: Proc runs a child with its stdout and stderr drained line by line by two threads (a
pipe never fills, a line can be waited for); Sim is `kvrouter sim` and Router is `kvrouter serve`,
each on 127.0.0.1 with ports the kernel picks (read from the process's "listening" line). Every
process is signalled by its PID only. Proc.stop() is the one way to end one: SIGTERM, a second
SIGTERM (the router then aborts what is still in flight), SIGKILL as a last resort; it reports an
exit status other than 0 and any sanitizer report (ASan, LSan, UBSan, a leaked libuv handle) found
in stderr.
Proc, Sim and Router are context managers (exit = stop, failing on such a report), and Cleanup
stops every process a test started, last first, and fails the test on a report.

HTTP: a raw HTTP/1.1 client over sockets (Conn, Response, request(), build_request()), so framing,
pipelining, truncation and the arrival time of each body chunk are visible; SSE helpers
(sse_events(), sse_event_times(), token_events()); astream(), an asyncio client for many concurrent
streams from one thread; Prometheus text helpers (parse_prom_samples(), prom_value()).

Figures: percentile(), the one percentile of tests and scripts: numpy's default ("linear"): with
the n values sorted, h = (n - 1) p / 100 and the result x[floor h] + (h - floor h) (x[floor h + 1]
- x[floor h]).

Runner: registry() gives a test file its list and @test(timeout=S) decorator; run() parses
--kvrouter/-k/-v, runs each test under a SIGALRM deadline (a hung process fails its test instead of
hanging the suite), prints one PASS/FAIL line per test and "N passed, M failed", and returns the
exit status.

Use from a test (tests/router/test_*.py) or a script (bench/scripts/*/*.py):

    sys.path.insert(0, os.path.join(<repo>, "tests", "harness"))
    import kvrharness as h
    h.set_kvrouter("build/kvrouter")           # run() does this from --kvrouter
    with h.Cleanup() as c:
        sim = c.add(h.Sim(fixed=None))       # the engine; fixed=(ttft_ms, itl_ms) bypasses it
        r = c.add(h.Router([sim]))
        resp = h.request(r.port, "POST", "/v1/chat/completions", h.chat_body(stream=True))

Only the Python standard library is used. Every socket operation has a timeout.
"""
import argparse
import contextlib
import asyncio
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KVROUTER = None  # absolute path of the binary under test: set_kvrouter() or run()
MODEL = "meta-llama/Llama-3.3-70B-Instruct"  # the sim's default served model name
VERBOSE = False  # echo child output to stderr (run() -v)

# Flags of a router that notices failures quickly (tests must stay short).
FAST = ["--scrape-interval-ms", "100", "--connect-timeout-ms", "500"]

# Lines a sanitizer or the loop's handle check print; any of them in stderr fails the process.
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "handles still open")


def set_kvrouter(path):
    """Sets the binary every Sim and Router runs; returns its absolute path. Raises ValueError when
    it is not an executable file."""
    global KVROUTER
    path = os.path.abspath(path)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ValueError("not an executable: %s" % path)
    KVROUTER = path
    return path


def _kvrouter():
    if KVROUTER is None:
        raise RuntimeError("kvrharness: call set_kvrouter() (or run()) first")
    return KVROUTER


# ---- figures -----------------------------------------------------------------------------------


def percentile(values, p):
    """The p-th percentile (0 <= p <= 100) of values, as numpy.percentile's default (linear
    interpolation between the closest ranks); NaN when values is empty."""
    if not 0 <= p <= 100:
        raise ValueError("percentile %r outside 0..100" % (p,))
    v = sorted(values)
    if not v:
        return float("nan")
    h = (len(v) - 1) * p / 100.0
    lo = int(math.floor(h))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (h - lo) * (v[hi] - v[lo])


def read_stamp(path):
    """The key=value lines of a benchmark stamp file (bench/scripts/ab/ab.sh,
    bench/scripts/accuracy/accuracy.sh) as a dict;
    lines without "=" are skipped."""
    stamp = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                stamp[k] = v
    return stamp


def write_report(path, lines):
    """Joins lines with newlines, writes them to path and prints them (the report scripts' end)."""
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text)
    print(text)


# ---- processes ---------------------------------------------------------------------------------


class Proc:
    """A child process (argv, started at once) whose stdout and stderr are collected line by line
    by two reader threads. Attributes: name, argv, pid, p (the Popen)."""

    def __init__(self, argv, name, env=None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.lines = {"stdout": [], "stderr": []}
        self.cond = threading.Condition()
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self.p = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=full_env)
        self.pid = self.p.pid
        self.threads = []
        for stream in ("stdout", "stderr"):
            t = threading.Thread(target=self._reader, args=(stream,), daemon=True)
            t.start()
            self.threads.append(t)

    def _reader(self, stream):
        f = getattr(self.p, stream)
        for raw in iter(f.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if VERBOSE:
                sys.stderr.write("    [%s %s] %s\n" % (self.name, stream, line))
            with self.cond:
                self.lines[stream].append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, regex, timeout=5.0, stream="stderr", start=0):
        """Waits for a line matching regex (from line index start); returns the match or raises
        AssertionError (with the stderr tail) on timeout or when the process exits first."""
        rx = re.compile(regex)
        deadline = time.monotonic() + timeout
        with self.cond:
            i = start
            while True:
                lines = self.lines[stream]
                while i < len(lines):
                    m = rx.search(lines[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and i >= len(lines)):
                    break
                self.cond.wait(min(left, 0.05))
        raise AssertionError("%s: no line matching %r within %.1fs (exit %s); stderr tail:\n%s" % (
            self.name, regex, timeout, self.p.poll(), "\n".join(self.lines["stderr"][-15:])))

    def stderr_lines(self):
        with self.cond:
            return list(self.lines["stderr"])

    def stderr_text(self):
        return "\n".join(self.stderr_lines())

    def stdout_text(self):
        with self.cond:
            return "\n".join(self.lines["stdout"])

    def rss_kib(self):
        """Resident set size in KiB from /proc/PID/status (VmRSS)."""
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS for pid %d" % self.pid)

    def cpu_seconds(self):
        """utime + stime in seconds, from /proc/PID/stat (fields 14 and 15)."""
        with open("/proc/%d/stat" % self.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self):
        return self.p.poll() is None

    def signal(self, sig):
        """Sends sig to this process's PID if it still runs."""
        if self.alive():
            os.kill(self.pid, sig)

    def wait(self, timeout):
        """Waits for exit; returns the exit code, or None on timeout."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        for t in self.threads:
            t.join(1.0)
        return rc

    def kill(self):
        """SIGKILL by PID if still running, reap, close the pipes. No checks: see stop()."""
        if self.p.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for t in self.threads:
            t.join(1.0)
        for f in (self.p.stdout, self.p.stderr):
            try:
                f.close()
            except OSError:
                pass

    def sanitizer_report(self):
        """The first sanitizer report (or leaked-handle message) in stderr with up to 600
        characters after it, or None."""
        text = self.stderr_text()
        for marker in SANITIZER_MARKERS:
            i = text.find(marker)
            if i >= 0:
                return text[max(0, text.rfind("\n", 0, i)):i + 600].strip()
        return None

    def stop(self, timeout=3.0):
        """Graceful stop: SIGTERM, and after timeout s a second SIGTERM (the router aborts what is
        still in flight), then SIGKILL as a last resort. Returns a description of what went wrong,
        or None: no exit within 2 x timeout, an exit status other than 0 (the process was already
        gone counts too), or a sanitizer report in stderr."""
        problems = []
        if self.alive():
            self.signal(signal.SIGTERM)
            rc = self.wait(timeout)
            if rc is None:
                self.signal(signal.SIGTERM)
                rc = self.wait(timeout)
            if rc is None:
                problems.append("did not exit within %.0f s of SIGTERM" % (2 * timeout))
            elif rc != 0:
                problems.append("exit status %d after SIGTERM" % rc)
        else:
            rc = self.p.returncode
            if rc != 0:
                problems.append("had exited with status %s" % rc)
        self.kill()
        report = self.sanitizer_report()
        if report:
            problems.append(report)
        return "; ".join(problems) or None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        problem = self.stop()
        if problem and exc_type is None:
            raise AssertionError("%s pid %d: %s" % (self.name, self.pid, problem))
        return False


class Sim(Proc):
    """`kvrouter sim` on 127.0.0.1 (port, url, host), with a second (admin) listener unless
    admin=False: it serves the same API and stays reachable during the refuse fault, so fault() and
    metrics() go through it. fixed=(ttft_ms, itl_ms) bypasses the engine (the tests' default: exact,
    load-independent timing); fixed=None runs the simulated engine. details=True passes vLLM's
    --enable-prompt-tokens-details (usage carries cached_tokens), as an operator who wants
    per-request cached figures starts vLLM; details=False is vLLM's default. Extra flags are
    appended."""

    def __init__(self, *flags, fixed=(20, 5), admin=True, log_level="warn", env=None,
                 details=True):
        argv = [_kvrouter(), "sim", "--listen", "127.0.0.1:0"]
        if details:
            argv += ["--enable-prompt-tokens-details"]
        if admin:
            argv += ["--admin-listen", "127.0.0.1:0"]
        if log_level:
            argv += ["--log-level", log_level]
        if fixed is not None:
            argv += ["--fixed-ttft-ms", str(fixed[0]), "--fixed-itl-ms", str(fixed[1])]
        argv += [str(f) for f in flags]
        super().__init__(argv, "sim", env=env)
        try:
            m = self.wait_line(r"sim listening on [0-9.]+:(\d+)(?: \(admin port (\d+)\))?",
                               timeout=10.0)
        except BaseException:
            self.kill()
            raise
        self.host = "127.0.0.1"
        self.port = int(m.group(1))
        self.admin_port = int(m.group(2)) if m.group(2) else self.port
        self.url = "http://127.0.0.1:%d" % self.port

    def request(self, method, path, body=None, headers=None, timeout=10.0):
        """One request to the main listener on a fresh connection; returns the Response."""
        return request(self.port, method, path, body, headers, timeout=timeout)

    def post_json(self, path, obj, timeout=30.0):
        """POSTs obj as JSON to the main listener; returns (status, parsed body or None)."""
        r = self.request("POST", path, obj, timeout=timeout)
        try:
            return r.status, r.json()
        except ValueError:
            return r.status, None

    def fault(self, mode, **params):
        """Switches the fault mode (POST /sim/fault {"mode": mode, **params}) through the admin
        listener; returns the sim's view of the fault. Raises AssertionError unless 200."""
        r = request(self.admin_port, "POST", "/sim/fault", dict(params, mode=mode))
        assert r.status == 200, "sim fault %s: %d %s" % (mode, r.status, r.body[:200])
        return r.json()

    def metrics(self):
        """GET /metrics (admin listener) parsed by parse_prom_samples()."""
        r = request(self.admin_port, "GET", "/metrics")
        assert r.status == 200, r.status
        return parse_prom_samples(r.text())

    def metric(self, name, **labels):
        """The sum of the samples of name whose labels include the given ones."""
        return prom_value(self.metrics(), name, **labels)


class Router(Proc):
    """`kvrouter serve` with its public and admin listeners on ephemeral ports (port, admin_port).
    workers: Sim/upstream objects (their .url) or URL strings."""

    def __init__(self, workers, *flags, env=None):
        argv = [_kvrouter(), "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]
        for w in workers:
            argv += ["--worker", w if isinstance(w, str) else w.url]
        argv += [str(f) for f in flags]
        super().__init__(argv, "serve", env=env)
        try:
            m = self.wait_line(r"listening on \S+ \(port (\d+)\), admin on \S+ \(port (\d+)\)",
                               timeout=10.0)
        except BaseException:
            self.kill()
            raise
        self.port = int(m.group(1))
        self.admin_port = int(m.group(2))

    def workers(self):
        r = request(self.admin_port, "GET", "/admin/workers")
        assert r.status == 200, (r.status, r.body[:300])
        return r.json()["workers"]

    def metrics_text(self):
        r = request(self.admin_port, "GET", "/metrics")
        assert r.status == 200, r.status
        return r.text()


class AdminToken:
    """A file holding an admin bearer token, for `serve --admin-token-file`: pass *tok.flags to
    Router, send tok.headers (an Authorization: Bearer header) with admin calls. content is what
    the file holds (default: the token and a newline). Add it to a Cleanup to remove the file."""

    def __init__(self, token="kvr-test-admin-token-0123456789", content=None):
        self.token = token
        f = tempfile.NamedTemporaryFile("w", prefix="kvr-admin-token-", delete=False)
        f.write(token + "\n" if content is None else content)
        f.close()
        self.path = f.name
        self.flags = ("--admin-token-file", self.path)
        self.headers = [("Authorization", "Bearer " + token)]

    def kill(self):  # Cleanup protocol
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Cleanup:
    """Collects what a test starts (processes, connections, servers: anything with stop() or
    kill()) and ends it all, last first. Processes are stopped with Proc.stop(); a problem it
    reports (exit status, sanitizer report) fails the test unless it is already failing."""

    def __init__(self):
        self.items = []

    def add(self, item):
        self.items.append(item)
        return item

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        problems = []
        for item in reversed(self.items):
            try:
                if isinstance(item, Proc):
                    p = item.stop()
                    if p:
                        problems.append("%s pid %d: %s" % (item.name, item.pid, p))
                else:
                    item.kill()
            except Exception as e:  # keep stopping the others
                sys.stderr.write("cleanup: %r\n" % e)
        if problems and exc_type is None:
            raise AssertionError("unclean shutdown: " + " | ".join(problems))
        return False


_SANITIZED = None


def sanitized():
    """True when the binary under test is a sanitizer build (KVR_SANITIZED set, or the binary
    carries ASan's runtime symbols)."""
    global _SANITIZED
    if _SANITIZED is None:
        _SANITIZED = bool(os.environ.get("KVR_SANITIZED"))
        if not _SANITIZED:
            try:
                with open(_kvrouter(), "rb") as f:
                    _SANITIZED = b"__asan_init" in f.read()
            except OSError:
                pass
    return _SANITIZED


def closed_port():
    """A loopback port nothing listens on (bound then closed: connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def kv_event_sim(folder, i, *flags, **kw):
    """`kvrouter sim` number i (its --seed) publishing vLLM KV events on ipc:// sockets in folder,
    with a replay socket: (the Sim, its worker spec URL,kv_events=EP,kv_replay=EP). Sim's keyword
    arguments pass through (fixed=None: the simulated engine, the default here)."""
    ev, rp = "ipc://%s/ev%d" % (folder, i), "ipc://%s/rp%d" % (folder, i)
    cfg = {"enable_kv_cache_events": True, "endpoint": ev, "replay_endpoint": rp}
    kw.setdefault("fixed", None)
    s = Sim("--seed", i, "--kv-events-config", json.dumps(cfg), *flags, **kw)
    return s, "%s,kv_events=%s,kv_replay=%s" % (s.url, ev, rp)


def can_connect(port, timeout=1.0):
    """True when a TCP connection to 127.0.0.1:port is accepted (then closed at once)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=timeout).close()
        return True
    except OSError:
        return False


def connection_refused(port, timeout=1.0):
    """True when a TCP connection to 127.0.0.1:port is refused (nothing listens); False when it is
    accepted (it is closed at once). Other errors (a timeout) raise."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=timeout).close()
        return False
    except ConnectionRefusedError:
        return True


def wait_for(pred, timeout, what, interval=0.05):
    """Polls pred() until it returns a true value; returns it, or raises AssertionError naming
    what."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.1fs waiting for %s (last: %r)" % (timeout, what, last))


# ---- raw HTTP client ---------------------------------------------------------------------------


class Response:
    """One parsed response: status, reason, version, headers [(lower-case name, value)], body,
    complete (framing ended properly: Content-Length reached, last chunk, or EOF-delimited),
    chunk_times [(monotonic time, bytes)] as body data arrived, t_head (head parsed), t_sent (the
    request was written; set by request())."""

    def __init__(self):
        self.status = 0
        self.reason = ""
        self.version = ""
        self.headers = []
        self.body = b""
        self.complete = False
        self.chunk_times = []
        self.t_head = None
        self.t_sent = None

    def header(self, name):
        name = name.lower()
        for n, v in self.headers:
            if n == name:
                return v
        return None

    def header_all(self, name):
        return [v for n, v in self.headers if n == name.lower()]

    def text(self):
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "<Response %d %r %d bytes complete=%s>" % (self.status, self.reason, len(self.body),
                                                           self.complete)


class Conn:
    """One client connection to 127.0.0.1:port with its own read buffer (keep-alive, pipelining)."""

    def __init__(self, port, timeout=5.0, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(("127.0.0.1", port))
        except BaseException:
            self.sock.close()
            raise
        self.buf = bytearray()
        self.eof = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def kill(self):  # Cleanup protocol
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, n=65536):
        if self.eof:
            raise EOFError("connection closed by peer")
        try:
            d = self.sock.recv(n)
        except ConnectionResetError:
            d = b""
        if not d:
            self.eof = True
            raise EOFError("connection closed by peer")
        self.buf += d
        return len(d)

    def readline(self, limit=1 << 20):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[: i + 1])
                del self.buf[: i + 1]
                return line
            if len(self.buf) > limit:
                raise AssertionError("line too long")
            self._fill()

    def read_exact(self, n):
        while len(self.buf) < n:
            self._fill()
        d = bytes(self.buf[:n])
        del self.buf[:n]
        return d

    def read_some(self, maxn):
        """Returns buffered bytes or one recv's worth (at most maxn)."""
        if not self.buf:
            self._fill(maxn)
        d = bytes(self.buf[:maxn])
        del self.buf[:maxn]
        return d

    def read_head(self, resp):
        line = self.readline()
        while line in (b"\r\n", b"\n"):  # tolerate nothing else before a status line
            line = self.readline()
        m = re.match(rb"(HTTP/\d\.\d) (\d{3}) ?(.*)\r\n$", line)
        assert m, "bad status line %r" % line
        resp.version = m.group(1).decode()
        resp.status = int(m.group(2))
        resp.reason = m.group(3).decode("latin-1")
        while True:
            line = self.readline()
            if line == b"\r\n":
                break
            assert line.endswith(b"\r\n") and b":" in line, "bad header line %r" % line
            name, value = line[:-2].split(b":", 1)
            resp.headers.append((name.decode("latin-1").lower(), value.strip().decode("latin-1")))
        resp.t_head = time.monotonic()

    def read_response(self, method="GET", on_data=None, on_head=None):
        """Reads one response. on_head(resp) is called once the head is in; body bytes are passed to
        on_data(bytes, t) as they arrive; a body cut short by the peer leaves complete False instead
        of raising."""
        resp = Response()
        self.read_head(resp)
        while 100 <= resp.status < 200:  # interim responses
            resp.headers = []
            self.read_head(resp)
        if on_head:
            on_head(resp)

        body = bytearray()  # bytes += would make long bodies quadratic

        def data(d):
            t = time.monotonic()
            resp.chunk_times.append((t, d))
            body.extend(d)
            if on_data:
                on_data(d, t)

        te = (resp.header("transfer-encoding") or "").lower()
        cl = resp.header("content-length")
        try:
            if method == "HEAD" or resp.status in (204, 304):
                resp.complete = True
            elif "chunked" in te:
                while True:
                    size_line = self.readline()
                    size = int(size_line.split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.readline() != b"\r\n":  # trailers
                            pass
                        resp.complete = True
                        break
                    got = 0
                    while got < size:
                        if not self.buf:
                            self._fill()
                        take = bytes(self.buf[: size - got])
                        del self.buf[: len(take)]
                        got += len(take)
                        data(take)
                    assert self.read_exact(2) == b"\r\n", "chunk not followed by CRLF"
            elif cl is not None:
                n = int(cl)
                got = 0
                while got < n:
                    if not self.buf:
                        self._fill()
                    take = bytes(self.buf[: n - got])
                    del self.buf[: len(take)]
                    got += len(take)
                    data(take)
                resp.complete = True
            else:
                while True:
                    if self.buf:
                        data(bytes(self.buf))
                        self.buf.clear()
                    try:
                        self._fill()
                    except EOFError:
                        break
                resp.complete = True
        except EOFError:
            resp.complete = False
        resp.body = bytes(body)
        return resp

    def closed_by_peer(self, timeout=2.0):
        """True when the peer closes (EOF or reset) within timeout and sends nothing more."""
        self.sock.settimeout(timeout)
        try:
            d = self.sock.recv(4096)
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True
        return d == b"" and not self.buf


def build_request(method, path, body=None, headers=None, version="HTTP/1.1"):
    """Raw request bytes. body may be bytes, str or a JSON-able object; Host, Content-Length and
    Content-Type (application/json) are added unless given."""
    if body is not None and not isinstance(body, (bytes, bytearray)):
        body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    hdrs = list(headers or [])
    names = {n.lower() for n, _ in hdrs}
    if "host" not in names:
        hdrs.insert(0, ("Host", "127.0.0.1"))
    if body is not None and "content-length" not in names and "transfer-encoding" not in names:
        hdrs.append(("Content-Length", str(len(body))))
    if body is not None and "content-type" not in names:
        hdrs.append(("Content-Type", "application/json"))
    head = "%s %s %s\r\n" % (method, path, version)
    head += "".join("%s: %s\r\n" % (n, v) for n, v in hdrs) + "\r\n"
    return head.encode("latin-1") + (bytes(body) if body is not None else b"")


def request(port, method, path, body=None, headers=None, timeout=5.0, on_data=None):
    """One request to 127.0.0.1:port on a fresh connection; returns the Response (t_sent set)."""
    c = Conn(port, timeout=timeout)
    try:
        raw = build_request(method, path, body, headers)
        t_sent = time.monotonic()
        c.send(raw)
        resp = c.read_response(method, on_data=on_data)
        resp.t_sent = t_sent
        return resp
    finally:
        c.close()


def chat_body(content="Hello there, how are you?", max_tokens=8, stream=False, **extra):
    """A chat completion request for MODEL with one user message and ignore_eos."""
    b = {"model": MODEL, "messages": [{"role": "user", "content": content}],
         "max_tokens": max_tokens, "ignore_eos": True}
    if stream:
        b["stream"] = True
    b.update(extra)
    return b


def check_all(cases):
    """Runs (label, fn) pairs, all of them, and fails once naming every case that failed."""
    failed = []
    for label, fn in cases:
        try:
            fn()
        except (AssertionError, OSError, EOFError, ValueError) as e:
            failed.append("%s: %s" % (label, str(e)[:160]))
    assert not failed, "%d of %d cases failed:\n      " % (len(failed), len(cases)) + \
        "\n      ".join(failed)


def assert_openai_error(resp, status, err_type=None):
    """resp has the status and an OpenAI-style error body; returns the error object."""
    assert resp.status == status, "expected %d, got %d: %r" % (status, resp.status, resp.body[:300])
    try:
        obj = resp.json()
    except ValueError:
        raise AssertionError("error body is not JSON: %r" % resp.body[:300])
    err = obj.get("error")
    assert isinstance(err, dict), "no error object: %r" % obj
    assert isinstance(err.get("message"), str) and err["message"], "error.message: %r" % err
    assert isinstance(err.get("type"), str), "error.type: %r" % err
    assert "code" in err, "error.code missing: %r" % err
    if err_type:
        assert err["type"] == err_type, "error.type %r, expected %r" % (err["type"], err_type)
    return err


# ---- SSE -----------------------------------------------------------------------------------------


def sse_events(body):
    """The data payloads of an SSE body, in order ("[DONE]" included)."""
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [ln[5:].lstrip(" ") for ln in block.split("\n") if ln.startswith("data:")]
        if data:
            out.append("\n".join(data))
    return out


def sse_event_times(resp):
    """[(monotonic time, data)] for each complete SSE event of resp's body: the time is when the
    chunk that completed the event arrived."""
    out, seen = [], b""
    for t, d in resp.chunk_times:
        seen += d
        events = sse_events(seen[: seen.rfind(b"\n\n") + 2] if b"\n\n" in seen else b"")
        for e in events[len(out):]:
            out.append((t, e))
    return out


def token_events(events):
    """How many events carry generated text (chat delta.content or completions text)."""
    n = 0
    for e in events:
        if e == "[DONE]":
            continue
        o = json.loads(e)
        for c in o.get("choices") or []:
            if (c.get("delta") or {}).get("content") or c.get("text"):
                n += 1
    return n


async def astream(port, path, body, timeout=120, host="127.0.0.1"):
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
            if out["done"]:
                break
    finally:
        writer.close()
    return out


# ---- Prometheus text -----------------------------------------------------------------------------


def parse_prom_samples(text):
    """Loose parse of Prometheus text into {(name, frozenset(labels)): value} (no validation)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)', line)
        if not m:
            continue
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                      m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def prom_value(samples, name, **labels):
    """Sum of the samples of name whose labels include the given ones; AssertionError if none."""
    want = set(labels.items())
    vals = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert vals, "no sample %s%r" % (name, labels)
    return sum(vals)


# ---- runner --------------------------------------------------------------------------------------


def registry():
    """A test list and its decorator for one test file: @test(timeout=S) appends the function to
    the list with its wall-clock deadline (seconds); run() takes the list."""
    tests = []

    def test(timeout=20):
        def deco(fn):
            fn.timeout = timeout
            tests.append(fn)
            return fn
        return deco
    return tests, test


class Scratch:
    """A scratch folder for one test file's run: pass `around=SCRATCH.around` to run(); inside the
    tests SCRATCH.path is the folder, made before the first test and removed after the last."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.path = None

    @contextlib.contextmanager
    def around(self):
        self.path = tempfile.mkdtemp(prefix=self.prefix)
        try:
            yield self.path
        finally:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


class Deadline(Exception):
    pass


def _on_alarm(signum, frame):
    raise Deadline("test exceeded its deadline")


def run(tests, argv=None, description=None, around=None):
    """Parses --kvrouter/-k/-v, runs the tests in order, prints a summary; returns the exit code.
    around, if given, is a context manager factory entered (after --kvrouter is set) around all the
    tests, e.g. to share one process between them; an exception from it counts as a failure."""
    global VERBOSE
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--kvrouter", required=True, help="path of the kvrouter binary")
    ap.add_argument("-k", dest="only", action="append", default=[],
                    help="run only tests whose name contains this (repeatable)")
    ap.add_argument("-v", dest="verbose", action="store_true", help="echo child process output")
    args = ap.parse_args(argv)
    try:
        set_kvrouter(args.kvrouter)
    except ValueError as e:
        print(e)
        return 2
    VERBOSE = args.verbose
    signal.signal(signal.SIGALRM, _on_alarm)
    passed = failed = 0
    failures = []
    t_all = time.monotonic()
    chosen = [fn for fn in tests if not args.only or any(s in fn.__name__ for s in args.only)]
    try:
        with (around() if around else _nothing()):
            for fn in chosen:
                t0 = time.monotonic()
                signal.setitimer(signal.ITIMER_REAL, fn.timeout)
                try:
                    fn()
                    ok, detail = True, ""
                except Exception as e:
                    ok = False
                    detail = "%s: %s" % (type(e).__name__, e)
                    if VERBOSE:
                        import traceback
                        traceback.print_exc()
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                dt = time.monotonic() - t0
                if ok:
                    passed += 1
                    print("PASS %-44s %6.2fs" % (fn.__name__, dt), flush=True)
                else:
                    failed += 1
                    failures.append(fn.__name__)
                    print("FAIL %-44s %6.2fs  %s" % (fn.__name__, dt, detail), flush=True)
    except Exception as e:
        failed += 1
        failures.append("(shared setup/teardown)")
        print("FAIL %-44s %s: %s" % ("(shared setup/teardown)", type(e).__name__, e), flush=True)
    print("%d passed, %d failed (%.1fs)%s" % (
        passed, failed, time.monotonic() - t_all,
        ("; failed: " + ", ".join(failures)) if failures else ""))
    return 1 if failed else 0


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
